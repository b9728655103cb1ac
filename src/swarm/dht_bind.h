/* dht_bind.h: the address OpenDHT's sockets bind to.
 *
 * OpenDHT 2.4's C API takes only a port and binds both the IPv4 and the
 * IPv6 wildcard address. visc binds where the user says instead:
 * dht_bind.c defines bind(2) for the process; the dynamic linker resolves
 * OpenDHT's calls to it, and while a scope is open on the calling thread
 * (only around dht_runner_run_config, which binds its sockets on the
 * calling thread) a wildcard bind of the scope's family is redirected to
 * the chosen address and a bind of the other family is refused (OpenDHT
 * then runs on one family). Every other bind goes to the C library's
 * unchanged. */
#ifndef VISC_SWARM_DHT_BIND_H
#define VISC_SWARM_DHT_BIND_H

/* host: an IPv4 or IPv6 literal, "localhost", or NULL / "" / "*" /
 * "0.0.0.0" for every address (no redirection). -1 with an error when the
 * host is not a literal address. */
int visc_dht_bind_scope_begin(const char *host);
void visc_dht_bind_scope_end(void);

#endif

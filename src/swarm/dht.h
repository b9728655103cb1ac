/* dht.h: the DHT as the rest of the swarm sees it (dht.c implements it on
 * OpenDHT; nothing else includes OpenDHT's header).
 *
 * Records (record.h) are stored under hash(run, key); one signer keeps one
 * live record per key (the newest); get returns only valid ones, at most
 * the cap asked for. Peer discovery by multicast is off; the DHT network id
 * is taken from the run hash, so nodes of other runs are not mixed in.
 *
 * Binding: the node listens on the UDP port on bind_host only (an IPv4 or
 * IPv6 address; dht_bind.h says how, since OpenDHT 2.4's C API takes only a
 * port), or on every address when bind_host is NULL, "", "*" or "0.0.0.0".
 *
 * OpenDHT keeps a stored value for 10 minutes at most, whatever the
 * record's own expiry: republish a record that must live longer. Bootstrap
 * peers are pinged again every rebootstrap_s, so that two halves of a
 * partitioned swarm find each other again when the network heals. */
#ifndef VISC_SWARM_DHT_H
#define VISC_SWARM_DHT_H

#include "record.h"

typedef struct visc_dht visc_dht;

#define VISC_DHT_REBOOTSTRAP_S 10.0 /* default period of re-pinging bootstrap peers */
#define VISC_DHT_MAX_GET 1024       /* the most records one get may return */

typedef struct {
    int port;                    /* UDP port; 0: any free port */
    const char *initial_peers;   /* "host:port,host:port" or NULL (first node) */
    const visc_swarm_auth *auth; /* kept by pointer: must outlive the visc_dht */
    double rebootstrap_s;        /* 0: VISC_DHT_REBOOTSTRAP_S */
    const char *bind_host;       /* address to bind (see above); NULL: every address */
} visc_dht_config;

visc_dht *visc_dht_open(const visc_dht_config *cfg);
int visc_dht_port(const visc_dht *d);
/* Adds bootstrap peers later ("host:port,..."; "[v6addr]:port" for IPv6).
 * A peer that cannot be resolved is an error; unreachable ones are not. */
int visc_dht_bootstrap(visc_dht *d, const char *peers);
/* Publishes value under key, signed, valid for ttl_s seconds. Waits until the
 * DHT confirms the store or timeout_s passes (then -1). */
int visc_dht_put(visc_dht *d, const char *key, const void *value, size_t n, double ttl_s,
                 double timeout_s);
/* Publishes like put, but waits at most wait_s for the confirmation: 0
 * confirmed, 1 sent and not confirmed yet, -1 failed (no node stored it,
 * bad input). The confirmation comes once every node the store was sent
 * to has answered: while a listen on the key keeps a search whose nodes
 * include a killed peer, that takes seconds (5 to 8 seen), though the
 * live nodes store the record and push it to their listeners within
 * milliseconds. For a publisher that must not fall behind. */
int visc_dht_send(visc_dht *d, const char *key, const void *value, size_t n, double ttl_s,
                  double wait_s);
/* Stores wire as it is under key, unchecked: for tests that inject forged
 * or foreign records (readers must reject them). Waits like put. */
int visc_dht_put_wire(visc_dht *d, const char *key, const uint8_t *wire, size_t n,
                      double timeout_s);
/* Reads key: at most cap valid records, newest per signer, into out.
 * Waits until the DHT's search ends or timeout_s passes, and returns the
 * count of what was found by then (0 is not an error) or -1. */
int visc_dht_get(visc_dht *d, const char *key, visc_record *out, int cap, double timeout_s);
/* Calls fn for each new valid record under key until visc_dht_unlisten.
 * fn runs on OpenDHT's thread: keep it short, and call no visc_dht
 * function from it. After visc_dht_unlisten returns, fn is not called
 * again. Returns a handle >= 0, or -1. */
typedef void (*visc_dht_listen_fn)(const visc_record *r, void *ctx);
int visc_dht_listen(visc_dht *d, const char *key, visc_dht_listen_fn fn, void *ctx);
void visc_dht_unlisten(visc_dht *d, int handle);
/* How many of the bootstrap peers answer a ping (within 2 s: it blocks that
 * long at most). OpenDHT's C API does not show its routing table; this says
 * whether the node is connected, for tests and `visc swarm status`. */
int visc_dht_node_count(visc_dht *d);
void visc_dht_close(visc_dht *d);

#endif

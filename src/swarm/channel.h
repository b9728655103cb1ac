/* channel.h: authenticated TCP connections between swarm peers.
 *
 * Handshake (both sides send the same two messages, so it is symmetric):
 *   hello: magic "VSWH", version, flags (encrypt), run hash, ephemeral
 *          X25519 key, static Ed25519 key, 32 random bytes, token length
 *          and token (0 or VISC_TOKEN_BYTES)
 *   proof: Ed25519 signature over BLAKE2b(label, role, transcript) and,
 *          when the swarm has a secret, a BLAKE2b MAC keyed by the secret
 *          over the same; transcript = both hellos, initiator's first
 *   A peer is admitted by visc_swarm_auth_admit. Session keys come from
 *   crypto_kx on the ephemeral keys, mixed with the transcript and the
 *   secret, one key per direction. A replayed hello or proof fails (the
 *   other side's fresh random bytes and ephemeral key are in the transcript).
 * Frames after the handshake: a 4-byte little-endian length of what follows
 * (checked against the receiver's cap before anything is read), the type
 * byte, then either the XChaCha20-Poly1305 ciphertext of the payload and its
 * tag, with length and type as additional data (encrypt), or the payload and
 * a Poly1305 tag over length, type and payload (authenticated only; both
 * sides must agree, or the handshake fails). The nonce (and the MAC's
 * one-time key) comes from a per-direction counter that is never sent: a
 * replayed, reordered, dropped or altered frame fails authentication and
 * ends the channel. channel.c has the byte layouts.
 *
 * One thread may send while another receives on the same channel; two
 * senders need the caller's lock. Every call takes an absolute deadline
 * (visc_now() seconds); past it the call fails with "timed out" and the
 * channel is unusable afterwards (a partial frame may have been sent). */
#ifndef VISC_SWARM_CHANNEL_H
#define VISC_SWARM_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "visc/swarm.h"

#define VISC_CHAN_MAX_FRAME (64u << 20) /* no frame above this is ever accepted */

typedef struct visc_chan visc_chan;

/* Binds a listening TCP socket to "host:port" (port 0: any free port; host
 * may be an IPv4 address, "localhost" or "*"); writes the bound "host:port"
 * to bound. Returns the fd, or -1 with an error. */
int visc_tcp_listen(const char *host_port, char *bound, size_t bound_cap);
/* Connects to "host:port" and runs the handshake as initiator. */
visc_chan *visc_chan_connect(const char *host_port, const visc_swarm_auth *auth, double deadline);
/* Accepts one connection from listen_fd (waiting until deadline) and runs
 * the handshake as responder. */
visc_chan *visc_chan_accept(int listen_fd, const visc_swarm_auth *auth, double deadline);
/* The handshake on an already connected socket (takes ownership of fd, also on failure). */
visc_chan *visc_chan_handshake(int fd, int initiator, const visc_swarm_auth *auth, double deadline);

int visc_chan_send(visc_chan *c, uint8_t type, const void *payload, size_t n, double deadline);
/* Receives one frame whose payload is at most cap bytes (a larger length
 * prefix is rejected before reading it). */
int visc_chan_recv(visc_chan *c, uint8_t *type, void *payload, size_t cap, size_t *n,
                   double deadline);
const uint8_t *visc_chan_peer_key(const visc_chan *c);
/* The socket, for poll(); readable means a frame (or EOF) is coming. */
int visc_chan_fd(const visc_chan *c);
/* Bytes sent and received on the wire, framing included. */
uint64_t visc_chan_bytes_sent(const visc_chan *c);
uint64_t visc_chan_bytes_received(const visc_chan *c);
/* Unblocks a thread waiting in send/recv (shutdown(2)) without freeing. */
void visc_chan_shutdown(visc_chan *c);
void visc_chan_close(visc_chan *c);

/* For fuzzing and tests: parses a hello message (the wire bytes) and checks
 * what can be checked without the other side. 0 or -1 with an error. */
int visc_chan_parse_hello(const uint8_t *msg, size_t n, const visc_swarm_auth *auth,
                          uint8_t peer_static[VISC_KEY_BYTES]);

#endif

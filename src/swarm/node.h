/* node.h: one peer of a swarm: its DHT node, its TCP listener, and the
 * accept thread that hands authenticated incoming connections to whoever
 * waits for them.
 *
 * Every connection starts with the channel handshake (channel.h); then the
 * initiator sends one OPEN frame {purpose, 16-byte tag} saying what the
 * connection is for (joining a group, an all-reduce round, a state
 * download). The accept thread queues the channel under (purpose, tag,
 * peer key) until visc_swarm_node_take claims it. Queued channels that no
 * one claims within VISC_NODE_UNCLAIMED_S are closed, and at most
 * VISC_NODE_MAX_PENDING wait at once (further ones are refused), so a
 * peer cannot make another hold sockets or memory without bound. A client
 * peer (behind NAT) opens no listener: it only connects out.
 *
 * Standing answers: a (purpose, tag) the node was told to answer
 * (visc_swarm_node_answer) is not queued: the channel gets that one frame
 * and is closed. Matchmaking answers the JOINs of a round whose group has
 * formed, so that a peer that comes too late learns it at once instead of
 * waiting out the leader's declared expiry for a taker that never comes.
 * The last VISC_NODE_ANSWERS answers are kept.
 *
 * Handshakes run on a small pool of VISC_NODE_HANDSHAKE_WORKERS threads,
 * each with a deadline of VISC_NODE_HANDSHAKE_S (handshake and OPEN
 * together): a slow or hostile connection holds one worker for at most that
 * long, and the others keep serving. Accepted sockets waiting for a worker
 * are capped too (VISC_NODE_MAX_ACCEPTING; beyond it they are closed).
 *
 * OPEN wire form: purpose (u8, one of visc_purpose), tag (16 bytes):
 * exactly 17 bytes. */
#ifndef VISC_SWARM_NODE_H
#define VISC_SWARM_NODE_H

#include "channel.h"
#include "dht.h"

#define VISC_NODE_UNCLAIMED_S 30.0
#define VISC_NODE_MAX_PENDING 256
#define VISC_NODE_HANDSHAKE_S 5.0
#define VISC_NODE_HANDSHAKE_WORKERS 4
#define VISC_NODE_MAX_ACCEPTING 64
#define VISC_OPEN_BYTES 17
#define VISC_NODE_ANSWERS 16
#define VISC_NODE_ANSWER_MAX_BYTES 16

typedef enum {
    VISC_PURPOSE_JOIN = 1,      /* matchmaking: a follower asks a leader for a place */
    VISC_PURPOSE_ALLREDUCE = 2, /* tag = group id */
    VISC_PURPOSE_STATE = 3,     /* state download (collaborative training) */
} visc_purpose;

typedef struct visc_swarm_node visc_swarm_node;

typedef struct {
    const char *listen;        /* TCP "host:port" (port 0: any); NULL for a client peer. The DHT
                                * binds the same host (every address when it is 0.0.0.0 or *) */
    int dht_port;              /* UDP port of the DHT node (0: any; < 0: no DHT at all, for
                                  peers given their group directly, e.g. all-reduce tests) */
    const char *initial_peers; /* DHT bootstrap "host:port,..." (NULL: first peer) */
    const visc_swarm_auth *auth;
    double bandwidth; /* bytes/s this peer offers for reducing (0: measure/unknown = 1) */
    int client;       /* 1: receive-only peer, reduces nothing, accepts nothing */
    /* For tests; 0 means the default. */
    double unclaimed_s; /* VISC_NODE_UNCLAIMED_S */
    int max_pending;    /* VISC_NODE_MAX_PENDING (at most that) */
} visc_swarm_node_config;

visc_swarm_node *visc_swarm_node_open(const visc_swarm_node_config *cfg);
/* "host:port" others connect to (empty for a client peer). */
const char *visc_swarm_node_address(const visc_swarm_node *n);
/* NULL when the node was opened without a DHT (dht_port < 0). */
visc_dht *visc_swarm_node_dht(visc_swarm_node *n);
const visc_swarm_auth *visc_swarm_node_auth(const visc_swarm_node *n);
const visc_swarm_node_config *visc_swarm_node_config_of(const visc_swarm_node *n);
/* Connects to a peer's address, runs the handshake, sends OPEN. When
 * expect_key is not NULL the peer must have that public key. */
visc_chan *visc_swarm_node_connect(visc_swarm_node *n, const char *addr, visc_purpose purpose,
                                   const uint8_t tag[16], const uint8_t *expect_key,
                                   double deadline);
/* Waits for an incoming channel with this purpose and tag (and peer key,
 * unless NULL). NULL with "timed out" past the deadline. */
visc_chan *visc_swarm_node_take(visc_swarm_node *n, visc_purpose purpose, const uint8_t tag[16],
                                const uint8_t *peer_key, double deadline);
/* From now on, a channel opened with this purpose and tag is sent the
 * frame (type, payload of at most VISC_NODE_ANSWER_MAX_BYTES) and closed;
 * channels of it queued already are answered too. The oldest answer gives
 * way past VISC_NODE_ANSWERS. -1 on a payload too large. */
int visc_swarm_node_answer(visc_swarm_node *n, visc_purpose purpose, const uint8_t tag[16],
                           uint8_t type, const uint8_t *payload, size_t len);
/* Withdraws the standing answer of (purpose, tag), if any: its channels
 * queue again (a round matchmade once more, after its group failed). */
void visc_swarm_node_unanswer(visc_swarm_node *n, visc_purpose purpose, const uint8_t tag[16]);
/* Incoming channels queued and not yet claimed (for tests and status). */
int visc_swarm_node_pending(visc_swarm_node *n);
/* Stops the accept thread and the handshake workers, closes every queued
 * channel and the DHT; a thread waiting in take() returns NULL. */
void visc_swarm_node_close(visc_swarm_node *n);

/* The OPEN frame (exported for the fuzzer): 0, or -1 on a wrong size or an
 * unknown purpose. */
void visc_open_encode(visc_purpose purpose, const uint8_t tag[16], uint8_t out[VISC_OPEN_BYTES]);
int visc_open_parse(const uint8_t *msg, size_t n, visc_purpose *purpose, uint8_t tag[16]);

#endif

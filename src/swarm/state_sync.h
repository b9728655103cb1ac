/* state_sync.h: a newcomer (or a peer that fell behind) downloads the full
 * training state from a peer that has it.
 *
 * The state is an opaque blob (the trainer's checkpoint bytes: parameters,
 * optimizer state, scheduler position, epoch, BatchNorm buffers). A donor
 * serves the blob of its current epoch over VISC_PURPOSE_STATE channels in
 * chunks (64 KiB), preceded by a header {epoch, size, BLAKE2b-256 hash}
 * signed with the donor's key (the channel authenticates the donor; the
 * signature makes the hash quotable). The downloader picks a donor among
 * the peers advertising the highest epoch in their progress records,
 * randomized among equals (newcomers do not all hit one donor), checks that
 * the hash the donor serves equals the state_hash that the donor AND at
 * least one other peer at that epoch published (corroboration: one peer
 * alone cannot serve poisoned state; a lone donor is skipped, and named in
 * the error if no one else can serve, unless the caller turns corroboration
 * off), checks the size cap before allocating, and verifies the hash of
 * what arrived. On any failure it retries with another donor, in order of
 * epoch (so a lone liar advertising a high epoch does not hide the
 * corroborated state of the epoch below).
 *
 * Protocol (one connection, tag all zeros, any admitted peer may ask):
 *   requester -> STATE_REQUEST {version u8 = 1, min_epoch u64, max_bytes u64}
 *   donor     -> STATE_REFUSE {version, reason u8}, and closes; or
 *   donor     -> STATE_HEADER {version, epoch u64, size u64, hash[32],
 *                              Ed25519 signature[64] over "visc-state-v1",
 *                              run hash, epoch, size, hash (LE integers)}
 *                then ceil(size / VISC_STATE_CHUNK) STATE_CHUNK frames of
 *                exactly VISC_STATE_CHUNK bytes (the last: the rest).
 * A donor serves at most VISC_STATE_MAX_SERVING requests at once, one
 * thread each; further requesters get REFUSE(busy). Its server thread only
 * takes channels from the node's queue, so the node's accept thread is never
 * held by a transfer. */
#ifndef VISC_SWARM_STATE_SYNC_H
#define VISC_SWARM_STATE_SYNC_H

#include "node.h"
#include "progress.h"

#define VISC_STATE_CHUNK (64u << 10)
/* A donor keeps serving the states of its last VISC_STATE_HISTORY epochs
 * (collab.c): a requester asks for the epoch it saw published. */
#define VISC_STATE_HISTORY 4
#define VISC_STATE_MAX_SERVING 4 /* transfers a donor runs at once */
#define VISC_STATE_REQUEST_S 5.0 /* a requester has this long to send its request */
#define VISC_STATE_CHUNK_S 10.0  /* default deadline of each chunk, both sides */
/* A donor grants a slow reader VISC_STATE_CHUNK_S plus size / this many
 * bytes/s in all, so a stalled requester cannot hold a slot for ever. */
#define VISC_STATE_MIN_RATE (256u << 10)

#define VISC_STATE_REQUEST_BYTES 17
#define VISC_STATE_HEADER_BYTES 113
#define VISC_STATE_REFUSE_BYTES 2

/* want_epoch: the epoch the requester saw published (its min_epoch): a
 * donor that has moved on since may still hold that epoch's blob, whose
 * hash the requester can check against the records.
 * The blob of the serving peer's current state (or of want_epoch); the callee fills *blob
 * (malloc'd, freed by the server after sending), *n, *epoch and hash (the
 * BLAKE2b-256 of the blob, as the peer published it: the server signs it as
 * given and does not recompute it). Called from the server's transfer
 * threads, possibly several at once: it must be thread-safe, and each
 * running transfer holds its own snapshot. */
typedef int (*visc_state_snapshot_fn)(void *ctx, uint64_t want_epoch, uint8_t **blob, size_t *n,
                                      uint64_t *epoch, uint8_t hash[32]);

typedef struct visc_state_server visc_state_server;
/* Starts serving on node (which must outlive the server: stop the server
 * before closing the node). NULL with an error. */
visc_state_server *visc_state_server_start(visc_swarm_node *node, visc_state_snapshot_fn fn,
                                           void *ctx);
/* Ends every transfer in progress (their requesters see the connection
 * end), joins the threads, frees. */
void visc_state_server_stop(visc_state_server *s);
/* Counters for status and tests: transfers running now, transfers sent to
 * the end, requests refused (busy, stale, too large, malformed, no state). */
int visc_state_server_active(visc_state_server *s);
uint64_t visc_state_server_served(visc_state_server *s);
uint64_t visc_state_server_refused(visc_state_server *s);

typedef struct {
    size_t max_bytes;          /* refuse larger states (the caller knows its model's size) */
    double timeout_s;          /* per donor attempt (0: 60) */
    int max_attempts;          /* donors tried (0: 3) */
    int require_corroboration; /* 1 (default): the hash must be published by another peer too */
    uint64_t seed;             /* donor choice among equals (0: random) */
    double chunk_timeout_s;    /* the most a donor may take per chunk (0: VISC_STATE_CHUNK_S) */
    uint64_t min_epoch;        /* states of lower epochs are not asked for (0: any) */
} visc_state_download_config;

/* The defaults: corroboration required, 0 (= default) everywhere else. */
visc_state_download_config visc_state_download_defaults(size_t max_bytes);

/* Downloads from one of records[0..n) (the trusted progress records).
 * On success *blob (malloc'd), *size, *epoch, hash. -1 with what failed
 * for each donor tried, on one line. */
int visc_state_download(visc_swarm_node *node, const visc_progress_record *records, int n,
                        const visc_state_download_config *cfg, uint8_t **blob, size_t *size,
                        uint64_t *epoch, uint8_t hash[32]);

/* The order in which visc_state_download tries donors: indices into
 * records of those with an address and a non-zero state hash (not self_key,
 * which may be NULL; when require_corroboration, only those whose (epoch,
 * hash) another peer's record repeats), highest epoch first, shuffled among
 * equal epochs by seed (0: random). Returns how many (at most n). */
int visc_state_donor_order(const visc_progress_record *records, int n, const uint8_t *self_key,
                           int require_corroboration, uint64_t seed, int *order);

/* BLAKE2b-256 of a state blob (what peers publish as state_hash). */
int visc_state_hash(const uint8_t *blob, size_t n, uint8_t out[32]);

/* ---- the messages (exported for the fuzzer and for tests that play a
 * hostile donor); parsers are strict: exact sizes, known versions and
 * reasons, and a header's signature must verify ---- */
typedef enum {
    VISC_STATE_REFUSE_BUSY = 1,        /* VISC_STATE_MAX_SERVING transfers running */
    VISC_STATE_REFUSE_UNAVAILABLE = 2, /* the donor has no state to give now */
    VISC_STATE_REFUSE_STALE = 3,       /* its epoch is below the requested minimum */
    VISC_STATE_REFUSE_TOO_LARGE = 4,   /* its state exceeds the requester's cap */
    VISC_STATE_REFUSE_BAD_REQUEST = 5,
} visc_state_refuse_reason;

typedef struct {
    uint64_t min_epoch, max_bytes;
} visc_state_request;

typedef struct {
    uint64_t epoch, size;
    uint8_t hash[32];
    uint8_t signature[64];
} visc_state_header;

void visc_state_request_encode(const visc_state_request *r, uint8_t out[VISC_STATE_REQUEST_BYTES]);
int visc_state_request_parse(const uint8_t *msg, size_t n, visc_state_request *out);
/* Fills h->signature with the donor's key over run_hash and h's fields. */
void visc_state_header_sign(visc_state_header *h, const uint8_t run_hash[32],
                            const visc_identity *donor);
void visc_state_header_encode(const visc_state_header *h, uint8_t out[VISC_STATE_HEADER_BYTES]);
/* Parses and checks the signature against donor_key and run_hash; size 0
 * is malformed (a state is never empty). */
int visc_state_header_parse(const uint8_t *msg, size_t n, const uint8_t run_hash[32],
                            const uint8_t donor_key[VISC_KEY_BYTES], visc_state_header *out);
void visc_state_refuse_encode(visc_state_refuse_reason why, uint8_t out[VISC_STATE_REFUSE_BYTES]);
int visc_state_refuse_parse(const uint8_t *msg, size_t n, visc_state_refuse_reason *why);
const char *visc_state_refuse_name(visc_state_refuse_reason why);

#endif

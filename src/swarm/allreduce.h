/* allreduce.h: the butterfly all-reduce within one group.
 *
 * The flat vector of n floats is cut into one contiguous shard per member,
 * sized in proportion to the member's bandwidth (a client gets none).
 * Member i sends its values of shard j to member j in parts of at most
 * part_bytes; j validates each part, reduces it with everyone else's
 * (weighted mean or a robust mode) and sends the result back. Sending,
 * compressing and reducing overlap: per link one sending and one receiving
 * thread; the calling thread reduces. On each link a member sends all its
 * parts before any result (inputs reach reducers as early as possible).
 *
 * Connections: one channel per pair of members of which at least one
 * reduces (node.h, purpose ALLREDUCE, tag = group id). A full member
 * connects to the full members after it in the group order and accepts
 * from those before it; a client connects to every full member and
 * accepts nothing. The first frame each way is AR_HELLO; a peer whose
 * group id, schema hash, n, compression, aggregation or part size differ,
 * or whose weight is out of range, is banned.
 *
 * Auxiliary members (group member flag auxiliary, from matchmaking's role
 * byte; collab.h) hold no data: they reduce a shard in proportion to their
 * bandwidth like any full member, with weight 0. An auxiliary sends no
 * parts and is sent no results; its hello carries weight exactly 0, and a
 * hello with weight 0 from a member the group does not list as auxiliary
 * (or a positive weight from one it does) is banned, as is any part an
 * auxiliary sends. Its values never enter an aggregate: the result is the
 * aggregate of the others'. A group needs a member that is not auxiliary;
 * an auxiliary's x is only its shard's output (n floats, the rest
 * untouched).
 *
 * Newcomer members (role 3: a peer that has just taken the swarm's state
 * and has no gradient yet, collab.c) are auxiliaries that take the result:
 * weight exactly 0, no parts (a part from one is banned), a shard to
 * reduce, and every other reducer's results, so that x ends as the
 * group's aggregate as at a full member, and the newcomer steps with the
 * group. A group needs a member that contributes.
 *
 * Deadlines: each part must arrive within a time derived from the part's
 * size and the bandwidth measured so far on that link (times slack, plus
 * a floor); the whole round ends at round_timeout_s.
 *
 * Failure semantics (reported in visc_allreduce_report):
 *  - a sender that fails, stalls past a part deadline or sends invalid
 *    data is dropped from every part not yet reduced (and banned for the
 *    round: nothing more from it is used); parts already reduced keep it.
 *    Parts are reduced in order, so the parts that include a member are a
 *    prefix: parts_with[member] says how long
 *  - a reducer that fails leaves its shard at this peer's local values
 *    for the parts not yet received back (results arrive in order:
 *    results_back[member] parts of its shard were replaced)
 *  - a reducer's own shard holds exactly what it sent to the others
 *    (its result, encoded and decoded once), so every peer that received
 *    a part holds the same values
 *  - averaged_fraction is the fraction of the n values that were replaced
 *    by a group result (for an auxiliary member: of its own shard); the call returns 0 when the
 * round completed with every member (averaged_fraction 1 and nobody dropped), 1 when it completed
 * partially (the report says what failed), -1 when nothing could be averaged.
 *
 * Wire (little-endian; the type byte is the channel frame's):
 *   AR_HELLO   version 1 (u8), group id (16), schema hash (32), n (u64),
 *              weight (f64, >= 0; 0 exactly for an auxiliary or newcomer member), compression (u8),
 * aggregation (u8), part_bytes (u32): VISC_AR_HELLO_BYTES AR_PART    part index within the
 * receiver's shard (u32), then the part's values encoded (compress.h, the encoding
 * visc_compression_for gives for the part's length) AR_RESULT  part index within the sender's shard
 * (u32), then the reduced values, encoded the same way */
#ifndef VISC_SWARM_ALLREDUCE_H
#define VISC_SWARM_ALLREDUCE_H

#include "aggregate.h"
#include "compress.h"
#include "matchmaking.h"

/* Fault injection for tests; NULL in production. Each hook may be NULL. */
typedef struct {
    void *ctx;
    /* On the channel to member `peer`, before AR_HELLO is sent; nonzero:
     * this link is abandoned (the hook may have written raw bytes). */
    int (*on_channel)(void *ctx, int peer, visc_chan *ch);
    /* Before part k of member peer's shard is encoded: values is a copy the
     * hook may change; returns how many of them go on the wire (count). */
    size_t (*on_send_part)(void *ctx, int peer, int k, float *values, size_t count);
    /* Before this peer reduces part k of its own shard. */
    void (*on_reduce)(void *ctx, int k);
    /* After it: a copy of the reduced values of part k, which the hook may
     * change; the copy is what every member is sent (a lying reducer),
     * while this peer keeps the true values. */
    void (*on_result)(void *ctx, int k, float *values, size_t count);
} visc_allreduce_hooks;

typedef struct {
    visc_compression compression;
    int error_feedback; /* q8: carry the rounding error to the next round */
    /* Values at [exact_from, n) travel as plain fp32 whatever the
     * compression: statistics that lossy codes ruin (BatchNorm buffers and
     * counters, Adam's second moments, whose tiny entries an absmax block
     * quantizes to zero). A shard that holds the boundary is cut there
     * into parts, so only the range itself travels in fp32. Default
     * SIZE_MAX: none. Every member must use the same value
     * (put it in the schema hash). */
    size_t exact_from;
    size_t part_bytes;         /* uncompressed part size, default 512 KiB */
    double round_timeout_s;    /* default 60 */
    double connect_timeout_s;  /* channels and hellos, default 10 (within the round) */
    double part_timeout_min_s; /* floor of a part deadline, default 2 */
    double
        part_timeout_slack; /* deadline = floor + slack * bytes / measured bandwidth, default 4 */
    visc_aggregate_config agg;
    uint8_t schema_hash[32];
    const visc_allreduce_hooks *hooks; /* NULL */
} visc_allreduce_config;

typedef struct {
    int group_size;
    double averaged_fraction;
    int failed_senders, failed_reducers, banned;
    uint8_t failed_keys[VISC_GROUP_MAX][VISC_KEY_BYTES];
    int n_failed_keys;
    uint64_t bytes_sent, bytes_received;
    double seconds;
    size_t values_reduced; /* of this peer's shard (an auxiliary's work) */
    char what_failed[512]; /* one line, empty when nothing failed */
    /* in detail, indexed by group member */
    int member_failed[VISC_GROUP_MAX]; /* 1 failed, 2 banned (invalid data) */
    size_t shard_begin[VISC_GROUP_MAX + 1];
    size_t part_values; /* values per part (the last of a shard, or before exact_from, may be
                           shorter) */
    int parts_with[VISC_GROUP_MAX];   /* parts of this peer's shard that include the member */
    int results_back[VISC_GROUP_MAX]; /* parts of the member's shard replaced here */
} visc_allreduce_report;

#define VISC_AR_HELLO_BYTES 71
#define VISC_AR_PART_HEADER 4

typedef struct {
    uint8_t group_id[16];
    uint8_t schema_hash[32];
    uint64_t n;
    double weight;
    uint8_t compression, aggregation;
    uint32_t part_bytes;
} visc_ar_hello;

void visc_allreduce_config_default(visc_allreduce_config *c);
/* The round's log line: "all-reduce: group 4, averaged 100.0%, sent 12.0 MB,
 * received 12.0 MB in 1.31 s (goodput 18.3 MB/s)" and, when something
 * failed, "; failed: <what_failed>". */
void visc_allreduce_report_line(const visc_allreduce_report *r, char *out, size_t cap);
/* x (n floats) is replaced by the group's aggregate where it could be
 * computed; weight: this peer's weight (sample count, or 1; exactly 0 for
 * an auxiliary or newcomer member). error_buf:
 * n floats of error feedback state, or NULL. */
int visc_allreduce(visc_swarm_node *node, const visc_group *g, const visc_allreduce_config *cfg,
                   float *x, size_t n, double weight, float *error_buf, visc_allreduce_report *rep);

/* The shards of n values in group g: member i owns [begin[i], begin[i+1]). */
void visc_allreduce_shards(const visc_group *g, size_t n, size_t begin[VISC_GROUP_MAX + 1]);
/* Values per part for a part size in bytes (at least 1, within a frame). */
size_t visc_allreduce_part_values(size_t part_bytes);

/* Wire messages (exported for the fuzzer and tests). */
void visc_ar_hello_encode(const visc_ar_hello *h, uint8_t out[VISC_AR_HELLO_BYTES]);
int visc_ar_hello_parse(const uint8_t *msg, size_t n, visc_ar_hello *out);
/* A PART or RESULT payload: its index must be expect_index and it must
 * hold exactly count values in the encoding for (c, count), all finite.
 * Decodes into out (count floats); 0 or -1 with an error. */
int visc_ar_part_parse(const uint8_t *msg, size_t n, uint32_t expect_index, visc_compression c,
                       float *out, size_t count);

#endif

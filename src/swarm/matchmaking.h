/* matchmaking.h: forming the groups of one averaging round.
 *
 * Peers ready to average declare themselves on the DHT under
 * "mm.<round>" with their address, bandwidth, role, schema hash and an
 * expiry = the time they will wait. The peer whose declaration expires
 * first (ties: smaller public key) leads; the others connect to it with
 * a JOIN frame. The leader starts the group as soon as it holds every
 * peer it expects (below), or at its deadline if it has at least
 * min_group_size (2); otherwise it tells everyone and disbands. A leader
 * sends every member the same GROUP frame: a random group id and the
 * members in one shuffled order, so membership and order agree
 * everywhere. A peer that joins no group returns -1 with "no group":
 * never a silent fallback. Peers with another schema hash are refused.
 *
 * A peer reads the declarations after letting them spread for a fifth of
 * the matchmaking time (0.1 to 3 s), or sooner: as soon as its view holds
 * every peer it expects and has not changed between two reads a tenth of
 * that time (at least 0.1 s) apart.
 *
 * Expected peers: expected_group_size (the live peers at this round's
 * step, as the caller's progress view counts them; 0: target_group_size),
 * and every peer the latest view deals to this leader. The view is what
 * counts when the two differ: a progress view read before a newcomer
 * published its step undercounts, and a leader that started at that count
 * left out the newcomer whose declaration it could see (e2e_swarm_churn.sh:
 * a newcomer that took the state missed every group after it, and took
 * the state again after every step).
 *
 * With more peers than target_group_size, every peer orders the
 * declarations it sees (full peers by expiry then key, clients after them)
 * and deals them round-robin into ceil(n / target) groups whose leaders are
 * the first full peers: when views agree, one JOIN each forms every group.
 * The deal holds only if every peer of the round deals with the same
 * target_group_size: a size that follows each peer's own count of the
 * swarm (which differ while peers come and go) dealt four declarations
 * into two groups at one peer and one group at another, and split the
 * swarm. That count is expected_group_size's, which changes no deal.
 * A peer refused, or whose leader vanishes or stays silent past its
 * declared expiry, tries the next full peer before it in that order, and
 * leads itself when none is left (a client cannot lead: it has no
 * listener). A leader that has not filled its group re-reads the
 * declarations every tenth of the matchmaking time (and republishes its own
 * until the DHT confirms it): when the fresher view deals it to another
 * leader it has not tried, it disbands (REJECT) and goes there, so a slow
 * DHT delays the round instead of splitting it. A leader stops gathering
 * a margin before the earliest deadline among itself and its joiners, so
 * its GROUP arrives in time. A JOIN must follow its OPEN within 1 s (an
 * admitted but stalling peer delays a leader by at most that).
 *
 * A late peer: once a peer has its group, its node answers every further
 * JOIN of the round with REJECT FORMED (node.h's standing answers). A
 * peer whose leaders all answer so, or fail, gives up at once
 * (VISC_MM_MISSED) instead of leading a group of its own until its
 * deadline: the swarm steps without it, and a group of the late ones
 * would only step apart from it. Before, a peer one batch late waited out
 * the whole matchmaking time, longer than a step, and fell a step behind
 * every time (e2e_swarm_churn.sh). A peer that gave up so answers the
 * round's JOINs with REJECT FORMED too: another late peer that saw only
 * its declaration learns from it that the round is over.
 *
 * Exclusion: a peer may name keys it will not group with (the collaborative
 * optimizer's ban list: members that sent it invalid data). Their
 * declarations are left out of its view (so honest peers that excluded the
 * same peer deal the same groups), a JOIN from one is refused
 * (VISC_MM_REJECT_EXCLUDED), and a GROUP that lists one is not taken ("no
 * group"; its leader's all-reduce treats this peer as failed).
 *
 * Auxiliary peers (collab.h) declare role 2: they count toward the group
 * sizes like any member (they do a member's share of the reducing) and may
 * lead, but a group needs at least 2 members that train: a leader with
 * fewer disbands ("no group"). Newcomers (role 3: a peer that has just
 * taken the swarm's state, collab.c) are like auxiliaries but take the
 * group's result: they contribute nothing, and do not count among the 2.
 *
 * Messages (little-endian; the type byte is the channel frame's):
 *   info (JOIN frame, and the value of a DHT declaration): version 1 (u8),
 *     round (u64), expires_ms (u64, unix ms when the sender stops waiting),
 *     bandwidth (f64, finite, > 0), role (u8: 0 full, 1 client, 2 auxiliary, 3 newcomer),
 *     schema hash (32), address length (u8, < 64; 0 exactly for a
 *     client), address (no NUL)
 *   GROUP: version 1, round (u64), group id (16), schema hash (32),
 *     count (u8, 2..VISC_GROUP_MAX), then count times: key (32),
 *     bandwidth (f64), role (u8, as in info), address length (u8), address;
 *     at least 2 members contribute (neither auxiliaries nor newcomers)
 *   REJECT: version 1, reason (u8, visc_mm_reject_reason) */
#ifndef VISC_SWARM_MATCHMAKING_H
#define VISC_SWARM_MATCHMAKING_H

#include "node.h"

typedef struct {
    uint8_t key[VISC_KEY_BYTES];
    char addr[64]; /* "host:port"; empty for a client */
    double bandwidth;
    int client;
    int auxiliary; /* reduces a shard, contributes nothing (weight 0) */
    int newcomer;  /* reduces a shard and takes the result, contributes nothing (weight 0) */
} visc_group_member;

/* Whether a member's values enter the average (full peers and clients). */
static inline int visc_member_contributes(const visc_group_member *m) {
    return !m->auxiliary && !m->newcomer;
}

typedef struct {
    uint8_t id[16];
    int size, self; /* self: this peer's index in members */
    visc_group_member members[VISC_GROUP_MAX];
} visc_group;

typedef struct {
    uint64_t round;          /* which round (e.g. the global epoch) */
    int target_group_size;   /* >= 2; the same at every peer of the round (the deal) */
    int expected_group_size; /* 0 (target), or 2..target: whom to wait for (above) */
    int min_group_size;      /* >= 2, <= target */
    double matchmaking_time_s;
    uint8_t schema_hash[32]; /* what is averaged: only equal hashes group */
    int auxiliary;           /* this peer joins as an auxiliary (not with a client node) */
    int newcomer;            /* this peer joins as a newcomer (not with a client node) */
    const uint8_t (*excluded)[VISC_KEY_BYTES]; /* keys not to group with (may be NULL) */
    int n_excluded;
} visc_matchmaking_config;

/* 0 and out filled, or -1 with an error ("no group: ..." when the round
 * ended without one), or VISC_MM_MISSED with an error when the round's
 * group formed without this peer. Returns within cfg->matchmaking_time_s
 * (plus the time of one bounded send or close). */
#define VISC_MM_MISSED (-2)
int visc_matchmake(visc_swarm_node *n, const visc_matchmaking_config *cfg, visc_group *out);

/* ---- wire messages (exported for the fuzzer and tests) ---- */
#define VISC_MM_ADDR_MAX 63
#define VISC_MM_INFO_MAX_BYTES (59 + VISC_MM_ADDR_MAX)
#define VISC_MM_MEMBER_MAX_BYTES (42 + VISC_MM_ADDR_MAX)
#define VISC_MM_GROUP_MAX_BYTES (58 + VISC_GROUP_MAX * VISC_MM_MEMBER_MAX_BYTES)

typedef struct {
    uint64_t round, expires_ms;
    double bandwidth;
    int client, auxiliary, newcomer;
    uint8_t schema_hash[32];
    char addr[VISC_MM_ADDR_MAX + 1];
} visc_mm_info;

typedef enum {
    VISC_MM_REJECT_FULL = 1,
    VISC_MM_REJECT_NOT_LEADING = 2,
    VISC_MM_REJECT_SCHEMA = 3,
    VISC_MM_REJECT_ROUND = 4,
    VISC_MM_REJECT_MALFORMED = 5,
    VISC_MM_REJECT_DISBANDED = 6,
    VISC_MM_REJECT_DUPLICATE = 7,
    VISC_MM_REJECT_EXCLUDED = 8,
    VISC_MM_REJECT_FORMED = 9,                   /* the round's group formed (without the sender) */
    VISC_MM_REJECT_LAST = VISC_MM_REJECT_FORMED, /* parse refuses reasons above */
} visc_mm_reject_reason;

/* The tag of JOIN connections for a round (node.h's OPEN tag). */
void visc_mm_join_tag(uint64_t round, uint8_t tag[16]);
/* Returns the size written (at most VISC_MM_INFO_MAX_BYTES), -1 on a bad field. */
int visc_mm_info_encode(const visc_mm_info *info, uint8_t *out, size_t cap);
/* Structural checks only; the caller compares round and schema hash. */
int visc_mm_info_parse(const uint8_t *msg, size_t n, visc_mm_info *out);
/* Returns the size written, -1 on a bad group. */
int visc_mm_group_encode(const visc_group *g, uint64_t round, const uint8_t schema_hash[32],
                         uint8_t *out, size_t cap);
/* Parses a GROUP received from leader_key by self_key: round and schema must
 * match, keys be unique, self_key appear exactly once (out->self is its
 * index) and the leader be a full member. */
int visc_mm_group_parse(const uint8_t *msg, size_t n, uint64_t round, const uint8_t schema_hash[32],
                        const uint8_t self_key[VISC_KEY_BYTES],
                        const uint8_t leader_key[VISC_KEY_BYTES], visc_group *out);
int visc_mm_reject_parse(const uint8_t *msg, size_t n, visc_mm_reject_reason *reason);

#endif

/* progress.h: where the swarm is on its way to the next global step.
 *
 * Every peer publishes a signed progress record under "progress" (DHT key;
 * one live record per peer, newest wins, ttl = the record's expiration):
 * its global epoch (optimizer steps done), samples accumulated toward the
 * next step, throughput (an EMA with alpha 0.1 of samples/s, paused while
 * averaging), the time of its last measurement, its role, the address it
 * serves state at, the hash of its state at its epoch, and its recent loss.
 *
 * From all live records a peer computes the view:
 *   global epoch   the highest epoch among trusted records (self included;
 *                  with corroborated_epochs, see below, lone records ahead
 *                  of this peer do not count);
 *   samples        the sum over trusted peers at the global epoch of
 *                  samples_accumulated + samples_per_second * (now - time),
 *                  the extrapolation clamped to [0, max_refresh_s] (a live
 *                  peer measures and republishes at least that often) and
 *                  left out for a paused peer (it is averaging, not
 *                  computing);
 *   eta            (target - samples) / (throughput at the global epoch),
 *                  0 once reached, INFINITY when unknown (no target or no
 *                  throughput).
 * The refresh period adapts to the expected time: period = min(max_refresh,
 * max(min_refresh, eta / 4)), so a step that comes soon is seen soon.
 * Records are republished when the period has passed or the epoch changed;
 * everyone's records are read when the period has passed (or on force);
 * in between, refresh re-extrapolates the last records to now. With
 * `background` (below), records also arrive as the DHT pushes them (a
 * listen on the key: milliseconds after their put) and are judged at
 * every refresh; the reads each period catch what a push missed.
 *
 * Forged progress (a peer cannot forge another's record, but can lie about
 * itself). A record is distrusted, for expiration_s, when
 *   - its samples grew, within one epoch, by more than 3 x its claimed
 *     throughput x the time between its records, plus 2 s of samples
 *     (slack for the EMA's lag and timing);
 *   - its throughput is more than 10 x the fastest other peer's, this
 *     peer's own included (when at least 2 other peers report a
 *     throughput; not their median: liars that claim to be slow must not
 *     get an honest fast peer distrusted);
 *   - it claims more work than the epoch has had time for: at an epoch
 *     whose beginning this tracker saw (the global epoch rose by one
 *     between two reads that both saw other peers), more samples than
 *     3 x its claimed throughput x the epoch's age (counted from the
 *     earlier read, less max_refresh_s) plus 2 s of samples. This catches
 *     a first record that is already inflated, which the growth check has
 *     no history for;
 *   - its epoch is more than one ahead of every other peer's (when there
 *     are at least 2 other peers: with one other peer, a newcomer at epoch
 *     0 and a veteran look alike).
 * Distrusted peers are left out of every count and reported once per peer
 * on stderr ("visc: swarm: distrusting peer <id>: <reason>"). Known limit:
 * a liar that stays within these factors shifts the count by that much;
 * colluding liars that corroborate each other are not caught here (the
 * averaging's robust aggregation and state hashes are the next defense).
 *
 * Auxiliary peers (role 2, collab.h) publish records too, so that
 * free-running peers can size their groups: such a record is in no count
 * above (nor in the records refresh returns) and only counted in the
 * view's `auxiliaries`. A tracker whose own role is auxiliary publishes
 * its record and reads the swarm like an observer.
 *
 * Threads: add_samples / set_epoch / pause / resume / set_* may run on
 * another thread than refresh; refresh runs on one thread at a time.
 * With `background`, the tracker publishes and reads on two threads of its
 * own (as hivemind's progress tracker does), so that a refresh without
 * force never waits on the DHT: a read or put waits a second or more while
 * killed peers linger in the DHT's routing tables, and a training peer
 * refreshes between batches. */
#ifndef VISC_SWARM_PROGRESS_H
#define VISC_SWARM_PROGRESS_H

#include <stdint.h>

#include "dht.h"

typedef enum { VISC_ROLE_FULL = 0, VISC_ROLE_CLIENT = 1, VISC_ROLE_AUX = 2 } visc_peer_role;

typedef struct {
    uint8_t peer[VISC_KEY_BYTES]; /* the signer (filled in from the record, not on the wire) */
    uint64_t epoch;
    uint64_t samples_accumulated;
    double samples_per_second;
    uint64_t time_ms;       /* unix ms of the last measurement */
    uint8_t role;           /* visc_peer_role */
    uint8_t paused;         /* 1: averaging (not computing): not extrapolated */
    char addr[64];          /* "host:port" serving state, empty if none; printable ASCII */
    uint8_t state_hash[32]; /* BLAKE2b-256 of the state blob at `epoch` (zeros: unknown) */
    float loss;             /* recent training loss, NaN if none */
} visc_progress_record;

/* The value stored on the DHT: exactly VISC_PROGRESS_WIRE bytes,
 * little-endian:
 *   0 magic "VSPR"        4 version (1)        5 role (0..2)
 *   6 flags (bit 0: paused; other bits 0)      7 epoch (u64)
 *  15 samples_accumulated (u64)               23 samples_per_second (f64)
 *  31 time_ms (u64)      39 loss (f32)        43 addr (64 bytes, NUL-terminated,
 *                                                  zeros after the NUL)
 * 107 state_hash (32)   139 end
 * Parse is strict: the size, magic and version, role, flags, counts up to
 * VISC_PROGRESS_MAX_COUNT, time_ms in (0, VISC_PROGRESS_MAX_COUNT], a
 * throughput finite and in [0, VISC_PROGRESS_MAX_SPS], a loss finite or
 * NaN, an address of printable ASCII. encode refuses what parse would. */
#define VISC_PROGRESS_WIRE 139
#define VISC_PROGRESS_VERSION 1
#define VISC_PROGRESS_MAX_COUNT (1ull << 53) /* epochs, samples, ms: exact as doubles */
#define VISC_PROGRESS_MAX_SPS 1e9
int visc_progress_encode(const visc_progress_record *p, uint8_t out[VISC_PROGRESS_WIRE]);
int visc_progress_parse(const uint8_t *value, size_t n, visc_progress_record *out);

typedef struct {
    uint64_t epoch;            /* global epoch */
    uint64_t samples;          /* accumulated toward the next step (extrapolated) */
    uint64_t target;           /* target batch size (0: none) */
    double samples_per_second; /* the swarm's, summed over peers at the epoch */
    double eta_s; /* expected seconds until target (0 when reached, INFINITY unknown) */
    int peers, peers_at_epoch, distrusted;
    int auxiliaries; /* live records of auxiliary peers (other than this one) */
    int ready;       /* target > 0 and samples >= target */
} visc_swarm_progress_view;

typedef struct visc_progress_tracker visc_progress_tracker;

typedef struct {
    visc_dht *dht;
    const uint8_t *self_key; /* this peer's public key (its records are skipped when read);
                                may be NULL for an observer */
    int observe_only;        /* 1: publish nothing, no local record (status, monitor) */
    uint64_t target_batch_size;
    double expiration_s;  /* record lifetime, default 60 */
    double min_refresh_s; /* default 0.5 */
    double max_refresh_s; /* default 30; must be below expiration_s */
    double op_timeout_s;  /* how long one DHT put or get may wait, default 5 */
    /* Monotonic seconds for throughput, the refresh schedule and distrust
     * expiry (NULL: visc_now). Tests drive it. */
    double (*clock)(void *ctx);
    void *clock_ctx;
    /* 1: a record ahead of this peer's epoch raises the global epoch only
     * when another trusted peer has reached that epoch too (a step is taken
     * by a group of two or more; a lone record ahead is a liar's, or a
     * survivor's whose state nobody can vouch for). It is reported once
     * when it stays alone for 5 s, or is alone 5 s in all and most of the
     * time ("... not followed": a peer that steps last sees the liar joined
     * for a moment at every step), and left out of the
     * count at the epoch. Training peers set it; observers show every
     * record. */
    int corroborated_epochs;
    /* 1: publish and read on the tracker's own threads too (started by
     * tracker_new, joined by tracker_free, which waits out a DHT operation
     * under way), and take the records the DHT pushes (a listen on the
     * key). The publisher republishes this peer's record when the period
     * passed (and a change made between refreshes: pause, resume); the
     * reader reads when the period passed. A refresh without force then
     * publishes only a changed record (epoch, state hash: the caller goes
     * on once the swarm can see it, as without), reads nothing, judges the
     * records at hand and returns what the threads failed at since the
     * last refresh; a forced one publishes and reads, as without. Puts
     * wait at most 0.05 s for their confirmation (visc_dht_send). Training
     * peers set it; tests that drive the clock leave it off. */
    int background;
} visc_progress_config;

/* NULL with an error on a bad config (no DHT, periods out of order). */
visc_progress_tracker *visc_progress_tracker_new(const visc_progress_config *cfg);
void visc_progress_tracker_free(visc_progress_tracker *t);
/* This peer's fields (role, address, state hash of its epoch). An address
 * that does not fit or is not printable ASCII is stored empty. */
void visc_progress_set_local(visc_progress_tracker *t, visc_peer_role role, const char *addr);
void visc_progress_set_state_hash(visc_progress_tracker *t, const uint8_t hash[32]);
/* n samples processed (updates throughput and accumulated count); loss is
 * kept when finite. */
void visc_progress_add_samples(visc_progress_tracker *t, uint64_t n, float loss);
/* The step of `epoch` is done: accumulated resets to 0, epoch = new_epoch. */
void visc_progress_set_epoch(visc_progress_tracker *t, uint64_t new_epoch);
/* n samples already counted by add_samples that belong to the new epoch
 * (delayed updates: batches computed while the last step's round ran):
 * added to accumulated, the throughput left as measured. */
void visc_progress_carry_samples(visc_progress_tracker *t, uint64_t n);
/* Throughput EMA stops/resumes counting time (averaging is not compute). */
void visc_progress_pause(visc_progress_tracker *t);
void visc_progress_resume(visc_progress_tracker *t);
/* This peer's record as it would be published now. */
void visc_progress_local(visc_progress_tracker *t, visc_progress_record *out);
/* Seconds between refreshes, from the last view (see above); call it from
 * the thread that refreshes. */
double visc_progress_refresh_period(visc_progress_tracker *t);
/* Publishes this peer's record if due (or force), reads everyone's if due
 * (or force; with background, only on force: the threads do the rest),
 * and fills the view (always, from what is known). records/cap
 * (optional) receive the trusted records, this peer's first (unless an
 * observer), *count how many. -1 with an error when a put or get failed
 * (the view is still filled). */
int visc_progress_refresh(visc_progress_tracker *t, int force, visc_swarm_progress_view *view,
                          visc_progress_record *records, int cap, int *count);

#endif

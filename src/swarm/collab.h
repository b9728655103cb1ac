/* collab.h: the collaborative optimizer: one model trained by a swarm
 * (`visc train --swarm`), as hivemind's Optimizer does, without its
 * defects. It plugs into the trainer through visc_step_hooks (train.h):
 * the trainer runs forward/backward on this peer's batches; the hooks
 * decide when the optimizer steps and with which gradient.
 *
 * Gradient mode (default). After each local batch of n samples the hooks
 * add n x (the batch's mean gradient) to an accumulator and report the
 * samples to the progress tracker (progress.h). When the swarm's
 * accumulated samples reach target_batch_size (or, in lockstep, after every
 * batch), the peer matchmakes for round = its epoch (matchmaking.h) and
 * all-reduces its mean accumulated gradient with weight = its sample count
 * (allreduce.h): the group's result is the swarm's mean gradient over all
 * the samples. Every member then applies the same optimizer step at global
 * step = epoch, and the epoch advances. The LR schedule follows the global
 * step (schedule_steps_per_epoch = dataset size / target batch).
 *
 * Parameter mode ("local updates"). Every batch steps the local optimizer;
 * when the swarm reaches the target, parameters, optimizer statistics and
 * BatchNorm buffers are averaged (weighted by samples since the last
 * average) and the epoch advances.
 *
 * Lockstep. Each peer contributes exactly one batch to every step and
 * waits for the round: with the data sharded like ranks (--swarm-shard),
 * N peers with batch B/N end where one process with batch B ends. For
 * tests and controlled studies; the default is free-running.
 *
 * Delayed updates (delay_updates, `--delay-updates`; hivemind's
 * delay_optimizer_step with delay_grad_averaging; gradient mode). A
 * step's round (matchmaking and all-reduce) runs on a worker thread,
 * started once with its own vector (no allocation per step), while the
 * trainer computes the next batches at the same parameters. The round's
 * schema is the state hash when it is handed over, which every member
 * holds alike; the worker touches no view, record or trainer state, only
 * its vector, the node and the round counters. A run that ends otherwise
 * than at --max-steps waits for the round in flight and drops its result.
 * Lockstep: at the next batch's after_backward the hooks take the round's
 * mean gradient (waiting only while it still runs) and the trainer steps
 * with it, then after_step hands this batch's gradient over as the next
 * round. So the gradient applied at step t+1 was computed at the
 * parameters of step t - 1 (one step stale), and a run of N steps
 * computes N + 1 batches. A failed round skips its step and the next
 * batch's gradient is averaged in its place. The last round (at
 * --max-steps) is not handed over. Free-running: when the swarm reaches
 * the target, the accumulated gradient is handed over and the peer trains
 * on, accumulating (and reporting to the progress tracker) the next
 * step's samples; the first batch that ends after the round applies its
 * mean gradient, and the samples computed meanwhile count toward the next
 * step (visc_progress_carry_samples). Catching up and split checks wait
 * until the round is over. A failed round follows the policy: skip puts
 * its gradient back into the accumulator (weighted by samples), local
 * steps with it. samples_overlapped counts the samples computed while a
 * round ran.
 *
 * Failures never pass silently. A round that finds no group or whose
 * all-reduce leaves part of the vector un-averaged is retried while the
 * step's deadline allows; then the policy decides: "skip" (the default: no
 * step, keep the accumulated gradient for the next round) or "local" (step
 * with this peer's own gradient and flag the divergence). Either way one
 * line is logged and the counters (visc_collab_stats) say how often. A
 * round in which a member was dropped (it failed, or sent NaN, Inf, huge
 * values or wrong sizes and was banned) but every value was still averaged
 * by the others is a step: every member that received all results holds
 * the same vector (the exact mean of those whose parts were used); one
 * line names the dropped member, and members_dropped counts them. A
 * hostile member that reduces a shard (and sends invalid results) makes
 * that round fail. Either way, a member banned by an all-reduce (it sent
 * this peer invalid data over an authenticated channel) is excluded from
 * this peer's matchmaking for BAN_S (600 s; one line), so the retries
 * form groups without it and lockstep group sizes shrink by the excluded
 * count (tests/e2e_swarm_train_hostile.sh). A reducer whose results are
 * wrong but plausible (finite, in range) is not detected.
 *
 * Late joiners and laggards (collab.c, as built). Every full peer serves
 * the states of its last VISC_STATE_HISTORY (4) epochs (a ring of blobs
 * allocated at start; a requester asks for the epoch it read in the
 * records, which the donor may have left since: that state's hash is the
 * one the requester can check). A peer is behind when two other peers'
 * records are ahead of it (a step is taken by a group of two or more; a
 * lone record ahead is a liar's, or a survivor's whose partner died, and is
 * not followed: the progress tracker runs with corroborated_epochs, so
 * such a record neither raises the global epoch nor decides when the swarm
 * is ready). A peer that is behind drops its accumulated gradient and
 * catches up at once, without computing batches in between: it re-reads
 * the records, downloads the state (state_sync.h: the highest state whose
 * hash two peers vouch for: two records, or one record and the signed
 * header of a donor that has moved on but still holds it), and repeats
 * while the swarm moved on during the download; a failed download is
 * retried after
 * 2 s. The download is loaded through the trainer (parameters, optimizer
 * state, EMA, BatchNorm buffers, step; the data cursor stays this peer's).
 * A free-running peer that is behind, when the swarm is due within two of
 * its batches plus the matchmaking time, first joins the swarm's round (of
 * the state most records at the swarm's step publish) as a newcomer
 * (matchmaking role 3, allreduce.h: weight 0, it sends nothing, reduces a
 * shard and takes the group's mean), then downloads that state and steps
 * with the mean, at the swarm's next step with the others. Downloading
 * first, then joining, it arrived after the group had formed step after
 * step where a step's compute is shorter than a read of the records plus
 * a download (e2e_swarm_churn.sh in CI: 6 to 8 downloads, at most 1 of 8
 * steps averaged). Otherwise (longer steps) it downloads and joins with
 * its batches.
 * At start, a peer behind the swarm, or at its epoch with a state other
 * peers corroborate and this peer does not hold, downloads too (e.g.
 * another initialization). A peer resumed from a checkpoint takes the
 * swarm's state only when the swarm is ahead of it.
 *
 * The served state is not the checkpoint file but a canonical blob (below)
 * of what every peer of one epoch holds alike: parameters, BatchNorm
 * buffers, optimizer state and step, EMA (gradient mode), and the global
 * step. A checkpoint also holds per-peer fields (the data cursor, the
 * config text, BatchNorm counters), so peers' hashes would never agree and
 * no state could be corroborated. To make peers of one epoch equal,
 * gradient mode averages the BatchNorm buffers in the same all-reduce as
 * the gradients, and parameter mode averages the optimizer's step count
 * with the rest. The blob is encoded and hashed once per epoch on the
 * training thread (O(state), next to the target batch's compute); servers
 * copy it under a lock.
 *
 * Split groups. Peers that miss each other in matchmaking can step the
 * same epoch in two groups. In gradient mode every round's schema (what
 * matchmaking and the all-reduce require members to share) includes the
 * hash of the member's state at its epoch, so peers whose states differ
 * never average together (the same averaged gradient applied to two states
 * would keep them apart for ever); clients hash their state too. A
 * free-running peer compares, after each batch, the state hashes published
 * at its epoch: when most peers (at least two; ties: the smaller hash)
 * publish another hash than its own, it takes that state from them (one
 * line); a side that is behind catches up as above. After the run's last
 * step, before the trainer saves, the peer settles: it waits until no live
 * peer is behind it (one step short, such a peer may still step in a group
 * of its own and outvote this one; further behind, it needs a donor to
 * catch up from; a record unchanged for 20 s plus the step deadline is a
 * dead peer's and is not waited for), serving its state and taking the majority's
 * state whenever its own differs, bounded by the averaging timeout. So the
 * swarm ends on one model, also with slow peers, kills and joins
 * (tests/e2e_swarm_churn.sh) and after a partition heals
 * (tests/e2e_swarm_partition.sh).
 *
 * Auxiliary peers (role VISC_ROLE_AUX, `visc train --swarm --auxiliary`
 * with the peers' model flags, so that its vector layout and schema are
 * theirs; hivemind's auxiliary mode). It builds the model and optimizer
 * (the trainer opens the dataset for the class count and input shape) but
 * trains no batch: start() runs run_auxiliary() and returns 1, so the
 * trainer ends without training or saving. It follows the swarm through
 * the progress records and publishes an auxiliary record (progress.h: it
 * is in no count of the view but `auxiliaries`, so it is never a live peer
 * for readiness, epochs, donors or settling, and it serves no state) and,
 * once the swarm is ready for step E (in
 * lockstep: as soon as peers publish step E), matchmakes for round E as an
 * auxiliary member (matchmaking role 2): it counts toward the group size
 * (lockstep peers set --group-size to the trainers plus the auxiliaries;
 * free-running peers wait for the trainers at their step plus the live
 * auxiliaries, once at least 2 trainers are there), and a group needs 2
 * members that train. In the all-reduce it reduces a
 * shard in proportion to its bandwidth with weight 0 (allreduce.h): it
 * sends no values and receives no results, so the members' result is
 * exactly the weighted mean of the training members'. Gradient mode puts
 * the members' state hash in the round schema; an auxiliary has no state,
 * so it takes the hash that most records at step E publish (the
 * majority's group is the one it helps; a minority that stepped apart
 * averages without it). One line per round says how many values it
 * reduced. It ends after --max-steps steps, or when every record has
 * stopped changing (the swarm is gone). Tested in lockstep (bit-identical
 * to the trainers without it) and free-running (tests/e2e_swarm_auxiliary.sh).
 * Known limit: an auxiliary's record lives until it expires (60 s), so
 * trainers wait for a dead auxiliary until the matchmaking deadline.
 *
 * A peer steps "alone" without a failure when a fresh read of the swarm
 * shows no other live peer (a swarm of one equals plain training). Known
 * limit: peers that start a new swarm at the same moment must share the
 * initialization (the same --seed): with nobody to corroborate, each keeps
 * its own. */
#ifndef VISC_SWARM_COLLAB_H
#define VISC_SWARM_COLLAB_H

#include <stdint.h>

#include "allreduce.h"
#include "progress.h"
#include "state_sync.h"
#include "visc/train.h"

typedef enum { VISC_COLLAB_GRADIENTS = 0, VISC_COLLAB_PARAMETERS = 1 } visc_collab_mode;
typedef enum { VISC_COLLAB_SKIP = 0, VISC_COLLAB_STEP_LOCAL = 1 } visc_collab_on_failure;

typedef struct {
    visc_swarm_node *node; /* the caller's; outlives the collab */
    uint64_t target_batch_size;
    visc_collab_mode mode;
    int lockstep;
    visc_peer_role role;                   /* full or client (client: no state served) */
    int target_group_size, min_group_size; /* default 16, 2 */
    double matchmaking_time_s;             /* default 5 */
    double averaging_timeout_s;            /* one round's all-reduce, default 60 */
    double step_deadline_s; /* retries of one step end here, default 3 x matchmaking */
    visc_collab_on_failure on_failure;
    visc_compression compression;
    visc_aggregate_config aggregate;
    uint64_t dataset_size; /* for the LR schedule's steps per epoch (0: the trainer's) */
    uint64_t seed;         /* donor choice */
    int verbose;           /* one line per round */
    double linger_s;       /* after training: keep serving the state this long */
    int delay_updates;     /* gradient mode: a step's round runs in the background and is
                              applied one step late (see above) */
    /* Tests only (a hostile peer's fault injection): NULL in production. */
    const visc_allreduce_hooks *allreduce_hooks;
} visc_collab_config;

typedef struct {
    uint64_t epoch; /* global steps this peer has taken part in */
    uint64_t rounds, rounds_failed, rounds_partial, steps_skipped, steps_local;
    uint64_t state_downloads, bytes_sent, bytes_received;
    uint64_t members_dropped;    /* group members left out of rounds that still averaged all */
    uint64_t samples_overlapped; /* --delay-updates: computed while a round ran */
    uint64_t newcomer_rounds;    /* rounds joined with no gradient while behind (newcomer) */
    double averaging_seconds;
} visc_collab_stats;

typedef struct visc_collab visc_collab;

void visc_collab_config_default(visc_collab_config *c);
visc_collab *visc_collab_new(const visc_collab_config *cfg);
/* The hooks to put in visc_train_config.hooks; valid while c lives. */
const visc_step_hooks *visc_collab_hooks(visc_collab *c);
void visc_collab_get_stats(visc_collab *c, visc_collab_stats *out);
void visc_collab_free(visc_collab *c);

/* ---- the state blob (collab_state.c; exported for the fuzzer) ----
 * Little-endian: 0 magic "VCST", 4 version (1), 5 mode, 6 flags (bit 0:
 * EMA follows; other bits 0), 7 zero, 8 schema hash (32), 40 global step
 * (u64), 48 optimizer steps (u64), 56 parameters P (u64), 64 buffers B
 * (u64), 72 optimizer slots S (u32), 76 floats (f32): P parameters, B
 * buffers, S x P optimizer state, then with EMA P + B EMA values. Parse is
 * strict: every header field must equal this peer's layout, the size be
 * exact, the steps at most VISC_PROGRESS_MAX_COUNT, every float finite. */
#define VISC_COLLAB_STATE_HEADER 76
#define VISC_COLLAB_STATE_VERSION 1

typedef struct {
    visc_collab_mode mode;
    uint8_t schema[32];
    uint64_t n_params, n_buffers;
    uint32_t slots;
    int ema;
} visc_collab_layout;

typedef struct {
    uint64_t step, opt_step;
    /* into the blob (unaligned: copy with memcpy) */
    const uint8_t *params, *buffers, *opt, *ema_params, *ema_buffers;
} visc_collab_state_view;

/* The blob's size for a layout; 0 when it would not fit in a size_t. */
size_t visc_collab_state_size(const visc_collab_layout *l);
/* Writes visc_collab_state_size(l) bytes to out (ema_* ignored without
 * l->ema). */
void visc_collab_state_encode(const visc_collab_layout *l, uint64_t step, uint64_t opt_step,
                              const float *params, const float *buffers, const float *opt,
                              const float *ema_params, const float *ema_buffers, uint8_t *out);
/* 0 and out filled, or -1 with one line naming the problem. */
int visc_collab_state_parse(const uint8_t *blob, size_t n, const visc_collab_layout *l,
                            visc_collab_state_view *out);

#endif

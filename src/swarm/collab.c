/* collab.c: the collaborative optimizer (collab.h): the trainer's step
 * hooks on top of progress tracking, matchmaking, the all-reduce and state
 * download. Everything here runs on the training thread except the state
 * server's snapshot callback, which only copies the cached blob. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "collab.h"
#include "matchmaking.h"
#include "record.h"
#include "visc/core.h"

#define MAX_RECORDS 256
#define DOWNLOAD_BACKOFF_S 2.0 /* a failed download is retried after this */
#define START_DOWNLOAD_TRIES 3
#define STEP_SCALE 1024.0            /* parameter mode averages optimizer step / this */
#define SETTLE_STALE_S 20.0          /* a record unchanged this long is a dead peer's (settle) */
#define SNAPSHOTS VISC_STATE_HISTORY /* epochs a donor keeps serving */
#define BAN_S 600.0                  /* a member that sent invalid data is not grouped with */
#define MAX_BANS 64

/* A round's group sizes for matchmaking: target (the deal, the same at
 * every peer) and expected (whom to wait for; 0: target). */
typedef struct {
    int target, expected;
} group_sizes;

struct visc_collab {
    visc_collab_config cfg;
    visc_step_hooks hooks;
    visc_train_access *a;
    visc_progress_tracker *tracker;
    visc_state_server *server;
    visc_collab_layout layout;
    size_t state_bytes;
    size_t n_vec;      /* floats one round averages */
    float *acc;        /* gradient mode: running mean of this peer's gradients */
    float *vec;        /* the round's vector (the all-reduce overwrites it) */
    uint64_t samples;  /* in acc (gradient mode) / since the last average
                          (parameters) */
    uint64_t epoch;    /* global steps done */
    int publish_epoch; /* a step was handed to the trainer: after_step publishes
                          it */
    visc_swarm_progress_view view;
    visc_progress_record *recs;
    int n_recs;
    double next_download; /* monotonic time before which no download is tried */
    double alone_after;   /* before it, the view is not proof of who is there:
                             peers that started together may not have seen each
                             other's records yet (so no stepping alone, and no
                             group closed at the size of the view) */
    uint64_t downloads_tried;
    int took_state;    /* this epoch's state came by download (joining_late) */
    double batch_s;    /* a batch's time here (a running mean; 0: not measured yet) */
    double hooks_left; /* monotonic time the trainer last got control back */
    /* The served states: the blobs of this peer's last SNAPSHOTS epochs, a
     * ring (cur: the newest), built on the training thread, copied by the
     * server's threads under mu. A requester asks for the epoch it read in
     * the records a moment ago: the donor may have stepped since, and the
     * requester can only check the hash of an epoch it saw published. */
    pthread_mutex_t mu;
    struct {
        uint8_t *blob;
        uint64_t epoch;
        uint8_t hash[32];
    } snaps[SNAPSHOTS];
    int n_snaps, cur;
    visc_collab_stats stats;
    int started, finished;
    /* --delay-updates: one worker thread runs a round (matchmaking and
     * all-reduce of bg_vec) while the trainer computes the next batches;
     * both planned at start. Under dw.mu: job, done, abort, out, why. */
    struct {
        pthread_t th;
        pthread_mutex_t mu;
        pthread_cond_t cv;
        int running, job, done, quit;
        int abort; /* free-running: the swarm stepped past the round; no more tries */
        uint64_t round;
        group_sizes sizes; /* the round's group (group_sizes_of) */
        uint8_t schema[32];
        double weight;
        int out; /* round_outcome */
        char why[640];
    } dw;
    float *bg_vec;
    int delay_pending; /* a round was handed to the worker and not taken back */
    /* free-running: the samples of the round in flight (their mean gradient
     * stays in vec, to be accumulated again if the round fails), and
     * whether the step being taken leaves acc to the next step */
    uint64_t launched_samples;
    int carry;
    /* Members that sent this peer invalid data (banned by an all-reduce):
     * matchmaking excludes them until `until` (monotonic), so a hostile
     * member cannot fail every retry of a step. Under ban_mu (the
     * delayed-update worker runs rounds too). */
    pthread_mutex_t ban_mu;
    struct {
        uint8_t key[VISC_KEY_BYTES];
        double until;
    } bans[MAX_BANS];
    int n_bans;
};

void visc_collab_config_default(visc_collab_config *c) {
    memset(c, 0, sizeof *c);
    c->mode = VISC_COLLAB_GRADIENTS;
    c->role = VISC_ROLE_FULL;
    c->target_group_size = 16;
    c->min_group_size = 2;
    c->matchmaking_time_s = 5;
    c->averaging_timeout_s = 60;
    c->step_deadline_s = 15;
    c->on_failure = VISC_COLLAB_SKIP;
    c->compression = VISC_COMP_NONE;
    visc_aggregate_config_default(&c->aggregate);
}

/* ---- the state: layout, snapshot, download ---- */

/* What peers must share to average together and to trade state: the mode,
 * every tensor's name and size, the optimizer and whether EMA is in the
 * state. */
static void schema_hash(visc_collab *c, uint8_t out[32]) {
    const visc_train_access *a = c->a;
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, 32);
    char line[VISC_MAX_NAME + 64];
    int n = snprintf(line, sizeof line, "visc-collab-v1 mode %d opt %s slots %d ema %d",
                     (int)c->cfg.mode, visc_opt_kind_name(a->opt->cfg.kind), a->opt->slots,
                     c->layout.ema);
    crypto_generichash_update(&h, (const uint8_t *)line, (size_t)n + 1);
    const visc_table *tables[2] = {&a->model->params, &a->model->buffers};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < tables[t]->count; i++) {
            const visc_tensor_entry *e = &tables[t]->entries[i];
            n = snprintf(line, sizeof line, "%d %s %zu", t, e->name, e->numel);
            crypto_generichash_update(&h, (const uint8_t *)line, (size_t)n + 1);
        }
    crypto_generichash_final(&h, out, 32);
}

/* Makes this epoch's state the newest served one and publishes its hash.
 * blob: an already built one to take over (a download), or NULL: encode
 * the trainer's state into the ring's oldest slot (allocated at start, so
 * a step allocates nothing). */
static int snapshot(visc_collab *c, uint8_t *blob, const uint8_t *hash) {
    visc_train_access *a = c->a;
    pthread_mutex_lock(&c->mu);
    int slot = c->n_snaps == 0 ? 0 : (c->cur + 1) % SNAPSHOTS;
    if (blob) {
        free(c->snaps[slot].blob);
        c->snaps[slot].blob = blob;
        memcpy(c->snaps[slot].hash, hash, 32);
    } else {
        /* servers copy under mu: the slot is theirs to read until then */
        visc_collab_state_encode(&c->layout, (uint64_t)a->state->step, (uint64_t)a->opt->step,
                                 a->model->params.data, a->model->buffers.data, a->opt->state,
                                 a->ema_params, a->ema_buffers, c->snaps[slot].blob);
        visc_state_hash(c->snaps[slot].blob, c->state_bytes, c->snaps[slot].hash);
    }
    c->snaps[slot].epoch = (uint64_t)a->state->step;
    c->cur = slot;
    if (c->n_snaps < SNAPSHOTS) c->n_snaps++;
    uint8_t h[32];
    memcpy(h, c->snaps[slot].hash, 32);
    pthread_mutex_unlock(&c->mu);
    visc_progress_set_state_hash(c->tracker, h);
    return 0;
}

/* This peer's newest state hash (zeros before the first snapshot). */
static void current_hash(visc_collab *c, uint8_t out[32]) {
    pthread_mutex_lock(&c->mu);
    if (c->n_snaps) memcpy(out, c->snaps[c->cur].hash, 32);
    else memset(out, 0, 32);
    pthread_mutex_unlock(&c->mu);
}

/* The state server's callback (its threads): a copy of the blob of
 * want_epoch when the ring still holds it (the newest such: a download at
 * one epoch replaces this peer's own), else of the newest. */
static int serve_snapshot(void *ctx, uint64_t want_epoch, uint8_t **blob, size_t *n,
                          uint64_t *epoch, uint8_t hash[32]) {
    visc_collab *c = ctx;
    int rc = -1;
    pthread_mutex_lock(&c->mu);
    int pick = c->cur;
    for (int k = 0; k < c->n_snaps; k++) {
        int i = (c->cur - k + SNAPSHOTS) % SNAPSHOTS;
        if (c->snaps[i].epoch == want_epoch) {
            pick = i;
            break;
        }
    }
    if (c->n_snaps && (*blob = malloc(c->state_bytes)) != NULL) {
        memcpy(*blob, c->snaps[pick].blob, c->state_bytes);
        *n = c->state_bytes;
        *epoch = c->snaps[pick].epoch;
        memcpy(hash, c->snaps[pick].hash, 32);
        rc = 0;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void copy_floats(float *dst, const uint8_t *src, size_t n) {
    if (n) memcpy(dst, src, n * sizeof(float));
}

/* Replaces the trainer's state by a parsed blob. The data cursor stays. */
static void apply_state(visc_collab *c, const visc_collab_state_view *v) {
    visc_train_access *a = c->a;
    size_t P = (size_t)c->layout.n_params, B = (size_t)c->layout.n_buffers;
    copy_floats(a->model->params.data, v->params, P);
    copy_floats(a->model->buffers.data, v->buffers, B);
    copy_floats(a->opt->state, v->opt, (size_t)c->layout.slots * P);
    if (a->ema_params) {
        /* without EMA in the blob (parameter mode) the EMA restarts here */
        copy_floats(a->ema_params, v->ema_params ? v->ema_params : v->params, P);
        copy_floats(a->ema_buffers, v->ema_buffers ? v->ema_buffers : v->buffers, B);
    }
    a->opt->step = (int64_t)v->opt_step;
    a->state->step = (int64_t)v->step;
}

/* Downloads the swarm's state from the last read records and takes it.
 * 0, or -1 with what failed (not fatal for the caller: it trains on). */
static int download_state_from(visc_collab *c, const visc_progress_record *recs, int n,
                               uint64_t min_epoch) {
    visc_state_download_config dc = visc_state_download_defaults(c->state_bytes);
    dc.min_epoch = min_epoch;
    dc.timeout_s = c->cfg.averaging_timeout_s;
    dc.seed = c->cfg.seed ? c->cfg.seed + c->downloads_tried : 0;
    c->downloads_tried++;
    uint8_t *blob = NULL, hash[32];
    size_t size = 0;
    uint64_t epoch = 0;
    if (visc_state_download(c->cfg.node, recs, n, &dc, &blob, &size, &epoch, hash)) return -1;
    visc_collab_state_view v;
    if (visc_collab_state_parse(blob, size, &c->layout, &v) != 0) {
        free(blob);
        return -1;
    }
    if (v.step != epoch) {
        free(blob);
        return visc_set_error("swarm state: the donor's state is of step %" PRIu64
                              ", it advertised %" PRIu64,
                              v.step, epoch);
    }
    apply_state(c, &v);
    uint64_t was = c->epoch;
    c->epoch = epoch;
    c->stats.epoch = epoch;
    c->samples = 0; /* the gradient so far was of parameters that are gone */
    c->took_state = 1;
    c->stats.state_downloads++;
    c->stats.bytes_received += size;
    visc_progress_set_epoch(c->tracker, epoch);
    if (snapshot(c, blob, hash)) return -1;
    fprintf(stderr,
            "visc: swarm: took the swarm's state at step %" PRIu64
            " (this peer was at step %" PRIu64 ")\n",
            epoch, was);
    return 0;
}

/* min_epoch: the lowest epoch worth taking (a peer that is behind wants
 * a state past its own, not its own again). */
static int download_state(visc_collab *c, uint64_t min_epoch) {
    return download_state_from(c, c->recs, c->n_recs, min_epoch);
}

/* The state hash most trusted records at `epoch` publish (ties: the
 * smaller); returns how many publish it (0: no record at the epoch has
 * one yet). */
static int majority_hash(const visc_collab *c, uint64_t epoch, uint8_t out[32]) {
    static const uint8_t zero[32];
    const uint8_t *best = NULL;
    int best_count = 0;
    for (int i = 0; i < c->n_recs; i++) {
        const visc_progress_record *r = &c->recs[i];
        if (r->epoch != epoch || memcmp(r->state_hash, zero, 32) == 0) continue;
        int count = 0;
        for (int j = 0; j < c->n_recs; j++)
            count +=
                c->recs[j].epoch == epoch && memcmp(c->recs[j].state_hash, r->state_hash, 32) == 0;
        if (count > best_count || (count == best_count && memcmp(r->state_hash, best, 32) < 0))
            best = r->state_hash, best_count = count;
    }
    if (best) memcpy(out, best, 32);
    return best_count;
}

/* The swarm split at this peer's step: among the trusted records at the
 * step (this peer's own included), the state hash most peers publish (ties:
 * the smaller hash; at least two must agree) is not this peer's. Groups
 * that stepped apart (peers that missed each other in matchmaking) must
 * not stay apart: the side that loses takes the winning state. */
static int diverged(visc_collab *c, uint8_t winner[32]) {
    uint8_t best[32], mine[32];
    int count = majority_hash(c, c->epoch, best);
    current_hash(c, mine);
    if (count < 2 || !c->n_snaps || memcmp(best, mine, 32) == 0) return 0;
    memcpy(winner, best, 32);
    return 1;
}

/* Takes the state that diverged() chose, from the peers that publish it. */
static int take_winner(visc_collab *c, const uint8_t winner[32]) {
    visc_progress_record *pick = visc_malloc((size_t)c->n_recs * sizeof *pick, "donors");
    if (!pick) return -1;
    int n = 0;
    for (int i = 0; i < c->n_recs; i++)
        if (c->recs[i].epoch == c->epoch && memcmp(c->recs[i].state_hash, winner, 32) == 0)
            pick[n++] = c->recs[i];
    fprintf(stderr,
            "visc: swarm: at step %" PRIu64 " this peer's state differs from the one most "
            "peers have (groups stepped apart): taking theirs\n",
            c->epoch);
    int rc = download_state_from(c, pick, n, c->epoch);
    free(pick);
    if (rc)
        fprintf(stderr, "visc: swarm: taking the swarm's state at step %" PRIu64 " failed: %s\n",
                c->epoch, visc_last_error());
    return rc;
}

/* Reads the swarm (force: now, else when due); the view and records. */
static int refresh(visc_collab *c, int force) {
    return visc_progress_refresh(c->tracker, force, &c->view, c->recs, MAX_RECORDS, &c->n_recs);
}

/* The swarm stepped past this peer: two other peers' records are ahead of
 * it. A step is taken by a group of two or more, so a lone record ahead is
 * a liar's (or a survivor's whose partner died): its state could not be
 * downloaded anyway (no corroboration), and following it would stall this
 * peer. (The same rule as the tracker's corroborated_epochs.) */
static int behind(const visc_collab *c) {
    if (c->view.epoch <= c->epoch) return 0;
    int ahead = 0;
    for (int i = 0; i < c->n_recs; i++)
        ahead += c->recs[i].epoch > c->epoch; /* this peer's own record is not */
    return ahead >= 2;
}

/* This peer missed a step of the swarm: take the swarm's state, and again
 * while the swarm moved on during the download, without computing batches
 * in between (a gradient of a state that is gone is wasted, and a peer
 * that trains between downloads may never catch up with a fast swarm).
 * Every download starts from freshly read records: their donors still
 * serve the epochs they published. A failed download is retried after a
 * backoff. 1 when the peer is at the swarm's epoch again. */
static int catch_up(visc_collab *c) {
    double now = visc_now(), end = now + c->cfg.averaging_timeout_s;
    if (now < c->next_download) return 0;
    for (;;) {
        refresh(c, 1);
        if (!behind(c)) return 1;
        uint64_t was = c->epoch;
        if (download_state(c, c->epoch + 1) != 0) {
            fprintf(stderr,
                    "visc: swarm: at step %" PRIu64 " behind the swarm's %" PRIu64
                    ", and the state download failed: %s (retrying in %.0f s)\n",
                    c->epoch, c->view.epoch, visc_last_error(), DOWNLOAD_BACKOFF_S);
            c->next_download = visc_now() + DOWNLOAD_BACKOFF_S;
            return 0;
        }
        if (c->epoch <= was) { /* the donors ahead could not serve: train on */
            c->next_download = visc_now() + DOWNLOAD_BACKOFF_S;
            return 0;
        }
        if (visc_now() >= end) return 0;
    }
}

/* ---- one averaging round ---- */

/* Fills a round's vector with what this peer averages. */
static void pack(visc_collab *c, float *v) {
    visc_train_access *a = c->a;
    size_t P = (size_t)c->layout.n_params, B = (size_t)c->layout.n_buffers;
    if (c->cfg.mode == VISC_COLLAB_GRADIENTS) {
        memcpy(v, c->acc, P * sizeof *v);
        if (B) memcpy(v + P, a->model->buffers.data, B * sizeof *v);
        return;
    }
    size_t S = (size_t)c->layout.slots;
    memcpy(v, a->model->params.data, P * sizeof *v);
    if (S) memcpy(v + P, a->opt->state, S * P * sizeof *v);
    if (B) memcpy(v + P + S * P, a->model->buffers.data, B * sizeof *v);
    /* scaled: validation caps |values| at max_abs (1e6), steps may exceed it */
    v[P + S * P + B] = (float)((double)a->opt->step / STEP_SCALE);
}

/* Takes an averaged vector (gradient mode: into m->grads). */
static void unpack(visc_collab *c, const float *v) {
    visc_train_access *a = c->a;
    size_t P = (size_t)c->layout.n_params, B = (size_t)c->layout.n_buffers;
    if (c->cfg.mode == VISC_COLLAB_GRADIENTS) {
        memcpy(a->model->grads, v, P * sizeof *v);
        if (B) memcpy(a->model->buffers.data, v + P, B * sizeof *v);
        return;
    }
    size_t S = (size_t)c->layout.slots;
    memcpy(a->model->params.data, v, P * sizeof *v);
    if (S) memcpy(a->opt->state, v + P, S * P * sizeof *v);
    if (B) memcpy(a->model->buffers.data, v + P + S * P, B * sizeof *v);
    double steps = (double)v[P + S * P + B] * STEP_SCALE;
    a->opt->step = steps > 0 ? (int64_t)llround(steps) : 0;
}

/* MISSED: the round's group formed without this peer (matchmaking's
 * VISC_MM_MISSED); the swarm is stepping without it. */
typedef enum { ROUND_DONE, ROUND_ALONE, ROUND_BEHIND, ROUND_FAILED, ROUND_MISSED } round_outcome;

/* The keys matchmaking excludes now (expired bans are dropped). */
static int active_bans(visc_collab *c, uint8_t out[MAX_BANS][VISC_KEY_BYTES]) {
    double now = visc_now();
    pthread_mutex_lock(&c->ban_mu);
    int n = 0;
    for (int i = 0; i < c->n_bans; i++)
        if (c->bans[i].until > now) {
            c->bans[n] = c->bans[i];
            memcpy(out[n++], c->bans[i].key, VISC_KEY_BYTES);
        }
    c->n_bans = n;
    pthread_mutex_unlock(&c->ban_mu);
    return n;
}

/* The members an all-reduce banned (they sent invalid data to this peer;
 * the channels are authenticated, so nobody can be framed) are left out
 * of this peer's groups for BAN_S: one line each. */
static void ban_members(visc_collab *c, const visc_group *g, const visc_allreduce_report *rep,
                        uint64_t round) {
    for (int i = 0; i < g->size; i++) {
        if (i == g->self || rep->member_failed[i] != 2) continue;
        double until = visc_now() + BAN_S;
        pthread_mutex_lock(&c->ban_mu);
        int at = 0;
        while (at < c->n_bans && memcmp(c->bans[at].key, g->members[i].key, VISC_KEY_BYTES) != 0)
            at++;
        int fresh = at == c->n_bans;
        if (fresh && c->n_bans == MAX_BANS) { /* full: replace the one that ends first */
            at = 0;
            for (int k = 1; k < c->n_bans; k++)
                if (c->bans[k].until < c->bans[at].until) at = k;
        } else if (fresh) {
            c->n_bans++;
        }
        memcpy(c->bans[at].key, g->members[i].key, VISC_KEY_BYTES);
        c->bans[at].until = until;
        pthread_mutex_unlock(&c->ban_mu);
        if (fresh) {
            char id[VISC_PEER_ID_CHARS + 1];
            visc_peer_id(g->members[i].key, id);
            fprintf(stderr,
                    "visc: swarm: step %" PRIu64 ": member %s sent invalid data: not grouped "
                    "with for %.0f s\n",
                    round, id, BAN_S);
        }
    }
}

/* Whether the view can be trusted to show every peer (alone_after). */
static int view_settled(const visc_collab *c) { return visc_now() >= c->alone_after; }

/* The group to wait for: every live peer at this step (progress records,
 * self included), so that free-running peers average as one group instead
 * of whoever came first (a peer left out would step with another
 * gradient). That count is the round's expected size; the group size that
 * deals the declarations stays the configured one, the same at every peer
 * (matchmaking.h: sizes from each peer's own count, which differ while
 * peers come and go, dealt one round into different groups at different
 * peers and split the swarm). Lockstep waits for the whole group. So does
 * a peer that started moments ago (view_settled): a group closed at the
 * size of a view that lacks a peer still starting leaves that peer out,
 * and with steps shorter than the matchmaking time it stays out,
 * downloading the state after every step (e2e_swarm_auxiliary.sh).
 * others: the members besides the training peers at the step and the
 * other auxiliaries (1 for an auxiliary itself). */
static group_sizes group_sizes_of(visc_collab *c, uint64_t epoch, int others) {
    /* the members this peer excludes will not be in it */
    uint8_t bans[MAX_BANS][VISC_KEY_BYTES];
    int n_bans = active_bans(c, bans);
    /* free-running: the training peers at this step, and the auxiliaries
     * when they make a group with them (a group needs 2 that train) */
    group_sizes g = {.target = c->cfg.target_group_size, .expected = 0};
    int trainers = c->view.peers_at_epoch;
    for (int i = 0; i < c->n_recs; i++)
        for (int b = 0; b < n_bans; b++)
            trainers -=
                c->recs[i].epoch == epoch && memcmp(c->recs[i].peer, bans[b], VISC_KEY_BYTES) == 0;
    int expect = trainers + c->view.auxiliaries + others;
    if (c->cfg.lockstep) g.target -= n_bans;
    else if (view_settled(c) && c->view.epoch == epoch && trainers >= c->cfg.min_group_size &&
             expect < g.target)
        g.expected = expect < 2 ? 2 : expect;
    if (g.target < 2) g.target = 2;
    return g;
}

/* The layout's schema bound to the hash of a state (gradient mode). */
static void schema_of_state(const visc_collab *c, const uint8_t state[32], uint8_t out[32]) {
    crypto_generichash_state h;
    crypto_generichash_init(&h, NULL, 0, 32);
    crypto_generichash_update(&h, c->layout.schema, 32);
    crypto_generichash_update(&h, state, 32);
    crypto_generichash_final(&h, out, 32);
}

/* What a round's members must share (matchmaking and the all-reduce
 * refuse others): the layout's schema and, in gradient mode, the hash of
 * the state at this epoch. The same averaged gradient applied to two
 * different states keeps them different for ever; peers whose states
 * differ (groups that stepped apart) do not average together, and are
 * reconciled by state download instead. */
static void round_schema(visc_collab *c, uint8_t out[32]) {
    if (c->cfg.mode != VISC_COLLAB_GRADIENTS) {
        memcpy(out, c->layout.schema, 32);
        return;
    }
    uint8_t state[32];
    current_hash(c, state);
    schema_of_state(c, state, out);
}

/* The all-reduce settings of a round with this schema. */
static void round_config(const visc_collab *c, const uint8_t schema[32],
                         visc_allreduce_config *ac) {
    visc_allreduce_config_default(ac);
    ac->compression = c->cfg.compression;
    ac->round_timeout_s = c->cfg.averaging_timeout_s;
    ac->agg = c->cfg.aggregate;
    ac->hooks = c->cfg.allreduce_hooks;
    /* Only the gradients (parameters, in parameter mode) go through a lossy
     * code: BatchNorm statistics and optimizer moments do not survive an
     * absmax block (running means came back 0, Adam's second moments 0 and
     * the next step exploded, docs/swarm_study.md). The layout, hence this
     * boundary, is in the schema every member agreed on. */
    ac->exact_from = (size_t)c->layout.n_params;
    memcpy(ac->schema_hash, schema, 32);
}

/* One attempt: matchmaking for the round, then the all-reduce of the
 * packed vector v with this peer's weight. why: what failed. Touches no
 * view or record (the delayed-update worker runs it too). */
static round_outcome attempt_on(visc_collab *c, uint64_t round, group_sizes sizes,
                                const uint8_t schema[32], float *v, double weight,
                                double matchmaking_time_s, char *why, size_t cap) {
    /* lockstep peers that exclude members need fewer (group_sizes_of) */
    int min = c->cfg.min_group_size < sizes.target ? c->cfg.min_group_size : sizes.target;
    visc_matchmaking_config mc = {.round = round,
                                  .target_group_size = sizes.target,
                                  .expected_group_size = sizes.expected,
                                  .min_group_size = min < 2 ? 2 : min,
                                  .matchmaking_time_s = matchmaking_time_s};
    memcpy(mc.schema_hash, schema, 32);
    uint8_t bans[MAX_BANS][VISC_KEY_BYTES];
    mc.n_excluded = active_bans(c, bans);
    mc.excluded = (const uint8_t(*)[VISC_KEY_BYTES])bans;
    visc_group g;
    double t0 = visc_now();
    c->stats.rounds++;
    /* weight 0: a peer behind the swarm, joining with no gradient (newcomer_round) */
    mc.newcomer = weight == 0;
    int mm = visc_matchmake(c->cfg.node, &mc, &g);
    if (mm != 0) {
        snprintf(why, cap, "%s", visc_last_error());
        c->stats.rounds_failed++;
        c->stats.averaging_seconds += visc_now() - t0;
        return mm == VISC_MM_MISSED ? ROUND_MISSED : ROUND_FAILED;
    }
    visc_allreduce_config ac;
    round_config(c, schema, &ac);
    visc_allreduce_report rep;
    memset(&rep, 0, sizeof rep);
    int rc = visc_allreduce(c->cfg.node, &g, &ac, v, c->n_vec, weight, NULL, &rep);
    c->stats.bytes_sent += rep.bytes_sent;
    c->stats.bytes_received += rep.bytes_received;
    c->stats.averaging_seconds += visc_now() - t0;
    if (rep.banned) ban_members(c, &g, &rep, round);
    char line[768];
    /* Every value replaced by a group result: every member that got them
     * all holds the same vector, even when a member was dropped (a sender
     * that failed, or sent invalid data, and was left out of the parts it
     * had not reached). A member whose results did not all come back sees
     * a fraction below 1, and catches up by download. */
    if (rc >= 0 && rep.averaged_fraction >= 1.0) {
        int dropped = rep.failed_senders + rep.failed_reducers;
        if (dropped || c->cfg.verbose) {
            visc_allreduce_report_line(&rep, line, sizeof line);
            fprintf(stderr, "visc: swarm: step %" PRIu64 ": %s%s\n", round, line,
                    dropped ? " (the rest of the group averaged everything)" : "");
        }
        c->stats.members_dropped += (uint64_t)dropped;
        return ROUND_DONE;
    }
    if (rc < 0) {
        snprintf(why, cap, "all-reduce failed: %s", visc_last_error());
        c->stats.rounds_failed++;
    } else {
        int k = snprintf(why, cap, "partial ");
        if (k > 0 && (size_t)k < cap) visc_allreduce_report_line(&rep, why + k, cap - (size_t)k);
        c->stats.rounds_partial++;
    }
    return ROUND_FAILED;
}

/* This step's attempt, from the training thread. */
static round_outcome attempt(visc_collab *c, char *why, size_t cap) {
    uint8_t schema[32];
    round_schema(c, schema);
    pack(c, c->vec);
    return attempt_on(c, c->epoch, group_sizes_of(c, c->epoch, 0), schema, c->vec,
                      (double)c->samples, c->cfg.matchmaking_time_s, why, cap);
}

static void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* After a round whose group formed without this peer: 1 once the records
 * show the swarm past this peer's step (it then catches up at once,
 * instead of waiting out rounds of a step that is over), 0 when they do
 * not within a matchmaking time (or the step's deadline): that group may
 * have failed and matchmake the round again, with this peer. */
static int await_step_past(visc_collab *c, double deadline) {
    double until = visc_now() + c->cfg.matchmaking_time_s;
    if (until > deadline) until = deadline;
    for (;;) {
        refresh(c, 1);
        if (behind(c)) return 1;
        if (visc_now() + 0.1 >= until) return 0;
        nap(0.1);
    }
}

/* Rounds until one succeeds, the peer turns out alone or behind, or the
 * step's deadline passes. */
static round_outcome run_round(visc_collab *c, char *why, size_t cap) {
    double deadline = visc_now() + c->cfg.step_deadline_s;
    round_outcome out = ROUND_FAILED;
    visc_progress_pause(c->tracker);
    for (int tries = 1;; tries++) {
        /* a fresh look: alone (a swarm of one steps by itself), or behind
         * (the swarm stepped without this peer: a late group of the same
         * round would split the swarm). The first try goes by the last
         * read: a DHT read can take a second when a dead peer is still in
         * the routing tables, and the round is what is late then. */
        if (c->view.peers <= 1 || tries > 1) refresh(c, 1);
        if (behind(c)) {
            out = ROUND_BEHIND;
            break;
        }
        /* A swarm of one steps by itself, but only once it has had time to
         * see its peers (and never in lockstep: there every step waits for
         * the whole group). */
        if (c->view.peers <= 1 && c->view.distrusted == 0 && !c->cfg.lockstep && view_settled(c)) {
            out = ROUND_ALONE;
            break;
        }
        out = attempt(c, why, cap);
        if (out == ROUND_DONE) break;
        if (out == ROUND_MISSED && await_step_past(c, deadline)) {
            fprintf(stderr,
                    "visc: swarm: round %d for step %" PRIu64 " missed: %s; the swarm stepped "
                    "on: catching up\n",
                    tries, c->epoch, why);
            out = ROUND_BEHIND;
            break;
        }
        double left = deadline - visc_now();
        fprintf(stderr, "visc: swarm: round %d for step %" PRIu64 " failed: %s%s\n", tries,
                c->epoch, why, left > 0 ? "; retrying" : "");
        if (left <= 0) break;
    }
    visc_progress_resume(c->tracker);
    return out;
}

/* Live peers behind this peer's step: one step short, they may still step
 * to it in a group of their own; further behind, they can only catch up by
 * downloading, and need a donor that has not exited yet (the study's
 * parameter-averaging run ended with a peer two steps short, every donor
 * gone: docs/swarm_study.md). A killed peer's record lives on until it
 * expires but stops changing: one whose measurement time is older than a
 * step's retries plus SETTLE_STALE_S (a batch and a download) is not
 * waited for. */
static int settle_pending(const visc_collab *c) {
    uint64_t now_ms = visc_unix_ms();
    uint64_t fresh_ms = (uint64_t)((SETTLE_STALE_S + c->cfg.step_deadline_s) * 1000);
    int pending = 0;
    for (int i = 0; i < c->n_recs; i++) {
        const visc_progress_record *r = &c->recs[i];
        if (r->epoch < c->epoch && r->time_ms + fresh_ms >= now_ms) pending++;
    }
    return pending;
}

/* After the run's last step, before the trainer saves: wait until every
 * live peer has reached this step, taking the majority's state whenever
 * this peer's differs (groups that stepped apart), so that the swarm ends
 * with one model. Peers that are late may still step in a group of their
 * own, and outvote this one: hence waiting for them, not just for the
 * records at hand. Bounded by the averaging timeout. */
static void settle(visc_collab *c) {
    double end = visc_now() + c->cfg.averaging_timeout_s;
    uint8_t winner[32];
    for (;;) {
        refresh(c, 1);
        if (diverged(c, winner)) take_winner(c, winner);
        int pending = settle_pending(c);
        if (pending == 0) return;
        if (visc_now() >= end) {
            fprintf(stderr,
                    "visc: swarm: ending at step %" PRIu64 " while %d peer%s still behind "
                    "(waited %.0f s)\n",
                    c->epoch, pending, pending == 1 ? " is" : "s are", c->cfg.averaging_timeout_s);
            return;
        }
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* After a step of the swarm (or alone): the new epoch, its state, its
 * record. carried: samples already accumulated for the new epoch (delayed
 * updates: the batches computed while the step's round ran). */
static int advance(visc_collab *c, uint64_t carried) {
    c->epoch++;
    c->took_state = 0;
    c->stats.epoch = c->epoch;
    c->samples = carried;
    c->a->state->step = (int64_t)c->epoch;
    visc_progress_set_epoch(c->tracker, c->epoch);
    if (carried) visc_progress_carry_samples(c->tracker, carried);
    if (snapshot(c, NULL, NULL)) return -1;
    refresh(c, 0); /* publishes the new epoch (a failed put is retried at the next) */
    if (c->a->max_steps > 0 && (int64_t)c->epoch >= c->a->max_steps) settle(c);
    return 0;
}

/* ---- auxiliary peers ---- */

/* The swarm is gone: every record stopped changing (the settle rule). */
static int swarm_gone(const visc_collab *c) {
    uint64_t now_ms = visc_unix_ms();
    uint64_t fresh_ms = (uint64_t)((SETTLE_STALE_S + c->cfg.step_deadline_s) * 1000);
    for (int i = 0; i < c->n_recs; i++)
        if (c->recs[i].time_ms + fresh_ms >= now_ms) return 0;
    return 1;
}

/* One round of an auxiliary: matchmaking for `epoch` with the majority's
 * schema, then its share of the reducing with weight 0. 1 done, 0 not. */
static int auxiliary_round(visc_collab *c, uint64_t epoch, const uint8_t state[32]) {
    /* the group the training peers wait for: they, the other auxiliaries
     * and this one */
    group_sizes sizes = group_sizes_of(c, epoch, 1);
    visc_matchmaking_config mc = {.round = epoch,
                                  .target_group_size = sizes.target,
                                  .expected_group_size = sizes.expected,
                                  .min_group_size = c->cfg.min_group_size,
                                  .matchmaking_time_s = c->cfg.matchmaking_time_s,
                                  .auxiliary = 1};
    if (c->cfg.mode == VISC_COLLAB_GRADIENTS) schema_of_state(c, state, mc.schema_hash);
    else memcpy(mc.schema_hash, c->layout.schema, 32);
    visc_group g;
    double t0 = visc_now();
    c->stats.rounds++;
    if (visc_matchmake(c->cfg.node, &mc, &g) != 0) {
        if (c->cfg.verbose)
            fprintf(stderr, "visc: swarm: auxiliary: step %" PRIu64 ": %s\n", epoch,
                    visc_last_error());
        c->stats.rounds_failed++;
        c->stats.averaging_seconds += visc_now() - t0;
        return 0;
    }
    visc_allreduce_config ac;
    round_config(c, mc.schema_hash, &ac);
    visc_allreduce_report rep;
    int rc = visc_allreduce(c->cfg.node, &g, &ac, c->vec, c->n_vec, 0, NULL, &rep);
    c->stats.bytes_sent += rep.bytes_sent;
    c->stats.bytes_received += rep.bytes_received;
    c->stats.averaging_seconds += visc_now() - t0;
    if (rep.banned) ban_members(c, &g, &rep, epoch);
    int training = 0;
    for (int i = 0; i < g.size; i++) training += !g.members[i].auxiliary;
    size_t shard = rep.shard_begin[g.self + 1] - rep.shard_begin[g.self];
    fprintf(stderr,
            "visc: swarm: auxiliary: step %" PRIu64 ": reduced %zu of its %zu values (of %zu) "
            "for a group of %d (%d training) in %.2f s%s%s\n",
            epoch, rep.values_reduced, shard, c->n_vec, g.size, training, rep.seconds,
            rep.what_failed[0] ? "; failed: " : "", rep.what_failed);
    if (rc < 0 || rep.averaged_fraction < 1.0) {
        c->stats.rounds_partial += rc >= 0;
        c->stats.rounds_failed += rc < 0;
        return 0;
    }
    return 1;
}

/* The auxiliary's whole run (collab.h): follow the swarm's step, help
 * each step's round once, until --max-steps or the swarm is gone. It
 * publishes an auxiliary record (progress.h: in no count but the view's
 * auxiliaries, so free-running peers wait for it in their groups) and
 * serves no state. */
static int run_auxiliary(visc_collab *c) {
    visc_progress_config pc = {.dht = visc_swarm_node_dht(c->cfg.node),
                               .self_key = visc_swarm_node_auth(c->cfg.node)->self.public_key,
                               .target_batch_size = c->cfg.target_batch_size,
                               .corroborated_epochs = 1,
                               .background = 1};
    c->tracker = visc_progress_tracker_new(&pc);
    if (!c->tracker) return -1;
    visc_progress_set_local(c->tracker, VISC_ROLE_AUX, "");
    memset(c->vec, 0, c->n_vec * sizeof *c->vec); /* only its shard's output lands here */
    uint64_t last = c->a->max_steps > 0 ? (uint64_t)c->a->max_steps : UINT64_MAX;
    uint64_t epoch = 0, helped = 0;
    int seen = 0;
    fprintf(stderr, "visc: swarm: auxiliary peer: reducing for the swarm (%zu values a round)\n",
            c->n_vec);
    c->alone_after = visc_now() + 2 * c->cfg.matchmaking_time_s;
    while (epoch < last) {
        refresh(c, 1);
        seen |= c->n_recs > 0;
        if (seen && swarm_gone(c)) {
            fprintf(stderr,
                    "visc: swarm: auxiliary: the swarm is gone (no record changed for "
                    "%.0f s)\n",
                    SETTLE_STALE_S + c->cfg.step_deadline_s);
            break;
        }
        if (c->view.epoch > epoch) { /* follow the swarm */
            epoch = c->view.epoch;
            visc_progress_set_epoch(c->tracker, epoch);
        }
        uint8_t state[32];
        if (majority_hash(c, epoch, state) == 0 || !(c->cfg.lockstep || c->view.ready)) {
            nap(0.1);
            continue;
        }
        if (auxiliary_round(c, epoch, state)) {
            helped++;
            epoch++; /* its members step now */
            c->stats.epoch = epoch;
            visc_progress_set_epoch(c->tracker, epoch);
        }
    }
    c->stats.epoch = epoch;
    fprintf(stderr, "visc: swarm: auxiliary: helped %" PRIu64 " steps up to step %" PRIu64 "\n",
            helped, epoch);
    return 0;
}

/* ---- delayed updates (--delay-updates) ----
 * The worker thread runs one round at a time: what the training thread
 * packed into bg_vec, for the round and schema it chose, with the step's
 * retries. The training thread hands a round over after a step and takes
 * the result back at the next step (it waits only if the round is still
 * running), so a round's network time overlaps the next batches' compute. */

static void *delay_main(void *arg) {
    visc_collab *c = arg;
    pthread_mutex_lock(&c->dw.mu);
    for (;;) {
        while (!c->dw.job && !c->dw.quit) pthread_cond_wait(&c->dw.cv, &c->dw.mu);
        if (!c->dw.job) break; /* quit, nothing pending */
        uint64_t round = c->dw.round;
        group_sizes sizes = c->dw.sizes;
        uint8_t schema[32];
        memcpy(schema, c->dw.schema, 32);
        double weight = c->dw.weight;
        pthread_mutex_unlock(&c->dw.mu);
        char why[640] = "";
        double deadline = visc_now() + c->cfg.step_deadline_s;
        round_outcome out;
        for (int tries = 1;; tries++) {
            out = attempt_on(c, round, sizes, schema, c->bg_vec, weight, c->cfg.matchmaking_time_s,
                             why, sizeof why);
            if (out == ROUND_DONE) break;
            if (out == ROUND_MISSED) {
                /* the group formed without this peer: the training thread
                 * catches up when the records show the swarm past the round
                 * (a round of a step that is over would wait for nobody) */
                fprintf(stderr, "visc: swarm: round %d for step %" PRIu64 " missed: %s\n", tries,
                        round, why);
                out = ROUND_BEHIND;
                break;
            }
            pthread_mutex_lock(&c->dw.mu);
            int abort = c->dw.abort;
            pthread_mutex_unlock(&c->dw.mu);
            if (abort) {
                out = ROUND_BEHIND;
                break;
            }
            double left = deadline - visc_now();
            fprintf(stderr, "visc: swarm: round %d for step %" PRIu64 " failed: %s%s\n", tries,
                    round, why, left > 0 ? "; retrying" : "");
            if (left <= 0) break;
        }
        pthread_mutex_lock(&c->dw.mu);
        c->dw.out = (int)out;
        memcpy(c->dw.why, why, sizeof why);
        c->dw.job = 0;
        c->dw.done = 1;
        pthread_cond_broadcast(&c->dw.cv);
    }
    pthread_mutex_unlock(&c->dw.mu);
    return NULL;
}

/* Hands this peer's accumulated gradient to the worker as the round of
 * the current step (schema: the state this peer holds now). vec keeps
 * what was handed over (the all-reduce overwrites bg_vec). */
static void delay_launch(visc_collab *c) {
    uint8_t schema[32];
    round_schema(c, schema);
    pack(c, c->vec);
    memcpy(c->bg_vec, c->vec, c->n_vec * sizeof(float));
    pthread_mutex_lock(&c->dw.mu);
    c->dw.round = c->epoch;
    c->dw.sizes = group_sizes_of(c, c->epoch, 0);
    memcpy(c->dw.schema, schema, 32);
    c->dw.weight = (double)c->samples;
    c->dw.job = 1;
    c->dw.done = 0;
    c->dw.abort = 0;
    pthread_cond_broadcast(&c->dw.cv);
    pthread_mutex_unlock(&c->dw.mu);
    c->launched_samples = c->samples;
    c->samples = 0; /* the next batches accumulate for the next round */
    c->delay_pending = 1;
}

/* The worker's round has ended (its outcome waits in delay_wait). abort:
 * else ask it to try no more (the swarm stepped past the round: its
 * retries would wait for a group that is gone). */
static int delay_done(visc_collab *c, int abort) {
    pthread_mutex_lock(&c->dw.mu);
    int done = c->dw.done;
    if (!done && abort) c->dw.abort = 1;
    pthread_mutex_unlock(&c->dw.mu);
    return done;
}

/* Waits for the worker's round; its outcome and why. */
static round_outcome delay_wait(visc_collab *c, char *why, size_t cap) {
    pthread_mutex_lock(&c->dw.mu);
    while (!c->dw.done) pthread_cond_wait(&c->dw.cv, &c->dw.mu);
    c->dw.done = 0;
    round_outcome out = (round_outcome)c->dw.out;
    snprintf(why, cap, "%s", c->dw.why);
    pthread_mutex_unlock(&c->dw.mu);
    c->delay_pending = 0;
    return out;
}

/* A step with delayed updates (lockstep): the first batch only hands its
 * round over; every later one applies the previous round's mean gradient
 * (of parameters one step older) and, after the step, hands over its own. */
static int lockstep_delayed_round(visc_collab *c, int64_t *global_step) {
    if (!c->delay_pending) {
        delay_launch(c);
        return 0;
    }
    char why[640];
    round_outcome out = delay_wait(c, why, sizeof why);
    c->stats.samples_overlapped += c->samples;
    if (out != ROUND_DONE) {
        fprintf(stderr,
                "visc: swarm: step %" PRIu64 " skipped: %s (--delay-updates: this batch's "
                "gradient is averaged for the next try)\n",
                c->epoch, why);
        c->stats.steps_skipped++;
        delay_launch(c);
        return 0;
    }
    unpack(c, c->bg_vec);
    *global_step = (int64_t)c->epoch;
    c->publish_epoch = 1;
    return 1;
}

/* --on-failure local (gradient mode): the step with this peer's own
 * gradient, logged and counted as a divergence. */
static int step_local(visc_collab *c, const float *grad, const char *why, int64_t *global_step) {
    fprintf(stderr, "visc: swarm: step %" PRIu64 " taken alone: %s (--on-failure local)\n",
            c->epoch, why);
    c->stats.steps_local++;
    memcpy(c->a->model->grads, grad, c->layout.n_params * sizeof(float));
    *global_step = (int64_t)c->epoch;
    c->publish_epoch = 1;
    return 1;
}

/* A peer that took the swarm's state during this step declares for its
 * round after one batch when the swarm is due within the matchmaking
 * time, not once the swarm's count reaches the target: it arrives in the
 * middle of a step, the others count it only after their next read of
 * the records, and when they reach the target they start their group
 * before its declaration is there. Declared first, it is in every view
 * (matchmaking deals it in and its leader waits for it). Steps shorter
 * than the matchmaking time made a newcomer miss every round and take the
 * state after each (e2e_swarm_churn.sh, a CI run: 7 downloads, none of 6
 * rounds averaged). */
static int joining_late(const visc_collab *c) {
    return c->took_state && c->samples > 0 && c->view.epoch == c->epoch &&
           c->view.eta_s < c->cfg.matchmaking_time_s;
}

/* This peer's record as it is: its step and its state's hash. */
static void publish_own(visc_collab *c) {
    uint8_t mine[32];
    current_hash(c, mine);
    visc_progress_set_epoch(c->tracker, c->epoch);
    visc_progress_set_state_hash(c->tracker, mine);
}

/* Whether a free-running peer that is behind the swarm joins the swarm's
 * round before it takes the state (newcomer_round): the swarm is due
 * before two of this peer's batches would be done (a batch after the
 * download would end after the group formed, or be all it adds; with
 * steps longer than that, it takes the state and joins with its batches).
 * Lockstep groups wait for every peer anyway. */
static int newcomer_due(const visc_collab *c) {
    return !c->cfg.lockstep && c->view.peers >= 2 && visc_now() >= c->next_download &&
           c->view.eta_s < 2 * c->batch_s + c->cfg.matchmaking_time_s;
}

/* A peer behind the swarm joins the swarm's round first, then takes the
 * state. The round is of the state most records at the swarm's step
 * publish (its hash makes the round's schema, as an auxiliary's); this
 * peer joins with weight 0 (matchmaking and all-reduce role newcomer: it
 * reduces a shard and takes the group's mean gradient), downloads that
 * state from the records read before the round (its donors, a step on by
 * then, still serve it), and steps with the mean like every member. Its
 * declaration is out while the others still compute the step, and a
 * leader waits for every peer its view of the declarations deals to it:
 * downloading first, then declaring, it came after the group had formed,
 * step after step, where a step's compute takes less than a record's
 * spreading plus a download (e2e_swarm_churn.sh, CI: a newcomer took the
 * state 6 to 8 times and averaged in at most 1 of 8 steps). It matchmakes
 * for the time until the swarm is due plus the matchmaking time. 1
 * stepped, 0 not (it took the state some other way, or will retry; one
 * line says why). */
static int newcomer_round(visc_collab *c, int64_t *global_step) {
    /* Its record says the swarm's step, with no state yet (no donor, no
     * vote on the step's state): the leaders count it among the peers at
     * the step and wait for it. Declaring alone, it was in no leader's
     * view in time: a new round's declarations take up to a second to
     * spread while killed peers linger in the DHT's routing tables, the
     * progress records (a key every peer reads all along) spread in a few
     * hundredths. The refresh publishes it (the record changed), and
     * reads the records again only when their period has passed: the
     * caller's read found the swarm ahead (at most a period ago, half a
     * second with the swarm due so soon), and a read waits up to a second
     * for the killed peers the DHT still lists, about one read in three
     * after a kill (e2e_swarm_churn.sh), while the step's group forms. */
    static const uint8_t no_state[32];
    visc_progress_set_epoch(c->tracker, c->view.epoch);
    visc_progress_set_state_hash(c->tracker, no_state);
    refresh(c, 0);
    const uint64_t epoch = c->view.epoch;
    uint8_t state[32], schema[32], got[32];
    if (epoch <= c->epoch || majority_hash(c, epoch, state) < 2) { /* no state two vouch for */
        publish_own(c);
        catch_up(c);
        return 0;
    }
    visc_progress_set_epoch(c->tracker, epoch); /* the swarm may have stepped meanwhile */
    schema_of_state(c, state, schema);
    double wait = c->cfg.matchmaking_time_s + (isfinite(c->view.eta_s) ? c->view.eta_s : 0);
    char why[640] = "";
    visc_progress_pause(c->tracker);
    round_outcome out =
        attempt_on(c, epoch, group_sizes_of(c, epoch, 1), schema, c->vec, 0, wait, why, sizeof why);
    visc_progress_resume(c->tracker);
    if (out != ROUND_DONE) {
        fprintf(stderr,
                "visc: swarm: at step %" PRIu64 " behind the swarm's %" PRIu64
                ", joining its round failed: %s; taking the state\n",
                c->epoch, epoch, why);
        publish_own(c);
        catch_up(c);
        return 0;
    }
    if (download_state(c, epoch) != 0) {
        fprintf(stderr,
                "visc: swarm: joined the round of step %" PRIu64 ", but the state download "
                "failed: %s (retrying in %.0f s)\n",
                epoch, visc_last_error(), DOWNLOAD_BACKOFF_S);
        c->next_download = visc_now() + DOWNLOAD_BACKOFF_S;
        publish_own(c);
        return 0;
    }
    current_hash(c, got);
    if (c->epoch != epoch || memcmp(got, state, 32) != 0) return 0; /* a later state came */
    if (c->cfg.verbose)
        fprintf(stderr, "visc: swarm: step %" PRIu64 ": joined the round, then took the state\n",
                epoch);
    c->stats.newcomer_rounds++;
    unpack(c, c->vec);
    *global_step = (int64_t)epoch;
    c->publish_epoch = 1;
    return 1;
}

/* What free_running_ready found. */
typedef enum { NOT_READY, READY, READY_AS_NEWCOMER } readiness;

/* After a free-running peer's batch: READY when the swarm is ready for
 * this peer's step. First the records: a peer that fell behind joins the
 * swarm's round and takes the state (READY_AS_NEWCOMER: newcomer_due) or
 * just catches up, and one whose state lost to the majority's at its step
 * takes theirs (then NOT_READY: the accumulated gradient was of a state
 * that is gone). */
static readiness free_running_ready(visc_collab *c) {
    refresh(c, 0);
    if (behind(c)) {
        if (newcomer_due(c)) return READY_AS_NEWCOMER;
        catch_up(c);
        return NOT_READY;
    }
    uint8_t winner[32];
    if (diverged(c, winner)) {
        take_winner(c, winner);
        return NOT_READY;
    }
    return c->view.ready || joining_late(c) ? READY : NOT_READY;
}

/* A round of the worker failed (free-running): the gradient it carried
 * (kept in vec) joins the one accumulated since, weighted by samples. */
static void delay_take_back(visc_collab *c) {
    uint64_t s = c->samples, l = c->launched_samples;
    size_t P = (size_t)c->layout.n_params;
    if (s == 0) memcpy(c->acc, c->vec, P * sizeof(float));
    else {
        float w = (float)((double)l / (double)(s + l));
        for (size_t i = 0; i < P; i++) c->acc[i] += w * (c->vec[i] - c->acc[i]);
    }
    c->samples = s + l;
    c->launched_samples = 0;
}

/* Delayed updates, free-running. When the swarm reaches the target, the
 * accumulated gradient goes to the worker as this step's round and the
 * peer trains on at the same parameters, accumulating the next step's
 * gradient (and reporting its samples toward the next step). The first
 * batch that ends after the round applies the round's mean gradient, and
 * the batches computed meanwhile stay accumulated for the next step
 * (advance carries them). While a round is in flight the records are
 * still read: when two peers are past the round's step, the worker tries
 * no more, and the peer catches up (the gradients of the old state are
 * dropped). A failed round follows --on-failure: skip (its gradient is
 * accumulated again) or step with it alone. */
static int free_delayed_round(visc_collab *c, int64_t *global_step) {
    if (c->delay_pending) {
        refresh(c, 0);
        if (!delay_done(c, behind(c))) return 0;
        char why[640];
        round_outcome out = delay_wait(c, why, sizeof why);
        c->stats.samples_overlapped += c->samples;
        if (out == ROUND_BEHIND) {
            c->launched_samples = 0;
            catch_up(c);
            return 0;
        }
        if (out == ROUND_DONE) {
            unpack(c, c->bg_vec);
            c->launched_samples = 0;
            *global_step = (int64_t)c->epoch;
            c->publish_epoch = c->carry = 1;
            return 1;
        }
        if (c->cfg.on_failure == VISC_COLLAB_STEP_LOCAL) {
            c->launched_samples = 0;
            c->carry = 1;
            return step_local(c, c->vec, why, global_step);
        }
        fprintf(stderr,
                "visc: swarm: step %" PRIu64
                " skipped: %s (--on-failure skip: the gradient of %" PRIu64
                " samples is kept for the next round)\n",
                c->epoch, why, c->launched_samples + c->samples);
        c->stats.steps_skipped++;
        delay_take_back(c);
    }
    readiness ready = free_running_ready(c);
    if (ready == READY_AS_NEWCOMER) return newcomer_round(c, global_step);
    if (ready == NOT_READY) return 0;
    if (c->view.peers <= 1 && c->view.distrusted == 0 && view_settled(c)) {
        refresh(c, 1); /* a fresh look before stepping alone, as run_round takes */
        if (c->view.peers <= 1 && c->view.distrusted == 0) {
            memcpy(c->a->model->grads, c->acc, c->layout.n_params * sizeof(float));
            *global_step = (int64_t)c->epoch;
            c->publish_epoch = 1;
            return 1;
        }
    }
    delay_launch(c);
    return 0;
}

static int delay_start(visc_collab *c) {
    c->bg_vec = visc_malloc(c->n_vec * sizeof(float), "swarm delayed-round vector");
    if (!c->bg_vec) return -1;
    pthread_mutex_init(&c->dw.mu, NULL);
    pthread_cond_init(&c->dw.cv, NULL);
    if (pthread_create(&c->dw.th, NULL, delay_main, c) != 0) {
        pthread_cond_destroy(&c->dw.cv);
        pthread_mutex_destroy(&c->dw.mu);
        return visc_set_error("swarm: cannot start the delayed-update thread");
    }
    c->dw.running = 1;
    return 0;
}

/* Ends the worker after its round (a round handed over at the end is
 * still reduced: the other members count on this peer). */
static void delay_stop(visc_collab *c) {
    if (!c->dw.running) return;
    pthread_mutex_lock(&c->dw.mu);
    c->dw.quit = 1;
    pthread_cond_broadcast(&c->dw.cv);
    pthread_mutex_unlock(&c->dw.mu);
    pthread_join(c->dw.th, NULL);
    pthread_cond_destroy(&c->dw.cv);
    pthread_mutex_destroy(&c->dw.mu);
    c->dw.running = 0;
}

/* ---- the hooks ---- */

static int gradient_round(visc_collab *c, int64_t *global_step) {
    char why[640] = "";
    round_outcome out = run_round(c, why, sizeof why);
    if (out == ROUND_BEHIND) {
        /* the round went on without this peer (it came late, or its group
         * formed without it): the swarm's next one, at once when it is due */
        if (newcomer_due(c)) return newcomer_round(c, global_step);
        catch_up(c);
        return 0;
    }
    if (out == ROUND_DONE || out == ROUND_ALONE) {
        if (out == ROUND_ALONE)
            memcpy(c->a->model->grads, c->acc, c->layout.n_params * sizeof(float));
        else unpack(c, c->vec);
        *global_step = (int64_t)c->epoch;
        c->publish_epoch = 1;
        return 1;
    }
    if (c->cfg.on_failure == VISC_COLLAB_STEP_LOCAL) return step_local(c, c->acc, why, global_step);
    fprintf(stderr,
            "visc: swarm: step %" PRIu64 " skipped: %s (--on-failure skip: the gradient of %" PRIu64
            " samples is kept for the next round)\n",
            c->epoch, why, c->samples);
    c->stats.steps_skipped++;
    return 0;
}

/* The trainer hands back control after a batch: its time (from the last
 * hand-over, so rounds and downloads do not count) joins the running
 * mean that newcomer_due weighs. */
static void measure_batch(visc_collab *c) {
    double now = visc_now();
    if (c->hooks_left > 0) {
        double dt = now - c->hooks_left;
        c->batch_s = c->batch_s > 0 ? 0.8 * c->batch_s + 0.2 * dt : dt;
    }
}

static int batch_done(visc_collab *c, int n, float loss, int64_t *global_step) {
    if (n <= 0) return 0;
    *global_step = (int64_t)c->epoch;
    visc_progress_add_samples(c->tracker, (uint64_t)n, loss);
    if (c->cfg.mode == VISC_COLLAB_PARAMETERS) {
        c->samples += (uint64_t)n;
        return 1; /* a local step with the local gradient, at the global step's lr
                   */
    }
    /* acc: the running mean, so that one batch alone is its gradient exactly */
    const float *g = c->a->model->grads;
    float w = (float)((double)n / (double)(c->samples + (uint64_t)n));
    size_t P = (size_t)c->layout.n_params;
    if (c->samples == 0) memcpy(c->acc, g, P * sizeof *g);
    else
        for (size_t i = 0; i < P; i++) c->acc[i] += w * (g[i] - c->acc[i]);
    c->samples += (uint64_t)n;
    if (c->cfg.delay_updates)
        return c->cfg.lockstep ? lockstep_delayed_round(c, global_step)
                               : free_delayed_round(c, global_step);
    if (!c->cfg.lockstep) {
        readiness ready = free_running_ready(c);
        if (ready == READY_AS_NEWCOMER) return newcomer_round(c, global_step);
        if (ready == NOT_READY) return 0;
    }
    return gradient_round(c, global_step);
}

static int after_backward(void *ctx, int n, float loss, int64_t *global_step) {
    visc_collab *c = ctx;
    measure_batch(c);
    int rc = batch_done(c, n, loss, global_step);
    c->hooks_left = visc_now();
    return rc;
}

static int parameter_round(visc_collab *c) {
    refresh(c, 0);
    if (behind(c)) {
        catch_up(c);
        return 0;
    }
    if (!(c->cfg.lockstep || c->view.ready) || c->samples == 0) return 0;
    char why[640] = "";
    round_outcome out = run_round(c, why, sizeof why);
    if (out == ROUND_BEHIND) {
        catch_up(c);
        return 0;
    }
    if (out == ROUND_DONE) unpack(c, c->vec);
    if (out == ROUND_FAILED) {
        if (c->cfg.on_failure == VISC_COLLAB_SKIP) {
            fprintf(stderr,
                    "visc: swarm: step %" PRIu64 " skipped: %s (--on-failure skip: "
                    "parameters stay local until the next round)\n",
                    c->epoch, why);
            c->stats.steps_skipped++;
            return 0;
        }
        fprintf(stderr, "visc: swarm: step %" PRIu64 " taken alone: %s (--on-failure local)\n",
                c->epoch, why);
        c->stats.steps_local++;
    }
    return advance(c, 0);
}

static int step_done(visc_collab *c) {
    if (c->cfg.mode == VISC_COLLAB_PARAMETERS) {
        /* local steps do not advance the global step */
        c->a->state->step = (int64_t)c->epoch;
        return parameter_round(c);
    }
    if (!c->publish_epoch) return 0;
    c->publish_epoch = 0;
    /* delayed updates: lockstep, the batch of this step, not yet handed
     * over; free-running (carry), the batches since the round's */
    uint64_t accumulated = c->samples;
    int carry = c->carry;
    c->carry = 0;
    if (advance(c, carry ? accumulated : 0)) return -1;
    if (c->cfg.delay_updates && c->cfg.lockstep &&
        (c->a->max_steps <= 0 || (int64_t)c->epoch < c->a->max_steps)) {
        c->samples = accumulated;
        delay_launch(c);
    }
    return 0;
}

static int after_step(void *ctx) {
    visc_collab *c = ctx;
    int rc = step_done(c);
    c->hooks_left = visc_now();
    return rc;
}

static int should_stop(void *ctx) {
    (void)ctx;
    return 0; /* --max-steps and --epochs bound the run */
}

/* Validates the model against what collab.c assumes, sizes the buffers. */
static int setup_layout(visc_collab *c) {
    visc_train_access *a = c->a;
    if (!a || !a->model || !a->opt || !a->state || !a->model->params.data || !a->model->grads)
        return visc_set_error("swarm: the trainer gave no model, optimizer or state");
    if (a->model->buffers.total && !a->model->buffers.data)
        return visc_set_error("swarm: the model's buffers are not allocated");
    visc_collab_layout *l = &c->layout;
    l->mode = c->cfg.mode;
    l->n_params = a->model->params.total;
    l->n_buffers = a->model->buffers.total;
    l->slots = (uint32_t)a->opt->slots;
    l->ema = c->cfg.mode == VISC_COLLAB_GRADIENTS && a->ema_params != NULL;
    schema_hash(c, l->schema);
    c->state_bytes = visc_collab_state_size(l);
    size_t P = (size_t)l->n_params, B = (size_t)l->n_buffers, S = l->slots;
    c->n_vec = c->cfg.mode == VISC_COLLAB_GRADIENTS ? P + B : P + S * P + B + 1;
    if (c->state_bytes == 0) return visc_set_error("swarm: the model is too large");
    c->vec = visc_malloc(c->n_vec * sizeof(float), "swarm averaging vector");
    if (c->cfg.mode == VISC_COLLAB_GRADIENTS)
        c->acc = visc_calloc(P, sizeof(float), "swarm gradient accumulator");
    c->recs = visc_calloc(MAX_RECORDS, sizeof *c->recs, "progress records");
    if (!c->vec || !c->recs || (c->cfg.mode == VISC_COLLAB_GRADIENTS && !c->acc)) return -1;
    /* a client serves nothing, but its state hash goes into every round's
     * schema too; an auxiliary has no state */
    for (int i = 0; i < SNAPSHOTS && c->cfg.role != VISC_ROLE_AUX; i++)
        if (!(c->snaps[i].blob = visc_malloc(c->state_bytes, "swarm state snapshot"))) return -1;
    return 0;
}

/* At start: the swarm ahead of this peer, or at its step with a state that
 * other peers corroborate and this peer does not hold. */
static int needs_state(visc_collab *c) {
    if (behind(c)) return 1;
    int order[MAX_RECORDS];
    const uint8_t *self = visc_swarm_node_auth(c->cfg.node)->self.public_key;
    int k = visc_state_donor_order(c->recs, c->n_recs, self, 1, 1, order);
    if (k == 0 || c->recs[order[0]].epoch != c->epoch) return 0;
    uint8_t mine[32];
    current_hash(c, mine); /* start() took the snapshot of this state */
    for (int i = 0; i < k; i++)
        if (c->recs[order[i]].epoch == c->epoch &&
            memcmp(c->recs[order[i]].state_hash, mine, 32) == 0)
            return 0;
    return 1;
}

static int start(void *ctx, visc_train_access *a, int64_t *schedule_steps_per_epoch) {
    visc_collab *c = ctx;
    if (c->started) return visc_set_error("swarm: the collaborative optimizer started twice");
    c->started = 1;
    c->a = a;
    if (setup_layout(c)) return -1;
    visc_dht *dht = visc_swarm_node_dht(c->cfg.node);
    if (!dht) return visc_set_error("swarm: collaborative training needs the node's DHT");
    if (c->cfg.role == VISC_ROLE_AUX) return run_auxiliary(c) ? -1 : 1; /* no training */
    if (c->cfg.delay_updates && delay_start(c)) return -1;
    c->epoch = a->state->step > 0 ? (uint64_t)a->state->step : 0;
    c->stats.epoch = c->epoch;
    visc_progress_config pc = {
        .dht = dht,
        .self_key = visc_swarm_node_auth(c->cfg.node)->self.public_key,
        .target_batch_size = c->cfg.target_batch_size,
        .corroborated_epochs = 1,
        .background = 1, /* batches never wait on the DHT */
    };
    c->tracker = visc_progress_tracker_new(&pc);
    if (!c->tracker) return -1;
    int full = c->cfg.role == VISC_ROLE_FULL;
    visc_progress_set_local(c->tracker, c->cfg.role,
                            full ? visc_swarm_node_address(c->cfg.node) : "");
    visc_progress_set_epoch(c->tracker, c->epoch);
    if (snapshot(c, NULL, NULL)) return -1;
    if (full) {
        c->server = visc_state_server_start(c->cfg.node, serve_snapshot, c);
        if (!c->server) return -1;
    }
    if (refresh(c, 1) != 0)
        fprintf(stderr, "visc: swarm: reading the swarm at start: %s\n", visc_last_error());
    if (needs_state(c)) {
        double deadline = visc_now() + c->cfg.averaging_timeout_s;
        for (int i = 0; i < START_DOWNLOAD_TRIES; i++) {
            if (download_state(c, 0) == 0) break;
            fprintf(stderr,
                    "visc: swarm: downloading the swarm's state (at step %" PRIu64 "): %s\n",
                    c->view.epoch, visc_last_error());
            if (visc_now() >= deadline || i + 1 == START_DOWNLOAD_TRIES) {
                fprintf(stderr,
                        "visc: swarm: starting from this peer's own state at step %" PRIu64
                        "; the download is retried during training\n",
                        c->epoch);
                c->next_download = visc_now() + DOWNLOAD_BACKOFF_S;
                break;
            }
            struct timespec ts = {1, 0};
            nanosleep(&ts, NULL);
            refresh(c, 1);
        }
    }
    uint64_t data = c->cfg.dataset_size ? c->cfg.dataset_size
                    : a->train_size > 0 ? (uint64_t)a->train_size
                                        : 0;
    if (data > 0 && c->cfg.target_batch_size > 0)
        *schedule_steps_per_epoch =
            (int64_t)((data + c->cfg.target_batch_size - 1) / c->cfg.target_batch_size);
    c->alone_after = visc_now() + 2 * c->cfg.matchmaking_time_s;
    return 0;
}

static void finish(void *ctx) {
    visc_collab *c = ctx;
    if (c->finished || !c->started) return;
    c->finished = 1;
    delay_stop(c);
    const visc_collab_stats *s = &c->stats;
    fprintf(stderr,
            "visc: swarm: %" PRIu64 " steps, %" PRIu64 " rounds (%" PRIu64 " failed, %" PRIu64
            " partial), %" PRIu64 " skipped, %" PRIu64 " local, %" PRIu64
            " state downloads, %.1f MB sent, %.1f MB received, %.1f s averaging, %" PRIu64
            " members dropped, %" PRIu64 " rounds joined while behind\n",
            s->epoch, s->rounds, s->rounds_failed, s->rounds_partial, s->steps_skipped,
            s->steps_local, s->state_downloads, (double)s->bytes_sent / 1e6,
            (double)s->bytes_received / 1e6, s->averaging_seconds, s->members_dropped,
            s->newcomer_rounds);
    if (c->cfg.delay_updates)
        fprintf(stderr,
                "visc: swarm: --delay-updates: %" PRIu64
                " samples computed while their step's round ran\n",
                s->samples_overlapped);
    if (c->cfg.linger_s > 0 && c->server) {
        /* a peer that is done stays a donor for a while: newcomers can
         * still take the swarm's state from it */
        fprintf(stderr,
                "visc: swarm: done at step %" PRIu64 "; serving the state for %.0f s more "
                "(--swarm-linger)\n",
                c->epoch, c->cfg.linger_s);
        double end = visc_now() + c->cfg.linger_s;
        while (visc_now() < end) {
            visc_swarm_progress_view v;
            visc_progress_refresh(c->tracker, 0, &v, NULL, 0, NULL);
            struct timespec ts = {0, 200 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    visc_state_server_stop(c->server);
    c->server = NULL;
    visc_progress_tracker_free(c->tracker);
    c->tracker = NULL;
}

/* ---- construction ---- */

visc_collab *visc_collab_new(const visc_collab_config *cfg) {
    const visc_collab_config *k = cfg;
    if (!k || !k->node)
        return visc_set_error("swarm: collaborative optimizer without a node"), NULL;
    if (k->role != VISC_ROLE_FULL && k->role != VISC_ROLE_CLIENT && k->role != VISC_ROLE_AUX)
        return visc_set_error("swarm: unknown peer role %d", (int)k->role), NULL;
    if (!k->lockstep && k->target_batch_size == 0)
        return visc_set_error("swarm: a target batch size is needed (or lockstep)"), NULL;
    if (k->target_group_size < 2 || k->min_group_size < 2 ||
        k->min_group_size > k->target_group_size || k->target_group_size > VISC_GROUP_MAX)
        return visc_set_error("swarm: group sizes %d..%d out of range (2..%d)", k->min_group_size,
                              k->target_group_size, VISC_GROUP_MAX),
               NULL;
    if (!(k->matchmaking_time_s > 0) || !(k->averaging_timeout_s > 0) ||
        !(k->step_deadline_s >= 0) || !isfinite(k->step_deadline_s))
        return visc_set_error("swarm: matchmaking, averaging and step times must be positive"),
               NULL;
    if (k->mode != VISC_COLLAB_GRADIENTS && k->mode != VISC_COLLAB_PARAMETERS)
        return visc_set_error("swarm: unknown averaging mode %d", (int)k->mode), NULL;
    if (k->delay_updates && k->mode != VISC_COLLAB_GRADIENTS)
        return visc_set_error("swarm: --delay-updates needs gradient averaging"), NULL;
    if (sodium_init() < 0) return visc_set_error("libsodium failed to initialize"), NULL;
    visc_collab *c = visc_calloc(1, sizeof *c, "collaborative optimizer");
    if (!c) return NULL;
    c->cfg = *k;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->ban_mu, NULL);
    c->hooks = (visc_step_hooks){.ctx = c,
                                 .start = start,
                                 .after_backward = after_backward,
                                 .after_step = after_step,
                                 .should_stop = should_stop,
                                 .finish = finish};
    return c;
}

const visc_step_hooks *visc_collab_hooks(visc_collab *c) { return &c->hooks; }

void visc_collab_get_stats(visc_collab *c, visc_collab_stats *out) { *out = c->stats; }

void visc_collab_free(visc_collab *c) {
    if (!c) return;
    finish(c);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->ban_mu);
    for (int i = 0; i < SNAPSHOTS; i++) free(c->snaps[i].blob);
    free(c->acc);
    free(c->vec);
    free(c->bg_vec);
    free(c->recs);
    free(c);
}

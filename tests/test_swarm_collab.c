/* test_swarm_collab.c: the collaborative optimizer (collab.h) driven
 * through its step hooks as the trainer calls them, without a trainer: each
 * peer is a thread with its own node on 127.0.0.1 (one DHT per test, its
 * own run id) and a small model of flat tables (two parameter tensors, two
 * BatchNorm-like buffers) with a real SGD optimizer. Covers: lockstep
 * gradient averaging (every peer gets the exact sample-weighted mean, and
 * the BatchNorm buffers are averaged with it), lockstep parameter
 * averaging (parameters, optimizer state and step), a peer alone in its swarm
 * (target batch B over two batches = one batch of B), a failed round with
 * policy skip (the gradient is kept and counted into the next round) and
 * with policy local (a counted step with the peer's own gradient), a peer
 * joining late (it downloads the swarm's parameters, optimizer state and
 * step, then averages with the others), a free-running peer that fell a
 * step behind and joins the swarm's round with no gradient before it
 * downloads the state (a newcomer), and the state blob's parser. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/swarm/collab.h"
#include "../src/swarm/record.h"
#include "swarm_join.h"
#include "test.h"
#include "visc/core.h"

static const char secret[] = "collab test secret, 32+ bytes long";

#define N_W 21 /* layer.weight [3, 7] */
#define N_B 7  /* layer.bias */
#define N_BUF 5
#define MAX_PEERS 3

typedef struct {
    visc_identity id;
    visc_swarm_auth auth;
    visc_swarm_node *node;
    visc_model m;
    visc_optimizer opt;
    visc_train_state st;
    visc_train_access a;
    visc_collab *collab;
    const visc_step_hooks *h;
    /* one call's inputs and outputs (thread jobs) */
    int n, rc;
    int64_t step;
} peer;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The model: the same parameters on every peer unless salt != 0. */
static void model_init(peer *p, float salt) {
    visc_model *m = &p->m;
    memset(m, 0, sizeof *m);
    visc_table_init(&m->params);
    visc_table_init(&m->buffers);
    int64_t ws[2] = {3, 7}, bs[1] = {N_B}, rs[1] = {N_BUF};
    visc_table_add(&m->params, "layer.weight", 2, ws, 0);
    visc_table_add(&m->params, "layer.bias", 1, bs, VISC_TENSOR_NO_DECAY | VISC_TENSOR_BIAS);
    visc_table_add(&m->buffers, "bn.running_mean", 1, rs, 0);
    visc_table_add(&m->buffers, "bn.running_var", 1, rs, 0);
    visc_table_alloc(&m->params);
    visc_table_alloc(&m->buffers);
    m->grads = calloc(m->params.total, sizeof(float));
    for (size_t i = 0; i < m->params.total; i++)
        m->params.data[i] = 0.01f * (float)((i * 7) % 13) - 0.05f + salt;
    for (size_t i = 0; i < m->buffers.total; i++) m->buffers.data[i] = 1.0f;
    visc_opt_config oc = visc_opt_defaults(VISC_OPT_SGD); /* momentum 0.9: one state slot */
    visc_optimizer_init(&p->opt, &oc, &m->params);
    memset(&p->st, 0, sizeof p->st);
    p->a = (visc_train_access){.model = m, .opt = &p->opt, .state = &p->st};
}

static void model_free(peer *p) {
    visc_optimizer_free(&p->opt);
    free(p->m.grads);
    visc_table_free(&p->m.params);
    visc_table_free(&p->m.buffers);
}

static int peer_open(peer *p, const char *run, int bootstrap) {
    memset(p, 0, sizeof *p);
    if (visc_identity_generate(&p->id) || visc_swarm_auth_init(&p->auth, run, &p->id) ||
        visc_swarm_auth_set_secret(&p->auth, secret, sizeof secret))
        return -1;
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", bootstrap);
    visc_swarm_node_config c = {.listen = "127.0.0.1:0",
                                .dht_port = 0,
                                .initial_peers = bootstrap ? peers : NULL,
                                .auth = &p->auth,
                                .bandwidth = 1e6};
    p->node = visc_swarm_node_open(&c);
    if (!p->node) {
        fprintf(stderr, "peer_open: %s\n", visc_last_error());
        return -1;
    }
    model_init(p, 0);
    return 0;
}

static void peer_close(peer *p) {
    visc_collab_free(p->collab);
    p->collab = NULL;
    if (p->node) visc_swarm_node_close(p->node);
    p->node = NULL;
    visc_swarm_auth_free(&p->auth);
    model_free(p);
}

/* Opens peers [from, to) of a swarm whose first peer is ps[0], and waits
 * until every DHT node answers and sees the others' records. */
static int swarm_open(peer *ps, int from, int to, const char *run) {
    for (int i = from; i < to; i++) {
        int port = i == 0 ? 0 : visc_dht_port(visc_swarm_node_dht(ps[0].node));
        if (peer_open(&ps[i], run, port)) return -1;
    }
    if (to == 1) return 0; /* nothing to join */
    visc_dht *d[MAX_PEERS];
    for (int i = 0; i < to; i++) d[i] = visc_swarm_node_dht(ps[i].node);
    return swarm_await_joined(d, from, to, 20);
}

static visc_collab_config lockstep_config(peer *p, int group) {
    visc_collab_config c;
    visc_collab_config_default(&c);
    c.node = p->node;
    c.lockstep = 1;
    c.target_group_size = group;
    c.matchmaking_time_s = 3; /* a full group starts at once: this is only a bound */
    c.averaging_timeout_s = 10;
    c.step_deadline_s = 12;
    c.seed = 1;
    return c;
}

static int collab_start(peer *p, const visc_collab_config *c) {
    p->collab = visc_collab_new(c);
    if (!p->collab) return -1;
    p->h = visc_collab_hooks(p->collab);
    int64_t spe = 0;
    return p->h->start(p->h->ctx, &p->a, &spe);
}

/* Deterministic per (peer, step) gradients and buffers. */
static float grad_value(int peer_i, int step, size_t i) {
    return 0.1f * (float)(peer_i + 1) + 0.01f * (float)step - 0.003f * (float)i;
}

static void set_batch(peer *p, int peer_i, int step) {
    for (size_t i = 0; i < p->m.params.total; i++) p->m.grads[i] = grad_value(peer_i, step, i);
    for (size_t i = 0; i < p->m.buffers.total; i++)
        p->m.buffers.data[i] = 1.0f + 0.5f * (float)peer_i + 0.1f * (float)step;
}

/* What the trainer does with one batch: after_backward, then (on a step)
 * the optimizer step, state.step, after_step. */
static void *batch_job(void *arg) {
    peer *p = arg;
    p->step = -1;
    p->rc = p->h->after_backward(p->h->ctx, p->n, 1.0f, &p->step);
    if (p->rc == 1) {
        visc_optimizer_step(&p->opt, p->m.params.data, p->m.grads, 0.1f);
        p->st.step = p->step + 1;
        if (p->h->after_step(p->h->ctx)) p->rc = -1;
    }
    return NULL;
}

static void run_batches(peer *ps, int count) {
    pthread_t th[MAX_PEERS];
    for (int i = 0; i < count; i++) pthread_create(&th[i], NULL, batch_job, &ps[i]);
    for (int i = 0; i < count; i++) pthread_join(th[i], NULL);
}

static visc_collab_stats stats_of(peer *p) {
    visc_collab_stats s;
    visc_collab_get_stats(p->collab, &s);
    return s;
}

TEST(collab_lockstep_weighted_mean_of_gradients_and_buffers) {
    static peer ps[3];
    int ok = swarm_open(ps, 0, 3, "collab-lockstep") == 0;
    CHECK_MSG(ok, "swarm did not come up");
    for (int i = 0; ok && i < 3; i++) {
        visc_collab_config c = lockstep_config(&ps[i], 3);
        ok = collab_start(&ps[i], &c) == 0;
        CHECK_MSG(ok, "start: %s", visc_last_error());
    }
    size_t P = ps[0].m.params.total, B = ps[0].m.buffers.total;
    for (int step = 0; ok && step < 3; step++) {
        for (int i = 0; i < 3; i++) {
            set_batch(&ps[i], i, step);
            ps[i].n = i + 1; /* weights 1, 2, 3 */
        }
        run_batches(ps, 3);
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(ps[i].rc == 1 && ps[i].step == step, "peer %d step %d: rc %d step %lld", i,
                      step, ps[i].rc, (long long)ps[i].step);
            CHECK(ps[i].st.step == step + 1);
        }
        /* the gradient every peer applied: the exact weighted mean */
        for (size_t k = 0; k < P; k++) {
            double want = 0;
            for (int i = 0; i < 3; i++) want += (i + 1) * (double)grad_value(i, step, k);
            want /= 6;
            CHECK_CLOSE(ps[0].m.grads[k], want, 1e-7, 1e-6);
        }
        for (int i = 1; i < 3; i++) {
            CHECK(memcmp(ps[i].m.grads, ps[0].m.grads, P * sizeof(float)) == 0);
            CHECK(memcmp(ps[i].m.buffers.data, ps[0].m.buffers.data, B * sizeof(float)) == 0);
            CHECK(memcmp(ps[i].m.params.data, ps[0].m.params.data, P * sizeof(float)) == 0);
        }
        double want_buf = (1.0 * 1.0 + 2 * 1.5 + 3 * 2.0) / 6 + 0.1 * step;
        CHECK_CLOSE(ps[0].m.buffers.data[0], want_buf, 1e-6, 1e-6);
    }
    for (int i = 0; ok && i < 3; i++) {
        visc_collab_stats s = stats_of(&ps[i]);
        CHECK(s.epoch == 3 && s.rounds == 3 && s.rounds_failed == 0 && s.steps_skipped == 0);
        CHECK(s.bytes_sent > 0 && s.bytes_received > 0);
    }
    for (int i = 0; i < 3; i++) peer_close(&ps[i]);
}

/* Parameter mode: a local step, then (before after_step) a copy of what
 * is averaged. */
typedef struct {
    peer *p;
    float before[64 + N_W + N_B];
} param_job_t;

static void *param_job(void *arg) {
    param_job_t *j = arg;
    peer *p = j->p;
    p->step = -1;
    p->rc = p->h->after_backward(p->h->ctx, p->n, 1.0f, &p->step);
    if (p->rc != 1) return NULL;
    visc_optimizer_step(&p->opt, p->m.params.data, p->m.grads, 0.1f);
    p->st.step = p->step + 1;
    memcpy(j->before, p->m.params.data, p->m.params.total * sizeof(float));
    if (p->h->after_step(p->h->ctx)) p->rc = -1;
    return NULL;
}

TEST(collab_lockstep_parameter_averaging) {
    static peer ps[2];
    int ok = swarm_open(ps, 0, 2, "collab-params") == 0;
    CHECK_MSG(ok, "swarm did not come up");
    for (int i = 0; ok && i < 2; i++) {
        visc_collab_config c = lockstep_config(&ps[i], 2);
        c.mode = VISC_COLLAB_PARAMETERS;
        ok = collab_start(&ps[i], &c) == 0;
        CHECK_MSG(ok, "start: %s", visc_last_error());
    }
    size_t P = ps[0].m.params.total;
    static param_job_t jobs[2];
    for (int step = 0; ok && step < 2; step++) {
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            set_batch(&ps[i], i, step);
            ps[i].n = 1 + 2 * i; /* weights 1 and 3 */
            jobs[i].p = &ps[i];
            pthread_create(&th[i], NULL, param_job, &jobs[i]);
        }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++)
            CHECK(ps[i].rc == 1 && ps[i].step == step && ps[i].st.step == step + 1 &&
                  ps[i].opt.step == step + 1);
        for (size_t k = 0; k < P; k++)
            CHECK_CLOSE(ps[0].m.params.data[k],
                        (1.0 * jobs[0].before[k] + 3.0 * jobs[1].before[k]) / 4, 1e-7, 1e-6);
        CHECK(memcmp(ps[0].m.params.data, ps[1].m.params.data, P * sizeof(float)) == 0);
        CHECK(memcmp(ps[0].opt.state, ps[1].opt.state, P * sizeof(float)) == 0);
        CHECK(memcmp(ps[0].m.buffers.data, ps[1].m.buffers.data,
                     ps[0].m.buffers.total * sizeof(float)) == 0);
    }
    for (int i = 0; ok && i < 2; i++) CHECK(stats_of(&ps[i]).epoch == 2);
    for (int i = 0; i < 2; i++) peer_close(&ps[i]);
}

TEST(collab_alone_target_batch_is_one_big_batch) {
    static peer ps[1];
    int ok = swarm_open(ps, 0, 1, "collab-alone") == 0;
    CHECK_MSG(ok, "swarm did not come up");
    visc_collab_config c = lockstep_config(&ps[0], 2);
    c.lockstep = 0;
    c.matchmaking_time_s = 0.5; /* it looks for peers for twice this, then steps alone */
    c.target_batch_size = 6;
    c.dataset_size = 60;
    ok = ok && (ps[0].collab = visc_collab_new(&c)) != NULL;
    int64_t spe = 0;
    if (ok) {
        ps[0].h = visc_collab_hooks(ps[0].collab);
        CHECK(ps[0].h->start(ps[0].h->ctx, &ps[0].a, &spe) == 0);
        CHECK(spe == 10);
        size_t P = ps[0].m.params.total;
        float *want = malloc(P * sizeof *want);
        for (size_t k = 0; k < P; k++)
            want[k] = (2 * grad_value(0, 0, k) + 4 * grad_value(0, 1, k)) / 6;
        set_batch(&ps[0], 0, 0);
        ps[0].n = 2;
        batch_job(&ps[0]);
        CHECK(ps[0].rc == 0);
        set_batch(&ps[0], 0, 1);
        ps[0].n = 4;
        batch_job(&ps[0]);
        CHECK(ps[0].rc == 1 && ps[0].step == 0 && ps[0].st.step == 1);
        CHECK_ARRAYS("alone", ps[0].m.grads, want, P, 1e-7, 1e-6);
        visc_collab_stats s = stats_of(&ps[0]);
        /* a swarm of one: its step is the swarm's (no skip, no "local" step) */
        CHECK(s.epoch == 1 && s.steps_local == 0 && s.steps_skipped == 0);
        free(want);
    }
    peer_close(&ps[0]);
}

/* A: a round that nobody joins (B is in the swarm, not stepping). */
static void failed_round(peer *ps, visc_collab_on_failure policy, const char *run) {
    int ok = swarm_open(ps, 0, 2, run) == 0;
    CHECK_MSG(ok, "swarm did not come up");
    for (int i = 0; ok && i < 2; i++) {
        visc_collab_config c = lockstep_config(&ps[i], 2);
        c.on_failure = policy;
        c.matchmaking_time_s = 2;          /* the failed attempt waits this long */
        if (i == 0) c.step_deadline_s = 0; /* one attempt, then the policy */
        ok = collab_start(&ps[i], &c) == 0;
        CHECK_MSG(ok, "start: %s", visc_last_error());
    }
    if (!ok) return;
    size_t P = ps[0].m.params.total;
    set_batch(&ps[0], 0, 0);
    ps[0].n = 2;
    float g1[N_W + N_B + 32];
    memcpy(g1, ps[0].m.grads, P * sizeof(float));
    peer *a = &ps[0];
    batch_job(a); /* 2 peers in view: A matchmakes and finds no group */
    visc_collab_stats s = stats_of(a);
    CHECK(s.rounds == 1 && s.rounds_failed == 1);
    if (policy == VISC_COLLAB_STEP_LOCAL) {
        CHECK(a->rc == 1 && a->step == 0 && a->st.step == 1);
        CHECK(memcmp(a->m.grads, g1, P * sizeof(float)) == 0); /* its own gradient */
        CHECK(s.steps_local == 1 && s.steps_skipped == 0 && s.epoch == 1);
        return;
    }
    CHECK(a->rc == 0 && a->st.step == 0);
    CHECK(s.steps_skipped == 1 && s.steps_local == 0 && s.epoch == 0);
    /* the next round: A's kept gradient (2 samples) and its new batch (3)
     * with B's batch (4) */
    set_batch(&ps[0], 0, 1);
    ps[0].n = 3;
    set_batch(&ps[1], 1, 1);
    ps[1].n = 4;
    run_batches(ps, 2);
    CHECK(ps[0].rc == 1 && ps[1].rc == 1 && ps[0].step == 0 && ps[1].step == 0);
    for (size_t k = 0; k < P; k++) {
        double want = (2.0 * g1[k] + 3.0 * grad_value(0, 1, k) + 4.0 * grad_value(1, 1, k)) / 9;
        CHECK_CLOSE(ps[1].m.grads[k], want, 1e-7, 1e-6);
    }
    CHECK(memcmp(ps[0].m.grads, ps[1].m.grads, P * sizeof(float)) == 0);
    CHECK(stats_of(a).epoch == 1 && stats_of(&ps[1]).epoch == 1);
}

TEST(collab_failed_round_skip_keeps_the_gradient) {
    static peer ps[2];
    failed_round(ps, VISC_COLLAB_SKIP, "collab-skip");
    for (int i = 0; i < 2; i++) peer_close(&ps[i]);
}

TEST(collab_failed_round_local_steps_alone_and_counts) {
    static peer ps[2];
    failed_round(ps, VISC_COLLAB_STEP_LOCAL, "collab-local");
    for (int i = 0; i < 2; i++) peer_close(&ps[i]);
}

TEST(collab_late_joiner_downloads_the_state) {
    static peer ps[3];
    int ok = swarm_open(ps, 0, 2, "collab-join") == 0;
    CHECK_MSG(ok, "swarm did not come up");
    for (int i = 0; ok && i < 2; i++) {
        /* a group of 3 when C is there: until then, groups of 2 at the
         * matchmaking deadline */
        visc_collab_config c = lockstep_config(&ps[i], 3);
        c.matchmaking_time_s = 1.5;
        ok = collab_start(&ps[i], &c) == 0;
    }
    for (int step = 0; ok && step < 2; step++) {
        for (int i = 0; i < 2; i++) {
            set_batch(&ps[i], i, step);
            ps[i].n = 2;
        }
        run_batches(ps, 2);
        ok = ps[0].rc == 1 && ps[1].rc == 1;
        CHECK(ok);
    }
    size_t P = ps[0].m.params.total;
    ok = ok && swarm_open(ps, 2, 3, "collab-join") == 0;
    CHECK_MSG(ok, "the third peer did not come up");
    if (ok) {
        peer *c = &ps[2];
        for (size_t k = 0; k < P; k++) c->m.params.data[k] += 1.0f; /* another init */
        visc_collab_config cc = lockstep_config(c, 3);
        CHECK_MSG(collab_start(c, &cc) == 0, "start: %s", visc_last_error());
        CHECK(c->st.step == 2 && c->opt.step == ps[0].opt.step && c->opt.step == 2);
        CHECK(memcmp(c->m.params.data, ps[0].m.params.data, P * sizeof(float)) == 0);
        CHECK(memcmp(c->opt.state, ps[0].opt.state, P * sizeof(float)) == 0);
        CHECK(memcmp(c->m.buffers.data, ps[0].m.buffers.data, c->m.buffers.total * sizeof(float)) ==
              0);
        CHECK(stats_of(c).state_downloads == 1 && stats_of(c).epoch == 2);
        /* and it averages with them at step 2 */
        for (int i = 0; i < 3; i++) {
            set_batch(&ps[i], i, 2);
            ps[i].n = 1;
        }
        run_batches(ps, 3);
        for (int i = 0; i < 3; i++) CHECK(ps[i].rc == 1 && ps[i].step == 2 && ps[i].st.step == 3);
        for (int i = 1; i < 3; i++)
            CHECK(memcmp(ps[i].m.params.data, ps[0].m.params.data, P * sizeof(float)) == 0);
    }
    for (int i = 0; i < 3; i++)
        if (ps[i].node) peer_close(&ps[i]);
}

/* Free-running: batches (the one set_batch put in place, n samples each)
 * until one ends a step (or fails), as a trainer's loop does. */
static void *batches_until_step(void *arg) {
    peer *p = arg;
    for (int tries = 0; tries < 600; tries++) {
        batch_job(p);
        if (p->rc != 0) break;
        sleep_s(0.05);
    }
    return NULL;
}

/* A newcomer: C, a step behind A and B, finds so after a batch, and with
 * the swarm due within its matchmaking time it joins the round of A and B
 * first, with no gradient (weight 0), then downloads the state of that
 * step: it steps with the group's mean gradient, a mean of A's and B's
 * alone, and ends with the same parameters as they do, instead of a step
 * behind again. */
TEST(collab_newcomer_joins_the_round_at_once_and_steps_with_it) {
    static peer ps[3];
    int ok = swarm_open(ps, 0, 3, "collab-newcomer") == 0;
    CHECK_MSG(ok, "swarm did not come up");
    for (int i = 0; ok && i < 3; i++) {
        visc_collab_config c = lockstep_config(&ps[i], 3);
        c.lockstep = 0;
        c.target_batch_size = 8;
        /* A and B wait at most 1 s for C at step 0; C's round waits for them */
        c.matchmaking_time_s = i == 2 ? 10 : 1;
        ok = collab_start(&ps[i], &c) == 0;
        CHECK_MSG(ok, "start: %s", visc_last_error());
    }
    size_t P = ps[0].m.params.total;
    pthread_t th[3];
    if (ok) { /* step 0: A and B, without C */
        for (int i = 0; i < 2; i++) {
            set_batch(&ps[i], i, 0);
            ps[i].n = 1;
            pthread_create(&th[i], NULL, batches_until_step, &ps[i]);
        }
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        ok = ps[0].rc == 1 && ps[1].rc == 1 && ps[0].step == 0 && ps[1].step == 0;
        CHECK(ok);
    }
    if (ok) { /* step 1: C's batches of step 0 find it behind; A and B come later */
        set_batch(&ps[2], 2, 0);
        for (size_t k = 0; k < P; k++) ps[2].m.grads[k] = 0.05f * (float)k; /* another slope */
        ps[2].n = 1;
        pthread_create(&th[2], NULL, batches_until_step, &ps[2]);
        sleep_s(1.5);
        for (int i = 0; i < 2; i++) {
            set_batch(&ps[i], i, 1);
            ps[i].n = 1;
            pthread_create(&th[i], NULL, batches_until_step, &ps[i]);
        }
        for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
        visc_collab_stats s = stats_of(&ps[2]);
        CHECK_MSG(ps[2].rc == 1 && ps[2].step == 1 && ps[2].st.step == 2,
                  "C: rc %d, step %lld (downloads %llu, rounds %llu, failed %llu)", ps[2].rc,
                  (long long)ps[2].step, (unsigned long long)s.state_downloads,
                  (unsigned long long)s.rounds, (unsigned long long)s.rounds_failed);
        CHECK(s.state_downloads == 1 && s.newcomer_rounds == 1 && s.epoch == 2);
        for (int i = 0; i < 2; i++) CHECK(ps[i].rc == 1 && ps[i].step == 1);
        /* A's and B's gradients differ by a constant (0.1 and 0.2 above
         * 0.01 - 0.003 k); C's (0.05 k) has no weight: the mean is
         * 0.01 - 0.003 k plus one constant between 0.1 and 0.2, whatever
         * A's and B's sample counts (any weight of C's would bend it) */
        double lift = ps[2].m.grads[0] - 0.01;
        CHECK_MSG(lift >= 0.1 - 1e-6 && lift <= 0.2 + 1e-6, "C's mean gradient: %g", lift);
        for (size_t k = 0; k < P; k++)
            CHECK_CLOSE(ps[2].m.grads[k], lift + 0.01 - 0.003 * (double)k, 1e-6, 1e-5);
        for (int i = 0; i < 2; i++) {
            CHECK(memcmp(ps[i].m.grads, ps[2].m.grads, P * sizeof(float)) == 0);
            CHECK(memcmp(ps[i].m.params.data, ps[2].m.params.data, P * sizeof(float)) == 0);
        }
    }
    for (int i = 0; i < 3; i++)
        if (ps[i].node) peer_close(&ps[i]);
}

/* The run's last step waits for a live peer one step short (it could
 * still step to the same epoch in a group of its own) until the averaging
 * timeout; a dead one (its record unchanged for long) is not waited for.
 * C is such a peer: it publishes a record at epoch 0, measured age_ms ago,
 * and never steps. */
static void publish_record(peer *p, uint64_t age_ms) {
    visc_progress_record r;
    memset(&r, 0, sizeof r);
    r.time_ms = visc_unix_ms() - age_ms;
    r.loss = NAN;
    uint8_t wire[VISC_PROGRESS_WIRE];
    CHECK(visc_progress_encode(&r, wire) == 0);
    CHECK(visc_dht_put(visc_swarm_node_dht(p->node), "progress", wire, sizeof wire, 60, 5) == 0);
}

static double last_step_seconds(peer *ps, uint64_t c_age_ms, const char *run) {
    int ok = swarm_open(ps, 0, 3, run) == 0;
    CHECK_MSG(ok, "swarm did not come up");
    for (int i = 0; ok && i < 2; i++) {
        visc_collab_config c = lockstep_config(&ps[i], 2);
        c.averaging_timeout_s = 2; /* settle's bound */
        ps[i].a.max_steps = 1;
        ok = collab_start(&ps[i], &c) == 0;
    }
    if (!ok) return -1;
    publish_record(&ps[2], c_age_ms);
    for (int i = 0; i < 2; i++) {
        set_batch(&ps[i], i, 0);
        ps[i].n = 2;
    }
    double t0 = visc_now();
    run_batches(ps, 2);
    double dt = visc_now() - t0;
    CHECK(ps[0].rc == 1 && ps[1].rc == 1 && stats_of(&ps[0]).epoch == 1);
    CHECK(memcmp(ps[0].m.params.data, ps[1].m.params.data, ps[0].m.params.total * 4) == 0);
    return dt;
}

TEST(collab_last_step_waits_for_a_peer_one_step_short) {
    static peer ps[3];
    double dt = last_step_seconds(ps, 0, "collab-settle");
    CHECK_MSG(dt >= 2.0, "the last step took %.2f s: settle did not wait", dt);
    for (int i = 0; i < 3; i++) peer_close(&ps[i]);
}

TEST(collab_last_step_does_not_wait_for_a_dead_peer) {
    static peer ps[3];
    double dt = last_step_seconds(ps, 120000, "collab-settle-dead"); /* step deadline 12 + 20 s */
    CHECK_MSG(dt < 2.0, "the last step took %.2f s", dt);
    for (int i = 0; i < 3; i++) peer_close(&ps[i]);
}

TEST(collab_state_blob_parse) {
    visc_collab_layout l = {.mode = VISC_COLLAB_GRADIENTS,
                            .n_params = 5,
                            .n_buffers = 2,
                            .slots = 1,
                            .ema = 1};
    memset(l.schema, 7, 32);
    size_t n = visc_collab_state_size(&l);
    CHECK(n == VISC_COLLAB_STATE_HEADER + (5 + 2 + 5 + 5 + 2) * 4);
    float p[5] = {1, 2, 3, 4, 5}, b[2] = {6, 7}, o[5] = {8, 9, 10, 11, 12}, ep[5] = {0},
          eb[2] = {13, 14};
    uint8_t *blob = malloc(n + 1);
    visc_collab_state_encode(&l, 9, 4, p, b, o, ep, eb, blob);
    visc_collab_state_view v;
    CHECK(visc_collab_state_parse(blob, n, &l, &v) == 0);
    CHECK(v.step == 9 && v.opt_step == 4);
    float x;
    memcpy(&x, v.buffers + 4, 4);
    CHECK(x == 7);
    memcpy(&x, v.ema_buffers + 4, 4);
    CHECK(x == 14);
    CHECK(visc_collab_state_parse(blob, n - 1, &l, &v) != 0);
    visc_collab_layout other = l;
    other.schema[3] ^= 1;
    CHECK(visc_collab_state_parse(blob, n, &other, &v) != 0);
    other = l;
    other.ema = 0;
    CHECK(visc_collab_state_parse(blob, n, &other, &v) != 0);
    float nan = NAN;
    memcpy(blob + VISC_COLLAB_STATE_HEADER + 4 * 8, &nan, 4);
    CHECK(visc_collab_state_parse(blob, n, &l, &v) != 0);
    CHECK(strstr(visc_last_error(), "not finite") != NULL);
    visc_collab_state_encode(&l, (uint64_t)1 << 60, 4, p, b, o, ep, eb, blob);
    CHECK(visc_collab_state_parse(blob, n, &l, &v) != 0);
    free(blob);
}

TEST(collab_config_errors) {
    visc_collab_config c;
    visc_collab_config_default(&c);
    CHECK(visc_collab_new(&c) == NULL); /* no node */
    CHECK(strstr(visc_last_error(), "node") != NULL);
    static peer p;
    if (peer_open(&p, "collab-config", 0)) return;
    const struct {
        int role, target, group, min_group, mode;
        double mm;
        const char *says;
    } bad[] = {
        {7, 8, 16, 2, 0, 5, "unknown peer role"},
        {VISC_ROLE_FULL, 0, 16, 2, 0, 5, "target batch size"},
        {VISC_ROLE_FULL, 8, 16, 1, 0, 5, "group sizes"},
        {VISC_ROLE_FULL, 8, 2, 3, 0, 5, "group sizes"},
        {VISC_ROLE_FULL, 8, 16, 2, 0, 0, "must be positive"},
        {VISC_ROLE_FULL, 8, 16, 2, 7, 5, "unknown averaging mode"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        visc_collab_config_default(&c);
        c.node = p.node;
        c.role = (visc_peer_role)bad[i].role;
        c.target_batch_size = (uint64_t)bad[i].target;
        c.target_group_size = bad[i].group;
        c.min_group_size = bad[i].min_group;
        c.mode = (visc_collab_mode)bad[i].mode;
        c.matchmaking_time_s = bad[i].mm;
        CHECK(visc_collab_new(&c) == NULL);
        CHECK_MSG(strstr(visc_last_error(), bad[i].says) != NULL, "%zu: %s", i, visc_last_error());
    }
    /* delayed updates: gradient mode only (free-running or lockstep) */
    for (int lockstep = 0; lockstep < 2; lockstep++) {
        visc_collab_config_default(&c);
        c.node = p.node;
        c.target_batch_size = 8;
        c.delay_updates = 1;
        c.lockstep = lockstep;
        c.mode = VISC_COLLAB_PARAMETERS;
        CHECK(visc_collab_new(&c) == NULL);
        CHECK_MSG(strstr(visc_last_error(), "--delay-updates needs gradient averaging") != NULL,
                  "%s", visc_last_error());
        c.mode = VISC_COLLAB_GRADIENTS;
        visc_collab *ok = visc_collab_new(&c);
        CHECK_MSG(ok != NULL, "%s", visc_last_error());
        visc_collab_free(ok);
    }
    peer_close(&p);
}

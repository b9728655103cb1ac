/* test_dist.c: the process group and gradient averaging (include/visc/dist.h)
 * on a fake backend: rank 0 of 2, whose "peer" contributes ones to every
 * sum, whose collectives complete after a few polls (so the communication
 * thread's polling runs), and which can be told to fail or to hang. The
 * real MPI backend is exercised under mpirun by tests/e2e_mpi.sh. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/dist/backend.h"
#include "../src/dist/plugin.h"
#include "test.h"
#include "visc/dist.h"

static int fake_mode; /* 0 works, 1 fails, 2 hangs, 3 init fails */
static int fake_polls, fake_finalized, fake_aborted;

typedef struct {
    int polls_left;
} fake_req;

static int fake_init(int *rank, int *world, char *err, size_t size) {
    if (fake_mode == 3) {
        snprintf(err, size, "fake: no network");
        return -1;
    }
    *rank = 0, *world = 2;
    return 0;
}

static int start(void **req, char *err, size_t size) {
    if (fake_mode == 1) {
        snprintf(err, size, "fake: the peer sent garbage");
        return -1;
    }
    /* a hung collective is never completed nor freed: a static handle */
    static fake_req hung = {.polls_left = 1 << 30};
    if (fake_mode == 2) {
        *req = &hung;
        return 0;
    }
    fake_req *r = malloc(sizeof *r);
    r->polls_left = 3;
    *req = r;
    return 0;
}

/* sum: the peer holds ones; max: the peer holds 2 */
static int fake_iallreduce(void *buf, size_t count, int dtype, int op, void **req, char *err,
                           size_t size) {
    for (size_t i = 0; i < count; i++) {
        if (dtype == VISC_DT_F32) {
            float *x = buf;
            x[i] = op == VISC_OP_MAX ? (x[i] > 2 ? x[i] : 2) : x[i] + 1;
        } else if (dtype == VISC_DT_F64) {
            double *x = buf;
            x[i] = op == VISC_OP_MAX ? (x[i] > 2 ? x[i] : 2) : x[i] + 1;
        } else {
            int64_t *x = buf;
            x[i] = op == VISC_OP_MAX ? (x[i] > 2 ? x[i] : 2) : x[i] + 1;
        }
    }
    return start(req, err, size);
}

/* the peer's contribution is a copy of ours with every byte + 1 */
static int fake_iallgather(const void *send, void *recv, size_t bytes, void **req, char *err,
                           size_t size) {
    memcpy(recv, send, bytes);
    for (size_t i = 0; i < bytes; i++)
        ((unsigned char *)recv)[bytes + i] = ((const unsigned char *)send)[i] + 1;
    return start(req, err, size);
}

static int fake_ibroadcast(void *buf, size_t bytes, int root, void **req, char *err, size_t size) {
    if (root != 0) memset(buf, 7, bytes); /* what the other rank "sent" */
    return start(req, err, size);
}

static int fake_ibarrier(void **req, char *err, size_t size) { return start(req, err, size); }

static int fake_test(void *req, int *done, char *err, size_t size) {
    fake_req *r = req;
    fake_polls++;
    *done = --r->polls_left <= 0;
    if (*done) free(r);
    return 0;
}

static void fake_finalize(void) { fake_finalized++; }
static void fake_abort(int status) { fake_aborted = status; }

static const visc_dist_backend fake = {.abi = VISC_DIST_BACKEND_ABI,
                                       .name = "fake",
                                       .init = fake_init,
                                       .iallreduce = fake_iallreduce,
                                       .iallgather = fake_iallgather,
                                       .ibroadcast = fake_ibroadcast,
                                       .ibarrier = fake_ibarrier,
                                       .test = fake_test,
                                       .finalize = fake_finalize,
                                       .abort = fake_abort};

TEST(collectives_on_a_fake_backend) {
    fake_mode = 0;
    fake_polls = fake_finalized = 0;
    visc_dist *d = visc_dist_open_backend(&fake, 5);
    CHECK(d != NULL);
    if (!d) return;
    CHECK(visc_dist_rank(d) == 0 && visc_dist_world(d) == 2);
    CHECK(strcmp(visc_dist_backend_name(d), "fake") == 0);
    float f[3] = {1, 2, 3};
    double g[2] = {0.5, 4};
    int64_t k[2] = {5, -1};
    CHECK(visc_dist_allreduce(d, f, 3, VISC_DT_F32, VISC_OP_SUM) == 0);
    CHECK(f[0] == 2 && f[2] == 4);
    CHECK(visc_dist_allreduce(d, g, 2, VISC_DT_F64, VISC_OP_MAX) == 0);
    CHECK(g[0] == 2 && g[1] == 4);
    CHECK(visc_dist_allreduce(d, k, 2, VISC_DT_I64, VISC_OP_SUM) == 0);
    CHECK(k[0] == 6 && k[1] == 0);
    unsigned char send[2] = {10, 20}, recv[4];
    CHECK(visc_dist_allgather(d, send, recv, 2) == 0);
    CHECK(recv[0] == 10 && recv[1] == 20 && recv[2] == 11 && recv[3] == 21);
    unsigned char b[2] = {1, 1};
    CHECK(visc_dist_broadcast(d, b, 2, 1) == 0 && b[0] == 7);
    CHECK(visc_dist_broadcast(d, b, 2, 2) == -1); /* no rank 2 */
    CHECK(visc_dist_barrier(d) == 0);
    /* asynchronous: sum then average (scale 1/2 on the thread) */
    float a[4] = {3, 3, 3, 3};
    int64_t t = visc_dist_allreduce_async(d, a, 4, 0.5f);
    CHECK(t >= 0 && visc_dist_wait(d, t) == 0);
    CHECK(a[0] == 2.0f && a[3] == 2.0f);
    CHECK(fake_polls >= 3); /* completion came through polling */
    CHECK(visc_dist_wait_seconds(d) >= 0 && !visc_dist_broken(d));
    visc_dist_close(d);
    CHECK(fake_finalized == 1);
}

TEST(backend_errors_are_one_line_and_break_the_group) {
    fake_mode = 1;
    visc_dist *d = visc_dist_open_backend(&fake, 5);
    CHECK(d != NULL);
    if (!d) return;
    float f[1] = {1};
    CHECK(visc_dist_allreduce(d, f, 1, VISC_DT_F32, VISC_OP_SUM) == -1);
    CHECK(strstr(visc_last_error(), "the peer sent garbage") != NULL);
    CHECK(visc_dist_broken(d));
    fake_mode = 0; /* later calls fail at once, whatever the backend would do */
    CHECK(visc_dist_barrier(d) == -1);
    CHECK(visc_dist_allreduce_async(d, f, 1, 1.0f) == -1);
    /* a broken group is not finalized: not closed here (it would end the
     * process, see close_of_a_broken_group_ends_the_process) */
}

TEST(init_failure_is_an_error) {
    fake_mode = 3;
    CHECK(visc_dist_open_backend(&fake, 5) == NULL);
    CHECK(strstr(visc_last_error(), "no network") != NULL);
    fake_mode = 0;
}

TEST(a_hung_peer_times_out) {
    fake_mode = 2;
    visc_dist *d = visc_dist_open_backend(&fake, 0.3);
    CHECK(d != NULL);
    if (!d) return;
    double t0 = visc_now();
    CHECK(visc_dist_barrier(d) == -1);
    CHECK(visc_now() - t0 < 5);
    CHECK_MSG(strstr(visc_last_error(), "barrier did not complete within 0 s") != NULL, "%s",
              visc_last_error());
    CHECK(visc_dist_broken(d));
    fake_mode = 0;
}

/* Closing a broken group ends the process with status 1 through the
 * backend's abort (the peers are gone or stuck: no finalize). */
TEST(close_of_a_broken_group_ends_the_process) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        fake_mode = 1;
        visc_dist *d = visc_dist_open_backend(&fake, 5);
        float f[1] = {0};
        visc_dist_allreduce(d, f, 1, VISC_DT_F32, VISC_OP_SUM);
        if (!freopen("/dev/null", "w", stderr)) _exit(2); /* its one line is expected */
        visc_dist_close(d);
        _exit(0); /* not reached */
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1);
}

TEST(a_group_of_one_needs_no_backend) {
    visc_dist *d = visc_dist_open("none", 0);
    CHECK(d != NULL && visc_dist_world(d) == 1 && visc_dist_rank(d) == 0);
    float f[2] = {3, 5};
    CHECK(visc_dist_allreduce(d, f, 2, VISC_DT_F32, VISC_OP_SUM) == 0 && f[0] == 3);
    CHECK(visc_dist_wait(d, visc_dist_allreduce_async(d, f, 2, 0.5f)) == 0 && f[1] == 2.5f);
    unsigned char s[2] = {1, 2}, r[2];
    CHECK(visc_dist_allgather(d, s, r, 2) == 0 && r[1] == 2);
    CHECK(visc_dist_barrier(d) == 0);
    CHECK(strcmp(visc_dist_backend_name(d), "none") == 0);
    visc_dist_close(d);
    CHECK(visc_dist_open("nccl", 0) == NULL);
    CHECK(strstr(visc_last_error(), "expected auto, none or mpi") != NULL);
    CHECK(visc_dist_open("mpi", 0) == NULL); /* not launched */
    CHECK(strstr(visc_last_error(), "not started by a launcher") != NULL);
}

TEST(plugin_errors_say_how_to_get_it) {
    CHECK(visc_dist_load_plugin("nonexistent") == NULL);
    CHECK(strstr(visc_last_error(), "libvisc_nonexistent.so") != NULL);
    /* a shared object that is not a backend */
    char dir[] = "/tmp/visc_test_dist_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char link[128];
    snprintf(link, sizeof link, "%s/libvisc_notone.so", dir);
    CHECK(symlink("/lib/x86_64-linux-gnu/libz.so.1", link) == 0);
    setenv("VISC_DIST_PLUGIN_DIR", dir, 1);
    CHECK(visc_dist_load_plugin("notone") == NULL);
    CHECK_MSG(strstr(visc_last_error(), "is not a visc notone backend") != NULL, "%s",
              visc_last_error());
    unsetenv("VISC_DIST_PLUGIN_DIR");
    unlink(link);
    rmdir(dir);
}

TEST(gradients_are_averaged_bucket_by_bucket) {
    fake_mode = 0;
    visc_dist *d = visc_dist_open_backend(&fake, 5);
    CHECK(d != NULL);
    if (!d) return;
    visc_table t;
    visc_table_init(&t);
    int64_t s1[1] = {40}, s2[1] = {24}, s3[1] = {8};
    visc_table_add(&t, "a", 1, s1, 0);
    visc_table_add(&t, "b", 1, s2, 0);
    visc_table_add(&t, "c", 1, s3, 0);
    visc_table_alloc(&t);
    float *g = visc_alloc_aligned(t.total * sizeof(float), "grads");
    /* buckets of >= 100 bytes (25 floats) from the last tensor: {c, b} and {a} */
    visc_grad_sync *gs = visc_grad_sync_new(d, &t, g, 100, NULL);
    CHECK(visc_grad_sync_buckets(gs) == 2);
    for (int step = 0; step < 2; step++) {
        for (size_t i = 0; i < t.total; i++) g[i] = 3.0f;
        visc_grad_sync_begin(gs);
        /* backward order, c twice (counted once), a never reported */
        visc_grad_sync_ready(gs, g + t.entries[2].offset, 8);
        visc_grad_sync_ready(gs, g + t.entries[2].offset, 8);
        visc_grad_sync_ready(gs, g + t.entries[1].offset, 24);
        float outside = 0;
        visc_grad_sync_ready(gs, &outside, 1); /* not a parameter: ignored */
        CHECK(visc_grad_sync_finish(gs) == 0);
        int ok = 1;
        for (int e = 0; e < 3; e++)
            for (size_t i = 0; i < t.entries[e].numel; i++)
                ok &= g[t.entries[e].offset + i] == 2.0f; /* (3 + 1) / 2, once */
        CHECK_MSG(ok, "step %d: every gradient averaged exactly once", step);
    }
    visc_grad_sync *one = visc_grad_sync_new(d, &t, g, 0, NULL);
    CHECK(visc_grad_sync_buckets(one) == 1);
    visc_grad_sync_free(one);
    visc_grad_sync_free(gs);
    visc_free_aligned(g);
    visc_table_free(&t);
    visc_dist_close(d);
}

/* ---- staged all-reduce: memory the host reaches by copies (a GPU's) ---- */
typedef struct {
    float *dev; /* the "device" copy */
    pthread_t caller;
    int fetched, put, on_other_thread, fail_fetch;
} staged_dev;

static int staged_fetch(void *arg, float *host, size_t count) {
    staged_dev *s = arg;
    if (s->fail_fetch) return visc_set_error("the device is gone");
    s->on_other_thread += !pthread_equal(pthread_self(), s->caller);
    memcpy(host, s->dev, count * sizeof(float));
    s->fetched++;
    return 0;
}

static int staged_put(void *arg, float *host, size_t count) {
    staged_dev *s = arg;
    memcpy(s->dev, host, count * sizeof(float));
    s->put++;
    return 0;
}

TEST(staged_allreduce_fetches_reduces_and_puts_back) {
    fake_mode = 0;
    visc_dist *d = visc_dist_open_backend(&fake, 5);
    CHECK(d != NULL);
    if (!d) return;
    float dev[3] = {3, 5, 7}, host[3] = {-1, -1, -1};
    staged_dev s = {.dev = dev, .caller = pthread_self()};
    visc_dist_staging st = {staged_fetch, staged_put, &s};
    int64_t t = visc_dist_allreduce_staged(d, host, 3, 0.5f, st);
    CHECK(t >= 0 && visc_dist_wait(d, t) == 0);
    /* the device's values, plus the peer's ones, halved, back on the device */
    CHECK(dev[0] == 2.0f && dev[1] == 3.0f && dev[2] == 4.0f);
    CHECK(s.fetched == 1 && s.put == 1 && s.on_other_thread == 1);
    /* a fetch that fails fails the collective with its reason, and breaks the group */
    s.fail_fetch = 1;
    t = visc_dist_allreduce_staged(d, host, 3, 0.5f, st);
    CHECK(t >= 0 && visc_dist_wait(d, t) == -1);
    CHECK_MSG(strstr(visc_last_error(), "all-reduce fetching its data: the device is gone") != NULL,
              "%s", visc_last_error());
    CHECK(visc_dist_broken(d) && s.put == 1);
    /* (broken: not closed, see close_of_a_broken_group_ends_the_process) */
    fake_mode = 0;

    /* a group of one: fetched, scaled and put back at once */
    visc_dist *one = visc_dist_open("none", 0);
    float dev1[2] = {4, 8}, host1[2];
    staged_dev s1 = {.dev = dev1, .caller = pthread_self()};
    t = visc_dist_allreduce_staged(one, host1, 2, 0.25f,
                                   (visc_dist_staging){staged_fetch, staged_put, &s1});
    CHECK(t >= 0 && visc_dist_wait(one, t) == 0);
    CHECK(dev1[0] == 1.0f && dev1[1] == 2.0f && s1.fetched == 1 && s1.put == 1);
    s1.fail_fetch = 1;
    CHECK(visc_dist_allreduce_staged(one, host1, 2, 1.0f,
                                     (visc_dist_staging){staged_fetch, staged_put, &s1}) == -1);
    visc_dist_close(one);
}

/* A transport of its own (a GPU's): grad_sync hands it every bucket once
 * per step, in backward's order, and waits for each. */
typedef struct {
    int started, waited;
    float *lo[4];
    size_t count[4];
} counting_transport;

static int64_t counting_start(void *ctx, float *buf, size_t count, float scale) {
    counting_transport *c = ctx;
    for (size_t i = 0; i < count; i++) buf[i] = (buf[i] + 1) * scale;
    c->lo[c->started] = buf;
    c->count[c->started] = count;
    return c->started++;
}

static int counting_wait(void *ctx, int64_t ticket) {
    counting_transport *c = ctx;
    c->waited += ticket >= 0 && ticket < c->started;
    return 0;
}

TEST(gradient_buckets_go_through_the_given_transport) {
    fake_mode = 0;
    visc_dist *d = visc_dist_open_backend(&fake, 5);
    CHECK(d != NULL);
    if (!d) return;
    visc_table t;
    visc_table_init(&t);
    int64_t s1[1] = {40}, s2[1] = {24};
    visc_table_add(&t, "a", 1, s1, 0);
    visc_table_add(&t, "b", 1, s2, 0);
    visc_table_alloc(&t);
    float *g = visc_alloc_aligned(t.total * sizeof(float), "grads");
    for (size_t i = 0; i < t.total; i++) g[i] = 3.0f;
    counting_transport c = {0};
    visc_grad_transport tr = {counting_start, counting_wait, &c};
    visc_grad_sync *gs = visc_grad_sync_new(d, &t, g, 100, &tr);
    CHECK(visc_grad_sync_buckets(gs) == 2);
    visc_grad_sync_begin(gs);
    visc_grad_sync_ready(gs, g + t.entries[1].offset, 24); /* b: its bucket goes at once */
    CHECK(c.started == 1 && c.lo[0] == g + t.entries[1].offset);
    CHECK(visc_grad_sync_finish(gs) == 0); /* a: sent by finish */
    CHECK(c.started == 2 && c.waited == 2 && c.lo[1] == g && c.count[1] >= 40);
    CHECK(g[0] == 2.0f && g[t.entries[1].offset] == 2.0f);
    visc_grad_sync_free(gs);
    visc_free_aligned(g);
    visc_table_free(&t);
    visc_dist_close(d);
}

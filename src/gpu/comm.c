/* comm.c: a model's gradients on the GPU averaged over the ranks: the
 * transport that grad_sync (dist.h) hands its buckets to when the
 * gradients live in device memory.
 *
 * Two ways, chosen once per run (visc_gpu_comm_open):
 *   nccl  the all-reduce runs on the GPUs (NCCL's ring or tree over NVLink,
 *         PCIe or the network), queued behind the kernels that finish each
 *         bucket, and the optimizer's kernels are queued behind it: no host
 *         thread waits for the GPU. NCCL needs every rank on a GPU of its
 *         own; a watchdog thread ends the job when an all-reduce has not
 *         finished within --dist-timeout (a peer died or hangs: NCCL itself
 *         would wait for ever).
 *   host  through host memory over the process group's backend (MPI): the
 *         group's communication thread waits for each bucket's event,
 *         downloads it into a page-locked mirror of the gradients, reduces
 *         it there as the CPU's buckets are, and uploads the result. It
 *         works wherever the group does (ranks sharing a GPU, no NCCL) and
 *         gives the CPU path's arithmetic; the host waits for the last
 *         bucket before the step.
 * `auto` takes NCCL where it can (it loads on every rank and no two ranks
 * share a GPU), the host path elsewhere. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "visc/core.h"
#include "visc/gpu.h"
#ifdef VISC_WITH_CUDA
#include "visc/cuda.h"
#endif

int visc_gpu_broadcast(visc_dist *d, visc_cuda *ctx, void *host, void *dev, size_t bytes) {
    if (dev) visc_gpu_download(ctx, host, dev, bytes);
    if (visc_dist_broadcast(d, host, bytes, 0)) return -1;
    if (dev) visc_gpu_upload(ctx, dev, host, bytes);
    return 0;
}

#ifdef VISC_WITH_CUDA
#define SLOTS 64 /* buckets in flight (the host path); one waits when all are */
#define WATCH 16 /* NCCL joins the watchdog follows at a time */

/* One bucket on its way through host memory. */
typedef struct {
    visc_gpu_comm *c;
    float *dev;
    visc_cuda_event *ready; /* the kernels that finish the bucket */
    int64_t ticket;         /* the group's, -1: free */
} slot;

/* A join the watchdog waits to see done. */
typedef struct {
    visc_cuda_event *done;
    double since;
} watched;

struct visc_gpu_comm {
    visc_cuda *ctx;
    visc_dist *d;
    int nccl;
    float *dev; /* the device gradients [count] */
    size_t count;
    int64_t started; /* buckets started */
    /* host */
    float *host; /* page-locked mirror of dev */
    slot slots[SLOTS];
    float *stage; /* page-locked, the collectives' (visc_gpu_comm_allgather) */
    size_t stage_floats;
    /* nccl */
    int64_t joined; /* buckets the latest join covers */
    watched watch[WATCH];
    int64_t watch_head, watch_tail; /* joins recorded / seen done */
    pthread_t watchdog;
    int watchdog_started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* ---- through host memory ---- */

static int slot_fetch(void *arg, float *host, size_t count) {
    slot *s = arg;
    return visc_cuda_comm_download(s->c->ctx, host, s->dev, count * sizeof(float), s->ready);
}

static int slot_put(void *arg, float *host, size_t count) {
    slot *s = arg;
    return visc_cuda_comm_upload(s->c->ctx, s->dev, host, count * sizeof(float));
}

static int64_t host_start(void *ctx, float *buf, size_t count, float scale) {
    visc_gpu_comm *c = ctx;
    if (buf < c->dev || buf + count > c->dev + c->count)
        return visc_set_error("GPU all-reduce: a bucket outside the model's gradients");
    slot *s = &c->slots[c->started % SLOTS];
    /* a slot is reused once its bucket is through */
    if (s->ticket >= 0 && visc_dist_wait(c->d, s->ticket)) return -1;
    s->dev = buf;
    if (visc_cuda_event_record(c->ctx, s->ready)) return -1;
    visc_dist_staging staging = {slot_fetch, slot_put, s};
    s->ticket = visc_dist_allreduce_staged(c->d, c->host + (buf - c->dev), count, scale, staging);
    c->started++;
    return s->ticket;
}

/* put returned only once the result was on the device, and the kernels
 * that read it are queued after this returns. */
static int host_wait(void *ctx, int64_t ticket) {
    visc_gpu_comm *c = ctx;
    return visc_dist_wait(c->d, ticket);
}

/* ---- NCCL ---- */

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Ends the job: a collective failed or never finished. */
static _Noreturn void give_up(visc_gpu_comm *c, const char *why) {
    fprintf(stderr, "visc: rank %d: %s\n", visc_dist_rank(c->d), why);
    visc_cuda_nccl_abort(c->ctx);
    visc_dist_abort(c->d);
}

/* Follows the joins in order: each must be done within the group's
 * timeout, and NCCL must report no asynchronous error meanwhile. */
static void *watchdog_main(void *arg) {
    visc_gpu_comm *c = arg;
    const double timeout = visc_dist_timeout(c->d);
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        if (c->watch_tail == c->watch_head) {
            const struct timespec until = visc_deadline_after(0.1);
            pthread_cond_timedwait(&c->cv, &c->mu, &until);
            continue;
        }
        watched w = c->watch[c->watch_tail % WATCH];
        pthread_mutex_unlock(&c->mu);
        int done = visc_cuda_event_query(c->ctx, w.done);
        if (done < 0 || visc_cuda_nccl_check(c->ctx)) {
            char why[600];
            snprintf(why, sizeof why, "GPU collective (NCCL) failed: %s", visc_last_error());
            give_up(c, why);
        }
        if (!done && visc_now() - w.since > timeout) {
            char why[300];
            snprintf(why, sizeof why,
                     "GPU collective (NCCL) did not complete within %.0f s: a peer process died "
                     "or hangs (--dist-timeout)",
                     timeout);
            give_up(c, why);
        }
        if (!done) sleep_ms(2);
        pthread_mutex_lock(&c->mu);
        if (done) {
            c->watch_tail++;
            pthread_cond_broadcast(&c->cv);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static int64_t nccl_start(void *ctx, float *buf, size_t count, float scale) {
    visc_gpu_comm *c = ctx;
    if (buf < c->dev || buf + count > c->dev + c->count)
        return visc_set_error("GPU all-reduce: a bucket outside the model's gradients");
    if (visc_cuda_nccl_allreduce(c->ctx, buf, count, scale)) return -1;
    return c->started++;
}

/* The kernels queued from now on wait for every bucket started so far;
 * the watchdog follows that point from before the kernels wait on it.
 * Nothing here waits for the GPU, unless WATCH joins are still running. */
static int nccl_wait(void *ctx, int64_t ticket) {
    visc_gpu_comm *c = ctx;
    if (ticket < c->joined) return 0;
    pthread_mutex_lock(&c->mu);
    while (c->watch_head - c->watch_tail == WATCH) pthread_cond_wait(&c->cv, &c->mu);
    watched *w = &c->watch[c->watch_head % WATCH];
    pthread_mutex_unlock(&c->mu);
    if (visc_cuda_nccl_mark(c->ctx, w->done)) return -1;
    w->since = visc_now();
    pthread_mutex_lock(&c->mu);
    c->watch_head++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (visc_cuda_nccl_join(c->ctx, w->done)) return -1;
    c->joined = c->started;
    return 0;
}

/* ---- choosing ---- */

/* Whether NCCL can serve every rank: it loads on each, and no two ranks
 * share a GPU (NCCL refuses that). *why: the reason it cannot, for this
 * rank's message. -1 when a collective failed. */
static int nccl_possible(visc_gpu_comm *c, int *possible, char *why, size_t whylen) {
    const int world = visc_dist_world(c->d);
    enum { KEY = 160 };
    char key[KEY] = "";
    int64_t unable = 0;
    if (visc_cuda_nccl_load()) {
        snprintf(why, whylen, "%s", visc_last_error());
        unable = 1;
    }
    char host[64] = "", bus[64] = "";
    gethostname(host, sizeof host - 1);
    if (visc_cuda_device_id(c->ctx, bus, sizeof bus)) return -1;
    snprintf(key, sizeof key, "%s/%s", host, bus);
    char *keys = visc_calloc((size_t)world, KEY, "GPU names");
    int rc = visc_dist_allgather(c->d, key, keys, KEY);
    for (int i = 0; rc == 0 && i < world && !unable; i++)
        for (int j = i + 1; j < world && !unable; j++)
            if (!strcmp(keys + (size_t)i * KEY, keys + (size_t)j * KEY)) {
                snprintf(why, whylen, "ranks %d and %d share the GPU %s, which NCCL refuses", i, j,
                         keys + (size_t)i * KEY);
                unable = 1;
            }
    free(keys);
    if (rc) return -1;
    int64_t any = unable;
    if (visc_dist_allreduce(c->d, &any, 1, VISC_DT_I64, VISC_OP_MAX)) return -1;
    if (any && !unable) snprintf(why, whylen, "another rank cannot use NCCL");
    *possible = !any;
    return 0;
}

static int open_nccl(visc_gpu_comm *c) {
    unsigned char id[VISC_NCCL_ID_BYTES] = {0};
    int64_t failed = visc_dist_rank(c->d) == 0 && visc_cuda_nccl_unique_id(id) ? 1 : 0;
    if (visc_dist_allreduce(c->d, &failed, 1, VISC_DT_I64, VISC_OP_MAX)) return -1;
    if (failed)
        return visc_dist_rank(c->d) == 0 ? -1 : visc_set_error("rank 0 could not start NCCL");
    if (visc_dist_broadcast(c->d, id, sizeof id, 0) ||
        visc_cuda_nccl_open(c->ctx, id, visc_dist_world(c->d), visc_dist_rank(c->d)))
        return -1;
    for (int i = 0; i < WATCH; i++)
        if (!(c->watch[i].done = visc_cuda_event_create(c->ctx))) return -1;
    if (pthread_create(&c->watchdog, NULL, watchdog_main, c))
        return visc_set_error("cannot start the GPU all-reduce's watchdog");
    c->watchdog_started = 1;
    return 0;
}

static int open_host(visc_gpu_comm *c) {
    if (visc_cuda_comm_init(c->ctx)) return -1;
    c->host = visc_cuda_host_alloc(c->ctx, c->count * sizeof(float));
    if (!c->host) return -1;
    for (int i = 0; i < SLOTS; i++) {
        c->slots[i] = (slot){.c = c, .ticket = -1};
        if (!(c->slots[i].ready = visc_cuda_event_create(c->ctx))) return -1;
    }
    return 0;
}

visc_gpu_comm *visc_gpu_comm_open(visc_cuda *ctx, visc_dist *d, const char *how, float *grads,
                                  size_t count) {
    if (strcmp(how, "auto") && strcmp(how, "nccl") && strcmp(how, "host")) {
        visc_set_error("--gpu-allreduce: expected auto, nccl or host, got '%s'", how);
        return NULL;
    }
    visc_gpu_comm *c = visc_calloc(1, sizeof *c, "GPU all-reduce");
    c->ctx = ctx;
    c->d = d;
    c->dev = grads;
    c->count = count;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    char why[600] = "";
    int possible = 0;
    if (strcmp(how, "host") && nccl_possible(c, &possible, why, sizeof why)) goto fail;
    if (!strcmp(how, "nccl") && !possible) {
        visc_set_error("--gpu-allreduce nccl: %s", why);
        goto fail;
    }
    c->nccl = possible;
    if (!strcmp(how, "auto") && !possible && visc_dist_rank(d) == 0)
        printf("note: gradients are averaged through host memory: %s\n", why);
    if (c->nccl ? open_nccl(c) : open_host(c)) goto fail;
    return c;
fail:
    visc_gpu_comm_close(c);
    return NULL;
}

const char *visc_gpu_comm_name(const visc_gpu_comm *c) {
    return c->nccl ? "nccl" : "through host memory";
}

visc_grad_transport visc_gpu_comm_transport(visc_gpu_comm *c) {
    if (c->nccl) return (visc_grad_transport){nccl_start, nccl_wait, c};
    return (visc_grad_transport){host_start, host_wait, c};
}

/* ---- collectives of other buffers (NT-Xent's embeddings) ---- */

/* The host path's page-locked staging, grown to at least `floats`. */
static float *staging(visc_gpu_comm *c, size_t floats) {
    if (c->stage_floats >= floats) return c->stage;
    visc_cuda_host_free(c->ctx, c->stage);
    c->stage_floats = 0;
    if (!(c->stage = visc_cuda_host_alloc(c->ctx, floats * sizeof(float)))) return NULL;
    c->stage_floats = floats;
    return c->stage;
}

/* NCCL's collective just queued counts as a bucket: the kernels queued
 * from now on wait for it, under the watchdog. */
static int nccl_queued(visc_gpu_comm *c) { return nccl_wait(c, c->started++); }

int visc_gpu_comm_allgather(visc_gpu_comm *c, float *dst, const float *src, size_t count) {
    const size_t world = (size_t)visc_dist_world(c->d);
    if (c->nccl) return visc_cuda_nccl_allgather(c->ctx, dst, src, count) ? -1 : nccl_queued(c);
    /* [mine | everyone's] */
    float *host = staging(c, count * (1 + world));
    if (!host) return -1;
    if (visc_cuda_download(c->ctx, host, src, count * sizeof(float)) ||
        visc_dist_allgather(c->d, host, host + count, count * sizeof(float)))
        return -1;
    return visc_cuda_upload(c->ctx, dst, host + count, world * count * sizeof(float));
}

int visc_gpu_comm_allreduce(visc_gpu_comm *c, float *buf, size_t count) {
    if (c->nccl) return visc_cuda_nccl_allreduce(c->ctx, buf, count, 1.0f) ? -1 : nccl_queued(c);
    float *host = staging(c, count);
    if (!host) return -1;
    if (visc_cuda_download(c->ctx, host, buf, count * sizeof(float)) ||
        visc_dist_allreduce(c->d, host, count, VISC_DT_F32, VISC_OP_SUM))
        return -1;
    return visc_cuda_upload(c->ctx, buf, host, count * sizeof(float));
}

void visc_gpu_comm_close(visc_gpu_comm *c) {
    if (!c) return;
    if (c->watchdog_started) {
        /* The joins still running first, under the watchdog's clock: the
         * GPU is closed next, and its streams would wait for ever on an
         * all-reduce whose peer is gone (the watchdog ends the job then). */
        pthread_mutex_lock(&c->mu);
        while (c->watch_tail < c->watch_head) pthread_cond_wait(&c->cv, &c->mu);
        c->stop = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->watchdog, NULL);
    }
    /* a bucket still on its way (a step that failed) is through before its
     * slot goes; a broken group runs none of them any more */
    for (int i = 0; i < SLOTS; i++) {
        if (c->slots[i].ticket >= 0 && !visc_dist_broken(c->d))
            visc_dist_wait(c->d, c->slots[i].ticket);
        visc_cuda_event_destroy(c->ctx, c->slots[i].ready);
    }
    for (int i = 0; i < WATCH; i++) visc_cuda_event_destroy(c->ctx, c->watch[i].done);
    visc_cuda_host_free(c->ctx, c->host);
    visc_cuda_host_free(c->ctx, c->stage);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}
#else
/* Nothing is ever on a GPU without the backend. */
visc_gpu_comm *visc_gpu_comm_open(visc_cuda *ctx, visc_dist *d, const char *how, float *grads,
                                  size_t count) {
    (void)ctx, (void)d, (void)how, (void)grads, (void)count;
    visc_set_error("no GPU in a visc without the CUDA backend");
    return NULL;
}
const char *visc_gpu_comm_name(const visc_gpu_comm *c) {
    (void)c;
    return "none";
}
visc_grad_transport visc_gpu_comm_transport(visc_gpu_comm *c) {
    (void)c;
    return (visc_grad_transport){0};
}
void visc_gpu_comm_close(visc_gpu_comm *c) { (void)c; }
int visc_gpu_comm_allgather(visc_gpu_comm *c, float *dst, const float *src, size_t count) {
    (void)c, (void)dst, (void)src, (void)count;
    return visc_set_error("no GPU in a visc without the CUDA backend");
}
int visc_gpu_comm_allreduce(visc_gpu_comm *c, float *buf, size_t count) {
    (void)c, (void)buf, (void)count;
    return visc_set_error("no GPU in a visc without the CUDA backend");
}
#endif

/* dist.c: the process group and its communication thread.
 *
 * Why a thread: collectives are meant to run while the compute threads
 * work (gradient buckets during backward). The backend is driven by one
 * thread only, which keeps MPI at MPI_THREAD_FUNNELED and gives every
 * rank the same order of collectives: the order of submission. The thread
 * runs one collective at a time (a backend may block in it, as the MPI one
 * does; a non-blocking one is polled with short sleeps). Timeouts: a
 * waiter that sees no completion within the group's timeout (a peer died
 * or hangs) breaks the group and gets an error instead of a hang; the
 * process then ends the job (visc_dist_abort). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "plugin.h"
#include "visc/core.h"
#include "visc/dist.h"

#define QUEUE_CAP 256

typedef enum { OP_ALLREDUCE, OP_ALLGATHER, OP_BROADCAST, OP_BARRIER } op_kind;

typedef struct {
    op_kind kind;
    void *buf;
    const void *send;
    size_t count; /* elements (all-reduce) or bytes */
    int dtype, op, root;
    float scale;
    visc_dist_staging staging; /* fetch / put around an all-reduce, or none */
} coll_op;

struct visc_dist {
    int rank, world, local_rank, local_world;
    double timeout_s;
    const visc_dist_backend *be;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    coll_op queue[QUEUE_CAP];
    int64_t submitted, completed; /* tickets: op t sits at queue[t % QUEUE_CAP] */
    int stop, broken, init_done;
    char error[512];
    double wait_seconds;
};

/* A launched process joins its job once: MPI cannot be initialized again
 * after it was finalized, and one program may run several phases (visc
 * bench-ssl: pretraining, then the evaluations). The group opened under a
 * launcher is shared by every visc_dist_open of the process and finalized
 * at exit. */
static visc_dist *g_job;

static const char *op_name(op_kind k) {
    static const char *names[] = {"all-reduce", "all-gather", "broadcast", "barrier"};
    return names[k];
}

static int env_int(const char *const *names, int fallback) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return fallback;
}

/* The launcher's world size, 0 when not launched: Open MPI's mpirun, a
 * PMIx launcher, MPICH/Hydra or Slurm's srun. */
static int launched_world(void) {
    static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE",
                                            "SLURM_NTASKS", NULL};
    /* srun sets SLURM_NTASKS also for a plain shell inside an allocation:
     * only trust it with a step id (a process srun started) */
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK") && !getenv("PMI_RANK") &&
        !getenv("SLURM_STEP_ID"))
        return 0;
    return env_int(size_vars, 0);
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static void scale_floats(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* A staged all-reduce's fetch or put (fn); -1 with its error in d->error. */
static int run_staging(visc_dist *d, int (*fn)(void *, float *, size_t), const coll_op *op,
                       const char *what) {
    if (!fn || fn(op->staging.arg, op->buf, op->count) == 0) return 0;
    snprintf(d->error, sizeof d->error, "all-reduce %s: %s", what, visc_last_error());
    return -1;
}

/* Starts op on the backend and polls it to completion; -1 with d->error. */
static int run_op(visc_dist *d, const coll_op *op) {
    char err[384] = "";
    void *req = NULL;
    int rc = 0;
    if (run_staging(d, op->staging.fetch, op, "fetching its data")) return -1;
    switch (op->kind) {
    case OP_ALLREDUCE:
        rc = d->be->iallreduce(op->buf, op->count, op->dtype, op->op, &req, err, sizeof err);
        break;
    case OP_ALLGATHER:
        rc = d->be->iallgather(op->send, op->buf, op->count, &req, err, sizeof err);
        break;
    case OP_BROADCAST:
        rc = d->be->ibroadcast(op->buf, op->count, op->root, &req, err, sizeof err);
        break;
    case OP_BARRIER: rc = d->be->ibarrier(&req, err, sizeof err); break;
    }
    double start = visc_now();
    long pause = 0;
    int done = 0;
    while (rc == 0 && !done) {
        rc = d->be->test(req, &done, err, sizeof err);
        if (rc || done) break;
        if (visc_now() - start > d->timeout_s) {
            snprintf(err, sizeof err,
                     "%s did not complete within %.0f s: a peer process died or hangs "
                     "(--dist-timeout)",
                     op_name(op->kind), d->timeout_s);
            rc = -1;
            break;
        }
        /* progress quickly at first (peers usually arrive together), then
         * back off to 200 us so a long wait costs no CPU */
        if (pause > 0) sleep_us(pause);
        pause = pause < 200 ? pause + 10 : 200;
    }
    if (rc) {
        snprintf(d->error, sizeof d->error, "%s", err[0] ? err : "collective failed");
        return -1;
    }
    if (op->kind == OP_ALLREDUCE && op->scale != 1.0f && op->dtype == VISC_DT_F32)
        scale_floats(op->buf, op->count, op->scale);
    return run_staging(d, op->staging.put, op, "returning its result");
}

static void *comm_main(void *arg) {
    visc_dist *d = arg;
    char err[384] = "";
    int rank = 0, world = 1;
    int rc = d->be->init(&rank, &world, err, sizeof err);
    pthread_mutex_lock(&d->mu);
    if (rc) {
        snprintf(d->error, sizeof d->error, "%s", err);
        d->broken = 1;
    } else {
        d->rank = rank;
        d->world = world;
    }
    d->init_done = 1;
    pthread_cond_broadcast(&d->cv);
    while (!rc) {
        while (!d->stop && d->completed == d->submitted) pthread_cond_wait(&d->cv, &d->mu);
        if (d->completed == d->submitted) break; /* stop, and nothing left */
        coll_op op = d->queue[d->completed % QUEUE_CAP];
        pthread_mutex_unlock(&d->mu);
        int failed = d->broken ? -1 : run_op(d, &op);
        pthread_mutex_lock(&d->mu);
        if (failed) d->broken = 1;
        d->completed++;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    if (!rc && !d->broken) d->be->finalize();
    return NULL;
}

static visc_dist *new_group(double timeout_s) {
    visc_dist *d = visc_calloc(1, sizeof *d, "process group");
    d->world = 1;
    d->local_world = 1;
    d->timeout_s = timeout_s > 0 ? timeout_s : 600;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    return d;
}

/* Ends the communication thread (which finalizes the backend) and frees d;
 * a broken group's thread may sit in a collective for good: it is left. */
static void free_group(visc_dist *d) {
    if (d->thread_started) {
        pthread_mutex_lock(&d->mu);
        int broken = d->broken;
        d->stop = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        if (broken) return;
        pthread_join(d->thread, NULL);
    }
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
}

/* At exit: the job's communication thread finalizes the backend and ends. */
static void leave_job(void) {
    visc_dist *d = g_job;
    g_job = NULL;
    if (d) free_group(d);
}

/* Starts the communication thread on backend be and waits for its init;
 * NULL (d freed) with the backend's error when it fails. */
static visc_dist *start_group(visc_dist *d, const visc_dist_backend *be) {
    d->be = be;
    if (pthread_create(&d->thread, NULL, comm_main, d)) {
        visc_set_error("cannot start the communication thread");
        free_group(d);
        return NULL;
    }
    pthread_mutex_lock(&d->mu);
    while (!d->init_done) pthread_cond_wait(&d->cv, &d->mu);
    int failed = d->broken;
    pthread_mutex_unlock(&d->mu);
    if (failed) { /* the thread has ended: the backend never came up */
        visc_set_error("%s", d->error);
        pthread_join(d->thread, NULL);
        free_group(d);
        return NULL;
    }
    d->thread_started = 1;
    return d;
}

visc_dist *visc_dist_open_backend(const visc_dist_backend *be, double timeout_s) {
    return start_group(new_group(timeout_s), be);
}

visc_dist *visc_dist_open(const char *backend, double timeout_s) {
    if (!backend || !*backend) backend = "auto";
    if (strcmp(backend, "auto") && strcmp(backend, "none") && strcmp(backend, "mpi")) {
        visc_set_error("--dist-backend: expected auto, none or mpi, got '%s'", backend);
        return NULL;
    }
    int launched = launched_world();
    if (!strcmp(backend, "none") || (!strcmp(backend, "auto") && launched == 0))
        return new_group(timeout_s);
    if (g_job && launched) { /* joined already: the same group, this caller's timeout */
        g_job->timeout_s = timeout_s > 0 ? timeout_s : 600;
        return g_job;
    }
    if (launched == 0) {
        visc_set_error("--dist-backend mpi: not started by a launcher (run it with mpirun -np N)");
        return NULL;
    }
    const visc_dist_backend *be = visc_dist_load_plugin("mpi");
    if (!be) {
        visc_set_error("started by a launcher with %d processes, but %s", launched,
                       visc_last_error());
        return NULL;
    }
    visc_dist *d = start_group(new_group(timeout_s), be);
    if (!d) return NULL;
    static const char *const local_vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                             "SLURM_NTASKS_PER_NODE", NULL};
    static const char *const local_rank_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                                  "SLURM_LOCALID", NULL};
    d->local_world = env_int(local_vars, 1);
    if (d->local_world < 1) d->local_world = 1;
    d->local_rank = env_int(local_rank_vars, 0);
    if (d->local_rank < 0 || d->local_rank >= d->local_world) d->local_rank = 0;
    g_job = d;
    atexit(leave_job);
    return d;
}

int visc_dist_rank(const visc_dist *d) { return d ? d->rank : 0; }
int visc_dist_world(const visc_dist *d) { return d ? d->world : 1; }
int visc_dist_local_world(const visc_dist *d) { return d ? d->local_world : 1; }
int visc_dist_local_rank(const visc_dist *d) { return d ? d->local_rank : 0; }
const char *visc_dist_backend_name(const visc_dist *d) { return d && d->be ? d->be->name : "none"; }
int visc_dist_broken(const visc_dist *d) { return d && d->broken; }
double visc_dist_timeout(const visc_dist *d) { return d ? d->timeout_s : 600; }
double visc_dist_wait_seconds(const visc_dist *d) { return d ? d->wait_seconds : 0; }

void visc_dist_abort(visc_dist *d) {
    fflush(stdout);
    fflush(stderr);
    /* Finalizing would wait for peers that are gone or stuck; the
     * backend's abort takes the whole job down instead. */
    if (d && d->be && d->thread_started) d->be->abort(1);
    _exit(1);
}

void visc_dist_close(visc_dist *d) {
    if (!d) return;
    if (d->broken && d->thread_started) {
        fprintf(stderr, "visc: rank %d: %s\n", d->rank, d->error);
        visc_dist_abort(d);
    }
    if (d == g_job) return; /* finalized at exit (leave_job) */
    free_group(d);
}

/* Queues op; the ticket, or -1 when the group is broken. */
static int64_t submit(visc_dist *d, const coll_op *op) {
    pthread_mutex_lock(&d->mu);
    while (!d->broken && d->submitted - d->completed >= QUEUE_CAP)
        pthread_cond_wait(&d->cv, &d->mu);
    if (d->broken) {
        pthread_mutex_unlock(&d->mu);
        return visc_set_error("%s", d->error);
    }
    int64_t t = d->submitted++;
    d->queue[t % QUEUE_CAP] = *op;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return t;
}

int visc_dist_wait(visc_dist *d, int64_t ticket) {
    if (!d->thread_started) return 0;
    double t0 = visc_now();
    /* The backend may block inside a collective whose peer never comes:
     * the waiter keeps the clock. */
    const struct timespec deadline = visc_deadline_after(d->timeout_s);
    pthread_mutex_lock(&d->mu);
    while (d->completed <= ticket && !d->broken) {
        if (pthread_cond_timedwait(&d->cv, &d->mu, &deadline) != ETIMEDOUT) continue;
        if (d->completed <= ticket && !d->broken) {
            snprintf(d->error, sizeof d->error,
                     "%s did not complete within %.0f s: a peer process died or hangs "
                     "(--dist-timeout)",
                     op_name(d->queue[d->completed % QUEUE_CAP].kind), d->timeout_s);
            d->broken = 1;
        }
    }
    int broken = d->broken;
    pthread_mutex_unlock(&d->mu);
    d->wait_seconds += visc_now() - t0;
    if (broken) return visc_set_error("%s", d->error);
    return 0;
}

/* A group of one runs op here and now: what is left of a collective
 * with nobody else in it. */
static int run_alone(visc_dist *d, const coll_op *op) {
    if (op->kind == OP_ALLGATHER && op->buf != op->send) memmove(op->buf, op->send, op->count);
    if (op->staging.fetch && op->staging.fetch(op->staging.arg, op->buf, op->count)) return -1;
    if (op->kind == OP_ALLREDUCE && op->scale != 1.0f && op->dtype == VISC_DT_F32)
        scale_floats(op->buf, op->count, op->scale);
    (void)d;
    if (op->staging.put && op->staging.put(op->staging.arg, op->buf, op->count)) return -1;
    return 0;
}

/* Runs op: locally for a group of one, else through the thread. */
static int run_blocking(visc_dist *d, const coll_op *op) {
    if (!d->thread_started) return run_alone(d, op);
    int64_t t = submit(d, op);
    return t < 0 ? -1 : visc_dist_wait(d, t);
}

int visc_dist_allreduce(visc_dist *d, void *buf, size_t count, visc_dist_dtype type,
                        visc_dist_op op) {
    coll_op o =
        {.kind = OP_ALLREDUCE, .buf = buf, .count = count, .dtype = type, .op = op, .scale = 1.0f};
    return run_blocking(d, &o);
}

int visc_dist_allgather(visc_dist *d, const void *send, void *recv, size_t bytes) {
    coll_op o = {.kind = OP_ALLGATHER, .buf = recv, .send = send, .count = bytes};
    return run_blocking(d, &o);
}

int visc_dist_broadcast(visc_dist *d, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= d->world)
        return visc_set_error("broadcast from rank %d of a group of %d", root, d->world);
    coll_op o = {.kind = OP_BROADCAST, .buf = buf, .count = bytes, .root = root};
    return run_blocking(d, &o);
}

int visc_dist_barrier(visc_dist *d) {
    coll_op o = {.kind = OP_BARRIER};
    return run_blocking(d, &o);
}

int visc_dist_stop_signal(visc_dist *d, int *sig) {
    *sig = visc_stop_signal();
    if (d->world == 1) return 0;
    /* mpirun hands the signal to each rank at its own moment: ranks that
     * stopped after different steps would wait in each other's next
     * collective until the timeout. */
    int64_t any = *sig;
    if (visc_dist_allreduce(d, &any, 1, VISC_DT_I64, VISC_OP_MAX)) return -1;
    *sig = (int)any;
    return 0;
}

int64_t visc_dist_allreduce_async(visc_dist *d, float *buf, size_t count, float scale) {
    coll_op o = {.kind = OP_ALLREDUCE,
                 .buf = buf,
                 .count = count,
                 .dtype = VISC_DT_F32,
                 .op = VISC_OP_SUM,
                 .scale = scale};
    if (!d->thread_started) return run_alone(d, &o);
    return submit(d, &o);
}

int64_t visc_dist_allreduce_staged(visc_dist *d, float *host, size_t count, float scale,
                                   visc_dist_staging staging) {
    coll_op o = {.kind = OP_ALLREDUCE,
                 .buf = host,
                 .count = count,
                 .dtype = VISC_DT_F32,
                 .op = VISC_OP_SUM,
                 .scale = scale,
                 .staging = staging};
    if (!d->thread_started) return run_alone(d, &o);
    return submit(d, &o);
}

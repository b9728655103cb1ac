/* dist.h: processes that train together, and the collectives they use.
 *
 * dist.c       the process group: which launcher started us, the
 *              communication thread that owns the backend, blocking and
 *              asynchronous collectives, timeouts
 * plugin.c     finding and loading a backend plugin (dlopen), so that a
 *              single-process run never needs MPI installed
 * grad_sync.c  data-parallel gradient averaging in buckets, started while
 *              the backward pass is still running
 * mpi/         the MPI backend, built as build/libvisc_mpi.so when
 *              Open MPI (libopenmpi-dev) is present at build time
 *
 * The group is opened once per process. Without a launcher (no mpirun /
 * srun environment) it is a group of one: every collective is a local
 * no-op and no thread or library is started. Under a launcher the backend
 * is loaded and all its calls are made by one communication thread, in the
 * order they were submitted, which is the same order on every rank (the
 * program runs the same steps on every rank). A collective that has not
 * completed after the group's timeout marks the group broken: the call
 * returns an error naming the operation, and visc_dist_close ends the
 * process without waiting for peers that are gone. */
#ifndef VISC_DIST_H
#define VISC_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

typedef enum { VISC_DT_F32 = 0, VISC_DT_F64 = 1, VISC_DT_I64 = 2 } visc_dist_dtype;
typedef enum { VISC_OP_SUM = 0, VISC_OP_MAX = 1 } visc_dist_op;

typedef struct visc_dist visc_dist;

/* backend: "auto" (the launcher's, if any), "none" (always one process) or
 * "mpi" (an error when not launched by mpirun/srun). timeout_s: how long
 * one collective may take before the group counts as broken (<= 0: 600).
 * NULL with an error when the launcher asks for a backend that cannot be
 * loaded (the message says how to get it). */
visc_dist *visc_dist_open(const char *backend, double timeout_s);
int visc_dist_rank(const visc_dist *d);
int visc_dist_world(const visc_dist *d);
/* Ranks on this machine (OMPI_COMM_WORLD_LOCAL_SIZE & co.; 1 alone), for
 * sharing the cores between them. */
int visc_dist_local_world(const visc_dist *d);
/* This process's index among them (OMPI_COMM_WORLD_LOCAL_RANK & co.; 0
 * alone): which of the machine's GPUs it takes. */
int visc_dist_local_rank(const visc_dist *d);
const char *visc_dist_backend_name(const visc_dist *d);
/* Seconds a collective may take (the group's timeout). */
double visc_dist_timeout(const visc_dist *d);
/* 1 once a collective timed out or failed: later calls fail at once. */
int visc_dist_broken(const visc_dist *d);
/* Seconds spent waiting for collectives on the calling thread so far (the
 * share of step time that communication did not hide). */
double visc_dist_wait_seconds(const visc_dist *d);
/* Ends the whole job at once with status 1 (every rank, through the
 * backend), without finalizing: for a rank that failed, whose peers may
 * be waiting in a collective. Does not return. A group of one just exits. */
_Noreturn void visc_dist_abort(visc_dist *d);
/* Done with d (NULL is fine). A group of one is freed. The launcher's job
 * stays joined until the process exits (MPI cannot be initialized twice;
 * a later visc_dist_open returns the same group), and is finalized then.
 * A broken group cannot be finalized (its peers are gone): the process
 * exits with status 1 at once. */
void visc_dist_close(visc_dist *d);

/* ---- blocking collectives: 0, or -1 with the error set ---- */
int visc_dist_allreduce(visc_dist *d, void *buf, size_t count, visc_dist_dtype type,
                        visc_dist_op op);
/* recv holds world x bytes: rank r's send at recv + r * bytes. */
int visc_dist_allgather(visc_dist *d, const void *send, void *recv, size_t bytes);
int visc_dist_broadcast(visc_dist *d, void *buf, size_t bytes, int root);
int visc_dist_barrier(visc_dist *d);
/* The stop signal (core.h) that any rank received, the same on every rank
 * (0: none), so that all stop after the same step: one number's all-reduce
 * when there are several ranks, once per step. */
int visc_dist_stop_signal(visc_dist *d, int *sig);

/* ---- asynchronous all-reduce: submit, then wait ----
 * scale != 1 multiplies the result (averaging) on the communication
 * thread. Returns a ticket (>= 0), or -1. */
int64_t visc_dist_allreduce_async(visc_dist *d, float *buf, size_t count, float scale);
int visc_dist_wait(visc_dist *d, int64_t ticket);

/* ---- staged all-reduce: memory the host reaches only by copies (a GPU's) ----
 * As visc_dist_allreduce_async on the host buffer `host` [count], with two
 * calls made on the communication thread around the reduction: fetch
 * fills host first (it may wait until the data exists), put takes the
 * result back (it must not return before host may be reused). A call
 * that returns -1 (its error set) fails the collective and breaks the
 * group. A group of one makes both calls at once, around the scaling. */
typedef struct {
    int (*fetch)(void *arg, float *host, size_t count);
    int (*put)(void *arg, float *host, size_t count);
    void *arg;
} visc_dist_staging;
int64_t visc_dist_allreduce_staged(visc_dist *d, float *host, size_t count, float scale,
                                   visc_dist_staging staging);

/* ---- grad_sync.c: data-parallel gradient averaging ----
 * The flat gradient buffer is cut into buckets of about bucket_bytes at
 * tensor boundaries, from the last tensor to the first (the order backward
 * produces them). The model reports each tensor's gradient as final
 * (visc_model.grad_ready); a bucket whose tensors are all final is
 * all-reduced at once while backward goes on. finish() submits what the
 * model did not report, waits, and leaves every gradient averaged over the
 * ranks. bucket_bytes 0: one bucket, sent after backward (no overlap). */
typedef struct visc_grad_sync visc_grad_sync;

/* How a bucket crosses the ranks: start begins averaging buf [count]
 * (x scale after the sum) and returns a ticket (>= 0, or -1 with the error
 * set); wait(ticket) returns once that bucket may be read by whatever the
 * caller does next (for a GPU: by the kernels queued after it). NULL in
 * visc_grad_sync_new: the group's asynchronous all-reduce on host memory;
 * gradients on a GPU bring their own (gpu.h: visc_gpu_comm). */
typedef struct {
    int64_t (*start)(void *ctx, float *buf, size_t count, float scale);
    int (*wait)(void *ctx, int64_t ticket);
    void *ctx;
} visc_grad_transport;

visc_grad_sync *visc_grad_sync_new(visc_dist *d, const visc_table *params, float *grads,
                                   size_t bucket_bytes, const visc_grad_transport *transport);
int visc_grad_sync_buckets(const visc_grad_sync *g);
/* Before each backward pass. */
void visc_grad_sync_begin(visc_grad_sync *g);
/* The gradient grad[0 .. count) (one whole tensor, or several adjacent
 * ones) is final; a callback with the visc_model.grad_ready signature. */
void visc_grad_sync_ready(void *g, const float *grad, size_t count);
int visc_grad_sync_finish(visc_grad_sync *g);
void visc_grad_sync_free(visc_grad_sync *g);

#endif

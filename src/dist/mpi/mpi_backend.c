/* mpi_backend.c: the MPI collective backend, built as libvisc_mpi.so.
 *
 * Only the communication thread calls in here, so MPI is initialized by
 * that thread with MPI_THREAD_FUNNELED (the thread that called
 * MPI_Init_thread is MPI's "main" thread). The collectives are MPI's
 * blocking ones, run on that thread while the compute threads go on: Open
 * MPI's non-blocking all-reduce (libnbc) took 37 ms for 45 MB between two
 * processes here where the blocking one takes 19 ms. A call returns when
 * the collective is done; test() then reports it done at once. The caller
 * enforces the timeout (a peer that never arrives leaves this thread in
 * MPI, and the job is aborted from outside). */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "../backend.h"

const visc_dist_backend *visc_dist_backend_get(void);

static int fail(char *err, size_t size, const char *what, int code) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "code %d", code);
    snprintf(err, size, "MPI %s failed: %s", what, text);
    return -1;
}

/* The handle of a collective that already completed (they all block). */
static int done_marker;

static int too_large(size_t count, char *err, size_t size) {
    if (count <= (size_t)INT_MAX) return 0;
    snprintf(err, size, "a collective of %zu elements exceeds MPI's int count", count);
    return 1;
}

static int mpi_init(int *rank, int *world, char *err, size_t size) {
    int provided = 0, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return fail(err, size, "init", rc);
    /* errors come back as codes (and become our one-line errors) */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    return 0;
}

static MPI_Datatype mpi_type(int dtype) {
    return dtype == 1 ? MPI_DOUBLE : dtype == 2 ? MPI_INT64_T : MPI_FLOAT;
}

static int finish(int rc, const char *what, void **req, char *err, size_t size) {
    if (rc != MPI_SUCCESS) return fail(err, size, what, rc);
    *req = &done_marker;
    return 0;
}

static int mpi_iallreduce(void *buf, size_t count, int dtype, int op, void **req, char *err,
                          size_t size) {
    if (too_large(count, err, size)) return -1;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, mpi_type(dtype),
                           op == 1 ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD);
    return finish(rc, "all-reduce", req, err, size);
}

static int mpi_iallgather(const void *send, void *recv, size_t bytes, void **req, char *err,
                          size_t size) {
    if (too_large(bytes, err, size)) return -1;
    int rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
    return finish(rc, "all-gather", req, err, size);
}

static int mpi_ibroadcast(void *buf, size_t bytes, int root, void **req, char *err, size_t size) {
    if (too_large(bytes, err, size)) return -1;
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
    return finish(rc, "broadcast", req, err, size);
}

static int mpi_ibarrier(void **req, char *err, size_t size) {
    return finish(MPI_Barrier(MPI_COMM_WORLD), "barrier", req, err, size);
}

static int mpi_test(void *req, int *done, char *err, size_t size) {
    (void)err, (void)size;
    *done = req == &done_marker;
    return 0;
}

static void mpi_finalize(void) { MPI_Finalize(); }

static void mpi_abort(int status) { MPI_Abort(MPI_COMM_WORLD, status); }

const visc_dist_backend *visc_dist_backend_get(void) {
    static const visc_dist_backend b = {
        .abi = VISC_DIST_BACKEND_ABI,
        .name = "mpi",
        .init = mpi_init,
        .iallreduce = mpi_iallreduce,
        .iallgather = mpi_iallgather,
        .ibroadcast = mpi_ibroadcast,
        .ibarrier = mpi_ibarrier,
        .test = mpi_test,
        .finalize = mpi_finalize,
        .abort = mpi_abort,
    };
    return &b;
}

/* backend.h: the contract between the process group (dist.c) and a
 * collective backend plugin (mpi/mpi_backend.c, later NCCL).
 *
 * A plugin is a shared object exporting one function, visc_dist_backend_get,
 * that returns this table. It depends on nothing in libvisc (the program's
 * symbols are not exported to it), only on its own library. Every function
 * is called from the communication thread alone, one collective in flight
 * at a time. Errors are written into err (one line) and returned as -1. */
#ifndef VISC_DIST_BACKEND_H
#define VISC_DIST_BACKEND_H

#include <stddef.h>

#define VISC_DIST_BACKEND_ABI 1

typedef struct {
    int abi; /* VISC_DIST_BACKEND_ABI */
    const char *name;
    int (*init)(int *rank, int *world, char *err, size_t errsize);
    /* Each starts a non-blocking collective and stores its handle in *req;
     * dtype and op are visc_dist_dtype / visc_dist_op values. */
    int (*iallreduce)(void *buf, size_t count, int dtype, int op, void **req, char *err,
                      size_t errsize);
    int (*iallgather)(const void *send, void *recv, size_t bytes, void **req, char *err,
                      size_t errsize);
    int (*ibroadcast)(void *buf, size_t bytes, int root, void **req, char *err, size_t errsize);
    int (*ibarrier)(void **req, char *err, size_t errsize);
    /* *done = 1 when req completed (req is then freed); progresses it. */
    int (*test)(void *req, int *done, char *err, size_t errsize);
    void (*finalize)(void);
    /* Ends the whole job now (peers included, if the backend can). */
    void (*abort)(int status);
} visc_dist_backend;

typedef const visc_dist_backend *(*visc_dist_backend_get_fn)(void);

typedef struct visc_dist visc_dist;
/* A process group on the given backend (tests drive the group with a fake
 * one); not the process's job: visc_dist_close finalizes and frees it. */
visc_dist *visc_dist_open_backend(const visc_dist_backend *be, double timeout_s);

#endif

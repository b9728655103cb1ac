/* comm.cu: gradients between GPUs (cuda.h's comm section, for src/gpu/comm.c).
 *
 * Through host memory: the copies run on a stream of their own, so the
 * process group's communication thread can move one bucket while the
 * kernels of backward go on; each copy returns once it is done, since the
 * host is about to read or reuse the memory.
 *
 * NCCL is opened with dlopen, as cuDNN and cuBLASLt are (a run alone never
 * needs it, and a machine without it still runs visc). Its collectives run
 * on NCCL's own stream, which first waits for the point in the kernels'
 * stream that the call marks; visc_cuda_nccl_join makes the kernels' stream
 * wait for all of them. No host thread waits for the GPU on this path. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.cuh"

static int set_device(visc_cuda *ctx) {
    return visc_cuda_check(cudaSetDevice(ctx->device), "cudaSetDevice");
}

int visc_cuda_comm_init(visc_cuda *ctx) {
    if (ctx->comm_stream) return 0;
    return visc_cuda_check(cudaStreamCreateWithFlags(&ctx->comm_stream, cudaStreamNonBlocking),
                           "creating the communication stream");
}

int visc_cuda_comm_download(visc_cuda *ctx, void *host, const void *dev, size_t bytes,
                            visc_cuda_event *after) {
    if (set_device(ctx)) return -1;
    if (after && visc_cuda_check(cudaEventSynchronize(after->e), "CUDA work")) return -1;
    if (visc_cuda_check(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost,
                                        ctx->comm_stream),
                        "copy of gradients from the device"))
        return -1;
    return visc_cuda_check(cudaStreamSynchronize(ctx->comm_stream),
                           "copy of gradients from the device");
}

int visc_cuda_comm_upload(visc_cuda *ctx, void *dev, const void *host, size_t bytes) {
    if (set_device(ctx) ||
        visc_cuda_check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice,
                                        ctx->comm_stream),
                        "copy of gradients to the device"))
        return -1;
    return visc_cuda_check(cudaStreamSynchronize(ctx->comm_stream),
                           "copy of gradients to the device");
}

void *visc_cuda_host_alloc(visc_cuda *ctx, size_t bytes) {
    (void)ctx;
    void *p = NULL;
    /* portable: page-locked for every device's copies, whichever thread asks */
    if (visc_cuda_check(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable),
                        "page-locked host memory"))
        return NULL;
    return p;
}

void visc_cuda_host_free(visc_cuda *ctx, void *p) {
    (void)ctx;
    if (p) cudaFreeHost(p);
}

int visc_cuda_event_query(visc_cuda *ctx, visc_cuda_event *e) {
    if (set_device(ctx)) return -1;
    const cudaError_t r = cudaEventQuery(e->e);
    if (r == cudaSuccess) return 1;
    if (r == cudaErrorNotReady) return 0;
    return visc_cuda_check(r, "CUDA work");
}

int visc_cuda_device_id(visc_cuda *ctx, char *buf, size_t len) {
    return visc_cuda_check(cudaDeviceGetPCIBusId(buf, (int)len, ctx->device),
                           "cudaDeviceGetPCIBusId");
}

__global__ void scale_kernel(float *x, size_t n, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

#if __has_include(<nccl.h>)
#include <nccl.h>

#define NCCL_SONAME "libnccl.so.2"
static_assert(sizeof(ncclUniqueId) == VISC_NCCL_ID_BYTES, "ncclUniqueId's size");

typedef struct {
    decltype(&ncclGetUniqueId) unique_id;
    decltype(&ncclCommInitRank) init_rank;
    decltype(&ncclAllReduce) allreduce;
    decltype(&ncclAllGather) allgather;
    decltype(&ncclCommDestroy) destroy;
    decltype(&ncclCommAbort) abort;
    decltype(&ncclCommGetAsyncError) async_error;
    decltype(&ncclGetErrorString) error_string;
} nccl_api;
static nccl_api nccl;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_error[512];

template <typename F> static int resolve(void *lib, F *fn, const char *name) {
    *fn = (F)dlsym(lib, name);
    if (*fn) return 0;
    snprintf(load_error, sizeof load_error, "%s has no %s (%s)", NCCL_SONAME, name, dlerror());
    return -1;
}

static void load(void) {
    void *lib = dlopen(NCCL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen(VISC_CUDA_LIBDIR "/" NCCL_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof load_error, "cannot load NCCL (%s, also tried in %s): %s",
                 NCCL_SONAME, VISC_CUDA_LIBDIR, dlerror());
        return;
    }
    nccl_api t;
    if (resolve(lib, &t.unique_id, "ncclGetUniqueId") ||
        resolve(lib, &t.init_rank, "ncclCommInitRank") ||
        resolve(lib, &t.allreduce, "ncclAllReduce") ||
        resolve(lib, &t.allgather, "ncclAllGather") ||
        resolve(lib, &t.destroy, "ncclCommDestroy") || resolve(lib, &t.abort, "ncclCommAbort") ||
        resolve(lib, &t.async_error, "ncclCommGetAsyncError") ||
        resolve(lib, &t.error_string, "ncclGetErrorString")) {
        dlclose(lib);
        return;
    }
    nccl = t; /* published whole, or not at all */
}

int visc_cuda_nccl_load(void) {
    pthread_once(&once, load);
    if (nccl.unique_id) return 0;
    return visc_set_error("%s", load_error);
}

static int nccl_check(ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return 0;
    return visc_set_error("%s: %s (NCCL %d)", what, nccl.error_string(r), (int)r);
}

struct visc_nccl_state {
    ncclComm_t comm;
    cudaStream_t stream; /* NCCL's work */
    cudaEvent_t marked;  /* the kernels' stream at the latest all-reduce's call */
    int aborted;
};

int visc_cuda_nccl_unique_id(unsigned char id[VISC_NCCL_ID_BYTES]) {
    if (visc_cuda_nccl_load()) return -1;
    ncclUniqueId u;
    if (nccl_check(nccl.unique_id(&u), "ncclGetUniqueId")) return -1;
    memcpy(id, &u, sizeof u);
    return 0;
}

int visc_cuda_nccl_open(visc_cuda *ctx, const unsigned char id[VISC_NCCL_ID_BYTES], int world,
                        int rank) {
    if (ctx->nccl) return visc_set_error("NCCL: this context has a communicator already");
    if (visc_cuda_nccl_load() || set_device(ctx)) return -1;
    visc_nccl_state *n = (visc_nccl_state *)calloc(1, sizeof *n);
    if (!n) return visc_set_error("out of host memory for NCCL");
    ctx->nccl = n;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    if (visc_cuda_check(cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking),
                        "creating NCCL's stream") ||
        visc_cuda_check(cudaEventCreateWithFlags(&n->marked, cudaEventDisableTiming),
                        "cudaEventCreate") ||
        nccl_check(nccl.init_rank(&n->comm, world, u, rank), "ncclCommInitRank")) {
        visc_comm_state_free(ctx);
        return -1;
    }
    return 0;
}

/* NCCL's stream waits for the kernels queued so far. */
static int after_kernels(visc_cuda *ctx, visc_nccl_state *n) {
    return visc_cuda_check(cudaEventRecord(n->marked, ctx->stream), "recording an event") ||
                   visc_cuda_check(cudaStreamWaitEvent(n->stream, n->marked, 0),
                                   "ordering a collective after the kernels")
               ? -1
               : 0;
}

int visc_cuda_nccl_allgather(visc_cuda *ctx, float *dst, const float *src, size_t count) {
    visc_nccl_state *n = ctx->nccl;
    if (!n) return visc_set_error("NCCL all-gather without a communicator");
    if (after_kernels(ctx, n)) return -1;
    return nccl_check(nccl.allgather(src, dst, count, ncclFloat32, n->comm, n->stream),
                      "ncclAllGather");
}

int visc_cuda_nccl_allreduce(visc_cuda *ctx, float *buf, size_t count, float scale) {
    visc_nccl_state *n = ctx->nccl;
    if (!n) return visc_set_error("NCCL all-reduce without a communicator");
    if (after_kernels(ctx, n) ||
        nccl_check(nccl.allreduce(buf, buf, count, ncclFloat32, ncclSum, n->comm, n->stream),
                   "ncclAllReduce"))
        return -1;
    if (scale == 1.0f) return 0;
    scale_kernel<<<visc_cuda_blocks(count, 256), 256, 0, n->stream>>>(buf, count, scale);
    return visc_cuda_launched("all-reduce scaling");
}

int visc_cuda_nccl_mark(visc_cuda *ctx, visc_cuda_event *done) {
    visc_nccl_state *n = ctx->nccl;
    if (!n) return visc_set_error("NCCL mark without a communicator");
    return visc_cuda_check(cudaEventRecord(done->e, n->stream), "recording an event");
}

int visc_cuda_nccl_join(visc_cuda *ctx, visc_cuda_event *done) {
    return visc_cuda_check(cudaStreamWaitEvent(ctx->stream, done->e, 0),
                           "ordering the kernels after an all-reduce");
}

int visc_cuda_nccl_check(visc_cuda *ctx) {
    visc_nccl_state *n = ctx->nccl;
    if (!n) return 0;
    ncclResult_t r = ncclSuccess;
    if (nccl_check(nccl.async_error(n->comm, &r), "ncclCommGetAsyncError")) return -1;
    return nccl_check(r, "NCCL");
}

void visc_cuda_nccl_abort(visc_cuda *ctx) {
    visc_nccl_state *n = ctx->nccl;
    if (!n || n->aborted) return;
    n->aborted = 1;
    nccl.abort(n->comm);
}

static void nccl_free(visc_cuda *ctx) {
    visc_nccl_state *n = ctx->nccl;
    if (!n) return;
    if (n->comm && !n->aborted) nccl.destroy(n->comm);
    if (n->marked) cudaEventDestroy(n->marked);
    if (n->stream) {
        if (!n->aborted) cudaStreamSynchronize(n->stream);
        cudaStreamDestroy(n->stream);
    }
    free(n);
    ctx->nccl = NULL;
}
#else /* built without NCCL's header: a run that asks for NCCL is told so */
static int no_nccl(void) {
    return visc_set_error("this visc was built without NCCL (nccl.h was not found at build time)");
}
int visc_cuda_nccl_load(void) { return no_nccl(); }
int visc_cuda_nccl_unique_id(unsigned char id[VISC_NCCL_ID_BYTES]) { return no_nccl(); }
int visc_cuda_nccl_open(visc_cuda *ctx, const unsigned char id[VISC_NCCL_ID_BYTES], int world,
                        int rank) {
    return no_nccl();
}
int visc_cuda_nccl_allreduce(visc_cuda *ctx, float *buf, size_t count, float scale) {
    return no_nccl();
}
int visc_cuda_nccl_allgather(visc_cuda *ctx, float *dst, const float *src, size_t count) {
    return no_nccl();
}
int visc_cuda_nccl_mark(visc_cuda *ctx, visc_cuda_event *done) { return no_nccl(); }
int visc_cuda_nccl_join(visc_cuda *ctx, visc_cuda_event *done) { return no_nccl(); }
int visc_cuda_nccl_check(visc_cuda *ctx) { return 0; }
void visc_cuda_nccl_abort(visc_cuda *ctx) {}
static void nccl_free(visc_cuda *ctx) {}
#endif

void visc_comm_state_free(visc_cuda *ctx) {
    nccl_free(ctx);
    if (ctx->comm_stream) {
        cudaStreamSynchronize(ctx->comm_stream);
        cudaStreamDestroy(ctx->comm_stream);
        ctx->comm_stream = NULL;
    }
}

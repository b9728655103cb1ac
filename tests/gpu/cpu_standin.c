/* cpu_standin.c: a stand-in GPU for the tests: the part of the CUDA
 * backend's API (include/visc/cuda.h) that the engine's GPU code
 * (src/gpu/) calls, implemented with the engine's own CPU layers on host
 * memory.
 *
 * What it is for: testing the GPU plumbing where there is no GPU (CI has
 * none). A model moved to this "GPU" runs its GPU code path (every layer
 * through its twin in src/gpu/layers.c, the arena planned again, the batch
 * uploaded, logits downloaded, the optimizer's step and state on the
 * device, checkpoints downloaded first), and since each "kernel" here is
 * the CPU layer the CPU path calls, with the same shapes (so the same
 * oneDNN primitives), a run on it must give the CPU run's bits exactly.
 * Any difference is a plumbing bug: a wrong buffer, a missed copy, state
 * not carried. The real kernels are checked against these same CPU layers
 * on a real GPU by test_cuda_kernels.c; the two together cover the GPU path.
 *
 * The exception is a ResNet under --precision bf16, whose activations are
 * bf16 channels-last on the GPU (standin_nhwc.c: the same CPU layers on
 * fp32 copies, each result rounded to bf16 as the GPU rounds it); it is
 * compared by what it learns.
 *
 * Linked instead of libvisc_cuda.a into tests/gpu/test_gpu_standin (the
 * model checks of test_cuda_model.c, held to zero difference) and
 * tests/gpu/visc_standin (the whole program: tests/e2e_gpu_standin.sh). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/models/swin_window.h"
#include "../../src/models/talking_heads.h"
#include "../../src/nn/linear_bf16.h"
#include "standin.h"
#include "visc/cuda.h"
#include "visc/nn.h"
#include "visc/ssl.h"
#include "visc/transforms.h"
#include "visc/tokens.h"

/* Layers keep primitives per shape, as cuDNN plans are kept per shape. */
#define MAX_SHAPES 256

typedef struct {
    visc_cuda_conv_shape key;
    visc_conv2d op;
    float *scratch_in, *scratch_dw; /* backward-data's unused operands */
    float *scratch_w, *scratch_dy;  /* bf16 tensors: the rounded weights, the NCHW output */
} conv_entry;

typedef struct {
    visc_cuda_bn_shape key;
    visc_batchnorm2d op;
} bn_entry;

typedef struct {
    int key[7];
    visc_pool2d op;
} pool_entry;

typedef struct {
    visc_cuda_patch_shape key;
    visc_conv2d op; /* with its bias, as the CPU's patch embedding */
} patch_entry;

struct visc_cuda {
    int device;
    conv_entry conv[MAX_SHAPES];
    bn_entry bn[MAX_SHAPES];
    pool_entry pool[MAX_SHAPES];
    patch_entry patch[MAX_SHAPES];
    int num_conv, num_bn, num_pool, num_patch;
    int bf16;
    /* page-locked host memory (visc_cuda_host_register), held to CUDA's
     * rules: no region twice, unregister only what is registered, nothing
     * left registered at close */
    struct {
        const char *p;
        size_t bytes;
    } pinned[MAX_SHAPES];
    int num_pinned;
    /* every live "device" allocation, so that a host pointer handed where
     * the GPU needs its own memory stops the program here as it would
     * fault on a GPU (copies and the input kernel check their pointers) */
    struct {
        const char *p;
        size_t bytes;
    } * allocs;
    int num_allocs, cap_allocs;
    size_t mem_now, mem_peak; /* the allocations' sum and its high-water mark */
    /* the registries above: the process group's communication thread
     * copies gradients while the main thread computes (comm.cu's calls) */
    pthread_mutex_t mu;
};

int visc_cuda_device_count(void) { return 1; }

int visc_cuda_describe(int dev, char *buf, size_t len) {
    if (dev != 0) return visc_set_error("no device %d", dev);
    snprintf(buf, len, "CPU stand-in (tests/gpu/cpu_standin.c: the CPU layers on host memory)");
    return 0;
}

visc_cuda *visc_cuda_open(int dev) {
    if (dev != 0) {
        visc_set_error("no device %d", dev);
        return NULL;
    }
    visc_cuda *ctx = visc_calloc(1, sizeof(visc_cuda), "stand-in GPU");
    pthread_mutex_init(&ctx->mu, NULL);
    return ctx;
}

void visc_cuda_close(visc_cuda *ctx) {
    for (int i = 0; i < ctx->num_conv; i++) {
        visc_conv2d_destroy(&ctx->conv[i].op);
        visc_free_aligned(ctx->conv[i].scratch_in);
        visc_free_aligned(ctx->conv[i].scratch_dw);
        visc_free_aligned(ctx->conv[i].scratch_w);
        visc_free_aligned(ctx->conv[i].scratch_dy);
    }
    for (int i = 0; i < ctx->num_bn; i++) visc_batchnorm2d_destroy(&ctx->bn[i].op);
    for (int i = 0; i < ctx->num_pool; i++) visc_pool2d_destroy(&ctx->pool[i].op);
    for (int i = 0; i < ctx->num_patch; i++) visc_conv2d_destroy(&ctx->patch[i].op);
    standin_nccl_close();
    free(ctx->allocs);
    pthread_mutex_destroy(&ctx->mu);
    if (ctx->num_pinned)
        visc_die("stand-in: %d host region%s still page-locked when the GPU is closed",
                 ctx->num_pinned, ctx->num_pinned == 1 ? " is" : "s are");
    free(ctx);
}

/* Registering changes nothing on the host; the bookkeeping checks that the
 * program keeps to what the CUDA runtime demands (cudaErrorHostMemory-
 * AlreadyRegistered, cudaErrorHostMemoryNotRegistered). */
static int register_locked(visc_cuda *ctx, const char *c, size_t bytes) {
    for (int i = 0; i < ctx->num_pinned; i++)
        if (c < ctx->pinned[i].p + ctx->pinned[i].bytes && ctx->pinned[i].p < c + bytes)
            return visc_set_error("page-locking host memory: already registered");
    if (ctx->num_pinned == MAX_SHAPES) return visc_set_error("stand-in: too many pinned regions");
    ctx->pinned[ctx->num_pinned].p = c;
    ctx->pinned[ctx->num_pinned].bytes = bytes;
    ctx->num_pinned++;
    return 0;
}

int visc_cuda_host_register(visc_cuda *ctx, void *p, size_t bytes) {
    if (!p || bytes == 0) return visc_set_error("page-locking host memory: an empty region");
    pthread_mutex_lock(&ctx->mu);
    int rc = register_locked(ctx, p, bytes);
    pthread_mutex_unlock(&ctx->mu);
    return rc;
}

int visc_cuda_host_unregister(visc_cuda *ctx, void *p) {
    pthread_mutex_lock(&ctx->mu);
    for (int i = 0; i < ctx->num_pinned; i++)
        if (ctx->pinned[i].p == p) {
            ctx->pinned[i] = ctx->pinned[--ctx->num_pinned];
            pthread_mutex_unlock(&ctx->mu);
            return 0;
        }
    pthread_mutex_unlock(&ctx->mu);
    return visc_set_error("unlocking host memory: not registered");
}

/* The regions registered now (tests; declared where they use it). */
int visc_standin_pinned_count(const visc_cuda *ctx);
int visc_standin_pinned_count(const visc_cuda *ctx) { return ctx->num_pinned; }

int visc_cuda_sync(visc_cuda *ctx) {
    (void)ctx;
    return 0;
}

/* Host memory is not counted: the stand-in reports none in use. */
int visc_cuda_memory_used(visc_cuda *ctx, size_t *used) {
    (void)ctx;
    *used = 0;
    return 0;
}

/* The CPU's layers have no wide accesses to turn off, nor cuDNN algorithms to time. */
void visc_cuda_set_vector_access(visc_cuda *ctx, int on) { (void)ctx, (void)on; }
void visc_cuda_set_conv_benchmark(visc_cuda *ctx, int on) { (void)ctx, (void)on; }
/* Nor an epilogue: the CPU's products add their bias themselves. */
void visc_cuda_set_bias_epilogue(visc_cuda *ctx, int on) { (void)ctx, (void)on; }

void visc_cuda_memory_allocated(visc_cuda *ctx, size_t *now, size_t *peak) {
    pthread_mutex_lock(&ctx->mu);
    if (now) *now = ctx->mem_now;
    if (peak) *peak = ctx->mem_peak;
    pthread_mutex_unlock(&ctx->mu);
}

/* No profiler: its layers are the CPU's, timed by the CPU's tools. */
int visc_cuda_profile_start(visc_cuda *ctx) {
    (void)ctx;
    return visc_set_error("the stand-in GPU has no profiler");
}

int visc_cuda_profile_report(visc_cuda *ctx, FILE *f, int steps) {
    (void)ctx, (void)f, (void)steps;
    return visc_set_error("the stand-in GPU has no profiler");
}

/* The stand-in device's size: VISC_STANDIN_DEVICE_MEMORY ("64M"), for
 * the tests of what a full GPU says; unset, as much as the host has. */
static long long standin_device_bytes(void) {
    const char *s = getenv("VISC_STANDIN_DEVICE_MEMORY");
    long long bytes;
    if (!s || !*s) return -1;
    if (visc_parse_size(s, &bytes)) visc_die("VISC_STANDIN_DEVICE_MEMORY='%s': not a size", s);
    return bytes;
}

/* "Device" memory is host memory that starts out as NaNs, so that a read
 * of anything never written shows (cudaMalloc's memory holds leftovers).
 * A full device fails as cudaMalloc's does (context.cu). */
void *visc_cuda_alloc(visc_cuda *ctx, size_t bytes) {
    const long long size = standin_device_bytes();
    pthread_mutex_lock(&ctx->mu);
    const size_t now = ctx->mem_now;
    pthread_mutex_unlock(&ctx->mu);
    if (size >= 0 && now + bytes > (size_t)size) {
        visc_set_error("out of device memory: %.0f MiB needed, %.0f MiB free of %.0f MiB",
                       (double)bytes / (1 << 20),
                       (double)((size_t)size > now ? size - now : 0) / (1 << 20),
                       (double)size / (1 << 20));
        return NULL;
    }
    float *p = visc_alloc_aligned(bytes ? bytes : 1, "stand-in device memory");
    for (size_t i = 0; i < bytes / sizeof(float); i++) p[i] = __builtin_nanf("");
    pthread_mutex_lock(&ctx->mu);
    if (ctx->num_allocs == ctx->cap_allocs) {
        ctx->cap_allocs = ctx->cap_allocs ? 2 * ctx->cap_allocs : 256;
        ctx->allocs = realloc(ctx->allocs, (size_t)ctx->cap_allocs * sizeof *ctx->allocs);
        if (!ctx->allocs) visc_die("stand-in: out of memory");
    }
    ctx->allocs[ctx->num_allocs].p = (const char *)p;
    ctx->allocs[ctx->num_allocs++].bytes = bytes;
    ctx->mem_now += bytes;
    if (ctx->mem_now > ctx->mem_peak) ctx->mem_peak = ctx->mem_now;
    pthread_mutex_unlock(&ctx->mu);
    return p;
}

void visc_cuda_free(visc_cuda *ctx, void *p) {
    pthread_mutex_lock(&ctx->mu);
    for (int i = 0; i < ctx->num_allocs; i++)
        if (ctx->allocs[i].p == p) {
            ctx->mem_now -= ctx->allocs[i].bytes;
            ctx->allocs[i] = ctx->allocs[--ctx->num_allocs];
            break;
        }
    pthread_mutex_unlock(&ctx->mu);
    visc_free_aligned(p);
}

/* Stops the program unless [p, p + bytes) lies in one device allocation. */
static void on_device(visc_cuda *ctx, const void *p, size_t bytes, const char *what) {
    const char *c = p;
    if (bytes == 0) return;
    pthread_mutex_lock(&ctx->mu);
    for (int i = 0; i < ctx->num_allocs; i++)
        if (c >= ctx->allocs[i].p && c + bytes <= ctx->allocs[i].p + ctx->allocs[i].bytes) {
            pthread_mutex_unlock(&ctx->mu);
            return;
        }
    pthread_mutex_unlock(&ctx->mu);
    visc_die("stand-in: %s: %zu bytes at %p are not device memory (a host pointer where the GPU "
             "needs its own would fault there)",
             what, bytes, p);
}

int visc_cuda_upload(visc_cuda *ctx, void *dst, const void *src, size_t bytes) {
    on_device(ctx, dst, bytes, "upload");
    memcpy(dst, src, bytes);
    return 0;
}

/* ---- copies beside the kernels ----
 * Here every copy and kernel runs when it is called, so the order the
 * events give holds by itself. What is checked is the host's side of the
 * bargain: an asynchronous copy reads page-locked memory (the program
 * pins what it copies this way; CUDA would stage pageable memory first),
 * and that memory stays as it was until the program has waited for the
 * copy's event (a loader refilling the batch before its copy ran would
 * send the GPU another batch). */

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

visc_cuda_event *visc_cuda_event_create(visc_cuda *ctx) {
    (void)ctx;
    return visc_calloc(1, sizeof(visc_cuda_event), "stand-in event");
}

void visc_cuda_event_destroy(visc_cuda *ctx, visc_cuda_event *e) {
    (void)ctx;
    free(e);
}

int visc_cuda_event_record(visc_cuda *ctx, visc_cuda_event *e) {
    (void)ctx;
    e->nccl_seq = 0; /* the kernels' work: done when it is recorded */
    return 0;
}

int visc_cuda_event_wait(visc_cuda *ctx, visc_cuda_event *e) {
    (void)ctx;
    for (int i = 0; i < e->count; i++)
        if (fnv1a(e->in_flight[i].src, e->in_flight[i].bytes) != e->in_flight[i].hash)
            visc_die("stand-in: %zu bytes of host memory at %p changed while their copy to the "
                     "device was in flight",
                     e->in_flight[i].bytes, (const void *)e->in_flight[i].src);
    e->count = 0;
    return 0;
}

int visc_cuda_upload_async(visc_cuda *ctx, void *dst, const void *src, size_t bytes,
                           visc_cuda_event *after, visc_cuda_event *done) {
    (void)after;
    on_device(ctx, dst, bytes, "asynchronous upload");
    const char *c = src;
    int pinned = 0;
    for (int i = 0; i < ctx->num_pinned && !pinned; i++)
        pinned = c >= ctx->pinned[i].p && c + bytes <= ctx->pinned[i].p + ctx->pinned[i].bytes;
    if (!pinned)
        visc_die("stand-in: asynchronous upload of %zu bytes at %p from memory that is not "
                 "page-locked",
                 bytes, src);
    if (done->count == STANDIN_MAX_IN_FLIGHT)
        visc_die("stand-in: %d copies queued on one event and never waited for",
                 STANDIN_MAX_IN_FLIGHT);
    done->in_flight[done->count].src = src;
    done->in_flight[done->count].bytes = bytes;
    done->in_flight[done->count].hash = fnv1a(src, bytes);
    done->count++;
    memcpy(dst, src, bytes);
    return 0;
}

/* ---- gradients between GPUs (comm.cu) ----
 * Through host memory: the process group's communication thread calls
 * the copies, while the main thread goes on with backward; the stand-in
 * checks what CUDA would fault at or stage silently (device memory on one
 * side, page-locked memory from visc_cuda_host_alloc on the other). Its
 * kernels run when they are called, so a bucket is final by the time its
 * event is recorded. NCCL's part is standin_nccl.c. */
int visc_cuda_comm_init(visc_cuda *ctx) {
    (void)ctx;
    return 0;
}

static void page_locked(visc_cuda *ctx, const void *p, size_t bytes, const char *what) {
    const char *c = p;
    pthread_mutex_lock(&ctx->mu);
    for (int i = 0; i < ctx->num_pinned; i++)
        if (c >= ctx->pinned[i].p && c + bytes <= ctx->pinned[i].p + ctx->pinned[i].bytes) {
            pthread_mutex_unlock(&ctx->mu);
            return;
        }
    pthread_mutex_unlock(&ctx->mu);
    visc_die("stand-in: %s: %zu bytes at %p are not page-locked host memory", what, bytes, p);
}

int visc_cuda_comm_download(visc_cuda *ctx, void *host, const void *dev, size_t bytes,
                            visc_cuda_event *after) {
    (void)after;
    on_device(ctx, dev, bytes, "gradient download");
    page_locked(ctx, host, bytes, "gradient download");
    memcpy(host, dev, bytes);
    return 0;
}

int visc_cuda_comm_upload(visc_cuda *ctx, void *dev, const void *host, size_t bytes) {
    on_device(ctx, dev, bytes, "gradient upload");
    page_locked(ctx, host, bytes, "gradient upload");
    memcpy(dev, host, bytes);
    return 0;
}

void *visc_cuda_host_alloc(visc_cuda *ctx, size_t bytes) {
    void *p = visc_alloc_aligned(bytes ? bytes : 1, "stand-in page-locked memory");
    if (visc_cuda_host_register(ctx, p, bytes ? bytes : 1)) {
        visc_free_aligned(p);
        return NULL;
    }
    return p;
}

void visc_cuda_host_free(visc_cuda *ctx, void *p) {
    if (!p) return;
    if (visc_cuda_host_unregister(ctx, p)) visc_die("stand-in: %s", visc_last_error());
    visc_free_aligned(p);
}

/* Kernels and copies are done when they return; NCCL's work is done when
 * the stand-in NCCL's thread has run it (standin_nccl.c). */
int visc_cuda_event_query(visc_cuda *ctx, visc_cuda_event *e) {
    (void)ctx;
    return standin_nccl_done(e);
}

/* Each process's stand-in GPU is its own memory: its own device, unless
 * VISC_STANDIN_SHARED_GPU=1 says the processes share one (as two ranks on
 * one real GPU would). */
int visc_cuda_device_id(visc_cuda *ctx, char *buf, size_t len) {
    const char *shared = getenv("VISC_STANDIN_SHARED_GPU");
    if (shared && !strcmp(shared, "1")) snprintf(buf, len, "stand-in:%d", ctx->device);
    else snprintf(buf, len, "stand-in:%d:%ld", ctx->device, (long)getpid());
    return 0;
}

int visc_cuda_download(visc_cuda *ctx, void *dst, const void *src, size_t bytes) {
    on_device(ctx, src, bytes, "download");
    memcpy(dst, src, bytes);
    return 0;
}

int visc_cuda_zero(visc_cuda *ctx, void *p, size_t bytes) {
    on_device(ctx, p, bytes, "zero");
    memset(p, 0, bytes);
    return 0;
}

int visc_cuda_copy(visc_cuda *ctx, void *dst, const void *src, size_t bytes) {
    on_device(ctx, dst, bytes, "copy on the device (destination)");
    on_device(ctx, src, bytes, "copy on the device (source)");
    memmove(dst, src, bytes);
    return 0;
}

/* ---- convolutions: visc_conv2d per shape ---- */
static conv_entry *conv_for(visc_cuda *ctx, const visc_cuda_conv_shape *s) {
    if (s->type == VISC_CUDA_CONV_BF16_NHWC) {
        visc_set_error("the stand-in has no convolution with bf16 weights");
        return NULL;
    }
    for (int i = 0; i < ctx->num_conv; i++)
        if (!memcmp(&ctx->conv[i].key, s, sizeof *s)) return &ctx->conv[i];
    if (ctx->num_conv == MAX_SHAPES) {
        visc_set_error("stand-in: more than %d convolution shapes", MAX_SHAPES);
        return NULL;
    }
    conv_entry *e = &ctx->conv[ctx->num_conv++];
    e->key = *s;
    visc_conv2d_init(&e->op, s->N, s->C, s->H, s->W, s->K, s->R, s->S, s->stride, s->pad, 1, 1, 0);
    e->scratch_in = visc_calloc((size_t)s->N * s->C * s->H * s->W, sizeof(float), "stand-in");
    const size_t nw = (size_t)s->K * s->C * s->R * s->S;
    e->scratch_dw = visc_calloc(nw, sizeof(float), "stand-in");
    e->scratch_w = visc_calloc(nw, sizeof(float), "stand-in");
    e->scratch_dy = visc_calloc((size_t)s->N * s->K * e->op.P * e->op.Q, sizeof(float), "stand-in");
    return e;
}

/* Values rounded to bf16, held in fp32. */
static const float *rounded(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = visc_bf16_to_f32(visc_f32_to_bf16(src[i]));
    return dst;
}

static void round_in_place(float *x, size_t n) { rounded(x, x, n); }

static size_t conv_in(const conv_entry *e) {
    return (size_t)e->key.N * e->key.C * e->key.H * e->key.W;
}
static size_t conv_weights(const conv_entry *e) {
    return (size_t)e->key.K * e->key.C * e->key.R * e->key.S;
}

/* ---- bf16 channels-last tensors, fp32 weights (VISC_CUDA_CONV_BF16_NHWC_F32W):
 * the fp32 layer on NCHW copies, with the operands' bf16 rounding (the
 * tensors hold bf16 already; the weights are rounded) and its results
 * rounded to bf16, as cuDNN's bf16 form computes them ---- */
enum { CONV_FWD, CONV_BWD_DATA, CONV_BWD_WEIGHTS };

static int nhwc_conv(conv_entry *e, int dir, void *out, const void *a, const void *b, float beta) {
    const visc_cuda_conv_shape *k = &e->key;
    const int HW = k->H * k->W, PQ = e->op.P * e->op.Q;
    if (dir == CONV_BWD_WEIGHTS) {
        float *x = standin_nhwc_to_nchw(a, k->N, k->C, HW);
        float *dy = standin_nhwc_to_nchw(b, k->N, k->K, PQ);
        const size_t nw = conv_weights(e);
        visc_conv2d_backward(&e->op, NULL, e->scratch_dw, NULL, dy, x, NULL);
        round_in_place(e->scratch_dw, nw);
        float *dw = out;
        for (size_t i = 0; i < nw; i++)
            dw[i] = beta == 0.0f ? e->scratch_dw[i] : beta * dw[i] + e->scratch_dw[i];
        visc_free_aligned(dy);
        visc_free_aligned(x);
        return 0;
    }
    const float *w = rounded(e->scratch_w, b, conv_weights(e));
    if (dir == CONV_FWD) {
        float *x = standin_nhwc_to_nchw(a, k->N, k->C, HW);
        visc_conv2d_forward(&e->op, e->scratch_dy, x, w, NULL);
        standin_nchw_to_nhwc(out, e->scratch_dy, k->N, k->K, PQ);
        visc_free_aligned(x);
        return 0;
    }
    float *dy = standin_nhwc_to_nchw(a, k->N, k->K, PQ);
    float *dx = visc_alloc_aligned(conv_in(e) * sizeof(float), "stand-in convolution");
    visc_conv2d_backward(&e->op, dx, e->scratch_dw, NULL, dy, e->scratch_in, w);
    standin_nchw_to_nhwc(out, dx, k->N, k->C, HW);
    visc_free_aligned(dx);
    visc_free_aligned(dy);
    return 0;
}

int visc_cuda_conv_forward(visc_cuda *ctx, const visc_cuda_conv_shape *s, void *y, const void *x,
                           const void *w) {
    conv_entry *e = conv_for(ctx, s);
    if (!e) return -1;
    if (s->type == VISC_CUDA_CONV_BF16_NHWC_F32W) return nhwc_conv(e, CONV_FWD, y, x, w, 0.0f);
    visc_conv2d_forward(&e->op, y, x, w, NULL);
    return 0;
}

int visc_cuda_conv_backward_weights(visc_cuda *ctx, const visc_cuda_conv_shape *s, void *dw,
                                    const void *x, const void *dy, float beta) {
    conv_entry *e = conv_for(ctx, s);
    if (!e) return -1;
    if (s->type == VISC_CUDA_CONV_BF16_NHWC_F32W)
        return nhwc_conv(e, CONV_BWD_WEIGHTS, dw, x, dy, beta);
    const size_t nw = conv_weights(e);
    float *out = beta != 0.0f ? e->scratch_dw : dw; /* beta: dw = beta dw + the gradient */
    visc_conv2d_backward(&e->op, NULL, out, NULL, dy, x, NULL);
    if (beta != 0.0f)
        for (size_t i = 0; i < nw; i++) ((float *)dw)[i] = beta * ((float *)dw)[i] + out[i];
    return 0;
}

/* The CPU layer computes the data gradient together with the weights'; the
 * data gradient depends on dy and w only, so the weights' part runs on a
 * scratch input into a scratch gradient. */
int visc_cuda_conv_backward_data(visc_cuda *ctx, const visc_cuda_conv_shape *s, void *dx,
                                 const void *dy, const void *w) {
    conv_entry *e = conv_for(ctx, s);
    if (!e) return -1;
    if (s->type == VISC_CUDA_CONV_BF16_NHWC_F32W)
        return nhwc_conv(e, CONV_BWD_DATA, dx, dy, w, 0.0f);
    visc_conv2d_backward(&e->op, dx, e->scratch_dw, NULL, dy, e->scratch_in, w);
    return 0;
}

/* ---- batch norm: visc_batchnorm2d per shape; bf16 channels-last
 * activations on fp32 NCHW copies, the results rounded back ---- */
static visc_batchnorm2d *bn_for(visc_cuda *ctx, const visc_cuda_bn_shape *s) {
    if (s->nchw == s->bf16) {
        visc_set_error("the stand-in has NCHW fp32 and channels-last bf16 batch norm only");
        return NULL;
    }
    for (int i = 0; i < ctx->num_bn; i++)
        if (!memcmp(&ctx->bn[i].key, s, sizeof *s)) return &ctx->bn[i].op;
    if (ctx->num_bn == MAX_SHAPES) {
        visc_set_error("stand-in: more than %d batch norm shapes", MAX_SHAPES);
        return NULL;
    }
    bn_entry *e = &ctx->bn[ctx->num_bn++];
    e->key = *s;
    visc_batchnorm2d_init(&e->op, s->N, s->C, s->HW, s->eps, s->momentum, s->relu);
    return &e->op;
}

/* An activation as the CPU layer reads it: p itself, or an fp32 NCHW copy
 * of a bf16 one (bn_done frees it); NULL stays NULL. */
static const float *bn_read(const visc_cuda_bn_shape *s, const void *p) {
    if (!s->bf16 || !p) return p;
    return standin_nhwc_to_nchw(p, s->N, s->C, s->HW);
}

/* Where the CPU layer writes an activation: p, or an fp32 NCHW buffer that
 * bn_write rounds into p and frees. */
static float *bn_target(const visc_cuda_bn_shape *s, void *p) {
    if (!s->bf16 || !p) return p;
    return visc_alloc_aligned((size_t)s->N * s->C * s->HW * sizeof(float), "stand-in batch norm");
}

static void bn_write(const visc_cuda_bn_shape *s, void *p, float *v) {
    if (!s->bf16 || !p) return;
    standin_nchw_to_nhwc(p, v, s->N, s->C, s->HW);
    visc_free_aligned(v);
}

static void bn_done(const visc_cuda_bn_shape *s, const float *copy) {
    if (s->bf16 && copy) visc_free_aligned((void *)copy);
}

int visc_cuda_batchnorm_forward_train(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                      float *save_mean, float *save_rstd, const void *in,
                                      const float *gamma, const float *beta, float *running_mean,
                                      float *running_var) {
    visc_batchnorm2d *b = bn_for(ctx, s);
    if (!b) return -1;
    const float *x = bn_read(s, in);
    float *y = bn_target(s, out);
    visc_batchnorm2d_forward_train(b, y, save_mean, save_rstd, x, gamma, beta, running_mean,
                                   running_var);
    bn_write(s, out, y);
    bn_done(s, x);
    return 0;
}

int visc_cuda_batchnorm_forward_eval(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                     const void *in, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var) {
    visc_batchnorm2d *b = bn_for(ctx, s);
    if (!b) return -1;
    const float *x = bn_read(s, in);
    float *y = bn_target(s, out);
    visc_batchnorm2d_forward_eval(b, y, x, gamma, beta, running_mean, running_var);
    bn_write(s, out, y);
    bn_done(s, x);
    return 0;
}

int visc_cuda_batchnorm_apply(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                              const void *in, const float *gamma, const float *beta,
                              const float *save_mean, const float *save_rstd) {
    visc_batchnorm2d *b = bn_for(ctx, s);
    if (!b) return -1;
    const float *x = bn_read(s, in);
    float *y = bn_target(s, out);
    visc_batchnorm2d_apply(b, y, x, gamma, beta, save_mean, save_rstd);
    bn_write(s, out, y);
    bn_done(s, x);
    return 0;
}

/* The residual sum after the norm, as the model's two passes did it. */
static int bn_add_residual(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                           const void *residual) {
    const size_t n = (size_t)s->N * s->C * s->HW;
    if (s->bf16 && s->relu) return visc_cuda_add_relu_bf16(ctx, out, residual, n);
    if (s->bf16) return visc_cuda_add_bf16(ctx, out, out, residual, n);
    if (s->relu) return visc_cuda_add_relu(ctx, out, residual, n);
    return visc_cuda_add(ctx, out, out, residual, n);
}

int visc_cuda_batchnorm_forward_train_add(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                          float *save_mean, float *save_rstd, const void *in,
                                          const void *residual, const float *gamma,
                                          const float *beta, float *running_mean,
                                          float *running_var) {
    visc_cuda_bn_shape norm = *s;
    norm.relu = 0;
    return visc_cuda_batchnorm_forward_train(ctx, &norm, out, save_mean, save_rstd, in, gamma, beta,
                                             running_mean, running_var) ||
                   bn_add_residual(ctx, s, out, residual)
               ? -1
               : 0;
}

int visc_cuda_batchnorm_forward_eval_add(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                         const void *in, const void *residual, const float *gamma,
                                         const float *beta, const float *running_mean,
                                         const float *running_var) {
    visc_cuda_bn_shape norm = *s;
    norm.relu = 0;
    return visc_cuda_batchnorm_forward_eval(ctx, &norm, out, in, gamma, beta, running_mean,
                                            running_var) ||
                   bn_add_residual(ctx, s, out, residual)
               ? -1
               : 0;
}

/* A training forward's statistics: the CPU layer's forward into a
 * temporary of the stand-in's own, with unit gamma and zero beta (the
 * output is dropped; the statistics do not depend on them). */
int visc_cuda_batchnorm_statistics(visc_cuda *ctx, const visc_cuda_bn_shape *s, float *save_mean,
                                   float *save_rstd, const void *in, float *running_mean,
                                   float *running_var) {
    const size_t n = (size_t)s->N * s->C * s->HW;
    float *tmp = visc_alloc_aligned(n * sizeof(float), "stand-in batch norm");
    float *gamma = visc_alloc_aligned(2 * (size_t)s->C * sizeof(float), "stand-in batch norm");
    for (int c = 0; c < s->C; c++) gamma[c] = 1.0f, gamma[s->C + c] = 0.0f;
    const int rc = visc_cuda_batchnorm_forward_train(ctx, s, tmp, save_mean, save_rstd, in, gamma,
                                                     gamma + s->C, running_mean, running_var);
    visc_free_aligned(gamma);
    visc_free_aligned(tmp);
    return rc;
}

/* The block end with its shortcut's norm: that norm's output written (its
 * training form from the saved statistics, or its evaluation form) into a
 * temporary of the stand-in's own in the stored form, then the block end
 * with it as the residual: the model's passes before they were fused. */
static void *residual_norm_output(visc_cuda *ctx, const visc_cuda_bn_shape *s,
                                  const visc_cuda_bn_residual *rn, int train) {
    visc_cuda_bn_shape rs = *s;
    rs.relu = 0;
    rs.eps = rn->eps > 0 ? rn->eps : s->eps; /* training: the saved rstd has it */
    void *r = visc_alloc_aligned((size_t)s->N * s->C * s->HW * sizeof(float), "stand-in residual");
    const int rc = train
                       ? visc_cuda_batchnorm_apply(ctx, &rs, r, rn->in, rn->gamma, rn->beta,
                                                   rn->mean, rn->rstd)
                       : visc_cuda_batchnorm_forward_eval(ctx, &rs, r, rn->in, rn->gamma, rn->beta,
                                                          rn->running_mean, rn->running_var);
    if (rc) {
        visc_free_aligned(r);
        return NULL;
    }
    return r;
}

int visc_cuda_batchnorm_forward_train_add_norm(visc_cuda *ctx, const visc_cuda_bn_shape *s,
                                               void *out, float *save_mean, float *save_rstd,
                                               const void *in, const visc_cuda_bn_residual *rn,
                                               const float *gamma, const float *beta,
                                               float *running_mean, float *running_var) {
    void *r = residual_norm_output(ctx, s, rn, 1);
    if (!r) return -1;
    const int rc = visc_cuda_batchnorm_forward_train_add(ctx, s, out, save_mean, save_rstd, in, r,
                                                         gamma, beta, running_mean, running_var);
    visc_free_aligned(r);
    return rc;
}

int visc_cuda_batchnorm_forward_eval_add_norm(visc_cuda *ctx, const visc_cuda_bn_shape *s,
                                              void *out, const void *in,
                                              const visc_cuda_bn_residual *rn, const float *gamma,
                                              const float *beta, const float *running_mean,
                                              const float *running_var) {
    void *r = residual_norm_output(ctx, s, rn, 0);
    if (!r) return -1;
    const int rc = visc_cuda_batchnorm_forward_eval_add(ctx, s, out, in, r, gamma, beta,
                                                        running_mean, running_var);
    visc_free_aligned(r);
    return rc;
}

/* The forward's output made again where backward is given none: the
 * CPU's apply, stored as the forward stored it (fp32 NCHW here). */
static float *bn_output_again(const visc_cuda_bn_shape *s, const visc_batchnorm2d *b,
                              const float *x, const float *gamma, const float *beta,
                              const float *save_mean, const float *save_rstd) {
    const size_t n = (size_t)s->N * s->C * s->HW;
    float *y = visc_alloc_aligned(n * sizeof(float), "stand-in batch norm output");
    visc_batchnorm2d_apply(b, y, x, gamma, beta, save_mean, save_rstd);
    if (s->bf16)
        for (size_t i = 0; i < n; i++) y[i] = visc_bf16_to_f32(visc_f32_to_bf16(y[i]));
    return y;
}

int visc_cuda_batchnorm_backward(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *din,
                                 float *dgamma, float *dbeta, const void *dout, const void *in,
                                 const void *out, const float *gamma, const float *beta,
                                 const float *save_mean, const float *save_rstd) {
    visc_batchnorm2d *b = bn_for(ctx, s);
    if (!b) return -1;
    const float *dy = bn_read(s, dout), *x = bn_read(s, in), *y = bn_read(s, out);
    float *again =
        s->relu && !out ? bn_output_again(s, b, x, gamma, beta, save_mean, save_rstd) : NULL;
    float *dx = bn_target(s, din);
    visc_batchnorm2d_backward(b, dx, dgamma, dbeta, dy, x, again ? again : y, gamma, save_mean,
                              save_rstd);
    bn_write(s, din, dx);
    bn_done(s, dy), bn_done(s, x), bn_done(s, y);
    visc_free_aligned(again);
    return 0;
}

/* SyncBN's passes: the CPU's, with its acc (host memory on both sides) */
int visc_cuda_bn_sync_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                           const void *in) {
    const visc_batchnorm2d *b = bn_for(ctx, s);
    if (!b) return -1;
    const float *x = bn_read(s, in);
    visc_batchnorm2d_sync_sums(b, acc, x);
    bn_done(s, x);
    return 0;
}

int visc_cuda_bn_sync_sqdev(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                            float *save_mean, const void *in) {
    const visc_batchnorm2d *b = bn_for(ctx, s);
    if (!b) return -1;
    const float *x = bn_read(s, in);
    visc_batchnorm2d_sync_sqdev(b, acc, save_mean, x);
    bn_done(s, x);
    return 0;
}

int visc_cuda_bn_sync_finish(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                             void *out, float *save_mean, float *save_rstd, const void *in,
                             const float *gamma, const float *beta, float *running_mean,
                             float *running_var) {
    const visc_batchnorm2d *b = bn_for(ctx, s);
    if (!b) return -1;
    const float *x = bn_read(s, in);
    float *y = bn_target(s, out);
    visc_batchnorm2d_sync_finish(b, acc, y, save_mean, save_rstd, x, gamma, beta, running_mean,
                                 running_var);
    bn_write(s, out, y);
    bn_done(s, x);
    return 0;
}

int visc_cuda_bn_sync_grad_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                                float *dgamma, float *dbeta, const void *dout, const void *in,
                                const void *out, const float *save_mean, const float *save_rstd) {
    const visc_batchnorm2d *b = bn_for(ctx, s);
    if (!b) return -1;
    const float *dy = bn_read(s, dout), *x = bn_read(s, in), *y = bn_read(s, out);
    visc_batchnorm2d_sync_grad_sums(b, acc, dgamma, dbeta, dy, x, y, save_mean, save_rstd);
    bn_done(s, dy), bn_done(s, x), bn_done(s, y);
    return 0;
}

int visc_cuda_bn_sync_grad_input(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                                 void *din, const void *dout, const void *in, const void *out,
                                 const float *gamma, const float *save_mean,
                                 const float *save_rstd) {
    const visc_batchnorm2d *b = bn_for(ctx, s);
    if (!b) return -1;
    const float *dy = bn_read(s, dout), *x = bn_read(s, in), *y = bn_read(s, out);
    float *dx = bn_target(s, din);
    visc_batchnorm2d_sync_grad_input(b, acc, dx, dy, x, y, gamma, save_mean, save_rstd);
    bn_write(s, din, dx);
    bn_done(s, dy), bn_done(s, x), bn_done(s, y);
    return 0;
}

/* ---- pooling, elementwise, linear ---- */
static visc_pool2d *pool_for(visc_cuda *ctx, int N, int C, int H, int W, int k, int s, int pad) {
    const int key[7] = {N, C, H, W, k, s, pad};
    for (int i = 0; i < ctx->num_pool; i++)
        if (!memcmp(ctx->pool[i].key, key, sizeof key)) return &ctx->pool[i].op;
    if (ctx->num_pool == MAX_SHAPES) {
        visc_set_error("stand-in: more than %d pooling shapes", MAX_SHAPES);
        return NULL;
    }
    pool_entry *e = &ctx->pool[ctx->num_pool++];
    memcpy(e->key, key, sizeof key);
    visc_pool2d_init(&e->op, N, C, H, W, k, s, pad);
    return &e->op;
}

int visc_cuda_maxpool_forward(visc_cuda *ctx, float *out, int32_t *argmax, const float *in, int N,
                              int C, int H, int W, int kernel, int stride, int pad) {
    visc_pool2d *p = pool_for(ctx, N, C, H, W, kernel, stride, pad);
    if (!p) return -1;
    visc_maxpool2d_forward(p, out, argmax, in);
    return 0;
}

int visc_cuda_maxpool_backward(visc_cuda *ctx, float *din, const float *dout, const int32_t *argmax,
                               int N, int C, int H, int W, int kernel, int stride, int pad) {
    visc_pool2d *p = pool_for(ctx, N, C, H, W, kernel, stride, pad);
    if (!p) return -1;
    visc_maxpool2d_backward(p, din, dout, argmax);
    return 0;
}

int visc_cuda_global_avgpool_forward(visc_cuda *ctx, float *out, const float *in, int N, int C,
                                     int HW) {
    (void)ctx;
    visc_global_avgpool_forward(out, in, N, C, HW);
    return 0;
}

int visc_cuda_global_avgpool_backward(visc_cuda *ctx, float *din, const float *dout, int N, int C,
                                      int HW) {
    (void)ctx;
    visc_global_avgpool_backward(din, dout, N, C, HW);
    return 0;
}

int visc_cuda_relu_backward(visc_cuda *ctx, float *din, const float *dout, const float *out,
                            size_t n) {
    (void)ctx;
    visc_relu_backward(din, dout, out, n);
    return 0;
}

int visc_cuda_add(visc_cuda *ctx, float *out, const float *a, const float *b, size_t n) {
    (void)ctx;
    visc_add_forward(out, a, b, n);
    return 0;
}

int visc_cuda_add_relu_backward(visc_cuda *ctx, float *din, const float *a, const float *b,
                                const float *out, size_t n) {
    (void)ctx;
    visc_add_relu_backward(din, a, b, out, n);
    return 0;
}

int visc_cuda_add_relu(visc_cuda *ctx, float *out, const float *identity, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) { /* models/resnet.c's add_relu */
        const float v = out[i] + identity[i];
        out[i] = v > 0.0f ? v : 0.0f;
    }
    return 0;
}

/* bf16: the CPU's bf16 products, falling back to fp32 for a shape without
 * bf16 kernels exactly as the CPU's visc_linear_* do in bf16 mode. The
 * context's setting alone decides, as on a GPU: the fallback's result is
 * fp32 whatever the host's precision is. */
void visc_cuda_set_bf16(visc_cuda *ctx, int on) { ctx->bf16 = on != 0; }
int visc_cuda_bf16(const visc_cuda *ctx) { return ctx->bf16; }
/* The operand form here is the CPU's: fp32 (the linear layers round their
 * input themselves), and GELU's act falls back to fp32 where the CPU's
 * would (gelu_linear_in_bf16). */
int visc_cuda_operand_bytes(const visc_cuda *ctx) { return (void)ctx, 4; }

int visc_cuda_linear_forward(visc_cuda *ctx, float *out, const float *in, const float *weight,
                             const float *bias, int N, int in_features, int out_features) {
    if (!ctx->bf16 ||
        visc_linear_bf16_forward(out, in, weight, bias, N, in_features, out_features) != 0)
        visc_linear_forward(out, in, weight, bias, N, in_features, out_features);
    return 0;
}

int visc_cuda_linear_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                              const float *dout, const float *in, const float *weight, int N,
                              int in_features, int out_features) {
    if (!ctx->bf16 || visc_linear_bf16_backward(din, dweight, dbias, dout, in, weight, N,
                                                in_features, out_features) != 0)
        visc_linear_backward(din, dweight, dbias, dout, in, weight, N, in_features, out_features);
    return 0;
}

int visc_cuda_softmax_xent_forward(visc_cuda *ctx, float *loss, float *probs, const float *logits,
                                   const int32_t *labels, int N, int K, float smoothing) {
    (void)ctx;
    *loss = visc_softmax_xent_forward(probs, logits, labels, N, K, smoothing);
    return 0;
}

int visc_cuda_softmax_xent_backward(visc_cuda *ctx, float *dlogits, const float *probs,
                                    const int32_t *labels, int N, int K, float smoothing) {
    (void)ctx;
    visc_softmax_xent_backward(dlogits, probs, labels, N, K, smoothing);
    return 0;
}

int visc_cuda_l2_normalize_forward(visc_cuda *ctx, float *y, float *norms, const float *x, int n,
                                   int D) {
    (void)ctx;
    visc_l2_normalize_forward(y, norms, x, n, D);
    return 0;
}

/* As the CPU's caller does it: the weight applied to the gradient (here in
 * dx, a copy of dy unless it is dy), then normalized back in place. */
int visc_cuda_l2_normalize_backward(visc_cuda *ctx, float *dx, const float *dy, const float *y,
                                    const float *norms, int n, int D, float scale) {
    (void)ctx;
    const size_t count = (size_t)n * D;
    if (dx != dy) memcpy(dx, dy, count * sizeof(float));
    for (size_t i = 0; scale != 1.0f && i < count; i++) dx[i] *= scale;
    visc_l2_normalize_backward(dx, dx, y, norms, n, D);
    return 0;
}

/* The CPU's loss against the bank the caller holds on the "device" (a
 * memory bank struct over it: the CPU function reads only bank, size, dim);
 * its scratch [n, K + 1] fits in the work buffer. */
int visc_cuda_infonce(visc_cuda *ctx, float *loss, float *dq, const float *q, const float *k,
                      const float *bank, int n, int K, int D, float t, float *work) {
    (void)ctx;
    visc_memory_bank mb = {.bank = (float *)bank, .size = K, .dim = D};
    *loss = visc_infonce_forward_backward(dq, q, k, &mb, n, t, work);
    return 0;
}

/* The CPU's arithmetic between NT-Xent's collectives (visc_ntxent_local),
 * in buffers of its own (the device work buffer is smaller than the CPU's
 * scratch); one rank: the candidates' gradient added to the anchors' as
 * the CPU's visc_ntxent_forward_backward adds it. */
int visc_cuda_ntxent(visc_cuda *ctx, float *loss, float *dz, float *dall, const float *z,
                     const float *all, int n, int N, int rank, int D, float t, float *work) {
    (void)ctx, (void)work;
    const size_t view = (size_t)n * D, rows = (size_t)2 * N * D;
    float *sim = malloc((size_t)2 * n * 2 * N * sizeof(float));
    float *dA = malloc(2 * view * sizeof(float)), *dc = malloc(rows * sizeof(float));
    if (!sim || !dA || !dc) {
        free(sim), free(dA), free(dc);
        return visc_set_error("stand-in NT-Xent: out of memory");
    }
    *loss = visc_ntxent_local(z, all, n, N, rank, D, t, sim, dA, dc);
    if (dz && dall) {
        memcpy(dz, dA, 2 * view * sizeof(float));
        memcpy(dall, dc, rows * sizeof(float));
    } else if (dz) {
        for (size_t j = 0; j < 2 * view; j++) dz[j] = dA[j] + dc[j];
    }
    free(sim), free(dA), free(dc);
    return 0;
}

int visc_cuda_softmax_xent_soft_forward(visc_cuda *ctx, float *loss, float *probs,
                                        const float *logits, const float *targets, int N, int K) {
    (void)ctx;
    *loss = visc_softmax_xent_soft_forward(probs, logits, targets, N, K);
    return 0;
}

int visc_cuda_softmax_xent_soft_backward(visc_cuda *ctx, float *dlogits, const float *probs,
                                         const float *targets, int N, int K) {
    (void)ctx;
    visc_softmax_xent_soft_backward(dlogits, probs, targets, N, K);
    return 0;
}

int visc_cuda_topk_correct(visc_cuda *ctx, int32_t *counts, const float *logits,
                           const int32_t *labels, int N, int K) {
    on_device(ctx, counts, 2 * sizeof(int32_t), "top-k counts");
    int top1, top5;
    visc_topk_correct(logits, labels, N, K, &top1, &top5);
    counts[0] = top1;
    counts[1] = top5;
    return 0;
}

/* ---- the token layers ---- */
int visc_cuda_layernorm_forward(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                const float *in, const float *gamma, const float *beta,
                                int64_t rows, int C, float eps) {
    (void)ctx;
    visc_layernorm_forward(out, save_mean, save_rstd, in, gamma, beta, rows, C, eps);
    return 0;
}

int visc_cuda_layernorm_backward(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                 const float *dout, const float *in, const float *gamma,
                                 const float *save_mean, const float *save_rstd, int64_t rows,
                                 int C) {
    (void)ctx;
    visc_layernorm_backward(din, dgamma, dbeta, dout, in, gamma, save_mean, save_rstd, rows, C);
    return 0;
}

int visc_cuda_layernorm_backward_add(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                     const float *dout, const float *in, const float *gamma,
                                     const float *save_mean, const float *save_rstd, int64_t rows,
                                     int C) {
    (void)ctx;
    visc_layernorm_backward_add(din, dgamma, dbeta, dout, in, gamma, save_mean, save_rstd, rows, C);
    return 0;
}

int visc_cuda_gelu_forward(visc_cuda *ctx, float *out, const float *in, size_t n) {
    (void)ctx;
    visc_gelu_forward(out, in, n);
    return 0;
}

int visc_cuda_gelu_backward(visc_cuda *ctx, float *din, const float *dout, const float *in,
                            size_t n) {
    (void)ctx;
    visc_gelu_backward(din, dout, in, n);
    return 0;
}

/* A layer norm for a linear layer, and that layer: the operand form is
 * fp32 here, as on the CPU, whose bf16 linear layer rounds its input
 * itself (the stand-in's linear layer above does the same). */
int visc_cuda_layernorm_operand_forward(visc_cuda *ctx, float *out, float *save_mean,
                                        float *save_rstd, const float *in, const float *gamma,
                                        const float *beta, int64_t rows, int C, float eps) {
    return visc_cuda_layernorm_forward(ctx, out, save_mean, save_rstd, in, gamma, beta, rows, C,
                                       eps);
}

int visc_cuda_attention_operand_forward(visc_cuda *ctx, const visc_attention *a, float *out,
                                        float *lse, const float *q, const float *k,
                                        const float *v) {
    return visc_cuda_attention_forward(ctx, a, out, lse, q, k, v);
}

int visc_cuda_attention_operand_backward(visc_cuda *ctx, const visc_attention *a, float *dq,
                                         float *dk, float *dv, float *dbias, float *dhead_scale,
                                         const float *dout, const float *q, const float *k,
                                         const float *v, const float *out, const float *lse) {
    return visc_cuda_attention_backward(ctx, a, dq, dk, dv, dbias, dhead_scale, dout, q, k, v, out,
                                        lse);
}

int visc_cuda_linear_operand_forward(visc_cuda *ctx, float *out, const float *in,
                                     const float *weight, const float *bias, int N, int in_features,
                                     int out_features) {
    return visc_cuda_linear_forward(ctx, out, in, weight, bias, N, in_features, out_features);
}

int visc_cuda_linear_operands_forward(visc_cuda *ctx, float *out, const float *in,
                                      const float *weight, const float *bias, int N,
                                      int in_features, int out_features) {
    return visc_cuda_linear_forward(ctx, out, in, weight, bias, N, in_features, out_features);
}

int visc_cuda_linear_forward_to_operand(visc_cuda *ctx, float *out, const float *in,
                                        const float *weight, const float *bias, int N,
                                        int in_features, int out_features) {
    return visc_cuda_linear_forward(ctx, out, in, weight, bias, N, in_features, out_features);
}

int visc_cuda_linear_operand_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                                      const float *dout, const float *in, const float *weight,
                                      int N, int in_features, int out_features) {
    return visc_cuda_linear_backward(ctx, din, dweight, dbias, dout, in, weight, N, in_features,
                                     out_features);
}

/* GELU then the linear layer as the CPU's gelu_linear.c in the context's
 * precision (the host's stays fp32 under --device): act in bf16 where the
 * CPU's bf16 mode would keep it so, else fp32 and the linear layer above,
 * decided alike by every call. */
static int gelu_linear_in_bf16(const visc_cuda *ctx, int N, int hidden, int out_features,
                               int has_bias) {
    return ctx->bf16 && visc_linear_bf16_shape_ready(N, hidden, out_features, has_bias);
}

int visc_cuda_gelu_linear_act(visc_cuda *ctx, float *act, const float *h, int N, int hidden,
                              int out_features, int has_bias) {
    if (gelu_linear_in_bf16(ctx, N, hidden, out_features, has_bias))
        visc_gelu_forward_bf16((void *)act, h, (size_t)N * hidden);
    else visc_gelu_forward(act, h, (size_t)N * hidden);
    return 0;
}

int visc_cuda_gelu_linear_forward(visc_cuda *ctx, float *out, float *act, const float *h,
                                  const float *weight, const float *bias, int N, int hidden,
                                  int out_features) {
    visc_cuda_gelu_linear_act(ctx, act, h, N, hidden, out_features, bias != NULL);
    if (!gelu_linear_in_bf16(ctx, N, hidden, out_features, bias != NULL))
        visc_cuda_linear_forward(ctx, out, act, weight, bias, N, hidden, out_features);
    else if (visc_linear_bf16_forward_rounded(out, (const void *)act, weight, bias, N, hidden,
                                              out_features) != 0)
        visc_die("stand-in gelu_linear: bf16 product unavailable after the check");
    return 0;
}

int visc_cuda_gelu_linear_backward(visc_cuda *ctx, float *dh, float *dweight, float *dbias,
                                   const float *dout, const float *act, const float *h,
                                   const float *weight, int N, int hidden, int out_features) {
    if (!gelu_linear_in_bf16(ctx, N, hidden, out_features, dbias != NULL))
        visc_cuda_linear_backward(ctx, dh, dweight, dbias, dout, act, weight, N, hidden,
                                  out_features);
    else if (visc_linear_bf16_backward_rounded(dh, dweight, dbias, dout, (const void *)act, weight,
                                               N, hidden, out_features) != 0)
        visc_die("stand-in gelu_linear: bf16 product unavailable after the check");
    visc_gelu_backward(dh, dh, h, (size_t)N * hidden);
    return 0;
}

/* The MLP's backward: the two calls it is defined to equal. */
int visc_cuda_mlp_backward(visc_cuda *ctx, float *din, float *dweight1, float *dbias1,
                           float *dweight2, float *dbias2, float *dact, const float *dout,
                           const float *in, const float *h, const float *act, const float *weight1,
                           const float *weight2, int N, int in_features, int hidden,
                           int out_features) {
    visc_cuda_gelu_linear_backward(ctx, dact, dweight2, dbias2, dout, act, h, weight2, N, hidden,
                                   out_features);
    return visc_cuda_linear_operand_backward(ctx, din, dweight1, dbias1, dact, in, weight1, N,
                                             in_features, hidden);
}

int visc_cuda_attention_forward(visc_cuda *ctx, const visc_attention *a, float *out, float *lse,
                                const float *q, const float *k, const float *v) {
    (void)ctx;
    visc_attention_forward(a, out, lse, q, k, v);
    return 0;
}

int visc_cuda_attention_backward(visc_cuda *ctx, const visc_attention *a, float *dq, float *dk,
                                 float *dv, float *dbias, float *dhead_scale, const float *dout,
                                 const float *q, const float *k, const float *v, const float *out,
                                 const float *lse) {
    (void)ctx;
    visc_attention_backward(a, dq, dk, dv, dbias, dhead_scale, dout, q, k, v, out, lse);
    return 0;
}

static visc_conv2d *patch_for(visc_cuda *ctx, const visc_cuda_patch_shape *p) {
    for (int i = 0; i < ctx->num_patch; i++)
        if (!memcmp(&ctx->patch[i].key, p, sizeof *p)) return &ctx->patch[i].op;
    if (ctx->num_patch == MAX_SHAPES) {
        visc_set_error("stand-in: more than %d patch embedding shapes", MAX_SHAPES);
        return NULL;
    }
    patch_entry *e = &ctx->patch[ctx->num_patch++];
    e->key = *p;
    visc_conv2d_init(&e->op, p->B, p->in_channels, p->image, p->image, p->C, p->patch, p->patch,
                     p->patch, 0, 1, 1, 1);
    return &e->op;
}

/* The transposes are models/transformer_common.c's. */
int visc_cuda_patch_embed_forward(visc_cuda *ctx, const visc_cuda_patch_shape *p, float *tokens,
                                  float *conv_out, const float *image, const float *weight,
                                  const float *bias) {
    visc_conv2d *c = patch_for(ctx, p);
    if (!c) return -1;
    visc_conv2d_forward(c, conv_out, image, weight, bias);
    const int L = c->P * c->Q;
    for (int b = 0; b < p->B; b++)
        for (int l = 0; l < L; l++)
            for (int ch = 0; ch < p->C; ch++)
                tokens[((size_t)b * p->tokens + p->first + l) * p->C + ch] =
                    conv_out[((size_t)b * p->C + ch) * L + l];
    return 0;
}

int visc_cuda_patch_embed_backward(visc_cuda *ctx, const visc_cuda_patch_shape *p, float *dweight,
                                   float *dbias, float *dconv, const float *dtokens,
                                   const float *image) {
    visc_conv2d *c = patch_for(ctx, p);
    if (!c) return -1;
    const int L = c->P * c->Q;
    for (int b = 0; b < p->B; b++)
        for (int ch = 0; ch < p->C; ch++)
            for (int l = 0; l < L; l++)
                dconv[((size_t)b * p->C + ch) * L + l] =
                    dtokens[((size_t)b * p->tokens + p->first + l) * p->C + ch];
    visc_conv2d_backward(c, NULL, dweight, dbias, dconv, image, NULL);
    return 0;
}

int visc_cuda_add_broadcast(visc_cuda *ctx, float *x, const float *table, int B, int64_t NC) {
    (void)ctx;
    visc_add_broadcast_forward(x, table, B, NC);
    return 0;
}

/* Row by row, as the CPU's sums over sequences (the position table's
 * gradient, the class token's) add them. */
int visc_cuda_sum_rows(visc_cuda *ctx, float *out, const float *a, int64_t rows, int C) {
    (void)ctx;
    for (int c = 0; c < C; c++) out[c] = 0.0f;
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) out[c] += a[r * C + c];
    return 0;
}

int visc_cuda_droppath_add_forward(visc_cuda *ctx, float *out, const float *x, const float *branch,
                                   const float *keep, int B, size_t per_sample) {
    (void)ctx;
    for (int b = 0; b < B; b++) { /* nn/droppath.c's loop */
        const float k = keep[b];
        float *ob = out + (size_t)b * per_sample;
        const float *xb = x + (size_t)b * per_sample, *yb = branch + (size_t)b * per_sample;
        if (k == 1.0f)
            for (size_t i = 0; i < per_sample; i++) ob[i] = xb[i] + yb[i];
        else if (k != 0.0f)
            for (size_t i = 0; i < per_sample; i++) ob[i] = xb[i] + k * yb[i];
        else if (ob != xb) memcpy(ob, xb, per_sample * sizeof(float));
    }
    return 0;
}

int visc_cuda_droppath_add_kept(visc_cuda *ctx, float *out, const float *x, const float *branch,
                                float *keep, int B, size_t per_sample) {
    for (int b = 0; b < B; b++) keep[b] = 1.0f;
    return visc_cuda_droppath_add_forward(ctx, out, x, branch, keep, B, per_sample);
}

int visc_cuda_droppath_add_backward(visc_cuda *ctx, float *dbranch, const float *dx,
                                    const float *keep, int B, size_t per_sample) {
    (void)ctx;
    visc_droppath_add_backward(dbranch, dx, keep, B, per_sample);
    return 0;
}

int visc_cuda_copy_rows(visc_cuda *ctx, float *dst, int64_t dst_stride, const float *src,
                        int64_t src_stride, int64_t rows, int count) {
    (void)ctx;
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * dst_stride, src + r * src_stride, (size_t)count * sizeof(float));
    return 0;
}

int visc_cuda_relu_forward(visc_cuda *ctx, float *out, const float *in, size_t n) {
    (void)ctx;
    visc_relu_forward(out, in, n);
    return 0;
}

int visc_cuda_token_mean_forward(visc_cuda *ctx, float *out, const float *in, int B, int N, int C) {
    (void)ctx;
    visc_token_mean_forward(out, in, B, N, C);
    return 0;
}

int visc_cuda_token_mean_backward(visc_cuda *ctx, float *din, const float *dout, int B, int N,
                                  int C) {
    (void)ctx;
    visc_token_mean_backward(din, dout, B, N, C);
    return 0;
}

/* ---- Swin: models/swin_window.c's maps ---- */
static visc_swin_grid grid_of(const visc_cuda_swin_grid *g) {
    visc_swin_grid s = {.H = g->H, .W = g->W, .wh = g->wh, .ww = g->ww, .sh = g->sh, .sw = g->sw};
    s.nw = (g->H / g->wh) * (g->W / g->ww);
    s.N = g->wh * g->ww;
    return s;
}

int visc_cuda_swin_partition(visc_cuda *ctx, float *out, const float *in,
                             const visc_cuda_swin_grid *g, int B, int C) {
    (void)ctx;
    const visc_swin_grid s = grid_of(g);
    visc_swin_partition(out, in, &s, B, C);
    return 0;
}

int visc_cuda_swin_reverse(visc_cuda *ctx, float *out, const float *in,
                           const visc_cuda_swin_grid *g, int B, int C) {
    (void)ctx;
    const visc_swin_grid s = grid_of(g);
    visc_swin_reverse(out, in, &s, B, C);
    return 0;
}

typedef void (*swin_permute_fn)(float *out, const float *in, const visc_swin_grid *g, int B, int C);

/* The norm of the [B H W, C] rows `in` into a temporary, then `permute`
 * of it into out. */
static int norm_then_permute(float *out, float *save_mean, float *save_rstd, const float *in,
                             const float *gamma, const float *beta, const visc_cuda_swin_grid *g,
                             int B, int C, float eps, swin_permute_fn permute) {
    const visc_swin_grid s = grid_of(g);
    const int64_t rows = (int64_t)B * g->H * g->W;
    float *normed = visc_malloc(sizeof(float) * (size_t)(rows * C), "stand-in");
    visc_layernorm_forward(normed, save_mean, save_rstd, in, gamma, beta, rows, C, eps);
    permute(out, normed, &s, B, C);
    free(normed);
    return 0;
}

/* The operand form is fp32 here: the partition itself. */
int visc_cuda_swin_partition_operand(visc_cuda *ctx, float *out, const float *in,
                                     const visc_cuda_swin_grid *g, int B, int C) {
    return visc_cuda_swin_partition(ctx, out, in, g, B, C);
}

int visc_cuda_swin_reverse_add(visc_cuda *ctx, float *acc, const float *in,
                               const visc_cuda_swin_grid *g, int B, int C) {
    const visc_swin_grid s = grid_of(g);
    const size_t n = (size_t)B * g->H * g->W * C;
    float *tokens = visc_malloc(sizeof(float) * n, "stand-in");
    visc_swin_reverse(tokens, in, &s, B, C);
    visc_add_inplace(acc, tokens, n);
    free(tokens);
    (void)ctx;
    return 0;
}

/* Swin V2's post-norm from windowed rows, and its backward to them: the
 * CPU's calls (models/swin.c's), the norm over the windowed rows with a
 * temporary of the stand-in's own in the token-order side's place. */
int visc_cuda_layernorm_from_windows(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                     const float *in, const float *gamma, const float *beta,
                                     const visc_cuda_swin_grid *g, int B, int C, float eps) {
    (void)ctx;
    return norm_then_permute(out, save_mean, save_rstd, in, gamma, beta, g, B, C, eps,
                             visc_swin_reverse);
}

int visc_cuda_layernorm_backward_to_windows(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                            const float *dout, const float *in, const float *gamma,
                                            const float *save_mean, const float *save_rstd,
                                            const visc_cuda_swin_grid *g, int B, int C) {
    const visc_swin_grid s = grid_of(g);
    const int64_t rows = (int64_t)B * g->H * g->W;
    float *windowed = visc_malloc(sizeof(float) * (size_t)(rows * C), "stand-in");
    visc_swin_partition(windowed, dout, &s, B, C);
    visc_layernorm_backward(din, dgamma, dbeta, windowed, in, gamma, save_mean, save_rstd, rows, C);
    free(windowed);
    (void)ctx;
    return 0;
}

/* The projection's backward from token order: the partition, then the layer's backward. */
int visc_cuda_linear_operand_backward_from_windows(visc_cuda *ctx, float *din, float *dweight,
                                                   float *dbias, const float *dout, float *windowed,
                                                   const visc_cuda_swin_grid *g, int B,
                                                   const float *in, const float *weight,
                                                   int in_features, int out_features) {
    return visc_cuda_swin_partition(ctx, windowed, dout, g, B, out_features) ||
                   visc_cuda_linear_operand_backward(ctx, din, dweight, dbias, windowed, in, weight,
                                                     B * g->H * g->W, in_features, out_features)
               ? -1
               : 0;
}

/* Swin V1's first norm with the partition after it, and its backward: the
 * CPU's two calls each, through a temporary of the stand-in's own (the GPU
 * does them in one pass; the rows' values are no different). */
int visc_cuda_layernorm_operand_to_windows(visc_cuda *ctx, float *out, float *save_mean,
                                           float *save_rstd, const float *in, const float *gamma,
                                           const float *beta, const visc_cuda_swin_grid *g, int B,
                                           int C, float eps) {
    (void)ctx;
    return norm_then_permute(out, save_mean, save_rstd, in, gamma, beta, g, B, C, eps,
                             visc_swin_partition);
}

int visc_cuda_layernorm_backward_from_windows_add(visc_cuda *ctx, float *din, float *dgamma,
                                                  float *dbeta, const float *dout, const float *in,
                                                  const float *gamma, const float *save_mean,
                                                  const float *save_rstd,
                                                  const visc_cuda_swin_grid *g, int B, int C) {
    const visc_swin_grid s = grid_of(g);
    const int64_t rows = (int64_t)B * g->H * g->W;
    float *tokens = visc_malloc(sizeof(float) * (size_t)(rows * C), "stand-in");
    visc_swin_reverse(tokens, dout, &s, B, C);
    visc_layernorm_backward_add(din, dgamma, dbeta, tokens, in, gamma, save_mean, save_rstd, rows,
                                C);
    free(tokens);
    (void)ctx;
    return 0;
}

int visc_cuda_droppath_add_from_windows(visc_cuda *ctx, float *out, const float *x,
                                        const float *branch, float *keep, int all_kept,
                                        const visc_cuda_swin_grid *g, int B, int C) {
    const visc_swin_grid s = grid_of(g);
    const size_t per_sample = (size_t)g->H * g->W * C;
    float *tokens = visc_malloc(sizeof(float) * per_sample * B, "stand-in");
    visc_swin_reverse(tokens, branch, &s, B, C);
    const int rc = all_kept
                       ? visc_cuda_droppath_add_kept(ctx, out, x, tokens, keep, B, per_sample)
                       : visc_cuda_droppath_add_forward(ctx, out, x, tokens, keep, B, per_sample);
    free(tokens);
    return rc;
}

int visc_cuda_swin_gather_bias(visc_cuda *ctx, float *bias, const float *table, const int32_t *rel,
                               int H, int N, int sigmoid16) {
    (void)ctx;
    visc_swin_gather_bias(bias, table, rel, H, N, sigmoid16);
    return 0;
}

int visc_cuda_swin_scatter_bias(visc_cuda *ctx, float *dtable, const float *dbias,
                                const float *bias, const int32_t *rel, int T, int H, int N,
                                int sigmoid16) {
    (void)ctx;
    visc_swin_scatter_bias(dtable, dbias, bias, rel, T, H, N, sigmoid16);
    return 0;
}

int visc_cuda_swin_qkv_operand(visc_cuda *ctx, float *qkv, float *qnorm, float *knorm,
                               const float *raw, int64_t rows, int H, int D) {
    (void)ctx;
    visc_swin_normalize_qk(qkv, qnorm, knorm, raw, rows, H, D);
    return 0;
}

int visc_cuda_swin_normalize_heads_backward(visc_cuda *ctx, float *dx, int64_t ld_dx,
                                            const float *dy, int64_t ld_dy, const float *y,
                                            int64_t ld_y, const float *norms, int64_t rows, int H,
                                            int D) {
    (void)ctx;
    visc_swin_normalize_heads_backward(dx, ld_dx, dy, ld_dy, y, ld_y, norms, rows, H, D);
    return 0;
}

int visc_cuda_swin_merge_copy(visc_cuda *ctx, float *tokens, float *merged, int B, int H, int W,
                              int C, int back) {
    (void)ctx;
    visc_swin_merge_copy(tokens, merged, B, H, W, C, back);
    return 0;
}

/* models/swin.c's loops */
int visc_cuda_swin_head_scale(visc_cuda *ctx, float *hs, const float *logit_scale, int H) {
    (void)ctx;
    for (int h = 0; h < H; h++) hs[h] = expf(fminf(logit_scale[h], logf(100.0f)));
    return 0;
}

int visc_cuda_swin_head_scale_backward(visc_cuda *ctx, float *dlogit_scale,
                                       const float *logit_scale, const float *dhs, const float *hs,
                                       int H) {
    (void)ctx;
    for (int h = 0; h < H; h++)
        dlogit_scale[h] = logit_scale[h] <= logf(100.0f) ? dhs[h] * hs[h] : 0.0f;
    return 0;
}

/* ---- CaiT: models/talking_heads.c's steps, nn/layerscale.c ---- */
int visc_cuda_th_scores(visc_cuda *ctx, float *S, const float *qkv, const visc_th_dims *d) {
    (void)ctx;
    visc_th_scores(S, qkv, d);
    return 0;
}

int visc_cuda_th_mix(visc_cuda *ctx, float *out, const float *in, const float *W, const float *bias,
                     int B, int H, size_t TT, int transpose) {
    (void)ctx;
    visc_th_mix(out, in, W, bias, B, H, TT, transpose);
    return 0;
}

int visc_cuda_th_softmax(visc_cuda *ctx, float *P, size_t rows, int T) {
    (void)ctx;
    visc_th_softmax(P, rows, T);
    return 0;
}

int visc_cuda_th_apply(visc_cuda *ctx, float *att, const float *A, const float *qkv,
                       const visc_th_dims *d) {
    (void)ctx;
    visc_th_apply(att, A, qkv, d);
    return 0;
}

int visc_cuda_th_grad_a(visc_cuda *ctx, float *dA, const float *datt, const float *qkv,
                        const visc_th_dims *d) {
    (void)ctx;
    visc_th_grad_a(dA, datt, qkv, d);
    return 0;
}

int visc_cuda_th_grad_v(visc_cuda *ctx, float *dqkv, const float *A, const float *datt,
                        const visc_th_dims *d) {
    (void)ctx;
    visc_th_grad_v(dqkv, A, datt, d);
    return 0;
}

int visc_cuda_th_mix_grad(visc_cuda *ctx, float *dW, float *db, const float *dY, const float *X,
                          int B, int H, size_t TT) {
    (void)ctx;
    visc_th_mix_grad(dW, db, dY, X, B, H, TT);
    return 0;
}

int visc_cuda_th_softmax_backward(visc_cuda *ctx, float *dS, const float *P, size_t rows, int T) {
    (void)ctx;
    visc_th_softmax_backward(dS, P, rows, T);
    return 0;
}

int visc_cuda_th_grad_qk(visc_cuda *ctx, float *dqkv, const float *dS, const float *qkv,
                         const visc_th_dims *d) {
    (void)ctx;
    visc_th_grad_qk(dqkv, dS, qkv, d);
    return 0;
}

int visc_cuda_layerscale_forward(visc_cuda *ctx, float *out, const float *in, const float *gamma,
                                 int64_t rows, int C) {
    (void)ctx;
    visc_layerscale_forward(out, in, gamma, rows, C);
    return 0;
}

int visc_cuda_layerscale_backward(visc_cuda *ctx, float *din, float *dgamma, const float *dout,
                                  const float *in, const float *gamma, int64_t rows, int C) {
    (void)ctx;
    visc_layerscale_backward(din, dgamma, dout, in, gamma, rows, C);
    return 0;
}

/* ---- the optimizer: the CPU's step on the state buffer it is handed ---- */
struct visc_cuda_optim {
    visc_optimizer cpu;
};

visc_cuda_optim *visc_cuda_optim_create(visc_cuda *ctx, const visc_optimizer *cpu) {
    (void)ctx;
    visc_cuda_optim *o = visc_calloc(1, sizeof *o, "stand-in optimizer");
    visc_optimizer_init(&o->cpu, &cpu->cfg, cpu->params);
    return o;
}

int visc_cuda_optim_step(visc_cuda_optim *o, float *params, const float *grads, float *state,
                         float lr, int64_t step) {
    float *own = o->cpu.state;
    o->cpu.state = state;
    o->cpu.step = step;
    visc_optimizer_step(&o->cpu, params, grads, lr);
    o->cpu.state = own;
    return 0;
}

int visc_cuda_normalize_bytes(visc_cuda *ctx, float *out, const uint8_t *in, size_t images,
                              size_t plane, const float mean[3], const float std[3]) {
    on_device(ctx, in, images * 3 * plane, "normalize bytes (input)");
    on_device(ctx, out, images * 3 * plane * sizeof(float), "normalize bytes (output)");
    visc_normalize_bytes(in, images, plane, mean, std, out);
    return 0;
}

int visc_cuda_ema_update(visc_cuda *ctx, float *ema, const float *params, size_t n, float decay) {
    (void)ctx;
    visc_ema_update(ema, params, n, decay);
    return 0;
}

int visc_cuda_clip_grad_norm(visc_cuda *ctx, float *grads, size_t n, float max_norm) {
    (void)ctx;
    visc_clip_grad_norm(grads, n, max_norm);
    return 0;
}

void visc_cuda_optim_destroy(visc_cuda_optim *opt) {
    visc_optimizer_free(&opt->cpu);
    free(opt);
}

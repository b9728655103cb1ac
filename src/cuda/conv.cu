/* conv.cu: convolutions through cuDNN's convolution calls, with a plan per
 * shape.
 *
 * A plan holds the shape's descriptors and, per direction, the algorithm
 * and its workspace size, chosen on first use: cuDNN's heuristic list
 * (the _v7 queries, no timing runs, so the choice does not depend on the
 * machine's load; or, asked for, its timed search's, fastest first:
 * visc_cuda_set_conv_benchmark), first entry that succeeded, is deterministic (the
 * backward-weights algorithms 0 and 3 add with atomics; bf16 takes a
 * non-deterministic one, and says so, only where none is), for fp32 is a
 * GEMM-like algorithm (no FFT, no Winograd), and fits
 * VISC_CONV_WORKSPACE_MAX. fp32 runs with CUDNN_FMA_MATH: cuDNN's default
 * math allows TF32 on Hopper (10 mantissa bits), which would break parity
 * with the CPU; bf16 runs on tensor cores with fp32 accumulation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if __has_include(<cudnn.h>)
#include "cudnn_dl.cuh"

#define VISC_CONV_PLANS 64
#define VISC_CONV_WORKSPACE_MAX ((size_t)256 << 20)
/* entries asked of each heuristic: an algorithm may be listed once per math
 * type, more than the *_ALGO_COUNT algorithms */
#define VISC_CONV_HEURISTICS 32

enum { FWD, BWD_DATA, BWD_FILTER, DIRECTIONS };
static const char *const direction_name[DIRECTIONS] = {"forward", "backward-data",
                                                       "backward-weights"};

typedef struct {
    visc_cuda_conv_shape shape;
    int valid;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    int chosen[DIRECTIONS];
    int algo[DIRECTIONS]; /* cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t */
    cudnnMathType_t math[DIRECTIONS];
    size_t ws[DIRECTIONS];
} conv_plan;

struct visc_conv_state {
    cudnnHandle_t handle;
    conv_plan plans[VISC_CONV_PLANS];
    int next; /* the slot the next new shape takes (the oldest: round robin) */
    void *ws;
    size_t ws_bytes;
};

static void plan_release(conv_plan *p) {
    if (p->conv) visc_dnn.conv_destroy(p->conv);
    if (p->w) visc_dnn.filter_destroy(p->w);
    if (p->y) visc_dnn.tensor_destroy(p->y);
    if (p->x) visc_dnn.tensor_destroy(p->x);
    memset(p, 0, sizeof *p);
}

void visc_conv_state_free(visc_cuda *ctx) {
    visc_conv_state *st = ctx->conv;
    if (!st) return;
    for (int i = 0; i < VISC_CONV_PLANS; i++) plan_release(&st->plans[i]);
    if (st->handle) visc_dnn.destroy(st->handle);
    visc_cuda_free(ctx, st->ws);
    free(st);
    ctx->conv = NULL;
}

static visc_conv_state *state(visc_cuda *ctx) {
    if (ctx->conv) return ctx->conv;
    if (visc_dnn_load()) return NULL;
    visc_conv_state *st = (visc_conv_state *)calloc(1, sizeof *st);
    if (!st) {
        visc_set_error("out of memory allocating the convolution plans");
        return NULL;
    }
    if (visc_dnn_check(visc_dnn.create(&st->handle), "cudnnCreate") ||
        visc_dnn_check(visc_dnn.set_stream(st->handle, ctx->stream), "cudnnSetStream")) {
        if (st->handle) visc_dnn.destroy(st->handle);
        free(st);
        return NULL;
    }
    ctx->conv = st;
    return st;
}

static int out_size(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

static int shape_check(const visc_cuda_conv_shape *s) {
    if (!s || s->N <= 0 || s->C <= 0 || s->H <= 0 || s->W <= 0 || s->K <= 0 || s->R <= 0 ||
        s->S <= 0 || s->stride <= 0 || s->pad < 0 ||
        (s->type != VISC_CUDA_CONV_F32_NCHW && s->type != VISC_CUDA_CONV_BF16_NHWC &&
         s->type != VISC_CUDA_CONV_BF16_NHWC_F32W))
        return visc_set_error("convolution: bad shape");
    if (s->H + 2 * s->pad < s->R || s->W + 2 * s->pad < s->S)
        return visc_set_error("convolution: kernel %dx%d larger than the padded %dx%d input", s->R,
                              s->S, s->H + 2 * s->pad, s->W + 2 * s->pad);
    return 0;
}

static int plan_describe(conv_plan *p, const visc_cuda_conv_shape *s) {
    const int bf16 = s->type == VISC_CUDA_CONV_BF16_NHWC;
    const cudnnTensorFormat_t fmt = bf16 ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    const cudnnDataType_t dt = bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    const int P = out_size(s->H, s->R, s->stride, s->pad),
              Q = out_size(s->W, s->S, s->stride, s->pad);
    p->shape = *s;
    return visc_dnn_check(visc_dnn.tensor_create(&p->x), "convolution input descriptor") ||
                   visc_dnn_check(visc_dnn.tensor_create(&p->y), "convolution output descriptor") ||
                   visc_dnn_check(visc_dnn.filter_create(&p->w), "convolution filter descriptor") ||
                   visc_dnn_check(visc_dnn.conv_create(&p->conv), "convolution descriptor") ||
                   visc_dnn_check(visc_dnn.tensor_set(p->x, fmt, dt, s->N, s->C, s->H, s->W),
                                  "convolution input shape") ||
                   visc_dnn_check(visc_dnn.tensor_set(p->y, fmt, dt, s->N, s->K, P, Q),
                                  "convolution output shape") ||
                   visc_dnn_check(visc_dnn.filter_set(p->w, dt, fmt, s->K, s->C, s->R, s->S),
                                  "convolution filter shape") ||
                   /* fp32 accumulation in both forms */
                   visc_dnn_check(visc_dnn.conv_set(p->conv, s->pad, s->pad, s->stride, s->stride,
                                                    1, 1, CUDNN_CROSS_CORRELATION,
                                                    CUDNN_DATA_FLOAT),
                                  "convolution settings") ||
                   visc_dnn_check(visc_dnn.conv_math(p->conv,
                                                     bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
                                  "convolution math type")
               ? -1
               : 0;
}

static conv_plan *plan_for(visc_conv_state *st, const visc_cuda_conv_shape *s) {
    for (int i = 0; i < VISC_CONV_PLANS; i++)
        if (st->plans[i].valid && memcmp(&st->plans[i].shape, s, sizeof *s) == 0)
            return &st->plans[i];
    conv_plan *p = &st->plans[st->next];
    st->next = (st->next + 1) % VISC_CONV_PLANS;
    plan_release(p);
    if (plan_describe(p, s)) {
        plan_release(p);
        return NULL;
    }
    p->valid = 1;
    return p;
}

/* Whether a heuristic entry is usable: it ran and is deterministic; for
 * fp32, it is one of the GEMM-like algorithms (FFT and Winograd transform
 * the operands and round far from the CPU's fp32 products, cuda.h's
 * contract) and not a tensor-core (TF32) kernel: in the first pass one
 * that cuDNN lists with FMA math, in the second one listed with its
 * default math (forced to FMA then). */
static int gemm_like(int dir, int algo) {
    switch (dir) {
    case FWD:
        return algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
               algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || algo == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
    case BWD_DATA:
        return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 ||
               algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    default:
        return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
               algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
               algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
    }
}

/* bf16's second pass (BF16_ANY_DETERMINISM) takes a non-deterministic
 * entry where the heuristic lists no deterministic one: cuDNN's
 * documentation leaves open which kernels a channel count that is not a
 * multiple of 8 (a stem's 3) gets, and a run that stops at its first
 * backward would be worse than one whose stem's weight gradient may
 * differ in its last bits from run to run (said once, below). */
enum { BF16_ANY_DETERMINISM = 1 };

template <typename Perf> static int acceptable(const Perf &r, int dir, int bf16, int pass) {
    if (r.status != CUDNN_STATUS_SUCCESS) return 0;
    if (bf16) return r.determinism == CUDNN_DETERMINISTIC || pass == BF16_ANY_DETERMINISM;
    if (r.determinism != CUDNN_DETERMINISTIC) return 0;
    return gemm_like(dir, (int)r.algo) &&
           r.mathType == (pass == 0 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH);
}

static void say_nondeterministic(const visc_cuda_conv_shape *s, int dir) {
    fprintf(stderr,
            "visc: note: convolution %s for N %d C %d %dx%d -> K %d, %dx%d stride %d pad %d: "
            "cuDNN offers no deterministic bf16 algorithm, so a non-deterministic one runs (this "
            "layer's results may differ in their last bits from run to run)\n",
            direction_name[dir], s->N, s->C, s->H, s->W, s->K, s->R, s->S, s->stride, s->pad);
}

/* The workspace size of `algo` in direction `dir` with the plan's math. */
static cudnnStatus_t workspace_of(visc_conv_state *st, conv_plan *p, int dir, int algo,
                                  size_t *bytes) {
    switch (dir) {
    case FWD:
        return visc_dnn.fwd_ws(st->handle, p->x, p->w, p->conv, p->y,
                               (cudnnConvolutionFwdAlgo_t)algo, bytes);
    case BWD_DATA:
        return visc_dnn.bwd_data_ws(st->handle, p->w, p->y, p->conv, p->x,
                                    (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    default:
        return visc_dnn.bwd_filter_ws(st->handle, p->x, p->y, p->conv, p->w,
                                      (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
    }
}

template <typename Perf>
static int pick(visc_conv_state *st, conv_plan *p, int dir, const Perf *perf, int n) {
    const int bf16 = p->shape.type == VISC_CUDA_CONV_BF16_NHWC;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            if (!acceptable(perf[i], dir, bf16, pass)) continue;
            const cudnnMathType_t math = bf16 ? perf[i].mathType : CUDNN_FMA_MATH;
            size_t bytes = 0;
            if (visc_dnn.conv_math(p->conv, math) != CUDNN_STATUS_SUCCESS ||
                workspace_of(st, p, dir, (int)perf[i].algo, &bytes) != CUDNN_STATUS_SUCCESS ||
                bytes > VISC_CONV_WORKSPACE_MAX)
                continue;
            p->algo[dir] = (int)perf[i].algo;
            p->math[dir] = math;
            p->ws[dir] = bytes;
            p->chosen[dir] = 1;
            if (perf[i].determinism != CUDNN_DETERMINISTIC) say_nondeterministic(&p->shape, dir);
            return 0;
        }
    const visc_cuda_conv_shape *s = &p->shape;
    return visc_set_error("convolution %s: cuDNN offers no %s algorithm for N %d C "
                          "%d %dx%d -> K %d, %dx%d stride %d pad %d",
                          direction_name[dir], bf16 ? "bf16" : "deterministic fp32 (FMA)", s->N,
                          s->C, s->H, s->W, s->K, s->R, s->S, s->stride, s->pad);
}

/* cuDNN's list for direction `dir` into perf (n entries): the heuristic's,
 * or with `timed` its search's, which runs every algorithm (on memory of
 * its own) and lists them fastest first. */
static cudnnStatus_t list_algos(visc_conv_state *st, conv_plan *p, int dir, int timed, void *perf,
                                int *n) {
    switch (dir) {
    case FWD: {
        cudnnConvolutionFwdAlgoPerf_t *f = (cudnnConvolutionFwdAlgoPerf_t *)perf;
        return timed ? visc_dnn.fwd_find(st->handle, p->x, p->w, p->conv, p->y,
                                         VISC_CONV_HEURISTICS, n, f)
                     : visc_dnn.fwd_algos(st->handle, p->x, p->w, p->conv, p->y,
                                          VISC_CONV_HEURISTICS, n, f);
    }
    case BWD_DATA: {
        cudnnConvolutionBwdDataAlgoPerf_t *f = (cudnnConvolutionBwdDataAlgoPerf_t *)perf;
        return timed ? visc_dnn.bwd_data_find(st->handle, p->w, p->y, p->conv, p->x,
                                              VISC_CONV_HEURISTICS, n, f)
                     : visc_dnn.bwd_data_algos(st->handle, p->w, p->y, p->conv, p->x,
                                               VISC_CONV_HEURISTICS, n, f);
    }
    default: {
        cudnnConvolutionBwdFilterAlgoPerf_t *f = (cudnnConvolutionBwdFilterAlgoPerf_t *)perf;
        return timed ? visc_dnn.bwd_filter_find(st->handle, p->x, p->y, p->conv, p->w,
                                                VISC_CONV_HEURISTICS, n, f)
                     : visc_dnn.bwd_filter_algos(st->handle, p->x, p->y, p->conv, p->w,
                                                 VISC_CONV_HEURISTICS, n, f);
    }
    }
}

/* Direction dir's algorithm, on first use: from the timed search's list
 * where the context asks for it (visc_cuda_set_conv_benchmark) and the
 * search ran (it allocates memory of its own, which a full device may
 * not have: then, said once, the heuristic's), else the heuristic's. The
 * math type is the plan's again before a list is made: pick sets it per
 * entry it tries. */
static int choose(visc_cuda *ctx, visc_conv_state *st, conv_plan *p, int dir) {
    if (p->chosen[dir]) return 0;
    static const char *const listing[DIRECTIONS] = {"convolution forward heuristic",
                                                    "convolution backward-data heuristic",
                                                    "convolution backward-weights heuristic"};
    union {
        cudnnConvolutionFwdAlgoPerf_t fwd[VISC_CONV_HEURISTICS];
        cudnnConvolutionBwdDataAlgoPerf_t bwd_data[VISC_CONV_HEURISTICS];
        cudnnConvolutionBwdFilterAlgoPerf_t bwd_filter[VISC_CONV_HEURISTICS];
    } perf;
    const int bf16 = p->shape.type == VISC_CUDA_CONV_BF16_NHWC;
    int n = 0, timed = ctx->conv_benchmark;
    cudnnStatus_t rc = CUDNN_STATUS_SUCCESS;
    for (;;) {
        if (visc_dnn_check(visc_dnn.conv_math(p->conv,
                                              bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
                           "convolution math type"))
            return -1;
        rc = list_algos(st, p, dir, timed, &perf, &n);
        if (rc == CUDNN_STATUS_SUCCESS || !timed) break;
        static int said;
        if (!said) {
            said = 1;
            fprintf(stderr,
                    "visc: note: cuDNN's timed search of convolution algorithms failed (%s); "
                    "its heuristic chooses instead\n",
                    visc_dnn.error_string(rc));
        }
        timed = 0;
    }
    if (visc_dnn_check(rc, listing[dir])) return -1;
    if (dir == FWD) return pick(st, p, dir, perf.fwd, n);
    if (dir == BWD_DATA) return pick(st, p, dir, perf.bwd_data, n);
    return pick(st, p, dir, perf.bwd_filter, n);
}

/* The plan of shape s with direction dir chosen, its math set on the
 * descriptor, and the workspace (*out's) at least its size; NULL with the
 * error set. */
static conv_plan *prepare(visc_cuda *ctx, const visc_cuda_conv_shape *s, int dir,
                          visc_conv_state **out) {
    if (shape_check(s)) return NULL;
    visc_conv_state *st = state(ctx);
    if (!st) return NULL;
    conv_plan *p = plan_for(st, s);
    if (!p || choose(ctx, st, p, dir) ||
        visc_dnn_check(visc_dnn.conv_math(p->conv, p->math[dir]), "convolution math type"))
        return NULL;
    if (p->ws[dir] > st->ws_bytes) {
        /* The old workspace may still be in use by queued work. */
        if (visc_cuda_sync(ctx)) return NULL;
        visc_cuda_free(ctx, st->ws);
        st->ws = visc_cuda_alloc(ctx, p->ws[dir]);
        st->ws_bytes = st->ws ? p->ws[dir] : 0;
        if (!st->ws) return NULL;
    }
    *out = st;
    return p;
}

/* ---- bf16 channels-last tensors, fp32 weights (VISC_CUDA_CONV_BF16_NHWC_F32W) ----
 * The weights [K, C, R, S] are copied to bf16 [K, R, S, C] in the scratch
 * for forward and backward-data, and backward-weights' bf16 result is
 * converted into the fp32 gradient (dw = beta dw + it): a ResNet's step
 * with bf16 activations and fp32 master weights. */
static int f32_weights_run(visc_cuda *ctx, const visc_cuda_conv_shape *s, int dir, void *out,
                           const void *a, const void *b, float beta) {
    if (shape_check(s)) return -1;
    visc_cuda_conv_shape t = *s;
    t.type = VISC_CUDA_CONV_BF16_NHWC;
    const size_t count = (size_t)s->K * s->C * s->R * s->S;
    uint16_t *wc;
    if (visc_cuda_bf16_scratch(ctx, &wc, &count, 1)) return -1;
    if (dir == BWD_FILTER)
        return visc_cuda_conv_backward_weights(ctx, &t, wc, a, b, 0.0f) ||
                       visc_cuda_nhwc_bf16_to_nchw(ctx, (float *)out, wc, s->K, s->C, s->R * s->S,
                                                   beta)
                   ? -1
                   : 0;
    if (visc_cuda_nchw_to_nhwc_bf16(ctx, wc, (const float *)b, s->K, s->C, s->R * s->S))
        return -1;
    return dir == FWD ? visc_cuda_conv_forward(ctx, &t, out, a, wc)
                      : visc_cuda_conv_backward_data(ctx, &t, out, a, wc);
}

int visc_cuda_conv_forward(visc_cuda *ctx, const visc_cuda_conv_shape *s, void *y, const void *x,
                           const void *w) {
    if (s && s->type == VISC_CUDA_CONV_BF16_NHWC_F32W)
        return f32_weights_run(ctx, s, FWD, y, x, w, 0.0f);
    visc_conv_state *st;
    conv_plan *p = prepare(ctx, s, FWD, &st);
    if (!p) return -1;
    const float one = 1.0f, zero = 0.0f;
    const int rc = visc_dnn_check(visc_dnn.fwd(st->handle, &one, p->x, x, p->w, w, p->conv,
                                               (cudnnConvolutionFwdAlgo_t)p->algo[FWD], st->ws,
                                               p->ws[FWD], &zero, p->y, y),
                                  "cudnnConvolutionForward");
    visc_cuda_profile_point("cuDNN convolution forward");
    return rc;
}

int visc_cuda_conv_backward_data(visc_cuda *ctx, const visc_cuda_conv_shape *s, void *dx,
                                 const void *dy, const void *w) {
    if (s && s->type == VISC_CUDA_CONV_BF16_NHWC_F32W)
        return f32_weights_run(ctx, s, BWD_DATA, dx, dy, w, 0.0f);
    visc_conv_state *st;
    conv_plan *p = prepare(ctx, s, BWD_DATA, &st);
    if (!p) return -1;
    const float one = 1.0f, zero = 0.0f;
    const int rc =
        visc_dnn_check(visc_dnn.bwd_data(st->handle, &one, p->w, w, p->y, dy, p->conv,
                                         (cudnnConvolutionBwdDataAlgo_t)p->algo[BWD_DATA], st->ws,
                                         p->ws[BWD_DATA], &zero, p->x, dx),
                       "cudnnConvolutionBackwardData");
    visc_cuda_profile_point("cuDNN convolution backward data");
    return rc;
}

int visc_cuda_conv_backward_weights(visc_cuda *ctx, const visc_cuda_conv_shape *s, void *dw,
                                    const void *x, const void *dy, float beta) {
    if (s && s->type == VISC_CUDA_CONV_BF16_NHWC_F32W)
        return f32_weights_run(ctx, s, BWD_FILTER, dw, x, dy, beta);
    visc_conv_state *st;
    conv_plan *p = prepare(ctx, s, BWD_FILTER, &st);
    if (!p) return -1;
    const float one = 1.0f;
    const int rc =
        visc_dnn_check(visc_dnn.bwd_filter(st->handle, &one, p->x, x, p->y, dy, p->conv,
                                           (cudnnConvolutionBwdFilterAlgo_t)p->algo[BWD_FILTER],
                                           st->ws, p->ws[BWD_FILTER], &beta, p->w, dw),
                       "cudnnConvolutionBackwardFilter");
    visc_cuda_profile_point("cuDNN convolution backward weights");
    return rc;
}

#else /* built where cuDNN's headers are missing: each call says so */
#include "common.cuh"

static int no_cudnn(void) {
    return visc_set_error("convolution: this build has no cuDNN (cudnn.h was not found when the "
                          "CUDA backend was compiled)");
}
void visc_conv_state_free(visc_cuda *ctx) { (void)ctx; }
int visc_cuda_conv_forward(visc_cuda *, const visc_cuda_conv_shape *, void *, const void *,
                           const void *) {
    return no_cudnn();
}
int visc_cuda_conv_backward_data(visc_cuda *, const visc_cuda_conv_shape *, void *, const void *,
                                 const void *) {
    return no_cudnn();
}
int visc_cuda_conv_backward_weights(visc_cuda *, const visc_cuda_conv_shape *, void *, const void *,
                                    const void *, float) {
    return no_cudnn();
}

#endif

/* emu_cudnn.cpp: the cuDNN calls of src/cuda/conv.cu, done on the CPU,
 * built as the emulator's libcudnn.so.<major> that the backend's own
 * loader (cudnn_dl.cu) opens in the emulated test.
 *
 * The legacy convolution API as cuDNN documents it: 4-d tensors in NCHW or
 * NHWC, filters K x C x R x S (KCRS, or KRSC for NHWC), cross-correlation
 * with padding, stride and dilation, out = alpha conv + beta out for the
 * three directions. Checked as cuDNN checks them: one data type for x, w
 * and y, an output descriptor of the size the convolution gives, filters
 * in the tensors' layout, an algorithm the heuristic listed as supported
 * for the descriptor's math, a workspace at least the size asked for.
 *
 * The heuristic lists, per direction, the algorithms a Hopper GPU's cuDNN
 * 9 lists (with their determinism), each under the descriptor's math
 * type, plus the tensor-op (TF32) variant that cuDNN's default math allows
 * for fp32; bf16 is listed with tensor-op math only. Sums are in double,
 * and a bf16 output is rounded to nearest even. */
#include <cuda_bf16.h>
#include <cudnn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cudnnContext {
    int token;
};
struct cudnnTensorStruct {
    cudnnTensorFormat_t format;
    cudnnDataType_t type;
    int n, c, h, w, set;
};
struct cudnnFilterStruct {
    cudnnTensorFormat_t format;
    cudnnDataType_t type;
    int k, c, r, s, set;
};
struct cudnnConvolutionStruct {
    int pad_h, pad_w, u, v, dil_h, dil_w, set;
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute;
    cudnnMathType_t math;
};

namespace {

cudnnStatus_t bad(const char *why) {
    fprintf(stderr, "visc-emu cuDNN: %s\n", why);
    return CUDNN_STATUS_BAD_PARAM;
}

/* The checks every direction makes; 0 if the four descriptors agree. */
cudnnStatus_t agree(const cudnnTensorStruct *x, const cudnnFilterStruct *w,
                    const cudnnConvolutionStruct *cv, const cudnnTensorStruct *y) {
    if (!x->set || !w->set || !cv->set || !y->set) return bad("a descriptor that was never set");
    if (x->type != w->type || x->type != y->type) return bad("x, w and y of different types");
    if (x->type != CUDNN_DATA_FLOAT && x->type != CUDNN_DATA_BFLOAT16)
        return bad("a type other than fp32 or bf16");
    if (cv->compute != CUDNN_DATA_FLOAT) return bad("a compute type other than fp32");
    if (x->format != y->format || w->format != x->format)
        return bad("the filter's or the output's layout differs from the input's");
    if (w->c != x->c) return bad("the filter's channels differ from the input's");
    const int eff_r = (w->r - 1) * cv->dil_h + 1, eff_s = (w->s - 1) * cv->dil_w + 1;
    const int P = (x->h + 2 * cv->pad_h - eff_r) / cv->u + 1,
              Q = (x->w + 2 * cv->pad_w - eff_s) / cv->v + 1;
    if (P <= 0 || Q <= 0) return bad("an empty output");
    if (y->n != x->n || y->c != w->k || y->h != P || y->w != Q)
        return bad("the output descriptor is not the convolution's output size");
    return CUDNN_STATUS_SUCCESS;
}

size_t tensor_index(const cudnnTensorStruct *t, int n, int c, int h, int w) {
    if (t->format == CUDNN_TENSOR_NHWC) return (((size_t)n * t->h + h) * t->w + w) * t->c + c;
    return (((size_t)n * t->c + c) * t->h + h) * t->w + w;
}
double load(const void *p, cudnnDataType_t type, size_t i) {
    if (type == CUDNN_DATA_BFLOAT16) return (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return (double)((const float *)p)[i];
}
/* An fp32 operand as a tensor core reads it when the math allows TF32
 * (cuDNN's default and tensor-op math on Ampere and later): 10 mantissa
 * bits, rounded to nearest. FMA math reads it whole. */
double operand(const void *p, cudnnDataType_t type, size_t i, int tf32) {
    const double v = load(p, type, i);
    if (!tf32) return v;
    float f = (float)v;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0xfffu + (bits >> 13 & 1)) & ~0x1fffu;
    memcpy(&f, &bits, sizeof f);
    return (double)f;
}
int tf32_math(const cudnnTensorStruct *x, const cudnnConvolutionStruct *cv) {
    return x->type == CUDNN_DATA_FLOAT && cv->math != CUDNN_FMA_MATH;
}
/* out[i] = alpha v + beta out[i] (out not read when beta is 0, as cuDNN). */
void store(void *p, cudnnDataType_t type, size_t i, double v, float alpha, float beta) {
    double r = (double)alpha * v;
    if (beta != 0.0f) r += (double)beta * load(p, type, i);
    if (type == CUDNN_DATA_BFLOAT16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16((float)r);
    else ((float *)p)[i] = (float)r;
}

/* A tensor or filter as dense doubles in NCHW (KCRS) order, its operands
 * rounded as the math reads them; NULL when out of memory. */
double *gather(const void *p, cudnnDataType_t type, cudnnTensorFormat_t format, int n, int c, int h,
               int w, int tf32) {
    const cudnnTensorStruct t = {format, type, n, c, h, w, 1};
    double *d = (double *)malloc(sizeof(double) * n * c * h * w);
    if (!d) return NULL;
    size_t o = 0;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < c; b++)
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++)
                    d[o++] = operand(p, type, tensor_index(&t, a, b, y, x), tf32);
    return d;
}
/* out (in its own layout) = alpha acc + beta out, acc dense NCHW. */
void scatter(void *p, cudnnDataType_t type, cudnnTensorFormat_t format, int n, int c, int h, int w,
             const double *acc, float alpha, float beta) {
    const cudnnTensorStruct t = {format, type, n, c, h, w, 1};
    size_t o = 0;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < c; b++)
            for (int y = 0; y < h; y++)
                for (int x = 0; x < w; x++)
                    store(p, type, tensor_index(&t, a, b, y, x), acc[o++], alpha, beta);
}

/* The convolution's geometry. */
struct geometry {
    int N, C, H, W, K, R, S, P, Q, u, v, pad_h, pad_w, dil_h, dil_w;
};
geometry geometry_of(const cudnnTensorStruct *x, const cudnnFilterStruct *f,
                     const cudnnConvolutionStruct *cv, const cudnnTensorStruct *y) {
    return geometry{x->n, x->c,  x->h,  x->w,      f->k,      f->r,      f->s,     y->h,
                    y->w, cv->u, cv->v, cv->pad_h, cv->pad_w, cv->dil_h, cv->dil_w};
}
/* The three directions are products with one image's lowered input, the
 * [C R S, P Q] matrix whose row (c, r, s) holds the pixel under filter tap
 * (r, s) for each output (p, q), 0 in the padding (im2col): forward
 * Y = W cols, backward-data cols' = W^T dY scattered back (col2im),
 * backward-weights dW = dY cols^T, all with long inner loops.
 * each_tap(g, fn) calls fn(crs, pq, plane, hw) for every (tap, output)
 * pair: plane the offset of channel c's plane in an image, hw the pixel's
 * offset in it or -1 in the padding. */
template <typename F> void each_tap(const geometry &g, F fn) {
    for (int c = 0; c < g.C; c++)
        for (int r = 0; r < g.R; r++)
            for (int s = 0; s < g.S; s++) {
                const size_t crs = ((size_t)c * g.R + r) * g.S + s;
                for (int p = 0; p < g.P; p++) {
                    const int h = p * g.u - g.pad_h + r * g.dil_h;
                    for (int q = 0; q < g.Q; q++) {
                        const int w = q * g.v - g.pad_w + s * g.dil_w;
                        const int64_t hw =
                            h < 0 || h >= g.H || w < 0 || w >= g.W ? -1 : (int64_t)h * g.W + w;
                        fn(crs, (size_t)p * g.Q + q, (size_t)c * g.H * g.W, hw);
                    }
                }
            }
}
void im2col(const geometry &g, const double *x, double *cols) {
    const size_t PQ = (size_t)g.P * g.Q;
    each_tap(g, [&](size_t crs, size_t pq, size_t plane, int64_t hw) {
        cols[crs * PQ + pq] = hw < 0 ? 0.0 : x[plane + (size_t)hw];
    });
}
void col2im(const geometry &g, const double *cols, double *x) {
    const size_t PQ = (size_t)g.P * g.Q;
    each_tap(g, [&](size_t crs, size_t pq, size_t plane, int64_t hw) {
        if (hw >= 0) x[plane + (size_t)hw] += cols[crs * PQ + pq];
    });
}

/* An operand or result: where, its type and layout, its NCHW (KCRS) dims. */
struct dense_spec {
    const void *p;
    cudnnDataType_t type;
    cudnnTensorFormat_t format;
    int n, c, h, w;
};
/* The pass every direction makes: a and b gathered dense, fn(A, B, acc,
 * cols) with cols room for one image's lowered matrix, acc scattered into
 * out as alpha acc + beta out. */
template <typename F>
cudnnStatus_t dense_pass(const geometry &g, const dense_spec &a, const dense_spec &b,
                         const dense_spec &out, int tf32, const void *alpha, const void *beta,
                         F fn) {
    double *A = gather(a.p, a.type, a.format, a.n, a.c, a.h, a.w, tf32);
    double *B = gather(b.p, b.type, b.format, b.n, b.c, b.h, b.w, tf32);
    double *acc = (double *)calloc((size_t)out.n * out.c * out.h * out.w, sizeof(double));
    double *cols = (double *)malloc(sizeof(double) * g.C * g.R * g.S * g.P * g.Q);
    const int ok = A && B && acc && cols;
    if (ok) {
        fn(A, B, acc, cols);
        scatter((void *)out.p, out.type, out.format, out.n, out.c, out.h, out.w, acc,
                *(const float *)alpha, *(const float *)beta);
    }
    free(A);
    free(B);
    free(acc);
    free(cols);
    return ok ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}

/* The algorithms the heuristic lists, per direction: (algo, deterministic). */
struct listed {
    int algo;
    int deterministic;
};
const listed fwd_list[] = {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 1},
                           {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, 1},
                           {CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, 1},
                           {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, 1}};
const listed bwd_data_list[] = {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, 0},
                                {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, 1},
                                {CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING, 1}};
const listed bwd_filter_list[] = {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, 0},
                                  {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, 1},
                                  {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, 0}};
const size_t WORKSPACE = (size_t)1 << 20; /* what each listed algorithm asks for */

/* VISC_EMU_CUDNN_NONDETERMINISTIC=1 (read at each query): every listed
 * algorithm marked non-deterministic, as cuDNN may list them for a shape
 * (conv.cu's bf16 fallback). */
static int none_deterministic(void) {
    const char *e = getenv("VISC_EMU_CUDNN_NONDETERMINISTIC");
    return e && strcmp(e, "1") == 0;
}

template <typename Perf, size_t N>
cudnnStatus_t heuristic(const listed (&list)[N], cudnnDataType_t type, cudnnMathType_t math,
                        int requested, int *returned, Perf *perf) {
    int n = 0;
    for (size_t i = 0; i < N && n < requested; i++) {
        /* bf16 on tensor cores only; fp32 under the descriptor's math and,
         * where that allows it, TF32 tensor ops as well */
        const cudnnMathType_t maths[2] = {type == CUDNN_DATA_BFLOAT16 ? CUDNN_TENSOR_OP_MATH : math,
                                          CUDNN_TENSOR_OP_MATH};
        const int variants = type == CUDNN_DATA_FLOAT && math == CUDNN_DEFAULT_MATH ? 2 : 1;
        for (int v = 0; v < variants && n < requested; v++) {
            Perf &p = perf[n++];
            memset(&p, 0, sizeof p);
            p.algo = (decltype(p.algo))list[i].algo;
            p.status = CUDNN_STATUS_SUCCESS;
            p.memory = WORKSPACE;
            p.determinism = list[i].deterministic && !none_deterministic()
                                ? CUDNN_DETERMINISTIC
                                : CUDNN_NON_DETERMINISTIC;
            p.mathType = maths[v];
        }
    }
    *returned = n;
    return CUDNN_STATUS_SUCCESS;
}

template <size_t N> cudnnStatus_t runnable(const listed (&list)[N], int algo, size_t ws_bytes) {
    for (size_t i = 0; i < N; i++)
        if (list[i].algo == algo)
            return ws_bytes >= WORKSPACE ? CUDNN_STATUS_SUCCESS
                                         : bad("a workspace smaller than the algorithm asked for");
    return bad("an algorithm the heuristic did not list");
}
template <size_t N> cudnnStatus_t workspace(const listed (&list)[N], int algo, size_t *bytes) {
    for (size_t i = 0; i < N; i++)
        if (list[i].algo == algo) {
            *bytes = WORKSPACE;
            return CUDNN_STATUS_SUCCESS;
        }
    return bad("the workspace of an algorithm the heuristic does not list");
}

int finds; /* the timed searches made (visc_emu_cudnn_finds) */
template <typename Perf> cudnnStatus_t timed(cudnnStatus_t s, int *returned, Perf *perf) {
    if (s != CUDNN_STATUS_SUCCESS) return s;
    finds++;
    for (int i = 0, j = *returned - 1; i < j; i++, j--) {
        const Perf t = perf[i];
        perf[i] = perf[j];
        perf[j] = t;
    }
    return s;
}

} // namespace

extern "C" {

cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    *h = (cudnnHandle_t)calloc(1, sizeof(cudnnContext));
    return *h ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
    free(h);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t, cudaStream_t) { return CUDNN_STATUS_SUCCESS; }
const char *cudnnGetErrorString(cudnnStatus_t s) {
    switch (s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    default: return "an emulated cuDNN error";
    }
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *t) {
    *t = (cudnnTensorDescriptor_t)calloc(1, sizeof(cudnnTensorStruct));
    return *t ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t t) {
    free(t);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t t, cudnnTensorFormat_t format,
                                         cudnnDataType_t type, int n, int c, int h, int w) {
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return bad("a tensor dimension below 1");
    if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
        return bad("a tensor layout other than NCHW or NHWC");
    *t = cudnnTensorStruct{format, type, n, c, h, w, 1};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *f) {
    *f = (cudnnFilterDescriptor_t)calloc(1, sizeof(cudnnFilterStruct));
    return *f ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t f) {
    free(f);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t f, cudnnDataType_t type,
                                         cudnnTensorFormat_t format, int k, int c, int r, int s) {
    if (k <= 0 || c <= 0 || r <= 0 || s <= 0) return bad("a filter dimension below 1");
    if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC)
        return bad("a filter layout other than NCHW or NHWC");
    *f = cudnnFilterStruct{format, type, k, c, r, s, 1};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *cv) {
    *cv = (cudnnConvolutionDescriptor_t)calloc(1, sizeof(cudnnConvolutionStruct));
    return *cv ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t cv) {
    free(cv);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t cv, int pad_h, int pad_w,
                                              int u, int v, int dil_h, int dil_w,
                                              cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
    if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dil_h <= 0 || dil_w <= 0)
        return bad("a negative padding, or a stride or dilation below 1");
    if (mode != CUDNN_CROSS_CORRELATION)
        return bad("convolution mode (the emulator does cross-correlation, as PyTorch)");
    const cudnnMathType_t math = cv->set ? cv->math : CUDNN_DEFAULT_MATH;
    *cv = cudnnConvolutionStruct{pad_h, pad_w, u, v, dil_h, dil_w, 1, mode, compute, math};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t cv, cudnnMathType_t m) {
    if (m != CUDNN_DEFAULT_MATH && m != CUDNN_TENSOR_OP_MATH && m != CUDNN_FMA_MATH &&
        m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
        return bad("an unknown math type");
    cv->math = m;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t cv,
                                                     cudnnTensorDescriptor_t y, int requested,
                                                     int *returned,
                                                     cudnnConvolutionFwdAlgoPerf_t *perf) {
    const cudnnStatus_t s = agree(x, w, cv, y);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    return heuristic(fwd_list, x->type, cv->math, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, cudnnFilterDescriptor_t w,
                                                          cudnnTensorDescriptor_t dy,
                                                          cudnnConvolutionDescriptor_t cv,
                                                          cudnnTensorDescriptor_t dx, int requested,
                                                          int *returned,
                                                          cudnnConvolutionBwdDataAlgoPerf_t *perf) {
    const cudnnStatus_t s = agree(dx, w, cv, dy);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    return heuristic(bwd_data_list, dx->type, cv->math, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t cv, cudnnFilterDescriptor_t dw, int requested, int *returned,
    cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
    const cudnnStatus_t s = agree(x, dw, cv, dy);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    return heuristic(bwd_filter_list, x->type, cv->math, requested, returned, perf);
}

/* The timed searches: the heuristic's entries in reverse order (another
 * first choice, as a search may find), each call counted for the kernel
 * test (visc_emu_cudnn_finds). */
int visc_emu_cudnn_finds(void) { return finds; }
cudnnStatus_t cudnnFindConvolutionForwardAlgorithm(cudnnHandle_t h, cudnnTensorDescriptor_t x,
                                                   cudnnFilterDescriptor_t w,
                                                   cudnnConvolutionDescriptor_t cv,
                                                   cudnnTensorDescriptor_t y, int requested,
                                                   int *returned,
                                                   cudnnConvolutionFwdAlgoPerf_t *perf) {
    return timed(cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, cv, y, requested, returned, perf),
                 returned, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithm(cudnnHandle_t h, cudnnFilterDescriptor_t w,
                                                        cudnnTensorDescriptor_t dy,
                                                        cudnnConvolutionDescriptor_t cv,
                                                        cudnnTensorDescriptor_t dx, int requested,
                                                        int *returned,
                                                        cudnnConvolutionBwdDataAlgoPerf_t *perf) {
    return timed(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, dy, cv, dx, requested, returned,
                                                             perf),
                 returned, perf);
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithm(
    cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t cv, cudnnFilterDescriptor_t dw, int requested, int *returned,
    cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
    return timed(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, dy, cv, dw, requested,
                                                               returned, perf),
                 returned, perf);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                      cudnnFilterDescriptor_t w,
                                                      cudnnConvolutionDescriptor_t cv,
                                                      cudnnTensorDescriptor_t y,
                                                      cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *bytes) {
    const cudnnStatus_t s = agree(x, w, cv, y);
    return s != CUDNN_STATUS_SUCCESS ? s : workspace(fwd_list, algo, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, cudnnFilterDescriptor_t w,
                                                           cudnnTensorDescriptor_t dy,
                                                           cudnnConvolutionDescriptor_t cv,
                                                           cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t algo,
                                                           size_t *bytes) {
    const cudnnStatus_t s = agree(dx, w, cv, dy);
    return s != CUDNN_STATUS_SUCCESS ? s : workspace(bwd_data_list, algo, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t cv, cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *bytes) {
    const cudnnStatus_t s = agree(x, dw, cv, dy);
    return s != CUDNN_STATUS_SUCCESS ? s : workspace(bwd_filter_list, algo, bytes);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t, const void *alpha, cudnnTensorDescriptor_t xd,
                                      const void *x, cudnnFilterDescriptor_t wd, const void *w,
                                      cudnnConvolutionDescriptor_t cv,
                                      cudnnConvolutionFwdAlgo_t algo, void *, size_t ws_bytes,
                                      const void *beta, cudnnTensorDescriptor_t yd, void *y) {
    cudnnStatus_t s = agree(xd, wd, cv, yd);
    if (s == CUDNN_STATUS_SUCCESS) s = runnable(fwd_list, algo, ws_bytes);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    const geometry g = geometry_of(xd, wd, cv, yd);
    return dense_pass(g, {x, xd->type, xd->format, g.N, g.C, g.H, g.W},
                      {w, wd->type, wd->format, g.K, g.C, g.R, g.S},
                      {y, yd->type, yd->format, g.N, g.K, g.P, g.Q}, tf32_math(xd, cv), alpha, beta,
                      [&](const double *X, const double *Wt, double *acc, double *cols) {
                          const size_t PQ = (size_t)g.P * g.Q, CRS = (size_t)g.C * g.R * g.S;
                          for (int n = 0; n < g.N; n++) {
                              im2col(g, X + (size_t)n * g.C * g.H * g.W, cols);
                              for (int k = 0; k < g.K; k++) {
                                  double *y = acc + ((size_t)n * g.K + k) * PQ;
                                  for (size_t crs = 0; crs < CRS; crs++) {
                                      const double w = Wt[(size_t)k * CRS + crs];
                                      const double *col = cols + crs * PQ;
                                      for (size_t pq = 0; pq < PQ; pq++) y[pq] += w * col[pq];
                                  }
                              }
                          }
                      });
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t, const void *alpha,
                                           cudnnFilterDescriptor_t wd, const void *w,
                                           cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t cv,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *,
                                           size_t ws_bytes, const void *beta,
                                           cudnnTensorDescriptor_t dxd, void *dx) {
    cudnnStatus_t s = agree(dxd, wd, cv, dyd);
    if (s == CUDNN_STATUS_SUCCESS) s = runnable(bwd_data_list, algo, ws_bytes);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    const geometry g = geometry_of(dxd, wd, cv, dyd);
    return dense_pass(g, {dy, dyd->type, dyd->format, g.N, g.K, g.P, g.Q},
                      {w, wd->type, wd->format, g.K, g.C, g.R, g.S},
                      {dx, dxd->type, dxd->format, g.N, g.C, g.H, g.W}, tf32_math(dxd, cv), alpha,
                      beta, [&](const double *DY, const double *Wt, double *acc, double *cols) {
                          const size_t PQ = (size_t)g.P * g.Q, CRS = (size_t)g.C * g.R * g.S;
                          for (int n = 0; n < g.N; n++) {
                              memset(cols, 0, sizeof(double) * CRS * PQ);
                              for (int k = 0; k < g.K; k++) {
                                  const double *dy = DY + ((size_t)n * g.K + k) * PQ;
                                  for (size_t crs = 0; crs < CRS; crs++) {
                                      const double w = Wt[(size_t)k * CRS + crs];
                                      double *col = cols + crs * PQ;
                                      for (size_t pq = 0; pq < PQ; pq++) col[pq] += w * dy[pq];
                                  }
                              }
                              col2im(g, cols, acc + (size_t)n * g.C * g.H * g.W);
                          }
                      });
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t, const void *alpha,
                                             cudnnTensorDescriptor_t xd, const void *x,
                                             cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t cv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *,
                                             size_t ws_bytes, const void *beta,
                                             cudnnFilterDescriptor_t dwd, void *dw) {
    cudnnStatus_t s = agree(xd, dwd, cv, dyd);
    if (s == CUDNN_STATUS_SUCCESS) s = runnable(bwd_filter_list, algo, ws_bytes);
    if (s != CUDNN_STATUS_SUCCESS) return s;
    const geometry g = geometry_of(xd, dwd, cv, dyd);
    return dense_pass(g, {x, xd->type, xd->format, g.N, g.C, g.H, g.W},
                      {dy, dyd->type, dyd->format, g.N, g.K, g.P, g.Q},
                      {dw, dwd->type, dwd->format, g.K, g.C, g.R, g.S}, tf32_math(xd, cv), alpha,
                      beta, [&](const double *X, const double *DY, double *acc, double *cols) {
                          const size_t PQ = (size_t)g.P * g.Q, CRS = (size_t)g.C * g.R * g.S;
                          for (int n = 0; n < g.N; n++) {
                              im2col(g, X + (size_t)n * g.C * g.H * g.W, cols);
                              for (int k = 0; k < g.K; k++) {
                                  const double *dy = DY + ((size_t)n * g.K + k) * PQ;
                                  for (size_t crs = 0; crs < CRS; crs++) {
                                      const double *col = cols + crs * PQ;
                                      double sum = 0.0;
                                      for (size_t pq = 0; pq < PQ; pq++) sum += dy[pq] * col[pq];
                                      acc[(size_t)k * CRS + crs] += sum;
                                  }
                              }
                          }
                      });
}

} // extern "C"

/* pool.cu: max pooling, global average pooling and ReLU over NCHW fp32,
 * as src/nn/pool2d.c, global_pool.c and eltwise.c compute them, bit for bit;
 * the two poolings also over channels-last bf16 (a ResNet's activations
 * under --precision bf16), with the same rules.
 *
 * Max pooling's backward gathers: each input element adds the gradients of
 * the outputs whose argmax it is, in output order, which is the order the
 * CPU's scatter adds them in; no atomics, so the result is the CPU's. */
#include <cuda_bf16.h>

#include "common.cuh"

static int pool_out(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

/* Rows [y0, y1) and columns [x0, x1) of a plane. */
typedef struct {
    int y0, y1, x0, x1;
} pool_span;

/* The input window of output (oh, ow), clipped to the H x W plane. */
__device__ __forceinline__ pool_span window_of(int oh, int ow, int H, int W, int k, int s,
                                               int pad) {
    pool_span w = {max(oh * s - pad, 0), min(oh * s - pad + k, H), max(ow * s - pad, 0),
                   min(ow * s - pad + k, W)};
    return w;
}

/* The outputs whose window holds input (h, w): oh s - pad <= h < oh s - pad + k. */
__device__ __forceinline__ pool_span outputs_of(int h, int w, int P, int Q, int k, int s,
                                                int pad) {
    pool_span o = {max(0, (h + pad - k + s) / s), min(P - 1, (h + pad) / s) + 1,
                   max(0, (w + pad - k + s) / s), min(Q - 1, (w + pad) / s) + 1};
    return o;
}

__global__ void maxpool_forward_kernel(float *out, int32_t *argmax, const float *in, size_t total,
                                       int H, int W, int P, int Q, int k, int s, int pad) {
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < total;
         o += (size_t)gridDim.x * blockDim.x) {
        const int ow = (int)(o % Q), oh = (int)(o / Q % P);
        const float *x = in + o / ((size_t)P * Q) * H * W;
        const pool_span win = window_of(oh, ow, H, W, k, s, pad);
        float m = -INFINITY;
        int32_t am = win.y0 * W + win.x0;
        /* window order, the first maximum wins, a NaN propagates (as torch) */
        for (int h = win.y0; h < win.y1; h++)
            for (int w = win.x0; w < win.x1; w++) {
                const float v = x[h * W + w];
                if (v > m || v != v) {
                    m = v;
                    am = h * W + w;
                }
            }
        out[o] = m;
        argmax[o] = am;
    }
}

__global__ void maxpool_backward_kernel(float *din, const float *dout, const int32_t *argmax,
                                        size_t total, int H, int W, int P, int Q, int k, int s,
                                        int pad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int w = (int)(i % W), h = (int)(i / W % H);
        const size_t plane = i / ((size_t)H * W) * P * Q;
        const pool_span outs = outputs_of(h, w, P, Q, k, s, pad);
        const int32_t me = h * W + w;
        float g = 0.0f;
        for (int oh = outs.y0; oh < outs.y1; oh++)
            for (int ow = outs.x0; ow < outs.x1; ow++) {
                const size_t o = plane + (size_t)oh * Q + ow;
                if (argmax[o] == me) g += dout[o];
            }
        din[i] = g;
    }
}

static int pool_check(int N, int C, int H, int W, int kernel, int stride, int pad) {
    if (N <= 0 || C <= 0 || H <= 0 || W <= 0 || kernel <= 0 || stride <= 0 || pad < 0 ||
        2 * pad > kernel || pool_out(H, kernel, stride, pad) <= 0 ||
        pool_out(W, kernel, stride, pad) <= 0)
        return visc_set_error("max pooling: bad shape (%dx%d, kernel %d, stride %d, pad %d)", H, W,
                              kernel, stride, pad);
    return 0;
}

int visc_cuda_maxpool_forward(visc_cuda *ctx, float *out, int32_t *argmax, const float *in, int N,
                              int C, int H, int W, int kernel, int stride, int pad) {
    if (pool_check(N, C, H, W, kernel, stride, pad)) return -1;
    const int P = pool_out(H, kernel, stride, pad), Q = pool_out(W, kernel, stride, pad);
    const size_t total = (size_t)N * C * P * Q;
    maxpool_forward_kernel<<<visc_cuda_blocks(total, 256), 256, 0, ctx->stream>>>(out, argmax, in,
                                                                                  total, H, W, P, Q,
                                                                                  kernel, stride,
                                                                                  pad);
    return visc_cuda_launched("max pooling forward");
}

int visc_cuda_maxpool_backward(visc_cuda *ctx, float *din, const float *dout, const int32_t *argmax,
                               int N, int C, int H, int W, int kernel, int stride, int pad) {
    if (pool_check(N, C, H, W, kernel, stride, pad)) return -1;
    const int P = pool_out(H, kernel, stride, pad), Q = pool_out(W, kernel, stride, pad);
    const size_t total = (size_t)N * C * H * W;
    maxpool_backward_kernel<<<visc_cuda_blocks(total, 256), 256, 0, ctx->stream>>>(din, dout,
                                                                                   argmax, total, H,
                                                                                   W, P, Q, kernel,
                                                                                   stride, pad);
    return visc_cuda_launched("max pooling backward");
}

/* One thread per (n, c) plane, summing in the CPU's order: HW is small
 * (49 for ResNet at 224 px, 16 at 32 px), and the planes are many. */
__global__ void gap_forward_kernel(float *out, const float *in, size_t planes, int HW, float inv) {
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < planes;
         p += (size_t)gridDim.x * blockDim.x) {
        const float *x = in + p * HW;
        float s = 0.0f;
        for (int i = 0; i < HW; i++) s = __fadd_rn(s, x[i]);
        out[p] = __fmul_rn(s, inv);
    }
}

__global__ void gap_backward_kernel(float *din, const float *dout, size_t n, int HW, float inv) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        din[i] = __fmul_rn(dout[i / HW], inv);
}

int visc_cuda_global_avgpool_forward(visc_cuda *ctx, float *out, const float *in, int N, int C,
                                     int HW) {
    if (N <= 0 || C <= 0 || HW <= 0) return visc_set_error("global average pooling: bad shape");
    const size_t planes = (size_t)N * C;
    gap_forward_kernel<<<visc_cuda_blocks(planes, 128), 128, 0, ctx->stream>>>(out, in, planes, HW,
                                                                               1.0f / (float)HW);
    return visc_cuda_launched("global average pooling forward");
}

int visc_cuda_global_avgpool_backward(visc_cuda *ctx, float *din, const float *dout, int N, int C,
                                      int HW) {
    if (N <= 0 || C <= 0 || HW <= 0) return visc_set_error("global average pooling: bad shape");
    const size_t n = (size_t)N * C * HW;
    gap_backward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(din, dout, n, HW,
                                                                           1.0f / (float)HW);
    return visc_cuda_launched("global average pooling backward");
}

/* ---- channels-last bf16 [N, H, W, C]: consecutive threads take
 * consecutive channels, so every read and write is coalesced ---- */

__global__ void maxpool_forward_nhwc_bf16_kernel(__nv_bfloat16 *out, int32_t *argmax,
                                                 const __nv_bfloat16 *in, size_t total, int C,
                                                 int H, int W, int P, int Q, int k, int s,
                                                 int pad) {
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < total;
         o += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(o % C), ow = (int)(o / C % Q), oh = (int)(o / ((size_t)C * Q) % P);
        const __nv_bfloat16 *x = in + o / ((size_t)C * P * Q) * H * W * C + c;
        const pool_span win = window_of(oh, ow, H, W, k, s, pad);
        float m = -INFINITY;
        int32_t am = win.y0 * W + win.x0;
        __nv_bfloat16 best = x[(size_t)am * C];
        for (int h = win.y0; h < win.y1; h++)
            for (int w = win.x0; w < win.x1; w++) {
                const __nv_bfloat16 b = x[((size_t)h * W + w) * C];
                const float v = __bfloat162float(b);
                if (v > m || v != v) {
                    m = v;
                    am = h * W + w;
                    best = b;
                }
            }
        out[o] = best;
        argmax[o] = am;
    }
}

__global__ void maxpool_backward_nhwc_bf16_kernel(__nv_bfloat16 *din, const __nv_bfloat16 *dout,
                                                  const int32_t *argmax, size_t total, int C,
                                                  int H, int W, int P, int Q, int k, int s,
                                                  int pad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(i % C), w = (int)(i / C % W), h = (int)(i / ((size_t)C * W) % H);
        const size_t image = i / ((size_t)C * H * W) * P * Q;
        const pool_span outs = outputs_of(h, w, P, Q, k, s, pad);
        const int32_t me = h * W + w;
        float g = 0.0f;
        for (int oh = outs.y0; oh < outs.y1; oh++)
            for (int ow = outs.x0; ow < outs.x1; ow++) {
                const size_t o = (image + (size_t)oh * Q + ow) * C + c;
                if (argmax[o] == me) g += __bfloat162float(dout[o]);
            }
        din[i] = __float2bfloat16_rn(g);
    }
}

__global__ void gap_forward_nhwc_bf16_kernel(float *out, const __nv_bfloat16 *in, size_t planes,
                                             int C, int HW, float inv) {
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < planes;
         p += (size_t)gridDim.x * blockDim.x) {
        const __nv_bfloat16 *x = in + p / C * HW * C + p % C;
        float s = 0.0f;
        for (int i = 0; i < HW; i++) s = __fadd_rn(s, __bfloat162float(x[(size_t)i * C]));
        out[p] = __fmul_rn(s, inv);
    }
}

__global__ void gap_backward_nhwc_bf16_kernel(__nv_bfloat16 *din, const float *dout, size_t n,
                                              int C, int HW, float inv) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        din[i] = __float2bfloat16_rn(__fmul_rn(dout[i / ((size_t)HW * C) * C + i % C], inv));
}

int visc_cuda_maxpool_forward_nhwc_bf16(visc_cuda *ctx, uint16_t *out, int32_t *argmax,
                                        const uint16_t *in, int N, int C, int H, int W, int kernel,
                                        int stride, int pad) {
    if (pool_check(N, C, H, W, kernel, stride, pad)) return -1;
    const int P = pool_out(H, kernel, stride, pad), Q = pool_out(W, kernel, stride, pad);
    const size_t total = (size_t)N * C * P * Q;
    maxpool_forward_nhwc_bf16_kernel<<<visc_cuda_blocks(total, 256), 256, 0, ctx->stream>>>(
        (__nv_bfloat16 *)out, argmax, (const __nv_bfloat16 *)in, total, C, H, W, P, Q, kernel,
        stride, pad);
    return visc_cuda_launched("max pooling forward (bf16, channels-last)");
}

int visc_cuda_maxpool_backward_nhwc_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *dout,
                                         const int32_t *argmax, int N, int C, int H, int W,
                                         int kernel, int stride, int pad) {
    if (pool_check(N, C, H, W, kernel, stride, pad)) return -1;
    const int P = pool_out(H, kernel, stride, pad), Q = pool_out(W, kernel, stride, pad);
    const size_t total = (size_t)N * C * H * W;
    maxpool_backward_nhwc_bf16_kernel<<<visc_cuda_blocks(total, 256), 256, 0, ctx->stream>>>(
        (__nv_bfloat16 *)din, (const __nv_bfloat16 *)dout, argmax, total, C, H, W, P, Q, kernel,
        stride, pad);
    return visc_cuda_launched("max pooling backward (bf16, channels-last)");
}

int visc_cuda_global_avgpool_forward_nhwc_bf16(visc_cuda *ctx, float *out, const uint16_t *in,
                                               int N, int C, int HW) {
    if (N <= 0 || C <= 0 || HW <= 0) return visc_set_error("global average pooling: bad shape");
    const size_t planes = (size_t)N * C;
    gap_forward_nhwc_bf16_kernel<<<visc_cuda_blocks(planes, 128), 128, 0, ctx->stream>>>(
        out, (const __nv_bfloat16 *)in, planes, C, HW, 1.0f / (float)HW);
    return visc_cuda_launched("global average pooling forward (bf16, channels-last)");
}

int visc_cuda_global_avgpool_backward_nhwc_bf16(visc_cuda *ctx, uint16_t *din, const float *dout,
                                                int N, int C, int HW) {
    if (N <= 0 || C <= 0 || HW <= 0) return visc_set_error("global average pooling: bad shape");
    const size_t n = (size_t)N * C * HW;
    gap_backward_nhwc_bf16_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        (__nv_bfloat16 *)din, dout, n, C, HW, 1.0f / (float)HW);
    return visc_cuda_launched("global average pooling backward (bf16, channels-last)");
}

__global__ void relu_forward_kernel(float *out, const float *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = in[i] < 0.0f ? 0.0f : in[i]; /* NaN stays NaN, as on the CPU */
}

__global__ void relu_backward_kernel(float *din, const float *dout, const float *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = dout[i];
        din[i] = out[i] > 0.0f ? g : 0.0f; /* the gradient at 0 is 0, as PyTorch */
    }
}

int visc_cuda_relu_forward(visc_cuda *ctx, float *out, const float *in, size_t n) {
    if (n == 0) return 0;
    relu_forward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, in, n);
    return visc_cuda_launched("relu forward");
}

int visc_cuda_relu_backward(visc_cuda *ctx, float *din, const float *dout, const float *out,
                            size_t n) {
    if (n == 0) return 0;
    relu_backward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(din, dout, out, n);
    return visc_cuda_launched("relu backward");
}

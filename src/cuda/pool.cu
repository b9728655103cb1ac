/* pool.cu: max pooling, global average pooling and ReLU over NCHW fp32,
 * as src/nn/pool2d.c, global_pool.c and eltwise.c compute them, bit for bit.
 *
 * Max pooling's backward gathers: each input element adds the gradients of
 * the outputs whose argmax it is, in output order, which is the order the
 * CPU's scatter adds them in; no atomics, so the result is the CPU's. */
#include "common.cuh"

static int pool_out(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

__global__ void maxpool_forward_kernel(float *out, int32_t *argmax, const float *in, size_t total,
                                       int H, int W, int P, int Q, int k, int s, int pad) {
    for (size_t o = blockIdx.x * (size_t)blockDim.x + threadIdx.x; o < total;
         o += (size_t)gridDim.x * blockDim.x) {
        const int ow = (int)(o % Q), oh = (int)(o / Q % P);
        const float *x = in + o / ((size_t)P * Q) * H * W;
        const int h0 = max(oh * s - pad, 0), h1 = min(oh * s - pad + k, H);
        const int w0 = max(ow * s - pad, 0), w1 = min(ow * s - pad + k, W);
        float m = -INFINITY;
        int32_t am = h0 * W + w0;
        /* window order, the first maximum wins, a NaN propagates (as torch) */
        for (int h = h0; h < h1; h++)
            for (int w = w0; w < w1; w++) {
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
        /* the outputs whose window holds (h, w): oh s - pad <= h < oh s - pad + k */
        const int oh0 = max(0, (h + pad - k + s) / s), oh1 = min(P - 1, (h + pad) / s);
        const int ow0 = max(0, (w + pad - k + s) / s), ow1 = min(Q - 1, (w + pad) / s);
        const int32_t me = h * W + w;
        float g = 0.0f;
        for (int oh = oh0; oh <= oh1; oh++)
            for (int ow = ow0; ow <= ow1; ow++) {
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

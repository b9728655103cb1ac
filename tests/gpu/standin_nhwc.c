/* standin_nhwc.c: the stand-in GPU's bf16 channels-last tensors (a ResNet's
 * activations under --precision bf16): the layout changes, and the
 * elementwise steps and poolings on such tensors, each done by the CPU's
 * fp32 code on an fp32 NCHW copy, its results rounded to bf16 as the GPU's
 * kernels round them. The convolutions and batch norm of this form are in
 * cpu_standin.c, with their fp32 forms, through the conversions here.
 *
 * The GPU computes these with the same roundings but may sum in another
 * order, so a model in this form is compared with the CPU by what it
 * learns (tests/e2e_gpu_standin_learns.sh), not bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "../../src/nn/linear_bf16.h"
#include "standin.h"
#include "visc/nn.h"

float *standin_nhwc_to_nchw(const void *src, int N, int C, int HW) {
    const uint16_t *in = src;
    float *out = visc_alloc_aligned((size_t)N * C * HW * sizeof(float), "stand-in NCHW copy");
    for (int n = 0; n < N; n++)
        for (int i = 0; i < HW; i++)
            for (int c = 0; c < C; c++)
                out[((size_t)n * C + c) * HW + i] =
                    visc_bf16_to_f32(in[((size_t)n * HW + i) * C + c]);
    return out;
}

void standin_nchw_to_nhwc(void *dst, const float *src, int N, int C, int HW) {
    uint16_t *out = dst;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < HW; i++)
            for (int c = 0; c < C; c++)
                out[((size_t)n * HW + i) * C + c] =
                    visc_f32_to_bf16(src[((size_t)n * C + c) * HW + i]);
}

int visc_cuda_nchw_to_nhwc_bf16(visc_cuda *ctx, uint16_t *out, const float *in, int N, int C,
                                int HW) {
    (void)ctx;
    if (N <= 0 || C <= 0 || HW <= 0)
        return visc_set_error("layout change: bad shape %d x %d x %d", N, C, HW);
    standin_nchw_to_nhwc(out, in, N, C, HW);
    return 0;
}

int visc_cuda_nhwc_bf16_to_nchw(visc_cuda *ctx, float *out, const uint16_t *in, int N, int C,
                                int HW, float beta) {
    (void)ctx;
    if (N <= 0 || C <= 0 || HW <= 0)
        return visc_set_error("layout change: bad shape %d x %d x %d", N, C, HW);
    float *v = standin_nhwc_to_nchw(in, N, C, HW);
    const size_t n = (size_t)N * C * HW;
    for (size_t i = 0; i < n; i++) out[i] = beta == 0.0f ? v[i] : beta * out[i] + v[i];
    visc_free_aligned(v);
    return 0;
}

/* ---- elementwise: each value in fp32, rounded once ---- */

static float bf(uint16_t h) { return visc_bf16_to_f32(h); }

int visc_cuda_add_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *a, const uint16_t *b,
                       size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) out[i] = visc_f32_to_bf16(bf(a[i]) + bf(b[i]));
    return 0;
}

int visc_cuda_add_relu_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *identity, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        const float v = bf(out[i]) + bf(identity[i]);
        out[i] = visc_f32_to_bf16(v > 0.0f ? v : 0.0f);
    }
    return 0;
}

int visc_cuda_relu_backward_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *dout,
                                 const uint16_t *out, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) din[i] = bf(out[i]) > 0.0f ? dout[i] : 0;
    return 0;
}

int visc_cuda_add_relu_backward_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *a,
                                     const uint16_t *b, const uint16_t *out, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        const uint16_t sum = visc_f32_to_bf16(bf(a[i]) + bf(b[i]));
        din[i] = bf(out[i]) > 0.0f ? sum : 0;
    }
    return 0;
}

/* ---- poolings: the CPU layers on NCHW copies ---- */

static int pooled(int in, int k, int stride, int pad) { return (in + 2 * pad - k) / stride + 1; }

int visc_cuda_maxpool_forward_nhwc_bf16(visc_cuda *ctx, uint16_t *out, int32_t *argmax,
                                        const uint16_t *in, int N, int C, int H, int W, int kernel,
                                        int stride, int pad) {
    const int PQ = pooled(H, kernel, stride, pad) * pooled(W, kernel, stride, pad);
    float *x = standin_nhwc_to_nchw(in, N, C, H * W);
    float *y = visc_alloc_aligned((size_t)N * C * PQ * sizeof(float), "stand-in pooling");
    int32_t *am = visc_alloc_aligned((size_t)N * C * PQ * sizeof(int32_t), "stand-in pooling");
    const int rc = visc_cuda_maxpool_forward(ctx, y, am, x, N, C, H, W, kernel, stride, pad);
    if (!rc) {
        standin_nchw_to_nhwc(out, y, N, C, PQ); /* exact: y holds bf16 values */
        for (int n = 0; n < N; n++)
            for (int i = 0; i < PQ; i++)
                for (int c = 0; c < C; c++)
                    argmax[((size_t)n * PQ + i) * C + c] = am[((size_t)n * C + c) * PQ + i];
    }
    visc_free_aligned(am);
    visc_free_aligned(y);
    visc_free_aligned(x);
    return rc;
}

int visc_cuda_maxpool_backward_nhwc_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *dout,
                                         const int32_t *argmax, int N, int C, int H, int W,
                                         int kernel, int stride, int pad) {
    const int PQ = pooled(H, kernel, stride, pad) * pooled(W, kernel, stride, pad);
    float *dy = standin_nhwc_to_nchw(dout, N, C, PQ);
    float *dx = visc_alloc_aligned((size_t)N * C * H * W * sizeof(float), "stand-in pooling");
    int32_t *am = visc_alloc_aligned((size_t)N * C * PQ * sizeof(int32_t), "stand-in pooling");
    for (int n = 0; n < N; n++)
        for (int i = 0; i < PQ; i++)
            for (int c = 0; c < C; c++)
                am[((size_t)n * C + c) * PQ + i] = argmax[((size_t)n * PQ + i) * C + c];
    const int rc = visc_cuda_maxpool_backward(ctx, dx, dy, am, N, C, H, W, kernel, stride, pad);
    if (!rc) standin_nchw_to_nhwc(din, dx, N, C, H * W);
    visc_free_aligned(am);
    visc_free_aligned(dx);
    visc_free_aligned(dy);
    return rc;
}

int visc_cuda_global_avgpool_forward_nhwc_bf16(visc_cuda *ctx, float *out, const uint16_t *in,
                                               int N, int C, int HW) {
    float *x = standin_nhwc_to_nchw(in, N, C, HW);
    const int rc = visc_cuda_global_avgpool_forward(ctx, out, x, N, C, HW);
    visc_free_aligned(x);
    return rc;
}

int visc_cuda_global_avgpool_backward_nhwc_bf16(visc_cuda *ctx, uint16_t *din, const float *dout,
                                                int N, int C, int HW) {
    float *dx = visc_alloc_aligned((size_t)N * C * HW * sizeof(float), "stand-in pooling");
    const int rc = visc_cuda_global_avgpool_backward(ctx, dx, dout, N, C, HW);
    if (!rc) standin_nchw_to_nhwc(din, dx, N, C, HW);
    visc_free_aligned(dx);
    return rc;
}

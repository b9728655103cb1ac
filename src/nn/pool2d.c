/* pool2d.c: max and average pooling over square windows, PyTorch semantics
 * (floor output size, implicit -inf padding for max, count_include_pad for
 * average). Own loops, one (n, c) plane per OpenMP iteration: pooling is
 * memory-bound and planes are independent, so backward can scatter into
 * its plane without atomics. */
#include <math.h>
#include <string.h>

#include "visc/nn.h"

void visc_pool2d_init(visc_pool2d *p, int N, int C, int H, int W, int kernel, int stride, int pad) {
    VISC_ASSERT(N > 0 && C > 0 && H > 0 && W > 0 && kernel > 0 && stride > 0);
    VISC_ASSERT(pad >= 0 && 2 * pad <= kernel); /* torch's limit: pad at most half the kernel */
    p->N = N, p->C = C, p->H = H, p->W = W;
    p->kernel = kernel, p->stride = stride, p->pad = pad;
    p->P = (H + 2 * pad - kernel) / stride + 1;
    p->Q = (W + 2 * pad - kernel) / stride + 1;
    VISC_ASSERT(p->P > 0 && p->Q > 0);
    p->device = VISC_DEVICE_CPU;
    p->impl = NULL;
}

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

/* One output row of max pooling, taps outermost: for each tap (h, kw) in the
 * window's row-major order, one pass over the outputs the tap reaches. Each
 * output still sees its taps in the scalar order (h, then w), so the rule
 * "first maximum wins, NaN propagates" (as torch: v > m || isnan(v)) is kept
 * exactly, but the inner loop is a branch-free select over ow that the
 * compiler vectorizes. Inlined with the stride as a constant (1 and 2 are
 * the common cases) so the strided loads vectorize too. */
static inline __attribute__((always_inline)) void
maxpool_row(float *restrict y, int32_t *restrict am, const float *restrict x, int W, int Q, int k,
            int s, int pad, int h0, int h1) {
    for (int ow = 0; ow < Q; ow++) {
        y[ow] = -INFINITY;
        am[ow] = h0 * W + imax(ow * s - pad, 0);
    }
    for (int h = h0; h < h1; h++) {
        const float *xr = x + (size_t)h * W;
        for (int kw = 0; kw < k; kw++) {
            /* outputs whose tap w = ow * s - pad + kw lies in [0, W) */
            int off = kw - pad;
            int lo = off >= 0 ? 0 : (-off + s - 1) / s;
            int hi = W - 1 - off < 0 ? 0 : imin(Q, (W - 1 - off) / s + 1);
            int32_t base = h * W + off;
            for (int ow = lo; ow < hi; ow++) {
                float v = xr[ow * s + off];
                int take = v > y[ow] || v != v;
                y[ow] = take ? v : y[ow];
                am[ow] = take ? base + ow * s : am[ow];
            }
        }
    }
}

void visc_maxpool2d_forward(visc_pool2d *p, float *out, int32_t *argmax, const float *in) {
    const int H = p->H, W = p->W, P = p->P, Q = p->Q, k = p->kernel, s = p->stride, pad = p->pad;
    const int planes = p->N * p->C;
#pragma omp parallel for schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        const float *x = in + (size_t)pl * H * W;
        float *y = out + (size_t)pl * P * Q;
        int32_t *am = argmax + (size_t)pl * P * Q;
        for (int oh = 0; oh < P; oh++) {
            int h0 = imax(oh * s - pad, 0), h1 = imin(oh * s - pad + k, H);
            float *yr = y + (size_t)oh * Q;
            int32_t *ar = am + (size_t)oh * Q;
            if (s == 2) maxpool_row(yr, ar, x, W, Q, k, 2, pad, h0, h1);
            else if (s == 1) maxpool_row(yr, ar, x, W, Q, k, 1, pad, h0, h1);
            else maxpool_row(yr, ar, x, W, Q, k, s, pad, h0, h1);
        }
    }
}

void visc_maxpool2d_backward(visc_pool2d *p, float *din, const float *dout, const int32_t *argmax) {
    const int HW = p->H * p->W, PQ = p->P * p->Q;
    const int planes = p->N * p->C;
#pragma omp parallel for schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        float *dx = din + (size_t)pl * HW;
        const float *dy = dout + (size_t)pl * PQ;
        const int32_t *am = argmax + (size_t)pl * PQ;
        memset(dx, 0, sizeof(float) * HW);
        for (int i = 0; i < PQ; i++) dx[am[i]] += dy[i];
    }
}

/* Average pooling divides by the window clipped to the padded image, as
 * torch with count_include_pad=True (k*k whenever ceil_mode is off). */
static int window_size(const visc_pool2d *p, int oh, int ow) {
    int h0 = oh * p->stride - p->pad, w0 = ow * p->stride - p->pad;
    int h1 = imin(h0 + p->kernel, p->H + p->pad), w1 = imin(w0 + p->kernel, p->W + p->pad);
    return (h1 - h0) * (w1 - w0);
}

void visc_avgpool2d_forward(visc_pool2d *p, float *out, const float *in) {
    const int H = p->H, W = p->W, P = p->P, Q = p->Q, k = p->kernel, s = p->stride, pad = p->pad;
    const int planes = p->N * p->C;
#pragma omp parallel for schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        const float *x = in + (size_t)pl * H * W;
        float *y = out + (size_t)pl * P * Q;
        for (int oh = 0; oh < P; oh++) {
            int h0 = imax(oh * s - pad, 0), h1 = imin(oh * s - pad + k, H);
            for (int ow = 0; ow < Q; ow++) {
                int w0 = imax(ow * s - pad, 0), w1 = imin(ow * s - pad + k, W);
                float sum = 0;
                for (int h = h0; h < h1; h++)
                    for (int w = w0; w < w1; w++) sum += x[h * W + w];
                y[oh * Q + ow] = sum / (float)window_size(p, oh, ow);
            }
        }
    }
}

void visc_avgpool2d_backward(visc_pool2d *p, float *din, const float *dout) {
    const int H = p->H, W = p->W, P = p->P, Q = p->Q, k = p->kernel, s = p->stride, pad = p->pad;
    const int planes = p->N * p->C;
#pragma omp parallel for schedule(static)
    for (int pl = 0; pl < planes; pl++) {
        float *dx = din + (size_t)pl * H * W;
        const float *dy = dout + (size_t)pl * P * Q;
        memset(dx, 0, sizeof(float) * H * W);
        for (int oh = 0; oh < P; oh++) {
            int h0 = imax(oh * s - pad, 0), h1 = imin(oh * s - pad + k, H);
            for (int ow = 0; ow < Q; ow++) {
                int w0 = imax(ow * s - pad, 0), w1 = imin(ow * s - pad + k, W);
                float g = dy[oh * Q + ow] / (float)window_size(p, oh, ow);
                for (int h = h0; h < h1; h++)
                    for (int w = w0; w < w1; w++) dx[h * W + w] += g;
            }
        }
    }
}

void visc_pool2d_destroy(visc_pool2d *p) { p->impl = NULL; }

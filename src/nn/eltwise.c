/* eltwise.c: elementwise ReLU and residual additions (and the sum of two
 * gradient paths masked by a ReLU's output, one pass for two).
 *
 * Plain loops the compiler vectorizes; threads only when the array is large
 * enough to pay for waking them. */
#include "visc/nn.h"

#define PAR_MIN 32768 /* elements below which one thread is faster */

void visc_relu_forward(float *out, const float *in, size_t n) {
/* x < 0 ? 0 : x keeps NaN as NaN (a diverged run stays visibly diverged). */
#pragma omp parallel for simd if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = in[i] < 0.0f ? 0.0f : in[i];
}

void visc_relu_backward(float *din, const float *dout, const float *out, size_t n) {
/* The gradient at 0 is taken as 0, as PyTorch does (threshold_backward).
 * dout[i] is loaded unconditionally: a load only under out > 0 blocks
 * if-conversion, and gcc then emits a scalar compare-and-branch loop
 * that mispredicts on random signs (11x slower). din may alias dout. */
#pragma omp parallel for simd if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = dout[i];
        din[i] = out[i] > 0.0f ? g : 0.0f;
    }
}

void visc_add_forward(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for simd if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void visc_add_relu_backward(float *din, const float *a, const float *b, const float *out,
                            size_t n) {
/* the sum's bits where out > 0, as visc_add_forward then visc_relu_backward */
#pragma omp parallel for simd if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = a[i] + b[i];
        din[i] = out[i] > 0.0f ? g : 0.0f;
    }
}

void visc_add_inplace(float *acc, const float *x, size_t n) {
#pragma omp parallel for simd if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

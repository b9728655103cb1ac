/* gelu.c: GELU in its exact erf form, torch.nn.GELU() (approximate='none').
 *
 *   y  = x * Phi(x),            Phi(x) = 0.5 (1 + erf(x / sqrt 2))
 *   y' = Phi(x) + x * phi(x),   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 *
 * GELU runs on the 4C-wide MLP activations of every block, so it has to be
 * vectorized, and libm's erff is not. Phi comes from the complementary error
 * function in the form of Abramowitz & Stegun 7.1.26, the same form as
 * PyTorch's own vectorized erf (absolute error <= 1.5e-7):
 *   erfc(z) = t P(t) exp(-z^2),  t = 1 / (1 + 0.3275911 z),  z = |x| / sqrt 2
 *   Phi(x)  = 1 - erfc(z) / 2 for x >= 0,  erfc(z) / 2 for x < 0
 * Taking the negative side from erfc directly avoids the cancellation of
 * 1 + erf(x) for large negative x. exp is visc_fast_exp (fast_exp.h). */
#include <string.h>

#include "fast_exp.h"
#include "visc/tokens.h"

#define INV_SQRT2 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f

/* Phi(x), given e = exp(-x^2 / 2). */
static inline float gauss_cdf(float x, float e) {
    const float z = (x < 0.0f ? -x : x) * INV_SQRT2;
    const float t = 1.0f / (1.0f + 0.3275911f * z);
    const float p =
        t * (0.254829592f +
             t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    const float half_erfc = 0.5f * p * e;
    return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) static void
gelu_forward_range(float *out, const float *in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float x = in[i];
        out[i] = x * gauss_cdf(x, visc_fast_exp(-0.5f * x * x));
    }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) static void
gelu_backward_range(float *din, const float *dout, const float *in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float x = in[i], e = visc_fast_exp(-0.5f * x * x);
        din[i] = dout[i] * (gauss_cdf(x, e) + x * INV_SQRT_2PI * e);
    }
}

/* Threads take chunks of 16 Ki elements (64 KiB, L2-friendly). */
#define CHUNK 16384

void visc_gelu_forward(float *out, const float *in, size_t n) {
    const size_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for if (chunks > 2)
    for (size_t c = 0; c < chunks; c++) {
        const size_t i0 = c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
        gelu_forward_range(out + i0, in + i0, len);
    }
}

void visc_gelu_backward(float *din, const float *dout, const float *in, size_t n) {
    const size_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for if (chunks > 2)
    for (size_t c = 0; c < chunks; c++) {
        const size_t i0 = c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
        gelu_backward_range(din + i0, dout + i0, in + i0, len);
    }
}

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
 * 1 + erf(x) for large negative x. exp is the polynomial of exp_poly below. */
#include <string.h>

#include "visc/tokens.h"

#define INV_SQRT2 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f

/* exp(x) for x <= 0 (Cody-Waite reduction, Cephes' degree-6 polynomial,
 * ~2 ulp; 0 below -87); as exp_approx in attention.c. */
static inline float exp_poly(float x) {
    const float xc = x < -87.0f ? -87.0f : x;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float n = (xc * 1.44269504088896341f + magic) - magic;
    const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return x < -87.0f ? 0.0f : e * two_n;
}

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
        out[i] = x * gauss_cdf(x, exp_poly(-0.5f * x * x));
    }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) static void
gelu_backward_range(float *din, const float *dout, const float *in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float x = in[i], e = exp_poly(-0.5f * x * x);
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

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
 * 1 + erf(x) for large negative x. exp is visc_fast_exp (fast_exp.h).
 *
 * On AVX-512 CPUs the loops run as hand-written 16-lane code: the same
 * formulas, but 1 / (1 + 0.3275911 z) as a reciprocal estimate refined by
 * one Newton step (relative error ~1e-7 instead of the 0.5 ulp of a
 * division: the compiler's vdivps was the loop's bottleneck, GELU ~6% of a
 * Swin-T step) and exp's 2^n through vscalefps. */
#include <string.h>

#include "fast_exp.h"
#include "linear_bf16.h"
#include "visc/cpu.h"
#include "visc/tokens.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GELU_AVX512 1
#endif

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

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
gelu_forward_range(float *out, const float *in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float x = in[i];
        out[i] = x * gauss_cdf(x, visc_fast_exp(-0.5f * x * x));
    }
}

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
gelu_backward_range(float *din, const float *dout, const float *in, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        const float x = in[i], e = visc_fast_exp(-0.5f * x * x);
        din[i] = dout[i] * (gauss_cdf(x, e) + x * INV_SQRT_2PI * e);
    }
}

#ifdef GELU_AVX512
#define AVX512 __attribute__((target("avx512f")))

/* visc_fast_exp on 16 lanes (same reduction and polynomial). */
static inline AVX512 __m512 exp16(__m512 x) {
    const __m512 xc =
        _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 e =
        _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    return _mm512_maskz_scalef_ps((__mmask16)~under, e, n);
}

/* Phi(x) and e = exp(-x^2 / 2), as gauss_cdf. */
static inline AVX512 __m512 cdf16(__m512 x, __m512 *e_out) {
    const __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(INV_SQRT2));
    const __m512 d = _mm512_fmadd_ps(z, _mm512_set1_ps(0.3275911f), _mm512_set1_ps(1.0f));
    __m512 t = _mm512_rcp14_ps(d);
    t = _mm512_mul_ps(t, _mm512_fnmadd_ps(d, t, _mm512_set1_ps(2.0f))); /* Newton: t (2 - d t) */
    __m512 p = _mm512_fmadd_ps(t, _mm512_set1_ps(1.061405429f), _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    p = _mm512_mul_ps(p, t);
    const __m512 e = exp16(_mm512_mul_ps(_mm512_mul_ps(x, x), _mm512_set1_ps(-0.5f)));
    *e_out = e;
    const __m512 half_erfc = _mm512_mul_ps(_mm512_mul_ps(p, e), _mm512_set1_ps(0.5f));
    const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(neg, _mm512_sub_ps(_mm512_set1_ps(1.0f), half_erfc), half_erfc);
}

/* Full vectors through plain loads and stores (masked stores of all 16
 * lanes measured ~1.7x slower on Zen 5 when streaming from memory); the
 * tail through masks. */
static inline AVX512 void gelu_forward16(float *out, const float *in, __mmask16 k) {
    const __m512 x = _mm512_maskz_loadu_ps(k, in);
    __m512 e;
    const __m512 y = _mm512_mul_ps(x, cdf16(x, &e));
    if (k == (__mmask16)0xffff) _mm512_storeu_ps(out, y);
    else _mm512_mask_storeu_ps(out, k, y);
}

static AVX512 void gelu_forward_avx512(float *out, const float *in, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) gelu_forward16(out + i, in + i, (__mmask16)0xffff);
    if (i < n) gelu_forward16(out + i, in + i, (__mmask16)((1u << (n - i)) - 1));
}

/* 16 lanes rounded to bf16 as visc_f32_to_bf16: round to nearest even, NaN quieted. */
static inline AVX512 __m256i round_bf16(__m512 y) {
    const __m512i u = _mm512_castps_si512(y);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

static AVX512 void gelu_forward_bf16_avx512(uint16_t *out, const float *in, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(in + i);
        __m512 e;
        _mm256_storeu_si256((__m256i *)(out + i), round_bf16(_mm512_mul_ps(x, cdf16(x, &e))));
    }
    if (i < n) {
        float y[16];
        gelu_forward_avx512(y, in + i, n - i);
        for (size_t j = 0; j < n - i; j++) out[i + j] = visc_f32_to_bf16(y[j]);
    }
}

static inline AVX512 void gelu_backward16(float *din, const float *dout, const float *in,
                                          __mmask16 k) {
    const __m512 x = _mm512_maskz_loadu_ps(k, in), g = _mm512_maskz_loadu_ps(k, dout);
    __m512 e;
    const __m512 phi = cdf16(x, &e);
    const __m512 dphi = _mm512_fmadd_ps(_mm512_mul_ps(x, _mm512_set1_ps(INV_SQRT_2PI)), e, phi);
    const __m512 y = _mm512_mul_ps(g, dphi);
    if (k == (__mmask16)0xffff) _mm512_storeu_ps(din, y);
    else _mm512_mask_storeu_ps(din, k, y);
}

static AVX512 void gelu_backward_avx512(float *din, const float *dout, const float *in, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) gelu_backward16(din + i, dout + i, in + i, (__mmask16)0xffff);
    if (i < n) gelu_backward16(din + i, dout + i, in + i, (__mmask16)((1u << (n - i)) - 1));
}
/* The same on 8 lanes for AVX2 CPUs (the compiler's loop above divides and
 * blends bytes; this is ~1.6x faster there): 1 / (1 + 0.3275911 z) from
 * the 12-bit reciprocal estimate and one Newton step, 2^n through the
 * exponent bits as visc_fast_exp does. */
#define AVX2_FMA __attribute__((target("avx2,fma")))

static inline AVX2_FMA __m256 exp8(__m256 x) {
    const __m256 xc =
        _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 e =
        _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    const __m256i bits =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 y = _mm256_mul_ps(e, _mm256_castsi256_ps(bits));
    return _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ));
}

static inline AVX2_FMA __m256 cdf8(__m256 x, __m256 *e_out) {
    const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    const __m256 z = _mm256_mul_ps(ax, _mm256_set1_ps(INV_SQRT2));
    const __m256 d = _mm256_fmadd_ps(z, _mm256_set1_ps(0.3275911f), _mm256_set1_ps(1.0f));
    __m256 t = _mm256_rcp_ps(d);
    t = _mm256_mul_ps(t, _mm256_fnmadd_ps(d, t, _mm256_set1_ps(2.0f))); /* Newton: t (2 - d t) */
    __m256 p = _mm256_fmadd_ps(t, _mm256_set1_ps(1.061405429f), _mm256_set1_ps(-1.453152027f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
    p = _mm256_mul_ps(p, t);
    const __m256 e = exp8(_mm256_mul_ps(_mm256_mul_ps(x, x), _mm256_set1_ps(-0.5f)));
    *e_out = e;
    const __m256 half_erfc = _mm256_mul_ps(_mm256_mul_ps(p, e), _mm256_set1_ps(0.5f));
    const __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), half_erfc), half_erfc, neg);
}

/* Whole vectors here, the tail (under 8) through the portable loops. */
static AVX2_FMA void gelu_forward_avx2(float *out, const float *in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(in + i);
        __m256 e;
        _mm256_storeu_ps(out + i, _mm256_mul_ps(x, cdf8(x, &e)));
    }
    if (i < n) gelu_forward_range(out + i, in + i, n - i);
}

static AVX2_FMA void gelu_backward_avx2(float *din, const float *dout, const float *in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(in + i);
        __m256 e;
        const __m256 phi = cdf8(x, &e);
        const __m256 dphi = _mm256_fmadd_ps(_mm256_mul_ps(x, _mm256_set1_ps(INV_SQRT_2PI)), e, phi);
        _mm256_storeu_ps(din + i, _mm256_mul_ps(_mm256_loadu_ps(dout + i), dphi));
    }
    if (i < n) gelu_backward_range(din + i, dout + i, in + i, n - i);
}
#undef AVX2_FMA
#endif

/* The rounded forward without AVX-512: through a small fp32 buffer. */
static void gelu_forward_bf16_range(uint16_t *out, const float *in, size_t n, int level) {
    float y[256];
    for (size_t i = 0; i < n; i += 256) {
        const size_t m = n - i < 256 ? n - i : 256;
#ifdef GELU_AVX512
        if (level == 1) gelu_forward_avx2(y, in + i, m);
        else
#endif
            gelu_forward_range(y, in + i, m);
        for (size_t j = 0; j < m; j++) out[i + j] = visc_f32_to_bf16(y[j]);
    }
}

typedef enum { GELU_FORWARD, GELU_BACKWARD, GELU_FORWARD_BF16 } gelu_pass;

/* Elements [i0, i0 + len) of one pass, on the code of visc_cpu_level(). */
static void run_range(gelu_pass pass, int level, void *out, const float *dout, const float *in,
                      size_t i0, size_t len) {
    float *y = (float *)out + i0;
    if (pass == GELU_FORWARD_BF16) {
#ifdef GELU_AVX512
        if (level == 2) {
            gelu_forward_bf16_avx512((uint16_t *)out + i0, in + i0, len);
            return;
        }
#endif
        gelu_forward_bf16_range((uint16_t *)out + i0, in + i0, len, level);
        return;
    }
#ifdef GELU_AVX512
    if (level == 2) {
        if (pass == GELU_FORWARD) gelu_forward_avx512(y, in + i0, len);
        else gelu_backward_avx512(y, dout + i0, in + i0, len);
        return;
    }
    if (level == 1) {
        if (pass == GELU_FORWARD) gelu_forward_avx2(y, in + i0, len);
        else gelu_backward_avx2(y, dout + i0, in + i0, len);
        return;
    }
#endif
    if (pass == GELU_FORWARD) gelu_forward_range(y, in + i0, len);
    else gelu_backward_range(y, dout + i0, in + i0, len);
}

/* Threads take chunks of 16 Ki elements (64 KiB, L2-friendly). */
#define CHUNK 16384

static void run(gelu_pass pass, void *out, const float *dout, const float *in, size_t n) {
    const size_t chunks = (n + CHUNK - 1) / CHUNK;
    const int level = visc_cpu_level();
#pragma omp parallel for if (chunks > 2)
    for (size_t c = 0; c < chunks; c++) {
        const size_t i0 = c * CHUNK;
        run_range(pass, level, out, dout, in, i0, n - i0 < CHUNK ? n - i0 : CHUNK);
    }
}

void visc_gelu_forward(float *out, const float *in, size_t n) {
    run(GELU_FORWARD, out, NULL, in, n);
}

void visc_gelu_backward(float *din, const float *dout, const float *in, size_t n) {
    run(GELU_BACKWARD, din, dout, in, n);
}

void visc_gelu_forward_bf16(uint16_t *out, const float *in, size_t n) {
    run(GELU_FORWARD_BF16, out, NULL, in, n);
}

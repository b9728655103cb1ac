/* fast_exp.h: exp(x) for the softmax and GELU loops, private to src/nn/.
 *
 * Cody-Waite reduction x = n ln2 + r, Cephes' degree-6 polynomial for exp(r)
 * on |r| <= ln2 / 2, then 2^n through the exponent bits. Relative error ~2
 * ulp, the same as libm's on this range, but plain arithmetic the compiler
 * vectorizes (libm's expf call does not). Below -87 (where 2^n would be
 * subnormal) it returns 0: callers sum it with terms >= 1 or multiply it by
 * a bounded factor, so such values are far below their rounding. Inputs are
 * clamped at 88 (exp overflows float just above). */
#ifndef VISC_NN_FAST_EXP_H
#define VISC_NN_FAST_EXP_H

#include <stdint.h>
#include <string.h>

static inline float visc_fast_exp(float x) {
    const float xc = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
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

#endif

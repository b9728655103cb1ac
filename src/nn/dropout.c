/* dropout.c: inverted dropout with a counter-based mask.
 *
 * Element i is kept when the Philox word for counter (offset + i) of the
 * key derived from (seed, VISC_STREAM_DROPOUT), as a 24-bit uniform, is
 * >= p. The decision is a pure function of (seed, offset + i): it does not
 * depend on the thread count, on how a tensor is split into calls, or on
 * anything drawn before, so a resumed run or a recomputed forward draws the
 * same mask. Kept elements are scaled by 1 / (1 - p) so the expectation is
 * unchanged and evaluation needs no rescaling. */
#include "visc/nn.h"
#include "visc/rng.h"

/* One Philox block gives 4 words: element j = offset + i uses word j % 4 of
 * block j / 4, so a block is computed once for 4 neighbouring elements. */
void visc_dropout_forward(float *out, uint8_t *mask, const float *in, size_t n, float p,
                          uint64_t seed, uint64_t offset) {
    VISC_ASSERT(p >= 0.0f && p < 1.0f);
    if (n == 0) return;
    const float scale = 1.0f / (1.0f - p);
    const visc_rng base = visc_rng_make(seed, VISC_STREAM_DROPOUT, 0);
    const uint64_t first = offset >> 2, last = (offset + n - 1) >> 2;
#pragma omp parallel for if (n > 16384)
    for (uint64_t b = first; b <= last; b++) {
        uint32_t w[4];
        visc_philox4x32(base.key, base.stream, b, w);
        for (int lane = 0; lane < 4; lane++) {
            uint64_t j = b * 4 + (uint64_t)lane;
            if (j < offset || j >= offset + n) continue;
            size_t i = (size_t)(j - offset);
            float u = (float)(w[lane] >> 8) * (1.0f / 16777216.0f);
            uint8_t keep = u >= p;
            mask[i] = keep;
            out[i] = keep ? in[i] * scale : 0.0f;
        }
    }
}

void visc_dropout_backward(float *din, const float *dout, const uint8_t *mask, size_t n, float p) {
    VISC_ASSERT(p >= 0.0f && p < 1.0f);
    const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for simd if (n > 32768)
    for (size_t i = 0; i < n; i++) din[i] = mask[i] ? dout[i] * scale : 0.0f;
}

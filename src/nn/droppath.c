/* droppath.c: stochastic depth fused with the residual add, x += drop_path(branch).
 *
 * As timm's drop_path (scale_by_keep=True): sample b keeps its branch with
 * probability 1 - p, keep_b = floor(1 - p + U), U ~ U[0, 1), and a kept
 * branch is scaled by 1 / (1 - p) so the expectation is unchanged.
 *
 * U for sample b is the first uniform of the stream (seed,
 * VISC_STREAM_DROPOUT, offset + b): a pure function of (seed, offset + b),
 * independent of the thread count and of everything drawn before, so a
 * resumed run or a recomputed forward drops the same samples. Callers give
 * each drop-path site and step its own offset range (e.g. offset = (step *
 * sites + site) * B). The dropped samples' branches are never read. */
#include <string.h>
#include <math.h>

#include "visc/core.h"
#include "visc/rng.h"
#include "visc/tokens.h"

void visc_droppath_keep(float *keep, int B, float p, int train, uint64_t seed, uint64_t offset) {
    VISC_ASSERT(B >= 0 && p >= 0.0f && p < 1.0f);
    const int drop = train && p > 0.0f;
    const float scale = drop ? 1.0f / (1.0f - p) : 1.0f;
    for (int b = 0; b < B; b++) {
        float k = 1.0f;
        if (drop) {
            visc_rng r = visc_rng_make(seed, VISC_STREAM_DROPOUT, offset + (uint64_t)b);
            k = floorf(1.0f - p + visc_rng_uniform(&r)) * scale;
        }
        keep[b] = k;
    }
}

void visc_droppath_add_forward(float *out, const float *x, const float *branch, float *keep, int B,
                               size_t per_sample, float p, int train, uint64_t seed,
                               uint64_t offset) {
    visc_droppath_keep(keep, B, p, train, seed, offset);
    const int64_t total = (int64_t)B * (int64_t)per_sample;
#pragma omp parallel for if (total > 32768)
    for (int b = 0; b < B; b++) {
        const float k = keep[b];
        float *ob = out + (size_t)b * per_sample;
        const float *xb = x + (size_t)b * per_sample, *yb = branch + (size_t)b * per_sample;
        if (k == 0.0f) {
            if (ob != xb) memcpy(ob, xb, per_sample * sizeof(float));
        } else if (k == 1.0f) {
            for (size_t i = 0; i < per_sample; i++) ob[i] = xb[i] + yb[i];
        } else {
            for (size_t i = 0; i < per_sample; i++) ob[i] = xb[i] + k * yb[i];
        }
    }
}

void visc_droppath_add_backward(float *dbranch, const float *dx, const float *keep, int B,
                                size_t per_sample) {
    VISC_ASSERT(B >= 0);
    const int64_t total = (int64_t)B * (int64_t)per_sample;
#pragma omp parallel for if (total > 32768)
    for (int b = 0; b < B; b++) {
        const float k = keep[b];
        float *d = dbranch + (size_t)b * per_sample;
        const float *g = dx + (size_t)b * per_sample;
        for (size_t i = 0; i < per_sample; i++) d[i] = k * g[i];
    }
}

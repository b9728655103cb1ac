/* pos_embed.c: bicubic resampling of a position-embedding grid [h, w, C].
 *
 * Two flavours, as F.interpolate(mode='bicubic', align_corners=False) has:
 * plain (antialias=False, below) and antialiased (antialias=True, further
 * down), the one timm's resample_abs_pos_embed uses by default when it
 * loads a checkpoint made for another resolution.
 *
 * Mirrors PyTorch's upsample_bicubic2d (align_corners=False, A = -0.75),
 * which timm's resample_abs_pos_embed calls when a checkpoint trained at one
 * resolution meets another:
 *   src = (dst + 0.5) * in / out - 0.5   (not clamped, unlike bilinear)
 *   i = floor(src), t = src - i; taps i-1 .. i+2, indices clamped to the
 *   border; weights from Keys' cubic convolution kernel.
 * The kernel is separable: out = sum_{ky,kx} wy[ky] wx[kx] in[y_ky, x_kx].
 * Same size is the identity (t = 0 gives weights 0, 1, 0, 0). */
#include <math.h>
#include <stdlib.h>

#include "visc/core.h"
#include "visc/tokens.h"

#define CUBIC_A -0.75f

/* Keys' kernel for |x| <= 1 and for 1 < |x| < 2. */
static float cubic1(float x) { return ((CUBIC_A + 2.0f) * x - (CUBIC_A + 3.0f)) * x * x + 1.0f; }
static float cubic2(float x) {
    return ((CUBIC_A * x - 5.0f * CUBIC_A) * x + 8.0f * CUBIC_A) * x - 4.0f * CUBIC_A;
}

/* Taps and weights of output coordinate `dst` along one axis. */
static void taps(int dst, int in_size, int out_size, int idx[4], float w[4]) {
    const float scale = (float)in_size / (float)out_size;
    const float src = scale * ((float)dst + 0.5f) - 0.5f;
    const float fl = floorf(src);
    const float t = src - fl;
    w[0] = cubic2(t + 1.0f);
    w[1] = cubic1(t);
    w[2] = cubic1(1.0f - t);
    w[3] = cubic2(2.0f - t);
    for (int k = 0; k < 4; k++) {
        int i = (int)fl - 1 + k;
        idx[k] = i < 0 ? 0 : i >= in_size ? in_size - 1 : i;
    }
}

void visc_pos_embed_resample(float *out, const float *in, int C, int old_h, int old_w, int new_h,
                             int new_w) {
    VISC_ASSERT(C > 0 && old_h > 0 && old_w > 0 && new_h > 0 && new_w > 0);
#pragma omp parallel for if ((int64_t)new_h * new_w * C > 65536)
    for (int oy = 0; oy < new_h; oy++) {
        int iy[4], ix[4];
        float wy[4], wx[4];
        taps(oy, old_h, new_h, iy, wy);
        for (int ox = 0; ox < new_w; ox++) {
            taps(ox, old_w, new_w, ix, wx);
            float *o = out + ((int64_t)oy * new_w + ox) * C;
            for (int c = 0; c < C; c++) o[c] = 0.0f;
            for (int ky = 0; ky < 4; ky++) {
                for (int kx = 0; kx < 4; kx++) {
                    const float w = wy[ky] * wx[kx];
                    const float *s = in + ((int64_t)iy[ky] * old_w + ix[kx]) * C;
                    for (int c = 0; c < C; c++) o[c] += w * s[c];
                }
            }
        }
    }
}

/* ---- antialiased (torch's upsample_bicubic2d_aa, timm's default) ----
 * Separable; along one axis, output i takes the inputs within `support` of
 * center = scale * (i + 0.5), scale = in / out, weighted by the cubic kernel
 * with A = -0.5 evaluated at (j - center + 0.5) / max(scale, 1), and
 * normalized to sum 1. Downsampling widens the kernel by the scale (that is
 * the antialiasing); upsampling uses it as is, with A = -0.5 rather than
 * plain bicubic's -0.75, so the two flavours differ even then. */

#define AA_A -0.5

static double aa_cubic(double x) {
    x = fabs(x);
    if (x < 1.0) return ((AA_A + 2.0) * x - (AA_A + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * AA_A;
    return 0.0;
}

/* Taps [*first, *first + *count) and their weights for output i. */
static void aa_taps(int i, int in_size, int out_size, int *first, int *count, float *w) {
    const double scale = (double)in_size / out_size;
    const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
    const double center = scale * (i + 0.5), invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);
    if (lo < 0) lo = 0;
    if (hi > in_size) hi = in_size;
    double total = 0;
    for (int j = lo; j < hi; j++) total += aa_cubic((j - center + 0.5) * invscale);
    for (int j = lo; j < hi; j++)
        w[j - lo] = (float)(total != 0 ? aa_cubic((j - center + 0.5) * invscale) / total : 0);
    *first = lo;
    *count = hi - lo;
}

void visc_pos_embed_resample_aa(float *out, const float *in, int C, int old_h, int old_w, int new_h,
                                int new_w) {
    VISC_ASSERT(C > 0 && old_h > 0 && old_w > 0 && new_h > 0 && new_w > 0);
    /* Width first into [old_h, new_w, C], then height. */
    /* A tap range never exceeds the input axis. */
    float *tmp = visc_malloc((size_t)old_h * new_w * C * sizeof(float), "pos_embed resample");
    float *wx = visc_malloc((size_t)old_w * sizeof(float), "resample weights");
    for (int ox = 0; ox < new_w; ox++) {
        int first, count;
        aa_taps(ox, old_w, new_w, &first, &count, wx);
        for (int y = 0; y < old_h; y++) {
            float *o = tmp + ((size_t)y * new_w + ox) * C;
            for (int c = 0; c < C; c++) o[c] = 0.0f;
            for (int k = 0; k < count; k++) {
                const float *s = in + ((size_t)y * old_w + first + k) * C;
                for (int c = 0; c < C; c++) o[c] += wx[k] * s[c];
            }
        }
    }
    float *wy = visc_malloc((size_t)old_h * sizeof(float), "resample weights");
    for (int oy = 0; oy < new_h; oy++) {
        int first, count;
        aa_taps(oy, old_h, new_h, &first, &count, wy);
        for (int x = 0; x < new_w; x++) {
            float *o = out + ((size_t)oy * new_w + x) * C;
            for (int c = 0; c < C; c++) o[c] = 0.0f;
            for (int k = 0; k < count; k++) {
                const float *s = tmp + ((size_t)(first + k) * new_w + x) * C;
                for (int c = 0; c < C; c++) o[c] += wy[k] * s[c];
            }
        }
    }
    free(wx);
    free(wy);
    free(tmp);
}

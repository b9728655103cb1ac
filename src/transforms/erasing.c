/* erasing.c: timm's RandomErasing on one normalized CHW image.
 *
 * With probability p the image gets `count` boxes (count uniform in
 * [min_count, max_count]); each box tries up to 10 times an area of
 * U(min_area, max_area) * H * W / count and an aspect h / w = exp(U(log
 * min_aspect, log max_aspect)), h = round(sqrt(area * aspect)), w =
 * round(sqrt(area / aspect)) (Python's round: half to even), keeping the
 * first that fits strictly inside (h < H, w < W) at a uniform position. It
 * runs after Normalize, so N(0, 1) fill values look like image statistics. */
#include <math.h>

#include "visc/autoaug.h"
#include "visc/core.h"

visc_erasing visc_erasing_default(float p) {
    visc_erasing e = {.p = p,
                      .mode = VISC_ERASE_PIXEL,
                      .min_area = 0.02f,
                      .max_area = 1.0f / 3.0f,
                      .min_aspect = 0.3f,
                      .max_aspect = 1.0f / 0.3f,
                      .min_count = 1,
                      .max_count = 1};
    return e;
}

/* random.uniform(a, b) */
static double uniform(visc_rng *r, double a, double b) {
    return a + (b - a) * visc_rng_uniform_double(r);
}

/* random.randint(a, b): both ends included */
static int randint(visc_rng *r, int a, int b) {
    return a + (int)visc_rng_below(r, (uint32_t)(b - a + 1));
}

void visc_random_erasing_apply(const visc_erasing *e, visc_rng *r, float *chw, int C, int H,
                               int W) {
    if (visc_rng_uniform_double(r) > e->p) return;
    double area = (double)H * W;
    int count =
        e->min_count >= e->max_count ? e->min_count : randint(r, e->min_count, e->max_count);
    double log_lo = log(e->min_aspect), log_hi = log(e->max_aspect);
    for (int c = 0; c < count; c++) {
        for (int attempt = 0; attempt < 10; attempt++) {
            double target = uniform(r, e->min_area, e->max_area) * area / count;
            double aspect = exp(uniform(r, log_lo, log_hi));
            int h = (int)nearbyint(sqrt(target * aspect));
            int w = (int)nearbyint(sqrt(target / aspect));
            if (!(w < W && h < H)) continue;
            int top = randint(r, 0, H - h), left = randint(r, 0, W - w);
            /* 'rand': one color per channel, drawn before the box is filled */
            for (int ch = 0; ch < C; ch++) {
                float color = e->mode == VISC_ERASE_RAND ? visc_rng_normal(r) : 0.0f;
                for (int y = top; y < top + h; y++) {
                    float *row = chw + ((size_t)ch * H + y) * W + left;
                    for (int x = 0; x < w; x++)
                        row[x] = e->mode == VISC_ERASE_PIXEL ? visc_rng_normal(r) : color;
                }
            }
            break;
        }
    }
}

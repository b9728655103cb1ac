/* mixup.c: timm's Mixup / CutMix in mode 'batch', and Beta sampling.
 *
 * One draw per batch (Mixup._params_per_batch): with probability `prob` the
 * batch is mixed, by cutmix with probability switch_prob (when both are on),
 * with lam ~ Beta(alpha, alpha) of the chosen method. Mixup blends the batch
 * with its reverse, x[i] = lam x[i] + (1 - lam) x[B-1-i]; cutmix pastes a
 * box of x[B-1-i] into x[i] (timm's rand_bbox: side sqrt(1 - lam) of the
 * image, centre uniform, clipped to the image) and corrects lam to the
 * pasted area. Targets blend the label-smoothed one-hots the same way.
 * The float arithmetic is torch's (products by float32 scalars, then a sum),
 * so the result equals timm's for the same lam and box. */
#include <math.h>
#include <string.h>

#include "visc/autoaug.h"
#include "visc/core.h"

/* ---- Gamma and Beta from the Philox stream ---- */

static double normal(visc_rng *r) {
    double u = 1.0 - visc_rng_uniform_double(r), v = visc_rng_uniform_double(r);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* Marsaglia & Tsang (2000), "A simple method for generating gamma
 * variables"; shape < 1 uses Gamma(shape) = Gamma(shape + 1) U^(1 / shape). */
double visc_sample_gamma(visc_rng *r, double shape) {
    VISC_ASSERT(shape > 0);
    if (shape < 1.0) {
        double u = visc_rng_uniform_double(r);
        return visc_sample_gamma(r, shape + 1.0) * pow(u, 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = normal(r), v = 1.0 + c * x;
        if (v <= 0.0) continue;
        v = v * v * v;
        double u = visc_rng_uniform_double(r);
        if (u < 1.0 - 0.0331 * (x * x) * (x * x)) return d * v;
        if (u > 0.0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v;
    }
}

double visc_sample_beta(visc_rng *r, double a, double b) {
    for (;;) {
        double x = visc_sample_gamma(r, a), y = visc_sample_gamma(r, b);
        if (x + y > 0.0) return x / (x + y); /* both underflowing to 0: draw again */
    }
}

/* ---- configuration ---- */

visc_mixup visc_mixup_default(int num_classes) {
    visc_mixup mx = {.mixup_alpha = 0.8,
                     .cutmix_alpha = 1.0,
                     .prob = 1.0,
                     .switch_prob = 0.5,
                     .correct_lam = 1,
                     .label_smoothing = 0.1,
                     .num_classes = num_classes};
    return mx;
}

static int has_minmax(const visc_mixup *mx) {
    return mx->cutmix_minmax[0] != 0.0 || mx->cutmix_minmax[1] != 0.0;
}

/* timm forces cutmix_alpha = 1 when a min/max box is set. */
static double cutmix_alpha(const visc_mixup *mx) { return has_minmax(mx) ? 1.0 : mx->cutmix_alpha; }

int visc_mixup_validate(const visc_mixup *mx) {
    if (!(mx->mixup_alpha >= 0) || !(mx->cutmix_alpha >= 0))
        return visc_set_error("mixup: alphas must be >= 0 (mixup %g, cutmix %g)", mx->mixup_alpha,
                              mx->cutmix_alpha);
    if (mx->prob > 0 && mx->mixup_alpha == 0 && cutmix_alpha(mx) == 0)
        return visc_set_error("mixup: mixup_alpha or cutmix_alpha must be > 0");
    if (!(mx->prob >= 0 && mx->prob <= 1) || !(mx->switch_prob >= 0 && mx->switch_prob <= 1))
        return visc_set_error("mixup: prob %g and switch_prob %g must lie in [0, 1]", mx->prob,
                              mx->switch_prob);
    if (!(mx->label_smoothing >= 0 && mx->label_smoothing < 1))
        return visc_set_error("mixup: label_smoothing %g must lie in [0, 1)", mx->label_smoothing);
    if (has_minmax(mx) &&
        !(mx->cutmix_minmax[0] > 0 && mx->cutmix_minmax[0] < mx->cutmix_minmax[1] &&
          mx->cutmix_minmax[1] <= 1))
        return visc_set_error("mixup: cutmix_minmax (%g, %g) must satisfy 0 < min < max <= 1",
                              mx->cutmix_minmax[0], mx->cutmix_minmax[1]);
    if (mx->num_classes <= 0) return visc_set_error("mixup: num_classes must be > 0");
    return 0;
}

/* ---- the draw ---- */

/* numpy's randint(lo, hi): hi excluded (an empty range, which numpy
 * refuses, gives lo). */
static int randint(visc_rng *r, int lo, int hi) {
    return hi > lo ? lo + (int)visc_rng_below(r, (uint32_t)(hi - lo)) : lo;
}

static int clip(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

void visc_mixup_draw(const visc_mixup *mx, visc_rng *r, int H, int W, visc_mixup_params *d) {
    memset(d, 0, sizeof *d);
    d->lam = d->lam_raw = 1.0;
    if (!(visc_rng_uniform_double(r) < mx->prob)) return;
    double ca = cutmix_alpha(mx);
    if (mx->mixup_alpha > 0 && ca > 0) {
        d->use_cutmix = visc_rng_uniform_double(r) < mx->switch_prob;
        d->lam = visc_sample_beta(r, d->use_cutmix ? ca : mx->mixup_alpha,
                                  d->use_cutmix ? ca : mx->mixup_alpha);
    } else if (mx->mixup_alpha > 0) {
        d->lam = visc_sample_beta(r, mx->mixup_alpha, mx->mixup_alpha);
    } else {
        d->use_cutmix = 1;
        d->lam = visc_sample_beta(r, ca, ca);
    }
    d->lam_raw = d->lam;
    if (!d->use_cutmix || d->lam == 1.0) return;
    if (has_minmax(mx)) {
        /* rand_bbox_minmax: sides uniform in [min, max) of the image */
        int ch = randint(r, (int)(H * mx->cutmix_minmax[0]), (int)(H * mx->cutmix_minmax[1]));
        int cw = randint(r, (int)(W * mx->cutmix_minmax[0]), (int)(W * mx->cutmix_minmax[1]));
        d->yl = randint(r, 0, H - ch);
        d->xl = randint(r, 0, W - cw);
        d->yh = d->yl + ch;
        d->xh = d->xl + cw;
    } else {
        /* rand_bbox: a box of sqrt(1 - lam) of each side around a uniform centre */
        double ratio = sqrt(1.0 - d->lam);
        int cut_h = (int)(H * ratio), cut_w = (int)(W * ratio);
        int cy = randint(r, 0, H), cx = randint(r, 0, W);
        d->yl = clip(cy - cut_h / 2, 0, H);
        d->yh = clip(cy + cut_h / 2, 0, H);
        d->xl = clip(cx - cut_w / 2, 0, W);
        d->xh = clip(cx + cut_w / 2, 0, W);
    }
    if (mx->correct_lam || has_minmax(mx))
        d->lam = 1.0 - (double)((d->yh - d->yl) * (d->xh - d->xl)) / (double)(H * W);
}

/* ---- the mix ---- */

void visc_mixup_mix(const visc_mixup *mx, const visc_mixup_params *d, float *x, int B, int C, int H,
                    int W, const int32_t *labels, float *targets) {
    const size_t img = (size_t)C * H * W;
    const float lf = (float)d->lam, mf = (float)(1.0 - d->lam);
    if (d->lam != 1.0) {
        for (int i = 0; i < B / 2; i++) {
            float *a = x + img * (size_t)i, *b = x + img * (size_t)(B - 1 - i);
            if (d->use_cutmix) {
                /* x[:, :, box] = x.flip(0)[:, :, box]: swap the boxes of the pair */
                for (int c = 0; c < C; c++)
                    for (int y = d->yl; y < d->yh; y++)
                        for (int xx = d->xl; xx < d->xh; xx++) {
                            size_t o = ((size_t)c * H + y) * W + xx;
                            float t = a[o];
                            a[o] = b[o];
                            b[o] = t;
                        }
            } else {
                for (size_t k = 0; k < img; k++) {
                    float va = a[k], vb = b[k];
                    a[k] = va * lf + vb * mf;
                    b[k] = vb * lf + va * mf;
                }
            }
        }
        if (B % 2 && !d->use_cutmix) { /* the middle image mixes with itself */
            float *m = x + img * (size_t)(B / 2);
            for (size_t k = 0; k < img; k++) m[k] = m[k] * lf + m[k] * mf;
        }
    }
    /* mixup_target: one_hot fills with float32 off / on values */
    const int K = mx->num_classes;
    const double s = mx->label_smoothing;
    const float off = (float)(s / K), on = (float)(1.0 - s + s / K);
    for (int i = 0; i < B; i++) {
        int y1 = labels[i], y2 = labels[B - 1 - i];
        VISC_ASSERT(y1 >= 0 && y1 < K && y2 >= 0 && y2 < K);
        float *t = targets + (size_t)i * K;
        for (int k = 0; k < K; k++) {
            float p = (k == y1 ? on : off) * lf, q = (k == y2 ? on : off) * mf;
            t[k] = p + q;
        }
    }
}

void visc_mixup_apply(const visc_mixup *mx, visc_rng *r, float *x, int B, int C, int H, int W,
                      const int32_t *labels, float *targets) {
    VISC_ASSERT(B % 2 == 0);
    visc_mixup_params d;
    visc_mixup_draw(mx, r, H, W, &d);
    visc_mixup_mix(mx, &d, x, B, C, H, W, labels, targets);
}

/* color.c: torchvision's colour transforms on PIL images, to the bit.
 *
 * torchvision 0.14 implements them with Pillow:
 * - brightness, contrast, saturation are ImageEnhance: Image.blend(
 *   degenerate, img, factor) with degenerate = black, the mean grey
 *   (int(mean of the L image + 0.5)), or the L image. Pillow's blend
 *   computes d + f * (v - d) in FLOAT (f is a C float), truncates toward
 *   zero, and clips to [0, 255] only when f is outside [0, 1];
 * - hue converts to Pillow's HSV (8-bit channels), adds
 *   np.uint8(hue_factor * 255) to H with uint8 wrap-around, converts back.
 *   Pillow's RGB <-> HSV mixes float and double arithmetic; the code below
 *   keeps each operation in the same precision, so the result is exact;
 * - RandomGrayscale and the L image use convert("L") (visc_luma).
 * The whole file must be compiled without floating-point contraction (no
 * FMA), which -std=c11 guarantees with gcc. */
#include <math.h>
#include <string.h>

#include "visc/core.h"
#include "visc/transforms.h"

static inline uint8_t *row_of(visc_image *img, int y) {
    return img->data + (size_t)y * img->stride;
}

/* Pillow's ImagingBlend for one byte: degenerate d, image v, factor f. */
static inline uint8_t blend(int d, int v, float f) {
    float t = (float)d + f * (float)(v - d);
    if (f >= 0.0f && f <= 1.0f) return (uint8_t)t;
    return t <= 0.0f ? 0 : t >= 255.0f ? 255 : (uint8_t)t;
}

/* Blend against a constant grey: a lookup table over the 256 byte values. */
static void blend_constant(visc_image *img, int d, float f) {
    uint8_t lut[256];
    for (int v = 0; v < 256; v++) lut[v] = blend(d, v, f);
    for (int y = 0; y < img->height; y++) {
        uint8_t *p = row_of(img, y);
        for (int i = 0; i < 3 * img->width; i++) p[i] = lut[p[i]];
    }
}

void visc_adjust_brightness(visc_image *img, float factor) { blend_constant(img, 0, factor); }

void visc_adjust_contrast(visc_image *img, float factor) {
    int64_t sum = 0;
    for (int y = 0; y < img->height; y++) {
        const uint8_t *p = row_of(img, y);
        for (int x = 0; x < img->width; x++) sum += visc_luma(p[3 * x], p[3 * x + 1], p[3 * x + 2]);
    }
    /* ImageStat's mean is sum / count in double; then int(mean + 0.5). */
    double mean = (double)sum / ((double)img->width * img->height);
    blend_constant(img, (int)(mean + 0.5), factor);
}

void visc_adjust_saturation(visc_image *img, float factor) {
    for (int y = 0; y < img->height; y++) {
        uint8_t *p = row_of(img, y);
        for (int x = 0; x < img->width; x++, p += 3) {
            int l = visc_luma(p[0], p[1], p[2]);
            p[0] = blend(l, p[0], factor);
            p[1] = blend(l, p[1], factor);
            p[2] = blend(l, p[2], factor);
        }
    }
}

static inline int clip8i(int v) { return v < 0 ? 0 : v > 255 ? 255 : v; }

/* Pillow's rgb2hsv_row (colorsys.py's formulas at 8 bits). */
static void rgb_to_hsv(const uint8_t *in, uint8_t *hsv) {
    int r = in[0], g = in[1], b = in[2];
    int maxc = r > g ? (r > b ? r : b) : (g > b ? g : b);
    int minc = r < g ? (r < b ? r : b) : (g < b ? g : b);
    hsv[2] = (uint8_t)maxc;
    if (minc == maxc) {
        hsv[0] = hsv[1] = 0;
        return;
    }
    float cr = (float)(maxc - minc);
    float s = cr / (float)maxc;
    float rc = (float)(maxc - r) / cr, gc = (float)(maxc - g) / cr, bc = (float)(maxc - b) / cr;
    float h;
    if (r == maxc) {
        h = bc - gc;
    } else if (g == maxc) {
        h = (float)(2.0 + rc - bc);
    } else {
        h = (float)(4.0 + gc - rc);
    }
    /* fmod(h / 6 + 1, 1) with the argument in [5/6, 11/6): one exact
     * subtraction instead of a libm call */
    double hw = h / 6.0 + 1.0;
    h = (float)(hw >= 1.0 ? hw - 1.0 : hw);
    hsv[0] = (uint8_t)clip8i((int)(h * 255.0));
    hsv[1] = (uint8_t)clip8i((int)(s * 255.0));
}

/* C's round() (half away from zero) for x >= 0, inline: x - (int)x is
 * exact in double, so this is the same value without the libm call. */
static inline int round_pos(double x) {
    int r = (int)x;
    return x - r >= 0.5 ? r + 1 : r;
}

/* Pillow's hsv2rgb. */
static void hsv_to_rgb(const uint8_t *hsv, uint8_t *out) {
    int h = hsv[0], s = hsv[1], v = hsv[2];
    if (s == 0) {
        out[0] = out[1] = out[2] = (uint8_t)v;
        return;
    }
    int i = (int)((float)h * 6.0 / 255.0); /* >= 0: floor is truncation */
    float f = (float)((float)h * 6.0 / 255.0 - (float)i);
    float fs = (float)((float)s / 255.0);
    uint8_t p = (uint8_t)clip8i(round_pos((float)v * (1.0 - fs)));
    uint8_t q = (uint8_t)clip8i(round_pos((float)v * (1.0 - fs * f)));
    uint8_t t = (uint8_t)clip8i(round_pos((float)v * (1.0 - fs * (1.0 - f))));
    uint8_t V = (uint8_t)v;
    switch (i % 6) {
    case 0: out[0] = V, out[1] = t, out[2] = p; break;
    case 1: out[0] = q, out[1] = V, out[2] = p; break;
    case 2: out[0] = p, out[1] = V, out[2] = t; break;
    case 3: out[0] = p, out[1] = q, out[2] = V; break;
    case 4: out[0] = t, out[1] = p, out[2] = V; break;
    default: out[0] = V, out[1] = p, out[2] = q; break;
    }
}

void visc_adjust_hue(visc_image *img, float hue_factor) {
    /* np.uint8(hue_factor * 255): the double product truncated toward zero,
     * then taken modulo 256 (a negative shift wraps, as numpy does on x86). */
    uint8_t shift = (uint8_t)(int)((double)hue_factor * 255.0);
    for (int y = 0; y < img->height; y++) {
        uint8_t *p = row_of(img, y);
        for (int x = 0; x < img->width; x++, p += 3) {
            uint8_t hsv[3];
            rgb_to_hsv(p, hsv);
            hsv[0] = (uint8_t)(hsv[0] + shift);
            hsv_to_rgb(hsv, p);
        }
    }
}

void visc_grayscale(visc_image *img) {
    for (int y = 0; y < img->height; y++) {
        uint8_t *p = row_of(img, y);
        for (int x = 0; x < img->width; x++, p += 3)
            p[0] = p[1] = p[2] = visc_luma(p[0], p[1], p[2]);
    }
}

void visc_solarize(visc_image *img, int threshold) {
    for (int y = 0; y < img->height; y++) {
        uint8_t *p = row_of(img, y);
        for (int i = 0; i < 3 * img->width; i++)
            if (p[i] >= threshold) p[i] = (uint8_t)(255 - p[i]);
    }
}

/* U(lo, hi) as torch's uniform_ on a float32 tensor. */
static float uniform(visc_rng *r, float lo, float hi) {
    return lo + (hi - lo) * visc_rng_uniform(r);
}

void visc_color_jitter_draw(const visc_color_jitter *cj, visc_rng *r, visc_jitter_draw *d) {
    /* torch.randperm(4), then the factors in op order, each only if on. */
    for (int i = 0; i < 4; i++) d->order[i] = i;
    for (int i = 3; i > 0; i--) {
        int j = (int)visc_rng_below(r, (uint32_t)(i + 1));
        int t = d->order[i];
        d->order[i] = d->order[j];
        d->order[j] = t;
    }
    const float amount[3] = {cj->brightness, cj->contrast, cj->saturation};
    for (int k = 0; k < 3; k++) {
        d->enabled[k] = amount[k] > 0;
        d->factor[k] =
            d->enabled[k] ? uniform(r, fmaxf(0.0f, 1.0f - amount[k]), 1.0f + amount[k]) : 1.0f;
    }
    d->enabled[3] = cj->hue > 0;
    d->factor[3] = d->enabled[3] ? uniform(r, -cj->hue, cj->hue) : 0.0f;
}

void visc_color_jitter_apply(const visc_jitter_draw *d, visc_image *img) {
    for (int i = 0; i < 4; i++) {
        int op = d->order[i];
        if (!d->enabled[op]) continue;
        switch (op) {
        case 0: visc_adjust_brightness(img, d->factor[0]); break;
        case 1: visc_adjust_contrast(img, d->factor[1]); break;
        case 2: visc_adjust_saturation(img, d->factor[2]); break;
        default: visc_adjust_hue(img, d->factor[3]); break;
        }
    }
}

/* One row, all three planes: the same float operations as ToTensor (v /
 * 255) and Normalize ((x - m) / s), so the values are torch's bit for bit
 * (ISO C mode: no fused multiply-add contraction). Division rather than a
 * lookup table: the interleaved bytes and the three planes vectorize. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
normalize_row(const uint8_t *restrict p, int w, const float *restrict mean,
              const float *restrict std, float *restrict o0, float *restrict o1,
              float *restrict o2) {
    const float m0 = mean[0], m1 = mean[1], m2 = mean[2], s0 = std[0], s1 = std[1], s2 = std[2];
    for (int x = 0; x < w; x++) {
        o0[x] = ((float)p[3 * x] / 255.0f - m0) / s0;
        o1[x] = ((float)p[3 * x + 1] / 255.0f - m1) / s1;
        o2[x] = ((float)p[3 * x + 2] / 255.0f - m2) / s2;
    }
}

void visc_to_tensor_normalize(const visc_image *img, const float mean[3], const float std[3],
                              float *chw) {
    size_t plane = (size_t)img->width * img->height;
    for (int y = 0; y < img->height; y++) {
        size_t off = (size_t)y * img->width;
        normalize_row(img->data + (size_t)y * img->stride, img->width, mean, std, chw + off,
                      chw + plane + off, chw + 2 * plane + off);
    }
}

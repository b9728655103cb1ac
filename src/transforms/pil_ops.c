/* pil_ops.c: the PIL 9.4 image ops of RandAugment, bit-exact on 8-bit RGB.
 *
 * Every op repeats PIL's own arithmetic (libImaging's C, ImageOps' Python)
 * in the same types and the same order, so the result is identical to PIL's,
 * not merely close: lookup tables from ImageOps' integer / double formulas,
 * ImageEnhance as Image.blend with a float32 alpha and truncation, the
 * SMOOTH filter in float32 with PIL's +0.5 rounding offset, and the affine
 * resampling in double with PIL's edge rules (tests/test_autoaug.c checks
 * equality against PIL on small images). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/autoaug.h"
#include "visc/core.h"

#define PIX(img, x, y) ((img)->data + (size_t)(y) * (size_t)(img)->stride + 3 * (size_t)(x))

/* ---- lookup-table ops (ImageOps builds a table, Image.point applies it) ---- */

static void apply_luts(visc_image *img, const uint8_t lut[3][256]) {
    for (int y = 0; y < img->height; y++) {
        uint8_t *p = PIX(img, 0, y);
        for (int x = 0; x < img->width; x++, p += 3) {
            p[0] = lut[0][p[0]];
            p[1] = lut[1][p[1]];
            p[2] = lut[2][p[2]];
        }
    }
}

static void apply_lut(visc_image *img, const uint8_t lut[256]) {
    uint8_t luts[3][256];
    for (int b = 0; b < 3; b++) memcpy(luts[b], lut, 256);
    apply_luts(img, (const uint8_t(*)[256])luts);
}

/* Image.histogram() of an RGB image: 256 counts per band. */
static void histogram(const visc_image *img, int64_t h[3][256]) {
    memset(h, 0, 3 * 256 * sizeof(int64_t));
    for (int y = 0; y < img->height; y++) {
        const uint8_t *p = PIX(img, 0, y);
        for (int x = 0; x < img->width; x++, p += 3) {
            h[0][p[0]]++;
            h[1][p[1]]++;
            h[2][p[2]]++;
        }
    }
}

/* Image.point clips table entries to 0..255 when it converts them to bytes. */
static uint8_t clip_entry(int64_t v) { return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); }

void visc_pil_autocontrast(visc_image *img) {
    int64_t h[3][256];
    uint8_t lut[3][256];
    histogram(img, h);
    for (int b = 0; b < 3; b++) {
        int lo = 0, hi = 255;
        while (lo < 255 && !h[b][lo]) lo++;
        while (hi > 0 && !h[b][hi]) hi--;
        if (hi <= lo) {
            for (int i = 0; i < 256; i++) lut[b][i] = (uint8_t)i;
            continue;
        }
        double scale = 255.0 / (hi - lo), offset = -lo * scale;
        for (int i = 0; i < 256; i++) {
            int v = (int)(i * scale + offset); /* Python int(): toward zero */
            lut[b][i] = clip_entry(v);
        }
    }
    apply_luts(img, (const uint8_t(*)[256])lut);
}

/* ImageOps.equalize: step = (count - count of the last used level) // 255;
 * level i maps to (step // 2 + pixels below i) // step. */
void visc_pil_equalize(visc_image *img) {
    int64_t h[3][256];
    uint8_t lut[3][256];
    histogram(img, h);
    for (int b = 0; b < 3; b++) {
        int64_t total = 0, last = 0;
        int used = 0;
        for (int i = 0; i < 256; i++)
            if (h[b][i]) {
                total += h[b][i];
                last = h[b][i];
                used++;
            }
        int64_t step = used <= 1 ? 0 : (total - last) / 255;
        if (!step) {
            for (int i = 0; i < 256; i++) lut[b][i] = (uint8_t)i;
            continue;
        }
        int64_t n = step / 2;
        for (int i = 0; i < 256; i++) {
            lut[b][i] = clip_entry(n / step);
            n += h[b][i];
        }
    }
    apply_luts(img, (const uint8_t(*)[256])lut);
}

void visc_pil_invert(visc_image *img) {
    uint8_t lut[256];
    for (int i = 0; i < 256; i++) lut[i] = (uint8_t)(255 - i);
    apply_lut(img, lut);
}

void visc_pil_posterize(visc_image *img, int bits) {
    if (bits >= 8) return; /* timm's posterize returns the image unchanged */
    if (bits < 0) bits = 0;
    uint8_t lut[256];
    int mask = ~((1 << (8 - bits)) - 1);
    for (int i = 0; i < 256; i++) lut[i] = (uint8_t)(i & mask);
    apply_lut(img, lut);
}

void visc_pil_solarize(visc_image *img, int thresh) {
    uint8_t lut[256];
    for (int i = 0; i < 256; i++) lut[i] = (uint8_t)(i < thresh ? i : 255 - i);
    apply_lut(img, lut);
}

void visc_pil_solarize_add(visc_image *img, int add, int thresh) {
    uint8_t lut[256];
    for (int i = 0; i < 256; i++) lut[i] = i < thresh ? clip_entry((int64_t)i + add) : (uint8_t)i;
    apply_lut(img, lut);
}

/* ---- ImageEnhance: Image.blend(degenerate, img, factor) ---- */

/* libImaging's Blend.c with its float alpha: truncation inside [0, 1], a
 * clipped float outside (enhancement factors above 1 extrapolate). */
static uint8_t blend(uint8_t deg, uint8_t v, float alpha) {
    float t = (float)deg + alpha * (float)((int)v - (int)deg);
    if (alpha >= 0.0f && alpha <= 1.0f) return (uint8_t)t;
    if (t <= 0.0f) return 0;
    if (t >= 255.0f) return 255;
    return (uint8_t)t;
}

/* PIL's convert("L"). */
static uint8_t luma(const uint8_t *p) {
    return (uint8_t)(((uint32_t)p[0] * 19595u + (uint32_t)p[1] * 38470u + (uint32_t)p[2] * 7471u +
                      0x8000u) >>
                     16);
}

void visc_pil_color(visc_image *img, float factor) {
    for (int y = 0; y < img->height; y++) {
        uint8_t *p = PIX(img, 0, y);
        for (int x = 0; x < img->width; x++, p += 3) {
            uint8_t l = luma(p);
            for (int b = 0; b < 3; b++) p[b] = blend(l, p[b], factor);
        }
    }
}

/* Degenerate: a flat image of int(mean(L) + 0.5), the mean from
 * ImageStat (a double sum of the histogram over the pixel count). */
void visc_pil_contrast(visc_image *img, float factor) {
    int64_t h[256] = {0};
    for (int y = 0; y < img->height; y++) {
        const uint8_t *p = PIX(img, 0, y);
        for (int x = 0; x < img->width; x++, p += 3) h[luma(p)]++;
    }
    double sum = 0.0;
    for (int j = 0; j < 256; j++) sum += (double)j * (double)h[j];
    double count = (double)img->width * img->height;
    uint8_t mean = (uint8_t)(int)(sum / count + 0.5);
    for (int y = 0; y < img->height; y++) {
        uint8_t *p = PIX(img, 0, y);
        for (int x = 0; x < 3 * img->width; x++) p[x] = blend(mean, p[x], factor);
    }
}

void visc_pil_brightness(visc_image *img, float factor) {
    for (int y = 0; y < img->height; y++) {
        uint8_t *p = PIX(img, 0, y);
        for (int x = 0; x < 3 * img->width; x++) p[x] = blend(0, p[x], factor);
    }
}

/* Copies img into a compact (stride 3 w) scratch buffer. */
static uint8_t *copy_to_scratch(const visc_image *img, uint8_t *scratch, uint8_t **owned) {
    size_t row = 3 * (size_t)img->width;
    *owned = NULL;
    if (!scratch) scratch = *owned = visc_malloc(row * (size_t)img->height + 1, "pil scratch");
    for (int y = 0; y < img->height; y++) memcpy(scratch + row * (size_t)y, PIX(img, 0, y), row);
    return scratch;
}

/* Degenerate: ImageFilter.SMOOTH, the 3x3 kernel [1 1 1; 1 5 1; 1 1 1] / 13
 * in float32 as libImaging's ImagingFilter3x3 computes it (rows below,
 * centre, above; +0.5 then truncation); the one-pixel border is a copy. */
void visc_pil_sharpness(visc_image *img, float factor, uint8_t *scratch) {
    int W = img->width, H = img->height;
    if (W < 3 || H < 3) return; /* all border: the degenerate is the image itself */
    uint8_t *owned;
    const uint8_t *src = copy_to_scratch(img, scratch, &owned);
    const float k1 = (float)(1.0 / 13.0), k5 = (float)(5.0 / 13.0);
    const size_t row = 3 * (size_t)W;
    for (int y = 1; y < H - 1; y++) {
        const uint8_t *up = src + row * (size_t)(y - 1), *mid = up + row, *dn = mid + row;
        uint8_t *out = PIX(img, 0, y);
        for (int i = 3; i < 3 * (W - 1); i++) {
            float ss = 0.5f;
            ss += (float)dn[i - 3] * k1 + (float)dn[i] * k1 + (float)dn[i + 3] * k1;
            ss += (float)mid[i - 3] * k1 + (float)mid[i] * k5 + (float)mid[i + 3] * k1;
            ss += (float)up[i - 3] * k1 + (float)up[i] * k1 + (float)up[i + 3] * k1;
            uint8_t smooth = ss <= 0.0f ? 0 : ss >= 255.0f ? 255 : (uint8_t)ss;
            out[i] = blend(smooth, mid[i], factor);
        }
    }
    /* the border: blend(v, v, factor) is v for any factor PIL would use */
    free(owned);
}

/* ---- geometry: Image.transform(AFFINE) as libImaging's Geometry.c ---- */

static int pil_floor(double v) { return v < 0.0 ? (int)floor(v) : (int)v; }
static int clampi(int v, int n) { return v < 0 ? 0 : v < n ? v : n - 1; }

/* The cubic of Geometry.c's BICUBIC macro (a = -1 convolution), in its order. */
static double cubic(double v1, double v2, double v3, double v4, double d) {
    double p1 = v2;
    double p2 = -v1 + v3;
    double p3 = 2 * (v1 - v2) + v3 - v4;
    double p4 = -v1 + v2 - v3 + v4;
    return p1 + d * (p2 + d * (p3 + d * p4));
}

/* bilinear_filter32RGB: rows past the bottom repeat the one above. */
static void sample_bilinear(uint8_t *out, const uint8_t *src, int W, int H, double xin,
                            double yin) {
    xin -= 0.5;
    yin -= 0.5;
    int x = pil_floor(xin), y = pil_floor(yin);
    double dx = xin - x, dy = yin - y;
    const size_t row = 3 * (size_t)W;
    int x0 = 3 * clampi(x, W), x1 = 3 * clampi(x + 1, W);
    const uint8_t *r0 = src + row * (size_t)clampi(y, H);
    const uint8_t *r1 = (y + 1 >= 0 && y + 1 < H) ? src + row * (size_t)(y + 1) : NULL;
    for (int b = 0; b < 3; b++) {
        double v1 = r0[x0 + b] + (r0[x1 + b] - r0[x0 + b]) * dx;
        double v2 = r1 ? r1[x0 + b] + (r1[x1 + b] - r1[x0 + b]) * dx : v1;
        v1 = v1 + (v2 - v1) * dy;
        out[b] = (uint8_t)v1;
    }
}

/* bicubic_filter32RGB: the first row is clamped, later rows past the
 * bottom repeat the one above; the result is clipped, then truncated. */
static void sample_bicubic(uint8_t *out, const uint8_t *src, int W, int H, double xin, double yin) {
    xin -= 0.5;
    yin -= 0.5;
    int x = pil_floor(xin), y = pil_floor(yin);
    double dx = xin - x, dy = yin - y;
    x--;
    y--;
    const size_t row = 3 * (size_t)W;
    int xs[4];
    for (int i = 0; i < 4; i++) xs[i] = 3 * clampi(x + i, W);
    for (int b = 0; b < 3; b++) {
        double v[4];
        for (int j = 0; j < 4; j++) {
            const uint8_t *r;
            if (j == 0) {
                r = src + row * (size_t)clampi(y, H);
            } else if (y + j >= 0 && y + j < H) {
                r = src + row * (size_t)(y + j);
            } else {
                v[j] = v[j - 1];
                continue;
            }
            v[j] = cubic(r[xs[0] + b], r[xs[1] + b], r[xs[2] + b], r[xs[3] + b], dx);
        }
        double s = cubic(v[0], v[1], v[2], v[3], dy);
        out[b] = s <= 0.0 ? 0 : s >= 255.0 ? 255 : (uint8_t)s;
    }
}

void visc_pil_affine(visc_image *img, const double m[6], int bicubic, const uint8_t fill[3],
                     uint8_t *scratch) {
    int W = img->width, H = img->height;
    uint8_t *owned;
    const uint8_t *src = copy_to_scratch(img, scratch, &owned);
    for (int y = 0; y < H; y++) {
        uint8_t *out = PIX(img, 0, y);
        for (int x = 0; x < W; x++, out += 3) {
            double xo = x + 0.5, yo = y + 0.5;
            double xin = m[0] * xo + m[1] * yo + m[2];
            double yin = m[3] * xo + m[4] * yo + m[5];
            if (xin < 0.0 || xin >= W || yin < 0.0 || yin >= H) {
                memcpy(out, fill, 3); /* transform(fillcolor=...): the new image's color */
            } else if (bicubic) {
                sample_bicubic(out, src, W, H, xin, yin);
            } else {
                sample_bilinear(out, src, W, H, xin, yin);
            }
        }
    }
    free(owned);
}

/* Python's round(v, 15): correctly rounded to 15 decimals, as glibc's
 * printf rounds (exactly, ties to even) and strtod reads back. */
static double round15(double v) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.15f", v);
    return strtod(buf, NULL);
}

/* Transpose.ROTATE_90 / ROTATE_270 of a square image (counter-clockwise /
 * clockwise), and ROTATE_180 of any. */
static void rotate_quarter(visc_image *img, int quarters, uint8_t *scratch) {
    int W = img->width, H = img->height;
    uint8_t *owned;
    const uint8_t *src = copy_to_scratch(img, scratch, &owned);
    const size_t row = 3 * (size_t)W;
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            int sx, sy;
            if (quarters == 1) {
                sx = W - 1 - y;
                sy = x;
            } else if (quarters == 2) {
                sx = W - 1 - x;
                sy = H - 1 - y;
            } else {
                sx = y;
                sy = H - 1 - x;
            }
            memcpy(PIX(img, x, y), src + row * (size_t)sy + 3 * (size_t)sx, 3);
        }
    free(owned);
}

/* Image.rotate(angle, resample, fillcolor): the special angles are exact
 * transposes; otherwise the matrix PIL builds, entries rounded to 15
 * decimals, about the centre (w / 2, h / 2). */
void visc_pil_rotate(visc_image *img, double degrees, int bicubic, const uint8_t fill[3],
                     uint8_t *scratch) {
    double angle = fmod(degrees, 360.0); /* Python's %: the sign of the divisor */
    if (angle != 0.0 && angle < 0.0) angle += 360.0;
    if (angle == 0.0) return;
    if (angle == 180.0) {
        rotate_quarter(img, 2, scratch);
        return;
    }
    if ((angle == 90.0 || angle == 270.0) && img->width == img->height) {
        rotate_quarter(img, angle == 90.0 ? 1 : 3, scratch);
        return;
    }
    double cx = img->width / 2.0, cy = img->height / 2.0;
    double a = -(angle * (M_PI / 180.0)); /* -math.radians(angle) */
    double m[6] = {round15(cos(a)), round15(sin(a)), 0.0, round15(-sin(a)), round15(cos(a)), 0.0};
    double tx = m[0] * -cx + m[1] * -cy + m[2];
    double ty = m[3] * -cx + m[4] * -cy + m[5];
    m[2] = tx + cx;
    m[5] = ty + cy;
    visc_pil_affine(img, m, bicubic, fill, scratch);
}

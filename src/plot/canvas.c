/* canvas.c: an RGB raster with the few primitives a plot needs.
 *
 * Lines are anti-aliased by coverage: a pixel whose centre lies at distance
 * d from the segment is covered by about (width/2 + 0.5 - d), clamped to
 * [0, 1], and blended with that weight. A polyline first takes the maximum
 * coverage of its segments in a mask and blends once, so the joints of a
 * curve with thousands of points do not darken where segments overlap. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/plot.h"

void visc_canvas_init(visc_canvas *c, int width, int height, visc_rgb background) {
    VISC_ASSERT(width > 0 && height > 0);
    c->width = width;
    c->height = height;
    c->rgb = visc_malloc((size_t)width * height * 3, "plot canvas");
    for (size_t i = 0; i < (size_t)width * height; i++) {
        c->rgb[3 * i] = background.r;
        c->rgb[3 * i + 1] = background.g;
        c->rgb[3 * i + 2] = background.b;
    }
    visc_canvas_unclip(c);
}

void visc_canvas_free(visc_canvas *c) {
    free(c->rgb);
    c->rgb = NULL;
    c->width = c->height = 0;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

void visc_canvas_clip(visc_canvas *c, int x0, int y0, int x1, int y1) {
    c->clip_x0 = clampi(x0, 0, c->width);
    c->clip_x1 = clampi(x1, c->clip_x0, c->width);
    c->clip_y0 = clampi(y0, 0, c->height);
    c->clip_y1 = clampi(y1, c->clip_y0, c->height);
}

void visc_canvas_unclip(visc_canvas *c) { visc_canvas_clip(c, 0, 0, c->width, c->height); }

static void blend(visc_canvas *c, int x, int y, visc_rgb col, double a) {
    uint8_t *p = c->rgb + ((size_t)y * c->width + x) * 3;
    p[0] = (uint8_t)lround(p[0] + (col.r - p[0]) * a);
    p[1] = (uint8_t)lround(p[1] + (col.g - p[1]) * a);
    p[2] = (uint8_t)lround(p[2] + (col.b - p[2]) * a);
}

void visc_canvas_rect(visc_canvas *c, int x0, int y0, int x1, int y1, visc_rgb color) {
    x0 = clampi(x0, c->clip_x0, c->clip_x1);
    x1 = clampi(x1, c->clip_x0, c->clip_x1);
    y0 = clampi(y0, c->clip_y0, c->clip_y1);
    y1 = clampi(y1, c->clip_y0, c->clip_y1);
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) {
            uint8_t *p = c->rgb + ((size_t)y * c->width + x) * 3;
            p[0] = color.r;
            p[1] = color.g;
            p[2] = color.b;
        }
}

/* Distance from (px, py) to the segment (x0, y0)-(x1, y1). */
static double seg_dist(double px, double py, double x0, double y0, double x1, double y1) {
    double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
    double t = len2 > 0 ? ((px - x0) * dx + (py - y0) * dy) / len2 : 0.0;
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double ex = x0 + t * dx - px, ey = y0 + t * dy - py;
    return sqrt(ex * ex + ey * ey);
}

/* The pixel box (clipped) that a segment of this width can touch; 0 if none.
 * Far-off coordinates (a value 1e30 on a linear axis) are clamped first so
 * the int conversions stay defined; such segments are clipped away anyway. */
static int seg_box(const visc_canvas *c, double x0, double y0, double x1, double y1, double r,
                   int box[4]) {
    const double big = 1e6;
    double lo_x = fmin(x0, x1) - r - 1, hi_x = fmax(x0, x1) + r + 1;
    double lo_y = fmin(y0, y1) - r - 1, hi_y = fmax(y0, y1) + r + 1;
    if (!(lo_x < big && hi_x > -big && lo_y < big && hi_y > -big)) return 0;
    box[0] = clampi((int)floor(fmax(lo_x, -big)), c->clip_x0, c->clip_x1);
    box[1] = clampi((int)ceil(fmin(hi_x, big)), c->clip_x0, c->clip_x1);
    box[2] = clampi((int)floor(fmax(lo_y, -big)), c->clip_y0, c->clip_y1);
    box[3] = clampi((int)ceil(fmin(hi_y, big)), c->clip_y0, c->clip_y1);
    return box[0] < box[1] && box[2] < box[3];
}

static double coverage(double d, double r) {
    double a = r + 0.5 - d;
    return a <= 0 ? 0 : a >= 1 ? 1 : a;
}

void visc_canvas_line(visc_canvas *c, double x0, double y0, double x1, double y1, double width,
                      visc_rgb color) {
    double r = width / 2;
    int b[4];
    if (!(isfinite(x0) && isfinite(y0) && isfinite(x1) && isfinite(y1))) return;
    if (!seg_box(c, x0, y0, x1, y1, r, b)) return;
    for (int y = b[2]; y < b[3]; y++)
        for (int x = b[0]; x < b[1]; x++) {
            double a = coverage(seg_dist(x + 0.5, y + 0.5, x0, y0, x1, y1), r);
            if (a > 0) blend(c, x, y, color, a);
        }
}

void visc_canvas_polyline(visc_canvas *c, const double *xs, const double *ys, int n, double width,
                          visc_rgb color) {
    int cw = c->clip_x1 - c->clip_x0, ch = c->clip_y1 - c->clip_y0;
    if (n < 2 || cw <= 0 || ch <= 0) return;
    float *mask = visc_calloc((size_t)cw * ch, sizeof(float), "plot line mask");
    double r = width / 2;
    for (int i = 0; i + 1 < n; i++) {
        double x0 = xs[i], y0 = ys[i], x1 = xs[i + 1], y1 = ys[i + 1];
        int b[4];
        if (!(isfinite(x0) && isfinite(y0) && isfinite(x1) && isfinite(y1))) continue;
        if (!seg_box(c, x0, y0, x1, y1, r, b)) continue;
        for (int y = b[2]; y < b[3]; y++)
            for (int x = b[0]; x < b[1]; x++) {
                float a = (float)coverage(seg_dist(x + 0.5, y + 0.5, x0, y0, x1, y1), r);
                float *m = &mask[(size_t)(y - c->clip_y0) * cw + (x - c->clip_x0)];
                if (a > *m) *m = a;
            }
    }
    for (int y = 0; y < ch; y++)
        for (int x = 0; x < cw; x++) {
            float a = mask[(size_t)y * cw + x];
            if (a > 0) blend(c, c->clip_x0 + x, c->clip_y0 + y, color, a);
        }
    free(mask);
}

void visc_canvas_disc(visc_canvas *c, double cx, double cy, double radius, visc_rgb color) {
    int b[4];
    if (!(isfinite(cx) && isfinite(cy))) return;
    if (!seg_box(c, cx, cy, cx, cy, radius, b)) return;
    for (int y = b[2]; y < b[3]; y++)
        for (int x = b[0]; x < b[1]; x++) {
            double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
            double a = coverage(sqrt(dx * dx + dy * dy), radius - 0.5);
            if (a > 0) blend(c, x, y, color, a);
        }
}

int visc_text_width(const char *s, int scale) {
    size_t n = strlen(s);
    return n ? (int)(n * (VISC_FONT_W + 1) - 1) * scale : 0;
}

int visc_text_height(int scale) { return VISC_FONT_H * scale; }

/* Draws text; up != 0 turns it 90 degrees counter-clockwise. */
static void draw_text(visc_canvas *c, int x, int y, const char *s, int scale, visc_rgb color,
                      int up) {
    int tw = visc_text_width(s, 1); /* in font pixels */
    for (int i = 0; s[i]; i++) {
        const uint8_t *g = visc_font_glyph((unsigned char)s[i]);
        for (int col = 0; col < VISC_FONT_W; col++)
            for (int row = 0; row < VISC_FONT_H; row++) {
                if (!(g[col] >> row & 1)) continue;
                int u = i * (VISC_FONT_W + 1) + col; /* along the text */
                int px = up ? x + row * scale : x + u * scale;
                int py = up ? y + (tw - 1 - u) * scale : y + row * scale;
                visc_canvas_rect(c, px, py, px + scale, py + scale, color);
            }
    }
}

void visc_canvas_text(visc_canvas *c, int x, int y, const char *s, int scale, visc_rgb color) {
    draw_text(c, x, y, s, scale, color, 0);
}

void visc_canvas_text_up(visc_canvas *c, int x, int y, const char *s, int scale, visc_rgb color) {
    draw_text(c, x, y, s, scale, color, 1);
}

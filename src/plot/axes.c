/* axes.c: one panel of a figure: title, axes, grid, tick labels, curves and
 * a legend, drawn into a rectangle of a canvas.
 *
 * Ticks are "nice" numbers, multiples of 1, 2 or 5 x 10^k, because those
 * are the values a reader interpolates between without effort; a log axis
 * puts them at powers of ten. The legend goes into whichever corner of the
 * plot hides the fewest points. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/plot.h"

/* ---- ticks ---- */

/* m x 10^k without the rounding noise of m * 0.1^-k (0.30000000000000004). */
static double scaled(double m, int k) { return k >= 0 ? m * pow(10, k) : m / pow(10, -k); }

static int clamp_ticks(int max_ticks) {
    return max_ticks < 2 ? 2 : max_ticks > VISC_MAX_TICKS ? VISC_MAX_TICKS : max_ticks;
}

int visc_nice_ticks(double lo, double hi, int max_ticks, double *ticks, double *step) {
    *step = 0;
    if (!(isfinite(lo) && isfinite(hi)) || lo > hi || !isfinite(hi - lo)) return 0;
    if (lo == hi) {
        ticks[0] = lo;
        *step = lo != 0 ? scaled(1, (int)floor(log10(fabs(lo)))) : 1;
        return 1;
    }
    max_ticks = clamp_ticks(max_ticks);
    static const double mult[3] = {1, 2, 5};
    int k0 = (int)floor(log10((hi - lo) / max_ticks)) - 1;
    for (int k = k0; k < k0 + 4; k++)
        for (int j = 0; j < 3; j++) {
            double s = scaled(mult[j], k);
            if (!(s > 0)) continue;
            /* indices of the first and last multiple inside [lo, hi], with a
             * little slack so a bound equal to a tick counts as inside */
            double i0 = ceil(lo / s - 1e-9), i1 = floor(hi / s + 1e-9);
            double count = i1 - i0 + 1;
            if (count > max_ticks) continue;
            int n = 0;
            for (double i = i0; i <= i1 && n < VISC_MAX_TICKS; i++) {
                double v = k >= 0 ? i * mult[j] * pow(10, k) : i * mult[j] / pow(10, -k);
                ticks[n++] = v == 0 ? 0 : v; /* no "-0" */
            }
            *step = s;
            return n;
        }
    return 0; /* not reached for finite lo < hi */
}

int visc_log_ticks(double lo, double hi, int max_ticks, double *ticks) {
    if (!(isfinite(lo) && isfinite(hi)) || !(lo > 0) || lo > hi) return 0;
    max_ticks = clamp_ticks(max_ticks);
    int d0 = (int)ceil(log10(lo) - 1e-9), d1 = (int)floor(log10(hi) + 1e-9);
    int n = 0;
    if (d1 - d0 + 1 >= 2) {
        /* every power of ten, or every 2nd, 5th, 10th, ... when too many */
        int every = 1;
        for (int i = 0; (d1 - d0) / every + 1 > max_ticks; i++) /* 1, 2, 5, 10, 20, 50, ... */
            every = (int)scaled(i % 3 == 0 ? 2 : i % 3 == 1 ? 5 : 1, i / 3 + (i % 3 == 2));
        for (int d = d0; d <= d1 && n < VISC_MAX_TICKS; d++)
            if ((d - d0) % every == 0) ticks[n++] = scaled(1, d);
        if (every > 1 || log10(hi / lo) > 2.5) return n;
    }
    /* few decades: 1, 2 and 5 x 10^k, if they fit */
    int m = 0;
    double cand[VISC_MAX_TICKS];
    static const double mult[3] = {1, 2, 5};
    for (int d = d0 - 1; d <= d1 && m <= max_ticks; d++)
        for (int j = 0; j < 3; j++) {
            double v = scaled(mult[j], d);
            if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9) && m < VISC_MAX_TICKS) cand[m++] = v;
        }
    if (m >= 2 && m <= max_ticks) {
        memcpy(ticks, cand, (size_t)m * sizeof *ticks);
        return m;
    }
    if (n >= 2) return n;
    double step;
    return visc_nice_ticks(lo, hi, max_ticks, ticks, &step);
}

void visc_format_tick(double value, double step, double axis_max, char *buf, size_t size) {
    double a = fabs(value);
    if (step > 0 && a < step * 1e-6) value = 0, a = 0; /* round-off of a zero tick: no "-0" */
    if (!isfinite(value) || (value != 0 && (a >= 1e12 || a < 1e-6))) {
        snprintf(buf, size, "%g", value);
        return;
    }
    if (!(step > 0) || !isfinite(step)) step = a > 0 ? a : 1;
    /* one unit for the whole axis: "0 5k 10k", not "0 5000 10k" */
    double unit = 1;
    const char *suffix = "";
    axis_max = fabs(axis_max);
    if (axis_max >= 1e7 && step >= 1e5) unit = 1e6, suffix = "M";
    else if (axis_max >= 1e4 && step >= 1e2) unit = 1e3, suffix = "k";
    /* the fewest decimals that write the step itself exactly (2.5k: 1) */
    int decimals = 0;
    for (double q = step / unit; decimals < 8 && fabs(q - round(q)) > 1e-6 * fmax(q, 1e-300);
         q *= 10)
        decimals++;
    if (value == 0) /* "0.0" beside "0.5", but a bare "0" beside "5k" or "0.00001" */
        snprintf(buf, size, "%.*f", unit == 1 && decimals <= 3 ? decimals : 0, 0.0);
    else snprintf(buf, size, "%.*f%s", decimals, value / unit, suffix);
}

/* ---- the panel ---- */

#define TEXT 2         /* font scale of every label */
#define LINE_WIDTH 2.0 /* curves */
#define MARKER_R 3.5

static const visc_rgb ink = {40, 40, 40}, grey = {110, 110, 110}, grid = {232, 232, 232},
                      frame = {170, 170, 170}, white = {255, 255, 255};

typedef struct {
    int x0, y0, x1, y1;            /* plot area in pixels */
    double lo_x, hi_x, lo_y, hi_y; /* data range (log10 of y when log_y) */
    int log_y;
} mapping;

static double map_y_value(const mapping *m, double y) {
    if (m->log_y) y = y > 0 ? log10(y) : NAN;
    return y;
}

static double px_x(const mapping *m, double x) {
    return m->x0 + (x - m->lo_x) / (m->hi_x - m->lo_x) * (m->x1 - m->x0);
}

static double px_y(const mapping *m, double y) {
    y = map_y_value(m, y);
    return m->y1 - (y - m->lo_y) / (m->hi_y - m->lo_y) * (m->y1 - m->y0);
}

/* The data range of all series; 0 when there is no drawable point. */
static int data_range(const visc_panel *p, double *lo_x, double *hi_x, double *lo_y, double *hi_y) {
    int any = 0;
    for (int s = 0; s < p->nseries; s++)
        for (int i = 0; i < p->series[s].n; i++) {
            double x = p->series[s].x[i], y = p->series[s].y[i];
            if (p->log_y) y = y > 0 ? log10(y) : NAN;
            if (!isfinite(x) || !isfinite(y)) continue;
            if (!any) *lo_x = *hi_x = x, *lo_y = *hi_y = y, any = 1;
            *lo_x = fmin(*lo_x, x), *hi_x = fmax(*hi_x, x);
            *lo_y = fmin(*lo_y, y), *hi_y = fmax(*hi_y, y);
        }
    return any;
}

/* Widens [*lo, *hi] by a fraction on each side; a single value gets +-pad1. */
static void widen(double *lo, double *hi, double frac, double pad1) {
    double r = *hi - *lo;
    if (!(r > 0)) {
        *lo -= pad1;
        *hi += pad1;
    } else {
        *lo -= r * frac;
        *hi += r * frac;
    }
}

static void draw_legend(visc_canvas *c, const mapping *m, const visc_panel *p) {
    int rows = 0, wmax = 0;
    for (int s = 0; s < p->nseries; s++)
        if (p->series[s].name && p->series[s].n > 0) {
            rows++;
            int w = visc_text_width(p->series[s].name, TEXT);
            if (w > wmax) wmax = w;
        }
    if (!rows) return;
    const int pad = 8, swatch = 24, row_h = visc_text_height(TEXT) + 8;
    int bw = pad + swatch + 8 + wmax + pad, bh = pad + rows * row_h - 8 + pad;
    /* the corner hiding the fewest points (ties: top right, top left, ...) */
    int best_hidden = -1, bx = 0, by = 0;
    for (int corner = 0; corner < 4; corner++) {
        int x = corner % 2 == 0 ? m->x1 - 10 - bw : m->x0 + 10;
        int y = corner < 2 ? m->y0 + 10 : m->y1 - 10 - bh;
        int hidden = 0;
        for (int s = 0; s < p->nseries; s++) {
            const visc_series *se = &p->series[s];
            for (int i = 0; i < se->n; i++) {
                double X = px_x(m, se->x[i]), Y = px_y(m, se->y[i]);
                if (X >= x - 4 && X <= x + bw + 4 && Y >= y - 4 && Y <= y + bh + 4) hidden++;
            }
            /* a segment can cross the box between two points: sample it */
            for (int i = 0; i + 1 < se->n; i++)
                for (int t = 1; t < 8; t++) {
                    double X = px_x(m, se->x[i] + (se->x[i + 1] - se->x[i]) * t / 8.0);
                    double Y0 = px_y(m, se->y[i]), Y1 = px_y(m, se->y[i + 1]);
                    double Y = Y0 + (Y1 - Y0) * t / 8.0;
                    if (X >= x && X <= x + bw && Y >= y && Y <= y + bh) hidden++;
                }
        }
        if (best_hidden < 0 || hidden < best_hidden) best_hidden = hidden, bx = x, by = y;
    }
    visc_canvas_rect(c, bx, by, bx + bw, by + bh, frame);
    visc_canvas_rect(c, bx + 1, by + 1, bx + bw - 1, by + bh - 1, white);
    int row = 0;
    for (int s = 0; s < p->nseries; s++) {
        const visc_series *se = &p->series[s];
        if (!se->name || se->n <= 0) continue;
        int ty = by + pad + row * row_h, cy = ty + visc_text_height(TEXT) / 2;
        visc_canvas_line(c, bx + pad, cy + 0.5, bx + pad + swatch, cy + 0.5, LINE_WIDTH, se->color);
        if (se->markers)
            visc_canvas_disc(c, bx + pad + swatch / 2.0, cy + 0.5, MARKER_R, se->color);
        visc_canvas_text(c, bx + pad + swatch + 8, ty, se->name, TEXT, ink);
        row++;
    }
}

void visc_panel_draw(visc_canvas *c, int x, int y, int w, int h, const visc_panel *p) {
    const int th = visc_text_height(TEXT);
    mapping m = {0};
    m.log_y = p->log_y;
    int have = data_range(p, &m.lo_x, &m.hi_x, &m.lo_y, &m.hi_y);
    if (!have) m.lo_x = 0, m.hi_x = 1, m.lo_y = 0, m.hi_y = 1;
    widen(&m.lo_x, &m.hi_x, 0.02, p->integer_x ? 1 : 0.5);
    widen(&m.lo_y, &m.hi_y, 0.06, m.log_y ? 0.5 : m.lo_y != 0 ? fabs(m.lo_y) * 0.1 : 1);

    /* y ticks first: their labels decide the left margin */
    int top = y + 12 + (p->title ? th + 12 : 0);
    int bottom = y + h - 10 - th - 10 - (p->xlabel ? th + 10 : 0);
    double yt[VISC_MAX_TICKS], ystep = 0;
    int ny, max_y = (bottom - top) / (th * 3);
    if (m.log_y) {
        ny = visc_log_ticks(pow(10, m.lo_y), pow(10, m.hi_y), max_y, yt);
    } else {
        ny = visc_nice_ticks(m.lo_y, m.hi_y, max_y, yt, &ystep);
    }
    char ylab[VISC_MAX_TICKS][32];
    int ylab_w = 0;
    for (int i = 0; i < ny; i++) {
        visc_format_tick(yt[i], m.log_y ? yt[i] : ystep,
                         m.log_y ? yt[i] : fmax(fabs(yt[0]), fabs(yt[ny - 1])), ylab[i],
                         sizeof ylab[i]);
        int tw = visc_text_width(ylab[i], TEXT);
        if (tw > ylab_w) ylab_w = tw;
    }
    m.x0 = x + 10 + (p->ylabel ? th + 12 : 0) + ylab_w + 10;
    m.x1 = x + w - 16;
    m.y0 = top;
    m.y1 = bottom;
    if (m.x1 - m.x0 < 20 || m.y1 - m.y0 < 20) return; /* no room to draw anything */

    /* x ticks: as many as fit with their labels a little apart */
    double xt[VISC_MAX_TICKS], xstep = 0;
    char xlab[VISC_MAX_TICKS][32];
    int nx = 0;
    for (int max_x = (m.x1 - m.x0) / (5 * (VISC_FONT_W + 1) * TEXT); max_x >= 2; max_x--) {
        nx = visc_nice_ticks(m.lo_x, m.hi_x, max_x, xt, &xstep);
        if (p->integer_x && xstep < 1) { /* an epoch axis: whole epochs only */
            nx = 0;
            for (double v = ceil(m.lo_x); v <= m.hi_x && nx < VISC_MAX_TICKS; v++) xt[nx++] = v;
            xstep = 1;
        }
        int room = 1, prev_end = -1000000;
        for (int i = 0; i < nx; i++) {
            visc_format_tick(xt[i], xstep, fmax(fabs(xt[0]), fabs(xt[nx - 1])), xlab[i],
                             sizeof xlab[i]);
            int tw = visc_text_width(xlab[i], TEXT), cx = (int)lround(px_x(&m, xt[i]));
            if (cx - tw / 2 < prev_end + 3 * TEXT * (VISC_FONT_W + 1)) room = 0;
            prev_end = cx + tw / 2;
        }
        if (room) break;
    }

    /* plot background, grid, frame */
    visc_canvas_rect(c, m.x0, m.y0, m.x1, m.y1, white);
    for (int i = 0; i < ny; i++) {
        int py = (int)lround(px_y(&m, yt[i]) - 0.5);
        if (py > m.y0 && py < m.y1 - 1) visc_canvas_rect(c, m.x0, py, m.x1, py + 1, grid);
    }
    for (int i = 0; i < nx; i++) {
        int px = (int)lround(px_x(&m, xt[i]) - 0.5);
        if (px > m.x0 && px < m.x1 - 1) visc_canvas_rect(c, px, m.y0, px + 1, m.y1, grid);
    }
    visc_canvas_rect(c, m.x0 - 1, m.y0 - 1, m.x1 + 1, m.y0, frame);
    visc_canvas_rect(c, m.x0 - 1, m.y1, m.x1 + 1, m.y1 + 1, frame);
    visc_canvas_rect(c, m.x0 - 1, m.y0, m.x0, m.y1, frame);
    visc_canvas_rect(c, m.x1, m.y0, m.x1 + 1, m.y1, frame);

    /* tick marks and labels */
    for (int i = 0; i < ny; i++) {
        int py = (int)lround(px_y(&m, yt[i]) - 0.5);
        visc_canvas_rect(c, m.x0 - 5, py, m.x0 - 1, py + 1, frame);
        visc_canvas_text(c, m.x0 - 8 - visc_text_width(ylab[i], TEXT), py - th / 2, ylab[i], TEXT,
                         grey);
    }
    for (int i = 0; i < nx; i++) {
        int px = (int)lround(px_x(&m, xt[i]) - 0.5);
        visc_canvas_rect(c, px, m.y1 + 1, px + 1, m.y1 + 5, frame);
        visc_canvas_text(c, px - visc_text_width(xlab[i], TEXT) / 2, m.y1 + 10, xlab[i], TEXT,
                         grey);
    }

    /* titles */
    if (p->title)
        visc_canvas_text(c, (m.x0 + m.x1 - visc_text_width(p->title, TEXT)) / 2, y + 12, p->title,
                         TEXT, ink);
    if (p->xlabel)
        visc_canvas_text(c, (m.x0 + m.x1 - visc_text_width(p->xlabel, TEXT)) / 2,
                         m.y1 + 10 + th + 10, p->xlabel, TEXT, ink);
    if (p->ylabel)
        visc_canvas_text_up(c, x + 10, (m.y0 + m.y1 - visc_text_width(p->ylabel, TEXT)) / 2,
                            p->ylabel, TEXT, ink);

    if (!have) {
        const char *msg = "no data yet";
        visc_canvas_text(c, (m.x0 + m.x1 - visc_text_width(msg, TEXT)) / 2, (m.y0 + m.y1 - th) / 2,
                         msg, TEXT, grey);
        return;
    }

    /* the curves, clipped to the plot area */
    visc_canvas_clip(c, m.x0, m.y0, m.x1, m.y1);
    for (int s = 0; s < p->nseries; s++) {
        const visc_series *se = &p->series[s];
        if (se->n <= 0) continue;
        double *px = visc_malloc((size_t)se->n * 2 * sizeof(double), "plot points");
        double *py = px + se->n;
        for (int i = 0; i < se->n; i++) {
            px[i] = px_x(&m, se->x[i]);
            py[i] = px_y(&m, se->y[i]);
        }
        visc_canvas_polyline(c, px, py, se->n, LINE_WIDTH, se->color);
        /* markers while they stay apart (a dot every 10 px at most); and a
         * point between gaps (nan neighbours) is a dot, not nothing */
        int markers = se->markers && se->n <= (m.x1 - m.x0) / 10;
        for (int i = 0; i < se->n; i++) {
            int alone =
                (i == 0 || !isfinite(py[i - 1])) && (i + 1 == se->n || !isfinite(py[i + 1]));
            if (markers || alone) visc_canvas_disc(c, px[i], py[i], MARKER_R, se->color);
        }
        free(px);
    }
    visc_canvas_unclip(c);
    draw_legend(c, &m, p);
}

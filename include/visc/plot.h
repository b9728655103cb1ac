/* plot.h: training curves as a PNG, for people who would rather look at
 * curves than read logs.
 *
 * canvas.c   an RGB raster: rectangles, anti-aliased lines, bitmap text
 * font.c     a 5x8 pixel font for printable ASCII
 * axes.c     "nice" ticks (1/2/5 x 10^k, or decades on a log axis) and a
 *            panel: title, axes, grid, tick labels, series, legend
 * runlog.c   reads a run's log.jsonl (written by src/train/trainer.c)
 * curves.c   visc_plot_run: loss, accuracy and learning rate of one run
 *
 * Nothing here allocates per pixel or per point drawn; the log reader is a
 * parser of untrusted files (fuzz/fuzz_plot_log.c) and returns -1 with the
 * error set, never crashes. */
#ifndef VISC_PLOT_H
#define VISC_PLOT_H

#include <stddef.h>
#include <stdint.h>

/* ---- canvas.c ---- */
typedef struct {
    uint8_t r, g, b;
} visc_rgb;

typedef struct {
    int width, height;
    uint8_t *rgb; /* width * height * 3 bytes, rows top to bottom */
    /* drawing is limited to [clip_x0, clip_x1) x [clip_y0, clip_y1) */
    int clip_x0, clip_y0, clip_x1, clip_y1;
} visc_canvas;

void visc_canvas_init(visc_canvas *c, int width, int height, visc_rgb background);
void visc_canvas_free(visc_canvas *c);
/* Limits drawing to a rectangle (intersected with the image); unclip lifts it. */
void visc_canvas_clip(visc_canvas *c, int x0, int y0, int x1, int y1);
void visc_canvas_unclip(visc_canvas *c);
/* Fills [x0, x1) x [y0, y1). */
void visc_canvas_rect(visc_canvas *c, int x0, int y0, int x1, int y1, visc_rgb color);
/* A line of the given width (pixels) between points in pixel coordinates
 * (pixel centres at +0.5), anti-aliased by the covered area of each pixel. */
void visc_canvas_line(visc_canvas *c, double x0, double y0, double x1, double y1, double width,
                      visc_rgb color);
/* Connected segments through (xs[i], ys[i]); a non-finite point breaks the
 * line. Blended once, so overlapping segments do not darken the joints. */
void visc_canvas_polyline(visc_canvas *c, const double *xs, const double *ys, int n, double width,
                          visc_rgb color);
/* A filled, anti-aliased disc (markers). */
void visc_canvas_disc(visc_canvas *c, double cx, double cy, double radius, visc_rgb color);
/* Text in the 5x8 font, each font pixel drawn as scale x scale; (x, y) is the
 * top-left corner. Characters outside printable ASCII are drawn as '?'. */
void visc_canvas_text(visc_canvas *c, int x, int y, const char *s, int scale, visc_rgb color);
/* The same turned 90 degrees counter-clockwise (reads bottom to top); (x, y)
 * is the top-left corner of the turned text's bounding box. */
void visc_canvas_text_up(visc_canvas *c, int x, int y, const char *s, int scale, visc_rgb color);
int visc_text_width(const char *s, int scale);
int visc_text_height(int scale);

/* ---- font.c ---- */
#define VISC_FONT_W 5
#define VISC_FONT_H 8
/* Five column bytes, bit 0 the top row, bit 7 the descenders; '?' for anything not printable ASCII.
 */
const uint8_t *visc_font_glyph(unsigned char ch);

/* ---- axes.c ---- */
#define VISC_MAX_TICKS 32
/* Ticks at the multiples of step = {1, 2, 5} x 10^k inside [lo, hi], with
 * step the smallest such value giving at most max_ticks ticks (max_ticks
 * >= 2). Returns the tick count (0 when lo > hi or not finite). lo == hi
 * gives the single tick lo. */
int visc_nice_ticks(double lo, double hi, int max_ticks, double *ticks, double *step);
/* Ticks for a log axis over [lo, hi] (0 < lo <= hi): the powers of ten
 * inside, thinned to every 2nd, 5th, 10th... decade when there are too
 * many, plus 2 and 5 x 10^k when the range spans few decades; when that
 * leaves fewer than two ticks, linear nice ticks. */
int visc_log_ticks(double lo, double hi, int max_ticks, double *ticks);
/* A tick label with as many decimals as step needs ("0.05", "2.5", "300");
 * axes reaching axis_max >= 1e4 count in k ("5k", "12.5k"), >= 1e7 in M, so
 * every label of an axis uses one unit. %g for extreme values. */
void visc_format_tick(double value, double step, double axis_max, char *buf, size_t size);

typedef struct {
    const char *name; /* in the legend; NULL: not listed */
    visc_rgb color;
    const double *x, *y;
    int n;
    int markers; /* a dot at each point: sparse series such as per-epoch values */
} visc_series;

typedef struct {
    const char *title, *xlabel, *ylabel;
    int log_y;     /* log-scale y (points <= 0 are left out) */
    int integer_x; /* ticks at whole numbers only (epochs, steps) */
    const visc_series *series;
    int nseries;
} visc_panel;

/* Draws p into the rectangle [x, x + w) x [y, y + h) of c. Non-finite points
 * break a line rather than end the drawing; a panel without data says so. */
void visc_panel_draw(visc_canvas *c, int x, int y, int w, int h, const visc_panel *p);

/* ---- runlog.c ---- */
typedef struct {
    double *x, *y;
    int n, cap;
} visc_curve;

/* What visc plot draws from a log.jsonl. A resumed run appends to the same
 * file, so x values repeat: each curve keeps the last value per x, sorted. */
typedef struct {
    visc_curve train_loss, train_top1, lr; /* x: step */
    visc_curve train_top1_epoch;           /* x: epoch; the epoch's last train line */
    visc_curve val_loss;                   /* x: step at the end of the epoch */
    visc_curve val_top1, val_top5;         /* x: epoch */
    visc_curve ema_top1;                   /* x: epoch */
    char model[64], dataset[64], opt[64];  /* from the "config" line, "" if absent */
    int records;                           /* lines with a known "type" */
} visc_run_log;

/* Parses text[0..size) (need not be NUL-terminated). Blank lines are
 * skipped, unknown "type"s ignored; a line that is not a flat-enough JSON
 * object with a "type", or a known record without its numbers, fails with
 * "<source>: line N: <problem>". On failure log is left empty. */
int visc_run_log_parse(visc_run_log *log, const char *text, size_t size, const char *source);
/* Reads and parses a file; an empty one, or one with no records, fails too. */
int visc_run_log_load(visc_run_log *log, const char *path);
void visc_run_log_free(visc_run_log *log);

/* ---- curves.c ---- */
/* Reads run_dir/log.jsonl and writes one PNG (atomically) with three panels:
 * loss vs step (train, and val at epoch ends), top-1 vs epoch (val, train,
 * EMA), learning rate vs step. png_path NULL: run_dir/curves.png. log_loss:
 * 1 log-scale loss, 0 linear, -1 decide from the data (log when the loss
 * spans more than a factor of 10). */
int visc_plot_run_opts(const char *run_dir, const char *png_path, int log_loss);
/* visc_plot_run_opts(run_dir, png_path, -1): what the trainer calls. */
int visc_plot_run(const char *run_dir, const char *png_path);

#endif

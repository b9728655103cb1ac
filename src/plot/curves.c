/* curves.c: the picture of one training run, from its log.jsonl.
 *
 * One PNG, a header line naming the run and its best epoch, then three
 * panels side by side: loss vs step (log-scale when it falls by more than
 * 10x, so the late epochs are not a flat line), top-1 vs epoch, and the
 * learning rate vs step (warm-up and decay are where runs go wrong). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/io.h"
#include "visc/plot.h"

#define PANEL_W 560
#define PANEL_H 470
#define HEADER_H 44

static const visc_rgb bg = {255, 255, 255}, ink = {40, 40, 40};
/* the first colours of Tableau 10: distinct, and readable on white */
static const visc_rgb blue = {31, 119, 180}, orange = {255, 127, 14}, green = {44, 160, 44},
                      purple = {148, 103, 189};

static visc_series series(const char *name, visc_rgb color, const visc_curve *c, int markers) {
    return (visc_series){name, color, c->x, c->y, c->n, markers};
}

/* Log scale pays off when the loss spans more than a factor of 10. */
static int loss_wants_log(const visc_run_log *log) {
    double lo = INFINITY, hi = 0;
    const visc_curve *cs[2] = {&log->train_loss, &log->val_loss};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < cs[k]->n; i++) {
            double v = cs[k]->y[i];
            if (!isfinite(v)) continue;
            if (v <= 0) return 0;
            lo = fmin(lo, v);
            hi = fmax(hi, v);
        }
    return hi > 10 * lo;
}

/* "resnet20 on fashion-mnist, sgd | best val top-1 91.23% (epoch 9)", cut
 * to fit max_chars. */
static void header_text(const visc_run_log *log, const char *run_dir, char *out, size_t size,
                        int max_chars) {
    char what[200] = "", best[96] = "";
    if (log->model[0])
        snprintf(what, sizeof what, "%s%s%s%s%s", log->model, log->dataset[0] ? " on " : "",
                 log->dataset, log->opt[0] ? ", " : "", log->opt);
    int bi = -1;
    for (int i = 0; i < log->val_top1.n; i++)
        if (isfinite(log->val_top1.y[i]) && (bi < 0 || log->val_top1.y[i] > log->val_top1.y[bi]))
            bi = i;
    if (bi >= 0)
        snprintf(best, sizeof best, "best val top-1 %.2f%% (epoch %.0f of %.0f)",
                 log->val_top1.y[bi], log->val_top1.x[bi], log->val_top1.x[log->val_top1.n - 1]);
    char line[512];
    snprintf(line, sizeof line, "%s%s%s%s%s", run_dir, what[0] ? ": " : "", what,
             best[0] ? "   |   " : "", best);
    if ((int)strlen(line) > max_chars && max_chars > 3) {
        line[max_chars - 3] = 0;
        strcat(line, "...");
    }
    snprintf(out, size, "%s", line);
}

int visc_plot_run_opts(const char *run_dir, const char *png_path, int log_loss) {
    char log_path[4096], def_png[4096];
    snprintf(log_path, sizeof log_path, "%s/log.jsonl", run_dir);
    if (!png_path) {
        snprintf(def_png, sizeof def_png, "%s/curves.png", run_dir);
        png_path = def_png;
    }
    visc_run_log log;
    if (visc_run_log_load(&log, log_path)) return -1;
    if (log.train_loss.n == 0 && log.val_top1.n == 0) {
        visc_run_log_free(&log);
        return visc_set_error("%s: no train or val records yet", log_path);
    }

    visc_canvas c;
    int width = 3 * PANEL_W, height = HEADER_H + PANEL_H;
    visc_canvas_init(&c, width, height, bg);
    char head[512];
    header_text(&log, run_dir, head, sizeof head, (width - 40) / ((VISC_FONT_W + 1) * 2));
    visc_canvas_text(&c, 20, 18, head, 2, ink);

    visc_series loss[2] = {series("train", blue, &log.train_loss, 0),
                           series("val", orange, &log.val_loss, 1)};
    visc_panel p_loss = {.title = "Loss",
                         .xlabel = "step",
                         .ylabel = "loss",
                         .integer_x = 1,
                         .log_y = log_loss < 0 ? loss_wants_log(&log) : log_loss,
                         .series = loss,
                         .nseries = 2};
    if (p_loss.log_y) p_loss.title = "Loss (log scale)";
    visc_panel_draw(&c, 0, HEADER_H, PANEL_W, PANEL_H, &p_loss);

    visc_series acc[3] = {series("val", orange, &log.val_top1, 1),
                          series("train", blue, &log.train_top1_epoch, 1),
                          series("val EMA", green, &log.ema_top1, 1)};
    visc_panel p_acc = {.title = "Top-1 accuracy",
                        .xlabel = "epoch",
                        .ylabel = "top-1 (%)",
                        .integer_x = 1,
                        .series = acc,
                        .nseries = 3};
    visc_panel_draw(&c, PANEL_W, HEADER_H, PANEL_W, PANEL_H, &p_acc);

    visc_series lr = series(NULL, purple, &log.lr, 0);
    visc_panel p_lr = {.title = "Learning rate",
                       .xlabel = "step",
                       .ylabel = "lr",
                       .integer_x = 1,
                       .series = &lr,
                       .nseries = 1};
    visc_panel_draw(&c, 2 * PANEL_W, HEADER_H, PANEL_W, PANEL_H, &p_lr);

    int rc = visc_png_write(png_path, c.rgb, c.width, c.height);
    visc_canvas_free(&c);
    visc_run_log_free(&log);
    return rc;
}

int visc_plot_run(const char *run_dir, const char *png_path) {
    return visc_plot_run_opts(run_dir, png_path, -1);
}

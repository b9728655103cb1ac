/* fuzz_plot_log.c: libFuzzer target for the log.jsonl reader behind
 * `visc plot` (src/plot/runlog.c), and for the panel drawing that follows it.
 *
 * On success every curve is sorted with one value per x and the config
 * strings are terminated; on failure the log is empty and the message names
 * the line. What parses is then drawn into a small panel, so hostile numbers
 * (1e308, nan, huge steps) also go through the tick and pixel arithmetic. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/plot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_curve(const visc_curve *c) {
    if (c->n < 0 || c->n > c->cap) abort();
    for (int i = 0; i < c->n; i++) {
        if (!isfinite(c->x[i]) || c->x[i] < 0) abort();
        if (i && !(c->x[i] > c->x[i - 1])) abort(); /* sorted, each x once */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1); /* not NUL-terminated, on purpose */
    memcpy(text, data, size);
    visc_run_log log;
    if (visc_run_log_parse(&log, text, size, "fuzz") == 0) {
        const visc_curve *cs[] = {&log.train_loss,       &log.train_top1, &log.lr,
                                  &log.train_top1_epoch, &log.val_loss,   &log.val_top1,
                                  &log.val_top5,         &log.ema_top1};
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) check_curve(cs[i]);
        if (strlen(log.model) >= sizeof log.model || strlen(log.opt) >= sizeof log.opt ||
            strlen(log.dataset) >= sizeof log.dataset)
            abort();
        if (log.train_loss.n + log.val_top1.n > 0) {
            visc_series s[3] =
                {{"train", {31, 119, 180}, log.train_loss.x, log.train_loss.y, log.train_loss.n, 0},
                 {"val", {255, 127, 14}, log.val_loss.x, log.val_loss.y, log.val_loss.n, 1},
                 {"lr", {148, 103, 189}, log.lr.x, log.lr.y, log.lr.n, 0}};
            visc_canvas c;
            visc_canvas_init(&c, 240, 160, (visc_rgb){255, 255, 255});
            visc_panel p = {"Loss", "step", "loss", (int)(size & 1), 0, s, 3};
            visc_panel_draw(&c, 0, 0, 240, 160, &p);
            visc_series e = {"val",          {255, 127, 14}, log.val_top1.x,
                             log.val_top1.y, log.val_top1.n, 1};
            visc_panel q = {"Top-1", "epoch", NULL, 0, 1, &e, 1};
            visc_panel_draw(&c, 0, 0, 240, 160, &q);
            visc_canvas_free(&c);
        }
    } else {
        if (log.records != 0 || log.train_loss.x != NULL || log.val_top1.n != 0) abort();
        if (strncmp(visc_last_error(), "fuzz: line ", 11) != 0) abort();
    }
    visc_run_log_free(&log);
    free(text);
    return 0;
}

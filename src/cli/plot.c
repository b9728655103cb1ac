/* plot.c: `visc plot RUN_DIR [-o FILE.png] [--log | --linear]`: the training
 * curves of a run directory as one PNG (src/plot/curves.c draws it). */
#include <stdio.h>
#include <string.h>

#include "plot.h"
#include "visc/core.h"
#include "visc/plot.h"

static void usage(FILE *f) {
    fputs("usage: visc plot RUN_DIR [-o FILE.png] [--log | --linear]\n\n"
          "Draws the loss, top-1 accuracy and learning rate of a training run\n"
          "(RUN_DIR/log.jsonl, written by `visc train --output RUN_DIR`) into one PNG.\n\n"
          "  -o, --output FILE  where to write the image (default RUN_DIR/curves.png)\n"
          "  --log              log-scale loss axis\n"
          "  --linear           linear loss axis (default: log when the loss spans\n"
          "                     more than a factor of 10)\n",
          f);
}

int visc_cmd_plot(int argc, char **argv) {
    const char *run_dir = NULL, *out = NULL;
    int log_loss = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) visc_die("plot: option '%s' needs a value", a);
            out = argv[++i];
        } else if (!strncmp(a, "--output=", 9)) {
            out = a + 9;
        } else if (!strcmp(a, "--log")) {
            log_loss = 1;
        } else if (!strcmp(a, "--linear")) {
            log_loss = 0;
        } else if (a[0] == '-' && a[1]) {
            visc_die("plot: unknown option '%s' (try `visc plot --help`)", a);
        } else if (run_dir) {
            visc_die("plot: one run directory at a time ('%s' and '%s')", run_dir, a);
        } else {
            run_dir = a;
        }
    }
    if (!run_dir) visc_die("plot: missing RUN_DIR (usage: visc plot RUN_DIR [-o FILE.png])");
    if (out && !out[0]) visc_die("plot: empty output file name");
    /* "runs/a/" and "runs/a" name the same log: no "runs/a//log.jsonl" */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", run_dir);
    for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--) dir[n - 1] = 0;
    if (visc_plot_run_opts(dir, out, log_loss)) visc_die("%s", visc_last_error());
    if (out) printf("wrote %s\n", out);
    else printf("wrote %s/curves.png\n", dir);
    return 0;
}

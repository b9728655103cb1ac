/* progress.c: a one-line progress bar redrawn in place on a terminal; on a
 * pipe or file, plain lines (one per update) that logs can keep. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "visc/train.h"

void visc_progress_begin(visc_progress *p, const char *label, int64_t total, int enabled) {
    memset(p, 0, sizeof *p);
    p->out = stdout;
    p->tty = enabled && isatty(fileno(stdout));
    p->start = visc_now();
    p->total = total;
    snprintf(p->label, sizeof p->label, "%s", label);
}

static void format_duration(char *buf, size_t n, double s) {
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%d:%02d", t / 60, t % 60);
}

void visc_progress_update(visc_progress *p, int64_t done, const char *stats) {
    if (!p->out) return; /* silenced (another rank speaks) */
    double now = visc_now(), elapsed = now - p->start;
    char eta[32];
    format_duration(eta, sizeof eta, done > 0 ? elapsed * (double)(p->total - done) / done : 0);
    if (p->tty) {
        enum { WIDTH = 24 };
        char bar[WIDTH + 1];
        int fill = p->total ? (int)(WIDTH * done / p->total) : WIDTH;
        for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : '.';
        bar[WIDTH] = 0;
        fprintf(p->out, "\r\033[K%s [%s] %lld/%lld %s ETA %s", p->label, bar, (long long)done,
                (long long)p->total, stats, eta);
    } else {
        fprintf(p->out, "%s %lld/%lld %s ETA %s\n", p->label, (long long)done, (long long)p->total,
                stats, eta);
    }
    fflush(p->out);
    p->last_draw = now;
}

void visc_progress_end(visc_progress *p, const char *summary) {
    if (!p->out) return;
    if (p->tty) fputs("\r\033[K", p->out);
    if (summary) fprintf(p->out, "%s: %s\n", p->label, summary);
    fflush(p->out);
}

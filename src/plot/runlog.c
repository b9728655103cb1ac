/* runlog.c: reads a run's log.jsonl, one JSON object a line (see
 * src/train/trainer.c), into the curves of visc_run_log.
 *
 * The file is our own format but still untrusted input (hand-edited, cut
 * off by a crash, or not a log at all), so this is a small strict scanner
 * that never reads past the buffer and never recurses without bound. It
 * understands enough JSON for our lines: an object whose members are
 * strings, numbers (plus the nan/inf that printf writes for a diverged
 * loss), true/false/null, and nested objects or arrays (the "config" line),
 * which it walks only to pick out a few strings. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/plot.h"

#define MAX_DEPTH 16
#define MAX_INDEX 1e15 /* steps and epochs beyond this are not from a training run */

/* ---- curves ---- */

static void curve_add(visc_curve *c, double x, double y) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->x = visc_realloc(c->x, (size_t)c->cap * sizeof *c->x, "log curve");
        c->y = visc_realloc(c->y, (size_t)c->cap * sizeof *c->y, "log curve");
    }
    c->x[c->n] = x;
    c->y[c->n] = y;
    c->n++;
}

static void curve_free(visc_curve *c) {
    free(c->x);
    free(c->y);
    memset(c, 0, sizeof *c);
}

typedef struct {
    double x, y;
    int order;
} point;

static int point_cmp(const void *a, const void *b) {
    const point *p = a, *q = b;
    if (p->x != q->x) return p->x < q->x ? -1 : 1;
    return (p->order > q->order) - (p->order < q->order);
}

/* Sorts by x and keeps the last value written for each x: a resumed run
 * appends the steps it redoes after the ones of the run it resumed. */
static void curve_finish(visc_curve *c) {
    if (c->n == 0) return;
    point *p = visc_malloc((size_t)c->n * sizeof *p, "log curve");
    for (int i = 0; i < c->n; i++) p[i] = (point){c->x[i], c->y[i], i};
    qsort(p, (size_t)c->n, sizeof *p, point_cmp);
    int m = 0;
    for (int i = 0; i < c->n; i++) {
        if (i + 1 < c->n && p[i + 1].x == p[i].x) continue;
        c->x[m] = p[i].x;
        c->y[m] = p[i].y;
        m++;
    }
    c->n = m;
    free(p);
}

/* ---- the scanner ---- */

enum { F_EPOCH, F_STEP, F_LOSS, F_TOP1, F_TOP5, F_LR, NFIELDS };
static const char *const field_names[NFIELDS] = {"epoch", "step", "loss", "top1", "top5", "lr"};

typedef struct {
    const char *p, *end; /* the rest of the line */
    char *err;           /* the problem, for the caller to put after "line N: " */
    size_t err_size;
    /* what the top level of the line held */
    char type[32];
    int has_type;
    double num[NFIELDS];
    int has[NFIELDS];
    /* strings of the config object */
    char model[64], dataset[64], opt[64];
} line_scan;

static int fail(line_scan *s, const char *what) {
    snprintf(s->err, s->err_size, "%s", what);
    return -1;
}

static void skip_ws(line_scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r')) s->p++;
}

/* A string at s->p (the opening quote); its text, with escapes reduced to a
 * character each (\uXXXX to '?'), truncated into out[size] when out != NULL. */
static int scan_string(line_scan *s, char *out, size_t size) {
    size_t n = 0;
    s->p++; /* the opening quote */
    while (s->p < s->end && *s->p != '"') {
        char ch = *s->p++;
        if ((unsigned char)ch < 0x20) return fail(s, "control character inside a string");
        if (ch == '\\') {
            if (s->p >= s->end) break;
            char e = *s->p++;
            switch (e) {
            case '"':
            case '\\':
            case '/': ch = e; break;
            case 'b':
            case 'f':
            case 'n':
            case 'r':
            case 't': ch = ' '; break;
            case 'u':
                for (int i = 0; i < 4; i++, s->p++)
                    if (s->p >= s->end || !strchr("0123456789abcdefABCDEF", *s->p) || !*s->p)
                        return fail(s, "bad \\u escape in a string");
                ch = '?';
                break;
            default: return fail(s, "bad escape in a string");
            }
        }
        if (out && n + 1 < size) out[n++] = ch;
    }
    if (s->p >= s->end) return fail(s, "unterminated string (line cut off?)");
    s->p++; /* the closing quote */
    if (out && size) out[n] = 0;
    return 0;
}

static int is_token_char(char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           ch == '+' || ch == '-' || ch == '.';
}

/* A bare token (number, true, false, null). *is_num says whether it is a
 * number; *v gets its value. */
static int scan_token(line_scan *s, int *is_num, double *v) {
    const char *b = s->p;
    while (s->p < s->end && is_token_char(*s->p)) s->p++;
    size_t n = (size_t)(s->p - b);
    char tok[64];
    if (n == 0) return fail(s, "expected a value");
    if (n >= sizeof tok) return fail(s, "overlong value");
    memcpy(tok, b, n);
    tok[n] = 0;
    *is_num = 0;
    if (!strcmp(tok, "true") || !strcmp(tok, "false") || !strcmp(tok, "null")) return 0;
    /* strtod also takes hex ("0x1p3"), which no JSON writer of ours emits */
    if ((tok[0] == '0' || tok[0] == '-' || tok[0] == '+') && strpbrk(tok, "xX"))
        return fail(s, "bad number");
    char *e;
    *v = strtod(tok, &e);
    if (*e || e == tok) return fail(s, "bad value (not a number, string, true, false or null)");
    *is_num = 1;
    return 0;
}

static int scan_object(line_scan *s, int depth, int in_config);

/* Skips an array at s->p, walking its elements. */
static int scan_array(line_scan *s, int depth) {
    s->p++; /* '[' */
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        return 0;
    }
    for (;;) {
        skip_ws(s);
        if (s->p >= s->end) return fail(s, "unterminated array");
        if (*s->p == '"') {
            if (scan_string(s, NULL, 0)) return -1;
        } else if (*s->p == '{') {
            if (depth + 1 > MAX_DEPTH) return fail(s, "nested too deeply");
            if (scan_object(s, depth + 1, 0)) return -1;
        } else if (*s->p == '[') {
            if (depth + 1 > MAX_DEPTH) return fail(s, "nested too deeply");
            if (scan_array(s, depth + 1)) return -1;
        } else {
            int is_num;
            double v;
            if (scan_token(s, &is_num, &v)) return -1;
        }
        skip_ws(s);
        if (s->p >= s->end) return fail(s, "unterminated array");
        if (*s->p == ']') {
            s->p++;
            return 0;
        }
        if (*s->p != ',') return fail(s, "expected ',' or ']' in an array");
        s->p++;
    }
}

/* An object at s->p. depth 0 is the line itself, whose "type" and numbers
 * are recorded; in_config: the object under "config", whose strings are. */
static int scan_object(line_scan *s, int depth, int in_config) {
    s->p++; /* '{' */
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        skip_ws(s);
        if (s->p >= s->end) return fail(s, "unterminated object (line cut off?)");
        if (*s->p != '"') return fail(s, "expected a \"key\"");
        char key[32];
        const char *kb = s->p;
        if (scan_string(s, key, sizeof key)) return -1;
        if ((size_t)(s->p - kb) > sizeof key) key[0] = 0; /* too long to be one of ours */
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':') return fail(s, "expected ':' after a key");
        s->p++;
        skip_ws(s);
        if (s->p >= s->end) return fail(s, "missing value (line cut off?)");
        char ch = *s->p;
        int field = -1;
        if (depth == 0)
            for (int f = 0; f < NFIELDS; f++)
                if (!strcmp(key, field_names[f])) field = f;
        if (ch == '"') {
            char *dst = NULL;
            size_t size = 0;
            if (depth == 0 && !strcmp(key, "type")) dst = s->type, size = sizeof s->type;
            if (in_config && !strcmp(key, "model")) dst = s->model, size = sizeof s->model;
            if (in_config && !strcmp(key, "dataset")) dst = s->dataset, size = sizeof s->dataset;
            if (in_config && !strcmp(key, "opt")) dst = s->opt, size = sizeof s->opt;
            if (scan_string(s, dst, size)) return -1;
            if (dst == s->type) s->has_type = 1;
        } else if (ch == '{' || ch == '[') {
            if (depth + 1 > MAX_DEPTH) return fail(s, "nested too deeply");
            int rc = ch == '{' ? scan_object(s, depth + 1, depth == 0 && !strcmp(key, "config"))
                               : scan_array(s, depth + 1);
            if (rc) return -1;
        } else {
            int is_num;
            double v;
            if (scan_token(s, &is_num, &v)) return -1;
            if (field >= 0 && is_num) {
                s->num[field] = v;
                s->has[field] = 1;
                field = -1;
            }
        }
        if (depth == 0 && !strcmp(key, "type") && !s->has_type)
            return fail(s, "\"type\" is not a string");
        if (field >= 0) {
            char msg[64];
            snprintf(msg, sizeof msg, "\"%s\" is not a number", field_names[field]);
            return fail(s, msg);
        }
        skip_ws(s);
        if (s->p >= s->end) return fail(s, "unterminated object (line cut off?)");
        if (*s->p == '}') {
            s->p++;
            return 0;
        }
        if (*s->p != ',') return fail(s, "expected ',' or '}' after a value");
        s->p++;
    }
}

/* A step or epoch: a whole number in [0, MAX_INDEX]. */
static int index_ok(double v) { return v >= 0 && v <= MAX_INDEX && v == floor(v); }

/* Adds what one scanned line says to the log; -1 with s->err set. */
static int apply_line(visc_run_log *log, line_scan *s) {
    if (!s->has_type) return fail(s, "no \"type\"");
    int has_step = s->has[F_STEP], has_epoch = s->has[F_EPOCH];
    if (has_step && !index_ok(s->num[F_STEP]))
        return fail(s, "\"step\" is not a whole number >= 0");
    if (has_epoch && !index_ok(s->num[F_EPOCH]))
        return fail(s, "\"epoch\" is not a whole number >= 0");
    double step = s->num[F_STEP], epoch = s->num[F_EPOCH];
    if (!strcmp(s->type, "train")) {
        if (!has_step) return fail(s, "train record without \"step\"");
        if (!s->has[F_LOSS]) return fail(s, "train record without \"loss\"");
        curve_add(&log->train_loss, step, s->num[F_LOSS]);
        if (s->has[F_TOP1]) curve_add(&log->train_top1, step, s->num[F_TOP1]);
        if (s->has[F_LR]) curve_add(&log->lr, step, s->num[F_LR]);
        if (s->has[F_TOP1] && has_epoch) curve_add(&log->train_top1_epoch, epoch, s->num[F_TOP1]);
    } else if (!strcmp(s->type, "val") || !strcmp(s->type, "val_ema")) {
        if (!has_epoch) return fail(s, "val record without \"epoch\"");
        if (!s->has[F_TOP1]) return fail(s, "val record without \"top1\"");
        if (s->type[3] == 0) {
            curve_add(&log->val_top1, epoch, s->num[F_TOP1]);
            if (s->has[F_TOP5]) curve_add(&log->val_top5, epoch, s->num[F_TOP5]);
            if (s->has[F_LOSS] && has_step) curve_add(&log->val_loss, step, s->num[F_LOSS]);
        } else {
            curve_add(&log->ema_top1, epoch, s->num[F_TOP1]);
        }
    } else if (!strcmp(s->type, "config")) {
        /* a resumed run logs its config again; the last one describes it */
        if (s->model[0]) snprintf(log->model, sizeof log->model, "%s", s->model);
        if (s->dataset[0]) snprintf(log->dataset, sizeof log->dataset, "%s", s->dataset);
        if (s->opt[0]) snprintf(log->opt, sizeof log->opt, "%s", s->opt);
    } else if (strcmp(s->type, "done") != 0) {
        return 0; /* a record type from a newer visc: not ours to judge */
    }
    log->records++;
    return 0;
}

void visc_run_log_free(visc_run_log *log) {
    curve_free(&log->train_loss);
    curve_free(&log->train_top1);
    curve_free(&log->lr);
    curve_free(&log->train_top1_epoch);
    curve_free(&log->val_loss);
    curve_free(&log->val_top1);
    curve_free(&log->val_top5);
    curve_free(&log->ema_top1);
    memset(log, 0, sizeof *log);
}

int visc_run_log_parse(visc_run_log *log, const char *text, size_t size, const char *source) {
    memset(log, 0, sizeof *log);
    const char *p = text, *end = text + size;
    int line = 0;
    while (p < end) {
        line++;
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        char err[128] = "";
        line_scan s;
        memset(&s, 0, sizeof s);
        s.p = p;
        s.end = le;
        s.err = err;
        s.err_size = sizeof err;
        skip_ws(&s);
        if (s.p < s.end) { /* not a blank line */
            int rc;
            if (memchr(p, 0, (size_t)(le - p))) rc = fail(&s, "NUL byte (not a text file?)");
            else if (*s.p != '{') rc = fail(&s, "not a JSON object (expected '{')");
            else rc = scan_object(&s, 0, 0);
            if (rc == 0) {
                skip_ws(&s);
                if (s.p < s.end) rc = fail(&s, "text after the closing '}'");
            }
            if (rc == 0) rc = apply_line(log, &s);
            if (rc) {
                visc_run_log_free(log);
                return visc_set_error("%s: line %d: %s", source, line, err);
            }
        }
        p = nl ? nl + 1 : end;
    }
    curve_finish(&log->train_loss);
    curve_finish(&log->train_top1);
    curve_finish(&log->lr);
    curve_finish(&log->train_top1_epoch);
    curve_finish(&log->val_loss);
    curve_finish(&log->val_top1);
    curve_finish(&log->val_top5);
    curve_finish(&log->ema_top1);
    return 0;
}

int visc_run_log_load(visc_run_log *log, const char *path) {
    memset(log, 0, sizeof *log);
    FILE *f = fopen(path, "rb");
    if (!f) return visc_set_error("%s: cannot read: %s", path, strerror(errno));
    size_t size = 0, cap = 1 << 16;
    char *text = visc_malloc(cap, "log file");
    for (;;) {
        if (size == cap) text = visc_realloc(text, cap *= 2, "log file");
        size_t k = fread(text + size, 1, cap - size, f);
        size += k;
        if (k == 0) break;
    }
    int bad = ferror(f);
    int saved = errno;
    fclose(f);
    if (bad) {
        free(text);
        return visc_set_error("%s: cannot read: %s", path, strerror(saved));
    }
    int blank = 1;
    for (size_t i = 0; i < size && blank; i++)
        if (!strchr(" \t\r\n", text[i]) || text[i] == 0) blank = 0;
    int rc = visc_run_log_parse(log, text, size, path);
    free(text);
    if (rc) return -1;
    if (log->records == 0) {
        visc_run_log_free(log);
        return visc_set_error("%s: %s", path,
                              blank ? "empty log (has the run started?)" : "no visc records in it");
    }
    return 0;
}

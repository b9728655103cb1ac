/* diff.c: `visc diff`: do two safetensors files hold the same numbers?
 *
 * For checking that two runs agree (one process against several, a
 * resumed run against an uninterrupted one, visc against timm) without a
 * Python stack. Tensor by tensor, as float: a tensor matches when
 *   max |a - b| <= atol + rtol * max |b|
 * (a tensor-wise criterion: elementwise relative errors of values near 0
 * say nothing about a training run). Both files must hold the same names
 * and shapes. Prints the worst tensors; exit status 0 = all match.
 *
 * With --base W0 (the weights both runs started from) the question is
 * whether the two runs moved the weights the same way: the criterion is
 * normwise over the whole file, ||a - b|| <= rtol * ||b - W0|| + atol.
 * Per-tensor criteria are too strict for two runs that sum in different
 * orders: a bias whose gradient is the sum of many cancelling terms (a
 * BatchNorm bias before another BatchNorm) keeps only a few correct
 * digits, and a few steps amplify that far beyond fp32 rounding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diff.h"
#include "visc/core.h"
#include "visc/io.h"

static void usage(FILE *f) {
    fputs("usage: visc diff A.safetensors B.safetensors [--rtol R] [--atol A]\n\n"
          "Compares two safetensors files tensor by tensor (as float32). A tensor\n"
          "matches when max|a - b| <= atol + rtol * max|b|. Exit status 0 when all\n"
          "match, 1 when one does not or the files differ in names or shapes.\n\n"
          "  --rtol R   relative tolerance (default 1e-5)\n"
          "  --atol A   absolute tolerance (default 1e-7)\n"
          "  --base W0  compare the changes from W0: ||a - b|| <= rtol ||b - W0|| + atol\n"
          "             over the whole file (W0 has the same tensors)\n",
          f);
}

static double parse_tol(const char *flag, const char *v) {
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x >= 0)) visc_die("diff: %s: expected a number >= 0, got '%s'", flag, v);
    return x;
}

typedef struct {
    double max_abs, max_ref;
    double sq_diff, sq_ref; /* sums of squares: a - b, and b - base (or b) */
} tensor_diff;

static tensor_diff compare(const float *a, const float *b, const float *base, size_t n) {
    tensor_diff d = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e > d.max_abs || e != e) d.max_abs = e != e ? INFINITY : e;
        double ref = base ? (double)b[i] - (double)base[i] : (double)b[i];
        if (fabs(ref) > d.max_ref) d.max_ref = fabs(ref);
        d.sq_diff += e * e;
        d.sq_ref += ref * ref;
    }
    return d;
}

static float *read_tensor(const visc_safetensors *st, const visc_st_tensor *t) {
    float *x = visc_malloc((t->numel ? t->numel : 1) * sizeof(float), "diff");
    if (visc_safetensors_read_f32(st, t->name, x, t->numel)) visc_die("%s", visc_last_error());
    return x;
}

int visc_cmd_diff(int argc, char **argv) {
    const char *files[2] = {NULL, NULL}, *base_path = NULL;
    double rtol = 1e-5, atol = 1e-7;
    int nfiles = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--rtol") || !strcmp(a, "--atol")) {
            if (i + 1 >= argc) visc_die("diff: option '%s' needs a value", a);
            *(a[2] == 'r' ? &rtol : &atol) = parse_tol(a, argv[++i]);
        } else if (!strcmp(a, "--base")) {
            if (i + 1 >= argc) visc_die("diff: option '%s' needs a value", a);
            base_path = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            visc_die("diff: unknown option '%s' (try `visc diff --help`)", a);
        } else if (nfiles < 2) {
            files[nfiles++] = a;
        } else {
            visc_die("diff: more than two files given");
        }
    }
    if (nfiles != 2) {
        usage(stderr);
        return 2;
    }
    visc_safetensors st[2], base;
    if (visc_safetensors_open(&st[0], files[0])) visc_die("%s", visc_last_error());
    if (visc_safetensors_open(&st[1], files[1])) visc_die("%s", visc_last_error());
    if (base_path && visc_safetensors_open(&base, base_path)) visc_die("%s", visc_last_error());
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < st[k].count; i++)
            if (!visc_safetensors_find(&st[1 - k], st[k].tensors[i].name))
                visc_die("diff: %s has tensor %s, %s does not", files[k], st[k].tensors[i].name,
                         files[1 - k]);
    int bad = 0;
    double worst = 0, sq_diff = 0, sq_ref = 0;
    const char *worst_name = "";
    for (int i = 0; i < st[0].count; i++) {
        const visc_st_tensor *ta = &st[0].tensors[i];
        const visc_st_tensor *tb = visc_safetensors_find(&st[1], ta->name);
        if (ta->ndim != tb->ndim || memcmp(ta->shape, tb->shape, sizeof(int64_t) * ta->ndim))
            visc_die("diff: %s has different shapes in the two files", ta->name);
        float *a = read_tensor(&st[0], ta), *b = read_tensor(&st[1], tb), *w0 = NULL;
        if (base_path) {
            const visc_st_tensor *t0 = visc_safetensors_find(&base, ta->name);
            if (!t0 || t0->numel != ta->numel)
                visc_die("diff: %s: no tensor %s of %zu values", base_path, ta->name, ta->numel);
            w0 = read_tensor(&base, t0);
        }
        tensor_diff d = compare(a, b, w0, ta->numel);
        free(a);
        free(b);
        free(w0);
        sq_diff += d.sq_diff;
        sq_ref += d.sq_ref;
        double rel = d.max_ref > 0 ? d.max_abs / d.max_ref : d.max_abs;
        if (rel > worst || (isinf(rel) && !isinf(worst))) {
            worst = rel;
            worst_name = ta->name;
        }
        if (!base_path && !(d.max_abs <= atol + rtol * d.max_ref)) {
            if (bad < 20)
                printf("differs: %-48s max |a-b| %.3g, max |b| %.3g (relative %.3g)\n", ta->name,
                       d.max_abs, d.max_ref, rel);
            bad++;
        }
    }
    double norm_diff = sqrt(sq_diff), norm_ref = sqrt(sq_ref);
    if (base_path) {
        bad = !(norm_diff <= rtol * norm_ref + atol);
        printf("||a - b|| = %.3g, ||b - base|| = %.3g: relative %.3g (rtol %g atol %g): %s; "
               "largest per-tensor difference %.3g of its change (%s)\n",
               norm_diff, norm_ref, norm_ref > 0 ? norm_diff / norm_ref : norm_diff, rtol, atol,
               bad ? "DIFFERENT" : "same", worst, worst_name);
        visc_safetensors_close(&base);
    } else {
        printf("%d tensors, %d differ beyond rtol %g atol %g; largest relative difference %.3g "
               "(%s); normwise %.3g\n",
               st[0].count, bad, rtol, atol, worst, worst_name,
               norm_ref > 0 ? norm_diff / norm_ref : norm_diff);
    }
    visc_safetensors_close(&st[0]);
    visc_safetensors_close(&st[1]);
    return bad ? 1 : 0;
}

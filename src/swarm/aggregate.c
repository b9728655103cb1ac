/* aggregate.c: validation of received parts, and the group's average:
 * weighted mean, coordinate-wise trimmed mean, centered clipping.
 *
 * The mean accumulates in double, so it equals the exact weighted mean
 * rounded once to float (up to the double rounding of the sums). The
 * robust modes sort each coordinate's m values (m is a group, at most a
 * few dozen) by insertion. */
#include "aggregate.h"

#include <math.h>
#include <string.h>

#include "visc/core.h"

#define CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
/* Coordinates averaged per pass through a double accumulator on the stack. */
#define CHUNK 1024
/* More parts than this is no group but a mistake; it also bounds the
 * per-coordinate scratch, which then lives on the stack. */
#define MAX_PARTS 1024

void visc_aggregate_config_default(visc_aggregate_config *c) {
    c->mode = VISC_AGG_MEAN;
    c->trim = 1;
    c->clip_tau = 1.0f;
    c->clip_iters = 3;
    c->max_abs = 1e6f;
    c->max_weight = 1e9;
}

int visc_aggregation_parse(const char *name, visc_aggregation *out) {
    static const struct {
        const char *name;
        visc_aggregation mode;
    } names[] = {{"mean", VISC_AGG_MEAN},
                 {"trimmed-mean", VISC_AGG_TRIMMED_MEAN},
                 {"trimmed_mean", VISC_AGG_TRIMMED_MEAN},
                 {"trimmed", VISC_AGG_TRIMMED_MEAN},
                 {"centered-clip", VISC_AGG_CENTERED_CLIP},
                 {"centered_clip", VISC_AGG_CENTERED_CLIP},
                 {"clip", VISC_AGG_CENTERED_CLIP}};
    if (!name) return visc_set_error("no aggregation named");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].mode;
            return 0;
        }
    return visc_set_error("unknown aggregation '%.64s' (mean, trimmed-mean, centered-clip)", name);
}

/* ---- validation ---- */

/* Whether every |x| <= max_abs; NaN fails the comparison. Only flags, so
 * the loop vectorizes; the first offender is searched when this fails. */
CLONES static int all_within(const float *x, size_t n, float max_abs) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= fabsf(x[i]) <= max_abs;
    return ok;
}

int visc_validate_part(const visc_aggregate_config *c, const float *x, size_t n, double weight) {
    if (!(weight > 0 && weight <= c->max_weight))
        return visc_set_error("weight %g is outside (0, %g]", weight, c->max_weight);
    return visc_validate_values(c, x, n);
}

int visc_validate_values(const visc_aggregate_config *c, const float *x, size_t n) {
    if (all_within(x, n, c->max_abs)) return 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return visc_set_error("value %zu is %g, not finite", i, (double)x[i]);
        if (!(fabsf(x[i]) <= c->max_abs))
            return visc_set_error("value %zu is %g, beyond the limit %g", i, (double)x[i],
                                  (double)c->max_abs);
    }
    return 0; /* not reached: all_within found one */
}

/* ---- weighted mean ---- */

CLONES static void axpy_double(double *acc, double w, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) acc[i] += w * (double)x[i];
}

static void weighted_mean(const float *const *parts, const double *w, int m, size_t n, float *out) {
    double total = 0;
    for (int i = 0; i < m; i++) total += w[i];
    double acc[CHUNK];
    for (size_t s = 0; s < n; s += CHUNK) {
        size_t k = n - s < CHUNK ? n - s : CHUNK;
        memset(acc, 0, k * sizeof acc[0]);
        for (int i = 0; i < m; i++) axpy_double(acc, w[i], parts[i] + s, k);
        for (size_t j = 0; j < k; j++) out[s + j] = (float)(acc[j] / total);
    }
}

/* ---- coordinate-wise order statistics ---- */

static void sort_floats(float *v, int m) {
    for (int i = 1; i < m; i++) {
        float t = v[i];
        int j = i - 1;
        for (; j >= 0 && v[j] > t; j--) v[j + 1] = v[j];
        v[j + 1] = t;
    }
}

/* Mean of sorted v without its trim smallest and trim largest; the median
 * when that would leave nothing (m < 2 * trim + 1). */
static float trimmed_of_sorted(const float *v, int m, int trim) {
    if (m < 2 * trim + 1) return m % 2 ? v[m / 2] : (float)(((double)v[m / 2 - 1] + v[m / 2]) / 2);
    double s = 0;
    for (int i = trim; i < m - trim; i++) s += v[i];
    return (float)(s / (m - 2 * trim));
}

/* out[j] = trimmed mean of the m values of coordinate j; trim = m gives
 * the median. scratch: m floats. */
static void trimmed_mean(const float *const *parts, int m, size_t n, int trim, float *scratch,
                         float *out) {
    for (size_t j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) scratch[i] = parts[i][j];
        sort_floats(scratch, m);
        out[j] = trimmed_of_sorted(scratch, m, trim);
    }
}

/* ---- centered clipping ---- */

CLONES static double sq_distance(const float *x, const float *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)v[i];
        s += d * d;
    }
    return s;
}

/* v += sum_i a_i (x_i - v), one coordinate at a time so that every peer
 * sees the same v of this iteration. */
static void clip_step(const float *const *parts, const double *a, int m, size_t n, float *v) {
    double acc[CHUNK];
    for (size_t s = 0; s < n; s += CHUNK) {
        size_t k = n - s < CHUNK ? n - s : CHUNK;
        memset(acc, 0, k * sizeof acc[0]);
        for (int i = 0; i < m; i++) {
            if (a[i] == 0) continue;
            for (size_t j = 0; j < k; j++) acc[j] += a[i] * ((double)parts[i][s + j] - v[s + j]);
        }
        for (size_t j = 0; j < k; j++) v[s + j] = (float)(v[s + j] + acc[j]);
    }
}

/* Starts at the coordinate-wise median; each iteration moves by the
 * weighted mean of the differences, each difference scaled down to norm
 * tau. A peer's pull per iteration is at most tau * w_i / sum w. */
static void centered_clip(const visc_aggregate_config *c, const float *const *parts,
                          const double *w, int m, size_t n, float *scratch, double *a, float *out) {
    trimmed_mean(parts, m, n, m, scratch, out); /* trim m: the median */
    double total = 0;
    for (int i = 0; i < m; i++) total += w[i];
    for (int it = 0; it < c->clip_iters; it++) {
        for (int i = 0; i < m; i++) {
            double norm = sqrt(sq_distance(parts[i], out, n));
            double f = norm > c->clip_tau ? c->clip_tau / norm : 1.0;
            a[i] = w[i] * f / total;
        }
        clip_step(parts, a, m, n, out);
    }
}

int visc_aggregate(const visc_aggregate_config *c, const float *const *parts, const double *weights,
                   int m, size_t n, float *out) {
    if (m < 1 || m > MAX_PARTS)
        return visc_set_error("cannot aggregate %d parts (1 to %d)", m, MAX_PARTS);
    for (int i = 0; i < m; i++)
        if (!(weights[i] > 0 && isfinite(weights[i])))
            return visc_set_error("part %d has weight %g", i, weights[i]);
    float scratch[MAX_PARTS];
    double a[MAX_PARTS];
    switch (c->mode) {
    case VISC_AGG_MEAN: weighted_mean(parts, weights, m, n, out); return 0;
    case VISC_AGG_TRIMMED_MEAN:
        if (c->trim < 0) return visc_set_error("trim %d is negative", c->trim);
        trimmed_mean(parts, m, n, c->trim, scratch, out);
        return 0;
    case VISC_AGG_CENTERED_CLIP:
        if (!(c->clip_tau > 0 && isfinite(c->clip_tau)) || c->clip_iters < 0)
            return visc_set_error("centered clip needs tau > 0 and iterations >= 0 (%g, %d)",
                                  (double)c->clip_tau, c->clip_iters);
        centered_clip(c, parts, weights, m, n, scratch, a, out);
        return 0;
    }
    return visc_set_error("unknown aggregation mode %d", (int)c->mode);
}

/* test_tokens.c: the token layers (tokens.h) against double-precision
 * references and finite differences.
 *
 * Gradient checks use L = sum(g * f(x)) for a fixed random upstream g, so
 * dL/dx is exactly what backward(g) returns. The central differences are
 * taken on a double-precision reference forward written out here (h = 1e-5,
 * truncation ~1e-10), so the numeric gradient is exact to far below fp32
 * rounding and the tolerance measures only visc's fp32 error. Each float
 * input is the rounding of its double twin, so both see the same point.
 * Large shapes, where per-element differences would be slow, are checked
 * along random directions: (L(x + h u) - L(x - h u)) / 2h = <dL/dx, u>. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/core.h"
#include "visc/rng.h"
#include "visc/tokens.h"

#define FD_H 1e-5

static void fill(double *xd, float *xf, size_t n, double lo, double hi, uint64_t sub) {
    visc_rng r = visc_rng_make(777, VISC_STREAM_INIT, sub);
    for (size_t i = 0; i < n; i++) {
        float v = (float)(lo + (hi - lo) * visc_rng_uniform_double(&r));
        xf[i] = v;
        xd[i] = v;
    }
}

static double *dalloc(size_t n) { return calloc(n ? n : 1, sizeof(double)); }
static float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

typedef double (*loss_fn)(void *ctx);

/* Central differences of f over x[0..n) against the analytic gradient g. */
static void fd_check(const char *what, loss_fn f, void *ctx, double *x, size_t n, const float *g,
                     double atol, double rtol) {
    float *num = falloc(n);
    for (size_t i = 0; i < n; i++) {
        const double x0 = x[i];
        x[i] = x0 + FD_H;
        const double lp = f(ctx);
        x[i] = x0 - FD_H;
        const double lm = f(ctx);
        x[i] = x0;
        num[i] = (float)((lp - lm) / (2 * FD_H));
    }
    CHECK_ARRAYS(what, g, num, n, atol, rtol);
    free(num);
}

/* Directional check along `dirs` random directions. */
static void fd_dir_check(const char *what, loss_fn f, void *ctx, double *x, size_t n,
                         const float *g, double rtol, uint64_t sub) {
    double *x0 = dalloc(n), *u = dalloc(n);
    float *uf = falloc(n);
    memcpy(x0, x, n * sizeof(double));
    for (int dir = 0; dir < 3; dir++) {
        fill(u, uf, n, -1, 1, sub * 16 + (uint64_t)dir);
        double ana = 0, mag = 0;
        for (size_t i = 0; i < n; i++) {
            ana += (double)g[i] * u[i];
            mag += fabs((double)g[i] * u[i]);
        }
        for (size_t i = 0; i < n; i++) x[i] = x0[i] + FD_H * u[i];
        const double lp = f(ctx);
        for (size_t i = 0; i < n; i++) x[i] = x0[i] - FD_H * u[i];
        const double lm = f(ctx);
        memcpy(x, x0, n * sizeof(double));
        const double num = (lp - lm) / (2 * FD_H);
        /* Relative to the sum of |terms|, the scale of the fp32 rounding. */
        CHECK_MSG(fabs(ana - num) <= rtol * mag, "%s direction %d: analytic %.9g numeric %.9g",
                  what, dir, ana, num);
    }
    free(x0), free(u), free(uf);
}

/* ---- layernorm ---- */

typedef struct {
    int64_t rows;
    int C;
    double eps;
    double *x, *gamma, *beta, *g; /* gamma/beta NULL: no affine */
} ln_ctx;

static void ln_ref(const ln_ctx *c, double *out) {
    for (int64_t r = 0; r < c->rows; r++) {
        const double *x = c->x + r * c->C;
        double m = 0, v = 0;
        for (int i = 0; i < c->C; i++) m += x[i];
        m /= c->C;
        for (int i = 0; i < c->C; i++) v += (x[i] - m) * (x[i] - m);
        v /= c->C;
        for (int i = 0; i < c->C; i++) {
            double y = (x[i] - m) / sqrt(v + c->eps);
            if (c->gamma) y = y * c->gamma[i] + c->beta[i];
            out[r * c->C + i] = y;
        }
    }
}

static double ln_loss(void *p) {
    const ln_ctx *c = p;
    const size_t n = (size_t)c->rows * c->C;
    double *y = dalloc(n), s = 0;
    ln_ref(c, y);
    for (size_t i = 0; i < n; i++) s += y[i] * c->g[i];
    free(y);
    return s;
}

static void layernorm_case(int64_t rows, int C, int affine, double shift, int per_element) {
    const size_t n = (size_t)rows * C;
    ln_ctx c = {rows,     C, 1e-6, dalloc(n), affine ? dalloc(C) : NULL, affine ? dalloc(C) : NULL,
                dalloc(n)};
    float *x = falloc(n), *g = falloc(n), *gamma = falloc(C), *beta = falloc(C);
    float *y = falloc(n), *want = falloc(n), *mean = falloc(rows), *rstd = falloc(rows);
    float *dx = falloc(n), *dgamma = falloc(C), *dbeta = falloc(C);
    fill(c.x, x, n, shift - 2, shift + 2, 1);
    fill(c.g, g, n, -1, 1, 2);
    if (affine) {
        fill(c.gamma, gamma, C, 0.5, 1.5, 3);
        fill(c.beta, beta, C, -0.5, 0.5, 4);
    }
    double *yd = dalloc(n);
    ln_ref(&c, yd);
    for (size_t i = 0; i < n; i++) want[i] = (float)yd[i];
    visc_layernorm_forward(y, mean, rstd, x, affine ? gamma : NULL, affine ? beta : NULL, rows, C,
                           (float)c.eps);
    CHECK_ARRAYS("layernorm out", y, want, n, 1e-5, 1e-5);
    visc_layernorm_backward(dx, affine ? dgamma : NULL, affine ? dbeta : NULL, g, x,
                            affine ? gamma : NULL, mean, rstd, rows, C);
    if (per_element) {
        fd_check("layernorm dx", ln_loss, &c, c.x, n, dx, 2e-5, 1e-4);
        if (affine) {
            fd_check("layernorm dgamma", ln_loss, &c, c.gamma, C, dgamma, 2e-5, 1e-4);
            fd_check("layernorm dbeta", ln_loss, &c, c.beta, C, dbeta, 2e-5, 1e-4);
        }
    } else {
        fd_dir_check("layernorm dx", ln_loss, &c, c.x, n, dx, 1e-5, 5);
        if (affine) {
            fd_dir_check("layernorm dgamma", ln_loss, &c, c.gamma, C, dgamma, 1e-5, 6);
            fd_dir_check("layernorm dbeta", ln_loss, &c, c.beta, C, dbeta, 1e-5, 7);
        }
    }
    free(c.x), free(c.gamma), free(c.beta), free(c.g), free(yd);
    free(x), free(g), free(gamma), free(beta), free(y), free(want), free(mean), free(rstd);
    free(dx), free(dgamma), free(dbeta);
}

TEST(layernorm_finite_differences) {
    layernorm_case(5, 7, 1, 0.0, 1);
    layernorm_case(4, 19, 0, 0.3, 1); /* no affine; C not a multiple of the column block */
}

TEST(layernorm_large_rows_and_offset_mean) {
    /* A residual stream with a large mean: the centred variance keeps fp32 accurate. */
    layernorm_case(333, 192, 1, 50.0, 0);
    layernorm_case(64, 40, 0, -3.0, 0);
}

TEST(layernorm_backward_din_null) {
    enum { R = 6, C = 9 };
    double xd[R * C], gd[R * C];
    float x[R * C], g[R * C], gamma[C], beta[C], y[R * C], mean[R], rstd[R];
    float dg1[C], db1[C], dg2[C], db2[C], dx[R * C];
    fill(xd, x, R * C, -1, 1, 8);
    fill(gd, g, R * C, -1, 1, 9);
    for (int i = 0; i < C; i++) gamma[i] = 1.0f + 0.1f * (float)i, beta[i] = 0.0f;
    visc_layernorm_forward(y, mean, rstd, x, gamma, beta, R, C, 1e-5f);
    visc_layernorm_backward(dx, dg1, db1, g, x, gamma, mean, rstd, R, C);
    visc_layernorm_backward(NULL, dg2, db2, g, x, gamma, mean, rstd, R, C);
    CHECK(memcmp(dg1, dg2, sizeof dg1) == 0);
    CHECK(memcmp(db1, db2, sizeof db1) == 0);
}

/* _add: din += the input's gradient, the parameter gradients as without */
TEST(layernorm_backward_add_accumulates) {
    enum { R = 7, C = 37 };
    double xd[R * C], gd[R * C], sd[R * C];
    float x[R * C], g[R * C], stream[R * C], gamma[C], beta[C], y[R * C], mean[R], rstd[R];
    float dg1[C], db1[C], dg2[C], db2[C], dx[R * C], sum[R * C], want[R * C];
    fill(xd, x, R * C, -1, 1, 10);
    fill(gd, g, R * C, -1, 1, 11);
    fill(sd, stream, R * C, -2, 2, 12);
    for (int i = 0; i < C; i++) gamma[i] = 0.7f + 0.02f * (float)i, beta[i] = 0.1f;
    visc_layernorm_forward(y, mean, rstd, x, gamma, beta, R, C, 1e-5f);
    visc_layernorm_backward(dx, dg1, db1, g, x, gamma, mean, rstd, R, C);
    memcpy(sum, stream, sizeof sum);
    visc_layernorm_backward_add(sum, dg2, db2, g, x, gamma, mean, rstd, R, C);
    for (int i = 0; i < R * C; i++) want[i] = stream[i] + dx[i];
    /* one rounding apart at most (the sum may be fused with dx's product) */
    CHECK_ARRAYS("layernorm din added", sum, want, R * C, 1e-6, 1e-6);
    CHECK(memcmp(dg1, dg2, sizeof dg1) == 0);
    CHECK(memcmp(db1, db2, sizeof db1) == 0);
}

/* ---- gelu ---- */

static double gelu_ref(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }

TEST(gelu_matches_erf_and_derivative) {
    enum { N = 2001 };
    float *x = falloc(N), *y = falloc(N), *want = falloc(N), *g = falloc(N), *dx = falloc(N);
    float *num = falloc(N);
    for (int i = 0; i < N; i++) x[i] = -10.0f + 20.0f * (float)i / (N - 1);
    for (int i = 0; i < N; i++) g[i] = 1.0f + 0.001f * (float)i;
    visc_gelu_forward(y, x, N);
    for (int i = 0; i < N; i++) want[i] = (float)gelu_ref(x[i]);
    CHECK_ARRAYS("gelu", y, want, N, 1e-6, 1e-5);
    visc_gelu_backward(dx, g, x, N);
    for (int i = 0; i < N; i++)
        num[i] = (float)(g[i] * (gelu_ref(x[i] + FD_H) - gelu_ref(x[i] - FD_H)) / (2 * FD_H));
    CHECK_ARRAYS("gelu dx", dx, num, N, 1e-5, 1e-4);
    /* din may alias dout. */
    memcpy(num, g, N * sizeof(float));
    visc_gelu_backward(num, num, x, N);
    CHECK(memcmp(num, dx, N * sizeof(float)) == 0);
    /* Known values: gelu(0) = 0, gelu(1) = 0.8413447, gelu'(0) = 0.5. */
    CHECK_CLOSE(y[N / 2], 0.0, 1e-7, 0);
    float one = 1.0f, r, d;
    visc_gelu_forward(&r, &one, 1);
    CHECK_CLOSE(r, 0.841344746, 1e-7, 0);
    float zero = 0.0f, gone = 1.0f;
    visc_gelu_backward(&d, &gone, &zero, 1);
    CHECK_CLOSE(d, 0.5, 1e-7, 0);
    free(x), free(y), free(want), free(g), free(dx), free(num);
}

/* ---- layerscale ---- */

typedef struct {
    int rows, C;
    double *x, *gamma, *g;
} ls_ctx;

static double ls_loss(void *p) {
    const ls_ctx *c = p;
    double s = 0;
    for (int r = 0; r < c->rows; r++)
        for (int i = 0; i < c->C; i++) s += c->x[r * c->C + i] * c->gamma[i] * c->g[r * c->C + i];
    return s;
}

TEST(layerscale_finite_differences) {
    enum { R = 7, C = 21 };
    double xd[R * C], gd[R * C], gmd[C];
    float x[R * C], g[R * C], gm[C], y[R * C], dx[R * C], dgm[C];
    ls_ctx c = {R, C, xd, gmd, gd};
    fill(xd, x, R * C, -1, 1, 10);
    fill(gd, g, R * C, -1, 1, 11);
    fill(gmd, gm, C, -0.1, 0.1, 12);
    visc_layerscale_forward(y, x, gm, R, C);
    for (int i = 0; i < R * C; i++) CHECK(y[i] == x[i] * gm[i % C]);
    visc_layerscale_backward(dx, dgm, g, x, gm, R, C);
    fd_check("layerscale dx", ls_loss, &c, xd, R * C, dx, 1e-6, 1e-5);
    fd_check("layerscale dgamma", ls_loss, &c, gmd, C, dgm, 1e-5, 1e-5);
    /* In place: out aliases in; din aliases dout. */
    float xi[R * C], gi[R * C];
    memcpy(xi, x, sizeof x);
    visc_layerscale_forward(xi, xi, gm, R, C);
    CHECK(memcmp(xi, y, sizeof y) == 0);
    memcpy(gi, g, sizeof g);
    visc_layerscale_backward(gi, dgm, gi, x, gm, R, C);
    CHECK(memcmp(gi, dx, sizeof dx) == 0);
}

/* ---- token ops ---- */

TEST(add_broadcast_and_token_mean) {
    enum { B = 3, N = 5, C = 4 };
    float x[B * N * C], x0[B * N * C], t[N * C], dt[N * C], m[B * C], dm[B * C], dx[B * N * C];
    double xd[B * N * C], td[N * C], md[B * C];
    fill(xd, x, B * N * C, -1, 1, 13);
    fill(td, t, N * C, -1, 1, 14);
    memcpy(x0, x, sizeof x);
    visc_add_broadcast_forward(x, t, B, N * C);
    for (int i = 0; i < B * N * C; i++) CHECK(x[i] == x0[i] + t[i % (N * C)]);
    visc_add_broadcast_backward(dt, x0, B, N * C);
    for (int i = 0; i < N * C; i++) {
        double s = 0;
        for (int b = 0; b < B; b++) s += x0[b * N * C + i];
        CHECK_CLOSE(dt[i], s, 1e-6, 1e-6);
    }
    visc_token_mean_forward(m, x0, B, N, C);
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            double s = 0;
            for (int n = 0; n < N; n++) s += x0[(b * N + n) * C + c];
            CHECK_CLOSE(m[b * C + c], s / N, 1e-6, 1e-6);
        }
    /* Mean is linear: dL/dx[b,n,c] = dm[b,c] / N for L = <dm, mean(x)>. */
    fill(md, dm, B * C, -1, 1, 15);
    visc_token_mean_backward(dx, dm, B, N, C);
    for (int b = 0; b < B; b++)
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++)
                CHECK_CLOSE(dx[(b * N + n) * C + c], md[b * C + c] / N, 1e-7, 1e-6);
}

/* ---- droppath ---- */

TEST(droppath_eval_and_p0_are_plain_adds) {
    enum { B = 4, P = 10 };
    float x[B * P], x0[B * P], y[B * P], keep[B];
    double d[B * P];
    fill(d, x, B * P, -1, 1, 16);
    fill(d, y, B * P, -1, 1, 17);
    memcpy(x0, x, sizeof x);
    visc_droppath_add_forward(x, x, y, keep, B, P, 0.5f, 0, 1, 0); /* eval */
    for (int i = 0; i < B * P; i++) CHECK(x[i] == x0[i] + y[i]);
    for (int b = 0; b < B; b++) CHECK(keep[b] == 1.0f);
    memcpy(x, x0, sizeof x);
    visc_droppath_add_forward(x, x, y, keep, B, P, 0.0f, 1, 1, 0); /* train, p = 0 */
    for (int i = 0; i < B * P; i++) CHECK(x[i] == x0[i] + y[i]);
}

/* out beside x: the sum written there, x untouched, the dropped samples'
 * x copied over, the same bits as in place */
TEST(droppath_into_another_buffer) {
    enum { B = 64, P = 10 };
    float x[B * P], x0[B * P], y[B * P], out[B * P], keep[B], keep2[B];
    double d[B * P];
    fill(d, x, B * P, -1, 1, 18);
    fill(d, y, B * P, -1, 1, 19);
    memcpy(x0, x, sizeof x);
    for (int i = 0; i < B * P; i++) out[i] = NAN;
    visc_droppath_add_forward(out, x, y, keep, B, P, 0.5f, 1, 5, 0);
    CHECK(memcmp(x, x0, sizeof x) == 0);
    visc_droppath_add_forward(x, x, y, keep2, B, P, 0.5f, 1, 5, 0);
    CHECK(memcmp(keep, keep2, sizeof keep) == 0);
    CHECK(memcmp(out, x, sizeof x) == 0);
    int dropped = 0;
    for (int b = 0; b < B; b++) dropped += keep[b] == 0.0f;
    CHECK_MSG(dropped > 0 && dropped < B, "%d of %d samples dropped", dropped, B);
}

TEST(droppath_draws_and_gradient) {
    enum { B = 2000, P = 3 };
    const float p = 0.3f;
    float *x = falloc(B * P), *y = falloc(B * P), *keep = falloc(B), *keep2 = falloc(B);
    float *dy = falloc(B * P), *g = falloc(B * P);
    for (int i = 0; i < B * P; i++) y[i] = 1.0f + (float)(i % 7), g[i] = (float)(i % 5) - 2.0f;
    visc_droppath_add_forward(x, x, y, keep, B, P, p, 1, 42, 1000);
    int kept = 0;
    for (int b = 0; b < B; b++) {
        /* The documented draw: keep = floor(1 - p + U), U the first uniform of (seed, offset + b).
         */
        visc_rng r = visc_rng_make(42, VISC_STREAM_DROPOUT, 1000 + (uint64_t)b);
        const float want = floorf(1.0f - p + visc_rng_uniform(&r)) / (1.0f - p);
        CHECK(keep[b] == want);
        CHECK(keep[b] == 0.0f || fabsf(keep[b] - 1.0f / 0.7f) < 1e-6f);
        kept += keep[b] != 0.0f;
        for (int i = 0; i < P; i++) CHECK(x[b * P + i] == keep[b] * y[b * P + i]);
    }
    /* Binomial(2000, 0.7): mean 1400, sd 20.5; 5 sd either side. */
    CHECK_MSG(kept > 1297 && kept < 1503, "kept %d of %d", kept, B);
    /* Reproducible and shift-consistent: sample b at offset o+1 is sample b+1 at offset o. */
    memset(x, 0, B * P * sizeof(float));
    visc_droppath_add_forward(x, x, y, keep2, B, P, p, 1, 42, 1001);
    for (int b = 0; b + 1 < B; b++) CHECK(keep2[b] == keep[b + 1]);
    visc_droppath_add_forward(x, x, y, keep2, B, P, p, 1, 43, 1000); /* another seed differs */
    CHECK(memcmp(keep, keep2, B * sizeof(float)) != 0);
    visc_droppath_add_backward(dy, g, keep, B, P);
    for (int i = 0; i < B * P; i++) CHECK(dy[i] == keep[i / P] * g[i]);
    free(x), free(y), free(keep), free(keep2), free(dy), free(g);
}

/* ---- pos_embed ---- */

TEST(pos_embed_resample_identity_constant_and_linear) {
    enum { H = 5, W = 6, C = 3 };
    float in[H * W * C], out[9 * 11 * C];
    double d[H * W * C];
    fill(d, in, H * W * C, -1, 1, 18);
    visc_pos_embed_resample(out, in, C, H, W, H, W);
    CHECK_ARRAYS("same size", out, in, H * W * C, 0, 0);
    /* Cubic weights sum to one: a constant grid stays constant. */
    for (int i = 0; i < H * W * C; i++) in[i] = 0.25f;
    visc_pos_embed_resample(out, in, C, H, W, 9, 11);
    for (int i = 0; i < 9 * 11 * C; i++) CHECK_CLOSE(out[i], 0.25, 1e-6, 0);
    /* A ramp along x upsampled 2x, against Keys' kernel evaluated at the tap
     * distances: W(d) = (A+2)|d|^3 - (A+3)|d|^2 + 1 for |d| <= 1,
     * A|d|^3 - 5A|d|^2 + 8A|d| - 4A for 1 < |d| < 2. Symmetric: up[ox] +
     * up[31 - ox] = 15. */
    enum { W2 = 16, OW = 32 };
    float ramp[W2], up[OW];
    for (int i = 0; i < W2; i++) ramp[i] = (float)i;
    visc_pos_embed_resample(up, ramp, 1, 1, W2, 1, OW);
    for (int ox = 0; ox < OW; ox++) {
        const double A = -0.75, src = (ox + 0.5) * 0.5 - 0.5;
        double want_v = 0;
        for (int tap = (int)floor(src) - 1; tap <= (int)floor(src) + 2; tap++) {
            const double dd = fabs(src - tap);
            const double w = dd <= 1 ? ((A + 2) * dd - (A + 3)) * dd * dd + 1
                                     : ((A * dd - 5 * A) * dd + 8 * A) * dd - 4 * A;
            want_v += w * (tap < 0 ? 0 : tap > W2 - 1 ? W2 - 1 : tap);
        }
        CHECK_CLOSE(up[ox], want_v, 1e-5, 0);
        CHECK_CLOSE(up[ox] + up[OW - 1 - ox], 15.0, 1e-5, 0);
    }
    /* Downsampling 4 -> 2: src = 2 dst + 0.5, taps (i-1..i+2) with t = 0.5. */
    float r4[4] = {0, 1, 2, 3}, r2[2];
    visc_pos_embed_resample(r2, r4, 1, 1, 4, 1, 2);
    const double a = -0.75, t = 0.5;
    const double w0 = ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a;
    const double w1 = ((a + 2) * t - (a + 3)) * t * t + 1;
    /* dst 0: src 0.5, taps -1 (clamped 0), 0, 1, 2; weights w0, w1, w1, w0. */
    CHECK_CLOSE(r2[0], w0 * 0 + w1 * 0 + w1 * 1 + w0 * 2, 1e-6, 0);
    /* dst 1: src 2.5, taps 1, 2, 3, 4 (clamped 3). */
    CHECK_CLOSE(r2[1], w0 * 1 + w1 * 2 + w1 * 3 + w0 * 3, 1e-6, 0);
}

/* ---- attention ---- */

enum { LAYOUT_BHND, LAYOUT_QKV, LAYOUT_BNHD };

typedef struct {
    visc_attention a;
    size_t nqkv, nout, nbias, nmaskel;
    int64_t qoff, koff, voff;
    double *qkv, *bias, *mask, *hs, *g;
} att_ctx;

/* Reference forward in double; writes out (at out strides) and lse when given. */
static void att_ref(const att_ctx *c, double *out, double *lse) {
    const visc_attention *a = &c->a;
    const double *q = c->qkv + c->qoff, *k = c->qkv + c->koff, *v = c->qkv + c->voff;
    double *s = dalloc((size_t)a->Nk);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < a->H; h++)
            for (int i = 0; i < a->Nq; i++) {
                const double sh = c->hs ? c->hs[h] : a->scale;
                double mx = -INFINITY;
                for (int j = 0; j < a->Nk; j++) {
                    double d = 0;
                    for (int e = 0; e < a->D; e++)
                        d += q[b * a->q_sb + h * a->q_sh + i * a->q_sn + e] *
                             k[b * a->k_sb + h * a->k_sh + j * a->k_sn + e];
                    d *= sh;
                    const int64_t ij = (int64_t)i * a->Nk + j;
                    if (c->bias) d += c->bias[(int64_t)h * a->Nq * a->Nk + ij];
                    if (c->mask) d += c->mask[(int64_t)(b % a->nmask) * a->Nq * a->Nk + ij];
                    s[j] = d;
                    mx = d > mx ? d : mx;
                }
                double sum = 0;
                for (int j = 0; j < a->Nk; j++) sum += exp(s[j] - mx);
                if (lse) lse[((int64_t)b * a->H + h) * a->Nq + i] = mx + log(sum);
                for (int e = 0; e < a->D; e++) {
                    double o = 0;
                    for (int j = 0; j < a->Nk; j++)
                        o += exp(s[j] - mx) / sum * v[b * a->v_sb + h * a->v_sh + j * a->v_sn + e];
                    out[b * a->o_sb + h * a->o_sh + i * a->o_sn + e] = o;
                }
            }
    free(s);
}

static double att_loss(void *p) {
    const att_ctx *c = p;
    double *o = dalloc(c->nout), s = 0;
    att_ref(c, o, NULL);
    for (size_t i = 0; i < c->nout; i++) s += o[i] * c->g[i];
    free(o);
    return s;
}

typedef struct {
    int B, H, Nq, Nk, D, layout, bias, nmask, head_scale;
} att_case;

static void att_setup(att_ctx *c, const att_case *t) {
    memset(c, 0, sizeof *c);
    visc_attention *a = &c->a;
    const int B = t->B, H = t->H, Nq = t->Nq, Nk = t->Nk, D = t->D;
    a->B = B, a->H = H, a->Nq = Nq, a->Nk = Nk, a->D = D;
    a->scale = 1.0f / sqrtf((float)D);
    a->nmask = t->nmask;
    const int64_t HD = (int64_t)H * D;
    if (t->layout == LAYOUT_QKV) {
        VISC_ASSERT(Nq == Nk);
        c->nqkv = (size_t)B * Nq * 3 * HD;
        c->qoff = 0, c->koff = HD, c->voff = 2 * HD;
        a->q_sb = a->k_sb = a->v_sb = Nq * 3 * HD;
        a->q_sh = a->k_sh = a->v_sh = D;
        a->q_sn = a->k_sn = a->v_sn = 3 * HD;
    } else {
        c->nqkv = (size_t)B * (Nq + 2 * Nk) * HD;
        c->qoff = 0, c->koff = (int64_t)B * Nq * HD, c->voff = c->koff + (int64_t)B * Nk * HD;
        if (t->layout == LAYOUT_BHND) {
            a->q_sb = Nq * HD, a->q_sh = (int64_t)Nq * D, a->q_sn = D;
            a->k_sb = a->v_sb = Nk * HD, a->k_sh = a->v_sh = (int64_t)Nk * D, a->k_sn = a->v_sn = D;
        } else {
            a->q_sb = Nq * HD, a->q_sh = D, a->q_sn = HD;
            a->k_sb = a->v_sb = Nk * HD, a->k_sh = a->v_sh = D, a->k_sn = a->v_sn = HD;
        }
    }
    c->nout = (size_t)B * Nq * HD;
    if (t->layout == LAYOUT_BNHD) /* output [B, H, Nq, D] */
        a->o_sb = Nq * HD, a->o_sh = (int64_t)Nq * D, a->o_sn = D;
    else /* output [B, Nq, H, D] */ a->o_sb = Nq * HD, a->o_sh = D, a->o_sn = HD;
    c->nbias = t->bias ? (size_t)H * Nq * Nk : 0;
    c->nmaskel = t->nmask ? (size_t)t->nmask * Nq * Nk : 0;
}

static void attention_case(const att_case *t, int per_element, uint64_t seed) {
    att_ctx c;
    att_setup(&c, t);
    visc_attention *a = &c.a;
    const size_t nl = (size_t)a->B * a->H * a->Nq;
    c.qkv = dalloc(c.nqkv), c.g = dalloc(c.nout);
    float *qkv = falloc(c.nqkv), *g = falloc(c.nout), *out = falloc(c.nout), *lse = falloc(nl);
    float *dqkv = falloc(c.nqkv), *bias = NULL, *mask = NULL, *hs = NULL, *dbias = NULL;
    float dhs[64];
    fill(c.qkv, qkv, c.nqkv, -1.5, 1.5, seed * 8 + 0);
    fill(c.g, g, c.nout, -1, 1, seed * 8 + 1);
    if (t->bias) {
        c.bias = dalloc(c.nbias), bias = falloc(c.nbias), dbias = falloc(c.nbias);
        fill(c.bias, bias, c.nbias, -1, 1, seed * 8 + 2);
        a->bias = bias;
    }
    if (t->nmask) {
        /* Swin's shifted-window masks: 0 or -100, every row keeps its diagonal. */
        c.mask = dalloc(c.nmaskel), mask = falloc(c.nmaskel);
        fill(c.mask, mask, c.nmaskel, 0, 1, seed * 8 + 3);
        for (size_t i = 0; i < c.nmaskel; i++) {
            const size_t j = i % a->Nk, r = (i / a->Nk) % a->Nq;
            mask[i] = (c.mask[i] < 0.3 && j != r) ? -100.0f : 0.0f;
            c.mask[i] = mask[i];
        }
        a->mask = mask;
    }
    if (t->head_scale) {
        c.hs = dalloc(a->H), hs = falloc(a->H);
        fill(c.hs, hs, a->H, 0.2, 0.6, seed * 8 + 4);
        a->head_scale = hs;
    }
    double *oref = dalloc(c.nout), *lref = dalloc(nl);
    att_ref(&c, oref, lref);
    float *want = falloc(c.nout), *lwant = falloc(nl);
    for (size_t i = 0; i < c.nout; i++) want[i] = (float)oref[i];
    for (size_t i = 0; i < nl; i++) lwant[i] = (float)lref[i];
    visc_attention_forward(a, out, lse, qkv + c.qoff, qkv + c.koff, qkv + c.voff);
    CHECK_ARRAYS("attention out", out, want, c.nout, 1e-5, 1e-4);
    CHECK_ARRAYS("attention lse", lse, lwant, nl, 1e-5, 1e-5);
    for (size_t i = 0; i < c.nqkv; i++) dqkv[i] = NAN; /* every element must be written */
    visc_attention_backward(a, dqkv + c.qoff, dqkv + c.koff, dqkv + c.voff, dbias,
                            t->head_scale ? dhs : NULL, g, qkv + c.qoff, qkv + c.koff, qkv + c.voff,
                            out, lse);
    if (per_element) {
        fd_check("attention dq/dk/dv", att_loss, &c, c.qkv, c.nqkv, dqkv, 2e-5, 1e-4);
        if (t->bias) fd_check("attention dbias", att_loss, &c, c.bias, c.nbias, dbias, 2e-5, 1e-4);
        if (t->head_scale)
            fd_check("attention dhead_scale", att_loss, &c, c.hs, a->H, dhs, 2e-5, 1e-4);
    } else {
        fd_dir_check("attention dq/dk/dv", att_loss, &c, c.qkv, c.nqkv, dqkv, 1e-5, seed);
        if (t->bias)
            fd_dir_check("attention dbias", att_loss, &c, c.bias, c.nbias, dbias, 1e-5, seed + 1);
        if (t->head_scale)
            fd_dir_check("attention dhead_scale", att_loss, &c, c.hs, a->H, dhs, 1e-5, seed + 2);
    }
    /* dq = NULL: dk and dv unchanged, the q part of the buffer untouched. */
    if (t->layout != LAYOUT_QKV) {
        float *dkv = falloc(c.nqkv);
        for (size_t i = 0; i < c.nqkv; i++) dkv[i] = 7.0f;
        visc_attention_backward(a, NULL, dkv + c.koff, dkv + c.voff, NULL, NULL, g, qkv + c.qoff,
                                qkv + c.koff, qkv + c.voff, out, lse);
        CHECK_ARRAYS("attention dk/dv without dq", dkv + c.koff, dqkv + c.koff,
                     c.nqkv - (size_t)c.koff, 0, 0);
        for (int64_t i = 0; i < c.koff; i++) CHECK(dkv[i] == 7.0f);
        free(dkv);
    }
    free(c.qkv), free(c.g), free(c.bias), free(c.mask), free(c.hs), free(oref), free(lref);
    free(qkv), free(g), free(out), free(lse), free(dqkv), free(bias), free(mask), free(hs);
    free(dbias), free(want), free(lwant);
}

TEST(attention_plain_finite_differences) {
    const att_case t = {3, 2, 5, 5, 4, LAYOUT_BHND, 0, 0, 0};
    attention_case(&t, 1, 1);
}

TEST(attention_fused_qkv_bias_mask_head_scale) {
    /* Swin-like: fused qkv, relative bias, 2 window masks over 4 windows, V2 head scales. */
    const att_case t = {4, 3, 6, 6, 5, LAYOUT_QKV, 1, 2, 1};
    attention_case(&t, 1, 2);
}

TEST(attention_cross_nq_ne_nk) {
    const att_case t1 = {2, 2, 3, 7, 4, LAYOUT_BNHD, 1, 1, 0};
    attention_case(&t1, 1, 3);
    /* CaiT class attention: one query against all tokens. */
    const att_case t2 = {3, 2, 1, 6, 5, LAYOUT_BNHD, 0, 0, 1};
    attention_case(&t2, 1, 4);
    const att_case t3 = {2, 1, 6, 2, 3, LAYOUT_BHND, 1, 2, 1};
    attention_case(&t3, 1, 5);
}

TEST(attention_model_sized_directional) {
    /* ViT-Ti at 32 px (N = 65, D = 64) and a Swin window batch (N = 49, D = 32). */
    const att_case vit = {2, 3, 65, 65, 64, LAYOUT_QKV, 0, 0, 0};
    attention_case(&vit, 0, 6);
    const att_case swin = {4, 2, 49, 49, 32, LAYOUT_QKV, 1, 2, 1};
    attention_case(&swin, 0, 7);
}

TEST(attention_flops) {
    const visc_attention a = {.B = 2, .H = 3, .Nq = 5, .Nk = 7, .D = 8};
    CHECK(visc_attention_flops(&a) == 4.0 * 2 * 3 * 5 * 7 * 8);
}

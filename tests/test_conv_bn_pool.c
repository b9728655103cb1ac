/* test_conv_bn_pool.c: conv2d, batchnorm2d and pool2d against direct
 * double-precision references (forward) and central finite differences
 * (every input and parameter gradient).
 *
 * FD loss: L = sum(out * lw) with fixed random lw, so dout = lw. Sums run in
 * double; eps = 1e-2 on fp32 data. Conv and pooling are (piecewise) linear,
 * so the FD error is only rounding; batchnorm is smooth, its FD error is
 * O(eps^2). Inputs are chosen away from kinks (ReLU at 0, max-pool ties). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/nn.h"
#include "visc/rng.h"

#define FD_EPS 1e-2f

static float *falloc(size_t n) { return visc_calloc(n, sizeof(float), "test buffer"); }

static void fill(visc_rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * visc_rng_uniform(r);
}

static double dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* A loss to differentiate: recomputes L from the current buffers. */
typedef double (*loss_fn)(void *ctx);

/* Central differences of L with respect to every element of x, compared with `analytic`. */
static int check_fd(const char *what, float *x, size_t n, const float *analytic, loss_fn loss,
                    void *ctx, double atol, double rtol) {
    float *fd = falloc(n);
    for (size_t i = 0; i < n; i++) {
        float keep = x[i];
        x[i] = keep + FD_EPS;
        double lp = loss(ctx);
        x[i] = keep - FD_EPS;
        double lm = loss(ctx);
        x[i] = keep;
        fd[i] = (float)((lp - lm) / (2.0 * FD_EPS));
    }
    int ok = CHECK_ARRAYS(what, analytic, fd, n, atol, rtol);
    free(fd);
    return ok;
}

/* ================================ conv2d ================================ */

typedef struct {
    int N, C, H, W, K, R, S, stride, pad, dil, groups, bias;
} conv_shape;

typedef struct {
    visc_conv2d conv;
    float *in, *w, *b, *out, *lw;
} conv_ctx;

static double conv_loss(void *p) {
    conv_ctx *t = p;
    visc_conv2d_forward(&t->conv, t->out, t->in, t->w, t->conv.has_bias ? t->b : NULL);
    return dot(t->out, t->lw, (size_t)t->conv.N * t->conv.K * t->conv.P * t->conv.Q);
}

/* Direct convolution in double, PyTorch's definition. */
static void conv_reference(double *out, const visc_conv2d *c, const float *in, const float *w,
                           const float *b) {
    int cpg = c->C / c->groups, kpg = c->K / c->groups;
    for (int n = 0; n < c->N; n++)
        for (int k = 0; k < c->K; k++)
            for (int p = 0; p < c->P; p++)
                for (int q = 0; q < c->Q; q++) {
                    double s = c->has_bias ? b[k] : 0;
                    int g = k / kpg;
                    for (int ci = 0; ci < cpg; ci++)
                        for (int r = 0; r < c->R; r++)
                            for (int u = 0; u < c->S; u++) {
                                int h = p * c->stride - c->pad + r * c->dilation;
                                int x = q * c->stride - c->pad + u * c->dilation;
                                if (h < 0 || h >= c->H || x < 0 || x >= c->W) continue;
                                int cc = g * cpg + ci;
                                s += (double)in[(((size_t)n * c->C + cc) * c->H + h) * c->W + x] *
                                     w[(((size_t)k * cpg + ci) * c->R + r) * c->S + u];
                            }
                    out[(((size_t)n * c->K + k) * c->P + p) * c->Q + q] = s;
                }
}

static void run_conv_case(const conv_shape *s, uint64_t seed) {
    visc_rng r = visc_rng_make(seed, 0, 0);
    conv_ctx t;
    visc_conv2d *c = &t.conv;
    visc_conv2d_init(c, s->N, s->C, s->H, s->W, s->K, s->R, s->S, s->stride, s->pad, s->dil,
                     s->groups, s->bias);
    int expect_p = (s->H + 2 * s->pad - s->dil * (s->R - 1) - 1) / s->stride + 1;
    CHECK(c->P == expect_p);
    size_t nin = (size_t)s->N * s->C * s->H * s->W, nout = (size_t)s->N * s->K * c->P * c->Q;
    size_t nw = (size_t)s->K * (s->C / s->groups) * s->R * s->S;
    t.in = falloc(nin), t.w = falloc(nw), t.b = falloc(s->K), t.out = falloc(nout),
    t.lw = falloc(nout);
    fill(&r, t.in, nin, -1, 1);
    fill(&r, t.w, nw, -0.5f, 0.5f);
    fill(&r, t.b, s->K, -0.5f, 0.5f);
    fill(&r, t.lw, nout, -1, 1);

    /* forward vs the direct reference */
    double *ref = visc_malloc(nout * sizeof(double), "reference");
    conv_reference(ref, c, t.in, t.w, t.b);
    visc_conv2d_forward(c, t.out, t.in, t.w, s->bias ? t.b : NULL);
    float *reff = falloc(nout);
    for (size_t i = 0; i < nout; i++) reff[i] = (float)ref[i];
    CHECK_ARRAYS("conv forward", t.out, reff, nout, 1e-5, 1e-4);

    /* backward: dout = lw */
    float *din = falloc(nin), *dw = falloc(nw), *db = falloc(s->K);
    float *dw2 = falloc(nw), *db2 = falloc(s->K);
    visc_conv2d_backward(c, din, dw, s->bias ? db : NULL, t.lw, t.in, t.w);
    check_fd("conv d/din", t.in, nin, din, conv_loss, &t, 2e-3, 2e-3);
    check_fd("conv d/dweight", t.w, nw, dw, conv_loss, &t, 2e-3, 2e-3);
    if (s->bias) check_fd("conv d/dbias", t.b, s->K, db, conv_loss, &t, 2e-3, 2e-3);

    /* din == NULL must still give the same parameter gradients */
    visc_conv2d_backward(c, NULL, dw2, s->bias ? db2 : NULL, t.lw, t.in, t.w);
    CHECK(memcmp(dw, dw2, nw * sizeof(float)) == 0);
    if (s->bias) CHECK(memcmp(db, db2, s->K * sizeof(float)) == 0);

    visc_conv2d_destroy(c);
    free(ref), free(reff), free(din), free(dw), free(db), free(dw2), free(db2);
    free(t.in), free(t.w), free(t.b), free(t.out), free(t.lw);
}

/*                                 N  C  H   W  K  R  S st pd dl  g bias */
TEST(conv_3x3_pad_bias) { run_conv_case(&(conv_shape){2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1}, 1); }
TEST(conv_3x3_stride2_nobias) {
    run_conv_case(&(conv_shape){2, 4, 8, 7, 5, 3, 3, 2, 1, 1, 1, 0}, 2);
}
TEST(conv_dilated_grouped) { run_conv_case(&(conv_shape){2, 4, 9, 9, 6, 3, 3, 1, 2, 2, 2, 1}, 3); }
TEST(conv_depthwise_stride2) {
    run_conv_case(&(conv_shape){2, 8, 7, 7, 8, 3, 3, 2, 1, 1, 8, 0}, 4);
}
TEST(conv_1x1_stride2) { run_conv_case(&(conv_shape){2, 6, 7, 7, 5, 1, 1, 2, 0, 1, 1, 0}, 5); }
TEST(conv_7x7_stem) { run_conv_case(&(conv_shape){1, 3, 12, 11, 4, 7, 7, 2, 3, 1, 1, 0}, 6); }
/* Channels at the blocked-layout width (16), where oneDNN's blocked kernels run. */
TEST(conv_blocked_channels) {
    run_conv_case(&(conv_shape){2, 16, 6, 6, 32, 3, 3, 1, 1, 1, 1, 1}, 7);
}
TEST(conv_blocked_1x1) { run_conv_case(&(conv_shape){2, 32, 5, 5, 16, 1, 1, 1, 0, 1, 1, 0}, 8); }
/* A stride-1 1x1 on a large plane runs in plain NCHW (conv2d.c: choose_layout). */
TEST(conv_plain_1x1_large_plane) {
    run_conv_case(&(conv_shape){1, 4, 28, 28, 3, 1, 1, 1, 0, 1, 1, 1}, 9);
}

/* Planes smaller than the kernel (H*W < R*S: ResNet-18's layer3/4 at 32 px)
 * take the dense-matrix path in conv2d.c, which only uses taps that touch
 * real input; padding-only taps must get exactly zero weight gradient. */
TEST(conv_3x3_on_1x1_plane) {
    run_conv_case(&(conv_shape){4, 8, 1, 1, 6, 3, 3, 1, 1, 1, 1, 1}, 10);
}
TEST(conv_3x3_on_2x2_plane) {
    run_conv_case(&(conv_shape){3, 16, 2, 2, 20, 3, 3, 1, 1, 1, 1, 0}, 11);
}
TEST(conv_3x3_stride2_2x2_to_1x1) {
    run_conv_case(&(conv_shape){2, 12, 2, 2, 24, 3, 3, 2, 1, 1, 1, 1}, 12);
}
TEST(conv_dilated_on_2x2_plane) {
    run_conv_case(&(conv_shape){2, 5, 2, 2, 7, 3, 3, 1, 2, 2, 1, 1}, 13);
}
TEST(conv_7x7_on_3x2_plane) {
    run_conv_case(&(conv_shape){2, 3, 3, 2, 4, 7, 7, 2, 3, 1, 1, 0}, 14);
}

/* Every convolution shares one workspace (conv2d.c): a layer's results do
 * not depend on what another left there (NaNs everywhere it reached, in
 * blocked layouts whose channel padding a layer with 5 channels reads
 * past), nor on the workspace growing after the layer was made (its
 * memories point at the new one). Bit for bit. */
typedef struct {
    visc_conv2d c;
    float *in, *w, *out, *dout, *din, *dw;
} conv_run;

static void conv_run_make(conv_run *r, const conv_shape *s, uint64_t seed, float fill_with) {
    visc_conv2d_init(&r->c, s->N, s->C, s->H, s->W, s->K, s->R, s->S, s->stride, s->pad, s->dil,
                     s->groups, 0);
    size_t nin = (size_t)s->N * s->C * s->H * s->W, nw = (size_t)s->K * s->C * s->R * s->S;
    size_t nout = (size_t)s->N * s->K * r->c.P * r->c.Q;
    r->in = falloc(nin), r->w = falloc(nw), r->out = falloc(nout), r->dout = falloc(nout);
    r->din = falloc(nin), r->dw = falloc(nw);
    visc_rng g = visc_rng_make(seed, 0, 0);
    fill(&g, r->in, nin, -1, 1);
    fill(&g, r->w, nw, -0.5f, 0.5f);
    fill(&g, r->dout, nout, -1, 1);
    if (fill_with != 0.0f)
        for (size_t i = 0; i < nin; i++) r->in[i] = r->dout[i % nout] = fill_with;
}

static void conv_run_step(conv_run *r) {
    visc_conv2d_forward(&r->c, r->out, r->in, r->w, NULL);
    visc_conv2d_backward(&r->c, r->din, r->dw, NULL, r->dout, r->in, r->w);
}

static int conv_run_same(const conv_run *r, const float *out, const float *din, const float *dw) {
    const visc_conv2d *c = &r->c;
    size_t nin = (size_t)c->N * c->C * c->H * c->W, nw = (size_t)c->K * c->C * c->R * c->S;
    size_t nout = (size_t)c->N * c->K * c->P * c->Q;
    return !memcmp(out, r->out, nout * 4) && !memcmp(din, r->din, nin * 4) &&
           !memcmp(dw, r->dw, nw * 4);
}

static void conv_run_free(conv_run *r) {
    visc_conv2d_destroy(&r->c);
    free(r->in), free(r->w), free(r->out), free(r->dout), free(r->din), free(r->dw);
}

TEST(conv_layers_share_a_workspace) {
    /*                                        N  C   H   W   K  R  S st pd dl g bias */
    const conv_shape odd = {2, 5, 9, 9, 20, 3, 3, 1, 1, 1, 1, 0};
    const conv_shape big = {2, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 0};
    const conv_shape bigger = {2, 32, 16, 16, 48, 3, 3, 1, 1, 1, 1, 0};
    conv_run a, b, c;
    conv_run_make(&a, &odd, 41, 0.0f);
    size_t nin = (size_t)2 * 5 * 9 * 9, nw = (size_t)20 * 5 * 9, nout = (size_t)2 * 20 * 9 * 9;
    float *out = falloc(nout), *din = falloc(nin), *dw = falloc(nw);
    conv_run_step(&a); /* alone: the workspace is its own */
    memcpy(out, a.out, nout * 4), memcpy(din, a.din, nin * 4), memcpy(dw, a.dw, nw * 4);
    CHECK(isfinite(out[0]) && isfinite(din[0]) && isfinite(dw[0]));

    conv_run_make(&b, &big, 42, NAN); /* grows it: a's memories now point at a freed one */
    conv_run_step(&b);
    conv_run_step(&a);
    CHECK(conv_run_same(&a, out, din, dw));
    conv_run_make(&c, &bigger, 43, NAN); /* grows it again */
    conv_run_step(&c);
    conv_run_step(&b);
    conv_run_step(&a);
    CHECK(conv_run_same(&a, out, din, dw));
    conv_run_free(&c);
    conv_run_free(&b);
    conv_run_step(&a);
    CHECK(conv_run_same(&a, out, din, dw));
    conv_run_free(&a);
    free(out), free(din), free(dw);
}

/* ============================== batchnorm2d ============================= */

typedef struct {
    visc_batchnorm2d bn;
    float *in, *gamma, *beta, *out, *lw, *mean, *rstd, *rm, *rv;
} bn_ctx;

static double bn_loss(void *p) {
    bn_ctx *t = p;
    visc_batchnorm2d_forward_train(&t->bn, t->out, t->mean, t->rstd, t->in, t->gamma, t->beta,
                                   t->rm, t->rv);
    return dot(t->out, t->lw, (size_t)t->bn.N * t->bn.C * t->bn.HW);
}

/* Batch statistics of channel c in double: mean and biased variance. */
static void bn_stats(const float *x, int N, int C, int HW, int c, double *mean, double *var) {
    double s = 0, ss = 0, M = (double)N * HW;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < HW; i++) s += x[((size_t)n * C + c) * HW + i];
    *mean = s / M;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < HW; i++) {
            double d = x[((size_t)n * C + c) * HW + i] - *mean;
            ss += d * d;
        }
    *var = ss / M;
}

/* Moves inputs whose normalized output lies near the ReLU kink away from
 * it, so an FD step of eps cannot cross 0. Returns 1 when all are clear. */
static int push_off_kink(float *x, const float *gamma, const float *beta, int N, int C, int HW,
                         double margin) {
    int clear = 1;
    for (int c = 0; c < C; c++) {
        double mean, var;
        bn_stats(x, N, C, HW, c, &mean, &var);
        double rstd = 1 / sqrt(var + 1e-5);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                float *v = &x[((size_t)n * C + c) * HW + i];
                double y = (*v - mean) * rstd * gamma[c] + beta[c];
                if (fabs(y) < margin) {
                    clear = 0;
                    *v += (float)((y >= 0 ? 3 : -3) * margin / (rstd * gamma[c]));
                }
            }
    }
    return clear;
}

static void run_bn_case(int N, int C, int HW, int relu, uint64_t seed) {
    visc_rng r = visc_rng_make(seed, 0, 0);
    bn_ctx t;
    size_t n = (size_t)N * C * HW;
    visc_batchnorm2d_init(&t.bn, N, C, HW, 1e-5f, 0.1f, relu);
    t.in = falloc(n), t.out = falloc(n), t.lw = falloc(n);
    t.gamma = falloc(C), t.beta = falloc(C), t.mean = falloc(C), t.rstd = falloc(C);
    t.rm = falloc(C), t.rv = falloc(C);
    fill(&r, t.in, n, -2, 3);
    fill(&r, t.gamma, C, 0.5f, 1.5f);
    fill(&r, t.beta, C, -0.5f, 0.5f);
    fill(&r, t.lw, n, -1, 1);
    if (relu) {
        int clear = 0;
        for (int it = 0; it < 20 && !clear; it++)
            clear = push_off_kink(t.in, t.gamma, t.beta, N, C, HW, 0.08);
        CHECK(clear);
    }
    float *din = falloc(n), *dg = falloc(C), *dbt = falloc(C);
    bn_loss(&t);
    visc_batchnorm2d_backward(&t.bn, din, dg, dbt, t.lw, t.in, t.out, t.gamma, t.mean, t.rstd);
    check_fd("bn d/din", t.in, n, din, bn_loss, &t, 2e-3, 1e-2);
    check_fd("bn d/dgamma", t.gamma, C, dg, bn_loss, &t, 2e-3, 1e-2);
    check_fd("bn d/dbeta", t.beta, C, dbt, bn_loss, &t, 2e-3, 1e-2);

    /* din may alias dout */
    float *g = falloc(n), *dg2 = falloc(C), *dbt2 = falloc(C);
    memcpy(g, t.lw, n * sizeof(float));
    bn_loss(&t);
    visc_batchnorm2d_backward(&t.bn, g, dg2, dbt2, g, t.in, t.out, t.gamma, t.mean, t.rstd);
    CHECK(memcmp(g, din, n * sizeof(float)) == 0);
    CHECK(memcmp(dg2, dg, C * sizeof(float)) == 0);

    visc_batchnorm2d_destroy(&t.bn);
    free(din), free(dg), free(dbt), free(g), free(dg2), free(dbt2);
    free(t.in), free(t.out), free(t.lw), free(t.gamma), free(t.beta), free(t.mean), free(t.rstd);
    free(t.rm), free(t.rv);
}

/* HW = 37: the vector lanes and the scalar tail both run. */
TEST(bn_gradients) { run_bn_case(3, 4, 37, 0, 11); }
TEST(bn_relu_gradients) { run_bn_case(3, 4, 37, 1, 12); }
TEST(bn_gradients_small_plane) { run_bn_case(5, 3, 4, 0, 13); }
/* H*W <= 16 runs channel-chunked loops (32 channels a chunk): more than one
 * chunk and a partial last chunk, with and without the fused ReLU. */
TEST(bn_gradients_1x1_plane_many_channels) { run_bn_case(6, 40, 1, 0, 14); }
TEST(bn_relu_gradients_2x2_plane) { run_bn_case(4, 35, 4, 1, 15); }
TEST(bn_gradients_3x3_plane) { run_bn_case(3, 33, 9, 0, 16); }
TEST(bn_relu_gradients_15_plane) { run_bn_case(2, 64, 15, 1, 17); }

/* Forward output, saved statistics and the running-stat update against a
 * direct computation; the input has |mean| >> std to catch cancellation. */
TEST(bn_forward_and_running_stats) {
    const int N = 4, C = 3, HW = 50;
    const float momentum = 0.1f, eps = 1e-5f;
    size_t n = (size_t)N * C * HW;
    visc_rng r = visc_rng_make(21, 0, 0);
    float *x = falloc(n), *out = falloc(n), *want = falloc(n);
    float gamma[3], beta[3], mean[3], rstd[3], rm[3], rv[3], rm0[3], rv0[3];
    fill(&r, x, n, -1, 1);
    for (size_t i = 0; i < n; i++) x[i] += (i / HW) % C == 2 ? 1000.0f : 0.0f; /* channel 2 */
    fill(&r, gamma, C, 0.5f, 1.5f);
    fill(&r, beta, C, -0.5f, 0.5f);
    fill(&r, rm0, C, -1, 1);
    fill(&r, rv0, C, 0.5f, 2);
    memcpy(rm, rm0, sizeof rm);
    memcpy(rv, rv0, sizeof rv);
    for (int relu = 0; relu < 2; relu++) {
        visc_batchnorm2d bn;
        visc_batchnorm2d_init(&bn, N, C, HW, eps, momentum, relu);
        memcpy(rm, rm0, sizeof rm);
        memcpy(rv, rv0, sizeof rv);
        visc_batchnorm2d_forward_train(&bn, out, mean, rstd, x, gamma, beta, rm, rv);
        for (int c = 0; c < C; c++) {
            double m, v, M = (double)N * HW;
            bn_stats(x, N, C, HW, c, &m, &v);
            CHECK_CLOSE(mean[c], m, 1e-6, 1e-6);
            CHECK_CLOSE(rstd[c], 1 / sqrt(v + eps), 0, 1e-4);
            CHECK_CLOSE(rm[c], (1 - momentum) * rm0[c] + momentum * m, 1e-6, 1e-6);
            CHECK_CLOSE(rv[c], (1 - momentum) * rv0[c] + momentum * v * M / (M - 1), 0, 1e-4);
            for (int b = 0; b < N; b++)
                for (int i = 0; i < HW; i++) {
                    size_t k = ((size_t)b * C + c) * HW + i;
                    double y = (x[k] - m) / sqrt(v + eps) * gamma[c] + beta[c];
                    want[k] = (float)(relu && y < 0 ? 0 : y);
                }
        }
        CHECK_ARRAYS("bn train forward", out, want, n, 1e-4, 1e-4);
        visc_batchnorm2d_destroy(&bn);
    }
    free(x), free(out), free(want);
}

/* A SyncBN callback for one process: the sums are already the total. */
static void sync_alone(void *ctx, double *buf, int n) { (void)ctx, (void)buf, (void)n; }

/* visc_batchnorm2d_apply from a training forward's saved statistics gives
 * that forward's output bit for bit (what a ResNet recomputes in backward
 * instead of keeping): the row path, the small-plane chunks (a partial
 * last chunk), with and without the fused ReLU, and after SyncBN's passes. */
static void check_bn_apply(int N, int C, int HW, int relu, int sync, uint64_t seed) {
    const size_t n = (size_t)N * C * HW;
    visc_rng r = visc_rng_make(seed, 0, 0);
    float *x = falloc(n), *out = falloc(n), *again = falloc(n);
    float *gamma = falloc(C), *beta = falloc(C), *mean = falloc(C), *rstd = falloc(C);
    float *rm = falloc(C), *rv = falloc(C);
    fill(&r, x, n, -3, 5);
    fill(&r, gamma, C, -1.5f, 1.5f);
    fill(&r, beta, C, -0.5f, 0.5f);
    fill(&r, rm, C, -1, 1);
    fill(&r, rv, C, 0.5f, 2);
    visc_batchnorm2d bn;
    visc_batchnorm2d_init(&bn, N, C, HW, 1e-5f, 0.1f, relu);
    if (sync) visc_batchnorm2d_set_sync(&bn, sync_alone, NULL);
    visc_batchnorm2d_forward_train(&bn, out, mean, rstd, x, gamma, beta, rm, rv);
    memset(again, 0xff, n * sizeof(float));
    visc_batchnorm2d_apply(&bn, again, x, gamma, beta, mean, rstd);
    CHECK_MSG(memcmp(again, out, n * sizeof(float)) == 0,
              "N %d C %d HW %d relu %d sync %d: the recomputed output differs", N, C, HW, relu,
              sync);
    visc_batchnorm2d_destroy(&bn);
    free(x), free(out), free(again), free(gamma), free(beta), free(mean), free(rstd);
    free(rm), free(rv);
}

TEST(bn_apply_recomputes_the_training_output) {
    check_bn_apply(3, 5, 37, 0, 0, 31);
    check_bn_apply(3, 5, 37, 1, 0, 32);
    check_bn_apply(4, 40, 4, 1, 0, 33); /* small planes: two chunks, the second partial */
    check_bn_apply(6, 33, 1, 0, 0, 34);
    check_bn_apply(2, 7, 56 * 56, 1, 0, 35);
    check_bn_apply(3, 6, 49, 1, 1, 36); /* SyncBN */
}

TEST(bn_eval_uses_running_stats) {
    const int N = 2, C = 5, HW = 20;
    size_t n = (size_t)N * C * HW;
    visc_rng r = visc_rng_make(22, 0, 0);
    float *x = falloc(n), *out = falloc(n), *want = falloc(n);
    float gamma[5], beta[5], rm[5], rv[5];
    fill(&r, x, n, -2, 2);
    fill(&r, gamma, C, 0.5f, 1.5f);
    fill(&r, beta, C, -0.5f, 0.5f);
    fill(&r, rm, C, -1, 1);
    fill(&r, rv, C, 0.5f, 2);
    for (int relu = 0; relu < 2; relu++) {
        visc_batchnorm2d bn;
        visc_batchnorm2d_init(&bn, N, C, HW, 1e-3f, 0.1f, relu);
        visc_batchnorm2d_forward_eval(&bn, out, x, gamma, beta, rm, rv);
        for (size_t k = 0; k < n; k++) {
            int c = (int)(k / HW) % C;
            double y = (x[k] - rm[c]) / sqrt(rv[c] + 1e-3) * gamma[c] + beta[c];
            want[k] = (float)(relu && y < 0 ? 0 : y);
        }
        CHECK_ARRAYS("bn eval forward", out, want, n, 1e-5, 1e-5);
        visc_batchnorm2d_destroy(&bn);
    }
    free(x), free(out), free(want);
}

/* ================================ pool2d ================================ */

typedef struct {
    visc_pool2d pool;
    int max;
    float *in, *out, *lw;
    int32_t *argmax;
} pool_ctx;

static double pool_loss(void *p) {
    pool_ctx *t = p;
    if (t->max) visc_maxpool2d_forward(&t->pool, t->out, t->argmax, t->in);
    else visc_avgpool2d_forward(&t->pool, t->out, t->in);
    return dot(t->out, t->lw, (size_t)t->pool.N * t->pool.C * t->pool.P * t->pool.Q);
}

/* Direct pooling: max over in-bounds taps (first max wins), or the sum
 * over in-bounds taps divided by kernel^2 (padding counted). */
static void pool_reference(float *out, int32_t *argmax, const visc_pool2d *p, const float *in,
                           int max) {
    for (int pl = 0; pl < p->N * p->C; pl++)
        for (int oh = 0; oh < p->P; oh++)
            for (int ow = 0; ow < p->Q; ow++) {
                double s = 0, m = -INFINITY;
                int best = -1;
                for (int i = 0; i < p->kernel; i++)
                    for (int j = 0; j < p->kernel; j++) {
                        int h = oh * p->stride - p->pad + i, w = ow * p->stride - p->pad + j;
                        if (h < 0 || h >= p->H || w < 0 || w >= p->W) continue;
                        double v = in[(size_t)pl * p->H * p->W + h * p->W + w];
                        s += v;
                        if (v > m) m = v, best = h * p->W + w;
                    }
                size_t o = (size_t)pl * p->P * p->Q + oh * p->Q + ow;
                out[o] = (float)(max ? m : s / (p->kernel * p->kernel));
                if (max) argmax[o] = best;
            }
}

static void run_pool_case(int N, int C, int H, int W, int k, int s, int pad, int max,
                          uint64_t seed) {
    pool_ctx t;
    t.max = max;
    visc_pool2d_init(&t.pool, N, C, H, W, k, s, pad);
    CHECK(t.pool.P == (H + 2 * pad - k) / s + 1 && t.pool.Q == (W + 2 * pad - k) / s + 1);
    size_t nin = (size_t)N * C * H * W, nout = (size_t)N * C * t.pool.P * t.pool.Q;
    t.in = falloc(nin), t.out = falloc(nout), t.lw = falloc(nout);
    t.argmax = visc_calloc(nout, sizeof(int32_t), "argmax");
    /* Distinct values 0.05 apart (a shuffled ramp): no near-ties for an FD step to flip. */
    int32_t *perm = visc_malloc(nin * sizeof(int32_t), "perm");
    visc_rng_permutation(perm, (int32_t)nin, seed, 0, 0);
    for (size_t i = 0; i < nin; i++) t.in[i] = 0.05f * (float)perm[i] - 0.025f * (float)nin;
    visc_rng r = visc_rng_make(seed, 1, 0);
    fill(&r, t.lw, nout, -1, 1);

    float *want = falloc(nout);
    int32_t *want_am = visc_calloc(nout, sizeof(int32_t), "argmax");
    pool_reference(want, want_am, &t.pool, t.in, max);
    pool_loss(&t);
    CHECK_ARRAYS(max ? "maxpool forward" : "avgpool forward", t.out, want, nout, 1e-6, 1e-6);
    if (max) CHECK(memcmp(t.argmax, want_am, nout * sizeof(int32_t)) == 0);

    float *din = falloc(nin);
    if (max) visc_maxpool2d_backward(&t.pool, din, t.lw, t.argmax);
    else visc_avgpool2d_backward(&t.pool, din, t.lw);
    /* values reach ~|0.025 nin|: allow for their float rounding in the FD */
    check_fd(max ? "maxpool d/din" : "avgpool d/din", t.in, nin, din, pool_loss, &t, 2e-3, 2e-3);

    visc_pool2d_destroy(&t.pool);
    free(t.in), free(t.out), free(t.lw), free(t.argmax), free(perm), free(want), free(want_am),
        free(din);
}

TEST(maxpool_resnet_3x3_s2_p1) { run_pool_case(2, 3, 9, 8, 3, 2, 1, 1, 31); }
TEST(maxpool_2x2_s2) { run_pool_case(2, 2, 7, 6, 2, 2, 0, 1, 32); }
TEST(avgpool_3x3_s2_p1) { run_pool_case(2, 3, 9, 8, 3, 2, 1, 0, 33); }
TEST(avgpool_2x2_s2) { run_pool_case(1, 2, 6, 7, 2, 2, 0, 0, 34); }

/* Ties: torch keeps the first maximum of the window (in row-major order). */
TEST(maxpool_ties_pick_first) {
    visc_pool2d p;
    visc_pool2d_init(&p, 1, 1, 4, 4, 3, 2, 1);
    float in[16], out[4], din[16], dout[4] = {1, 2, 3, 4};
    int32_t am[4];
    for (int i = 0; i < 16; i++) in[i] = 1.0f;
    visc_maxpool2d_forward(&p, out, am, in);
    /* windows start at (-1,-1), (-1,1), (1,-1), (1,1): first in-bounds taps */
    CHECK(am[0] == 0 && am[1] == 1 && am[2] == 4 && am[3] == 5);
    visc_maxpool2d_backward(&p, din, dout, am);
    CHECK(din[0] == 1 && din[1] == 2 && din[4] == 3 && din[5] == 4 && din[2] == 0);
    visc_pool2d_destroy(&p);
}

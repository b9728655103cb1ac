/* test_layers.c: the non-oneDNN layers (linear, eltwise, dropout, loss,
 * global pooling) against finite differences and hand-computed cases.
 *
 * Gradient checks use L = sum(g * f(x)) for a fixed random upstream g, so
 * dL/dx is exactly what backward(g) returns; central differences of L are
 * taken in fp32 forward passes and summed in double. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/nn.h"
#include "visc/rng.h"

static void fill_uniform(float *x, size_t n, float lo, float hi, uint64_t sub) {
    visc_rng r = visc_rng_make(1234, VISC_STREAM_INIT, sub);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * visc_rng_uniform(&r);
}

static double dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* ---- linear ---- */

enum { LN = 3, LI = 5, LO = 4 };

static double linear_loss(const float *x, const float *w, const float *b, const float *g) {
    float out[LN * LO];
    visc_linear_forward(out, x, w, b, LN, LI, LO);
    return dot(out, g, LN * LO);
}

TEST(linear_forward_matches_naive) {
    float x[LN * LI], w[LO * LI], b[LO], out[LN * LO], want[LN * LO];
    fill_uniform(x, LN * LI, -1, 1, 1);
    fill_uniform(w, LO * LI, -1, 1, 2);
    fill_uniform(b, LO, -1, 1, 3);
    for (int n = 0; n < LN; n++)
        for (int o = 0; o < LO; o++) {
            double s = b[o];
            for (int i = 0; i < LI; i++) s += (double)x[n * LI + i] * w[o * LI + i];
            want[n * LO + o] = (float)s;
        }
    visc_linear_forward(out, x, w, b, LN, LI, LO);
    CHECK_ARRAYS("linear out", out, want, LN * LO, 1e-6, 1e-5);
    /* Without bias: the same minus b (the output buffer starts as garbage). */
    for (int i = 0; i < LN * LO; i++) out[i] = 1e30f;
    visc_linear_forward(out, x, w, NULL, LN, LI, LO);
    for (int n = 0; n < LN; n++)
        for (int o = 0; o < LO; o++) want[n * LO + o] -= b[o];
    CHECK_ARRAYS("linear out (no bias)", out, want, LN * LO, 1e-6, 1e-5);
}

TEST(linear_backward_finite_differences) {
    float x[LN * LI], w[LO * LI], b[LO], g[LN * LO];
    float dx[LN * LI], dw[LO * LI], db[LO], num[LN * LI + LO * LI + LO];
    fill_uniform(x, LN * LI, -1, 1, 4);
    fill_uniform(w, LO * LI, -1, 1, 5);
    fill_uniform(b, LO, -1, 1, 6);
    fill_uniform(g, LN * LO, -1, 1, 7);
    memset(dx, 0xff, sizeof dx); /* backward must overwrite, not accumulate */
    memset(dw, 0xff, sizeof dw);
    memset(db, 0xff, sizeof db);
    visc_linear_backward(dx, dw, db, g, x, w, LN, LI, LO);
    const float eps =
        1e-2f; /* L is linear in each variable: differences are exact up to rounding */
    float *vars[3] = {x, w, b};
    int counts[3] = {LN * LI, LO * LI, LO}, k = 0;
    for (int v = 0; v < 3; v++)
        for (int i = 0; i < counts[v]; i++) {
            float keep = vars[v][i];
            vars[v][i] = keep + eps;
            double lp = linear_loss(x, w, b, g);
            vars[v][i] = keep - eps;
            double lm = linear_loss(x, w, b, g);
            vars[v][i] = keep;
            num[k++] = (float)((lp - lm) / (2 * eps));
        }
    CHECK_ARRAYS("dx", dx, num, LN * LI, 1e-4, 1e-3);
    CHECK_ARRAYS("dw", dw, num + LN * LI, LO * LI, 1e-4, 1e-3);
    CHECK_ARRAYS("db", db, num + LN * LI + LO * LI, LO, 1e-4, 1e-3);
    /* NULL din and NULL dbias are allowed and leave the rest unchanged. */
    float dw2[LO * LI];
    visc_linear_backward(NULL, dw2, NULL, g, x, w, LN, LI, LO);
    CHECK_ARRAYS("dw (no din)", dw2, dw, LO * LI, 0, 0);
}

TEST(linear_large_uses_threads_consistently) {
    /* A size where sgemm and the bias loop go parallel; compare with a naive loop. */
    const int N = 64, I = 96, O = 80;
    float *x = malloc(sizeof(float) * N * I), *w = malloc(sizeof(float) * O * I);
    float *g = malloc(sizeof(float) * N * O), *dw = malloc(sizeof(float) * O * I);
    float *db = malloc(sizeof(float) * O), *dx = malloc(sizeof(float) * N * I);
    float *want = malloc(sizeof(float) * O * I);
    fill_uniform(x, (size_t)N * I, -1, 1, 8);
    fill_uniform(w, (size_t)O * I, -1, 1, 9);
    fill_uniform(g, (size_t)N * O, -1, 1, 10);
    visc_linear_backward(dx, dw, db, g, x, w, N, I, O);
    for (int o = 0; o < O; o++)
        for (int i = 0; i < I; i++) {
            double s = 0;
            for (int n = 0; n < N; n++) s += (double)g[n * O + o] * x[n * I + i];
            want[o * I + i] = (float)s;
        }
    CHECK_ARRAYS("dw", dw, want, (size_t)O * I, 1e-4, 1e-4);
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            double s = 0;
            for (int o = 0; o < O; o++) s += (double)g[n * O + o] * w[o * I + i];
            want[n * I + i] = (float)s;
        }
    CHECK_ARRAYS("dx", dx, want, (size_t)N * I, 1e-4, 1e-4);
    for (int o = 0; o < O; o++) {
        double s = 0;
        for (int n = 0; n < N; n++) s += g[n * O + o];
        want[o] = (float)s;
    }
    CHECK_ARRAYS("db", db, want, O, 1e-4, 1e-4);
    free(x), free(w), free(g), free(dw), free(db), free(dx), free(want);
}

/* ---- loss ---- */

enum { XN = 4, XK = 7 };

static double xent(const float *logits, const int32_t *labels, float s) {
    float probs[XN * XK];
    return visc_softmax_xent_forward(probs, logits, labels, XN, XK, s);
}

static void check_xent(float s) {
    float logits[XN * XK], probs[XN * XK], d[XN * XK], num[XN * XK];
    int32_t labels[XN] = {0, 6, 3, 3};
    fill_uniform(logits, XN * XK, -3, 3, 11);
    float loss = visc_softmax_xent_forward(probs, logits, labels, XN, XK, s);
    /* Direct formula in double: mean over n of -sum_k t_k log softmax_k. */
    double want = 0;
    for (int n = 0; n < XN; n++) {
        double z = 0;
        for (int k = 0; k < XK; k++) z += exp(logits[n * XK + k]);
        for (int k = 0; k < XK; k++) {
            double t = s / XK + (k == labels[n] ? 1.0 - s : 0.0);
            want -= t * (logits[n * XK + k] - log(z));
            CHECK_CLOSE(probs[n * XK + k], exp(logits[n * XK + k]) / z, 1e-7, 1e-5);
        }
    }
    CHECK_CLOSE(loss, want / XN, 1e-6, 1e-5);
    memset(d, 0xff, sizeof d);
    visc_softmax_xent_backward(d, probs, labels, XN, XK, s);
    const float eps = 1e-2f;
    for (int i = 0; i < XN * XK; i++) {
        float keep = logits[i];
        logits[i] = keep + eps;
        double lp = xent(logits, labels, s);
        logits[i] = keep - eps;
        double lm = xent(logits, labels, s);
        logits[i] = keep;
        num[i] = (float)((lp - lm) / (2 * eps));
    }
    /* Central differences have O(eps^2) truncation error (~1e-5 here) plus
     * fp32 rounding of the loss divided by 2 eps (~1e-5). */
    CHECK_ARRAYS("dlogits", d, num, XN * XK, 1e-4, 1e-3);
    /* Each row of the gradient sums to zero (probabilities and targets both sum to 1). */
    for (int n = 0; n < XN; n++) {
        double r = 0;
        for (int k = 0; k < XK; k++) r += d[n * XK + k];
        CHECK_CLOSE(r, 0.0, 1e-6, 0);
    }
}

TEST(xent_no_smoothing) { check_xent(0.0f); }
TEST(xent_label_smoothing) { check_xent(0.1f); }

TEST(xent_is_stable_for_huge_logits) {
    /* exp(1000) overflows fp32 and double: only max-shifted log-sum-exp survives. */
    float logits[2 * 3] = {1000, 0, -1000, -1000, 999, 1000}, probs[6], d[6];
    int32_t labels[2] = {0, 1};
    float loss = visc_softmax_xent_forward(probs, logits, labels, 2, 3, 0.0f);
    /* Sample 0: loss ~ 0. Sample 1: lse = 1000 + log(1 + e^-1), loss = 1 + log(1 + e^-1). */
    CHECK_CLOSE(loss, 0.5 * (1.0 + log1p(exp(-1.0))), 1e-5, 1e-5);
    visc_softmax_xent_backward(d, probs, labels, 2, 3, 0.0f);
    for (int i = 0; i < 6; i++) CHECK(isfinite(d[i]));
    /* With smoothing the loss is dominated by the -(s/K) * x_k terms: finite and large. */
    loss = visc_softmax_xent_forward(probs, logits, labels, 2, 3, 0.1f);
    CHECK(isfinite(loss) && loss > 10);
}

/* ---- top-k accuracy ---- */

TEST(topk_hand_made) {
    /* K = 7 classes, 5 samples. */
    const float logits[5 * 7] = {
        0.1f, 0.9f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, /* label 1: top-1 */
        0.1f, 0.9f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, /* label 3: rank 4 -> top-5, not top-1 */
        0.1f, 0.9f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, /* label 2: rank 5 -> neither */
        0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, /* all tied, label 0: lowest index wins top-1 */
        0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, /* all tied, label 5: 5 lower indices beat it */
    };
    int32_t labels[5] = {1, 3, 2, 0, 5};
    int t1 = -1, t5 = -1;
    visc_topk_correct(logits, labels, 5, 7, &t1, &t5);
    CHECK(t1 == 2); /* samples 0, 3 */
    CHECK(t5 == 3); /* samples 0, 1, 3 */
    /* One sample at a time, to pin each verdict. */
    int want1[5] = {1, 0, 0, 1, 0}, want5[5] = {1, 1, 0, 1, 0};
    for (int n = 0; n < 5; n++) {
        visc_topk_correct(logits + n * 7, labels + n, 1, 7, &t1, &t5);
        CHECK_MSG(t1 == want1[n] && t5 == want5[n], "sample %d: top1 %d top5 %d", n, t1, t5);
    }
    /* Tie at rank 4/5 boundary: label 4 ties with index 3 (lower index wins, label ranks
     * after it). Values: index 0..3 = 1.0, 4 = 1.0, 5 = 0 -> label 4 has rank 4: top-5. */
    const float tie[6] = {1, 1, 1, 1, 1, 0};
    int32_t l4 = 4, l5 = 5;
    visc_topk_correct(tie, &l4, 1, 6, &t1, &t5);
    CHECK(t1 == 0 && t5 == 1);
    visc_topk_correct(tie, &l5, 1, 6, &t1, &t5);
    CHECK(t1 == 0 && t5 == 0);
}

TEST(topk_fewer_than_five_classes) {
    /* K = 3: top-5 means top-3, so every valid label counts. */
    const float logits[2 * 3] = {3, 2, 1, 0, 0, 5};
    int32_t labels[2] = {2, 0};
    int t1, t5;
    visc_topk_correct(logits, labels, 2, 3, &t1, &t5);
    CHECK(t1 == 0 && t5 == 2);
    /* K = 1: always correct. */
    const float one[1] = {-4};
    int32_t l0 = 0;
    visc_topk_correct(one, &l0, 1, 1, &t1, &t5);
    CHECK(t1 == 1 && t5 == 1);
}

/* ---- global average pool ---- */

TEST(global_avgpool_forward_backward) {
    enum { N = 2, C = 3, HW = 5 };
    float x[N * C * HW], out[N * C], g[N * C], dx[N * C * HW], num[N * C * HW];
    fill_uniform(x, N * C * HW, -2, 2, 12);
    fill_uniform(g, N * C, -1, 1, 13);
    visc_global_avgpool_forward(out, x, N, C, HW);
    for (int nc = 0; nc < N * C; nc++) {
        double s = 0;
        for (int i = 0; i < HW; i++) s += x[nc * HW + i];
        CHECK_CLOSE(out[nc], s / HW, 1e-6, 1e-6);
    }
    visc_global_avgpool_backward(dx, g, N, C, HW);
    const float eps = 1e-2f;
    for (int i = 0; i < N * C * HW; i++) {
        float keep = x[i];
        x[i] = keep + eps;
        visc_global_avgpool_forward(out, x, N, C, HW);
        double lp = dot(out, g, N * C);
        x[i] = keep - eps;
        visc_global_avgpool_forward(out, x, N, C, HW);
        double lm = dot(out, g, N * C);
        x[i] = keep;
        num[i] = (float)((lp - lm) / (2 * eps));
    }
    CHECK_ARRAYS("dx", dx, num, N * C * HW, 1e-4, 1e-3);
}

/* ---- relu and add ---- */

TEST(relu_forward_backward) {
    enum { n = 64 };
    float x[n], y[n], g[n], dx[n], num[n];
    fill_uniform(x, n, -1, 1, 14);
    fill_uniform(g, n, -1, 1, 15);
    /* Keep every input away from the kink so central differences are valid. */
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) < 0.05f) x[i] = x[i] < 0 ? -0.05f : 0.05f;
    visc_relu_forward(y, x, n);
    for (int i = 0; i < n; i++) CHECK(y[i] == (x[i] > 0 ? x[i] : 0.0f));
    visc_relu_backward(dx, g, y, n);
    const float eps = 1e-2f;
    for (int i = 0; i < n; i++) {
        float keep = x[i], o;
        x[i] = keep + eps;
        visc_relu_forward(&o, &x[i], 1);
        double lp = (double)o * g[i];
        x[i] = keep - eps;
        visc_relu_forward(&o, &x[i], 1);
        double lm = (double)o * g[i];
        x[i] = keep;
        num[i] = (float)((lp - lm) / (2 * eps));
    }
    CHECK_ARRAYS("relu dx", dx, num, n, 1e-5, 1e-4);
    /* In place, as the models use it: din aliases dout. */
    memcpy(dx, g, sizeof g);
    visc_relu_backward(dx, dx, y, n);
    CHECK_ARRAYS("relu dx in place", dx, num, n, 1e-5, 1e-4);
    /* Exactly zero has zero gradient (torch's threshold_backward), NaN stays NaN. */
    float z = 0.0f, one = 1.0f, d;
    visc_relu_backward(&d, &one, &z, 1);
    CHECK(d == 0.0f);
    float nan_in = NAN, nan_out;
    visc_relu_forward(&nan_out, &nan_in, 1);
    CHECK(isnan(nan_out));
}

TEST(add_and_add_inplace) {
    enum { n = 100003 }; /* big enough to run threaded, odd to exercise the tail */
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    float *out = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    fill_uniform(a, n, -1, 1, 16);
    fill_uniform(b, n, -1, 1, 17);
    for (int i = 0; i < n; i++) want[i] = a[i] + b[i];
    visc_add_forward(out, a, b, n);
    CHECK_ARRAYS("add", out, want, n, 0, 0);
    visc_add_forward(a, a, b, n); /* out aliases a */
    CHECK_ARRAYS("add aliased", a, want, n, 0, 0);
    fill_uniform(a, n, -1, 1, 16);
    visc_add_inplace(a, b, n);
    CHECK_ARRAYS("add_inplace", a, want, n, 0, 0);
    /* two gradient paths joined through a ReLU: the sum where the ReLU's
     * output is positive (0 at an output of exactly 0), aliased either way */
    float *relu_out = malloc(sizeof(float) * n);
    fill_uniform(relu_out, n, -1, 1, 18);
    for (int i = 0; i < n; i += 7) relu_out[i] = 0.0f;
    fill_uniform(a, n, -1, 1, 16);
    for (int i = 0; i < n; i++) want[i] = relu_out[i] > 0.0f ? a[i] + b[i] : 0.0f;
    visc_add_relu_backward(out, a, b, relu_out, n);
    CHECK_ARRAYS("add_relu_backward", out, want, n, 0, 0);
    visc_add_relu_backward(b, a, b, relu_out, n); /* din aliases b */
    CHECK_ARRAYS("add_relu_backward aliased", b, want, n, 0, 0);
    free(a), free(b), free(out), free(want), free(relu_out);
}

/* ---- dropout ---- */

TEST(dropout_mask_reproducible_and_offset_consistent) {
    enum { n = 50001 };
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    uint8_t *m1 = malloc(n), *m2 = malloc(n), *m3 = malloc(n);
    fill_uniform(x, n, -1, 1, 18);
    visc_dropout_forward(y, m1, x, n, 0.3f, 99, 1000);
    visc_dropout_forward(y, m2, x, n, 0.3f, 99, 1000);
    CHECK(memcmp(m1, m2, n) == 0);
    /* The same mask whatever the thread count. */
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    visc_dropout_forward(y, m2, x, n, 0.3f, 99, 1000);
    omp_set_num_threads(threads > 1 ? threads : 2);
    visc_dropout_forward(y, m3, x, n, 0.3f, 99, 1000);
    omp_set_num_threads(threads);
    CHECK(memcmp(m1, m2, n) == 0 && memcmp(m1, m3, n) == 0);
    /* Element i depends on offset + i only: a call split at an unaligned point
     * (offset 1000 + 7 is not a multiple of the 4-word Philox block) agrees. */
    visc_dropout_forward(y, m2, x, 7, 0.3f, 99, 1000);
    visc_dropout_forward(y + 7, m2 + 7, x + 7, n - 7, 0.3f, 99, 1007);
    CHECK(memcmp(m1, m2, n) == 0);
    /* Another seed or offset gives another mask. */
    visc_dropout_forward(y, m2, x, n, 0.3f, 100, 1000);
    visc_dropout_forward(y, m3, x, n, 0.3f, 99, 1001);
    size_t same2 = 0, same3 = 0;
    for (int i = 0; i < n; i++) same2 += m1[i] == m2[i], same3 += m1[i] == m3[i];
    /* Independent masks with keep rate 0.7 agree on 0.7^2 + 0.3^2 = 58% of elements. */
    CHECK(same2 < 0.62 * n && same3 < 0.62 * n);
    free(x), free(y), free(m1), free(m2), free(m3);
}

TEST(dropout_keep_rate_and_scaling) {
    enum { n = 1000000 };
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    float *g = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    uint8_t *m = malloc(n);
    fill_uniform(x, n, 0.5f, 1.5f, 19);
    fill_uniform(g, n, -1, 1, 20);
    const float ps[3] = {0.1f, 0.5f, 0.9f};
    for (int t = 0; t < 3; t++) {
        float p = ps[t], scale = 1.0f / (1.0f - p);
        visc_dropout_forward(y, m, x, n, p, 5, 0);
        visc_dropout_backward(dx, g, m, n, p);
        size_t kept = 0, bad = 0;
        for (int i = 0; i < n; i++) {
            kept += m[i];
            bad += m[i] > 1;
            bad += m[i] ? (y[i] != x[i] * scale || dx[i] != g[i] * scale)
                        : (y[i] != 0.0f || dx[i] != 0.0f);
        }
        CHECK_MSG(bad == 0, "p=%g: %zu elements wrongly scaled", p, bad);
        /* Binomial std of the keep rate: sqrt(p (1 - p) / n) <= 5e-4; allow 6 sigma. */
        CHECK_CLOSE((double)kept / n, 1.0 - p, 3e-3, 0);
    }
    /* p = 0 keeps everything unchanged. */
    visc_dropout_forward(y, m, x, n, 0.0f, 5, 0);
    CHECK_ARRAYS("p=0", y, x, n, 0, 0);
    free(x), free(y), free(g), free(dx), free(m);
}

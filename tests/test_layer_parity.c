/* test_layer_parity.c: every layer against PyTorch on the same inputs.
 *
 * tests/golden/layers.safetensors is written by tools/gen_golden.py: fixed
 * random inputs, an upstream gradient, and torch's forward outputs and
 * input/parameter gradients (computed in float64, stored as float32). Each
 * case's shape and hyperparameters come from its "<case>.config" tensor, so
 * the file is the single source of truth.
 *
 * Tolerance: atol 1e-5, rtol 1e-4 everywhere. Values are O(1) and every
 * output is a sum of at most a few hundred products, whose fp32 rounding is
 * ~1e-6; anything above 1e-5 is a semantic difference, not rounding. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/io.h"
#include "visc/nn.h"

#define ATOL 1e-5
#define RTOL 1e-4

#define GOLDEN "layers.safetensors"

/* Reads "<pre>config" (stored as int32) into ints; returns 0 on failure. */
static int load_config(const char *pre, int *cfg, int n) {
    char name[64];
    snprintf(name, sizeof name, "%sconfig", pre);
    if (visc_golden_numel(GOLDEN, name) != (size_t)n) {
        CHECK_MSG(0, "golden tensor %s missing or not %d elements", name, n);
        return 0;
    }
    float *f = visc_golden_load(GOLDEN, name, (size_t)n);
    for (int i = 0; i < n; i++) cfg[i] = (int)f[i];
    free(f);
    return 1;
}

static float *loadp(const char *pre, const char *what, size_t numel) {
    char name[64];
    snprintf(name, sizeof name, "%s%s", pre, what);
    return visc_golden_load(GOLDEN, name, numel);
}

static void check(const char *pre, const char *what, const float *got, const float *want,
                  size_t n) {
    char label[64];
    snprintf(label, sizeof label, "%s%s", pre, what);
    CHECK_ARRAYS(label, got, want, n, ATOL, RTOL);
}

TEST(golden_file_opens) { CHECK(visc_golden_file(GOLDEN) != NULL); }

TEST(conv2d_parity) {
    int cases = 0;
    for (int ci = 0;; ci++) {
        char pre[32];
        snprintf(pre, sizeof pre, "conv%d.", ci);
        char cname[48];
        snprintf(cname, sizeof cname, "%sconfig", pre);
        if (!visc_golden_numel(GOLDEN, cname)) break;
        int k[11];
        if (!load_config(pre, k, 11)) break;
        int N = k[0], C = k[1], H = k[2], W = k[3], K = k[4], R = k[5], s = k[6], p = k[7],
            d = k[8], g = k[9], b = k[10];
        visc_conv2d c;
        visc_conv2d_init(&c, N, C, H, W, K, R, R, s, p, d, g, b);
        size_t nx = (size_t)N * C * H * W, nw = (size_t)K * (C / g) * R * R;
        size_t ny = (size_t)N * K * c.P * c.Q;
        CHECK_MSG(visc_golden_numel(GOLDEN, strcat(strcpy(cname, pre), "y")) == ny,
                  "%s output shape differs", pre);
        float *x = loadp(pre, "x", nx), *w = loadp(pre, "weight", nw), *dy = loadp(pre, "dy", ny);
        float *bias = b ? loadp(pre, "bias", (size_t)K) : NULL;
        float *y = malloc(ny * sizeof(float)), *dx = malloc(nx * sizeof(float));
        float *dw = malloc(nw * sizeof(float)), *db = malloc((size_t)K * sizeof(float));
        float *want_y = loadp(pre, "y", ny), *want_dx = loadp(pre, "dx", nx);
        float *want_dw = loadp(pre, "dweight", nw);
        /* Run twice: the second call reuses the cached primitives and must agree. */
        for (int rep = 0; rep < 2; rep++) {
            visc_conv2d_forward(&c, y, x, w, bias);
            visc_conv2d_backward(&c, dx, dw, db, dy, x, w);
            check(pre, "y", y, want_y, ny);
            check(pre, "dx", dx, want_dx, nx);
            check(pre, "dweight", dw, want_dw, nw);
            if (b) {
                float *want_db = loadp(pre, "dbias", (size_t)K);
                check(pre, "dbias", db, want_db, (size_t)K);
                free(want_db);
            }
        }
        /* din = NULL (a first layer) still gives the weight gradient. */
        visc_conv2d_backward(&c, NULL, dw, db, dy, x, w);
        check(pre, "dweight (no din)", dw, want_dw, nw);
        visc_conv2d_destroy(&c);
        free(x), free(w), free(dy), free(bias), free(y), free(dx), free(dw), free(db);
        free(want_y), free(want_dx), free(want_dw);
        cases++;
    }
    CHECK_MSG(cases == 8, "ran %d conv cases, the golden file has 8", cases);
}

static void bn_case(const char *pre) {
    int k[5];
    if (!load_config(pre, k, 5)) return;
    int N = k[0], C = k[1], HW = k[2] * k[3], relu = k[4];
    size_t n = (size_t)N * C * HW;
    visc_batchnorm2d b;
    visc_batchnorm2d_init(&b, N, C, HW, 1e-5f, 0.1f, relu);
    float *x = loadp(pre, "x", n), *gamma = loadp(pre, "gamma", C), *beta = loadp(pre, "beta", C);
    float *rm = loadp(pre, "running_mean", C), *rv = loadp(pre, "running_var", C);
    float *rm0 = loadp(pre, "running_mean", C), *rv0 = loadp(pre, "running_var", C);
    float *dy = loadp(pre, "dy", n), *y = malloc(n * sizeof(float)),
          *dx = malloc(n * sizeof(float));
    float *mean = malloc(C * sizeof(float)), *rstd = malloc(C * sizeof(float));
    float *dg = malloc(C * sizeof(float)), *dbt = malloc(C * sizeof(float));
    float *want;

    visc_batchnorm2d_forward_train(&b, y, mean, rstd, x, gamma, beta, rm, rv);
    check(pre, "y", y, want = loadp(pre, "y", n), n), free(want);
    check(pre, "running_mean_after", rm, want = loadp(pre, "running_mean_after", C), C), free(want);
    check(pre, "running_var_after", rv, want = loadp(pre, "running_var_after", C), C), free(want);
    visc_batchnorm2d_backward(&b, dx, dg, dbt, dy, x, y, gamma, mean, rstd);
    check(pre, "dx", dx, want = loadp(pre, "dx", n), n), free(want);
    check(pre, "dgamma", dg, want = loadp(pre, "dgamma", C), C), free(want);
    check(pre, "dbeta", dbt, want = loadp(pre, "dbeta", C), C), free(want);
    /* din may alias dout. */
    memcpy(dx, dy, n * sizeof(float));
    visc_batchnorm2d_backward(&b, dx, dg, dbt, dx, x, y, gamma, mean, rstd);
    check(pre, "dx (in place)", dx, want = loadp(pre, "dx", n), n), free(want);
    /* Eval mode uses the running statistics as they were before the update. */
    visc_batchnorm2d_forward_eval(&b, y, x, gamma, beta, rm0, rv0);
    check(pre, "y_eval", y, want = loadp(pre, "y_eval", n), n), free(want);
    visc_batchnorm2d_destroy(&b);
    free(x), free(gamma), free(beta), free(rm), free(rv), free(rm0), free(rv0), free(dy), free(y);
    free(dx), free(mean), free(rstd), free(dg), free(dbt);
}

TEST(batchnorm2d_parity) { bn_case("bn."); }
TEST(batchnorm2d_relu_parity) { bn_case("bnrelu."); }

TEST(pool2d_parity) {
    int cases = 0;
    for (int pi = 0;; pi++) {
        char pre[32], cname[48];
        snprintf(pre, sizeof pre, "pool%d.", pi);
        snprintf(cname, sizeof cname, "%sconfig", pre);
        if (!visc_golden_numel(GOLDEN, cname)) break;
        int k[8];
        if (!load_config(pre, k, 8)) break;
        int is_max = k[0], N = k[1], C = k[2], H = k[3], W = k[4], ks = k[5], s = k[6], p = k[7];
        visc_pool2d pl;
        visc_pool2d_init(&pl, N, C, H, W, ks, s, p);
        size_t nx = (size_t)N * C * H * W, ny = (size_t)N * C * pl.P * pl.Q;
        CHECK_MSG(visc_golden_numel(GOLDEN, strcat(strcpy(cname, pre), "y")) == ny,
                  "%s output shape differs", pre);
        float *x = loadp(pre, "x", nx), *dy = loadp(pre, "dy", ny);
        float *want_y = loadp(pre, "y", ny), *want_dx = loadp(pre, "dx", nx);
        float *y = malloc(ny * sizeof(float)), *dx = malloc(nx * sizeof(float));
        int32_t *am = malloc(ny * sizeof(int32_t));
        if (is_max) {
            visc_maxpool2d_forward(&pl, y, am, x);
            visc_maxpool2d_backward(&pl, dx, dy, am);
        } else {
            visc_avgpool2d_forward(&pl, y, x);
            visc_avgpool2d_backward(&pl, dx, dy);
        }
        check(pre, "y", y, want_y, ny);
        check(pre, "dx", dx, want_dx, nx);
        visc_pool2d_destroy(&pl);
        free(x), free(dy), free(want_y), free(want_dx), free(y), free(dx), free(am);
        cases++;
    }
    CHECK_MSG(cases == 4, "ran %d pooling cases, the golden file has 4", cases);
}

TEST(global_avgpool_parity) {
    enum { N = 3, C = 8, HW = 25 };
    float *x = visc_golden_load(GOLDEN, "gap.x", N * C * HW),
          *dy = visc_golden_load(GOLDEN, "gap.dy", N * C);
    float y[N * C], *dx = malloc(N * C * HW * sizeof(float)), *want;
    visc_global_avgpool_forward(y, x, N, C, HW);
    visc_global_avgpool_backward(dx, dy, N, C, HW);
    check("gap.", "y", y, want = visc_golden_load(GOLDEN, "gap.y", N * C), N * C), free(want);
    check("gap.", "dx", dx, want = visc_golden_load(GOLDEN, "gap.dx", N * C * HW), N * C * HW),
        free(want);
    free(x), free(dy), free(dx);
}

TEST(linear_parity) {
    enum { N = 4, I = 12, O = 5 };
    float *x = visc_golden_load(GOLDEN, "linear.x", N * I),
          *w = visc_golden_load(GOLDEN, "linear.weight", O * I);
    float *b = visc_golden_load(GOLDEN, "linear.bias", O),
          *dy = visc_golden_load(GOLDEN, "linear.dy", N * O), *want;
    float y[N * O], dx[N * I], dw[O * I], db[O];
    visc_linear_forward(y, x, w, b, N, I, O);
    visc_linear_backward(dx, dw, db, dy, x, w, N, I, O);
    check("linear.", "y", y, want = visc_golden_load(GOLDEN, "linear.y", N * O), N * O), free(want);
    check("linear.", "dx", dx, want = visc_golden_load(GOLDEN, "linear.dx", N * I), N * I),
        free(want);
    check("linear.", "dweight", dw, want = visc_golden_load(GOLDEN, "linear.dweight", O * I),
          O * I),
        free(want);
    check("linear.", "dbias", db, want = visc_golden_load(GOLDEN, "linear.dbias", O), O),
        free(want);
    free(x), free(w), free(b), free(dy);
}

TEST(softmax_xent_parity) {
    enum { N = 6, K = 10 };
    float *logits = visc_golden_load(GOLDEN, "xent.logits", N * K),
          *lf = visc_golden_load(GOLDEN, "xent.labels", N);
    int32_t labels[N];
    for (int i = 0; i < N; i++) labels[i] = (int32_t)lf[i];
    const char *tags[2] = {"s0", "s01"};
    const float smoothing[2] = {0.0f, 0.1f};
    for (int t = 0; t < 2; t++) {
        char name[64];
        float probs[N * K], d[N * K];
        float loss = visc_softmax_xent_forward(probs, logits, labels, N, K, smoothing[t]);
        visc_softmax_xent_backward(d, probs, labels, N, K, smoothing[t]);
        snprintf(name, sizeof name, "xent.%s.loss", tags[t]);
        float *want = visc_golden_load(GOLDEN, name, 1);
        CHECK_CLOSE(loss, want[0], ATOL, RTOL);
        free(want);
        snprintf(name, sizeof name, "xent.%s.dlogits", tags[t]);
        CHECK_ARRAYS(name, d, want = visc_golden_load(GOLDEN, name, N * K), N * K, ATOL, RTOL);
        free(want);
    }
    free(logits), free(lf);
}

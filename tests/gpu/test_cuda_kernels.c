/* test_cuda_kernels.c: every CUDA kernel (include/visc/cuda.h) against its
 * CPU twin in the engine, on the same random inputs, forward and backward.
 *
 * Prints one "ok NAME (worst ...)" or "FAIL NAME: ..." line per check and
 * closes with "N passed, N failed"; exits 1 on any failure. Without a
 * usable GPU it prints one line saying why and exits 77 (`make test-gpu`
 * reports that as skipped).
 *
 * Tolerances, per element, |gpu - cpu| <= atol + rtol |cpu|:
 *   fp32 kernels       rtol 1e-5, atol 1e-5 x the tensor's largest |value|
 *                      (softmax cross-entropy with labels or soft targets)
 *                      (the two sides add in different orders); column sums
 *                      over many rows atol 1e-5 x the sum of |terms|
 *   layer norm's row means: as column sums (their terms cancel)
 *   GELU               atol 2e-6 more: the CPU's erf is Abramowitz & Stegun
 *                      7.1.26 (absolute error 1.5e-7), the GPU's is erfcf
 *   bf16 outputs       rtol 1e-2 (one bf16 step is 2^-8 = 3.9e-3)
 *   matmul             atol 1e-4 x sum_k |a_k b_k|, against a double-precision
 *                      product of the same bf16 operands (fp32 accumulation
 *                      error only; oneDNN's fp32 path is not linked here)
 *   SGD and AdamW steps, the weights' EMA, bf16 conversion (also to and from
 *   channels-last), Swin windows,
 *   Swin's bias gather, patch merging, the token mean: bit-identical.
 *   Swin's bias scatter and V2 head normalization: fp32 as above; V2's
 *                      16 sigmoid bias and temperature within a few ulp (expf)
 *   convolutions       against a direct double-precision convolution of the
 *                      same operands (oneDNN is not linked here): fp32 atol
 *                      3e-5 x the sum of |terms| (cuDNN runs FMA math, no
 *                      TF32); bf16 outputs that + 2e-4 x the sum of |terms|
 *                      and rtol 8e-3, the operands rounded to bf16 first
 *   batch norm         fp32 as above against visc_batchnorm2d (also in
 *                      channels-last, transposed in and out); SyncBN's
 *                      passes on two halves of a batch against it on the
 *                      whole batch
 *   max pooling (values, argmax, gradient), global average pooling, ReLU,
 *   sums (add, the residual add + ReLU), top-1 / top-5 counts: bit-identical.
 *   linear layer       against double-precision products of the same
 *                      operands: fp32 3e-5 x the sum of |terms| (no TF32);
 *                      bf16 (X, W, dY rounded for the products) 1e-4 x that
 *   token glue         broadcast add, drop-path, row copies bit-identical;
 *                      row sums as column sums; the patch embedding against a
 *                      double-precision reference (3e-5 x the sum of |terms|)
 *   talking heads      each step against models/talking_heads.c on the CPU's
 *                      inputs: rtol 1e-4, atol 2e-5 x the largest |value|;
 *                      LayerScale bit-identical
 *   LARS and LAMB steps, gradient clipping: 1e-5 (1e-6) relative, their norms
 *                      summed in another order than the CPU's
 *   attention          against a double-precision reference: rtol 1e-4,
 *                      atol 2e-5 x the tensor's largest |value|
 * This program links the CPU twins' objects, not libvisc.a (no oneDNN). */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/models/swin_window.h"
#include "../../src/models/talking_heads.h"
#include "../../src/nn/linear_bf16.h"
#include "visc/cuda.h"
#include "visc/nn.h"
#include "visc/tokens.h"
#include "visc/transforms.h"

static visc_cuda *ctx;
static int passed, failed;

/* The CPU GELU twin (src/nn/gelu.c) asks visc_cpu_level, which lives in
 * src/cpu/dnnl.c and asks oneDNN; oneDNN is not linked here, so this
 * stand-in gives the same answer (2 for avx512_core: F, CD, BW, VL, DQ; 1
 * for AVX2 with FMA) from the CPU's flags. Weak: a build that links dnnl.o
 * uses the real one. */
int visc_cpu_level(void);
__attribute__((weak)) int visc_cpu_level(void) {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return 2;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* ---- deterministic inputs (splitmix64) ---- */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(next_u64() >> 11) / 9007199254740992.0);
}
static float *random_floats(size_t n, float lo, float hi) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = uniform(lo, hi);
    return x;
}

/* ---- device helpers: a failure here ends the program (it is not a mismatch) ---- */
static void die_cuda(const char *what) {
    printf("FAIL %s: %s\n", what, visc_last_error());
    printf("%d passed, %d failed\n", passed, failed + 1);
    exit(1);
}
static void *up(const void *host, size_t bytes) {
    void *d = visc_cuda_alloc(ctx, bytes);
    if (!d || visc_cuda_upload(ctx, d, host, bytes)) die_cuda("upload");
    return d;
}
static void *dev(size_t bytes) {
    void *d = visc_cuda_alloc(ctx, bytes);
    if (!d) die_cuda("device allocation");
    return d;
}
static float *down(const void *d, size_t floats) {
    float *h = malloc(sizeof(float) * (floats ? floats : 1));
    if (visc_cuda_download(ctx, h, d, sizeof(float) * floats)) die_cuda("download");
    return h;
}
/* A kernel that failed to launch or run is a FAIL line, and the checks go
 * on (their comparisons then fail too); an error that breaks the context
 * for good ends the program at its next copy, with the summary. */
static void launched(int rc, const char *what) {
    if (rc == 0 && visc_cuda_sync(ctx) == 0) return;
    printf("FAIL %s: %s\n", what, visc_last_error());
    failed++;
}

/* ---- comparisons ---- */
static void report(const char *name, size_t bad, size_t n, size_t worst, double got, double want,
                   double ratio) {
    if (bad == 0) {
        printf("ok   %s (%zu values, worst error %.3g of the tolerance)\n", name, n, ratio);
        passed++;
    } else {
        printf("FAIL %s: %zu of %zu values out of tolerance; worst [%zu] gpu %.9g cpu %.9g\n", name,
               bad, n, worst, got, want);
        failed++;
    }
}

static double max_abs(const float *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i]));
    return m;
}

/* |g - c| <= atol + rtol |c| elementwise; a NaN on either side is a failure. */
static void expect_close(const char *name, const float *g, const float *c, size_t n, double atol,
                         double rtol) {
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)g[i] - (double)c[i]),
                     tol = atol + rtol * fabs((double)c[i]);
        const double ratio = tol > 0 ? err / tol : (err > 0 ? INFINITY : 0.0);
        if (!(err <= tol)) bad++;
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    report(name, bad, n, worst, n ? g[worst] : 0, n ? c[worst] : 0, worst_ratio);
}

/* Column sums: |g - c| <= 1e-5 (sum of |terms| of that column) + 1e-5 |c|. */
static void expect_sums(const char *name, const float *g, const float *c, const double *abs_sum,
                        size_t n) {
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)g[i] - (double)c[i]);
        const double ratio = err / (1e-5 * abs_sum[i] + 1e-5 * fabs((double)c[i]) + 1e-30);
        if (!(ratio <= 1.0)) bad++;
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    report(name, bad, n, worst, n ? g[worst] : 0, n ? c[worst] : 0, worst_ratio);
}

/* fp32 kernels: rtol 1e-5, atol 1e-5 of the tensor's scale. */
static void expect_fp32(const char *name, const float *g, const float *c, size_t n) {
    expect_close(name, g, c, n, 1e-5 * max_abs(c, n), 1e-5);
}

static void expect_bits(const char *name, const void *g, const void *c, size_t n, size_t elem) {
    size_t bad = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)g + i * elem, (const char *)c + i * elem, elem)) {
            if (!bad) worst = i;
            bad++;
        }
    double gv = 0, cv = 0;
    if (bad && elem == 4) {
        gv = ((const float *)g)[worst];
        cv = ((const float *)c)[worst];
    } else if (bad && elem == 2) {
        gv = ((const uint16_t *)g)[worst];
        cv = ((const uint16_t *)c)[worst];
    }
    report(name, bad, n, worst, gv, cv, 0.0);
}

/* A norm's dgamma (gotten g_dg) and dbeta (g_db) against the CPU's (dg,
 * db) from dy, x and the statistics of its [rows, C] rows, each within
 * the sum of its column's |terms| (expect_sums). */
static void expect_norm_param_grads(const char *what, const float *g_dg, const float *g_db,
                                    const float *dg, const float *db, const float *dy,
                                    const float *x, const float *mean, const float *rstd,
                                    int64_t rows, int C) {
    char name[256];
    double *abs_g = calloc((size_t)C, sizeof(double)), *abs_b = calloc((size_t)C, sizeof(double));
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)r * C + c;
            abs_g[c] += fabs((double)dy[i] * ((double)x[i] - mean[r]) * rstd[r]);
            abs_b[c] += fabs((double)dy[i]);
        }
    snprintf(name, sizeof name, "%s: dgamma", what);
    expect_sums(name, g_dg, dg, abs_g, (size_t)C);
    snprintf(name, sizeof name, "%s: dbeta", what);
    expect_sums(name, g_db, db, abs_b, (size_t)C);
    free(abs_g), free(abs_b);
}

/* ---- layer norm ---- */
static void check_layernorm(int64_t rows, int C, int affine, float offset, float spread) {
    char name[128];
    const size_t n = (size_t)rows * C;
    float *x = random_floats(n, offset - spread, offset + spread);
    float *gamma = random_floats((size_t)C, 0.5f, 1.5f), *beta = random_floats((size_t)C, -1, 1);
    float *dy = random_floats(n, -1, 1);
    float *out = malloc(sizeof(float) * n), *mean = malloc(sizeof(float) * rows);
    float *rstd = malloc(sizeof(float) * rows), *dx = malloc(sizeof(float) * n);
    float *dg = malloc(sizeof(float) * C), *db = malloc(sizeof(float) * C);
    const float *g = affine ? gamma : NULL, *b = affine ? beta : NULL;
    visc_layernorm_forward(out, mean, rstd, x, g, b, rows, C, 1e-5f);
    visc_layernorm_backward(dx, affine ? dg : NULL, affine ? db : NULL, dy, x, g, mean, rstd, rows,
                            C);

    float *d_x = up(x, sizeof(float) * n), *d_dy = up(dy, sizeof(float) * n);
    float *d_g = up(gamma, sizeof(float) * C), *d_b = up(beta, sizeof(float) * C);
    float *d_out = dev(sizeof(float) * n), *d_mean = dev(sizeof(float) * rows);
    float *d_rstd = dev(sizeof(float) * rows), *d_dx = dev(sizeof(float) * n);
    float *d_dg = dev(sizeof(float) * C), *d_db = dev(sizeof(float) * C);
    launched(visc_cuda_layernorm_forward(ctx, d_out, d_mean, d_rstd, d_x, affine ? d_g : NULL,
                                         affine ? d_b : NULL, rows, C, 1e-5f),
             "layernorm forward");
    launched(visc_cuda_layernorm_backward(ctx, d_dx, affine ? d_dg : NULL, affine ? d_db : NULL,
                                          d_dy, d_x, affine ? d_g : NULL, d_mean, d_rstd, rows, C),
             "layernorm backward");
    float *h_out = down(d_out, n), *h_mean = down(d_mean, (size_t)rows);
    float *h_rstd = down(d_rstd, (size_t)rows), *h_dx = down(d_dx, n);
    const char *tag = affine ? "affine" : "plain";
    snprintf(name, sizeof name, "layernorm forward [%lld, %d] %s, mean %g, spread %g: out",
             (long long)rows, C, tag, offset, spread);
    expect_fp32(name, h_out, out, n);
    /* The operand form (a linear layer's input): fp32, the same bits; in
     * bf16 each value the CPU's rounded once (half a bf16 step at most:
     * 2^-8 of the value, plus the fp32 tolerance), the statistics the
     * fp32 form's bits. */
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        float *d_op = dev(sizeof(float) * n), *d_m2 = dev(sizeof(float) * rows);
        float *d_r2 = dev(sizeof(float) * rows);
        visc_cuda_set_bf16(ctx, bf16);
        launched(visc_cuda_layernorm_operand_forward(ctx, d_op, d_m2, d_r2, d_x,
                                                     affine ? d_g : NULL, affine ? d_b : NULL, rows,
                                                     C, 1e-5f),
                 "layernorm operand forward");
        visc_cuda_set_bf16(ctx, 0);
        float *op = down(d_op, n), *m2 = down(d_m2, (size_t)rows), *r2 = down(d_r2, (size_t)rows);
        snprintf(name, sizeof name, "layernorm operand %s [%lld, %d] %s: out%s",
                 bf16 ? "bf16" : "fp32", (long long)rows, C, tag, bf16 ? "" : ", bit-identical");
        if (bf16) {
            float *wide = malloc(sizeof(float) * n);
            const uint16_t *op16 = (const void *)op; /* the bf16 form */
            for (size_t i = 0; i < n; i++) wide[i] = visc_bf16_to_f32(op16[i]);
            expect_close(name, wide, out, n, 1e-5 * max_abs(out, n), 1.0 / 256);
            free(wide);
        } else {
            expect_bits(name, op, h_out, n, sizeof(float));
        }
        snprintf(name, sizeof name, "layernorm operand %s [%lld, %d] %s: statistics, bit-identical",
                 bf16 ? "bf16" : "fp32", (long long)rows, C, tag);
        expect_bits(name, m2, h_mean, (size_t)rows, sizeof(float));
        expect_bits(name, r2, h_rstd, (size_t)rows, sizeof(float));
        visc_cuda_free(ctx, d_op);
        visc_cuda_free(ctx, d_m2);
        visc_cuda_free(ctx, d_r2);
        free(op), free(m2), free(r2);
    }
    /* A row's mean is a sum (over C) whose terms may cancel: held, as the
     * column sums, to 1e-5 of its terms' magnitudes (a mean near 0 of
     * inputs of either sign moved by 2e-4 of itself between the CPU's
     * summation orders at -O1 and -O3); rstd, a sum of squares, as fp32. */
    double *abs_mean = calloc((size_t)rows, sizeof(double));
    for (size_t e = 0; e < n; e++) abs_mean[e / (size_t)C] += fabs((double)x[e]) / C;
    snprintf(name, sizeof name, "layernorm forward [%lld, %d] %s: mean", (long long)rows, C, tag);
    expect_sums(name, h_mean, mean, abs_mean, (size_t)rows);
    free(abs_mean);
    snprintf(name, sizeof name, "layernorm forward [%lld, %d] %s: rstd", (long long)rows, C, tag);
    expect_fp32(name, h_rstd, rstd, (size_t)rows);
    snprintf(name, sizeof name, "layernorm backward [%lld, %d] %s: din", (long long)rows, C, tag);
    expect_fp32(name, h_dx, dx, n);
    /* added to a residual stream's gradient: the CPU's _add, and on the
     * GPU the bits of din plus the stream (the sum of two passes) */
    float *stream = random_floats(n, -1, 1), *sum = malloc(sizeof(float) * n);
    memcpy(sum, stream, sizeof(float) * n);
    visc_layernorm_backward_add(sum, NULL, NULL, dy, x, g, mean, rstd, rows, C);
    float *d_sum = up(stream, sizeof(float) * n);
    launched(visc_cuda_layernorm_backward_add(ctx, d_sum, NULL, NULL, d_dy, d_x,
                                              affine ? d_g : NULL, d_mean, d_rstd, rows, C),
             "layernorm backward, added");
    float *h_sum = down(d_sum, n);
    snprintf(name, sizeof name, "layernorm backward [%lld, %d] %s: din added, the CPU's",
             (long long)rows, C, tag);
    expect_fp32(name, h_sum, sum, n);
    for (size_t i = 0; i < n; i++) stream[i] += h_dx[i];
    snprintf(name, sizeof name, "layernorm backward [%lld, %d] %s: din added, as din + stream",
             (long long)rows, C, tag);
    expect_bits(name, h_sum, stream, n, sizeof(float));
    visc_cuda_free(ctx, d_sum);
    free(stream), free(sum), free(h_sum);
    if (affine) {
        float *h_dg = down(d_dg, (size_t)C), *h_db = down(d_db, (size_t)C);
        snprintf(name, sizeof name, "layernorm backward [%lld, %d]", (long long)rows, C);
        expect_norm_param_grads(name, h_dg, h_db, dg, db, dy, x, mean, rstd, rows, C);
        free(h_dg);
        free(h_db);
    }
    void *dfree[] = {d_x, d_dy, d_g, d_b, d_out, d_mean, d_rstd, d_dx, d_dg, d_db};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, gamma, beta, dy, out, mean, rstd, dx, dg, db, h_out, h_mean, h_rstd, h_dx};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* ---- softmax cross-entropy ---- */
static void check_xent(int N, int K, float smoothing) {
    char name[128];
    const size_t n = (size_t)N * K;
    float *logits = random_floats(n, -8, 8), *probs = malloc(sizeof(float) * n);
    float *dl = malloc(sizeof(float) * n);
    int32_t *labels = malloc(sizeof(int32_t) * N);
    /* The label's logit stands out, as in a trained network: with logits
     * all alike, the smoothing term (x_y - mean x) averages to nearly 0
     * and a wrong smoothing formula (s / (K - 1) for s / K, say) would
     * change the mean loss by less than the tolerance. */
    for (int i = 0; i < N; i++) {
        labels[i] = (int32_t)(next_u64() % (uint64_t)K);
        logits[(size_t)i * K + labels[i]] += 6.0f;
    }
    const float loss = visc_softmax_xent_forward(probs, logits, labels, N, K, smoothing);
    visc_softmax_xent_backward(dl, probs, labels, N, K, smoothing);

    float *d_logits = up(logits, sizeof(float) * n), *d_probs = dev(sizeof(float) * n);
    float *d_dl = dev(sizeof(float) * n), *d_loss = dev(sizeof(float));
    int32_t *d_labels = up(labels, sizeof(int32_t) * N);
    launched(visc_cuda_softmax_xent_forward(ctx, d_loss, d_probs, d_logits, d_labels, N, K,
                                            smoothing),
             "softmax cross-entropy forward");
    launched(visc_cuda_softmax_xent_backward(ctx, d_dl, d_probs, d_labels, N, K, smoothing),
             "softmax cross-entropy backward");
    float *h_loss = down(d_loss, 1), *h_probs = down(d_probs, n), *h_dl = down(d_dl, n);
    snprintf(name, sizeof name, "softmax xent forward [%d, %d] smoothing %g: loss", N, K,
             smoothing);
    expect_close(name, h_loss, (const float[1]){loss}, 1, 0.0, 1e-5); /* one value */
    snprintf(name, sizeof name, "softmax xent forward [%d, %d] smoothing %g: probs", N, K,
             smoothing);
    expect_fp32(name, h_probs, probs, n);
    snprintf(name, sizeof name, "softmax xent backward [%d, %d] smoothing %g: dlogits", N, K,
             smoothing);
    expect_fp32(name, h_dl, dl, n);

    /* A label out of range: NaN loss, no read out of bounds. */
    int32_t bad_label = K;
    if (visc_cuda_upload(ctx, d_labels, &bad_label, sizeof bad_label)) die_cuda("upload");
    launched(visc_cuda_softmax_xent_forward(ctx, d_loss, d_probs, d_logits, d_labels, N, K,
                                            smoothing),
             "softmax cross-entropy forward, bad label");
    float *h_bad = down(d_loss, 1);
    snprintf(name, sizeof name, "softmax xent forward [%d, %d]: label %d gives a NaN loss", N, K,
             K);
    report(name, isnan(h_bad[0]) ? 0 : 1, 1, 0, h_bad[0], NAN, 0.0);
    void *dfree[] = {d_logits, d_probs, d_dl, d_loss, d_labels};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {logits, probs, dl, labels, h_loss, h_probs, h_dl, h_bad};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* Rows of unit vectors (the l2-normalized queries, keys and bank of MoCo). */
static float *unit_rows(int rows, int D) {
    float *x = random_floats((size_t)rows * D, -1, 1);
    for (int i = 0; i < rows; i++) {
        double s = 0;
        for (int j = 0; j < D; j++) s += (double)x[(size_t)i * D + j] * x[(size_t)i * D + j];
        for (int j = 0; j < D; j++) x[(size_t)i * D + j] = (float)(x[(size_t)i * D + j] / sqrt(s));
    }
    return x;
}

/* MoCo's InfoNCE against the bank, against the formula in double: row i's
 * logits x_i0 = q_i.k_i / t, x_ij = q_i.b_j / t; loss = mean(lse - x_i0),
 * dq_i = sum_j dx_ij c_j / t with dx = (softmax - onehot(0)) / n, c_0 = k_i
 * and c_j = b_j. dq is held to its column sums' bound (1e-5 of the sum of
 * the terms' magnitudes): its terms cancel. The positive stands out, as in
 * training, with the query near its key. */
static void check_infonce(int n, int K, int D, float t, int with_dq) {
    char name[160];
    float *q = unit_rows(n, D), *k = unit_rows(n, D), *bank = unit_rows(K, D);
    for (size_t e = 0; e < (size_t)n * D; e++) k[e] = 0.3f * k[e] + q[e];
    double *x = malloc(sizeof(double) * ((size_t)K + 1)), loss = 0;
    double *dq_sum = calloc((size_t)n * D, sizeof(double));
    double *abs_sum = calloc((size_t)n * D, sizeof(double));
    for (int i = 0; i < n; i++) {
        const float *qi = q + (size_t)i * D;
        double mx = -INFINITY;
        for (int j = 0; j <= K; j++) {
            const float *c = j == 0 ? k + (size_t)i * D : bank + (size_t)(j - 1) * D;
            double dot = 0;
            for (int d = 0; d < D; d++) dot += (double)qi[d] * c[d];
            x[j] = dot / t;
            mx = fmax(mx, x[j]);
        }
        double sum = exp(x[0] - mx); /* the positive's */
        for (int j = 1; j <= K; j++) sum += exp(x[j] - mx);
        loss += mx + log(sum) - x[0];
        for (int j = 0; j <= K; j++) {
            const double g = (exp(x[j] - mx) / sum - (j == 0)) / n / t;
            const float *c = j == 0 ? k + (size_t)i * D : bank + (size_t)(j - 1) * D;
            for (int d = 0; d < D; d++) {
                dq_sum[(size_t)i * D + d] += g * c[d];
                abs_sum[(size_t)i * D + d] += fabs(g * c[d]);
            }
        }
    }
    const float want_loss = (float)(loss / n);
    float *dq = malloc(sizeof(float) * n * D);
    for (size_t e = 0; e < (size_t)n * D; e++) dq[e] = (float)dq_sum[e];
    float *d_q = up(q, sizeof(float) * n * D), *d_k = up(k, sizeof(float) * n * D);
    float *d_bank = up(bank, sizeof(float) * K * D), *d_loss = dev(sizeof(float));
    float *d_dq = with_dq ? dev(sizeof(float) * n * D) : NULL;
    float *d_work = dev(sizeof(float) * visc_cuda_infonce_work_floats(n, K));
    launched(visc_cuda_infonce(ctx, d_loss, d_dq, d_q, d_k, d_bank, n, K, D, t, d_work), "InfoNCE");
    float *h_loss = down(d_loss, 1);
    snprintf(name, sizeof name, "InfoNCE %d queries, bank [%d, %d], t %g%s: loss", n, K, D, t,
             with_dq ? "" : " (loss only)");
    expect_close(name, h_loss, &want_loss, 1, 0.0, 1e-5);
    float *h_dq = NULL;
    if (with_dq) {
        h_dq = down(d_dq, (size_t)n * D);
        snprintf(name, sizeof name, "InfoNCE %d queries, bank [%d, %d], t %g: dq", n, K, D, t);
        expect_sums(name, h_dq, dq, abs_sum, (size_t)n * D);
    }
    void *dfree[] = {d_q, d_k, d_bank, d_loss, d_dq, d_work};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++)
        if (dfree[i]) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {q, k, bank, x, dq, dq_sum, abs_sum, h_loss, h_dq};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* NT-Xent, against the formula in double: all [2N, D] every rank's rows
 * grouped by view (N = n * world; view 1 near view 0, as after training a
 * little), z [2n, D] this rank's of them (rows rank * n and N + rank * n).
 * Local row a's logits x_aj = z_a.all_j / t over j != self, its label the
 * partner view; loss = mean(lse_a - x_a,partner) over the 2n rows, and
 * with g_aj = (softmax_aj - onehot(partner)) / (2n t) each pair sends
 * g_aj all_j to dz_a (the anchors' share) and g_aj z_a to dall_j (the
 * candidates'); one rank: the two summed into dz. Both are held to their
 * sums' bound, as InfoNCE's dq. */
static void check_ntxent(int n, int world, int rank, int D, float t, int with_dz) {
    char name[160];
    const int R = 2 * n, N = n * world, C = 2 * N;
    float *all = unit_rows(C, D);
    for (size_t e = (size_t)N * D; e < (size_t)C * D; e++)
        all[e] = 0.4f * all[e] + all[e - (size_t)N * D];
    float *z = malloc(sizeof(float) * R * D);
    const size_t view = (size_t)n * D;
    memcpy(z, all + (size_t)rank * view, view * sizeof(float));
    memcpy(z + view, all + (size_t)N * D + (size_t)rank * view, view * sizeof(float));
    double *x = malloc(sizeof(double) * C), loss = 0;
    double *dz_sum = calloc((size_t)R * D, sizeof(double)),
           *dz_abs = calloc((size_t)R * D, sizeof(double));
    double *dall_sum = calloc((size_t)C * D, sizeof(double)),
           *dall_abs = calloc((size_t)C * D, sizeof(double));
    for (int a = 0; a < R; a++) {
        const int i = a < n ? a : a - n;
        const int self = (a < n ? 0 : N) + rank * n + i, partner = (a < n ? N : 0) + rank * n + i;
        const float *za = z + (size_t)a * D;
        double mx = -INFINITY;
        for (int j = 0; j < C; j++) {
            double dot = 0;
            for (int d = 0; d < D; d++) dot += (double)za[d] * all[(size_t)j * D + d];
            x[j] = dot / t;
            if (j != self) mx = fmax(mx, x[j]);
        }
        /* the partner's term first: the sum is never empty */
        double sum = exp(x[partner] - mx);
        for (int j = 0; j < C; j++)
            if (j != self && j != partner) sum += exp(x[j] - mx);
        loss += mx + log(sum) - x[partner];
        for (int j = 0; j < C; j++) {
            if (j == self) continue;
            const double g = (exp(x[j] - mx) / sum - (j == partner)) / R / t;
            const float *aj = all + (size_t)j * D;
            for (int d = 0; d < D; d++) {
                dz_sum[(size_t)a * D + d] += g * aj[d];
                dz_abs[(size_t)a * D + d] += fabs(g * aj[d]);
                dall_sum[(size_t)j * D + d] += g * za[d];
                dall_abs[(size_t)j * D + d] += fabs(g * za[d]);
            }
        }
    }
    if (world == 1) /* one rank: dall's rows are the anchors' */
        for (size_t e = 0; e < (size_t)R * D; e++)
            dz_sum[e] += dall_sum[e], dz_abs[e] += dall_abs[e];
    const float want_loss = (float)(loss / R);
    float *dz = malloc(sizeof(float) * R * D), *dall = malloc(sizeof(float) * C * D);
    for (size_t e = 0; e < (size_t)R * D; e++) dz[e] = (float)dz_sum[e];
    for (size_t e = 0; e < (size_t)C * D; e++) dall[e] = (float)dall_sum[e];
    float *d_z = up(z, sizeof(float) * R * D), *d_loss = dev(sizeof(float));
    float *d_all = world > 1 ? up(all, sizeof(float) * C * D) : d_z;
    float *d_dz = with_dz ? dev(sizeof(float) * R * D) : NULL;
    float *d_dall = with_dz && world > 1 ? dev(sizeof(float) * C * D) : NULL;
    float *d_work = dev(sizeof(float) * visc_cuda_ntxent_work_floats(n, N));
    launched(visc_cuda_ntxent(ctx, d_loss, d_dz, d_dall, d_z, d_all, n, N, rank, D, t, d_work),
             "NT-Xent");
    float *h_loss = down(d_loss, 1);
    snprintf(name, sizeof name, "NT-Xent %d samples x 2 views, rank %d of %d, dim %d, t %g%s: loss",
             n, rank, world, D, t, with_dz ? "" : " (loss only)");
    expect_close(name, h_loss, &want_loss, 1, 0.0, 1e-5);
    float *h_dz = NULL, *h_dall = NULL;
    if (with_dz) {
        h_dz = down(d_dz, (size_t)R * D);
        snprintf(name, sizeof name, "NT-Xent %d samples x 2 views, rank %d of %d, dim %d, t %g: dz",
                 n, rank, world, D, t);
        expect_sums(name, h_dz, dz, dz_abs, (size_t)R * D);
    }
    if (d_dall) {
        h_dall = down(d_dall, (size_t)C * D);
        snprintf(name, sizeof name,
                 "NT-Xent %d samples x 2 views, rank %d of %d, dim %d, t %g: the candidates' dz", n,
                 rank, world, D, t);
        expect_sums(name, h_dall, dall, dall_abs, (size_t)C * D);
    }
    void *dfree[] = {d_z, d_loss, d_dz, d_dall, d_work, world > 1 ? d_all : NULL};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++)
        if (dfree[i]) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {all, z, x, dz, dall, dz_sum, dz_abs, dall_sum, dall_abs, h_loss, h_dz, h_dall};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* The embeddings' L2 normalization, against the formula in double:
 * y = x / |x|, dx = (s dy - y (y . s dy)) / |x|; in place, as pretraining
 * runs it, with MoCo --symmetric's weight 0.5 and an odd one. */
static void check_l2_normalize(int n, int D, float scale) {
    char name[128];
    const size_t count = (size_t)n * D;
    float *x = random_floats(count, -3, 3), *dy = random_floats(count, -1, 1);
    float *y = malloc(sizeof(float) * count), *dx = malloc(sizeof(float) * count);
    float *norms = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * D, *gi = dy + (size_t)i * D;
        double ss = 0, dot = 0;
        for (int j = 0; j < D; j++) ss += (double)xi[j] * xi[j];
        const double norm = sqrt(ss);
        norms[i] = (float)norm;
        for (int j = 0; j < D; j++) dot += xi[j] / norm * ((double)scale * gi[j]);
        for (int j = 0; j < D; j++) {
            y[(size_t)i * D + j] = (float)(xi[j] / norm);
            dx[(size_t)i * D + j] = (float)(((double)scale * gi[j] - xi[j] / norm * dot) / norm);
        }
    }
    float *d_x = up(x, sizeof(float) * count), *d_y = dev(sizeof(float) * count);
    float *d_norms = dev(sizeof(float) * n), *d_g = up(dy, sizeof(float) * count);
    launched(visc_cuda_l2_normalize_forward(ctx, d_y, d_norms, d_x, n, D), "L2 normalize");
    launched(visc_cuda_l2_normalize_backward(ctx, d_g, d_g, d_y, d_norms, n, D, scale),
             "L2 normalize backward");
    float *h_y = down(d_y, count), *h_norms = down(d_norms, (size_t)n), *h_dx = down(d_g, count);
    snprintf(name, sizeof name, "L2 normalize [%d, %d]: y", n, D);
    expect_close(name, h_y, y, count, 1e-7, 1e-6);
    snprintf(name, sizeof name, "L2 normalize [%d, %d]: norms", n, D);
    expect_close(name, h_norms, norms, (size_t)n, 0.0, 1e-6);
    snprintf(name, sizeof name, "L2 normalize [%d, %d] backward, scale %g: dx (in place)", n, D,
             (double)scale);
    expect_close(name, h_dx, dx, count, 1e-7, 1e-5);
    void *dfree[] = {d_x, d_y, d_norms, d_g};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, dy, y, dx, norms, h_y, h_norms, h_dx};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* Soft targets (mixup's: two labels mixed, and cutmix's area weights). */
static void check_xent_soft(int N, int K) {
    char name[128];
    const size_t n = (size_t)N * K;
    float *logits = random_floats(n, -8, 8), *targets = calloc(n, sizeof(float));
    float *probs = malloc(sizeof(float) * n), *dl = malloc(sizeof(float) * n);
    for (int i = 0; i < N; i++) {
        const int a = (int)(next_u64() % (uint64_t)K), b = (int)(next_u64() % (uint64_t)K);
        const float lam = (float)(next_u64() % 1000) / 1000.0f;
        targets[(size_t)i * K + a] += lam;
        targets[(size_t)i * K + b] += 1.0f - lam;
        logits[(size_t)i * K + a] += 4.0f;
    }
    const float loss = visc_softmax_xent_soft_forward(probs, logits, targets, N, K);
    visc_softmax_xent_soft_backward(dl, probs, targets, N, K);
    float *d_logits = up(logits, sizeof(float) * n), *d_targets = up(targets, sizeof(float) * n);
    float *d_probs = dev(sizeof(float) * n), *d_dl = dev(sizeof(float) * n);
    float *d_loss = dev(sizeof(float));
    launched(visc_cuda_softmax_xent_soft_forward(ctx, d_loss, d_probs, d_logits, d_targets, N, K),
             "soft cross-entropy forward");
    launched(visc_cuda_softmax_xent_soft_backward(ctx, d_dl, d_probs, d_targets, N, K),
             "soft cross-entropy backward");
    float *h_loss = down(d_loss, 1), *h_probs = down(d_probs, n), *h_dl = down(d_dl, n);
    snprintf(name, sizeof name, "soft xent forward [%d, %d]: loss", N, K);
    expect_close(name, h_loss, (const float[1]){loss}, 1, 0.0, 1e-5); /* one value */
    snprintf(name, sizeof name, "soft xent forward [%d, %d]: probs", N, K);
    expect_fp32(name, h_probs, probs, n);
    snprintf(name, sizeof name, "soft xent backward [%d, %d]: dlogits", N, K);
    expect_fp32(name, h_dl, dl, n);
    void *dfree[] = {d_logits, d_targets, d_probs, d_dl, d_loss};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {logits, targets, probs, dl, h_loss, h_probs, h_dl};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* Top-1 / top-5 counts, bit-identical to the CPU's. ties: logits on a
 * coarse grid, so that many labels tie with other classes (torch.topk's
 * order: the lower index wins); also labels out of range (counted in
 * neither). */
static void check_topk(int N, int K, int ties) {
    char name[128];
    const size_t n = (size_t)N * K;
    float *logits = random_floats(n, -3, 3);
    int32_t *labels = malloc(sizeof(int32_t) * N);
    if (ties)
        for (size_t i = 0; i < n; i++) logits[i] = roundf(logits[i]);
    for (int i = 0; i < N; i++) labels[i] = (int32_t)(next_u64() % (uint64_t)K);
    int32_t want[2];
    visc_topk_correct(logits, labels, N, K, &want[0], &want[1]);
    float *d_logits = up(logits, sizeof(float) * n);
    int32_t *d_labels = up(labels, sizeof(int32_t) * N), *d_counts = dev(2 * sizeof(int32_t));
    int32_t got[2] = {-1, -1};
    launched(visc_cuda_topk_correct(ctx, d_counts, d_logits, d_labels, N, K), "top-k counts");
    if (visc_cuda_download(ctx, got, d_counts, sizeof got)) die_cuda("download");
    snprintf(name, sizeof name, "top-k counts [%d, %d]%s (top-1 %d, top-5 %d of %d)", N, K,
             ties ? " with ties" : "", want[0], want[1], N);
    expect_bits(name, got, want, 2, sizeof(int32_t));
    /* labels out of range count in neither */
    labels[0] = K;
    labels[1] = -1;
    visc_topk_correct(logits + 2 * (size_t)K, labels + 2, N - 2, K, &want[0], &want[1]);
    if (visc_cuda_upload(ctx, d_labels, labels, sizeof(int32_t) * N)) die_cuda("upload");
    launched(visc_cuda_topk_correct(ctx, d_counts, d_logits, d_labels, N, K), "top-k counts");
    if (visc_cuda_download(ctx, got, d_counts, sizeof got)) die_cuda("download");
    snprintf(name, sizeof name, "top-k counts [%d, %d]: labels out of range count in neither", N,
             K);
    expect_bits(name, got, want, 2, sizeof(int32_t));
    visc_cuda_free(ctx, d_logits), visc_cuda_free(ctx, d_labels), visc_cuda_free(ctx, d_counts);
    free(logits), free(labels);
}

/* ---- GELU and the bias + GELU epilogue ---- */
static void check_gelu(size_t n) {
    char name[128];
    float *x = random_floats(n, -6, 6), *dy = random_floats(n, -1, 1);
    float *y = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    visc_gelu_forward(y, x, n);
    visc_gelu_backward(dx, dy, x, n);
    float *d_x = up(x, sizeof(float) * n), *d_dy = up(dy, sizeof(float) * n);
    float *d_y = dev(sizeof(float) * n), *d_dx = dev(sizeof(float) * n);
    launched(visc_cuda_gelu_forward(ctx, d_y, d_x, n), "gelu forward");
    launched(visc_cuda_gelu_backward(ctx, d_dx, d_dy, d_x, n), "gelu backward");
    float *h_y = down(d_y, n), *h_dx = down(d_dx, n);
    snprintf(name, sizeof name, "gelu forward [%zu]", n);
    expect_close(name, h_y, y, n, 2e-6 + 1e-5 * max_abs(y, n), 1e-5);
    snprintf(name, sizeof name, "gelu backward [%zu]", n);
    expect_close(name, h_dx, dx, n, 2e-6 + 1e-5 * max_abs(dx, n), 1e-5);
    void *dfree[] = {d_x, d_dy, d_y, d_dx};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, dy, y, dx, h_y, h_dx};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

static void check_bias_gelu(int64_t rows, int C) {
    char name[128];
    const size_t n = (size_t)rows * C;
    float *x = random_floats(n, -4, 4), *bias = random_floats((size_t)C, -1, 1);
    float *dy = random_floats(n, -1, 1), *pre = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    float *y16 = malloc(sizeof(float) * n), *dbias = calloc((size_t)C, sizeof(float));
    double *dbias_sum = calloc((size_t)C, sizeof(double));
    double *abs_sum = calloc((size_t)C, sizeof(double));
    for (size_t i = 0; i < n; i++) pre[i] = x[i] + bias[i % C];
    visc_gelu_forward(y, pre, n);
    visc_gelu_backward(dx, dy, pre, n);
    for (size_t i = 0; i < n; i++) {
        y16[i] = visc_bf16_to_f32(visc_f32_to_bf16(y[i]));
        dbias_sum[i % C] += dx[i];
        abs_sum[i % C] += fabs((double)dx[i]);
    }
    for (int c = 0; c < C; c++) dbias[c] = (float)dbias_sum[c];

    float *d_x = up(x, sizeof(float) * n), *d_bias = up(bias, sizeof(float) * C);
    float *d_dy = up(dy, sizeof(float) * n), *d_y = dev(sizeof(float) * n);
    uint16_t *d_y16 = dev(sizeof(uint16_t) * n);
    float *d_dx = dev(sizeof(float) * n), *d_dbias = dev(sizeof(float) * C);
    float *d_y32 = dev(sizeof(float) * n);
    launched(visc_cuda_bias_gelu_forward(ctx, d_y, d_y16, d_x, d_bias, rows, C),
             "bias + gelu forward");
    launched(visc_cuda_bf16_to_f32(ctx, d_y32, d_y16, n), "bf16 to fp32");
    launched(visc_cuda_bias_gelu_backward(ctx, d_dx, d_dbias, d_dy, d_x, d_bias, rows, C),
             "bias + gelu backward");
    float *h_y = down(d_y, n), *h_y16 = down(d_y32, n), *h_dx = down(d_dx, n);
    float *h_dbias = down(d_dbias, (size_t)C);
    snprintf(name, sizeof name, "bias + gelu forward [%lld, %d]: fp32 out", (long long)rows, C);
    expect_close(name, h_y, y, n, 2e-6 + 1e-5 * max_abs(y, n), 1e-5);
    snprintf(name, sizeof name, "bias + gelu forward [%lld, %d]: bf16 out", (long long)rows, C);
    expect_close(name, h_y16, y16, n, 1e-6, 1e-2);
    snprintf(name, sizeof name, "bias + gelu backward [%lld, %d]: din", (long long)rows, C);
    expect_close(name, h_dx, dx, n, 2e-6 + 1e-5 * max_abs(dx, n), 1e-5);
    snprintf(name, sizeof name, "bias + gelu backward [%lld, %d]: dbias", (long long)rows, C);
    expect_sums(name, h_dbias, dbias, abs_sum, (size_t)C);
    void *dfree[] = {d_x, d_bias, d_dy, d_y, d_y16, d_dx, d_dbias, d_y32};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x,     bias,      dy,      pre, y,     dx,   y16,
                     dbias, dbias_sum, abs_sum, h_y, h_y16, h_dx, h_dbias};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* ---- optimizers: three steps on a table of decayed and excluded tensors ----
 * SGD and AdamW: the CPU's bits. LARS and LAMB: their per-tensor norms add
 * in another order than the CPU's, so a trust ratio may differ in its last
 * bit: within 1e-5 relative (+1e-7) of the CPU's. */
static void check_optimizer(visc_opt_kind kind, float momentum, int nesterov, int decay_all,
                            int64_t big_numel) {
    char name[160];
    visc_table t;
    visc_table_init(&t);
    const int64_t w[2] = {64, 33}, b[1] = {33}, big[1] = {big_numel}, odd[1] = {5};
    visc_table_add(&t, "fc.weight", 2, w, 0);
    visc_table_add(&t, "fc.bias", 1, b, VISC_TENSOR_NO_DECAY | VISC_TENSOR_BIAS);
    visc_table_add(&t, "norm.weight", 1, b, VISC_TENSOR_NO_DECAY | VISC_TENSOR_NORM);
    visc_table_add(&t, "big.weight", 1, big, 0); /* several pieces of <= 16384 floats */
    visc_table_add(&t, "odd.weight", 1, odd, 0);
    visc_table_alloc(&t);
    visc_opt_config cfg = visc_opt_defaults(kind);
    if (kind == VISC_OPT_SGD || kind == VISC_OPT_LARS) {
        cfg.momentum = momentum;
        cfg.nesterov = nesterov;
    }
    cfg.weight_decay = kind == VISC_OPT_ADAMW ? 0.05f : kind == VISC_OPT_LAMB ? 0.01f : 1e-4f;
    cfg.decay_norm_and_bias = decay_all;
    visc_optimizer o;
    visc_optimizer_init(&o, &cfg, &t);
    const size_t total = t.total, state_n = (size_t)o.slots * total;
    float *p = random_floats(total, -1, 1);
    memcpy(t.data, p, sizeof(float) * total);

    float *d_p = up(p, sizeof(float) * total), *d_g = dev(sizeof(float) * total);
    float *d_state = dev(sizeof(float) * state_n);
    float *zero = calloc(state_n, sizeof(float));
    if (visc_cuda_upload(ctx, d_state, zero, sizeof(float) * state_n)) die_cuda("upload");
    visc_cuda_optim *go = visc_cuda_optim_create(ctx, &o);
    if (!go) die_cuda("optimizer create");
    const float lrs[3] = {0.1f, 0.05f, 0.0123f};
    for (int s = 0; s < 3; s++) {
        /* LAMB: gradients large enough for its clip to its max_grad_norm */
        float *g = random_floats(total, -0.5f, 0.5f);
        if (visc_cuda_upload(ctx, d_g, g, sizeof(float) * total)) die_cuda("upload");
        launched(visc_cuda_optim_step(go, d_p, d_g, d_state, lrs[s], o.step), "optimizer step");
        visc_optimizer_step(&o, t.data, g, lrs[s]);
        free(g);
    }
    float *h_p = down(d_p, total), *h_state = down(d_state, state_n);
    const int exact = kind == VISC_OPT_SGD || kind == VISC_OPT_ADAMW;
    const int has_momentum = (kind == VISC_OPT_SGD || kind == VISC_OPT_LARS) && momentum != 0.0f;
    snprintf(name, sizeof name, "%s%s%s%s step x3 over %zu floats: params %s",
             visc_opt_kind_name(kind), has_momentum ? " momentum" : "", nesterov ? " nesterov" : "",
             decay_all ? " decay-norm-bias" : "", total, exact ? "bit-identical" : "within 1e-5");
    if (exact) expect_bits(name, h_p, t.data, total, sizeof(float));
    else expect_close(name, h_p, t.data, total, 1e-7, 1e-5);
    snprintf(name, sizeof name, "%s%s%s step x3: state %s", visc_opt_kind_name(kind),
             has_momentum ? " momentum" : "", nesterov ? " nesterov" : "",
             exact ? "bit-identical" : "within 1e-5");
    if (o.slots == 2 || has_momentum) {
        if (exact) expect_bits(name, h_state, o.state, state_n, sizeof(float));
        else expect_close(name, h_state, o.state, state_n, 1e-7, 1e-5);
    }
    visc_cuda_optim_destroy(go);
    visc_cuda_free(ctx, d_p);
    visc_cuda_free(ctx, d_g);
    visc_cuda_free(ctx, d_state);
    free(p);
    free(zero);
    free(h_p);
    free(h_state);
    visc_optimizer_free(&o);
    visc_table_free(&t);
}

/* MoCo's momentum encoder: bit-identical to visc_ema_update. */
static void check_ema(size_t n, float decay) {
    char name[128];
    float *ema = random_floats(n, -1, 1), *p = random_floats(n, -1, 1);
    float *d_ema = up(ema, sizeof(float) * n), *d_p = up(p, sizeof(float) * n);
    visc_ema_update(ema, p, n, decay);
    launched(visc_cuda_ema_update(ctx, d_ema, d_p, n, decay), "ema update");
    float *got = down(d_ema, n);
    snprintf(name, sizeof name, "weights' EMA [%zu], decay %g: bit-identical", n, decay);
    expect_bits(name, got, ema, n, sizeof(float));
    visc_cuda_free(ctx, d_ema);
    visc_cuda_free(ctx, d_p);
    free(ema);
    free(p);
    free(got);
}

/* --clip-grad: the norm over the whole buffer in clip.c's chunks; scaled
 * (max_norm below the norm) or left alone (above it). */
static void check_clip(size_t n, float max_norm) {
    char name[128];
    float *g = random_floats(n, -1, 1);
    float *d_g = up(g, sizeof(float) * n);
    const float norm = visc_clip_grad_norm(g, n, max_norm);
    launched(visc_cuda_clip_grad_norm(ctx, d_g, n, max_norm), "gradient clipping");
    float *got = down(d_g, n);
    snprintf(name, sizeof name, "clip [%zu] to %g (norm %.4g): within 1e-6", n, max_norm, norm);
    expect_close(name, got, g, n, 0.0, 1e-6);
    visc_cuda_free(ctx, d_g);
    free(g);
    free(got);
}

/* ---- fp32 <-> bf16 ---- */
static void check_convert(void) {
    const size_t n = 1 << 16;
    float *x = random_floats(n, -1e4f, 1e4f);
    const float specials[] = {0.0f,        -0.0f,
                              INFINITY,    -INFINITY,
                              1e-40f,      -1e-40f,
                              3.4e38f,     1.00390625f /* a tie: rounds to even */,
                              1.01171875f, 65504.0f};
    memcpy(x, specials, sizeof specials);
    for (size_t i = sizeof specials / sizeof *specials; i < n; i += 7) x[i] *= 1e-30f;
    /* Subnormals, which a converter that flushes to zero would lose. */
    for (size_t i = sizeof specials / sizeof *specials + 3; i < n; i += 11) x[i] *= 1e-42f;
    uint16_t *want = malloc(sizeof(uint16_t) * n);
    float *back = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        want[i] = visc_f32_to_bf16(x[i]);
        back[i] = visc_bf16_to_f32(want[i]);
    }
    float *d_x = up(x, sizeof(float) * n), *d_back = dev(sizeof(float) * n);
    uint16_t *d_h = dev(sizeof(uint16_t) * n);
    launched(visc_cuda_f32_to_bf16(ctx, d_h, d_x, n), "fp32 to bf16");
    launched(visc_cuda_bf16_to_f32(ctx, d_back, d_h, n), "bf16 to fp32");
    uint16_t *got = malloc(sizeof(uint16_t) * n);
    if (visc_cuda_download(ctx, got, d_h, sizeof(uint16_t) * n)) die_cuda("download");
    float *got_back = down(d_back, n);
    expect_bits("fp32 -> bf16 (round to nearest even, specials): bit-identical", got, want, n,
                sizeof(uint16_t));
    expect_bits("bf16 -> fp32: bit-identical", got_back, back, n, sizeof(float));

    /* NaNs: the payload may differ from the CPU's (the hardware gives its
     * canonical NaN), but a NaN must stay a NaN, never become an infinity. */
    const uint32_t nan_bits[4] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu};
    float nans[4];
    memcpy(nans, nan_bits, sizeof nans);
    float *d_nan = up(nans, sizeof nans), *d_nan_back = dev(sizeof nans);
    launched(visc_cuda_f32_to_bf16(ctx, d_h, d_nan, 4), "fp32 to bf16, NaN");
    launched(visc_cuda_bf16_to_f32(ctx, d_nan_back, d_h, 4), "bf16 to fp32, NaN");
    float *nan_back = down(d_nan_back, 4);
    size_t not_nan = 0;
    for (int i = 0; i < 4; i++) not_nan += !isnan(nan_back[i]);
    report("fp32 -> bf16 -> fp32: NaN stays NaN", not_nan, 4, 0, nan_back[0], NAN, 0.0);
    visc_cuda_free(ctx, d_nan);
    visc_cuda_free(ctx, d_nan_back);
    free(nan_back);
    visc_cuda_free(ctx, d_x);
    visc_cuda_free(ctx, d_back);
    visc_cuda_free(ctx, d_h);
    free(x);
    free(want);
    free(back);
    free(got);
    free(got_back);
}

/* ---- matmul ---- */
/* The bf16 value of x, as an fp32. */
static float bf16_round(float x) { return visc_bf16_to_f32(visc_f32_to_bf16(x)); }

/* x uploaded in the operand form of a context in bf16 (bf16 values) or not
 * (fp32): a device buffer of n floats' room either way. */
static float *up_operand(const float *x, size_t n, int bf16) {
    void *form = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++)
        if (bf16) ((uint16_t *)form)[i] = visc_f32_to_bf16(x[i]);
        else ((float *)form)[i] = x[i];
    float *d = up(form, sizeof(float) * n);
    free(form);
    return d;
}

/* A device copy of a host array, `shift` elements into a fresh buffer
 * (*base, to free): a tensor that starts inside a larger buffer. */
static void *up_shifted(const void *host, size_t bytes, size_t elem, int shift, void **base) {
    *base = dev(bytes + elem * (size_t)shift);
    char *d = (char *)*base + elem * (size_t)shift;
    if (visc_cuda_upload(ctx, d, host, bytes)) die_cuda("upload");
    return d;
}

static void check_matmul(const char *what, int M, int N, int K, int trans_a, int trans_b,
                         int with_bias, float beta, int shift) {
    char name[160];
    float *a = random_floats((size_t)M * K, -1, 1), *b = random_floats((size_t)K * N, -1, 1);
    float *bias = random_floats((size_t)N, -1, 1), *d0 = random_floats((size_t)M * N, -1, 1);
    uint16_t *a16 = malloc(sizeof(uint16_t) * M * K), *b16 = malloc(sizeof(uint16_t) * K * N);
    for (size_t i = 0; i < (size_t)M * K; i++) {
        a16[i] = visc_f32_to_bf16(a[i]);
        a[i] = bf16_round(a[i]);
    }
    for (size_t i = 0; i < (size_t)K * N; i++) {
        b16[i] = visc_f32_to_bf16(b[i]);
        b[i] = bf16_round(b[i]);
    }
    /* With beta 0, D's old contents must not be read (BLAS's rule; a
     * forward product writes into an arena that holds stale values): they
     * are NaNs here, which would show through 0 * NaN. */
    if (beta == 0.0f)
        for (size_t i = 0; i < (size_t)M * N; i++) d0[i] = NAN;
    float *want = malloc(sizeof(float) * M * N);
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    void *base[4];
    uint16_t *d_a = up_shifted(a16, sizeof(uint16_t) * M * K, sizeof(uint16_t), shift, &base[0]);
    uint16_t *d_b = up_shifted(b16, sizeof(uint16_t) * K * N, sizeof(uint16_t), shift, &base[1]);
    float *d_bias = up_shifted(bias, sizeof(float) * N, sizeof(float), shift, &base[2]);
    float *d_d = up_shifted(d0, sizeof(float) * M * N, sizeof(float), shift, &base[3]);
    launched(visc_cuda_matmul_bf16(ctx, d_d, d_a, d_b, with_bias ? d_bias : NULL, M, N, K, trans_a,
                                   trans_b, beta),
             "matmul");
    float *got = down(d_d, (size_t)M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                const double av = trans_a ? a[(size_t)k * M + i] : a[(size_t)i * K + k];
                const double bv = trans_b ? b[(size_t)j * K + k] : b[(size_t)k * N + j];
                s += av * bv;
                mag += fabs(av * bv);
            }
            const double old = beta == 0.0f ? 0.0 : (double)beta * d0[(size_t)i * N + j];
            s += old + (with_bias ? bias[j] : 0.0);
            mag += fabs(old) + (with_bias ? fabs(bias[j]) : 0.0);
            const size_t at = (size_t)i * N + j;
            want[at] = (float)s;
            const double err = fabs((double)got[at] - s), ratio = err / (1e-4 * mag + 1e-30);
            if (!(ratio <= 1.0)) bad++;
            if (!(ratio <= worst_ratio)) {
                worst_ratio = ratio;
                worst = at;
            }
        }
    snprintf(name, sizeof name, "matmul bf16 %s: M %d N %d K %d%s%s%s, beta %g, shift %d", what, M,
             N, K, trans_a ? " A^T" : "", trans_b ? " B^T" : "", with_bias ? " + bias" : "", beta,
             shift);
    report(name, bad, (size_t)M * N, worst, got[worst], want[worst], worst_ratio);
    for (int i = 0; i < 4; i++) visc_cuda_free(ctx, base[i]);
    void *hfree[] = {a, b, bias, d0, a16, b16, want, got};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

static void *up_bf16(const float *host, size_t n); /* (batch norm's helpers, below) */
static float *down_bf16(const void *d, size_t n);

/* bf16 X W^T + b with a bf16 output (a linear layer's operand form): the
 * sums against double products of the same bf16 operands and bias, each
 * value rounded once (half a bf16 step of it, plus 1e-4 of its terms). */
static void check_matmul_bf16_out(const char *what, int M, int N, int K) {
    char name[160];
    float *a = random_floats((size_t)M * K, -1, 1), *b = random_floats((size_t)N * K, -1, 1);
    float *bias = random_floats((size_t)N, -1, 1);
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = bf16_round(a[i]);
    for (size_t i = 0; i < (size_t)N * K; i++) b[i] = bf16_round(b[i]);
    for (int j = 0; j < N; j++) bias[j] = bf16_round(bias[j]);
    void *d_a = up_bf16(a, (size_t)M * K), *d_b = up_bf16(b, (size_t)N * K);
    void *d_bias = up_bf16(bias, (size_t)N), *d_d = dev(sizeof(uint16_t) * M * N);
    launched(visc_cuda_matmul_bf16_to_bf16(ctx, d_d, d_a, d_b, d_bias, M, N, K, 0, 1),
             "matmul, bf16 out");
    float *got = down_bf16(d_d, (size_t)M * N), *want = malloc(sizeof(float) * M * N);
    double *mag = malloc(sizeof(double) * M * N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double sum = bias[j], m = fabs(bias[j]);
            for (int k = 0; k < K; k++) {
                sum += (double)a[(size_t)i * K + k] * b[(size_t)j * K + k];
                m += fabs((double)a[(size_t)i * K + k] * b[(size_t)j * K + k]);
            }
            want[(size_t)i * N + j] = (float)sum, mag[(size_t)i * N + j] = m;
        }
    size_t bad = 0, worst = 0;
    double worst_ratio = 0;
    for (size_t i = 0; i < (size_t)M * N; i++) {
        const double tol = fabs(want[i]) / 256 + 1e-4 * mag[i];
        const double ratio = fabs((double)got[i] - want[i]) / tol;
        if (!(ratio <= 1.0)) bad++;
        if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
    }
    snprintf(name, sizeof name, "matmul bf16 out + bias %s: M %d N %d K %d", what, M, N, K);
    report(name, bad, (size_t)M * N, worst, got[worst], want[worst], worst_ratio);
    void *dfree[] = {d_a, d_b, d_bias, d_d};
    for (size_t i = 0; i < 4; i++) visc_cuda_free(ctx, dfree[i]);
    free(a), free(b), free(bias), free(got), free(want), free(mag);
}

/* ---- Swin windows ---- */
/* A Swin test case's grid, on the host and as the GPU takes it, and its
 * description for the check names. */
typedef struct {
    visc_swin_grid g;
    visc_cuda_swin_grid cg;
    char what[96];
} swin_case;
static swin_case swin_case_make(int B, int H, int W, int window, int shifted, int C) {
    swin_case s;
    if (visc_swin_grid_make(&s.g, H, W, window, shifted)) die_cuda("swin grid");
    s.cg = (visc_cuda_swin_grid){s.g.H, s.g.W, s.g.wh, s.g.ww, s.g.sh, s.g.sw};
    snprintf(s.what, sizeof s.what, "B %d %dx%d window %d%s C %d", B, H, W, window,
             shifted ? " shifted" : "", C);
    return s;
}

static void check_swin(int B, int H, int W, int window, int shifted, int C) {
    char name[224];
    const swin_case sc = swin_case_make(B, H, W, window, shifted, C);
    const visc_swin_grid g = sc.g;
    const visc_cuda_swin_grid cg = sc.cg;
    const size_t n = (size_t)B * H * W * C;
    float *x = random_floats(n, -1, 1), *part = malloc(sizeof(float) * n);
    float *rev = malloc(sizeof(float) * n);
    visc_swin_partition(part, x, &g, B, C);
    visc_swin_reverse(rev, part, &g, B, C);
    float *d_x = up(x, sizeof(float) * n), *d_part = dev(sizeof(float) * n);
    float *d_rev = dev(sizeof(float) * n);
    launched(visc_cuda_swin_partition(ctx, d_part, d_x, &cg, B, C), "swin partition");
    launched(visc_cuda_swin_reverse(ctx, d_rev, d_part, &cg, B, C), "swin reverse");
    float *h_part = down(d_part, n), *h_rev = down(d_rev, n);
    snprintf(name, sizeof name, "swin partition %s: bit-identical", sc.what);
    expect_bits(name, h_part, part, n, sizeof(float));
    snprintf(name, sizeof name, "swin reverse %s: the input again", sc.what);
    expect_bits(name, h_rev, x, n, sizeof(float));
    /* into the operand form: fp32, the partition's bits; bf16, each value rounded once */
    const int was_bf16 = visc_cuda_bf16(ctx);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        visc_cuda_set_bf16(ctx, bf16);
        const size_t elem = (size_t)visc_cuda_operand_bytes(ctx);
        float *d_op = dev(elem * n);
        launched(visc_cuda_swin_partition_operand(ctx, d_op, d_x, &cg, B, C),
                 "swin partition into the operand form");
        void *got = malloc(elem * n), *want = malloc(elem * n);
        launched(visc_cuda_download(ctx, got, d_op, elem * n), "download");
        if (elem == 2)
            for (size_t i = 0; i < n; i++) ((uint16_t *)want)[i] = visc_f32_to_bf16(part[i]);
        else memcpy(want, part, sizeof(float) * n);
        snprintf(name, sizeof name, "swin partition into the operand form %s%s: %s", sc.what,
                 bf16 ? ", bf16" : "",
                 elem == 2 ? "the partition rounded" : "the partition's bits");
        expect_bits(name, got, want, n, elem);
        visc_cuda_free(ctx, d_op);
        free(got), free(want);
    }
    visc_cuda_set_bf16(ctx, was_bf16);
    /* acc += reverse(windowed): the bits of the reverse and the add in turn,
     * and the CPU's sum */
    float *acc = random_floats(n, -1, 1), *sum = malloc(sizeof(float) * n);
    visc_swin_reverse(rev, x, &g, B, C); /* x as a windowed tensor */
    for (size_t i = 0; i < n; i++) sum[i] = acc[i] + rev[i];
    float *d_acc = up(acc, sizeof(float) * n), *d_ref = up(acc, sizeof(float) * n);
    launched(visc_cuda_swin_reverse(ctx, d_rev, d_x, &cg, B, C), "swin reverse");
    launched(visc_cuda_add(ctx, d_ref, d_ref, d_rev, n), "add");
    launched(visc_cuda_swin_reverse_add(ctx, d_acc, d_x, &cg, B, C), "swin reverse, added");
    float *h_acc = down(d_acc, n), *h_ref = down(d_ref, n);
    snprintf(name, sizeof name, "swin reverse added %s: as reverse + add", sc.what);
    expect_bits(name, h_acc, h_ref, n, sizeof(float));
    snprintf(name, sizeof name, "swin reverse added %s: the CPU's sum", sc.what);
    expect_bits(name, h_acc, sum, n, sizeof(float));
    float *dfree[] = {d_x, d_part, d_rev, d_acc, d_ref};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, part, rev, h_part, h_rev, acc, sum, h_acc, h_ref};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* A norm fused with a window copy (on the device: out, mean, rstd)
 * against the GPU's passes in turn (ref, ref_mean, ref_rstd: the same
 * bits, the statistics at the same rows) and the CPU's output (want,
 * within fp32). */
static void expect_fused_norm(const char *what, const char *passes, const float *d_out,
                              const float *d_ref, const float *d_mean, const float *d_rstd,
                              const float *d_ref_mean, const float *d_ref_rstd, const float *want,
                              size_t n, int64_t rows) {
    char name[256];
    float *out = down(d_out, n), *ref = down(d_ref, n), *mean = down(d_mean, (size_t)rows);
    float *rstd = down(d_rstd, (size_t)rows), *ref_mean = down(d_ref_mean, (size_t)rows);
    float *ref_rstd = down(d_ref_rstd, (size_t)rows);
    snprintf(name, sizeof name, "%s: out, %s", what, passes);
    expect_bits(name, out, ref, n, sizeof(float));
    snprintf(name, sizeof name, "%s: statistics, %s", what, passes);
    expect_bits(name, mean, ref_mean, (size_t)rows, sizeof(float));
    expect_bits(name, rstd, ref_rstd, (size_t)rows, sizeof(float));
    snprintf(name, sizeof name, "%s: out, the CPU's", what);
    expect_fp32(name, out, want, n);
    free(out), free(ref), free(mean), free(rstd), free(ref_mean), free(ref_rstd);
}

/* Swin V1's first norm written to windowed order, and its backward from
 * there: the same bits as the GPU's norm and partition (reverse and norm
 * backward) in turn, the statistics and din included, and the CPU's values
 * within fp32 (the parameter gradients' sums in their other order); under
 * bf16, each output value the CPU's rounded once. */
static void check_swin_norm(int B, int H, int W, int window, int shifted, int C) {
    char name[200];
    const swin_case sc = swin_case_make(B, H, W, window, shifted, C);
    const visc_swin_grid g = sc.g;
    const visc_cuda_swin_grid cg = sc.cg;
    const char *what = sc.what;
    const int64_t rows = (int64_t)B * H * W;
    const size_t n = (size_t)rows * C;
    float *x = random_floats(n, -2, 3), *dy = random_floats(n, -1, 1); /* dy: windowed */
    float *gamma = random_floats((size_t)C, 0.5f, 1.5f), *beta = random_floats((size_t)C, -1, 1);
    float *normed = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    float *mean = malloc(sizeof(float) * rows), *rstd = malloc(sizeof(float) * rows);
    float *dyt = malloc(sizeof(float) * n);
    float *dg = malloc(sizeof(float) * C), *db = malloc(sizeof(float) * C);
    /* backward adds the input's gradient to the residual stream's, dx */
    float *dx0 = random_floats(n, -1, 1), *dx = malloc(sizeof(float) * n);
    memcpy(dx, dx0, sizeof(float) * n);
    visc_layernorm_forward(normed, mean, rstd, x, gamma, beta, rows, C, 1e-5f);
    visc_swin_partition(want, normed, &g, B, C);
    visc_swin_reverse(dyt, dy, &g, B, C);
    visc_layernorm_backward_add(dx, dg, db, dyt, x, gamma, mean, rstd, rows, C);

    float *d_x = up(x, sizeof(float) * n), *d_dy = up(dy, sizeof(float) * n);
    float *d_g = up(gamma, sizeof(float) * C), *d_b = up(beta, sizeof(float) * C);
    float *d_out = dev(sizeof(float) * n), *d_ref = dev(sizeof(float) * n);
    float *d_tmp = dev(sizeof(float) * n), *d_dx = up(dx0, sizeof(float) * n);
    float *d_mean = dev(sizeof(float) * rows), *d_rstd = dev(sizeof(float) * rows);
    float *d_m2 = dev(sizeof(float) * rows), *d_r2 = dev(sizeof(float) * rows);
    float *d_dg = dev(sizeof(float) * C), *d_db = dev(sizeof(float) * C);
    /* the GPU's two passes, then the fused one */
    launched(visc_cuda_layernorm_forward(ctx, d_tmp, d_m2, d_r2, d_x, d_g, d_b, rows, C, 1e-5f),
             "layernorm forward");
    launched(visc_cuda_swin_partition(ctx, d_ref, d_tmp, &cg, B, C), "swin partition");
    launched(visc_cuda_layernorm_operand_to_windows(ctx, d_out, d_mean, d_rstd, d_x, d_g, d_b, &cg,
                                                    B, C, 1e-5f),
             "layernorm to windows");
    snprintf(name, sizeof name, "layernorm to windows %s", what);
    expect_fused_norm(name, "as norm + partition", d_out, d_ref, d_mean, d_rstd, d_m2, d_r2, want,
                      n, rows);
    visc_cuda_set_bf16(ctx, 1);
    launched(visc_cuda_layernorm_operand_to_windows(ctx, d_tmp, d_m2, d_r2, d_x, d_g, d_b, &cg, B,
                                                    C, 1e-5f),
             "layernorm to windows, bf16");
    visc_cuda_set_bf16(ctx, 0);
    float *op = down(d_tmp, n), *wide = malloc(sizeof(float) * n);
    const uint16_t *op16 = (const void *)op; /* the bf16 form */
    for (size_t i = 0; i < n; i++) wide[i] = visc_bf16_to_f32(op16[i]);
    snprintf(name, sizeof name, "layernorm to windows bf16 %s: out, the CPU's rounded", what);
    expect_close(name, wide, want, n, 1e-5 * max_abs(want, n), 1.0 / 256);

    launched(visc_cuda_swin_reverse(ctx, d_tmp, d_dy, &cg, B, C), "swin reverse");
    launched(visc_cuda_upload(ctx, d_ref, dx0, sizeof(float) * n), "upload");
    launched(visc_cuda_layernorm_backward_add(ctx, d_ref, NULL, NULL, d_tmp, d_x, d_g, d_mean,
                                              d_rstd, rows, C),
             "layernorm backward, added");
    launched(visc_cuda_layernorm_backward_from_windows_add(ctx, d_dx, d_dg, d_db, d_dy, d_x, d_g,
                                                           d_mean, d_rstd, &cg, B, C),
             "layernorm backward from windows, added");
    float *h_dx = down(d_dx, n), *h_dref = down(d_ref, n);
    float *h_dg = down(d_dg, (size_t)C), *h_db = down(d_db, (size_t)C);
    snprintf(name, sizeof name,
             "layernorm backward from windows %s: din added, as reverse + backward", what);
    expect_bits(name, h_dx, h_dref, n, sizeof(float));
    snprintf(name, sizeof name, "layernorm backward from windows %s: din added, the CPU's", what);
    expect_fp32(name, h_dx, dx, n);
    snprintf(name, sizeof name, "layernorm backward from windows %s", what);
    expect_norm_param_grads(name, h_dg, h_db, dg, db, dyt, x, mean, rstd, rows, C);
    float *dfree[] = {d_x,  d_dy,   d_g,    d_b,  d_out, d_ref, d_tmp,
                      d_dx, d_mean, d_rstd, d_m2, d_r2,  d_dg,  d_db};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x,  dy, gamma, beta, normed, want,   mean, rstd, dyt, dx,
                     dg, db, op,    wide, h_dx,   h_dref, h_dg, h_db, dx0};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* Swin V2's post-norm of the output projection, whose rows are windowed,
 * into token order, and its backward to windowed order: the same bits as
 * the GPU's reverse and norm (partition and norm backward) in turn, the
 * statistics (at the windowed rows) and the parameter gradients included,
 * and the CPU's values within fp32 (models/swin.c's norm of the windowed
 * rows, then the reverse; the partition, then the norm's backward). */
static void check_swin_post_norm(int B, int H, int W, int window, int shifted, int C) {
    char name[200];
    const swin_case sc = swin_case_make(B, H, W, window, shifted, C);
    const visc_swin_grid g = sc.g;
    const visc_cuda_swin_grid cg = sc.cg, cg1 = {H, W, g.wh, g.ww, g.sh, g.sw};
    const char *what = sc.what;
    const int64_t rows = (int64_t)B * H * W;
    const size_t n = (size_t)rows * C;
    float *x = random_floats(n, -2, 3), *dy = random_floats(n, -1, 1); /* x windowed, dy not */
    float *gamma = random_floats((size_t)C, 0.5f, 1.5f), *beta = random_floats((size_t)C, -1, 1);
    float *normed = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    float *mean = malloc(sizeof(float) * rows), *rstd = malloc(sizeof(float) * rows);
    float *dyw = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    float *dg = malloc(sizeof(float) * C), *db = malloc(sizeof(float) * C);
    visc_layernorm_forward(normed, mean, rstd, x, gamma, beta, rows, C, 1e-5f);
    visc_swin_reverse(want, normed, &g, B, C);
    visc_swin_partition(dyw, dy, &g, B, C);
    visc_layernorm_backward(dx, dg, db, dyw, x, gamma, mean, rstd, rows, C);

    float *d_x = up(x, sizeof(float) * n), *d_dy = up(dy, sizeof(float) * n);
    float *d_g = up(gamma, sizeof(float) * C), *d_b = up(beta, sizeof(float) * C);
    float *d_out = dev(sizeof(float) * n), *d_ref = dev(sizeof(float) * n);
    float *d_tmp = dev(sizeof(float) * n), *d_dx = dev(sizeof(float) * n);
    float *d_mean = dev(sizeof(float) * rows), *d_rstd = dev(sizeof(float) * rows);
    float *d_m2 = dev(sizeof(float) * rows), *d_r2 = dev(sizeof(float) * rows);
    float *d_mw = dev(sizeof(float) * rows), *d_rw = dev(sizeof(float) * rows);
    float *d_dg = dev(sizeof(float) * 2 * C), *d_dg2 = dev(sizeof(float) * 2 * C);
    /* the GPU's two passes (statistics in token order, partitioned as one
     * channel to compare), then the fused one */
    launched(visc_cuda_swin_reverse(ctx, d_tmp, d_x, &cg, B, C), "swin reverse");
    launched(visc_cuda_layernorm_forward(ctx, d_ref, d_m2, d_r2, d_tmp, d_g, d_b, rows, C, 1e-5f),
             "layernorm forward");
    launched(visc_cuda_swin_partition(ctx, d_mw, d_m2, &cg1, B, 1), "swin partition");
    launched(visc_cuda_swin_partition(ctx, d_rw, d_r2, &cg1, B, 1), "swin partition");
    launched(visc_cuda_layernorm_from_windows(ctx, d_out, d_mean, d_rstd, d_x, d_g, d_b, &cg, B, C,
                                              1e-5f),
             "layernorm from windows");
    snprintf(name, sizeof name, "layernorm from windows %s", what);
    expect_fused_norm(name, "as reverse + norm", d_out, d_ref, d_mean, d_rstd, d_mw, d_rw, want, n,
                      rows);

    launched(visc_cuda_swin_partition(ctx, d_tmp, d_dy, &cg, B, C), "swin partition");
    launched(visc_cuda_layernorm_backward(ctx, d_ref, d_dg2, d_dg2 + C, d_tmp, d_x, d_g, d_mean,
                                          d_rstd, rows, C),
             "layernorm backward");
    launched(visc_cuda_layernorm_backward_to_windows(ctx, d_dx, d_dg, d_dg + C, d_dy, d_x, d_g,
                                                     d_mean, d_rstd, &cg, B, C),
             "layernorm backward to windows");
    float *h_dx = down(d_dx, n), *h_dref = down(d_ref, n);
    float *h_dg = down(d_dg, 2 * (size_t)C), *h_dg2 = down(d_dg2, 2 * (size_t)C);
    snprintf(name, sizeof name, "layernorm backward to windows %s: din, as partition + backward",
             what);
    expect_bits(name, h_dx, h_dref, n, sizeof(float));
    snprintf(name, sizeof name,
             "layernorm backward to windows %s: dgamma, dbeta, as partition + backward", what);
    expect_bits(name, h_dg, h_dg2, 2 * (size_t)C, sizeof(float));
    snprintf(name, sizeof name, "layernorm backward to windows %s: din, the CPU's", what);
    expect_fp32(name, h_dx, dx, n);
    snprintf(name, sizeof name, "layernorm backward to windows %s", what);
    expect_norm_param_grads(name, h_dg, h_dg + C, dg, db, dyw, x, mean, rstd, rows, C);
    /* in place would race (a row of one side is another's of the other): refused */
    int rc =
        visc_cuda_layernorm_from_windows(ctx, d_x, d_mean, d_rstd, d_x, d_g, d_b, &cg, B, C, 1e-5f);
    report("layernorm from windows: out in in's place is refused", rc == -1 ? 0 : 1, 1, 0, rc, -1,
           0.0);
    rc = visc_cuda_layernorm_backward_to_windows(ctx, d_dy, d_dg, d_dg + C, d_dy, d_x, d_g, d_mean,
                                                 d_rstd, &cg, B, C);
    report("layernorm backward to windows: din in dout's place is refused", rc == -1 ? 0 : 1, 1, 0,
           rc, -1, 0.0);
    float *dfree[] = {d_x,    d_dy,   d_g,  d_b,  d_out, d_ref, d_tmp, d_dx,
                      d_mean, d_rstd, d_m2, d_r2, d_mw,  d_rw,  d_dg,  d_dg2};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x,   dy, gamma, beta, normed, want,   mean, rstd,
                     dyw, dx, dg,    db,   h_dx,   h_dref, h_dg, h_dg2};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* A residual sum whose branch is in windowed order: the same bits as the
 * GPU's reverse and drop-path sum in turn, for drawn factors (0, 1, 2),
 * in place too, and with every sample kept (the factors then set to 1). */
static void check_swin_residual(int B, int H, int W, int window, int shifted, int C) {
    char name[224];
    const swin_case sc = swin_case_make(B, H, W, window, shifted, C);
    const visc_cuda_swin_grid cg = sc.cg;
    const char *what = sc.what;
    const size_t per = (size_t)H * W * C, n = per * B;
    float *x = random_floats(n, -1, 1), *branch = random_floats(n, -1, 1);
    float *keep = malloc(sizeof(float) * B);
    visc_droppath_keep(keep, B, 0.5f, 1, 11, 0); /* 0s and 2s */
    keep[0] = 1.0f;
    int dropped = 0;
    for (int b = 0; b < B; b++) dropped += keep[b] == 0.0f;
    float *d_x = up(x, sizeof(float) * n), *d_branch = up(branch, sizeof(float) * n);
    float *d_keep = up(keep, sizeof(float) * B), *d_tmp = dev(sizeof(float) * n);
    float *d_ref = dev(sizeof(float) * n), *d_out = dev(sizeof(float) * n);
    launched(visc_cuda_swin_reverse(ctx, d_tmp, d_branch, &cg, B, C), "swin reverse");
    for (int kept = 0; kept <= 1; kept++) {
        if (kept)
            launched(visc_cuda_droppath_add_kept(ctx, d_ref, d_x, d_tmp, d_keep, B, per),
                     "drop-path add, all kept");
        else
            launched(visc_cuda_droppath_add_forward(ctx, d_ref, d_x, d_tmp, d_keep, B, per),
                     "drop-path add");
        float *ref = down(d_ref, n);
        if (kept && visc_cuda_upload(ctx, d_keep, keep, sizeof(float) * B)) die_cuda("upload");
        launched(visc_cuda_droppath_add_from_windows(ctx, d_out, d_x, d_branch, d_keep, kept, &cg,
                                                     B, C),
                 "drop-path add from windows");
        float *got = down(d_out, n), *factors = down(d_keep, (size_t)B);
        snprintf(name, sizeof name, "drop-path add from windows %s, %d dropped: as reverse + add",
                 what, kept ? 0 : dropped);
        expect_bits(name, got, ref, n, sizeof(float));
        int ones = 0;
        for (int b = 0; b < B; b++) ones += factors[b] == 1.0f;
        snprintf(name, sizeof name, "drop-path add from windows %s%s: factors 1", what,
                 kept ? ", all kept" : " (drawn: only keep[0])");
        report(name, ones != (kept ? B : 1), 1, 0, ones, kept ? B : 1, 0.0);
        free(got);
        /* in place: out is x */
        float *d_io = up(x, sizeof(float) * n);
        launched(visc_cuda_droppath_add_from_windows(ctx, d_io, d_io, d_branch, d_keep, kept, &cg,
                                                     B, C),
                 "drop-path add from windows, in place");
        got = down(d_io, n);
        snprintf(name, sizeof name, "drop-path add from windows %s%s, in place: as reverse + add",
                 what, kept ? ", all kept" : "");
        expect_bits(name, got, ref, n, sizeof(float));
        visc_cuda_free(ctx, d_io);
        free(got);
        free(ref);
        free(factors);
    }
    float *dfree[] = {d_x, d_branch, d_keep, d_tmp, d_ref, d_out};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    free(x), free(branch), free(keep);
}

/* Swin V1's output projection backward from the token-order gradient
 * (visc_cuda_linear_operand_backward_from_windows), fp32 and bf16: the
 * bits of the partition followed by visc_cuda_linear_operand_backward,
 * also with din in dout's place. */
static void check_swin_proj_backward(int B, int H, int W, int window, int shifted, int C) {
    char name[224];
    const swin_case sc = swin_case_make(B, H, W, window, shifted, C);
    const visc_cuda_swin_grid cg = sc.cg;
    const int N = B * H * W, was_bf16 = visc_cuda_bf16(ctx);
    const size_t n = (size_t)N * C, nw = (size_t)C * C;
    float *x = random_floats(n, -1, 1), *w = random_floats(nw, -0.2f, 0.2f);
    float *dy = random_floats(n, -1, 1);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        visc_cuda_set_bf16(ctx, bf16);
        float *d_in = bf16 ? (float *)up_bf16(x, n) : up(x, sizeof(float) * n);
        float *d_w = up(w, sizeof(float) * nw), *d_dy = up(dy, sizeof(float) * n);
        float *d_tmp = dev(sizeof(float) * n), *d_scratch = dev(sizeof(float) * n);
        float *g_ref = dev(sizeof(float) * (n + nw + C)), *g = dev(sizeof(float) * (n + nw + C));
        launched(visc_cuda_swin_partition(ctx, d_tmp, d_dy, &cg, B, C), "swin partition");
        launched(visc_cuda_linear_operand_backward(ctx, g_ref, g_ref + n, g_ref + n + nw, d_tmp,
                                                   d_in, d_w, N, C, C),
                 "linear backward");
        launched(visc_cuda_linear_operand_backward_from_windows(ctx, g, g + n, g + n + nw, d_dy,
                                                                d_scratch, &cg, B, d_in, d_w, C, C),
                 "linear backward from windows");
        float *ref = down(g_ref, n + nw + C), *got = down(g, n + nw + C);
        snprintf(name, sizeof name, "linear backward from windows %s%s: as partition + backward",
                 sc.what, bf16 ? ", bf16" : "");
        expect_bits(name, got, ref, n + nw + C, sizeof(float));
        free(got);
        /* din where dout was */
        launched(visc_cuda_linear_operand_backward_from_windows(ctx, d_dy, g + n, g + n + nw, d_dy,
                                                                d_scratch, &cg, B, d_in, d_w, C, C),
                 "linear backward from windows, din in dout's place");
        got = down(d_dy, n);
        snprintf(name, sizeof name, "linear backward from windows %s%s, din in dout's place",
                 sc.what, bf16 ? ", bf16" : "");
        expect_bits(name, got, ref, n, sizeof(float));
        free(got), free(ref);
        float *dfree[] = {d_in, d_w, d_dy, d_tmp, d_scratch, g_ref, g};
        for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    }
    visc_cuda_set_bf16(ctx, was_bf16);
    free(x), free(w), free(dy);
}

/* ---- convolutions ---- */
typedef struct {
    int N, C, H, W, K, R, S, stride, pad, P, Q;
} conv_dims;

/* [n][c][i] (NCHW, HW = i's range) <-> [n][i][c] (channels-last). */
static void to_nhwc(float *dst, const float *src, int N, int C, int HW) {
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < HW; i++)
                dst[((size_t)n * HW + i) * C + c] = src[((size_t)n * C + c) * HW + i];
}
static void to_nchw(float *dst, const float *src, int N, int C, int HW) {
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < HW; i++)
                dst[((size_t)n * C + c) * HW + i] = src[((size_t)n * HW + i) * C + c];
}

/* Direct convolution in double, NCHW, all three directions: y = x * w,
 * dx from dy and w, dw from x and dy, each with the sum of |terms| of
 * every value (the scale its rounding error is measured against). The
 * first nest is split over k (y and dw), the second over c (dx), so the
 * threads never share an output. */
static void conv_reference(const conv_dims *d, const float *x, const float *w, const float *dy,
                           double *y, double *y_mag, double *dx, double *dx_mag, double *dw,
                           double *dw_mag) {
    const int N = d->N, C = d->C, H = d->H, W = d->W, K = d->K, R = d->R, S = d->S;
    const int P = d->P, Q = d->Q;
#pragma omp parallel for schedule(dynamic)
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++) {
                    const size_t yi = (((size_t)n * K + k) * P + p) * Q + q;
                    double s = 0, m = 0;
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++) {
                            const int h = p * d->stride - d->pad + r;
                            if (h < 0 || h >= H) continue;
                            for (int t = 0; t < S; t++) {
                                const int v = q * d->stride - d->pad + t;
                                if (v < 0 || v >= W) continue;
                                const double xv = x[(((size_t)n * C + c) * H + h) * W + v];
                                const size_t wi = (((size_t)k * C + c) * R + r) * S + t;
                                s += xv * w[wi];
                                m += fabs(xv * w[wi]);
                                dw[wi] += (double)dy[yi] * xv;
                                dw_mag[wi] += fabs((double)dy[yi] * xv);
                            }
                        }
                    y[yi] = s;
                    y_mag[yi] = m;
                }
#pragma omp parallel for schedule(dynamic)
    for (int c = 0; c < C; c++)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++)
                for (int p = 0; p < P; p++)
                    for (int q = 0; q < Q; q++) {
                        const double g = dy[(((size_t)n * K + k) * P + p) * Q + q];
                        for (int r = 0; r < R; r++) {
                            const int h = p * d->stride - d->pad + r;
                            if (h < 0 || h >= H) continue;
                            for (int t = 0; t < S; t++) {
                                const int v = q * d->stride - d->pad + t;
                                if (v < 0 || v >= W) continue;
                                const size_t xi = (((size_t)n * C + c) * H + h) * W + v;
                                const double term = g * w[(((size_t)k * C + c) * R + r) * S + t];
                                dx[xi] += term;
                                dx_mag[xi] += fabs(term);
                            }
                        }
                    }
}

/* |g - want| <= amag x (sum of |terms|) + rtol |want|, elementwise. */
static void expect_conv(const char *name, const float *g, const double *want, const double *mag,
                        size_t n, double amag, double rtol) {
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)g[i] - want[i]);
        const double ratio = err / (amag * mag[i] + rtol * fabs(want[i]) + 1e-30);
        if (!(ratio <= 1.0)) bad++;
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    report(name, bad, n, worst, n ? g[worst] : 0, n ? want[worst] : 0, worst_ratio);
}

/* Device copy of an NCHW host tensor: fp32 NCHW, or bf16 channels-last
 * (nhwc16). */
static void *up_conv(const float *host, int N, int C, int HW, int nhwc16) {
    const size_t n = (size_t)N * C * HW;
    if (!nhwc16) return up(host, sizeof(float) * n);
    float *t = malloc(sizeof(float) * n);
    uint16_t *b = malloc(sizeof(uint16_t) * n);
    to_nhwc(t, host, N, C, HW);
    for (size_t i = 0; i < n; i++) b[i] = visc_f32_to_bf16(t[i]);
    void *d = up(b, sizeof(uint16_t) * n);
    free(t);
    free(b);
    return d;
}
/* The device tensor back in NCHW fp32. */
static float *down_conv(const void *d, int N, int C, int HW, int nhwc16) {
    const size_t n = (size_t)N * C * HW;
    if (!nhwc16) return down(d, n);
    uint16_t *b = malloc(sizeof(uint16_t) * n);
    if (visc_cuda_download(ctx, b, d, sizeof(uint16_t) * n)) die_cuda("download");
    float *t = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) t[i] = visc_bf16_to_f32(b[i]);
    to_nchw(out, t, N, C, HW);
    free(b);
    free(t);
    return out;
}

/* NCHW fp32 <-> channels-last bf16 (a CNN's batch, its weights' copies): the CPU's
 * transpose and rounding, bit for bit; back with beta 0 (out not read: it
 * holds NaNs) and beta 0.5 (0.5 out + value, rounded as the CPU does). */
static void check_layout(int N, int C, int HW) {
    char name[160];
    const size_t n = (size_t)N * C * HW;
    float *x = random_floats(n, -100, 100), *old = random_floats(n, -1, 1);
    float *t = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
    uint16_t *want = malloc(sizeof(uint16_t) * n), *got = malloc(sizeof(uint16_t) * n);
    to_nhwc(t, x, N, C, HW);
    for (size_t i = 0; i < n; i++) want[i] = visc_f32_to_bf16(t[i]);
    float *d_x = up(x, sizeof(float) * n);
    uint16_t *d_h = dev(sizeof(uint16_t) * n);
    launched(visc_cuda_nchw_to_nhwc_bf16(ctx, d_h, d_x, N, C, HW), "NCHW to NHWC bf16");
    if (visc_cuda_download(ctx, got, d_h, sizeof(uint16_t) * n)) die_cuda("download");
    snprintf(name, sizeof name, "NCHW fp32 -> NHWC bf16, %d x %d x %d: bit-identical", N, C, HW);
    expect_bits(name, got, want, n, sizeof(uint16_t));
    /* back: the bf16 values in NCHW */
    for (size_t i = 0; i < n; i++) t[i] = visc_bf16_to_f32(want[i]);
    to_nchw(back, t, N, C, HW);
    float *nans = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) nans[i] = NAN;
    float *d_out = up(nans, sizeof(float) * n);
    launched(visc_cuda_nhwc_bf16_to_nchw(ctx, d_out, d_h, N, C, HW, 0.0f), "NHWC bf16 to NCHW");
    float *h = down(d_out, n);
    snprintf(name, sizeof name, "NHWC bf16 -> NCHW fp32, %d x %d x %d: bit-identical", N, C, HW);
    expect_bits(name, h, back, n, sizeof(float));
    free(h);
    if (visc_cuda_upload(ctx, d_out, old, sizeof(float) * n)) die_cuda("upload");
    launched(visc_cuda_nhwc_bf16_to_nchw(ctx, d_out, d_h, N, C, HW, 0.5f), "NHWC bf16 to NCHW");
    h = down(d_out, n);
    for (size_t i = 0; i < n; i++) back[i] = 0.5f * old[i] + back[i];
    snprintf(name, sizeof name, "NHWC bf16 -> NCHW fp32, beta 0.5, %d x %d x %d: bit-identical", N,
             C, HW);
    expect_bits(name, h, back, n, sizeof(float));
    visc_cuda_free(ctx, d_x);
    visc_cuda_free(ctx, d_h);
    visc_cuda_free(ctx, d_out);
    void *hfree[] = {x, old, t, back, want, got, nans, h};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* Tolerances: fp32 (FMA math, no TF32) 3e-5 of the sum of |terms| (a
 * single missing tap of 1000s moves a value by more); bf16 outputs 8e-3
 * of the value (rounding to bf16 moves it by 2^-8 of itself at most) + 2e-4 of the sum of
 * |terms| (fp32 accumulation), against the product of the same bf16
 * operands. */
static void check_conv(const char *what, int N, int C, int H, int W, int K, int R, int stride,
                       int pad, visc_cuda_conv_type type) {
    char name[200];
    conv_dims d = {N, C, H, W, K, R, R, stride, pad, 0, 0};
    d.P = (H + 2 * pad - R) / stride + 1;
    d.Q = (W + 2 * pad - R) / stride + 1;
    const size_t nx = (size_t)N * C * H * W, nw = (size_t)K * C * R * R;
    const size_t ny = (size_t)N * K * d.P * d.Q;
    /* bf16 products: the bf16 form, or bf16 channels-last tensors with fp32
     * weights; which operands are bf16 channels-last on the device: the
     * activations (a), the weights (w) */
    const int bf16 = type != VISC_CUDA_CONV_F32_NCHW;
    const int a16 = type == VISC_CUDA_CONV_BF16_NHWC || type == VISC_CUDA_CONV_BF16_NHWC_F32W;
    const int w16 = type == VISC_CUDA_CONV_BF16_NHWC;
    float *x = random_floats(nx, -1, 1), *w = random_floats(nw, -1, 1);
    float *dy = random_floats(ny, -1, 1);
    if (bf16) { /* the reference multiplies the operands the GPU sees */
        for (size_t i = 0; i < nx; i++) x[i] = bf16_round(x[i]);
        for (size_t i = 0; i < nw; i++) w[i] = bf16_round(w[i]);
        for (size_t i = 0; i < ny; i++) dy[i] = bf16_round(dy[i]);
    }
    double *y = calloc(ny, sizeof(double)), *y_mag = calloc(ny, sizeof(double));
    double *dx = calloc(nx, sizeof(double)), *dx_mag = calloc(nx, sizeof(double));
    double *dw = calloc(nw, sizeof(double)), *dw_mag = calloc(nw, sizeof(double));
    conv_reference(&d, x, w, dy, y, y_mag, dx, dx_mag, dw, dw_mag);

    const visc_cuda_conv_shape s = {N, C, H, W, K, R, R, stride, pad, type};
    void *d_x = up_conv(x, N, C, H * W, a16), *d_w = up_conv(w, K, C, R * R, w16);
    void *d_dy = up_conv(dy, N, K, d.P * d.Q, a16);
    const size_t elem = a16 ? sizeof(uint16_t) : sizeof(float);
    const size_t welem = w16 ? sizeof(uint16_t) : sizeof(float);
    void *d_y = dev(elem * ny), *d_dx = dev(elem * nx), *d_dw = dev(welem * nw);
    /* beta 0: dw's old contents (NaN bits) must not be read */
    void *nan_bits = memset(malloc(welem * nw), 0xff, welem * nw);
    if (visc_cuda_upload(ctx, d_dw, nan_bits, welem * nw)) die_cuda("upload");
    free(nan_bits);
    launched(visc_cuda_conv_forward(ctx, &s, d_y, d_x, d_w), "convolution forward");
    launched(visc_cuda_conv_backward_data(ctx, &s, d_dx, d_dy, d_w), "convolution backward-data");
    launched(visc_cuda_conv_backward_weights(ctx, &s, d_dw, d_x, d_dy, 0.0f),
             "convolution backward-weights");
    float *h_y = down_conv(d_y, N, K, d.P * d.Q, a16), *h_dx = down_conv(d_dx, N, C, H * W, a16);
    float *h_dw = down_conv(d_dw, K, C, R * R, w16);
    const double amag = bf16 ? 2e-4 : 3e-5, rtol = bf16 ? 8e-3 : 0.0;
    const char *form = type == VISC_CUDA_CONV_BF16_NHWC        ? "bf16 NHWC"
                       : type == VISC_CUDA_CONV_BF16_NHWC_F32W ? "bf16 NHWC, fp32 weights"
                                                               : "fp32 NCHW";
    snprintf(name, sizeof name, "conv %s %s: N %d C %d %dx%d K %d %dx%d/%d pad %d: forward", what,
             form, N, C, H, W, K, R, R, stride, pad);
    expect_conv(name, h_y, y, y_mag, ny, amag, rtol);
    snprintf(name, sizeof name, "conv %s %s: backward-data", what, form);
    expect_conv(name, h_dx, dx, dx_mag, nx, amag, rtol);
    snprintf(name, sizeof name, "conv %s %s: backward-weights", what, form);
    expect_conv(name, h_dw, dw, dw_mag, nw, amag, rtol);
    /* only deterministic algorithms are taken: a second run gives the same bits */
    launched(visc_cuda_conv_forward(ctx, &s, d_y, d_x, d_w), "convolution forward, again");
    launched(visc_cuda_conv_backward_data(ctx, &s, d_dx, d_dy, d_w),
             "convolution backward-data, again");
    launched(visc_cuda_conv_backward_weights(ctx, &s, d_dw, d_x, d_dy, 0.0f),
             "convolution backward-weights, again");
    float *again[3] = {down_conv(d_y, N, K, d.P * d.Q, a16), down_conv(d_dx, N, C, H * W, a16),
                       down_conv(d_dw, K, C, R * R, w16)};
    const float *first[3] = {h_y, h_dx, h_dw};
    const size_t count[3] = {ny, nx, nw};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "conv %s %s: %s run again: the same bits", what, form,
                 i == 0   ? "forward"
                 : i == 1 ? "backward-data"
                          : "backward-weights");
        expect_bits(name, again[i], first[i], count[i], sizeof(float));
        free(again[i]);
    }
    /* beta 1 adds the gradient to what dw holds: twice the gradient now */
    launched(visc_cuda_conv_backward_weights(ctx, &s, d_dw, d_x, d_dy, 1.0f),
             "convolution backward-weights, beta 1");
    float *h_dw2 = down_conv(d_dw, K, C, R * R, w16);
    for (size_t i = 0; i < nw; i++) dw[i] *= 2, dw_mag[i] *= 2;
    snprintf(name, sizeof name, "conv %s %s: backward-weights accumulated (beta 1)", what, form);
    expect_conv(name, h_dw2, dw, dw_mag, nw, amag, 2 * rtol);
    void *dfree[] = {d_x, d_w, d_dy, d_y, d_dx, d_dw};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, w, dy, y, y_mag, dx, dx_mag, dw, dw_mag, h_y, h_dx, h_dw, h_dw2};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* ---- batch normalization ---- */
/* dgamma and dbeta (column sums over N x HW) against the CPU's, each
 * within 1e-5 of the sum of its terms' magnitudes. */
static void expect_bn_param_grads(const char *tag, const float *h_dg, const float *h_db,
                                  const float *dg, const float *db, const float *x, const float *dy,
                                  const float *out, const float *mean, const float *rstd, int N,
                                  int C, int HW, int relu) {
    char name[200];
    double *abs_g = calloc((size_t)C, sizeof(double)), *abs_b = calloc((size_t)C, sizeof(double));
    for (int b = 0; b < N; b++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < HW; i++) {
                const size_t a = ((size_t)b * C + c) * HW + i;
                const double g = relu && !(out[a] > 0) ? 0.0 : dy[a];
                abs_b[c] += fabs(g);
                abs_g[c] += fabs(g * ((double)x[a] - mean[c]) * rstd[c]);
            }
    snprintf(name, sizeof name, "%s: dgamma", tag);
    expect_sums(name, h_dg, dg, abs_g, (size_t)C);
    snprintf(name, sizeof name, "%s: dbeta", tag);
    expect_sums(name, h_db, db, abs_b, (size_t)C);
    free(abs_g);
    free(abs_b);
}

/* A channels-last host tensor as bf16 on the device, and back (bf16 batch norm). */
static void *up_bf16(const float *host, size_t n) {
    uint16_t *b = malloc(sizeof(uint16_t) * n);
    for (size_t i = 0; i < n; i++) b[i] = visc_f32_to_bf16(host[i]);
    void *d = up(b, sizeof(uint16_t) * n);
    free(b);
    return d;
}
static float *down_bf16(const void *d, size_t n) {
    uint16_t *b = malloc(sizeof(uint16_t) * n);
    if (visc_cuda_download(ctx, b, d, sizeof(uint16_t) * n)) die_cuda("download");
    float *out = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) out[i] = visc_bf16_to_f32(b[i]);
    free(b);
    return out;
}

/* A bf16 result against the CPU's fp32 one from the same (bf16) inputs:
 * the fp32 tolerance, then one rounding to bf16 (2^-8 of the value at most). */
static void expect_bf16_of(const char *name, const float *g, const float *c, size_t n) {
    expect_close(name, g, c, n, 1.01e-5 * max_abs(c, n), 1.0 / 256 + 1e-5);
}

/* The context's vector access turned off (visc_cuda_set_vector_access):
 * the checks below then run the kernels' one-value-a-thread forms. */
static int scalar_access;
static void set_scalar_access(int on) {
    scalar_access = on;
    visc_cuda_set_vector_access(ctx, !on);
}

/* The CPU's layer on NCHW; the GPU on NCHW or channels-last (inputs
 * transposed in, outputs back), fp32 or bf16 activations (bf16: the inputs
 * are bf16 values on both sides, the GPU's outputs its rounding of the
 * CPU's). Backward runs on the CPU's forward results on both sides, so a
 * ReLU mask of a value near 0 cannot differ. */
static void check_batchnorm(int N, int C, int HW, int relu, int nchw, float offset, int bf16) {
    char name[260];
    const size_t n = (size_t)N * C * HW;
    float *x = random_floats(n, offset - 1.5f, offset + 1.5f), *dy = random_floats(n, -1, 1);
    if (bf16)
        for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]), dy[i] = bf16_round(dy[i]);
    float *gamma = random_floats((size_t)C, 0.5f, 1.5f), *beta = random_floats((size_t)C, -1, 1);
    float *rm = random_floats((size_t)C, -0.5f, 0.5f), *rv = random_floats((size_t)C, 0.5f, 2);
    float *rm0 = malloc(sizeof(float) * C), *rv0 = malloc(sizeof(float) * C);
    memcpy(rm0, rm, sizeof(float) * C);
    memcpy(rv0, rv, sizeof(float) * C);
    float *out = malloc(sizeof(float) * n), *eval = malloc(sizeof(float) * n);
    float *dx = malloc(sizeof(float) * n), *mean = malloc(sizeof(float) * C);
    float *rstd = malloc(sizeof(float) * C), *dg = malloc(sizeof(float) * C);
    float *db = malloc(sizeof(float) * C);
    visc_batchnorm2d bn;
    visc_batchnorm2d_init(&bn, N, C, HW, 1e-5f, 0.1f, relu);
    visc_batchnorm2d_forward_eval(&bn, eval, x, gamma, beta, rm0, rv0);
    visc_batchnorm2d_forward_train(&bn, out, mean, rstd, x, gamma, beta, rm, rv);
    visc_batchnorm2d_backward(&bn, dx, dg, db, dy, x, out, gamma, mean, rstd);
    visc_batchnorm2d_destroy(&bn);

    /* the GPU's layout */
    float *t = malloc(sizeof(float) * n);
    const float *gx = x, *gdy = dy, *gout = out;
    float *tx = NULL, *tdy = NULL, *tout = NULL;
    if (!nchw) {
        tx = malloc(sizeof(float) * n), tdy = malloc(sizeof(float) * n);
        tout = malloc(sizeof(float) * n);
        to_nhwc(tx, x, N, C, HW), to_nhwc(tdy, dy, N, C, HW), to_nhwc(tout, out, N, C, HW);
        gx = tx, gdy = tdy, gout = tout;
    }
    const visc_cuda_bn_shape s = {N, C, HW, nchw, relu, 1e-5f, 0.1f, bf16};
    const size_t elem = bf16 ? sizeof(uint16_t) : sizeof(float);
    void *d_x = bf16 ? up_bf16(gx, n) : up(gx, sizeof(float) * n);
    void *d_dy = bf16 ? up_bf16(gdy, n) : up(gdy, sizeof(float) * n);
    void *d_out_cpu = bf16 ? up_bf16(gout, n) : up(gout, sizeof(float) * n);
    float *d_g = up(gamma, sizeof(float) * C), *d_b = up(beta, sizeof(float) * C);
    float *d_rm = up(rm0, sizeof(float) * C), *d_rv = up(rv0, sizeof(float) * C);
    float *d_mean_cpu = up(mean, sizeof(float) * C), *d_rstd_cpu = up(rstd, sizeof(float) * C);
    void *d_out = dev(elem * n), *d_eval = dev(elem * n), *d_dx = dev(elem * n);
    float *d_mean = dev(sizeof(float) * C);
    float *d_rstd = dev(sizeof(float) * C), *d_dg = dev(sizeof(float) * C);
    float *d_db = dev(sizeof(float) * C);
    launched(visc_cuda_batchnorm_forward_eval(ctx, &s, d_eval, d_x, d_g, d_b, d_rm, d_rv),
             "batchnorm forward (eval)");
    launched(visc_cuda_batchnorm_forward_train(ctx, &s, d_out, d_mean, d_rstd, d_x, d_g, d_b, d_rm,
                                               d_rv),
             "batchnorm forward (training)");
    launched(visc_cuda_batchnorm_backward(ctx, &s, d_dx, d_dg, d_db, d_dy, d_x, d_out_cpu, d_g, d_b,
                                          d_mean_cpu, d_rstd_cpu),
             "batchnorm backward");
    /* The fused ReLU's mask made again from the statistics (out NULL)
     * instead of read: the bits of reading the GPU forward's own output. */
    void *d_dx_read = dev(elem * n), *d_dx_again = dev(elem * n);
    float *d_grads = dev(sizeof(float) * 4 * C);
    launched(visc_cuda_batchnorm_backward(ctx, &s, d_dx_read, d_grads, d_grads + C, d_dy, d_x,
                                          d_out, d_g, d_b, d_mean, d_rstd),
             "batchnorm backward, the mask read");
    launched(visc_cuda_batchnorm_backward(ctx, &s, d_dx_again, d_grads + 2 * C, d_grads + 3 * C,
                                          d_dy, d_x, NULL, d_g, d_b, d_mean, d_rstd),
             "batchnorm backward, the mask made again");
    float *h_dx_read = bf16 ? down_bf16(d_dx_read, n) : down(d_dx_read, n);
    float *h_dx_again = bf16 ? down_bf16(d_dx_again, n) : down(d_dx_again, n);
    float *h_grads = down(d_grads, 4 * (size_t)C);
    void *dmask[] = {d_dx_read, d_dx_again, d_grads};
    for (size_t i = 0; i < sizeof dmask / sizeof *dmask; i++) visc_cuda_free(ctx, dmask[i]);
    void *d_again = dev(elem * n);
    launched(visc_cuda_batchnorm_apply(ctx, &s, d_again, d_x, d_g, d_b, d_mean, d_rstd),
             "batchnorm output from the saved statistics");
    float *h_again = bf16 ? down_bf16(d_again, n) : down(d_again, n);
    visc_cuda_free(ctx, d_again);
    float *h_out = bf16 ? down_bf16(d_out, n) : down(d_out, n);
    float *h_eval = bf16 ? down_bf16(d_eval, n) : down(d_eval, n);
    float *h_dx = bf16 ? down_bf16(d_dx, n) : down(d_dx, n);
    if (!nchw) {
        float *bufs[] = {h_out, h_eval, h_dx, h_again};
        for (int i = 0; i < 4; i++) {
            to_nchw(t, bufs[i], N, C, HW);
            memcpy(bufs[i], t, sizeof(float) * n);
        }
    }
    float *h_mean = down(d_mean, (size_t)C), *h_rstd = down(d_rstd, (size_t)C);
    float *h_rm = down(d_rm, (size_t)C), *h_rv = down(d_rv, (size_t)C);
    float *h_dg = down(d_dg, (size_t)C), *h_db = down(d_db, (size_t)C);
    char tag[160];
    snprintf(tag, sizeof tag, "batchnorm N %d C %d HW %d%s %s%s mean %g%s", N, C, HW,
             relu ? " + relu" : "", nchw ? "NCHW" : "NHWC", bf16 ? " bf16" : "", offset,
             scalar_access ? ", a value a thread" : "");
    void (*expect_act)(const char *, const float *, const float *, size_t) =
        bf16 ? expect_bf16_of : expect_fp32;
    snprintf(name, sizeof name, "%s: eval forward", tag);
    expect_act(name, h_eval, eval, n);
    snprintf(name, sizeof name, "%s: training forward", tag);
    expect_act(name, h_out, out, n);
    snprintf(name, sizeof name, "%s: the output again from the saved statistics, same bits", tag);
    expect_bits(name, h_again, h_out, n, sizeof(float));
    free(h_again);
    snprintf(name, sizeof name, "%s: saved mean, rstd", tag);
    expect_fp32(name, h_mean, mean, (size_t)C);
    expect_fp32(name, h_rstd, rstd, (size_t)C);
    snprintf(name, sizeof name, "%s: running mean, var", tag);
    expect_fp32(name, h_rm, rm, (size_t)C);
    expect_fp32(name, h_rv, rv, (size_t)C);
    snprintf(name, sizeof name, "%s: backward din", tag);
    expect_act(name, h_dx, dx, n);
    snprintf(name, sizeof name, "%s: backward, the ReLU's mask made again: the read one's bits",
             tag);
    expect_bits(name, h_dx_again, h_dx_read, n, sizeof(float));
    expect_bits(name, h_grads + 2 * C, h_grads, 2 * (size_t)C, sizeof(float));
    free(h_dx_read), free(h_dx_again), free(h_grads);
    expect_bn_param_grads(tag, h_dg, h_db, dg, db, x, dy, out, mean, rstd, N, C, HW, relu);
    void *dfree[] = {d_x,        d_dy,  d_out_cpu, d_g,  d_b,    d_rm,   d_rv, d_mean_cpu,
                     d_rstd_cpu, d_out, d_eval,    d_dx, d_mean, d_rstd, d_dg, d_db};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x,      dy,   gamma,  beta,   rm,   rv,   rm0,  rv0, out,  eval,
                     dx,     mean, rstd,   dg,     db,   t,    tx,   tdy, tout, h_out,
                     h_eval, h_dx, h_mean, h_rstd, h_rm, h_rv, h_dg, h_db};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* SyncBN's passes (visc_cuda_bn_sync_*) on two halves of a batch, their
 * sums added between the passes as two processes' would be: the halves'
 * results must be the CPU's BatchNorm over the whole batch (outputs,
 * saved and running statistics, din; dgamma and dbeta as the halves'
 * sum). */
static void check_batchnorm_sync(int N, int C, int HW, int relu, int bf16) {
    char name[200], tag[96];
    const size_t n = (size_t)N * C * HW, half = n / 2;
    float *x = random_floats(n, -1.5f, 1.5f), *dy = random_floats(n, -1, 1);
    if (bf16)
        for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]), dy[i] = bf16_round(dy[i]);
    float *gamma = random_floats((size_t)C, 0.5f, 1.5f), *beta = random_floats((size_t)C, -1, 1);
    float *rm = random_floats((size_t)C, -0.5f, 0.5f), *rv = random_floats((size_t)C, 0.5f, 2);
    float *rm_gpu = malloc(sizeof(float) * C), *rv_gpu = malloc(sizeof(float) * C);
    memcpy(rm_gpu, rm, sizeof(float) * C);
    memcpy(rv_gpu, rv, sizeof(float) * C);
    float *out = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    float *mean = malloc(sizeof(float) * C), *rstd = malloc(sizeof(float) * C);
    float *dg = malloc(sizeof(float) * C), *db = malloc(sizeof(float) * C);
    visc_batchnorm2d bn;
    visc_batchnorm2d_init(&bn, N, C, HW, 1e-5f, 0.1f, relu);
    visc_batchnorm2d_forward_train(&bn, out, mean, rstd, x, gamma, beta, rm, rv);
    visc_batchnorm2d_backward(&bn, dx, dg, db, dy, x, out, gamma, mean, rstd);
    visc_batchnorm2d_destroy(&bn);

    /* bf16: channels-last bf16 halves (each half's images are contiguous
     * in either layout) */
    const visc_cuda_bn_shape s = {N / 2, C, HW, !bf16, relu, 1e-5f, 0.1f, bf16};
    const size_t elem = bf16 ? sizeof(uint16_t) : sizeof(float);
    float *gx = x, *gdy = dy, *gout = out;
    if (bf16) {
        gx = malloc(sizeof(float) * n), gdy = malloc(sizeof(float) * n);
        gout = malloc(sizeof(float) * n);
        to_nhwc(gx, x, N, C, HW), to_nhwc(gdy, dy, N, C, HW), to_nhwc(gout, out, N, C, HW);
    }
    const size_t accn = 2 * (size_t)C + 1;
    double *acc[2] = {calloc(accn, sizeof(double)), calloc(accn, sizeof(double))};
    void *d_x[2], *d_dy[2], *d_out[2], *d_dx[2];
    float *d_mean[2], *d_rstd[2], *d_dg[2], *d_db[2];
    float *d_rm[2], *d_rv[2];
    float *d_g = up(gamma, sizeof(float) * C), *d_b = up(beta, sizeof(float) * C);
    for (int h = 0; h < 2; h++) {
        d_x[h] = bf16 ? up_bf16(gx + h * half, half) : up(x + h * half, sizeof(float) * half);
        d_dy[h] = bf16 ? up_bf16(gdy + h * half, half) : up(dy + h * half, sizeof(float) * half);
        d_out[h] = dev(elem * half), d_dx[h] = dev(elem * half);
        d_mean[h] = dev(sizeof(float) * C), d_rstd[h] = dev(sizeof(float) * C);
        d_dg[h] = dev(sizeof(float) * C), d_db[h] = dev(sizeof(float) * C);
        d_rm[h] = up(rm_gpu, sizeof(float) * C), d_rv[h] = up(rv_gpu, sizeof(float) * C);
    }
    /* (the reduction: each half's acc[lo, hi) becomes the two halves' sum) */
#define REDUCE(lo, hi)                                                                             \
    for (size_t i = (lo); i < (hi); i++) acc[0][i] = acc[1][i] = acc[0][i] + acc[1][i]
    for (int h = 0; h < 2; h++)
        launched(visc_cuda_bn_sync_sums(ctx, &s, acc[h], d_x[h]), "SyncBN sums");
    REDUCE(0, (size_t)C + 1);
    for (int h = 0; h < 2; h++)
        launched(visc_cuda_bn_sync_sqdev(ctx, &s, acc[h], d_mean[h], d_x[h]),
                 "SyncBN squared deviations");
    REDUCE((size_t)C + 1, accn);
    for (int h = 0; h < 2; h++)
        launched(visc_cuda_bn_sync_finish(ctx, &s, acc[h], d_out[h], d_mean[h], d_rstd[h], d_x[h],
                                          d_g, d_b, d_rm[h], d_rv[h]),
                 "SyncBN forward");
    void *d_out_cpu[2];
    for (int h = 0; h < 2; h++)
        d_out_cpu[h] =
            bf16 ? up_bf16(gout + h * half, half) : up(out + h * half, sizeof(float) * half);
    for (int h = 0; h < 2; h++)
        launched(visc_cuda_bn_sync_grad_sums(ctx, &s, acc[h], d_dg[h], d_db[h], d_dy[h], d_x[h],
                                             d_out_cpu[h], d_mean[h], d_rstd[h]),
                 "SyncBN gradient sums");
    REDUCE(0, accn);
#undef REDUCE
    for (int h = 0; h < 2; h++)
        launched(visc_cuda_bn_sync_grad_input(ctx, &s, acc[h], d_dx[h], d_dy[h], d_x[h],
                                              d_out_cpu[h], d_g, d_mean[h], d_rstd[h]),
                 "SyncBN backward");
    float *h_out = malloc(sizeof(float) * n), *h_dx = malloc(sizeof(float) * n);
    float *h_dg = calloc((size_t)C, sizeof(float)), *h_db = calloc((size_t)C, sizeof(float));
    for (int h = 0; h < 2; h++) {
        float *o = bf16 ? down_bf16(d_out[h], half) : down(d_out[h], half);
        float *g = bf16 ? down_bf16(d_dx[h], half) : down(d_dx[h], half);
        float *pg = down(d_dg[h], (size_t)C), *pb = down(d_db[h], (size_t)C);
        void *d_again = dev(elem * half);
        launched(visc_cuda_batchnorm_apply(ctx, &s, d_again, d_x[h], d_g, d_b, d_mean[h],
                                           d_rstd[h]),
                 "batchnorm output from the saved statistics");
        float *again = bf16 ? down_bf16(d_again, half) : down(d_again, half);
        snprintf(name, sizeof name,
                 "SyncBN C %d HW %d%s%s half %d: the output again from the saved statistics, "
                 "same bits",
                 C, HW, relu ? " + relu" : "", bf16 ? " NHWC bf16" : "", h);
        expect_bits(name, again, o, half, sizeof(float));
        visc_cuda_free(ctx, d_again), free(again);
        memcpy(h_out + h * half, o, sizeof(float) * half);
        memcpy(h_dx + h * half, g, sizeof(float) * half);
        for (int c = 0; c < C; c++) h_dg[c] += pg[c], h_db[c] += pb[c];
        free(o), free(g), free(pg), free(pb);
    }
    if (bf16) { /* back to NCHW */
        to_nchw(gx, h_out, N, C, HW), memcpy(h_out, gx, sizeof(float) * n);
        to_nchw(gx, h_dx, N, C, HW), memcpy(h_dx, gx, sizeof(float) * n);
    }
    float *h_mean = down(d_mean[1], (size_t)C), *h_rstd = down(d_rstd[1], (size_t)C);
    float *h_rm = down(d_rm[1], (size_t)C), *h_rv = down(d_rv[1], (size_t)C);
    snprintf(tag, sizeof tag, "SyncBN N %d (2 x %d) C %d HW %d%s%s", N, N / 2, C, HW,
             relu ? " + relu" : "", bf16 ? " NHWC bf16" : "");
    void (*expect_act)(const char *, const float *, const float *, size_t) =
        bf16 ? expect_bf16_of : expect_fp32;
    snprintf(name, sizeof name, "%s: training forward", tag);
    expect_act(name, h_out, out, n);
    snprintf(name, sizeof name, "%s: saved mean, rstd", tag);
    expect_fp32(name, h_mean, mean, (size_t)C);
    expect_fp32(name, h_rstd, rstd, (size_t)C);
    snprintf(name, sizeof name, "%s: running mean, var", tag);
    expect_fp32(name, h_rm, rm, (size_t)C);
    expect_fp32(name, h_rv, rv, (size_t)C);
    snprintf(name, sizeof name, "%s: backward din", tag);
    expect_act(name, h_dx, dx, n);
    expect_bn_param_grads(tag, h_dg, h_db, dg, db, x, dy, out, mean, rstd, N, C, HW, relu);
    for (int h = 0; h < 2; h++) {
        void *dfree[] = {d_x[h],  d_dy[h], d_out[h], d_dx[h], d_mean[h],   d_rstd[h],
                         d_dg[h], d_db[h], d_rm[h],  d_rv[h], d_out_cpu[h]};
        for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
        free(acc[h]);
    }
    visc_cuda_free(ctx, d_g), visc_cuda_free(ctx, d_b);
    if (bf16) free(gx), free(gdy), free(gout);
    void *hfree[] = {x,    dy, gamma, beta,  rm,   rv,   rm_gpu, rv_gpu, out,    dx,   mean,
                     rstd, dg, db,    h_out, h_dx, h_dg, h_db,   h_mean, h_rstd, h_rm, h_rv};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* The statistics of values around a mean far larger than their spread
 * (1e6 +- 1.5 in fp32), against a two-pass long double reference: the
 * forward's one pass sums them shifted by one of them, where E[x^2] -
 * mean^2 in double would be off by about 1e-4 of the variance. */
static void check_batchnorm_moments(int N, int C, int HW, int nchw) {
    char name[160];
    const size_t n = (size_t)N * C * HW, M = (size_t)N * HW;
    float *x = random_floats(n, 1e6f - 1.5f, 1e6f + 1.5f);
    float *ones = malloc(sizeof(float) * C), *zeros = calloc((size_t)C, sizeof(float));
    for (int c = 0; c < C; c++) ones[c] = 1.0f;
    float *want_mean = malloc(sizeof(float) * C), *want_rstd = malloc(sizeof(float) * C);
    for (int c = 0; c < C; c++) {
        long double sum = 0, ss = 0;
        for (size_t m = 0; m < M; m++) sum += x[nchw ? (m / HW * C + c) * HW + m % HW : m * C + c];
        const long double mean = sum / M;
        for (size_t m = 0; m < M; m++) {
            const long double d = x[nchw ? (m / HW * C + c) * HW + m % HW : m * C + c] - mean;
            ss += d * d;
        }
        want_mean[c] = (float)mean;
        want_rstd[c] = (float)(1.0L / sqrtl(ss / M + 1e-5L));
    }
    const visc_cuda_bn_shape s = {N, C, HW, nchw, 0, 1e-5f, 0.1f, 0};
    float *d_x = up(x, sizeof(float) * n), *d_y = dev(sizeof(float) * n);
    float *d_g = up(ones, sizeof(float) * C), *d_b = up(zeros, sizeof(float) * C);
    float *d_mean = dev(sizeof(float) * C), *d_rstd = dev(sizeof(float) * C);
    launched(visc_cuda_batchnorm_forward_train(ctx, &s, d_y, d_mean, d_rstd, d_x, d_g, d_b, NULL,
                                               NULL),
             "batchnorm forward (training)");
    float *h_mean = down(d_mean, (size_t)C), *h_rstd = down(d_rstd, (size_t)C);
    snprintf(name, sizeof name, "batchnorm moments at mean 1e6 %s: mean, rstd against long double",
             nchw ? "NCHW" : "NHWC");
    expect_close(name, h_mean, want_mean, (size_t)C, 0.0, 1e-7);
    expect_close(name, h_rstd, want_rstd, (size_t)C, 0.0, 1e-6);
    void *dfree[] = {d_x, d_y, d_g, d_b, d_mean, d_rstd};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, ones, zeros, want_mean, want_rstd, h_mean, h_rstd};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* A ResNet block's last norm with its residual sum (and ReLU) in the
 * output pass: the bits of the norm's own output, stored, then the sum
 * (as visc_cuda_add_relu* computes it), in training and in evaluation;
 * the same statistics, saved and running, as the norm alone. */
static void check_batchnorm_residual(int N, int C, int HW, int nchw, int relu, int bf16) {
    char name[260];
    const size_t n = (size_t)N * C * HW, elem = bf16 ? sizeof(uint16_t) : sizeof(float);
    float *x = random_floats(n, 2.0f, 5.0f), *r = random_floats(n, -3, 3);
    float *gamma = random_floats((size_t)C, 0.5f, 1.5f), *beta = random_floats((size_t)C, -1, 1);
    float *rm = random_floats((size_t)C, -0.5f, 0.5f), *rv = random_floats((size_t)C, 0.5f, 2);
    void *d_x = bf16 ? up_bf16(x, n) : up(x, sizeof(float) * n);
    void *d_r = bf16 ? up_bf16(r, n) : up(r, sizeof(float) * n);
    float *d_g = up(gamma, sizeof(float) * C), *d_b = up(beta, sizeof(float) * C);
    float *d_rm[2], *d_rv[2], *d_mean[2], *d_rstd[2];
    for (int k = 0; k < 2; k++) {
        d_rm[k] = up(rm, sizeof(float) * C), d_rv[k] = up(rv, sizeof(float) * C);
        d_mean[k] = dev(sizeof(float) * C), d_rstd[k] = dev(sizeof(float) * C);
    }
    void *d_y = dev(elem * n), *d_ye = dev(elem * n), *d_z = dev(elem * n), *d_ze = dev(elem * n);
    const visc_cuda_bn_shape alone = {N, C, HW, nchw, 0, 1e-5f, 0.1f, bf16};
    visc_cuda_bn_shape fused = alone;
    fused.relu = relu;
    launched(visc_cuda_batchnorm_forward_train(ctx, &alone, d_y, d_mean[0], d_rstd[0], d_x, d_g,
                                               d_b, d_rm[0], d_rv[0]),
             "batchnorm forward (training)");
    launched(visc_cuda_batchnorm_forward_eval(ctx, &alone, d_ye, d_x, d_g, d_b, d_rm[1], d_rv[1]),
             "batchnorm forward (eval)");
    launched(visc_cuda_batchnorm_forward_eval_add(ctx, &fused, d_ze, d_x, d_r, d_g, d_b, d_rm[1],
                                                  d_rv[1]),
             "batchnorm + residual forward (eval)");
    launched(visc_cuda_batchnorm_forward_train_add(ctx, &fused, d_z, d_mean[1], d_rstd[1], d_x, d_r,
                                                   d_g, d_b, d_rm[1], d_rv[1]),
             "batchnorm + residual forward (training)");
    float *h_y = bf16 ? down_bf16(d_y, n) : down(d_y, n);
    float *h_ye = bf16 ? down_bf16(d_ye, n) : down(d_ye, n);
    float *h_z = bf16 ? down_bf16(d_z, n) : down(d_z, n);
    float *h_ze = bf16 ? down_bf16(d_ze, n) : down(d_ze, n);
    float *rr = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) rr[i] = bf16 ? bf16_round(r[i]) : r[i];
    float *want[2] = {h_y, h_ye}, *got[2] = {h_z, h_ze};
    const char *mode[2] = {"training", "eval"};
    char tag[160];
    snprintf(tag, sizeof tag, "batchnorm + residual%s N %d C %d HW %d %s%s%s",
             relu ? " + relu" : "", N, C, HW, nchw ? "NCHW" : "NHWC", bf16 ? " bf16" : "",
             scalar_access ? ", a value a thread" : "");
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < n; i++) { /* models/resnet.c's add_relu on the stored output */
            const float v = want[k][i] + rr[i];
            want[k][i] = relu && !(v > 0.0f) ? 0.0f : bf16 ? bf16_round(v) : v;
        }
        snprintf(name, sizeof name, "%s: %s output, bit-identical to the two passes", tag, mode[k]);
        expect_bits(name, got[k], want[k], n, sizeof(float));
    }
    float *stats[2][4];
    for (int k = 0; k < 2; k++) {
        stats[k][0] = down(d_mean[k], (size_t)C), stats[k][1] = down(d_rstd[k], (size_t)C);
        stats[k][2] = down(d_rm[k], (size_t)C), stats[k][3] = down(d_rv[k], (size_t)C);
    }
    snprintf(name, sizeof name, "%s: saved and running statistics, bit-identical", tag);
    for (int j = 0; j < 4; j++)
        expect_bits(name, stats[1][j], stats[0][j], (size_t)C, sizeof(float));
    void *dfree[] = {d_x,       d_r,       d_g,       d_b,       d_rm[0], d_rm[1], d_rv[0], d_rv[1],
                     d_mean[0], d_mean[1], d_rstd[0], d_rstd[1], d_y,     d_ye,    d_z,     d_ze};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, r, gamma, beta, rm, rv, h_y, h_ye, h_z, h_ze, rr};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++) free(stats[k][j]);
}

/* A downsampling block's end, its shortcut norm applied in the end's pass
 * (visc_cuda_batchnorm_statistics, then ..._add_norm): the bits of the
 * shortcut norm's output written by its own pass and the end reading it
 * back (..._add), in training and in evaluation, with the same saved and
 * running statistics of both norms. */
static void check_batchnorm_residual_norm(int N, int C, int HW, int nchw, int bf16) {
    char name[260], tag[160];
    const size_t n = (size_t)N * C * HW, elem = bf16 ? sizeof(uint16_t) : sizeof(float);
    float *x = random_floats(n, 2.0f, 5.0f), *xd = random_floats(n, -3.0f, 1.0f);
    float *par = random_floats(4 * (size_t)C, 0.5f, 1.5f); /* gamma, beta, then the shortcut's */
    float *rm = random_floats(2 * (size_t)C, -0.5f, 0.5f),
          *rv = random_floats(2 * (size_t)C, 0.5f, 2);
    void *d_x = bf16 ? up_bf16(x, n) : up(x, sizeof(float) * n);
    void *d_xd = bf16 ? up_bf16(xd, n) : up(xd, sizeof(float) * n);
    float *d_par = up(par, sizeof(float) * 4 * C);
    /* [k]: 0 the two passes, 1 the fused; each: mean, rstd, running mean,
     * running var of the end's norm [0, C) and the shortcut's [C, 2C) */
    float *d_st[2][4];
    for (int k = 0; k < 2; k++) {
        d_st[k][0] = dev(sizeof(float) * 2 * C), d_st[k][1] = dev(sizeof(float) * 2 * C);
        d_st[k][2] = up(rm, sizeof(float) * 2 * C), d_st[k][3] = up(rv, sizeof(float) * 2 * C);
    }
    void *d_t = dev(elem * n), *d_out[2][2]; /* [training, eval][passes, fused] */
    for (int m = 0; m < 2; m++) d_out[m][0] = dev(elem * n), d_out[m][1] = dev(elem * n);
    const visc_cuda_bn_shape sc = {N, C, HW, nchw, 0, 1e-5f, 0.1f, bf16};
    visc_cuda_bn_shape end = sc;
    end.relu = 1;
    const float *g = d_par, *b = d_par + C, *gd = d_par + 2 * C, *bd = d_par + 3 * C;
    /* training: the two passes, then the fused */
    launched(visc_cuda_batchnorm_forward_train(ctx, &sc, d_t, d_st[0][0] + C, d_st[0][1] + C, d_xd,
                                               gd, bd, d_st[0][2] + C, d_st[0][3] + C),
             "shortcut batchnorm forward (training)");
    launched(visc_cuda_batchnorm_forward_train_add(ctx, &end, d_out[0][0], d_st[0][0], d_st[0][1],
                                                   d_x, d_t, g, b, d_st[0][2], d_st[0][3]),
             "batchnorm + residual forward (training)");
    launched(visc_cuda_batchnorm_statistics(ctx, &sc, d_st[1][0] + C, d_st[1][1] + C, d_xd,
                                            d_st[1][2] + C, d_st[1][3] + C),
             "shortcut batchnorm statistics");
    const visc_cuda_bn_residual rn = {d_xd, d_st[1][0] + C, d_st[1][1] + C, NULL, NULL, gd, bd,
                                      0.0f};
    launched(visc_cuda_batchnorm_forward_train_add_norm(ctx, &end, d_out[0][1], d_st[1][0],
                                                        d_st[1][1], d_x, &rn, g, b, d_st[1][2],
                                                        d_st[1][3]),
             "batchnorm + residual norm forward (training)");
    /* evaluation, from the running statistics the training updated */
    launched(visc_cuda_batchnorm_forward_eval(ctx, &sc, d_t, d_xd, gd, bd, d_st[0][2] + C,
                                              d_st[0][3] + C),
             "shortcut batchnorm forward (eval)");
    launched(visc_cuda_batchnorm_forward_eval_add(ctx, &end, d_out[1][0], d_x, d_t, g, b,
                                                  d_st[0][2], d_st[0][3]),
             "batchnorm + residual forward (eval)");
    const visc_cuda_bn_residual rne = {d_xd,           NULL, NULL, d_st[1][2] + C,
                                       d_st[1][3] + C, gd,   bd,   1e-5f};
    launched(visc_cuda_batchnorm_forward_eval_add_norm(ctx, &end, d_out[1][1], d_x, &rne, g, b,
                                                       d_st[1][2], d_st[1][3]),
             "batchnorm + residual norm forward (eval)");
    snprintf(tag, sizeof tag, "batchnorm + shortcut norm + relu N %d C %d HW %d %s%s%s", N, C, HW,
             nchw ? "NCHW" : "NHWC", bf16 ? " bf16" : "",
             scalar_access ? ", a value a thread" : "");
    const char *mode[2] = {"training", "eval"};
    for (int m = 0; m < 2; m++) {
        float *want = bf16 ? down_bf16(d_out[m][0], n) : down(d_out[m][0], n);
        float *got = bf16 ? down_bf16(d_out[m][1], n) : down(d_out[m][1], n);
        snprintf(name, sizeof name, "%s: %s output, bit-identical to the shortcut's written", tag,
                 mode[m]);
        expect_bits(name, got, want, n, sizeof(float));
        free(want), free(got);
    }
    const char *stat[4] = {"saved means", "saved rstds", "running means", "running variances"};
    for (int j = 0; j < 4; j++) {
        snprintf(name, sizeof name, "%s: both norms' %s, bit-identical", tag, stat[j]);
        float *want = down(d_st[0][j], 2 * (size_t)C), *got = down(d_st[1][j], 2 * (size_t)C);
        expect_bits(name, got, want, 2 * (size_t)C, sizeof(float));
        free(want), free(got);
    }
    /* a residual norm without its statistics is refused */
    const visc_cuda_bn_residual none = {d_xd, NULL, NULL, NULL, NULL, gd, bd, 0.0f};
    const int rc =
        visc_cuda_batchnorm_forward_train_add_norm(ctx, &end, d_out[0][1], d_st[1][0], d_st[1][1],
                                                   d_x, &none, g, b, NULL, NULL);
    report("batchnorm + residual norm: one without statistics is refused", rc == -1 ? 0 : 1, 1, 0,
           rc, -1, 0.0);
    void *dfree[] = {d_x, d_xd, d_par, d_t, d_out[0][0], d_out[0][1], d_out[1][0], d_out[1][1]};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++) visc_cuda_free(ctx, d_st[k][j]);
    free(x), free(xd), free(par), free(rm), free(rv);
}

/* ---- pooling and ReLU: bit-identical ---- */
/* Inputs from {0, 1, 2, 3} make ties in nearly every window, so the
 * first-maximum rule shows; nan_every > 0 puts a NaN at every such index. */
static void check_maxpool(int N, int C, int H, int W, int k, int s, int pad, int ties,
                          int nan_every) {
    char name[160];
    visc_pool2d p;
    visc_pool2d_init(&p, N, C, H, W, k, s, pad);
    const size_t n = (size_t)N * C * H * W, m = (size_t)N * C * p.P * p.Q;
    float *x = random_floats(n, -4, 4), *dy = random_floats(m, -1, 1);
    for (size_t i = 0; i < n; i++) {
        if (ties) x[i] = (float)(next_u64() % 4);
        if (nan_every && i % (size_t)nan_every == 7) x[i] = NAN;
    }
    float *y = malloc(sizeof(float) * m), *dx = malloc(sizeof(float) * n);
    int32_t *am = malloc(sizeof(int32_t) * m);
    visc_maxpool2d_forward(&p, y, am, x);
    visc_maxpool2d_backward(&p, dx, dy, am);
    float *d_x = up(x, sizeof(float) * n), *d_dy = up(dy, sizeof(float) * m);
    int32_t *d_am_cpu = up(am, sizeof(int32_t) * m), *d_am = dev(sizeof(int32_t) * m);
    float *d_y = dev(sizeof(float) * m), *d_dx = dev(sizeof(float) * n);
    launched(visc_cuda_maxpool_forward(ctx, d_y, d_am, d_x, N, C, H, W, k, s, pad),
             "max pooling forward");
    launched(visc_cuda_maxpool_backward(ctx, d_dx, d_dy, d_am_cpu, N, C, H, W, k, s, pad),
             "max pooling backward");
    float *h_y = down(d_y, m), *h_dx = down(d_dx, n);
    int32_t *h_am = malloc(sizeof(int32_t) * m);
    if (visc_cuda_download(ctx, h_am, d_am, sizeof(int32_t) * m)) die_cuda("download");
    char tag[120];
    snprintf(tag, sizeof tag, "maxpool N %d C %d %dx%d, %dx%d/%d pad %d%s%s", N, C, H, W, k, k, s,
             pad, ties ? ", ties" : "", nan_every ? ", NaNs" : "");
    snprintf(name, sizeof name, "%s: forward, bit-identical", tag);
    expect_bits(name, h_y, y, m, sizeof(float));
    /* as floats (exact below 2^24), so that a mismatch prints the indices */
    float *fam = malloc(sizeof(float) * m), *fh_am = malloc(sizeof(float) * m);
    for (size_t i = 0; i < m; i++) fam[i] = (float)am[i], fh_am[i] = (float)h_am[i];
    snprintf(name, sizeof name, "%s: argmax, identical", tag);
    expect_bits(name, fh_am, fam, m, sizeof(float));
    free(fam);
    free(fh_am);
    snprintf(name, sizeof name, "%s: backward, bit-identical", tag);
    expect_bits(name, h_dx, dx, n, sizeof(float));
    void *dfree[] = {d_x, d_dy, d_am_cpu, d_am, d_y, d_dx};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, dy, y, dx, am, h_y, h_dx, h_am};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

static void check_global_avgpool(int N, int C, int HW) {
    char name[128];
    const size_t n = (size_t)N * C * HW, m = (size_t)N * C;
    float *x = random_floats(n, -3, 3), *dy = random_floats(m, -1, 1);
    float *y = malloc(sizeof(float) * m), *dx = malloc(sizeof(float) * n);
    visc_global_avgpool_forward(y, x, N, C, HW);
    visc_global_avgpool_backward(dx, dy, N, C, HW);
    float *d_x = up(x, sizeof(float) * n), *d_dy = up(dy, sizeof(float) * m);
    float *d_y = dev(sizeof(float) * m), *d_dx = dev(sizeof(float) * n);
    launched(visc_cuda_global_avgpool_forward(ctx, d_y, d_x, N, C, HW), "global avgpool forward");
    launched(visc_cuda_global_avgpool_backward(ctx, d_dx, d_dy, N, C, HW),
             "global avgpool backward");
    float *h_y = down(d_y, m), *h_dx = down(d_dx, n);
    snprintf(name, sizeof name, "global avgpool N %d C %d HW %d: forward, bit-identical", N, C, HW);
    expect_bits(name, h_y, y, m, sizeof(float));
    snprintf(name, sizeof name, "global avgpool N %d C %d HW %d: backward, bit-identical", N, C,
             HW);
    expect_bits(name, h_dx, dx, n, sizeof(float));
    void *dfree[] = {d_x, d_dy, d_y, d_dx};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, dy, y, dx, h_y, h_dx};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* The poolings on bf16 channels-last tensors against the CPU's NCHW fp32
 * layers on the same (bf16) values: max pooling's outputs and argmax
 * identical, its backward and global average pooling's the CPU's fp32
 * results (the same sums in the same order) rounded to bf16 where the
 * output is bf16, bit for bit. */
static void check_pool_nhwc_bf16(int N, int C, int H, int W, int k, int s, int pad, int ties) {
    char name[200], tag[120];
    visc_pool2d p;
    visc_pool2d_init(&p, N, C, H, W, k, s, pad);
    const int PQ = p.P * p.Q;
    const size_t n = (size_t)N * C * H * W, m = (size_t)N * C * PQ, nf = (size_t)N * C;
    float *x = random_floats(n, -4, 4), *dy = random_floats(m, -1, 1);
    float *gdy = random_floats(nf, -1, 1);
    for (size_t i = 0; i < n; i++) x[i] = ties ? (float)(next_u64() % 4) : bf16_round(x[i]);
    for (size_t i = 0; i < m; i++) dy[i] = bf16_round(dy[i]);
    float *y = malloc(sizeof(float) * m), *dx = malloc(sizeof(float) * n);
    float *feat = malloc(sizeof(float) * nf), *gdx = malloc(sizeof(float) * n);
    int32_t *am = malloc(sizeof(int32_t) * m);
    visc_maxpool2d_forward(&p, y, am, x);
    visc_maxpool2d_backward(&p, dx, dy, am);
    visc_global_avgpool_forward(feat, x, N, C, H * W);
    visc_global_avgpool_backward(gdx, gdy, N, C, H * W);
    visc_pool2d_destroy(&p);
    for (size_t i = 0; i < n; i++) dx[i] = bf16_round(dx[i]), gdx[i] = bf16_round(gdx[i]);
    /* the device's layout: channels-last, argmax per channel */
    float *tx = malloc(sizeof(float) * n), *tdy = malloc(sizeof(float) * m);
    int32_t *t_am = malloc(sizeof(int32_t) * m);
    to_nhwc(tx, x, N, C, H * W), to_nhwc(tdy, dy, N, C, PQ);
    for (int b = 0; b < N; b++)
        for (int c = 0; c < C; c++)
            for (int i = 0; i < PQ; i++)
                t_am[((size_t)b * PQ + i) * C + c] = am[((size_t)b * C + c) * PQ + i];
    void *d_x = up_bf16(tx, n), *d_dy = up_bf16(tdy, m);
    int32_t *d_am = dev(sizeof(int32_t) * m), *d_am_cpu = up(t_am, sizeof(int32_t) * m);
    void *d_y = dev(sizeof(uint16_t) * m), *d_dx = dev(sizeof(uint16_t) * n);
    float *d_feat = dev(sizeof(float) * nf), *d_gdy = up(gdy, sizeof(float) * nf);
    void *d_gdx = dev(sizeof(uint16_t) * n);
    launched(visc_cuda_maxpool_forward_nhwc_bf16(ctx, d_y, d_am, d_x, N, C, H, W, k, s, pad),
             "max pooling forward (bf16 NHWC)");
    launched(visc_cuda_maxpool_backward_nhwc_bf16(ctx, d_dx, d_dy, d_am_cpu, N, C, H, W, k, s, pad),
             "max pooling backward (bf16 NHWC)");
    launched(visc_cuda_global_avgpool_forward_nhwc_bf16(ctx, d_feat, d_x, N, C, H * W),
             "global avgpool forward (bf16 NHWC)");
    launched(visc_cuda_global_avgpool_backward_nhwc_bf16(ctx, d_gdx, d_gdy, N, C, H * W),
             "global avgpool backward (bf16 NHWC)");
    float *h_y = malloc(sizeof(float) * m), *h_dx = malloc(sizeof(float) * n);
    float *h_gdx = malloc(sizeof(float) * n);
    float *t = down_bf16(d_y, m);
    to_nchw(h_y, t, N, C, PQ);
    free(t);
    t = down_bf16(d_dx, n);
    to_nchw(h_dx, t, N, C, H * W);
    free(t);
    t = down_bf16(d_gdx, n);
    to_nchw(h_gdx, t, N, C, H * W);
    free(t);
    float *h_feat = down(d_feat, nf);
    int32_t *h_am = malloc(sizeof(int32_t) * m);
    if (visc_cuda_download(ctx, h_am, d_am, sizeof(int32_t) * m)) die_cuda("download");
    float *fam = malloc(sizeof(float) * m), *fh_am = malloc(sizeof(float) * m);
    for (size_t i = 0; i < m; i++) fam[i] = (float)t_am[i], fh_am[i] = (float)h_am[i];
    snprintf(tag, sizeof tag, "pooling bf16 NHWC N %d C %d %dx%d, %dx%d/%d pad %d%s", N, C, H, W, k,
             k, s, pad, ties ? ", ties" : "");
    snprintf(name, sizeof name, "%s: max forward, bit-identical", tag);
    expect_bits(name, h_y, y, m, sizeof(float));
    snprintf(name, sizeof name, "%s: argmax, identical", tag);
    expect_bits(name, fh_am, fam, m, sizeof(float));
    snprintf(name, sizeof name, "%s: max backward, bit-identical", tag);
    expect_bits(name, h_dx, dx, n, sizeof(float));
    snprintf(name, sizeof name, "%s: global average forward (fp32), bit-identical", tag);
    expect_bits(name, h_feat, feat, nf, sizeof(float));
    snprintf(name, sizeof name, "%s: global average backward, bit-identical", tag);
    expect_bits(name, h_gdx, gdx, n, sizeof(float));
    void *dfree[] = {d_x, d_dy, d_am, d_am_cpu, d_y, d_dx, d_feat, d_gdy, d_gdx};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x,   dy,   gdy, y,    dx,    feat,   gdx,  am,  tx,
                     tdy, t_am, h_y, h_dx, h_gdx, h_feat, h_am, fam, fh_am};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* Exact zeros and a NaN among the inputs: ReLU(0) = 0 with gradient 0, NaN stays NaN. */
static void check_relu(size_t n) {
    char name[128];
    float *x = random_floats(n, -2, 2), *dy = random_floats(n, -1, 1);
    for (size_t i = 0; i < n; i += 97) x[i] = 0.0f;
    x[5] = NAN;
    float *y = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    visc_relu_forward(y, x, n);
    visc_relu_backward(dx, dy, y, n);
    float *d_x = up(x, sizeof(float) * n), *d_dy = up(dy, sizeof(float) * n);
    float *d_y = dev(sizeof(float) * n), *d_dx = dev(sizeof(float) * n);
    launched(visc_cuda_relu_forward(ctx, d_y, d_x, n), "relu forward");
    launched(visc_cuda_relu_backward(ctx, d_dx, d_dy, d_y, n), "relu backward");
    float *h_y = down(d_y, n), *h_dx = down(d_dx, n);
    snprintf(name, sizeof name, "relu [%zu]: forward, bit-identical", n);
    expect_bits(name, h_y, y, n, sizeof(float));
    snprintf(name, sizeof name, "relu [%zu]: backward, bit-identical", n);
    expect_bits(name, h_dx, dx, n, sizeof(float));
    void *dfree[] = {d_x, d_dy, d_y, d_dx};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, dy, y, dx, h_y, h_dx};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* ---- the linear layer, fp32 and bf16 ----
 * Against double-precision products of the same operands: |gpu - exact| <=
 * 3e-5 x sum_k |a_k b_k| (fp32 accumulation only: cuBLASLt is held to
 * CUBLAS_COMPUTE_32F, no TF32, which would miss this by 100x). In bf16 the
 * operands of the products are X, W and dY rounded to bf16 (the bias
 * gradient sums dY itself), and the bound is the matmul's 1e-4. */
typedef struct {
    size_t bad, worst, n;
    double worst_ratio, got, want, tol;
} tally;

static void tally_add(tally *t, double got, double exact, double mag) {
    const double ratio = fabs(got - exact) / (t->tol * mag + 1e-30);
    if (!(ratio <= 1.0)) t->bad++;
    if (!(ratio <= t->worst_ratio)) {
        t->worst_ratio = ratio;
        t->worst = t->n;
        t->got = got;
        t->want = exact;
    }
    t->n++;
}

/* A linear layer's bias gradient db [out]: the column sums of dy [N, out]. */
static void tally_bias_grad(tally *t, const float *db, const float *dy, int N, int out) {
    for (int o = 0; o < out; o++) {
        double sum = 0, mag = 0;
        for (int i = 0; i < N; i++) {
            sum += dy[(size_t)i * out + o];
            mag += fabs((double)dy[(size_t)i * out + o]);
        }
        tally_add(t, db[o], sum, mag);
    }
}

static void check_linear(int N, int in, int out, int shift, int bf16) {
    char name[160];
    float *x = random_floats((size_t)N * in, -1, 1), *w = random_floats((size_t)out * in, -1, 1);
    float *b = random_floats((size_t)out, -1, 1), *dy = random_floats((size_t)N * out, -1, 1);
    /* the products' operands */
    float *xr = malloc(sizeof(float) * N * in), *wr = malloc(sizeof(float) * out * in);
    float *dyr = malloc(sizeof(float) * N * out);
    for (size_t i = 0; i < (size_t)N * in; i++) xr[i] = bf16 ? bf16_round(x[i]) : x[i];
    for (size_t i = 0; i < (size_t)out * in; i++) wr[i] = bf16 ? bf16_round(w[i]) : w[i];
    for (size_t i = 0; i < (size_t)N * out; i++) dyr[i] = bf16 ? bf16_round(dy[i]) : dy[i];
    void *base[8];
    float *d_x = up_shifted(x, sizeof(float) * N * in, sizeof(float), shift, &base[0]);
    float *d_w = up_shifted(w, sizeof(float) * out * in, sizeof(float), shift, &base[1]);
    float *d_b = up_shifted(b, sizeof(float) * out, sizeof(float), shift, &base[2]);
    float *d_dy = up_shifted(dy, sizeof(float) * N * out, sizeof(float), shift, &base[3]);
    /* outputs start out as NaNs: a layer that reads them (beta != 0) shows */
    size_t most = (size_t)N * (in > out ? in : out);
    if ((size_t)out * in > most) most = (size_t)out * in;
    float *nan_y = malloc(sizeof(float) * most);
    for (size_t i = 0; i < most; i++) nan_y[i] = NAN;
    float *d_y = up_shifted(nan_y, sizeof(float) * N * out, sizeof(float), shift, &base[4]);
    float *d_dx = up_shifted(nan_y, sizeof(float) * N * in, sizeof(float), shift, &base[5]);
    float *d_dw = up_shifted(nan_y, sizeof(float) * out * in, sizeof(float), shift, &base[6]);
    float *d_db = up_shifted(nan_y, sizeof(float) * out, sizeof(float), shift, &base[7]);
    visc_cuda_set_bf16(ctx, bf16);
    launched(visc_cuda_linear_forward(ctx, d_y, d_x, d_w, d_b, N, in, out), "linear forward");
    launched(visc_cuda_linear_backward(ctx, d_dx, d_dw, d_db, d_dy, d_x, d_w, N, in, out),
             "linear backward");
    float *y = down(d_y, (size_t)N * out), *dx = down(d_dx, (size_t)N * in);
    float *dw = down(d_dw, (size_t)out * in), *db = down(d_db, (size_t)out);
    /* The operand form of the input (a norm's output): X as the products
     * take it, the context's form (bf16: its bits), must give the layer's
     * results, up to the order of the products' sums (at another alignment
     * cuBLASLt may take another algorithm): 1e-5 of the largest, 1e-5 rtol */
    {
        float *d_xop = up_operand(x, (size_t)N * in, bf16);
        launched(visc_cuda_linear_operand_forward(ctx, d_y, d_xop, d_w, d_b, N, in, out),
                 "linear operand forward");
        launched(visc_cuda_linear_operand_backward(ctx, d_dx, d_dw, d_db, d_dy, d_xop, d_w, N, in,
                                                   out),
                 "linear operand backward");
        float *got[4] = {down(d_y, (size_t)N * out), down(d_dx, (size_t)N * in),
                         down(d_dw, (size_t)out * in), down(d_db, (size_t)out)};
        const float *want[4] = {y, dx, dw, db};
        const size_t count[4] = {(size_t)N * out, (size_t)N * in, (size_t)out * in, (size_t)out};
        const char *part[4] = {"forward", "dX", "dW", "db"};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name,
                     "linear %s operand form %s: N %d, %d -> %d, shift %d: the layer's results",
                     bf16 ? "bf16" : "fp32", part[i], N, in, out, shift);
            expect_fp32(name, got[i], want[i], count[i]);
            free(got[i]);
        }
        /* The output in the operand form too (operands_forward): in bf16 the
         * sums plus the bias rounded to bf16 (autocast's), rounded once:
         * within half a bf16 step of the layer's output with
         * that bias (2^-8 relative at most: bf16 keeps 8 significant bits)
         * and the sums' order (1e-5 of the largest); in fp32 the
         * layer's output. */
        float *d_yop = up(nan_y, sizeof(float) * N * out);
        launched(visc_cuda_linear_operands_forward(ctx, d_yop, d_xop, d_w, d_b, N, in, out),
                 "linear operands forward");
        const size_t ny = (size_t)N * out;
        float *yop = down(d_yop, ny), *want_op = malloc(sizeof(float) * ny);
        for (size_t i = 0; i < ny; i++) {
            const size_t o = i % (size_t)out;
            want_op[i] = bf16 ? y[i] - b[o] + bf16_round(b[o]) : y[i];
        }
        if (bf16) { /* d_yop holds bf16 values */
            uint16_t *raw = malloc(sizeof(uint16_t) * ny);
            if (visc_cuda_download(ctx, raw, d_yop, sizeof(uint16_t) * ny)) die_cuda("download");
            for (size_t i = 0; i < ny; i++) yop[i] = visc_bf16_to_f32(raw[i]);
            free(raw);
        }
        snprintf(name, sizeof name,
                 "linear %s operands forward: N %d, %d -> %d, shift %d: the layer's output%s",
                 bf16 ? "bf16" : "fp32", N, in, out, shift, bf16 ? " rounded" : "");
        expect_close(name, yop, want_op, (size_t)N * out, 1e-5 * max_abs(y, (size_t)N * out),
                     bf16 ? 1.0 / 256 : 1e-5);
        visc_cuda_free(ctx, d_yop);
        free(yop), free(want_op);
        visc_cuda_free(ctx, d_xop);
    }
    /* db: the column sums of dY whichever pass takes them (bf16: the one
     * that rounds dY), the same bits as the plain sums */
    {
        float *d_sums = dev(sizeof(float) * out);
        launched(visc_cuda_sum_rows(ctx, d_sums, d_dy, N, out), "column sums");
        float *sums = down(d_sums, (size_t)out);
        snprintf(name, sizeof name, "linear %s db: N %d, %d -> %d, shift %d: the column sums' bits",
                 bf16 ? "bf16" : "fp32", N, in, out, shift);
        expect_bits(name, db, sums, (size_t)out, sizeof(float));
        visc_cuda_free(ctx, d_sums);
        free(sums);
    }
    visc_cuda_set_bf16(ctx, 0);
    const double tol = bf16 ? 1e-4 : 3e-5;
    tally ty = {.tol = tol}, tdx = {.tol = tol}, tdw = {.tol = tol}, tdb = {.tol = 3e-5};
    for (int i = 0; i < N; i++)
        for (int o = 0; o < out; o++) {
            double sum = b[o], mag = fabs(b[o]);
            for (int k = 0; k < in; k++) {
                sum += (double)xr[(size_t)i * in + k] * wr[(size_t)o * in + k];
                mag += fabs((double)xr[(size_t)i * in + k] * wr[(size_t)o * in + k]);
            }
            tally_add(&ty, y[(size_t)i * out + o], sum, mag);
        }
    for (int i = 0; i < N; i++)
        for (int k = 0; k < in; k++) {
            double sum = 0, mag = 0;
            for (int o = 0; o < out; o++) {
                sum += (double)dyr[(size_t)i * out + o] * wr[(size_t)o * in + k];
                mag += fabs((double)dyr[(size_t)i * out + o] * wr[(size_t)o * in + k]);
            }
            tally_add(&tdx, dx[(size_t)i * in + k], sum, mag);
        }
    tally_bias_grad(&tdb, db, dy, N, out);
    for (int o = 0; o < out; o++) {
        for (int k = 0; k < in; k++) {
            double sum = 0, mag = 0;
            for (int i = 0; i < N; i++) {
                sum += (double)dyr[(size_t)i * out + o] * xr[(size_t)i * in + k];
                mag += fabs((double)dyr[(size_t)i * out + o] * xr[(size_t)i * in + k]);
            }
            tally_add(&tdw, dw[(size_t)o * in + k], sum, mag);
        }
    }
    const tally *ts[4] = {&ty, &tdx, &tdw, &tdb};
    const char *what[4] = {"forward", "dX", "dW", "db"};
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "linear %s %s: N %d, %d -> %d, shift %d",
                 bf16 ? "bf16" : "fp32", what[i], N, in, out, shift);
        report(name, ts[i]->bad, ts[i]->n, ts[i]->worst, ts[i]->got, ts[i]->want,
               ts[i]->worst_ratio);
    }
    for (int i = 0; i < 8; i++) visc_cuda_free(ctx, base[i]);
    void *hfree[] = {x, w, b, dy, xr, wr, dyr, nan_y, y, dx, dw, db};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* GELU then the linear layer (gelu_linear.cu). act: the CPU's GELU (its
 * erf 1.5e-7 from the GPU's, 2e-6 allowed), and in bf16 that rounded: one
 * bf16 step apart at most (rtol 2^-8); _act must give forward's act bit for
 * bit. The products against double-precision ones of the operands the GPU
 * took (its own act, W and dY rounded in bf16): out, dW and the linear
 * part of dh at the linear layer's tolerance (1e-4 bf16, 3e-5 fp32, of the
 * sum of |terms|); dh = that x GELU'(h), in double here. In bf16 h is
 * given as bf16, the operand form fc1 writes it in. */
static double gelu_grad_exact(double x) {
    return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

static void check_gelu_linear(int N, int hidden, int out, int bf16) {
    char name[160];
    const size_t nh = (size_t)N * hidden, nw = (size_t)out * hidden, ny = (size_t)N * out;
    float *h = random_floats(nh, -3, 3), *w = random_floats(nw, -1, 1);
    float *b = random_floats((size_t)out, -1, 1), *dy = random_floats(ny, -1, 1);
    /* h as the layers take it: in bf16 its operand form (fc1's bf16 output) */
    if (bf16)
        for (size_t i = 0; i < nh; i++) h[i] = bf16_round(h[i]);
    float *cpu_act = malloc(sizeof(float) * nh);
    visc_gelu_forward(cpu_act, h, nh);
    float *d_h = up_operand(h, nh, bf16), *d_w = up(w, sizeof(float) * nw);
    float *d_b = up(b, sizeof(float) * out), *d_dy = up(dy, sizeof(float) * ny);
    float *d_act = dev(sizeof(float) * nh), *d_act2 = dev(sizeof(float) * nh);
    float *d_y = dev(sizeof(float) * ny), *d_dh = dev(sizeof(float) * nh);
    float *d_dw = dev(sizeof(float) * nw), *d_db = dev(sizeof(float) * out);
    visc_cuda_set_bf16(ctx, bf16);
    launched(visc_cuda_gelu_linear_forward(ctx, d_y, d_act, d_h, d_w, d_b, N, hidden, out),
             "gelu_linear forward");
    launched(visc_cuda_gelu_linear_act(ctx, d_act2, d_h, N, hidden, out, 1), "gelu_linear act");
    launched(visc_cuda_gelu_linear_backward(ctx, d_dh, d_dw, d_db, d_dy, d_act, d_h, d_w, N, hidden,
                                            out),
             "gelu_linear backward");
    visc_cuda_set_bf16(ctx, 0);
    /* act as the products took it */
    const size_t act_bytes = bf16 ? 2 * nh : 4 * nh;
    void *raw = malloc(act_bytes), *raw2 = malloc(act_bytes);
    if (visc_cuda_download(ctx, raw, d_act, act_bytes) ||
        visc_cuda_download(ctx, raw2, d_act2, act_bytes))
        die_cuda("download");
    float *act = malloc(sizeof(float) * nh);
    for (size_t i = 0; i < nh; i++)
        act[i] = bf16 ? visc_bf16_to_f32(((uint16_t *)raw)[i]) : ((float *)raw)[i];
    float *wr = malloc(sizeof(float) * nw), *dyr = malloc(sizeof(float) * ny);
    for (size_t i = 0; i < nw; i++) wr[i] = bf16 ? bf16_round(w[i]) : w[i];
    for (size_t i = 0; i < ny; i++) dyr[i] = bf16 ? bf16_round(dy[i]) : dy[i];
    float *y = down(d_y, ny), *dh = down(d_dh, nh), *dw = down(d_dw, nw), *db = down(d_db, out);
    const double tol = bf16 ? 1e-4 : 3e-5;
    tally tact = {.tol = 1.0}, ty = {.tol = tol}, tdh = {.tol = tol}, tdw = {.tol = tol},
          tdb = {.tol = 3e-5};
    for (size_t i = 0; i < nh; i++)
        tally_add(&tact, act[i], cpu_act[i], 2e-6 + (bf16 ? ldexp(fabs(cpu_act[i]), -8) : 0));
    for (int i = 0; i < N; i++)
        for (int o = 0; o < out; o++) {
            double sum = b[o], mag = fabs(b[o]);
            for (int k = 0; k < hidden; k++) {
                const double t = (double)act[(size_t)i * hidden + k] * wr[(size_t)o * hidden + k];
                sum += t, mag += fabs(t);
            }
            tally_add(&ty, y[(size_t)i * out + o], sum, mag);
        }
    for (int i = 0; i < N; i++)
        for (int k = 0; k < hidden; k++) {
            double sum = 0, mag = 0;
            for (int o = 0; o < out; o++) {
                const double t = (double)dyr[(size_t)i * out + o] * wr[(size_t)o * hidden + k];
                sum += t, mag += fabs(t);
            }
            const double x = h[(size_t)i * hidden + k], g = gelu_grad_exact(x);
            /* GELU' in fp32 on the GPU, a sum of two terms that cancel
             * near x = -0.75: 1e-6 of their magnitudes more */
            const double g_mag = 0.5 * erfc(-x / sqrt(2.0)) + fabs(x * exp(-0.5 * x * x));
            tally_add(&tdh, dh[(size_t)i * hidden + k], sum * g,
                      mag * fabs(g) + 1e-6 * fabs(sum) * g_mag / tol);
        }
    tally_bias_grad(&tdb, db, dy, N, out);
    for (int o = 0; o < out; o++) {
        for (int k = 0; k < hidden; k++) {
            double sum = 0, mag = 0;
            for (int i = 0; i < N; i++) {
                const double t = (double)dyr[(size_t)i * out + o] * act[(size_t)i * hidden + k];
                sum += t, mag += fabs(t);
            }
            tally_add(&tdw, dw[(size_t)o * hidden + k], sum, mag);
        }
    }
    const tally *ts[5] = {&tact, &ty, &tdh, &tdw, &tdb};
    const char *what[5] = {"act", "forward", "dh", "dW", "db"};
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "gelu_linear %s %s: N %d, %d -> %d", bf16 ? "bf16" : "fp32",
                 what[i], N, hidden, out);
        report(name, ts[i]->bad, ts[i]->n, ts[i]->worst, ts[i]->got, ts[i]->want,
               ts[i]->worst_ratio);
    }
    snprintf(name, sizeof name, "gelu_linear %s act alone: forward's, bit for bit",
             bf16 ? "bf16" : "fp32");
    expect_bits(name, raw2, raw, nh, bf16 ? 2 : 4);
    void *dfree[] = {d_h, d_w, d_b, d_dy, d_act, d_act2, d_y, d_dh, d_dw, d_db};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {h, w, b, dy, cpu_act, raw, raw2, act, wr, dyr, y, dh, dw, db};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* The MLP's backward (visc_cuda_mlp_backward) gives the bits of the two
 * calls it is defined by, visc_cuda_gelu_linear_backward into dh and fc1's
 * visc_cuda_linear_operand_backward from it: every gradient and, in fp32
 * (where it is fc2's dX times GELU'), dh. Under bf16 the GELU's gradient
 * went straight into fc1's bf16 dY instead (dh is fc2's dX there, not
 * compared). Cin != Cout, so that swapped sizes show. */
static void check_mlp_backward(int N, int Cin, int hidden, int Cout, int bf16) {
    char name[160];
    const size_t nx = (size_t)N * Cin, nh = (size_t)N * hidden, ny = (size_t)N * Cout;
    const size_t nw1 = (size_t)hidden * Cin, nw2 = (size_t)Cout * hidden;
    float *x = random_floats(nx, -1, 1), *h = random_floats(nh, -3, 3);
    float *w1 = random_floats(nw1, -1, 1), *w2 = random_floats(nw2, -1, 1);
    float *dy = random_floats(ny, -1, 1);
    /* fc1's input and output in the operand form */
    float *d_xop = up_operand(x, nx, bf16), *d_h = up_operand(h, nh, bf16);
    float *d_w1 = up(w1, sizeof(float) * nw1), *d_w2 = up(w2, sizeof(float) * nw2);
    float *d_dy = up(dy, sizeof(float) * ny), *d_act = dev(sizeof(float) * nh);
    const size_t count[6] = {nx, nw1, (size_t)hidden, nw2, (size_t)Cout, nh};
    const char *what[6] = {"dX", "fc1 dW", "fc1 db", "fc2 dW", "fc2 db", "dh"};
    float *d[2][6]; /* [fused, two calls][dx, dw1, db1, dw2, db2, dh] */
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 6; i++) d[k][i] = dev(sizeof(float) * count[i]);
    visc_cuda_set_bf16(ctx, bf16);
    launched(visc_cuda_gelu_linear_act(ctx, d_act, d_h, N, hidden, Cout, 1), "gelu_linear act");
    launched(visc_cuda_mlp_backward(ctx, d[0][0], d[0][1], d[0][2], d[0][3], d[0][4], d[0][5], d_dy,
                                    d_xop, d_h, d_act, d_w1, d_w2, N, Cin, hidden, Cout),
             "mlp backward");
    launched(visc_cuda_gelu_linear_backward(ctx, d[1][5], d[1][3], d[1][4], d_dy, d_act, d_h, d_w2,
                                            N, hidden, Cout),
             "gelu_linear backward");
    launched(visc_cuda_linear_operand_backward(ctx, d[1][0], d[1][1], d[1][2], d[1][5], d_xop, d_w1,
                                               N, Cin, hidden),
             "linear operand backward");
    visc_cuda_set_bf16(ctx, 0);
    for (int i = 0; i < (bf16 ? 5 : 6); i++) {
        float *got = down(d[0][i], count[i]), *want = down(d[1][i], count[i]);
        snprintf(name, sizeof name, "mlp backward %s %s: N %d, %d -> %d -> %d: the two calls' bits",
                 bf16 ? "bf16" : "fp32", what[i], N, Cin, hidden, Cout);
        expect_bits(name, got, want, count[i], sizeof(float));
        free(got);
        free(want);
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 6; i++) visc_cuda_free(ctx, d[k][i]);
    void *dfree[] = {d_xop, d_h, d_w1, d_w2, d_dy, d_act};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, h, w1, w2, dy};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* Batches of bf16 products (visc_cuda_matmul_bf16_batched) with padded rows
 * and gaps between the matrices: D_t = alpha op(A_t) op(B_t) + beta D_t,
 * against double-precision products of the same operands, 1e-4 x the sum
 * of |terms| as for one product. The padding and the gaps hold NaNs, which
 * must never be read, and D's must come back untouched. */
static void check_products(int M, int N, int K, int trans_a, int trans_b, int batch, int pad,
                           float alpha, float beta) {
    char name[160];
    const int ar = trans_a ? K : M, ac = trans_a ? M : K; /* A as stored */
    const int br = trans_b ? N : K, bc = trans_b ? K : N;
    const int64_t lda = ac + pad, ldb = bc + pad, ldd = N + pad;
    const int64_t sa = lda * ar + 8 * pad, sb = ldb * br + 8 * pad, sd = ldd * M + 4 * pad;
    const size_t na = (size_t)sa * batch, nb = (size_t)sb * batch, nd = (size_t)sd * batch;
    uint16_t *a16 = malloc(2 * na), *b16 = malloc(2 * nb);
    float *a = random_floats(na, -1, 1), *b = random_floats(nb, -1, 1);
    float *d0 = random_floats(nd, -1, 1);
    for (size_t i = 0; i < na; i++) a16[i] = visc_f32_to_bf16(a[i]), a[i] = bf16_round(a[i]);
    for (size_t i = 0; i < nb; i++) b16[i] = visc_f32_to_bf16(b[i]), b[i] = bf16_round(b[i]);
    /* NaN where no operand element is */
    for (int t = 0; t < batch; t++) {
        for (int64_t e = 0; e < sa; e++)
            if (e >= lda * ar || e % lda >= ac) a16[t * sa + e] = 0x7fc0;
        for (int64_t e = 0; e < sb; e++)
            if (e >= ldb * br || e % ldb >= bc) b16[t * sb + e] = 0x7fc0;
        for (int64_t e = 0; e < sd; e++)
            if (e >= ldd * M || e % ldd >= N || beta == 0.0f) d0[t * sd + e] = NAN;
    }
    uint16_t *d_a = up(a16, 2 * na), *d_b = up(b16, 2 * nb);
    float *d_d = up(d0, sizeof(float) * nd);
    const visc_cuda_products p = {.A = d_a,
                                  .B = d_b,
                                  .D = d_d,
                                  .M = M,
                                  .N = N,
                                  .K = K,
                                  .trans_a = trans_a,
                                  .trans_b = trans_b,
                                  .batch = batch,
                                  .lda = lda,
                                  .ldb = ldb,
                                  .ldd = ldd,
                                  .stride_a = sa,
                                  .stride_b = sb,
                                  .stride_d = sd,
                                  .alpha = alpha,
                                  .beta = beta};
    launched(visc_cuda_matmul_bf16_batched(ctx, &p), "batched products");
    float *got = down(d_d, nd);
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (int t = 0; t < batch; t++)
        for (int64_t e = 0; e < sd; e++) {
            const size_t at = (size_t)t * sd + e;
            const int i = (int)(e / ldd), j = (int)(e % ldd);
            double s = 0.0, mag = 0.0;
            if (i < M && j < N) {
                for (int k = 0; k < K; k++) {
                    const double av = trans_a ? a[t * sa + (int64_t)k * lda + i]
                                              : a[t * sa + (int64_t)i * lda + k];
                    const double bv = trans_b ? b[t * sb + (int64_t)j * ldb + k]
                                              : b[t * sb + (int64_t)k * ldb + j];
                    s += av * bv;
                    mag += fabs(av * bv);
                }
                s *= alpha, mag *= fabs(alpha);
                if (beta != 0.0f) s += beta * d0[at], mag += fabs(beta * d0[at]);
            }
            /* outside the matrices: untouched (NaN stays NaN, bits compared) */
            const int inside = i < M && j < N;
            const double err = inside ? fabs((double)got[at] - s) : 0.0;
            const int same = inside || memcmp(&got[at], &d0[at], sizeof(float)) == 0;
            const double ratio = same ? err / (1e-4 * mag + 1e-30) : INFINITY;
            if (!(ratio <= 1.0)) bad++;
            if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = at;
        }
    snprintf(name, sizeof name,
             "batched products bf16: %d x M %d N %d K %d%s%s, rows padded %d, alpha %g, beta %g",
             batch, M, N, K, trans_a ? " A^T" : "", trans_b ? " B^T" : "", pad, alpha, beta);
    report(name, bad, nd, worst, got[worst], d0[worst], worst_ratio);
    visc_cuda_free(ctx, d_a);
    visc_cuda_free(ctx, d_b);
    visc_cuda_free(ctx, d_d);
    void *hfree[] = {a16, b16, a, b, d0, got};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* ---- attention ----
 * Against a double-precision reference of the same formulas (the CPU twin
 * needs oneDNN, not linked here). Layouts as the models use them: q, k, v
 * inside a fused [B, N, 3, H, D] projection, the output [B, N, H, D].
 * fp32: |gpu - ref| <= 1e-4 |ref| + 2e-5 x the tensor's largest |ref|.
 * bf16 (tensor cores): the reference takes Q, K, V and dO rounded to bf16,
 * as the products do; what it cannot follow is the rounding of P and dS to
 * bf16 for their products (2^-9 relative each), so each element may be off
 * by 2^-7 of its magnitude: the sum of its terms' absolute values, with
 * |dP| + the magnitude of delta in place of dP - delta (delta = dO . O
 * carries the output's rounding: its magnitude is the sum of |dO| times
 * the output's magnitudes). The log-sum-exp comes from fp32 sums of the same bf16
 * products: 1e-4 relative. A wrong element, pair or stride is off by about
 * its whole magnitude. Each bf16 case runs three times: fused (where D
 * is at most 64), and as the products with the N x N matrices made in one
 * chunk and one sequence at a time. */
typedef struct {
    int B, H, Nq, Nk, D, nmask, bias, head_scale, dead_row, bf16;
} attn_case;

/* |got - want| <= rel x mag, element by element. */
static void expect_within(const char *name, const float *got, const double *want, const double *mag,
                          size_t n, double rel) {
    size_t bad = 0, worst = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - want[i]), ratio = err / (rel * mag[i] + 1e-30);
        if (!(ratio <= 1.0)) bad++;
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    report(name, bad, n, worst, n ? got[worst] : 0, n ? want[worst] : 0, worst_ratio);
}

static float *bf16_rounded(const float *x, size_t n) {
    float *r = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) r[i] = bf16_round(x[i]);
    return r;
}

/* The output as the projection's bf16 operand (visc_cuda_attention_operand_*),
 * after the fp32-output calls of the same way left out (d_out) and lse:
 * each value out's rounded, lse the same bits; backward from it, delta of
 * the rounded output, dq dk dv within the tolerance of the reference.
 * `name` holds the case's last check name, its description after ": ". */
static void check_attention_operand(const visc_attention *a, const char *name, const float *d_out,
                                    const float *d_lse, const float *d_qkv, const float *d_dout,
                                    size_t nqkv, const double *ref_dqkv, const double *mag_dqkv) {
    char check[240];
    const char *what = strstr(name, ": ") + 2;
    const size_t nout = (size_t)a->B * a->o_sb, nlse = (size_t)a->B * a->H * a->Nq;
    const int C = a->H * a->D;
    float *d_op = dev(sizeof(float) * nout), *d_lse2 = dev(sizeof(float) * nlse);
    float *d_dqkv = dev(sizeof(float) * nqkv);
    if (visc_cuda_zero(ctx, d_dqkv, sizeof(float) * nqkv)) die_cuda("zero");
    launched(visc_cuda_attention_operand_forward(ctx, a, d_op, d_lse2, d_qkv, d_qkv + C,
                                                 d_qkv + 2 * C),
             "attention operand forward");
    launched(visc_cuda_attention_operand_backward(ctx, a, d_dqkv, d_dqkv + C, d_dqkv + 2 * C, NULL,
                                                  NULL, d_dout, d_qkv, d_qkv + C, d_qkv + 2 * C,
                                                  d_op, d_lse2),
             "attention operand backward");
    float *out = down(d_out, nout), *op = down(d_op, nout);
    float *lse = down(d_lse, nlse), *lse2 = down(d_lse2, nlse);
    uint16_t *want16 = malloc(sizeof(uint16_t) * nout);
    for (size_t i = 0; i < nout; i++) want16[i] = visc_f32_to_bf16(out[i]);
    snprintf(check, sizeof check, "attention operand output (bf16): %s, the output rounded", what);
    expect_bits(check, op, want16, nout, sizeof(uint16_t));
    snprintf(check, sizeof check, "attention operand lse: %s, bit-identical", what);
    expect_bits(check, lse2, lse, nlse, sizeof(float));
    float *got = down(d_dqkv, nqkv);
    snprintf(check, sizeof check, "attention operand dq dk dv: %s", what);
    expect_within(check, got, ref_dqkv, mag_dqkv, nqkv, 1.0 / 128);
    /* Q, K and V in the operand form too (qkv_operand: a bf16 projection
     * output): the kernels took them rounded anyway, so the same bits */
    float *qkv = down(d_qkv, nqkv);
    uint16_t *qkv16 = malloc(sizeof(uint16_t) * nqkv);
    for (size_t i = 0; i < nqkv; i++) qkv16[i] = visc_f32_to_bf16(qkv[i]);
    uint16_t *d_qkv16 = up(qkv16, sizeof(uint16_t) * nqkv);
    /* q, k, v: float * as the calls take them, holding bf16 */
    const void *q16 = d_qkv16, *k16 = d_qkv16 + C, *v16 = d_qkv16 + 2 * C;
    visc_attention a16 = *a;
    a16.qkv_operand = 1;
    if (visc_cuda_zero(ctx, d_dqkv, sizeof(float) * nqkv)) die_cuda("zero");
    launched(visc_cuda_attention_operand_forward(ctx, &a16, d_op, d_lse2, q16, k16, v16),
             "attention operand forward, bf16 q k v");
    launched(visc_cuda_attention_operand_backward(ctx, &a16, d_dqkv, d_dqkv + C, d_dqkv + 2 * C,
                                                  NULL, NULL, d_dout, q16, k16, v16, d_op, d_lse2),
             "attention operand backward, bf16 q k v");
    float *op16 = down(d_op, nout), *lse16 = down(d_lse2, nlse), *got16 = down(d_dqkv, nqkv);
    const struct {
        const char *part;
        const void *got, *want;
        size_t n, elem;
    } same[3] = {{"the output", op16, op, nout, sizeof(uint16_t)},
                 {"lse", lse16, lse2, nlse, sizeof(float)},
                 {"dq dk dv", got16, got, nqkv, sizeof(float)}};
    for (int i = 0; i < 3; i++) {
        snprintf(check, sizeof check, "attention bf16 q k v: %s, %s: the same bits", what,
                 same[i].part);
        expect_bits(check, same[i].got, same[i].want, same[i].n, same[i].elem);
    }
    visc_cuda_free(ctx, d_qkv16);
    visc_cuda_free(ctx, d_op);
    visc_cuda_free(ctx, d_lse2);
    visc_cuda_free(ctx, d_dqkv);
    void *hfree[] = {out, op, lse, lse2, want16, got, qkv, qkv16, op16, lse16, got16};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

static void check_attention(attn_case c) {
    char name[200];
    const int B = c.B, H = c.H, Nq = c.Nq, Nk = c.Nk, D = c.D, N = Nq > Nk ? Nq : Nk;
    const int64_t sn = 3 * (int64_t)H * D, sb = (int64_t)N * sn, on = (int64_t)H * D;
    const size_t nqkv = (size_t)B * sb, nout = (size_t)B * Nq * on, nsc = (size_t)Nq * Nk;
    float *qkv = random_floats(nqkv, -1, 1), *dout = random_floats(nout, -1, 1);
    float *bias = random_floats((size_t)H * nsc, -1, 1), *hscale = random_floats((size_t)H, 2, 6);
    float *mask = random_floats((size_t)(c.nmask ? c.nmask : 1) * nsc, 0, 1);
    for (size_t i = 0; i < (size_t)(c.nmask ? c.nmask : 1) * nsc; i++)
        mask[i] = mask[i] < 0.3f ? -100.0f : 0.0f; /* Swin's shifted-window masks */
    if (c.dead_row) /* every key of row 1 masked out: output 0, lse +inf */
        for (int j = 0; j < Nk; j++) mask[1 * Nk + j] = -INFINITY;
    /* what the reference multiplies: the products' operands as the GPU has them */
    float *rqkv = c.bf16 ? bf16_rounded(qkv, nqkv) : qkv;
    float *rdout = c.bf16 ? bf16_rounded(dout, nout) : dout;
    visc_attention a = {.B = B,
                        .H = H,
                        .Nq = Nq,
                        .Nk = Nk,
                        .D = D,
                        .scale = 1.0f / sqrtf((float)D),
                        .nmask = c.nmask,
                        .q_sb = sb,
                        .q_sh = D,
                        .q_sn = sn,
                        .k_sb = sb,
                        .k_sh = D,
                        .k_sn = sn,
                        .v_sb = sb,
                        .v_sh = D,
                        .v_sn = sn,
                        .o_sb = (int64_t)Nq * on,
                        .o_sh = D,
                        .o_sn = on};
    /* reference, in double, with each element's magnitude */
    double *ref_out = calloc(nout, sizeof(double)), *ref_lse = calloc((size_t)B * H * Nq, 8);
    double *ref_dqkv = calloc(nqkv, sizeof(double)), *ref_dbias = calloc((size_t)H * nsc, 8);
    double *ref_dhs = calloc((size_t)H, sizeof(double));
    double *mag_out = calloc(nout, sizeof(double)), *mag_dqkv = calloc(nqkv, sizeof(double));
    double *mag_dbias = calloc((size_t)H * nsc, 8), *mag_dhs = calloc((size_t)H, sizeof(double));
    double *S = malloc(sizeof(double) * nsc), *P = malloc(sizeof(double) * nsc);
    double *raw = malloc(sizeof(double) * nsc);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const float *q = rqkv + b * sb + h * D, *k = q + H * D, *v = q + 2 * H * D;
            const double sh = c.head_scale ? hscale[h] : a.scale;
            for (int i = 0; i < Nq; i++) {
                double mx = -INFINITY;
                for (int j = 0; j < Nk; j++) {
                    double r = 0;
                    for (int d = 0; d < D; d++) r += (double)q[i * sn + d] * k[j * sn + d];
                    raw[i * Nk + j] = r;
                    double sc = r * sh;
                    if (c.bias) sc += bias[(size_t)h * nsc + i * Nk + j];
                    if (c.nmask) sc += mask[(size_t)(b % c.nmask) * nsc + i * Nk + j];
                    S[i * Nk + j] = sc;
                    if (sc > mx) mx = sc;
                }
                double sum = 0;
                for (int j = 0; j < Nk; j++) sum += mx == -INFINITY ? 0 : exp(S[i * Nk + j] - mx);
                ref_lse[((size_t)b * H + h) * Nq + i] = sum > 0 ? mx + log(sum) : INFINITY;
                for (int j = 0; j < Nk; j++)
                    P[i * Nk + j] = sum > 0 ? exp(S[i * Nk + j] - mx) / sum : 0.0;
                for (int d = 0; d < D; d++) {
                    double o = 0, m = 0;
                    for (int j = 0; j < Nk; j++) {
                        o += P[i * Nk + j] * v[j * sn + d];
                        m += P[i * Nk + j] * fabs(v[j * sn + d]);
                    }
                    ref_out[(size_t)b * Nq * on + i * on + h * D + d] = o;
                    mag_out[(size_t)b * Nq * on + i * on + h * D + d] = m;
                }
            }
            const float *g = rdout + (size_t)b * Nq * on + h * D;
            double *dq = ref_dqkv + b * sb + h * D, *dk = dq + H * D, *dv = dq + 2 * H * D;
            double *mq = mag_dqkv + b * sb + h * D, *mk = mq + H * D, *mv = mq + 2 * H * D;
            for (int i = 0; i < Nq; i++) {
                double delta = 0, delta_mag = 0;
                for (int d = 0; d < D; d++) {
                    const size_t o = (size_t)b * Nq * on + i * on + h * D + d;
                    delta += (double)g[i * on + d] * ref_out[o];
                    delta_mag += fabs((double)g[i * on + d]) * mag_out[o];
                }
                for (int j = 0; j < Nk; j++) {
                    double dp = 0;
                    for (int d = 0; d < D; d++) dp += (double)g[i * on + d] * v[j * sn + d];
                    const double pij = P[i * Nk + j], ds = pij * (dp - delta);
                    const double dsm = pij * (fabs(dp) + delta_mag);
                    ref_dbias[(size_t)h * nsc + i * Nk + j] += ds;
                    mag_dbias[(size_t)h * nsc + i * Nk + j] += dsm;
                    ref_dhs[h] += ds * raw[i * Nk + j];
                    mag_dhs[h] += dsm * fabs(raw[i * Nk + j]);
                    for (int d = 0; d < D; d++) {
                        dq[i * sn + d] += sh * ds * k[j * sn + d];
                        dk[j * sn + d] += sh * ds * q[i * sn + d];
                        dv[j * sn + d] += pij * g[i * on + d];
                        mq[i * sn + d] += sh * dsm * fabs(k[j * sn + d]);
                        mk[j * sn + d] += sh * dsm * fabs(q[i * sn + d]);
                        mv[j * sn + d] += pij * fabs(g[i * on + d]);
                    }
                }
            }
        }
    /* the GPU */
    float *d_qkv = up(qkv, sizeof(float) * nqkv), *d_dout = up(dout, sizeof(float) * nout);
    float *d_bias = up(bias, sizeof(float) * H * nsc), *d_hs = up(hscale, sizeof(float) * H);
    float *d_mask = up(mask, sizeof(float) * (c.nmask ? c.nmask : 1) * nsc);
    float *d_out = dev(sizeof(float) * nout), *d_lse = dev(sizeof(float) * B * H * Nq);
    float *d_dqkv = dev(sizeof(float) * nqkv), *d_dbias = dev(sizeof(float) * H * nsc);
    float *d_dhs = dev(sizeof(float) * H);
    a.bias = c.bias ? d_bias : NULL;
    a.mask = c.nmask ? d_mask : NULL;
    a.head_scale = c.head_scale ? d_hs : NULL;
    visc_cuda_set_bf16(ctx, c.bf16);
    /* fp32: dS of all sequences at once for dbias, and of one mask period
     * at a time; bf16: fused (where D allows) both ways, the products in
     * one chunk, and again at one sequence a chunk */
    const struct {
        int fused, chunked;
        const char *what;
    } ways[] = {{1, 0, ""},
                {1, 1, ", dS in groups"},
                {0, 0, ", the products"},
                {0, 1, ", a sequence a chunk"}};
    for (int way = 0; way < (c.bf16 ? 4 : 2); way++) {
        const int chunked = ways[way].chunked;
        if (chunked && !c.bias && (!c.bf16 || ways[way].fused)) continue; /* as the unchunked */
        if (c.bf16 && ways[way].fused && D > 64) continue;                /* as the products */
        visc_cuda_set_attention_fused(ctx, ways[way].fused);
        /* dS groups of one mask period, or of two sequences without masks
         * (the last one short where B is odd); the products' chunks of one
         * sequence */
        const size_t group_bytes = sizeof(float) * (c.nmask ? c.nmask : 2) * H * nsc;
        visc_cuda_set_attention_chunk(ctx, !chunked ? 0 : ways[way].fused ? group_bytes : 1);
        /* parts of dqkv no gradient reaches (rows beyond Nq or Nk) stay as they are */
        if (visc_cuda_zero(ctx, d_dqkv, sizeof(float) * nqkv)) die_cuda("zero");
        launched(visc_cuda_attention_forward(ctx, &a, d_out, d_lse, d_qkv, d_qkv + H * D,
                                             d_qkv + 2 * H * D),
                 "attention forward");
        launched(visc_cuda_attention_backward(ctx, &a, d_dqkv, d_dqkv + H * D, d_dqkv + 2 * H * D,
                                              c.bias ? d_dbias : NULL, c.head_scale ? d_dhs : NULL,
                                              d_dout, d_qkv, d_qkv + H * D, d_qkv + 2 * H * D,
                                              d_out, d_lse),
                 "attention backward");
        struct {
            const char *what;
            float *dev;
            const double *ref, *mag;
            size_t n;
        } outs[] = {{"output", d_out, ref_out, mag_out, nout},
                    {"lse", d_lse, ref_lse, NULL, (size_t)B * H * Nq},
                    {"dq dk dv", d_dqkv, ref_dqkv, mag_dqkv, nqkv},
                    {"dbias", c.bias ? d_dbias : NULL, ref_dbias, mag_dbias, (size_t)H * nsc},
                    {"dhead_scale", c.head_scale ? d_dhs : NULL, ref_dhs, mag_dhs, (size_t)H}};
        for (size_t o = 0; o < sizeof outs / sizeof *outs; o++) {
            if (!outs[o].dev) continue;
            float *got = down(outs[o].dev, outs[o].n), *want = malloc(sizeof(float) * outs[o].n);
            double big = 0;
            for (size_t i = 0; i < outs[o].n; i++) {
                want[i] = (float)outs[o].ref[i];
                if (isfinite(outs[o].ref[i])) big = fmax(big, fabs(outs[o].ref[i]));
                if (isinf(outs[o].ref[i]) && got[i] == want[i]) got[i] = want[i] = 0; /* +inf */
            }
            snprintf(name, sizeof name, "attention %s%s: B %d H %d Nq %d Nk %d D %d%s%s%s%s%s%s",
                     c.bf16 ? "bf16 " : "", outs[o].what, B, H, Nq, Nk, D, c.bias ? ", bias" : "",
                     c.nmask ? ", masks" : "", c.head_scale ? ", head scale" : "",
                     c.dead_row ? ", a fully masked row" : "",
                     c.bf16 && ways[way].fused ? ", fused" : "", ways[way].what);
            if (!c.bf16) expect_close(name, got, want, outs[o].n, 2e-5 * big, 1e-4);
            else if (!outs[o].mag) expect_close(name, got, want, outs[o].n, 1e-4 * big, 1e-4);
            else expect_within(name, got, outs[o].ref, outs[o].mag, outs[o].n, 1.0 / 128);
            free(got);
            free(want);
        }
        if (c.bf16)
            check_attention_operand(&a, name, d_out, d_lse, d_qkv, d_dout, nqkv, ref_dqkv,
                                    mag_dqkv);
    }
    visc_cuda_set_attention_chunk(ctx, 0);
    visc_cuda_set_attention_fused(ctx, 1);
    visc_cuda_set_bf16(ctx, 0);
    void *dfree[] = {d_qkv, d_dout, d_bias, d_hs, d_mask, d_out, d_lse, d_dqkv, d_dbias, d_dhs};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    if (c.bf16) {
        free(rqkv);
        free(rdout);
    }
    void *hfree[] = {qkv,       dout,     bias,      hscale,  mask,    ref_out,
                     ref_lse,   ref_dqkv, ref_dbias, ref_dhs, mag_out, mag_dqkv,
                     mag_dbias, mag_dhs,  S,         P,       raw};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* ---- the token models' glue (tokens.cu) ---- */
static void check_tokens(int B, int T, int C) {
    char name[160];
    const size_t NC = (size_t)T * C, n = (size_t)B * NC;
    float *x = random_floats(n, -1, 1), *table = random_floats(NC, -1, 1);
    float *branch = random_floats(n, -1, 1), *keep = malloc(sizeof(float) * B);
    visc_droppath_keep(keep, B, 0.5f, 1, 7, 0); /* some 0, some 2 */
    keep[0] = 1.0f;                             /* and a plain add */
    float *d_x = up(x, sizeof(float) * n), *d_table = up(table, sizeof(float) * NC);
    float *d_branch = up(branch, sizeof(float) * n), *d_keep = up(keep, sizeof(float) * B);
    float *d_out = dev(sizeof(float) * n), *d_sum = dev(sizeof(float) * NC);
    /* broadcast add */
    float *want = malloc(sizeof(float) * n);
    memcpy(want, x, sizeof(float) * n);
    visc_add_broadcast_forward(want, table, B, (int64_t)NC);
    launched(visc_cuda_add_broadcast(ctx, d_x, d_table, B, (int64_t)NC), "broadcast add");
    float *got = down(d_x, n);
    snprintf(name, sizeof name, "broadcast add [%d, %zu]: bit-identical", B, NC);
    expect_bits(name, got, want, n, sizeof(float));
    free(got);
    /* the rows' sum (its gradient): a fixed order of its own, fp32 tolerance */
    float *sum = malloc(sizeof(float) * NC);
    double *mag = calloc(NC, sizeof(double));
    visc_add_broadcast_backward(sum, want, B, (int64_t)NC);
    for (size_t i = 0; i < n; i++) mag[i % NC] += fabs((double)want[i]);
    launched(visc_cuda_sum_rows(ctx, d_sum, d_x, B, (int)NC), "row sums");
    got = down(d_sum, NC);
    snprintf(name, sizeof name, "row sums [%d, %zu]", B, NC);
    expect_sums(name, got, sum, mag, NC);
    free(got);
    /* drop-path: x += keep_b branch_b (factors 0 and 1 / 0.7, whose product
     * with the branch must be rounded before the sum as on the CPU; then
     * eval's 1s), in place and into another buffer (x copied over where a
     * sample is dropped), dbranch = keep_b dx */
    float *ref = malloc(sizeof(float) * n), *keep_cpu = malloc(sizeof(float) * B);
    for (int train = 1; train >= 0; train--) {
        visc_droppath_add_forward(ref, x, branch, keep_cpu, B, NC, 0.3f, train, 7, 0);
        if (visc_cuda_upload(ctx, d_x, x, sizeof(float) * n) ||
            visc_cuda_upload(ctx, d_keep, keep_cpu, sizeof(float) * B))
            die_cuda("upload");
        launched(visc_cuda_droppath_add_forward(ctx, d_out, d_x, d_branch, d_keep, B, NC),
                 "drop-path add");
        got = down(d_out, n);
        int dropped = 0;
        for (int b = 0; b < B; b++) dropped += keep_cpu[b] == 0.0f;
        snprintf(name, sizeof name,
                 "drop-path add [%d, %zu]%s, %d dropped, into another buffer: bit-identical", B, NC,
                 train ? "" : ", eval", dropped);
        expect_bits(name, got, ref, n, sizeof(float));
        free(got);
        launched(visc_cuda_droppath_add_forward(ctx, d_x, d_x, d_branch, d_keep, B, NC),
                 "drop-path add");
        got = down(d_x, n);
        snprintf(name, sizeof name, "drop-path add [%d, %zu]%s: bit-identical", B, NC,
                 train ? "" : ", eval");
        expect_bits(name, got, ref, n, sizeof(float));
        free(got);
        visc_droppath_add_backward(ref, branch, keep_cpu, B, NC);
        launched(visc_cuda_droppath_add_backward(ctx, d_out, d_branch, d_keep, B, NC),
                 "drop-path backward");
        got = down(d_out, n);
        snprintf(name, sizeof name, "drop-path backward [%d, %zu]%s: bit-identical", B, NC,
                 train ? "" : ", eval");
        expect_bits(name, got, ref, n, sizeof(float));
        free(got);
    }
    /* every sample kept: eval's sums (ref, keep_cpu all 1 from the last
     * pass), the factors (some 0, some 2 before) set on the device for the
     * backward */
    if (visc_cuda_upload(ctx, d_x, x, sizeof(float) * n) ||
        visc_cuda_upload(ctx, d_keep, keep, sizeof(float) * B))
        die_cuda("upload");
    launched(visc_cuda_droppath_add_kept(ctx, d_out, d_x, d_branch, d_keep, B, NC),
             "drop-path add, all kept");
    visc_droppath_add_forward(ref, x, branch, keep_cpu, B, NC, 0.3f, 0, 7, 0);
    got = down(d_out, n);
    snprintf(name, sizeof name, "drop-path add [%d, %zu], all kept: bit-identical", B, NC);
    expect_bits(name, got, ref, n, sizeof(float));
    free(got);
    got = down(d_keep, (size_t)B);
    snprintf(name, sizeof name, "drop-path add [%d, %zu], all kept: the factors 1", B, NC);
    expect_bits(name, got, keep_cpu, (size_t)B, sizeof(float));
    free(got);
    /* the class token's rows, out and back */
    launched(visc_cuda_copy_rows(ctx, d_out, C, d_branch, (int64_t)NC, B, C), "row copy");
    got = down(d_out, (size_t)B * C);
    for (int b = 0; b < B; b++)
        memcpy(ref + (size_t)b * C, branch + (size_t)b * NC, sizeof(float) * C);
    snprintf(name, sizeof name, "class token rows [%d x %d of %zu]: bit-identical", B, C, NC);
    expect_bits(name, got, ref, (size_t)B * C, sizeof(float));
    free(got);
    void *dfree[] = {d_x, d_table, d_branch, d_keep, d_out, d_sum};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {x, table, branch, keep, want, sum, mag, keep_cpu, ref};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* The patch embedding against a double-precision reference: the conv is
 * cuDNN's fp32 one, the bias and the token layout are tokens.cu's. */
static void check_patch_embed(int B, int Cin, int image, int patch, int C, int first) {
    char name[160];
    const int g = image / patch, L = g * g, T = L + first;
    const size_t ni = (size_t)B * Cin * image * image, nw = (size_t)C * Cin * patch * patch;
    const size_t nt = (size_t)B * T * C, nc = (size_t)B * C * L;
    float *img = random_floats(ni, -1, 1), *w = random_floats(nw, -1, 1);
    float *bias = random_floats((size_t)C, -1, 1), *dtok = random_floats(nt, -1, 1);
    float *nan_tokens = malloc(sizeof(float) * nt);
    for (size_t i = 0; i < nt; i++) nan_tokens[i] = NAN; /* the class rows stay as they were */
    float *d_img = up(img, sizeof(float) * ni), *d_w = up(w, sizeof(float) * nw);
    float *d_b = up(bias, sizeof(float) * C), *d_dtok = up(dtok, sizeof(float) * nt);
    float *d_tok = up(nan_tokens, sizeof(float) * nt), *d_conv = dev(sizeof(float) * nc);
    float *d_dw = dev(sizeof(float) * nw), *d_db = dev(sizeof(float) * C);
    visc_cuda_patch_shape p = {B, Cin, image, patch, C, T, first};
    launched(visc_cuda_patch_embed_forward(ctx, &p, d_tok, d_conv, d_img, d_w, d_b),
             "patch embedding forward");
    launched(visc_cuda_patch_embed_backward(ctx, &p, d_dw, d_db, d_conv, d_dtok, d_img),
             "patch embedding backward");
    float *tok = down(d_tok, nt), *dw = down(d_dw, nw), *db = down(d_db, C);
    size_t bad = 0, worst = 0, count = 0;
    double worst_ratio = 0, gw = 0, ww = 0;
    for (int b = 0; b < B; b++)
        for (int l = 0; l < L; l++)
            for (int k = 0; k < C; k++) {
                const int py = l / g, px = l % g;
                double s = bias[k], mag = fabs(bias[k]);
                for (int c = 0; c < Cin; c++)
                    for (int r = 0; r < patch; r++)
                        for (int q = 0; q < patch; q++) {
                            const double t =
                                (double)
                                    img[(((size_t)b * Cin + c) * image + py * patch + r) * image +
                                        px * patch + q] *
                                w[(((size_t)k * Cin + c) * patch + r) * patch + q];
                            s += t;
                            mag += fabs(t);
                        }
                const size_t at = ((size_t)b * T + first + l) * C + k;
                const double ratio = fabs(tok[at] - s) / (3e-5 * mag + 1e-30);
                if (!(ratio <= 1.0)) bad++;
                if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = at, gw = tok[at], ww = s;
                count++;
            }
    for (int b = 0; b < B && first; b++) /* the class rows untouched */
        for (int k = 0; k < C; k++)
            if (!isnan(tok[(size_t)b * T * C + k])) bad++;
    snprintf(name, sizeof name,
             "patch embedding forward: B %d, %d x %dpx, patch %d, C %d, first %d", B, Cin, image,
             patch, C, first);
    report(name, bad, count, worst, gw, ww, worst_ratio);
    /* dbias = sum of the token gradients; dW = sum of dtok x patch pixels */
    float *dbias_ref = malloc(sizeof(float) * C);
    double *bmag = calloc((size_t)C, sizeof(double));
    for (int k = 0; k < C; k++) {
        double s = 0;
        for (int b = 0; b < B; b++)
            for (int l = 0; l < L; l++) {
                s += dtok[((size_t)b * T + first + l) * C + k];
                bmag[k] += fabs((double)dtok[((size_t)b * T + first + l) * C + k]);
            }
        dbias_ref[k] = (float)s;
    }
    snprintf(name, sizeof name, "patch embedding dbias: B %d, C %d", B, C);
    expect_sums(name, db, dbias_ref, bmag, (size_t)C);
    bad = worst = count = 0;
    worst_ratio = 0;
    for (int k = 0; k < C; k++)
        for (int c = 0; c < Cin; c++)
            for (int r = 0; r < patch; r++)
                for (int q = 0; q < patch; q++) {
                    double s = 0, mag = 0;
                    for (int b = 0; b < B; b++)
                        for (int l = 0; l < L; l++) {
                            const int py = l / g, px = l % g;
                            const double t =
                                (double)dtok[((size_t)b * T + first + l) * C + k] *
                                img[(((size_t)b * Cin + c) * image + py * patch + r) * image +
                                    px * patch + q];
                            s += t;
                            mag += fabs(t);
                        }
                    const size_t at = (((size_t)k * Cin + c) * patch + r) * patch + q;
                    const double ratio = fabs(dw[at] - s) / (3e-5 * mag + 1e-30);
                    if (!(ratio <= 1.0)) bad++;
                    if (!(ratio <= worst_ratio))
                        worst_ratio = ratio, worst = at, gw = dw[at], ww = s;
                    count++;
                }
    snprintf(name, sizeof name, "patch embedding dW: C %d, %d x %d x %d", C, Cin, patch, patch);
    report(name, bad, count, worst, gw, ww, worst_ratio);
    void *dfree[] = {d_img, d_w, d_b, d_dtok, d_tok, d_conv, d_dw, d_db};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {img, w, bias, dtok, nan_tokens, tok, dw, db, dbias_ref, bmag};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* Swin V2's q and k normalized per head from the qkv projection's fp32
 * rows into the operand form with v beside them, fp32 and bf16: the CPU's
 * values (visc_swin_normalize_qk) within fp32, or rounded once; the norms
 * within fp32. The backward, y read in that form: the CPU's backward of
 * the same (rounded) y within fp32, v's gradient columns untouched. */
static void check_swin_qk_normalization(int64_t rows, int H, int D) {
    char name[160];
    const int C = H * D, was_bf16 = visc_cuda_bf16(ctx);
    const size_t nq = (size_t)rows * 3 * C, nn = (size_t)rows * H;
    float *raw = random_floats(nq, -1, 1), *dy = random_floats(nq, -1, 1);
    float *want = malloc(sizeof(float) * nq), *norms = malloc(sizeof(float) * 2 * nn);
    visc_swin_normalize_qk(want, norms, norms + nn, raw, rows, H, D);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        visc_cuda_set_bf16(ctx, bf16);
        const size_t elem = (size_t)visc_cuda_operand_bytes(ctx);
        float *d_raw = up(raw, sizeof(float) * nq), *d_qkv = dev(elem * nq);
        float *d_norms = dev(sizeof(float) * 2 * nn), *d_dy = up(dy, sizeof(float) * nq);
        float *d_dx = up(dy, sizeof(float) * nq); /* v's columns must stay dy's */
        launched(visc_cuda_swin_qkv_operand(ctx, d_qkv, d_norms, d_norms + nn, d_raw, rows, H, D),
                 "q, k normalized into the operand form");
        /* the operand as floats: y of the backward below */
        float *y = malloc(sizeof(float) * nq), *gnorms = down(d_norms, 2 * nn);
        void *op = malloc(elem * nq);
        launched(visc_cuda_download(ctx, op, d_qkv, elem * nq), "download");
        for (size_t i = 0; i < nq; i++)
            y[i] = elem == 2 ? visc_bf16_to_f32(((const uint16_t *)op)[i]) : ((float *)op)[i];
        snprintf(name, sizeof name, "swin v2 q, k normalized, v beside [%lld rows, %d x %d]%s",
                 (long long)rows, H, D, bf16 ? ", bf16: the CPU's rounded" : "");
        if (bf16) expect_close(name, y, want, nq, 1e-5 * max_abs(want, nq), 1.0 / 256);
        else expect_fp32(name, y, want, nq);
        snprintf(name, sizeof name, "swin v2 q, k norms [%lld rows, %d x %d]%s", (long long)rows, H,
                 D, bf16 ? ", bf16" : "");
        expect_fp32(name, gnorms, norms, 2 * nn);
        float *dx = malloc(sizeof(float) * nq);
        memcpy(dx, dy, sizeof(float) * nq);
        for (int k = 0; k < 2; k++) { /* q, then k, in place as a Swin V2 block */
            const int64_t at = (int64_t)k * C;
            visc_swin_normalize_heads_backward(dx + at, 3 * C, dx + at, 3 * C, y + at, 3 * C,
                                               norms + k * nn, rows, H, D);
            const void *y_at = (const char *)d_qkv + elem * (size_t)at; /* the operand form's */
            launched(visc_cuda_swin_normalize_heads_backward(ctx, d_dx + at, 3 * C, d_dx + at,
                                                             3 * C, y_at, 3 * C, d_norms + k * nn,
                                                             rows, H, D),
                     "head normalization backward");
        }
        float *gdx = down(d_dx, nq);
        snprintf(name, sizeof name, "swin v2 head normalization backward [%lld rows, %d x %d]%s",
                 (long long)rows, H, D, bf16 ? ", y bf16" : "");
        expect_fp32(name, gdx, dx, nq);
        float *dfree[] = {d_raw, d_qkv, d_norms, d_dy, d_dx};
        for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
        free(y), free(gnorms), free(op), free(dx), free(gdx);
    }
    visc_cuda_set_bf16(ctx, was_bf16);
    free(raw), free(dy), free(want), free(norms);
}

/* ---- Swin's block pieces (swin.cu) against models/swin_window.c and token_ops.c ---- */
static void check_swin_pieces(int B, int grid, int window, int H, int D) {
    char name[160];
    const int N = window * window, NN = N * N, T = (2 * window - 1) * (2 * window - 1), C = H * D;
    const int64_t rows = (int64_t)B * grid * grid;
    int32_t *rel = malloc(sizeof(int32_t) * NN);
    visc_swin_rel_index(rel, window, window);
    float *table = random_floats((size_t)T * H, -2, 2),
          *dbias = random_floats((size_t)H * NN, -1, 1);
    int32_t *d_rel = up(rel, sizeof(int32_t) * NN);
    float *d_table = up(table, sizeof(float) * T * H), *d_dbias = up(dbias, sizeof(float) * H * NN);
    float *d_bias = dev(sizeof(float) * H * NN), *d_dtable = dev(sizeof(float) * T * H);
    float *bias = malloc(sizeof(float) * H * NN), *dtable = malloc(sizeof(float) * T * H);
    for (int sig = 0; sig <= 1; sig++) {
        visc_swin_gather_bias(bias, table, rel, H, N, sig);
        visc_swin_scatter_bias(dtable, dbias, bias, rel, T, H, N, sig);
        launched(visc_cuda_swin_gather_bias(ctx, d_bias, d_table, d_rel, H, N, sig), "bias gather");
        launched(visc_cuda_swin_scatter_bias(ctx, d_dtable, d_dbias, d_bias, d_rel, T, H, N, sig),
                 "bias scatter");
        float *gb = down(d_bias, (size_t)H * NN), *gt = down(d_dtable, (size_t)T * H);
        snprintf(name, sizeof name, "swin bias gather, window %d, %d heads%s", window, H,
                 sig ? ", 16 sigmoid (V2)" : "");
        if (sig) expect_close(name, gb, bias, (size_t)H * NN, 1e-6 * 16, 1e-6); /* expf */
        else expect_bits(name, gb, bias, (size_t)H * NN, sizeof(float));
        snprintf(name, sizeof name, "swin bias scatter, window %d, %d heads%s", window, H,
                 sig ? ", 16 sigmoid (V2)" : "");
        expect_fp32(name, gt, dtable, (size_t)T * H);
        free(gb);
        free(gt);
    }
    /* V2's per-head normalization of q and k of the qkv rows into the
     * operand form (v beside them), and its backward reading them so */
    check_swin_qk_normalization(rows, H, D);
    /* patch merging's gather and scatter: a permutation, bit-identical */
    const size_t nt = (size_t)rows * C;
    float *tok = random_floats(nt, -1, 1), *merged = malloc(sizeof(float) * nt);
    float *back = malloc(sizeof(float) * nt);
    visc_swin_merge_copy(tok, merged, B, grid, grid, C, 0);
    visc_swin_merge_copy(back, merged, B, grid, grid, C, 1);
    float *d_tok = up(tok, sizeof(float) * nt), *d_merged = dev(sizeof(float) * nt);
    float *d_back = dev(sizeof(float) * nt);
    launched(visc_cuda_swin_merge_copy(ctx, d_tok, d_merged, B, grid, grid, C, 0), "merge");
    launched(visc_cuda_swin_merge_copy(ctx, d_back, d_merged, B, grid, grid, C, 1), "merge back");
    float *gm = down(d_merged, nt), *gback = down(d_back, nt);
    snprintf(name, sizeof name, "swin patch merging [%d x %dx%d x %d]: bit-identical", B, grid,
             grid, C);
    expect_bits(name, gm, merged, nt, sizeof(float));
    snprintf(name, sizeof name, "swin patch merging backward: bit-identical");
    expect_bits(name, gback, back, nt, sizeof(float));
    /* the token mean (the pooled features) and its backward */
    float *mean = malloc(sizeof(float) * B * C), *dtok = malloc(sizeof(float) * nt);
    const int NT = grid * grid;
    visc_token_mean_forward(mean, tok, B, NT, C);
    visc_token_mean_backward(dtok, mean, B, NT, C);
    float *d_mean = dev(sizeof(float) * B * C);
    launched(visc_cuda_token_mean_forward(ctx, d_mean, d_tok, B, NT, C), "token mean");
    launched(visc_cuda_token_mean_backward(ctx, d_back, d_mean, B, NT, C), "token mean backward");
    float *gmean = down(d_mean, (size_t)B * C), *gdtok = down(d_back, nt);
    snprintf(name, sizeof name, "token mean [%d, %d, %d]: bit-identical", B, NT, C);
    expect_bits(name, gmean, mean, (size_t)B * C, sizeof(float));
    snprintf(name, sizeof name, "token mean backward [%d, %d, %d]: bit-identical", B, NT, C);
    expect_bits(name, gdtok, dtok, nt, sizeof(float));
    /* V2's temperature exp(min(logit_scale, log 100)) and its clamp's gradient */
    float ls[4] = {logf(10.0f), 4.0f, logf(100.0f), 5.0f}, dhs[4] = {1, -2, 3, 4}, hs[4], dls[4];
    for (int h = 0; h < 4; h++) hs[h] = expf(fminf(ls[h], logf(100.0f)));
    for (int h = 0; h < 4; h++) dls[h] = ls[h] <= logf(100.0f) ? dhs[h] * hs[h] : 0.0f;
    float *d_ls = up(ls, sizeof ls), *d_dhs = up(dhs, sizeof dhs), *d_hs = dev(sizeof hs);
    float *d_dls = dev(sizeof dls);
    launched(visc_cuda_swin_head_scale(ctx, d_hs, d_ls, 4), "head scale");
    launched(visc_cuda_swin_head_scale_backward(ctx, d_dls, d_ls, d_dhs, d_hs, 4),
             "head scale backward");
    float *ghs = down(d_hs, 4), *gdls = down(d_dls, 4);
    expect_close("swin v2 temperature exp(min(s, log 100))", ghs, hs, 4, 0, 2e-7);
    expect_close("swin v2 temperature backward (clamped above log 100)", gdls, dls, 4, 0, 4e-7);
    void *dfree[] = {d_rel,  d_table, d_dbias, d_bias, d_dtable, d_tok, d_merged,
                     d_back, d_mean,  d_ls,    d_dhs,  d_hs,     d_dls};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {rel,  table, dbias, bias,  dtable, tok,   merged, back,
                     mean, dtok,  gm,    gback, gmean,  gdtok, ghs,    gdls};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* ---- CaiT's talking heads, step by step, and LayerScale, against their CPU twins ---- */
static void check_talking_heads(int B, int H, int T, int D) {
    char name[160];
    const int C = H * D;
    const visc_th_dims d = {B, H, T, D, C, 1.0f / sqrtf((float)D)};
    const size_t nqkv = (size_t)B * T * 3 * C, TT = (size_t)T * T, nS = (size_t)B * H * TT;
    const size_t natt = (size_t)B * T * C, rows = (size_t)B * H * T;
    float *qkv = random_floats(nqkv, -1, 1), *W = random_floats((size_t)H * H, -1, 1);
    float *bias = random_floats((size_t)H, -1, 1), *datt = random_floats(natt, -1, 1);
    float *gS = random_floats(nS, -1, 1);
    float *S = malloc(sizeof(float) * nS), *P = malloc(sizeof(float) * nS);
    float *att = malloc(sizeof(float) * natt), *dA = malloc(sizeof(float) * nS);
    float *dqkv = calloc(nqkv, sizeof(float)), *dW = malloc(sizeof(float) * H * H);
    float *db = malloc(sizeof(float) * H), *dS = malloc(sizeof(float) * nS);
    visc_th_scores(S, qkv, &d);
    visc_th_mix(P, S, W, bias, B, H, TT, 0);
    visc_th_softmax(P, rows, T);
    visc_th_apply(att, P, qkv, &d);
    visc_th_grad_a(dA, datt, qkv, &d);
    visc_th_grad_v(dqkv, P, datt, &d);
    visc_th_mix_grad(dW, db, dA, P, B, H, TT);
    memcpy(dS, gS, sizeof(float) * nS);
    visc_th_softmax_backward(dS, P, rows, T);
    visc_th_grad_qk(dqkv, dS, qkv, &d);
    float *d_qkv = up(qkv, sizeof(float) * nqkv), *d_W = up(W, sizeof(float) * H * H);
    float *d_bias = up(bias, sizeof(float) * H), *d_datt = up(datt, sizeof(float) * natt);
    float *d_S = dev(sizeof(float) * nS), *d_P = dev(sizeof(float) * nS);
    float *d_att = dev(sizeof(float) * natt), *d_dA = dev(sizeof(float) * nS);
    float *d_dqkv = dev(sizeof(float) * nqkv), *d_dW = dev(sizeof(float) * H * H);
    float *d_db = dev(sizeof(float) * H), *d_dS = up(gS, sizeof(float) * nS);
    /* each step from the CPU's input, so that a mismatch names its step */
    launched(visc_cuda_th_scores(ctx, d_S, d_qkv, &d), "th scores");
    float *g_scores = down(d_S, nS);
    if (visc_cuda_upload(ctx, d_S, S, sizeof(float) * nS)) die_cuda("upload");
    launched(visc_cuda_th_mix(ctx, d_P, d_S, d_W, d_bias, B, H, TT, 0), "th mix");
    float *g_mix = down(d_P, nS);
    launched(visc_cuda_th_softmax(ctx, d_P, rows, T), "th softmax");
    float *g_soft = down(d_P, nS);
    if (visc_cuda_upload(ctx, d_P, P, sizeof(float) * nS)) die_cuda("upload");
    launched(visc_cuda_th_apply(ctx, d_att, d_P, d_qkv, &d), "th apply");
    launched(visc_cuda_th_grad_a(ctx, d_dA, d_datt, d_qkv, &d), "th grad a");
    launched(visc_cuda_th_grad_v(ctx, d_dqkv, d_P, d_datt, &d), "th grad v");
    float *g_dA = down(d_dA, nS);
    if (visc_cuda_upload(ctx, d_dA, dA, sizeof(float) * nS)) die_cuda("upload");
    launched(visc_cuda_th_mix_grad(ctx, d_dW, d_db, d_dA, d_P, B, H, TT), "th mix grad");
    launched(visc_cuda_th_softmax_backward(ctx, d_dS, d_P, rows, T), "th softmax backward");
    float *g_dsoft = down(d_dS, nS);
    if (visc_cuda_upload(ctx, d_dS, dS, sizeof(float) * nS)) die_cuda("upload");
    launched(visc_cuda_th_grad_qk(ctx, d_dqkv, d_dS, d_qkv, &d), "th grad qk");
    /* the CPU's intermediate: the mix alone (softmax in place above) */
    float *mix = malloc(sizeof(float) * nS), *soft = malloc(sizeof(float) * nS);
    visc_th_mix(mix, S, W, bias, B, H, TT, 0);
    memcpy(soft, mix, sizeof(float) * nS);
    visc_th_softmax(soft, rows, T);
    float *dsoft = malloc(sizeof(float) * nS);
    memcpy(dsoft, gS, sizeof(float) * nS);
    visc_th_softmax_backward(dsoft, P, rows, T);
    /* the mix with W transposed and no bias: backward's (models/cait.c) */
    float *mix_t = malloc(sizeof(float) * nS);
    visc_th_mix(mix_t, S, W, NULL, B, H, TT, 1);
    if (visc_cuda_upload(ctx, d_S, S, sizeof(float) * nS)) die_cuda("upload");
    launched(visc_cuda_th_mix(ctx, d_P, d_S, d_W, NULL, B, H, TT, 1), "th mix, transposed");
    float *g_mix_t = down(d_P, nS);
    struct {
        const char *what;
        float *got;
        const float *want;
        size_t n;
    } outs[] = {{"scores", g_scores, S, nS},
                {"head mix", g_mix, mix, nS},
                {"head mix transposed, no bias", g_mix_t, mix_t, nS},
                {"softmax", g_soft, soft, nS},
                {"A v", down(d_att, natt), att, natt},
                {"dA", g_dA, dA, nS},
                {"dq dk dv", down(d_dqkv, nqkv), dqkv, nqkv},
                {"head mix dW", down(d_dW, (size_t)H * H), dW, (size_t)H * H},
                {"head mix db", down(d_db, (size_t)H), db, (size_t)H},
                {"softmax backward", g_dsoft, dsoft, nS}};
    for (size_t o = 0; o < sizeof outs / sizeof *outs; o++) {
        snprintf(name, sizeof name, "talking heads %s: B %d H %d T %d D %d", outs[o].what, B, H, T,
                 D);
        expect_close(name, outs[o].got, outs[o].want, outs[o].n,
                     2e-5 * max_abs(outs[o].want, outs[o].n), 1e-4);
        free(outs[o].got);
    }
    /* LayerScale */
    const int64_t R = (int64_t)B * T;
    float *g = random_floats(natt, 0.5f, 1.5f), *ls = malloc(sizeof(float) * natt);
    float *dls = malloc(sizeof(float) * natt), *dgam = malloc(sizeof(float) * C);
    visc_layerscale_forward(ls, att, g, R, C);
    visc_layerscale_backward(dls, dgam, datt, att, g, R, C);
    float *d_g = up(g, sizeof(float) * natt), *d_ls = dev(sizeof(float) * natt);
    float *d_dls = dev(sizeof(float) * natt), *d_dgam = dev(sizeof(float) * C);
    if (visc_cuda_upload(ctx, d_att, att, sizeof(float) * natt)) die_cuda("upload");
    launched(visc_cuda_layerscale_forward(ctx, d_ls, d_att, d_g, R, C), "layerscale");
    launched(visc_cuda_layerscale_backward(ctx, d_dls, d_dgam, d_datt, d_att, d_g, R, C),
             "layerscale backward");
    float *g_ls = down(d_ls, natt), *g_dls = down(d_dls, natt), *g_dgam = down(d_dgam, C);
    snprintf(name, sizeof name, "layerscale [%lld, %d]: forward and din bit-identical",
             (long long)R, C);
    expect_bits(name, g_ls, ls, natt, sizeof(float));
    expect_bits(name, g_dls, dls, natt, sizeof(float));
    snprintf(name, sizeof name, "layerscale [%lld, %d]: dgamma bit-identical (rows in order)",
             (long long)R, C);
    expect_bits(name, g_dgam, dgam, (size_t)C, sizeof(float));
    void *dfree[] = {d_qkv,  d_W,  d_bias, d_datt, d_S, d_P,  d_att, d_dA,
                     d_dqkv, d_dW, d_db,   d_dS,   d_g, d_ls, d_dls, d_dgam};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {qkv, W,   bias, datt,  gS, S,  P,   att,  dA,   dqkv,  dW,     db,
                     dS,  mix, soft, dsoft, g,  ls, dls, dgam, g_ls, g_dls, g_dgam, mix_t};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* The talking-heads steps that read the qkv rows, under bf16, where the
 * rows are the projection's bf16 operand and A v writes att as the output
 * projection's: the CPU's values from the same (bf16) rows, within the
 * fp32 tolerances above, att rounded once more. */
static void check_talking_heads_bf16(int B, int H, int T, int D) {
    char name[160];
    const int C = H * D, was_bf16 = visc_cuda_bf16(ctx);
    const visc_th_dims d = {B, H, T, D, C, 1.0f / sqrtf((float)D)};
    const size_t nqkv = (size_t)B * T * 3 * C, nS = (size_t)B * H * T * T;
    const size_t natt = (size_t)B * T * C;
    float *qkv = random_floats(nqkv, -1, 1), *A = random_floats(nS, 0, 0.1f);
    float *datt = random_floats(natt, -1, 1), *dS = random_floats(nS, -1, 1);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = bf16_round(qkv[i]);
    float *S = malloc(sizeof(float) * nS), *att = malloc(sizeof(float) * natt);
    float *dA = malloc(sizeof(float) * nS), *dqkv = calloc(nqkv, sizeof(float));
    visc_th_scores(S, qkv, &d);
    visc_th_apply(att, A, qkv, &d);
    visc_th_grad_a(dA, datt, qkv, &d);
    visc_th_grad_qk(dqkv, dS, qkv, &d); /* v's columns stay 0 */
    visc_cuda_set_bf16(ctx, 1);
    void *d_qkv = up_bf16(qkv, nqkv), *d_att = dev(sizeof(uint16_t) * natt);
    float *d_A = up(A, sizeof(float) * nS), *d_datt = up(datt, sizeof(float) * natt);
    float *d_dS = up(dS, sizeof(float) * nS), *d_S = dev(sizeof(float) * nS);
    float *d_dA = dev(sizeof(float) * nS), *d_dqkv = up(dqkv, sizeof(float) * nqkv);
    launched(visc_cuda_th_scores(ctx, d_S, d_qkv, &d), "th scores, bf16");
    launched(visc_cuda_th_apply(ctx, d_att, d_A, d_qkv, &d), "th apply, bf16");
    launched(visc_cuda_th_grad_a(ctx, d_dA, d_datt, d_qkv, &d), "th grad a, bf16");
    launched(visc_cuda_th_grad_qk(ctx, d_dqkv, d_dS, d_qkv, &d), "th grad qk, bf16");
    visc_cuda_set_bf16(ctx, was_bf16);
    float *g_S = down(d_S, nS), *g_att = down_bf16(d_att, natt), *g_dA = down(d_dA, nS);
    float *g_dqkv = down(d_dqkv, nqkv);
    const char *what[] = {"scores", "dA", "dq dk"};
    const float *got[] = {g_S, g_dA, g_dqkv}, *want[] = {S, dA, dqkv};
    const size_t count[] = {nS, nS, nqkv};
    for (int o = 0; o < 3; o++) {
        snprintf(name, sizeof name, "talking heads %s, qkv bf16: B %d H %d T %d D %d", what[o], B,
                 H, T, D);
        expect_close(name, got[o], want[o], count[o], 2e-5 * max_abs(want[o], count[o]), 1e-4);
    }
    snprintf(name, sizeof name, "talking heads A v, qkv and att bf16: B %d H %d T %d D %d", B, H, T,
             D);
    expect_close(name, g_att, att, natt, 2e-5 * max_abs(att, natt), 1.0 / 256 + 1e-4);
    void *dfree[] = {d_qkv, d_att, d_A, d_datt, d_dS, d_S, d_dA, d_dqkv};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {qkv, A, datt, dS, S, att, dA, dqkv, g_S, g_att, g_dA, g_dqkv};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* ---- sums: visc_add_forward's bits, the residual block's add + ReLU,
 * and two gradient paths joined through a ReLU (visc_add_relu_backward's
 * bits, which are visc_add_forward's then visc_relu_backward's) ---- */
static void check_add(size_t n) {
    char name[128];
    float *a = random_floats(n, -2, 2), *b = random_floats(n, -2, 2);
    float *mask = random_floats(n, -1, 1);
    a[3] = NAN;
    b[7] = INFINITY;
    for (size_t i = 0; i < n; i += 89) mask[i] = 0.0f; /* ReLU's gradient at 0 is 0 */
    float *sum = malloc(sizeof(float) * n), *res = malloc(sizeof(float) * n);
    float *joined = malloc(sizeof(float) * n);
    visc_add_forward(sum, a, b, n);
    visc_relu_backward(joined, sum, mask, n);
    float *cpu_joined = malloc(sizeof(float) * n);
    visc_add_relu_backward(cpu_joined, a, b, mask, n);
    snprintf(name, sizeof name, "add + relu backward [%zu]: the CPU's one pass is its two", n);
    expect_bits(name, cpu_joined, joined, n, sizeof(float));
    for (size_t i = 0; i < n; i++) { /* models/resnet.c's add_relu */
        const float v = a[i] + b[i];
        res[i] = v > 0.0f ? v : 0.0f;
    }
    float *d_a = up(a, sizeof(float) * n), *d_b = up(b, sizeof(float) * n);
    float *d_out = dev(sizeof(float) * n);
    launched(visc_cuda_add(ctx, d_out, d_a, d_b, n), "add");
    float *h_sum = down(d_out, n);
    launched(visc_cuda_add(ctx, d_a, d_a, d_b, n), "add in place"); /* out aliases a */
    float *h_inplace = down(d_a, n);
    if (visc_cuda_upload(ctx, d_a, a, sizeof(float) * n)) die_cuda("upload");
    launched(visc_cuda_add_relu(ctx, d_a, d_b, n), "add + relu");
    float *h_res = down(d_a, n);
    float *d_mask = up(mask, sizeof(float) * n);
    if (visc_cuda_upload(ctx, d_a, a, sizeof(float) * n)) die_cuda("upload");
    launched(visc_cuda_add_relu_backward(ctx, d_out, d_a, d_b, d_mask, n), "add + relu backward");
    float *h_joined = down(d_out, n);
    launched(visc_cuda_add_relu_backward(ctx, d_b, d_a, d_b, d_mask, n),
             "add + relu backward in place"); /* din aliases b */
    float *h_joined_inplace = down(d_b, n);
    snprintf(name, sizeof name, "add + relu backward [%zu]: bit-identical", n);
    expect_bits(name, h_joined, joined, n, sizeof(float));
    snprintf(name, sizeof name, "add + relu backward in place [%zu]: bit-identical", n);
    expect_bits(name, h_joined_inplace, joined, n, sizeof(float));
    snprintf(name, sizeof name, "add [%zu]: bit-identical", n);
    expect_bits(name, h_sum, sum, n, sizeof(float));
    snprintf(name, sizeof name, "add in place [%zu]: bit-identical", n);
    expect_bits(name, h_inplace, sum, n, sizeof(float));
    snprintf(name, sizeof name, "add + relu [%zu]: bit-identical", n);
    expect_bits(name, h_res, res, n, sizeof(float));
    void *dfree[] = {d_a, d_b, d_out, d_mask};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {a,     b,    sum,    res,        h_sum,    h_inplace,
                     h_res, mask, joined, cpu_joined, h_joined, h_joined_inplace};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* The bf16 sums and ReLU's backward: each the bf16 rounding of the CPU's
 * fp32 result from the same bf16 values, bit for bit. */
static void check_add_bf16(size_t n) {
    char name[128];
    float *a = random_floats(n, -2, 2), *b = random_floats(n, -2, 2), *g = random_floats(n, -1, 1);
    for (size_t i = 0; i < n; i++) {
        a[i] = bf16_round(a[i]), b[i] = bf16_round(b[i]), g[i] = bf16_round(g[i]);
        if (i % 61 == 3) a[i] = 0.0f; /* ReLU's backward at 0 */
        if (i % 67 == 5) g[i] = 0.0f; /* and where g is the output */
    }
    float *sum = malloc(sizeof(float) * n), *res = malloc(sizeof(float) * n);
    float *dx = malloc(sizeof(float) * n), *joined = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        const float v = a[i] + b[i];
        sum[i] = bf16_round(v);
        res[i] = bf16_round(v > 0.0f ? v : 0.0f);
        dx[i] = a[i] > 0.0f ? g[i] : 0.0f;
        joined[i] =
            g[i] > 0.0f ? sum[i] : 0.0f; /* the rounded sum through a ReLU whose output was g */
    }
    void *d_a = up_bf16(a, n), *d_b = up_bf16(b, n), *d_g = up_bf16(g, n);
    uint16_t *d_mask = up_bf16(g, n), *d_a2 = up_bf16(a, n);
    void *d_out = dev(sizeof(uint16_t) * n);
    launched(visc_cuda_add_bf16(ctx, d_out, d_a, d_b, n), "add (bf16)");
    float *h_sum = down_bf16(d_out, n);
    launched(visc_cuda_relu_backward_bf16(ctx, d_out, d_g, d_a, n), "relu backward (bf16)");
    float *h_dx = down_bf16(d_out, n);
    launched(visc_cuda_relu_backward_bf16(ctx, d_g, d_g, d_a, n), "relu backward (bf16) in place");
    float *h_dx_inplace = down_bf16(d_g, n);
    launched(visc_cuda_add_relu_backward_bf16(ctx, d_out, d_a, d_b, d_mask, n),
             "add + relu backward (bf16)");
    float *h_joined = down_bf16(d_out, n);
    launched(visc_cuda_add_relu_backward_bf16(ctx, d_a2, d_a2, d_b, d_mask, n),
             "add + relu backward (bf16) in place"); /* din aliases a */
    float *h_joined_inplace = down_bf16(d_a2, n);
    launched(visc_cuda_add_relu_bf16(ctx, d_a, d_b, n), "add + relu (bf16)");
    float *h_res = down_bf16(d_a, n);
    snprintf(name, sizeof name, "add + relu backward bf16 [%zu]: bit-identical", n);
    expect_bits(name, h_joined, joined, n, sizeof(float));
    snprintf(name, sizeof name, "add + relu backward bf16 in place [%zu]: bit-identical", n);
    expect_bits(name, h_joined_inplace, joined, n, sizeof(float));
    snprintf(name, sizeof name, "add bf16 [%zu]: the rounded fp32 sum, bit-identical", n);
    expect_bits(name, h_sum, sum, n, sizeof(float));
    snprintf(name, sizeof name, "add + relu bf16 [%zu]: bit-identical", n);
    expect_bits(name, h_res, res, n, sizeof(float));
    snprintf(name, sizeof name, "relu backward bf16 [%zu]: bit-identical", n);
    expect_bits(name, h_dx, dx, n, sizeof(float));
    snprintf(name, sizeof name, "relu backward bf16 in place [%zu]: bit-identical", n);
    expect_bits(name, h_dx_inplace, dx, n, sizeof(float));
    /* tensors that start 2 bytes past a 16-byte boundary: one value a
     * thread (the kernels take 8 where every tensor is aligned) */
    uint16_t *d_a1 = up_bf16(a, n), *d_b1 = up_bf16(b, n);
    launched(visc_cuda_add_bf16(ctx, (uint16_t *)d_out + 1, d_a1 + 1, d_b1 + 1, n - 1),
             "add (bf16), unaligned");
    float *h_sum1 = down_bf16(d_out, n);
    snprintf(name, sizeof name, "add bf16 unaligned [%zu]: bit-identical", n - 1);
    expect_bits(name, h_sum1 + 1, sum + 1, n - 1, sizeof(float));
    void *dfree[] = {d_a, d_b, d_g, d_out, d_a1, d_b1, d_mask, d_a2};
    for (size_t i = 0; i < sizeof dfree / sizeof *dfree; i++) visc_cuda_free(ctx, dfree[i]);
    void *hfree[] = {a,
                     b,
                     g,
                     sum,
                     res,
                     dx,
                     h_sum,
                     h_dx,
                     h_dx_inplace,
                     h_res,
                     h_sum1,
                     joined,
                     h_joined,
                     h_joined_inplace};
    for (size_t i = 0; i < sizeof hfree / sizeof *hfree; i++) free(hfree[i]);
}

/* A batch of bytes to the model's input: every byte value in every
 * channel, ImageNet's and odd statistics, the host's floats bit for bit. */
static void check_normalize_bytes(size_t images, size_t plane, const float mean[3],
                                  const float std[3]) {
    char name[128];
    size_t n = images * 3 * plane;
    uint8_t *in = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) in[i] = (uint8_t)(i < 768 ? i % 256 : next_u64() >> 56);
    float *want = malloc(sizeof(float) * (n ? n : 1));
    visc_normalize_bytes(in, images, plane, mean, std, want);
    uint8_t *d_in = up(in, n);
    float *d_out = dev(sizeof(float) * n);
    launched(visc_cuda_normalize_bytes(ctx, d_out, d_in, images, plane, mean, std),
             "normalize bytes");
    float *got = down(d_out, n);
    snprintf(name, sizeof name, "normalize bytes [%zu x 3 x %zu]: bit-identical", images, plane);
    expect_bits(name, got, want, n, sizeof(float));
    visc_cuda_free(ctx, d_in);
    visc_cuda_free(ctx, d_out);
    free(in), free(want), free(got);
}

/* The checks in groups, each runnable alone (`test_cuda_kernels matmul`),
 * so that a kernel that breaks the context cannot hide the others. */
/* The profiler's table parsed back from its text: per name, calls per
 * step; the shares' and the times' sums against the total line. */
typedef struct {
    int entries;
    double add, add_relu, matmul, shares, ms, total;
} profile_read;

static profile_read read_profile(const char *text) {
    profile_read r = {0, 0, 0, 0, 0, 0, -1};
    const char *line = text;
    while (line && *line) {
        double ms, share, calls;
        char name[128];
        if (sscanf(line, " %lf %lf%% %lf %127[^\n]", &ms, &share, &calls, name) == 4) {
            r.entries++;
            r.shares += share, r.ms += ms;
            if (!strcmp(name, "add")) r.add = calls;
            if (!strcmp(name, "add + relu")) r.add_relu = calls;
            if (!strcmp(name, "cuBLASLt matmul (fp32)")) r.matmul = calls;
        } else if (sscanf(line, " %lf %lf%% total", &ms, &share) == 2) {
            r.total = ms;
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    return r;
}

/* Runs `steps` steps of three sums, one sum + ReLU and one product under
 * the profiler (only the sums when `sums_only`); its report, parsed. */
static profile_read profiled_steps(int steps, int sums_only, float *d_out, const float *d_a,
                                   const float *d_b, size_t n) {
    launched(visc_cuda_profile_start(ctx), "profile start");
    for (int step = 0; step < steps; step++) {
        for (int k = 0; k < 3; k++) launched(visc_cuda_add(ctx, d_out, d_a, d_b, n), "add");
        if (sums_only) continue;
        launched(visc_cuda_add_relu(ctx, d_out, d_a, n), "add + relu");
        launched(visc_cuda_matmul_f32(ctx, d_out, d_a, d_b, NULL, 64, 64, 64, 0, 0, 0.0f),
                 "matmul");
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f || visc_cuda_profile_report(ctx, f, steps)) {
        printf("FAIL profile report: %s\n", visc_last_error());
        failed++;
    }
    if (f) fclose(f);
    profile_read r = read_profile(text ? text : "");
    free(text);
    return r;
}

/* The profiler: each launch and product charged to its name, counted per
 * step; the shares make 100% and the rows the total; a second profile
 * starts from an empty table. */
static void check_profile(void) {
    const size_t n = 64 * 64;
    float *a = random_floats(n, -1, 1);
    float *d_a = up(a, sizeof(float) * n), *d_b = up(a, sizeof(float) * n);
    float *d_out = dev(sizeof(float) * n);
    const profile_read r = profiled_steps(2, 0, d_out, d_a, d_b, n);
    launched(visc_cuda_add(ctx, d_out, d_a, d_b, n), "add after the report");
    const profile_read again = profiled_steps(1, 1, d_out, d_a, d_b, n);
    const float got[] = {(float)r.entries,     (float)r.add,    (float)r.add_relu,
                         (float)r.matmul,      (float)r.shares, (float)(r.ms - r.total),
                         (float)again.entries, (float)again.add};
    const float want[] = {3, 3, 1, 1, 100, 0, 1, 3};
    expect_close("profile: 3 kinds of work, their calls per step, shares and times adding up; "
                 "a new profile's table empty",
                 got, want, sizeof got / sizeof *got, 0.2, 0.0);
    visc_cuda_free(ctx, d_a), visc_cuda_free(ctx, d_b), visc_cuda_free(ctx, d_out);
    free(a);
}

/* The allocation table: visc_cuda_memory_allocated follows every block
 * visc_cuda_alloc hands out and visc_cuda_free takes back, the peak its
 * high-water mark. */
static void check_memory_accounting(void) {
    size_t now0, peak0, now1, peak1, now2, peak2;
    visc_cuda_memory_allocated(ctx, &now0, &peak0);
    void *a = dev(3 << 20), *b = dev(5 << 20);
    visc_cuda_memory_allocated(ctx, &now1, &peak1);
    visc_cuda_free(ctx, a);
    void *c = dev(1 << 20);
    visc_cuda_memory_allocated(ctx, &now2, &peak2);
    visc_cuda_free(ctx, b), visc_cuda_free(ctx, c);
    size_t now3;
    visc_cuda_memory_allocated(ctx, &now3, NULL);
    const float got[] = {(float)(now1 - now0), (float)(now2 - now0), (float)(now3 - now0),
                         (float)(peak1 >= now0 + (8u << 20) && peak0 <= peak1),
                         (float)(peak2 - peak1)};
    const float want[] = {8 << 20, 6 << 20, 0, 1, 0};
    expect_close("device memory allocated: 3 + 5 MiB, then 5 + 1, then none; the peak kept", got,
                 want, sizeof got / sizeof *got, 0.0, 0.0);
}

static void group_layernorm(void) {
    check_layernorm(1000, 192, 1, 0.0f, 2.0f);
    check_layernorm(997, 768, 1, 100.0f, 2.0f); /* a large mean: the centred statistics */
    check_layernorm(65, 1000, 0, 3.0f, 2.0f);   /* C not a multiple of 32, no affine */
    check_layernorm(3, 40, 1, 0.0f, 2.0f);      /* fewer rows than column-sum chunks */
    /* A variance below eps (1e-5): where eps enters the formula shows (with
     * a variance near 1 a misplaced or missing eps moves rstd by < 1e-5). */
    check_layernorm(512, 384, 1, 0.0f, 0.003f);
    check_layernorm(256 * 197, 384, 1, 0.0f, 2.0f); /* ViT-S/16, batch 256: 50432 rows */
}
static void group_xent(void) {
    check_xent(256, 10, 0.0f);
    check_xent(300, 1000, 0.1f);
    check_xent(64, 5, 0.3f); /* few classes: the off-label target s / K weighs in the gradient */
    check_infonce(128, 16384, 128, 0.2f, 1); /* MoCo v2's head (128) and temperature */
    check_infonce(5, 37, 9, 0.07f, 1);       /* nothing aligned, a sharp temperature */
    check_infonce(64, 4096, 128, 0.2f, 0);
    check_ntxent(256, 1, 0, 128, 0.1f, 1); /* SimCLR's head (128) and temperature */
    check_ntxent(3, 1, 0, 7, 0.5f, 1);     /* rows shorter than a block, nothing aligned */
    check_ntxent(200, 1, 0, 64, 0.2f, 0);
    check_ntxent(128, 4, 2, 128, 0.1f, 1); /* rank 2 of 4: 1024 candidates, gathered */
    check_ntxent(3, 3, 1, 7, 0.5f, 1);     /* a middle rank, nothing aligned */
    check_ntxent(64, 2, 1, 32, 0.2f, 0);
    check_l2_normalize(256, 128, 1.0f); /* MoCo v2's keys and queries */
    check_l2_normalize(7, 300, 0.5f);   /* --symmetric's weight; more than one pass of threads */
    check_l2_normalize(3, 5, -1.75f);
    check_xent_soft(256, 10);
    check_xent_soft(300, 1000);
    check_topk(256, 10, 0);
    check_topk(300, 1000, 0);
    check_topk(200, 4, 1); /* fewer classes than 5: top-5 is top-K */
    check_topk(300, 1000, 1);
}
static void group_gelu(void) {
    check_gelu(((size_t)1 << 20) + 3);
    check_gelu(((size_t)5 << 20) + 3); /* past the launch cap: the grid-stride loop's second pass */
    check_bias_gelu(257, 384);
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        check_gelu_linear(197, 96, 24, bf16); /* a ViT MLP's second half, small */
        check_gelu_linear(33, 50, 17, bf16);  /* odd shapes */
        check_mlp_backward(70, 24, 96, 20, bf16);
        check_mlp_backward(33, 17, 50, 13, bf16); /* odd shapes */
    }
}
static void group_optim(void) {
    check_optimizer(VISC_OPT_ADAMW, 0.0f, 0, 0, 40000);
    check_optimizer(VISC_OPT_ADAMW, 0.0f, 0, 1, 40000);
    check_optimizer(VISC_OPT_SGD, 0.9f, 0, 0, 40000);
    check_optimizer(VISC_OPT_SGD, 0.9f, 1, 0, 40000);
    check_optimizer(VISC_OPT_SGD, 0.0f, 0, 0, 40000);
    /* A ViT-S sized buffer (22M parameters in one tensor here): 1343 pieces. */
    check_optimizer(VISC_OPT_ADAMW, 0.0f, 0, 0, 22000000);
    check_optimizer(VISC_OPT_LARS, 0.9f, 0, 0, 40000);
    check_optimizer(VISC_OPT_LARS, 0.9f, 1, 1, 40000);
    check_optimizer(VISC_OPT_LAMB, 0.0f, 0, 0, 40000);
    check_optimizer(VISC_OPT_LAMB, 0.0f, 0, 1, 40000);
    check_clip(((size_t)1 << 20) + 3, 1.0f); /* norm ~590: scaled */
    check_clip(1000, 1e6f);                  /* left alone */
    check_ema(((size_t)1 << 20) + 7, 0.999f);
    check_ema(((size_t)5 << 20) + 7, 0.999f); /* several grid-stride passes */
    check_ema(1000, 0.99f);
}
static void group_convert(void) {
    check_convert();
    check_layout(2, 64, 56 * 56); /* a ResNet activation */
    check_layout(3, 37, 45);      /* partial tiles both ways */
    check_layout(64, 3, 49);      /* a 7x7 stem's weights [K, C, R*S] */
}
static void group_matmul(void) {
    check_matmul("linear forward Y = X W^T + b", 394, 192, 384, 0, 1, 1, 0.0f, 0);
    /* The same shape again, on other data at other addresses: the plan the
     * context kept from the first, with this call's bias. */
    check_matmul("linear forward again, the kept plan", 394, 192, 384, 0, 1, 1, 0.0f, 0);
    check_matmul("linear dX = dY W", 394, 384, 192, 0, 0, 0, 0.0f, 0);
    check_matmul("linear dW += dY^T X", 192, 384, 394, 1, 0, 0, 1.0f, 0);
    check_matmul("odd shapes", 33, 17, 50, 0, 1, 1, 0.0f, 0);
    /* Tensors inside larger buffers: the heuristic must not assume 256-byte
     * alignment. Shift 16: a tensor of the parameter table (64 bytes in
     * fp32, 32 in bf16); shift 1: one element, the least there can be. */
    check_matmul("linear forward, table-aligned", 394, 192, 384, 0, 1, 1, 0.0f, 16);
    check_matmul("linear dW += dY^T X, element-aligned", 192, 384, 394, 1, 0, 0, 1.0f, 1);
    check_matmul_bf16_out("in the epilogue", 41, 24, 56);
    /* the bias by a kernel, where cuBLASLt would have no epilogue for it
     * (shapes of their own: a shape's choice is kept) */
    visc_cuda_set_bias_epilogue(ctx, 0);
    check_matmul("bias by a kernel", 41, 24, 40, 0, 1, 1, 0.0f, 0);
    check_matmul_bf16_out("by a kernel", 41, 24, 48);
    visc_cuda_set_bias_epilogue(ctx, 1);
    /* attention's forms (attention_tc.cu), and alpha, beta, gaps and padding */
    check_products(49, 49, 32, 0, 1, 6, 0, 1.0f, 0.0f); /* S = Q K^T */
    check_products(49, 32, 49, 1, 0, 6, 8, 1.0f, 0.0f); /* dK = dS^T Q, rows padded */
    check_products(13, 7, 19, 0, 0, 3, 3, 0.5f, 1.0f);  /* odd sizes, accumulated */
    check_products(13, 7, 19, 1, 1, 4, 5, -2.0f, 0.0f);
}
static void group_linear(void) {
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        check_linear(128, 512, 10, 0, bf16);     /* a ResNet-18's classifier */
        check_linear(37, 64, 100, 1, bf16);      /* odd shapes, element-aligned tensors */
        check_linear(256, 2048, 1000, 16, bf16); /* ResNet-50 on ImageNet, table-aligned */
        check_linear(394, 384, 1536, 0, bf16);   /* a ViT-S MLP's first layer, 2 images */
    }
}
static void attention_cases(int bf16) {
    /* B, H, Nq, Nk, D, nmask, bias, head_scale, dead_row, bf16 (set below) */
    static const attn_case cases[] = {
        {2, 6, 197, 197, 64, 0, 0, 0, 0, 0}, /* ViT-S */
        {8, 3, 49, 49, 32, 4, 1, 0, 0, 0},   /* Swin: windows, bias, shift masks */
        {4, 2, 64, 64, 32, 2, 1, 1, 0, 0},   /* Swin V2 */
        {3, 4, 1, 197, 48, 0, 0, 0, 0, 0},   /* CaiT's class attention */
        {2, 2, 40, 33, 128, 1, 0, 0, 1, 0},  /* D 128, a row with every key masked */
        {3, 2, 40, 33, 32, 0, 1, 1, 0, 0},   /* bias and head scales off the diagonal */
        /* the fused bf16 kernels' edges: D padded to 48 (40) and 16, row and
         * key tiles cut short (70 rows, 130 keys), a fully masked row */
        {2, 3, 70, 130, 40, 2, 0, 0, 1, 0},
        {3, 1, 20, 17, 16, 0, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        attn_case c = cases[i];
        c.bf16 = bf16;
        check_attention(c);
    }
}
static void group_attention(void) {
    attention_cases(0);
    attention_cases(1); /* on tensor cores */
}
static void group_tokens(void) {
    check_tokens(8, 197, 384); /* ViT-S's position table and class tokens */
    check_tokens(3, 5, 7);
    check_patch_embed(4, 3, 32, 4, 192, 1); /* deit_tiny_patch4_32 */
    check_patch_embed(2, 1, 28, 4, 64, 0);  /* no class token (CaiT's layout) */
}
static void group_cait(void) {
    check_talking_heads(2, 4, 49, 48); /* cait_xxs24 at 112 px */
    check_talking_heads(1, 3, 5, 8);
    check_talking_heads_bf16(2, 4, 49, 48);
    check_talking_heads_bf16(1, 3, 5, 8);
}
static void group_eltwise(void) {
    check_add(((size_t)1 << 20) + 5);
    check_add(((size_t)5 << 20) + 5); /* several grid-stride passes */
    check_add(9);                     /* fewer elements than one block */
    check_add_bf16(((size_t)1 << 20) + 5);
    check_add_bf16(9);
    check_profile();
    check_memory_accounting();
}
static void group_input(void) {
    const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f},
                imagenet_std[3] = {0.229f, 0.224f, 0.225f};
    const float odd_mean[3] = {0.5f, 0.0f, 0.7f}, odd_std[3] = {0.5f, 1.0f, 0.013f};
    check_normalize_bytes(3, 256, imagenet_mean, imagenet_std); /* each byte once per plane */
    check_normalize_bytes(64, 224 * 224, imagenet_mean, imagenet_std);
    check_normalize_bytes(5, 7, odd_mean, odd_std);
}
static void group_swin(void) {
    check_swin(2, 8, 8, 4, 1, 48);
    check_swin(2, 8, 8, 4, 0, 48);
    check_swin(1, 14, 7, 7, 1, 24);       /* an axis of one window is never shifted */
    check_swin_pieces(2, 14, 7, 3, 32);   /* Swin-T's first stage */
    check_swin_pieces(3, 8, 4, 2, 16);    /* the micro models */
    check_swin_norm(2, 14, 14, 7, 1, 96); /* Swin-T's first stage, shifted (the image 56 / 4) */
    check_swin_norm(3, 8, 8, 4, 0, 40);   /* C not a multiple of 32 */
    check_swin_post_norm(2, 16, 16, 8, 1, 96); /* SwinV2-T's first stage, shifted (256 / 4) */
    check_swin_post_norm(3, 8, 8, 4, 0, 40);
    check_swin_residual(4, 14, 14, 7, 1, 96);
    check_swin_residual(3, 8, 8, 4, 0, 40);
    check_swin_proj_backward(2, 14, 14, 7, 1, 96); /* Swin-T's first stage, shifted */
    check_swin_proj_backward(3, 8, 8, 4, 0, 40);
    /* A grid the kernel would index outside the tensor with is refused
     * before any launch (the pointers are never touched). */
    const visc_cuda_swin_grid bad = {8, 8, 4, 4, -2, 0};
    const int rc = visc_cuda_swin_partition(ctx, NULL, NULL, &bad, 1, 8);
    report("swin partition: a negative shift is refused", rc == -1 ? 0 : 1, 1, 0, rc, -1, 0.0);
    if (rc == -1) printf("     (%s)\n", visc_last_error());
}

/* The timed searches the emulator's cuDNN made (it counts them); -1 on
 * a GPU's cuDNN, which has no such count. */
static int emulated_cudnn_finds(void) {
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
    int (*finds)(void) = NULL;
    if (lib) *(void **)&finds = dlsym(lib, "visc_emu_cudnn_finds");
    const int n = finds ? finds() : -1;
    if (lib) dlclose(lib);
    return n;
}

/* Algorithms by cuDNN's timed search (visc_cuda_set_conv_benchmark): the
 * emulator's lists the heuristic's entries in reverse, so other
 * algorithms run, and the layer's results must hold all the same; the
 * search must have run, once per direction, for shapes of their own. */
static void check_conv_benchmark(void) {
    const int before = emulated_cudnn_finds();
    visc_cuda_set_conv_benchmark(ctx, 1);
    check_conv("ResNet stage 1, timed search", 3, 64, 28, 28, 64, 3, 1, 1, VISC_CUDA_CONV_F32_NCHW);
    check_conv("ResNet stage 1, timed search", 3, 64, 28, 28, 64, 3, 1, 1,
               VISC_CUDA_CONV_BF16_NHWC_F32W);
    visc_cuda_set_conv_benchmark(ctx, 0);
    const int after = emulated_cudnn_finds();
    if (before < 0) {
        printf("     (timed search: a GPU's cuDNN, whose searches are not counted)\n");
        return;
    }
    report("conv: the timed search ran for each direction of the two shapes", after - before != 6,
           1, 0, after - before, 6, 0.0);
}

static void group_conv(void) {
    /* fp32; bf16 channels-last; bf16 channels-last tensors with fp32
     * weights (a ResNet under bf16) */
    const visc_cuda_conv_type types[3] = {VISC_CUDA_CONV_F32_NCHW, VISC_CUDA_CONV_BF16_NHWC,
                                          VISC_CUDA_CONV_BF16_NHWC_F32W};
    for (int t = 0; t < 3; t++) {
        const visc_cuda_conv_type type = types[t];
        check_conv("ResNet stage 1, 3x3", 2, 64, 56, 56, 64, 3, 1, 1, type);
        check_conv("ResNet downsample, 1x1/2", 2, 64, 56, 56, 128, 1, 2, 0, type);
        check_conv("ResNet stage 2 entry, 3x3/2", 2, 64, 56, 56, 128, 3, 2, 1, type);
        check_conv("ResNet stem, 7x7/2", 2, 3, 224, 224, 64, 7, 2, 3, type);
        check_conv("CIFAR stem, 3x3", 4, 3, 32, 32, 64, 3, 1, 1, type);
        check_conv("odd sizes", 3, 5, 13, 11, 7, 3, 2, 1, type);
        /* test_cuda_model's ResNet-20 at batch 16, its second stage's entry */
        check_conv("ResNet-20 stage 2 entry, 3x3/2", 16, 16, 32, 32, 32, 3, 2, 1, type);
        check_conv("ResNet-20 downsample, 1x1/2", 16, 16, 32, 32, 32, 1, 2, 0, type);
    }
    /* bf16 where cuDNN's heuristic lists no deterministic algorithm (as
     * the emulator does under VISC_EMU_CUDNN_NONDETERMINISTIC; a GPU's
     * cuDNN ignores it): a non-deterministic one runs, said once, where
     * the first choice refused the layer. A shape of its own, so that no
     * plan chosen above is reused. */
    setenv("VISC_EMU_CUDNN_NONDETERMINISTIC", "1", 1);
    check_conv("CIFAR stem, no deterministic algorithm listed", 5, 3, 32, 32, 16, 3, 1, 1,
               VISC_CUDA_CONV_BF16_NHWC_F32W);
    unsetenv("VISC_EMU_CUDNN_NONDETERMINISTIC");
    check_conv_benchmark();
    /* A bad shape is refused before cuDNN is asked (no pointer is read). */
    const visc_cuda_conv_shape bad = {1, 3, 8, 8, 4, 3, 3, 0, 1, VISC_CUDA_CONV_F32_NCHW};
    const int rc = visc_cuda_conv_forward(ctx, &bad, NULL, NULL, NULL);
    report("conv: stride 0 is refused", rc == -1 ? 0 : 1, 1, 0, rc, -1, 0.0);
    if (rc == -1) printf("     (%s)\n", visc_last_error());
}
static void group_batchnorm(void) {
    check_batchnorm(8, 64, 56 * 56, 0, 1, 0.0f, 0);
    check_batchnorm(8, 64, 56 * 56, 1, 1, 0.0f, 0);
    check_batchnorm(4, 96, 28 * 28, 1, 0, 0.0f, 0);  /* channels-last */
    check_batchnorm(16, 512, 4 * 4, 1, 1, 0.0f, 0);  /* the CPU's small-plane path */
    check_batchnorm(32, 256, 2 * 2, 0, 0, 0.0f, 0);  /* small planes, channels-last */
    check_batchnorm(4, 32, 17 * 17, 0, 1, 50.0f, 0); /* |mean| >> std: the centred variance */
    check_batchnorm_sync(8, 64, 28 * 28, 1, 0);      /* SyncBN over two halves */
    check_batchnorm_moments(4, 32, 17 * 17, 1);
    check_batchnorm_moments(4, 40, 17 * 17, 0);
    check_batchnorm_residual(4, 64, 14 * 14, 1, 1, 0); /* a block's end, fp32 NCHW */
    check_batchnorm_residual(4, 64, 14 * 14, 1, 0, 0); /* without the ReLU */
    check_batchnorm_residual(4, 96, 14 * 14, 0, 1, 1); /* bf16 channels-last */
    /* a downsampling block's end: ResNet-50's first (fp32 NCHW and bf16
     * channels-last), and C not a multiple of 8 (one channel a thread) */
    check_batchnorm_residual_norm(4, 256, 14 * 14, 1, 0);
    check_batchnorm_residual_norm(4, 256, 14 * 14, 0, 1);
    check_batchnorm_residual_norm(4, 12, 7 * 7, 0, 1);
    check_batchnorm_sync(16, 128, 7 * 7, 0, 0);
    /* each channel's values cut into ranges (src/cuda/batchnorm.cu's
     * bn_splits: 4096 values each at least): 17 ranges of a ResNet's first
     * stage; ranges that start inside an image, planes smaller than a
     * block; planes of one value (a projection head's BatchNorm);
     * channels-last; SyncBN's halves of 3 ranges each */
    check_batchnorm(64, 64, 56 * 56, 1, 1, 0.0f, 0);
    check_batchnorm(700, 4, 13, 1, 1, 0.0f, 0);
    check_batchnorm(9000, 3, 1, 0, 1, 0.0f, 0);
    check_batchnorm(16, 96, 28 * 28, 1, 0, 0.0f, 0);
    check_batchnorm_sync(1400, 4, 13, 1, 0);
    /* test_cuda_model's ResNet-20 at batch 16: 4 ranges of
     * exactly 4096 values, each 4 whole images, in stage 1 */
    check_batchnorm(16, 16, 32 * 32, 1, 1, 0.0f, 0);
    check_batchnorm(16, 16, 32 * 32, 0, 1, 0.0f, 0);
    check_batchnorm(16, 32, 16 * 16, 1, 1, 0.0f, 0);
    /* bf16 channels-last activations (a ResNet under bf16), 8 channels a
     * thread (C a multiple of 8): a first stage, small planes, a channel
     * mean far from 0, channel counts under the 32 lanes of a block
     * (ResNet-20's first stage: 16) or not a power of two (40: a second
     * group with one active lane), ResNet-50's last stage (2048: 8
     * groups); and one channel a thread (C = 12) */
    check_batchnorm(16, 64, 56 * 56, 1, 0, 0.0f, 1);
    check_batchnorm(32, 256, 2 * 2, 0, 0, 0.0f, 1);
    check_batchnorm(4, 32, 17 * 17, 0, 0, 50.0f, 1);
    check_batchnorm(16, 16, 32 * 32, 1, 0, 0.0f, 1);
    check_batchnorm(8, 40, 7 * 7, 0, 0, 0.0f, 1);
    check_batchnorm(8, 2048, 7 * 7, 1, 0, 0.0f, 1);
    check_batchnorm(8, 12, 7 * 7, 1, 0, 0.0f, 1);
    /* the same shapes one channel a thread (VISC_CUDA_VECTOR=off) */
    set_scalar_access(1);
    check_batchnorm(16, 64, 56 * 56, 1, 0, 0.0f, 1);
    check_batchnorm(8, 2048, 7 * 7, 1, 0, 0.0f, 1);
    check_batchnorm_residual(4, 96, 14 * 14, 0, 1, 1);
    check_batchnorm_residual_norm(4, 256, 14 * 14, 0, 1);
    set_scalar_access(0);
    check_batchnorm(8, 40, 7 * 7, 1, 0, 0.0f, 0);
    check_batchnorm_sync(8, 40, 14 * 14, 1, 1);
}
static void group_pool(void) {
    check_maxpool(4, 64, 112, 112, 3, 2, 1, 0, 0); /* ResNet's stem pooling */
    check_maxpool(2, 16, 57, 57, 3, 2, 1, 1, 0);   /* ties: the first maximum wins */
    check_maxpool(2, 8, 32, 32, 3, 2, 1, 0, 41);   /* NaNs propagate */
    check_maxpool(2, 8, 16, 16, 2, 2, 0, 1, 0);
    check_global_avgpool(32, 512, 49); /* ResNet at 224 px */
    check_global_avgpool(64, 512, 16); /* at 32 px */
    check_global_avgpool(5, 7, 3);
    check_relu(((size_t)1 << 20) + 5);
    /* bf16 channels-last (a ResNet under bf16): the stem's pooling, ties,
     * a window larger than the stride, odd sizes */
    check_pool_nhwc_bf16(2, 64, 112, 112, 3, 2, 1, 0);
    check_pool_nhwc_bf16(2, 16, 57, 57, 3, 2, 1, 1);
    check_pool_nhwc_bf16(3, 5, 9, 7, 3, 1, 1, 1);
}

static const struct {
    const char *name;
    void (*run)(void);
} groups[] = {{"layernorm", group_layernorm}, {"xent", group_xent},
              {"gelu", group_gelu},           {"optim", group_optim},
              {"convert", group_convert},     {"matmul", group_matmul},
              {"swin", group_swin},           {"conv", group_conv},
              {"batchnorm", group_batchnorm}, {"pool", group_pool},
              {"linear", group_linear},       {"eltwise", group_eltwise},
              {"attention", group_attention}, {"tokens", group_tokens},
              {"cait", group_cait},           {"input", group_input}};
#define NUM_GROUPS (sizeof groups / sizeof *groups)

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (size_t g = 0; g < NUM_GROUPS; g++) puts(groups[g].name);
        return 0;
    }
    for (int a = 1; a < argc; a++) {
        size_t g = 0;
        while (g < NUM_GROUPS && strcmp(argv[a], groups[g].name) != 0) g++;
        if (g == NUM_GROUPS) {
            fprintf(stderr, "test_cuda_kernels: no group '%s' (--list lists them)\n", argv[a]);
            return 2;
        }
    }
    if (visc_cuda_device_count() < 0) {
        printf("test_cuda_kernels: skipped: no GPU (%s)\n", visc_last_error());
        return 77;
    }
    char line[256];
    if (visc_cuda_describe(0, line, sizeof line) == 0) printf("# device 0: %s\n", line);
    ctx = visc_cuda_open(0);
    if (!ctx) die_cuda("open device 0");
    for (size_t g = 0; g < NUM_GROUPS; g++) {
        int wanted = argc == 1;
        for (int a = 1; a < argc; a++) wanted |= strcmp(argv[a], groups[g].name) == 0;
        if (wanted) groups[g].run();
    }
    visc_cuda_close(ctx);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/* test_bf16.c: the bf16 path of the linear layer (and of GELU + linear).
 *
 * With bf16 on, each product must equal the fp32 product of the
 * bf16-rounded operands: products of two bf16 values are exact in fp32, so
 * the only difference left is the fp32 accumulation order, and the bound
 * below (1e-5 of the sum of |terms|) is ~100x tighter than one bf16
 * rounding step (2^-9). That it can fail is checked too: the plain fp32
 * layer (unrounded operands) violates the same bound. Against the plain
 * fp32 layer, bf16 must stay within 1e-2 relative (norm-wise). */
#include <stdlib.h>
#include <string.h>

#include "../src/nn/linear_bf16.h"
#include "test.h"
#include "visc/nn.h"
#include "visc/rng.h"
#include "visc/tokens.h"

static void fill(float *x, size_t n, float scale, uint64_t sub) {
    visc_rng r = visc_rng_make(99, VISC_STREAM_INIT, sub);
    for (size_t i = 0; i < n; i++) x[i] = scale * (2.0f * visc_rng_uniform(&r) - 1.0f);
}

static float *rounded(const float *x, size_t n) {
    float *r = malloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++) r[i] = visc_bf16_to_f32(visc_f32_to_bf16(x[i]));
    return r;
}

/* Elements of got outside |got - want| <= rtol * scale (+ a denormal floor);
 * the worst one is reported when report is set. */
static int violations(const char *what, const float *got, const double *want, const double *scale,
                      size_t n, double rtol, int report) {
    int bad = 0;
    size_t worst = 0;
    double worst_r = -1;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs(got[i] - want[i]), lim = rtol * scale[i] + 1e-30;
        if (err > lim) bad++;
        if (err / lim > worst_r) worst_r = err / lim, worst = i;
    }
    if (bad && report)
        visc_test_fail(__FILE__, __LINE__, "%s: %d of %zu off; worst [%zu] %.9g vs %.9g (scale %g)",
                       what, bad, n, worst, got[worst], want[worst], scale[worst]);
    return bad;
}

static double rel_norm_diff(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++)
        d += (a[i] - (double)b[i]) * (a[i] - (double)b[i]), s += (double)b[i] * b[i];
    return sqrt(d / s);
}

typedef struct {
    int N, I, O;
} shape;

/* Odd sizes (tails in every dimension), a token-sized one (blocked kernels)
 * and one with many rows (N >= 8 x the widths: the weight gradient is
 * computed as two row slices, linear_bf16.c's dw_split). */
static const shape shapes[] = {{7, 5, 3},
                               {67, 45, 33},
                               {300, 96, 130},
                               {1040, 192, 64},
                               {2064, 48, 40}};

enum { FWD, DIN, DW, NPROD };

static void check_shape(shape s) {
    const int N = s.N, I = s.I, O = s.O;
    const size_t nx = (size_t)N * I, nw = (size_t)O * I, ny = (size_t)N * O;
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc(O * 4), *g = malloc(ny * 4);
    fill(x, nx, 1.0f, 1);
    fill(w, nw, 0.2f, 2);
    fill(b, O, 0.5f, 3);
    fill(g, ny, 0.01f, 4);
    float *xr = rounded(x, nx), *wr = rounded(w, nw), *gr = rounded(g, ny);

    /* The reference on rounded operands, in double, with sum |terms| per element. */
    const size_t n[NPROD] = {ny, nx, nw};
    double *want[NPROD], *scale[NPROD];
    for (int p = 0; p < NPROD; p++) want[p] = calloc(n[p], 8), scale[p] = calloc(n[p], 8);
    for (int r = 0; r < N; r++)
        for (int o = 0; o < O; o++) {
            want[FWD][(size_t)r * O + o] = b[o];
            scale[FWD][(size_t)r * O + o] = fabs(b[o]);
            for (int i = 0; i < I; i++) {
                const double xw = (double)xr[(size_t)r * I + i] * wr[(size_t)o * I + i];
                want[FWD][(size_t)r * O + o] += xw;
                scale[FWD][(size_t)r * O + o] += fabs(xw);
                const double gw = (double)gr[(size_t)r * O + o] * wr[(size_t)o * I + i];
                want[DIN][(size_t)r * I + i] += gw;
                scale[DIN][(size_t)r * I + i] += fabs(gw);
                const double gx = (double)gr[(size_t)r * O + o] * xr[(size_t)r * I + i];
                want[DW][(size_t)o * I + i] += gx;
                scale[DW][(size_t)o * I + i] += fabs(gx);
            }
        }

    float *got[NPROD], *ref[NPROD];
    for (int p = 0; p < NPROD; p++) got[p] = malloc(n[p] * 4), ref[p] = malloc(n[p] * 4);
    float *db = malloc(O * 4), *db_ref = malloc(O * 4), *dw2 = malloc(nw * 4);

    CHECK(visc_set_matmul_precision(VISC_PRECISION_FP32) == VISC_PRECISION_FP32);
    visc_linear_forward(ref[FWD], x, w, b, N, I, O);
    visc_linear_backward(ref[DIN], ref[DW], db_ref, g, x, w, N, I, O);

    CHECK(visc_set_matmul_precision(VISC_PRECISION_BF16) == VISC_PRECISION_BF16);
    CHECK(visc_matmul_precision() == VISC_PRECISION_BF16);
    /* Twice: the second call reuses the cached primitives and buffers. */
    for (int rep = 0; rep < 2; rep++) {
        visc_linear_forward(got[FWD], x, w, b, N, I, O);
        visc_linear_backward(got[DIN], got[DW], db, g, x, w, N, I, O);
    }
    visc_linear_backward(NULL, dw2, NULL, g, x, w, N, I, O);
    visc_set_matmul_precision(VISC_PRECISION_FP32);

    static const char *names[NPROD] = {"forward", "din", "dweight"};
    for (int p = 0; p < NPROD; p++) {
        char what[64];
        snprintf(what, sizeof what, "%s %dx%dx%d", names[p], N, I, O);
        violations(what, got[p], want[p], scale[p], n[p], 1e-5, 1);
        /* The bound can fail: fp32 on unrounded operands breaks it. */
        CHECK_MSG(violations(what, ref[p], want[p], scale[p], n[p], 1e-5, 0) > 0,
                  "%s: fp32 meets the bf16 bound; the check cannot tell them apart", what);
        const double rel = rel_norm_diff(got[p], ref[p], n[p]);
        CHECK_MSG(rel < 1e-2, "%s: bf16 vs fp32 relative difference %g", what, rel);
    }
    /* The bias gradient is an fp32 column sum in both modes; din NULL changes nothing. */
    CHECK(memcmp(db, db_ref, O * 4) == 0);
    CHECK(memcmp(dw2, got[DW], nw * 4) == 0);

    for (int p = 0; p < NPROD; p++) free(want[p]), free(scale[p]), free(got[p]), free(ref[p]);
    free(x), free(w), free(b), free(g), free(xr), free(wr), free(gr);
    free(db), free(db_ref), free(dw2);
}

/* The bf16 path on every CPU: where there is no native bf16, through
 * oneDNN's emulated kernels or, below AVX-512, fp32 kernels on the widened
 * operands (VISC_BF16_EMULATE=1), the same products. */
static void emulate_bf16(int on) {
    if (on) setenv("VISC_BF16_EMULATE", "1", 1);
    else unsetenv("VISC_BF16_EMULATE");
}

TEST(bf16_linear_equals_fp32_on_rounded_operands) {
    emulate_bf16(1);
    visc_set_matmul_precision(VISC_PRECISION_BF16);
    CHECK(visc_linear_bf16_ready(7, 5, 3, 1));
    visc_set_matmul_precision(VISC_PRECISION_FP32);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(shapes[i]);
    emulate_bf16(0);
}

TEST(bf16_request_falls_back_without_cpu_support) {
    /* The request is honoured exactly when the CPU can do it; otherwise the
     * layer must give the fp32 result. */
    emulate_bf16(0);
    const visc_precision got = visc_set_matmul_precision(VISC_PRECISION_BF16);
    CHECK(got == (visc_bf16_supported() ? VISC_PRECISION_BF16 : VISC_PRECISION_FP32));
    CHECK(visc_matmul_precision() == got);
    visc_set_matmul_precision(VISC_PRECISION_FP32);
    CHECK(visc_matmul_precision() == VISC_PRECISION_FP32);
    /* Asked for emulation, every CPU honours it. */
    emulate_bf16(1);
    CHECK(visc_set_matmul_precision(VISC_PRECISION_BF16) == VISC_PRECISION_BF16);
    visc_set_matmul_precision(VISC_PRECISION_FP32);
    emulate_bf16(0);
}

TEST(precision_names_parse) {
    visc_precision p = VISC_PRECISION_FP32;
    CHECK(visc_parse_precision("bf16", &p) == 0 && p == VISC_PRECISION_BF16);
    CHECK(visc_parse_precision("fp32", &p) == 0 && p == VISC_PRECISION_FP32);
    CHECK(visc_parse_precision("fp16", &p) == -1 && p == VISC_PRECISION_FP32);
    CHECK(strstr(visc_last_error(), "fp16") != NULL);
    CHECK(visc_parse_precision("", &p) == -1);
    CHECK(!strcmp(visc_precision_name(VISC_PRECISION_BF16), "bf16"));
    CHECK(!strcmp(visc_precision_name(VISC_PRECISION_FP32), "fp32"));
}

TEST(bf16_rounding_is_nearest_even) {
    /* 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties go to even (1). */
    CHECK(visc_bf16_to_f32(visc_f32_to_bf16(1.0f + 0x1p-8f)) == 1.0f);
    CHECK(visc_bf16_to_f32(visc_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f)) == 1.0f + 0x1p-6f);
    CHECK(visc_bf16_to_f32(visc_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)) == 1.0f + 0x1p-7f);
    CHECK(visc_bf16_to_f32(visc_f32_to_bf16(-3.0f)) == -3.0f);
    const float inf = visc_bf16_to_f32(visc_f32_to_bf16(INFINITY));
    CHECK(isinf(inf) && inf > 0);
    CHECK(isnan(visc_bf16_to_f32(visc_f32_to_bf16(NAN))));
    /* The largest finite float rounds up to infinity, as in hardware. */
    CHECK(isinf(visc_bf16_to_f32(visc_f32_to_bf16(0x1.fffffep127f))));
}

/* visc_gelu_linear_* (GELU then a linear layer; in bf16 mode the GELU writes
 * the rounded activations itself) against the separate calls: the same bits
 * in both precisions, tails (odd sizes) and the sliced weight gradient
 * (2064 rows) included. */
static void check_gelu_linear(int N, int hid, int C) {
    const size_t nh = (size_t)N * hid, nw = (size_t)C * hid, ny = (size_t)N * C;
    float *h = malloc(nh * 4), *w = malloc(nw * 4), *b = malloc(C * 4), *g = malloc(ny * 4);
    fill(h, nh, 3.0f, 11);
    fill(w, nw, 0.2f, 12);
    fill(b, C, 0.5f, 13);
    fill(g, ny, 0.01f, 14);
    float *act_ref = malloc(nh * 4), *act = malloc(nh * 4);
    float *out_ref = malloc(ny * 4), *out = malloc(ny * 4);
    float *dh_ref = malloc(nh * 4), *dh = malloc(nh * 4);
    float *dw_ref = malloc(nw * 4), *dw = malloc(nw * 4), *db_ref = malloc(C * 4),
          *db = malloc(C * 4);
    visc_gelu_forward(act_ref, h, nh);
    visc_linear_forward(out_ref, act_ref, w, b, N, hid, C);
    visc_linear_backward(dh_ref, dw_ref, db_ref, g, act_ref, w, N, hid, C);
    visc_gelu_backward(dh_ref, dh_ref, h, nh);
    visc_gelu_linear_forward(out, act, h, w, b, N, hid, C);
    visc_gelu_linear_backward(dh, dw, db, g, act, h, w, N, hid, C);
    CHECK_MSG(memcmp(out, out_ref, ny * 4) == 0, "gelu_linear %dx%dx%d: forward differs", N, hid,
              C);
    CHECK_MSG(memcmp(dh, dh_ref, nh * 4) == 0, "gelu_linear %dx%dx%d: dh differs", N, hid, C);
    CHECK_MSG(memcmp(dw, dw_ref, nw * 4) == 0, "gelu_linear %dx%dx%d: dW differs", N, hid, C);
    CHECK_MSG(memcmp(db, db_ref, C * 4) == 0, "gelu_linear %dx%dx%d: db differs", N, hid, C);
    free(h), free(w), free(b), free(g), free(act_ref), free(act), free(out_ref), free(out);
    free(dh_ref), free(dh), free(dw_ref), free(dw), free(db_ref), free(db);
}

TEST(gelu_linear_equals_gelu_then_linear) {
    emulate_bf16(1);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        CHECK(visc_set_matmul_precision(bf16 ? VISC_PRECISION_BF16 : VISC_PRECISION_FP32) ==
              (bf16 ? VISC_PRECISION_BF16 : VISC_PRECISION_FP32));
        check_gelu_linear(67, 45, 33);
        check_gelu_linear(2064, 48, 40);
    }
    visc_set_matmul_precision(VISC_PRECISION_FP32);
    emulate_bf16(0);
}

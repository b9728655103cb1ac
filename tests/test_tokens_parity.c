/* test_tokens_parity.c: the token layers against PyTorch on the same inputs.
 *
 * tests/golden/tokens.safetensors is written by tools/gen_golden_tokens.py:
 * fixed random inputs, an upstream gradient, and torch's outputs and
 * gradients (computed in float64, stored as float32). Each case's shape and
 * options come from its "<case>.config" tensor. Attention tensors are stored
 * as [B, H, N, D]; this test scatters them into the strided layout the case
 * names (fused qkv [B, N, 3, H, D], or [B, N, H, D]), so the layouts the
 * models use are the ones compared.
 *
 * Tolerance: atol 1e-5, rtol 1e-4, as test_layer_parity.c: values are O(1)
 * and each output sums at most a few hundred products (fp32 rounding
 * ~1e-6); anything above 1e-5 is a semantic difference. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/io.h"
#include "visc/tokens.h"

#define ATOL 1e-5
#define RTOL 1e-4

#define GOLDEN "tokens.safetensors"

/* A freshly allocated copy of golden tensor "<pre><what>" with `numel`
 * elements; zero-filled (and the test failed) when it cannot be read. */
static float *loadp(const char *pre, const char *what, size_t numel) {
    char name[64];
    snprintf(name, sizeof name, "%s%s", pre, what);
    return visc_golden_load(GOLDEN, name, numel);
}

/* Reads "<pre>config" into ints; returns 0 when the case does not exist. */
static int load_config(const char *pre, int *cfg, int n) {
    char name[64];
    snprintf(name, sizeof name, "%sconfig", pre);
    if (visc_golden_numel(GOLDEN, name) != (size_t)n) return 0;
    float *f = loadp(pre, "config", (size_t)n);
    for (int i = 0; i < n; i++) cfg[i] = (int)f[i];
    free(f);
    return 1;
}

static void check(const char *pre, const char *what, const float *got, const float *want,
                  size_t n) {
    char label[64];
    snprintf(label, sizeof label, "%s%s", pre, what);
    CHECK_ARRAYS(label, got, want, n, ATOL, RTOL);
}

static float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

TEST(golden_file_opens) { CHECK(visc_golden_file(GOLDEN) != NULL); }

TEST(layernorm_parity) {
    int cases = 0;
    for (int ci = 0;; ci++) {
        char pre[16];
        int cfg[4];
        snprintf(pre, sizeof pre, "ln%d.", ci);
        if (!load_config(pre, cfg, 4)) break;
        const int rows = cfg[0], C = cfg[1], affine = cfg[2];
        const float eps = (float)pow(10.0, -cfg[3]);
        const size_t n = (size_t)rows * C;
        float *x = loadp(pre, "x", n), *dy = loadp(pre, "dy", n), *y = falloc(n), *dx = falloc(n);
        float *gamma = affine ? loadp(pre, "gamma", C) : NULL;
        float *beta = affine ? loadp(pre, "beta", C) : NULL;
        float *mean = falloc(rows), *rstd = falloc(rows), *dg = falloc(C), *db = falloc(C);
        visc_layernorm_forward(y, mean, rstd, x, gamma, beta, rows, C, eps);
        visc_layernorm_backward(dx, affine ? dg : NULL, affine ? db : NULL, dy, x, gamma, mean,
                                rstd, rows, C);
        float *want = loadp(pre, "y", n);
        check(pre, "y", y, want, n);
        free(want);
        want = loadp(pre, "dx", n);
        check(pre, "dx", dx, want, n);
        free(want);
        if (affine) {
            want = loadp(pre, "dgamma", C);
            check(pre, "dgamma", dg, want, C);
            free(want);
            want = loadp(pre, "dbeta", C);
            check(pre, "dbeta", db, want, C);
            free(want);
        }
        free(x), free(dy), free(y), free(dx), free(gamma), free(beta), free(mean), free(rstd);
        free(dg), free(db);
        cases++;
    }
    CHECK_MSG(cases == 3, "%d layernorm cases", cases);
}

TEST(gelu_parity) {
    int cfg[1] = {0};
    CHECK(load_config("gelu.", cfg, 1));
    const size_t n = (size_t)cfg[0];
    float *x = loadp("gelu.", "x", n), *dy = loadp("gelu.", "dy", n);
    float *y = falloc(n), *dx = falloc(n), *wy = loadp("gelu.", "y", n);
    float *wdx = loadp("gelu.", "dx", n);
    visc_gelu_forward(y, x, n);
    visc_gelu_backward(dx, dy, x, n);
    check("gelu.", "y", y, wy, n);
    check("gelu.", "dx", dx, wdx, n);
    free(x), free(dy), free(y), free(dx), free(wy), free(wdx);
}

/* ---- attention ---- */

enum { LAYOUT_BHND, LAYOUT_QKV, LAYOUT_BNHD };

typedef struct {
    int64_t sb, sh, sn;
} strides;

/* Copies between canonical [B, H, N, D] and a strided view. */
static void scatter(float *dst, strides s, const float *src, int B, int H, int N, int D) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int n = 0; n < N; n++)
                memcpy(dst + b * s.sb + h * s.sh + n * s.sn,
                       src + (((int64_t)b * H + h) * N + n) * D, sizeof(float) * D);
}
static void gather(float *dst, const float *src, strides s, int B, int H, int N, int D) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int n = 0; n < N; n++)
                memcpy(dst + (((int64_t)b * H + h) * N + n) * D,
                       src + b * s.sb + h * s.sh + n * s.sn, sizeof(float) * D);
}

static void attention_parity_case(const char *pre, const int *cfg) {
    const int B = cfg[0], H = cfg[1], Nq = cfg[2], Nk = cfg[3], D = cfg[4], layout = cfg[5];
    const int has_bias = cfg[6], nmask = cfg[7], has_hs = cfg[8];
    const int64_t HD = (int64_t)H * D;
    const size_t nq = (size_t)B * Nq * HD, nk = (size_t)B * Nk * HD;
    strides sq, sk, sv, so;
    int64_t qoff, koff, voff;
    size_t total;
    if (layout == LAYOUT_QKV) { /* [B, N, 3, H, D] */
        sq = sk = sv = (strides){Nq * 3 * HD, D, 3 * HD};
        qoff = 0, koff = HD, voff = 2 * HD, total = 3 * nq;
    } else if (layout == LAYOUT_BNHD) {
        sq = (strides){Nq * HD, D, HD};
        sk = sv = (strides){Nk * HD, D, HD};
        qoff = 0, koff = (int64_t)nq, voff = (int64_t)(nq + nk), total = nq + 2 * nk;
    } else {
        sq = (strides){Nq * HD, (int64_t)Nq * D, D};
        sk = sv = (strides){Nk * HD, (int64_t)Nk * D, D};
        qoff = 0, koff = (int64_t)nq, voff = (int64_t)(nq + nk), total = nq + 2 * nk;
    }
    so = (strides){Nq * HD, D, HD}; /* [B, Nq, H, D], ready for the projection */
    float *q = loadp(pre, "q", nq), *k = loadp(pre, "k", nk), *v = loadp(pre, "v", nk);
    float *dout_c = loadp(pre, "dout", nq);
    float *buf = falloc(total), *dbuf = falloc(total), *out = falloc(nq), *dout = falloc(nq);
    float *lse = falloc((size_t)B * H * Nq), *got = falloc(nk);
    scatter(buf + qoff, sq, q, B, H, Nq, D);
    scatter(buf + koff, sk, k, B, H, Nk, D);
    scatter(buf + voff, sv, v, B, H, Nk, D);
    scatter(dout, so, dout_c, B, H, Nq, D);
    const size_t nn = (size_t)Nq * Nk;
    float *bias = has_bias ? loadp(pre, "bias", H * nn) : NULL;
    float *mask = nmask ? loadp(pre, "mask", nmask * nn) : NULL;
    float *hs = has_hs ? loadp(pre, "head_scale", H) : NULL;
    float *dbias = has_bias ? falloc(H * nn) : NULL, dhs[64];
    const visc_attention a = {.B = B,
                              .H = H,
                              .Nq = Nq,
                              .Nk = Nk,
                              .D = D,
                              .scale = 1.0f / sqrtf((float)D),
                              .head_scale = hs,
                              .bias = bias,
                              .mask = mask,
                              .nmask = nmask,
                              .q_sb = sq.sb,
                              .q_sh = sq.sh,
                              .q_sn = sq.sn,
                              .k_sb = sk.sb,
                              .k_sh = sk.sh,
                              .k_sn = sk.sn,
                              .v_sb = sv.sb,
                              .v_sh = sv.sh,
                              .v_sn = sv.sn,
                              .o_sb = so.sb,
                              .o_sh = so.sh,
                              .o_sn = so.sn};
    visc_attention_forward(&a, out, lse, buf + qoff, buf + koff, buf + voff);
    visc_attention_backward(&a, dbuf + qoff, dbuf + koff, dbuf + voff, dbias, has_hs ? dhs : NULL,
                            dout, buf + qoff, buf + koff, buf + voff, out, lse);
    float *want = loadp(pre, "out", nq);
    gather(got, out, so, B, H, Nq, D);
    check(pre, "out", got, want, nq);
    free(want);
    want = loadp(pre, "lse", (size_t)B * H * Nq);
    check(pre, "lse", lse, want, (size_t)B * H * Nq);
    free(want);
    want = loadp(pre, "dq", nq);
    gather(got, dbuf + qoff, sq, B, H, Nq, D);
    check(pre, "dq", got, want, nq);
    free(want);
    want = loadp(pre, "dk", nk);
    gather(got, dbuf + koff, sk, B, H, Nk, D);
    check(pre, "dk", got, want, nk);
    free(want);
    want = loadp(pre, "dv", nk);
    gather(got, dbuf + voff, sv, B, H, Nk, D);
    check(pre, "dv", got, want, nk);
    free(want);
    if (has_bias) {
        want = loadp(pre, "dbias", H * nn);
        check(pre, "dbias", dbias, want, H * nn);
        free(want);
    }
    if (has_hs) {
        want = loadp(pre, "dhead_scale", H);
        check(pre, "dhead_scale", dhs, want, H);
        free(want);
    }
    free(q), free(k), free(v), free(dout_c), free(buf), free(dbuf), free(out), free(dout);
    free(lse), free(got), free(bias), free(mask), free(hs), free(dbias);
}

TEST(attention_parity) {
    int cases = 0;
    for (int ci = 0;; ci++) {
        char pre[16];
        int cfg[9];
        snprintf(pre, sizeof pre, "attn%d.", ci);
        if (!load_config(pre, cfg, 9)) break;
        CHECK(cfg[1] <= 64);
        attention_parity_case(pre, cfg);
        cases++;
    }
    CHECK_MSG(cases == 5, "%d attention cases", cases);
}

TEST(pos_embed_resample_parity) {
    int cases = 0;
    for (int ci = 0;; ci++) {
        char pre[16];
        int cfg[5];
        snprintf(pre, sizeof pre, "pos%d.", ci);
        if (!load_config(pre, cfg, 5)) break;
        const int oh = cfg[0], ow = cfg[1], nh = cfg[2], nw = cfg[3], C = cfg[4];
        float *in = loadp(pre, "in", (size_t)oh * ow * C);
        float *want = loadp(pre, "out", (size_t)nh * nw * C), *out = falloc((size_t)nh * nw * C);
        visc_pos_embed_resample(out, in, C, oh, ow, nh, nw);
        check(pre, "out", out, want, (size_t)nh * nw * C);
        free(in), free(want), free(out);
        cases++;
    }
    CHECK_MSG(cases == 3, "%d pos_embed cases", cases);
}

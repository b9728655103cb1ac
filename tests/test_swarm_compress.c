/* test_swarm_compress.c: the encodings of averaged parts: exact rounding
 * against slow double-precision references, saturation, q8's error bound
 * and error feedback, and decoding that rejects hostile bytes before
 * writing anything. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "../src/swarm/compress.h"
#include "test.h"
#include "visc/core.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)(rng_u32() >> 8) * 0x1p-24f;
}
static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* A finite float with a random sign, mantissa and an exponent in
 * [emin, emax] (unbiased), so every rounding case is met. */
static float rng_float_exp(int emin, int emax) {
    uint32_t e = (uint32_t)(emin + 127 + (int)(rng_u32() % (uint32_t)(emax - emin + 1)));
    return bits_float((rng_u32() & 0x807fffffu) | (e << 23));
}

/* Round-trips x through c and returns the decoded copy (free it). */
static float *round_trip(visc_compression c, const float *x, size_t n) {
    uint8_t *buf = malloc(visc_compressed_size(c, n) + 1);
    float *y = malloc(n * sizeof *y + 1);
    size_t bytes = visc_compress(c, x, n, buf, NULL);
    CHECK(bytes == visc_compressed_size(c, n));
    int rc = visc_decompress(c, buf, bytes, y, n);
    CHECK_MSG(rc == 0, "%s: %s", visc_compression_name(c), visc_last_error());
    free(buf);
    return y;
}

/* Slow reference: nearest even with `mant` explicit mantissa bits and
 * smallest normal exponent emin (below it, a fixed step), capped at maxv.
 * All in double, where every step here is exact. */
static double ref_round(double x, int mant, int emin, double maxv) {
    if (x == 0) return x;
    int e;
    frexp(x, &e); /* |x| = f * 2^e, f in [0.5, 1): the leading bit weighs 2^(e-1) */
    if (e - 1 < emin) e = emin + 1;
    double step = ldexp(1.0, e - 1 - mant);
    double r = nearbyint(x / step) * step; /* default rounding: to nearest even */
    if (r > maxv) r = maxv;
    if (r < -maxv) r = -maxv;
    return r;
}

TEST(compress_names) {
    visc_compression c;
    const char *names[] = {"none", "fp16", "bf16", "q8"};
    for (int i = 0; i < 4; i++) {
        CHECK(visc_compression_parse(names[i], &c) == 0);
        CHECK(strcmp(visc_compression_name(c), names[i]) == 0);
    }
    CHECK(visc_compression_parse("int8", &c) == 0 && c == VISC_COMP_Q8);
    CHECK(visc_compression_parse("8bit", &c) == 0 && c == VISC_COMP_Q8);
    CHECK(visc_compression_parse("fp8", &c) == -1);
    CHECK(strstr(visc_last_error(), "fp8") != NULL);
    CHECK(visc_compression_parse(NULL, &c) == -1);
    CHECK(strcmp(visc_compression_name((visc_compression)9), "unknown") == 0);
}

TEST(compress_sizes_and_choice) {
    CHECK(visc_compressed_size(VISC_COMP_NONE, 10) == 40);
    CHECK(visc_compressed_size(VISC_COMP_FP16, 10) == 20);
    CHECK(visc_compressed_size(VISC_COMP_BF16, 10) == 20);
    CHECK(visc_compressed_size(VISC_COMP_Q8, 0) == 0);
    CHECK(visc_compressed_size(VISC_COMP_Q8, 1) == 5);
    CHECK(visc_compressed_size(VISC_COMP_Q8, VISC_Q8_BLOCK) == VISC_Q8_BLOCK + 4);
    CHECK(visc_compressed_size(VISC_COMP_Q8, VISC_Q8_BLOCK + 1) == VISC_Q8_BLOCK + 9);
    for (int c = 0; c < 4; c++) {
        CHECK(visc_compression_for((visc_compression)c, VISC_COMPRESS_MIN_VALUES - 1) ==
              VISC_COMP_NONE);
        CHECK(visc_compression_for((visc_compression)c, 1) == VISC_COMP_NONE);
        CHECK(visc_compression_for((visc_compression)c, VISC_COMPRESS_MIN_VALUES) ==
              (visc_compression)c);
    }
}

TEST(compress_none_is_exact) {
    float x[] = {0.0f, -0.0f, 1.0f, -3.5f, FLT_MAX, -FLT_MAX, FLT_MIN, 0x1p-149f, 1e-40f};
    size_t n = sizeof x / sizeof x[0];
    float *y = round_trip(VISC_COMP_NONE, x, n);
    CHECK(memcmp(x, y, sizeof x) == 0);
    free(y);
}

TEST(compress_fp16_matches_reference) {
    size_t n = 1 << 18;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        /* mostly the half's range (normals and subnormals), some beyond it,
         * some arbitrary finite floats */
        if (i % 8 == 7) x[i] = rng_float_exp(-126, 127);
        else x[i] = rng_float_exp(-27, 16);
    }
    float *y = round_trip(VISC_COMP_FP16, x, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double want = ref_round(x[i], 10, -14, 65504.0);
        if ((double)y[i] != want && bad++ < 5)
            CHECK_MSG(0, "fp16(%a) = %a, expected %a", (double)x[i], (double)y[i], want);
        /* the stated tolerance, within the normal range */
        if (fabsf(x[i]) >= 0x1p-14f && fabsf(x[i]) <= 65504.0f) CHECK_CLOSE(y[i], x[i], 0, 1e-3);
    }
    CHECK(bad == 0);
    free(x);
    free(y);
}

TEST(compress_fp16_every_half_round_trips) {
    /* every finite half, decoded and encoded again, is itself */
    float x[1];
    uint8_t enc[2];
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & 0x7c00u) == 0x7c00u) continue; /* infinities and NaN: see below */
        uint8_t in[2] = {(uint8_t)h, (uint8_t)(h >> 8)};
        CHECK(visc_decompress(VISC_COMP_FP16, in, 2, x, 1) == 0);
        visc_compress(VISC_COMP_FP16, x, 1, enc, NULL);
        if (memcmp(in, enc, 2) != 0) {
            CHECK_MSG(0, "half 0x%04x decodes to %a, encodes to 0x%02x%02x", h, (double)x[0],
                      enc[1], enc[0]);
            break;
        }
    }
}

TEST(compress_fp16_clamps_and_ties) {
    float x[] = {65504.0f,  65519.0f,        65520.0f,
                 1e6f,      FLT_MAX,         -FLT_MAX,
                 -70000.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f,
                 0x1p-25f,  3 * 0x1p-25f,    0x1p-24f};
    uint16_t want[] = {0x7bff, 0x7bff, 0x7bff, 0x7bff, 0x7bff, 0xfbff,
                       0xfbff, 0x3c00, 0x3c02, 0x0000, 0x0002, 0x0001};
    size_t n = sizeof x / sizeof x[0];
    uint8_t enc[2 * 12];
    CHECK(visc_compress(VISC_COMP_FP16, x, n, enc, NULL) == 2 * n);
    for (size_t i = 0; i < n; i++) {
        uint16_t h = (uint16_t)(enc[2 * i] | enc[2 * i + 1] << 8);
        CHECK_MSG(h == want[i], "fp16(%a) = 0x%04x, expected 0x%04x", (double)x[i], h, want[i]);
    }
}

TEST(compress_bf16_matches_reference) {
    size_t n = 1 << 18;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = rng_u32();
        if ((u & 0x7f800000u) == 0x7f800000u) u &= 0xbfffffffu; /* finite */
        x[i] = bits_float(u);
    }
    x[0] = FLT_MAX; /* would round to infinity: saturates */
    x[1] = -FLT_MAX;
    x[2] = 1.0f + 0x1p-8f;          /* a tie: to even, 1.0 */
    x[3] = 1.0f + 3 * 0x1p-8f;      /* a tie: to even, 1 + 2^-6 */
    x[4] = bits_float(0x00008000u); /* a subnormal tie */
    float *y = round_trip(VISC_COMP_BF16, x, n);
    double maxbf = (double)bits_float(0x7f7f0000u);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double want = ref_round(x[i], 7, -126, maxbf);
        if ((double)y[i] != want && bad++ < 5)
            CHECK_MSG(0, "bf16(%a) = %a, expected %a", (double)x[i], (double)y[i], want);
        if (fabsf(x[i]) >= FLT_MIN && fabsf(x[i]) <= (float)maxbf) CHECK_CLOSE(y[i], x[i], 0, 8e-3);
    }
    CHECK(bad == 0);
    CHECK(y[2] == 1.0f && y[3] == 1.0f + 0x1p-6f && isfinite(y[0]) && isfinite(y[1]));
    free(x);
    free(y);
}

/* Per block: |error| <= scale / 2, plus the float rounding of the scaled
 * value and of its product with the scale (each at most absmax * eps/2). */
TEST(compress_q8_error_within_half_step) {
    size_t n = 3 * VISC_Q8_BLOCK + 100; /* a short last block */
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(-1, 1) * (float)(1 + i / VISC_Q8_BLOCK * 10);
    x[5] = 0;
    x[n - 1] = -50.0f; /* the last block's absmax, negative */
    uint8_t *enc = malloc(visc_compressed_size(VISC_COMP_Q8, n));
    CHECK(visc_compress(VISC_COMP_Q8, x, n, enc, NULL) == visc_compressed_size(VISC_COMP_Q8, n));
    float *y = malloc(n * sizeof *y);
    CHECK(visc_decompress(VISC_COMP_Q8, enc, visc_compressed_size(VISC_COMP_Q8, n), y, n) == 0);
    size_t o = 0;
    for (size_t s = 0; s < n; s += VISC_Q8_BLOCK) {
        size_t k = n - s < VISC_Q8_BLOCK ? n - s : VISC_Q8_BLOCK;
        float absmax = 0, scale;
        for (size_t i = 0; i < k; i++) absmax = fmaxf(absmax, fabsf(x[s + i]));
        memcpy(&scale, enc + o, 4);
        CHECK_CLOSE(scale, absmax / 127.0, 0, 1e-6);
        double bound = scale / 2.0 + 2.0 * absmax * FLT_EPSILON, worst = 0;
        for (size_t i = 0; i < k; i++) worst = fmax(worst, fabs((double)y[s + i] - x[s + i]));
        CHECK_MSG(worst <= bound, "block at %zu: error %g > %g", s, worst, bound);
        CHECK(worst > scale / 4); /* and it is a real 8-bit quantization */
        o += 4 + k;
    }
    CHECK(y[5] == 0);
    CHECK_CLOSE(y[n - 1], -50.0, 0, 1e-6); /* the absmax value is exact */
    free(x);
    free(y);
    free(enc);
}

TEST(compress_q8_extremes_stay_finite) {
    float x[VISC_COMPRESS_MIN_VALUES] = {FLT_MAX, -FLT_MAX, 1.0f, -3e38f};
    float *y = round_trip(VISC_COMP_Q8, x, VISC_COMPRESS_MIN_VALUES);
    CHECK(isfinite(y[0]) && y[0] > 3.3e38f && isfinite(y[1]) && y[1] < -3.3e38f);
    CHECK_CLOSE(y[3], -3e38, 0, 1.0 / 254);
    free(y);
}

TEST(compress_q8_tiny_and_zero_blocks) {
    float x[2000];
    for (int i = 0; i < 2000; i++) x[i] = i % 2 ? 1e-35f : 0.0f;
    float *y = round_trip(VISC_COMP_Q8, x, 2000);
    for (int i = 0; i < 2000; i++) CHECK(y[i] == 0);
    free(y);
}

/* Without feedback a value much smaller than the block's step is lost every
 * round; with it, the mean of the decoded values over R rounds is within
 * one step / R of the truth. */
TEST(compress_q8_error_feedback_converges) {
    enum { N = 5000, ROUNDS = 200 };
    static float x[N], err[N], y[N], sum_fb[N], sum_plain[N];
    static uint8_t enc[N + 8];
    for (int i = 0; i < N; i++) x[i] = rng_uniform(-0.5f, 0.5f);
    x[0] = 127.0f;     /* step 1 in the first block */
    x[N - 1] = -12.7f; /* step 0.1 in the second */
    memset(err, 0, sizeof err);
    memset(sum_fb, 0, sizeof sum_fb);
    memset(sum_plain, 0, sizeof sum_plain);
    size_t bytes = visc_compressed_size(VISC_COMP_Q8, N);
    for (int r = 0; r < ROUNDS; r++) {
        CHECK(visc_compress(VISC_COMP_Q8, x, N, enc, err) == bytes);
        CHECK(visc_decompress(VISC_COMP_Q8, enc, bytes, y, N) == 0);
        for (int i = 0; i < N; i++) sum_fb[i] += y[i];
        CHECK(visc_compress(VISC_COMP_Q8, x, N, enc, NULL) == bytes);
        CHECK(visc_decompress(VISC_COMP_Q8, enc, bytes, y, N) == 0);
        for (int i = 0; i < N; i++) sum_plain[i] += y[i];
    }
    double worst_fb = 0, worst_plain = 0, mean_fb = 0, mean_plain = 0, worst_err = 0;
    for (int i = 0; i < N; i++) {
        double d_fb = sum_fb[i] / ROUNDS - x[i], d_plain = sum_plain[i] / ROUNDS - x[i];
        worst_fb = fmax(worst_fb, fabs(d_fb));
        worst_plain = fmax(worst_plain, fabs(d_plain));
        mean_fb += fabs(d_fb) / N;
        mean_plain += fabs(d_plain) / N;
        worst_err = fmax(worst_err, fabs(err[i]));
    }
    printf("# q8 over %d rounds: mean |error| %.2e with feedback, %.2e without\n", ROUNDS, mean_fb,
           mean_plain);
    CHECK_MSG(worst_fb <= 1.0 / ROUNDS + 1e-4, "feedback: worst mean error %g", worst_fb);
    CHECK_MSG(worst_plain > 0.4, "plain: worst mean error %g", worst_plain);
    CHECK(mean_fb < mean_plain / 20);
    CHECK(worst_err <= 0.5 + 1e-4); /* the carried error stays within half a step */
}

/* Decoding must reject and leave the output as it was. */
static void expect_rejected(visc_compression c, const uint8_t *in, size_t bytes, size_t n,
                            const char *why) {
    float *y = malloc((n + 1) * sizeof *y);
    for (size_t i = 0; i <= n; i++) y[i] = 42.0f;
    int rc = visc_decompress(c, in, bytes, y, n);
    CHECK_MSG(rc == -1, "%s: accepted, expected \"%s\"", visc_compression_name(c), why);
    if (rc == -1)
        CHECK_MSG(strstr(visc_last_error(), why) != NULL, "%s: error \"%s\", expected \"%s\"",
                  visc_compression_name(c), visc_last_error(), why);
    size_t touched = 0;
    for (size_t i = 0; i <= n; i++) touched += y[i] != 42.0f;
    CHECK_MSG(touched == 0, "%s: %zu output values written by a rejected decode",
              visc_compression_name(c), touched);
    free(y);
}

TEST(compress_decode_rejects_sizes) {
    size_t n = VISC_Q8_BLOCK + 7;
    float *x = calloc(n, sizeof *x);
    uint8_t *buf = calloc(4 * n + 8, 1);
    for (int c = 0; c < 4; c++) {
        size_t want = visc_compressed_size((visc_compression)c, n);
        visc_compress((visc_compression)c, x, n, buf, NULL);
        expect_rejected((visc_compression)c, buf, want - 1, n, "expected");
        expect_rejected((visc_compression)c, buf, want + 1, n, "expected");
        expect_rejected((visc_compression)c, buf, want, n + 1, "expected");
        expect_rejected((visc_compression)c, buf, 0, n, "expected");
    }
    expect_rejected((visc_compression)7, buf, 16, 4, "unknown compression");
    /* a hostile count whose size would overflow: no output may be touched */
    CHECK(visc_decompress(VISC_COMP_NONE, buf, 16, x, SIZE_MAX / 4) == -1);
    CHECK(x[0] == 0);
    free(x);
    free(buf);
}

TEST(compress_decode_rejects_nonfinite) {
    size_t n = 3000;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(-2, 2);
    uint8_t *buf = malloc(4 * n + 16);
    /* a non-finite value in each 16/32-bit encoding, named by its index */
    const uint8_t inf16[2] = {0x00, 0x7c}, nan16[2] = {0x01, 0xfe};
    const uint8_t inf_bf[2] = {0x80, 0x7f}, nan_bf[2] = {0xc0, 0xff};
    const float inf32 = INFINITY, nan32 = NAN;
    visc_compress(VISC_COMP_FP16, x, n, buf, NULL);
    memcpy(buf + 2 * 2999, inf16, 2);
    expect_rejected(VISC_COMP_FP16, buf, 2 * n, n, "value 2999");
    memcpy(buf + 2 * 17, nan16, 2);
    expect_rejected(VISC_COMP_FP16, buf, 2 * n, n, "value 17");
    visc_compress(VISC_COMP_BF16, x, n, buf, NULL);
    memcpy(buf + 2 * 2048, inf_bf, 2);
    expect_rejected(VISC_COMP_BF16, buf, 2 * n, n, "value 2048");
    memcpy(buf, nan_bf, 2);
    expect_rejected(VISC_COMP_BF16, buf, 2 * n, n, "value 0");
    visc_compress(VISC_COMP_NONE, x, n, buf, NULL);
    memcpy(buf + 4 * 1234, &inf32, 4);
    expect_rejected(VISC_COMP_NONE, buf, 4 * n, n, "value 1234");
    memcpy(buf + 4 * 5, &nan32, 4);
    expect_rejected(VISC_COMP_NONE, buf, 4 * n, n, "value 5");
    /* q8: the scale is the only float; bad in the last block, nothing written */
    size_t m = 2 * VISC_Q8_BLOCK + 5, qb = visc_compressed_size(VISC_COMP_Q8, m);
    float *xq = calloc(m, sizeof *xq);
    xq[3] = 1;
    xq[m - 2] = -1; /* q = -127 in block 2 */
    uint8_t *q = malloc(qb);
    /* the last two are finite but overflow when multiplied by 127 */
    const float bad_scales[] = {NAN, -NAN, INFINITY, -1.0f, -0.5f * FLT_MIN, FLT_MAX, FLT_MAX / 64};
    for (int b = 0; b < 7; b++) {
        visc_compress(VISC_COMP_Q8, xq, m, q, NULL);
        memcpy(q + 2 * (VISC_Q8_BLOCK + 4), &bad_scales[b], 4);
        expect_rejected(VISC_COMP_Q8, q, qb, m, "q8 block 2");
    }
    /* a huge scale is fine where the values stay finite */
    visc_compress(VISC_COMP_Q8, xq, m, q, NULL);
    const float huge = FLT_MAX / 100;
    memcpy(q + 2 * (VISC_Q8_BLOCK + 4), &huge, 4);
    q[qb - 2] = 1;
    float *yq = malloc(m * sizeof *yq);
    CHECK(visc_decompress(VISC_COMP_Q8, q, qb, yq, m) == 0);
    CHECK(yq[m - 2] == huge && yq[m - 1] == 0);
    free(yq);
    free(xq);
    free(q);
    free(x);
    free(buf);
}

/* A sender's own non-finite values stay non-finite in every encoding, so
 * the receiver rejects them rather than averaging a clamped stand-in. */
TEST(compress_nonfinite_input_is_rejected_downstream) {
    size_t n = 1500;
    float *x = calloc(n, sizeof *x);
    uint8_t *buf = malloc(4 * n + 16);
    float *y = malloc(n * sizeof *y);
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (int c = 0; c < 4; c++)
        for (int b = 0; b < 3; b++) {
            x[700] = bad[b];
            size_t bytes = visc_compress((visc_compression)c, x, n, buf, NULL);
            CHECK_MSG(visc_decompress((visc_compression)c, buf, bytes, y, n) == -1,
                      "%s accepted %g", visc_compression_name((visc_compression)c), (double)bad[b]);
        }
    free(x);
    free(buf);
    free(y);
}

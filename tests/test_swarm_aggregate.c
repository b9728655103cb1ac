/* test_swarm_aggregate.c: validation of received parts (first offender
 * named), the exact weighted mean, and the robust modes holding against a
 * hostile part that moves the plain mean arbitrarily far. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "../src/swarm/aggregate.h"
#include "test.h"
#include "visc/core.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static double rng_unit(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * 0x1p-53;
}

static void expect_invalid(const visc_aggregate_config *c, const float *x, size_t n, double w,
                           const char *why) {
    int rc = visc_validate_part(c, x, n, w);
    CHECK_MSG(rc == -1, "accepted, expected \"%s\"", why);
    if (rc == -1)
        CHECK_MSG(strstr(visc_last_error(), why) != NULL, "error \"%s\", expected \"%s\"",
                  visc_last_error(), why);
}

TEST(aggregate_names_and_defaults) {
    visc_aggregation a;
    CHECK(visc_aggregation_parse("mean", &a) == 0 && a == VISC_AGG_MEAN);
    CHECK(visc_aggregation_parse("trimmed-mean", &a) == 0 && a == VISC_AGG_TRIMMED_MEAN);
    CHECK(visc_aggregation_parse("trimmed_mean", &a) == 0 && a == VISC_AGG_TRIMMED_MEAN);
    CHECK(visc_aggregation_parse("centered-clip", &a) == 0 && a == VISC_AGG_CENTERED_CLIP);
    CHECK(visc_aggregation_parse("clip", &a) == 0 && a == VISC_AGG_CENTERED_CLIP);
    CHECK(visc_aggregation_parse("median", &a) == -1);
    CHECK(strstr(visc_last_error(), "median") != NULL);
    CHECK(visc_aggregation_parse(NULL, &a) == -1);
    visc_aggregate_config c;
    visc_aggregate_config_default(&c);
    CHECK(c.mode == VISC_AGG_MEAN && c.trim == 1 && c.clip_tau == 1.0f && c.clip_iters == 3);
    CHECK(c.max_abs == 1e6f && c.max_weight == 1e9);
}

TEST(aggregate_validation) {
    visc_aggregate_config c;
    visc_aggregate_config_default(&c);
    enum { N = 5000 };
    static float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(rng_unit() * 2e6 - 1e6);
    x[100] = 1e6f;
    x[101] = -1e6f; /* the limit itself is allowed */
    CHECK(visc_validate_part(&c, x, N, 1.0) == 0);
    CHECK(visc_validate_part(&c, x, N, 1e9) == 0);
    CHECK(visc_validate_part(&c, x, 0, 1.0) == 0);
    expect_invalid(&c, x, N, 0.0, "weight 0");
    expect_invalid(&c, x, N, -1.0, "weight -1");
    expect_invalid(&c, x, N, NAN, "weight nan");
    expect_invalid(&c, x, N, INFINITY, "weight inf");
    expect_invalid(&c, x, N, 2e9, "weight 2e+09");
    /* the first offender is named, whatever comes after it */
    x[4321] = NAN;
    expect_invalid(&c, x, N, 1.0, "value 4321 is nan");
    x[77] = -INFINITY;
    expect_invalid(&c, x, N, 1.0, "value 77 is -inf");
    x[12] = 1.5e6f;
    expect_invalid(&c, x, N, 1.0, "value 12 is 1.5e+06, beyond the limit 1e+06");
    x[0] = -1e30f;
    expect_invalid(&c, x, N, 1.0, "value 0 is -1e+30");
    x[0] = x[12] = x[77] = x[4321] = 0;
    CHECK(visc_validate_part(&c, x, N, 1.0) == 0);
    c.max_abs = 10;
    expect_invalid(&c, x, N, 1.0, "beyond the limit 10");
}

/* The weighted mean equals the exact one (computed in double) for 1..8
 * parts, across several accumulation chunks, with uneven weights. */
TEST(aggregate_exact_weighted_mean) {
    visc_aggregate_config c;
    visc_aggregate_config_default(&c);
    enum { N = 2500, M = 8 };
    static float parts_data[M][N], out[N], want[N];
    const float *parts[M];
    double w[M];
    for (int i = 0; i < M; i++) {
        parts[i] = parts_data[i];
        w[i] = i % 2 ? 1.0 + (double)(int)(rng_unit() * 1000) : rng_unit() * 3 + 1e-3;
        for (int j = 0; j < N; j++) parts_data[i][j] = (float)((rng_unit() - 0.3) * (1 + i));
    }
    for (int m = 1; m <= M; m++) {
        double total = 0;
        for (int i = 0; i < m; i++) total += w[i];
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int i = 0; i < m; i++) s += w[i] * (double)parts[i][j];
            want[j] = (float)(s / total);
        }
        CHECK(visc_aggregate(&c, parts, w, m, N, out) == 0);
        CHECK_ARRAYS("weighted mean", out, want, N, 1e-12, 1e-6);
    }
    CHECK(visc_aggregate(&c, parts, w, 1, N, out) == 0);
    CHECK(memcmp(out, parts[0], sizeof out) == 0); /* one part: itself */
}

TEST(aggregate_trimmed_mean_values) {
    visc_aggregate_config c;
    visc_aggregate_config_default(&c);
    c.mode = VISC_AGG_TRIMMED_MEAN;
    float v[5][2] = {{5, -1}, {1, -2}, {100, -3}, {2, -4}, {3, -500}};
    const float *p[5] = {v[0], v[1], v[2], v[3], v[4]};
    double w[5] = {1, 1, 1, 1, 1e6}; /* weights are ignored here */
    float out[2];
    CHECK(visc_aggregate(&c, p, w, 5, 2, out) == 0);
    CHECK(out[0] == (2.0f + 3 + 5) / 3 && out[1] == -3);
    CHECK(visc_aggregate(&c, p, w, 3, 2, out) == 0); /* 3 = 2 * trim + 1: the middle */
    CHECK(out[0] == 5 && out[1] == -2);
    CHECK(visc_aggregate(&c, p, w, 2, 2, out) == 0); /* fewer: the median */
    CHECK(out[0] == 3 && out[1] == -1.5f);
    c.trim = 2;
    CHECK(visc_aggregate(&c, p, w, 4, 2, out) == 0); /* median of 4 */
    CHECK(out[0] == 3.5f && out[1] == -2.5f);
    c.trim = 0; /* the unweighted mean */
    CHECK(visc_aggregate(&c, p, w, 5, 2, out) == 0);
    CHECK(out[0] == 111.0f / 5 && out[1] == -510.0f / 5);
}

/* With a radius beyond every distance, one iteration from the median lands
 * on the weighted mean. */
TEST(aggregate_centered_clip_without_attack_is_the_mean) {
    visc_aggregate_config c;
    visc_aggregate_config_default(&c);
    enum { N = 1500, M = 5 };
    static float data[M][N], mean[N], clip[N];
    const float *p[M];
    double w[M] = {1, 2, 3, 4, 5};
    for (int i = 0; i < M; i++) {
        p[i] = data[i];
        for (int j = 0; j < N; j++) data[i][j] = (float)rng_unit();
    }
    CHECK(visc_aggregate(&c, p, w, M, N, mean) == 0);
    c.mode = VISC_AGG_CENTERED_CLIP;
    c.clip_tau = 1e30f;
    c.clip_iters = 1;
    CHECK(visc_aggregate(&c, p, w, M, N, clip) == 0);
    CHECK_ARRAYS("clip with a huge radius", clip, mean, N, 1e-6, 1e-6);
}

static double distance(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s);
}

/* Four honest peers near each other and one hostile part (aggregated
 * without validation, to test the arithmetic itself): the plain mean is
 * dragged away, the robust modes stay within the honest range (+ tau) and
 * near the honest mean. */
static void hostile_case(float hostile_value) {
    enum { N = 3000, H = 4 };
    static float data[H + 1][N], honest_mean[N], lo[N], hi[N], out[N];
    const float *p[H + 1];
    double w[H + 1] = {1, 1, 1, 1, 1};
    for (int j = 0; j < N; j++) {
        double base = rng_unit() * 2 - 1, s = 0;
        lo[j] = INFINITY;
        hi[j] = -INFINITY;
        for (int i = 0; i < H; i++) {
            data[i][j] = (float)(base + (rng_unit() - 0.5) * 0.02);
            s += data[i][j];
            lo[j] = fminf(lo[j], data[i][j]);
            hi[j] = fmaxf(hi[j], data[i][j]);
        }
        honest_mean[j] = (float)(s / H);
        data[H][j] = j % 2 ? hostile_value : -hostile_value;
    }
    for (int i = 0; i <= H; i++) p[i] = data[i];
    visc_aggregate_config c;
    visc_aggregate_config_default(&c);
    double moved[3];
    for (int mode = 0; mode < 3; mode++) {
        c.mode = (visc_aggregation)mode;
        CHECK(visc_aggregate(&c, p, w, H + 1, N, out) == 0);
        moved[mode] = distance(out, honest_mean, N);
        if (mode == VISC_AGG_MEAN) continue;
        double slack = mode == VISC_AGG_CENTERED_CLIP ? c.clip_tau : 0;
        size_t outside = 0;
        for (int j = 0; j < N; j++)
            outside += !(out[j] >= lo[j] - slack && out[j] <= hi[j] + slack);
        CHECK_MSG(outside == 0, "%s: %zu coordinates outside the honest range",
                  mode == 1 ? "trimmed mean" : "centered clip", outside);
    }
    printf("# hostile +-%g: distance to the honest mean: mean %.3g, trimmed %.3g, clip %.3g\n",
           (double)hostile_value, moved[0], moved[1], moved[2]);
    /* the plain mean moved by about |hostile| / 5 per coordinate */
    CHECK(moved[0] > 0.1 * hostile_value * sqrt((double)N));
    /* trimmed: within the honest spread (0.02 per coordinate) */
    CHECK(moved[1] < 0.02 * sqrt((double)N));
    /* clip: the attacker pulls at most tau / 5 per iteration */
    CHECK(moved[2] < c.clip_iters * c.clip_tau / 5 + 0.02 * sqrt((double)N));
}

TEST(aggregate_robust_to_huge_values) { hostile_case(1e30f); }
TEST(aggregate_robust_to_large_values) { hostile_case(1e6f); }
TEST(aggregate_robust_to_float_max) { hostile_case(FLT_MAX); }

TEST(aggregate_rejects_bad_calls) {
    visc_aggregate_config c;
    visc_aggregate_config_default(&c);
    float x[4] = {1, 2, 3, 4}, out[4];
    const float *p[2] = {x, x};
    double w[2] = {1, 1};
    CHECK(visc_aggregate(&c, p, w, 0, 4, out) == -1);
    CHECK(visc_aggregate(&c, p, w, 5000, 4, out) == -1);
    w[1] = 0;
    CHECK(visc_aggregate(&c, p, w, 2, 4, out) == -1);
    CHECK(strstr(visc_last_error(), "part 1") != NULL);
    w[1] = NAN;
    CHECK(visc_aggregate(&c, p, w, 2, 4, out) == -1);
    w[1] = 1;
    c.mode = VISC_AGG_TRIMMED_MEAN;
    c.trim = -1;
    CHECK(visc_aggregate(&c, p, w, 2, 4, out) == -1);
    c.mode = VISC_AGG_CENTERED_CLIP;
    c.clip_tau = 0;
    CHECK(visc_aggregate(&c, p, w, 2, 4, out) == -1);
    c.clip_tau = NAN;
    CHECK(visc_aggregate(&c, p, w, 2, 4, out) == -1);
    c.mode = (visc_aggregation)9;
    CHECK(visc_aggregate(&c, p, w, 2, 4, out) == -1);
    CHECK(strstr(visc_last_error(), "mode 9") != NULL);
}

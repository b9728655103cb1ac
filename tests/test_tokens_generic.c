/* test_tokens_generic.c: the token layers' kernels below AVX-512.
 *
 * GELU and the attention have hand-written kernels per ISA level
 * (visc_cpu_level: AVX-512, AVX2 with FMA, none); test_tokens checks
 * whatever this CPU runs. This binary caps oneDNN's ISA at AVX2 before
 * anything asks (its own binary: the cap can only be set before oneDNN first
 * looks at the CPU), then runs each test at level 1 (AVX2 + FMA, where the
 * CPU has it) and level 0 (the compiler's loops), against double-precision
 * references. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "../src/nn/linear_bf16.h"
#include "test.h"
#include "visc/cpu.h"
#include "visc/rng.h"
#include "visc/tokens.h"

static void cap_isa(int level) {
    static int done;
    if (!done) CHECK(dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2) == dnnl_success);
    done = 1;
    CHECK(!visc_cpu_avx512());
    visc_cpu_cap_level(level);
#if defined(__x86_64__)
    const int have_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    CHECK(visc_cpu_level() == (level == 1 && !have_avx2 ? 0 : level));
#endif
}

static double phi(double x) { return 0.5 * (1 + erf(x / sqrt(2.0))); }

static void gelu_matches_erf(int level) {
    cap_isa(level);
    enum { N = 1001 }; /* not a multiple of any vector width */
    float x[N], y[N], want[N], g[N], dx[N], dwant[N];
    uint16_t h[N];
    for (int i = 0; i < N; i++) x[i] = -10.0f + 20.0f * (float)i / (N - 1), g[i] = 0.5f;
    visc_gelu_forward(y, x, N);
    visc_gelu_backward(dx, g, x, N);
    visc_gelu_forward_bf16(h, x, N);
    for (int i = 0; i < N; i++) {
        want[i] = (float)(x[i] * phi(x[i]));
        dwant[i] = (float)(0.5 * (phi(x[i]) + x[i] * exp(-0.5 * x[i] * x[i]) / sqrt(2 * M_PI)));
        CHECK(h[i] == visc_f32_to_bf16(y[i]));
    }
    CHECK_ARRAYS("gelu", y, want, N, 1e-6, 1e-5);
    CHECK_ARRAYS("gelu dx", dx, dwant, N, 1e-6, 1e-5);
}

TEST(gelu_avx2_matches_erf) { gelu_matches_erf(1); }
TEST(gelu_portable_matches_erf) { gelu_matches_erf(0); }

/* One sequence, one head: out = softmax(s Q K^T) V and, for dout, dq and dv. */
static void attention_ref(double *out, double *dq, double *dv, const float *q, const float *k,
                          const float *v, const float *dout, int N, int D, int ld, float s) {
    double P[32][32], dP[32][32];
    for (int i = 0; i < N; i++) {
        double mx = -1e300, sum = 0;
        for (int j = 0; j < N; j++) {
            double a = 0;
            for (int d = 0; d < D; d++) a += (double)q[i * ld + d] * k[j * ld + d];
            P[i][j] = s * a;
            mx = fmax(mx, P[i][j]);
        }
        for (int j = 0; j < N; j++) sum += P[i][j] = exp(P[i][j] - mx);
        for (int j = 0; j < N; j++) P[i][j] /= sum;
        for (int d = 0; d < D; d++) {
            out[i * D + d] = 0;
            for (int j = 0; j < N; j++) out[i * D + d] += P[i][j] * v[j * ld + d];
        }
    }
    for (int j = 0; j < N; j++)
        for (int d = 0; d < D; d++) {
            dv[j * D + d] = 0;
            for (int i = 0; i < N; i++) dv[j * D + d] += P[i][j] * dout[i * ld + d];
        }
    for (int i = 0; i < N; i++) {
        double di = 0;
        for (int d = 0; d < D; d++) di += dout[i * ld + d] * out[i * D + d];
        for (int j = 0; j < N; j++) {
            double a = 0;
            for (int d = 0; d < D; d++) a += (double)dout[i * ld + d] * v[j * ld + d];
            dP[i][j] = P[i][j] * (a - di);
        }
        for (int d = 0; d < D; d++) {
            dq[i * D + d] = 0;
            for (int j = 0; j < N; j++) dq[i * D + d] += s * dP[i][j] * k[j * ld + d];
        }
    }
}

static void attention_matches_reference(int level) {
    cap_isa(level);
    enum { N = 20, D = 16, LD = 3 * D }; /* rows padded to 32: a partial tile */
    float qkv[N * LD], dout[N * LD], out[N * LD], lse[N], dqkv[N * LD];
    visc_rng r = visc_rng_make(5, VISC_STREAM_INIT, 0);
    for (int i = 0; i < N * LD; i++) qkv[i] = 2 * visc_rng_uniform(&r) - 1;
    for (int i = 0; i < N * LD; i++) dout[i] = 2 * visc_rng_uniform(&r) - 1;
    visc_attention a;
    memset(&a, 0, sizeof a);
    a.B = 1, a.H = 1, a.Nq = a.Nk = N, a.D = D, a.scale = 0.25f;
    a.q_sb = a.k_sb = a.v_sb = a.o_sb = N * LD;
    a.q_sn = a.k_sn = a.v_sn = a.o_sn = LD;
    visc_attention_forward(&a, out, lse, qkv, qkv + D, qkv + 2 * D);
    visc_attention_backward(&a, dqkv, dqkv + D, dqkv + 2 * D, NULL, NULL, dout, qkv, qkv + D,
                            qkv + 2 * D, out, lse);
    double ro[N * D], rdq[N * D], rdv[N * D];
    attention_ref(ro, rdq, rdv, qkv, qkv + D, qkv + 2 * D, dout, N, D, LD, a.scale);
    float got_o[N * D], got_dq[N * D], got_dv[N * D], w_o[N * D], w_dq[N * D], w_dv[N * D];
    for (int i = 0; i < N; i++)
        for (int d = 0; d < D; d++) {
            got_o[i * D + d] = out[i * LD + d], w_o[i * D + d] = (float)ro[i * D + d];
            got_dq[i * D + d] = dqkv[i * LD + d], w_dq[i * D + d] = (float)rdq[i * D + d];
            got_dv[i * D + d] = dqkv[i * LD + 2 * D + d], w_dv[i * D + d] = (float)rdv[i * D + d];
        }
    CHECK_ARRAYS("attention out", got_o, w_o, N * D, 1e-5, 1e-4);
    CHECK_ARRAYS("attention dq", got_dq, w_dq, N * D, 1e-5, 1e-4);
    CHECK_ARRAYS("attention dv", got_dv, w_dv, N * D, 1e-5, 1e-4);
}

TEST(attention_avx2_tiles) { attention_matches_reference(1); }
TEST(attention_portable_transposes) { attention_matches_reference(0); }

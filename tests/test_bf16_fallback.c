/* test_bf16_fallback.c: a bf16 request on a CPU without native bf16.
 *
 * Its own binary because the CPU oneDNN may use can only be capped before
 * oneDNN first looks at it: capping at avx512_core (no bf16 dot products)
 * makes this machine look like one without avx512_bf16. */
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "../src/nn/linear_bf16.h"
#include "test.h"
#include "visc/nn.h"

TEST(bf16_falls_back_to_fp32) {
    CHECK(dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core) == dnnl_success);
    CHECK(visc_set_matmul_precision(VISC_PRECISION_BF16) == VISC_PRECISION_FP32);
    CHECK(visc_matmul_precision() == VISC_PRECISION_FP32);
    /* And the layer still works, in fp32: exact against a hand-computed case. */
    const float x[2 * 3] = {1, 2, 3, -1, 0.5f, 0.25f};
    const float w[2 * 3] = {0.1f, 0.2f, 0.3f, 1, -1, 1};
    const float b[2] = {0.5f, -0.5f};
    float out[4];
    visc_linear_forward(out, x, w, b, 2, 3, 2);
    const float want[4] = {0.5f + 0.1f + 0.4f + 0.9f, -0.5f + 1 - 2 + 3,
                           0.5f - 0.1f + 0.1f + 0.075f, -0.5f - 1 - 0.5f + 0.25f};
    CHECK_ARRAYS("fallback forward", out, want, 4, 1e-6, 1e-6);
}

TEST(bf16_emulated_on_request) {
    /* VISC_BF16_EMULATE=1: the products of the rounded operands, by
     * oneDNN's kernels without native bf16 (still capped above) or, below
     * AVX-512, by fp32 kernels on the operands widened back. 0.1f and 0.3f
     * are not bf16 values, so fp32 products would differ. */
    setenv("VISC_BF16_EMULATE", "1", 1);
    CHECK(visc_set_matmul_precision(VISC_PRECISION_BF16) == VISC_PRECISION_BF16);
    const float x[2 * 3] = {1, 2, 3, -1, 0.5f, 0.25f};
    const float w[2 * 3] = {0.1f, 0.2f, 0.3f, 1, -1, 1};
    const float b[2] = {0.5f, -0.5f};
    float out[4], want[4];
    visc_linear_forward(out, x, w, b, 2, 3, 2);
    for (int n = 0; n < 2; n++)
        for (int o = 0; o < 2; o++) {
            float s = 0;
            for (int i = 0; i < 3; i++)
                s += visc_bf16_to_f32(visc_f32_to_bf16(x[n * 3 + i])) *
                     visc_bf16_to_f32(visc_f32_to_bf16(w[o * 3 + i]));
            want[n * 2 + o] = s + b[o];
        }
    CHECK_ARRAYS("emulated forward", out, want, 4, 1e-6, 1e-6);
    CHECK(fabsf(out[0] - (0.5f + 0.1f + 0.4f + 0.9f)) > 1e-4f);
    visc_set_matmul_precision(VISC_PRECISION_FP32);
    unsetenv("VISC_BF16_EMULATE");
}

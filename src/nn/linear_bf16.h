/* linear_bf16.h: the bfloat16 path of the linear layer (private to
 * src/nn/linear*.c and tests).
 *
 * The same products as linear.c, with both operands rounded to bf16 and
 * fp32 accumulation and outputs, through oneDNN's matmul primitive (its
 * avx512_core_bf16 kernels issue vdpbf16ps: two bf16 products per fp32
 * lane, twice the fp32 FMA rate). Each returns 0 when it did the work and
 * -1 when oneDNN has no native bf16 kernel for the shape; the caller then
 * takes the fp32 path, so a bf16 request never fails. */
#ifndef VISC_LINEAR_BF16_H
#define VISC_LINEAR_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* 1 when the CPU has native bf16 dot products (oneDNN's avx512_core_bf16 or better). */
int visc_bf16_supported(void);

int visc_linear_bf16_forward(float *out, const float *in, const float *weight, const float *bias,
                             int N, int in_features, int out_features);
/* din and dbias may be NULL; dbias is the fp32 column sum of dout, the same
 * sum (bit for bit) as the fp32 path's. Nothing is written when it returns -1. */
int visc_linear_bf16_backward(float *din, float *dweight, float *dbias, const float *dout,
                              const float *in, const float *weight, int N, int in_features,
                              int out_features);
/* 1 when the precision is bf16 and all three products of a layer of this
 * shape have bf16 kernels: then the *_rounded variants below succeed. */
int visc_linear_bf16_ready(int N, int in_features, int out_features, int has_bias);
/* The same, whatever the precision: for a caller that keeps its own (the
 * stand-in GPU of the tests, whose bf16 is its context's). */
int visc_linear_bf16_shape_ready(int N, int in_features, int out_features, int has_bias);
/* The same products with the input already rounded to bf16 (by its
 * producer, e.g. visc_gelu_forward_bf16): no rounding pass over it. */
int visc_linear_bf16_forward_rounded(float *out, const uint16_t *in, const float *weight,
                                     const float *bias, int N, int in_features, int out_features);
int visc_linear_bf16_backward_rounded(float *din, float *dweight, float *dbias, const float *dout,
                                      const uint16_t *in, const float *weight, int N,
                                      int in_features, int out_features);
/* gelu.c: GELU with its output rounded to bf16 (visc_f32_to_bf16 of visc_gelu_forward's). */
void visc_gelu_forward_bf16(uint16_t *out, const float *in, size_t n);

/* linear.c: dbias[j] = sum over the N rows of dout[n, j], in fixed row
 * chunks (the same result for any thread count); when bf16 is given, dout
 * rounded to bf16 is written there in the same pass. */
void visc_linear_column_sums(float *dbias, uint16_t *bf16, const float *dout, int N, int cols);

/* fp32 -> bf16, round to nearest even (what vcvtneps2bf16 does); NaN stays NaN. */
static inline uint16_t visc_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float visc_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif

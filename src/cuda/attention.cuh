/* attention.cuh: a score as visc_attention defines it, for attention.cu's
 * fused kernels and attention_tc.cu's row kernels alike. */
#ifndef VISC_CUDA_ATTENTION_CUH
#define VISC_CUDA_ATTENTION_CUH

#include "common.cuh"

/* The score of (i, j) from the raw product q_i . k_j, in the CPU's order:
 * raw * s_h, then the bias, then the mask. */
__device__ __forceinline__ float visc_attn_score(const visc_attention &a, float raw, float sh,
                                                 int b, int h, int i, int j) {
    float s = raw * sh;
    if (a.bias) s += a.bias[((int64_t)h * a.Nq + i) * a.Nk + j];
    if (a.mask) s += a.mask[((int64_t)(b % a.nmask) * a.Nq + i) * a.Nk + j];
    return s;
}

/* s_h: head h's scale (Swin V2's per-head temperature) or the one scale. */
__device__ __forceinline__ float visc_attn_head_scale(const visc_attention &a, int h) {
    return a.head_scale ? a.head_scale[h] : a.scale;
}

/* attention_tc.cu: the bf16 forms, on tensor cores (attention.cu calls them
 * when the context multiplies in bf16). They take their workspace from the
 * caller, visc_attention_tc_bytes(ctx, a) bytes of it, 256-byte aligned. */
size_t visc_attention_tc_bytes(const visc_cuda *ctx, const visc_attention *a);
int visc_attention_tc_forward(visc_cuda *ctx, const visc_attention *a, float *out, float *lse,
                              const float *q, const float *k, const float *v, void *work);
/* delta [B H Nq]: dO_i . O_i (attention.cu's kernel); hs_rows [B H Nq] or
 * NULL: each row's share of dhead_scale, for attention.cu to sum. */
int visc_attention_tc_backward(visc_cuda *ctx, const visc_attention *a, float *dq, float *dk,
                               float *dv, float *dbias, float *hs_rows, const float *dout,
                               const float *q, const float *k, const float *v, const float *lse,
                               const float *delta, void *work);

/* attention_flash.cu: the bf16 forward and backward fused on tensor cores
 * (no N x N matrices), for heads of at most 64 dimensions unless
 * visc_cuda_set_attention_fused turned them off. */
int visc_attention_flash_ready(const visc_cuda *ctx, const visc_attention *a);
/* out: fp32, or bf16 with out_bf16 (each value rounded once) */
int visc_attention_flash_forward(visc_cuda *ctx, const visc_attention *a, void *out,
                                 int out_bf16, float *lse, const float *q, const float *k,
                                 const float *v);
/* The query side (dQ; dS into ds_out [B H Nq, Nk], for dbias's sums; each
 * row's share of dhead_scale into hs_rows [B H Nq]) for what of them is not
 * NULL, the key side (dK and dV) when dk is not. */
int visc_attention_flash_backward(visc_cuda *ctx, const visc_attention *a, float *dq, float *dk,
                                  float *dv, float *ds_out, float *hs_rows, const float *dout,
                                  const float *q, const float *k, const float *v,
                                  const float *lse, const float *delta);

#endif

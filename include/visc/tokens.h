/* tokens.h: layers on token sequences, the building blocks of transformers.
 *
 * Activations are [rows, C] row-major with C fastest, where rows = batch x
 * tokens ([B, N, C] in PyTorch terms). Parameters are laid out as PyTorch's.
 * Linear layers on tokens are visc_linear_* from nn.h (N = rows).
 * Conventions as nn.h: backward OVERWRITES its outputs (din, dgamma, ...);
 * din may be NULL when not needed; nothing allocates after the first call.
 *
 * layernorm.c   LayerNorm over the last dimension (torch.nn.LayerNorm)
 * gelu.c        GELU, exact erf form (torch.nn.GELU(), timm's default)
 * gelu_linear.c GELU then a linear layer, the GELU output kept in bf16 mode
 *               in the rounded form the product reads
 * attention.c   fused multi-head scaled-dot-product attention with optional
 *               per-head scale, additive bias and window masks
 * droppath.c    stochastic depth (per-sample residual-branch drop), fused
 *               with the residual add
 * layerscale.c  per-channel scaling of a residual branch (CaiT, DeiT III)
 * pos_embed.c   bicubic resampling of a learned position-embedding grid
 * token_ops.c   broadcast add of a [N, C] table, mean over tokens */
#ifndef VISC_TOKENS_H
#define VISC_TOKENS_H

#include <stddef.h>
#include <stdint.h>

/* ---- layernorm.c ----
 * out = (in - mean) * rstd * gamma + beta per row; save_mean/save_rstd [rows]
 * are kept for backward. gamma/beta may be NULL (no affine, dgamma/dbeta
 * ignored). */
void visc_layernorm_forward(float *out, float *save_mean, float *save_rstd, const float *in,
                            const float *gamma, const float *beta, int64_t rows, int C, float eps);
void visc_layernorm_backward(float *din, float *dgamma, float *dbeta, const float *dout,
                             const float *in, const float *gamma, const float *save_mean,
                             const float *save_rstd, int64_t rows, int C);
/* The same with din += the input's gradient: a residual stream's gradient
 * takes the norm's branch in the pass that computes it. */
void visc_layernorm_backward_add(float *din, float *dgamma, float *dbeta, const float *dout,
                                 const float *in, const float *gamma, const float *save_mean,
                                 const float *save_rstd, int64_t rows, int C);

/* ---- gelu.c ---- 0.5 x (1 + erf(x / sqrt 2)); din may alias dout. */
void visc_gelu_forward(float *out, const float *in, size_t n);
void visc_gelu_backward(float *din, const float *dout, const float *in, size_t n);

/* ---- gelu_linear.c ----
 * out = GELU(h) W^T + b ([N, hidden] -> [N, out]), the second half of a
 * transformer MLP; act ([N, hidden] floats of storage) keeps GELU(h) for
 * backward, in fp32, or in bf16 mode as the bf16 values the product uses
 * (read it only through visc_gelu_linear_backward). Backward overwrites dh
 * (d loss / d h) and the parameter gradients; pass dbias exactly when
 * forward had a bias. Same results as visc_gelu_* plus visc_linear_*. */
void visc_gelu_linear_forward(float *out, float *act, const float *h, const float *weight,
                              const float *bias, int N, int hidden, int out_features);
void visc_gelu_linear_backward(float *dh, float *dweight, float *dbias, const float *dout,
                               const float *act, const float *h, const float *weight, int N,
                               int hidden, int out_features);
/* act as forward leaves it, alone: for a caller that does not keep act
 * per layer and makes it again before backward (ViT's and CaiT's MLPs). */
void visc_gelu_linear_act(float *act, const float *h, int N, int hidden, int out_features,
                          int has_bias);

/* ---- attention.c ----
 * For each sequence b < B and head h < H:
 *   S = scale_h * Q K^T (+ bias[h]) (+ mask[b % nmask])      [Nq, Nk]
 *   out = softmax(S) V                                         [Nq, D]
 * with scale_h = head_scale[h] when head_scale is given, else `scale`.
 * Row maxima are subtracted (stable); each row's log-sum-exp is saved so
 * backward recomputes the probabilities instead of storing N x N. A row
 * whose scores are all -inf gets output 0 (and lse = +inf). The N x N work
 * matrices live in per-thread scratch kept between calls (grown on demand).
 * dbias / dhead_scale sums depend on the thread count only (static schedule).
 *
 * Tensors are addressed through strides (in floats), so the usual layouts
 * need no permute copies: element (b, h, n, d) of q is
 *   q[b * q_sb + h * q_sh + n * q_sn + d]
 * e.g. a fused qkv projection [B, N, 3, H, D]: q = qkv, k = qkv + H*D,
 * v = qkv + 2*H*D, all with sb = N*3*H*D, sh = D, sn = 3*H*D; and an output
 * [B, N, H, D] (= [B, N, C], ready for the projection): sb = N*H*D, sh = D,
 * sn = H*D. Gradients dq/dk/dv/dout use the strides of q/k/v/out. */
typedef struct {
    int B, H, Nq, Nk, D;
    float scale;
    const float *head_scale; /* [H] or NULL (Swin V2: exp(clamped logit_scale)) */
    const float *bias;       /* [H, Nq, Nk] or NULL (Swin relative position bias) */
    const float *mask;       /* [nmask, Nq, Nk] or NULL (shifted-window masks, 0 / -100) */
    int nmask;
    int64_t q_sb, q_sh, q_sn;
    int64_t k_sb, k_sh, k_sn;
    int64_t v_sb, v_sh, v_sn;
    int64_t o_sb, o_sh, o_sn;
    /* q, k and v are in the operand form (gpu.h's visc_gpu_operand_floats:
     * bf16 on a GPU under --precision bf16, where the projection wrote them
     * so; fp32 elsewhere, so the CPU layers read them as always) */
    int qkv_operand;
} visc_attention;

/* lse: [B, H, Nq], saved for backward. */
void visc_attention_forward(const visc_attention *a, float *out, float *lse, const float *q,
                            const float *k, const float *v);
/* Writes dq, dk, dv (overwritten; dq may be NULL). When dbias is given it
 * receives d(loss)/d(bias) [H, Nq, Nk] summed over sequences; when
 * dhead_scale is given, d(loss)/d(head_scale) [H]. */
void visc_attention_backward(const visc_attention *a, float *dq, float *dk, float *dv, float *dbias,
                             float *dhead_scale, const float *dout, const float *q, const float *k,
                             const float *v, const float *out, const float *lse);
/* Forward multiply-adds x 2 of one call. */
double visc_attention_flops(const visc_attention *a);

/* The shape of CaiT's talking-heads attention (models/talking_heads.h):
 * B sequences of T tokens, H heads of D (C = H D), qkv rows [B, T, 3, H, D]. */
typedef struct {
    int B, H, T, D, C;
    float scale;
} visc_th_dims;

/* ---- droppath.c ----
 * out = x + keep_b / (1 - p) * branch for each sample b of B (per_sample
 * floats each; out may be x: a residual sum in place, or the next block's
 * input written beside the kept x, with no copy of it first), keep_b ~
 * Bernoulli(1 - p) drawn from (seed, offset + b); p = 0 or eval is a plain
 * add. keep [B] records the factor applied (0 or
 * 1/(1-p)) for backward. The draw is the first uniform of
 * visc_rng_make(seed, VISC_STREAM_DROPOUT, offset + b); give each site and
 * step a disjoint offset range, e.g. offset = (step * sites + site) * B. */
/* The factors alone (what forward writes to keep): for a device that
 * draws them on the host. */
void visc_droppath_keep(float *keep, int B, float p, int train, uint64_t seed, uint64_t offset);
void visc_droppath_add_forward(float *out, const float *x, const float *branch, float *keep, int B,
                               size_t per_sample, float p, int train, uint64_t seed,
                               uint64_t offset);
/* dbranch = keep_b * dx (dx, the gradient of the sum, passes to x as is). */
void visc_droppath_add_backward(float *dbranch, const float *dx, const float *keep, int B,
                                size_t per_sample);

/* ---- layerscale.c ---- out = in * gamma (per channel C); out may alias in. */
void visc_layerscale_forward(float *out, const float *in, const float *gamma, int64_t rows, int C);
void visc_layerscale_backward(float *din, float *dgamma, const float *dout, const float *in,
                              const float *gamma, int64_t rows, int C);

/* ---- pos_embed.c ----
 * Resamples a position-embedding grid [old_h, old_w, C] to [new_h, new_w, C]
 * bicubically (align_corners = False, A = -0.75), as timm's
 * resample_abs_pos_embed (F.interpolate mode='bicubic') does when a
 * checkpoint meets another input resolution. Note: timm's default when it
 * loads a checkpoint is antialias=True, which for upsampling uses A = -0.5
 * instead; this function is the antialias=False (plain F.interpolate) one. */
void visc_pos_embed_resample(float *out, const float *in, int C, int old_h, int old_w, int new_h,
                             int new_w);
/* The same with antialias=True (torch's upsample_bicubic2d_aa: A = -0.5,
 * kernel widened by the scale when downsampling), timm's default in
 * resample_abs_pos_embed and hence in its checkpoint loading. */
void visc_pos_embed_resample_aa(float *out, const float *in, int C, int old_h, int old_w, int new_h,
                                int new_w);

/* ---- token_ops.c ---- */
/* x [B, N, C] += table [N, C] (position embedding). */
void visc_add_broadcast_forward(float *x, const float *table, int B, int64_t NC);
/* dtable = sum over b of dx (overwritten). */
void visc_add_broadcast_backward(float *dtable, const float *dx, int B, int64_t NC);
/* out [B, C] = mean over N of in [B, N, C]; backward spreads dout / N. */
void visc_token_mean_forward(float *out, const float *in, int B, int N, int C);
void visc_token_mean_backward(float *din, const float *dout, int B, int N, int C);

#endif

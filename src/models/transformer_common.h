/* transformer_common.h: pieces shared by the token-sequence models.
 *
 * ViT/DeiT (vit.c) and CaiT (cait.c) use them; Swin (swin.c) may too. They
 * are thin: a layer here is a set of parameter indices into the model's
 * table plus a call into nn.h / tokens.h, so each model's forward and
 * backward still read top to bottom in its own file.
 *
 * Conventions: tokens are [rows, C] row-major (rows = batch x tokens);
 * every *_backward OVERWRITES its outputs, as nn.h's layers do. */
#ifndef VISC_MODELS_TRANSFORMER_COMMON_H
#define VISC_MODELS_TRANSFORMER_COMMON_H

#include <stdint.h>

#include "visc/model.h"
#include "visc/nn.h"

/* Adds "<prefix>.<suffix>" to m->params; returns its index. */
int visc_tf_add_param(visc_model *m, const char *prefix, const char *suffix, int ndim,
                      const int64_t *shape, unsigned flags);

/* ---- nn.Linear on tokens ---- */
typedef struct {
    int weight, bias; /* param indices; bias -1 without one */
    int in, out;
} visc_tf_linear;

void visc_tf_add_linear(visc_model *m, visc_tf_linear *l, const char *name, int in, int out,
                        int has_bias);
void visc_tf_linear_forward(visc_model *m, const visc_tf_linear *l, float *out, const float *in,
                            int64_t rows);
/* Parameter gradients go to m->grads; din may be NULL. */
void visc_tf_linear_backward(visc_model *m, const visc_tf_linear *l, float *din, const float *dout,
                             const float *in, int64_t rows);
/* A classifier head on detached features: its parameter gradients from
 * dout (NULL: zero), nothing sent back. */
void visc_tf_head_backward(visc_model *m, const visc_tf_linear *l, const float *dout,
                           const float *in, int64_t rows);

/* ---- nn.LayerNorm over the channels ---- */
typedef struct {
    int weight, bias, C;
    float eps; /* timm's ViT/CaiT use 1e-6; nn.LayerNorm's default is 1e-5 */
} visc_tf_norm;

void visc_tf_add_norm(visc_model *m, visc_tf_norm *n, const char *name, int C, float eps);
/* mean, rstd: [rows] each, kept for backward. */
void visc_tf_norm_forward(visc_model *m, const visc_tf_norm *n, float *out, float *mean,
                          float *rstd, const float *in, int64_t rows);
void visc_tf_norm_backward(visc_model *m, const visc_tf_norm *n, float *din, const float *dout,
                           const float *in, const float *mean, const float *rstd, int64_t rows);
/* din += the input's gradient: a pre-norm block's residual stream takes
 * the branch's gradient in the norm's backward pass. */
void visc_tf_norm_backward_add(visc_model *m, const visc_tf_norm *n, float *din, const float *dout,
                               const float *in, const float *mean, const float *rstd, int64_t rows);

/* ---- a LayerNorm whose output only linear layers read, whole ----
 * The output is in the products' operand form (md_layernorm_operand_*:
 * bf16 on a GPU under --precision bf16, else fp32): read it only through
 * the _operand linear layer (and never at a row offset, whose size in
 * floats is not its size). */
void visc_tf_norm_operand_forward(visc_model *m, const visc_tf_norm *n, float *out, float *mean,
                                  float *rstd, const float *in, int64_t rows);
void visc_tf_linear_operand_forward(visc_model *m, const visc_tf_linear *l, float *out,
                                    const float *in, int64_t rows);
void visc_tf_linear_operand_backward(visc_model *m, const visc_tf_linear *l, float *din,
                                     const float *dout, const float *in, int64_t rows);

/* ---- timm's Mlp: fc1 -> GELU -> fc2 (no dropout inside: timm's proj_drop = 0) ----
 * Forward keeps only fc1's output `h` [rows, hidden]; GELU(h) lives in a
 * scratch buffer and is recomputed in backward, which saves a quarter of a
 * ViT block's activation memory for one elementwise pass. */
typedef struct {
    visc_tf_linear fc1, fc2;
    int hidden;
} visc_tf_mlp;

void visc_tf_add_mlp(visc_model *m, visc_tf_mlp *p, const char *name, int C, int hidden);
/* h: [rows, hidden] kept; scratch: [rows, hidden]; in: a norm's output
 * in the operand form (visc_tf_norm_operand_forward). */
void visc_tf_mlp_forward(visc_model *m, const visc_tf_mlp *p, float *out, float *h, float *scratch,
                         const float *in, int64_t rows);
/* scratch, dscratch: [rows, hidden] each; din [rows, C] overwritten. */
void visc_tf_mlp_backward(visc_model *m, const visc_tf_mlp *p, float *din, const float *dout,
                          const float *in, const float *h, float *scratch, float *dscratch,
                          int64_t rows);
double visc_tf_mlp_flops(const visc_tf_mlp *p, int64_t rows);

/* ---- patch embedding: Conv2d(kernel = stride = patch), flattened to tokens ----
 * Token p of image b lands in row b * tokens + first + p of the output, so a
 * class token can take row 0 of each sequence (first = 1). */
typedef struct {
    visc_conv2d conv;
    int weight, bias;
    int grid; /* patches per side */
    int tokens, first;
} visc_tf_patch_embed;

void visc_tf_add_patch_embed(visc_model *m, visc_tf_patch_embed *p, const char *name, int batch,
                             int in_channels, int image, int patch, int C, int tokens, int first);
/* conv_out: [B, C, grid, grid] scratch kept for backward's layout only. */
void visc_tf_patch_embed_forward(visc_model *m, visc_tf_patch_embed *p, float *tokens,
                                 float *conv_out, const float *image);
/* dtokens: gradient of the token rows; dconv: [B, C, grid, grid] scratch. */
void visc_tf_patch_embed_backward(visc_model *m, visc_tf_patch_embed *p, float *dconv,
                                  const float *dtokens, const float *image);
void visc_tf_patch_embed_destroy(visc_tf_patch_embed *p);

/* ---- rows of a sequence batch ---- */
/* out [B, C] = rows b * tokens + index of x [B * tokens, C]. */
void visc_tf_gather_token(float *out, const float *x, int B, int tokens, int index, int C);
/* dx [B * tokens, C] = 0 except rows b * tokens + index = dtok [B, C]. */
void visc_tf_scatter_token(float *dx, const float *dtok, int B, int tokens, int index, int C);

/* ---- timm-style initialization ('' mode), drawn from (seed, VISC_STREAM_INIT, tensor) ----
 *   2-D weights (nn.Linear): trunc_normal(std .02), biases 0
 *   LayerNorm (VISC_TENSOR_NORM): weight 1, bias 0
 *   4-D weights and their biases (the patch-embedding Conv2d, which timm's
 *   init leaves at PyTorch's default): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
 *   pos_embed: trunc_normal(std .02); cls_token: normal(std cls_std)
 *   gamma_1 / gamma_2 (LayerScale): init_values
 *   relative_position_bias_table: trunc_normal(std .02)
 * Anything else aborts (a model bug: a tensor nobody decided how to start). */
void visc_tf_init_params(visc_model *m, uint64_t seed, float cls_std, float init_values);

/* ---- noise: one offset range per drop site ----
 * Site s (1, 2, ...) owns the offsets [s << 32, (s + 1) << 32) of the
 * dropout stream: per-sample drop-path draws use s << 32 + b, element
 * dropout uses counters from s << 32. Site 0 is never used (it would share
 * counters with an element dropout at offset 0). */
static inline uint64_t visc_tf_noise_offset(int site) { return (uint64_t)site << 32; }

/* ---- the top of a class-token model (ViT/DeiT, CaiT) and what it owns ----
 * The final norm of the class token's last state [B, C] (timm normalizes
 * every token and keeps row 0: the same rows), the head dropout (noise site
 * VISC_TF_SITE_HEAD) and the head; and the model's arena, with the device
 * buffers a GPU adds (the uploaded dlogits, drop-path's draws on the host). */
enum { VISC_TF_SITE_HEAD = 1 };
typedef struct {
    visc_tf_patch_embed pe;
    visc_tf_norm norm;
    visc_tf_linear head;
    float *cls_mean, *cls_rstd, *feat, *feat_drop, *dfeat;
    uint8_t *drop_mask;
    int head_dropped; /* the last forward applied the head dropout */
    /* the logits in the arena: m->logits on the CPU; on a GPU m->logits and
     * m->features are host copies forward downloads */
    float *logits;
    float *dlogits, *keep_host; /* on a GPU: uploaded dlogits, drop-path's draws [B] */
    visc_arena arena;
} visc_tf_top;

/* Checks a config for a class-token model of `patch`-pixel patches at S px;
 * 0, or -1 with the error set. */
int visc_tf_check_config(const visc_model_config *cfg, int S, int patch);
/* The top's activations in the arena (C: the width). */
void visc_tf_top_plan(visc_model *m, visc_tf_top *t, visc_arena *a, int C);
/* Plans the model's activations (plan) in a counting pass, then into the
 * top's arena (empty for a model made for a GPU: model.h's for_gpu); sets
 * m->activation_bytes and the model's logits and features. */
void visc_tf_top_make_arena(visc_model *m, visc_tf_top *t,
                            void (*plan)(visc_model *, visc_arena *));
/* cls [B, C] -> the norm -> m->features, the head dropout in training, the
 * head -> m->logits (handed out to the host on a GPU). */
void visc_tf_top_forward(visc_model *m, visc_tf_top *t, const float *cls, int train);
/* From dlogits (the host's or NULL: the head's gradients zero) through the
 * head; with dfeatures (backward_features, not NULL there) the features'
 * gradient is that instead of the head's (whose dropout it then skips).
 * Then through the norm into dcls [B, C] (cls: forward's input). */
void visc_tf_top_backward(visc_model *m, visc_tf_top *t, const float *dlogits,
                          const float *dfeatures, float *dcls, const float *cls);
/* The arena again in device memory (model.h's to_cuda). */
int visc_tf_top_to_cuda(visc_model *m, visc_tf_top *t, void (*plan)(visc_model *, visc_arena *));
/* Frees the top, the arena, the tables, the gradients and m itself (the
 * model's own struct and blocks first, by the caller). */
void visc_tf_top_destroy(visc_model *m, visc_tf_top *t);

/* Drop-path rate of block i of depth blocks: timm's linspace(0, rate, depth). */
float visc_tf_drop_path_rate(float rate, int i, int depth);

#endif

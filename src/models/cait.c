/* cait.c: CaiT, "Going deeper with Image Transformers" (Touvron et al.
 * 2021), as timm 0.9.16 builds it, with timm's state_dict names.
 *
 * image -> Conv2d(patch 16) -> patch tokens + pos_embed (no class token
 * yet) -> depth x LayerScaleBlock:
 *     x += drop_path(gamma_1 * talking_heads_attn(norm1(x)))
 *     x += drop_path(gamma_2 * mlp(norm2(x)))
 * -> 2 x LayerScaleBlockClassAttn, where only the class token is updated:
 *     u = [cls, x];  cls += gamma_1 * class_attn(norm1(u)) (query: cls only)
 *                    cls += gamma_2 * mlp(norm2(cls))
 * -> norm(cls) -> dropout(drop_rate) -> head.
 *
 * Talking-heads attention (Shazeer et al. 2020) mixes the heads' attention
 * logits with proj_l before the softmax and the probabilities with proj_w
 * after it, so the [B, H, T, T] matrices are materialized here (the fused
 * attention of tokens.h cannot express the mixing); the class-attention
 * blocks have a single query row and use the fused attention.
 *
 * Variants: cait_xxs24_224 (embed 192, 24 blocks, 4 heads) and cait_s24_224
 * (384, 24, 8); patch 16, MLP ratio 4, LayerScale init 1e-5, LayerNorm eps
 * 1e-6. cfg.image_size (0: 224) may be any multiple of 16. As in timm, every
 * one of the 24 blocks uses the same drop-path rate (not a linear ramp) and
 * the class-attention blocks none.
 *
 * Memory: per block the arena keeps norm outputs, qkv, the probabilities
 * P ([B, H, T, T]; the scores S before them are made again from qkv in
 * backward), the attention and MLP outputs before LayerScale (LayerScale's
 * gamma gradient needs them), fc1's output and the residual stream.
 *
 * On a GPU (--device cuda) the same code runs, each call through
 * dispatch.h or talking_heads.h's steps to its GPU twin; the arena is
 * planned again in device memory (cait_to_cuda). The head dropout (--drop)
 * is not on the GPU yet. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "talking_heads.h"
#include "transformer_common.h"
#include "visc/model.h"
#include "visc/rng.h"
#include "visc/tokens.h"

typedef struct {
    const char *name;
    int embed, depth, heads;
} cait_spec;

static const cait_spec specs[] = {
    {"cait_xxs24_224", 192, 24, 4},
    {"cait_s24_224", 384, 24, 8},
};

enum { PATCH = 16, DEPTH_TOKEN_ONLY = 2 };

typedef struct {
    int gamma_1, gamma_2;
    visc_tf_norm norm1, norm2;
    visc_tf_linear qkv, proj, proj_l, proj_w;
    visc_tf_mlp mlp;
    const float *x;
    float *ln1, *mean1, *rstd1, *qkv_out, *Pr, *att, *a_out;
    float *x_mid, *ln2, *mean2, *rstd2, *h, *m_out, *x_out, *keep1, *keep2;
} cait_block;

typedef struct {
    int gamma_1, gamma_2;
    visc_tf_norm norm1, norm2;
    visc_tf_linear q, k, v, proj;
    visc_tf_mlp mlp;
    visc_attention attn;
    const float *cls; /* class token in: [B, C] */
    float *u, *ln1, *mean1, *rstd1, *q_in, *q_out, *k_out, *v_out, *att, *lse, *a_out;
    float *cls_mid, *ln2, *mean2, *rstd2, *h, *m_out, *cls_out;
} class_block;

typedef struct {
    int embed, depth, heads, tokens, hidden;
    float scale;
    int cls_token, pos_embed;
    cait_block *blocks;
    class_block cblocks[DEPTH_TOKEN_ONLY];
    visc_tf_top top; /* the patch embedding, the final norm, the head; the arena */
    float *image, *conv_out, *x0, *cls0;
    int trained; /* the last forward was a training one (its noise drawn) */
    /* scratch shared by all blocks */
    float *branch, *hid, *dhid, *mix, *dmix, *dmix2;
    float *dx, *dtmp, *dln, *datt, *dqkv, *dcls, *dcls_tmp, *du, *dk, *dv, *dq;
} cait;

#define P(idx) visc_model_param(m, (idx))
#define G(idx) visc_model_grad(m, (idx))

/* ---- talking-heads attention (talking_heads.h), on the CPU or the GPU ----
 * S = scale q k^T            [B, H, T, T]   (scratch, recomputed in backward)
 * P = softmax(proj_l(S))     mixing over heads at every (i, j)  (kept)
 * A = proj_w(P)              (scratch, recomputed in backward)
 * out = A v                  [B, T, H, D]
 * S is read again only by proj_l's weight gradient: one q k^T product
 * there, in place of a [B, H, T, T] tensor kept per block (as large as P:
 * a fifth of a block's activations). */

typedef visc_th_dims th_dims;

static void th_mix(visc_model *m, float *out, const float *in, const float *W, const float *bias,
                   const th_dims *d, int transpose) {
    const size_t TT = (size_t)d->T * d->T;
    if (m->cuda) visc_gpu_th_mix(m->cuda, out, in, W, bias, d->B, d->H, TT, transpose);
    else visc_th_mix(out, in, W, bias, d->B, d->H, TT, transpose);
}

static void th_mix_grad(visc_model *m, float *dW, float *db, const float *dY, const float *X,
                        const th_dims *d) {
    const size_t TT = (size_t)d->T * d->T;
    if (m->cuda) visc_gpu_th_mix_grad(m->cuda, dW, db, dY, X, d->B, d->H, TT);
    else visc_th_mix_grad(dW, db, dY, X, d->B, d->H, TT);
}

static void th_scores(visc_model *m, float *S, const float *qkv, const th_dims *d) {
    if (m->cuda) visc_gpu_th_scores(m->cuda, S, qkv, d);
    else visc_th_scores(S, qkv, d);
}

/* scratch: [B, H, T, T], S then A */
static void th_forward(visc_model *m, const cait_block *blk, float *scratch, const th_dims *d) {
    const size_t rows = (size_t)d->B * d->H * d->T;
    const float *qkv = blk->qkv_out;
    float *S = scratch, *A = scratch;
    th_scores(m, S, qkv, d);
    th_mix(m, blk->Pr, S, P(blk->proj_l.weight), P(blk->proj_l.bias), d, 0);
    if (m->cuda) visc_gpu_th_softmax(m->cuda, blk->Pr, rows, d->T);
    else visc_th_softmax(blk->Pr, rows, d->T);
    th_mix(m, A, blk->Pr, P(blk->proj_w.weight), P(blk->proj_w.bias), d, 0);
    if (m->cuda) visc_gpu_th_apply(m->cuda, blk->att, A, qkv, d);
    else visc_th_apply(blk->att, A, qkv, d);
}

/* datt [B, T, C] -> dqkv [B, T, 3C]; scratch A, dA, dS: [B, H, T, T] each. */
static void th_backward(visc_model *m, const cait_block *blk, float *dqkv, const float *datt,
                        float *A, float *dA, float *dS, const th_dims *d) {
    const size_t rows = (size_t)d->B * d->H * d->T;
    const float *qkv = blk->qkv_out;
    th_mix(m, A, blk->Pr, P(blk->proj_w.weight), P(blk->proj_w.bias), d, 0);
    /* dA = dout v^T, dv = A^T dout */
    if (m->cuda) {
        visc_gpu_th_grad_a(m->cuda, dA, datt, qkv, d);
        visc_gpu_th_grad_v(m->cuda, dqkv, A, datt, d);
    } else {
        visc_th_grad_a(dA, datt, qkv, d);
        visc_th_grad_v(dqkv, A, datt, d);
    }
    th_mix_grad(m, G(blk->proj_w.weight), G(blk->proj_w.bias), dA, blk->Pr, d);
    /* through proj_w (dP) and the softmax: dS1 = P (dP - <P, dP>) */
    th_mix(m, dS, dA, P(blk->proj_w.weight), NULL, d, 1);
    if (m->cuda) visc_gpu_th_softmax_backward(m->cuda, dS, blk->Pr, rows, d->T);
    else visc_th_softmax_backward(dS, blk->Pr, rows, d->T);
    float *S = A; /* A is read no more: the scores again, for proj_l's weight gradient */
    th_scores(m, S, qkv, d);
    th_mix_grad(m, G(blk->proj_l.weight), G(blk->proj_l.bias), dS, S, d);
    th_mix(m, dA, dS, P(blk->proj_l.weight), NULL, d, 1); /* dA now holds dS0 */
    /* dq = scale dS0 k, dk = scale dS0^T q */
    if (m->cuda) visc_gpu_th_grad_qk(m->cuda, dqkv, dA, qkv, d);
    else visc_th_grad_qk(dqkv, dA, qkv, d);
}

static double th_flops(const th_dims *d) {
    /* QK^T and AV, plus the two head mixes */
    double TT = (double)d->T * d->T;
    return 2.0 * d->B * d->H * TT * (2.0 * d->D + 2.0 * d->H);
}

/* ---- building ---- */

static int add_gamma(visc_model *m, const char *prefix, const char *name, int C) {
    int64_t s[1] = {C};
    return visc_tf_add_param(m, prefix, name, 1, s, VISC_TENSOR_NO_DECAY);
}

static void add_block(visc_model *m, cait *c, cait_block *b, int i) {
    char name[64], sub[96];
    const int C = c->embed, H = c->heads;
    snprintf(name, sizeof name, "blocks.%d", i);
#define SUB(s) (snprintf(sub, sizeof sub, "%s.%s", name, s), sub)
    b->gamma_1 = add_gamma(m, name, "gamma_1", C);
    b->gamma_2 = add_gamma(m, name, "gamma_2", C);
    visc_tf_add_norm(m, &b->norm1, SUB("norm1"), C, 1e-6f);
    visc_tf_add_linear(m, &b->qkv, SUB("attn.qkv"), C, 3 * C, 1);
    visc_tf_add_linear(m, &b->proj, SUB("attn.proj"), C, C, 1);
    visc_tf_add_linear(m, &b->proj_l, SUB("attn.proj_l"), H, H, 1);
    visc_tf_add_linear(m, &b->proj_w, SUB("attn.proj_w"), H, H, 1);
    visc_tf_add_norm(m, &b->norm2, SUB("norm2"), C, 1e-6f);
    visc_tf_add_mlp(m, &b->mlp, SUB("mlp"), C, c->hidden);
#undef SUB
}

static void add_class_block(visc_model *m, cait *c, class_block *b, int i) {
    char name[64], sub[96];
    const int C = c->embed, B = m->cfg.batch, H = c->heads, D = C / H, N = c->tokens + 1;
    snprintf(name, sizeof name, "blocks_token_only.%d", i);
#define SUB(s) (snprintf(sub, sizeof sub, "%s.%s", name, s), sub)
    b->gamma_1 = add_gamma(m, name, "gamma_1", C);
    b->gamma_2 = add_gamma(m, name, "gamma_2", C);
    visc_tf_add_norm(m, &b->norm1, SUB("norm1"), C, 1e-6f);
    visc_tf_add_linear(m, &b->q, SUB("attn.q"), C, C, 1);
    visc_tf_add_linear(m, &b->k, SUB("attn.k"), C, C, 1);
    visc_tf_add_linear(m, &b->v, SUB("attn.v"), C, C, 1);
    visc_tf_add_linear(m, &b->proj, SUB("attn.proj"), C, C, 1);
    visc_tf_add_norm(m, &b->norm2, SUB("norm2"), C, 1e-6f);
    visc_tf_add_mlp(m, &b->mlp, SUB("mlp"), C, c->hidden);
#undef SUB
    b->attn = (visc_attention){.B = B,
                               .H = H,
                               .Nq = 1,
                               .Nk = N,
                               .D = D,
                               .scale = 1.0f / sqrtf((float)D),
                               .q_sb = C,
                               .q_sh = D,
                               .q_sn = C,
                               .k_sb = (int64_t)N * C,
                               .k_sh = D,
                               .k_sn = C,
                               .v_sb = (int64_t)N * C,
                               .v_sh = D,
                               .v_sn = C,
                               .o_sb = C,
                               .o_sh = D,
                               .o_sn = C};
}

static void plan_activations(visc_model *m, cait *c, visc_arena *a) {
    const int B = m->cfg.batch, C = c->embed, S = m->cfg.image_size, T = c->tokens;
    const size_t R = (size_t)B * T, RC = R * C, RH = R * c->hidden;
    const size_t BHTT = (size_t)B * c->heads * T * T, BC = (size_t)B * C;
    const size_t U = (size_t)B * (T + 1);
    c->image = visc_arena_floats(a, (size_t)B * m->cfg.in_channels * S * S);
    m->input = c->image;
    c->conv_out = visc_arena_floats(a, RC);
    c->x0 = visc_arena_floats(a, RC);
    const float *x = c->x0;
    for (int i = 0; i < c->depth; i++) {
        cait_block *b = &c->blocks[i];
        b->x = x;
        b->x_out = visc_arena_floats(a, RC);
        x = b->x_out;
        if (md_one_block_inside(m) && i > 0) {
            /* block 0's internals, shared: backward recomputes each block's */
            const cait_block *first = &c->blocks[0];
            b->ln1 = first->ln1, b->mean1 = first->mean1, b->rstd1 = first->rstd1;
            b->qkv_out = first->qkv_out, b->Pr = first->Pr;
            b->att = first->att, b->a_out = first->a_out, b->x_mid = first->x_mid;
            b->ln2 = first->ln2, b->mean2 = first->mean2, b->rstd2 = first->rstd2;
            b->h = first->h, b->m_out = first->m_out;
            b->keep1 = first->keep1, b->keep2 = first->keep2;
            continue;
        }
        b->ln1 = md_take_operand(m, a, RC);
        b->mean1 = visc_arena_floats(a, R);
        b->rstd1 = visc_arena_floats(a, R);
        /* q, k, v and the heads' output att: the projections' operands */
        b->qkv_out = md_take_operand(m, a, 3 * RC);
        b->Pr = visc_arena_floats(a, BHTT);
        b->att = md_take_operand(m, a, RC);
        b->a_out = visc_arena_floats(a, RC);
        b->x_mid = visc_arena_floats(a, RC);
        b->ln2 = md_take_operand(m, a, RC);
        b->mean2 = visc_arena_floats(a, R);
        b->rstd2 = visc_arena_floats(a, R);
        b->h = md_take_operand(m, a, RH);
        b->m_out = visc_arena_floats(a, RC);
        b->keep1 = visc_arena_floats(a, (size_t)B);
        b->keep2 = visc_arena_floats(a, (size_t)B);
    }
    c->cls0 = visc_arena_floats(a, BC);
    const float *cls = c->cls0;
    for (int i = 0; i < DEPTH_TOKEN_ONLY; i++) {
        class_block *b = &c->cblocks[i];
        b->cls = cls;
        b->u = visc_arena_floats(a, U * C);
        b->ln1 = visc_arena_floats(a, U * C);
        b->mean1 = visc_arena_floats(a, U);
        b->rstd1 = visc_arena_floats(a, U);
        b->q_in = visc_arena_floats(a, BC);
        b->q_out = visc_arena_floats(a, BC);
        b->k_out = visc_arena_floats(a, U * C);
        b->v_out = visc_arena_floats(a, U * C);
        b->att = md_take_operand(m, a, BC);
        b->lse = visc_arena_floats(a, (size_t)B * c->heads);
        b->a_out = visc_arena_floats(a, BC);
        b->cls_mid = visc_arena_floats(a, BC);
        b->ln2 = md_take_operand(m, a, BC);
        b->mean2 = visc_arena_floats(a, (size_t)B);
        b->rstd2 = visc_arena_floats(a, (size_t)B);
        b->h = md_take_operand(m, a, (size_t)B * c->hidden);
        b->m_out = visc_arena_floats(a, BC);
        b->cls_out = visc_arena_floats(a, BC);
        cls = b->cls_out;
    }
    visc_tf_top_plan(m, &c->top, a, C);
    c->branch = visc_arena_floats(a, RC);
    c->hid = md_take_operand(m, a, RH);
    c->dhid = visc_arena_floats(a, RH);
    c->mix = visc_arena_floats(a, BHTT);
    c->dmix = visc_arena_floats(a, BHTT);
    c->dmix2 = visc_arena_floats(a, BHTT);
    c->dx = visc_arena_floats(a, RC);
    c->dtmp = visc_arena_floats(a, U * C);
    c->dln = visc_arena_floats(a, U * C);
    c->datt = visc_arena_floats(a, RC);
    c->dqkv = visc_arena_floats(a, 3 * RC);
    c->dcls = visc_arena_floats(a, BC);
    c->dcls_tmp = visc_arena_floats(a, BC);
    c->du = visc_arena_floats(a, U * C);
    c->dk = visc_arena_floats(a, U * C);
    c->dv = visc_arena_floats(a, U * C);
    c->dq = visc_arena_floats(a, BC);
}

/* ---- forward ---- */

static void layerscale_forward(visc_model *m, float *out, const float *in, const float *gamma,
                               int64_t rows, int C) {
    if (m->cuda) visc_gpu_layerscale_forward(m->cuda, out, in, gamma, rows, C);
    else visc_layerscale_forward(out, in, gamma, rows, C);
}

static void layerscale_backward(visc_model *m, float *din, float *dgamma, const float *dout,
                                const float *in, const float *gamma, int64_t rows, int C) {
    if (m->cuda) visc_gpu_layerscale_backward(m->cuda, din, dgamma, dout, in, gamma, rows, C);
    else visc_layerscale_backward(din, dgamma, dout, in, gamma, rows, C);
}

enum { SITE_BLOCKS = 2 }; /* 1: VISC_TF_SITE_HEAD */

static th_dims dims(const visc_model *m, const cait *c) {
    return (th_dims){m->cfg.batch, c->heads, c->tokens, c->embed / c->heads, c->embed, c->scale};
}

static void block_forward(visc_model *m, cait *c, cait_block *b, int i, int train) {
    const int B = m->cfg.batch, C = c->embed;
    const int64_t R = (int64_t)B * c->tokens;
    const size_t per_sample = (size_t)c->tokens * C;
    const float p = m->cfg.drop_path_rate;
    const th_dims d = dims(m, c);
    visc_tf_norm_operand_forward(m, &b->norm1, b->ln1, b->mean1, b->rstd1, b->x, R);
    md_linear_operands_forward(m, b->qkv_out, b->ln1, P(b->qkv.weight), P(b->qkv.bias), (int)R, C,
                               3 * C);
    th_forward(m, b, c->mix, &d);
    visc_tf_linear_operand_forward(m, &b->proj, b->a_out, b->att, R);
    layerscale_forward(m, c->branch, b->a_out, P(b->gamma_1), R, C);
    md_droppath_forward(m, b->x_mid, b->x, c->branch, b->keep1, c->top.keep_host, B, per_sample, p,
                        train, visc_tf_noise_offset(SITE_BLOCKS + 2 * i));
    visc_tf_norm_operand_forward(m, &b->norm2, b->ln2, b->mean2, b->rstd2, b->x_mid, R);
    visc_tf_mlp_forward(m, &b->mlp, b->m_out, b->h, c->hid, b->ln2, R);
    layerscale_forward(m, c->branch, b->m_out, P(b->gamma_2), R, C);
    md_droppath_forward(m, b->x_out, b->x_mid, c->branch, b->keep2, c->top.keep_host, B, per_sample,
                        p, train, visc_tf_noise_offset(SITE_BLOCKS + 2 * i + 1));
}

static void class_block_forward(visc_model *m, cait *c, class_block *b, const float *x) {
    const int B = m->cfg.batch, C = c->embed, T = c->tokens, N = T + 1;
    const int64_t U = (int64_t)B * N;
    const size_t BC = (size_t)B * C;
    for (int s = 0; s < B; s++) {
        float *u = b->u + (size_t)s * N * C;
        md_copy(m, u, b->cls + (size_t)s * C, (size_t)C);
        md_copy(m, u + C, x + (size_t)s * T * C, (size_t)T * C);
    }
    visc_tf_norm_forward(m, &b->norm1, b->ln1, b->mean1, b->rstd1, b->u, U);
    if (m->cuda) visc_gpu_copy_rows(m->cuda, b->q_in, C, b->ln1, (int64_t)N * C, B, C);
    else visc_tf_gather_token(b->q_in, b->ln1, B, N, 0, C);
    visc_tf_linear_forward(m, &b->q, b->q_out, b->q_in, B);
    visc_tf_linear_forward(m, &b->k, b->k_out, b->ln1, U);
    visc_tf_linear_forward(m, &b->v, b->v_out, b->ln1, U);
    /* the attention output is the projection's operand (bf16 on a GPU under bf16) */
    md_attention_operand_forward(m, &b->attn, b->att, b->lse, b->q_out, b->k_out, b->v_out);
    visc_tf_linear_operand_forward(m, &b->proj, b->a_out, b->att, B);
    layerscale_forward(m, b->cls_mid, b->a_out, P(b->gamma_1), B, C);
    md_add_in(m, b->cls_mid, b->cls, BC);
    visc_tf_norm_operand_forward(m, &b->norm2, b->ln2, b->mean2, b->rstd2, b->cls_mid, B);
    visc_tf_mlp_forward(m, &b->mlp, b->m_out, b->h, c->hid, b->ln2, B);
    layerscale_forward(m, b->cls_out, b->m_out, P(b->gamma_2), B, C);
    md_add_in(m, b->cls_out, b->cls_mid, BC);
}

static void cait_forward(visc_model *m, const float *x, int train) {
    VISC_ASSERT(m->cuda || !m->cfg.for_gpu);
    cait *c = m->impl;
    const int B = m->cfg.batch, C = c->embed, T = c->tokens, S = m->cfg.image_size;
    md_take_batch(m, c->image, x, (size_t)B * m->cfg.in_channels * S * S);
    visc_tf_patch_embed_forward(m, &c->top.pe, c->x0, c->conv_out, c->image);
    if (m->cuda) visc_gpu_add_broadcast(m->cuda, c->x0, P(c->pos_embed), B, (int64_t)T * C);
    else visc_add_broadcast_forward(c->x0, P(c->pos_embed), B, (int64_t)T * C);
    c->trained = train;
    for (int i = 0; i < c->depth; i++) block_forward(m, c, &c->blocks[i], i, train);
    for (int s = 0; s < B; s++) md_copy(m, c->cls0 + (size_t)s * C, P(c->cls_token), (size_t)C);
    const float *xs = c->blocks[c->depth - 1].x_out;
    for (int i = 0; i < DEPTH_TOKEN_ONLY; i++) class_block_forward(m, c, &c->cblocks[i], xs);
    /* timm normalizes [cls, x] and keeps row 0: the same as normalizing cls */
    const float *cls = c->cblocks[DEPTH_TOKEN_ONLY - 1].cls_out;
    visc_tf_top_forward(m, &c->top, cls, train);
}

/* ---- backward ---- */

/* c->dcls: gradient w.r.t. the block's class-token output on entry, w.r.t.
 * its input on exit; the patch tokens' gradient is added to c->dx. */
static void class_block_backward(visc_model *m, cait *c, class_block *b) {
    const int B = m->cfg.batch, C = c->embed, T = c->tokens, N = T + 1;
    const int64_t U = (int64_t)B * N;
    const size_t BC = (size_t)B * C, UC = (size_t)U * C;
    float *dcls = c->dcls, *dt = c->dcls_tmp;
    layerscale_backward(m, dt, G(b->gamma_2), dcls, b->m_out, P(b->gamma_2), B, C);
    visc_tf_mlp_backward(m, &b->mlp, c->dq, dt, b->ln2, b->h, c->hid, c->dhid, B);
    /* dcls becomes the gradient w.r.t. cls_mid */
    visc_tf_norm_backward_add(m, &b->norm2, dcls, c->dq, b->cls_mid, b->mean2, b->rstd2, B);
    layerscale_backward(m, dt, G(b->gamma_1), dcls, b->a_out, P(b->gamma_1), B, C);
    visc_tf_linear_operand_backward(m, &b->proj, c->dq, dt, b->att, B);
    md_copy(m, dt, c->dq, BC); /* d(att) */
    md_attention_operand_backward(m, &b->attn, c->dq, c->dk, c->dv, NULL, NULL, dt, b->q_out,
                                  b->k_out, b->v_out, b->att, b->lse);
    visc_tf_linear_backward(m, &b->k, c->dln, c->dk, b->ln1, U);
    visc_tf_linear_backward(m, &b->v, c->dtmp, c->dv, b->ln1, U);
    md_add_in(m, c->dln, c->dtmp, UC);
    visc_tf_linear_backward(m, &b->q, dt, c->dq, b->q_in, B);
    for (int s = 0; s < B; s++) md_add_in(m, c->dln + (size_t)s * N * C, dt + (size_t)s * C, C);
    visc_tf_norm_backward(m, &b->norm1, c->du, c->dln, b->u, b->mean1, b->rstd1, U);
    for (int s = 0; s < B; s++) {
        const float *du = c->du + (size_t)s * N * C;
        md_add_in(m, dcls + (size_t)s * C, du, C);
        md_add_in(m, c->dx + (size_t)s * T * C, du + C, (size_t)T * C);
    }
}

static void block_backward(visc_model *m, cait *c, cait_block *b) {
    const int B = m->cfg.batch, C = c->embed;
    const int64_t R = (int64_t)B * c->tokens;
    const size_t per_sample = (size_t)c->tokens * C;
    const th_dims d = dims(m, c);
    const int could_drop = c->trained && m->cfg.drop_path_rate > 0.0f;
    const float *dbranch =
        md_droppath_branch_grad(m, c->branch, c->dx, b->keep2, could_drop, B, per_sample);
    layerscale_backward(m, c->datt, G(b->gamma_2), dbranch, b->m_out, P(b->gamma_2), R, C);
    visc_tf_mlp_backward(m, &b->mlp, c->dln, c->datt, b->ln2, b->h, c->hid, c->dhid, R);
    visc_tf_norm_backward_add(m, &b->norm2, c->dx, c->dln, b->x_mid, b->mean2, b->rstd2, R);
    dbranch = md_droppath_branch_grad(m, c->branch, c->dx, b->keep1, could_drop, B, per_sample);
    layerscale_backward(m, c->dln, G(b->gamma_1), dbranch, b->a_out, P(b->gamma_1), R, C);
    visc_tf_linear_operand_backward(m, &b->proj, c->datt, c->dln, b->att, R);
    th_backward(m, b, c->dqkv, c->datt, c->mix, c->dmix, c->dmix2, &d);
    visc_tf_linear_operand_backward(m, &b->qkv, c->dln, c->dqkv, b->ln1, R);
    visc_tf_norm_backward_add(m, &b->norm1, c->dx, c->dln, b->x, b->mean1, b->rstd1, R);
}

/* From c->dcls (the gradient at the class token's last state) to the input. */
static void trunk_backward(visc_model *m, cait *c) {
    const int B = m->cfg.batch, C = c->embed, T = c->tokens;
    md_zero(m, c->dx, (size_t)B * T * C);
    for (int i = DEPTH_TOKEN_ONLY - 1; i >= 0; i--) class_block_backward(m, c, &c->cblocks[i]);
    float *dtok = G(c->cls_token);
    if (m->cuda) {
        visc_gpu_sum_rows(m->cuda, dtok, c->dcls, B, C);
    } else {
        memset(dtok, 0, (size_t)C * sizeof(float));
        for (int s = 0; s < B; s++) visc_add_inplace(dtok, c->dcls + (size_t)s * C, (size_t)C);
    }
    for (int i = c->depth - 1; i >= 0; i--) {
        /* --grad-checkpointing: the block's internals again, from its kept
         * input and the step's noise (the last block's are still there) */
        if (m->cfg.grad_checkpointing && i < c->depth - 1)
            block_forward(m, c, &c->blocks[i], i, c->trained);
        block_backward(m, c, &c->blocks[i]);
    }
    if (m->cuda) visc_gpu_sum_rows(m->cuda, G(c->pos_embed), c->dx, B, T * C);
    else visc_add_broadcast_backward(G(c->pos_embed), c->dx, B, (int64_t)T * C);
    visc_tf_patch_embed_backward(m, &c->top.pe, c->conv_out, c->dx, c->image);
}

/* the class token's last state: the top's input */
static const float *last_cls(const cait *c) { return c->cblocks[DEPTH_TOKEN_ONLY - 1].cls_out; }

static void cait_backward(visc_model *m, const float *dlogits) {
    cait *c = m->impl;
    visc_tf_top_backward(m, &c->top, dlogits, NULL, c->dcls, last_cls(c));
    trunk_backward(m, c);
}

static void cait_backward_features(visc_model *m, const float *dfeatures, const float *dlogits) {
    cait *c = m->impl;
    visc_tf_top_backward(m, &c->top, dlogits, dfeatures, c->dcls, last_cls(c));
    trunk_backward(m, c);
}

static void plan(visc_model *m, visc_arena *a) { plan_activations(m, m->impl, a); }

/* Every activation pointer moves to device memory (gpu.h). */
static int cait_to_cuda(visc_model *m) {
    cait *c = m->impl;
    return visc_tf_top_to_cuda(m, &c->top, plan);
}

static void cait_destroy(visc_model *m) {
    cait *c = m->impl;
    visc_tf_top_destroy(m, &c->top);
    free(c->blocks);
    free(c);
    free(m);
}

static double model_flops(const visc_model *m, const cait *c) {
    const int B = m->cfg.batch, C = c->embed;
    const double R = (double)B * c->tokens, U = (double)B * (c->tokens + 1);
    const th_dims d = dims(m, c);
    double f = visc_conv2d_flops(&c->top.pe.conv);
    for (int i = 0; i < c->depth; i++)
        f +=
            2.0 * R * 4.0 * C * C + th_flops(&d) + visc_tf_mlp_flops(&c->blocks[i].mlp, (int64_t)R);
    for (int i = 0; i < DEPTH_TOKEN_ONLY; i++)
        f += 2.0 * (2.0 * U + 2.0 * B) * C * C + visc_attention_flops(&c->cblocks[i].attn) +
             visc_tf_mlp_flops(&c->cblocks[i].mlp, B);
    f += 2.0 * B * (double)C * m->cfg.num_classes;
    return f / B;
}

visc_model *visc_cait_create(const visc_model_config *cfg, uint64_t seed) {
    const cait_spec *spec = NULL;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        if (strcmp(specs[i].name, cfg->arch) == 0) spec = &specs[i];
    if (!spec) {
        visc_set_error("unknown CaiT architecture '%s'", cfg->arch);
        return NULL;
    }
    const int S = cfg->image_size > 0 ? cfg->image_size : 224;
    if (visc_tf_check_config(cfg, S, PATCH)) return NULL;
    visc_model *m = visc_calloc(1, sizeof *m, "model");
    cait *c = visc_calloc(1, sizeof *c, "cait");
    m->cfg = *cfg;
    m->cfg.image_size = S;
    m->impl = c;
    visc_table_init(&m->params);
    visc_table_init(&m->buffers);
    const int C = spec->embed, grid = S / PATCH;
    c->embed = C;
    c->depth = spec->depth;
    c->heads = spec->heads;
    c->hidden = 4 * C;
    c->tokens = grid * grid;
    c->scale = 1.0f / sqrtf((float)(C / spec->heads));

    int64_t tok[3] = {1, 1, C}, pos[3] = {1, c->tokens, C};
    c->cls_token = visc_table_add(&m->params, "cls_token", 3, tok, VISC_TENSOR_NO_DECAY);
    c->pos_embed = visc_table_add(&m->params, "pos_embed", 3, pos, VISC_TENSOR_NO_DECAY);
    visc_tf_add_patch_embed(m, &c->top.pe, "patch_embed", cfg->batch, cfg->in_channels, S, PATCH, C,
                            c->tokens, 0);
    c->blocks = visc_calloc((size_t)c->depth, sizeof *c->blocks, "cait blocks");
    for (int i = 0; i < c->depth; i++) add_block(m, c, &c->blocks[i], i);
    for (int i = 0; i < DEPTH_TOKEN_ONLY; i++) add_class_block(m, c, &c->cblocks[i], i);
    visc_tf_add_norm(m, &c->top.norm, "norm", C, 1e-6f);
    visc_tf_add_linear(m, &c->top.head, "head", C, cfg->num_classes, 1);
    visc_table_alloc(&m->params);
    visc_table_alloc(&m->buffers);
    m->grads = visc_alloc_aligned(m->params.total * sizeof(float), "gradients");

    visc_tf_top_make_arena(m, &c->top, plan);

    visc_tf_init_params(m, seed, 0.02f, 1e-5f);
    m->flops_per_image = model_flops(m, c);
    m->forward = cait_forward;
    m->backward = cait_backward;
    m->backward_features = cait_backward_features;
    m->feature_dim = c->embed;
    m->to_cuda = cait_to_cuda;
    m->head_prefix = "head.";
    m->destroy = cait_destroy;
    return m;
}

/* vit.c: Vision Transformers (Dosovitskiy et al. 2020) and DeiT (Touvron et
 * al. 2020) as timm 0.9.16 builds them, with timm's state_dict names.
 *
 * image -> Conv2d(patch, stride patch) -> tokens, prepend cls_token, add
 * pos_embed -> depth x [x += drop_path(attn(norm1(x))); x += drop_path(
 * mlp(norm2(x)))] -> norm -> class token -> dropout(drop_rate) -> head.
 * LayerNorm eps 1e-6, qkv with bias, MLP ratio 4, exact GELU. DeiT's
 * deit_*_patch16_224 are this same VisionTransformer in timm 0.9.16 (the
 * distilled variants are not provided).
 *
 * Variants (name: patch, embed dim, depth, heads; default image size):
 *   vit_tiny_patch16_224, deit_tiny_patch16_224     16, 192, 12,  3; 224
 *   vit_small_patch16_224, deit_small_patch16_224   16, 384, 12,  6; 224
 *   vit_base_patch16_224, deit_base_patch16_224     16, 768, 12, 12; 224
 *   vit_tiny_patch4_32, deit_tiny_patch4_32          4, 192, 12,  3;  32 (CIFAR)
 *   vit_small_patch4_32                              4, 384, 12,  6;  32
 *   vit_femto_patch4_28                              4,  64,  4,  2;  28 (Fashion-MNIST, CI)
 *   vit_pico_patch4_28                               4,  96,  6,  3;  28
 * (vit_femto_patch4_28 on Fashion-MNIST, AdamW 2e-3, wd .05, cosine, 2 epochs,
 * batch 128: 75.6% top-1 in 111 s on 2 cores; short of the 85% wanted, to be
 * tuned.)
 * cfg.image_size (0: the default) may be any multiple of the patch size;
 * pos_embed is sized for it. A timm checkpoint made for another size is
 * fitted with visc_pos_embed_adapt() (below).
 *
 * Regularization as timm: drop_path_rate grows linearly over the blocks
 * (torch.linspace(0, rate, depth)); drop_rate is the dropout before the head
 * (timm 0.9's drop_rate; its pos/proj/attn dropouts are 0 by default and not
 * provided). Masks come from m->noise_seed, one offset range per site
 * (transformer_common.h), so a step's noise is reproducible.
 *
 * Memory: per block the arena keeps norm1's output, qkv, the attention
 * output and its log-sum-exps, the residual stream after attention, norm2's
 * output, fc1's output and the block output (12 C floats per token); GELU's
 * output and every branch output live in scratch shared by all blocks.
 * With --grad-checkpointing only the block outputs are kept per block; one
 * set of internals is shared, and backward recomputes each block's.
 *
 * On a GPU (--device cuda) the same code runs: the arena is planned again
 * in device memory (vit_to_cuda) and each layer call goes to its twin in
 * gpu.h when m->cuda is set; drop-path's per-sample factors are drawn on
 * the host as on the CPU. The head dropout (--drop) is not on the GPU yet. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "transformer_common.h"
#include "visc/gpu.h"
#include "visc/model.h"
#include "visc/rng.h"
#include "visc/tokens.h"

typedef struct {
    const char *name;
    int patch, embed, depth, heads, image;
} vit_spec;

static const vit_spec specs[] = {
    {"vit_tiny_patch16_224", 16, 192, 12, 3, 224},  {"deit_tiny_patch16_224", 16, 192, 12, 3, 224},
    {"vit_small_patch16_224", 16, 384, 12, 6, 224}, {"deit_small_patch16_224", 16, 384, 12, 6, 224},
    {"vit_base_patch16_224", 16, 768, 12, 12, 224}, {"deit_base_patch16_224", 16, 768, 12, 12, 224},
    {"vit_tiny_patch4_32", 4, 192, 12, 3, 32},      {"deit_tiny_patch4_32", 4, 192, 12, 3, 32},
    {"vit_small_patch4_32", 4, 384, 12, 6, 32},     {"vit_femto_patch4_28", 4, 64, 4, 2, 28},
    {"vit_pico_patch4_28", 4, 96, 6, 3, 28},
};

typedef struct {
    visc_tf_norm norm1, norm2;
    visc_tf_linear qkv, proj;
    visc_tf_mlp mlp;
    visc_attention attn;
    float drop_path;
    const float *x; /* block input: the previous block's x_out */
    float *ln1, *mean1, *rstd1, *qkv_out, *att, *lse;
    float *x_mid, *ln2, *mean2, *rstd2, *h, *x_out;
    float *keep1, *keep2;
} vit_block;

typedef struct {
    int embed, depth, heads, tokens, hidden;
    int cls_token, pos_embed;
    vit_block *blocks;
    visc_tf_top top; /* the patch embedding, the final norm, the head; the arena */
    /* activations */
    float *image, *conv_out, *x0, *cls;
    int trained; /* the last forward was a training one (its noise drawn) */
    /* scratch shared by all blocks (forward and backward) */
    float *branch, *hid, *dhid, *dx, *dln, *datt, *dqkv, *dcls;
} vit;

#define P(idx) visc_model_param(m, (idx))
#define G(idx) visc_model_grad(m, (idx))

/* ---- building ---- */

static void add_block(visc_model *m, vit *v, vit_block *b, int i) {
    char name[64], sub[96];
    const int C = v->embed, B = m->cfg.batch, T = v->tokens, H = v->heads, D = C / H;
    snprintf(name, sizeof name, "blocks.%d", i);
#define SUB(s) (snprintf(sub, sizeof sub, "%s.%s", name, s), sub)
    visc_tf_add_norm(m, &b->norm1, SUB("norm1"), C, 1e-6f);
    visc_tf_add_linear(m, &b->qkv, SUB("attn.qkv"), C, 3 * C, 1);
    visc_tf_add_linear(m, &b->proj, SUB("attn.proj"), C, C, 1);
    visc_tf_add_norm(m, &b->norm2, SUB("norm2"), C, 1e-6f);
    visc_tf_add_mlp(m, &b->mlp, SUB("mlp"), C, v->hidden);
#undef SUB
    b->drop_path = visc_tf_drop_path_rate(m->cfg.drop_path_rate, i, v->depth);
    /* qkv rows are [3, H, D]: q, k, v of head h at h*D, C + h*D, 2C + h*D */
    b->attn = (visc_attention){.B = B,
                               .H = H,
                               .Nq = T,
                               .Nk = T,
                               .D = D,
                               .scale = 1.0f / sqrtf((float)D),
                               .q_sb = (int64_t)T * 3 * C,
                               .q_sh = D,
                               .q_sn = 3 * C,
                               .k_sb = (int64_t)T * 3 * C,
                               .k_sh = D,
                               .k_sn = 3 * C,
                               .v_sb = (int64_t)T * 3 * C,
                               .v_sh = D,
                               .v_sn = 3 * C,
                               .qkv_operand = 1,
                               .o_sb = (int64_t)T * C,
                               .o_sh = D,
                               .o_sn = C};
}

static void plan_activations(visc_model *m, vit *v, visc_arena *a) {
    const int B = m->cfg.batch, C = v->embed, S = m->cfg.image_size, G = v->top.pe.grid;
    const size_t R = (size_t)B * v->tokens, RC = R * C, RH = R * v->hidden;
    v->image = visc_arena_floats(a, (size_t)B * m->cfg.in_channels * S * S);
    m->input = v->image;
    v->conv_out = visc_arena_floats(a, (size_t)B * C * G * G);
    v->x0 = visc_arena_floats(a, RC);
    const float *x = v->x0;
    for (int i = 0; i < v->depth; i++) {
        vit_block *b = &v->blocks[i];
        b->x = x;
        b->x_out = visc_arena_floats(a, RC);
        x = b->x_out;
        if (md_one_block_inside(m) && i > 0) {
            /* block 0's internals, shared: backward recomputes each block's */
            const vit_block *first = &v->blocks[0];
            b->ln1 = first->ln1, b->mean1 = first->mean1, b->rstd1 = first->rstd1;
            b->qkv_out = first->qkv_out, b->att = first->att, b->lse = first->lse;
            b->x_mid = first->x_mid, b->ln2 = first->ln2, b->mean2 = first->mean2;
            b->rstd2 = first->rstd2, b->h = first->h;
            b->keep1 = first->keep1, b->keep2 = first->keep2;
            continue;
        }
        b->ln1 = md_take_operand(m, a, RC);
        b->mean1 = visc_arena_floats(a, R);
        b->rstd1 = visc_arena_floats(a, R);
        b->qkv_out = md_take_operand(m, a, 3 * RC);
        b->att = md_take_operand(m, a, RC);
        b->lse = visc_arena_floats(a, (size_t)B * v->heads * v->tokens);
        b->x_mid = visc_arena_floats(a, RC);
        b->ln2 = md_take_operand(m, a, RC);
        b->mean2 = visc_arena_floats(a, R);
        b->rstd2 = visc_arena_floats(a, R);
        b->h = md_take_operand(m, a, RH);
        b->keep1 = visc_arena_floats(a, (size_t)B);
        b->keep2 = visc_arena_floats(a, (size_t)B);
    }
    v->cls = visc_arena_floats(a, (size_t)B * C);
    visc_tf_top_plan(m, &v->top, a, C);
    v->branch = visc_arena_floats(a, RC);
    v->hid = md_take_operand(m, a, RH);
    v->dhid = visc_arena_floats(a, RH);
    v->dx = visc_arena_floats(a, RC);
    v->dln = visc_arena_floats(a, RC);
    v->datt = visc_arena_floats(a, RC);
    v->dqkv = visc_arena_floats(a, 3 * RC);
    v->dcls = visc_arena_floats(a, (size_t)B * C);
}

/* ---- forward ---- */

/* Noise sites: 1 the head dropout, 2 + 2i and 3 + 2i block i's drop-paths. */
enum { SITE_BLOCKS = 2 }; /* 1: VISC_TF_SITE_HEAD */

/* out = x + the block's branch (scratch v->branch) after drop-path */
static void droppath_forward(visc_model *m, vit *v, float *out, const float *x, float *keep,
                             float p, int train, uint64_t offset) {
    md_droppath_forward(m, out, x, v->branch, keep, v->top.keep_host, m->cfg.batch,
                        (size_t)v->tokens * v->embed, p, train, offset);
}

/* the branch's gradient (v->branch, or v->dx itself where nothing dropped) */
static const float *droppath_backward(visc_model *m, vit *v, const vit_block *b,
                                      const float *keep) {
    return md_droppath_branch_grad(m, v->branch, v->dx, keep, v->trained && b->drop_path > 0.0f,
                                   m->cfg.batch, (size_t)v->tokens * v->embed);
}

static void block_forward(visc_model *m, vit *v, vit_block *b, int i, int train) {
    const int B = m->cfg.batch;
    const int64_t R = (int64_t)B * v->tokens;
    float *qkv = b->qkv_out;
    const int C = v->embed;
    visc_tf_norm_operand_forward(m, &b->norm1, b->ln1, b->mean1, b->rstd1, b->x, R);
    /* q, k and v in the operand form (bf16 on a GPU under bf16), as is the
     * attention output, the projection's operand */
    md_linear_operands_forward(m, qkv, b->ln1, P(b->qkv.weight), P(b->qkv.bias), (int)R, C, 3 * C);
    md_attention_operand_forward(m, &b->attn, b->att, b->lse, qkv, md_operand_at(m, qkv, C),
                                 md_operand_at(m, qkv, 2 * (size_t)C));
    visc_tf_linear_operand_forward(m, &b->proj, v->branch, b->att, R);
    droppath_forward(m, v, b->x_mid, b->x, b->keep1, b->drop_path, train,
                     visc_tf_noise_offset(SITE_BLOCKS + 2 * i));
    visc_tf_norm_operand_forward(m, &b->norm2, b->ln2, b->mean2, b->rstd2, b->x_mid, R);
    visc_tf_mlp_forward(m, &b->mlp, v->branch, b->h, v->hid, b->ln2, R);
    droppath_forward(m, v, b->x_out, b->x_mid, b->keep2, b->drop_path, train,
                     visc_tf_noise_offset(SITE_BLOCKS + 2 * i + 1));
}

static void vit_forward(visc_model *m, const float *x, int train) {
    VISC_ASSERT(m->cuda || !m->cfg.for_gpu);
    vit *v = m->impl;
    const int B = m->cfg.batch, C = v->embed, T = v->tokens, S = m->cfg.image_size;
    md_take_batch(m, v->image, x, (size_t)B * m->cfg.in_channels * S * S);
    visc_tf_patch_embed_forward(m, &v->top.pe, v->x0, v->conv_out, v->image);
    for (int b = 0; b < B; b++) md_copy(m, v->x0 + (size_t)b * T * C, P(v->cls_token), (size_t)C);
    if (m->cuda) visc_gpu_add_broadcast(m->cuda, v->x0, P(v->pos_embed), B, (int64_t)T * C);
    else visc_add_broadcast_forward(v->x0, P(v->pos_embed), B, (int64_t)T * C);
    v->trained = train;
    for (int i = 0; i < v->depth; i++) block_forward(m, v, &v->blocks[i], i, train);
    /* norm is per token, so normalizing the class token alone gives timm's norm(x)[:, 0] */
    const float *last = v->blocks[v->depth - 1].x_out;
    if (m->cuda) visc_gpu_copy_rows(m->cuda, v->cls, C, last, (int64_t)T * C, B, C);
    else visc_tf_gather_token(v->cls, last, B, T, 0, C);
    visc_tf_top_forward(m, &v->top, v->cls, train);
}

/* ---- backward ---- */

/* v->dx: the gradient w.r.t. the block output on entry, w.r.t. its input on exit. */
static void block_backward(visc_model *m, vit *v, vit_block *b) {
    const int B = m->cfg.batch;
    const int64_t R = (int64_t)B * v->tokens;
    const int C = v->embed;
    float *qkv = b->qkv_out;
    float *dqkv = v->dqkv;
    visc_tf_mlp_backward(m, &b->mlp, v->dln, droppath_backward(m, v, b, b->keep2), b->ln2, b->h,
                         v->hid, v->dhid, R);
    visc_tf_norm_backward_add(m, &b->norm2, v->dx, v->dln, b->x_mid, b->mean2, b->rstd2, R);
    visc_tf_linear_operand_backward(m, &b->proj, v->datt, droppath_backward(m, v, b, b->keep1),
                                    b->att, R);
    md_attention_operand_backward(m, &b->attn, dqkv, dqkv + C, dqkv + 2 * C, NULL, NULL, v->datt,
                                  qkv, md_operand_at(m, qkv, C),
                                  md_operand_at(m, qkv, 2 * (size_t)C), b->att, b->lse);
    visc_tf_linear_operand_backward(m, &b->qkv, v->dln, dqkv, b->ln1, R);
    visc_tf_norm_backward_add(m, &b->norm1, v->dx, v->dln, b->x, b->mean1, b->rstd1, R);
}

/* From v->dcls (the gradient at the class token's last state) to the input. */
static void trunk_backward(visc_model *m, vit *v) {
    const int B = m->cfg.batch, C = v->embed, T = v->tokens;
    if (m->cuda) {
        visc_gpu_zero(m->cuda, v->dx, (size_t)B * T * C);
        visc_gpu_copy_rows(m->cuda, v->dx, (int64_t)T * C, v->dcls, C, B, C);
    } else {
        visc_tf_scatter_token(v->dx, v->dcls, B, T, 0, C);
    }
    for (int i = v->depth - 1; i >= 0; i--) {
        /* --grad-checkpointing: the block's internals again, from its kept
         * input and the step's noise (the last block's are still there) */
        if (m->cfg.grad_checkpointing && i < v->depth - 1)
            block_forward(m, v, &v->blocks[i], i, v->trained);
        block_backward(m, v, &v->blocks[i]);
    }
    float *dcls = G(v->cls_token);
    if (m->cuda) {
        visc_gpu_sum_rows(m->cuda, G(v->pos_embed), v->dx, B, T * C);
        /* the class token's rows, then their sum (v->dcls is free again) */
        visc_gpu_copy_rows(m->cuda, v->dcls, C, v->dx, (int64_t)T * C, B, C);
        visc_gpu_sum_rows(m->cuda, dcls, v->dcls, B, C);
    } else {
        visc_add_broadcast_backward(G(v->pos_embed), v->dx, B, (int64_t)T * C);
        memset(dcls, 0, (size_t)C * sizeof(float));
        for (int b = 0; b < B; b++) visc_add_inplace(dcls, v->dx + (size_t)b * T * C, (size_t)C);
    }
    visc_tf_patch_embed_backward(m, &v->top.pe, v->conv_out, v->dx, v->image);
}

static void vit_backward(visc_model *m, const float *dlogits) {
    vit *v = m->impl;
    visc_tf_top_backward(m, &v->top, dlogits, NULL, v->dcls, v->cls);
    trunk_backward(m, v);
}

static void vit_backward_features(visc_model *m, const float *dfeatures, const float *dlogits) {
    vit *v = m->impl;
    visc_tf_top_backward(m, &v->top, dlogits, dfeatures, v->dcls, v->cls);
    trunk_backward(m, v);
}

static void plan(visc_model *m, visc_arena *a) { plan_activations(m, m->impl, a); }

/* Every activation pointer moves to device memory (gpu.h). */
static int vit_to_cuda(visc_model *m) {
    vit *v = m->impl;
    return visc_tf_top_to_cuda(m, &v->top, plan);
}

static void vit_destroy(visc_model *m) {
    vit *v = m->impl;
    visc_tf_top_destroy(m, &v->top);
    free(v->blocks);
    free(v);
    free(m);
}

static double model_flops(const visc_model *m, const vit *v) {
    const int B = m->cfg.batch, C = v->embed;
    const double R = (double)B * v->tokens;
    double f = visc_conv2d_flops(&v->top.pe.conv);
    for (int i = 0; i < v->depth; i++) {
        const vit_block *b = &v->blocks[i];
        f += 2.0 * R * (3.0 * C * C + (double)C * C) + visc_attention_flops(&b->attn);
        f += visc_tf_mlp_flops(&b->mlp, (int64_t)R);
    }
    f += 2.0 * B * (double)C * m->cfg.num_classes;
    return f / B;
}

visc_model *visc_vit_create(const visc_model_config *cfg, uint64_t seed) {
    const vit_spec *spec = NULL;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        if (strcmp(specs[i].name, cfg->arch) == 0) spec = &specs[i];
    if (!spec) {
        visc_set_error("unknown ViT/DeiT architecture '%s'", cfg->arch);
        return NULL;
    }
    const int S = cfg->image_size > 0 ? cfg->image_size : spec->image;
    if (visc_tf_check_config(cfg, S, spec->patch)) return NULL;
    visc_model *m = visc_calloc(1, sizeof *m, "model");
    vit *v = visc_calloc(1, sizeof *v, "vit");
    m->cfg = *cfg;
    m->cfg.image_size = S;
    m->impl = v;
    visc_table_init(&m->params);
    visc_table_init(&m->buffers);
    const int C = spec->embed, grid = S / spec->patch;
    v->embed = C;
    v->depth = spec->depth;
    v->heads = spec->heads;
    v->hidden = 4 * C;
    v->tokens = grid * grid + 1;

    /* Parameters in timm's state_dict order. */
    int64_t tok[3] = {1, 1, C}, pos[3] = {1, v->tokens, C};
    v->cls_token = visc_table_add(&m->params, "cls_token", 3, tok, VISC_TENSOR_NO_DECAY);
    v->pos_embed = visc_table_add(&m->params, "pos_embed", 3, pos, VISC_TENSOR_NO_DECAY);
    visc_tf_add_patch_embed(m, &v->top.pe, "patch_embed", cfg->batch, cfg->in_channels, S,
                            spec->patch, C, v->tokens, 1);
    v->blocks = visc_calloc((size_t)v->depth, sizeof *v->blocks, "vit blocks");
    for (int i = 0; i < v->depth; i++) add_block(m, v, &v->blocks[i], i);
    visc_tf_add_norm(m, &v->top.norm, "norm", C, 1e-6f);
    visc_tf_add_linear(m, &v->top.head, "head", C, cfg->num_classes, 1);
    visc_table_alloc(&m->params);
    visc_table_alloc(&m->buffers);
    m->grads = visc_alloc_aligned(m->params.total * sizeof(float), "gradients");

    visc_tf_top_make_arena(m, &v->top, plan);

    visc_tf_init_params(m, seed, 1e-6f, 0.0f);
    m->flops_per_image = model_flops(m, v);
    m->forward = vit_forward;
    m->backward = vit_backward;
    m->backward_features = vit_backward_features;
    m->feature_dim = v->embed;
    m->to_cuda = vit_to_cuda;
    m->head_prefix = "head.";
    m->destroy = vit_destroy;
    return m;
}

/* ---- checkpoints made for another image size ---- */

/* Splits a pos_embed token count into (prefix tokens, square grid side). */
static int split_tokens(int64_t tokens, int prefix, int *grid) {
    int64_t n = tokens - prefix;
    int64_t g = (int64_t)llround(sqrt((double)(n > 0 ? n : 0)));
    if (n <= 0 || g * g != n) return -1;
    *grid = (int)g;
    return 0;
}

int visc_pos_embed_adapt(const visc_model *m, float *dst, const float *src, int ndim,
                         const int64_t *shape) {
    int idx = visc_table_find(&m->params, "pos_embed");
    if (idx < 0) return visc_set_error("model %s has no pos_embed", m->cfg.arch);
    const visc_tensor_entry *e = &m->params.entries[idx];
    const int64_t C = e->shape[2], T = e->shape[1];
    if (ndim != 3 || shape[0] != 1 || shape[2] != C)
        return visc_set_error("pos_embed of the file is not [1, tokens, %lld]", (long long)C);
    /* ViT/DeiT prepend a class token's position (197 = 1 + 14^2), CaiT does not (196). */
    int prefix = 0, g_new, g_old;
    if (split_tokens(T, 0, &g_new) != 0) prefix = 1;
    if (split_tokens(T, prefix, &g_new) != 0 || split_tokens(shape[1], prefix, &g_old) != 0)
        return visc_set_error("pos_embed with %lld tokens does not fit a square grid of %s",
                              (long long)shape[1], m->cfg.arch);
    memcpy(dst, src, (size_t)prefix * C * sizeof(float));
    visc_pos_embed_resample_aa(dst + prefix * C, src + prefix * C, (int)C, g_old, g_old, g_new,
                               g_new);
    return 0;
}

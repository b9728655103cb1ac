/* swin.c: Swin Transformer V1 and V2 in timm 0.9.16's layout and naming.
 *
 * Swin (Liu et al. 2021): a 4x4 (or p x p) patch embedding, then stages of
 * blocks that attend within non-overlapping windows; every second block
 * rolls the grid by half a window first, so information crosses window
 * borders, and masks attention between tokens the roll brought together.
 * Each stage after the first halves the grid and doubles the width by patch
 * merging (2x2 neighbours concatenated, then a linear map 4C -> 2C).
 * Attention adds a learned bias indexed by the relative position of two
 * tokens inside their window. Final LayerNorm, token mean, linear head.
 *
 * V2 (Liu et al. 2022) changes, all as timm: cosine attention with a learned
 * per-head temperature (logits = cos(q, k) * exp(min(logit_scale, log 100))),
 * the bias table produced by a small MLP from log-spaced coordinates
 * (16 sigmoid(cpb_mlp(coords))), LayerNorm AFTER each residual branch
 * (x + norm(attn(x))), merging reduces before its norm, q and v biases only.
 *
 * Parameter names are timm's state_dict keys. timm 0.9.16 registers every
 * constant (relative_position_index, attn_mask, relative_coords_table) with
 * persistent=False, so state_dict has no buffers and neither has visc: a visc
 * checkpoint loads into timm with strict=True. The constants are rebuilt
 * here (swin_window.c). Activations are [rows, C] token rows (NHWC); every
 * one lives in one arena planned for cfg.batch.
 *
 * On a GPU (--device cuda) the same code runs, each call through
 * dispatch.h or the helpers below to its GPU twin: the arena and the
 * stages' constants (masks, index tables, V2's coordinates) move to device
 * memory (swin_to_cuda). The head dropout (--drop) is not on the GPU yet. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "swin_window.h"
#include "visc/model.h"
#include "visc/nn.h"
#include "visc/rng.h"
#include "visc/tokens.h"

#define LN_EPS 1e-5f
#define CPB_HIDDEN 512
#define MAX_STAGES 4

typedef struct {
    const char *name;
    int v2, patch, window, image, embed, stages;
    int depths[MAX_STAGES], heads[MAX_STAGES];
} swin_spec;

/* timm's models, and small ones for 32 px data (not in timm; same classes). */
static const swin_spec specs[] = {
    {"swin_tiny_patch4_window7_224", 0, 4, 7, 224, 96, 4, {2, 2, 6, 2}, {3, 6, 12, 24}},
    {"swin_small_patch4_window7_224", 0, 4, 7, 224, 96, 4, {2, 2, 18, 2}, {3, 6, 12, 24}},
    {"swin_base_patch4_window7_224", 0, 4, 7, 224, 128, 4, {2, 2, 18, 2}, {4, 8, 16, 32}},
    {"swinv2_tiny_window8_256", 1, 4, 8, 256, 96, 4, {2, 2, 6, 2}, {3, 6, 12, 24}},
    {"swinv2_small_window8_256", 1, 4, 8, 256, 96, 4, {2, 2, 18, 2}, {3, 6, 12, 24}},
    {"swinv2_base_window8_256", 1, 4, 8, 256, 128, 4, {2, 2, 18, 2}, {4, 8, 16, 32}},
    {"swin_tiny_patch2_window4_32", 0, 2, 4, 32, 96, 4, {2, 2, 6, 2}, {3, 6, 12, 24}},
    {"swinv2_tiny_patch2_window4_32", 1, 2, 4, 32, 96, 4, {2, 2, 6, 2}, {3, 6, 12, 24}},
    /* CPU-sized: 32 channels, head dim 16, three stages of two blocks. */
    {"swin_micro_patch2_window4_32", 0, 2, 4, 32, 32, 3, {2, 2, 2, 0}, {2, 4, 8, 0}},
    {"swinv2_micro_patch2_window4_32", 1, 2, 4, 32, 32, 3, {2, 2, 2, 0}, {2, 4, 8, 0}},
};

typedef struct {
    int v2, C, heads, hd, hidden, site;
    float drop_path;
    visc_swin_grid g;
    const float *mask;   /* [nw, N, N] of the stage, or NULL (not shifted) */
    const int32_t *rel;  /* [N * N] of the stage */
    const float *coords; /* V2: [T, 2] of the stage */
    int T;               /* rows of the bias table, (2wh-1)(2ww-1) */
    visc_attention attn;
    /* parameters (indices into m->params; -1 when absent) */
    int n1w, n1b, table, logit_scale, q_bias, v_bias, cpb0w, cpb0b, cpb2w;
    int qkvw, qkvb, projw, projb, n2w, n2b, fc1w, fc1b, fc2w, fc2b;
    /* activations */
    /* V2's qkv rows hold q and k normalized, and v; its a is the
     * output projection's output, in windowed order (the post-norm's input) */
    float *in, *xw, *qkv, *qnorm, *knorm, *ao, *lse, *a, *x1, *h, *mo, *out;
    float *mean1, *rstd1, *mean2, *rstd2, *keep1, *keep2;
    float *bias, *head_scale, *cpb_h, *cpb_t;
    int param_lo, param_hi; /* its tensors: params entries [lo, hi) */
} swin_block;

typedef struct {
    int C, H, W; /* input of the merge */
    int normw, normb, red;
    float *in, *m, *mid, *out, *mean, *rstd; /* in: the previous output */
} swin_merge;

typedef struct {
    int C, H, W, depth, has_merge;
    swin_merge merge;
    swin_block *blocks;
    visc_swin_grid plain, shifted;
    float *mask, *coords;
    int32_t *rel;
    float *dev_mask, *dev_coords; /* on a GPU: device copies of the constants */
    int32_t *dev_rel;
} swin_stage;

typedef struct {
    const swin_spec *spec;
    int v2, stages, grid, embed, features, last_tokens, sites;
    visc_conv2d patch;
    int pe_w, pe_b, pe_nw, pe_nb, norm_w, norm_b, fc_w, fc_b;
    swin_stage st[MAX_STAGES];
    /* activations */
    float *x, *pe_c, *pe_t, *pe_mean, *pe_rstd, *x0;
    float *fn, *f_mean, *f_rstd, *pooled, *feat;
    uint8_t *drop_mask;
    /* backward scratch */
    size_t max_rc, max_rh, max_hidden, max_bias, max_cpb;
    float *gx, *sa, *sb, *sh, *dbias, *dhs, *dcpb_t, *dcpb_h, *qkvb, *dqkvb;
    /* fc2's input, GELU(h), shared by the blocks: forward makes it and fc2
     * reads it at once; backward makes it again from the kept h (as
     * ViT's and CaiT's MLPs do, visc_tf_mlp_*), where each block kept its
     * own (Swin-T: 2.9 of its 17 GB at batch 256 in bf16, computed) */
    float *hid;
    float *dpooled, *dfeat;
    /* the logits in the arena: m->logits on the CPU; on a GPU m->logits and
     * m->features are host copies forward downloads */
    float *logits;
    float *dlogits, *keep_host; /* on a GPU: uploaded dlogits, drop-path's draws [B] */
    int last_train;
    visc_arena arena;
} swin;

#define P(idx) visc_model_param(m, (idx))
#define G(idx) visc_model_grad(m, (idx))

/* ---- building: parameters ---- */

static int add_param(visc_model *m, const char *prefix, const char *name, int ndim, int64_t d0,
                     int64_t d1, int64_t d2, unsigned flags) {
    char key[VISC_MAX_NAME + 64];
    int64_t shape[3] = {d0, d1, d2};
    snprintf(key, sizeof key, "%s%s", prefix, name);
    return visc_table_add(&m->params, key, ndim, shape, flags);
}

#define NORM_FLAGS (VISC_TENSOR_NO_DECAY | VISC_TENSOR_NORM)
#define BIAS_FLAGS (VISC_TENSOR_NO_DECAY | VISC_TENSOR_BIAS)

/* Registers one block's parameters in timm's state_dict order. */
static void add_block_params(visc_model *m, swin_block *b, const char *pre) {
    int C = b->C, H = b->heads;
    b->param_lo = m->params.count;
    b->table = b->logit_scale = b->q_bias = b->v_bias = b->cpb0w = b->cpb0b = b->cpb2w = -1;
    b->qkvb = -1;
    if (!b->v2) {
        b->n1w = add_param(m, pre, "norm1.weight", 1, C, 0, 0, NORM_FLAGS);
        b->n1b = add_param(m, pre, "norm1.bias", 1, C, 0, 0, NORM_FLAGS);
        b->table = add_param(m, pre, "attn.relative_position_bias_table", 2, b->T, H, 0,
                             VISC_TENSOR_NO_DECAY);
        b->qkvw = add_param(m, pre, "attn.qkv.weight", 2, 3 * C, C, 0, 0);
        b->qkvb = add_param(m, pre, "attn.qkv.bias", 1, 3 * C, 0, 0, BIAS_FLAGS);
        b->projw = add_param(m, pre, "attn.proj.weight", 2, C, C, 0, 0);
        b->projb = add_param(m, pre, "attn.proj.bias", 1, C, 0, 0, BIAS_FLAGS);
        b->n2w = add_param(m, pre, "norm2.weight", 1, C, 0, 0, NORM_FLAGS);
        b->n2b = add_param(m, pre, "norm2.bias", 1, C, 0, 0, NORM_FLAGS);
    } else {
        /* cpb_mlp and logit_scale: the original Swin V2's no-decay keywords */
        b->logit_scale = add_param(m, pre, "attn.logit_scale", 3, H, 1, 1, VISC_TENSOR_NO_DECAY);
        b->q_bias = add_param(m, pre, "attn.q_bias", 1, C, 0, 0, BIAS_FLAGS);
        b->v_bias = add_param(m, pre, "attn.v_bias", 1, C, 0, 0, BIAS_FLAGS);
        b->cpb0w =
            add_param(m, pre, "attn.cpb_mlp.0.weight", 2, CPB_HIDDEN, 2, 0, VISC_TENSOR_NO_DECAY);
        b->cpb0b = add_param(m, pre, "attn.cpb_mlp.0.bias", 1, CPB_HIDDEN, 0, 0, BIAS_FLAGS);
        b->cpb2w =
            add_param(m, pre, "attn.cpb_mlp.2.weight", 2, H, CPB_HIDDEN, 0, VISC_TENSOR_NO_DECAY);
        b->qkvw = add_param(m, pre, "attn.qkv.weight", 2, 3 * C, C, 0, 0);
        b->projw = add_param(m, pre, "attn.proj.weight", 2, C, C, 0, 0);
        b->projb = add_param(m, pre, "attn.proj.bias", 1, C, 0, 0, BIAS_FLAGS);
        b->n1w = add_param(m, pre, "norm1.weight", 1, C, 0, 0, NORM_FLAGS);
        b->n1b = add_param(m, pre, "norm1.bias", 1, C, 0, 0, NORM_FLAGS);
    }
    b->fc1w = add_param(m, pre, "mlp.fc1.weight", 2, b->hidden, C, 0, 0);
    b->fc1b = add_param(m, pre, "mlp.fc1.bias", 1, b->hidden, 0, 0, BIAS_FLAGS);
    b->fc2w = add_param(m, pre, "mlp.fc2.weight", 2, C, b->hidden, 0, 0);
    b->fc2b = add_param(m, pre, "mlp.fc2.bias", 1, C, 0, 0, BIAS_FLAGS);
    if (b->v2) {
        b->n2w = add_param(m, pre, "norm2.weight", 1, C, 0, 0, NORM_FLAGS);
        b->n2b = add_param(m, pre, "norm2.bias", 1, C, 0, 0, NORM_FLAGS);
    }
    b->param_hi = m->params.count;
}

static void add_merge_params(visc_model *m, swin_merge *mg, const char *pre, int v2) {
    int C = mg->C;
    if (!v2) {
        mg->normw = add_param(m, pre, "norm.weight", 1, 4 * C, 0, 0, NORM_FLAGS);
        mg->normb = add_param(m, pre, "norm.bias", 1, 4 * C, 0, 0, NORM_FLAGS);
        mg->red = add_param(m, pre, "reduction.weight", 2, 2 * C, 4 * C, 0, 0);
    } else {
        mg->red = add_param(m, pre, "reduction.weight", 2, 2 * C, 4 * C, 0, 0);
        mg->normw = add_param(m, pre, "norm.weight", 1, 2 * C, 0, 0, NORM_FLAGS);
        mg->normb = add_param(m, pre, "norm.bias", 1, 2 * C, 0, 0, NORM_FLAGS);
    }
}

/* ---- building: activations, planned once (a counting pass, then the real one) ---- */

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* A block's internals (everything but its output). */
static void plan_block(visc_model *m, visc_arena *a, swin *s, swin_block *b, int B) {
    size_t R = (size_t)B * b->g.H * b->g.W, C = (size_t)b->C;
    size_t seqs = (size_t)B * b->g.nw, N = (size_t)b->g.N;
    /* the windowed input of the qkv projection: V1's norm, V2's block input */
    b->xw = md_take_operand(m, a, R * C);
    /* q, k, v as attention reads them (V2's q and k normalized) */
    b->qkv = md_take_operand(m, a, R * 3 * C);
    b->ao = md_take_operand(m, a, R * C);
    b->lse = visc_arena_floats(a, seqs * b->heads * N);
    b->mean1 = visc_arena_floats(a, R);
    b->rstd1 = visc_arena_floats(a, R);
    b->mean2 = visc_arena_floats(a, R);
    b->rstd2 = visc_arena_floats(a, R);
    b->keep1 = visc_arena_floats(a, (size_t)B);
    b->keep2 = visc_arena_floats(a, (size_t)B);
    b->bias = visc_arena_floats(a, (size_t)b->heads * N * N);
    b->x1 = visc_arena_floats(a, R * C);
    b->h = md_take_operand(m, a, R * b->hidden);
    if (b->v2) {
        b->qnorm = visc_arena_floats(a, R * b->heads);
        b->knorm = visc_arena_floats(a, R * b->heads);
        b->a = visc_arena_floats(a, R * C);
        b->mo = visc_arena_floats(a, R * C);
        b->head_scale = visc_arena_floats(a, (size_t)b->heads);
        b->cpb_h = visc_arena_floats(a, (size_t)b->T * CPB_HIDDEN);
        b->cpb_t = visc_arena_floats(a, (size_t)b->T * b->heads);
        s->max_cpb = max_sz(s->max_cpb, (size_t)b->T * CPB_HIDDEN);
    }
    s->max_rc = max_sz(s->max_rc, R * C);
    s->max_rh = max_sz(s->max_rh, R * max_sz((size_t)b->hidden, 3 * C));
    s->max_hidden = max_sz(s->max_hidden, R * b->hidden);
    s->max_bias = max_sz(s->max_bias, (size_t)b->heads * N * N);
}

static void plan_activations(visc_model *m, swin *s, visc_arena *a) {
    int B = m->cfg.batch, S = m->cfg.image_size;
    size_t tok0 = (size_t)B * s->grid * s->grid;
    s->max_rc = s->max_rh = s->max_hidden = s->max_bias = s->max_cpb = 0;
    s->x = visc_arena_floats(a, (size_t)B * m->cfg.in_channels * S * S);
    m->input = s->x;
    s->pe_c = visc_arena_floats(a, tok0 * s->embed);
    s->pe_t = visc_arena_floats(a, tok0 * s->embed);
    s->pe_mean = visc_arena_floats(a, tok0);
    s->pe_rstd = visc_arena_floats(a, tok0);
    s->x0 = visc_arena_floats(a, tok0 * s->embed);
    s->max_rc = tok0 * s->embed;
    float *prev = s->x0;
    for (int i = 0; i < s->stages; i++) {
        swin_stage *st = &s->st[i];
        if (st->has_merge) {
            swin_merge *mg = &st->merge;
            size_t R4 = (size_t)B * (mg->H / 2) * (mg->W / 2);
            mg->in = prev;
            mg->m = visc_arena_floats(a, R4 * 4 * mg->C);
            mg->mid = visc_arena_floats(a, R4 * 4 * mg->C);
            mg->mean = visc_arena_floats(a, R4);
            mg->rstd = visc_arena_floats(a, R4);
            mg->out = visc_arena_floats(a, R4 * 2 * mg->C);
            prev = mg->out;
        }
        for (int j = 0; j < st->depth; j++) {
            swin_block *b = &st->blocks[j];
            b->in = prev;
            b->out = visc_arena_floats(a, (size_t)B * b->g.H * b->g.W * b->C);
            if (!md_one_block_inside(m)) plan_block(m, a, s, b, B);
            prev = b->out;
        }
    }
    if (md_one_block_inside(m)) {
        /* One region for every block's internals, as large as the largest
         * block needs: backward recomputes each block's before its own
         * backward, so only the outputs above are kept per block. */
        const size_t mark = a->used;
        size_t extent = 0;
        for (int i = 0; i < s->stages; i++)
            for (int j = 0; j < s->st[i].depth; j++) {
                a->used = mark;
                plan_block(m, a, s, &s->st[i].blocks[j], B);
                extent = max_sz(extent, a->used - mark);
            }
        a->used = mark + extent;
    }
    s->fn = visc_arena_floats(a, (size_t)B * s->last_tokens * s->features);
    s->f_mean = visc_arena_floats(a, (size_t)B * s->last_tokens);
    s->f_rstd = visc_arena_floats(a, (size_t)B * s->last_tokens);
    s->pooled = visc_arena_floats(a, (size_t)B * s->features);
    s->feat = visc_arena_floats(a, (size_t)B * s->features);
    s->dpooled = visc_arena_floats(a, (size_t)B * s->features);
    s->dfeat = visc_arena_floats(a, (size_t)B * s->features);
    s->drop_mask = visc_arena_take(a, (size_t)B * s->features);
    s->logits = visc_arena_floats(a, (size_t)B * m->cfg.num_classes);
    s->gx = visc_arena_floats(a, s->max_rc);
    s->sa = visc_arena_floats(a, s->max_rc);
    s->sb = visc_arena_floats(a, s->max_rc);
    s->sh = visc_arena_floats(a, s->max_rh);
    s->hid = md_take_operand(m, a, s->max_hidden);
    s->dbias = visc_arena_floats(a, s->max_bias);
    s->dhs = visc_arena_floats(a, 64);
    s->qkvb = visc_arena_floats(a, 3 * (size_t)s->features);
    s->dqkvb = visc_arena_floats(a, 3 * (size_t)s->features);
    s->dcpb_h = visc_arena_floats(a, s->max_cpb > 0 ? s->max_cpb : 1);
    s->dcpb_t = visc_arena_floats(a, s->max_bias > 0 ? s->max_bias : 1);
}

/* ---- initialization: timm's ---- */

/* trunc_normal_(std) on [-2, 2] (absolute bounds, as timm's; with std .02
 * nothing is ever cut): Box-Muller in float, both outputs used, one 32-bit
 * draw per uniform, so the 88M weights of swin_base take a fraction of a
 * second. */
static void fill_trunc_normal(float *w, size_t n, visc_rng *r, float std) {
    for (size_t j = 0; j < n;) {
        float u1 = ((float)(visc_rng_u32(r) >> 8) + 0.5f) * (1.0f / 16777216.0f);
        float u2 = (float)(visc_rng_u32(r) >> 8) * (1.0f / 16777216.0f);
        float rad = std * sqrtf(-2.0f * logf(u1)), a = 6.2831853f * u2;
        float v[2] = {rad * cosf(a), rad * sinf(a)};
        for (int k = 0; k < 2 && j < n; k++)
            if (v[k] >= -2.0f && v[k] <= 2.0f) w[j++] = v[k];
    }
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static void init_params(visc_model *m, const swin *s, uint64_t seed) {
    const visc_table *p = &m->params;
    /* each tensor draws from its own stream, so tensors can go in parallel */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < p->count; i++) {
        const visc_tensor_entry *e = &p->entries[i];
        float *w = visc_table_get(p, i);
        visc_rng rng = visc_rng_make(seed, VISC_STREAM_INIT, (uint64_t)i);
        if (i == s->pe_w || i == s->pe_b) {
            /* nn.Conv2d's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias */
            float bound =
                1.0f / sqrtf((float)(m->cfg.in_channels * s->spec->patch * s->spec->patch));
            for (size_t j = 0; j < e->numel; j++)
                w[j] = bound * (2.0f * visc_rng_uniform(&rng) - 1.0f);
        } else if (ends_with(e->name, "logit_scale")) {
            for (size_t j = 0; j < e->numel; j++) w[j] = logf(10.0f);
        } else if (e->flags & VISC_TENSOR_NORM) {
            /* LayerNorm 1 / 0; V2's res-post-norms start at 0 / 0 (_init_respostnorm) */
            int post = s->v2 && strstr(e->name, ".blocks.") &&
                       (strstr(e->name, ".norm1.") || strstr(e->name, ".norm2."));
            float v = ends_with(e->name, ".weight") && !post ? 1.0f : 0.0f;
            for (size_t j = 0; j < e->numel; j++) w[j] = v;
        } else if (e->ndim >= 2) {
            /* Linear weights and the V1 bias tables: trunc_normal_(std=.02) */
            fill_trunc_normal(w, e->numel, &rng, 0.02f);
        } else {
            memset(w, 0, e->numel * sizeof(float)); /* biases, q_bias, v_bias */
        }
    }
}

/* ---- forward ---- */

/* ---- the calls of Swin's own pieces, on the CPU or the GPU ---- */

/* The block input into windowed order as the qkv projection's operand
 * (V2's; V1's norm writes its windows itself, norm1_to_windows). */
static void partition_operand(visc_model *m, swin_block *b, int B) {
    const visc_swin_grid *g = &b->g;
    if (m->cuda)
        visc_gpu_swin_partition_operand(m->cuda, b->xw, b->in, g->H, g->W, g->wh, g->ww, g->sh,
                                        g->sw, B, b->C);
    else visc_swin_partition(b->xw, b->in, g, B, b->C);
}

/* acc += `windowed` rolled back to token order: the GPU in one pass, the
 * CPU through `scratch`. */
static void reverse_add(visc_model *m, const swin_block *b, float *acc, const float *windowed,
                        float *scratch, int B) {
    const visc_swin_grid *g = &b->g;
    if (m->cuda) {
        visc_gpu_swin_reverse_add(m->cuda, acc, windowed, g->H, g->W, g->wh, g->ww, g->sh, g->sw, B,
                                  b->C);
        return;
    }
    visc_swin_reverse(scratch, windowed, g, B, b->C);
    visc_add_inplace(acc, scratch, (size_t)B * g->H * g->W * b->C);
}

/* V2's post-norm of the attention branch, whose input (the output
 * projection's, kept in a) is in windowed order, into `out` in token
 * order. The statistics are kept at a's rows (windowed), so the norm is
 * one of the same rows as on the GPU, which does it in one pass; the CPU
 * norms the windowed rows into `scratch` and rolls them back. */
static void norm1_from_windows(visc_model *m, swin_block *b, float *out, float *scratch, int B) {
    const visc_swin_grid *g = &b->g;
    if (m->cuda) {
        visc_gpu_layernorm_from_windows(m->cuda, out, b->mean1, b->rstd1, b->a, P(b->n1w),
                                        P(b->n1b), g->H, g->W, g->wh, g->ww, g->sh, g->sw, B, b->C,
                                        LN_EPS);
        return;
    }
    visc_layernorm_forward(scratch, b->mean1, b->rstd1, b->a, P(b->n1w), P(b->n1b),
                           (int64_t)B * g->H * g->W, b->C, LN_EPS);
    visc_swin_reverse(out, scratch, g, B, b->C);
}

/* Its backward: dout in token order, the gradient w.r.t. a into dwin in
 * windowed order (not dout): on the GPU in one pass; the CPU partitions
 * dout into `scratch` first. */
static void norm1_backward_to_windows(visc_model *m, swin_block *b, float *dwin, const float *dout,
                                      float *scratch, int B) {
    const visc_swin_grid *g = &b->g;
    if (m->cuda) {
        visc_gpu_layernorm_backward_to_windows(m->cuda, dwin, G(b->n1w), G(b->n1b), dout, b->a,
                                               P(b->n1w), b->mean1, b->rstd1, g->H, g->W, g->wh,
                                               g->ww, g->sh, g->sw, B, b->C);
        return;
    }
    visc_swin_partition(scratch, dout, g, B, b->C);
    visc_layernorm_backward(dwin, G(b->n1w), G(b->n1b), scratch, b->a, P(b->n1w), b->mean1,
                            b->rstd1, (int64_t)B * g->H * g->W, b->C);
}

/* V1's output projection backward from dout, the gradient of its output
 * in token order (the residual stream's): the partition into windowed
 * order and the layer's backward, din into `din` (may be dout). The GPU
 * gathers the partition in the pass that rounds dY under bf16, where
 * `scratch` is not touched; the CPU partitions into it first. */
static void proj_backward_from_windows(visc_model *m, swin_block *b, float *din, const float *dout,
                                       float *scratch, int B) {
    const visc_swin_grid *g = &b->g;
    const int C = b->C, R = B * g->H * g->W;
    if (m->cuda) {
        visc_gpu_linear_operand_backward_from_windows(m->cuda, din, G(b->projw), G(b->projb), dout,
                                                      scratch, g->H, g->W, g->wh, g->ww, g->sh,
                                                      g->sw, B, b->ao, P(b->projw), C, C);
    } else {
        visc_swin_partition(scratch, dout, g, B, C);
        visc_linear_backward(din, G(b->projw), G(b->projb), scratch, b->ao, P(b->projw), R, C, C);
    }
}

/* V1's first norm, windowed for the qkv projection: into xw, its operand.
 * The GPU does both in one pass; the CPU norms into `scratch` first. */
static void norm1_to_windows(visc_model *m, swin_block *b, float *scratch, int B) {
    const visc_swin_grid *g = &b->g;
    if (m->cuda) {
        visc_gpu_layernorm_operand_to_windows(m->cuda, b->xw, b->mean1, b->rstd1, b->in, P(b->n1w),
                                              P(b->n1b), g->H, g->W, g->wh, g->ww, g->sh, g->sw, B,
                                              b->C, LN_EPS);
        return;
    }
    visc_layernorm_forward(scratch, b->mean1, b->rstd1, b->in, P(b->n1w), P(b->n1b),
                           (int64_t)B * g->H * g->W, b->C, LN_EPS);
    visc_swin_partition(b->xw, scratch, g, B, b->C);
}

/* Its backward: dwin, the gradient w.r.t. xw (windowed order), to the
 * gradient w.r.t. the block input, added to gx (the residual stream's): on
 * the GPU in one pass; on the CPU after the rows went through `spare` back
 * to token order. */
static void norm1_backward_from_windows_add(visc_model *m, swin_block *b, float *gx,
                                            const float *dwin, float *spare, int B) {
    const visc_swin_grid *g = &b->g;
    if (m->cuda) {
        visc_gpu_layernorm_backward_from_windows_add(m->cuda, gx, G(b->n1w), G(b->n1b), dwin, b->in,
                                                     P(b->n1w), b->mean1, b->rstd1, g->H, g->W,
                                                     g->wh, g->ww, g->sh, g->sw, B, b->C);
        return;
    }
    visc_swin_reverse(spare, dwin, g, B, b->C);
    visc_layernorm_backward_add(gx, G(b->n1w), G(b->n1b), spare, b->in, P(b->n1w), b->mean1,
                                b->rstd1, (int64_t)B * g->H * g->W, b->C);
}

static void gather_bias(visc_model *m, float *bias, const float *table, const int32_t *rel, int H,
                        int N, int sigmoid16) {
    if (m->cuda) visc_gpu_swin_gather_bias(m->cuda, bias, table, rel, H, N, sigmoid16);
    else visc_swin_gather_bias(bias, table, rel, H, N, sigmoid16);
}

static void scatter_bias(visc_model *m, float *dtable, const float *dbias, const float *bias,
                         const int32_t *rel, int T, int H, int N, int sigmoid16) {
    if (m->cuda) visc_gpu_swin_scatter_bias(m->cuda, dtable, dbias, bias, rel, T, H, N, sigmoid16);
    else visc_swin_scatter_bias(dtable, dbias, bias, rel, T, H, N, sigmoid16);
}

/* V2's q and k of the qkv projection's output raw normalized, into b->qkv
 * with v: on a GPU in attention's operand form (bf16 under bf16; raw is
 * scratch there), on the CPU in place (raw is b->qkv). */
static void normalize_qk(visc_model *m, swin_block *b, const float *raw, int64_t rows) {
    if (m->cuda)
        visc_gpu_swin_qkv_operand(m->cuda, b->qkv, b->qnorm, b->knorm, raw, rows, b->heads, b->hd);
    else visc_swin_normalize_qk(b->qkv, b->qnorm, b->knorm, raw, rows, b->heads, b->hd);
}

static void normalize_heads_backward(visc_model *m, float *dx, int64_t ld_dx, const float *dy,
                                     int64_t ld_dy, const float *y, int64_t ld_y,
                                     const float *norms, int64_t rows, int H, int D) {
    if (m->cuda)
        visc_gpu_swin_normalize_heads_backward(m->cuda, dx, ld_dx, dy, ld_dy, y, ld_y, norms, rows,
                                               H, D);
    else visc_swin_normalize_heads_backward(dx, ld_dx, dy, ld_dy, y, ld_y, norms, rows, H, D);
}

static void merge_copy(visc_model *m, float *tokens, float *merged, int B, int H, int W, int C,
                       int back) {
    if (m->cuda) visc_gpu_swin_merge_copy(m->cuda, tokens, merged, B, H, W, C, back);
    else visc_swin_merge_copy(tokens, merged, B, H, W, C, back);
}

static void token_mean_forward(visc_model *m, float *out, const float *in, int B, int N, int C) {
    if (m->cuda) visc_gpu_token_mean_forward(m->cuda, out, in, B, N, C);
    else visc_token_mean_forward(out, in, B, N, C);
}

static void token_mean_backward(visc_model *m, float *din, const float *dout, int B, int N, int C) {
    if (m->cuda) visc_gpu_token_mean_backward(m->cuda, din, dout, B, N, C);
    else visc_token_mean_backward(din, dout, B, N, C);
}

/* out [rows, C] tokens (NHWC) <- in [B, C, HW] (NCHW), and back. */
static void nchw_to_tokens(float *out, const float *in, int B, int C, int HW) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int t = 0; t < HW; t++)
                out[((size_t)b * HW + t) * C + c] = in[((size_t)b * C + c) * HW + t];
}

static void tokens_to_nchw(float *out, const float *in, int B, int C, int HW) {
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int t = 0; t < HW; t++)
                out[((size_t)b * C + c) * HW + t] = in[((size_t)b * HW + t) * C + c];
}

/* the noise offset of block b's drop-path `which` (0: attention, 1: MLP) */
static uint64_t droppath_offset(const swin_block *b, int which) {
    return (uint64_t)(2 * b->site + which) << 32;
}

/* out = x + the branch after drop-path (no copy of x first) */
static void residual_add(visc_model *m, swin *s, float *out, const float *x, const float *branch,
                         float *keep, const swin_block *b, int which, int train) {
    size_t per = (size_t)b->g.H * b->g.W * b->C;
    md_droppath_forward(m, out, x, branch, keep, s->keep_host, m->cfg.batch, per, b->drop_path,
                        train, droppath_offset(b, which));
}

/* The same with the branch in windowed order: rolled back to token order on
 * the way (the GPU in one pass; the CPU through `scratch`). */
static void residual_add_from_windows(visc_model *m, swin *s, float *out, const float *x,
                                      const float *branch, float *scratch, float *keep,
                                      const swin_block *b, int which, int train) {
    if (!m->cuda) {
        visc_swin_reverse(scratch, branch, &b->g, m->cfg.batch, b->C);
        residual_add(m, s, out, x, scratch, keep, b, which, train);
        return;
    }
    const visc_swin_grid *g = &b->g;
    visc_gpu_droppath_add_from_windows(m->cuda, out, x, branch, keep, s->keep_host, g->H, g->W,
                                       g->wh, g->ww, g->sh, g->sw, m->cfg.batch, b->C, b->drop_path,
                                       train, m->noise_seed, droppath_offset(b, which));
}

static void block_forward(visc_model *m, swin *s, swin_block *b, int train) {
    int B = m->cfg.batch, C = b->C, H = b->heads;
    int64_t R = (int64_t)B * b->g.H * b->g.W;
    if (!b->v2) {
        norm1_to_windows(m, b, s->sa, B);
        /* q, k, v and ao in the operand form (bf16 on a GPU under bf16) */
        md_linear_operands_forward(m, b->qkv, b->xw, P(b->qkvw), P(b->qkvb), (int)R, C, 3 * C);
        gather_bias(m, b->bias, P(b->table), b->rel, H, b->g.N, 0);
        md_attention_operand_forward(m, &b->attn, b->ao, b->lse, b->qkv,
                                     md_operand_at(m, b->qkv, C), md_operand_at(m, b->qkv, 2 * C));
        md_linear_operand_forward(m, s->sa, b->ao, P(b->projw), P(b->projb), (int)R, C, C);
        residual_add_from_windows(m, s, b->x1, b->in, s->sa, s->sb, b->keep1, b, 0, train);
        md_layernorm_operand_forward(m, s->sa, b->mean2, b->rstd2, b->x1, P(b->n2w), P(b->n2b), R,
                                     C, LN_EPS);
        md_linear_operands_forward(m, b->h, s->sa, P(b->fc1w), P(b->fc1b), (int)R, C, b->hidden);
        /* fc1's input (the norm2 output) is rebuilt in backward, not stored */
        md_gelu_linear_forward(m, s->sa, s->hid, b->h, P(b->fc2w), P(b->fc2b), (int)R, b->hidden,
                               C);
        residual_add(m, s, b->out, b->x1, s->sa, b->keep2, b, 1, train);
        return;
    }
    partition_operand(m, b, B);
    float *qkvb = s->qkvb;
    md_copy(m, qkvb, P(b->q_bias), (size_t)C);
    md_zero(m, qkvb + C, (size_t)C);
    md_copy(m, qkvb + 2 * C, P(b->v_bias), (size_t)C);
    /* backward needs only the normalized q and k (and their norms), so the
     * raw ones are not kept: on the CPU they are normalized in place, on a
     * GPU from the scratch sh (free in forward) into the operand form */
    float *raw = m->cuda ? s->sh : b->qkv;
    md_linear_operand_forward(m, raw, b->xw, P(b->qkvw), qkvb, (int)R, C, 3 * C);
    normalize_qk(m, b, raw, R);
    const float *ls = P(b->logit_scale);
    if (m->cuda) visc_gpu_swin_head_scale(m->cuda, b->head_scale, ls, H);
    else
        for (int h = 0; h < H; h++) b->head_scale[h] = expf(fminf(ls[h], logf(100.0f)));
    md_linear_forward(m, b->cpb_h, b->coords, P(b->cpb0w), P(b->cpb0b), b->T, 2, CPB_HIDDEN);
    md_relu_forward(m, b->cpb_h, b->cpb_h, (size_t)b->T * CPB_HIDDEN);
    md_linear_forward(m, b->cpb_t, b->cpb_h, P(b->cpb2w), NULL, b->T, CPB_HIDDEN, H);
    gather_bias(m, b->bias, b->cpb_t, b->rel, H, b->g.N, 1);
    md_attention_operand_forward(m, &b->attn, b->ao, b->lse, b->qkv, md_operand_at(m, b->qkv, C),
                                 md_operand_at(m, b->qkv, 2 * C));
    /* the projection's output stays in windowed order: the post-norm reads
     * it from there (and keeps it for its backward) */
    md_linear_operand_forward(m, b->a, b->ao, P(b->projw), P(b->projb), (int)R, C, C);
    norm1_from_windows(m, b, s->sb, s->sa, B);
    residual_add(m, s, b->x1, b->in, s->sb, b->keep1, b, 0, train);
    md_linear_forward_to_operand(m, b->h, b->x1, P(b->fc1w), P(b->fc1b), (int)R, C, b->hidden);
    md_gelu_linear_forward(m, b->mo, s->hid, b->h, P(b->fc2w), P(b->fc2b), (int)R, b->hidden, C);
    md_layernorm_forward(m, s->sa, b->mean2, b->rstd2, b->mo, P(b->n2w), P(b->n2b), R, C, LN_EPS);
    residual_add(m, s, b->out, b->x1, s->sa, b->keep2, b, 1, train);
}

static void merge_forward(visc_model *m, swin *s, swin_merge *mg) {
    int B = m->cfg.batch, C = mg->C;
    int64_t R4 = (int64_t)B * (mg->H / 2) * (mg->W / 2);
    merge_copy(m, mg->in, mg->m, B, mg->H, mg->W, C, 0);
    if (!s->v2) {
        md_layernorm_forward(m, mg->mid, mg->mean, mg->rstd, mg->m, P(mg->normw), P(mg->normb), R4,
                             4 * C, LN_EPS);
        md_linear_forward(m, mg->out, mg->mid, P(mg->red), NULL, (int)R4, 4 * C, 2 * C);
    } else {
        md_linear_forward(m, mg->mid, mg->m, P(mg->red), NULL, (int)R4, 4 * C, 2 * C);
        md_layernorm_forward(m, mg->out, mg->mean, mg->rstd, mg->mid, P(mg->normw), P(mg->normb),
                             R4, 2 * C, LN_EPS);
    }
}

static const float *last_output(const swin *s) {
    const swin_stage *st = &s->st[s->stages - 1];
    return st->depth > 0 ? st->blocks[st->depth - 1].out : st->merge.out;
}

static const swin_block *last_block(const swin *s) {
    for (int i = s->stages - 1; i >= 0; i--)
        if (s->st[i].depth > 0) return &s->st[i].blocks[s->st[i].depth - 1];
    return NULL;
}

static void swin_forward(visc_model *m, const float *x, int train) {
    VISC_ASSERT(m->cuda || !m->cfg.for_gpu);
    swin *s = m->impl;
    int B = m->cfg.batch, HW = s->grid * s->grid, E = s->embed;
    size_t xn = (size_t)B * m->cfg.in_channels * m->cfg.image_size * m->cfg.image_size;
    md_take_batch(m, s->x, x, xn);
    if (m->cuda) {
        visc_gpu_patch_embed_forward(m->cuda, &s->patch, s->pe_t, s->pe_c, s->x, P(s->pe_w),
                                     P(s->pe_b), HW, 0);
    } else {
        visc_conv2d_forward(&s->patch, s->pe_c, s->x, P(s->pe_w), P(s->pe_b));
        nchw_to_tokens(s->pe_t, s->pe_c, B, E, HW);
    }
    md_layernorm_forward(m, s->x0, s->pe_mean, s->pe_rstd, s->pe_t, P(s->pe_nw), P(s->pe_nb),
                         (int64_t)B * HW, E, LN_EPS);
    for (int i = 0; i < s->stages; i++) {
        swin_stage *st = &s->st[i];
        if (st->has_merge) merge_forward(m, s, &st->merge);
        for (int j = 0; j < st->depth; j++) block_forward(m, s, &st->blocks[j], train);
    }
    int64_t rows = (int64_t)B * s->last_tokens;
    md_layernorm_forward(m, s->fn, s->f_mean, s->f_rstd, last_output(s), P(s->norm_w), P(s->norm_b),
                         rows, s->features, LN_EPS);
    token_mean_forward(m, s->pooled, s->fn, B, s->last_tokens, s->features);
    const float *feat = s->pooled;
    if (train && m->cfg.drop_rate > 0.0f) {
        /* offset past every drop-path site, so the masks never share draws */
        visc_dropout_forward(s->feat, s->drop_mask, s->pooled, (size_t)B * s->features,
                             m->cfg.drop_rate, m->noise_seed, (uint64_t)(2 * s->sites + 1) << 32);
        feat = s->feat;
    }
    md_linear_forward(m, s->logits, feat, P(s->fc_w), P(s->fc_b), B, s->features,
                      m->cfg.num_classes);
    md_give_out(m, m->logits, &m->dev_logits, s->logits, (size_t)B * m->cfg.num_classes);
    md_give_out(m, m->features, &m->dev_features, s->pooled, (size_t)B * s->features);
    s->last_train = train;
}

/* ---- backward ---- */

/* dbranch of one residual add: keep_b * dx, or dx itself without drop-path. */
static const float *branch_grad(visc_model *m, const swin *s, const swin_block *b, float *dst,
                                const float *dx, const float *keep) {
    return md_droppath_branch_grad(m, dst, dx, keep, s->last_train && b->drop_path > 0.0f,
                                   m->cfg.batch, (size_t)b->g.H * b->g.W * b->C);
}

/* gx: gradient w.r.t. the block output on entry, w.r.t. its input on return. */
static void block_backward(visc_model *m, swin *s, swin_block *b) {
    int B = m->cfg.batch, C = b->C, H = b->heads, hid = b->hidden;
    int64_t R = (int64_t)B * b->g.H * b->g.W;
    size_t RC = (size_t)(R * C);
    float *gx = s->gx, *sa = s->sa, *sb = s->sb, *sh = s->sh;
    if (!b->v2) {
        const float *dm = branch_grad(m, s, b, sa, gx, b->keep2);
        /* rebuild norm2's output (fc1's input) into sb */
        md_layernorm_operand_forward(m, sb, b->mean2, b->rstd2, b->x1, P(b->n2w), P(b->n2b), R, C,
                                     LN_EPS);
        md_gelu_linear_act(m, s->hid, b->h, (int)R, hid, C, 1); /* fc2's input again */
        /* dm may be sa: fc2's products have read it before fc1's dX is written there */
        md_mlp_backward(m, sa, G(b->fc1w), G(b->fc1b), G(b->fc2w), G(b->fc2b), sh, dm, sb, b->h,
                        s->hid, P(b->fc1w), P(b->fc2w), (int)R, C, hid, C);
        md_layernorm_backward_add(m, gx, G(b->n2w), G(b->n2b), sa, b->x1, P(b->n2w), b->mean2,
                                  b->rstd2, R, C);
        const float *dbr = branch_grad(m, s, b, sa, gx, b->keep1);
        proj_backward_from_windows(m, b, sa, dbr, sb, B);
        md_attention_operand_backward(m, &b->attn, sh, sh + C, sh + 2 * C, s->dbias, NULL, sa,
                                      b->qkv, md_operand_at(m, b->qkv, C),
                                      md_operand_at(m, b->qkv, 2 * C), b->ao, b->lse);
        scatter_bias(m, G(b->table), s->dbias, NULL, b->rel, b->T, H, b->g.N, 0);
        md_linear_operand_backward(m, sa, G(b->qkvw), G(b->qkvb), sh, b->xw, P(b->qkvw), (int)R, C,
                                   3 * C);
        norm1_backward_from_windows_add(m, b, gx, sa, sb, B);
        return;
    }
    const float *dn2 = branch_grad(m, s, b, sa, gx, b->keep2);
    md_layernorm_backward(m, sb, G(b->n2w), G(b->n2b), dn2, b->mo, P(b->n2w), b->mean2, b->rstd2, R,
                          C);
    md_gelu_linear_act(m, s->hid, b->h, (int)R, hid, C, 1); /* fc2's input again */
    md_gelu_linear_backward(m, sh, G(b->fc2w), G(b->fc2b), sb, s->hid, b->h, P(b->fc2w), (int)R,
                            hid, C);
    md_linear_backward(m, sa, G(b->fc1w), G(b->fc1b), sh, b->x1, P(b->fc1w), (int)R, C, hid);
    md_add_in(m, gx, sa, RC);
    /* dn1 in sh (free until attention's backward): the norm's windowed
     * gradient goes to sa, which it must not be */
    const float *dn1 = branch_grad(m, s, b, sh, gx, b->keep1);
    norm1_backward_to_windows(m, b, sa, dn1, sb, B);
    md_linear_operand_backward(m, sb, G(b->projw), G(b->projb), sa, b->ao, P(b->projw), (int)R, C,
                               C);
    /* dq, dk of the normalized q, k and dv into dqkv (sh); then dq, dk
     * through the normalization, in place */
    md_attention_operand_backward(m, &b->attn, sh, sh + C, sh + 2 * C, s->dbias, s->dhs, sb, b->qkv,
                                  md_operand_at(m, b->qkv, C), md_operand_at(m, b->qkv, 2 * C),
                                  b->ao, b->lse);
    normalize_heads_backward(m, sh, 3 * C, sh, 3 * C, b->qkv, 3 * C, b->qnorm, R, H, b->hd);
    normalize_heads_backward(m, sh + C, 3 * C, sh + C, 3 * C, md_operand_at(m, b->qkv, C), 3 * C,
                             b->knorm, R, H, b->hd);
    const float *ls = P(b->logit_scale);
    float *dls = G(b->logit_scale);
    /* clamp(max) passes the gradient where the input is <= max (torch) */
    if (m->cuda) visc_gpu_swin_head_scale_backward(m->cuda, dls, ls, s->dhs, b->head_scale, H);
    else
        for (int h = 0; h < H; h++)
            dls[h] = ls[h] <= logf(100.0f) ? s->dhs[h] * b->head_scale[h] : 0.0f;
    scatter_bias(m, s->dcpb_t, s->dbias, b->bias, b->rel, b->T, H, b->g.N, 1);
    md_linear_backward(m, s->dcpb_h, G(b->cpb2w), NULL, s->dcpb_t, b->cpb_h, P(b->cpb2w), b->T,
                       CPB_HIDDEN, H);
    md_relu_backward(m, s->dcpb_h, s->dcpb_h, b->cpb_h, (size_t)b->T * CPB_HIDDEN);
    md_linear_backward(m, NULL, G(b->cpb0w), G(b->cpb0b), s->dcpb_h, b->coords, P(b->cpb0w), b->T,
                       2, CPB_HIDDEN);
    md_linear_operand_backward(m, sa, G(b->qkvw), s->dqkvb, sh, b->xw, P(b->qkvw), (int)R, C,
                               3 * C);
    md_copy(m, G(b->q_bias), s->dqkvb, (size_t)C);
    md_copy(m, G(b->v_bias), s->dqkvb + 2 * C, (size_t)C);
    reverse_add(m, b, gx, sa, sb, B);
}

static void merge_backward(visc_model *m, swin *s, swin_merge *mg) {
    int B = m->cfg.batch, C = mg->C;
    int64_t R4 = (int64_t)B * (mg->H / 2) * (mg->W / 2);
    if (!s->v2) {
        md_linear_backward(m, s->sa, G(mg->red), NULL, s->gx, mg->mid, P(mg->red), (int)R4, 4 * C,
                           2 * C);
        md_layernorm_backward(m, s->sb, G(mg->normw), G(mg->normb), s->sa, mg->m, P(mg->normw),
                              mg->mean, mg->rstd, R4, 4 * C);
    } else {
        md_layernorm_backward(m, s->sa, G(mg->normw), G(mg->normb), s->gx, mg->mid, P(mg->normw),
                              mg->mean, mg->rstd, R4, 2 * C);
        md_linear_backward(m, s->sb, G(mg->red), NULL, s->sa, mg->m, P(mg->red), (int)R4, 4 * C,
                           2 * C);
    }
    /* the gather is a permutation: its backward is the scatter */
    merge_copy(m, s->gx, s->sb, B, mg->H, mg->W, C, 1);
}

/* From dpooled (the gradient at the pooled features) to the input. */
static void trunk_backward(visc_model *m, swin *s, const float *dpooled) {
    int B = m->cfg.batch, F = s->features, E = s->embed, HW = s->grid * s->grid;
    int64_t rows = (int64_t)B * s->last_tokens;
    token_mean_backward(m, s->sa, dpooled, B, s->last_tokens, F);
    md_layernorm_backward(m, s->gx, G(s->norm_w), G(s->norm_b), s->sa, last_output(s), P(s->norm_w),
                          s->f_mean, s->f_rstd, rows, F);
    for (int i = s->stages - 1; i >= 0; i--) {
        swin_stage *st = &s->st[i];
        for (int j = st->depth - 1; j >= 0; j--) {
            swin_block *b = &st->blocks[j];
            /* --grad-checkpointing: the block's internals again, from its
             * kept input and the step's noise (the last block's are there) */
            if (m->cfg.grad_checkpointing && b != last_block(s))
                block_forward(m, s, b, s->last_train);
            block_backward(m, s, b);
            const visc_tensor_entry *last = &m->params.entries[b->param_hi - 1];
            visc_model_grad_ready(m, G(b->param_lo),
                                  last->offset + last->numel -
                                      m->params.entries[b->param_lo].offset);
        }
        if (st->has_merge) merge_backward(m, s, &st->merge);
    }
    md_layernorm_backward(m, s->sa, G(s->pe_nw), G(s->pe_nb), s->gx, s->pe_t, P(s->pe_nw),
                          s->pe_mean, s->pe_rstd, (int64_t)B * HW, E);
    if (m->cuda) {
        visc_gpu_patch_embed_backward(m->cuda, &s->patch, G(s->pe_w), G(s->pe_b), s->sb, s->sa,
                                      s->x, HW, 0);
    } else {
        tokens_to_nchw(s->sb, s->sa, B, E, HW);
        visc_conv2d_backward(&s->patch, NULL, G(s->pe_w), G(s->pe_b), s->sb, s->x, P(s->pe_w));
    }
}

/* The classifier's input: the pooled features, or their dropout. */
static const float *head_input(const visc_model *m, const swin *s) {
    return s->last_train && m->cfg.drop_rate > 0.0f ? s->feat : s->pooled;
}

static void swin_backward(visc_model *m, const float *dlogits) {
    swin *s = m->impl;
    int B = m->cfg.batch, F = s->features;
    int dropped = s->last_train && m->cfg.drop_rate > 0.0f;
    dlogits =
        md_from_host(m, s->dlogits, dlogits, (size_t)B * m->cfg.num_classes); /* from the host */
    md_linear_backward(m, s->dfeat, G(s->fc_w), G(s->fc_b), dlogits, head_input(m, s), P(s->fc_w),
                       B, F, m->cfg.num_classes);
    const float *dpooled = s->dfeat;
    if (dropped) {
        visc_dropout_backward(s->dpooled, s->dfeat, s->drop_mask, (size_t)B * F, m->cfg.drop_rate);
        dpooled = s->dpooled;
    }
    trunk_backward(m, s, dpooled);
}

static void swin_backward_features(visc_model *m, const float *dfeatures, const float *dlogits) {
    swin *s = m->impl;
    dlogits = md_from_host(m, s->dlogits, dlogits, (size_t)m->cfg.batch * m->cfg.num_classes);
    dfeatures = md_from_host(m, s->dfeat, dfeatures, (size_t)m->cfg.batch * s->features);
    if (dlogits) {
        md_linear_backward(m, NULL, G(s->fc_w), G(s->fc_b), dlogits, head_input(m, s), P(s->fc_w),
                           m->cfg.batch, s->features, m->cfg.num_classes);
    } else {
        visc_model_zero_grad(m, s->fc_w);
        visc_model_zero_grad(m, s->fc_b);
    }
    trunk_backward(m, s, dfeatures);
}

/* ---- lifetime ---- */

static void set_attention(visc_model *m, swin *s);

static void plan(visc_model *m, visc_arena *a) { plan_activations(m, m->impl, a); }

/* A device copy of n bytes of host memory (NULL in, NULL out). */
static void *device_copy(visc_model *m, const void *host, size_t bytes, int *failed) {
    if (!host || *failed) return NULL;
    void *d = visc_gpu_alloc(m->cuda, bytes);
    if (!d) *failed = 1;
    else visc_gpu_upload(m->cuda, d, host, bytes);
    return d;
}

/* The stages' constants, then the arena, to device memory; the attention
 * descriptors are set again for the device's pointers. */
static int swin_to_cuda(visc_model *m) {
    swin *s = m->impl;
    if (m->cfg.drop_rate > 0.0f)
        return visc_set_error("--device cuda: --drop (the head dropout) is not on the GPU yet");
    int failed = 0;
    for (int i = 0; i < s->stages; i++) {
        swin_stage *st = &s->st[i];
        const visc_swin_grid *g = &st->plain;
        const size_t NN = (size_t)g->N * g->N, T = (size_t)(2 * g->wh - 1) * (2 * g->ww - 1);
        st->dev_rel = device_copy(m, st->rel, sizeof(int32_t) * NN, &failed);
        st->dev_mask = device_copy(m, st->mask, sizeof(float) * st->shifted.nw * NN, &failed);
        st->dev_coords = device_copy(m, st->coords, sizeof(float) * T * 2, &failed);
        for (int j = 0; j < st->depth; j++) {
            swin_block *b = &st->blocks[j];
            b->mask = b->mask ? st->dev_mask : NULL;
            b->rel = st->dev_rel;
            b->coords = st->dev_coords;
        }
    }
    if (failed || visc_gpu_arena_move(m, &s->arena, plan, &s->dlogits)) return -1;
    set_attention(m, s);
    s->keep_host = visc_alloc_aligned((size_t)m->cfg.batch * sizeof(float), "drop-path draws");
    return 0;
}

static void swin_destroy(visc_model *m) {
    swin *s = m->impl;
    visc_conv2d_destroy(&s->patch);
    for (int i = 0; i < s->stages; i++) {
        free(s->st[i].blocks);
        free(s->st[i].mask);
        free(s->st[i].rel);
        free(s->st[i].coords);
        if (m->cuda) {
            visc_gpu_free(m->cuda, s->st[i].dev_mask);
            visc_gpu_free(m->cuda, s->st[i].dev_rel);
            visc_gpu_free(m->cuda, s->st[i].dev_coords);
        }
    }
    visc_free_aligned(s->keep_host);
    md_free_storage(m, &s->arena, s->dlogits);
    free(s);
    free(m);
}

static double model_flops(const visc_model *m, const swin *s) {
    int B = m->cfg.batch;
    double f = visc_conv2d_flops(&s->patch);
    for (int i = 0; i < s->stages; i++) {
        const swin_stage *st = &s->st[i];
        if (st->has_merge) {
            double R4 = (double)B * (st->merge.H / 2) * (st->merge.W / 2);
            f += 2.0 * R4 * 4 * st->merge.C * 2 * st->merge.C;
        }
        for (int j = 0; j < st->depth; j++) {
            const swin_block *b = &st->blocks[j];
            double R = (double)B * b->g.H * b->g.W, C = b->C;
            f += 2.0 * R * (3 * C * C + C * C + 2 * C * b->hidden);
            f += visc_attention_flops(&b->attn);
        }
    }
    f += 2.0 * B * (double)s->features * m->cfg.num_classes;
    return f / B;
}

/* Stage geometry, shared constants and blocks; -1 (error set) on a bad size. */
static int build_stage(visc_model *m, swin *s, int i, int *C, int *res, int *site, int total) {
    const swin_spec *sp = s->spec;
    swin_stage *st = &s->st[i];
    char pre[96];
    st->has_merge = i > 0;
    if (st->has_merge) {
        if (*res % 2)
            return visc_set_error("%s: stage %d input grid %dx%d is odd, cannot merge patches "
                                  "(image size %d)",
                                  m->cfg.arch, i, *res, *res, m->cfg.image_size);
        st->merge.C = *C;
        st->merge.H = st->merge.W = *res;
        snprintf(pre, sizeof pre, "layers.%d.downsample.", i);
        add_merge_params(m, &st->merge, pre, s->v2);
        *C *= 2;
        *res /= 2;
    }
    st->C = *C;
    st->H = st->W = *res;
    st->depth = sp->depths[i];
    if (visc_swin_grid_make(&st->plain, *res, *res, sp->window, 0) != 0 ||
        visc_swin_grid_make(&st->shifted, *res, *res, sp->window, 1) != 0)
        return visc_set_error("%s: image size %d gives a %dx%d grid at stage %d, which does not "
                              "split into %dx%d windows",
                              m->cfg.arch, m->cfg.image_size, *res, *res, i, sp->window,
                              sp->window);
    const visc_swin_grid *g = &st->plain;
    if (s->v2 && (g->wh < 2 || g->ww < 2))
        return visc_set_error("%s: image size %d leaves a 1x1 grid at stage %d; Swin V2's "
                              "position bias needs windows of at least 2x2",
                              m->cfg.arch, m->cfg.image_size, i);
    int T = (2 * g->wh - 1) * (2 * g->ww - 1), N = g->N;
    st->rel = visc_malloc(sizeof(int32_t) * (size_t)N * N, "swin relative index");
    visc_swin_rel_index(st->rel, g->wh, g->ww);
    if (st->shifted.sh || st->shifted.sw) {
        st->mask = visc_malloc(sizeof(float) * (size_t)g->nw * N * N, "swin mask");
        visc_swin_attn_mask(st->mask, &st->shifted);
    }
    if (s->v2) {
        st->coords = visc_malloc(sizeof(float) * (size_t)T * 2, "swin coords");
        visc_swin_v2_coords(st->coords, g->wh, g->ww);
    }
    if (*C % sp->heads[i])
        return visc_set_error("%s: width %d not divisible by %d heads", m->cfg.arch, *C,
                              sp->heads[i]);
    st->blocks =
        visc_calloc((size_t)(st->depth > 0 ? st->depth : 1), sizeof *st->blocks, "swin blocks");
    for (int j = 0; j < st->depth; j++) {
        swin_block *b = &st->blocks[j];
        b->v2 = s->v2;
        b->C = *C;
        b->heads = sp->heads[i];
        b->hd = *C / b->heads;
        b->hidden = 4 * *C;
        b->site = *site;
        b->drop_path = total > 1 ? m->cfg.drop_path_rate * (float)*site / (float)(total - 1) : 0.0f;
        (*site)++;
        int shift = (j % 2 == 1) && (st->shifted.sh || st->shifted.sw);
        b->g = shift ? st->shifted : st->plain;
        b->mask = shift ? st->mask : NULL;
        b->rel = st->rel;
        b->coords = st->coords;
        b->T = T;
        snprintf(pre, sizeof pre, "layers.%d.blocks.%d.", i, j);
        add_block_params(m, b, pre);
    }
    return 0;
}

/* The attention descriptors: q, k, v read in place from the qkv rows. */
static void set_attention(visc_model *m, swin *s) {
    for (int i = 0; i < s->stages; i++)
        for (int j = 0; j < s->st[i].depth; j++) {
            swin_block *b = &s->st[i].blocks[j];
            int64_t C = b->C, N = b->g.N, qk_ld = 3 * C;
            visc_attention *a = &b->attn;
            memset(a, 0, sizeof *a);
            a->B = m->cfg.batch * b->g.nw;
            a->H = b->heads;
            a->Nq = a->Nk = (int)N;
            a->D = b->hd;
            a->scale = 1.0f / sqrtf((float)b->hd);
            a->head_scale = b->v2 ? b->head_scale : NULL;
            a->bias = b->bias;
            a->mask = b->mask;
            a->nmask = b->mask ? b->g.nw : 0;
            a->q_sb = a->k_sb = N * qk_ld;
            a->q_sh = a->k_sh = b->hd;
            a->q_sn = a->k_sn = qk_ld;
            a->v_sb = N * 3 * C;
            a->v_sh = b->hd;
            a->v_sn = 3 * C;
            a->o_sb = N * C;
            a->o_sh = b->hd;
            a->o_sn = C;
            a->qkv_operand = 1; /* V2's q and k: its normalized ones */
        }
}

visc_model *visc_swin_create(const visc_model_config *cfg, uint64_t seed) {
    const swin_spec *sp = NULL;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        if (strcmp(specs[i].name, cfg->arch) == 0) sp = &specs[i];
    if (!sp) {
        visc_set_error("unknown Swin architecture '%s'", cfg->arch);
        return NULL;
    }
    int S = cfg->image_size;
    if (cfg->batch < 1 || cfg->num_classes < 1 || cfg->in_channels < 1 || S < 1 || S % sp->patch) {
        visc_set_error("%s needs batch >= 1, classes >= 1, channels >= 1 and an image size "
                       "divisible by the patch size %d (got batch %d, %d classes, %d channels, "
                       "%d px)",
                       cfg->arch, sp->patch, cfg->batch, cfg->num_classes, cfg->in_channels, S);
        return NULL;
    }
    if (cfg->drop_rate < 0.0f || cfg->drop_rate >= 1.0f || cfg->drop_path_rate < 0.0f ||
        cfg->drop_path_rate >= 1.0f) {
        visc_set_error("%s: drop_rate and drop_path_rate must lie in [0, 1)", cfg->arch);
        return NULL;
    }
    visc_model *m = visc_calloc(1, sizeof *m, "model");
    swin *s = visc_calloc(1, sizeof *s, "swin");
    m->cfg = *cfg;
    m->impl = s;
    m->destroy = swin_destroy;
    visc_table_init(&m->params);
    visc_table_init(&m->buffers);
    s->spec = sp;
    s->v2 = sp->v2;
    s->stages = sp->stages;
    s->grid = S / sp->patch;
    s->embed = sp->embed;
    int B = cfg->batch, E = sp->embed;
    int64_t pw[4] = {E, cfg->in_channels, sp->patch, sp->patch}, pb[1] = {E};
    s->pe_w = visc_table_add(&m->params, "patch_embed.proj.weight", 4, pw, 0);
    s->pe_b = visc_table_add(&m->params, "patch_embed.proj.bias", 1, pb, BIAS_FLAGS);
    s->pe_nw = visc_table_add(&m->params, "patch_embed.norm.weight", 1, pb, NORM_FLAGS);
    s->pe_nb = visc_table_add(&m->params, "patch_embed.norm.bias", 1, pb, NORM_FLAGS);
    (cfg->for_gpu ? visc_conv2d_init_shape : visc_conv2d_init)(&s->patch, B, cfg->in_channels, S, S,
                                                               E, sp->patch, sp->patch, sp->patch,
                                                               0, 1, 1, 1);
    int C = E, res = s->grid, site = 0, total = 0;
    for (int i = 0; i < sp->stages; i++) total += sp->depths[i];
    for (int i = 0; i < sp->stages; i++)
        if (build_stage(m, s, i, &C, &res, &site, total) != 0) {
            s->stages = i + 1; /* what destroy must free */
            swin_destroy(m);
            return NULL;
        }
    s->sites = site;
    s->features = C;
    s->last_tokens = res * res;
    int64_t nf[1] = {C}, fw[2] = {cfg->num_classes, C}, fb[1] = {cfg->num_classes};
    s->norm_w = visc_table_add(&m->params, "norm.weight", 1, nf, NORM_FLAGS);
    s->norm_b = visc_table_add(&m->params, "norm.bias", 1, nf, NORM_FLAGS);
    s->fc_w = visc_table_add(&m->params, "head.fc.weight", 2, fw, 0);
    s->fc_b = visc_table_add(&m->params, "head.fc.bias", 1, fb, BIAS_FLAGS);
    visc_table_alloc(&m->params);
    visc_table_alloc(&m->buffers);
    m->grads = visc_alloc_aligned(m->params.total * sizeof(float), "gradients");

    visc_arena plan;
    visc_arena_init(&plan, 0);
    plan_activations(m, s, &plan);
    visc_arena_init(&s->arena, cfg->for_gpu ? 0 : plan.used); /* model.h: for_gpu */
    plan_activations(m, s, &s->arena);
    m->activation_bytes = plan.used;
    set_attention(m, s);

    init_params(m, s, seed);
    m->num_bn = 0;
    m->bn_names = NULL;
    m->flops_per_image = model_flops(m, s);
    m->forward = swin_forward;
    m->backward = swin_backward;
    m->backward_features = swin_backward_features;
    m->logits = s->logits;
    m->features = s->pooled;
    m->feature_dim = s->features;
    m->to_cuda = swin_to_cuda;
    m->head_prefix = "head.fc.";
    return m;
}

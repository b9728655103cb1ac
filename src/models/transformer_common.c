/* transformer_common.c: linear, LayerNorm, MLP and patch-embedding glue for
 * the token models, plus timm's initialization. See transformer_common.h.
 * On a GPU (m->cuda) each goes to its twin in gpu.h. */
#include "transformer_common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dispatch.h"
#include "visc/gpu.h"
#include "visc/rng.h"
#include "visc/tokens.h"

#define P(idx) visc_model_param(m, (idx))
#define G(idx) visc_model_grad(m, (idx))

int visc_tf_add_param(visc_model *m, const char *prefix, const char *suffix, int ndim,
                      const int64_t *shape, unsigned flags) {
    char key[2 * VISC_MAX_NAME];
    if (prefix && *prefix) snprintf(key, sizeof key, "%s.%s", prefix, suffix);
    else snprintf(key, sizeof key, "%s", suffix);
    return visc_table_add(&m->params, key, ndim, shape, flags);
}

/* ---- linear ---- */

void visc_tf_add_linear(visc_model *m, visc_tf_linear *l, const char *name, int in, int out,
                        int has_bias) {
    int64_t ws[2] = {out, in}, bs[1] = {out};
    l->in = in;
    l->out = out;
    l->weight = visc_tf_add_param(m, name, "weight", 2, ws, 0);
    l->bias = has_bias ? visc_tf_add_param(m, name, "bias", 1, bs,
                                           VISC_TENSOR_NO_DECAY | VISC_TENSOR_BIAS)
                       : -1;
}

void visc_tf_linear_forward(visc_model *m, const visc_tf_linear *l, float *out, const float *in,
                            int64_t rows) {
    md_linear_forward(m, out, in, P(l->weight), l->bias >= 0 ? P(l->bias) : NULL, (int)rows, l->in,
                      l->out);
}

/* The layer's parameter gradients reported ready (the data-parallel buckets) */
static void linear_grads_ready(visc_model *m, const visc_tf_linear *l) {
    visc_model_grad_ready(m, G(l->weight), (size_t)l->in * l->out);
    if (l->bias >= 0) visc_model_grad_ready(m, G(l->bias), (size_t)l->out);
}

void visc_tf_linear_backward(visc_model *m, const visc_tf_linear *l, float *din, const float *dout,
                             const float *in, int64_t rows) {
    md_linear_backward(m, din, G(l->weight), l->bias >= 0 ? G(l->bias) : NULL, dout, in,
                       P(l->weight), (int)rows, l->in, l->out);
    linear_grads_ready(m, l);
}

void visc_tf_linear_operand_forward(visc_model *m, const visc_tf_linear *l, float *out,
                                    const float *in, int64_t rows) {
    md_linear_operand_forward(m, out, in, P(l->weight), l->bias >= 0 ? P(l->bias) : NULL, (int)rows,
                              l->in, l->out);
}

void visc_tf_linear_operand_backward(visc_model *m, const visc_tf_linear *l, float *din,
                                     const float *dout, const float *in, int64_t rows) {
    md_linear_operand_backward(m, din, G(l->weight), l->bias >= 0 ? G(l->bias) : NULL, dout, in,
                               P(l->weight), (int)rows, l->in, l->out);
    linear_grads_ready(m, l);
}

/* ---- LayerNorm ---- */

void visc_tf_add_norm(visc_model *m, visc_tf_norm *n, const char *name, int C, float eps) {
    int64_t s[1] = {C};
    n->C = C;
    n->eps = eps;
    n->weight = visc_tf_add_param(m, name, "weight", 1, s, VISC_TENSOR_NO_DECAY | VISC_TENSOR_NORM);
    n->bias = visc_tf_add_param(m, name, "bias", 1, s, VISC_TENSOR_NO_DECAY | VISC_TENSOR_NORM);
}

void visc_tf_norm_forward(visc_model *m, const visc_tf_norm *n, float *out, float *mean,
                          float *rstd, const float *in, int64_t rows) {
    md_layernorm_forward(m, out, mean, rstd, in, P(n->weight), P(n->bias), rows, n->C, n->eps);
}

void visc_tf_norm_operand_forward(visc_model *m, const visc_tf_norm *n, float *out, float *mean,
                                  float *rstd, const float *in, int64_t rows) {
    md_layernorm_operand_forward(m, out, mean, rstd, in, P(n->weight), P(n->bias), rows, n->C,
                                 n->eps);
}

void visc_tf_head_backward(visc_model *m, const visc_tf_linear *l, const float *dout,
                           const float *in, int64_t rows) {
    if (dout) {
        visc_tf_linear_backward(m, l, NULL, dout, in, rows);
        return;
    }
    visc_model_zero_grad(m, l->weight);
    if (l->bias >= 0) visc_model_zero_grad(m, l->bias);
    linear_grads_ready(m, l);
}

static void norm_grads_ready(visc_model *m, const visc_tf_norm *n) {
    visc_model_grad_ready(m, G(n->weight), (size_t)n->C);
    visc_model_grad_ready(m, G(n->bias), (size_t)n->C);
}

void visc_tf_norm_backward(visc_model *m, const visc_tf_norm *n, float *din, const float *dout,
                           const float *in, const float *mean, const float *rstd, int64_t rows) {
    md_layernorm_backward(m, din, G(n->weight), G(n->bias), dout, in, P(n->weight), mean, rstd,
                          rows, n->C);
    norm_grads_ready(m, n);
}

void visc_tf_norm_backward_add(visc_model *m, const visc_tf_norm *n, float *din, const float *dout,
                               const float *in, const float *mean, const float *rstd,
                               int64_t rows) {
    md_layernorm_backward_add(m, din, G(n->weight), G(n->bias), dout, in, P(n->weight), mean, rstd,
                              rows, n->C);
    norm_grads_ready(m, n);
}

/* ---- MLP ---- */

void visc_tf_add_mlp(visc_model *m, visc_tf_mlp *p, const char *name, int C, int hidden) {
    char key[VISC_MAX_NAME + 8];
    p->hidden = hidden;
    snprintf(key, sizeof key, "%s.fc1", name);
    visc_tf_add_linear(m, &p->fc1, key, C, hidden, 1);
    snprintf(key, sizeof key, "%s.fc2", name);
    visc_tf_add_linear(m, &p->fc2, key, hidden, C, 1);
}

/* fc1, then GELU and fc2 as one step (md_gelu_linear_*): under bf16 the
 * GELU writes fc2's bf16 operand straight into `scratch` (tokens.h); on a
 * GPU under bf16 fc1 writes h in bf16 too (the operand form). */
void visc_tf_mlp_forward(visc_model *m, const visc_tf_mlp *p, float *out, float *h, float *scratch,
                         const float *in, int64_t rows) {
    md_linear_operands_forward(m, h, in, P(p->fc1.weight), P(p->fc1.bias), (int)rows, p->fc1.in,
                               p->fc1.out);
    md_gelu_linear_forward(m, out, scratch, h, P(p->fc2.weight), P(p->fc2.bias), (int)rows,
                           p->hidden, p->fc2.out);
}

void visc_tf_mlp_backward(visc_model *m, const visc_tf_mlp *p, float *din, const float *dout,
                          const float *in, const float *h, float *scratch, float *dscratch,
                          int64_t rows) {
    /* fc2's input made again (scratch is shared by the blocks), as forward made it */
    md_gelu_linear_act(m, scratch, h, (int)rows, p->hidden, p->fc2.out, 1);
    md_mlp_backward(m, din, G(p->fc1.weight), G(p->fc1.bias), G(p->fc2.weight), G(p->fc2.bias),
                    dscratch, dout, in, h, scratch, P(p->fc1.weight), P(p->fc2.weight), (int)rows,
                    p->fc1.in, p->hidden, p->fc2.out);
    linear_grads_ready(m, &p->fc2);
    linear_grads_ready(m, &p->fc1);
}

double visc_tf_mlp_flops(const visc_tf_mlp *p, int64_t rows) {
    return 2.0 * (double)rows * (2.0 * p->fc1.in * p->hidden);
}

/* ---- patch embedding ---- */

void visc_tf_add_patch_embed(visc_model *m, visc_tf_patch_embed *p, const char *name, int batch,
                             int in_channels, int image, int patch, int C, int tokens, int first) {
    char key[VISC_MAX_NAME + 8];
    int64_t ws[4] = {C, in_channels, patch, patch}, bs[1] = {C};
    snprintf(key, sizeof key, "%s.proj", name);
    p->weight = visc_tf_add_param(m, key, "weight", 4, ws, 0);
    p->bias = visc_tf_add_param(m, key, "bias", 1, bs, VISC_TENSOR_NO_DECAY | VISC_TENSOR_BIAS);
    p->grid = image / patch;
    p->tokens = tokens;
    p->first = first;
    (m->cfg.for_gpu ? visc_conv2d_init_shape : visc_conv2d_init)(&p->conv, batch, in_channels,
                                                                 image, image, C, patch, patch,
                                                                 patch, 0, 1, 1, 1);
}

void visc_tf_patch_embed_forward(visc_model *m, visc_tf_patch_embed *p, float *tokens,
                                 float *conv_out, const float *image) {
    if (m->cuda) {
        visc_gpu_patch_embed_forward(m->cuda, &p->conv, tokens, conv_out, image, P(p->weight),
                                     P(p->bias), p->tokens, p->first);
        return;
    }
    visc_conv2d_forward(&p->conv, conv_out, image, P(p->weight), P(p->bias));
    /* [B, C, L] -> rows b * tokens + first + l */
    const int B = p->conv.N, C = p->conv.K, L = p->grid * p->grid;
#pragma omp parallel for collapse(2) if ((size_t)B * L * C > 65536)
    for (int b = 0; b < B; b++)
        for (int l = 0; l < L; l++) {
            float *dst = tokens + ((size_t)b * p->tokens + p->first + l) * C;
            const float *src = conv_out + (size_t)b * C * L + l;
            for (int c = 0; c < C; c++) dst[c] = src[(size_t)c * L];
        }
}

void visc_tf_patch_embed_backward(visc_model *m, visc_tf_patch_embed *p, float *dconv,
                                  const float *dtokens, const float *image) {
    if (m->cuda) {
        visc_gpu_patch_embed_backward(m->cuda, &p->conv, G(p->weight), G(p->bias), dconv, dtokens,
                                      image, p->tokens, p->first);
        return;
    }
    const int B = p->conv.N, C = p->conv.K, L = p->grid * p->grid;
#pragma omp parallel for collapse(2) if ((size_t)B * L * C > 65536)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            float *dst = dconv + ((size_t)b * C + c) * L;
            const float *src = dtokens + ((size_t)b * p->tokens + p->first) * C + c;
            for (int l = 0; l < L; l++) dst[l] = src[(size_t)l * C];
        }
    visc_conv2d_backward(&p->conv, NULL, G(p->weight), G(p->bias), dconv, image, P(p->weight));
}

void visc_tf_patch_embed_destroy(visc_tf_patch_embed *p) { visc_conv2d_destroy(&p->conv); }

/* ---- token rows ---- */

void visc_tf_gather_token(float *out, const float *x, int B, int tokens, int index, int C) {
    for (int b = 0; b < B; b++)
        memcpy(out + (size_t)b * C, x + ((size_t)b * tokens + index) * C,
               (size_t)C * sizeof(float));
}

void visc_tf_scatter_token(float *dx, const float *dtok, int B, int tokens, int index, int C) {
    memset(dx, 0, (size_t)B * tokens * C * sizeof(float));
    for (int b = 0; b < B; b++)
        memcpy(dx + ((size_t)b * tokens + index) * C, dtok + (size_t)b * C,
               (size_t)C * sizeof(float));
}

/* ---- initialization ---- */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* std * N(0, 1) for every element, counter-based: elements 4b .. 4b+3 come
 * from Philox block b of (seed, VISC_STREAM_INIT, tensor), two Box-Muller
 * pairs (cos and sin) in float on 24-bit uniforms. A pure function of (seed,
 * tensor, element), so the loop runs in parallel: ViT-Base's 86 M weights
 * start in about a second instead of the ~15 s of one visc_rng_normal (two
 * doubles, a Philox block, log and cos in double) per element. */
static void normal(float *w, size_t n, float std, const visc_rng *r) {
    const size_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t b = 0; b < blocks; b++) {
        uint32_t u[4];
        float z[4];
        visc_philox4x32(r->key, r->stream, b, u);
        for (int k = 0; k < 2; k++) {
            const float u1 = (float)((u[2 * k] >> 8) + 1) * (1.0f / 16777216.0f); /* (0, 1] */
            const float u2 = (float)(u[2 * k + 1] >> 8) * (1.0f / 16777216.0f);
            const float rad = std * sqrtf(-2.0f * logf(u1)), ang = 6.2831853f * u2;
            z[2 * k] = rad * cosf(ang);
            z[2 * k + 1] = rad * sinf(ang);
        }
        const size_t base = 4 * b, left = n - base < 4 ? n - base : 4;
        for (size_t k = 0; k < left; k++) w[base + k] = z[k];
    }
}

/* timm's trunc_normal_(std, a=-2, b=2): the bounds are absolute, so at
 * std .02 they lie 100 sigma away (a float Box-Muller reaches 5.8 sigma);
 * the clamp documents them and never acts. */
static void trunc_normal(float *w, size_t n, float std, const visc_rng *r) {
    normal(w, n, std, r);
    for (size_t j = 0; j < n; j++) w[j] = w[j] < -2.0f ? -2.0f : w[j] > 2.0f ? 2.0f : w[j];
}

static void uniform(float *w, size_t n, float bound, visc_rng *r) {
    for (size_t j = 0; j < n; j++) w[j] = bound * (2.0f * visc_rng_uniform(r) - 1.0f);
}

static void fill(float *w, size_t n, float v) {
    for (size_t j = 0; j < n; j++) w[j] = v;
}

void visc_tf_init_params(visc_model *m, uint64_t seed, float cls_std, float init_values) {
    const visc_table *t = &m->params;
    for (int i = 0; i < t->count; i++) {
        const visc_tensor_entry *e = &t->entries[i];
        float *w = visc_table_get(t, i);
        visc_rng r = visc_rng_make(seed, VISC_STREAM_INIT, (uint64_t)i);
        if (e->flags & VISC_TENSOR_NORM) {
            fill(w, e->numel, ends_with(e->name, ".weight") ? 1.0f : 0.0f);
        } else if (e->ndim == 4) {
            /* Conv2d default: kaiming_uniform_(a = sqrt 5) = U(+-1/sqrt(fan_in)) */
            double fan_in = (double)e->shape[1] * e->shape[2] * e->shape[3];
            uniform(w, e->numel, (float)(1.0 / sqrt(fan_in)), &r);
        } else if (ends_with(e->name, ".bias") && i > 0 && t->entries[i - 1].ndim == 4) {
            /* the conv's bias (added right after its weight): same bound */
            const int64_t *s = t->entries[i - 1].shape;
            uniform(w, e->numel, (float)(1.0 / sqrt((double)s[1] * s[2] * s[3])), &r);
        } else if (e->flags & VISC_TENSOR_BIAS) {
            fill(w, e->numel, 0.0f);
        } else if (e->ndim == 2 && ends_with(e->name, ".weight")) {
            trunc_normal(w, e->numel, 0.02f, &r);
        } else if (strcmp(e->name, "pos_embed") == 0 ||
                   ends_with(e->name, "relative_position_bias_table")) {
            trunc_normal(w, e->numel, 0.02f, &r);
        } else if (strcmp(e->name, "cls_token") == 0) {
            normal(w, e->numel, cls_std, &r);
        } else if (ends_with(e->name, ".gamma_1") || ends_with(e->name, ".gamma_2")) {
            fill(w, e->numel, init_values);
        } else {
            visc_die("transformer init: no rule for parameter '%s'", e->name);
        }
    }
}

float visc_tf_drop_path_rate(float rate, int i, int depth) {
    return depth > 1 ? rate * (float)i / (float)(depth - 1) : 0.0f;
}

/* ---- the top of a class-token model ---- */

int visc_tf_check_config(const visc_model_config *cfg, int S, int patch) {
    if (cfg->batch < 1 || cfg->num_classes < 1 || cfg->in_channels < 1)
        return visc_set_error("%s needs batch >= 1, classes >= 1 and channels >= 1 (got %d, %d, "
                              "%d)",
                              cfg->arch, cfg->batch, cfg->num_classes, cfg->in_channels);
    if (S < patch || S % patch != 0)
        return visc_set_error("%s: image size %d px is not a positive multiple of its patch size "
                              "%d",
                              cfg->arch, S, patch);
    if (!(cfg->drop_rate >= 0.0f && cfg->drop_rate < 1.0f) ||
        !(cfg->drop_path_rate >= 0.0f && cfg->drop_path_rate < 1.0f))
        return visc_set_error("%s: drop_rate and drop_path_rate must lie in [0, 1) (got %g, %g)",
                              cfg->arch, cfg->drop_rate, cfg->drop_path_rate);
    return 0;
}

void visc_tf_top_plan(visc_model *m, visc_tf_top *t, visc_arena *a, int C) {
    const size_t B = (size_t)m->cfg.batch;
    t->cls_mean = visc_arena_floats(a, B);
    t->cls_rstd = visc_arena_floats(a, B);
    t->feat = visc_arena_floats(a, B * C);
    t->feat_drop = visc_arena_floats(a, B * C);
    t->drop_mask = visc_arena_take(a, B * C);
    t->logits = visc_arena_floats(a, B * m->cfg.num_classes);
    t->dfeat = visc_arena_floats(a, B * C);
}

void visc_tf_top_make_arena(visc_model *m, visc_tf_top *t,
                            void (*plan)(visc_model *, visc_arena *)) {
    visc_arena count;
    visc_arena_init(&count, 0);
    plan(m, &count);
    visc_arena_init(&t->arena, m->cfg.for_gpu ? 0 : count.used); /* model.h: for_gpu */
    plan(m, &t->arena);
    m->activation_bytes = count.used;
    m->logits = t->logits;
    m->features = t->feat;
}

void visc_tf_top_forward(visc_model *m, visc_tf_top *t, const float *cls, int train) {
    const int B = m->cfg.batch, C = t->norm.C;
    visc_tf_norm_forward(m, &t->norm, t->feat, t->cls_mean, t->cls_rstd, cls, B);
    const float *feat = t->feat;
    t->head_dropped = train && m->cfg.drop_rate > 0.0f;
    if (t->head_dropped) {
        visc_dropout_forward(t->feat_drop, t->drop_mask, t->feat, (size_t)B * C, m->cfg.drop_rate,
                             m->noise_seed, visc_tf_noise_offset(VISC_TF_SITE_HEAD));
        feat = t->feat_drop;
    }
    visc_tf_linear_forward(m, &t->head, t->logits, feat, B);
    /* the host's copies: the loss, the accuracy and SSL heads read them */
    md_give_out(m, m->logits, &m->dev_logits, t->logits, (size_t)B * m->cfg.num_classes);
    md_give_out(m, m->features, &m->dev_features, t->feat, (size_t)B * C);
}

void visc_tf_top_backward(visc_model *m, visc_tf_top *t, const float *dlogits,
                          const float *dfeatures, float *dcls, const float *cls) {
    const int B = m->cfg.batch, C = t->norm.C;
    const float *feat = t->head_dropped ? t->feat_drop : t->feat;
    dlogits = md_from_host(m, t->dlogits, dlogits, (size_t)B * m->cfg.num_classes);
    if (dfeatures) {
        visc_tf_head_backward(m, &t->head, dlogits, feat, B);
        md_take_in(m, t->dfeat, dfeatures, (size_t)B * C);
    } else {
        visc_tf_linear_backward(m, &t->head, t->dfeat, dlogits, feat, B);
        if (t->head_dropped)
            visc_dropout_backward(t->dfeat, t->dfeat, t->drop_mask, (size_t)B * C,
                                  m->cfg.drop_rate);
    }
    visc_tf_norm_backward(m, &t->norm, dcls, t->dfeat, cls, t->cls_mean, t->cls_rstd, B);
}

int visc_tf_top_to_cuda(visc_model *m, visc_tf_top *t, void (*plan)(visc_model *, visc_arena *)) {
    if (m->cfg.drop_rate > 0.0f)
        return visc_set_error("--device cuda: --drop (the head dropout) is not on the GPU yet");
    if (visc_gpu_arena_move(m, &t->arena, plan, &t->dlogits)) return -1;
    t->keep_host = visc_alloc_aligned((size_t)m->cfg.batch * sizeof(float), "drop-path draws");
    return 0;
}

void visc_tf_top_destroy(visc_model *m, visc_tf_top *t) {
    visc_tf_patch_embed_destroy(&t->pe);
    visc_free_aligned(t->keep_host);
    md_free_storage(m, &t->arena, t->dlogits);
}

/* lamb.c: timm.optim.Lamb (timm/optim/lamb.py, bias correction and grad
 * averaging on) in fp32:
 *
 *   c = ||g|| over all tensors; g = g / (c / max_grad_norm) where c > max_grad_norm
 *   m = m * beta1 + (1 - beta1) * g
 *   v = v * beta2 + ((1 - beta2) * g) * g
 *   u = (m / (1 - beta1^t)) / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *   u = u + wd * p                               (if wd != 0)
 *   u = u * ||p|| / ||u||   per tensor where wd != 0 (or always_adapt),
 *                           1 where either norm is 0; <= 1 with trust_clip
 *   p = p - lr * u
 *
 * Three passes over blocks: the global gradient norm, the moments with the
 * per-tensor norms of p and u, then the update with u recomputed from the
 * stored moments (cheaper than a third buffer for u, and no allocation).
 * Unlike timm, which divides p.grad in place, the caller's gradients are
 * left as they were. */
#include "optim_internal.h"

typedef struct {
    float clip, beta1, beta3, beta2, one_minus_beta2, bc1, bc2_sqrt, eps;
} lamb_scalars;

/* The update before the trust ratio, for len <= VISC_OPT_SQRT_CHUNK floats:
 * u = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + wd * p. wd == 0 adds an
 * exact zero for finite p, so one formula serves both of timm's branches. */
static void lamb_update(float *restrict u, const float *restrict p, const float *restrict m,
                        const float *restrict v, size_t len, float wd, const lamb_scalars *s) {
    const lamb_scalars c = *s;
    for (size_t i = 0; i < len; i++) u[i] = v[i];
    visc_opt_sqrt(u, len);
    for (size_t i = 0; i < len; i++)
        u[i] = (m[i] / c.bc1) / (u[i] / c.bc2_sqrt + c.eps) + wd * p[i];
}

/* Moments of one block; with adapt, the sums of squares of u and p in sums[0..1]. */
static void lamb_moments(const float *restrict p, const float *restrict g, float *restrict m,
                         float *restrict v, size_t n, float wd, int adapt, const lamb_scalars *s,
                         double *sums) {
    const lamb_scalars c = *s;
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i] / c.clip;
        m[i] = m[i] * c.beta1 + c.beta3 * gi;
        v[i] = v[i] * c.beta2 + c.one_minus_beta2 * gi * gi;
    }
    double su = 0, sp = 0;
    if (adapt) {
        /* A second sweep while the block is in cache keeps both loops vectorizable. */
        float u[VISC_OPT_SQRT_CHUNK];
        for (size_t k = 0; k < n; k += VISC_OPT_SQRT_CHUNK) {
            const size_t len = n - k < VISC_OPT_SQRT_CHUNK ? n - k : VISC_OPT_SQRT_CHUNK;
            lamb_update(u, p + k, m + k, v + k, len, wd, s);
            const float *pk = p + k;
#pragma omp simd reduction(+ : su, sp)
            for (size_t i = 0; i < len; i++) {
                su += (double)u[i] * u[i];
                sp += (double)pk[i] * pk[i];
            }
        }
    }
    sums[0] = su;
    sums[1] = sp;
}

static void lamb_apply(float *restrict p, const float *restrict m, const float *restrict v,
                       size_t n, float wd, float ratio, float lr, const lamb_scalars *s) {
    float u[VISC_OPT_SQRT_CHUNK];
    for (size_t k = 0; k < n; k += VISC_OPT_SQRT_CHUNK) {
        const size_t len = n - k < VISC_OPT_SQRT_CHUNK ? n - k : VISC_OPT_SQRT_CHUNK;
        lamb_update(u, p + k, m + k, v + k, len, wd, s);
        float *restrict pk = p + k;
        for (size_t i = 0; i < len; i++) pk[i] = pk[i] - lr * (u[i] * ratio);
    }
}

void visc_lamb_step(visc_optimizer *o, float *params, const float *grads, float lr) {
    const visc_opt_config *cfg = &o->cfg;
    const int nb = o->num_blocks;
    double *sums = o->block_sums;

    /* timm clips by the global norm of the raw gradients before anything else. */
    float clip = 1.0f;
    if (cfg->max_grad_norm > 0.0f) {
#pragma omp parallel for schedule(static) if (o->params->total >= VISC_OPT_PARALLEL_MIN)
        for (int b = 0; b < nb; b++)
            sums[2 * b] =
                visc_sum_squares(grads + o->blocks[b].begin, o->blocks[b].end - o->blocks[b].begin);
        double total = 0;
        for (int b = 0; b < nb; b++) total += sums[2 * b];
        float norm = (float)sqrt(total);
        if (norm > cfg->max_grad_norm) clip = norm / cfg->max_grad_norm;
    }

    const double t = (double)(o->step + 1);
    const lamb_scalars s = {
        .clip = clip,
        .beta1 = cfg->beta1,
        .beta3 = (float)(1.0 - (double)cfg->beta1),
        .beta2 = cfg->beta2,
        .one_minus_beta2 = (float)(1.0 - (double)cfg->beta2),
        .bc1 = (float)(1.0 - pow((double)cfg->beta1, t)),
        .bc2_sqrt = (float)sqrt(1.0 - pow((double)cfg->beta2, t)),
        .eps = cfg->eps,
    };
    float *m = o->state, *v = o->state + o->params->total;
#pragma omp parallel for schedule(static) if (o->params->total >= VISC_OPT_PARALLEL_MIN)
    for (int b = 0; b < nb; b++) {
        const visc_opt_block *k = &o->blocks[b];
        lamb_moments(params + k->begin, grads + k->begin, m + k->begin, v + k->begin,
                     k->end - k->begin, o->entry_decay[k->entry], visc_opt_adapts(o, k->entry), &s,
                     sums + 2 * b);
    }

    /* Per-tensor trust ratios from the block partials, in block order. */
    for (int b = 0; b < nb;) {
        const int e = o->blocks[b].entry;
        double su = 0, sp = 0;
        for (; b < nb && o->blocks[b].entry == e; b++) {
            su += sums[2 * b];
            sp += sums[2 * b + 1];
        }
        float ratio = 1.0f;
        if (visc_opt_adapts(o, e)) {
            const float w_norm = (float)sqrt(sp), u_norm = (float)sqrt(su);
            if (w_norm > 0.0f && u_norm > 0.0f) ratio = w_norm / u_norm;
            if (cfg->trust_clip && ratio > 1.0f) ratio = 1.0f;
        }
        o->entry_ratio[e] = ratio;
    }

#pragma omp parallel for schedule(static) if (o->params->total >= VISC_OPT_PARALLEL_MIN)
    for (int b = 0; b < nb; b++) {
        const visc_opt_block *k = &o->blocks[b];
        lamb_apply(params + k->begin, m + k->begin, v + k->begin, k->end - k->begin,
                   o->entry_decay[k->entry], o->entry_ratio[k->entry], lr, &s);
    }
}

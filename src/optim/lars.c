/* lars.c: timm.optim.Lars (timm/optim/lars.py, dampening 0) in fp32:
 *
 *   where wd != 0 (or always_adapt), per tensor:
 *     r = trust_coef * ||p|| / (||g|| + ||p|| * wd + eps), 1 where either norm is 0
 *     (trust_clip: r = min(r / lr, 1))
 *     g = (g + wd * p) * r
 *   then SGD with momentum and Nesterov as sgd.c: p = p - lr * d.
 *
 * Two passes over blocks: the per-tensor norms of p and g, then the update. */
#include <math.h>

#include "optim_internal.h"

void visc_lars_step(visc_optimizer *o, float *params, const float *grads, float lr) {
    const visc_opt_config *cfg = &o->cfg;
    const int nb = o->num_blocks;
    double *sums = o->block_sums;

#pragma omp parallel for schedule(static) if (o->params->total >= VISC_OPT_PARALLEL_MIN)
    for (int b = 0; b < nb; b++) {
        const visc_opt_block *k = &o->blocks[b];
        const size_t n = k->end - k->begin;
        const int adapt = visc_opt_adapts(o, k->entry);
        sums[2 * b] = adapt ? visc_sum_squares(params + k->begin, n) : 0.0;
        sums[2 * b + 1] = adapt ? visc_sum_squares(grads + k->begin, n) : 0.0;
    }

    for (int b = 0; b < nb;) {
        const int e = o->blocks[b].entry;
        double sp = 0, sg = 0;
        for (; b < nb && o->blocks[b].entry == e; b++) {
            sp += sums[2 * b];
            sg += sums[2 * b + 1];
        }
        float ratio = 1.0f;
        if (visc_opt_adapts(o, e)) {
            const float w_norm = (float)sqrt(sp), g_norm = (float)sqrt(sg), wd = o->entry_decay[e];
            if (w_norm > 0.0f && g_norm > 0.0f)
                ratio = cfg->trust_coef * w_norm / (g_norm + w_norm * wd + cfg->eps);
            if (cfg->trust_clip) {
                ratio = ratio / lr;
                if (ratio > 1.0f) ratio = 1.0f;
            }
        }
        o->entry_ratio[e] = ratio;
    }

#pragma omp parallel for schedule(static) if (o->params->total >= VISC_OPT_PARALLEL_MIN)
    for (int b = 0; b < nb; b++) {
        const visc_opt_block *k = &o->blocks[b];
        visc_sgd_args a = {o->entry_decay[k->entry],
                           o->entry_ratio[k->entry],
                           cfg->momentum,
                           lr,
                           cfg->nesterov,
                           o->step == 0};
        visc_sgd_apply(params + k->begin, grads + k->begin, o->state + k->begin, k->end - k->begin,
                       &a);
    }
}

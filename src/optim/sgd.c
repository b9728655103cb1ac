/* sgd.c: torch.optim.SGD with dampening 0.
 *
 *   d = g + wd * p                  (coupled weight decay)
 *   buf = d (first step) | momentum * buf + d
 *   d = d + momentum * buf (Nesterov) | buf
 *   p = p - lr * d
 *
 * The loop body is also LARS's, with d scaled by the trust ratio first. */
#include "optim_internal.h"

void visc_sgd_apply(float *restrict p, const float *restrict g, float *restrict buf, size_t n,
                    const visc_sgd_args *a) {
    /* Branch-free on purpose, so each loop is one straight vector loop:
     * wd == 0 adds 0 * p and scale 1 multiplies by one, both exact for finite
     * values; the first step's buf = d is 0 * buf + d on the zeroed state;
     * Nesterov's d + momentum * buf and plain buf are 1 * d + momentum * buf
     * and 0 * d + 1 * buf. */
    const float wd = a->weight_decay, scale = a->scale, lr = a->lr;
    if (a->momentum == 0.0f) {
        for (size_t i = 0; i < n; i++) p[i] = p[i] - lr * ((g[i] + wd * p[i]) * scale);
        return;
    }
    const float keep = a->first ? 0.0f : a->momentum;
    const float take_d = a->nesterov ? 1.0f : 0.0f, take_b = a->nesterov ? a->momentum : 1.0f;
    for (size_t i = 0; i < n; i++) {
        const float d = (g[i] + wd * p[i]) * scale;
        const float b = keep * buf[i] + d;
        buf[i] = b;
        p[i] = p[i] - lr * (take_d * d + take_b * b);
    }
}

void visc_sgd_step(visc_optimizer *o, float *params, const float *grads, float lr) {
#pragma omp parallel for schedule(static) if (o->params->total >= VISC_OPT_PARALLEL_MIN)
    for (int b = 0; b < o->num_blocks; b++) {
        const visc_opt_block *k = &o->blocks[b];
        visc_sgd_args a = {o->entry_decay[k->entry], 1.0f,        o->cfg.momentum, lr,
                           o->cfg.nesterov,          o->step == 0};
        visc_sgd_apply(params + k->begin, grads + k->begin, o->state + k->begin, k->end - k->begin,
                       &a);
    }
}

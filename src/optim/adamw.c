/* adamw.c: torch.optim.AdamW as torch 1.13 computes it (fp32 tensors,
 * Python-double scalars rounded to float where they meet a tensor):
 *
 *   p = p * (1 - lr * wd)                       (decoupled decay)
 *   m = m * beta1 + (1 - beta1) * g
 *   v = v * beta2 + ((1 - beta2) * g) * g       (addcmul's order)
 *   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
 *   p = p + (-lr / (1 - beta1^t) * m) / denom   (addcdiv's order)
 *
 * One pass, 7 floats of memory traffic per parameter: this is the step
 * whose speed is the bandwidth of the machine. */
#include <math.h>

#include "optim_internal.h"

typedef struct {
    float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step;
} adamw_scalars;

__attribute__((target_clones("arch=x86-64-v3", "default"))) static void
adamw_block(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
            size_t n, const adamw_scalars *s) {
    const adamw_scalars c = *s;
    float root[VISC_OPT_SQRT_CHUNK];
    for (size_t k = 0; k < n; k += VISC_OPT_SQRT_CHUNK) {
        const size_t len = n - k < VISC_OPT_SQRT_CHUNK ? n - k : VISC_OPT_SQRT_CHUNK;
        float *restrict pk = p + k, *restrict mk = m + k, *restrict vk = v + k;
        const float *restrict gk = g + k;
        for (size_t i = 0; i < len; i++) {
            const float mi = mk[i] * c.beta1 + c.one_minus_beta1 * gk[i];
            const float vi = vk[i] * c.beta2 + c.one_minus_beta2 * gk[i] * gk[i];
            mk[i] = mi;
            vk[i] = vi;
            root[i] = vi;
        }
        visc_opt_sqrt(root, len);
        for (size_t i = 0; i < len; i++)
            pk[i] = pk[i] * c.decay + c.neg_step * mk[i] / (root[i] / c.bc2_sqrt + c.eps);
    }
}

void visc_adamw_step(visc_optimizer *o, float *params, const float *grads, float lr) {
    const visc_opt_config *cfg = &o->cfg;
    const double t = (double)(o->step + 1);
    const double bc1 = 1.0 - pow((double)cfg->beta1, t), bc2 = 1.0 - pow((double)cfg->beta2, t);
    adamw_scalars s = {
        .beta1 = cfg->beta1,
        .one_minus_beta1 = (float)(1.0 - (double)cfg->beta1),
        .beta2 = cfg->beta2,
        .one_minus_beta2 = (float)(1.0 - (double)cfg->beta2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = cfg->eps,
        .neg_step = (float)(-((double)lr / bc1)),
    };
    float *m = o->state, *v = o->state + o->params->total;
#pragma omp parallel for schedule(static) if (o->params->total >= VISC_OPT_PARALLEL_MIN)
    for (int b = 0; b < o->num_blocks; b++) {
        const visc_opt_block *k = &o->blocks[b];
        adamw_scalars sb = s;
        sb.decay = (float)(1.0 - (double)lr * (double)o->entry_decay[k->entry]);
        adamw_block(params + k->begin, grads + k->begin, m + k->begin, v + k->begin,
                    k->end - k->begin, &sb);
    }
}

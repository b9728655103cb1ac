/* optimizer.c: config defaults and names, the state layout and work split,
 * and dispatch to the update rules (sgd.c, adamw.c, lamb.c, lars.c). */
#include <stdlib.h>
#include <string.h>

#include "optim_internal.h"

visc_opt_config visc_opt_defaults(visc_opt_kind kind) {
    visc_opt_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.beta1 = 0.9f;
    c.beta2 = 0.999f;
    c.eps = 1e-8f;
    c.trust_coef = 0.001f;
    c.max_grad_norm = 1.0f;
    switch (kind) {
    case VISC_OPT_SGD: c.momentum = 0.9f; break;
    case VISC_OPT_ADAMW: c.weight_decay = 0.01f; break;
    case VISC_OPT_LAMB:
        c.weight_decay = 0.01f;
        c.eps = 1e-6f;
        break;
    case VISC_OPT_LARS: c.momentum = 0.9f; break;
    }
    return c;
}

static const char *const kind_names[] = {"sgd", "adamw", "lamb", "lars"};

int visc_opt_parse_kind(const char *name, visc_opt_kind *kind) {
    for (int i = 0; i < 4; i++)
        if (strcmp(name, kind_names[i]) == 0) {
            *kind = (visc_opt_kind)i;
            return 0;
        }
    return visc_set_error("unknown optimizer '%s' (expected sgd, adamw, lamb or lars)", name);
}

const char *visc_opt_kind_name(visc_opt_kind kind) {
    return (unsigned)kind < 4 ? kind_names[kind] : "?";
}

int visc_optimizer_state_slots(visc_opt_kind kind) {
    /* SGD/LARS: momentum buffer; AdamW/LAMB: first and second moments. */
    return kind == VISC_OPT_ADAMW || kind == VISC_OPT_LAMB ? 2 : 1;
}

int visc_opt_adapts(const visc_optimizer *o, int entry) {
    return o->entry_decay[entry] != 0.0f || o->cfg.always_adapt;
}

void visc_optimizer_init(visc_optimizer *o, const visc_opt_config *cfg, const visc_table *params) {
    VISC_ASSERT((unsigned)cfg->kind < 4);
    memset(o, 0, sizeof *o);
    o->cfg = *cfg;
    o->params = params;
    o->slots = visc_optimizer_state_slots(cfg->kind);
    o->state =
        visc_alloc_aligned((size_t)o->slots * params->total * sizeof(float), "optimizer state");

    int n = 0;
    for (int e = 0; e < params->count; e++)
        n += (int)((params->entries[e].numel + VISC_OPT_BLOCK_FLOATS - 1) / VISC_OPT_BLOCK_FLOATS);
    o->blocks = visc_calloc((size_t)n + 1, sizeof *o->blocks, "optimizer blocks");
    o->block_sums = visc_calloc(2 * (size_t)n + 2, sizeof *o->block_sums, "optimizer block sums");
    o->entry_decay = visc_calloc((size_t)params->count + 1, sizeof(float), "optimizer decay");
    o->entry_ratio = visc_calloc((size_t)params->count + 1, sizeof(float), "optimizer ratios");
    for (int e = 0; e < params->count; e++) {
        const visc_tensor_entry *t = &params->entries[e];
        for (size_t b = 0; b < t->numel; b += VISC_OPT_BLOCK_FLOATS) {
            visc_opt_block *k = &o->blocks[o->num_blocks++];
            k->entry = e;
            k->begin = t->offset + b;
            k->end = t->offset +
                     (t->numel - b > VISC_OPT_BLOCK_FLOATS ? b + VISC_OPT_BLOCK_FLOATS : t->numel);
        }
        int excluded = !cfg->decay_norm_and_bias && (t->flags & VISC_TENSOR_NO_DECAY);
        o->entry_decay[e] = excluded ? 0.0f : cfg->weight_decay;
        o->entry_ratio[e] = 1.0f;
    }
}

void visc_optimizer_step(visc_optimizer *o, float *params, const float *grads, float lr) {
    switch (o->cfg.kind) {
    case VISC_OPT_SGD: visc_sgd_step(o, params, grads, lr); break;
    case VISC_OPT_ADAMW: visc_adamw_step(o, params, grads, lr); break;
    case VISC_OPT_LAMB: visc_lamb_step(o, params, grads, lr); break;
    case VISC_OPT_LARS: visc_lars_step(o, params, grads, lr); break;
    }
    o->step++;
}

void visc_optimizer_free(visc_optimizer *o) {
    visc_free_aligned(o->state);
    free(o->blocks);
    free(o->block_sums);
    free(o->entry_decay);
    free(o->entry_ratio);
    memset(o, 0, sizeof *o);
}

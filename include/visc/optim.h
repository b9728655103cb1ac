/* optim.h: optimizers, learning-rate schedules, EMA and clipping over flat buffers.
 *
 * optimizer.c  SGD (momentum, Nesterov), AdamW, LAMB, LARS: PyTorch's /
 *              timm's update rules, one pass over the parameter table
 * schedule.c   LR as a pure function of the global step
 * ema.c        exponential moving average of weights
 * clip.c       gradient clipping by global norm
 *
 * State is flat: `state` holds `visc_optimizer_state_slots(kind)` buffers of
 * params->total floats each (momentum, then second moment), laid out like
 * the parameters, so checkpoints and all-reduce treat it as one array. */
#ifndef VISC_OPTIM_H
#define VISC_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

typedef enum { VISC_OPT_SGD, VISC_OPT_ADAMW, VISC_OPT_LAMB, VISC_OPT_LARS } visc_opt_kind;

typedef struct {
    visc_opt_kind kind;
    float momentum;       /* SGD/LARS momentum (PyTorch's dampening = 0) */
    int nesterov;         /* SGD/LARS */
    float weight_decay;
    float beta1, beta2, eps; /* AdamW / LAMB */
    float trust_coef;     /* LARS eta (0.001 by default) */
    int decay_norm_and_bias; /* 0: parameters flagged VISC_TENSOR_NO_DECAY get no weight decay
                              * (and, for LARS/LAMB, no trust-ratio scaling, as timm) */
} visc_opt_config;

/* Sensible defaults per kind (PyTorch's and timm's). */
visc_opt_config visc_opt_defaults(visc_opt_kind kind);
int visc_opt_parse_kind(const char *name, visc_opt_kind *kind); /* "sgd", "adamw", "lamb", "lars" */
const char *visc_opt_kind_name(visc_opt_kind kind);

typedef struct {
    visc_opt_config cfg;
    const visc_table *params; /* layout and flags; values are passed to step */
    float *state;             /* slots x params->total floats */
    int slots;
    int64_t step;             /* completed steps (Adam bias correction) */
} visc_optimizer;

int visc_optimizer_state_slots(visc_opt_kind kind);
void visc_optimizer_init(visc_optimizer *o, const visc_opt_config *cfg, const visc_table *params);
/* One update of params (laid out as o->params) from grads at learning rate lr. */
void visc_optimizer_step(visc_optimizer *o, float *params, const float *grads, float lr);
void visc_optimizer_free(visc_optimizer *o);

/* ---- schedule.c ---- */
typedef enum {
    VISC_SCHED_CONSTANT,
    VISC_SCHED_STEP,      /* lr * gamma^(floor(step / step_size)) */
    VISC_SCHED_MULTISTEP, /* lr * gamma^(number of milestones passed) */
    VISC_SCHED_COSINE,    /* min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2, per step */
    VISC_SCHED_ONECYCLE,  /* linear up to lr over warmup, then linear down to min_lr */
} visc_sched_kind;

#define VISC_MAX_MILESTONES 16
typedef struct {
    visc_sched_kind kind;
    float base_lr, min_lr;
    int64_t total_steps;
    int64_t warmup_steps;  /* linear warmup from warmup_start * base_lr (all kinds) */
    float warmup_start;
    int64_t step_size;     /* STEP */
    float gamma;           /* STEP, MULTISTEP */
    int64_t milestones[VISC_MAX_MILESTONES];
    int num_milestones;
} visc_schedule;

int visc_sched_parse_kind(const char *name, visc_sched_kind *kind); /* "constant", "step", "multistep", "cosine", "onecycle" */
float visc_schedule_lr(const visc_schedule *s, int64_t step);

/* ---- ema.c ---- */
/* ema = decay * ema + (1 - decay) * params, over n floats. */
void visc_ema_update(float *ema, const float *params, size_t n, float decay);

/* ---- clip.c ---- */
float visc_global_norm(const float *grads, size_t n);
/* Scales grads so their global L2 norm is at most max_norm (torch's
 * clip_grad_norm_, eps 1e-6); returns the norm before clipping. */
float visc_clip_grad_norm(float *grads, size_t n, float max_norm);

#endif

/* optim.h: optimizers, learning-rate schedules, EMA and clipping over flat buffers.
 *
 * optimizer.c  config defaults, names, state layout, the work split, dispatch
 * sgd.c        torch.optim.SGD (momentum, Nesterov, coupled weight decay)
 * adamw.c      torch.optim.AdamW (torch 1.13's formula order)
 * lamb.c       timm.optim.Lamb (global grad clipping, trust ratio)
 * lars.c       timm.optim.Lars (trust ratio, then SGD momentum)
 * schedule.c   LR as a pure function of the global step
 * ema.c        exponential moving average of weights
 * clip.c       gradient clipping by global norm
 *
 * State is flat: `state` holds `visc_optimizer_state_slots(kind)` buffers of
 * params->total floats each (momentum, then second moment), laid out like
 * the parameters, so checkpoints and all-reduce treat it as one array.
 *
 * Every step is one or two OpenMP passes over the table cut into blocks that
 * never straddle two tensors. Per-tensor norms (LAMB, LARS) and LAMB's global
 * gradient norm are summed in double per block and then block by block in a
 * fixed order, so a step gives the same bits whatever the thread count.
 * A step allocates nothing; init does. */
#ifndef VISC_OPTIM_H
#define VISC_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

typedef enum { VISC_OPT_SGD, VISC_OPT_ADAMW, VISC_OPT_LAMB, VISC_OPT_LARS } visc_opt_kind;

typedef struct {
    visc_opt_kind kind;
    float momentum;          /* SGD/LARS momentum (PyTorch's dampening = 0); 0: none */
    int nesterov;            /* SGD/LARS */
    float weight_decay;      /* SGD/LARS: coupled (g += wd * p); AdamW: decoupled
                              * (p *= 1 - lr * wd); LAMB: added to the update */
    float beta1, beta2, eps; /* AdamW / LAMB; eps is also LARS's trust-ratio eps */
    float trust_coef;        /* LARS eta (0.001 by default) */
    int decay_norm_and_bias; /* 0: parameters flagged VISC_TENSOR_NO_DECAY get no weight decay
                              * (and, for LARS/LAMB, no trust-ratio scaling, as timm) */
    float max_grad_norm;     /* LAMB: gradients are divided by ||g|| / max_grad_norm over all
                              * tensors when ||g|| exceeds it (timm's default 1.0); <= 0: off */
    int always_adapt; /* LAMB/LARS: trust ratio also where weight decay is 0 (timm, default 0) */
    int trust_clip;   /* LAMB: trust ratio <= 1; LARS: ratio / lr <= 1 (LAMBC/LARC, default 0) */
} visc_opt_config;

/* Defaults per kind: the constructors' defaults of torch.optim.SGD/AdamW and
 * timm's Lamb/Lars, except momentum 0.9 for SGD and LARS (torch and timm say
 * 0, i.e. no momentum at all; 0.9 is what every recipe sets). Weight decay:
 * SGD 0, AdamW 0.01, LAMB 0.01, LARS 0. decay_norm_and_bias 0 (timm's
 * filter_bias_and_bn). eps: AdamW 1e-8, LAMB 1e-6, LARS 1e-8. */
visc_opt_config visc_opt_defaults(visc_opt_kind kind);
int visc_opt_parse_kind(const char *name, visc_opt_kind *kind); /* "sgd", "adamw", "lamb", "lars" */
const char *visc_opt_kind_name(visc_opt_kind kind);

typedef struct visc_opt_block visc_opt_block; /* one piece of the work split (optim internal) */

typedef struct {
    visc_opt_config cfg;
    const visc_table *params; /* layout and flags; values are passed to step */
    float *state;             /* slots x params->total floats */
    int slots;
    int64_t step; /* completed steps (Adam bias correction, first momentum step) */
    /* Built by init so that a step allocates nothing. */
    visc_opt_block *blocks; /* the table cut into pieces of <= 16384 floats, in order */
    int num_blocks;
    double *block_sums; /* 2 partial sums of squares per block */
    float *entry_decay; /* per entry: the weight decay it gets */
    float *entry_ratio; /* per entry: this step's trust ratio (LAMB/LARS) */
} visc_optimizer;

int visc_optimizer_state_slots(visc_opt_kind kind);
void visc_optimizer_init(visc_optimizer *o, const visc_opt_config *cfg, const visc_table *params);
/* One update of params (laid out as o->params) from grads at learning rate lr. */
void visc_optimizer_step(visc_optimizer *o, float *params, const float *grads, float lr);
void visc_optimizer_free(visc_optimizer *o);

/* ---- schedule.c ---- */
/* The lr at a global step (0-based: the lr of the step's update). Steps
 * before warmup_steps ramp linearly from warmup_start * base_lr to base_lr
 * (torch's LinearLR); the schedule below then runs on t = step - warmup_steps
 * over T = total_steps - warmup_steps steps, as torch's SequentialLR does.
 * COSINE and ONECYCLE stay at min_lr for t >= T. */
typedef enum {
    VISC_SCHED_CONSTANT,
    VISC_SCHED_STEP,      /* lr * gamma^(floor(t / step_size)) */
    VISC_SCHED_MULTISTEP, /* lr * gamma^(number of milestones <= t) */
    VISC_SCHED_COSINE,    /* min_lr + (lr - min_lr) * (1 + cos(pi * t / T)) / 2 */
    VISC_SCHED_ONECYCLE,  /* linear up to lr over warmup, then linear down to min_lr at T */
} visc_sched_kind;

#define VISC_MAX_MILESTONES 16
typedef struct {
    visc_sched_kind kind;
    float base_lr, min_lr;
    int64_t total_steps;
    int64_t warmup_steps; /* linear warmup from warmup_start * base_lr (all kinds) */
    float warmup_start;
    int64_t step_size;                       /* STEP */
    float gamma;                             /* STEP, MULTISTEP */
    int64_t milestones[VISC_MAX_MILESTONES]; /* MULTISTEP, counted in t like the rest */
    int num_milestones;
} visc_schedule;

int visc_sched_parse_kind(
    const char *name,
    visc_sched_kind *kind); /* "constant", "step", "multistep", "cosine", "onecycle" */
const char *visc_sched_kind_name(visc_sched_kind kind);
float visc_schedule_lr(const visc_schedule *s, int64_t step);

/* ---- ema.c ---- */
/* ema = decay * ema + (1 - decay) * params, over n floats (timm's ModelEmaV2). */
void visc_ema_update(float *ema, const float *params, size_t n, float decay);

/* ---- clip.c ---- */
/* L2 norm of n floats, summed in double in a fixed order (thread-count independent). */
float visc_global_norm(const float *grads, size_t n);
/* Scales grads so their global L2 norm is at most max_norm (torch's
 * clip_grad_norm_, eps 1e-6); returns the norm before clipping. */
float visc_clip_grad_norm(float *grads, size_t n, float max_norm);
/* Sum of squares of n floats in double (vectorized; used by clip and the optimizers). */
double visc_sum_squares(const float *x, size_t n);

#endif

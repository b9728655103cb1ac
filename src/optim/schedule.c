/* schedule.c: the learning rate as a pure function of the global step, so a
 * resumed run needs no scheduler state. Closed forms of torch's LinearLR
 * warmup followed (SequentialLR-style, the clock restarting at the end of
 * warmup) by StepLR, MultiStepLR, CosineAnnealingLR or a linear decay;
 * computed in double, rounded once. */
#include <math.h>
#include <string.h>

#include "visc/optim.h"

static const char *const sched_names[] = {"constant", "step", "multistep", "cosine", "onecycle"};

int visc_sched_parse_kind(const char *name, visc_sched_kind *kind) {
    for (int i = 0; i < 5; i++)
        if (strcmp(name, sched_names[i]) == 0) {
            *kind = (visc_sched_kind)i;
            return 0;
        }
    return visc_set_error(
        "unknown lr schedule '%s' (expected constant, step, multistep, cosine or onecycle)", name);
}

const char *visc_sched_kind_name(visc_sched_kind kind) {
    return (unsigned)kind < 5 ? sched_names[kind] : "?";
}

float visc_schedule_lr(const visc_schedule *s, int64_t step) {
    const double base = s->base_lr, min = s->min_lr;
    if (step < 0) step = 0;
    if (step < s->warmup_steps) {
        const double start = s->warmup_start;
        return (float)(base * (start + (1.0 - start) * (double)step / (double)s->warmup_steps));
    }
    const int64_t w = s->warmup_steps > 0 ? s->warmup_steps : 0;
    const int64_t t = step - w, T = s->total_steps - w;
    switch (s->kind) {
    case VISC_SCHED_CONSTANT: return (float)base;
    case VISC_SCHED_STEP:
        if (s->step_size <= 0) return (float)base;
        return (float)(base * pow((double)s->gamma, (double)(t / s->step_size)));
    case VISC_SCHED_MULTISTEP: {
        int passed = 0;
        for (int i = 0; i < s->num_milestones && i < VISC_MAX_MILESTONES; i++)
            passed += s->milestones[i] <= t;
        return (float)(base * pow((double)s->gamma, (double)passed));
    }
    case VISC_SCHED_COSINE:
        if (t >= T) return (float)min;
        return (float)(min + (base - min) * (1.0 + cos(M_PI * (double)t / (double)T)) / 2.0);
    case VISC_SCHED_ONECYCLE:
        if (t >= T) return (float)min;
        return (float)(base + (min - base) * (double)t / (double)T);
    }
    return (float)base;
}

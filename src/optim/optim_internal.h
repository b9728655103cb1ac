/* optim_internal.h: what the optimizer files share and nothing outside optim sees.
 *
 * The work split: init cuts the parameter table into blocks of at most
 * VISC_OPT_BLOCK_FLOATS floats, each inside one tensor, in table order. A
 * step is `#pragma omp parallel for` over blocks, so big and small tensors
 * balance across threads and per-tensor sums come out of per-block partials
 * added in a fixed order (bitwise independent of the thread count). */
#ifndef VISC_OPTIM_INTERNAL_H
#define VISC_OPTIM_INTERNAL_H

#include <math.h>

#include "visc/optim.h"

#define VISC_OPT_BLOCK_FLOATS 16384
/* Below this many floats a step runs on one thread: waking a team costs more. */
#define VISC_OPT_PARALLEL_MIN 32768

/* Square roots in place, in chunks of VISC_OPT_SQRT_CHUNK. Under
 * -fmath-errno (the default) neither GCC nor Clang vectorizes a loop that
 * calls sqrtf, and the scalar square root and divide make AdamW compute-bound
 * instead of memory-bound. So the rules stage their square roots through a
 * small buffer: plain C loops around this one helper, which uses SSE's
 * correctly rounded sqrtps (identical results to sqrtf) where it exists. */
#define VISC_OPT_SQRT_CHUNK 256
#if defined(__SSE__)
#include <xmmintrin.h>
static inline void visc_opt_sqrt(float *x, size_t n) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
    for (; i < n; i++) x[i] = sqrtf(x[i]);
}
#else
static inline void visc_opt_sqrt(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = sqrtf(x[i]);
}
#endif

struct visc_opt_block {
    int entry;         /* index into the table */
    size_t begin, end; /* float offsets into the flat buffers */
};

/* One rule each, in its own file; `lr` as given to visc_optimizer_step, and
 * o->step still counts the steps completed before this one. */
void visc_sgd_step(visc_optimizer *o, float *params, const float *grads, float lr);
void visc_adamw_step(visc_optimizer *o, float *params, const float *grads, float lr);
void visc_lamb_step(visc_optimizer *o, float *params, const float *grads, float lr);
void visc_lars_step(visc_optimizer *o, float *params, const float *grads, float lr);

/* The SGD update of n floats, shared with LARS: d = (g + wd * p) * scale,
 * then torch's momentum buffer (buf = d on the first step, else
 * momentum * buf + d; none if momentum is 0), Nesterov, and p -= lr * d. */
typedef struct {
    float weight_decay, scale, momentum, lr;
    int nesterov, first;
} visc_sgd_args;
void visc_sgd_apply(float *params, const float *grads, float *buf, size_t n,
                    const visc_sgd_args *a);

/* Whether an entry gets a trust ratio under LAMB/LARS: timm adapts where the
 * group's weight decay is non-zero, or everywhere with always_adapt. */
int visc_opt_adapts(const visc_optimizer *o, int entry);

#endif

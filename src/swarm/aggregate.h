/* aggregate.h: checking what a peer sent, and averaging within a group.
 *
 * Every received part is validated before it counts: finite values, |x| at
 * most max_abs, weight in (0, max_weight]. The mean is weighted; the robust
 * modes bound how far one hostile peer can move the result:
 *   trimmed mean   per coordinate, drop the `trim` largest and `trim`
 *                  smallest values (weights ignored), mean of the rest;
 *                  with fewer than 2*trim+1 peers it is the median
 *   centered clip  start at the coordinate-wise median v; iterate
 *                  v += sum_i w_i * clip(x_i - v, tau) / sum_i w_i, where
 *                  clip scales a difference vector to norm at most tau */
#ifndef VISC_SWARM_AGGREGATE_H
#define VISC_SWARM_AGGREGATE_H

#include <stddef.h>

#include "visc/swarm.h"

typedef struct {
    visc_aggregation mode;
    int trim;          /* trimmed mean: per side (default 1) */
    float clip_tau;    /* centered clip radius (default 1.0) */
    int clip_iters;    /* default 3 */
    float max_abs;     /* validation: largest |value| accepted (default 1e6) */
    double max_weight; /* validation: largest weight accepted (default 1e9) */
} visc_aggregate_config;

void visc_aggregate_config_default(visc_aggregate_config *c);
/* 0 when all n values are finite and within max_abs and the weight is in
 * range; -1 with the first offending index and value otherwise. */
int visc_validate_part(const visc_aggregate_config *c, const float *x, size_t n, double weight);
/* The same without a weight (a result, which carries none). */
int visc_validate_values(const visc_aggregate_config *c, const float *x, size_t n);
/* out = aggregate of m parts of n values (parts[i], weights[i]); out may
 * alias none of the parts, which must have passed visc_validate_part (a
 * NaN would spread). The weighted mean is the exact one computed in double,
 * rounded once to float. 0, or -1 with an error (m outside 1..1024, a
 * weight not positive and finite, a negative trim, clip tau <= 0). */
int visc_aggregate(const visc_aggregate_config *c, const float *const *parts, const double *weights,
                   int m, size_t n, float *out);

#endif

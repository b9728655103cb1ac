/* ema.c: exponential moving average of weights, timm's ModelEmaV2:
 * ema = decay * ema + (1 - decay) * p, with 1 - decay formed in double as
 * Python does, then rounded to float. */
#include "visc/optim.h"

void visc_ema_update(float *ema, const float *params, size_t n, float decay) {
    const float keep = decay, take = (float)(1.0 - (double)decay);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) ema[i] = keep * ema[i] + take * params[i];
}

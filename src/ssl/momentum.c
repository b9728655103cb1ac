/* momentum.c: the schedule of the key encoder's momentum. The update is
 * visc_ema_update (optim.h) over the parameters only: BatchNorm running
 * statistics are not averaged, the key encoder keeps its own (as the
 * reference library does). */
#include <math.h>

#include "visc/ssl.h"

float visc_momentum_at(float m0, int cosine, int64_t step, int64_t total) {
    if (!cosine || total <= 1) return m0;
    const double pi = 3.14159265358979323846;
    double c = (cos(pi * (double)step / (double)(total - 1)) + 1.0) / 2.0;
    return (float)(1.0 - (1.0 - m0) * c);
}

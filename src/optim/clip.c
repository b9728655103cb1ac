/* clip.c: the global gradient norm and torch.nn.utils.clip_grad_norm_.
 *
 * The norm is summed in double: over 25M fp32 squares a float sum would lose
 * digits. The sum is cut into a fixed number of chunks that depends on n
 * only, and the chunk sums are added in order, so the result does not depend
 * on the thread count (bit-exact reruns and resumes). */
#include <math.h>

#include "visc/optim.h"

double visc_sum_squares(const float *x, size_t n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

#define NORM_CHUNKS 256

float visc_global_norm(const float *grads, size_t n) {
    double part[NORM_CHUNKS];
    const size_t chunk = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int c = 0; c < NORM_CHUNKS; c++) {
        size_t begin = (size_t)c * chunk, end = begin + chunk;
        if (begin > n) begin = n;
        if (end > n) end = n;
        part[c] = visc_sum_squares(grads + begin, end - begin);
    }
    double total = 0;
    for (int c = 0; c < NORM_CHUNKS; c++) total += part[c];
    return (float)sqrt(total);
}

float visc_clip_grad_norm(float *grads, size_t n, float max_norm) {
    const float norm = visc_global_norm(grads, n);
    /* torch: max_norm / (total_norm + 1e-6) in fp32, clamped to 1. */
    const float coef = max_norm / (norm + 1e-6f);
    if (coef < 1.0f) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) grads[i] *= coef;
    }
    return norm;
}

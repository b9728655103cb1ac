/* global_pool.c: global average pooling [N, C, HW] -> [N, C] and its backward. */
#include "visc/nn.h"

void visc_global_avgpool_forward(float *out, const float *in, int N, int C, int HW) {
    VISC_ASSERT(HW > 0);
    const float inv = 1.0f / (float)HW;
#pragma omp parallel for if ((size_t)N * C * HW > 32768)
    for (int nc = 0; nc < N * C; nc++) {
        const float *p = in + (size_t)nc * HW;
        float s = 0.0f;
        for (int i = 0; i < HW; i++) s += p[i];
        out[nc] = s * inv;
    }
}

void visc_global_avgpool_backward(float *din, const float *dout, int N, int C, int HW) {
    VISC_ASSERT(HW > 0);
    const float inv = 1.0f / (float)HW;
#pragma omp parallel for if ((size_t)N * C * HW > 32768)
    for (int nc = 0; nc < N * C; nc++) {
        float g = dout[nc] * inv;
        float *p = din + (size_t)nc * HW;
        for (int i = 0; i < HW; i++) p[i] = g;
    }
}

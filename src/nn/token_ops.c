/* token_ops.c: the two small token-axis operations of a ViT.
 *
 *   add_broadcast  x[b] += table for every sequence b (absolute position
 *                  embedding); its gradient is the sum over b.
 *   token_mean     mean over the N tokens (global average pooling of
 *                  tokens, timm's global_pool='avg'). */
#include "visc/core.h"
#include "visc/tokens.h"

void visc_add_broadcast_forward(float *x, const float *table, int B, int64_t NC) {
    VISC_ASSERT(B >= 0 && NC >= 0);
#pragma omp parallel for if ((int64_t)B * NC > 32768)
    for (int b = 0; b < B; b++) {
        float *xb = x + (int64_t)b * NC;
        for (int64_t i = 0; i < NC; i++) xb[i] += table[i];
    }
}

/* Threads split the table; each element sums over b in order (deterministic). */
void visc_add_broadcast_backward(float *dtable, const float *dx, int B, int64_t NC) {
    VISC_ASSERT(B >= 0 && NC >= 0);
    const int64_t chunk = 256, nchunks = (NC + chunk - 1) / chunk;
#pragma omp parallel for if ((int64_t)B * NC > 32768)
    for (int64_t k = 0; k < nchunks; k++) {
        const int64_t i0 = k * chunk, i1 = i0 + chunk < NC ? i0 + chunk : NC;
        for (int64_t i = i0; i < i1; i++) dtable[i] = 0.0f;
        for (int b = 0; b < B; b++) {
            const float *g = dx + (int64_t)b * NC;
            for (int64_t i = i0; i < i1; i++) dtable[i] += g[i];
        }
    }
}

void visc_token_mean_forward(float *out, const float *in, int B, int N, int C) {
    VISC_ASSERT(B >= 0 && N > 0 && C > 0);
    const float inv = 1.0f / (float)N;
#pragma omp parallel for if ((int64_t)B * N * C > 32768)
    for (int b = 0; b < B; b++) {
        float *o = out + (int64_t)b * C;
        const float *x = in + (int64_t)b * N * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) o[c] += x[(int64_t)n * C + c];
        for (int c = 0; c < C; c++) o[c] *= inv;
    }
}

void visc_token_mean_backward(float *din, const float *dout, int B, int N, int C) {
    VISC_ASSERT(B >= 0 && N > 0 && C > 0);
    const float inv = 1.0f / (float)N;
#pragma omp parallel for if ((int64_t)B * N * C > 32768)
    for (int b = 0; b < B; b++) {
        const float *g = dout + (int64_t)b * C;
        float *d = din + (int64_t)b * N * C;
        for (int n = 0; n < N; n++)
            for (int c = 0; c < C; c++) d[(int64_t)n * C + c] = g[c] * inv;
    }
}

/* talking_heads.c: CaiT's talking-heads attention, step by step (see
 * talking_heads.h); the loops are cait.c's. */
#include "talking_heads.h"

#include <math.h>
#include <stdint.h>

static const float *q_row(const float *qkv, const visc_th_dims *d, int b, int i, int h) {
    return qkv + ((size_t)b * d->T + i) * 3 * d->C + (size_t)h * d->D;
}

void visc_th_scores(float *S, const float *qkv, const visc_th_dims *d) {
    const int B = d->B, H = d->H, T = d->T, D = d->D, C = d->C;
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                const float *q = q_row(qkv, d, b, i, h);
                float *row = S + (((size_t)b * H + h) * T + i) * T;
                for (int j = 0; j < T; j++) {
                    const float *k = q_row(qkv, d, b, j, h) + C;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int e = 0; e < D; e++) s += q[e] * k[e];
                    row[j] = d->scale * s;
                }
            }
}

void visc_th_mix(float *out, const float *in, const float *W, const float *bias, int B, int H,
                 size_t TT, int transpose) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int f = 0; f < H; f++) {
            float *o = out + ((size_t)b * H + f) * TT;
            const float b0 = bias ? bias[f] : 0.0f;
            for (size_t t = 0; t < TT; t++) o[t] = b0;
            for (int g = 0; g < H; g++) {
                const float w = transpose ? W[g * H + f] : W[f * H + g];
                const float *x = in + ((size_t)b * H + g) * TT;
                for (size_t t = 0; t < TT; t++) o[t] += w * x[t];
            }
        }
}

void visc_th_softmax(float *P, size_t rows, int T) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        float *row = P + r * T, mx = row[0], sum = 0.0f;
        for (int j = 1; j < T; j++) mx = row[j] > mx ? row[j] : mx;
        for (int j = 0; j < T; j++) sum += row[j] = expf(row[j] - mx);
        const float inv = 1.0f / sum;
        for (int j = 0; j < T; j++) row[j] *= inv;
    }
}

void visc_th_apply(float *att, const float *A, const float *qkv, const visc_th_dims *d) {
    const int B = d->B, H = d->H, T = d->T, D = d->D, C = d->C;
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int f = 0; f < H; f++)
            for (int i = 0; i < T; i++) {
                float *o = att + ((size_t)b * T + i) * C + (size_t)f * D;
                const float *a = A + (((size_t)b * H + f) * T + i) * T;
                for (int e = 0; e < D; e++) o[e] = 0.0f;
                for (int j = 0; j < T; j++) {
                    const float *v = q_row(qkv, d, b, j, f) + 2 * C, w = a[j];
                    for (int e = 0; e < D; e++) o[e] += w * v[e];
                }
            }
}

void visc_th_grad_a(float *dA, const float *datt, const float *qkv, const visc_th_dims *d) {
    const int B = d->B, H = d->H, T = d->T, D = d->D, C = d->C;
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int f = 0; f < H; f++)
            for (int i = 0; i < T; i++) {
                const float *g = datt + ((size_t)b * T + i) * C + (size_t)f * D;
                float *row = dA + (((size_t)b * H + f) * T + i) * T;
                for (int j = 0; j < T; j++) {
                    const float *v = q_row(qkv, d, b, j, f) + 2 * C;
                    float s = 0.0f;
#pragma omp simd reduction(+ : s)
                    for (int e = 0; e < D; e++) s += g[e] * v[e];
                    row[j] = s;
                }
            }
}

void visc_th_grad_v(float *dqkv, const float *A, const float *datt, const visc_th_dims *d) {
    const int B = d->B, H = d->H, T = d->T, D = d->D, C = d->C;
    const size_t TT = (size_t)T * T;
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int f = 0; f < H; f++)
            for (int j = 0; j < T; j++) {
                float *o = dqkv + ((size_t)b * T + j) * 3 * C + 2 * C + (size_t)f * D;
                const float *a = A + ((size_t)b * H + f) * TT + j;
                for (int e = 0; e < D; e++) o[e] = 0.0f;
                for (int i = 0; i < T; i++) {
                    const float *g = datt + ((size_t)b * T + i) * C + (size_t)f * D;
                    const float w = a[(size_t)i * T];
                    for (int e = 0; e < D; e++) o[e] += w * g[e];
                }
            }
}

void visc_th_mix_grad(float *dW, float *db, const float *dY, const float *X, int B, int H,
                      size_t TT) {
#pragma omp parallel for schedule(static)
    for (int fg = 0; fg < H * H + H; fg++) {
        const int f = fg < H * H ? fg / H : fg - H * H, g = fg < H * H ? fg % H : -1;
        double s = 0.0;
        for (int b = 0; b < B; b++) {
            const float *y = dY + ((size_t)b * H + f) * TT;
            if (g >= 0) {
                const float *x = X + ((size_t)b * H + g) * TT;
#pragma omp simd reduction(+ : s)
                for (size_t t = 0; t < TT; t++) s += (double)y[t] * x[t];
            } else {
#pragma omp simd reduction(+ : s)
                for (size_t t = 0; t < TT; t++) s += y[t];
            }
        }
        if (g >= 0) dW[f * H + g] = (float)s;
        else db[f] = (float)s;
    }
}

void visc_th_softmax_backward(float *dS, const float *P, size_t rows, int T) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        float *g = dS + r * T;
        const float *p = P + r * T;
        float dot = 0.0f;
        for (int j = 0; j < T; j++) dot += p[j] * g[j];
        for (int j = 0; j < T; j++) g[j] = p[j] * (g[j] - dot);
    }
}

void visc_th_grad_qk(float *dqkv, const float *dS, const float *qkv, const visc_th_dims *d) {
    const int B = d->B, H = d->H, T = d->T, D = d->D, C = d->C;
    const size_t TT = (size_t)T * T;
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                float *oq = dqkv + ((size_t)b * T + i) * 3 * C + (size_t)h * D;
                float *ok = oq + C;
                const float *row = dS + (((size_t)b * H + h) * T + i) * T;
                const float *col = dS + ((size_t)b * H + h) * TT + i;
                for (int e = 0; e < D; e++) oq[e] = ok[e] = 0.0f;
                for (int j = 0; j < T; j++) {
                    const float *k = q_row(qkv, d, b, j, h) + C, *q = q_row(qkv, d, b, j, h);
                    const float wq = d->scale * row[j], wk = d->scale * col[(size_t)j * T];
                    for (int e = 0; e < D; e++) {
                        oq[e] += wq * k[e];
                        ok[e] += wk * q[e];
                    }
                }
            }
}

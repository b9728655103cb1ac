/* layerscale.c: per-channel scaling of a residual branch, out = in * gamma
 * (CaiT, DeiT III; timm's LayerScale with inplace=False).
 *
 * dgamma is a column sum over all rows: each thread owns a block of 16
 * columns and walks the rows in order, so the sum is the same for every
 * thread count. */
#include "visc/core.h"
#include "visc/tokens.h"

#define COL_BLOCK 16

void visc_layerscale_forward(float *out, const float *in, const float *gamma, int64_t rows, int C) {
    VISC_ASSERT(rows >= 0 && C > 0);
#pragma omp parallel for if (rows * C > 32768)
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < C; c++) out[r * C + c] = in[r * C + c] * gamma[c];
}

void visc_layerscale_backward(float *din, float *dgamma, const float *dout, const float *in,
                              const float *gamma, int64_t rows, int C) {
    VISC_ASSERT(rows >= 0 && C > 0);
    if (dgamma) {
        const int nblocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for if (rows * C > 32768)
        for (int blk = 0; blk < nblocks; blk++) {
            const int c0 = blk * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
            float s[COL_BLOCK] = {0};
            for (int64_t r = 0; r < rows; r++)
                for (int c = c0; c < c1; c++) s[c - c0] += dout[r * C + c] * in[r * C + c];
            for (int c = c0; c < c1; c++) dgamma[c] = s[c - c0];
        }
    }
    /* After dgamma: din may alias dout. */
    if (din) visc_layerscale_forward(din, dout, gamma, rows, C);
}

/* swin_window.cuh: the index map of Swin's window partition on the device
 * (src/models/swin_window.c's token_of), for swin_window.cu's copies and
 * the layer norm that writes its rows straight to windowed order. */
#ifndef VISC_CUDA_SWIN_WINDOW_CUH
#define VISC_CUDA_SWIN_WINDOW_CUH

#include "common.cuh"

/* Token-order row of windowed row r (rows of all B images): windowed row
 * ((b * nH + i) * nW + j) * N + p * ww + q holds the token at grid position
 * ((i * wh + p + sh) mod H, (j * ww + q + sw) mod W) of image b. */
__device__ __forceinline__ int64_t visc_swin_token_row(const visc_cuda_swin_grid &g, int64_t r) {
    const int64_t HW = (int64_t)g.H * g.W, b = r / HW, in_image = r % HW;
    const int N = g.wh * g.ww, nwc = g.W / g.ww;
    const int64_t win = in_image / N;
    const int t = (int)(in_image % N);
    const int i = (int)(win / nwc), j = (int)(win % nwc);
    const int p = t / g.ww, q = t % g.ww;
    const int y = (i * g.wh + p + g.sh) % g.H, x = (j * g.ww + q + g.sw) % g.W;
    return b * HW + (int64_t)y * g.W + x;
}

/* 0 when g is a grid the map can take (whole windows, shifts in range). */
int visc_swin_grid_check(const visc_cuda_swin_grid *g, int B, int C);

#endif

/* swin_window.cu: Swin's window partition and its reverse with the cyclic
 * shift, the GPU twin of src/models/swin_window.c and the same index map:
 * windowed row ((b * nH + i) * nW + j) * N + p * ww + q holds the token at
 * grid position ((i * wh + p + sh) mod H, (j * ww + q + sw) mod W), which is
 * torch.roll(x, -shift) followed by window_partition. One thread per float,
 * consecutive threads along C, so reads and writes are both coalesced. */
#include "common.cuh"

/* Token-order row of windowed row r within one image. */
__device__ __forceinline__ int64_t token_of(visc_cuda_swin_grid g, int64_t r) {
    const int N = g.wh * g.ww, nwc = g.W / g.ww;
    const int64_t win = r / N, t = r % N;
    const int i = (int)(win / nwc), j = (int)(win % nwc);
    const int p = (int)(t / g.ww), q = (int)(t % g.ww);
    const int y = (i * g.wh + p + g.sh) % g.H, x = (j * g.ww + q + g.sw) % g.W;
    return (int64_t)y * g.W + x;
}

/* reverse = 0: out[windowed] <- in[token]; 1: out[token] <- in[windowed]. */
__global__ void swin_permute_kernel(float *out, const float *in, visc_cuda_swin_grid g,
                                    int64_t rows, int C, int reverse) {
    const int64_t HW = (int64_t)g.H * g.W, total = rows * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / C, c = i % C;
        const int64_t tok = (r / HW) * HW + token_of(g, r % HW);
        if (reverse) out[tok * C + c] = in[i];
        else out[i] = in[tok * C + c];
    }
}

static int swin_permute(visc_cuda *ctx, float *out, const float *in, const visc_cuda_swin_grid *g,
                        int B, int C, int reverse) {
    /* A negative extent or shift would make the kernel's modulo negative
     * and its index point outside the tensor, so the grid is checked whole. */
    if (B < 0 || C <= 0 || g->H < 1 || g->W < 1 || g->wh < 1 || g->ww < 1 || g->H % g->wh ||
        g->W % g->ww || g->sh < 0 || g->sw < 0)
        return visc_set_error("swin windows: bad grid %dx%d / %dx%d shifted %d,%d, B %d, C %d",
                              g->H, g->W, g->wh, g->ww, g->sh, g->sw, B, C);
    const int64_t rows = (int64_t)B * g->H * g->W;
    if (rows == 0) return 0;
    swin_permute_kernel<<<visc_cuda_blocks((size_t)rows * C, 256), 256, 0, ctx->stream>>>(out, in,
                                                                                          *g, rows,
                                                                                          C,
                                                                                          reverse);
    return visc_cuda_launched(reverse ? "swin window reverse" : "swin window partition");
}

int visc_cuda_swin_partition(visc_cuda *ctx, float *out, const float *in,
                             const visc_cuda_swin_grid *g, int B, int C) {
    return swin_permute(ctx, out, in, g, B, C, 0);
}

int visc_cuda_swin_reverse(visc_cuda *ctx, float *out, const float *in,
                           const visc_cuda_swin_grid *g, int B, int C) {
    return swin_permute(ctx, out, in, g, B, C, 1);
}

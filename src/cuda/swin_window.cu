/* swin_window.cu: Swin's window partition and its reverse with the cyclic
 * shift, the GPU twin of src/models/swin_window.c and the same index map:
 * windowed row ((b * nH + i) * nW + j) * N + p * ww + q holds the token at
 * grid position ((i * wh + p + sh) mod H, (j * ww + q + sw) mod W), which is
 * torch.roll(x, -shift) followed by window_partition. One thread per float,
 * consecutive threads along C, so reads and writes are both coalesced.
 * Swin V2 partitions into the qkv projection's operand (bf16 under bf16,
 * no fp32 copy between) and adds its gradient back in the reverse. */
#include "swin_window.cuh"

/* What a pass of the map does with each float. */
enum swin_permute_mode {
    PARTITION,      /* out[windowed] <- in[token] */
    PARTITION_BF16, /* the same, out bf16 (each value rounded once) */
    REVERSE,        /* out[token] <- in[windowed] */
    REVERSE_ADD     /* out[token] += in[windowed] */
};

__global__ void swin_permute_kernel(void *out, const float *in, visc_cuda_swin_grid g, int64_t rows,
                                    int C, swin_permute_mode mode) {
    const int64_t total = rows * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / C, c = i % C, tok = visc_swin_token_row(g, r) * C + c;
        float *o = (float *)out;
        switch (mode) {
        case PARTITION: o[i] = in[tok]; break;
        case PARTITION_BF16: ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(in[tok]); break;
        case REVERSE: o[tok] = in[i]; break;
        case REVERSE_ADD: o[tok] += in[i]; break;
        }
    }
}

int visc_swin_grid_check(const visc_cuda_swin_grid *g, int B, int C) {
    /* A negative extent or shift would make the map's modulo negative and
     * its index point outside the tensor, so the grid is checked whole. */
    if (B < 0 || C <= 0 || g->H < 1 || g->W < 1 || g->wh < 1 || g->ww < 1 || g->H % g->wh ||
        g->W % g->ww || g->sh < 0 || g->sw < 0)
        return visc_set_error("swin windows: bad grid %dx%d / %dx%d shifted %d,%d, B %d, C %d",
                              g->H, g->W, g->wh, g->ww, g->sh, g->sw, B, C);
    return 0;
}

static int swin_permute(visc_cuda *ctx, void *out, const float *in, const visc_cuda_swin_grid *g,
                        int B, int C, swin_permute_mode mode) {
    if (visc_swin_grid_check(g, B, C)) return -1;
    const int64_t rows = (int64_t)B * g->H * g->W;
    if (rows == 0) return 0;
    swin_permute_kernel<<<visc_cuda_blocks((size_t)rows * C, 256), 256, 0, ctx->stream>>>(
        out, in, *g, rows, C, mode);
    return visc_cuda_launched(mode == PARTITION || mode == PARTITION_BF16 ? "swin window partition"
                                                                          : "swin window reverse");
}

int visc_cuda_swin_partition(visc_cuda *ctx, float *out, const float *in,
                             const visc_cuda_swin_grid *g, int B, int C) {
    return swin_permute(ctx, out, in, g, B, C, PARTITION);
}

int visc_cuda_swin_partition_operand(visc_cuda *ctx, float *out, const float *in,
                                     const visc_cuda_swin_grid *g, int B, int C) {
    return swin_permute(ctx, out, in, g, B, C, ctx->bf16 ? PARTITION_BF16 : PARTITION);
}

int visc_cuda_swin_reverse(visc_cuda *ctx, float *out, const float *in,
                           const visc_cuda_swin_grid *g, int B, int C) {
    return swin_permute(ctx, out, in, g, B, C, REVERSE);
}

int visc_cuda_swin_reverse_add(visc_cuda *ctx, float *acc, const float *in,
                               const visc_cuda_swin_grid *g, int B, int C) {
    return swin_permute(ctx, acc, in, g, B, C, REVERSE_ADD);
}

/* out[token] = x[token] + keep_b in[windowed] with the CPU's roundings
 * (nn/droppath.c: a 1 adds, a 0 keeps x, else the product is rounded
 * before the sum); all_kept: every factor 1, and keep [B] set so. */
__global__ void droppath_add_from_windows_kernel(float *out, const float *x, const float *in,
                                                 float *keep, int all_kept,
                                                 visc_cuda_swin_grid g, int64_t rows, int C,
                                                 int B) {
    const int64_t total = rows * C, HW = (int64_t)g.H * g.W;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / C, tok = visc_swin_token_row(g, r) * C + i % C;
        if (all_kept && i < B) keep[i] = 1.0f;
        const float k = all_kept ? 1.0f : keep[r / HW];
        out[tok] = k == 1.0f   ? x[tok] + in[i]
                   : k != 0.0f ? __fadd_rn(x[tok], __fmul_rn(k, in[i]))
                               : x[tok];
    }
}

int visc_cuda_droppath_add_from_windows(visc_cuda *ctx, float *out, const float *x,
                                        const float *branch, float *keep, int all_kept,
                                        const visc_cuda_swin_grid *g, int B, int C) {
    if (visc_swin_grid_check(g, B, C)) return -1;
    const int64_t rows = (int64_t)B * g->H * g->W;
    if (rows == 0) return 0;
    droppath_add_from_windows_kernel<<<visc_cuda_blocks((size_t)rows * C, 256), 256, 0,
                                       ctx->stream>>>(out, x, branch, keep, all_kept, *g, rows, C,
                                                      B);
    return visc_cuda_launched("drop-path add from windows");
}

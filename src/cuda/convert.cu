/* convert.cu: fp32 <-> bf16, round to nearest even, as visc_f32_to_bf16
 * (src/nn/linear_bf16.h) and the hardware's cvt.rn.bf16.f32 do. A NaN
 * stays a NaN (its payload may differ from the CPU's). */
#include <cuda_bf16.h>

#include "common.cuh"

__global__ void to_bf16_kernel(__nv_bfloat16 *out, const float *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void to_f32_kernel(float *out, const __nv_bfloat16 *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

int visc_cuda_f32_to_bf16(visc_cuda *ctx, uint16_t *out, const float *in, size_t n) {
    if (n == 0) return 0;
    to_bf16_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>((__nv_bfloat16 *)out, in, n);
    return visc_cuda_launched("fp32 to bf16");
}

int visc_cuda_bf16_to_f32(visc_cuda *ctx, float *out, const uint16_t *in, size_t n) {
    if (n == 0) return 0;
    to_f32_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, (const __nv_bfloat16 *)in,
                                                                     n);
    return visc_cuda_launched("bf16 to fp32");
}

/* Layout changes with the conversion, per image n: [C, HW] <-> [HW, C],
 * through a 32 x 33 shared tile so that both the reads and the writes are
 * coalesced. Block (x, y, n): HW columns x*32.., channels y*32.. */
#define TILE 32

__global__ void nchw_to_nhwc_bf16_kernel(__nv_bfloat16 *out, const float *in, int C, int HW) {
    __shared__ float tile[TILE][TILE + 1];
    const size_t base = (size_t)blockIdx.z * C * HW;
    const int hw0 = blockIdx.x * TILE, c0 = blockIdx.y * TILE;
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int c = c0 + j, hw = hw0 + threadIdx.x;
        if (c < C && hw < HW) tile[j][threadIdx.x] = in[base + (size_t)c * HW + hw];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int hw = hw0 + j, c = c0 + threadIdx.x;
        if (c < C && hw < HW)
            out[base + (size_t)hw * C + c] = __float2bfloat16_rn(tile[threadIdx.x][j]);
    }
}

__global__ void nhwc_bf16_to_nchw_kernel(float *out, const __nv_bfloat16 *in, int C, int HW,
                                         float beta) {
    __shared__ float tile[TILE][TILE + 1];
    const size_t base = (size_t)blockIdx.z * C * HW;
    const int hw0 = blockIdx.x * TILE, c0 = blockIdx.y * TILE;
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int hw = hw0 + j, c = c0 + threadIdx.x;
        if (c < C && hw < HW)
            tile[j][threadIdx.x] = __bfloat162float(in[base + (size_t)hw * C + c]);
    }
    __syncthreads();
    for (int j = threadIdx.y; j < TILE; j += blockDim.y) {
        const int c = c0 + j, hw = hw0 + threadIdx.x;
        if (c < C && hw < HW) {
            float *o = out + base + (size_t)c * HW + hw;
            const float v = tile[threadIdx.x][j];
            /* beta 0: the old value is not read; no FMA, so that the sum
             * rounds as the CPU's beta * old + v does */
            *o = beta == 0.0f ? v : __fadd_rn(__fmul_rn(beta, *o), v);
        }
    }
}

static int layout_check(int N, int C, int HW) {
    if (N <= 0 || C <= 0 || HW <= 0 || N > 65535)
        return visc_set_error("layout change: bad shape %d x %d x %d", N, C, HW);
    return 0;
}

int visc_cuda_nchw_to_nhwc_bf16(visc_cuda *ctx, uint16_t *out, const float *in, int N, int C,
                                int HW) {
    if (layout_check(N, C, HW)) return -1;
    const dim3 grid((HW + TILE - 1) / TILE, (C + TILE - 1) / TILE, N), block(TILE, 8);
    nchw_to_nhwc_bf16_kernel<<<grid, block, 0, ctx->stream>>>((__nv_bfloat16 *)out, in, C, HW);
    return visc_cuda_launched("NCHW fp32 to NHWC bf16");
}

int visc_cuda_nhwc_bf16_to_nchw(visc_cuda *ctx, float *out, const uint16_t *in, int N, int C,
                                int HW, float beta) {
    if (layout_check(N, C, HW)) return -1;
    const dim3 grid((HW + TILE - 1) / TILE, (C + TILE - 1) / TILE, N), block(TILE, 8);
    nhwc_bf16_to_nchw_kernel<<<grid, block, 0, ctx->stream>>>(out, (const __nv_bfloat16 *)in, C, HW,
                                                              beta);
    return visc_cuda_launched("NHWC bf16 to NCHW fp32");
}

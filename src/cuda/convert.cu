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

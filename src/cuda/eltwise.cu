/* eltwise.cu: the elementwise glue of a model's step on the GPU: sums
 * (residual connections, gradient paths that join), the residual sum with
 * its ReLU (also on bf16 tensors, with ReLU's backward), zeroing and
 * device-to-device copies. Each element is one fp32
 * addition, as on the CPU (src/nn/eltwise.c, the ResNet block's add_relu),
 * so the results are the CPU's bits. */
#include <cuda_bf16.h>

#include "common.cuh"

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ void add_relu_kernel(float *out, const float *identity, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = out[i] + identity[i];
        out[i] = v > 0.0f ? v : 0.0f; /* a NaN sum gives 0, as the CPU's loop */
    }
}

int visc_cuda_add(visc_cuda *ctx, float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return 0;
    add_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, a, b, n);
    return visc_cuda_launched("add");
}

int visc_cuda_add_relu(visc_cuda *ctx, float *out, const float *identity, size_t n) {
    if (n == 0) return 0;
    add_relu_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, identity, n);
    return visc_cuda_launched("add + relu");
}

/* ---- bf16 tensors (a ResNet's activations under --precision bf16):
 * each sum in fp32, rounded once to bf16 ---- */

__global__ void add_bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *a,
                                const __nv_bfloat16 *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

__global__ void add_relu_bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *identity, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float v = __bfloat162float(out[i]) + __bfloat162float(identity[i]);
        out[i] = __float2bfloat16_rn(v > 0.0f ? v : 0.0f);
    }
}

__global__ void relu_backward_bf16_kernel(__nv_bfloat16 *din, const __nv_bfloat16 *dout,
                                          const __nv_bfloat16 *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const __nv_bfloat16 g = dout[i];
        din[i] = __bfloat162float(out[i]) > 0.0f ? g : __float2bfloat16_rn(0.0f);
    }
}

int visc_cuda_add_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *a, const uint16_t *b,
                       size_t n) {
    if (n == 0) return 0;
    add_bf16_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        (__nv_bfloat16 *)out, (const __nv_bfloat16 *)a, (const __nv_bfloat16 *)b, n);
    return visc_cuda_launched("add (bf16)");
}

int visc_cuda_add_relu_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *identity, size_t n) {
    if (n == 0) return 0;
    add_relu_bf16_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        (__nv_bfloat16 *)out, (const __nv_bfloat16 *)identity, n);
    return visc_cuda_launched("add + relu (bf16)");
}

int visc_cuda_relu_backward_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *dout,
                                 const uint16_t *out, size_t n) {
    if (n == 0) return 0;
    relu_backward_bf16_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        (__nv_bfloat16 *)din, (const __nv_bfloat16 *)dout, (const __nv_bfloat16 *)out, n);
    return visc_cuda_launched("relu backward (bf16)");
}

int visc_cuda_zero(visc_cuda *ctx, void *p, size_t bytes) {
    if (bytes == 0) return 0;
    return visc_cuda_check(cudaMemsetAsync(p, 0, bytes, ctx->stream), "zeroing device memory");
}

int visc_cuda_copy(visc_cuda *ctx, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return 0;
    return visc_cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream),
                           "copy on the device");
}

/* eltwise.cu: the elementwise glue of a model's step on the GPU: sums
 * (residual connections, gradient paths that join), the residual sum with
 * its ReLU, zeroing and device-to-device copies. Each element is one fp32
 * addition, as on the CPU (src/nn/eltwise.c, the ResNet block's add_relu),
 * so the results are the CPU's bits. */
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

int visc_cuda_zero(visc_cuda *ctx, void *p, size_t bytes) {
    if (bytes == 0) return 0;
    return visc_cuda_check(cudaMemsetAsync(p, 0, bytes, ctx->stream), "zeroing device memory");
}

int visc_cuda_copy(visc_cuda *ctx, void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return 0;
    return visc_cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream),
                           "copy on the device");
}

/* eltwise.cu: the elementwise glue of a model's step on the GPU: sums
 * (residual connections, gradient paths that join), the residual sum with
 * its ReLU (also on bf16 tensors, with ReLU's backward, alone or after the
 * sum of two gradient paths), zeroing and
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

/* din = a + b where out > 0, else 0 (din may alias a or b) */
__global__ void add_relu_backward_kernel(float *din, const float *a, const float *b,
                                         const float *out, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = a[i] + b[i];
        din[i] = out[i] > 0.0f ? g : 0.0f;
    }
}

int visc_cuda_add(visc_cuda *ctx, float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return 0;
    add_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, a, b, n);
    return visc_cuda_launched("add");
}

int visc_cuda_add_relu_backward(visc_cuda *ctx, float *din, const float *a, const float *b,
                                const float *out, size_t n) {
    if (n == 0) return 0;
    add_relu_backward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(din, a, b, out, n);
    return visc_cuda_launched("add + relu backward");
}

int visc_cuda_add_relu(visc_cuda *ctx, float *out, const float *identity, size_t n) {
    if (n == 0) return 0;
    add_relu_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, identity, n);
    return visc_cuda_launched("add + relu");
}

/* ---- bf16 tensors (a ResNet's activations under --precision bf16):
 * each sum in fp32, rounded once to bf16; ReLU's backward passes dout's
 * bits where the output is positive. Where every tensor is 16-byte
 * aligned a thread takes 8 values in one access each (the last n % 8 one
 * at a time): one 2-byte value a thread keeps too few bytes in flight to
 * reach the memory's bandwidth. ---- */
enum { EW_ADD, EW_ADD_RELU, EW_RELU_BACKWARD, EW_ADD_RELU_BACKWARD };

/* The values of a word kept where the matching value of mask's word is
 * positive (ReLU's backward masked by its output). */
__device__ __forceinline__ uint32_t ew_keep_positive(uint32_t x, uint32_t mask) {
    float m[2];
    bf16_unpack2(mask, m);
    return (m[0] > 0.0f ? x & 0xffffu : 0u) | (m[1] > 0.0f ? x & 0xffff0000u : 0u);
}

/* The operation on the two values in each of x's, y's and z's 32-bit
 * words (z: EW_ADD_RELU_BACKWARD's mask, unread by the others). */
template <int OP> __device__ __forceinline__ uint32_t ew_pair(uint32_t x, uint32_t y, uint32_t z) {
    if constexpr (OP == EW_RELU_BACKWARD) /* x: dout, y: the output */
        return ew_keep_positive(x, y);
    float a[2], b[2];
    bf16_unpack2(y, b);
    bf16_unpack2(x, a);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        a[j] += b[j];
        if (OP == EW_ADD_RELU) a[j] = a[j] > 0.0f ? a[j] : 0.0f; /* a NaN sum gives 0 */
    }
    /* the rounded sum's bits where the mask is positive: add, then ReLU's backward */
    if constexpr (OP == EW_ADD_RELU_BACKWARD) return ew_keep_positive(bf16_pack2(a), z);
    return bf16_pack2(a);
}

/* out[i] = OP(x[i], y[i], z[i]) for i < n; vec: 8 a thread, the tensors
 * aligned. An element is read before it is written, by the same thread:
 * out may alias x or y. z is read only by EW_ADD_RELU_BACKWARD. */
template <int OP>
__global__ void bf16_eltwise_kernel(uint16_t *out, const uint16_t *x, const uint16_t *y,
                                    const uint16_t *z, size_t n, int vec) {
    constexpr int reads_z = OP == EW_ADD_RELU_BACKWARD;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vec) {
        const size_t n8 = n / 8;
        for (size_t i = first; i < n8; i += stride) {
            const uint4 a = ((const uint4 *)x)[i], b = ((const uint4 *)y)[i];
            const uint4 c = reads_z ? ((const uint4 *)z)[i] : make_uint4(0, 0, 0, 0);
            uint4 r;
            r.x = ew_pair<OP>(a.x, b.x, c.x), r.y = ew_pair<OP>(a.y, b.y, c.y);
            r.z = ew_pair<OP>(a.z, b.z, c.z), r.w = ew_pair<OP>(a.w, b.w, c.w);
            ((uint4 *)out)[i] = r;
        }
        done = n8 * 8;
    }
    for (size_t i = done + first; i < n; i += stride)
        out[i] = (uint16_t)ew_pair<OP>(x[i], y[i], reads_z ? z[i] : 0u);
}

template <int OP>
static int bf16_eltwise(visc_cuda *ctx, uint16_t *out, const uint16_t *x, const uint16_t *y,
                        const uint16_t *z, size_t n, const char *what) {
    if (n == 0) return 0;
    const int vec = !ctx->scalar_access && visc_cuda_aligned16(out) && visc_cuda_aligned16(x) &&
                    visc_cuda_aligned16(y) && (!z || visc_cuda_aligned16(z));
    const size_t threads_needed = vec ? n / 8 + n % 8 : n;
    bf16_eltwise_kernel<OP>
        <<<visc_cuda_blocks(threads_needed, 256), 256, 0, ctx->stream>>>(out, x, y, z, n, vec);
    return visc_cuda_launched(what);
}

int visc_cuda_add_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *a, const uint16_t *b,
                       size_t n) {
    return bf16_eltwise<EW_ADD>(ctx, out, a, b, NULL, n, "add (bf16)");
}

int visc_cuda_add_relu_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *identity, size_t n) {
    return bf16_eltwise<EW_ADD_RELU>(ctx, out, out, identity, NULL, n, "add + relu (bf16)");
}

int visc_cuda_relu_backward_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *dout,
                                 const uint16_t *out, size_t n) {
    return bf16_eltwise<EW_RELU_BACKWARD>(ctx, din, dout, out, NULL, n, "relu backward (bf16)");
}

int visc_cuda_add_relu_backward_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *a,
                                     const uint16_t *b, const uint16_t *out, size_t n) {
    return bf16_eltwise<EW_ADD_RELU_BACKWARD>(ctx, din, a, b, out, n, "add + relu backward (bf16)");
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

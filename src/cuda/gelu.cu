/* gelu.cu: GELU in its exact erf form (torch.nn.GELU(), gelu.cuh), the
 * GPU twin of src/nn/gelu.c, and the fused bias + GELU epilogue of an
 * MLP's first linear layer. cuBLASLt's own GELU epilogue is the tanh
 * approximation, not this function, hence a kernel of our own. */
#include <cuda_bf16.h>

#include "common.cuh"
#include "gelu.cuh"

__global__ void gelu_forward_kernel(float *out, const float *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = visc_gelu(in[i]);
}

__global__ void gelu_backward_kernel(float *din, const float *dout, const float *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        din[i] = dout[i] * visc_gelu_grad(in[i]);
}

/* The same from and (forward) into bf16: an MLP's hidden layer in the
 * operand form, GELU's output the next product's operand. */
__global__ void gelu_bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(visc_gelu(__bfloat162float(in[i])));
}

__global__ void gelu_backward_bf16_kernel(float *din, const float *dout, const __nv_bfloat16 *in,
                                          size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        din[i] = dout[i] * visc_gelu_grad(__bfloat162float(in[i]));
}

int visc_cuda_gelu_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *in, size_t n) {
    if (n == 0) return 0;
    gelu_bf16_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        (__nv_bfloat16 *)out, (const __nv_bfloat16 *)in, n);
    return visc_cuda_launched("gelu (bf16)");
}

int visc_cuda_gelu_backward_bf16(visc_cuda *ctx, float *din, const float *dout, const uint16_t *in,
                                 size_t n) {
    if (n == 0) return 0;
    gelu_backward_bf16_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        din, dout, (const __nv_bfloat16 *)in, n);
    return visc_cuda_launched("gelu backward (bf16 input)");
}

int visc_cuda_gelu_forward(visc_cuda *ctx, float *out, const float *in, size_t n) {
    if (n == 0) return 0;
    gelu_forward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, in, n);
    return visc_cuda_launched("gelu forward");
}

int visc_cuda_gelu_backward(visc_cuda *ctx, float *din, const float *dout, const float *in,
                            size_t n) {
    if (n == 0) return 0;
    gelu_backward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(din, dout, in, n);
    return visc_cuda_launched("gelu backward");
}

__global__ void bias_gelu_forward_kernel(float *out, __nv_bfloat16 *out_bf16, const float *in,
                                         const float *bias, size_t n, int C) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float y = visc_gelu(bias ? in[i] + bias[i % C] : in[i]);
        if (out) out[i] = y;
        if (out_bf16) out_bf16[i] = __float2bfloat16_rn(y);
    }
}

__global__ void bias_gelu_backward_kernel(float *din, const float *dout, const float *in,
                                          const float *bias, size_t n, int C) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        din[i] = dout[i] * visc_gelu_grad(in[i] + bias[i % C]);
}

int visc_cuda_bias_gelu_forward(visc_cuda *ctx, float *out, uint16_t *out_bf16, const float *in,
                                const float *bias, int64_t rows, int C) {
    if (rows < 0 || C <= 0)
        return visc_set_error("bias + gelu: bad shape [%lld, %d]", (long long)rows, C);
    const size_t n = (size_t)rows * C;
    if (n == 0) return 0;
    bias_gelu_forward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out,
                                                                                (__nv_bfloat16 *)
                                                                                    out_bf16,
                                                                                in, bias, n, C);
    return visc_cuda_launched("bias + gelu forward");
}

int visc_cuda_bias_gelu_backward(visc_cuda *ctx, float *din, float *dbias, const float *dout,
                                 const float *in, const float *bias, int64_t rows, int C) {
    if (rows < 0 || C <= 0)
        return visc_set_error("bias + gelu: bad shape [%lld, %d]", (long long)rows, C);
    const size_t n = (size_t)rows * C;
    if (n > 0) {
        bias_gelu_backward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(din, dout, in,
                                                                                     bias, n, C);
        if (visc_cuda_launched("bias + gelu backward")) return -1;
    }
    return dbias ? visc_cuda_column_sums(ctx, dbias, din, rows, C) : 0;
}

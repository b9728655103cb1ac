/* linear.cu: the linear layer y = x W^T + b on [N, in] rows, the GPU twin
 * of visc_linear_forward / backward (src/nn/linear.c): three cuBLASLt
 * products and the bias gradient as the deterministic column sum. As on
 * the CPU, backward overwrites dW and db (parameter gradients are never
 * accumulated by a layer).
 *
 * fp32 (the default): the products in full fp32 (COMPUTE_32F, never TF32).
 * bf16 (visc_cuda_set_bf16): the CPU's bf16 mode (linear_bf16.c) on
 * tensor cores. The operands are rounded into the context's scratch as
 * they are needed, so the model's tensors stay fp32 and nothing else
 * changes; the scratch grows on the first step and is then kept. */
#include "common.cuh"

int visc_cuda_linear_forward(visc_cuda *ctx, float *out, const float *in, const float *weight,
                             const float *bias, int N, int in_features, int out_features) {
    /* Y[N, out] = X[N, in] W^T, W stored [out, in] */
    if (!ctx->bf16)
        return visc_cuda_matmul_f32(ctx, out, in, weight, bias, N, out_features, in_features, 0, 1,
                                    0.0f);
    const size_t nx = (size_t)N * in_features, nw = (size_t)out_features * in_features;
    const size_t counts[2] = {nx, nw};
    uint16_t *c[2];
    if (visc_cuda_bf16_scratch(ctx, c, counts, 2) || visc_cuda_f32_to_bf16(ctx, c[0], in, nx) ||
        visc_cuda_f32_to_bf16(ctx, c[1], weight, nw))
        return -1;
    return visc_cuda_matmul_bf16(ctx, out, c[0], c[1], bias, N, out_features, in_features, 0, 1,
                                 0.0f);
}

int visc_cuda_linear_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                              const float *dout, const float *in, const float *weight, int N,
                              int in_features, int out_features) {
    /* The bias gradient first: its partial sums use the scratch too, and
     * the stream runs in order, so the bf16 copies may then reuse it. */
    if (dbias && visc_cuda_column_sums(ctx, dbias, dout, N, out_features)) return -1;
    if (!ctx->bf16) {
        /* dX[N, in] = dY[N, out] W[out, in] */
        if (din && visc_cuda_matmul_f32(ctx, din, dout, weight, NULL, N, in_features, out_features,
                                        0, 0, 0.0f))
            return -1;
        /* dW[out, in] = dY^T X: dY stored [N, out] = [K, M] */
        return visc_cuda_matmul_f32(ctx, dweight, dout, in, NULL, out_features, in_features, N, 1,
                                    0, 0.0f);
    }
    const size_t ndy = (size_t)N * out_features, nx = (size_t)N * in_features;
    const size_t nw = din ? (size_t)out_features * in_features : 0;
    const size_t counts[3] = {ndy, nx, nw};
    uint16_t *c[3]; /* dY, X, W */
    if (visc_cuda_bf16_scratch(ctx, c, counts, 3) || visc_cuda_f32_to_bf16(ctx, c[0], dout, ndy) ||
        visc_cuda_f32_to_bf16(ctx, c[1], in, nx))
        return -1;
    if (din && (visc_cuda_f32_to_bf16(ctx, c[2], weight, nw) ||
                visc_cuda_matmul_bf16(ctx, din, c[0], c[2], NULL, N, in_features, out_features, 0,
                                      0, 0.0f)))
        return -1;
    return visc_cuda_matmul_bf16(ctx, dweight, c[0], c[1], NULL, out_features, in_features, N, 1, 0,
                                 0.0f);
}

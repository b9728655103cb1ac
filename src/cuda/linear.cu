/* linear.cu: the fp32 linear layer y = x W^T + b on [N, in] rows, the GPU
 * twin of visc_linear_forward / backward (src/nn/linear.c) in its fp32
 * precision: three cuBLASLt products in full fp32 and the bias gradient as
 * the deterministic column sum. As on the CPU, backward overwrites dW and
 * db (parameter gradients are never accumulated by a layer). */
#include "common.cuh"

int visc_cuda_linear_forward(visc_cuda *ctx, float *out, const float *in, const float *weight,
                             const float *bias, int N, int in_features, int out_features) {
    /* Y[N, out] = X[N, in] W^T, W stored [out, in] */
    return visc_cuda_matmul_f32(ctx, out, in, weight, bias, N, out_features, in_features, 0, 1,
                                0.0f);
}

int visc_cuda_linear_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                              const float *dout, const float *in, const float *weight, int N,
                              int in_features, int out_features) {
    /* dX[N, in] = dY[N, out] W[out, in] */
    if (din && visc_cuda_matmul_f32(ctx, din, dout, weight, NULL, N, in_features, out_features, 0,
                                    0, 0.0f))
        return -1;
    /* dW[out, in] = dY^T X: dY stored [N, out] = [K, M] */
    if (visc_cuda_matmul_f32(ctx, dweight, dout, in, NULL, out_features, in_features, N, 1, 0,
                             0.0f))
        return -1;
    return dbias ? visc_cuda_column_sums(ctx, dbias, dout, N, out_features) : 0;
}

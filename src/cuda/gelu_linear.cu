/* gelu_linear.cu: GELU then a linear layer, the second half of a
 * transformer MLP, the GPU twin of src/nn/gelu_linear.c; and the whole
 * MLP's backward, where the GELU's gradient goes straight into the first
 * layer's bf16 dY.
 *
 * In bf16 the linear layer only ever takes GELU(h) rounded to bf16, in
 * forward and in the weight gradient, so the GELU writes that form straight
 * into act (half its storage) and the products read it there: the fp32
 * GELU output, its store and the rounding pass over it are gone (for a
 * ViT-S block at batch 256, 3 of about 10 passes over the [tokens, 4 C]
 * hidden activations). The values are those of GELU followed by the bf16
 * linear layer. In fp32 it is exactly those two calls. Under bf16 h, the
 * first layer's output, is bf16 as well (the operand form: fc1 writes it
 * so, as autocast's linear layer does), read by the GELU here and by its
 * gradient in backward: half the bytes kept and read. */
#include "common.cuh"

int visc_cuda_gelu_linear_act(visc_cuda *ctx, float *act, const float *h, int N, int hidden,
                              int out_features, int has_bias) {
    (void)out_features, (void)has_bias;
    if (!ctx->bf16) return visc_cuda_gelu_forward(ctx, act, h, (size_t)N * hidden);
    /* act's and h's storage is untyped (the model's arena): they hold bf16 */
    return visc_cuda_gelu_bf16(ctx, (uint16_t *)act, (const uint16_t *)h, (size_t)N * hidden);
}

int visc_cuda_gelu_linear_forward(visc_cuda *ctx, float *out, float *act, const float *h,
                                  const float *weight, const float *bias, int N, int hidden,
                                  int out_features) {
    if (visc_cuda_gelu_linear_act(ctx, act, h, N, hidden, out_features, bias != NULL)) return -1;
    if (!ctx->bf16) return visc_cuda_linear_forward(ctx, out, act, weight, bias, N, hidden,
                                                    out_features);
    return visc_cuda_linear_forward_rounded(ctx, out, (const uint16_t *)act, weight, bias, N,
                                            hidden, out_features);
}

/* The linear layer's backward, its input act as forward left it; dact:
 * the gradient of GELU's output. */
static int linear_backward(visc_cuda *ctx, float *dact, float *dweight, float *dbias,
                           const float *dout, const float *act, const float *weight, int N,
                           int hidden, int out_features) {
    return ctx->bf16 ? visc_cuda_linear_backward_rounded(ctx, dact, dweight, dbias, dout,
                                                         (const uint16_t *)act, weight, N, hidden,
                                                         out_features)
                     : visc_cuda_linear_backward(ctx, dact, dweight, dbias, dout, act, weight, N,
                                                 hidden, out_features);
}

int visc_cuda_gelu_linear_backward(visc_cuda *ctx, float *dh, float *dweight, float *dbias,
                                   const float *dout, const float *act, const float *h,
                                   const float *weight, int N, int hidden, int out_features) {
    if (linear_backward(ctx, dh, dweight, dbias, dout, act, weight, N, hidden, out_features))
        return -1;
    const size_t n = (size_t)N * hidden;
    return ctx->bf16 ? visc_cuda_gelu_backward_bf16(ctx, dh, dh, (const uint16_t *)h, n)
                     : visc_cuda_gelu_backward(ctx, dh, dh, h, n);
}

int visc_cuda_mlp_backward(visc_cuda *ctx, float *din, float *dweight1, float *dbias1,
                           float *dweight2, float *dbias2, float *dact, const float *dout,
                           const float *in, const float *h, const float *act,
                           const float *weight1, const float *weight2, int N, int in_features,
                           int hidden, int out_features) {
    return linear_backward(ctx, dact, dweight2, dbias2, dout, act, weight2, N, hidden,
                           out_features) ||
                   visc_cuda_linear_gelu_operand_backward(ctx, din, dweight1, dbias1, dact, h, in,
                                                          weight1, N, in_features, hidden)
               ? -1
               : 0;
}

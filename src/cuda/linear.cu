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
#include "swin_window.cuh"

/* The bf16 forward product, X already rounded (x16): W rounded into w16. */
static int forward_bf16(visc_cuda *ctx, float *out, const uint16_t *x16, uint16_t *w16,
                        const float *weight, const float *bias, int N, int in_features,
                        int out_features) {
    /* Y[N, out] = X[N, in] W^T, W stored [out, in] */
    return visc_cuda_f32_to_bf16(ctx, w16, weight, (size_t)out_features * in_features) ||
                   visc_cuda_matmul_bf16(ctx, out, x16, w16, bias, N, out_features, in_features,
                                         0, 1, 0.0f)
               ? -1
               : 0;
}

int visc_cuda_linear_forward(visc_cuda *ctx, float *out, const float *in, const float *weight,
                             const float *bias, int N, int in_features, int out_features) {
    if (!ctx->bf16)
        return visc_cuda_matmul_f32(ctx, out, in, weight, bias, N, out_features, in_features, 0, 1,
                                    0.0f);
    const size_t nx = (size_t)N * in_features, nw = (size_t)out_features * in_features;
    const size_t counts[2] = {nx, nw};
    uint16_t *c[2];
    if (visc_cuda_bf16_scratch(ctx, c, counts, 2) || visc_cuda_f32_to_bf16(ctx, c[0], in, nx))
        return -1;
    return forward_bf16(ctx, out, c[0], c[1], weight, bias, N, in_features, out_features);
}

int visc_cuda_linear_forward_rounded(visc_cuda *ctx, float *out, const uint16_t *in,
                                     const float *weight, const float *bias, int N,
                                     int in_features, int out_features) {
    const size_t counts[1] = {(size_t)out_features * in_features};
    uint16_t *w16;
    if (visc_cuda_bf16_scratch(ctx, &w16, counts, 1)) return -1;
    return forward_bf16(ctx, out, in, w16, weight, bias, N, in_features, out_features);
}

/* The bf16 backward products, X already rounded (x16): dY (dout, or dout
 * x GELU'(gelu_in), gelu_in bf16, when it is not NULL; with windows, dout
 * in token order partitioned into the grid's windows) rounded into dy16
 * in the pass that sums its columns into dbias when that is asked (part:
 * its partials, visc_cuda_col_chunks(N) * out_features floats), W into
 * w16 (when din is asked). */
static int backward_bf16(visc_cuda *ctx, float *din, float *dweight, float *dbias, float *part,
                         const float *dout, const uint16_t *gelu_in,
                         const visc_cuda_swin_grid *windows, uint16_t *dy16, const uint16_t *x16,
                         const float *weight, uint16_t *w16, int N, int in_features,
                         int out_features) {
    const size_t ndy = (size_t)N * out_features;
    if (dbias || gelu_in || windows
            ? visc_cuda_column_sums_rounded(ctx, dbias, dy16, part, dout, gelu_in, windows, N,
                                            out_features)
            : visc_cuda_f32_to_bf16(ctx, dy16, dout, ndy))
        return -1;
    /* dX[N, in] = dY[N, out] W[out, in] */
    if (din && (visc_cuda_f32_to_bf16(ctx, w16, weight, (size_t)out_features * in_features) ||
                visc_cuda_matmul_bf16(ctx, din, dy16, w16, NULL, N, in_features, out_features, 0,
                                      0, 0.0f)))
        return -1;
    /* dW[out, in] = dY^T X: dY stored [N, out] = [K, M] */
    return visc_cuda_matmul_bf16(ctx, dweight, dy16, x16, NULL, out_features, in_features, N, 1, 0,
                                 0.0f);
}

/* Room for the column partials in the bf16 scratch, in bf16 elements (0
 * when no pass makes them: neither dbias nor GELU'). */
static size_t partials_room(int needed, int N, int out_features) {
    return needed ? 2 * (size_t)visc_cuda_col_chunks(N) * out_features : 0;
}

int visc_cuda_linear_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                              const float *dout, const float *in, const float *weight, int N,
                              int in_features, int out_features) {
    if (!ctx->bf16) {
        if (dbias && visc_cuda_column_sums(ctx, dbias, dout, N, out_features)) return -1;
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
    const size_t counts[4] = {ndy, nx, nw, partials_room(dbias != NULL, N, out_features)};
    uint16_t *c[4]; /* dY, X, W, dbias's partials */
    if (visc_cuda_bf16_scratch(ctx, c, counts, 4) || visc_cuda_f32_to_bf16(ctx, c[1], in, nx))
        return -1;
    return backward_bf16(ctx, din, dweight, dbias, (float *)c[3], dout, NULL, NULL, c[0], c[1],
                         weight, c[2], N, in_features, out_features);
}

/* visc_cuda_linear_backward_rounded with dY = dout x GELU'(gelu_in) when
 * gelu_in (bf16) is not NULL, and dout partitioned into the windows of
 * `windows` when that is not NULL. */
static int backward_rounded(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                            const float *dout, const uint16_t *gelu_in,
                            const visc_cuda_swin_grid *windows, const uint16_t *in,
                            const float *weight, int N, int in_features, int out_features) {
    const size_t counts[3] = {(size_t)N * out_features,
                              din ? (size_t)out_features * in_features : 0,
                              partials_room(dbias || gelu_in || windows, N, out_features)};
    uint16_t *c[3]; /* dY, W, the column partials */
    if (visc_cuda_bf16_scratch(ctx, c, counts, 3)) return -1;
    return backward_bf16(ctx, din, dweight, dbias, (float *)c[2], dout, gelu_in, windows, c[0], in,
                         weight, c[1], N, in_features, out_features);
}

int visc_cuda_linear_backward_rounded(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                                      const float *dout, const uint16_t *in, const float *weight,
                                      int N, int in_features, int out_features) {
    return backward_rounded(ctx, din, dweight, dbias, dout, NULL, NULL, in, weight, N, in_features,
                            out_features);
}

int visc_cuda_linear_operand_forward(visc_cuda *ctx, float *out, const float *in,
                                     const float *weight, const float *bias, int N,
                                     int in_features, int out_features) {
    if (!ctx->bf16)
        return visc_cuda_linear_forward(ctx, out, in, weight, bias, N, in_features, out_features);
    return visc_cuda_linear_forward_rounded(ctx, out, (const uint16_t *)in, weight, bias, N,
                                            in_features, out_features);
}

/* The bf16 forward into a bf16 output: X rounded already (x16), or in x
 * to be rounded first (x16 NULL). */
static int forward_to_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *x16, const float *x,
                           const float *weight, const float *bias, int N, int in_features,
                           int out_features) {
    const size_t nw = (size_t)out_features * in_features, nx = x16 ? 0 : (size_t)N * in_features;
    const size_t counts[3] = {nw, bias ? (size_t)out_features : 0, nx};
    uint16_t *c[3];
    /* the bias rounded too: cuBLASLt adds a bias of D's type (autocast's) */
    if (visc_cuda_bf16_scratch(ctx, c, counts, 3) || visc_cuda_f32_to_bf16(ctx, c[0], weight, nw) ||
        (bias && visc_cuda_f32_to_bf16(ctx, c[1], bias, (size_t)out_features)) ||
        (!x16 && visc_cuda_f32_to_bf16(ctx, c[2], x, nx)))
        return -1;
    /* Y[N, out] = X[N, in] W^T */
    return visc_cuda_matmul_bf16_to_bf16(ctx, out, x16 ? x16 : c[2], c[0], bias ? c[1] : NULL, N,
                                         out_features, in_features, 0, 1);
}

int visc_cuda_linear_operands_forward(visc_cuda *ctx, float *out, const float *in,
                                      const float *weight, const float *bias, int N,
                                      int in_features, int out_features) {
    if (!ctx->bf16)
        return visc_cuda_linear_forward(ctx, out, in, weight, bias, N, in_features, out_features);
    /* in's and out's storage hold bf16 */
    return forward_to_bf16(ctx, (uint16_t *)out, (const uint16_t *)in, NULL, weight, bias, N,
                           in_features, out_features);
}

int visc_cuda_linear_forward_to_operand(visc_cuda *ctx, float *out, const float *in,
                                        const float *weight, const float *bias, int N,
                                        int in_features, int out_features) {
    if (!ctx->bf16)
        return visc_cuda_linear_forward(ctx, out, in, weight, bias, N, in_features, out_features);
    return forward_to_bf16(ctx, (uint16_t *)out, NULL, in, weight, bias, N, in_features,
                           out_features);
}

int visc_cuda_linear_operand_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                                      const float *dout, const float *in, const float *weight,
                                      int N, int in_features, int out_features) {
    if (!ctx->bf16)
        return visc_cuda_linear_backward(ctx, din, dweight, dbias, dout, in, weight, N,
                                         in_features, out_features);
    return visc_cuda_linear_backward_rounded(ctx, din, dweight, dbias, dout, (const uint16_t *)in,
                                             weight, N, in_features, out_features);
}

int visc_cuda_linear_operand_backward_from_windows(visc_cuda *ctx, float *din, float *dweight,
                                                   float *dbias, const float *dout, float *windowed,
                                                   const visc_cuda_swin_grid *g, int B,
                                                   const float *in, const float *weight,
                                                   int in_features, int out_features) {
    if (visc_swin_grid_check(g, B, out_features)) return -1;
    const int64_t rows = (int64_t)B * g->H * g->W;
    if (rows > INT32_MAX) return visc_set_error("linear from windows: %lld rows", (long long)rows);
    const int N = (int)rows;
    if (!ctx->bf16)
        return visc_cuda_swin_partition(ctx, windowed, dout, g, B, out_features) ||
                       visc_cuda_linear_backward(ctx, din, dweight, dbias, windowed, in, weight, N,
                                                 in_features, out_features)
                   ? -1
                   : 0;
    return backward_rounded(ctx, din, dweight, dbias, dout, NULL, g, (const uint16_t *)in, weight,
                            N, in_features, out_features);
}

int visc_cuda_linear_gelu_operand_backward(visc_cuda *ctx, float *din, float *dweight,
                                           float *dbias, float *dact, const float *h,
                                           const float *in, const float *weight, int N,
                                           int in_features, int out_features) {
    if (!ctx->bf16)
        return visc_cuda_gelu_backward(ctx, dact, dact, h, (size_t)N * out_features) ||
                       visc_cuda_linear_backward(ctx, din, dweight, dbias, dact, in, weight, N,
                                                 in_features, out_features)
                   ? -1
                   : 0;
    /* h and in: the operand form, bf16 */
    return backward_rounded(ctx, din, dweight, dbias, dact, (const uint16_t *)h, NULL,
                            (const uint16_t *)in, weight, N, in_features, out_features);
}

/* layernorm.cu: LayerNorm over the last dimension of [rows, C], the GPU
 * twin of src/nn/layernorm.c with the same formulas:
 *   forward   xhat = (x - mean) * rstd,  out = xhat * gamma + beta
 *   backward  din = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * gamma
 *             dgamma = sum_rows dout * xhat,  dbeta = sum_rows dout
 * One warp per row: rows are short (C <= 1024 in every model here) and
 * there are many of them (batch x tokens). The statistics take the CPU's
 * two passes (the mean relative to the row's first element, then the
 * centred variance), which keep their precision on rows with a large mean. */
#include <cuda_bf16.h>

#include "swin_window.cuh"

#define ROWS_PER_BLOCK 8 /* warps of 32 threads */

/* The norm's rows in token order, or (Swin) one side of it in windowed
 * order: the output and its gradient (V1's first norm, whose output is the
 * qkv projection's operand), or the input and its gradient (V2's post-norm
 * after the output projection). Row r of the windowed side is the token
 * row t that the window partition puts there; the other side's row is t.
 * The statistics are kept at the input's rows (as the CPU's norm of the
 * same rows keeps them). */
enum ln_windowed { LN_IN_ORDER, LN_OUT_WINDOWED, LN_IN_WINDOWED };
struct ln_rows {
    visc_cuda_swin_grid g;
    ln_windowed side;
};
__device__ __forceinline__ int64_t token_row(const ln_rows &m, int64_t r) {
    return m.side == LN_IN_ORDER ? r : visc_swin_token_row(m.g, r);
}
/* the input's row (and its gradient's) and the output's, of row r and its token row t */
__device__ __forceinline__ int64_t in_row(const ln_rows &m, int64_t r, int64_t t) {
    return m.side == LN_IN_WINDOWED ? r : t;
}
__device__ __forceinline__ int64_t out_row(const ln_rows &m, int64_t r, int64_t t) {
    return m.side == LN_IN_WINDOWED ? t : r;
}
static const ln_rows tokens_in_order = {{0, 0, 0, 0, 0, 0}, LN_IN_ORDER};

/* out holds fp32, or bf16 with bf16_out (each value rounded once) */
__global__ void ln_forward_kernel(void *out, float *save_mean, float *save_rstd, const float *in,
                                  const float *gamma, const float *beta, int64_t rows, int C,
                                  float eps, int bf16_out, ln_rows map) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= rows) return; /* whole warps leave together: r is the warp's */
    const int64_t t = token_row(map, r), i = in_row(map, r, t), o = out_row(map, r, t);
    const float *x = in + i * C;
    const float x0 = x[0];
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += x[c] - x0;
    const float mean = x0 + visc_warp_sum(sum) / (float)C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) var += (x[c] - mean) * (x[c] - mean);
    const float rstd =
        1.0f / sqrtf(visc_warp_sum(var) / (float)C + eps); /* as the CPU: not rsqrtf */
    for (int c = lane; c < C; c += 32) {
        float v = (x[c] - mean) * rstd;
        if (gamma) v *= gamma[c];
        if (beta) v += beta[c];
        if (bf16_out) ((__nv_bfloat16 *)out)[o * C + c] = __float2bfloat16_rn(v);
        else ((float *)out)[o * C + c] = v;
    }
    if (lane == 0) {
        save_mean[i] = mean;
        save_rstd[i] = rstd;
    }
}

static int ln_forward(visc_cuda *ctx, void *out, float *save_mean, float *save_rstd,
                      const float *in, const float *gamma, const float *beta, int64_t rows, int C,
                      float eps, int bf16_out, ln_rows map) {
    if (rows < 0 || C <= 0)
        return visc_set_error("layernorm: bad shape [%lld, %d]", (long long)rows, C);
    if (rows == 0) return 0;
    const int64_t blocks = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    ln_forward_kernel<<<(unsigned)blocks, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
        out, save_mean, save_rstd, in, gamma, beta, rows, C, eps, bf16_out, map);
    return visc_cuda_launched("layernorm forward");
}

int visc_cuda_layernorm_forward(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                const float *in, const float *gamma, const float *beta,
                                int64_t rows, int C, float eps) {
    return ln_forward(ctx, out, save_mean, save_rstd, in, gamma, beta, rows, C, eps, 0,
                      tokens_in_order);
}

int visc_cuda_layernorm_operand_forward(visc_cuda *ctx, float *out, float *save_mean,
                                        float *save_rstd, const float *in, const float *gamma,
                                        const float *beta, int64_t rows, int C, float eps) {
    /* under bf16 out's storage is untyped: it holds bf16, the linear layer's operand */
    return ln_forward(ctx, out, save_mean, save_rstd, in, gamma, beta, rows, C, eps, ctx->bf16,
                      tokens_in_order);
}

int visc_cuda_layernorm_operand_to_windows(visc_cuda *ctx, float *out, float *save_mean,
                                           float *save_rstd, const float *in, const float *gamma,
                                           const float *beta, const visc_cuda_swin_grid *g, int B,
                                           int C, float eps) {
    if (visc_swin_grid_check(g, B, C)) return -1;
    return ln_forward(ctx, out, save_mean, save_rstd, in, gamma, beta, (int64_t)B * g->H * g->W, C,
                      eps, ctx->bf16, ln_rows{*g, LN_OUT_WINDOWED});
}

int visc_cuda_layernorm_from_windows(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                     const float *in, const float *gamma, const float *beta,
                                     const visc_cuda_swin_grid *g, int B, int C, float eps) {
    if (visc_swin_grid_check(g, B, C)) return -1;
    if (out == in) /* rows of one are read while the other's are written */
        return visc_set_error("layernorm from windows: out is in");
    return ln_forward(ctx, out, save_mean, save_rstd, in, gamma, beta, (int64_t)B * g->H * g->W, C,
                      eps, 0, ln_rows{*g, LN_IN_WINDOWED});
}

/* din = the input's gradient, or with acc din += it (a residual stream's
 * gradient, which takes the norm's branch in this pass) */
__global__ void ln_backward_kernel(float *din, int acc, const float *dout, const float *in,
                                   const float *gamma, const float *save_mean,
                                   const float *save_rstd, int64_t rows, int C, ln_rows map) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int64_t t = token_row(map, r), i = in_row(map, r, t);
    const float *x = in + i * C, *dy = dout + out_row(map, r, t) * C;
    float *dx = din + i * C;
    const float mean = save_mean[i], rstd = save_rstd[i];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float g = gamma ? dy[c] * gamma[c] : dy[c];
        sg += g;
        sgx += g * (x[c] - mean);
    }
    const float mg = visc_warp_sum(sg) / (float)C, mgx = visc_warp_sum(sgx) * rstd / (float)C;
    for (int c = lane; c < C; c += 32) {
        const float g = gamma ? dy[c] * gamma[c] : dy[c];
        const float v = rstd * (g - mg - (x[c] - mean) * rstd * mgx);
        dx[c] = acc ? __fadd_rn(dx[c], v) : v; /* not fused into v's product: din's bits, added */
    }
}

/* Block (x, k): the dgamma / dbeta partials of rows chunk k for blockDim.x columns. */
__global__ void ln_param_partials_kernel(float *part, const float *dout, const float *in,
                                         const float *save_mean, const float *save_rstd,
                                         int64_t rows, int C, int chunks, ln_rows map) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int64_t r0, r1;
    visc_chunk_rows(rows, blockIdx.y, chunks, &r0, &r1);
    float sg = 0.0f, sb = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t t = token_row(map, r), i = in_row(map, r, t);
        const float dy = dout[out_row(map, r, t) * C + c];
        sg += dy * (in[i * C + c] - save_mean[i]) * save_rstd[i];
        sb += dy;
    }
    float *p = part + (size_t)blockIdx.y * 2 * C;
    p[c] = sg;
    p[C + c] = sb;
}

static int ln_backward(visc_cuda *ctx, float *din, int acc, float *dgamma, float *dbeta,
                       const float *dout, const float *in, const float *gamma,
                       const float *save_mean, const float *save_rstd, int64_t rows, int C,
                       ln_rows map) {
    if (rows < 0 || C <= 0)
        return visc_set_error("layernorm: bad shape [%lld, %d]", (long long)rows, C);
    if (din && rows > 0) {
        const int64_t blocks = (rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
        ln_backward_kernel<<<(unsigned)blocks, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            din, acc, dout, in, gamma, save_mean, save_rstd, rows, C, map);
        if (visc_cuda_launched("layernorm backward")) return -1;
    }
    if (!gamma || !dgamma) return 0; /* no affine: nothing to learn */
    const int chunks = visc_cuda_col_chunks(rows);
    float *part = (float *)visc_cuda_scratch(ctx, (size_t)chunks * 2 * C * sizeof(float));
    if (!part) return -1;
    if (rows == 0) {
        if (visc_cuda_check(cudaMemsetAsync(dgamma, 0, sizeof(float) * C, ctx->stream), "dgamma"))
            return -1;
        return dbeta ? visc_cuda_check(cudaMemsetAsync(dbeta, 0, sizeof(float) * C, ctx->stream),
                                       "dbeta")
                     : 0;
    }
    const unsigned threads = visc_cuda_col_threads(C);
    ln_param_partials_kernel<<<dim3((C + threads - 1) / threads, chunks), threads, 0,
                               ctx->stream>>>(part, dout, in, save_mean, save_rstd, rows, C,
                                              chunks, map);
    if (visc_cuda_launched("layernorm parameter gradients")) return -1;
    if (visc_cuda_add_partials(ctx, dgamma, part, chunks, 2 * C, C)) return -1;
    return dbeta ? visc_cuda_add_partials(ctx, dbeta, part + C, chunks, 2 * C, C) : 0;
}

int visc_cuda_layernorm_backward(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                 const float *dout, const float *in, const float *gamma,
                                 const float *save_mean, const float *save_rstd, int64_t rows,
                                 int C) {
    return ln_backward(ctx, din, 0, dgamma, dbeta, dout, in, gamma, save_mean, save_rstd, rows, C,
                       tokens_in_order);
}

int visc_cuda_layernorm_backward_add(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                     const float *dout, const float *in, const float *gamma,
                                     const float *save_mean, const float *save_rstd, int64_t rows,
                                     int C) {
    return ln_backward(ctx, din, 1, dgamma, dbeta, dout, in, gamma, save_mean, save_rstd, rows, C,
                       tokens_in_order);
}

int visc_cuda_layernorm_backward_from_windows_add(visc_cuda *ctx, float *din, float *dgamma,
                                                  float *dbeta, const float *dout, const float *in,
                                                  const float *gamma, const float *save_mean,
                                                  const float *save_rstd,
                                                  const visc_cuda_swin_grid *g, int B, int C) {
    if (visc_swin_grid_check(g, B, C)) return -1;
    return ln_backward(ctx, din, 1, dgamma, dbeta, dout, in, gamma, save_mean, save_rstd,
                       (int64_t)B * g->H * g->W, C, ln_rows{*g, LN_OUT_WINDOWED});
}

int visc_cuda_layernorm_backward_to_windows(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                            const float *dout, const float *in, const float *gamma,
                                            const float *save_mean, const float *save_rstd,
                                            const visc_cuda_swin_grid *g, int B, int C) {
    if (visc_swin_grid_check(g, B, C)) return -1;
    if (din == dout) /* rows of one are read while the other's are written */
        return visc_set_error("layernorm backward to windows: din is dout");
    return ln_backward(ctx, din, 0, dgamma, dbeta, dout, in, gamma, save_mean, save_rstd,
                       (int64_t)B * g->H * g->W, C, ln_rows{*g, LN_IN_WINDOWED});
}

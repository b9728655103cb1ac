/* swin.cu: Swin's own pieces on the GPU, twins of models/swin_window.c
 * (the bias gather and its scatter, V2's per-head normalization of q and
 * k, which writes q, k and v in the attention's operand form, patch
 * merging's gather) and of nn/token_ops.c's token mean, plus V2's per-head
 * temperature exp(min(logit_scale, log 100)). Each output element is
 * computed by one thread with the CPU's formula in the CPU's order (the
 * scatter adds a table row's entries in index order), so no atomics. */
#include <math.h>

#include "common.cuh"

__global__ void gather_bias_kernel(float *bias, const float *table, const int32_t *rel, int H,
                                   int NN, int sigmoid16) {
    const size_t n = (size_t)H * NN;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const int h = (int)(e / NN), i = (int)(e % NN);
        const float v = table[(size_t)rel[i] * H + h];
        bias[e] = sigmoid16 ? 16.0f / (1.0f + expf(-v)) : v;
    }
}

int visc_cuda_swin_gather_bias(visc_cuda *ctx, float *bias, const float *table, const int32_t *rel,
                               int H, int N, int sigmoid16) {
    const size_t n = (size_t)H * N * N;
    gather_bias_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(bias, table, rel, H,
                                                                           N * N, sigmoid16);
    return visc_cuda_launched("swin bias gather");
}

/* dtable[t, h] = the sum, in index order, of the entries i with rel[i] = t. */
__global__ void scatter_bias_kernel(float *dtable, const float *dbias, const float *bias,
                                    const int32_t *rel, int T, int H, int NN, int sigmoid16) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= T * H) return;
    const int t = e / H, h = e % H;
    float s = 0.0f;
    for (int i = 0; i < NN; i++) {
        if (rel[i] != t) continue;
        float d = dbias[(size_t)h * NN + i];
        if (sigmoid16) {
            const float sg = __fmul_rn(bias[(size_t)h * NN + i], 1.0f / 16.0f); /* sigmoid(v) */
            d = __fmul_rn(d, __fmul_rn(__fmul_rn(16.0f, sg), 1.0f - sg));
        }
        s += d;
    }
    dtable[e] = s;
}

int visc_cuda_swin_scatter_bias(visc_cuda *ctx, float *dtable, const float *dbias,
                                const float *bias, const int32_t *rel, int T, int H, int N,
                                int sigmoid16) {
    scatter_bias_kernel<<<(T * H + 127) / 128, 128, 0, ctx->stream>>>(dtable, dbias, bias, rel, T,
                                                                      H, N * N, sigmoid16);
    return visc_cuda_launched("swin bias scatter");
}

/* Thread e: head h of part p (q, k, v) of row r of raw [rows, 3 H D]:
 * q and k normalized (their norms into qnorm / knorm [rows, H]), v copied;
 * out in the operand form (bf16: each value rounded once). */
__global__ void qkv_operand_kernel(void *out, float *qnorm, float *knorm, const float *raw,
                                   int64_t rows, int H, int D, int bf16) {
    const int64_t n = rows * 3 * H, ld = (int64_t)3 * H * D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / (3 * H);
        const int p = (int)(e / H % 3), h = (int)(e % H);
        const int64_t at = r * ld + (int64_t)(p * H + h) * D;
        const float *x = raw + at;
        float nrm = 1.0f;
        if (p < 2) {
            float ss = 0.0f;
            for (int d = 0; d < D; d++) ss = __fadd_rn(ss, __fmul_rn(x[d], x[d]));
            nrm = sqrtf(ss);
            nrm = nrm > 1e-12f ? nrm : 1e-12f;
            (p == 0 ? qnorm : knorm)[r * H + h] = nrm;
        }
        for (int d = 0; d < D; d++) visc_operand_store(out, bf16, at + d, p < 2 ? x[d] / nrm : x[d]);
    }
}

/* y: fp32, or bf16 with y_bf16 (the operand form) */
__global__ void normalize_backward_kernel(float *dx, int64_t ld_dx, const float *dy, int64_t ld_dy,
                                          const void *y, int y_bf16, int64_t ld_y,
                                          const float *norms, int64_t rows, int H, int D) {
    const int64_t n = rows * H;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = e / H;
        const int h = (int)(e % H);
        const int64_t yat = r * ld_y + (int64_t)h * D;
        const float *g = dy + r * ld_dy + (int64_t)h * D;
        float *o = dx + r * ld_dx + (int64_t)h * D;
        const float nrm = norms[e];
        float dot = 0.0f;
        for (int d = 0; d < D; d++)
            dot = __fadd_rn(dot, __fmul_rn(visc_operand_load(y, y_bf16, yat + d), g[d]));
        if (nrm <= 1e-12f) dot = 0.0f; /* below eps the norm is a constant */
        for (int d = 0; d < D; d++)
            o[d] = __fsub_rn(g[d], __fmul_rn(visc_operand_load(y, y_bf16, yat + d), dot)) / nrm;
    }
}

int visc_cuda_swin_qkv_operand(visc_cuda *ctx, float *qkv, float *qnorm, float *knorm,
                               const float *raw, int64_t rows, int H, int D) {
    const size_t n = (size_t)rows * 3 * H;
    if (n == 0) return 0;
    qkv_operand_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(qkv, qnorm, knorm, raw,
                                                                          rows, H, D, ctx->bf16);
    return visc_cuda_launched("swin q, k normalized into the operand form");
}

int visc_cuda_swin_normalize_heads_backward(visc_cuda *ctx, float *dx, int64_t ld_dx,
                                            const float *dy, int64_t ld_dy, const float *y,
                                            int64_t ld_y, const float *norms, int64_t rows, int H,
                                            int D) {
    const size_t n = (size_t)rows * H;
    if (n == 0) return 0;
    normalize_backward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        dx, ld_dx, dy, ld_dy, y, ctx->bf16, ld_y, norms, rows, H, D);
    return visc_cuda_launched("swin head normalization backward");
}

/* One thread per element of the merged rows [B, H/2, W/2, 4, C]. */
__global__ void merge_kernel(float *tokens, float *merged, int B, int H, int W, int C, int back) {
    const int Ho = H / 2, Wo = W / 2;
    const size_t n = (size_t)B * Ho * Wo * 4 * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(e % C), k = (int)(e / C % 4);
        const size_t r = e / ((size_t)4 * C);
        const size_t b = r / ((size_t)Ho * Wo);
        const int i = (int)(r % ((size_t)Ho * Wo)) / Wo, j = (int)(r % Wo);
        const int y = 2 * i + (k & 1), x = 2 * j + (k >> 1);
        const size_t t = (b * H * W + (size_t)y * W + x) * C + c;
        if (back) tokens[t] = merged[e];
        else merged[e] = tokens[t];
    }
}

int visc_cuda_swin_merge_copy(visc_cuda *ctx, float *tokens, float *merged, int B, int H, int W,
                              int C, int back) {
    const size_t n = (size_t)B * (H / 2) * (W / 2) * 4 * C;
    if (n == 0) return 0;
    merge_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(tokens, merged, B, H, W, C,
                                                                    back);
    return visc_cuda_launched("patch merging");
}

/* out[b, c] = (sum over n of in[b, n, c], in n order) / N, as the CPU */
__global__ void token_mean_kernel(float *out, const float *in, int B, int N, int C) {
    const size_t n = (size_t)B * C;
    const float inv = 1.0f / (float)N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t b = e / C;
        const int c = (int)(e % C);
        float s = 0.0f;
        for (int t = 0; t < N; t++) s += in[(b * N + t) * C + c];
        out[e] = s * inv;
    }
}

__global__ void token_mean_backward_kernel(float *din, const float *dout, int B, int N, int C) {
    const size_t n = (size_t)B * N * C;
    const float inv = 1.0f / (float)N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t b = e / ((size_t)N * C);
        din[e] = dout[b * C + e % C] * inv;
    }
}

int visc_cuda_token_mean_forward(visc_cuda *ctx, float *out, const float *in, int B, int N,
                                 int C) {
    const size_t n = (size_t)B * C;
    if (n == 0) return 0;
    token_mean_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, in, B, N, C);
    return visc_cuda_launched("token mean");
}

int visc_cuda_token_mean_backward(visc_cuda *ctx, float *din, const float *dout, int B, int N,
                                  int C) {
    const size_t n = (size_t)B * N * C;
    if (n == 0) return 0;
    token_mean_backward_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(din, dout, B, N,
                                                                                  C);
    return visc_cuda_launched("token mean backward");
}

/* hs[h] = exp(min(ls[h], log 100)) */
__global__ void head_scale_kernel(float *hs, const float *ls, int H) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < H) hs[h] = expf(fminf(ls[h], logf(100.0f)));
}

/* dls[h] = dhs[h] hs[h] where ls[h] <= log 100, else 0 (clamp's gradient, as torch) */
__global__ void head_scale_backward_kernel(float *dls, const float *ls, const float *dhs,
                                           const float *hs, int H) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h < H) dls[h] = ls[h] <= logf(100.0f) ? dhs[h] * hs[h] : 0.0f;
}

int visc_cuda_swin_head_scale(visc_cuda *ctx, float *hs, const float *logit_scale, int H) {
    head_scale_kernel<<<(H + 31) / 32, 32, 0, ctx->stream>>>(hs, logit_scale, H);
    return visc_cuda_launched("swin head scale");
}

int visc_cuda_swin_head_scale_backward(visc_cuda *ctx, float *dlogit_scale,
                                       const float *logit_scale, const float *dhs, const float *hs,
                                       int H) {
    head_scale_backward_kernel<<<(H + 31) / 32, 32, 0, ctx->stream>>>(dlogit_scale, logit_scale,
                                                                      dhs, hs, H);
    return visc_cuda_launched("swin head scale backward");
}

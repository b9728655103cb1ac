/* talking_heads.cu: CaiT's talking-heads attention step by step, the GPU
 * twins of models/talking_heads.c, and LayerScale (nn/layerscale.c).
 *
 * The [B, H, T, T] matrices are materialized as on the CPU (the heads are
 * mixed at every (i, j), which a fused kernel cannot express). One thread
 * per output element, summing in the CPU's order with the CPU's rounding
 * where the sum is short (the head mix), a warp per row for the softmax,
 * and a block per weight for the mix's gradient (double sums, a fixed
 * tree). Plain kernels: CaiT is not one of the benchmark's models. The
 * qkv rows, and the output att that only the output projection reads, are
 * in the operand form (bf16 under bf16, the argument b16: the projections
 * write and read them so); the [B, H, T, T] matrices are fp32. */
#include <math.h>

#include "common.cuh"

#define GRID_STRIDE(e, n)                                                                          \
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (n);                       \
         e += (size_t)gridDim.x * blockDim.x)

/* the index of q_i of head h of sequence b in the qkv rows (k: + C, v: + 2C) */
__device__ __forceinline__ int64_t q_at(const visc_th_dims &d, size_t b, int i, int h) {
    return (int64_t)((b * d.T + i) * 3 * d.C + (size_t)h * d.D);
}

/* S[b, h, i, j] = scale q_i . k_j */
__global__ void th_scores_kernel(float *S, const void *qkv, int b16, visc_th_dims d) {
    const size_t n = (size_t)d.B * d.H * d.T * d.T;
    GRID_STRIDE(e, n) {
        const int j = (int)(e % d.T), i = (int)(e / d.T % d.T), h = (int)(e / ((size_t)d.T * d.T) % d.H);
        const size_t b = e / ((size_t)d.T * d.T * d.H);
        const int64_t q = q_at(d, b, i, h), k = q_at(d, b, j, h) + d.C;
        float s = 0.0f;
        for (int x = 0; x < d.D; x++)
            s = fmaf(visc_operand_load(qkv, b16, q + x), visc_operand_load(qkv, b16, k + x), s);
        S[e] = d.scale * s;
    }
}

/* out[b, f, t] = bias[f] + sum_g W[f, g] in[b, g, t] (W[g, f] transposed) */
__global__ void th_mix_kernel(float *out, const float *in, const float *W, const float *bias,
                              int B, int H, size_t TT, int transpose) {
    const size_t n = (size_t)B * H * TT;
    GRID_STRIDE(e, n) {
        const size_t t = e % TT, bf = e / TT;
        const int f = (int)(bf % H);
        const size_t b = bf / H;
        float o = bias ? bias[f] : 0.0f;
        for (int g = 0; g < H; g++) {
            const float w = transpose ? W[g * H + f] : W[f * H + g];
            o = __fadd_rn(o, __fmul_rn(w, in[(b * H + g) * TT + t]));
        }
        out[e] = o;
    }
}

/* softmax of each row of T, one warp per row */
__global__ void th_softmax_kernel(float *P, size_t rows, int T) {
    const int lane = threadIdx.x % 32;
    for (size_t r = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; r < rows;
         r += (size_t)gridDim.x * blockDim.x / 32) {
        float *row = P + r * T, mx = -INFINITY, sum = 0.0f;
        for (int j = lane; j < T; j += 32) mx = fmaxf(mx, row[j]);
        mx = visc_warp_max(mx);
        for (int j = lane; j < T; j += 32) sum += expf(row[j] - mx);
        const float inv = 1.0f / visc_warp_sum(sum);
        for (int j = lane; j < T; j += 32) row[j] = expf(row[j] - mx) * inv;
    }
}

/* dS = P (dS - <P, dS>) per row, one warp per row */
__global__ void th_softmax_backward_kernel(float *dS, const float *P, size_t rows, int T) {
    const int lane = threadIdx.x % 32;
    for (size_t r = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) / 32; r < rows;
         r += (size_t)gridDim.x * blockDim.x / 32) {
        float *g = dS + r * T;
        const float *p = P + r * T;
        float dot = 0.0f;
        for (int j = lane; j < T; j += 32) dot = fmaf(p[j], g[j], dot);
        dot = visc_warp_sum(dot);
        __syncwarp();
        for (int j = lane; j < T; j += 32) g[j] = p[j] * (g[j] - dot);
    }
}

/* att[b, i, f, x] = sum_j A[b, f, i, j] v_j[x] */
__global__ void th_apply_kernel(void *att, const float *A, const void *qkv, int b16,
                                visc_th_dims d) {
    const size_t n = (size_t)d.B * d.T * d.C;
    GRID_STRIDE(e, n) {
        const int c = (int)(e % d.C), i = (int)(e / d.C % d.T), f = c / d.D, x = c % d.D;
        const size_t b = e / ((size_t)d.C * d.T);
        const float *a = A + ((b * d.H + f) * d.T + i) * d.T;
        float o = 0.0f;
        for (int j = 0; j < d.T; j++)
            o = fmaf(a[j], visc_operand_load(qkv, b16, q_at(d, b, j, f) + 2 * d.C + x), o);
        visc_operand_store(att, b16, (int64_t)e, o);
    }
}

/* dA[b, f, i, j] = datt[b, i, f, :] . v_j */
__global__ void th_grad_a_kernel(float *dA, const float *datt, const void *qkv, int b16,
                                 visc_th_dims d) {
    const size_t n = (size_t)d.B * d.H * d.T * d.T;
    GRID_STRIDE(e, n) {
        const int j = (int)(e % d.T), i = (int)(e / d.T % d.T), f = (int)(e / ((size_t)d.T * d.T) % d.H);
        const size_t b = e / ((size_t)d.T * d.T * d.H);
        const float *g = datt + (b * d.T + i) * d.C + (size_t)f * d.D;
        const int64_t v = q_at(d, b, j, f) + 2 * d.C;
        float s = 0.0f;
        for (int x = 0; x < d.D; x++) s = fmaf(g[x], visc_operand_load(qkv, b16, v + x), s);
        dA[e] = s;
    }
}

/* dv_j[x] = sum_i A[b, f, i, j] datt[b, i, f, x], into the v part of dqkv */
__global__ void th_grad_v_kernel(float *dqkv, const float *A, const float *datt, visc_th_dims d) {
    const size_t n = (size_t)d.B * d.T * d.C, TT = (size_t)d.T * d.T;
    GRID_STRIDE(e, n) {
        const int c = (int)(e % d.C), j = (int)(e / d.C % d.T), f = c / d.D, x = c % d.D;
        const size_t b = e / ((size_t)d.C * d.T);
        const float *a = A + (b * d.H + f) * TT + j;
        float o = 0.0f;
        for (int i = 0; i < d.T; i++)
            o = fmaf(a[(size_t)i * d.T], datt[(b * d.T + i) * d.C + (size_t)f * d.D + x], o);
        dqkv[(b * d.T + j) * 3 * d.C + 2 * d.C + c] = o;
    }
}

/* dq_i = scale sum_j dS[i, j] k_j, dk_i = scale sum_j dS[j, i] q_j, into dqkv */
__global__ void th_grad_qk_kernel(float *dqkv, const float *dS, const void *qkv, int b16,
                                  visc_th_dims d) {
    const size_t n = (size_t)d.B * d.T * d.C, TT = (size_t)d.T * d.T;
    GRID_STRIDE(e, n) {
        const int c = (int)(e % d.C), i = (int)(e / d.C % d.T), h = c / d.D, x = c % d.D;
        const size_t b = e / ((size_t)d.C * d.T);
        const float *row = dS + ((b * d.H + h) * d.T + i) * d.T;
        const float *col = dS + (b * d.H + h) * TT + i;
        float oq = 0.0f, ok = 0.0f;
        for (int j = 0; j < d.T; j++) {
            const int64_t q = q_at(d, b, j, h);
            oq = fmaf(d.scale * row[j], visc_operand_load(qkv, b16, q + d.C + x), oq);
            ok = fmaf(d.scale * col[(size_t)j * d.T], visc_operand_load(qkv, b16, q + x), ok);
        }
        float *o = dqkv + (b * d.T + i) * 3 * d.C + c;
        o[0] = oq;
        o[d.C] = ok;
    }
}

/* dW[f, g] = sum_b <dY[b, f], X[b, g]> (blocks f H + g), db[f] = sum dY[b, f]
 * (blocks H H + f): one block per output, double partials, a fixed tree. */
__global__ void th_mix_grad_kernel(float *dW, float *db, const float *dY, const float *X, int B,
                                   int H, size_t TT) {
    __shared__ double part[256];
    const int fg = blockIdx.x, f = fg < H * H ? fg / H : fg - H * H, g = fg < H * H ? fg % H : -1;
    double s = 0.0;
    for (size_t e = threadIdx.x; e < (size_t)B * TT; e += blockDim.x) {
        const size_t b = e / TT, t = e % TT;
        const double y = dY[(b * H + f) * TT + t];
        s += g >= 0 ? y * X[(b * H + g) * TT + t] : y;
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (g >= 0) dW[f * H + g] = (float)part[0];
        else db[f] = (float)part[0];
    }
}

static unsigned warp_blocks(size_t rows) { return visc_cuda_blocks(rows * 32, 256); }

int visc_cuda_th_scores(visc_cuda *ctx, float *S, const float *qkv, const visc_th_dims *d) {
    const size_t n = (size_t)d->B * d->H * d->T * d->T;
    th_scores_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(S, qkv, ctx->bf16, *d);
    return visc_cuda_launched("talking heads: scores");
}

int visc_cuda_th_mix(visc_cuda *ctx, float *out, const float *in, const float *W,
                     const float *bias, int B, int H, size_t TT, int transpose) {
    const size_t n = (size_t)B * H * TT;
    th_mix_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, in, W, bias, B, H, TT,
                                                                     transpose);
    return visc_cuda_launched("talking heads: head mix");
}

int visc_cuda_th_softmax(visc_cuda *ctx, float *P, size_t rows, int T) {
    th_softmax_kernel<<<warp_blocks(rows), 256, 0, ctx->stream>>>(P, rows, T);
    return visc_cuda_launched("talking heads: softmax");
}

int visc_cuda_th_apply(visc_cuda *ctx, float *att, const float *A, const float *qkv,
                       const visc_th_dims *d) {
    const size_t n = (size_t)d->B * d->T * d->C;
    th_apply_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(att, A, qkv, ctx->bf16,
                                                                        *d);
    return visc_cuda_launched("talking heads: A v");
}

int visc_cuda_th_grad_a(visc_cuda *ctx, float *dA, const float *datt, const float *qkv,
                        const visc_th_dims *d) {
    const size_t n = (size_t)d->B * d->H * d->T * d->T;
    th_grad_a_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(dA, datt, qkv, ctx->bf16,
                                                                         *d);
    return visc_cuda_launched("talking heads: dA");
}

int visc_cuda_th_grad_v(visc_cuda *ctx, float *dqkv, const float *A, const float *datt,
                        const visc_th_dims *d) {
    const size_t n = (size_t)d->B * d->T * d->C;
    th_grad_v_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(dqkv, A, datt, *d);
    return visc_cuda_launched("talking heads: dv");
}

int visc_cuda_th_mix_grad(visc_cuda *ctx, float *dW, float *db, const float *dY, const float *X,
                          int B, int H, size_t TT) {
    th_mix_grad_kernel<<<H * H + H, 256, 0, ctx->stream>>>(dW, db, dY, X, B, H, TT);
    return visc_cuda_launched("talking heads: head mix gradient");
}

int visc_cuda_th_softmax_backward(visc_cuda *ctx, float *dS, const float *P, size_t rows, int T) {
    th_softmax_backward_kernel<<<warp_blocks(rows), 256, 0, ctx->stream>>>(dS, P, rows, T);
    return visc_cuda_launched("talking heads: softmax backward");
}

int visc_cuda_th_grad_qk(visc_cuda *ctx, float *dqkv, const float *dS, const float *qkv,
                         const visc_th_dims *d) {
    const size_t n = (size_t)d->B * d->T * d->C;
    th_grad_qk_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(dqkv, dS, qkv, ctx->bf16,
                                                                          *d);
    return visc_cuda_launched("talking heads: dq dk");
}

/* ---- LayerScale ---- */

__global__ void layerscale_kernel(float *out, const float *in, const float *gamma, size_t n,
                                  int C) {
    GRID_STRIDE(e, n) out[e] = in[e] * gamma[e % C];
}

/* dgamma[c] = sum over rows, in order, of dout * in (the CPU's order) */
__global__ void layerscale_grad_kernel(float *dgamma, const float *dout, const float *in,
                                       int64_t rows, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int64_t r = 0; r < rows; r++) s = __fadd_rn(s, __fmul_rn(dout[r * C + c], in[r * C + c]));
    dgamma[c] = s;
}

int visc_cuda_layerscale_forward(visc_cuda *ctx, float *out, const float *in, const float *gamma,
                                 int64_t rows, int C) {
    const size_t n = (size_t)rows * C;
    if (n == 0) return 0;
    layerscale_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, in, gamma, n, C);
    return visc_cuda_launched("layerscale");
}

int visc_cuda_layerscale_backward(visc_cuda *ctx, float *din, float *dgamma, const float *dout,
                                  const float *in, const float *gamma, int64_t rows, int C) {
    if (dgamma) {
        layerscale_grad_kernel<<<(C + 127) / 128, 128, 0, ctx->stream>>>(dgamma, dout, in, rows, C);
        if (visc_cuda_launched("layerscale gradient")) return -1;
    }
    /* after dgamma: din may alias dout */
    return din ? visc_cuda_layerscale_forward(ctx, din, dout, gamma, rows, C) : 0;
}

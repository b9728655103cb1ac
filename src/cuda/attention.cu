/* attention.cu: fused multi-head scaled-dot-product attention, forward and
 * backward, the GPU twin of visc_attention_* (src/nn/attention.c): the same
 * descriptor (visc_attention: strides, per-head scale, bias, window masks),
 * with its pointers on the device.
 *
 * Nothing of size N x N is kept: forward runs over key tiles with a running
 * maximum and sum (flash-style) and saves each row's log-sum-exp; backward
 * recomputes the probabilities from it, once from the query side (dQ) and
 * once from the key side (dK, dV), so that every output element is summed
 * by one warp in a fixed order: no atomics, the same bits on every run.
 *
 *   forward    grid (B*H pairs, row blocks); a warp owns 4 query rows; K and V
 *              tiles of 32 keys in shared memory, one key per lane for the
 *              scores, the output accumulated 4 values of D per lane
 *   delta      delta_i = dO_i . O_i, one warp per row
 *   backward   query side: dS_ij = P_ij (dO_i . V_j - delta_i),
 *              dQ_i = s_h sum_j dS_ij K_j; also dS itself when the bias has a
 *              gradient (dbias = its sum over sequences, a column sum) and
 *              sum_j dS_ij (Q_i . K_j) per row for dhead_scale;
 *              key side: dV_j = sum_i P_ij dO_i, dK_j = s_h sum_i dS_ij Q_i
 * Head dimension up to 128 (ViT, DeiT, CaiT, Swin: 32-64).
 *
 * That is the fp32 form. A context that multiplies in bf16 takes the same
 * calls to attention_tc.cu instead: the products on tensor cores, with the
 * N x N matrices made a chunk of sequences at a time. The delta and
 * dhead_scale sums here serve both. */
#include <cuda_bf16.h>
#include <math.h>

#include "attention.cuh"

#define TILE 32    /* keys (query side) or queries (key side) per shared tile */
#define WARPS 4    /* per block */
#define ROWS 4     /* rows (query side) or keys (key side) per warp */
#define MAX_D 128  /* head dimension */
#define PER_LANE (MAX_D / 32)
#define DS_GROUP_BYTES ((size_t)32 << 20) /* dS of a group of sequences, for dbias */

struct visc_attn_state {
    void *buf; /* delta, the dhead_scale row partials, dS */
    size_t bytes;
};

void visc_attn_state_free(visc_cuda *ctx) {
    if (!ctx->attn) return;
    visc_cuda_free(ctx, ctx->attn->buf);
    free(ctx->attn);
    ctx->attn = NULL;
}

static float *attn_workspace(visc_cuda *ctx, size_t bytes) {
    if (!ctx->attn) {
        ctx->attn = (visc_attn_state *)calloc(1, sizeof(visc_attn_state));
        if (!ctx->attn) {
            visc_set_error("out of host memory for the attention workspace");
            return NULL;
        }
    }
    return (float *)visc_cuda_grow(ctx, &ctx->attn->buf, &ctx->attn->bytes, bytes);
}

/* rows [n, D] at row stride `stride` of src into a shared tile of TILE rows
 * at stride Dp (zeros beyond n). */
__device__ __forceinline__ void load_tile(float *dst, const float *src, int64_t stride, int n,
                                          int D, int Dp) {
    for (int e = threadIdx.x; e < TILE * D; e += blockDim.x) {
        const int r = e / D, d = e % D;
        dst[r * Dp + d] = r < n ? src[r * stride + d] : 0.0f;
    }
}

__device__ __forceinline__ float dot(const float *x, const float *y, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s = fmaf(x[d], y[d], s);
    return s;
}

/* The key tile starting at key t0: K and V rows into shared memory (every
 * thread of the block takes part); returns how many keys it holds. */
__device__ __forceinline__ int load_kv_tile(float *Ks, float *Vs, const float *K, const float *V,
                                            const visc_attention &a, int t0, int Dp) {
    const int n = min(TILE, a.Nk - t0);
    __syncthreads(); /* the previous tile is no longer read */
    load_tile(Ks, K + t0 * a.k_sn, a.k_sn, n, a.D, Dp);
    load_tile(Vs, V + t0 * a.v_sn, a.v_sn, n, a.D, Dp);
    __syncthreads();
    return n;
}

/* One row of D floats into a warp's shared slot. */
__device__ __forceinline__ void load_row(float *dst, const float *src, int D, int lane) {
    __syncwarp(); /* the previous row is no longer read */
    for (int d = lane; d < D; d += 32) dst[d] = src[d];
    __syncwarp();
}

/* ---- forward ---- */

__global__ void __launch_bounds__(WARPS * 32)
    attention_forward_kernel(visc_attention a, float *out, float *lse, const float *q,
                             const float *k, const float *v) {
    extern __shared__ float smem[];
    const int D = a.D, Dp = D + 1; /* padded rows: lanes reading rows hit different banks */
    float *Ks = smem, *Vs = Ks + TILE * Dp, *Qs = Vs + TILE * Dp;
    const int pair = blockIdx.x, b = pair / a.H, h = pair % a.H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float *Q = q + b * a.q_sb + h * a.q_sh, *K = k + b * a.k_sb + h * a.k_sh;
    const float *V = v + b * a.v_sb + h * a.v_sh;
    const float sh = visc_attn_head_scale(a, h);
    const int row0 = (blockIdx.y * WARPS + warp) * ROWS;
    float *qs = Qs + warp * D;
    float m[ROWS], l[ROWS], acc[ROWS][PER_LANE];
    #pragma unroll
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        #pragma unroll
        for (int t = 0; t < PER_LANE; t++) acc[r][t] = 0.0f;
    }
    for (int t0 = 0; t0 < a.Nk; t0 += TILE) {
        const int n = load_kv_tile(Ks, Vs, K, V, a, t0, Dp);
        #pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const int i = row0 + r;
            if (i >= a.Nq) continue; /* (rows grow: the rest are out too) */
            load_row(qs, Q + i * a.q_sn, D, lane);
            const int j = t0 + lane;
            const float s = lane < n ? visc_attn_score(a, dot(qs, Ks + lane * Dp, D), sh, b, h, i, j)
                                     : -INFINITY;
            const float mn = fmaxf(m[r], visc_warp_max(s));
            if (mn == -INFINITY) continue; /* every score so far is -inf */
            const float corr = expf(m[r] - mn), p = expf(s - mn);
            l[r] = l[r] * corr + visc_warp_sum(p);
            #pragma unroll
            for (int t = 0; t < PER_LANE; t++) acc[r][t] *= corr;
            for (int jj = 0; jj < n; jj++) {
                const float pj = __shfl_sync(0xffffffffu, p, jj);
                const float *vr = Vs + jj * Dp;
                #pragma unroll
                for (int t = 0; t < PER_LANE; t++) {
                    const int d = lane + 32 * t;
                    if (d < D) acc[r][t] = fmaf(pj, vr[d], acc[r][t]);
                }
            }
            m[r] = mn;
        }
    }
    float *O = out + b * a.o_sb + h * a.o_sh;
    #pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int i = row0 + r;
        if (i >= a.Nq) continue; /* (rows grow: the rest are out too) */
        /* a row with every score -inf: output 0, lse +inf (as the CPU) */
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        #pragma unroll
        for (int t = 0; t < PER_LANE; t++) {
            const int d = lane + 32 * t;
            if (d < D) O[i * a.o_sn + d] = acc[r][t] * inv;
        }
        if (lane == 0) lse[(int64_t)pair * a.Nq + i] = l[r] > 0.0f ? m[r] + logf(l[r]) : INFINITY;
    }
}

/* ---- backward ---- */

/* delta[pair, i] = dO_i . O_i, one warp per row. round_dout: dO as its
 * bf16 rounding, the dO the tensor cores' products take (so that the
 * scores' gradients of a row still sum to zero); out_bf16: O is kept in
 * bf16 (the projection's operand). */
__global__ void attention_delta_kernel(visc_attention a, float *delta, const float *dout,
                                       const void *out, int round_dout, int out_bf16) {
    const int64_t rows = (int64_t)a.B * a.H * a.Nq;
    const int lane = threadIdx.x % 32;
    for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; w < rows;
         w += (int64_t)gridDim.x * blockDim.x / 32) {
        const int i = (int)(w % a.Nq), pair = (int)(w / a.Nq), b = pair / a.H, h = pair % a.H;
        const float *dO = dout + b * a.o_sb + h * a.o_sh + i * a.o_sn;
        const int64_t at = b * a.o_sb + h * a.o_sh + i * a.o_sn;
        float s = 0.0f;
        for (int d = lane; d < a.D; d += 32) {
            const float g = round_dout ? __bfloat162float(__float2bfloat16_rn(dO[d])) : dO[d];
            const float o = out_bf16 ? __bfloat162float(((const __nv_bfloat16 *)out)[at + d])
                                     : ((const float *)out)[at + d];
            s = fmaf(g, o, s);
        }
        s = visc_warp_sum(s);
        if (lane == 0) delta[w] = s;
    }
}

/* The query side: dQ, and dS / the dhead_scale row partials when asked. */
__global__ void __launch_bounds__(WARPS * 32)
    attention_dq_kernel(visc_attention a, float *dq, float *ds_out, float *hs_rows,
                        const float *dout, const float *q, const float *k, const float *v,
                        const float *lse, const float *delta) {
    extern __shared__ float smem[];
    const int D = a.D, Dp = D + 1;
    float *Ks = smem, *Vs = Ks + TILE * Dp, *Qs = Vs + TILE * Dp, *DOs = Qs + WARPS * D;
    const int pair = blockIdx.x, b = pair / a.H, h = pair % a.H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float *Q = q + b * a.q_sb + h * a.q_sh, *K = k + b * a.k_sb + h * a.k_sh;
    const float *V = v + b * a.v_sb + h * a.v_sh, *dO = dout + b * a.o_sb + h * a.o_sh;
    const float sh = visc_attn_head_scale(a, h);
    const int row0 = (blockIdx.y * WARPS + warp) * ROWS;
    float *qs = Qs + warp * D, *dos = DOs + warp * D;
    float acc[ROWS][PER_LANE], hs[ROWS];
    #pragma unroll
    for (int r = 0; r < ROWS; r++) {
        hs[r] = 0.0f;
        #pragma unroll
        for (int t = 0; t < PER_LANE; t++) acc[r][t] = 0.0f;
    }
    for (int t0 = 0; t0 < a.Nk; t0 += TILE) {
        const int n = load_kv_tile(Ks, Vs, K, V, a, t0, Dp);
        #pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const int i = row0 + r;
            if (i >= a.Nq) continue; /* (rows grow: the rest are out too) */
            load_row(qs, Q + i * a.q_sn, D, lane);
            load_row(dos, dO + i * a.o_sn, D, lane);
            const int64_t row = (int64_t)pair * a.Nq + i;
            const int j = t0 + lane;
            float ds = 0.0f;
            if (lane < n) {
                const float raw = dot(qs, Ks + lane * Dp, D);
                const float p = expf(visc_attn_score(a, raw, sh, b, h, i, j) - lse[row]);
                ds = p * (dot(dos, Vs + lane * Dp, D) - delta[row]);
                hs[r] = fmaf(ds, raw, hs[r]);
                if (ds_out) ds_out[row * a.Nk + j] = ds;
            }
            for (int jj = 0; jj < n; jj++) {
                const float dj = __shfl_sync(0xffffffffu, ds, jj);
                const float *kr = Ks + jj * Dp;
                #pragma unroll
                for (int t = 0; t < PER_LANE; t++) {
                    const int d = lane + 32 * t;
                    if (d < D) acc[r][t] = fmaf(dj, kr[d], acc[r][t]);
                }
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int i = row0 + r;
        if (i >= a.Nq) continue; /* (rows grow: the rest are out too) */
        if (dq) {
            float *dQ = dq + b * a.q_sb + h * a.q_sh + i * a.q_sn;
            #pragma unroll
            for (int t = 0; t < PER_LANE; t++) {
                const int d = lane + 32 * t;
                if (d < D) dQ[d] = sh * acc[r][t];
            }
        }
        const float total = visc_warp_sum(hs[r]);
        if (hs_rows && lane == 0) hs_rows[(int64_t)pair * a.Nq + i] = total;
    }
}

/* The key side: dK and dV, each key's sums over the queries in one warp. */
__global__ void __launch_bounds__(WARPS * 32)
    attention_dkv_kernel(visc_attention a, float *dk, float *dv, const float *dout,
                         const float *q, const float *k, const float *v, const float *lse,
                         const float *delta) {
    extern __shared__ float smem[];
    const int D = a.D, Dp = D + 1;
    float *Qt = smem, *DOt = Qt + TILE * Dp, *Lt = DOt + TILE * Dp, *Dt = Lt + TILE;
    float *Kw = Dt + TILE, *Vw = Kw + WARPS * D;
    const int pair = blockIdx.x, b = pair / a.H, h = pair % a.H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float *Q = q + b * a.q_sb + h * a.q_sh, *K = k + b * a.k_sb + h * a.k_sh;
    const float *V = v + b * a.v_sb + h * a.v_sh, *dO = dout + b * a.o_sb + h * a.o_sh;
    const float sh = visc_attn_head_scale(a, h);
    const int key0 = (blockIdx.y * WARPS + warp) * ROWS;
    float *ks = Kw + warp * D, *vs = Vw + warp * D;
    float ak[ROWS][PER_LANE], av[ROWS][PER_LANE];
    #pragma unroll
    for (int r = 0; r < ROWS; r++)
        #pragma unroll
        for (int t = 0; t < PER_LANE; t++) ak[r][t] = av[r][t] = 0.0f;
    for (int t0 = 0; t0 < a.Nq; t0 += TILE) {
        const int n = min(TILE, a.Nq - t0);
        __syncthreads();
        load_tile(Qt, Q + t0 * a.q_sn, a.q_sn, n, D, Dp);
        load_tile(DOt, dO + t0 * a.o_sn, a.o_sn, n, D, Dp);
        for (int e = threadIdx.x; e < TILE; e += blockDim.x) {
            const int64_t row = (int64_t)pair * a.Nq + t0 + e;
            Lt[e] = e < n ? lse[row] : INFINITY;
            Dt[e] = e < n ? delta[row] : 0.0f;
        }
        __syncthreads();
        #pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const int j = key0 + r;
            if (j >= a.Nk) continue;
            load_row(ks, K + j * a.k_sn, D, lane);
            load_row(vs, V + j * a.v_sn, D, lane);
            float p = 0.0f, ds = 0.0f;
            if (lane < n) {
                const int i = t0 + lane;
                const float raw = dot(Qt + lane * Dp, ks, D);
                p = expf(visc_attn_score(a, raw, sh, b, h, i, j) - Lt[lane]);
                ds = p * (dot(DOt + lane * Dp, vs, D) - Dt[lane]);
            }
            for (int ii = 0; ii < n; ii++) {
                const float pi = __shfl_sync(0xffffffffu, p, ii);
                const float di = __shfl_sync(0xffffffffu, ds, ii);
                const float *qr = Qt + ii * Dp, *gr = DOt + ii * Dp;
                #pragma unroll
                for (int t = 0; t < PER_LANE; t++) {
                    const int d = lane + 32 * t;
                    if (d < D) {
                        av[r][t] = fmaf(pi, gr[d], av[r][t]);
                        ak[r][t] = fmaf(di, qr[d], ak[r][t]);
                    }
                }
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int j = key0 + r;
        if (j >= a.Nk) continue;
        float *dK = dk + b * a.k_sb + h * a.k_sh + j * a.k_sn;
        float *dV = dv + b * a.v_sb + h * a.v_sh + j * a.v_sn;
        #pragma unroll
        for (int t = 0; t < PER_LANE; t++) {
            const int d = lane + 32 * t;
            if (d < D) {
                dK[d] = sh * ak[r][t];
                dV[d] = av[r][t];
            }
        }
    }
}

/* dhead_scale[h] = the sum over sequences and rows of the row partials,
 * one warp per head in a fixed order. */
__global__ void attention_head_scale_kernel(visc_attention a, float *dhead_scale,
                                            const float *hs_rows) {
    const int h = blockIdx.x, lane = threadIdx.x;
    float s = 0.0f;
    for (int64_t e = lane; e < (int64_t)a.B * a.Nq; e += 32) {
        const int64_t b = e / a.Nq, i = e % a.Nq;
        s += hs_rows[(b * a.H + h) * a.Nq + i];
    }
    s = visc_warp_sum(s);
    if (lane == 0) dhead_scale[h] = s;
}

static int head_scale_sums(visc_cuda *ctx, const visc_attention *a, float *dhead_scale,
                           const float *hs_rows) {
    attention_head_scale_kernel<<<a->H, 32, 0, ctx->stream>>>(*a, dhead_scale, hs_rows);
    return visc_cuda_launched("attention backward (head scale)");
}

static int attention_check(const visc_attention *a) {
    if (a->B < 0 || a->H <= 0 || a->Nq <= 0 || a->Nk <= 0 || a->D <= 0 || a->D > MAX_D ||
        (a->mask && (a->nmask <= 0 || a->B % a->nmask != 0)))
        return visc_set_error("attention: unsupported shape (B %d, H %d, Nq %d, Nk %d, D %d, %d "
                              "masks; the GPU kernel takes D up to %d)",
                              a->B, a->H, a->Nq, a->Nk, a->D, a->nmask, MAX_D);
    if ((int64_t)a->B * a->H > 2147483647LL)
        return visc_set_error("attention: %d x %d sequences exceed one grid", a->B, a->H);
    return 0;
}

static dim3 attention_grid(const visc_attention *a, int rows) {
    return dim3((unsigned)(a->B * a->H), (unsigned)((rows + WARPS * ROWS - 1) / (WARPS * ROWS)));
}

/* out (strides o_*) <- rows, rounded to bf16; rows packed [B, Nq, H D]. */
__global__ void round_output_kernel(visc_attention a, __nv_bfloat16 *out, const float *rows) {
    const int64_t n = (int64_t)a.B * a.Nq * a.H * a.D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(e % a.D), h = (int)(e / a.D % a.H), i = (int)(e / a.D / a.H % a.Nq);
        const int64_t b = e / a.D / a.H / a.Nq;
        out[b * a.o_sb + h * a.o_sh + i * a.o_sn + d] = __float2bfloat16_rn(rows[e]);
    }
}

/* The bf16 products' form into a bf16 out: the output rows in fp32 in the
 * workspace first (packed [B, Nq, H D]), then rounded to out's strides. */
static int products_to_bf16(visc_cuda *ctx, const visc_attention *a, void *out, float *lse,
                            const float *q, const float *k, const float *v) {
    const size_t rows_bytes = (sizeof(float) * a->B * a->Nq * a->H * a->D + 255) / 256 * 256;
    char *work = (char *)attn_workspace(ctx, rows_bytes + visc_attention_tc_bytes(ctx, a));
    if (!work) return -1;
    visc_attention packed = *a;
    packed.o_sn = (int64_t)a->H * a->D;
    packed.o_sh = a->D;
    packed.o_sb = a->Nq * packed.o_sn;
    if (visc_attention_tc_forward(ctx, &packed, (float *)work, lse, q, k, v, work + rows_bytes))
        return -1;
    round_output_kernel<<<visc_cuda_blocks((size_t)a->B * a->Nq * a->H * a->D, 256), 256, 0,
                          ctx->stream>>>(*a, (__nv_bfloat16 *)out, (const float *)work);
    return visc_cuda_launched("attention (bf16): the output rounded");
}

/* out: fp32, or bf16 with out_bf16 (only under bf16: the operand form). */
static int attention_forward(visc_cuda *ctx, const visc_attention *a, void *out, int out_bf16,
                             float *lse, const float *q, const float *k, const float *v) {
    if (attention_check(a)) return -1;
    if (a->B == 0) return 0;
    if (ctx->bf16 && visc_attention_flash_ready(ctx, a))
        return visc_attention_flash_forward(ctx, a, out, out_bf16, lse, q, k, v);
    if (ctx->bf16 && out_bf16) return products_to_bf16(ctx, a, out, lse, q, k, v);
    if (ctx->bf16) {
        void *work = attn_workspace(ctx, visc_attention_tc_bytes(ctx, a));
        return work ? visc_attention_tc_forward(ctx, a, (float *)out, lse, q, k, v, work) : -1;
    }
    const size_t smem = sizeof(float) * (2 * TILE * (a->D + 1) + WARPS * a->D);
    attention_forward_kernel<<<attention_grid(a, a->Nq), WARPS * 32, smem, ctx->stream>>>(
        *a, (float *)out, lse, q, k, v);
    return visc_cuda_launched("attention forward");
}

int visc_cuda_attention_forward(visc_cuda *ctx, const visc_attention *a, float *out, float *lse,
                                const float *q, const float *k, const float *v) {
    return attention_forward(ctx, a, out, 0, lse, q, k, v);
}

int visc_cuda_attention_operand_forward(visc_cuda *ctx, const visc_attention *a, float *out,
                                        float *lse, const float *q, const float *k,
                                        const float *v) {
    /* under bf16 out's storage is untyped: it holds bf16, the projection's operand */
    return attention_forward(ctx, a, out, ctx->bf16, lse, q, k, v);
}

/* One side of the backward or both, by the fused bf16 kernels or the fp32
 * ones: the query side when dq, ds or hs_rows is asked, the key side when
 * dk (and dv) is. */
static int backward_sides(visc_cuda *ctx, const visc_attention *a, int fused, float *dq,
                          float *dk, float *dv, float *ds, float *hs_rows, const float *dout,
                          const float *q, const float *k, const float *v, const float *lse,
                          const float *delta) {
    if (fused)
        return visc_attention_flash_backward(ctx, a, dq, dk, dv, ds, hs_rows, dout, q, k, v, lse,
                                             delta);
    if (dq || ds || hs_rows) {
        const size_t smem = sizeof(float) * (2 * TILE * (a->D + 1) + 2 * WARPS * a->D);
        attention_dq_kernel<<<attention_grid(a, a->Nq), WARPS * 32, smem, ctx->stream>>>(
            *a, dq, ds, hs_rows, dout, q, k, v, lse, delta);
        if (visc_cuda_launched("attention backward (query side)")) return -1;
    }
    if (!dk) return 0;
    const size_t smem = sizeof(float) * (2 * TILE * (a->D + 1) + 2 * TILE + 2 * WARPS * a->D);
    attention_dkv_kernel<<<attention_grid(a, a->Nk), WARPS * 32, smem, ctx->stream>>>(
        *a, dk, dv, dout, q, k, v, lse, delta);
    return visc_cuda_launched("attention backward (key side)");
}

/* Sequences whose dS the query side writes at once when dbias is asked: as
 * many as DS_GROUP_BYTES (or the context's attention cap) holds, a multiple
 * of the masks' period, since a group's masks are indexed from its first
 * sequence (b % nmask). */
static int ds_group_sequences(const visc_cuda *ctx, const visc_attention *a) {
    const size_t cap = ctx->attn_chunk_bytes ? ctx->attn_chunk_bytes : DS_GROUP_BYTES;
    const size_t period = a->mask ? (size_t)a->nmask : 1;
    const size_t per_period = sizeof(float) * period * a->H * a->Nq * a->Nk;
    const size_t n = (cap / per_period < 1 ? 1 : cap / per_period) * period;
    return n > (size_t)a->B ? a->B : (int)n;
}

/* The query side, a group of sequences at a time, each group's dS summed
 * into dbias (the first group's sums replace it): dS of all sequences at
 * once would take B H Nq Nk floats, 470 MB at Swin-T's first stage at
 * batch 256. The groups and the order of the sums are fixed by the shape,
 * so the bits are the same on every run. */
static int query_side_in_groups(visc_cuda *ctx, const visc_attention *a, int fused, float *dq,
                                float *dbias, float *ds, int group, float *hs_rows,
                                const float *dout, const float *q, const float *k,
                                const float *v, const float *lse, const float *delta) {
    const int64_t per_seq = (int64_t)a->H * a->Nq; /* rows of lse, delta, hs_rows */
    for (int b0 = 0; b0 < a->B; b0 += group) {
        visc_attention g = *a;
        g.B = a->B - b0 < group ? a->B - b0 : group;
        if (backward_sides(ctx, &g, fused, dq ? dq + b0 * a->q_sb : NULL, NULL, NULL, ds,
                           hs_rows ? hs_rows + b0 * per_seq : NULL, dout + b0 * a->o_sb,
                           q + b0 * a->q_sb, k + b0 * a->k_sb, v + b0 * a->v_sb,
                           lse + b0 * per_seq, delta + b0 * per_seq) ||
            visc_cuda_column_sums_into(ctx, dbias, ds, g.B, a->H * a->Nq * a->Nk, b0 > 0))
            return -1;
    }
    return 0;
}

static int attention_backward(visc_cuda *ctx, const visc_attention *a, float *dq, float *dk,
                              float *dv, float *dbias, float *dhead_scale, const float *dout,
                              const float *q, const float *k, const float *v, const void *out,
                              int out_bf16, const float *lse) {
    if (attention_check(a)) return -1;
    const int64_t rows = (int64_t)a->B * a->H * a->Nq;
    if (a->B == 0) {
        if (dbias &&
            visc_cuda_zero(ctx, dbias, sizeof(float) * (size_t)a->H * a->Nq * a->Nk))
            return -1;
        return dhead_scale ? visc_cuda_zero(ctx, dhead_scale, sizeof(float) * a->H) : 0;
    }
    /* delta [rows], the head-scale row partials [rows]; then dS of a group
     * of sequences [group H Nq, Nk] when dbias is asked (fp32, bf16 fused),
     * or the products' chunk (bf16) */
    const int fused = ctx->bf16 && visc_attention_flash_ready(ctx, a);
    const int products = ctx->bf16 && !fused;
    const int group = dbias && !products ? ds_group_sequences(ctx, a) : 0;
    const size_t head = (size_t)rows * (1 + (dhead_scale ? 1 : 0));
    const size_t tail = products ? visc_attention_tc_bytes(ctx, a)
                                 : sizeof(float) * (size_t)group * a->H * a->Nq * a->Nk;
    const size_t head_bytes = (sizeof(float) * head + 255) / 256 * 256;
    float *ws = attn_workspace(ctx, head_bytes + tail);
    if (!ws) return -1;
    float *delta = ws, *hs_rows = dhead_scale ? delta + rows : NULL;
    attention_delta_kernel<<<visc_cuda_blocks((size_t)rows * 32, 256), 256, 0, ctx->stream>>>(
        *a, delta, dout, out, ctx->bf16, out_bf16);
    if (visc_cuda_launched("attention backward (delta)")) return -1;
    if (products) {
        if (visc_attention_tc_backward(ctx, a, dq, dk, dv, dbias, hs_rows, dout, q, k, v, lse,
                                       delta, (char *)ws + head_bytes))
            return -1;
    } else if (dbias) {
        float *ds = (float *)((char *)ws + head_bytes);
        if (query_side_in_groups(ctx, a, fused, dq, dbias, ds, group, hs_rows, dout, q, k, v, lse,
                                 delta) ||
            backward_sides(ctx, a, fused, NULL, dk, dv, NULL, NULL, dout, q, k, v, lse, delta))
            return -1;
    } else if (backward_sides(ctx, a, fused, dq, dk, dv, NULL, hs_rows, dout, q, k, v, lse,
                              delta)) {
        return -1;
    }
    return dhead_scale ? head_scale_sums(ctx, a, dhead_scale, hs_rows) : 0;
}

int visc_cuda_attention_backward(visc_cuda *ctx, const visc_attention *a, float *dq, float *dk,
                                 float *dv, float *dbias, float *dhead_scale, const float *dout,
                                 const float *q, const float *k, const float *v, const float *out,
                                 const float *lse) {
    return attention_backward(ctx, a, dq, dk, dv, dbias, dhead_scale, dout, q, k, v, out, 0, lse);
}

int visc_cuda_attention_operand_backward(visc_cuda *ctx, const visc_attention *a, float *dq,
                                         float *dk, float *dv, float *dbias, float *dhead_scale,
                                         const float *dout, const float *q, const float *k,
                                         const float *v, const float *out, const float *lse) {
    return attention_backward(ctx, a, dq, dk, dv, dbias, dhead_scale, dout, q, k, v, out,
                              ctx->bf16, lse);
}

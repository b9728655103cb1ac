/* attention_flash.cu: bf16 attention fused on tensor cores, for heads of
 * at most 64 dimensions (ViT, DeiT, CaiT, Swin): attention_tc.cu's six
 * products without their N x N matrices, in the fp32 kernels' (attention.cu)
 * plan.
 *
 * Forward: a block of four warps takes 64 query rows of one (sequence,
 * head) pair, 16 rows a warp, and walks the keys 64 at a time, online
 * softmax style (FlashAttention): the tile's K and V rounded to bf16 in
 * shared memory; S = Q K^T on the tensor cores (wmma, fp32 sums); the
 * scores through visc_attn_score (scale, bias, mask) in shared memory,
 * where two lanes a row keep the running maximum m and sum l; P =
 * exp(score - m) in bf16; the output accumulator (fragments) rescaled by
 * exp(m_old - m_new) and O += P V. At the end O / l goes to out's strides
 * and m + log l to lse. Backward: see below.
 *
 * CUDA leaves a fragment's layout across lanes unspecified, so every
 * row-wise step goes through shared memory: the accumulators are stored,
 * scaled by rows and loaded back. The emulator (tests/gpu/emu/emu_wmma.h)
 * scatters accumulator elements over lanes to catch a kernel that assumes
 * otherwise.
 *
 * Against the products' form, forward's P is rounded before it is
 * normalized (exp(score - m) rather than exp(score - lse)): the same
 * relative error, 2^-9 per term. Shared memory: 45 KB a block forward,
 * 39 KB backward (under the 48 KB a launch gets without opting in). */
#include <cuda_bf16.h>
#include <math.h>
#include <mma.h>

#include "attention.cuh"

using namespace nvcuda;

typedef __nv_bfloat16 bf16;

#define ROWS 16  /* rows a warp (a fragment's) */
#define WARPS 4  /* a block's warps */
#define LDH 72   /* bf16 pitch of a tile's rows (up to 64 dimensions + 8: 16-byte multiples) */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bt;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* ---- what the three kernels share ----
 * Shared-memory arrays are 32-byte aligned structs whose arrays are each a
 * multiple of 32 bytes (wmma's pointers), their pitches multiples of 16
 * bytes (wmma's leading dimensions). */

/* A strided tensor as visc_attention addresses it: element (b, h, r, d)
 * at x[b sb + h sh + r sn + d], `rows` rows a (sequence, head) pair; fp32,
 * or bf16 (Q, K and V in the operand form, a.qkv_operand). */
struct strided {
    const float *x;
    int64_t sb, sh, sn;
    int rows;
    int bf16;
};

/* Q, K, V and dO of a descriptor (dO's strides are the output's). */
struct views {
    strided q, k, v, dout;
};
__device__ __forceinline__ views views_of(const visc_attention &a, const float *q, const float *k,
                                          const float *v, const float *dout) {
    return views{{q, a.q_sb, a.q_sh, a.q_sn, a.Nq, a.qkv_operand},
                 {k, a.k_sb, a.k_sh, a.k_sn, a.Nk, a.qkv_operand},
                 {v, a.v_sb, a.v_sh, a.v_sn, a.Nk, a.qkv_operand},
                 {dout, a.o_sb, a.o_sh, a.o_sn, a.Nq, 0}};
}

/* rows row0 .. row0 + n of pair (b, h) of t into dst as bf16 (0 beyond t's
 * rows or D), by threads tid, tid + threads, ... */
template <int DP>
__device__ __forceinline__ void load_rows(bf16 (*dst)[LDH], int n, const strided &t, int b, int h,
                                          int row0, int D, int tid, int threads) {
    for (int e = tid; e < n * DP; e += threads) {
        const int r = row0 + e / DP, d = e % DP;
        const int64_t at = b * t.sb + h * t.sh + r * t.sn + d;
        const bool in = r < t.rows && d < D;
        dst[e / DP][d] = t.bf16 ? (in ? ((const bf16 *)t.x)[at] : __float2bfloat16_rn(0.0f))
                                : __float2bfloat16_rn(in ? t.x[at] : 0.0f);
    }
}

/* A warp's fragments of its 16 rows of t, through a staging tile. */
template <int DP>
__device__ __forceinline__ void warp_fragments(frag_a *f, bf16 (*staging)[LDH], const strided &t,
                                               int b, int h, int row0, int D, int lane) {
    load_rows<DP>(staging, ROWS, t, b, h, row0, D, lane, 32);
    __syncwarp();
    for (int kk = 0; kk < DP / 16; kk++) wmma::load_matrix_sync(f[kk], &staging[0][kk * 16], LDH);
    __syncwarp(); /* read before the staging tile is written again */
}

/* stage[:, at + 16 n] = A T^T for a warp's 16 rows (A: its fragments) and
 * the tile's COLS rows T. */
template <int DP, int COLS, int LD>
__device__ __forceinline__ void products_with_tile(float (*stage)[LD], int at, const frag_a *f,
                                                   bf16 (*tile)[LDH]) {
    for (int n = 0; n < COLS / 16; n++) {
        frag_c c;
        wmma::fill_fragment(c, 0.0f);
        for (int kk = 0; kk < DP / 16; kk++) {
            frag_bt t;
            wmma::load_matrix_sync(t, &tile[n * 16][kk * 16], LDH);
            wmma::mma_sync(c, f[kk], t, c);
        }
        wmma::store_matrix_sync(&stage[0][at + n * 16], c, LD, wmma::mem_row_major);
    }
}

/* acc += A T for A [16, COLS] bf16 (lhs) and T the tile's COLS rows. */
template <int DP, int COLS, int LDA>
__device__ __forceinline__ void accumulate_with_tile(frag_c *acc, bf16 (*lhs)[LDA],
                                                     bf16 (*tile)[LDH]) {
    frag_a a[COLS / 16];
    for (int kk = 0; kk < COLS / 16; kk++) wmma::load_matrix_sync(a[kk], &lhs[0][kk * 16], LDA);
    for (int n = 0; n < DP / 16; n++)
        for (int kk = 0; kk < COLS / 16; kk++) {
            frag_b t;
            wmma::load_matrix_sync(t, &tile[kk * 16][n * 16], LDH);
            wmma::mma_sync(acc[n], a[kk], t, acc[n]);
        }
}

/* acc's 16 rows into the warp's stage (columns 0 .. DP). */
template <int DP, int LD>
__device__ __forceinline__ void stage_fragments(float (*stage)[LD], const frag_c *acc) {
    __syncwarp(); /* the stage is free */
    for (int n = 0; n < DP / 16; n++)
        wmma::store_matrix_sync(&stage[0][n * 16], acc[n], LD, wmma::mem_row_major);
    __syncwarp();
}

__device__ __forceinline__ void put(float *dst, float x) { *dst = x; }
__device__ __forceinline__ void put(bf16 *dst, float x) { *dst = __float2bfloat16_rn(x); }

/* acc's 16 rows, each lane's row times `scale`, to dst (rows row0 .. of a
 * pair, pitch sn; fp32, or bf16 each value rounded once), through the
 * warp's stage. */
template <int DP, int LD, typename T>
__device__ __forceinline__ void store_rows(T *dst, int64_t sn, int row0, int rows, int D,
                                           const frag_c *acc, float (*stage)[LD], float scale,
                                           int lane) {
    stage_fragments<DP, LD>(stage, acc);
    const int r = lane % ROWS;
    if (row0 + r < rows)
        for (int d = lane / ROWS; d < D; d += 2) put(&dst[(row0 + r) * sn + d], stage[r][d] * scale);
}

/* Where a thread of a (pairs, row tiles) grid is: its warp and lane, the
 * block's (sequence, head) pair and s_h, the warp's first row (query rows
 * in forward and on backward's query side, keys on its key side), and the
 * row r and half of it the lane takes in the row-wise steps. */
struct place {
    int warp, lane, b, h, row0, r, half;
    int64_t pair;
    float sh;
};
__device__ __forceinline__ place place_of(const visc_attention &a) {
    place p;
    p.warp = threadIdx.x / 32;
    p.lane = threadIdx.x % 32;
    p.pair = blockIdx.x;
    p.b = (int)(p.pair / a.H);
    p.h = (int)(p.pair % a.H);
    p.row0 = blockIdx.y * (WARPS * ROWS) + p.warp * ROWS;
    p.r = p.lane % ROWS;
    p.half = p.lane / ROWS;
    p.sh = visc_attn_head_scale(a, p.h);
    return p;
}

/* ---- forward ---- */

#define KEYS 64 /* keys a tile */
#define LDF 68  /* fp32 pitch of a warp's stage: 64 + 4 */

struct __align__(32) flash_smem {
    bf16 k[KEYS][LDH], v[KEYS][LDH];
    float stage[WARPS][ROWS][LDF]; /* scores, then the accumulator rows */
    bf16 p[WARPS][ROWS][LDH];      /* Q (before the loop), then P */
    float m[WARPS][ROWS], l[WARPS][ROWS];
};

/* The accumulator's rows, each multiplied by `scale` (lanes r and r + 16
 * take row r), through the warp's stage. */
template <int DP>
__device__ __forceinline__ void scale_rows(frag_c *acc, float (*stage)[LDF], float scale,
                                           int lane) {
    stage_fragments<DP, LDF>(stage, acc);
    const int r = lane % ROWS;
    for (int c = lane / ROWS; c < DP; c += 2) stage[r][c] *= scale;
    __syncwarp();
    for (int n = 0; n < DP / 16; n++)
        wmma::load_matrix_sync(acc[n], &stage[0][n * 16], LDF, wmma::mem_row_major);
}

/* grid (pairs, ceil(Nq / 64)), WARPS * 32 threads; out holds fp32, or
 * bf16 with out_bf16 (the projection's operand). */
template <int DP>
__global__ void __launch_bounds__(WARPS * 32)
    flash_forward_kernel(visc_attention a, void *out, int out_bf16, float *lse, const float *q,
                         const float *k, const float *v) {
    __shared__ flash_smem sm[1];
    flash_smem &s = sm[0];
    const place at = place_of(a);
    const int warp = at.warp, lane = at.lane, b = at.b, h = at.h, r = at.r, half = at.half;
    const int i0 = at.row0, i = i0 + r;
    const bool active = i0 < a.Nq; /* a warp past the last row only loads tiles */
    const float sh = at.sh;
    const views t = views_of(a, q, k, v, NULL);
    float(*stage)[LDF] = s.stage[warp];
    bf16(*p)[LDH] = s.p[warp];

    frag_a qf[DP / 16];
    frag_c acc[DP / 16];
    warp_fragments<DP>(qf, p, t.q, b, h, i0, a.D, lane);
    for (int n = 0; n < DP / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
    if (half == 0) {
        s.m[warp][r] = -INFINITY;
        s.l[warp][r] = 0.0f;
    }
    for (int j0 = 0; j0 < a.Nk; j0 += KEYS) {
        __syncthreads(); /* the previous tile's K and V are read */
        load_rows<DP>(s.k, KEYS, t.k, b, h, j0, a.D, threadIdx.x, WARPS * 32);
        load_rows<DP>(s.v, KEYS, t.v, b, h, j0, a.D, threadIdx.x, WARPS * 32);
        __syncthreads();
        if (!active) continue;
        products_with_tile<DP, KEYS, LDF>(stage, 0, qf, s.k); /* S = Q K^T: 16 x 64 */
        __syncwarp();
        /* the running maximum and sum of row r; P = exp(score - m) */
        const int c0 = half * (KEYS / 2), c1 = c0 + KEYS / 2;
        float tile_max = -INFINITY;
        for (int c = c0; c < c1; c++) {
            const int j = j0 + c;
            const float sc = i < a.Nq && j < a.Nk
                                 ? visc_attn_score(a, stage[r][c], sh, b, h, i, j)
                                 : -INFINITY;
            stage[r][c] = sc;
            tile_max = fmaxf(tile_max, sc);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, ROWS));
        const float m_old = s.m[warp][r], m_new = fmaxf(m_old, tile_max);
        /* a row with no finite score yet keeps P = 0 and nothing to rescale */
        const float alpha = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
        float sum = 0.0f;
        for (int c = c0; c < c1; c++) {
            const float e = m_new == -INFINITY ? 0.0f : expf(stage[r][c] - m_new);
            p[r][c] = __float2bfloat16_rn(e);
            sum += e;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, ROWS);
        __syncwarp(); /* P is written, and both halves have read m */
        if (half == 0) {
            s.m[warp][r] = m_new;
            s.l[warp][r] = s.l[warp][r] * alpha + sum;
        }
        if (j0 > 0) scale_rows<DP>(acc, stage, alpha, lane);
        accumulate_with_tile<DP, KEYS, LDH>(acc, p, s.v); /* O += P V */
    }
    if (!active) return;
    /* O / l to out, m + log l to lse */
    __syncwarp(); /* m and l are written */
    const float l = s.l[warp][r], m = s.m[warp][r];
    const int64_t at_pair = b * a.o_sb + h * a.o_sh;
    const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    if (out_bf16)
        store_rows<DP, LDF>((bf16 *)out + at_pair, a.o_sn, i0, a.Nq, a.D, acc, stage, inv_l, lane);
    else store_rows<DP, LDF>((float *)out + at_pair, a.o_sn, i0, a.Nq, a.D, acc, stage, inv_l, lane);
    if (half == 0 && i < a.Nq) lse[at.pair * a.Nq + i] = l > 0.0f ? m + logf(l) : INFINITY;
}

/* ---- backward ----
 * Two kernels, as attention.cu's fp32 backward, so that every sum is one
 * warp's fragments in a fixed order and nothing is added atomically: the
 * query side (16 query rows a warp, the keys 32 at a time) makes dQ, the
 * rows' shares of dhead_scale and, when dbias is asked, dS row by row; the
 * key side (16 keys a warp, the queries 32 at a time) makes dK and dV.
 * Each recomputes S = Q K^T and dP = dO V^T on the tensor cores and takes
 * P = exp(score - lse) and dS = P (dP - delta) in fp32, rounding P and
 * s_h dS to bf16 for the products as attention_tc.cu's backward does. */

#define STEP 32  /* keys (query side) or queries (key side) a tile */
#define LDS 40   /* bf16 pitch of a 32-column tile */
#define LDW 80   /* fp32 pitch of a warp's stage: S at 0, dP at DP_AT */
#define DP_AT 40 /* (160 bytes: wmma's 256-bit alignment) */

/* A warp's 16 rows, as a bf16 staging tile (for loading fragments) or as
 * fp32 stage rows: S and dP side by side, and at the end the results. */
union warp_rows {
    bf16 tile[ROWS][LDH];
    float stage[ROWS][LDW];
};

struct __align__(32) flash_back_smem {
    bf16 x[STEP][LDH], y[STEP][LDH]; /* the tile's K and V (query side) or Q and dO */
    warp_rows w[WARPS];
    bf16 p[WARPS][ROWS][LDS], ds[WARPS][ROWS][LDS]; /* P (key side), s_h dS */
    float lse[STEP], delta[STEP];                   /* the key side's queries' */
};

/* grid (pairs, ceil(Nq / 64)); dq may be NULL (hs_rows or ds_out then
 * are not), ds_out [B H Nq, Nk] and hs_rows [B H Nq] may be NULL. */
template <int DP>
__global__ void __launch_bounds__(WARPS * 32)
    flash_dq_kernel(visc_attention a, float *dq, float *ds_out, float *hs_rows,
                    const float *dout, const float *q, const float *k, const float *v,
                    const float *lse, const float *delta) {
    __shared__ flash_back_smem sm[1];
    flash_back_smem &s = sm[0];
    const place at = place_of(a);
    const int lane = at.lane, b = at.b, h = at.h, r = at.r, half = at.half;
    const int i0 = at.row0, i = i0 + r;
    const bool active = i0 < a.Nq;
    const float sh = at.sh;
    const views t = views_of(a, q, k, v, dout);
    warp_rows &w = s.w[at.warp];
    bf16(*ds)[LDS] = s.ds[at.warp];
    const int64_t row = at.pair * a.Nq + i;
    const float li = i < a.Nq ? lse[row] : INFINITY, di = i < a.Nq ? delta[row] : 0.0f;

    frag_a qf[DP / 16], of[DP / 16];
    frag_c acc[DP / 16];
    warp_fragments<DP>(qf, w.tile, t.q, b, h, i0, a.D, lane);
    warp_fragments<DP>(of, w.tile, t.dout, b, h, i0, a.D, lane);
    for (int n = 0; n < DP / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
    float hs = 0.0f;
    for (int j0 = 0; j0 < a.Nk; j0 += STEP) {
        __syncthreads();
        load_rows<DP>(s.x, STEP, t.k, b, h, j0, a.D, threadIdx.x, WARPS * 32);
        load_rows<DP>(s.y, STEP, t.v, b, h, j0, a.D, threadIdx.x, WARPS * 32);
        __syncthreads();
        if (!active) continue;
        products_with_tile<DP, STEP, LDW>(w.stage, 0, qf, s.x);     /* S = Q K^T */
        products_with_tile<DP, STEP, LDW>(w.stage, DP_AT, of, s.y); /* dP = dO V^T */
        __syncwarp();
        for (int c = half * (STEP / 2); c < (half + 1) * (STEP / 2); c++) {
            const int j = j0 + c;
            const bool valid = i < a.Nq && j < a.Nk;
            const float raw = w.stage[r][c];
            const float p = valid ? expf(visc_attn_score(a, raw, sh, b, h, i, j) - li) : 0.0f;
            const float d = p * (w.stage[r][DP_AT + c] - di);
            ds[r][c] = __float2bfloat16_rn(sh * d);
            if (valid) {
                hs = fmaf(d, raw, hs);
                if (ds_out) ds_out[row * a.Nk + j] = d;
            }
        }
        __syncwarp();
        if (dq) accumulate_with_tile<DP, STEP, LDS>(acc, ds, s.x); /* dQ += (s_h dS) K */
    }
    if (!active) return;
    hs += __shfl_xor_sync(0xffffffffu, hs, ROWS);
    if (hs_rows && half == 0 && i < a.Nq) hs_rows[row] = hs;
    if (dq)
        store_rows<DP, LDW>(dq + b * a.q_sb + h * a.q_sh, a.q_sn, i0, a.Nq, a.D, acc, w.stage,
                            1.0f, lane);
}

/* grid (pairs, ceil(Nk / 64)). */
template <int DP>
__global__ void __launch_bounds__(WARPS * 32)
    flash_dkv_kernel(visc_attention a, float *dk, float *dv, const float *dout, const float *q,
                     const float *k, const float *v, const float *lse, const float *delta) {
    __shared__ flash_back_smem sm[1];
    flash_back_smem &s = sm[0];
    const place at = place_of(a);
    const int lane = at.lane, b = at.b, h = at.h, r = at.r, half = at.half;
    const int j0 = at.row0, j = j0 + r;
    const bool active = j0 < a.Nk;
    const float sh = at.sh;
    const views t = views_of(a, q, k, v, dout);
    warp_rows &w = s.w[at.warp];
    bf16(*p)[LDS] = s.p[at.warp];
    bf16(*ds)[LDS] = s.ds[at.warp];

    frag_a kf[DP / 16], vf[DP / 16];
    frag_c dk_acc[DP / 16], dv_acc[DP / 16];
    warp_fragments<DP>(kf, w.tile, t.k, b, h, j0, a.D, lane);
    warp_fragments<DP>(vf, w.tile, t.v, b, h, j0, a.D, lane);
    for (int n = 0; n < DP / 16; n++) {
        wmma::fill_fragment(dk_acc[n], 0.0f);
        wmma::fill_fragment(dv_acc[n], 0.0f);
    }
    for (int i0 = 0; i0 < a.Nq; i0 += STEP) {
        __syncthreads();
        load_rows<DP>(s.x, STEP, t.q, b, h, i0, a.D, threadIdx.x, WARPS * 32);
        load_rows<DP>(s.y, STEP, t.dout, b, h, i0, a.D, threadIdx.x, WARPS * 32);
        if (threadIdx.x < STEP) {
            const int i = i0 + threadIdx.x;
            s.lse[threadIdx.x] = i < a.Nq ? lse[at.pair * a.Nq + i] : INFINITY;
            s.delta[threadIdx.x] = i < a.Nq ? delta[at.pair * a.Nq + i] : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        products_with_tile<DP, STEP, LDW>(w.stage, 0, kf, s.x);     /* S^T = K Q^T */
        products_with_tile<DP, STEP, LDW>(w.stage, DP_AT, vf, s.y); /* dP^T = V dO^T */
        __syncwarp();
        for (int c = half * (STEP / 2); c < (half + 1) * (STEP / 2); c++) {
            const int i = i0 + c;
            const float pij =
                i < a.Nq && j < a.Nk
                    ? expf(visc_attn_score(a, w.stage[r][c], sh, b, h, i, j) - s.lse[c])
                    : 0.0f;
            p[r][c] = __float2bfloat16_rn(pij);
            ds[r][c] = __float2bfloat16_rn(sh * (pij * (w.stage[r][DP_AT + c] - s.delta[c])));
        }
        __syncwarp();
        accumulate_with_tile<DP, STEP, LDS>(dv_acc, p, s.y);  /* dV += P^T dO */
        accumulate_with_tile<DP, STEP, LDS>(dk_acc, ds, s.x); /* dK += (s_h dS)^T Q */
    }
    if (!active) return;
    store_rows<DP, LDW>(dk + b * a.k_sb + h * a.k_sh, a.k_sn, j0, a.Nk, a.D, dk_acc, w.stage, 1.0f,
                        lane);
    store_rows<DP, LDW>(dv + b * a.v_sb + h * a.v_sh, a.v_sn, j0, a.Nk, a.D, dv_acc, w.stage, 1.0f,
                        lane);
}

int visc_attention_flash_ready(const visc_cuda *ctx, const visc_attention *a) {
    return !ctx->attn_unfused && a->D <= 64;
}

typedef void (*forward_launch)(visc_cuda *ctx, dim3 grid, const visc_attention *a, void *out,
                               int out_bf16, float *lse, const float *q, const float *k,
                               const float *v);
typedef void (*backward_launch)(visc_cuda *ctx, dim3 q_grid, dim3 k_grid, const visc_attention *a,
                                float *dq, float *dk, float *dv, float *ds_out, float *hs_rows,
                                const float *dout, const float *q, const float *k,
                                const float *v, const float *lse, const float *delta);

template <int DP>
static void launch_forward(visc_cuda *ctx, dim3 grid, const visc_attention *a, void *out,
                           int out_bf16, float *lse, const float *q, const float *k,
                           const float *v) {
    flash_forward_kernel<DP><<<grid, WARPS * 32, 0, ctx->stream>>>(*a, out, out_bf16, lse, q, k, v);
}

template <int DP>
static void launch_backward(visc_cuda *ctx, dim3 q_grid, dim3 k_grid, const visc_attention *a,
                            float *dq, float *dk, float *dv, float *ds_out, float *hs_rows,
                            const float *dout, const float *q, const float *k, const float *v,
                            const float *lse, const float *delta) {
    if (dq || ds_out || hs_rows)
        flash_dq_kernel<DP><<<q_grid, WARPS * 32, 0, ctx->stream>>>(
            *a, dq, ds_out, hs_rows, dout, q, k, v, lse, delta);
    if (dk)
        flash_dkv_kernel<DP><<<k_grid, WARPS * 32, 0, ctx->stream>>>(*a, dk, dv, dout, q, k, v,
                                                                     lse, delta);
}

/* The kernels' instance for a's head size (padded to 16). */
template <typename F> static F for_head(const visc_attention *a, F f16, F f32, F f48, F f64) {
    const int dp = (a->D + 15) / 16 * 16;
    return dp == 16 ? f16 : dp == 32 ? f32 : dp == 48 ? f48 : f64;
}

static unsigned tiles_of(int rows) { return (unsigned)((rows + WARPS * ROWS - 1) / (WARPS * ROWS)); }

/* visc_cuda_attention_* checked the shape: 1 <= Nq, Nk; B H < 2^31. */
int visc_attention_flash_forward(visc_cuda *ctx, const visc_attention *a, void *out,
                                 int out_bf16, float *lse, const float *q, const float *k,
                                 const float *v) {
    const forward_launch launch = for_head<forward_launch>(
        a, launch_forward<16>, launch_forward<32>, launch_forward<48>, launch_forward<64>);
    launch(ctx, dim3((unsigned)(a->B * a->H), tiles_of(a->Nq)), a, out, out_bf16, lse, q, k, v);
    return visc_cuda_launched("attention (bf16): fused forward");
}

int visc_attention_flash_backward(visc_cuda *ctx, const visc_attention *a, float *dq, float *dk,
                                  float *dv, float *ds_out, float *hs_rows, const float *dout,
                                  const float *q, const float *k, const float *v,
                                  const float *lse, const float *delta) {
    const backward_launch launch = for_head<backward_launch>(
        a, launch_backward<16>, launch_backward<32>, launch_backward<48>, launch_backward<64>);
    const unsigned pairs = (unsigned)(a->B * a->H);
    launch(ctx, dim3(pairs, tiles_of(a->Nq)), dim3(pairs, tiles_of(a->Nk)), a, dq, dk, dv, ds_out,
           hs_rows, dout, q, k, v, lse, delta);
    return visc_cuda_launched("attention (bf16): fused backward");
}

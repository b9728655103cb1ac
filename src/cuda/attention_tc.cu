/* attention_tc.cu: attention on tensor cores, the bf16 form of
 * visc_cuda_attention_* (attention.cu sends a context that multiplies in
 * bf16 here, the fp32 one to its fused kernels).
 *
 * It runs only for heads of more than 64 dimensions, or when
 * visc_cuda_set_attention_fused turned the fused kernels (attention_flash.cu,
 * no N x N matrices) off.
 *
 * attention.cu's kernels multiply on the CUDA cores in fp32, one fused
 * multiply-add at a time: for ViT-S at batch 256 that is some 0.8 TFLOP a
 * step (a count: 2 N^2 D a product, about seven products' worth with
 * backward's recomputations), which at CUDA-core rates would take longer
 * than a whole step may at the benchmark's target (an estimate, not yet
 * measured on a GPU). Here
 * each of the six products of every (sequence, head) pair is one of
 * cuBLASLt's batched bf16 products with fp32 accumulation (the tensor
 * cores, as PyTorch's autocast runs attention):
 *
 *   forward   Q, K, V packed to bf16 [pairs, N, D]; S = Q K^T (fp32);
 *             a warp per row: the scale, bias and mask, the softmax into
 *             P (bf16) and the row's log-sum-exp; O = P V (fp32), written
 *             straight to out's strides (a batch over the sequences per head)
 *   backward  Q, K, V, dO packed; S = Q K^T and dP = dO V^T (fp32);
 *             a warp per row: P = exp(score - lse) (bf16, as forward made
 *             it: the same product, the same bits), dS = P (dP - delta),
 *             s_h dS (bf16), dS itself in dP's place when dbias is asked,
 *             and the row's share of dhead_scale (sum of dS . raw);
 *             dV = P^T dO, dQ = (s_h dS) K, dK = (s_h dS)^T Q (fp32),
 *             straight to their strides; dbias: dS summed over sequences
 *
 * The price of the products is the N x N matrices, which the fused kernels
 * never hold: they are made for a chunk of whole sequences at a time, so
 * the workspace stays under CHUNK_BYTES (256 MiB) however large the batch
 * (ViT-S at batch 256: five chunks of 61 images, 201 MiB; Swin-T's first
 * stage eleven of 1576 windows). Every sum runs in a fixed order
 * (cuBLASLt's algorithm is fixed per shape, the chunks per shape), so the
 * same inputs give the same bits. Score rows are padded to a multiple of 8
 * elements and packed rows to a multiple of 8 (16 bytes of bf16), which
 * cuBLASLt's fastest kernels want. */
#include <cuda_bf16.h>
#include <math.h>

#include "attention.cuh"

#define CHUNK_BYTES ((size_t)256 << 20) /* unless visc_cuda_set_attention_chunk says */
#define ALIGN 256

typedef __nv_bfloat16 bf16;

static int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }
static size_t aligned(size_t bytes) { return (bytes + ALIGN - 1) / ALIGN * ALIGN; }

/* One chunk's buffers, carved from the workspace. */
typedef struct {
    int seqs;          /* sequences per chunk (the last may hold fewer) */
    int64_t L, Dp;     /* score row length, packed row length (elements) */
    bf16 *q, *k, *v, *dout; /* packed [pairs, N, Dp] */
    float *s, *dp;     /* [pairs, Nq, L]: the raw scores; dP, then dS */
    bf16 *p, *ds;      /* [pairs, Nq, L]: P, s_h dS */
    float *dbias_sum;  /* [H, Nq, L]: one chunk's dbias */
} tc_chunk;

/* The bytes of one chunk of `seqs` sequences (forward needs less, and
 * takes the same plan), with the buffers' places when base is given. */
static size_t chunk_layout(const visc_attention *a, int seqs, char *base, tc_chunk *c) {
    const int64_t L = round8(a->Nk), Dp = round8(a->D);
    const int64_t pairs = (int64_t)seqs * a->H;
    const size_t packed_q = aligned(sizeof(bf16) * pairs * a->Nq * Dp);
    const size_t packed_k = aligned(sizeof(bf16) * pairs * a->Nk * Dp);
    const size_t scores32 = aligned(sizeof(float) * pairs * a->Nq * L);
    const size_t scores16 = aligned(sizeof(bf16) * pairs * a->Nq * L);
    const size_t bias = aligned(sizeof(float) * a->H * a->Nq * L);
    const size_t sizes[] = {packed_q, packed_k, packed_k, packed_q, scores32,
                            scores32, scores16, scores16, bias};
    void **places[] = {(void **)&c->q, (void **)&c->k,  (void **)&c->v,
                       (void **)&c->dout, (void **)&c->s, (void **)&c->dp,
                       (void **)&c->p, (void **)&c->ds, (void **)&c->dbias_sum};
    size_t at = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        if (base) *places[i] = base + at;
        at += sizes[i];
    }
    if (base) {
        c->seqs = seqs;
        c->L = L;
        c->Dp = Dp;
    }
    return at;
}

void visc_cuda_set_attention_chunk(visc_cuda *ctx, size_t bytes) { ctx->attn_chunk_bytes = bytes; }
void visc_cuda_set_attention_fused(visc_cuda *ctx, int on) { ctx->attn_unfused = !on; }

/* Sequences per chunk: as many as the cap holds, at least one. */
static int chunk_sequences(const visc_cuda *ctx, const visc_attention *a) {
    const size_t cap = ctx->attn_chunk_bytes ? ctx->attn_chunk_bytes : CHUNK_BYTES;
    const size_t fit = cap / chunk_layout(a, 1, NULL, NULL);
    return fit < 1 ? 1 : fit > (size_t)a->B ? a->B : (int)fit;
}

size_t visc_attention_tc_bytes(const visc_cuda *ctx, const visc_attention *a) {
    return a->B > 0 ? chunk_layout(a, chunk_sequences(ctx, a), NULL, NULL) : 0;
}

/* ---- packing ---- */

/* rows [rows, D] of pairs first .. first + n / (rows D) of a strided
 * tensor (element (b, h, r, d) at b sb + h sh + r sn + d), fp32 or bf16
 * (src_bf16: Q, K and V in the operand form), to bf16 [pairs, rows, Dp]. */
__global__ void pack_kernel(bf16 *dst, const float *src, int src_bf16, int64_t sb, int64_t sh,
                            int64_t sn, int H, int rows, int D, int64_t Dp, int64_t first,
                            int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int d = (int)(e % D);
        const int64_t r = e / D % rows, p = e / D / rows, pair = first + p;
        const int64_t at = pair / H * sb + pair % H * sh + r * sn + d;
        dst[(p * rows + r) * Dp + d] =
            src_bf16 ? ((const bf16 *)src)[at] : __float2bfloat16_rn(src[at]);
    }
}

/* src_bf16: src holds bf16 (Q, K, V of a descriptor with qkv_operand). */
static int pack(visc_cuda *ctx, bf16 *dst, const float *src, int src_bf16, int64_t sb,
                int64_t sh, int64_t sn, const visc_attention *a, int rows, int64_t Dp,
                int64_t first, int64_t pairs) {
    const int64_t n = pairs * rows * a->D;
    pack_kernel<<<visc_cuda_blocks((size_t)n, 256), 256, 0, ctx->stream>>>(
        dst, src, src_bf16, sb, sh, sn, a->H, rows, a->D, Dp, first, n);
    return visc_cuda_launched("attention (bf16): packing");
}

/* One chunk's sequences b0 .. b0 + seqs, their pairs first .. first + pairs. */
typedef struct {
    int b0, seqs;
    int64_t first, pairs;
} chunk_span;

/* The chunk after *s (the first when s is zeroed); 0 past the last. */
static int next_chunk(const visc_attention *a, const tc_chunk *c, chunk_span *s) {
    s->b0 += s->seqs;
    if (s->b0 >= a->B) return 0;
    s->seqs = a->B - s->b0 < c->seqs ? a->B - s->b0 : c->seqs;
    s->first = (int64_t)s->b0 * a->H;
    s->pairs = (int64_t)s->seqs * a->H;
    return 1;
}

/* ---- the products ----
 * D_p = op(A_p) op(B_p) for `pairs` pairs at once, each matrix packed at its
 * leading dimension, the next one stride_* further. */
static int products(visc_cuda *ctx, int64_t pairs, float *D, int64_t ldd, int64_t sd,
                    const bf16 *A, int64_t lda, int64_t sa, int trans_a, const bf16 *B,
                    int64_t ldb, int64_t sb, int trans_b, int M, int N, int K) {
    visc_cuda_products p;
    p.A = (const uint16_t *)A;
    p.B = (const uint16_t *)B;
    p.D = D;
    p.M = M, p.N = N, p.K = K;
    p.trans_a = trans_a, p.trans_b = trans_b;
    p.batch = (int)pairs;
    p.lda = lda, p.ldb = ldb, p.ldd = ldd;
    p.stride_a = sa, p.stride_b = sb, p.stride_d = sd;
    p.alpha = 1.0f, p.beta = 0.0f;
    return visc_cuda_matmul_bf16_batched(ctx, &p);
}

/* Scores-shaped products over the chunk's pairs: [Nq, L] each. */
static int score_products(visc_cuda *ctx, const visc_attention *a, const tc_chunk *c,
                          int64_t pairs, float *D, const bf16 *A, int64_t rows_a, const bf16 *B,
                          int64_t rows_b) {
    return products(ctx, pairs, D, c->L, a->Nq * c->L, A, c->Dp, rows_a * c->Dp, 0, B, c->Dp,
                    rows_b * c->Dp, 1, a->Nq, a->Nk, a->D);
}

/* Products whose results go straight to a strided output (O, dQ, dK, dV:
 * element (b, h, r, d) at dst[b sb + h sh + r sn + d]): per head, a batch
 * over the chunk's sequences. A is [Nq, L] per pair (P or s_h dS; trans_a:
 * its transpose), B packed [K, Dp] per pair (V, dO, K or Q). */
static int head_products(visc_cuda *ctx, const visc_attention *a, const tc_chunk *c,
                         const chunk_span *at, float *dst, int64_t sb, int64_t sh, int64_t sn,
                         const bf16 *A, int trans_a, const bf16 *B, int M, int K) {
    const int64_t H = a->H, pair_a = a->Nq * c->L, pair_b = (int64_t)K * c->Dp;
    for (int64_t h = 0; h < H; h++)
        if (products(ctx, at->seqs, dst + at->b0 * sb + h * sh, sn, sb, A + h * pair_a, c->L,
                     H * pair_a, trans_a, B + h * pair_b, c->Dp, H * pair_b, 0, M, a->D, K))
            return -1;
    return 0;
}

/* ---- the rows ---- */

/* Forward: P and lse from the raw scores, a warp per row (rows of pairs
 * first ..). A row with every score -inf gets P = 0 and lse = +inf, so
 * its output is 0 (as the CPU's). */
__global__ void softmax_rows_kernel(visc_attention a, bf16 *P, float *lse, const float *S,
                                    int64_t L, int64_t first, int64_t rows) {
    const int lane = threadIdx.x % 32;
    for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; w < rows;
         w += (int64_t)gridDim.x * blockDim.x / 32) {
        const int i = (int)(w % a.Nq);
        const int64_t pair = first + w / a.Nq;
        const int b = (int)(pair / a.H), h = (int)(pair % a.H);
        const float sh = visc_attn_head_scale(a, h);
        const float *raw = S + w * L;
        float m = -INFINITY;
        for (int j = lane; j < a.Nk; j += 32)
            m = fmaxf(m, visc_attn_score(a, raw[j], sh, b, h, i, j));
        m = visc_warp_max(m);
        float l = 0.0f;
        if (m != -INFINITY)
            for (int j = lane; j < a.Nk; j += 32)
                l += expf(visc_attn_score(a, raw[j], sh, b, h, i, j) - m);
        l = visc_warp_sum(l);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int j = lane; j < a.Nk; j += 32) {
            const float p = l > 0.0f ? expf(visc_attn_score(a, raw[j], sh, b, h, i, j) - m) : 0.0f;
            P[w * L + j] = __float2bfloat16_rn(p * inv);
        }
        if (lane == 0) lse[pair * a.Nq + i] = l > 0.0f ? m + logf(l) : INFINITY;
    }
}

/* Backward: P, s_h dS, dS in dP's place (keep_ds; the padding columns
 * zeroed, for dbias's column sums) and the row's dhead_scale share. */
__global__ void grad_rows_kernel(visc_attention a, bf16 *P, bf16 *dS, float *dP, int keep_ds,
                                 float *hs_rows, const float *S, const float *lse,
                                 const float *delta, int64_t L, int64_t first, int64_t rows) {
    const int lane = threadIdx.x % 32;
    for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; w < rows;
         w += (int64_t)gridDim.x * blockDim.x / 32) {
        const int i = (int)(w % a.Nq);
        const int64_t pair = first + w / a.Nq, row = pair * a.Nq + i;
        const int b = (int)(pair / a.H), h = (int)(pair % a.H);
        const float sh = visc_attn_head_scale(a, h), li = lse[row], di = delta[row];
        float hs = 0.0f;
        for (int j = lane; j < L; j += 32) {
            const int64_t at = w * L + j;
            if (j >= a.Nk) {
                if (keep_ds) dP[at] = 0.0f;
                continue;
            }
            const float raw = S[at];
            const float p = expf(visc_attn_score(a, raw, sh, b, h, i, j) - li);
            const float ds = p * (dP[at] - di);
            P[at] = __float2bfloat16_rn(p);
            dS[at] = __float2bfloat16_rn(sh * ds);
            if (keep_ds) dP[at] = ds;
            hs = fmaf(ds, raw, hs);
        }
        hs = visc_warp_sum(hs);
        if (hs_rows && lane == 0) hs_rows[row] = hs;
    }
}

/* dbias (+)= a chunk's sums [H, Nq, L] without the padding. */
__global__ void dbias_add_kernel(float *dbias, const float *sum, int Nq, int Nk, int64_t L,
                                 int64_t n, int first_chunk) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = e % Nk, hi = e / Nk;
        const float s = sum[hi * L + j];
        dbias[e] = first_chunk ? s : dbias[e] + s;
    }
}

static unsigned row_blocks(int64_t rows) { return visc_cuda_blocks((size_t)rows * 32, 256); }

/* ---- the passes ---- */

/* The chunk's pairs first .. first + pairs: Q, K, V packed, S = Q K^T. */
static int scores(visc_cuda *ctx, const visc_attention *a, const tc_chunk *c, const float *q,
                  const float *k, const float *v, int64_t first, int64_t pairs) {
    const int b16 = a->qkv_operand;
    return pack(ctx, c->q, q, b16, a->q_sb, a->q_sh, a->q_sn, a, a->Nq, c->Dp, first, pairs) ||
                   pack(ctx, c->k, k, b16, a->k_sb, a->k_sh, a->k_sn, a, a->Nk, c->Dp, first,
                        pairs) ||
                   pack(ctx, c->v, v, b16, a->v_sb, a->v_sh, a->v_sn, a, a->Nk, c->Dp, first,
                        pairs) ||
                   score_products(ctx, a, c, pairs, c->s, c->q, a->Nq, c->k, a->Nk)
               ? -1
               : 0;
}

int visc_attention_tc_forward(visc_cuda *ctx, const visc_attention *a, float *out, float *lse,
                              const float *q, const float *k, const float *v, void *work) {
    tc_chunk c;
    chunk_layout(a, chunk_sequences(ctx, a), (char *)work, &c);
    const int Nq = a->Nq, Nk = a->Nk;
    for (chunk_span at = {}; next_chunk(a, &c, &at);) {
        const int64_t first = at.first, pairs = at.pairs, rows = pairs * Nq;
        if (scores(ctx, a, &c, q, k, v, first, pairs)) return -1;
        softmax_rows_kernel<<<row_blocks(rows), 256, 0, ctx->stream>>>(*a, c.p, lse, c.s, c.L,
                                                                       first, rows);
        if (visc_cuda_launched("attention (bf16): softmax") ||
            head_products(ctx, a, &c, &at, out, a->o_sb, a->o_sh, a->o_sn, c.p, 0, c.v, Nq, Nk))
            return -1;
    }
    return 0;
}

int visc_attention_tc_backward(visc_cuda *ctx, const visc_attention *a, float *dq, float *dk,
                               float *dv, float *dbias, float *hs_rows, const float *dout,
                               const float *q, const float *k, const float *v, const float *lse,
                               const float *delta, void *work) {
    tc_chunk c;
    chunk_layout(a, chunk_sequences(ctx, a), (char *)work, &c);
    const int Nq = a->Nq, Nk = a->Nk;
    for (chunk_span at = {}; next_chunk(a, &c, &at);) {
        const int64_t first = at.first, pairs = at.pairs, rows = pairs * Nq;
        if (scores(ctx, a, &c, q, k, v, first, pairs) ||
            pack(ctx, c.dout, dout, 0, a->o_sb, a->o_sh, a->o_sn, a, Nq, c.Dp, first, pairs) ||
            score_products(ctx, a, &c, pairs, c.dp, c.dout, Nq, c.v, Nk))
            return -1;
        grad_rows_kernel<<<row_blocks(rows), 256, 0, ctx->stream>>>(
            *a, c.p, c.ds, c.dp, dbias != NULL, hs_rows, c.s, lse, delta, c.L, first, rows);
        if (visc_cuda_launched("attention (bf16): score gradients")) return -1;
        /* dV = P^T dO, dK = (s_h dS)^T Q, dQ = (s_h dS) K */
        if (head_products(ctx, a, &c, &at, dv, a->v_sb, a->v_sh, a->v_sn, c.p, 1, c.dout, Nk,
                          Nq) ||
            head_products(ctx, a, &c, &at, dk, a->k_sb, a->k_sh, a->k_sn, c.ds, 1, c.q, Nk, Nq))
            return -1;
        if (dq &&
            head_products(ctx, a, &c, &at, dq, a->q_sb, a->q_sh, a->q_sn, c.ds, 0, c.k, Nq, Nk))
            return -1;
        if (dbias) {
            const int64_t n = (int64_t)a->H * Nq * Nk;
            if (visc_cuda_column_sums(ctx, c.dbias_sum, c.dp, at.seqs, (int)(a->H * Nq * c.L)))
                return -1;
            dbias_add_kernel<<<visc_cuda_blocks((size_t)n, 256), 256, 0, ctx->stream>>>(
                dbias, c.dbias_sum, Nq, Nk, c.L, n, at.b0 == 0);
            if (visc_cuda_launched("attention (bf16): bias gradient")) return -1;
        }
    }
    return 0;
}

/* attention.c: fused multi-head scaled-dot-product attention.
 *
 * One (sequence b, head h) pair is an independent problem of three small
 * matrix products; pairs are spread over OpenMP threads (static schedule).
 * When D is a multiple of 16 (every ViT / Swin model) the products run
 * through register-blocked tiles (small_gemm below); otherwise each is a
 * single-threaded dnnl_sgemm. Both read strided views, so the fused qkv
 * layout needs no permute copies.
 *
 *   forward   S = s_h Q K^T + bias_h + mask_b     [Nq, Nk]   (scratch)
 *             P = softmax_rows(S), lse = rowmax + log(rowsum exp(S - rowmax))
 *             O = P V
 *   backward  P = exp(S - lse)        recomputed from Q, K and the saved lse
 *             dV = P^T dO,  dP = dO V^T
 *             dS = P * (dP - rowsum(dO * O))      (softmax backward)
 *             dQ = s_h dS K,  dK = s_h dS^T Q
 *             dbias_h += dS,  dhead_scale_h += sum(dS * Q K^T)
 *
 * Only lse [B, H, Nq] is kept between the passes; the N x N matrices live
 * in per-thread scratch that grows on demand and is kept for the next call,
 * so a training step allocates nothing after its first iteration.
 *
 * dbias and dhead_scale sum over sequences. Each thread accumulates its own
 * copy and the copies are added in thread order afterwards: with a static
 * schedule the result depends on the thread count only, like the rest of
 * the library, and no atomics sit in the inner loop. */
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "visc/core.h"
#include "visc/cpu.h"
#include "fast_exp.h"
#include "visc/tokens.h"

#define MAX_THREADS 1024

/* ---- per-thread scratch ---- */

static struct {
    float *buf;
    size_t cap; /* floats */
} slots[MAX_THREADS];

static float *thread_scratch(int t, size_t floats) {
    if (t < 0 || t >= MAX_THREADS) visc_die("attention: thread %d beyond %d", t, MAX_THREADS);
    if (slots[t].cap < floats) {
        visc_free_aligned(slots[t].buf);
        slots[t].buf = visc_alloc_aligned(floats * sizeof(float), "attention scratch");
        slots[t].cap = floats;
    }
    return slots[t].buf;
}

/* ---- small products ---- */

static void sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dnnl_status_t s = dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (s != dnnl_success)
        visc_die("attention: dnnl_sgemm(%c, %c, %lld, %lld, %lld) failed: status %d", ta, tb,
                 (long long)M, (long long)N, (long long)K, (int)s);
}

/* Leading dimension of a [rows, D] view with row stride `sn`: a single row
 * may have any stride, but the GEMM wants ld >= D. */
static int64_t ld_of(int64_t sn, int rows, int D) { return rows == 1 && sn < D ? D : sn; }

static float head_scale_of(const visc_attention *a, int h) {
    return a->head_scale ? a->head_scale[h] : a->scale;
}

/* ---- row kernels (vectorized; exp dominates once the GEMMs are fast) ---- */

/* Softmax of one row in place; returns its log-sum-exp. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static float
softmax_row(float *row, int n) {
    /* Row maximum over 16 lanes: an elementwise max vectorizes without -ffast-math. */
    float lane[16];
    for (int l = 0; l < 16; l++) lane[l] = row[0];
    int j0 = 0;
    for (; j0 + 16 <= n; j0 += 16)
        for (int l = 0; l < 16; l++) lane[l] = row[j0 + l] > lane[l] ? row[j0 + l] : lane[l];
    float mx = row[0];
    for (int l = 0; l < 16; l++) mx = lane[l] > mx ? lane[l] : mx;
    for (int j = j0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    if (mx == -INFINITY) { /* fully masked row: output 0, backward sees P = 0 */
        memset(row, 0, sizeof(float) * (size_t)n);
        return INFINITY;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        row[j] = visc_fast_exp(row[j] - mx);
        sum += row[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < n; j++) row[j] *= inv;
    /* cppcheck-suppress invalidFunctionArg ; sum >= exp(mx - mx) = 1 */
    return mx + logf(sum);
}

/* P = exp(S - lse) in place: the forward's probabilities, recomputed. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
exp_shifted_row(float *row, int n, float lse) {
#pragma omp simd
    for (int j = 0; j < n; j++) row[j] = visc_fast_exp(row[j] - lse);
}

/* dS = P * (dP - di) in place over dP; returns sum(dS * R) (for the head scale). */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static float
dsoftmax_row(float *ds, const float *p, const float *r, int n, float di, int want_hs) {
#pragma omp simd
    for (int j = 0; j < n; j++) ds[j] = p[j] * (ds[j] - di);
    float hs = 0.0f;
    if (want_hs) {
#pragma omp simd reduction(+ : hs)
        for (int j = 0; j < n; j++) hs += ds[j] * r[j];
    }
    return hs;
}

/* ---- register-blocked small products (the fast path, D % 16 == 0) ----
 *
 * dnnl_sgemm costs a call, a kernel dispatch and (for these shapes) packing
 * per product. Measured gain is modest (Swin window attention backward
 * ~10% faster, forward about even; ~1% of a Swin-T / ViT-Ti step): at
 * N = 49, D = 32 the pass is bound by reading q/k/v from memory (the fused
 * qkv of a Swin stage is ~58 MB), not by the products. The products here are
 * C[M, 16 nv] = alpha A[M, K] B[K, 16 nv] with B's rows contiguous and A
 * read one scalar at a time through (row, column) strides, so A^T costs
 * nothing: every product of the forward and backward passes fits this form,
 * with K^T and V^T copied into padded per-thread scratch (D x Nk floats,
 * small next to the products). A tile of up to 4 rows x 64 columns keeps 16
 * accumulators of 16 floats in registers (GCC vector extensions: 16 zmm with
 * AVX-512, split into ymm/xmm halves by the other clones). */
typedef float v16 __attribute__((vector_size(64)));
/* acc += x * b is one FMA: the Makefile builds with -ffp-contract=fast. */
typedef float v16u __attribute__((vector_size(64), aligned(4))); /* unaligned access */

static inline __attribute__((always_inline)) void tile(int mr, int nv, int K, const float *A,
                                                       int64_t ars, int64_t acs, const float *B,
                                                       int64_t ldb, float alpha, float *C,
                                                       int64_t ldc) {
    v16 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[r][v] = (v16){0};
    for (int k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        v16 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) bv[v] = *(const v16u *)(b + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const float x = A[r * ars + k * acs];
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[r][v] += x * bv[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) *(v16u *)(C + r * ldc + 16 * v) = alpha * acc[r][v];
}

/* One block of `mr` rows across `nv` vectors, dispatched to a tile
 * specialized at compile time so the accumulators stay in registers: up to
 * 6 rows x 4 vectors (24 accumulators + 4 B vectors + a broadcast fit the
 * 32 zmm registers) or 8 rows x 2 vectors. */
#define TILE_CASE(m, n)                                                                            \
    case (m)*8 + (n): tile(m, n, K, A, ars, acs, B, ldb, alpha, C, ldc); break
static inline __attribute__((always_inline)) void tile_any(int mr, int nv, int K, const float *A,
                                                           int64_t ars, int64_t acs, const float *B,
                                                           int64_t ldb, float alpha, float *C,
                                                           int64_t ldc) {
    switch (mr * 8 + nv) {
        TILE_CASE(6, 4);
        TILE_CASE(5, 4);
        TILE_CASE(4, 4);
        TILE_CASE(3, 4);
        TILE_CASE(2, 4);
        TILE_CASE(1, 4);
        TILE_CASE(6, 3);
        TILE_CASE(5, 3);
        TILE_CASE(4, 3);
        TILE_CASE(3, 3);
        TILE_CASE(2, 3);
        TILE_CASE(1, 3);
        TILE_CASE(8, 2);
        TILE_CASE(7, 2);
        TILE_CASE(6, 2);
        TILE_CASE(5, 2);
        TILE_CASE(4, 2);
        TILE_CASE(3, 2);
        TILE_CASE(2, 2);
        TILE_CASE(1, 2);
        TILE_CASE(8, 1);
        TILE_CASE(7, 1);
        TILE_CASE(6, 1);
        TILE_CASE(5, 1);
        TILE_CASE(4, 1);
        TILE_CASE(3, 1);
        TILE_CASE(2, 1);
        TILE_CASE(1, 1);
    default: VISC_ASSERT(0);
    }
}
#undef TILE_CASE

/* C[M, ncols] = alpha A B, ncols a multiple of 16 (columns beyond the
 * product's own width are padding the caller ignores). */
__attribute__((target_clones("avx512f", "default"))) static void
small_gemm_wide(int M, int ncols, int K, const float *A, int64_t ars, int64_t acs, const float *B,
                int64_t ldb, float alpha, float *C, int64_t ldc) {
    const int nvec = ncols / 16;
    for (int j = 0; j < nvec; j += 4) {
        const int nv = nvec - j < 4 ? nvec - j : 4, rows = nv > 2 ? 6 : 8;
        for (int i = 0; i < M; i += rows)
            tile_any(M - i < rows ? M - i : rows, nv, K, A + i * ars, ars, acs, B + 16 * j, ldb,
                     alpha, C + i * ldc + 16 * j, ldc);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* AVX2 has 16 ymm registers: the AVX-512 tiles (24 v16 accumulators) spilled
 * to the stack at every FMA there, and so did the v16 vectors of GCC's
 * vector extensions split into ymm halves (the stores, reloads and lane
 * inserts were most of the product's time). Here tiles of up to 6 rows x 16
 * columns in intrinsics, BLIS's Haswell shape: 12 ymm accumulators, 2 for
 * B's row and one broadcast of A. */
#define AVX2_FMA __attribute__((target("avx2,fma")))
static inline __attribute__((always_inline)) AVX2_FMA void
tile_avx2(int mr, int K, const float *A, int64_t ars, int64_t acs, const float *B, int64_t ldb,
          float alpha, float *C, int64_t ldc) {
    __m256 lo[6], hi[6];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const __m256 b0 = _mm256_loadu_ps(B + k * ldb), b1 = _mm256_loadu_ps(B + k * ldb + 8);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            const __m256 x = _mm256_broadcast_ss(A + r * ars + k * acs);
            lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
        }
    }
    const __m256 s = _mm256_set1_ps(alpha);
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
        _mm256_storeu_ps(C + r * ldc, _mm256_mul_ps(s, lo[r]));
        _mm256_storeu_ps(C + r * ldc + 8, _mm256_mul_ps(s, hi[r]));
    }
}

#define TILE_AVX2_CASE(m)                                                                          \
    case (m):                                                                                      \
        tile_avx2(m, K, A + i * ars, ars, acs, B + 16 * j, ldb, alpha, C + i * ldc + 16 * j, ldc); \
        break
AVX2_FMA static void small_gemm_avx2(int M, int ncols, int K, const float *A, int64_t ars,
                                     int64_t acs, const float *B, int64_t ldb, float alpha,
                                     float *C, int64_t ldc) {
    for (int j = 0; j < ncols / 16; j++)
        for (int i = 0; i < M; i += 6) {
            switch (M - i < 6 ? M - i : 6) {
                TILE_AVX2_CASE(6);
                TILE_AVX2_CASE(5);
                TILE_AVX2_CASE(4);
                TILE_AVX2_CASE(3);
                TILE_AVX2_CASE(2);
                TILE_AVX2_CASE(1);
            default: VISC_ASSERT(0);
            }
        }
}
#undef TILE_AVX2_CASE
#endif

/* level: visc_cpu_level(), asked once per call of the layer. */
static void small_gemm(int level, int M, int ncols, int K, const float *A, int64_t ars, int64_t acs,
                       const float *B, int64_t ldb, float alpha, float *C, int64_t ldc) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (level == 1) {
        small_gemm_avx2(M, ncols, K, A, ars, acs, B, ldb, alpha, C, ldc);
        return;
    }
#endif
    (void)level;
    small_gemm_wide(M, ncols, K, A, ars, acs, B, ldb, alpha, C, ldc);
}

/* T[d, j] = X[j, d] for j < n (rows of X at stride sx), zero up to width w. */
static void transpose_pad_scalar(float *T, int w, const float *X, int64_t sx, int n, int D) {
    for (int d = 0; d < D; d++) {
        float *t = T + (int64_t)d * w;
        for (int j = 0; j < n; j++) t[j] = X[j * sx + d];
        for (int j = n; j < w; j++) t[j] = 0.0f;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ATTN_AVX512 1

/* The same for D and w multiples of 16, as 16 x 16 register transposes:
 * the scalar loop's strided loads (one element per cycle at best) were
 * ~40% of the backward pass's own time outside the products. */
__attribute__((target("avx512f"))) static void transpose_pad16(float *T, int w, const float *X,
                                                               int64_t sx, int n, int D) {
    for (int j0 = 0; j0 < w; j0 += 16)
        for (int d0 = 0; d0 < D; d0 += 16) {
            __m512 r[16], t[16];
            for (int i = 0; i < 16; i++)
                r[i] = j0 + i < n ? _mm512_loadu_ps(X + (j0 + i) * sx + d0) : _mm512_setzero_ps();
            for (int i = 0; i < 16; i += 2) {
                t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 16; i += 4)
                for (int k = 0; k < 2; k++) {
                    const __m512d a = _mm512_castps_pd(t[i + k]),
                                  b = _mm512_castps_pd(t[i + k + 2]);
                    r[i + 2 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
                    r[i + 2 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
                }
            /* r[4q + c] now holds, in each 128-bit lane L, column 4L + c of rows 4q..4q+3 */
            for (int i = 0; i < 4; i++) {
                t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
                t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
                t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
                t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
            }
            for (int i = 0; i < 4; i++) {
                for (int k = 0; k < 2; k++) {
                    const __m512 a = t[i + 4 * k], b = t[i + 4 * k + 8];
                    /* columns i + 4k (lanes 0 of each quarter) and i + 4k + 8 (lanes 2) */
                    const int c0 = i + 4 * k;
                    _mm512_storeu_ps(T + (int64_t)(d0 + c0) * w + j0,
                                     _mm512_shuffle_f32x4(a, b, 0x88));
                    _mm512_storeu_ps(T + (int64_t)(d0 + c0 + 8) * w + j0,
                                     _mm512_shuffle_f32x4(a, b, 0xdd));
                }
            }
        }
}
#endif

static void transpose_pad(float *T, int w, const float *X, int64_t sx, int n, int D, int level) {
#ifdef ATTN_AVX512
    if (D % 16 == 0 && w % 16 == 0 && level == 2) {
        transpose_pad16(T, w, X, sx, n, D);
        return;
    }
#endif
    (void)level;
    transpose_pad_scalar(T, w, X, sx, n, D);
}

static int round16(int n) { return (n + 15) / 16 * 16; }

/* S = s_h * R + bias_h + mask_b in place, where R = Q K^T is in S, whose
 * rows are `ld` floats apart (the bias and mask rows are Nk apart). */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
add_bias_mask(const visc_attention *a, float *S, int64_t ld, int b, int h) {
    const int64_t nn = (int64_t)a->Nq * a->Nk;
    const int Nk = a->Nk;
    const float sh = head_scale_of(a, h);
    const float *bias = a->bias ? a->bias + h * nn : NULL;
    const float *mask = a->mask ? a->mask + (int64_t)(b % a->nmask) * nn : NULL;
    for (int i = 0; i < a->Nq; i++) {
        float *s = S + i * ld;
        const float *bi = bias ? bias + (int64_t)i * Nk : NULL;
        const float *mi = mask ? mask + (int64_t)i * Nk : NULL;
        if (bi && mi) {
            for (int j = 0; j < Nk; j++) s[j] = s[j] * sh + bi[j] + mi[j];
        } else if (bi) {
            for (int j = 0; j < Nk; j++) s[j] = s[j] * sh + bi[j];
        } else if (mi) {
            for (int j = 0; j < Nk; j++) s[j] = s[j] * sh + mi[j];
        } else {
            for (int j = 0; j < Nk; j++) s[j] *= sh;
        }
    }
}

static void check_shape(const visc_attention *a) {
    VISC_ASSERT(a->B >= 0 && a->H > 0 && a->Nq > 0 && a->Nk > 0 && a->D > 0);
    VISC_ASSERT(!a->mask || (a->nmask > 0 && a->B % a->nmask == 0));
}

double visc_attention_flops(const visc_attention *a) {
    return 4.0 * a->B * a->H * (double)a->Nq * a->Nk * a->D;
}

/* ---- forward ---- */

/* The fast path: the products through small_gemm, S rows padded to Nk16. */
static void forward_fast(const visc_attention *a, float *out, float *lse, const float *q,
                         const float *k, const float *v) {
    const int Nq = a->Nq, Nk = a->Nk, D = a->D, H = a->H, w = round16(Nk);
    const int64_t pairs = (int64_t)a->B * H;
    const int level = visc_cpu_level();
#pragma omp parallel
    {
        float *KT = thread_scratch(omp_get_thread_num(), (size_t)(D + Nq) * w);
        float *S = KT + (int64_t)D * w;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            const int b = (int)(p / H), h = (int)(p % H);
            const float *Q = q + b * a->q_sb + h * a->q_sh;
            const float *K = k + b * a->k_sb + h * a->k_sh;
            const float *V = v + b * a->v_sb + h * a->v_sh;
            float *O = out + b * a->o_sb + h * a->o_sh;
            float *L = lse + p * Nq;
            transpose_pad(KT, w, K, a->k_sn, Nk, D, level);
            small_gemm(level, Nq, w, D, Q, a->q_sn, 1, KT, w, 1.0f, S, w);
            add_bias_mask(a, S, w, b, h);
            for (int i = 0; i < Nq; i++) L[i] = softmax_row(S + (int64_t)i * w, Nk);
            small_gemm(level, Nq, D, Nk, S, w, 1, V, a->v_sn, 1.0f, O, a->o_sn);
        }
    }
}

void visc_attention_forward(const visc_attention *a, float *out, float *lse, const float *q,
                            const float *k, const float *v) {
    check_shape(a);
    if (a->D % 16 == 0) {
        forward_fast(a, out, lse, q, k, v);
        return;
    }
    const int Nq = a->Nq, Nk = a->Nk, D = a->D, H = a->H;
    const int64_t pairs = (int64_t)a->B * H;
    const int64_t ldq = ld_of(a->q_sn, Nq, D), ldk = ld_of(a->k_sn, Nk, D);
    const int64_t ldv = ld_of(a->v_sn, Nk, D), ldo = ld_of(a->o_sn, Nq, D);
#pragma omp parallel
    {
        float *S = thread_scratch(omp_get_thread_num(), (size_t)Nq * Nk);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            const int b = (int)(p / H), h = (int)(p % H);
            const float *Q = q + b * a->q_sb + h * a->q_sh;
            const float *K = k + b * a->k_sb + h * a->k_sh;
            const float *V = v + b * a->v_sb + h * a->v_sh;
            float *O = out + b * a->o_sb + h * a->o_sh;
            float *L = lse + p * Nq;
            sgemm('N', 'T', Nq, Nk, D, 1.0f, Q, ldq, K, ldk, 0.0f, S, Nk);
            add_bias_mask(a, S, Nk, b, h);
            for (int i = 0; i < Nq; i++) L[i] = softmax_row(S + (int64_t)i * Nk, Nk);
            sgemm('N', 'N', Nq, D, Nk, 1.0f, S, Nk, V, ldv, 0.0f, O, ldo);
        }
    }
}

/* ---- backward ---- */

/* Sums the per-thread dbias [part_bias floats] and dhead_scale [H] copies,
 * which start `off` floats into each thread's scratch, in thread order. */
static void reduce_partials(float *dbias, float *dhead_scale, int H, size_t part_bias, size_t off,
                            int nthreads) {
    if (dbias) {
#pragma omp parallel for if (part_bias * nthreads > 65536)
        for (size_t i = 0; i < part_bias; i++) {
            float s = 0.0f;
            for (int t = 0; t < nthreads; t++) s += slots[t].buf[off + i];
            dbias[i] = s;
        }
    }
    if (dhead_scale) {
        for (int h = 0; h < H; h++) {
            float s = 0.0f;
            for (int t = 0; t < nthreads; t++) s += slots[t].buf[off + part_bias + h];
            dhead_scale[h] = s;
        }
    }
}

/* The fast path. Per-thread scratch: K^T and V^T [D, w], then R = Q K^T, P
 * and dP / dS [Nq, w] (rows padded to w = Nk rounded up to 16), then the
 * thread's dbias [H, Nq, Nk] and dhead_scale [H] sums. */
static size_t fast_bwd_floats(const visc_attention *a, int want_bias, int want_hs) {
    const size_t w = (size_t)round16(a->Nk);
    return 2 * (size_t)a->D * w + 3 * (size_t)a->Nq * w +
           (want_bias ? (size_t)a->H * a->Nq * a->Nk : 0) + (want_hs ? (size_t)a->H : 0);
}

/* acc[i, j] += x[i, j] over rows x cols (rows lda / ldx floats apart). */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
add_rows(float *acc, int64_t lda, const float *x, int64_t ldx, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        float *a = acc + i * lda;
        const float *r = x + i * ldx;
#pragma omp simd
        for (int j = 0; j < cols; j++) a[j] += r[j];
    }
}

static int backward_fast(const visc_attention *a, float *dq, float *dk, float *dv, int want_bias,
                         int want_hs, const float *dout, const float *q, const float *k,
                         const float *v, const float *out, const float *lse) {
    const int Nq = a->Nq, Nk = a->Nk, D = a->D, H = a->H, w = round16(Nk);
    const int64_t nn = (int64_t)Nq * Nk, pairs = (int64_t)a->B * H, mw = (int64_t)Nq * w;
    const size_t part_bias = want_bias ? (size_t)H * nn : 0;
    const size_t per_thread = fast_bwd_floats(a, want_bias, want_hs);
    const int level = visc_cpu_level();
    int nthreads = 1;
#pragma omp parallel
    {
        const int t = omp_get_thread_num();
#pragma omp single
        nthreads = omp_get_num_threads();
        float *KT = thread_scratch(t, per_thread), *VT = KT + (int64_t)D * w;
        float *R = VT + (int64_t)D * w, *P = R + mw, *dS = P + mw;
        float *pbias = dS + mw, *phs = pbias + part_bias;
        memset(pbias, 0, sizeof(float) * (part_bias + (want_hs ? (size_t)H : 0)));
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            const int b = (int)(p / H), h = (int)(p % H);
            const int64_t qo = b * a->q_sb + h * a->q_sh, ko = b * a->k_sb + h * a->k_sh;
            const int64_t vo = b * a->v_sb + h * a->v_sh, oo = b * a->o_sb + h * a->o_sh;
            const float *Q = q + qo, *K = k + ko, *V = v + vo, *O = out + oo, *dO = dout + oo;
            const float *L = lse + p * Nq;
            const float sh = head_scale_of(a, h);
            /* R = Q K^T is kept only for the head-scale gradient. */
            transpose_pad(KT, w, K, a->k_sn, Nk, D, level);
            small_gemm(level, Nq, w, D, Q, a->q_sn, 1, KT, w, 1.0f, want_hs ? R : P, w);
            if (want_hs) memcpy(P, R, sizeof(float) * mw);
            add_bias_mask(a, P, w, b, h);
            for (int i = 0; i < Nq; i++) exp_shifted_row(P + (int64_t)i * w, Nk, L[i]);
            /* dV = P^T dO: A = P read transposed. */
            small_gemm(level, Nk, D, Nq, P, 1, w, dO, a->o_sn, 1.0f, dv + vo, a->v_sn);
            transpose_pad(VT, w, V, a->v_sn, Nk, D, level);
            small_gemm(level, Nq, w, D, dO, a->o_sn, 1, VT, w, 1.0f, dS, w);
            float hs = 0.0f;
            for (int i = 0; i < Nq; i++) {
                const float *o = O + i * a->o_sn, *g = dO + i * a->o_sn;
                float di = 0.0f;
#pragma omp simd reduction(+ : di)
                for (int d = 0; d < D; d++) di += o[d] * g[d];
                hs += dsoftmax_row(dS + (int64_t)i * w, P + (int64_t)i * w, R + (int64_t)i * w, Nk,
                                   di, want_hs);
            }
            if (want_bias) add_rows(pbias + h * nn, Nk, dS, w, Nq, Nk);
            if (want_hs) phs[h] += hs;
            if (dq) small_gemm(level, Nq, D, Nk, dS, w, 1, K, a->k_sn, sh, dq + qo, a->q_sn);
            small_gemm(level, Nk, D, Nq, dS, 1, w, Q, a->q_sn, sh, dk + ko, a->k_sn);
        }
    }
    return nthreads;
}

void visc_attention_backward(const visc_attention *a, float *dq, float *dk, float *dv, float *dbias,
                             float *dhead_scale, const float *dout, const float *q, const float *k,
                             const float *v, const float *out, const float *lse) {
    check_shape(a);
    const int Nq = a->Nq, Nk = a->Nk, D = a->D, H = a->H;
    const int64_t nn = (int64_t)Nq * Nk, pairs = (int64_t)a->B * H;
    if (D % 16 == 0) {
        const int nt = backward_fast(a, dq, dk, dv, dbias != NULL, dhead_scale != NULL, dout, q, k,
                                     v, out, lse);
        const size_t off = fast_bwd_floats(a, 0, 0), part_bias = dbias ? (size_t)H * nn : 0;
        reduce_partials(dbias, dhead_scale, H, part_bias, off, nt);
        return;
    }
    const int64_t ldq = ld_of(a->q_sn, Nq, D), ldk = ld_of(a->k_sn, Nk, D);
    const int64_t ldv = ld_of(a->v_sn, Nk, D), ldo = ld_of(a->o_sn, Nq, D);
    /* Per thread: R = QK^T, P, dP/dS, then the thread's dbias and dhead_scale sums. */
    const size_t part_bias = dbias ? (size_t)H * nn : 0, part_hs = dhead_scale ? (size_t)H : 0;
    const size_t per_thread = 3 * (size_t)nn + part_bias + part_hs;
    int nthreads = 1;
#pragma omp parallel
    {
        const int t = omp_get_thread_num();
#pragma omp single
        nthreads = omp_get_num_threads();
        float *R = thread_scratch(t, per_thread);
        float *P = R + nn, *dS = P + nn;
        float *pbias = dS + nn, *phs = pbias + part_bias;
        memset(pbias, 0, sizeof(float) * (part_bias + part_hs));
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            const int b = (int)(p / H), h = (int)(p % H);
            const int64_t qo = b * a->q_sb + h * a->q_sh, ko = b * a->k_sb + h * a->k_sh;
            const int64_t vo = b * a->v_sb + h * a->v_sh, oo = b * a->o_sb + h * a->o_sh;
            const float *Q = q + qo, *K = k + ko, *V = v + vo, *O = out + oo, *dO = dout + oo;
            const float *L = lse + p * Nq;
            const float sh = head_scale_of(a, h);
            /* R = Q K^T is kept only for the head-scale gradient. */
            sgemm('N', 'T', Nq, Nk, D, 1.0f, Q, ldq, K, ldk, 0.0f, part_hs ? R : P, Nk);
            if (part_hs) memcpy(P, R, sizeof(float) * nn);
            add_bias_mask(a, P, Nk, b, h);
            for (int i = 0; i < Nq; i++) exp_shifted_row(P + (int64_t)i * Nk, Nk, L[i]);
            sgemm('T', 'N', Nk, D, Nq, 1.0f, P, Nk, dO, ldo, 0.0f, dv + vo, ldv);
            sgemm('N', 'T', Nq, Nk, D, 1.0f, dO, ldo, V, ldv, 0.0f, dS, Nk);
            float hs = 0.0f;
            for (int i = 0; i < Nq; i++) {
                const float *o = O + i * ldo, *g = dO + i * ldo;
                float di = 0.0f;
#pragma omp simd reduction(+ : di)
                for (int d = 0; d < D; d++) di += o[d] * g[d];
                hs += dsoftmax_row(dS + (int64_t)i * Nk, P + (int64_t)i * Nk, R + (int64_t)i * Nk,
                                   Nk, di, part_hs != 0);
            }
            if (part_bias) {
                float *pb = pbias + h * nn;
#pragma omp simd
                for (int64_t i = 0; i < nn; i++) pb[i] += dS[i];
            }
            if (part_hs) phs[h] += hs;
            if (dq) sgemm('N', 'N', Nq, D, Nk, sh, dS, Nk, K, ldk, 0.0f, dq + qo, ldq);
            sgemm('T', 'N', Nk, D, Nq, sh, dS, Nk, Q, ldq, 0.0f, dk + ko, ldk);
        }
    }
    reduce_partials(dbias, dhead_scale, H, part_bias, 3 * (size_t)nn, nthreads);
}

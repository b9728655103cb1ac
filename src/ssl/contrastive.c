/* contrastive.c: the contrastive losses of MoCo v2 and SimCLR, forward and
 * backward in one call (the losses are cheap next to the encoders; fusing
 * them keeps the softmax in one scratch buffer).
 *
 * Both are softmax cross-entropies over similarity rows; the softmax runs
 * per row in float with the row maximum subtracted (its sum in double),
 * and the large products (queries x bank, anchors x gathered views) are
 * sgemms. */
#include <dnnl.h>
#include <math.h>
#include <string.h>

#include "visc/ssl.h"

/* Row-major C[M, N] = alpha * op(A) op(B) + beta * C (oneDNN). */
static void gemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dnnl_status_t s = dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    VISC_ASSERT(s == dnnl_success);
}

void visc_l2_normalize_forward(float *y, float *norms, const float *x, int n, int dim) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        double s = 0;
        for (int j = 0; j < dim; j++) s += (double)xi[j] * xi[j];
        float norm = (float)fmax(sqrt(s), 1e-12);
        norms[i] = norm;
        for (int j = 0; j < dim; j++) y[(size_t)i * dim + j] = xi[j] / norm;
    }
}

void visc_l2_normalize_backward(float *dx, const float *dy, const float *y, const float *norms,
                                int n, int dim) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *yi = y + (size_t)i * dim, *gi = dy + (size_t)i * dim;
        double dot = 0;
        for (int j = 0; j < dim; j++) dot += (double)yi[j] * gi[j];
        for (int j = 0; j < dim; j++)
            dx[(size_t)i * dim + j] = (gi[j] - yi[j] * (float)dot) / norms[i];
    }
}

/* Softmax of row[0..L) in place, skipping index `skip` (set to 0; -1: none).
 * Returns log(sum exp) of the row (over the kept entries). */
static double softmax_row(float *row, int64_t L, int64_t skip) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < L; j++)
        if (j != skip && row[j] > mx) mx = row[j];
    double sum = 0;
    for (int64_t j = 0; j < L; j++) {
        if (j == skip) continue;
        row[j] = expf(row[j] - mx);
        sum += row[j];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < L; j++) row[j] = j == skip ? 0.0f : row[j] * inv;
    /* the maximum itself contributes exp(0) = 1: sum >= 1 */
    return (double)mx + log(fmax(sum, 1.0));
}

float visc_infonce_forward_backward(float *dq, const float *q, const float *k,
                                    const visc_memory_bank *mb, int n, float t, float *scratch) {
    const int D = mb->dim;
    const int64_t K = mb->size, L = K + 1;
    const float inv_t = 1.0f / t;
    /* logits: column 0 the positive, 1.. the bank */
    gemm('N', 'T', n, K, D, inv_t, q, D, mb->bank, D, 0.0f, scratch + 1, L);
    double loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss)
    for (int i = 0; i < n; i++) {
        float *row = scratch + (size_t)i * L;
        double pos = 0;
        for (int j = 0; j < D; j++) pos += (double)q[(size_t)i * D + j] * k[(size_t)i * D + j];
        row[0] = (float)pos * inv_t;
        float positive = row[0];
        double lse = softmax_row(row, L, -1);
        loss += lse - positive;
        /* d loss / d logits = (softmax - onehot(0)) / n */
        for (int64_t j = 0; j < L; j++) row[j] /= (float)n;
        row[0] -= 1.0f / (float)n;
    }
    /* the loss was summed before the rows became gradients */
    if (dq) {
        gemm('N', 'N', n, D, K, inv_t, scratch + 1, L, mb->bank, D, 0.0f, dq, D);
        for (int i = 0; i < n; i++) {
            float g = scratch[(size_t)i * L] * inv_t;
            for (int j = 0; j < D; j++) dq[(size_t)i * D + j] += g * k[(size_t)i * D + j];
        }
    }
    return (float)(loss / n);
}

void visc_ntxent_init(visc_ntxent *x, int n, int dim, int world, int rank) {
    x->n = n, x->dim = dim, x->world = world, x->rank = rank;
    size_t N = (size_t)n * world;
    x->all = visc_alloc_aligned(2 * N * dim * sizeof(float), "NT-Xent views");
    x->dall = visc_alloc_aligned(2 * N * dim * sizeof(float), "NT-Xent gradients");
    x->sim = visc_alloc_aligned((size_t)2 * n * 2 * N * sizeof(float), "NT-Xent similarities");
    x->send = visc_alloc_aligned((size_t)2 * n * dim * sizeof(float), "NT-Xent local views");
    x->dA = visc_alloc_aligned((size_t)2 * n * dim * sizeof(float), "NT-Xent local gradients");
}

float visc_ntxent_local(const float *A, const float *all, int n, int N, int rank, int D, float t,
                        float *sim, float *dA, float *dall) {
    const int64_t R = 2 * (int64_t)n, C = 2 * (int64_t)N;
    const float inv_t = 1.0f / t;
    gemm('N', 'T', R, C, D, inv_t, A, D, all, D, 0.0f, sim, C);
    double loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss)
    for (int64_t a = 0; a < R; a++) {
        /* row a < n is z0 of local sample a: itself at column rank*n + a,
         * its partner (z1 of the same sample) at N + rank*n + a; and the
         * other way round for the z1 rows */
        int64_t i = a < n ? a : a - n;
        int64_t self = (a < n ? 0 : N) + (int64_t)rank * n + i;
        int64_t partner = (a < n ? N : 0) + (int64_t)rank * n + i;
        float *row = sim + a * C;
        float pos = row[partner];
        double lse = softmax_row(row, C, self);
        loss += lse - pos;
        for (int64_t j = 0; j < C; j++) row[j] /= (float)R;
        row[partner] -= 1.0f / (float)R;
    }
    /* every local row is an anchor (its row of S) and a candidate of every
     * rank's anchors (its column): dA = S all / t here, and the columns'
     * share S^T A / t, which the other ranks' anchors add to */
    gemm('N', 'N', R, D, C, inv_t, sim, C, all, D, 0.0f, dA, D);
    gemm('T', 'N', C, D, R, inv_t, sim, C, A, D, 0.0f, dall, D);
    return (float)(loss / R);
}

float visc_ntxent_forward_backward(visc_ntxent *x, visc_dist *d, const float *z0, const float *z1,
                                   float t, float *dz0, float *dz1) {
    const int n = x->n, D = x->dim, rank = x->rank;
    const int64_t N = (int64_t)n * x->world;
    const size_t view = (size_t)n * D;
    /* local anchors A = [z0; z1]; all = [z0 of every rank; z1 of every rank] */
    float *A = x->send;
    memcpy(A, z0, view * sizeof(float));
    memcpy(A + view, z1, view * sizeof(float));
    if (x->world == 1) {
        memcpy(x->all, A, 2 * view * sizeof(float));
    } else {
        /* gathered per rank as [z0_r; z1_r]; regrouped by view */
        if (visc_dist_allgather(d, A, x->dall, 2 * view * sizeof(float))) return NAN;
        for (int r = 0; r < x->world; r++) {
            memcpy(x->all + (size_t)r * view, x->dall + 2 * (size_t)r * view, view * sizeof(float));
            memcpy(x->all + N * D + (size_t)r * view, x->dall + (2 * (size_t)r + 1) * view,
                   view * sizeof(float));
        }
    }
    const float loss = visc_ntxent_local(A, x->all, n, (int)N, rank, D, t, x->sim, x->dA, x->dall);
    const float *dall = x->dall, *dA = x->dA;
    if (x->world > 1 &&
        visc_dist_allreduce(d, x->dall, (size_t)2 * N * D, VISC_DT_F32, VISC_OP_SUM))
        return NAN;
    const float *own0 = dall + (size_t)rank * view, *own1 = dall + N * D + (size_t)rank * view;
    for (size_t j = 0; j < view; j++) {
        dz0[j] = dA[j] + own0[j];
        dz1[j] = dA[view + j] + own1[j];
    }
    return loss;
}

void visc_ntxent_free(visc_ntxent *x) {
    visc_free_aligned(x->all);
    visc_free_aligned(x->dall);
    visc_free_aligned(x->sim);
    visc_free_aligned(x->send);
    visc_free_aligned(x->dA);
}

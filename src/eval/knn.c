/* knn.c: the weighted kNN classifier of the SSL benchmark (lightly's
 * knn_predict; definitions and tie rules in ssl_eval.h).
 *
 * Cost: queries x bank similarities dominate (ImageNet: 50k x 1.28M x
 * 2048). They are computed by dnnl_sgemm a block of query rows at a time,
 * the block sized so its similarity matrix stays near 128 MB whatever the
 * bank size; each query row then keeps its k best bank rows with a binary
 * min-heap (O(N log k), no sort of N values). Rows of a block are
 * independent: one OpenMP loop, each thread with its own heap. */
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "visc/ssl_eval.h"

#define SIM_BLOCK_FLOATS ((size_t)32 << 20)

typedef struct {
    float sim;
    int64_t idx;
} neighbour;

/* a ranks before b: more similar, or as similar and earlier in the bank */
static int better(const neighbour *a, const neighbour *b) {
    return a->sim > b->sim || (a->sim == b->sim && a->idx < b->idx);
}

/* Min-heap on `better`: h[0] is the worst neighbour kept. */
static void sift_down(neighbour *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l])) w = l;
        if (r < n && better(&h[w], &h[r])) w = r;
        if (w == i) return;
        neighbour tmp = h[i];
        h[i] = h[w];
        h[w] = tmp;
        i = w;
    }
}

static void sift_up(neighbour *h, int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!better(&h[p], &h[i])) return;
        neighbour tmp = h[i];
        h[i] = h[p];
        h[p] = tmp;
        i = p;
    }
}

/* The k best of sims[0..n) into heap (unordered); returns how many. NaN
 * similarities (a broken feature) are never neighbours. */
static int select_top(const float *sims, int64_t n, int k, neighbour *heap) {
    int size = 0;
    for (int64_t j = 0; j < n; j++) {
        neighbour c = {sims[j], j};
        if (c.sim != c.sim) continue;
        if (size < k) {
            heap[size] = c;
            sift_up(heap, size++);
        } else if (better(&c, &heap[0])) {
            heap[0] = c;
            sift_down(heap, size, 0);
        }
    }
    return size;
}

int visc_knn_scores(const visc_feature_bank *bank, const float *queries, int64_t nq, int k, float t,
                    float *scores) {
    if (k < 1) return visc_set_error("kNN: k must be >= 1, got %d", k);
    if (!(t > 0)) return visc_set_error("kNN: temperature t must be > 0, got %g", (double)t);
    const int C = bank->num_classes, D = bank->dim;
    const int64_t N = bank->count;
    memset(scores, 0, (size_t)nq * C * sizeof(float));
    if (nq == 0 || N == 0) return 0;
    if (k > N) k = (int)N;
    int64_t rows = (int64_t)(SIM_BLOCK_FLOATS / (size_t)N);
    if (rows < 1) rows = 1;
    if (rows > nq) rows = nq;
    float *sims = visc_alloc_aligned((size_t)rows * N * sizeof(float), "kNN similarities");
    int threads = visc_num_threads();
    neighbour *heaps = visc_malloc((size_t)threads * k * sizeof(neighbour), "kNN heaps");
    double *acc = visc_malloc((size_t)threads * C * sizeof(double), "kNN class scores");
    int rc = 0;
    for (int64_t q0 = 0; q0 < nq && rc == 0; q0 += rows) {
        int64_t m = nq - q0 < rows ? nq - q0 : rows;
        /* sims[m, N] = queries[m, D] . bank[N, D]^T */
        dnnl_status_t s = dnnl_sgemm('N', 'T', m, N, D, 1.0f, queries + (size_t)q0 * D, D,
                                     bank->feats, D, 0.0f, sims, N);
        if (s != dnnl_success) {
            rc = visc_set_error("kNN: dnnl_sgemm failed (status %d)", (int)s);
            break;
        }
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
        for (int64_t i = 0; i < m; i++) {
            int tid = omp_get_thread_num();
            neighbour *heap = heaps + (size_t)tid * k;
            double *sc = acc + (size_t)tid * C;
            int found = select_top(sims + (size_t)i * N, N, k, heap);
            for (int c = 0; c < C; c++) sc[c] = 0;
            for (int j = 0; j < found; j++)
                sc[bank->labels[heap[j].idx]] += exp((double)heap[j].sim / t);
            float *out = scores + (size_t)(q0 + i) * C;
            for (int c = 0; c < C; c++) out[c] = (float)sc[c];
        }
    }
    free(acc);
    free(heaps);
    visc_free_aligned(sims);
    return rc;
}

int visc_knn_rank(const float *scores, int num_classes, int label) {
    int rank = 0;
    const float own = scores[label];
    for (int c = 0; c < num_classes; c++)
        if (scores[c] > own || (c < label && scores[c] == own)) rank++;
    return rank;
}

int visc_knn_classify(const visc_feature_bank *bank, const visc_feature_bank *queries, int k,
                      float t, visc_knn_counts *out) {
    memset(out, 0, sizeof *out);
    if (queries->dim != bank->dim)
        return visc_set_error("kNN: query features have %d dimensions, the bank %d", queries->dim,
                              bank->dim);
    const int C = bank->num_classes;
    /* The scores in blocks of queries, so memory stays small for any count. */
    const int64_t block = 4096;
    float *scores = visc_malloc((size_t)block * C * sizeof(float), "kNN scores");
    int rc = 0;
    for (int64_t q0 = 0; q0 < queries->count && rc == 0; q0 += block) {
        int64_t n = queries->count - q0 < block ? queries->count - q0 : block;
        rc = visc_knn_scores(bank, queries->feats + (size_t)q0 * queries->dim, n, k, t, scores);
        for (int64_t i = 0; i < n && rc == 0; i++) {
            int label = queries->labels[q0 + i];
            if (label < 0 || label >= C) continue; /* a class the bank never saw: a miss */
            int r = visc_knn_rank(scores + (size_t)i * C, C, label);
            out->top1 += r < 1;
            out->top5 += r < 5;
        }
    }
    out->count = queries->count;
    free(scores);
    return rc;
}

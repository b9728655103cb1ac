/* linear.c: fully connected layer y = x W^T + b on row-major [N, in] inputs.
 *
 * All three products go through oneDNN's dnnl_sgemm (row-major C API), which
 * is threaded with OpenMP and picks its kernels for the CPU at run time:
 *   forward      out[N, out]  = in[N, in] * W[out, in]^T  (+ b, preloaded into out)
 *   backward     din[N, in]   = dout[N, out] * W[out, in]
 *                dW[out, in]  = dout[N, out]^T * in[N, in]
 *                db[out]      = column sums of dout
 * With visc_set_matmul_precision(VISC_PRECISION_BF16) the three products go
 * through linear_bf16.c instead (bf16 operands, fp32 accumulation); the bias
 * gradient stays an fp32 column sum either way. */
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "linear_bf16.h"
#include "visc/nn.h"

static void sgemm(char ta, char tb, int M, int Ncols, int K, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
    dnnl_status_t s = dnnl_sgemm(ta, tb, M, Ncols, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    if (s != dnnl_success)
        visc_die("dnnl_sgemm(%c, %c, %d, %d, %d) failed: status %d", ta, tb, M, Ncols, K, (int)s);
}

/* Column sums of dout [N, cols] for the bias gradient. A thread walking one
 * column down all rows reads one float per row at a stride of `cols`:
 * cache- and TLB-hostile, and ~10% of a ViT step. Instead the rows are cut
 * into DB_CHUNKS fixed ranges; each range is summed row by row into its own
 * partial vector (contiguous, vectorized), and the partials are added in
 * chunk order. The chunking does not depend on the thread count, so the
 * result is the same for any number of threads. The partials live in a
 * buffer grown on demand and kept, so a training step allocates nothing
 * after its first iteration (callers are not concurrent: the layers of a
 * model run one after another). */
#define DB_CHUNKS 32

static float *db_part;
static size_t db_cap; /* floats */

/* acc[j] += rows r0..r1 of dout, and (bf16 != NULL) those rows rounded to
 * bf16 into bf16: the bf16 path needs that copy of dout anyway, and making
 * it here reads dout once instead of twice. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
sum_rows(float *acc, uint16_t *bf16, const float *dout, int r0, int r1, int cols) {
    for (int n = r0; n < r1; n++) {
        const float *row = dout + (size_t)n * cols;
#pragma omp simd
        for (int j = 0; j < cols; j++) acc[j] += row[j];
        if (bf16) {
            uint16_t *out = bf16 + (size_t)n * cols;
            for (int j = 0; j < cols; j++) out[j] = visc_f32_to_bf16(row[j]);
        }
    }
}

void visc_linear_column_sums(float *dbias, uint16_t *bf16, const float *dout, int N, int cols) {
    const int chunks = N < DB_CHUNKS ? N : DB_CHUNKS;
    const size_t need = (size_t)chunks * cols;
    if (db_cap < need) {
        visc_free_aligned(db_part);
        db_part = visc_alloc_aligned(need * sizeof(float), "linear bias partials");
        db_cap = need;
    }
    float *part = db_part;
#pragma omp parallel for schedule(static) if ((size_t)N * cols > 65536)
    for (int c = 0; c < chunks; c++) {
        const int r0 = (int)((int64_t)N * c / chunks), r1 = (int)((int64_t)N * (c + 1) / chunks);
        float *acc = part + (size_t)c * cols;
        memset(acc, 0, sizeof(float) * cols);
        sum_rows(acc, bf16, dout, r0, r1, cols);
    }
#pragma omp parallel for schedule(static) if (need > 65536)
    for (int j = 0; j < cols; j++) {
        float s = 0.0f;
        for (int c = 0; c < chunks; c++) s += part[(size_t)c * cols + j];
        dbias[j] = s;
    }
}

void visc_linear_forward(float *out, const float *in, const float *weight, const float *bias, int N,
                         int in_features, int out_features) {
    VISC_ASSERT(N > 0 && in_features > 0 && out_features > 0);
    if (visc_matmul_precision() == VISC_PRECISION_BF16 &&
        visc_linear_bf16_forward(out, in, weight, bias, N, in_features, out_features) == 0)
        return;
    /* Preloading the bias and accumulating with beta = 1 saves a second pass over out. */
    if (bias) {
#pragma omp parallel for if ((size_t)N * out_features > 65536)
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * out_features, bias, sizeof(float) * out_features);
    }
    sgemm('N', 'T', N, out_features, in_features, in, in_features, weight, in_features,
          bias ? 1.0f : 0.0f, out, out_features);
}

void visc_linear_backward(float *din, float *dweight, float *dbias, const float *dout,
                          const float *in, const float *weight, int N, int in_features,
                          int out_features) {
    VISC_ASSERT(N > 0 && in_features > 0 && out_features > 0);
    if (visc_matmul_precision() == VISC_PRECISION_BF16 &&
        visc_linear_bf16_backward(din, dweight, dbias, dout, in, weight, N, in_features,
                                  out_features) == 0)
        return;
    if (dbias) visc_linear_column_sums(dbias, NULL, dout, N, out_features);
    if (din)
        sgemm('N', 'N', N, in_features, out_features, dout, out_features, weight, in_features, 0.0f,
              din, in_features);
    sgemm('T', 'N', out_features, in_features, N, dout, out_features, in, in_features, 0.0f,
          dweight, in_features);
}

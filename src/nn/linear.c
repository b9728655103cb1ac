/* linear.c: fully connected layer y = x W^T + b on row-major [N, in] inputs.
 *
 * All three products go through oneDNN's dnnl_sgemm (row-major C API), which
 * is threaded with OpenMP and picks its kernels for the CPU at run time:
 *   forward      out[N, out]  = in[N, in] * W[out, in]^T  (+ b, preloaded into out)
 *   backward     din[N, in]   = dout[N, out] * W[out, in]
 *                dW[out, in]  = dout[N, out]^T * in[N, in]
 *                db[out]      = column sums of dout */
#include <oneapi/dnnl/dnnl.h>
#include <string.h>

#include "visc/nn.h"

static void sgemm(char ta, char tb, int M, int Ncols, int K, const float *A, int lda,
                  const float *B, int ldb, float beta, float *C, int ldc) {
    dnnl_status_t s = dnnl_sgemm(ta, tb, M, Ncols, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    if (s != dnnl_success)
        visc_die("dnnl_sgemm(%c, %c, %d, %d, %d) failed: status %d", ta, tb, M, Ncols, K, (int)s);
}

void visc_linear_forward(float *out, const float *in, const float *weight, const float *bias, int N,
                         int in_features, int out_features) {
    VISC_ASSERT(N > 0 && in_features > 0 && out_features > 0);
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
    if (din)
        sgemm('N', 'N', N, in_features, out_features, dout, out_features, weight, in_features, 0.0f,
              din, in_features);
    sgemm('T', 'N', out_features, in_features, N, dout, out_features, in, in_features, 0.0f,
          dweight, in_features);
    if (dbias) {
/* Column sums: each thread owns a range of output features and walks the
 * rows in order, so the result does not depend on the thread count. */
#pragma omp parallel for if ((size_t)N * out_features > 65536)
        for (int j = 0; j < out_features; j++) {
            float s = 0.0f;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * out_features + j];
            dbias[j] = s;
        }
    }
}

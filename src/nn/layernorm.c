/* layernorm.c: LayerNorm over the last dimension of [rows, C] (torch.nn.LayerNorm).
 *
 *   forward   xhat = (x - mean) * rstd,  out = xhat * gamma + beta
 *   backward  din = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dout * gamma
 *             dgamma = sum_rows dout * xhat,  dbeta = sum_rows dout
 *
 * Rows are independent, so both passes thread over rows. The statistics use
 * two passes over the row (mean, then centred variance) in float: rows are
 * short (C <= 1024) and cache-resident, and the centred form avoids the
 * cancellation of E[x^2] - E[x]^2 on inputs with a large mean (the residual
 * stream of a deep ViT); the mean itself is summed relative to the row's
 * first element for the same reason.
 *
 * The parameter gradients: see visc_layernorm_backward. */
#include <math.h>

#include "visc/core.h"
#include "visc/tokens.h"

/* One row: its statistics, then the normalized (and affine) output. The
 * 16-lane clone matters: rows are short (96..768) and cache-resident, so the
 * pass is bound by arithmetic, and the default build targets SSE2. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
forward_row(float *y, float *save_mean, float *save_rstd, const float *x, const float *gamma,
            const float *beta, int C, float eps) {
    /* Sums of x - x[0]: the row's offset drops out before rounding. */
    const float x0 = x[0];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c] - x0;
    const float mean = x0 + sum / (float)C;
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int c = 0; c < C; c++) var += (x[c] - mean) * (x[c] - mean);
    const float rstd = 1.0f / sqrtf(var / (float)C + eps);
    if (gamma && beta) {
        for (int c = 0; c < C; c++) y[c] = (x[c] - mean) * rstd * gamma[c] + beta[c];
    } else if (gamma) {
        for (int c = 0; c < C; c++) y[c] = (x[c] - mean) * rstd * gamma[c];
    } else {
        for (int c = 0; c < C; c++) y[c] = (x[c] - mean) * rstd;
        if (beta)
            for (int c = 0; c < C; c++) y[c] += beta[c];
    }
    *save_mean = mean;
    *save_rstd = rstd;
}

void visc_layernorm_forward(float *out, float *save_mean, float *save_rstd, const float *in,
                            const float *gamma, const float *beta, int64_t rows, int C, float eps) {
    VISC_ASSERT(rows >= 0 && C > 0);
#pragma omp parallel for if (rows * C > 32768)
    for (int64_t r = 0; r < rows; r++)
        forward_row(out + r * C, save_mean + r, save_rstd + r, in + r * C, gamma, beta, C, eps);
}

/* The parameter gradients are column sums over all rows, taken in the same
 * pass as din (the rows are read once): the rows are cut into LN_CHUNKS
 * fixed ranges, each range sums dout * xhat and dout into its own partial
 * vectors, and the partials are added in range order. The cut does not
 * depend on the thread count, so neither does the result. The partials live
 * in a buffer grown on demand and kept (a training step allocates nothing
 * after its first iteration; layers run one after another). */
#define LN_CHUNKS 32

static float *ln_part;
static size_t ln_cap; /* floats */

static float *partials(size_t floats) {
    if (ln_cap < floats) {
        visc_free_aligned(ln_part);
        ln_part = visc_alloc_aligned(floats * sizeof(float), "layernorm partials");
        ln_cap = floats;
    }
    return ln_part;
}

/* One row of din (when din; added to it with acc) and its share of the
 * dgamma / dbeta sums (when pg). */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
backward_row(float *dx, int acc, float *pg, float *pb, const float *dy, const float *x,
             const float *gamma, float mean, float rstd, int C) {
    if (dx) {
        /* Two row sums: mean(g) and mean(g * xhat). */
        float sg = 0.0f, sgx = 0.0f;
        if (gamma) {
#pragma omp simd reduction(+ : sg, sgx)
            for (int c = 0; c < C; c++) {
                float g = dy[c] * gamma[c];
                sg += g;
                sgx += g * (x[c] - mean);
            }
        } else {
#pragma omp simd reduction(+ : sg, sgx)
            for (int c = 0; c < C; c++) {
                sg += dy[c];
                sgx += dy[c] * (x[c] - mean);
            }
        }
        const float mg = sg / (float)C, mgx = sgx * rstd / (float)C;
        if (gamma) {
#pragma omp simd
            for (int c = 0; c < C; c++) {
                const float v = rstd * (dy[c] * gamma[c] - mg - (x[c] - mean) * rstd * mgx);
                dx[c] = acc ? dx[c] + v : v;
            }
        } else {
#pragma omp simd
            for (int c = 0; c < C; c++) {
                const float v = rstd * (dy[c] - mg - (x[c] - mean) * rstd * mgx);
                dx[c] = acc ? dx[c] + v : v;
            }
        }
    }
    if (pg) {
#pragma omp simd
        for (int c = 0; c < C; c++) {
            pg[c] += dy[c] * (x[c] - mean) * rstd;
            pb[c] += dy[c];
        }
    }
}

static void layernorm_backward(float *din, int acc, float *dgamma, float *dbeta, const float *dout,
                               const float *in, const float *gamma, const float *save_mean,
                               const float *save_rstd, int64_t rows, int C) {
    VISC_ASSERT(rows >= 0 && C > 0);
    const int want_params = gamma && dgamma; /* no affine: nothing to learn */
    if (rows == 0) {
        if (want_params)
            for (int c = 0; c < C; c++) {
                dgamma[c] = 0.0f;
                if (dbeta) dbeta[c] = 0.0f;
            }
        return;
    }
    const int chunks = rows < LN_CHUNKS ? (int)rows : LN_CHUNKS;
    float *part = want_params ? partials((size_t)chunks * 2 * C) : NULL;
#pragma omp parallel for schedule(static) if (rows * C > 32768)
    for (int k = 0; k < chunks; k++) {
        const int64_t r0 = rows * k / chunks, r1 = rows * (k + 1) / chunks;
        float *pg = part ? part + (size_t)k * 2 * C : NULL, *pb = pg ? pg + C : NULL;
        if (pg)
            for (int c = 0; c < 2 * C; c++) pg[c] = 0.0f;
        for (int64_t r = r0; r < r1; r++)
            backward_row(din ? din + r * C : NULL, acc, pg, pb, dout + r * C, in + r * C, gamma,
                         save_mean[r], save_rstd[r], C);
    }
    if (!want_params) return;
#pragma omp parallel for schedule(static) if ((int64_t)chunks * C > 32768)
    for (int c = 0; c < C; c++) {
        float sg = 0.0f, sb = 0.0f;
        for (int k = 0; k < chunks; k++) {
            sg += part[(size_t)k * 2 * C + c];
            sb += part[(size_t)k * 2 * C + C + c];
        }
        dgamma[c] = sg;
        if (dbeta) dbeta[c] = sb;
    }
}

void visc_layernorm_backward(float *din, float *dgamma, float *dbeta, const float *dout,
                             const float *in, const float *gamma, const float *save_mean,
                             const float *save_rstd, int64_t rows, int C) {
    layernorm_backward(din, 0, dgamma, dbeta, dout, in, gamma, save_mean, save_rstd, rows, C);
}

void visc_layernorm_backward_add(float *din, float *dgamma, float *dbeta, const float *dout,
                                 const float *in, const float *gamma, const float *save_mean,
                                 const float *save_rstd, int64_t rows, int C) {
    layernorm_backward(din, 1, dgamma, dbeta, dout, in, gamma, save_mean, save_rstd, rows, C);
}

/* batchnorm2d.c: batch normalization over (N, H, W) per channel, PyTorch
 * semantics, optionally fused with a following ReLU.
 *
 * Own OpenMP loops rather than oneDNN's primitive: in NCHW every channel is
 * N contiguous runs of HW floats, so one thread per channel streams memory
 * with no layout conversion, and we control the accuracy of the sums. Sums
 * run in float over a row (HW <= a few thousand, 16 partial lanes) and in
 * double across rows, and the variance is taken around the mean (two
 * passes), so it does not cancel when |mean| >> std. */
#include <math.h>
#include <stdlib.h>

#include "visc/nn.h"

#define LANES 16

/* sum x[i] */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static double
row_sum(const float *x, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l];
    double s = 0;
    for (; i < n; i++) s += x[i];
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

/* sum (x[i] - m)^2 */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static double
row_sqdev(const float *x, int n, float m) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) {
            float d = x[i + l] - m;
            acc[l] += d * d;
        }
    double s = 0;
    for (; i < n; i++) s += (double)(x[i] - m) * (x[i] - m);
    for (int l = 0; l < LANES; l++) s += acc[l];
    return s;
}

/* out = max?((x - mean) * scale + shift). Centering first (rather than
 * x * scale + (shift - mean * scale)) keeps precision when |mean| >> std. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
row_affine(float *out, const float *x, int n, float mean, float scale, float shift, int relu) {
    if (relu)
        for (int i = 0; i < n; i++) {
            float y = (x[i] - mean) * scale + shift;
            out[i] = y > 0 ? y : 0;
        }
    else
        for (int i = 0; i < n; i++) out[i] = (x[i] - mean) * scale + shift;
}

/* A training forward's scale, gamma / sqrt(var + eps), from the saved
 * float rstd (not the double it was rounded from), so that
 * visc_batchnorm2d_apply recomputes the output from the saved statistics
 * bit for bit; backward's gamma * rstd is the same product. */
static float saved_scale(const float *gamma, const float *save_rstd, int c) {
    return (float)(gamma[c] * (double)save_rstd[c]);
}

/* ---- small planes ----
 *
 * With HW <= SMALL_HW (ResNet-18's last stages at 32 px: 4x4, 2x2, 1x1) a
 * row is too short to vectorize or to pay for a call, and the per-row code
 * above runs scalar. Here a task takes CHUNK channels and walks the batch:
 * image n contributes one contiguous run of L = CHUNK*HW floats, and every
 * loop is a flat, unit-stride loop over that run with one double
 * accumulator per element (per-channel constants expanded per element), so
 * it vectorizes; the per-channel sums over the HW accumulators come last.
 * Everything is summed in double, so the accuracy is at least that of the
 * row path (two-pass variance, double across rows). */
#define SMALL_HW 16 /* measured: 4x4 planes gain ~1.7x here, 8x8 lose */
#define CHUNK 32
#define CHUNK_L (CHUNK * SMALL_HW)

typedef struct {
    double a[CHUNK_L], b[CHUNK_L];                              /* per element, then per channel */
    float mean[CHUNK_L], k1[CHUNK_L], k2[CHUNK_L], k3[CHUNK_L]; /* per element */
} chunk_acc;

/* per-element accumulators -> per-channel sums in a[0..nc), b[0..nc) */
static void chunk_reduce(chunk_acc *t, int nc, int HW) {
    for (int j = 0; j < nc; j++) {
        double sa = 0, sb = 0;
        for (int i = 0; i < HW; i++) sa += t->a[j * HW + i], sb += t->b[j * HW + i];
        t->a[j] = sa, t->b[j] = sb;
    }
}

/* per-channel value v[j] -> per element */
static void chunk_expand(float *dst, const float *v, int nc, int HW) {
    for (int j = nc - 1; j >= 0; j--) /* backwards: dst may be v (in place) */
        for (int i = HW - 1; i >= 0; i--) dst[j * HW + i] = v[j];
}

/* The output of channels c0 .. c0 + CHUNK from the saved statistics: the
 * last pass of a training forward, and visc_batchnorm2d_apply. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
small_apply_chunk(const visc_batchnorm2d *b, int c0, float *out, const float *in,
                  const float *gamma, const float *beta, const float *save_mean,
                  const float *save_rstd) {
    const int N = b->N, HW = b->HW, nc = b->C - c0 < CHUNK ? b->C - c0 : CHUNK, L = nc * HW;
    const size_t plane = (size_t)b->C * HW, off = (size_t)c0 * HW;
    float mean[CHUNK_L], scale[CHUNK_L], shift[CHUNK_L];
    for (int j = 0; j < nc; j++) scale[j] = saved_scale(gamma, save_rstd, c0 + j);
    chunk_expand(mean, save_mean + c0, nc, HW);
    chunk_expand(scale, scale, nc, HW);
    chunk_expand(shift, beta + c0, nc, HW);
    for (int n = 0; n < N; n++) {
        const float *xn = in + off + n * plane;
        float *yn = out + off + n * plane;
        if (b->relu)
            for (int e = 0; e < L; e++) {
                float y = (xn[e] - mean[e]) * scale[e] + shift[e];
                yn[e] = y > 0 ? y : 0.0f;
            }
        else
            for (int e = 0; e < L; e++) yn[e] = (xn[e] - mean[e]) * scale[e] + shift[e];
    }
}

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
small_forward_chunk(const visc_batchnorm2d *b, int c0, float *out, float *save_mean,
                    float *save_rstd, const float *in, const float *gamma, const float *beta,
                    float *running_mean, float *running_var) {
    const int N = b->N, HW = b->HW, nc = b->C - c0 < CHUNK ? b->C - c0 : CHUNK, L = nc * HW;
    const size_t plane = (size_t)b->C * HW, off = (size_t)c0 * HW;
    const double M = (double)N * HW;
    const float *x = in + off;
    chunk_acc t;
    for (int e = 0; e < L; e++) t.a[e] = t.b[e] = 0;
    for (int n = 0; n < N; n++) {
        const float *xn = x + n * plane;
        for (int e = 0; e < L; e++) t.a[e] += xn[e];
    }
    chunk_reduce(&t, nc, HW);
    for (int j = 0; j < nc; j++) t.k3[j] = (float)(t.a[j] / M); /* the float mean */
    chunk_expand(t.mean, t.k3, nc, HW);
    for (int e = 0; e < L; e++) t.b[e] = 0;
    for (int n = 0; n < N; n++) {
        const float *xn = x + n * plane;
        for (int e = 0; e < L; e++) {
            float d = xn[e] - t.mean[e];
            t.b[e] += (double)d * d;
        }
    }
    for (int j = 0; j < nc; j++) { /* chunk_reduce of b only (a holds the sums) */
        double sb = 0;
        for (int i = 0; i < HW; i++) sb += t.b[j * HW + i];
        t.b[j] = sb;
    }
    for (int j = 0; j < nc; j++) {
        int c = c0 + j;
        double mean = t.a[j] / M;
        /* as in the row path: the float mean's error folded out */
        double dm = mean - (double)t.k3[j];
        double var = t.b[j] / M - dm * dm;
        if (var < 0) var = 0;
        double rstd = 1.0 / sqrt(var + b->eps);
        save_mean[c] = t.k3[j];
        save_rstd[c] = (float)rstd;
        double unbiased = M > 1 ? var * M / (M - 1) : var;
        if (running_mean) { /* NULL: a recomputed forward (--grad-checkpointing) */
            running_mean[c] = (float)((1.0 - b->momentum) * running_mean[c] + b->momentum * mean);
            running_var[c] = (float)((1.0 - b->momentum) * running_var[c] + b->momentum * unbiased);
        }
    }
    small_apply_chunk(b, c0, out, in, gamma, beta, save_mean, save_rstd);
}

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
small_backward_chunk(const visc_batchnorm2d *b, int c0, float *din, float *dgamma, float *dbeta,
                     const float *dout, const float *in, const float *out, const float *gamma,
                     const float *save_mean, const float *save_rstd) {
    const int N = b->N, HW = b->HW, nc = b->C - c0 < CHUNK ? b->C - c0 : CHUNK, L = nc * HW;
    const size_t plane = (size_t)b->C * HW, off = (size_t)c0 * HW;
    const double M = (double)N * HW;
    chunk_acc t;
    chunk_expand(t.mean, save_mean + c0, nc, HW);
    for (int e = 0; e < L; e++) t.a[e] = t.b[e] = 0;
    /* a = sum dy, b = sum dy * (x - mean), dy masked by the fused ReLU. The
     * mask is its own loop: gcc 12 does not if-convert a float select that
     * feeds double arithmetic, and leaves the fused loop scalar. */
    float masked[CHUNK_L];
    for (int n = 0; n < N; n++) {
        const float *dn = dout + off + n * plane, *xn = in + off + n * plane;
        if (b->relu) {
            const float *on = out + off + n * plane;
            for (int e = 0; e < L; e++) {
                float g = dn[e], o = on[e];
                masked[e] = o > 0 ? g : 0.0f;
            }
            dn = masked;
        }
        for (int e = 0; e < L; e++) {
            t.a[e] += dn[e];
            t.b[e] += (double)dn[e] * (xn[e] - t.mean[e]);
        }
    }
    chunk_reduce(&t, nc, HW);
    for (int j = 0; j < nc; j++) {
        int c = c0 + j;
        double rstd = save_rstd[c];
        dbeta[c] = (float)t.a[j];
        dgamma[c] = (float)(t.b[j] * rstd);
        t.k1[j] = (float)(gamma[c] * rstd);
        t.k2[j] = (float)(t.a[j] / M);
        t.k3[j] = (float)(t.b[j] / M * rstd * rstd);
    }
    if (!din) return;
    chunk_expand(t.k1, t.k1, nc, HW);
    chunk_expand(t.k2, t.k2, nc, HW);
    chunk_expand(t.k3, t.k3, nc, HW);
    /* din = k1 * (dy - k2 - (x - mean) * k3); din may alias dout */
    for (int n = 0; n < N; n++) {
        const float *dn = dout + off + n * plane, *xn = in + off + n * plane;
        float *gn = din + off + n * plane;
        if (b->relu) {
            const float *on = out + off + n * plane;
            for (int e = 0; e < L; e++) {
                float g = dn[e], o = on[e];
                float dy = o > 0 ? g : 0.0f;
                gn[e] = t.k1[e] * (dy - t.k2[e] - (xn[e] - t.mean[e]) * t.k3[e]);
            }
        } else
            for (int e = 0; e < L; e++)
                gn[e] = t.k1[e] * (dn[e] - t.k2[e] - (xn[e] - t.mean[e]) * t.k3[e]);
    }
}

void visc_batchnorm2d_init(visc_batchnorm2d *b, int N, int C, int HW, float eps, float momentum,
                           int relu) {
    VISC_ASSERT(N > 0 && C > 0 && HW > 0);
    b->N = N, b->C = C, b->HW = HW;
    b->eps = eps, b->momentum = momentum, b->relu = relu;
    b->device = VISC_DEVICE_CPU;
    b->impl = NULL; /* scratch of the synchronized path only */
    b->sync = NULL;
    b->sync_ctx = NULL;
}

void visc_batchnorm2d_set_sync(visc_batchnorm2d *b, visc_bn_sync_fn fn, void *ctx) {
    b->sync = fn;
    b->sync_ctx = ctx;
    if (fn && !b->impl) b->impl = visc_calloc(2 * (size_t)b->C + 1, sizeof(double), "SyncBN sums");
}

/* Channel c of the row path's output from the saved statistics. */
static void apply_channel(const visc_batchnorm2d *b, int c, float *out, const float *in,
                          const float *gamma, const float *beta, const float *save_mean,
                          const float *save_rstd) {
    const size_t plane = (size_t)b->C * b->HW, off = (size_t)c * b->HW;
    const float scale = saved_scale(gamma, save_rstd, c);
    for (int n = 0; n < b->N; n++)
        row_affine(out + off + n * plane, in + off + n * plane, b->HW, save_mean[c], scale, beta[c],
                   b->relu);
}

/* One channel of the row path, from its mean (double), the float mean the
 * squared deviations ss (over M values) were taken around: the saved
 * statistics, the running ones, and the normalized output. The float
 * mean's error, (mean - fmean)^2 * M, is folded out of the variance. */
static void finish_channel(const visc_batchnorm2d *b, int c, double mean, float fmean, double ss,
                           double M, float *out, const float *in, const float *gamma,
                           const float *beta, float *save_mean, float *save_rstd,
                           float *running_mean, float *running_var) {
    double dm = mean - (double)fmean;
    double var = ss / M - dm * dm;
    if (var < 0) var = 0;
    double rstd = 1.0 / sqrt(var + b->eps);
    save_mean[c] = fmean;
    save_rstd[c] = (float)rstd;
    double unbiased = M > 1 ? var * M / (M - 1) : var;
    if (running_mean) { /* NULL: a recomputed forward (--grad-checkpointing) */
        running_mean[c] = (float)((1.0 - b->momentum) * running_mean[c] + b->momentum * mean);
        running_var[c] = (float)((1.0 - b->momentum) * running_var[c] + b->momentum * unbiased);
    }
    apply_channel(b, c, out, in, gamma, beta, save_mean, save_rstd);
}

/* Synchronized statistics: the row path with the per-channel sums reduced
 * over the processes between the passes (sums, then squared deviations
 * around the global mean: the same two-pass accuracy as one process). The
 * passes are public (nn.h) for a device that reduces between them. */
void visc_batchnorm2d_sync_sums(const visc_batchnorm2d *b, double *acc, const float *in) {
    const int N = b->N, C = b->C, HW = b->HW;
    const size_t plane = (size_t)C * HW;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int n = 0; n < N; n++) s += row_sum(in + (size_t)c * HW + n * plane, HW);
        acc[c] = s;
    }
    acc[C] = (double)N * HW;
}

void visc_batchnorm2d_sync_sqdev(const visc_batchnorm2d *b, double *acc, float *save_mean,
                                 const float *in) {
    const int N = b->N, C = b->C, HW = b->HW;
    const size_t plane = (size_t)C * HW;
    const double M = acc[C];
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float mean = (float)(acc[c] / M);
        double ss = 0;
        for (int n = 0; n < N; n++) ss += row_sqdev(in + (size_t)c * HW + n * plane, HW, mean);
        save_mean[c] = mean;
        acc[C + 1 + c] = ss;
    }
}

void visc_batchnorm2d_sync_finish(const visc_batchnorm2d *b, const double *acc, float *out,
                                  float *save_mean, float *save_rstd, const float *in,
                                  const float *gamma, const float *beta, float *running_mean,
                                  float *running_var) {
    const int C = b->C;
    const double M = acc[C];
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        finish_channel(b, c, acc[c] / M, (float)(acc[c] / M), acc[C + 1 + c], M, out, in, gamma,
                       beta, save_mean, save_rstd, running_mean, running_var);
}

static void sync_forward_train(visc_batchnorm2d *b, float *out, float *save_mean, float *save_rstd,
                               const float *in, const float *gamma, const float *beta,
                               float *running_mean, float *running_var) {
    double *acc = b->impl;
    visc_batchnorm2d_sync_sums(b, acc, in);
    b->sync(b->sync_ctx, acc, b->C + 1);
    visc_batchnorm2d_sync_sqdev(b, acc, save_mean, in);
    b->sync(b->sync_ctx, acc + b->C + 1, b->C);
    visc_batchnorm2d_sync_finish(b, acc, out, save_mean, save_rstd, in, gamma, beta, running_mean,
                                 running_var);
}

void visc_batchnorm2d_forward_train(visc_batchnorm2d *b, float *out, float *save_mean,
                                    float *save_rstd, const float *in, const float *gamma,
                                    const float *beta, float *running_mean, float *running_var) {
    const int N = b->N, C = b->C, HW = b->HW;
    const size_t plane = (size_t)C * HW;
    const double M = (double)N * HW;
    if (b->sync) {
        sync_forward_train(b, out, save_mean, save_rstd, in, gamma, beta, running_mean,
                           running_var);
        return;
    }
    if (HW <= SMALL_HW) {
#pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < C; c0 += CHUNK)
            small_forward_chunk(b, c0, out, save_mean, save_rstd, in, gamma, beta, running_mean,
                                running_var);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        const float *xc = in + (size_t)c * HW;
        double s = 0;
        for (int n = 0; n < N; n++) s += row_sum(xc + n * plane, HW);
        double mean = s / M;
        double ss = 0;
        for (int n = 0; n < N; n++) ss += row_sqdev(xc + n * plane, HW, (float)mean);
        finish_channel(b, c, mean, (float)mean, ss, M, out, in, gamma, beta, save_mean, save_rstd,
                       running_mean, running_var);
    }
}

void visc_batchnorm2d_apply(const visc_batchnorm2d *b, float *out, const float *in,
                            const float *gamma, const float *beta, const float *save_mean,
                            const float *save_rstd) {
    const int C = b->C;
    if (b->HW <= SMALL_HW) {
#pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < C; c0 += CHUNK)
            small_apply_chunk(b, c0, out, in, gamma, beta, save_mean, save_rstd);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) apply_channel(b, c, out, in, gamma, beta, save_mean, save_rstd);
}

void visc_batchnorm2d_forward_eval(visc_batchnorm2d *b, float *out, const float *in,
                                   const float *gamma, const float *beta, const float *running_mean,
                                   const float *running_var) {
    const int N = b->N, C = b->C, HW = b->HW;
    const size_t plane = (size_t)C * HW;
#pragma omp parallel for collapse(2) schedule(static)
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double rstd = 1.0 / sqrt((double)running_var[c] + b->eps);
            float scale = (float)(gamma[c] * rstd);
            size_t off = n * plane + (size_t)c * HW;
            row_affine(out + off, in + off, HW, running_mean[c], scale, beta[c], b->relu);
        }
}

/* With the ReLU fused, the gradient reaching bn's output is dout * (out > 0). */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
row_grad_sums(const float *dout, const float *out, const float *x, int n, float mean, int relu,
              double *sum_dy, double *sum_dy_xc) {
    float a[LANES] = {0}, bsum[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) {
            float dy = dout[i + l];
            if (relu) dy = out[i + l] > 0 ? dy : 0;
            a[l] += dy;
            bsum[l] += dy * (x[i + l] - mean);
        }
    double s1 = 0, s2 = 0;
    for (; i < n; i++) {
        float dy = dout[i];
        if (relu) dy = out[i] > 0 ? dy : 0;
        s1 += dy;
        s2 += (double)dy * (x[i] - mean);
    }
    for (int l = 0; l < LANES; l++) s1 += a[l], s2 += bsum[l];
    *sum_dy += s1;
    *sum_dy_xc += s2;
}

/* din = k * (dy - mean_dy - (x - mean) * c2), dy masked as above. din may alias dout. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
row_grad_input(float *din, const float *dout, const float *out, const float *x, int n, float mean,
               float k, float mean_dy, float c2, int relu) {
    for (int i = 0; i < n; i++) {
        float dy = dout[i];
        if (relu) dy = out[i] > 0 ? dy : 0;
        din[i] = k * (dy - mean_dy - (x[i] - mean) * c2);
    }
}

/* The row path with sum dy and sum dy * (x - mean) reduced over the
 * processes; M is the global count. The parameter gradients are this
 * process's (the gradient all-reduce averages them with the rest). */
void visc_batchnorm2d_sync_grad_sums(const visc_batchnorm2d *b, double *acc, float *dgamma,
                                     float *dbeta, const float *dout, const float *in,
                                     const float *out, const float *save_mean,
                                     const float *save_rstd) {
    const int N = b->N, C = b->C, HW = b->HW, relu = b->relu;
    const size_t plane = (size_t)C * HW;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double sum_dy = 0, sum_dy_xc = 0;
        for (int n = 0; n < N; n++) {
            size_t off = (size_t)c * HW + n * plane;
            row_grad_sums(dout + off, relu ? out + off : NULL, in + off, HW, save_mean[c], relu,
                          &sum_dy, &sum_dy_xc);
        }
        dbeta[c] = (float)sum_dy;
        dgamma[c] = (float)(sum_dy_xc * save_rstd[c]);
        acc[c] = sum_dy;
        acc[C + c] = sum_dy_xc;
    }
    acc[2 * C] = (double)N * HW;
}

void visc_batchnorm2d_sync_grad_input(const visc_batchnorm2d *b, const double *acc, float *din,
                                      const float *dout, const float *in, const float *out,
                                      const float *gamma, const float *save_mean,
                                      const float *save_rstd) {
    const int N = b->N, C = b->C, HW = b->HW, relu = b->relu;
    const size_t plane = (size_t)C * HW;
    const double M = acc[2 * C];
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double rstd = save_rstd[c];
        float k = (float)(gamma[c] * rstd);
        float mean_dy = (float)(acc[c] / M);
        float c2 = (float)(acc[C + c] / M * rstd * rstd);
        for (int n = 0; n < N; n++) {
            size_t off = (size_t)c * HW + n * plane;
            row_grad_input(din + off, dout + off, relu ? out + off : NULL, in + off, HW,
                           save_mean[c], k, mean_dy, c2, relu);
        }
    }
}

static void sync_backward(visc_batchnorm2d *b, float *din, float *dgamma, float *dbeta,
                          const float *dout, const float *in, const float *out, const float *gamma,
                          const float *save_mean, const float *save_rstd) {
    double *acc = b->impl;
    visc_batchnorm2d_sync_grad_sums(b, acc, dgamma, dbeta, dout, in, out, save_mean, save_rstd);
    b->sync(b->sync_ctx, acc, 2 * b->C + 1);
    if (din)
        visc_batchnorm2d_sync_grad_input(b, acc, din, dout, in, out, gamma, save_mean, save_rstd);
}

void visc_batchnorm2d_backward(visc_batchnorm2d *b, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *out,
                               const float *gamma, const float *save_mean, const float *save_rstd) {
    const int N = b->N, C = b->C, HW = b->HW, relu = b->relu;
    const size_t plane = (size_t)C * HW;
    const double M = (double)N * HW;
    if (b->sync) {
        sync_backward(b, din, dgamma, dbeta, dout, in, out, gamma, save_mean, save_rstd);
        return;
    }
    if (HW <= SMALL_HW) {
#pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < C; c0 += CHUNK)
            small_backward_chunk(b, c0, din, dgamma, dbeta, dout, in, out, gamma, save_mean,
                                 save_rstd);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        size_t base = (size_t)c * HW;
        float mean = save_mean[c];
        double rstd = save_rstd[c];
        double sum_dy = 0, sum_dy_xc = 0;
        for (int n = 0; n < N; n++) {
            size_t off = base + n * plane;
            row_grad_sums(dout + off, relu ? out + off : NULL, in + off, HW, mean, relu, &sum_dy,
                          &sum_dy_xc);
        }
        /* dbeta = sum dy, dgamma = sum dy * xhat,
         * din = gamma * rstd * (dy - mean(dy) - xhat * mean(dy * xhat)) */
        dbeta[c] = (float)sum_dy;
        dgamma[c] = (float)(sum_dy_xc * rstd);
        if (!din) continue;
        float k = (float)(gamma[c] * rstd);
        float mean_dy = (float)(sum_dy / M);
        float c2 = (float)(sum_dy_xc / M * rstd * rstd);
        for (int n = 0; n < N; n++) {
            size_t off = base + n * plane;
            row_grad_input(din + off, dout + off, relu ? out + off : NULL, in + off, HW, mean, k,
                           mean_dy, c2, relu);
        }
    }
}

void visc_batchnorm2d_destroy(visc_batchnorm2d *b) {
    free(b->impl);
    b->impl = NULL;
}

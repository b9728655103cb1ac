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
__attribute__((target_clones("avx512f", "avx2", "default"))) static double row_sum(const float *x,
                                                                                   int n) {
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
__attribute__((target_clones("avx512f", "avx2", "default"))) static double
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
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
row_affine(float *out, const float *x, int n, float mean, float scale, float shift, int relu) {
    if (relu)
        for (int i = 0; i < n; i++) {
            float y = (x[i] - mean) * scale + shift;
            out[i] = y > 0 ? y : 0;
        }
    else
        for (int i = 0; i < n; i++) out[i] = (x[i] - mean) * scale + shift;
}

void visc_batchnorm2d_init(visc_batchnorm2d *b, int N, int C, int HW, float eps, float momentum,
                           int relu) {
    VISC_ASSERT(N > 0 && C > 0 && HW > 0);
    b->N = N, b->C = C, b->HW = HW;
    b->eps = eps, b->momentum = momentum, b->relu = relu;
    b->device = VISC_DEVICE_CPU;
    b->impl = NULL; /* stateless: nothing cached */
}

void visc_batchnorm2d_forward_train(visc_batchnorm2d *b, float *out, float *save_mean,
                                    float *save_rstd, const float *in, const float *gamma,
                                    const float *beta, float *running_mean, float *running_var) {
    const int N = b->N, C = b->C, HW = b->HW;
    const size_t plane = (size_t)C * HW;
    const double M = (double)N * HW;
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        const float *xc = in + (size_t)c * HW;
        double s = 0;
        for (int n = 0; n < N; n++) s += row_sum(xc + n * plane, HW);
        double mean = s / M;
        double ss = 0;
        for (int n = 0; n < N; n++) ss += row_sqdev(xc + n * plane, HW, (float)mean);
        /* the float mean's error, (mean - (float)mean)^2 * M, is folded out: */
        double dm = mean - (double)(float)mean;
        double var = ss / M - dm * dm;
        if (var < 0) var = 0;
        double rstd = 1.0 / sqrt(var + b->eps);
        save_mean[c] = (float)mean;
        save_rstd[c] = (float)rstd;
        double unbiased = M > 1 ? var * M / (M - 1) : var;
        running_mean[c] = (float)((1.0 - b->momentum) * running_mean[c] + b->momentum * mean);
        running_var[c] = (float)((1.0 - b->momentum) * running_var[c] + b->momentum * unbiased);
        float scale = (float)(gamma[c] * rstd);
        for (int n = 0; n < N; n++)
            row_affine(out + (size_t)c * HW + n * plane, xc + n * plane, HW, (float)mean, scale,
                       beta[c], b->relu);
    }
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
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
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
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
row_grad_input(float *din, const float *dout, const float *out, const float *x, int n, float mean,
               float k, float mean_dy, float c2, int relu) {
    for (int i = 0; i < n; i++) {
        float dy = dout[i];
        if (relu) dy = out[i] > 0 ? dy : 0;
        din[i] = k * (dy - mean_dy - (x[i] - mean) * c2);
    }
}

void visc_batchnorm2d_backward(visc_batchnorm2d *b, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *out,
                               const float *gamma, const float *save_mean, const float *save_rstd) {
    const int N = b->N, C = b->C, HW = b->HW, relu = b->relu;
    const size_t plane = (size_t)C * HW;
    const double M = (double)N * HW;
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

void visc_batchnorm2d_destroy(visc_batchnorm2d *b) { b->impl = NULL; }

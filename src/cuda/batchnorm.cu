/* batchnorm.cu: batch normalization over (N, HW) per channel, as
 * src/nn/batchnorm2d.c computes it, in NCHW or channels-last.
 *
 * One block per channel walks its N * HW values in a fixed order and
 * reduces in double (a fixed tree), so the statistics do not depend on
 * timing. The arithmetic is the CPU's: the mean in double, rounded to float
 * for centring; the variance around that float mean with its rounding error
 * folded out; the element formulas in float with the CPU's operation order,
 * written with __fmul_rn / __fadd_rn so that nvcc does not contract them
 * into FMAs (the CPU, compiled as ISO C11, does not either). One block per
 * channel is slow for large batches of few channels (64 blocks for
 * ResNet's first stage); splitting the channels' sums comes with
 * measurements on a GPU. */
#include "common.cuh"

#define BN_THREADS 256

/* Address of element m (= n * HW + i) of channel c. */
__device__ __forceinline__ size_t bn_at(const visc_cuda_bn_shape &s, int c, size_t m) {
    if (!s.nchw) return m * (size_t)s.C + c;
    const size_t n = m / (size_t)s.HW, i = m % (size_t)s.HW;
    return (n * s.C + c) * (size_t)s.HW + i;
}

/* The sum over the block of each thread's v, in a fixed tree; every
 * thread gets it. `buf` holds BN_THREADS doubles. */
__device__ double block_sum(double v, double *buf) {
    buf[threadIdx.x] = v;
    __syncthreads();
    for (int o = BN_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) buf[threadIdx.x] += buf[threadIdx.x + o];
        __syncthreads();
    }
    const double r = buf[0];
    __syncthreads();
    return r;
}

/* (x - mean) * scale + shift, optionally through the ReLU, uncontracted. */
__device__ __forceinline__ float bn_affine(float x, float mean, float scale, float shift,
                                           int relu) {
    const float y = __fadd_rn(__fmul_rn(__fsub_rn(x, mean), scale), shift);
    return relu ? (y > 0 ? y : 0.0f) : y;
}

/* Channel c's statistics from its mean (double) and the squared
 * deviations ss around its float rounding over Md values (all processes'
 * with SyncBN), as the CPU's finish_channel: the saved and running
 * statistics (thread 0), then the block's share of out. */
__device__ void bn_finish_channel(const visc_cuda_bn_shape &s, int c, double mean, double ss,
                                  double Md, float *out, float *save_mean, float *save_rstd,
                                  const float *in, const float *gamma, const float *beta,
                                  float *running_mean, float *running_var) {
    const size_t M = (size_t)s.N * s.HW;
    const float fmean = (float)mean;
    const double dm = mean - (double)fmean;
    double var = ss / Md - dm * dm;
    if (var < 0) var = 0;
    const double rstd = 1.0 / sqrt(var + (double)s.eps);
    if (threadIdx.x == 0) {
        save_mean[c] = fmean;
        save_rstd[c] = (float)rstd;
        const double unbiased = Md > 1 ? var * Md / (Md - 1) : var;
        if (running_mean) { /* NULL: a recomputed forward (--grad-checkpointing) */
            running_mean[c] = (float)((1.0 - s.momentum) * running_mean[c] + s.momentum * mean);
            running_var[c] = (float)((1.0 - s.momentum) * running_var[c] + s.momentum * unbiased);
        }
    }
    const float scale = (float)(gamma[c] * rstd), shift = beta[c];
    for (size_t m = threadIdx.x; m < M; m += BN_THREADS) {
        const size_t a = bn_at(s, c, m);
        out[a] = bn_affine(in[a], fmean, scale, shift, s.relu);
    }
}

/* sum over the block of (x - fmean)^2 for channel c's values here */
__device__ double bn_sqdev(const visc_cuda_bn_shape &s, int c, float fmean, const float *in,
                           double *buf) {
    const size_t M = (size_t)s.N * s.HW;
    double acc = 0;
    for (size_t m = threadIdx.x; m < M; m += BN_THREADS) {
        const float d = __fsub_rn(in[bn_at(s, c, m)], fmean);
        acc += (double)d * d;
    }
    return block_sum(acc, buf);
}

/* sum over the block of channel c's values here */
__device__ double bn_sum(const visc_cuda_bn_shape &s, int c, const float *in, double *buf) {
    const size_t M = (size_t)s.N * s.HW;
    double acc = 0;
    for (size_t m = threadIdx.x; m < M; m += BN_THREADS) acc += in[bn_at(s, c, m)];
    return block_sum(acc, buf);
}

__global__ void __launch_bounds__(BN_THREADS)
    bn_forward_train_kernel(visc_cuda_bn_shape s, float *out, float *save_mean, float *save_rstd,
                            const float *in, const float *gamma, const float *beta,
                            float *running_mean, float *running_var) {
    __shared__ double buf[BN_THREADS];
    const int c = blockIdx.x;
    const double Md = (double)s.N * s.HW, mean = bn_sum(s, c, in, buf) / Md;
    const double ss = bn_sqdev(s, c, (float)mean, in, buf);
    bn_finish_channel(s, c, mean, ss, Md, out, save_mean, save_rstd, in, gamma, beta, running_mean,
                      running_var);
}

__global__ void bn_forward_eval_kernel(visc_cuda_bn_shape s, float *out, const float *in,
                                       const float *gamma, const float *beta,
                                       const float *running_mean, const float *running_var) {
    const size_t n = (size_t)s.N * s.C * s.HW;
    for (size_t a = blockIdx.x * (size_t)blockDim.x + threadIdx.x; a < n;
         a += (size_t)gridDim.x * blockDim.x) {
        const int c = s.nchw ? (int)(a / (size_t)s.HW % (size_t)s.C) : (int)(a % (size_t)s.C);
        const double rstd = 1.0 / sqrt((double)running_var[c] + (double)s.eps);
        out[a] = bn_affine(in[a], running_mean[c], (float)(gamma[c] * rstd), beta[c], s.relu);
    }
}

/* dout masked by the fused ReLU: the gradient reaching bn's output. */
__device__ __forceinline__ float bn_dy(const visc_cuda_bn_shape &s, const float *dout,
                                       const float *out, size_t a) {
    const float g = dout[a];
    return s.relu ? (out[a] > 0 ? g : 0.0f) : g;
}

/* The block's sums of dy and dy (x - mean) over channel c's values here. */
__device__ void bn_grad_sums(const visc_cuda_bn_shape &s, int c, const float *dout,
                             const float *in, const float *out, float mean, double *buf,
                             double *sum_dy, double *sum_dy_xc) {
    const size_t M = (size_t)s.N * s.HW;
    double a1 = 0, a2 = 0;
    for (size_t m = threadIdx.x; m < M; m += BN_THREADS) {
        const size_t a = bn_at(s, c, m);
        const float dy = bn_dy(s, dout, out, a);
        a1 += dy;
        a2 += (double)dy * __fsub_rn(in[a], mean);
    }
    *sum_dy = block_sum(a1, buf);
    *sum_dy_xc = block_sum(a2, buf);
}

/* din = k (dy - mean(dy) - (x - mean) c2) over channel c's values here,
 * from the sums over Md values; every read of element a comes before its
 * write, so din may alias dout. */
__device__ void bn_grad_input(const visc_cuda_bn_shape &s, int c, double sum_dy, double sum_dy_xc,
                              double Md, float *din, const float *dout, const float *in,
                              const float *out, const float *gamma, float mean, double rstd) {
    const size_t M = (size_t)s.N * s.HW;
    const float k = (float)(gamma[c] * rstd), mean_dy = (float)(sum_dy / Md);
    const float c2 = (float)(sum_dy_xc / Md * rstd * rstd);
    for (size_t m = threadIdx.x; m < M; m += BN_THREADS) {
        const size_t a = bn_at(s, c, m);
        const float dy = bn_dy(s, dout, out, a);
        din[a] =
            __fmul_rn(k, __fsub_rn(__fsub_rn(dy, mean_dy), __fmul_rn(__fsub_rn(in[a], mean), c2)));
    }
}

__global__ void __launch_bounds__(BN_THREADS)
    bn_backward_kernel(visc_cuda_bn_shape s, float *din, float *dgamma, float *dbeta,
                       const float *dout, const float *in, const float *out, const float *gamma,
                       const float *save_mean, const float *save_rstd) {
    __shared__ double buf[BN_THREADS];
    const int c = blockIdx.x;
    double sum_dy, sum_dy_xc;
    bn_grad_sums(s, c, dout, in, out, save_mean[c], buf, &sum_dy, &sum_dy_xc);
    const double rstd = save_rstd[c];
    if (threadIdx.x == 0) {
        dbeta[c] = (float)sum_dy;
        dgamma[c] = (float)(sum_dy_xc * rstd);
    }
    if (din)
        bn_grad_input(s, c, sum_dy, sum_dy_xc, (double)s.N * s.HW, din, dout, in, out, gamma,
                      save_mean[c], rstd);
}

static int bn_check(const visc_cuda_bn_shape *s) {
    if (!s || s->N <= 0 || s->C <= 0 || s->HW <= 0 || !(s->eps > 0))
        return visc_set_error("batchnorm: bad shape or eps");
    return 0;
}

int visc_cuda_batchnorm_forward_train(visc_cuda *ctx, const visc_cuda_bn_shape *s, float *out,
                                      float *save_mean, float *save_rstd, const float *in,
                                      const float *gamma, const float *beta, float *running_mean,
                                      float *running_var) {
    if (bn_check(s)) return -1;
    bn_forward_train_kernel<<<s->C, BN_THREADS, 0, ctx->stream>>>(*s, out, save_mean, save_rstd, in,
                                                                  gamma, beta, running_mean,
                                                                  running_var);
    return visc_cuda_launched("batchnorm forward (training)");
}

int visc_cuda_batchnorm_forward_eval(visc_cuda *ctx, const visc_cuda_bn_shape *s, float *out,
                                     const float *in, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var) {
    if (bn_check(s)) return -1;
    const size_t n = (size_t)s->N * s->C * s->HW;
    bn_forward_eval_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(*s, out, in, gamma,
                                                                              beta, running_mean,
                                                                              running_var);
    return visc_cuda_launched("batchnorm forward (eval)");
}

int visc_cuda_batchnorm_backward(visc_cuda *ctx, const visc_cuda_bn_shape *s, float *din,
                                 float *dgamma, float *dbeta, const float *dout, const float *in,
                                 const float *out, const float *gamma, const float *save_mean,
                                 const float *save_rstd) {
    if (bn_check(s)) return -1;
    if (s->relu && !out) return visc_set_error("batchnorm backward: the fused ReLU needs `out`");
    bn_backward_kernel<<<s->C, BN_THREADS, 0, ctx->stream>>>(*s, din, dgamma, dbeta, dout, in, out,
                                                             gamma, save_mean, save_rstd);
    return visc_cuda_launched("batchnorm backward");
}

/* ---- synchronized statistics (SyncBN): the passes of visc_batchnorm2d_sync_*
 * with the host reducing between them. acc lives on the host; each pass
 * copies the part it needs to the context's buffer of 2C + 1 doubles and
 * what it produces back, waiting for the copies (a reduction over the
 * processes comes next). ---- */

__global__ void __launch_bounds__(BN_THREADS)
    bn_sync_sums_kernel(visc_cuda_bn_shape s, double *acc, const float *in) {
    __shared__ double buf[BN_THREADS];
    const double sum = bn_sum(s, blockIdx.x, in, buf);
    if (threadIdx.x == 0) acc[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(BN_THREADS)
    bn_sync_sqdev_kernel(visc_cuda_bn_shape s, double *acc, float *save_mean, const float *in) {
    __shared__ double buf[BN_THREADS];
    const int c = blockIdx.x;
    const float fmean = (float)(acc[c] / acc[s.C]);
    const double ss = bn_sqdev(s, c, fmean, in, buf);
    if (threadIdx.x == 0) {
        save_mean[c] = fmean;
        acc[s.C + 1 + c] = ss;
    }
}

__global__ void __launch_bounds__(BN_THREADS)
    bn_sync_finish_kernel(visc_cuda_bn_shape s, const double *acc, float *out, float *save_mean,
                          float *save_rstd, const float *in, const float *gamma, const float *beta,
                          float *running_mean, float *running_var) {
    const int c = blockIdx.x;
    const double Md = acc[s.C];
    bn_finish_channel(s, c, acc[c] / Md, acc[s.C + 1 + c], Md, out, save_mean, save_rstd, in,
                      gamma, beta, running_mean, running_var);
}

__global__ void __launch_bounds__(BN_THREADS)
    bn_sync_grad_sums_kernel(visc_cuda_bn_shape s, double *acc, float *dgamma, float *dbeta,
                             const float *dout, const float *in, const float *out,
                             const float *save_mean, const float *save_rstd) {
    __shared__ double buf[BN_THREADS];
    const int c = blockIdx.x;
    double sum_dy, sum_dy_xc;
    bn_grad_sums(s, c, dout, in, out, save_mean[c], buf, &sum_dy, &sum_dy_xc);
    if (threadIdx.x == 0) {
        dbeta[c] = (float)sum_dy;
        dgamma[c] = (float)(sum_dy_xc * (double)save_rstd[c]);
        acc[c] = sum_dy;
        acc[s.C + c] = sum_dy_xc;
    }
}

__global__ void __launch_bounds__(BN_THREADS)
    bn_sync_grad_input_kernel(visc_cuda_bn_shape s, const double *acc, float *din,
                              const float *dout, const float *in, const float *out,
                              const float *gamma, const float *save_mean, const float *save_rstd) {
    const int c = blockIdx.x;
    bn_grad_input(s, c, acc[c], acc[s.C + c], acc[2 * s.C], din, dout, in, out, gamma,
                  save_mean[c], save_rstd[c]);
}

/* The context's buffer for acc (2C + 1 doubles), grown on first use of a
 * larger layer. */
static double *bn_acc(visc_cuda *ctx, int C) {
    const size_t bytes = (2 * (size_t)C + 1) * sizeof(double);
    return (double *)visc_cuda_grow(ctx, &ctx->bn_acc, &ctx->bn_acc_bytes, bytes);
}

/* acc[from, from + n) between the host and the device's buffer. */
static int acc_copy(visc_cuda *ctx, double *dst, const double *src, int n, cudaMemcpyKind kind) {
    if (visc_cuda_check(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(double), kind, ctx->stream),
                        "SyncBN sums"))
        return -1;
    return kind == cudaMemcpyDeviceToHost ? visc_cuda_sync(ctx) : 0;
}

int visc_cuda_bn_sync_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                           const float *in) {
    double *d = bn_check(s) ? NULL : bn_acc(ctx, s->C);
    if (!d) return -1;
    bn_sync_sums_kernel<<<s->C, BN_THREADS, 0, ctx->stream>>>(*s, d, in);
    if (visc_cuda_launched("SyncBN sums") ||
        acc_copy(ctx, acc, d, s->C, cudaMemcpyDeviceToHost))
        return -1;
    acc[s->C] = (double)s->N * s->HW;
    return 0;
}

int visc_cuda_bn_sync_sqdev(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                            float *save_mean, const float *in) {
    double *d = bn_check(s) ? NULL : bn_acc(ctx, s->C);
    if (!d || acc_copy(ctx, d, acc, s->C + 1, cudaMemcpyHostToDevice)) return -1;
    bn_sync_sqdev_kernel<<<s->C, BN_THREADS, 0, ctx->stream>>>(*s, d, save_mean, in);
    if (visc_cuda_launched("SyncBN squared deviations")) return -1;
    return acc_copy(ctx, acc + s->C + 1, d + s->C + 1, s->C, cudaMemcpyDeviceToHost);
}

int visc_cuda_bn_sync_finish(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                             float *out, float *save_mean, float *save_rstd, const float *in,
                             const float *gamma, const float *beta, float *running_mean,
                             float *running_var) {
    double *d = bn_check(s) ? NULL : bn_acc(ctx, s->C);
    if (!d || acc_copy(ctx, d, acc, 2 * s->C + 1, cudaMemcpyHostToDevice)) return -1;
    bn_sync_finish_kernel<<<s->C, BN_THREADS, 0, ctx->stream>>>(
        *s, d, out, save_mean, save_rstd, in, gamma, beta, running_mean, running_var);
    return visc_cuda_launched("SyncBN forward");
}

int visc_cuda_bn_sync_grad_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                                float *dgamma, float *dbeta, const float *dout, const float *in,
                                const float *out, const float *save_mean, const float *save_rstd) {
    double *d = bn_check(s) ? NULL : bn_acc(ctx, s->C);
    if (!d) return -1;
    if (s->relu && !out) return visc_set_error("batchnorm backward: the fused ReLU needs `out`");
    bn_sync_grad_sums_kernel<<<s->C, BN_THREADS, 0, ctx->stream>>>(*s, d, dgamma, dbeta, dout, in,
                                                                   out, save_mean, save_rstd);
    if (visc_cuda_launched("SyncBN gradient sums") ||
        acc_copy(ctx, acc, d, 2 * s->C, cudaMemcpyDeviceToHost))
        return -1;
    acc[2 * s->C] = (double)s->N * s->HW;
    return 0;
}

int visc_cuda_bn_sync_grad_input(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                                 float *din, const float *dout, const float *in, const float *out,
                                 const float *gamma, const float *save_mean,
                                 const float *save_rstd) {
    double *d = bn_check(s) ? NULL : bn_acc(ctx, s->C);
    if (!d || acc_copy(ctx, d, acc, 2 * s->C + 1, cudaMemcpyHostToDevice)) return -1;
    bn_sync_grad_input_kernel<<<s->C, BN_THREADS, 0, ctx->stream>>>(*s, d, din, dout, in, out,
                                                                    gamma, save_mean, save_rstd);
    return visc_cuda_launched("SyncBN backward");
}

/* batchnorm.cu: batch normalization over (N, HW) per channel, as
 * src/nn/batchnorm2d.c computes it, in NCHW or channels-last.
 *
 * Each channel's N * HW values are cut into S ranges (bn_splits: enough
 * blocks to fill the GPU, a few thousand values each at least); block
 * (c, k) sums range k of channel c in double (a fixed tree) into a
 * partial, and one thread per channel adds its S partials in range order,
 * so the statistics do not depend on timing. The passes are SyncBN's
 * (visc_batchnorm2d_sync_*) with their sums in `acc` on the device: the
 * sums, the mean; the squared deviations around its float rounding; then
 * the statistics and the output. A process alone runs them back to back;
 * with SyncBN the host reduces acc over the processes between them. The
 * arithmetic is the CPU's: the mean in double, rounded to float for
 * centring; the variance around that float mean with its rounding error
 * folded out; the element formulas in float with the CPU's operation
 * order, written with __fmul_rn / __fadd_rn so that nvcc does not contract
 * them into FMAs (the CPU, compiled as ISO C11, does not either). */
#include "common.cuh"

#define BN_THREADS 256
#define BN_MAX_SPLITS 64

/* The element addresses a thread of block (c, k) walks: channel c =
 * blockIdx.x, its range k = blockIdx.y of gridDim.y, values m0 + t,
 * m0 + t + BN_THREADS, ... below the range's end (t the thread's index),
 * without a division per step (NCHW: image n, position i, advanced by the
 * block's stride). Every element loop below is `for (BN_RANGE(s, c, w))`. */
typedef struct {
    size_t m, end, n, i, a, dn, di;
} bn_walk;

__device__ __forceinline__ void bn_walk_at(const visc_cuda_bn_shape &s, int c, bn_walk *w) {
    w->a = s.nchw ? (w->n * (size_t)s.C + c) * (size_t)s.HW + w->i : w->m * (size_t)s.C + c;
}

__device__ __forceinline__ bn_walk bn_walk_start(const visc_cuda_bn_shape &s, int c) {
    bn_walk w;
    const size_t HW = (size_t)s.HW, M = (size_t)s.N * HW;
    w.m = M * blockIdx.y / gridDim.y + threadIdx.x;
    w.end = M * (blockIdx.y + 1) / gridDim.y;
    w.n = w.m / HW, w.i = w.m % HW;
    w.dn = BN_THREADS / HW, w.di = BN_THREADS % HW;
    bn_walk_at(s, c, &w);
    return w;
}

__device__ __forceinline__ void bn_walk_next(const visc_cuda_bn_shape &s, int c, bn_walk *w) {
    w->m += BN_THREADS;
    w->n += w->dn, w->i += w->di;
    if (w->i >= (size_t)s.HW) w->i -= (size_t)s.HW, w->n++;
    bn_walk_at(s, c, w);
}

#define BN_RANGE(s, c, w) bn_walk w = bn_walk_start(s, c); w.m < w.end; bn_walk_next(s, c, &w)

/* The sum over the block of each thread's v, in a fixed tree; thread 0
 * gets it. `buf` holds BN_THREADS doubles. */
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

/* dout masked by the fused ReLU: the gradient reaching bn's output. */
__device__ __forceinline__ float bn_dy(const visc_cuda_bn_shape &s, const float *dout,
                                       const float *out, size_t a) {
    const float g = dout[a];
    return s.relu ? (out[a] > 0 ? g : 0.0f) : g;
}

/* ---- the partial sums of block (c, k), into part[(c * S + k) * width + j] ---- */

/* the values */
__global__ void __launch_bounds__(BN_THREADS)
    bn_sum_kernel(visc_cuda_bn_shape s, double *part, const float *in) {
    __shared__ double buf[BN_THREADS];
    const int c = blockIdx.x;
    double acc = 0;
    for (BN_RANGE(s, c, w)) acc += in[w.a];
    acc = block_sum(acc, buf);
    if (threadIdx.x == 0) part[(size_t)c * gridDim.y + blockIdx.y] = acc;
}

/* the squared deviations around the float rounding of the mean acc[c] / acc[C] */
__global__ void __launch_bounds__(BN_THREADS)
    bn_sqdev_kernel(visc_cuda_bn_shape s, double *part, const double *acc, const float *in) {
    __shared__ double buf[BN_THREADS];
    const int c = blockIdx.x;
    const float fmean = (float)(acc[c] / acc[s.C]);
    double ss = 0;
    for (BN_RANGE(s, c, w)) {
        const float d = __fsub_rn(in[w.a], fmean);
        ss += (double)d * d;
    }
    ss = block_sum(ss, buf);
    if (threadIdx.x == 0) part[(size_t)c * gridDim.y + blockIdx.y] = ss;
}

/* dy and dy (x - mean), mean the saved one */
__global__ void __launch_bounds__(BN_THREADS)
    bn_grad_sums_kernel(visc_cuda_bn_shape s, double *part, const float *dout, const float *in,
                        const float *out, const float *save_mean) {
    __shared__ double buf[BN_THREADS];
    const int c = blockIdx.x;
    const float mean = save_mean[c];
    double a1 = 0, a2 = 0;
    for (BN_RANGE(s, c, w)) {
        const float dy = bn_dy(s, dout, out, w.a);
        a1 += dy;
        a2 += (double)dy * __fsub_rn(in[w.a], mean);
    }
    a1 = block_sum(a1, buf);
    a2 = block_sum(a2, buf);
    if (threadIdx.x == 0) {
        double *p = part + ((size_t)c * gridDim.y + blockIdx.y) * 2;
        p[0] = a1, p[1] = a2;
    }
}

/* ---- each channel's partials added in range order, into acc ---- */
enum { BN_SUMS, BN_SQDEV, BN_GRADS };

__global__ void bn_combine_kernel(visc_cuda_bn_shape s, int what, int S, const double *part,
                                  double *acc, float *save_mean, float *dgamma, float *dbeta,
                                  const float *save_rstd) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= s.C) return;
    const double Md = (double)s.N * s.HW;
    const int width = what == BN_GRADS ? 2 : 1;
    double a = 0, b = 0;
    for (int k = 0; k < S; k++) {
        a += part[((size_t)c * S + k) * width];
        if (width == 2) b += part[((size_t)c * S + k) * 2 + 1];
    }
    if (what == BN_SUMS) {
        acc[c] = a;
        if (c == 0) acc[s.C] = Md;
    } else if (what == BN_SQDEV) {
        acc[s.C + 1 + c] = a;
        save_mean[c] = (float)(acc[c] / acc[s.C]);
    } else {
        acc[c] = a;
        acc[s.C + c] = b;
        dbeta[c] = (float)a;
        dgamma[c] = (float)(b * (double)save_rstd[c]);
        if (c == 0) acc[2 * s.C] = Md;
    }
}

/* ---- the passes that write every element ---- */

/* Channel c's statistics from acc (the sums, Md, the squared deviations),
 * as the CPU's finish_channel: the saved and running statistics (the
 * first range's thread 0), then the block's range of out. */
__global__ void __launch_bounds__(BN_THREADS)
    bn_finish_kernel(visc_cuda_bn_shape s, const double *acc, float *out, float *save_mean,
                     float *save_rstd, const float *in, const float *gamma, const float *beta,
                     float *running_mean, float *running_var) {
    const int c = blockIdx.x;
    const double Md = acc[s.C], mean = acc[c] / Md, ss = acc[s.C + 1 + c];
    const float fmean = (float)mean;
    const double dm = mean - (double)fmean;
    double var = ss / Md - dm * dm;
    if (var < 0) var = 0;
    const double rstd = 1.0 / sqrt(var + (double)s.eps);
    if (blockIdx.y == 0 && threadIdx.x == 0) {
        save_mean[c] = fmean;
        save_rstd[c] = (float)rstd;
        const double unbiased = Md > 1 ? var * Md / (Md - 1) : var;
        if (running_mean) { /* NULL: a recomputed forward (--grad-checkpointing) */
            running_mean[c] = (float)((1.0 - s.momentum) * running_mean[c] + s.momentum * mean);
            running_var[c] = (float)((1.0 - s.momentum) * running_var[c] + s.momentum * unbiased);
        }
    }
    const float scale = (float)(gamma[c] * rstd), shift = beta[c];
    for (BN_RANGE(s, c, w)) out[w.a] = bn_affine(in[w.a], fmean, scale, shift, s.relu);
}

/* din = k (dy - mean(dy) - (x - mean) c2) over the block's range, from the
 * sums in acc over acc[2C] values; every read of element a comes before
 * its write, by the same thread, so din may alias dout. */
__global__ void __launch_bounds__(BN_THREADS)
    bn_grad_input_kernel(visc_cuda_bn_shape s, const double *acc, float *din, const float *dout,
                         const float *in, const float *out, const float *gamma,
                         const float *save_mean, const float *save_rstd) {
    const int c = blockIdx.x;
    const double Md = acc[2 * s.C], rstd = save_rstd[c];
    const float mean = save_mean[c];
    const float k = (float)(gamma[c] * rstd), mean_dy = (float)(acc[c] / Md);
    const float c2 = (float)(acc[s.C + c] / Md * rstd * rstd);
    for (BN_RANGE(s, c, w)) {
        const float dy = bn_dy(s, dout, out, w.a);
        din[w.a] = __fmul_rn(
            k, __fsub_rn(__fsub_rn(dy, mean_dy), __fmul_rn(__fsub_rn(in[w.a], mean), c2)));
    }
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

static int bn_check(const visc_cuda_bn_shape *s) {
    if (!s || s->N <= 0 || s->C <= 0 || s->HW <= 0 || !(s->eps > 0))
        return visc_set_error("batchnorm: bad shape or eps");
    return 0;
}

/* Ranges per channel: about 8 blocks per SM of an H200 over all channels,
 * each range 4096 values at least, at most BN_MAX_SPLITS. */
static int bn_splits(const visc_cuda_bn_shape *s) {
    const size_t M = (size_t)s->N * s->HW, by_size = (M + 4095) / 4096;
    const size_t by_gpu = (132 * 8 + (size_t)s->C - 1) / (size_t)s->C;
    size_t S = by_size < by_gpu ? by_size : by_gpu;
    if (S > BN_MAX_SPLITS) S = BN_MAX_SPLITS;
    return S < 1 ? 1 : (int)S;
}

/* The device's acc (2C + 1 doubles), then the partials (2 C S doubles),
 * grown on first use of a larger layer (a checked shape); NULL with the
 * error set. */
static double *bn_acc(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S) {
    const size_t bytes = (2 * (size_t)s->C + 1 + 2 * (size_t)s->C * S) * sizeof(double);
    return (double *)visc_cuda_grow(ctx, &ctx->bn_acc, &ctx->bn_acc_bytes, bytes);
}

static double *bn_partials(double *acc, const visc_cuda_bn_shape *s) {
    return acc + 2 * (size_t)s->C + 1;
}

/* Block grid of the passes over the elements: (channel, range). */
static dim3 bn_grid(const visc_cuda_bn_shape *s, int S) { return dim3((unsigned)s->C, S); }

static int bn_combine(visc_cuda *ctx, const visc_cuda_bn_shape *s, int what, int S, double *acc,
                      float *save_mean, float *dgamma, float *dbeta, const float *save_rstd) {
    bn_combine_kernel<<<(s->C + 255) / 256, 256, 0, ctx->stream>>>(
        *s, what, S, bn_partials(acc, s), acc, save_mean, dgamma, dbeta, save_rstd);
    return visc_cuda_launched("batchnorm sums");
}

/* The sums into acc[0, C), acc[C] = this process's count. */
static int bn_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, double *acc,
                   const float *in) {
    bn_sum_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), in);
    if (visc_cuda_launched("batchnorm sums")) return -1;
    return bn_combine(ctx, s, BN_SUMS, S, acc, NULL, NULL, NULL, NULL);
}

/* The squared deviations into acc[C + 1, 2C + 1), the float mean into save_mean. */
static int bn_sqdev(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, double *acc,
                    float *save_mean, const float *in) {
    bn_sqdev_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), acc,
                                                                   in);
    if (visc_cuda_launched("batchnorm squared deviations")) return -1;
    return bn_combine(ctx, s, BN_SQDEV, S, acc, save_mean, NULL, NULL, NULL);
}

static int bn_finish(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, const double *acc,
                     float *out, float *save_mean, float *save_rstd, const float *in,
                     const float *gamma, const float *beta, float *running_mean,
                     float *running_var) {
    bn_finish_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(
        *s, acc, out, save_mean, save_rstd, in, gamma, beta, running_mean, running_var);
    return visc_cuda_launched("batchnorm forward (training)");
}

/* The gradient sums into acc[0, 2C), acc[2C] = this process's count, and
 * dgamma, dbeta. */
static int bn_grad_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, double *acc,
                        float *dgamma, float *dbeta, const float *dout, const float *in,
                        const float *out, const float *save_mean, const float *save_rstd) {
    if (s->relu && !out) return visc_set_error("batchnorm backward: the fused ReLU needs `out`");
    bn_grad_sums_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s),
                                                                       dout, in, out, save_mean);
    if (visc_cuda_launched("batchnorm gradient sums")) return -1;
    return bn_combine(ctx, s, BN_GRADS, S, acc, NULL, dgamma, dbeta, save_rstd);
}

static int bn_grad_input(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, const double *acc,
                         float *din, const float *dout, const float *in, const float *out,
                         const float *gamma, const float *save_mean, const float *save_rstd) {
    bn_grad_input_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(
        *s, acc, din, dout, in, out, gamma, save_mean, save_rstd);
    return visc_cuda_launched("batchnorm backward");
}

int visc_cuda_batchnorm_forward_train(visc_cuda *ctx, const visc_cuda_bn_shape *s, float *out,
                                      float *save_mean, float *save_rstd, const float *in,
                                      const float *gamma, const float *beta, float *running_mean,
                                      float *running_var) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *acc = bn_acc(ctx, s, S);
    if (!acc || bn_sums(ctx, s, S, acc, in) || bn_sqdev(ctx, s, S, acc, save_mean, in)) return -1;
    return bn_finish(ctx, s, S, acc, out, save_mean, save_rstd, in, gamma, beta, running_mean,
                     running_var);
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
    const int S = bn_splits(s);
    double *acc = bn_acc(ctx, s, S);
    if (!acc ||
        bn_grad_sums(ctx, s, S, acc, dgamma, dbeta, dout, in, out, save_mean, save_rstd))
        return -1;
    return din ? bn_grad_input(ctx, s, S, acc, din, dout, in, out, gamma, save_mean, save_rstd)
               : 0;
}

/* ---- synchronized statistics (SyncBN): the same passes with the host
 * reducing between them. acc lives on the host; each pass copies the part
 * it needs to the device's and what it produces back, waiting for the
 * copies (a reduction over the processes comes next). ---- */

/* acc[from, from + n) between the host and the device's buffer. */
static int acc_copy(visc_cuda *ctx, double *dst, const double *src, int n, cudaMemcpyKind kind) {
    if (visc_cuda_check(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(double), kind, ctx->stream),
                        "SyncBN sums"))
        return -1;
    return kind == cudaMemcpyDeviceToHost ? visc_cuda_sync(ctx) : 0;
}

int visc_cuda_bn_sync_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                           const float *in) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *d = bn_acc(ctx, s, S);
    if (!d || bn_sums(ctx, s, S, d, in) || acc_copy(ctx, acc, d, s->C, cudaMemcpyDeviceToHost))
        return -1;
    acc[s->C] = (double)s->N * s->HW;
    return 0;
}

int visc_cuda_bn_sync_sqdev(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                            float *save_mean, const float *in) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *d = bn_acc(ctx, s, S);
    if (!d || acc_copy(ctx, d, acc, s->C + 1, cudaMemcpyHostToDevice) ||
        bn_sqdev(ctx, s, S, d, save_mean, in))
        return -1;
    return acc_copy(ctx, acc + s->C + 1, d + s->C + 1, s->C, cudaMemcpyDeviceToHost);
}

int visc_cuda_bn_sync_finish(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                             float *out, float *save_mean, float *save_rstd, const float *in,
                             const float *gamma, const float *beta, float *running_mean,
                             float *running_var) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *d = bn_acc(ctx, s, S);
    if (!d || acc_copy(ctx, d, acc, 2 * s->C + 1, cudaMemcpyHostToDevice)) return -1;
    return bn_finish(ctx, s, S, d, out, save_mean, save_rstd, in, gamma, beta, running_mean,
                     running_var);
}

int visc_cuda_bn_sync_grad_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                                float *dgamma, float *dbeta, const float *dout, const float *in,
                                const float *out, const float *save_mean, const float *save_rstd) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *d = bn_acc(ctx, s, S);
    if (!d || bn_grad_sums(ctx, s, S, d, dgamma, dbeta, dout, in, out, save_mean, save_rstd) ||
        acc_copy(ctx, acc, d, 2 * s->C, cudaMemcpyDeviceToHost))
        return -1;
    acc[2 * s->C] = (double)s->N * s->HW;
    return 0;
}

int visc_cuda_bn_sync_grad_input(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                                 float *din, const float *dout, const float *in, const float *out,
                                 const float *gamma, const float *save_mean,
                                 const float *save_rstd) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *d = bn_acc(ctx, s, S);
    if (!d || acc_copy(ctx, d, acc, 2 * s->C + 1, cudaMemcpyHostToDevice)) return -1;
    return bn_grad_input(ctx, s, S, d, din, dout, in, out, gamma, save_mean, save_rstd);
}

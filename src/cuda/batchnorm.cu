/* batchnorm.cu: batch normalization over (N, HW) per channel, as
 * src/nn/batchnorm2d.c computes it, in NCHW or channels-last, on fp32 or
 * bf16 activations (s.bf16: read as fp32, written rounded to nearest even;
 * the statistics, parameters and their gradients stay fp32).
 *
 * Each channel's N * HW values are cut into S ranges (bn_splits: enough
 * blocks to fill the GPU, a few thousand values each at least); block
 * (c, k) sums range k of channel c in double (a fixed tree) into a
 * partial, and one thread per channel adds its S partials in range order,
 * so the statistics do not depend on timing. In channels-last a block
 * takes 32 neighbouring channels instead, a warp reading them side by side
 * at one position, so that every pass reads whole cache lines. SyncBN's
 * passes (visc_batchnorm2d_sync_*) keep their sums in `acc` on the device:
 * the sums, the mean; the squared deviations around its float rounding;
 * then the statistics and the output, the host reducing acc over the
 * processes between them. A process alone fills acc with the same values
 * in one pass instead (bn_moments: sums of the values and their squares
 * shifted by one of them), so its forward reads the input twice, not
 * three times. The arithmetic is the CPU's: the mean in double, rounded
 * to float for centring; the variance around that float mean with its
 * rounding error folded out; the element formulas in float with the CPU's
 * operation order, written with __fmul_rn / __fadd_rn so that nvcc does
 * not contract them into FMAs (the CPU, compiled as ISO C11, does not
 * either). A ResNet block's last norm may also add the block's residual
 * and apply the ReLU in its output pass (visc_cuda_batchnorm_*_add). */
#include <cuda_bf16.h>

#include "common.cuh"

#define BN_THREADS 256
#define BN_MAX_SPLITS 64
/* channels-last: a block takes BN_LANES channels side by side (a warp reads
 * them at one position: coalesced), its threads BN_ROWS positions apart */
#define BN_LANES 32
#define BN_ROWS (BN_THREADS / BN_LANES)
#define BN_MAX_SPLITS_NHWC 1024

/* The channel a thread of block (g, k) works on: NCHW, channel g, every
 * thread; channels-last, channel g BN_LANES + lane (active below C; an
 * inactive thread reads channel C - 1's constants and walks nothing).
 * `writer`: the thread that stores the block's partial sums for it. */
typedef struct {
    int c, active, writer;
} bn_lane;

__device__ __forceinline__ bn_lane bn_lane_of(const visc_cuda_bn_shape &s) {
    bn_lane L;
    if (s.nchw) {
        L.c = blockIdx.x, L.active = 1, L.writer = threadIdx.x == 0;
        return L;
    }
    const int c = blockIdx.x * BN_LANES + threadIdx.x % BN_LANES;
    L.active = c < s.C;
    L.c = L.active ? c : s.C - 1;
    L.writer = L.active && threadIdx.x < BN_LANES;
    return L;
}

/* The element addresses a thread walks in range k = blockIdx.y of
 * gridDim.y of its channel's M = N HW positions: NCHW, positions m0 + t,
 * m0 + t + BN_THREADS, ... (t the thread's index), without a division per
 * step (image n, position i, advanced by the block's stride); channels-
 * last, m0 + r, m0 + r + BN_ROWS, ... (r = t / BN_LANES, the thread's row).
 * Every element loop below is `for (BN_RANGE(s, L, w))`. */
typedef struct {
    size_t m, end, n, i, a, dn, di;
} bn_walk;

__device__ __forceinline__ void bn_walk_at(const visc_cuda_bn_shape &s, int c, bn_walk *w) {
    w->a = s.nchw ? (w->n * (size_t)s.C + c) * (size_t)s.HW + w->i : w->m * (size_t)s.C + c;
}

__device__ __forceinline__ bn_walk bn_walk_start(const visc_cuda_bn_shape &s, const bn_lane &L) {
    bn_walk w;
    const size_t HW = (size_t)s.HW, M = (size_t)s.N * HW;
    const int step = s.nchw ? BN_THREADS : BN_ROWS;
    w.m = M * blockIdx.y / gridDim.y + (s.nchw ? threadIdx.x : threadIdx.x / BN_LANES);
    w.end = L.active ? M * (blockIdx.y + 1) / gridDim.y : 0;
    w.n = w.m / HW, w.i = w.m % HW;
    w.dn = step / HW, w.di = step % HW;
    bn_walk_at(s, L.c, &w);
    return w;
}

__device__ __forceinline__ void bn_walk_next(const visc_cuda_bn_shape &s, const bn_lane &L,
                                             bn_walk *w) {
    w->m += s.nchw ? BN_THREADS : BN_ROWS;
    w->n += w->dn, w->i += w->di;
    if (w->i >= (size_t)s.HW) w->i -= (size_t)s.HW, w->n++;
    bn_walk_at(s, L.c, w);
}

#define BN_RANGE(s, L, w) bn_walk w = bn_walk_start(s, L); w.m < w.end; bn_walk_next(s, L, &w)

/* Element a of an activation tensor, fp32 or bf16. */
__device__ __forceinline__ float act_ld(const void *p, size_t a, int bf16) {
    return bf16 ? __bfloat162float(((const __nv_bfloat16 *)p)[a]) : ((const float *)p)[a];
}
__device__ __forceinline__ void act_st(void *p, size_t a, float v, int bf16) {
    if (bf16) ((__nv_bfloat16 *)p)[a] = __float2bfloat16_rn(v);
    else ((float *)p)[a] = v;
}

/* The sum over the block of each thread's v for its channel, in a fixed
 * tree: NCHW, over all the block's threads; channels-last, over the
 * BN_ROWS threads of each lane. Every thread gets its channel's sum.
 * `buf` holds BN_THREADS doubles. */
__device__ double bn_block_sum(const visc_cuda_bn_shape &s, double v, double *buf) {
    const int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    const int lanes = s.nchw ? 1 : BN_LANES;
    for (int o = BN_THREADS / 2; o >= lanes; o >>= 1) {
        if (t < o) buf[t] += buf[t + o];
        __syncthreads();
    }
    const double r = buf[s.nchw ? 0 : t % BN_LANES];
    __syncthreads();
    return r;
}

/* (x - mean) * scale + shift, uncontracted. */
__device__ __forceinline__ float bn_affine(float x, float mean, float scale, float shift) {
    return __fadd_rn(__fmul_rn(__fsub_rn(x, mean), scale), shift);
}

/* Element a of the output from y = bn(x): y through the fused ReLU; with a
 * residual r (a ResNet block's last norm), y in its stored form plus r,
 * then the ReLU: the bits of the norm's output followed by the residual
 * add + ReLU pass (visc_cuda_add_relu*), without writing y and reading it
 * back. */
__device__ __forceinline__ void bn_out(const visc_cuda_bn_shape &s, void *out,
                                       const void *residual, size_t a, float y) {
    if (residual) {
        const float stored = s.bf16 ? __bfloat162float(__float2bfloat16_rn(y)) : y;
        y = __fadd_rn(stored, act_ld(residual, a, s.bf16));
    }
    act_st(out, a, s.relu ? (y > 0 ? y : 0.0f) : y, s.bf16);
}

/* dout masked by the fused ReLU: the gradient reaching bn's output. */
__device__ __forceinline__ float bn_dy(const visc_cuda_bn_shape &s, const void *dout,
                                       const void *out, size_t a) {
    const float g = act_ld(dout, a, s.bf16);
    return s.relu ? (act_ld(out, a, s.bf16) > 0 ? g : 0.0f) : g;
}

/* ---- the partial sums of block (c, k), into part[(c * S + k) * width + j] ---- */

/* the values */
__global__ void __launch_bounds__(BN_THREADS)
    bn_sum_kernel(visc_cuda_bn_shape s, double *part, const void *in) {
    __shared__ double buf[BN_THREADS];
    const bn_lane L = bn_lane_of(s);
    double acc = 0;
    for (BN_RANGE(s, L, w)) acc += act_ld(in, w.a, s.bf16);
    acc = bn_block_sum(s, acc, buf);
    if (L.writer) part[(size_t)L.c * gridDim.y + blockIdx.y] = acc;
}

/* Where channel c's first value lies (image 0, position 0). */
__device__ __forceinline__ size_t bn_first(const visc_cuda_bn_shape &s, int c) {
    return s.nchw ? (size_t)c * s.HW : (size_t)c;
}

/* The values and their squares in one pass, shifted by the channel's first
 * value K: sums of x - K and (x - K)^2 (each difference exact in double).
 * With a shift inside the data the squares cannot cancel (|x - K| is a few
 * standard deviations whatever the mean), so the deviations around the
 * mean follow from them (bn_combine_kernel) to double's precision, where
 * the unshifted E[x^2] - mean^2 would lose digits to a large mean. */
__global__ void __launch_bounds__(BN_THREADS)
    bn_moments_kernel(visc_cuda_bn_shape s, double *part, const void *in) {
    __shared__ double buf[BN_THREADS];
    const bn_lane L = bn_lane_of(s);
    const double K = act_ld(in, bn_first(s, L.c), s.bf16);
    double a1 = 0, a2 = 0;
    for (BN_RANGE(s, L, w)) {
        const double d = (double)act_ld(in, w.a, s.bf16) - K;
        a1 += d;
        a2 += d * d;
    }
    a1 = bn_block_sum(s, a1, buf);
    a2 = bn_block_sum(s, a2, buf);
    if (L.writer) {
        double *p = part + ((size_t)L.c * gridDim.y + blockIdx.y) * 2;
        p[0] = a1, p[1] = a2;
    }
}

/* the squared deviations around the float rounding of the mean acc[c] / acc[C] */
__global__ void __launch_bounds__(BN_THREADS)
    bn_sqdev_kernel(visc_cuda_bn_shape s, double *part, const double *acc, const void *in) {
    __shared__ double buf[BN_THREADS];
    const bn_lane L = bn_lane_of(s);
    const float fmean = (float)(acc[L.c] / acc[s.C]);
    double ss = 0;
    for (BN_RANGE(s, L, w)) {
        const float d = __fsub_rn(act_ld(in, w.a, s.bf16), fmean);
        ss += (double)d * d;
    }
    ss = bn_block_sum(s, ss, buf);
    if (L.writer) part[(size_t)L.c * gridDim.y + blockIdx.y] = ss;
}

/* dy and dy (x - mean), mean the saved one */
__global__ void __launch_bounds__(BN_THREADS)
    bn_grad_sums_kernel(visc_cuda_bn_shape s, double *part, const void *dout, const void *in,
                        const void *out, const float *save_mean) {
    __shared__ double buf[BN_THREADS];
    const bn_lane L = bn_lane_of(s);
    const float mean = save_mean[L.c];
    double a1 = 0, a2 = 0;
    for (BN_RANGE(s, L, w)) {
        const float dy = bn_dy(s, dout, out, w.a);
        a1 += dy;
        a2 += (double)dy * __fsub_rn(act_ld(in, w.a, s.bf16), mean);
    }
    a1 = bn_block_sum(s, a1, buf);
    a2 = bn_block_sum(s, a2, buf);
    if (L.writer) {
        double *p = part + ((size_t)L.c * gridDim.y + blockIdx.y) * 2;
        p[0] = a1, p[1] = a2;
    }
}

/* ---- each channel's partials added in range order, into acc ---- */
enum { BN_SUMS, BN_SQDEV, BN_MOMENTS, BN_GRADS };

__global__ void bn_combine_kernel(visc_cuda_bn_shape s, int what, int S, const double *part,
                                  double *acc, float *save_mean, float *dgamma, float *dbeta,
                                  const float *save_rstd, const void *in) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= s.C) return;
    const double Md = (double)s.N * s.HW;
    const int width = what == BN_GRADS || what == BN_MOMENTS ? 2 : 1;
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
    } else if (what == BN_MOMENTS) {
        /* acc as the two passes leave it: the sum, the count and the
         * squared deviations around the float mean f, moved from the shift
         * K: sum (x - f)^2 = sum (x - K)^2 - 2 e sum (x - K) + M e^2, e = f - K */
        const double K = act_ld(in, bn_first(s, c), s.bf16), sum = K * Md + a;
        const float fmean = (float)(sum / Md);
        const double e = (double)fmean - K;
        acc[c] = sum;
        if (c == 0) acc[s.C] = Md;
        acc[s.C + 1 + c] = b - 2 * e * a + Md * e * e;
        save_mean[c] = fmean;
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
    bn_finish_kernel(visc_cuda_bn_shape s, const double *acc, void *out, float *save_mean,
                     float *save_rstd, const void *in, const void *residual, const float *gamma,
                     const float *beta, float *running_mean, float *running_var) {
    const bn_lane L = bn_lane_of(s);
    const int c = L.c;
    const double Md = acc[s.C], mean = acc[c] / Md, ss = acc[s.C + 1 + c];
    const float fmean = (float)mean;
    const double dm = mean - (double)fmean;
    double var = ss / Md - dm * dm;
    if (var < 0) var = 0;
    const double rstd = 1.0 / sqrt(var + (double)s.eps);
    if (blockIdx.y == 0 && L.writer) {
        save_mean[c] = fmean;
        save_rstd[c] = (float)rstd;
        const double unbiased = Md > 1 ? var * Md / (Md - 1) : var;
        if (running_mean) { /* NULL: a recomputed forward (--grad-checkpointing) */
            running_mean[c] = (float)((1.0 - s.momentum) * running_mean[c] + s.momentum * mean);
            running_var[c] = (float)((1.0 - s.momentum) * running_var[c] + s.momentum * unbiased);
        }
    }
    const float scale = (float)(gamma[c] * rstd), shift = beta[c];
    for (BN_RANGE(s, L, w))
        bn_out(s, out, residual, w.a, bn_affine(act_ld(in, w.a, s.bf16), fmean, scale, shift));
}

/* din = k (dy - mean(dy) - (x - mean) c2) over the block's range, from the
 * sums in acc over acc[2C] values; every read of element a comes before
 * its write, by the same thread, so din may alias dout. */
__global__ void __launch_bounds__(BN_THREADS)
    bn_grad_input_kernel(visc_cuda_bn_shape s, const double *acc, void *din, const void *dout,
                         const void *in, const void *out, const float *gamma,
                         const float *save_mean, const float *save_rstd) {
    const bn_lane L = bn_lane_of(s);
    const int c = L.c;
    const double Md = acc[2 * s.C], rstd = save_rstd[c];
    const float mean = save_mean[c];
    const float k = (float)(gamma[c] * rstd), mean_dy = (float)(acc[c] / Md);
    const float c2 = (float)(acc[s.C + c] / Md * rstd * rstd);
    for (BN_RANGE(s, L, w)) {
        const float dy = bn_dy(s, dout, out, w.a);
        const float x = act_ld(in, w.a, s.bf16);
        act_st(din, w.a,
               __fmul_rn(k, __fsub_rn(__fsub_rn(dy, mean_dy), __fmul_rn(__fsub_rn(x, mean), c2))),
               s.bf16);
    }
}

__global__ void bn_forward_eval_kernel(visc_cuda_bn_shape s, void *out, const void *in,
                                       const void *residual, const float *gamma,
                                       const float *beta, const float *running_mean,
                                       const float *running_var) {
    const size_t n = (size_t)s.N * s.C * s.HW;
    for (size_t a = blockIdx.x * (size_t)blockDim.x + threadIdx.x; a < n;
         a += (size_t)gridDim.x * blockDim.x) {
        const int c = s.nchw ? (int)(a / (size_t)s.HW % (size_t)s.C) : (int)(a % (size_t)s.C);
        const double rstd = 1.0 / sqrt((double)running_var[c] + (double)s.eps);
        bn_out(s, out, residual, a,
               bn_affine(act_ld(in, a, s.bf16), running_mean[c], (float)(gamma[c] * rstd),
                         beta[c]));
    }
}

static int bn_check(const visc_cuda_bn_shape *s) {
    if (!s || s->N <= 0 || s->C <= 0 || s->HW <= 0 || !(s->eps > 0))
        return visc_set_error("batchnorm: bad shape or eps");
    return 0;
}

/* Ranges per channel (per group of BN_LANES channels in channels-last):
 * about 8 blocks per SM of an H200 over all channels; NCHW, each range
 * 4096 values at least and at most BN_MAX_SPLITS of them; channels-last,
 * 32 positions a row at least, at most BN_MAX_SPLITS_NHWC. */
static int bn_groups(const visc_cuda_bn_shape *s) {
    return s->nchw ? s->C : (s->C + BN_LANES - 1) / BN_LANES;
}

static int bn_splits(const visc_cuda_bn_shape *s) {
    const size_t M = (size_t)s->N * s->HW;
    const size_t per_range = s->nchw ? 4096 : 32 * BN_ROWS;
    const size_t by_size = (M + per_range - 1) / per_range;
    const size_t by_gpu = (132 * 8 + (size_t)bn_groups(s) - 1) / (size_t)bn_groups(s);
    size_t S = by_size < by_gpu ? by_size : by_gpu;
    const size_t most = s->nchw ? BN_MAX_SPLITS : BN_MAX_SPLITS_NHWC;
    if (S > most) S = most;
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

/* Block grid of the passes over the elements: (channel or group, range). */
static dim3 bn_grid(const visc_cuda_bn_shape *s, int S) {
    return dim3((unsigned)bn_groups(s), S);
}

static int bn_combine(visc_cuda *ctx, const visc_cuda_bn_shape *s, int what, int S, double *acc,
                      float *save_mean, float *dgamma, float *dbeta, const float *save_rstd,
                      const void *in) {
    bn_combine_kernel<<<(s->C + 255) / 256, 256, 0, ctx->stream>>>(
        *s, what, S, bn_partials(acc, s), acc, save_mean, dgamma, dbeta, save_rstd, in);
    return visc_cuda_launched("batchnorm sums");
}

/* The sums into acc[0, C), acc[C] = this process's count. */
static int bn_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, double *acc,
                   const void *in) {
    bn_sum_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), in);
    if (visc_cuda_launched("batchnorm sums")) return -1;
    return bn_combine(ctx, s, BN_SUMS, S, acc, NULL, NULL, NULL, NULL, NULL);
}

/* The squared deviations into acc[C + 1, 2C + 1), the float mean into save_mean. */
static int bn_sqdev(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, double *acc,
                    float *save_mean, const void *in) {
    bn_sqdev_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), acc,
                                                                   in);
    if (visc_cuda_launched("batchnorm squared deviations")) return -1;
    return bn_combine(ctx, s, BN_SQDEV, S, acc, save_mean, NULL, NULL, NULL, NULL);
}

/* What bn_sums and bn_sqdev leave in acc (and save_mean), from one pass
 * over `in`: a process alone needs no mean before the deviations. */
static int bn_moments(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, double *acc,
                      float *save_mean, const void *in) {
    bn_moments_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), in);
    if (visc_cuda_launched("batchnorm moments")) return -1;
    return bn_combine(ctx, s, BN_MOMENTS, S, acc, save_mean, NULL, NULL, NULL, in);
}

static int bn_finish(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, const double *acc,
                     void *out, float *save_mean, float *save_rstd, const void *in,
                     const void *residual, const float *gamma, const float *beta,
                     float *running_mean, float *running_var) {
    bn_finish_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(
        *s, acc, out, save_mean, save_rstd, in, residual, gamma, beta, running_mean, running_var);
    return visc_cuda_launched("batchnorm forward (training)");
}

/* The gradient sums into acc[0, 2C), acc[2C] = this process's count, and
 * dgamma, dbeta. */
static int bn_grad_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, double *acc,
                        float *dgamma, float *dbeta, const void *dout, const void *in,
                        const void *out, const float *save_mean, const float *save_rstd) {
    if (s->relu && !out) return visc_set_error("batchnorm backward: the fused ReLU needs `out`");
    bn_grad_sums_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s),
                                                                       dout, in, out, save_mean);
    if (visc_cuda_launched("batchnorm gradient sums")) return -1;
    return bn_combine(ctx, s, BN_GRADS, S, acc, NULL, dgamma, dbeta, save_rstd, NULL);
}

static int bn_grad_input(visc_cuda *ctx, const visc_cuda_bn_shape *s, int S, const double *acc,
                         void *din, const void *dout, const void *in, const void *out,
                         const float *gamma, const float *save_mean, const float *save_rstd) {
    bn_grad_input_kernel<<<bn_grid(s, S), BN_THREADS, 0, ctx->stream>>>(
        *s, acc, din, dout, in, out, gamma, save_mean, save_rstd);
    return visc_cuda_launched("batchnorm backward");
}

/* Two passes over the input: its moments, then the output. */
static int bn_forward_train(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                            float *save_mean, float *save_rstd, const void *in,
                            const void *residual, const float *gamma, const float *beta,
                            float *running_mean, float *running_var) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *acc = bn_acc(ctx, s, S);
    if (!acc || bn_moments(ctx, s, S, acc, save_mean, in)) return -1;
    return bn_finish(ctx, s, S, acc, out, save_mean, save_rstd, in, residual, gamma, beta,
                     running_mean, running_var);
}

static int bn_forward_eval(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                           const void *in, const void *residual, const float *gamma,
                           const float *beta, const float *running_mean,
                           const float *running_var) {
    if (bn_check(s)) return -1;
    const size_t n = (size_t)s->N * s->C * s->HW;
    bn_forward_eval_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        *s, out, in, residual, gamma, beta, running_mean, running_var);
    return visc_cuda_launched("batchnorm forward (eval)");
}

int visc_cuda_batchnorm_forward_train(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                      float *save_mean, float *save_rstd, const void *in,
                                      const float *gamma, const float *beta, float *running_mean,
                                      float *running_var) {
    return bn_forward_train(ctx, s, out, save_mean, save_rstd, in, NULL, gamma, beta,
                            running_mean, running_var);
}

int visc_cuda_batchnorm_forward_eval(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                     const void *in, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var) {
    return bn_forward_eval(ctx, s, out, in, NULL, gamma, beta, running_mean, running_var);
}

int visc_cuda_batchnorm_forward_train_add(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                          float *save_mean, float *save_rstd, const void *in,
                                          const void *residual, const float *gamma,
                                          const float *beta, float *running_mean,
                                          float *running_var) {
    if (!residual) return visc_set_error("batchnorm + residual: no residual");
    return bn_forward_train(ctx, s, out, save_mean, save_rstd, in, residual, gamma, beta,
                            running_mean, running_var);
}

int visc_cuda_batchnorm_forward_eval_add(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                         const void *in, const void *residual, const float *gamma,
                                         const float *beta, const float *running_mean,
                                         const float *running_var) {
    if (!residual) return visc_set_error("batchnorm + residual: no residual");
    return bn_forward_eval(ctx, s, out, in, residual, gamma, beta, running_mean, running_var);
}

int visc_cuda_batchnorm_backward(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *din,
                                 float *dgamma, float *dbeta, const void *dout, const void *in,
                                 const void *out, const float *gamma, const float *save_mean,
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
                           const void *in) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *d = bn_acc(ctx, s, S);
    if (!d || bn_sums(ctx, s, S, d, in) || acc_copy(ctx, acc, d, s->C, cudaMemcpyDeviceToHost))
        return -1;
    acc[s->C] = (double)s->N * s->HW;
    return 0;
}

int visc_cuda_bn_sync_sqdev(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                            float *save_mean, const void *in) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *d = bn_acc(ctx, s, S);
    if (!d || acc_copy(ctx, d, acc, s->C + 1, cudaMemcpyHostToDevice) ||
        bn_sqdev(ctx, s, S, d, save_mean, in))
        return -1;
    return acc_copy(ctx, acc + s->C + 1, d + s->C + 1, s->C, cudaMemcpyDeviceToHost);
}

int visc_cuda_bn_sync_finish(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                             void *out, float *save_mean, float *save_rstd, const void *in,
                             const float *gamma, const float *beta, float *running_mean,
                             float *running_var) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *d = bn_acc(ctx, s, S);
    if (!d || acc_copy(ctx, d, acc, 2 * s->C + 1, cudaMemcpyHostToDevice)) return -1;
    return bn_finish(ctx, s, S, d, out, save_mean, save_rstd, in, NULL, gamma, beta, running_mean,
                     running_var);
}

int visc_cuda_bn_sync_grad_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                                float *dgamma, float *dbeta, const void *dout, const void *in,
                                const void *out, const float *save_mean, const float *save_rstd) {
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
                                 void *din, const void *dout, const void *in, const void *out,
                                 const float *gamma, const float *save_mean,
                                 const float *save_rstd) {
    if (bn_check(s)) return -1;
    const int S = bn_splits(s);
    double *d = bn_acc(ctx, s, S);
    if (!d || acc_copy(ctx, d, acc, 2 * s->C + 1, cudaMemcpyHostToDevice)) return -1;
    return bn_grad_input(ctx, s, S, d, din, dout, in, out, gamma, save_mean, save_rstd);
}

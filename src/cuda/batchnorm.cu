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
 * takes neighbouring channels instead, a warp reading them side by side at
 * one position, so that every pass reads whole cache lines: 32, one a
 * thread, or in bf16 with C a multiple of 8 up to 256, 8 a thread in one
 * 16-byte access (bn_lanes, bn_plan_for). SyncBN's
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
 * not contract them into FMAs (the CPU's FMA clones may: within the
 * kernels' test's tolerances). A ResNet block's last norm may also add
 * the block's residual and apply the ReLU in its output pass
 * (visc_cuda_batchnorm_*_add), or, in a downsampling block, apply the
 * shortcut's norm there as that residual (visc_cuda_batchnorm_*_add_norm,
 * after visc_cuda_batchnorm_statistics); visc_cuda_batchnorm_apply writes a
 * training forward's output again from its saved statistics, and the
 * backward passes, given no output, make its ReLU mask again the same
 * way (bn_dy) instead of reading it. */
#include <cuda_bf16.h>

#include "common.cuh"

#define BN_THREADS 256
#define BN_MAX_SPLITS 64
#define BN_MAX_SPLITS_NHWC 1024
/* bf16 channels-last with C a multiple of BN_VEC (every ResNet's) and
 * 16-byte aligned tensors: a thread takes BN_VEC neighbouring channels,
 * one 16-byte load or store each, where one channel a thread moves 2 bytes
 * per instruction and keeps too few bytes in flight to reach the memory's
 * bandwidth. */
#define BN_VEC 8

/* A block's threads in channels-last: `lanes` side by side across the
 * channels (V each), BN_THREADS / lanes rows apart in positions, so that a
 * warp reads whole cache lines at one position. lanes is a power of two
 * (the sums' tree halves the rows), at most 32 and at most C / V unless
 * that is 1: 32 for one channel a thread; for V = 8, 8 at C = 64, 16 at
 * 128, 32 from 256. NCHW: one channel a block, its threads all rows. */
template <int V> __host__ __device__ __forceinline__ int bn_lanes(const visc_cuda_bn_shape &s) {
    if (s.nchw) return 1;
    int lanes = 32;
    while (V > 1 && lanes > 1 && lanes * V > s.C) lanes >>= 1;
    return lanes;
}

/* The channels c .. c + V - 1 a thread of block (g, k) works on: NCHW,
 * channel g, every thread; channels-last, (g lanes + lane) V (active below
 * C; an inactive thread reads the last channels' constants and walks
 * nothing). `writer`: the thread that stores the block's partial sums for
 * them. */
typedef struct {
    int c, active, writer, lanes;
} bn_lane;

template <int V> __device__ __forceinline__ bn_lane bn_lane_of(const visc_cuda_bn_shape &s) {
    bn_lane L;
    L.lanes = bn_lanes<V>(s);
    if (s.nchw) {
        L.c = blockIdx.x, L.active = 1, L.writer = threadIdx.x == 0;
        return L;
    }
    const int c = (blockIdx.x * L.lanes + threadIdx.x % L.lanes) * V;
    L.active = c < s.C;
    L.c = L.active ? c : s.C - V;
    L.writer = L.active && threadIdx.x < L.lanes;
    return L;
}

/* The element addresses a thread walks in range k = blockIdx.y of
 * gridDim.y of its channel's M = N HW positions: m0 + r, m0 + r + R, ...
 * with r = t / lanes its row and R = BN_THREADS / lanes the rows; NCHW
 * without a division per step (image n, position i, advanced by the
 * block's stride). `a` is the first of its channels' elements. Every
 * element loop below is `for (BN_RANGE(s, L, w))`. */
typedef struct {
    size_t m, end, n, i, a, dn, di;
    int step;
} bn_walk;

__device__ __forceinline__ void bn_walk_at(const visc_cuda_bn_shape &s, int c, bn_walk *w) {
    w->a = s.nchw ? (w->n * (size_t)s.C + c) * (size_t)s.HW + w->i : w->m * (size_t)s.C + c;
}

__device__ __forceinline__ bn_walk bn_walk_start(const visc_cuda_bn_shape &s, const bn_lane &L) {
    bn_walk w;
    const size_t HW = (size_t)s.HW, M = (size_t)s.N * HW;
    w.step = BN_THREADS / L.lanes;
    w.m = M * blockIdx.y / gridDim.y + threadIdx.x / L.lanes;
    w.end = L.active ? M * (blockIdx.y + 1) / gridDim.y : 0;
    w.n = w.m / HW, w.i = w.m % HW;
    w.dn = w.step / HW, w.di = w.step % HW;
    bn_walk_at(s, L.c, &w);
    return w;
}

__device__ __forceinline__ void bn_walk_next(const visc_cuda_bn_shape &s, const bn_lane &L,
                                             bn_walk *w) {
    w->m += w->step;
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

/* Elements a .. a + V - 1: one (fp32 or bf16), or BN_VEC = 8 bf16 in one
 * 16-byte access. */
template <int V> __device__ __forceinline__ void act_ldv(const void *p, size_t a, int bf16, float *x) {
    if constexpr (V == 1) {
        x[0] = act_ld(p, a, bf16);
    } else {
        static_assert(V == 8, "a 16-byte access holds 8 bf16");
        const uint4 u = *(const uint4 *)((const __nv_bfloat16 *)p + a);
        bf16_unpack2(u.x, x), bf16_unpack2(u.y, x + 2);
        bf16_unpack2(u.z, x + 4), bf16_unpack2(u.w, x + 6);
    }
}
template <int V> __device__ __forceinline__ void act_stv(void *p, size_t a, int bf16, const float *x) {
    if constexpr (V == 1) {
        act_st(p, a, x[0], bf16);
    } else {
        static_assert(V == 8, "a 16-byte access holds 8 bf16");
        uint4 u;
        u.x = bf16_pack2(x), u.y = bf16_pack2(x + 2), u.z = bf16_pack2(x + 4),
        u.w = bf16_pack2(x + 6);
        *(uint4 *)((__nv_bfloat16 *)p + a) = u;
    }
}

/* The sums over the block of each thread's v[0, V) for its channels, in a
 * fixed tree over the rows of each lane. Every thread gets its channels'
 * sums. `buf` holds BN_THREADS V doubles. */
template <int V> __device__ void bn_block_sum(const bn_lane &L, double *v, double *buf) {
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < V; j++) buf[j * BN_THREADS + t] = v[j];
    __syncthreads();
    for (int o = BN_THREADS / 2; o >= L.lanes; o >>= 1) {
        if (t < o)
#pragma unroll
            for (int j = 0; j < V; j++) buf[j * BN_THREADS + t] += buf[j * BN_THREADS + t + o];
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < V; j++) v[j] = buf[j * BN_THREADS + t % L.lanes];
    __syncthreads();
}

/* (x - mean) * scale + shift, uncontracted. */
__device__ __forceinline__ float bn_affine(float x, float mean, float scale, float shift) {
    return __fadd_rn(__fmul_rn(__fsub_rn(x, mean), scale), shift);
}

/* Elements a .. a + V - 1 of the output from y = bn(x): y through the
 * fused ReLU; with a residual r (a ResNet block's last norm), y in its
 * stored form plus r, then the ReLU: the bits of the norm's output
 * followed by the residual add + ReLU pass (visc_cuda_add_relu*), without
 * writing y and reading it back. */
template <int V>
__device__ __forceinline__ void bn_out_sum(const visc_cuda_bn_shape &s, void *out, const float *r,
                                           size_t a, float *y) {
    if (r)
#pragma unroll
        for (int j = 0; j < V; j++) {
            const float stored = s.bf16 ? __bfloat162float(__float2bfloat16_rn(y[j])) : y[j];
            y[j] = __fadd_rn(stored, r[j]);
        }
    if (s.relu)
#pragma unroll
        for (int j = 0; j < V; j++) y[j] = y[j] > 0 ? y[j] : 0.0f;
    act_stv<V>(out, a, s.bf16, y);
}

template <int V>
__device__ __forceinline__ void bn_out(const visc_cuda_bn_shape &s, void *out, const void *residual,
                                       size_t a, float *y) {
    float r[V];
    if (residual) act_ldv<V>(residual, a, s.bf16, r);
    bn_out_sum<V>(s, out, residual ? r : NULL, a, y);
}

/* The residual as a norm of its own (visc_cuda_bn_residual) at a .. a + V
 * - 1: its output from its input and per-channel mean, scale and shift,
 * in its stored form (the bits it would have been written and read with). */
template <int V>
__device__ __forceinline__ void bn_residual_norm(const visc_cuda_bn_shape &s,
                                                 const visc_cuda_bn_residual &rn, size_t a,
                                                 const float *mean, const float *scale,
                                                 const float *shift, float *r) {
    act_ldv<V>(rn.in, a, s.bf16, r);
#pragma unroll
    for (int j = 0; j < V; j++) {
        r[j] = bn_affine(r[j], mean[j], scale[j], shift[j]);
        if (s.bf16) r[j] = __bfloat162float(__float2bfloat16_rn(r[j]));
    }
}

/* What a backward pass needs to make the forward's output again where it
 * does not read it (out NULL): the saved mean, the scale gamma rstd and
 * the shift beta, as bn_finish_kernel had them (0 for a NULL gamma or
 * beta: SyncBN's passes, which read out). */
template <int V> struct bn_refit { float mean[V], scale[V], shift[V]; };

template <int V>
__device__ __forceinline__ bn_refit<V> bn_refit_of(const bn_lane &L, const float *gamma,
                                                   const float *beta, const float *save_mean,
                                                   const float *save_rstd) {
    bn_refit<V> r;
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int c = L.c + j;
        r.mean[j] = save_mean[c];
        r.scale[j] = gamma ? (float)(gamma[c] * (double)save_rstd[c]) : 0.0f;
        r.shift[j] = beta ? beta[c] : 0.0f;
    }
    return r;
}

/* dout at a .. a + V - 1 masked by the fused ReLU: the gradient reaching
 * bn's output. The mask is the forward's output, read from out, or with
 * out NULL made again from x (the input at a) by bn_finish_kernel's
 * arithmetic and stored form: the same bits, where the output came from
 * the saved statistics (a training forward), without reading it. */
template <int V>
__device__ __forceinline__ void bn_dy(const visc_cuda_bn_shape &s, const void *dout,
                                      const void *out, size_t a, const float *x,
                                      const bn_refit<V> &r, float *dy) {
    act_ldv<V>(dout, a, s.bf16, dy);
    if (!s.relu) return;
    float y[V];
    if (out) {
        act_ldv<V>(out, a, s.bf16, y);
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) {
            const float v = bn_affine(x[j], r.mean[j], r.scale[j], r.shift[j]);
            y[j] = v > 0 ? v : 0.0f;
            if (s.bf16) y[j] = __bfloat162float(__float2bfloat16_rn(y[j]));
        }
    }
#pragma unroll
    for (int j = 0; j < V; j++) dy[j] = y[j] > 0 ? dy[j] : 0.0f;
}

/* ---- the partial sums of block (c, k), into part[(c * S + k) * width + j] ---- */

/* Stores a block's partials for the thread's channels: width sums each. */
template <int V>
__device__ __forceinline__ void bn_store_partials(const bn_lane &L, double *part, const double *a1,
                                                  const double *a2) {
    if (!L.writer) return;
#pragma unroll
    for (int j = 0; j < V; j++) {
        double *p = part + ((size_t)(L.c + j) * gridDim.y + blockIdx.y) * (a2 ? 2 : 1);
        p[0] = a1[j];
        if (a2) p[1] = a2[j];
    }
}

/* the values (SyncBN's first pass) */
__global__ void __launch_bounds__(BN_THREADS)
    bn_sum_kernel(visc_cuda_bn_shape s, double *part, const void *in) {
    __shared__ double buf[BN_THREADS];
    const bn_lane L = bn_lane_of<1>(s);
    double acc = 0;
    for (BN_RANGE(s, L, w)) acc += act_ld(in, w.a, s.bf16);
    bn_block_sum<1>(L, &acc, buf);
    bn_store_partials<1>(L, part, &acc, NULL);
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
template <int V>
__global__ void __launch_bounds__(BN_THREADS)
    bn_moments_kernel(visc_cuda_bn_shape s, double *part, const void *in) {
    __shared__ double buf[BN_THREADS * V];
    const bn_lane L = bn_lane_of<V>(s);
    float K[V], x[V];
    act_ldv<V>(in, bn_first(s, L.c), s.bf16, K);
    double a1[V], a2[V];
#pragma unroll
    for (int j = 0; j < V; j++) a1[j] = 0, a2[j] = 0;
    for (BN_RANGE(s, L, w)) {
        act_ldv<V>(in, w.a, s.bf16, x);
#pragma unroll
        for (int j = 0; j < V; j++) {
            const double d = (double)x[j] - K[j];
            a1[j] += d;
            a2[j] += d * d;
        }
    }
    bn_block_sum<V>(L, a1, buf);
    bn_block_sum<V>(L, a2, buf);
    bn_store_partials<V>(L, part, a1, a2);
}

/* the squared deviations around the float rounding of the mean acc[c] / acc[C] */
__global__ void __launch_bounds__(BN_THREADS)
    bn_sqdev_kernel(visc_cuda_bn_shape s, double *part, const double *acc, const void *in) {
    __shared__ double buf[BN_THREADS];
    const bn_lane L = bn_lane_of<1>(s);
    const float fmean = (float)(acc[L.c] / acc[s.C]);
    double ss = 0;
    for (BN_RANGE(s, L, w)) {
        const float d = __fsub_rn(act_ld(in, w.a, s.bf16), fmean);
        ss += (double)d * d;
    }
    bn_block_sum<1>(L, &ss, buf);
    bn_store_partials<1>(L, part, &ss, NULL);
}

/* dy and dy (x - mean), mean the saved one (gamma, beta and save_rstd
 * read only to make the output again: bn_dy) */
template <int V>
__global__ void __launch_bounds__(BN_THREADS)
    bn_grad_sums_kernel(visc_cuda_bn_shape s, double *part, const void *dout, const void *in,
                        const void *out, const float *gamma, const float *beta,
                        const float *save_mean, const float *save_rstd) {
    __shared__ double buf[BN_THREADS * V];
    const bn_lane L = bn_lane_of<V>(s);
    const bn_refit<V> r = bn_refit_of<V>(L, gamma, beta, save_mean, save_rstd);
    float dy[V], x[V];
    const float *mean = r.mean;
    double a1[V], a2[V];
#pragma unroll
    for (int j = 0; j < V; j++) a1[j] = 0, a2[j] = 0;
    for (BN_RANGE(s, L, w)) {
        act_ldv<V>(in, w.a, s.bf16, x);
        bn_dy<V>(s, dout, out, w.a, x, r, dy);
#pragma unroll
        for (int j = 0; j < V; j++) {
            a1[j] += dy[j];
            a2[j] += (double)dy[j] * __fsub_rn(x[j], mean[j]);
        }
    }
    bn_block_sum<V>(L, a1, buf);
    bn_block_sum<V>(L, a2, buf);
    bn_store_partials<V>(L, part, a1, a2);
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
 * first range's writer), then the block's range of out. With acc NULL,
 * the output alone from the saved statistics (visc_cuda_batchnorm_apply):
 * the same element arithmetic, so the same bits. The scale is gamma times
 * the saved float rstd, as on the CPU, for that reason. With out NULL, the
 * statistics alone (visc_cuda_batchnorm_statistics); with rn.in, the
 * residual is that norm's output, made here from its saved statistics by
 * the same arithmetic (visc_cuda_batchnorm_forward_train_add_norm). */
template <int V>
__global__ void __launch_bounds__(BN_THREADS)
    bn_finish_kernel(visc_cuda_bn_shape s, const double *acc, void *out, float *save_mean,
                     float *save_rstd, const void *in, const void *residual,
                     visc_cuda_bn_residual rn, const float *gamma, const float *beta,
                     float *running_mean, float *running_var) {
    const bn_lane L = bn_lane_of<V>(s);
    float fmean[V], scale[V], shift[V], x[V], y[V], rmean[V], rscale[V], rshift[V], r[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int c = L.c + j;
        float frstd;
        if (acc) {
            const double Md = acc[s.C], mean = acc[c] / Md, ss = acc[s.C + 1 + c];
            fmean[j] = (float)mean;
            const double dm = mean - (double)fmean[j];
            double var = ss / Md - dm * dm;
            if (var < 0) var = 0;
            frstd = (float)(1.0 / sqrt(var + (double)s.eps));
            if (blockIdx.y == 0 && L.writer) {
                save_mean[c] = fmean[j];
                save_rstd[c] = frstd;
                const double unbiased = Md > 1 ? var * Md / (Md - 1) : var;
                if (running_mean) { /* NULL: a recomputed forward (--grad-checkpointing) */
                    running_mean[c] =
                        (float)((1.0 - s.momentum) * running_mean[c] + s.momentum * mean);
                    running_var[c] =
                        (float)((1.0 - s.momentum) * running_var[c] + s.momentum * unbiased);
                }
            }
        } else {
            fmean[j] = save_mean[c], frstd = save_rstd[c];
        }
        if (!out) continue; /* the statistics alone: no gamma, beta */
        scale[j] = (float)(gamma[c] * (double)frstd), shift[j] = beta[c];
        if (rn.in) { /* as its own output pass would have applied it */
            rmean[j] = rn.mean[c];
            rscale[j] = (float)(rn.gamma[c] * (double)rn.rstd[c]), rshift[j] = rn.beta[c];
        }
    }
    if (!out) return; /* the statistics alone (visc_cuda_batchnorm_statistics) */
    for (BN_RANGE(s, L, w)) {
        act_ldv<V>(in, w.a, s.bf16, x);
#pragma unroll
        for (int j = 0; j < V; j++) y[j] = bn_affine(x[j], fmean[j], scale[j], shift[j]);
        if (rn.in) {
            bn_residual_norm<V>(s, rn, w.a, rmean, rscale, rshift, r);
            bn_out_sum<V>(s, out, r, w.a, y);
        } else {
            bn_out<V>(s, out, residual, w.a, y);
        }
    }
}

/* din = k (dy - mean(dy) - (x - mean) c2) over the block's range, from the
 * sums in acc over acc[2C] values; every read of element a comes before
 * its write, by the same thread, so din may alias dout. */
template <int V>
__global__ void __launch_bounds__(BN_THREADS)
    bn_grad_input_kernel(visc_cuda_bn_shape s, const double *acc, void *din, const void *dout,
                         const void *in, const void *out, const float *gamma, const float *beta,
                         const float *save_mean, const float *save_rstd) {
    const bn_lane L = bn_lane_of<V>(s);
    const double Md = acc[2 * s.C];
    /* k = gamma rstd is the forward's scale */
    const bn_refit<V> r = bn_refit_of<V>(L, gamma, beta, save_mean, save_rstd);
    const float *mean = r.mean, *k = r.scale;
    float mean_dy[V], c2[V], dy[V], x[V], g[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int c = L.c + j;
        const double rstd = save_rstd[c];
        mean_dy[j] = (float)(acc[c] / Md);
        c2[j] = (float)(acc[s.C + c] / Md * rstd * rstd);
    }
    for (BN_RANGE(s, L, w)) {
        act_ldv<V>(in, w.a, s.bf16, x);
        bn_dy<V>(s, dout, out, w.a, x, r, dy);
#pragma unroll
        for (int j = 0; j < V; j++)
            g[j] = __fmul_rn(k[j], __fsub_rn(__fsub_rn(dy[j], mean_dy[j]),
                                             __fmul_rn(__fsub_rn(x[j], mean[j]), c2[j])));
        act_stv<V>(din, w.a, s.bf16, g);
    }
}

__global__ void bn_forward_eval_kernel(visc_cuda_bn_shape s, void *out, const void *in,
                                       const void *residual, visc_cuda_bn_residual rn,
                                       const float *gamma, const float *beta,
                                       const float *running_mean, const float *running_var) {
    const size_t n = (size_t)s.N * s.C * s.HW;
    for (size_t a = blockIdx.x * (size_t)blockDim.x + threadIdx.x; a < n;
         a += (size_t)gridDim.x * blockDim.x) {
        const int c = s.nchw ? (int)(a / (size_t)s.HW % (size_t)s.C) : (int)(a % (size_t)s.C);
        const double rstd = 1.0 / sqrt((double)running_var[c] + (double)s.eps);
        float y = bn_affine(act_ld(in, a, s.bf16), running_mean[c], (float)(gamma[c] * rstd),
                            beta[c]);
        if (rn.in) { /* the residual norm's evaluation output, as its own pass makes it */
            const double rrstd = 1.0 / sqrt((double)rn.running_var[c] + (double)rn.eps);
            const float shift = rn.beta[c], mean = rn.running_mean[c];
            const float scale = (float)(rn.gamma[c] * rrstd);
            float r;
            bn_residual_norm<1>(s, rn, a, &mean, &scale, &shift, &r);
            bn_out_sum<1>(s, out, &r, a, &y);
        } else {
            bn_out<1>(s, out, residual, a, &y);
        }
    }
}

static int bn_check(const visc_cuda_bn_shape *s) {
    if (!s || s->N <= 0 || s->C <= 0 || s->HW <= 0 || !(s->eps > 0))
        return visc_set_error("batchnorm: bad shape or eps");
    return 0;
}

/* How a pass covers the tensor: V channels a thread (1, or BN_VEC), S
 * ranges of positions per channel (per group of channels in
 * channels-last). */
typedef struct {
    int V, S;
} bn_plan;

static int bn_lanes_of(const visc_cuda_bn_shape *s, int V) {
    return V == BN_VEC ? bn_lanes<BN_VEC>(*s) : bn_lanes<1>(*s);
}

/* Blocks across the channels: NCHW one a channel, channels-last one a
 * group of lanes x V channels. */
static int bn_groups(const visc_cuda_bn_shape *s, int V) {
    if (s->nchw) return s->C;
    const int width = bn_lanes_of(s, V) * V;
    return (s->C + width - 1) / width;
}

/* About 8 blocks per SM of an H200 over all channels; NCHW, each range
 * 4096 values at least and at most BN_MAX_SPLITS of them; channels-last,
 * 32 positions a row at least, at most BN_MAX_SPLITS_NHWC. */
static int bn_splits(const visc_cuda_bn_shape *s, int V) {
    const size_t M = (size_t)s->N * s->HW;
    const size_t rows = (size_t)(BN_THREADS / bn_lanes_of(s, V));
    const size_t per_range = s->nchw ? 4096 : 32 * rows;
    const size_t groups = (size_t)bn_groups(s, V);
    const size_t by_size = (M + per_range - 1) / per_range;
    const size_t by_gpu = (132 * 8 + groups - 1) / groups;
    size_t S = by_size < by_gpu ? by_size : by_gpu;
    const size_t most = s->nchw ? BN_MAX_SPLITS : BN_MAX_SPLITS_NHWC;
    if (S > most) S = most;
    return S < 1 ? 1 : (int)S;
}

/* The plan of a pass over the tensors t[0..n) (NULL ones are absent):
 * BN_VEC channels a thread in bf16 channels-last where C is a multiple
 * and every tensor 16-byte aligned, else one. */
static bn_plan bn_plan_for(const visc_cuda *ctx, const visc_cuda_bn_shape *s,
                           const void *const *t, int n) {
    int vec = !ctx->scalar_access && !s->nchw && s->bf16 && s->C % BN_VEC == 0;
    for (int i = 0; i < n; i++) vec = vec && visc_cuda_aligned16(t[i]);
    bn_plan p;
    p.V = vec ? BN_VEC : 1;
    p.S = bn_splits(s, p.V);
    return p;
}

/* SyncBN's sum and deviation passes: one channel a thread. */
static bn_plan bn_plan_scalar(const visc_cuda_bn_shape *s) {
    bn_plan p = {1, bn_splits(s, 1)};
    return p;
}

/* The device's acc (2C + 1 doubles), then the partials (2 C S doubles),
 * grown on first use of a larger layer (a checked shape); NULL with the
 * error set. */
static double *bn_acc(visc_cuda *ctx, const visc_cuda_bn_shape *s, bn_plan p) {
    const size_t bytes = (2 * (size_t)s->C + 1 + 2 * (size_t)s->C * p.S) * sizeof(double);
    return (double *)visc_cuda_grow(ctx, &ctx->bn_acc, &ctx->bn_acc_bytes, bytes);
}

static double *bn_partials(double *acc, const visc_cuda_bn_shape *s) {
    return acc + 2 * (size_t)s->C + 1;
}

/* Block grid of the passes over the elements: (channel or group, range). */
static dim3 bn_grid(const visc_cuda_bn_shape *s, bn_plan p) {
    return dim3((unsigned)bn_groups(s, p.V), p.S);
}

static int bn_combine(visc_cuda *ctx, const visc_cuda_bn_shape *s, int what, bn_plan p,
                      double *acc, float *save_mean, float *dgamma, float *dbeta,
                      const float *save_rstd, const void *in) {
    bn_combine_kernel<<<(s->C + 255) / 256, 256, 0, ctx->stream>>>(
        *s, what, p.S, bn_partials(acc, s), acc, save_mean, dgamma, dbeta, save_rstd, in);
    return visc_cuda_launched("batchnorm sums");
}

/* The sums into acc[0, C), acc[C] = this process's count. */
static int bn_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, bn_plan p, double *acc,
                   const void *in) {
    bn_sum_kernel<<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), in);
    if (visc_cuda_launched("batchnorm sums")) return -1;
    return bn_combine(ctx, s, BN_SUMS, p, acc, NULL, NULL, NULL, NULL, NULL);
}

/* The squared deviations into acc[C + 1, 2C + 1), the float mean into save_mean. */
static int bn_sqdev(visc_cuda *ctx, const visc_cuda_bn_shape *s, bn_plan p, double *acc,
                    float *save_mean, const void *in) {
    bn_sqdev_kernel<<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), acc,
                                                                   in);
    if (visc_cuda_launched("batchnorm squared deviations")) return -1;
    return bn_combine(ctx, s, BN_SQDEV, p, acc, save_mean, NULL, NULL, NULL, NULL);
}

/* What bn_sums and bn_sqdev leave in acc (and save_mean), from one pass
 * over `in`: a process alone needs no mean before the deviations. */
static int bn_moments(visc_cuda *ctx, const visc_cuda_bn_shape *s, bn_plan p, double *acc,
                      float *save_mean, const void *in) {
    if (p.V == BN_VEC)
        bn_moments_kernel<BN_VEC>
            <<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), in);
    else
        bn_moments_kernel<1>
            <<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), in);
    if (visc_cuda_launched("batchnorm moments")) return -1;
    return bn_combine(ctx, s, BN_MOMENTS, p, acc, save_mean, NULL, NULL, NULL, in);
}

/* No residual norm. */
static const visc_cuda_bn_residual no_residual_norm = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0};

static int bn_finish(visc_cuda *ctx, const visc_cuda_bn_shape *s, bn_plan p, const double *acc,
                     void *out, float *save_mean, float *save_rstd, const void *in,
                     const void *residual, const visc_cuda_bn_residual *rn, const float *gamma,
                     const float *beta, float *running_mean, float *running_var) {
    if (p.V == BN_VEC)
        bn_finish_kernel<BN_VEC><<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(
            *s, acc, out, save_mean, save_rstd, in, residual, *rn, gamma, beta, running_mean,
            running_var);
    else
        bn_finish_kernel<1><<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(
            *s, acc, out, save_mean, save_rstd, in, residual, *rn, gamma, beta, running_mean,
            running_var);
    return visc_cuda_launched("batchnorm forward (training)");
}

/* The gradient sums into acc[0, 2C), acc[2C] = this process's count, and
 * dgamma, dbeta. */
static int bn_grad_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, bn_plan p, double *acc,
                        float *dgamma, float *dbeta, const void *dout, const void *in,
                        const void *out, const float *gamma, const float *beta,
                        const float *save_mean, const float *save_rstd) {
    if (s->relu && !out && !(gamma && beta))
        return visc_set_error("batchnorm backward: the fused ReLU needs `out`, or gamma and beta");
    if (p.V == BN_VEC)
        bn_grad_sums_kernel<BN_VEC>
            <<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), dout, in, out,
                                                            gamma, beta, save_mean, save_rstd);
    else
        bn_grad_sums_kernel<1>
            <<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(*s, bn_partials(acc, s), dout, in, out,
                                                            gamma, beta, save_mean, save_rstd);
    if (visc_cuda_launched("batchnorm gradient sums")) return -1;
    return bn_combine(ctx, s, BN_GRADS, p, acc, NULL, dgamma, dbeta, save_rstd, NULL);
}

static int bn_grad_input(visc_cuda *ctx, const visc_cuda_bn_shape *s, bn_plan p, const double *acc,
                         void *din, const void *dout, const void *in, const void *out,
                         const float *gamma, const float *beta, const float *save_mean,
                         const float *save_rstd) {
    if (p.V == BN_VEC)
        bn_grad_input_kernel<BN_VEC>
            <<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(*s, acc, din, dout, in, out, gamma,
                                                            beta, save_mean, save_rstd);
    else
        bn_grad_input_kernel<1>
            <<<bn_grid(s, p), BN_THREADS, 0, ctx->stream>>>(*s, acc, din, dout, in, out, gamma,
                                                            beta, save_mean, save_rstd);
    return visc_cuda_launched("batchnorm backward");
}

/* Two passes over the input: its moments, then the output. */
static int bn_forward_train(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                            float *save_mean, float *save_rstd, const void *in,
                            const void *residual, const visc_cuda_bn_residual *rn,
                            const float *gamma, const float *beta, float *running_mean,
                            float *running_var) {
    if (bn_check(s)) return -1;
    const void *tensors[] = {in, out, residual, rn->in};
    const bn_plan p = bn_plan_for(ctx, s, tensors, 4);
    double *acc = bn_acc(ctx, s, p);
    if (!acc || bn_moments(ctx, s, p, acc, save_mean, in)) return -1;
    return bn_finish(ctx, s, p, acc, out, save_mean, save_rstd, in, residual, rn, gamma, beta,
                     running_mean, running_var);
}

static int bn_forward_eval(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                           const void *in, const void *residual, const visc_cuda_bn_residual *rn,
                           const float *gamma, const float *beta, const float *running_mean,
                           const float *running_var) {
    if (bn_check(s)) return -1;
    const size_t n = (size_t)s->N * s->C * s->HW;
    bn_forward_eval_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        *s, out, in, residual, *rn, gamma, beta, running_mean, running_var);
    return visc_cuda_launched("batchnorm forward (eval)");
}

int visc_cuda_batchnorm_forward_train(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                      float *save_mean, float *save_rstd, const void *in,
                                      const float *gamma, const float *beta, float *running_mean,
                                      float *running_var) {
    return bn_forward_train(ctx, s, out, save_mean, save_rstd, in, NULL, &no_residual_norm, gamma,
                            beta, running_mean, running_var);
}

int visc_cuda_batchnorm_statistics(visc_cuda *ctx, const visc_cuda_bn_shape *s, float *save_mean,
                                   float *save_rstd, const void *in, float *running_mean,
                                   float *running_var) {
    return bn_forward_train(ctx, s, NULL, save_mean, save_rstd, in, NULL, &no_residual_norm, NULL,
                            NULL, running_mean, running_var);
}

int visc_cuda_batchnorm_forward_eval(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                     const void *in, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var) {
    return bn_forward_eval(ctx, s, out, in, NULL, &no_residual_norm, gamma, beta, running_mean,
                           running_var);
}

int visc_cuda_batchnorm_apply(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                              const void *in, const float *gamma, const float *beta,
                              const float *save_mean, const float *save_rstd) {
    if (bn_check(s)) return -1;
    const void *tensors[] = {in, out};
    const bn_plan p = bn_plan_for(ctx, s, tensors, 2);
    return bn_finish(ctx, s, p, NULL, out, (float *)save_mean, (float *)save_rstd, in, NULL,
                     &no_residual_norm, gamma, beta, NULL, NULL);
}

int visc_cuda_batchnorm_forward_train_add(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                          float *save_mean, float *save_rstd, const void *in,
                                          const void *residual, const float *gamma,
                                          const float *beta, float *running_mean,
                                          float *running_var) {
    if (!residual) return visc_set_error("batchnorm + residual: no residual");
    return bn_forward_train(ctx, s, out, save_mean, save_rstd, in, residual, &no_residual_norm,
                            gamma, beta, running_mean, running_var);
}

int visc_cuda_batchnorm_forward_train_add_norm(visc_cuda *ctx, const visc_cuda_bn_shape *s,
                                               void *out, float *save_mean, float *save_rstd,
                                               const void *in, const visc_cuda_bn_residual *rn,
                                               const float *gamma, const float *beta,
                                               float *running_mean, float *running_var) {
    if (!rn || !rn->in || !rn->mean || !rn->rstd || !rn->gamma || !rn->beta)
        return visc_set_error("batchnorm + residual norm: its input, statistics or parameters "
                              "missing");
    return bn_forward_train(ctx, s, out, save_mean, save_rstd, in, NULL, rn, gamma, beta,
                            running_mean, running_var);
}

int visc_cuda_batchnorm_forward_eval_add(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                         const void *in, const void *residual, const float *gamma,
                                         const float *beta, const float *running_mean,
                                         const float *running_var) {
    if (!residual) return visc_set_error("batchnorm + residual: no residual");
    return bn_forward_eval(ctx, s, out, in, residual, &no_residual_norm, gamma, beta, running_mean,
                           running_var);
}

int visc_cuda_batchnorm_forward_eval_add_norm(visc_cuda *ctx, const visc_cuda_bn_shape *s,
                                              void *out, const void *in,
                                              const visc_cuda_bn_residual *rn, const float *gamma,
                                              const float *beta, const float *running_mean,
                                              const float *running_var) {
    if (!rn || !rn->in || !rn->running_mean || !rn->running_var || !rn->gamma || !rn->beta ||
        !(rn->eps > 0))
        return visc_set_error("batchnorm + residual norm: its input, running statistics, "
                              "parameters or eps missing");
    return bn_forward_eval(ctx, s, out, in, NULL, rn, gamma, beta, running_mean, running_var);
}

int visc_cuda_batchnorm_backward(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *din,
                                 float *dgamma, float *dbeta, const void *dout, const void *in,
                                 const void *out, const float *gamma, const float *beta,
                                 const float *save_mean, const float *save_rstd) {
    if (bn_check(s)) return -1;
    const void *tensors[] = {din, dout, in, out};
    const bn_plan p = bn_plan_for(ctx, s, tensors, 4);
    double *acc = bn_acc(ctx, s, p);
    if (!acc || bn_grad_sums(ctx, s, p, acc, dgamma, dbeta, dout, in, out, gamma, beta, save_mean,
                             save_rstd))
        return -1;
    return din ? bn_grad_input(ctx, s, p, acc, din, dout, in, out, gamma, beta, save_mean,
                               save_rstd)
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
    const bn_plan p = bn_plan_scalar(s);
    double *d = bn_acc(ctx, s, p);
    if (!d || bn_sums(ctx, s, p, d, in) || acc_copy(ctx, acc, d, s->C, cudaMemcpyDeviceToHost))
        return -1;
    acc[s->C] = (double)s->N * s->HW;
    return 0;
}

int visc_cuda_bn_sync_sqdev(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                            float *save_mean, const void *in) {
    if (bn_check(s)) return -1;
    const bn_plan p = bn_plan_scalar(s);
    double *d = bn_acc(ctx, s, p);
    if (!d || acc_copy(ctx, d, acc, s->C + 1, cudaMemcpyHostToDevice) ||
        bn_sqdev(ctx, s, p, d, save_mean, in))
        return -1;
    return acc_copy(ctx, acc + s->C + 1, d + s->C + 1, s->C, cudaMemcpyDeviceToHost);
}

int visc_cuda_bn_sync_finish(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                             void *out, float *save_mean, float *save_rstd, const void *in,
                             const float *gamma, const float *beta, float *running_mean,
                             float *running_var) {
    if (bn_check(s)) return -1;
    const void *tensors[] = {in, out};
    const bn_plan p = bn_plan_for(ctx, s, tensors, 2);
    double *d = bn_acc(ctx, s, p);
    if (!d || acc_copy(ctx, d, acc, 2 * s->C + 1, cudaMemcpyHostToDevice)) return -1;
    return bn_finish(ctx, s, p, d, out, save_mean, save_rstd, in, NULL, &no_residual_norm, gamma,
                     beta, running_mean,
                     running_var);
}

int visc_cuda_bn_sync_grad_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                                float *dgamma, float *dbeta, const void *dout, const void *in,
                                const void *out, const float *save_mean, const float *save_rstd) {
    if (bn_check(s)) return -1;
    const void *tensors[] = {dout, in, out};
    const bn_plan p = bn_plan_for(ctx, s, tensors, 3);
    double *d = bn_acc(ctx, s, p);
    if (!d ||
        bn_grad_sums(ctx, s, p, d, dgamma, dbeta, dout, in, out, NULL, NULL, save_mean,
                     save_rstd) ||
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
    const void *tensors[] = {din, dout, in, out};
    const bn_plan p = bn_plan_for(ctx, s, tensors, 4);
    double *d = bn_acc(ctx, s, p);
    if (!d || acc_copy(ctx, d, acc, 2 * s->C + 1, cudaMemcpyHostToDevice)) return -1;
    if (s->relu && !out) return visc_set_error("SyncBN backward: the fused ReLU needs `out`");
    return bn_grad_input(ctx, s, p, d, din, dout, in, out, gamma, NULL, save_mean, save_rstd);
}

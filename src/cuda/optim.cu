/* optim.cu: fused optimizer steps over the flat parameter buffer, the GPU
 * twins of src/optim/adamw.c, sgd.c, lars.c and lamb.c, and gradient
 * clipping (clip.c).
 *
 * The work split is the CPU's: every tensor of the table is cut into
 * pieces of at most 16384 floats (one CUDA block each), so the padding
 * between tensors is never touched and each piece knows its tensor and
 * weight decay. The arithmetic is the CPU's, operation for operation: the
 * _rn intrinsics keep nvcc from fusing a multiply and an add into one FMA
 * (the CPU code, compiled as ISO C, never contracts), and CUDA's sqrtf and
 * division are correctly rounded. So SGD and AdamW steps give the CPU's
 * bits, which the GPU test checks.
 *
 * LARS and LAMB scale each tensor's update by a trust ratio made of its
 * norms: each piece's sums of squares (in double, a fixed tree per block),
 * then one thread per tensor adds its pieces in order and makes the ratio,
 * then the update. Nothing waits for the host. The sums add in another
 * order than the CPU's threads do, so these steps agree with the CPU's to
 * a rounding of the norms, not to the bit. */
#include <math.h>
#include <stdlib.h>

#include "common.cuh"

#define PIECE_FLOATS 16384

typedef struct {
    int64_t begin, end; /* float offsets into the flat buffers */
    float weight_decay; /* the tensor's (0 where excluded) */
    int entry;          /* the tensor's index in the table */
} piece;

/* One tensor, for the trust ratios: its pieces are first .. first+count-1. */
typedef struct {
    int first, count;
    int adapt; /* gets a trust ratio (visc_opt_adapts: decayed, or always_adapt) */
    float weight_decay;
} tensor_info;

struct visc_cuda_optim {
    visc_cuda *ctx;
    visc_opt_config cfg;
    size_t total;  /* floats per buffer */
    piece *pieces; /* device */
    int num_pieces;
    /* LARS / LAMB (device): per tensor, its pieces; per piece, two sums of
     * squares; per tensor, this step's ratio; LAMB's gradient divisor */
    tensor_info *tensors;
    int num_tensors;
    double *sums;
    float *ratio, *clip;
};

static int adaptive(visc_opt_kind k) { return k == VISC_OPT_LARS || k == VISC_OPT_LAMB; }

visc_cuda_optim *visc_cuda_optim_create(visc_cuda *ctx, const visc_optimizer *cpu) {
    const visc_table *t = cpu->params;
    int n = 0;
    for (int e = 0; e < t->count; e++)
        n += (int)((t->entries[e].numel + PIECE_FLOATS - 1) / PIECE_FLOATS);
    piece *host = (piece *)calloc((size_t)n + 1, sizeof *host);
    tensor_info *info = (tensor_info *)calloc((size_t)t->count + 1, sizeof *info);
    visc_cuda_optim *o = (visc_cuda_optim *)calloc(1, sizeof *o);
    if (!host || !info || !o) {
        free(host);
        free(info);
        free(o);
        visc_set_error("out of memory allocating the CUDA optimizer");
        return NULL;
    }
    int k = 0;
    for (int e = 0; e < t->count; e++) {
        const visc_tensor_entry *te = &t->entries[e];
        info[e].first = k;
        info[e].adapt = cpu->entry_decay[e] != 0.0f || cpu->cfg.always_adapt;
        info[e].weight_decay = cpu->entry_decay[e];
        for (size_t b = 0; b < te->numel; b += PIECE_FLOATS) {
            host[k].begin = (int64_t)(te->offset + b);
            host[k].end = (int64_t)(te->offset +
                                    (te->numel - b > PIECE_FLOATS ? b + PIECE_FLOATS : te->numel));
            host[k].weight_decay = cpu->entry_decay[e];
            host[k].entry = e;
            k++;
        }
        info[e].count = k - info[e].first;
    }
    o->ctx = ctx;
    o->cfg = cpu->cfg;
    o->total = t->total;
    o->num_pieces = n;
    o->num_tensors = t->count;
    o->pieces = (piece *)visc_cuda_alloc(ctx, sizeof(piece) * ((size_t)n + 1));
    int bad = !o->pieces || visc_cuda_upload(ctx, o->pieces, host, sizeof(piece) * (size_t)n);
    if (!bad && adaptive(cpu->cfg.kind)) {
        o->tensors = (tensor_info *)visc_cuda_alloc(ctx, sizeof(tensor_info) * (t->count + 1));
        o->sums = (double *)visc_cuda_alloc(ctx, sizeof(double) * 2 * ((size_t)n + 1));
        o->ratio = (float *)visc_cuda_alloc(ctx, sizeof(float) * (t->count + 1));
        o->clip = (float *)visc_cuda_alloc(ctx, sizeof(float));
        bad = !o->tensors || !o->sums || !o->ratio || !o->clip ||
              visc_cuda_upload(ctx, o->tensors, info, sizeof(tensor_info) * t->count);
    }
    free(host);
    free(info);
    if (bad) {
        visc_cuda_optim_destroy(o);
        return NULL;
    }
    return o;
}

void visc_cuda_optim_destroy(visc_cuda_optim *o) {
    if (!o) return;
    visc_cuda_free(o->ctx, o->pieces);
    visc_cuda_free(o->ctx, o->tensors);
    visc_cuda_free(o->ctx, o->sums);
    visc_cuda_free(o->ctx, o->ratio);
    visc_cuda_free(o->ctx, o->clip);
    free(o);
}

/* ---- sums of squares: one block of OPT_THREADS, a fixed tree ---- */
#define OPT_THREADS 256

/* The block's two partial sums a, b added in a fixed order; thread 0 gets the totals. */
__device__ void block_sum2(double &a, double &b) {
    __shared__ double sa[OPT_THREADS];
    __shared__ double sb[OPT_THREADS];
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    for (int w = OPT_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            sa[threadIdx.x] += sa[threadIdx.x + w];
            sb[threadIdx.x] += sb[threadIdx.x + w];
        }
        __syncthreads();
    }
    a = sa[0];
    b = sb[0];
}

/* The scalars of one AdamW step, as adamw.c computes them. */
typedef struct {
    float beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step, lr;
} adamw_scalars;

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, const piece *pieces,
                             adamw_scalars s) {
    const piece pc = pieces[blockIdx.x];
    /* decay = 1 - lr * wd in double, rounded once, as the CPU: no FMA. */
    const float decay = (float)__dadd_rn(1.0, -__dmul_rn((double)s.lr, (double)pc.weight_decay));
    for (int64_t i = pc.begin + threadIdx.x; i < pc.end; i += blockDim.x) {
        const float gi = g[i];
        const float mi = __fadd_rn(__fmul_rn(m[i], s.beta1), __fmul_rn(s.one_minus_beta1, gi));
        const float vi =
            __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
        p[i] = __fadd_rn(__fmul_rn(p[i], decay), __fdiv_rn(__fmul_rn(s.neg_step, mi), denom));
    }
}

/* sgd.c's branch-free form: keep = 0 on the first step, take_d / take_b
 * select Nesterov's d + momentum * buf or plain buf. */
typedef struct {
    float lr, keep, take_d, take_b;
    int momentum; /* 0: no buffer at all */
} sgd_scalars;

/* ratio: LARS's per-tensor trust ratios, or NULL (SGD: 1, exact). */
__global__ void sgd_kernel(float *p, const float *g, float *buf, const piece *pieces,
                           const float *ratio, sgd_scalars s) {
    const piece pc = pieces[blockIdx.x];
    const float wd = pc.weight_decay, scale = ratio ? ratio[pc.entry] : 1.0f;
    for (int64_t i = pc.begin + threadIdx.x; i < pc.end; i += blockDim.x) {
        const float d = __fmul_rn(__fadd_rn(g[i], __fmul_rn(wd, p[i])), scale);
        if (!s.momentum) {
            p[i] = __fadd_rn(p[i], -__fmul_rn(s.lr, d));
            continue;
        }
        const float b = __fadd_rn(__fmul_rn(s.keep, buf[i]), d);
        buf[i] = b;
        p[i] =
            __fadd_rn(p[i],
                      -__fmul_rn(s.lr, __fadd_rn(__fmul_rn(s.take_d, d), __fmul_rn(s.take_b, b))));
    }
}

/* Thread e of a per-tensor kernel: tensor e's two norms from its pieces'
 * sums (slots 0 and 1), added in piece order. 0 past the last tensor. */
__device__ int tensor_norms(const double *sums, const tensor_info *tensors, int num_tensors,
                            tensor_info *t, float *norm0, float *norm1) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= num_tensors) return 0;
    *t = tensors[e];
    double s0 = 0, s1 = 0;
    for (int k = t->first; k < t->first + t->count; k++) s0 += sums[2 * k], s1 += sums[2 * k + 1];
    *norm0 = (float)sqrt(s0);
    *norm1 = (float)sqrt(s1);
    return 1;
}

/* ---- LARS (lars.c) ---- */
/* Per piece of an adapted tensor: sums of squares of p and g. */
__global__ void lars_sums_kernel(double *sums, const float *p, const float *g, const piece *pieces,
                                 const tensor_info *tensors) {
    const piece pc = pieces[blockIdx.x];
    double sp = 0, sg = 0;
    if (tensors[pc.entry].adapt)
        for (int64_t i = pc.begin + threadIdx.x; i < pc.end; i += blockDim.x) {
            sp += (double)p[i] * p[i];
            sg += (double)g[i] * g[i];
        }
    block_sum2(sp, sg);
    if (threadIdx.x == 0) sums[2 * blockIdx.x] = sp, sums[2 * blockIdx.x + 1] = sg;
}

/* One thread per tensor: its pieces' sums in order, then lars.c's ratio. */
__global__ void lars_ratio_kernel(float *ratio, const double *sums, const tensor_info *tensors,
                                  int num_tensors, float trust_coef, float eps, int trust_clip,
                                  float lr) {
    tensor_info t;
    float w_norm, g_norm;
    if (!tensor_norms(sums, tensors, num_tensors, &t, &w_norm, &g_norm)) return;
    float r = 1.0f;
    if (t.adapt) {
        if (w_norm > 0.0f && g_norm > 0.0f)
            r = __fdiv_rn(__fmul_rn(trust_coef, w_norm),
                          __fadd_rn(__fadd_rn(g_norm, __fmul_rn(w_norm, t.weight_decay)), eps));
        if (trust_clip) {
            r = __fdiv_rn(r, lr);
            if (r > 1.0f) r = 1.0f;
        }
    }
    ratio[blockIdx.x * blockDim.x + threadIdx.x] = r;
}

/* ---- LAMB (lamb.c) ---- */
typedef struct {
    float beta1, beta3, beta2, one_minus_beta2, bc1, bc2_sqrt, eps, lr;
} lamb_scalars;

/* Per piece: the sum of squares of g (the global norm's part). */
__global__ void grad_sums_kernel(double *sums, const float *g, const piece *pieces) {
    const piece pc = pieces[blockIdx.x];
    double sg = 0, none = 0;
    for (int64_t i = pc.begin + threadIdx.x; i < pc.end; i += blockDim.x) sg += (double)g[i] * g[i];
    block_sum2(sg, none);
    if (threadIdx.x == 0) sums[2 * blockIdx.x] = sg;
}

/* One thread: timm's divisor ||g|| / max_grad_norm where that exceeds 1. */
__global__ void lamb_clip_kernel(float *clip, const double *sums, int num_pieces,
                                 float max_grad_norm) {
    double total = 0;
    for (int k = 0; k < num_pieces; k++) total += sums[2 * k];
    const float norm = (float)sqrt(total);
    *clip = norm > max_grad_norm ? __fdiv_rn(norm, max_grad_norm) : 1.0f;
}

/* u = (m / bc1) / (sqrt(v) / bc2_sqrt + eps) + wd * p */
__device__ float lamb_update(float p, float m, float v, float wd, const lamb_scalars &s) {
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
    return __fadd_rn(__fdiv_rn(__fdiv_rn(m, s.bc1), denom), __fmul_rn(wd, p));
}

/* Per piece: the moments, and for an adapted tensor the sums of squares of
 * u and p. clip: the gradients' divisor, or NULL (none). */
__global__ void lamb_moments_kernel(double *sums, const float *p, const float *g, float *m,
                                    float *v, const piece *pieces, const tensor_info *tensors,
                                    const float *clip, lamb_scalars s) {
    const piece pc = pieces[blockIdx.x];
    const float c = clip ? *clip : 1.0f;
    const int adapt = tensors[pc.entry].adapt;
    double su = 0, sp = 0;
    for (int64_t i = pc.begin + threadIdx.x; i < pc.end; i += blockDim.x) {
        const float gi = __fdiv_rn(g[i], c);
        const float mi = __fadd_rn(__fmul_rn(m[i], s.beta1), __fmul_rn(s.beta3, gi));
        const float vi =
            __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(s.one_minus_beta2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        if (adapt) {
            const float u = lamb_update(p[i], mi, vi, pc.weight_decay, s);
            su += (double)u * u;
            sp += (double)p[i] * p[i];
        }
    }
    block_sum2(su, sp);
    if (threadIdx.x == 0) sums[2 * blockIdx.x] = su, sums[2 * blockIdx.x + 1] = sp;
}

__global__ void lamb_ratio_kernel(float *ratio, const double *sums, const tensor_info *tensors,
                                  int num_tensors, int trust_clip) {
    tensor_info t;
    float u_norm, w_norm;
    if (!tensor_norms(sums, tensors, num_tensors, &t, &u_norm, &w_norm)) return;
    float r = 1.0f;
    if (t.adapt) {
        if (w_norm > 0.0f && u_norm > 0.0f) r = __fdiv_rn(w_norm, u_norm);
        if (trust_clip && r > 1.0f) r = 1.0f;
    }
    ratio[blockIdx.x * blockDim.x + threadIdx.x] = r;
}

__global__ void lamb_apply_kernel(float *p, const float *m, const float *v, const piece *pieces,
                                  const float *ratio, lamb_scalars s) {
    const piece pc = pieces[blockIdx.x];
    const float r = ratio[pc.entry];
    for (int64_t i = pc.begin + threadIdx.x; i < pc.end; i += blockDim.x) {
        const float u = lamb_update(p[i], m[i], v[i], pc.weight_decay, s);
        p[i] = __fadd_rn(p[i], -__fmul_rn(s.lr, __fmul_rn(u, r)));
    }
}

static int lamb_step(visc_cuda_optim *o, float *params, const float *grads, float *state, float lr,
                     int64_t step) {
    const visc_opt_config *cfg = &o->cfg;
    cudaStream_t st = o->ctx->stream;
    const int tensor_blocks = (o->num_tensors + 127) / 128;
    const float *clip = NULL;
    if (cfg->max_grad_norm > 0.0f) {
        grad_sums_kernel<<<o->num_pieces, OPT_THREADS, 0, st>>>(o->sums, grads, o->pieces);
        lamb_clip_kernel<<<1, 1, 0, st>>>(o->clip, o->sums, o->num_pieces, cfg->max_grad_norm);
        clip = o->clip;
    }
    const double t = (double)(step + 1);
    lamb_scalars s;
    s.beta1 = cfg->beta1;
    s.beta3 = (float)(1.0 - (double)cfg->beta1);
    s.beta2 = cfg->beta2;
    s.one_minus_beta2 = (float)(1.0 - (double)cfg->beta2);
    s.bc1 = (float)(1.0 - pow((double)cfg->beta1, t));
    s.bc2_sqrt = (float)sqrt(1.0 - pow((double)cfg->beta2, t));
    s.eps = cfg->eps;
    s.lr = lr;
    float *m = state, *v = state + o->total;
    lamb_moments_kernel<<<o->num_pieces, OPT_THREADS, 0, st>>>(o->sums, params, grads, m, v,
                                                               o->pieces, o->tensors, clip, s);
    lamb_ratio_kernel<<<tensor_blocks, 128, 0, st>>>(o->ratio, o->sums, o->tensors, o->num_tensors,
                                                     cfg->trust_clip);
    lamb_apply_kernel<<<o->num_pieces, OPT_THREADS, 0, st>>>(params, m, v, o->pieces, o->ratio, s);
    return visc_cuda_launched("lamb step");
}

int visc_cuda_optim_step(visc_cuda_optim *o, float *params, const float *grads, float *state,
                         float lr, int64_t step) {
    if (o->num_pieces == 0) return 0;
    const visc_opt_config *cfg = &o->cfg;
    if (cfg->kind == VISC_OPT_LAMB) return lamb_step(o, params, grads, state, lr, step);
    if (cfg->kind == VISC_OPT_ADAMW) {
        const double t = (double)(step + 1);
        const double bc1 = 1.0 - pow((double)cfg->beta1, t), bc2 = 1.0 - pow((double)cfg->beta2, t);
        adamw_scalars s;
        s.beta1 = cfg->beta1;
        s.one_minus_beta1 = (float)(1.0 - (double)cfg->beta1);
        s.beta2 = cfg->beta2;
        s.one_minus_beta2 = (float)(1.0 - (double)cfg->beta2);
        s.bc2_sqrt = (float)sqrt(bc2);
        s.eps = cfg->eps;
        s.neg_step = (float)(-((double)lr / bc1));
        s.lr = lr;
        adamw_kernel<<<o->num_pieces, 256, 0, o->ctx->stream>>>(params, grads, state,
                                                                state + o->total, o->pieces, s);
        return visc_cuda_launched("adamw step");
    }
    sgd_scalars s;
    s.lr = lr;
    s.momentum = cfg->momentum != 0.0f;
    s.keep = step == 0 ? 0.0f : cfg->momentum;
    s.take_d = cfg->nesterov ? 1.0f : 0.0f;
    s.take_b = cfg->nesterov ? cfg->momentum : 1.0f;
    const float *ratio = NULL;
    cudaStream_t st = o->ctx->stream;
    if (cfg->kind == VISC_OPT_LARS) {
        const int tensor_blocks = (o->num_tensors + 127) / 128;
        lars_sums_kernel<<<o->num_pieces, OPT_THREADS, 0, st>>>(o->sums, params, grads, o->pieces,
                                                                o->tensors);
        lars_ratio_kernel<<<tensor_blocks, 128, 0, st>>>(o->ratio, o->sums, o->tensors,
                                                         o->num_tensors, cfg->trust_coef, cfg->eps,
                                                         cfg->trust_clip, lr);
        ratio = o->ratio;
    }
    sgd_kernel<<<o->num_pieces, 256, 0, st>>>(params, grads, state, o->pieces, ratio, s);
    return visc_cuda_launched(cfg->kind == VISC_OPT_LARS ? "lars step" : "sgd step");
}

/* ema = keep * ema + take * params, the products and the sum rounded
 * separately as the CPU's (no FMA: src/optim/ema.c compiles as ISO C). */
__global__ void ema_kernel(float *ema, const float *params, size_t n, float keep, float take) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        ema[i] = __fadd_rn(__fmul_rn(keep, ema[i]), __fmul_rn(take, params[i]));
}

int visc_cuda_ema_update(visc_cuda *ctx, float *ema, const float *params, size_t n, float decay) {
    if (n == 0) return 0;
    const float keep = decay, take = (float)(1.0 - (double)decay);
    ema_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(ema, params, n, keep, take);
    return visc_cuda_launched("ema update");
}

/* ---- gradient clipping (clip.c) ---- */
#define NORM_CHUNKS 256 /* clip.c's fixed split */

/* Block c: the sum of squares of chunk c, as clip.c cuts the buffer. */
__global__ void chunk_sums_kernel(double *part, const float *x, size_t n) {
    const size_t chunk = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
    const size_t begin = blockIdx.x * chunk, end = begin + chunk < n ? begin + chunk : n;
    double s = 0, none = 0;
    for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) s += (double)x[i] * x[i];
    block_sum2(s, none);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* One thread: torch's max_norm / (norm + 1e-6) from the chunks in order. */
__global__ void clip_coef_kernel(float *coef, const double *part, float max_norm) {
    double total = 0;
    for (int c = 0; c < NORM_CHUNKS; c++) total += part[c];
    *coef = __fdiv_rn(max_norm, __fadd_rn((float)sqrt(total), 1e-6f));
}

__global__ void clip_scale_kernel(float *x, size_t n, const float *coef) {
    const float c = *coef;
    if (!(c < 1.0f)) return;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], c);
}

int visc_cuda_clip_grad_norm(visc_cuda *ctx, float *grads, size_t n, float max_norm) {
    if (n == 0) return 0;
    /* NORM_CHUNKS partial sums, then the coefficient, in the scratch */
    double *part = (double *)visc_cuda_scratch(ctx, sizeof(double) * (NORM_CHUNKS + 1));
    if (!part) return -1;
    float *coef = (float *)(part + NORM_CHUNKS);
    chunk_sums_kernel<<<NORM_CHUNKS, OPT_THREADS, 0, ctx->stream>>>(part, grads, n);
    clip_coef_kernel<<<1, 1, 0, ctx->stream>>>(coef, part, max_norm);
    clip_scale_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(grads, n, coef);
    return visc_cuda_launched("gradient clipping");
}

/* optim.cu: fused AdamW and SGD-momentum steps over the flat parameter
 * buffer, the GPU twins of src/optim/adamw.c and sgd.c.
 *
 * The work split is the CPU's: every tensor of the table is cut into
 * pieces of at most 16384 floats (one CUDA block each), so the padding
 * between tensors is never touched and each piece knows its weight decay.
 * The arithmetic is the CPU's, operation for operation: the _rn intrinsics
 * keep nvcc from fusing a multiply and an add into one FMA (the CPU code,
 * compiled as ISO C, never contracts), and CUDA's sqrtf and division are
 * correctly rounded. So a step gives the CPU's bits, which the GPU test
 * checks. */
#include <math.h>
#include <stdlib.h>

#include "common.cuh"

#define PIECE_FLOATS 16384

typedef struct {
    int64_t begin, end; /* float offsets into the flat buffers */
    float weight_decay; /* the tensor's (0 where excluded) */
} piece;

struct visc_cuda_optim {
    visc_cuda *ctx;
    visc_opt_config cfg;
    size_t total;  /* floats per buffer */
    piece *pieces; /* device */
    int num_pieces;
};

visc_cuda_optim *visc_cuda_optim_create(visc_cuda *ctx, const visc_optimizer *cpu) {
    if (cpu->cfg.kind != VISC_OPT_ADAMW && cpu->cfg.kind != VISC_OPT_SGD) {
        visc_set_error("optimizer %s has no CUDA step yet (sgd and adamw have)",
                       visc_opt_kind_name(cpu->cfg.kind));
        return NULL;
    }
    const visc_table *t = cpu->params;
    int n = 0;
    for (int e = 0; e < t->count; e++)
        n += (int)((t->entries[e].numel + PIECE_FLOATS - 1) / PIECE_FLOATS);
    piece *host = (piece *)calloc((size_t)n + 1, sizeof *host);
    visc_cuda_optim *o = (visc_cuda_optim *)calloc(1, sizeof *o);
    if (!host || !o) {
        free(host);
        free(o);
        visc_set_error("out of memory allocating the CUDA optimizer");
        return NULL;
    }
    int k = 0;
    for (int e = 0; e < t->count; e++) {
        const visc_tensor_entry *te = &t->entries[e];
        for (size_t b = 0; b < te->numel; b += PIECE_FLOATS) {
            host[k].begin = (int64_t)(te->offset + b);
            host[k].end = (int64_t)(te->offset +
                                    (te->numel - b > PIECE_FLOATS ? b + PIECE_FLOATS : te->numel));
            host[k].weight_decay = cpu->entry_decay[e];
            k++;
        }
    }
    o->ctx = ctx;
    o->cfg = cpu->cfg;
    o->total = t->total;
    o->num_pieces = n;
    o->pieces = (piece *)visc_cuda_alloc(ctx, sizeof(piece) * ((size_t)n + 1));
    if (!o->pieces || visc_cuda_upload(ctx, o->pieces, host, sizeof(piece) * (size_t)n)) {
        free(host);
        visc_cuda_optim_destroy(o);
        return NULL;
    }
    free(host);
    return o;
}

void visc_cuda_optim_destroy(visc_cuda_optim *o) {
    if (!o) return;
    visc_cuda_free(o->ctx, o->pieces);
    free(o);
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

__global__ void sgd_kernel(float *p, const float *g, float *buf, const piece *pieces,
                           sgd_scalars s) {
    const piece pc = pieces[blockIdx.x];
    const float wd = pc.weight_decay;
    for (int64_t i = pc.begin + threadIdx.x; i < pc.end; i += blockDim.x) {
        const float d = __fadd_rn(g[i], __fmul_rn(wd, p[i])); /* scale 1: exact */
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

int visc_cuda_optim_step(visc_cuda_optim *o, float *params, const float *grads, float *state,
                         float lr, int64_t step) {
    if (o->num_pieces == 0) return 0;
    const visc_opt_config *cfg = &o->cfg;
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
    sgd_kernel<<<o->num_pieces, 256, 0, o->ctx->stream>>>(params, grads, state, o->pieces, s);
    return visc_cuda_launched("sgd step");
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

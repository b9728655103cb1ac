/* resnet.c: ResNets in torchvision's layout and naming.
 *
 * ImageNet ResNets (He et al. 2015) as torchvision builds them: 7x7/2 stem,
 * 3x3/2 max-pool, four stages of basic or bottleneck blocks, stride on the
 * bottleneck's 3x3 conv (ResNet v1.5), 1x1 conv + BN projection shortcuts,
 * global average pool, linear head. Parameter names are torchvision's
 * state_dict keys, so checkpoints move between visc and PyTorch unchanged.
 *
 * CIFAR ResNets (resnet14/20/32/56: three stages of n basic blocks at
 * 16/32/64 channels, depth 6n+2) use the same blocks with projection
 * shortcuts (He et al.'s option B) and the small stem.
 *
 * small_stem replaces the stem by a 3x3/1 conv without max-pool, for 28-32 px
 * images. Every activation lives in one arena planned for cfg.batch.
 *
 * On a GPU (--device cuda) the same code runs: the arena is planned again
 * in device memory (resnet_to_cuda), and every layer call below goes to its
 * GPU twin (gpu.h) when m->cuda is set. Under --precision bf16 the twins
 * keep the activations as bf16 channels-last (r->act, gpu.h), planned at
 * half the bytes; only the batch is converted (into r->xh), and the
 * pooled features, logits and their gradients stay fp32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "visc/gpu.h"
#include "visc/model.h"
#include "visc/nn.h"
#include "visc/rng.h"

typedef struct {
    visc_conv2d op;
    int weight; /* index in params */
} conv_layer;

typedef struct {
    visc_batchnorm2d op;
    int gamma, beta; /* params */
    int mean, var;   /* buffers */
    float *save_mean, *save_rstd;
    char name[VISC_MAX_NAME];
} bn_layer;

/* Backward's four buffers for a run of blocks: the gradients at the
 * blocks' outputs and inputs (alternating) and two for their insides (the
 * first also holds a block's shortcut in forward). */
typedef struct {
    float *g0, *g1, *t1, *t2;
} scratch;

typedef struct {
    int bottleneck, has_down;
    conv_layer conv1, conv2, conv3, down_conv;
    bn_layer bn1, bn2, bn3, down_bn;
    /* activations: conv outputs (BN inputs), BN outputs, block output (the
     * shortcut's BN output is not kept: backward needs only its input dc).
     * b1 and b2 are kept only with cfg.keep_norm_outputs; by default they
     * are forward's temporaries in the block's scratch (t2), and backward
     * recomputes them (norm_output_again). */
    float *in, *c1, *b1, *c2, *b2, *c3, *dc, *out;
    size_t in_size, out_size;
    size_t start;       /* arena offset of out, where the block's memory begins */
    scratch scratch;    /* its run's set (plan_scratch) */
    int scratch_behind; /* the set lies in the blocks behind its run, not at the end */
} block;

typedef struct {
    conv_layer stem_conv;
    bn_layer stem_bn;
    int has_maxpool;
    visc_pool2d maxpool;
    int32_t *pool_argmax;
    block *blocks;
    int num_blocks;
    int fc_weight, fc_bias, feature_dim, final_hw;
    /* logits and features in the arena: m->logits and m->features on the
     * CPU; on a GPU those are host copies, downloaded by forward */
    float *x, *stem_c, *stem_b, *pooled_in, *features, *logits;
    /* on a GPU: the activations' form, and under bf16 the batch in it */
    visc_gpu_act act;
    float *xh;
    float *dlogits; /* on a GPU: the uploaded dlogits (NULL on the CPU) */
    /* backward scratch: in each block (plan_scratch) */
    float *dfeatures;
    bn_layer **bns;
    int num_bns;
    int trained; /* the last forward was a training one */
    visc_arena arena;
} resnet;

typedef struct {
    const char *name;
    int bottleneck, cifar;
    int layers[4];
} resnet_spec;

static const resnet_spec specs[] = {
    {"resnet18", 0, 0, {2, 2, 2, 2}},   {"resnet34", 0, 0, {3, 4, 6, 3}},
    {"resnet50", 1, 0, {3, 4, 6, 3}},   {"resnet101", 1, 0, {3, 4, 23, 3}},
    {"resnet152", 1, 0, {3, 8, 36, 3}}, {"resnet14", 0, 1, {2, 2, 2, 0}},
    {"resnet20", 0, 1, {3, 3, 3, 0}},   {"resnet32", 0, 1, {5, 5, 5, 0}},
    {"resnet56", 0, 1, {9, 9, 9, 0}},
};

/* ---- building: parameters ---- */

static void add_conv(visc_model *m, conv_layer *c, const char *name, int N, int C, int H, int K,
                     int kernel, int stride) {
    int64_t shape[4] = {K, C, kernel, kernel};
    char key[VISC_MAX_NAME + 16]; /* names are short; visc_table_add checks the length */
    snprintf(key, sizeof key, "%s.weight", name);
    c->weight = visc_table_add(&m->params, key, 4, shape, 0);
    /* a GPU's convolutions are cuDNN's: the shape is all it reads */
    (m->cfg.for_gpu ? visc_conv2d_init_shape : visc_conv2d_init)(&c->op, N, C, H, H, K, kernel,
                                                                 kernel, stride, kernel / 2, 1, 1,
                                                                 0);
}

static void add_bn(visc_model *m, resnet *r, bn_layer *b, const char *name, int N, int C, int HW,
                   int relu) {
    int64_t shape[1] = {C};
    char key[VISC_MAX_NAME + 16];
    snprintf(b->name, sizeof b->name, "%s", name);
    snprintf(key, sizeof key, "%s.weight", name);
    b->gamma = visc_table_add(&m->params, key, 1, shape, VISC_TENSOR_NO_DECAY | VISC_TENSOR_NORM);
    snprintf(key, sizeof key, "%s.bias", name);
    b->beta = visc_table_add(&m->params, key, 1, shape, VISC_TENSOR_NO_DECAY | VISC_TENSOR_NORM);
    snprintf(key, sizeof key, "%s.running_mean", name);
    b->mean = visc_table_add(&m->buffers, key, 1, shape, 0);
    snprintf(key, sizeof key, "%s.running_var", name);
    b->var = visc_table_add(&m->buffers, key, 1, shape, 0);
    visc_batchnorm2d_init(&b->op, N, C, HW, 1e-5f, 0.1f, relu);
    r->bns = visc_realloc(r->bns, (size_t)(r->num_bns + 1) * sizeof *r->bns, "resnet bn list");
    r->bns[r->num_bns++] = b;
}

/* Adds block `name` taking [N, C, H, H] to [N, planes * expansion, H/stride, ...]. */
static void add_block(visc_model *m, resnet *r, block *b, const char *name, int N, int C, int H,
                      int planes, int stride, int bottleneck) {
    char key[VISC_MAX_NAME];
    int expansion = bottleneck ? 4 : 1, out_c = planes * expansion, Ho = (H - 1) / stride + 1;
    b->bottleneck = bottleneck;
    b->has_down = stride != 1 || C != out_c;
#define SUB(s) (snprintf(key, sizeof key, "%s.%s", name, s), key)
    if (bottleneck) {
        add_conv(m, &b->conv1, SUB("conv1"), N, C, H, planes, 1, 1);
        add_bn(m, r, &b->bn1, SUB("bn1"), N, planes, H * H, 1);
        add_conv(m, &b->conv2, SUB("conv2"), N, planes, H, planes, 3, stride);
        add_bn(m, r, &b->bn2, SUB("bn2"), N, planes, Ho * Ho, 1);
        add_conv(m, &b->conv3, SUB("conv3"), N, planes, Ho, out_c, 1, 1);
        add_bn(m, r, &b->bn3, SUB("bn3"), N, out_c, Ho * Ho, 0);
    } else {
        add_conv(m, &b->conv1, SUB("conv1"), N, C, H, planes, 3, stride);
        add_bn(m, r, &b->bn1, SUB("bn1"), N, planes, Ho * Ho, 1);
        add_conv(m, &b->conv2, SUB("conv2"), N, planes, Ho, planes, 3, 1);
        add_bn(m, r, &b->bn2, SUB("bn2"), N, planes, Ho * Ho, 0);
    }
    if (b->has_down) {
        add_conv(m, &b->down_conv, SUB("downsample.0"), N, C, H, out_c, 1, stride);
        add_bn(m, r, &b->down_bn, SUB("downsample.1"), N, out_c, Ho * Ho, 0);
    }
#undef SUB
    b->in_size = (size_t)N * C * H * H;
    b->out_size = (size_t)N * out_c * Ho * Ho;
}

/* ---- building: activations, planned once (a counting pass, then the real one) ---- */

static size_t conv_out_size(const conv_layer *c) {
    return (size_t)c->op.N * c->op.K * c->op.P * c->op.Q;
}

static void take_bn_stats(visc_arena *a, bn_layer *b) {
    b->save_mean = visc_arena_floats(a, (size_t)b->op.C);
    b->save_rstd = visc_arena_floats(a, (size_t)b->op.C);
}

/* An activation of `count` values in the arena: fp32, or bf16 (half the
 * bytes) when the model keeps its activations so (r->act); the pointer is
 * a float * either way. */
static float *take_act(const resnet *r, visc_arena *a, size_t count) {
    return visc_arena_floats(a, r->act == VISC_GPU_BF16_NHWC ? (count + 1) / 2 : count);
}

/* A block's internals: its convolutions' outputs, and its norms' when
 * they are kept. */
static void plan_block(const resnet *r, visc_arena *a, block *b, int keep_norm_outputs) {
    b->c1 = take_act(r, a, conv_out_size(&b->conv1));
    if (keep_norm_outputs) b->b1 = take_act(r, a, conv_out_size(&b->conv1));
    b->c2 = take_act(r, a, conv_out_size(&b->conv2));
    if (b->bottleneck) {
        if (keep_norm_outputs) b->b2 = take_act(r, a, conv_out_size(&b->conv2));
        b->c3 = take_act(r, a, conv_out_size(&b->conv3));
    }
    if (b->has_down) b->dc = take_act(r, a, b->out_size);
}

/* Where forward puts what backward recomputes: the norms' outputs inside
 * each block, and the stem's before the max-pool (which reads it alone),
 * in the scratch's t2. That is free in forward: t2 lies past every
 * activation forward has written so far (plan_scratch), and backward
 * uses it only after the forward. */
static void place_recomputed(const visc_model *m, resnet *r) {
    if (m->cfg.keep_norm_outputs) return;
    for (int i = 0; i < r->num_blocks; i++) {
        block *b = &r->blocks[i];
        b->b1 = b->scratch.t2;
        if (b->bottleneck) b->b2 = b->scratch.t2;
    }
    if (r->has_maxpool) r->stem_b = r->blocks[0].scratch.t2;
}

/* The values of a block's largest activation (or gradient) for backward:
 * its input, output and convolutions' outputs; the first block's also the
 * stem's (the stem's backward runs in the first run's scratch). */
static size_t block_scratch_size(const resnet *r, int i) {
    const block *b = &r->blocks[i];
    size_t n = b->in_size > b->out_size ? b->in_size : b->out_size;
    const conv_layer *convs[3] = {&b->conv1, &b->conv2, b->bottleneck ? &b->conv3 : &b->conv1};
    for (int k = 0; k < 3; k++)
        if (conv_out_size(convs[k]) > n) n = conv_out_size(convs[k]);
    if (i == 0 && conv_out_size(&r->stem_conv) > n) n = conv_out_size(&r->stem_conv);
    return n;
}

static scratch take_scratch(const resnet *r, visc_arena *a, size_t count) {
    scratch s;
    s.g0 = take_act(r, a, count);
    s.g1 = take_act(r, a, count);
    s.t1 = take_act(r, a, count);
    s.t2 = take_act(r, a, count);
    return s;
}

/* Places backward's scratch. Blocks shrink toward the end of the network,
 * and backward runs from the end: when it reaches a run of blocks of one
 * size, every block behind the run (start[end_of_run + 1] up to
 * blocks_end: outputs, insides, statistics) is dead, and usually larger
 * than the run's four buffers. A run placed there takes the gradient it
 * starts from with one copy (trunk_backward); it must not overlap where
 * that gradient is (the scratch of the run behind it). The last run, and
 * any that does not fit, share one set at the arena's end. With every set
 * at the end, ResNet-50 kept four buffers of its largest activation
 * (1.5 GiB at batch 256 in bf16) next to all the activations. */
static void plan_scratch(resnet *r, visc_arena *a, size_t blocks_end) {
    const int B = r->num_blocks;
    size_t shared = 0;
    size_t behind_begin = SIZE_MAX; /* where the scratch of the run behind this one starts */
    for (int last = B - 1; last >= 0;) {
        int first = last;
        size_t size = block_scratch_size(r, last);
        while (first > 0 && block_scratch_size(r, first - 1) == size) first--;
        if (first == 0) size = block_scratch_size(r, 0); /* with the stem's */
        int placed = 0;
        if (last + 1 < B) {
            const size_t mark = a->used;
            a->used = r->blocks[last + 1].start;
            scratch s = take_scratch(r, a, size);
            placed = a->used <= blocks_end && a->used <= behind_begin;
            if (placed) {
                behind_begin = r->blocks[last + 1].start;
                for (int i = first; i <= last; i++) r->blocks[i].scratch = s;
            }
            a->used = mark;
        }
        for (int i = first; i <= last; i++) r->blocks[i].scratch_behind = placed;
        if (!placed) {
            behind_begin = SIZE_MAX; /* the set at the end lies past every block */
            if (size > shared) shared = size;
        }
        last = first - 1;
    }
    scratch s = take_scratch(r, a, shared);
    for (int i = 0; i < B; i++)
        if (!r->blocks[i].scratch_behind) r->blocks[i].scratch = s;
}

/* A forward-only model's block outputs and scratch (cfg.forward_only):
 * two outputs in turn, each block reading the other's (the first the
 * max-pool's output, in the second); the scratch of forward alone (t1,
 * t2), as large as the largest block's. */
static void plan_forward_only(resnet *r, visc_arena *a) {
    size_t out = 0, most = 0;
    for (int i = 0; i < r->num_blocks; i++) {
        if (r->blocks[i].out_size > out) out = r->blocks[i].out_size;
        if (block_scratch_size(r, i) > most) most = block_scratch_size(r, i);
    }
    float *turn[2] = {take_act(r, a, out), take_act(r, a, out)};
    scratch s = {NULL, NULL, take_act(r, a, most), take_act(r, a, most)};
    if (r->has_maxpool) {
        VISC_ASSERT(r->blocks[0].in_size <= out);
        r->pooled_in = r->blocks[0].in = turn[1];
    }
    for (int i = 0; i < r->num_blocks; i++) {
        r->blocks[i].out = turn[i % 2];
        if (i + 1 < r->num_blocks) r->blocks[i + 1].in = turn[i % 2];
        r->blocks[i].scratch = s;
    }
}

/* A forward-only model's stem output and max-pool positions: in the
 * blocks' region, dead once the first block starts. */
static void plan_stem_in_region(visc_model *m, resnet *r, visc_arena *a) {
    r->stem_c = take_act(r, a, conv_out_size(&r->stem_conv));
    if (r->has_maxpool)
        r->pool_argmax = visc_arena_take(a, (size_t)m->cfg.batch * r->maxpool.C * r->maxpool.P *
                                                r->maxpool.Q * sizeof(int32_t));
}

static void plan_activations(visc_model *m, resnet *r, visc_arena *a) {
    int N = m->cfg.batch;
    const size_t image = (size_t)N * m->cfg.in_channels * m->cfg.image_size * m->cfg.image_size;
    r->x = visc_arena_floats(a, image);
    m->input = r->x;
    r->xh = r->act == VISC_GPU_BF16_NHWC ? take_act(r, a, image) : NULL;
    size_t stem = conv_out_size(&r->stem_conv);
    const int keep = m->cfg.keep_norm_outputs, fwd_only = m->cfg.forward_only;
    /* forward alone: in the region below (plan_stem_in_region) */
    r->stem_c = fwd_only ? NULL : take_act(r, a, stem);
    /* the max-pool's input; without the max-pool the first block's */
    r->stem_b = keep || !r->has_maxpool ? take_act(r, a, stem) : NULL;
    take_bn_stats(a, &r->stem_bn);
    float *prev = r->stem_b;
    if (r->has_maxpool && !fwd_only) { /* forward alone: plan_forward_only */
        size_t pooled = (size_t)N * r->maxpool.C * r->maxpool.P * r->maxpool.Q;
        r->pooled_in = take_act(r, a, pooled);
        r->pool_argmax = visc_arena_take(a, pooled * sizeof(int32_t));
        prev = r->pooled_in;
    }
    const int one_inside = m->cfg.grad_checkpointing || fwd_only;
    for (int i = 0; i < r->num_blocks; i++) {
        block *b = &r->blocks[i];
        b->in = prev;
        b->start = (a->used + 63) & ~(size_t)63; /* where b->out lands */
        if (!fwd_only) b->out = take_act(r, a, b->out_size);
        take_bn_stats(a, &b->bn1);
        take_bn_stats(a, &b->bn2);
        if (b->bottleneck) take_bn_stats(a, &b->bn3);
        if (b->has_down) take_bn_stats(a, &b->down_bn);
        if (!one_inside) plan_block(r, a, b, keep);
        prev = b->out;
    }
    const size_t blocks_end = a->used;
    if (one_inside) {
        /* One region for every block's internals, as large as the largest
         * block needs: backward recomputes each block's before its own
         * backward (or there is no backward), so only the outputs above
         * are kept per block. */
        const size_t mark = a->used;
        size_t extent = 0;
        for (int i = 0; i < r->num_blocks; i++) {
            a->used = mark;
            plan_block(r, a, &r->blocks[i], keep);
            if (a->used - mark > extent) extent = a->used - mark;
        }
        if (fwd_only) {
            a->used = mark;
            plan_stem_in_region(m, r, a);
            if (a->used - mark > extent) extent = a->used - mark;
        }
        a->used = mark + extent;
    }
    r->features = visc_arena_floats(a, (size_t)N * r->feature_dim);
    r->dfeatures = visc_arena_floats(a, (size_t)N * r->feature_dim);
    r->logits = visc_arena_floats(a, (size_t)N * m->cfg.num_classes);
    /* recomputing blocks (--grad-checkpointing) rewrites the memory behind
     * a run: there every set is at the end */
    if (fwd_only) plan_forward_only(r, a);
    else plan_scratch(r, a, m->cfg.grad_checkpointing ? 0 : blocks_end);
    place_recomputed(m, r);
}

/* ---- initialization: torchvision's ---- */

/* Every residual branch's last BatchNorm weight to `scale` (model.h). */
static void scale_branches(visc_model *m, const resnet *r, float scale) {
    for (int i = 0; i < r->num_blocks; i++) {
        const block *b = &r->blocks[i];
        const bn_layer *last = b->bottleneck ? &b->bn3 : &b->bn2;
        float *gamma = visc_table_get(&m->params, last->gamma);
        for (int c = 0; c < last->op.C; c++) gamma[c] = scale;
    }
}

static void init_params(visc_model *m, resnet *r, uint64_t seed) {
    const visc_table *p = &m->params;
    for (int i = 0; i < p->count; i++) {
        const visc_tensor_entry *e = &p->entries[i];
        float *w = visc_table_get(p, i);
        visc_rng rng = visc_rng_make(seed, VISC_STREAM_INIT, (uint64_t)i);
        size_t len = strlen(e->name);
        if (e->flags & VISC_TENSOR_NORM) {
            /* BN: weight 1, bias 0 */
            float v = (len > 7 && strcmp(e->name + len - 7, ".weight") == 0) ? 1.0f : 0.0f;
            for (size_t j = 0; j < e->numel; j++) w[j] = v;
        } else if (e->ndim == 4) {
            /* kaiming_normal_(mode="fan_out", nonlinearity="relu") */
            double fan_out = (double)e->shape[0] * e->shape[2] * e->shape[3];
            float std = (float)sqrt(2.0 / fan_out);
            visc_rng_normal_fill(w, e->numel, std, &rng);
        } else {
            /* nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias */
            float bound = 1.0f / sqrtf((float)r->feature_dim);
            for (size_t j = 0; j < e->numel; j++)
                w[j] = bound * (2.0f * visc_rng_uniform(&rng) - 1.0f);
        }
    }
    if (m->cfg.zero_init_residual) scale_branches(m, r, 0.0f);
    for (int i = 0; i < r->num_bns; i++) {
        float *var = visc_table_get(&m->buffers, r->bns[i]->var);
        for (int c = 0; c < r->bns[i]->op.C; c++) var[c] = 1.0f;
    }
}

/* ---- forward ---- */

#define P(idx) visc_model_param(m, (idx))
#define G(idx) visc_model_grad(m, (idx))
#define B(idx) visc_model_buffer(m, (idx))

/* The activations' form on the GPU (unused on the CPU). */
static visc_gpu_act act_of(const visc_model *m) { return ((const resnet *)m->impl)->act; }

static void conv_fwd(visc_model *m, conv_layer *c, float *out, const float *in) {
    if (m->cuda) visc_gpu_conv2d_forward(m->cuda, &c->op, act_of(m), out, in, P(c->weight));
    else visc_conv2d_forward(&c->op, out, in, P(c->weight), NULL);
}

/* A forward's mode: the running statistics are updated in training, and
 * left alone when backward recomputes a block (--grad-checkpointing). */
enum { FWD_EVAL = 0, FWD_TRAIN = 1, FWD_RECOMPUTE = 2 };

static void bn_fwd(visc_model *m, bn_layer *b, float *out, const float *in, int mode) {
    float *run_mean = mode == FWD_TRAIN ? B(b->mean) : NULL;
    float *run_var = mode == FWD_TRAIN ? B(b->var) : NULL;
    if (mode != FWD_EVAL && m->cuda)
        visc_gpu_batchnorm2d_forward_train(m->cuda, &b->op, act_of(m), out, b->save_mean,
                                           b->save_rstd, in, P(b->gamma), P(b->beta), run_mean,
                                           run_var);
    else if (mode != FWD_EVAL)
        visc_batchnorm2d_forward_train(&b->op, out, b->save_mean, b->save_rstd, in, P(b->gamma),
                                       P(b->beta), run_mean, run_var);
    else if (m->cuda)
        visc_gpu_batchnorm2d_forward_eval(m->cuda, &b->op, act_of(m), out, in, P(b->gamma),
                                          P(b->beta), B(b->mean), B(b->var));
    else
        visc_batchnorm2d_forward_eval(&b->op, out, in, P(b->gamma), P(b->beta), B(b->mean),
                                      B(b->var));
}

/* out = relu(bn(in) + identity): a block's last norm and its residual sum
 * (on a GPU in the norm's output pass, with the bits of the two passes) */
static void bn_add_relu_fwd(visc_model *m, bn_layer *b, float *out, const float *in,
                            const float *identity, size_t n, int mode) {
    if (m->cuda && mode == FWD_EVAL) {
        visc_gpu_batchnorm2d_forward_eval_add_relu(m->cuda, &b->op, act_of(m), out, in, identity,
                                                   P(b->gamma), P(b->beta), B(b->mean), B(b->var));
        return;
    }
    if (m->cuda) {
        visc_gpu_batchnorm2d_forward_train_add_relu(m->cuda, &b->op, act_of(m), out, b->save_mean,
                                                    b->save_rstd, in, identity, P(b->gamma),
                                                    P(b->beta),
                                                    mode == FWD_TRAIN ? B(b->mean) : NULL,
                                                    mode == FWD_TRAIN ? B(b->var) : NULL);
        return;
    }
    bn_fwd(m, b, out, in, mode);
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float v = out[i] + identity[i];
        out[i] = v > 0.0f ? v : 0.0f;
    }
}

/* out = relu(bn(in) + sc(sc_in)): a downsampling block's end, whose
 * identity is its shortcut norm sc's output. On a GPU (a process alone) sc
 * is applied in the end's pass, its output neither written nor read back
 * (its statistics first, in training); on the CPU and under SyncBN it goes
 * through `spare`, written and added. The same bits either way. */
static void bn_add_norm_relu_fwd(visc_model *m, bn_layer *b, float *out, const float *in,
                                 bn_layer *sc, const float *sc_in, float *spare, size_t n,
                                 int mode) {
    if (!m->cuda) {
        bn_fwd(m, sc, spare, sc_in, mode);
        bn_add_relu_fwd(m, b, out, in, spare, n, mode);
        return;
    }
    float *run_mean = mode == FWD_TRAIN ? B(b->mean) : NULL;
    float *run_var = mode == FWD_TRAIN ? B(b->var) : NULL;
    const visc_gpu_bn_args d = {&sc->op,
                                sc_in,
                                sc->save_mean,
                                sc->save_rstd,
                                P(sc->gamma),
                                P(sc->beta),
                                mode == FWD_TRAIN || mode == FWD_EVAL ? B(sc->mean) : NULL,
                                mode == FWD_TRAIN || mode == FWD_EVAL ? B(sc->var) : NULL};
    if (mode == FWD_EVAL) {
        visc_gpu_batchnorm2d_forward_eval_add_norm_relu(m->cuda, &b->op, act_of(m), out, in,
                                                        P(b->gamma), P(b->beta), B(b->mean),
                                                        B(b->var), &d);
        return;
    }
    visc_gpu_batchnorm2d_forward_train_add_norm_relu(m->cuda, &b->op, act_of(m), out, b->save_mean,
                                                     b->save_rstd, in, P(b->gamma), P(b->beta),
                                                     run_mean, run_var, &d, spare);
}

static void block_forward(visc_model *m, block *b, int mode) {
    conv_fwd(m, &b->conv1, b->c1, b->in);
    bn_fwd(m, &b->bn1, b->b1, b->c1, mode);
    conv_fwd(m, &b->conv2, b->c2, b->b1);
    bn_layer *last = &b->bn2;
    const float *last_in = b->c2;
    if (b->bottleneck) {
        bn_fwd(m, &b->bn2, b->b2, b->c2, mode);
        conv_fwd(m, &b->conv3, b->c3, b->b2);
        last = &b->bn3, last_in = b->c3;
    }
    if (!b->has_down) {
        bn_add_relu_fwd(m, last, b->out, last_in, b->in, b->out_size, mode);
        return;
    }
    /* the shortcut's norm output through backward's scratch where it is
     * written (free in forward, and where backward recomputes a block,
     * between two blocks' backward) */
    conv_fwd(m, &b->down_conv, b->dc, b->in);
    bn_add_norm_relu_fwd(m, last, b->out, last_in, &b->down_bn, b->dc, b->scratch.t1, b->out_size,
                         mode);
}

static void maxpool_fwd(visc_model *m, resnet *r) {
    if (m->cuda)
        visc_gpu_maxpool2d_forward(m->cuda, &r->maxpool, r->act, r->pooled_in, r->pool_argmax,
                                   r->stem_b);
    else visc_maxpool2d_forward(&r->maxpool, r->pooled_in, r->pool_argmax, r->stem_b);
}

static void head_fwd(visc_model *m, resnet *r, const float *trunk_out) {
    const int N = m->cfg.batch, C = r->feature_dim, K = m->cfg.num_classes;
    if (m->cuda)
        visc_gpu_global_avgpool_forward(m->cuda, r->act, r->features, trunk_out, N, C, r->final_hw);
    else visc_global_avgpool_forward(r->features, trunk_out, N, C, r->final_hw);
    md_linear_forward(m, r->logits, r->features, P(r->fc_weight), P(r->fc_bias), N, C, K);
    /* the host's copies: the loss, the accuracy and SSL heads read them */
    md_give_out(m, m->logits, &m->dev_logits, r->logits, (size_t)N * K);
    md_give_out(m, m->features, &m->dev_features, r->features, (size_t)N * C);
}

/* The batch as the stem reads it: r->x, or on a GPU with bf16 activations
 * its channels-last bf16 copy (made by forward, read again by backward). */
static const float *stem_input(visc_model *m, resnet *r) {
    if (!m->cuda || r->act != VISC_GPU_BF16_NHWC) return r->x;
    visc_gpu_to_nhwc_bf16(m->cuda, r->xh, r->x, m->cfg.batch, m->cfg.in_channels,
                          m->cfg.image_size * m->cfg.image_size);
    return r->xh;
}

static void resnet_forward(visc_model *m, const float *x, int train) {
    VISC_ASSERT(m->cuda || !m->cfg.for_gpu);
    resnet *r = m->impl;
    md_take_batch(m, r->x, x,
                  (size_t)m->cfg.batch * m->cfg.in_channels * m->cfg.image_size *
                      m->cfg.image_size);
    conv_fwd(m, &r->stem_conv, r->stem_c, stem_input(m, r));
    const int mode = train ? FWD_TRAIN : FWD_EVAL;
    r->trained = train;
    bn_fwd(m, &r->stem_bn, r->stem_b, r->stem_c, mode);
    if (r->has_maxpool) maxpool_fwd(m, r);
    for (int i = 0; i < r->num_blocks; i++) block_forward(m, &r->blocks[i], mode);
    head_fwd(m, r, r->blocks[r->num_blocks - 1].out);
    if (train) m->bn_updates++;
}

/* ---- backward ---- */

static void conv_bwd(visc_model *m, conv_layer *c, float *din, const float *dout, const float *in) {
    if (m->cuda)
        visc_gpu_conv2d_backward(m->cuda, &c->op, act_of(m), din, G(c->weight), dout, in,
                                 P(c->weight));
    else visc_conv2d_backward(&c->op, din, G(c->weight), NULL, dout, in, P(c->weight));
    visc_model_grad_ready(m, G(c->weight), m->params.entries[c->weight].numel);
}

static void bn_bwd(visc_model *m, bn_layer *b, float *din, const float *dout, const float *in,
                   const float *out) {
    if (m->cuda)
        visc_gpu_batchnorm2d_backward(m->cuda, &b->op, act_of(m), din, G(b->gamma), G(b->beta),
                                      dout, in, out, P(b->gamma), P(b->beta), b->save_mean,
                                      b->save_rstd);
    else
        visc_batchnorm2d_backward(&b->op, din, G(b->gamma), G(b->beta), dout, in, out, P(b->gamma),
                                  b->save_mean, b->save_rstd);
    visc_model_grad_ready(m, G(b->gamma), m->params.entries[b->gamma].numel);
    visc_model_grad_ready(m, G(b->beta), m->params.entries[b->beta].numel);
}

/* dst = src, n activation values in their form */
static void act_copy(visc_model *m, float *dst, const float *src, size_t n) {
    md_copy(m, dst, src, act_of(m) == VISC_GPU_BF16_NHWC ? (n + 1) / 2 : n);
}

/* out = a + b and ReLU's backward, on the activations in their form */
static void act_add(visc_model *m, float *out, const float *a, const float *b, size_t n) {
    if (m->cuda) visc_gpu_cnn_add(m->cuda, act_of(m), out, a, b, n);
    else visc_add_forward(out, a, b, n);
}

static void act_relu_backward(visc_model *m, float *din, const float *dout, const float *out,
                              size_t n) {
    if (m->cuda) visc_gpu_cnn_relu_backward(m->cuda, act_of(m), din, dout, out, n);
    else visc_relu_backward(din, dout, out, n);
}

/* din = a + b, the two paths of a block's input gradient joined; with
 * relu_out (the ReLU's output that was that input) also through the
 * ReLU, in the same pass: the bits of the two passes, one read and write
 * of the tensor fewer. */
static void act_join(visc_model *m, float *din, const float *a, const float *b,
                     const float *relu_out, size_t n) {
    if (!relu_out) act_add(m, din, a, b, n);
    else if (m->cuda) visc_gpu_cnn_add_relu_backward(m->cuda, act_of(m), din, a, b, relu_out, n);
    else visc_add_relu_backward(din, a, b, relu_out, n);
}

/* The output of norm b (with its ReLU) that forward computed from `in`,
 * for backward: the kept one, or by default the same bits again in
 * `spare` (visc_batchnorm2d_apply from the saved statistics after a
 * training forward, the evaluation form after an evaluation one). */
static const float *norm_output_again(visc_model *m, resnet *r, bn_layer *b, const float *kept,
                                      float *spare, const float *in) {
    if (m->cfg.keep_norm_outputs) return kept;
    if (!r->trained) bn_fwd(m, b, spare, in, FWD_EVAL);
    else if (m->cuda)
        visc_gpu_batchnorm2d_apply(m->cuda, &b->op, act_of(m), spare, in, P(b->gamma), P(b->beta),
                                   b->save_mean, b->save_rstd);
    else
        visc_batchnorm2d_apply(&b->op, spare, in, P(b->gamma), P(b->beta), b->save_mean,
                               b->save_rstd);
    return spare;
}

/* dout: gradient w.r.t. the block output (modified in place), already
 * through the block's final ReLU when out_masked; writes the gradient
 * w.r.t. the block input to din (din != dout), through the ReLU whose
 * output the input was when in_relu_out (the previous block's output) is
 * given. Until its last step din is free, and holds the norms' outputs
 * recomputed. */
static void block_backward(visc_model *m, resnet *r, block *b, float *din, float *dout,
                           int out_masked, const float *in_relu_out) {
    /* through the final relu: its output is b->out */
    if (!out_masked) act_relu_backward(m, dout, dout, b->out, b->out_size);
    float *t1 = b->scratch.t1, *t2 = b->scratch.t2;
    const float *b1;
    if (b->bottleneck) {
        bn_bwd(m, &b->bn3, t1, dout, b->c3, NULL);
        const float *b2 = norm_output_again(m, r, &b->bn2, b->b2, din, b->c2);
        conv_bwd(m, &b->conv3, t2, t1, b2);
        bn_bwd(m, &b->bn2, t2, t2, b->c2, b2);
        b1 = norm_output_again(m, r, &b->bn1, b->b1, din, b->c1);
        conv_bwd(m, &b->conv2, t1, t2, b1);
    } else {
        bn_bwd(m, &b->bn2, t1, dout, b->c2, NULL);
        b1 = norm_output_again(m, r, &b->bn1, b->b1, din, b->c1);
        conv_bwd(m, &b->conv2, t2, t1, b1);
        float *swap = t1;
        t1 = t2;
        t2 = swap;
    }
    /* t1 = gradient w.r.t. bn1's output */
    bn_bwd(m, &b->bn1, t1, t1, b->c1, b1);
    conv_bwd(m, &b->conv1, t2, t1, b->in);
    /* t2 = main path's gradient w.r.t. the block input; add the shortcut's */
    if (b->has_down) {
        bn_bwd(m, &b->down_bn, t1, dout, b->dc, NULL);
        conv_bwd(m, &b->down_conv, din, t1, b->in);
        act_join(m, din, din, t2, in_relu_out, b->in_size);
    } else {
        act_join(m, din, dout, t2, in_relu_out, b->in_size);
    }
}

/* The classifier's gradients from dlogits (NULL: zero); dfeatures (may be
 * NULL) receives the gradient it sends back into the backbone. */
static void fc_backward(visc_model *m, resnet *r, float *dfeatures, const float *dlogits) {
    const int N = m->cfg.batch, C = r->feature_dim, K = m->cfg.num_classes;
    dlogits = md_from_host(m, r->dlogits, dlogits, (size_t)N * K);
    if (dlogits) {
        md_linear_backward(m, dfeatures, G(r->fc_weight), G(r->fc_bias), dlogits, r->features,
                           P(r->fc_weight), N, C, K);
    } else {
        visc_model_zero_grad(m, r->fc_weight);
        visc_model_zero_grad(m, r->fc_bias);
    }
    visc_model_grad_ready(m, G(r->fc_weight), m->params.entries[r->fc_weight].numel);
    visc_model_grad_ready(m, G(r->fc_bias), m->params.entries[r->fc_bias].numel);
}

/* From r->dfeatures (the gradient at the pooled features) to the input. */
static void trunk_backward(visc_model *m, resnet *r) {
    int N = m->cfg.batch;
    const scratch *s = &r->blocks[r->num_blocks - 1].scratch;
    float *dout = s->g0, *din = s->g1;
    if (m->cuda)
        visc_gpu_global_avgpool_backward(m->cuda, r->act, dout, r->dfeatures, N, r->feature_dim,
                                         r->final_hw);
    else visc_global_avgpool_backward(dout, r->dfeatures, N, r->feature_dim, r->final_hw);
    for (int i = r->num_blocks - 1; i >= 0; i--) {
        /* --grad-checkpointing: the block's internals again from its kept
         * input, the running statistics untouched (the last block's are
         * still there) */
        if (m->cfg.grad_checkpointing && i < r->num_blocks - 1)
            block_forward(m, &r->blocks[i], r->trained ? FWD_RECOMPUTE : FWD_EVAL);
        if (r->blocks[i].scratch.g0 != s->g0) {
            /* a run of larger blocks, its scratch in the blocks behind it */
            s = &r->blocks[i].scratch;
            act_copy(m, s->g0, dout, r->blocks[i].out_size);
            dout = s->g0, din = s->g1;
        }
        /* each block's input gradient leaves through the previous
         * block's final ReLU (the first's: the stem's, in its norm's
         * backward); the last block's output gradient comes from the
         * pooling, not yet through its ReLU */
        const int out_masked = i < r->num_blocks - 1;
        const float *in_relu_out = i > 0 ? r->blocks[i - 1].out : NULL;
        block_backward(m, r, &r->blocks[i], din, dout, out_masked, in_relu_out);
        float *swap = dout;
        dout = din;
        din = swap;
    }
    /* dout now holds the gradient w.r.t. the first block's input */
    const float *stem_out = r->stem_b;
    if (r->has_maxpool) {
        if (m->cuda)
            visc_gpu_maxpool2d_backward(m->cuda, &r->maxpool, r->act, din, dout, r->pool_argmax);
        else visc_maxpool2d_backward(&r->maxpool, din, dout, r->pool_argmax);
        /* the stem norm's output again, where the first block's input
         * gradient was: only its ReLU's mask is read, which the GPU's
         * backward may make again from the statistics instead */
        stem_out = m->cuda && !visc_gpu_batchnorm2d_reads_output(&r->stem_bn.op)
                       ? NULL
                       : norm_output_again(m, r, &r->stem_bn, r->stem_b, dout, r->stem_c);
        dout = din;
    }
    bn_bwd(m, &r->stem_bn, dout, dout, r->stem_c, stem_out);
    conv_bwd(m, &r->stem_conv, NULL, dout, r->xh ? r->xh : r->x);
}

static void resnet_backward(visc_model *m, const float *dlogits) {
    resnet *r = m->impl;
    fc_backward(m, r, r->dfeatures, dlogits);
    trunk_backward(m, r);
}

static void resnet_backward_features(visc_model *m, const float *dfeatures, const float *dlogits) {
    resnet *r = m->impl;
    fc_backward(m, r, NULL, dlogits);
    md_take_in(m, r->dfeatures, dfeatures, (size_t)m->cfg.batch * r->feature_dim);
    trunk_backward(m, r);
}

static void resnet_set_bn_sync(visc_model *m, visc_bn_sync_fn fn, void *ctx) {
    resnet *r = m->impl;
    for (int i = 0; i < r->num_bns; i++) visc_batchnorm2d_set_sync(&r->bns[i]->op, fn, ctx);
}

int visc_resnet_scale_branches(visc_model *m, float scale) {
    if (m->forward != resnet_forward)
        return visc_set_error("%s: residual branches are a ResNet's", m->cfg.arch);
    scale_branches(m, m->impl, scale);
    return 0;
}

/* ---- lifetime ---- */

static void free_conv(conv_layer *c) { visc_conv2d_destroy(&c->op); }
static void free_bn(bn_layer *b) { visc_batchnorm2d_destroy(&b->op); }

static void plan(visc_model *m, visc_arena *a) { plan_activations(m, m->impl, a); }

/* Every activation pointer moves to device memory (gpu.h). */
static int resnet_to_cuda(visc_model *m) {
    resnet *r = m->impl;
    r->act = visc_gpu_cnn_act(m->cuda);
    return visc_gpu_arena_move(m, &r->arena, plan, &r->dlogits);
}

static void resnet_destroy(visc_model *m) {
    resnet *r = m->impl;
    free_conv(&r->stem_conv);
    free_bn(&r->stem_bn);
    if (r->has_maxpool) visc_pool2d_destroy(&r->maxpool);
    for (int i = 0; i < r->num_blocks; i++) {
        block *b = &r->blocks[i];
        free_conv(&b->conv1);
        free_conv(&b->conv2);
        free_bn(&b->bn1);
        free_bn(&b->bn2);
        if (b->bottleneck) {
            free_conv(&b->conv3);
            free_bn(&b->bn3);
        }
        if (b->has_down) {
            free_conv(&b->down_conv);
            free_bn(&b->down_bn);
        }
    }
    free(r->blocks);
    free(r->bns);
    free(m->bn_names);
    md_free_storage(m, &r->arena, r->dlogits);
    free(r);
    free(m);
}

static double model_flops(const resnet *r, int N, int fc_out) {
    double f = visc_conv2d_flops(&r->stem_conv.op);
    for (int i = 0; i < r->num_blocks; i++) {
        const block *b = &r->blocks[i];
        f += visc_conv2d_flops(&b->conv1.op) + visc_conv2d_flops(&b->conv2.op);
        if (b->bottleneck) f += visc_conv2d_flops(&b->conv3.op);
        if (b->has_down) f += visc_conv2d_flops(&b->down_conv.op);
    }
    f += 2.0 * N * (double)r->feature_dim * fc_out;
    return f / N;
}

visc_model *visc_resnet_create(const visc_model_config *cfg, uint64_t seed) {
    const resnet_spec *spec = NULL;
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++)
        if (strcmp(specs[i].name, cfg->arch) == 0) spec = &specs[i];
    if (!spec) {
        visc_set_error("unknown ResNet architecture '%s'", cfg->arch);
        return NULL;
    }
    int N = cfg->batch, S = cfg->image_size;
    int small = cfg->small_stem || spec->cifar;
    int min_size = small ? (spec->cifar ? 4 : 8) : 32;
    if (N < 1 || cfg->num_classes < 1 || cfg->in_channels < 1 || S < min_size) {
        visc_set_error("%s needs batch >= 1, classes >= 1, channels >= 1 and images of at least %d "
                       "px "
                       "(got batch %d, %d classes, %d channels, %d px)",
                       cfg->arch, min_size, N, cfg->num_classes, cfg->in_channels, S);
        return NULL;
    }
    visc_model *m = visc_calloc(1, sizeof *m, "model");
    resnet *r = visc_calloc(1, sizeof *r, "resnet");
    m->cfg = *cfg;
    m->cfg.small_stem = small;
    m->impl = r;
    visc_table_init(&m->params);
    visc_table_init(&m->buffers);

    int base = cfg->width > 0 ? cfg->width : (spec->cifar ? 16 : 64);
    int stem_k = small ? 3 : 7, stem_s = small ? 1 : 2;
    add_conv(m, &r->stem_conv, "conv1", N, cfg->in_channels, S, base, stem_k, stem_s);
    int H = r->stem_conv.op.P;
    add_bn(m, r, &r->stem_bn, "bn1", N, base, H * H, 1);
    r->has_maxpool = !small;
    if (r->has_maxpool) {
        visc_pool2d_init(&r->maxpool, N, base, H, H, 3, 2, 1);
        H = r->maxpool.P;
    }
    int stages = spec->cifar ? 3 : 4;
    for (int s = 0; s < stages; s++) r->num_blocks += spec->layers[s];
    r->blocks = visc_calloc((size_t)r->num_blocks, sizeof *r->blocks, "resnet blocks");
    int C = base, bi = 0, expansion = spec->bottleneck ? 4 : 1;
    for (int s = 0; s < stages; s++) {
        int planes = base << s;
        for (int j = 0; j < spec->layers[s]; j++) {
            char name[64];
            snprintf(name, sizeof name, "layer%d.%d", s + 1, j);
            int stride = (j == 0 && s > 0) ? 2 : 1;
            add_block(m, r, &r->blocks[bi++], name, N, C, H, planes, stride, spec->bottleneck);
            H = (H - 1) / stride + 1;
            C = planes * expansion;
        }
    }
    r->feature_dim = C;
    r->final_hw = H * H;
    int64_t fcw[2] = {cfg->num_classes, C}, fcb[1] = {cfg->num_classes};
    r->fc_weight = visc_table_add(&m->params, "fc.weight", 2, fcw, 0);
    r->fc_bias =
        visc_table_add(&m->params, "fc.bias", 1, fcb, VISC_TENSOR_NO_DECAY | VISC_TENSOR_BIAS);
    visc_table_alloc(&m->params);
    visc_table_alloc(&m->buffers);
    m->grads = visc_alloc_aligned(m->params.total * sizeof(float), "gradients");

    visc_arena plan;
    visc_arena_init(&plan, 0);
    plan_activations(m, r, &plan);
    visc_arena_init(&r->arena, cfg->for_gpu ? 0 : plan.used); /* model.h: for_gpu */
    plan_activations(m, r, &r->arena);
    m->activation_bytes = plan.used;

    init_params(m, r, seed);
    m->num_bn = r->num_bns;
    m->bn_names = visc_malloc((size_t)r->num_bns * sizeof *m->bn_names, "bn names");
    for (int i = 0; i < r->num_bns; i++) m->bn_names[i] = r->bns[i]->name;
    m->flops_per_image = model_flops(r, N, cfg->num_classes);
    m->forward = resnet_forward;
    m->backward = resnet_backward;
    m->backward_features = resnet_backward_features;
    m->logits = r->logits;
    m->features = r->features;
    m->feature_dim = r->feature_dim;
    m->to_cuda = resnet_to_cuda;
    m->head_prefix = "fc.";
    m->set_bn_sync = resnet_set_bn_sync;
    m->destroy = resnet_destroy;
    return m;
}

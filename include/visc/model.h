/* model.h: the model interface and the registry of architectures.
 *
 * A model owns its parameters (one flat buffer + name table with
 * torchvision/timm state_dict keys), their gradients (same layout), its
 * non-trained buffers (BatchNorm running statistics) and an activation arena
 * planned once for a fixed batch size. It knows nothing of data or training.
 *
 * Use:  m = visc_model_create(&cfg, seed);
 *       m->forward(m, x, 1);            // logits in m->logits [batch, classes]
 *       m->backward(m, dlogits);        // gradients in m->grads
 * Smaller batches than cfg.batch are run by the caller padding the batch. */
#ifndef VISC_MODEL_H
#define VISC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

typedef struct {
    char arch[64]; /* "resnet18", "resnet50", ... */
    int num_classes;
    int in_channels;
    int image_size;         /* square input height = width */
    int batch;              /* the batch size the activations are planned for */
    int small_stem;         /* 3x3 stride-1 stem conv, no max-pool (28-32 px data) */
    int zero_init_residual; /* last BN gamma of each residual branch starts at 0 */
    int width;              /* base width override (0: the architecture's own, 64 for ResNets) */
    /* Regularization inside the model (transformers; 0 = off). Drop-path
     * rates grow linearly with depth up to drop_path, as timm's. */
    float drop_rate;      /* dropout before the classifier head (timm 0.9's drop_rate) */
    float drop_path_rate; /* stochastic depth at the last block */
    /* Activation recomputation (timm's --grad-checkpointing): forward keeps
     * only each block's output; backward runs each block's forward again
     * (with the same noise) before its backward. Less memory, about a third
     * more compute, the same gradients bit for bit. */
    int grad_checkpointing;
    /* ResNets recompute the outputs of the norms inside a block in
     * backward, from the norm's input and saved statistics (one pass, the
     * same bits), rather than keeping them: a quarter of a block's
     * activations (a sixth of a bottleneck's). 1 keeps them instead. */
    int keep_norm_outputs;
    /* The model only ever runs forward (MoCo's momentum encoder): its
     * activations are planned for one forward at a time, not kept for a
     * backward, which is then refused. ResNets keep two block outputs in
     * turn and one block's insides; the transformers each block's output
     * and one block's insides, as --grad-checkpointing plans them. */
    int forward_only;
    /* The model moves to a GPU (visc_model_to_gpu) before it ever runs: its
     * activations are planned on the host, not allocated there (ResNet-50
     * at batch 256 would fill 17 GiB of host memory only to free it); a
     * forward on the host before the move is a bug, and asserted. */
    int for_gpu;
} visc_model_config;

typedef struct visc_model visc_model;
typedef struct visc_cuda visc_cuda; /* a GPU (cuda.h, gpu.h) */
struct visc_model {
    visc_model_config cfg;
    visc_table params;  /* trainable, state_dict names */
    visc_table buffers; /* running_mean / running_var, state_dict names */
    float *grads;       /* params.total floats, laid out as params */
    int64_t bn_updates; /* num_batches_tracked of every BatchNorm (they are all equal) */
    float *logits;      /* [batch, num_classes], valid after forward */
    /* Seed of this step's dropout / drop-path masks: the trainer sets it
     * before every training forward (from the run seed and the step), so
     * masks are reproducible and a resumed run draws the same ones. */
    uint64_t noise_seed;
    double flops_per_image; /* forward FLOPs (2 x multiply-adds) of one image */
    size_t
        activation_bytes; /* the activation arena, as planned for cfg.batch (on the GPU: there) */
    /* BatchNorm layer names ("layer1.0.bn1"): checkpoints write each one's
     * num_batches_tracked (= bn_updates) as torchvision's state_dict has it. */
    const char **bn_names;
    int num_bn;

    /* Optional, set by a data-parallel trainer: backward calls it as each
     * parameter's gradient becomes final (grad..grad+count covers whole
     * tensors), so their all-reduce starts while backward goes on. */
    void (*grad_ready)(void *ctx, const float *grad, size_t count);
    void *grad_ready_ctx;

    /* The backbone's output: the pooled features the classifier reads,
     * [batch, feature_dim], valid after forward (self-supervised heads and
     * kNN evaluation work on these). */
    float *features;
    int feature_dim;
    /* The classifier's state_dict prefix ("fc." for torchvision ResNets,
     * "head." / "head.fc." for timm): what a backbone checkpoint may lack
     * and what a new task replaces. */
    const char *head_prefix;
    /* Backward from the features: dfeatures [batch, feature_dim] is the
     * gradient reaching the backbone's output. The classifier's own
     * gradients come from dlogits (NULL: zero) and do not flow into the
     * backbone: a classifier on detached features (SSL's online
     * classifier, a linear probe). */
    void (*backward_features)(visc_model *m, const float *dfeatures, const float *dlogits);
    /* Models with BatchNorm: synchronizes every BN layer's statistics over
     * the processes through fn (nn.h, visc_bn_sync_fn); NULL otherwise. */
    void (*set_bn_sync)(visc_model *m, void (*fn)(void *ctx, double *buf, int n), void *ctx);

    void (*forward)(visc_model *m, const float *x, int train);
    void (*backward)(visc_model *m, const float *dlogits);
    void (*destroy)(visc_model *m);
    void *impl;

    /* On a GPU (gpu.h, visc_model_to_gpu): its context and device copies of
     * the parameters, gradients and buffers, laid out as the host tables;
     * NULL while the model is on the CPU. forward still takes the batch
     * from the host and leaves logits and features there; backward takes
     * dlogits (dfeatures) from the host. */
    visc_cuda *cuda;
    float *dev_params, *dev_grads, *dev_buffers;
    /* Set by a caller that keeps its batch and its loss on the GPU (the
     * trainer's steps there, bench_train): forward's x and
     * backward's dlogits (dfeatures) are then device pointers, and forward
     * leaves logits and features on the device only (nothing crosses the
     * bus). Either way forward points these at the device's copies. */
    int io_on_device;
    /* The arena's batch buffer [batch, C, H, W], where the model is (device
     * memory once on a GPU): forward copies x here unless x is it. */
    float *input;
    const float *dev_logits, *dev_features;
    /* The architecture's GPU path: moves its activations to m->cuda (the
     * device copies are made already); NULL where there is none yet. */
    int (*to_cuda)(visc_model *m);
};

/* Tensor `index` of the parameters, their gradients, the buffers: where
 * the model computes with them (the GPU's copies when it is there). */
static inline float *visc_model_param(const visc_model *m, int index) {
    return (m->cuda ? m->dev_params : m->params.data) + m->params.entries[index].offset;
}
static inline float *visc_model_grad(const visc_model *m, int index) {
    return (m->cuda ? m->dev_grads : m->grads) + m->params.entries[index].offset;
}
static inline float *visc_model_buffer(const visc_model *m, int index) {
    return (m->cuda ? m->dev_buffers : m->buffers.data) + m->buffers.entries[index].offset;
}

static inline void visc_model_grad_ready(const visc_model *m, const float *grad, size_t count) {
    if (m->grad_ready) m->grad_ready(m->grad_ready_ctx, grad, count);
}

/* On the GPU (src/gpu/model.c). */
void visc_model_zero_grad_gpu(visc_model *m, int index);
/* Zeroes the gradient of parameter tensor `index`. */
static inline void visc_model_zero_grad(visc_model *m, int index) {
    const visc_tensor_entry *e = &m->params.entries[index];
    if (m->cuda) visc_model_zero_grad_gpu(m, index);
    else
        for (size_t i = 0; i < e->numel; i++) m->grads[e->offset + i] = 0.0f;
}

/* Creates and initializes (torchvision's init, drawn from `seed`) a model;
 * NULL with visc_last_error() set for an unknown architecture or bad config. */
visc_model *visc_model_create(const visc_model_config *cfg, uint64_t seed);
void visc_model_destroy(visc_model *m);
/* NULL-terminated list of architecture names. */
const char *const *visc_model_names(void);

/* models/resnet.c */
visc_model *visc_resnet_create(const visc_model_config *cfg, uint64_t seed);
/* Sets the weight of every residual branch's last BatchNorm (bn3 of a
 * bottleneck, bn2 of a basic block) to `scale`, on the host. 0 is
 * --zero-init-residual (torchvision's zero_init_residual, timm's
 * zero_init_last); a small scale leaves every branch its gradient and
 * tames a deep ResNet's sensitivity at its initialization
 * (tools/diag/grad_sensitivity.c measures it). -1 with the error for a
 * model that is not a ResNet. */
int visc_resnet_scale_branches(visc_model *m, float scale);
/* models/vit.c (vit_*, deit_*), models/cait.c (cait_*), models/swin.c
 * (swin_*, swinv2_*): each adds its names to the registry when it lands. */
visc_model *visc_vit_create(const visc_model_config *cfg, uint64_t seed);
visc_model *visc_cait_create(const visc_model_config *cfg, uint64_t seed);
visc_model *visc_swin_create(const visc_model_config *cfg, uint64_t seed);
/* Fits a checkpoint's pos_embed (shape [1, tokens, C] of the file) to the
 * model's grid by bicubic resampling (timm's resample_abs_pos_embed); for a
 * loader meeting a pos_embed whose grid differs from the model's. */
int visc_pos_embed_adapt(const visc_model *m, float *dst, const float *src, int ndim,
                         const int64_t *shape);

#endif

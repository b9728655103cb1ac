/* nn.h: layers, each with an explicit forward and backward.
 *
 * Conventions (all layers):
 * - Activations are NCHW fp32 (PyTorch's layout), parameters are laid out
 *   exactly as PyTorch's (conv weight [K, C/groups, R, S], linear weight
 *   [out, in]).
 * - Backward OVERWRITES its outputs (din, dweight, dbias). A NULL din means
 *   "not needed" (first layer). Parameter gradients are never accumulated by
 *   a layer; gradient accumulation over micro-batches is the trainer's job.
 * - A layer that needs state across calls (cached oneDNN primitives) has a
 *   descriptor struct made by *_init for one fixed shape and freed by
 *   *_destroy. Nothing allocates inside forward/backward after the first
 *   call with a given descriptor.
 * - Flatten is free in NCHW: [N, C, 1, 1] and [N, C] are the same memory.
 *
 * One file per layer in src/nn/; oneDNN glue in src/cpu/. */
#ifndef VISC_NN_H
#define VISC_NN_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

/* ---- conv2d.c: 2-D convolution (oneDNN forward, backward-data, backward-weights) ---- */
typedef struct {
    int N, C, H, W; /* input */
    int K, R, S;    /* output channels, kernel height, width */
    int stride, pad, dilation, groups;
    int has_bias;
    int P, Q; /* output height, width */
    visc_device device;
    void *impl; /* cached primitives and scratch */
} visc_conv2d;

void visc_conv2d_init(visc_conv2d *c, int N, int C, int H, int W, int K, int R, int S, int stride,
                      int pad, int dilation, int groups, int has_bias);
/* The shape alone, for a layer of a model bound for a GPU (model.h:
 * for_gpu), which reads only the shape: no oneDNN primitives, no share of
 * the CPU's workspace; a CPU forward or backward of it is a bug (asserted). */
void visc_conv2d_init_shape(visc_conv2d *c, int N, int C, int H, int W, int K, int R, int S,
                            int stride, int pad, int dilation, int groups, int has_bias);
void visc_conv2d_forward(visc_conv2d *c, float *out, const float *in, const float *weight,
                         const float *bias);
/* din may be NULL; dbias is ignored without bias. */
void visc_conv2d_backward(visc_conv2d *c, float *din, float *dweight, float *dbias,
                          const float *dout, const float *in, const float *weight);
void visc_conv2d_destroy(visc_conv2d *c);
double visc_conv2d_flops(const visc_conv2d *c); /* forward multiply-adds x 2 */

/* ---- batchnorm2d.c: batch normalization over N,H,W per channel, PyTorch semantics ----
 * Training uses batch statistics (biased variance) and updates
 *   running = (1 - momentum) * running + momentum * batch_stat
 * with the UNBIASED batch variance, as torch.nn.BatchNorm2d does.
 * With relu = 1 the layer computes relu(bn(x)) in one pass; backward then
 * needs `out` to mask the gradient (ignored when relu = 0). */
/* Synchronized BatchNorm (several processes, one batch): the per-channel
 * sums are reduced over the processes by a callback that adds n doubles
 * element-wise across them, in place. */
typedef void (*visc_bn_sync_fn)(void *ctx, double *buf, int n);

typedef struct {
    int N, C, HW;
    float eps, momentum;
    int relu;
    visc_device device;
    void *impl;
    visc_bn_sync_fn sync; /* NULL: statistics of this process's batch */
    void *sync_ctx;
} visc_batchnorm2d;

void visc_batchnorm2d_init(visc_batchnorm2d *b, int N, int C, int HW, float eps, float momentum,
                           int relu);
/* save_mean, save_rstd: [C] each, kept for backward (rstd = 1/sqrt(var+eps)).
 * running_mean, running_var NULL: left alone (a recomputed forward). */
void visc_batchnorm2d_forward_train(visc_batchnorm2d *b, float *out, float *save_mean,
                                    float *save_rstd, const float *in, const float *gamma,
                                    const float *beta, float *running_mean, float *running_var);
/* A training forward's output again, bit for bit, from the statistics it
 * saved (and the same gamma, beta): backward's copy of a normalized
 * activation it did not keep (a ResNet block's insides, resnet.c). */
void visc_batchnorm2d_apply(const visc_batchnorm2d *b, float *out, const float *in,
                            const float *gamma, const float *beta, const float *save_mean,
                            const float *save_rstd);
void visc_batchnorm2d_forward_eval(visc_batchnorm2d *b, float *out, const float *in,
                                   const float *gamma, const float *beta, const float *running_mean,
                                   const float *running_var);
/* din may alias dout. */
void visc_batchnorm2d_backward(visc_batchnorm2d *b, float *din, float *dgamma, float *dbeta,
                               const float *dout, const float *in, const float *out,
                               const float *gamma, const float *save_mean, const float *save_rstd);
/* Turns on synchronized statistics (as torch.nn.SyncBatchNorm): mean and
 * variance over the batches of all processes, and in backward the sums of
 * dy and dy * (x - mean) over them too; dgamma and dbeta stay this
 * process's share (the gradient all-reduce adds them up). fn NULL: off. */
void visc_batchnorm2d_set_sync(visc_batchnorm2d *b, visc_bn_sync_fn fn, void *ctx);
/* The synchronized path's passes, for a device that reduces between them
 * (gpu/layers.c): acc holds 2C + 1 doubles (b->impl once synchronized).
 *   forward   sums: acc[0..C) the channels' sums, acc[C] the count;
 *             (reduce acc[0..C]) sqdev: save_mean, acc[C+1..2C] the squared
 *             deviations around it; (reduce acc[C+1..2C]) finish: the
 *             statistics, running statistics and out;
 *   backward  grad_sums: dgamma, dbeta (this process's), acc[0..C) sum dy,
 *             acc[C..2C) sum dy (x - mean), acc[2C] the count; (reduce
 *             acc[0..2C]) grad_input: din. */
void visc_batchnorm2d_sync_sums(const visc_batchnorm2d *b, double *acc, const float *in);
void visc_batchnorm2d_sync_sqdev(const visc_batchnorm2d *b, double *acc, float *save_mean,
                                 const float *in);
void visc_batchnorm2d_sync_finish(const visc_batchnorm2d *b, const double *acc, float *out,
                                  float *save_mean, float *save_rstd, const float *in,
                                  const float *gamma, const float *beta, float *running_mean,
                                  float *running_var);
void visc_batchnorm2d_sync_grad_sums(const visc_batchnorm2d *b, double *acc, float *dgamma,
                                     float *dbeta, const float *dout, const float *in,
                                     const float *out, const float *save_mean,
                                     const float *save_rstd);
void visc_batchnorm2d_sync_grad_input(const visc_batchnorm2d *b, const double *acc, float *din,
                                      const float *dout, const float *in, const float *out,
                                      const float *gamma, const float *save_mean,
                                      const float *save_rstd);
void visc_batchnorm2d_destroy(visc_batchnorm2d *b);

/* ---- pool2d.c: max and average pooling (square kernel), PyTorch semantics ----
 * Average pooling counts padding (count_include_pad=True, torch's default). */
typedef struct {
    int N, C, H, W, kernel, stride, pad;
    int P, Q;
    visc_device device;
    void *impl;
} visc_pool2d;

void visc_pool2d_init(visc_pool2d *p, int N, int C, int H, int W, int kernel, int stride, int pad);
/* argmax: [N*C*P*Q] index of the chosen input element within its (n, c) plane. */
void visc_maxpool2d_forward(visc_pool2d *p, float *out, int32_t *argmax, const float *in);
void visc_maxpool2d_backward(visc_pool2d *p, float *din, const float *dout, const int32_t *argmax);
void visc_avgpool2d_forward(visc_pool2d *p, float *out, const float *in);
void visc_avgpool2d_backward(visc_pool2d *p, float *din, const float *dout);
void visc_pool2d_destroy(visc_pool2d *p);

/* ---- global_pool.c: mean over H*W: [N, C, HW] -> [N, C] ---- */
void visc_global_avgpool_forward(float *out, const float *in, int N, int C, int HW);
void visc_global_avgpool_backward(float *din, const float *dout, int N, int C, int HW);

/* ---- linear.c: y = x W^T + b on [N, in] rows (tokens: N = batch * tokens) ----
 * Precision of the three matrix products (process-wide, fp32 by default):
 * with BF16, inputs, weights and output gradients are rounded to bfloat16
 * (round to nearest even) for the product only; accumulation, outputs,
 * gradients, the bias and the master weights stay fp32. */
typedef enum { VISC_PRECISION_FP32 = 0, VISC_PRECISION_BF16 = 1 } visc_precision;
/* Returns the precision now in effect: a BF16 request on a CPU without
 * native bf16 dot products (avx512_bf16) falls back to FP32 with a note on
 * stderr. Not to be called while a linear layer runs on another thread. */
visc_precision visc_set_matmul_precision(visc_precision p);
visc_precision visc_matmul_precision(void);
/* Parses "fp32" | "bf16"; 0, or -1 with visc_last_error() set. */
int visc_parse_precision(const char *name, visc_precision *out);
const char *visc_precision_name(visc_precision p);
void visc_linear_forward(float *out, const float *in, const float *weight, const float *bias, int N,
                         int in_features, int out_features);
/* din may be NULL; bias gradient skipped when dbias is NULL. */
void visc_linear_backward(float *din, float *dweight, float *dbias, const float *dout,
                          const float *in, const float *weight, int N, int in_features,
                          int out_features);

/* ---- eltwise.c: elementwise ops ---- */
void visc_relu_forward(float *out, const float *in, size_t n);
/* Uses the forward OUTPUT for the mask; din may alias dout. */
void visc_relu_backward(float *din, const float *dout, const float *out, size_t n);
void visc_add_forward(float *out, const float *a, const float *b,
                      size_t n);                             /* out may alias a or b */
void visc_add_inplace(float *acc, const float *x, size_t n); /* acc += x */
/* din = a + b where out > 0, else 0: two gradient paths joining at the
 * output of a ReLU (a ResNet block's input), and the ReLU's backward, in
 * one pass with the bits of the two. din may alias a or b. */
void visc_add_relu_backward(float *din, const float *a, const float *b, const float *out, size_t n);

/* ---- dropout.c: inverted dropout; the mask is a pure function of (seed, offset) ---- */
/* mask: [n] bytes (1 kept, 0 dropped), kept for backward. p in [0, 1). */
void visc_dropout_forward(float *out, uint8_t *mask, const float *in, size_t n, float p,
                          uint64_t seed, uint64_t offset);
void visc_dropout_backward(float *din, const float *dout, const uint8_t *mask, size_t n, float p);

/* ---- loss.c: softmax cross-entropy with label smoothing, and accuracy ----
 * Target distribution (1 - s) * onehot + s / K, as torch's label_smoothing.
 * Returns the batch-mean loss; probs [N, K] is kept for backward. */
float visc_softmax_xent_forward(float *probs, const float *logits, const int32_t *labels, int N,
                                int K, float smoothing);
/* dlogits = (probs - target) / N */
void visc_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels, int N,
                                int K, float smoothing);
/* Counts samples whose label is the arg-max (top1) or among the 5 largest
 * logits (top5; top-K when K < 5). Ties resolve to the lower index, as torch.topk. */
void visc_topk_correct(const float *logits, const int32_t *labels, int N, int K, int *top1,
                       int *top5);

/* ---- loss_soft.c: cross-entropy with soft targets (Mixup / CutMix) ----
 * timm's SoftTargetCrossEntropy: mean over the batch of sum_k -t_k
 * log_softmax(x)_k, targets [N, K]. probs [N, K] is kept for backward. */
float visc_softmax_xent_soft_forward(float *probs, const float *logits, const float *targets, int N,
                                     int K);
/* dlogits = (probs * sum_k t_k - t) / N (probs - t when rows sum to 1) */
void visc_softmax_xent_soft_backward(float *dlogits, const float *probs, const float *targets,
                                     int N, int K);

#endif

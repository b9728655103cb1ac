/* gpu.h: what the engine's C code asks of the GPU (src/gpu/, over the CUDA
 * backend of cuda.h).
 *
 * device.c  --device names, opening a GPU
 * model.c   moving a model's parameters, gradients and buffers to the GPU
 *           and back (the model plans its activations there: model.h's
 *           to_cuda)
 * layers.c  the GPU twins of nn.h's layers: the same layer structs and
 *           arguments, device pointers
 * optim.c   the optimizer's step on the GPU, its state kept there
 * pinned.c  the loader's batch memory page-locked, so batches cross the
 *           bus at its speed
 * stage.c   a training step that does not wait for the GPU: the batch
 *           crosses beside the previous step's kernels, the loss and
 *           top-1 stay on the device until the host reports
 * comm.c    several processes: the gradients on the GPU averaged over the
 *           ranks (NCCL, or through host memory over the group's backend)
 *
 * A model on the GPU runs the same forward and backward code as on the CPU:
 * each layer call goes to its twin here when m->cuda is set (models/resnet.c).
 * By default the host side of a model's call stays as on the CPU: forward
 * uploads the batch and downloads the logits, backward uploads their
 * gradient (evaluation, SSL pretraining). A caller that keeps batch and
 * loss on the device sets m->io_on_device (model.h): the trainer's steps
 * (stage.c), bench_train.
 *
 * tests/gpu/cpu_standin.c implements the backend's calls with the CPU
 * layers, so that CI runs all of this (and must get the CPU's bits).
 *
 * Everything here is compiled into every visc. Without the CUDA backend
 * visc_gpu_open says so, so no model ever reaches the GPU and the twins
 * cannot be called. The twins return nothing, as their CPU layers: a
 * kernel that fails stops the program with one line naming it (the step's
 * state on the GPU is lost then anyway). */
#ifndef VISC_GPU_H
#define VISC_GPU_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "dist.h"
#include "model.h"
#include "nn.h"
#include "optim.h"
#include "tokens.h"
#include "train.h"

/* ---- device.c ---- */
/* "cpu" -> -1; "cuda" -> 0; "cuda:N" -> N. -1 with the error set (and *index
 * untouched) for anything else. */
int visc_parse_device(const char *name, int *index);
/* The device a run asks for (c->device): *index -1 for the CPU, else the
 * GPU's. Under a launcher, plain "cuda" is the GPU of this rank's place
 * on its machine (local rank modulo the GPUs there; ranks share GPUs when
 * there are fewer). What is not on the GPU yet (a swarm) is
 * refused here, in one line. */
int visc_gpu_run_device(const visc_train_config *c, const visc_dist *d, int *index);
/* Opens CUDA device `index`; NULL with the reason (not built in, no driver,
 * no such device). */
visc_cuda *visc_gpu_open(int index);
void visc_gpu_close(visc_cuda *ctx);
/* The precision of the products on this GPU (fp32 until set). bf16: the
 * linear layers' operands rounded to bf16, fp32 accumulation and outputs,
 * as nn.h's bf16 mode; and a ResNet's activations kept in bf16
 * channels-last (the CNN layers below), its convolutions on tensor cores,
 * and a transformer's operands in bf16 (visc_gpu_operand_floats). Set it
 * before a model moves here: its arena is planned for it. Unlike the
 * CPU's, bf16 is always there. */
void visc_gpu_set_precision(visc_cuda *ctx, visc_precision p);
/* --cudnn-benchmark: each convolution shape's algorithm by cuDNN's timed
 * search instead of its heuristic (visc_cuda_set_conv_benchmark). */
void visc_gpu_set_conv_benchmark(visc_cuda *ctx, int on);
/* Waits for the queued work; -1 with the error if any of it failed. */
int visc_gpu_sync(visc_cuda *ctx);
/* Device memory in use on the device, in bytes (-1 with the error). */
int visc_gpu_memory_used(visc_cuda *ctx, size_t *used);
/* Device memory the run's buffers hold (cuda.h's
 * visc_cuda_memory_allocated: PyTorch's memory_allocated measure), now and
 * at most so far; zeros without the backend. */
void visc_gpu_memory_allocated(visc_cuda *ctx, size_t *now, size_t *peak);
/* GPU time per kind of work (cuda.h's profiler): start, run some steps,
 * then report prints the table per step to f and stops. -1 with the error. */
int visc_gpu_profile_start(visc_cuda *ctx);
int visc_gpu_profile_report(visc_cuda *ctx, FILE *f, int steps);
/* Prints one line: the device memory the run holds, in use now less `base`
 * (in use when the GPU was opened). A run frees nothing on the device
 * before it ends (the arena is planned once, workspaces only grow), so
 * after its steps this is its peak. */
void visc_gpu_print_memory(visc_cuda *ctx, size_t base);
/* Device memory (a model's activation arena); NULL with the error set. */
void *visc_gpu_alloc(visc_cuda *ctx, size_t bytes);
void visc_gpu_free(visc_cuda *ctx, void *p); /* NULL: nothing */

/* ---- model.c ---- */
/* Moves m to the GPU: device copies of its parameters, gradients and
 * buffers (uploaded from the host tables), then the model's own to_cuda
 * (activations). -1 with the error for architectures without a GPU path. */
int visc_model_to_gpu(visc_model *m, visc_cuda *ctx);
/* Parameters and buffers: device -> host tables (before a checkpoint or
 * anything else that reads them on the host), and back. */
int visc_model_download(visc_model *m);
int visc_model_upload(visc_model *m);
/* Frees the device copies (the model's destroy calls it). */
void visc_model_gpu_release(visc_model *m);
/* A model's to_cuda: its activation arena planned again in device memory.
 * plan(m, a) is the model's planning pass (run counting, then for real);
 * the host arena is freed. *dlogits gets a device buffer [batch, classes]
 * for backward's incoming gradient; m->logits and m->features become host
 * buffers that forward downloads into; m->activation_bytes the device
 * arena's size. visc_gpu_arena_free undoes it. */
int visc_gpu_arena_move(visc_model *m, visc_arena *arena, void (*plan)(visc_model *, visc_arena *),
                        float **dlogits);
void visc_gpu_arena_free(visc_model *m, visc_arena *arena, float *dlogits);

typedef struct visc_gpu_comm visc_gpu_comm; /* comm.c */

/* ---- layers.c: as the nn.h functions of the same names, on device pointers ---- */
void visc_gpu_upload(visc_cuda *ctx, void *dst, const void *src, size_t bytes);
void visc_gpu_download(visc_cuda *ctx, void *dst, const void *src, size_t bytes);
void visc_gpu_zero(visc_cuda *ctx, float *p, size_t count);
void visc_gpu_copy(visc_cuda *ctx, float *dst, const float *src, size_t count);
/* ema = decay * ema + (1 - decay) * params, as visc_ema_update */
void visc_gpu_ema_update(visc_cuda *ctx, float *ema, const float *params, size_t n, float decay);
/* A batch of bytes (3-plane CHW images: a loader's byte form) to the
 * model's input floats, as visc_normalize_bytes (transforms.h), bit for bit. */
void visc_gpu_normalize_bytes(visc_cuda *ctx, float *out, const uint8_t *in, size_t images,
                              size_t plane, const float mean[3], const float std[3]);
/* visc_softmax_xent_forward then _backward on the device: the mean loss
 * into *loss (one device float: nothing waits for it), probs [N, K] and
 * dlogits [N, K] from logits and labels [N] (device int32). */
void visc_gpu_softmax_xent(visc_cuda *ctx, float *loss, float *probs, float *dlogits,
                           const float *logits, const int32_t *labels, int N, int K,
                           float smoothing);
/* visc_topk_correct on the device: counts[0] the samples of N whose label
 * ranks first, counts[1] within the first min(5, K) (two device int32). */
void visc_gpu_topk_correct(visc_cuda *ctx, int32_t *counts, const float *logits,
                           const int32_t *labels, int N, int K);
/* visc_l2_normalize_forward/backward on the device (the contrastive
 * embeddings); backward scales dy by `scale` first (a loss's weight), and
 * dx may be dy. */
void visc_gpu_l2_normalize_forward(visc_cuda *ctx, float *y, float *norms, const float *x, int n,
                                   int D);
void visc_gpu_l2_normalize_backward(visc_cuda *ctx, float *dx, const float *dy, const float *y,
                                    const float *norms, int n, int D, float scale);
/* visc_infonce_forward_backward on the device (MoCo's loss against a copy
 * of the memory bank there, bank [K, D]): the mean loss into *loss (one
 * device float) and dq [n, D] (NULL: the loss only). work holds
 * visc_gpu_infonce_work_floats(n, K) floats of device memory. */
size_t visc_gpu_infonce_work_floats(int n, int K);
void visc_gpu_infonce(visc_cuda *ctx, float *loss, float *dq, const float *q, const float *k,
                      const float *bank, int n, int K, int D, float t, float *work);
/* visc_ntxent_forward_backward on the device: z [2n, D] this rank's rows,
 * view 0 first; the mean loss into *loss (one device float) and dz [2n, D]
 * (NULL: the loss only). With world > 1 the candidates are every rank's
 * rows, which comm's collectives carry (comm.c: NCCL, or through host
 * memory), as are their gradients back; world 1: this rank's batch alone
 * (comm unused). work holds visc_gpu_ntxent_work_floats(n, D, world)
 * floats of device memory. -1 with the error when a collective failed. */
size_t visc_gpu_ntxent_work_floats(int n, int D, int world);
int visc_gpu_ntxent(visc_cuda *ctx, visc_gpu_comm *comm, int world, int rank, float *loss,
                    float *dz, const float *z, int n, int D, float t, float *work);
/* As visc_clip_grad_norm (--clip-grad), on the device. */
void visc_gpu_clip_grad_norm(visc_cuda *ctx, float *grads, size_t n, float max_norm);
/* ---- layers.c: the CNN layers (a ResNet's), in the context's activation form ----
 * fp32 NCHW, the CPU's tensors; or, under --precision bf16, bf16
 * channels-last ([N, H, W, C], the model's arena planned at half the
 * bytes, the pointers still float *): the convolutions on tensor cores
 * straight from and into them (the fp32 weights copied to bf16 per call,
 * their gradient fp32), batch norm, pooling, the residual sums and ReLU's
 * backward reading and writing bf16 (statistics, features and every
 * parameter and gradient fp32), as PyTorch's autocast with channels_last
 * keeps a ResNet. */
typedef enum { VISC_GPU_F32_NCHW = 0, VISC_GPU_BF16_NHWC = 1 } visc_gpu_act;
/* The form a CNN takes on this context (its precision: visc_gpu_set_precision). */
visc_gpu_act visc_gpu_cnn_act(const visc_cuda *ctx);
/* An fp32 NCHW batch [N, C, HW] to bf16 channels-last (a CNN's input). */
void visc_gpu_to_nhwc_bf16(visc_cuda *ctx, void *out, const float *in, int N, int C, int HW);
void visc_gpu_conv2d_forward(visc_cuda *ctx, const visc_conv2d *c, visc_gpu_act act, void *out,
                             const void *in, const float *weight);
/* din may be NULL (the first layer) */
void visc_gpu_conv2d_backward(visc_cuda *ctx, const visc_conv2d *c, visc_gpu_act act, void *din,
                              float *dweight, const void *dout, const void *in,
                              const float *weight);
void visc_gpu_batchnorm2d_forward_train(visc_cuda *ctx, const visc_batchnorm2d *b, visc_gpu_act act,
                                        void *out, float *save_mean, float *save_rstd,
                                        const void *in, const float *gamma, const float *beta,
                                        float *running_mean, float *running_var);
void visc_gpu_batchnorm2d_forward_eval(visc_cuda *ctx, const visc_batchnorm2d *b, visc_gpu_act act,
                                       void *out, const void *in, const float *gamma,
                                       const float *beta, const float *running_mean,
                                       const float *running_var);
/* a training forward's output again from its saved statistics, same bits */
void visc_gpu_batchnorm2d_apply(visc_cuda *ctx, const visc_batchnorm2d *b, visc_gpu_act act,
                                void *out, const void *in, const float *gamma, const float *beta,
                                const float *save_mean, const float *save_rstd);
/* out = relu(bn(in) + identity), a residual block's end, in one pass over
 * out (b without its own ReLU) */
void visc_gpu_batchnorm2d_forward_train_add_relu(visc_cuda *ctx, const visc_batchnorm2d *b,
                                                 visc_gpu_act act, void *out, float *save_mean,
                                                 float *save_rstd, const void *in,
                                                 const void *identity, const float *gamma,
                                                 const float *beta, float *running_mean,
                                                 float *running_var);
void visc_gpu_batchnorm2d_forward_eval_add_relu(visc_cuda *ctx, const visc_batchnorm2d *b,
                                                visc_gpu_act act, void *out, const void *in,
                                                const void *identity, const float *gamma,
                                                const float *beta, const float *running_mean,
                                                const float *running_var);
/* A norm's tensors and state, for the block end below. */
typedef struct {
    const visc_batchnorm2d *op;
    const void *in;
    float *save_mean, *save_rstd;
    const float *gamma, *beta;
    float *running_mean, *running_var; /* training: NULL to leave them (a recomputed forward) */
} visc_gpu_bn_args;
/* The same where the identity is the output of the shortcut's norm d (a
 * downsampling block, d without a ReLU): d is applied in the block end's
 * pass instead of writing its output and reading it back (its statistics
 * taken first in training), with the bits of the two passes
 * (visc_cuda_batchnorm_*_add_norm). Under SyncBN, training writes d's
 * output into `scratch` (out's size) and adds it from there. */
void visc_gpu_batchnorm2d_forward_train_add_norm_relu(visc_cuda *ctx, const visc_batchnorm2d *b,
                                                      visc_gpu_act act, void *out, float *save_mean,
                                                      float *save_rstd, const void *in,
                                                      const float *gamma, const float *beta,
                                                      float *running_mean, float *running_var,
                                                      const visc_gpu_bn_args *d, void *scratch);
void visc_gpu_batchnorm2d_forward_eval_add_norm_relu(visc_cuda *ctx, const visc_batchnorm2d *b,
                                                     visc_gpu_act act, void *out, const void *in,
                                                     const float *gamma, const float *beta,
                                                     const float *running_mean,
                                                     const float *running_var,
                                                     const visc_gpu_bn_args *d);
/* out: the forward's output (its fused ReLU's mask), read under SyncBN;
 * a process alone makes the mask again from in, gamma, beta and the saved
 * statistics instead, so out may be NULL there (the output of a training
 * forward: visc_cuda_batchnorm_backward). _reads_output says which: 1
 * where out is read. */
int visc_gpu_batchnorm2d_reads_output(const visc_batchnorm2d *b);
void visc_gpu_batchnorm2d_backward(visc_cuda *ctx, const visc_batchnorm2d *b, visc_gpu_act act,
                                   void *din, float *dgamma, float *dbeta, const void *dout,
                                   const void *in, const void *out, const float *gamma,
                                   const float *beta, const float *save_mean,
                                   const float *save_rstd);
void visc_gpu_maxpool2d_forward(visc_cuda *ctx, const visc_pool2d *p, visc_gpu_act act, void *out,
                                int32_t *argmax, const void *in);
void visc_gpu_maxpool2d_backward(visc_cuda *ctx, const visc_pool2d *p, visc_gpu_act act, void *din,
                                 const void *dout, const int32_t *argmax);
/* fp32 features [N, C] from the activations, and back */
void visc_gpu_global_avgpool_forward(visc_cuda *ctx, visc_gpu_act act, float *out, const void *in,
                                     int N, int C, int HW);
void visc_gpu_global_avgpool_backward(visc_cuda *ctx, visc_gpu_act act, void *din,
                                      const float *dout, int N, int C, int HW);
/* out = relu(out + identity): a residual block's end after its norm (SyncBN's: a
 * process alone adds in the norm's pass, visc_gpu_batchnorm2d_*_add_relu) */
void visc_gpu_add_relu(visc_cuda *ctx, visc_gpu_act act, void *out, const void *identity, size_t n);
/* out = a + b and ReLU's backward (masked by the output) in either form;
 * and the two in one pass, din = a + b where out > 0 */
void visc_gpu_cnn_add(visc_cuda *ctx, visc_gpu_act act, void *out, const void *a, const void *b,
                      size_t n);
void visc_gpu_cnn_add_relu_backward(visc_cuda *ctx, visc_gpu_act act, void *din, const void *a,
                                    const void *b, const void *out, size_t n);
void visc_gpu_cnn_relu_backward(visc_cuda *ctx, visc_gpu_act act, void *din, const void *dout,
                                const void *out, size_t n);

/* ---- layers.c: the linear layer and elementwise steps, fp32 ---- */
void visc_gpu_linear_forward(visc_cuda *ctx, float *out, const float *in, const float *weight,
                             const float *bias, int N, int in_features, int out_features);
void visc_gpu_linear_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                              const float *dout, const float *in, const float *weight, int N,
                              int in_features, int out_features);
void visc_gpu_relu_backward(visc_cuda *ctx, float *din, const float *dout, const float *out,
                            size_t n);
void visc_gpu_add(visc_cuda *ctx, float *out, const float *a, const float *b, size_t n);

/* ---- layers.c: the token layers (tokens.h, models/transformer_common.h) ---- */
void visc_gpu_layernorm_forward(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                const float *in, const float *gamma, const float *beta,
                                int64_t rows, int C, float eps);
void visc_gpu_layernorm_backward(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                 const float *dout, const float *in, const float *gamma,
                                 const float *save_mean, const float *save_rstd, int64_t rows,
                                 int C);
void visc_gpu_layernorm_backward_add(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                     const float *dout, const float *in, const float *gamma,
                                     const float *save_mean, const float *save_rstd, int64_t rows,
                                     int C);
void visc_gpu_gelu_forward(visc_cuda *ctx, float *out, const float *in, size_t n);
void visc_gpu_gelu_backward(visc_cuda *ctx, float *din, const float *dout, const float *in,
                            size_t n);
/* The floats a buffer of `count` values in the operand form takes (the
 * outputs of the *_operand_* calls and of visc_gpu_gelu_linear_act, which
 * only linear layers read): half of count under --precision bf16, where
 * they hold bf16. The models plan those buffers so. */
size_t visc_gpu_operand_floats(const visc_cuda *ctx, size_t count);
/* The value `offset` values past base in such a buffer (q, k and v in a
 * qkv projection's output). */
float *visc_gpu_operand_at(const visc_cuda *ctx, float *base, size_t offset);
/* A layer norm whose output only a linear layer reads, and that layer:
 * the output in the products' form, bf16 under --precision bf16 (the CPU
 * keeps it fp32 and rounds it in the layer) */
void visc_gpu_layernorm_operand_forward(visc_cuda *ctx, float *out, float *save_mean,
                                        float *save_rstd, const float *in, const float *gamma,
                                        const float *beta, int64_t rows, int C, float eps);
void visc_gpu_linear_operand_forward(visc_cuda *ctx, float *out, const float *in,
                                     const float *weight, const float *bias, int N, int in_features,
                                     int out_features);
void visc_gpu_linear_operand_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                                      const float *dout, const float *in, const float *weight,
                                      int N, int in_features, int out_features);
/* ... with its output in the operand form too (attention's q, k, v; an
 * MLP's hidden layer), from an input in that form or (_to_operand) fp32 */
void visc_gpu_linear_operands_forward(visc_cuda *ctx, float *out, const float *in,
                                      const float *weight, const float *bias, int N,
                                      int in_features, int out_features);
void visc_gpu_linear_forward_to_operand(visc_cuda *ctx, float *out, const float *in,
                                        const float *weight, const float *bias, int N,
                                        int in_features, int out_features);
/* visc_gelu_linear_* (tokens.h): act holds what the products take, bf16
 * under --precision bf16 (as on the CPU) */
void visc_gpu_gelu_linear_forward(visc_cuda *ctx, float *out, float *act, const float *h,
                                  const float *weight, const float *bias, int N, int hidden,
                                  int out_features);
void visc_gpu_gelu_linear_act(visc_cuda *ctx, float *act, const float *h, int N, int hidden,
                              int out_features, int has_bias);
void visc_gpu_gelu_linear_backward(visc_cuda *ctx, float *dh, float *dweight, float *dbias,
                                   const float *dout, const float *act, const float *h,
                                   const float *weight, int N, int hidden, int out_features);
/* the MLP's backward (visc_cuda_mlp_backward): fc1's input in the operand
 * form, dact scratch */
void visc_gpu_mlp_backward(visc_cuda *ctx, float *din, float *dweight1, float *dbias1,
                           float *dweight2, float *dbias2, float *dact, const float *dout,
                           const float *in, const float *h, const float *act, const float *weight1,
                           const float *weight2, int N, int in_features, int hidden,
                           int out_features);
/* Attention with its output as the output projection's operand
 * (visc_cuda_attention_operand_*); under --precision bf16 on tensor cores,
 * the products' operands rounded to bf16 (Q, K, V, the probabilities and
 * their gradients) */
void visc_gpu_attention_operand_forward(visc_cuda *ctx, const visc_attention *a, float *out,
                                        float *lse, const float *q, const float *k, const float *v);
void visc_gpu_attention_operand_backward(visc_cuda *ctx, const visc_attention *a, float *dq,
                                         float *dk, float *dv, float *dbias, float *dhead_scale,
                                         const float *dout, const float *q, const float *k,
                                         const float *v, const float *out, const float *lse);
/* The patch embedding of `conv` (kernel = stride = patch, with bias) into
 * token rows b * tokens + first + l, as visc_tf_patch_embed_*. */
void visc_gpu_patch_embed_forward(visc_cuda *ctx, const visc_conv2d *conv, float *tokens,
                                  float *conv_out, const float *image, const float *weight,
                                  const float *bias, int tokens_per_image, int first);
void visc_gpu_patch_embed_backward(visc_cuda *ctx, const visc_conv2d *conv, float *dweight,
                                   float *dbias, float *dconv, const float *dtokens,
                                   const float *image, int tokens_per_image, int first);
void visc_gpu_add_broadcast(visc_cuda *ctx, float *x, const float *table, int B, int64_t NC);
/* out[c] = sum over the rows of a [rows, C] */
void visc_gpu_sum_rows(visc_cuda *ctx, float *out, const float *a, int64_t rows, int C);
/* Drop-path's factors drawn on the host (keep_host [B]) as the CPU draws
 * them, uploaded to keep [B] (device), then out = x + keep_b branch. */
void visc_gpu_droppath_add_forward(visc_cuda *ctx, float *out, const float *x, const float *branch,
                                   float *keep, float *keep_host, int B, size_t per_sample, float p,
                                   int train, uint64_t seed, uint64_t offset);
void visc_gpu_droppath_add_backward(visc_cuda *ctx, float *dbranch, const float *dx,
                                    const float *keep, int B, size_t per_sample);
/* rows x count floats, rows dst_stride / src_stride floats apart */
void visc_gpu_copy_rows(visc_cuda *ctx, float *dst, int64_t dst_stride, const float *src,
                        int64_t src_stride, int64_t rows, int count);
void visc_gpu_relu_forward(visc_cuda *ctx, float *out, const float *in, size_t n);
void visc_gpu_token_mean_forward(visc_cuda *ctx, float *out, const float *in, int B, int N, int C);
void visc_gpu_token_mean_backward(visc_cuda *ctx, float *din, const float *dout, int B, int N,
                                  int C);

/* ---- layers.c: Swin's pieces (models/swin_window.h; grids as visc_swin_grid) ---- */
/* the partition into the operand form, and acc += the reverse of in */
void visc_gpu_swin_partition_operand(visc_cuda *ctx, float *out, const float *in, int H, int W,
                                     int wh, int ww, int sh, int sw, int B, int C);
void visc_gpu_swin_reverse_add(visc_cuda *ctx, float *acc, const float *in, int H, int W, int wh,
                               int ww, int sh, int sw, int B, int C);
/* out = x + drop_path(branch) with branch in windowed order (rolled back
 * on the way), the draws as visc_gpu_droppath_add_forward's. */
void visc_gpu_droppath_add_from_windows(visc_cuda *ctx, float *out, const float *x,
                                        const float *branch, float *keep, float *keep_host, int H,
                                        int W, int wh, int ww, int sh, int sw, int B, int C,
                                        float p, int train, uint64_t seed, uint64_t offset);
/* Swin V1's output projection backward from the token-order gradient of
 * its output (visc_cuda_linear_operand_backward_from_windows; windowed:
 * the partition's room, used in fp32 only). */
void visc_gpu_linear_operand_backward_from_windows(visc_cuda *ctx, float *din, float *dweight,
                                                   float *dbias, const float *dout, float *windowed,
                                                   int H, int W, int wh, int ww, int sh, int sw,
                                                   int B, const float *in, const float *weight,
                                                   int in_features, int out_features);
/* Swin V1's first norm into windowed order as the qkv projection's operand,
 * and its backward from windowed order (visc_cuda_layernorm_operand_to_windows). */
void visc_gpu_layernorm_operand_to_windows(visc_cuda *ctx, float *out, float *save_mean,
                                           float *save_rstd, const float *in, const float *gamma,
                                           const float *beta, int H, int W, int wh, int ww, int sh,
                                           int sw, int B, int C, float eps);
void visc_gpu_layernorm_backward_from_windows_add(visc_cuda *ctx, float *din, float *dgamma,
                                                  float *dbeta, const float *dout, const float *in,
                                                  const float *gamma, const float *save_mean,
                                                  const float *save_rstd, int H, int W, int wh,
                                                  int ww, int sh, int sw, int B, int C);
/* Swin V2's post-norm from windowed rows to token order, and its backward
 * to windowed order (visc_cuda_layernorm_from_windows). */
void visc_gpu_layernorm_from_windows(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                     const float *in, const float *gamma, const float *beta, int H,
                                     int W, int wh, int ww, int sh, int sw, int B, int C,
                                     float eps);
void visc_gpu_layernorm_backward_to_windows(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                            const float *dout, const float *in, const float *gamma,
                                            const float *save_mean, const float *save_rstd, int H,
                                            int W, int wh, int ww, int sh, int sw, int B, int C);
void visc_gpu_swin_gather_bias(visc_cuda *ctx, float *bias, const float *table, const int32_t *rel,
                               int H, int N, int sigmoid16);
void visc_gpu_swin_scatter_bias(visc_cuda *ctx, float *dtable, const float *dbias,
                                const float *bias, const int32_t *rel, int T, int H, int N,
                                int sigmoid16);
/* Swin V2's q, k normalized and v into the operand form, and the
 * normalization's backward with y in that form (visc_cuda_swin_qkv_operand) */
void visc_gpu_swin_qkv_operand(visc_cuda *ctx, float *qkv, float *qnorm, float *knorm,
                               const float *raw, int64_t rows, int H, int D);
void visc_gpu_swin_normalize_heads_backward(visc_cuda *ctx, float *dx, int64_t ld_dx,
                                            const float *dy, int64_t ld_dy, const float *y,
                                            int64_t ld_y, const float *norms, int64_t rows, int H,
                                            int D);
void visc_gpu_swin_merge_copy(visc_cuda *ctx, float *tokens, float *merged, int B, int H, int W,
                              int C, int back);
void visc_gpu_swin_head_scale(visc_cuda *ctx, float *hs, const float *logit_scale, int H);
void visc_gpu_swin_head_scale_backward(visc_cuda *ctx, float *dlogit_scale,
                                       const float *logit_scale, const float *dhs, const float *hs,
                                       int H);

/* ---- layers.c: CaiT (models/talking_heads.h, tokens.h's layerscale) ---- */
void visc_gpu_th_scores(visc_cuda *ctx, float *S, const float *qkv, const visc_th_dims *d);
void visc_gpu_th_mix(visc_cuda *ctx, float *out, const float *in, const float *W, const float *bias,
                     int B, int H, size_t TT, int transpose);
void visc_gpu_th_softmax(visc_cuda *ctx, float *P, size_t rows, int T);
void visc_gpu_th_apply(visc_cuda *ctx, float *att, const float *A, const float *qkv,
                       const visc_th_dims *d);
void visc_gpu_th_grad_a(visc_cuda *ctx, float *dA, const float *datt, const float *qkv,
                        const visc_th_dims *d);
void visc_gpu_th_grad_v(visc_cuda *ctx, float *dqkv, const float *A, const float *datt,
                        const visc_th_dims *d);
void visc_gpu_th_mix_grad(visc_cuda *ctx, float *dW, float *db, const float *dY, const float *X,
                          int B, int H, size_t TT);
void visc_gpu_th_softmax_backward(visc_cuda *ctx, float *dS, const float *P, size_t rows, int T);
void visc_gpu_th_grad_qk(visc_cuda *ctx, float *dqkv, const float *dS, const float *qkv,
                         const visc_th_dims *d);
void visc_gpu_layerscale_forward(visc_cuda *ctx, float *out, const float *in, const float *gamma,
                                 int64_t rows, int C);
void visc_gpu_layerscale_backward(visc_cuda *ctx, float *din, float *dgamma, const float *dout,
                                  const float *in, const float *gamma, int64_t rows, int C);

/* ---- optim.c ---- */
typedef struct visc_gpu_optim visc_gpu_optim;
/* The step of `cpu` (its kind, settings, per-tensor decay) on the GPU, with
 * its state uploaded: NULL with the error for kinds without a GPU step. */
visc_gpu_optim *visc_gpu_optim_create(visc_cuda *ctx, const visc_optimizer *cpu);
/* One step of the device parameters params with the device gradients
 * grads (laid out as cpu->params: a model's dev_params and dev_grads, a
 * projection head's); counts it in cpu->step as visc_optimizer_step does. */
int visc_gpu_optim_step(visc_gpu_optim *o, visc_optimizer *cpu, float *params, const float *grads,
                        float lr);
/* The state to cpu->state (before a checkpoint). */
int visc_gpu_optim_download(visc_gpu_optim *o, visc_optimizer *cpu);
void visc_gpu_optim_free(visc_gpu_optim *o);

/* ---- pinned.c ---- */
/* Host memory page-locked for a GPU's copies, to be unlocked before it is
 * freed (and before the GPU is closed). */
typedef struct {
    visc_cuda *ctx;
    void *regions[2];
    int count;
} visc_gpu_pins;
/* Page-locks the memory l delivers its batches in (visc_loader_each_buffer)
 * and lists it in *pins: forward's upload of each batch then runs at the
 * bus's speed (pageable memory goes through the driver's staging copies at
 * a fraction of it). Where the system refuses (a locked-memory limit), the
 * batches stay pageable: slower, not wrong, and one note says so. */
void visc_gpu_pin_loader(visc_cuda *ctx, visc_loader *l, visc_gpu_pins *pins);
/* Unlocks what visc_gpu_pin_loader locked; a zeroed pins is nothing. */
void visc_gpu_unpin(visc_gpu_pins *pins);

/* ---- stage.c ----
 * A trainer's step on the GPU without waiting for it (trainer.c; evaluation
 * the same way without backward, evaluate.c):
 *   x = visc_gpu_stage_put(s, batch, labels, count)   the batch crosses
 *   forward on x (io_on_device), then
 *   dlogits = visc_gpu_stage_loss(s, i, logits, ...)  loss, gradient, top-1
 *   backward on dlogits, the optimizer's step, then
 *   visc_gpu_stage_end(s)                              the batch's memory free
 * and every VISC_GPU_STAGE_STEPS steps at most, visc_gpu_stage_results. */
typedef struct visc_gpu_stage visc_gpu_stage;
#define VISC_GPU_STAGE_STEPS 64 /* steps whose results wait on the device */
/* For batches of `batch` samples of sample_bytes each (bytes or floats, as
 * the loader delivers them) and `classes` logits; soft_targets: the loss
 * takes soft targets (mixup, cutmix) instead of labels. NULL with the
 * error set (device memory). */
visc_gpu_stage *visc_gpu_stage_create(visc_cuda *ctx, int batch, int classes, size_t sample_bytes,
                                      int soft_targets);
void visc_gpu_stage_free(visc_gpu_stage *s); /* NULL: nothing */
/* Where this step's soft targets [batch, classes] are written before put
 * (page-locked host memory); NULL without soft targets. */
float *visc_gpu_stage_targets(visc_gpu_stage *s);
/* Queues this step's batch x (batch samples, page-locked: the loader's
 * memory), its `count` labels and its soft targets to the device; returns
 * the batch's device copy. x stays untouched until visc_gpu_stage_end. */
void *visc_gpu_stage_put(visc_gpu_stage *s, const void *x, const int32_t *labels, int count);
/* This step's labels on the device (batch int32, zero past the put's
 * count): kernels queued after put read them once their copy is done. */
const int32_t *visc_gpu_stage_labels(const visc_gpu_stage *s);
/* The loss of logits [batch, classes] (device) over the first `rows`
 * samples (labels with smoothing, or the soft targets), and the top-1 and
 * top-5 counts over the first `count`, kept as result `step` (0 <= step <
 * VISC_GPU_STAGE_STEPS); returns the device gradient of the logits, zero
 * past `rows`. */
const float *visc_gpu_stage_loss(visc_gpu_stage *s, int step, const float *logits, int rows,
                                 int count, float smoothing);
/* After the step's kernels are queued: waits for this step's copies (they
 * ran beside the previous step's kernels), so the caller may reuse the
 * batch's memory; the next step takes the other buffers. */
int visc_gpu_stage_end(visc_gpu_stage *s);
/* Results 0 .. steps-1 to the host: the mean losses, top-1 and top-5 counts
 * (top5 may be NULL); waits for the queued work. */
int visc_gpu_stage_results(visc_gpu_stage *s, int steps, float *loss, int32_t *top1, int32_t *top5);

/* ---- comm.c ----
 * Several processes, each with its model on a GPU: the gradient buckets
 * of grad_sync (dist.h) averaged over the ranks where they are. how:
 * "nccl" (the GPUs reduce among themselves: every rank needs a GPU of its
 * own and libnccl.so.2), "host" (each bucket through page-locked host
 * memory over the group's backend, MPI: works wherever the group does,
 * ranks sharing a GPU too) or "auto" (NCCL where it can, else the host
 * path with a note saying why). A collective call: every rank opens it.
 * grads [count]: the model's device gradients (m->dev_grads). */
visc_gpu_comm *visc_gpu_comm_open(visc_cuda *ctx, visc_dist *d, const char *how, float *grads,
                                  size_t count);
/* "nccl" or "through host memory", for the run's first line. */
const char *visc_gpu_comm_name(const visc_gpu_comm *c);
/* The transport to hand visc_grad_sync_new (valid while c is open). */
visc_grad_transport visc_gpu_comm_transport(visc_gpu_comm *c);
void visc_gpu_comm_close(visc_gpu_comm *c); /* NULL: nothing; before the GPU is closed */
/* Collectives of device buffers between steps' buckets (no bucket of c's
 * may be in flight), queued in order with the GPU's work: NCCL's on the
 * device, watched as the buckets are; the host path's through page-locked
 * memory over the group's backend (the host waits). Every rank calls them
 * alike. -1 with the error where the group failed.
 * allgather: dst [world * count] gets rank r's src [count] at r * count. */
int visc_gpu_comm_allgather(visc_gpu_comm *c, float *dst, const float *src, size_t count);
/* buf [count] = its sum over the ranks, in place */
int visc_gpu_comm_allreduce(visc_gpu_comm *c, float *buf, size_t count);
/* Rank 0's host [bytes] to every rank (visc_dist_broadcast); with dev, a
 * GPU's copy of it (NULL: none), downloaded first and uploaded after. */
int visc_gpu_broadcast(visc_dist *d, visc_cuda *ctx, void *host, void *dev, size_t bytes);

#endif

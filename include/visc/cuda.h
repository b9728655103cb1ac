/* cuda.h: the CUDA backend's C API (build/libvisc_cuda.a, the .cu files in src/cuda).
 *
 * Built when the Makefile finds nvcc and cuBLASLt (CUDA=0 turns it off);
 * VISC_WITH_CUDA is then defined for the C code. The convolutions need
 * cuDNN 9's header at build time (without it they return an error) and its
 * library at run time (opened by the first convolution). Every kernel has a CPU
 * twin in the engine (named beside it) that tests/gpu/test_cuda_kernels.c
 * compares it with on the same inputs.
 *
 * context.cu      devices, the context (stream, cuBLASLt handle, scratch), memory
 * cublaslt_dl.cu  cuBLASLt, opened with dlopen at the first matrix product
 * layernorm.cu    visc_layernorm_* (src/nn/layernorm.c)
 * softmax_xent.cu visc_softmax_xent_*, visc_topk_correct (src/nn/loss.c,
 *                 loss_soft.c)
 * contrastive.cu  the embeddings' L2 normalization, MoCo's InfoNCE against the
 *                 memory bank, SimCLR's NT-Xent (src/ssl/contrastive.c)
 * gelu.cu         visc_gelu_* (src/nn/gelu.c) and the fused bias + GELU epilogue
 * gelu_linear.cu  GELU then a linear layer, its bf16 operand made by the GELU
 *                 (src/nn/gelu_linear.c); the MLP's backward, GELU' fused into
 *                 the first layer's bf16 dY
 * optim.cu        SGD, AdamW, LARS and LAMB steps, gradient clipping, the weights'
 *                 EMA (src/optim/sgd.c, adamw.c, lars.c, lamb.c, clip.c, ema.c)
 * convert.cu      fp32 <-> bf16 (src/nn/linear_bf16.h), also NCHW <-> channels-last
 * matmul.cu       cuBLASLt: bf16 or fp32 operands, fp32 accumulation and output, bias
 *                 epilogue; batches of strided bf16 products
 * linear.cu       the linear layer in fp32 or bf16, as visc_linear_forward/backward
 *                 (src/nn/linear.c, linear_bf16.c)
 * eltwise.cu      sums, the residual sum + ReLU, zeroing, copies (src/nn/eltwise.c);
 *                 the sums and ReLU's backward on bf16 too
 * swin_window.cu  window partition / reverse with the cyclic shift (src/models/swin_window.c)
 * cudnn_dl.cu     cuDNN, opened with dlopen at the first convolution
 * conv.cu         convolutions through cuDNN, fp32 NCHW and bf16 NHWC (src/nn/conv2d.c)
 * batchnorm.cu    visc_batchnorm2d_* with the fused ReLU, fp32 or bf16 activations
 *                 (src/nn/batchnorm2d.c)
 * pool.cu         max pooling, global average pooling, ReLU (src/nn/pool2d.c,
 *                 global_pool.c, eltwise.c); the poolings on bf16 NHWC too
 * attention.cu    fused multi-head attention, forward and backward (src/nn/attention.c)
 * attention_tc.cu the same in bf16 on tensor cores: batched cuBLASLt products
 * swin.cu         Swin's bias gather / scatter, V2's head normalization and
 *                 temperature, patch merging, the token mean (models/swin_window.c,
 *                 nn/token_ops.c)
 * talking_heads.cu CaiT's talking-heads attention in steps, LayerScale
 *                 (models/talking_heads.c, nn/layerscale.c)
 * tokens.cu       patch embedding, the position table's add, drop-path, row copies
 *                 and sums (models/transformer_common.c, nn/token_ops.c, droppath.c)
 * comm.cu         gradients between GPUs: copies for the process group's
 *                 thread, and NCCL (opened with dlopen when a run asks for it)
 * profile.cu      GPU time per kind of work, from events after every call
 *
 * C++ (the .cu files) includes this through src/cuda/common.cuh, which
 * makes core.h's C11 _Noreturn readable to nvcc.
 *
 * Conventions. Pointers to tensors are device pointers (visc_cuda_alloc);
 * bf16 tensors are uint16_t arrays (the bits of the bfloat16). Work is
 * queued on the context's stream and runs in order; a call returns 0 once
 * it is queued, or -1 with visc_last_error() set (bad arguments, a failed
 * launch). Errors of the kernels themselves surface at the next
 * visc_cuda_sync or copy. Reductions (column sums, the mean loss) use a
 * fixed split, so a result does not depend on timing: the same inputs give
 * the same bits (convolutions too: cuDNN is held to deterministic
 * algorithms). No device memory is allocated during a step except the
 * context's scratch buffer and cuDNN workspace, which grow on first use of
 * a shape and are then kept (the matrix product still builds its cuBLASLt
 * descriptors per call, in host memory, until plans are cached per shape;
 * convolutions already keep theirs per shape).
 *
 * The engine reaches these through src/gpu/ (gpu.h): a model on the GPU
 * calls the layers' GPU twins there, which call these.
 *
 * Verified on a GPU: not yet. Every kernel compiles warning-free for sm_90
 * and tests/gpu/test_cuda_kernels.c (kernels) and test_cuda_model.c (whole
 * ResNets) are ready to compare them, but no GPU run has happened. */
#ifndef VISC_CUDA_H
#define VISC_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "optim.h" /* C linkage for C++ too: core.h has no extern "C" of its own */
#include "tokens.h"

/* ---- context.cu ---- */
/* Number of usable CUDA devices; -1 with the runtime's reason (no driver,
 * no device) in visc_last_error(). Never aborts on a machine without a GPU. */
int visc_cuda_device_count(void);
/* One line about device `dev` ("NVIDIA H200, sm_90, 132 SMs, 139.8 GiB"). */
int visc_cuda_describe(int dev, char *buf, size_t len);

typedef struct visc_cuda visc_cuda;
/* Makes `dev` current and creates its stream (cuBLASLt's handle and
 * workspace come with the first matrix product); NULL with
 * visc_last_error() set, also when the device is not the generation the
 * library was compiled for (CUDA_ARCH). */
visc_cuda *visc_cuda_open(int dev);
void visc_cuda_close(visc_cuda *ctx);
/* Waits for the queued work; -1 if any of it failed. */
int visc_cuda_sync(visc_cuda *ctx);
/* The precision of the context's linear layers (linear.cu; fp32 until
 * set): with on = 1 they multiply bf16 copies of their operands with fp32
 * accumulation, their tensors staying fp32. The engine's GPU layers also
 * pick a CNN's activation form from it (gpu.h's visc_gpu_cnn_act). */
void visc_cuda_set_bf16(visc_cuda *ctx, int on);
int visc_cuda_bf16(const visc_cuda *ctx);
/* Bytes per value of the operand form: what the *_operand_* calls and
 * visc_cuda_gelu_linear_act write for a linear layer to read (2, bf16,
 * under bf16; 4 otherwise). A model plans those buffers at that size. */
int visc_cuda_operand_bytes(const visc_cuda *ctx);

void *visc_cuda_alloc(visc_cuda *ctx, size_t bytes); /* NULL with the error set */
/* The memory-bound kernels (batch norm, the bf16 sums) move 16 bytes a
 * thread where the tensors allow it; off, one value a thread (also
 * VISC_CUDA_VECTOR=off when the context opens): the same formulas (batch
 * norm's sums in another fixed order), a way round the wide accesses
 * should they fail on a device. */
void visc_cuda_set_vector_access(visc_cuda *ctx, int on);
/* Convolution algorithms: by default cuDNN's heuristic's first
 * deterministic choice per shape, the same on every run; on (as PyTorch's
 * cudnn.benchmark), the fastest deterministic one that cuDNN's timed
 * search finds at a shape's first use, which may differ from run to run
 * and so give other last bits. A shape's choice is kept: set this before
 * its first convolution. */
void visc_cuda_set_conv_benchmark(visc_cuda *ctx, int on);
/* Products with a bias take it in cuBLASLt's epilogue; where cuBLASLt has
 * no algorithm for that, the bias is added by a kernel (a note says so
 * once). Off, always by the kernel: the kernel test's way to that path. A
 * shape's choice is kept: set this before its first product. */
void visc_cuda_set_bias_epilogue(visc_cuda *ctx, int on);
/* Device memory in use on the context's device (all processes), in bytes. */
int visc_cuda_memory_used(visc_cuda *ctx, size_t *used);
/* The bytes of device memory this context holds through visc_cuda_alloc
 * (every buffer of the backend and of the models: weights, gradients,
 * optimizer state, the arena, workspaces), now and at most since it was
 * opened: the measure of PyTorch's torch.cuda.memory_allocated and
 * max_memory_allocated (no CUDA context, no libraries' code, no rounding
 * of the driver's). Either pointer may be NULL. */
void visc_cuda_memory_allocated(visc_cuda *ctx, size_t *now, size_t *peak);
void visc_cuda_free(visc_cuda *ctx, void *p);
/* Copies that wait for the stream (host memory may be pageable). */
int visc_cuda_upload(visc_cuda *ctx, void *dst, const void *src, size_t bytes);
int visc_cuda_download(visc_cuda *ctx, void *dst, const void *src, size_t bytes);
/* Profiling: where a step's GPU time goes (profile.cu). From _start on,
 * every kernel and cuDNN / cuBLASLt call on the context's stream is timed
 * by an event after it, the interval since the previous one charged to
 * its name; _report stops it and prints the time per kind of work divided
 * by `steps`, longest first. One context at a time; it costs the host a
 * few microseconds a call and a wait every 1024 calls, so measure speed
 * with it off. */
int visc_cuda_profile_start(visc_cuda *ctx);
int visc_cuda_profile_report(visc_cuda *ctx, FILE *f, int steps);
/* Copies beside the kernels. A batch can cross the bus while the previous
 * step computes: visc_cuda_upload_async queues it on the context's second
 * stream (the copy engine's), ordered against the kernels by events. An
 * event marks a point in a stream's work; it is done when the work queued
 * before that point has run (one never recorded is done). */
typedef struct visc_cuda_event visc_cuda_event;
visc_cuda_event *visc_cuda_event_create(visc_cuda *ctx);          /* NULL with the error set */
void visc_cuda_event_destroy(visc_cuda *ctx, visc_cuda_event *e); /* NULL: nothing */
/* e marks the kernels queued so far. */
int visc_cuda_event_record(visc_cuda *ctx, visc_cuda_event *e);
/* The host waits for e; -1 if the work before it failed. */
int visc_cuda_event_wait(visc_cuda *ctx, visc_cuda_event *e);
/* Queues on the copy stream: once `after` is done (NULL: at once), the copy
 * of src (page-locked host memory, else the driver stages it first) to
 * dst; then records `done` there and makes every kernel queued after this
 * call wait for it. The host leaves src alone until `done` is done. */
int visc_cuda_upload_async(visc_cuda *ctx, void *dst, const void *src, size_t bytes,
                           visc_cuda_event *after, visc_cuda_event *done);
/* Page-locks host memory the program already has (cudaHostRegister), so
 * that copies from it run at the bus's speed instead of through the
 * driver's pageable staging (the batch: 154 MB a step for ResNet-50 at
 * batch 256). Unregister before the memory is freed or the context closed. */
int visc_cuda_host_register(visc_cuda *ctx, void *p, size_t bytes);
int visc_cuda_host_unregister(visc_cuda *ctx, void *p);
/* input.cu: a batch of bytes (3-plane CHW images, the loader's byte form)
 * to the model's input floats, as visc_normalize_bytes (transforms.h), bit
 * for bit. */
int visc_cuda_normalize_bytes(visc_cuda *ctx, float *out, const uint8_t *in, size_t images,
                              size_t plane, const float mean[3], const float std[3]);

/* ---- comm.cu: gradients between GPUs (src/gpu/comm.c) ----
 * Beside the kernels, on a stream of their own (visc_cuda_comm_init makes
 * it), one of two ways:
 *   through host memory: the process group's communication thread waits
 *     for the point in the kernels' work where a bucket of gradients is
 *     final (an event), downloads it, has the group's backend (MPI) reduce
 *     it, and uploads the result (visc_cuda_comm_download / _upload: for
 *     any thread, each returns once its copy is done);
 *   NCCL (libnccl.so.2, dlopen): the all-reduce runs on the device, on
 *     NCCL's own stream after the kernels queued so far, and the kernels
 *     queued after visc_cuda_nccl_join wait for it; the host never waits. */
int visc_cuda_comm_init(visc_cuda *ctx);
/* Waits for `after` (NULL: nothing), then copies; host memory from
 * visc_cuda_host_alloc. */
int visc_cuda_comm_download(visc_cuda *ctx, void *host, const void *dev, size_t bytes,
                            visc_cuda_event *after);
int visc_cuda_comm_upload(visc_cuda *ctx, void *dev, const void *host, size_t bytes);
/* Page-locked host memory of its own (cudaMallocHost); NULL with the error. */
void *visc_cuda_host_alloc(visc_cuda *ctx, size_t bytes);
void visc_cuda_host_free(visc_cuda *ctx, void *p); /* NULL: nothing */
/* 1 once the work before e has run (or e was never recorded), 0 while it
 * has not, -1 if it failed; from any thread. */
int visc_cuda_event_query(visc_cuda *ctx, visc_cuda_event *e);
/* Which physical GPU the context is on ("0000:1b:00.0", the PCI bus id),
 * so that ranks can tell whether they share one. */
int visc_cuda_device_id(visc_cuda *ctx, char *buf, size_t len);

#define VISC_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */
/* 0 once NCCL is loaded (thread-safe, loads once); -1 with why. */
int visc_cuda_nccl_load(void);
/* A new communicator's name, made by one rank and handed to every other. */
int visc_cuda_nccl_unique_id(unsigned char id[VISC_NCCL_ID_BYTES]);
/* Joins the communicator of `world` ranks that id names, as `rank`, on
 * ctx's device: every rank calls it at about the same time (it waits for
 * all of them). One per context; visc_cuda_close ends it. */
int visc_cuda_nccl_open(visc_cuda *ctx, const unsigned char id[VISC_NCCL_ID_BYTES], int world,
                        int rank);
/* Queues, after the kernels queued so far, the sum over the ranks of buf
 * [count] (device floats, in place), then buf *= scale (1: not). */
int visc_cuda_nccl_allreduce(visc_cuda *ctx, float *buf, size_t count, float scale);
/* Queues the same way dst [world * count] = every rank's src [count], rank
 * r's at r * count. */
int visc_cuda_nccl_allgather(visc_cuda *ctx, float *dst, const float *src, size_t count);
/* Records `done` after the all-reduces queued so far (a point to watch)... */
int visc_cuda_nccl_mark(visc_cuda *ctx, visc_cuda_event *done);
/* ... and makes every kernel queued from now on wait for it. */
int visc_cuda_nccl_join(visc_cuda *ctx, visc_cuda_event *done);
/* NCCL's asynchronous error (a peer gone, a network failure): 0, or -1 with it. */
int visc_cuda_nccl_check(visc_cuda *ctx);
/* Ends the communicator at once (ncclCommAbort), from any thread: for a
 * run that gives up on a peer that never comes. */
void visc_cuda_nccl_abort(visc_cuda *ctx);

/* ---- layernorm.cu: as visc_layernorm_forward/backward (gamma, beta may be NULL) ---- */
int visc_cuda_layernorm_forward(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                const float *in, const float *gamma, const float *beta,
                                int64_t rows, int C, float eps);
int visc_cuda_layernorm_backward(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                 const float *dout, const float *in, const float *gamma,
                                 const float *save_mean, const float *save_rstd, int64_t rows,
                                 int C);
/* as visc_layernorm_backward_add: din += the input's gradient */
int visc_cuda_layernorm_backward_add(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                     const float *dout, const float *in, const float *gamma,
                                     const float *save_mean, const float *save_rstd, int64_t rows,
                                     int C);

/* ---- softmax_xent.cu: as visc_softmax_xent_forward/backward ----
 * The mean loss is written to *loss (one device float), not returned, so
 * that a step never waits for the device. */
int visc_cuda_softmax_xent_forward(visc_cuda *ctx, float *loss, float *probs, const float *logits,
                                   const int32_t *labels, int N, int K, float smoothing);
int visc_cuda_softmax_xent_backward(visc_cuda *ctx, float *dlogits, const float *probs,
                                    const int32_t *labels, int N, int K, float smoothing);
/* As visc_softmax_xent_soft_forward/backward (src/nn/loss_soft.c): soft
 * targets [N, K] (mixup, cutmix). */
int visc_cuda_softmax_xent_soft_forward(visc_cuda *ctx, float *loss, float *probs,
                                        const float *logits, const float *targets, int N, int K);
int visc_cuda_softmax_xent_soft_backward(visc_cuda *ctx, float *dlogits, const float *probs,
                                         const float *targets, int N, int K);
/* As visc_topk_correct: counts[0] the samples whose label ranks first,
 * counts[1] within the first min(5, K) (two device int32). A label out of
 * [0, K) counts in neither. */
int visc_cuda_topk_correct(visc_cuda *ctx, int32_t *counts, const float *logits,
                           const int32_t *labels, int N, int K);

/* ---- contrastive.cu: as visc_l2_normalize_*, visc_infonce_forward_backward
 * and visc_ntxent_forward_backward (ssl.h) ----
 * The rows of x [n, D] to unit length: y, and each row's norm (the sum of
 * squares in double); backward of dy scaled by `scale` first (a loss's
 * weight: the CPU scales dy, then normalizes it back), dx may be dy. */
int visc_cuda_l2_normalize_forward(visc_cuda *ctx, float *y, float *norms, const float *x, int n,
                                   int D);
int visc_cuda_l2_normalize_backward(visc_cuda *ctx, float *dx, const float *dy, const float *y,
                                    const float *norms, int n, int D, float scale);
/* InfoNCE: queries q [n, D] against their keys k [n, D] (the positives) and the
 * bank [K, D] (the negatives), logits scaled by 1 / t: the mean loss into
 * *loss (one device float) and, when dq is not NULL, its gradient
 * dq [n, D]. The products are fp32 (never TF32, whatever the context's
 * precision: the CPU's are sgemms), the row sums in double as the CPU's,
 * the mean in a fixed order. work: visc_cuda_infonce_work_floats(n, K)
 * floats of device memory (the caller's, planned once). */
static inline size_t visc_cuda_infonce_work_floats(int n, int K) {
    return (size_t)n * ((size_t)K + 2);
}
int visc_cuda_infonce(visc_cuda *ctx, float *loss, float *dq, const float *q, const float *k,
                      const float *bank, int n, int K, int D, float t, float *work);
/* NT-Xent, as visc_ntxent_local (ssl.h): z [2n, D] this rank's rows (view 0
 * of its n samples, then view 1), all [2N, D] every rank's (N = n * world;
 * all == z with N == n), grouped by view, this rank's at rank * n in each;
 * each row is classified among the other 2N - 1 by its partner view,
 * logits scaled by 1 / t. The mean loss over the 2n rows into *loss, and
 * when dz is not NULL the gradient through the rows as anchors into
 * dz [2n, D] and through every row as a candidate into dall [2N, D]; with
 * N == n, dall may be NULL: the two are summed into dz (the whole gradient
 * of one rank's loss). fp32 products, as InfoNCE's. work:
 * visc_cuda_ntxent_work_floats(n, N) floats of device memory. */
static inline size_t visc_cuda_ntxent_work_floats(int n, int N) {
    return (size_t)2 * n * (2 * (size_t)N + 1);
}
int visc_cuda_ntxent(visc_cuda *ctx, float *loss, float *dz, float *dall, const float *z,
                     const float *all, int n, int N, int rank, int D, float t, float *work);

/* ---- gelu.cu: exact (erf) GELU, as visc_gelu_forward/backward ---- */
int visc_cuda_gelu_forward(visc_cuda *ctx, float *out, const float *in, size_t n);
/* GELU from bf16 into bf16 (each value rounded once), and its backward
 * from a bf16 input: an MLP's hidden layer in the operand form */
int visc_cuda_gelu_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *in, size_t n);
int visc_cuda_gelu_backward_bf16(visc_cuda *ctx, float *din, const float *dout, const uint16_t *in,
                                 size_t n);
int visc_cuda_gelu_backward(visc_cuda *ctx, float *din, const float *dout, const float *in,
                            size_t n);
/* The epilogue of an MLP's first linear layer over [rows, C]:
 * out = gelu(in + bias), written as fp32 (out) and/or bf16 (out_bf16, the
 * next product's operand); either may be NULL, and bias too (gelu(in)). */
int visc_cuda_bias_gelu_forward(visc_cuda *ctx, float *out, uint16_t *out_bf16, const float *in,
                                const float *bias, int64_t rows, int C);
/* din = dout * gelu'(in + bias); dbias = column sums of din (NULL: skipped). */
int visc_cuda_bias_gelu_backward(visc_cuda *ctx, float *din, float *dbias, const float *dout,
                                 const float *in, const float *bias, int64_t rows, int C);

/* ---- gelu_linear.cu: as visc_gelu_linear_* (tokens.h), the MLP's second half ----
 * out = GELU(h) W^T + b, act ([N, hidden] floats of device storage) keeping
 * GELU(h) for backward: fp32; or in bf16 (visc_cuda_set_bf16) the bf16
 * values the products take, written straight by the GELU (no fp32 copy, no
 * rounding pass), as the CPU's bf16 mode keeps it. _act makes act alone,
 * as forward leaves it (the layer's shape and bias, which decide the form
 * on a CPU, are the stand-in's: the GPU's form is the precision's alone). Backward overwrites dh,
 * dW and db (db: NULL when forward had no bias). Under bf16 h is in the
 * operand form too (bf16: fc1 wrote it so, visc_cuda_linear_operands_forward
 * or _forward_to_operand), here and in visc_cuda_mlp_backward. */
int visc_cuda_gelu_linear_forward(visc_cuda *ctx, float *out, float *act, const float *h,
                                  const float *weight, const float *bias, int N, int hidden,
                                  int out_features);
int visc_cuda_gelu_linear_act(visc_cuda *ctx, float *act, const float *h, int N, int hidden,
                              int out_features, int has_bias);
int visc_cuda_gelu_linear_backward(visc_cuda *ctx, float *dh, float *dweight, float *dbias,
                                   const float *dout, const float *act, const float *h,
                                   const float *weight, int N, int hidden, int out_features);
/* The whole MLP's backward, fc2(GELU(fc1(in))) with h = fc1's output and
 * act as _forward left it, from the output's gradient dout: the same bits
 * as visc_cuda_gelu_linear_backward into dact and then
 * visc_cuda_linear_operand_backward of fc1 (in: fc1's input in the
 * operand form). Under bf16 the GELU's gradient goes straight into fc1's
 * bf16 dY, in the pass that sums fc1's db: 2 of the 5 passes the two
 * calls made over the [N, hidden] gradient are gone (the fp32 dY the GELU
 * backward wrote and the rounding pass read again). dact:
 * [N, hidden] floats of scratch (fc2's dX). Overwrites every gradient. */
int visc_cuda_mlp_backward(visc_cuda *ctx, float *din, float *dweight1, float *dbias1,
                           float *dweight2, float *dbias2, float *dact, const float *dout,
                           const float *in, const float *h, const float *act, const float *weight1,
                           const float *weight2, int N, int in_features, int hidden,
                           int out_features);

/* ---- optim.cu: fused AdamW / SGD steps over the flat parameter buffer ----
 * Built from a CPU optimizer (visc_optimizer_init): its kind, settings and
 * per-tensor weight decay (no decay for norm weights and biases unless
 * --decay-norm-bias), uploaded once. `state` holds the optimizer's slots
 * laid out as on the CPU (momentum; AdamW: first then second moment), so a
 * checkpoint moves between devices unchanged. `step` counts the steps
 * completed before this one (visc_optimizer.step). The arithmetic is the
 * CPU's, operation for operation in the same order and rounding. */
typedef struct visc_cuda_optim visc_cuda_optim;
/* Every kind: SGD and AdamW give the CPU's bits; LARS and LAMB, whose
 * per-tensor norms add in another order, the CPU's step to a rounding of
 * those norms. NULL with the error set (out of device memory). */
visc_cuda_optim *visc_cuda_optim_create(visc_cuda *ctx, const visc_optimizer *cpu);
int visc_cuda_optim_step(visc_cuda_optim *opt, float *params, const float *grads, float *state,
                         float lr, int64_t step);
void visc_cuda_optim_destroy(visc_cuda_optim *opt);
/* ema = decay * ema + (1 - decay) * params, as visc_ema_update (MoCo's
 * momentum encoder, the EMA of the weights), bit for bit. */
int visc_cuda_ema_update(visc_cuda *ctx, float *ema, const float *params, size_t n, float decay);
/* As visc_clip_grad_norm: grads *= max_norm / (||grads|| + 1e-6) where that
 * is below 1, the norm over n floats in clip.c's 256 fixed chunks (double
 * sums); the coefficient is made and applied on the device (nothing waits
 * for it), through the context's scratch. */
int visc_cuda_clip_grad_norm(visc_cuda *ctx, float *grads, size_t n, float max_norm);

/* ---- convert.cu: round to nearest even, as visc_f32_to_bf16 ---- */
int visc_cuda_f32_to_bf16(visc_cuda *ctx, uint16_t *out, const float *in, size_t n);
int visc_cuda_bf16_to_f32(visc_cuda *ctx, float *out, const uint16_t *in, size_t n);
/* With the layout change of channels-last, per image: in [N, C, HW] fp32
 * -> out [N, HW, C] bf16 (a weight [K, C, R, S] -> [K, R, S, C] likewise),
 * and back, out = beta out + value (beta 0: out is not read). N <= 65535. */
int visc_cuda_nchw_to_nhwc_bf16(visc_cuda *ctx, uint16_t *out, const float *in, int N, int C,
                                int HW);
int visc_cuda_nhwc_bf16_to_nchw(visc_cuda *ctx, float *out, const uint16_t *in, int N, int C,
                                int HW, float beta);

/* ---- matmul.cu: cuBLASLt, row-major ----
 * D[M, N] = op(A)[M, K] op(B)[K, N] (+ beta D) (+ bias[N] on every row),
 * A and B bf16, accumulation and D fp32. trans_a: A is stored [K, M];
 * trans_b: B is stored [N, K]. So a linear layer is
 *   forward  Y = X W^T + b   (A = X, B = W, trans_b = 1, bias = b)
 *   dX = dY W                (A = dY, B = W)
 *   dW += dY^T X             (A = dY, trans_a = 1, B = X, beta = 1)
 * The algorithm is cuBLASLt's first heuristic choice for the shape and for
 * the alignment the four pointers really have (a tensor may start anywhere
 * inside a larger buffer), within the context's workspace (32 MiB). With
 * beta 0, D's old contents are never read. */
int visc_cuda_matmul_bf16(visc_cuda *ctx, float *D, const uint16_t *A, const uint16_t *B,
                          const float *bias, int M, int N, int K, int trans_a, int trans_b,
                          float beta);
/* The same into a bf16 D (beta 0) with a bf16 bias (or NULL): the fp32
 * sums plus the bias, rounded once. */
int visc_cuda_matmul_bf16_to_bf16(visc_cuda *ctx, uint16_t *D, const uint16_t *A, const uint16_t *B,
                                  const uint16_t *bias, int M, int N, int K, int trans_a,
                                  int trans_b);

/* The same in full fp32 (operands, accumulation, output; never TF32). */
int visc_cuda_matmul_f32(visc_cuda *ctx, float *D, const float *A, const float *B,
                         const float *bias, int M, int N, int K, int trans_a, int trans_b,
                         float beta);
/* `batch` such products of bf16 operands at once, D_i = alpha op(A_i)
 * op(B_i) + beta D_i, no bias: matrix i of each operand starts stride_*
 * elements after matrix i - 1, and its rows are ld* elements apart
 * (attention's products over every sequence and head). */
typedef struct {
    const uint16_t *A, *B;
    float *D;
    int M, N, K, trans_a, trans_b, batch;
    int64_t lda, ldb, ldd;
    int64_t stride_a, stride_b, stride_d;
    float alpha, beta;
} visc_cuda_products;
int visc_cuda_matmul_bf16_batched(visc_cuda *ctx, const visc_cuda_products *p);

/* ---- linear.cu: as visc_linear_forward/backward (din, dbias may be NULL) ----
 * In the context's precision (visc_cuda_set_bf16, in context.cu): fp32, or
 * bf16 as in the CPU's bf16 mode: X, W and dY are rounded to bf16 (to
 * nearest even) for the three products only, in the context's scratch,
 * with fp32 accumulation and fp32 outputs; the bias and its gradient (the
 * column sum of dY) stay fp32. */
int visc_cuda_linear_forward(visc_cuda *ctx, float *out, const float *in, const float *weight,
                             const float *bias, int N, int in_features, int out_features);
int visc_cuda_linear_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                              const float *dout, const float *in, const float *weight, int N,
                              int in_features, int out_features);
/* The bf16 forms with X given already rounded to bf16 (by its producer:
 * gelu_linear.cu), as linear_bf16.h's *_rounded: whatever the context's
 * precision. */
int visc_cuda_linear_forward_rounded(visc_cuda *ctx, float *out, const uint16_t *in,
                                     const float *weight, const float *bias, int N, int in_features,
                                     int out_features);
int visc_cuda_linear_backward_rounded(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                                      const float *dout, const uint16_t *in, const float *weight,
                                      int N, int in_features, int out_features);
/* A layer norm whose output only a linear layer reads (its input in
 * forward and in its weight gradient): written in the context's operand
 * form, fp32 or under bf16 the bf16 values the products take, in out's
 * storage (no fp32 copy, no rounding pass; the statistics stay fp32); and
 * the linear layer that reads its input in that form. */
int visc_cuda_layernorm_operand_forward(visc_cuda *ctx, float *out, float *save_mean,
                                        float *save_rstd, const float *in, const float *gamma,
                                        const float *beta, int64_t rows, int C, float eps);
int visc_cuda_linear_operand_forward(visc_cuda *ctx, float *out, const float *in,
                                     const float *weight, const float *bias, int N, int in_features,
                                     int out_features);
int visc_cuda_linear_operand_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                                      const float *dout, const float *in, const float *weight,
                                      int N, int in_features, int out_features);
/* The linear layer with its output in the operand form too (bf16 under
 * bf16: the products' fp32 sums plus the bias rounded to bf16, rounded
 * once, as autocast's): Q, K and V for attention (visc_attention's
 * qkv_operand), an MLP's hidden layer for GELU (visc_cuda_gelu_linear_*).
 * Its backward is visc_cuda_linear_operand_backward. */
int visc_cuda_linear_operands_forward(visc_cuda *ctx, float *out, const float *in,
                                      const float *weight, const float *bias, int N,
                                      int in_features, int out_features);
/* The same from an fp32 input (Swin V2's MLP, after its post-norm). */
int visc_cuda_linear_forward_to_operand(visc_cuda *ctx, float *out, const float *in,
                                        const float *weight, const float *bias, int N,
                                        int in_features, int out_features);

/* ---- eltwise.cu ---- */
/* out = a + b (out may alias a or b), as visc_add_forward */
int visc_cuda_add(visc_cuda *ctx, float *out, const float *a, const float *b, size_t n);
/* out = relu(out + identity): the end of a residual block */
int visc_cuda_add_relu(visc_cuda *ctx, float *out, const float *identity, size_t n);
/* din = a + b where out > 0, else 0, as visc_add_relu_backward (din may
 * alias a or b) */
int visc_cuda_add_relu_backward(visc_cuda *ctx, float *din, const float *a, const float *b,
                                const float *out, size_t n);
/* The same on bf16 tensors (the sum in fp32, rounded to bf16). */
int visc_cuda_add_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *a, const uint16_t *b,
                       size_t n);
int visc_cuda_add_relu_bf16(visc_cuda *ctx, uint16_t *out, const uint16_t *identity, size_t n);
/* din = dout where out > 0, else 0 (din may alias dout) */
int visc_cuda_relu_backward_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *dout,
                                 const uint16_t *out, size_t n);
int visc_cuda_add_relu_backward_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *a,
                                     const uint16_t *b, const uint16_t *out, size_t n);
int visc_cuda_zero(visc_cuda *ctx, void *p, size_t bytes);
int visc_cuda_copy(visc_cuda *ctx, void *dst, const void *src, size_t bytes);

/* ---- swin_window.cu: as visc_swin_partition / visc_swin_reverse ----
 * The grid as visc_swin_grid_make gives it (src/models/swin_window.h). */
typedef struct {
    int H, W, wh, ww, sh, sw;
} visc_cuda_swin_grid;
int visc_cuda_swin_partition(visc_cuda *ctx, float *out, const float *in,
                             const visc_cuda_swin_grid *g, int B, int C);
int visc_cuda_swin_reverse(visc_cuda *ctx, float *out, const float *in,
                           const visc_cuda_swin_grid *g, int B, int C);
/* The partition into the operand form (visc_cuda_operand_bytes: bf16
 * under bf16, each value rounded once), and acc += the reverse of in. */
int visc_cuda_swin_partition_operand(visc_cuda *ctx, float *out, const float *in,
                                     const visc_cuda_swin_grid *g, int B, int C);
int visc_cuda_swin_reverse_add(visc_cuda *ctx, float *acc, const float *in,
                               const visc_cuda_swin_grid *g, int B, int C);
/* A residual sum whose branch is in windowed order: visc_cuda_swin_reverse
 * of branch, then visc_cuda_droppath_add_forward (all_kept: _kept) of it,
 * in one pass (out may be x). */
int visc_cuda_droppath_add_from_windows(visc_cuda *ctx, float *out, const float *x,
                                        const float *branch, float *keep, int all_kept,
                                        const visc_cuda_swin_grid *g, int B, int C);
/* (linear.cu) Swin V1's output projection backward from its output's
 * gradient dout in token order, [B H W, out_features]:
 * visc_cuda_swin_partition of dout into `windowed` (as many floats, the
 * caller's), then visc_cuda_linear_operand_backward from it, with the
 * same bits. Under bf16 the partition is gathered by the pass that rounds
 * dY and sums db, and `windowed` is not written. din may be dout. */
int visc_cuda_linear_operand_backward_from_windows(visc_cuda *ctx, float *din, float *dweight,
                                                   float *dbias, const float *dout, float *windowed,
                                                   const visc_cuda_swin_grid *g, int B,
                                                   const float *in, const float *weight,
                                                   int in_features, int out_features);
/* (layernorm.cu) Swin V1's first norm and the partition after it in one
 * pass: visc_cuda_layernorm_operand_forward of the [B H W, C] token rows
 * `in`, each output row written at its windowed place (out as
 * visc_cuda_swin_partition would make it); the statistics stay in token
 * order. And its backward: dout in windowed order, visc_cuda_swin_reverse
 * then visc_cuda_layernorm_backward_add (din, the residual stream's
 * gradient, takes the branch's; it and the statistics in token order). */
int visc_cuda_layernorm_operand_to_windows(visc_cuda *ctx, float *out, float *save_mean,
                                           float *save_rstd, const float *in, const float *gamma,
                                           const float *beta, const visc_cuda_swin_grid *g, int B,
                                           int C, float eps);
int visc_cuda_layernorm_backward_from_windows_add(visc_cuda *ctx, float *din, float *dgamma,
                                                  float *dbeta, const float *dout, const float *in,
                                                  const float *gamma, const float *save_mean,
                                                  const float *save_rstd,
                                                  const visc_cuda_swin_grid *g, int B, int C);
/* (layernorm.cu) Swin V2's post-norm of the output projection, whose rows
 * are in windowed order, and the reverse before it, in one pass: `in`
 * windowed, out (fp32) in token order, as visc_cuda_swin_reverse then
 * visc_cuda_layernorm_forward. And its backward to windowed order: dout
 * in token order, din and in windowed (din not dout). The statistics are
 * at the input's rows: windowed order (V1's pair keeps them in token order). */
int visc_cuda_layernorm_from_windows(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                     const float *in, const float *gamma, const float *beta,
                                     const visc_cuda_swin_grid *g, int B, int C, float eps);
int visc_cuda_layernorm_backward_to_windows(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                            const float *dout, const float *in, const float *gamma,
                                            const float *save_mean, const float *save_rstd,
                                            const visc_cuda_swin_grid *g, int B, int C);

/* ---- conv.cu: cuDNN convolutions (dilation 1, groups 1, no bias: ResNets) ----
 * Two forms: fp32 in NCHW (x [N, C, H, W], w [K, C, R, S], y [N, K, P, Q],
 * as visc_conv2d), computed with FMA math only, never TF32, so it agrees
 * with the CPU to fp32 rounding; and bf16 channels-last (x [N, H, W, C],
 * w [K, R, S, C], y [N, P, Q, K]) with fp32 accumulation on tensor cores.
 * A third has the second one's tensors and fp32 weights [K, C, R, S] (a
 * model's master weights and their gradient): the weights are copied to
 * bf16 [K, R, S, C] in the scratch for forward and backward-data, and the
 * bf16 weight gradient is converted back.
 * P = (H + 2 pad - R) / stride + 1, likewise Q. The algorithm of each
 * direction is cuDNN's first deterministic heuristic choice that fits the
 * workspace, cached per shape with its descriptors (the context keeps the
 * 64 most recent shapes); the workspace is the context's, grown on the
 * first use of a shape. cuDNN is opened (dlopen) by the first call. */
typedef enum {
    VISC_CUDA_CONV_F32_NCHW = 0,
    VISC_CUDA_CONV_BF16_NHWC = 1,
    VISC_CUDA_CONV_BF16_NHWC_F32W = 2 /* bf16 channels-last tensors, fp32 weights */
} visc_cuda_conv_type;
typedef struct {
    int N, C, H, W; /* input */
    int K, R, S;    /* output channels, kernel height, width */
    int stride, pad;
    visc_cuda_conv_type type;
} visc_cuda_conv_shape;
int visc_cuda_conv_forward(visc_cuda *ctx, const visc_cuda_conv_shape *s, void *y, const void *x,
                           const void *w);
int visc_cuda_conv_backward_data(visc_cuda *ctx, const visc_cuda_conv_shape *s, void *dx,
                                 const void *dy, const void *w);
/* dw = beta dw + the gradient (beta 0: dw's old contents are not read). */
int visc_cuda_conv_backward_weights(visc_cuda *ctx, const visc_cuda_conv_shape *s, void *dw,
                                    const void *x, const void *dy, float beta);

/* ---- batchnorm.cu: as visc_batchnorm2d_* (PyTorch semantics) ----
 * Over [N, C, HW] (nchw = 1, the CPU's layout) or [N, HW, C] (nchw = 0,
 * channels-last); the activations (in, out, dout, din) fp32, or bf16 with
 * bf16 = 1 (each value read as fp32, the arithmetic as for fp32, each
 * result rounded to bf16); statistics, parameters and their gradients
 * fp32 always. Training: batch statistics, save_mean and save_rstd
 * (1/sqrt(var + eps)) kept for backward, running statistics updated with
 * `momentum` and the unbiased variance (or left alone when NULL: a
 * recomputed forward); relu = 1 fuses a following ReLU
 * (backward then masks with `out`). The sums are in double, each channel's
 * values cut into a number of ranges fixed by the shape, each range summed
 * by one block in a fixed tree and the ranges added in order: the same
 * inputs give the same bits. */
typedef struct {
    int N, C, HW, nchw, relu;
    float eps, momentum;
    int bf16;
} visc_cuda_bn_shape;
int visc_cuda_batchnorm_forward_train(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                      float *save_mean, float *save_rstd, const void *in,
                                      const float *gamma, const float *beta, float *running_mean,
                                      float *running_var);
int visc_cuda_batchnorm_forward_eval(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                     const void *in, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var);
/* A training forward's output again from its save_mean, save_rstd (and
 * the same gamma, beta), bit for bit: a normalized activation that
 * backward recomputes instead of keeping (visc_batchnorm2d_apply). */
int visc_cuda_batchnorm_apply(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                              const void *in, const float *gamma, const float *beta,
                              const float *save_mean, const float *save_rstd);
/* The same, then out = ReLU(y + residual) (relu = 1) or y + residual,
 * with y the norm's output in its stored form: the bits of the two passes
 * (visc_cuda_add_relu* after the norm) in one. */
int visc_cuda_batchnorm_forward_train_add(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                          float *save_mean, float *save_rstd, const void *in,
                                          const void *residual, const float *gamma,
                                          const float *beta, float *running_mean,
                                          float *running_var);
int visc_cuda_batchnorm_forward_eval_add(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *out,
                                         const void *in, const void *residual, const float *gamma,
                                         const float *beta, const float *running_mean,
                                         const float *running_var);
/* A residual that is a norm's output itself (a ResNet block's shortcut
 * norm, of the same shape and form as the block's last norm, no ReLU of
 * its own), made where it is read: from its input and its statistics
 * (training: the saved ones, visc_cuda_batchnorm_statistics's; evaluation:
 * the running ones and its eps) and parameters, each value in its stored
 * form, so the sum has the bits of that norm's output written by its own
 * pass and read back, without the tensor's write and read. */
typedef struct {
    const void *in;
    const float *mean, *rstd;                /* training */
    const float *running_mean, *running_var; /* evaluation */
    const float *gamma, *beta;
    float eps; /* evaluation */
} visc_cuda_bn_residual;
/* A training forward's statistics alone (saved and running; no output). */
int visc_cuda_batchnorm_statistics(visc_cuda *ctx, const visc_cuda_bn_shape *s, float *save_mean,
                                   float *save_rstd, const void *in, float *running_mean,
                                   float *running_var);
int visc_cuda_batchnorm_forward_train_add_norm(visc_cuda *ctx, const visc_cuda_bn_shape *s,
                                               void *out, float *save_mean, float *save_rstd,
                                               const void *in, const visc_cuda_bn_residual *rn,
                                               const float *gamma, const float *beta,
                                               float *running_mean, float *running_var);
int visc_cuda_batchnorm_forward_eval_add_norm(visc_cuda *ctx, const visc_cuda_bn_shape *s,
                                              void *out, const void *in,
                                              const visc_cuda_bn_residual *rn, const float *gamma,
                                              const float *beta, const float *running_mean,
                                              const float *running_var);
/* din may be NULL (parameter gradients only) or alias dout. out: the
 * forward's output, for the fused ReLU's mask; NULL: the mask from that
 * output made again from in, gamma, beta and the saved statistics (the
 * same bits where the output came from them: after a training forward),
 * one read of a tensor fewer in each of the two passes. */
int visc_cuda_batchnorm_backward(visc_cuda *ctx, const visc_cuda_bn_shape *s, void *din,
                                 float *dgamma, float *dbeta, const void *dout, const void *in,
                                 const void *out, const float *gamma, const float *beta,
                                 const float *save_mean, const float *save_rstd);
/* Synchronized statistics (SyncBN), as visc_batchnorm2d_sync_* (nn.h) in
 * the same order with the same acc (2C + 1 doubles on the host): each
 * pass copies what it needs of acc to the device and what it produces
 * back, so that the caller reduces acc over the processes between them;
 * the passes that fill acc return once it is there. */
int visc_cuda_bn_sync_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                           const void *in);
int visc_cuda_bn_sync_sqdev(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                            float *save_mean, const void *in);
int visc_cuda_bn_sync_finish(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                             void *out, float *save_mean, float *save_rstd, const void *in,
                             const float *gamma, const float *beta, float *running_mean,
                             float *running_var);
int visc_cuda_bn_sync_grad_sums(visc_cuda *ctx, const visc_cuda_bn_shape *s, double *acc,
                                float *dgamma, float *dbeta, const void *dout, const void *in,
                                const void *out, const float *save_mean, const float *save_rstd);
int visc_cuda_bn_sync_grad_input(visc_cuda *ctx, const visc_cuda_bn_shape *s, const double *acc,
                                 void *din, const void *dout, const void *in, const void *out,
                                 const float *gamma, const float *save_mean,
                                 const float *save_rstd);

/* ---- pool.cu: NCHW fp32, as src/nn/pool2d.c, global_pool.c, eltwise.c ----
 * Max pooling keeps the CPU's tie rule (the first maximum in window order
 * wins, a NaN propagates) and its argmax (the index within the (n, c)
 * plane); its backward gathers instead of scattering, adding in the CPU's
 * order, so all of these give the CPU's bits. */
int visc_cuda_maxpool_forward(visc_cuda *ctx, float *out, int32_t *argmax, const float *in, int N,
                              int C, int H, int W, int kernel, int stride, int pad);
int visc_cuda_maxpool_backward(visc_cuda *ctx, float *din, const float *dout, const int32_t *argmax,
                               int N, int C, int H, int W, int kernel, int stride, int pad);
int visc_cuda_global_avgpool_forward(visc_cuda *ctx, float *out, const float *in, int N, int C,
                                     int HW);
int visc_cuda_global_avgpool_backward(visc_cuda *ctx, float *din, const float *dout, int N, int C,
                                      int HW);
/* The same on bf16 channels-last tensors ([N, H, W, C]): max pooling's
 * argmax is the position h W + w in the image (per channel), its rule the
 * same; global average pooling sums each (n, c) in position order in fp32
 * into fp32 features [N, C], and its backward writes dout / HW rounded to
 * bf16. Max pooling takes no rounding: its outputs are its inputs. */
int visc_cuda_maxpool_forward_nhwc_bf16(visc_cuda *ctx, uint16_t *out, int32_t *argmax,
                                        const uint16_t *in, int N, int C, int H, int W, int kernel,
                                        int stride, int pad);
int visc_cuda_maxpool_backward_nhwc_bf16(visc_cuda *ctx, uint16_t *din, const uint16_t *dout,
                                         const int32_t *argmax, int N, int C, int H, int W,
                                         int kernel, int stride, int pad);
int visc_cuda_global_avgpool_forward_nhwc_bf16(visc_cuda *ctx, float *out, const uint16_t *in,
                                               int N, int C, int HW);
int visc_cuda_global_avgpool_backward_nhwc_bf16(visc_cuda *ctx, uint16_t *din, const float *dout,
                                                int N, int C, int HW);
int visc_cuda_relu_forward(visc_cuda *ctx, float *out, const float *in, size_t n);
/* Masked by the forward OUTPUT; din may alias dout. */
int visc_cuda_relu_backward(visc_cuda *ctx, float *din, const float *dout, const float *out,
                            size_t n);

/* ---- attention.cu: as visc_attention_forward/backward (tokens.h) ----
 * The same descriptor, its bias / mask / head_scale pointers on the device;
 * head dimension D up to 128. In fp32, fused kernels (flash-style: nothing
 * N x N is kept) on the CUDA cores; in bf16 (visc_cuda_set_bf16), fused
 * kernels on tensor cores for D up to 64 (attention_flash.cu), the six
 * products on tensor cores beyond (attention_tc.cu), both with bf16
 * operands and fp32 sums and results. They keep a workspace in the
 * context: fused (fp32 or bf16), 4 bytes per query row, and when dbias is
 * asked the score gradients of a group of sequences, at most 32 MiB (the
 * bias gradient is summed group by group); the products, the N x N
 * matrices of a chunk of sequences, at most 256 MiB. */
int visc_cuda_attention_forward(visc_cuda *ctx, const visc_attention *a, float *out, float *lse,
                                const float *q, const float *k, const float *v);
int visc_cuda_attention_backward(visc_cuda *ctx, const visc_attention *a, float *dq, float *dk,
                                 float *dv, float *dbias, float *dhead_scale, const float *dout,
                                 const float *q, const float *k, const float *v, const float *out,
                                 const float *lse);
/* The same with the output in the context's operand form (as
 * visc_cuda_layernorm_operand_forward's): fp32, or under bf16 the bf16
 * values the output projection multiplies (visc_cuda_linear_operand_*),
 * each rounded once, in out's storage at its strides; backward reads it so. */
int visc_cuda_attention_operand_forward(visc_cuda *ctx, const visc_attention *a, float *out,
                                        float *lse, const float *q, const float *k, const float *v);
int visc_cuda_attention_operand_backward(visc_cuda *ctx, const visc_attention *a, float *dq,
                                         float *dk, float *dv, float *dbias, float *dhead_scale,
                                         const float *dout, const float *q, const float *k,
                                         const float *v, const float *out, const float *lse);
/* The cap on those chunks and groups of N x N matrices, in bytes (0: the
 * defaults, 256 and 32 MiB); a chunk holds one sequence at least, a group
 * one period of the masks. Smaller saves memory and makes more, smaller
 * launches. */
void visc_cuda_set_attention_chunk(visc_cuda *ctx, size_t bytes);
/* 1 (the default): bf16 attention with heads of at most 64 dimensions runs
 * fused on tensor cores, forward and backward, with no N x N matrices
 * (attention_flash.cu: its workspace is the fp32 form's); 0: as the
 * products above. */
void visc_cuda_set_attention_fused(visc_cuda *ctx, int on);

/* ---- tokens.cu ---- */
/* The patch embedding, as visc_tf_patch_embed_*: Conv2d(kernel = stride =
 * patch, bias) on [B, in_channels, image, image], its output rows moved to
 * tokens row b * tokens + first + l. conv_out / dconv: [B, C, grid^2]. */
typedef struct {
    int B, in_channels, image, patch, C, tokens, first;
} visc_cuda_patch_shape;
int visc_cuda_patch_embed_forward(visc_cuda *ctx, const visc_cuda_patch_shape *p, float *tokens,
                                  float *conv_out, const float *image, const float *weight,
                                  const float *bias);
/* dweight, dbias overwritten; the image gets no gradient (the first layer). */
int visc_cuda_patch_embed_backward(visc_cuda *ctx, const visc_cuda_patch_shape *p, float *dweight,
                                   float *dbias, float *dconv, const float *dtokens,
                                   const float *image);
/* x[b] += table for b < B (rows of NC floats), as visc_add_broadcast_forward */
int visc_cuda_add_broadcast(visc_cuda *ctx, float *x, const float *table, int B, int64_t NC);
/* out[c] = sum over r < rows of a[r C + c] (a fixed order) */
int visc_cuda_sum_rows(visc_cuda *ctx, float *out, const float *a, int64_t rows, int C);
/* As visc_droppath_add_forward / backward with the keep factors [B] given
 * (drawn on the host by visc_droppath_keep, uploaded). */
int visc_cuda_droppath_add_forward(visc_cuda *ctx, float *out, const float *x, const float *branch,
                                   const float *keep, int B, size_t per_sample);
/* The same when no sample is dropped (eval, or a rate of 0): out = x +
 * branch, keep [B] set to 1s on the device, with no copy from the host (a
 * copy from pageable memory waits for the stream). */
int visc_cuda_droppath_add_kept(visc_cuda *ctx, float *out, const float *x, const float *branch,
                                float *keep, int B, size_t per_sample);
int visc_cuda_droppath_add_backward(visc_cuda *ctx, float *dbranch, const float *dx,
                                    const float *keep, int B, size_t per_sample);
/* rows x count floats, rows dst_stride / src_stride floats apart */
int visc_cuda_copy_rows(visc_cuda *ctx, float *dst, int64_t dst_stride, const float *src,
                        int64_t src_stride, int64_t rows, int count);

/* ---- swin.cu: as models/swin_window.h's block pieces, on the device ---- */
int visc_cuda_swin_gather_bias(visc_cuda *ctx, float *bias, const float *table, const int32_t *rel,
                               int H, int N, int sigmoid16);
int visc_cuda_swin_scatter_bias(visc_cuda *ctx, float *dtable, const float *dbias,
                                const float *bias, const int32_t *rel, int T, int H, int N,
                                int sigmoid16);
/* V2's q and k of the qkv projection's fp32 rows raw [rows, 3 H D]
 * normalized per head (visc_swin_normalize_qk) into qkv in the operand
 * form, v beside them (bf16 under bf16: what attention reads), the norms
 * [rows, H] into qnorm and knorm. And the normalization's backward, y (the
 * normalized values, ld_y apart) in the operand form. */
int visc_cuda_swin_qkv_operand(visc_cuda *ctx, float *qkv, float *qnorm, float *knorm,
                               const float *raw, int64_t rows, int H, int D);
int visc_cuda_swin_normalize_heads_backward(visc_cuda *ctx, float *dx, int64_t ld_dx,
                                            const float *dy, int64_t ld_dy, const float *y,
                                            int64_t ld_y, const float *norms, int64_t rows, int H,
                                            int D);
int visc_cuda_swin_merge_copy(visc_cuda *ctx, float *tokens, float *merged, int B, int H, int W,
                              int C, int back);
/* hs = exp(min(logit_scale, log 100)) [H]; backward: the clamp's gradient */
int visc_cuda_swin_head_scale(visc_cuda *ctx, float *hs, const float *logit_scale, int H);
int visc_cuda_swin_head_scale_backward(visc_cuda *ctx, float *dlogit_scale,
                                       const float *logit_scale, const float *dhs, const float *hs,
                                       int H);
/* as visc_token_mean_forward / backward (tokens.h) */
int visc_cuda_token_mean_forward(visc_cuda *ctx, float *out, const float *in, int B, int N, int C);
int visc_cuda_token_mean_backward(visc_cuda *ctx, float *din, const float *dout, int B, int N,
                                  int C);

/* ---- talking_heads.cu: as models/talking_heads.h's steps, and LayerScale ----
 * The qkv rows and att (th_apply's output) are in the operand form (bf16
 * under bf16: the projections' operands); the [B, H, T, T] ones are fp32. */
int visc_cuda_th_scores(visc_cuda *ctx, float *S, const float *qkv, const visc_th_dims *d);
int visc_cuda_th_mix(visc_cuda *ctx, float *out, const float *in, const float *W, const float *bias,
                     int B, int H, size_t TT, int transpose);
int visc_cuda_th_softmax(visc_cuda *ctx, float *P, size_t rows, int T);
int visc_cuda_th_apply(visc_cuda *ctx, float *att, const float *A, const float *qkv,
                       const visc_th_dims *d);
int visc_cuda_th_grad_a(visc_cuda *ctx, float *dA, const float *datt, const float *qkv,
                        const visc_th_dims *d);
int visc_cuda_th_grad_v(visc_cuda *ctx, float *dqkv, const float *A, const float *datt,
                        const visc_th_dims *d);
int visc_cuda_th_mix_grad(visc_cuda *ctx, float *dW, float *db, const float *dY, const float *X,
                          int B, int H, size_t TT);
int visc_cuda_th_softmax_backward(visc_cuda *ctx, float *dS, const float *P, size_t rows, int T);
int visc_cuda_th_grad_qk(visc_cuda *ctx, float *dqkv, const float *dS, const float *qkv,
                         const visc_th_dims *d);
/* as visc_layerscale_forward / backward (din, dgamma may be NULL; din may alias dout) */
int visc_cuda_layerscale_forward(visc_cuda *ctx, float *out, const float *in, const float *gamma,
                                 int64_t rows, int C);
int visc_cuda_layerscale_backward(visc_cuda *ctx, float *din, float *dgamma, const float *dout,
                                  const float *in, const float *gamma, int64_t rows, int C);

#ifdef __cplusplus
}
#endif

#endif

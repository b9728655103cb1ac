/* layers.c: the GPU twins of the layers in nn.h. Each takes the layer's
 * own struct (its shape, as *_init made it for the CPU) and device
 * pointers, and queues the CUDA backend's kernel on the context's stream;
 * a kernel that cannot be queued stops the program with its reason. */
#include "visc/cuda.h"
#include "visc/gpu.h"

#ifdef VISC_WITH_CUDA
static void ok(int rc) {
    if (rc) visc_die("cuda: %s", visc_last_error());
}
#define RUN(call) ok(call)
static int bf16_products(const visc_cuda *ctx) { return visc_cuda_bf16(ctx); }
static int operand_bytes(const visc_cuda *ctx) { return visc_cuda_operand_bytes(ctx); }
#else
/* Unreachable (no model gets to a GPU without the backend); sizeof keeps
 * the call's arguments checked without referring to the backend. */
#define RUN(call) ((void)sizeof(call), visc_die("a GPU layer in a visc without the CUDA backend"))
static int bf16_products(const visc_cuda *ctx) { return (void)ctx, 0; }
static int operand_bytes(const visc_cuda *ctx) { return (void)ctx, 4; }
#endif

void visc_gpu_upload(visc_cuda *ctx, void *dst, const void *src, size_t bytes) {
    RUN(visc_cuda_upload(ctx, dst, src, bytes));
}

void visc_gpu_download(visc_cuda *ctx, void *dst, const void *src, size_t bytes) {
    RUN(visc_cuda_download(ctx, dst, src, bytes));
}

void visc_gpu_zero(visc_cuda *ctx, float *p, size_t count) {
    RUN(visc_cuda_zero(ctx, p, count * sizeof(float)));
}

void visc_gpu_copy(visc_cuda *ctx, float *dst, const float *src, size_t count) {
    RUN(visc_cuda_copy(ctx, dst, src, count * sizeof(float)));
}

void visc_gpu_normalize_bytes(visc_cuda *ctx, float *out, const uint8_t *in, size_t images,
                              size_t plane, const float mean[3], const float std[3]) {
    RUN(visc_cuda_normalize_bytes(ctx, out, in, images, plane, mean, std));
}

void visc_gpu_ema_update(visc_cuda *ctx, float *ema, const float *params, size_t n, float decay) {
    RUN(visc_cuda_ema_update(ctx, ema, params, n, decay));
}

void visc_gpu_l2_normalize_forward(visc_cuda *ctx, float *y, float *norms, const float *x, int n,
                                   int D) {
    RUN(visc_cuda_l2_normalize_forward(ctx, y, norms, x, n, D));
}

void visc_gpu_l2_normalize_backward(visc_cuda *ctx, float *dx, const float *dy, const float *y,
                                    const float *norms, int n, int D, float scale) {
    RUN(visc_cuda_l2_normalize_backward(ctx, dx, dy, y, norms, n, D, scale));
}

size_t visc_gpu_infonce_work_floats(int n, int K) { return visc_cuda_infonce_work_floats(n, K); }

void visc_gpu_infonce(visc_cuda *ctx, float *loss, float *dq, const float *q, const float *k,
                      const float *bank, int n, int K, int D, float t, float *work) {
    RUN(visc_cuda_infonce(ctx, loss, dq, q, k, bank, n, K, D, t, work));
}

size_t visc_gpu_ntxent_work_floats(int n, int D, int world) {
    const size_t N = (size_t)n * world;
    return visc_cuda_ntxent_work_floats(n, (int)N) + (world > 1 ? 2 * (2 * N * D) : 0);
}

/* The steps of visc_ntxent_forward_backward, on the device: the rows of
 * every rank gathered as [z0_r; z1_r], regrouped by view, the local
 * arithmetic (visc_ntxent_local's twin), the candidates' gradients summed
 * over the ranks, and this rank's rows of them added to its anchors'. */
int visc_gpu_ntxent(visc_cuda *ctx, visc_gpu_comm *comm, int world, int rank, float *loss,
                    float *dz, const float *z, int n, int D, float t, float *work) {
    if (world == 1) {
        RUN(visc_cuda_ntxent(ctx, loss, dz, NULL, z, z, n, n, 0, D, t, work));
        return 0;
    }
    const int N = n * world;
    const size_t view = (size_t)n * D, rows = (size_t)2 * N * D;
    float *all = work + visc_cuda_ntxent_work_floats(n, N), *dall = all + rows;
    if (visc_gpu_comm_allgather(comm, dall, z, 2 * view)) return -1;
    visc_gpu_copy_rows(ctx, all, (int64_t)view, dall, 2 * (int64_t)view, world, (int)view);
    visc_gpu_copy_rows(ctx, all + (size_t)N * D, (int64_t)view, dall + view, 2 * (int64_t)view,
                       world, (int)view);
    RUN(visc_cuda_ntxent(ctx, loss, dz, dz ? dall : NULL, z, all, n, N, rank, D, t, work));
    if (!dz) return 0;
    if (visc_gpu_comm_allreduce(comm, dall, rows)) return -1;
    visc_gpu_add(ctx, dz, dz, dall + (size_t)rank * view, view);
    visc_gpu_add(ctx, dz + view, dz + view, dall + (size_t)N * D + (size_t)rank * view, view);
    return 0;
}

void visc_gpu_softmax_xent(visc_cuda *ctx, float *loss, float *probs, float *dlogits,
                           const float *logits, const int32_t *labels, int N, int K,
                           float smoothing) {
    RUN(visc_cuda_softmax_xent_forward(ctx, loss, probs, logits, labels, N, K, smoothing));
    RUN(visc_cuda_softmax_xent_backward(ctx, dlogits, probs, labels, N, K, smoothing));
}

void visc_gpu_topk_correct(visc_cuda *ctx, int32_t *counts, const float *logits,
                           const int32_t *labels, int N, int K) {
    RUN(visc_cuda_topk_correct(ctx, counts, logits, labels, N, K));
}

void visc_gpu_clip_grad_norm(visc_cuda *ctx, float *grads, size_t n, float max_norm) {
    RUN(visc_cuda_clip_grad_norm(ctx, grads, n, max_norm));
}

/* ---- the CNN layers, in either activation form (gpu.h) ---- */

visc_gpu_act visc_gpu_cnn_act(const visc_cuda *ctx) {
    return bf16_products(ctx) ? VISC_GPU_BF16_NHWC : VISC_GPU_F32_NCHW;
}

void visc_gpu_to_nhwc_bf16(visc_cuda *ctx, void *out, const float *in, int N, int C, int HW) {
    RUN(visc_cuda_nchw_to_nhwc_bf16(ctx, out, in, N, C, HW));
}

/* The CUDA shape of a model's convolution: fp32 NCHW tensors, or bf16
 * channels-last ones; the weights fp32 either way. */
static visc_cuda_conv_shape conv_shape(const visc_conv2d *c, visc_gpu_act act) {
    if (c->dilation != 1 || c->groups != 1 || c->has_bias || c->H != c->W || c->R != c->S)
        visc_die("cuda: convolution %dx%d (dilation %d, groups %d, bias %d) on %dx%d: only square, "
                 "undilated, ungrouped and bias-free ones are on the GPU",
                 c->R, c->S, c->dilation, c->groups, c->has_bias, c->H, c->W);
    visc_cuda_conv_shape s = {.N = c->N,
                              .C = c->C,
                              .H = c->H,
                              .W = c->W,
                              .K = c->K,
                              .R = c->R,
                              .S = c->S,
                              .stride = c->stride,
                              .pad = c->pad,
                              .type = act == VISC_GPU_BF16_NHWC ? VISC_CUDA_CONV_BF16_NHWC_F32W
                                                                : VISC_CUDA_CONV_F32_NCHW};
    return s;
}

void visc_gpu_conv2d_forward(visc_cuda *ctx, const visc_conv2d *c, visc_gpu_act act, void *out,
                             const void *in, const float *weight) {
    const visc_cuda_conv_shape s = conv_shape(c, act);
    RUN(visc_cuda_conv_forward(ctx, &s, out, in, weight));
}

void visc_gpu_conv2d_backward(visc_cuda *ctx, const visc_conv2d *c, visc_gpu_act act, void *din,
                              float *dweight, const void *dout, const void *in,
                              const float *weight) {
    const visc_cuda_conv_shape s = conv_shape(c, act);
    RUN(visc_cuda_conv_backward_weights(ctx, &s, dweight, in, dout, 0.0f));
    if (din) RUN(visc_cuda_conv_backward_data(ctx, &s, din, dout, weight));
}

static visc_cuda_bn_shape bn_shape(const visc_batchnorm2d *b, visc_gpu_act act) {
    visc_cuda_bn_shape s = {.N = b->N,
                            .C = b->C,
                            .HW = b->HW,
                            .nchw = act == VISC_GPU_F32_NCHW,
                            .relu = b->relu,
                            .eps = b->eps,
                            .momentum = b->momentum,
                            .bf16 = act == VISC_GPU_BF16_NHWC};
    return s;
}

void visc_gpu_batchnorm2d_forward_train(visc_cuda *ctx, const visc_batchnorm2d *b, visc_gpu_act act,
                                        void *out, float *save_mean, float *save_rstd,
                                        const void *in, const float *gamma, const float *beta,
                                        float *running_mean, float *running_var) {
    const visc_cuda_bn_shape s = bn_shape(b, act);
    if (b->sync) { /* SyncBN: the sums reduced over the processes between the passes */
        double *acc = b->impl;
        RUN(visc_cuda_bn_sync_sums(ctx, &s, acc, in));
        b->sync(b->sync_ctx, acc, b->C + 1);
        RUN(visc_cuda_bn_sync_sqdev(ctx, &s, acc, save_mean, in));
        b->sync(b->sync_ctx, acc + b->C + 1, b->C);
        RUN(visc_cuda_bn_sync_finish(ctx, &s, acc, out, save_mean, save_rstd, in, gamma, beta,
                                     running_mean, running_var));
        return;
    }
    RUN(visc_cuda_batchnorm_forward_train(ctx, &s, out, save_mean, save_rstd, in, gamma, beta,
                                          running_mean, running_var));
}

void visc_gpu_batchnorm2d_forward_eval(visc_cuda *ctx, const visc_batchnorm2d *b, visc_gpu_act act,
                                       void *out, const void *in, const float *gamma,
                                       const float *beta, const float *running_mean,
                                       const float *running_var) {
    const visc_cuda_bn_shape s = bn_shape(b, act);
    RUN(visc_cuda_batchnorm_forward_eval(ctx, &s, out, in, gamma, beta, running_mean, running_var));
}

void visc_gpu_batchnorm2d_apply(visc_cuda *ctx, const visc_batchnorm2d *b, visc_gpu_act act,
                                void *out, const void *in, const float *gamma, const float *beta,
                                const float *save_mean, const float *save_rstd) {
    const visc_cuda_bn_shape s = bn_shape(b, act);
    RUN(visc_cuda_batchnorm_apply(ctx, &s, out, in, gamma, beta, save_mean, save_rstd));
}

/* The norm's own ReLU comes before the sum: a block's last norm has none. */
static visc_cuda_bn_shape block_end_shape(const visc_batchnorm2d *b, visc_gpu_act act) {
    visc_cuda_bn_shape s = bn_shape(b, act);
    VISC_ASSERT(!b->relu);
    s.relu = 1;
    return s;
}

void visc_gpu_batchnorm2d_forward_train_add_relu(visc_cuda *ctx, const visc_batchnorm2d *b,
                                                 visc_gpu_act act, void *out, float *save_mean,
                                                 float *save_rstd, const void *in,
                                                 const void *identity, const float *gamma,
                                                 const float *beta, float *running_mean,
                                                 float *running_var) {
    const visc_cuda_bn_shape s = block_end_shape(b, act);
    if (b->sync) { /* SyncBN's passes, then the sum */
        visc_gpu_batchnorm2d_forward_train(ctx, b, act, out, save_mean, save_rstd, in, gamma, beta,
                                           running_mean, running_var);
        visc_gpu_add_relu(ctx, act, out, identity, (size_t)b->N * b->C * b->HW);
        return;
    }
    RUN(visc_cuda_batchnorm_forward_train_add(ctx, &s, out, save_mean, save_rstd, in, identity,
                                              gamma, beta, running_mean, running_var));
}

void visc_gpu_batchnorm2d_forward_eval_add_relu(visc_cuda *ctx, const visc_batchnorm2d *b,
                                                visc_gpu_act act, void *out, const void *in,
                                                const void *identity, const float *gamma,
                                                const float *beta, const float *running_mean,
                                                const float *running_var) {
    const visc_cuda_bn_shape s = block_end_shape(b, act);
    RUN(visc_cuda_batchnorm_forward_eval_add(ctx, &s, out, in, identity, gamma, beta, running_mean,
                                             running_var));
}

void visc_gpu_batchnorm2d_forward_train_add_norm_relu(visc_cuda *ctx, const visc_batchnorm2d *b,
                                                      visc_gpu_act act, void *out, float *save_mean,
                                                      float *save_rstd, const void *in,
                                                      const float *gamma, const float *beta,
                                                      float *running_mean, float *running_var,
                                                      const visc_gpu_bn_args *d, void *scratch) {
    VISC_ASSERT(!d->op->relu);
    if (b->sync || d->op->sync) { /* SyncBN's passes: d's output written, then the sum */
        visc_gpu_batchnorm2d_forward_train(ctx, d->op, act, scratch, d->save_mean, d->save_rstd,
                                           d->in, d->gamma, d->beta, d->running_mean,
                                           d->running_var);
        visc_gpu_batchnorm2d_forward_train_add_relu(ctx, b, act, out, save_mean, save_rstd, in,
                                                    scratch, gamma, beta, running_mean,
                                                    running_var);
        return;
    }
    const visc_cuda_bn_shape ds = bn_shape(d->op, act), s = block_end_shape(b, act);
    const visc_cuda_bn_residual rn = {d->in, d->save_mean, d->save_rstd, NULL,
                                      NULL,  d->gamma,     d->beta,      d->op->eps};
    RUN(visc_cuda_batchnorm_statistics(ctx, &ds, d->save_mean, d->save_rstd, d->in, d->running_mean,
                                       d->running_var));
    RUN(visc_cuda_batchnorm_forward_train_add_norm(ctx, &s, out, save_mean, save_rstd, in, &rn,
                                                   gamma, beta, running_mean, running_var));
}

void visc_gpu_batchnorm2d_forward_eval_add_norm_relu(visc_cuda *ctx, const visc_batchnorm2d *b,
                                                     visc_gpu_act act, void *out, const void *in,
                                                     const float *gamma, const float *beta,
                                                     const float *running_mean,
                                                     const float *running_var,
                                                     const visc_gpu_bn_args *d) {
    VISC_ASSERT(!d->op->relu);
    const visc_cuda_bn_shape s = block_end_shape(b, act);
    const visc_cuda_bn_residual rn = {d->in,          NULL,     NULL,    d->running_mean,
                                      d->running_var, d->gamma, d->beta, d->op->eps};
    RUN(visc_cuda_batchnorm_forward_eval_add_norm(ctx, &s, out, in, &rn, gamma, beta, running_mean,
                                                  running_var));
}

int visc_gpu_batchnorm2d_reads_output(const visc_batchnorm2d *b) {
    return b->relu && b->sync != NULL;
}

void visc_gpu_batchnorm2d_backward(visc_cuda *ctx, const visc_batchnorm2d *b, visc_gpu_act act,
                                   void *din, float *dgamma, float *dbeta, const void *dout,
                                   const void *in, const void *out, const float *gamma,
                                   const float *beta, const float *save_mean,
                                   const float *save_rstd) {
    const visc_cuda_bn_shape s = bn_shape(b, act);
    if (b->sync) {
        double *acc = b->impl;
        RUN(visc_cuda_bn_sync_grad_sums(ctx, &s, acc, dgamma, dbeta, dout, in, out, save_mean,
                                        save_rstd));
        b->sync(b->sync_ctx, acc, 2 * b->C + 1);
        if (din)
            RUN(visc_cuda_bn_sync_grad_input(ctx, &s, acc, din, dout, in, out, gamma, save_mean,
                                             save_rstd));
        return;
    }
    /* a process alone makes the ReLU's mask again from the statistics
     * rather than reading the output (visc_cuda_batchnorm_backward) */
    RUN(visc_cuda_batchnorm_backward(ctx, &s, din, dgamma, dbeta, dout, in,
                                     visc_gpu_batchnorm2d_reads_output(b) ? out : NULL, gamma, beta,
                                     save_mean, save_rstd));
}

void visc_gpu_maxpool2d_forward(visc_cuda *ctx, const visc_pool2d *p, visc_gpu_act act, void *out,
                                int32_t *argmax, const void *in) {
    if (act == VISC_GPU_BF16_NHWC)
        RUN(visc_cuda_maxpool_forward_nhwc_bf16(ctx, out, argmax, in, p->N, p->C, p->H, p->W,
                                                p->kernel, p->stride, p->pad));
    else
        RUN(visc_cuda_maxpool_forward(ctx, out, argmax, in, p->N, p->C, p->H, p->W, p->kernel,
                                      p->stride, p->pad));
}

void visc_gpu_maxpool2d_backward(visc_cuda *ctx, const visc_pool2d *p, visc_gpu_act act, void *din,
                                 const void *dout, const int32_t *argmax) {
    if (act == VISC_GPU_BF16_NHWC)
        RUN(visc_cuda_maxpool_backward_nhwc_bf16(ctx, din, dout, argmax, p->N, p->C, p->H, p->W,
                                                 p->kernel, p->stride, p->pad));
    else
        RUN(visc_cuda_maxpool_backward(ctx, din, dout, argmax, p->N, p->C, p->H, p->W, p->kernel,
                                       p->stride, p->pad));
}

void visc_gpu_global_avgpool_forward(visc_cuda *ctx, visc_gpu_act act, float *out, const void *in,
                                     int N, int C, int HW) {
    if (act == VISC_GPU_BF16_NHWC)
        RUN(visc_cuda_global_avgpool_forward_nhwc_bf16(ctx, out, in, N, C, HW));
    else RUN(visc_cuda_global_avgpool_forward(ctx, out, in, N, C, HW));
}

void visc_gpu_global_avgpool_backward(visc_cuda *ctx, visc_gpu_act act, void *din,
                                      const float *dout, int N, int C, int HW) {
    if (act == VISC_GPU_BF16_NHWC)
        RUN(visc_cuda_global_avgpool_backward_nhwc_bf16(ctx, din, dout, N, C, HW));
    else RUN(visc_cuda_global_avgpool_backward(ctx, din, dout, N, C, HW));
}

void visc_gpu_add_relu(visc_cuda *ctx, visc_gpu_act act, void *out, const void *identity,
                       size_t n) {
    if (act == VISC_GPU_BF16_NHWC) RUN(visc_cuda_add_relu_bf16(ctx, out, identity, n));
    else RUN(visc_cuda_add_relu(ctx, out, identity, n));
}

void visc_gpu_cnn_add(visc_cuda *ctx, visc_gpu_act act, void *out, const void *a, const void *b,
                      size_t n) {
    if (act == VISC_GPU_BF16_NHWC) RUN(visc_cuda_add_bf16(ctx, out, a, b, n));
    else RUN(visc_cuda_add(ctx, out, a, b, n));
}

void visc_gpu_cnn_add_relu_backward(visc_cuda *ctx, visc_gpu_act act, void *din, const void *a,
                                    const void *b, const void *out, size_t n) {
    if (act == VISC_GPU_BF16_NHWC) RUN(visc_cuda_add_relu_backward_bf16(ctx, din, a, b, out, n));
    else RUN(visc_cuda_add_relu_backward(ctx, din, a, b, out, n));
}

void visc_gpu_cnn_relu_backward(visc_cuda *ctx, visc_gpu_act act, void *din, const void *dout,
                                const void *out, size_t n) {
    if (act == VISC_GPU_BF16_NHWC) RUN(visc_cuda_relu_backward_bf16(ctx, din, dout, out, n));
    else RUN(visc_cuda_relu_backward(ctx, din, dout, out, n));
}

/* ---- the linear layer and elementwise steps ---- */

void visc_gpu_linear_forward(visc_cuda *ctx, float *out, const float *in, const float *weight,
                             const float *bias, int N, int in_features, int out_features) {
    RUN(visc_cuda_linear_forward(ctx, out, in, weight, bias, N, in_features, out_features));
}

void visc_gpu_linear_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                              const float *dout, const float *in, const float *weight, int N,
                              int in_features, int out_features) {
    RUN(visc_cuda_linear_backward(ctx, din, dweight, dbias, dout, in, weight, N, in_features,
                                  out_features));
}

void visc_gpu_relu_backward(visc_cuda *ctx, float *din, const float *dout, const float *out,
                            size_t n) {
    RUN(visc_cuda_relu_backward(ctx, din, dout, out, n));
}

void visc_gpu_add(visc_cuda *ctx, float *out, const float *a, const float *b, size_t n) {
    RUN(visc_cuda_add(ctx, out, a, b, n));
}

/* ---- the token layers ---- */

size_t visc_gpu_operand_floats(const visc_cuda *ctx, size_t count) {
    return operand_bytes(ctx) == 2 ? (count + 1) / 2 : count;
}

float *visc_gpu_operand_at(const visc_cuda *ctx, float *base, size_t offset) {
    void *at = (unsigned char *)base + offset * (size_t)operand_bytes(ctx);
    return at; /* a float * holding bf16 values in the bf16 form */
}

void visc_gpu_layernorm_forward(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                const float *in, const float *gamma, const float *beta,
                                int64_t rows, int C, float eps) {
    RUN(visc_cuda_layernorm_forward(ctx, out, save_mean, save_rstd, in, gamma, beta, rows, C, eps));
}

void visc_gpu_layernorm_backward(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                 const float *dout, const float *in, const float *gamma,
                                 const float *save_mean, const float *save_rstd, int64_t rows,
                                 int C) {
    RUN(visc_cuda_layernorm_backward(ctx, din, dgamma, dbeta, dout, in, gamma, save_mean, save_rstd,
                                     rows, C));
}

void visc_gpu_layernorm_backward_add(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                     const float *dout, const float *in, const float *gamma,
                                     const float *save_mean, const float *save_rstd, int64_t rows,
                                     int C) {
    RUN(visc_cuda_layernorm_backward_add(ctx, din, dgamma, dbeta, dout, in, gamma, save_mean,
                                         save_rstd, rows, C));
}

void visc_gpu_gelu_forward(visc_cuda *ctx, float *out, const float *in, size_t n) {
    RUN(visc_cuda_gelu_forward(ctx, out, in, n));
}

void visc_gpu_gelu_backward(visc_cuda *ctx, float *din, const float *dout, const float *in,
                            size_t n) {
    RUN(visc_cuda_gelu_backward(ctx, din, dout, in, n));
}

void visc_gpu_layernorm_operand_forward(visc_cuda *ctx, float *out, float *save_mean,
                                        float *save_rstd, const float *in, const float *gamma,
                                        const float *beta, int64_t rows, int C, float eps) {
    RUN(visc_cuda_layernorm_operand_forward(ctx, out, save_mean, save_rstd, in, gamma, beta, rows,
                                            C, eps));
}

void visc_gpu_linear_operand_forward(visc_cuda *ctx, float *out, const float *in,
                                     const float *weight, const float *bias, int N, int in_features,
                                     int out_features) {
    RUN(visc_cuda_linear_operand_forward(ctx, out, in, weight, bias, N, in_features, out_features));
}

void visc_gpu_linear_operands_forward(visc_cuda *ctx, float *out, const float *in,
                                      const float *weight, const float *bias, int N,
                                      int in_features, int out_features) {
    RUN(visc_cuda_linear_operands_forward(ctx, out, in, weight, bias, N, in_features,
                                          out_features));
}

void visc_gpu_linear_forward_to_operand(visc_cuda *ctx, float *out, const float *in,
                                        const float *weight, const float *bias, int N,
                                        int in_features, int out_features) {
    RUN(visc_cuda_linear_forward_to_operand(ctx, out, in, weight, bias, N, in_features,
                                            out_features));
}

void visc_gpu_linear_operand_backward(visc_cuda *ctx, float *din, float *dweight, float *dbias,
                                      const float *dout, const float *in, const float *weight,
                                      int N, int in_features, int out_features) {
    RUN(visc_cuda_linear_operand_backward(ctx, din, dweight, dbias, dout, in, weight, N,
                                          in_features, out_features));
}

void visc_gpu_gelu_linear_forward(visc_cuda *ctx, float *out, float *act, const float *h,
                                  const float *weight, const float *bias, int N, int hidden,
                                  int out_features) {
    RUN(visc_cuda_gelu_linear_forward(ctx, out, act, h, weight, bias, N, hidden, out_features));
}

void visc_gpu_gelu_linear_act(visc_cuda *ctx, float *act, const float *h, int N, int hidden,
                              int out_features, int has_bias) {
    RUN(visc_cuda_gelu_linear_act(ctx, act, h, N, hidden, out_features, has_bias));
}

void visc_gpu_gelu_linear_backward(visc_cuda *ctx, float *dh, float *dweight, float *dbias,
                                   const float *dout, const float *act, const float *h,
                                   const float *weight, int N, int hidden, int out_features) {
    RUN(visc_cuda_gelu_linear_backward(ctx, dh, dweight, dbias, dout, act, h, weight, N, hidden,
                                       out_features));
}

void visc_gpu_mlp_backward(visc_cuda *ctx, float *din, float *dweight1, float *dbias1,
                           float *dweight2, float *dbias2, float *dact, const float *dout,
                           const float *in, const float *h, const float *act, const float *weight1,
                           const float *weight2, int N, int in_features, int hidden,
                           int out_features) {
    RUN(visc_cuda_mlp_backward(ctx, din, dweight1, dbias1, dweight2, dbias2, dact, dout, in, h, act,
                               weight1, weight2, N, in_features, hidden, out_features));
}

void visc_gpu_attention_operand_forward(visc_cuda *ctx, const visc_attention *a, float *out,
                                        float *lse, const float *q, const float *k,
                                        const float *v) {
    RUN(visc_cuda_attention_operand_forward(ctx, a, out, lse, q, k, v));
}

void visc_gpu_attention_operand_backward(visc_cuda *ctx, const visc_attention *a, float *dq,
                                         float *dk, float *dv, float *dbias, float *dhead_scale,
                                         const float *dout, const float *q, const float *k,
                                         const float *v, const float *out, const float *lse) {
    RUN(visc_cuda_attention_operand_backward(ctx, a, dq, dk, dv, dbias, dhead_scale, dout, q, k, v,
                                             out, lse));
}

static visc_cuda_patch_shape patch_shape(const visc_conv2d *c, int tokens, int first) {
    if (c->R != c->S || c->stride != c->R || c->pad != 0 || c->H != c->W || !c->has_bias)
        visc_die("cuda: a patch embedding is a square, unpadded, biased convolution with stride = "
                 "kernel");
    visc_cuda_patch_shape p = {.B = c->N,
                               .in_channels = c->C,
                               .image = c->H,
                               .patch = c->R,
                               .C = c->K,
                               .tokens = tokens,
                               .first = first};
    return p;
}

void visc_gpu_patch_embed_forward(visc_cuda *ctx, const visc_conv2d *conv, float *tokens,
                                  float *conv_out, const float *image, const float *weight,
                                  const float *bias, int tokens_per_image, int first) {
    const visc_cuda_patch_shape p = patch_shape(conv, tokens_per_image, first);
    RUN(visc_cuda_patch_embed_forward(ctx, &p, tokens, conv_out, image, weight, bias));
}

void visc_gpu_patch_embed_backward(visc_cuda *ctx, const visc_conv2d *conv, float *dweight,
                                   float *dbias, float *dconv, const float *dtokens,
                                   const float *image, int tokens_per_image, int first) {
    const visc_cuda_patch_shape p = patch_shape(conv, tokens_per_image, first);
    RUN(visc_cuda_patch_embed_backward(ctx, &p, dweight, dbias, dconv, dtokens, image));
}

void visc_gpu_add_broadcast(visc_cuda *ctx, float *x, const float *table, int B, int64_t NC) {
    RUN(visc_cuda_add_broadcast(ctx, x, table, B, NC));
}

void visc_gpu_sum_rows(visc_cuda *ctx, float *out, const float *a, int64_t rows, int C) {
    RUN(visc_cuda_sum_rows(ctx, out, a, rows, C));
}

/* Drop-path's factors: 1 when no sample can drop (returns 0: the kernel
 * sets them on the device, no copy from the host waits for the stream);
 * else drawn on the host as the CPU's and uploaded (returns 1). */
static int draw_keep(visc_cuda *ctx, float *keep, float *keep_host, int B, float p, int train,
                     uint64_t seed, uint64_t offset) {
    if (!train || p <= 0.0f) return 0;
    visc_droppath_keep(keep_host, B, p, train, seed, offset);
    visc_gpu_upload(ctx, keep, keep_host, (size_t)B * sizeof(float));
    return 1;
}

void visc_gpu_droppath_add_forward(visc_cuda *ctx, float *out, const float *x, const float *branch,
                                   float *keep, float *keep_host, int B, size_t per_sample, float p,
                                   int train, uint64_t seed, uint64_t offset) {
    if (draw_keep(ctx, keep, keep_host, B, p, train, seed, offset))
        RUN(visc_cuda_droppath_add_forward(ctx, out, x, branch, keep, B, per_sample));
    else RUN(visc_cuda_droppath_add_kept(ctx, out, x, branch, keep, B, per_sample));
}

void visc_gpu_droppath_add_backward(visc_cuda *ctx, float *dbranch, const float *dx,
                                    const float *keep, int B, size_t per_sample) {
    RUN(visc_cuda_droppath_add_backward(ctx, dbranch, dx, keep, B, per_sample));
}

void visc_gpu_copy_rows(visc_cuda *ctx, float *dst, int64_t dst_stride, const float *src,
                        int64_t src_stride, int64_t rows, int count) {
    RUN(visc_cuda_copy_rows(ctx, dst, dst_stride, src, src_stride, rows, count));
}

void visc_gpu_relu_forward(visc_cuda *ctx, float *out, const float *in, size_t n) {
    RUN(visc_cuda_relu_forward(ctx, out, in, n));
}

void visc_gpu_token_mean_forward(visc_cuda *ctx, float *out, const float *in, int B, int N, int C) {
    RUN(visc_cuda_token_mean_forward(ctx, out, in, B, N, C));
}

void visc_gpu_token_mean_backward(visc_cuda *ctx, float *din, const float *dout, int B, int N,
                                  int C) {
    RUN(visc_cuda_token_mean_backward(ctx, din, dout, B, N, C));
}

/* ---- Swin ---- */

void visc_gpu_swin_partition_operand(visc_cuda *ctx, float *out, const float *in, int H, int W,
                                     int wh, int ww, int sh, int sw, int B, int C) {
    const visc_cuda_swin_grid g = {H, W, wh, ww, sh, sw};
    RUN(visc_cuda_swin_partition_operand(ctx, out, in, &g, B, C));
}

void visc_gpu_swin_reverse_add(visc_cuda *ctx, float *acc, const float *in, int H, int W, int wh,
                               int ww, int sh, int sw, int B, int C) {
    const visc_cuda_swin_grid g = {H, W, wh, ww, sh, sw};
    RUN(visc_cuda_swin_reverse_add(ctx, acc, in, &g, B, C));
}

void visc_gpu_linear_operand_backward_from_windows(visc_cuda *ctx, float *din, float *dweight,
                                                   float *dbias, const float *dout, float *windowed,
                                                   int H, int W, int wh, int ww, int sh, int sw,
                                                   int B, const float *in, const float *weight,
                                                   int in_features, int out_features) {
    const visc_cuda_swin_grid g = {H, W, wh, ww, sh, sw};
    RUN(visc_cuda_linear_operand_backward_from_windows(ctx, din, dweight, dbias, dout, windowed, &g,
                                                       B, in, weight, in_features, out_features));
}

void visc_gpu_droppath_add_from_windows(visc_cuda *ctx, float *out, const float *x,
                                        const float *branch, float *keep, float *keep_host, int H,
                                        int W, int wh, int ww, int sh, int sw, int B, int C,
                                        float p, int train, uint64_t seed, uint64_t offset) {
    const visc_cuda_swin_grid g = {H, W, wh, ww, sh, sw};
    const int drawn = draw_keep(ctx, keep, keep_host, B, p, train, seed, offset);
    RUN(visc_cuda_droppath_add_from_windows(ctx, out, x, branch, keep, !drawn, &g, B, C));
}

void visc_gpu_layernorm_operand_to_windows(visc_cuda *ctx, float *out, float *save_mean,
                                           float *save_rstd, const float *in, const float *gamma,
                                           const float *beta, int H, int W, int wh, int ww, int sh,
                                           int sw, int B, int C, float eps) {
    const visc_cuda_swin_grid g = {H, W, wh, ww, sh, sw};
    RUN(visc_cuda_layernorm_operand_to_windows(ctx, out, save_mean, save_rstd, in, gamma, beta, &g,
                                               B, C, eps));
}

void visc_gpu_layernorm_backward_from_windows_add(visc_cuda *ctx, float *din, float *dgamma,
                                                  float *dbeta, const float *dout, const float *in,
                                                  const float *gamma, const float *save_mean,
                                                  const float *save_rstd, int H, int W, int wh,
                                                  int ww, int sh, int sw, int B, int C) {
    const visc_cuda_swin_grid g = {H, W, wh, ww, sh, sw};
    RUN(visc_cuda_layernorm_backward_from_windows_add(ctx, din, dgamma, dbeta, dout, in, gamma,
                                                      save_mean, save_rstd, &g, B, C));
}

void visc_gpu_layernorm_from_windows(visc_cuda *ctx, float *out, float *save_mean, float *save_rstd,
                                     const float *in, const float *gamma, const float *beta, int H,
                                     int W, int wh, int ww, int sh, int sw, int B, int C,
                                     float eps) {
    const visc_cuda_swin_grid g = {H, W, wh, ww, sh, sw};
    RUN(visc_cuda_layernorm_from_windows(ctx, out, save_mean, save_rstd, in, gamma, beta, &g, B, C,
                                         eps));
}

void visc_gpu_layernorm_backward_to_windows(visc_cuda *ctx, float *din, float *dgamma, float *dbeta,
                                            const float *dout, const float *in, const float *gamma,
                                            const float *save_mean, const float *save_rstd, int H,
                                            int W, int wh, int ww, int sh, int sw, int B, int C) {
    const visc_cuda_swin_grid g = {H, W, wh, ww, sh, sw};
    RUN(visc_cuda_layernorm_backward_to_windows(ctx, din, dgamma, dbeta, dout, in, gamma, save_mean,
                                                save_rstd, &g, B, C));
}

void visc_gpu_swin_gather_bias(visc_cuda *ctx, float *bias, const float *table, const int32_t *rel,
                               int H, int N, int sigmoid16) {
    RUN(visc_cuda_swin_gather_bias(ctx, bias, table, rel, H, N, sigmoid16));
}

void visc_gpu_swin_scatter_bias(visc_cuda *ctx, float *dtable, const float *dbias,
                                const float *bias, const int32_t *rel, int T, int H, int N,
                                int sigmoid16) {
    RUN(visc_cuda_swin_scatter_bias(ctx, dtable, dbias, bias, rel, T, H, N, sigmoid16));
}

void visc_gpu_swin_qkv_operand(visc_cuda *ctx, float *qkv, float *qnorm, float *knorm,
                               const float *raw, int64_t rows, int H, int D) {
    RUN(visc_cuda_swin_qkv_operand(ctx, qkv, qnorm, knorm, raw, rows, H, D));
}

void visc_gpu_swin_normalize_heads_backward(visc_cuda *ctx, float *dx, int64_t ld_dx,
                                            const float *dy, int64_t ld_dy, const float *y,
                                            int64_t ld_y, const float *norms, int64_t rows, int H,
                                            int D) {
    RUN(visc_cuda_swin_normalize_heads_backward(ctx, dx, ld_dx, dy, ld_dy, y, ld_y, norms, rows, H,
                                                D));
}

void visc_gpu_swin_merge_copy(visc_cuda *ctx, float *tokens, float *merged, int B, int H, int W,
                              int C, int back) {
    RUN(visc_cuda_swin_merge_copy(ctx, tokens, merged, B, H, W, C, back));
}

void visc_gpu_swin_head_scale(visc_cuda *ctx, float *hs, const float *logit_scale, int H) {
    RUN(visc_cuda_swin_head_scale(ctx, hs, logit_scale, H));
}

void visc_gpu_swin_head_scale_backward(visc_cuda *ctx, float *dlogit_scale,
                                       const float *logit_scale, const float *dhs, const float *hs,
                                       int H) {
    RUN(visc_cuda_swin_head_scale_backward(ctx, dlogit_scale, logit_scale, dhs, hs, H));
}

/* ---- CaiT ---- */

void visc_gpu_th_scores(visc_cuda *ctx, float *S, const float *qkv, const visc_th_dims *d) {
    RUN(visc_cuda_th_scores(ctx, S, qkv, d));
}

void visc_gpu_th_mix(visc_cuda *ctx, float *out, const float *in, const float *W, const float *bias,
                     int B, int H, size_t TT, int transpose) {
    RUN(visc_cuda_th_mix(ctx, out, in, W, bias, B, H, TT, transpose));
}

void visc_gpu_th_softmax(visc_cuda *ctx, float *P, size_t rows, int T) {
    RUN(visc_cuda_th_softmax(ctx, P, rows, T));
}

void visc_gpu_th_apply(visc_cuda *ctx, float *att, const float *A, const float *qkv,
                       const visc_th_dims *d) {
    RUN(visc_cuda_th_apply(ctx, att, A, qkv, d));
}

void visc_gpu_th_grad_a(visc_cuda *ctx, float *dA, const float *datt, const float *qkv,
                        const visc_th_dims *d) {
    RUN(visc_cuda_th_grad_a(ctx, dA, datt, qkv, d));
}

void visc_gpu_th_grad_v(visc_cuda *ctx, float *dqkv, const float *A, const float *datt,
                        const visc_th_dims *d) {
    RUN(visc_cuda_th_grad_v(ctx, dqkv, A, datt, d));
}

void visc_gpu_th_mix_grad(visc_cuda *ctx, float *dW, float *db, const float *dY, const float *X,
                          int B, int H, size_t TT) {
    RUN(visc_cuda_th_mix_grad(ctx, dW, db, dY, X, B, H, TT));
}

void visc_gpu_th_softmax_backward(visc_cuda *ctx, float *dS, const float *P, size_t rows, int T) {
    RUN(visc_cuda_th_softmax_backward(ctx, dS, P, rows, T));
}

void visc_gpu_th_grad_qk(visc_cuda *ctx, float *dqkv, const float *dS, const float *qkv,
                         const visc_th_dims *d) {
    RUN(visc_cuda_th_grad_qk(ctx, dqkv, dS, qkv, d));
}

void visc_gpu_layerscale_forward(visc_cuda *ctx, float *out, const float *in, const float *gamma,
                                 int64_t rows, int C) {
    RUN(visc_cuda_layerscale_forward(ctx, out, in, gamma, rows, C));
}

void visc_gpu_layerscale_backward(visc_cuda *ctx, float *din, float *dgamma, const float *dout,
                                  const float *in, const float *gamma, int64_t rows, int C) {
    RUN(visc_cuda_layerscale_backward(ctx, din, dgamma, dout, in, gamma, rows, C));
}

/* dispatch.h: the layer calls a model makes, each to the CPU layer (nn.h,
 * tokens.h) or, when the model is on a GPU (m->cuda), to its twin (gpu.h).
 * The arguments are the CPU layer's; pointers are the arena's and the
 * model's tensors, which live where the model does. Private to src/models. */
#ifndef VISC_MODELS_DISPATCH_H
#define VISC_MODELS_DISPATCH_H

#include <string.h>

#include "visc/gpu.h"
#include "visc/model.h"
#include "visc/nn.h"
#include "visc/tokens.h"

/* The transformers plan one block's insides for all blocks where nothing
 * keeps them for backward: --grad-checkpointing (backward makes each
 * block's again) and a forward-only model (model.h). */
static inline int md_one_block_inside(const visc_model *m) {
    return m->cfg.grad_checkpointing || m->cfg.forward_only;
}

/* What every model's destroy frees last: the activation arena and the
 * logits' gradient (the host's, or the device's with the GPU's copies of
 * the tables), the parameter and buffer tables and the gradients. */
static inline void md_free_storage(visc_model *m, visc_arena *arena, float *dlogits) {
    if (m->cuda) {
        visc_gpu_arena_free(m, arena, dlogits);
        visc_model_gpu_release(m);
    } else {
        visc_arena_free(arena);
    }
    visc_table_free(&m->params);
    visc_table_free(&m->buffers);
    visc_free_aligned(m->grads);
}

/* The caller's memory into the arena (a batch, an incoming gradient): the
 * host's, or the device's where the caller keeps it there (io_on_device). */
static inline void md_take_in(visc_model *m, float *dst, const float *src, size_t n) {
    if (m->cuda && m->io_on_device) visc_gpu_copy(m->cuda, dst, src, n);
    else if (m->cuda) visc_gpu_upload(m->cuda, dst, src, n * sizeof(float));
    else memcpy(dst, src, n * sizeof(float));
}

/* The batch into the arena, as md_take_in; nothing to do when the caller
 * wrote it into the arena itself (m->input). */
static inline void md_take_batch(visc_model *m, float *dst, const float *x, size_t n) {
    if (x != dst) md_take_in(m, dst, x, n);
}

/* A buffer in the operand form (visc_gpu_operand_floats): fp32 on the
 * CPU, bf16 (half the floats) on a GPU under --precision bf16. */
static inline float *md_take_operand(visc_model *m, visc_arena *a, size_t count) {
    return visc_arena_floats(a, m->cuda ? visc_gpu_operand_floats(m->cuda, count) : count);
}

/* base + offset in such a buffer, counted in its values */
static inline float *md_operand_at(visc_model *m, float *base, size_t offset) {
    return m->cuda ? visc_gpu_operand_at(m->cuda, base, offset) : base + offset;
}

static inline void md_copy(visc_model *m, float *dst, const float *src, size_t n) {
    if (m->cuda) visc_gpu_copy(m->cuda, dst, src, n);
    else memcpy(dst, src, n * sizeof(float));
}

static inline void md_zero(visc_model *m, float *p, size_t n) {
    if (m->cuda) visc_gpu_zero(m->cuda, p, n);
    else memset(p, 0, n * sizeof(float));
}

/* A gradient the host hands in (dlogits): on a GPU it is uploaded into the
 * model's device buffer, which is returned; on the CPU the host pointer
 * itself is. NULL stays NULL. */
static inline const float *md_from_host(visc_model *m, float *device_buf, const float *host,
                                        size_t n) {
    if (!m->cuda || !host || m->io_on_device) return host; /* already the device's */
    visc_gpu_upload(m->cuda, device_buf, host, n * sizeof(float));
    return device_buf;
}

/* out = a + b (out may alias a or b) */
static inline void md_add(visc_model *m, float *out, const float *a, const float *b, size_t n) {
    if (m->cuda) visc_gpu_add(m->cuda, out, a, b, n);
    else visc_add_forward(out, a, b, n);
}

/* acc += x */
static inline void md_add_in(visc_model *m, float *acc, const float *x, size_t n) {
    if (m->cuda) visc_gpu_add(m->cuda, acc, acc, x, n);
    else visc_add_inplace(acc, x, n);
}

static inline void md_linear_forward(visc_model *m, float *out, const float *in, const float *w,
                                     const float *b, int N, int in_f, int out_f) {
    if (m->cuda) visc_gpu_linear_forward(m->cuda, out, in, w, b, N, in_f, out_f);
    else visc_linear_forward(out, in, w, b, N, in_f, out_f);
}

static inline void md_linear_backward(visc_model *m, float *din, float *dw, float *db,
                                      const float *dout, const float *in, const float *w, int N,
                                      int in_f, int out_f) {
    if (m->cuda) visc_gpu_linear_backward(m->cuda, din, dw, db, dout, in, w, N, in_f, out_f);
    else visc_linear_backward(din, dw, db, dout, in, w, N, in_f, out_f);
}

static inline void md_layernorm_forward(visc_model *m, float *out, float *mean, float *rstd,
                                        const float *in, const float *gamma, const float *beta,
                                        int64_t rows, int C, float eps) {
    if (m->cuda)
        visc_gpu_layernorm_forward(m->cuda, out, mean, rstd, in, gamma, beta, rows, C, eps);
    else visc_layernorm_forward(out, mean, rstd, in, gamma, beta, rows, C, eps);
}

/* A layer norm whose output only a linear layer reads (the _operand pair
 * below): on a GPU under bf16 in bf16, the layer's operand; else fp32. */
static inline void md_layernorm_operand_forward(visc_model *m, float *out, float *mean, float *rstd,
                                                const float *in, const float *gamma,
                                                const float *beta, int64_t rows, int C, float eps) {
    if (m->cuda)
        visc_gpu_layernorm_operand_forward(m->cuda, out, mean, rstd, in, gamma, beta, rows, C, eps);
    else visc_layernorm_forward(out, mean, rstd, in, gamma, beta, rows, C, eps);
}

static inline void md_linear_operand_forward(visc_model *m, float *out, const float *in,
                                             const float *w, const float *b, int N, int in_f,
                                             int out_f) {
    if (m->cuda) visc_gpu_linear_operand_forward(m->cuda, out, in, w, b, N, in_f, out_f);
    else visc_linear_forward(out, in, w, b, N, in_f, out_f);
}

/* ... its output in the operand form too (attention's q, k and v) */
static inline void md_linear_operands_forward(visc_model *m, float *out, const float *in,
                                              const float *w, const float *b, int N, int in_f,
                                              int out_f) {
    if (m->cuda) visc_gpu_linear_operands_forward(m->cuda, out, in, w, b, N, in_f, out_f);
    else visc_linear_forward(out, in, w, b, N, in_f, out_f);
}

/* ... from an fp32 input */
static inline void md_linear_forward_to_operand(visc_model *m, float *out, const float *in,
                                                const float *w, const float *b, int N, int in_f,
                                                int out_f) {
    if (m->cuda) visc_gpu_linear_forward_to_operand(m->cuda, out, in, w, b, N, in_f, out_f);
    else visc_linear_forward(out, in, w, b, N, in_f, out_f);
}

static inline void md_linear_operand_backward(visc_model *m, float *din, float *dw, float *db,
                                              const float *dout, const float *in, const float *w,
                                              int N, int in_f, int out_f) {
    if (m->cuda)
        visc_gpu_linear_operand_backward(m->cuda, din, dw, db, dout, in, w, N, in_f, out_f);
    else visc_linear_backward(din, dw, db, dout, in, w, N, in_f, out_f);
}

static inline void md_layernorm_backward(visc_model *m, float *din, float *dgamma, float *dbeta,
                                         const float *dout, const float *in, const float *gamma,
                                         const float *mean, const float *rstd, int64_t rows,
                                         int C) {
    if (m->cuda)
        visc_gpu_layernorm_backward(m->cuda, din, dgamma, dbeta, dout, in, gamma, mean, rstd, rows,
                                    C);
    else visc_layernorm_backward(din, dgamma, dbeta, dout, in, gamma, mean, rstd, rows, C);
}

/* din += the input's gradient (a residual stream's gradient takes the branch's) */
static inline void md_layernorm_backward_add(visc_model *m, float *din, float *dgamma, float *dbeta,
                                             const float *dout, const float *in, const float *gamma,
                                             const float *mean, const float *rstd, int64_t rows,
                                             int C) {
    if (m->cuda)
        visc_gpu_layernorm_backward_add(m->cuda, din, dgamma, dbeta, dout, in, gamma, mean, rstd,
                                        rows, C);
    else visc_layernorm_backward_add(din, dgamma, dbeta, dout, in, gamma, mean, rstd, rows, C);
}

/* GELU then a linear layer (act keeps GELU(h)); on a GPU the two separate
 * layers, which give the fused CPU layer's results in fp32 (tokens.h). */
static inline void md_gelu_linear_forward(visc_model *m, float *out, float *act, const float *h,
                                          const float *w, const float *b, int N, int hidden,
                                          int out_f) {
    if (!m->cuda) {
        visc_gelu_linear_forward(out, act, h, w, b, N, hidden, out_f);
        return;
    }
    visc_gpu_gelu_linear_forward(m->cuda, out, act, h, w, b, N, hidden, out_f);
}

/* act alone, as md_gelu_linear_forward leaves it (a caller that makes it
 * again for backward instead of keeping it) */
static inline void md_gelu_linear_act(visc_model *m, float *act, const float *h, int N, int hidden,
                                      int out_f, int has_bias) {
    if (m->cuda) visc_gpu_gelu_linear_act(m->cuda, act, h, N, hidden, out_f, has_bias);
    else visc_gelu_linear_act(act, h, N, hidden, out_f, has_bias);
}

static inline void md_gelu_linear_backward(visc_model *m, float *dh, float *dw, float *db,
                                           const float *dout, const float *act, const float *h,
                                           const float *w, int N, int hidden, int out_f) {
    if (!m->cuda) {
        visc_gelu_linear_backward(dh, dw, db, dout, act, h, w, N, hidden, out_f);
        return;
    }
    visc_gpu_gelu_linear_backward(m->cuda, dh, dw, db, dout, act, h, w, N, hidden, out_f);
}

/* A transformer MLP's backward, fc2(GELU(fc1(in))): md_gelu_linear_backward
 * into dh, then fc1's (in in the operand form, md_linear_operand_*). On a
 * GPU as one call, where under bf16 the GELU's gradient goes straight into
 * fc1's bf16 dY (visc_cuda_mlp_backward). dh: [N, hidden] of scratch. */
static inline void md_mlp_backward(visc_model *m, float *din, float *dw1, float *db1, float *dw2,
                                   float *db2, float *dh, const float *dout, const float *in,
                                   const float *h, const float *act, const float *w1,
                                   const float *w2, int N, int in_f, int hidden, int out_f) {
    if (m->cuda) {
        visc_gpu_mlp_backward(m->cuda, din, dw1, db1, dw2, db2, dh, dout, in, h, act, w1, w2, N,
                              in_f, hidden, out_f);
        return;
    }
    md_gelu_linear_backward(m, dh, dw2, db2, dout, act, h, w2, N, hidden, out_f);
    md_linear_operand_backward(m, din, dw1, db1, dh, in, w1, N, in_f, hidden);
}

/* Attention, whose output every model's output projection alone reads
 * (the md_linear_operand_* pair): on a GPU under bf16 kept in bf16. */
static inline void md_attention_operand_forward(visc_model *m, const visc_attention *a, float *out,
                                                float *lse, const float *q, const float *k,
                                                const float *v) {
    if (m->cuda) visc_gpu_attention_operand_forward(m->cuda, a, out, lse, q, k, v);
    else visc_attention_forward(a, out, lse, q, k, v);
}

static inline void md_attention_operand_backward(visc_model *m, const visc_attention *a, float *dq,
                                                 float *dk, float *dv, float *dbias,
                                                 float *dhead_scale, const float *dout,
                                                 const float *q, const float *k, const float *v,
                                                 const float *out, const float *lse) {
    if (m->cuda)
        visc_gpu_attention_operand_backward(m->cuda, a, dq, dk, dv, dbias, dhead_scale, dout, q, k,
                                            v, out, lse);
    else visc_attention_backward(a, dq, dk, dv, dbias, dhead_scale, dout, q, k, v, out, lse);
}

/* x += drop_path(branch); keep_host: [B] host floats for the GPU's draws. */
/* out = x + keep_b branch (out may be x) */
static inline void md_droppath_forward(visc_model *m, float *out, const float *x,
                                       const float *branch, float *keep, float *keep_host, int B,
                                       size_t per_sample, float p, int train, uint64_t offset) {
    if (m->cuda)
        visc_gpu_droppath_add_forward(m->cuda, out, x, branch, keep, keep_host, B, per_sample, p,
                                      train, m->noise_seed, offset);
    else
        visc_droppath_add_forward(out, x, branch, keep, B, per_sample, p, train, m->noise_seed,
                                  offset);
}

static inline void md_droppath_backward(visc_model *m, float *dbranch, const float *dx,
                                        const float *keep, int B, size_t per_sample) {
    if (m->cuda) visc_gpu_droppath_add_backward(m->cuda, dbranch, dx, keep, B, per_sample);
    else visc_droppath_add_backward(dbranch, dx, keep, B, per_sample);
}

/* Drop-path's backward as a branch reads it: dx scaled by the forward's
 * keep factors into `scaled`; or dx itself where no sample could drop (not
 * a training step, or a rate of 0): every factor is 1, the values the same,
 * and a pass over the residual stream saved. */
static inline const float *md_droppath_branch_grad(visc_model *m, float *scaled, const float *dx,
                                                   const float *keep, int could_drop, int B,
                                                   size_t per_sample) {
    if (!could_drop) return dx;
    md_droppath_backward(m, scaled, dx, keep, B, per_sample);
    return scaled;
}

static inline void md_relu_forward(visc_model *m, float *out, const float *in, size_t n) {
    if (m->cuda) visc_gpu_relu_forward(m->cuda, out, in, n);
    else visc_relu_forward(out, in, n);
}

static inline void md_relu_backward(visc_model *m, float *din, const float *dout, const float *out,
                                    size_t n) {
    if (m->cuda) visc_gpu_relu_backward(m->cuda, din, dout, out, n);
    else visc_relu_backward(din, dout, out, n);
}

/* What forward leaves for the caller (logits, features): on a GPU *dev
 * points at the arena's copy, and the host's copy is downloaded unless the
 * caller reads them on the device (io_on_device). */
static inline void md_give_out(visc_model *m, float *host, const float **dev, const float *arena,
                               size_t n) {
    if (!m->cuda) return;
    *dev = arena;
    if (!m->io_on_device) visc_gpu_download(m->cuda, host, arena, n * sizeof(float));
}

#endif

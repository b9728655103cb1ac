/* ssl.h: self-supervised pretraining: MoCo v2 and SimCLR.
 *
 * memory_bank.c  the queue of negative keys (MoCo): returned as it was
 *                before this step's keys, which are enqueued after the loss
 * contrastive.c  L2 normalization, InfoNCE against the bank (MoCo) and
 *                NT-Xent over gathered views (SimCLR): forward + backward
 * proj_head.c    projection heads: Linear-ReLU-Linear (MoCo v2) and
 *                Linear-BatchNorm-ReLU-Linear (SimCLR), lightly's names
 * momentum.c     the key encoder's momentum schedule (the update itself is
 *                visc_ema_update of optim.h: parameters only)
 * pretrain.c     `visc pretrain`: the loop, the online classifier, logs,
 *                checkpoints (bank and key encoder included: exact resume),
 *                step hooks (`visc pretrain --swarm`)
 * state_view.c   the pretrainer's tables seen as one model by step hooks
 *
 * The protocol and its defaults are the reference SSL library's ImageNet
 * benchmark (shared/reference/ssl-benchmark.md); every setting is a flag. */
#ifndef VISC_SSL_H
#define VISC_SSL_H

#include <stddef.h>
#include <stdint.h>

#include "dist.h"
#include "nn.h"
#include "table.h"
#include "train.h"

/* ---- memory_bank.c ----
 * A ring of K rows of dim floats. Policy at the end of the ring: the keys
 * that do not fit before row K continue at row 0 (nothing is dropped, any
 * K and batch size work; with more than K keys only the last K stay).
 * This differs from the reference library, which drops the overflow and
 * restarts at 0; with K a multiple of the global batch (the usual setting)
 * both are the same. */
typedef struct {
    int64_t size; /* K */
    int dim;
    int64_t ptr; /* the row the next key goes to */
    float *bank; /* [K, dim] */
} visc_memory_bank;

/* Rows drawn from N(0, 1) by (seed) and L2-normalized, as the reference. */
void visc_memory_bank_init(visc_memory_bank *mb, int64_t size, int dim, uint64_t seed);
/* Enqueues n rows of keys at ptr (wrapping). */
void visc_memory_bank_enqueue(visc_memory_bank *mb, const float *keys, int64_t n);
/* gather_distributed: the keys of every rank, in rank order, are enqueued
 * on every rank (all banks stay equal). A group of one (or d NULL)
 * enqueues its own keys. gathered: world x n x dim floats of scratch. */
int visc_memory_bank_enqueue_gathered(visc_memory_bank *mb, visc_dist *d, const float *keys,
                                      int64_t n, float *gathered);
void visc_memory_bank_free(visc_memory_bank *mb);

/* ---- contrastive.c ---- */
/* y = x / max(||x||, 1e-12) per row (F.normalize); norms[n] kept for backward. */
void visc_l2_normalize_forward(float *y, float *norms, const float *x, int n, int dim);
/* dx from dy, given y and the norms (dx may alias dy). */
void visc_l2_normalize_backward(float *dx, const float *dy, const float *y, const float *norms,
                                int n, int dim);

/* InfoNCE with a memory bank: for each query i (rows of q, normalized),
 * logits = [q_i . k_i, q_i . bank_j for j < K] / t, label 0, mean over n
 * of the cross-entropy. Returns the loss; dq (may be NULL) gets its
 * gradient (the keys and the bank get none). scratch: n x (K + 1) floats. */
float visc_infonce_forward_backward(float *dq, const float *q, const float *k,
                                    const visc_memory_bank *mb, int n, float t, float *scratch);

/* NT-Xent (SimCLR), as the reference library's NTXentLoss with
 * gather_distributed: z0, z1 [n, dim] (normalized) are the two views of
 * this rank's n samples; all ranks' views are gathered (rank order), and
 * each local view row is classified among the 2N - 1 gathered rows other
 * than itself, its partner view being the label. Mean over the 2n local
 * rows. dz0, dz1 receive the gradient, including what the other ranks'
 * rows send back through the gather (summed over ranks, which the
 * reference library's first gather layer forgot). */
typedef struct {
    int n, dim, world, rank;
    float *all;  /* [2N, dim]: every rank's z0 rows, then every rank's z1 rows */
    float *dall; /* [2N, dim] */
    float *sim;  /* [2n, 2N] */
    float *send; /* [2, n, dim]: this rank's rows A = [z0; z1] */
    float *dA;   /* [2, n, dim] */
} visc_ntxent;
void visc_ntxent_init(visc_ntxent *x, int n, int dim, int world, int rank);
float visc_ntxent_forward_backward(visc_ntxent *x, visc_dist *d, const float *z0, const float *z1,
                                   float t, float *dz0, float *dz1);
/* The arithmetic between its gather and its all-reduce (the GPU's twin,
 * src/gpu/layers.c, runs the same steps around it): A [2n, D] this rank's
 * rows, all [2N, D] every rank's (N = n * world) grouped by view as in
 * visc_ntxent; sim [2n, 2N] scratch. dA [2n, D] gets the gradient through
 * the local rows as anchors, dall [2N, D] through every row as a
 * candidate of the local anchors: summed over the ranks, this rank's rows
 * of it (rank * n and N + rank * n) added to dA make dz0, dz1. Returns the
 * mean loss of the 2n local rows. */
float visc_ntxent_local(const float *A, const float *all, int n, int N, int rank, int D, float t,
                        float *sim, float *dA, float *dall);
void visc_ntxent_free(visc_ntxent *x);

/* ---- proj_head.c ---- */
typedef struct {
    int in, hidden, out, batch;
    int batchnorm;                   /* SimCLR: Linear(no bias) - BatchNorm1d - ReLU - Linear */
    visc_table params;               /* "<prefix>layers.0.weight", ... (lightly's names) */
    visc_table buffers;              /* the BatchNorm's running statistics */
    float *grads;                    /* params.total */
    int w1, b1, gamma, beta, w2, b2; /* params indices (-1: absent) */
    int mean, var;                   /* buffers indices */
    visc_batchnorm2d bn;
    float *x, *h, *a, *output; /* activations: input copy, fc1, (bn +) relu, fc2 */
    float *dh, *da, *save_mean, *save_rstd;
    /* On a GPU (visc_proj_head_to_gpu): its context, and device copies of
     * the parameters, gradients and buffers laid out as the host tables;
     * the activations above are device memory then, forward's x and
     * backward's dout and dx device pointers. NULL on the CPU. */
    visc_cuda *cuda;
    float *dev_params, *dev_grads, *dev_buffers;
} visc_proj_head;

/* PyTorch's default Linear initialization drawn from seed. */
void visc_proj_head_init(visc_proj_head *h, const char *prefix, int in, int hidden, int out,
                         int batch, int batchnorm, uint64_t seed);
void visc_proj_head_forward(visc_proj_head *h, const float *x, int train);
/* dx (may be NULL) from dout; parameter gradients into h->grads. */
void visc_proj_head_backward(visc_proj_head *h, const float *dout, float *dx);
/* The head onto ctx's GPU: its parameters and buffers as they are now, its
 * gradients zero, its activations there. 0, or -1 with the error set. */
int visc_proj_head_to_gpu(visc_proj_head *h, visc_cuda *ctx);
/* A head on a GPU: its parameters and buffers back into the host tables
 * (a checkpoint's); its gradients into h->grads, and back up from there
 * (an all-reduce over the ranks through host memory). Nothing on the CPU;
 * a copy that fails stops the program, as a GPU layer's kernel does. */
void visc_proj_head_download(visc_proj_head *h);
void visc_proj_head_download_grads(visc_proj_head *h);
void visc_proj_head_upload_grads(visc_proj_head *h);
void visc_proj_head_free(visc_proj_head *h);

/* ---- momentum.c ---- */
/* The momentum at step of total: m0 constant, or with cosine = 1 the
 * reference's schedule 1 - (1 - m0) (cos(pi step / (total - 1)) + 1) / 2. */
float visc_momentum_at(float m0, int cosine, int64_t step, int64_t total);

/* ---- ssl_checkpoint.c ----
 * A pretraining checkpoint holds everything a resume needs: the query
 * encoder under its own names (so visc_load_model and `visc eval` read it
 * as the model), the key encoder ("momentum_encoder." prefix), both heads
 * ("projection_head.", "momentum_projection_head."), the optimizers'
 * state, the memory bank and its pointer, and the train state, with the
 * step the key encoder was last advanced for ("key_step": it advances
 * right after each step; a checkpoint without it is of before that rule,
 * when it advanced before each step: key_step = step - 1). */
typedef struct {
    visc_model *query, *key;         /* key: MoCo only (NULL otherwise) */
    visc_proj_head *head, *key_head; /* key_head: MoCo only */
    visc_optimizer *opt, *head_opt;
    visc_memory_bank *bank; /* MoCo only */
    visc_train_state *state;
    int64_t *key_step; /* MoCo only (NULL otherwise) */
    const char *method;
} visc_ssl_parts;

int visc_ssl_save_checkpoint(const visc_ssl_parts *p, const char *config_text, const char *path);
/* The resume state of a checkpoint's "visc_train_state" metadata (JSON),
 * validated; exposed for fuzzing. */
typedef struct {
    char method[16];
    visc_train_state train; /* world 0: the ranks' cursors are unknown */
    int64_t opt_steps, head_opt_steps, bn_updates, key_bn_updates, bank_ptr;
    int64_t key_step; /* step - 1 when the checkpoint does not say */
} visc_ssl_state;
int visc_ssl_state_parse(const char *text, visc_ssl_state *out);
/* Everything must be present with its shape; the method must match. */
int visc_ssl_load_checkpoint(const visc_ssl_parts *p, const char *path);

/* ---- pretrain.c ---- */
/* visc_train_config_defaults, then the pretraining defaults: MoCo v2, and
 * "the method's" (0 / empty) for lr, optimizer, weight decay, recipe. */
void visc_pretrain_config_defaults(visc_train_config *c);
/* Applies a named preset (visc_ssl_config.preset) to c before the command
 * line's flags override it. -1 with an error for an unknown name. */
int visc_ssl_preset(const char *name, visc_train_config *c);
/* Fills what the flags left unset with the method's defaults (lr from the
 * global batch, optimizer, schedule, weight decay, augmentation, ...). */
int visc_ssl_resolve(visc_train_config *c);
/* The whole pretraining run. 0, or -1 with the error set. */
int visc_pretrain(const visc_train_config *c);

#endif

/* talking_heads.h: CaiT's talking-heads attention (Shazeer et al. 2020) in
 * steps, each a CPU function here with a GPU twin (gpu.h), so that
 * models/cait.c runs the same sequence on either (private to src/models
 * and the GPU tests).
 *
 * qkv rows are [B, T, 3, H, D] (C = H D); the attention matrices
 * [B, H, T, T] are materialized, because the heads are mixed at every
 * (i, j) before and after the softmax:
 *   S = scale q k^T,  P = softmax(proj_l(S)),  A = proj_w(P),  out = A v.
 * Every step overwrites its output. */
#ifndef VISC_MODELS_TALKING_HEADS_H
#define VISC_MODELS_TALKING_HEADS_H

#include <stddef.h>

#include "visc/tokens.h" /* visc_th_dims */

/* S[b, h, i, j] = scale q_i . k_j */
void visc_th_scores(float *S, const float *qkv, const visc_th_dims *d);
/* out[b, f, :] = bias[f] + sum_g W[f, g] in[b, g, :] over TT contiguous
 * floats; transpose uses W[g, f] (the backward of the mix); bias NULL: 0. */
void visc_th_mix(float *out, const float *in, const float *W, const float *bias, int B, int H,
                 size_t TT, int transpose);
/* softmax of each of `rows` rows of T, in place */
void visc_th_softmax(float *P, size_t rows, int T);
/* att[b, i, f, :] = sum_j A[b, f, i, j] v_j */
void visc_th_apply(float *att, const float *A, const float *qkv, const visc_th_dims *d);
/* dA[b, f, i, j] = datt[b, i, f, :] . v_j */
void visc_th_grad_a(float *dA, const float *datt, const float *qkv, const visc_th_dims *d);
/* the v part of dqkv: dv_j = sum_i A[b, f, i, j] datt[b, i, f, :] */
void visc_th_grad_v(float *dqkv, const float *A, const float *datt, const visc_th_dims *d);
/* dW[f, g] = sum_b <dY[b, f], X[b, g]>, db[f] = sum_b sum dY[b, f] (double sums) */
void visc_th_mix_grad(float *dW, float *db, const float *dY, const float *X, int B, int H,
                      size_t TT);
/* the softmax's backward in place: dS = P (dS - <P, dS>) per row */
void visc_th_softmax_backward(float *dS, const float *P, size_t rows, int T);
/* the q and k parts of dqkv: dq = scale dS k, dk = scale dS^T q */
void visc_th_grad_qk(float *dqkv, const float *dS, const float *qkv, const visc_th_dims *d);

#endif

/* conv2d.c: 2-D convolution on oneDNN (forward, backward-data, backward-weights).
 *
 * The three primitives are created once in init for the descriptor's shape.
 * Activations and weights stay in the caller's NCHW / OIHW; inside, a
 * primitive may run on a blocked layout (nChw16c, OIhw16i16o, ...) chosen
 * by oneDNN, with reorders at the boundary (see visc_dnnl_tensor). Blocked
 * is much faster for the channel counts of ResNets; plain NCHW avoids the
 * reorders and wins for 1x1 convolutions on large planes, see
 * choose_layout.
 *
 * Tiny planes (fewer input pixels than kernel taps, e.g. ResNet-18's
 * layer3/layer4 at 32 px: 3x3 convs on 2x2 and 1x1 planes) skip oneDNN: most
 * taps of a direct convolution there multiply padding. Such a convolution
 * is one dense matrix from the C*H*W inputs of an image to its K*P*Q
 * outputs, so the three passes are plain GEMMs on the NCHW data (no
 * reorders) doing only the live multiply-adds, see the "dense" section.
 *
 * Memory: one input-sized and one output-sized internal buffer, shared by
 * the passes (forward src / backward src / backward diff_src, and forward
 * dst / backward diff_dst), plus one scratchpad for all three; and since
 * each holds data only during one call (the reorder in, the primitive, the
 * reorder out), one set for every convolution of the process, sized for
 * the largest (see "workspace"). Per layer they came to half a ResNet's
 * activation memory again: 1.2 GiB for ResNet-50 at batch 32, 224 px. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "visc/cpu.h"
#include "visc/nn.h"

typedef struct {
    dnnl_primitive_t fwd, bwd_data, bwd_weights;
    /* forward */
    visc_dnnl_tensor src, wei, bias, dst;
    /* backward-weights */
    visc_dnnl_tensor bw_src, bw_ddst, bw_dwei, bw_dbias;
    /* backward-data; bd_ddst unused when it would equal bw_ddst */
    visc_dnnl_tensor bd_ddst, bd_wei, bd_dsrc;
    int bd_reuses_ddst;
    dnnl_memory_t scratch_mem;
    unsigned workspace_generation; /* the workspace its memories point at */
    /* dense path (no oneDNN primitives): the conv as a [K*P*Q, C*H*W]
     * matrix A, held in `dense` as A^T by forward and as A by backward-data,
     * and its gradient `ddense` */
    int is_dense;
    float *dense, *ddense;
} conv_impl;

/* 1: let oneDNN pick blocked activation layouts; 0: keep NCHW throughout.
 * Measured with bench/bench_kernels (AVX-512, oneDNN 2.6): blocked is up to
 * 2-3x faster for 3x3 and 7x7 kernels at every channel count tried (3-512)
 * and for 1x1 on small planes; a stride-1 1x1 on a large plane (>= 28x28)
 * is a plain GEMM in NCHW, where the two activation reorders cost more
 * than blocking gains. VISC_CONV_LAYOUT=plain|blocked overrides. */
static int choose_layout(const visc_conv2d *c) {
    const char *env = getenv("VISC_CONV_LAYOUT");
    if (env && strcmp(env, "plain") == 0) return 0;
    if (env && strcmp(env, "blocked") == 0) return 1;
    if (c->R == 1 && c->S == 1 && c->stride == 1 && c->pad == 0 && c->groups == 1 &&
        c->H * c->W >= 28 * 28)
        return 0;
    return 1;
}

/* ---- dense path for tiny planes ----
 *
 * Output (k, p, q) of image n is sum over inputs (c, h, w) of
 * A[(k,p,q), (c,h,w)] * x[n, c, h, w], where A holds the weight tap that
 * connects the two (h = p*stride - pad + r*dilation, likewise w) or 0. With
 * X = the batch as an N x CHW matrix (NCHW as it is) and Y as N x KPQ:
 *   forward          Y  = X A^T (A^T built directly, see dense_build_t)
 *   backward-data    dX = dY A
 *   backward-weights dA = dY^T X, folded back: dW[k,c,r,s] = sum of dA over
 *                    the (p, q) whose tap (r, s) is live.
 * That costs 2*N*KPQ*CHW flops a pass against 2*N*KPQ*C*R*S for the direct
 * convolution, so it wins whenever H*W < R*S. The same multiply-adds as
 * the direct convolution minus the ones with padding, so results agree to
 * fp32 rounding. VISC_CONV_DENSE=0 turns it off (for A/B checks). */

#define DENSE_MAX_HW 64 /* largest R*S (so largest H*W) the dense path takes */

static int use_dense(const visc_conv2d *c) {
    const char *env = getenv("VISC_CONV_DENSE");
    if (env && strcmp(env, "0") == 0) return 0;
    /* H*W < R*S: fewer flops than the direct convolution; the cap keeps A
     * (P*Q*H*W floats per (input, output) channel pair) within 4x the weights. */
    return c->groups == 1 && c->H * c->W < c->R * c->S && c->R * c->S <= DENSE_MAX_HW &&
           c->P * c->Q * c->H * c->W <= 4 * c->R * c->S;
}

/* Tap index of kernel row (or column) connecting output o to input i, or -1. */
static int dense_tap(int i, int o, int stride, int pad, int dilation, int taps) {
    int t = i - o * stride + pad;
    if (t < 0 || t % dilation) return -1;
    t /= dilation;
    return t < taps ? t : -1;
}

/* Tap offsets r*S + u of output (p, q) for every input pixel, or -1 (not live). */
static void dense_taps(const visc_conv2d *c, int p, int q, int *taps) {
    for (int h = 0; h < c->H; h++) {
        int r = dense_tap(h, p, c->stride, c->pad, c->dilation, c->R);
        for (int w = 0; w < c->W; w++) {
            int u = dense_tap(w, q, c->stride, c->pad, c->dilation, c->S);
            taps[h * c->W + w] = r < 0 || u < 0 ? -1 : r * c->S + u;
        }
    }
}

/* A from the OIHW weights; one row (k, p, q) per iteration, written in
 * order: for each input channel its H*W entries from the channel's R*S taps. */
static void dense_build(const visc_conv2d *c, float *A, const float *weight) {
    const int C = c->C, HW = c->H * c->W, RS = c->R * c->S, P = c->P, Q = c->Q;
    const int rows = c->K * P * Q;
    const size_t cols = (size_t)C * HW;
#pragma omp parallel for schedule(static)
    for (int row = 0; row < rows; row++) {
        int k = row / (P * Q), p = row / Q % P, q = row % Q;
        int taps[DENSE_MAX_HW];
        dense_taps(c, p, q, taps);
        float *a = A + (size_t)row * cols;
        const float *wk = weight + (size_t)k * C * RS;
        for (int ci = 0; ci < C; ci++)
            for (int i = 0; i < HW; i++)
                a[(size_t)ci * HW + i] = taps[i] < 0 ? 0.0f : wk[(size_t)ci * RS + taps[i]];
    }
}

/* A^T ([C*H*W, K*P*Q]), for the forward pass: with it the forward GEMM is
 * 'N','N' (dnnl_sgemm runs 'N','T' at half the speed for these shapes).
 * One input channel per iteration, whose weights are K short runs. */
static void dense_build_t(const visc_conv2d *c, float *At, const float *weight) {
    const int C = c->C, HW = c->H * c->W, RS = c->R * c->S, PQ = c->P * c->Q;
    const size_t rows = (size_t)c->K * PQ;
    int taps[4 * DENSE_MAX_HW]; /* [p*Q + q][h*W + w]; P*Q*H*W <= 4*R*S, see use_dense */
    for (int pq = 0; pq < PQ; pq++) dense_taps(c, pq / c->Q, pq % c->Q, taps + pq * HW);
#pragma omp parallel for schedule(static)
    for (int ci = 0; ci < C; ci++)
        for (int i = 0; i < HW; i++) {
            float *a = At + ((size_t)ci * HW + i) * rows;
            for (int k = 0; k < c->K; k++) {
                const float *w = weight + ((size_t)k * C + ci) * RS;
                for (int pq = 0; pq < PQ; pq++) {
                    int t = taps[pq * HW + i];
                    a[(size_t)k * PQ + pq] = t < 0 ? 0.0f : w[t];
                }
            }
        }
}

/* dW from dA; one output channel per iteration, so the sums over (p, q)
 * run in a fixed order (deterministic). */
static void dense_fold(const visc_conv2d *c, float *dweight, const float *dA) {
    const int C = c->C, HW = c->H * c->W, RS = c->R * c->S, P = c->P, Q = c->Q;
    const size_t cols = (size_t)C * HW;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < c->K; k++) {
        float *dw = dweight + (size_t)k * C * RS;
        memset(dw, 0, sizeof(float) * C * RS);
        for (int p = 0; p < P; p++)
            for (int q = 0; q < Q; q++) {
                int taps[DENSE_MAX_HW];
                dense_taps(c, p, q, taps);
                const float *da = dA + (((size_t)k * P + p) * Q + q) * cols;
                for (int ci = 0; ci < C; ci++)
                    for (int i = 0; i < HW; i++)
                        if (taps[i] >= 0) dw[(size_t)ci * RS + taps[i]] += da[(size_t)ci * HW + i];
            }
    }
}

static void sgemm(char ta, char tb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K, const float *A,
                  dnnl_dim_t lda, const float *B, dnnl_dim_t ldb, float *Cm, dnnl_dim_t ldc) {
    VISC_DNNL(dnnl_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, Cm, ldc));
}

static void dense_forward(visc_conv2d *c, conv_impl *im, float *out, const float *in,
                          const float *weight, const float *bias) {
    const int N = c->N, PQ = c->P * c->Q, rows = c->K * PQ, cols = c->C * c->H * c->W;
    dense_build_t(c, im->dense, weight);
    sgemm('N', 'N', N, rows, cols, in, cols, im->dense, rows, out, rows);
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            for (int k = 0; k < c->K; k++)
                for (int i = 0; i < PQ; i++) out[((size_t)n * c->K + k) * PQ + i] += bias[k];
    }
}

static void dense_backward(visc_conv2d *c, conv_impl *im, float *din, float *dweight, float *dbias,
                           const float *dout, const float *in, const float *weight) {
    const int N = c->N, PQ = c->P * c->Q, rows = c->K * PQ, cols = c->C * c->H * c->W;
    sgemm('T', 'N', rows, cols, N, dout, rows, in, cols, im->ddense, cols);
    dense_fold(c, dweight, im->ddense);
    if (c->has_bias && dbias) {
#pragma omp parallel for schedule(static)
        for (int k = 0; k < c->K; k++) {
            double s = 0;
            for (int n = 0; n < N; n++)
                for (int i = 0; i < PQ; i++) s += dout[((size_t)n * c->K + k) * PQ + i];
            dbias[k] = (float)s;
        }
    }
    if (!din) return;
    dense_build(c, im->dense, weight);
    sgemm('N', 'N', N, cols, rows, dout, rows, im->dense, cols, din, cols);
}

/* ---- workspace: the layout buffers and scratchpad every convolution shares ----
 * Grown (never shrunk) as layers are created, freed with the last one. A
 * layer whose memories point at an older allocation points them at the
 * current one at its next call (the generation differs). One call at a
 * time in the process: the layers run one after another (asserted). */
static struct {
    void *in, *out, *scratch;
    size_t in_bytes, out_bytes, scratch_bytes;
    unsigned generation;
    int layers;
    atomic_flag busy;
} workspace = {.busy = ATOMIC_FLAG_INIT};

static void *grow(void *p, size_t *have, size_t want, const char *what) {
    if (want <= *have) return p;
    visc_free_aligned(p);
    *have = want;
    workspace.generation++;
    return visc_alloc_aligned(want, what);
}

static void workspace_reserve(size_t in, size_t out, size_t scratch) {
    workspace.in = grow(workspace.in, &workspace.in_bytes, in, "conv2d input layout buffer");
    workspace.out = grow(workspace.out, &workspace.out_bytes, out, "conv2d output layout buffer");
    workspace.scratch =
        grow(workspace.scratch, &workspace.scratch_bytes, scratch, "conv2d scratchpad");
    workspace.layers++;
}

static void workspace_release(void) {
    if (--workspace.layers > 0) return;
    visc_free_aligned(workspace.in);
    visc_free_aligned(workspace.out);
    visc_free_aligned(workspace.scratch);
    workspace.in = workspace.out = workspace.scratch = NULL;
    workspace.in_bytes = workspace.out_bytes = workspace.scratch_bytes = 0;
    workspace.generation++;
}

static void point_at(visc_dnnl_tensor *t, void *buf) {
    if (!t->reorder) return; /* no inner copy: the caller's own memory */
    t->buf = buf;
    visc_dnnl_set_handle(t->inner, buf);
}

/* Takes the workspace for one call, its memories pointed at it. */
static void workspace_enter(conv_impl *im) {
    VISC_ASSERT(!atomic_flag_test_and_set(&workspace.busy));
    if (im->workspace_generation == workspace.generation) return;
    visc_dnnl_tensor *ins[] = {&im->src, &im->bw_src, &im->bd_dsrc};
    visc_dnnl_tensor *outs[] = {&im->dst, &im->bw_ddst, &im->bd_ddst};
    for (int i = 0; i < 3; i++) point_at(ins[i], workspace.in);
    for (int i = 0; i < 3; i++)
        if (i < 2 || !im->bd_reuses_ddst) point_at(outs[i], workspace.out);
    visc_dnnl_set_handle(im->scratch_mem, workspace.scratch);
    im->workspace_generation = workspace.generation;
}

static void workspace_leave(void) { atomic_flag_clear(&workspace.busy); }

/* ---- oneDNN path ---- */

static const dnnl_memory_desc_t *pd_md(const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
    return dnnl_primitive_desc_query_md(pd, what, 0);
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

void visc_conv2d_init_shape(visc_conv2d *c, int N, int C, int H, int W, int K, int R, int S,
                            int stride, int pad, int dilation, int groups, int has_bias) {
    VISC_ASSERT(N > 0 && C > 0 && H > 0 && W > 0 && K > 0 && R > 0 && S > 0);
    VISC_ASSERT(stride > 0 && pad >= 0 && dilation > 0 && groups > 0);
    /* cppcheck-suppress zerodivcond ; the assert above dies when groups <= 0 */
    VISC_ASSERT(C % groups == 0 && K % groups == 0);
    memset(c, 0, sizeof *c);
    c->N = N, c->C = C, c->H = H, c->W = W, c->K = K, c->R = R, c->S = S;
    c->stride = stride, c->pad = pad, c->dilation = dilation, c->groups = groups;
    c->has_bias = has_bias;
    c->P = (H + 2 * pad - dilation * (R - 1) - 1) / stride + 1;
    c->Q = (W + 2 * pad - dilation * (S - 1) - 1) / stride + 1;
    VISC_ASSERT(c->P > 0 && c->Q > 0);
    c->device = VISC_DEVICE_CPU;
    c->impl = NULL;
}

void visc_conv2d_init(visc_conv2d *c, int N, int C, int H, int W, int K, int R, int S, int stride,
                      int pad, int dilation, int groups, int has_bias) {
    visc_conv2d_init_shape(c, N, C, H, W, K, R, S, stride, pad, dilation, groups, has_bias);
    conv_impl *im = visc_calloc(1, sizeof *im, "conv2d primitives");
    c->impl = im;
    if (use_dense(c)) {
        size_t n = (size_t)K * c->P * c->Q * C * H * W * sizeof(float);
        im->is_dense = 1;
        im->dense = visc_alloc_aligned(n, "conv2d dense matrix");
        im->ddense = visc_alloc_aligned(n, "conv2d dense matrix gradient");
        return;
    }

    /* Plain (user) descriptors. Grouped weights [G, K/G, C/G, R, S] are the
     * same memory as PyTorch's [K, C/G, R, S]. */
    dnnl_memory_desc_t u_src, u_wei, u_bias, u_dst;
    /* dnnl_dims_t (12 entries) everywhere: oneDNN's prototypes take that type. */
    dnnl_dims_t src_dims = {N, C, H, W}, dst_dims = {N, K, c->P, c->Q}, bias_dims = {K};
    dnnl_dims_t gwei_dims = {groups, K / groups, C / groups, R, S}, wei_dims = {K, C, R, S};
    int wei_nd = groups > 1 ? 5 : 4;
    const dnnl_dim_t *wd = groups > 1 ? gwei_dims : wei_dims;
    visc_dnnl_md(&u_src, 4, src_dims, dnnl_nchw);
    visc_dnnl_md(&u_dst, 4, dst_dims, dnnl_nchw);
    visc_dnnl_md(&u_wei, wei_nd, wd, groups > 1 ? dnnl_goihw : dnnl_oihw);
    visc_dnnl_md(&u_bias, 1, bias_dims, dnnl_a);

    /* What the primitives may choose. */
    int blocked = choose_layout(c);
    dnnl_memory_desc_t a_src, a_wei, a_bias, a_dst;
    visc_dnnl_md(&a_src, 4, src_dims, blocked ? dnnl_format_tag_any : dnnl_nchw);
    visc_dnnl_md(&a_dst, 4, dst_dims, blocked ? dnnl_format_tag_any : dnnl_nchw);
    visc_dnnl_md(&a_wei, wei_nd, wd, dnnl_format_tag_any);
    visc_dnnl_md(&a_bias, 1, bias_dims, dnnl_a);

    dnnl_dims_t strides = {stride, stride}, dil = {dilation - 1, dilation - 1}, pads = {pad, pad};
    const dnnl_memory_desc_t *bias_md = has_bias ? &a_bias : NULL;
    dnnl_primitive_attr_t attr = visc_dnnl_attr_user_scratchpad();
    dnnl_engine_t eng = visc_dnnl_engine();

    dnnl_convolution_desc_t fd, bdd, bwd;
    dnnl_primitive_desc_t fpd, bdpd, bwpd;
    VISC_DNNL(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                         dnnl_convolution_direct, &a_src, &a_wei,
                                                         bias_md, &a_dst, strides, dil, pads,
                                                         pads));
    VISC_DNNL(dnnl_primitive_desc_create(&fpd, &fd, attr, eng, NULL));
    VISC_DNNL(dnnl_dilated_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct,
                                                               &a_src, &a_wei, &a_dst, strides, dil,
                                                               pads, pads));
    VISC_DNNL(dnnl_primitive_desc_create(&bdpd, &bdd, attr, eng, fpd));
    VISC_DNNL(dnnl_dilated_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct,
                                                                  &a_src, &a_wei, bias_md, &a_dst,
                                                                  strides, dil, pads, pads));
    VISC_DNNL(dnnl_primitive_desc_create(&bwpd, &bwd, attr, eng, fpd));
    VISC_DNNL(dnnl_primitive_attr_destroy(attr));

    /* Shared internal buffers: sized for the largest user of each. */
    const dnnl_memory_desc_t *f_src = pd_md(fpd, dnnl_query_src_md);
    const dnnl_memory_desc_t *f_dst = pd_md(fpd, dnnl_query_dst_md);
    const dnnl_memory_desc_t *w_src = pd_md(bwpd, dnnl_query_src_md);
    const dnnl_memory_desc_t *w_ddst = pd_md(bwpd, dnnl_query_diff_dst_md);
    const dnnl_memory_desc_t *d_ddst = pd_md(bdpd, dnnl_query_diff_dst_md);
    const dnnl_memory_desc_t *d_dsrc = pd_md(bdpd, dnnl_query_diff_src_md);
    size_t in_bytes = max_size(visc_dnnl_tensor_bytes(&u_src, f_src),
                               max_size(visc_dnnl_tensor_bytes(&u_src, w_src),
                                        visc_dnnl_tensor_bytes(&u_src, d_dsrc)));
    size_t out_bytes = max_size(visc_dnnl_tensor_bytes(&u_dst, f_dst),
                                max_size(visc_dnnl_tensor_bytes(&u_dst, w_ddst),
                                         visc_dnnl_tensor_bytes(&u_dst, d_ddst)));
    size_t scratch =
        max_size(visc_dnnl_scratchpad_bytes(fpd),
                 max_size(visc_dnnl_scratchpad_bytes(bdpd), visc_dnnl_scratchpad_bytes(bwpd)));
    /* at least 64 bytes each: a buffer the memories can point at */
    workspace_reserve(max_size(in_bytes, 64), max_size(out_bytes, 64), max_size(scratch, 64));
    im->workspace_generation = workspace.generation;

    visc_dnnl_tensor_init(&im->src, &u_src, f_src, 0, workspace.in);
    visc_dnnl_tensor_init(&im->wei, &u_wei, pd_md(fpd, dnnl_query_weights_md), 0, NULL);
    visc_dnnl_tensor_init(&im->dst, &u_dst, f_dst, 1, workspace.out);
    visc_dnnl_tensor_init(&im->bw_src, &u_src, w_src, 0, workspace.in);
    visc_dnnl_tensor_init(&im->bw_ddst, &u_dst, w_ddst, 0, workspace.out);
    visc_dnnl_tensor_init(&im->bw_dwei, &u_wei, pd_md(bwpd, dnnl_query_diff_weights_md), 1, NULL);
    im->bd_reuses_ddst = dnnl_memory_desc_equal(w_ddst, d_ddst);
    if (!im->bd_reuses_ddst) visc_dnnl_tensor_init(&im->bd_ddst, &u_dst, d_ddst, 0, workspace.out);
    visc_dnnl_tensor_init(&im->bd_wei, &u_wei, pd_md(bdpd, dnnl_query_weights_md), 0, NULL);
    visc_dnnl_tensor_init(&im->bd_dsrc, &u_src, d_dsrc, 1, workspace.in);
    if (has_bias) {
        /* Bias is 1-D: always the plain layout, so these never reorder. */
        visc_dnnl_tensor_init(&im->bias, &u_bias, &u_bias, 0, NULL);
        visc_dnnl_tensor_init(&im->bw_dbias, &u_bias, &u_bias, 1, NULL);
    }

    dnnl_memory_desc_t smd;
    dnnl_dims_t sdims = {(dnnl_dim_t)(scratch ? scratch : 64)};
    VISC_DNNL(dnnl_memory_desc_init_by_tag(&smd, 1, sdims, dnnl_u8, dnnl_a));
    im->scratch_mem = visc_dnnl_memory(&smd, workspace.scratch);

    im->fwd = visc_dnnl_primitive(fpd);
    im->bwd_data = visc_dnnl_primitive(bdpd);
    im->bwd_weights = visc_dnnl_primitive(bwpd);
    VISC_DNNL(dnnl_primitive_desc_destroy(fpd));
    VISC_DNNL(dnnl_primitive_desc_destroy(bdpd));
    VISC_DNNL(dnnl_primitive_desc_destroy(bwpd));
}

void visc_conv2d_forward(visc_conv2d *c, float *out, const float *in, const float *weight,
                         const float *bias) {
    VISC_ASSERT(c->impl); /* not a visc_conv2d_init_shape layer */
    conv_impl *im = c->impl;
    /* cppcheck-suppress nullPointerRedundantCheck ; asserted non-NULL above */
    if (im->is_dense) {
        dense_forward(c, im, out, in, weight, c->has_bias ? bias : NULL);
        return;
    }
    workspace_enter(im);
    dnnl_exec_arg_t args[5];
    int n = 0;
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, visc_dnnl_tensor_in(&im->src, in)};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, visc_dnnl_tensor_in(&im->wei, weight)};
    if (c->has_bias)
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, visc_dnnl_tensor_in(&im->bias, bias)};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DST, visc_dnnl_tensor_out(&im->dst, out)};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, im->scratch_mem};
    visc_dnnl_run(im->fwd, n, args);
    visc_dnnl_tensor_out_done(&im->dst);
    workspace_leave();
}

void visc_conv2d_backward(visc_conv2d *c, float *din, float *dweight, float *dbias,
                          const float *dout, const float *in, const float *weight) {
    VISC_ASSERT(c->impl); /* not a visc_conv2d_init_shape layer */
    conv_impl *im = c->impl;
    /* cppcheck-suppress nullPointerRedundantCheck ; asserted non-NULL above */
    if (im->is_dense) {
        dense_backward(c, im, din, dweight, dbias, dout, in, weight);
        return;
    }
    /* Weights first: it needs src in the shared input buffer, which
     * backward-data then reuses for diff_src. */
    workspace_enter(im);
    dnnl_exec_arg_t args[5];
    int n = 0;
    dnnl_memory_t ddst = visc_dnnl_tensor_in(&im->bw_ddst, dout);
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, visc_dnnl_tensor_in(&im->bw_src, in)};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, ddst};
    args[n++] =
        (dnnl_exec_arg_t){DNNL_ARG_DIFF_WEIGHTS, visc_dnnl_tensor_out(&im->bw_dwei, dweight)};
    if (c->has_bias)
        args[n++] =
            (dnnl_exec_arg_t){DNNL_ARG_DIFF_BIAS, visc_dnnl_tensor_out(&im->bw_dbias, dbias)};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, im->scratch_mem};
    visc_dnnl_run(im->bwd_weights, n, args);
    visc_dnnl_tensor_out_done(&im->bw_dwei);
    if (c->has_bias) visc_dnnl_tensor_out_done(&im->bw_dbias);

    if (!din) {
        workspace_leave();
        return;
    }
    if (!im->bd_reuses_ddst) ddst = visc_dnnl_tensor_in(&im->bd_ddst, dout);
    n = 0;
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, ddst};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, visc_dnnl_tensor_in(&im->bd_wei, weight)};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_SRC, visc_dnnl_tensor_out(&im->bd_dsrc, din)};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, im->scratch_mem};
    visc_dnnl_run(im->bwd_data, n, args);
    visc_dnnl_tensor_out_done(&im->bd_dsrc);
    workspace_leave();
}

void visc_conv2d_destroy(visc_conv2d *c) {
    conv_impl *im = c->impl;
    if (!im) return;
    if (im->is_dense) {
        visc_free_aligned(im->dense);
        visc_free_aligned(im->ddense);
        free(im);
        c->impl = NULL;
        return;
    }
    VISC_DNNL(dnnl_primitive_destroy(im->fwd));
    VISC_DNNL(dnnl_primitive_destroy(im->bwd_data));
    VISC_DNNL(dnnl_primitive_destroy(im->bwd_weights));
    visc_dnnl_tensor *all[] = {&im->src,     &im->wei,     &im->dst,    &im->bw_src,
                               &im->bw_ddst, &im->bw_dwei, &im->bd_wei, &im->bd_dsrc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) visc_dnnl_tensor_destroy(all[i]);
    if (!im->bd_reuses_ddst) visc_dnnl_tensor_destroy(&im->bd_ddst);
    if (c->has_bias) {
        visc_dnnl_tensor_destroy(&im->bias);
        visc_dnnl_tensor_destroy(&im->bw_dbias);
    }
    VISC_DNNL(dnnl_memory_destroy(im->scratch_mem));
    workspace_release();
    free(im);
    c->impl = NULL;
}

double visc_conv2d_flops(const visc_conv2d *c) {
    return 2.0 * c->N * c->K * c->P * c->Q * (double)(c->C / c->groups) * c->R * c->S;
}

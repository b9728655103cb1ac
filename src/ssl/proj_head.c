/* proj_head.c: the projection heads between backbone features and the
 * contrastive loss, with the reference library's parameter names:
 *   MoCo v2 (MoCoProjectionHead):  layers.0 Linear(in, hidden) + bias,
 *                                  ReLU, layers.2 Linear(hidden, out) + bias
 *   SimCLR (SimCLRProjectionHead): layers.0 Linear(in, hidden) no bias,
 *                                  layers.1 BatchNorm1d(hidden), ReLU,
 *                                  layers.3 Linear(hidden, out) + bias
 * Initialization as nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in)) for
 * weights and biases; BatchNorm weight 1, bias 0.
 *
 * On a GPU (visc_proj_head_to_gpu) the same sequence runs, each layer call
 * going to its twin in gpu.h: the heads' products (for ResNet-50's 2048
 * features as large as InfoNCE's against a 65,536-key bank) leave the
 * host, and the features never wait on the bus for them. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "visc/gpu.h"
#include "visc/rng.h"
#include "visc/ssl.h"

static int add(visc_table *t, const char *prefix, const char *name, int ndim, int64_t d0,
               int64_t d1, unsigned flags) {
    char key[VISC_MAX_NAME];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    int64_t shape[2] = {d0, d1};
    return visc_table_add(t, key, ndim, shape, flags);
}

static void uniform_fill(float *x, size_t n, float bound, visc_rng *r) {
    for (size_t i = 0; i < n; i++) x[i] = (2.0f * visc_rng_uniform(r) - 1.0f) * bound;
}

/* The activations (host or device memory) and their sizes in floats. */
static void activations(visc_proj_head *h, float **act[8]) {
    float **a[8] = {&h->x, &h->h, &h->a, &h->output, &h->dh, &h->da, &h->save_mean, &h->save_rstd};
    memcpy(act, a, sizeof a);
}
static void activation_sizes(const visc_proj_head *h, size_t floats[8]) {
    const size_t N = (size_t)h->batch, hid = (size_t)h->hidden;
    const size_t f[8] = {N * h->in, N * hid, N * hid, N * h->out, N * hid, N * hid, hid, hid};
    memcpy(floats, f, sizeof f);
}

void visc_proj_head_init(visc_proj_head *h, const char *prefix, int in, int hidden, int out,
                         int batch, int batchnorm, uint64_t seed) {
    memset(h, 0, sizeof *h);
    h->in = in, h->hidden = hidden, h->out = out, h->batch = batch, h->batchnorm = batchnorm;
    visc_table_init(&h->params);
    visc_table_init(&h->buffers);
    const unsigned bias = VISC_TENSOR_NO_DECAY | VISC_TENSOR_BIAS;
    const unsigned norm = VISC_TENSOR_NO_DECAY | VISC_TENSOR_NORM;
    h->w1 = add(&h->params, prefix, "layers.0.weight", 2, hidden, in, 0);
    h->b1 = h->gamma = h->beta = h->mean = h->var = -1;
    if (batchnorm) {
        h->gamma = add(&h->params, prefix, "layers.1.weight", 1, hidden, 0, norm);
        h->beta = add(&h->params, prefix, "layers.1.bias", 1, hidden, 0, norm);
        h->w2 = add(&h->params, prefix, "layers.3.weight", 2, out, hidden, 0);
        h->b2 = add(&h->params, prefix, "layers.3.bias", 1, out, 0, bias);
        h->mean = add(&h->buffers, prefix, "layers.1.running_mean", 1, hidden, 0, 0);
        h->var = add(&h->buffers, prefix, "layers.1.running_var", 1, hidden, 0, 0);
    } else {
        h->b1 = add(&h->params, prefix, "layers.0.bias", 1, hidden, 0, bias);
        h->w2 = add(&h->params, prefix, "layers.2.weight", 2, out, hidden, 0);
        h->b2 = add(&h->params, prefix, "layers.2.bias", 1, out, 0, bias);
    }
    visc_table_alloc(&h->params);
    visc_table_alloc(&h->buffers);
    h->grads = visc_alloc_aligned(h->params.total * sizeof(float), "projection head gradients");
    memset(h->grads, 0, h->params.total * sizeof(float));
    visc_rng r = visc_rng_make(seed, VISC_STREAM_SSL, 1ull << 41);
    float b1 = 1.0f / sqrtf((float)in), b2 = 1.0f / sqrtf((float)hidden);
    uniform_fill(visc_table_get(&h->params, h->w1), (size_t)hidden * in, b1, &r);
    if (h->b1 >= 0) uniform_fill(visc_table_get(&h->params, h->b1), (size_t)hidden, b1, &r);
    uniform_fill(visc_table_get(&h->params, h->w2), (size_t)out * hidden, b2, &r);
    uniform_fill(visc_table_get(&h->params, h->b2), (size_t)out, b2, &r);
    if (batchnorm) {
        float *g = visc_table_get(&h->params, h->gamma), *v = visc_table_get(&h->buffers, h->var);
        for (int i = 0; i < hidden; i++) g[i] = v[i] = 1.0f;
        visc_batchnorm2d_init(&h->bn, batch, hidden, 1, 1e-5f, 0.1f, 1);
    }
    float **act[8];
    activations(h, act);
    size_t floats[8];
    activation_sizes(h, floats);
    for (int i = 0; i < 8; i++)
        *act[i] = visc_alloc_aligned(floats[i] * sizeof(float), "projection head activations");
}

/* A parameter, its gradient, a buffer: where the head computes (the
 * device's copies once it is on a GPU). */
static float *param(const visc_proj_head *h, int i) {
    return (h->cuda ? h->dev_params : h->params.data) + h->params.entries[i].offset;
}
static float *grad(const visc_proj_head *h, int i) {
    return (h->cuda ? h->dev_grads : h->grads) + h->params.entries[i].offset;
}
static float *buffer(const visc_proj_head *h, int i) {
    return (h->cuda ? h->dev_buffers : h->buffers.data) + h->buffers.entries[i].offset;
}
#define HP(i) param(h, (i))
#define HG(i) grad(h, (i))
#define HB(i) buffer(h, (i))

static void linear_forward(visc_proj_head *h, float *out, const float *in, int w, int b, int fin,
                           int fout) {
    const float *bias = b >= 0 ? HP(b) : NULL;
    if (h->cuda) visc_gpu_linear_forward(h->cuda, out, in, HP(w), bias, h->batch, fin, fout);
    else visc_linear_forward(out, in, HP(w), bias, h->batch, fin, fout);
}

static void linear_backward(visc_proj_head *h, float *din, const float *dout, const float *in,
                            int w, int b, int fin, int fout) {
    float *dbias = b >= 0 ? HG(b) : NULL;
    if (h->cuda)
        visc_gpu_linear_backward(h->cuda, din, HG(w), dbias, dout, in, HP(w), h->batch, fin, fout);
    else visc_linear_backward(din, HG(w), dbias, dout, in, HP(w), h->batch, fin, fout);
}

void visc_proj_head_forward(visc_proj_head *h, const float *x, int train) {
    const size_t N = (size_t)h->batch;
    visc_cuda *gpu = h->cuda;
    /* kept for the weight gradient: x (the backbone's features) may be
     * overwritten before backward */
    if (gpu) visc_gpu_copy(gpu, h->x, x, N * h->in);
    else memcpy(h->x, x, N * h->in * sizeof(float));
    linear_forward(h, h->h, h->x, h->w1, h->b1, h->in, h->hidden);
    if (h->batchnorm) {
        /* BatchNorm1d over the batch with the ReLU fused (HW = 1) */
        const float *g = HP(h->gamma), *b = HP(h->beta);
        float *mean = HB(h->mean), *var = HB(h->var);
        if (train && gpu)
            visc_gpu_batchnorm2d_forward_train(gpu, &h->bn, VISC_GPU_F32_NCHW, h->a, h->save_mean,
                                               h->save_rstd, h->h, g, b, mean, var);
        else if (train)
            visc_batchnorm2d_forward_train(&h->bn, h->a, h->save_mean, h->save_rstd, h->h, g, b,
                                           mean, var);
        else if (gpu)
            visc_gpu_batchnorm2d_forward_eval(gpu, &h->bn, VISC_GPU_F32_NCHW, h->a, h->h, g, b,
                                              mean, var);
        else visc_batchnorm2d_forward_eval(&h->bn, h->a, h->h, g, b, mean, var);
    } else if (gpu) {
        visc_gpu_relu_forward(gpu, h->a, h->h, N * h->hidden);
    } else {
        visc_relu_forward(h->a, h->h, N * h->hidden);
    }
    linear_forward(h, h->output, h->a, h->w2, h->b2, h->hidden, h->out);
}

void visc_proj_head_backward(visc_proj_head *h, const float *dout, float *dx) {
    const size_t N = (size_t)h->batch;
    visc_cuda *gpu = h->cuda;
    linear_backward(h, h->da, dout, h->a, h->w2, h->b2, h->hidden, h->out);
    if (h->batchnorm && gpu)
        visc_gpu_batchnorm2d_backward(gpu, &h->bn, VISC_GPU_F32_NCHW, h->dh, HG(h->gamma),
                                      HG(h->beta), h->da, h->h, h->a, HP(h->gamma), HP(h->beta),
                                      h->save_mean, h->save_rstd);
    else if (h->batchnorm)
        visc_batchnorm2d_backward(&h->bn, h->dh, HG(h->gamma), HG(h->beta), h->da, h->h, h->a,
                                  HP(h->gamma), h->save_mean, h->save_rstd);
    else if (gpu) visc_gpu_relu_backward(gpu, h->dh, h->da, h->a, N * h->hidden);
    else visc_relu_backward(h->dh, h->da, h->a, N * h->hidden);
    linear_backward(h, dx, h->dh, h->x, h->w1, h->b1, h->in, h->hidden);
}

int visc_proj_head_to_gpu(visc_proj_head *h, visc_cuda *ctx) {
    const size_t pb = h->params.total * sizeof(float), bb = h->buffers.total * sizeof(float);
    float *dev[3] = {visc_gpu_alloc(ctx, pb), visc_gpu_alloc(ctx, pb),
                     visc_gpu_alloc(ctx, bb ? bb : sizeof(float))};
    float **act[8], *dact[8] = {0};
    activations(h, act);
    size_t floats[8];
    activation_sizes(h, floats);
    int failed = !dev[0] || !dev[1] || !dev[2];
    for (int i = 0; i < 8 && !failed; i++)
        failed = !(dact[i] = visc_gpu_alloc(ctx, floats[i] * sizeof(float)));
    if (failed) {
        for (int i = 0; i < 3; i++) visc_gpu_free(ctx, dev[i]);
        for (int i = 0; i < 8; i++) visc_gpu_free(ctx, dact[i]);
        return visc_set_error("--device cuda: no GPU memory for the projection head: %s",
                              visc_last_error());
    }
    visc_gpu_upload(ctx, dev[0], h->params.data, pb);
    visc_gpu_zero(ctx, dev[1], h->params.total);
    if (bb) visc_gpu_upload(ctx, dev[2], h->buffers.data, bb);
    for (int i = 0; i < 8; i++) {
        visc_free_aligned(*act[i]);
        *act[i] = dact[i];
    }
    h->cuda = ctx, h->dev_params = dev[0], h->dev_grads = dev[1], h->dev_buffers = dev[2];
    return 0;
}

void visc_proj_head_download(visc_proj_head *h) {
    if (!h->cuda) return;
    visc_gpu_download(h->cuda, h->params.data, h->dev_params, h->params.total * sizeof(float));
    if (h->buffers.total)
        visc_gpu_download(h->cuda, h->buffers.data, h->dev_buffers,
                          h->buffers.total * sizeof(float));
}

void visc_proj_head_download_grads(visc_proj_head *h) {
    if (h->cuda)
        visc_gpu_download(h->cuda, h->grads, h->dev_grads, h->params.total * sizeof(float));
}

void visc_proj_head_upload_grads(visc_proj_head *h) {
    if (h->cuda) visc_gpu_upload(h->cuda, h->dev_grads, h->grads, h->params.total * sizeof(float));
}

void visc_proj_head_free(visc_proj_head *h) {
    if (h->batchnorm) visc_batchnorm2d_destroy(&h->bn);
    visc_table_free(&h->params);
    visc_table_free(&h->buffers);
    visc_free_aligned(h->grads);
    float **act[8];
    activations(h, act);
    for (int i = 0; i < 8; i++) {
        if (h->cuda) visc_gpu_free(h->cuda, *act[i]);
        else visc_free_aligned(*act[i]);
    }
    if (h->cuda) {
        visc_gpu_free(h->cuda, h->dev_params);
        visc_gpu_free(h->cuda, h->dev_grads);
        visc_gpu_free(h->cuda, h->dev_buffers);
    }
}

/* proj_head.c: the projection heads between backbone features and the
 * contrastive loss, with the reference library's parameter names:
 *   MoCo v2 (MoCoProjectionHead):  layers.0 Linear(in, hidden) + bias,
 *                                  ReLU, layers.2 Linear(hidden, out) + bias
 *   SimCLR (SimCLRProjectionHead): layers.0 Linear(in, hidden) no bias,
 *                                  layers.1 BatchNorm1d(hidden), ReLU,
 *                                  layers.3 Linear(hidden, out) + bias
 * Initialization as nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in)) for
 * weights and biases; BatchNorm weight 1, bias 0. */
#include <math.h>
#include <stdio.h>
#include <string.h>

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
    size_t bh = (size_t)batch * hidden;
    h->x = visc_alloc_aligned((size_t)batch * in * sizeof(float), "projection head input");
    h->h = visc_alloc_aligned(bh * sizeof(float), "projection head");
    h->a = visc_alloc_aligned(bh * sizeof(float), "projection head");
    h->output = visc_alloc_aligned((size_t)batch * out * sizeof(float), "projection head output");
    h->dh = visc_alloc_aligned(bh * sizeof(float), "projection head");
    h->da = visc_alloc_aligned(bh * sizeof(float), "projection head");
    h->save_mean = visc_alloc_aligned((size_t)hidden * sizeof(float), "projection head");
    h->save_rstd = visc_alloc_aligned((size_t)hidden * sizeof(float), "projection head");
}

#define HP(i) visc_table_get(&h->params, (i))
#define HG(i) (h->grads + h->params.entries[(i)].offset)

void visc_proj_head_forward(visc_proj_head *h, const float *x, int train) {
    const int N = h->batch;
    /* kept for the weight gradient: x (the backbone's features) may be
     * overwritten before backward */
    memcpy(h->x, x, (size_t)N * h->in * sizeof(float));
    visc_linear_forward(h->h, h->x, HP(h->w1), h->b1 >= 0 ? HP(h->b1) : NULL, N, h->in, h->hidden);
    if (h->batchnorm) {
        /* BatchNorm1d over the batch with the ReLU fused (HW = 1) */
        float *mean = visc_table_get(&h->buffers, h->mean);
        float *var = visc_table_get(&h->buffers, h->var);
        if (train)
            visc_batchnorm2d_forward_train(&h->bn, h->a, h->save_mean, h->save_rstd, h->h,
                                           HP(h->gamma), HP(h->beta), mean, var);
        else
            visc_batchnorm2d_forward_eval(&h->bn, h->a, h->h, HP(h->gamma), HP(h->beta), mean, var);
    } else {
        visc_relu_forward(h->a, h->h, (size_t)N * h->hidden);
    }
    visc_linear_forward(h->output, h->a, HP(h->w2), HP(h->b2), N, h->hidden, h->out);
}

void visc_proj_head_backward(visc_proj_head *h, const float *dout, float *dx) {
    const int N = h->batch;
    visc_linear_backward(h->da, HG(h->w2), HG(h->b2), dout, h->a, HP(h->w2), N, h->hidden, h->out);
    if (h->batchnorm)
        visc_batchnorm2d_backward(&h->bn, h->dh, HG(h->gamma), HG(h->beta), h->da, h->h, h->a,
                                  HP(h->gamma), h->save_mean, h->save_rstd);
    else visc_relu_backward(h->dh, h->da, h->a, (size_t)N * h->hidden);
    visc_linear_backward(dx, HG(h->w1), h->b1 >= 0 ? HG(h->b1) : NULL, h->dh, h->x, HP(h->w1), N,
                         h->in, h->hidden);
}

void visc_proj_head_free(visc_proj_head *h) {
    if (h->batchnorm) visc_batchnorm2d_destroy(&h->bn);
    visc_table_free(&h->params);
    visc_table_free(&h->buffers);
    visc_free_aligned(h->grads);
    visc_free_aligned(h->x);
    visc_free_aligned(h->h);
    visc_free_aligned(h->a);
    visc_free_aligned(h->output);
    visc_free_aligned(h->dh);
    visc_free_aligned(h->da);
    visc_free_aligned(h->save_mean);
    visc_free_aligned(h->save_rstd);
}

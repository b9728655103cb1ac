/* stage.c: a training step that does not wait for the GPU.
 *
 * Forward's own upload (model.h) waits for the stream, and the loss on the
 * host waits for the logits: each step would drain the GPU twice and leave
 * it idle while the batch crosses the bus. Here the batch crosses on the
 * copy stream while the previous step still computes (two device buffers,
 * each refilled only once the kernels that read it last are behind it),
 * the loss, its gradient and the top-1 count are computed on the device,
 * and each step's loss and count wait there in a results table that the
 * host reads in one copy when it reports. The one wait left in a step is
 * for its own batch's copy (the loader refills that memory next), which
 * runs beside the previous step's kernels.
 *
 * The host sides of the copies (the loader's batch, the labels and soft
 * targets staged here) are page-locked, so the copies run at the bus's
 * speed and truly beside the kernels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "visc/core.h"
#include "visc/cuda.h"
#include "visc/gpu.h"

#ifdef VISC_WITH_CUDA
struct visc_gpu_stage {
    visc_cuda *ctx;
    int batch, classes;
    size_t sample_bytes;
    int soft; /* soft targets (mixup, cutmix) instead of labels */
    int pair; /* this step's buffers: 0 or 1, alternating */
    /* per pair: the batch as it crossed, its labels and soft targets */
    void *dev_x[2];
    int32_t *dev_labels[2];
    float *dev_targets[2];
    /* copied: the pair's copies are done; read: the kernels that read the
     * pair's batch are (the next copy into it waits for that) */
    visc_cuda_event *copied[2], *read[2];
    /* page-locked host staging: labels [2][batch], targets [2][batch * classes] */
    unsigned char *host;
    size_t host_bytes;
    int host_pinned;
    int32_t *host_labels[2];
    float *host_targets[2];
    float *dev_probs, *dev_dlogits;
    /* the results table: a loss and two counts (top-1, top-5) per step */
    float *dev_loss;
    int32_t *dev_counts;
};

static void *device(visc_gpu_stage *s, size_t bytes) { return visc_cuda_alloc(s->ctx, bytes); }

visc_gpu_stage *visc_gpu_stage_create(visc_cuda *ctx, int batch, int classes, size_t sample_bytes,
                                      int soft_targets) {
    visc_gpu_stage *s = visc_calloc(1, sizeof *s, "GPU staging");
    s->ctx = ctx;
    s->batch = batch;
    s->classes = classes;
    s->sample_bytes = sample_bytes;
    s->soft = soft_targets != 0;
    const size_t B = (size_t)batch, K = (size_t)classes;
    const size_t label_bytes = (B * sizeof(int32_t) + 63) / 64 * 64;
    const size_t target_bytes = s->soft ? B * K * sizeof(float) : 0;
    long page = sysconf(_SC_PAGESIZE);
    const size_t align = page > 64 ? (size_t)page : 64;
    s->host_bytes = (2 * (label_bytes + target_bytes) + align - 1) / align * align;
    /* page-aligned: registering it must not touch a page another region holds */
    s->host = aligned_alloc(align, s->host_bytes);
    if (!s->host) {
        visc_set_error("out of memory allocating %zu bytes for GPU staging", s->host_bytes);
        free(s);
        return NULL;
    }
    memset(s->host, 0, s->host_bytes);
    for (int p = 0; p < 2; p++) {
        s->host_labels[p] = (int32_t *)(s->host + p * label_bytes);
        s->host_targets[p] =
            s->soft ? (float *)(s->host + 2 * label_bytes + p * target_bytes) : NULL;
    }
    if (visc_cuda_host_register(ctx, s->host, s->host_bytes) == 0) s->host_pinned = 1;
    else fprintf(stderr, "visc: note: labels stay in pageable memory (%s)\n", visc_last_error());
    int ok = 1;
    for (int p = 0; p < 2 && ok; p++) {
        ok = (s->dev_x[p] = device(s, B * sample_bytes)) &&
             (s->dev_labels[p] = device(s, B * sizeof(int32_t))) &&
             (!s->soft || (s->dev_targets[p] = device(s, B * K * sizeof(float)))) &&
             (s->copied[p] = visc_cuda_event_create(ctx)) &&
             (s->read[p] = visc_cuda_event_create(ctx));
    }
    ok = ok && (s->dev_probs = device(s, B * K * sizeof(float))) &&
         (s->dev_dlogits = device(s, B * K * sizeof(float))) &&
         (s->dev_loss = device(s, VISC_GPU_STAGE_STEPS * sizeof(float))) &&
         (s->dev_counts = device(s, 2 * VISC_GPU_STAGE_STEPS * sizeof(int32_t)));
    if (!ok) {
        visc_gpu_stage_free(s);
        return NULL;
    }
    return s;
}

void visc_gpu_stage_free(visc_gpu_stage *s) {
    if (!s) return;
    /* nothing queued, kernel or copy, may still use what goes now */
    visc_cuda_sync(s->ctx);
    for (int p = 0; p < 2; p++)
        if (s->copied[p]) visc_cuda_event_wait(s->ctx, s->copied[p]);
    for (int p = 0; p < 2; p++) {
        visc_cuda_free(s->ctx, s->dev_x[p]);
        visc_cuda_free(s->ctx, s->dev_labels[p]);
        visc_cuda_free(s->ctx, s->dev_targets[p]);
        visc_cuda_event_destroy(s->ctx, s->copied[p]);
        visc_cuda_event_destroy(s->ctx, s->read[p]);
    }
    visc_cuda_free(s->ctx, s->dev_probs);
    visc_cuda_free(s->ctx, s->dev_dlogits);
    visc_cuda_free(s->ctx, s->dev_loss);
    visc_cuda_free(s->ctx, s->dev_counts);
    if (s->host_pinned) visc_cuda_host_unregister(s->ctx, s->host);
    free(s->host);
    free(s);
}

float *visc_gpu_stage_targets(visc_gpu_stage *s) { return s->host_targets[s->pair]; }

static void ok(int rc) {
    if (rc) visc_die("cuda: %s", visc_last_error());
}

void *visc_gpu_stage_put(visc_gpu_stage *s, const void *x, const int32_t *labels, int count) {
    const int p = s->pair;
    const size_t B = (size_t)s->batch;
    VISC_ASSERT(count > 0 && count <= s->batch);
    memcpy(s->host_labels[p], labels, (size_t)count * sizeof(int32_t));
    memset(s->host_labels[p] + count, 0, (B - (size_t)count) * sizeof(int32_t));
    /* into this pair's buffers once the kernels that read them last (two
     * steps ago) are behind; the kernels queued from now on wait for it */
    ok(visc_cuda_upload_async(s->ctx, s->dev_x[p], x, B * s->sample_bytes, s->read[p],
                              s->copied[p]));
    ok(visc_cuda_upload_async(s->ctx, s->dev_labels[p], s->host_labels[p], B * sizeof(int32_t),
                              NULL, s->copied[p]));
    if (s->soft)
        ok(visc_cuda_upload_async(s->ctx, s->dev_targets[p], s->host_targets[p],
                                  B * (size_t)s->classes * sizeof(float), NULL, s->copied[p]));
    return s->dev_x[p];
}

const int32_t *visc_gpu_stage_labels(const visc_gpu_stage *s) { return s->dev_labels[s->pair]; }

const float *visc_gpu_stage_loss(visc_gpu_stage *s, int step, const float *logits, int rows,
                                 int count, float smoothing) {
    VISC_ASSERT(step >= 0 && step < VISC_GPU_STAGE_STEPS && rows > 0 && rows <= s->batch);
    const int p = s->pair, K = s->classes;
    float *loss = s->dev_loss + step;
    if (s->soft) {
        ok(visc_cuda_softmax_xent_soft_forward(s->ctx, loss, s->dev_probs, logits,
                                               s->dev_targets[p], rows, K));
        ok(visc_cuda_softmax_xent_soft_backward(s->ctx, s->dev_dlogits, s->dev_probs,
                                                s->dev_targets[p], rows, K));
    } else {
        ok(visc_cuda_softmax_xent_forward(s->ctx, loss, s->dev_probs, logits, s->dev_labels[p],
                                          rows, K, smoothing));
        ok(visc_cuda_softmax_xent_backward(s->ctx, s->dev_dlogits, s->dev_probs, s->dev_labels[p],
                                           rows, K, smoothing));
    }
    /* rows past the loss's (a short batch's padding) get no gradient */
    if (rows < s->batch)
        ok(visc_cuda_zero(s->ctx, s->dev_dlogits + (size_t)rows * K,
                          (size_t)(s->batch - rows) * K * sizeof(float)));
    ok(visc_cuda_topk_correct(s->ctx, s->dev_counts + 2 * step, logits, s->dev_labels[p], count,
                              K));
    return s->dev_dlogits;
}

int visc_gpu_stage_end(visc_gpu_stage *s) {
    const int p = s->pair;
    if (visc_cuda_event_record(s->ctx, s->read[p]) || visc_cuda_event_wait(s->ctx, s->copied[p]))
        return -1;
    s->pair = 1 - p;
    return 0;
}

int visc_gpu_stage_results(visc_gpu_stage *s, int steps, float *loss, int32_t *top1,
                           int32_t *top5) {
    int32_t counts[2 * VISC_GPU_STAGE_STEPS];
    VISC_ASSERT(steps >= 0 && steps <= VISC_GPU_STAGE_STEPS);
    if (steps == 0) return 0;
    if (visc_cuda_download(s->ctx, loss, s->dev_loss, (size_t)steps * sizeof(float)) ||
        visc_cuda_download(s->ctx, counts, s->dev_counts, 2 * (size_t)steps * sizeof(int32_t)))
        return -1;
    for (int i = 0; i < steps; i++) {
        top1[i] = counts[2 * i];
        if (top5) top5[i] = counts[2 * i + 1];
    }
    return 0;
}
#else
/* No GPU is ever opened without the backend. */
struct visc_gpu_stage {
    int unused;
};
visc_gpu_stage *visc_gpu_stage_create(visc_cuda *ctx, int batch, int classes, size_t sample_bytes,
                                      int soft_targets) {
    (void)ctx, (void)batch, (void)classes, (void)sample_bytes, (void)soft_targets;
    visc_set_error("this visc was built without the CUDA backend");
    return NULL;
}
void visc_gpu_stage_free(visc_gpu_stage *s) { (void)s; }
float *visc_gpu_stage_targets(visc_gpu_stage *s) { return (void)s, NULL; }
void *visc_gpu_stage_put(visc_gpu_stage *s, const void *x, const int32_t *labels, int count) {
    (void)s, (void)x, (void)labels, (void)count;
    visc_die("a GPU stage in a visc without the CUDA backend");
}
const int32_t *visc_gpu_stage_labels(const visc_gpu_stage *s) { return (void)s, NULL; }
const float *visc_gpu_stage_loss(visc_gpu_stage *s, int step, const float *logits, int rows,
                                 int count, float smoothing) {
    (void)s, (void)step, (void)logits, (void)rows, (void)count, (void)smoothing;
    visc_die("a GPU stage in a visc without the CUDA backend");
}
int visc_gpu_stage_end(visc_gpu_stage *s) { return (void)s, -1; }
int visc_gpu_stage_results(visc_gpu_stage *s, int steps, float *loss, int32_t *top1,
                           int32_t *top5) {
    (void)s, (void)steps, (void)loss, (void)top1, (void)top5;
    return -1;
}
#endif

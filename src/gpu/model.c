/* model.c: a model's parameters, gradients and buffers on the GPU: device
 * copies laid out as the host tables, so one offset names a tensor on both
 * sides and checkpoints, name tables and the optimizer's work split stay
 * the host's. */
#include <stdio.h>
#include <string.h>

#include "visc/gpu.h"
#ifdef VISC_WITH_CUDA
#include "visc/cuda.h"
#endif

#ifdef VISC_WITH_CUDA
/* A failed device allocation named for what it was for, in the host's
 * words (memory.c): "not enough device memory for <what>: N MiB needed,
 * M MiB free of T MiB (<hint>)". */
static int device_memory_error(const char *what, const char *hint) {
    static const char prefix[] = "out of device memory: ";
    char why[256];
    snprintf(why, sizeof why, "%s", visc_last_error());
    if (strncmp(why, prefix, sizeof prefix - 1))
        return visc_set_error("%s: %s", what, why); /* not a full device: as it is */
    return visc_set_error("not enough device memory for %s: %s%s%s%s", what,
                          why + sizeof prefix - 1, hint ? " (" : "", hint ? hint : "",
                          hint ? ")" : "");
}

int visc_model_to_gpu(visc_model *m, visc_cuda *ctx) {
    if (!m->to_cuda)
        return visc_set_error("--device cuda: %s has no GPU implementation", m->cfg.arch);
    if (m->grad_ready)
        return visc_set_error("--device cuda: gradients handed to an all-reduce during backward "
                              "are not on the GPU yet");
    const size_t pb = m->params.total * sizeof(float), bb = m->buffers.total * sizeof(float);
    m->cuda = ctx;
    m->dev_params = visc_cuda_alloc(ctx, pb);
    m->dev_grads = m->dev_params ? visc_cuda_alloc(ctx, pb) : NULL;
    m->dev_buffers = m->dev_grads ? visc_cuda_alloc(ctx, bb) : NULL;
    if (!m->dev_buffers) {
        device_memory_error("the weights, their gradients and buffers", NULL);
        visc_model_gpu_release(m);
        return -1;
    }
    if (visc_model_upload(m) || visc_cuda_zero(ctx, m->dev_grads, pb) || m->to_cuda(m)) {
        visc_model_gpu_release(m);
        return -1;
    }
    return 0;
}

int visc_model_download(visc_model *m) {
    if (!m->cuda) return 0;
    return visc_cuda_download(m->cuda, m->params.data, m->dev_params,
                              m->params.total * sizeof(float)) ||
                   visc_cuda_download(m->cuda, m->buffers.data, m->dev_buffers,
                                      m->buffers.total * sizeof(float))
               ? -1
               : 0;
}

int visc_model_upload(visc_model *m) {
    if (!m->cuda) return 0;
    return visc_cuda_upload(m->cuda, m->dev_params, m->params.data,
                            m->params.total * sizeof(float)) ||
                   visc_cuda_upload(m->cuda, m->dev_buffers, m->buffers.data,
                                    m->buffers.total * sizeof(float))
               ? -1
               : 0;
}

void visc_model_gpu_release(visc_model *m) {
    if (!m->cuda) return;
    visc_cuda_free(m->cuda, m->dev_params);
    visc_cuda_free(m->cuda, m->dev_grads);
    visc_cuda_free(m->cuda, m->dev_buffers);
    m->dev_params = m->dev_grads = m->dev_buffers = NULL;
    m->cuda = NULL;
}

int visc_gpu_arena_move(visc_model *m, visc_arena *arena, void (*plan)(visc_model *, visc_arena *),
                        float **dlogits) {
    const size_t B = (size_t)m->cfg.batch, K = (size_t)m->cfg.num_classes;
    visc_arena counting;
    visc_arena_init(&counting, 0);
    plan(m, &counting);
    char *base = visc_cuda_alloc(m->cuda, counting.used);
    if (!base) return device_memory_error("the activation arena", VISC_ARENA_ADVICE);
    float *dl = base ? visc_cuda_alloc(m->cuda, B * K * sizeof(float)) : NULL;
    if (!dl) {
        if (base) visc_cuda_free(m->cuda, base);
        return -1;
    }
    visc_arena_free(arena);
    *arena = (visc_arena){.base = base, .size = counting.used, .device = VISC_DEVICE_CUDA};
    m->activation_bytes = counting.used; /* as planned there (a ResNet's may be bf16) */
    plan(m, arena);
    *dlogits = dl;
    m->logits = visc_alloc_aligned(B * K * sizeof(float), "logits");
    m->features = visc_alloc_aligned(B * (size_t)m->feature_dim * sizeof(float), "features");
    return 0;
}

void visc_gpu_arena_free(visc_model *m, visc_arena *arena, float *dlogits) {
    visc_cuda_free(m->cuda, arena->base);
    visc_cuda_free(m->cuda, dlogits);
    arena->base = NULL;
    visc_free_aligned(m->logits);
    visc_free_aligned(m->features);
}

void visc_model_zero_grad_gpu(visc_model *m, int index) {
    visc_gpu_zero(m->cuda, visc_model_grad(m, index), m->params.entries[index].numel);
}
#else
/* No model reaches a GPU in this build: visc_gpu_open fails first. */
int visc_model_to_gpu(visc_model *m, visc_cuda *ctx) {
    (void)m;
    (void)ctx;
    return visc_set_error("--device cuda: this visc was built without the CUDA backend");
}
int visc_model_download(visc_model *m) { return m->cuda ? -1 : 0; }
int visc_model_upload(visc_model *m) { return m->cuda ? -1 : 0; }
void visc_model_gpu_release(visc_model *m) { (void)m; }
void visc_model_zero_grad_gpu(visc_model *m, int index) {
    (void)index;
    visc_die("%s: a model on a GPU in a visc without the CUDA backend", m->cfg.arch);
}
int visc_gpu_arena_move(visc_model *m, visc_arena *arena, void (*plan)(visc_model *, visc_arena *),
                        float **dlogits) {
    (void)arena, (void)plan, (void)dlogits;
    return visc_set_error("%s: no GPU in a visc without the CUDA backend", m->cfg.arch);
}
void visc_gpu_arena_free(visc_model *m, visc_arena *arena, float *dlogits) {
    (void)m, (void)arena, (void)dlogits;
}
#endif

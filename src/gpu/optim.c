/* optim.c: the optimizer's step on the GPU. The CUDA backend's fused step
 * (src/cuda/optim.cu, the CPU's arithmetic) over device parameters and
 * gradients (a model's, a projection head's), with the state (momentum,
 * Adam's moments) kept on the device in the CPU's layout: one download
 * gives a checkpoint the CPU's optimizer state, bit for bit the same as a
 * CPU run would have (the steps agree to the bit: tests/gpu). */
#include "visc/cuda.h"
#include <stdlib.h>

#include "visc/gpu.h"

struct visc_gpu_optim {
    visc_cuda *ctx;
    visc_cuda_optim *step;
    float *state; /* device, cpu->slots x params->total floats */
    size_t bytes;
};

#ifdef VISC_WITH_CUDA
visc_gpu_optim *visc_gpu_optim_create(visc_cuda *ctx, const visc_optimizer *cpu) {
    visc_gpu_optim *o = visc_calloc(1, sizeof *o, "GPU optimizer");
    o->ctx = ctx;
    o->bytes = (size_t)cpu->slots * cpu->params->total * sizeof(float);
    o->step = visc_cuda_optim_create(ctx, cpu);
    if (o->step) o->state = visc_cuda_alloc(ctx, o->bytes);
    if (!o->state || visc_cuda_upload(ctx, o->state, cpu->state, o->bytes)) {
        visc_set_error("--device cuda: %s", visc_last_error());
        visc_gpu_optim_free(o);
        return NULL;
    }
    return o;
}

int visc_gpu_optim_step(visc_gpu_optim *o, visc_optimizer *cpu, float *params, const float *grads,
                        float lr) {
    if (visc_cuda_optim_step(o->step, params, grads, o->state, lr, cpu->step)) return -1;
    cpu->step++;
    return 0;
}

int visc_gpu_optim_download(visc_gpu_optim *o, visc_optimizer *cpu) {
    return visc_cuda_download(o->ctx, cpu->state, o->state, o->bytes);
}

void visc_gpu_optim_free(visc_gpu_optim *o) {
    if (!o) return;
    if (o->step) visc_cuda_optim_destroy(o->step);
    if (o->state) visc_cuda_free(o->ctx, o->state);
    free(o);
}
#else
visc_gpu_optim *visc_gpu_optim_create(visc_cuda *ctx, const visc_optimizer *cpu) {
    (void)ctx;
    (void)cpu;
    visc_set_error("--device cuda: this visc was built without the CUDA backend");
    return NULL;
}
int visc_gpu_optim_step(visc_gpu_optim *o, visc_optimizer *cpu, float *params, const float *grads,
                        float lr) {
    (void)o, (void)cpu, (void)params, (void)grads, (void)lr;
    return visc_set_error("no GPU optimizer in a visc without the CUDA backend");
}
int visc_gpu_optim_download(visc_gpu_optim *o, visc_optimizer *cpu) {
    (void)o, (void)cpu;
    return visc_set_error("no GPU optimizer in a visc without the CUDA backend");
}
void visc_gpu_optim_free(visc_gpu_optim *o) { (void)o; }
#endif

/* pinned.c: the loader's batch memory page-locked for the GPU's copies.
 * A batch is the largest thing that crosses the bus every step (154 MB of
 * floats for ResNet-50 at batch 256); from pageable memory the driver
 * copies it through its own pinned staging buffer, a fraction of the
 * bus's speed. Registering the loader's ring once lets forward's upload
 * go straight from where the workers wrote it. */
#include <stdio.h>

#include "visc/core.h"
#include "visc/cuda.h"
#include "visc/gpu.h"

#ifdef VISC_WITH_CUDA
static int pin_region(void *ctx, void *p, size_t bytes) {
    visc_gpu_pins *pins = ctx;
    if (pins->count == (int)(sizeof pins->regions / sizeof pins->regions[0]))
        return visc_set_error("more loader regions than expected");
    if (visc_cuda_host_register(pins->ctx, p, bytes)) return -1;
    pins->regions[pins->count++] = p;
    return 0;
}

void visc_gpu_pin_loader(visc_cuda *ctx, visc_loader *l, visc_gpu_pins *pins) {
    pins->ctx = ctx;
    pins->count = 0;
    if (visc_loader_each_buffer(l, pin_region, pins))
        fprintf(stderr,
                "visc: note: the batches stay in pageable memory (%s): uploads are slower\n",
                visc_last_error());
}

void visc_gpu_unpin(visc_gpu_pins *pins) {
    for (int i = 0; i < pins->count; i++)
        if (visc_cuda_host_unregister(pins->ctx, pins->regions[i]))
            fprintf(stderr, "visc: note: %s\n", visc_last_error());
    pins->count = 0;
}
#else
/* No GPU is ever opened without the backend. */
void visc_gpu_pin_loader(visc_cuda *ctx, visc_loader *l, visc_gpu_pins *pins) {
    (void)ctx;
    (void)l;
    pins->count = 0;
}
void visc_gpu_unpin(visc_gpu_pins *pins) { pins->count = 0; }
#endif

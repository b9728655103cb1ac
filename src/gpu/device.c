/* device.c: --device names and opening a GPU. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "visc/gpu.h"
#ifdef VISC_WITH_CUDA
#include "visc/cuda.h"
#endif

int visc_parse_device(const char *name, int *index) {
    if (!strcmp(name, "cpu")) {
        *index = -1;
        return 0;
    }
    if (!strcmp(name, "cuda")) {
        *index = 0;
        return 0;
    }
    if (!strncmp(name, "cuda:", 5) && name[5] >= '0' && name[5] <= '9') {
        char *end;
        long n = strtol(name + 5, &end, 10);
        if (*end == '\0' && n < 1024) {
            *index = (int)n;
            return 0;
        }
    }
    return visc_set_error("--device: expected cpu, cuda or cuda:N, got '%s'", name);
}

int visc_gpu_run_device(const visc_train_config *c, const visc_dist *d, int *index) {
    if (visc_parse_device(c->device, index)) return -1;
    const char *how = c->gpu_allreduce[0] ? c->gpu_allreduce : "auto";
    if (strcmp(how, "auto") && strcmp(how, "nccl") && strcmp(how, "host"))
        return visc_set_error("--gpu-allreduce: expected auto, nccl or host, got '%s'", how);
    if (*index < 0) return 0;
    const int world = visc_dist_world(d);
    if (c->hooks) return visc_set_error("--device cuda: a swarm is not on the GPU yet");
    if (world > 1 && !strcmp(c->device, "cuda")) {
        /* each rank its own GPU while there are enough */
        *index = visc_dist_local_rank(d);
#ifdef VISC_WITH_CUDA
        const int n = visc_cuda_device_count();
        if (n > 0) *index %= n;
#endif
    }
    return 0;
}

visc_cuda *visc_gpu_open(int index) {
#ifdef VISC_WITH_CUDA
    const int n = visc_cuda_device_count();
    if (n < 0) {
        visc_set_error("--device cuda:%d: no usable GPU (%s)", index, visc_last_error());
        return NULL;
    }
    if (index >= n) {
        visc_set_error("--device cuda:%d: this machine has %d CUDA device%s", index, n,
                       n == 1 ? "" : "s");
        return NULL;
    }
    visc_cuda *ctx = visc_cuda_open(index);
    if (!ctx) visc_set_error("--device cuda:%d: %s", index, visc_last_error());
    return ctx;
#else
    visc_set_error("--device cuda:%d: this visc was built without the CUDA backend (make CUDA=1 "
                   "where nvcc and cuBLASLt are installed)",
                   index);
    return NULL;
#endif
}

void visc_gpu_print_memory(visc_cuda *ctx, size_t base) {
    size_t used, peak;
    if (visc_gpu_memory_used(ctx, &used)) return;
    visc_gpu_memory_allocated(ctx, NULL, &peak);
    printf("GPU memory: %.0f MiB held by this run (weights, optimizer state, activations, "
           "workspaces; %.0f MiB of buffers at most, PyTorch's max_memory_allocated measure)\n",
           (double)(used > base ? used - base : 0) / (1 << 20), (double)peak / (1 << 20));
}

#ifdef VISC_WITH_CUDA
void visc_gpu_close(visc_cuda *ctx) {
    if (ctx) visc_cuda_close(ctx);
}
void *visc_gpu_alloc(visc_cuda *ctx, size_t bytes) { return visc_cuda_alloc(ctx, bytes); }
int visc_gpu_sync(visc_cuda *ctx) { return visc_cuda_sync(ctx); }
int visc_gpu_memory_used(visc_cuda *ctx, size_t *used) { return visc_cuda_memory_used(ctx, used); }
void visc_gpu_memory_allocated(visc_cuda *ctx, size_t *now, size_t *peak) {
    visc_cuda_memory_allocated(ctx, now, peak);
}
int visc_gpu_profile_start(visc_cuda *ctx) { return visc_cuda_profile_start(ctx); }
int visc_gpu_profile_report(visc_cuda *ctx, FILE *f, int steps) {
    return visc_cuda_profile_report(ctx, f, steps);
}
void visc_gpu_free(visc_cuda *ctx, void *p) {
    if (p) visc_cuda_free(ctx, p);
}
void visc_gpu_set_precision(visc_cuda *ctx, visc_precision p) {
    visc_cuda_set_bf16(ctx, p == VISC_PRECISION_BF16);
}
void visc_gpu_set_conv_benchmark(visc_cuda *ctx, int on) { visc_cuda_set_conv_benchmark(ctx, on); }
#else
/* Nothing is ever opened without the backend. */
void visc_gpu_close(visc_cuda *ctx) { (void)ctx; }
void *visc_gpu_alloc(visc_cuda *ctx, size_t bytes) {
    (void)ctx;
    (void)bytes;
    visc_set_error("no GPU memory in a visc without the CUDA backend");
    return NULL;
}
int visc_gpu_sync(visc_cuda *ctx) {
    (void)ctx;
    return visc_set_error("no GPU in a visc without the CUDA backend");
}
int visc_gpu_memory_used(visc_cuda *ctx, size_t *used) {
    (void)ctx;
    *used = 0;
    return visc_set_error("no GPU in a visc without the CUDA backend");
}
void visc_gpu_memory_allocated(visc_cuda *ctx, size_t *now, size_t *peak) {
    (void)ctx;
    if (now) *now = 0;
    if (peak) *peak = 0;
}
int visc_gpu_profile_start(visc_cuda *ctx) {
    (void)ctx;
    return visc_set_error("no GPU in a visc without the CUDA backend");
}
int visc_gpu_profile_report(visc_cuda *ctx, FILE *f, int steps) {
    (void)ctx, (void)f, (void)steps;
    return visc_set_error("no GPU in a visc without the CUDA backend");
}
void visc_gpu_free(visc_cuda *ctx, void *p) {
    (void)ctx;
    (void)p;
}
void visc_gpu_set_precision(visc_cuda *ctx, visc_precision p) {
    (void)ctx;
    (void)p;
}
void visc_gpu_set_conv_benchmark(visc_cuda *ctx, int on) {
    (void)ctx;
    (void)on;
}
#endif

/* context.cu: devices, the context, device memory and copies, errors, and
 * the deterministic column sums the gradient kernels share.
 *
 * Nothing here runs before a caller asks: the CUDA runtime is linked
 * statically and loads the driver (libcuda.so.1) at its first call, and
 * cuBLASLt is opened by the first matrix product (cublaslt_dl.cu), so a
 * program linked with this library starts on a machine without a GPU
 * driver, and visc_cuda_device_count then reports why there is no device. */
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "gelu.cuh"
#include "swin_window.cuh"

int visc_cuda_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    /* CUDA keeps a failed call's error as the thread's last one; cleared,
     * so that a failure the caller goes on from (page-locking refused) is
     * not reported again by the next kernel launch's check */
    (void)cudaGetLastError();
    return visc_set_error("%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

int visc_cublas_check(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    if (!visc_lt.status_string) return visc_set_error("%s: cuBLAS status %d", what, (int)s);
    return visc_set_error("%s: %s", what, visc_lt.status_string(s));
}

int visc_cuda_device_count(void) {
    int n = 0;
    if (visc_cuda_check(cudaGetDeviceCount(&n), "no usable CUDA device")) return -1;
    if (n == 0) return visc_set_error("no usable CUDA device: the driver reports none");
    return n;
}

int visc_cuda_describe(int dev, char *buf, size_t len) {
    cudaDeviceProp p;
    if (visc_cuda_check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties")) return -1;
    snprintf(buf, len, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
             p.multiProcessorCount, (double)p.totalGlobalMem / (double)(1u << 30));
    return 0;
}

/* A switch of two words in the environment: 0 for `usual` (or unset), 1
 * for `other`, -1 with the error for anything else. */
static int env_switch(const char *name, const char *usual, const char *other) {
    const char *v = getenv(name);
    if (!v || strcmp(v, usual) == 0) return 0;
    if (strcmp(v, other) == 0) return 1;
    return visc_set_error("%s='%s': expected %s or %s", name, v, usual, other);
}

visc_cuda *visc_cuda_open(int dev) {
    int n = visc_cuda_device_count();
    if (n < 0) return NULL;
    if (dev < 0 || dev >= n) {
        visc_set_error("no CUDA device %d (there are %d)", dev, n);
        return NULL;
    }
    cudaDeviceProp p;
    if (visc_cuda_check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties")) return NULL;
    /* The library holds sm_90 code only (the Makefile's CUDA_ARCH). */
    if (p.major * 10 + p.minor != VISC_CUDA_SM) {
        visc_set_error("CUDA device %d is sm_%d%d; this build has code for sm_%d only "
                       "(rebuild with CUDA_ARCH=%d%d)",
                       dev, p.major, p.minor, VISC_CUDA_SM, p.major, p.minor);
        return NULL;
    }
    visc_cuda *ctx = (visc_cuda *)calloc(1, sizeof *ctx);
    if (!ctx) {
        visc_set_error("out of memory allocating the CUDA context");
        return NULL;
    }
    ctx->device = dev;
    /* Ways round a path should it fail on a device (the kernel test checks
     * both sides): VISC_CUDA_ATTENTION=products, bf16 attention as
     * cuBLASLt's products even where the fused kernels apply;
     * VISC_CUDA_VECTOR=off, the memory-bound kernels one value a thread,
     * not 16 bytes. */
    ctx->attn_unfused = env_switch("VISC_CUDA_ATTENTION", "fused", "products");
    ctx->scalar_access = env_switch("VISC_CUDA_VECTOR", "on", "off");
    if (ctx->attn_unfused < 0 || ctx->scalar_access < 0) {
        free(ctx);
        return NULL;
    }
    if (visc_cuda_check(cudaSetDevice(dev), "cudaSetDevice") ||
        visc_cuda_check(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking),
                        "cudaStreamCreate")) {
        visc_cuda_close(ctx);
        return NULL;
    }
    return ctx;
}

void visc_cuda_close(visc_cuda *ctx) {
    if (!ctx) return;
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    if (ctx->copy_stream) {
        cudaStreamSynchronize(ctx->copy_stream);
        cudaStreamDestroy(ctx->copy_stream);
    }
    visc_comm_state_free(ctx);
    visc_cuda_profile_free(ctx);
    visc_conv_state_free(ctx);
    visc_attn_state_free(ctx);
    visc_cuda_free(ctx, ctx->scratch);
    visc_cuda_free(ctx, ctx->bn_acc);
    visc_cuda_free(ctx, ctx->workspace);
    visc_cuda_free(ctx, ctx->lt_sums);
    visc_lt_plans_free(ctx);
    if (ctx->lt) visc_lt.destroy(ctx->lt);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    free(ctx->blocks);
    free(ctx);
}

cublasLtHandle_t visc_cuda_lt(visc_cuda *ctx) {
    if (ctx->lt) return ctx->lt;
    if (visc_lt_load()) return NULL;
    if (!ctx->workspace && !(ctx->workspace = visc_cuda_alloc(ctx, VISC_CUDA_WORKSPACE)))
        return NULL;
    cublasLtHandle_t h = NULL;
    if (visc_cublas_check(visc_lt.create(&h), "cublasLtCreate")) return NULL;
    ctx->lt = h;
    return h;
}

void visc_cuda_set_vector_access(visc_cuda *ctx, int on) { ctx->scalar_access = !on; }
void visc_cuda_set_conv_benchmark(visc_cuda *ctx, int on) { ctx->conv_benchmark = on; }
void visc_cuda_set_bias_epilogue(visc_cuda *ctx, int on) { ctx->lt_no_bias_epilogue = !on; }

int visc_cuda_sync(visc_cuda *ctx) {
    return visc_cuda_check(cudaStreamSynchronize(ctx->stream), "CUDA work");
}

/* The allocation table: visc_cuda_alloc's blocks, so that their sum is
 * known (visc_cuda_memory_allocated). A run allocates a few hundred blocks,
 * almost all before its first step, and frees few: a list will do. */
struct visc_cuda_block {
    void *p;
    size_t bytes;
};

static int block_keep(visc_cuda *ctx, void *p, size_t bytes) {
    if (ctx->num_blocks == ctx->cap_blocks) {
        const int cap = ctx->cap_blocks ? 2 * ctx->cap_blocks : 256;
        visc_cuda_block *grown =
            (visc_cuda_block *)realloc(ctx->blocks, (size_t)cap * sizeof *grown);
        if (!grown) return visc_set_error("out of memory for the device allocation table");
        ctx->blocks = grown, ctx->cap_blocks = cap;
    }
    ctx->blocks[ctx->num_blocks].p = p;
    ctx->blocks[ctx->num_blocks++].bytes = bytes;
    ctx->mem_now += bytes;
    if (ctx->mem_now > ctx->mem_peak) ctx->mem_peak = ctx->mem_now;
    return 0;
}

static void block_drop(visc_cuda *ctx, void *p) {
    for (int i = ctx->num_blocks - 1; i >= 0; i--)
        if (ctx->blocks[i].p == p) {
            ctx->mem_now -= ctx->blocks[i].bytes;
            ctx->blocks[i] = ctx->blocks[--ctx->num_blocks];
            return;
        }
}

void visc_cuda_memory_allocated(visc_cuda *ctx, size_t *now, size_t *peak) {
    if (now) *now = ctx->mem_now;
    if (peak) *peak = ctx->mem_peak;
}

void *visc_cuda_alloc(visc_cuda *ctx, size_t bytes) {
    void *p = NULL;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        /* Out of memory is not sticky: clear it, or the next launch would
         * report it. Any other error (a kernel that faulted earlier) is
         * named as it is, not mistaken for a full device. */
        cudaGetLastError();
        size_t free_b = 0, total = 0;
        if (e == cudaErrorMemoryAllocation && cudaMemGetInfo(&free_b, &total) == cudaSuccess)
            visc_set_error("out of device memory: %.0f MiB needed, %.0f MiB free of %.0f MiB",
                           (double)bytes / (1 << 20), (double)free_b / (1 << 20),
                           (double)total / (1 << 20));
        else if (e == cudaErrorMemoryAllocation)
            visc_set_error("out of device memory: %.0f MiB needed", (double)bytes / (1 << 20));
        else visc_cuda_check(e, "allocating device memory");
        return NULL;
    }
    if (block_keep(ctx, p, bytes)) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

int visc_cuda_memory_used(visc_cuda *ctx, size_t *used) {
    (void)ctx;
    size_t free_b = 0, total = 0;
    if (visc_cuda_check(cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo")) return -1;
    *used = total - free_b;
    return 0;
}

void visc_cuda_free(visc_cuda *ctx, void *p) {
    if (!p) return;
    block_drop(ctx, p);
    cudaFree(p);
}

int visc_cuda_upload(visc_cuda *ctx, void *dst, const void *src, size_t bytes) {
    if (visc_cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream),
                        "copy to the device"))
        return -1;
    return visc_cuda_sync(ctx);
}

visc_cuda_event *visc_cuda_event_create(visc_cuda *ctx) {
    (void)ctx;
    visc_cuda_event *ev = (visc_cuda_event *)calloc(1, sizeof *ev);
    if (!ev) {
        visc_set_error("out of memory allocating a CUDA event");
        return NULL;
    }
    /* no timing: recording and waiting cost less */
    if (visc_cuda_check(cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming),
                        "cudaEventCreate")) {
        free(ev);
        return NULL;
    }
    return ev;
}

void visc_cuda_event_destroy(visc_cuda *ctx, visc_cuda_event *e) {
    (void)ctx;
    if (!e) return;
    cudaEventDestroy(e->e);
    free(e);
}

int visc_cuda_event_record(visc_cuda *ctx, visc_cuda_event *e) {
    return visc_cuda_check(cudaEventRecord(e->e, ctx->stream), "recording an event");
}

int visc_cuda_event_wait(visc_cuda *ctx, visc_cuda_event *e) {
    (void)ctx;
    return visc_cuda_check(cudaEventSynchronize(e->e), "CUDA work");
}

int visc_cuda_upload_async(visc_cuda *ctx, void *dst, const void *src, size_t bytes,
                           visc_cuda_event *after, visc_cuda_event *done) {
    if (!ctx->copy_stream &&
        visc_cuda_check(cudaStreamCreateWithFlags(&ctx->copy_stream, cudaStreamNonBlocking),
                        "creating the copy stream"))
        return -1;
    if (after && visc_cuda_check(cudaStreamWaitEvent(ctx->copy_stream, after->e, 0),
                                 "ordering a copy after the kernels"))
        return -1;
    if (visc_cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->copy_stream),
                        "copy to the device") ||
        visc_cuda_check(cudaEventRecord(done->e, ctx->copy_stream), "recording a copy") ||
        visc_cuda_check(cudaStreamWaitEvent(ctx->stream, done->e, 0),
                        "ordering the kernels after a copy"))
        return -1;
    return 0;
}

int visc_cuda_host_register(visc_cuda *ctx, void *p, size_t bytes) {
    (void)ctx;
    return visc_cuda_check(cudaHostRegister(p, bytes, cudaHostRegisterDefault),
                           "page-locking host memory");
}

int visc_cuda_host_unregister(visc_cuda *ctx, void *p) {
    (void)ctx;
    return visc_cuda_check(cudaHostUnregister(p), "unlocking host memory");
}

int visc_cuda_download(visc_cuda *ctx, void *dst, const void *src, size_t bytes) {
    if (visc_cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream),
                        "copy from the device"))
        return -1;
    return visc_cuda_sync(ctx);
}

void *visc_cuda_grow(visc_cuda *ctx, void **buf, size_t *have, size_t bytes) {
    if (*have >= bytes) return *buf;
    if (visc_cuda_sync(ctx)) return NULL; /* queued kernels may still read the old one */
    visc_cuda_free(ctx, *buf);
    *buf = visc_cuda_alloc(ctx, bytes);
    *have = *buf ? bytes : 0;
    return *buf;
}

void *visc_cuda_scratch(visc_cuda *ctx, size_t bytes) {
    return visc_cuda_grow(ctx, &ctx->scratch, &ctx->scratch_bytes, bytes);
}

int visc_cuda_bf16_scratch(visc_cuda *ctx, uint16_t **copies, const size_t *counts, int n) {
    size_t offset[VISC_CUDA_BF16_COPIES], total = 0;
    if (n > VISC_CUDA_BF16_COPIES) return visc_set_error("bf16 scratch: %d copies", n);
    for (int i = 0; i < n; i++) {
        offset[i] = total;
        total += (counts[i] + 7) / 8 * 8;
    }
    uint16_t *base = (uint16_t *)visc_cuda_scratch(ctx, total * sizeof(uint16_t));
    if (!base) return -1;
    for (int i = 0; i < n; i++) copies[i] = base + offset[i];
    return 0;
}

void visc_cuda_set_bf16(visc_cuda *ctx, int on) { ctx->bf16 = on != 0; }
int visc_cuda_bf16(const visc_cuda *ctx) { return ctx->bf16; }
int visc_cuda_operand_bytes(const visc_cuda *ctx) { return ctx->bf16 ? 2 : 4; }

/* Block c: column c's partials, every 256th to each thread, then a fixed tree. */
__global__ void add_partials_kernel(float *out, const float *part, int chunks, int stride,
                                    int accumulate) {
    __shared__ float sum[256];
    const int c = blockIdx.x;
    float v = 0.0f;
    for (int k = threadIdx.x; k < chunks; k += 256) v += part[(size_t)k * stride + c];
    sum[threadIdx.x] = v;
    __syncthreads();
    for (int half = 128; half > 0; half >>= 1) {
        if (threadIdx.x < half) sum[threadIdx.x] += sum[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[c] = accumulate ? out[c] + sum[0] : sum[0];
}

static int add_partials(visc_cuda *ctx, float *out, const float *part, int chunks, int stride,
                        int C, int accumulate) {
    if (C <= 0) return 0;
    add_partials_kernel<<<C, 256, 0, ctx->stream>>>(out, part, chunks, stride, accumulate);
    return visc_cuda_launched("column sums");
}

int visc_cuda_add_partials(visc_cuda *ctx, float *out, const float *part, int chunks, int stride,
                           int C) {
    return add_partials(ctx, out, part, chunks, stride, C, 0);
}

/* Block (x, k): columns x * blockDim.x + thread of rows chunk k; each
 * value also rounded to bf16 into `rounded` when it is not NULL. The
 * values are a's, or a times GELU'(gelu_in) when gelu_in (bf16: an MLP's
 * hidden layer in the operand form) is not NULL (the product
 * gelu_backward_bf16_kernel makes, operation for operation). With
 * `windowed`, row r takes a's row visc_swin_token_row(g, r): a in token
 * order summed and rounded in windowed order, the partition gathered by
 * the pass. */
__global__ void column_partials_kernel(float *part, __nv_bfloat16 *rounded, const float *a,
                                       const __nv_bfloat16 *gelu_in, int64_t rows, int C,
                                       int chunks, visc_cuda_swin_grid g, int windowed) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int64_t r0, r1;
    visc_chunk_rows(rows, blockIdx.y, chunks, &r0, &r1);
    float s = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const float x = a[(windowed ? visc_swin_token_row(g, r) : r) * C + c];
        /* __fmul_rn: never contracted into the sum's add, so v and the sum
         * are those of the product stored first (the two-call form) */
        const float v =
            gelu_in ? __fmul_rn(x, visc_gelu_grad(__bfloat162float(gelu_in[r * C + c]))) : x;
        s += v;
        if (rounded) rounded[r * C + c] = __float2bfloat16_rn(v);
    }
    part[(size_t)blockIdx.y * C + c] = s;
}

static int column_partials(visc_cuda *ctx, float *part, __nv_bfloat16 *rounded, const float *a,
                           const __nv_bfloat16 *gelu_in, const visc_cuda_swin_grid *windows,
                           int64_t rows, int C, int chunks) {
    const unsigned threads = visc_cuda_col_threads(C);
    const visc_cuda_swin_grid g = windows ? *windows : visc_cuda_swin_grid{};
    column_partials_kernel<<<dim3((C + threads - 1) / threads, chunks), threads, 0,
                             ctx->stream>>>(part, rounded, a, gelu_in, rows, C, chunks, g,
                                            windows != NULL);
    return visc_cuda_launched("column sums");
}

int visc_cuda_column_sums_into(visc_cuda *ctx, float *out, const float *a, int64_t rows, int C,
                               int accumulate) {
    const int chunks = visc_cuda_col_chunks(rows);
    float *part = (float *)visc_cuda_scratch(ctx, (size_t)chunks * C * sizeof(float));
    if (!part) return -1;
    if (rows == 0)
        return accumulate ? 0
                          : visc_cuda_check(cudaMemsetAsync(out, 0, sizeof(float) * C, ctx->stream),
                                            "column sums");
    if (column_partials(ctx, part, NULL, a, NULL, NULL, rows, C, chunks)) return -1;
    return add_partials(ctx, out, part, chunks, C, C, accumulate);
}

int visc_cuda_column_sums_rounded(visc_cuda *ctx, float *out, uint16_t *rounded, float *part,
                                  const float *a, const uint16_t *gelu_in,
                                  const visc_cuda_swin_grid *windows, int64_t rows, int C) {
    if (rows == 0)
        return out ? visc_cuda_check(cudaMemsetAsync(out, 0, sizeof(float) * C, ctx->stream),
                                     "column sums")
                   : 0;
    const int chunks = visc_cuda_col_chunks(rows);
    if (column_partials(ctx, part, (__nv_bfloat16 *)rounded, a, (const __nv_bfloat16 *)gelu_in,
                        windows, rows, C, chunks))
        return -1;
    return out ? add_partials(ctx, out, part, chunks, C, C, 0) : 0;
}

int visc_cuda_column_sums(visc_cuda *ctx, float *out, const float *a, int64_t rows, int C) {
    return visc_cuda_column_sums_into(ctx, out, a, rows, C, 0);
}

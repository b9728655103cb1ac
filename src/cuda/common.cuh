/* common.cuh: what the CUDA files share and nothing outside src/cuda sees.
 *
 * The context (stream, cuBLASLt handle and workspace, a scratch buffer for
 * partial sums), the error helpers that turn CUDA and cuBLAS statuses into
 * visc_set_error messages, launch sizes, and the deterministic column sum
 * that layer norm's and the bias epilogue's parameter gradients share. */
#ifndef VISC_CUDA_COMMON_CUH
#define VISC_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* core.h declares its no-return functions with C11's _Noreturn, which the
 * CUDA front end does not know; C++11 spells it [[noreturn]]. */
#define _Noreturn [[noreturn]]
#include "visc/cuda.h"
#undef _Noreturn

struct visc_cuda {
    int device;
    cudaStream_t stream;
    cudaStream_t copy_stream; /* uploads beside the kernels: created by the first */
    cudaStream_t comm_stream; /* gradients through host memory (comm.cu), or NULL */
    cublasLtHandle_t lt; /* NULL until the first matrix product (visc_cuda_lt) */
    struct visc_lt_plans *lt_plans; /* the products' descriptors per shape (matmul.cu), or NULL */
    void *workspace;     /* cuBLASLt's, VISC_CUDA_WORKSPACE bytes */
    void *scratch;       /* partial sums, grown by visc_cuda_scratch */
    size_t scratch_bytes;
    int bf16; /* the linear layers' precision: visc_cuda_set_bf16 */
    struct visc_conv_state *conv; /* cuDNN handle, plans, workspace (conv.cu), or NULL */
    struct visc_attn_state *attn; /* attention's workspace (attention.cu), or NULL */
    size_t attn_chunk_bytes; /* attention's cap on N x N workspaces; 0: the defaults */
    int attn_unfused; /* 1: bf16 attention as products, not fused (attention_flash.cu) */
    int scalar_access; /* 1: one value a thread in the memory-bound kernels (batchnorm.cu, eltwise.cu) */
    int conv_benchmark;      /* 1: convolution algorithms by cuDNN's timed search (conv.cu) */
    int lt_no_bias_epilogue; /* 1: products add their bias by a kernel (matmul.cu; a test's) */
    void *lt_sums;           /* fp32 sums of a bf16 product whose bias a kernel adds */
    size_t lt_sums_bytes;
    struct visc_nccl_state *nccl; /* NCCL's communicator and stream (comm.cu), or NULL */
    void *bn_acc; /* SyncBN's sums between the passes (batchnorm.cu), or NULL */
    size_t bn_acc_bytes;
    struct visc_cuda_profile *profile; /* the profiler's events and table (profile.cu), or NULL */
    /* what visc_cuda_alloc handed out and not yet freed (context.cu): the
     * pointers and sizes, their sum and its high-water mark */
    struct visc_cuda_block *blocks;
    int num_blocks, cap_blocks;
    size_t mem_now, mem_peak;
};
typedef struct visc_cuda_profile visc_cuda_profile;
typedef struct visc_cuda_block visc_cuda_block;
/* Frees ctx->conv (conv.cu), ctx->attn (attention.cu), ctx->comm_stream and ctx->nccl (comm.cu),
 * ctx->lt_plans (matmul.cu), ctx->profile (profile.cu). */
void visc_cuda_profile_free(visc_cuda *ctx);
void visc_conv_state_free(visc_cuda *ctx);
void visc_attn_state_free(visc_cuda *ctx);
void visc_comm_state_free(visc_cuda *ctx);
void visc_lt_plans_free(visc_cuda *ctx);

struct visc_cuda_event {
    cudaEvent_t e;
};

/* cuBLASLt's entry points, loaded by visc_lt_load (cublaslt_dl.cu): the
 * library is opened by the first matrix product, not when a program
 * starts, and the other kernels never need it. */
typedef struct {
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtDestroy) destroy;
    decltype(&cublasLtGetStatusString) status_string;
    decltype(&cublasLtMatmul) matmul;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatrixLayoutSetAttribute) layout_set;
    decltype(&cublasLtMatmulPreferenceCreate) pref_create;
    decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
} visc_lt_api;
extern visc_lt_api visc_lt;
/* 0 once the table is filled (thread-safe, loads once); -1 with the reason. */
int visc_lt_load(void);
/* The context's cuBLASLt handle and workspace, made on first use; NULL with the error set. */
cublasLtHandle_t visc_cuda_lt(visc_cuda *ctx);

#define VISC_CUDA_WORKSPACE ((size_t)32 << 20)

/* 0 if ok, else -1 with "<what>: <CUDA's message>" as the error. */
int visc_cuda_check(cudaError_t e, const char *what);
int visc_cublas_check(cublasStatus_t s, const char *what);
/* The profiled context, or NULL (profile.cu): then every call below marks
 * the end of a piece of GPU work, named. */
extern visc_cuda *visc_cuda_profiled;
void visc_cuda_profile_mark(const char *what);
static inline void visc_cuda_profile_point(const char *what) {
    if (visc_cuda_profiled) visc_cuda_profile_mark(what);
}
/* After a launch: the launch's own error, if any. */
static inline int visc_cuda_launched(const char *kernel) {
    const int rc = visc_cuda_check(cudaGetLastError(), kernel);
    visc_cuda_profile_point(kernel);
    return rc;
}
/* Two bf16 in a 32-bit word (the lower one first in memory) as floats,
 * and two floats rounded to nearest even into one: the halves of a
 * 16-byte access of 8 bf16 (uint4), which the memory-bound kernels use
 * where one value a thread moves too few bytes per instruction. */
__device__ __forceinline__ void bf16_unpack2(uint32_t w, float *x) {
    x[0] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(w & 0xffffu)));
    x[1] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(w >> 16)));
}
__device__ __forceinline__ uint32_t bf16_pack2(const float *x) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(x[0])) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(x[1])) << 16;
}
static inline int visc_cuda_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* At least `bytes` of device scratch (kept for the next call); NULL with the error set. */
void *visc_cuda_scratch(visc_cuda *ctx, size_t bytes);
/* A device buffer *buf of *have bytes grown to at least `bytes` (a larger
 * shape's first use), waiting first for the queued kernels that may still
 * read the old one: the scratch and the kernels' own workspaces. */
void *visc_cuda_grow(visc_cuda *ctx, void **buf, size_t *have, size_t bytes);
/* Room in the scratch for n <= VISC_CUDA_BF16_COPIES bf16 copies of
 * counts[i] elements, each starting 16-byte aligned (cuBLASLt's and cuDNN's
 * fastest kernels want that): copies[i] gets the i-th. It is the scratch,
 * so a later call (a column sum too) may reuse it: get it after those. */
#define VISC_CUDA_BF16_COPIES 4
int visc_cuda_bf16_scratch(visc_cuda *ctx, uint16_t **copies, const size_t *counts, int n);

/* *loss = the mean of row_loss[0..N) (device floats), summed in double in
 * a fixed order (softmax_xent.cu): the mean never depends on timing. */
int visc_cuda_mean_losses(visc_cuda *ctx, float *loss, const float *row_loss, int N);

/* Blocks for n independent elements at `threads` per block, capped: the
 * kernels loop over the rest (grid-stride), so any n fits. */
static inline unsigned visc_cuda_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    const size_t cap = 132 * 32; /* an H200's 132 SMs, 32 blocks each in flight at most */
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* Column sums in a fixed order, so the result never depends on timing:
 * the rows are cut into ranges of about VISC_CUDA_COL_ROWS (at most
 * VISC_CUDA_COL_CHUNKS ranges), each range is summed into a partial row
 * (scratch) by one thread per column, and a block per column adds the
 * partials in a fixed tree. Used for dgamma/dbeta and dbias. Narrow rows
 * with many of them (Swin-T's first stage: 802,816 rows of 96) still fill
 * the GPU: the ranges, not the columns, make the parallelism. */
#define VISC_CUDA_COL_ROWS 256
#define VISC_CUDA_COL_CHUNKS 1024
static inline int visc_cuda_col_chunks(int64_t rows) {
    const int64_t k = (rows + VISC_CUDA_COL_ROWS - 1) / VISC_CUDA_COL_ROWS;
    return k < 1 ? 1 : k > VISC_CUDA_COL_CHUNKS ? VISC_CUDA_COL_CHUNKS : (int)k;
}
/* Threads per block of a partials kernel over C columns: whole warps, at
 * most 256, so narrow rows do not leave most of each block idle. */
static inline unsigned visc_cuda_col_threads(int C) {
    const unsigned t = ((unsigned)C + 31) / 32 * 32;
    return t > 256 ? 256 : t;
}
/* Rows [r0, r1) of chunk k of `chunks` over `rows`. */
__device__ __forceinline__ void visc_chunk_rows(int64_t rows, int k, int chunks, int64_t *r0,
                                                int64_t *r1) {
    *r0 = rows * k / chunks;
    *r1 = rows * (k + 1) / chunks;
}
/* out[c] = sum over k < chunks of part[k * stride + c], for c < C. */
int visc_cuda_add_partials(visc_cuda *ctx, float *out, const float *part, int chunks, int stride,
                           int C);
/* out[c] = sum over rows of a[r * C + c]. */
int visc_cuda_column_sums(visc_cuda *ctx, float *out, const float *a, int64_t rows, int C);
/* The same, added to out when accumulate is set (a sum in parts). */
int visc_cuda_column_sums_into(visc_cuda *ctx, float *out, const float *a, int64_t rows, int C,
                               int accumulate);
/* The column sums into out as visc_cuda_column_sums (the same order, the
 * same bits; out NULL: none), and a rounded to bf16 into `rounded` in the
 * same pass, so a is read once (a linear layer's dY: its bias gradient and
 * the products' operand). With gelu_in (bf16), the values are a x
 * GELU'(gelu_in) (as visc_cuda_gelu_backward_bf16 makes them, bit for
 * bit): the dY of a layer
 * whose output went through GELU, from the GELU output's gradient, with no
 * fp32 dY in between. part: visc_cuda_col_chunks(rows) * C floats of the
 * caller's, since `rounded` is in the scratch the plain form takes them
 * from. windows (NULL: none): a's rows are in token order, the sums and
 * `rounded` in the grid's windowed order (visc_cuda_swin_partition of a
 * gathered by the pass; gelu_in, if any, in windowed order). */
int visc_cuda_column_sums_rounded(visc_cuda *ctx, float *out, uint16_t *rounded, float *part,
                                  const float *a, const uint16_t *gelu_in,
                                  const visc_cuda_swin_grid *windows, int64_t rows, int C);
/* A linear layer whose output h then went through GELU, backward from the
 * GELU output's gradient dact, with its input and h in the operand form
 * (visc_cuda_linear_operand_*): as visc_cuda_gelu_backward into dact and
 * visc_cuda_linear_operand_backward, the same bits; under bf16 dY is made
 * in bf16 by the pass that sums db (no fp32 dY), and dact is left as it
 * is; in fp32 dact is overwritten with dY. */
int visc_cuda_linear_gelu_operand_backward(visc_cuda *ctx, float *din, float *dweight,
                                           float *dbias, float *dact, const float *h,
                                           const float *in, const float *weight, int N,
                                           int in_features, int out_features);

/* Value i of a tensor in the operand form: fp32, or bf16 with bf16; and
 * its store (each value rounded once). */
__device__ __forceinline__ float visc_operand_load(const void *p, int bf16, int64_t i) {
    return bf16 ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}
__device__ __forceinline__ void visc_operand_store(void *p, int bf16, int64_t i, float v) {
    if (bf16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else ((float *)p)[i] = v;
}

/* The float a warp holds in every lane, summed over the warp. */
__device__ __forceinline__ float visc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double visc_warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float visc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif

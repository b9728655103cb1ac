/* matmul.cu: matrix products through cuBLASLt with fp32 accumulation and
 * output: bf16 operands (tensor cores), or fp32 operands in full fp32
 * (CUBLAS_COMPUTE_32F, never TF32: the fp32 layers agree with the CPU's);
 * or bf16 operands with a bf16 output (and bias), the fp32 sums rounded
 * once, as PyTorch's autocast keeps a linear layer's output.
 *
 * cuBLASLt is column-major; a row-major [M, N] matrix is the column-major
 * [N, M] one, so D = op(A) op(B) is computed as D^T = op(B)^T op(A)^T:
 * cuBLASLt's A is our B and its B is our A, with the transposes carried
 * over, and the bias (cuBLASLt's per-row vector of D^T) lands on our
 * columns. The descriptors and the heuristic's choice (tens of
 * microseconds to make, more than many of a step's products take on the
 * GPU) are made once per shape and kept in the context (plan_cache). */
#include <stdio.h>
#include <string.h>

#include "common.cuh"

typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulAlgo_t algo; /* the heuristic's first choice */
    int bias_by_kernel;        /* no algorithm with the bias epilogue: see bias_by_kernel */
} lt_plan;

/* What a plan depends on: everything but the pointers themselves (and
 * beta, a scalar of the call), of which only the alignments matter; the
 * bias's too, since the heuristic reads the bias pointer for its
 * alignment (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER): a plan made
 * for one bias is not reused for a bias aligned less. */
typedef struct {
    cudaDataType_t ab, d;
    int M, N, K, trans_a, trans_b, has_bias, batch;
    int64_t lda, ldb, ldd, stride_a, stride_b, stride_d;
    uint32_t align_a, align_b, align_d, align_bias;
} plan_key;

static void plan_free(lt_plan *p) {
    if (p->pref) visc_lt.pref_destroy(p->pref);
    if (p->d) visc_lt.layout_destroy(p->d);
    if (p->b) visc_lt.layout_destroy(p->b);
    if (p->a) visc_lt.layout_destroy(p->a);
    if (p->op) visc_lt.desc_destroy(p->op);
}

/* The largest power of two up to 256 that divides the address. */
static uint32_t alignment_of(const void *ptr) {
    uint32_t a = 256;
    while (a > 1 && ((uintptr_t)ptr % a) != 0) a >>= 1;
    return a;
}

/* Keys are built whole by matmul (every field set, no padding left
 * undefined: the struct is zeroed first), so bytes compare as fields. */
/* The alignment every matrix of a batch has: the first's, and no more
 * than the step from one to the next keeps. */
static uint32_t batch_alignment(const void *ptr, int64_t stride, size_t element, int batch) {
    const uint32_t first = alignment_of(ptr);
    if (batch == 1) return first;
    const uint32_t step = alignment_of((const void *)(uintptr_t)(stride * (int64_t)element));
    return first < step ? first : step;
}

static int key_equal(const plan_key *x, const plan_key *y) {
    return memcmp(x, y, sizeof *x) == 0;
}

/* The context's plans. A model has a few dozen distinct products; past
 * PLANS_MAX (shapes that change every call) a plan is made and freed per
 * call, as before the cache. */
enum { PLANS_MAX = 512 };
struct visc_lt_plans {
    int n;
    plan_key key[PLANS_MAX];
    lt_plan plan[PLANS_MAX];
};

void visc_lt_plans_free(visc_cuda *ctx) {
    if (!ctx->lt_plans) return;
    for (int i = 0; i < ctx->lt_plans->n; i++) plan_free(&ctx->lt_plans->plan[i]);
    free(ctx->lt_plans);
    ctx->lt_plans = NULL;
}

static lt_plan *plan_lookup(visc_cuda *ctx, const plan_key *k) {
    struct visc_lt_plans *c = ctx->lt_plans;
    if (!c) return NULL;
    for (int i = 0; i < c->n; i++)
        if (key_equal(&c->key[i], k)) return &c->plan[i];
    return NULL;
}

/* Keeps a made plan: the cache's copy, which it owns from now on, or NULL
 * when the cache is full (the caller still owns p). */
static lt_plan *plan_keep(visc_cuda *ctx, const plan_key *k, const lt_plan *p) {
    if (!ctx->lt_plans) {
        ctx->lt_plans = (struct visc_lt_plans *)calloc(1, sizeof *ctx->lt_plans);
        if (!ctx->lt_plans) return NULL;
    }
    struct visc_lt_plans *c = ctx->lt_plans;
    if (c->n == PLANS_MAX) return NULL;
    c->key[c->n] = *k;
    c->plan[c->n] = *p;
    return &c->plan[c->n++];
}

/* One call's products: the public calls' arguments, whole. D and the bias
 * are fp32, or bf16 when d is CUDA_R_16BF. */
typedef struct {
    cudaDataType_t ab;
    const void *A, *B;
    void *D;
    const void *bias;
    int M, N, K, trans_a, trans_b, batch;
    int64_t lda, ldb, ldd, stride_a, stride_b, stride_d;
    float alpha, beta;
    cudaDataType_t d;
} product;

static size_t element_bytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

/* A column-major layout of rows x cols at leading dimension ld, repeated
 * `batch` times `stride` elements apart. */
static int layout_make(cublasLtMatrixLayout_t *l, cudaDataType_t type, int64_t rows, int64_t cols,
                       int64_t ld, int32_t batch, int64_t stride, const char *what) {
    if (visc_cublas_check(visc_lt.layout_create(l, type, (uint64_t)rows, (uint64_t)cols, ld),
                          what))
        return -1;
    if (batch == 1) return 0;
    return visc_cublas_check(visc_lt.layout_set(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                sizeof batch),
                             what) ||
                   visc_cublas_check(visc_lt.layout_set(*l,
                                                        CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                        &stride, sizeof stride),
                                     what)
               ? -1
               : 0;
}

static int plan_make(lt_plan *p, const product *x) {
    const cublasOperation_t ta = x->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A: our B */
    const cublasOperation_t tb = x->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's B: our A */
    const size_t ws = VISC_CUDA_WORKSPACE;
    if (visc_cublas_check(visc_lt.desc_create(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                          "matmul descriptor") ||
        visc_cublas_check(visc_lt.desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
                          "matmul transa") ||
        visc_cublas_check(visc_lt.desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
                          "matmul transb"))
        return -1;
    if (x->bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        const cudaDataType_t bias_type = x->d; /* cuBLASLt's default: D's type */
        if (visc_cublas_check(visc_lt.desc_set(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                               sizeof epi),
                              "matmul epilogue") ||
            visc_cublas_check(visc_lt.desc_set(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &x->bias,
                                               sizeof x->bias),
                              "matmul bias pointer") ||
            visc_cublas_check(visc_lt.desc_set(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                               &bias_type, sizeof bias_type),
                              "matmul bias type"))
            return -1;
    }
    /* Stored shapes (rows, cols, leading dimension), column-major: a
     * row-major [r, c] matrix with row stride ld is the column-major [c, r]
     * one with leading dimension ld. */
    const int M = x->M, N = x->N, K = x->K, batch = x->batch;
    if (layout_make(&p->a, x->ab, x->trans_b ? K : N, x->trans_b ? N : K, x->ldb, batch,
                    x->stride_b, "matmul layout of B") ||
        layout_make(&p->b, x->ab, x->trans_a ? M : K, x->trans_a ? K : M, x->lda, batch,
                    x->stride_a, "matmul layout of A") ||
        layout_make(&p->d, x->d, N, M, x->ldd, batch, x->stride_d, "matmul layout of D") ||
        visc_cublas_check(visc_lt.pref_create(&p->pref), "matmul preference") ||
        visc_cublas_check(visc_lt.pref_set(p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof ws),
                          "matmul workspace"))
        return -1;
    /* The heuristic assumes 256-byte aligned operands unless told otherwise,
     * and may pick a kernel that fails on (or misreads) a tensor that starts
     * anywhere else: a weight inside the flat parameter buffer (64-byte
     * aligned in fp32, 32 in its bf16 copy), an activation at an arena
     * offset. So it is told the alignment each pointer really has. */
    const size_t ab_bytes = element_bytes(x->ab);
    const uint32_t align_d = batch_alignment(x->D, x->stride_d, element_bytes(x->d), batch);
    const uint32_t align[4] = {batch_alignment(x->B, x->stride_b, ab_bytes, batch),
                               batch_alignment(x->A, x->stride_a, ab_bytes, batch), align_d,
                               align_d};
    const cublasLtMatmulPreferenceAttributes_t which[4] =
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        if (visc_cublas_check(visc_lt.pref_set(p->pref, which[i], &align[i], sizeof align[i]),
                              "matmul alignment"))
            return -1;
    return 0;
}

static int matmul(visc_cuda *ctx, const product *x);

/* fp32 sums plus a bf16 bias per column, rounded once to bf16 */
__global__ void bias_round_kernel(__nv_bfloat16 *D, const float *sums, const __nv_bfloat16 *bias,
                                  size_t n, int N) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        D[i] = __float2bfloat16_rn(__fadd_rn(sums[i], __bfloat162float(bias[i % (size_t)N])));
}

/* A product whose bias cuBLASLt has no epilogue algorithm for (none is
 * known on Hopper; the bf16 output's had not run on a GPU when this was
 * written): the product without the epilogue, then the bias added by a
 * kernel. fp32 D in place; bf16 D through fp32 sums in a buffer of the
 * context's, so that each value is still rounded once. Says so once. */
static int bias_by_kernel(visc_cuda *ctx, const product *x) {
    static int said;
    if (!said && !ctx->lt_no_bias_epilogue) {
        said = 1;
        fprintf(stderr, "visc: note: cuBLASLt has no algorithm for a product of M %d, N %d, K %d "
                        "with its bias epilogue: the bias is added by a kernel\n",
                x->M, x->N, x->K);
    }
    if (x->batch != 1 || x->ldd != x->N)
        return visc_set_error("matmul: a bias on a strided or batched product");
    product plain = *x;
    plain.bias = NULL;
    if (x->d == CUDA_R_32F)
        return matmul(ctx, &plain) ||
                       visc_cuda_add_broadcast(ctx, (float *)x->D, (const float *)x->bias, x->M,
                                               x->N)
                   ? -1
                   : 0;
    const size_t n = (size_t)x->M * x->N;
    float *sums = (float *)visc_cuda_grow(ctx, &ctx->lt_sums, &ctx->lt_sums_bytes,
                                          n * sizeof(float));
    if (!sums) return -1;
    plain.d = CUDA_R_32F, plain.D = sums, plain.beta = 0.0f;
    if (matmul(ctx, &plain)) return -1;
    bias_round_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        (__nv_bfloat16 *)x->D, sums, (const __nv_bfloat16 *)x->bias, n, x->N);
    return visc_cuda_launched("bias + rounding to bf16");
}

static int matmul(visc_cuda *ctx, const product *x) {
    const int M = x->M, N = x->N, K = x->K;
    if (M <= 0 || N <= 0 || K <= 0 || x->batch <= 0)
        return visc_set_error("matmul: bad shape M %d, N %d, K %d, batch %d", M, N, K, x->batch);
    /* cuBLASLt takes no alignment for the bias vector, and its bias
     * epilogue has been seen to fail on vectors not 16-byte aligned: such
     * a bias (none of a model's: the parameter table aligns them) is added
     * after the product instead */
    if (x->bias && alignment_of(x->bias) < 16) {
        if (x->d != CUDA_R_32F) /* the bf16 biases are the context's scratch, aligned */
            return visc_set_error("matmul: a bf16 bias not 16-byte aligned");
        product plain = *x;
        plain.bias = NULL;
        return matmul(ctx, &plain) ||
                       visc_cuda_add_broadcast(ctx, (float *)x->D, (const float *)x->bias, M, N)
                   ? -1
                   : 0;
    }
    cublasLtHandle_t lt = visc_cuda_lt(ctx);
    if (!lt) return -1;
    plan_key key;
    memset(&key, 0, sizeof key);
    key.ab = x->ab;
    key.d = x->d;
    key.M = M, key.N = N, key.K = K, key.batch = x->batch;
    key.trans_a = x->trans_a, key.trans_b = x->trans_b, key.has_bias = x->bias != NULL;
    key.lda = x->lda, key.ldb = x->ldb, key.ldd = x->ldd;
    key.stride_a = x->stride_a, key.stride_b = x->stride_b, key.stride_d = x->stride_d;
    const size_t ab_bytes = element_bytes(x->ab);
    key.align_a = batch_alignment(x->A, x->stride_a, ab_bytes, x->batch);
    key.align_b = batch_alignment(x->B, x->stride_b, ab_bytes, x->batch);
    key.align_d = batch_alignment(x->D, x->stride_d, element_bytes(x->d), x->batch);
    key.align_bias = x->bias ? alignment_of(x->bias) : 0;
    lt_plan made = {};
    lt_plan *p = plan_lookup(ctx, &key);
    int rc = 0, owned = 0;
    if (p && p->bias_by_kernel) return bias_by_kernel(ctx, x);
    if (p) {
        /* The bias pointer is the one attribute a kept plan takes per call. */
        if (x->bias)
            rc = visc_cublas_check(visc_lt.desc_set(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &x->bias, sizeof x->bias),
                                   "matmul bias pointer");
    } else {
        rc = plan_make(&made, x);
        cublasLtMatmulHeuristicResult_t h = {};
        int found = 0;
        /* The shape goes into the message: cuBLASLt answers a shape it has
         * no kernel for with a bare "not supported". */
        char what[128];
        snprintf(what, sizeof what, "matmul heuristic for M %d, N %d, K %d, batch %d%s", M, N, K,
                 x->batch, x->bias ? " with a bias" : "");
        if (rc == 0)
            rc = visc_cublas_check(visc_lt.heuristic(lt, made.op, made.a, made.b, made.d, made.d,
                                                     made.pref, 1, &h, &found),
                                   what);
        if (rc == 0 && found == 0)
            rc = visc_set_error("matmul: cuBLASLt has no algorithm for M %d, N %d, K %d, batch "
                                "%d%s",
                                M, N, K, x->batch, x->bias ? " with a bias" : "");
        if ((rc || ctx->lt_no_bias_epilogue) && x->bias) {
            /* remembered for the shape: no heuristic per call */
            plan_free(&made);
            lt_plan marker = {};
            marker.bias_by_kernel = 1;
            plan_keep(ctx, &key, &marker);
            return bias_by_kernel(ctx, x);
        }
        if (rc) {
            plan_free(&made);
            return rc;
        }
        made.algo = h.algo;
        p = plan_keep(ctx, &key, &made);
        if (!p) p = &made, owned = 1;
    }
    if (rc == 0)
        rc = visc_cublas_check(visc_lt.matmul(lt, p->op, &x->alpha, x->B, p->a, x->A, p->b,
                                              &x->beta, x->D, p->d, x->D, p->d, &p->algo,
                                              ctx->workspace, VISC_CUDA_WORKSPACE, ctx->stream),
                               "cublasLtMatmul");
    visc_cuda_profile_point(x->ab == CUDA_R_32F   ? "cuBLASLt matmul (fp32)"
                            : x->d == CUDA_R_16BF ? "cuBLASLt matmul (bf16, bf16 out)"
                                                  : "cuBLASLt matmul (bf16)");
    if (owned) plan_free(&made);
    return rc;
}

/* One product, its matrices packed (leading dimensions their widths); D
 * and bias of type d. */
static int matmul_one(visc_cuda *ctx, cudaDataType_t ab, cudaDataType_t d, void *D, const void *A,
                      const void *B, const void *bias, int M, int N, int K, int trans_a,
                      int trans_b, float beta) {
    const product x = {ab,      A,       B,       D,         bias, M, N, K, trans_a, trans_b, 1,
                       trans_a ? M : K,  trans_b ? K : N,    N,    0, 0, 0, 1.0f,    beta, d};
    return matmul(ctx, &x);
}

int visc_cuda_matmul_bf16(visc_cuda *ctx, float *D, const uint16_t *A, const uint16_t *B,
                          const float *bias, int M, int N, int K, int trans_a, int trans_b,
                          float beta) {
    return matmul_one(ctx, CUDA_R_16BF, CUDA_R_32F, D, A, B, bias, M, N, K, trans_a, trans_b,
                      beta);
}

int visc_cuda_matmul_bf16_to_bf16(visc_cuda *ctx, uint16_t *D, const uint16_t *A,
                                  const uint16_t *B, const uint16_t *bias, int M, int N, int K,
                                  int trans_a, int trans_b) {
    return matmul_one(ctx, CUDA_R_16BF, CUDA_R_16BF, D, A, B, bias, M, N, K, trans_a, trans_b,
                      0.0f);
}

int visc_cuda_matmul_f32(visc_cuda *ctx, float *D, const float *A, const float *B,
                         const float *bias, int M, int N, int K, int trans_a, int trans_b,
                         float beta) {
    return matmul_one(ctx, CUDA_R_32F, CUDA_R_32F, D, A, B, bias, M, N, K, trans_a, trans_b,
                      beta);
}

int visc_cuda_matmul_bf16_batched(visc_cuda *ctx, const visc_cuda_products *p) {
    const product x = {CUDA_R_16BF, p->A,      p->B,       p->D,       NULL,
                       p->M,        p->N,      p->K,       p->trans_a, p->trans_b,
                       p->batch,    p->lda,    p->ldb,     p->ldd,     p->stride_a,
                       p->stride_b, p->stride_d, p->alpha, p->beta, CUDA_R_32F};
    return matmul(ctx, &x);
}

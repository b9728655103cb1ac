/* emu_cublaslt.cpp: the cuBLASLt calls of src/cuda/matmul.cu, done on the
 * CPU, built as the emulator's libcublasLt.so.<major> that the backend's
 * own loader (cublaslt_dl.cu) opens in the emulated test.
 *
 * What cuBLASLt documents, checked as it checks it: column-major layouts
 * (rows, cols, leading dimension) that must agree with the operation's
 * shapes after the transposes (op(A) m x k, op(B) k x n, C and D m x n),
 * equal A and B types (fp32 or bf16), C and D of one type (fp32, or bf16
 * with bf16 A and B: the sum rounded once), fp32 compute and scale, a bias
 * epilogue adding bias[row] of D (of D's type, cuBLASLt's default), strided batches (every
 * operand the same count, each matrix its stride after the previous), and
 * an algorithm chosen
 * for the alignments the preference declared, which the pointers of a
 * later call must still have. The product is summed in double: the
 * backend's tests compare against double-precision references with fp32
 * accumulation's tolerance. Everything runs at once (the stream is not
 * waited on: the emulator runs all work when it is asked). */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

struct matmul_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t trans_a, trans_b;
    cublasLtEpilogue_t epilogue;
    const void *bias;
    cudaDataType_t bias_type;
};
struct layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;  /* 1 unless set */
    int64_t stride; /* elements from one matrix of the batch to the next */
};
struct preference {
    uint64_t workspace;
    uint32_t align[4]; /* A, B, C, D */
};
struct algo {
    uint32_t magic;
    uint32_t align[4];
};
const uint32_t ALGO_MAGIC = 0x76697363; /* "visc" */
/* The bias type until one is set: D's (cuBLASLt's -1) */
const cudaDataType_t BIAS_OF_D = (cudaDataType_t)-1;

static_assert(sizeof(matmul_desc) <= sizeof(cublasLtMatmulDescOpaque_t), "descriptor fits");
static_assert(sizeof(layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits");
static_assert(sizeof(preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "pref fits");
static_assert(sizeof(algo) <= sizeof(cublasLtMatmulAlgo_t), "algorithm fits");

matmul_desc *desc_of(cublasLtMatmulDesc_t d) { return (matmul_desc *)d->data; }
layout *layout_of(cublasLtMatrixLayout_t l) { return (layout *)l->data; }
preference *pref_of(cublasLtMatmulPreference_t p) { return (preference *)p->data; }

template <typename T> cublasStatus_t set(T *field, const void *buf, size_t bytes) {
    if (bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(field, buf, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

uint32_t alignment_of(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a >>= 1;
    return a;
}

cublasStatus_t invalid(const char *why) {
    fprintf(stderr, "visc-emu cuBLASLt: %s\n", why);
    return CUBLAS_STATUS_INVALID_VALUE;
}

/* The shapes of D = op(A) op(B): 0 if the layouts agree, with m, n, k. */
cublasStatus_t shapes(const matmul_desc *op, const layout *a, const layout *b, const layout *c,
                      const layout *d, uint64_t *m, uint64_t *n, uint64_t *k) {
    if (op->compute != CUBLAS_COMPUTE_32F || op->scale != CUDA_R_32F)
        return invalid("compute or scale type other than fp32");
    if (a->type != b->type || (a->type != CUDA_R_32F && a->type != CUDA_R_16BF))
        return invalid("A and B must both be fp32 or both bf16");
    if (c->type != d->type || (d->type != CUDA_R_32F && d->type != CUDA_R_16BF) ||
        (d->type == CUDA_R_16BF && a->type != CUDA_R_16BF))
        return invalid("C and D must both be fp32, or both bf16 with bf16 A and B");
    *m = op->trans_a == CUBLAS_OP_N ? a->rows : a->cols;
    *k = op->trans_a == CUBLAS_OP_N ? a->cols : a->rows;
    const uint64_t kb = op->trans_b == CUBLAS_OP_N ? b->rows : b->cols;
    *n = op->trans_b == CUBLAS_OP_N ? b->cols : b->rows;
    if (kb != *k) return invalid("op(A) and op(B) disagree on k");
    if (c->rows != *m || c->cols != *n || d->rows != *m || d->cols != *n)
        return invalid("C or D is not op(A) rows x op(B) columns");
    const layout *all[4] = {a, b, c, d};
    for (const layout *l : all)
        if (l->ld < (int64_t)l->rows || l->rows == 0 || l->cols == 0)
            return invalid("a leading dimension below the rows, or an empty matrix");
    if (a->batch != d->batch || b->batch != d->batch || c->batch != d->batch)
        return invalid("operands with different batch counts");
    if (d->batch > 1 && d->stride < d->ld * (int64_t)d->cols)
        return invalid("a batch of outputs whose matrices overlap");
    if (op->epilogue != CUBLASLT_EPILOGUE_DEFAULT && op->epilogue != CUBLASLT_EPILOGUE_BIAS)
        return invalid("an epilogue other than none or bias");
    if (op->epilogue == CUBLASLT_EPILOGUE_BIAS && op->bias_type != BIAS_OF_D &&
        op->bias_type != d->type)
        return invalid("a bias of another type than D's");
    return CUBLAS_STATUS_SUCCESS;
}

double element(const void *base, cudaDataType_t type, const layout *l, uint64_t r, uint64_t c) {
    const uint64_t i = c * (uint64_t)l->ld + r;
    if (type == CUDA_R_16BF) return (double)__bfloat162float(((const __nv_bfloat16 *)base)[i]);
    return (double)((const float *)base)[i];
}

/* D = alpha op(A) op(B) + beta C (+ bias) for one matrix of the batch:
 * op(A) as m rows of k (ra) and op(B) as n rows of k (rb), in double, so
 * each output is one contiguous dot product. */
void product(const matmul_desc *o, const double *ra, const double *rb, uint64_t m, uint64_t n,
             uint64_t k, float alpha, float beta, const void *cin, const layout *lc, void *out,
             const layout *ld) {
    const bool bf16 = ld->type == CUDA_R_16BF; /* D, C and the bias */
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            const double *x = ra + i * k, *y = rb + j * k;
            double acc = 0.0;
            for (uint64_t p = 0; p < k; p++) acc += x[p] * y[p];
            double v = (double)alpha * acc;
            if (beta != 0.0f) v += (double)beta * element(cin, lc->type, lc, i, j);
            if (o->epilogue == CUBLASLT_EPILOGUE_BIAS)
                v += bf16 ? (double)__bfloat162float(((const __nv_bfloat16 *)o->bias)[i])
                          : (double)((const float *)o->bias)[i];
            const uint64_t at = j * (uint64_t)ld->ld + i;
            if (bf16) ((__nv_bfloat16 *)out)[at] = __float2bfloat16_rn((float)v);
            else ((float *)out)[at] = (float)v;
        }
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    static int token;
    *h = (cublasLtHandle_t)&token;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "emulated cuBLASLt error";
    }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    *d = (cublasLtMatmulDesc_t)calloc(1, sizeof(cublasLtMatmulDescOpaque_t));
    if (!*d) return CUBLAS_STATUS_ALLOC_FAILED;
    matmul_desc *m = desc_of(*d);
    m->compute = compute;
    m->scale = scale;
    m->trans_a = m->trans_b = CUBLAS_OP_N;
    m->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    m->bias_type = BIAS_OF_D;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t bytes) {
    matmul_desc *m = desc_of(d);
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return set(&m->trans_a, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set(&m->trans_b, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set(&m->epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set(&m->bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(&m->bias_type, buf, bytes);
    default: return invalid("a matmul descriptor attribute the emulator does not know");
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
    *l = (cublasLtMatrixLayout_t)calloc(1, sizeof(cublasLtMatrixLayoutOpaque_t));
    if (!*l) return CUBLAS_STATUS_ALLOC_FAILED;
    *layout_of(*l) = layout{type, rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t bytes) {
    layout *m = layout_of(l);
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set(&m->batch, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set(&m->stride, buf, bytes);
    default: return invalid("a layout attribute the emulator does not know");
    }
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = (cublasLtMatmulPreference_t)calloc(1, sizeof(cublasLtMatmulPreferenceOpaque_t));
    if (!*p) return CUBLAS_STATUS_ALLOC_FAILED;
    preference *q = pref_of(*p);
    for (int i = 0; i < 4; i++) q->align[i] = 256; /* cuBLASLt assumes 256 unless told */
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t bytes) {
    preference *q = pref_of(p);
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set(&q->workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set(&q->align[0], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set(&q->align[1], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set(&q->align[2], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set(&q->align[3], buf, bytes);
    default: return invalid("a preference attribute the emulator does not know");
    }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t *results,
                                              int *returned) {
    uint64_t m, n, k;
    *returned = 0;
    if (requested < 1) return invalid("no heuristic results requested");
    const cublasStatus_t s =
        shapes(desc_of(op), layout_of(a), layout_of(b), layout_of(c), layout_of(d), &m, &n, &k);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    memset(&results[0], 0, sizeof results[0]);
    algo *al = (algo *)results[0].algo.data;
    al->magic = ALGO_MAGIC;
    memcpy(al->align, pref_of(pref)->align, sizeof al->align);
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t op, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a, const void *B,
                              cublasLtMatrixLayout_t b, const void *beta, const void *C,
                              cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t *chosen, void *, size_t, cudaStream_t) {
    const matmul_desc *o = desc_of(op);
    const layout *la = layout_of(a), *lb = layout_of(b), *lc = layout_of(c), *ld = layout_of(d);
    uint64_t m, n, k;
    const cublasStatus_t s = shapes(o, la, lb, lc, ld, &m, &n, &k);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!chosen) return invalid("no algorithm (the emulator takes the heuristic's)");
    const algo *al = (const algo *)chosen->data;
    if (al->magic != ALGO_MAGIC) return invalid("an algorithm the heuristic did not return");
    /* every matrix of a batch must have the alignment declared for the first */
    const layout *ls[4] = {la, lb, lc, ld};
    const void *ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        for (int32_t t = 0; t < ls[i]->batch; t++) {
            const void *at = (const char *)ptrs[i] +
                             (ls[i]->type == CUDA_R_16BF ? 2 : 4) * ls[i]->stride * t;
            if (alignment_of(at) < al->align[i]) {
                fprintf(stderr,
                        "visc-emu cuBLASLt: operand %c at %p (matrix %d of the batch) is "
                        "%u-byte aligned; the algorithm was chosen for %u\n",
                        "ABCD"[i], at, t, alignment_of(at), al -> align[i]);
                return CUBLAS_STATUS_INVALID_VALUE;
            }
        }
    if (o->epilogue == CUBLASLT_EPILOGUE_BIAS && !o->bias)
        return invalid("a bias epilogue, no bias");
    const float alpha_f = *(const float *)alpha, beta_f = *(const float *)beta;
    double *ra = (double *)malloc(sizeof(double) * m * k),
           *rb = (double *)malloc(sizeof(double) * n * k);
    if (!ra || !rb) {
        free(ra);
        free(rb);
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    for (int32_t t = 0; t < ld->batch; t++) {
        const size_t ea = la->type == CUDA_R_16BF ? 2 : 4; /* A and B share their type */
        const char *At = (const char *)A + ea * la->stride * t;
        const char *Bt = (const char *)B + ea * lb->stride * t;
        const size_t ed = ld->type == CUDA_R_16BF ? 2 : 4; /* C and D share theirs */
        const void *cin = (const char *)C + ed * lc->stride * t;
        void *out = (char *)D + ed * ld->stride * t;
        for (uint64_t i = 0; i < m; i++)
            for (uint64_t p = 0; p < k; p++)
                ra[i * k + p] = o->trans_a == CUBLAS_OP_N ? element(At, la->type, la, i, p)
                                                          : element(At, la->type, la, p, i);
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t p = 0; p < k; p++)
                rb[j * k + p] = o->trans_b == CUBLAS_OP_N ? element(Bt, lb->type, lb, p, j)
                                                          : element(Bt, lb->type, lb, j, p);
        product(o, ra, rb, m, n, k, alpha_f, beta_f, cin, lc, out, ld);
    }
    free(ra);
    free(rb);
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"

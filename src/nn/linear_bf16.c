/* linear_bf16.c: the bf16 matmul path of the linear layer, and the
 * process-wide precision switch that selects it.
 *
 * Why explicit bf16 copies: oneDNN 2.6's bf16 matmul wants bf16 source and
 * weights, so each product converts its fp32 operands into scratch buffers
 * first (memory-bound, a small fraction of the product for the transformer
 * shapes). The rounding is ours (round to nearest even), so a test can
 * compute the exact same product in fp32 from the rounded operands.
 *
 * Primitives are cached per (transposes, M, N, K, bias), created on the
 * first call with a shape and reused; the bf16 copies and the oneDNN
 * scratchpad live in buffers that only grow, so after the first training
 * step nothing allocates. Callers are not concurrent (the layers of a model
 * run one after another), as for linear.c's bias partials. */
#include <stdio.h>
#include <string.h>

#include "linear_bf16.h"
#include "visc/cpu.h"
#include "visc/nn.h"

/* ---- the switch ---- */

static visc_precision precision = VISC_PRECISION_FP32;

int visc_bf16_supported(void) {
    /* The ISA values are nested bit sets: AMX includes avx512_core_bf16. */
    const unsigned want = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    return ((unsigned)dnnl_get_effective_cpu_isa() & want) == want;
}

visc_precision visc_set_matmul_precision(visc_precision p) {
    if (p == VISC_PRECISION_BF16 && !visc_bf16_supported()) {
        fprintf(stderr, "visc: note: this CPU has no native bf16 (avx512_bf16); "
                        "linear layers stay fp32\n");
        p = VISC_PRECISION_FP32;
    }
    precision = p;
    return p;
}

visc_precision visc_matmul_precision(void) { return precision; }

int visc_parse_precision(const char *name, visc_precision *out) {
    if (!strcmp(name, "fp32")) *out = VISC_PRECISION_FP32;
    else if (!strcmp(name, "bf16")) *out = VISC_PRECISION_BF16;
    else return visc_set_error("precision: expected fp32 or bf16, got '%s'", name);
    return 0;
}

const char *visc_precision_name(visc_precision p) {
    return p == VISC_PRECISION_BF16 ? "bf16" : "fp32";
}

/* ---- fp32 -> bf16 copies ---- */

__attribute__((target_clones("avx512f", "avx2", "default"))) static void
convert_chunk(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = visc_f32_to_bf16(src[i]);
}

static void to_bf16(uint16_t *dst, const float *src, size_t n) {
    enum { CHUNK = 16384 };
    const long chunks = (long)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (long c = 0; c < chunks; c++) {
        const size_t lo = (size_t)c * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
        convert_chunk(dst + lo, src + lo, len);
    }
}

typedef struct {
    uint16_t *p;
    size_t cap; /* elements */
} bf16_buf;

static bf16_buf buf_in, buf_w, buf_dout;
static void *scratch;
static size_t scratch_cap;

static uint16_t *convert(bf16_buf *b, const float *src, size_t n) {
    if (b->cap < n) {
        visc_free_aligned(b->p);
        b->p = visc_alloc_aligned(n * sizeof(uint16_t), "bf16 operand copy");
        b->cap = n;
    }
    to_bf16(b->p, src, n);
    return b->p;
}

/* ---- cached matmul primitives: C[M, N] = op(A)[M, K] * op(B)[K, N] (+ bias) ---- */

typedef struct {
    char ta, tb; /* 'N': the operand is stored as written; 'T': stored transposed */
    int M, N, K, has_bias;
    int ok; /* 0: oneDNN has no native bf16 kernel for it (use fp32) */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, bias, c, pad;
} product;

/* Separately allocated, so the array can grow while callers hold pointers. */
static product **products;
static int n_products, cap_products;

static void bf16_md(dnnl_memory_desc_t *md, dnnl_dim_t rows, dnnl_dim_t cols, char t) {
    const dnnl_dims_t dims = {rows, cols}; /* full size: the API reads DNNL_MAX_NDIMS */
    VISC_DNNL(dnnl_memory_desc_init_by_tag(md, 2, dims, dnnl_bf16, t == 'T' ? dnnl_ba : dnnl_ab));
}

static void create(product *p) {
    dnnl_memory_desc_t a, b, c, bias;
    bf16_md(&a, p->M, p->K, p->ta);
    bf16_md(&b, p->K, p->N, p->tb);
    const dnnl_dims_t cdims = {p->M, p->N}, bdims = {1, p->N};
    visc_dnnl_md(&c, 2, cdims, dnnl_ab);
    visc_dnnl_md(&bias, 2, bdims, dnnl_ab);
    dnnl_matmul_desc_t desc;
    VISC_DNNL(dnnl_matmul_desc_init(&desc, &a, &b, p->has_bias ? &bias : NULL, &c));
    dnnl_primitive_attr_t attr = visc_dnnl_attr_user_scratchpad();
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, visc_dnnl_engine(), NULL);
    VISC_DNNL(dnnl_primitive_attr_destroy(attr));
    p->ok = 0;
    if (st != dnnl_success) return;
    /* The reference kernels convert element by element: far slower than fp32 sgemm. */
    if (strncmp(visc_dnnl_impl_name(pd), "ref", 3) != 0) {
        p->ok = 1;
        p->prim = visc_dnnl_primitive(pd);
        p->a = visc_dnnl_memory(&a, DNNL_MEMORY_NONE);
        p->b = visc_dnnl_memory(&b, DNNL_MEMORY_NONE);
        p->c = visc_dnnl_memory(&c, DNNL_MEMORY_NONE);
        p->bias = p->has_bias ? visc_dnnl_memory(&bias, DNNL_MEMORY_NONE) : NULL;
        const size_t bytes = visc_dnnl_scratchpad_bytes(pd);
        p->pad = NULL;
        if (bytes) {
            p->pad = visc_dnnl_memory(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0),
                                      DNNL_MEMORY_NONE);
            if (scratch_cap < bytes) {
                visc_free_aligned(scratch);
                scratch = visc_alloc_aligned(bytes, "bf16 matmul scratchpad");
                scratch_cap = bytes;
            }
        }
    }
    VISC_DNNL(dnnl_primitive_desc_destroy(pd));
}

static product *find(char ta, char tb, int M, int N, int K, int has_bias) {
    for (int i = 0; i < n_products; i++) {
        product *p = products[i];
        if (p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K &&
            p->has_bias == has_bias)
            return p;
    }
    if (n_products == cap_products) {
        cap_products = cap_products ? 2 * cap_products : 32;
        products = visc_realloc(products, sizeof *products * cap_products, "bf16 matmul cache");
    }
    product *p = visc_malloc(sizeof *p, "bf16 matmul");
    products[n_products++] = p;
    *p = (product){.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .has_bias = has_bias};
    create(p);
    return p;
}

static void run(product *p, const uint16_t *A, const uint16_t *B, const float *bias, float *C) {
    visc_dnnl_set_handle(p->a, A);
    visc_dnnl_set_handle(p->b, B);
    visc_dnnl_set_handle(p->c, C);
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, p->a},
                               {DNNL_ARG_WEIGHTS, p->b},
                               {DNNL_ARG_DST, p->c}};
    int n = 3;
    if (p->bias) {
        visc_dnnl_set_handle(p->bias, bias);
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, p->bias};
    }
    if (p->pad) {
        visc_dnnl_set_handle(p->pad, scratch);
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, p->pad};
    }
    visc_dnnl_run(p->prim, n, args);
}

/* ---- the layer's products ---- */

int visc_linear_bf16_forward(float *out, const float *in, const float *weight, const float *bias,
                             int N, int in_features, int out_features) {
    /* out[N, out] = in[N, in] * W[out, in]^T: W read as a transposed [in, out]. */
    product *p = find('N', 'T', N, out_features, in_features, bias != NULL);
    if (!p->ok) return -1;
    const uint16_t *x = convert(&buf_in, in, (size_t)N * in_features);
    const uint16_t *w = convert(&buf_w, weight, (size_t)out_features * in_features);
    run(p, x, w, bias, out);
    return 0;
}

int visc_linear_bf16_backward(float *din, float *dweight, const float *dout, const float *in,
                              const float *weight, int N, int in_features, int out_features) {
    /* din[N, in] = dout[N, out] * W[out, in];  dW[out, in] = dout^T * in[N, in]. */
    product *pd = din ? find('N', 'N', N, in_features, out_features, 0) : NULL;
    /* dW reduces over the N rows, so dout is read transposed (the kernel
     * copies it to its layout first: ~0.65x the speed of a plain operand,
     * measured; a transposing conversion would trade that for a second bf16
     * copy of dout, about as costly). */
    product *pw = find('T', 'N', out_features, in_features, N, 0);
    if ((pd && !pd->ok) || !pw->ok) return -1;
    /* dout is converted once and serves both products. */
    const uint16_t *dy = convert(&buf_dout, dout, (size_t)N * out_features);
    if (pd) run(pd, dy, convert(&buf_w, weight, (size_t)out_features * in_features), NULL, din);
    run(pw, dy, convert(&buf_in, in, (size_t)N * in_features), NULL, dweight);
    return 0;
}

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
#include <stdlib.h>
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

/* Without native bf16, oneDNN still has bf16 matmul kernels that widen the
 * operands on the fly (measured 4.7x slower than fp32 sgemm on an avx512_core
 * Xeon), so a bf16 request stays fp32 there: slower and less precise would
 * be the worst of both. VISC_BF16_EMULATE=1 takes those kernels anyway, for
 * the bf16 numbers on such a machine (the stand-in GPU's tests compare
 * against them: a GPU multiplies in bf16 whatever the host has). Below
 * AVX-512 oneDNN has no bf16 matmul at all: there an emulated product
 * widens the rounded operands back to fp32 and runs the fp32 matmul (the
 * product of two bf16 values is exact in fp32, so only the order of the
 * fp32 sums differs from a bf16 kernel's). */
static int emulate_requested(void) {
    const char *env = getenv("VISC_BF16_EMULATE");
    return env && strcmp(env, "1") == 0;
}

visc_precision visc_set_matmul_precision(visc_precision p) {
    if (p == VISC_PRECISION_BF16 && !visc_bf16_supported()) {
        const int emulate = emulate_requested();
        fprintf(stderr, "visc: note: this CPU has no native bf16 (avx512_bf16); %s\n",
                emulate ? "VISC_BF16_EMULATE=1: bf16 products emulated (slower than fp32)"
                        : "linear layers stay fp32");
        if (!emulate) p = VISC_PRECISION_FP32;
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

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
narrow_chunk(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = visc_f32_to_bf16(src[i]);
}

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
widen_chunk(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = visc_bf16_to_f32(src[i]);
}

/* n elements fp32 -> bf16 (narrow) or bf16 -> fp32 (widen, for the emulated
 * products below), in chunks over the threads. */
typedef enum { NARROW, WIDEN } conversion;

static void convert_all(conversion kind, void *dst, const void *src, size_t n) {
    enum { CHUNK = 16384 };
    const long chunks = (long)((n + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (long c = 0; c < chunks; c++) {
        const size_t lo = (size_t)c * CHUNK, len = n - lo < CHUNK ? n - lo : CHUNK;
        if (kind == NARROW) narrow_chunk((uint16_t *)dst + lo, (const float *)src + lo, len);
        else widen_chunk((float *)dst + lo, (const uint16_t *)src + lo, len);
    }
}

typedef struct {
    uint16_t *p;
    size_t cap; /* elements */
} bf16_buf;

static bf16_buf buf_in, buf_w, buf_dout;
static void *scratch;
static size_t scratch_cap;

static void grow(bf16_buf *b, size_t n) {
    if (b->cap < n) {
        visc_free_aligned(b->p);
        b->p = visc_alloc_aligned(n * sizeof(uint16_t), "bf16 operand copy");
        b->cap = n;
    }
}

static uint16_t *convert(bf16_buf *b, const float *src, size_t n) {
    grow(b, n);
    convert_all(NARROW, b->p, src, n);
    return b->p;
}

/* ---- cached matmul primitives: C[M, N] = op(A)[M, K] * op(B)[K, N] (+ bias) ---- */

typedef struct {
    char ta, tb; /* 'N': the operand is stored as written; 'T': stored transposed */
    int M, N, K, has_bias;
    int split;   /* > 1: K cut into `split` equal slices, one batch entry each (see dw_split) */
    int ok;      /* 0: oneDNN has no native bf16 kernel for it (use fp32) */
    int widen;   /* 1: emulated with an fp32 kernel on the operands widened back (see above) */
    int emulate; /* VISC_BF16_EMULATE when made: part of the key, the kernel depends on it */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, bias, c, pad;
} product;

/* Separately allocated, so the array can grow while callers hold pointers. */
static product **products;
static int n_products, cap_products;

static void operand_md(dnnl_memory_desc_t *md, dnnl_dim_t rows, dnnl_dim_t cols, char t,
                       dnnl_data_type_t type) {
    const dnnl_dims_t dims = {rows, cols}; /* full size: the API reads DNNL_MAX_NDIMS */
    VISC_DNNL(dnnl_memory_desc_init_by_tag(md, 2, dims, type, t == 'T' ? dnnl_ba : dnnl_ab));
}

/* The sliced product: slice s of A = op(A)[:, s Ks : (s + 1) Ks] and of B
 * = op(B)[s Ks : (s + 1) Ks, :], as a batch of `split` products through
 * strides (no copies); C gets one [M, N] partial per slice. */
static void sliced_mds(dnnl_memory_desc_t *a, dnnl_memory_desc_t *b, dnnl_memory_desc_t *c,
                       const product *p, dnnl_data_type_t type) {
    const dnnl_dim_t S = p->split, M = p->M, N = p->N, Ks = p->K / p->split;
    const dnnl_dims_t adims = {S, M, Ks}, bdims = {S, Ks, N}, cdims = {S, M, N};
    const dnnl_dim_t K = p->K;
    /* strides of (slice, row, column): A stored [K, M] ('T') or [M, K]; B [N, K] ('T') or [K, N] */
    const dnnl_dims_t as = {p->ta == 'T' ? Ks * M : Ks, p->ta == 'T' ? 1 : K, p->ta == 'T' ? M : 1};
    const dnnl_dims_t bs = {p->tb == 'T' ? Ks : Ks * N, p->tb == 'T' ? 1 : N, p->tb == 'T' ? K : 1};
    VISC_DNNL(dnnl_memory_desc_init_by_strides(a, 3, adims, type, as));
    VISC_DNNL(dnnl_memory_desc_init_by_strides(b, 3, bdims, type, bs));
    visc_dnnl_md(c, 3, cdims, dnnl_abc);
}

/* Tries to make p's primitive with operands of the given type; 0 when
 * oneDNN has none, or only its reference kernels and allow_ref is 0 (they
 * convert element by element: far slower than fp32 sgemm). */
static int create_typed(product *p, dnnl_data_type_t type, int allow_ref) {
    dnnl_memory_desc_t a, b, c, bias;
    operand_md(&a, p->M, p->K, p->ta, type);
    operand_md(&b, p->K, p->N, p->tb, type);
    const dnnl_dims_t cdims = {p->M, p->N}, bdims = {1, p->N};
    visc_dnnl_md(&c, 2, cdims, dnnl_ab);
    if (p->split > 1) sliced_mds(&a, &b, &c, p, type);
    visc_dnnl_md(&bias, 2, bdims, dnnl_ab);
    dnnl_matmul_desc_t desc;
    VISC_DNNL(dnnl_matmul_desc_init(&desc, &a, &b, p->has_bias ? &bias : NULL, &c));
    dnnl_primitive_attr_t attr = visc_dnnl_attr_user_scratchpad();
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, visc_dnnl_engine(), NULL);
    VISC_DNNL(dnnl_primitive_attr_destroy(attr));
    if (st != dnnl_success) return 0;
    if (!allow_ref && strncmp(visc_dnnl_impl_name(pd), "ref", 3) == 0) {
        VISC_DNNL(dnnl_primitive_desc_destroy(pd));
        return 0;
    }
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
    VISC_DNNL(dnnl_primitive_desc_destroy(pd));
    return 1;
}

static void create(product *p) {
    p->ok = create_typed(p, dnnl_bf16, 0);
    /* Emulation wants the bf16 numbers above all: any fp32 kernel will do. */
    if (!p->ok && p->emulate) p->ok = p->widen = create_typed(p, dnnl_f32, 1);
}

static product *find(char ta, char tb, int M, int N, int K, int has_bias, int split) {
    const int emulate = emulate_requested();
    for (int i = 0; i < n_products; i++) {
        product *p = products[i];
        if (p->ta == ta && p->tb == tb && p->M == M && p->N == N && p->K == K &&
            p->has_bias == has_bias && p->split == split && p->emulate == emulate)
            return p;
    }
    if (n_products == cap_products) {
        cap_products = cap_products ? 2 * cap_products : 32;
        products = visc_realloc(products, sizeof *products * cap_products, "bf16 matmul cache");
    }
    product *p = visc_malloc(sizeof *p, "bf16 matmul");
    products[n_products++] = p;
    *p = (product){.ta = ta,
                   .tb = tb,
                   .M = M,
                   .N = N,
                   .K = K,
                   .has_bias = has_bias,
                   .split = split,
                   .emulate = emulate};
    create(p);
    return p;
}

/* The widened operands of an emulated product. */
static float *wide_a, *wide_b;
static size_t wide_a_cap, wide_b_cap; /* floats */

static const float *widen(float **buf, size_t *cap, const uint16_t *src, size_t n) {
    if (*cap < n) {
        visc_free_aligned(*buf);
        *buf = visc_alloc_aligned(n * sizeof(float), "emulated bf16 operand");
        *cap = n;
    }
    convert_all(WIDEN, *buf, src, n);
    return *buf;
}

static void run(product *p, const uint16_t *A, const uint16_t *B, const float *bias, float *C) {
    if (p->widen) {
        /* A holds op(A)'s M x K values and B op(B)'s K x N whatever the split. */
        visc_dnnl_set_handle(p->a, widen(&wide_a, &wide_a_cap, A, (size_t)p->M * p->K));
        visc_dnnl_set_handle(p->b, widen(&wide_b, &wide_b_cap, B, (size_t)p->K * p->N));
    } else {
        visc_dnnl_set_handle(p->a, A);
        visc_dnnl_set_handle(p->b, B);
    }
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

int visc_linear_bf16_forward_rounded(float *out, const uint16_t *in, const float *weight,
                                     const float *bias, int N, int in_features, int out_features) {
    /* out[N, out] = in[N, in] * W[out, in]^T: W read as a transposed [in, out]. */
    product *p = find('N', 'T', N, out_features, in_features, bias != NULL, 1);
    if (!p->ok) return -1;
    const uint16_t *w = convert(&buf_w, weight, (size_t)out_features * in_features);
    run(p, in, w, bias, out);
    return 0;
}

int visc_linear_bf16_forward(float *out, const float *in, const float *weight, const float *bias,
                             int N, int in_features, int out_features) {
    if (!find('N', 'T', N, out_features, in_features, bias != NULL, 1)->ok) return -1;
    const uint16_t *x = convert(&buf_in, in, (size_t)N * in_features);
    return visc_linear_bf16_forward_rounded(out, x, weight, bias, N, in_features, out_features);
}

/* The weight gradient reduces over all N rows into a small [out, in]
 * matrix, and for the early Swin / ViT stages (N = 50176 rows into 96 x 384)
 * oneDNN 2.6's kernel for the transposed dout runs at ~240 GFLOP/s per
 * core: the rows cut into two slices, computed as a batch of two and the
 * partials added, measured ~310 for that shape (neutral for the others
 * this rule picks). The cut is fixed (not the thread count), so results
 * do not depend on the threads. */
static int dw_split(int N, int in_features, int out_features) {
    const int wide = in_features > out_features ? in_features : out_features;
    return N % 2 == 0 && N >= 8 * wide ? 2 : 1;
}

static float *dw_part;
static size_t dw_part_cap; /* floats */

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
add_halves(float *dst, const float *part, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = part[i] + part[n + i];
}

/* The products of backward; x is the input already rounded, or NULL (then in is rounded here). */
static int backward(float *din, float *dweight, float *dbias, const float *dout, const uint16_t *x,
                    const float *in, const float *weight, int N, int in_features,
                    int out_features) {
    /* din[N, in] = dout[N, out] * W[out, in];  dW[out, in] = dout^T * in[N, in]. */
    product *pd = din ? find('N', 'N', N, in_features, out_features, 0, 1) : NULL;
    /* dW reduces over the N rows, so dout is read transposed (the kernel
     * copies it to its layout first: ~0.65x the speed of a plain operand,
     * measured; a transposing conversion would trade that for a second bf16
     * copy of dout, about as costly). */
    const int split = dw_split(N, in_features, out_features);
    product *pw = find('T', 'N', out_features, in_features, N, 0, split);
    if ((pd && !pd->ok) || !pw->ok) return -1;
    /* dout is converted once and serves both products (and, with the bias
     * gradient, in the pass that sums its columns). */
    const size_t ny = (size_t)N * out_features;
    const uint16_t *dy;
    if (dbias) {
        grow(&buf_dout, ny);
        visc_linear_column_sums(dbias, buf_dout.p, dout, N, out_features);
        dy = buf_dout.p;
    } else {
        dy = convert(&buf_dout, dout, ny);
    }
    if (pd) run(pd, dy, convert(&buf_w, weight, (size_t)out_features * in_features), NULL, din);
    if (!x) x = convert(&buf_in, in, (size_t)N * in_features);
    if (split == 1) {
        run(pw, dy, x, NULL, dweight);
        return 0;
    }
    const size_t nw = (size_t)out_features * in_features;
    if (dw_part_cap < 2 * nw) {
        visc_free_aligned(dw_part);
        dw_part = visc_alloc_aligned(2 * nw * sizeof(float), "bf16 weight-gradient partials");
        dw_part_cap = 2 * nw;
    }
    run(pw, dy, x, NULL, dw_part);
    add_halves(dweight, dw_part, nw);
    return 0;
}

int visc_linear_bf16_backward(float *din, float *dweight, float *dbias, const float *dout,
                              const float *in, const float *weight, int N, int in_features,
                              int out_features) {
    return backward(din, dweight, dbias, dout, NULL, in, weight, N, in_features, out_features);
}

int visc_linear_bf16_backward_rounded(float *din, float *dweight, float *dbias, const float *dout,
                                      const uint16_t *in, const float *weight, int N,
                                      int in_features, int out_features) {
    return backward(din, dweight, dbias, dout, in, NULL, weight, N, in_features, out_features);
}

int visc_linear_bf16_ready(int N, int in_features, int out_features, int has_bias) {
    return precision == VISC_PRECISION_BF16 &&
           visc_linear_bf16_shape_ready(N, in_features, out_features, has_bias);
}

int visc_linear_bf16_shape_ready(int N, int in_features, int out_features, int has_bias) {
    const product *f = find('N', 'T', N, out_features, in_features, has_bias, 1);
    const product *d = find('N', 'N', N, in_features, out_features, 0, 1);
    const product *w =
        find('T', 'N', out_features, in_features, N, 0, dw_split(N, in_features, out_features));
    return f->ok && d->ok && w->ok;
}

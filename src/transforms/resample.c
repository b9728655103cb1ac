/* resample.c: Pillow's Image.resize for 8-bit RGB, reproduced bit for bit.
 *
 * Pillow (libImaging/Resample.c) resizes separably: a horizontal pass into
 * a temporary image holding only the source rows the vertical pass needs,
 * then a vertical pass. Each output pixel xx of a pass is a weighted sum
 * over the source pixels around center = in0 + (xx + 0.5) * scale, with
 * scale = (in1 - in0) / out. When downscaling (scale > 1) the filter is
 * stretched by scale, so every source pixel contributes: that is PIL's
 * antialiasing, and the reason a 4x downscale is not 4x cheaper here.
 *
 * Details that decide the last bit, all copied from Pillow's behaviour:
 * - the box is float32 (PIL stores it so), and in1 - in0 is a float
 *   subtraction before it widens to double;
 * - the window is [(int)(center - support + 0.5), (int)(center + support
 *   + 0.5)) clipped to the image: (int) truncates toward zero;
 * - weights are filter((x - center + 0.5) / filterscale) in double,
 *   normalized by their sum, then rounded half away from zero to 22-bit
 *   fixed point (PRECISION_BITS = 32 - 8 - 2);
 * - the sum starts at 1 << 21 (rounding) and the result is
 *   clamp(sum >> 22, 0, 255), an arithmetic shift (floor).
 * Nearest is not this algorithm in Pillow: resize(NEAREST) is an affine
 * transform that samples at a running double coordinate (see
 * resize_nearest). */
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/transforms.h"

#define PRECISION_BITS (32 - 8 - 2)

typedef struct {
    double support;
    double (*fn)(double x);
} filter;

static double bilinear_fn(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Keys' cubic convolution with a = -0.5, as Pillow. */
static double bicubic_fn(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

static const filter BILINEAR = {1.0, bilinear_fn};
static const filter BICUBIC = {2.0, bicubic_fn};

/* Per-thread scratch: the taps, the intermediate image and the pipeline's
 * view live in buffers that each thread keeps and grows on demand, so a
 * resize in the training loop allocates nothing once the buffers have
 * grown. A pthread key (not _Thread_local) so that a worker thread's
 * buffers are freed when it exits. */
typedef struct {
    void *p[VISC_SCRATCH_SLOTS];
    size_t n[VISC_SCRATCH_SLOTS];
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_destroy(void *arg) {
    scratch_set *s = arg;
    for (int i = 0; i < VISC_SCRATCH_SLOTS; i++) free(s->p[i]);
    free(s);
}

static void scratch_init(void) {
    if (pthread_key_create(&scratch_key, scratch_destroy) != 0) visc_die("pthread_key_create");
}

void *visc_transform_scratch(int slot, size_t bytes) {
    VISC_ASSERT(slot >= 0 && slot < VISC_SCRATCH_SLOTS);
    pthread_once(&scratch_once, scratch_init);
    scratch_set *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = visc_calloc(1, sizeof *s, "transform scratch");
        if (pthread_setspecific(scratch_key, s) != 0) visc_die("pthread_setspecific");
    }
    if (bytes == 0) bytes = 1;
    if (s->n[slot] < bytes) {
        /* grow by half again, so a slowly rising size reallocates rarely */
        size_t n = bytes + bytes / 2;
        free(s->p[slot]);
        s->p[slot] = visc_malloc(n, "transform scratch");
        s->n[slot] = n;
    }
    return s->p[slot];
}

/* The taps of one pass: output i reads the K = ksize source pixels
 * start[i] .. start[i] + K - 1 with weights coef[i * K + k]. Pillow's
 * window for i may be shorter than K; it is padded with zero weights and
 * moved left where it would run past the source, so every output has the
 * same K taps inside the image. A zero weight adds exactly 0, so the sums,
 * hence the pixels, are Pillow's; a fixed K lets the inner loops unroll. */
typedef struct {
    int ksize;
    const int32_t *start;
    const int32_t *coef;
} taps;

/* Pillow's window size bound for one pass. */
static int taps_wide(const filter *f, float in0, float in1, int out_size) {
    double scale = (double)(in1 - in0) / out_size;
    double support = f->support * (scale < 1.0 ? 1.0 : scale);
    return (int)ceil(support) * 2 + 1;
}

/* Scratch taps_make needs: int32 cells for the fixed-point weights, the
 * window starts and sizes (slot TAPS_H / TAPS_V), and doubles for the
 * weights before rounding (slot WEIGHTS, only while taps_make runs). */
static size_t taps_cells(const filter *f, float in0, float in1, int out_size) {
    return (size_t)out_size * ((size_t)taps_wide(f, in0, in1, out_size) + 2);
}

static void taps_make(taps *t, int32_t *mem, const filter *f, int in_size, float in0, float in1,
                      int out_size) {
    double scale = (double)(in1 - in0) / out_size;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = f->support * filterscale;
    const int wide = taps_wide(f, in0, in1, out_size);
    double *w = visc_transform_scratch(VISC_SCRATCH_WEIGHTS,
                                       sizeof(double) * (size_t)out_size * (size_t)wide);
    int32_t *coef = mem;
    int32_t *start = coef + (size_t)out_size * wide, *count = start + out_size;
    double ss = 1.0 / filterscale;
    int kmax = 1;
    for (int xx = 0; xx < out_size; xx++) {
        double center = in0 + (xx + 0.5) * scale;
        int xmin = (int)(center - support + 0.5);
        int xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > in_size) xmax = in_size;
        int n = xmax - xmin;
        if (n < 0) n = 0;
        double *wx = w + (size_t)xx * wide, sum = 0.0;
        for (int x = 0; x < n; x++) {
            wx[x] = f->fn((x + xmin - center + 0.5) * ss);
            sum += wx[x];
        }
        for (int x = 0; x < n; x++) wx[x] = sum != 0.0 ? wx[x] / sum : wx[x];
        start[xx] = xmin;
        count[xx] = n;
        if (n > kmax) kmax = n;
    }
    /* K = kmax <= in_size (every window lies inside the source), so a
     * window moved left to end at in_size still starts at >= 0. */
    if (kmax > in_size) kmax = in_size;
    for (int xx = 0; xx < out_size; xx++) {
        int s = start[xx], n = count[xx];
        int moved = s + kmax > in_size ? in_size - kmax : s;
        int32_t *c = coef + (size_t)xx * kmax;
        const double *wx = w + (size_t)xx * wide;
        for (int k = 0; k < kmax; k++) {
            int x = moved + k - s; /* index into Pillow's window */
            if (x < 0 || x >= n) {
                c[k] = 0;
                continue;
            }
            double s22 = wx[x] * (1 << PRECISION_BITS);
            c[k] = (int32_t)(wx[x] < 0 ? -0.5 + s22 : 0.5 + s22);
        }
        start[xx] = moved;
    }
    t->ksize = kmax;
    t->start = start;
    t->coef = coef;
}

static inline uint8_t clip8(int32_t v) {
    int32_t s = v >> PRECISION_BITS; /* arithmetic shift, as Pillow relies on */
    return (uint8_t)(s < 0 ? 0 : s > 255 ? 255 : s);
}

/* Four int32 lanes: R, G, B and a spare one, so one pixel is one vector
 * multiply-add per tap (GCC vector extensions: SSE/AVX without
 * intrinsics). */
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint32_t v4u __attribute__((vector_size(16)));

/* Pixel p as lanes; reads p[3] too, so the caller makes sure it exists.
 * One 32-bit load broadcast and shifted per lane: compilers turn this into
 * a broadcast and a variable shift (where byte-vector conversions come out
 * as scalar inserts). */
static inline v4i load4(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    const v4i shift = {0, 8, 16, 24};
    v4i b = {(int32_t)u, (int32_t)u, (int32_t)u, (int32_t)u};
    return (v4i)((v4u)b >> (v4u)shift) & 255;
}

/* One output pixel of the horizontal pass, K taps at p (K constant when
 * inlined from the switch below). `last` = the window ends at the row's
 * end: its last pixel is read byte by byte, as p[3] may lie past the
 * image. */
static inline v4i hpixel(const uint8_t *p, const int32_t *c, int K, int last) {
    v4i s = {1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 0};
    int kv = last ? K - 1 : K;
    for (int k = 0; k < kv; k++) s += load4(p + 3 * k) * c[k];
    if (last) {
        const uint8_t *q = p + 3 * (K - 1);
        v4i v = {q[0], q[1], q[2], 0};
        s += v * c[K - 1];
    }
    return s;
}

/* Pillow's clip8 on all lanes, then the three colour bytes. */
static inline void store_pixel(uint8_t *o, v4i s) {
    v4i q = s >> PRECISION_BITS;
    q &= ~(q < 0);     /* negatives -> 0 */
    v4i big = q > 255; /* lanes of -1 where q > 255 */
    q = (q & ~big) | (big & 255);
    o[0] = (uint8_t)q[0];
    o[1] = (uint8_t)q[1];
    o[2] = (uint8_t)q[2];
}

/* One row of the horizontal pass with K taps; output pixel o takes source
 * window xx = o (or ow - 1 - o when flipping: the flip is free here). */
static inline void hrow(const uint8_t *in, int in_w, const taps *t, int K, int ow, int flip,
                        uint8_t *out) {
    for (int o = 0; o < ow; o++) {
        int xx = flip ? ow - 1 - o : o;
        int s = t->start[xx];
        store_pixel(out + 3 * o, hpixel(in + 3 * s, t->coef + (size_t)xx * K, K, s + K == in_w));
    }
}

/* Two rows at once (in0 and in1 = in0 + stride) in eight lanes, R G B x of
 * each: the loads, shifts and multiply-adds of both rows share one 256-bit
 * instruction each where AVX2 is there. Same sums as hrow, lane by lane. */
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

static inline void hrow2(const uint8_t *in0, size_t stride, int in_w, const taps *t, int K, int ow,
                         int flip, uint8_t *out0, uint8_t *out1) {
    const int32_t half = 1 << (PRECISION_BITS - 1);
    const v8u shift = {0, 8, 16, 24, 0, 8, 16, 24};
    for (int o = 0; o < ow; o++) {
        int xx = flip ? ow - 1 - o : o;
        int st = t->start[xx];
        const int32_t *c = t->coef + (size_t)xx * K;
        const uint8_t *p = in0 + 3 * st;
        v8i sum = {half, half, half, 0, half, half, half, 0};
        int kv = st + K == in_w ? K - 1 : K; /* the row's last pixel: p[3] may not exist */
        for (int k = 0; k < kv; k++) {
            uint32_t u0, u1;
            memcpy(&u0, p + 3 * k, 4);
            memcpy(&u1, p + stride + 3 * k, 4);
            v8u b = {u0, u0, u0, u0, u1, u1, u1, u1};
            sum += (v8i)((b >> shift) & 255) * c[k];
        }
        if (kv < K) {
            const uint8_t *q = p + 3 * (K - 1);
            v8i v = {q[0], q[1], q[2], 0, q[stride], q[stride + 1], q[stride + 2], 0};
            sum += v * c[K - 1];
        }
        v8i q = sum >> PRECISION_BITS;
        q &= ~(q < 0);
        v8i big = q > 255;
        q = (q & ~big) | (big & 255);
        uint8_t *o0 = out0 + 3 * o, *o1 = out1 + 3 * o;
        o0[0] = (uint8_t)q[0];
        o0[1] = (uint8_t)q[1];
        o0[2] = (uint8_t)q[2];
        o1[0] = (uint8_t)q[4];
        o1[1] = (uint8_t)q[5];
        o1[2] = (uint8_t)q[6];
    }
}

/* Horizontal pass over source rows [y0, y0 + rows) into dst (row stride
 * dstride), two rows at a time. The switch hands the row functions a
 * constant K for the common sizes, so their tap loops unroll. */
#define HROWS(KK)                                                                                  \
    do {                                                                                           \
        int y = 0;                                                                                 \
        for (; y + 1 < rows; y += 2)                                                               \
            hrow2(src->data + (size_t)(y0 + y) * src->stride, (size_t)src->stride, src->width, t,  \
                  KK, ow, flip, dst + (size_t)y * dstride, dst + (size_t)(y + 1) * dstride);       \
        if (y < rows)                                                                              \
            hrow(src->data + (size_t)(y0 + y) * src->stride, src->width, t, KK, ow, flip,          \
                 dst + (size_t)y * dstride);                                                       \
    } while (0)

__attribute__((target_clones("arch=x86-64-v3", "default"))) static void
pass_horizontal(const visc_image *src, int y0, int rows, const taps *t, int ow, int flip,
                uint8_t *dst, size_t dstride) {
    switch (t->ksize) {
    case 1: HROWS(1); break;
    case 2: HROWS(2); break;
    case 3: HROWS(3); break;
    case 4: HROWS(4); break;
    case 5: HROWS(5); break;
    case 6: HROWS(6); break;
    case 7: HROWS(7); break;
    case 8: HROWS(8); break;
    default: HROWS(t->ksize); break;
    }
}

/* ---- the horizontal pass with 16-bit multiply-adds (AVX2) ----
 *
 * vpmaddwd multiplies 16-bit lanes in pairs and adds each pair into 32
 * bits: two taps of one channel per lane, 4 taps x 3 channels per
 * instruction, where the generic code above spends a 32-bit multiply per
 * tap and pixel (on the ImageNet samples the horizontal pass was 10% of the
 * whole pipeline: decode included). The 22-bit weights do not fit 16 bits,
 * so each is split exactly, c = hi * 2^11 + lo with 0 <= lo < 2^11, and
 * two sums are kept: sum(p * c) = sum(p * hi) * 2^11 + sum(p * lo) in
 * int32 without overflow (|hi| <= 2^11 + 1, p <= 255). Integer sums are
 * exact, so the pixels are the generic pass's (Pillow's) bit for bit.
 *
 * Layout: taps in groups of 4 (K rounded up, the extra weights 0) and each
 * window moved left so its K4 taps lie inside the row (as taps_make does
 * for K): a group is 12 source bytes p[0..11], read as two 8-byte loads
 * (p[0..7], p[4..11]: never past the group), one per 128-bit half, and
 * shuffled into words (R0 R1 G0 G1 B0 B1 0 0 | R2 R3 G2 G3 B2 B3 0 0).
 * The weights of a group are two such vectors (hi, lo) of (c0 c1) x 3 and
 * (c2 c3) x 3. */
typedef struct {
    int groups;            /* K4 / 4 */
    const int32_t *start;  /* [ow] window starts for K4 taps */
    const int16_t *weight; /* [ow][groups][2][16] */
} packed_taps;

static int have_avx2(void) {
    static int cached = -1; /* a benign race: every thread computes the same */
    if (cached < 0) cached = __builtin_cpu_supports("avx2") ? 1 : 0;
    return cached;
}

/* Scratch bytes packed_taps needs for ow outputs of K taps. */
static size_t packed_bytes(int ow, int K) {
    size_t g = ((size_t)K + 3) / 4;
    return (size_t)ow * sizeof(int32_t) + (size_t)ow * g * 64 * sizeof(int16_t) + 32;
}

/* From t (K taps per output): 0, or -1 when K4 taps do not fit the row
 * (then the generic pass runs). */
static int packed_make(packed_taps *pt, void *mem, const taps *t, int in_w, int ow) {
    const int K = t->ksize, G = (K + 3) / 4, K4 = 4 * G;
    if (K4 > in_w) return -1;
    int32_t *start = mem;
    /* 32-byte alignment for the weight vectors */
    uintptr_t w0 = ((uintptr_t)(start + ow) + 31) & ~(uintptr_t)31;
    int16_t *w = (int16_t *)w0;
    for (int xx = 0; xx < ow; xx++) {
        int s = t->start[xx], m = s + K4 > in_w ? in_w - K4 : s;
        start[xx] = m;
        const int32_t *c = t->coef + (size_t)xx * K;
        for (int g = 0; g < G; g++) {
            int16_t *hi = w + ((size_t)xx * G + g) * 32, *lo = hi + 16;
            memset(hi, 0, 32 * sizeof *hi);
            for (int j = 0; j < 4; j++) {
                int k = m + 4 * g + j - s; /* index into t's window */
                int32_t v = k >= 0 && k < K ? c[k] : 0;
                int16_t h = (int16_t)(v >> 11), l = (int16_t)(v & 2047);
                /* tap j of the group: half j / 2, word j % 2 of each pair */
                for (int ch = 0; ch < 3; ch++) {
                    hi[8 * (j / 2) + 2 * ch + j % 2] = h;
                    lo[8 * (j / 2) + 2 * ch + j % 2] = l;
                }
            }
        }
    }
    pt->groups = G;
    pt->start = start;
    pt->weight = w;
    return 0;
}

/* Group g's 12 bytes at p as words (see above). */
__attribute__((target("avx2"))) static inline __m256i group_words(const uint8_t *p, __m256i order) {
    __m128i a = _mm_loadl_epi64((const __m128i *)p);
    __m128i b = _mm_loadl_epi64((const __m128i *)(p + 4));
    return _mm256_shuffle_epi8(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1), order);
}

/* The sums of one row's window: hi * 2^11 + lo, both halves (taps 0-1 and
 * 2-3 of every group) still apart. */
__attribute__((target("avx2"))) static inline __m256i window_sum(const uint8_t *p, const __m256i *c,
                                                                 int G, __m256i order) {
    __m256i hi = _mm256_setzero_si256(), lo = _mm256_setzero_si256();
    for (int g = 0; g < G; g++, p += 12) {
        __m256i v = group_words(p, order);
        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(v, _mm256_load_si256(c + 2 * g)));
        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(v, _mm256_load_si256(c + 2 * g + 1)));
    }
    return _mm256_add_epi32(_mm256_slli_epi32(hi, 11), lo);
}

/* Two rows' window sums -> (row a | row b) finished sums: halves added,
 * rounding added, shifted (clip8 before saturation). */
__attribute__((target("avx2"))) static inline __m256i finish2(__m256i a, __m256i b) {
    const __m256i half = _mm256_setr_epi32(1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1),
                                           1 << (PRECISION_BITS - 1), 0, 1 << (PRECISION_BITS - 1),
                                           1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 0);
    __m256i s = _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                                 _mm256_permute2x128_si256(a, b, 0x31));
    return _mm256_srai_epi32(_mm256_add_epi32(s, half), PRECISION_BITS);
}

static inline void store3(uint8_t *o, uint32_t px, int last) {
    /* 4 bytes where the next pixel of the row follows (it is written
     * after this one), 3 at the row's end */
    if (!last) {
        memcpy(o, &px, 4);
        return;
    }
    o[0] = (uint8_t)px;
    o[1] = (uint8_t)(px >> 8);
    o[2] = (uint8_t)(px >> 16);
}

/* Rows in0 + r * stride (r < nrows, 1 <= nrows <= 4) into out + r * ostride. */
__attribute__((target("avx2"))) static void hrows_avx2(const uint8_t *in, size_t stride, int nrows,
                                                       const packed_taps *pt, int ow, int flip,
                                                       uint8_t *out, size_t ostride) {
    const __m256i order =
        _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 2, -1, 5, -1, 3,
                         -1, 6, -1, 4, -1, 7, -1, -1, -1, -1, -1);
    const int G = pt->groups;
    for (int o = 0; o < ow; o++) {
        int xx = flip ? ow - 1 - o : o, last = o == ow - 1;
        const uint8_t *p = in + 3 * pt->start[xx];
        const __m256i *c = (const __m256i *)(pt->weight + (size_t)xx * G * 32);
        __m256i s0 = window_sum(p, c, G, order);
        __m256i s1 = nrows > 1 ? window_sum(p + stride, c, G, order) : s0;
        __m256i s2 = nrows > 2 ? window_sum(p + 2 * stride, c, G, order) : s0;
        __m256i s3 = nrows > 3 ? window_sum(p + 3 * stride, c, G, order) : s0;
        /* (row 0 | row 1) and (row 2 | row 3), then saturated to bytes:
         * packs gives words (r0 r2 | r1 r3), packus bytes of the same */
        __m256i w = _mm256_packs_epi32(finish2(s0, s1), finish2(s2, s3));
        __m256i q = _mm256_packus_epi16(w, w);
        __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        uint32_t px[4] = {(uint32_t)_mm_cvtsi128_si32(lo), (uint32_t)_mm_cvtsi128_si32(hi),
                          (uint32_t)_mm_extract_epi32(lo, 1), (uint32_t)_mm_extract_epi32(hi, 1)};
        uint8_t *d = out + 3 * (size_t)o;
        for (int r = 0; r < nrows; r++) store3(d + r * ostride, px[r], last);
    }
}

/* Up to four rows (in + r * stride, r < nrows) into planar runs: row r's
 * R at out[r * ostride + o], G at + ow, B at + 2 ow. A block is 4 rows x 4
 * outputs: the rows share each output's window and weights, and the 4
 * outputs of a row leave as three 4-byte words (R0-3, G0-3, B0-3). */
__attribute__((target("avx2"))) static void hrows_planar_avx2(const uint8_t *in, size_t stride,
                                                              int nrows, const packed_taps *pt,
                                                              int ow, int flip, uint8_t *out,
                                                              size_t ostride) {
    const __m256i order =
        _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 2, -1, 5, -1, 3,
                         -1, 6, -1, 4, -1, 7, -1, -1, -1, -1, -1);
    /* per 128-bit half: (o0 o1 o2 o3 as R G B x bytes) -> R0-3 G0-3 B0-3 */
    const __m256i planes = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, -1, -1, -1, -1,
                                            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, -1, -1, -1, -1);
    const int G = pt->groups;
    for (int o = 0; o < ow; o += 4) {
        __m256i f01[4], f23[4]; /* output j: (row 0 | row 1), (row 2 | row 3) */
        for (int j = 0; j < 4; j++) {
            int oj = o + j < ow ? o + j : o; /* past the end: a repeat, not stored */
            int xx = flip ? ow - 1 - oj : oj;
            const uint8_t *p = in + 3 * pt->start[xx];
            const __m256i *c = (const __m256i *)(pt->weight + (size_t)xx * G * 32);
            __m256i s0 = window_sum(p, c, G, order);
            __m256i s1 = nrows > 1 ? window_sum(p + stride, c, G, order) : s0;
            f01[j] = finish2(s0, s1);
            if (nrows > 2) {
                __m256i s2 = window_sum(p + 2 * stride, c, G, order);
                __m256i s3 = nrows > 3 ? window_sum(p + 3 * stride, c, G, order) : s2;
                f23[j] = finish2(s2, s3);
            } else {
                f23[j] = f01[j];
            }
        }
        /* words (o0 o1 | o0 o1) and (o2 o3 | o2 o3) of rows (a | b), then
         * bytes o0 o1 o2 o3 of row a | of row b, then planar */
        __m256i q01 = _mm256_shuffle_epi8(_mm256_packus_epi16(_mm256_packs_epi32(f01[0], f01[1]),
                                                              _mm256_packs_epi32(f01[2], f01[3])),
                                          planes);
        __m256i q23 = _mm256_shuffle_epi8(_mm256_packus_epi16(_mm256_packs_epi32(f23[0], f23[1]),
                                                              _mm256_packs_epi32(f23[2], f23[3])),
                                          planes);
        __m128i rows4[4] = {_mm256_castsi256_si128(q01), _mm256_extracti128_si256(q01, 1),
                            _mm256_castsi256_si128(q23), _mm256_extracti128_si256(q23, 1)};
        for (int r = 0; r < nrows; r++) {
            uint32_t w[3] = {(uint32_t)_mm_cvtsi128_si32(rows4[r]),
                             (uint32_t)_mm_extract_epi32(rows4[r], 1),
                             (uint32_t)_mm_extract_epi32(rows4[r], 2)};
            uint8_t *d = out + r * ostride + o;
            for (int ch = 0; ch < 3; ch++) {
                if (o + 4 <= ow) {
                    memcpy(d + (size_t)ch * ow, &w[ch], 4);
                } else {
                    for (int j = 0; o + j < ow; j++)
                        d[(size_t)ch * ow + j] = (uint8_t)(w[ch] >> (8 * j));
                }
            }
        }
    }
}

/* The horizontal pass with the 16-bit AVX2 rows, where the CPU has them
 * and the grouped window fits the row: 1, else 0 and nothing done. */
static int horizontal_avx2(const visc_image *src, int y0, int rows, const taps *t, int ow, int flip,
                           uint8_t *dst, size_t dstride, int planar) {
    packed_taps pt;
    if (!have_avx2() ||
        packed_make(&pt,
                    visc_transform_scratch(VISC_SCRATCH_TAPS_PACKED, packed_bytes(ow, t->ksize)), t,
                    src->width, ow) != 0)
        return 0;
    if (planar) {
        for (int y = 0; y < rows; y += 4)
            hrows_planar_avx2(src->data + (size_t)(y0 + y) * src->stride, (size_t)src->stride,
                              rows - y < 4 ? rows - y : 4, &pt, ow, flip, dst + (size_t)y * dstride,
                              dstride);
        return 1;
    }
    for (int y = 0; y < rows; y += 4)
        hrows_avx2(src->data + (size_t)(y0 + y) * src->stride, (size_t)src->stride,
                   rows - y < 4 ? rows - y : 4, &pt, ow, flip, dst + (size_t)y * dstride, dstride);
    return 1;
}

/* The horizontal pass: AVX2 where it can, else the generic code. */
static void horizontal(const visc_image *src, int y0, int rows, const taps *t, int ow, int flip,
                       uint8_t *dst, size_t dstride) {
    if (!horizontal_avx2(src, y0, rows, t, ow, flip, dst, dstride, 0))
        pass_horizontal(src, y0, rows, t, ow, flip, dst, dstride);
}

/* The vertical pass's inner loops over a whole row of bytes: contiguous,
 * so GCC vectorizes them (a register-blocked version with vector types
 * came out slower: GCC 12 widens bytes to int32 lanes one by one). */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
accumulate_row(int32_t *restrict acc, const uint8_t *restrict row, int32_t c, int n) {
    for (int i = 0; i < n; i++) acc[i] += row[i] * c;
}

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
clip_row(uint8_t *restrict out, int32_t *restrict acc, int n) {
    for (int i = 0; i < n; i++) {
        out[i] = clip8(acc[i]);
        acc[i] = 1 << (PRECISION_BITS - 1); /* ready for the next row */
    }
}

/* The end of the fused resize + ToTensor + Normalize: one row of sums in
 * planar runs (R, G, B, w each), clipped as clip_row, then as
 * visc_to_tensor_normalize (v / 255, then (x - m) / s: the same float
 * operations, so the same bits) into plane c. Contiguous runs: this
 * vectorizes, where interleaved sums did not. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
clip_normalize_run(float *restrict out, int32_t *restrict acc, float m, float sd, int w) {
    for (int x = 0; x < w; x++) {
        /* clip8 in int32 lanes (through uint8_t the loop stays scalar) */
        int32_t q = acc[x] >> PRECISION_BITS;
        q = q < 0 ? 0 : q > 255 ? 255 : q;
        out[x] = ((float)q / 255.0f - m) / sd;
    }
    for (int x = 0; x < w; x++) acc[x] = 1 << (PRECISION_BITS - 1);
}

/* Vertical pass: rows of src (stride sstride, n bytes each) relative to the
 * first row the taps use (row_offset subtracted), into dst's bytes, or
 * (chw set: planar rows of n / 3 pixels) normalized into chw's planes. */
static void pass_vertical(const uint8_t *src, size_t sstride, int row_offset, const taps *t, int oh,
                          int n, visc_image *dst, float *chw, const float *mean, const float *std) {
    const int K = t->ksize, w = n / 3;
    const size_t plane = (size_t)w * oh;
    int32_t *acc = visc_transform_scratch(VISC_SCRATCH_ROWS, sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) acc[i] = 1 << (PRECISION_BITS - 1);
    for (int yy = 0; yy < oh; yy++) {
        const int32_t *c = t->coef + (size_t)yy * K;
        const uint8_t *first = src + (size_t)(t->start[yy] - row_offset) * sstride;
        for (int k = 0; k < K; k++)
            if (c[k]) accumulate_row(acc, first + (size_t)k * sstride, c[k], n);
        if (!chw) {
            clip_row(dst->data + (size_t)yy * dst->stride, acc, n);
            continue;
        }
        for (int ch = 0; ch < 3; ch++)
            clip_normalize_run(chw + ch * plane + (size_t)yy * w, acc + (size_t)ch * w, mean[ch],
                               std[ch], w);
    }
}

/* Pillow's resize(NEAREST): ImagingScaleAffine with a = (box width / ow,
 * box x0, ...). The sample coordinate starts at x0 + a / 2 and advances by
 * adding a (a running double sum, so long rows round as Pillow's do);
 * (int) truncation picks the pixel. */
static void resize_nearest(const visc_image *src, const float *box, visc_image *dst) {
    int ow = dst->width, oh = dst->height;
    double ax = (double)(box[2] - box[0]) / ow, ay = (double)(box[3] - box[1]) / oh;
    int *xin = visc_malloc(sizeof(int) * (size_t)ow, "nearest table");
    double xo = box[0] + ax * 0.5;
    for (int x = 0; x < ow; x++, xo += ax) {
        int v = xo < 0.0 ? -1 : (int)xo;
        xin[x] = v < 0 ? -1 : v >= src->width ? -1 : v;
    }
    double yo = box[1] + ay * 0.5;
    for (int y = 0; y < oh; y++, yo += ay) {
        int yi = yo < 0.0 ? -1 : (int)yo;
        uint8_t *out = dst->data + (size_t)y * dst->stride;
        if (yi < 0 || yi >= src->height) { /* Pillow fills outside with 0 */
            memset(out, 0, 3 * (size_t)ow);
            continue;
        }
        const uint8_t *in = src->data + (size_t)yi * src->stride;
        for (int x = 0; x < ow; x++) {
            if (xin[x] < 0) {
                out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = 0;
            } else {
                memcpy(out + 3 * x, in + 3 * xin[x], 3);
            }
        }
    }
    free(xin);
}

static void copy_image(const visc_image *src, visc_image *dst) {
    for (int y = 0; y < src->height; y++)
        memcpy(dst->data + (size_t)y * dst->stride, src->data + (size_t)y * src->stride,
               3 * (size_t)src->width);
}

void visc_resize(const visc_image *src, const float *box, visc_interp interp, visc_image *dst) {
    visc_resize_flip(src, box, interp, 0, dst);
}

void visc_resize_flip(const visc_image *src, const float *box_in, visc_interp interp, int flip,
                      visc_image *dst) {
    int ow = dst->width, oh = dst->height;
    float box[4] = {0, 0, (float)src->width, (float)src->height};
    if (box_in) memcpy(box, box_in, sizeof box);
    VISC_ASSERT(ow > 0 && oh > 0 && src->width > 0 && src->height > 0);
    /* Image.resize returns a copy when nothing changes. */
    if (ow == src->width && oh == src->height && box[0] == 0 && box[1] == 0 && box[2] == ow &&
        box[3] == oh) {
        copy_image(src, dst);
        if (flip) visc_hflip(dst);
        return;
    }
    if (interp == VISC_INTERP_NEAREST) {
        resize_nearest(src, box, dst);
        if (flip) visc_hflip(dst);
        return;
    }
    const filter *f = interp == VISC_INTERP_BICUBIC ? &BICUBIC : &BILINEAR;
    /* Pillow's test compares the box's right edge with the OUTPUT size; kept
     * as is, since skipping a pass changes nothing but the work done. */
    int need_h = ow != src->width || box[0] != 0 || box[2] != ow;
    int need_v = oh != src->height || box[1] != 0 || box[3] != oh;
    taps tv, th;
    taps_make(&tv,
              visc_transform_scratch(VISC_SCRATCH_TAPS_V,
                                     sizeof(int32_t) * taps_cells(f, box[1], box[3], oh)),
              f, src->height, box[1], box[3], oh);
    /* rows the vertical taps read (windows moved left may start earlier) */
    int yfirst = tv.start[0], ylast = tv.start[0] + tv.ksize;
    for (int y = 1; y < oh; y++) {
        if (tv.start[y] < yfirst) yfirst = tv.start[y];
        if (tv.start[y] + tv.ksize > ylast) ylast = tv.start[y] + tv.ksize;
    }
    if (need_h) {
        taps_make(&th,
                  visc_transform_scratch(VISC_SCRATCH_TAPS_H,
                                         sizeof(int32_t) * taps_cells(f, box[0], box[2], ow)),
                  f, src->width, box[0], box[2], ow);
        if (!need_v) { /* the horizontal pass writes the output directly */
            horizontal(src, 0, oh, &th, ow, flip, dst->data, (size_t)dst->stride);
        } else {
            int rows = ylast - yfirst;
            size_t tstride = 3 * (size_t)ow;
            uint8_t *tmp = visc_transform_scratch(VISC_SCRATCH_RESIZE_TMP, (size_t)rows * tstride);
            horizontal(src, yfirst, rows, &th, ow, flip, tmp, tstride);
            pass_vertical(tmp, tstride, yfirst, &tv, oh, 3 * ow, dst, NULL, NULL, NULL);
        }
    } else if (need_v) {
        pass_vertical(src->data, (size_t)src->stride, 0, &tv, oh, 3 * ow, dst, NULL, NULL, NULL);
        if (flip) visc_hflip(dst);
    } else {
        copy_image(src, dst);
        if (flip) visc_hflip(dst);
    }
}

void visc_resize_flip_normalize(const visc_image *src, const float *box_in, visc_interp interp,
                                int flip, int ow, int oh, const float mean[3], const float std[3],
                                float *chw) {
    float box[4] = {0, 0, (float)src->width, (float)src->height};
    if (box_in) memcpy(box, box_in, sizeof box);
    VISC_ASSERT(ow > 0 && oh > 0 && src->width > 0 && src->height > 0);
    /* Folded where both filter passes run (the usual RandomResizedCrop):
     * the horizontal pass writes planar rows, the vertical pass then works
     * on them byte for byte as on interleaved ones (it is elementwise) and
     * finishes with contiguous runs per channel. */
    const int filtered = interp == VISC_INTERP_BILINEAR || interp == VISC_INTERP_BICUBIC;
    const int need_h = ow != src->width || box[0] != 0 || box[2] != ow;
    const int need_v = oh != src->height || box[1] != 0 || box[3] != oh;
    if (filtered && need_h && need_v) {
        const filter *f = interp == VISC_INTERP_BICUBIC ? &BICUBIC : &BILINEAR;
        taps tv, th;
        taps_make(&tv,
                  visc_transform_scratch(VISC_SCRATCH_TAPS_V,
                                         sizeof(int32_t) * taps_cells(f, box[1], box[3], oh)),
                  f, src->height, box[1], box[3], oh);
        int yfirst = tv.start[0], ylast = tv.start[0] + tv.ksize;
        for (int y = 1; y < oh; y++) {
            if (tv.start[y] < yfirst) yfirst = tv.start[y];
            if (tv.start[y] + tv.ksize > ylast) ylast = tv.start[y] + tv.ksize;
        }
        taps_make(&th,
                  visc_transform_scratch(VISC_SCRATCH_TAPS_H,
                                         sizeof(int32_t) * taps_cells(f, box[0], box[2], ow)),
                  f, src->width, box[0], box[2], ow);
        int rows = ylast - yfirst;
        size_t tstride = 3 * (size_t)ow;
        uint8_t *tmp = visc_transform_scratch(VISC_SCRATCH_RESIZE_TMP, (size_t)rows * tstride);
        if (horizontal_avx2(src, yfirst, rows, &th, ow, flip, tmp, tstride, 1)) {
            pass_vertical(tmp, tstride, yfirst, &tv, oh, 3 * ow, NULL, chw, mean, std);
            return;
        }
    }
    visc_image res = {NULL, ow, oh, 3 * ow};
    res.data = visc_transform_scratch(VISC_SCRATCH_NORMALIZE, (size_t)oh * res.stride);
    visc_resize_flip(src, box, interp, flip, &res);
    visc_to_tensor_normalize(&res, mean, std, chw);
}

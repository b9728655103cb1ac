/* compress.c: none, fp16, bf16 and blockwise 8-bit encodings of parts.
 *
 * Conversions are plain bit manipulation (no F16C) written as branch-free
 * loops over short chunks, so the compiler vectorizes them in each of the
 * target_clones. Decoding scans the received bytes for non-finite values
 * (and q8 scales) first and only then writes the output, so a hostile part
 * leaves the caller's buffer untouched. */
#include "compress.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "visc/core.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the encodings are little-endian on the wire; this host needs byte swaps"
#endif

#define CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
/* Values converted per step through an aligned scratch buffer: the loops
 * then run on typed arrays, and the copies to and from the unaligned
 * byte buffers are plain memcpy. */
#define CHUNK 2048
/* A q8 block whose absmax is below this encodes as zeros (scale 0): 1 /
 * scale would overflow a float for subnormal absmax. */
#define Q8_TINY 1e-30f
/* Below this, no q8 value (|q| <= 128) can overflow when decoded; above
 * it the block's values are checked one by one. */
#define Q8_SAFE_SCALE (FLT_MAX / 128.0f)

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- names and sizes ---- */

int visc_compression_parse(const char *name, visc_compression *out) {
    static const struct {
        const char *name;
        visc_compression c;
    } names[] = {{"none", VISC_COMP_NONE}, {"fp16", VISC_COMP_FP16}, {"bf16", VISC_COMP_BF16},
                 {"q8", VISC_COMP_Q8},     {"int8", VISC_COMP_Q8},   {"8bit", VISC_COMP_Q8}};
    if (!name) return visc_set_error("no compression named");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].c;
            return 0;
        }
    return visc_set_error("unknown compression '%.64s' (none, fp16, bf16, q8)", name);
}

const char *visc_compression_name(visc_compression c) {
    switch (c) {
    case VISC_COMP_NONE: return "none";
    case VISC_COMP_FP16: return "fp16";
    case VISC_COMP_BF16: return "bf16";
    case VISC_COMP_Q8: return "q8";
    }
    return "unknown";
}

static size_t q8_blocks(size_t n) { return n / VISC_Q8_BLOCK + (n % VISC_Q8_BLOCK != 0); }

size_t visc_compressed_size(visc_compression c, size_t n) {
    if (n > SIZE_MAX / 8) return SIZE_MAX; /* no buffer that large exists */
    switch (c) {
    case VISC_COMP_NONE: return n * 4;
    case VISC_COMP_FP16:
    case VISC_COMP_BF16: return n * 2;
    case VISC_COMP_Q8: return n + 4 * q8_blocks(n);
    }
    return 0;
}

visc_compression visc_compression_for(visc_compression c, size_t n) {
    return n < VISC_COMPRESS_MIN_VALUES ? VISC_COMP_NONE : c;
}

/* ---- fp16 ---- */

/* Round to nearest even; finite values beyond +-65504 saturate; infinities
 * and NaN stay non-finite (so the receiver rejects them, as with "none"). */
/* select(c, a, b): a where the mask c is all ones, b where it is zero.
 * Written with bit operations because GCC will not if-convert a ?: whose
 * arms hold float arithmetic (it could trap), which blocks vectorizing. */
static uint32_t select_u32(uint32_t c, uint32_t a, uint32_t b) { return (a & c) | (b & ~c); }
static uint32_t mask_if(int cond) { return -(uint32_t)cond; }

CLONES static void fp16_encode(const float *x, size_t n, uint16_t *h) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = float_bits(x[i]);
        uint32_t sign = (u >> 16) & 0x8000u;
        uint32_t a = u & 0x7fffffffu;
        uint32_t c = select_u32(mask_if(a > 0x477fe000u && a < 0x7f800000u), 0x477fe000u, a);
        /* normal half: rebias the exponent (127 -> 15) and round the 13
         * dropped mantissa bits to nearest even */
        uint32_t normal = (c - 0x38000000u + 0x0fffu + ((c >> 13) & 1u)) >> 13;
        /* subnormal half (|x| < 2^-14): in 0.5 + |x| the float's last
         * mantissa bit weighs 2^-24, the half's subnormal step, and the FPU
         * rounds to nearest even; the bits above 0.5 are the half's */
        uint32_t sub = float_bits(bits_float(c) + 0.5f) - 0x3f000000u;
        uint32_t nonfinite = select_u32(mask_if(a > 0x7f800000u), 0x7e00u, 0x7c00u);
        uint32_t r = select_u32(mask_if(c < 0x38800000u), sub, normal);
        r = select_u32(mask_if(a >= 0x7f800000u), nonfinite, r);
        h[i] = (uint16_t)(sign | r);
    }
}

CLONES static void fp16_decode(const uint16_t *h, size_t n, float *x) {
    for (size_t i = 0; i < n; i++) {
        uint32_t v = h[i];
        uint32_t sign = (v & 0x8000u) << 16;
        uint32_t normal = ((v & 0x7fffu) << 13) + 0x38000000u;
        uint32_t sub = float_bits((float)(int32_t)(v & 0x3ffu) * 0x1p-24f);
        x[i] = bits_float(sign | select_u32(mask_if((v & 0x7c00u) != 0), normal, sub));
    }
}

/* ---- bf16 ---- */

/* Round to nearest even; finite values that would round to infinity
 * saturate to the largest bf16; NaN stays NaN. */
CLONES static void bf16_encode(const float *x, size_t n, uint16_t *h) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = float_bits(x[i]);
        uint32_t a = u & 0x7fffffffu;
        uint32_t sign = (u >> 16) & 0x8000u;
        uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        r = ((r & 0x7f80u) == 0x7f80u && a < 0x7f800000u) ? (sign | 0x7f7fu) : r;
        r = a > 0x7f800000u ? (sign | 0x7fc0u) : r;
        h[i] = (uint16_t)r;
    }
}

CLONES static void bf16_decode(const uint16_t *h, size_t n, float *x) {
    for (size_t i = 0; i < n; i++) x[i] = bits_float((uint32_t)h[i] << 16);
}

/* ---- finiteness scans of received bytes ---- */

/* Whether any value has all its exponent bits (mask) set: a pass that only
 * ORs flags (vectorized); the offending index is searched only when one
 * was found. */
CLONES static int any_u16_exp_full(const uint16_t *h, size_t n, uint16_t mask) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (h[i] & mask) == mask;
    return bad;
}
CLONES static int any_u32_exp_full(const uint32_t *u, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (u[i] & 0x7f800000u) == 0x7f800000u;
    return bad;
}

/* 0 when all n 16-bit values in `in` are finite; -1 naming the first. */
static int check_u16(const uint8_t *in, size_t n, uint16_t mask, const char *what) {
    uint16_t buf[CHUNK];
    for (size_t s = 0; s < n; s += CHUNK) {
        size_t k = n - s < CHUNK ? n - s : CHUNK;
        memcpy(buf, in + 2 * s, 2 * k);
        if (!any_u16_exp_full(buf, k, mask)) continue;
        for (size_t i = 0; i < k; i++)
            if ((buf[i] & mask) == mask)
                return visc_set_error("%s value %zu of the part is not finite", what, s + i);
    }
    return 0;
}

static int check_f32(const uint8_t *in, size_t n) {
    uint32_t buf[CHUNK];
    for (size_t s = 0; s < n; s += CHUNK) {
        size_t k = n - s < CHUNK ? n - s : CHUNK;
        memcpy(buf, in + 4 * s, 4 * k);
        if (!any_u32_exp_full(buf, k)) continue;
        for (size_t i = 0; i < k; i++)
            if ((buf[i] & 0x7f800000u) == 0x7f800000u)
                return visc_set_error("value %zu of the part is not finite", s + i);
    }
    return 0;
}

/* ---- q8: per block, a float scale = absmax / 127, then int8 values ---- */

/* Largest |v| over the block (v = x + error with error feedback), as bits:
 * for non-negative floats the order of the bit patterns is the order of
 * the values, an integer max vectorizes where a float one would not, and
 * a result at or above 0x7f800000 means an infinity or NaN was seen. */
CLONES static uint32_t q8_absmax_bits(const float *x, const float *err, size_t n) {
    uint32_t m = 0;
    if (err)
        for (size_t i = 0; i < n; i++) {
            uint32_t a = float_bits(x[i] + err[i]) & 0x7fffffffu;
            m = a > m ? a : m;
        }
    else
        for (size_t i = 0; i < n; i++) {
            uint32_t a = float_bits(x[i]) & 0x7fffffffu;
            m = a > m ? a : m;
        }
    return m;
}

/* q = nearest(v / scale), ties away from zero. |v| <= absmax makes |v *
 * inv| at most 127 plus a few ulps, so |q| <= 127 without a clamp. */
CLONES static void q8_quantize(const float *x, size_t n, float inv, int8_t *q) {
    for (size_t i = 0; i < n; i++) {
        float t = x[i] * inv;
        q[i] = (int8_t)(int32_t)(t + copysignf(0.5f, t));
    }
}

/* The same for v = x + err, leaving in err what the encoding lost. */
CLONES static void q8_quantize_feedback(const float *x, float *err, size_t n, float scale,
                                        float inv, int8_t *q) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i] + err[i];
        float t = v * inv;
        int32_t r = (int32_t)(t + copysignf(0.5f, t));
        q[i] = (int8_t)r;
        err[i] = v - (float)r * scale;
    }
}

CLONES static void q8_dequantize(const int8_t *q, size_t n, float scale, float *x) {
    for (size_t i = 0; i < n; i++) x[i] = (float)q[i] * scale;
}

static size_t q8_encode(const float *x, size_t n, uint8_t *out, float *err) {
    size_t o = 0;
    for (size_t s = 0; s < n; s += VISC_Q8_BLOCK) {
        size_t k = n - s < VISC_Q8_BLOCK ? n - s : VISC_Q8_BLOCK;
        uint32_t mbits = q8_absmax_bits(x + s, err ? err + s : NULL, k);
        float m = bits_float(mbits);
        int8_t *q = (int8_t *)(out + o + 4);
        float scale = 0;
        if (mbits >= 0x7f800000u) {
            /* a NaN scale makes the receiver reject the part, as it would
             * the raw non-finite value; the error state is left alone */
            scale = bits_float(0x7fc00000u);
            memset(q, 0, k);
        } else if (m < Q8_TINY) {
            memset(q, 0, k); /* scale 0; error feedback keeps what was there */
            if (err)
                for (size_t i = 0; i < k; i++) err[s + i] += x[s + i];
        } else {
            scale = m / 127.0f;
            /* absmax near FLT_MAX: 127 * scale may round up to infinity,
             * one ulp less keeps every decoded value finite (and |q| <= 127) */
            if (!isfinite(127.0f * scale)) scale = nextafterf(scale, 0);
            if (err) q8_quantize_feedback(x + s, err + s, k, scale, 1.0f / scale, q);
            else q8_quantize(x + s, k, 1.0f / scale, q);
        }
        memcpy(out + o, &scale, 4);
        o += 4 + k;
    }
    return o;
}

static int q8_decode(const uint8_t *in, size_t n, float *x) {
    size_t o = 0;
    for (size_t b = 0; b < q8_blocks(n); b++) { /* every scale checked before any write */
        size_t k = n - b * VISC_Q8_BLOCK < VISC_Q8_BLOCK ? n - b * VISC_Q8_BLOCK : VISC_Q8_BLOCK;
        float scale;
        memcpy(&scale, in + o, 4);
        if (!(scale >= 0 && scale <= FLT_MAX))
            return visc_set_error("q8 block %zu has a bad scale %g", b, (double)scale);
        if (scale > Q8_SAFE_SCALE)
            for (size_t i = 0; i < k; i++)
                if (!isfinite((float)(int8_t)in[o + 4 + i] * scale))
                    return visc_set_error("q8 block %zu: value %zu overflows (scale %g)", b,
                                          b * VISC_Q8_BLOCK + i, (double)scale);
        o += 4 + k;
    }
    o = 0;
    for (size_t s = 0; s < n; s += VISC_Q8_BLOCK) {
        size_t k = n - s < VISC_Q8_BLOCK ? n - s : VISC_Q8_BLOCK;
        float scale;
        memcpy(&scale, in + o, 4);
        q8_dequantize((const int8_t *)(in + o + 4), k, scale, x + s);
        o += 4 + k;
    }
    return 0;
}

/* ---- entry points ---- */

size_t visc_compress(visc_compression c, const float *x, size_t n, uint8_t *out, float *error) {
    uint16_t buf[CHUNK];
    switch (c) {
    case VISC_COMP_NONE: memcpy(out, x, 4 * n); return 4 * n;
    case VISC_COMP_FP16:
    case VISC_COMP_BF16:
        for (size_t s = 0; s < n; s += CHUNK) {
            size_t k = n - s < CHUNK ? n - s : CHUNK;
            if (c == VISC_COMP_FP16) fp16_encode(x + s, k, buf);
            else bf16_encode(x + s, k, buf);
            memcpy(out + 2 * s, buf, 2 * k);
        }
        return 2 * n;
    case VISC_COMP_Q8: return q8_encode(x, n, out, error);
    }
    return 0;
}

int visc_decompress(visc_compression c, const uint8_t *in, size_t bytes, float *x, size_t n) {
    if (c != VISC_COMP_NONE && c != VISC_COMP_FP16 && c != VISC_COMP_BF16 && c != VISC_COMP_Q8)
        return visc_set_error("unknown compression %d", (int)c);
    size_t want = visc_compressed_size(c, n);
    if (bytes != want)
        return visc_set_error("%s part of %zu values has %zu bytes, expected %zu",
                              visc_compression_name(c), n, bytes, want);
    uint16_t buf[CHUNK];
    switch (c) {
    case VISC_COMP_NONE:
        if (check_f32(in, n)) return -1;
        memcpy(x, in, 4 * n);
        return 0;
    case VISC_COMP_FP16:
    case VISC_COMP_BF16: {
        int fp16 = c == VISC_COMP_FP16;
        if (check_u16(in, n, fp16 ? 0x7c00u : 0x7f80u, visc_compression_name(c))) return -1;
        for (size_t s = 0; s < n; s += CHUNK) {
            size_t k = n - s < CHUNK ? n - s : CHUNK;
            memcpy(buf, in + 2 * s, 2 * k);
            if (fp16) fp16_decode(buf, k, x + s);
            else bf16_decode(buf, k, x + s);
        }
        return 0;
    }
    case VISC_COMP_Q8: return q8_decode(in, n, x);
    }
    return -1;
}

/* rng.c: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11) and the streams built on it. */
#include <math.h>

#include "visc/rng.h"

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

void visc_philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
    uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* splitmix64 finalizer: spreads (seed, stream) over the key space. */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

visc_rng visc_rng_make(uint64_t seed, uint64_t stream, uint64_t substream) {
    visc_rng r = {0};
    r.key = mix64(mix64(seed) ^ stream);
    r.stream = substream;
    return r;
}

uint32_t visc_rng_u32(visc_rng *r) {
    if (r->avail == 0) {
        visc_philox4x32(r->key, r->stream, r->counter++, r->buf);
        r->avail = 4;
    }
    return r->buf[4 - r->avail--];
}

float visc_rng_uniform(visc_rng *r) { return (float)(visc_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

/* [0, 1) with 53 random bits: 27 from the first word, 26 from the second. */
static inline double uniform53(uint32_t first, uint32_t second) {
    uint64_t hi = first >> 5, lo = second >> 6;
    return ((double)hi * 67108864.0 + (double)lo) * (1.0 / 9007199254740992.0);
}

double visc_rng_uniform_double(visc_rng *r) {
    uint32_t first = visc_rng_u32(r);
    return uniform53(first, visc_rng_u32(r));
}

static inline float box_muller(double u1, double u2) {
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

float visc_rng_normal(visc_rng *r) {
    double u1 = visc_rng_uniform_double(r);
    return box_muller(u1, visc_rng_uniform_double(r));
}

/* From a block boundary, visc_rng_normal takes exactly one Philox block per
 * value (four words: two 53-bit uniforms), so value j is a function of
 * block counter + j alone and the loop can run in parallel (ResNet-50's
 * 23.5 M convolution weights). The transformers' init (transformer_common.c)
 * is another draw, float Box-Muller on 24-bit uniforms; this one keeps the
 * ResNets' weights what they were for a seed. */
void visc_rng_normal_fill(float *out, size_t n, float scale, visc_rng *r) {
    if (r->avail != 0) { /* mid-block: the words left first, one by one */
        for (size_t j = 0; j < n; j++) out[j] = scale * visc_rng_normal(r);
        return;
    }
    const uint64_t key = r->key, stream = r->stream, base = r->counter;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t j = 0; j < n; j++) {
        uint32_t u[4];
        visc_philox4x32(key, stream, base + j, u);
        out[j] = scale * box_muller(uniform53(u[0], u[1]), uniform53(u[2], u[3]));
    }
    r->counter = base + n;
}

uint32_t visc_rng_below(visc_rng *r, uint32_t n) {
    /* Lemire's multiply-shift with rejection: exact uniformity. */
    uint64_t m = (uint64_t)visc_rng_u32(r) * n;
    uint32_t low = (uint32_t)m;
    if (low < n) {
        uint32_t threshold = (uint32_t)(-n) % n;
        while (low < threshold) {
            m = (uint64_t)visc_rng_u32(r) * n;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

void visc_rng_permutation(int32_t *perm, int32_t n, uint64_t seed, uint64_t stream,
                          uint64_t substream) {
    visc_rng r = visc_rng_make(seed, stream, substream);
    for (int32_t i = 0; i < n; i++) perm[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)visc_rng_below(&r, (uint32_t)i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

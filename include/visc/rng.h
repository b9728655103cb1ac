/* rng.h: counter-based random numbers (Philox4x32-10).
 *
 * Every random draw of a run is a pure function of (seed, stream, counter),
 * so a run is fixed by its seed and a resumed run draws exactly what the
 * uninterrupted one would have: the data order of epoch e is stream
 * (VISC_STREAM_SHUFFLE, e), the augmentation of sample i in epoch e is
 * stream (VISC_STREAM_AUGMENT + 16 e, i), and so on. No hidden state to save. */
#ifndef VISC_RNG_H
#define VISC_RNG_H

#include <stdint.h>
#include <stddef.h>

enum {
    VISC_STREAM_INIT = 1,    /* parameter initialization */
    VISC_STREAM_SHUFFLE = 2, /* per-epoch permutation */
    VISC_STREAM_AUGMENT = 3, /* per-sample augmentation */
    VISC_STREAM_DROPOUT = 4, /* dropout / drop-path masks */
    VISC_STREAM_MIXUP = 5,   /* per-step mixup / cutmix draws */
    VISC_STREAM_SSL = 6,     /* self-supervised: bank init, heads, batch shuffles */
};

/* One Philox4x32-10 block: 128 random bits for (key, counter). */
void visc_philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]);

/* A sequential stream over the counter space of (seed, stream). */
typedef struct {
    uint64_t key;     /* derived from seed and stream */
    uint64_t stream;  /* upper counter word */
    uint64_t counter; /* next block */
    uint32_t buf[4];
    int avail; /* unread words left in buf */
} visc_rng;

visc_rng visc_rng_make(uint64_t seed, uint64_t stream, uint64_t substream);
uint32_t visc_rng_u32(visc_rng *r);
float visc_rng_uniform(visc_rng *r);         /* [0, 1) with 24 random bits */
double visc_rng_uniform_double(visc_rng *r); /* [0, 1) with 53 random bits */
float visc_rng_normal(visc_rng *r);          /* standard normal (Box-Muller) */
/* out[j] = scale * visc_rng_normal(r) for j = 0..n-1, bit for bit and
 * leaving r where those n calls would; in parallel from a block boundary. */
void visc_rng_normal_fill(float *out, size_t n, float scale, visc_rng *r);
uint32_t visc_rng_below(visc_rng *r, uint32_t n); /* uniform in [0, n), unbiased */

/* Fisher-Yates permutation of 0..n-1 drawn from (seed, stream, substream). */
void visc_rng_permutation(int32_t *perm, int32_t n, uint64_t seed, uint64_t stream,
                          uint64_t substream);

#endif

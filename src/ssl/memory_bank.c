/* memory_bank.c: MoCo's queue of negative keys.
 *
 * The bank a step uses is the one before its own keys go in: the caller
 * computes the loss against mb->bank first and enqueues afterwards, so a
 * key is never its own negative. Rows are unit vectors from the start
 * (normal draws, normalized), as the reference library initializes them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "visc/rng.h"
#include "visc/ssl.h"

void visc_memory_bank_init(visc_memory_bank *mb, int64_t size, int dim, uint64_t seed) {
    VISC_ASSERT(size > 0 && dim > 0);
    mb->size = size;
    mb->dim = dim;
    mb->ptr = 0;
    mb->bank = visc_alloc_aligned((size_t)size * dim * sizeof(float), "memory bank");
#pragma omp parallel for schedule(static) if ((size_t)size * dim > 65536)
    for (int64_t i = 0; i < size; i++) {
        /* one stream per row: the bank is the same for any thread count */
        visc_rng r = visc_rng_make(seed, VISC_STREAM_SSL, (1ull << 40) + (uint64_t)i);
        float *row = mb->bank + (size_t)i * dim;
        double norm = 0;
        for (int j = 0; j < dim; j++) {
            row[j] = visc_rng_normal(&r);
            norm += (double)row[j] * row[j];
        }
        float inv = (float)(1.0 / fmax(sqrt(norm), 1e-12));
        for (int j = 0; j < dim; j++) row[j] *= inv;
    }
}

void visc_memory_bank_enqueue(visc_memory_bank *mb, const float *keys, int64_t n) {
    const size_t row = (size_t)mb->dim * sizeof(float);
    if (n > mb->size) { /* only the last K keys can stay */
        keys += (size_t)(n - mb->size) * mb->dim;
        mb->ptr = (mb->ptr + (n - mb->size)) % mb->size;
        n = mb->size;
    }
    int64_t first = mb->size - mb->ptr < n ? mb->size - mb->ptr : n;
    memcpy(mb->bank + (size_t)mb->ptr * mb->dim, keys, (size_t)first * row);
    if (n > first) memcpy(mb->bank, keys + (size_t)first * mb->dim, (size_t)(n - first) * row);
    mb->ptr = (mb->ptr + n) % mb->size;
}

int visc_memory_bank_enqueue_gathered(visc_memory_bank *mb, visc_dist *d, const float *keys,
                                      int64_t n, float *gathered) {
    int world = visc_dist_world(d);
    if (world == 1) {
        visc_memory_bank_enqueue(mb, keys, n);
        return 0;
    }
    if (visc_dist_allgather(d, keys, gathered, (size_t)n * mb->dim * sizeof(float))) return -1;
    visc_memory_bank_enqueue(mb, gathered, n * world);
    return 0;
}

void visc_memory_bank_free(visc_memory_bank *mb) {
    visc_free_aligned(mb->bank);
    mb->bank = NULL;
}

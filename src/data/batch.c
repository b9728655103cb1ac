/* batch.c: the sample order of an epoch and the assembly of one batch.
 *
 * The order of epoch e is a Fisher-Yates shuffle driven by the Philox
 * stream visc_rng_make(seed, VISC_STREAM_SHUFFLE, e), so a resumed run
 * replays it without saved state. Batches are filled one sample per
 * OpenMP iteration; each sample's augmentation depends only on (seed,
 * epoch, sample index) and is written to its own slot, so the batch is
 * bit-identical whatever the thread count. */
#include <stdio.h>
#include <string.h>

#include "visc/core.h"
#include "visc/data.h"
#include "visc/rng.h"

/* Uniform in [0, n) for n up to 2^64 - 1; visc_rng_below covers 32 bits,
 * which is every realistic data set, and keeps the draws the same there. */
static uint64_t below64(visc_rng *r, uint64_t n) {
    if (n <= UINT32_MAX) return visc_rng_below(r, (uint32_t)n);
    /* Rejection on 64-bit words: accept x < the largest multiple of n. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    for (;;) {
        uint64_t x = (uint64_t)visc_rng_u32(r) << 32 | visc_rng_u32(r);
        if (x < limit) return x % n;
    }
}

void visc_epoch_order(int64_t *order, int64_t n, int shuffle, uint64_t seed, int64_t epoch) {
    for (int64_t i = 0; i < n; i++) order[i] = i;
    if (!shuffle) return;
    visc_rng r = visc_rng_make(seed, VISC_STREAM_SHUFFLE, (uint64_t)epoch);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)below64(&r, (uint64_t)i + 1);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

int visc_make_batch(const visc_dataset *ds, const int64_t *order, int B, const visc_augment *aug,
                    int train, uint64_t seed, int64_t epoch, float *x, int32_t *y) {
    size_t sample = (size_t)ds->channels * ds->height * ds->width;
    /* Errors are thread-local: the failing sample with the lowest batch
     * position wins, so the reported error does not depend on scheduling. */
    int first_bad = B;
    char msg[512] = "";
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        if (ds->get(ds, order[b], aug, train, seed, epoch, x + (size_t)b * sample, &y[b])) {
#pragma omp critical(visc_make_batch_error)
            if (b < first_bad) {
                first_bad = b;
                snprintf(msg, sizeof msg, "%s", visc_last_error());
            }
        }
    }
    if (first_bad < B) return visc_set_error("batch position %d: %s", first_bad, msg);
    return 0;
}

/* subset.c: which samples a per-class subset (--subset N) keeps.
 *
 * One rule for every kind of data set (image folders, packs' file lists,
 * in-memory IDX and CIFAR arrays), so that --subset means the same thing
 * on each: per class, N of its samples drawn without replacement from the
 * Philox stream (seed, VISC_STREAM_SHUFFLE, 2^62 + class), or its first N
 * unseeded; the kept samples stay in their original order. */
#include <stdlib.h>

#include "visc/core.h"
#include "visc/data.h"
#include "visc/rng.h"

int64_t visc_subset_per_class(const int32_t *labels, int64_t count, int num_classes, int64_t n,
                              int seeded, uint64_t seed, int64_t *kept) {
    int64_t *seen = visc_calloc((size_t)num_classes, sizeof *seen, "subset counts");
    int64_t *total = visc_calloc((size_t)num_classes, sizeof *total, "subset counts");
    for (int64_t i = 0; i < count; i++) total[labels[i]]++;
    /* keep[c] marks, per class, which of its samples (by rank in the class) stay */
    uint8_t **keep = visc_calloc((size_t)num_classes, sizeof *keep, "subset marks");
    for (int c = 0; c < num_classes; c++) {
        keep[c] = visc_calloc((size_t)total[c] + 1, 1, "subset marks");
        int64_t m = total[c] < n ? total[c] : n;
        if (!seeded || total[c] <= n || total[c] > INT32_MAX) {
            for (int64_t j = 0; j < m; j++) keep[c][j] = 1;
        } else {
            int32_t *perm = visc_malloc((size_t)total[c] * sizeof *perm, "subset permutation");
            visc_rng_permutation(perm, (int32_t)total[c], seed, VISC_STREAM_SHUFFLE,
                                 ((uint64_t)1 << 62) + (uint64_t)c);
            for (int64_t j = 0; j < m; j++) keep[c][perm[j]] = 1;
            free(perm);
        }
    }
    int64_t out = 0;
    for (int64_t i = 0; i < count; i++)
        if (keep[labels[i]][seen[labels[i]]++]) kept[out++] = i;
    for (int c = 0; c < num_classes; c++) free(keep[c]);
    free(keep);
    free(seen);
    free(total);
    return out;
}

/* dataset_memory.c: a dataset held in memory as uint8 CHW images.
 *
 * The backing store of IDX and CIFAR: one contiguous [n, c, h, w] byte
 * array and int32 labels. get() only reads them and writes the caller's
 * buffers, so any number of threads may call it at once, and it allocates
 * nothing. */
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/data.h"

typedef struct {
    uint8_t *images;
    int32_t *labels;
    size_t sample_bytes; /* c * h * w */
    int h, w;            /* stored image size; ds->height/width may be padded (pad_to) */
    int pad_to;
} memory_impl;

static int memory_get(const visc_dataset *ds, int64_t idx, const visc_augment *aug, int train,
                      uint64_t seed, int64_t epoch, float *out, int32_t *label) {
    const memory_impl *m = ds->impl;
    if (idx < 0 || idx >= ds->size)
        return visc_set_error("sample index %lld out of range 0..%lld", (long long)idx,
                              (long long)ds->size - 1);
    visc_augment padded;
    if (m->pad_to) {
        padded = aug ? *aug : (visc_augment){0, 0, {0, 0, 0}, {1, 1, 1}, 0};
        padded.pad_to = m->pad_to;
        aug = &padded;
    }
    visc_augment_apply(aug, m->images + (size_t)idx * m->sample_bytes, ds->channels, m->h, m->w,
                       train, seed, epoch, idx, out);
    *label = m->labels[idx];
    return 0;
}

static void memory_destroy(visc_dataset *ds) {
    memory_impl *m = ds->impl;
    free(m->images);
    free(m->labels);
    free(m);
}

visc_dataset *visc_dataset_from_memory(uint8_t *images, int32_t *labels, int64_t n, int c, int h,
                                       int w, int num_classes) {
    VISC_ASSERT(images && labels && n > 0 && c > 0 && h > 0 && w > 0 && num_classes > 0);
    memory_impl *m = visc_malloc(sizeof *m, "in-memory dataset");
    m->images = images;
    m->labels = labels;
    m->sample_bytes = (size_t)c * h * w;
    m->h = h;
    m->w = w;
    m->pad_to = 0;
    visc_dataset *ds = visc_calloc(1, sizeof *ds, "dataset");
    ds->size = n;
    ds->channels = c;
    ds->height = h;
    ds->width = w;
    ds->num_classes = num_classes;
    ds->get = memory_get;
    ds->destroy = memory_destroy;
    ds->impl = m;
    return ds;
}

int visc_dataset_pad_to(visc_dataset *ds, int size) {
    if (ds->get != memory_get)
        return visc_set_error("padding to %d px is only for in-memory datasets", size);
    memory_impl *m = ds->impl;
    if (size < m->h || size < m->w)
        return visc_set_error("cannot pad %dx%d images to %d px (smaller)", m->h, m->w, size);
    m->pad_to = size;
    ds->height = ds->width = size;
    return 0;
}

int visc_dataset_keep_per_class(visc_dataset *ds, int64_t n, uint64_t seed) {
    if (ds->get != memory_get)
        return visc_set_error("keeping %lld samples per class is only for in-memory datasets",
                              (long long)n);
    if (n <= 0) return visc_set_error("--subset %lld: expected a positive count", (long long)n);
    memory_impl *m = ds->impl;
    int64_t *kept = visc_malloc((size_t)ds->size * sizeof *kept, "subset indices");
    int64_t out = visc_subset_per_class(m->labels, ds->size, ds->num_classes, n, 1, seed, kept);
    /* compacted in place: kept[i] >= i, so no sample is overwritten before it moves */
    for (int64_t i = 0; i < out; i++) {
        if (kept[i] != i)
            memmove(m->images + (size_t)i * m->sample_bytes,
                    m->images + (size_t)kept[i] * m->sample_bytes, m->sample_bytes);
        m->labels[i] = m->labels[kept[i]];
    }
    ds->size = out;
    free(kept);
    return 0;
}

void visc_dataset_free(visc_dataset *ds) {
    if (!ds) return;
    if (ds->destroy) ds->destroy(ds);
    free(ds);
}

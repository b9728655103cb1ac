/* cifar_bin.c: the CIFAR-10 binary format.
 *
 * A batch file is a bare sequence of 3073-byte records: one label byte
 * (0..9), then the 32x32 red plane, green plane and blue plane, each
 * row-major. That is already CHW, so a record's image is copied as is.
 * There is no header, so the size and the labels are all there is to
 * check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/data.h"

#define CIFAR_SIDE 32
#define CIFAR_IMAGE (3 * CIFAR_SIDE * CIFAR_SIDE)
#define CIFAR_RECORD (1 + CIFAR_IMAGE)
#define CIFAR_CLASSES 10
/* Per-file cap: a CIFAR-10 batch is 30 MB; this allows merged files. */
#define CIFAR_MAX_BYTES ((size_t)1 << 31)

int visc_cifar_bin_parse(const uint8_t *buf, size_t size, uint8_t **images, int32_t **labels,
                         int64_t *n) {
    *images = NULL;
    *labels = NULL;
    if (size == 0) return visc_set_error("empty: no CIFAR records");
    if (size % CIFAR_RECORD)
        return visc_set_error("%zu bytes is not a whole number of %d-byte CIFAR-10 records "
                              "(label + 3x32x32); %zu bytes left over",
                              size, CIFAR_RECORD, size % CIFAR_RECORD);
    size_t count = size / CIFAR_RECORD;
    /* Labels first, so a bad file costs no image copy. */
    for (size_t i = 0; i < count; i++) {
        uint8_t label = buf[i * CIFAR_RECORD];
        if (label >= CIFAR_CLASSES)
            return visc_set_error("record %zu: label %u out of range 0..%d (not CIFAR-10?)", i,
                                  label, CIFAR_CLASSES - 1);
    }
    uint8_t *img = visc_malloc(count * CIFAR_IMAGE, "CIFAR images");
    int32_t *lab = visc_malloc(count * sizeof *lab, "CIFAR labels");
    for (size_t i = 0; i < count; i++) {
        lab[i] = buf[i * CIFAR_RECORD];
        memcpy(img + i * CIFAR_IMAGE, buf + i * CIFAR_RECORD + 1, CIFAR_IMAGE);
    }
    *images = img;
    *labels = lab;
    *n = (int64_t)count;
    return 0;
}

visc_dataset *visc_cifar_bin_load(const char *const *paths, int npaths) {
    if (npaths <= 0) {
        visc_set_error("CIFAR-10: no batch files given");
        return NULL;
    }
    uint8_t *images = NULL;
    int32_t *labels = NULL;
    int64_t total = 0;
    for (int f = 0; f < npaths; f++) {
        uint8_t *raw, *img;
        int32_t *lab;
        size_t size;
        int64_t n;
        if (visc_read_maybe_gzip(paths[f], &raw, &size, CIFAR_MAX_BYTES)) goto fail;
        int rc = visc_cifar_bin_parse(raw, size, &img, &lab, &n);
        free(raw);
        if (rc) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", visc_last_error());
            visc_set_error("%s: %s", paths[f], msg);
            goto fail;
        }
        if (f == 0) {
            images = img;
            labels = lab;
        } else {
            images = visc_realloc(images, (size_t)(total + n) * CIFAR_IMAGE, "CIFAR images");
            labels = visc_realloc(labels, (size_t)(total + n) * sizeof *labels, "CIFAR labels");
            memcpy(images + (size_t)total * CIFAR_IMAGE, img, (size_t)n * CIFAR_IMAGE);
            memcpy(labels + total, lab, (size_t)n * sizeof *labels);
            free(img);
            free(lab);
        }
        total += n;
    }
    return visc_dataset_from_memory(images, labels, total, 3, CIFAR_SIDE, CIFAR_SIDE,
                                    CIFAR_CLASSES);
fail:
    free(images);
    free(labels);
    return NULL;
}

/* idx.c: the IDX format of MNIST and Fashion-MNIST.
 *
 * An IDX file is a big-endian header (magic 0x0000 08 <ndims>, then one
 * uint32 per dimension) followed by the uint8 data, row-major. Images are
 * 3-dimensional [n, h, w], labels 1-dimensional [n]. Every size is checked
 * against the bytes actually present before anything is allocated, so a
 * lying header is an error message, never a huge malloc or a read past the
 * end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/data.h"

#define IDX_MAGIC_U8_1D 0x00000801u
#define IDX_MAGIC_U8_3D 0x00000803u
/* Largest side accepted: far beyond any IDX data set, small enough that
 * h * w and the per-sample float buffers of callers stay in int range. */
#define IDX_MAX_SIDE 16384
/* Decompressed size cap for a whole file (EMNIST "by class" is ~0.55 GB). */
#define IDX_MAX_BYTES ((size_t)4 << 30)

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int check_magic(const uint8_t *buf, size_t size, uint32_t want, const char *what) {
    if (size < 4) return visc_set_error("truncated: %zu bytes, too short for an IDX header", size);
    uint32_t magic = be32(buf);
    if (magic == want) return 0;
    if ((magic >> 16) == 0 && (magic >> 8 & 0xff) == 0x08)
        return visc_set_error("bad IDX magic 0x%08x: %u dimensions, %s need %u", magic,
                              magic & 0xff, what, want & 0xff);
    if ((magic >> 16) == 0)
        return visc_set_error("bad IDX magic 0x%08x: element type 0x%02x, only unsigned bytes "
                              "(0x08) are supported",
                              magic, magic >> 8 & 0xff);
    return visc_set_error("bad IDX magic 0x%08x (expected 0x%08x for %s): not an IDX file", magic,
                          want, what);
}

int visc_idx_parse_images(const uint8_t *buf, size_t size, uint8_t **images, int64_t *n, int *h,
                          int *w) {
    *images = NULL;
    if (check_magic(buf, size, IDX_MAGIC_U8_3D, "images")) return -1;
    if (size < 16)
        return visc_set_error("truncated: %zu bytes, too short for the 16-byte IDX image header",
                              size);
    uint32_t count = be32(buf + 4), rows = be32(buf + 8), cols = be32(buf + 12);
    if (count == 0) return visc_set_error("header says 0 images");
    if (rows == 0 || cols == 0 || rows > IDX_MAX_SIDE || cols > IDX_MAX_SIDE)
        return visc_set_error("bad image size %ux%u in header (each side must be 1..%d)", rows,
                              cols, IDX_MAX_SIDE);
    /* count < 2^32 and rows * cols <= 2^28: the product fits in 64 bits. */
    uint64_t need = (uint64_t)count * rows * cols;
    size_t have = size - 16;
    if (need > have)
        return visc_set_error("truncated: header says %u images of %ux%u, file has %zu bytes "
                              "(needs %llu)",
                              count, rows, cols, size, (unsigned long long)need + 16);
    if (need < have)
        return visc_set_error("%zu bytes of trailing data after %u images of %ux%u",
                              have - (size_t)need, count, rows, cols);
    *images = visc_malloc((size_t)need, "IDX images");
    memcpy(*images, buf + 16, (size_t)need);
    *n = count;
    *h = (int)rows;
    *w = (int)cols;
    return 0;
}

int visc_idx_parse_labels(const uint8_t *buf, size_t size, int32_t **labels, int64_t *n) {
    *labels = NULL;
    if (check_magic(buf, size, IDX_MAGIC_U8_1D, "labels")) return -1;
    if (size < 8)
        return visc_set_error("truncated: %zu bytes, too short for the 8-byte IDX label header",
                              size);
    uint32_t count = be32(buf + 4);
    if (count == 0) return visc_set_error("header says 0 labels");
    size_t have = size - 8;
    if (count > have)
        return visc_set_error("truncated: header says %u labels, file has %zu bytes (needs %llu)",
                              count, size, (unsigned long long)count + 8);
    if (count < have)
        return visc_set_error("%zu bytes of trailing data after %u labels", have - count, count);
    int32_t *l = visc_malloc((size_t)count * sizeof *l, "IDX labels");
    for (uint32_t i = 0; i < count; i++) l[i] = buf[8 + i];
    *labels = l;
    *n = count;
    return 0;
}

/* Re-issues the current error with the file name in front. */
static int with_path(const char *path) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", visc_last_error());
    return visc_set_error("%s: %s", path, msg);
}

visc_dataset *visc_idx_load(const char *images_path, const char *labels_path) {
    uint8_t *raw = NULL, *images = NULL;
    int32_t *labels = NULL;
    size_t size;
    int64_t n_img, n_lab;
    int h, w;

    if (visc_read_maybe_gzip(images_path, &raw, &size, IDX_MAX_BYTES)) return NULL;
    int rc = visc_idx_parse_images(raw, size, &images, &n_img, &h, &w);
    free(raw);
    if (rc) {
        with_path(images_path);
        return NULL;
    }

    if (visc_read_maybe_gzip(labels_path, &raw, &size, IDX_MAX_BYTES)) goto fail;
    rc = visc_idx_parse_labels(raw, size, &labels, &n_lab);
    free(raw);
    if (rc) {
        with_path(labels_path);
        goto fail;
    }
    if (n_img != n_lab) {
        visc_set_error("%s has %lld images but %s has %lld labels", images_path, (long long)n_img,
                       labels_path, (long long)n_lab);
        goto fail;
    }
    /* Classes are 0..max: the files carry no class count, and MNIST-likes
     * use every class in both splits. */
    int32_t max_label = 0;
    for (int64_t i = 0; i < n_lab; i++)
        if (labels[i] > max_label) max_label = labels[i];
    return visc_dataset_from_memory(images, labels, n_img, 1, h, w, max_label + 1);

fail:
    free(images);
    free(labels);
    return NULL;
}

/* image_dataset.c: a visc_dataset over image files or a pack.
 *
 * get() hands the encoded bytes of sample idx to the per-sample pipeline
 * (decode + augment, transforms.h) and returns its label. A plain file is
 * mmap'ed for the call: no heap buffer per sample and no copy, and many
 * threads can read at once. A packed sample is a slice of an already
 * mapped shard, checked against its crc first.
 *
 * A file that cannot be used is a bad sample (VISC_SAMPLE_BAD), with the
 * file name in the message, so the loader can skip and report it: missing
 * since the scan, empty, unreadable, corrupt, or refused by the decoder. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "visc/core.h"
#include "visc/loader.h"
#include "visc/transforms.h"

typedef struct {
    int packed;
    visc_file_list files; /* packed = 0 */
    visc_pack pack;       /* packed = 1 */
    visc_sample_pipeline pl;
} image_impl;

/* Adds the file name to a pipeline failure; keeps the status. */
static int with_name(int rc, const char *name) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", visc_last_error());
    visc_set_error("%s: %s", name, msg);
    return rc;
}

/* Where get() and get_bytes() write: one of the two is set. */
typedef struct {
    float *f;
    uint8_t *b;
} sample_out;

static int run_pipeline(const image_impl *m, const char *name, const uint8_t *bytes, size_t size,
                        int rw, int rh, int64_t idx, int train, uint64_t seed, int64_t epoch,
                        sample_out out) {
    int rc = out.b ? m->pl.fn_bytes(m->pl.ctx, bytes, size, rw, rh, train, seed, epoch, idx, out.b)
                   : m->pl.fn(m->pl.ctx, bytes, size, rw, rh, train, seed, epoch, idx, out.f);
    if (rc != 0) return with_name(rc == VISC_SAMPLE_BAD ? VISC_SAMPLE_BAD : -1, name);
    return 0;
}

static int files_get(const image_impl *m, int64_t idx, int train, uint64_t seed, int64_t epoch,
                     sample_out out) {
    char path[4096];
    if (visc_file_list_path(&m->files, idx, path, sizeof path)) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        visc_set_error("%s: cannot open: %s", path, strerror(errno));
        return VISC_SAMPLE_BAD;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        visc_set_error("%s: not a readable file", path);
        return VISC_SAMPLE_BAD;
    }
    if (st.st_size == 0) {
        close(fd);
        visc_set_error("%s: empty file", path);
        return VISC_SAMPLE_BAD;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        visc_set_error("%s: cannot map: %s", path, strerror(errno));
        return VISC_SAMPLE_BAD;
    }
    int rc = run_pipeline(m, path, map, (size_t)st.st_size, 0, 0, idx, train, seed, epoch, out);
    munmap(map, (size_t)st.st_size);
    return rc;
}

static int pack_get(const visc_dataset *ds, const image_impl *m, int64_t idx, int train,
                    uint64_t seed, int64_t epoch, sample_out out) {
    const uint8_t *bytes;
    size_t size;
    if (visc_pack_bytes(&m->pack, idx, &bytes, &size))
        return with_name(VISC_SAMPLE_BAD, m->pack.dir);
    const visc_pack_record *r = &m->pack.records[idx];
    int rw = m->pack.raw ? (int)r->width : 0, rh = m->pack.raw ? (int)r->height : 0;
    return run_pipeline(m, visc_image_dataset_name(ds, idx), bytes, size, rw, rh, idx, train, seed,
                        epoch, out);
}

static int get_into(const visc_dataset *ds, int64_t idx, int train, uint64_t seed, int64_t epoch,
                    sample_out out, int32_t *label) {
    const image_impl *m = ds->impl;
    if (idx < 0 || idx >= ds->size)
        return visc_set_error("sample index %lld out of range 0..%lld", (long long)idx,
                              (long long)ds->size - 1);
    int rc = m->packed ? pack_get(ds, m, idx, train, seed, epoch, out)
                       : files_get(m, idx, train, seed, epoch, out);
    if (rc == 0) *label = m->packed ? m->pack.records[idx].label : m->files.labels[idx];
    return rc;
}

static int image_get(const visc_dataset *ds, int64_t idx, const visc_augment *aug, int train,
                     uint64_t seed, int64_t epoch, float *out, int32_t *label) {
    (void)aug; /* the pipeline owns augmentation */
    return get_into(ds, idx, train, seed, epoch, (sample_out){out, NULL}, label);
}

static int image_get_bytes(const visc_dataset *ds, int64_t idx, int train, uint64_t seed,
                           int64_t epoch, uint8_t *out, int32_t *label) {
    return get_into(ds, idx, train, seed, epoch, (sample_out){NULL, out}, label);
}

static void image_destroy(visc_dataset *ds) {
    image_impl *m = ds->impl;
    if (m->packed) visc_pack_close(&m->pack);
    else visc_file_list_free(&m->files);
    free(m);
}

static visc_dataset *make(image_impl *m, int64_t n, int num_classes) {
    visc_dataset *ds = visc_calloc(1, sizeof *ds, "dataset");
    ds->size = n;
    ds->channels = m->pl.channels;
    ds->height = m->pl.height;
    ds->width = m->pl.width;
    ds->views = m->pl.views;
    ds->num_classes = num_classes;
    ds->get = image_get;
    ds->get_bytes = m->pl.fn_bytes ? image_get_bytes : NULL;
    for (int c = 0; c < 3; c++) ds->byte_mean[c] = m->pl.mean[c], ds->byte_std[c] = m->pl.std[c];
    ds->destroy = image_destroy;
    ds->impl = m;
    return ds;
}

visc_dataset *visc_image_dataset_from_files(visc_file_list *fl, const visc_sample_pipeline *pl) {
    image_impl *m = visc_calloc(1, sizeof *m, "image dataset");
    m->files = *fl;
    memset(fl, 0, sizeof *fl);
    m->pl = *pl;
    return make(m, m->files.count, m->files.num_classes);
}

visc_dataset *visc_image_dataset_from_pack(visc_pack *p, const visc_sample_pipeline *pl) {
    image_impl *m = visc_calloc(1, sizeof *m, "image dataset");
    m->packed = 1;
    m->pack = *p;
    memset(p, 0, sizeof *p);
    m->pl = *pl;
    return make(m, m->pack.count, m->pack.num_classes);
}

visc_dataset *visc_image_dataset_open(const char *spec, int train, const visc_sample_pipeline *pl) {
    const char *dir = NULL;
    char probe[4096];
    struct stat st;
    if (strncmp(spec, "pack:", 5) == 0) dir = spec + 5;
    else if (snprintf(probe, sizeof probe, "%s/index.bin", spec) < (int)sizeof probe &&
             stat(probe, &st) == 0)
        dir = spec;
    if (dir) {
        visc_pack p;
        if (visc_pack_open(&p, dir)) return NULL;
        return visc_image_dataset_from_pack(&p, pl);
    }
    visc_file_list fl;
    if (visc_file_list_open(&fl, spec, train)) return NULL;
    return visc_image_dataset_from_files(&fl, pl);
}

const char *visc_image_dataset_name(const visc_dataset *ds, int64_t idx) {
    const image_impl *m = ds->impl;
    if (idx < 0 || idx >= ds->size) return "?";
    if (m->packed) return m->pack.names + m->pack.records[idx].name_off;
    return visc_file_list_name(&m->files, idx);
}

/* ---- the transforms.h pipeline as a sample function ---- */

/* visc_transform_sample cannot tell a bad image from a bad recipe; the
 * recipe was validated when the pipeline was made, so a failure here is
 * the image's. A raw pack sample is wrapped as an image without a copy. */
static int transform_into(const visc_transform_config *cfg, const uint8_t *bytes, size_t size,
                          int raw_width, int raw_height, uint64_t seed, int64_t epoch, int64_t idx,
                          float *f, uint8_t *b) {
    int rc;
    if (raw_width > 0) {
        visc_image img = {.data = (uint8_t *)bytes,
                          .width = raw_width,
                          .height = raw_height,
                          .stride = 3 * raw_width};
        rc = b ? visc_transform_image_bytes(cfg, &img, seed, epoch, idx, b)
               : visc_transform_image(cfg, &img, seed, epoch, idx, f);
    } else {
        rc = b ? visc_transform_sample_bytes(cfg, bytes, size, seed, epoch, idx, b)
               : visc_transform_sample(cfg, bytes, size, seed, epoch, idx, f);
    }
    return rc == 0 ? 0 : VISC_SAMPLE_BAD;
}

static int transform_fn(void *ctx, const uint8_t *bytes, size_t size, int raw_width, int raw_height,
                        int train, uint64_t seed, int64_t epoch, int64_t idx, float *out) {
    (void)train; /* the recipe says */
    return transform_into(ctx, bytes, size, raw_width, raw_height, seed, epoch, idx, out, NULL);
}

static int transform_bytes_fn(void *ctx, const uint8_t *bytes, size_t size, int raw_width,
                              int raw_height, int train, uint64_t seed, int64_t epoch, int64_t idx,
                              uint8_t *out) {
    (void)train;
    return transform_into(ctx, bytes, size, raw_width, raw_height, seed, epoch, idx, NULL, out);
}

int visc_transform_pipeline(const visc_transform_config *cfg, visc_sample_pipeline *pl) {
    if (visc_transform_validate(cfg)) return -1;
    pl->fn = transform_fn;
    pl->fn_bytes = cfg->reprob > 0 ? NULL : transform_bytes_fn;
    pl->ctx = (void *)cfg;
    pl->channels = 3;
    pl->height = pl->width = cfg->size;
    pl->views = cfg->views > 1 ? cfg->views : 1;
    for (int c = 0; c < 3; c++) pl->mean[c] = cfg->mean[c], pl->std[c] = cfg->std[c];
    return 0;
}

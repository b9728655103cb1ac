/* test_data.c: IDX / CIFAR parsing, gzip, augmentation, epoch order and
 * batch assembly. Buffers are built here; Fashion-MNIST is read from its
 * installed location (the CI image installs it). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "test.h"
#include "visc/core.h"
#include "visc/data.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

/* ---- helpers ---- */

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* IDX images [n, h, w] with pixel (i, y, x) = (i * 31 + y * 7 + x) & 255. */
static uint8_t *make_idx_images(uint32_t n, uint32_t h, uint32_t w, size_t *size) {
    *size = 16 + (size_t)n * h * w;
    uint8_t *b = malloc(*size);
    put_be32(b, 0x00000803);
    put_be32(b + 4, n);
    put_be32(b + 8, h);
    put_be32(b + 12, w);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t y = 0; y < h; y++)
            for (uint32_t x = 0; x < w; x++)
                b[16 + ((size_t)i * h + y) * w + x] = (uint8_t)((i * 31 + y * 7 + x) & 255);
    return b;
}

static uint8_t *make_idx_labels(uint32_t n, size_t *size) {
    *size = 8 + n;
    uint8_t *b = malloc(*size);
    put_be32(b, 0x00000801);
    put_be32(b + 4, n);
    for (uint32_t i = 0; i < n; i++) b[8 + i] = (uint8_t)(i % 10);
    return b;
}

static uint8_t *make_cifar(uint32_t n, size_t *size) {
    *size = (size_t)n * 3073;
    uint8_t *b = malloc(*size);
    for (uint32_t i = 0; i < n; i++) {
        b[i * 3073] = (uint8_t)((i * 3) % 10);
        for (int k = 0; k < 3072; k++) b[i * 3073 + 1 + k] = (uint8_t)((k * 13 + i) & 255);
    }
    return b;
}

static uint8_t *gzip_buf(const uint8_t *src, size_t n, size_t *out_size) {
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
    size_t cap = deflateBound(&zs, (uLong)n) + 64;
    uint8_t *out = malloc(cap);
    zs.next_in = (Bytef *)src;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    if (deflate(&zs, Z_FINISH) != Z_STREAM_END) abort();
    *out_size = zs.total_out;
    deflateEnd(&zs);
    return out;
}

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char path[8][512];
    static int k;
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/visc_test_data_XXXXXX");
        if (!mkdtemp(tmpdir)) abort();
    }
    char *p = path[k++ & 7];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

/* Files written here, removed with the directory when the binary exits. */
static char written[32][512];
static int num_written;

__attribute__((destructor)) static void remove_tmp_files(void) {
    for (int i = 0; i < num_written; i++) unlink(written[i]);
    if (tmpdir[0]) rmdir(tmpdir);
}

static void write_file(const char *path, const void *buf, size_t n) {
    int known = 0;
    for (int i = 0; i < num_written; i++) known |= strcmp(written[i], path) == 0;
    if (!known && num_written < 32) snprintf(written[num_written++], 512, "%s", path);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n) abort();
    fclose(f);
}

static int contains(const char *s, const char *part) { return strstr(s, part) != NULL; }

#define CHECK_ERR(expr, part)                                                                      \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        CHECK_MSG(rc_ == -1, "%s returned %d, expected -1", #expr, rc_);                           \
        CHECK_MSG(contains(visc_last_error(), part), "%s: error \"%s\" lacks \"%s\"", #expr,       \
                  visc_last_error(), part);                                                        \
    } while (0)

/* ---- IDX ---- */

TEST(idx_parse_valid) {
    size_t si, sl;
    uint8_t *bi = make_idx_images(3, 4, 5, &si), *bl = make_idx_labels(3, &sl);
    uint8_t *img;
    int32_t *lab;
    int64_t n, nl;
    int h, w;
    CHECK(visc_idx_parse_images(bi, si, &img, &n, &h, &w) == 0);
    CHECK(n == 3 && h == 4 && w == 5);
    CHECK(memcmp(img, bi + 16, 60) == 0);
    CHECK(visc_idx_parse_labels(bl, sl, &lab, &nl) == 0);
    CHECK(nl == 3 && lab[0] == 0 && lab[1] == 1 && lab[2] == 2);
    free(img);
    free(lab);
    free(bi);
    free(bl);
}

TEST(idx_parse_malformed) {
    size_t si, sl;
    uint8_t *bi = make_idx_images(3, 4, 5, &si), *bl = make_idx_labels(3, &sl);
    uint8_t *img = (uint8_t *)1;
    int32_t *lab;
    int64_t n;
    int h, w;

    /* Labels given as images and vice versa; foreign data; wrong type. */
    CHECK_ERR(visc_idx_parse_images(bl, sl, &img, &n, &h, &w), "bad IDX magic");
    CHECK(img == NULL);
    CHECK_ERR(visc_idx_parse_labels(bi, si, &lab, &n), "bad IDX magic");
    uint8_t junk[64] = "GIF89a this is not an idx file at all.........................";
    CHECK_ERR(visc_idx_parse_images(junk, sizeof junk, &img, &n, &h, &w), "not an IDX file");
    bi[2] = 0x0D; /* float elements */
    CHECK_ERR(visc_idx_parse_images(bi, si, &img, &n, &h, &w), "unsigned bytes");
    bi[2] = 0x08;

    /* Truncated header and truncated data. */
    CHECK_ERR(visc_idx_parse_images(bi, 2, &img, &n, &h, &w), "truncated");
    CHECK_ERR(visc_idx_parse_images(bi, 12, &img, &n, &h, &w), "truncated");
    CHECK_ERR(visc_idx_parse_labels(bl, 6, &lab, &n), "truncated");
    CHECK_ERR(visc_idx_parse_images(bi, si - 1, &img, &n, &h, &w),
              "truncated: header says 3 images of 4x5, file has 75 bytes");
    CHECK_ERR(visc_idx_parse_labels(bl, sl - 1, &lab, &n), "header says 3 labels");
    CHECK_ERR(visc_idx_parse_images(bi, 16, &img, &n, &h, &w), "truncated");

    /* Trailing bytes: the header and the size disagree. */
    uint8_t *longer = malloc(si + 3);
    memcpy(longer, bi, si);
    memset(longer + si, 0, 3);
    CHECK_ERR(visc_idx_parse_images(longer, si + 3, &img, &n, &h, &w), "trailing");
    free(longer);

    /* Absurd sizes are refused from the header alone, before any allocation
     * (under ASan a 4-billion-image malloc would abort the test). */
    put_be32(bi + 4, 0xFFFFFFFFu);
    CHECK_ERR(visc_idx_parse_images(bi, si, &img, &n, &h, &w), "header says 4294967295 images");
    put_be32(bi + 4, 3);
    put_be32(bi + 8, 0xFFFFFFFFu);
    put_be32(bi + 12, 0xFFFFFFFFu);
    CHECK_ERR(visc_idx_parse_images(bi, si, &img, &n, &h, &w), "bad image size");
    put_be32(bi + 8, 0);
    put_be32(bi + 12, 5);
    CHECK_ERR(visc_idx_parse_images(bi, si, &img, &n, &h, &w), "bad image size");
    put_be32(bi + 8, 4);
    put_be32(bi + 4, 0);
    CHECK_ERR(visc_idx_parse_images(bi, 16, &img, &n, &h, &w), "0 images");
    put_be32(bl + 4, 0xFFFFFFFFu);
    CHECK_ERR(visc_idx_parse_labels(bl, sl, &lab, &n), "truncated");
    free(bi);
    free(bl);
}

TEST(idx_load_files) {
    size_t si, sl, sg;
    uint8_t *bi = make_idx_images(7, 3, 2, &si), *bl = make_idx_labels(7, &sl);
    /* Images plain, labels gzipped: the loader must not care. */
    const char *pi = tmp_path("imgs-idx3-ubyte"), *pl = tmp_path("labels-idx1-ubyte.gz");
    write_file(pi, bi, si);
    uint8_t *gz = gzip_buf(bl, sl, &sg);
    write_file(pl, gz, sg);
    visc_dataset *ds = visc_idx_load(pi, pl);
    CHECK_MSG(ds != NULL, "visc_idx_load: %s", visc_last_error());
    if (ds) {
        CHECK(ds->size == 7 && ds->channels == 1 && ds->height == 3 && ds->width == 2);
        CHECK(ds->num_classes == 7); /* labels 0..6: max + 1 */
        float out[6];
        int32_t label = -1;
        visc_augment aug = {0, 0, {0.5f, 0, 0}, {0.25f, 1, 1}, 0};
        CHECK(ds->get(ds, 4, &aug, 0, 1, 0, out, &label) == 0);
        CHECK(label == 4);
        for (int k = 0; k < 6; k++) {
            int y = k / 2, x = k % 2;
            float v = (float)((4 * 31 + y * 7 + x) & 255);
            CHECK_CLOSE(out[k], (v / 255.0f - 0.5f) / 0.25f, 1e-6, 0);
        }
        CHECK_ERR(ds->get(ds, 7, &aug, 0, 1, 0, out, &label), "out of range");
        CHECK_ERR(ds->get(ds, -1, &aug, 0, 1, 0, out, &label), "out of range");
        visc_dataset_free(ds);
    }

    /* Count mismatch names both files. */
    size_t sl2;
    uint8_t *bl2 = make_idx_labels(6, &sl2);
    const char *pl2 = tmp_path("six-labels");
    write_file(pl2, bl2, sl2);
    CHECK(visc_idx_load(pi, pl2) == NULL);
    CHECK_MSG(contains(visc_last_error(), "has 7 images") &&
                  contains(visc_last_error(), "has 6 labels") &&
                  contains(visc_last_error(), "six-labels"),
              "mismatch error: %s", visc_last_error());

    /* A truncated gzipped image file: the message names the file. */
    uint8_t *gzi = gzip_buf(bi, si - 5, &sg);
    const char *pt = tmp_path("short-images.gz");
    write_file(pt, gzi, sg);
    CHECK(visc_idx_load(pt, pl) == NULL);
    CHECK_MSG(contains(visc_last_error(), "short-images.gz: truncated: header says 7 images of "
                                          "3x2, file has 53 bytes"),
              "truncated error: %s", visc_last_error());
    /* Swapped arguments: the image file fails on its magic. */
    CHECK(visc_idx_load(pl, pi) == NULL);
    CHECK_MSG(contains(visc_last_error(), "labels-idx1-ubyte.gz: bad IDX magic"), "swap: %s",
              visc_last_error());
    CHECK(visc_idx_load(tmp_path("no-such-file"), pl) == NULL);
    CHECK_MSG(contains(visc_last_error(), "no-such-file: cannot open"), "missing: %s",
              visc_last_error());
    free(gzi);
    free(bl2);
    free(gz);
    free(bi);
    free(bl);
}

/* ---- gzip ---- */

TEST(gzip_roundtrip_and_errors) {
    size_t n = 100000, sg, sz;
    uint8_t *src = malloc(n), *out;
    for (size_t i = 0; i < n; i++) src[i] = (uint8_t)((i * i) >> 3);
    uint8_t *gz = gzip_buf(src, n, &sg);

    CHECK(visc_gunzip_memory(gz, sg, &out, &sz, n) == 0);
    CHECK(sz == n && memcmp(out, src, n) == 0);
    free(out);
    /* Not gzip: copied as is. */
    CHECK(visc_gunzip_memory(src, 1000, &out, &sz, n) == 0);
    CHECK(sz == 1000 && memcmp(out, src, 1000) == 0);
    free(out);

    /* The cap: one byte short of the real size fails, whatever ISIZE says. */
    CHECK_ERR(visc_gunzip_memory(gz, sg, &out, &sz, n - 1), "more than the limit");
    CHECK(out == NULL);
    uint8_t *lying = malloc(sg);
    memcpy(lying, gz, sg);
    lying[sg - 4] = 10; /* ISIZE says 10 bytes */
    lying[sg - 3] = lying[sg - 2] = lying[sg - 1] = 0;
    CHECK_ERR(visc_gunzip_memory(lying, sg, &out, &sz, 5000), "more than the limit");

    /* Truncated: cut in the middle of the deflate data and in the trailer. */
    CHECK_ERR(visc_gunzip_memory(gz, sg / 2, &out, &sz, n), "truncated");
    CHECK_ERR(visc_gunzip_memory(gz, sg - 3, &out, &sz, n), "truncated");
    CHECK_ERR(visc_gunzip_memory(gz, 5, &out, &sz, n), "truncated");

    /* Corrupt: a flipped bit in the data, a wrong CRC, a bad header. */
    memcpy(lying, gz, sg);
    lying[sg / 2] ^= 0x10;
    CHECK_ERR(visc_gunzip_memory(lying, sg, &out, &sz, 2 * n), "corrupt");
    memcpy(lying, gz, sg);
    lying[sg - 8] ^= 1; /* CRC32 */
    CHECK_ERR(visc_gunzip_memory(lying, sg, &out, &sz, 2 * n), "corrupt");
    memcpy(lying, gz, sg);
    lying[2] = 7; /* compression method must be 8 */
    CHECK_ERR(visc_gunzip_memory(lying, sg, &out, &sz, 2 * n), "corrupt");

    /* Two members are one file (as gunzip reads them); garbage after is not. */
    uint8_t *two = malloc(2 * sg + 8);
    memcpy(two, gz, sg);
    memcpy(two + sg, gz, sg);
    CHECK(visc_gunzip_memory(two, 2 * sg, &out, &sz, 2 * n) == 0);
    CHECK(sz == 2 * n && memcmp(out, src, n) == 0 && memcmp(out + n, src, n) == 0);
    free(out);
    memcpy(two + sg, "garbage!", 8);
    CHECK_ERR(visc_gunzip_memory(two, sg + 8, &out, &sz, 2 * n), "trailing garbage");

    /* Through a file: errors carry the path. */
    const char *p = tmp_path("cut.gz");
    write_file(p, gz, sg - 100);
    CHECK_ERR(visc_read_maybe_gzip(p, &out, &sz, n), "cut.gz: gzip: truncated");
    write_file(p, src, 2000);
    CHECK_ERR(visc_read_maybe_gzip(p, &out, &sz, 1999), "more than the limit");
    CHECK(visc_read_maybe_gzip(p, &out, &sz, 2000) == 0);
    CHECK(sz == 2000 && memcmp(out, src, 2000) == 0);
    free(out);
    free(two);
    free(lying);
    free(gz);
    free(src);
}

/* ---- CIFAR-10 ---- */

TEST(cifar_parse) {
    size_t s;
    uint8_t *b = make_cifar(4, &s), *img;
    int32_t *lab;
    int64_t n;
    CHECK(visc_cifar_bin_parse(b, s, &img, &lab, &n) == 0);
    CHECK(n == 4);
    for (int i = 0; i < 4; i++) {
        CHECK(lab[i] == (i * 3) % 10);
        CHECK(memcmp(img + i * 3072, b + i * 3073 + 1, 3072) == 0);
    }
    /* R plane, then G, then B: pixel (c, y, x) of record 1. */
    CHECK(img[3072 + 1 * 1024 + 5 * 32 + 7] == (uint8_t)(((1024 + 5 * 32 + 7) * 13 + 1) & 255));
    free(img);
    free(lab);

    CHECK_ERR(visc_cifar_bin_parse(b, s - 1, &img, &lab, &n), "3073-byte");
    CHECK_ERR(visc_cifar_bin_parse(b, 100, &img, &lab, &n), "3073-byte");
    CHECK_ERR(visc_cifar_bin_parse(b, 0, &img, &lab, &n), "empty");
    b[2 * 3073] = 10;
    CHECK_ERR(visc_cifar_bin_parse(b, s, &img, &lab, &n), "record 2: label 10 out of range");
    CHECK(img == NULL && lab == NULL);
    free(b);
}

TEST(cifar_load_files) {
    size_t s1, s2;
    uint8_t *b1 = make_cifar(3, &s1), *b2 = make_cifar(5, &s2);
    b2[0] = 9;
    const char *paths[2] = {tmp_path("data_batch_1.bin"), tmp_path("data_batch_2.bin")};
    write_file(paths[0], b1, s1);
    write_file(paths[1], b2, s2);
    visc_dataset *ds = visc_cifar_bin_load(paths, 2);
    CHECK_MSG(ds != NULL, "%s", visc_last_error());
    if (ds) {
        CHECK(ds->size == 8 && ds->channels == 3 && ds->height == 32 && ds->width == 32);
        CHECK(ds->num_classes == 10);
        float *out = malloc(3072 * sizeof *out);
        int32_t label;
        CHECK(ds->get(ds, 3, NULL, 0, 0, 0, out, &label) == 0); /* first of file 2 */
        CHECK(label == 9);
        for (int k = 0; k < 3072; k++) CHECK(out[k] == (float)b2[1 + k] / 255.0f);
        CHECK(ds->get(ds, 7, NULL, 0, 0, 0, out, &label) == 0);
        CHECK(label == (4 * 3) % 10);
        free(out);
        visc_dataset_free(ds);
    }
    b2[3073] = 200;
    write_file(paths[1], b2, s2);
    CHECK(visc_cifar_bin_load(paths, 2) == NULL);
    CHECK_MSG(contains(visc_last_error(), "data_batch_2.bin: record 1: label 200"), "%s",
              visc_last_error());
    write_file(paths[1], b2, s2 - 7);
    CHECK(visc_cifar_bin_load(paths, 2) == NULL);
    CHECK_MSG(contains(visc_last_error(), "data_batch_2.bin:") &&
                  contains(visc_last_error(), "3073"),
              "%s", visc_last_error());
    free(b1);
    free(b2);
}

/* ---- Fashion-MNIST, the real files ---- */

static void check_fashion(const char *images, const char *labels, int64_t count) {
    char pi[512], pl[512];
    snprintf(pi, sizeof pi, "%s/%s", FASHION_DIR, images);
    snprintf(pl, sizeof pl, "%s/%s", FASHION_DIR, labels);
    if (access(pi, R_OK) != 0 || access(pl, R_OK) != 0) {
        CHECK_MSG(0,
                  "Fashion-MNIST missing: %s or %s not readable "
                  "(install it with: apt-get install dataset-fashion-mnist)",
                  pi, pl);
        return;
    }
    double t0 = visc_now();
    visc_dataset *ds = visc_idx_load(pi, pl);
    double dt = visc_now() - t0;
    CHECK_MSG(ds != NULL, "%s", visc_last_error());
    if (!ds) return;
    printf("  %s: %lld images loaded in %.3f s\n", images, (long long)ds->size, dt);
    CHECK(ds->size == count);
    CHECK(ds->channels == 1 && ds->height == 28 && ds->width == 28);
    CHECK(ds->num_classes == 10);
    int64_t hist[10] = {0};
    float img[784];
    double sum = 0;
    for (int64_t i = 0; i < ds->size; i++) {
        int32_t label;
        CHECK(ds->get(ds, i, NULL, 0, 0, 0, img, &label) == 0);
        if (label >= 0 && label < 10) hist[label]++;
        for (int k = 0; k < 784; k += 16) sum += img[k];
    }
    for (int c = 0; c < 10; c++)
        CHECK_MSG(hist[c] == count / 10, "class %d: %lld samples, expected %lld", c,
                  (long long)hist[c], (long long)(count / 10));
    /* The Fashion-MNIST pixel mean is 0.286 (train) / 0.287 (test). */
    double mean = sum / ((double)ds->size * 49);
    CHECK_CLOSE(mean, 0.286, 0.01, 0);
    visc_dataset_free(ds);
}

TEST(fashion_mnist) {
    check_fashion("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60000);
    check_fashion("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10000);
}

/* ---- augmentation ---- */

/* The direct computation: materialize the canvas (pad_to) and the padded
 * image, cut the window, mirror it, normalize with torchvision's arithmetic. */
static void reference_augment(const visc_augment *aug, const uint8_t *img, int c, int h, int w,
                              int dy, int dx, int flip, float *out) {
    int oh = aug->pad_to > h ? aug->pad_to : h, ow = aug->pad_to > w ? aug->pad_to : w;
    int top = (oh - h) / 2, left = (ow - w) / 2;
    int p = aug->pad_crop, ph = oh + 2 * p, pw = ow + 2 * p;
    uint8_t *padded = calloc((size_t)c * ph * pw, 1);
    for (int ch = 0; ch < c; ch++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                padded[(ch * ph + y + p + top) * pw + x + p + left] = img[(ch * h + y) * w + x];
    for (int ch = 0; ch < c; ch++) {
        int k = ch < 2 ? ch : 2;
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++) {
                int cx = flip ? ow - 1 - x : x; /* column of the cropped image */
                uint8_t v = padded[(ch * ph + y + dy) * pw + cx + dx];
                out[(ch * oh + y) * ow + x] = ((float)v / 255.0f - aug->mean[k]) / aug->std[k];
            }
    }
    free(padded);
}

/* pad_to: the image centred on a larger zero canvas, then cropped/flipped
 * as usual; odd margins put the extra pixel after the image (torchvision's
 * CenterCrop/Pad arithmetic for a centred placement: offset (S - h) / 2). */
TEST(augment_pad_to) {
    int c = 2, h = 5, w = 4;
    uint8_t img[2 * 5 * 4];
    for (int i = 0; i < c * h * w; i++) img[i] = (uint8_t)(i * 29 + 3);
    float got[2 * 8 * 8], want[2 * 8 * 8];
    for (int S = 5; S <= 8; S++)
        for (int p = 0; p <= 2; p++) {
            visc_augment aug = {p, 1, {0.3f, 0.6f, 0}, {0.5f, 0.25f, 1}, S};
            for (int dy = 0; dy <= 2 * p; dy++)
                for (int dx = 0; dx <= 2 * p; dx++)
                    for (int flip = 0; flip <= 1; flip++) {
                        visc_augment_apply_at(&aug, img, c, h, w, dy, dx, flip, got);
                        reference_augment(&aug, img, c, h, w, dy, dx, flip, want);
                        CHECK_MSG(memcmp(got, want, (size_t)c * S * S * sizeof(float)) == 0,
                                  "S=%d p=%d dy=%d dx=%d flip=%d differs", S, p, dy, dx, flip);
                    }
        }
    /* Through the dataset: 28 -> 32 for Fashion-MNIST-sized data. */
    uint8_t *images = calloc(3 * 28 * 28, 1);
    int32_t *labels = calloc(3, sizeof *labels);
    for (int i = 0; i < 3 * 28 * 28; i++) images[i] = (uint8_t)(i % 251);
    visc_dataset *ds = visc_dataset_from_memory(images, labels, 3, 1, 28, 28, 10);
    CHECK(visc_dataset_pad_to(ds, 27) == -1); /* smaller: refused */
    CHECK(visc_dataset_pad_to(ds, 32) == 0);
    CHECK(ds->height == 32 && ds->width == 32);
    float x[32 * 32];
    int32_t y;
    visc_augment plain = {0, 0, {0, 0, 0}, {1, 1, 1}, 0};
    CHECK(ds->get(ds, 1, &plain, 0, 0, 0, x, &y) == 0);
    CHECK(x[0] == 0.0f && x[2 * 32 + 1] == 0.0f);
    CHECK(x[2 * 32 + 2] == (float)images[28 * 28] / 255.0f);
    CHECK(x[29 * 32 + 29] == (float)images[28 * 28 + 27 * 28 + 27] / 255.0f);
    visc_dataset_free(ds);
}

/* --subset on in-memory data: n samples per class, in stored order, the
 * draw visc_subset_per_class makes (which image folders use too), images
 * moved with their labels; fewer than n: the whole class. */
TEST(memory_subset_per_class) {
    const int n = 40, classes = 4;
    uint8_t *images = malloc((size_t)n * 2 * 3 * 3);
    int32_t *labels = malloc((size_t)n * sizeof *labels);
    for (int i = 0; i < n; i++) {
        labels[i] = i % 7 == 0 ? 3 : i % 3; /* class 3: 6 samples */
        for (int j = 0; j < 18; j++) images[i * 18 + j] = (uint8_t)(i * 5 + j);
    }
    int32_t before[40];
    memcpy(before, labels, sizeof before);
    int64_t want[40];
    int64_t m = visc_subset_per_class(before, n, classes, 8, 1, 7, want);
    visc_dataset *ds = visc_dataset_from_memory(images, labels, n, 2, 3, 3, classes);
    CHECK(visc_dataset_keep_per_class(ds, 8, 7) == 0);
    CHECK(ds->size == m && m == 3 * 8 + 6);
    int count[4] = {0, 0, 0, 0}, first_eight = 1;
    for (int64_t i = 0; i < ds->size; i++) {
        float x[18];
        int32_t y;
        visc_augment plain = {0, 0, {0, 0, 0}, {1, 1, 1}, 0};
        CHECK(ds->get(ds, i, &plain, 0, 0, 0, x, &y) == 0);
        CHECK(y == before[want[i]]);
        CHECK(x[0] == (float)(uint8_t)(want[i] * 5) / 255.0f);
        if (i > 0) CHECK(want[i] > want[i - 1]);
        count[y]++;
        first_eight &= want[i] < 26; /* the unseeded rule would keep only early samples */
    }
    CHECK(count[0] == 8 && count[1] == 8 && count[2] == 8 && count[3] == 6);
    CHECK(!first_eight);
    CHECK_ERR(visc_dataset_keep_per_class(ds, 0, 7), "positive");
    visc_dataset_free(ds);
}

TEST(augment_geometry_exact) {
    int c = 4, h = 5, w = 7; /* 4 channels: the fourth reuses mean[2]/std[2] */
    uint8_t img[4 * 5 * 7];
    for (int i = 0; i < c * h * w; i++) img[i] = (uint8_t)(i * 37 + 11);
    float got[4 * 5 * 7], want[4 * 5 * 7];
    for (int p = 0; p <= 3; p++) {
        visc_augment aug = {p, 1, {0.4914f, 0.4822f, 0.4465f}, {0.247f, 0.243f, 0.261f}, 0};
        for (int dy = 0; dy <= 2 * p; dy++)
            for (int dx = 0; dx <= 2 * p; dx++)
                for (int flip = 0; flip <= 1; flip++) {
                    visc_augment_apply_at(&aug, img, c, h, w, dy, dx, flip, got);
                    reference_augment(&aug, img, c, h, w, dy, dx, flip, want);
                    CHECK_MSG(memcmp(got, want, sizeof got) == 0,
                              "p=%d dy=%d dx=%d flip=%d differs", p, dy, dx, flip);
                }
    }
    /* A known case by hand: p = 1, window shifted one left and one up
     * (dy = dx = 0): output (0, 0) is padding, (1, 1) is input (0, 0). */
    visc_augment aug = {1, 0, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}, 0};
    visc_augment_apply_at(&aug, img, 1, h, w, 0, 0, 0, got);
    CHECK(got[0] == -1.0f); /* (0 - 0.5) / 0.5 */
    CHECK(got[1 * w + 1] == ((float)img[0] / 255.0f - 0.5f) / 0.5f);
    /* Flip only: output (y, x) = input (y, w - 1 - x). */
    visc_augment_apply_at(&aug, img, 1, h, w, 1, 1, 1, got);
    CHECK(got[2 * w + 0] == ((float)img[2 * w + w - 1] / 255.0f - 0.5f) / 0.5f);
    /* Eval = normalization only, whatever the seed. */
    visc_augment_apply(&aug, img, 1, h, w, 0, 123, 4, 5, got);
    for (int i = 0; i < h * w; i++) CHECK(got[i] == ((float)img[i] / 255.0f - 0.5f) / 0.5f);
}

TEST(augment_train_matches_draw) {
    visc_augment aug = {4, 1, {0.1f, 0.2f, 0.3f}, {0.3f, 0.2f, 0.1f}, 0};
    uint8_t img[3 * 32 * 32];
    for (int i = 0; i < 3 * 32 * 32; i++) img[i] = (uint8_t)(i * 7);
    float got[3 * 32 * 32], want[3 * 32 * 32];
    for (int64_t idx = 0; idx < 50; idx++) {
        int dy, dx, flip;
        visc_augment_draw(&aug, 42, 3, idx, &dy, &dx, &flip);
        visc_augment_apply(&aug, img, 3, 32, 32, 1, 42, 3, idx, got);
        visc_augment_apply_at(&aug, img, 3, 32, 32, dy, dx, flip, want);
        CHECK(memcmp(got, want, sizeof got) == 0);
    }
}

TEST(augment_distribution) {
    enum { N = 40000, P = 4, K = 2 * P + 1 };
    visc_augment aug = {P, 1, {0, 0, 0}, {1, 1, 1}, 0};
    int64_t hy[K] = {0}, hx[K] = {0}, joint[K][K] = {{0}}, flips = 0;
    for (int64_t i = 0; i < N; i++) {
        int dy, dx, flip;
        visc_augment_draw(&aug, 7, 2, i, &dy, &dx, &flip);
        CHECK(dy >= 0 && dy < K && dx >= 0 && dx < K && (flip == 0 || flip == 1));
        if (dy < 0 || dy >= K || dx < 0 || dx >= K) return;
        hy[dy]++;
        hx[dx]++;
        joint[dy][dx]++;
        flips += flip;
    }
    /* Chi-square against uniform: 8 degrees of freedom, 26.1 is p = 0.001;
     * the 9x9 joint table (80 dof, p = 0.001 at 124.8) checks dy, dx are
     * independent. */
    double cy = 0, cx = 0, cj = 0, e = (double)N / K, ej = (double)N / (K * K);
    for (int k = 0; k < K; k++) {
        cy += (hy[k] - e) * (hy[k] - e) / e;
        cx += (hx[k] - e) * (hx[k] - e) / e;
        for (int l = 0; l < K; l++) cj += (joint[k][l] - ej) * (joint[k][l] - ej) / ej;
    }
    CHECK_MSG(cy < 26.1, "dy histogram not uniform: chi2 = %.1f", cy);
    CHECK_MSG(cx < 26.1, "dx histogram not uniform: chi2 = %.1f", cx);
    CHECK_MSG(cj < 124.8, "dy, dx not independent: chi2 = %.1f", cj);
    /* Flip rate: sigma = sqrt(0.25 / N) = 0.0025; allow 4 sigma. */
    CHECK_CLOSE((double)flips / N, 0.5, 0.01, 0);

    /* Switched off: no flip, no shift. */
    visc_augment off = {0, 0, {0, 0, 0}, {1, 1, 1}, 0};
    for (int64_t i = 0; i < 1000; i++) {
        int dy, dx, flip;
        visc_augment_draw(&off, 7, 2, i, &dy, &dx, &flip);
        CHECK(dy == 0 && dx == 0 && flip == 0);
    }
    /* Turning the flip off leaves the crops as they were. */
    visc_augment noflip = {P, 0, {0, 0, 0}, {1, 1, 1}, 0};
    for (int64_t i = 0; i < 1000; i++) {
        int a, b, f, a2, b2, f2;
        visc_augment_draw(&aug, 7, 2, i, &a, &b, &f);
        visc_augment_draw(&noflip, 7, 2, i, &a2, &b2, &f2);
        CHECK(a == a2 && b == b2 && f2 == 0);
    }
}

TEST(augment_reproducible) {
    visc_augment aug = {4, 1, {0, 0, 0}, {1, 1, 1}, 0};
    int same_epoch = 0, diff_epoch = 0, diff_seed = 0, diff_idx = 0;
    for (int64_t i = 0; i < 2000; i++) {
        int a[3], b[3], c[3], d[3], e[3];
        visc_augment_draw(&aug, 99, 5, i, &a[0], &a[1], &a[2]);
        visc_augment_draw(&aug, 99, 5, i, &b[0], &b[1], &b[2]);
        visc_augment_draw(&aug, 99, 6, i, &c[0], &c[1], &c[2]);
        visc_augment_draw(&aug, 100, 5, i, &d[0], &d[1], &d[2]);
        visc_augment_draw(&aug, 99, 5, i + 1, &e[0], &e[1], &e[2]);
        same_epoch += memcmp(a, b, sizeof a) == 0;
        diff_epoch += memcmp(a, c, sizeof a) != 0;
        diff_seed += memcmp(a, d, sizeof a) != 0;
        diff_idx += memcmp(a, e, sizeof a) != 0;
    }
    /* 162 equally likely outcomes: two independent draws agree 1 in 162. */
    CHECK(same_epoch == 2000);
    CHECK_MSG(diff_epoch > 1950, "epochs 5 and 6 agree on %d of 2000", 2000 - diff_epoch);
    CHECK_MSG(diff_seed > 1950, "seeds agree on %d of 2000", 2000 - diff_seed);
    CHECK_MSG(diff_idx > 1950, "neighbours agree on %d of 2000", 2000 - diff_idx);
}

/* ---- epoch order and batches ---- */

static int is_permutation(const int64_t *order, int64_t n) {
    char *seen = calloc((size_t)n, 1);
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        if (order[i] < 0 || order[i] >= n || seen[order[i]]) ok = 0;
        else seen[order[i]] = 1;
    }
    free(seen);
    return ok;
}

TEST(epoch_order) {
    enum { N = 1000 };
    int64_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *c = malloc(N * sizeof *c);
    visc_epoch_order(a, N, 0, 1, 0);
    for (int64_t i = 0; i < N; i++) CHECK(a[i] == i);
    visc_epoch_order(a, N, 1, 1, 0);
    visc_epoch_order(b, N, 1, 1, 0);
    visc_epoch_order(c, N, 1, 1, 1);
    CHECK(is_permutation(a, N) && is_permutation(c, N));
    CHECK(memcmp(a, b, N * sizeof *a) == 0);
    int same = 0, fixed = 0;
    for (int64_t i = 0; i < N; i++) {
        same += a[i] == c[i];
        fixed += a[i] == i;
    }
    /* Random permutations share ~1 position on average. */
    CHECK_MSG(same < 10, "epochs 0 and 1 share %d positions", same);
    CHECK_MSG(fixed < 10, "epoch 0 has %d fixed points", fixed);
    visc_epoch_order(c, N, 1, 2, 0);
    same = 0;
    for (int64_t i = 0; i < N; i++) same += a[i] == c[i];
    CHECK_MSG(same < 10, "seeds 1 and 2 share %d positions", same);
    /* Uniformity: where element 0 lands, over many epochs (n = 5). */
    int64_t hist[5] = {0}, small[5];
    for (int e = 0; e < 10000; e++) {
        visc_epoch_order(small, 5, 1, 3, e);
        CHECK(is_permutation(small, 5));
        for (int k = 0; k < 5; k++)
            if (small[k] == 0) hist[k]++;
    }
    double chi = 0;
    for (int k = 0; k < 5; k++) chi += (hist[k] - 2000.0) * (hist[k] - 2000.0) / 2000.0;
    CHECK_MSG(chi < 18.5, "position of element 0 not uniform: chi2 = %.1f", chi); /* p=0.001 */
    visc_epoch_order(small, 1, 1, 3, 0);
    CHECK(small[0] == 0);
    free(a);
    free(b);
    free(c);
}

static visc_dataset *random_dataset(int64_t n, int c, int h, int w) {
    uint8_t *img = malloc((size_t)n * c * h * w);
    int32_t *lab = malloc((size_t)n * sizeof *lab);
    for (size_t i = 0; i < (size_t)n * c * h * w; i++) img[i] = (uint8_t)((i * 2654435761u) >> 13);
    for (int64_t i = 0; i < n; i++) lab[i] = (int32_t)(i % 10);
    return visc_dataset_from_memory(img, lab, n, c, h, w, 10);
}

TEST(make_batch_threads) {
    enum { N = 300, B = 64, S = 3 * 32 * 32 };
    visc_dataset *ds = random_dataset(N, 3, 32, 32);
    visc_augment aug = {4, 1, {0.4914f, 0.4822f, 0.4465f}, {0.247f, 0.243f, 0.261f}, 0};
    int64_t order[N];
    visc_epoch_order(order, N, 1, 5, 2);
    float *x1 = malloc((size_t)B * S * sizeof(float)), *x2 = malloc((size_t)B * S * sizeof(float));
    float *x3 = malloc((size_t)B * S * sizeof(float));
    int32_t y1[B], y2[B], y3[B];
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK(visc_make_batch(ds, order + 10, B, &aug, 1, 5, 2, x1, y1) == 0);
    omp_set_num_threads(2);
    CHECK(visc_make_batch(ds, order + 10, B, &aug, 1, 5, 2, x2, y2) == 0);
    omp_set_num_threads(7);
    CHECK(visc_make_batch(ds, order + 10, B, &aug, 1, 5, 2, x3, y3) == 0);
    omp_set_num_threads(saved);
    CHECK(memcmp(x1, x2, (size_t)B * S * sizeof(float)) == 0 && memcmp(y1, y2, sizeof y1) == 0);
    CHECK(memcmp(x1, x3, (size_t)B * S * sizeof(float)) == 0 && memcmp(y1, y3, sizeof y1) == 0);
    /* Each slot is exactly get() of its sample, and train = 1 changed it. */
    float one[S];
    int32_t label;
    int differs = 0;
    for (int b = 0; b < B; b++) {
        CHECK(ds->get(ds, order[10 + b], &aug, 1, 5, 2, one, &label) == 0);
        CHECK(memcmp(one, x1 + (size_t)b * S, sizeof one) == 0 && label == y1[b]);
        CHECK(ds->get(ds, order[10 + b], &aug, 0, 5, 2, one, &label) == 0);
        differs += memcmp(one, x1 + (size_t)b * S, sizeof one) != 0;
    }
    /* The identity draw (centre crop, no flip) has chance 1/162. */
    CHECK_MSG(differs >= B - 4, "only %d of %d samples augmented", differs, B);

    /* A bad index anywhere: -1 and the lowest failing batch position. */
    int64_t bad[B];
    memcpy(bad, order, sizeof bad);
    bad[40] = N + 5;
    bad[13] = -2;
    CHECK_ERR(visc_make_batch(ds, bad, B, &aug, 1, 5, 2, x1, y1), "batch position 13: sample "
                                                                  "index -2 out of range");
    free(x1);
    free(x2);
    free(x3);
    visc_dataset_free(ds);
}

/* test_image_decode.c: the JPEG/PNG decoders against PIL, region and
 * scaled decoding against the full decode, and bad input.
 *
 * References come from tools/gen_golden_decode.py (Pillow 9.4 on the same
 * system libjpeg-turbo 2.1.5): tests/golden/decode_imagenet.bin holds size,
 * per-channel sums and 32 sampled pixels for every file of
 * ../shared/data/imagenet-samples (every 8th also at 1/2, 1/4, 1/8), and
 * tests/golden/decode_small.bin every pixel of the tiny images of
 * tests/data/images. Observed: visc and PIL agree exactly (max difference
 * 0, identical sums) on all of them, so the comparisons are exact: any
 * difference means a decoder setting drifted from PIL's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h> /* after stdio.h: it needs FILE and size_t */
#include <zlib.h>

#include "test.h"
#include "visc/core.h"
#include "visc/image.h"
#include "visc/rng.h"

#define IMAGENET_DIR "../shared/data/imagenet-samples"
#define IMAGES_DIR "tests/data/images"
#define NAME_LEN 48

static uint8_t *read_image(const char *name, size_t *size) {
    char path[512];
    snprintf(path, sizeof path, IMAGES_DIR "/%s", name);
    uint8_t *buf = visc_test_read_file(path, size);
    CHECK_MSG(buf != NULL, "cannot read %s", path);
    return buf;
}

/* ---- the golden files (format: tools/gen_golden_decode.py) ---- */
typedef struct {
    char name[NAME_LEN];
    int scale, width, height;
    uint64_t sum[3];
    const uint8_t *pixels; /* 3 * samples bytes, or the whole image */
} golden_record;

typedef struct {
    uint8_t *file;
    int count, samples;
    golden_record *rec;
} golden;

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int load_golden(const char *name, golden *g) {
    size_t size, pos = 16;
    memset(g, 0, sizeof *g);
    g->file = visc_test_read_file(visc_golden_path(name), &size);
    if (!g->file || size < 16 || memcmp(g->file, "VISCDEC1", 8) != 0) return -1;
    g->count = (int)le32(g->file + 8);
    g->samples = (int)le32(g->file + 12);
    g->rec = calloc((size_t)g->count, sizeof *g->rec);
    for (int i = 0; i < g->count; i++) {
        golden_record *r = &g->rec[i];
        if (pos + NAME_LEN + 36 > size) return -1;
        memcpy(r->name, g->file + pos, NAME_LEN);
        r->name[NAME_LEN - 1] = 0;
        pos += NAME_LEN;
        r->scale = (int)le32(g->file + pos);
        r->width = (int)le32(g->file + pos + 4);
        r->height = (int)le32(g->file + pos + 8);
        pos += 12;
        for (int c = 0; c < 3; c++, pos += 8)
            r->sum[c] = (uint64_t)le32(g->file + pos) | (uint64_t)le32(g->file + pos + 4) << 32;
        size_t n = 3 * (g->samples ? (size_t)g->samples : (size_t)r->width * r->height);
        if (pos + n > size) return -1;
        r->pixels = g->file + pos;
        pos += n;
    }
    return pos == size ? 0 : -1;
}

static void free_golden(golden *g) {
    free(g->file);
    free(g->rec);
}

/* Mirrors sample_xy() of tools/gen_golden_decode.py. */
static void sample_xy(int i, int w, int h, int *x, int *y) {
    uint32_t v = (uint32_t)(i + 1) * 2654435761u;
    *x = (int)(v % (uint32_t)w);
    *y = (int)((v >> 11) % (uint32_t)h);
}

/* Compares one decode with its record; returns the number of mismatching
 * values (size counts as one) and fills `why` for the first. */
static int compare_record(const golden_record *r, int samples, const visc_image *img, char *why,
                          size_t why_size) {
    if (img->width != r->width || img->height != r->height) {
        snprintf(why, why_size, "%s 1/%d: size %dx%d, PIL %dx%d", r->name, r->scale, img->width,
                 img->height, r->width, r->height);
        return 1;
    }
    uint64_t sum[3] = {0, 0, 0};
    for (int y = 0; y < img->height; y++)
        for (int x = 0; x < img->width; x++)
            for (int c = 0; c < 3; c++) sum[c] += img->data[(size_t)y * img->stride + 3 * x + c];
    int bad = 0;
    for (int c = 0; c < 3; c++)
        if (sum[c] != r->sum[c] && !bad++)
            snprintf(why, why_size, "%s 1/%d: channel %d sum %llu, PIL %llu", r->name, r->scale, c,
                     (unsigned long long)sum[c], (unsigned long long)r->sum[c]);
    int n = samples ? samples : r->width * r->height;
    for (int i = 0; i < n; i++) {
        int x = i % r->width, y = i / r->width;
        if (samples) sample_xy(i, r->width, r->height, &x, &y);
        const uint8_t *got = img->data + (size_t)y * img->stride + 3 * x;
        for (int c = 0; c < 3; c++)
            if (got[c] != r->pixels[3 * i + c] && !bad++)
                snprintf(why, why_size, "%s 1/%d: pixel (%d,%d) channel %d = %d, PIL %d", r->name,
                         r->scale, x, y, c, got[c], r->pixels[3 * i + c]);
    }
    return bad;
}

/* Decodes every record's file at its scale (in parallel) and compares. */
static void check_golden(const char *golden_name, const char *dir) {
    golden g;
    CHECK_MSG(load_golden(golden_name, &g) == 0, "cannot read golden %s", golden_name);
    if (!g.rec) return;
    int failed = 0, reported = 0;
#pragma omp parallel for schedule(dynamic, 4) reduction(+ : failed)
    for (int i = 0; i < g.count; i++) {
        const golden_record *r = &g.rec[i];
        char path[512], why[600] = "";
        snprintf(path, sizeof path, "%s/%s", dir, r->name);
        size_t size;
        uint8_t *buf = visc_test_read_file(path, &size);
        visc_decode_request req = {{0, 0, 0, 0}, r->scale};
        visc_decoded d;
        if (!buf) snprintf(why, sizeof why, "cannot read %s", path);
        else if (visc_image_decode_request(buf, size, &req, &d))
            snprintf(why, sizeof why, "%s: %s", path, visc_last_error());
        else {
            if (compare_record(r, g.samples, &d.image, why, sizeof why) == 0) why[0] = 0;
            if (!why[0] && (d.scale_denom != r->scale || d.covers.w != d.source_width))
                snprintf(why, sizeof why, "%s: reply scale %d covers width %d", r->name,
                         d.scale_denom, d.covers.w);
            visc_image_free(&d.image);
        }
        free(buf);
        if (why[0]) {
            failed++;
#pragma omp critical
            if (reported++ < 10) visc_test_fail(__FILE__, __LINE__, "%s", why);
        }
    }
    CHECK_MSG(failed == 0, "%d of %d decodes differ from PIL", failed, g.count);
    free_golden(&g);
}

TEST(imagenet_samples_match_pil) { check_golden("decode_imagenet.bin", IMAGENET_DIR); }

TEST(small_images_match_pil) {
    /* JPEG gray/4:4:4/4:2:2/progressive/CMYK, and PNG of every color type
     * and bit depth, interlaced or not; see tools/gen_golden_decode.py. */
    check_golden("decode_small.bin", IMAGES_DIR);
}

TEST(sniff_is_by_content) {
    size_t size;
    uint8_t *png = read_image("png_named.JPEG", &size);
    if (!png) return;
    CHECK(visc_image_sniff(png, size) == VISC_IMAGE_PNG);
    visc_image img;
    CHECK(visc_image_decode(png, size, &img) == 0);
    CHECK(img.width == 23 && img.height == 17 && img.stride == 69);
    visc_image_free(&img);
    free(png);
    uint8_t *jpg = read_image("gray.jpg", &size);
    if (!jpg) return;
    CHECK(visc_image_sniff(jpg, size) == VISC_IMAGE_JPEG);
    CHECK(visc_image_sniff(jpg, 2) == VISC_IMAGE_UNKNOWN);
    int w = 0, h = 0;
    CHECK(visc_image_info(jpg, size, &w, &h) == 0);
    CHECK(w == 61 && h == 45);
    free(jpg);
}

/* ---- regions and scales ---- */

/* Decodes `req` and checks the reply against `full` (the whole image at the
 * same scale): geometry as promised by image.h, and equal pixels. */
static void check_region(const char *what, const uint8_t *buf, size_t size,
                         const visc_decode_request *req, const visc_image *full) {
    visc_decoded d;
    if (visc_image_decode_request(buf, size, req, &d)) {
        CHECK_MSG(0, "%s: %s", what, visc_last_error());
        return;
    }
    const visc_rect c = d.covers, r = req->region;
    const int s = d.scale_denom;
    CHECK_MSG(c.x <= r.x && c.y <= r.y && c.x + c.w >= r.x + r.w && c.y + c.h >= r.y + r.h,
              "%s: covers %dx%d+%d+%d misses region %dx%d+%d+%d", what, c.w, c.h, c.x, c.y, r.w,
              r.h, r.x, r.y);
    CHECK_MSG(c.x % s == 0 && c.y % s == 0 && c.x + c.w <= d.source_width &&
                  c.y + c.h <= d.source_height,
              "%s: covers %dx%d+%d+%d at 1/%d", what, c.w, c.h, c.x, c.y, s);
    CHECK_MSG(d.image.width == (c.w + s - 1) / s && d.image.height == (c.h + s - 1) / s,
              "%s: image %dx%d for covers %dx%d at 1/%d", what, d.image.width, d.image.height, c.w,
              c.h, s);
    int bad = 0;
    for (int y = 0; y < d.image.height && !bad; y++) {
        const uint8_t *got = d.image.data + (size_t)y * d.image.stride;
        const uint8_t *want = full->data + (size_t)(c.y / s + y) * full->stride + 3 * (c.x / s);
        if (c.y / s + y >= full->height || c.x / s + d.image.width > full->width ||
            memcmp(got, want, 3 * (size_t)d.image.width) != 0)
            bad = y + 1;
    }
    CHECK_MSG(!bad, "%s: row %d of region %dx%d+%d+%d at 1/%d differs from the full decode", what,
              bad - 1, r.w, r.h, r.x, r.y, s);
    visc_image_free(&d.image);
}

static void check_random_regions(const char *what, const uint8_t *buf, size_t size, int count,
                                 uint64_t seed) {
    int w, h;
    if (visc_image_info(buf, size, &w, &h)) {
        CHECK_MSG(0, "%s: %s", what, visc_last_error());
        return;
    }
    visc_rng rng = visc_rng_make(seed, 0, 0);
    for (int s = 1; s <= 8; s *= 2) {
        visc_decode_request all = {{0, 0, 0, 0}, s};
        visc_decoded full;
        if (visc_image_decode_request(buf, size, &all, &full)) {
            CHECK_MSG(0, "%s 1/%d: %s", what, s, visc_last_error());
            continue;
        }
        for (int k = 0; k < count; k++) {
            visc_decode_request req = {{0, 0, 0, 0}, s};
            req.region.x = (int)visc_rng_below(&rng, (uint32_t)w);
            req.region.y = (int)visc_rng_below(&rng, (uint32_t)h);
            req.region.w = 1 + (int)visc_rng_below(&rng, (uint32_t)(w - req.region.x));
            req.region.h = 1 + (int)visc_rng_below(&rng, (uint32_t)(h - req.region.y));
            if (k == 0) req.region = (visc_rect){w - 1, h - 1, 1, 1}; /* the last pixel */
            if (k == 1) req.region = (visc_rect){0, 0, 1, 1};
            check_region(what, buf, size, &req, &full.image);
        }
        visc_image_free(&full.image);
    }
}

TEST(region_equals_full_decode) {
    /* Tiny images of each kind, and ImageNet files with 4:2:0, gray,
     * restart markers (the owl and the frog have DRI segments). */
    static const char *small[] = {"rgb422.jpg", "rgb444.jpg", "progressive.jpg", "cmyk.jpg",
                                  "gray.jpg",   "rgb.png",    "interlaced.png",  "palette.png"};
    static const char *imagenet[] = {"n01440764_tench.JPEG", "n02096051_Airedale.JPEG",
                                     "n01622779_great_grey_owl.JPEG", "n01644373_tree_frog.JPEG"};
    for (size_t i = 0; i < sizeof small / sizeof *small; i++) {
        size_t size;
        uint8_t *buf = read_image(small[i], &size);
        if (buf) check_random_regions(small[i], buf, size, 24, i);
        free(buf);
    }
    for (size_t i = 0; i < sizeof imagenet / sizeof *imagenet; i++) {
        char path[512];
        size_t size;
        snprintf(path, sizeof path, IMAGENET_DIR "/%s", imagenet[i]);
        uint8_t *buf = visc_test_read_file(path, &size);
        CHECK_MSG(buf != NULL, "cannot read %s", path);
        if (buf) check_random_regions(imagenet[i], buf, size, 6, 100 + i);
        free(buf);
    }
}

TEST(region_geometry) {
    size_t size;
    uint8_t *buf = read_image("rgb422.jpg", &size); /* 61 x 45, iMCU 16 x 8 */
    if (!buf) return;
    visc_decoded d;
    /* At scale 1 the reply is exactly the region. */
    visc_decode_request req = {{17, 9, 20, 11}, 1};
    CHECK(visc_image_decode_request(buf, size, &req, &d) == 0);
    CHECK(d.covers.x == 17 && d.covers.y == 9 && d.covers.w == 20 && d.covers.h == 11);
    CHECK(d.image.width == 20 && d.image.height == 11 && d.scale_denom == 1);
    CHECK(d.source_width == 61 && d.source_height == 45);
    visc_image_free(&d.image);
    /* At 1/4 it is rounded out to whole scaled pixels, and the last scaled
     * column (source 60) stands for one source pixel: 61 = 15 * 4 + 1. */
    req = (visc_decode_request){{17, 9, 44, 11}, 4};
    CHECK(visc_image_decode_request(buf, size, &req, &d) == 0);
    CHECK(d.covers.x == 16 && d.covers.y == 8 && d.covers.w == 45 && d.covers.h == 12);
    CHECK(d.image.width == 12 && d.image.height == 3 && d.scale_denom == 4);
    visc_image_free(&d.image);
    /* A region reaching past the image is clipped. */
    req = (visc_decode_request){{50, 40, 100, 100}, 1};
    CHECK(visc_image_decode_request(buf, size, &req, &d) == 0);
    CHECK(d.covers.x == 50 && d.covers.y == 40 && d.covers.w == 11 && d.covers.h == 5);
    visc_image_free(&d.image);
    /* Nothing left, negative sizes and unknown scales are errors. */
    req = (visc_decode_request){{61, 0, 5, 5}, 1};
    CHECK(visc_image_decode_request(buf, size, &req, &d) == -1);
    CHECK(strstr(visc_last_error(), "outside") != NULL);
    req = (visc_decode_request){{0, 0, -5, 5}, 1};
    CHECK(visc_image_decode_request(buf, size, &req, &d) == -1);
    req = (visc_decode_request){{0, 0, 0, 0}, 3};
    CHECK(visc_image_decode_request(buf, size, &req, &d) == -1);
    CHECK(strstr(visc_last_error(), "scale_denom 3") != NULL);
    CHECK(d.image.data == NULL);
    free(buf);
    /* PNG: no scaled decoding; the reply says so and covers the region. */
    buf = read_image("rgb.png", &size);
    if (!buf) return;
    req = (visc_decode_request){{3, 4, 5, 6}, 8};
    CHECK(visc_image_decode_request(buf, size, &req, &d) == 0);
    CHECK(d.scale_denom == 1 && d.covers.x == 3 && d.covers.w == 5 && d.image.width == 5);
    visc_image_free(&d.image);
    free(buf);
}

/* ---- restart markers: libjpeg writes the same coefficients with and
 * without them, so both files must decode to the same pixels ---- */
static uint8_t *encode_jpeg(const uint8_t *rgb, int w, int h, int components, int restart_mcus,
                            unsigned long *size) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    unsigned char *out = NULL;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &out, size);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = components;
    c.in_color_space = components == 3 ? JCS_RGB : JCS_UNKNOWN;
    jpeg_set_defaults(&c);
    if (components != 3) jpeg_set_colorspace(&c, JCS_UNKNOWN);
    jpeg_set_quality(&c, 85, TRUE);
    c.restart_interval = (unsigned)restart_mcus;
    jpeg_start_compress(&c, TRUE);
    for (int y = 0; y < h; y++) {
        JSAMPROW row = (JSAMPROW)(rgb + (size_t)y * w * components);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return out;
}

TEST(restart_markers) {
    const int w = 83, h = 51;
    uint8_t *rgb = malloc((size_t)w * h * 3);
    visc_rng rng = visc_rng_make(7, 0, 0);
    for (int i = 0; i < w * h * 3; i++)
        rgb[i] = (uint8_t)(i % 3 == 0 ? (uint32_t)(i / 3 % w * 3) : visc_rng_u32(&rng));
    unsigned long n_plain, n_rst;
    uint8_t *plain = encode_jpeg(rgb, w, h, 3, 0, &n_plain);
    uint8_t *rst = encode_jpeg(rgb, w, h, 3, 1, &n_rst);
    int markers = 0;
    for (unsigned long i = 0; i + 1 < n_rst; i++)
        markers += rst[i] == 0xff && (rst[i + 1] & 0xf8) == 0xd0;
    CHECK_MSG(markers >= 20, "only %d restart markers", markers);
    for (int s = 1; s <= 8; s *= 2) {
        visc_decode_request req = {{0, 0, 0, 0}, s};
        visc_decoded a, b;
        CHECK(visc_image_decode_request(plain, n_plain, &req, &a) == 0);
        CHECK(visc_image_decode_request(rst, n_rst, &req, &b) == 0);
        CHECK(a.image.width == b.image.width && a.image.height == b.image.height);
        CHECK(memcmp(a.image.data, b.image.data, (size_t)a.image.height * a.image.stride) == 0);
        visc_image_free(&a.image);
        visc_image_free(&b.image);
    }
    check_random_regions("restart", rst, n_rst, 12, 3);
    /* Cut in the middle of the entropy-coded data: an error, not grey rows. */
    visc_image img;
    CHECK(visc_image_decode(rst, n_rst * 2 / 3, &img) == -1);
    CHECK(strstr(visc_last_error(), "truncated") != NULL);
    free(plain);
    free(rst);
    free(rgb);
}

/* ---- bad input: -1 with a clear line, never a crash ---- */
static void expect_error(const char *what, const uint8_t *buf, size_t size, const char *needle) {
    visc_image img = {(uint8_t *)1, 1, 1, 1}; /* must be cleared on failure */
    int rc = visc_image_decode(buf, size, &img);
    CHECK_MSG(rc == -1, "%s: decoded (%dx%d)", what, img.width, img.height);
    if (rc == 0) visc_image_free(&img);
    CHECK_MSG(rc != -1 || img.data == NULL, "%s: output not cleared", what);
    const char *msg = visc_last_error();
    CHECK_MSG(!needle || strstr(msg, needle), "%s: message \"%s\" lacks \"%s\"", what, msg, needle);
    CHECK_MSG(!strchr(msg, '\n'), "%s: message has a newline: \"%s\"", what, msg);
}

TEST(empty_and_non_images) {
    uint8_t junk[256];
    visc_rng rng = visc_rng_make(11, 0, 0);
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)visc_rng_u32(&rng);
    junk[0] = 0x00;
    expect_error("zero bytes", junk, 0, "empty");
    expect_error("NULL", NULL, 0, "empty");
    expect_error("random bytes", junk, sizeof junk, "unknown format");
    expect_error("GIF", (const uint8_t *)"GIF89a\1\0\1\0", 10, "not JPEG or PNG");
    expect_error("text-mode PNG", (const uint8_t *)"\x89PNG\n\x1a\n\0\0\0\rIHDR", 16, "PNG");
    expect_error("JPEG magic only", (const uint8_t *)"\xff\xd8\xff", 3, NULL);
    expect_error("PNG magic only", (const uint8_t *)"\x89PNG\r\n\x1a\n", 8, "truncated");
    int w, h;
    CHECK(visc_image_info(junk, sizeof junk, &w, &h) == -1);
    CHECK(visc_image_info((const uint8_t *)"\xff\xd8\xff\xe0", 4, &w, &h) == -1);
}

TEST(truncated_files) {
    /* Every cut of a JPEG fails, down to a missing EOI marker; a PNG fails
     * for every cut before the end of its image data. */
    static const char *jpegs[] = {"gray.jpg", "progressive.jpg", "cmyk.jpg"};
    for (size_t f = 0; f < 3; f++) {
        size_t size;
        uint8_t *buf = read_image(jpegs[f], &size);
        if (!buf) continue;
        int decoded = 0;
        for (size_t cut = 0; cut < size; cut += cut < 700 ? 1 : 7) {
            visc_image img;
            if (visc_image_decode(buf, cut, &img) == 0) {
                decoded++;
                visc_image_free(&img);
            }
        }
        CHECK_MSG(decoded == 0, "%s: %d cuts decoded", jpegs[f], decoded);
        expect_error(jpegs[f], buf, size - 2, "truncated JPEG");
        free(buf);
    }
    static const char *pngs[] = {"rgb.png", "interlaced.png", "palette_trns.png"};
    for (size_t f = 0; f < 3; f++) {
        size_t size;
        uint8_t *buf = read_image(pngs[f], &size);
        if (!buf) continue;
        size_t iend = size - 12; /* the last chunk: length, "IEND", CRC */
        CHECK(memcmp(buf + iend + 4, "IEND", 4) == 0);
        int decoded = 0;
        for (size_t cut = 0; cut < iend; cut++) {
            visc_image img;
            if (visc_image_decode(buf, cut, &img) == 0) {
                decoded++;
                visc_image_free(&img);
            }
        }
        CHECK_MSG(decoded == 0, "%s: %d cuts decoded", pngs[f], decoded);
        expect_error(pngs[f], buf, iend - 1, "truncated PNG");
        free(buf);
    }
}

/* Offset of the first marker `m` (0xff m) in a JPEG, or 0. */
static size_t find_marker(const uint8_t *buf, size_t size, uint8_t m) {
    for (size_t i = 2; i + 1 < size; i++)
        if (buf[i] == 0xff && buf[i + 1] == m) return i;
    return 0;
}

TEST(corrupt_headers) {
    size_t size;
    uint8_t *jpg = read_image("rgb422.jpg", &size);
    if (!jpg) return;
    uint8_t *bad = malloc(size);
    size_t sof = find_marker(jpg, size, 0xc0), dht = find_marker(jpg, size, 0xc4);
    CHECK(sof && dht);
    /* SOF: FF C0, length(2), precision, height(2), width(2), components */
    memcpy(bad, jpg, size);
    bad[sof + 4] = 12;
    expect_error("12-bit precision", bad, size, "precision");
    memcpy(bad, jpg, size);
    bad[sof + 5] = bad[sof + 6] = 0;
    expect_error("zero height", bad, size, "JPEG");
    memcpy(bad, jpg, size);
    bad[sof + 5] = bad[sof + 6] = bad[sof + 7] = bad[sof + 8] = 0xff;
    expect_error("65535 x 65535 header", bad, size, "Maximum supported image dimension");
    memcpy(bad, jpg, size);
    bad[sof + 5] = bad[sof + 7] = 0xea; /* 60000 x 60000: within libjpeg's limits, not ours */
    bad[sof + 6] = bad[sof + 8] = 0x60;
    expect_error("60000 x 60000 header", bad, size, "exceeds the limit");
    memcpy(bad, jpg, size);
    memset(bad + dht + 5, 0xff, 16); /* Huffman code counts summing past 256 */
    expect_error("bogus Huffman table", bad, size, "Huffman");
    memcpy(bad, jpg, size);
    bad[2] = 0x00; /* FF D8 FF then a non-marker */
    expect_error("damaged marker", bad, size, "JPEG");
    free(bad);

    /* The pixel limit applies before anything is allocated. */
    visc_image_set_max_pixels(61 * 45 - 1);
    expect_error("over the pixel limit", jpg, size, "exceeds the limit of 2744 pixels");
    visc_image_set_max_pixels(61 * 45);
    visc_image img;
    CHECK(visc_image_decode(jpg, size, &img) == 0);
    visc_image_free(&img);
    visc_image_set_max_pixels((int64_t)1 << 28);
    free(jpg);

    uint8_t *png = read_image("rgb.png", &size);
    if (!png) return;
    bad = malloc(size);
    memcpy(bad, png, size);
    bad[20] ^= 0x01; /* IHDR height, CRC left stale */
    expect_error("IHDR CRC", bad, size, "CRC");
    /* IHDR 100000 x 100000 with a valid CRC: the pixel limit speaks. */
    memcpy(bad, png, size);
    const uint8_t huge[8] = {0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0};
    memcpy(bad + 16, huge, 8);
    uint32_t crc = (uint32_t)crc32(0, bad + 12, 17);
    for (int i = 0; i < 4; i++) bad[29 + i] = (uint8_t)(crc >> (24 - 8 * i));
    expect_error("100000 x 100000 PNG", bad, size, "exceeds the limit");
    memcpy(bad, png, size);
    bad[size - 20] ^= 0x40; /* inside IDAT: CRC mismatch */
    expect_error("IDAT CRC", bad, size, "PNG");
    int w, h;
    CHECK(visc_image_info(png, 20, &w, &h) == -1);
    CHECK(strstr(visc_last_error(), "truncated PNG") != NULL);
    free(bad);
    free(png);
}

TEST(unsupported_and_hostile_jpegs) {
    /* Two components (JCS_UNKNOWN): neither PIL nor visc decode it. */
    uint8_t two[16 * 8 * 2];
    for (size_t i = 0; i < sizeof two; i++) two[i] = (uint8_t)(i * 5);
    unsigned long n;
    uint8_t *jpg = encode_jpeg(two, 16, 8, 2, 0, &n);
    expect_error("2-component JPEG", jpg, n, "unsupported color space (2 components)");
    free(jpg);
    /* A progressive file whose last scan repeats 2000 times: libjpeg only
     * warns about the bogus progression, so without the scan limit the
     * decode of a few hundred kB would run for a long time. */
    size_t size;
    uint8_t *prog = read_image("progressive.jpg", &size);
    if (!prog) return;
    size_t sos = 0;
    for (size_t i = 2; i + 1 < size; i++)
        if (prog[i] == 0xff && prog[i + 1] == 0xda) sos = i;
    CHECK(sos > 0 && prog[size - 2] == 0xff && prog[size - 1] == 0xd9);
    const size_t scan = size - 2 - sos, reps = 2000;
    uint8_t *many = malloc(size + reps * scan);
    memcpy(many, prog, size - 2);
    for (size_t r = 0; r < reps; r++) memcpy(many + size - 2 + r * scan, prog + sos, scan);
    memcpy(many + size - 2 + reps * scan, prog + size - 2, 2);
    expect_error("2000 scans", many, size + reps * scan, "scans");
    free(many);
    free(prog);
}

TEST(random_damage_never_crashes) {
    /* Flipped bytes anywhere: decode or fail cleanly (ASan/UBSan in CI
     * check the "cleanly"); fuzz/fuzz_decode.c does this at length. */
    static const char *files[] = {"rgb422.jpg",  "progressive.jpg", "cmyk.jpg",
                                  "palette.png", "interlaced.png",  "rgba16.png"};
    visc_rng rng = visc_rng_make(5, 0, 0);
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        size_t size;
        uint8_t *buf = read_image(files[f], &size);
        if (!buf) continue;
        uint8_t *bad = malloc(size);
        for (int k = 0; k < 150; k++) {
            memcpy(bad, buf, size);
            int flips = 1 + (int)visc_rng_below(&rng, 4);
            for (int i = 0; i < flips; i++)
                bad[visc_rng_below(&rng, (uint32_t)size)] ^=
                    (uint8_t)(1 + visc_rng_below(&rng, 255));
            visc_decode_request req = {{(int)visc_rng_below(&rng, 40),
                                        (int)visc_rng_below(&rng, 30), 9, 7},
                                       1 << visc_rng_below(&rng, 4)};
            visc_decoded d;
            if (visc_image_decode_request(bad, size, k % 2 ? &req : NULL, &d) == 0) {
                CHECK(d.image.width > 0 && d.image.height > 0 && d.image.data);
                visc_image_free(&d.image);
            } else {
                CHECK(visc_last_error()[0] != 0);
            }
        }
        free(bad);
        free(buf);
    }
}

/* ---- visc_decode_options: M/8 scales, fast IDCT, whole_file ---- */

/* Random regions at scale m/8 against the full decode at m/8: geometry as
 * image.h states it (in lowest terms num/den) and equal pixels. */
static void check_eighths(const char *what, const uint8_t *buf, size_t size, int m, int count,
                          uint64_t seed) {
    int w, h;
    if (visc_image_info(buf, size, &w, &h)) {
        CHECK_MSG(0, "%s: %s", what, visc_last_error());
        return;
    }
    visc_decode_options all = {{0, 0, 0, 0}, m, 8, 0, 0, NULL, 0};
    visc_decoded full;
    if (visc_image_decode_ex(buf, size, &all, &full)) {
        CHECK_MSG(0, "%s %d/8: %s", what, m, visc_last_error());
        return;
    }
    const int png = visc_image_sniff(buf, size) == VISC_IMAGE_PNG;
    int num = m, den = 8;
    while (num % 2 == 0 && den % 2 == 0) num /= 2, den /= 2;
    if (png) num = den = 1;
    CHECK_MSG(full.scale_num == num && full.scale_denom == den, "%s %d/8: answered %d/%d", what, m,
              full.scale_num, full.scale_denom);
    CHECK_MSG(full.image.width == (int)(((int64_t)w * num + den - 1) / den) &&
                  full.image.height == (int)(((int64_t)h * num + den - 1) / den),
              "%s %d/8: %dx%d from %dx%d", what, m, full.image.width, full.image.height, w, h);
    visc_rng rng = visc_rng_make(seed, 1, (uint64_t)m);
    for (int k = 0; k < count; k++) {
        visc_decode_options o = all;
        o.region.x = (int)visc_rng_below(&rng, (uint32_t)w);
        o.region.y = (int)visc_rng_below(&rng, (uint32_t)h);
        o.region.w = 1 + (int)visc_rng_below(&rng, (uint32_t)(w - o.region.x));
        o.region.h = 1 + (int)visc_rng_below(&rng, (uint32_t)(h - o.region.y));
        o.whole_file = k % 2;
        visc_decoded d;
        if (visc_image_decode_ex(buf, size, &o, &d)) {
            CHECK_MSG(0, "%s %d/8: %s", what, m, visc_last_error());
            continue;
        }
        const visc_rect c = d.covers, r = o.region;
        CHECK_MSG(c.x <= r.x && c.y <= r.y && c.x + c.w >= r.x + r.w && c.y + c.h >= r.y + r.h &&
                      c.x % den == 0 && c.y % den == 0 && c.x + c.w <= w && c.y + c.h <= h,
                  "%s %d/8: covers %dx%d+%d+%d for region %dx%d+%d+%d", what, m, c.w, c.h, c.x, c.y,
                  r.w, r.h, r.x, r.y);
        CHECK_MSG(d.image.width == (int)(((int64_t)c.w * num + den - 1) / den) &&
                      d.image.height == (int)(((int64_t)c.h * num + den - 1) / den),
                  "%s %d/8: image %dx%d for covers %dx%d", what, m, d.image.width, d.image.height,
                  c.w, c.h);
        const int ox = c.x / den * num, oy = c.y / den * num;
        int bad = 0;
        for (int y = 0; y < d.image.height && !bad; y++)
            if (oy + y >= full.image.height || ox + d.image.width > full.image.width ||
                memcmp(d.image.data + (size_t)y * d.image.stride,
                       full.image.data + (size_t)(oy + y) * full.image.stride + 3 * (size_t)ox,
                       3 * (size_t)d.image.width) != 0)
                bad = y + 1;
        CHECK_MSG(!bad, "%s %d/8: row %d of region %dx%d+%d+%d differs from the full decode", what,
                  m, bad - 1, r.w, r.h, r.x, r.y);
        visc_image_free(&d.image);
    }
    visc_image_free(&full.image);
}

TEST(eighths_scales_regions_equal_full_decode) {
    static const char *small[] = {"rgb422.jpg", "rgb444.jpg", "progressive.jpg",
                                  "cmyk.jpg",   "gray.jpg",   "rgb.png"};
    for (size_t i = 0; i < sizeof small / sizeof *small; i++) {
        size_t size;
        uint8_t *buf = read_image(small[i], &size);
        CHECK_MSG(buf != NULL, "cannot read %s", small[i]);
        for (int m = 1; buf && m <= 16; m++) check_eighths(small[i], buf, size, m, 6, 10 + i);
        free(buf);
    }
    size_t size;
    uint8_t *buf = visc_test_read_file(IMAGENET_DIR "/n01644373_tree_frog.JPEG", &size);
    CHECK_MSG(buf != NULL, "cannot read the tree frog");
    for (int m = 3; buf && m <= 8; m++) check_eighths("tree frog", buf, size, m, 3, 7);
    free(buf);
}

TEST(decode_options_errors_and_old_requests) {
    size_t size;
    uint8_t *buf = visc_test_read_file(IMAGENET_DIR "/n01440764_tench.JPEG", &size);
    CHECK_MSG(buf != NULL, "cannot read the tench");
    if (!buf) return;
    visc_decoded d;
    static const int bad[][2] = {{3, 4}, {17, 8}, {-1, 8}, {2, 3}, {1, 16}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        visc_decode_options o = {{0, 0, 0, 0}, bad[i][0], bad[i][1], 0, 0, NULL, 0};
        CHECK_MSG(visc_image_decode_ex(buf, size, &o, &d) == -1, "scale %d/%d accepted", bad[i][0],
                  bad[i][1]);
        CHECK(strstr(visc_last_error(), "M/8") != NULL);
    }
    /* {region, d} as a request and as options {region, 1, d}: the same reply */
    visc_decode_request req = {{40, 30, 200, 100}, 4};
    visc_decode_options o = {{40, 30, 200, 100}, 1, 4, 0, 0, NULL, 0};
    visc_decoded a;
    CHECK(visc_image_decode_request(buf, size, &req, &a) == 0);
    CHECK(visc_image_decode_ex(buf, size, &o, &d) == 0);
    CHECK(a.scale_num == 1 && d.scale_num == 1 && a.scale_denom == 4 && d.scale_denom == 4);
    CHECK(memcmp(&a.covers, &d.covers, sizeof a.covers) == 0);
    CHECK(a.image.width == d.image.width && a.image.height == d.image.height &&
          memcmp(a.image.data, d.image.data, (size_t)a.image.height * a.image.stride) == 0);
    visc_image_free(&a.image);
    visc_image_free(&d.image);
    /* 2/8 and 1/4 are the same scale */
    o = (visc_decode_options){{0, 0, 0, 0}, 2, 8, 0, 0, NULL, 0};
    CHECK(visc_image_decode_ex(buf, size, &o, &d) == 0 && d.scale_num == 1 && d.scale_denom == 4);
    visc_image_free(&d.image);
    free(buf);
}

TEST(fast_idct_is_close_and_whole_file_finds_truncation) {
    size_t size;
    uint8_t *buf = visc_test_read_file(IMAGENET_DIR "/n02096051_Airedale.JPEG", &size);
    CHECK_MSG(buf != NULL, "cannot read the Airedale");
    if (!buf) return;
    /* fast: same geometry, pixels within a few levels. At 8/8 it differs
     * from PIL's; at other scales libjpeg-turbo already upsamples chroma
     * inside its scaled IDCTs (no fancy upsampling step), which have no
     * fast variant: the same pixels. */
    for (int m = 4; m <= 8; m += 2) {
        visc_decode_options o = {{0, 0, 0, 0}, m, 8, 0, 0, NULL, 0};
        visc_decoded a, f;
        CHECK(visc_image_decode_ex(buf, size, &o, &a) == 0);
        o.fast = 1;
        CHECK(visc_image_decode_ex(buf, size, &o, &f) == 0);
        CHECK(a.image.width == f.image.width && a.image.height == f.image.height);
        double mad = 0;
        size_t n = (size_t)a.image.height * a.image.stride, differ = 0;
        for (size_t i = 0; i < n && a.image.width == f.image.width; i++) {
            int dv = abs((int)a.image.data[i] - (int)f.image.data[i]);
            mad += dv;
            differ += dv != 0;
        }
        mad /= (double)n;
        CHECK_MSG(mad < 2.0, "fast decode at %d/8: mean |diff| %.2f levels", m, mad);
        if (m == 8) CHECK_MSG(differ > 0, "fast decode at 8/8 gave PIL's pixels: no effect");
        visc_image_free(&a.image);
        visc_image_free(&f.image);
    }
    /* a file cut at 60%, a region in its top rows: only whole_file notices */
    visc_decode_options o = {{10, 10, 50, 40}, 1, 1, 0, 0, NULL, 0};
    visc_decoded d;
    CHECK(visc_image_decode_ex(buf, size * 6 / 10, &o, &d) == 0);
    visc_image_free(&d.image);
    o.whole_file = 1;
    CHECK(visc_image_decode_ex(buf, size * 6 / 10, &o, &d) == -1);
    CHECK(strstr(visc_last_error(), "truncated") != NULL);
    /* cut at 60% but ending with EOI: a full decode accepts it (libjpeg
     * only warns), and so does the region read with whole_file */
    uint8_t *cut = malloc(size * 6 / 10 + 2);
    memcpy(cut, buf, size * 6 / 10);
    cut[size * 6 / 10] = 0xFF;
    cut[size * 6 / 10 + 1] = 0xD9;
    visc_image img;
    CHECK(visc_image_decode(cut, size * 6 / 10 + 2, &img) == 0);
    visc_image_free(&img);
    CHECK(visc_image_decode_ex(cut, size * 6 / 10 + 2, &o, &d) == 0);
    visc_image_free(&d.image);
    free(cut);
    /* whole_file on an intact file: the same pixels as without */
    visc_decoded a;
    CHECK(visc_image_decode_ex(buf, size, &o, &d) == 0);
    o.whole_file = 0;
    CHECK(visc_image_decode_ex(buf, size, &o, &a) == 0);
    CHECK(a.image.height == d.image.height &&
          memcmp(a.image.data, d.image.data, (size_t)a.image.height * a.image.stride) == 0);
    visc_image_free(&a.image);
    visc_image_free(&d.image);
    free(buf);
}

TEST(decode_into_caller_buffer_equals_allocated) {
    /* visc_decode_options.into: the same pixels and geometry as an
     * allocated reply, with the image inside the caller's buffer (its
     * stride may be wider); a buffer too small, and CMYK, fall back to an
     * allocation. */
    static const char *small[] = {"rgb422.jpg", "rgb444.jpg", "progressive.jpg", "cmyk.jpg",
                                  "gray.jpg"};
    size_t cap = 4 << 20;
    uint8_t *into = malloc(cap);
    int borrowed = 0;
    for (size_t i = 0; i < sizeof small / sizeof *small + 2; i++) {
        size_t size;
        uint8_t *buf = NULL;
        if (i < sizeof small / sizeof *small) {
            buf = read_image(small[i], &size);
        } else {
            buf = visc_test_read_file(i == sizeof small / sizeof *small
                                          ? IMAGENET_DIR "/n01644373_tree_frog.JPEG"
                                          : IMAGENET_DIR "/n01440764_tench.JPEG",
                                      &size);
        }
        CHECK_MSG(buf != NULL, "cannot read image %zu", i);
        int w, h;
        if (!buf || visc_image_info(buf, size, &w, &h)) {
            free(buf);
            continue;
        }
        visc_rng rng = visc_rng_make(31, 2, i);
        for (int k = 0; k < 12; k++) {
            visc_decode_options o =
                {{0, 0, 0, 0}, k % 3 == 2 ? 5 : 1, k % 3 == 2 ? 8 : 1, 0, k % 2, NULL, 0};
            o.region.x = (int)visc_rng_below(&rng, (uint32_t)w);
            o.region.y = (int)visc_rng_below(&rng, (uint32_t)h);
            o.region.w = 1 + (int)visc_rng_below(&rng, (uint32_t)(w - o.region.x));
            o.region.h = 1 + (int)visc_rng_below(&rng, (uint32_t)(h - o.region.y));
            if (k == 0) o.region = (visc_rect){0, 0, 0, 0};
            visc_decoded a, b;
            if (visc_image_decode_ex(buf, size, &o, &a)) {
                CHECK_MSG(0, "image %zu: %s", i, visc_last_error());
                continue;
            }
            CHECK(a.borrowed == 0);
            o.into = into;
            o.into_size = k == 5 ? 16 : cap; /* 16 bytes: never enough */
            if (visc_image_decode_ex(buf, size, &o, &b)) {
                CHECK_MSG(0, "image %zu into: %s", i, visc_last_error());
                visc_image_free(&a.image);
                continue;
            }
            const int cmyk = i == 3;
            CHECK_MSG(b.borrowed == (k != 5 && !cmyk), "image %zu case %d: borrowed %d", i, k,
                      b.borrowed);
            if (b.borrowed)
                CHECK(b.image.data >= into &&
                      b.image.data + (size_t)(b.image.height - 1) * b.image.stride +
                              3 * (size_t)b.image.width <=
                          into + cap);
            borrowed += b.borrowed;
            CHECK(a.image.width == b.image.width && a.image.height == b.image.height &&
                  memcmp(&a.covers, &b.covers, sizeof a.covers) == 0 &&
                  a.scale_num == b.scale_num && a.scale_denom == b.scale_denom);
            int bad = 0;
            for (int y = 0; y < a.image.height && y < b.image.height && !bad; y++)
                bad = memcmp(a.image.data + (size_t)y * a.image.stride,
                             b.image.data + (size_t)y * b.image.stride,
                             3 * (size_t)a.image.width) != 0;
            CHECK_MSG(!bad, "image %zu case %d: pixels differ when decoded into a buffer", i, k);
            visc_image_free(&a.image);
            if (!b.borrowed) visc_image_free(&b.image);
        }
        free(buf);
    }
    CHECK(borrowed > 40);
    free(into);
}

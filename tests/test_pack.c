/* test_pack.c: packed shards read back exactly (raw, as-is) or closely
 * (re-encoded), and corrupt packs fail with a clear error. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "visc/core.h"
#include "visc/image.h"
#include "visc/io.h"
#include "visc/loader.h"
#include "visc/transforms.h"

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}
static void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* 20 images of each CIFAR-10 class, copied into a temp ImageFolder. */
static char *make_source(void) {
    char tmpl[] = "/tmp/visc_test_pack_XXXXXX";
    if (!mkdtemp(tmpl)) return NULL;
    const char *root = "../shared/data/cifar10/train";
    if (access(root, R_OK) != 0) root = "/work/shared/data/cifar10/train";
    visc_file_list all;
    if (visc_scan_imagefolder(&all, root)) return NULL;
    visc_file_list_subset(&all, 20, 0, 0);
    for (int64_t i = 0; i < all.count; i++) {
        char src[1024], dst[1024];
        visc_file_list_path(&all, i, src, sizeof src);
        snprintf(dst, sizeof dst, "%s/%s", tmpl, visc_file_list_name(&all, i));
        char *slash = strrchr(dst, '/');
        *slash = 0;
        visc_mkdirs(dst);
        *slash = '/';
        size_t n;
        uint8_t *b = visc_test_read_file(src, &n);
        const void *parts[1] = {b};
        visc_write_file_atomic(dst, parts, &n, 1);
        free(b);
    }
    visc_file_list_free(&all);
    return visc_strdup(tmpl);
}

static char *src_dir;
static visc_file_list src_list;

static int setup(void) {
    if (src_dir) return 0;
    src_dir = make_source();
    return src_dir && visc_scan_imagefolder(&src_list, src_dir) == 0 ? 0 : -1;
}

static void pack_to(const char *name, const visc_pack_options *o, char *out, size_t size) {
    snprintf(out, size, "%s.%s", src_dir, name);
    CHECK(visc_pack_write(&src_list, out, o) == 0);
}

static void decode_source(int64_t i, visc_image *img) {
    char path[1024];
    size_t n = 0;
    visc_file_list_path(&src_list, i, path, sizeof path);
    uint8_t *b = visc_test_read_file(path, &n);
    CHECK(visc_image_decode(b, n, img) == 0);
    free(b);
}

TEST(pack_as_is_and_raw_read_back_exactly) {
    CHECK(setup() == 0);
    if (!src_dir) return;
    CHECK(src_list.count == 200 && src_list.num_classes == 10);
    visc_pack_options o;
    visc_pack_options_default(&o);
    o.shard_bytes = 64 * 1024; /* several shards */
    char dir[1024], rawdir[1024];
    pack_to("asis", &o, dir, sizeof dir);
    o.raw = 1;
    pack_to("raw", &o, rawdir, sizeof rawdir);
    visc_pack p, r;
    CHECK(visc_pack_open(&p, dir) == 0);
    CHECK(visc_pack_open(&r, rawdir) == 0);
    CHECK(p.count == 200 && r.count == 200 && p.num_shards > 1 && r.raw == 1 && p.raw == 0);
    for (int64_t i = 0; i < p.count && i < 200; i++) {
        CHECK(p.records[i].label == src_list.labels[i] && r.records[i].label == src_list.labels[i]);
        CHECK(strcmp(p.names + p.records[i].name_off, visc_file_list_name(&src_list, i)) == 0);
        char path[1024];
        size_t n = 0, m = 0;
        visc_file_list_path(&src_list, i, path, sizeof path);
        uint8_t *want = visc_test_read_file(path, &n);
        const uint8_t *got;
        CHECK(visc_pack_bytes(&p, i, &got, &m) == 0 && m == n && memcmp(got, want, n) == 0);
        free(want);
        visc_image img;
        decode_source(i, &img);
        CHECK(visc_pack_bytes(&r, i, &got, &m) == 0);
        CHECK((int)r.records[i].width == img.width && (int)r.records[i].height == img.height);
        int same = m == (size_t)img.width * img.height * 3;
        for (int y = 0; same && y < img.height; y++)
            same = memcmp(got + (size_t)y * img.width * 3, img.data + (size_t)y * img.stride,
                          (size_t)img.width * 3) == 0;
        CHECK(same);
        visc_image_free(&img);
    }
    for (int c = 0; c < 10; c++) CHECK(strcmp(p.class_names[c], src_list.class_names[c]) == 0);
    visc_pack_close(&p);
    visc_pack_close(&r);
    rm_tree(dir);
    rm_tree(rawdir);
}

TEST(pack_resized_jpeg_is_close) {
    CHECK(setup() == 0);
    if (!src_dir) return;
    visc_pack_options o;
    visc_pack_options_default(&o);
    o.shorter_side = 16;
    o.quality = 95;
    char dir[1024];
    pack_to("small", &o, dir, sizeof dir);
    visc_pack p;
    CHECK(visc_pack_open(&p, dir) == 0);
    double total = 0;
    size_t values = 0;
    for (int64_t i = 0; i < p.count; i += 7) {
        const uint8_t *got;
        size_t m;
        visc_image src, want, dec;
        CHECK(visc_pack_bytes(&p, i, &got, &m) == 0);
        CHECK(visc_image_decode(got, m, &dec) == 0);
        decode_source(i, &src);
        CHECK(dec.width == 16 && dec.height == 16);
        visc_transform_image_alloc(&want, 16, 16);
        visc_resize(&src, NULL, VISC_INTERP_BILINEAR, &want);
        for (int y = 0; y < 16; y++)
            for (int x = 0; x < 48; x++) {
                total += abs((int)dec.data[(size_t)y * dec.stride + x] -
                             (int)want.data[(size_t)y * want.stride + x]);
                values++;
            }
        visc_transform_image_free(&want);
        visc_image_free(&src);
        visc_image_free(&dec);
    }
    /* JPEG q95 of 16x16 content: a few levels off on average, not 20 */
    CHECK_MSG(total / (double)values < 4.0, "mean abs error %.2f", total / (double)values);
    visc_pack_close(&p);
    rm_tree(dir);
}

static void corrupt(const char *path, long offset, const char *bytes, int n) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET);
    fwrite(bytes, 1, (size_t)n, f);
    fclose(f);
}

TEST(pack_corruption_is_a_clear_error) {
    CHECK(setup() == 0);
    if (!src_dir) return;
    visc_pack_options o;
    visc_pack_options_default(&o);
    char dir[1024], path[1100];
    pack_to("bad", &o, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/index.bin", dir);
    size_t n = 0;
    uint8_t *orig = visc_test_read_file(path, &n);
    visc_pack p;
    /* every truncation and many bit flips of the index are refused */
    for (size_t len = 0; len < n; len += 1 + len / 8)
        CHECK(visc_pack_parse_index(&p, orig, len) == -1);
    uint8_t *copy = malloc(n);
    for (size_t i = 0; i < n; i += 3) {
        memcpy(copy, orig, n);
        copy[i] ^= 0x10;
        CHECK(visc_pack_parse_index(&p, copy, n) == -1);
    }
    free(copy);
    corrupt(path, 100, "\xff\xff", 2);
    CHECK(visc_pack_open(&p, dir) == -1);
    CHECK(strstr(visc_last_error(), "checksum") != NULL);
    CHECK(strstr(visc_last_error(), "index.bin") != NULL);
    const void *parts[1] = {orig};
    visc_write_file_atomic(path, parts, &n, 1);
    CHECK(visc_pack_open(&p, dir) == 0);
    visc_pack_close(&p);
    /* a flipped byte in a shard: that one sample is bad, with its name */
    snprintf(path, sizeof path, "%s/shard-00000.bin", dir);
    corrupt(path, 2000, "\x00\x01\x02", 3);
    CHECK(visc_pack_open(&p, dir) == 0);
    int bad = 0;
    for (int64_t i = 0; i < p.count; i++) {
        const uint8_t *d;
        size_t m;
        if (visc_pack_bytes(&p, i, &d, &m)) {
            bad++;
            CHECK(strstr(visc_last_error(), "checksum") != NULL);
        }
    }
    CHECK(bad >= 1 && bad <= 2);
    visc_pack_close(&p);
    /* a truncated shard: refused at open */
    CHECK(truncate(path, 1000) == 0);
    CHECK(visc_pack_open(&p, dir) == -1);
    CHECK(strstr(visc_last_error(), "shard-00000.bin") != NULL);
    free(orig);
    rm_tree(dir);
}

TEST(pack_dataset_matches_folder_dataset) {
    CHECK(setup() == 0);
    if (!src_dir) return;
    visc_pack_options o;
    visc_pack_options_default(&o);
    char dir[1024], spec[1100];
    pack_to("ds", &o, dir, sizeof dir);
    visc_transform_config tc;
    CHECK(visc_transform_preset("torchvision", 24, &tc) == 0);
    visc_sample_pipeline pl;
    CHECK(visc_transform_pipeline(&tc, &pl) == 0);
    snprintf(spec, sizeof spec, "pack:%s", dir);
    visc_dataset *dp = visc_image_dataset_open(spec, 1, &pl);
    visc_file_list fl;
    CHECK(visc_scan_imagefolder(&fl, src_dir) == 0);
    visc_dataset *df = visc_image_dataset_from_files(&fl, &pl);
    CHECK(dp && df);
    if (!dp || !df) return;
    CHECK(dp->size == 200 && df->size == 200 && dp->num_classes == 10);
    visc_loader_config c =
        {.batch_size = 16, .workers = 2, .shuffle = 1, .train = 1, .seed = 5, .world = 1};
    visc_loader *lp = visc_loader_new(dp, &c), *lf = visc_loader_new(df, &c);
    visc_loader_start(lp, 1, 0, -1);
    visc_loader_start(lf, 1, 0, -1);
    visc_batch bp, bf;
    int nb = 0;
    while (visc_loader_next(lp, &bp) == 1) {
        CHECK(visc_loader_next(lf, &bf) == 1);
        CHECK(bp.count == bf.count);
        CHECK(memcmp(bp.y, bf.y, sizeof(int32_t) * (size_t)bp.count) == 0);
        /* stored as-is: the same bytes, so the same augmented pixels */
        CHECK_ARRAYS("pack vs folder", bp.x, bf.x, (size_t)bp.count * 3 * 24 * 24, 0, 0);
        nb++;
    }
    CHECK(nb == 13);
    visc_loader_free(lp);
    visc_loader_free(lf);
    visc_dataset_free(dp);
    visc_dataset_free(df);
    rm_tree(dir);
}

TEST(pack_cleanup) {
    if (src_dir) {
        rm_tree(src_dir);
        free(src_dir);
        src_dir = NULL;
        visc_file_list_free(&src_list);
    }
}

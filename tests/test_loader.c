/* test_loader.c: folder scanning, the index cache, the image dataset and
 * the threaded loader (order, sharding, resume, bad samples, shutdown). */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "visc/core.h"
#include "visc/io.h"
#include "visc/loader.h"
#include "visc/transforms.h"
#include "visc/transforms.h"

/* ---- temp folders ---- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}
static void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static char *make_temp_dir(void) {
    char tmpl[] = "/tmp/visc_test_loader_XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? visc_strdup(d) : NULL;
}

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *slash = strrchr(path, '/');
    *slash = 0;
    visc_mkdirs(path);
    *slash = '/';
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* ---- a synthetic dataset: sample i is the constant i (view v: i + 0.5 v) ---- */

typedef struct {
    int bad_mod; /* idx % bad_mod == bad_rem is a bad sample (0: none) */
    int bad_rem;
    int fail_at; /* get() of this index returns -1 (-1: never) */
    int slow;    /* usleep a pseudo-random while */
} synth_cfg;

static int synth_get(const visc_dataset *ds, int64_t idx, const visc_augment *aug, int train,
                     uint64_t seed, int64_t epoch, float *out, int32_t *label) {
    const synth_cfg *c = ds->impl;
    if (c->slow) usleep((useconds_t)((idx * 7919) % 5) * 200);
    if (c->bad_mod && idx % c->bad_mod == c->bad_rem) {
        visc_set_error("sample%lld.jpg: not an image", (long long)idx);
        return VISC_SAMPLE_BAD;
    }
    if (idx == c->fail_at) return visc_set_error("disk on fire at %lld", (long long)idx);
    size_t per = (size_t)ds->channels * ds->height * ds->width;
    int views = ds->views > 1 ? ds->views : 1;
    for (int v = 0; v < views; v++)
        for (size_t k = 0; k < per; k++) out[(size_t)v * per + k] = (float)idx + 0.5f * (float)v;
    *label = (int32_t)(idx % 10);
    return 0;
}

static visc_dataset synth(int64_t n, synth_cfg *c) {
    visc_dataset ds = {.size = n,
                       .channels = 1,
                       .height = 2,
                       .width = 3,
                       .num_classes = 10,
                       .get = synth_get,
                       .impl = c};
    return ds;
}

static visc_loader_config cfg_of(int B, int workers, int world, int rank, int drop_last) {
    visc_loader_config c = {.batch_size = B,
                            .workers = workers,
                            .shuffle = 1,
                            .drop_last = drop_last,
                            .train = 1,
                            .rank = rank,
                            .world = world,
                            .seed = 1234};
    return c;
}

/* Runs one epoch from (batch, pos), appending the indices seen to idx. */
static int64_t run_epoch(visc_loader *l, int64_t epoch, int64_t batch, int64_t pos, int64_t *idx,
                         int64_t *nbatches, int check_values, int B) {
    int64_t n = 0;
    *nbatches = 0;
    if (visc_loader_start(l, epoch, batch, pos)) return -1;
    visc_batch b;
    int rc;
    while ((rc = visc_loader_next(l, &b)) == 1) {
        for (int i = 0; i < b.count; i++) {
            idx[n++] = b.indices[i];
            if (check_values) {
                CHECK(b.y[i] == (int32_t)(b.indices[i] % 10));
                for (int k = 0; k < 6; k++) CHECK(b.x[((size_t)i) * 6 + k] == (float)b.indices[i]);
            }
        }
        CHECK(b.count <= B);
        (*nbatches)++;
    }
    return rc < 0 ? -1 : n;
}

TEST(loader_every_sample_once_across_ranks) {
    synth_cfg sc = {.fail_at = -1, .slow = 1};
    const int64_t N = 103;
    const int B = 8;
    visc_dataset ds = synth(N, &sc);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)N * 2);
    for (int drop = 0; drop <= 1; drop++)
        for (int world = 1; world <= 4; world++) {
            int seen[103] = {0};
            int64_t total = 0, batches0 = -1;
            for (int rank = 0; rank < world; rank++) {
                visc_loader_config c = cfg_of(B, 3, world, rank, drop);
                visc_loader *l = visc_loader_new(&ds, &c);
                int64_t nb;
                int64_t n = run_epoch(l, 2, 0, -1, idx, &nb, 1, B);
                CHECK(n >= 0);
                CHECK(nb == visc_loader_batches(l));
                if (drop) {
                    if (batches0 < 0) batches0 = nb;
                    CHECK_MSG(nb == batches0, "drop_last: rank %d has %lld batches, rank 0 %lld",
                              rank, (long long)nb, (long long)batches0);
                    CHECK(n == nb * B);
                }
                for (int64_t i = 0; i < n; i++) seen[idx[i]]++;
                total += n;
                visc_loader_free(l);
            }
            for (int64_t i = 0; i < N; i++)
                CHECK_MSG(drop ? seen[i] <= 1 : seen[i] == 1,
                          "world %d drop %d: sample %lld seen %d times", world, drop, (long long)i,
                          seen[i]);
            if (drop) CHECK(total == world * ((N / world) / B) * B);
            else CHECK(total == N);
        }
    free(idx);
}

TEST(loader_order_is_fixed_by_seed_and_epoch) {
    synth_cfg sc = {.fail_at = -1, .slow = 1};
    visc_dataset ds = synth(64, &sc);
    int64_t a[64], b[64], c[64], nb;
    visc_loader_config c1 = cfg_of(5, 1, 1, 0, 0), c4 = cfg_of(5, 4, 1, 0, 0);
    c4.prefetch = 3;
    visc_loader *l1 = visc_loader_new(&ds, &c1), *l4 = visc_loader_new(&ds, &c4);
    CHECK(run_epoch(l1, 3, 0, -1, a, &nb, 1, 5) == 64);
    CHECK(run_epoch(l4, 3, 0, -1, b, &nb, 1, 5) == 64);
    CHECK(memcmp(a, b, sizeof a) == 0); /* 1 worker vs 4: same batches */
    CHECK(run_epoch(l4, 4, 0, -1, c, &nb, 1, 5) == 64);
    CHECK(memcmp(a, c, sizeof a) != 0); /* another epoch, another order */
    int64_t want[64];
    visc_epoch_order(want, 64, 1, 1234, 3);
    CHECK(memcmp(a, want, sizeof a) == 0); /* exactly visc_epoch_order */
    visc_loader_free(l1);
    visc_loader_free(l4);
}

TEST(loader_resume_gives_the_remaining_batches) {
    for (int bad = 0; bad <= 1; bad++) {
        synth_cfg sc = {.fail_at = -1, .bad_mod = bad ? 5 : 0, .bad_rem = 2};
        visc_dataset ds = synth(50, &sc);
        visc_loader_config c = cfg_of(4, 2, 2, 1, 0);
        visc_loader *l = visc_loader_new(&ds, &c);
        /* the full epoch, remembering each batch's content and end cursor */
        int64_t full[50][4], ends[50];
        int counts[50], nb = 0;
        visc_loader_start(l, 7, 0, -1);
        visc_batch b;
        while (visc_loader_next(l, &b) == 1) {
            counts[nb] = b.count;
            ends[nb] = b.next_pos;
            CHECK(b.index == nb);
            memcpy(full[nb], b.indices, sizeof(int64_t) * (size_t)b.count);
            nb++;
        }
        CHECK(nb >= 5);
        for (int k = 1; k < nb; k++) {
            /* resume at batch k: without bad samples from k * B alone, with
             * them from the saved cursor */
            visc_loader_start(l, 7, k, bad ? ends[k - 1] : -1);
            int j = k;
            while (visc_loader_next(l, &b) == 1) {
                CHECK(j < nb && b.index == j && b.count == counts[j]);
                if (j < nb && b.count == counts[j])
                    CHECK(memcmp(b.indices, full[j], sizeof(int64_t) * (size_t)b.count) == 0);
                j++;
            }
            CHECK(j == nb);
        }
        visc_loader_free(l);
    }
}

TEST(loader_bad_samples_skip_and_error) {
    synth_cfg sc = {.fail_at = -1, .bad_mod = 7, .bad_rem = 3, .slow = 1};
    visc_dataset ds = synth(70, &sc);
    visc_loader_config c = cfg_of(8, 3, 1, 0, 0);
    visc_loader *l = visc_loader_new(&ds, &c);
    int64_t idx[70], nb;
    int64_t n = run_epoch(l, 0, 0, -1, idx, &nb, 1, 8);
    CHECK(n == 60);
    CHECK(visc_loader_bad_count(l) == 10);
    for (int64_t i = 0; i < n; i++) CHECK(idx[i] % 7 != 3);
    for (int64_t i = 0; i < visc_loader_bad_count(l); i++) {
        char want[64];
        snprintf(want, sizeof want, "sample%lld.jpg", (long long)visc_loader_bad_index(l, i));
        CHECK(strstr(visc_loader_bad_message(l, i), want) != NULL);
    }
    /* batches are refilled: every batch but the last has 8 samples */
    CHECK(nb == 8);
    visc_loader_free(l);

    c.on_bad = VISC_ON_BAD_ERROR;
    l = visc_loader_new(&ds, &c);
    visc_loader_start(l, 0, 0, -1);
    visc_batch b;
    int rc;
    while ((rc = visc_loader_next(l, &b)) == 1) {
    }
    CHECK(rc == -1);
    CHECK(strstr(visc_last_error(), "not an image") != NULL);
    CHECK(strstr(visc_last_error(), ".jpg") != NULL);
    CHECK(visc_loader_next(l, &b) == -1); /* stays failed until restarted */
    CHECK(visc_loader_start(l, 1, 0, -1) == 0);
    visc_loader_free(l);
}

TEST(loader_no_deadlock_on_failure_early_stop_and_tiny_epochs) {
    synth_cfg sc = {.fail_at = 13, .slow = 1};
    visc_dataset ds = synth(40, &sc);
    visc_loader_config c = cfg_of(4, 8, 1, 0, 0);
    c.shuffle = 0;
    visc_loader *l = visc_loader_new(&ds, &c);
    visc_loader_start(l, 0, 0, -1);
    visc_batch b;
    int rc, got = 0;
    while ((rc = visc_loader_next(l, &b)) == 1) got++;
    CHECK(rc == -1 && got == 3); /* batches 0..2, then sample 13 fails */
    CHECK(strstr(visc_last_error(), "disk on fire") != NULL);
    visc_loader_free(l);

    sc.fail_at = -1;
    visc_dataset tiny = synth(5, &sc);
    l = visc_loader_new(&tiny, &c); /* 8 workers, 2 batches */
    for (int e = 0; e < 3; e++) {
        int64_t idx[5], nb;
        CHECK(run_epoch(l, e, 0, -1, idx, &nb, 1, 4) == 5);
        CHECK(nb == 2);
    }
    visc_loader_free(l);

    l = visc_loader_new(&ds, &c); /* stop early: restart and free mid-epoch */
    visc_loader_start(l, 0, 0, -1);
    CHECK(visc_loader_next(l, &b) == 1);
    visc_loader_start(l, 1, 0, -1);
    CHECK(visc_loader_next(l, &b) == 1 && b.indices[0] == 0);
    visc_loader_free(l);
    l = visc_loader_new(&ds, &c); /* freed before anything was read */
    visc_loader_start(l, 0, 0, -1);
    visc_loader_free(l);
}

TEST(loader_multi_view_layout) {
    synth_cfg sc = {.fail_at = -1};
    visc_dataset ds = synth(12, &sc);
    ds.views = 2;
    visc_loader_config c = cfg_of(4, 2, 1, 0, 0);
    visc_loader *l = visc_loader_new(&ds, &c);
    visc_loader_start(l, 0, 0, -1);
    visc_batch b;
    while (visc_loader_next(l, &b) == 1) {
        CHECK(b.views == 2);
        for (int v = 0; v < 2; v++)
            for (int i = 0; i < b.count; i++)
                CHECK(b.x[((size_t)v * 4 + i) * 6 + 5] == (float)b.indices[i] + 0.5f * v);
    }
    visc_loader_free(l);
}

/* Checks batch b of the synthetic data set (C x H x W = 6 floats per view,
 * blocks of B samples per view). */
static void check_batch_values(const visc_batch *b, int B) {
    for (int v = 0; v < b->views; v++)
        for (int i = 0; i < b->count; i++)
            for (int k = 0; k < 6; k++)
                CHECK(b->x[((size_t)v * B + i) * 6 + k] == (float)b->indices[i] + 0.5f * v);
}

TEST(loader_batch_stays_valid_until_the_next_call) {
    /* Batches are handed out from the prefetch ring without a copy: the
     * workers must not write into a delivered batch while the consumer
     * holds it, however long it takes, whatever the views, with or
     * without bad samples (then batches are gathered into another buffer). */
    for (int views = 1; views <= 2; views++)
        for (int bad = 0; bad <= 1; bad++) {
            synth_cfg sc = {.fail_at = -1, .bad_mod = bad ? 6 : 0, .bad_rem = 4};
            visc_dataset ds = synth(60, &sc);
            ds.views = views;
            visc_loader_config c = cfg_of(4, 3, 1, 0, 0);
            c.prefetch = 1;
            visc_loader *l = visc_loader_new(&ds, &c);
            visc_loader_start(l, 2, 0, -1);
            visc_batch b;
            int n = 0, batches = 0;
            float *copy = malloc(sizeof(float) * (size_t)views * 4 * 6);
            while (visc_loader_next(l, &b) == 1) {
                size_t bytes = sizeof(float) * (size_t)views * 4 * 6;
                memcpy(copy, b.x, bytes);
                usleep(2000); /* the workers run ahead as far as they may */
                CHECK_MSG(memcmp(copy, b.x, bytes) == 0,
                          "views %d, bad %d: batch %lld changed while held", views, bad,
                          (long long)b.index);
                check_batch_values(&b, 4);
                CHECK(b.views == views);
                n += b.count;
                batches++;
            }
            CHECK(n == (bad ? 50 : 60));
            CHECK(batches == (bad ? 13 : 15));
            visc_loader_free(l);
            free(copy);
        }
}

/* A loader over 45 synthetic samples, every ninth of them bad (so batches
 * get refilled), `views` per sample, batch 5, 2 workers. */
static visc_loader *refilling_loader(visc_dataset *ds, synth_cfg *sc, int views, int shuffle) {
    *sc = (synth_cfg){.fail_at = -1, .bad_mod = 9, .bad_rem = 1, .slow = 1};
    *ds = synth(45, sc);
    ds->views = views;
    visc_loader_config c = cfg_of(5, 2, 1, 0, 0);
    c.shuffle = shuffle;
    return visc_loader_new(ds, &c);
}

TEST(loader_unaligned_start_and_refills_keep_the_layout) {
    /* A resume in the middle of a batch and bad samples move batches off
     * the ring's batch boundaries; every sample must still land at
     * (v * B + b) * CHW, for one and for two views. */
    for (int views = 1; views <= 2; views++) {
        synth_cfg sc;
        visc_dataset ds;
        visc_loader *l = refilling_loader(&ds, &sc, views, 0);
        for (int64_t pos = 0; pos < 12; pos += 3) {
            visc_loader_start(l, 0, 0, pos);
            visc_batch b;
            int64_t next = pos;
            while (visc_loader_next(l, &b) == 1) {
                check_batch_values(&b, 5);
                for (int i = 0; i < b.count; i++) {
                    while (next % 9 == 1) next++; /* the bad ones are skipped */
                    CHECK(b.indices[i] == next);
                    next++;
                }
            }
            CHECK(next == 45 || next == 46);
        }
        visc_loader_free(l);
    }
}

/* visc_loader_each_buffer's regions, as a GPU caller pins them. */
typedef struct {
    const char *p[4];
    size_t bytes[4];
    int n;
} regions;

static int note_region(void *ctx, void *p, size_t bytes) {
    regions *r = ctx;
    if (r->n == 4) return -1;
    r->p[r->n] = p;
    r->bytes[r->n++] = bytes;
    return 0;
}

static int inside(const regions *r, const void *p, size_t bytes) {
    const char *c = p;
    for (int i = 0; i < r->n; i++)
        if (c >= r->p[i] && c + bytes <= r->p[i] + r->bytes[i]) return 1;
    return 0;
}

static int refuse_second(void *ctx, void *p, size_t bytes) {
    (void)p;
    (void)bytes;
    return ++*(int *)ctx == 2 ? 7 : 0;
}

TEST(loader_batches_lie_in_the_reported_buffers) {
    /* Aligned batches come straight from the ring, refilled ones (bad
     * samples, a resume mid-batch) from the gather buffer: both must be in
     * the memory a GPU caller page-locked, every view of every sample. */
    for (int views = 1; views <= 2; views++) {
        synth_cfg sc;
        visc_dataset ds;
        visc_loader *l = refilling_loader(&ds, &sc, views, 1);
        regions r = {.n = 0};
        CHECK(visc_loader_each_buffer(l, note_region, &r) == 0);
        CHECK(r.n == 2);
        int aligned = 0, gathered = 0;
        for (int64_t pos = 0; pos < 4; pos += 3) {
            visc_loader_start(l, 0, 0, pos);
            visc_batch b;
            while (visc_loader_next(l, &b) == 1) {
                size_t block = (size_t)views * 5 * 6 * sizeof(float);
                CHECK(inside(&r, b.x, block));
                if ((const char *)b.x == r.p[1]) gathered++;
                else aligned++;
            }
        }
        CHECK(aligned > 0 && gathered > 0);
        /* the first non-zero answer stops the walk and is returned */
        int calls = 0;
        CHECK(visc_loader_each_buffer(l, refuse_second, &calls) == 7 && calls == 2);
        visc_loader_free(l);
    }
}

TEST(loader_over_in_memory_dataset_matches_make_batch) {
    int64_t n = 30;
    uint8_t *img = malloc((size_t)n * 3 * 8 * 8);
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n * 192; i++) img[i] = (uint8_t)(i * 31 + 7);
    for (int64_t i = 0; i < n; i++) lab[i] = (int32_t)(i % 4);
    visc_dataset *ds = visc_dataset_from_memory(img, lab, n, 3, 8, 8, 4);
    visc_loader_config c = cfg_of(6, 2, 1, 0, 1);
    c.aug = (visc_augment){.pad_crop = 2,
                           .hflip = 1,
                           .mean = {0.5f, 0.5f, 0.5f},
                           .std = {0.25f, 0.25f, 0.25f}};
    visc_loader *l = visc_loader_new(ds, &c);
    visc_loader_start(l, 5, 0, -1);
    float want[6 * 192];
    int32_t wy[6];
    visc_batch b;
    int nb = 0;
    while (visc_loader_next(l, &b) == 1) {
        CHECK(visc_make_batch(ds, b.indices, b.count, &c.aug, 1, 1234, 5, want, wy) == 0);
        CHECK_ARRAYS("batch", b.x, want, (size_t)b.count * 192, 0, 0);
        CHECK(memcmp(b.y, wy, sizeof(int32_t) * (size_t)b.count) == 0);
        nb++;
    }
    CHECK(nb == 5);
    visc_loader_free(l);
    visc_dataset_free(ds);
}

/* ---- scanning ---- */

TEST(imagefolder_scan_rules) {
    char *d = make_temp_dir();
    CHECK(d != NULL);
    if (!d) return;
    const char *files[] = {"b/2.jpg",    "b/1.JPEG", "b/sub/0.png", "b/a.png",    "b/x.txt",
                           "b/.hid.jpg", "a/z.Png",  "B/k.jpg",     ".cls/q.jpg", "b/sub-1/q.jpg"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) write_file(d, files[i], "x", 1);
    visc_file_list fl;
    CHECK(visc_scan_imagefolder(&fl, d) == 0);
    CHECK(fl.num_classes == 3);
    if (fl.num_classes == 3) {
        CHECK(strcmp(fl.class_names[0], "B") == 0 && strcmp(fl.class_names[1], "a") == 0 &&
              strcmp(fl.class_names[2], "b") == 0);
    }
    /* os.walk order: b's own files sorted, then b/sub, b/sub-1 by folder path */
    const char *want[] = {"B/k.jpg", "a/z.Png",     "b/1.JPEG",     "b/2.jpg",
                          "b/a.png", "b/sub/0.png", "b/sub-1/q.jpg"};
    const int32_t want_label[] = {0, 1, 2, 2, 2, 2, 2};
    CHECK(fl.count == 7);
    for (int64_t i = 0; i < fl.count && i < 7; i++) {
        CHECK_MSG(strcmp(visc_file_list_name(&fl, i), want[i]) == 0, "file %lld: %s, want %s",
                  (long long)i, visc_file_list_name(&fl, i), want[i]);
        CHECK(fl.labels[i] == want_label[i]);
    }
    visc_file_list_free(&fl);

    write_file(d, "empty/readme.txt", "x", 1);
    CHECK(visc_scan_imagefolder(&fl, d) == -1);
    CHECK(strstr(visc_last_error(), "empty") != NULL);
    rm_tree(d);
    free(d);
}

TEST(imagefolder_sort_matches_python_sorted_walk) {
    /* '-' (0x2d) sorts before '/' (0x2f): os.walk sorted gives b/sub-1
     * before b/sub/x, whereas a depth-first walk would not */
    char *d = make_temp_dir();
    if (!d) return;
    write_file(d, "c/sub/x.jpg", "x", 1);
    write_file(d, "c/sub-1/y.jpg", "x", 1);
    write_file(d, "c/sub/deeper/z.jpg", "x", 1);
    visc_file_list fl;
    CHECK(visc_scan_imagefolder(&fl, d) == 0);
    CHECK(fl.count == 3);
    if (fl.count == 3) {
        /* sorted dirpaths: c/sub, c/sub-1, c/sub/deeper */
        CHECK(strcmp(visc_file_list_name(&fl, 0), "c/sub/x.jpg") == 0);
        CHECK(strcmp(visc_file_list_name(&fl, 1), "c/sub-1/y.jpg") == 0);
        CHECK(strcmp(visc_file_list_name(&fl, 2), "c/sub/deeper/z.jpg") == 0);
    }
    visc_file_list_free(&fl);
    rm_tree(d);
    free(d);
}

TEST(flat_layout_imagenet_samples) {
    visc_file_list fl;
    const char *root = "../shared/data/imagenet-samples";
    if (access(root, R_OK) != 0) root = "/work/shared/data/imagenet-samples";
    CHECK(visc_scan_flat(&fl, root) == 0);
    CHECK(fl.num_classes == 1000);
    CHECK(fl.count == 1000);
    if (fl.count == 1000) {
        CHECK(strcmp(fl.class_names[0], "n01440764") == 0);
        CHECK(strcmp(visc_file_list_name(&fl, 0), "n01440764_tench.JPEG") == 0);
        for (int64_t i = 0; i < 1000; i++) CHECK(fl.labels[i] == i);
    }
    visc_file_list_subset(&fl, 1, 0, 0);
    CHECK(fl.count == 1000);
    visc_file_list_free(&fl);

    char *d = make_temp_dir();
    if (!d) return;
    write_file(d, "n2_b.JPEG", "x", 1);
    write_file(d, "n1_a.jpg", "x", 1);
    write_file(d, "n2_a.png", "x", 1);
    write_file(d, "notes.txt", "x", 1);
    CHECK(visc_scan_flat(&fl, d) == 0);
    CHECK(fl.num_classes == 2 && fl.count == 3);
    if (fl.count == 3) CHECK(fl.labels[0] == 0 && fl.labels[1] == 1 && fl.labels[2] == 1);
    visc_file_list_free(&fl);
    write_file(d, "noprefix.jpg", "x", 1);
    CHECK(visc_scan_flat(&fl, d) == -1);
    CHECK(strstr(visc_last_error(), "noprefix.jpg") != NULL);
    rm_tree(d);
    free(d);
}

TEST(subset_first_and_seeded) {
    char *d = make_temp_dir();
    if (!d) return;
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 10; i++) {
            char name[64];
            snprintf(name, sizeof name, "c%d/%02d.jpg", c, i);
            write_file(d, name, "x", 1);
        }
    visc_file_list fl;
    CHECK(visc_scan_imagefolder(&fl, d) == 0);
    visc_file_list_subset(&fl, 4, 0, 0);
    CHECK(fl.count == 12);
    CHECK(strcmp(visc_file_list_name(&fl, 5), "c1/01.jpg") == 0);
    visc_file_list_free(&fl);
    visc_file_list a, b;
    visc_scan_imagefolder(&a, d);
    visc_scan_imagefolder(&b, d);
    visc_file_list_subset(&a, 4, 1, 99);
    visc_file_list_subset(&b, 4, 1, 99);
    CHECK(a.count == 12 && b.count == 12);
    int differs_from_first = 0;
    for (int64_t i = 0; i < a.count && i < b.count; i++) {
        CHECK(strcmp(visc_file_list_name(&a, i), visc_file_list_name(&b, i)) == 0);
        CHECK(a.labels[i] == i / 4);
        if (i > 0 && a.labels[i] == a.labels[i - 1])
            CHECK(strcmp(visc_file_list_name(&a, i - 1), visc_file_list_name(&a, i)) < 0);
        char first[32];
        snprintf(first, sizeof first, "c%lld/%02lld.jpg", (long long)(i / 4), (long long)(i % 4));
        differs_from_first |= strcmp(visc_file_list_name(&a, i), first) != 0;
    }
    CHECK(differs_from_first);
    visc_file_list_free(&a);
    visc_file_list_free(&b);
    rm_tree(d);
    free(d);
}

TEST(index_cache_reuse_and_rebuild) {
    char *d = make_temp_dir(), *cache = make_temp_dir();
    if (!d || !cache) return;
    setenv("VISC_CACHE_DIR", cache, 1);
    write_file(d, "a/1.jpg", "x", 1);
    write_file(d, "b/1.jpg", "x", 1);
    visc_file_list fl;
    int reused = -1;
    CHECK(visc_file_index_load(&fl, d, VISC_LAYOUT_IMAGEFOLDER, &reused) == 0);
    CHECK(reused == 0 && fl.count == 2);
    visc_file_list_free(&fl);
    CHECK(visc_file_index_load(&fl, d, VISC_LAYOUT_IMAGEFOLDER, &reused) == 0);
    CHECK(reused == 1 && fl.count == 2 && fl.num_classes == 2);
    if (fl.count == 2) CHECK(strcmp(visc_file_list_name(&fl, 1), "b/1.jpg") == 0);
    visc_file_list_free(&fl);
    /* another layout of the same root is another cache entry */
    write_file(d, "x_1.jpg", "x", 1);
    CHECK(visc_file_index_load(&fl, d, VISC_LAYOUT_FLAT, &reused) == 0);
    CHECK(reused == 0 && fl.count == 1);
    visc_file_list_free(&fl);
    /* a new file in a class folder changes its mtime: rescan */
    usleep(20000);
    write_file(d, "b/2.jpg", "x", 1);
    CHECK(visc_file_index_load(&fl, d, VISC_LAYOUT_IMAGEFOLDER, &reused) == 0);
    CHECK(reused == 0 && fl.count == 3);
    visc_file_list_free(&fl);
    CHECK(visc_file_index_load(&fl, d, VISC_LAYOUT_IMAGEFOLDER, &reused) == 0);
    CHECK(reused == 1 && fl.count == 3);
    visc_file_list_free(&fl);
    /* corrupt every cache file: rebuilt, not trusted */
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "for f in %s/index-*.bin; do printf 'XX' | dd of=$f bs=1 seek=30 "
             "conv=notrunc status=none; done",
             cache);
    CHECK(system(cmd) == 0);
    CHECK(visc_file_index_load(&fl, d, VISC_LAYOUT_IMAGEFOLDER, &reused) == 0);
    CHECK(reused == 0 && fl.count == 3);
    visc_file_list_free(&fl);
    /* a read-only cache folder is no error */
    setenv("VISC_CACHE_DIR", "/proc/visc-no-such-dir", 1);
    CHECK(visc_file_index_load(&fl, d, VISC_LAYOUT_IMAGEFOLDER, &reused) == 0);
    CHECK(fl.count == 3);
    visc_file_list_free(&fl);
    unsetenv("VISC_CACHE_DIR");
    rm_tree(d);
    rm_tree(cache);
    free(d);
    free(cache);
}

TEST(index_decode_rejects_every_truncation_and_flip) {
    visc_file_list fl = {0};
    char *d = make_temp_dir();
    if (!d) return;
    write_file(d, "cls/one.jpg", "x", 1);
    write_file(d, "cls2/two.jpg", "x", 1);
    CHECK(visc_scan_imagefolder(&fl, d) == 0);
    uint8_t *buf;
    size_t size;
    visc_file_index_encode(&fl, VISC_LAYOUT_IMAGEFOLDER, &buf, &size);
    visc_file_list back;
    visc_layout lay;
    CHECK(visc_file_index_decode(&back, buf, size, &lay) == 0);
    CHECK(back.count == 2 && lay == VISC_LAYOUT_IMAGEFOLDER);
    visc_file_list_free(&back);
    for (size_t n = 0; n < size; n++) CHECK(visc_file_index_decode(&back, buf, n, &lay) == -1);
    for (size_t i = 0; i < size; i++) {
        buf[i] ^= 0x40;
        CHECK(visc_file_index_decode(&back, buf, size, &lay) == -1);
        buf[i] ^= 0x40;
    }
    free(buf);
    visc_file_list_free(&fl);
    rm_tree(d);
    free(d);
}

/* ---- real files through the transforms pipeline ---- */

static const char *cifar_file(int cls, int i) {
    static char path[512];
    static const char *names[] = {"airplane", "automobile", "bird"};
    const char *root = "../shared/data/cifar10/train";
    if (access(root, R_OK) != 0) root = "/work/shared/data/cifar10/train";
    snprintf(path, sizeof path, "%s/%s/%04d.jpg", root, names[cls], i);
    return path;
}

/* An ImageFolder in d: classes c0, c1, ... of per_class CIFAR-10 JPEGs
 * each (c0/0.jpg, ...); with `truncated`, also the first third of the
 * first one as c0/truncated.jpg. */
static void copy_cifar(const char *d, int classes, int per_class, int truncated) {
    for (int c = 0; c < classes; c++)
        for (int i = 0; i < per_class; i++) {
            size_t n;
            uint8_t *b = visc_test_read_file(cifar_file(c, i), &n);
            CHECK(b != NULL);
            if (!b) continue;
            char name[64];
            snprintf(name, sizeof name, "c%d/%d.jpg", c, i);
            write_file(d, name, b, n);
            if (truncated && c == 0 && i == 0) write_file(d, "c0/truncated.jpg", b, n / 3);
            free(b);
        }
}

TEST(image_dataset_bad_files_skip_and_error) {
    char *d = make_temp_dir();
    if (!d) return;
    copy_cifar(d, 2, 4, 1);
    write_file(d, "c1/zero.jpg", "", 0);
    write_file(d, "c1/text.jpg", "hello, I am not a JPEG\n", 23);
    char spec[600];
    snprintf(spec, sizeof spec, "imagefolder:%s", d);
    visc_transform_config tc;
    CHECK(visc_transform_preset("eval", 32, &tc) == 0);
    tc.crop_pct = 1.0f;
    visc_sample_pipeline pl;
    CHECK(visc_transform_pipeline(&tc, &pl) == 0);
    setenv("VISC_CACHE_DIR", d, 1); /* files at the root are no part of an ImageFolder */
    visc_dataset *ds = visc_image_dataset_open(spec, 1, &pl);
    unsetenv("VISC_CACHE_DIR");
    CHECK(ds != NULL);
    if (!ds) return;
    CHECK(ds->size == 11 && ds->num_classes == 2);
    visc_loader_config c = cfg_of(4, 2, 1, 0, 0);
    c.train = 0;
    visc_loader *l = visc_loader_new(ds, &c);
    visc_loader_start(l, 0, 0, -1);
    visc_batch b;
    int total = 0;
    while (visc_loader_next(l, &b) == 1) {
        for (int i = 0; i < b.count; i++) {
            const char *name = visc_image_dataset_name(ds, b.indices[i]);
            CHECK(b.y[i] == (name[1] == '0' ? 0 : 1));
            CHECK(strstr(name, "zero") == NULL && strstr(name, "text") == NULL &&
                  strstr(name, "trunc") == NULL);
        }
        total += b.count;
    }
    /* libjpeg decodes a truncated JPEG with a warning (grey bottom), as PIL
     * with LOAD_TRUNCATED_IMAGES does; a third of a 32x32 file may not even
     * hold the first scan. Either way the zero-byte and text files are bad. */
    int64_t bad = visc_loader_bad_count(l);
    CHECK(bad >= 2 && bad <= 3);
    CHECK(total + bad == 11);
    int saw_zero = 0, saw_text = 0;
    for (int64_t i = 0; i < bad; i++) {
        const char *m = visc_loader_bad_message(l, i);
        saw_zero |= strstr(m, "zero.jpg") != NULL;
        saw_text |= strstr(m, "text.jpg") != NULL;
    }
    CHECK(saw_zero && saw_text);
    visc_loader_free(l);

    c.on_bad = VISC_ON_BAD_ERROR;
    c.shuffle = 0;
    l = visc_loader_new(ds, &c);
    visc_loader_start(l, 0, 0, -1);
    int rc;
    while ((rc = visc_loader_next(l, &b)) == 1) {
    }
    CHECK(rc == -1);
    CHECK(strstr(visc_last_error(), ".jpg") != NULL);
    visc_loader_free(l);
    visc_dataset_free(ds);
    rm_tree(d);
    free(d);
}

/* A loader of bytes (for a GPU that normalizes): the same samples, labels
 * and order as the loader of floats, and its batches normalize to theirs
 * bit for bit, two views (SSL) and one, through a bad image's refill (the
 * gather buffer) too. Datasets without a byte form are refused in one line. */
TEST(loader_of_bytes_normalizes_to_the_loader_of_floats) {
    char *d = make_temp_dir();
    if (!d) return;
    copy_cifar(d, 3, 5, 0);
    write_file(d, "c1/zero.jpg", "", 0);
    char spec[600];
    snprintf(spec, sizeof spec, "imagefolder:%s", d);
    for (int views = 1; views <= 2; views++) {
        visc_transform_config tc;
        CHECK(visc_transform_preset(views == 2 ? "mocov2" : "torchvision", 24, &tc) == 0);
        tc.views = views;
        visc_sample_pipeline pl;
        CHECK(visc_transform_pipeline(&tc, &pl) == 0 && pl.fn_bytes != NULL);
        setenv("VISC_CACHE_DIR", d, 1);
        visc_dataset *ds = visc_image_dataset_open(spec, 1, &pl);
        unsetenv("VISC_CACHE_DIR");
        CHECK(ds != NULL && ds->get_bytes != NULL);
        if (!ds) continue;
        visc_loader_config c = cfg_of(4, 2, 1, 0, 0);
        visc_loader *lf = visc_loader_new(ds, &c);
        c.bytes = 1;
        visc_loader *lb = visc_loader_new(ds, &c);
        const size_t plane = 24 * 24, per = 3 * plane;
        float *norm = malloc(sizeof(float) * 4 * per * (size_t)views);
        int batches = 0;
        for (int64_t epoch = 0; epoch < 2; epoch++) {
            visc_loader_start(lf, epoch, 0, -1);
            visc_loader_start(lb, epoch, 0, -1);
            visc_batch bf, bb;
            int rf, rb;
            while ((rf = visc_loader_next(lf, &bf)) == 1 && (rb = visc_loader_next(lb, &bb)) == 1) {
                CHECK(bb.x == NULL && bb.x8 != NULL && bf.x8 == NULL);
                CHECK(bb.count == bf.count && bb.views == views);
                CHECK(memcmp(bb.indices, bf.indices, sizeof(int64_t) * (size_t)bf.count) == 0);
                CHECK(memcmp(bb.y, bf.y, sizeof(int32_t) * (size_t)bf.count) == 0);
                /* every view block holds batch_size samples; compare the filled ones */
                for (int v = 0; v < views; v++) {
                    visc_normalize_bytes(bb.x8 + (size_t)v * 4 * per, (size_t)bb.count, plane,
                                         tc.mean, tc.std, norm);
                    CHECK(memcmp(norm, bf.x + (size_t)v * 4 * per,
                                 sizeof(float) * per * (size_t)bb.count) == 0);
                }
                batches++;
            }
            CHECK(rf == 0);
            CHECK(visc_loader_bad_count(lb) == 1);
        }
        CHECK(batches == 8);
        free(norm);
        visc_loader_free(lf);
        visc_loader_free(lb);
        visc_dataset_free(ds);
    }
    synth_cfg sc = {.fail_at = -1};
    visc_dataset mem = synth(8, &sc);
    visc_loader_config c = cfg_of(4, 1, 1, 0, 0);
    c.bytes = 1;
    CHECK(visc_loader_new(&mem, &c) == NULL && strstr(visc_last_error(), "byte form"));
    rm_tree(d);
    free(d);
}

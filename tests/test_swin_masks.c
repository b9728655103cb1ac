/* test_swin_masks.c: Swin's window geometry against timm 0.9.16.
 *
 * tests/golden/swin_masks.safetensors (tools/gen_golden_swin.py) holds, for
 * square and non-square token grids (including axes that fit in one window,
 * where timm shrinks the window and does not shift): the window and shift
 * timm picks, the shifted block's attn_mask, relative_position_index, V2's
 * relative_coords_table and the token order of roll + window_partition. */
#include <stdlib.h>
#include <string.h>

#include "../src/models/swin_window.h"
#include "test.h"
#include "visc/io.h"
#include "visc/model.h"

static float *read_f32(const visc_safetensors *st, const char *name, size_t n) {
    float *v = malloc(n * sizeof(float));
    if (visc_safetensors_read_f32(st, name, v, n) != 0) {
        CHECK_MSG(0, "%s: %s", name, visc_last_error());
        free(v);
        return NULL;
    }
    return v;
}

/* I32 tensors (converted by the reader; the values are small and exact). */
static int32_t *read_i32(const visc_safetensors *st, const char *name, size_t n) {
    float *f = read_f32(st, name, n);
    if (!f) return NULL;
    int32_t *v = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) v[i] = (int32_t)f[i];
    free(f);
    return v;
}

TEST(masks_index_and_order_match_timm) {
    visc_safetensors st;
    if (visc_safetensors_open(&st, visc_golden_path("swin_masks.safetensors")) != 0) {
        CHECK_MSG(0, "%s", visc_last_error());
        return;
    }
    const char *nc = visc_safetensors_meta(&st, "cases");
    CHECK(nc != NULL);
    int cases = nc ? atoi(nc) : 0;
    CHECK(cases >= 6);
    for (int c = 0; c < cases; c++) {
        char name[64];
        snprintf(name, sizeof name, "case%d.config", c);
        int32_t *cfg = read_i32(&st, name, 7);
        if (!cfg) continue;
        int H = cfg[0], W = cfg[1], win = cfg[2];
        visc_swin_grid g, plain;
        CHECK(visc_swin_grid_make(&g, H, W, win, 1) == 0);
        CHECK(visc_swin_grid_make(&plain, H, W, win, 0) == 0);
        CHECK_MSG(g.wh == cfg[3] && g.ww == cfg[4] && g.sh == cfg[5] && g.sw == cfg[6],
                  "case %d (%dx%d, window %d): window %dx%d shift %d,%d; timm %dx%d shift %d,%d", c,
                  H, W, win, g.wh, g.ww, g.sh, g.sw, cfg[3], cfg[4], cfg[5], cfg[6]);
        CHECK(plain.sh == 0 && plain.sw == 0 && plain.wh == g.wh && plain.ww == g.ww);
        int N = g.N;
        size_t nm = (size_t)g.nw * N * N;

        snprintf(name, sizeof name, "case%d.attn_mask", c);
        float *want = read_f32(&st, name, nm), *got = malloc(nm * sizeof(float));
        visc_swin_attn_mask(got, &g);
        if (want) CHECK_ARRAYS(name, got, want, nm, 0, 0);
        /* the mask is not trivial: some pairs masked in every case with a shift */
        size_t masked = 0;
        for (size_t i = 0; i < nm; i++) masked += got[i] != 0.0f;
        CHECK(masked > 0);
        free(want), free(got);

        snprintf(name, sizeof name, "case%d.relative_position_index", c);
        int32_t *wi = read_i32(&st, name, (size_t)N * N), *gi = malloc((size_t)N * N * 4);
        visc_swin_rel_index(gi, g.wh, g.ww);
        if (wi) CHECK_MSG(memcmp(gi, wi, (size_t)N * N * 4) == 0, "%s differs", name);
        free(wi), free(gi);

        int T = (2 * g.wh - 1) * (2 * g.ww - 1);
        snprintf(name, sizeof name, "case%d.relative_coords_table", c);
        float *wc = read_f32(&st, name, (size_t)T * 2), *gc = malloc((size_t)T * 2 * 4);
        visc_swin_v2_coords(gc, g.wh, g.ww);
        if (wc) CHECK_ARRAYS(name, gc, wc, (size_t)T * 2, 0, 1e-6);
        free(wc), free(gc);

        /* partition of the token ids gives timm's order; reverse undoes it */
        size_t HW = (size_t)H * W;
        float *ids = malloc(HW * 4), *part = malloc(HW * 4), *back = malloc(HW * 4);
        for (size_t i = 0; i < HW; i++) ids[i] = (float)i;
        visc_swin_partition(part, ids, &g, 1, 1);
        visc_swin_reverse(back, part, &g, 1, 1);
        snprintf(name, sizeof name, "case%d.order", c);
        int32_t *order = read_i32(&st, name, HW);
        for (size_t i = 0; order && i < HW; i++)
            CHECK_MSG(part[i] == (float)order[i], "%s[%zu] = %g, timm %d", name, i, part[i],
                      order[i]);
        CHECK_ARRAYS("reverse(partition(x))", back, ids, HW, 0, 0);
        free(order), free(ids), free(part), free(back), free(cfg);
    }
    visc_safetensors_close(&st);
}

TEST(grid_rejects_partial_windows) {
    visc_swin_grid g;
    CHECK(visc_swin_grid_make(&g, 10, 10, 4, 0) == -1);
    CHECK(strstr(visc_last_error(), "10x10") != NULL);
    CHECK(visc_swin_grid_make(&g, 3, 3, 4, 1) == 0); /* one window, no shift */
    CHECK(g.wh == 3 && g.sh == 0 && g.nw == 1);
}

/* Bad image sizes give NULL and a message, never a crash. */
TEST(model_rejects_bad_sizes) {
    const struct {
        const char *arch;
        int image;
    } bad[] = {{"swin_tiny_patch4_window7_224", 230}, /* not divisible by the patch */
               {"swin_tiny_patch4_window7_224", 96},  /* 24x24 grid: 7x7 windows do not fit */
               {"swinv2_tiny_window8_256", 224},      /* 56x56 grid vs 8x8 windows */
               {"swinv2_micro_patch2_window4_32", 8}, /* 1x1 last stage: V2 bias undefined */
               {"swin_micro_patch2_window4_32", 4},   /* odd grid at a merge */
               {"swin_nano", 32}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        visc_model_config cfg = {0};
        snprintf(cfg.arch, sizeof cfg.arch, "%s", bad[i].arch);
        cfg.num_classes = 10;
        cfg.in_channels = 3;
        cfg.image_size = bad[i].image;
        cfg.batch = 1;
        visc_model *m = visc_model_create(&cfg, 1);
        CHECK_MSG(m == NULL, "%s at %d px was accepted", bad[i].arch, bad[i].image);
        visc_model_destroy(m);
        CHECK(strlen(visc_last_error()) > 0);
    }
    /* and a smaller V1 image that fits: 8 px micro, last stage 1x1 */
    visc_model_config cfg = {.num_classes = 10, .in_channels = 1, .image_size = 8, .batch = 1};
    snprintf(cfg.arch, sizeof cfg.arch, "swin_micro_patch2_window4_32");
    visc_model *m = visc_model_create(&cfg, 1);
    CHECK_MSG(m != NULL, "%s", visc_last_error());
    visc_model_destroy(m);
}

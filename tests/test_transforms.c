/* test_transforms.c: the transforms against torchvision 0.14 / Pillow 9.4
 * (tests/golden/transforms.safetensors, written by
 * tools/gen_golden_transforms.py with fixed parameters), the statistics of
 * the random draws, and the per-sample pipeline.
 *
 * Tolerances: resize, crop, flip, colour ops, grayscale and solarize are
 * bit-exact (0 levels); Gaussian blur allows 1 level on at most 0.5% of
 * the bytes (separable float sums vs torch's 2-D conv; see blur.c);
 * normalize 1e-6. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/core.h"
#include "visc/io.h"
#include "visc/rng.h"
#include "visc/transforms.h"

static visc_safetensors gst;
static int gst_state; /* 0 unopened, 1 ok, -1 failed */

static const visc_safetensors *golden(void) {
    if (gst_state == 0) {
        gst_state =
            visc_safetensors_open(&gst, visc_golden_path("transforms.safetensors")) == 0 ? 1 : -1;
        if (gst_state < 0) fprintf(stderr, "  transforms.safetensors: %s\n", visc_last_error());
    }
    return gst_state > 0 ? &gst : NULL;
}

/* Golden tensor `name` as floats (numel into *n), or NULL. */
static float *load(const char *name, size_t *n) {
    const visc_safetensors *st = golden();
    const visc_st_tensor *t = st ? visc_safetensors_find(st, name) : NULL;
    if (!t) return NULL;
    float *p = malloc(sizeof(float) * (t->numel ? t->numel : 1));
    if (visc_safetensors_read_f32(st, name, p, t->numel) != 0) {
        free(p);
        return NULL;
    }
    if (n) *n = t->numel;
    return p;
}

/* Golden image "img.a" / "img.b" as a visc_image (owned). */
static int load_image(int which, visc_image *img) {
    const visc_safetensors *st = golden();
    const char *name = which ? "img.b" : "img.a";
    const visc_st_tensor *t = st ? visc_safetensors_find(st, name) : NULL;
    if (!t || t->ndim != 3 || t->shape[2] != 3) return -1;
    visc_transform_image_alloc(img, (int)t->shape[1], (int)t->shape[0]);
    memcpy(img->data, st->data + t->begin, t->numel);
    return 0;
}

/* Largest |got - want| over an image; count of differing bytes in *ndiff. */
static int image_diff(const visc_image *got, const float *want, size_t n, size_t *ndiff) {
    int worst = 0;
    size_t k = 0, diffs = 0;
    if (n != (size_t)got->width * got->height * 3) return 1000;
    for (int y = 0; y < got->height; y++)
        for (int x = 0; x < 3 * got->width; x++, k++) {
            int d = abs((int)got->data[(size_t)y * got->stride + x] - (int)want[k]);
            if (d) diffs++;
            if (d > worst) worst = d;
        }
    if (ndiff) *ndiff = diffs;
    return worst;
}

/* Runs `fn` on every golden case "<prefix>.<i>" until one is missing. */
typedef int (*case_fn)(const float *params, const float *want, size_t n, const char *name);
static int for_cases(const char *prefix, case_fn fn) {
    int count = 0;
    for (int i = 0;; i++, count++) {
        char pn[64], on[64];
        snprintf(pn, sizeof pn, "%s.%d.params", prefix, i);
        snprintf(on, sizeof on, "%s.%d.out", prefix, i);
        size_t np = 0, n = 0;
        float *p = load(pn, &np), *want = load(on, &n);
        if (!p || !want) {
            free(p);
            free(want);
            break;
        }
        fn(p, want, n, pn);
        free(p);
        free(want);
    }
    return count;
}

TEST(golden_file_opens) { CHECK(golden() != NULL); }

static int resize_case(const float *p, const float *want, size_t n, const char *name) {
    visc_image src, dst;
    if (load_image((int)p[0], &src)) {
        CHECK_MSG(0, "%s: no image", name);
        return -1;
    }
    visc_transform_image_alloc(&dst, (int)p[1], (int)p[2]);
    float box[4] = {p[5], p[6], p[7], p[8]};
    visc_resize(&src, p[4] != 0 ? box : NULL, (visc_interp)(int)p[3], &dst);
    int d = image_diff(&dst, want, n, NULL);
    CHECK_MSG(d == 0, "%s: resize interp %d to %dx%d differs from PIL by %d", name, (int)p[3],
              (int)p[1], (int)p[2], d);
    visc_transform_image_free(&src);
    visc_transform_image_free(&dst);
    return 0;
}

TEST(resize_matches_pil) { CHECK_MSG(for_cases("resize", resize_case) == 30, "want 30 cases"); }

static int rcrop_case(const float *p, const float *want, size_t n, const char *name) {
    visc_image src, dst;
    if (load_image((int)p[0], &src)) {
        CHECK_MSG(0, "%s: no image", name);
        return -1;
    }
    visc_rect r = {(int)p[2], (int)p[1], (int)p[4], (int)p[3]};
    visc_image view = visc_image_view(&src, r);
    visc_transform_image_alloc(&dst, (int)p[5], (int)p[6]);
    visc_resize(&view, NULL, (visc_interp)(int)p[7], &dst);
    int d = image_diff(&dst, want, n, NULL);
    CHECK_MSG(d == 0, "%s: resized_crop differs by %d", name, d);
    visc_transform_image_free(&src);
    visc_transform_image_free(&dst);
    return 0;
}

TEST(resized_crop_matches_torchvision) { CHECK(for_cases("rcrop", rcrop_case) == 8); }

static int eval_case(const float *p, const float *want, size_t n, const char *name) {
    visc_image src, res, crop;
    if (load_image((int)p[0], &src)) {
        CHECK_MSG(0, "%s: no image", name);
        return -1;
    }
    int w, h, c = (int)p[2];
    visc_resize_shorter_size(src.width, src.height, (int)p[1], &w, &h);
    visc_transform_image_alloc(&res, w, h);
    visc_resize(&src, NULL, (visc_interp)(int)p[3], &res);
    visc_crop(&res, visc_center_crop_rect(w, h, c, c), &crop);
    int d = image_diff(&crop, want, n, NULL);
    CHECK_MSG(d == 0, "%s: Resize(%d) + CenterCrop(%d) differs by %d", name, (int)p[1], c, d);
    visc_transform_image_free(&src);
    visc_transform_image_free(&res);
    visc_transform_image_free(&crop);
    return 0;
}

TEST(resize_center_crop_matches_torchvision) { CHECK(for_cases("eval", eval_case) == 8); }

TEST(flip_and_grayscale_exact) {
    for (int which = 0; which < 2; which++) {
        const char *k = which ? "b" : "a";
        char name[32];
        visc_image img;
        size_t n;
        if (load_image(which, &img)) {
            CHECK(0);
            return;
        }
        snprintf(name, sizeof name, "hflip.%s.out", k);
        float *want = load(name, &n);
        CHECK(want != NULL);
        if (want) {
            visc_hflip(&img);
            CHECK_MSG(image_diff(&img, want, n, NULL) == 0, "%s", name);
            visc_hflip(&img);
        }
        free(want);
        snprintf(name, sizeof name, "gray.%s.out", k);
        want = load(name, &n);
        CHECK(want != NULL);
        if (want) {
            visc_grayscale(&img);
            CHECK_MSG(image_diff(&img, want, n, NULL) == 0, "%s", name);
        }
        free(want);
        visc_transform_image_free(&img);
    }
}

static int color_case(const float *p, const float *want, size_t n, const char *name) {
    visc_image img;
    if (load_image((int)p[0], &img)) {
        CHECK_MSG(0, "%s: no image", name);
        return -1;
    }
    switch ((int)p[1]) {
    case 0: visc_adjust_brightness(&img, p[2]); break;
    case 1: visc_adjust_contrast(&img, p[2]); break;
    case 2: visc_adjust_saturation(&img, p[2]); break;
    case 3: visc_adjust_hue(&img, p[2]); break;
    default: visc_solarize(&img, (int)p[2]); break;
    }
    int d = image_diff(&img, want, n, NULL);
    CHECK_MSG(d == 0, "%s: colour op %d factor %g differs by %d", name, (int)p[1], p[2], d);
    visc_transform_image_free(&img);
    return 0;
}

TEST(color_ops_match_torchvision) { CHECK(for_cases("color", color_case) == 40); }

static size_t blur_diff_bytes, blur_bytes;
static int blur_case(const float *p, const float *want, size_t n, const char *name) {
    visc_image img;
    if (load_image((int)p[0], &img)) {
        CHECK_MSG(0, "%s: no image", name);
        return -1;
    }
    visc_gaussian_blur(&img, (int)p[1], p[2]);
    size_t nd = 0;
    int d = image_diff(&img, want, n, &nd);
    CHECK_MSG(d <= 1, "%s: blur k %d sigma %g differs by %d", name, (int)p[1], p[2], d);
    blur_diff_bytes += nd;
    blur_bytes += n;
    visc_transform_image_free(&img);
    return 0;
}

TEST(gaussian_blur_matches_torchvision) {
    blur_diff_bytes = blur_bytes = 0;
    CHECK(for_cases("blur", blur_case) == 10);
    CHECK_MSG(blur_diff_bytes * 200 <= blur_bytes, "%zu of %zu bytes off by one", blur_diff_bytes,
              blur_bytes);
}

TEST(gaussian_kernel_normalized_and_symmetric) {
    float k[23];
    visc_gaussian_kernel(23, 1.7f, k);
    double s = 0;
    for (int i = 0; i < 23; i++) s += k[i];
    CHECK_CLOSE(s, 1.0, 1e-6, 0);
    for (int i = 0; i < 11; i++) CHECK(k[i] == k[22 - i]);
    CHECK(k[11] > k[10] && k[10] > k[0]);
    CHECK_CLOSE(k[12] / k[11], exp(-0.5 / (1.7 * 1.7)), 1e-6, 0);
}

TEST(normalize_matches_torchvision) {
    visc_image img;
    size_t n = 0, np = 0;
    float *want = load("normalize.b.out", &n), *p = load("normalize.b.params", &np);
    CHECK(want && p && np == 7 && load_image(1, &img) == 0);
    if (!want || !p || np != 7) {
        free(want);
        free(p);
        return;
    }
    float *got = malloc(sizeof(float) * n);
    CHECK(n == (size_t)3 * img.width * img.height);
    visc_to_tensor_normalize(&img, p + 1, p + 4, got);
    CHECK_ARRAYS("normalize", got, want, n, 1e-6, 0);
    free(got);
    free(want);
    free(p);
    visc_transform_image_free(&img);
}

/* ---- random parameters ---- */

/* Pearson chi-square of counts against equal expected counts. */
static double chi2_uniform(const int *counts, int bins, int total) {
    double e = (double)total / bins, s = 0;
    for (int i = 0; i < bins; i++) s += (counts[i] - e) * (counts[i] - e) / e;
    return s;
}

TEST(rrc_area_and_log_ratio_distributions) {
    /* On a 2000 x 2000 image with scale (0.08, 0.5) no try is ever rejected
     * (the widest crop is sqrt(0.5 * 4/3) < 1 of the side), so the area
     * fraction is U(0.08, 0.5) and log(w / h) is U(log 3/4, log 4/3) up to
     * rounding to whole pixels. 20 bins, 20000 draws: the chi-square 0.1%
     * point for 19 degrees of freedom is 43.8; a ratio drawn uniformly
     * instead of log-uniformly scores in the hundreds. */
    enum { N = 20000, B = 20 };
    const float scale[2] = {0.08f, 0.5f}, ratio[2] = {3.0f / 4.0f, 4.0f / 3.0f};
    int area_bins[B] = {0}, ratio_bins[B] = {0}, x_bins[B] = {0};
    visc_rng r = visc_rng_make(7, VISC_STREAM_AUGMENT, 0);
    const int S = 2000;
    for (int i = 0; i < N; i++) {
        visc_rect c = visc_rrc_params(&r, S, S, scale, ratio);
        CHECK(c.x >= 0 && c.y >= 0 && c.x + c.w <= S && c.y + c.h <= S);
        double a = (double)c.w * c.h / ((double)S * S);
        double lr = log((double)c.w / c.h);
        int ab = (int)((a - 0.08) / (0.5 - 0.08) * B);
        int rb = (int)((lr - log(0.75)) / (log(4.0 / 3.0) - log(0.75)) * B);
        int xb = (int)((double)c.x / (S - c.w + 1) * B);
        area_bins[ab < 0 ? 0 : ab >= B ? B - 1 : ab]++;
        ratio_bins[rb < 0 ? 0 : rb >= B ? B - 1 : rb]++;
        x_bins[xb < 0 ? 0 : xb >= B ? B - 1 : xb]++;
    }
    double ca = chi2_uniform(area_bins, B, N), cr = chi2_uniform(ratio_bins, B, N),
           cx = chi2_uniform(x_bins, B, N);
    CHECK_MSG(ca < 43.8, "area fraction chi2 %.1f", ca);
    CHECK_MSG(cr < 43.8, "log ratio chi2 %.1f", cr);
    CHECK_MSG(cx < 43.8, "x offset chi2 %.1f", cx);
}

TEST(rrc_defaults_and_fallback) {
    const float scale[2] = {0.08f, 1.0f}, ratio[2] = {3.0f / 4.0f, 4.0f / 3.0f};
    visc_rng r = visc_rng_make(3, VISC_STREAM_AUGMENT, 1);
    double sum_area = 0;
    for (int i = 0; i < 5000; i++) {
        visc_rect c = visc_rrc_params(&r, 500, 375, scale, ratio);
        CHECK(c.w >= 1 && c.h >= 1 && c.x >= 0 && c.y >= 0 && c.x + c.w <= 500 && c.y + c.h <= 375);
        sum_area += (double)c.w * c.h / (500.0 * 375.0);
    }
    /* Larger tries get rejected, so the mean is below U(0.08, 1)'s 0.54 but
     * well above the floor. */
    double m = sum_area / 5000;
    CHECK_MSG(m > 0.40 && m < 0.54, "mean area fraction %.3f", m);
    /* A 1000 x 10 strip: every try fails (h <= 10 needs area < ~133 px at
     * ratio 4/3, far below 8% of 10000), so the fallback centre crop with
     * ratio clamped to 4/3: h = 10, w = round(13.33) = 13, centred. */
    visc_rect c = visc_rrc_params(&r, 1000, 10, scale, ratio);
    CHECK(c.h == 10 && c.w == 13 && c.y == 0 && c.x == (1000 - 13) / 2);
    c = visc_rrc_params(&r, 10, 1000, scale, ratio);
    CHECK(c.w == 10 && c.h == 13 && c.x == 0 && c.y == (1000 - 13) / 2);
}

TEST(jitter_draw_ranges_and_order) {
    const visc_color_jitter cj = {0.4f, 0.4f, 0.4f, 0.1f};
    visc_rng r = visc_rng_make(11, VISC_STREAM_AUGMENT, 2);
    enum { N = 24000 };
    int perm_counts[24] = {0};
    float lo[4] = {9, 9, 9, 9}, hi[4] = {-9, -9, -9, -9};
    double mean[4] = {0};
    for (int i = 0; i < N; i++) {
        visc_jitter_draw d;
        visc_color_jitter_draw(&cj, &r, &d);
        int code = 0, seen = 0;
        for (int k = 0; k < 4; k++) {
            CHECK(d.enabled[k]);
            lo[k] = fminf(lo[k], d.factor[k]);
            hi[k] = fmaxf(hi[k], d.factor[k]);
            mean[k] += d.factor[k] / N;
            seen |= 1 << d.order[k];
        }
        CHECK(seen == 15);
        /* Lehmer code of the permutation: a number in [0, 24). */
        for (int a = 0; a < 4; a++) {
            int smaller = 0;
            for (int b = a + 1; b < 4; b++) smaller += d.order[b] < d.order[a];
            code = code * (4 - a) + smaller;
        }
        perm_counts[code]++;
    }
    for (int k = 0; k < 3; k++) {
        CHECK_MSG(lo[k] >= 0.6f && lo[k] < 0.601f && hi[k] <= 1.4f && hi[k] > 1.399f,
                  "factor %d in [%g, %g]", k, lo[k], hi[k]);
        CHECK_CLOSE(mean[k], 1.0, 0.01, 0);
    }
    CHECK(lo[3] >= -0.1f && lo[3] < -0.0995f && hi[3] <= 0.1f && hi[3] > 0.0995f);
    CHECK_CLOSE(mean[3], 0.0, 0.002, 0);
    double c = chi2_uniform(perm_counts, 24, N);
    CHECK_MSG(c < 49.7, "permutation chi2 %.1f (23 dof)", c); /* 0.1% point */
    /* Strength 0 turns an op off; strength > 1 clamps the low end at 0. */
    const visc_color_jitter only_b = {1.5f, 0, 0, 0};
    visc_jitter_draw d;
    visc_color_jitter_draw(&only_b, &r, &d);
    CHECK(d.enabled[0] && !d.enabled[1] && !d.enabled[2] && !d.enabled[3]);
    CHECK(d.factor[0] >= 0.0f && d.factor[0] <= 2.5f);
}

/* ---- the pipeline ---- */

/* A 64 x 48 image whose left and right halves differ, so a flip shows. */
static void make_test_image(visc_image *img) {
    visc_transform_image_alloc(img, 64, 48);
    for (int y = 0; y < 48; y++)
        for (int x = 0; x < 64; x++) {
            uint8_t *p = img->data + (size_t)y * img->stride + 3 * x;
            p[0] = (uint8_t)(x * 4);
            p[1] = (uint8_t)(y * 5);
            p[2] = (uint8_t)((x * y) & 255);
        }
}

TEST(pipeline_flip_frequency) {
    /* Crop = whole image, resized to itself (a copy): only the flip acts. */
    visc_transform_config c;
    CHECK(visc_transform_preset("torchvision", 48, &c) == 0);
    visc_image img;
    visc_transform_image_alloc(&img, 48, 48);
    for (int y = 0; y < 48; y++)
        for (int x = 0; x < 48 * 3; x++) img.data[y * img.stride + x] = (uint8_t)(x + y);
    c.scale[0] = c.scale[1] = 1.0f;
    c.ratio[0] = c.ratio[1] = 1.0f;
    float *out = malloc(sizeof(float) * 3 * 48 * 48);
    int flips = 0, N = 2000;
    for (int i = 0; i < N; i++) {
        CHECK(visc_transform_image(&c, &img, 5, 0, i, out) == 0);
        /* red at x = 0 is (0 + y)/255 unflipped, (141 + y)/255 flipped */
        float v = out[0] * c.std[0] + c.mean[0];
        flips += v > 0.3f;
    }
    /* Binomial(2000, 0.5): sd 22.4; 5 sd */
    CHECK_MSG(abs(flips - N / 2) < 112, "%d flips in %d", flips, N);
    free(out);
    visc_transform_image_free(&img);
}

TEST(pipeline_deterministic_and_views_differ) {
    static const char *presets[] = {"torchvision", "timm", "mocov2", "simclr", "eval"};
    visc_image img;
    make_test_image(&img);
    for (int p = 0; p < 5; p++) {
        visc_transform_config c;
        CHECK(visc_transform_preset(presets[p], 32, &c) == 0);
        CHECK_MSG(visc_transform_validate(&c) == 0, "%s: %s", presets[p], visc_last_error());
        size_t n = (size_t)c.views * 3 * 32 * 32;
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n),
              *d = malloc(sizeof(float) * n);
        CHECK(visc_transform_image(&c, &img, 42, 3, 17, a) == 0);
        CHECK(visc_transform_image(&c, &img, 42, 3, 17, b) == 0);
        CHECK(visc_transform_image(&c, &img, 42, 3, 18, d) == 0);
        CHECK_MSG(memcmp(a, b, sizeof(float) * n) == 0, "%s: same seed, different output",
                  presets[p]);
        int finite = 1;
        for (size_t i = 0; i < n; i++) finite &= isfinite(a[i]) != 0;
        CHECK(finite);
        int same_idx = memcmp(a, d, sizeof(float) * n) == 0;
        if (c.train) CHECK_MSG(!same_idx, "%s: idx 17 and 18 gave the same output", presets[p]);
        else CHECK_MSG(same_idx, "eval must not depend on idx");
        if (c.views == 2)
            CHECK_MSG(memcmp(a, a + n / 2, sizeof(float) * n / 2) != 0, "%s: views equal",
                      presets[p]);
        free(a);
        free(b);
        free(d);
    }
    visc_transform_image_free(&img);
}

TEST(pipeline_eval_is_resize_center_crop_normalize) {
    visc_image img, res, crop;
    make_test_image(&img);
    visc_transform_config c;
    CHECK(visc_transform_preset("eval", 28, &c) == 0);
    float *got = malloc(sizeof(float) * 3 * 28 * 28), *want = malloc(sizeof(float) * 3 * 28 * 28);
    CHECK(visc_transform_image(&c, &img, 1, 0, 0, got) == 0);
    /* floor(28 / 0.875) = 32: 64x48 -> 42x32 (int(32 * 64 / 48) = 42) */
    int w, h;
    visc_resize_shorter_size(64, 48, 32, &w, &h);
    CHECK(w == 42 && h == 32);
    visc_transform_image_alloc(&res, w, h);
    visc_resize(&img, NULL, VISC_INTERP_BILINEAR, &res);
    visc_crop(&res, visc_center_crop_rect(w, h, 28, 28), &crop);
    visc_to_tensor_normalize(&crop, c.mean, c.std, want);
    CHECK_ARRAYS("eval pipeline", got, want, 3 * 28 * 28, 0, 0);
    free(got);
    free(want);
    visc_transform_image_free(&img);
    visc_transform_image_free(&res);
    visc_transform_image_free(&crop);
}

TEST(config_errors_are_reported) {
    visc_transform_config c;
    CHECK(visc_transform_preset("nope", 224, &c) == -1);
    CHECK(strstr(visc_last_error(), "nope") != NULL);
    CHECK(visc_transform_preset("mocov2", 224, &c) == 0);
    c.gray_p = 1.5f;
    CHECK(visc_transform_validate(&c) == -1 && strstr(visc_last_error(), "gray_p"));
    CHECK(visc_transform_preset("mocov2", 224, &c) == 0);
    c.blur_kernel = 4;
    CHECK(visc_transform_validate(&c) == -1 && strstr(visc_last_error(), "odd"));
    CHECK(visc_transform_preset("torchvision", 224, &c) == 0);
    c.scale[0] = 0.9f;
    c.scale[1] = 0.1f;
    CHECK(visc_transform_validate(&c) == -1);
    CHECK(visc_transform_preset("timm", 224, &c) == 0);
    snprintf(c.randaugment, sizeof c.randaugment, "rand-zz");
    CHECK(visc_transform_validate(&c) == -1);
    visc_interp it;
    CHECK(visc_interp_parse("bicubic", &it) == 0 && it == VISC_INTERP_BICUBIC);
    CHECK(visc_interp_parse("lanczos", &it) == -1);
    /* Bad bytes: an error, not a crash. */
    CHECK(visc_transform_preset("torchvision", 224, &c) == 0);
    const uint8_t junk[16] = {0xff, 0xd8, 0xff, 0, 1, 2, 3};
    float out[3];
    CHECK(visc_transform_sample(&c, junk, sizeof junk, 1, 0, 0, out) == -1);
    c.fast_decode = 1;
    CHECK(visc_transform_sample(&c, junk, sizeof junk, 1, 0, 0, out) == -1);
}

TEST(pipeline_on_jpeg_exact_and_fast) {
    /* The committed golden has no JPEG; the tiny PNG-free path is covered
     * by the decoder's tests. Here: a real sample when the machine has
     * the shared data (CI does), else the test reports and fails. */
    size_t size = 0;
    uint8_t *bytes =
        visc_test_read_file("../shared/data/imagenet-samples/n01440764_tench.JPEG", &size);
    CHECK_MSG(bytes != NULL, "sample JPEG missing");
    if (!bytes) return;
    visc_transform_config c;
    CHECK(visc_transform_preset("torchvision", 64, &c) == 0);
    float *a = malloc(sizeof(float) * 3 * 64 * 64), *b = malloc(sizeof(float) * 3 * 64 * 64);
    CHECK_MSG(visc_transform_sample(&c, bytes, size, 9, 1, 2, a) == 0, "%s", visc_last_error());
    c.fast_decode = 1;
    CHECK_MSG(visc_transform_sample(&c, bytes, size, 9, 1, 2, b) == 0, "%s", visc_last_error());
    /* Same draws, so the same crop; fast mode differs only by the DCT
     * downscale: the mean absolute difference stays small. */
    double mad = 0;
    for (int i = 0; i < 3 * 64 * 64; i++) mad += fabs(a[i] - b[i]) / (3 * 64 * 64);
    CHECK_MSG(mad < 0.1, "exact vs fast decode: mean |diff| %.3f (normalized units)", mad);
    free(a);
    free(b);
    free(bytes);
}

/* The byte form of every recipe (a GPU normalizes the batch itself):
 * normalized on the host, the bytes are the float pipeline's output bit
 * for bit, train and eval, exact and fast decode, two views, from encoded
 * bytes and from a decoded image; with the same draws (seed, epoch, idx).
 * A recipe that erases has none, and says so. */
TEST(pipeline_bytes_normalize_to_the_float_output) {
    const char *files[] = {"../shared/data/imagenet-samples/n01440764_tench.JPEG",
                           "../shared/data/imagenet-samples/n01443537_goldfish.JPEG"};
    const char *recipes[] = {"torchvision", "timm", "mocov2", "simclr", "eval"};
    const int S = 48, per = 3 * S * S;
    float *want = malloc(sizeof(float) * 2 * per), *got = malloc(sizeof(float) * 2 * per);
    uint8_t *raw = malloc((size_t)2 * per);
    int cases = 0;
    for (int f = 0; f < 2; f++) {
        size_t size = 0;
        uint8_t *bytes = visc_test_read_file(files[f], &size);
        CHECK_MSG(bytes != NULL, "sample JPEG missing: %s", files[f]);
        if (!bytes) continue;
        visc_image img;
        CHECK(visc_image_decode(bytes, size, &img) == 0);
        for (int r = 0; r < 5; r++)
            for (int mode = 0; mode < 4; mode++) {
                visc_transform_config c;
                CHECK(visc_transform_preset(recipes[r], S, &c) == 0);
                c.reprob = 0;
                c.fast_decode = mode & 1;
                c.views = mode & 2 ? 2 : 1;
                for (int idx = 0; idx < 3; idx++) {
                    int from_image = idx == 2;
                    int a = from_image ? visc_transform_image(&c, &img, 7, f, idx, want)
                                       : visc_transform_sample(&c, bytes, size, 7, f, idx, want);
                    int b = from_image
                                ? visc_transform_image_bytes(&c, &img, 7, f, idx, raw)
                                : visc_transform_sample_bytes(&c, bytes, size, 7, f, idx, raw);
                    CHECK_MSG(a == 0 && b == 0, "%s: %s", recipes[r], visc_last_error());
                    visc_normalize_bytes(raw, (size_t)c.views, (size_t)S * S, c.mean, c.std, got);
                    CHECK_MSG(memcmp(want, got, sizeof(float) * (size_t)c.views * per) == 0,
                              "%s, mode %d, sample %d: the bytes do not normalize to the floats",
                              recipes[r], mode, idx);
                    cases++;
                }
            }
        visc_image_free(&img);
        free(bytes);
    }
    CHECK(cases == 2 * 5 * 4 * 3);
    visc_transform_config c;
    CHECK(visc_transform_preset("timm", S, &c) == 0);
    c.reprob = 0.25f;
    CHECK(visc_transform_bytes_ok(&c) != 0 && strstr(visc_last_error(), "erasing"));
    CHECK(visc_transform_image_bytes(&c, NULL, 7, 0, 0, raw) != 0);
    free(want);
    free(got);
    free(raw);
}

/* ---- the fast resize against a plain transcription of Pillow ---- */

/* Pillow's ImagingResampleHorizontal/Vertical_8bpc as written there: one
 * window per output, its own length, scalar sums. The fast resize pads and
 * moves windows and vectorizes; it must give the very same bytes. */
static double ref_filter(int bicubic, double x) {
    if (x < 0) x = -x;
    if (!bicubic) return x < 1.0 ? 1.0 - x : 0.0;
    if (x < 1.0) return (1.5 * x - 2.5) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * -0.5;
    return 0.0;
}

static uint8_t ref_clip(int32_t v) {
    v >>= 22;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One pass over `lines` lines of `in` samples (`chans` bytes each, `step`
 * bytes apart, lines `lstride` apart) into out (same layout, `osize`
 * samples). */
static void ref_pass(const uint8_t *in, int isize, int chans, size_t step, size_t lstride,
                     int lines, float b0, float b1, int bicubic, int osize, uint8_t *out,
                     size_t ostep, size_t ostride) {
    double scale = (double)(b1 - b0) / osize, fs = scale < 1 ? 1 : scale;
    double support = (bicubic ? 2.0 : 1.0) * fs;
    double w[512];
    for (int o = 0; o < osize; o++) {
        double center = b0 + (o + 0.5) * scale, sum = 0;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0) xmin = 0;
        if (xmax > isize) xmax = isize;
        int n = xmax - xmin > 0 ? xmax - xmin : 0;
        for (int x = 0; x < n; x++)
            sum += w[x] = ref_filter(bicubic, (x + xmin - center + 0.5) / fs);
        int32_t c[512];
        for (int x = 0; x < n; x++) {
            double v = sum != 0 ? w[x] / sum : w[x], s = v * (1 << 22);
            c[x] = (int32_t)(v < 0 ? -0.5 + s : 0.5 + s);
        }
        for (int l = 0; l < lines; l++)
            for (int ch = 0; ch < chans; ch++) {
                int32_t s = 1 << 21;
                for (int x = 0; x < n; x++) s += in[l * lstride + (xmin + x) * step + ch] * c[x];
                out[l * ostride + o * ostep + ch] = ref_clip(s);
            }
    }
}

/* Pillow's resize (both passes, always run) of box to ow x oh. */
static void ref_resize(const visc_image *src, const float *box, int bicubic, visc_image *dst) {
    int ow = dst->width, oh = dst->height;
    uint8_t *tmp = malloc((size_t)src->height * 3 * ow);
    ref_pass(src->data, src->width, 3, 3, (size_t)src->stride, src->height, box[0], box[2], bicubic,
             ow, tmp, 3, 3 * (size_t)ow);
    ref_pass(tmp, src->height, 1, 3 * (size_t)ow, 1, 3 * ow, box[1], box[3], bicubic, oh, dst->data,
             (size_t)dst->stride, 1);
    free(tmp);
}

TEST(fast_resize_equals_pillow_transcription) {
    /* Random sizes (up- and downscaling, windows clipped at both edges),
     * fractional boxes, views with a wider stride, both filters, flips. */
    visc_rng r = visc_rng_make(77, 0, 0);
    int bad = 0, cases = 0;
    for (int t = 0; t < 300 && bad < 5; t++, cases++) {
        int pw = 1 + (int)visc_rng_below(&r, 120), ph = 1 + (int)visc_rng_below(&r, 120);
        visc_image parent;
        visc_transform_image_alloc(&parent, pw, ph);
        for (size_t i = 0; i < (size_t)ph * parent.stride; i++)
            parent.data[i] = (uint8_t)visc_rng_below(&r, 256);
        visc_rect v = {(int)visc_rng_below(&r, (uint32_t)pw), (int)visc_rng_below(&r, (uint32_t)ph),
                       0, 0};
        v.w = 1 + (int)visc_rng_below(&r, (uint32_t)(pw - v.x));
        v.h = 1 + (int)visc_rng_below(&r, (uint32_t)(ph - v.y));
        visc_image src = visc_image_view(&parent, v);
        float box[4] = {0, 0, (float)src.width, (float)src.height};
        if (t % 2) {
            box[0] = visc_rng_uniform(&r) * src.width * 0.5f;
            box[1] = visc_rng_uniform(&r) * src.height * 0.5f;
            box[2] = box[0] + (0.01f + visc_rng_uniform(&r)) * (src.width - box[0]) * 0.99f;
            box[3] = box[1] + (0.01f + visc_rng_uniform(&r)) * (src.height - box[1]) * 0.99f;
        }
        int ow = 1 + (int)visc_rng_below(&r, 90), oh = 1 + (int)visc_rng_below(&r, 90);
        if (t % 7 == 0) ow = src.width; /* one pass only */
        if (t % 11 == 0) oh = src.height;
        int bicubic = (int)visc_rng_below(&r, 2), flip = (int)visc_rng_below(&r, 2);
        visc_image got, want;
        visc_transform_image_alloc(&got, ow, oh);
        visc_transform_image_alloc(&want, ow, oh);
        visc_resize_flip(&src, box, bicubic ? VISC_INTERP_BICUBIC : VISC_INTERP_BILINEAR, flip,
                         &got);
        ref_resize(&src, box, bicubic, &want);
        if (flip) visc_hflip(&want);
        if (memcmp(got.data, want.data, (size_t)oh * got.stride) != 0) {
            bad++;
            CHECK_MSG(0, "case %d: %dx%d box (%g %g %g %g) -> %dx%d %s flip %d differs", t,
                      src.width, src.height, box[0], box[1], box[2], box[3], ow, oh,
                      bicubic ? "bicubic" : "bilinear", flip);
        }
        visc_transform_image_free(&got);
        visc_transform_image_free(&want);
        visc_transform_image_free(&parent);
    }
    CHECK(cases == 300);
}

TEST(resize_flip_is_resize_then_hflip) {
    visc_image img, a, b;
    make_test_image(&img);
    for (int interp = 0; interp < 4; interp++) {
        if (interp == 1) continue;
        for (int k = 0; k < 3; k++) {
            int ow = k == 0 ? img.width : 17 + 9 * k, oh = k == 0 ? img.height : 23;
            visc_transform_image_alloc(&a, ow, oh);
            visc_transform_image_alloc(&b, ow, oh);
            visc_resize(&img, NULL, (visc_interp)interp, &a);
            visc_hflip(&a);
            visc_resize_flip(&img, NULL, (visc_interp)interp, 1, &b);
            CHECK_MSG(memcmp(a.data, b.data, (size_t)oh * a.stride) == 0,
                      "interp %d to %dx%d: resize_flip differs from resize + hflip", interp, ow,
                      oh);
            visc_transform_image_free(&a);
            visc_transform_image_free(&b);
        }
    }
    visc_transform_image_free(&img);
}

TEST(normalize_equals_lookup_table) {
    /* every byte value in every channel, odd width, a stride with padding */
    visc_image img = {NULL, 257, 3, 3 * 257 + 5};
    img.data = malloc((size_t)img.stride * img.height);
    for (int y = 0; y < 3; y++)
        for (int x = 0; x < 3 * 257; x++) img.data[y * img.stride + x] = (uint8_t)(x / 3 + 7 * y);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    float *got = malloc(sizeof(float) * 3 * 257 * 3);
    visc_to_tensor_normalize(&img, mean, std, got);
    int bad = 0;
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 3; y++)
            for (int x = 0; x < 257; x++) {
                float want =
                    ((float)img.data[y * img.stride + 3 * x + c] / 255.0f - mean[c]) / std[c];
                bad += memcmp(&want, &got[(c * 3 + y) * 257 + x], sizeof want) != 0;
            }
    CHECK_MSG(bad == 0, "%d values differ from (v / 255 - m) / s", bad);
    free(got);
    free(img.data);
}

/* Every `step`-th file of the ImageNet samples, sorted by name. */
static int sample_names(char names[][300], int max, int step) {
    struct dirent **list;
    int n = scandir("../shared/data/imagenet-samples", &list, NULL, alphasort), k = 0;
    for (int i = 0; i < n; i++) {
        if (list[i]->d_name[0] != '.' && i % step == 0 && k < max)
            snprintf(names[k++], 300, "../shared/data/imagenet-samples/%s", list[i]->d_name);
        free(list[i]);
    }
    if (n > 0) free(list);
    return k;
}

TEST(pipeline_from_bytes_exact_and_fast_on_samples) {
    /* Exact mode decodes only the crops' union (read to the end of the
     * file): its output must be bit for bit that of decoding everything and
     * cropping. Fast mode (DCT-scaled, stopping after the crop) must stay
     * within a few levels: mean |diff| over each image below 3 levels of
     * 0..255. Most crops need full resolution, where fast mode gives exact
     * mode's pixels; the others are decoded at 1/2 or 1/4. Measured at
     * size 224 over the 1000 samples: 0.03 levels on average, 3.3 for the
     * worst image; at size 96 (here) more crops are reduced. */
    char names[20][300];
    int n = sample_names(names, 20, 50);
    CHECK_MSG(n == 20, "found %d of 20 sample images", n);
    static const char *recipes[] = {"torchvision", "mocov2"};
    double mad_sum = 0;
    int mad_n = 0;
    for (int i = 0; i < n; i++) {
        size_t size = 0;
        uint8_t *bytes = visc_test_read_file(names[i], &size);
        visc_image img;
        CHECK_MSG(bytes && visc_image_decode(bytes, size, &img) == 0, "%s", names[i]);
        if (!bytes) continue;
        visc_transform_config c;
        CHECK(visc_transform_preset(recipes[i % 2], 96, &c) == 0);
        size_t per = (size_t)c.views * 3 * 96 * 96;
        float *a = malloc(sizeof(float) * per), *b = malloc(sizeof(float) * per),
              *f = malloc(sizeof(float) * per);
        CHECK(visc_transform_image(&c, &img, 3, 2, i, a) == 0);
        CHECK_MSG(visc_transform_sample(&c, bytes, size, 3, 2, i, b) == 0, "%s", visc_last_error());
        CHECK_MSG(memcmp(a, b, sizeof(float) * per) == 0,
                  "%s (%s): exact mode from bytes differs "
                  "from decode + transform",
                  names[i], recipes[i % 2]);
        c.fast_decode = 1;
        CHECK_MSG(visc_transform_sample(&c, bytes, size, 3, 2, i, f) == 0, "%s", visc_last_error());
        double mad = 0;
        for (size_t k = 0; k < per; k++) mad += fabs(a[k] - f[k]) * c.std[k / (96 * 96) % 3] * 255;
        mad /= per;
        CHECK_MSG(mad < 3.0, "%s: fast decode differs by %.2f levels on average", names[i], mad);
        mad_sum += mad;
        mad_n++;
        visc_image_free(&img);
        free(a);
        free(b);
        free(f);
        free(bytes);
    }
    CHECK_MSG(mad_n == 0 || mad_sum / mad_n < 2.0, "fast decode: mean |diff| %.2f levels",
              mad_sum / (mad_n ? mad_n : 1));
}

TEST(pipeline_exact_refuses_truncated_file_whatever_the_crop) {
    /* A file cut at 60%: exact mode must refuse it for every crop (as a
     * full decode does), even crops that lie above the cut. */
    size_t size = 0;
    uint8_t *bytes =
        visc_test_read_file("../shared/data/imagenet-samples/n01440764_tench.JPEG", &size);
    CHECK_MSG(bytes != NULL, "sample JPEG missing");
    if (!bytes) return;
    visc_transform_config c;
    CHECK(visc_transform_preset("torchvision", 32, &c) == 0);
    float *out = malloc(sizeof(float) * 3 * 32 * 32);
    int accepted = 0;
    for (int i = 0; i < 40; i++)
        accepted += visc_transform_sample(&c, bytes, size * 6 / 10, 1, 0, i, out) == 0;
    CHECK_MSG(accepted == 0, "exact mode accepted a truncated file %d times in 40", accepted);
    free(out);
    free(bytes);
}

TEST(resize_flip_normalize_equals_resize_then_normalize) {
    /* The folded ToTensor + Normalize (planar rows, floats from the last
     * pass) against the two steps, bit for bit: random sizes, boxes, both
     * filters and nearest, flips, one-pass and copy cases (which take the
     * unfolded path). */
    visc_rng r = visc_rng_make(78, 0, 0);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    int bad = 0;
    for (int t = 0; t < 300 && bad < 5; t++) {
        int sw = 1 + (int)visc_rng_below(&r, 120), sh = 1 + (int)visc_rng_below(&r, 120);
        visc_image src;
        visc_transform_image_alloc(&src, sw, sh);
        for (size_t i = 0; i < (size_t)sh * src.stride; i++)
            src.data[i] = (uint8_t)visc_rng_below(&r, 256);
        float box[4] = {0, 0, (float)sw, (float)sh};
        if (t % 2) {
            box[0] = visc_rng_uniform(&r) * sw * 0.5f;
            box[1] = visc_rng_uniform(&r) * sh * 0.5f;
            box[2] = box[0] + (0.01f + visc_rng_uniform(&r)) * (sw - box[0]) * 0.99f;
            box[3] = box[1] + (0.01f + visc_rng_uniform(&r)) * (sh - box[1]) * 0.99f;
        }
        int ow = 1 + (int)visc_rng_below(&r, 90), oh = 1 + (int)visc_rng_below(&r, 90);
        if (t % 7 == 0) ow = sw;
        if (t % 11 == 0) oh = sh;
        visc_interp interp = t % 5 == 0   ? VISC_INTERP_NEAREST
                             : t % 5 == 1 ? VISC_INTERP_BICUBIC
                                          : VISC_INTERP_BILINEAR;
        int flip = (int)visc_rng_below(&r, 2);
        size_t n = 3 * (size_t)ow * oh;
        float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
        visc_image res;
        visc_transform_image_alloc(&res, ow, oh);
        visc_resize_flip(&src, t % 2 ? box : NULL, interp, flip, &res);
        visc_to_tensor_normalize(&res, mean, std, want);
        visc_resize_flip_normalize(&src, t % 2 ? box : NULL, interp, flip, ow, oh, mean, std, got);
        if (memcmp(got, want, sizeof(float) * n) != 0) {
            bad++;
            CHECK_MSG(0, "case %d: %dx%d -> %dx%d interp %d flip %d: folded normalize differs", t,
                      sw, sh, ow, oh, (int)interp, flip);
        }
        free(got);
        free(want);
        visc_transform_image_free(&res);
        visc_transform_image_free(&src);
    }
}

TEST(pipeline_folded_views_equal_the_steps) {
    /* The pipeline folds Normalize into the resize only for views where no
     * pixel step applies, deciding on a copy of the random stream: every
     * view (folded or not) must equal the recipe done step by step, and
     * the stream must move on as if nothing was folded. */
    static const char *presets[] = {"torchvision", "mocov2"};
    visc_image img;
    make_test_image(&img);
    int folded = 0, unfolded = 0;
    for (int p = 0; p < 2; p++) {
        visc_transform_config c;
        CHECK(visc_transform_preset(presets[p], 40, &c) == 0);
        size_t per = 3 * 40 * 40, n = (size_t)c.views * per;
        float *got = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
        for (int idx = 0; idx < 60; idx++) {
            CHECK(visc_transform_image(&c, &img, 9, 1, idx, got) == 0);
            visc_rng r = visc_rng_make(9, VISC_STREAM_AUGMENT + 16, (uint64_t)idx);
            visc_rect crop[2];
            int flip[2];
            for (int v = 0; v < c.views; v++) {
                crop[v] = visc_rrc_params(&r, img.width, img.height, c.scale, c.ratio);
                flip[v] = visc_rng_uniform(&r) < c.hflip;
            }
            for (int v = 0; v < c.views; v++) {
                visc_image view = visc_image_view(&img, crop[v]), res;
                visc_transform_image_alloc(&res, 40, 40);
                visc_resize_flip(&view, NULL, c.interp, flip[v], &res);
                int steps = 0;
                if (!(c.jitter_p < visc_rng_uniform(&r))) {
                    visc_jitter_draw d;
                    visc_color_jitter_draw(&c.jitter, &r, &d);
                    visc_color_jitter_apply(&d, &res);
                    steps += d.enabled[0] || d.enabled[1] || d.enabled[2] || d.enabled[3];
                }
                if (visc_rng_uniform(&r) < c.gray_p) {
                    visc_grayscale(&res);
                    steps++;
                }
                if (!(c.blur_p < visc_rng_uniform(&r))) {
                    float sigma = c.blur_sigma[0] +
                                  (c.blur_sigma[1] - c.blur_sigma[0]) * visc_rng_uniform(&r);
                    visc_gaussian_blur(&res, 5, sigma); /* (int)(0.1 * 40) = 4 -> 5 */
                    steps++;
                }
                if (visc_rng_uniform(&r) < c.solarize_p) steps++;
                visc_to_tensor_normalize(&res, c.mean, c.std, want + v * per);
                if (steps) unfolded++;
                else folded++;
                visc_transform_image_free(&res);
            }
            CHECK_MSG(memcmp(got, want, sizeof(float) * n) == 0, "%s idx %d differs from the steps",
                      presets[p], idx);
        }
        free(got);
        free(want);
    }
    CHECK(folded > 60 && unfolded > 20); /* both kinds of views were tried */
    visc_transform_image_free(&img);
}

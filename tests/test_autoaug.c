/* test_autoaug.c: RandAugment's PIL ops, Random Erasing, Mixup / CutMix and
 * the soft-target loss, against timm / PIL / torch and by their statistics.
 *
 * tests/golden/autoaug.safetensors comes from tools/gen_golden_autoaug.py
 * (timm 0.9.16, PIL 9.4, torch 1.13) on 40 x 32 images.
 *
 * Tolerances:
 * - every PIL op and every timm AugmentOp: EXACT, every byte. pil_ops.c
 *   repeats libImaging's arithmetic in the same types and order (float32
 *   blends, float32 SMOOTH kernel, double affine sampling), so any
 *   difference, even one level at one border pixel, is a semantic bug;
 * - LEVEL_TO_ARG: exact in float32 (the reference is computed in double from
 *   the same float32 magnitude and rounded once);
 * - Mixup / CutMix output and targets: exact (torch's float32 products by
 *   float32-rounded scalars, then one float32 sum, as mixup.c does);
 * - soft loss vs float64 torch: atol 1e-6, rtol 1e-5 (float32 rounding of
 *   O(1) values summed over 7 classes);
 * - statistics: 5 standard errors of the sample size (a false alarm rate
 *   below 1e-6 per check), and the draws are fixed by the seed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/autoaug.h"
#include "visc/io.h"
#include "visc/nn.h"

/* ---- golden file ---- */

static visc_safetensors gst;
static int gst_state;

static const visc_safetensors *golden(void) {
    if (gst_state == 0) {
        gst_state =
            visc_safetensors_open(&gst, visc_golden_path("autoaug.safetensors")) == 0 ? 1 : -1;
        if (gst_state < 0) fprintf(stderr, "  autoaug.safetensors: %s\n", visc_last_error());
    }
    return gst_state > 0 ? &gst : NULL;
}

static size_t numel_of(const char *name) {
    const visc_safetensors *st = golden();
    const visc_st_tensor *t = st ? visc_safetensors_find(st, name) : NULL;
    return t ? t->numel : 0;
}

/* Golden tensor `name` as floats (numel must match; zeros and a failure otherwise). */
static float *load(const char *name, size_t numel) {
    float *p = calloc(numel ? numel : 1, sizeof(float));
    const visc_safetensors *st = golden();
    if (!st || visc_safetensors_read_f32(st, name, p, numel) != 0)
        CHECK_MSG(0, "golden tensor %s: %s", name, st ? visc_last_error() : "no file");
    return p;
}

static int load_int(const char *name) {
    float *f = load(name, 1);
    int v = (int)f[0];
    free(f);
    return v;
}

static void load_ints(const char *name, int *out, int n) {
    float *f = load(name, (size_t)n);
    for (int i = 0; i < n; i++) out[i] = (int)f[i];
    free(f);
}

/* Golden image img.<i> (32 x W x 3). */
static visc_image load_image(int i) {
    char name[32];
    snprintf(name, sizeof name, "img.%d", i);
    const visc_st_tensor *t = golden() ? visc_safetensors_find(golden(), name) : NULL;
    visc_image img = {0};
    if (!t || t->ndim != 3 || t->shape[2] != 3) {
        CHECK_MSG(0, "golden image %s missing", name);
        return img;
    }
    img.height = (int)t->shape[0];
    img.width = (int)t->shape[1];
    img.stride = 3 * img.width + 5; /* padded rows: the ops must honour stride */
    img.data = calloc((size_t)img.stride * img.height, 1);
    float *f = load(name, t->numel);
    for (int y = 0; y < img.height; y++)
        for (int x = 0; x < 3 * img.width; x++)
            img.data[(size_t)y * img.stride + x] = (uint8_t)f[(size_t)y * 3 * img.width + x];
    free(f);
    return img;
}

/* Compares img with golden tensor `name`; returns the number of differing bytes. */
static int compare_image(const visc_image *img, const char *name, const char *what) {
    size_t n = (size_t)img->width * img->height * 3;
    if (numel_of(name) != n) {
        CHECK_MSG(0, "%s: golden %s has %zu elements, want %zu", what, name, numel_of(name), n);
        return -1;
    }
    float *want = load(name, n);
    int bad = 0, worst = 0, wx = 0, wy = 0;
    for (int y = 0; y < img->height; y++)
        for (int x = 0; x < 3 * img->width; x++) {
            int d = abs((int)img->data[(size_t)y * img->stride + x] -
                        (int)want[(size_t)y * 3 * img->width + x]);
            if (d) bad++;
            if (d > worst) worst = d, wx = x / 3, wy = y;
        }
    free(want);
    CHECK_MSG(bad == 0, "%s: %d bytes differ from PIL, worst %d levels at (%d, %d)", what, bad,
              worst, wx, wy);
    return bad;
}

static visc_randaugment default_ra(void) {
    visc_randaugment ra;
    CHECK(visc_randaugment_parse("rand-m9-mstd0.5-inc1", &ra) == 0);
    return ra;
}

/* ---- PIL ops ---- */

TEST(golden_file_opens) { CHECK(golden() != NULL); }

TEST(pil_ops_match_pil_exactly) {
    visc_randaugment ra = default_ra();
    int count = golden() ? load_int("op.count") : 0;
    CHECK(count >= 80);
    for (int n = 0; n < count; n++) {
        char name[48], what[96];
        int cfg[3];
        snprintf(name, sizeof name, "op.%d.cfg", n);
        load_ints(name, cfg, 3);
        snprintf(name, sizeof name, "op.%d.arg", n);
        float *arg = load(name, 1);
        visc_image img = load_image(cfg[1]);
        snprintf(what, sizeof what, "op %d %s(%g)%s", n, visc_ra_op_name((visc_ra_op)cfg[0]),
                 arg[0], cfg[2] ? " bicubic" : "");
        /* scratch NULL for some cases, a caller buffer for the others */
        uint8_t *scratch = n % 2 ? malloc(3 * (size_t)img.width * img.height) : NULL;
        visc_ra_op_apply(&ra, (visc_ra_op)cfg[0], arg[0], cfg[2], &img, scratch);
        snprintf(name, sizeof name, "op.%d.out", n);
        compare_image(&img, name, what);
        /* the padding bytes past each row are never touched */
        int pad_ok = 1;
        for (int y = 0; y < img.height; y++)
            for (int x = 3 * img.width; x < img.stride; x++)
                pad_ok &= img.data[(size_t)y * img.stride + x] == 0;
        CHECK_MSG(pad_ok, "%s wrote into the row padding", what);
        free(scratch);
        free(img.data);
        free(arg);
    }
}

TEST(augment_op_chain_matches_timm) {
    /* magnitude -> LEVEL_TO_ARG -> op, as timm's AugmentOp with a forced sign */
    visc_randaugment ra = default_ra();
    int count = golden() ? load_int("chain.count") : 0;
    CHECK(count >= 20);
    for (int n = 0; n < count; n++) {
        char name[48], what[96];
        int cfg[4];
        snprintf(name, sizeof name, "chain.%d.cfg", n);
        load_ints(name, cfg, 4);
        snprintf(name, sizeof name, "chain.%d.mag", n);
        float *mag = load(name, 1);
        visc_image img = load_image(cfg[1]);
        visc_ra_op op = (visc_ra_op)cfg[0];
        double arg = visc_ra_level_to_arg(&ra, op, mag[0], cfg[3]);
        visc_ra_op_apply(&ra, op, arg, cfg[2], &img, NULL);
        snprintf(what, sizeof what, "chain %d %s m=%g negate=%d", n, visc_ra_op_name(op), mag[0],
                 cfg[3]);
        snprintf(name, sizeof name, "chain.%d.out", n);
        compare_image(&img, name, what);
        free(img.data);
        free(mag);
    }
}

TEST(level_to_arg_matches_timm) {
    visc_randaugment ra = default_ra();
    size_t n = numel_of("level.mag");
    CHECK(n > 100);
    int *cfg = malloc(2 * n * sizeof(int));
    load_ints("level.cfg", cfg, (int)(2 * n));
    float *mag = load("level.mag", n), *want = load("level.arg", n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float got =
            (float)visc_ra_level_to_arg(&ra, (visc_ra_op)cfg[2 * i], mag[i], cfg[2 * i + 1]);
        if (got != want[i] && bad++ < 5)
            CHECK_MSG(0, "%s(m=%g, negate=%d) = %.9g, timm %.9g",
                      visc_ra_op_name((visc_ra_op)cfg[2 * i]), mag[i], cfg[2 * i + 1], got,
                      want[i]);
    }
    CHECK(bad == 0);
    free(cfg), free(mag), free(want);
}

/* ---- the spec ---- */

TEST(randaugment_parse) {
    visc_randaugment ra;
    CHECK(visc_randaugment_parse("rand-m9-mstd0.5-inc1", &ra) == 0);
    CHECK(ra.num_layers == 2 && ra.magnitude == 9.0 && ra.magnitude_std == 0.5);
    CHECK(ra.magnitude_max == 10.0 && ra.prob == 0.5 && ra.increasing == 1);
    CHECK(ra.num_ops == 15 && ra.ops[4] == VISC_RA_POSTERIZE_INCREASING);
    CHECK(ra.ops[14] == VISC_RA_TRANSLATE_Y_REL && ra.ops[3] == VISC_RA_ROTATE);
    CHECK(ra.fill[0] == 124 && ra.fill[1] == 116 && ra.fill[2] == 104);
    CHECK(ra.interpolation == VISC_RA_INTERP_RANDOM && ra.translate_pct == 0.45);

    CHECK(visc_randaugment_parse("rand", &ra) == 0);
    CHECK(ra.magnitude == 10.0 && ra.num_layers == 2 && !ra.increasing);
    CHECK(ra.ops[4] == VISC_RA_POSTERIZE && ra.ops[7] == VISC_RA_COLOR);

    CHECK(visc_randaugment_parse("rand-n3-m7-p0.8-mmax12-mstd101", &ra) == 0);
    CHECK(ra.num_layers == 3 && ra.magnitude == 7.0 && ra.prob == 0.8);
    CHECK(ra.magnitude_max == 12.0 && isinf(ra.magnitude_std));
    CHECK(visc_randaugment_parse("rand-mstd1-mstd2", &ra) == 0 && ra.magnitude_std == 1.0);
    CHECK(visc_randaugment_parse("rand-inc0", &ra) == 0 && ra.increasing == 1); /* as timm */

    const char *bad[] = {"",
                         "randm9",
                         "rnd-m9",
                         "rand-",
                         "rand-m",
                         "rand-m9-",
                         "rand--m9",
                         "rand-x9",
                         "rand-m9.5",
                         "rand-p1.5",
                         "rand-pnan",
                         "rand-mstd-1",
                         "rand-n99",
                         "rand-tweights",
                         "rand-m9-mstd0.5-inc1-foo",
                         "rand-m99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = visc_randaugment_parse(bad[i], &ra);
        CHECK_MSG(rc == -1, "spec '%s' was accepted", bad[i]);
        CHECK_MSG(rc != -1 || strstr(visc_last_error(), "randaugment"), "no error for '%s'",
                  bad[i]);
    }
    CHECK(visc_randaugment_parse(NULL, &ra) == -1);
}

/* ---- the draws ---- */

TEST(randaugment_draw_statistics) {
    visc_randaugment ra = default_ra();
    visc_rng r = visc_rng_make(11, VISC_STREAM_AUGMENT, 0);
    const int draws = 20000; /* x 2 layers */
    int per_op[VISC_RA_NUM_OPS] = {0}, applied = 0, negated = 0, geo = 0, bicubic = 0, total = 0;
    double msum = 0, m2 = 0, mmin = 1e9, mmax = -1e9;
    for (int i = 0; i < draws; i++) {
        visc_ra_layer l[VISC_RA_MAX_LAYERS];
        int n = visc_randaugment_draw(&ra, &r, l, VISC_RA_MAX_LAYERS);
        CHECK(n == 2);
        for (int k = 0; k < n; k++, total++) {
            per_op[l[k].op]++;
            applied += l[k].apply;
            negated += l[k].negate;
            msum += l[k].magnitude;
            m2 += l[k].magnitude * l[k].magnitude;
            mmin = fmin(mmin, l[k].magnitude);
            mmax = fmax(mmax, l[k].magnitude);
            if (l[k].op == VISC_RA_ROTATE || l[k].op == VISC_RA_SHEAR_X ||
                l[k].op == VISC_RA_SHEAR_Y || l[k].op == VISC_RA_TRANSLATE_X_REL ||
                l[k].op == VISC_RA_TRANSLATE_Y_REL) {
                geo++;
                bicubic += l[k].bicubic;
            }
        }
    }
    /* each of the 15 ops uniformly, and only those */
    double p = 1.0 / 15, se = sqrt(p * (1 - p) / total);
    for (int k = 0; k < ra.num_ops; k++) {
        double f = (double)per_op[ra.ops[k]] / total;
        CHECK_MSG(fabs(f - p) < 5 * se, "%s drawn %.4f, want %.4f", visc_ra_op_name(ra.ops[k]), f,
                  p);
    }
    CHECK(per_op[VISC_RA_POSTERIZE] == 0 && per_op[VISC_RA_COLOR] == 0);
    double half = 5 * sqrt(0.25 / total);
    CHECK_CLOSE((double)applied / total, 0.5, half, 0);
    CHECK_CLOSE((double)negated / total, 0.5, half, 0);
    CHECK_CLOSE((double)bicubic / geo, 0.5, 5 * sqrt(0.25 / geo), 0);
    /* magnitude: N(9, 0.5) clipped to [0, 10]: E = 9 - 0.5 (phi(2) - 2 (1 - Phi(2))) */
    double mean = msum / total, sd = sqrt(m2 / total - mean * mean);
    double want = 9.0 - 0.5 * (0.0539909665 - 2 * 0.0227501319);
    CHECK_CLOSE(mean, want, 5 * 0.5 / sqrt(total), 0);
    CHECK(sd > 0.45 && sd < 0.5); /* the clip at 10 trims the upper tail */
    CHECK(mmin >= 0.0 && mmax == 10.0);

    /* mstd > 100: uniform in [0, m] */
    CHECK(visc_randaugment_parse("rand-m8-mstd101-p1", &ra) == 0);
    msum = 0;
    int applied_all = 1, in_range = 1;
    for (int i = 0; i < draws; i++) {
        visc_ra_layer l[2];
        visc_randaugment_draw(&ra, &r, l, 2);
        msum += l[0].magnitude;
        applied_all &= l[0].apply;
        in_range &= l[0].magnitude >= 0 && l[0].magnitude <= 8;
    }
    CHECK(in_range);
    CHECK_CLOSE(msum / draws, 4.0, 5 * 8 / sqrt(12.0 * draws), 0);
    CHECK(applied_all); /* p = 1 */
}

static visc_image make_image(int w, int h, uint32_t seed) {
    visc_image img = {.width = w, .height = h, .stride = 3 * w};
    img.data = malloc((size_t)img.stride * h + 1);
    visc_rng r = visc_rng_make(seed, 99, 0);
    for (size_t i = 0; i < (size_t)img.stride * h; i++)
        img.data[i] = (uint8_t)visc_rng_below(&r, 256);
    return img;
}

TEST(randaugment_apply_deterministic_and_safe) {
    visc_randaugment ra = default_ra();
    /* same stream -> same image; a different stream -> (almost surely) another */
    visc_image a = make_image(40, 32, 1), b = make_image(40, 32, 1), c = make_image(40, 32, 1);
    int differs = 0;
    for (int s = 0; s < 20; s++) {
        visc_rng r1 = visc_rng_make(5, VISC_STREAM_AUGMENT, (uint64_t)s);
        visc_rng r2 = visc_rng_make(5, VISC_STREAM_AUGMENT, (uint64_t)s);
        visc_rng r3 = visc_rng_make(6, VISC_STREAM_AUGMENT, (uint64_t)s);
        visc_randaugment_apply(&ra, &r1, &a);
        visc_randaugment_apply(&ra, &r2, &b);
        visc_randaugment_apply(&ra, &r3, &c);
        CHECK(memcmp(a.data, b.data, (size_t)a.stride * a.height) == 0);
        differs |= memcmp(a.data, c.data, (size_t)a.stride * a.height) != 0;
    }
    CHECK(differs);
    free(a.data), free(b.data), free(c.data);
    /* every op at extreme magnitudes on tiny images (ASan / UBSan catch any
     * read outside the image) */
    const int sizes[][2] = {{1, 1}, {2, 1}, {1, 3}, {3, 3}, {7, 5}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int op = 0; op < VISC_RA_NUM_OPS; op++)
            for (int m = 0; m <= 10; m += 5)
                for (int neg = 0; neg < 2; neg++) {
                    visc_image t = make_image(sizes[s][0], sizes[s][1], (uint32_t)(op + m));
                    double arg = visc_ra_level_to_arg(&ra, (visc_ra_op)op, m, neg);
                    visc_ra_op_apply(&ra, (visc_ra_op)op, arg, neg, &t, NULL);
                    free(t.data);
                }
}

/* ---- random erasing ---- */

TEST(random_erasing_statistics) {
    visc_erasing e = visc_erasing_default(0.25f);
    CHECK(e.mode == VISC_ERASE_PIXEL && e.min_count == 1 && e.max_count == 1);
    CHECK_CLOSE(e.max_area, 1.0 / 3.0, 1e-7, 0);
    CHECK_CLOSE(e.max_aspect, 1.0 / 0.3, 1e-6, 0);
    const int C = 3, H = 64, W = 64, images = 4000;
    float *x = malloc(sizeof(float) * C * H * W);
    visc_rng r = visc_rng_make(3, VISC_STREAM_AUGMENT, 1);
    int erased = 0, range_bad = 0;
    double frac_sum = 0, logar_sum = 0, vsum = 0, v2 = 0, within1 = 0, vcount = 0;
    for (int i = 0; i < images; i++) {
        memset(x, 0, sizeof(float) * C * H * W);
        visc_random_erasing_apply(&e, &r, x, C, H, W);
        int y0 = H, y1 = -1, x0 = W, x1 = -1;
        for (int y = 0; y < H; y++)
            for (int xx = 0; xx < W; xx++)
                if (x[y * W + xx] != 0) {
                    y0 = y < y0 ? y : y0, y1 = y > y1 ? y : y1;
                    x0 = xx < x0 ? xx : x0, x1 = xx > x1 ? xx : x1;
                }
        if (y1 < 0) continue;
        erased++;
        int h = y1 - y0 + 1, w = x1 - x0 + 1;
        /* every element of the box and every channel erased, nothing outside */
        int inside = 0;
        for (int c = 0; c < C; c++)
            for (int y = y0; y <= y1; y++)
                for (int xx = x0; xx <= x1; xx++) {
                    float v = x[((size_t)c * H + y) * W + xx];
                    inside += v != 0;
                    vsum += v, v2 += (double)v * v, within1 += fabs(v) < 1, vcount++;
                }
        CHECK(inside == C * h * w);
        /* h = round(sqrt(A r)), w = round(sqrt(A / r)) for some A in [0.02, 1/3] HW
         * and r in [0.3, 1 / 0.3]: the rounding intervals must meet those ranges */
        double amin = (h - 0.5) * (w - 0.5), amax = (h + 0.5) * (w + 0.5);
        double rmin = (h - 0.5) / (w + 0.5), rmax = (h + 0.5) / (w - 0.5);
        if (amax < 0.02 * H * W || amin > H * W / 3.0 || rmax < 0.3 || rmin > 1 / 0.3) range_bad++;
        frac_sum += (double)h * w / (H * W);
        logar_sum += log((double)h / w);
    }
    CHECK(range_bad == 0);
    CHECK_CLOSE((double)erased / images, 0.25, 5 * sqrt(0.25 * 0.75 / images), 0);
    /* area ~ U(0.02, 1/3) (rejections of boxes taller or wider than the image
     * are below 0.5% here); aspect log-uniform and symmetric */
    CHECK_CLOSE(frac_sum / erased, (0.02 + 1 / 3.0) / 2, 5 * 0.102 / sqrt(erased) + 0.002, 0);
    CHECK_CLOSE(logar_sum / erased, 0.0, 5 * 0.7 / sqrt(erased), 0);
    /* the fill: N(0, 1) per element */
    double mean = vsum / vcount, var = v2 / vcount - mean * mean;
    CHECK_CLOSE(mean, 0.0, 5 / sqrt(vcount), 0);
    CHECK_CLOSE(var, 1.0, 5 * sqrt(2.0 / vcount), 0);
    CHECK_CLOSE(within1 / vcount, 0.682689, 5 * sqrt(0.22 / vcount), 0);

    /* modes: const writes zeros over ones; rand one value per channel */
    e.p = 1.0f;
    e.mode = VISC_ERASE_CONST;
    for (int i = 0; i < C * H * W; i++) x[i] = 1.0f;
    visc_random_erasing_apply(&e, &r, x, C, H, W);
    int zeros = 0;
    for (int i = 0; i < C * H * W; i++) zeros += x[i] == 0.0f;
    CHECK(zeros > 0 && zeros % C == 0);
    e.mode = VISC_ERASE_RAND;
    for (int i = 0; i < C * H * W; i++) x[i] = 100.0f;
    visc_random_erasing_apply(&e, &r, x, C, H, W);
    for (int c = 0; c < C; c++) {
        float v = 100.0f;
        int same = 1, n = 0;
        for (int i = 0; i < H * W; i++)
            if (x[c * H * W + i] != 100.0f) {
                if (v == 100.0f) v = x[c * H * W + i];
                same &= x[c * H * W + i] == v;
                n++;
            }
        CHECK(n > 0 && same);
    }
    /* p = 0: untouched; an image too small for any box: untouched */
    e.p = 0.0f;
    visc_random_erasing_apply(&e, &r, x, C, H, W);
    e.p = 1.0f;
    float tiny[3] = {5, 5, 5};
    visc_random_erasing_apply(&e, &r, tiny, 3, 1, 1);
    CHECK(tiny[0] == 5 && tiny[1] == 5 && tiny[2] == 5);
    free(x);
}

/* ---- mixup / cutmix ---- */

TEST(mixup_matches_timm) {
    int count = golden() ? load_int("mix.count") : 0;
    CHECK(count == 5);
    for (int n = 0; n < count; n++) {
        char name[48];
        int cfg[10];
        snprintf(name, sizeof name, "mix.%d.cfg", n);
        load_ints(name, cfg, 10);
        int B = cfg[5], C = cfg[6], H = cfg[7], W = cfg[8], K = cfg[9];
        size_t nx = (size_t)B * C * H * W;
        snprintf(name, sizeof name, "mix.%d.lam", n);
        float *lam = load(name, 1);
        visc_mixup mx = visc_mixup_default(K);
        visc_mixup_params d = {.lam = lam[0], .lam_raw = lam[0], .use_cutmix = cfg[0]};
        if (d.use_cutmix) {
            d.yl = cfg[1], d.yh = cfg[2], d.xl = cfg[3], d.xh = cfg[4];
            /* rand_bbox: sides int(H sqrt(1 - lam)), clipped at the image border */
            int cut_h = (int)(H * sqrt(1.0 - d.lam_raw)), cut_w = (int)(W * sqrt(1.0 - d.lam_raw));
            CHECK(d.yh - d.yl <= cut_h / 2 * 2 && d.xh - d.xl <= cut_w / 2 * 2);
            d.lam = 1.0 - (double)((d.yh - d.yl) * (d.xh - d.xl)) / (H * W);
        }
        float *labf = load((snprintf(name, sizeof name, "mix.%d.labels", n), name), (size_t)B);
        int32_t labels[16];
        for (int i = 0; i < B; i++) labels[i] = (int32_t)labf[i];
        float *x = load((snprintf(name, sizeof name, "mix.%d.x_in", n), name), nx);
        float *want_x = load((snprintf(name, sizeof name, "mix.%d.x_out", n), name), nx);
        float *want_t =
            load((snprintf(name, sizeof name, "mix.%d.targets", n), name), (size_t)B * K);
        float *t = malloc(sizeof(float) * B * K);
        visc_mixup_mix(&mx, &d, x, B, C, H, W, labels, t);
        snprintf(name, sizeof name, "mix %d (%s, lam %g) x", n, d.use_cutmix ? "cutmix" : "mixup",
                 d.lam);
        CHECK_ARRAYS(name, x, want_x, nx, 0, 0);
        snprintf(name, sizeof name, "mix %d targets", n);
        CHECK_ARRAYS(name, t, want_t, (size_t)B * K, 0, 0);
        free(lam), free(labf), free(x), free(want_x), free(want_t), free(t);
    }
}

TEST(beta_and_gamma_moments) {
    visc_rng r = visc_rng_make(21, 7, 0);
    const int n = 40000;
    const double shapes[] = {0.3, 0.8, 1.0, 2.5};
    for (int s = 0; s < 4; s++) { /* Gamma(k): mean k, variance k */
        double sum = 0, sum2 = 0, k = shapes[s];
        for (int i = 0; i < n; i++) {
            double g = visc_sample_gamma(&r, k);
            CHECK(g >= 0);
            sum += g, sum2 += g * g;
        }
        double mean = sum / n, var = sum2 / n - mean * mean;
        CHECK_CLOSE(mean, k, 5 * sqrt(k / n), 0);
        CHECK_CLOSE(var, k, 6 * sqrt((2 * k * k + 6 * k) / n), 0); /* Var(g^2) ~ 2k^2 + 6k.. */
    }
    /* Beta(0.8, 0.8): mean 1/2, variance 1 / (4 (2a + 1)) */
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; i++) {
        double b = visc_sample_beta(&r, 0.8, 0.8);
        CHECK(b >= 0 && b <= 1);
        sum += b, sum2 += b * b;
    }
    double var = sum2 / n - (sum / n) * (sum / n);
    CHECK_CLOSE(sum / n, 0.5, 5 * sqrt(0.0962 / n), 0);
    CHECK_CLOSE(var, 1.0 / (4 * 2.6), 0.003, 0);
    /* Beta(1, 1): uniform, 10 equal bins */
    int bins[10] = {0};
    for (int i = 0; i < n; i++) {
        int k = (int)(visc_sample_beta(&r, 1.0, 1.0) * 10);
        bins[k > 9 ? 9 : k]++;
    }
    for (int k = 0; k < 10; k++) CHECK_CLOSE((double)bins[k] / n, 0.1, 5 * sqrt(0.09 / n), 0);
}

TEST(mixup_draw_switch_and_lam) {
    visc_mixup mx = visc_mixup_default(10);
    CHECK(visc_mixup_validate(&mx) == 0);
    visc_rng r = visc_rng_make(8, VISC_STREAM_AUGMENT, 3);
    const int n = 20000, H = 24, W = 20;
    int cut = 0, ncut = 0;
    double mix_sum = 0, mix2 = 0, cut_raw_sum = 0;
    int nmix = 0;
    for (int i = 0; i < n; i++) {
        visc_mixup_params d;
        visc_mixup_draw(&mx, &r, H, W, &d);
        CHECK(d.lam >= 0 && d.lam <= 1);
        if (d.use_cutmix) {
            cut++;
            if (d.lam_raw == 1.0) continue;
            ncut++;
            cut_raw_sum += d.lam_raw;
            /* the box lies in the image, is at most the unclipped side, and lam
             * is corrected to the pasted area */
            CHECK(d.yl >= 0 && d.yl <= d.yh && d.yh <= H && d.xl >= 0 && d.xl <= d.xh && d.xh <= W);
            int cut_h = (int)(H * sqrt(1 - d.lam_raw)), cut_w = (int)(W * sqrt(1 - d.lam_raw));
            CHECK(d.yh - d.yl <= cut_h / 2 * 2 && d.xh - d.xl <= cut_w / 2 * 2);
            CHECK(d.lam == 1.0 - (double)((d.yh - d.yl) * (d.xh - d.xl)) / (H * W));
            /* an unclipped box has exactly the even-rounded sides */
            if (d.yl > 0 && d.yh < H) CHECK(d.yh - d.yl == cut_h / 2 * 2);
        } else {
            nmix++;
            mix_sum += d.lam, mix2 += d.lam * d.lam;
        }
    }
    CHECK_CLOSE((double)cut / n, 0.5, 5 * sqrt(0.25 / n), 0);     /* switch_prob */
    CHECK_CLOSE(mix_sum / nmix, 0.5, 5 * sqrt(0.0962 / nmix), 0); /* Beta(0.8, 0.8) */
    CHECK_CLOSE(mix2 / nmix - (mix_sum / nmix) * (mix_sum / nmix), 0.0962, 0.004, 0);
    CHECK_CLOSE(cut_raw_sum / ncut, 0.5, 5 * sqrt(1 / 12.0 / ncut), 0); /* Beta(1, 1) */

    /* prob 0.6: 40% of the batches are left alone; switch_prob 1: all cutmix */
    mx.prob = 0.6;
    mx.switch_prob = 1.0;
    int unmixed = 0, mixup = 0;
    for (int i = 0; i < n; i++) {
        visc_mixup_params d;
        visc_mixup_draw(&mx, &r, H, W, &d);
        unmixed += d.lam_raw == 1.0;
        mixup += d.lam_raw != 1.0 && !d.use_cutmix;
    }
    CHECK_CLOSE((double)unmixed / n, 0.4, 5 * sqrt(0.24 / n), 0);
    CHECK(mixup == 0);
    /* cutmix_minmax: boxes with sides in [0.25, 0.75) of the image */
    mx = visc_mixup_default(10);
    mx.cutmix_alpha = 0.0;
    mx.mixup_alpha = 0.0;
    mx.cutmix_minmax[0] = 0.25;
    mx.cutmix_minmax[1] = 0.75;
    CHECK(visc_mixup_validate(&mx) == 0);
    for (int i = 0; i < 1000; i++) {
        visc_mixup_params d;
        visc_mixup_draw(&mx, &r, H, W, &d);
        CHECK(d.use_cutmix && d.yh - d.yl >= 6 && d.yh - d.yl < 18 && d.xh - d.xl >= 5 &&
              d.xh - d.xl < 15 && d.yh <= H && d.xh <= W);
    }
}

TEST(mixup_apply_targets_and_batch) {
    const int B = 6, C = 2, H = 5, W = 7, K = 9;
    visc_mixup mx = visc_mixup_default(K);
    float *x = malloc(sizeof(float) * B * C * H * W), *t = malloc(sizeof(float) * B * K);
    int32_t labels[6] = {0, 8, 3, 3, 5, 1};
    visc_rng r = visc_rng_make(4, 5, 6);
    for (int it = 0; it < 200; it++) {
        for (int i = 0; i < B * C * H * W; i++) x[i] = (float)(i / (C * H * W)); /* image i = i */
        visc_mixup_params d;
        visc_rng r2 = r;
        visc_mixup_draw(&mx, &r2, H, W, &d);
        visc_mixup_apply(&mx, &r, x, B, C, H, W, labels, t);
        CHECK(memcmp(&r, &r2, sizeof r) == 0); /* apply = draw + mix: the same draws */
        for (int i = 0; i < B; i++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                CHECK(t[i * K + k] >= 0);
                s += t[i * K + k];
            }
            CHECK_CLOSE(s, 1.0, 1e-6, 0);
            /* the mean of image i is lam i + (1 - lam) (B - 1 - i) for both mixup
             * and cutmix (lam is the pasted-area-corrected one) */
            double m = 0;
            for (int k = 0; k < C * H * W; k++) m += x[(size_t)i * C * H * W + k];
            m /= C * H * W;
            CHECK_CLOSE(m, d.lam * i + (1 - d.lam) * (B - 1 - i), 1e-5, 0);
            /* the label's weight: lam on + (1 - lam) on when both labels agree */
            float on = (float)(0.9 + 0.1 / K), off = (float)(0.1 / K);
            double want = d.lam * on + (1 - d.lam) * (labels[i] == labels[B - 1 - i] ? on : off);
            CHECK_CLOSE(t[i * K + labels[i]], want, 1e-6, 0);
        }
    }
    free(x), free(t);
}

TEST(mixup_validate_rejects) {
    visc_mixup mx = visc_mixup_default(10);
    mx.mixup_alpha = -1;
    CHECK(visc_mixup_validate(&mx) == -1);
    mx = visc_mixup_default(10);
    mx.mixup_alpha = mx.cutmix_alpha = 0;
    CHECK(visc_mixup_validate(&mx) == -1);
    mx = visc_mixup_default(10);
    mx.prob = 1.5;
    CHECK(visc_mixup_validate(&mx) == -1);
    mx = visc_mixup_default(10);
    mx.switch_prob = NAN;
    CHECK(visc_mixup_validate(&mx) == -1);
    mx = visc_mixup_default(0);
    CHECK(visc_mixup_validate(&mx) == -1);
    mx = visc_mixup_default(10);
    mx.cutmix_minmax[0] = 0.8, mx.cutmix_minmax[1] = 0.2;
    CHECK(visc_mixup_validate(&mx) == -1);
    mx = visc_mixup_default(10);
    mx.label_smoothing = 1.0;
    CHECK(visc_mixup_validate(&mx) == -1);
}

/* ---- soft-target loss ---- */

TEST(soft_xent_matches_torch) {
    const int N = 6, K = 7;
    float *x = load("soft.logits", N * K), *t = load("soft.targets", N * K);
    float *want_d = load("soft.dlogits", N * K), *want_p = load("soft.probs", N * K);
    float *want_l = load("soft.loss", 1);
    float probs[42], d[42];
    float loss = visc_softmax_xent_soft_forward(probs, x, t, N, K);
    CHECK_CLOSE(loss, want_l[0], 1e-6, 1e-5);
    CHECK_ARRAYS("soft probs", probs, want_p, N * K, 1e-6, 1e-5);
    visc_softmax_xent_soft_backward(d, probs, t, N, K);
    CHECK_ARRAYS("soft dlogits", d, want_d, N * K, 1e-6, 1e-5);
    free(x), free(t), free(want_d), free(want_p), free(want_l);
}

TEST(soft_xent_finite_differences) {
    const int N = 3, K = 5;
    float x[15], t[15], probs[15], d[15];
    visc_rng r = visc_rng_make(1, 2, 3);
    for (int i = 0; i < N * K; i++) x[i] = 2 * visc_rng_normal(&r), t[i] = visc_rng_uniform(&r);
    for (int k = 0; k < K; k++) t[k] /= 2; /* rows not summing to 1 */
    visc_softmax_xent_soft_forward(probs, x, t, N, K);
    visc_softmax_xent_soft_backward(d, probs, t, N, K);
    const float h = 1e-2f;
    for (int i = 0; i < N * K; i++) {
        float keep = x[i], tmp[15], xp = keep + h, xm = keep - h;
        x[i] = xp;
        double up = visc_softmax_xent_soft_forward(tmp, x, t, N, K);
        x[i] = xm;
        double dn = visc_softmax_xent_soft_forward(tmp, x, t, N, K);
        x[i] = keep;
        /* central difference over the step actually taken: truncation
         * h^2 / 6 |f(3)| < 1e-5, float rounding of the loss ~2e-7 / 2h = 1e-5 */
        CHECK_CLOSE(d[i], (up - dn) / ((double)xp - xm), 1e-4, 0);
    }
}

TEST(soft_xent_equals_hard_xent_on_smoothed_onehot) {
    const int N = 4, K = 6;
    const float s = 0.1f;
    float x[24], t[24], p1[24], p2[24], d1[24], d2[24];
    int32_t y[4] = {0, 5, 2, 2};
    visc_rng r = visc_rng_make(9, 9, 9);
    for (int i = 0; i < N * K; i++) x[i] = 3 * visc_rng_normal(&r);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) t[n * K + k] = (k == y[n] ? 1 - s : 0) + s / K;
    float hard = visc_softmax_xent_forward(p1, x, y, N, K, s);
    float soft = visc_softmax_xent_soft_forward(p2, x, t, N, K);
    CHECK_CLOSE(soft, hard, 1e-6, 1e-6);
    visc_softmax_xent_backward(d1, p1, y, N, K, s);
    visc_softmax_xent_soft_backward(d2, p2, t, N, K);
    CHECK_ARRAYS("soft vs hard dlogits", d2, d1, N * K, 1e-7, 1e-5);
}

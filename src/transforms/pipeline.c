/* pipeline.c: one training (or eval) sample, from encoded bytes to
 * normalized CHW floats, under a named recipe.
 *
 * Train view, in this order (each step only when the recipe turns it on):
 *   RandomResizedCrop -> RandomHorizontalFlip -> RandomApply(ColorJitter)
 *   -> RandomGrayscale -> RandomApply(GaussianBlur) -> RandomSolarize
 *   -> RandAugment -> ToTensor + Normalize -> RandomErasing.
 * The recipes differ from this only in where the flip sits (MoCo v2 flips
 * after the blur); flipping commutes with every colour op and with the
 * symmetric blur, so the distribution of outputs is the same.
 * Eval: Resize(floor(size / crop_pct), shorter side) -> CenterCrop(size)
 * -> ToTensor + Normalize, as timm's eval transform.
 *
 * Randomness: the sample's one stream (seed, VISC_STREAM_AUGMENT + 16 e,
 * idx): first the crop and flip of every view (so fast mode can decode the
 * union of the crops once), then each view's pixel steps in turn. Every probabilistic step draws
 * its coin whether or not it is on, so switching one step off does not reshuffle the draws of the
 * others (the parameter draws that follow a coin happen only when the step runs).
 *
 * Decoding. Both train modes read the header first and draw the crops, so
 * the decoder works only on their union (see train_from_bytes). Exact mode
 * gives the very pixels of torchvision's decode-everything-then-crop (and
 * refuses the same files); fast mode ("fast_decode") decodes the union at
 * the smallest 1/8, 2/8, 4/8 or 8/8 DCT scale that keeps each crop >= size
 * and stops after it, and differs from exact mode by a few levels. Eval
 * decodes the whole image (exact), or at such a reduced scale (fast). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/autoaug.h"
#include "visc/core.h"
#include "visc/image.h"
#include "visc/transforms.h"

int visc_interp_parse(const char *name, visc_interp *out) {
    if (!strcmp(name, "nearest")) *out = VISC_INTERP_NEAREST;
    else if (!strcmp(name, "bilinear")) *out = VISC_INTERP_BILINEAR;
    else if (!strcmp(name, "bicubic")) *out = VISC_INTERP_BICUBIC;
    else return visc_set_error("unknown interpolation '%s' (nearest, bilinear, bicubic)", name);
    return 0;
}

int visc_transform_preset(const char *name, int size, visc_transform_config *cfg) {
    static const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
    memset(cfg, 0, sizeof *cfg);
    cfg->size = size;
    cfg->train = 1;
    cfg->scale[0] = 0.08f;
    cfg->scale[1] = 1.0f;
    cfg->ratio[0] = 3.0f / 4.0f;
    cfg->ratio[1] = 4.0f / 3.0f;
    cfg->interp = VISC_INTERP_BILINEAR;
    cfg->hflip = 0.5f;
    cfg->blur_sigma[0] = 0.1f;
    cfg->blur_sigma[1] = 2.0f;
    cfg->solarize_threshold = 128;
    memcpy(cfg->mean, mean, sizeof mean);
    memcpy(cfg->std, std, sizeof std);
    cfg->crop_pct = 0.875f;
    cfg->views = 1;
    if (!strcmp(name, "torchvision")) {
        /* RandomResizedCrop(size) + RandomHorizontalFlip(): the defaults */
    } else if (!strcmp(name, "timm")) {
        /* timm's ImageNet recipe as DeiT runs it: bicubic, RandAugment
         * m9 mstd0.5 with the increasing ops, RandomErasing 0.25; timm
         * turns colour jitter off when an auto-augment policy is set. */
        cfg->interp = VISC_INTERP_BICUBIC;
        snprintf(cfg->randaugment, sizeof cfg->randaugment, "rand-m9-mstd0.5-inc1");
        cfg->reprob = 0.25f;
    } else if (!strcmp(name, "mocov2")) {
        cfg->scale[0] = 0.2f;
        cfg->jitter = (visc_color_jitter){0.4f, 0.4f, 0.4f, 0.1f};
        cfg->jitter_p = 0.8f;
        cfg->gray_p = 0.2f;
        cfg->blur_p = 0.5f;
        cfg->views = 2;
    } else if (!strcmp(name, "simclr")) {
        /* lightly's SimCLRTransform defaults: colour strength 1 (0.8, 0.8,
         * 0.8, 0.2) with p 0.8, grayscale 0.2, blur 0.5 */
        cfg->jitter = (visc_color_jitter){0.8f, 0.8f, 0.8f, 0.2f};
        cfg->jitter_p = 0.8f;
        cfg->gray_p = 0.2f;
        cfg->blur_p = 0.5f;
        cfg->views = 2;
    } else if (!strcmp(name, "eval")) {
        cfg->train = 0;
        cfg->hflip = 0.0f;
    } else {
        return visc_set_error("unknown transform recipe '%s' (torchvision, timm, mocov2, simclr, "
                              "eval)",
                              name);
    }
    return 0;
}

static int check_p(const char *what, float p) {
    if (!(p >= 0.0f && p <= 1.0f)) return visc_set_error("%s must be in [0, 1], got %g", what, p);
    return 0;
}

int visc_transform_validate(const visc_transform_config *c) {
    if (c->size < 1 || c->size > 8192)
        return visc_set_error("transform size must be in [1, 8192], got %d", c->size);
    if (!(c->scale[0] > 0.0f && c->scale[0] <= c->scale[1]))
        return visc_set_error("crop scale must satisfy 0 < min <= max, got (%g, %g)", c->scale[0],
                              c->scale[1]);
    if (!(c->ratio[0] > 0.0f && c->ratio[0] <= c->ratio[1]))
        return visc_set_error("crop ratio must satisfy 0 < min <= max, got (%g, %g)", c->ratio[0],
                              c->ratio[1]);
    if (c->interp != VISC_INTERP_NEAREST && c->interp != VISC_INTERP_BILINEAR &&
        c->interp != VISC_INTERP_BICUBIC)
        return visc_set_error("unknown interpolation %d", (int)c->interp);
    if (check_p("hflip", c->hflip) || check_p("jitter_p", c->jitter_p) ||
        check_p("gray_p", c->gray_p) || check_p("blur_p", c->blur_p) ||
        check_p("solarize_p", c->solarize_p) || check_p("reprob", c->reprob))
        return -1;
    const visc_color_jitter *j = &c->jitter;
    if (!(j->brightness >= 0 && j->contrast >= 0 && j->saturation >= 0))
        return visc_set_error("colour jitter strengths must be >= 0");
    if (!(j->hue >= 0 && j->hue <= 0.5f))
        return visc_set_error("hue jitter must be in [0, 0.5], got %g", j->hue);
    if (c->blur_p > 0 && !(c->blur_sigma[0] > 0 && c->blur_sigma[0] <= c->blur_sigma[1]))
        return visc_set_error("blur sigma must satisfy 0 < min <= max, got (%g, %g)",
                              c->blur_sigma[0], c->blur_sigma[1]);
    if (c->blur_kernel < 0 || (c->blur_kernel > 0 && c->blur_kernel % 2 == 0))
        return visc_set_error("blur kernel must be odd (or 0 for 10%% of the size), got %d",
                              c->blur_kernel);
    if (c->solarize_threshold < 0 || c->solarize_threshold > 256)
        return visc_set_error("solarize threshold must be in [0, 256], got %d",
                              c->solarize_threshold);
    for (int k = 0; k < 3; k++)
        if (!(c->std[k] > 0.0f) || !isfinite(c->mean[k]))
            return visc_set_error("normalization std must be > 0 and mean finite (channel %d)", k);
    if (!c->train && !(c->crop_pct > 0.0f && c->crop_pct <= 1.0f))
        return visc_set_error("crop_pct must be in (0, 1], got %g", c->crop_pct);
    if (c->views < 1 || c->views > 16)
        return visc_set_error("views must be in [1, 16], got %d", c->views);
    if (memchr(c->randaugment, 0, sizeof c->randaugment) == NULL)
        return visc_set_error("randaugment spec is not terminated");
    visc_randaugment ra;
    if (c->randaugment[0] && visc_randaugment_parse(c->randaugment, &ra)) return -1;
    return 0;
}

static int blur_kernel(const visc_transform_config *c) {
    if (c->blur_kernel > 0) return c->blur_kernel;
    int k = (int)(0.1 * c->size);
    return k % 2 ? k : k + 1;
}

/* A random coin that is "on" with probability p; p = 0 is never on and
 * p = 1 always (the draw is made either way). */
static int coin(visc_rng *r, float p) { return visc_rng_uniform(r) < p; }

/* The colour and pixel steps after the crop and flip, on the size x size
 * view. */
static void train_pixels(const visc_transform_config *c, visc_rng *r, visc_image *img) {
    /* RandomApply(p): applies when rand <= p, i.e. skips when p < rand. */
    if (!(c->jitter_p < visc_rng_uniform(r))) {
        visc_jitter_draw d;
        visc_color_jitter_draw(&c->jitter, r, &d);
        visc_color_jitter_apply(&d, img);
    }
    if (visc_rng_uniform(r) < c->gray_p) visc_grayscale(img);
    if (!(c->blur_p < visc_rng_uniform(r))) {
        float sigma =
            c->blur_sigma[0] + (c->blur_sigma[1] - c->blur_sigma[0]) * visc_rng_uniform(r);
        visc_gaussian_blur(img, blur_kernel(c), sigma);
    }
    if (visc_rng_uniform(r) < c->solarize_p) visc_solarize(img, c->solarize_threshold);
    if (c->randaugment[0]) {
        visc_randaugment ra;
        /* validated before: cannot fail; parsing is cheaper than a resize */
        if (visc_randaugment_parse(c->randaugment, &ra) == 0) visc_randaugment_apply(&ra, r, img);
    }
}

/* Where a sample's views go: normalized floats, or (a device that
 * normalizes the batch itself) the bytes before ToTensor, CHW. One of the
 * two is set. */
typedef struct {
    float *f;
    uint8_t *b;
} view_out;

/* View v of the sample (3 x size x size values each). */
static view_out view_at(const visc_transform_config *c, view_out o, int v) {
    size_t off = (size_t)v * 3 * (size_t)c->size * c->size;
    return (view_out){o.f ? o.f + off : NULL, o.b ? o.b + off : NULL};
}

/* ToTensor + Normalize, then timm's RandomErasing on the tensor; or the
 * bytes (a recipe that erases has no byte form: visc_transform_bytes_ok). */
static void finish(const visc_transform_config *c, visc_rng *r, const visc_image *img,
                   view_out out) {
    if (out.b) {
        visc_to_chw_bytes(img, out.b);
        return;
    }
    visc_to_tensor_normalize(img, c->mean, c->std, out.f);
    if (c->reprob > 0) {
        visc_erasing e = visc_erasing_default(c->reprob);
        visc_random_erasing_apply(&e, r, out.f, 3, img->height, img->width);
    }
}

/* The geometry of every view, drawn before any pixel work so that fast
 * mode can decode the union of the crops once: crop, then flip, per view. */
typedef struct {
    visc_rect crop[16];
    int flip[16];
} view_geometry;

static void draw_geometry(const visc_transform_config *c, visc_rng *r, int w, int h,
                          view_geometry *g) {
    for (int v = 0; v < c->views; v++) {
        g->crop[v] = visc_rrc_params(r, w, h, c->scale, c->ratio);
        g->flip[v] = coin(r, c->hflip);
    }
}

/* Whether the pixel steps of train_pixels leave this view's pixels as
 * they are: the same draws on a copy of r, and on yes *r advances past
 * them exactly as train_pixels would have moved it. A step that applies
 * counts as a change (even one that might turn out to change nothing). */
static int pixel_steps_skip(const visc_transform_config *c, visc_rng *r) {
    if (c->randaugment[0]) return 0;
    visc_rng t = *r;
    if (!(c->jitter_p < visc_rng_uniform(&t))) {
        visc_jitter_draw d;
        visc_color_jitter_draw(&c->jitter, &t, &d);
        for (int k = 0; k < 4; k++)
            if (d.enabled[k]) return 0;
    }
    if (visc_rng_uniform(&t) < c->gray_p) return 0;
    if (!(c->blur_p < visc_rng_uniform(&t))) return 0;
    if (visc_rng_uniform(&t) < c->solarize_p) return 0;
    *r = t;
    return 1;
}

/* One train view: resize box (in img's pixels) to size x size and flip
 * (one pass), then the pixel steps. The view lives in the thread's scratch:
 * no allocation per sample. When no pixel step applies (torchvision's
 * recipe, and the views of SSL recipes that drew none), ToTensor +
 * Normalize is folded into the resize: the same floats, without storing and
 * re-reading the resized bytes (clip and normalize were 13% of the time on
 * a pack, as two interleaved-RGB passes). */
static void train_view(const visc_transform_config *c, visc_rng *r, const visc_image *img,
                       const float *box, int flip, view_out out) {
    int skip = pixel_steps_skip(c, r);
    if (skip && out.f) {
        visc_resize_flip_normalize(img, box, c->interp, flip, c->size, c->size, c->mean, c->std,
                                   out.f);
        if (c->reprob > 0) {
            visc_erasing e = visc_erasing_default(c->reprob);
            visc_random_erasing_apply(&e, r, out.f, 3, c->size, c->size);
        }
        return;
    }
    visc_image res = {NULL, c->size, c->size, 3 * c->size};
    res.data = visc_transform_scratch(VISC_SCRATCH_VIEW, (size_t)res.height * res.stride);
    visc_resize_flip(img, box, c->interp, flip, &res);
    if (!skip) train_pixels(c, r, &res);
    finish(c, r, &res, out);
}

static void eval_view(const visc_transform_config *c, const visc_image *img, view_out out) {
    int scale_size = (int)floor(c->size / (double)c->crop_pct), w, h;
    visc_resize_shorter_size(img->width, img->height, scale_size, &w, &h);
    visc_image res, crop;
    visc_transform_image_alloc(&res, w, h);
    visc_resize(img, NULL, c->interp, &res);
    visc_crop(&res, visc_center_crop_rect(w, h, c->size, c->size), &crop);
    if (out.b) visc_to_chw_bytes(&crop, out.b);
    else visc_to_tensor_normalize(&crop, c->mean, c->std, out.f);
    visc_transform_image_free(&res);
    visc_transform_image_free(&crop);
}

static int image_to(const visc_transform_config *c, const visc_image *img, uint64_t seed,
                    int64_t epoch, int64_t idx, view_out out) {
    if (visc_transform_validate(c)) return -1;
    if (!img || img->width < 1 || img->height < 1) return visc_set_error("empty image");
    visc_rng r = visc_rng_make(seed, VISC_STREAM_AUGMENT + 16 * (uint64_t)epoch, (uint64_t)idx);
    if (!c->train) {
        for (int v = 0; v < c->views; v++) eval_view(c, img, view_at(c, out, v));
        return 0;
    }
    view_geometry g;
    draw_geometry(c, &r, img->width, img->height, &g);
    for (int v = 0; v < c->views; v++) {
        /* torchvision crops, then resizes the crop: a view of it */
        visc_image view = visc_image_view(img, g.crop[v]);
        train_view(c, &r, &view, NULL, g.flip[v], view_at(c, out, v));
    }
    return 0;
}

int visc_transform_image(const visc_transform_config *c, const visc_image *img, uint64_t seed,
                         int64_t epoch, int64_t idx, float *out) {
    return image_to(c, img, seed, epoch, idx, (view_out){out, NULL});
}

/* The DCT scale M/8 for fast mode: the smallest M in {1, 2, 4, 8} with
 * both sides * M / 8 still >= need. The decoder takes any M/8, but with
 * libjpeg-turbo 2.1 only 8x8, 4x4, 2x2 and 1x1 IDCTs have SIMD code: on
 * the ImageNet samples with RandomResizedCrop(224), allowing every M made
 * the decode 10% slower (0.84 vs 0.76 ms; with M = 6 added: 0.80 ms). */
static int pick_eighths(int w, int h, int need) {
    int64_t n8 = 8 * (int64_t)need;
    for (int m = 1; m < 8; m *= 2)
        if ((int64_t)w * m >= n8 && (int64_t)h * m >= n8) return m;
    return 8;
}

/* Train views from encoded bytes: one decode of the union of the crops,
 * then each crop resized out of it.
 * Exact mode: the union at full resolution, read to the end of the file
 * (whole_file) so a truncated or broken file fails as with a full decode;
 * the decoder guarantees the region's pixels equal the full decode's, and
 * each crop is a view of them, so the output is exactly that of decoding
 * everything (what visc_transform_image does) at less cost: no IDCT,
 * upsampling or colour conversion outside the crops.
 * Fast mode: the union at the smallest M/8 scale (pick_eighths) that
 * keeps every crop at least `size` pixels on both sides, and no reading
 * past the region; each crop's box is mapped into the reduced pixels
 * (fractional, which the resize takes as is), so the output differs from
 * exact mode by the decoder's downscaling only (none at M = 8). The
 * decoder's fast IDCT and plain upsampling (visc_decode_options.fast) are
 * not used: they saved nothing measurable here (0.75 vs 0.76 ms), and
 * keeping them off keeps full-scale crops equal to exact mode's. */
static int train_from_bytes(const visc_transform_config *c, visc_rng *r, const uint8_t *bytes,
                            size_t size, int sw, int sh, view_out out) {
    view_geometry g;
    memset(&g, 0, sizeof g);
    draw_geometry(c, r, sw, sh, &g);
    visc_rect u = g.crop[0];
    int eighths = 1; /* the largest any crop needs */
    for (int v = 0; v < c->views; v++) {
        visc_rect k = g.crop[v];
        int x1 = u.x + u.w > k.x + k.w ? u.x + u.w : k.x + k.w;
        int y1 = u.y + u.h > k.y + k.h ? u.y + u.h : k.y + k.h;
        u.x = u.x < k.x ? u.x : k.x;
        u.y = u.y < k.y ? u.y : k.y;
        u.w = x1 - u.x;
        u.h = y1 - u.y;
        int m = pick_eighths(k.w, k.h, c->size);
        if (m > eighths) eighths = m;
    }
    const int fast = c->fast_decode != 0;
    visc_decode_options opt = {u, fast ? eighths : 1, fast ? 8 : 1, 0, !fast, NULL, 0};
    /* the decoded rows go into this thread's scratch (no allocation, no
     * copy): room for the union plus the decoder's side margins and iMCU
     * alignment (at most 3 iMCUs of 32 pixels); when that is not enough the
     * decoder allocates */
    opt.into_size = (size_t)(u.w + 96) * 3 * (size_t)u.h;
    opt.into = visc_transform_scratch(VISC_SCRATCH_DECODE, opt.into_size);
    visc_decoded dec;
    if (visc_image_decode_ex(bytes, size, &opt, &dec)) return -1;
    int rc = 0;
    for (int v = 0; v < c->views && rc == 0; v++) {
        visc_rect k = g.crop[v];
        if (dec.scale_num == 1 && dec.scale_denom == 1) {
            /* whole pixels: the crop is a view, exactly as after a full decode */
            visc_rect in = {k.x - dec.covers.x, k.y - dec.covers.y, k.w, k.h};
            if (in.x < 0 || in.y < 0 || in.x + in.w > dec.image.width ||
                in.y + in.h > dec.image.height) {
                rc = visc_set_error("decoder returned a region that misses the crop");
                break;
            }
            visc_image view = visc_image_view(&dec.image, in);
            train_view(c, r, &view, NULL, g.flip[v], view_at(c, out, v));
            continue;
        }
        double f = (double)dec.scale_num / dec.scale_denom;
        float box[4] = {(float)((k.x - dec.covers.x) * f), (float)((k.y - dec.covers.y) * f),
                        (float)((k.x + k.w - dec.covers.x) * f),
                        (float)((k.y + k.h - dec.covers.y) * f)};
        if (box[0] < 0) box[0] = 0;
        if (box[1] < 0) box[1] = 0;
        if (box[2] > dec.image.width) box[2] = (float)dec.image.width;
        if (box[3] > dec.image.height) box[3] = (float)dec.image.height;
        if (!(box[2] > box[0] && box[3] > box[1])) {
            rc = visc_set_error("decoder returned a region that misses the crop");
            break;
        }
        train_view(c, r, &dec.image, box, g.flip[v], view_at(c, out, v));
    }
    if (!dec.borrowed) visc_image_free(&dec.image);
    return rc;
}

static int sample_to(const visc_transform_config *c, const uint8_t *bytes, size_t size,
                     uint64_t seed, int64_t epoch, int64_t idx, view_out out) {
    if (visc_transform_validate(c)) return -1;
    if (c->train || c->fast_decode) {
        int sw, sh;
        if (visc_image_info(bytes, size, &sw, &sh)) return -1;
        if (sw < 1 || sh < 1) return visc_set_error("image has no pixels (%d x %d)", sw, sh);
        if (c->train) {
            visc_rng r =
                visc_rng_make(seed, VISC_STREAM_AUGMENT + 16 * (uint64_t)epoch, (uint64_t)idx);
            return train_from_bytes(c, &r, bytes, size, sw, sh, out);
        }
        /* Fast eval: the whole image, reduced (M/8) while the shorter side
         * still covers the Resize target. */
        int need = (int)floor(c->size / (double)c->crop_pct);
        int m = pick_eighths(sw, sh, need);
        visc_decode_options opt = {{0, 0, 0, 0}, m, 8, 0, 0, NULL, 0};
        visc_decoded dec;
        if (visc_image_decode_ex(bytes, size, &opt, &dec)) return -1;
        int rc = image_to(c, &dec.image, seed, epoch, idx, out);
        visc_image_free(&dec.image);
        return rc;
    }
    /* Exact eval: the Resize needs every pixel. */
    visc_image img;
    if (visc_image_decode(bytes, size, &img)) return -1;
    int rc = image_to(c, &img, seed, epoch, idx, out);
    visc_image_free(&img);
    return rc;
}

int visc_transform_sample(const visc_transform_config *c, const uint8_t *bytes, size_t size,
                          uint64_t seed, int64_t epoch, int64_t idx, float *out) {
    return sample_to(c, bytes, size, seed, epoch, idx, (view_out){out, NULL});
}

int visc_transform_bytes_ok(const visc_transform_config *c) {
    if (c->reprob > 0)
        return visc_set_error("random erasing (--reprob %g) works on the normalized tensor: the "
                              "recipe has no byte form",
                              (double)c->reprob);
    return 0;
}

int visc_transform_sample_bytes(const visc_transform_config *c, const uint8_t *bytes, size_t size,
                                uint64_t seed, int64_t epoch, int64_t idx, uint8_t *out) {
    if (visc_transform_bytes_ok(c)) return -1;
    return sample_to(c, bytes, size, seed, epoch, idx, (view_out){NULL, out});
}

int visc_transform_image_bytes(const visc_transform_config *c, const visc_image *img, uint64_t seed,
                               int64_t epoch, int64_t idx, uint8_t *out) {
    if (visc_transform_bytes_ok(c)) return -1;
    return image_to(c, img, seed, epoch, idx, (view_out){NULL, out});
}

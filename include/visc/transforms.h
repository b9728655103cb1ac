/* transforms.h: image transforms with torchvision 0.14 / Pillow 9 semantics,
 * and the per-sample pipeline (encoded bytes -> normalized CHW floats).
 *
 * resample.c  Pillow's Image.resize: separable two-pass convolution with the
 *             support widened by the downscale factor (antialiasing),
 *             bilinear / bicubic (a = -0.5) in Pillow's 22-bit fixed point,
 *             nearest as Pillow's affine scaling; a float source box
 * geometry.c  RandomResizedCrop.get_params, Resize(shorter side),
 *             CenterCrop, crop with zero padding, horizontal flip
 * color.c     ImageEnhance brightness / contrast / saturation, hue in
 *             Pillow's HSV, ColorJitter in random order, grayscale,
 *             solarize, ToTensor + Normalize
 * blur.c      GaussianBlur as torchvision's tensor path: float kernel,
 *             reflect padding, round back to uint8
 * pipeline.c  recipes (presets "torchvision", "timm", "mocov2", "simclr",
 *             "eval") and visc_transform_sample()
 *
 * Images are visc_image (8-bit RGB HWC, image.h). A view (visc_image_view)
 * points into its parent and must not be freed; images made here are freed
 * with visc_transform_image_free. All functions are thread-safe; randomness
 * comes only from the visc_rng passed in. */
#ifndef VISC_TRANSFORMS_H
#define VISC_TRANSFORMS_H

#include <stddef.h>
#include <stdint.h>

#include "image.h"
#include "rng.h"

/* Values as PIL's Image.Resampling (and torchvision's InterpolationMode). */
typedef enum {
    VISC_INTERP_NEAREST = 0,
    VISC_INTERP_BILINEAR = 2,
    VISC_INTERP_BICUBIC = 3,
} visc_interp;

/* "nearest" / "bilinear" / "bicubic" -> 0 with *out set, else -1 (error set). */
int visc_interp_parse(const char *name, visc_interp *out);

/* ---- images owned by this module ---- */
/* Allocates a w x h RGB image with stride 3 * w (contents undefined). */
void visc_transform_image_alloc(visc_image *img, int w, int h);
void visc_transform_image_free(visc_image *img);
/* A non-owning view of rect r (which must lie inside img). */
visc_image visc_image_view(const visc_image *img, visc_rect r);

/* ---- resample.c ---- */
/* PIL: src.resize((dst->width, dst->height), interp, box). box = {x0, y0,
 * x1, y1} in src pixel coordinates (float, as PIL stores it), NULL for the
 * whole image. dst must be allocated with its size set. Pixels outside src
 * are never read: filters are truncated at src's edges, as in PIL, so a
 * crop followed by a resize is a resize of the crop's view. */
void visc_resize(const visc_image *src, const float *box, visc_interp interp, visc_image *dst);
/* The same followed by a horizontal flip when `flip` (exactly
 * visc_resize + visc_hflip; the flip is folded into the horizontal pass). */
void visc_resize_flip(const visc_image *src, const float *box, visc_interp interp, int flip,
                      visc_image *dst);
/* visc_resize_flip to ow x oh, then visc_to_tensor_normalize into chw
 * (3 x oh x ow floats): the same floats. Where both filter passes run
 * (bilinear / bicubic, both sides changed) the normalization is folded into
 * the last pass and no resized image is stored. */
void visc_resize_flip_normalize(const visc_image *src, const float *box, visc_interp interp,
                                int flip, int ow, int oh, const float mean[3], const float std[3],
                                float *chw);
/* A buffer of at least `bytes` owned by the calling thread, kept and grown
 * on demand (freed when the thread exits): the per-sample work allocates
 * nothing once warm. Each slot has one user at a time; contents are
 * undefined on return. */
enum {
    VISC_SCRATCH_TAPS_H,
    VISC_SCRATCH_TAPS_V,
    VISC_SCRATCH_TAPS_PACKED, /* resample.c: 16-bit weights of the horizontal pass */
    VISC_SCRATCH_WEIGHTS,
    VISC_SCRATCH_RESIZE_TMP,
    VISC_SCRATCH_ROWS,
    VISC_SCRATCH_VIEW,      /* pipeline.c: the resized view */
    VISC_SCRATCH_NORMALIZE, /* visc_resize_flip_normalize when not folded */
    VISC_SCRATCH_DECODE,    /* pipeline.c: the decoded crops (visc_decode_options.into) */
    VISC_SCRATCH_SLOTS
};
void *visc_transform_scratch(int slot, size_t bytes);

/* ---- geometry.c ---- */
/* RandomResizedCrop.get_params(img, scale, ratio) for a width x height
 * image: ten tries of area ~ U(scale) * W * H and log-ratio ~ U(log ratio),
 * then the centre crop clamped to the ratio range. Draws 4 words per try. */
visc_rect visc_rrc_params(visc_rng *r, int width, int height, const float scale[2],
                          const float ratio[2]);
/* torchvision Resize(size:int): the shorter side becomes size, the longer
 * int(size * long / short). */
void visc_resize_shorter_size(int width, int height, int size, int *out_w, int *out_h);
/* torchvision CenterCrop: top = int(round((H - h) / 2)), left likewise
 * (round half to even). Larger than the image: the rect sticks out and
 * visc_crop pads with zeros, as torchvision pads first. */
visc_rect visc_center_crop_rect(int width, int height, int crop_w, int crop_h);
/* Copies rect r of src into a new image (zeros outside src). */
void visc_crop(const visc_image *src, visc_rect r, visc_image *out);
void visc_hflip(visc_image *img); /* in place */

/* ---- color.c ---- */
/* PIL's convert("L"): (19595 R + 38470 G + 7471 B + 2^15) >> 16. */
static inline uint8_t visc_luma(uint8_t r, uint8_t g, uint8_t b) {
    return (
        uint8_t)(((uint32_t)r * 19595u + (uint32_t)g * 38470u + (uint32_t)b * 7471u + 0x8000u) >>
                 16);
}
/* torchvision F.adjust_* on PIL images, in place. */
void visc_adjust_brightness(visc_image *img, float factor);
void visc_adjust_contrast(visc_image *img, float factor);
void visc_adjust_saturation(visc_image *img, float factor);
void visc_adjust_hue(visc_image *img, float hue_factor); /* hue_factor in [-0.5, 0.5] */
/* rgb_to_grayscale(num_output_channels=3): three equal channels of L. */
void visc_grayscale(visc_image *img);
/* PIL ImageOps.solarize: v >= threshold -> 255 - v. */
void visc_solarize(visc_image *img, int threshold);

/* ColorJitter(brightness, contrast, saturation, hue): factors drawn
 * uniformly from [max(0, 1 - b), 1 + b] (hue: [-h, h]); a 0 disables one. */
typedef struct {
    float brightness, contrast, saturation, hue;
} visc_color_jitter;
typedef struct {
    int order[4];    /* 0 brightness, 1 contrast, 2 saturation, 3 hue: applied in this order */
    float factor[4]; /* indexed by op; ops that are off are skipped */
    int enabled[4];
} visc_jitter_draw;
/* torchvision's get_params: a permutation of the 4 ops, then one factor per
 * enabled op (in op order). Draws 4 + (enabled ops) words. */
void visc_color_jitter_draw(const visc_color_jitter *cj, visc_rng *r, visc_jitter_draw *d);
void visc_color_jitter_apply(const visc_jitter_draw *d, visc_image *img);

/* ToTensor + Normalize: out[c][y][x] = (v / 255 - mean[c]) / std[c]. */
void visc_to_tensor_normalize(const visc_image *img, const float mean[3], const float std[3],
                              float *chw);
/* The image's bytes in CHW order (the layout ToTensor gives, before it
 * divides): what a device that normalizes the batch itself takes. */
void visc_to_chw_bytes(const visc_image *img, uint8_t *chw);
/* ToTensor + Normalize of `images` CHW byte images of 3 planes of `plane`
 * pixels: visc_to_tensor_normalize's floats, bit for bit, from
 * visc_to_chw_bytes's bytes (the GPU's twin: visc_cuda_normalize_bytes). */
void visc_normalize_bytes(const uint8_t *chw, size_t images, size_t plane, const float mean[3],
                          const float std[3], float *out);

/* ---- blur.c ---- */
/* F.gaussian_blur(img, [k, k], [sigma, sigma]) on a PIL image, in place:
 * k odd; reflect padding (repeated for images smaller than k / 2). */
void visc_gaussian_blur(visc_image *img, int kernel_size, float sigma);
/* The normalized 1-D kernel (k floats) torchvision builds. */
void visc_gaussian_kernel(int kernel_size, float sigma, float *kernel);

/* ---- pipeline.c ---- */
typedef struct {
    int size;  /* output side (square) */
    int train; /* 1: the random train recipe; 0: eval (Resize + CenterCrop) */
    /* RandomResizedCrop */
    float scale[2], ratio[2];
    visc_interp interp; /* also the eval Resize's */
    float hflip;        /* probability */
    /* ColorJitter applied with probability jitter_p (RandomApply) */
    visc_color_jitter jitter;
    float jitter_p;
    float gray_p; /* RandomGrayscale */
    float blur_p; /* RandomApply(GaussianBlur) */
    float blur_sigma[2];
    int blur_kernel; /* odd; 0: int(0.1 * size) made odd, as MoCo v2 / SimCLR */
    float solarize_p;
    int solarize_threshold;
    char randaugment[64]; /* timm spec, e.g. "rand-m9-mstd0.5-inc1"; "" = off */
    float reprob;         /* RandomErasing probability */
    float mean[3], std[3];
    float crop_pct;  /* eval: Resize(floor(size / crop_pct)) then CenterCrop(size) */
    int views;       /* augmented views per sample (SSL: 2) */
    int fast_decode; /* 1: decode only the crop, DCT-downscaled while >= size */
} visc_transform_config;

/* Fills cfg with a named recipe at output side `size`: "torchvision",
 * "timm", "mocov2", "simclr", "eval". Unknown name: -1 with an error. */
int visc_transform_preset(const char *name, int size, visc_transform_config *cfg);
/* Checks ranges (probabilities in [0, 1], scale/ratio ordered and positive,
 * ...) so that a config read from a file fails early with a clear message. */
int visc_transform_validate(const visc_transform_config *cfg);

/* One sample: decodes bytes, applies the recipe `views` times and writes
 * views x 3 x size x size floats to out. Randomness: sample idx of epoch e
 * draws from the one stream visc_rng_make(seed, VISC_STREAM_AUGMENT + 16 e,
 * idx), as data.h documents; views draw from it one after another, so the
 * same (seed, epoch, idx) always gives the same output. Returns 0, or -1 with
 * visc_last_error() set (bad image, bad config). */
int visc_transform_sample(const visc_transform_config *cfg, const uint8_t *bytes, size_t size,
                          uint64_t seed, int64_t epoch, int64_t idx, float *out);
/* The same on an already decoded full image (tests, in-memory datasets). */
int visc_transform_image(const visc_transform_config *cfg, const visc_image *img, uint64_t seed,
                         int64_t epoch, int64_t idx, float *out);
/* The recipe up to ToTensor, for a device that normalizes the batch
 * itself: views x 3 x size x size bytes (CHW) whose visc_normalize_bytes
 * are the functions above' floats, bit for bit, with the same draws. Only
 * for a recipe without RandomErasing (it draws on the normalized tensor):
 * visc_transform_bytes_ok says so, in one line. */
int visc_transform_bytes_ok(const visc_transform_config *cfg);
int visc_transform_sample_bytes(const visc_transform_config *cfg, const uint8_t *bytes, size_t size,
                                uint64_t seed, int64_t epoch, int64_t idx, uint8_t *out);
int visc_transform_image_bytes(const visc_transform_config *cfg, const visc_image *img,
                               uint64_t seed, int64_t epoch, int64_t idx, uint8_t *out);

#endif

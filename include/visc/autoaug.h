/* autoaug.h: timm's training-time augmentations beyond the basic transforms:
 * RandAugment, Random Erasing and Mixup / CutMix (timm 0.9.16 semantics).
 *
 * pil_ops.c     the PIL 9.4 image ops RandAugment uses, bit-exact on 8-bit
 *               RGB: ImageOps autocontrast / equalize / invert / posterize /
 *               solarize, timm's solarize_add, ImageEnhance Color / Contrast
 *               / Brightness / Sharpness, Image.rotate and Image.transform
 *               AFFINE with bilinear / bicubic resampling and a fill color
 * randaugment.c the "rand-m9-mstd0.5-inc1" spec, timm's level -> argument
 *               maps and the per-image op draws
 * erasing.c     RandomErasing on a normalized CHW tensor
 * mixup.c       Mixup / CutMix (mode 'batch') on a normalized NCHW batch,
 *               with label-smoothed soft targets; Beta sampling
 *
 * Randomness comes only from the visc_rng passed in; every function is
 * thread-safe. The soft-target loss that consumes the mixed targets lives
 * in nn.h (visc_softmax_xent_soft_*). */
#ifndef VISC_AUTOAUG_H
#define VISC_AUTOAUG_H

#include <stddef.h>
#include <stdint.h>

#include "image.h"
#include "rng.h"

/* ---- pil_ops.c: in place, same size. `scratch`, where taken, must hold
 * 3 * width * height bytes, or be NULL to allocate one for the call. ---- */
void visc_pil_autocontrast(visc_image *img);         /* ImageOps.autocontrast(img) */
void visc_pil_equalize(visc_image *img);             /* ImageOps.equalize(img) */
void visc_pil_invert(visc_image *img);               /* 255 - v */
void visc_pil_posterize(visc_image *img, int bits);  /* keep `bits` MSBs (0..8) */
void visc_pil_solarize(visc_image *img, int thresh); /* v >= thresh -> 255 - v */
void visc_pil_solarize_add(visc_image *img, int add,
                           int thresh); /* v < thresh -> min(255, v + add) */
/* ImageEnhance.X(img).enhance(factor): Image.blend(degenerate, img, factor). */
void visc_pil_color(visc_image *img, float factor);
void visc_pil_contrast(visc_image *img, float factor);
void visc_pil_brightness(visc_image *img, float factor);
void visc_pil_sharpness(visc_image *img, float factor, uint8_t *scratch);
/* img.transform(img.size, AFFINE, m, resample, fillcolor=fill): output pixel
 * (x, y) samples the input at (m0 (x+.5) + m1 (y+.5) + m2, m3 (x+.5) + m4
 * (y+.5) + m5); samples outside the input keep `fill`. bicubic: 0 bilinear. */
void visc_pil_affine(visc_image *img, const double m[6], int bicubic, const uint8_t fill[3],
                     uint8_t *scratch);
/* img.rotate(degrees, resample, fillcolor=fill): counter-clockwise about the
 * centre, same size. */
void visc_pil_rotate(visc_image *img, double degrees, int bicubic, const uint8_t fill[3],
                     uint8_t *scratch);

/* ---- randaugment.c ---- */
typedef enum {
    VISC_RA_AUTOCONTRAST,
    VISC_RA_EQUALIZE,
    VISC_RA_INVERT,
    VISC_RA_ROTATE,
    VISC_RA_POSTERIZE,
    VISC_RA_POSTERIZE_INCREASING,
    VISC_RA_SOLARIZE,
    VISC_RA_SOLARIZE_INCREASING,
    VISC_RA_SOLARIZE_ADD,
    VISC_RA_COLOR,
    VISC_RA_COLOR_INCREASING,
    VISC_RA_CONTRAST,
    VISC_RA_CONTRAST_INCREASING,
    VISC_RA_BRIGHTNESS,
    VISC_RA_BRIGHTNESS_INCREASING,
    VISC_RA_SHARPNESS,
    VISC_RA_SHARPNESS_INCREASING,
    VISC_RA_SHEAR_X,
    VISC_RA_SHEAR_Y,
    VISC_RA_TRANSLATE_X_REL,
    VISC_RA_TRANSLATE_Y_REL,
    VISC_RA_NUM_OPS
} visc_ra_op;

/* Resampling of the geometric ops, with PIL's Resampling values. RANDOM is
 * timm's default (no 'interpolation' hparam, as train.py's "random"): each
 * geometric op picks bilinear or bicubic with probability 1/2. */
enum { VISC_RA_INTERP_RANDOM = 0, VISC_RA_INTERP_BILINEAR = 2, VISC_RA_INTERP_BICUBIC = 3 };

#define VISC_RA_MAX_OPS 15
#define VISC_RA_MAX_LAYERS 16 /* "n" above this is refused */
typedef struct {
    int num_layers;       /* "n", default 2 */
    double magnitude;     /* "m", default 10 */
    double magnitude_std; /* "mstd", default 0; INFINITY: uniform in [0, m] */
    double magnitude_max; /* "mmax", default 10: magnitudes are clipped to [0, this] */
    double prob;          /* "p", default 0.5: each drawn op is applied with it */
    int increasing;       /* "inc": the *Increasing op list */
    double translate_pct; /* hparam, default 0.45 */
    uint8_t fill[3];      /* hparam img_mean, default (124, 116, 104) (ImageNet mean) */
    int interpolation;    /* VISC_RA_INTERP_*, default RANDOM */
    int num_ops;
    visc_ra_op ops[VISC_RA_MAX_OPS]; /* timm's _RAND_[INCREASING_]TRANSFORMS */
} visc_randaugment;

/* timm's rand_augment_transform config string: "rand" then '-'-separated
 * sections m<int>, n<int>, p<float>, mstd<float> (> 100: uniform),
 * mmax<int>, inc<int>. Sets the hparams above to their defaults. Returns -1
 * with an error naming the section on anything else (timm asserts, or
 * silently skips sections without a digit; both are refused here). */
int visc_randaugment_parse(const char *spec, visc_randaugment *ra);

/* One drawn layer: what timm's AugmentOp.__call__ decides. */
typedef struct {
    visc_ra_op op;
    int apply;        /* 0: skipped (prob) */
    double magnitude; /* after noise and clipping */
    int negate;       /* the random sign of signed ops */
    int bicubic;      /* the resampling of geometric ops */
} visc_ra_layer;

/* Draws ra->num_layers layers (ops chosen uniformly with replacement);
 * returns how many were written (at most max). */
int visc_randaugment_draw(const visc_randaugment *ra, visc_rng *r, visc_ra_layer *layers, int max);
/* timm's LEVEL_TO_ARG[op](magnitude) with the sign decided by `negate`
 * (0 for ops without an argument). */
double visc_ra_level_to_arg(const visc_randaugment *ra, visc_ra_op op, double magnitude,
                            int negate);
/* NAME_TO_OP[op](img, arg, fillcolor=ra->fill, resample=...). */
void visc_ra_op_apply(const visc_randaugment *ra, visc_ra_op op, double arg, int bicubic,
                      visc_image *img, uint8_t *scratch);
const char *visc_ra_op_name(visc_ra_op op); /* timm's name: "SolarizeIncreasing" */
/* Draw, then apply the layers in order, in place. */
void visc_randaugment_apply(const visc_randaugment *ra, visc_rng *r, visc_image *img);

/* ---- erasing.c: timm RandomErasing on one normalized CHW image ---- */
typedef enum {
    VISC_ERASE_CONST = 0, /* zeros */
    VISC_ERASE_RAND = 1,  /* one N(0, 1) value per channel per box */
    VISC_ERASE_PIXEL = 2, /* N(0, 1) per element (timm's train.py default) */
} visc_erase_mode;

typedef struct {
    float p; /* probability of erasing an image */
    visc_erase_mode mode;
    float min_area, max_area;     /* fraction of the image, per box: [0.02, 1/3] */
    float min_aspect, max_aspect; /* h / w, log-uniform: [0.3, 1 / 0.3] */
    int min_count, max_count;     /* boxes per image, uniform: [1, 1] */
} visc_erasing;

/* timm's RandomErasing(probability=p, mode='pixel') defaults. */
visc_erasing visc_erasing_default(float p);
/* Up to 10 tries per box for one with h < H and w < W; filled per mode. */
void visc_random_erasing_apply(const visc_erasing *e, visc_rng *r, float *chw, int C, int H, int W);

/* ---- mixup.c: timm Mixup, mode 'batch' ---- */
typedef struct {
    double mixup_alpha;      /* 0.8; 0 disables mixup */
    double cutmix_alpha;     /* 1.0; 0 disables cutmix */
    double cutmix_minmax[2]; /* both 0: none (box from lam) */
    double prob;             /* probability of mixing a batch at all */
    double switch_prob;      /* probability of cutmix when both are on */
    int correct_lam;         /* lam from the clipped box area (timm: True) */
    double label_smoothing;  /* 0.1 */
    int num_classes;
} visc_mixup;

/* DeiT's / timm train.py's usual settings for num_classes classes. */
visc_mixup visc_mixup_default(int num_classes);

/* What one batch gets. */
typedef struct {
    double lam;         /* weight of the batch itself; 1: unmixed */
    double lam_raw;     /* the Beta draw, before the cutmix box correction */
    int use_cutmix;     /* 0: mixup */
    int yl, yh, xl, xh; /* cutmix box [yl, yh) x [xl, xh) */
} visc_mixup_params;

/* _params_per_batch and, for cutmix, cutmix_bbox_and_lam on an H x W image. */
void visc_mixup_draw(const visc_mixup *mx, visc_rng *r, int H, int W, visc_mixup_params *d);
/* Applies d to x [B, C, H, W] in place (mixed with its batch flip, x.flip(0))
 * and writes targets [B, num_classes] = lam * smooth(y) + (1 - lam) *
 * smooth(y.flip(0)). The arithmetic is torch's, in float32. */
void visc_mixup_mix(const visc_mixup *mx, const visc_mixup_params *d, float *x, int B, int C, int H,
                    int W, const int32_t *labels, float *targets);
/* draw + mix. B must be even (timm asserts it). */
void visc_mixup_apply(const visc_mixup *mx, visc_rng *r, float *x, int B, int C, int H, int W,
                      const int32_t *labels, float *targets);
/* Validates a config (alphas >= 0, not both off unless prob is 0,
 * probabilities in [0, 1], num_classes > 0): -1 with an error. */
int visc_mixup_validate(const visc_mixup *mx);

/* Gamma(shape, 1) by Marsaglia-Tsang (shape < 1 boosted by U^(1/shape)) and
 * Beta(a, b) = X / (X + Y), from r's uniforms. */
double visc_sample_gamma(visc_rng *r, double shape);
double visc_sample_beta(visc_rng *r, double a, double b);

#endif

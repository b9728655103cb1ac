/* randaugment.c: timm 0.9.16's RandAugment (rand_augment_transform).
 *
 * An image gets num_layers ops drawn uniformly with replacement from the op
 * list; each is applied with probability p at a magnitude m (plus N(0, mstd)
 * noise, or U(0, m) for an infinite mstd, clipped to [0, mmax]), which
 * timm's LEVEL_TO_ARG maps to the op's argument (signed ops flip sign with
 * probability 1/2). The maps below are timm's, in double as Python computes
 * them; the ops are PIL's (pil_ops.c). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "visc/autoaug.h"
#include "visc/core.h"

static const char *const op_names[VISC_RA_NUM_OPS] = {
    [VISC_RA_AUTOCONTRAST] = "AutoContrast",
    [VISC_RA_EQUALIZE] = "Equalize",
    [VISC_RA_INVERT] = "Invert",
    [VISC_RA_ROTATE] = "Rotate",
    [VISC_RA_POSTERIZE] = "Posterize",
    [VISC_RA_POSTERIZE_INCREASING] = "PosterizeIncreasing",
    [VISC_RA_SOLARIZE] = "Solarize",
    [VISC_RA_SOLARIZE_INCREASING] = "SolarizeIncreasing",
    [VISC_RA_SOLARIZE_ADD] = "SolarizeAdd",
    [VISC_RA_COLOR] = "Color",
    [VISC_RA_COLOR_INCREASING] = "ColorIncreasing",
    [VISC_RA_CONTRAST] = "Contrast",
    [VISC_RA_CONTRAST_INCREASING] = "ContrastIncreasing",
    [VISC_RA_BRIGHTNESS] = "Brightness",
    [VISC_RA_BRIGHTNESS_INCREASING] = "BrightnessIncreasing",
    [VISC_RA_SHARPNESS] = "Sharpness",
    [VISC_RA_SHARPNESS_INCREASING] = "SharpnessIncreasing",
    [VISC_RA_SHEAR_X] = "ShearX",
    [VISC_RA_SHEAR_Y] = "ShearY",
    [VISC_RA_TRANSLATE_X_REL] = "TranslateXRel",
    [VISC_RA_TRANSLATE_Y_REL] = "TranslateYRel",
};

/* _RAND_TRANSFORMS and _RAND_INCREASING_TRANSFORMS, in timm's order. */
static const visc_ra_op plain_ops[VISC_RA_MAX_OPS] = {
    VISC_RA_AUTOCONTRAST, VISC_RA_EQUALIZE,        VISC_RA_INVERT,          VISC_RA_ROTATE,
    VISC_RA_POSTERIZE,    VISC_RA_SOLARIZE,        VISC_RA_SOLARIZE_ADD,    VISC_RA_COLOR,
    VISC_RA_CONTRAST,     VISC_RA_BRIGHTNESS,      VISC_RA_SHARPNESS,       VISC_RA_SHEAR_X,
    VISC_RA_SHEAR_Y,      VISC_RA_TRANSLATE_X_REL, VISC_RA_TRANSLATE_Y_REL,
};
static const visc_ra_op increasing_ops[VISC_RA_MAX_OPS] = {VISC_RA_AUTOCONTRAST,
                                                           VISC_RA_EQUALIZE,
                                                           VISC_RA_INVERT,
                                                           VISC_RA_ROTATE,
                                                           VISC_RA_POSTERIZE_INCREASING,
                                                           VISC_RA_SOLARIZE_INCREASING,
                                                           VISC_RA_SOLARIZE_ADD,
                                                           VISC_RA_COLOR_INCREASING,
                                                           VISC_RA_CONTRAST_INCREASING,
                                                           VISC_RA_BRIGHTNESS_INCREASING,
                                                           VISC_RA_SHARPNESS_INCREASING,
                                                           VISC_RA_SHEAR_X,
                                                           VISC_RA_SHEAR_Y,
                                                           VISC_RA_TRANSLATE_X_REL,
                                                           VISC_RA_TRANSLATE_Y_REL};

const char *visc_ra_op_name(visc_ra_op op) {
    return (unsigned)op < VISC_RA_NUM_OPS ? op_names[op] : "?";
}

/* ---- the spec ---- */

/* A non-negative decimal integer filling all of s. */
static int parse_int(const char *s, int *out) {
    long v = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s)) return -1;
        v = v * 10 + (*s - '0');
        if (v > 1000000) return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < 0) return -1;
    *out = v;
    return 0;
}

int visc_randaugment_parse(const char *spec, visc_randaugment *ra) {
    memset(ra, 0, sizeof *ra);
    ra->num_layers = 2;
    ra->magnitude = 10.0;
    ra->magnitude_max = 10.0;
    ra->prob = 0.5;
    ra->translate_pct = 0.45;
    ra->fill[0] = 124; /* round(255 * (0.485, 0.456, 0.406)) */
    ra->fill[1] = 116;
    ra->fill[2] = 104;
    ra->interpolation = VISC_RA_INTERP_RANDOM;
    if (!spec) return visc_set_error("randaugment: no spec");
    if (strncmp(spec, "rand", 4) != 0 || (spec[4] && spec[4] != '-'))
        return visc_set_error("randaugment: spec '%s' does not start with 'rand'", spec);
    int have_mstd = 0;
    const char *s = spec + 4;
    while (*s) {
        s++; /* the '-' */
        const char *end = strchr(s, '-');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        char sec[64];
        if (len == 0 || len >= sizeof sec)
            return visc_set_error("randaugment: empty or overlong section in '%s'", spec);
        memcpy(sec, s, len);
        sec[len] = '\0';
        s += len;
        if (sec[0] == 't')
            return visc_set_error("randaugment: transform set '%s' in '%s' is not supported",
                                  sec + 1, spec);
        /* timm: re.split(r'(\d.*)', c): the key is everything before the first digit */
        size_t k = 0;
        while (sec[k] && !isdigit((unsigned char)sec[k])) k++;
        char key[64];
        const char *val = sec + k;
        int iv;
        double dv;
        if (!*val)
            return visc_set_error("randaugment: section '%s' of '%s' has no value", sec, spec);
        memcpy(key, sec, k);
        key[k] = '\0';
        if (strcmp(key, "mstd") == 0 && parse_double(val, &dv) == 0) {
            if (!have_mstd) ra->magnitude_std = dv > 100 ? INFINITY : dv; /* setdefault */
            have_mstd = 1;
        } else if (strcmp(key, "mmax") == 0 && parse_int(val, &iv) == 0) {
            ra->magnitude_max = iv ? iv : 10.0; /* timm: magnitude_max or 10 */
        } else if (strcmp(key, "inc") == 0 && parse_int(val, &iv) == 0) {
            /* timm tests bool(val) on the string, so "inc0" also turns it on */
            ra->increasing = 1;
        } else if (strcmp(key, "m") == 0 && parse_int(val, &iv) == 0) {
            ra->magnitude = iv;
        } else if (strcmp(key, "n") == 0 && parse_int(val, &iv) == 0 && iv <= VISC_RA_MAX_LAYERS) {
            ra->num_layers = iv;
        } else if (strcmp(key, "p") == 0 && parse_double(val, &dv) == 0 && dv <= 1.0) {
            ra->prob = dv;
        } else {
            return visc_set_error("randaugment: bad section '%s' in '%s'", sec, spec);
        }
    }
    ra->num_ops = VISC_RA_MAX_OPS;
    memcpy(ra->ops, ra->increasing ? increasing_ops : plain_ops, sizeof ra->ops);
    return 0;
}

/* ---- the draws ---- */

/* A Python float in [0, 1) for the comparisons timm makes with random.random(). */
static double uniform(visc_rng *r) { return visc_rng_uniform_double(r); }

static double gauss(visc_rng *r) {
    /* Box-Muller on 53-bit uniforms: 1 - u is in (0, 1], so the log is finite */
    double u = 1.0 - uniform(r), v = uniform(r);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static int is_geometric(visc_ra_op op) {
    return op == VISC_RA_ROTATE || op == VISC_RA_SHEAR_X || op == VISC_RA_SHEAR_Y ||
           op == VISC_RA_TRANSLATE_X_REL || op == VISC_RA_TRANSLATE_Y_REL;
}

int visc_randaugment_draw(const visc_randaugment *ra, visc_rng *r, visc_ra_layer *layers, int max) {
    int n = ra->num_layers < max ? ra->num_layers : max;
    for (int i = 0; i < n; i++) {
        visc_ra_layer *l = &layers[i];
        memset(l, 0, sizeof *l);
        l->op = ra->ops[visc_rng_below(r, (uint32_t)ra->num_ops)];
        /* AugmentOp.__call__: skip if prob < 1 and random() > prob */
        l->apply = !(ra->prob < 1.0 && uniform(r) > ra->prob);
        double m = ra->magnitude;
        if (isinf(ra->magnitude_std)) m = uniform(r) * m;
        else if (ra->magnitude_std > 0) m += ra->magnitude_std * gauss(r);
        double upper = ra->magnitude_max > 0 ? ra->magnitude_max : 10.0;
        l->magnitude = m < 0 ? 0 : m > upper ? upper : m;
        l->negate = uniform(r) > 0.5; /* _randomly_negate */
        if (is_geometric(l->op)) {
            if (ra->interpolation == VISC_RA_INTERP_RANDOM) l->bicubic = visc_rng_below(r, 2) == 1;
            else l->bicubic = ra->interpolation == VISC_RA_INTERP_BICUBIC;
        }
    }
    return n;
}

/* ---- level -> argument (timm's LEVEL_TO_ARG), level in [0, mmax] ---- */

static double signed_arg(double v, int negate) { return negate ? -v : v; }

static double enhance_increasing(double level, int negate) {
    double v = 1.0 + signed_arg(level / 10.0 * 0.9, negate);
    return v > 0.1 ? v : 0.1;
}

double visc_ra_level_to_arg(const visc_randaugment *ra, visc_ra_op op, double level, int negate) {
    switch (op) {
    case VISC_RA_ROTATE: return signed_arg(level / 10.0 * 30.0, negate);
    case VISC_RA_POSTERIZE: return (int)(level / 10.0 * 4);
    case VISC_RA_POSTERIZE_INCREASING: return 4 - (int)(level / 10.0 * 4);
    case VISC_RA_SOLARIZE: {
        int t = (int)(level / 10.0 * 256);
        return t < 256 ? t : 256;
    }
    case VISC_RA_SOLARIZE_INCREASING: {
        int t = (int)(level / 10.0 * 256);
        return 256 - (t < 256 ? t : 256);
    }
    case VISC_RA_SOLARIZE_ADD: {
        int t = (int)(level / 10.0 * 110);
        return t < 128 ? t : 128;
    }
    case VISC_RA_COLOR:
    case VISC_RA_CONTRAST:
    case VISC_RA_BRIGHTNESS:
    case VISC_RA_SHARPNESS: return level / 10.0 * 1.8 + 0.1;
    case VISC_RA_COLOR_INCREASING:
    case VISC_RA_CONTRAST_INCREASING:
    case VISC_RA_BRIGHTNESS_INCREASING:
    case VISC_RA_SHARPNESS_INCREASING: return enhance_increasing(level, negate);
    case VISC_RA_SHEAR_X:
    case VISC_RA_SHEAR_Y: return signed_arg(level / 10.0 * 0.3, negate);
    case VISC_RA_TRANSLATE_X_REL:
    case VISC_RA_TRANSLATE_Y_REL: return signed_arg(level / 10.0 * ra->translate_pct, negate);
    default: return 0.0;
    }
}

void visc_ra_op_apply(const visc_randaugment *ra, visc_ra_op op, double arg, int bicubic,
                      visc_image *img, uint8_t *scratch) {
    double m[6] = {1, 0, 0, 0, 1, 0};
    switch (op) {
    case VISC_RA_AUTOCONTRAST: visc_pil_autocontrast(img); break;
    case VISC_RA_EQUALIZE: visc_pil_equalize(img); break;
    case VISC_RA_INVERT: visc_pil_invert(img); break;
    case VISC_RA_ROTATE: visc_pil_rotate(img, arg, bicubic, ra->fill, scratch); break;
    case VISC_RA_POSTERIZE:
    case VISC_RA_POSTERIZE_INCREASING: visc_pil_posterize(img, (int)arg); break;
    case VISC_RA_SOLARIZE:
    case VISC_RA_SOLARIZE_INCREASING: visc_pil_solarize(img, (int)arg); break;
    case VISC_RA_SOLARIZE_ADD: visc_pil_solarize_add(img, (int)arg, 128); break;
    case VISC_RA_COLOR:
    case VISC_RA_COLOR_INCREASING: visc_pil_color(img, (float)arg); break;
    case VISC_RA_CONTRAST:
    case VISC_RA_CONTRAST_INCREASING: visc_pil_contrast(img, (float)arg); break;
    case VISC_RA_BRIGHTNESS:
    case VISC_RA_BRIGHTNESS_INCREASING: visc_pil_brightness(img, (float)arg); break;
    case VISC_RA_SHARPNESS:
    case VISC_RA_SHARPNESS_INCREASING: visc_pil_sharpness(img, (float)arg, scratch); break;
    case VISC_RA_SHEAR_X:
        m[1] = arg;
        visc_pil_affine(img, m, bicubic, ra->fill, scratch);
        break;
    case VISC_RA_SHEAR_Y:
        m[3] = arg;
        visc_pil_affine(img, m, bicubic, ra->fill, scratch);
        break;
    case VISC_RA_TRANSLATE_X_REL:
        m[2] = arg * img->width;
        visc_pil_affine(img, m, bicubic, ra->fill, scratch);
        break;
    case VISC_RA_TRANSLATE_Y_REL:
        m[5] = arg * img->height;
        visc_pil_affine(img, m, bicubic, ra->fill, scratch);
        break;
    default: visc_assert_fail("a known RandAugment op", __FILE__, __LINE__);
    }
}

void visc_randaugment_apply(const visc_randaugment *ra, visc_rng *r, visc_image *img) {
    visc_ra_layer layers[VISC_RA_MAX_LAYERS];
    int n = visc_randaugment_draw(ra, r, layers, VISC_RA_MAX_LAYERS);
    /* One scratch image for the whole call, only if an op needs a copy: the
     * loader runs this once per sample, next to a decode that allocates too. */
    uint8_t *scratch = NULL;
    for (int i = 0; i < n; i++) {
        if (!layers[i].apply) continue;
        visc_ra_op op = layers[i].op;
        if (!scratch &&
            (is_geometric(op) || op == VISC_RA_SHARPNESS || op == VISC_RA_SHARPNESS_INCREASING))
            scratch = visc_malloc(3 * (size_t)img->width * img->height + 1, "randaugment scratch");
        double arg = visc_ra_level_to_arg(ra, op, layers[i].magnitude, layers[i].negate);
        visc_ra_op_apply(ra, op, arg, layers[i].bicubic, img, scratch);
    }
    free(scratch);
}

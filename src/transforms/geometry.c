/* geometry.c: where the crop goes (RandomResizedCrop, Resize + CenterCrop)
 * and the pixel moves that need no resampling (crop, flip).
 *
 * Rounding follows torchvision 0.14 to the pixel: Python's round() is half
 * to even, which is rint() in the default rounding mode; int() truncates.
 * The random numbers are visc_rng's, not torch's, so only the distribution
 * of crops matches torchvision, not the individual draws. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/transforms.h"

void visc_transform_image_alloc(visc_image *img, int w, int h) {
    VISC_ASSERT(w > 0 && h > 0);
    img->width = w;
    img->height = h;
    img->stride = 3 * w;
    img->data = visc_malloc((size_t)h * (size_t)img->stride, "image");
}

void visc_transform_image_free(visc_image *img) {
    free(img->data);
    img->data = NULL;
    img->width = img->height = img->stride = 0;
}

visc_image visc_image_view(const visc_image *img, visc_rect r) {
    VISC_ASSERT(r.x >= 0 && r.y >= 0 && r.w > 0 && r.h > 0 && r.x + r.w <= img->width &&
                r.y + r.h <= img->height);
    visc_image v = *img;
    v.data = img->data + (size_t)r.y * img->stride + 3 * (size_t)r.x;
    v.width = r.w;
    v.height = r.h;
    return v;
}

/* torch.randint(0, n) for n >= 1. */
static int randint(visc_rng *r, int n) { return (int)visc_rng_below(r, (uint32_t)n); }

visc_rect visc_rrc_params(visc_rng *r, int width, int height, const float scale[2],
                          const float ratio[2]) {
    double area = (double)width * height;
    double lr0 = log(ratio[0]), lr1 = log(ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (scale[0] + (scale[1] - scale[0]) * visc_rng_uniform_double(r));
        double aspect = exp(lr0 + (lr1 - lr0) * visc_rng_uniform_double(r));
        int w = (int)rint(sqrt(target * aspect));
        int h = (int)rint(sqrt(target / aspect));
        /* The two position draws are made only for an accepted size, as in
         * torchvision; a rejected try used two words. */
        if (0 < w && w <= width && 0 < h && h <= height) {
            visc_rect c = {0, 0, w, h};
            c.y = randint(r, height - h + 1);
            c.x = randint(r, width - w + 1);
            return c;
        }
    }
    /* Fallback: the centre crop, clamped to the ratio range. */
    double in_ratio = (double)width / height;
    double rmin = fmin(ratio[0], ratio[1]), rmax = fmax(ratio[0], ratio[1]);
    int w = width, h = height;
    if (in_ratio < rmin) {
        h = (int)rint(w / rmin);
    } else if (in_ratio > rmax) {
        w = (int)rint(h * rmax);
    }
    visc_rect c = {(width - w) / 2, (height - h) / 2, w, h};
    return c;
}

void visc_resize_shorter_size(int width, int height, int size, int *out_w, int *out_h) {
    int shorter = width <= height ? width : height, longer = width <= height ? height : width;
    int new_long = (int)((double)size * longer / shorter);
    *out_w = width <= height ? size : new_long;
    *out_h = width <= height ? new_long : size;
}

visc_rect visc_center_crop_rect(int width, int height, int crop_w, int crop_h) {
    visc_rect r;
    if (crop_w > width || crop_h > height) {
        /* torchvision pads (left, top) = ((cw - w) // 2, (ch - h) // 2),
         * never negative, then crops the padded image as below. */
        int pl = crop_w > width ? (crop_w - width) / 2 : 0;
        int pt = crop_h > height ? (crop_h - height) / 2 : 0;
        int pw = crop_w > width ? crop_w : width, ph = crop_h > height ? crop_h : height;
        r.x = (int)rint((pw - crop_w) / 2.0) - pl;
        r.y = (int)rint((ph - crop_h) / 2.0) - pt;
    } else {
        r.x = (int)rint((width - crop_w) / 2.0);
        r.y = (int)rint((height - crop_h) / 2.0);
    }
    r.w = crop_w;
    r.h = crop_h;
    return r;
}

void visc_crop(const visc_image *src, visc_rect r, visc_image *out) {
    visc_transform_image_alloc(out, r.w, r.h);
    for (int y = 0; y < r.h; y++) {
        uint8_t *o = out->data + (size_t)y * out->stride;
        int sy = r.y + y;
        if (sy < 0 || sy >= src->height) {
            memset(o, 0, 3 * (size_t)r.w);
            continue;
        }
        int x0 = r.x < 0 ? -r.x : 0;
        int x1 = r.x + r.w > src->width ? src->width - r.x : r.w;
        if (x1 < x0) x1 = x0;
        memset(o, 0, 3 * (size_t)x0);
        memcpy(o + 3 * (size_t)x0, src->data + (size_t)sy * src->stride + 3 * (size_t)(r.x + x0),
               3 * (size_t)(x1 - x0));
        memset(o + 3 * (size_t)x1, 0, 3 * (size_t)(r.w - x1));
    }
}

void visc_hflip(visc_image *img) {
    for (int y = 0; y < img->height; y++) {
        uint8_t *row = img->data + (size_t)y * img->stride;
        for (int a = 0, b = img->width - 1; a < b; a++, b--) {
            uint8_t t[3];
            memcpy(t, row + 3 * a, 3);
            memcpy(row + 3 * a, row + 3 * b, 3);
            memcpy(row + 3 * b, t, 3);
        }
    }
}

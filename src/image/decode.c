/* decode.c: format sniffing and the request arithmetic shared by the
 * decoders. The format is decided by the first bytes, never by the file
 * name: ImageNet has PNGs and CMYK JPEGs named .JPEG. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/image.h"

/* 2^28 pixels is 768 MiB of RGB: any real photo passes, a 64k x 64k header
 * on a 100-byte file does not get to allocate. */
static _Atomic int64_t max_pixels = (int64_t)1 << 28;

void visc_image_set_max_pixels(int64_t n) { atomic_store(&max_pixels, n > 0 ? n : 1); }
int64_t visc_image_max_pixels(void) { return atomic_load(&max_pixels); }

int visc_image_check_size(const char *format, int64_t width, int64_t height) {
    if (width <= 0 || height <= 0)
        return visc_set_error("%s header has an empty size %lldx%lld", format, (long long)width,
                              (long long)height);
    int64_t limit = visc_image_max_pixels();
    /* Divide rather than multiply: width * height may overflow for a lying header. */
    if (width > limit / height)
        return visc_set_error("%s image of %lldx%lld pixels exceeds the limit of %lld pixels",
                              format, (long long)width, (long long)height, (long long)limit);
    return 0;
}

visc_image_format visc_image_sniff(const uint8_t *buf, size_t size) {
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (!buf) return VISC_IMAGE_UNKNOWN;
    if (size >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff) return VISC_IMAGE_JPEG;
    /* The first 4 bytes name PNG; all 8 catch text-mode transfer damage. */
    if (size >= 8 && memcmp(buf, png_magic, 8) == 0) return VISC_IMAGE_PNG;
    return VISC_IMAGE_UNKNOWN;
}

static int not_an_image(const uint8_t *buf, size_t size) {
    if (!buf || size == 0) return visc_set_error("not an image: the file is empty");
    if (size >= 4 && buf[0] == 0x89 && memcmp(buf + 1, "PNG", 3) == 0)
        return visc_set_error("not an image: PNG signature damaged (text-mode transfer?)");
    return visc_set_error("not an image: unknown format (first bytes %02x %02x %02x, not JPEG "
                          "or PNG)",
                          buf[0], size > 1 ? buf[1] : 0, size > 2 ? buf[2] : 0);
}

int visc_image_info(const uint8_t *buf, size_t size, int *width, int *height) {
    switch (visc_image_sniff(buf, size)) {
    case VISC_IMAGE_JPEG: return visc_jpeg_info(buf, size, width, height);
    case VISC_IMAGE_PNG: return visc_png_info(buf, size, width, height);
    default: return not_an_image(buf, size);
    }
}

/* The region part of a plan: req region clipped to width x height. */
static int plan_region(visc_rect r, int width, int height, visc_rect *region) {
    *region = (visc_rect){0, 0, width, height};
    if (r.w == 0) return 0;
    if (r.w < 0 || r.h <= 0)
        return visc_set_error("decode request: region %dx%d has no pixels", r.w, r.h);
    /* Clip in 64 bits: x + w may overflow an int for a silly request. */
    int64_t x0 = r.x > 0 ? r.x : 0, y0 = r.y > 0 ? r.y : 0;
    int64_t x1 = (int64_t)r.x + r.w, y1 = (int64_t)r.y + r.h;
    if (x1 > width) x1 = width;
    if (y1 > height) y1 = height;
    if (x0 >= x1 || y0 >= y1)
        return visc_set_error("decode request: region %dx%d at (%d,%d) lies outside the %dx%d "
                              "image",
                              r.w, r.h, r.x, r.y, width, height);
    *region = (visc_rect){(int)x0, (int)y0, (int)(x1 - x0), (int)(y1 - y0)};
    return 0;
}

int visc_image_plan(const visc_decode_request *req, int width, int height, visc_rect *region,
                    int *scale_denom) {
    int s = req ? req->scale_denom : 1;
    if (s == 0) s = 1;
    if (s != 1 && s != 2 && s != 4 && s != 8)
        return visc_set_error("decode request: scale_denom %d is not 1, 2, 4 or 8", s);
    *scale_denom = s;
    return plan_region(req ? req->region : (visc_rect){0, 0, 0, 0}, width, height, region);
}

/* The scale of opt in lowest terms, or -1 with an error. */
static int plan_scale(const visc_decode_options *opt, int *num, int *den) {
    int n0 = opt ? opt->scale_num : 1, d0 = opt ? opt->scale_denom : 1;
    int n = n0 ? n0 : 1, d = d0 ? d0 : n0 ? 8 : 1;
    int ok = (n == 1 && (d == 1 || d == 2 || d == 4 || d == 8)) || (d == 8 && n >= 1 && n <= 16);
    if (!ok)
        return visc_set_error("decode request: scale %d/%d is not 1/1, 1/2, 1/4, 1/8 or M/8 "
                              "(M = 1..16)",
                              n, d);
    while (n % 2 == 0 && d % 2 == 0) { /* lowest terms: 8/8 -> 1/1, 6/8 -> 3/4 */
        n /= 2;
        d /= 2;
    }
    *num = n;
    *den = d;
    return 0;
}

int visc_image_plan_ex(const visc_decode_options *opt, int width, int height, visc_rect *region,
                       int *num, int *den) {
    if (plan_scale(opt, num, den)) return -1;
    return plan_region(opt ? opt->region : (visc_rect){0, 0, 0, 0}, width, height, region);
}

int visc_image_decode_ex(const uint8_t *buf, size_t size, const visc_decode_options *opt,
                         visc_decoded *out) {
    memset(out, 0, sizeof *out);
    int rc;
    switch (visc_image_sniff(buf, size)) {
    case VISC_IMAGE_JPEG: rc = visc_jpeg_decode_ex(buf, size, opt, out); break;
    case VISC_IMAGE_PNG: {
        /* PNG has no scaled decoding: the scale is checked, then only the
         * region matters */
        int n, d;
        if (plan_scale(opt, &n, &d)) return -1;
        visc_decode_request req = {opt ? opt->region : (visc_rect){0, 0, 0, 0}, 1};
        rc = visc_png_decode(buf, size, &req, out);
        break;
    }
    default: return not_an_image(buf, size);
    }
    if (rc == 0 && out->scale_num == 0) out->scale_num = 1;
    return rc;
}

int visc_image_decode_request(const uint8_t *buf, size_t size, const visc_decode_request *req,
                              visc_decoded *out) {
    memset(out, 0, sizeof *out);
    int rc;
    switch (visc_image_sniff(buf, size)) {
    case VISC_IMAGE_JPEG: rc = visc_jpeg_decode(buf, size, req, out); break;
    case VISC_IMAGE_PNG: rc = visc_png_decode(buf, size, req, out); break;
    default: return not_an_image(buf, size);
    }
    if (rc == 0 && out->scale_num == 0) out->scale_num = 1;
    return rc;
}

int visc_image_decode(const uint8_t *buf, size_t size, visc_image *out) {
    visc_decoded d;
    memset(out, 0, sizeof *out);
    if (visc_image_decode_request(buf, size, NULL, &d)) return -1;
    *out = d.image;
    return 0;
}

void visc_image_free(visc_image *img) {
    if (!img) return;
    free(img->data);
    memset(img, 0, sizeof *img);
}

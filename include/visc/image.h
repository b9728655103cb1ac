/* image.h: decoded images and the decoders (JPEG via libjpeg-turbo, PNG via
 * libpng).
 *
 * decode.c       format sniffing by content (a PNG named .JPEG decodes as PNG),
 *                the request arithmetic (region, scale) shared by the decoders
 * decode_jpeg.c  libjpeg-turbo: DCT-domain downscaling (1/2, 1/4, 1/8 and
 *                any M/8), partial decoding of a region, an optional fast
 *                IDCT, grayscale/CMYK -> RGB
 * decode_png.c   libpng: any bit depth / palette / alpha -> 8-bit RGB
 *
 * An image is 8-bit RGB, interleaved, rows top to bottom (HWC), like a PIL
 * "RGB" image: the pixels equal PIL's Image.open(f).convert("RGB") (same
 * libjpeg-turbo settings: ISLOW IDCT, fancy upsampling; alpha is dropped,
 * not composited; Adobe CMYK converted with PIL's formula). One documented
 * difference: a 16-bit GRAY PNG keeps its high byte, where PIL clips the
 * 16-bit value to 255 (an almost white image).
 *
 * Decoders never crash or exit on bad input: they return -1 with a one-line
 * visc_last_error() (empty, not an image, truncated, corrupt header, too
 * many pixels, ...). A truncated file is an error even when libjpeg would
 * only warn (PIL refuses truncated files too); other libjpeg warnings
 * ("corrupt JPEG data: extraneous bytes") are tolerated, as PIL does.
 * Thread-safe: every call owns its decoder state. */
#ifndef VISC_IMAGE_H
#define VISC_IMAGE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *data; /* height * stride bytes, owned (visc_image_free) */
    int width, height;
    int stride; /* bytes per row (>= 3 * width) */
} visc_image;

typedef enum { VISC_IMAGE_UNKNOWN = 0, VISC_IMAGE_JPEG, VISC_IMAGE_PNG } visc_image_format;

/* A pixel rectangle in SOURCE image coordinates. */
typedef struct {
    int x, y, w, h;
} visc_rect;

/* What the caller needs, so the decoder can do less work:
 * - region: only this part of the source is wanted (w = 0: all of it); a
 *   region reaching past the image is clipped to it, one entirely outside
 *   (or with a negative size) is an error;
 * - scale_denom 1, 2, 4 or 8 (0 means 1): decoding at 1/scale_denom of the
 *   source resolution is acceptable (JPEG's DCT-domain scaling; PNG ignores
 *   it and answers scale_denom 1).
 * The decoder may return MORE than the region; it reports exactly what it
 * returned in visc_decoded. Today both decoders return the region itself,
 * rounded out to whole scaled pixels, and its pixels equal those of a full
 * decode at the same scale (JPEG decodes a margin of one iMCU around the
 * region and drops it, because chroma upsampling at a crop edge differs).
 * visc_decode_options below asks for more (M/8 scales, fast IDCT). */
typedef struct {
    visc_rect region;
    int scale_denom;
} visc_decode_request;

/* The full request (visc_image_decode_ex); zero-initialize it, then set:
 * - region: as above;
 * - scale_num / scale_denom: the scale, one of 1/1, 1/2, 1/4, 1/8 or M/8
 *   for M = 1..16 (libjpeg-turbo's DCT scaling: an 8x8 block decodes to
 *   M x M pixels, so the smallest M/8 >= the needed reduction saves the
 *   most work). scale_num 0 means 1; scale_denom 0 means 8 when scale_num
 *   is set, else 1 (all zero: 1/1). PNG ignores the scale and answers 1/1;
 * - fast (JPEG): JDCT_IFAST and plain (not fancy) chroma upsampling, a
 *   little faster and no longer PIL's pixels (within a few levels);
 * - whole_file (JPEG, region requests): still read the compressed data
 *   below the region where it can matter, so a file truncated there fails
 *   as a full decode does, while the pixels below are not reconstructed
 *   (skipped: a single-scan file ending with the EOI marker, which cannot
 *   be truncated; see decode_jpeg.c for the one damaged-file difference
 *   left). Without it the decoder stops after the region's last row and
 *   such a file may pass (whether it does then depends on the region).
 * A visc_decode_request {region, d} is the options {region, 1, d, 0, 0}. */
typedef struct {
    visc_rect region;
    int scale_num, scale_denom;
    int fast;
    int whole_file;
    /* JPEG (3-component files): a buffer of into_size bytes that the
     * caller owns, e.g. per-thread scratch. When the rows libjpeg produces
     * fit (decoded width x 3 x height bytes), they are written there and
     * the image points into it, its stride possibly wider than 3 * width
     * (the decoder's side margins stay in the buffer): no allocation and no
     * copy. visc_decoded.borrowed says so; such an image is not freed. */
    uint8_t *into;
    size_t into_size;
} visc_decode_options;

/* The arithmetic of a reply, exact for every size, with the scale
 * f = scale_num / scale_denom (in lowest terms for M/8 scales: 8/8 = 1/1,
 * 4/8 = 1/2, ...):
 * - covers.x and covers.y are multiples of scale_denom;
 * - image.width  = ceil(covers.w * scale_num / scale_denom), image.height
 *   likewise (covers ends on a multiple of scale_denom or at the image's
 *   edge, so only the last column/row of a scaled decode can stand for
 *   fewer source pixels: libjpeg's output size is ceil(size * f));
 * - image pixel (i, j) stands for the source pixels [covers.x + i / f,
 *   covers.x + (i + 1) / f) x [covers.y + j / f, covers.y + (j + 1) / f)
 *   clipped to the image (for scale_num 1: s = scale_denom source pixels);
 * - covers contains the (clipped) requested region. */
typedef struct {
    visc_image image; /* the decoded pixels */
    visc_rect covers; /* the source rectangle those pixels cover */
    int scale_denom;  /* image pixels = source pixels * scale_num / scale_denom (rounded up) */
    int source_width; /* full source size */
    int source_height;
    int scale_num; /* 1 unless an M/8 scale was asked for (visc_decode_options) */
    int borrowed;  /* 1: image.data lies in visc_decode_options.into (do not free it) */
} visc_decoded;

/* Format by content (magic bytes), whatever the file name says. */
visc_image_format visc_image_sniff(const uint8_t *buf, size_t size);
/* Source size from the header only (no pixel decoding). */
int visc_image_info(const uint8_t *buf, size_t size, int *width, int *height);
/* Decodes a whole image at full resolution. */
int visc_image_decode(const uint8_t *buf, size_t size, visc_image *out);
/* Decodes what `req` asks for (NULL: everything, full resolution). */
int visc_image_decode_request(const uint8_t *buf, size_t size, const visc_decode_request *req,
                              visc_decoded *out);
/* Decodes what `opt` asks for (NULL: everything, full resolution). */
int visc_image_decode_ex(const uint8_t *buf, size_t size, const visc_decode_options *opt,
                         visc_decoded *out);
/* Refuses images with more pixels than this (default 2^28, about 16k x 16k)
 * before allocating anything: a "decompression bomb" gets a clear error.
 * Process-wide; set it before decoding threads start. */
void visc_image_set_max_pixels(int64_t max_pixels);
int64_t visc_image_max_pixels(void);
void visc_image_free(visc_image *img);

/* ---- used by the format decoders (decode_jpeg.c, decode_png.c) ---- */
/* Checks a source size from a header against the pixel limit (-1 + error). */
int visc_image_check_size(const char *format, int64_t width, int64_t height);
/* Clips req's region to a width x height source and validates the scale:
 * *region gets the clipped rectangle, *scale_denom 1, 2, 4 or 8. */
int visc_image_plan(const visc_decode_request *req, int width, int height, visc_rect *region,
                    int *scale_denom);
/* The same for options: *num / *den get the scale in lowest terms (1/1,
 * 1/2, 1/4, 1/8 or M/8 reduced), -1 with an error for any other. */
int visc_image_plan_ex(const visc_decode_options *opt, int width, int height, visc_rect *region,
                       int *num, int *den);
int visc_jpeg_info(const uint8_t *buf, size_t size, int *width, int *height);
int visc_jpeg_decode(const uint8_t *buf, size_t size, const visc_decode_request *req,
                     visc_decoded *out);
int visc_jpeg_decode_ex(const uint8_t *buf, size_t size, const visc_decode_options *opt,
                        visc_decoded *out);
int visc_png_info(const uint8_t *buf, size_t size, int *width, int *height);
int visc_png_decode(const uint8_t *buf, size_t size, const visc_decode_request *req,
                    visc_decoded *out);

#endif

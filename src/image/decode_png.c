/* decode_png.c: PNG -> 8-bit RGB through libpng's classic API.
 *
 * libpng expands what it can (palette -> RGB, 1/2/4-bit gray -> 8-bit,
 * 16-bit -> 8-bit by keeping the high byte, as PIL's "RGB;16B" unpacker
 * does); whatever channel count remains (gray, gray+alpha, RGB, RGBA) is
 * turned into RGB here, dropping alpha like PIL's convert("RGB"). No gamma
 * or color-profile correction is applied, as in PIL.
 *
 * Errors: libpng's error callback longjmps back here (png_jmpbuf); reading
 * past the end of the buffer is a "truncated PNG" error. Warnings (bad
 * ancillary chunks) are ignored.
 *
 * Regions: PNG has no scaled decoding (the reply says scale_denom 1). A
 * non-interlaced image is read row by row and stops after the region's
 * last row, keeping only its columns; an interlaced one is decoded whole
 * and cropped. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <png.h>

#include "visc/core.h"
#include "visc/image.h"

typedef struct {
    const uint8_t *buf;
    size_t size, pos;
    char message[256];
    /* Owned by the decode in progress; freed after a longjmp. */
    uint8_t *pixels, *rows;
    png_bytep *row_ptrs;
} png_source;

static void on_error(png_structp png, png_const_charp msg) {
    png_source *src = png_get_error_ptr(png);
    snprintf(src->message, sizeof src->message, "PNG: %s", msg);
    png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg) {}

static void on_read(png_structp png, png_bytep data, size_t n) {
    png_source *src = png_get_io_ptr(png);
    if (n > src->size - src->pos) {
        snprintf(src->message, sizeof src->message, "truncated PNG: data ends at byte %zu",
                 src->size);
        png_longjmp(png, 1);
    }
    memcpy(data, src->buf + src->pos, n);
    src->pos += n;
}

/* Creates the reader and parses the chunks up to the first IDAT; NULL (with
 * the error set) when that fails. The caller has the jump buffer. */
static png_structp open_png(png_source *src, png_infop *info) {
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, src, on_error, on_warning);
    if (!png) {
        visc_set_error("PNG: cannot create the decoder");
        return NULL;
    }
    *info = png_create_info_struct(png);
    if (!*info) {
        png_destroy_read_struct(&png, NULL, NULL);
        visc_set_error("PNG: cannot create the decoder");
        return NULL;
    }
    png_set_read_fn(png, src, on_read);
    return png;
}

int visc_png_info(const uint8_t *buf, size_t size, int *width, int *height) {
    png_source src = {.buf = buf, .size = size};
    png_infop info = NULL;
    png_structp png = open_png(&src, &info);
    if (!png) return -1;
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        return visc_set_error("%s", src.message);
    }
    png_read_info(png, info);
    *width = (int)png_get_image_width(png, info);
    *height = (int)png_get_image_height(png, info);
    png_destroy_read_struct(&png, &info, NULL);
    return 0;
}

/* One row of `channels` 8-bit samples (gray, gray+alpha, RGB, RGBA) to RGB. */
static void row_to_rgb(uint8_t *dst, const uint8_t *src, int width, int channels) {
    switch (channels) {
    case 1:
        for (int i = 0; i < width; i++) dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = src[i];
        break;
    case 2:
        for (int i = 0; i < width; i++) dst[3 * i] = dst[3 * i + 1] = dst[3 * i + 2] = src[2 * i];
        break;
    case 3: memcpy(dst, src, (size_t)width * 3); break;
    default:
        for (int i = 0; i < width; i++) {
            dst[3 * i] = src[4 * i];
            dst[3 * i + 1] = src[4 * i + 1];
            dst[3 * i + 2] = src[4 * i + 2];
        }
    }
}

int visc_png_decode(const uint8_t *buf, size_t size, const visc_decode_request *req,
                    visc_decoded *out) {
    png_source src = {.buf = buf, .size = size};
    png_infop info = NULL;
    memset(out, 0, sizeof *out);
    png_structp png = open_png(&src, &info);
    if (!png) return -1;
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, NULL);
        free(src.pixels);
        free(src.rows);
        free(src.row_ptrs);
        return visc_set_error("%s", src.message);
    }
    png_read_info(png, info);
    const int width = (int)png_get_image_width(png, info);
    const int height = (int)png_get_image_height(png, info);
    visc_rect r;
    int s;
    if (visc_image_check_size("PNG", width, height) ||
        visc_image_plan(req, width, height, &r, &s)) {
        png_destroy_read_struct(&png, &info, NULL);
        return -1;
    }
    const int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    const int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    const int channels = png_get_channels(png, info);
    const size_t rowbytes = png_get_rowbytes(png, info);
    if (channels < 1 || channels > 4 || png_get_bit_depth(png, info) != 8 ||
        rowbytes != (size_t)width * channels)
        png_error(png, "unexpected layout after expansion"); /* longjmps */

    src.pixels = visc_malloc((size_t)r.w * r.h * 3, "decoded PNG");
    if (passes == 1) {
        /* Rows arrive in order: read down to the region's last row only. */
        src.rows = visc_malloc(rowbytes, "PNG row");
        for (int y = 0; y < r.y + r.h; y++) {
            png_read_row(png, src.rows, NULL);
            if (y >= r.y)
                row_to_rgb(src.pixels + (size_t)(y - r.y) * r.w * 3,
                           src.rows + (size_t)r.x * channels, r.w, channels);
        }
    } else {
        /* Adam7: every pass touches every row, so the whole image is needed. */
        src.rows = visc_malloc(rowbytes * height, "PNG image");
        src.row_ptrs = visc_malloc(sizeof *src.row_ptrs * height, "PNG row pointers");
        for (int y = 0; y < height; y++) src.row_ptrs[y] = src.rows + (size_t)y * rowbytes;
        png_read_image(png, src.row_ptrs);
        for (int y = 0; y < r.h; y++)
            row_to_rgb(src.pixels + (size_t)y * r.w * 3,
                       src.row_ptrs[r.y + y] + (size_t)r.x * channels, r.w, channels);
    }
    png_destroy_read_struct(&png, &info, NULL);
    free(src.rows);
    free(src.row_ptrs);
    out->image = (visc_image){src.pixels, r.w, r.h, 3 * r.w};
    out->covers = r;
    out->scale_denom = 1;
    out->source_width = width;
    out->source_height = height;
    return 0;
}

/* png.c: a PNG writer for 8-bit RGB images (the curves of `visc plot`).
 *
 * A PNG is the 8-byte signature and a list of chunks, each
 * length(4, big-endian) type(4) data(length) crc32(type + data). We write
 * IHDR (size, 8 bits per sample, colour type 2 = RGB, no interlace), one
 * IDAT holding the zlib stream of all scanlines (each prefixed by its filter
 * byte, 0 = none), and an empty IEND. zlib supplies both the deflate stream
 * and the CRC-32 that PNG uses. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "visc/core.h"
#include "visc/io.h"

#define PNG_MAX_SIDE 16384

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Writes one chunk at out and returns the bytes used (12 + n). */
static size_t put_chunk(uint8_t *out, const char type[4], const uint8_t *data, size_t n) {
    put_be32(out, (uint32_t)n);
    memcpy(out + 4, type, 4);
    if (n) memcpy(out + 8, data, n);
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, out + 4, 4);
    /* zlib's crc32 takes a uInt length; chunk data stays far below 4 GiB here */
    if (n) crc = crc32(crc, data, (uInt)n);
    put_be32(out + 8 + n, (uint32_t)crc);
    return 12 + n;
}

int visc_png_encode(const uint8_t *rgb, int width, int height, uint8_t **out, size_t *out_size) {
    *out = NULL;
    *out_size = 0;
    if (width < 1 || height < 1 || width > PNG_MAX_SIDE || height > PNG_MAX_SIDE)
        return visc_set_error("PNG: image size %dx%d out of range (1..%d a side)", width, height,
                              PNG_MAX_SIDE);
    size_t row = (size_t)width * 3;
    size_t raw_size = (row + 1) * (size_t)height;
    uint8_t *raw = visc_malloc(raw_size, "PNG scanlines");
    for (int y = 0; y < height; y++) {
        uint8_t *dst = raw + (size_t)y * (row + 1);
        dst[0] = 0; /* filter: none */
        memcpy(dst + 1, rgb + (size_t)y * row, row);
    }
    uLongf zsize = compressBound((uLong)raw_size);
    uint8_t *z = visc_malloc(zsize, "PNG compressed data");
    int zrc = compress2(z, &zsize, raw, (uLong)raw_size, 6);
    free(raw);
    if (zrc != Z_OK) {
        free(z);
        return visc_set_error("PNG: zlib compress2 failed (%d)", zrc);
    }

    uint8_t ihdr[13];
    put_be32(ihdr, (uint32_t)width);
    put_be32(ihdr + 4, (uint32_t)height);
    ihdr[8] = 8;  /* bits per sample */
    ihdr[9] = 2;  /* colour type: RGB */
    ihdr[10] = 0; /* compression: deflate */
    ihdr[11] = 0; /* filter method: adaptive (the only one) */
    ihdr[12] = 0; /* no interlace */

    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    size_t total = 8 + (12 + sizeof ihdr) + (12 + (size_t)zsize) + 12;
    uint8_t *png = visc_malloc(total, "PNG file");
    size_t at = 0;
    memcpy(png, signature, 8);
    at += 8;
    at += put_chunk(png + at, "IHDR", ihdr, sizeof ihdr);
    at += put_chunk(png + at, "IDAT", z, zsize);
    at += put_chunk(png + at, "IEND", NULL, 0);
    free(z);
    VISC_ASSERT(at == total);
    *out = png;
    *out_size = total;
    return 0;
}

int visc_png_write(const char *path, const uint8_t *rgb, int width, int height) {
    uint8_t *png;
    size_t size;
    if (visc_png_encode(rgb, width, height, &png, &size)) return -1;
    const void *parts[1] = {png};
    int rc = visc_write_file_atomic(path, parts, &size, 1);
    free(png);
    return rc;
}

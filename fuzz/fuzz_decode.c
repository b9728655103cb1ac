/* fuzz_decode.c: libFuzzer target for the image decoders (JPEG, PNG).
 * Build and run (or `make fuzz`, see fuzz/README.md):
 *   clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -Iinclude \
 *       fuzz/fuzz_decode.c src/image/decode.c src/image/decode_jpeg.c src/image/decode_png.c \
 *       src/core/error.c src/core/memory.c \
 *       -ljpeg -lpng -lz -o /tmp/fuzz_decode
 *   mkdir -p /tmp/corpus && cp -r fuzz/corpus/fuzz_decode/. /tmp/corpus/
 *   /tmp/fuzz_decode -max_total_time=60 /tmp/corpus
 * The input is one image file. It is probed (visc_image_info), decoded
 * whole, and decoded again with a region and scale drawn from its last 4
 * bytes (trailing bytes after a JPEG's EOI or a PNG's image data do not
 * change the picture, so mutations there explore the request space); the
 * reply's geometry is checked against the promises of image.h. */
#include <stdint.h>
#include <stdlib.h>

#include "visc/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* 4 Mpixels: headers that claim more fail fast with the pixel-limit
     * error instead of spending the fuzzer's memory and time budget. */
    visc_image_set_max_pixels((int64_t)1 << 22);
    visc_image img;
    if (visc_image_decode(data, size, &img) == 0) {
        if (img.width <= 0 || img.height <= 0 || img.stride < 3 * img.width) abort();
        visc_image_free(&img);
    }
    int w, h;
    if (size < 4 || visc_image_info(data, size, &w, &h)) return 0;
    const uint8_t *knob = data + size - 4;
    visc_decode_request req;
    req.scale_denom = 1 << (knob[0] & 3);
    req.region.x = (int)((int64_t)knob[1] * w / 256);
    req.region.y = (int)((int64_t)knob[2] * h / 256);
    req.region.w = knob[3] & 0x80 ? 0 : 1 + (int)((int64_t)(knob[3] & 15) * w / 16);
    req.region.h = 1 + (int)((int64_t)(knob[3] >> 4 & 7) * h / 8);
    visc_decoded d;
    if (visc_image_decode_request(data, size, &req, &d)) return 0;
    const visc_rect c = d.covers;
    const int s = d.scale_denom;
    if (d.source_width != w || d.source_height != h) abort();
    if (c.x < 0 || c.y < 0 || c.x + c.w > w || c.y + c.h > h || c.x % s || c.y % s) abort();
    if (d.image.width != (c.w + s - 1) / s || d.image.height != (c.h + s - 1) / s) abort();
    if (req.region.w && (c.x > req.region.x || c.y > req.region.y)) abort();
    visc_image_free(&d.image);
    return 0;
}

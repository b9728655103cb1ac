/* fuzz_idx.c: libFuzzer target for the IDX parsers and the gunzip in front
 * of them. Build and run:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude fuzz/fuzz_idx.c \
 *       src/data/idx.c src/data/gzip.c src/data/augment.c src/data/dataset_memory.c \
 *       src/core/error.c src/core/memory.c src/core/rng.c -lz -lm -o build/fuzz_idx
 *   ./build/fuzz_idx fuzz/corpus/fuzz_idx
 * The input is one file as it would be on disk (gzipped or not); it is
 * parsed both as images and as labels, and a parsed image is augmented with
 * a crop/flip drawn from the last input byte, so lying headers reach the
 * geometry code too. */
#include <stdint.h>
#include <stdlib.h>

#include "visc/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf;
    size_t n;
    /* 16 MiB: big enough for any interesting input, small enough that a
     * zip bomb is caught by the cap and not by the fuzzer's RSS limit. */
    if (visc_gunzip_memory(data, size, &buf, &n, (size_t)1 << 24)) return 0;

    uint8_t *images;
    int64_t count;
    int h, w;
    if (visc_idx_parse_images(buf, n, &images, &count, &h, &w) == 0) {
        if ((int64_t)h * w <= 1 << 16) {
            uint8_t knob = size ? data[size - 1] : 0;
            visc_augment aug = {knob & 7, knob >> 3 & 1, {0.5f, 0, 0}, {0.25f, 1, 1}, 0};
            float *out = malloc((size_t)h * w * sizeof *out);
            visc_augment_apply(&aug, images + (size_t)(count - 1) * h * w, 1, h, w, 1, knob,
                               knob >> 4, count - 1, out);
            free(out);
        }
        free(images);
    }
    int32_t *labels;
    if (visc_idx_parse_labels(buf, n, &labels, &count) == 0) free(labels);
    free(buf);
    return 0;
}

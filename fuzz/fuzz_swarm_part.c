/* fuzz_swarm_part.c: libFuzzer target for a compressed part as a hostile
 * peer sends it: decoding, then validation and aggregation. `make fuzz`
 * builds it; run:
 *   ./build-fuzz/fuzz/fuzz_swarm_part fuzz/corpus/fuzz_swarm_part
 * The first byte chooses the encoding (low 2 bits) and how far the value
 * count n is off the count that the remaining bytes would hold (the other
 * 6 bits, -32..31), so both exact and mismatched sizes are explored.
 * A rejected part must leave the output untouched; an accepted one must
 * be all finite, re-encode into something that decodes again, and survive
 * validation and every aggregation mode. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/swarm/aggregate.h"
#include "../src/swarm/compress.h"
#include "visc/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SENTINEL 12345.0f
#define MAX_VALUES (1u << 16)

/* The count of values that `bytes` holds in encoding c (rounded down). */
static size_t values_in(visc_compression c, size_t bytes) {
    switch (c) {
    case VISC_COMP_NONE: return bytes / 4;
    case VISC_COMP_FP16:
    case VISC_COMP_BF16: return bytes / 2;
    case VISC_COMP_Q8: {
        size_t full = bytes / (VISC_Q8_BLOCK + 4), rest = bytes % (VISC_Q8_BLOCK + 4);
        return full * VISC_Q8_BLOCK + (rest > 4 ? rest - 4 : 0);
    }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    visc_compression c = (visc_compression)(data[0] & 3);
    long off = (long)(data[0] >> 2) - 32;
    const uint8_t *in = data + 1;
    size_t bytes = size - 1;
    long guess = (long)values_in(c, bytes) + off;
    size_t n = guess < 0 ? 0 : (size_t)guess;
    if (n > MAX_VALUES) return 0;

    float *x = malloc((n + 1) * sizeof *x);
    if (!x) return 0;
    for (size_t i = 0; i <= n; i++) x[i] = SENTINEL;
    if (visc_decompress(c, in, bytes, x, n) != 0) {
        for (size_t i = 0; i <= n; i++) VISC_ASSERT(x[i] == SENTINEL);
        free(x);
        return 0;
    }
    VISC_ASSERT(bytes == visc_compressed_size(c, n));
    VISC_ASSERT(x[n] == SENTINEL);
    for (size_t i = 0; i < n; i++) VISC_ASSERT(isfinite(x[i]));

    /* what decodes, re-encodes (with error feedback for q8) into a part
     * that decodes again */
    uint8_t *again = malloc(bytes + 1);
    float *y = malloc((n + 1) * sizeof *y), *err = calloc(n + 1, sizeof *err);
    if (!again || !y || !err) {
        free(again);
        free(y);
        free(err);
        free(x);
        return 0;
    }
    VISC_ASSERT(visc_compress(c, x, n, again, err) == bytes);
    VISC_ASSERT(visc_decompress(c, again, bytes, y, n) == 0);
    if (c == VISC_COMP_NONE || c == VISC_COMP_BF16)
        VISC_ASSERT(memcmp(x, y, n * sizeof *x) == 0); /* decoded values are representable */

    visc_aggregate_config cfg;
    visc_aggregate_config_default(&cfg);
    if (visc_validate_part(&cfg, x, n, 1.0) == 0 && n > 0) {
        const float *parts[3] = {x, y, x};
        double w[3] = {1, 2, 3};
        for (int mode = 0; mode < 3; mode++) {
            cfg.mode = (visc_aggregation)mode;
            VISC_ASSERT(visc_aggregate(&cfg, parts, w, 3, n, err) == 0);
            for (size_t i = 0; i < n; i++) VISC_ASSERT(isfinite(err[i]));
        }
    }
    free(again);
    free(y);
    free(err);
    free(x);
    return 0;
}

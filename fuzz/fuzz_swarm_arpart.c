/* fuzz_swarm_arpart.c: libFuzzer target for the all-reduce messages
 * (allreduce.h): AR_HELLO, and AR_PART / AR_RESULT payloads with each
 * compression. `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_swarm_arpart fuzz/corpus/fuzz_swarm_arpart
 * Input: a selector byte (bit 7: hello, else bits 0-1 the compression),
 * two bytes of value count (1..8192), one byte of expected part index,
 * then the message. A part that parses holds only finite values, and a
 * hello that parses has a usable weight (finite, >= 0: 0 is an auxiliary
 * member's) and known enumerations. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "../src/swarm/allreduce.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    const uint8_t *msg = data + 4;
    size_t n = size - 4;
    if (data[0] & 0x80) {
        visc_ar_hello h;
        if (visc_ar_hello_parse(msg, n, &h) == 0) {
            VISC_ASSERT(isfinite(h.weight) && !signbit(h.weight)); /* 0: an auxiliary's */
            VISC_ASSERT(h.compression <= VISC_COMP_Q8 && h.aggregation <= VISC_AGG_CENTERED_CLIP);
            uint8_t again[VISC_AR_HELLO_BYTES];
            visc_ar_hello_encode(&h, again);
            VISC_ASSERT(memcmp(again, msg, VISC_AR_HELLO_BYTES) == 0);
        }
        return 0;
    }
    visc_compression c = (visc_compression)(data[0] & 3);
    size_t count = 1 + ((size_t)data[1] | (size_t)data[2] << 8) % 8192;
    float *out = malloc(count * sizeof(float));
    if (!out) return 0;
    if (visc_ar_part_parse(msg, n, data[3], c, out, count) == 0)
        for (size_t i = 0; i < count; i++) VISC_ASSERT(isfinite(out[i]));
    free(out);
    return 0;
}

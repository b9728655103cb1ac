/* fuzz_tensorboard.c: libFuzzer target for the TensorBoard event-file
 * reader (TFRecord framing, CRC32C checks, protobuf walking).
 *
 * Random bytes almost never carry valid CRCs, so the input is parsed twice:
 * as a whole file (framing and CRC checks), and wrapped as the payload of
 * one correctly framed record (so mutations reach the protobuf walker). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "visc/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(void *ctx, const char *tag, int64_t step, float value) {
    (void)step;
    (void)value;
    *(size_t *)ctx += strlen(tag); /* the tag must be a terminated string */
}

static uint32_t masked(const uint8_t *p, size_t n) {
    uint32_t c = visc_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t total = 0;
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    visc_tb_parse(buf, size, check, &total);
    free(buf);

    uint8_t *rec = malloc(size + 16);
    put_le(rec, size, 8);
    put_le(rec + 8, masked(rec, 8), 4);
    memcpy(rec + 12, data, size);
    put_le(rec + 12 + size, masked(rec + 12, size), 4);
    visc_tb_parse(rec, size + 16, check, &total);
    free(rec);
    return 0;
}

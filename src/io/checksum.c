/* checksum.c: CRC-32 (zlib's polynomial) of buffers of any size. */
#include <zlib.h>

#include "visc/io.h"

uint32_t visc_crc32(const uint8_t *buf, size_t size) {
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    for (size_t off = 0; off < size;) {
        size_t n = size - off > (1u << 30) ? (1u << 30) : size - off;
        crc = (uint32_t)crc32(crc, buf + off, (uInt)n);
        off += n;
    }
    return crc;
}

/* gzip.c: whole-file reads that gunzip transparently.
 *
 * Datasets ship as .gz (MNIST) or plain files; callers should not care. The
 * decompressed size is capped because a gzip stream is untrusted input: a
 * few kilobytes can claim gigabytes (a "zip bomb"), so inflation stops as
 * soon as the output would pass max_bytes, rather than trusting the size
 * field in the gzip trailer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "visc/core.h"
#include "visc/data.h"

static int is_gzip(const uint8_t *buf, size_t size) {
    return size >= 2 && buf[0] == 0x1f && buf[1] == 0x8b;
}

static int all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

int visc_gunzip_memory(const uint8_t *buf, size_t size, uint8_t **out, size_t *out_size,
                       size_t max_bytes) {
    *out = NULL;
    *out_size = 0;
    if (!is_gzip(buf, size)) {
        if (size > max_bytes)
            return visc_set_error("%zu bytes, more than the limit of %zu", size, max_bytes);
        *out = visc_malloc(size, "file contents");
        if (size) memcpy(*out, buf, size);
        *out_size = size;
        return 0;
    }
    /* The trailer's ISIZE (size mod 2^32) is only a hint for the first
     * allocation; growth is by doubling and bounded by the cap. */
    size_t cap = size >= 18 ? (size_t)buf[size - 4] | (size_t)buf[size - 3] << 8 |
                                  (size_t)buf[size - 2] << 16 | (size_t)buf[size - 1] << 24
                            : 0;
    /* One byte beyond the cap tells "too large" (output fills the extra
     * byte) from "ends exactly at the cap" and from a truncated stream. */
    size_t limit = max_bytes < SIZE_MAX ? max_bytes + 1 : SIZE_MAX;
    if (cap < 4096) cap = 4096;
    if (cap > limit) cap = limit;
    uint8_t *dst = visc_malloc(cap, "gunzipped data");
    size_t used = 0;

    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
        free(dst);
        return visc_set_error("gzip: cannot initialize zlib");
    }
    zs.next_in = (Bytef *)buf;
    int rc;
    size_t consumed = 0; /* input bytes handed to zlib so far */
    for (;;) {
        /* zlib counts in uInt: feed input and output in chunks it can hold. */
        if (zs.avail_in == 0 && consumed < size) {
            size_t chunk = size - consumed;
            if (chunk > (1u << 30)) chunk = 1u << 30;
            zs.avail_in = (uInt)chunk;
            consumed += chunk;
        }
        if (used == cap) {
            if (cap >= limit) {
                inflateEnd(&zs);
                free(dst);
                return visc_set_error("gzip: decompresses to more than the limit of %zu bytes",
                                      max_bytes);
            }
            cap = cap > limit / 2 ? limit : cap * 2;
            dst = visc_realloc(dst, cap, "gunzipped data");
        }
        size_t room = cap - used;
        if (room > (1u << 30)) room = 1u << 30;
        zs.next_out = dst + used;
        zs.avail_out = (uInt)room;
        rc = inflate(&zs, Z_NO_FLUSH);
        used += room - zs.avail_out;
        if (rc == Z_STREAM_END) {
            /* Concatenated members are one file to gunzip; zero padding after
             * the last member is tolerated (as gunzip does), anything else is
             * not ours to guess at. */
            size_t left = zs.avail_in + (size - consumed);
            const uint8_t *rest = zs.next_in;
            if (left == 0 || all_zero(rest, left)) {
                if (used > max_bytes) {
                    inflateEnd(&zs);
                    free(dst);
                    return visc_set_error("gzip: decompresses to more than the limit of %zu bytes",
                                          max_bytes);
                }
                break;
            }
            if (!is_gzip(rest, left)) {
                inflateEnd(&zs);
                free(dst);
                return visc_set_error("gzip: %zu bytes of trailing garbage after the stream", left);
            }
            inflateReset(&zs);
            continue;
        }
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR) {
            /* No progress possible: fine if the output is full (the loop
             * grows it) or more input is waiting; otherwise the input ended
             * inside the stream. */
            if (zs.avail_out == 0 || (zs.avail_in == 0 && consumed < size)) continue;
            if (zs.avail_in == 0) {
                inflateEnd(&zs);
                free(dst);
                return visc_set_error("gzip: truncated stream (input ends after %zu bytes)", size);
            }
        }
        const char *why = zs.msg ? zs.msg : (rc == Z_MEM_ERROR ? "out of memory" : "bad data");
        inflateEnd(&zs);
        free(dst);
        return visc_set_error("gzip: corrupt stream (%s)", why);
    }
    inflateEnd(&zs);
    *out = dst;
    *out_size = used;
    return 0;
}

/* Reads the raw bytes of a file; the limit keeps a wrong path (a disk
 * image, /dev/zero) from eating memory. */
static int read_file(const char *path, uint8_t **out, size_t *size, size_t limit) {
    FILE *f = fopen(path, "rb");
    if (!f) return visc_set_error("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    size_t cap = 1 << 16;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode)) {
        if ((uint64_t)st.st_size > limit) {
            fclose(f);
            return visc_set_error("%s: %lld bytes, more than the limit of %zu", path,
                                  (long long)st.st_size, limit);
        }
        cap = (size_t)st.st_size + 1; /* +1: sees EOF without a regrow */
    }
    uint8_t *buf = visc_malloc(cap, "file contents");
    size_t used = 0;
    for (;;) {
        if (used == cap) {
            if (cap > limit) {
                free(buf);
                fclose(f);
                return visc_set_error("%s: more than the limit of %zu bytes", path, limit);
            }
            cap *= 2;
            buf = visc_realloc(buf, cap, "file contents");
        }
        size_t got = fread(buf + used, 1, cap - used, f);
        used += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return visc_set_error("%s: read error", path);
    }
    if (used > limit) {
        free(buf);
        return visc_set_error("%s: more than the limit of %zu bytes", path, limit);
    }
    *out = buf;
    *size = used;
    return 0;
}

int visc_read_maybe_gzip(const char *path, uint8_t **out, size_t *size, size_t max_bytes) {
    uint8_t *raw = NULL;
    size_t raw_size = 0;
    *out = NULL;
    *size = 0;
    /* A gzip file of incompressible data is slightly larger than its
     * contents (5 bytes per 16 KiB block plus headers). */
    size_t raw_limit = max_bytes + max_bytes / 1024 + 4096;
    if (raw_limit < max_bytes) raw_limit = SIZE_MAX;
    if (read_file(path, &raw, &raw_size, raw_limit)) return -1;
    if (!is_gzip(raw, raw_size)) {
        if (raw_size > max_bytes) {
            free(raw);
            return visc_set_error("%s: %zu bytes, more than the limit of %zu", path, raw_size,
                                  max_bytes);
        }
        *out = raw;
        *size = raw_size;
        return 0;
    }
    int rc = visc_gunzip_memory(raw, raw_size, out, size, max_bytes);
    free(raw);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", visc_last_error());
        return visc_set_error("%s: %s", path, msg);
    }
    return 0;
}

/* pack.c: packed shards, so that training reads a few big files instead of
 * a million small ones (and, pre-resized, decodes 256-px JPEGs instead of
 * 500-px originals).
 *
 * A pack is a folder: shard-00000.bin, shard-00001.bin, ... hold the
 * samples back to back (JPEG files, or raw RGB bytes with --raw); index.bin
 * says where each one is. The index is written last and atomically, so a
 * pack either has a complete index or none.
 *
 * index.bin (native little-endian; the magic catches anything else):
 *   header 64 bytes: "VISCPACK" u32 version u32 flags(1 = raw) u64 count
 *                    u32 num_classes u32 num_shards u64 classes_size
 *                    u64 names_size u8 reserved[16]
 *   u64 shard_size[num_shards]
 *   record[count], 48 bytes each: u32 shard i32 label u64 offset u64 size
 *                    u32 width u32 height u32 crc u32 name_len u64 name_off
 *   class names: num_classes NUL-terminated strings (classes_size bytes)
 *   file names: NUL-terminated (names_size bytes)
 *   u32 crc32 of everything above
 * Opening checks all of it (sizes add up exactly, every record inside its
 * shard, labels < num_classes, names terminated) and each shard's size; a
 * record's own crc is checked when it is read, so a flipped bit in a shard
 * is one bad sample with a clear message, not garbage pixels. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <jpeglib.h>

#include "visc/core.h"
#include "visc/image.h"
#include "visc/io.h"
#include "visc/loader.h"
#include "visc/transforms.h"

#define PACK_MAGIC "VISCPACK"
#define PACK_VERSION 1u
#define HEADER_SIZE 64
#define RECORD_SIZE 48
#define MAX_SIDE 65535u
#define MAX_CLASSES (1u << 24)

void visc_pack_options_default(visc_pack_options *o) {
    memset(o, 0, sizeof *o);
    o->quality = 90;
    o->shard_bytes = (int64_t)1 << 30;
}

/* ---- reading ---- */

static uint32_t rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int visc_pack_parse_index(visc_pack *p, const uint8_t *buf, size_t size) {
    memset(p, 0, sizeof *p);
    if (size < HEADER_SIZE + 4 || memcmp(buf, PACK_MAGIC, 8) != 0)
        return visc_set_error("pack index: not a visc pack (bad magic)");
    if (rd32(buf + 8) != PACK_VERSION)
        return visc_set_error("pack index: unsupported version %u", rd32(buf + 8));
    if (visc_crc32(buf, size - 4) != rd32(buf + size - 4))
        return visc_set_error("pack index: checksum mismatch (corrupt or truncated)");
    uint32_t flags = rd32(buf + 12), nclasses = rd32(buf + 24), nshards = rd32(buf + 28);
    uint64_t count = rd64(buf + 16), classes_size = rd64(buf + 32), names_size = rd64(buf + 40);
    if (flags > 1) return visc_set_error("pack index: unknown flags %u", flags);
    if (nclasses == 0 || nclasses > MAX_CLASSES)
        return visc_set_error("pack index: bad class count %u", nclasses);
    /* every size is checked against the buffer before any multiplication can overflow */
    size_t left = size - HEADER_SIZE - 4;
    if (nshards > left / 8 || count > left / RECORD_SIZE || classes_size > left ||
        names_size > left ||
        (uint64_t)nshards * 8 + count * RECORD_SIZE + classes_size + names_size != left)
        return visc_set_error("pack index: section sizes do not add up to the file size");
    if (count > 0 && nshards == 0) return visc_set_error("pack index: records but no shards");
    const uint8_t *sh = buf + HEADER_SIZE, *rec = sh + (size_t)nshards * 8,
                  *cls = rec + count * RECORD_SIZE, *names = cls + classes_size;
    if (classes_size == 0 || cls[classes_size - 1] != 0)
        return visc_set_error("pack index: class names not terminated");
    if (names_size > 0 && names[names_size - 1] != 0)
        return visc_set_error("pack index: file names not terminated");

    p->raw = (int)(flags & 1);
    p->count = (int64_t)count;
    p->num_shards = (int)nshards;
    p->shard_sizes = visc_malloc((nshards ? nshards : 1) * sizeof *p->shard_sizes, "pack shards");
    for (uint32_t i = 0; i < nshards; i++) p->shard_sizes[i] = rd64(sh + 8 * (size_t)i);
    p->class_names = visc_calloc(nclasses, sizeof *p->class_names, "pack classes");
    p->num_classes = (int)nclasses;
    size_t off = 0;
    for (uint32_t c = 0; c < nclasses; c++) {
        if (off >= classes_size) {
            visc_pack_close(p);
            return visc_set_error("pack index: fewer class names than %u", nclasses);
        }
        p->class_names[c] = visc_strdup((const char *)cls + off);
        off += strlen(p->class_names[c]) + 1;
    }
    if (off != classes_size) {
        visc_pack_close(p);
        return visc_set_error("pack index: more class names than %u", nclasses);
    }
    p->names = visc_malloc(names_size + 1, "pack names");
    memcpy(p->names, names, names_size);
    p->names[names_size] = 0;
    p->records = visc_malloc((count ? count : 1) * sizeof *p->records, "pack records");
    for (uint64_t i = 0; i < count; i++) {
        const uint8_t *r = rec + i * RECORD_SIZE;
        visc_pack_record *d = &p->records[i];
        uint32_t shard = rd32(r), label = rd32(r + 4);
        d->offset = rd64(r + 8);
        d->size = rd64(r + 16);
        d->width = rd32(r + 24);
        d->height = rd32(r + 28);
        d->crc = rd32(r + 32);
        d->name_len = rd32(r + 36);
        d->name_off = rd64(r + 40);
        const char *why = NULL;
        if (shard >= nshards) why = "shard out of range";
        else if (label >= nclasses) why = "label out of range";
        else if (d->size == 0 || d->offset > p->shard_sizes[shard] ||
                 d->size > p->shard_sizes[shard] - d->offset)
            why = "data outside its shard";
        else if (d->width == 0 || d->height == 0 || d->width > MAX_SIDE || d->height > MAX_SIDE)
            why = "bad image size";
        else if (p->raw && d->size != (uint64_t)d->width * d->height * 3)
            why = "raw size is not width x height x 3";
        else if (d->name_off >= names_size || d->name_len > names_size - d->name_off - 1 ||
                 names[d->name_off + d->name_len] != 0 ||
                 memchr(names + d->name_off, 0, d->name_len))
            why = "bad name";
        if (why) {
            visc_pack_close(p);
            return visc_set_error("pack index: record %llu: %s", (unsigned long long)i, why);
        }
        d->shard = (int32_t)shard;
        d->label = (int32_t)label;
    }
    return 0;
}

int visc_pack_open(visc_pack *p, const char *dir) {
    memset(p, 0, sizeof *p);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/index.bin", dir) >= (int)sizeof path)
        return visc_set_error("pack path too long: '%s'", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return visc_set_error("cannot open pack index '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        close(fd);
        return visc_set_error("'%s': empty or unreadable pack index", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return visc_set_error("cannot map '%s': %s", path, strerror(errno));
    int rc = visc_pack_parse_index(p, map, (size_t)st.st_size);
    munmap(map, (size_t)st.st_size);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", visc_last_error());
        return visc_set_error("%s: %s", path, msg);
    }
    p->dir = visc_strdup(dir);
    p->shards = visc_calloc((size_t)(p->num_shards ? p->num_shards : 1), sizeof *p->shards,
                            "pack shard maps");
    for (int i = 0; i < p->num_shards; i++) {
        snprintf(path, sizeof path, "%s/shard-%05d.bin", dir, i);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size != p->shard_sizes[i]) {
            unsigned long long want = (unsigned long long)p->shard_sizes[i];
            if (fd >= 0) close(fd);
            visc_pack_close(p);
            return visc_set_error("pack shard '%s' is missing or not %llu bytes as indexed", path,
                                  want);
        }
        if (st.st_size > 0) {
            map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
            if (map == MAP_FAILED) {
                close(fd);
                visc_pack_close(p);
                return visc_set_error("cannot map '%s': %s", path, strerror(errno));
            }
            p->shards[i] = map;
        }
        close(fd);
    }
    return 0;
}

int visc_pack_bytes(const visc_pack *p, int64_t i, const uint8_t **data, size_t *size) {
    if (i < 0 || i >= p->count || !p->shards)
        return visc_set_error("pack record %lld out of range", (long long)i);
    const visc_pack_record *r = &p->records[i];
    const uint8_t *d = p->shards[r->shard] + r->offset;
    if (visc_crc32(d, r->size) != r->crc)
        return visc_set_error("pack record %lld ('%s'): checksum mismatch in shard %d (corrupt "
                              "shard)",
                              (long long)i, p->names + r->name_off, r->shard);
    *data = d;
    *size = (size_t)r->size;
    return 0;
}

void visc_pack_close(visc_pack *p) {
    if (!p) return;
    for (int i = 0; p->shards && i < p->num_shards; i++)
        if (p->shards[i]) munmap((void *)p->shards[i], p->shard_sizes[i]);
    free(p->shards);
    free(p->shard_sizes);
    free(p->records);
    for (int c = 0; p->class_names && c < p->num_classes; c++) free(p->class_names[c]);
    free(p->class_names);
    free(p->names);
    free(p->dir);
    memset(p, 0, sizeof *p);
}

/* ---- writing ---- */

typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
} jpeg_err;

static void on_jpeg_error(j_common_ptr c) { longjmp(((jpeg_err *)c->err)->jump, 1); }

/* libjpeg into memory (4:2:0, as PIL's default save). */
static int encode_jpeg(const visc_image *img, int quality, uint8_t **out, size_t *out_size) {
    struct jpeg_compress_struct c;
    jpeg_err err;
    unsigned char *mem = NULL;
    unsigned long mem_size = 0;
    c.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = on_jpeg_error;
    if (setjmp(err.jump)) {
        jpeg_destroy_compress(&c);
        free(mem);
        return visc_set_error("JPEG encoding failed");
    }
    jpeg_create_compress(&c);
    jpeg_mem_dest(&c, &mem, &mem_size);
    c.image_width = (JDIMENSION)img->width;
    c.image_height = (JDIMENSION)img->height;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = img->data + (size_t)c.next_scanline * (size_t)img->stride;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    *out = visc_malloc(mem_size, "encoded JPEG");
    memcpy(*out, mem, mem_size);
    free(mem);
    *out_size = mem_size;
    return 0;
}

static void target_size(const visc_pack_options *o, int w, int h, int *tw, int *th) {
    *tw = w;
    *th = h;
    if (o->shorter_side > 0 && (w < h ? w : h) > o->shorter_side) {
        visc_resize_shorter_size(w, h, o->shorter_side, tw, th);
    } else if (o->max_side > 0 && (w > h ? w : h) > o->max_side) {
        if (w >= h) {
            *tw = o->max_side;
            *th = (int)((int64_t)h * o->max_side / w);
        } else {
            *th = o->max_side;
            *tw = (int)((int64_t)w * o->max_side / h);
        }
        if (*tw < 1) *tw = 1;
        if (*th < 1) *th = 1;
    }
}

typedef struct {
    uint8_t *data;
    size_t size;
    uint32_t width, height;
    char error[512];
} packed_item;

/* Turns one source file into the bytes to store. */
static int prepare(const visc_file_list *fl, int64_t i, const visc_pack_options *o,
                   packed_item *it) {
    char path[4096];
    uint8_t *src = NULL;
    size_t n = 0;
    if (visc_file_list_path(fl, i, path, sizeof path) ||
        visc_read_maybe_gzip(path, &src, &n, (size_t)1 << 30))
        return -1;
    /* visc_read_maybe_gzip would inflate a gzip file; images are never gzip */
    int rc = 0;
    if (!o->raw && o->max_side <= 0 && o->shorter_side <= 0) {
        int w, h;
        if (visc_image_info(src, n, &w, &h)) rc = -1;
        else {
            it->data = src;
            it->size = n;
            it->width = (uint32_t)w;
            it->height = (uint32_t)h;
            return 0;
        }
    } else {
        visc_image img = {0}, small = {0};
        if (visc_image_decode(src, n, &img)) rc = -1;
        else {
            int tw, th;
            target_size(o, img.width, img.height, &tw, &th);
            const visc_image *use = &img;
            if (tw != img.width || th != img.height) {
                visc_transform_image_alloc(&small, tw, th);
                visc_resize(&img, NULL, VISC_INTERP_BILINEAR, &small);
                use = &small;
            }
            it->width = (uint32_t)use->width;
            it->height = (uint32_t)use->height;
            if (o->raw) {
                it->size = (size_t)use->width * use->height * 3;
                it->data = visc_malloc(it->size, "raw image");
                for (int y = 0; y < use->height; y++)
                    memcpy(it->data + (size_t)y * use->width * 3,
                           use->data + (size_t)y * use->stride, (size_t)use->width * 3);
            } else {
                rc = encode_jpeg(use, o->quality, &it->data, &it->size);
            }
            if (small.data) visc_transform_image_free(&small);
            visc_image_free(&img);
        }
    }
    free(src);
    if (rc) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", visc_last_error());
        return visc_set_error("%s: %s", path, msg);
    }
    return 0;
}

static int finish_shard(FILE *f, const char *tmp, const char *final) {
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, final) != 0) {
        unlink(tmp);
        return visc_set_error("cannot write pack shard '%s': %s", final, strerror(errno));
    }
    return 0;
}

int visc_pack_write(const visc_file_list *fl, const char *dst, const visc_pack_options *o) {
    if (fl->count <= 0) return visc_set_error("nothing to pack");
    if (o->quality < 1 || o->quality > 100)
        return visc_set_error("--quality %d: expected 1..100", o->quality);
    if (strlen(dst) > 4000) return visc_set_error("pack path too long: '%s'", dst);
    if (visc_mkdirs(dst)) return -1;
    const int64_t chunk = 256;
    packed_item *items = visc_calloc((size_t)chunk, sizeof *items, "pack chunk");
    uint8_t *rec = visc_calloc((size_t)fl->count, RECORD_SIZE, "pack records");
    size_t cap_shards = 16;
    uint64_t *shard_sizes = visc_calloc(cap_shards, sizeof *shard_sizes, "pack shards");
    int nshards = 0, rc = 0;
    FILE *f = NULL;
    char tmp[4300], final[4200];
    uint64_t pos = 0;
    int threads = o->threads > 0 ? o->threads : visc_num_threads();
    double t0 = visc_now();
    for (int64_t base = 0; base < fl->count && rc == 0; base += chunk) {
        int64_t m = fl->count - base < chunk ? fl->count - base : chunk;
        int first_bad = -1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (int64_t k = 0; k < m; k++) {
            if (prepare(fl, base + k, o, &items[k])) {
                snprintf(items[k].error, sizeof items[k].error, "%s", visc_last_error());
                items[k].data = NULL;
            }
        }
        for (int64_t k = 0; k < m; k++)
            if (!items[k].data && first_bad < 0) first_bad = (int)k;
        if (first_bad >= 0) {
            rc = visc_set_error("cannot pack %s", items[first_bad].error);
        }
        for (int64_t k = 0; k < m && rc == 0; k++) {
            packed_item *it = &items[k];
            if (!f || (pos > 0 && pos + it->size > (uint64_t)o->shard_bytes)) {
                if (f && (rc = finish_shard(f, tmp, final)) != 0) {
                    f = NULL;
                    break;
                }
                if ((size_t)nshards == cap_shards)
                    shard_sizes = visc_realloc(shard_sizes, (cap_shards *= 2) * sizeof *shard_sizes,
                                               "pack shards");
                snprintf(final, sizeof final, "%s/shard-%05d.bin", dst, nshards);
                snprintf(tmp, sizeof tmp, "%s.tmp.%ld", final, (long)getpid());
                if (!(f = fopen(tmp, "wb"))) {
                    rc = visc_set_error("cannot write '%s': %s", tmp, strerror(errno));
                    break;
                }
                shard_sizes[nshards++] = 0;
                pos = 0;
            }
            if (fwrite(it->data, 1, it->size, f) != it->size) {
                rc = visc_set_error("cannot write '%s': %s", tmp, strerror(errno));
                break;
            }
            uint8_t *r = rec + (size_t)(base + k) * RECORD_SIZE;
            uint32_t shard = (uint32_t)(nshards - 1), label = (uint32_t)fl->labels[base + k];
            uint64_t size = it->size;
            uint32_t crc = visc_crc32(it->data, it->size);
            const char *name = visc_file_list_name(fl, base + k);
            uint32_t name_len = (uint32_t)strlen(name);
            uint64_t name_off = (uint64_t)(name - fl->names);
            memcpy(r, &shard, 4);
            memcpy(r + 4, &label, 4);
            memcpy(r + 8, &pos, 8);
            memcpy(r + 16, &size, 8);
            memcpy(r + 24, &it->width, 4);
            memcpy(r + 28, &it->height, 4);
            memcpy(r + 32, &crc, 4);
            memcpy(r + 36, &name_len, 4);
            memcpy(r + 40, &name_off, 8);
            pos += size;
            shard_sizes[nshards - 1] = pos;
        }
        for (int64_t k = 0; k < m; k++) {
            free(items[k].data);
            items[k].data = NULL;
        }
        if (o->verbose && rc == 0)
            fprintf(stderr, "visc pack: %lld / %lld images, %.0f images/s\n", (long long)(base + m),
                    (long long)fl->count, (double)(base + m) / (visc_now() - t0 + 1e-9));
    }
    if (f) {
        if (rc == 0) rc = finish_shard(f, tmp, final);
        else {
            fclose(f);
            unlink(tmp);
        }
    }
    if (rc == 0) {
        /* names: the list's blob as is (records point into it) */
        size_t classes_size = 0;
        for (int c = 0; c < fl->num_classes; c++) classes_size += strlen(fl->class_names[c]) + 1;
        char *classes = visc_malloc(classes_size, "pack classes");
        size_t off = 0;
        for (int c = 0; c < fl->num_classes; c++) {
            size_t len = strlen(fl->class_names[c]) + 1;
            memcpy(classes + off, fl->class_names[c], len);
            off += len;
        }
        uint8_t header[HEADER_SIZE] = {0};
        uint32_t version = PACK_VERSION, flags = o->raw ? 1u : 0u;
        uint32_t nclasses = (uint32_t)fl->num_classes, ns = (uint32_t)nshards;
        uint64_t count = (uint64_t)fl->count, names_size = fl->names_size;
        uint64_t cs = classes_size;
        memcpy(header, PACK_MAGIC, 8);
        memcpy(header + 8, &version, 4);
        memcpy(header + 12, &flags, 4);
        memcpy(header + 16, &count, 8);
        memcpy(header + 24, &nclasses, 4);
        memcpy(header + 28, &ns, 4);
        memcpy(header + 32, &cs, 8);
        memcpy(header + 40, &names_size, 8);
        uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
        const void *parts[6] = {header, shard_sizes, rec, classes, fl->names, NULL};
        size_t sizes[6] = {HEADER_SIZE,  (size_t)nshards * 8, (size_t)fl->count * RECORD_SIZE,
                           classes_size, fl->names_size,      4};
        for (int i = 0; i < 5; i++)
            for (size_t o2 = 0; o2 < sizes[i];) {
                size_t n = sizes[i] - o2 > (1u << 30) ? (1u << 30) : sizes[i] - o2;
                crc = (uint32_t)crc32(crc, (const uint8_t *)parts[i] + o2, (uInt)n);
                o2 += n;
            }
        parts[5] = &crc;
        char index[4200];
        snprintf(index, sizeof index, "%s/index.bin", dst);
        rc = visc_write_file_atomic(index, parts, sizes, 6);
        free(classes);
    }
    free(items);
    free(rec);
    free(shard_sizes);
    return rc;
}

/* file_index.c: a cached folder scan.
 *
 * Listing ImageNet train (1,000 folders, 1.28M files) and sorting it takes
 * seconds on a warm disk and minutes on a cold network filesystem, at every
 * start. The scan is saved instead, in a cache folder (never inside the
 * data: it may be read-only, and writing there would change the very
 * folder mtime the cache is keyed by), and reused while it is provably
 * current: same real path and layout, and every folder that holds images
 * (plus the root) still has the recorded mtime. Creating, deleting or
 * renaming an entry updates its folder's mtime, so a changed tree misses.
 * The file is checksummed and parsed with every bound checked: a corrupt
 * or truncated cache is rebuilt, never trusted.
 *
 * Format (little-endian as the machine; the magic catches a foreign one):
 *   "VISCFIDX" u32 version u32 layout
 *   str root_realpath
 *   u32 ndirs, ndirs x (str rel_dir, i64 mtime_sec, i64 mtime_nsec)
 *   u32 nclasses, nclasses x str
 *   u64 count, count x (i32 label, str name)
 *   u32 crc32 of all the above
 * where str = u32 length + bytes (no NUL). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "visc/core.h"
#include "visc/io.h"
#include "visc/loader.h"

#define INDEX_MAGIC "VISCFIDX"
#define INDEX_VERSION 1u
#define MAX_STR 4096u

typedef struct {
    char *rel;
    int64_t sec, nsec;
} dir_stamp;

/* ---- writing ---- */

typedef struct {
    uint8_t *buf;
    size_t size, cap;
} wbuf;

static void put(wbuf *w, const void *p, size_t n) {
    if (w->size + n > w->cap) {
        while (w->size + n > w->cap) w->cap = w->cap ? 2 * w->cap : 65536;
        w->buf = visc_realloc(w->buf, w->cap, "file index");
    }
    memcpy(w->buf + w->size, p, n);
    w->size += n;
}
static void put_u32(wbuf *w, uint32_t v) { put(w, &v, 4); }
static void put_i64(wbuf *w, int64_t v) { put(w, &v, 8); }
static void put_str(wbuf *w, const char *s) {
    uint32_t n = (uint32_t)strlen(s);
    put_u32(w, n);
    put(w, s, n);
}

static int stamp_dir(const char *root, const char *rel, dir_stamp *d) {
    char path[4096];
    int n = rel[0] ? snprintf(path, sizeof path, "%s/%s", root, rel)
                   : snprintf(path, sizeof path, "%s", root);
    struct stat st;
    if (n < 0 || (size_t)n >= sizeof path || stat(path, &st) != 0) return -1;
    d->sec = (int64_t)st.st_mtim.tv_sec;
    d->nsec = (int64_t)st.st_mtim.tv_nsec;
    return 0;
}

/* The folders whose mtimes key the cache: the root and every folder part
 * of a file name (file names are sorted by folder, so one pass). */
static int collect_dirs(const visc_file_list *fl, dir_stamp **out, uint32_t *count) {
    size_t cap = 16, n = 0;
    dir_stamp *d = visc_malloc(cap * sizeof *d, "index folders");
    d[n].rel = visc_strdup("");
    n++;
    const char *prev = NULL;
    size_t prev_len = 0;
    for (int64_t i = 0; i < fl->count; i++) {
        const char *name = visc_file_list_name(fl, i);
        const char *slash = strrchr(name, '/');
        if (!slash) continue;
        size_t len = (size_t)(slash - name);
        if (prev && len == prev_len && memcmp(prev, name, len) == 0) continue;
        prev = name;
        prev_len = len;
        if (n == cap) d = visc_realloc(d, (cap *= 2) * sizeof *d, "index folders");
        d[n].rel = visc_malloc(len + 1, "index folder");
        memcpy(d[n].rel, name, len);
        d[n].rel[len] = 0;
        n++;
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        if (stamp_dir(fl->root, d[i].rel, &d[i]) != 0) rc = -1;
    *out = d;
    *count = (uint32_t)n;
    return rc;
}

static void free_dirs(dir_stamp *d, uint32_t n) {
    for (uint32_t i = 0; d && i < n; i++) free(d[i].rel);
    free(d);
}

static void encode(const visc_file_list *fl, visc_layout layout, const char *real,
                   const dir_stamp *dirs, uint32_t ndirs, wbuf *w) {
    put(w, INDEX_MAGIC, 8);
    put_u32(w, INDEX_VERSION);
    put_u32(w, (uint32_t)layout);
    put_str(w, real);
    put_u32(w, ndirs);
    for (uint32_t i = 0; i < ndirs; i++) {
        put_str(w, dirs[i].rel);
        put_i64(w, dirs[i].sec);
        put_i64(w, dirs[i].nsec);
    }
    put_u32(w, (uint32_t)fl->num_classes);
    for (int c = 0; c < fl->num_classes; c++) put_str(w, fl->class_names[c]);
    uint64_t count = (uint64_t)fl->count;
    put(w, &count, 8);
    for (int64_t i = 0; i < fl->count; i++) {
        put(w, &fl->labels[i], 4);
        put_str(w, visc_file_list_name(fl, i));
    }
    uint32_t crc = visc_crc32(w->buf, w->size);
    put_u32(w, crc);
}

int visc_file_index_encode(const visc_file_list *fl, visc_layout layout, uint8_t **out,
                           size_t *size) {
    dir_stamp root = {.rel = (char *)"", .sec = 0, .nsec = 0};
    wbuf w = {0};
    encode(fl, layout, fl->root, &root, 1, &w);
    *out = w.buf;
    *size = w.size;
    return 0;
}

/* ---- reading: every length checked against what is left ---- */

typedef struct {
    const uint8_t *p;
    size_t left;
} rbuf;

static int get(rbuf *r, void *dst, size_t n) {
    if (r->left < n) return -1;
    memcpy(dst, r->p, n);
    r->p += n;
    r->left -= n;
    return 0;
}

/* A string of at most MAX_STR bytes without NUL, copied out. */
static char *get_str(rbuf *r) {
    uint32_t n;
    if (get(r, &n, 4) || n > MAX_STR || n > r->left || memchr(r->p, 0, n)) return NULL;
    char *s = visc_malloc((size_t)n + 1, "index string");
    memcpy(s, r->p, n);
    s[n] = 0;
    r->p += n;
    r->left -= n;
    return s;
}

static int decode(visc_file_list *fl, const uint8_t *buf, size_t size, visc_layout *layout,
                  char **real, dir_stamp **dirs, uint32_t *ndirs) {
    memset(fl, 0, sizeof *fl);
    *real = NULL;
    *dirs = NULL;
    *ndirs = 0;
    if (size < 8 + 8 + 4 || memcmp(buf, INDEX_MAGIC, 8) != 0)
        return visc_set_error("file index: bad magic");
    uint32_t want_crc;
    memcpy(&want_crc, buf + size - 4, 4);
    if (visc_crc32(buf, size - 4) != want_crc)
        return visc_set_error("file index: checksum mismatch");
    rbuf r = {buf + 8, size - 8 - 4};
    uint32_t version, lay, nclasses;
    uint64_t count;
    if (get(&r, &version, 4) || version != INDEX_VERSION)
        return visc_set_error("file index: unsupported version");
    if (get(&r, &lay, 4) || (lay != VISC_LAYOUT_IMAGEFOLDER && lay != VISC_LAYOUT_FLAT))
        return visc_set_error("file index: bad layout");
    *layout = (visc_layout)lay;
    if (!(*real = get_str(&r))) goto truncated;
    if (get(&r, ndirs, 4) || *ndirs > r.left / 20) goto truncated;
    *dirs = visc_calloc(*ndirs ? *ndirs : 1, sizeof **dirs, "index folders");
    for (uint32_t i = 0; i < *ndirs; i++) {
        if (!((*dirs)[i].rel = get_str(&r))) goto truncated;
        if (get(&r, &(*dirs)[i].sec, 8) || get(&r, &(*dirs)[i].nsec, 8)) goto truncated;
    }
    if (get(&r, &nclasses, 4) || nclasses == 0 || nclasses > INT32_MAX || nclasses > r.left / 4)
        goto truncated;
    fl->class_names = visc_calloc(nclasses, sizeof *fl->class_names, "class names");
    fl->num_classes = (int)nclasses;
    for (uint32_t c = 0; c < nclasses; c++)
        if (!(fl->class_names[c] = get_str(&r))) goto truncated;
    if (get(&r, &count, 8) || count > r.left / 8) goto truncated;
    fl->name_off = visc_malloc((count ? count : 1) * sizeof *fl->name_off, "file list");
    fl->labels = visc_malloc((count ? count : 1) * sizeof *fl->labels, "file labels");
    /* names need at most what is left of the buffer plus one NUL each */
    fl->names = visc_malloc(r.left + count + 1, "file names");
    for (uint64_t i = 0; i < count; i++) {
        int32_t label;
        uint32_t n;
        if (get(&r, &label, 4) || label < 0 || label >= (int32_t)nclasses) goto truncated;
        if (get(&r, &n, 4) || n == 0 || n > MAX_STR || n > r.left || memchr(r.p, 0, n))
            goto truncated;
        fl->labels[i] = label;
        fl->name_off[i] = (int64_t)fl->names_size;
        memcpy(fl->names + fl->names_size, r.p, n);
        fl->names[fl->names_size + n] = 0;
        fl->names_size += (size_t)n + 1;
        r.p += n;
        r.left -= n;
        fl->count = (int64_t)i + 1;
    }
    if (r.left != 0) goto truncated;
    return 0;
truncated:
    visc_set_error("file index: truncated or malformed");
    return -1;
}

int visc_file_index_decode(visc_file_list *fl, const uint8_t *buf, size_t size,
                           visc_layout *layout) {
    char *real;
    dir_stamp *dirs;
    uint32_t ndirs;
    int rc = decode(fl, buf, size, layout, &real, &dirs, &ndirs);
    if (rc == 0) fl->root = real;
    else {
        free(real);
        visc_file_list_free(fl);
    }
    free_dirs(dirs, ndirs);
    return rc;
}

/* ---- the cache ---- */

static int cache_path(const char *real, visc_layout layout, char *out, size_t size) {
    const char *dir = getenv("VISC_CACHE_DIR");
    char base[4096];
    if (dir && dir[0]) snprintf(base, sizeof base, "%s", dir);
    else if ((dir = getenv("XDG_CACHE_HOME")) && dir[0])
        snprintf(base, sizeof base, "%s/visc", dir);
    else if ((dir = getenv("HOME")) && dir[0]) snprintf(base, sizeof base, "%s/.cache/visc", dir);
    else return -1;
    uint64_t h = 1469598103934665603ull; /* FNV-1a of layout and path */
    h = (h ^ (uint64_t)layout) * 1099511628211ull;
    for (const char *s = real; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    int n = snprintf(out, size, "%s/index-%016llx.bin", base, (unsigned long long)h);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

static int read_whole(const char *path, uint8_t **buf, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int rc = -1;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0) {
            *buf = visc_malloc((size_t)n, "file index");
            if (fread(*buf, 1, (size_t)n, f) == (size_t)n) {
                *size = (size_t)n;
                rc = 0;
            } else {
                free(*buf);
                *buf = NULL;
            }
        }
    }
    fclose(f);
    return rc;
}

/* The cached list if it matches real/layout and every folder stamp. */
static int try_cache(visc_file_list *fl, const char *cpath, const char *real, visc_layout layout) {
    uint8_t *buf = NULL;
    size_t size = 0;
    if (read_whole(cpath, &buf, &size)) return -1;
    visc_layout got;
    char *stored = NULL;
    dir_stamp *dirs = NULL;
    uint32_t ndirs = 0;
    int ok = decode(fl, buf, size, &got, &stored, &dirs, &ndirs) == 0 && got == layout &&
             strcmp(stored, real) == 0;
    for (uint32_t i = 0; ok && i < ndirs; i++) {
        dir_stamp now;
        ok = stamp_dir(real, dirs[i].rel, &now) == 0 && now.sec == dirs[i].sec &&
             now.nsec == dirs[i].nsec;
    }
    free(buf);
    free(stored);
    free_dirs(dirs, ndirs);
    if (!ok) visc_file_list_free(fl);
    return ok ? 0 : -1;
}

int visc_file_index_load(visc_file_list *fl, const char *root, visc_layout layout, int *reused) {
    if (reused) *reused = 0;
    char real[PATH_MAX], cpath[4096];
    if (!realpath(root, real)) return visc_set_error("cannot open '%s': %s", root, strerror(errno));
    int have_cache = cache_path(real, layout, cpath, sizeof cpath) == 0;
    if (have_cache && try_cache(fl, cpath, real, layout) == 0) {
        free(fl->root); /* report paths under the name the caller used */
        fl->root = visc_strdup(root);
        size_t n = strlen(fl->root);
        while (n > 1 && fl->root[n - 1] == '/') fl->root[--n] = 0;
        if (reused) *reused = 1;
        return 0;
    }
    /* Stamp before scanning: a change during the scan then makes the next
     * start rescan rather than trust a list that may have missed it. */
    dir_stamp root_before;
    if (stamp_dir(real, "", &root_before)) return visc_set_error("cannot stat '%s'", root);
    int rc =
        layout == VISC_LAYOUT_FLAT ? visc_scan_flat(fl, root) : visc_scan_imagefolder(fl, root);
    if (rc) return rc;
    if (!have_cache) return 0;
    dir_stamp *dirs = NULL;
    uint32_t ndirs = 0;
    char *given = fl->root;
    fl->root = real;
    int stamped = collect_dirs(fl, &dirs, &ndirs);
    fl->root = given;
    if (stamped == 0 && (dirs[0].sec != root_before.sec || dirs[0].nsec != root_before.nsec))
        stamped = -1; /* the root changed while scanning: do not cache */
    if (stamped == 0) {
        wbuf w = {0};
        encode(fl, layout, real, dirs, ndirs, &w);
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", cpath);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        const void *parts[1] = {w.buf};
        size_t sizes[1] = {w.size};
        /* a cache that cannot be written costs a rescan next time, nothing more */
        if (visc_mkdirs(dir) != 0 || visc_write_file_atomic(cpath, parts, sizes, 1) != 0) {
            fprintf(stderr, "visc: note: index cache not written: %s\n", visc_last_error());
        }
        free(w.buf);
    }
    free_dirs(dirs, ndirs);
    return 0;
}

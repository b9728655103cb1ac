/* safetensors.c: the Hugging Face safetensors format, read and written.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *    "__metadata__": {"key": "value"}}
 * (space-padded), then the data section; offsets are relative to it.
 *
 * The reader maps the file read-only and trusts nothing: a checkpoint may be
 * truncated or come from anywhere, so every length, offset and product is
 * checked for overflow before it is used, and a malformed file is an error
 * message, never a crash. The writer produces what the Python library
 * accepts (and torch.load_state_dict after it): header padded to 8 bytes so
 * the data section is aligned, saved atomically. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "visc/io.h"
#include "visc/json.h"

static const char *const dtype_names[] = {"F32", "F16", "BF16", "F64", "I64", "I32", "U8", "BOOL"};
static const size_t dtype_sizes[] = {4, 2, 2, 8, 8, 4, 1, 1};
#define NUM_DTYPES ((int)(sizeof dtype_names / sizeof dtype_names[0]))

size_t visc_dtype_size(visc_dtype t) {
    VISC_ASSERT((int)t >= 0 && (int)t < NUM_DTYPES);
    return dtype_sizes[t];
}

const char *visc_dtype_name(visc_dtype t) {
    VISC_ASSERT((int)t >= 0 && (int)t < NUM_DTYPES);
    return dtype_names[t];
}

/* ---------------------------------------------------------------- reader */

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const visc_st_tensor *)a)->name, ((const visc_st_tensor *)b)->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_by_offset(const void *a, const void *b) {
    const visc_st_tensor *x = *(const visc_st_tensor *const *)a,
                         *y = *(const visc_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static void format_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Fills t from one header entry; the error names the tensor. */
static int parse_tensor(const visc_safetensors *st, visc_st_tensor *t, const char *name,
                        const visc_json *v) {
    const char *src = st->source;
    if (strlen(name) >= VISC_MAX_NAME)
        return visc_set_error("%s: tensor name '%.40s...' is longer than %d bytes", src, name,
                              VISC_MAX_NAME - 1);
    if (!name[0]) return visc_set_error("%s: tensor with an empty name", src);
    strcpy(t->name, name);
    if (v->type != VISC_JSON_OBJECT)
        return visc_set_error("%s: tensor '%s': entry is not an object", src, name);

    const visc_json *dt = visc_json_get(v, "dtype");
    if (!dt || dt->type != VISC_JSON_STRING)
        return visc_set_error("%s: tensor '%s': missing string \"dtype\"", src, name);
    int d = 0;
    while (d < NUM_DTYPES && strcmp(dt->str, dtype_names[d]) != 0) d++;
    if (d == NUM_DTYPES)
        return visc_set_error("%s: tensor '%s': unknown dtype '%.32s'", src, name, dt->str);
    t->dtype = (visc_dtype)d;

    const visc_json *sh = visc_json_get(v, "shape");
    if (!sh || sh->type != VISC_JSON_ARRAY)
        return visc_set_error("%s: tensor '%s': missing array \"shape\"", src, name);
    if (sh->count > VISC_ST_MAX_DIMS)
        return visc_set_error("%s: tensor '%s': %d dimensions (at most %d supported)", src, name,
                              sh->count, VISC_ST_MAX_DIMS);
    t->ndim = sh->count;
    size_t numel = 1;
    int overflow = 0;
    for (int i = 0; i < sh->count; i++) {
        int64_t x;
        if (visc_json_int(&sh->items[i], &x) != 0 || x < 0)
            return visc_set_error("%s: tensor '%s': shape[%d] is not a non-negative integer", src,
                                  name, i);
        t->shape[i] = x;
        /* Keep multiplying after an overflow only to notice a zero dimension. */
        if (x == 0) numel = 0, overflow = 0;
        else if (numel != 0 && (overflow || numel > SIZE_MAX / (uint64_t)x)) overflow = 1;
        else numel *= (size_t)x;
    }
    size_t esize = dtype_sizes[d];
    if (overflow || numel > SIZE_MAX / esize)
        return visc_set_error("%s: tensor '%s': shape is too large", src, name);
    t->numel = numel;

    const visc_json *off = visc_json_get(v, "data_offsets");
    int64_t b, e;
    if (!off || off->type != VISC_JSON_ARRAY || off->count != 2 ||
        visc_json_int(&off->items[0], &b) != 0 || visc_json_int(&off->items[1], &e) != 0)
        return visc_set_error("%s: tensor '%s': \"data_offsets\" must be [begin, end]", src, name);
    if (b < 0 || e < b || (uint64_t)e > st->data_size)
        return visc_set_error("%s: tensor '%s': data_offsets [%lld, %lld] outside the data "
                              "section of %zu bytes",
                              src, name, (long long)b, (long long)e, st->data_size);
    t->begin = (size_t)b;
    t->end = (size_t)e;
    if (t->end - t->begin != numel * esize) {
        char shape[160];
        format_shape(shape, sizeof shape, t->ndim, t->shape);
        return visc_set_error("%s: tensor '%s': %s %s needs %zu bytes but data_offsets span %zu",
                              src, name, dt->str, shape, numel * esize, t->end - t->begin);
    }
    return 0;
}

static int parse_metadata(visc_safetensors *st, const visc_json *m) {
    if (m->type != VISC_JSON_OBJECT)
        return visc_set_error("%s: \"__metadata__\" is not an object", st->source);
    st->meta_keys = visc_calloc((size_t)m->count + 1, sizeof(char *), "safetensors metadata");
    st->meta_values = visc_calloc((size_t)m->count + 1, sizeof(char *), "safetensors metadata");
    for (int i = 0; i < m->count; i++) {
        if (m->items[i].type != VISC_JSON_STRING)
            return visc_set_error("%s: metadata '%.64s' is not a string", st->source, m->keys[i]);
        st->meta_keys[i] = visc_strdup(m->keys[i]);
        st->meta_values[i] = visc_strdup(m->items[i].str);
        st->meta_count = i + 1;
    }
    /* Duplicates: sort a copy of the key pointers (a header may hold many). */
    char **sorted = visc_malloc((size_t)m->count * sizeof *sorted + 1, "metadata keys");
    memcpy(sorted, st->meta_keys, (size_t)m->count * sizeof *sorted);
    qsort(sorted, (size_t)m->count, sizeof *sorted, cmp_str_ptr);
    int rc = 0;
    for (int i = 1; i < m->count && rc == 0; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0)
            rc = visc_set_error("%s: duplicate metadata key '%.64s'", st->source, sorted[i]);
    free(sorted);
    return rc;
}

static int parse_header(visc_safetensors *st, const visc_json *root) {
    if (root->type != VISC_JSON_OBJECT)
        return visc_set_error("%s: header is not a JSON object", st->source);
    st->tensors = visc_calloc((size_t)root->count + 1, sizeof *st->tensors, "safetensors index");
    int seen_meta = 0;
    for (int i = 0; i < root->count; i++) {
        if (strcmp(root->keys[i], "__metadata__") == 0) {
            if (seen_meta++) return visc_set_error("%s: duplicate \"__metadata__\"", st->source);
            if (parse_metadata(st, &root->items[i])) return -1;
            continue;
        }
        if (parse_tensor(st, &st->tensors[st->count], root->keys[i], &root->items[i])) return -1;
        st->count++;
    }
    qsort(st->tensors, (size_t)st->count, sizeof *st->tensors, cmp_by_name);
    for (int i = 1; i < st->count; i++)
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
            return visc_set_error("%s: duplicate tensor name '%s'", st->source,
                                  st->tensors[i].name);

    /* Overlap: sort (non-empty) ranges by start; each must begin at or after
     * the previous end. Empty tensors own no bytes and cannot overlap. */
    const visc_st_tensor **order =
        visc_malloc((size_t)st->count * sizeof *order + 1, "safetensors order");
    int n = 0;
    for (int i = 0; i < st->count; i++)
        if (st->tensors[i].end > st->tensors[i].begin) order[n++] = &st->tensors[i];
    qsort(order, (size_t)n, sizeof *order, cmp_by_offset);
    int rc = 0;
    for (int i = 1; i < n && rc == 0; i++)
        if (order[i]->begin < order[i - 1]->end)
            rc = visc_set_error("%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap",
                                st->source, order[i - 1]->name, order[i - 1]->begin,
                                order[i - 1]->end, order[i]->name, order[i]->begin, order[i]->end);
    free(order);
    return rc;
}

static int parse_image(visc_safetensors *st, const uint8_t *buf, size_t size) {
    if (size < 8)
        return visc_set_error("%s: %zu bytes is too short for a safetensors file", st->source,
                              size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    if (n > size - 8)
        return visc_set_error("%s: header length %llu exceeds the file size %zu", st->source,
                              (unsigned long long)n, size);
    if (n < 2 || buf[8] != '{')
        return visc_set_error("%s: header does not start with '{' (not a safetensors file?)",
                              st->source);
    st->data = buf + 8 + n;
    st->data_size = size - 8 - (size_t)n;
    visc_json root;
    if (visc_json_parse(&root, (const char *)buf + 8, (size_t)n) != 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", visc_last_error());
        return visc_set_error("%s: header: %s", st->source, msg);
    }
    int rc = parse_header(st, &root);
    visc_json_free(&root);
    return rc;
}

/* Frees everything but leaves source, so open() can still name the file. */
static void release(visc_safetensors *st) {
    for (int i = 0; i < st->meta_count; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    free(st->tensors);
    if (st->mapping) munmap(st->mapping, st->mapping_size);
    char *source = st->source;
    memset(st, 0, sizeof *st);
    st->source = source;
}

int visc_safetensors_parse(visc_safetensors *st, const uint8_t *buf, size_t size) {
    memset(st, 0, sizeof *st);
    st->source = visc_strdup("<memory>");
    if (parse_image(st, buf, size) != 0) {
        visc_safetensors_close(st);
        return -1;
    }
    return 0;
}

int visc_safetensors_open(visc_safetensors *st, const char *path) {
    memset(st, 0, sizeof *st);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return visc_set_error("cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int err = errno;
        close(fd);
        return visc_set_error("cannot read '%s': %s", path, strerror(err));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return visc_set_error("cannot read '%s': not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return visc_set_error("%s: %zu bytes is too short for a safetensors file", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) return visc_set_error("cannot map '%s': %s", path, strerror(err));
    st->source = visc_strdup(path);
    st->mapping = map;
    st->mapping_size = size;
    if (parse_image(st, map, size) != 0) {
        visc_safetensors_close(st);
        return -1;
    }
    return 0;
}

void visc_safetensors_close(visc_safetensors *st) {
    release(st);
    free(st->source);
    st->source = NULL;
}

const visc_st_tensor *visc_safetensors_find(const visc_safetensors *st, const char *name) {
    int lo = 0, hi = st->count - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

const char *visc_safetensors_meta(const visc_safetensors *st, const char *key) {
    for (int i = 0; i < st->meta_count; i++)
        if (strcmp(st->meta_keys[i], key) == 0) return st->meta_values[i];
    return NULL;
}

/* IEEE half to float, including subnormals, infinities and NaN. */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0x1F) bits = sign | 0x7F800000u | (mant << 13);
    else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13);
    else if (mant == 0) bits = sign;
    else { /* subnormal: normalize */ exp = 113;
        while (!(mant & 0x400)) mant <<= 1, exp--;
        bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The data section need not be aligned (the header length is arbitrary),
 * so every element is fetched with memcpy, which compiles to a plain load. */
static void convert(const visc_st_tensor *t, const uint8_t *src, float *dst) {
    size_t n = t->numel;
    switch (t->dtype) {
    case VISC_DTYPE_F32: memcpy(dst, src, n * 4); break;
    case VISC_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = half_to_float(h);
        }
        break;
    case VISC_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
        break;
    case VISC_DTYPE_F64:
        for (size_t i = 0; i < n; i++) {
            double x;
            memcpy(&x, src + 8 * i, 8);
            dst[i] = (float)x;
        }
        break;
    case VISC_DTYPE_I64:
        for (size_t i = 0; i < n; i++) {
            int64_t x;
            memcpy(&x, src + 8 * i, 8);
            dst[i] = (float)x;
        }
        break;
    case VISC_DTYPE_I32:
        for (size_t i = 0; i < n; i++) {
            int32_t x;
            memcpy(&x, src + 4 * i, 4);
            dst[i] = (float)x;
        }
        break;
    case VISC_DTYPE_U8:
        for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
        break;
    case VISC_DTYPE_BOOL:
        for (size_t i = 0; i < n; i++) dst[i] = src[i] ? 1.0f : 0.0f;
        break;
    }
}

static const visc_st_tensor *find_or_fail(const visc_safetensors *st, const char *name) {
    const visc_st_tensor *t = visc_safetensors_find(st, name);
    if (!t)
        visc_set_error("no tensor named '%s' in %s", name, st->source ? st->source : "<closed>");
    return t;
}

int visc_safetensors_read_f32(const visc_safetensors *st, const char *name, float *dst,
                              size_t numel) {
    const visc_st_tensor *t = find_or_fail(st, name);
    if (!t) return -1;
    if (t->numel != numel) {
        char shape[160];
        format_shape(shape, sizeof shape, t->ndim, t->shape);
        return visc_set_error("tensor '%s' in %s has shape %s (%zu elements), expected %zu "
                              "elements",
                              name, st->source, shape, t->numel, numel);
    }
    convert(t, st->data + t->begin, dst);
    return 0;
}

int visc_safetensors_read_f32_shaped(const visc_safetensors *st, const char *name, float *dst,
                                     int ndim, const int64_t *shape) {
    const visc_st_tensor *t = find_or_fail(st, name);
    if (!t) return -1;
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char got[160], want[160];
        format_shape(got, sizeof got, t->ndim, t->shape);
        format_shape(want, sizeof want, ndim, shape);
        return visc_set_error("tensor '%s' in %s has shape %s, expected %s", name, st->source, got,
                              want);
    }
    convert(t, st->data + t->begin, dst);
    return 0;
}

/* ---------------------------------------------------------------- writer */

typedef struct {
    char name[VISC_MAX_NAME];
    visc_dtype dtype;
    int ndim;
    int64_t shape[VISC_ST_MAX_DIMS];
    size_t bytes;
    void *data;
} writer_entry;

struct visc_st_writer {
    writer_entry *entries;
    int count, capacity;
    char **meta_keys, **meta_values;
    int meta_count;
};

visc_st_writer *visc_st_writer_new(void) {
    return visc_calloc(1, sizeof(visc_st_writer), "safetensors writer");
}

void visc_st_writer_add(visc_st_writer *w, const char *name, visc_dtype dtype, int ndim,
                        const int64_t *shape, const void *data) {
    VISC_ASSERT(strlen(name) > 0 && strlen(name) < VISC_MAX_NAME);
    VISC_ASSERT(strcmp(name, "__metadata__") != 0);
    VISC_ASSERT(ndim >= 0 && ndim <= VISC_ST_MAX_DIMS);
    VISC_ASSERT((int)dtype >= 0 && (int)dtype < NUM_DTYPES);
    for (int i = 0; i < w->count; i++) VISC_ASSERT(strcmp(w->entries[i].name, name) != 0);
    if (w->count == w->capacity) {
        w->capacity = w->capacity ? 2 * w->capacity : 32;
        w->entries = visc_realloc(w->entries, (size_t)w->capacity * sizeof *w->entries,
                                  "safetensors writer");
    }
    writer_entry *e = &w->entries[w->count++];
    memset(e, 0, sizeof *e);
    strcpy(e->name, name);
    e->dtype = dtype;
    e->ndim = ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        VISC_ASSERT(shape[i] >= 0);
        e->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    e->bytes = numel * dtype_sizes[dtype];
    e->data = visc_malloc(e->bytes, "safetensors tensor copy");
    if (e->bytes) memcpy(e->data, data, e->bytes);
}

void visc_st_writer_add_table(visc_st_writer *w, const visc_table *t, const char *prefix) {
    VISC_ASSERT(t->data != NULL);
    if (!prefix) prefix = "";
    for (int i = 0; i < t->count; i++) {
        const visc_tensor_entry *e = &t->entries[i];
        char name[VISC_MAX_NAME];
        int k = snprintf(name, sizeof name, "%s%s", prefix, e->name);
        VISC_ASSERT(k > 0 && k < VISC_MAX_NAME);
        visc_st_writer_add(w, name, VISC_DTYPE_F32, e->ndim, e->shape, visc_table_get(t, i));
    }
}

void visc_st_writer_meta(visc_st_writer *w, const char *key, const char *value) {
    for (int i = 0; i < w->meta_count; i++)
        if (strcmp(w->meta_keys[i], key) == 0) {
            free(w->meta_values[i]);
            w->meta_values[i] = visc_strdup(value);
            return;
        }
    w->meta_keys =
        visc_realloc(w->meta_keys, (size_t)(w->meta_count + 1) * sizeof(char *), "metadata");
    w->meta_values =
        visc_realloc(w->meta_values, (size_t)(w->meta_count + 1) * sizeof(char *), "metadata");
    w->meta_keys[w->meta_count] = visc_strdup(key);
    w->meta_values[w->meta_count] = visc_strdup(value);
    w->meta_count++;
}

/* A growing byte buffer for the JSON header. */
typedef struct {
    char *p;
    size_t len, cap;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        while (b->len + n + 1 > b->cap) b->cap = b->cap ? 2 * b->cap : 1024;
        b->p = visc_realloc(b->p, b->cap, "safetensors header");
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    VISC_ASSERT(n >= 0 && (size_t)n < sizeof tmp);
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal; bytes >= 0x80 pass through (UTF-8 is the caller's). */
static void sb_json_string(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\u%04x", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const writer_entry *)a)->name, ((const writer_entry *)b)->name);
}

int visc_st_writer_save(visc_st_writer *w, const char *path) {
    qsort(w->entries, (size_t)w->count, sizeof *w->entries, cmp_entry);
    strbuf h = {0};
    sb_put(&h, "{", 1);
    if (w->meta_count) {
        sb_put(&h, "\"__metadata__\":{", 16);
        for (int i = 0; i < w->meta_count; i++) {
            if (i) sb_put(&h, ",", 1);
            sb_json_string(&h, w->meta_keys[i]);
            sb_put(&h, ":", 1);
            sb_json_string(&h, w->meta_values[i]);
        }
        sb_put(&h, "}", 1);
    }
    size_t offset = 0;
    for (int i = 0; i < w->count; i++) {
        const writer_entry *e = &w->entries[i];
        if (i || w->meta_count) sb_put(&h, ",", 1);
        sb_json_string(&h, e->name);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", dtype_names[e->dtype]);
        for (int d = 0; d < e->ndim; d++)
            sb_printf(&h, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        sb_printf(&h, "],\"data_offsets\":[%zu,%zu]}", offset, offset + e->bytes);
        offset += e->bytes;
    }
    sb_put(&h, "}", 1);
    while (h.len % 8) sb_put(&h, " ", 1); /* 8 + N divisible by 8: aligned data */

    uint8_t len_bytes[8];
    for (int i = 0; i < 8; i++) len_bytes[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    int nparts = 2 + w->count;
    const void **parts = visc_malloc((size_t)nparts * sizeof *parts, "safetensors parts");
    size_t *sizes = visc_malloc((size_t)nparts * sizeof *sizes, "safetensors parts");
    parts[0] = len_bytes, sizes[0] = 8;
    parts[1] = h.p, sizes[1] = h.len;
    for (int i = 0; i < w->count; i++)
        parts[2 + i] = w->entries[i].data, sizes[2 + i] = w->entries[i].bytes;
    int rc = visc_write_file_atomic(path, (const void *const *)parts, sizes, nparts);
    free(parts);
    free(sizes);
    free(h.p);
    return rc;
}

void visc_st_writer_free(visc_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->count; i++) free(w->entries[i].data);
    for (int i = 0; i < w->meta_count; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->entries);
    free(w->meta_keys);
    free(w->meta_values);
    free(w);
}

/* tensorboard.c: scalar logs that TensorBoard reads, without TensorFlow.
 *
 * An event file is a sequence of TFRecords:
 *   u64 length (LE) | u32 masked CRC32C(length bytes) | data | u32 masked CRC32C(data)
 * with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. Each record's
 * data is a serialized tensorflow.Event protobuf, which we encode by hand:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
 *             Summary summary = 5; }
 *   Summary { repeated Value value = 1; }
 *   Value   { string tag = 1; float simple_value = 2; }
 * The first record carries file_version "brain.Event:2". The reader walks the
 * same structure with every length checked, skipping fields it does not
 * know, so it accepts files from TensorFlow as well and survives garbage. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "visc/io.h"

/* ---------------------------------------------------------------- CRC32C */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
        crc_table[i] = c;
    }
}

uint32_t visc_crc32c(uint32_t crc, const void *data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t c = visc_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---------------------------------------------------------------- writer */

#define MAX_TAG 1024 /* keeps every event well inside the writer's buffer */

struct visc_tb_writer {
    FILE *f;
    char *path;
};

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

static int write_record(visc_tb_writer *w, const uint8_t *data, size_t n) {
    uint8_t head[12], tail[4];
    put_le(head, n, 8);
    put_le(head + 8, masked_crc(head, 8), 4);
    put_le(tail, masked_crc(data, n), 4);
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(data, 1, n, w->f) != n ||
        fwrite(tail, 1, 4, w->f) != 4)
        return visc_set_error("cannot write '%s': %s", w->path, strerror(errno));
    return 0;
}

/* Event header shared by every record: wall_time (field 1, fixed64). */
static size_t put_wall_time(uint8_t *p) {
    double t = wall_time();
    uint64_t bits;
    memcpy(&bits, &t, 8);
    p[0] = (1 << 3) | 1;
    put_le(p + 1, bits, 8);
    return 9;
}

visc_tb_writer *visc_tb_open(const char *logdir) {
    if (visc_mkdirs(logdir) != 0) return NULL;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    size_t n = strlen(logdir) + strlen(host) + 96;
    char *path = visc_malloc(n, "event file name");
    long secs = (long)wall_time();
    FILE *f = NULL;
    /* "x": never append to (or clobber) another writer's file. */
    for (int attempt = 0; attempt < 100 && !f; attempt++) {
        if (attempt == 0)
            snprintf(path, n, "%s/events.out.tfevents.%ld.%s.%ld.v2", logdir, secs, host,
                     (long)getpid());
        else
            snprintf(path, n, "%s/events.out.tfevents.%ld.%s.%ld.%d.v2", logdir, secs, host,
                     (long)getpid(), attempt);
        f = fopen(path, "wbx");
        if (!f && errno != EEXIST) break;
    }
    if (!f) {
        visc_set_error("cannot create event file '%s': %s", path, strerror(errno));
        free(path);
        return NULL;
    }
    visc_tb_writer *w = visc_calloc(1, sizeof *w, "TensorBoard writer");
    w->f = f;
    w->path = path;
    uint8_t ev[64];
    size_t k = put_wall_time(ev);
    static const char version[] = "brain.Event:2";
    ev[k++] = (3 << 3) | 2;
    ev[k++] = (uint8_t)(sizeof version - 1);
    memcpy(ev + k, version, sizeof version - 1);
    k += sizeof version - 1;
    if (write_record(w, ev, k) != 0 || fflush(f) != 0) {
        visc_set_error("cannot write '%s': %s", path, strerror(errno));
        fclose(f);
        free(path);
        free(w);
        return NULL;
    }
    return w;
}

const char *visc_tb_path(const visc_tb_writer *w) { return w->path; }

int visc_tb_scalar(visc_tb_writer *w, const char *tag, int64_t step, float value) {
    size_t tag_len = strlen(tag);
    if (tag_len == 0 || tag_len > MAX_TAG)
        return visc_set_error("TensorBoard tag '%.40s' must have 1 to %d bytes", tag, MAX_TAG);
    /* Inner to outer: Value, the Summary holding it, the Event holding that. */
    uint8_t val[MAX_TAG + 16], sum[MAX_TAG + 32], ev[MAX_TAG + 64];
    size_t nv = 0, ns = 0, ne = 0;
    val[nv++] = (1 << 3) | 2; /* tag */
    nv += put_varint(val + nv, tag_len);
    memcpy(val + nv, tag, tag_len);
    nv += tag_len;
    val[nv++] = (2 << 3) | 5; /* simple_value, fixed32 */
    uint32_t bits;
    memcpy(&bits, &value, 4);
    put_le(val + nv, bits, 4);
    nv += 4;

    sum[ns++] = (1 << 3) | 2; /* value */
    ns += put_varint(sum + ns, nv);
    memcpy(sum + ns, val, nv);
    ns += nv;

    ne = put_wall_time(ev);
    ev[ne++] = 2 << 3; /* step: int64 varint (negative steps take 10 bytes) */
    ne += put_varint(ev + ne, (uint64_t)step);
    ev[ne++] = (5 << 3) | 2; /* summary */
    ne += put_varint(ev + ne, ns);
    memcpy(ev + ne, sum, ns);
    ne += ns;
    return write_record(w, ev, ne);
}

void visc_tb_flush(visc_tb_writer *w) {
    if (w) fflush(w->f);
}

void visc_tb_close(visc_tb_writer *w) {
    if (!w) return;
    fclose(w->f);
    free(w->path);
    free(w);
}

/* ---------------------------------------------------------------- reader */

typedef struct {
    const uint8_t *p, *end;
} cursor;

static int get_varint(cursor *c, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (c->p >= c->end) return -1;
        uint8_t b = *c->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1; /* more than 10 bytes */
}

/* One protobuf field: its number, wire type, and either an integer (varint,
 * fixed32, fixed64) or a byte range (length-delimited). */
typedef struct {
    uint32_t number, wire;
    uint64_t u;
    cursor bytes;
} field;

static int next_field(cursor *c, field *f) {
    memset(f, 0, sizeof *f);
    uint64_t key;
    if (get_varint(c, &key) != 0 || key >> 32) return -1;
    f->number = (uint32_t)(key >> 3);
    f->wire = (uint32_t)(key & 7);
    if (f->number == 0) return -1;
    switch (f->wire) {
    case 0: return get_varint(c, &f->u);
    case 1:
        if (c->end - c->p < 8) return -1;
        f->u = get_le(c->p, 8);
        c->p += 8;
        return 0;
    case 5:
        if (c->end - c->p < 4) return -1;
        f->u = get_le(c->p, 4);
        c->p += 4;
        return 0;
    case 2: {
        uint64_t n;
        if (get_varint(c, &n) != 0 || n > (uint64_t)(c->end - c->p)) return -1;
        f->bytes.p = c->p;
        f->bytes.end = c->p + n;
        c->p += n;
        return 0;
    }
    default: return -1; /* groups (3, 4) are obsolete; 6, 7 do not exist */
    }
}

/* Summary.Value: reports it when it holds a simple_value. */
static int parse_value(cursor c, int64_t step, visc_tb_scalar_fn fn, void *ctx) {
    char tag[MAX_TAG + 1];
    int has_tag = 0, has_value = 0;
    float value = 0;
    field f;
    while (c.p < c.end) {
        if (next_field(&c, &f) != 0) return -1;
        if (f.number == 1 && f.wire == 2) {
            size_t n = (size_t)(f.bytes.end - f.bytes.p);
            if (n > MAX_TAG || memchr(f.bytes.p, 0, n)) return -1;
            memcpy(tag, f.bytes.p, n);
            tag[n] = 0;
            has_tag = 1;
        } else if (f.number == 2 && f.wire == 5) {
            uint32_t bits = (uint32_t)f.u;
            memcpy(&value, &bits, 4);
            has_value = 1;
        }
    }
    if (has_tag && has_value && fn) fn(ctx, tag, step, value);
    return 0;
}

static int parse_event(cursor c, visc_tb_scalar_fn fn, void *ctx) {
    int64_t step = 0;
    cursor summary = {NULL, NULL};
    field f;
    /* The step may follow the summary on the wire, so find both first. */
    while (c.p < c.end) {
        if (next_field(&c, &f) != 0) return -1;
        if (f.number == 2 && f.wire == 0) step = (int64_t)f.u;
        else if (f.number == 5 && f.wire == 2) summary = f.bytes;
    }
    while (summary.p && summary.p < summary.end) {
        if (next_field(&summary, &f) != 0) return -1;
        if (f.number == 1 && f.wire == 2 && parse_value(f.bytes, step, fn, ctx) != 0) return -1;
    }
    return 0;
}

int visc_tb_parse(const uint8_t *buf, size_t size, visc_tb_scalar_fn fn, void *ctx) {
    size_t pos = 0;
    while (pos < size) {
        if (size - pos < 12)
            return visc_set_error("event file: truncated record header at byte %zu", pos);
        uint64_t n = get_le(buf + pos, 8);
        if ((uint32_t)get_le(buf + pos + 8, 4) != masked_crc(buf + pos, 8))
            return visc_set_error("event file: bad length CRC at byte %zu", pos);
        if (n > size - pos - 12 || size - pos - 12 - n < 4)
            return visc_set_error("event file: record at byte %zu claims %llu bytes, %zu remain",
                                  pos, (unsigned long long)n, size - pos - 12);
        const uint8_t *data = buf + pos + 12;
        if ((uint32_t)get_le(data + n, 4) != masked_crc(data, (size_t)n))
            return visc_set_error("event file: bad data CRC in record at byte %zu", pos);
        cursor c = {data, data + n};
        if (parse_event(c, fn, ctx) != 0)
            return visc_set_error("event file: malformed Event protobuf in record at byte %zu",
                                  pos);
        pos += 12 + (size_t)n + 4;
    }
    return 0;
}

int visc_tb_read(const char *path, visc_tb_scalar_fn fn, void *ctx) {
    FILE *f = fopen(path, "rb");
    if (!f) return visc_set_error("cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = visc_malloc(cap, "event file");
    for (;;) {
        if (len == cap) buf = visc_realloc(buf, cap *= 2, "event file");
        size_t k = fread(buf + len, 1, cap - len, f);
        len += k;
        if (k == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return visc_set_error("cannot read '%s'", path);
    }
    int rc = visc_tb_parse(buf, len, fn, ctx);
    if (rc != 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", visc_last_error());
        visc_set_error("%s: %s", path, msg);
    }
    free(buf);
    return rc;
}

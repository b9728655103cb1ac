/* json.c: recursive-descent JSON reader (RFC 8259), strict and bounded.
 *
 * Used for safetensors headers, which come from untrusted files: every
 * byte is checked, nesting depth is capped, and nothing is assumed to be
 * NUL-terminated. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/json.h"

typedef struct {
    const char *p, *end, *start;
} reader;

static int fail(const reader *r, const char *what) {
    return visc_set_error("JSON: %s at byte %zu", what, (size_t)(r->p - r->start));
}

static void skip_ws(reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int hex4(reader *r, unsigned *out) {
    if (r->end - r->p < 4) return fail(r, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = r->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return fail(r, "bad hex digit in \\u escape");
    }
    r->p += 4;
    *out = v;
    return 0;
}

static size_t put_utf8(char *dst, unsigned cp) {
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | (cp >> 12));
        dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | (cp >> 18));
    dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at p (shortest form, no surrogates,
 * at most U+10FFFF), or 0 if invalid. */
static size_t utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    size_t n;
    unsigned cp, min;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if ((size_t)(end - p) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

/* Parses a string starting at the opening quote into a fresh buffer. The
 * decoded form is never longer than the source, so one allocation of the
 * source length suffices. */
static int parse_string(reader *r, char **out, size_t *out_len) {
    r->p++; /* opening quote */
    const char *q = r->p;
    while (q < r->end && *q != '"') q += (*q == '\\' && q + 1 < r->end) ? 2 : 1;
    if (q >= r->end) return fail(r, "unterminated string");
    char *buf = visc_malloc((size_t)(q - r->p) + 1, "JSON string");
    size_t n = 0;
    while (*r->p != '"') {
        unsigned char c = (unsigned char)*r->p;
        if (c < 0x20) {
            free(buf);
            return fail(r, "control character in string");
        }
        if (c != '\\') {
            size_t k = utf8_len((const unsigned char *)r->p, (const unsigned char *)r->end);
            if (k == 0) {
                free(buf);
                return fail(r, "invalid UTF-8 in string");
            }
            memcpy(buf + n, r->p, k);
            n += k;
            r->p += k;
            continue;
        }
        r->p++;
        char e = *r->p++;
        unsigned cp;
        switch (e) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u':
            if (hex4(r, &cp)) goto bad;
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* high surrogate: a low one must follow */
                unsigned lo;
                if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u') {
                    fail(r, "unpaired surrogate in \\u escape");
                    goto bad;
                }
                r->p += 2;
                if (hex4(r, &lo)) goto bad;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    fail(r, "unpaired surrogate in \\u escape");
                    goto bad;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(r, "unpaired surrogate in \\u escape");
                goto bad;
            } else if (cp == 0) {
                fail(r, "NUL character in string");
                goto bad;
            }
            n += put_utf8(buf + n, cp);
            break;
        default:
            r->p--;
            fail(r, "bad escape in string");
            goto bad;
        }
    }
    r->p++; /* closing quote */
    buf[n] = 0;
    *out = buf;
    *out_len = n;
    return 0;
bad:
    free(buf);
    return -1;
}

static int parse_number(reader *r, visc_json *v) {
    const char *s = r->p;
    if (r->p < r->end && *r->p == '-') r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, "bad number");
    if (*r->p == '0') r->p++;
    else
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    if (r->p < r->end && *r->p == '.') {
        r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, "bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return fail(r, "bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    v->type = VISC_JSON_NUMBER;
    v->len = (size_t)(r->p - s);
    v->str = visc_malloc(v->len + 1, "JSON number");
    memcpy(v->str, s, v->len);
    v->str[v->len] = 0;
    return 0;
}

static int literal(reader *r, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0)
        return fail(r, "unexpected character");
    r->p += n;
    return 0;
}

static int parse_value(reader *r, visc_json *v, int depth);

/* Appends a fresh zeroed item (and key slot for objects). */
static visc_json *push_item(visc_json *v, int *cap) {
    if (v->count == *cap) {
        *cap = *cap ? 2 * *cap : 4;
        v->items = visc_realloc(v->items, (size_t)*cap * sizeof *v->items, "JSON items");
        if (v->type == VISC_JSON_OBJECT)
            v->keys = visc_realloc(v->keys, (size_t)*cap * sizeof *v->keys, "JSON keys");
    }
    visc_json *item = &v->items[v->count];
    memset(item, 0, sizeof *item);
    if (v->type == VISC_JSON_OBJECT) v->keys[v->count] = NULL;
    v->count++;
    return item;
}

static int parse_container(reader *r, visc_json *v, int depth) {
    int is_obj = *r->p == '{';
    char close = is_obj ? '}' : ']';
    int cap = 0;
    v->type = is_obj ? VISC_JSON_OBJECT : VISC_JSON_ARRAY;
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return 0;
    }
    for (;;) {
        skip_ws(r);
        char *key = NULL;
        if (is_obj) {
            size_t klen;
            if (r->p >= r->end || *r->p != '"') return fail(r, "expected a string key");
            if (parse_string(r, &key, &klen)) return -1;
            skip_ws(r);
            if (r->p >= r->end || *r->p != ':') {
                free(key);
                return fail(r, "expected ':'");
            }
            r->p++;
        }
        visc_json *item = push_item(v, &cap);
        if (is_obj) v->keys[v->count - 1] = key; /* owned by v from here on */
        if (parse_value(r, item, depth + 1)) return -1;
        skip_ws(r);
        if (r->p >= r->end) return fail(r, is_obj ? "unterminated object" : "unterminated array");
        if (*r->p == ',') {
            r->p++;
            continue;
        }
        if (*r->p == close) {
            r->p++;
            return 0;
        }
        return fail(r, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int parse_value(reader *r, visc_json *v, int depth) {
    if (depth > VISC_JSON_MAX_DEPTH) return fail(r, "nesting too deep");
    skip_ws(r);
    if (r->p >= r->end) return fail(r, "unexpected end of input");
    switch (*r->p) {
    case '{':
    case '[': return parse_container(r, v, depth);
    case '"': v->type = VISC_JSON_STRING; return parse_string(r, &v->str, &v->len);
    case 't':
        v->type = VISC_JSON_BOOL;
        v->boolean = 1;
        return literal(r, "true");
    case 'f': v->type = VISC_JSON_BOOL; return literal(r, "false");
    case 'n': v->type = VISC_JSON_NULL; return literal(r, "null");
    default: return parse_number(r, v);
    }
}

int visc_json_parse(visc_json *root, const char *text, size_t size) {
    reader r = {text, text + size, text};
    memset(root, 0, sizeof *root);
    if (parse_value(&r, root, 0) == 0) {
        skip_ws(&r);
        if (r.p == r.end) return 0;
        fail(&r, "trailing characters after the value");
    }
    visc_json_free(root);
    return -1;
}

void visc_json_free(visc_json *v) {
    for (int i = 0; i < v->count; i++) {
        visc_json_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    memset(v, 0, sizeof *v);
}

const visc_json *visc_json_get(const visc_json *obj, const char *key) {
    if (obj->type != VISC_JSON_OBJECT) return NULL;
    for (int i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

int visc_json_int(const visc_json *v, int64_t *out) {
    if (v->type != VISC_JSON_NUMBER || strpbrk(v->str, ".eE")) return -1;
    errno = 0;
    char *end;
    long long x = strtoll(v->str, &end, 10);
    if (errno == ERANGE || *end) return -1;
    *out = x;
    return 0;
}

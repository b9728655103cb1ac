/* config.c: INI-style configuration files.
 *
 *   # a comment            ; also a comment
 *   epochs = 90
 *   [optim]                -> keys below are "optim.<key>"
 *   lr = 0.1               # trailing comment after whitespace
 *   name = "resnet # 18"   (quotes keep '#', ';' and edge spaces)
 *
 * Every error names the file and line, as a compiler would, because the
 * person reading it is about to open that file in an editor. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/io.h"

static int is_key_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Rest of the line [p, end) may only be blanks or a comment. */
static int only_comment(const char *p, const char *end) {
    while (p < end && is_space(*p)) p++;
    return p == end || *p == '#' || *p == ';';
}

static int key_span(const char *p, const char *end) {
    const char *s = p;
    while (p < end && is_key_char(*p)) p++;
    return (int)(p - s);
}

/* A quoted value starting at the quote; writes the unquoted text to out. */
static int quoted(const char **pp, const char *end, char *out, const char *src, int line) {
    const char *p = *pp;
    char q = *p++;
    size_t n = 0;
    while (p < end && *p != q) {
        if (q == '"' && *p == '\\') {
            if (++p >= end) break;
            switch (*p) {
            case 'n': out[n++] = '\n'; break;
            case 't': out[n++] = '\t'; break;
            case '"':
            case '\\': out[n++] = *p; break;
            default:
                return visc_set_error("%s:%d: unknown escape '\\%c' in quoted value", src, line,
                                      *p);
            }
            p++;
        } else {
            out[n++] = *p++;
        }
    }
    if (p >= end) return visc_set_error("%s:%d: unterminated quoted value", src, line);
    out[n] = 0;
    *pp = p + 1;
    return 0;
}

static int parse_line(visc_config *c, const char *p, const char *end, char **section,
                      const char *src, int line) {
    while (p < end && is_space(*p)) p++;
    while (end > p && is_space(end[-1])) end--;
    if (p == end || *p == '#' || *p == ';') return 0;

    if (*p == '[') {
        p++;
        while (p < end && is_space(*p)) p++;
        int k = key_span(p, end);
        const char *q = p + k;
        while (q < end && is_space(*q)) q++;
        if (q >= end || *q != ']') {
            if (k == 0 || q >= end) return visc_set_error("%s:%d: expected '[section]'", src, line);
            return visc_set_error("%s:%d: invalid character '%c' in section name", src, line, *q);
        }
        if (k == 0) return visc_set_error("%s:%d: empty section name", src, line);
        if (!only_comment(q + 1, end))
            return visc_set_error("%s:%d: unexpected text after ']'", src, line);
        free(*section);
        *section = visc_malloc((size_t)k + 1, "config section");
        memcpy(*section, p, (size_t)k);
        (*section)[k] = 0;
        return 0;
    }

    int k = key_span(p, end);
    const char *q = p + k;
    while (q < end && is_space(*q)) q++;
    if (k == 0 || q >= end || *q != '=') {
        /* "a b = 1", "a/b = 1": a key with a stray character, not a missing '='. */
        if (k > 0 && memchr(p, '=', (size_t)(end - p)))
            return visc_set_error("%s:%d: invalid character '%c' in key", src, line, p[k]);
        return visc_set_error("%s:%d: expected 'key = value'", src, line);
    }
    q++;
    while (q < end && is_space(*q)) q++;

    char *value = visc_malloc((size_t)(end - q) + 1, "config value");
    if (q < end && (*q == '"' || *q == '\'')) {
        int rc = quoted(&q, end, value, src, line);
        if (rc == 0 && !only_comment(q, end))
            rc = visc_set_error("%s:%d: unexpected text after the quoted value", src, line);
        if (rc != 0) {
            free(value);
            return -1;
        }
    } else {
        /* An unquoted value ends at a comment that follows whitespace. */
        const char *e = q;
        while (e < end && !((*e == '#' || *e == ';') && e > q && is_space(e[-1]))) e++;
        while (e > q && is_space(e[-1])) e--;
        memcpy(value, q, (size_t)(e - q));
        value[e - q] = 0;
    }

    size_t slen = *section ? strlen(*section) + 1 : 0;
    char *key = visc_malloc(slen + (size_t)k + 1, "config key");
    if (*section) {
        memcpy(key, *section, slen - 1);
        key[slen - 1] = '.';
    }
    memcpy(key + slen, p, (size_t)k);
    key[slen + (size_t)k] = 0;
    visc_config_set(c, key, value);
    free(key);
    free(value);
    return 0;
}

int visc_config_parse(visc_config *c, const char *text, size_t size, const char *source_name) {
    memset(c, 0, sizeof *c);
    const char *src = source_name ? source_name : "<config>";
    char *section = NULL;
    const char *p = text, *end = text + size;
    int line = 1, rc = 0;
    if (size >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) p += 3; /* UTF-8 byte order mark */
    while (p < end && rc == 0) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        if (memchr(p, 0, (size_t)(eol - p)))
            rc = visc_set_error("%s:%d: NUL byte in line", src, line);
        else rc = parse_line(c, p, eol, &section, src, line);
        p = nl ? nl + 1 : end;
        line++;
    }
    free(section);
    if (rc != 0) visc_config_free(c);
    return rc;
}

int visc_config_load(visc_config *c, const char *path) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f) return visc_set_error("cannot open '%s': %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = visc_malloc(cap, "config file");
    for (;;) {
        if (len == cap) buf = visc_realloc(buf, cap *= 2, "config file");
        size_t k = fread(buf + len, 1, cap - len, f);
        len += k;
        if (k == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    int rc = err ? visc_set_error("cannot read '%s'", path) : visc_config_parse(c, buf, len, path);
    free(buf);
    return rc;
}

const char *visc_config_get(const visc_config *c, const char *key) {
    for (int i = 0; i < c->count; i++)
        if (strcmp(c->keys[i], key) == 0) return c->values[i];
    return NULL;
}

void visc_config_set(visc_config *c, const char *key, const char *value) {
    for (int i = 0; i < c->count; i++)
        if (strcmp(c->keys[i], key) == 0) {
            free(c->values[i]);
            c->values[i] = visc_strdup(value);
            return;
        }
    c->keys = visc_realloc(c->keys, (size_t)(c->count + 1) * sizeof(char *), "config keys");
    c->values = visc_realloc(c->values, (size_t)(c->count + 1) * sizeof(char *), "config values");
    c->keys[c->count] = visc_strdup(key);
    c->values[c->count] = visc_strdup(value);
    c->count++;
}

void visc_config_free(visc_config *c) {
    for (int i = 0; i < c->count; i++) {
        free(c->keys[i]);
        free(c->values[i]);
    }
    free(c->keys);
    free(c->values);
    memset(c, 0, sizeof *c);
}

/* json.h: a small, strict JSON reader for file headers (safetensors).
 *
 * It parses a whole document into a tree of visc_json values. Strings are
 * decoded to UTF-8 (escapes resolved, invalid UTF-8 and embedded NULs
 * rejected, so they are safe C strings); numbers keep their source text so
 * integers up to 2^63 - 1 are read exactly with visc_json_int. Nesting is
 * limited so hostile input cannot exhaust the stack. Errors return -1 with
 * "JSON: <problem> at byte N" in visc_last_error(). */
#ifndef VISC_JSON_H
#define VISC_JSON_H

#include <stddef.h>
#include <stdint.h>

#define VISC_JSON_MAX_DEPTH 64

typedef enum {
    VISC_JSON_NULL,
    VISC_JSON_BOOL,
    VISC_JSON_NUMBER,
    VISC_JSON_STRING,
    VISC_JSON_ARRAY,
    VISC_JSON_OBJECT,
} visc_json_type;

typedef struct visc_json {
    visc_json_type type;
    int boolean;
    char *str;  /* STRING: decoded text; NUMBER: the literal as written */
    size_t len; /* bytes in str */
    int count;  /* ARRAY and OBJECT: number of items */
    struct visc_json *items;
    char **keys; /* OBJECT: keys[i] names items[i]; duplicates are kept */
} visc_json;

/* Parses text[0..size); whitespace may surround the single value. */
int visc_json_parse(visc_json *root, const char *text, size_t size);
void visc_json_free(visc_json *v);
/* First member named key, or NULL (also when obj is not an object). */
const visc_json *visc_json_get(const visc_json *obj, const char *key);
/* An integer literal (no fraction or exponent) in int64 range; -1 otherwise
 * (without touching the error message: callers word their own). */
int visc_json_int(const visc_json *v, int64_t *out);

#endif

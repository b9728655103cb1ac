/* memory.c: checked allocation and the activation arena. */
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"

void *visc_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) visc_die("out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *visc_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) visc_die("out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}

void *visc_realloc(void *old, size_t bytes, const char *what) {
    void *p = realloc(old, bytes ? bytes : 1);
    if (!p) visc_die("out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *visc_alloc_aligned(size_t bytes, const char *what) {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) visc_die("out of memory allocating %zu bytes for %s", bytes, what);
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

void visc_free_aligned(void *p) { free(p); }

char *visc_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = visc_malloc(n, "string");
    memcpy(d, s, n);
    return d;
}

void visc_arena_init(visc_arena *a, size_t bytes) {
    a->size = bytes;
    a->used = 0;
    a->device = VISC_DEVICE_CPU;
    a->base = bytes ? visc_alloc_aligned(bytes, "activation arena") : NULL;
}

void *visc_arena_take(visc_arena *a, size_t bytes) {
    size_t start = (a->used + 63) & ~(size_t)63;
    a->used = start + bytes;
    if (!a->base) return NULL; /* planning pass: only count */
    VISC_ASSERT(a->used <= a->size);
    return a->base + start;
}

float *visc_arena_floats(visc_arena *a, size_t count) {
    return visc_arena_take(a, count * sizeof(float));
}

void visc_arena_free(visc_arena *a) {
    visc_free_aligned(a->base);
    a->base = NULL;
    a->size = a->used = 0;
}

/* memory.c: checked allocation and the activation arena. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "visc/core.h"

/* Below this an allocation is not checked against the free memory: the
 * check reads /proc, and small buffers cannot be what sinks a machine. */
#define CHECKED_ALLOCATION_BYTES ((size_t)64 << 20)
/* What a checked allocation leaves for everything else the run still
 * allocates (the loader's images, oneDNN's primitives, small buffers):
 * an arena that took all but a few MiB got the process killed later. */
#define RESERVED_BYTES ((size_t)256 << 20)

/* The "Name: N kB" field of /proc/meminfo, in bytes; -1 when absent. */
static long long meminfo_bytes(const char *text, const char *name) {
    const char *at = strstr(text, name);
    if (!at) return -1;
    long long kib = -1;
    if (sscanf(at + strlen(name), ": %lld kB", &kib) != 1 || kib < 0) return -1;
    return kib * 1024;
}

/* A file holding one number (cgroup limits and usage); -1 when absent or
 * not a number ("max" is no limit). */
static long long file_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

static size_t smaller(size_t a, long long b) { return b >= 0 && (size_t)b < a ? (size_t)b : a; }

int visc_parse_size(const char *s, long long *bytes) {
    char *end;
    double v = strtod(s, &end);
    double unit;
    if (end == s || !(v >= 0)) return -1;
    if (!strcmp(end, "") || !strcmp(end, "B")) unit = 1;
    else if (!strcmp(end, "K") || !strcmp(end, "KiB")) unit = 1024.0;
    else if (!strcmp(end, "M") || !strcmp(end, "MiB")) unit = 1024.0 * 1024;
    else if (!strcmp(end, "G") || !strcmp(end, "GiB")) unit = 1024.0 * 1024 * 1024;
    else return -1;
    if (v * unit > 9e18) return -1;
    *bytes = (long long)(v * unit);
    return 0;
}

/* Bytes of VISC_MEMORY_LIMIT; -1 when unset. */
static long long limit_from_env(void) {
    const char *s = getenv("VISC_MEMORY_LIMIT");
    long long bytes;
    if (!s || !*s) return -1;
    if (visc_parse_size(s, &bytes))
        visc_die("VISC_MEMORY_LIMIT='%s': expected a size such as 8G, 512M or 1048576", s);
    return bytes;
}

/* Anonymous resident bytes of this process (/proc/self/statm: resident
 * less file-backed pages, which a memory-mapped data set fills and the
 * kernel can drop); 0 when unknown. */
static size_t resident_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long total = 0, resident = 0, shared = 0;
    int n = fscanf(f, "%llu %llu %llu", &total, &resident, &shared);
    fclose(f);
    if (n != 3 || shared > resident) return 0;
    return (size_t)((resident - shared) * (unsigned long long)sysconf(_SC_PAGESIZE));
}

size_t visc_memory_available(void) {
    size_t avail = SIZE_MAX;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char text[8192];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        long long mem = meminfo_bytes(text, "MemAvailable");
        long long swap = meminfo_bytes(text, "SwapFree");
        if (mem >= 0) avail = (size_t)mem + (size_t)(swap > 0 ? swap : 0);
    }
    /* A container's limit is the one the OOM killer enforces: cgroup v2,
     * then v1 (whose "no limit" is a huge number, harmless here). */
    long long max2 = file_number("/sys/fs/cgroup/memory.max");
    long long cur2 = file_number("/sys/fs/cgroup/memory.current");
    if (max2 >= 0 && cur2 >= 0) avail = smaller(avail, max2 > cur2 ? max2 - cur2 : 0);
    long long max1 = file_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    long long cur1 = file_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (max1 >= 0 && cur1 >= 0) avail = smaller(avail, max1 > cur1 ? max1 - cur1 : 0);
    long long cap = limit_from_env();
    if (cap >= 0) {
        size_t used = resident_bytes();
        avail = smaller(avail, (size_t)cap > used ? (long long)((size_t)cap - used) : 0);
    }
    return avail;
}

void visc_require_memory(size_t bytes, const char *what, const char *hint) {
    if (bytes < CHECKED_ALLOCATION_BYTES) return;
    size_t avail = visc_memory_available();
    if (bytes <= avail && avail - bytes >= RESERVED_BYTES) return;
    /* Linux overcommits: malloc would succeed and the first touch of these
     * pages would get the process killed without a word. */
    visc_die("not enough memory for %s: %.0f MiB needed, %.0f MiB available, %.0f of them kept "
             "for the rest of the run%s%s%s",
             what, (double)bytes / (1 << 20), (double)avail / (1 << 20),
             (double)RESERVED_BYTES / (1 << 20), hint ? " (" : "", hint ? hint : "",
             hint ? ")" : "");
}

void *visc_malloc(size_t bytes, const char *what) {
    visc_require_memory(bytes, what, NULL);
    void *p = malloc(bytes ? bytes : 1);
    if (!p) visc_die("out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *visc_calloc(size_t count, size_t size, const char *what) {
    if (size && count <= SIZE_MAX / size) visc_require_memory(count * size, what, NULL);
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) visc_die("out of memory allocating %zu x %zu bytes for %s", count, size, what);
    return p;
}

void *visc_realloc(void *old, size_t bytes, const char *what) {
    void *p = realloc(old, bytes ? bytes : 1);
    if (!p) visc_die("out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

/* 64-byte aligned and zeroed; hint: what the refusal advises (NULL none) */
static void *zeroed_aligned(size_t bytes, const char *what, const char *hint) {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    visc_require_memory(rounded, what, hint);
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) visc_die("out of memory allocating %zu bytes for %s", bytes, what);
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

void *visc_alloc_aligned(size_t bytes, const char *what) {
    return zeroed_aligned(bytes, what, NULL);
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
    a->base = bytes ? zeroed_aligned(bytes, "the activation arena", VISC_ARENA_ADVICE) : NULL;
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

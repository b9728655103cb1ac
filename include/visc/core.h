/* core.h: errors, memory, timing and the device tag shared by every module.
 *
 * Error policy: code that parses user input (files, flags, network messages)
 * never exits; it records a one-line message with visc_set_error() and
 * returns -1, so fuzzers and callers decide. The CLI turns that into
 * "visc: <message>" and a non-zero exit with visc_die(). Broken internal
 * invariants (a bug, not bad input) abort through VISC_ASSERT. */
#ifndef VISC_CORE_H
#define VISC_CORE_H

#include <stddef.h>
#include <stdint.h>

/* Where a buffer lives. Layers and tables record it so a CUDA backend can
 * slot in behind the same API. */
typedef enum { VISC_DEVICE_CPU = 0, VISC_DEVICE_CUDA = 1 } visc_device;

/* ---- errors ---- */
/* Stores a printf-formatted message for this thread; always returns -1. */
int visc_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *visc_last_error(void);
/* Prints "visc: <message>" to stderr and exits with status 1. */
_Noreturn void visc_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define VISC_ASSERT(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) visc_assert_fail(#cond, __FILE__, __LINE__);                                  \
    } while (0)
_Noreturn void visc_assert_fail(const char *expr, const char *file, int line);

/* ---- memory ---- */
/* All allocations that can fail for lack of memory go through these: a
 * failure is reported as "out of memory allocating N bytes for <what>". */
void *visc_malloc(size_t bytes, const char *what);
void *visc_calloc(size_t count, size_t size, const char *what);
void *visc_realloc(void *p, size_t bytes, const char *what);
/* 64-byte aligned, zero-filled; free with visc_free_aligned. */
void *visc_alloc_aligned(size_t bytes, const char *what);
void visc_free_aligned(void *p);
char *visc_strdup(const char *s);

/* ---- activation arena: one allocation, carved once, never freed per step ---- */
typedef struct {
    char *base;
    size_t size, used;
    visc_device device;
} visc_arena;
/* Planning mode: base == NULL, visc_arena_take only counts. */
void visc_arena_init(visc_arena *a, size_t bytes); /* bytes 0: planning mode */
float *visc_arena_floats(visc_arena *a, size_t count);
void *visc_arena_take(visc_arena *a, size_t bytes);
void visc_arena_free(visc_arena *a);

/* ---- time and threads ---- */
double visc_now(void); /* monotonic seconds */
int visc_num_threads(void);
void visc_set_num_threads(int n);

#endif

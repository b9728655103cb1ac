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
#include <time.h>

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
/* "1048576", "512K", "64M", "8G" (or KiB, MiB, GiB, B) as bytes; -1 on
 * anything else, for the caller to name. */
int visc_parse_size(const char *s, long long *bytes);
/* Bytes this process can still fill before the kernel kills it: the
 * system's MemAvailable plus free swap, within a cgroup's limit and within
 * VISC_MEMORY_LIMIT ("8G", "512M") over this process's resident set;
 * SIZE_MAX where none of these can be read. */
size_t visc_memory_available(void);
/* Dies with "not enough memory for <what>: N MiB needed, M MiB available,
 * 256 of them kept for the rest of the run (<hint>)" when an allocation of
 * 64 MiB or more would not leave 256 MiB; the allocators above call it,
 * and so does visc_arena_init with advice on what needs less. */
void visc_require_memory(size_t bytes, const char *what, const char *hint);
/* What a plan too large for its memory (host or device) is told. */
#define VISC_ARENA_ADVICE "a smaller batch or image size, or --grad-checkpointing, needs less"

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

/* ---- stopping on a signal (stop_signal.c) ---- */
/* Once installed (the training loops do it as they start), SIGINT,
 * SIGTERM and SIGUSR1 ask the run to stop after its step with a
 * checkpoint (the CLI then exits with 128 + the signal's number); a second
 * signal ends the process at once. */
void visc_stop_signals_install(void);
int visc_stop_signal(void); /* the signal received, 0 none */
/* A training loop that stopped for sig (any rank's: dist.h) after step,
 * its checkpoint saved in output, says so: one line on rank 0, and the
 * program's exit status is then 128 + the signal's number. */
void visc_stop_signal_obeyed(int sig, long long step, const char *output, int rank);
/* 0 while no loop stopped for a signal (one after the last step changes
 * nothing). */
int visc_stop_signal_exit_status(void);
const char *visc_signal_name(int sig);

/* ---- time and threads ---- */
double visc_now(void); /* monotonic seconds */
/* The wall-clock time `seconds` from now (clamped to [0, 1e6]): the
 * deadline pthread_cond_timedwait takes. */
struct timespec visc_deadline_after(double seconds);
/* The same on the monotonic clock, for condition variables set to it
 * (pthread_condattr_setclock): deadlines that wall-clock jumps do not move. */
struct timespec visc_monotonic_deadline_after(double seconds);
int visc_num_threads(void);
void visc_set_num_threads(int n);

#endif

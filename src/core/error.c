/* error.c: the thread-local last-error message and the CLI's fatal exit. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"

static _Thread_local char last_error[512];

int visc_set_error(const char *fmt, ...) {
    /* Formatted apart first: callers often prefix the previous message,
     * visc_set_error("%s: %s", path, visc_last_error()). */
    char text[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(last_error, text, sizeof text);
    return -1;
}

const char *visc_last_error(void) { return last_error[0] ? last_error : "unknown error"; }

_Noreturn void visc_die(const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fputs("visc: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

_Noreturn void visc_assert_fail(const char *expr, const char *file, int line) {
    fflush(stdout);
    fprintf(stderr, "visc: internal error: %s failed at %s:%d\n", expr, file, line);
    abort();
}

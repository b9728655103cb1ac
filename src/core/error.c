/* error.c: the thread-local last-error message and the CLI's fatal exit. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "visc/core.h"

static _Thread_local char last_error[512];

int visc_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
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

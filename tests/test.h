/* test.h: a minimal test harness. A test file defines cases with TEST(name);
 * harness.c runs them all (or those named on the command line) and prints
 * one "ok"/"FAIL" line per case. CHECK* record a failure and go on. */
#ifndef VISC_TEST_H
#define VISC_TEST_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "visc/io.h"

typedef void (*visc_test_fn)(void);
void visc_test_register(const char *name, visc_test_fn fn);
void visc_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define TEST(name)                                                                                 \
    static void test_##name(void);                                                                 \
    __attribute__((constructor)) static void register_##name(void) {                               \
        visc_test_register(#name, test_##name);                                                    \
    }                                                                                              \
    static void test_##name(void)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) visc_test_fail(__FILE__, __LINE__, "%s", #cond);                              \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) visc_test_fail(__FILE__, __LINE__, __VA_ARGS__);                              \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_CLOSE(a, b, atol, rtol)                                                              \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_)))                                          \
            visc_test_fail(__FILE__, __LINE__, "%s = %.9g, expected %s = %.9g", #a, a_, #b, b_);   \
    } while (0)

/* Compares two arrays elementwise; reports the worst element. Returns 1 if all close. */
int visc_check_arrays(const char *file, int line, const char *what, const float *got,
                      const float *want, size_t n, double atol, double rtol);
#define CHECK_ARRAYS(what, got, want, n, atol, rtol)                                               \
    visc_check_arrays(__FILE__, __LINE__, what, got, want, n, atol, rtol)

/* The whole file at path in a fresh buffer (free it; one spare byte past the
 * end), its length in *size; NULL when it cannot be read. */
uint8_t *visc_test_read_file(const char *path, size_t *size);
/* Path of a committed golden file: tests/golden/<name> relative to the repo. */
const char *visc_golden_path(const char *name);
/* The golden safetensors file `file` (tests/golden/<file>), opened once per
 * test binary; NULL (with a message on stderr) when it cannot be read. */
const visc_safetensors *visc_golden_file(const char *file);
/* Element count of tensor `name` in golden `file`; 0 when absent. */
size_t visc_golden_numel(const char *file, const char *name);
/* A fresh copy (free it) of golden tensor `name`, which must have `numel`
 * elements; zero-filled, and the test failed, when it cannot be read. */
float *visc_golden_load(const char *file, const char *name, size_t numel);

#endif

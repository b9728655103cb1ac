/* harness.c: runs the TEST cases registered by one test file. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define MAX_TESTS 512
static struct {
    const char *name;
    visc_test_fn fn;
} tests[MAX_TESTS];
static int num_tests, current_failures;

void visc_test_register(const char *name, visc_test_fn fn) {
    if (num_tests == MAX_TESTS) {
        fprintf(stderr, "too many tests\n");
        exit(2);
    }
    tests[num_tests].name = name;
    tests[num_tests].fn = fn;
    num_tests++;
}

void visc_test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "  %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    current_failures++;
}

int visc_check_arrays(const char *file, int line, const char *what, const float *got,
                      const float *want, size_t n, double atol, double rtol) {
    size_t worst = 0, bad = 0;
    double worst_excess = -1;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        double allowed = atol + rtol * fabs((double)want[i]);
        if (!(d <= allowed)) { /* also catches NaN */
            bad++;
            double excess = isnan(d) ? INFINITY : d - allowed;
            if (excess > worst_excess) {
                worst_excess = excess;
                worst = i;
            }
        }
    }
    if (bad) {
        visc_test_fail(file, line, "%s: %zu of %zu elements differ; worst [%zu] got %.9g want %.9g",
                       what, bad, n, worst, got[worst], want[worst]);
        return 0;
    }
    return 1;
}

const char *visc_golden_path(const char *name) {
    static char path[1024];
    const char *dir = getenv("VISC_GOLDEN_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/golden", name);
    return path;
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0;
    for (int i = 0; i < num_tests; i++) {
        if (argc > 1) {
            int wanted = 0;
            for (int a = 1; a < argc; a++) wanted |= strcmp(argv[a], tests[i].name) == 0;
            if (!wanted) continue;
        }
        current_failures = 0;
        tests[i].fn();
        if (current_failures) {
            printf("FAIL %s\n", tests[i].name);
            failed++;
        } else {
            printf("ok   %s\n", tests[i].name);
            passed++;
        }
        fflush(stdout);
    }
    return failed ? 1 : 0;
}

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

uint8_t *visc_test_read_file(const char *path, size_t *size) {
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    uint8_t *buf = NULL;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    if (buf) *size = (size_t)n;
    return buf;
}

const char *visc_golden_path(const char *name) {
    static char path[1024];
    const char *dir = getenv("VISC_GOLDEN_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/golden", name);
    return path;
}

const visc_safetensors *visc_golden_file(const char *file) {
    /* A few files per binary at most; each opened (mapped) once. */
    static struct {
        char name[128];
        visc_safetensors st;
        int ok;
    } open_files[8];
    static int count;
    for (int i = 0; i < count; i++)
        if (strcmp(open_files[i].name, file) == 0)
            return open_files[i].ok ? &open_files[i].st : NULL;
    if (count == 8 || strlen(file) >= sizeof open_files[0].name) {
        fprintf(stderr, "  %s: too many golden files or too long a name\n", file);
        return NULL;
    }
    snprintf(open_files[count].name, sizeof open_files[count].name, "%s", file);
    open_files[count].ok =
        visc_safetensors_open(&open_files[count].st, visc_golden_path(file)) == 0;
    if (!open_files[count].ok) fprintf(stderr, "  %s: %s\n", file, visc_last_error());
    count++;
    return open_files[count - 1].ok ? &open_files[count - 1].st : NULL;
}

size_t visc_golden_numel(const char *file, const char *name) {
    const visc_safetensors *st = visc_golden_file(file);
    const visc_st_tensor *t = st ? visc_safetensors_find(st, name) : NULL;
    return t ? t->numel : 0;
}

float *visc_golden_load(const char *file, const char *name, size_t numel) {
    float *p = calloc(numel ? numel : 1, sizeof(float));
    const visc_safetensors *st = visc_golden_file(file);
    if (!st || visc_safetensors_read_f32(st, name, p, numel) != 0)
        CHECK_MSG(0, "golden tensor %s/%s: %s", file, name, st ? visc_last_error() : "no file");
    return p;
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

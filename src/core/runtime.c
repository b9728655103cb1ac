/* runtime.c: clocks and thread counts (OpenMP drives both our loops and oneDNN). */
#define _POSIX_C_SOURCE 199309L
#include <time.h>

#include <omp.h>

#include "visc/core.h"

double visc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int visc_num_threads(void) { return omp_get_max_threads(); }

void visc_set_num_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
}

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

static struct timespec deadline_on(clockid_t clock, double seconds) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    if (!(seconds > 0)) seconds = 0;
    if (seconds > 1e6) seconds = 1e6;
    long long ns = ts.tv_nsec + (long long)((seconds - (double)(long long)seconds) * 1e9);
    ts.tv_sec += (time_t)seconds + (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    return ts;
}

struct timespec visc_deadline_after(double seconds) {
    return deadline_on(CLOCK_REALTIME, seconds);
}

struct timespec visc_monotonic_deadline_after(double seconds) {
    return deadline_on(CLOCK_MONOTONIC, seconds);
}

int visc_num_threads(void) { return omp_get_max_threads(); }

void visc_set_num_threads(int n) {
    if (n > 0) omp_set_num_threads(n);
}

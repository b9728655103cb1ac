/* profile.cu: where a step's GPU time goes, by kind of work.
 *
 * While a context is profiled, a timing event is recorded on its stream
 * after every kernel launch (visc_cuda_launched) and every cuDNN and
 * cuBLASLt call, named by that call; the time between two consecutive
 * events is charged to the later one's name. The stream runs its work in
 * order, so each interval is that call's GPU time plus any wait before it
 * started: a GPU starved by the host shows up as the time of the calls
 * that followed the gap, and as a total near the wall clock's. Events go
 * into a ring; when it is full the host waits for the last one, adds the
 * intervals up and starts over from it. That wait, and the few microseconds
 * each record costs the host, are why speed is measured with it off.
 *
 * One context at a time (visc_cuda_profiled): the kernels report only
 * their name, not their context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

#define PROFILE_EVENTS 1024 /* per ring: a ResNet-50 step has about 700 calls */
#define PROFILE_NAMES 256

typedef struct {
    const char *name;
    double ms;
    long calls;
} profile_entry;

struct visc_cuda_profile {
    cudaEvent_t ev[PROFILE_EVENTS];
    const char *name[PROFILE_EVENTS];
    int n; /* events in the ring; ev[0] is where the next interval starts */
    profile_entry table[PROFILE_NAMES];
    int entries;
    int overflow; /* names beyond the table's room, charged to "other" */
    int failed;   /* an event could not be recorded or timed: the totals are short */
};

visc_cuda *visc_cuda_profiled = NULL;

static void charge(visc_cuda_profile *p, const char *name, double ms) {
    int i = 0;
    while (i < p->entries && strcmp(p->table[i].name, name) != 0) i++;
    if (i == p->entries) {
        if (p->entries == PROFILE_NAMES) {
            p->overflow = 1;
            name = "other", i = PROFILE_NAMES - 1;
        } else {
            p->table[p->entries++].name = name;
        }
    }
    p->table[i].ms += ms;
    p->table[i].calls++;
}

/* Waits for the ring's last event, charges every interval, keeps that
 * event as the next start. */
static void harvest(visc_cuda_profile *p) {
    if (p->n < 2) return;
    if (cudaEventSynchronize(p->ev[p->n - 1]) != cudaSuccess) {
        cudaGetLastError();
        p->failed = 1;
    } else {
        for (int i = 1; i < p->n; i++) {
            float ms = 0;
            if (cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]) != cudaSuccess) {
                cudaGetLastError();
                p->failed = 1;
                continue;
            }
            charge(p, p->name[i], ms);
        }
    }
    cudaEvent_t last = p->ev[p->n - 1];
    p->ev[p->n - 1] = p->ev[0];
    p->ev[0] = last;
    p->n = 1;
}

void visc_cuda_profile_mark(const char *what) {
    visc_cuda *ctx = visc_cuda_profiled;
    if (!ctx || !ctx->profile) return;
    visc_cuda_profile *p = ctx->profile;
    if (p->n == PROFILE_EVENTS) harvest(p);
    if (cudaEventRecord(p->ev[p->n], ctx->stream) != cudaSuccess) {
        cudaGetLastError();
        p->failed = 1;
        return;
    }
    p->name[p->n++] = what;
}

static void profile_free(visc_cuda_profile *p) {
    if (!p) return;
    for (int i = 0; i < PROFILE_EVENTS; i++)
        if (p->ev[i]) cudaEventDestroy(p->ev[i]);
    free(p);
}

int visc_cuda_profile_start(visc_cuda *ctx) {
    if (visc_cuda_profiled && visc_cuda_profiled != ctx)
        return visc_set_error("profiling: another context is being profiled");
    if (!ctx->profile) {
        visc_cuda_profile *p = (visc_cuda_profile *)calloc(1, sizeof *p);
        if (!p) return visc_set_error("out of memory for the profile");
        for (int i = 0; i < PROFILE_EVENTS; i++)
            if (visc_cuda_check(cudaEventCreate(&p->ev[i]), "creating the profile's events")) {
                profile_free(p);
                return -1;
            }
        ctx->profile = p;
    }
    visc_cuda_profile *p = ctx->profile;
    p->entries = 0, p->overflow = 0, p->failed = 0;
    memset(p->table, 0, sizeof p->table);
    /* the first interval starts once the work queued before is done */
    if (visc_cuda_sync(ctx) ||
        visc_cuda_check(cudaEventRecord(p->ev[0], ctx->stream), "starting the profile"))
        return -1;
    p->n = 1;
    visc_cuda_profiled = ctx;
    return 0;
}

static int by_time(const void *a, const void *b) {
    const double x = ((const profile_entry *)a)->ms, y = ((const profile_entry *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

int visc_cuda_profile_report(visc_cuda *ctx, FILE *f, int steps) {
    visc_cuda_profile *p = ctx->profile;
    if (!p) return visc_set_error("profiling: the context was never profiled");
    if (visc_cuda_profiled == ctx) {
        harvest(p);
        visc_cuda_profiled = NULL;
    }
    if (steps < 1) steps = 1;
    qsort(p->table, (size_t)p->entries, sizeof *p->table, by_time);
    double total = 0;
    for (int i = 0; i < p->entries; i++) total += p->table[i].ms;
    fprintf(f,
            "GPU time by kind of work, per step (%d steps; each call's time includes any "
            "wait before it):\n",
            steps);
    fprintf(f, "  %9s %6s %7s  %s\n", "ms/step", "share", "calls", "work");
    for (int i = 0; i < p->entries; i++)
        fprintf(f, "  %9.3f %5.1f%% %7.1f  %s\n", p->table[i].ms / steps,
                total > 0 ? 100.0 * p->table[i].ms / total : 0.0, (double)p->table[i].calls / steps,
                p->table[i].name);
    fprintf(f, "  %9.3f %5.1f%% %7s  total\n", total / steps, total > 0 ? 100.0 : 0.0, "");
    if (p->overflow) fprintf(f, "  (more kinds than the table holds: the rest as \"other\")\n");
    if (p->failed) fprintf(f, "  (some events could not be recorded or timed: totals are short)\n");
    return 0;
}

void visc_cuda_profile_free(visc_cuda *ctx) {
    if (visc_cuda_profiled == ctx) visc_cuda_profiled = NULL;
    profile_free(ctx->profile);
    ctx->profile = NULL;
}

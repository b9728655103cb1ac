/* bench_pipeline.c: images/s of the input pipeline alone (read + decode +
 * augment + batch), through the threaded loader, no model.
 *   build/bench/bench_pipeline SPEC [--threads N] [--recipe torchvision|mocov2]
 *                              [--size 224] [--epochs 1] [--batch 32] [--fast-decode 0|1]
 * SPEC: flat:DIR, imagefolder:DIR, pack:DIR. Prints one line
 * "pipeline SPEC recipe threads ... R per CPU-s W images/s": W by the wall
 * clock, R per CPU-second of the process (all threads, user + system)
 * over the same loop, which other load on the machine disturbs less.
 * bench/pipeline_vs_torchvision.sh runs it beside torchvision. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "visc/core.h"
#include "visc/loader.h"
#include "visc/transforms.h"

/* CPU seconds (user + system) of the whole process, all threads. */
static double cpu_seconds(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec +
           (double)u.ru_stime.tv_sec + 1e-6 * (double)u.ru_stime.tv_usec;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_pipeline SPEC [--threads N] [--recipe R] [--size S] "
                        "[--epochs E] [--batch B] [--fast-decode 0|1]\n");
        return 2;
    }
    const char *spec = argv[1], *recipe = "torchvision";
    int threads = 1, size = 224, epochs = 1, batch = 32, fast = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--recipe")) recipe = argv[i + 1];
        else if (!strcmp(argv[i], "--size")) size = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--epochs")) epochs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--fast-decode")) fast = atoi(argv[i + 1]);
        else visc_die("unknown option '%s'", argv[i]);
    }
    visc_set_num_threads(1); /* the loader's threads are the parallelism */
    visc_transform_config tc;
    visc_sample_pipeline pl;
    if (visc_transform_preset(recipe, size, &tc)) visc_die("%s", visc_last_error());
    tc.fast_decode = fast;
    if (visc_transform_pipeline(&tc, &pl)) visc_die("%s", visc_last_error());
    visc_dataset *ds = visc_image_dataset_open(spec, 1, &pl);
    if (!ds) visc_die("%s", visc_last_error());
    visc_loader_config c =
        {.batch_size = batch, .workers = threads, .shuffle = 1, .train = 1, .seed = 1, .world = 1};
    visc_loader *l = visc_loader_new(ds, &c);
    if (!l) visc_die("%s", visc_last_error());
    int64_t images = 0, bad = 0;
    double t0 = visc_now(), c0 = cpu_seconds();
    for (int e = 0; e < epochs; e++) {
        visc_batch b;
        int rc;
        visc_loader_start(l, e, 0, -1);
        while ((rc = visc_loader_next(l, &b)) == 1) images += b.count;
        if (rc < 0) visc_die("%s", visc_last_error());
        bad += visc_loader_bad_count(l);
    }
    double dt = visc_now() - t0, dc = cpu_seconds() - c0;
    printf("pipeline %s %s%s threads=%d images=%lld bad=%lld %.1f per CPU-s %.1f images/s\n", spec,
           recipe, fast ? " fast-decode" : "", threads, (long long)images, (long long)bad,
           (double)images / dc, (double)images / dt);
    visc_loader_free(l);
    visc_dataset_free(ds);
    return 0;
}

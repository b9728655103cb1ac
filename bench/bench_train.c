/* bench_train.c: training speed of one model on synthetic data.
 *
 * One training step exactly as the trainer runs it (forward, softmax
 * cross-entropy, backward, SGD with momentum 0.9), on a fixed random batch,
 * so nothing but the engine is measured: no data loading, no augmentation.
 * Warm-up steps first (oneDNN creates its kernels and touches every buffer),
 * then timed steps; the clock is read between the phases, which costs a few
 * microseconds per step, so the per-phase breakdown is always printed (on a
 * CPU: a GPU's timed steps are queued back to back, as PyTorch's are, and
 * --profile breaks its step down).
 *
 * Achieved GFLOP/s counts a training step as 3 x the forward FLOPs (the
 * backward is a data gradient plus a weight gradient, each about one
 * forward), the same convention as the trainer's log. The machine's peak is
 * measured here rather than assumed: dnnl_sgemm on 2048^3, best of a few.
 *
 * usage: bench_train [--model resnet18] [--batch 128] [--image-size 32]
 *                    [--classes 10] [--in-channels 3] [--small-stem]
 *                    [--warmup 3] [--steps 10] [--seconds 0] [--threads 0]
 *                    [--no-peak] [--quiet] [--precision fp32|bf16]
 *                    [--device cpu|cuda|cuda:N] [--profile N] [--cudnn-benchmark]
 * --cudnn-benchmark (GPU): convolution algorithms by cuDNN's timed search
 * (train's flag of that name; PyTorch's cudnn.benchmark).
 * --profile N (GPU): after the timed steps, N more under the CUDA backend's
 * profiler, then its table: GPU time per kind of work (each kernel, cuDNN
 * convolution and cuBLASLt product), per step.
 * --seconds S: run timed steps until S seconds have passed (at least
 * --steps of them). --precision bf16: the linear layers' matmuls take bf16
 * operands (fp32 accumulation; nn.h), fp32 where the CPU lacks avx512_bf16.
 * The last line is one machine-readable "RESULT ..." line.
 *
 * Besides wall-clock images/s it reports "CPU images/s": images per
 * CPU-second of this process times the thread count, i.e. the speed the run
 * would have with its cores to itself. On a shared machine the wall clock
 * measures the neighbours as much as the program; CPU time does not, as
 * long as idle threads sleep instead of spinning (OMP_WAIT_POLICY=passive,
 * which bench/train_vs_pytorch.sh sets for both engines). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "visc/core.h"
#include "visc/cpu.h"
#include "visc/gpu.h"
#include "visc/model.h"
#include "visc/nn.h"
#include "visc/optim.h"
#include "visc/rng.h"

typedef struct {
    visc_model_config model;
    int warmup, steps, threads, peak, quiet, profile, cudnn_benchmark;
    double seconds;
    visc_precision precision;
    char device[16]; /* cpu | cuda | cuda:N */
} options;

static void usage(void) {
    fprintf(stderr, "usage: bench_train [--model NAME] [--batch N] [--image-size PX] "
                    "[--classes K] [--in-channels C] [--small-stem] [--warmup N] [--steps N] "
                    "[--seconds S] [--threads N] [--no-peak] [--quiet] [--precision fp32|bf16] "
                    "[--device cpu|cuda|cuda:N] [--profile N] [--cudnn-benchmark]\n");
    exit(2);
}

static int int_arg(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) usage();
    char *end;
    long v = strtol(argv[++*i], &end, 10);
    if (*end || v < 0 || v > 1000000) visc_die("bad value '%s' for %s", argv[*i], argv[*i - 1]);
    return (int)v;
}

static options parse(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    snprintf(o.model.arch, sizeof o.model.arch, "resnet18");
    o.model.batch = 128, o.model.image_size = 32, o.model.num_classes = 10;
    o.model.in_channels = 3;
    o.warmup = 3, o.steps = 10, o.peak = 1;
    snprintf(o.device, sizeof o.device, "cpu");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model") && i + 1 < argc)
            snprintf(o.model.arch, sizeof o.model.arch, "%s", argv[++i]);
        else if (!strcmp(a, "--batch")) o.model.batch = int_arg(argc, argv, &i);
        else if (!strcmp(a, "--image-size")) o.model.image_size = int_arg(argc, argv, &i);
        else if (!strcmp(a, "--classes")) o.model.num_classes = int_arg(argc, argv, &i);
        else if (!strcmp(a, "--in-channels")) o.model.in_channels = int_arg(argc, argv, &i);
        else if (!strcmp(a, "--small-stem")) o.model.small_stem = 1;
        else if (!strcmp(a, "--warmup")) o.warmup = int_arg(argc, argv, &i);
        else if (!strcmp(a, "--steps")) o.steps = int_arg(argc, argv, &i);
        else if (!strcmp(a, "--threads")) o.threads = int_arg(argc, argv, &i);
        else if (!strcmp(a, "--seconds") && i + 1 < argc) o.seconds = atof(argv[++i]);
        else if (!strcmp(a, "--no-peak")) o.peak = 0;
        else if (!strcmp(a, "--quiet")) o.quiet = 1;
        else if (!strcmp(a, "--profile")) o.profile = int_arg(argc, argv, &i);
        else if (!strcmp(a, "--cudnn-benchmark")) o.cudnn_benchmark = 1;
        else if (!strcmp(a, "--device") && i + 1 < argc)
            snprintf(o.device, sizeof o.device, "%s", argv[++i]);
        else if (!strcmp(a, "--precision") && i + 1 < argc) {
            if (visc_parse_precision(argv[++i], &o.precision)) visc_die("%s", visc_last_error());
        } else usage();
    }
    if (o.model.batch < 1 || o.model.image_size < 1 || o.model.num_classes < 1 ||
        o.model.in_channels < 1 || o.steps < 1)
        visc_die("batch, image size, classes, in-channels and steps must be positive");
    return o;
}

/* dnnl_sgemm GFLOP/s on n^3: the machine's practical fp32 peak. */
static double sgemm_peak(int n) {
    size_t nn = (size_t)n * n;
    float *a = visc_alloc_aligned(nn * sizeof(float), "sgemm a");
    float *b = visc_alloc_aligned(nn * sizeof(float), "sgemm b");
    float *c = visc_alloc_aligned(nn * sizeof(float), "sgemm c");
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    double best = 1e30;
    for (int r = 0; r < 4; r++) { /* the first call warms up; best of the rest */
        double t0 = visc_now();
        VISC_DNNL(dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n));
        double t = visc_now() - t0;
        if (r > 0 && t < best) best = t;
    }
    visc_free_aligned(a), visc_free_aligned(b), visc_free_aligned(c);
    return 2.0 * n * n * (double)n / best * 1e-9;
}

/* CPU seconds used by all threads of this process. */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { PH_FWD, PH_LOSS, PH_BWD, PH_OPT, PH_COUNT };
static const char *const phase_names[PH_COUNT] = {"forward", "loss", "backward", "optimizer"};

/* What one step works on: the model, its optimizer, the batch (on the GPU
 * too, with the loss and its gradient there). */
typedef struct {
    visc_model *m;
    visc_cuda *gpu;
    visc_optimizer *opt;
    visc_gpu_optim *gopt;
    const float *x;
    const int32_t *y;
    float *probs, *dlogits;
    float *dev_x, *dev_probs, *dev_dlogits, *dev_loss;
    int32_t *dev_y;
    float loss; /* the CPU's; the GPU's stays in dev_loss */
} bench_step;

/* One training step; the end of each phase into t[0..PH_COUNT] (t[0] its
 * start). On a GPU the phases end when its work is done if `wait`, else
 * when the host has queued it. */
static void train_step(bench_step *b, double t[PH_COUNT + 1], int wait) {
    visc_model *m = b->m;
    const int B = m->cfg.batch, K = m->cfg.num_classes;
    const float lr = 0.01f;
    t[0] = visc_now();
    m->forward(m, b->gpu ? b->dev_x : b->x, 1);
    t[1] = visc_now();
    if (b->gpu) {
        visc_gpu_softmax_xent(b->gpu, b->dev_loss, b->dev_probs, b->dev_dlogits, m->dev_logits,
                              b->dev_y, B, K, 0.0f);
    } else {
        b->loss = visc_softmax_xent_forward(b->probs, m->logits, b->y, B, K, 0.0f);
        visc_softmax_xent_backward(b->dlogits, b->probs, b->y, B, K, 0.0f);
    }
    t[2] = visc_now();
    m->backward(m, b->gpu ? b->dev_dlogits : b->dlogits);
    if (b->gpu && wait && visc_gpu_sync(b->gpu)) visc_die("%s", visc_last_error());
    t[3] = visc_now();
    if (b->gopt) {
        if (visc_gpu_optim_step(b->gopt, b->opt, m->dev_params, m->dev_grads, lr) ||
            (wait && visc_gpu_sync(b->gpu)))
            visc_die("%s", visc_last_error());
    } else {
        visc_optimizer_step(b->opt, m->params.data, m->grads, lr);
    }
    t[4] = visc_now();
}

int main(int argc, char **argv) {
    options o = parse(argc, argv);
    if (o.threads > 0) visc_set_num_threads(o.threads);
    const visc_model_config *mc = &o.model;
    int B = mc->batch, K = mc->num_classes;

    int gpu_index;
    if (visc_parse_device(o.device, &gpu_index)) visc_die("%s", visc_last_error());
    o.model.for_gpu = gpu_index >= 0;
    visc_cuda *gpu = NULL;
    size_t mem0 = 0, mem1 = 0;
    if (gpu_index >= 0) { /* the GPU's precision, whatever the host CPU has */
        gpu = visc_gpu_open(gpu_index);
        if (!gpu || visc_gpu_memory_used(gpu, &mem0)) visc_die("%s", visc_last_error());
        visc_gpu_set_precision(gpu, o.precision);
        visc_gpu_set_conv_benchmark(gpu, o.cudnn_benchmark);
    } else {
        o.precision = visc_set_matmul_precision(o.precision);
    }
    double peak = o.peak && !gpu ? sgemm_peak(2048) : 0;

    double t_create = visc_now();
    visc_model *m = visc_model_create(mc, 1);
    if (!m || (gpu && visc_model_to_gpu(m, gpu))) visc_die("%s", visc_last_error());
    t_create = visc_now() - t_create;

    /* A fixed random batch: N(0,1) pixels, uniform labels. */
    size_t nx = (size_t)B * mc->in_channels * mc->image_size * mc->image_size;
    float *x = visc_alloc_aligned(nx * sizeof(float), "bench images");
    int32_t *y = visc_malloc((size_t)B * sizeof(int32_t), "bench labels");
    float *probs = visc_malloc((size_t)B * K * sizeof(float), "bench probs");
    float *dlogits = visc_malloc((size_t)B * K * sizeof(float), "bench dlogits");
    visc_rng r = visc_rng_make(7, VISC_STREAM_AUGMENT, 0);
    for (size_t i = 0; i < nx; i++) x[i] = visc_rng_normal(&r);
    for (int i = 0; i < B; i++) y[i] = (int32_t)visc_rng_below(&r, (uint32_t)K);
    /* On a GPU the batch, the labels and the loss stay on the device, as in
     * PyTorch's benchmark (torch_train_gpu.py): the step is measured, not
     * the bus. */
    float *dev_x = NULL, *dev_probs = NULL, *dev_dlogits = NULL, *dev_loss = NULL;
    int32_t *dev_y = NULL;
    if (gpu) {
        dev_x = visc_gpu_alloc(gpu, nx * sizeof(float));
        dev_y = visc_gpu_alloc(gpu, (size_t)B * sizeof(int32_t));
        dev_probs = visc_gpu_alloc(gpu, (size_t)B * K * sizeof(float));
        dev_dlogits = visc_gpu_alloc(gpu, (size_t)B * K * sizeof(float));
        dev_loss = visc_gpu_alloc(gpu, sizeof(float));
        if (!dev_x || !dev_y || !dev_probs || !dev_dlogits || !dev_loss)
            visc_die("%s", visc_last_error());
        visc_gpu_upload(gpu, dev_x, x, nx * sizeof(float));
        visc_gpu_upload(gpu, dev_y, y, (size_t)B * sizeof(int32_t));
        m->io_on_device = 1;
    }

    visc_opt_config oc = visc_opt_defaults(VISC_OPT_SGD);
    oc.momentum = 0.9f;
    visc_optimizer opt;
    visc_optimizer_init(&opt, &oc, &m->params);
    visc_gpu_optim *gopt = gpu ? visc_gpu_optim_create(gpu, &opt) : NULL;
    if (gpu && !gopt) visc_die("%s", visc_last_error());
    if (o.profile && !gpu) visc_die("--profile times the GPU's work: it needs --device cuda");
    bench_step bs = {m,       gpu,   &opt,      gopt,        x,        y,     probs,
                     dlogits, dev_x, dev_probs, dev_dlogits, dev_loss, dev_y, 0.0f};

    if (!o.quiet)
        printf("visc %s batch %d %dpx %d classes%s, %d threads, %s matmuls, %.2fM params, "
               "%.3f GFLOP/image forward (model created in %.2f s)%s%s\n",
               mc->arch, B, mc->image_size, K, mc->small_stem ? " small stem" : "",
               visc_num_threads(), visc_precision_name(o.precision), m->params.total * 1e-6,
               m->flops_per_image * 1e-9, t_create, gpu ? ", on " : "", gpu ? o.device : "");

    double phase[PH_COUNT] = {0};
    float loss = 0;
    int timed = 0;
    double t_timed = 0, t_first = 0, cpu_timed = 0, t_start = 0;
    for (int step = 0;; step++) {
        int warm = step < o.warmup;
        if (!warm && timed >= o.steps && t_timed >= o.seconds) break;
        if (!warm && timed == 0) t_start = visc_now(); /* the warm-up waited: the GPU is idle */
        double c0 = cpu_seconds(), t[PH_COUNT + 1];
        /* On a GPU the timed steps are queued back to back, as PyTorch's
         * benchmark runs them (torch_train_gpu.py): the clock stops when
         * the last one is done, and the phases are not timed (--profile
         * says where the time goes). */
        train_step(&bs, t, !gpu || warm);
        if (step == 0) t_first = t[PH_COUNT] - t[0];
        if (warm) continue;
        for (int p = 0; p < PH_COUNT; p++) phase[p] += t[p + 1] - t[p];
        t_timed = gpu ? visc_now() - t_start : t_timed + t[PH_COUNT] - t[0];
        cpu_timed += cpu_seconds() - c0;
        timed++;
    }
    if (gpu) {
        if (visc_gpu_sync(gpu)) visc_die("%s", visc_last_error());
        t_timed = visc_now() - t_start;
    }
    loss = bs.loss;
    if (gpu) visc_gpu_download(gpu, &loss, dev_loss, sizeof loss);
    double ips = timed * B / t_timed;
    double gflops = 3.0 * m->flops_per_image * ips * 1e-9;
    double cpu_ips = timed * B / (cpu_timed / visc_num_threads());
    if (!o.quiet) {
        printf("first step %.2f s (kernel creation), %d timed steps, loss %.4f\n", t_first, timed,
               loss);
        if (!gpu) {
            printf("  %-10s %9s %7s\n", "phase", "ms/step", "share");
            for (int p = 0; p < PH_COUNT; p++)
                printf("  %-10s %9.2f %6.1f%%\n", phase_names[p], phase[p] / timed * 1e3,
                       100.0 * phase[p] / t_timed);
        }
        printf("%.1f img/s, %.1f ms/step, %.1f GFLOP/s", ips, t_timed / timed * 1e3, gflops);
        if (peak > 0) printf(" = %.0f%% of sgemm peak %.1f GFLOP/s", 100 * gflops / peak, peak);
        printf("\n");
        printf("CPU time %.1f ms/step over %d threads: %.1f img/s with the cores to itself "
               "(%.1f GFLOP/s)\n",
               cpu_timed / timed * 1e3, visc_num_threads(), cpu_ips,
               3.0 * m->flops_per_image * cpu_ips * 1e-9);
    }
    if (o.profile) { /* after the timed steps: the profiler's waits do not slow those */
        double t[PH_COUNT + 1];
        if (visc_gpu_profile_start(gpu)) visc_die("%s", visc_last_error());
        for (int step = 0; step < o.profile; step++) train_step(&bs, t, 0);
        if (visc_gpu_profile_report(gpu, stdout, o.profile)) visc_die("%s", visc_last_error());
    }
    /* Device memory: the most the run's buffers held (PyTorch's
     * max_memory_allocated measure, which torch_train_gpu.py reports), and
     * what the run added to what the device held before the model (the
     * libraries' code and the driver's rounding too). */
    size_t held_peak = 0;
    if (gpu && visc_gpu_memory_used(gpu, &mem1)) visc_die("%s", visc_last_error());
    if (gpu) visc_gpu_memory_allocated(gpu, NULL, &held_peak);
    const double mem_mib = (double)held_peak / 1048576.0;
    const double device_mib = gpu ? (double)(mem1 - mem0) / 1048576.0 : 0.0;
    if (gpu && !o.quiet)
        printf("device memory: %.0f MiB of buffers at most, %.0f MiB held in all\n", mem_mib,
               device_mib);
    printf("RESULT engine=visc model=%s batch=%d res=%d img_s=%.2f ms_step=%.2f gflops=%.1f "
           "peak=%.1f cpu_img_s=%.2f threads=%d fwd_ms=%.2f bwd_ms=%.2f opt_ms=%.2f steps=%d "
           "precision=%s device=%s mem_mib=%.0f device_mib=%.0f\n",
           mc->arch, B, mc->image_size, ips, t_timed / timed * 1e3, gflops, peak, cpu_ips,
           visc_num_threads(), gpu ? NAN : phase[PH_FWD] / timed * 1e3,
           gpu ? NAN : phase[PH_BWD] / timed * 1e3, gpu ? NAN : phase[PH_OPT] / timed * 1e3, timed,
           visc_precision_name(o.precision), o.device, mem_mib, device_mib);

    visc_gpu_optim_free(gopt);
    visc_gpu_free(gpu, dev_x), visc_gpu_free(gpu, dev_y), visc_gpu_free(gpu, dev_probs);
    visc_gpu_free(gpu, dev_dlogits), visc_gpu_free(gpu, dev_loss);
    visc_optimizer_free(&opt);
    visc_free_aligned(x);
    free(y), free(probs), free(dlogits);
    visc_model_destroy(m);
    visc_gpu_close(gpu);
    return 0;
}

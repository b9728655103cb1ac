/* bench_kernels.c: achieved GFLOP/s of the compute kernels, to compare with
 * the machine's fp32 peak: dnnl_sgemm at 2048^3, then conv2d forward,
 * backward-data and backward-weights for ResNet-50's main shapes (batch 16,
 * 224 px) and small-ResNet shapes (batch 128), with oneDNN's blocked
 * layouts and with plain NCHW.
 *
 * usage: bench_kernels [seconds per measurement, default 0.3] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/cpu.h"
#include "visc/nn.h"

static double min_time = 0.3;

/* Seconds per call: one warm-up call, then repeat until min_time has passed. */
#define TIME_IT(result, stmt)                                                                      \
    do {                                                                                           \
        stmt;                                                                                      \
        int reps_ = 0;                                                                             \
        double t0_ = visc_now(), t_;                                                               \
        do {                                                                                       \
            stmt;                                                                                  \
            reps_++;                                                                               \
        } while ((t_ = visc_now() - t0_) < min_time || reps_ < 2);                                 \
        result = t_ / reps_;                                                                       \
    } while (0)

static float *buffer(size_t n) {
    float *p = visc_alloc_aligned(n * sizeof(float), "bench buffer");
    for (size_t i = 0; i < n; i++) p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return p;
}

static void bench_sgemm(int n) {
    float *a = buffer((size_t)n * n), *b = buffer((size_t)n * n), *c = buffer((size_t)n * n);
    double t;
    TIME_IT(t, VISC_DNNL(dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, b, n, 0.0f, c, n)));
    printf("sgemm %dx%dx%d: %.1f ms, %.1f GFLOP/s\n\n", n, n, n, t * 1e3,
           2.0 * n * n * n / t * 1e-9);
    visc_free_aligned(a), visc_free_aligned(b), visc_free_aligned(c);
}

typedef struct {
    const char *name;
    int N, C, H, K, R, stride, pad;
} conv_case;

static double total_flops[2], total_time[2];

static void bench_conv(const conv_case *k, int blocked) {
    setenv("VISC_CONV_LAYOUT", blocked ? "blocked" : "plain", 1);
    visc_conv2d c;
    double t_init = visc_now();
    visc_conv2d_init(&c, k->N, k->C, k->H, k->H, k->K, k->R, k->R, k->stride, k->pad, 1, 1, 0);
    t_init = visc_now() - t_init;
    size_t nin = (size_t)c.N * c.C * c.H * c.W, nout = (size_t)c.N * c.K * c.P * c.Q;
    size_t nw = (size_t)c.K * c.C * c.R * c.S;
    float *in = buffer(nin), *out = buffer(nout), *w = buffer(nw), *din = buffer(nin),
          *dw = buffer(nw);
    double f = visc_conv2d_flops(&c), tf, tb, tw;
    TIME_IT(tf, visc_conv2d_forward(&c, out, in, w, NULL));
    TIME_IT(tw, visc_conv2d_backward(&c, NULL, dw, NULL, out, in, w));
    TIME_IT(tb, visc_conv2d_backward(&c, din, dw, NULL, out, in, w));
    printf("%-26s %-7s fwd %6.1f  bwd_w %6.1f  bwd(data+w) %6.1f  fwd+bwd %6.1f GFLOP/s  "
           "(%.1f ms/step, init %.0f ms)\n",
           k->name, blocked ? "blocked" : "nchw", f / tf * 1e-9, f / tw * 1e-9, 2 * f / tb * 1e-9,
           3 * f / (tf + tb) * 1e-9, (tf + tb) * 1e3, t_init * 1e3);
    total_flops[blocked] += 3 * f;
    total_time[blocked] += tf + tb;
    visc_conv2d_destroy(&c);
    visc_free_aligned(in), visc_free_aligned(out), visc_free_aligned(w), visc_free_aligned(din),
        visc_free_aligned(dw);
}

int main(int argc, char **argv) {
    if (argc > 1) min_time = atof(argv[1]);
    printf("threads: %d\n", visc_num_threads());
    bench_sgemm(2048);
    static const conv_case cases[] = {
        {"r50 stem 7x7/2 3>64", 16, 3, 224, 64, 7, 2, 3},
        {"r50 l1 1x1 64>64", 16, 64, 56, 64, 1, 1, 0},
        {"r50 l1 3x3 64", 16, 64, 56, 64, 3, 1, 1},
        {"r50 l1 1x1 64>256", 16, 64, 56, 256, 1, 1, 0},
        {"r50 l1 1x1 256>64", 16, 256, 56, 64, 1, 1, 0},
        {"r50 l2 down 1x1/2 256>512", 16, 256, 56, 512, 1, 2, 0},
        {"r50 l2 3x3 128", 16, 128, 28, 128, 3, 1, 1},
        {"r50 l2 1x1 512>128", 16, 512, 28, 128, 1, 1, 0},
        {"r50 l2 1x1 128>512", 16, 128, 28, 512, 1, 1, 0},
        {"r50 l3 3x3 256", 16, 256, 14, 256, 3, 1, 1},
        {"r50 l3 1x1 1024>256", 16, 1024, 14, 256, 1, 1, 0},
        {"r50 l3 1x1 256>1024", 16, 256, 14, 1024, 1, 1, 0},
        {"r50 l4 3x3 512", 16, 512, 7, 512, 3, 1, 1},
        {"r50 l4 1x1 2048>512", 16, 2048, 7, 512, 1, 1, 0},
        {"r50 l4 1x1 512>2048", 16, 512, 7, 2048, 1, 1, 0},
        {"small 3x3 3>16 @28", 128, 3, 28, 16, 3, 1, 1},
        {"small 3x3 16 @28", 128, 16, 28, 16, 3, 1, 1},
        {"small 3x3 32 @14", 128, 32, 14, 32, 3, 1, 1},
        {"small 3x3/2 16>32", 128, 16, 28, 32, 3, 2, 1},
        {"small 3x3 64 @7", 128, 64, 7, 64, 3, 1, 1},
    };
    /* VISC_CONV_LAYOUT=plain|blocked measures only that layout. */
    const char *env = getenv("VISC_CONV_LAYOUT");
    int only = !env ? -1 : strcmp(env, "plain") == 0 ? 0 : 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int blocked = 1; blocked >= 0; blocked--) {
            if (only >= 0 && only != blocked) continue;
            bench_conv(&cases[i], blocked);
        }
    for (int blocked = 1; blocked >= 0; blocked--)
        if (total_time[blocked] > 0)
            printf("all shapes, %s: %.1f GFLOP/s\n", blocked ? "blocked" : "nchw",
                   total_flops[blocked] / total_time[blocked] * 1e-9);
    return 0;
}

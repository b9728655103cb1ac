/* test_cuda_model.c: whole models on the GPU against the same models on the
 * CPU: the same weights (one seed), the same batch, the same steps.
 *
 * For each architecture with a GPU path, two copies are made; one moves to
 * the GPU (visc_model_to_gpu). Then, on both:
 *   - a training forward: logits;
 *   - backward from the CPU's dlogits (so only backward differs): every
 *     parameter's gradient, tensor by tensor;
 *   - the BatchNorm running statistics the forward updated;
 *   - the optimizer's step (SGD with Nesterov momentum and weight decay, the
 *     default recipe): the weights; then four more steps in lock-step, each
 *     from the CPU's weights (see the loop): the weights, the momentum and
 *     the running statistics after the fifth;
 *   - an evaluation forward with the running statistics.
 * Tolerances: the CPU runs oneDNN's fp32 convolutions, the GPU cuDNN's fp32
 * ones (FMA, no TF32), which add in other orders; through 20-50 layers with
 * BatchNorm the relative difference of a tensor stays near 1e-5. A tensor
 * passes when ||gpu - cpu|| <= 1e-3 ||cpu|| (2e-3 after five steps), and the
 * logits also elementwise within 1e-3 of the largest |logit|.
 * Some tensors are worse conditioned than that, whatever adds them up: in
 * ResNet-20 the gradients from layer1.2 back to the stem differ by 1.7e-3
 * between two fp32 runs of the CPU itself (oneDNN's blocked convolutions
 * against its plain ones), against ~2e-6 from layer2.0 on. (The gradient
 * that reaches layer1's output is the transposed convolutions of BatchNorm
 * gradients, whose per-channel sums are 0, so the sums taken from it
 * cancel.) So a third model, the CPU twin, runs every step with the other
 * convolution layout, and a tensor's limit is the larger of the fixed one
 * and TWIN_FACTOR times the twin's own difference from the CPU: rounding
 * is let through where rounding is shown to be that large, and nowhere
 * else.
 * Deeper, no twin helps: ResNet-50 at its initialization is chaotic, its
 * gradients moved by about 2% by one rounding of the input, on either side; it
 * is compared with its residual branches scaled down
 * (scale_residual_branches), where they move by about 1e-6.
 * Two transformers and a ResNet again with --precision bf16 on both
 * sides: the linear layers' products with bf16 operands, and on the GPU the
 * ResNet's activations in bf16 channels-last, its convolutions on bf16
 * operands, and attention's products on tensor cores with Q, K, V, the
 * probabilities and their gradients rounded to bf16 (the CPU's stay fp32:
 * ViT-pico's gradients then part by about 1%). A bf16 rounding that tips
 * the other way on one side moves a value by 2^-8 of itself, so every
 * limit is 20 times wider there. The ResNets in bf16 are compared on what is
 * well-conditioned: the logits, the running statistics and the weights
 * after one step, each table as a whole. Their gradients are not: bf16
 * convolution outputs and gradients go through BatchNorm, which subtracts
 * the batch means, so over these small batches most of the relative
 * difference of a gradient is its rounding, and the runs part after a few
 * steps. That they train alike is tests/e2e_cuda.sh's (and
 * e2e_gpu_standin.sh's) bf16 training run.
 *
 * Built with the stand-in GPU (tests/gpu/cpu_standin.c: the CPU layers on
 * host memory) as test_gpu_standin, every limit is 0: the GPU code path
 * with the CPU's kernels must give the CPU's bits, which checks the
 * plumbing (buffers, copies, the optimizer's state) where there is no GPU.
 *
 * Prints "ok"/"FAIL" lines and "N passed, N failed"; exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/cuda.h"
#include "visc/gpu.h"
#include "visc/loader.h"
#include "visc/model.h"
#include "visc/nn.h"
#include "visc/optim.h"

static int passed, failed;
/* How much more than the CPU's own fp32 spread (the twin's) the GPU may
 * differ: its convolutions add in other orders again, and cuDNN's
 * Winograd and FFT algorithms round more than a direct sum. */
#define TWIN_FACTOR 8.0
/* A tensor on which the CPU's two runs differ by more than this is left out
 * of a comparison (and counted on its line): no limit can tell a GPU's
 * rounding from a fault there. More than half of a table left out fails. */
#define TWIN_CHAOTIC 1e-2
static double tol_scale = 1.0; /* 20 in bf16 */
/* Whether both sides multiply the same operands: not a ResNet in bf16,
 * whose convolutions take bf16 operands on the GPU only (the CPU's bf16
 * mode leaves them fp32). The stand-in must give the CPU's bits when they
 * do. */
static int same_products = 1;

#ifdef VISC_GPU_STANDIN
#define LIMIT(x) (same_products ? 0.0 : (x)*tol_scale)
#else
#define LIMIT(x) ((x)*tol_scale)
#endif

static void result(int ok, const char *fmt, const char *arch, const char *what, double value,
                   double limit) {
    printf("%s %s %s: ", ok ? "ok  " : "FAIL", arch, what);
    printf(fmt, value, limit);
    putchar('\n');
    if (ok) passed++;
    else failed++;
}

/* ||g - c|| / max(||c||, floor) over n values; a NaN anywhere makes it NaN. */
static double rel_error_floor(const float *g, const float *c, size_t n, double floor) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)g[i] - c[i]) * ((double)g[i] - c[i]);
        s += (double)c[i] * c[i];
    }
    const double scale = fmax(sqrt(s), floor);
    return scale > 0 ? sqrt(d) / scale : sqrt(d);
}
static double rel_error(const float *g, const float *c, size_t n) {
    return rel_error_floor(g, c, n, 0.0);
}

/* The least norm a tensor of a table is measured against, as a share of
 * the table's norm at the tensor's size (RMS x sqrt(numel)): a tensor whose
 * values are zero in exact arithmetic holds rounding alone, whose relative
 * error says nothing (CaiT's class-attention key bias: q . b adds the same
 * to every score of a row, which the softmax takes away, so its gradient
 * is 1e-12-sized noise on the CPU and bf16-sized on the GPU). */
#define TENSOR_FLOOR 1e-4

/* The limit for one comparison: `limit`, widened to TWIN_FACTOR times the
 * twin's difference from the CPU where a twin ran (not on the stand-in). */
static double widened(double limit, double twin_error) {
    return limit > 0 ? fmax(limit, TWIN_FACTOR * twin_error) : limit;
}

/* Every tensor of a table (params or buffers) within its limit (`limit`,
 * widened by the twin's values where `twin` is not NULL); one line for the
 * tensor that used most of its limit. With `as_one`, the error of the
 * whole table instead: for a ResNet with bf16 convolutions on one side
 * only (a BatchNorm bias's gradient is a sum of terms that nearly cancel,
 * so its own relative error is that of bf16 over its tiny size, and says
 * nothing about the step), and for ResNet-50's later steps (model_cases). */
static void expect_tables(const char *arch, const char *what, const visc_table *t, const float *gpu,
                          const float *cpu, const float *twin, double limit, int as_one) {
    char label[256];
    if (as_one) {
        snprintf(label, sizeof label, "%s (%d tensors, as one)", what, t->count);
        const double r = rel_error(gpu, cpu, t->total);
        const double lim = twin ? widened(limit, rel_error(twin, cpu, t->total)) : limit;
        result(r <= lim, "relative error %.3g (limit %.3g)", arch, label, r, lim);
        return;
    }
    double worst = 0, worst_limit = limit, worst_share = 0, table_ss = 0;
    int at = 0, left_out = 0;
    for (size_t i = 0; i < t->total; i++) table_ss += (double)cpu[i] * cpu[i];
    for (int i = 0; i < t->count; i++) {
        const visc_tensor_entry *e = &t->entries[i];
        const double floor =
            TENSOR_FLOOR * sqrt(table_ss * (double)e->numel / (double)(t->total ? t->total : 1));
        const double r = rel_error_floor(gpu + e->offset, cpu + e->offset, e->numel, floor);
        const double spread = twin ? rel_error(twin + e->offset, cpu + e->offset, e->numel) : 0;
        const double lim = widened(limit, spread);
        if (getenv("VISC_TEST_VERBOSE"))
            printf("     %s %s %s: relative error %.3g (limit %.3g; the CPU's two runs: %.3g)\n",
                   arch, what, e->name, r, lim, spread);
        if (spread > TWIN_CHAOTIC) {
            left_out++;
            continue;
        }
        /* the share of its limit; NaN, or anything over a limit of 0, is infinite */
        const double share = r <= 0 ? 0 : lim > 0 ? r / lim : INFINITY;
        if (!(share <= worst_share)) {
            worst_share = share;
            worst = r;
            worst_limit = lim;
            at = i;
        }
    }
    char out[96] = "";
    if (left_out)
        snprintf(out, sizeof out, "; %d left out, where the CPU's two runs differ by over %g",
                 left_out, TWIN_CHAOTIC);
    snprintf(label, sizeof label, "%s (%d tensors, closest to its limit: %s%s)", what, t->count,
             t->count ? t->entries[at].name : "-", out);
    result(worst <= worst_limit && 2 * left_out <= t->count, "relative error %.3g (limit %.3g)",
           arch, label, worst, worst_limit);
}

/* Logits within 1e-3 of the largest |logit| elementwise and 1e-3 as a
 * whole, each widened by the twin's logits where `twin` is not NULL. */
static void expect_logits(const char *arch, const char *what, const float *g, const float *c,
                          const float *twin, size_t n) {
    double big = 0, worst = 0, twin_worst = 0;
    for (size_t i = 0; i < n; i++) big = fmax(big, fabs(c[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)g[i] - c[i]);
        if (!(e <= worst)) worst = e;
        if (twin) twin_worst = fmax(twin_worst, fabs((double)twin[i] - c[i]));
    }
    const double lim = widened(LIMIT(1e-3) * big, twin_worst);
    result(worst <= lim, "largest difference %.3g (limit %.3g)", arch, what, worst, lim);
    const double rel_lim = widened(LIMIT(1e-3), twin ? rel_error(twin, c, n) : 0);
    result(rel_error(g, c, n) <= rel_lim, "relative error %.3g (limit %.3g)", arch, what,
           rel_error(g, c, n), rel_lim);
}

static void fill(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

/* Two models with the same weights; the second on the GPU, the first too
 * when both_on_gpu. -1 (counted as a failure) when either cannot be built. */
static int model_pair(visc_cuda *ctx, const visc_model_config *cfg, const char *arch,
                      int both_on_gpu, visc_model **a, visc_model **b) {
    *a = visc_model_create(cfg, 7);
    *b = visc_model_create(cfg, 7);
    if (*a && *b && !(both_on_gpu && visc_model_to_gpu(*a, ctx)) && !visc_model_to_gpu(*b, ctx))
        return 0;
    printf("FAIL %s: cannot build or move the model: %s\n", arch, visc_last_error());
    failed++;
    if (*a) visc_model_destroy(*a);
    if (*b) visc_model_destroy(*b);
    return -1;
}

/* The CPU twin: the same model and weights, its convolutions oneDNN's
 * plain (NCHW) ones where the CPU model's chose blocked layouts. NULL on
 * the stand-in, whose limits are all 0. */
static visc_model *cpu_twin(const visc_model_config *cfg) {
#ifdef VISC_GPU_STANDIN
    (void)cfg;
    return NULL;
#else
    const char *env = getenv("VISC_CONV_LAYOUT");
    char *was = env ? strdup(env) : NULL;
    setenv("VISC_CONV_LAYOUT", "plain", 1); /* read as each convolution is set up */
    visc_model *twin = visc_model_create(cfg, 7);
    if (was) setenv("VISC_CONV_LAYOUT", was, 1);
    else unsetenv("VISC_CONV_LAYOUT");
    free(was);
    return twin;
#endif
}

/* The CPU's weights and running statistics on the GPU model and the twin
 * (each keeps its own optimizer state). */
static int take_cpu_weights(const visc_model *cpu, visc_model *gpu, visc_model *twin) {
    visc_model *sides[2] = {gpu, twin};
    for (int k = 0; k < 2; k++) {
        if (!sides[k]) continue;
        memcpy(sides[k]->params.data, cpu->params.data, cpu->params.total * sizeof(float));
        memcpy(sides[k]->buffers.data, cpu->buffers.data, cpu->buffers.total * sizeof(float));
    }
    return visc_model_upload(gpu);
}

/* Why ResNet-50 is compared with its residual branches scaled down
 * (visc_resnet_scale_branches): at its initialization (scale 1) a deep
 * ResNet with BatchNorm is chaotic in its gradients (Yang et al. 2019, "A
 * mean field theory of batch normalization"): in ResNet-50 at batch 4 a
 * relative change of 1e-7 in the input, one rounding, moves the gradients
 * by about 2%, and the CPU's own two layouts differ by as much, so no limit
 * can tell the GPU's rounding from a fault. With every branch's last
 * BatchNorm scale at 0.05 the same change moves them by about 1e-6
 * (tools/diag/grad_sensitivity.c measures this; README, GPU section). A
 * small scale is what timm's zero_init_last (0) and SkipInit use; unlike 0
 * it leaves every branch its gradient. */
static void scale_residual_branches(visc_model *m, float gamma) {
    if (visc_resnet_scale_branches(m, gamma)) {
        printf("FAIL %s: %s\n", m->cfg.arch, visc_last_error());
        failed++;
    }
}

/* One model's comparison: what check_model builds and how it steps. */
typedef struct {
    const char *arch;
    int image, channels, classes, batch;
    int small_stem;
    float drop_path;
    /* 0 leaves the initialization as it is; else scale_residual_branches,
     * set on the CPU's model and taken by the others before the first step */
    float branch_gamma;
    float lr; /* the SGD steps'; 0 is 0.1 */
    /* 0: the weights and momentum after five steps tensor by tensor, each
     * within 2e-3; else each table as a whole within this (ResNet-50) */
    double later_limit;
    visc_precision precision;
} model_case;

#define FP32 VISC_PRECISION_FP32
#define BF16 VISC_PRECISION_BF16
/* ResNet-50 (bottlenecks, 7x7 stem, max-pool: 50 layers) is kept out of the
 * chaotic regime by its branches' scale, and stepped at lr 0.01 (at 0.1 the
 * branches' scales grow back into it in five steps, and the momentum of
 * layer2 differs by 1e-2). Its first step is compared tensor by tensor
 * (gradients 2.6e-6 from the CPU's on the emulator). Its later steps are
 * not that calm: over four more steps of 50 layers some ReLU input or
 * max-pool pair near a tie tips the other way on one side, which moves the
 * gradients it feeds by up to 4e-3, and the twin need not tip with it. On
 * the emulator the momentum after five steps differed by 1.6e-3 as a whole
 * (3.5e-3 on layer1.1.bn1.weight) with one thread, by 3.7e-4 at most with
 * two. So its weights and momentum after five steps are held as whole
 * tables within 1e-2: what those checks are for, the optimizer's state
 * carried from step to step, is off by far more when it breaks (momentum
 * not kept: the last gradient instead of five, 50% and more), and the
 * other models hold it tensor by tensor. */
static const model_case model_cases[] = {
    /* arch, image, channels, classes, batch, small_stem, drop_path, branch_gamma, lr,
     * later_limit, precision */
    {"resnet20", 32, 3, 10, 16, 0, 0, 0, 0, 0, FP32}, /* CIFAR: basic blocks, small stem */
    {"resnet20", 32, 3, 10, 16, 0, 0, 0, 0, 0, BF16},
    {"resnet18", 32, 1, 10, 8, 1, 0, 0, 0, 0, FP32}, /* one input channel (Fashion-MNIST) */
    {"resnet50", 64, 3, 100, 4, 0, 0, 0.05f, 0.01f, 1e-2, FP32}, /* see above */
    {"resnet14", 28, 1, 10, 64, 0, 0, 0, 0, 0, FP32},            /* the README's model, its batch */
    {"vit_pico_patch4_28", 28, 1, 10, 8, 0, 0, 0, 0, 0, FP32},   /* class token, 6 blocks, D 32 */
    {"vit_pico_patch4_28", 28, 1, 10, 8, 0, 0, 0, 0, 0, BF16},
    {"deit_tiny_patch4_32", 32, 3, 10, 4, 0, 0.3f, 0, 0, 0, FP32}, /* 65 tokens, D 64, drop-path */
    {"swin_micro_patch2_window4_32", 32, 3, 10, 4, 0, 0.2f, 0, 0, 0, FP32}, /* windows, shifts */
    /* its first norm written to windows as the qkv projection's bf16
     * operand; attention's output kept in bf16 for the projection, and
     * backward's dO . O taken from it (as FlashAttention's backward takes
     * its stored output): relative_position_bias_table's gradient is a sum
     * of every window's score gradients that cancels, and its momentum is
     * 4.03% apart after five steps on the emulator (1.49% with the fp32
     * output; gradients 0.56%): the later steps as whole tables, as V2's */
    {"swin_micro_patch2_window4_32", 32, 3, 10, 4, 0, 0.2f, 0, 0, 2e-3, BF16},
    /* cosine attention, the bias MLP */
    {"swinv2_micro_patch2_window4_32", 32, 3, 10, 4, 0, 0.2f, 0, 0, 0, FP32},
    /* in bf16 attention's products are rounded on the GPU only, and V2's
     * logit_scale, whose gradient is a sum over every score that cancels,
     * has its momentum 4% apart after five steps (gradients 0.2%): the
     * later steps as whole tables, as ResNet-50's, within 2e-3 x 20 */
    {"swinv2_micro_patch2_window4_32", 32, 3, 10, 4, 0, 0.2f, 0, 0, 2e-3, BF16},
    /* talking heads, class attention, LayerScale */
    {"cait_xxs24_224", 32, 3, 10, 2, 0, 0.1f, 0, 0, 0, FP32},
    /* q, k, v and the heads' output in bf16, as the projections' operands */
    {"cait_xxs24_224", 32, 3, 10, 2, 0, 0.1f, 0, 0, 0, BF16},
};

/* VISC_TEST_ONLY=arch: the checks of that architecture alone (a diagnosis) */
static int wanted(const char *arch) {
    const char *only = getenv("VISC_TEST_ONLY");
    return !only || strcmp(only, arch) == 0;
}

static void check_model(visc_cuda *ctx, const model_case *mc) {
    const visc_precision precision = mc->precision;
    const char *name = mc->arch;
    const int image = mc->image, channels = mc->channels, classes = mc->classes;
    const int batch = mc->batch;
    const float lr = mc->lr > 0 ? mc->lr : 0.1f;
    if (!wanted(name)) return;
    visc_model_config cfg = {0};
    snprintf(cfg.arch, sizeof cfg.arch, "%s", name);
    /* the label of the result lines */
    char arch[96];
    snprintf(arch, sizeof arch, "%s%s", name, precision == VISC_PRECISION_BF16 ? " bf16" : "");
    /* A CPU without bf16 falls back to fp32 (with a note): then the bf16
     * GPU is held to the fp32 CPU, within the same wide limits. */
    visc_set_matmul_precision(precision);
    visc_gpu_set_precision(ctx, precision);
    tol_scale = precision == VISC_PRECISION_BF16 ? 20.0 : 1.0;
    same_products = precision != VISC_PRECISION_BF16 || strncmp(name, "resnet", 6) != 0;
    /* (after tol_scale and same_products, which LIMIT reads) */
    const double later_limit = LIMIT(mc->later_limit > 0 ? mc->later_limit : 2e-3);
    cfg.num_classes = classes;
    cfg.in_channels = channels;
    cfg.image_size = image;
    cfg.batch = batch;
    cfg.small_stem = mc->small_stem;
    cfg.drop_path_rate = mc->drop_path;
    visc_model *cpu, *gpu;
    if (model_pair(ctx, &cfg, arch, 0, &cpu, &gpu)) return;
    visc_model *twin = cpu_twin(&cfg);
    if (mc->branch_gamma > 0) scale_residual_branches(cpu, mc->branch_gamma);
    const size_t xn = (size_t)batch * channels * image * image, ln = (size_t)batch * classes;
    const size_t P = cpu->params.total;
    float *x = malloc(xn * sizeof(float)), *probs = malloc(ln * sizeof(float));
    float *dlogits = malloc(ln * sizeof(float)), *host = malloc(P * sizeof(float));
    int32_t *labels = malloc((size_t)batch * sizeof(int32_t));
    visc_opt_config oc = visc_opt_defaults(VISC_OPT_SGD);
    oc.momentum = 0.9f;
    oc.nesterov = 1;
    oc.weight_decay = 5e-4f;
    visc_optimizer opt_cpu, opt_gpu, opt_twin = {0};
    visc_optimizer_init(&opt_cpu, &oc, &cpu->params);
    visc_optimizer_init(&opt_gpu, &oc, &gpu->params);
    if (twin) visc_optimizer_init(&opt_twin, &oc, &twin->params);
        /* the twin's tables where it ran, else NULL: a fixed limit */
#define TWIN(member) (twin ? twin->member : NULL)
    visc_gpu_optim *gopt = visc_gpu_optim_create(ctx, &opt_gpu);
    if (!gopt) goto broken;
    /* Five steps in lock-step: each starts from the CPU's weights and
     * running statistics on all three sides, and each side keeps its own
     * momentum. Left to run apart, no two fp32 runs of these ResNets stay
     * comparable: on random inputs and labels the gradients of the first
     * stage are sums that cancel, and weights 1e-6 apart give gradients 1%
     * apart, so the CPU's own two runs (blocked and plain convolutions)
     * part by 3% (lr 0.001) to 86% (lr 0.1) in weights within five steps
     * of SGD. Lock-step keeps what the steps are here
     * for: the GPU's optimizer state carried from step to step. (That the
     * GPU's own trajectory is the CPU's is e2e_gpu_standin.sh's, bit for
     * bit on the stand-in; that it trains, tools/gpu/device_check.sh's.) */
    for (int step = 0; step < 5; step++) {
        if ((step > 0 || mc->branch_gamma > 0) && take_cpu_weights(cpu, gpu, twin)) goto broken;
        fill(x, xn, 100 + (uint64_t)step);
        for (int b = 0; b < batch; b++) labels[b] = (b * 7 + step) % classes;
        cpu->noise_seed = gpu->noise_seed = 1000 + (uint64_t)step; /* drop-path's draws */
        if (twin) twin->noise_seed = cpu->noise_seed;
        cpu->forward(cpu, x, 1);
        gpu->forward(gpu, x, 1);
        if (twin) twin->forward(twin, x, 1);
        visc_softmax_xent_forward(probs, cpu->logits, labels, batch, classes, 0.0f);
        visc_softmax_xent_backward(dlogits, probs, labels, batch, classes, 0.0f);
        if (step == 0)
            expect_logits(arch, "training logits", gpu->logits, cpu->logits, TWIN(logits), ln);
        cpu->backward(cpu, dlogits);
        gpu->backward(gpu, dlogits);
        if (twin) twin->backward(twin, dlogits);
        if (step == 0) {
            visc_gpu_download(ctx, host, gpu->dev_grads, P * sizeof(float));
            if (same_products)
                expect_tables(arch, "gradients", &cpu->params, host, cpu->grads, TWIN(grads),
                              LIMIT(1e-3), 0);
            if (visc_model_download(gpu)) goto broken;
            if (cpu->buffers.count > 0) /* BatchNorm's; the transformers have none */
                expect_tables(arch, "running statistics", &cpu->buffers, gpu->buffers.data,
                              cpu->buffers.data, TWIN(buffers.data), LIMIT(1e-4), !same_products);
        }
        visc_optimizer_step(&opt_cpu, cpu->params.data, cpu->grads, lr);
        if (twin) visc_optimizer_step(&opt_twin, twin->params.data, twin->grads, lr);
        if (visc_gpu_optim_step(gopt, &opt_gpu, gpu->dev_params, gpu->dev_grads, lr)) goto broken;
        if (step == 0 || (step == 4 && same_products)) {
            if (visc_model_download(gpu)) goto broken;
            expect_tables(arch, step == 0 ? "weights after 1 step" : "weights after 5 steps",
                          &cpu->params, gpu->params.data, cpu->params.data, TWIN(params.data),
                          step == 0 ? LIMIT(1e-3) : later_limit,
                          step == 0 ? !same_products : mc->later_limit > 0);
        }
    }
    if (!same_products) goto done;
    if (visc_gpu_optim_download(gopt, &opt_gpu)) goto broken;
    expect_tables(arch, "momentum after 5 steps", &cpu->params, opt_gpu.state, opt_cpu.state,
                  twin ? opt_twin.state : NULL, later_limit, mc->later_limit > 0);
    if (cpu->buffers.count > 0) /* downloaded with the weights after step 5 */
        expect_tables(arch, "running statistics after 5 steps", &cpu->buffers, gpu->buffers.data,
                      cpu->buffers.data, TWIN(buffers.data), LIMIT(2e-3), 0);
    /* Evaluation (BatchNorm on its running statistics), from the CPU's
     * weights and statistics on every side as each step was. */
    if (take_cpu_weights(cpu, gpu, twin)) goto broken;
    cpu->forward(cpu, x, 0);
    gpu->forward(gpu, x, 0);
    if (twin) twin->forward(twin, x, 0);
    expect_logits(arch, "evaluation logits after 5 steps", gpu->logits, cpu->logits, TWIN(logits),
                  ln);
    goto done;
#undef TWIN
broken:
    printf("FAIL %s: %s\n", arch, visc_last_error());
    failed++;
done:
    visc_gpu_optim_free(gopt);
    visc_optimizer_free(&opt_cpu);
    visc_optimizer_free(&opt_gpu);
    if (twin) {
        visc_optimizer_free(&opt_twin);
        visc_model_destroy(twin);
    }
    visc_model_destroy(cpu);
    visc_model_destroy(gpu);
    free(x);
    free(probs);
    free(dlogits);
    free(host);
    free(labels);
}

/* m->io_on_device, bench_train's setting: the batch, the labels, the loss
 * (visc_gpu_softmax_xent) and dlogits on the device, nothing over the bus.
 * One training step must be the host-fed step, and forward must leave the
 * host's logits alone. */
static void check_device_io(visc_cuda *ctx, const char *name, int image, int channels, int classes,
                            int batch) {
    if (!wanted(name)) return;
    visc_set_matmul_precision(VISC_PRECISION_FP32);
    visc_gpu_set_precision(ctx, VISC_PRECISION_FP32);
    tol_scale = 1.0;
    same_products = 1;
    char arch[96];
    snprintf(arch, sizeof arch, "%s, batch and loss on the device,", name);
    visc_model_config cfg = {0};
    snprintf(cfg.arch, sizeof cfg.arch, "%s", name);
    cfg.num_classes = classes;
    cfg.in_channels = channels;
    cfg.image_size = image;
    cfg.batch = batch;
    visc_model *fed, *kept;
    if (model_pair(ctx, &cfg, arch, 1, &fed, &kept)) return;
    const size_t xn = (size_t)batch * channels * image * image, ln = (size_t)batch * classes;
    const size_t P = fed->params.total;
    float *x = malloc(xn * sizeof(float)), *probs = malloc(ln * sizeof(float));
    float *dlogits = malloc(ln * sizeof(float)), *logits = malloc(ln * sizeof(float));
    float *g_fed = malloc(P * sizeof(float)), *g_kept = malloc(P * sizeof(float));
    int32_t *labels = malloc((size_t)batch * sizeof(int32_t));
    fill(x, xn, 300);
    for (int b = 0; b < batch; b++) labels[b] = (b * 3 + 1) % classes;
    fed->noise_seed = kept->noise_seed = 5;
    fed->forward(fed, x, 1);
    const float loss = visc_softmax_xent_forward(probs, fed->logits, labels, batch, classes, 0.1f);
    visc_softmax_xent_backward(dlogits, probs, labels, batch, classes, 0.1f);
    fed->backward(fed, dlogits);

    float *d_x = visc_gpu_alloc(ctx, xn * sizeof(float));
    float *d_probs = visc_gpu_alloc(ctx, ln * sizeof(float));
    float *d_dlogits = visc_gpu_alloc(ctx, ln * sizeof(float));
    float *d_loss = visc_gpu_alloc(ctx, sizeof(float));
    int32_t *d_labels = visc_gpu_alloc(ctx, (size_t)batch * sizeof(int32_t));
    visc_gpu_upload(ctx, d_x, x, xn * sizeof(float));
    visc_gpu_upload(ctx, d_labels, labels, (size_t)batch * sizeof(int32_t));
    for (size_t i = 0; i < ln; i++) kept->logits[i] = -1.0f; /* must stay so */
    kept->io_on_device = 1;
    kept->forward(kept, d_x, 1);
    visc_gpu_softmax_xent(ctx, d_loss, d_probs, d_dlogits, kept->dev_logits, d_labels, batch,
                          classes, 0.1f);
    kept->backward(kept, d_dlogits);
    float loss_kept;
    visc_gpu_download(ctx, &loss_kept, d_loss, sizeof loss_kept);
    visc_gpu_download(ctx, logits, kept->dev_logits, ln * sizeof(float));
    visc_gpu_download(ctx, g_fed, fed->dev_grads, P * sizeof(float));
    visc_gpu_download(ctx, g_kept, kept->dev_grads, P * sizeof(float));
    if (visc_gpu_sync(ctx)) {
        printf("FAIL %s %s\n", arch, visc_last_error());
        failed++;
    } else {
        expect_logits(arch, "training logits", logits, fed->logits, NULL, ln);
        const double dl = fabs((double)loss_kept - loss);
        result(dl <= LIMIT(1e-6) * fabs(loss), "difference %.3g (limit %.3g)", arch, "loss", dl,
               LIMIT(1e-6) * fabs(loss));
        expect_tables(arch, "gradients", &fed->params, g_kept, g_fed, NULL, LIMIT(1e-5), 0);
        size_t written = 0;
        for (size_t i = 0; i < ln; i++) written += kept->logits[i] != -1.0f;
        result(written == 0, "%.0f written (limit %.0f)", arch, "host logits", (double)written,
               0.0);
    }
    visc_gpu_free(ctx, d_x), visc_gpu_free(ctx, d_probs), visc_gpu_free(ctx, d_dlogits);
    visc_gpu_free(ctx, d_loss), visc_gpu_free(ctx, d_labels);
    visc_model_destroy(fed);
    visc_model_destroy(kept);
    free(x), free(probs), free(dlogits), free(logits), free(g_fed), free(g_kept), free(labels);
}

/* ---- the loader's batch memory, page-locked ---- */

static int ramp_get(const visc_dataset *ds, int64_t idx, const visc_augment *aug, int train,
                    uint64_t seed, int64_t epoch, float *out, int32_t *label) {
    (void)ds, (void)aug, (void)train, (void)seed, (void)epoch;
    for (int k = 0; k < 6; k++) out[k] = (float)idx + 0.125f * (float)k;
    *label = (int32_t)(idx % 3);
    return 0;
}

#ifdef VISC_GPU_STANDIN
int visc_standin_pinned_count(const visc_cuda *ctx); /* cpu_standin.c */
#define PINNED(ctx, n) (visc_standin_pinned_count(ctx) == (n))
#else
#define PINNED(ctx, n) 1
#endif

/* The trainer's pinning: the loader's two regions locked, a batch read
 * from them crosses to the device and back unchanged, the same memory
 * cannot be locked twice (the second attempt is refused and lists
 * nothing), and unpinning releases all of it. */
static void check_pinned_batches(visc_cuda *ctx) {
    visc_dataset ds =
        {.size = 12, .channels = 1, .height = 2, .width = 3, .num_classes = 3, .get = ramp_get};
    visc_loader_config lc = {.batch_size = 4, .workers = 2, .train = 1, .seed = 5};
    visc_loader *l = visc_loader_new(&ds, &lc);
    visc_gpu_pins pins = {0}, again = {0};
    visc_gpu_pin_loader(ctx, l, &pins);
    result(pins.count == 2 && PINNED(ctx, 2), "%.0f regions (want %.0f)", "loader", "pinned",
           pins.count, 2);
    visc_gpu_pin_loader(ctx, l, &again);
    result(again.count == 0 && PINNED(ctx, 2), "%.0f regions (want %.0f)", "loader",
           "pinned twice is refused", again.count, 0);
    float *dev = visc_gpu_alloc(ctx, 4 * 6 * sizeof(float)), back[24];
    visc_batch b;
    double bad = 0;
    int batches = 0;
    visc_loader_start(l, 0, 0, -1);
    while (dev && visc_loader_next(l, &b) == 1) {
        visc_gpu_upload(ctx, dev, b.x, sizeof back);
        visc_gpu_download(ctx, back, dev, sizeof back);
        for (int i = 0; i < 24; i++) bad += back[i] != b.x[i];
        batches++;
    }
    result(batches == 3 && bad == 0, "%.0f values changed crossing the bus (want %.0f)", "loader",
           "batches from pinned memory", bad, 0);
    visc_gpu_unpin(&pins);
    visc_gpu_unpin(&pins); /* nothing left: a no-op */
    result(pins.count == 0 && PINNED(ctx, 0), "%.0f regions left (want %.0f)", "loader", "unpinned",
           pins.count, 0);
    visc_gpu_free(ctx, dev);
    visc_loader_free(l);
}

/* --grad-checkpointing on the GPU (what = RECOMPUTE_BLOCKS), or a
 * ResNet's norm outputs recomputed inside its blocks, the default, against
 * cfg.keep_norm_outputs (RECOMPUTE_NORMS): a recomputing model and a
 * keeping one, both on the device, two training steps from the same batch
 * and noise: the same gradients and running statistics, bit for bit
 * (every kernel is deterministic, so recomputing a block gives the bits it
 * gave before, and visc_cuda_batchnorm_apply the training forward's), and
 * fewer activation bytes; in fp32 or bf16 (a ResNet's activations then
 * bf16 channels-last). */
enum { RECOMPUTE_BLOCKS, RECOMPUTE_NORMS };
static void check_recompute(visc_cuda *ctx, const char *name, int what, int image, int channels,
                            int batch, float drop_path, visc_precision precision) {
    if (!wanted(name)) return;
    visc_model_config cfg = {.num_classes = 10,
                             .in_channels = channels,
                             .image_size = image,
                             .batch = batch,
                             .drop_path_rate = drop_path};
    snprintf(cfg.arch, sizeof cfg.arch, "%s", name);
    char arch[96];
    snprintf(arch, sizeof arch, "%s%s %s", name, precision == VISC_PRECISION_BF16 ? " bf16" : "",
             what == RECOMPUTE_NORMS ? "norm outputs recomputed" : "recomputed");
    visc_set_matmul_precision(precision);
    visc_gpu_set_precision(ctx, precision);
    cfg.keep_norm_outputs = what == RECOMPUTE_NORMS;
    visc_model *kept = visc_model_create(&cfg, 7);
    if (what == RECOMPUTE_NORMS) cfg.keep_norm_outputs = 0;
    else cfg.grad_checkpointing = 1;
    visc_model *again = visc_model_create(&cfg, 7);
    if (!kept || !again || visc_model_to_gpu(kept, ctx) || visc_model_to_gpu(again, ctx)) {
        printf("FAIL %s: cannot build or move the model: %s\n", arch, visc_last_error());
        failed++;
        if (kept) visc_model_destroy(kept);
        if (again) visc_model_destroy(again);
        return;
    }
    const size_t xn = (size_t)batch * channels * image * image, ln = (size_t)batch * 10;
    const size_t P = kept->params.total, NB = kept->buffers.total;
    float *x = malloc(xn * sizeof(float)), *dlogits = malloc(ln * sizeof(float));
    float *g[2] = {malloc(P * sizeof(float)), malloc(P * sizeof(float))};
    float *bufs[2] = {malloc((NB + 1) * sizeof(float)), malloc((NB + 1) * sizeof(float))};
    fill(x, xn, 301);
    fill(dlogits, ln, 302);
    double grad_diff = 0, buf_diff = 0;
    for (int step = 0; step < 2; step++) {
        visc_model *both[2] = {kept, again};
        for (int k = 0; k < 2; k++) {
            both[k]->noise_seed = 40 + (uint64_t)step;
            both[k]->forward(both[k], x, 1);
            both[k]->backward(both[k], dlogits);
            visc_gpu_download(ctx, g[k], both[k]->dev_grads, P * sizeof(float));
            visc_gpu_download(ctx, bufs[k], both[k]->dev_buffers, NB * sizeof(float));
        }
        for (size_t i = 0; i < P; i++) grad_diff += memcmp(&g[0][i], &g[1][i], sizeof(float)) != 0;
        for (size_t i = 0; i < NB; i++)
            buf_diff += memcmp(&bufs[0][i], &bufs[1][i], sizeof(float)) != 0;
    }
    result(grad_diff == 0, "%.0f values differ (want %.0f)", arch, "gradients of two steps",
           grad_diff, 0);
    if (NB > 0) /* BatchNorm's, which a recomputed forward must leave alone */
        result(buf_diff == 0, "%.0f values differ (want %.0f)", arch, "running statistics",
               buf_diff, 0);
    result(again->activation_bytes < kept->activation_bytes, "%.0f MiB (keeping: %.0f)", arch,
           "activations", (double)again->activation_bytes / (1 << 20),
           (double)kept->activation_bytes / (1 << 20));
    free(x), free(dlogits), free(g[0]), free(g[1]), free(bufs[0]), free(bufs[1]);
    visc_model_destroy(kept);
    visc_model_destroy(again);
}

/* The device memory a model's activations take under bf16, as a share of
 * fp32's, at most `limit`. A ResNet's (bf16 channels-last) take about
 * half: only the batch, the BatchNorm statistics and the pooled features
 * stay fp32. A transformer's operands (the norms' outputs before a linear
 * layer, the attention output, the MLP's hidden layer and GELU's output,
 * and ViT's and Swin V1's q, k, v) are bf16; at their shares of the whole
 * (ViT-S 0.62, Swin-T 0.685, SwinV2-T 0.835, CaiT-XXS 0.846 at batch 2;
 * Swin's were 0.654 and 0.807 while each block kept its GELU output, a
 * bf16 operand, now made again in backward; SwinV2's and CaiT's rose and
 * fell again with the fp32 q, k copies and scores they no longer keep)
 * the limits fail if the operands are planned as fp32 again. `operands`: a model whose share
 * comes from them, which must be exactly 1 where the operand form is fp32
 * (the stand-in's: tests/gpu/cpu_standin.c). */
static void check_bf16_arena(visc_cuda *ctx, const char *name, int image, int batch, double limit,
                             int operands) {
    if (!wanted(name)) return;
    visc_model_config cfg = {.num_classes = 10,
                             .in_channels = 3,
                             .image_size = image,
                             .batch = batch};
    snprintf(cfg.arch, sizeof cfg.arch, "%s", name);
    visc_model *m[2] = {NULL, NULL};
    const visc_precision p[2] = {VISC_PRECISION_FP32, VISC_PRECISION_BF16};
    int operand_bytes = 4; /* of the bf16 context */
    for (int k = 0; k < 2; k++) {
        visc_gpu_set_precision(ctx, p[k]);
        if (p[k] == VISC_PRECISION_BF16) operand_bytes = visc_cuda_operand_bytes(ctx);
        m[k] = visc_model_create(&cfg, 7);
        if (!m[k] || visc_model_to_gpu(m[k], ctx)) {
            printf("FAIL %s bf16: cannot build or move the model: %s\n", name, visc_last_error());
            failed++;
            break;
        }
    }
    visc_gpu_set_precision(ctx, VISC_PRECISION_FP32);
    if (m[0] && m[1]) {
        const double fp32 = (double)m[0]->activation_bytes, bf16 = (double)m[1]->activation_bytes;
        char arch[96];
        snprintf(arch, sizeof arch, "%s bf16", name);
        /* where the operand form is fp32 (the stand-in's) it changes nothing */
        if (operands && operand_bytes == 4) limit = 1.0;
        result(bf16 <= limit * fp32, "%.3g of fp32's (limit %.3g)", arch,
               "activations on the device", bf16 / fp32, limit);
    }
    for (int k = 0; k < 2; k++)
        if (m[k]) visc_model_destroy(m[k]);
}

/* ---- the trainer's staged steps (visc_gpu_stage) ----
 * Five steps of a made-up batch (one of them short): each crosses on the
 * copy stream, and the host overwrites its memory as soon as
 * visc_gpu_stage_end returns (as the loader refills it), so a copy that
 * had not finished by then would leave the next values on the device. The
 * device's gradients of the logits, the losses and top-1 counts read back
 * in one run at the end, all against the CPU's loss on the same logits.
 * soft: mixup's soft targets instead of labels with smoothing. */
static void check_stage(visc_cuda *ctx, int soft) {
    enum { B = 6, K = 10, SAMPLE = 5, STEPS = 5 };
    const char *arch = soft ? "stage (soft targets)" : "stage (labels)";
    const float smoothing = soft ? 0.0f : 0.1f;
    float *host = aligned_alloc(4096, 4096), back[B * SAMPLE];
    float logits[STEPS][B * K], cpu_loss[STEPS], probs[B * K], dl_cpu[B * K], dl_gpu[B * K];
    float soft_targets[B * K];
    int32_t labels[B], cpu_top1[STEPS];
    visc_gpu_stage *s = visc_gpu_stage_create(ctx, B, K, SAMPLE * sizeof(float), soft);
    float *d_logits = visc_gpu_alloc(ctx, sizeof logits);
    if (!host || !s || !d_logits || visc_cuda_host_register(ctx, host, 4096)) {
        printf("FAIL %s: %s\n", arch, visc_last_error());
        failed++;
        return;
    }
    double copy_bad = 0, grad_err = 0, pad_bad = 0;
    for (int i = 0; i < STEPS; i++) {
        const int count = i == 3 ? 4 : B, rows = soft ? count & ~1 : count;
        for (int k = 0; k < B * SAMPLE; k++) host[k] = (float)(100 * i + k);
        for (int b = 0; b < B; b++) labels[b] = (b * 7 + i) % K;
        for (int k = 0; k < B * K; k++) logits[i][k] = sinf(0.37f * (float)(k + 13 * i)) * 3.0f;
        if (soft) { /* two labels mixed, as mixup's targets */
            float *t = visc_gpu_stage_targets(s);
            memset(t, 0, sizeof soft_targets);
            for (int b = 0; b < B; b++) {
                t[b * K + labels[b]] += 0.7f;
                t[b * K + (labels[b] + 3) % K] += 0.3f;
            }
            memcpy(soft_targets, t, sizeof soft_targets);
        }
        visc_gpu_upload(ctx, d_logits + i * B * K, logits[i], sizeof logits[i]);
        float *dev_x = visc_gpu_stage_put(s, host, labels, count);
        const float *d_dl = visc_gpu_stage_loss(s, i, d_logits + i * B * K, rows, count, smoothing);
        if (visc_gpu_stage_end(s)) break;
        for (int k = 0; k < B * SAMPLE; k++) host[k] = -1.0f; /* the loader refills it */
        visc_gpu_download(ctx, back, dev_x, sizeof back);
        for (int k = 0; k < B * SAMPLE; k++) copy_bad += back[k] != (float)(100 * i + k);
        visc_gpu_download(ctx, dl_gpu, d_dl, sizeof dl_gpu);
        if (soft) {
            cpu_loss[i] = visc_softmax_xent_soft_forward(probs, logits[i], soft_targets, rows, K);
            visc_softmax_xent_soft_backward(dl_cpu, probs, soft_targets, rows, K);
        } else {
            cpu_loss[i] = visc_softmax_xent_forward(probs, logits[i], labels, rows, K, smoothing);
            visc_softmax_xent_backward(dl_cpu, probs, labels, rows, K, smoothing);
        }
        int top5;
        visc_topk_correct(logits[i], labels, count, K, &cpu_top1[i], &top5);
        grad_err = fmax(grad_err, rel_error(dl_gpu, dl_cpu, (size_t)rows * K));
        for (int k = rows * K; k < B * K; k++) pad_bad += dl_gpu[k] != 0.0f;
    }
    float loss[STEPS];
    int32_t top1[STEPS];
    double loss_err = 0, top1_bad = 0;
    if (visc_gpu_stage_results(s, STEPS, loss, top1, NULL) == 0)
        for (int i = 0; i < STEPS; i++) {
            loss_err = fmax(loss_err, fabs((double)loss[i] - cpu_loss[i]) / fabs(cpu_loss[i]));
            top1_bad += top1[i] != cpu_top1[i];
        }
    else loss_err = top1_bad = INFINITY;
    result(copy_bad == 0, "%.0f values not the step's batch (want %.0f)", arch,
           "batches copied before the host reused them", copy_bad, 0);
    result(grad_err <= LIMIT(1e-6), "relative error %.3g (limit %.3g)", arch, "logit gradients",
           grad_err, LIMIT(1e-6));
    result(pad_bad == 0, "%.0f padding rows' gradients not 0 (want %.0f)", arch,
           "short batch padding", pad_bad, 0);
    result(loss_err <= LIMIT(1e-6), "relative error %.3g (limit %.3g)", arch,
           "losses read back in one run", loss_err, LIMIT(1e-6));
    result(top1_bad == 0, "%.0f steps' top-1 counts differ (want %.0f)", arch, "top-1 counts",
           top1_bad, 0);
    visc_gpu_stage_free(s);
    visc_gpu_free(ctx, d_logits);
    visc_cuda_host_unregister(ctx, host);
    free(host);
}

int main(void) {
    int index = 0;
    /* The CPU's bf16 products also where it has no avx512_bf16 (it would
     * fall back to fp32; a GPU multiplies in bf16 whatever the host has). */
    setenv("VISC_BF16_EMULATE", "1", 1);
    visc_cuda *ctx = visc_gpu_open(index);
    if (!ctx) {
        printf("test_cuda_model: skipped: no GPU (%s)\n", visc_last_error());
        return 77;
    }
    for (size_t i = 0; i < sizeof model_cases / sizeof model_cases[0]; i++)
        check_model(ctx, &model_cases[i]);
    check_device_io(ctx, "resnet20", 32, 3, 10, 16);
    check_device_io(ctx, "vit_pico_patch4_28", 28, 1, 10, 8);
    check_device_io(ctx, "swinv2_micro_patch2_window4_32", 32, 3, 10, 4);
    check_pinned_batches(ctx);
    check_stage(ctx, 0);
    check_stage(ctx, 1);
    const visc_precision fp32 = VISC_PRECISION_FP32;
    check_recompute(ctx, "resnet50", RECOMPUTE_BLOCKS, 64, 3, 4, 0.0f, fp32);
    check_recompute(ctx, "resnet50", RECOMPUTE_BLOCKS, 64, 3, 4, 0.0f, VISC_PRECISION_BF16);
    check_recompute(ctx, "resnet50", RECOMPUTE_NORMS, 64, 3, 4, 0.0f, fp32);
    check_recompute(ctx, "resnet50", RECOMPUTE_NORMS, 64, 3, 4, 0.0f, VISC_PRECISION_BF16);
    check_recompute(ctx, "resnet18", RECOMPUTE_NORMS, 64, 3, 4, 0.0f, VISC_PRECISION_BF16);
    check_recompute(ctx, "vit_pico_patch4_28", RECOMPUTE_BLOCKS, 28, 1, 8, 0.2f, fp32);
    check_recompute(ctx, "swinv2_micro_patch2_window4_32", RECOMPUTE_BLOCKS, 32, 3, 4, 0.2f, fp32);
    check_recompute(ctx, "swin_micro_patch2_window4_32", RECOMPUTE_BLOCKS, 32, 3, 4, 0.2f,
                    VISC_PRECISION_BF16);
    check_recompute(ctx, "cait_xxs24_224", RECOMPUTE_BLOCKS, 32, 3, 2, 0.1f, fp32);
    check_bf16_arena(ctx, "resnet50", 64, 4, 0.55, 0);
    check_bf16_arena(ctx, "resnet20", 32, 16, 0.55, 0);
    check_bf16_arena(ctx, "vit_small_patch16_224", 224, 2, 0.63, 1);
    check_bf16_arena(ctx, "swin_tiny_patch4_window7_224", 224, 2, 0.69, 1);
    check_bf16_arena(ctx, "swinv2_tiny_window8_256", 256, 2, 0.74, 1);
    check_bf16_arena(ctx, "cait_xxs24_224", 224, 2, 0.76, 1);
    visc_gpu_close(ctx);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

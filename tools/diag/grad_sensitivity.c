/* grad_sensitivity.c: how far one rounding moves a model's gradients on the
 * CPU. A GPU's training step can be held to the CPU's only as closely as
 * the CPU's own step is stable under rounding, so this is the measurement
 * behind the limits of tests/gpu/test_cuda_model.c (README, GPU section).
 *
 *   build/tools/grad_sensitivity [--arch resnet50] [--batch 4] [--image 64]
 *                                [--classes 10] [--scales 1,0.3,0.2,0.1,0.05]
 *
 * For each residual-branch scale (visc_resnet_scale_branches: every
 * block's last BatchNorm weight; 1 leaves the initialization as it is, and
 * a model that is not a ResNet takes 1 only), one training step's
 * gradients, on test_cuda_model's first batch and labels, are compared
 * with those of
 *   - the same model on the batch scaled by 1 + 1e-7 (about one rounding
 *     of every input), and
 *   - a twin whose convolutions are oneDNN's plain NCHW ones
 *     (VISC_CONV_LAYOUT=plain) where the model's chose blocked layouts.
 * Prints a Markdown table: ||g - g0|| / ||g0|| over all the gradients, and
 * for the tensor where it is largest. Exits 2 on a bad argument. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/model.h"
#include "visc/nn.h"

typedef struct {
    double all, worst;
    const char *worst_name;
} spread;

/* ||g - c|| / ||c|| over all of the table and per tensor. */
static spread compare(const visc_table *t, const float *g, const float *c) {
    spread s = {0, 0, "-"};
    double d_all = 0, c_all = 0;
    for (int i = 0; i < t->count; i++) {
        const visc_tensor_entry *e = &t->entries[i];
        double d = 0, n = 0;
        for (size_t j = e->offset; j < e->offset + e->numel; j++) {
            d += ((double)g[j] - c[j]) * ((double)g[j] - c[j]);
            n += (double)c[j] * c[j];
        }
        d_all += d, c_all += n;
        const double r = n > 0 ? sqrt(d / n) : sqrt(d);
        if (r > s.worst) s.worst = r, s.worst_name = e->name;
    }
    s.all = c_all > 0 ? sqrt(d_all / c_all) : sqrt(d_all);
    return s;
}

/* test_cuda_model.c's batch: a fixed LCG's values in [-1, 1). */
static void fill(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

/* The model (seed 7, as the test's), its branches scaled where scale != 1,
 * its convolutions plain NCHW with `plain`; exits with the error. */
static visc_model *make(const visc_model_config *cfg, float scale, int plain) {
    if (plain) setenv("VISC_CONV_LAYOUT", "plain", 1); /* read as each convolution is set up */
    visc_model *m = visc_model_create(cfg, 7);
    if (plain) unsetenv("VISC_CONV_LAYOUT");
    if (!m || (scale != 1.0f && visc_resnet_scale_branches(m, scale))) {
        fprintf(stderr, "grad_sensitivity: %s\n", visc_last_error());
        exit(1);
    }
    return m;
}

/* One training step's gradients (copied to grads) on batch x. */
static void step_grads(visc_model *m, const float *x, const int32_t *labels, float *grads) {
    const int N = m->cfg.batch, K = m->cfg.num_classes;
    float *probs = malloc(sizeof(float) * N * K), *dlogits = malloc(sizeof(float) * N * K);
    m->forward(m, x, 1);
    visc_softmax_xent_forward(probs, m->logits, labels, N, K, 0.0f);
    visc_softmax_xent_backward(dlogits, probs, labels, N, K, 0.0f);
    m->backward(m, dlogits);
    memcpy(grads, m->grads, m->params.total * sizeof(float));
    free(probs);
    free(dlogits);
}

static int usage(const char *why) {
    fprintf(stderr,
            "grad_sensitivity: %s\nusage: grad_sensitivity [--arch NAME] [--batch N] [--image PX] "
            "[--classes K] [--scales S1,S2,...]\n",
            why);
    return 2;
}

int main(int argc, char **argv) {
    visc_model_config cfg = {0};
    snprintf(cfg.arch, sizeof cfg.arch, "resnet50");
    cfg.batch = 4, cfg.image_size = 64, cfg.num_classes = 10, cfg.in_channels = 3;
    const char *scales = "1,0.3,0.2,0.1,0.05";
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage("every option takes a value");
        if (!strcmp(argv[i], "--arch")) snprintf(cfg.arch, sizeof cfg.arch, "%s", v);
        else if (!strcmp(argv[i], "--batch")) cfg.batch = atoi(v);
        else if (!strcmp(argv[i], "--image")) cfg.image_size = atoi(v);
        else if (!strcmp(argv[i], "--classes")) cfg.num_classes = atoi(v);
        else if (!strcmp(argv[i], "--scales")) scales = v;
        else return usage(argv[i]);
        i++;
    }
    if (cfg.batch < 1 || cfg.image_size < 1 || cfg.num_classes < 1)
        return usage("batch, image and classes must be positive");
    const int resnet = strncmp(cfg.arch, "resnet", 6) == 0;
    const size_t xn = (size_t)cfg.batch * cfg.in_channels * cfg.image_size * cfg.image_size;
    float *x = malloc(sizeof(float) * xn), *x2 = malloc(sizeof(float) * xn);
    int32_t *labels = malloc(sizeof(int32_t) * cfg.batch);
    fill(x, xn, 100);
    for (size_t i = 0; i < xn; i++) x2[i] = x[i] * (1.0f + 1e-7f);
    for (int b = 0; b < cfg.batch; b++) labels[b] = (b * 7) % cfg.num_classes;

    printf("%s, batch %d, %d px: one step's gradients, ||g - g0|| / ||g0||\n\n", cfg.arch,
           cfg.batch, cfg.image_size);
    printf("| branch scale | input x (1 + 1e-7): all | worst tensor | plain convolutions: all | "
           "worst tensor |\n| --- | --- | --- | --- | --- |\n");
    char *list = strdup(scales), *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        const float scale = strtof(tok, &end);
        if (*end || end == tok || scale < 0)
            return usage("--scales: numbers >= 0, comma-separated");
        if (!resnet && scale != 1.0f) return usage("--scales other than 1 need a ResNet");
        visc_model *a = make(&cfg, scale, 0), *b = make(&cfg, scale, 0), *c = make(&cfg, scale, 1);
        const size_t P = a->params.total;
        float *ga = malloc(sizeof(float) * P), *gb = malloc(sizeof(float) * P);
        float *gc = malloc(sizeof(float) * P);
        step_grads(a, x, labels, ga);
        step_grads(b, x2, labels, gb);
        step_grads(c, x, labels, gc);
        const spread in = compare(&a->params, gb, ga), lay = compare(&a->params, gc, ga);
        printf("| %g | %.2g | %.2g (%s) | %.2g | %.2g (%s) |\n", scale, in.all, in.worst,
               in.worst_name, lay.all, lay.worst, lay.worst_name);
        fflush(stdout);
        free(ga), free(gb), free(gc);
        visc_model_destroy(a), visc_model_destroy(b), visc_model_destroy(c);
    }
    free(list);
    free(x), free(x2), free(labels);
    return 0;
}

/* test_swin_parity.c: Swin V1 and V2 against timm 0.9.16, end to end.
 *
 * tests/golden/swin*.safetensors (tools/gen_golden_swin.py) hold, for a
 * model whose every parameter is filled by the shared hash of tests/golden.h
 * (plus the Swin rules of swin_kind below), fed a hash-filled input: timm's
 * state_dict name:shape list, the logits, the label-smoothed (0.1)
 * cross-entropy and every parameter's gradient (tensors above 256 elements
 * as 128 samples, indices i * (numel / 128), plus the full tensor's L2 norm).
 * References were computed by PyTorch in float64.
 *
 * Tolerances, relative to each tensor's own scale:
 *     max |got - want| <= tol * max|want|,   ||got - want|| <= tol_norm * ||want||
 * and the generator records how far torch's own fp32 run lies from the
 * float64 reference: that must be within half of each tolerance, or the case
 * is ill-conditioned and rejected rather than tolerated.
 *
 * Also: timm's name/shape lists of the small and base models, and that
 * drop-path / dropout masks are a pure function of m->noise_seed. */
#include <stdlib.h>
#include <string.h>

#include "golden.h"
#include "test.h"
#include "visc/io.h"
#include "visc/model.h"
#include "visc/nn.h"

#define TOL_LOGITS 1e-4
#define TOL_GRAD_MAX 2e-4
#define TOL_GRAD_NORM 1e-4
#define CLASSES 10

/* The Swin tensors golden.h has no rule for (mirror of gen_golden_swin.py). */
static int swin_kind(const char *name, int ndim, const int64_t *shape, float *scale,
                     float *offset) {
    size_t n = strlen(name);
#define ENDS(s) (n >= sizeof(s) - 1 && strcmp(name + n - (sizeof(s) - 1), s) == 0)
    *offset = 0.0f;
    if (ENDS("relative_position_bias_table")) *scale = 2.0f;
    else if (ENDS("logit_scale")) *scale = 1.0f, *offset = 2.3f;
    else if (ENDS("q_bias") || ENDS("v_bias")) *scale = 0.2f;
    else return golden_kind(name, ndim, shape, scale, offset);
#undef ENDS
    return 1;
}

static void swin_fill(visc_table *t) {
    for (int k = 0; k < t->count; k++) {
        const visc_tensor_entry *e = &t->entries[k];
        float scale, offset, *dst = t->data + e->offset;
        if (!swin_kind(e->name, e->ndim, e->shape, &scale, &offset)) {
            CHECK_MSG(0, "no hash fill rule for %s", e->name);
            continue;
        }
        uint32_t h = golden_fnv1a(e->name);
        for (size_t i = 0; i < e->numel; i++)
            dst[i] = (golden_u01(h, (uint32_t)i) - 0.5f) * scale + offset;
    }
}

/* "name:d0xd1;..." of the parameter table, as the generator writes timm's. */
static char *names_string(const visc_table *t) {
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    s[0] = 0;
    for (int k = 0; k < t->count; k++) {
        const visc_tensor_entry *e = &t->entries[k];
        char item[VISC_MAX_NAME + 64];
        int n = snprintf(item, sizeof item, "%s%s:", k ? ";" : "", e->name);
        for (int d = 0; d < e->ndim; d++)
            n += snprintf(item + n, sizeof item - (size_t)n, "%s%lld", d ? "x" : "",
                          (long long)e->shape[d]);
        if (len + (size_t)n + 1 > cap) {
            cap = 2 * (len + (size_t)n + 1);
            char *grown = realloc(s, cap);
            if (!grown) abort();
            s = grown;
        }
        memcpy(s + len, item, (size_t)n + 1);
        len += (size_t)n;
    }
    return s;
}

static void check_names(const visc_model *m, const char *want, const char *what) {
    char *got = names_string(&m->params);
    CHECK_MSG(want && strcmp(got, want) == 0, "%s: visc's name:shape list differs from timm's",
              what);
    if (want && strcmp(got, want) != 0) {
        size_t i = 0;
        while (got[i] && got[i] == want[i]) i++;
        size_t from = i > 60 ? i - 60 : 0;
        fprintf(stderr, "  first difference at %zu:\n  visc: %.120s\n  timm: %.120s\n", i,
                got + from, want + from);
    }
    free(got);
}

static visc_model *make(const char *arch, int ch, int image, int batch) {
    visc_model_config cfg = {0};
    snprintf(cfg.arch, sizeof cfg.arch, "%s", arch);
    cfg.num_classes = CLASSES;
    cfg.in_channels = ch;
    cfg.image_size = image;
    cfg.batch = batch;
    visc_model *m = visc_model_create(&cfg, 1);
    CHECK_MSG(m != NULL, "%s: %s", arch, visc_last_error());
    return m;
}

static double max_abs(const float *x, size_t n) {
    double r = 0;
    for (size_t i = 0; i < n; i++) r = fabs(x[i]) > r ? fabs(x[i]) : r;
    return r;
}

static double l2(const float *x, size_t n) {
    double r = 0;
    for (size_t i = 0; i < n; i++) r += (double)x[i] * x[i];
    return sqrt(r);
}

static double worst_max, worst_norm;

/* got (n elements, compared at i * stride) vs want [n]: elementwise and normwise. */
static void compare(const char *what, const float *got, size_t stride, const float *want, size_t n,
                    double tol, double tol_norm) {
    double scale = max_abs(want, n), d2 = 0, worst = 0;
    size_t bad = 0, wi = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i * stride] - want[i]);
        d2 += d * d;
        if (!(d <= tol * scale)) bad++, wi = i;
        if (scale > 0 && d / scale > worst) worst = d / scale;
    }
    double rel = sqrt(d2) / (l2(want, n) > 0 ? l2(want, n) : 1);
    worst_max = worst > worst_max ? worst : worst_max;
    worst_norm = rel > worst_norm ? rel : worst_norm;
    CHECK_MSG(bad == 0, "%s: %zu of %zu off, e.g. [%zu] got %.9g want %.9g (worst %.3g of max)",
              what, bad, n, wi * stride, got[wi * stride], want[wi], worst);
    CHECK_MSG(rel <= tol_norm, "%s: ||diff|| / ||want|| = %.3g > %.3g", what, rel, tol_norm);
}

static double tolerance(const visc_safetensors *st, const char *key, double tol) {
    char full[96];
    snprintf(full, sizeof full, "torch_fp32_err.%s", key);
    const char *v = visc_safetensors_meta(st, full);
    CHECK_MSG(v && atof(v) <= 0.5 * tol, "golden case ill-conditioned: torch fp32 %s error %s", key,
              v ? v : "(missing)");
    return tol;
}

static void run_case(const char *file) {
    visc_safetensors st;
    if (visc_safetensors_open(&st, visc_golden_path(file)) != 0) {
        CHECK_MSG(0, "%s: %s", file, visc_last_error());
        return;
    }
    const char *arch = visc_safetensors_meta(&st, "arch");
    const char *mc = visc_safetensors_meta(&st, "in_channels"),
               *mi = visc_safetensors_meta(&st, "image"), *mb = visc_safetensors_meta(&st, "batch");
    CHECK(arch && mc && mi && mb);
    if (!arch || !mc || !mi || !mb) {
        visc_safetensors_close(&st);
        return;
    }
    int ch = atoi(mc), image = atoi(mi), B = atoi(mb);
    visc_model *m = make(arch, ch, image, B);
    if (!m) {
        visc_safetensors_close(&st);
        return;
    }
    check_names(m, visc_safetensors_meta(&st, "names"), file);
    CHECK(m->buffers.count == 0); /* timm 0.9.16's state_dict has no Swin buffers */
    swin_fill(&m->params);
    double tl = tolerance(&st, "logits", TOL_LOGITS);
    double tg = tolerance(&st, "grad_max", TOL_GRAD_MAX);
    double tn = tolerance(&st, "grad_norm", TOL_GRAD_NORM);

    size_t nx = (size_t)B * ch * image * image;
    float *x = malloc(nx * sizeof(float)), *want = malloc((size_t)B * CLASSES * sizeof(float));
    float *probs = malloc((size_t)B * CLASSES * sizeof(float));
    float *dlogits = malloc((size_t)B * CLASSES * sizeof(float));
    int32_t *labels = malloc((size_t)B * sizeof(int32_t));
    uint32_t hx = golden_fnv1a("input");
    for (size_t i = 0; i < nx; i++) x[i] = (golden_u01(hx, (uint32_t)i) - 0.5f) * 2.0f;
    for (int i = 0; i < B; i++) labels[i] = (3 * i + 1) % CLASSES;

    m->noise_seed = 7;
    m->forward(m, x, 1);
    if (visc_safetensors_read_f32(&st, "logits", want, (size_t)B * CLASSES) == 0)
        compare("logits", m->logits, 1, want, (size_t)B * CLASSES, tl, tl);
    else CHECK_MSG(0, "%s", visc_last_error());
    float loss = visc_softmax_xent_forward(probs, m->logits, labels, B, CLASSES, 0.1f), wl = 0;
    CHECK(visc_safetensors_read_f32(&st, "loss", &wl, 1) == 0);
    CHECK_CLOSE(loss, wl, 0, tl);
    visc_softmax_xent_backward(dlogits, probs, labels, B, CLASSES, 0.1f);
    m->backward(m, dlogits);

    for (int k = 0; k < m->params.count; k++) {
        const visc_tensor_entry *e = &m->params.entries[k];
        const float *g = m->grads + e->offset;
        char name[VISC_MAX_NAME + 32];
        snprintf(name, sizeof name, "grad.%s", e->name);
        if (visc_safetensors_find(&st, name)) {
            float *w = malloc(e->numel * sizeof(float));
            if (visc_safetensors_read_f32(&st, name, w, e->numel) == 0)
                compare(name, g, 1, w, e->numel, tg, tn);
            else CHECK_MSG(0, "%s", visc_last_error());
            free(w);
            continue;
        }
        size_t n = 128, stride = e->numel / 128;
        float w[128], norm = 0;
        snprintf(name, sizeof name, "grad.%s:sample", e->name);
        int ok = visc_safetensors_read_f32(&st, name, w, n) == 0;
        snprintf(name, sizeof name, "grad.%s:norm", e->name);
        ok = ok && visc_safetensors_read_f32(&st, name, &norm, 1) == 0;
        CHECK_MSG(ok, "%s: %s", e->name, visc_last_error());
        if (!ok) continue;
        snprintf(name, sizeof name, "grad.%s", e->name);
        compare(name, g, stride, w, n, tg, tn);
        CHECK_MSG(fabs(l2(g, e->numel) - norm) <= tn * norm, "%s: norm %.9g, want %.9g", name,
                  l2(g, e->numel), norm);
    }
    if (getenv("VISC_PARITY_VERBOSE"))
        printf("# %s: loss %.7f (want %.7f); worst |diff|/max|want| %.2g, ||diff||/||want|| "
               "%.2g\n",
               file, loss, wl, worst_max, worst_norm);
    worst_max = worst_norm = 0;
    free(x), free(want), free(probs), free(dlogits), free(labels);
    visc_model_destroy(m);
    visc_safetensors_close(&st);
}

TEST(swin_tiny_224_parity) { run_case("swin_tiny.safetensors"); }
TEST(swinv2_tiny_256_parity) { run_case("swinv2_tiny.safetensors"); }
TEST(swin_tiny_32_parity) { run_case("swin_tiny32.safetensors"); }
TEST(swinv2_tiny_32_parity) { run_case("swinv2_tiny32.safetensors"); }
TEST(swin_micro_parity) { run_case("swin_micro.safetensors"); }
TEST(swinv2_micro_parity) { run_case("swinv2_micro.safetensors"); }

/* Small and base: only the parameter list (building them is enough). */
TEST(swin_small_base_names) {
    visc_safetensors st;
    if (visc_safetensors_open(&st, visc_golden_path("swin_names.safetensors")) != 0) {
        CHECK_MSG(0, "%s", visc_last_error());
        return;
    }
    const char *archs[] = {"swin_small_patch4_window7_224", "swin_base_patch4_window7_224",
                           "swinv2_small_window8_256", "swinv2_base_window8_256"};
    for (int i = 0; i < 4; i++) {
        visc_model *m = make(archs[i], 3, strstr(archs[i], "224") ? 224 : 256, 1);
        if (!m) continue;
        check_names(m, visc_safetensors_meta(&st, archs[i]), archs[i]);
        visc_model_destroy(m);
    }
    visc_safetensors_close(&st);
}

/* Drop-path and dropout masks are a pure function of noise_seed; eval ignores them. */
static void check_noise(const char *arch) {
    visc_model_config cfg = {.num_classes = CLASSES,
                             .in_channels = 1,
                             .image_size = 32,
                             .batch = 8,
                             .drop_rate = 0.3f,
                             .drop_path_rate = 0.5f};
    snprintf(cfg.arch, sizeof cfg.arch, "%s", arch);
    visc_model *m = visc_model_create(&cfg, 3), *ref = NULL;
    cfg.drop_rate = cfg.drop_path_rate = 0.0f;
    ref = visc_model_create(&cfg, 3);
    CHECK(m && ref);
    if (!m || !ref) {
        visc_model_destroy(m), visc_model_destroy(ref);
        return;
    }
    swin_fill(&m->params);
    swin_fill(&ref->params);
    size_t nx = 8 * 32 * 32, nl = 8 * CLASSES, np = m->params.total;
    float *x = malloc(nx * 4), *l1 = malloc(nl * 4), *g1 = malloc(np * 4), *dl = malloc(nl * 4);
    for (size_t i = 0; i < nx; i++) x[i] = (golden_u01(11, (uint32_t)i) - 0.5f) * 2.0f;
    for (size_t i = 0; i < nl; i++) dl[i] = golden_u01(12, (uint32_t)i) - 0.5f;
    m->noise_seed = 42;
    m->forward(m, x, 1);
    memcpy(l1, m->logits, nl * 4);
    m->backward(m, dl);
    memcpy(g1, m->grads, np * 4);
    m->forward(m, x, 1);
    m->backward(m, dl);
    CHECK(memcmp(l1, m->logits, nl * 4) == 0);
    CHECK(memcmp(g1, m->grads, np * 4) == 0);
    m->noise_seed = 43;
    m->forward(m, x, 1);
    CHECK(memcmp(l1, m->logits, nl * 4) != 0);
    /* eval: no masks, the same logits as the model without regularization */
    m->forward(m, x, 0);
    ref->forward(ref, x, 0);
    CHECK_ARRAYS("eval logits", m->logits, ref->logits, nl, 0, 0);
    free(x), free(l1), free(g1), free(dl);
    visc_model_destroy(m);
    visc_model_destroy(ref);
}

TEST(drop_path_is_a_function_of_noise_seed) {
    check_noise("swin_micro_patch2_window4_32");
    check_noise("swinv2_micro_patch2_window4_32");
}

/* V2's temperature is exp(min(logit_scale, log 100)): above the clamp the
 * forward equals the clamp's and the gradient is 0 (torch.clamp's backward). */
TEST(swinv2_logit_scale_clamp) {
    visc_model *m = make("swinv2_micro_patch2_window4_32", 1, 32, 2);
    if (!m) return;
    swin_fill(&m->params);
    int k = visc_table_find(&m->params, "layers.0.blocks.0.attn.logit_scale");
    CHECK(k >= 0);
    if (k < 0) {
        visc_model_destroy(m);
        return;
    }
    float *ls = visc_table_get(&m->params, k), *g = m->grads + m->params.entries[k].offset;
    size_t nx = 2 * 32 * 32, nl = 2 * CLASSES;
    float *x = malloc(nx * 4), *l1 = malloc(nl * 4), *dl = malloc(nl * 4);
    for (size_t i = 0; i < nx; i++) x[i] = (golden_u01(21, (uint32_t)i) - 0.5f) * 2.0f;
    for (size_t i = 0; i < nl; i++) dl[i] = golden_u01(22, (uint32_t)i) - 0.5f;
    ls[0] = 5.0f; /* above log(100) = 4.605 */
    m->forward(m, x, 1);
    memcpy(l1, m->logits, nl * 4);
    m->backward(m, dl);
    CHECK(g[0] == 0.0f);
    CHECK(g[1] != 0.0f);
    ls[0] = logf(100.0f);
    m->forward(m, x, 1);
    CHECK_ARRAYS("logits at the clamp", m->logits, l1, nl, 0, 0);
    m->backward(m, dl);
    CHECK(g[0] != 0.0f); /* at the bound the gradient passes */
    free(x), free(l1), free(dl);
    visc_model_destroy(m);
}

/* timm's init: Linear weights N(0, .02), LayerNorm 1 / 0 (V2's res-post-norms 0 / 0). */
TEST(swin_init_as_timm) {
    visc_model *m = make("swinv2_micro_patch2_window4_32", 1, 32, 1);
    visc_model *v1 = make("swin_micro_patch2_window4_32", 1, 32, 1);
    if (!m || !v1) {
        visc_model_destroy(m), visc_model_destroy(v1);
        return;
    }
    const visc_tensor_entry *e =
        &m->params.entries[visc_table_find(&m->params, "layers.2.blocks.0.mlp.fc1.weight")];
    const float *w = m->params.data + e->offset;
    double s = 0, s2 = 0;
    for (size_t i = 0; i < e->numel; i++) s += w[i], s2 += (double)w[i] * w[i];
    double mean = s / e->numel, sd = sqrt(s2 / e->numel - mean * mean);
    CHECK_CLOSE(sd, 0.02, 0, 0.03);
    CHECK(fabs(mean) < 0.001);
    const float *n1 =
        visc_table_get(&m->params, visc_table_find(&m->params, "layers.0.blocks.0.norm1.weight"));
    const float *ls =
        visc_table_get(&m->params,
                       visc_table_find(&m->params, "layers.0.blocks.0.attn.logit_scale"));
    const float *pn =
        visc_table_get(&m->params, visc_table_find(&m->params, "patch_embed.norm.weight"));
    const float *v1n =
        visc_table_get(&v1->params, visc_table_find(&v1->params, "layers.0.blocks.0.norm1.weight"));
    CHECK(n1[0] == 0.0f && pn[0] == 1.0f && v1n[0] == 1.0f);
    CHECK_CLOSE(ls[0], log(10.0), 1e-6, 0);
    visc_model_destroy(m);
    visc_model_destroy(v1);
}

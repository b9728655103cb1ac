/* test_ssl_eval.c: the SSL evaluations around the kNN classifier:
 * backward from the features (model.h's backward_features), feature
 * extraction, the linear probe's frozen backbone, the backbone-only load
 * and the fresh head of finetuning. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "visc/rng.h"
#include "visc/ssl_eval.h"

static visc_model *make_model(const char *arch, int classes, int in_ch, int image, int batch,
                              uint64_t seed) {
    visc_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.arch, sizeof cfg.arch, "%s", arch);
    cfg.num_classes = classes;
    cfg.in_channels = in_ch;
    cfg.image_size = image;
    cfg.batch = batch;
    cfg.small_stem = 1;
    visc_model *m = visc_model_create(&cfg, seed);
    CHECK_MSG(m != NULL, "%s: %s", arch, visc_last_error());
    return m;
}

static void fill_normal(float *x, size_t n, uint64_t sub) {
    visc_rng r = visc_rng_make(42, 77, sub);
    for (size_t i = 0; i < n; i++) x[i] = visc_rng_normal(&r);
}

static int is_head(const visc_model *m, const char *name) {
    return strncmp(name, m->head_prefix, strlen(m->head_prefix)) == 0;
}

static double max_abs(const float *x, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) w = fabs(x[i]) > w ? fabs(x[i]) : w;
    return w;
}

/* backward_features(dlogits @ W_head, dlogits) == backward(dlogits), and
 * backward_features(dfeat, NULL) leaves the head without gradient. */
static void check_backward_features(const char *arch, int in_ch, int image) {
    enum { B = 2, K = 5 };
    visc_model *m = make_model(arch, K, in_ch, image, B, 3);
    if (!m) return;
    const int D = m->feature_dim;
    size_t xn = (size_t)B * in_ch * image * image, P = m->params.total;
    float *x = malloc(xn * sizeof(float)), *dl = malloc(sizeof(float) * B * K);
    float *df = calloc((size_t)B * D, sizeof(float)), *g1 = malloc(P * sizeof(float));
    fill_normal(x, xn, 1);
    fill_normal(dl, (size_t)B * K, 2);
    char wname[VISC_MAX_NAME];
    snprintf(wname, sizeof wname, "%sweight", m->head_prefix);
    int wi = visc_table_find(&m->params, wname);
    CHECK_MSG(wi >= 0, "%s: no %s", arch, wname);
    if (wi < 0) goto out;
    const float *W = visc_table_get(&m->params, wi); /* [K, D] */
    for (int b = 0; b < B; b++)
        for (int j = 0; j < D; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)dl[b * K + k] * W[(size_t)k * D + j];
            df[(size_t)b * D + j] = (float)s;
        }
    m->forward(m, x, 1);
    m->backward(m, dl);
    memcpy(g1, m->grads, P * sizeof(float));
    double scale = max_abs(g1, P);
    CHECK(scale > 0);
    m->forward(m, x, 1);
    m->backward_features(m, df, dl);
    char what[VISC_MAX_NAME + 64];
    snprintf(what, sizeof what, "%s: backward_features vs backward", arch);
    CHECK_ARRAYS(what, m->grads, g1, P, 1e-5 * scale, 1e-5);
    /* no dlogits: the head's gradient is zero, the backbone's unchanged */
    m->forward(m, x, 1);
    m->backward_features(m, df, NULL);
    for (int i = 0; i < m->params.count; i++) {
        const visc_tensor_entry *e = &m->params.entries[i];
        const float *g = m->grads + e->offset;
        if (is_head(m, e->name)) {
            CHECK_MSG(max_abs(g, e->numel) == 0, "%s: %s has a gradient without dlogits", arch,
                      e->name);
        } else {
            snprintf(what, sizeof what, "%s: %s (dlogits NULL)", arch, e->name);
            CHECK_ARRAYS(what, g, g1 + e->offset, e->numel, 1e-5 * scale, 1e-5);
        }
    }
out:
    free(x);
    free(dl);
    free(df);
    free(g1);
    visc_model_destroy(m);
}

TEST(backward_features_resnet20) { check_backward_features("resnet20", 3, 32); }
TEST(backward_features_vit_femto) { check_backward_features("vit_femto_patch4_28", 1, 28); }
TEST(backward_features_swin_micro) {
    check_backward_features("swin_micro_patch2_window4_32", 3, 32);
}

/* A small learnable in-memory data set: 4 classes told apart by colour
 * (red, green, blue, grey; pooled features keep colour, not position),
 * with pixel noise. */
static visc_dataset *colours(int n, int size, uint64_t seed) {
    uint8_t *img = malloc((size_t)n * 3 * size * size);
    int32_t *lab = malloc(sizeof(int32_t) * n);
    visc_rng r = visc_rng_make(seed, 5, 0);
    for (int i = 0; i < n; i++) {
        int c = i % 4;
        lab[i] = c;
        for (int ch = 0; ch < 3; ch++)
            for (int y = 0; y < size; y++)
                for (int x = 0; x < size; x++) {
                    int base = c == 3 ? 120 : ch == c ? 170 : 70;
                    int v = base + (int)visc_rng_below(&r, 60);
                    img[(((size_t)i * 3 + ch) * size + y) * size + x] = (uint8_t)v;
                }
    }
    return visc_dataset_from_memory(img, lab, n, 3, size, size, 4);
}

static const visc_augment plain = {0, 0, {0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f}, 0};

TEST(extract_features_normalized_in_order) {
    visc_dataset *ds = colours(10, 16, 1);
    visc_model *m = make_model("resnet20", 4, 3, 16, 4, 1);
    visc_feature_bank fb;
    CHECK(visc_extract_features(m, ds, &plain, 1, NULL, &fb) == 0);
    CHECK(fb.count == 10 && fb.dim == m->feature_dim && fb.num_classes == 4);
    /* sample 9 alone (batch of copies) gives the same feature direction */
    size_t sample = 3 * 16 * 16;
    float *x = malloc(4 * sample * sizeof(float));
    for (int b = 0; b < 4; b++) {
        int32_t y;
        CHECK(ds->get(ds, 9, &plain, 0, 0, 0, x + b * sample, &y) == 0);
    }
    m->forward(m, x, 0);
    double ss = 0;
    for (int j = 0; j < fb.dim; j++) ss += (double)m->features[j] * m->features[j];
    float *want = malloc(sizeof(float) * fb.dim);
    for (int j = 0; j < fb.dim; j++) want[j] = (float)(m->features[j] / sqrt(ss));
    CHECK_ARRAYS("feature of sample 9", fb.feats + (size_t)9 * fb.dim, want, fb.dim, 1e-5, 1e-4);
    for (int i = 0; i < 10; i++) {
        double n2 = 0;
        for (int j = 0; j < fb.dim; j++)
            n2 += (double)fb.feats[i * fb.dim + j] * fb.feats[i * fb.dim + j];
        CHECK_CLOSE(n2, 1.0, 1e-5, 0);
        CHECK(fb.labels[i] == i % 4);
    }
    free(want);
    free(x);
    visc_feature_bank_free(&fb);
    visc_model_destroy(m);
    visc_dataset_free(ds);
}

TEST(linear_probe_freezes_the_backbone) {
    visc_dataset *train = colours(48, 16, 2), *val = colours(24, 16, 3);
    visc_model *m = make_model("resnet20", 4, 3, 16, 8, 4);
    const size_t P = m->params.total, Bf = m->buffers.total;
    /* BatchNorm statistics that are not the init (an update would move them) */
    for (int i = 0; i < m->buffers.count; i++) {
        const visc_tensor_entry *e = &m->buffers.entries[i];
        float *v = visc_table_get(&m->buffers, i);
        fill_normal(v, e->numel, 100 + (uint64_t)i);
        int var = strstr(e->name, "running_var") != NULL;
        for (size_t j = 0; j < e->numel; j++) v[j] = var ? 1.0f + 0.2f * fabsf(v[j]) : 0.1f * v[j];
    }
    float *p0 = malloc(P * sizeof(float)), *b0 = malloc(Bf * sizeof(float));
    memcpy(p0, m->params.data, P * sizeof(float));
    memcpy(b0, m->buffers.data, Bf * sizeof(float));
    int64_t updates0 = m->bn_updates;
    visc_augment aug = plain;
    aug.pad_crop = 2;
    aug.hflip = 1;
    visc_linear_probe_config c;
    visc_linear_probe_defaults(&c);
    c.epochs = 0;
    c.lr = 0.05f;
    c.workers = 2;
    const int D = m->feature_dim, C = 4;
    float *h0 = malloc(sizeof(float) * (C * D + C)), *h1 = malloc(sizeof(float) * (C * D + C));
    visc_linear_probe_result r;
    CHECK(visc_linear_probe(m, train, &aug, val, &plain, &c, NULL, h0, &r) == 0);
    CHECK(r.steps == 0);
    c.epochs = 10;
    CHECK(visc_linear_probe(m, train, &aug, val, &plain, &c, NULL, h1, &r) == 0);
    CHECK(r.steps == 10 * (48 / 8));
    CHECK(r.best_epoch >= 1 && r.best_epoch <= 10);
    CHECK(r.best_top1 >= r.last_top1 && r.best_top5 >= r.best_top1);
    CHECK(memcmp(m->params.data, p0, P * sizeof(float)) == 0);
    CHECK(memcmp(m->buffers.data, b0, Bf * sizeof(float)) == 0);
    CHECK(m->bn_updates == updates0);
    int changed = 0;
    for (int i = 0; i < C * D + C; i++) changed += h0[i] != h1[i];
    CHECK_MSG(changed > C * D / 2, "only %d of %d head values changed", changed, C * D + C);
    /* the probe separates the colours on random features */
    CHECK_MSG(r.best_top1 >= 60, "linear probe top1 %.1f%% (chance 25%%)", r.best_top1);
    /* written into the model's classifier: only the head tensors move */
    CHECK(visc_set_head(m, h1, h1 + (size_t)C * D, C) == 0);
    for (int i = 0; i < m->params.count; i++) {
        const visc_tensor_entry *e = &m->params.entries[i];
        int same =
            memcmp(m->params.data + e->offset, p0 + e->offset, e->numel * sizeof(float)) == 0;
        CHECK_MSG(same != is_head(m, e->name), "%s %s", e->name, same ? "unchanged" : "changed");
    }
    CHECK(visc_set_head(m, h1, h1, 3) == -1);
    free(h0);
    free(h1);
    free(p0);
    free(b0);
    visc_model_destroy(m);
    visc_dataset_free(train);
    visc_dataset_free(val);
}

TEST(backbone_load_skips_the_head_and_reset_head_reinits_it) {
    visc_model *a = make_model("resnet20", 10, 3, 16, 2, 5);
    visc_model *b = make_model("resnet20", 4, 3, 16, 2, 6);
    char path[64];
    snprintf(path, sizeof path, "/tmp/visc_test_ssl_eval_%d.safetensors", (int)getpid());
    CHECK(visc_save_model(a, path, NULL) == 0);
    CHECK(visc_load_model(b, path) == -1); /* fc is [10, 64] in the file */
    CHECK(strstr(visc_last_error(), "fc.weight") != NULL);
    float *fc_b = malloc(sizeof(float) * b->params.total);
    memcpy(fc_b, b->params.data, sizeof(float) * b->params.total);
    CHECK(visc_load_model_backbone(b, path) == 0);
    for (int i = 0; i < b->params.count; i++) {
        const visc_tensor_entry *e = &b->params.entries[i];
        const float *src = is_head(b, e->name)
                               ? fc_b + e->offset
                               : visc_table_get(&a->params, visc_table_find(&a->params, e->name));
        CHECK_MSG(memcmp(b->params.data + e->offset, src, e->numel * sizeof(float)) == 0, "%s",
                  e->name);
    }
    CHECK(memcmp(a->buffers.data, b->buffers.data, a->buffers.total * sizeof(float)) == 0);
    /* a fresh head: torch.nn.Linear's U(+-1/sqrt(64)), everything else kept */
    memcpy(fc_b, b->params.data, sizeof(float) * b->params.total);
    visc_reset_head(b, 11);
    for (int i = 0; i < b->params.count; i++) {
        const visc_tensor_entry *e = &b->params.entries[i];
        const float *p = b->params.data + e->offset;
        if (!is_head(b, e->name)) {
            CHECK(memcmp(p, fc_b + e->offset, e->numel * sizeof(float)) == 0);
            continue;
        }
        double mx = max_abs(p, e->numel);
        /* 256 weights reach near the bound; 4 biases stay inside it */
        CHECK_MSG(mx <= 0.125 && (e->numel < 100 || mx > 0.1), "%s: max |w| %g", e->name, mx);
        CHECK(memcmp(p, fc_b + e->offset, e->numel * sizeof(float)) != 0);
    }
    unlink(path);
    free(fc_b);
    visc_model_destroy(a);
    visc_model_destroy(b);
}

/* test_ssl.c: the self-supervised pieces (include/visc/ssl.h).
 *
 * tests/golden/ssl.safetensors is written by tools/gen_golden_ssl.py
 * (PyTorch, the reference library's formulas). Covered: L2 normalization,
 * InfoNCE against a bank and NT-Xent (losses and gradients against
 * PyTorch and against finite differences), the perfectly correlated case
 * -log(1 / (M + 1)), the memory bank's behaviour (unit rows, order, the
 * wrap-around policy, more keys than rows, a bank used before its keys go
 * in, gather with one process), the projection heads against PyTorch, and
 * the momentum schedule. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "visc/optim.h"
#include "visc/ssl.h"

#define GOLDEN "ssl.safetensors"

static float *gold(const char *name, size_t n) { return visc_golden_load(GOLDEN, name, n); }

TEST(golden_file_opens) { CHECK(visc_golden_file(GOLDEN) != NULL); }

TEST(l2_normalize_matches_pytorch) {
    float *x = gold("norm.x", 48), *dy = gold("norm.dy", 48);
    float *y_ref = gold("norm.y", 48), *dx_ref = gold("norm.dx", 48);
    float y[48], dx[48], norms[6];
    visc_l2_normalize_forward(y, norms, x, 6, 8);
    CHECK_ARRAYS("normalize", y, y_ref, 48, 1e-7, 1e-6);
    visc_l2_normalize_backward(dx, dy, y, norms, 6, 8);
    CHECK_ARRAYS("normalize backward", dx, dx_ref, 48, 1e-7, 1e-5);
    free(x), free(dy), free(y_ref), free(dx_ref);
}

/* A bank holding the given rows (ptr 0). */
static visc_memory_bank bank_of(const float *rows, int64_t K, int D) {
    visc_memory_bank mb;
    visc_memory_bank_init(&mb, K, D, 1);
    memcpy(mb.bank, rows, (size_t)K * D * sizeof(float));
    return mb;
}

TEST(infonce_matches_pytorch) {
    const int n = 6, D = 8, K = 20;
    float *q = gold("infonce.q", n * D), *k = gold("infonce.k", n * D);
    float *rows = gold("infonce.bank", K * D), *loss_ref = gold("infonce.loss", 1);
    float *dq_ref = gold("infonce.dq", n * D);
    visc_memory_bank mb = bank_of(rows, K, D);
    float dq[48], scratch[6 * 21];
    float loss = visc_infonce_forward_backward(dq, q, k, &mb, n, 0.2f, scratch);
    CHECK_CLOSE(loss, loss_ref[0], 0, 1e-6);
    CHECK_ARRAYS("InfoNCE dq", dq, dq_ref, n * D, 1e-7, 1e-5);
    /* finite differences of the loss in q (in double around float inputs) */
    for (int e = 0; e < n * D; e += 7) {
        float saved = q[e], h = 1e-3f;
        q[e] = saved + h;
        double up = visc_infonce_forward_backward(NULL, q, k, &mb, n, 0.2f, scratch);
        q[e] = saved - h;
        double down = visc_infonce_forward_backward(NULL, q, k, &mb, n, 0.2f, scratch);
        q[e] = saved;
        CHECK_CLOSE((up - down) / (2 * h), dq[e], 2e-4, 2e-2);
    }
    visc_memory_bank_free(&mb);
    free(q), free(k), free(rows), free(loss_ref), free(dq_ref);
}

/* All embeddings equal: every logit is 1 / t, so the loss is log(M + 1). */
TEST(infonce_perfectly_correlated_is_log_m_plus_1) {
    const int n = 4, D = 16, K = 64;
    visc_memory_bank mb;
    visc_memory_bank_init(&mb, K, D, 3);
    float q[4 * 16], scratch[4 * 65];
    for (int i = 0; i < n * D; i++) q[i] = (i % D == 5) ? 1.0f : 0.0f;
    for (int i = 0; i < K * D; i++) mb.bank[i] = (i % D == 5) ? 1.0f : 0.0f;
    float loss = visc_infonce_forward_backward(NULL, q, q, &mb, n, 0.2f, scratch);
    CHECK_CLOSE(loss, -log(1.0 / (K + 1)), 1e-5, 1e-6);
    visc_memory_bank_free(&mb);
}

TEST(ntxent_matches_pytorch) {
    const int n = 5, D = 8;
    float *z0 = gold("ntxent.z0", n * D), *z1 = gold("ntxent.z1", n * D);
    float *loss_ref = gold("ntxent.loss", 1);
    float *dz0_ref = gold("ntxent.dz0", n * D), *dz1_ref = gold("ntxent.dz1", n * D);
    visc_ntxent x;
    visc_ntxent_init(&x, n, D, 1, 0);
    float dz0[40], dz1[40];
    float loss = visc_ntxent_forward_backward(&x, NULL, z0, z1, 0.1f, dz0, dz1);
    CHECK_CLOSE(loss, loss_ref[0], 0, 1e-6);
    CHECK_ARRAYS("NT-Xent dz0", dz0, dz0_ref, n * D, 1e-6, 1e-5);
    CHECK_ARRAYS("NT-Xent dz1", dz1, dz1_ref, n * D, 1e-6, 1e-5);
    float g0[40], g1[40];
    for (int e = 0; e < n * D; e += 3) {
        float *z = e % 2 ? z1 : z0, saved = z[e], h = 1e-3f;
        z[e] = saved + h;
        double up = visc_ntxent_forward_backward(&x, NULL, z0, z1, 0.1f, g0, g1);
        z[e] = saved - h;
        double down = visc_ntxent_forward_backward(&x, NULL, z0, z1, 0.1f, g0, g1);
        z[e] = saved;
        CHECK_CLOSE((up - down) / (2 * h), e % 2 ? dz1[e] : dz0[e], 5e-4, 2e-2);
    }
    visc_ntxent_free(&x);
    free(z0), free(z1), free(loss_ref), free(dz0_ref), free(dz1_ref);
}

TEST(memory_bank_rows_are_unit_and_seeded) {
    visc_memory_bank a, b, c;
    visc_memory_bank_init(&a, 50, 12, 7);
    visc_memory_bank_init(&b, 50, 12, 7);
    visc_memory_bank_init(&c, 50, 12, 8);
    CHECK(memcmp(a.bank, b.bank, 50 * 12 * sizeof(float)) == 0);
    CHECK(memcmp(a.bank, c.bank, 50 * 12 * sizeof(float)) != 0);
    for (int i = 0; i < 50; i++) {
        double s = 0;
        for (int j = 0; j < 12; j++) s += (double)a.bank[i * 12 + j] * a.bank[i * 12 + j];
        CHECK_CLOSE(s, 1.0, 1e-6, 0);
    }
    CHECK(a.ptr == 0);
    visc_memory_bank_free(&a), visc_memory_bank_free(&b), visc_memory_bank_free(&c);
}

/* Keys k (row i holds the value base + i in every column). */
static void keys(float *k, int n, int D, float base) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < D; j++) k[i * D + j] = base + (float)i;
}

TEST(memory_bank_wraps_around_without_dropping) {
    /* K = 10, batches of 4: rows 0-3, 4-7, then 8, 9 and 0, 1 */
    const int D = 3;
    visc_memory_bank mb;
    visc_memory_bank_init(&mb, 10, D, 1);
    float k[4 * 3];
    for (int step = 0; step < 3; step++) {
        keys(k, 4, D, 100.0f * (step + 1));
        visc_memory_bank_enqueue(&mb, k, 4);
    }
    CHECK(mb.ptr == 2);
    const float want[10] = {302, 303, 102, 103, 200, 201, 202, 203, 300, 301};
    for (int r = 0; r < 10; r++)
        for (int j = 0; j < D; j++) CHECK_CLOSE(mb.bank[r * D + j], want[r], 0, 0);
    /* more keys than rows: the last K stay, the pointer moves on by n */
    float many[13 * 3];
    keys(many, 13, D, 1000.0f);
    visc_memory_bank_enqueue(&mb, many, 13);
    CHECK(mb.ptr == (2 + 13) % 10);
    /* key i (value 1000 + i) sits at row (2 + i) % 10, for the last 10 keys */
    for (int i = 3; i < 13; i++) CHECK_CLOSE(mb.bank[((2 + i) % 10) * D], 1000.0f + i, 0, 0);
    visc_memory_bank_free(&mb);
}

/* The loss of a step sees the bank before its own keys: a query equal to
 * its key gets the same loss against the bank as against a copy taken
 * before the step; enqueueing first would put the key among its own
 * negatives and change the loss. */
TEST(memory_bank_keys_are_never_their_own_negatives) {
    const int n = 3, D = 4, K = 8;
    visc_memory_bank mb, copy;
    visc_memory_bank_init(&mb, K, D, 5);
    visc_memory_bank_init(&copy, K, D, 5);
    float q[12], s[3 * 9];
    for (int i = 0; i < n * D; i++) q[i] = (i % D == i / D) ? 1.0f : 0.0f;
    float before = visc_infonce_forward_backward(NULL, q, q, &mb, n, 0.2f, s);
    CHECK_CLOSE(before, visc_infonce_forward_backward(NULL, q, q, &copy, n, 0.2f, s), 0, 0);
    visc_memory_bank_enqueue(&copy, q, n); /* the wrong order */
    float wrong = visc_infonce_forward_backward(NULL, q, q, &copy, n, 0.2f, s);
    CHECK_MSG(wrong > before + 0.1f, "own keys as negatives raise the loss: %g vs %g",
              (double)wrong, (double)before);
    visc_memory_bank_free(&mb), visc_memory_bank_free(&copy);
}

TEST(memory_bank_gather_with_one_process_is_a_local_enqueue) {
    visc_dist *d = visc_dist_open("none", 0);
    CHECK(d != NULL);
    visc_memory_bank a, b;
    visc_memory_bank_init(&a, 16, 4, 2);
    visc_memory_bank_init(&b, 16, 4, 2);
    float k[5 * 4], gathered[5 * 4];
    keys(k, 5, 4, 7.0f);
    CHECK(visc_memory_bank_enqueue_gathered(&a, d, k, 5, gathered) == 0);
    CHECK(visc_memory_bank_enqueue_gathered(&a, NULL, k, 5, gathered) == 0);
    visc_memory_bank_enqueue(&b, k, 5);
    visc_memory_bank_enqueue(&b, k, 5);
    CHECK(a.ptr == 10 && memcmp(a.bank, b.bank, 16 * 4 * sizeof(float)) == 0);
    visc_memory_bank_free(&a), visc_memory_bank_free(&b);
    visc_dist_close(d);
}

/* Loads golden weights into a head's tables by their names. */
static void set_weights(visc_proj_head *h, const char *name) {
    visc_table *tabs[2] = {&h->params, &h->buffers};
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < tabs[t]->count; i++) {
            const visc_tensor_entry *e = &tabs[t]->entries[i];
            char key[200];
            snprintf(key, sizeof key, "%s.%s", name, e->name);
            if (t == 1) { /* running statistics start at 0 / 1 as in PyTorch */
                float *v = visc_table_get(tabs[t], i);
                for (size_t j = 0; j < e->numel; j++) v[j] = strstr(e->name, "var") ? 1.0f : 0.0f;
                continue;
            }
            float *w = gold(key, e->numel);
            memcpy(visc_table_get(tabs[t], i), w, e->numel * sizeof(float));
            free(w);
        }
}

static void check_head(const char *name, int bn) {
    const int in = 12, hid = 10, out = 6, B = 4;
    visc_proj_head h;
    visc_proj_head_init(&h, "", in, hid, out, B, bn, 1);
    set_weights(&h, name);
    char key[200];
    snprintf(key, sizeof key, "%s.x", name);
    float *x = gold(key, B * in);
    snprintf(key, sizeof key, "%s.g", name);
    float *g = gold(key, B * out);
    visc_proj_head_forward(&h, x, 1);
    snprintf(key, sizeof key, "%s.out", name);
    float *want = gold(key, B * out);
    CHECK_ARRAYS(name, h.output, want, B * out, 1e-6, 1e-5);
    float dx[4 * 12];
    visc_proj_head_backward(&h, g, dx);
    snprintf(key, sizeof key, "%s.dx", name);
    float *dx_ref = gold(key, B * in);
    CHECK_ARRAYS(name, dx, dx_ref, B * in, 1e-6, 1e-5);
    for (int i = 0; i < h.params.count; i++) {
        const visc_tensor_entry *e = &h.params.entries[i];
        snprintf(key, sizeof key, "%s.grad.%s", name, e->name);
        float *gr = gold(key, e->numel);
        CHECK_ARRAYS(e->name, h.grads + e->offset, gr, e->numel, 1e-6, 1e-5);
        free(gr);
    }
    for (int i = 0; i < h.buffers.count; i++) { /* running statistics after one step */
        const visc_tensor_entry *e = &h.buffers.entries[i];
        snprintf(key, sizeof key, "%s.%s", name, e->name);
        float *st = gold(key, e->numel);
        CHECK_ARRAYS(e->name, visc_table_get(&h.buffers, i), st, e->numel, 1e-7, 1e-5);
        free(st);
    }
    free(x), free(g), free(want), free(dx_ref);
    visc_proj_head_free(&h);
}

TEST(moco_head_matches_pytorch) { check_head("moco_head", 0); }
TEST(simclr_head_matches_pytorch) { check_head("simclr_head", 1); }

TEST(projection_heads_have_the_reference_names) {
    visc_proj_head m, s;
    visc_proj_head_init(&m, "projection_head.", 8, 8, 4, 2, 0, 1);
    visc_proj_head_init(&s, "projection_head.", 8, 8, 4, 2, 1, 1);
    CHECK(visc_table_find(&m.params, "projection_head.layers.0.bias") >= 0);
    CHECK(visc_table_find(&m.params, "projection_head.layers.2.weight") >= 0);
    CHECK(visc_table_find(&s.params, "projection_head.layers.0.bias") < 0);
    CHECK(visc_table_find(&s.params, "projection_head.layers.1.weight") >= 0);
    CHECK(visc_table_find(&s.buffers, "projection_head.layers.1.running_var") >= 0);
    CHECK(visc_table_find(&s.params, "projection_head.layers.3.bias") >= 0);
    visc_proj_head_free(&m), visc_proj_head_free(&s);
}

TEST(momentum_schedule) {
    CHECK(visc_momentum_at(0.99f, 0, 0, 100) == 0.99f);
    CHECK(visc_momentum_at(0.99f, 0, 77, 100) == 0.99f);
    CHECK_CLOSE(visc_momentum_at(0.99f, 1, 0, 100), 0.99, 1e-7, 0);
    CHECK_CLOSE(visc_momentum_at(0.99f, 1, 99, 100), 1.0, 1e-7, 0);
    /* halfway: 1 - 0.01 * (cos(pi / 2) + 1) / 2 */
    CHECK_CLOSE(visc_momentum_at(0.99f, 1, 50, 101), 0.995, 1e-6, 0);
    /* the update itself (visc_ema_update): exactly m * key + (1 - m) * q in float */
    float key[3] = {1.0f, -2.0f, 0.5f}, q[3] = {0.25f, 4.0f, -1.0f};
    visc_ema_update(key, q, 3, 0.99f);
    float keep = 0.99f, take = (float)(1.0 - 0.99f);
    CHECK(key[0] == keep * 1.0f + take * 0.25f);
    CHECK(key[1] == keep * -2.0f + take * 4.0f);
}

/* ---- the key encoder, through a real (tiny) pretraining run ---- */

/* A 2-class ImageFolder of 4 CIFAR-10 JPEGs each, under a fresh temp dir. */
static int tiny_folder(char *root, size_t size) {
    const char *src = "../shared/data/cifar10/train";
    if (access(src, R_OK) != 0) src = "/work/shared/data/cifar10/train";
    snprintf(root, size, "/tmp/visc_test_ssl_XXXXXX");
    if (!mkdtemp(root)) return -1;
    const char *classes[2] = {"airplane", "cat"};
    char cmd[1024];
    for (int c = 0; c < 2; c++) {
        snprintf(cmd, sizeof cmd,
                 "mkdir -p %s/data/%s && ls %s/%s | head -4 | sed 's|^|%s/%s/|' | xargs cp -t "
                 "%s/data/%s",
                 root, classes[c], src, classes[c], src, classes[c], root, classes[c]);
        if (system(cmd) != 0) return -1;
    }
    return 0;
}

static float *read_tensor(const char *path, const char *name, size_t n) {
    visc_safetensors st;
    float *x = calloc(n ? n : 1, sizeof(float));
    if (visc_safetensors_open(&st, path) == 0) {
        if (visc_safetensors_read_f32(&st, name, x, n))
            visc_test_fail(__FILE__, __LINE__, "%s", visc_last_error());
        visc_safetensors_close(&st);
    } else {
        visc_test_fail(__FILE__, __LINE__, "%s", visc_last_error());
    }
    return x;
}

/* MoCo's key encoder gets no gradient and advances right after each step
 * (and once before the first): after step 1 it is exactly m * k0 +
 * (1 - m) * q1, k0 = m * q0 + (1 - m) * q0 of the initial weights q0 and
 * q1 the first checkpoint's query; after step 2 exactly m * key1 +
 * (1 - m) * q2 of the first checkpoint's key and the second's query. */
TEST(key_encoder_moves_only_by_momentum) {
    char root[128], spec[200], out[2][256], ckpt[2][320];
    CHECK(tiny_folder(root, sizeof root) == 0);
    snprintf(spec, sizeof spec, "imagefolder:%s/data", root);
    visc_train_config c;
    visc_pretrain_config_defaults(&c);
    snprintf(c.data_dir, sizeof c.data_dir, "%s", spec);
    snprintf(c.val_data, sizeof c.val_data, "%s", spec);
    snprintf(c.model.arch, sizeof c.model.arch, "resnet14");
    c.model.width = 8;
    c.model.image_size = 32;
    c.crop_pct = 1;
    c.batch_size = 4;
    c.epochs = 1;
    c.ssl.bank_size = 8;
    c.ssl.momentum = 0.9f; /* far from 1, so the update shows in every bit */
    c.no_progress = 1;
    c.print_freq = 0;
    c.workers = 1;
    c.seed = 5;
    CHECK(visc_ssl_resolve(&c) == 0);
    for (int run = 0; run < 2; run++) {
        snprintf(out[run], sizeof out[run], "%s/run%d", root, run + 1);
        snprintf(ckpt[run], sizeof ckpt[run], "%s/checkpoint_last.safetensors", out[run]);
        snprintf(c.output, sizeof c.output, "%s", out[run]);
        c.max_steps = run + 1;
        CHECK_MSG(visc_pretrain(&c) == 0, "pretrain: %s", visc_last_error());
    }
    /* the initial query weights: the same model from the same seed */
    visc_model_config mc = c.model;
    mc.num_classes = 2, mc.in_channels = 3, mc.batch = 4;
    visc_model *q0 = visc_model_create(&mc, c.seed);
    CHECK(q0 != NULL);
    if (!q0) return;
    int exact = 1, moved = 0;
    for (int i = 0; i < q0->params.count; i++) {
        const visc_tensor_entry *e = &q0->params.entries[i];
        char key[200];
        snprintf(key, sizeof key, "momentum_encoder.%s", e->name);
        float *key1 = read_tensor(ckpt[0], key, e->numel);
        float *key2 = read_tensor(ckpt[1], key, e->numel);
        float *q1 = read_tensor(ckpt[0], e->name, e->numel);
        float *q2 = read_tensor(ckpt[1], e->name, e->numel);
        float *want = malloc(e->numel * sizeof(float));
        memcpy(want, visc_table_get(&q0->params, i), e->numel * sizeof(float));
        visc_ema_update(want, visc_table_get(&q0->params, i), e->numel, 0.9f);
        visc_ema_update(want, q1, e->numel, 0.9f);
        exact &= memcmp(want, key1, e->numel * sizeof(float)) == 0;
        memcpy(want, key1, e->numel * sizeof(float));
        visc_ema_update(want, q2, e->numel, 0.9f);
        exact &= memcmp(want, key2, e->numel * sizeof(float)) == 0;
        moved |= memcmp(key1, key2, e->numel * sizeof(float)) != 0;
        free(key1), free(key2), free(q1), free(q2), free(want);
    }
    CHECK_MSG(exact, "the key encoder is not the momentum average of the query encoder");
    CHECK_MSG(moved, "the key encoder did not move");
    visc_model_destroy(q0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(system(cmd) == 0);
}

/* The step the key encoder was advanced for: as saved, step - 1 in a
 * checkpoint of before it was saved, and never outside -1..step. */
TEST(ssl_state_key_step) {
    const char *base = "{\"ssl_method\":\"mocov2\",\"epoch\":0,\"step\":7,\"step_in_epoch\":7,"
                       "\"sample_pos\":70,\"best_top1\":0,\"optimizer_steps\":7,"
                       "\"head_optimizer_steps\":7,\"bn_updates\":7,\"key_bn_updates\":7,"
                       "\"bank_ptr\":0,\"world\":1%s}";
    char text[600];
    visc_ssl_state s;
    snprintf(text, sizeof text, base, ",\"key_step\":7");
    CHECK(visc_ssl_state_parse(text, &s) == 0 && s.key_step == 7);
    snprintf(text, sizeof text, base, "");
    CHECK(visc_ssl_state_parse(text, &s) == 0 && s.key_step == 6);
    snprintf(text, sizeof text, base, ",\"key_step\":8");
    CHECK(visc_ssl_state_parse(text, &s) != 0);
    snprintf(text, sizeof text, base, ",\"key_step\":-2");
    CHECK(visc_ssl_state_parse(text, &s) != 0);
}

/* test_grad_checkpointing.c: activation recomputation (--grad-checkpointing,
 * model.h) changes memory, not results.
 *
 * For each family (a CIFAR ResNet, ResNet-50's bottlenecks with their
 * downsampling and max-pool, a ViT and a Swin V2 with drop-path, CaiT), two
 * models from one seed, one of them recomputing: two training steps on the
 * same batch and the same noise, then an evaluation forward. The logits,
 * every gradient and every buffer (BatchNorm's running statistics, which a
 * recomputed forward must not update twice) must be the same bits, and
 * the recomputing model must plan less activation memory.
 *
 * The same for what ResNets recompute by default, the outputs of the
 * norms inside a block (cfg.keep_norm_outputs = 0), against keeping them,
 * alone and with --grad-checkpointing. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/model.h"
#include "visc/optim.h"

static void fill(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
}

static int same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Models `keep` and `recompute` (one seed, configurations that differ in
 * what they recompute) give the same bits, and `recompute` plans fewer
 * bytes. */
static void check_same(const char *what, const visc_model_config *keep_cfg,
                       const visc_model_config *recompute_cfg) {
    visc_model *kept = visc_model_create(keep_cfg, 11);
    visc_model *recomputed = visc_model_create(recompute_cfg, 11);
    CHECK(kept && recomputed);
    if (!kept || !recomputed) return;
    CHECK_MSG(recomputed->activation_bytes < kept->activation_bytes,
              "%s: %zu bytes of activations recomputing, %zu keeping", what,
              recomputed->activation_bytes, kept->activation_bytes);
    const visc_model_config *cfg = keep_cfg;
    const size_t xn = (size_t)cfg->batch * cfg->in_channels * cfg->image_size * cfg->image_size;
    const size_t ln = (size_t)cfg->batch * cfg->num_classes;
    float *x = malloc(xn * sizeof(float)), *dlogits = malloc(ln * sizeof(float));
    fill(x, xn, 3);
    fill(dlogits, ln, 5);
    visc_model *both[2] = {kept, recomputed};
    for (int step = 0; step < 2; step++) {
        for (int k = 0; k < 2; k++) {
            both[k]->noise_seed = 77 + (uint64_t)step; /* drop-path draws the same samples */
            both[k]->forward(both[k], x, 1);
            both[k]->backward(both[k], dlogits);
        }
        CHECK_MSG(same_bits(kept->logits, recomputed->logits, ln), "%s step %d: logits", what,
                  step);
        CHECK_MSG(same_bits(kept->grads, recomputed->grads, kept->params.total),
                  "%s step %d: gradients", what, step);
        CHECK_MSG(same_bits(kept->buffers.data, recomputed->buffers.data, kept->buffers.total),
                  "%s step %d: buffers (running statistics)", what, step);
        CHECK(kept->bn_updates == recomputed->bn_updates);
    }
    for (int k = 0; k < 2; k++) both[k]->forward(both[k], x, 0);
    CHECK_MSG(same_bits(kept->logits, recomputed->logits, ln), "%s: evaluation logits", what);
    free(x), free(dlogits);
    visc_model_destroy(kept);
    visc_model_destroy(recomputed);
}

static visc_model_config config(const char *arch, int image, int channels, int batch,
                                float drop_path) {
    visc_model_config cfg = {.num_classes = 10,
                             .in_channels = channels,
                             .image_size = image,
                             .batch = batch,
                             .drop_path_rate = drop_path};
    snprintf(cfg.arch, sizeof cfg.arch, "%s", arch);
    return cfg;
}

static void check_family(const char *arch, int image, int channels, int batch, float drop_path) {
    visc_model_config keep = config(arch, image, channels, batch, drop_path);
    visc_model_config recompute = keep;
    recompute.grad_checkpointing = 1;
    check_same(arch, &keep, &recompute);
}

/* A ResNet's norm outputs recomputed (the default) against kept, alone
 * and under --grad-checkpointing. */
static void check_norm_outputs(const char *arch, int image, int batch) {
    for (int checkpointing = 0; checkpointing < 2; checkpointing++) {
        visc_model_config keep = config(arch, image, 3, batch, 0.0f);
        keep.keep_norm_outputs = 1;
        keep.grad_checkpointing = checkpointing;
        visc_model_config recompute = keep;
        recompute.keep_norm_outputs = 0;
        char what[96];
        snprintf(what, sizeof what, "%s, norm outputs recomputed%s", arch,
                 checkpointing ? ", checkpointing" : "");
        check_same(what, &keep, &recompute);
    }
}

TEST(resnet20_recomputed_is_the_same) { check_family("resnet20", 32, 3, 8, 0.0f); }
TEST(resnet50_recomputed_is_the_same) { check_family("resnet50", 32, 3, 2, 0.0f); }
TEST(vit_recomputed_is_the_same) { check_family("vit_pico_patch4_28", 28, 1, 4, 0.2f); }
TEST(swinv2_recomputed_is_the_same) {
    check_family("swinv2_micro_patch2_window4_32", 32, 3, 2, 0.2f);
}
TEST(swin_recomputed_is_the_same) { check_family("swin_micro_patch2_window4_32", 32, 3, 2, 0.2f); }
TEST(cait_recomputed_is_the_same) { check_family("cait_xxs24_224", 32, 3, 2, 0.1f); }
TEST(resnet20_norm_outputs_recomputed_are_the_same) { check_norm_outputs("resnet20", 32, 8); }
/* bottlenecks, the max-pool stem (its norm's output recomputed too) */
TEST(resnet50_norm_outputs_recomputed_are_the_same) { check_norm_outputs("resnet50", 32, 2); }
/* basic blocks with the ImageNet stem; planes of 2x2 and 1x1 (the small-plane path) */
TEST(resnet18_norm_outputs_recomputed_are_the_same) { check_norm_outputs("resnet18", 48, 3); }

/* A forward-only model (cfg.forward_only: MoCo's momentum encoder) gives
 * a full model's logits, features and running statistics, bit for bit,
 * over two training forwards and an evaluation one, and plans at most
 * `share` of its activation bytes. */
static void check_forward_only(const char *arch, int image, int channels, int batch, double share) {
    visc_model_config cfg = config(arch, image, channels, batch, 0.0f);
    visc_model *full = visc_model_create(&cfg, 11);
    cfg.forward_only = 1;
    visc_model *fwd = visc_model_create(&cfg, 11);
    CHECK(full && fwd);
    if (!full || !fwd) return;
    CHECK_MSG((double)fwd->activation_bytes <= share * (double)full->activation_bytes,
              "%s: %zu bytes of activations forward-only, %zu for training (want <= %.2f of it)",
              arch, fwd->activation_bytes, full->activation_bytes, share);
    const size_t xn = (size_t)batch * channels * image * image, ln = (size_t)batch * 10;
    const size_t fn = (size_t)batch * full->feature_dim;
    float *x = malloc(xn * sizeof(float));
    for (int pass = 0; pass < 3; pass++) {
        fill(x, xn, 3 + (uint32_t)pass);
        visc_model *both[2] = {full, fwd};
        for (int k = 0; k < 2; k++) both[k]->forward(both[k], x, pass < 2);
        CHECK_MSG(same_bits(full->logits, fwd->logits, ln), "%s pass %d: logits", arch, pass);
        CHECK_MSG(same_bits(full->features, fwd->features, fn), "%s pass %d: features", arch, pass);
        CHECK_MSG(same_bits(full->buffers.data, fwd->buffers.data, full->buffers.total),
                  "%s pass %d: buffers (running statistics)", arch, pass);
    }
    free(x);
    visc_model_destroy(full);
    visc_model_destroy(fwd);
}

TEST(forward_only_models_are_the_same) {
    check_forward_only("resnet20", 32, 3, 8, 0.5);
    check_forward_only("resnet50", 64, 3, 2, 0.5);
    check_forward_only("resnet18", 48, 3, 3, 0.6);
    check_forward_only("vit_pico_patch4_28", 28, 1, 4, 0.5);
    check_forward_only("swin_micro_patch2_window4_32", 32, 3, 2, 0.8);
    check_forward_only("cait_xxs24_224", 32, 3, 2, 0.5);
}

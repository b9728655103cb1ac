/* test_grad_checkpointing.c: activation recomputation (--grad-checkpointing,
 * model.h) changes memory, not results.
 *
 * For each family (a CIFAR ResNet, ResNet-50's bottlenecks with their
 * downsampling and max-pool, a ViT and a Swin V2 with drop-path, CaiT), two
 * models from one seed, one of them recomputing: two training steps on the
 * same batch and the same noise, then an evaluation forward. The logits,
 * every gradient and every buffer (BatchNorm's running statistics, which a
 * recomputed forward must not update twice) must be the same bits, and
 * the recomputing model must plan less activation memory. */
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

static void check_family(const char *arch, int image, int channels, int batch, float drop_path) {
    visc_model_config cfg = {.num_classes = 10,
                             .in_channels = channels,
                             .image_size = image,
                             .batch = batch,
                             .drop_path_rate = drop_path};
    snprintf(cfg.arch, sizeof cfg.arch, "%s", arch);
    visc_model *kept = visc_model_create(&cfg, 11);
    cfg.grad_checkpointing = 1;
    visc_model *recomputed = visc_model_create(&cfg, 11);
    CHECK(kept && recomputed);
    if (!kept || !recomputed) return;
    CHECK_MSG(recomputed->activation_bytes < kept->activation_bytes,
              "%s: %zu bytes of activations recomputing, %zu keeping", arch,
              recomputed->activation_bytes, kept->activation_bytes);
    const size_t xn = (size_t)batch * channels * image * image, ln = (size_t)batch * 10;
    float *x = malloc(xn * sizeof(float)), *dlogits = malloc(ln * sizeof(float));
    fill(x, xn, 3);
    fill(dlogits, ln, 5);
    for (int step = 0; step < 2; step++) {
        visc_model *both[2] = {kept, recomputed};
        for (int k = 0; k < 2; k++) {
            both[k]->noise_seed = 77 + (uint64_t)step; /* drop-path draws the same samples */
            both[k]->forward(both[k], x, 1);
            both[k]->backward(both[k], dlogits);
        }
        CHECK_MSG(same_bits(kept->logits, recomputed->logits, ln), "%s step %d: logits", arch,
                  step);
        CHECK_MSG(same_bits(kept->grads, recomputed->grads, kept->params.total),
                  "%s step %d: gradients", arch, step);
        CHECK_MSG(same_bits(kept->buffers.data, recomputed->buffers.data, kept->buffers.total),
                  "%s step %d: buffers (running statistics)", arch, step);
        CHECK(kept->bn_updates == recomputed->bn_updates);
    }
    kept->forward(kept, x, 0);
    recomputed->forward(recomputed, x, 0);
    CHECK_MSG(same_bits(kept->logits, recomputed->logits, ln), "%s: evaluation logits", arch);
    free(x), free(dlogits);
    visc_model_destroy(kept);
    visc_model_destroy(recomputed);
}

TEST(resnet20_recomputed_is_the_same) { check_family("resnet20", 32, 3, 8, 0.0f); }
TEST(resnet50_recomputed_is_the_same) { check_family("resnet50", 32, 3, 2, 0.0f); }
TEST(vit_recomputed_is_the_same) { check_family("vit_pico_patch4_28", 28, 1, 4, 0.2f); }
TEST(swinv2_recomputed_is_the_same) {
    check_family("swinv2_micro_patch2_window4_32", 32, 3, 2, 0.2f);
}
TEST(swin_recomputed_is_the_same) { check_family("swin_micro_patch2_window4_32", 32, 3, 2, 0.2f); }
TEST(cait_recomputed_is_the_same) { check_family("cait_xxs24_224", 32, 3, 2, 0.1f); }

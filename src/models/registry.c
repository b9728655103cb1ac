/* registry.c: architecture names -> constructors. */
#include <string.h>

#include "visc/core.h"
#include "visc/model.h"

static const char *const names[] = {"resnet18",
                                    "resnet34",
                                    "resnet50",
                                    "resnet101",
                                    "resnet152",
                                    "resnet14",
                                    "resnet20",
                                    "resnet32",
                                    "resnet56",
                                    "vit_tiny_patch16_224",
                                    "vit_small_patch16_224",
                                    "vit_base_patch16_224",
                                    "deit_tiny_patch16_224",
                                    "deit_small_patch16_224",
                                    "deit_base_patch16_224",
                                    "vit_tiny_patch4_32",
                                    "deit_tiny_patch4_32",
                                    "vit_small_patch4_32",
                                    "vit_femto_patch4_28",
                                    "vit_pico_patch4_28",
                                    "cait_xxs24_224",
                                    "cait_s24_224",
                                    "swin_tiny_patch4_window7_224",
                                    "swin_small_patch4_window7_224",
                                    "swin_base_patch4_window7_224",
                                    "swinv2_tiny_window8_256",
                                    "swinv2_small_window8_256",
                                    "swinv2_base_window8_256",
                                    "swin_tiny_patch2_window4_32",
                                    "swinv2_tiny_patch2_window4_32",
                                    "swin_micro_patch2_window4_32",
                                    "swinv2_micro_patch2_window4_32",
                                    NULL};

const char *const *visc_model_names(void) { return names; }

/* A forward-only model's backward (model.h: cfg.forward_only): nothing
 * kept to run it from. */
static void no_backward(visc_model *m, const float *dlogits) {
    (void)dlogits;
    visc_die("%s was planned for forward alone (forward_only): it has no backward", m->cfg.arch);
}

static void no_backward_features(visc_model *m, const float *dfeatures, const float *dlogits) {
    (void)dfeatures;
    no_backward(m, dlogits);
}

static visc_model *create_family(const visc_model_config *cfg, uint64_t seed) {
    if (strncmp(cfg->arch, "resnet", 6) == 0) return visc_resnet_create(cfg, seed);
    if (strncmp(cfg->arch, "vit_", 4) == 0 || strncmp(cfg->arch, "deit_", 5) == 0)
        return visc_vit_create(cfg, seed);
    if (strncmp(cfg->arch, "cait_", 5) == 0) return visc_cait_create(cfg, seed);
    return visc_swin_create(cfg, seed);
}

visc_model *visc_model_create(const visc_model_config *cfg, uint64_t seed) {
    int known = 0;
    for (int i = 0; names[i] && !known; i++) known = strcmp(names[i], cfg->arch) == 0;
    if (known) {
        visc_model *m = create_family(cfg, seed);
        if (m && cfg->forward_only) {
            m->backward = no_backward;
            if (m->backward_features) m->backward_features = no_backward_features;
        }
        return m;
    }
    /* The full list is longer than an error line: name the families and
     * point at `visc models`, plus the known names sharing the first word. */
    int count = 0;
    char close[256] = "";
    const char *us = strchr(cfg->arch, '_');
    size_t stem = us ? (size_t)(us - cfg->arch) + 1 : strlen(cfg->arch);
    for (int i = 0; names[i]; i++, count++)
        if (stem > 1 && strncmp(names[i], cfg->arch, stem) == 0 &&
            strlen(close) + strlen(names[i]) + 3 < sizeof close) {
            strcat(close, close[0] ? ", " : "; similar: ");
            strcat(close, names[i]);
        }
    visc_set_error("unknown model '%s' (resnet*, vit_*, deit_*, cait_*, swin_*, swinv2_*: "
                   "`visc models` lists all %d%s)",
                   cfg->arch, count, close);
    return NULL;
}

void visc_model_destroy(visc_model *m) {
    if (m) m->destroy(m);
}

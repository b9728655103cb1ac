/* registry.c: architecture names -> constructors. */
#include <string.h>

#include "visc/model.h"

static const char *const names[] = {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
                                    "resnet14", "resnet20", "resnet32", "resnet56",  NULL};

const char *const *visc_model_names(void) { return names; }

visc_model *visc_model_create(const visc_model_config *cfg, uint64_t seed) {
    if (strncmp(cfg->arch, "resnet", 6) == 0) return visc_resnet_create(cfg, seed);
    char list[512] = "";
    for (int i = 0; names[i]; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, names[i], sizeof list - strlen(list) - 1);
    }
    visc_set_error("unknown model '%s' (known: %s)", cfg->arch, list);
    return NULL;
}

void visc_model_destroy(visc_model *m) {
    if (m) m->destroy(m);
}

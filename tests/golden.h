/* golden.h: helpers shared by the golden-file parity tests.
 *
 * Model weights are not stored in the golden files: tools/gen_golden.py and
 * golden_fill_model() fill every parameter and BatchNorm buffer from the same
 * integer hash of (FNV-1a of the state_dict key, element index), so both
 * sides start from bit-identical weights. The float arithmetic is one
 * multiply and one add per element, in that order; the build is baseline
 * x86-64 and -std=c11 turns off FMA contraction, so it rounds as numpy does.
 * Any change here must be mirrored in tools/gen_golden.py (and the goldens
 * regenerated). */
#ifndef VISC_TESTS_GOLDEN_H
#define VISC_TESTS_GOLDEN_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/table.h"

static inline uint32_t golden_fnv1a(const char *s) {
    uint32_t h = 0x811C9DC5u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x01000193u;
    return h;
}

/* Element i of tensor t as a uniform in [0, 1) with 24 random bits. */
static inline float golden_u01(uint32_t t, uint32_t i) {
    uint32_t x = i * 0x9E3779B1u + t * 0x85EBCA77u + 0x165667B1u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    x *= 0x297A2D39u;
    x ^= x >> 15;
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

/* (scale, offset) of a state_dict key from its suffix and rank; 0 if no rule applies.
 *   conv / linear weight: uniform with variance 1/fan_in    (scale 2 sqrt(3 / fan_in))
 *   BatchNorm weight: 1 +- 0.1; BatchNorm and linear bias: +-0.1
 *   the last BatchNorm of a bottleneck branch (".bn3.weight"): 0.3 +- 0.05
 *   running_mean: +-0.1; running_var: 1 +- 0.25
 * The bn3 rule (cf. torchvision's zero_init_residual) damps each residual
 * branch. With gamma ~1 there, train-mode ResNet-50 is chaotic: a 1e-7
 * relative perturbation of the input grows to ~4e-5 at layer4 (x370), so fp32
 * rounding reaches ~1e-4 of the activations there and flips the sign of a few
 * ReLU inputs lying within it of 0, each flip moving a gradient by ~10% of
 * max|g|. With 0.3 the growth is ~x16 and flips become rare (see
 * tools/gen_golden.py and tests/test_resnet_parity.c). Only Bottleneck blocks
 * have a bn3, so the resnet18 cases are unaffected. */
static inline int golden_kind(const char *name, int ndim, const int64_t *shape, float *scale,
                              float *offset) {
    size_t n = strlen(name);
#define GOLDEN_ENDS(s) (n >= sizeof(s) - 1 && strcmp(name + n - (sizeof(s) - 1), s) == 0)
    *offset = 0.0f;
    if (GOLDEN_ENDS(".running_mean")) {
        *scale = 0.2f;
    } else if (GOLDEN_ENDS(".running_var")) {
        *scale = 0.5f;
        *offset = 1.0f;
    } else if (GOLDEN_ENDS(".weight") && ndim >= 2) {
        int64_t fan_in = 1;
        for (int d = 1; d < ndim; d++) fan_in *= shape[d];
        *scale = (float)(2.0 * sqrt(3.0 / (double)fan_in));
    } else if (GOLDEN_ENDS(".bn3.weight") && ndim == 1) {
        *scale = 0.1f;
        *offset = 0.3f;
    } else if (GOLDEN_ENDS(".weight") && ndim == 1) {
        *scale = 0.2f;
        *offset = 1.0f;
    } else if (GOLDEN_ENDS(".bias")) {
        *scale = 0.2f;
    } else {
        return 0;
    }
#undef GOLDEN_ENDS
    return 1;
}

/* The fill rule of a table entry; aborts (a test bug) if none applies. */
static inline void golden_rule(const visc_tensor_entry *e, uint32_t *t, float *scale,
                               float *offset) {
    if (!golden_kind(e->name, e->ndim, e->shape, scale, offset)) {
        fprintf(stderr, "golden.h: no hash fill rule for tensor '%s'\n", e->name);
        abort();
    }
    *t = golden_fnv1a(e->name);
}

/* Element i of the hash-filled tensor (for spot checks of sampled tensors). */
static inline float golden_value(const visc_tensor_entry *e, size_t i) {
    uint32_t t;
    float scale, offset;
    golden_rule(e, &t, &scale, &offset);
    return (golden_u01(t, (uint32_t)i) - 0.5f) * scale + offset;
}

static inline void golden_fill_table(visc_table *tab) {
    for (int k = 0; k < tab->count; k++) {
        const visc_tensor_entry *e = &tab->entries[k];
        uint32_t t;
        float scale, offset, *dst = tab->data + e->offset;
        golden_rule(e, &t, &scale, &offset);
        for (size_t i = 0; i < e->numel; i++)
            dst[i] = (golden_u01(t, (uint32_t)i) - 0.5f) * scale + offset;
    }
}

static inline void golden_fill_model(visc_table *params, visc_table *buffers) {
    golden_fill_table(params);
    golden_fill_table(buffers);
}

#endif

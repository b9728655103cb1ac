/* finetune.c: the pieces of the finetune evaluation that are not the
 * training loop itself (that is visc_train with reset_head): a fresh
 * classifier, and reading the best epoch back from the run's log. Also the
 * way back from a linear probe to a complete classifier file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/rng.h"
#include "visc/ssl_eval.h"

/* Substream of VISC_STREAM_INIT for a re-initialized head: away from the
 * substreams model init uses (small tensor indices). */
#define HEAD_SUBSTREAM 0x4eadull

void visc_reset_head(visc_model *m, uint64_t seed) {
    size_t plen = strlen(m->head_prefix);
    char wname[VISC_MAX_NAME];
    snprintf(wname, sizeof wname, "%sweight", m->head_prefix);
    int w = visc_table_find(&m->params, wname);
    for (int i = 0; i < m->params.count; i++) {
        const visc_tensor_entry *e = &m->params.entries[i];
        if (strncmp(e->name, m->head_prefix, plen) != 0) continue;
        /* torch.nn.Linear.reset_parameters: weight and bias both
         * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a =
         * sqrt(5) reduces to that bound) */
        const visc_tensor_entry *we = w >= 0 ? &m->params.entries[w] : e;
        int64_t fan_in = we->shape[we->ndim - 1];
        float bound = 1.0f / sqrtf((float)(fan_in > 0 ? fan_in : 1));
        visc_rng r = visc_rng_make(seed, VISC_STREAM_INIT, HEAD_SUBSTREAM + (uint64_t)i);
        float *p = visc_table_get(&m->params, i);
        for (size_t j = 0; j < e->numel; j++) p[j] = bound * (2.0f * visc_rng_uniform(&r) - 1.0f);
    }
}

int visc_set_head(visc_model *m, const float *weight, const float *bias, int num_classes) {
    char wname[VISC_MAX_NAME], bname[VISC_MAX_NAME];
    snprintf(wname, sizeof wname, "%sweight", m->head_prefix);
    snprintf(bname, sizeof bname, "%sbias", m->head_prefix);
    int w = visc_table_find(&m->params, wname), b = visc_table_find(&m->params, bname);
    if (w < 0 || b < 0)
        return visc_set_error("%s has no single-Linear classifier '%s'", m->cfg.arch, wname);
    const visc_tensor_entry *we = &m->params.entries[w], *be = &m->params.entries[b];
    if (we->ndim != 2 || we->shape[0] != num_classes || we->shape[1] != m->feature_dim ||
        be->numel != (size_t)num_classes)
        return visc_set_error("%s: the classifier of %s is not [%d, %d]", wname, m->cfg.arch,
                              num_classes, m->feature_dim);
    memcpy(visc_table_get(&m->params, w), weight, we->numel * sizeof(float));
    memcpy(visc_table_get(&m->params, b), bias, be->numel * sizeof(float));
    return 0;
}

/* The number after "key": in one JSON line we wrote; -1 when absent. */
static int field(const char *line, const char *key, double *out) {
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) return -1;
    char *end;
    *out = strtod(p + strlen(pat), &end);
    return end == p + strlen(pat) ? -1 : 0;
}

int visc_best_val_epoch(const char *dir, int *epoch, double *top1, double *top5) {
    char path[1100], line[1024];
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) return visc_set_error("cannot read %s: %s", path, strerror(errno));
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        double e, t1, t5;
        if (!strstr(line, "\"type\":\"val\"") || field(line, "epoch", &e) ||
            field(line, "top1", &t1) || field(line, "top5", &t5))
            continue;
        if (!found || t1 > *top1) { /* the first of equal bests, as visc train's model_best */
            *epoch = (int)e;
            *top1 = t1;
            *top5 = t5;
        }
        found = 1;
    }
    fclose(f);
    if (!found) return visc_set_error("%s: no validation results", path);
    return 0;
}

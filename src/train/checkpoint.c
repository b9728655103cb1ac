/* checkpoint.c: model files and training checkpoints, both safetensors.
 *
 * model_*.safetensors holds exactly torchvision's state_dict (parameters,
 * running statistics, num_batches_tracked as I64), so PyTorch loads it with
 * strict=True. checkpoint_last.safetensors adds what resuming needs: the
 * optimizer's flat state ("optimizer.slot0", ...), the EMA buffers, and the
 * train state in the metadata. Both are written atomically. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/io.h"
#include "visc/train.h"

static void add_model(visc_st_writer *w, const visc_model *m) {
    visc_st_writer_add_table(w, &m->params, "");
    visc_st_writer_add_table(w, &m->buffers, "");
    int64_t count = m->bn_updates;
    for (int i = 0; i < m->num_bn; i++) {
        char key[VISC_MAX_NAME + 32];
        snprintf(key, sizeof key, "%s.num_batches_tracked", m->bn_names[i]);
        visc_st_writer_add(w, key, VISC_DTYPE_I64, 0, NULL, &count);
    }
    visc_st_writer_meta(w, "arch", m->cfg.arch);
    visc_st_writer_meta(w, "format", "pt");
}

int visc_save_model(const visc_model *m, const char *path, const char *extra_meta_json) {
    visc_st_writer *w = visc_st_writer_new();
    add_model(w, m);
    if (extra_meta_json) visc_st_writer_meta(w, "visc", extra_meta_json);
    int rc = visc_st_writer_save(w, path);
    visc_st_writer_free(w);
    return rc;
}

static int is_model_key(const visc_model *m, const char *name) {
    if (visc_table_find(&m->params, name) >= 0 || visc_table_find(&m->buffers, name) >= 0) return 1;
    for (int i = 0; i < m->num_bn; i++) {
        size_t n = strlen(m->bn_names[i]);
        if (strncmp(name, m->bn_names[i], n) == 0 && strcmp(name + n, ".num_batches_tracked") == 0)
            return 1;
    }
    return 0;
}

/* "[2x3x4]" */
static void shape_text(char *out, size_t n, int ndim, const int64_t *shape) {
    out[0] = 0;
    for (int d = 0; d < ndim; d++)
        snprintf(out + strlen(out), n - strlen(out), "%s%lld", d ? "x" : "", (long long)shape[d]);
}

/* A learned position embedding stored for another resolution: fitted to
 * the model's grid as timm's checkpoint_filter_fn does (the model knows its
 * prefix tokens; visc_pos_embed_adapt). 1: done, 0: not applicable, -1: error. */
static int load_resampled_pos_embed(const visc_model *m, const visc_tensor_entry *e,
                                    const visc_st_tensor *s, const visc_safetensors *st,
                                    float *dst) {
    if (strcmp(e->name, "pos_embed") != 0 || visc_table_find(&m->params, e->name) < 0) return 0;
    size_t numel = 1;
    for (int d = 0; d < s->ndim; d++) numel *= (size_t)s->shape[d];
    float *old = visc_malloc(numel * sizeof(float), "position embedding");
    int rc = visc_safetensors_read_f32(st, e->name, old, numel) ||
             visc_pos_embed_adapt(m, dst, old, s->ndim, s->shape);
    free(old);
    return rc ? -1 : 1;
}

/* Appends name to a comma-separated list shown in an error (first few). */
static void list_add(char *list, size_t n, int *count, const char *name) {
    if (*count < 4)
        snprintf(list + strlen(list), n - strlen(list), "%s%s", *count ? ", " : "", name);
    else if (*count == 4) snprintf(list + strlen(list), n - strlen(list), ", ...");
    (*count)++;
}

/* skip (NULL: none): a name prefix whose tensors are neither read nor required. */
static int skipped(const char *name, const char *skip) {
    return skip && skip[0] && strncmp(name, skip, strlen(skip)) == 0;
}

static int load_table(const visc_model *m, visc_table *t, const visc_safetensors *st,
                      const char *path, char *missing, size_t missing_size, int *num_missing,
                      const char *skip) {
    for (int i = 0; i < t->count; i++) {
        const visc_tensor_entry *e = &t->entries[i];
        if (skipped(e->name, skip)) continue;
        const visc_st_tensor *s = visc_safetensors_find(st, e->name);
        if (!s) {
            list_add(missing, missing_size, num_missing, e->name);
            continue;
        }
        int same = s->ndim == e->ndim;
        for (int d = 0; same && d < e->ndim; d++) same = s->shape[d] == e->shape[d];
        if (!same) {
            int r = load_resampled_pos_embed(m, e, s, st, visc_table_get(t, i));
            if (r < 0) return visc_set_error("%s: %s", path, visc_last_error());
            if (r == 1) continue;
            char want[64], got[64];
            shape_text(want, sizeof want, e->ndim, e->shape);
            shape_text(got, sizeof got, s->ndim, s->shape);
            return visc_set_error("%s: tensor '%s' has shape [%s], the model needs [%s]", path,
                                  e->name, got, want);
        }
        if (visc_safetensors_read_f32(st, e->name, visc_table_get(t, i), e->numel)) return -1;
    }
    return 0;
}

/* Loads every model tensor; a file that lacks some, or (strict) has tensors
 * the model does not know, is refused with the lists of both, the way
 * torch's load_state_dict reports missing and unexpected keys. */
static int load_model_from(visc_model *m, const visc_safetensors *st, const char *path, int strict,
                           const char *skip) {
    char missing[512] = "", unexpected[512] = "";
    int num_missing = 0, num_unexpected = 0;
    if (load_table(m, &m->params, st, path, missing, sizeof missing, &num_missing, skip) ||
        load_table(m, &m->buffers, st, path, missing, sizeof missing, &num_missing, skip))
        return -1;
    if (strict)
        for (int i = 0; i < st->count; i++)
            if (!is_model_key(m, st->tensors[i].name) && !skipped(st->tensors[i].name, skip))
                list_add(unexpected, sizeof unexpected, &num_unexpected, st->tensors[i].name);
    if (num_missing || num_unexpected) {
        char detail[1100] = "";
        if (num_missing) snprintf(detail, sizeof detail, "%d missing (%s)", num_missing, missing);
        if (num_unexpected)
            snprintf(detail + strlen(detail), sizeof detail - strlen(detail),
                     "%s%d unexpected (%s)", num_missing ? ", " : "", num_unexpected, unexpected);
        return visc_set_error("%s: not a checkpoint of model %s: %s tensors", path, m->cfg.arch,
                              detail);
    }
    if (m->num_bn > 0) {
        char key[VISC_MAX_NAME + 32];
        snprintf(key, sizeof key, "%s.num_batches_tracked", m->bn_names[0]);
        float count = 0;
        if (visc_safetensors_find(st, key) && visc_safetensors_read_f32(st, key, &count, 1) == 0)
            m->bn_updates = (int64_t)count;
    }
    return 0;
}

int visc_load_model(visc_model *m, const char *path) {
    visc_safetensors st;
    if (visc_safetensors_open(&st, path)) return -1;
    /* A full training checkpoint is accepted too: its extra keys are ours. */
    int is_checkpoint = visc_safetensors_meta(&st, "visc_train_state") != NULL;
    int rc = load_model_from(m, &st, path, !is_checkpoint, NULL);
    visc_safetensors_close(&st);
    return rc;
}

int visc_load_model_backbone(visc_model *m, const char *path) {
    visc_safetensors st;
    if (visc_safetensors_open(&st, path)) return -1;
    int is_checkpoint = visc_safetensors_meta(&st, "visc_train_state") != NULL;
    int rc = load_model_from(m, &st, path, !is_checkpoint, m->head_prefix);
    visc_safetensors_close(&st);
    return rc;
}

int visc_save_checkpoint(const visc_model *m, const visc_optimizer *o, const float *ema_params,
                         const float *ema_buffers, const visc_train_state *s,
                         const char *config_text, const char *path) {
    visc_st_writer *w = visc_st_writer_new();
    add_model(w, m);
    for (int k = 0; k < o->slots; k++) {
        char key[64];
        int64_t shape[1] = {(int64_t)m->params.total};
        snprintf(key, sizeof key, "optimizer.slot%d", k);
        visc_st_writer_add(w, key, VISC_DTYPE_F32, 1, shape,
                           o->state + (size_t)k * m->params.total);
    }
    if (ema_params) {
        int64_t ps[1] = {(int64_t)m->params.total}, bs[1] = {(int64_t)m->buffers.total};
        visc_st_writer_add(w, "ema.params", VISC_DTYPE_F32, 1, ps, ema_params);
        if (m->buffers.total)
            visc_st_writer_add(w, "ema.buffers", VISC_DTYPE_F32, 1, bs, ema_buffers);
    }
    char state[2048], ranks[1200] = "";
    int world = s->world > 0 ? s->world : 1;
    if (world > 1 && world <= VISC_MAX_SAVED_RANKS) {
        size_t used = 0;
        for (int r = 0; r < world; r++)
            used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%" PRId64, r ? "," : "",
                                     s->rank_pos[r]);
    }
    snprintf(state, sizeof state,
             "{\"epoch\":%" PRId64 ",\"step\":%" PRId64 ",\"step_in_epoch\":%" PRId64
             ",\"sample_pos\":%" PRId64
             ",\"best_top1\":%.17g,\"optimizer\":\"%s\",\"optimizer_steps\":%" PRId64
             ",\"world\":%d,\"rank_sample_pos\":\"%s\"}",
             s->epoch, s->step, s->step_in_epoch, s->sample_pos, s->best_top1,
             visc_opt_kind_name(o->cfg.kind), o->step, world, ranks);
    visc_st_writer_meta(w, "visc_train_state", state);
    if (config_text) visc_st_writer_meta(w, "visc_config", config_text);
    int rc = visc_st_writer_save(w, path);
    visc_st_writer_free(w);
    return rc;
}

/* Reads integer or float field `key` from the flat JSON object we wrote. */
static int json_number(const char *json, const char *key, double *out) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p) return -1;
    char *end;
    *out = strtod(p + strlen(pat), &end);
    return end == p + strlen(pat) ? -1 : 0;
}

static int json_string(const char *json, const char *key, char *out, size_t n) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = strstr(json, pat);
    if (!p) return -1;
    p += strlen(pat);
    const char *q = strchr(p, '"');
    if (!q || (size_t)(q - p) >= n) return -1;
    memcpy(out, p, (size_t)(q - p));
    out[q - p] = 0;
    return 0;
}

int visc_load_checkpoint(visc_model *m, visc_optimizer *o, float *ema_params, float *ema_buffers,
                         visc_train_state *s, const char *path) {
    visc_safetensors st;
    if (visc_safetensors_open(&st, path)) return -1;
    int rc = -1;
    const char *state = visc_safetensors_meta(&st, "visc_train_state");
    const char *arch = visc_safetensors_meta(&st, "arch");
    double epoch, step, in_epoch, best, opt_steps;
    char opt_name[32];
    if (!state || json_number(state, "epoch", &epoch) || json_number(state, "step", &step) ||
        json_number(state, "step_in_epoch", &in_epoch) || json_number(state, "best_top1", &best) ||
        json_number(state, "optimizer_steps", &opt_steps) ||
        json_string(state, "optimizer", opt_name, sizeof opt_name)) {
        visc_set_error("%s: not a visc training checkpoint (no valid visc_train_state metadata)",
                       path);
        goto out;
    }
    if (arch && strcmp(arch, m->cfg.arch) != 0) {
        visc_set_error("%s: checkpoint of model %s, but training %s", path, arch, m->cfg.arch);
        goto out;
    }
    if (strcmp(opt_name, visc_opt_kind_name(o->cfg.kind)) != 0) {
        visc_set_error("%s: checkpoint was trained with optimizer %s, not %s", path, opt_name,
                       visc_opt_kind_name(o->cfg.kind));
        goto out;
    }
    if (load_model_from(m, &st, path, 0, NULL)) goto out;
    for (int k = 0; k < o->slots; k++) {
        char key[64];
        snprintf(key, sizeof key, "optimizer.slot%d", k);
        if (visc_safetensors_read_f32(&st, key, o->state + (size_t)k * m->params.total,
                                      m->params.total))
            goto out;
    }
    if (ema_params) {
        if (visc_safetensors_read_f32(&st, "ema.params", ema_params, m->params.total)) goto out;
        if (m->buffers.total &&
            visc_safetensors_read_f32(&st, "ema.buffers", ema_buffers, m->buffers.total))
            goto out;
    }
    s->epoch = (int64_t)epoch;
    s->step = (int64_t)step;
    s->step_in_epoch = (int64_t)in_epoch;
    /* The loader cursor (older checkpoints: none, i.e. no skipped samples). */
    double pos;
    s->sample_pos = json_number(state, "sample_pos", &pos) == 0 ? (int64_t)pos : -1;
    s->best_top1 = best;
    /* the ranks' cursors of a multi-process run ("" or absent: one process) */
    double world;
    s->world = json_number(state, "world", &world) == 0 ? (int)world : 1;
    char ranks[1200];
    int saved = 0;
    if (s->world > 1 && s->world <= VISC_MAX_SAVED_RANKS &&
        json_string(state, "rank_sample_pos", ranks, sizeof ranks) == 0) {
        for (const char *p = ranks; *p && saved < s->world; saved++) {
            char *end;
            s->rank_pos[saved] = strtoll(p, &end, 10);
            if (end == p) break;
            p = *end == ',' ? end + 1 : end;
        }
    }
    if (s->world > 1 && saved != s->world) s->world = 0; /* cursors unknown: from the step */
    o->step = (int64_t)opt_steps;
    rc = 0;
out:
    visc_safetensors_close(&st);
    return rc;
}

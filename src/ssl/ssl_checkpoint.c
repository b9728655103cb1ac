/* ssl_checkpoint.c: pretraining checkpoints (safetensors, atomic).
 *
 * The query encoder is stored under its own state_dict names with the
 * "visc_train_state" metadata key, so every tool that reads a model file
 * (visc_load_model, `visc eval`, `visc train --weights`) takes a
 * pretraining checkpoint as the query encoder's weights; the other tensors
 * are extra keys those readers ignore. The resume state (this file's own
 * JSON in that key) carries "ssl_method", which a supervised resume lacks. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/io.h"
#include "visc/json.h"
#include "visc/ssl.h"

#define KEY_PREFIX "momentum_encoder."

static void add_slots(visc_st_writer *w, const visc_optimizer *o, const char *name) {
    for (int k = 0; k < o->slots; k++) {
        char key[64];
        int64_t shape[1] = {(int64_t)o->params->total};
        snprintf(key, sizeof key, "%s.slot%d", name, k);
        visc_st_writer_add(w, key, VISC_DTYPE_F32, 1, shape,
                           o->state + (size_t)k * o->params->total);
    }
}

int visc_ssl_save_checkpoint(const visc_ssl_parts *p, const char *config_text, const char *path) {
    visc_st_writer *w = visc_st_writer_new();
    visc_st_writer_add_table(w, &p->query->params, "");
    visc_st_writer_add_table(w, &p->query->buffers, "");
    visc_st_writer_add_table(w, &p->head->params, "");
    visc_st_writer_add_table(w, &p->head->buffers, "");
    add_slots(w, p->opt, "optimizer");
    add_slots(w, p->head_opt, "head_optimizer");
    if (p->key) {
        visc_st_writer_add_table(w, &p->key->params, KEY_PREFIX);
        visc_st_writer_add_table(w, &p->key->buffers, KEY_PREFIX);
        visc_st_writer_add_table(w, &p->key_head->params, "momentum_");
        visc_st_writer_add_table(w, &p->key_head->buffers, "momentum_");
    }
    int64_t bank_ptr = 0;
    if (p->bank) {
        int64_t shape[2] = {p->bank->size, p->bank->dim};
        visc_st_writer_add(w, "memory_bank.bank", VISC_DTYPE_F32, 2, shape, p->bank->bank);
        bank_ptr = p->bank->ptr;
    }
    const visc_train_state *s = p->state;
    char ranks[1200] = "";
    int world = s->world > 0 ? s->world : 1;
    for (int r = 0; world > 1 && world <= VISC_MAX_SAVED_RANKS && r < world; r++) {
        size_t used = strlen(ranks);
        snprintf(ranks + used, sizeof ranks - used, "%s%" PRId64, r ? "," : "", s->rank_pos[r]);
    }
    char state[2048];
    snprintf(state, sizeof state,
             "{\"ssl_method\":\"%s\",\"epoch\":%" PRId64 ",\"step\":%" PRId64
             ",\"step_in_epoch\":%" PRId64 ",\"sample_pos\":%" PRId64
             ",\"best_top1\":%.17g,\"optimizer_steps\":%" PRId64
             ",\"head_optimizer_steps\":%" PRId64 ",\"bn_updates\":%" PRId64
             ",\"key_bn_updates\":%" PRId64 ",\"bank_ptr\":%" PRId64 ",\"key_step\":%" PRId64
             ",\"world\":%d,\"rank_sample_pos\":\"%s\"}",
             p->method, s->epoch, s->step, s->step_in_epoch, s->sample_pos, s->best_top1,
             p->opt->step, p->head_opt->step, p->query->bn_updates, p->key ? p->key->bn_updates : 0,
             bank_ptr, p->key_step ? *p->key_step : s->step, world, ranks);
    visc_st_writer_meta(w, "visc_train_state", state);
    visc_st_writer_meta(w, "arch", p->query->cfg.arch);
    visc_st_writer_meta(w, "format", "pt");
    if (config_text) visc_st_writer_meta(w, "visc_config", config_text);
    int rc = visc_st_writer_save(w, path);
    visc_st_writer_free(w);
    return rc;
}

static int read_table(const visc_safetensors *st, visc_table *t, const char *prefix) {
    for (int i = 0; i < t->count; i++) {
        char key[VISC_MAX_NAME + 32];
        snprintf(key, sizeof key, "%s%s", prefix, t->entries[i].name);
        if (visc_safetensors_read_f32(st, key, visc_table_get(t, i), t->entries[i].numel))
            return -1;
    }
    return 0;
}

static int read_slots(const visc_safetensors *st, visc_optimizer *o, const char *name) {
    for (int k = 0; k < o->slots; k++) {
        char key[64];
        snprintf(key, sizeof key, "%s.slot%d", name, k);
        if (visc_safetensors_read_f32(st, key, o->state + (size_t)k * o->params->total,
                                      o->params->total))
            return -1;
    }
    return 0;
}

/* An integer member of the state object; -1 when absent or not an integer. */
static int get_int(const visc_json *obj, const char *key, int64_t *out) {
    const visc_json *v = visc_json_get(obj, key);
    return v ? visc_json_int(v, out) : -1;
}

int visc_ssl_state_parse(const char *text, visc_ssl_state *out) {
    memset(out, 0, sizeof *out);
    visc_json root;
    if (visc_json_parse(&root, text, strlen(text))) return -1;
    visc_train_state *s = &out->train;
    const visc_json *method = visc_json_get(&root, "ssl_method");
    const visc_json *best = visc_json_get(&root, "best_top1");
    const visc_json *ranks = visc_json_get(&root, "rank_sample_pos");
    int64_t world = 1;
    int rc = -1;
    if (!method || method->type != VISC_JSON_STRING || !best || best->type != VISC_JSON_NUMBER ||
        get_int(&root, "epoch", &s->epoch) || get_int(&root, "step", &s->step) ||
        get_int(&root, "step_in_epoch", &s->step_in_epoch) ||
        get_int(&root, "sample_pos", &s->sample_pos) ||
        get_int(&root, "optimizer_steps", &out->opt_steps) ||
        get_int(&root, "head_optimizer_steps", &out->head_opt_steps) ||
        get_int(&root, "bn_updates", &out->bn_updates) ||
        get_int(&root, "key_bn_updates", &out->key_bn_updates) ||
        get_int(&root, "bank_ptr", &out->bank_ptr) || get_int(&root, "world", &world)) {
        visc_set_error("no valid pretraining state");
        goto out;
    }
    if (s->epoch < 0 || s->step < 0 || s->step_in_epoch < 0 || world < 1) {
        visc_set_error("pretraining state with negative counts");
        goto out;
    }
    if (get_int(&root, "key_step", &out->key_step)) out->key_step = s->step - 1;
    if (out->key_step < -1 || out->key_step > s->step) {
        visc_set_error("pretraining state: key_step %" PRId64 " outside -1..step %" PRId64,
                       out->key_step, s->step);
        goto out;
    }
    snprintf(out->method, sizeof out->method, "%s", method->str);
    s->best_top1 = strtod(best->str, NULL);
    /* the ranks' loader cursors (world 0: unknown, restart from the step) */
    s->world = world > VISC_MAX_SAVED_RANKS ? 0 : (int)world;
    int saved = 0;
    if (s->world > 1 && ranks && ranks->type == VISC_JSON_STRING) {
        for (const char *c = ranks->str; *c && saved < s->world; saved++) {
            char *end;
            s->rank_pos[saved] = strtoll(c, &end, 10);
            if (end == c) break;
            c = *end == ',' ? end + 1 : end;
        }
    }
    if (s->world > 1 && saved != s->world) s->world = 0;
    rc = 0;
out:
    visc_json_free(&root);
    return rc;
}

int visc_ssl_load_checkpoint(const visc_ssl_parts *p, const char *path) {
    visc_safetensors st;
    if (visc_safetensors_open(&st, path)) return -1;
    int rc = -1;
    int64_t bank_ptr = 0;
    const char *state = visc_safetensors_meta(&st, "visc_train_state");
    if (!state || !strstr(state, "\"ssl_method\"")) {
        visc_set_error("%s: not a visc pretraining checkpoint (no pretraining state)", path);
        goto out;
    }
    visc_ssl_state parsed;
    if (visc_ssl_state_parse(state, &parsed)) {
        visc_set_error("%s: %s", path, visc_last_error());
        goto out;
    }
    if (strcmp(parsed.method, p->method) != 0) {
        visc_set_error("%s: a %s checkpoint, but the method is %s", path, parsed.method, p->method);
        goto out;
    }
    *p->state = parsed.train;
    p->opt->step = parsed.opt_steps;
    p->head_opt->step = parsed.head_opt_steps;
    p->query->bn_updates = parsed.bn_updates;
    if (p->key) p->key->bn_updates = parsed.key_bn_updates;
    if (p->key_step) *p->key_step = parsed.key_step;
    bank_ptr = parsed.bank_ptr;
    if (read_table(&st, &p->query->params, "") || read_table(&st, &p->query->buffers, "") ||
        read_table(&st, &p->head->params, "") || read_table(&st, &p->head->buffers, "") ||
        read_slots(&st, p->opt, "optimizer") || read_slots(&st, p->head_opt, "head_optimizer"))
        goto out;
    if (p->key && (read_table(&st, &p->key->params, KEY_PREFIX) ||
                   read_table(&st, &p->key->buffers, KEY_PREFIX) ||
                   read_table(&st, &p->key_head->params, "momentum_") ||
                   read_table(&st, &p->key_head->buffers, "momentum_")))
        goto out;
    if (p->bank) {
        if (bank_ptr < 0 || bank_ptr >= p->bank->size) {
            visc_set_error("%s: memory bank pointer %" PRId64 " outside the bank of %" PRId64, path,
                           bank_ptr, p->bank->size);
            goto out;
        }
        if (visc_safetensors_read_f32(&st, "memory_bank.bank", p->bank->bank,
                                      (size_t)p->bank->size * p->bank->dim))
            goto out;
        p->bank->ptr = bank_ptr;
    }
    rc = 0;
out:
    visc_safetensors_close(&st);
    return rc;
}

/* state_view.c: several tables seen as one model (state_view.h). */
#include <stdlib.h>
#include <string.h>

#include "state_view.h"

/* Appends the entries of `part` to `view` under `prefix`; the view's
 * layout must then be the part's, shifted by where it starts. */
static int add_part(visc_table *view, const visc_table *part, const char *prefix) {
    size_t base = (view->total + 15) & ~(size_t)15, plen = strlen(prefix);
    for (int i = 0; i < part->count; i++) {
        const visc_tensor_entry *e = &part->entries[i];
        char name[VISC_MAX_NAME];
        size_t nlen = strlen(e->name);
        if (plen + nlen >= sizeof name)
            return visc_set_error("state view: the name %s%s is too long", prefix, e->name);
        memcpy(name, prefix, plen);
        memcpy(name + plen, e->name, nlen + 1);
        int k = visc_table_add(view, name, e->ndim, e->shape, e->flags);
        VISC_ASSERT(view->entries[k].offset == base + e->offset);
    }
    /* the part's padding after its last tensor belongs to it too */
    view->total = base + part->total;
    return 0;
}

static size_t trained_total(const visc_state_view *v) {
    size_t n = 0;
    for (int i = 0; i < v->n_trained; i++) n += v->trained[i].params->total;
    return n;
}

int visc_state_view_build(visc_state_view *v) {
    visc_model *m = &v->model;
    memset(m, 0, sizeof *m);
    memset(&v->opt, 0, sizeof v->opt);
    VISC_ASSERT(v->n_trained > 0 && v->n_trained <= VISC_VIEW_MAX_PARTS);
    VISC_ASSERT(v->n_ema == 0 || v->n_ema == v->n_trained);
    const visc_optimizer *o0 = v->trained[0].opt;
    for (int i = 0; i < v->n_trained; i++) {
        const visc_optimizer *o = v->trained[i].opt;
        VISC_ASSERT(v->trained[i].params->total % 16 == 0);
        VISC_ASSERT(o->cfg.kind == o0->cfg.kind && o->slots == o0->slots && o->step == o0->step);
        if (add_part(&m->params, v->trained[i].params, "")) return -1;
    }
    for (int i = 0; i < v->n_ema; i++) VISC_ASSERT(v->ema[i]->total == v->trained[i].params->total);
    for (int i = 0; i < v->n_buffers; i++) {
        VISC_ASSERT(v->buffers[i].table->total % 16 == 0);
        if (add_part(&m->buffers, v->buffers[i].table, v->buffers[i].prefix)) return -1;
    }
    size_t P = m->params.total, B = m->buffers.total;
    VISC_ASSERT(P == trained_total(v));
    visc_table_alloc(&m->params);
    if (B) visc_table_alloc(&m->buffers);
    m->grads = visc_alloc_aligned(P * sizeof(float), "state view gradients");
    v->opt.cfg = o0->cfg;
    v->opt.params = &m->params;
    v->opt.slots = o0->slots;
    if (o0->slots)
        v->opt.state = visc_alloc_aligned((size_t)o0->slots * P * sizeof(float), "state view");
    if (v->n_ema) {
        v->ema_params = visc_alloc_aligned(P * sizeof(float), "state view EMA");
        v->ema_buffers = visc_alloc_aligned((B ? B : 1) * sizeof(float), "state view EMA");
        memset(v->ema_buffers, 0, (B ? B : 1) * sizeof(float));
    }
    visc_state_view_pull(v);
    return 0;
}

/* Copies the parts into the view (to_view) or back. */
static void sync(visc_state_view *v, int to_view) {
    visc_model *m = &v->model;
    size_t P = m->params.total, off = 0;
#define MOVE(view, part, n)                                                                        \
    do {                                                                                           \
        if (to_view) memcpy((view), (part), (n) * sizeof(float));                                  \
        else memcpy((part), (view), (n) * sizeof(float));                                          \
    } while (0)
    for (int i = 0; i < v->n_trained; i++) {
        const visc_view_trained *t = &v->trained[i];
        size_t n = t->params->total;
        MOVE(m->params.data + off, t->params->data, n);
        MOVE(m->grads + off, t->grads, n);
        for (int k = 0; k < v->opt.slots; k++)
            MOVE(v->opt.state + (size_t)k * P + off, t->opt->state + (size_t)k * n, n);
        if (v->n_ema) MOVE(v->ema_params + off, v->ema[i]->data, n);
        off += n;
    }
    off = 0;
    for (int i = 0; i < v->n_buffers; i++) {
        const visc_table *t = v->buffers[i].table;
        if (t->total) MOVE(m->buffers.data + off, t->data, t->total);
        off += t->total;
    }
#undef MOVE
    for (int i = 0; i < v->n_trained; i++) {
        if (to_view) v->opt.step = v->trained[i].opt->step;
        else v->trained[i].opt->step = v->opt.step;
    }
}

void visc_state_view_pull(visc_state_view *v) { sync(v, 1); }
void visc_state_view_push(visc_state_view *v) { sync(v, 0); }

void visc_state_view_free(visc_state_view *v) {
    visc_table_free(&v->model.params);
    visc_table_free(&v->model.buffers);
    visc_free_aligned(v->model.grads);
    visc_free_aligned(v->opt.state);
    visc_free_aligned(v->ema_params);
    visc_free_aligned(v->ema_buffers);
    v->model.grads = v->opt.state = v->ema_params = v->ema_buffers = NULL;
}

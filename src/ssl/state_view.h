/* state_view.h: several tables seen as one model, for step hooks.
 *
 * The step hooks (train.h: visc_step_hooks, visc_train_access) see one
 * model (parameters, gradients, buffers), one optimizer and an optional
 * EMA. Pretraining keeps its state in several tables: the query encoder
 * and its projection head, each with its own optimizer, and for MoCo the
 * momentum encoder and head. A view lays them out as one: its parameters
 * are the trained tables one after the other (gradients and optimizer
 * slots alike), its buffers the carried tables (under a name prefix), its
 * EMA the tables laid out as the trained ones. The tensors the layers use
 * stay where they are: pull copies them into the view before a hook runs,
 * push copies the view back after it (a hook may replace the whole state).
 * Both are O(state) copies with nothing allocated. */
#ifndef VISC_SSL_STATE_VIEW_H
#define VISC_SSL_STATE_VIEW_H

#include "visc/model.h"
#include "visc/optim.h"

#define VISC_VIEW_MAX_PARTS 8

typedef struct {
    visc_table *params;
    float *grads;
    visc_optimizer *opt; /* every trained part's: same kind, same step count */
} visc_view_trained;

typedef struct {
    visc_table *table;
    const char *prefix; /* before its tensor names ("" for none) */
} visc_view_part;

typedef struct {
    /* filled by the caller before visc_state_view_build */
    visc_view_trained trained[VISC_VIEW_MAX_PARTS];
    int n_trained;
    visc_view_part buffers[VISC_VIEW_MAX_PARTS];
    int n_buffers;
    visc_table *ema[VISC_VIEW_MAX_PARTS]; /* ema[i] laid out as trained[i] */
    int n_ema;                            /* 0 or n_trained */
    /* the view (built) */
    visc_model model;   /* params, buffers, grads only */
    visc_optimizer opt; /* cfg, slots, state, step only */
    float *ema_params;  /* NULL without EMA parts */
    float *ema_buffers; /* with EMA: buffers.total zeros (see visc_state_view_build) */
} visc_state_view;

/* Builds the view's tables and buffers from the parts (copying their
 * values in). The trained parts' optimizers must be of one kind and step
 * count, each EMA part of its trained part's size. With EMA parts the EMA
 * buffers are zeros that stay zeros: what those tables' buffers would be
 * travels among the buffers. 0, or -1 with an error (a name too long). */
int visc_state_view_build(visc_state_view *v);
/* parts -> view */
void visc_state_view_pull(visc_state_view *v);
/* view -> parts (every trained part's optimizer gets the view's step) */
void visc_state_view_push(visc_state_view *v);
void visc_state_view_free(visc_state_view *v);

#endif

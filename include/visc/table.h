/* table.h: flat buffers with a name table.
 *
 * A model's parameters live in ONE float buffer; a table records, for each
 * named tensor (torchvision/timm state_dict key), its shape and offset.
 * Gradients and optimizer state are further buffers of the same total size
 * and layout, so an optimizer is one loop, an all-reduce is one call and a
 * checkpoint is one pass over the table. Buffers that are not trained
 * (BatchNorm running statistics) live in a second table. */
#ifndef VISC_TABLE_H
#define VISC_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#define VISC_MAX_NAME 128
#define VISC_MAX_DIMS 4

enum {
    VISC_TENSOR_NO_DECAY =
        1u << 0,                /* norm weights, biases: excluded from weight decay when asked */
    VISC_TENSOR_NORM = 1u << 1, /* a normalization layer's affine parameter */
    VISC_TENSOR_BIAS = 1u << 2,
};

typedef struct {
    char name[VISC_MAX_NAME];
    int ndim;
    int64_t shape[VISC_MAX_DIMS];
    size_t offset; /* in floats, into the table's buffers */
    size_t numel;
    unsigned flags;
} visc_tensor_entry;

typedef struct {
    visc_tensor_entry *entries;
    int count, capacity;
    size_t total; /* floats over all entries */
    float *data;  /* the values; NULL until visc_table_alloc */
    visc_device device;
} visc_table;

void visc_table_init(visc_table *t);
/* Adds a tensor and returns its index; offsets are 16-float aligned so every
 * tensor starts on a cache line. */
int visc_table_add(visc_table *t, const char *name, int ndim, const int64_t *shape, unsigned flags);
void visc_table_alloc(visc_table *t); /* zero-filled, 64-byte aligned */
float *visc_table_get(const visc_table *t, int index);
int visc_table_find(const visc_table *t, const char *name); /* -1 if absent */
void visc_table_free(visc_table *t);

#endif

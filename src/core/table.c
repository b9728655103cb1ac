/* table.c: the name table over a flat float buffer. */
#include <stdlib.h>
#include <string.h>

#include "visc/table.h"

void visc_table_init(visc_table *t) { memset(t, 0, sizeof *t); }

int visc_table_add(visc_table *t, const char *name, int ndim, const int64_t *shape,
                   unsigned flags) {
    VISC_ASSERT(t->data == NULL); /* the layout is fixed once allocated */
    VISC_ASSERT(ndim >= 0 && ndim <= VISC_MAX_DIMS);
    VISC_ASSERT(strlen(name) < VISC_MAX_NAME);
    if (t->count == t->capacity) {
        t->capacity = t->capacity ? 2 * t->capacity : 64;
        t->entries =
            visc_realloc(t->entries, (size_t)t->capacity * sizeof *t->entries, "tensor table");
    }
    visc_tensor_entry *e = &t->entries[t->count];
    memset(e, 0, sizeof *e);
    strcpy(e->name, name);
    e->ndim = ndim;
    e->numel = 1;
    for (int i = 0; i < ndim; i++) {
        VISC_ASSERT(shape[i] > 0);
        e->shape[i] = shape[i];
        e->numel *= (size_t)shape[i];
    }
    e->flags = flags;
    e->offset = (t->total + 15) & ~(size_t)15;
    t->total = e->offset + e->numel;
    return t->count++;
}

void visc_table_alloc(visc_table *t) {
    t->total = (t->total + 15) & ~(size_t)15;
    t->data = visc_alloc_aligned(t->total * sizeof(float), "tensor table data");
}

float *visc_table_get(const visc_table *t, int index) {
    VISC_ASSERT(index >= 0 && index < t->count && t->data);
    /* cppcheck-suppress nullPointerArithmeticRedundantCheck ; asserted non-NULL above */
    return t->data + t->entries[index].offset;
}

int visc_table_find(const visc_table *t, const char *name) {
    for (int i = 0; i < t->count; i++)
        if (strcmp(t->entries[i].name, name) == 0) return i;
    return -1;
}

void visc_table_free(visc_table *t) {
    visc_free_aligned(t->data);
    free(t->entries);
    memset(t, 0, sizeof *t);
}

/* dnnl.c: the process-wide oneDNN engine and stream, checked calls, and the
 * user-layout <-> primitive-layout boundary (visc_dnnl_tensor). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <oneapi/dnnl/dnnl_debug.h>

#include "visc/core.h"
#include "visc/cpu.h"

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void create_engine(void) {
    VISC_DNNL(dnnl_engine_create(&engine, dnnl_cpu, 0));
    VISC_DNNL(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
}

dnnl_engine_t visc_dnnl_engine(void) {
    pthread_once(&once, create_engine);
    return engine;
}

dnnl_stream_t visc_dnnl_stream(void) {
    pthread_once(&once, create_engine);
    return stream;
}

_Noreturn void visc_dnnl_fail(dnnl_status_t status, const char *call, const char *file, int line) {
    fflush(stdout);
    fprintf(stderr, "visc: internal error: oneDNN call %s failed (%s) at %s:%d\n", call,
            dnnl_status2str(status), file, line);
    abort();
}

void visc_dnnl_md(dnnl_memory_desc_t *md, int ndims, const dnnl_dim_t *dims,
                  dnnl_format_tag_t tag) {
    VISC_DNNL(dnnl_memory_desc_init_by_tag(md, ndims, dims, dnnl_f32, tag));
}

dnnl_memory_t visc_dnnl_memory(const dnnl_memory_desc_t *md, void *handle) {
    dnnl_memory_t mem;
    VISC_DNNL(dnnl_memory_create(&mem, md, visc_dnnl_engine(), handle));
    return mem;
}

void visc_dnnl_set_handle(dnnl_memory_t mem, const void *handle) {
    /* oneDNN's API is not const-correct; inputs are only read. */
    VISC_DNNL(dnnl_memory_set_data_handle(mem, (void *)(uintptr_t)handle));
}

dnnl_primitive_attr_t visc_dnnl_attr_user_scratchpad(void) {
    dnnl_primitive_attr_t attr;
    VISC_DNNL(dnnl_primitive_attr_create(&attr));
    VISC_DNNL(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    return attr;
}

size_t visc_dnnl_scratchpad_bytes(const_dnnl_primitive_desc_t pd) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

dnnl_primitive_t visc_dnnl_primitive(const_dnnl_primitive_desc_t pd) {
    dnnl_primitive_t prim;
    VISC_DNNL(dnnl_primitive_create(&prim, pd));
    return prim;
}

void visc_dnnl_run(dnnl_primitive_t prim, int nargs, const dnnl_exec_arg_t *args) {
    VISC_DNNL(dnnl_primitive_execute(prim, visc_dnnl_stream(), nargs, args));
    VISC_DNNL(dnnl_stream_wait(visc_dnnl_stream()));
}

int visc_cpu_avx512(void) {
    /* The ISA values are nested bit sets (avx512_core_bf16 includes avx512_core). */
    const unsigned want = (unsigned)dnnl_cpu_isa_avx512_core;
    return ((unsigned)dnnl_get_effective_cpu_isa() & want) == want;
}

static int level_cap = 2;

void visc_cpu_cap_level(int level) { level_cap = level; }

int visc_cpu_level(void) {
    int level = 0;
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    const unsigned avx2 = (unsigned)dnnl_cpu_isa_avx2;
    if (visc_cpu_avx512()) level = 2;
#if defined(__x86_64__) && defined(__GNUC__)
    else if ((isa & avx2) == avx2 && __builtin_cpu_supports("fma")) level = 1;
#endif
    (void)isa, (void)avx2;
    return level < level_cap ? level : level_cap;
}

const char *visc_dnnl_impl_name(const_dnnl_primitive_desc_t pd) {
    const char *name = NULL;
    VISC_DNNL(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name));
    return name ? name : "?";
}

/* ---- the layout boundary ---- */

size_t visc_dnnl_tensor_bytes(const dnnl_memory_desc_t *user_md,
                              const dnnl_memory_desc_t *inner_md) {
    return dnnl_memory_desc_equal(user_md, inner_md) ? 0 : dnnl_memory_desc_get_size(inner_md);
}

void visc_dnnl_tensor_init(visc_dnnl_tensor *t, const dnnl_memory_desc_t *user_md,
                           const dnnl_memory_desc_t *inner_md, int is_output, void *buf) {
    t->user = visc_dnnl_memory(user_md, DNNL_MEMORY_NONE);
    t->is_output = is_output;
    t->reorder = NULL;
    t->buf = NULL;
    t->owns_buf = 0;
    if (dnnl_memory_desc_equal(user_md, inner_md)) {
        t->inner = t->user;
        return;
    }
    /* Zero-filled, so the padding of blocked layouts (channels rounded up to
     * the block) starts out as the zeros oneDNN expects there. */
    if (!buf) {
        buf = visc_alloc_aligned(dnnl_memory_desc_get_size(inner_md), "oneDNN layout buffer");
        t->owns_buf = 1;
    }
    t->buf = buf;
    t->inner = visc_dnnl_memory(inner_md, buf);
    const dnnl_memory_desc_t *from = is_output ? inner_md : user_md;
    const dnnl_memory_desc_t *to = is_output ? user_md : inner_md;
    dnnl_primitive_desc_t pd;
    VISC_DNNL(dnnl_reorder_primitive_desc_create(&pd, from, visc_dnnl_engine(), to,
                                                 visc_dnnl_engine(), NULL));
    t->reorder = visc_dnnl_primitive(pd);
    VISC_DNNL(dnnl_primitive_desc_destroy(pd));
}

static void run_reorder(visc_dnnl_tensor *t) {
    dnnl_memory_t from = t->is_output ? t->inner : t->user;
    dnnl_memory_t to = t->is_output ? t->user : t->inner;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    visc_dnnl_run(t->reorder, 2, args);
}

dnnl_memory_t visc_dnnl_tensor_in(visc_dnnl_tensor *t, const void *data) {
    visc_dnnl_set_handle(t->user, data);
    if (t->reorder) run_reorder(t);
    return t->inner;
}

dnnl_memory_t visc_dnnl_tensor_out(visc_dnnl_tensor *t, void *data) {
    visc_dnnl_set_handle(t->user, data);
    return t->inner;
}

void visc_dnnl_tensor_out_done(visc_dnnl_tensor *t) {
    if (t->reorder) run_reorder(t);
}

void visc_dnnl_tensor_destroy(visc_dnnl_tensor *t) {
    if (t->reorder) {
        VISC_DNNL(dnnl_primitive_destroy(t->reorder));
        VISC_DNNL(dnnl_memory_destroy(t->inner));
    }
    VISC_DNNL(dnnl_memory_destroy(t->user));
    if (t->owns_buf) visc_free_aligned(t->buf);
    t->user = t->inner = NULL;
    t->reorder = NULL;
    t->buf = NULL;
}

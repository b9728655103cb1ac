/* cpu.h: the oneDNN glue shared by the CPU layers.
 *
 * One engine and one stream for the whole process (oneDNN's CPU runtime is
 * OpenMP, the same thread pool as our own loops). Every oneDNN call goes
 * through VISC_DNNL, which aborts naming the failing call: a failure here is
 * a bug (bad shape, unsupported layout), never bad user input.
 *
 * Layers keep the caller's plain layouts (NCHW, OIHW) at their boundary and
 * may let a primitive pick a faster blocked layout inside; visc_dnnl_tensor
 * is that boundary: it wraps the caller's pointer and, when the layouts
 * differ, owns the internal buffer and the reorder between the two. */
#ifndef VISC_CPU_H
#define VISC_CPU_H

#include <stddef.h>

#include <oneapi/dnnl/dnnl.h>

dnnl_engine_t visc_dnnl_engine(void);
dnnl_stream_t visc_dnnl_stream(void);

_Noreturn void visc_dnnl_fail(dnnl_status_t status, const char *call, const char *file, int line);
#define VISC_DNNL(call)                                                                            \
    do {                                                                                           \
        dnnl_status_t visc_st_ = (call);                                                           \
        if (visc_st_ != dnnl_success) visc_dnnl_fail(visc_st_, #call, __FILE__, __LINE__);         \
    } while (0)

/* fp32 memory descriptor; tag dnnl_format_tag_any lets a primitive choose. */
void visc_dnnl_md(dnnl_memory_desc_t *md, int ndims, const dnnl_dim_t *dims, dnnl_format_tag_t tag);
/* A memory object on the process engine; handle NULL: set one before use. */
dnnl_memory_t visc_dnnl_memory(const dnnl_memory_desc_t *md, void *handle);
void visc_dnnl_set_handle(dnnl_memory_t mem, const void *handle);
/* Primitive attributes with a user-managed scratchpad (no hidden allocation per call). */
dnnl_primitive_attr_t visc_dnnl_attr_user_scratchpad(void);
/* Bytes of scratchpad a primitive descriptor asks for (0 if none). */
size_t visc_dnnl_scratchpad_bytes(const_dnnl_primitive_desc_t pd);
dnnl_primitive_t visc_dnnl_primitive(const_dnnl_primitive_desc_t pd);
/* Runs a primitive on the process stream and waits for it. */
void visc_dnnl_run(dnnl_primitive_t prim, int nargs, const dnnl_exec_arg_t *args);
/* 1 when oneDNN may use AVX-512 (avx512_core) here. visc's own hand-written
 * AVX-512 kernels (GELU, attention transposes) follow it, so capping
 * oneDNN's ISA (dnnl_set_max_cpu_isa, ONEDNN_MAX_CPU_ISA) runs and tests
 * their portable versions as well. */
int visc_cpu_avx512(void);
/* The widest hand-written kernels visc runs here: 2 AVX-512 (as
 * visc_cpu_avx512), 1 AVX2 with FMA (oneDNN allowed AVX2 and the CPU has
 * FMA), 0 none (the compiler's loops, cloned per ISA by the hardware). */
int visc_cpu_level(void);
/* Caps visc_cpu_level (not oneDNN) at level from now on, so one test binary
 * can check the kernels of every level against the same references. */
void visc_cpu_cap_level(int level);
/* Name of the implementation oneDNN picked (for benchmarks and debugging). */
const char *visc_dnnl_impl_name(const_dnnl_primitive_desc_t pd);

/* A tensor at the boundary between the caller's layout (`user`) and the
 * layout a primitive wants (`inner`). Without a reorder, inner == user. */
typedef struct {
    dnnl_memory_t user, inner;
    dnnl_primitive_t reorder; /* user -> inner (input) or inner -> user (output) */
    int is_output;
    void *buf; /* inner's storage when it differs from user; may be shared, see below */
    int owns_buf;
} visc_dnnl_tensor;

/* buf: storage for the inner layout when a reorder is needed; NULL allocates
 * one. Passing another tensor's buffer shares it (the caller guarantees the
 * two are never live at once); visc_dnnl_tensor_bytes says how much is needed. */
void visc_dnnl_tensor_init(visc_dnnl_tensor *t, const dnnl_memory_desc_t *user_md,
                           const dnnl_memory_desc_t *inner_md, int is_output, void *buf);
/* Bytes the inner layout needs when it differs from the user layout, else 0. */
size_t visc_dnnl_tensor_bytes(const dnnl_memory_desc_t *user_md,
                              const dnnl_memory_desc_t *inner_md);
/* Input: points at `data`, reorders it into the inner layout, returns inner. */
dnnl_memory_t visc_dnnl_tensor_in(visc_dnnl_tensor *t, const void *data);
/* Output: points at `data` and returns the memory the primitive writes to;
 * call visc_dnnl_tensor_out_done after the primitive ran. */
dnnl_memory_t visc_dnnl_tensor_out(visc_dnnl_tensor *t, void *data);
void visc_dnnl_tensor_out_done(visc_dnnl_tensor *t);
void visc_dnnl_tensor_destroy(visc_dnnl_tensor *t);

#endif

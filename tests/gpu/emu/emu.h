/* emu.h: what a CUDA source needs from the device side to run on the CPU.
 *
 * The CUDA backend's kernels (the .cu files of src/cuda) are compiled a second time by
 * the host's C++ compiler, after tests/gpu/emu/cu2cpp.sh has rewritten the
 * three things it cannot parse (kernel launches, __shared__ arrays,
 * dynamic shared memory), with this header included first. A launch then
 * runs the kernel's blocks one after another on the calling thread, each
 * block's threads as fibers (emu_runtime.cpp) that switch at barriers and
 * warp shuffles, so the kernels' own indexing, reductions and
 * synchronization run as written: test_cuda_kernels checks them against
 * the CPU layers in CI, which has no GPU. What differs from a GPU is
 * timing (none of the kernels may depend on it) and the last bits of the
 * transcendental functions (the host's libm).
 *
 * Checks a GPU makes, or should: launch sizes (1024 threads a block, grid
 * limits, 48 KB of dynamic shared memory without an opt-in), barriers and
 * shuffles reached by every thread they name (a missing one is a hang or
 * undefined on a GPU, an error here), shared memory read before it is
 * written (it starts as NaN bytes, 0xff), and out-of-bounds accesses (each
 * block's shared memory is its own heap allocation, so AddressSanitizer
 * sees an overrun). VISC_EMU_ORDER=reverse runs every block's threads and
 * a grid's blocks in the opposite order, which changes the result of any
 * kernel that races. */
#ifndef VISC_EMU_H
#define VISC_EMU_H

/* Before the CUDA headers, which keep a definition made first. */
#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
/* <mma.h> left empty: emu_wmma.h is its emulation */
#define __CUDA_MMA_H__

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

namespace visc_emu {

/* The thread a fiber plays: CUDA's built-in variables. */
struct thread_pos {
    uint3 thread, block;
    dim3 block_dim, grid_dim;
};
extern thread_local const thread_pos *current;

/* __syncthreads, __syncwarp and the shuffles (emu_runtime.cpp). */
void sync_block(void);
void sync_warp(unsigned mask);
/* Every lane named in mask gives `value` (8 bytes, any type) and gets the
 * one lane src_of[lane] gave: the exchange happens once all have arrived. */
uint64_t shuffle(unsigned mask, uint64_t value, int src_lane);
int lane_id(void);

/* This block's shared array for the declaration `key` (its address): made
 * by the first thread to reach it, aligned as its type, filled with 0xff
 * bytes. */
void *shared(const void *key, size_t bytes, size_t align);
/* The launch's dynamic shared memory (0xff bytes). */
void *dynamic_shared(void);

struct launch_config {
    dim3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
};
inline launch_config config(dim3 grid, dim3 block, size_t shared_bytes = 0,
                            cudaStream_t stream = 0) {
    return launch_config{grid, block, shared_bytes, stream};
}
/* Runs body(arg) for every thread of the grid; a bad launch sets the
 * error cudaGetLastError reports, as a GPU's launch does. */
void run(const launch_config &c, const char *kernel, void (*body)(void *), void *arg);

template <typename... P> struct launcher {
    void (*kernel)(P...);
    launch_config cfg;
    const char *name;
    template <typename... A> void operator()(A &&...a) const {
        /* the arguments converted to the parameters' types once, as the
         * launch copies them; each thread gets its own copy */
        struct call {
            void (*kernel)(P...);
            std::tuple<typename std::decay<P>::type...> args;
        } c{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)};
        run(
            cfg, name,
            [](void *p) {
                call *x = (call *)p;
                std::apply([x](auto... v) { x->kernel(v...); }, x->args);
            },
            &c);
    }
};
template <typename... P>
launcher<P...> launch(void (*kernel)(P...), launch_config cfg, const char *name) {
    return launcher<P...>{kernel, cfg, name};
}

template <typename T> T shuffle_value(unsigned mask, T v, int src_lane) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = shuffle(mask, bits, src_lane);
    T out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

} // namespace visc_emu

#define threadIdx (visc_emu::current->thread)
#define blockIdx (visc_emu::current->block)
#define blockDim (visc_emu::current->block_dim)
#define gridDim (visc_emu::current->grid_dim)

#define VISC_EMU_LAUNCH(kernel, ...)                                                               \
    visc_emu::launch(kernel, visc_emu::config(__VA_ARGS__), #kernel)

static inline void __syncthreads(void) { visc_emu::sync_block(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { visc_emu::sync_warp(mask); }
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const int lane = visc_emu::lane_id();
    return visc_emu::shuffle_value(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = visc_emu::lane_id();
    int src = lane ^ lane_mask;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane; /* outside the segment */
    return visc_emu::shuffle_value(mask, v, src);
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = visc_emu::lane_id();
    int src = lane + (int)delta;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return visc_emu::shuffle_value(mask, v, src);
}

/* CUDA's min and max for any two arithmetic types. */
template <typename A, typename B>
static inline typename std::common_type<A, B>::type min(A a, B b) {
    return b < a ? b : a;
}
template <typename A, typename B>
static inline typename std::common_type<A, B>::type max(A a, B b) {
    return a < b ? b : a;
}

/* Blocks run one at a time and their threads one at a time between
 * switches, so an atomic is a plain read-modify-write. */
template <typename T> static inline T atomicAdd(T *p, T v) {
    const T old = *p;
    *p = old + v;
    return old;
}

/* The _rn intrinsics: IEEE operations rounded to nearest, which the host's
 * are too (the emulated build turns floating-point contraction off). */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }

#include "emu_wmma.h"

#endif

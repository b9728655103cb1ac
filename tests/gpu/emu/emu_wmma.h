/* emu_wmma.h: CUDA's warp matrix functions (nvcuda::wmma, <mma.h>) for the
 * emulator: 16 x 16 x 16 tiles, bf16 or half operands, fp32 accumulators.
 *
 * On a GPU a fragment is spread over the warp's 32 lanes in a layout CUDA
 * leaves unspecified; a kernel may only load, store, fill and multiply
 * fragments as wholes. Here each lane holds a whole operand tile (it loads
 * all of it itself, from memory every lane can read), while an accumulator
 * lane holds only the 8 elements it owns, in a scrambled order; the rest
 * are NaN. A store writes each lane's own elements only, so a kernel that
 * reads a tile before other lanes have written it (a missing __syncwarp)
 * or mixes up fragments gets NaNs or stale values where a GPU might have
 * worked by luck, and the kernel checks fail. The loads and stores check
 * what CUDA requires: a 256-bit aligned pointer and a leading dimension
 * that is a multiple of 16 bytes. Products are exact in double and
 * rounded once to fp32 per accumulation step (tensor cores keep at least
 * fp32 sums; the kernels' tests allow for bf16 operands, not for this). */
#ifndef VISC_EMU_WMMA_H
#define VISC_EMU_WMMA_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

namespace visc_emu {
/* A kernel broke a rule of the CUDA API (emu_runtime.cpp): a launch
 * failure, as a GPU's fault. */
void misuse(const char *what);
} // namespace visc_emu

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
/* Which lane owns accumulator element e (row-major index): 5 is odd, so
 * each lane owns exactly 8 of the 256, scattered over rows and columns. */
static inline int owner(int e) { return (e * 5 + 3) & 31; }
static inline float to_float(float x) { return x; }
static inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
static inline float to_float(__half x) { return __half2float(x); }
template <typename T> static inline int well_placed(const T *p, unsigned ldm) {
    if (((uintptr_t)p & 31) != 0) {
        visc_emu::misuse("wmma: a fragment's pointer is not 256-bit aligned");
        return 0;
    }
    if ((ldm * sizeof(T)) % 16 != 0) {
        visc_emu::misuse("wmma: ldm is not a multiple of 16 bytes");
        return 0;
    }
    return 1;
}
} // namespace detail

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment;

/* An operand tile, whole in every lane: x[r * 16 + c] is element (r, c). */
template <typename Use, typename T, typename Layout> struct fragment<Use, 16, 16, 16, T, Layout> {
    static_assert(sizeof(T) == 2, "the emulator's wmma takes 16-bit operands");
    float x[256];
};

/* An accumulator tile: this lane's 8 elements, NaN elsewhere. */
template <> struct fragment<accumulator, 16, 16, 16, float, void> { float x[256]; };

template <typename Use, typename T, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p,
                                    unsigned ldm) {
    if (!detail::well_placed(p, ldm)) return;
    /* matrix_a row_major and matrix_b col_major read rows of p as the
     * tile's rows or columns: (r, c) at r ldm + c, or c ldm + r */
    const bool by_rows = std::is_same<Layout, row_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = detail::to_float(by_rows ? p[r * ldm + c] : p[c * ldm + r]);
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                                    unsigned ldm, layout_t layout) {
    if (!detail::well_placed(p, ldm)) return;
    const int lane = visc_emu::lane_id();
    for (int e = 0; e < 256; e++) {
        const int r = e / 16, c = e % 16;
        f.x[e] = detail::owner(e) == lane
                     ? (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r])
                     : NAN;
    }
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                                     unsigned ldm, layout_t layout) {
    if (!detail::well_placed(p, ldm)) return;
    const int lane = visc_emu::lane_id();
    for (int e = 0; e < 256; e++) {
        if (detail::owner(e) != lane) continue;
        const int r = e / 16, c = e % 16;
        (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
    }
}

template <typename Use, typename T, typename Layout>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, float v) {
    for (int e = 0; e < 256; e++) f.x[e] = v;
}
static inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v) {
    const int lane = visc_emu::lane_id();
    for (int e = 0; e < 256; e++) f.x[e] = detail::owner(e) == lane ? v : NAN;
}

/* d = a b + c on this lane's elements. */
template <typename T, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
    const int lane = visc_emu::lane_id();
    for (int e = 0; e < 256; e++) {
        if (detail::owner(e) != lane) {
            d.x[e] = NAN;
            continue;
        }
        const int r = e / 16, col = e % 16;
        double sum = 0.0;
        for (int k = 0; k < 16; k++) sum += (double)a.x[r * 16 + k] * b.x[k * 16 + col];
        d.x[e] = (float)(sum + c.x[e]);
    }
}

} // namespace wmma
} // namespace nvcuda

#endif

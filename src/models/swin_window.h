/* swin_window.h: the window geometry of Swin blocks (private to src/models/swin*.c and tests).
 *
 * A block sees its tokens as a [B, H, W, C] grid (rows of C floats, token
 * order). Shifted blocks roll the grid by (-sh, -sw) first; the rolled grid
 * is cut into wh x ww windows, and each window's N = wh * ww tokens become
 * one attention sequence. "Windowed order" is that layout: window-major
 * (b, window row, window column), then token within the window, as timm's
 * window_partition(torch.roll(x, (-sh, -sw))) gives. Both index maps are
 * permutations, so each one's backward is the other. */
#ifndef VISC_SWIN_WINDOW_H
#define VISC_SWIN_WINDOW_H

#include <stdint.h>

typedef struct {
    int H, W;   /* token grid */
    int wh, ww; /* window: min(window, H) x min(window, W), as timm */
    int sh, sw; /* cyclic shift per axis; 0 where the grid fits one window */
    int nw;     /* windows per image */
    int N;      /* tokens per window */
} visc_swin_grid;

/* timm's rule (_calc_window_shift): an axis no longer than the window
 * becomes one window and is not shifted; a shifted block shifts by window/2.
 * Returns -1 (visc_set_error) when the grid does not split into whole windows. */
int visc_swin_grid_make(visc_swin_grid *g, int H, int W, int window, int shifted);

/* out (windowed order) <- in (token order), rolled; both [B * H * W, C]. */
void visc_swin_partition(float *out, const float *in, const visc_swin_grid *g, int B, int C);
/* out (token order) <- in (windowed order), rolled back: the inverse. */
void visc_swin_reverse(float *out, const float *in, const visc_swin_grid *g, int B, int C);

/* The shifted-window mask [nw, N, N]: 0 where two tokens of a window come
 * from the same region of the unrolled image, -100 where the roll brought
 * them together (timm's attn_mask). Only meaningful when sh or sw > 0. */
void visc_swin_attn_mask(float *mask, const visc_swin_grid *g);

/* timm's relative_position_index [N * N] of a wh x ww window: entry (a, b)
 * indexes the (2wh-1)(2ww-1)-row bias table by the offset of token a from b. */
void visc_swin_rel_index(int32_t *index, int wh, int ww);

/* ---- pieces of a block (swin.c), shared with the GPU stand-in ---- */
/* Patch merging's gather: merged token (b, i, j) of [B, H/2, W/2, 4C] is
 * [x(2i,2j), x(2i+1,2j), x(2i,2j+1), x(2i+1,2j+1)] of tokens [B, H, W, C]
 * (timm's order). back = 1: tokens <- merged (its backward). */
void visc_swin_merge_copy(float *tokens, float *merged, int B, int H, int W, int C, int back);
/* bias[h, a, b] = table[rel[a, b], h], or 16 sigmoid of it (V2). */
void visc_swin_gather_bias(float *bias, const float *table, const int32_t *rel, int H, int N,
                           int sigmoid16);
/* Its backward into dtable [T, H] (zeroed first, then added in index
 * order); with sigmoid16, bias holds the forward's output. */
void visc_swin_scatter_bias(float *dtable, const float *dbias, const float *bias,
                            const int32_t *rel, int T, int H, int N, int sigmoid16);
/* F.normalize over each head's D values (eps 1e-12), rows of ld floats;
 * the norms [rows, H] are kept for backward. Both may work in place
 * (dst = src; dx = dy): each head's values are read before they are
 * written (the GPU's backward in swin.cu too). */
void visc_swin_normalize_heads(float *dst, int64_t ld_dst, float *norms, const float *src,
                               int64_t ld_src, int64_t rows, int H, int D);
void visc_swin_normalize_heads_backward(float *dx, int64_t ld_dx, const float *dy, int64_t ld_dy,
                                        const float *y, int64_t ld_y, const float *norms,
                                        int64_t rows, int H, int D);
/* V2's q and k of the qkv rows raw [rows, 3 H D] normalized into qkv (the
 * same layout), the norms into qnorm and knorm [rows, H], and v copied
 * beside them (nothing to copy when raw is qkv: in place). */
void visc_swin_normalize_qk(float *qkv, float *qnorm, float *knorm, const float *raw, int64_t rows,
                            int H, int D);

/* Swin V2's relative_coords_table [(2wh-1)(2ww-1), 2]: the offsets scaled to
 * [-8, 8] and log-spaced, sign(x) log2(|x| + 1) / 3. Needs wh, ww >= 2. */
void visc_swin_v2_coords(float *table, int wh, int ww);

#endif

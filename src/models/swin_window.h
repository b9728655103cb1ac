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

/* Swin V2's relative_coords_table [(2wh-1)(2ww-1), 2]: the offsets scaled to
 * [-8, 8] and log-spaced, sign(x) log2(|x| + 1) / 3. Needs wh, ww >= 2. */
void visc_swin_v2_coords(float *table, int wh, int ww);

#endif

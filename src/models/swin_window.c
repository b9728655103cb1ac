/* swin_window.c: window partition / reverse with the cyclic shift, the
 * shifted-window attention mask and the relative-position tables of Swin.
 *
 * The roll and the partition are one index map (no intermediate rolled
 * copy): windowed row ((b * nH + i) * nW + j) * N + p * ww + q holds the
 * token at grid position ((i * wh + p + sh) mod H, (j * ww + q + sw) mod W),
 * which is torch.roll(x, -shift) followed by window_partition. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "swin_window.h"
#include "visc/core.h"

int visc_swin_grid_make(visc_swin_grid *g, int H, int W, int window, int shifted) {
    if (H < 1 || W < 1 || window < 1)
        return visc_set_error("swin: bad grid %dx%d with window %d", H, W, window);
    g->H = H;
    g->W = W;
    g->wh = H <= window ? H : window;
    g->ww = W <= window ? W : window;
    g->sh = (shifted && H > window) ? window / 2 : 0;
    g->sw = (shifted && W > window) ? window / 2 : 0;
    if (H % g->wh || W % g->ww)
        return visc_set_error("swin: a %dx%d token grid does not split into %dx%d windows", H, W,
                              g->wh, g->ww);
    g->nw = (H / g->wh) * (W / g->ww);
    g->N = g->wh * g->ww;
    return 0;
}

/* Token-order row of windowed row r (within one image). */
static inline int64_t token_of(const visc_swin_grid *g, int64_t r) {
    int64_t win = r / g->N, t = r % g->N;
    int nwc = g->W / g->ww;
    int i = (int)(win / nwc), j = (int)(win % nwc);
    int p = (int)(t / g->ww), q = (int)(t % g->ww);
    int y = (i * g->wh + p + g->sh) % g->H, x = (j * g->ww + q + g->sw) % g->W;
    return (int64_t)y * g->W + x;
}

void visc_swin_partition(float *out, const float *in, const visc_swin_grid *g, int B, int C) {
    int64_t HW = (int64_t)g->H * g->W;
#pragma omp parallel for schedule(static) if (B * HW * C > 32768)
    for (int64_t r = 0; r < B * HW; r++) {
        int64_t b = r / HW, src = b * HW + token_of(g, r % HW);
        memcpy(out + r * C, in + src * C, sizeof(float) * (size_t)C);
    }
}

void visc_swin_reverse(float *out, const float *in, const visc_swin_grid *g, int B, int C) {
    int64_t HW = (int64_t)g->H * g->W;
#pragma omp parallel for schedule(static) if (B * HW * C > 32768)
    for (int64_t r = 0; r < B * HW; r++) {
        int64_t b = r / HW, dst = b * HW + token_of(g, r % HW);
        memcpy(out + dst * C, in + r * C, sizeof(float) * (size_t)C);
    }
}

/* Region of a coordinate of the unrolled grid along one axis: timm labels
 * [0, n - w), [n - w, n - s), [n - s, n) as 0, 1, 2. With s = 0 its third
 * slice, x[-0:], is the whole axis and overwrites the others: one region. */
static int region(int v, int n, int w, int s) {
    if (s == 0) return 0;
    return v < n - w ? 0 : v < n - s ? 1 : 2;
}

void visc_swin_attn_mask(float *mask, const visc_swin_grid *g) {
    int N = g->N, nwc = g->W / g->ww;
    int *label = visc_malloc(sizeof(int) * (size_t)N, "swin mask labels");
    for (int win = 0; win < g->nw; win++) {
        int i = win / nwc, j = win % nwc;
        for (int t = 0; t < N; t++) {
            /* timm labels the grid as the windows see it (after the roll), so
             * the region is that of the window position itself. */
            int y = i * g->wh + t / g->ww, x = j * g->ww + t % g->ww;
            label[t] = 3 * region(y, g->H, g->wh, g->sh) + region(x, g->W, g->ww, g->sw);
        }
        float *m = mask + (size_t)win * N * N;
        for (int a = 0; a < N; a++)
            for (int b = 0; b < N; b++) m[a * N + b] = label[a] == label[b] ? 0.0f : -100.0f;
    }
    free(label);
}

void visc_swin_rel_index(int32_t *index, int wh, int ww) {
    int N = wh * ww;
    for (int a = 0; a < N; a++)
        for (int b = 0; b < N; b++) {
            int dy = a / ww - b / ww + wh - 1, dx = a % ww - b % ww + ww - 1;
            index[a * N + b] = dy * (2 * ww - 1) + dx;
        }
}

/* One coordinate as torch computes it in float32. */
static float log_coord(int d, int w) {
    float v = (float)d / (float)(w - 1) * 8.0f;
    float s = v > 0 ? 1.0f : v < 0 ? -1.0f : 0.0f;
    return s * log2f(fabsf(v) + 1.0f) / 3.0f;
}

void visc_swin_v2_coords(float *table, int wh, int ww) {
    int cols = 2 * ww - 1;
    for (int i = 0; i < 2 * wh - 1; i++)
        for (int j = 0; j < cols; j++) {
            table[(i * cols + j) * 2 + 0] = log_coord(i - (wh - 1), wh);
            table[(i * cols + j) * 2 + 1] = log_coord(j - (ww - 1), ww);
        }
}

/* ---- the blocks' own maps (models/swin.c, and the GPU stand-in's) ---- */

/* Patch merging's gather: merged token (b, i, j) is [x(2i,2j), x(2i+1,2j),
 * x(2i,2j+1), x(2i+1,2j+1)] (timm's reshape/permute order). A permutation,
 * so back = 1 (tokens <- merged) is its backward. */
void visc_swin_merge_copy(float *tokens, float *merged, int B, int H, int W, int C, int back) {
    int Ho = H / 2, Wo = W / 2;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)B * Ho * Wo; r++) {
        int64_t b = r / (Ho * Wo);
        int i = (int)(r % (Ho * Wo)) / Wo, j = (int)(r % Wo);
        for (int k = 0; k < 4; k++) {
            int y = 2 * i + (k & 1), x = 2 * j + (k >> 1);
            float *mg = merged + (size_t)r * 4 * C + (size_t)k * C;
            float *tk = tokens + ((size_t)b * H * W + (size_t)y * W + x) * C;
            if (back) memcpy(tk, mg, sizeof(float) * (size_t)C);
            else memcpy(mg, tk, sizeof(float) * (size_t)C);
        }
    }
}

/* bias[h, a, b] = table[rel[a, b], h]; V2 passes 16 sigmoid of it. */
void visc_swin_gather_bias(float *bias, const float *table, const int32_t *rel, int H, int N,
                           int sigmoid16) {
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N * N; i++) {
            float v = table[(size_t)rel[i] * H + h];
            bias[(size_t)h * N * N + i] = sigmoid16 ? 16.0f / (1.0f + expf(-v)) : v;
        }
}

/* F.normalize over each head's D values (eps 1e-12): dst rows of ld_dst,
 * src rows of ld_src; the norms are saved for backward. */
void visc_swin_normalize_heads(float *dst, int64_t ld_dst, float *norms, const float *src,
                               int64_t ld_src, int64_t rows, int H, int D) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int h = 0; h < H; h++) {
            const float *x = src + r * ld_src + (int64_t)h * D;
            float *y = dst + r * ld_dst + (int64_t)h * D;
            float ss = 0.0f;
            for (int d = 0; d < D; d++) ss += x[d] * x[d];
            float n = sqrtf(ss);
            n = n > 1e-12f ? n : 1e-12f;
            norms[r * H + h] = n;
            for (int d = 0; d < D; d++) y[d] = x[d] / n;
        }
}

void visc_swin_normalize_qk(float *qkv, float *qnorm, float *knorm, const float *raw, int64_t rows,
                            int H, int D) {
    const int64_t C = (int64_t)H * D;
    visc_swin_normalize_heads(qkv, 3 * C, qnorm, raw, 3 * C, rows, H, D);
    visc_swin_normalize_heads(qkv + C, 3 * C, knorm, raw + C, 3 * C, rows, H, D);
    if (raw == qkv) return;
    for (int64_t r = 0; r < rows; r++)
        memcpy(qkv + r * 3 * C + 2 * C, raw + r * 3 * C + 2 * C, sizeof(float) * (size_t)C);
}

/* bias gradient [H, N, N] -> bias table [T, H] (zeroed first: scatter-add). */
void visc_swin_scatter_bias(float *dtable, const float *dbias, const float *bias,
                            const int32_t *rel, int T, int H, int N, int sigmoid16) {
    memset(dtable, 0, sizeof(float) * (size_t)T * H);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < N * N; i++) {
            float d = dbias[(size_t)h * N * N + i];
            if (sigmoid16) {
                float sg = bias[(size_t)h * N * N + i] * (1.0f / 16.0f); /* sigmoid(v) */
                d *= 16.0f * sg * (1.0f - sg);
            }
            dtable[(size_t)rel[i] * H + h] += d;
        }
}

/* F.normalize's backward: dx = (dy - y (y . dy)) / n, per head. */
void visc_swin_normalize_heads_backward(float *dx, int64_t ld_dx, const float *dy, int64_t ld_dy,
                                        const float *y, int64_t ld_y, const float *norms,
                                        int64_t rows, int H, int D) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int h = 0; h < H; h++) {
            const float *g = dy + r * ld_dy + (int64_t)h * D, *v = y + r * ld_y + (int64_t)h * D;
            float *o = dx + r * ld_dx + (int64_t)h * D, n = norms[r * H + h];
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += v[d] * g[d];
            /* below eps the norm is the constant eps: a plain scale */
            if (n <= 1e-12f) dot = 0.0f;
            for (int d = 0; d < D; d++) o[d] = (g[d] - v[d] * dot) / n;
        }
}

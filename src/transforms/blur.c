/* blur.c: torchvision 0.14's GaussianBlur on a PIL image.
 *
 * torchvision turns the PIL image into a uint8 tensor, casts to float32,
 * convolves every channel with the 2-D kernel outer(k, k) (k = normalized
 * exp(-x^2 / 2 sigma^2) at x = -(n-1)/2 .. (n-1)/2, float32) after
 * reflect-padding by n / 2, rounds half to even and casts back to uint8.
 * The 2-D kernel is separable, so it is applied as a horizontal then a
 * vertical 1-D pass in float32: the sums are the same up to float rounding,
 * which can move a value that lands within ~1e-5 of a .5 boundary by one
 * level (the test allows 1 and counts how often).
 *
 * torch refuses padding >= the image side; here the reflection repeats
 * instead, so a tiny image never fails. */
#include <math.h>
#include <stdlib.h>

#include "visc/core.h"
#include "visc/transforms.h"

void visc_gaussian_kernel(int kernel_size, float sigma, float *kernel) {
    float half = (float)(kernel_size - 1) * 0.5f, sum = 0.0f;
    for (int i = 0; i < kernel_size; i++) {
        float x = (-half + (float)i) / sigma;
        kernel[i] = expf(-0.5f * x * x);
        sum += kernel[i];
    }
    for (int i = 0; i < kernel_size; i++) kernel[i] /= sum;
}

/* torch's "reflect" (no edge repeat), folded until inside [0, n). */
static int reflect(int i, int n) {
    if (n == 1) return 0;
    while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
    return i;
}

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"))) static void
axpy_row(float *restrict acc, const float *restrict x, float a, int n) {
    for (int i = 0; i < n; i++) acc[i] += a * x[i];
}

void visc_gaussian_blur(visc_image *img, int kernel_size, float sigma) {
    VISC_ASSERT(kernel_size >= 1 && kernel_size % 2 == 1 && sigma > 0);
    int W = img->width, H = img->height, half = kernel_size / 2, n = 3 * W;
    float *k = visc_malloc(sizeof(float) * (size_t)kernel_size, "blur kernel");
    visc_gaussian_kernel(kernel_size, sigma, k);
    float *pad = visc_malloc(sizeof(float) * 3 * (size_t)(W + 2 * half), "blur row");
    float *rows = visc_malloc(sizeof(float) * (size_t)H * (size_t)n, "blur rows");
    float *acc = visc_malloc(sizeof(float) * (size_t)n, "blur accumulator");
    /* Horizontal: pad the row by reflection, then out[i] = sum_j k[j] *
     * pad[i + 3 j] over the interleaved channels, contiguous in i. */
    for (int y = 0; y < H; y++) {
        const uint8_t *p = img->data + (size_t)y * img->stride;
        for (int x = -half; x < W + half; x++) {
            int sx = reflect(x, W);
            for (int c = 0; c < 3; c++) pad[3 * (x + half) + c] = (float)p[3 * sx + c];
        }
        float *out = rows + (size_t)y * n;
        for (int i = 0; i < n; i++) out[i] = 0.0f;
        for (int j = 0; j < kernel_size; j++) axpy_row(out, pad + 3 * j, k[j], n);
    }
    /* Vertical, with the same reflection of row indices. */
    for (int y = 0; y < H; y++) {
        for (int i = 0; i < n; i++) acc[i] = 0.0f;
        for (int j = 0; j < kernel_size; j++)
            axpy_row(acc, rows + (size_t)reflect(y + j - half, H) * n, k[j], n);
        uint8_t *o = img->data + (size_t)y * img->stride;
        for (int i = 0; i < n; i++) {
            float v = rintf(acc[i]);
            o[i] = (uint8_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v);
        }
    }
    free(k);
    free(pad);
    free(rows);
    free(acc);
}

/* to_tensor.c: the batch in bytes, for a device that does ToTensor +
 * Normalize itself (a quarter of the floats' bytes on the bus), and the
 * host's normalization of such bytes, which the device's kernel
 * (src/cuda/input.cu) and the tests hold to visc_to_tensor_normalize's
 * floats, bit for bit. */
#include "visc/transforms.h"

void visc_to_chw_bytes(const visc_image *img, uint8_t *chw) {
    size_t plane = (size_t)img->width * img->height;
    for (int y = 0; y < img->height; y++) {
        const uint8_t *p = img->data + (size_t)y * img->stride;
        uint8_t *o = chw + (size_t)y * img->width;
        for (int x = 0; x < img->width; x++) {
            o[x] = p[3 * x];
            o[plane + x] = p[3 * x + 1];
            o[2 * plane + x] = p[3 * x + 2];
        }
    }
}

/* normalize_row's arithmetic (color.c), plane by plane: v / 255, then
 * (x - m) / s, each rounded once (ISO C: no contraction). */
void visc_normalize_bytes(const uint8_t *chw, size_t images, size_t plane, const float mean[3],
                          const float std[3], float *out) {
    for (size_t i = 0; i < images; i++)
        for (int c = 0; c < 3; c++) {
            const uint8_t *p = chw + (i * 3 + (size_t)c) * plane;
            float *o = out + (i * 3 + (size_t)c) * plane;
            const float m = mean[c], sd = std[c];
            for (size_t k = 0; k < plane; k++) o[k] = ((float)p[k] / 255.0f - m) / sd;
        }
}

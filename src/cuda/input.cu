/* input.cu: the batch arrives as bytes (the loader's byte form, a quarter
 * of the floats on the bus) and becomes the model's input here: ToTensor
 * + Normalize, (v / 255 - mean[c]) / std[c], each operation rounded once
 * as on the host (visc_normalize_bytes), so the floats are the CPU
 * pipeline's bit for bit. */
#include "common.cuh"

struct channel_stats {
    float mean[3], std[3];
};

__global__ void normalize_bytes_kernel(float *out, const uint8_t *in, size_t n, size_t plane,
                                       channel_stats s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)((i / plane) % 3);
        /* the _rn intrinsics: IEEE division and subtraction, never fused */
        out[i] = __fdiv_rn(__fsub_rn(__fdiv_rn((float)in[i], 255.0f), s.mean[c]), s.std[c]);
    }
}

int visc_cuda_normalize_bytes(visc_cuda *ctx, float *out, const uint8_t *in, size_t images,
                              size_t plane, const float mean[3], const float std[3]) {
    const size_t n = images * 3 * plane;
    if (n == 0) return 0;
    channel_stats s;
    for (int c = 0; c < 3; c++) s.mean[c] = mean[c], s.std[c] = std[c];
    normalize_bytes_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, in, n, plane, s);
    return visc_cuda_launched("normalize bytes");
}

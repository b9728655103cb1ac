/* tokens.cu: the token models' glue on the GPU, twins of
 * models/transformer_common.c (patch embedding), nn/token_ops.c (the
 * position table's broadcast add) and nn/droppath.c (stochastic depth's
 * residual add, with the keep factors drawn by the host), plus row copies
 * and row sums for class tokens. Sums run in a fixed order: the same bits
 * on every run. */
#include "common.cuh"

/* tokens[b T + first + l, c] = conv[b, c, l] + bias[c] */
__global__ void patch_tokens_kernel(float *tokens, const float *conv, const float *bias, int B,
                                    int C, int L, int T, int first) {
    const size_t n = (size_t)B * L * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const int c = (int)(e % C), l = (int)(e / C % L), b = (int)(e / ((size_t)C * L));
        tokens[((size_t)b * T + first + l) * C + c] = conv[((size_t)b * C + c) * L + l] + bias[c];
    }
}

/* dconv[b, c, l] = dtokens[b T + first + l, c] */
__global__ void patch_grad_kernel(float *dconv, const float *dtokens, int B, int C, int L, int T,
                                  int first) {
    const size_t n = (size_t)B * C * L;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const int l = (int)(e % L), c = (int)(e / L % C), b = (int)(e / ((size_t)C * L));
        dconv[e] = dtokens[((size_t)b * T + first + l) * C + c];
    }
}

/* dbias[c] = sum over b, l of dconv[b, c, l]: one block per channel, its
 * threads over fixed strides, then a fixed tree. */
__global__ void channel_sum_kernel(float *dbias, const float *dconv, int B, int C, int L) {
    __shared__ float part[256];
    const int c = blockIdx.x;
    float s = 0.0f;
    for (int64_t e = threadIdx.x; e < (int64_t)B * L; e += blockDim.x)
        s += dconv[((e / L) * C + c) * L + e % L];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) dbias[c] = part[0];
}

static visc_cuda_conv_shape patch_conv(const visc_cuda_patch_shape *p) {
    visc_cuda_conv_shape s = {p->B, p->in_channels, p->image, p->image, p->C, p->patch, p->patch,
                              p->patch, 0, VISC_CUDA_CONV_F32_NCHW};
    return s;
}

int visc_cuda_patch_embed_forward(visc_cuda *ctx, const visc_cuda_patch_shape *p, float *tokens,
                                  float *conv_out, const float *image, const float *weight,
                                  const float *bias) {
    const visc_cuda_conv_shape s = patch_conv(p);
    if (visc_cuda_conv_forward(ctx, &s, conv_out, image, weight)) return -1;
    const int L = (p->image / p->patch) * (p->image / p->patch);
    const size_t n = (size_t)p->B * L * p->C;
    patch_tokens_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(
        tokens, conv_out, bias, p->B, p->C, L, p->tokens, p->first);
    return visc_cuda_launched("patch embedding");
}

int visc_cuda_patch_embed_backward(visc_cuda *ctx, const visc_cuda_patch_shape *p, float *dweight,
                                   float *dbias, float *dconv, const float *dtokens,
                                   const float *image) {
    const int L = (p->image / p->patch) * (p->image / p->patch);
    const size_t n = (size_t)p->B * L * p->C;
    patch_grad_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(dconv, dtokens, p->B,
                                                                          p->C, L, p->tokens,
                                                                          p->first);
    if (visc_cuda_launched("patch embedding backward")) return -1;
    channel_sum_kernel<<<p->C, 256, 0, ctx->stream>>>(dbias, dconv, p->B, p->C, L);
    if (visc_cuda_launched("patch embedding bias gradient")) return -1;
    const visc_cuda_conv_shape s = patch_conv(p);
    return visc_cuda_conv_backward_weights(ctx, &s, dweight, image, dconv, 0.0f);
}

__global__ void add_broadcast_kernel(float *x, const float *table, int B, int64_t NC) {
    const size_t n = (size_t)B * NC;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x)
        x[e] += table[e % NC];
}

int visc_cuda_add_broadcast(visc_cuda *ctx, float *x, const float *table, int B, int64_t NC) {
    const size_t n = (size_t)B * NC;
    if (n == 0) return 0;
    add_broadcast_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(x, table, B, NC);
    return visc_cuda_launched("broadcast add");
}

int visc_cuda_sum_rows(visc_cuda *ctx, float *out, const float *a, int64_t rows, int C) {
    return visc_cuda_column_sums(ctx, out, a, rows, C);
}

/* x[b] += keep[b] branch[b] (a 0 skips the branch, a 1 is a plain add, as the
 * CPU); the product rounded before the sum, as the CPU's (nvcc would fuse
 * the two into one multiply-add, another rounding when keep is 1/(1-p)) */
__global__ void droppath_add_kernel(float *out, const float *x, const float *branch,
                                    const float *keep, int B, size_t per_sample) {
    const size_t n = (size_t)B * per_sample;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const float k = keep[e / per_sample];
        if (k == 1.0f) out[e] = x[e] + branch[e];
        else if (k != 0.0f) out[e] = __fadd_rn(x[e], __fmul_rn(k, branch[e]));
        else if (out != x) out[e] = x[e];
    }
}

/* out = x + branch, and keep[b] = 1: every sample kept (eval, or no
 * drop-path), with the factors the backward reads set on the device */
__global__ void add_all_kept_kernel(float *out, const float *x, const float *branch, float *keep,
                                    int B, size_t n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        if (e < (size_t)B) keep[e] = 1.0f;
        out[e] = x[e] + branch[e];
    }
}

__global__ void scale_rows_kernel(float *out, const float *in, const float *keep, int B,
                                  size_t per_sample) {
    const size_t n = (size_t)B * per_sample;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x)
        out[e] = keep[e / per_sample] * in[e];
}

int visc_cuda_droppath_add_forward(visc_cuda *ctx, float *out, const float *x, const float *branch,
                                   const float *keep, int B, size_t per_sample) {
    const size_t n = (size_t)B * per_sample;
    if (n == 0) return 0;
    droppath_add_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, x, branch, keep, B,
                                                                           per_sample);
    return visc_cuda_launched("drop-path add");
}

int visc_cuda_droppath_add_kept(visc_cuda *ctx, float *out, const float *x, const float *branch,
                                float *keep, int B, size_t per_sample) {
    const size_t n = (size_t)B * per_sample;
    if (n == 0) return 0;
    add_all_kept_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(out, x, branch, keep, B,
                                                                           n);
    return visc_cuda_launched("drop-path add (all kept)");
}

int visc_cuda_droppath_add_backward(visc_cuda *ctx, float *dbranch, const float *dx,
                                    const float *keep, int B, size_t per_sample) {
    const size_t n = (size_t)B * per_sample;
    if (n == 0) return 0;
    scale_rows_kernel<<<visc_cuda_blocks(n, 256), 256, 0, ctx->stream>>>(dbranch, dx, keep, B,
                                                                         per_sample);
    return visc_cuda_launched("drop-path backward");
}

int visc_cuda_copy_rows(visc_cuda *ctx, float *dst, int64_t dst_stride, const float *src,
                        int64_t src_stride, int64_t rows, int count) {
    if (rows == 0 || count == 0) return 0;
    return visc_cuda_check(cudaMemcpy2DAsync(dst, sizeof(float) * dst_stride, src,
                                             sizeof(float) * src_stride, sizeof(float) * count,
                                             rows, cudaMemcpyDeviceToDevice, ctx->stream),
                           "row copy on the device");
}

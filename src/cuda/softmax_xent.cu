/* softmax_xent.cu: softmax cross-entropy with label smoothing, the GPU twin
 * of src/nn/loss.c. With t = (1 - s) onehot(y) + s / K and
 * lse = max + log sum exp(x - max):
 *   loss_n = lse - (1 - s) x_y - (s / K) sum_k x_k
 *   dlogits = (softmax(x) - t) / N
 * One warp per sample (K is 10 to 1000 classes), its sums in double as
 * the CPU's; the per-sample losses go to scratch and one block adds them
 * in a fixed order, in double as the CPU does, so the mean never depends
 * on timing. */
#include "common.cuh"

#define ROWS_PER_BLOCK 8

__global__ void xent_forward_kernel(float *row_loss, float *probs, const float *logits,
                                    const int32_t *labels, int N, int K, float smoothing) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (n >= N) return;
    const float *x = logits + (size_t)n * K;
    float *pr = probs + (size_t)n * K;
    float mx = -INFINITY;
    for (int k = lane; k < K; k += 32) mx = fmaxf(mx, x[k]);
    mx = visc_warp_max(mx);
    /* The sums in double, as the CPU takes them: 1000 classes of logits
     * summed in float would lose digits the CPU keeps (its loss and the
     * probabilities' 1 / sum come from the double sums). */
    double sum = 0.0, sum_x = 0.0;
    for (int k = lane; k < K; k += 32) {
        const float e = expf(x[k] - mx);
        pr[k] = e;
        sum += e;
        sum_x += x[k];
    }
    sum = visc_warp_sum(sum);
    sum_x = visc_warp_sum(sum_x);
    const float inv = (float)(1.0 / sum);
    for (int k = lane; k < K; k += 32) pr[k] *= inv;
    if (lane == 0) {
        /* A label outside [0, K) (the host never sees them) poisons the
         * loss with NaN instead of reading out of bounds. */
        const int y = labels[n];
        if (y < 0 || y >= K) {
            row_loss[n] = NAN;
            return;
        }
        const double lse = (double)mx + log(sum);
        row_loss[n] = (float)(lse - (1.0 - smoothing) * x[y] - (double)smoothing / K * sum_x);
    }
}

/* One block: the mean of N losses, each thread a strided share, then the
 * shares in thread order (a tree over a fixed shape: deterministic). */
__global__ void mean_kernel(float *loss, const float *row_loss, int N) {
    __shared__ double part[256];
    double s = 0.0;
    for (int n = threadIdx.x; n < N; n += 256) s += row_loss[n];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *loss = (float)(part[0] / N);
}

int visc_cuda_mean_losses(visc_cuda *ctx, float *loss, const float *row_loss, int N) {
    mean_kernel<<<1, 256, 0, ctx->stream>>>(loss, row_loss, N);
    return visc_cuda_launched("mean loss");
}

int visc_cuda_softmax_xent_forward(visc_cuda *ctx, float *loss, float *probs, const float *logits,
                                   const int32_t *labels, int N, int K, float smoothing) {
    if (N <= 0 || K <= 0) return visc_set_error("softmax cross-entropy: bad shape [%d, %d]", N, K);
    float *row_loss = (float *)visc_cuda_scratch(ctx, sizeof(float) * (size_t)N);
    if (!row_loss) return -1;
    xent_forward_kernel<<<(N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, 32 * ROWS_PER_BLOCK, 0,
                          ctx->stream>>>(row_loss, probs, logits, labels, N, K, smoothing);
    if (visc_cuda_launched("softmax cross-entropy forward")) return -1;
    return visc_cuda_mean_losses(ctx, loss, row_loss, N);
}

__global__ void xent_backward_kernel(float *dlogits, const float *probs, const int32_t *labels,
                                     int N, int K, float invN, float off, float on) {
    const size_t total = (size_t)N * K;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const int n = (int)(i / K), k = (int)(i % K);
        dlogits[i] = (probs[i] - (k == labels[n] ? on : off)) * invN;
    }
}

int visc_cuda_softmax_xent_backward(visc_cuda *ctx, float *dlogits, const float *probs,
                                    const int32_t *labels, int N, int K, float smoothing) {
    if (N <= 0 || K <= 0) return visc_set_error("softmax cross-entropy: bad shape [%d, %d]", N, K);
    const float invN = 1.0f / (float)N, off = smoothing / (float)K, on = 1.0f - smoothing + off;
    xent_backward_kernel<<<visc_cuda_blocks((size_t)N * K, 256), 256, 0, ctx->stream>>>(dlogits,
                                                                                        probs,
                                                                                        labels, N,
                                                                                        K, invN,
                                                                                        off, on);
    return visc_cuda_launched("softmax cross-entropy backward");
}

/* ---- soft targets (loss_soft.c): mixup and cutmix ----
 * With T = sum_k t_k: loss_n = T lse - sum_k t_k x_k and
 * dlogits = (T softmax(x) - t) / N. One warp per sample as above, the
 * sums in double as the CPU's. */
__global__ void soft_forward_kernel(float *row_loss, float *probs, const float *logits,
                                    const float *targets, int N, int K) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (n >= N) return;
    const float *x = logits + (size_t)n * K, *t = targets + (size_t)n * K;
    float *pr = probs + (size_t)n * K;
    float mx = -INFINITY;
    for (int k = lane; k < K; k += 32) mx = fmaxf(mx, x[k]);
    mx = visc_warp_max(mx);
    double sum = 0.0, sum_t = 0.0, sum_tx = 0.0;
    for (int k = lane; k < K; k += 32) {
        const float e = expf(x[k] - mx);
        pr[k] = e;
        sum += e;
        sum_t += t[k];
        sum_tx += (double)t[k] * x[k];
    }
    sum = visc_warp_sum(sum);
    sum_t = visc_warp_sum(sum_t);
    sum_tx = visc_warp_sum(sum_tx);
    const float inv = (float)(1.0 / sum);
    for (int k = lane; k < K; k += 32) pr[k] *= inv;
    if (lane == 0) row_loss[n] = (float)(sum_t * ((double)mx + log(sum)) - sum_tx);
}

int visc_cuda_softmax_xent_soft_forward(visc_cuda *ctx, float *loss, float *probs,
                                        const float *logits, const float *targets, int N, int K) {
    if (N <= 0 || K <= 0) return visc_set_error("soft cross-entropy: bad shape [%d, %d]", N, K);
    float *row_loss = (float *)visc_cuda_scratch(ctx, sizeof(float) * (size_t)N);
    if (!row_loss) return -1;
    soft_forward_kernel<<<(N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, 32 * ROWS_PER_BLOCK, 0,
                          ctx->stream>>>(row_loss, probs, logits, targets, N, K);
    if (visc_cuda_launched("soft cross-entropy forward")) return -1;
    return visc_cuda_mean_losses(ctx, loss, row_loss, N);
}

__global__ void soft_backward_kernel(float *dlogits, const float *probs, const float *targets,
                                     int N, int K, float invN) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (n >= N) return;
    const float *pr = probs + (size_t)n * K, *t = targets + (size_t)n * K;
    float *d = dlogits + (size_t)n * K;
    float sum_t = 0.0f; /* in float as the CPU's (a mixed target sums to 1 either way) */
    for (int k = lane; k < K; k += 32) sum_t += t[k];
    sum_t = visc_warp_sum(sum_t);
    for (int k = lane; k < K; k += 32) d[k] = (pr[k] * sum_t - t[k]) * invN;
}

int visc_cuda_softmax_xent_soft_backward(visc_cuda *ctx, float *dlogits, const float *probs,
                                         const float *targets, int N, int K) {
    if (N <= 0 || K <= 0) return visc_set_error("soft cross-entropy: bad shape [%d, %d]", N, K);
    soft_backward_kernel<<<(N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, 32 * ROWS_PER_BLOCK, 0,
                           ctx->stream>>>(dlogits, probs, targets, N, K, 1.0f / (float)N);
    return visc_cuda_launched("soft cross-entropy backward");
}

/* ---- top-1 / top-5 counts (loss.c's visc_topk_correct) ----
 * The label's rank is the number of classes with a larger logit, or an
 * equal one at a lower index (torch.topk's order): one warp per sample
 * counts them, and the counts are integers, so their atomic sums do not
 * depend on the order the warps finish in. */
__global__ void topk_kernel(int32_t *counts, const float *logits, const int32_t *labels, int N,
                            int K, int kk) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (n >= N) return;
    const int y = labels[n];
    if (y < 0 || y >= K) return;
    const float *x = logits + (size_t)n * K;
    const float v = x[y];
    int rank = 0;
    for (int k = lane; k < K; k += 32) rank += x[k] > v || (x[k] == v && k < y);
    for (int o = 16; o > 0; o >>= 1) rank += __shfl_xor_sync(0xffffffffu, rank, o);
    if (lane == 0) {
        if (rank == 0) atomicAdd(&counts[0], 1);
        if (rank < kk) atomicAdd(&counts[1], 1);
    }
}

int visc_cuda_topk_correct(visc_cuda *ctx, int32_t *counts, const float *logits,
                           const int32_t *labels, int N, int K) {
    if (N <= 0 || K <= 0) return visc_set_error("top-k accuracy: bad shape [%d, %d]", N, K);
    if (visc_cuda_check(cudaMemsetAsync(counts, 0, 2 * sizeof(int32_t), ctx->stream),
                        "zeroing the top-k counts"))
        return -1;
    topk_kernel<<<(N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, 32 * ROWS_PER_BLOCK, 0,
                  ctx->stream>>>(counts, logits, labels, N, K, K < 5 ? K : 5);
    return visc_cuda_launched("top-k accuracy");
}

/* contrastive.cu: the embeddings' L2 normalization (forward and backward),
 * MoCo's InfoNCE against the memory bank and SimCLR's NT-Xent (between
 * its collectives: src/gpu/layers.c), the GPU twins of visc_l2_normalize_*,
 * visc_infonce_forward_backward and visc_ntxent_forward_backward
 * (src/ssl/contrastive.c). InfoNCE: for query i with
 * logits x_i0 = q_i . k_i / t (the positive) and x_ij = q_i . b_j / t:
 *   loss_i = lse(x_i) - x_i0
 *   dx_i   = (softmax(x_i) - onehot(0)) / n
 *   dq_i   = (dx_i0 k_i + sum_j dx_ij b_j) / t
 * The two large products (queries x bank, gradients x bank) are cuBLASLt's
 * in fp32; one block per query row takes its positive, its softmax (sums
 * in double, as the CPU's) and its gradient row in place of the logits.
 * The work buffer: the negatives' logits [n, K], then the positives'
 * gradients [n], then the per-row losses [n]. */
#include "common.cuh"

#define ROW_THREADS 256

/* The block's sum (double) or maximum (float) of one value per thread, in
 * a fixed tree: warps first, then the warps' results. Every thread gets it. */
static __device__ double block_sum(double v, double *part) {
    v = visc_warp_sum(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    double s = lane < ROW_THREADS / 32 ? part[lane] : 0.0;
    s = visc_warp_sum(s);
    __syncthreads(); /* part is free again */
    return s;
}

static __device__ float block_max(float v, float *part) {
    v = visc_warp_max(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float m = lane < ROW_THREADS / 32 ? part[lane] : -INFINITY;
    m = visc_warp_max(m);
    __syncthreads();
    return m;
}

/* Row i: neg holds q_i . b_j (unscaled) on entry and dx_ij on exit; gpos[i]
 * gets dx_i0 and row_loss[i] the row's loss. */
__global__ void infonce_row_kernel(float *neg, float *gpos, float *row_loss, const float *q,
                                   const float *k, int K, int D, float inv_t, float inv_n) {
    __shared__ double dpart[ROW_THREADS / 32];
    __shared__ float fpart[ROW_THREADS / 32];
    const int i = blockIdx.x;
    const float *qi = q + (size_t)i * D, *ki = k + (size_t)i * D;
    float *row = neg + (size_t)i * K;
    double dot = 0.0;
    for (int j = threadIdx.x; j < D; j += ROW_THREADS) dot += (double)qi[j] * ki[j];
    const float pos = (float)block_sum(dot, dpart) * inv_t;
    float mx = threadIdx.x == 0 ? pos : -INFINITY;
    for (int j = threadIdx.x; j < K; j += ROW_THREADS) mx = fmaxf(mx, row[j] * inv_t);
    mx = block_max(mx, fpart);
    double sum = threadIdx.x == 0 ? (double)expf(pos - mx) : 0.0;
    for (int j = threadIdx.x; j < K; j += ROW_THREADS) sum += expf(row[j] * inv_t - mx);
    sum = block_sum(sum, dpart);
    const float inv = (float)(1.0 / sum);
    for (int j = threadIdx.x; j < K; j += ROW_THREADS)
        row[j] = expf(row[j] * inv_t - mx) * inv * inv_n;
    if (threadIdx.x == 0) {
        /* dx_i0 = (p_0 - 1) / n with p_0 - 1 = (e_0 - sum) / sum in double
         * (sum holds e_0 exactly): the positive dominates its row in
         * training, and p_0 / n - 1 / n in float kept few of the small
         * result's bits (seen on the emulator, tests/gpu/emu: dq 5e-5 off) */
        const double e0 = (double)expf(pos - mx);
        gpos[i] = (float)((e0 - sum) / sum * (double)inv_n);
        /* the maximum itself contributes exp(0) = 1: sum >= 1 */
        row_loss[i] = (float)((double)mx + log(fmax(sum, 1.0)) - (double)pos);
    }
}

/* dq = dq / t + (gpos_i / t) k_i: the product's share scaled, the positive's added. */
__global__ void infonce_dq_kernel(float *dq, const float *gpos, const float *k, int n, int D,
                                  float inv_t) {
    const size_t total = (size_t)n * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / (size_t)D;
        dq[e] = dq[e] * inv_t + gpos[i] * inv_t * k[e];
    }
}

int visc_cuda_infonce(visc_cuda *ctx, float *loss, float *dq, const float *q, const float *k,
                      const float *bank, int n, int K, int D, float t, float *work) {
    if (n <= 0 || K <= 0 || D <= 0 || !(t > 0))
        return visc_set_error("InfoNCE: bad shape (%d queries, bank %d x %d, temperature %g)", n, K,
                              D, (double)t);
    float *neg = work, *gpos = work + (size_t)n * K, *row_loss = gpos + n;
    const float inv_t = 1.0f / t, inv_n = 1.0f / (float)n;
    /* neg [n, K] = q [n, D] bank^T */
    if (visc_cuda_matmul_f32(ctx, neg, q, bank, NULL, n, K, D, 0, 1, 0.0f)) return -1;
    infonce_row_kernel<<<n, ROW_THREADS, 0, ctx->stream>>>(neg, gpos, row_loss, q, k, K, D, inv_t,
                                                           inv_n);
    if (visc_cuda_launched("InfoNCE rows")) return -1;
    if (visc_cuda_mean_losses(ctx, loss, row_loss, n)) return -1;
    if (!dq) return 0;
    /* dq [n, D] = dx [n, K] bank [K, D], then scaled and the positive added */
    if (visc_cuda_matmul_f32(ctx, dq, neg, bank, NULL, n, D, K, 0, 0, 0.0f)) return -1;
    infonce_dq_kernel<<<visc_cuda_blocks((size_t)n * D, 256), 256, 0, ctx->stream>>>(dq, gpos, k, n,
                                                                                     D, inv_t);
    return visc_cuda_launched("InfoNCE query gradient");
}

/* Row i of x [n, D]: norms[i] = max(|x_i|, 1e-12) (the sum of squares in
 * double, as the CPU's), y_i = x_i / norms[i]. */
__global__ void l2_normalize_kernel(float *y, float *norms, const float *x, int D) {
    __shared__ double part[ROW_THREADS / 32];
    const size_t at = (size_t)blockIdx.x * D;
    double s = 0.0;
    for (int j = threadIdx.x; j < D; j += ROW_THREADS) s += (double)x[at + j] * x[at + j];
    const float norm = (float)fmax(sqrt(block_sum(s, part)), 1e-12);
    if (threadIdx.x == 0) norms[blockIdx.x] = norm;
    for (int j = threadIdx.x; j < D; j += ROW_THREADS) y[at + j] = x[at + j] / norm;
}

/* g = scale dy_i; dx_i = (g - y_i (y_i . g)) / norms[i] (dx may be dy). */
__global__ void l2_normalize_backward_kernel(float *dx, const float *dy, const float *y,
                                             const float *norms, int D, float scale) {
    __shared__ double part[ROW_THREADS / 32];
    const size_t at = (size_t)blockIdx.x * D;
    double dot = 0.0;
    for (int j = threadIdx.x; j < D; j += ROW_THREADS)
        dot += (double)y[at + j] * (dy[at + j] * scale);
    const float d = (float)block_sum(dot, part), norm = norms[blockIdx.x];
    for (int j = threadIdx.x; j < D; j += ROW_THREADS)
        dx[at + j] = (dy[at + j] * scale - y[at + j] * d) / norm;
}

int visc_cuda_l2_normalize_forward(visc_cuda *ctx, float *y, float *norms, const float *x, int n,
                                   int D) {
    if (n <= 0 || D <= 0) return visc_set_error("L2 normalize: bad shape %d x %d", n, D);
    l2_normalize_kernel<<<n, ROW_THREADS, 0, ctx->stream>>>(y, norms, x, D);
    return visc_cuda_launched("L2 normalize");
}

int visc_cuda_l2_normalize_backward(visc_cuda *ctx, float *dx, const float *dy, const float *y,
                                    const float *norms, int n, int D, float scale) {
    if (n <= 0 || D <= 0) return visc_set_error("L2 normalize backward: bad shape %d x %d", n, D);
    l2_normalize_backward_kernel<<<n, ROW_THREADS, 0, ctx->stream>>>(dx, dy, y, norms, D, scale);
    return visc_cuda_launched("L2 normalize backward");
}

/* NT-Xent row a of sim = z all^T [R, C] (R = 2n local rows: view 0's,
 * then view 1's; C = 2N candidates: view 0 of every rank, then view 1,
 * this rank's from `own` = rank * n in each): logits x_aj = sim_aj / t for
 * j != self, the label its partner view. On exit the row holds
 * S_aj = (softmax_aj - onehot(partner)) * scale (S_a,self = 0) and
 * row_loss[a] = lse_a - x_a,partner. */
__global__ void ntxent_row_kernel(float *sim, float *row_loss, int C, int n, int N, int own,
                                  float inv_t, float scale) {
    __shared__ double dpart[ROW_THREADS / 32];
    __shared__ float fpart[ROW_THREADS / 32];
    const int a = blockIdx.x, i = a < n ? a : a - n;
    const int self = (a < n ? 0 : N) + own + i, partner = (a < n ? N : 0) + own + i;
    float *row = sim + (size_t)a * C;
    const float pos = row[partner] * inv_t; /* read before any thread writes the row */
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < C; j += ROW_THREADS)
        if (j != self) mx = fmaxf(mx, row[j] * inv_t);
    mx = block_max(mx, fpart);
    double sum = 0.0;
    for (int j = threadIdx.x; j < C; j += ROW_THREADS)
        if (j != self) sum += expf(row[j] * inv_t - mx);
    sum = block_sum(sum, dpart);
    const float inv = (float)(1.0 / sum);
    for (int j = threadIdx.x; j < C; j += ROW_THREADS)
        row[j] = j == self ? 0.0f
                           : expf(row[j] * inv_t - mx) * inv * scale - (j == partner ? scale : 0.0f);
    if (threadIdx.x == 0) row_loss[a] = (float)((double)mx + log(fmax(sum, 1.0)) - (double)pos);
}

/* Every local row is an anchor (its row of S) and a candidate (its
 * column), so dz = S all + S^T z, with S carrying 1 / (R t): the
 * product's 1 / t and the mean's 1 / R. With other ranks the columns'
 * share S^T z goes to dall, for the caller to sum over the ranks. */
int visc_cuda_ntxent(visc_cuda *ctx, float *loss, float *dz, float *dall, const float *z,
                     const float *all, int n, int N, int rank, int D, float t, float *work) {
    if (n <= 0 || D <= 0 || !(t > 0) || N < n || N % n || rank < 0 || rank >= N / n ||
        (N > n && dz && !dall))
        return visc_set_error("NT-Xent: bad shape (%d samples x 2 views of %d, rank %d, dim %d, "
                              "temperature %g)",
                              n, N, rank, D, (double)t);
    const int R = 2 * n, C = 2 * N;
    float *sim = work, *row_loss = work + (size_t)R * C;
    const float inv_t = 1.0f / t;
    if (visc_cuda_matmul_f32(ctx, sim, z, all, NULL, R, C, D, 0, 1, 0.0f)) return -1;
    ntxent_row_kernel<<<R, ROW_THREADS, 0, ctx->stream>>>(sim, row_loss, C, n, N, rank * n, inv_t,
                                                          inv_t / (float)R);
    if (visc_cuda_launched("NT-Xent rows")) return -1;
    if (visc_cuda_mean_losses(ctx, loss, row_loss, R)) return -1;
    if (!dz) return 0;
    if (visc_cuda_matmul_f32(ctx, dz, sim, all, NULL, R, D, C, 0, 0, 0.0f)) return -1;
    if (dall) return visc_cuda_matmul_f32(ctx, dall, sim, z, NULL, C, D, R, 1, 0, 0.0f);
    return visc_cuda_matmul_f32(ctx, dz, sim, z, NULL, R, D, R, 1, 0, 1.0f);
}

/* loss.c: softmax cross-entropy with label smoothing, and top-k accuracy.
 *
 * With target t = (1 - s) * onehot(y) + s / K and lse = log sum_k exp(x_k),
 *   loss = -sum_k t_k (x_k - lse) = lse - (1 - s) x_y - (s / K) sum_k x_k
 * which is what torch.nn.functional.cross_entropy(label_smoothing=s) computes.
 * lse is taken as max + log sum exp(x - max) so no exp overflows. */
#include <math.h>

#include "visc/nn.h"

float visc_softmax_xent_forward(float *probs, const float *logits, const int32_t *labels, int N,
                                int K, float smoothing) {
    VISC_ASSERT(N > 0 && K > 0);
    double total = 0.0;
#pragma omp parallel for reduction(+ : total) if ((size_t)N * K > 16384)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * K;
        float *pr = probs + (size_t)n * K;
        int y = labels[n];
        VISC_ASSERT(y >= 0 && y < K);
        float mx = x[0];
        for (int k = 1; k < K; k++) mx = x[k] > mx ? x[k] : mx;
        double sum = 0.0, sum_x = 0.0;
        for (int k = 0; k < K; k++) {
            float e = expf(x[k] - mx);
            pr[k] = e;
            sum += e;
            sum_x += x[k];
        }
        float inv = (float)(1.0 / sum);
        for (int k = 0; k < K; k++) pr[k] *= inv;
        double lse = (double)mx + log(sum);
        total += lse - (1.0 - smoothing) * x[y] - (double)smoothing / K * sum_x;
    }
    return (float)(total / N);
}

void visc_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels, int N,
                                int K, float smoothing) {
    const float invN = 1.0f / (float)N, off = smoothing / (float)K, on = 1.0f - smoothing + off;
#pragma omp parallel for if ((size_t)N * K > 16384)
    for (int n = 0; n < N; n++) {
        const float *pr = probs + (size_t)n * K;
        float *d = dlogits + (size_t)n * K;
        for (int k = 0; k < K; k++) d[k] = (pr[k] - off) * invN;
        d[labels[n]] = (pr[labels[n]] - on) * invN;
    }
}

/* The label's rank is the number of classes that beat it: a strictly larger
 * logit, or an equal one at a lower index (torch.topk's tie order). Top-1 is
 * rank 0, top-5 is rank < min(5, K). One pass per sample, no sort. */
void visc_topk_correct(const float *logits, const int32_t *labels, int N, int K, int *top1,
                       int *top5) {
    int c1 = 0, c5 = 0, kk = K < 5 ? K : 5;
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * K;
        int y = labels[n];
        VISC_ASSERT(y >= 0 && y < K);
        float v = x[y];
        int rank = 0;
        for (int k = 0; k < K; k++) rank += x[k] > v || (x[k] == v && k < y);
        c1 += rank == 0;
        c5 += rank < kk;
    }
    *top1 = c1;
    *top5 = c5;
}

/* loss_soft.c: softmax cross-entropy with soft targets (timm's
 * SoftTargetCrossEntropy), the loss of Mixup / CutMix training.
 *
 * With lse = log sum_k exp(x_k) and T = sum_k t_k,
 *   loss_n = sum_k -t_k (x_k - lse) = T lse - sum_k t_k x_k
 *   d loss_n / d x_k = T softmax(x)_k - t_k
 * T is 1 for Mixup's targets, but the general form costs nothing and keeps
 * the gradient right for any target. lse is max + log sum exp(x - max),
 * accumulated in double, as loss.c does. */
#include <math.h>

#include "visc/nn.h"

float visc_softmax_xent_soft_forward(float *probs, const float *logits, const float *targets, int N,
                                     int K) {
    VISC_ASSERT(N > 0 && K > 0);
    double total = 0.0;
#pragma omp parallel for reduction(+ : total) if ((size_t)N * K > 16384)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * K, *t = targets + (size_t)n * K;
        float *pr = probs + (size_t)n * K;
        float mx = x[0];
        for (int k = 1; k < K; k++) mx = x[k] > mx ? x[k] : mx;
        double sum = 0.0, sum_t = 0.0, sum_tx = 0.0;
        for (int k = 0; k < K; k++) {
            float e = expf(x[k] - mx);
            pr[k] = e;
            sum += e;
            sum_t += t[k];
            sum_tx += (double)t[k] * x[k];
        }
        float inv = (float)(1.0 / sum);
        for (int k = 0; k < K; k++) pr[k] *= inv;
        /* cppcheck-suppress invalidFunctionArg ; K > 0 (asserted), so sum >= exp(mx - mx) = 1 */
        double lse = (double)mx + log(sum);
        total += sum_t * lse - sum_tx;
    }
    return (float)(total / N);
}

void visc_softmax_xent_soft_backward(float *dlogits, const float *probs, const float *targets,
                                     int N, int K) {
    const float invN = 1.0f / (float)N;
#pragma omp parallel for if ((size_t)N * K > 16384)
    for (int n = 0; n < N; n++) {
        const float *pr = probs + (size_t)n * K, *t = targets + (size_t)n * K;
        float *d = dlogits + (size_t)n * K;
        float sum_t = 0.0f;
        for (int k = 0; k < K; k++) sum_t += t[k];
        for (int k = 0; k < K; k++) d[k] = (pr[k] * sum_t - t[k]) * invN;
    }
}

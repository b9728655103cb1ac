/* evaluate.c: validation loss and top-1/top-5 accuracy over a whole dataset.
 * The model is planned for one batch size; the last partial batch is padded
 * with copies of its first sample and only its real rows are counted
 * (eval-mode BatchNorm is per-sample, so padding changes nothing). */
#include <stdlib.h>
#include <string.h>

#include "visc/nn.h"
#include "visc/train.h"

int visc_evaluate(visc_model *m, const visc_dataset *ds, const visc_augment *aug, float smoothing,
                  visc_eval_result *out) {
    int B = m->cfg.batch, K = m->cfg.num_classes;
    size_t sample = (size_t)ds->channels * ds->height * ds->width;
    float *x = visc_alloc_aligned((size_t)B * sample * sizeof(float), "eval batch");
    float *probs = visc_alloc_aligned((size_t)B * K * sizeof(float), "eval probabilities");
    int32_t *y = visc_malloc((size_t)B * sizeof *y, "eval labels");
    int64_t *order = visc_malloc((size_t)B * sizeof *order, "eval order");
    double loss_sum = 0;
    int64_t top1 = 0, top5 = 0;
    int rc = 0;
    for (int64_t start = 0; start < ds->size; start += B) {
        int n = ds->size - start < B ? (int)(ds->size - start) : B;
        for (int i = 0; i < B; i++) order[i] = start + (i < n ? i : 0);
        if (visc_make_batch(ds, order, B, aug, 0, 0, 0, x, y)) {
            rc = -1;
            break;
        }
        m->forward(m, x, 0);
        loss_sum += (double)visc_softmax_xent_forward(probs, m->logits, y, n, K, smoothing) * n;
        int c1, c5;
        visc_topk_correct(m->logits, y, n, K, &c1, &c5);
        top1 += c1;
        top5 += c5;
    }
    out->count = ds->size;
    out->loss = ds->size ? loss_sum / ds->size : 0;
    out->top1 = ds->size ? 100.0 * top1 / ds->size : 0;
    out->top5 = ds->size ? 100.0 * top5 / ds->size : 0;
    visc_free_aligned(x);
    visc_free_aligned(probs);
    free(y);
    free(order);
    return rc;
}

/* evaluate.c: validation loss and top-1/top-5 accuracy over a whole dataset.
 * Batches come from the loader in dataset order (no shuffle, no drop_last,
 * train = 0: no augmentation). The model is planned for one batch size; the
 * last partial batch is padded with copies of its first sample and only its
 * real rows are counted (eval-mode layers are per-sample, so padding changes
 * nothing). Unusable images are skipped and counted, as in training. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/gpu.h"
#include "visc/loader.h"
#include "visc/nn.h"
#include "visc/train.h"

int visc_evaluate(visc_model *m, const visc_dataset *ds, const visc_augment *aug, float smoothing,
                  visc_eval_result *out) {
    return visc_evaluate_shard(m, ds, aug, smoothing, NULL, out);
}

int visc_evaluate_shard(visc_model *m, const visc_dataset *ds, const visc_augment *aug,
                        float smoothing, visc_dist *d, visc_eval_result *out) {
    int B = m->cfg.batch, K = m->cfg.num_classes;
    size_t sample = (size_t)ds->channels * ds->height * ds->width;
    visc_loader_config lc = {.batch_size = B,
                             .train = 0,
                             .on_bad = VISC_ON_BAD_SKIP,
                             .rank = visc_dist_rank(d),
                             .world = visc_dist_world(d)};
    if (aug) lc.aug = *aug;
    visc_loader *l = visc_loader_new(ds, &lc);
    if (!l) return -1;
    visc_gpu_pins pins = {0};
    if (m->cuda) visc_gpu_pin_loader(m->cuda, l, &pins);
    float *probs = visc_alloc_aligned((size_t)B * K * sizeof(float), "eval probabilities");
    double loss_sum = 0;
    int64_t top1 = 0, top5 = 0, count = 0;
    int rc = visc_loader_start(l, 0, 0, -1);
    visc_batch b;
    while (rc == 0 && (rc = visc_loader_next(l, &b)) == 1) {
        int n = b.count;
        for (int i = n; i < B; i++) memcpy(b.x + i * sample, b.x, sample * sizeof(float));
        m->forward(m, b.x, 0);
        loss_sum += (double)visc_softmax_xent_forward(probs, m->logits, b.y, n, K, smoothing) * n;
        int c1, c5;
        visc_topk_correct(m->logits, b.y, n, K, &c1, &c5);
        top1 += c1;
        top5 += c5;
        count += n;
        rc = 0;
    }
    /* every rank's sums, added up (a group of one: unchanged) */
    double sums[4] = {loss_sum, (double)top1, (double)top5, (double)count};
    if (rc == 0 && d && visc_dist_allreduce(d, sums, 4, VISC_DT_F64, VISC_OP_SUM)) rc = -1;
    loss_sum = sums[0];
    top1 = (int64_t)sums[1];
    top5 = (int64_t)sums[2];
    count = (int64_t)sums[3];
    if (rc == 0 && visc_loader_bad_count(l) > 0)
        fprintf(stderr, "visc: warning: evaluation skipped %lld unusable image(s) (first: %s)\n",
                (long long)visc_loader_bad_count(l), visc_loader_bad_message(l, 0));
    out->count = count;
    out->loss = count ? loss_sum / count : 0;
    out->top1 = count ? 100.0 * top1 / count : 0;
    out->top5 = count ? 100.0 * top5 / count : 0;
    visc_free_aligned(probs);
    visc_gpu_unpin(&pins);
    visc_loader_free(l);
    return rc < 0 ? -1 : 0;
}

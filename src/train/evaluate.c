/* evaluate.c: validation loss and top-1/top-5 accuracy over a whole dataset.
 * Batches come from the loader in dataset order (no shuffle, no drop_last,
 * train = 0: no augmentation). The model is planned for one batch size; the
 * last partial batch is padded with copies of its first sample and only its
 * real rows are counted (eval-mode layers are per-sample, so padding changes
 * nothing). Unusable images are skipped and counted, as in training. On a
 * GPU the batches cross beside the kernels (image data as bytes) and the
 * losses and counts come back in runs, as the trainer's steps do. */
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

/* The sums of the batches evaluated so far. */
typedef struct {
    double loss_sum;
    int64_t top1, top5, count;
} eval_sums;

/* On a GPU a batch's loss and counts stay there (visc_gpu_stage) until
 * `pending` of them are read back in one copy, in batch order. */
static int settle(visc_gpu_stage *st, int pending, const int *counts, eval_sums *s) {
    float loss[VISC_GPU_STAGE_STEPS];
    int32_t top1[VISC_GPU_STAGE_STEPS], top5[VISC_GPU_STAGE_STEPS];
    if (pending == 0) return 0;
    if (visc_gpu_stage_results(st, pending, loss, top1, top5)) return -1;
    for (int i = 0; i < pending; i++) {
        s->loss_sum += (double)loss[i] * counts[i];
        s->top1 += top1[i];
        s->top5 += top5[i];
        s->count += counts[i];
    }
    return 0;
}

int visc_evaluate_shard(visc_model *m, const visc_dataset *ds, const visc_augment *aug,
                        float smoothing, visc_dist *d, visc_eval_result *out) {
    int B = m->cfg.batch, K = m->cfg.num_classes;
    size_t sample = (size_t)ds->channels * ds->height * ds->width;
    /* On a GPU, image data crosses the bus as bytes, normalized there */
    const int bytes = m->cuda && ds->get_bytes && ds->channels == 3 && ds->views <= 1;
    visc_loader_config lc = {.batch_size = B,
                             .train = 0,
                             .on_bad = VISC_ON_BAD_SKIP,
                             .rank = visc_dist_rank(d),
                             .world = visc_dist_world(d),
                             .bytes = bytes};
    if (aug) lc.aug = *aug;
    visc_loader *l = visc_loader_new(ds, &lc);
    if (!l) return -1;
    visc_gpu_pins pins = {0};
    visc_gpu_stage *st = NULL;
    if (m->cuda) {
        visc_gpu_pin_loader(m->cuda, l, &pins);
        st = visc_gpu_stage_create(m->cuda, B, K, sample * (bytes ? 1 : sizeof(float)), 0);
        if (!st) {
            visc_gpu_unpin(&pins);
            visc_loader_free(l);
            return -1;
        }
    }
    float *probs = visc_alloc_aligned((size_t)B * K * sizeof(float), "eval probabilities");
    eval_sums sums = {0};
    int pending = 0, counts[VISC_GPU_STAGE_STEPS];
    int rc = visc_loader_start(l, 0, 0, -1);
    visc_batch b;
    while (rc == 0 && (rc = visc_loader_next(l, &b)) == 1) {
        int n = b.count;
        for (int i = n; i < B; i++) {
            if (b.x8) memcpy(b.x8 + i * sample, b.x8, sample);
            else memcpy(b.x + i * sample, b.x, sample * sizeof(float));
        }
        rc = 0;
        if (st) {
            /* the batch crosses beside the previous batch's kernels; loss
             * and counts stay on the device */
            float *x = visc_gpu_stage_put(st, b.x8 ? (void *)b.x8 : (void *)b.x, b.y, n);
            if (b.x8) {
                visc_gpu_normalize_bytes(m->cuda, m->input, (const uint8_t *)x, (size_t)B,
                                         sample / 3, ds->byte_mean, ds->byte_std);
                x = m->input;
            }
            m->io_on_device = 1;
            m->forward(m, x, 0);
            m->io_on_device = 0;
            visc_gpu_stage_loss(st, pending, m->dev_logits, n, n, smoothing);
            counts[pending++] = n;
            if (visc_gpu_stage_end(st) ||
                (pending == VISC_GPU_STAGE_STEPS && settle(st, pending, counts, &sums)))
                rc = -1;
            if (pending == VISC_GPU_STAGE_STEPS) pending = 0;
            continue;
        }
        m->forward(m, b.x, 0);
        sums.loss_sum +=
            (double)visc_softmax_xent_forward(probs, m->logits, b.y, n, K, smoothing) * n;
        int c1, c5;
        visc_topk_correct(m->logits, b.y, n, K, &c1, &c5);
        sums.top1 += c1;
        sums.top5 += c5;
        sums.count += n;
    }
    if (rc == 0 && st && settle(st, pending, counts, &sums)) rc = -1;
    /* every rank's sums, added up (a group of one: unchanged) */
    double totals[4] = {sums.loss_sum, (double)sums.top1, (double)sums.top5, (double)sums.count};
    if (rc == 0 && d && visc_dist_allreduce(d, totals, 4, VISC_DT_F64, VISC_OP_SUM)) rc = -1;
    const double loss_sum = totals[0];
    const int64_t top1 = (int64_t)totals[1], top5 = (int64_t)totals[2], count = (int64_t)totals[3];
    if (rc == 0 && visc_loader_bad_count(l) > 0)
        fprintf(stderr, "visc: warning: evaluation skipped %lld unusable image(s) (first: %s)\n",
                (long long)visc_loader_bad_count(l), visc_loader_bad_message(l, 0));
    out->count = count;
    out->loss = count ? loss_sum / count : 0;
    out->top1 = count ? 100.0 * top1 / count : 0;
    out->top5 = count ? 100.0 * top5 / count : 0;
    visc_free_aligned(probs);
    visc_gpu_stage_free(st);
    visc_gpu_unpin(&pins);
    visc_loader_free(l);
    return rc < 0 ? -1 : 0;
}

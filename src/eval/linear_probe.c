/* linear_probe.c: linear evaluation of a frozen backbone (lightly's
 * LinearClassifier with freeze_model=True).
 *
 * The backbone runs in eval mode on every batch (BatchNorm normalizes with
 * its running statistics and never updates them) and nothing flows back
 * into it: the model's parameters, buffers and gradients are never written.
 * Only our own Linear(D, C), in a two-tensor table of its own, trains,
 * with its own optimizer. The train transform is random per epoch, so the
 * training features are recomputed every epoch; the validation features
 * are not (eval transform, frozen backbone): they are extracted once and
 * each epoch's validation is one small matmul over them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/nn.h"
#include "visc/optim.h"
#include "visc/rng.h"
#include "visc/ssl_eval.h"

#define HEAD_SUBSTREAM 0x11ea7ull
#define VAL_BLOCK 4096

void visc_linear_probe_defaults(visc_linear_probe_config *c) {
    memset(c, 0, sizeof *c);
    c->epochs = 90;
    c->lr = 0.1f;
    c->momentum = 0.9f;
    c->weight_decay = 0.0f;
    c->end_lr_factor = 0.001f;
}

/* lightly's cosine_schedule(step, max_steps, 1, end): the multiplier of
 * the base lr at a step (per step, no warmup). */
static float cosine_factor(int64_t step, int64_t max_steps, float end) {
    if (max_steps <= 1) return 1.0f;
    if (step >= max_steps) return end;
    const double pi = 3.14159265358979323846;
    double c = (cos(pi * (double)step / (double)(max_steps - 1)) + 1.0) / 2.0;
    return (float)(end - (end - 1.0) * c);
}

/* Top-1 / top-5 (percent) of the head on precomputed features. */
static void head_accuracy(const visc_feature_bank *v, const float *w, const float *b, int C,
                          float *logits, double *top1, double *top5) {
    int64_t c1 = 0, c5 = 0;
    for (int64_t r0 = 0; r0 < v->count; r0 += VAL_BLOCK) {
        int n = (int)(v->count - r0 < VAL_BLOCK ? v->count - r0 : VAL_BLOCK);
        visc_linear_forward(logits, v->feats + (size_t)r0 * v->dim, w, b, n, v->dim, C);
        int a1, a5;
        visc_topk_correct(logits, v->labels + r0, n, C, &a1, &a5);
        c1 += a1;
        c5 += a5;
    }
    *top1 = v->count ? 100.0 * (double)c1 / (double)v->count : 0;
    *top5 = v->count ? 100.0 * (double)c5 / (double)v->count : 0;
}

int visc_linear_probe(visc_model *m, const visc_dataset *train, const visc_augment *train_aug,
                      const visc_dataset *val, const visc_augment *val_aug,
                      const visc_linear_probe_config *c, visc_dist *d, float *head_out,
                      visc_linear_probe_result *out) {
    memset(out, 0, sizeof *out);
    const int B = m->cfg.batch, D = m->feature_dim, C = train->num_classes;
    const int world = visc_dist_world(d), rank = visc_dist_rank(d);
    if (c->epochs < 0) return visc_set_error("linear probe: --epochs must be >= 0");
    if (val->num_classes != C)
        return visc_set_error("the validation data has %d classes, the training data %d",
                              val->num_classes, C);
    visc_loader_config lc = {.batch_size = B,
                             .workers = c->workers,
                             .shuffle = 1,
                             .drop_last = 1,
                             .train = 1,
                             .rank = rank,
                             .world = world,
                             .seed = c->seed,
                             .on_bad = VISC_ON_BAD_SKIP};
    if (train_aug) lc.aug = *train_aug;
    visc_loader *l = visc_loader_new(train, &lc);
    if (!l) return -1;
    const int64_t steps_per_epoch = visc_loader_batches(l);
    if (steps_per_epoch < 1 && c->epochs > 0) {
        visc_loader_free(l);
        return visc_set_error("--batch-size %d is larger than the training set (%lld samples)",
                              B * world, (long long)train->size);
    }

    /* the head: weight [C, D] then bias [C], torch.nn.Linear's init */
    visc_table head;
    visc_table_init(&head);
    int64_t wshape[2] = {C, D}, bshape[1] = {C};
    int wi = visc_table_add(&head, "weight", 2, wshape, 0);
    int bi = visc_table_add(&head, "bias", 1, bshape, VISC_TENSOR_NO_DECAY | VISC_TENSOR_BIAS);
    visc_table_alloc(&head);
    float *W = visc_table_get(&head, wi), *bias = visc_table_get(&head, bi);
    visc_rng r = visc_rng_make(c->seed, VISC_STREAM_INIT, HEAD_SUBSTREAM);
    float bound = 1.0f / sqrtf((float)D);
    for (size_t i = 0; i < (size_t)C * D; i++) W[i] = bound * (2.0f * visc_rng_uniform(&r) - 1.0f);
    for (int i = 0; i < C; i++) bias[i] = bound * (2.0f * visc_rng_uniform(&r) - 1.0f);
    float *grads = visc_alloc_aligned(head.total * sizeof(float), "probe gradients");
    float *gW = grads + head.entries[wi].offset, *gb = grads + head.entries[bi].offset;
    visc_opt_config oc = visc_opt_defaults(VISC_OPT_SGD);
    oc.momentum = c->momentum;
    oc.nesterov = 0;
    oc.weight_decay = c->weight_decay;
    oc.decay_norm_and_bias = 1; /* lightly's probe decays every head parameter alike */
    visc_optimizer opt;
    visc_optimizer_init(&opt, &oc, &head);

    float *logits = visc_alloc_aligned((size_t)(B > VAL_BLOCK ? B : VAL_BLOCK) * C * sizeof(float),
                                       "probe logits");
    float *probs = visc_alloc_aligned((size_t)B * C * sizeof(float), "probe probabilities");
    float *dlogits = visc_alloc_aligned((size_t)B * C * sizeof(float), "probe logit gradients");
    const size_t sample = (size_t)train->channels * train->height * train->width;
    const int64_t total_steps = (int64_t)c->epochs * steps_per_epoch;

    visc_feature_bank vb;
    int rc = visc_extract_features(m, val, val_aug, 0, d, &vb);
    if (rc) goto done;
    out->best_epoch = 0;
    for (int epoch = 0; epoch < c->epochs && rc == 0; epoch++) {
        if ((rc = visc_loader_start(l, epoch, 0, -1))) break;
        double loss_sum = 0;
        int64_t batches = 0;
        visc_batch b;
        int got;
        while ((got = visc_loader_next(l, &b)) == 1) {
            int n = b.count;
            for (int i = n; i < B; i++) memcpy(b.x + i * sample, b.x, sample * sizeof(float));
            m->forward(m, b.x, 0); /* eval mode: frozen BatchNorm */
            visc_linear_forward(logits, m->features, W, bias, B, D, C);
            float loss = visc_softmax_xent_forward(probs, logits, b.y, n, C, 0.0f);
            visc_softmax_xent_backward(dlogits, probs, b.y, n, C, 0.0f);
            memset(dlogits + (size_t)n * C, 0, (size_t)(B - n) * C * sizeof(float));
            visc_linear_backward(NULL, gW, gb, dlogits, m->features, W, B, D, C);
            if (world > 1) {
                /* every rank's mean gradient, averaged: the whole batch's mean */
                if (visc_dist_allreduce(d, grads, head.total, VISC_DT_F32, VISC_OP_SUM)) {
                    rc = -1;
                    break;
                }
                for (size_t i = 0; i < head.total; i++) grads[i] /= (float)world;
            }
            float lr = c->lr * cosine_factor(out->steps, total_steps, c->end_lr_factor);
            visc_optimizer_step(&opt, head.data, grads, lr);
            out->steps++;
            if (!isfinite(loss)) {
                rc = visc_set_error("linear probe: loss is %f at step %lld: lower --lr",
                                    (double)loss, (long long)out->steps);
                break;
            }
            loss_sum += loss;
            batches++;
        }
        if (rc == 0 && got < 0) rc = -1;
        if (rc) break;
        double top1, top5;
        head_accuracy(&vb, W, bias, C, logits, &top1, &top5);
        out->last_top1 = top1;
        out->last_top5 = top5;
        out->last_loss = batches ? loss_sum / (double)batches : 0;
        if (world > 1) { /* the job's mean loss */
            double s = out->last_loss;
            if (visc_dist_allreduce(d, &s, 1, VISC_DT_F64, VISC_OP_SUM)) rc = -1;
            out->last_loss = s / world;
        }
        if (out->best_epoch == 0 || top1 > out->best_top1) {
            out->best_top1 = top1;
            out->best_top5 = top5;
            out->best_epoch = epoch + 1;
        }
        if (c->verbose && rank == 0)
            printf("linear epoch %d/%d: train loss %.4f | val top1 %.2f%% top5 %.2f%% (best "
                   "%.2f%% at epoch %d)\n",
                   epoch + 1, c->epochs, out->last_loss, top1, top5, out->best_top1,
                   out->best_epoch);
    }
done:
    if (rc == 0 && head_out) { /* weight then bias, without the table's alignment gap */
        memcpy(head_out, W, (size_t)C * D * sizeof(float));
        memcpy(head_out + (size_t)C * D, bias, (size_t)C * sizeof(float));
    }
    visc_feature_bank_free(&vb);
    visc_free_aligned(logits);
    visc_free_aligned(probs);
    visc_free_aligned(dlogits);
    visc_free_aligned(grads);
    visc_optimizer_free(&opt);
    visc_table_free(&head);
    visc_loader_free(l);
    return rc ? -1 : 0;
}

/* ssl_eval.h: evaluating a (self-supervised) backbone, as the reference SSL
 * benchmark (lightly, benchmarks/imagenet/resnet50) does.
 *
 * eval/features.c      pooled backbone features of a whole dataset (eval
 *                      mode, dataset order), optionally L2-normalized;
 *                      datasets opened with the protocol's transforms
 * eval/knn.c           weighted kNN classifier on a feature bank
 * eval/linear_probe.c  a Linear(feature_dim, C) trained on the frozen backbone
 * eval/finetune.c      all parameters with a fresh head (a visc_train run)
 *
 * kNN (lightly's knn_predict): for a query feature f (L2-normalized), the
 * similarities sim = f . bank; the k most similar bank rows (ties: the lower
 * bank index first; k larger than the bank: all of it); each votes for its
 * label with weight exp(sim / t); classes are ranked by their summed weight
 * (ties: the lower class index first): top-1 / top-5 accuracy. Defaults
 * k = 200, t = 0.1, and both are printed with every result. */
#ifndef VISC_SSL_EVAL_H
#define VISC_SSL_EVAL_H

#include <stdint.h>

#include "data.h"
#include "dist.h"
#include "model.h"
#include "train.h"

#define VISC_KNN_DEFAULT_K 200
#define VISC_KNN_DEFAULT_T 0.1f

/* ---- features.c ---- */
typedef struct {
    float *feats;    /* [count, dim], 64-byte aligned */
    int32_t *labels; /* [count] */
    int64_t count;   /* rows (the dataset's samples minus skipped bad images) */
    int dim, num_classes;
} visc_feature_bank;

/* Runs the model in eval mode over the whole dataset in order (the last
 * batch padded) and keeps m->features of every usable sample (normalize:
 * each row L2-normalized as F.normalize, eps 1e-12). Several processes
 * (d, NULL: alone): each rank extracts its shard and every rank returns the
 * whole bank. 0, or -1 with the error set. */
int visc_extract_features(visc_model *m, const visc_dataset *ds, const visc_augment *aug,
                          int normalize, visc_dist *d, visc_feature_bank *out);
void visc_feature_bank_free(visc_feature_bank *b);

/* The evaluation datasets of a config (data/dataset, --val-data,
 * --input-size, --crop-pct, --subset as visc train reads them):
 *   which = 0: the training split with the eval transform (kNN bank):
 *              Resize(size / crop_pct) + CenterCrop for image data, plain
 *              normalization for in-memory data;
 *   which = 1: the training split with the config's train augmentation
 *              (image data: the --aug recipe; in-memory: --pad-crop/--hflip);
 *   which = 2: the validation split with the eval transform.
 * aug (in-memory data: normalization and crop/flip), tc and pl are filled
 * and must outlive the dataset. NULL with an error. */
visc_dataset *visc_eval_open_data(const visc_train_config *c, int which, visc_augment *aug,
                                  visc_transform_config *tc, visc_sample_pipeline *pl);
/* A model for evaluating a weights file on dataset ds: the config's
 * architecture at the dataset's size and classes, planned for `batch` and
 * for forward alone (kNN and the linear probe read its features; model.h's
 * forward_only), with every backbone tensor loaded from c->weights (the
 * classifier's may be missing or of another class count: they keep their
 * fresh init). */
visc_model *visc_eval_model(const visc_train_config *c, const visc_dataset *ds, int batch);

/* ---- knn.c ---- */
typedef struct {
    int64_t top1, top5, count; /* correct predictions and queries */
} visc_knn_counts;

/* The class scores of nq queries [nq, bank->dim] against the bank:
 * scores [nq, bank->num_classes] (the weighted votes, see above). Queries
 * are processed in blocks through one sgemm each; the top k is a partial
 * selection (a heap), not a sort. 0, or -1 with an error (k < 1, t <= 0). */
int visc_knn_scores(const visc_feature_bank *bank, const float *queries, int64_t nq, int k, float t,
                    float *scores);
/* Classifies the rows of `queries` (a bank of features with labels) and
 * counts top-1 / top-5 hits (top-C when there are fewer than 5 classes). */
int visc_knn_classify(const visc_feature_bank *bank, const visc_feature_bank *queries, int k,
                      float t, visc_knn_counts *out);
/* Rank of class `label` in one row of scores: the number of classes that
 * come before it (higher score, or equal score and lower index). */
int visc_knn_rank(const float *scores, int num_classes, int label);

/* ---- linear_probe.c ---- */
typedef struct {
    int epochs;          /* 90 */
    float lr;            /* the absolute peak lr (the CLI scales 0.1 x batch / 256) */
    float momentum;      /* 0.9 */
    float weight_decay;  /* 0 */
    float end_lr_factor; /* cosine per step from lr down to lr x this (lightly: 0.001) */
    uint64_t seed;       /* head init, data order, augmentation */
    int workers;         /* loader threads (0: cores) */
    int verbose;         /* a line per epoch on stdout */
} visc_linear_probe_config;

void visc_linear_probe_defaults(visc_linear_probe_config *c);

typedef struct {
    double best_top1, best_top5; /* percent, the best epoch's (by top-1) */
    int best_epoch;              /* 1-based */
    double last_top1, last_top5;
    double last_loss; /* mean train loss of the last epoch */
    int64_t steps;
} visc_linear_probe_result;

/* Trains Linear(m->feature_dim, C) (torch's default init) on the frozen
 * backbone: every forward in eval mode, nothing of the model is written
 * (parameters, BatchNorm statistics). SGD with momentum, cosine per step
 * (lightly's CosineWarmupScheduler, no warmup), batches of m->cfg.batch
 * per process (shuffled, drop_last); after each epoch the validation top-1
 * / top-5. head_out (may be NULL) receives the final weight [C, D] then
 * bias [C]. 0, or -1 with the error set. */
int visc_linear_probe(visc_model *m, const visc_dataset *train, const visc_augment *train_aug,
                      const visc_dataset *val, const visc_augment *val_aug,
                      const visc_linear_probe_config *c, visc_dist *d, float *head_out,
                      visc_linear_probe_result *out);
/* Copies a [C, D] weight + [C] bias into the model's classifier
 * (m->head_prefix "weight" / "bias") when it is one Linear of that shape;
 * 0, or -1 with an error. */
int visc_set_head(visc_model *m, const float *weight, const float *bias, int num_classes);

/* ---- finetune.c ---- */
/* Re-initializes every parameter whose name starts with m->head_prefix as
 * a fresh torch.nn.Linear (uniform in +-1/sqrt(fan_in), fan_in = the
 * weight's last dimension), drawn from (seed, VISC_STREAM_INIT). */
void visc_reset_head(visc_model *m, uint64_t seed);
/* The best validation epoch of a finished run: the "val" line with the
 * highest top1 in dir/log.jsonl (top5 from the same line). */
int visc_best_val_epoch(const char *dir, int *epoch, double *top1, double *top5);

#endif

/* train.h: the supervised training loop and its checkpoints.
 *
 * trainer.c     visc_train: the epoch loop, one training step top to bottom
 * evaluate.c    validation: loss, top-1, top-5 over a dataset
 * checkpoint.c  safetensors checkpoints (atomic; resume is bit-exact)
 * progress.c    progress bar on a terminal, plain lines otherwise
 * datasets.c    dataset names ("fashion-mnist", "mnist", "cifar10") -> files */
#ifndef VISC_TRAIN_H
#define VISC_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "data.h"
#include "dist.h"
#include "loader.h"
#include "model.h"
#include "optim.h"

/* `visc pretrain` (ssl.h): the self-supervised method and its settings.
 * Zero / empty fields take the method's defaults (visc_ssl_resolve). */
typedef struct {
    char method[16];     /* mocov2 | simclr */
    float temperature;   /* 0.2 MoCo v2, 0.1 SimCLR */
    int64_t bank_size;   /* MoCo: memory bank rows K (65536) */
    int proj_hidden;     /* projection head hidden width (0: the backbone's features) */
    int proj_dim;        /* projection output (128) */
    float momentum;      /* MoCo: key encoder momentum m0 (0.999) */
    int momentum_cosine; /* MoCo: cosine schedule from m0 to 1 */
    int fresh_key_head;  /* MoCo: the key head starts random (the reference library's way) */
    int symmetric;       /* MoCo: symmetric loss (both views as queries) */
    int no_gather;       /* each process keeps its own keys / negatives */
    char preset[48];     /* mocov2_resnet50_imagenet | mocov2_resnet18_cifar10 */
} visc_ssl_config;

typedef struct {
    /* data */
    char dataset[32];   /* fashion-mnist | mnist | cifar10 (in-memory formats) */
    char data_dir[512]; /* "" = the dataset's default location; or an image data spec
                           (imagefolder:/p, imagenet:/p, flat:/p, pack:/p) */
    char val_data[512]; /* image data: the validation spec ("" = the split beside --data) */
    int pad_crop, hflip;
    /* image data: the augmentation recipe (transforms.h), timm's flag names */
    char aug[16];              /* torchvision | timm | mocov2 | simclr (default torchvision) */
    char interp[16];           /* bilinear | bicubic | nearest ("" = the recipe's) */
    char scale[32], ratio[32]; /* RandomResizedCrop ranges "lo,hi" ("" = the recipe's) */
    char aa[64];               /* RandAugment spec, e.g. rand-m9-mstd0.5-inc1 ("" = the recipe's) */
    float color_jitter;        /* ColorJitter strength (brightness = contrast = saturation) */
    float reprob;              /* RandomErasing probability (-1 = the recipe's) */
    float crop_pct;            /* eval Resize(size / crop_pct) + CenterCrop(size) */
    int fast_decode;           /* decode only the crop, DCT-downscaled */
    int subset;                /* keep N images per class (0: all) */
    int workers;               /* loader threads (0: cores) */
    char on_bad_image[8];      /* skip | error */
    /* batch-level mixing (timm's Mixup) */
    float mixup, cutmix, mixup_prob, mixup_switch_prob;
    /* model */
    visc_model_config model;
    /* optimization */
    int epochs, batch_size;
    char opt[16], sched[16];
    float lr, min_lr, momentum, weight_decay, warmup_epochs, warmup_start, lr_gamma;
    int nesterov, decay_norm_and_bias, lr_step_epochs;
    char lr_milestones[128]; /* epochs, comma separated (multistep) */
    float label_smoothing, clip_grad, ema_decay;
    /* run */
    uint64_t seed;
    int threads, print_freq, evaluate, max_steps, no_progress;
    int eval_interval; /* also evaluate every N optimizer steps and when a run stops early
                        * (0: at epoch ends only) */
    char precision[8]; /* fp32 | bf16: the linear layers' products (nn.h; on a CPU without
                        * bf16, fp32), on a GPU also the ResNets' convolutions (gpu.h) */
    char device[16];   /* cpu | cuda | cuda:N (gpu.h) */
    /* GPU convolutions' algorithms by cuDNN's timed search (gpu.h) */
    int cudnn_benchmark;
    char output[512], resume[512], weights[512];
    /* data-parallel processes (dist.h): under mpirun the batch is split
     * over the ranks, each reads its shard, gradients are averaged */
    char dist_backend[8];  /* auto | none | mpi */
    float dist_timeout;    /* seconds one collective may take */
    float bucket_cap_mb;   /* gradient buckets (DDP's bucket_cap_mb, default 25) */
    int sync_bn;           /* BatchNorm statistics over all ranks */
    char gpu_allreduce[8]; /* auto | nccl | host: GPU gradients between ranks (gpu.h) */
    float blur_prob;       /* images: GaussianBlur probability (-1: the recipe's) */
    visc_ssl_config ssl;   /* visc pretrain only */
    /* --weights as a backbone: its classifier (m->head_prefix tensors) is
     * not loaded (may be absent) and starts fresh (finetune evaluation) */
    int reset_head;
    /* step coordination (NULL: every batch steps); data shard of this
     * process when not under a launcher (shard_count 0: all the data) */
    const struct visc_step_hooks *hooks;
    int shard_index, shard_count;
} visc_train_config;

void visc_train_config_defaults(visc_train_config *c);

/* The whole run: data, model, optimizer, epochs, logs, checkpoints.
 * Returns 0, or -1 with visc_last_error() set. */
int visc_train(const visc_train_config *c);

/* ---- evaluate.c ---- */
typedef struct {
    double loss, top1, top5; /* mean loss; accuracies in percent */
    int64_t count;
} visc_eval_result;

/* Runs the model in eval mode over the whole dataset (the last batch padded). */
int visc_evaluate(visc_model *m, const visc_dataset *ds, const visc_augment *aug, float smoothing,
                  visc_eval_result *out);
/* The same over several processes: rank r of the group d (dist.h; NULL:
 * alone) evaluates every world-th sample from r on, and the sums are
 * all-reduced, so every rank returns the whole dataset's result. */
int visc_evaluate_shard(visc_model *m, const visc_dataset *ds, const visc_augment *aug,
                        float smoothing, visc_dist *d, visc_eval_result *out);

/* ---- datasets.c ---- */
/* Opens the train or test split of a named dataset; NULL with an error. */
visc_dataset *visc_open_dataset(const char *name, const char *dir, int train, visc_augment *aug);
/* 1 when --data names image files (imagefolder:, imagenet:, flat:, pack:,
 * or a folder holding a pack's index.bin) rather than an in-memory format. */
int visc_is_image_data(const char *data);
/* Opens the train (train = 1) or validation split of image data with the
 * recipe of the config (--aug and its overrides; eval: Resize + CenterCrop
 * with --crop-pct) at `size` px. tc and pl are filled and must outlive the
 * dataset. NULL with an error. */
visc_dataset *visc_open_image_data(const visc_train_config *c, int train, int size,
                                   visc_transform_config *tc, visc_sample_pipeline *pl);

/* ---- checkpoint.c ---- */
#define VISC_MAX_SAVED_RANKS 64
typedef struct {
    int64_t epoch;         /* epochs completed */
    int64_t step;          /* global optimizer steps completed */
    int64_t step_in_epoch; /* batches of `epoch` already consumed (mid-epoch resume) */
    int64_t sample_pos;    /* the loader's cursor after them (bad samples skipped) */
    double best_top1;
    /* Several processes: each rank's cursor (rank_pos[r]), kept when world
     * <= VISC_MAX_SAVED_RANKS; a resume with the same world continues each
     * rank exactly, any other world restarts at step x per-rank batch. */
    int world;
    int64_t rank_pos[VISC_MAX_SAVED_RANKS];
} visc_train_state;

/* Step coordination: who decides when the optimizer steps. NULL hooks (the
 * default): every batch steps, alone or with the MPI group's averaged
 * gradient. The swarm's collaborative optimizer (src/swarm/collab.h) sets
 * them: batches accumulate until the swarm has processed its target batch,
 * then the averaged gradient is applied by every peer at the same global
 * step. The trainer stays the same; only these calls are added. */
typedef struct visc_train_access visc_train_access;
typedef struct visc_step_hooks {
    void *ctx;
    /* Once, when model, optimizer and state exist (after --resume), before
     * the first batch: the hooks may replace the state (a newcomer
     * downloads the swarm's). steps_per_epoch of the LR schedule: the
     * hooks' (e.g. dataset size / target batch) when > 0. Returns 0, -1
     * on error, or 1: the hooks did the run's work and nothing is trained
     * (an auxiliary swarm peer, which only helps others average; `visc
     * train` only). */
    int (*start)(void *ctx, visc_train_access *a, int64_t *schedule_steps_per_epoch);
    /* After the backward pass of a batch of n samples (m->grads: the mean
     * over them). Returns 1: step now, with m->grads replaced by the
     * gradient to apply and *global_step the step whose learning rate
     * applies; 0: no step (the gradient is kept by the hooks); -1: error. */
    int (*after_backward)(void *ctx, int n, float loss, int64_t *global_step);
    /* After an optimizer step: the hooks may average parameters etc.
     * -1: error. */
    int (*after_step)(void *ctx);
    /* 1: stop training now (e.g. the swarm reached its last step). */
    int (*should_stop)(void *ctx);
    void (*finish)(void *ctx);
    /* 1: every batch steps locally and the hooks average parameters, not
     * gradients (the swarm's parameter mode): state that must stay equal
     * across peers beside the parameters goes in the buffers, since the
     * EMA slot is neither averaged nor carried then. */
    int averages_parameters;
} visc_step_hooks;

/* What the hooks may reach of a running trainer. */
struct visc_train_access {
    visc_model *model;
    visc_optimizer *opt;
    visc_train_state *state;
    float *ema_params, *ema_buffers; /* NULL without --model-ema */
    int64_t train_size;              /* samples in the training set (all shards) */
    int batch_size;                  /* this process's batch */
    int64_t max_steps;               /* --max-steps (0: none): the run's last step */
    /* The full training state as a checkpoint file, and back (atomic);
     * NULL where the loop does not offer them (pretraining). */
    int (*save)(visc_train_access *a, const char *path);
    int (*load)(visc_train_access *a, const char *path);
    void *trainer;
};

/* Model-only file with torchvision/timm state_dict keys (PyTorch loads it
 * with strict=True). */
int visc_save_model(const visc_model *m, const char *path, const char *extra_meta_json);
/* Loads parameters and buffers by name; every model tensor must be present
 * with the right shape (clear error naming the first that is not). */
int visc_load_model(visc_model *m, const char *path);
/* The same without the classifier: tensors named m->head_prefix... are not
 * read, may be missing or of another shape (a backbone for a new task). */
int visc_load_model_backbone(visc_model *m, const char *path);
/* Full training checkpoint: model, optimizer state, EMA, train state. */
int visc_save_checkpoint(const visc_model *m, const visc_optimizer *o, const float *ema_params,
                         const float *ema_buffers, const visc_train_state *s,
                         const char *config_text, const char *path);
int visc_load_checkpoint(visc_model *m, visc_optimizer *o, float *ema_params, float *ema_buffers,
                         visc_train_state *s, const char *path);

/* ---- progress.c ---- */
typedef struct {
    FILE *out; /* NULL after begin: silent */
    int tty;
    double start, last_draw;
    int64_t total;
    char label[64];
} visc_progress;

void visc_progress_begin(visc_progress *p, const char *label, int64_t total, int enabled);
void visc_progress_update(visc_progress *p, int64_t done, const char *stats);
void visc_progress_end(visc_progress *p, const char *summary);

#endif

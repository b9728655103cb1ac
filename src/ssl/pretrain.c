/* pretrain.c: `visc pretrain`: MoCo v2 and SimCLR, as the reference SSL
 * library's ImageNet benchmark runs them (shared/reference/ssl-benchmark.md).
 *
 * One step of each method reads top to bottom in moco_step / simclr_step.
 * Around them: the online classifier (the backbone's own classifier, fed
 * the detached features through backward_features), the per-epoch
 * evaluation of that classifier, logs, and checkpoints that carry the key
 * encoder and the memory bank so that a resumed run is exact.
 *
 * Several processes (mpirun): each rank takes its share of the global
 * batch; gradients are averaged as in `visc train`; MoCo's keys are
 * gathered into every rank's bank (rank order) and its key encoder sees a
 * batch shuffled across the ranks (shuffle-BN) when it has BatchNorm;
 * SimCLR's negatives are the views of all ranks, the gradient through that
 * gather summed over the ranks.
 *
 * A swarm peer (`visc pretrain --swarm`): the collaborative optimizer's
 * step hooks (train.h) decide which batches end a global step and with
 * which gradient, as in `visc train`; what they see of this loop and why
 * all peers at one step hold the same state: "step hooks" below. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state_view.h"
#include "visc/gpu.h"
#include "visc/io.h"
#include "visc/rng.h"
#include "visc/ssl.h"

void visc_pretrain_config_defaults(visc_train_config *c) {
    visc_train_config_defaults(c);
    snprintf(c->output, sizeof c->output, "runs/pretrain");
    snprintf(c->model.arch, sizeof c->model.arch, "resnet50");
    snprintf(c->ssl.method, sizeof c->ssl.method, "mocov2");
    /* 0 / empty / -1: the method's value (visc_ssl_resolve) */
    c->aug[0] = 0;
    c->opt[0] = 0;
    c->lr = 0;
    c->min_lr = -1;
    c->weight_decay = -1;
    c->warmup_epochs = -1;
    c->nesterov = 0;
    c->epochs = 100;
    c->batch_size = 256;
    c->warmup_start = 0;
}

int visc_ssl_preset(const char *name, visc_train_config *c) {
    snprintf(c->ssl.preset, sizeof c->ssl.preset, "%s", name);
    if (!strcmp(name, "mocov2_resnet50_imagenet")) {
        /* the reference benchmark: every setting is the method's default */
        snprintf(c->ssl.method, sizeof c->ssl.method, "mocov2");
        snprintf(c->model.arch, sizeof c->model.arch, "resnet50");
        c->batch_size = 256;
        c->epochs = 100;
        return 0;
    }
    if (!strcmp(name, "mocov2_resnet18_cifar10")) {
        /* CIFAR stem, bank 4096, lr 0.06 x bs/128, wd 5e-4, m 0.99, t 0.1,
         * 200 epochs, batch 128; the MoCo v2 recipe at 32 px without blur;
         * validation on the 32 px images as they are */
        snprintf(c->ssl.method, sizeof c->ssl.method, "mocov2");
        snprintf(c->model.arch, sizeof c->model.arch, "resnet18");
        c->model.small_stem = 1;
        c->model.image_size = 32;
        c->ssl.bank_size = 4096;
        c->weight_decay = 5e-4f;
        c->ssl.momentum = 0.99f;
        c->ssl.temperature = 0.1f;
        c->epochs = 200;
        c->batch_size = 128;
        c->blur_prob = 0;
        c->crop_pct = 1;
        return 0;
    }
    return visc_set_error("--preset: expected mocov2_resnet50_imagenet or mocov2_resnet18_cifar10, "
                          "got '%s'",
                          name);
}

int visc_ssl_resolve(visc_train_config *c) {
    visc_ssl_config *s = &c->ssl;
    int moco = !strcmp(s->method, "mocov2"), simclr = !strcmp(s->method, "simclr");
    if (!moco && !simclr)
        return visc_set_error("--method: expected mocov2 or simclr, got '%s'", s->method);
    if (c->batch_size < 1) return visc_set_error("--batch-size must be >= 1");
    double B = c->batch_size;
    if (c->lr <= 0) {
        if (simclr) c->lr = (float)(0.075 * sqrt(B));
        else if (!strcmp(s->preset, "mocov2_resnet18_cifar10")) c->lr = (float)(0.06 * B / 128);
        else c->lr = (float)(0.03 * B / 256);
    }
    if (!c->opt[0]) snprintf(c->opt, sizeof c->opt, "%s", simclr ? "lars" : "sgd");
    if (c->weight_decay < 0) c->weight_decay = simclr ? 1e-6f : 1e-4f;
    /* the reference's cosine ends at 0.001 x the peak */
    if (c->min_lr < 0) c->min_lr = 0.001f * c->lr;
    if (c->warmup_epochs < 0) c->warmup_epochs = simclr ? 10 : 0;
    if (!c->aug[0]) snprintf(c->aug, sizeof c->aug, "%s", s->method);
    if (s->temperature <= 0) s->temperature = simclr ? 0.1f : 0.2f;
    if (s->bank_size <= 0) s->bank_size = 65536;
    if (s->proj_dim <= 0) s->proj_dim = 128;
    if (s->momentum <= 0) s->momentum = 0.999f;
    if (s->momentum >= 1) return visc_set_error("--moco-momentum must be below 1");
    return 0;
}

typedef struct {
    float loss, cls_loss;
    int top1, count;
} step_stats;

/* On a GPU, what a step reads back, in one copy once its losses are
 * queued: the contrastive loss (where it is computed there), the online
 * classifier's loss and its top-1 and top-5 counts. */
typedef struct {
    float loss, cls_loss;
    int32_t top1, top5;
} gpu_results;

/* Everything a step touches, allocated before the first one. */
typedef struct {
    const visc_train_config *c;
    int moco;
    visc_dist *dist;
    int rank, world;
    int B; /* this rank's samples per step */
    visc_dataset *train, *val;
    visc_transform_config recipe[2];
    visc_sample_pipeline pipeline[2];
    visc_loader *loader;
    visc_model *query, *key; /* key: MoCo */
    visc_proj_head head, key_head;
    visc_optimizer opt, head_opt;
    visc_schedule sched;
    visc_grad_sync *gsync, *head_gsync;
    visc_gpu_comm *comm;   /* the encoder's gradients on a GPU between the ranks */
    visc_memory_bank bank; /* MoCo */
    visc_ntxent ntx;       /* SimCLR */
    int shuffle_bn;        /* MoCo, several ranks, BatchNorm in the key encoder */
    float *z, *znorm, *dz, *kz, *knorm, *scratch, *gathered;
    float *probs, *dlogits, *kall;
    void *xall, *xk;                 /* shuffle-BN's images: floats, or bytes (byte_batches) */
    float *grad_acc, *head_grad_acc; /* MoCo --symmetric: the first pass's gradients */
    /* --device cuda: the encoders (both of MoCo's), the projection heads,
     * the embeddings' normalization, the losses (SimCLR's of one rank's
     * batch: a gathered one is on the host), the optimizer steps and the
     * momentum updates are on the GPU; the bank's master copy, which
     * checkpoints save, stays on the host */
    visc_cuda *gpu;
    /* --precision of the linear layers' products (the GPU always has
     * bf16; the host falls back to fp32 on a CPU without it) */
    visc_precision precision;
    size_t gpu_mem_base; /* device memory in use when the GPU was opened */
    visc_gpu_optim *gpu_opt, *head_gpu_opt;
    visc_gpu_pins pins; /* the loader's batch memory, page-locked */
    /* --symmetric on the GPU: the first pass's encoder and head gradients */
    float *dev_grad_acc, *dev_head_grad_acc;
    /* On the GPU: the embeddings z (rows x D), their norms and gradient;
     * the heads' input gradient (rows x features, the encoder's backward
     * reads it there); MoCo's keys (a set per view the step uses) and
     * their norms, its copy of the bank (every enqueue into the host's
     * bank is mirrored); the contrastive loss's work (InfoNCE's, or
     * NT-Xent's of one rank); the online classifier's labels,
     * probabilities and gradient; the step's numbers (gpu_results). The
     * encoders' input, features, logits and gradients stay there too
     * during a step (io_on_device). */
    struct {
        float *z, *znorm, *dz, *dfeat, *k, *knorm, *work, *bank, *probs, *dlogits;
        int32_t *labels;
        gpu_results *results;
    } dev;
    /* The loader delivers bytes (image data on a GPU): the batch crosses
     * the bus as such beside the previous step's kernels (stage), and each
     * view is normalized on the device into the encoder that reads it. */
    int byte_batches;
    visc_gpu_stage *stage;
    uint8_t *dev_batch; /* this step's batch on the device (both views) */
    uint8_t *dev_xk;    /* shuffle-BN: the key encoder's shuffled images */
    int32_t *labels;    /* this step's online classifier's labels (fill_labels) */
    int32_t *perm;
    step_stats *stats; /* this step's numbers */
    int64_t steps_per_epoch, total_steps;
    visc_train_state state;
    /* MoCo: the global step the key encoder was last advanced for (it
     * advances right after each optimizer step, for the step to come) */
    int64_t key_step;
    /* step hooks (a swarm): the state they see, and this batch's outcome */
    const visc_step_hooks *hooks;
    visc_state_view view;
    visc_train_access access;
    int hooks_started;
    int stepped;        /* the optimizer stepped on this batch */
    int64_t taken_step; /* ... as global step taken_step */
    float lr;           /* ... at this learning rate */
    FILE *log;
    visc_tb_writer *tb;
    char *config_text;
} pretrainer;

/* The online classifier's labels for the query encoder's batch into
 * p->labels: the batch's (MoCo), or each label twice (SimCLR: its two
 * views, view 0 first). Returns how many. */
static int fill_labels(pretrainer *p, const visc_batch *batch) {
    const size_t B = (size_t)p->B;
    memcpy(p->labels, batch->y, B * sizeof(int32_t));
    if (p->moco) return p->B;
    memcpy(p->labels + B, batch->y, B * sizeof(int32_t));
    return 2 * p->B;
}

/* The online classifier: cross-entropy of the backbone's classifier on
 * the (detached) features of the query encoder's batch, against
 * p->labels. Returns its gradient of the logits, where the model is; on a
 * GPU its loss and top-1 count stay there until read_results, and the
 * labels came with the batch (staged), or cross now. */
static const float *online_classifier(pretrainer *p, step_stats *st) {
    visc_model *q = p->query;
    const int K = q->cfg.num_classes, n = q->cfg.batch;
    st->count = n;
    if (p->gpu) {
        const int32_t *labels = p->dev.labels;
        if (p->stage) labels = visc_gpu_stage_labels(p->stage);
        else visc_gpu_upload(p->gpu, p->dev.labels, p->labels, (size_t)n * sizeof(int32_t));
        visc_gpu_softmax_xent(p->gpu, &p->dev.results->cls_loss, p->dev.probs, p->dev.dlogits,
                              q->dev_logits, labels, n, K, 0.0f);
        visc_gpu_topk_correct(p->gpu, &p->dev.results->top1, q->dev_logits, labels, n, K);
        return p->dev.dlogits;
    }
    int top5;
    st->cls_loss = visc_softmax_xent_forward(p->probs, q->logits, p->labels, n, K, 0.0f);
    visc_softmax_xent_backward(p->dlogits, p->probs, p->labels, n, K, 0.0f);
    visc_topk_correct(q->logits, p->labels, n, K, &st->top1, &top5);
    return p->dlogits;
}

/* On a GPU: the step's numbers queued so far, in one copy (the host waits
 * for the forward passes and the losses, not for backward). The online
 * classifier's go into st when it ran in this pass (st not NULL); returns
 * the contrastive loss. */
static float read_results(pretrainer *p, step_stats *st) {
    gpu_results r;
    visc_gpu_download(p->gpu, &r, p->dev.results, sizeof r);
    if (st) st->cls_loss = r.cls_loss, st->top1 = r.top1;
    return r.loss;
}

/* On a GPU the encoders take their input and gradients from device memory
 * and leave features and logits there, during a step (evaluation feeds
 * them the host's). */
static void io_on_device(pretrainer *p, int on) {
    if (!p->gpu) return;
    p->query->io_on_device = on;
    if (p->key) p->key->io_on_device = on;
}

static int hooks_after_backward(pretrainer *p, float loss, int64_t *step);

/* Gradients of the query side are final: average them over the ranks and
 * update, at the learning rate of the global step. With step hooks the
 * hooks decide whether this batch steps, and with which gradient. */
static int update(pretrainer *p, float loss) {
    if (p->gsync) { /* the head's gradients cross the ranks through host memory */
        if (visc_grad_sync_finish(p->gsync)) return -1;
        visc_proj_head_download_grads(&p->head);
        if (visc_grad_sync_finish(p->head_gsync)) return -1;
        visc_proj_head_upload_grads(&p->head);
    }
    int64_t step = p->state.step;
    if (p->hooks) {
        int go = hooks_after_backward(p, loss, &step);
        if (go <= 0) return go;
    }
    float lr = visc_schedule_lr(&p->sched, step);
    p->stepped = 1, p->taken_step = step, p->lr = lr;
    if (p->c->clip_grad > 0) {
        const visc_model *q = p->query;
        if (p->gpu) visc_gpu_clip_grad_norm(p->gpu, q->dev_grads, q->params.total, p->c->clip_grad);
        else visc_clip_grad_norm(q->grads, q->params.total, p->c->clip_grad);
    }
    visc_model *q = p->query;
    visc_proj_head *h = &p->head;
    if (p->gpu) {
        if (visc_gpu_optim_step(p->gpu_opt, &p->opt, q->dev_params, q->dev_grads, lr) ||
            visc_gpu_optim_step(p->head_gpu_opt, &p->head_opt, h->dev_params, h->dev_grads, lr))
            return -1;
    } else {
        visc_optimizer_step(&p->opt, q->params.data, q->grads, lr);
        visc_optimizer_step(&p->head_opt, h->params.data, h->grads, lr);
    }
    return 0;
}

/* Images of the batch as model m's input: `views` view blocks from view
 * `view` on (B images each). The host's floats; on a GPU, m's input
 * buffer there (which forward then takes as it is), into which the bytes
 * already on the device are normalized (byte batches) or the host's
 * floats copied. */
static const float *batch_input(pretrainer *p, visc_model *m, const visc_batch *batch, int view,
                                int views) {
    const size_t img = (size_t)m->cfg.in_channels * m->cfg.image_size * m->cfg.image_size;
    const size_t at = (size_t)view * p->B * img, images = (size_t)views * p->B;
    if (!p->gpu) return batch->x + at;
    if (p->dev_batch)
        visc_gpu_normalize_bytes(p->gpu, m->input, p->dev_batch + at, images, img / 3,
                                 p->train->byte_mean, p->train->byte_std);
    else visc_gpu_upload(p->gpu, m->input, batch->x + at, images * img * sizeof(float));
    return m->input;
}

/* Head h's embeddings of encoder m's features (m's batch of them),
 * normalized, into z and their norms into norms: where h computes
 * (device pointers on the GPU). */
static void embed(visc_proj_head *h, const visc_model *m, float *z, float *norms) {
    visc_proj_head_forward(h, h->cuda ? m->dev_features : m->features, 1);
    if (h->cuda) visc_gpu_l2_normalize_forward(h->cuda, z, norms, h->output, h->batch, h->out);
    else visc_l2_normalize_forward(z, norms, h->output, h->batch, h->out);
}

/* Backward of embed for the query side: from dz (the loss's gradient of
 * the embeddings z, weighted by `weight`; overwritten) through the
 * normalization and the head (its gradients) into the query encoder's
 * (with the online classifier's, dlogits, when given), all where the
 * model is. */
static void embed_backward(pretrainer *p, float *dz, const float *z, const float *norms,
                           float weight, const float *dlogits) {
    visc_proj_head *h = &p->head;
    const int rows = h->batch, D = h->out;
    float *dfeat = p->scratch;
    if (h->cuda) {
        dfeat = p->dev.dfeat;
        visc_gpu_l2_normalize_backward(p->gpu, dz, dz, z, norms, rows, D, weight);
    } else {
        for (size_t i = 0; weight != 1.0f && i < (size_t)rows * D; i++) dz[i] *= weight;
        visc_l2_normalize_backward(dz, dz, z, norms, rows, D);
    }
    visc_proj_head_backward(h, dz, dfeat);
    p->query->backward_features(p->query, dfeat, dlogits);
}

/* MoCo's keys for this rank's images of view `view`, normalized, into
 * key set `view` (of p->kz, and of the GPU's keys there).
 * With shuffle-BN the key encoder sees a batch drawn across all ranks
 * (the same permutation everywhere, from the seed and step), so that its
 * BatchNorm statistics cannot tell which keys belong to which queries;
 * byte batches are shuffled as bytes (a quarter of the floats). */
static int moco_keys(pretrainer *p, const visc_batch *batch, int view) {
    visc_model *k = p->key;
    const int B = p->B, D = p->head.out;
    const size_t set = (size_t)view * B * D, bytes_z = (size_t)B * D * sizeof(float);
    float *kz = p->kz + set;
    const size_t img = (size_t)k->cfg.in_channels * k->cfg.image_size * k->cfg.image_size;
    const float *in;
    if (p->shuffle_bn) {
        const size_t elem = p->byte_batches ? 1 : sizeof(float), bytes = img * elem;
        const char *x = p->byte_batches ? (const char *)(batch->x8 + (size_t)view * B * img)
                                        : (const char *)(batch->x + (size_t)view * B * img);
        if (visc_dist_allgather(p->dist, x, p->xall, (size_t)B * bytes)) return -1;
        visc_rng_permutation(p->perm, B * p->world, p->c->seed, VISC_STREAM_SSL,
                             2 * (uint64_t)p->state.step + (uint64_t)view);
        for (int i = 0; i < B; i++)
            memcpy((char *)p->xk + (size_t)i * bytes,
                   (const char *)p->xall + (size_t)p->perm[p->rank * B + i] * bytes, bytes);
        in = p->xk;
        if (p->byte_batches) {
            visc_gpu_upload(p->gpu, p->dev_xk, p->xk, (size_t)B * img);
            visc_gpu_normalize_bytes(p->gpu, k->input, p->dev_xk, (size_t)B, img / 3,
                                     p->train->byte_mean, p->train->byte_std);
            in = k->input;
        } else if (p->gpu) {
            visc_gpu_upload(p->gpu, k->input, p->xk, bytes * B);
            in = k->input;
        }
    } else {
        in = batch_input(p, k, batch, view, 1);
    }
    k->forward(k, in, 1);
    if (!p->gpu) {
        embed(&p->key_head, k, kz, p->knorm);
    } else { /* the bank's and shuffle-BN's copy on the host */
        embed(&p->key_head, k, p->dev.k + set, p->dev.knorm);
        visc_gpu_download(p->gpu, kz, p->dev.k + set, bytes_z);
    }
    if (p->shuffle_bn) {
        /* every rank's shuffled keys, then each rank takes back its own */
        if (visc_dist_allgather(p->dist, kz, p->kall, (size_t)B * D * sizeof(float))) return -1;
        for (int j = 0; j < B * p->world; j++) {
            int g = p->perm[j] - p->rank * B;
            if (g >= 0 && g < B)
                memcpy(kz + (size_t)g * D, p->kall + (size_t)j * D, (size_t)D * sizeof(float));
        }
        if (p->gpu) visc_gpu_upload(p->gpu, p->dev.k + set, kz, bytes_z);
    }
    return 0;
}

/* The bank's rows [from, from + n) (modulo its size) copied to the GPU's
 * bank: what an enqueue of n keys at row `from` changed. */
static void mirror_bank(pretrainer *p, int64_t from, int64_t n) {
    const visc_memory_bank *mb = &p->bank;
    const size_t row = (size_t)mb->dim * sizeof(float);
    if (n >= mb->size) from = 0, n = mb->size;
    int64_t first = mb->size - from < n ? mb->size - from : n;
    visc_gpu_upload(p->gpu, p->dev.bank + (size_t)from * mb->dim, mb->bank + (size_t)from * mb->dim,
                    (size_t)first * row);
    if (n > first) visc_gpu_upload(p->gpu, p->dev.bank, mb->bank, (size_t)(n - first) * row);
}

/* The query side of one pair: queries from the view's images, InfoNCE
 * against key set `keys` and the bank as it was before this step (the
 * queries' gradient into dz; on a GPU there, with the loss), and backward
 * with the loss weighted by `weight` into the query encoder's and head's
 * gradients. The online classifier trains along when with_cls is set.
 * Returns the (unweighted) loss. */
static float moco_query_pass(pretrainer *p, const visc_batch *batch, int view, int keys,
                             float weight, int with_cls) {
    visc_model *q = p->query;
    const int B = p->B, D = p->head.out;
    const size_t set = (size_t)keys * B * D;
    const float t = p->c->ssl.temperature;
    float *z = p->gpu ? p->dev.z : p->z, *norms = p->gpu ? p->dev.znorm : p->znorm;
    float *dz = p->gpu ? p->dev.dz : p->dz;
    q->forward(q, batch_input(p, q, batch, view, 1), 1);
    embed(&p->head, q, z, norms);
    const float *dlogits = with_cls ? online_classifier(p, p->stats) : NULL;
    float loss;
    if (p->gpu) {
        visc_gpu_infonce(p->gpu, &p->dev.results->loss, dz, z, p->dev.k + set, p->dev.bank, B,
                         (int)p->bank.size, D, t, p->dev.work);
        loss = read_results(p, with_cls ? p->stats : NULL);
    } else {
        loss = visc_infonce_forward_backward(dz, z, p->kz + set, &p->bank, B, t, p->scratch);
    }
    embed_backward(p, dz, z, norms, weight, dlogits);
    return loss;
}

/* --symmetric: the first pass's gradients (encoder and head) kept aside,
 * then added to the second's. */
static void keep_grads(pretrainer *p) {
    visc_model *q = p->query;
    visc_proj_head *h = &p->head;
    if (p->gpu) {
        visc_gpu_copy(p->gpu, p->dev_grad_acc, q->dev_grads, q->params.total);
        visc_gpu_copy(p->gpu, p->dev_head_grad_acc, h->dev_grads, h->params.total);
    } else {
        memcpy(p->grad_acc, q->grads, q->params.total * sizeof(float));
        memcpy(p->head_grad_acc, h->grads, h->params.total * sizeof(float));
    }
}

static void add_kept_grads(pretrainer *p) {
    visc_model *q = p->query;
    visc_proj_head *h = &p->head;
    if (p->gpu) {
        visc_gpu_add(p->gpu, q->dev_grads, q->dev_grads, p->dev_grad_acc, q->params.total);
        visc_gpu_add(p->gpu, h->dev_grads, h->dev_grads, p->dev_head_grad_acc, h->params.total);
    } else {
        visc_add_inplace(q->grads, p->grad_acc, q->params.total);
        visc_add_inplace(h->grads, p->head_grad_acc, h->params.total);
    }
}

/* One MoCo v2 step. Asymmetric (the default, as the reference): queries
 * from view 1, keys from view 0 through the momentum encoder. Symmetric
 * (--symmetric): the mean of that loss and the one with the views swapped,
 * both against the same bank; the keys of both views go into the bank
 * once, after both losses (never one pair's keys as the other's
 * negatives). The bank moves on only after the step (after every batch
 * when the step hooks accumulate batches). The momentum encoder was
 * advanced for this step after the previous one (advance_key). */
static int moco_step(pretrainer *p, const visc_batch *batch, step_stats *st) {
    const visc_train_config *c = p->c;
    const int B = p->B;
    const int symmetric = c->ssl.symmetric;

    if (moco_keys(p, batch, 0)) return -1;
    if (symmetric && moco_keys(p, batch, 1)) return -1;

    p->stats = st;
    if (p->gsync) {
        visc_grad_sync_begin(p->head_gsync);
        visc_grad_sync_begin(p->gsync);
    }
    if (!symmetric) {
        st->loss = moco_query_pass(p, batch, 1, 0, 1.0f, 1);
    } else {
        /* two backward passes: the first one's gradients are kept aside
         * (no bucket is all-reduced during them: see setup) */
        float a = moco_query_pass(p, batch, 1, 0, 0.5f, 1);
        keep_grads(p);
        float b = moco_query_pass(p, batch, 0, 1, 0.5f, 0);
        add_kept_grads(p);
        st->loss = 0.5f * (a + b);
    }
    if (update(p, st->loss)) return -1;
    const int64_t at = p->bank.ptr, keys = symmetric ? 2 * B : B;
    visc_dist *gather = c->ssl.no_gather ? NULL : p->dist;
    if (visc_memory_bank_enqueue_gathered(&p->bank, gather, p->kz, keys, p->gathered)) return -1;
    if (p->gpu) mirror_bank(p, at, keys * visc_dist_world(gather));
    return 0;
}

/* One SimCLR step: both views through one forward (the reference
 * concatenates them, so BatchNorm sees 2B samples), NT-Xent over the
 * views of all ranks. On a GPU the loss runs there, only the step's
 * numbers crossing the bus; gathered, the embeddings and their gradients
 * cross between the GPUs (the run's GPU all-reduce: NCCL, or host memory). */
static int simclr_step(pretrainer *p, const visc_batch *batch, step_stats *st) {
    const visc_train_config *c = p->c;
    visc_model *q = p->query;
    const int B = p->B, D = p->head.out;
    float *z = p->gpu ? p->dev.z : p->z, *norms = p->gpu ? p->dev.znorm : p->znorm;
    float *dz = p->gpu ? p->dev.dz : p->dz;

    q->forward(q, batch_input(p, q, batch, 0, 2), 1);
    embed(&p->head, q, z, norms);
    const float *dlogits = online_classifier(p, st);

    if (p->gpu) {
        if (visc_gpu_ntxent(p->gpu, p->comm, p->ntx.world, p->ntx.rank, &p->dev.results->loss, dz,
                            z, B, D, c->ssl.temperature, p->dev.work))
            return -1;
        st->loss = read_results(p, st);
    } else {
        st->loss = visc_ntxent_forward_backward(&p->ntx, c->ssl.no_gather ? NULL : p->dist, z,
                                                z + (size_t)B * D, c->ssl.temperature, dz,
                                                dz + (size_t)B * D);
        if (!isfinite(st->loss) && visc_dist_broken(p->dist)) return -1;
    }

    if (p->gsync) {
        visc_grad_sync_begin(p->head_gsync);
        visc_grad_sync_begin(p->gsync);
    }
    embed_backward(p, dz, z, norms, 1.0f, dlogits);
    return update(p, st->loss);
}

static void log_json(pretrainer *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_json(pretrainer *p, const char *fmt, ...) {
    if (!p->log) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->log, fmt, ap);
    va_end(ap);
    fputc('\n', p->log);
    fflush(p->log);
}

static visc_ssl_parts parts_of(pretrainer *p) {
    visc_ssl_parts s = {.query = p->query,
                        .key = p->key,
                        .head = &p->head,
                        .key_head = p->moco ? &p->key_head : NULL,
                        .opt = &p->opt,
                        .head_opt = &p->head_opt,
                        .bank = p->moco ? &p->bank : NULL,
                        .state = &p->state,
                        .key_step = p->moco ? &p->key_step : NULL,
                        .method = p->c->ssl.method};
    return s;
}

/* MoCo: the momentum encoder and head follow the query side, once per
 * global optimizer step, with the momentum of the step to come. */
static void advance_key(pretrainer *p) {
    if (!p->moco) return;
    const visc_ssl_config *s = &p->c->ssl;
    float m = visc_momentum_at(s->momentum, s->momentum_cosine, p->state.step, p->total_steps);
    const size_t n = p->query->params.total, nh = p->head.params.total;
    if (p->gpu) {
        visc_gpu_ema_update(p->gpu, p->key->dev_params, p->query->dev_params, n, m);
        visc_gpu_ema_update(p->gpu, p->key_head.dev_params, p->head.dev_params, nh, m);
    } else {
        visc_ema_update(p->key->params.data, p->query->params.data, n, m);
        visc_ema_update(p->key_head.params.data, p->head.params.data, nh, m);
    }
    p->key_step = p->state.step;
}

/* ---- step hooks (`visc pretrain --swarm`) ----
 * The hooks see the pretrainer's state as one model (state_view.h):
 *   parameters  the query encoder (its online classifier included) and
 *               the projection head, with their optimizers' state: what
 *               the swarm's averaged gradient trains;
 *   buffers     their BatchNorm statistics and, for MoCo, the momentum
 *               encoder's and head's (averaged with the rest in every
 *               round); when the hooks average parameters (parameter
 *               mode) also the momentum encoder and head themselves;
 *   EMA         (MoCo, gradient mode) the momentum encoder and head: the
 *               state blob's EMA slot, which newcomers download and no
 *               round averages (every peer computes the same values from
 *               the same query weights: no rounding drift, no
 *               compression).
 * So every peer at one global step holds the same state: the momentum
 * encoder advances once per global optimizer step (advance_key, right
 * after the step and before the hooks publish the state), never per local
 * batch; the LR and momentum schedules run on the global step, over the
 * hooks' steps per epoch (dataset size / target batch); the temperature
 * is constant. The memory bank of negatives is each peer's own and not
 * part of the state: it is refilled by the peer's own keys, one batch of
 * them per local batch (stepped or not), and a newcomer keeps its own.
 * The online classifier is part of the query encoder: it trains on the
 * swarm's gradient like the rest. Per peer too: the data cursor and the
 * BatchNorm update counters. */

static int setup_schedule(pretrainer *p, int64_t steps_per_epoch);

static int hooks_start(pretrainer *p) {
    visc_state_view *v = &p->view;
    v->trained[0] = (visc_view_trained){&p->query->params, p->query->grads, &p->opt};
    v->trained[1] = (visc_view_trained){&p->head.params, p->head.grads, &p->head_opt};
    v->n_trained = 2;
    int nb = 0, carry_key = p->hooks->averages_parameters;
    v->buffers[nb++] = (visc_view_part){&p->query->buffers, ""};
    v->buffers[nb++] = (visc_view_part){&p->head.buffers, ""};
    if (p->moco) {
        if (carry_key) {
            v->buffers[nb++] = (visc_view_part){&p->key->params, "momentum_encoder."};
            v->buffers[nb++] = (visc_view_part){&p->key_head.params, "momentum_"};
        } else {
            v->ema[0] = &p->key->params;
            v->ema[1] = &p->key_head.params;
            v->n_ema = 2;
        }
        v->buffers[nb++] = (visc_view_part){&p->key->buffers, "momentum_encoder."};
        v->buffers[nb++] = (visc_view_part){&p->key_head.buffers, "momentum_"};
    }
    v->n_buffers = nb;
    if (visc_state_view_build(v)) return -1;
    p->access = (visc_train_access){.model = &v->model,
                                    .opt = &v->opt,
                                    .state = &p->state,
                                    .ema_params = v->ema_params,
                                    .ema_buffers = v->ema_buffers,
                                    .train_size = p->train->size,
                                    .batch_size = p->B,
                                    .max_steps = p->c->max_steps,
                                    /* no save / load: the loop writes its
                                     * checkpoints (the bank in them) */
                                    .trainer = p};
    int64_t steps_per_epoch = 0;
    p->hooks_started = 1;
    int rc = p->hooks->start(p->hooks->ctx, &p->access, &steps_per_epoch);
    visc_state_view_push(v);
    /* a downloaded state's momentum encoder is its donor's, advanced for
     * the step it holds */
    p->key_step = p->state.step;
    if (rc) return -1;
    return steps_per_epoch > 0 ? setup_schedule(p, steps_per_epoch) : 0;
}

/* The hooks' verdict on this batch (update), the view in step around it. */
static int hooks_after_backward(pretrainer *p, float loss, int64_t *step) {
    visc_state_view_pull(&p->view);
    int go = p->hooks->after_backward(p->hooks->ctx, p->B, loss, step);
    visc_state_view_push(&p->view);
    p->key_step = p->state.step; /* a download may have replaced the state */
    return go;
}

static int hooks_after_step(pretrainer *p) {
    if (!p->hooks || !p->hooks->after_step) return 0;
    visc_state_view_pull(&p->view);
    int rc = p->hooks->after_step(p->hooks->ctx);
    visc_state_view_push(&p->view);
    p->key_step = p->state.step;
    return rc;
}

/* The query encoder's BatchNorm statistics are per rank: rank 0's become
 * everybody's (on a GPU, through host memory). */
static int share_bn_stats(pretrainer *p) {
    visc_model *q = p->query;
    if (p->world == 1 || q->buffers.total == 0) return 0;
    return visc_gpu_broadcast(p->dist, p->gpu, q->buffers.data, p->gpu ? q->dev_buffers : NULL,
                              q->buffers.total * sizeof(float));
}

/* Rank 0 writes the checkpoint and the query encoder's model files, after
 * collecting the ranks' loader cursors; every rank learns the outcome. */
static int save_all(pretrainer *p, int is_best) {
    p->state.world = p->world;
    if (p->world > 1 && p->world <= VISC_MAX_SAVED_RANKS &&
        visc_dist_allgather(p->dist, &p->state.sample_pos, p->state.rank_pos, sizeof(int64_t)))
        return -1;
    /* BatchNorm statistics: rank 0's are the model's (as in visc train) */
    if (share_bn_stats(p)) return -1;
    /* on the GPU: the encoders, heads and optimizers' state come back first */
    if (p->gpu) {
        if (visc_model_download(p->query) || (p->key && visc_model_download(p->key)) ||
            visc_gpu_optim_download(p->gpu_opt, &p->opt) ||
            visc_gpu_optim_download(p->head_gpu_opt, &p->head_opt))
            return -1;
        visc_proj_head_download(&p->head);
        if (p->key) visc_proj_head_download(&p->key_head);
    }
    int64_t failed = 0;
    if (p->rank == 0) {
        char path[1100];
        visc_ssl_parts parts = parts_of(p);
        snprintf(path, sizeof path, "%s/checkpoint_last.safetensors", p->c->output);
        failed = visc_ssl_save_checkpoint(&parts, p->config_text, path) != 0;
        snprintf(path, sizeof path, "%s/model_last.safetensors", p->c->output);
        if (!failed) failed = visc_save_model(p->query, path, NULL) != 0;
        snprintf(path, sizeof path, "%s/model_best.safetensors", p->c->output);
        if (!failed && is_best) failed = visc_save_model(p->query, path, NULL) != 0;
    }
    if (p->world == 1) return failed ? -1 : 0;
    char why[512];
    snprintf(why, sizeof why, "%s", failed ? visc_last_error() : "");
    if (visc_dist_allreduce(p->dist, &failed, 1, VISC_DT_I64, VISC_OP_MAX)) return -1;
    if (failed)
        return visc_set_error("%s", p->rank == 0 ? why : "rank 0 could not save the checkpoint");
    return 0;
}

/* Stopped by a signal (stop_signal.c): as --max-steps, then one line on
 * how to go on. */
static int stop_for_signal(pretrainer *p, visc_progress *bar, int sig) {
    char why[64];
    snprintf(why, sizeof why, "stopped by %s", visc_signal_name(sig));
    visc_progress_end(bar, why);
    if (save_all(p, 0)) return -1;
    visc_stop_signal_obeyed(sig, (long long)p->state.step, p->c->output, p->rank);
    return 1;
}

static int run_epochs(pretrainer *p) {
    const visc_train_config *c = p->c;
    double best_top5 = 0;
    visc_stop_signals_install(); /* as the trainer's run_epochs */
    while (p->state.epoch < c->epochs) {
        int64_t epoch = p->state.epoch;
        int64_t pos = p->state.step_in_epoch > 0 ? p->state.sample_pos : -1;
        if (visc_loader_start(p->loader, epoch, p->state.step_in_epoch, pos)) return -1;
        visc_progress bar;
        char label[64];
        snprintf(label, sizeof label, "epoch %lld/%d", (long long)epoch + 1, c->epochs);
        visc_progress_begin(&bar, label, p->steps_per_epoch, !c->no_progress);
        if (p->rank != 0) bar.out = NULL;
        double sums[5] = {0}, t0 = visc_now(), window_t0 = t0; /* loss, cls, top1, n, steps */
        int64_t window = 0;
        for (int64_t i = p->state.step_in_epoch; i < p->steps_per_epoch; i++) {
            /* already there (a resumed or downloaded state): not one batch more */
            if (c->max_steps > 0 && p->state.step >= c->max_steps) {
                visc_progress_end(&bar, "stopped at --max-steps");
                return save_all(p, 0) ? -1 : 1;
            }
            visc_batch batch;
            int got = visc_loader_next(p->loader, &batch);
            if (got < 0) return -1;
            if (got == 0) break;
            /* a batch the bad-image skips left short cannot form all pairs */
            if (batch.count < p->B) continue;
            float lr = visc_schedule_lr(&p->sched, p->state.step);
            uint32_t key[4];
            visc_philox4x32(c->seed, VISC_STREAM_DROPOUT, (uint64_t)p->state.step, key);
            p->query->noise_seed = (uint64_t)key[0] << 32 | key[1];
            step_stats st;
            p->stepped = 0;
            /* byte batches cross beside the previous step's kernels, with
             * the online classifier's labels */
            const int rows = fill_labels(p, &batch);
            if (p->stage) p->dev_batch = visc_gpu_stage_put(p->stage, batch.x8, p->labels, rows);
            io_on_device(p, 1);
            int rc = p->moco ? moco_step(p, &batch, &st) : simclr_step(p, &batch, &st);
            io_on_device(p, 0);
            /* the step is queued: the loader may have the batch's memory back */
            if (rc || (p->stage && visc_gpu_stage_end(p->stage))) return -1;
            if (!isfinite(st.loss))
                return visc_set_error("loss is %s at step %lld: pretraining diverged; lower --lr",
                                      isnan(st.loss) ? "NaN" : "infinite",
                                      (long long)p->state.step);
            if (p->stepped) {
                lr = p->lr;
                p->state.step = p->taken_step + 1;
                advance_key(p);
                if (hooks_after_step(p)) return -1;
            }
            p->state.step_in_epoch = i + 1;
            p->state.sample_pos = batch.next_pos;
            sums[0] += st.loss, sums[1] += st.cls_loss, sums[2] += st.top1, sums[3] += st.count;
            sums[4] += 1;
            window += p->B;
            int64_t done = i + 1;
            if ((c->print_freq > 0 && done % c->print_freq == 0) || done == p->steps_per_epoch) {
                double job[5];
                memcpy(job, sums, sizeof job);
                if (p->world > 1 && visc_dist_allreduce(p->dist, job, 5, VISC_DT_F64, VISC_OP_SUM))
                    return -1;
                double now = visc_now(), ips = (double)window * p->world / (now - window_t0);
                double loss = job[0] / job[4], cls = job[1] / job[4], acc = 100 * job[2] / job[3];
                char stats[200];
                snprintf(stats, sizeof stats,
                         "loss %.4f online-cls loss %.4f acc %.2f%% lr %.4g %.0f img/s", loss, cls,
                         acc, lr, ips);
                visc_progress_update(&bar, done, stats);
                log_json(p,
                         "{\"type\":\"train\",\"epoch\":%lld,\"step\":%lld,\"loss\":%.6f,"
                         "\"online_cls_loss\":%.6f,\"top1\":%.4f,\"lr\":%.6g,\"img_per_s\":%.1f}",
                         (long long)epoch + 1, (long long)p->state.step, loss, cls, acc, lr, ips);
                if (p->tb) {
                    visc_tb_scalar(p->tb, "train/loss", p->state.step, (float)loss);
                    visc_tb_scalar(p->tb, "train/online_cls_loss", p->state.step, (float)cls);
                    visc_tb_scalar(p->tb, "train/lr", p->state.step, lr);
                }
                window_t0 = now;
                window = 0;
            }
            if (c->max_steps > 0 && p->state.step >= c->max_steps) {
                visc_progress_end(&bar, "stopped at --max-steps");
                return save_all(p, 0) ? -1 : 1;
            }
            if (p->hooks && p->hooks->should_stop && p->hooks->should_stop(p->hooks->ctx)) {
                visc_progress_end(&bar, "stopped by the swarm");
                return save_all(p, 0) ? -1 : 1;
            }
            int sig;
            if (visc_dist_stop_signal(p->dist, &sig)) return -1;
            if (sig) return stop_for_signal(p, &bar, sig);
        }
        double train_time = visc_now() - t0;
        /* the online classifier on the validation set (rank 0's BN statistics) */
        if (share_bn_stats(p)) return -1;
        visc_eval_result r;
        if (visc_evaluate_shard(p->query, p->val, NULL, 0.0f, p->dist, &r)) return -1;
        p->state.epoch++;
        p->state.step_in_epoch = 0;
        int is_best = r.top1 > p->state.best_top1;
        if (is_best) p->state.best_top1 = r.top1;
        if (r.top5 > best_top5) best_top5 = r.top5;
        char summary[256];
        snprintf(summary, sizeof summary,
                 "loss %.4f | online classifier val top1 %.2f%% top5 %.2f%% (max %.2f%%) | %.0fs",
                 sums[4] > 0 ? sums[0] / sums[4] : 0.0, r.top1, r.top5, p->state.best_top1,
                 train_time);
        visc_progress_end(&bar, summary);
        log_json(p,
                 "{\"type\":\"val\",\"epoch\":%lld,\"step\":%lld,\"val_online_cls_top1\":%.4f,"
                 "\"val_online_cls_top5\":%.4f,\"val_online_cls_top1_max\":%.4f,\"loss\":%.6f,"
                 "\"top1\":%.4f,\"top5\":%.4f,\"epoch_time_s\":%.2f}",
                 (long long)p->state.epoch, (long long)p->state.step, r.top1, r.top5,
                 p->state.best_top1, r.loss, r.top1, r.top5, train_time);
        if (p->tb) {
            visc_tb_scalar(p->tb, "val/online_cls_top1", p->state.epoch, (float)r.top1);
            visc_tb_scalar(p->tb, "val/online_cls_top5", p->state.epoch, (float)r.top5);
            visc_tb_flush(p->tb);
        }
        if (save_all(p, is_best)) return -1;
    }
    return 0;
}

static void bn_sync_allreduce(void *ctx, double *buf, int n) {
    visc_dist_allreduce(ctx, buf, (size_t)n, VISC_DT_F64, VISC_OP_SUM);
}

/* The query encoder, and for MoCo its momentum copy. */
static int make_encoders(pretrainer *p, int for_gpu) {
    const visc_train_config *c = p->c;
    visc_model_config mc = c->model;
    mc.for_gpu = for_gpu;
    mc.num_classes = mc.num_classes > 0 ? mc.num_classes : p->train->num_classes;
    mc.in_channels = p->train->channels;
    mc.image_size = p->train->height;
    mc.batch = p->moco ? p->B : 2 * p->B;
    p->query = visc_model_create(&mc, c->seed);
    if (!p->query) return -1;
    visc_model *q = p->query;
    if (!q->backward_features)
        return visc_set_error("%s cannot be pretrained (no feature backward)", mc.arch);
    if (c->weights[0] && visc_load_model(q, c->weights)) return -1;
    /* the online classifier trains without weight decay */
    const char *hp = q->head_prefix;
    for (int i = 0; i < q->params.count; i++)
        if (!strncmp(q->params.entries[i].name, hp, strlen(hp)))
            q->params.entries[i].flags |= VISC_TENSOR_NO_DECAY;
    int F = q->feature_dim, hidden = c->ssl.proj_hidden > 0 ? c->ssl.proj_hidden : F;
    visc_proj_head_init(&p->head, "projection_head.", F, hidden, c->ssl.proj_dim, mc.batch,
                        !p->moco, c->seed);
    if (!p->moco) return 0;
    mc.batch = p->B;
    /* the momentum encoder never runs backward: activations for one
     * forward at a time (ResNet-50 at batch 256: a third of a training
     * plan's, model.h) and no gradient checkpointing to plan */
    mc.forward_only = 1;
    mc.grad_checkpointing = 0;
    p->key = visc_model_create(&mc, c->seed);
    if (!p->key) return -1;
    memcpy(p->key->params.data, q->params.data, q->params.total * sizeof(float));
    memcpy(p->key->buffers.data, q->buffers.data, q->buffers.total * sizeof(float));
    /* the key head: a copy (original MoCo), or fresh as the reference library */
    visc_proj_head_init(&p->key_head, "projection_head.", F, hidden, c->ssl.proj_dim, p->B, 0,
                        c->ssl.fresh_key_head ? c->seed + 1 : c->seed);
    p->shuffle_bn = p->world > 1 && q->set_bn_sync && !c->sync_bn;
    return 0;
}

/* The LR schedule and the momentum schedule's length over epochs of
 * steps_per_epoch optimizer steps (the loader's batches, or the hooks'). */
static int setup_schedule(pretrainer *p, int64_t steps_per_epoch) {
    const visc_train_config *c = p->c;
    p->total_steps = steps_per_epoch * c->epochs;
    visc_schedule *s = &p->sched;
    memset(s, 0, sizeof *s);
    if (visc_sched_parse_kind(c->sched, &s->kind)) return -1;
    s->base_lr = c->lr;
    s->min_lr = c->min_lr;
    s->total_steps = p->total_steps;
    s->warmup_steps = (int64_t)llround(c->warmup_epochs * (double)steps_per_epoch);
    s->warmup_start = c->warmup_start;
    s->gamma = c->lr_gamma;
    s->step_size = (int64_t)c->lr_step_epochs * steps_per_epoch;
    return 0;
}

static int setup(pretrainer *p) {
    const visc_train_config *c = p->c;
    int gpu_index; /* checked now; the GPU is opened once the encoders are ready */
    if (visc_parse_device(c->device, &gpu_index)) return -1;
    if (!visc_is_image_data(c->data_dir))
        return visc_set_error("visc pretrain needs image data: --data imagefolder:DIR, "
                              "imagenet:DIR, flat:DIR or pack:DIR");
    int size = c->model.image_size > 0 ? c->model.image_size : 224;
    p->train = visc_open_image_data(c, 1, size, &p->recipe[0], &p->pipeline[0]);
    if (!p->train) return -1;
    if (p->train->views != 2)
        return visc_set_error("--aug %s gives %d view(s) per image; pretraining needs two "
                              "(mocov2 or simclr)",
                              c->aug, p->train->views);
    p->val = visc_open_image_data(c, 0, size, &p->recipe[1], &p->pipeline[1]);
    if (!p->val) return -1;
    visc_loader_config lc = {.batch_size = p->B,
                             .workers = c->workers,
                             .shuffle = 1,
                             .drop_last = 1,
                             .train = 1,
                             /* alone: the data shard the hooks' caller chose */
                             .rank = p->world == 1 && c->shard_count > 0 ? c->shard_index : p->rank,
                             .world =
                                 p->world == 1 && c->shard_count > 0 ? c->shard_count : p->world,
                             .seed = c->seed,
                             .on_bad = strcmp(c->on_bad_image, "error") ? VISC_ON_BAD_SKIP
                                                                        : VISC_ON_BAD_ERROR};
    /* On a GPU the views cross the bus as bytes, a quarter of the floats
     * (the recipes of pretraining have a byte form: they do not erase). */
    p->byte_batches = lc.bytes = gpu_index >= 0 && p->train->get_bytes && p->train->channels == 3;
    p->loader = visc_loader_new(p->train, &lc);
    if (!p->loader) return -1;
    p->steps_per_epoch = visc_loader_batches(p->loader);
    if (p->steps_per_epoch < 1)
        return visc_set_error("--batch-size %d is larger than the training set (%lld images)",
                              c->batch_size, (long long)p->train->size);
    if (make_encoders(p, gpu_index >= 0)) return -1;
    visc_model *q = p->query;

    visc_opt_kind kind;
    if (visc_opt_parse_kind(c->opt, &kind)) return -1;
    visc_opt_config oc = visc_opt_defaults(kind);
    if (kind == VISC_OPT_SGD || kind == VISC_OPT_LARS) {
        oc.momentum = c->momentum;
        oc.nesterov = c->nesterov;
    }
    oc.weight_decay = c->weight_decay;
    oc.decay_norm_and_bias = c->decay_norm_and_bias;
    visc_optimizer_init(&p->opt, &oc, &q->params);
    visc_optimizer_init(&p->head_opt, &oc, &p->head.params);
    if (setup_schedule(p, p->steps_per_epoch)) return -1;

    const int B = p->B, D = c->ssl.proj_dim, rows = p->moco ? B : 2 * B;
    const int K = q->cfg.num_classes;
    const size_t img = (size_t)q->cfg.in_channels * q->cfg.image_size * q->cfg.image_size;
    p->z = visc_alloc_aligned((size_t)rows * D * sizeof(float), "embeddings");
    p->znorm = visc_alloc_aligned((size_t)rows * sizeof(float), "embedding norms");
    p->dz = visc_alloc_aligned((size_t)rows * D * sizeof(float), "embedding gradients");
    p->probs = visc_alloc_aligned((size_t)rows * K * sizeof(float), "online classifier");
    p->dlogits = visc_alloc_aligned((size_t)rows * K * sizeof(float), "online classifier");
    p->labels = visc_calloc((size_t)rows, sizeof(int32_t), "labels");
    size_t scratch = (size_t)rows * q->feature_dim;
    if (p->moco) {
        visc_memory_bank_init(&p->bank, c->ssl.bank_size, D, c->seed);
        int sets = c->ssl.symmetric ? 2 : 1; /* key sets per step */
        p->kz = visc_alloc_aligned((size_t)sets * B * D * sizeof(float), "keys");
        if (c->ssl.symmetric) {
            p->grad_acc = visc_alloc_aligned(q->params.total * sizeof(float), "gradients");
            p->head_grad_acc =
                visc_alloc_aligned(p->head.params.total * sizeof(float), "gradients");
        }
        p->knorm = visc_alloc_aligned((size_t)B * sizeof(float), "key norms");
        p->gathered =
            visc_alloc_aligned((size_t)sets * p->world * B * D * sizeof(float), "gathered keys");
        size_t logits = (size_t)B * (size_t)(c->ssl.bank_size + 1);
        if (logits > scratch) scratch = logits;
        if (p->shuffle_bn) {
            const size_t elem = p->byte_batches ? 1 : sizeof(float);
            p->xall = visc_alloc_aligned((size_t)p->world * B * img * elem, "shuffle-BN");
            p->xk = visc_alloc_aligned((size_t)B * img * elem, "shuffle-BN");
            p->kall = visc_alloc_aligned((size_t)p->world * B * D * sizeof(float), "shuffle-BN");
            p->perm = visc_calloc((size_t)p->world * B, sizeof(int32_t), "shuffle-BN");
        }
    } else {
        int gather = !c->ssl.no_gather;
        visc_ntxent_init(&p->ntx, B, D, gather ? p->world : 1, gather ? p->rank : 0);
    }
    /* the head's input gradient, or MoCo's logits: one buffer */
    p->scratch = visc_alloc_aligned(scratch * sizeof(float), "scratch");

    if (p->world > 1 && c->sync_bn) {
        if (!q->set_bn_sync && !p->head.batchnorm)
            return visc_set_error("--sync-bn: neither %s nor the projection head has "
                                  "BatchNorm layers",
                                  q->cfg.arch);
        if (q->set_bn_sync) q->set_bn_sync(q, bn_sync_allreduce, p->dist);
        if (p->key && p->key->set_bn_sync) p->key->set_bn_sync(p->key, bn_sync_allreduce, p->dist);
        if (p->head.batchnorm) visc_batchnorm2d_set_sync(&p->head.bn, bn_sync_allreduce, p->dist);
    }
    return 0;
}

/* Several processes: the query encoder's gradients (where they are, on
 * the GPU too) and the head's averaged over the ranks. */
static int setup_grad_sync(pretrainer *p) {
    const visc_train_config *c = p->c;
    visc_model *q = p->query;
    if (p->world == 1) return 0;
    size_t bucket = (size_t)((c->bucket_cap_mb >= 0 ? c->bucket_cap_mb : 25.0f) * 1048576.0f);
    visc_grad_transport on_gpu = {0};
    if (p->gpu) {
        p->comm =
            visc_gpu_comm_open(p->gpu, p->dist, c->gpu_allreduce, q->dev_grads, q->params.total);
        if (!p->comm) return -1;
        on_gpu = visc_gpu_comm_transport(p->comm);
    }
    p->gsync = visc_grad_sync_new(p->dist, &q->params, p->gpu ? q->dev_grads : q->grads, bucket,
                                  p->gpu ? &on_gpu : NULL);
    p->head_gsync = visc_grad_sync_new(p->dist, &p->head.params, p->head.grads, 0, NULL);
    /* buckets all-reduced during backward; not with two backward passes
     * per step (symmetric MoCo), whose sum is what counts */
    if (!(p->moco && c->ssl.symmetric)) {
        q->grad_ready = visc_grad_sync_ready;
        q->grad_ready_ctx = p->gsync;
    }
    return 0;
}

/* The embeddings' and the losses' buffers on the GPU (p->dev), and for
 * MoCo the bank as it is now (a resumed run's). */
static int open_gpu_embeddings(pretrainer *p) {
    const visc_proj_head *h = &p->head;
    const size_t rows = (size_t)h->batch, D = (size_t)h->out, B = (size_t)p->B;
    const size_t K = p->moco ? (size_t)p->bank.size : 0, sets = p->c->ssl.symmetric ? 2 : 1;
    const size_t classes = (size_t)p->query->cfg.num_classes;
    float **bufs[] = {&p->dev.z,     &p->dev.znorm, &p->dev.dz,   &p->dev.dfeat, &p->dev.k,
                      &p->dev.knorm, &p->dev.work,  &p->dev.bank, &p->dev.probs, &p->dev.dlogits};
    const size_t work = p->moco ? visc_gpu_infonce_work_floats(p->B, (int)K)
                                : visc_gpu_ntxent_work_floats(p->B, (int)D, p->ntx.world);
    const size_t floats[] = {rows * D,       rows,
                             rows * D,       rows * h->in,
                             sets * B * D,   B,
                             work,           p->moco ? K * D : 1,
                             rows * classes, rows * classes};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (!(*bufs[i] = visc_gpu_alloc(p->gpu, floats[i] * sizeof(float)))) return -1;
    p->dev.labels = visc_gpu_alloc(p->gpu, rows * sizeof(int32_t));
    p->dev.results = p->dev.labels ? visc_gpu_alloc(p->gpu, sizeof(gpu_results)) : NULL;
    if (!p->dev.results) return -1;
    if (p->moco) mirror_bank(p, 0, (int64_t)K);
    return 0;
}

/* --device cuda: the encoders move to the GPU once they are filled on the
 * host (weights, a checkpoint, the first momentum update). What is not on
 * the GPU yet is refused before any GPU is opened. */
static int open_gpu(pretrainer *p) {
    int index;
    if (visc_gpu_run_device(p->c, p->dist, &index)) return -1;
    if (index < 0) return 0;
    p->gpu = visc_gpu_open(index);
    if (!p->gpu || visc_gpu_memory_used(p->gpu, &p->gpu_mem_base)) return -1;
    visc_gpu_set_precision(p->gpu, p->precision);
    visc_gpu_set_conv_benchmark(p->gpu, p->c->cudnn_benchmark);
    if (visc_model_to_gpu(p->query, p->gpu) || (p->key && visc_model_to_gpu(p->key, p->gpu)) ||
        visc_proj_head_to_gpu(&p->head, p->gpu) ||
        (p->key && visc_proj_head_to_gpu(&p->key_head, p->gpu)))
        return -1;
    if (p->grad_acc) {
        p->dev_grad_acc = visc_gpu_alloc(p->gpu, p->query->params.total * sizeof(float));
        p->dev_head_grad_acc = visc_gpu_alloc(p->gpu, p->head.params.total * sizeof(float));
        if (!p->dev_grad_acc || !p->dev_head_grad_acc) return -1;
    }
    p->gpu_opt = visc_gpu_optim_create(p->gpu, &p->opt);
    p->head_gpu_opt = p->gpu_opt ? visc_gpu_optim_create(p->gpu, &p->head_opt) : NULL;
    if (!p->head_gpu_opt || open_gpu_embeddings(p)) return -1;
    visc_gpu_pin_loader(p->gpu, p->loader, &p->pins);
    if (!p->byte_batches) return 0;
    const visc_model_config *mc = &p->query->cfg;
    const size_t img = (size_t)mc->in_channels * mc->image_size * mc->image_size;
    /* both views of a batch as one staged batch of 2B images */
    p->stage = visc_gpu_stage_create(p->gpu, 2 * p->B, mc->num_classes, img, 0);
    if (!p->stage) return -1;
    if (p->shuffle_bn && !(p->dev_xk = visc_gpu_alloc(p->gpu, (size_t)p->B * img))) return -1;
    return 0;
}

static void pretrainer_free(pretrainer *p) {
    if (p->tb) visc_tb_close(p->tb);
    if (p->log) fclose(p->log);
    visc_grad_sync_free(p->gsync);
    visc_grad_sync_free(p->head_gsync);
    visc_gpu_comm_close(p->comm); /* before the gradients it writes are freed */
    /* a batch's copy still in flight (a step that failed after it was
     * queued) reads the loader's memory: waited for before that goes */
    visc_gpu_stage_free(p->stage);
    visc_gpu_unpin(&p->pins);
    visc_loader_free(p->loader);
    visc_optimizer_free(&p->opt);
    visc_optimizer_free(&p->head_opt);
    if (p->query) {
        visc_proj_head_free(&p->head);
        visc_model_destroy(p->query);
    }
    if (p->key) {
        visc_proj_head_free(&p->key_head);
        visc_model_destroy(p->key);
    }
    visc_gpu_free(p->gpu, p->dev_grad_acc);
    visc_gpu_free(p->gpu, p->dev_head_grad_acc);
    visc_gpu_free(p->gpu, p->dev_xk);
    void *dev[] = {p->dev.z,     p->dev.znorm,   p->dev.dz,     p->dev.dfeat,
                   p->dev.k,     p->dev.knorm,   p->dev.work,   p->dev.bank,
                   p->dev.probs, p->dev.dlogits, p->dev.labels, p->dev.results};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) visc_gpu_free(p->gpu, dev[i]);
    visc_gpu_optim_free(p->gpu_opt);
    visc_gpu_optim_free(p->head_gpu_opt);
    visc_gpu_close(p->gpu); /* after the models: they free their GPU memory into it */
    if (p->bank.bank) visc_memory_bank_free(&p->bank);
    if (p->ntx.all) visc_ntxent_free(&p->ntx);
    if (p->train) visc_dataset_free(p->train);
    if (p->val) visc_dataset_free(p->val);
    visc_free_aligned(p->z);
    visc_free_aligned(p->znorm);
    visc_free_aligned(p->dz);
    visc_free_aligned(p->kz);
    visc_free_aligned(p->knorm);
    visc_free_aligned(p->scratch);
    visc_free_aligned(p->gathered);
    visc_free_aligned(p->probs);
    visc_free_aligned(p->dlogits);
    visc_free_aligned(p->xall);
    visc_free_aligned(p->xk);
    visc_free_aligned(p->kall);
    visc_free_aligned(p->grad_acc);
    visc_free_aligned(p->head_grad_acc);
    free(p->labels);
    free(p->perm);
    free(p->config_text);
}

static char *describe(const visc_train_config *c, visc_precision precision) {
    char *s = visc_malloc(2048, "config text");
    snprintf(s, 2048,
             "{\"method\":\"%s\",\"model\":\"%s\",\"data\":\"%s\",\"epochs\":%d,\"batch_size\":%d,"
             "\"opt\":\"%s\",\"lr\":%g,\"min_lr\":%g,\"momentum\":%g,\"weight_decay\":%g,"
             "\"warmup_epochs\":%g,\"temperature\":%g,\"bank_size\":%lld,\"proj_dim\":%d,"
             "\"moco_momentum\":%g,\"momentum_cosine\":%d,\"fresh_key_head\":%d,\"symmetric\":%d,"
             "\"gather\":%d,"
             "\"aug\":\"%s\",\"image_size\":%d,\"seed\":%llu,\"preset\":\"%s\","
             "\"precision\":\"%s\",\"device\":\"%s\"}",
             c->ssl.method, c->model.arch, c->data_dir, c->epochs, c->batch_size, c->opt,
             (double)c->lr, (double)c->min_lr, (double)c->momentum, (double)c->weight_decay,
             (double)c->warmup_epochs, (double)c->ssl.temperature, (long long)c->ssl.bank_size,
             c->ssl.proj_dim, (double)c->ssl.momentum, c->ssl.momentum_cosine,
             c->ssl.fresh_key_head, c->ssl.symmetric, !c->ssl.no_gather, c->aug,
             c->model.image_size, (unsigned long long)c->seed, c->ssl.preset,
             visc_precision_name(precision), c->device);
    return s;
}

int visc_pretrain(const visc_train_config *c) {
    pretrainer p;
    memset(&p, 0, sizeof p);
    p.c = c;
    p.hooks = c->hooks;
    p.key_step = -1;
    p.moco = !strcmp(c->ssl.method, "mocov2");
    int rc = -1;
    p.dist = visc_dist_open(c->dist_backend, c->dist_timeout > 0 ? c->dist_timeout : 300);
    if (!p.dist) return -1;
    p.rank = visc_dist_rank(p.dist);
    p.world = visc_dist_world(p.dist);
    if (c->threads > 0) visc_set_num_threads(c->threads);
    else if (visc_dist_local_world(p.dist) > 1) {
        long share = sysconf(_SC_NPROCESSORS_ONLN) / visc_dist_local_world(p.dist);
        visc_set_num_threads(share < 1 ? 1 : (int)share);
    }
    if (c->batch_size % p.world) {
        visc_set_error("--batch-size %d (the whole job's) does not split evenly over %d processes",
                       c->batch_size, p.world);
        goto done;
    }
    p.B = c->batch_size / p.world;
    if (p.B < 2 && !p.moco) {
        visc_set_error("SimCLR needs at least 2 samples per process");
        goto done;
    }
    /* Process-wide and set on every run (a fp32 run after a bf16 one is fp32). */
    if (visc_parse_precision(c->precision, &p.precision)) goto done;
    const visc_precision host = visc_set_matmul_precision(p.precision);
    int gpu_index;
    if (visc_parse_device(c->device, &gpu_index)) goto done;
    if (gpu_index < 0) p.precision = host;
    if (setup(&p)) goto done;
    p.config_text = describe(c, p.precision);
    if (c->resume[0]) {
        visc_ssl_parts parts = parts_of(&p);
        if (visc_ssl_load_checkpoint(&parts, c->resume)) goto done;
        if (p.state.world != p.world) p.state.sample_pos = -1;
        else if (p.world > 1) p.state.sample_pos = p.state.rank_pos[p.rank];
        if (p.rank == 0)
            printf("resumed from %s at epoch %lld, step %lld\n", c->resume,
                   (long long)p.state.epoch, (long long)p.state.step);
    }
    if (p.world > 1) { /* one starting point everywhere: rank 0's */
        visc_model *q = p.query;
        if (visc_dist_broadcast(p.dist, q->params.data, q->params.total * sizeof(float), 0) ||
            visc_dist_broadcast(p.dist, p.head.params.data, p.head.params.total * sizeof(float), 0))
            goto done;
    }
    /* the momentum encoder ready for the first step (a fresh run, or a
     * checkpoint of before key_step was saved) */
    if (p.moco && p.key_step < p.state.step) advance_key(&p);
    if (open_gpu(&p) || setup_grad_sync(&p)) goto done;
    /* (hooks come alone: `--swarm` refuses to run under mpirun) */
    if (p.hooks && hooks_start(&p)) goto done;
    if (p.rank == 0) {
        if (visc_mkdirs(c->output)) goto done;
        char path[1100];
        snprintf(path, sizeof path, "%s/log.jsonl", c->output);
        p.log = fopen(path, c->resume[0] ? "a" : "w");
        if (!p.log) {
            visc_set_error("cannot write %s: %s", path, strerror(errno));
            goto done;
        }
        p.tb = visc_tb_open(c->output);
        if (!p.tb) goto done;
        log_json(&p, "{\"type\":\"config\",\"config\":%s}", p.config_text);
        char procs[128] = "";
        if (p.world > 1)
            snprintf(procs, sizeof procs, " (%d processes x %d, %s%s%s)", p.world, p.B,
                     visc_dist_backend_name(p.dist), p.comm ? ", GPU gradients " : "",
                     p.comm ? visc_gpu_comm_name(p.comm) : "");
        printf("pretraining %s with %s on %s: %lld images, %d epochs of %lld steps, batch %d%s; "
               "lr %g (%s, wd %g), temperature %g",
               c->model.arch, p.moco ? "MoCo v2" : "SimCLR", c->data_dir, (long long)p.train->size,
               c->epochs, (long long)p.steps_per_epoch, c->batch_size, procs, (double)c->lr, c->opt,
               (double)c->weight_decay, (double)c->ssl.temperature);
        if (p.moco)
            printf(", bank %lld, momentum %g%s", (long long)c->ssl.bank_size,
                   (double)c->ssl.momentum, c->ssl.momentum_cosine ? " (cosine to 1)" : "");
        /* as visc train says it (on a GPU: as planned there) */
        printf(", %.0f MiB of activations", (double)p.query->activation_bytes / (1 << 20));
        if (p.key)
            printf(" (the momentum encoder's, forward alone: %.0f MiB)",
                   (double)p.key->activation_bytes / (1 << 20));
        printf("%s%s%s%s\n", p.precision == VISC_PRECISION_BF16 ? ", bf16 matmuls" : "",
               p.gpu ? ", on " : "", p.gpu ? c->device : "", p.stage ? " (batches as bytes)" : "");
    }
    double t0 = visc_now();
    int r = run_epochs(&p);
    if (r < 0) goto done;
    if (p.gpu && p.rank == 0) visc_gpu_print_memory(p.gpu, p.gpu_mem_base);
    if (r == 0 && p.rank == 0) {
        printf("done: online classifier best val top1 %.2f%% in %.0fs; the query encoder is "
               "%s/model_last.safetensors\n",
               p.state.best_top1, visc_now() - t0, c->output);
        log_json(&p, "{\"type\":\"done\",\"val_online_cls_top1_max\":%.4f,\"seconds\":%.1f}",
                 p.state.best_top1, visc_now() - t0);
    }
    rc = 0;
done:
    if (p.hooks_started && p.hooks->finish) p.hooks->finish(p.hooks->ctx);
    visc_state_view_free(&p.view);
    pretrainer_free(&p);
    if (rc && p.world > 1) {
        fprintf(stderr, "visc: rank %d: %s\n", p.rank, visc_last_error());
        visc_dist_abort(p.dist);
    }
    visc_dist_close(p.dist);
    return rc;
}

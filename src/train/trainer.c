/* trainer.c: supervised training, epoch by epoch.
 *
 * Reproducibility: every random choice is drawn from (seed, epoch, sample)
 * by the counter-based RNG, so the state to resume from is just (epoch,
 * step, step_in_epoch) plus the model and optimizer buffers. A resumed run
 * recomputes the epoch's order, skips the batches already consumed, and
 * continues bit-exactly (same thread count assumed: reductions are ordered). */
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "visc/autoaug.h"
#include "visc/gpu.h"
#include "visc/io.h"
#include "visc/nn.h"
#include "visc/plot.h"
#include "visc/rng.h"
#include "visc/ssl_eval.h"
#include "visc/train.h"

void visc_train_config_defaults(visc_train_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->dataset, sizeof c->dataset, "fashion-mnist");
    c->pad_crop = 2;
    c->hflip = 1;
    snprintf(c->model.arch, sizeof c->model.arch, "resnet20");
    c->model.num_classes = 0; /* from the dataset */
    c->epochs = 10;
    c->batch_size = 128;
    snprintf(c->opt, sizeof c->opt, "sgd");
    snprintf(c->sched, sizeof c->sched, "cosine");
    c->lr = 0.1f;
    c->momentum = 0.9f;
    c->weight_decay = 5e-4f;
    c->nesterov = 1;
    c->decay_norm_and_bias = 0;
    c->warmup_start = 0.1f;
    c->lr_gamma = 0.1f;
    c->lr_step_epochs = 30;
    c->seed = 0;
    c->print_freq = 50;
    snprintf(c->aug, sizeof c->aug, "torchvision");
    c->reprob = -1;
    c->blur_prob = -1;
    c->crop_pct = 0.875f;
    snprintf(c->on_bad_image, sizeof c->on_bad_image, "skip");
    c->mixup_prob = 1.0f;
    c->mixup_switch_prob = 0.5f;
    snprintf(c->output, sizeof c->output, "runs/train");
    snprintf(c->precision, sizeof c->precision, "fp32");
    snprintf(c->device, sizeof c->device, "cpu");
    snprintf(c->gpu_allreduce, sizeof c->gpu_allreduce, "auto");
}

/* A step's loss and top-1 count, until they join the epoch's sums: at once
 * on the CPU; on a GPU they wait on the device (visc_gpu_stage) until a
 * report reads a run of them, so that no step waits for the GPU. */
typedef struct {
    int64_t step; /* the state's step after it */
    float loss;
    int32_t top1;
} step_result;

/* The epoch's sums over the steps settled so far. */
typedef struct {
    double loss_sum;
    int64_t correct, steps;
} epoch_sums;

/* Everything a step touches, allocated once before the first step. */
typedef struct {
    const visc_train_config *c;
    visc_model *model;
    visc_optimizer opt;
    visc_schedule sched;
    visc_dataset *train, *val;
    visc_augment aug;                /* in-memory data: crop / flip / normalization */
    visc_transform_config recipe[2]; /* image data: train, eval */
    visc_sample_pipeline pipeline[2];
    visc_loader *loader; /* the training batches, prefetched */
    visc_mixup mixup;    /* batch mixing (mixup / cutmix) when use_mixup */
    int use_mixup;
    float *targets; /* [B, K] soft targets of a mixed batch */
    float *probs, *dlogits, *ema_params, *ema_buffers;
    int64_t steps_per_epoch;
    int64_t last_eval_step; /* --eval-interval: the step last evaluated (-1: none) */
    visc_train_state state;
    visc_tb_writer *tb;
    FILE *log;
    char *config_text;
    /* data-parallel processes: rank 0 alone prints, logs and saves */
    visc_dist *dist;
    int rank, world;
    visc_grad_sync *gsync; /* world > 1: gradient averaging during backward */
    visc_gpu_comm *comm;   /* ... of gradients on a GPU */
    /* --device cuda: the GPU the model and the optimizer's step are on */
    visc_cuda *gpu;
    visc_precision precision; /* of the linear layers' products, where they run */
    size_t gpu_mem_base;      /* device memory in use when the GPU was opened */
    visc_gpu_optim *gpu_opt;
    float *dev_ema_params, *dev_ema_buffers; /* --model-ema-decay: the EMA, on the device */
    visc_gpu_pins pins;                      /* the loader's batch memory, page-locked */
    /* The loader delivers bytes (image data on a GPU, no mixing): they
     * cross the bus as such and become the model's input there. */
    int byte_batches;
    visc_gpu_stage *stage; /* on a GPU: the batch's way there, the loss kept there */
    step_result pending[VISC_GPU_STAGE_STEPS];
    int npending;
} trainer;

/* A short batch's rows past its count: copies of its first sample. */
static void pad_short_batch(const visc_batch *batch, int B, size_t sample) {
    for (int b = batch->count; b < B; b++) {
        if (batch->x8) memcpy(batch->x8 + b * sample, batch->x8, sample);
        else memcpy(batch->x + b * sample, batch->x, sample * sizeof(float));
    }
}

/* One optimizer step on one batch: mixing, forward, loss, backward, clip,
 * update, EMA. Leaves its loss and top-1 in t->pending (on a GPU, to be
 * read from the device); -1 when the gradient all-reduce failed. A short
 * batch (the loader ran out of good samples) fills its tail with copies
 * of the first sample and gives those rows no gradient. */
static int train_step(trainer *t, const visc_batch *batch, float *lr_out) {
    const visc_train_config *c = t->c;
    visc_model *m = t->model;
    int B = m->cfg.batch, K = m->cfg.num_classes, n = batch->count;
    size_t sample = (size_t)m->cfg.in_channels * m->cfg.image_size * m->cfg.image_size;
    pad_short_batch(batch, B, sample);
    float *x = batch->x;
    /* on a GPU the soft targets cross the bus from page-locked memory */
    float *targets = t->stage ? visc_gpu_stage_targets(t->stage) : t->targets;
    if (t->use_mixup) {
        /* One draw per step from its own stream: resumable like the rest. */
        visc_rng r = visc_rng_make(c->seed, VISC_STREAM_MIXUP, (uint64_t)t->state.step);
        visc_mixup_apply(&t->mixup, &r, x, n & ~1, m->cfg.in_channels, m->cfg.image_size,
                         m->cfg.image_size, batch->y, targets);
    }
    /* an odd last sample was not mixed: it gets no gradient */
    const int rows = t->use_mixup ? n & ~1 : n;
    /* This step's dropout / drop-path masks: a pure function of (seed, step). */
    uint32_t key[4];
    visc_philox4x32(c->seed, VISC_STREAM_DROPOUT, (uint64_t)t->state.step, key);
    m->noise_seed = (uint64_t)key[0] << 32 | key[1];

    step_result *result = &t->pending[t->npending++];
    const float *dlogits = t->dlogits;
    if (t->stage) {
        /* The batch crosses beside the previous step's kernels; bytes (a
         * quarter of the floats) are normalized there, straight into the
         * model's input buffer. Loss and top-1 stay on the device. */
        void *dev_batch =
            visc_gpu_stage_put(t->stage, batch->x8 ? (void *)batch->x8 : (void *)x, batch->y, n);
        x = dev_batch;
        if (batch->x8) {
            visc_gpu_normalize_bytes(t->gpu, m->input, dev_batch, (size_t)B, sample / 3,
                                     t->train->byte_mean, t->train->byte_std);
            x = m->input;
        }
        m->io_on_device = 1; /* this step only: evaluation feeds the host's */
        m->forward(m, x, 1);
        dlogits = visc_gpu_stage_loss(t->stage, t->npending - 1, m->dev_logits, rows, n,
                                      c->label_smoothing);
    } else {
        m->forward(m, x, 1);
        if (t->use_mixup) {
            result->loss = visc_softmax_xent_soft_forward(t->probs, m->logits, targets, rows, K);
            visc_softmax_xent_soft_backward(t->dlogits, t->probs, targets, rows, K);
        } else {
            result->loss = visc_softmax_xent_forward(t->probs, m->logits, batch->y, rows, K,
                                                     c->label_smoothing);
            visc_softmax_xent_backward(t->dlogits, t->probs, batch->y, rows, K, c->label_smoothing);
        }
        memset(t->dlogits + (size_t)rows * K, 0, (size_t)(B - rows) * K * sizeof(float));
        int top1, top5;
        visc_topk_correct(m->logits, batch->y, batch->count, K, &top1, &top5);
        result->top1 = top1;
    }
    /* Several processes: each rank's gradient is the mean over its share
     * of the batch; buckets are averaged over the ranks as backward
     * finishes them, the rest after it. */
    if (t->gsync) visc_grad_sync_begin(t->gsync);
    m->backward(m, dlogits);
    m->io_on_device = 0;
    if (t->gsync && visc_grad_sync_finish(t->gsync)) return -1;

    /* A swarm's hooks (on the CPU) decide whether this batch ends a step,
     * and hand back the swarm's gradient and step when it does. */
    int64_t step = t->state.step;
    result->step = step;
    if (c->hooks) {
        int go = c->hooks->after_backward(c->hooks->ctx, rows, result->loss, &step);
        if (go < 0) return -1;
        if (go == 0) {
            *lr_out = visc_schedule_lr(&t->sched, t->state.step);
            return 0;
        }
    }
    if (c->clip_grad > 0) {
        if (t->gpu) visc_gpu_clip_grad_norm(t->gpu, m->dev_grads, m->params.total, c->clip_grad);
        else visc_clip_grad_norm(m->grads, m->params.total, c->clip_grad);
    }
    float lr = visc_schedule_lr(&t->sched, step);
    if (t->gpu_opt) {
        if (visc_gpu_optim_step(t->gpu_opt, &t->opt, m->dev_params, m->dev_grads, lr)) return -1;
    } else {
        visc_optimizer_step(&t->opt, m->params.data, m->grads, lr);
    }
    if (t->ema_params && t->gpu) {
        visc_gpu_ema_update(t->gpu, t->dev_ema_params, m->dev_params, m->params.total,
                            c->ema_decay);
        visc_gpu_ema_update(t->gpu, t->dev_ema_buffers, m->dev_buffers, m->buffers.total,
                            c->ema_decay);
    } else if (t->ema_params) {
        visc_ema_update(t->ema_params, m->params.data, m->params.total, c->ema_decay);
        visc_ema_update(t->ema_buffers, m->buffers.data, m->buffers.total, c->ema_decay);
    }
    /* the whole step is queued: the loader may have the batch's memory back */
    if (t->stage && visc_gpu_stage_end(t->stage)) return -1;
    t->state.step = result->step = step + 1;
    if (c->hooks && c->hooks->after_step && c->hooks->after_step(c->hooks->ctx)) return -1;
    *lr_out = lr;
    return 0;
}

/* The pending steps' losses and top-1 counts into the epoch's sums, in
 * step order (the GPU's come back in one copy); -1 at the first loss that
 * is not finite: training diverged. */
static int settle_steps(trainer *t, epoch_sums *sums, int64_t epoch) {
    const int n = t->npending;
    t->npending = 0;
    if (t->stage && n > 0) {
        float loss[VISC_GPU_STAGE_STEPS];
        int32_t top1[VISC_GPU_STAGE_STEPS];
        if (visc_gpu_stage_results(t->stage, n, loss, top1, NULL)) return -1;
        for (int i = 0; i < n; i++) t->pending[i].loss = loss[i], t->pending[i].top1 = top1[i];
    }
    for (int i = 0; i < n; i++) {
        const step_result *r = &t->pending[i];
        if (!isfinite(r->loss))
            return visc_set_error("loss is %s at step %lld (epoch %lld): training diverged; "
                                  "lower --lr or enable --clip-grad",
                                  isnan(r->loss) ? "NaN" : "infinite", (long long)r->step,
                                  (long long)epoch + 1);
        sums->loss_sum += r->loss;
        sums->correct += r->top1;
        sums->steps++;
    }
    return 0;
}

static int64_t *parse_milestones(const char *text, int *count) {
    static int64_t ms[VISC_MAX_MILESTONES];
    *count = 0;
    for (const char *p = text; *p && *count < VISC_MAX_MILESTONES;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        ms[(*count)++] = v;
        p = *end == ',' ? end + 1 : end;
    }
    return ms;
}

/* steps_per_epoch: optimizer steps per epoch of data (the loader's batches,
 * or a swarm's: the data over its target batch). */
static int setup_schedule(trainer *t, int64_t steps_per_epoch) {
    const visc_train_config *c = t->c;
    visc_schedule *s = &t->sched;
    memset(s, 0, sizeof *s);
    if (visc_sched_parse_kind(c->sched, &s->kind)) return -1;
    s->base_lr = c->lr;
    s->min_lr = c->min_lr;
    s->total_steps = (int64_t)c->epochs * steps_per_epoch;
    s->warmup_steps = (int64_t)llround(c->warmup_epochs * (double)steps_per_epoch);
    s->warmup_start = c->warmup_start;
    s->step_size = (int64_t)c->lr_step_epochs * steps_per_epoch;
    s->gamma = c->lr_gamma;
    int n;
    const int64_t *ms = parse_milestones(c->lr_milestones, &n);
    for (int i = 0; i < n; i++) s->milestones[i] = ms[i] * steps_per_epoch;
    s->num_milestones = n;
    return 0;
}

static void log_json(trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One record per line; every record ends with "time" (Unix seconds), so
 * runs of several processes (a swarm) line up on one clock. */
static void log_json(trainer *t, const char *fmt, ...) {
    if (!t->log) return;
    char small[1024], *line = small;
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (len >= (int)sizeof small) { /* the config record: once per run */
        line = visc_malloc((size_t)len + 1, "log line");
        if (!line) return;
        va_start(ap, fmt);
        vsnprintf(line, (size_t)len + 1, fmt, ap);
        va_end(ap);
    }
    if (len >= 2 && line[len - 1] == '}') {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        line[len - 1] = 0;
        fprintf(t->log, "%s,\"time\":%.3f}\n", line, (double)now.tv_sec + now.tv_nsec * 1e-9);
    } else if (len >= 0) {
        fprintf(t->log, "%s\n", line);
    }
    if (line != small) free(line);
    fflush(t->log);
}

static int save_files(trainer *t, int is_best) {
    char path[1024];
    /* a model on the GPU: its weights, the optimizer's state and the EMA come back first */
    if (t->gpu && (visc_model_download(t->model) || visc_gpu_optim_download(t->gpu_opt, &t->opt)))
        return -1;
    if (t->gpu && t->ema_params) {
        const visc_model *m = t->model;
        visc_gpu_download(t->gpu, t->ema_params, t->dev_ema_params,
                          m->params.total * sizeof(float));
        visc_gpu_download(t->gpu, t->ema_buffers, t->dev_ema_buffers,
                          m->buffers.total * sizeof(float));
    }
    snprintf(path, sizeof path, "%s/checkpoint_last.safetensors", t->c->output);
    if (visc_save_checkpoint(t->model, &t->opt, t->ema_params, t->ema_buffers, &t->state,
                             t->config_text, path))
        return -1;
    snprintf(path, sizeof path, "%s/model_last.safetensors", t->c->output);
    if (visc_save_model(t->model, path, NULL)) return -1;
    if (is_best) {
        snprintf(path, sizeof path, "%s/model_best.safetensors", t->c->output);
        if (visc_save_model(t->model, path, NULL)) return -1;
    }
    return 0;
}

/* Checkpoints and model files: rank 0 writes them (atomically), after
 * collecting every rank's loader cursor; every rank learns whether the
 * write worked (so a failed write stops all of them, not just rank 0). */
static int save_all(trainer *t, int is_best) {
    t->state.world = t->world;
    if (t->world > 1 && t->world <= VISC_MAX_SAVED_RANKS &&
        visc_dist_allgather(t->dist, &t->state.sample_pos, t->state.rank_pos, sizeof(int64_t)))
        return -1;
    int64_t failed = t->rank == 0 && save_files(t, is_best) ? 1 : 0;
    if (t->world == 1) return failed ? -1 : 0;
    char why[512];
    snprintf(why, sizeof why, "%s", failed ? visc_last_error() : "");
    if (visc_dist_allreduce(t->dist, &failed, 1, VISC_DT_I64, VISC_OP_MAX)) return -1;
    if (failed)
        return visc_set_error("%s", t->rank == 0 ? why : "rank 0 could not save the checkpoint");
    return 0;
}

/* BatchNorm running statistics are per rank (each saw its own batches):
 * rank 0's are the model's, as with DDP's broadcast_buffers. host: the
 * buffers' host copy; dev: their device copy on a GPU (NULL on the CPU),
 * which crosses through host. */
static int share_buffers(trainer *t, float *host, float *dev) {
    if (t->world == 1 || t->model->buffers.total == 0) return 0;
    return visc_gpu_broadcast(t->dist, t->gpu, host, dev, t->model->buffers.total * sizeof(float));
}

/* Evaluates with the EMA weights swapped in (on the GPU, its device
 * copies: the layers read the model's tensors through visc_model_param),
 * then swaps back. */
static int evaluate_ema(trainer *t, visc_eval_result *r) {
    visc_model *m = t->model;
    if (share_buffers(t, t->ema_buffers, t->gpu ? t->dev_ema_buffers : NULL)) return -1;
    float **params = t->gpu ? &m->dev_params : &m->params.data;
    float **buffers = t->gpu ? &m->dev_buffers : &m->buffers.data;
    float *p = *params, *b = *buffers;
    *params = t->gpu ? t->dev_ema_params : t->ema_params;
    *buffers = t->gpu ? t->dev_ema_buffers : t->ema_buffers;
    int rc = visc_evaluate_shard(m, t->val, &t->aug, t->c->label_smoothing, t->dist, r);
    *params = p;
    *buffers = b;
    return rc;
}

/* A JSON string literal: quotes, backslashes and control bytes escaped. */
static void write_json_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

/* Images the loader skipped this epoch: a count on the terminal, every
 * name in the log. */
static void report_bad_samples(trainer *t, int64_t epoch) {
    int64_t n = visc_loader_bad_count(t->loader);
    if (n == 0) return;
    fprintf(stderr,
            "visc: warning: epoch %lld skipped %lld unusable image%s (first: %s); all "
            "names in %s/log.jsonl\n",
            (long long)epoch + 1, (long long)n, n == 1 ? "" : "s",
            visc_loader_bad_message(t->loader, 0), t->c->output);
    for (int64_t i = 0; i < n && t->log; i++) {
        fprintf(t->log, "{\"type\":\"bad_image\",\"epoch\":%lld,\"index\":%lld,\"error\":",
                (long long)epoch + 1, (long long)visc_loader_bad_index(t->loader, i));
        write_json_string(t->log, visc_loader_bad_message(t->loader, i));
        fputs("}\n", t->log);
    }
    if (t->log) fflush(t->log);
}

/* --eval-interval: the validation set at the current step, logged as a
 * "val_step" record (the per-epoch "val" records stay one per epoch). */
static int evaluate_at_step(trainer *t, visc_progress *bar) {
    if (t->c->eval_interval <= 0 || t->state.step == t->last_eval_step) return 0;
    t->last_eval_step = t->state.step;
    visc_eval_result r;
    if (share_buffers(t, t->model->buffers.data, t->model->dev_buffers) ||
        visc_evaluate_shard(t->model, t->val, &t->aug, t->c->label_smoothing, t->dist, &r))
        return -1;
    if (t->rank == 0 && !bar->tty)
        printf("  step %lld: val loss %.4f top1 %.2f%% top5 %.2f%%\n", (long long)t->state.step,
               r.loss, r.top1, r.top5);
    log_json(t, "{\"type\":\"val_step\",\"step\":%lld,\"loss\":%.6f,\"top1\":%.4f,\"top5\":%.4f}",
             (long long)t->state.step, r.loss, r.top1, r.top5);
    if (t->tb) visc_tb_scalar(t->tb, "val_step/top1", t->state.step, (float)r.top1);
    return 0;
}

/* Ends the run mid-epoch: the steps' results settled, the bar's last
 * line, the evaluation that --eval-interval asks for, then the checkpoint. */
static int stop_early(trainer *t, visc_progress *bar, epoch_sums *sums, const char *why) {
    if (settle_steps(t, sums, t->state.epoch)) { /* a diverged run saves nothing */
        visc_progress_end(bar, NULL);
        return -1;
    }
    visc_progress_end(bar, why);
    if (evaluate_at_step(t, bar)) return -1;
    return save_all(t, 0) ? -1 : 1;
}

/* Stopped by a signal (stop_signal.c): as --max-steps, then one line on
 * how to go on. */
static int stop_for_signal(trainer *t, visc_progress *bar, epoch_sums *sums, int sig) {
    char why[64];
    snprintf(why, sizeof why, "stopped by %s", visc_signal_name(sig));
    int rc = stop_early(t, bar, sums, why);
    if (rc < 0) return -1;
    visc_stop_signal_obeyed(sig, (long long)t->state.step, t->c->output, t->rank);
    return rc;
}

static int run_epochs(trainer *t) {
    const visc_train_config *c = t->c;
    visc_model *m = t->model;
    double flops_per_img = 3.0 * m->flops_per_image; /* forward + backward */
    /* from here a signal stops the run after a step, with a checkpoint
     * (before, it ends the process: there is nothing to keep yet) */
    visc_stop_signals_install();
    while (t->state.epoch < c->epochs) {
        int64_t epoch = t->state.epoch;
        /* Mid-epoch resume starts at the saved cursor (bad samples skipped
         * before it make it differ from step_in_epoch * B). */
        int64_t pos = t->state.step_in_epoch > 0 ? t->state.sample_pos : -1;
        if (visc_loader_start(t->loader, epoch, t->state.step_in_epoch, pos)) return -1;
        visc_progress bar;
        char label[64];
        snprintf(label, sizeof label, "epoch %lld/%d", (long long)epoch + 1, c->epochs);
        visc_progress_begin(&bar, label, t->steps_per_epoch, !c->no_progress);
        if (t->rank != 0) bar.out = NULL; /* rank 0 speaks for the job */
        double t0 = visc_now(), window_t0 = t0;
        epoch_sums sums = {0};
        int64_t seen = 0, window_imgs = 0;
        double job_loss = 0, job_acc = 0; /* the whole job's, at the last report */
        for (int64_t i = t->state.step_in_epoch; i < t->steps_per_epoch; i++) {
            /* already there (a resumed or downloaded state): not one batch more */
            if (c->max_steps > 0 && t->state.step >= c->max_steps)
                return stop_early(t, &bar, &sums, "stopped at --max-steps");
            visc_batch batch;
            int got = visc_loader_next(t->loader, &batch);
            if (got < 0) {
                visc_progress_end(&bar, NULL);
                return -1;
            }
            if (got == 0) break; /* bad samples used up the end of the epoch */
            float lr;
            if (train_step(t, &batch, &lr)) {
                visc_progress_end(&bar, NULL);
                return -1;
            }
            t->state.sample_pos = batch.next_pos;
            t->state.step_in_epoch = i + 1;
            seen += batch.count;
            window_imgs += batch.count;
            int64_t done = i + 1;
            int report =
                (c->print_freq > 0 && done % c->print_freq == 0) || done == t->steps_per_epoch;
            /* A step's loss joins the sums at once on the CPU; on a GPU when
             * a report needs it or the device's table of them is full. */
            if ((!t->stage || report || t->npending == VISC_GPU_STAGE_STEPS) &&
                settle_steps(t, &sums, epoch)) {
                visc_progress_end(&bar, NULL);
                return -1;
            }
            if (report) {
                /* the whole job's numbers: every rank's share added up */
                double totals[4] = {sums.loss_sum / t->world, (double)sums.correct, (double)seen,
                                    (double)window_imgs};
                if (t->world > 1 &&
                    visc_dist_allreduce(t->dist, totals, 4, VISC_DT_F64, VISC_OP_SUM))
                    return -1;
                job_loss = totals[0] / sums.steps;
                job_acc = 100.0 * totals[1] / totals[2];
                double now = visc_now(), ips = totals[3] / (now - window_t0);
                char stats[160];
                snprintf(stats, sizeof stats,
                         "loss %.4f acc %.2f%% lr %.4g %.0f img/s %.1f GFLOP/s", job_loss, job_acc,
                         lr, ips, ips * flops_per_img * 1e-9);
                visc_progress_update(&bar, done, stats);
                log_json(t,
                         "{\"type\":\"train\",\"epoch\":%lld,\"step\":%lld,\"loss\":%.6f,"
                         "\"top1\":%.4f,\"lr\":%.6g,\"img_per_s\":%.1f}",
                         (long long)epoch + 1, (long long)t->state.step, job_loss, job_acc, lr,
                         ips);
                if (t->tb) {
                    visc_tb_scalar(t->tb, "train/loss", t->state.step, (float)job_loss);
                    visc_tb_scalar(t->tb, "train/top1", t->state.step, (float)job_acc);
                    visc_tb_scalar(t->tb, "train/lr", t->state.step, lr);
                    visc_tb_scalar(t->tb, "train/img_per_s", t->state.step, (float)ips);
                }
                window_t0 = now;
                window_imgs = 0;
            }
            if (c->eval_interval > 0 && t->state.step % c->eval_interval == 0) {
                double e0 = visc_now();
                if (evaluate_at_step(t, &bar)) {
                    visc_progress_end(&bar, NULL);
                    return -1;
                }
                window_t0 += visc_now() - e0; /* img/s counts training only */
            }
            if (c->max_steps > 0 && t->state.step >= c->max_steps)
                return stop_early(t, &bar, &sums, "stopped at --max-steps");
            if (c->hooks && c->hooks->should_stop && c->hooks->should_stop(c->hooks->ctx))
                return stop_early(t, &bar, &sums, "stopped by the swarm");
            int sig;
            if (visc_dist_stop_signal(t->dist, &sig)) {
                visc_progress_end(&bar, NULL);
                return -1;
            }
            if (sig) return stop_for_signal(t, &bar, &sums, sig);
        }
        if (settle_steps(t, &sums, epoch)) { /* before anything is saved */
            visc_progress_end(&bar, NULL);
            return -1;
        }
        double train_time = visc_now() - t0;
        report_bad_samples(t, epoch);
        visc_eval_result r;
        if (share_buffers(t, m->buffers.data, m->dev_buffers) ||
            visc_evaluate_shard(m, t->val, &t->aug, c->label_smoothing, t->dist, &r))
            return -1;
        t->state.epoch++;
        t->state.step_in_epoch = 0;
        int is_best = r.top1 > t->state.best_top1;
        if (is_best) t->state.best_top1 = r.top1;
        char summary[256];
        snprintf(summary, sizeof summary,
                 "train loss %.4f acc %.2f%% | val loss %.4f top1 %.2f%% top5 %.2f%% | %.0fs",
                 sums.steps ? job_loss : 0.0, sums.steps ? job_acc : 0.0, r.loss, r.top1, r.top5,
                 train_time);
        visc_progress_end(&bar, summary);
        log_json(t,
                 "{\"type\":\"val\",\"epoch\":%lld,\"step\":%lld,\"loss\":%.6f,\"top1\":%.4f,"
                 "\"top5\":%.4f,\"epoch_time_s\":%.2f}",
                 (long long)t->state.epoch, (long long)t->state.step, r.loss, r.top1, r.top5,
                 train_time);
        if (t->tb) {
            visc_tb_scalar(t->tb, "val/loss", t->state.epoch, (float)r.loss);
            visc_tb_scalar(t->tb, "val/top1", t->state.epoch, (float)r.top1);
            visc_tb_scalar(t->tb, "val/top5", t->state.epoch, (float)r.top5);
        }
        if (t->ema_params) {
            visc_eval_result e;
            if (evaluate_ema(t, &e)) return -1;
            if (t->rank == 0)
                printf("  EMA weights: val top1 %.2f%% top5 %.2f%%\n", e.top1, e.top5);
            log_json(t, "{\"type\":\"val_ema\",\"epoch\":%lld,\"top1\":%.4f,\"top5\":%.4f}",
                     (long long)t->state.epoch, e.top1, e.top5);
            if (t->tb) visc_tb_scalar(t->tb, "val/ema_top1", t->state.epoch, (float)e.top1);
        }
        if (t->tb) visc_tb_flush(t->tb);
        if (save_all(t, is_best)) return -1;
        /* curves.png beside the logs; a plot that fails never stops training */
        if (t->rank == 0 && visc_plot_run(c->output, NULL))
            fprintf(stderr, "visc: warning: %s\n", visc_last_error());
    }
    return 0;
}

static char *describe_config(const visc_train_config *c, const visc_model *m,
                             visc_precision precision) {
    char *s = visc_malloc(4096, "config text");
    snprintf(s, 4096,
             "{\"model\":\"%s\",\"dataset\":\"%s\",\"num_classes\":%d,\"in_channels\":%d,"
             "\"image_size\":%d,\"small_stem\":%d,\"width\":%d,\"epochs\":%d,\"batch_size\":%d,"
             "\"opt\":\"%s\",\"sched\":\"%s\",\"lr\":%g,\"momentum\":%g,\"weight_decay\":%g,"
             "\"nesterov\":%d,\"label_smoothing\":%g,\"drop_rate\":%g,\"drop_path_rate\":%g,"
             "\"seed\":%llu,\"precision\":\"%s\",\"device\":\"%s\"}",
             m->cfg.arch, c->dataset, m->cfg.num_classes, m->cfg.in_channels, m->cfg.image_size,
             m->cfg.small_stem, m->cfg.width, c->epochs, c->batch_size, c->opt, c->sched,
             (double)c->lr, (double)c->momentum, (double)c->weight_decay, c->nesterov,
             (double)c->label_smoothing, (double)m->cfg.drop_rate, (double)m->cfg.drop_path_rate,
             (unsigned long long)c->seed, visc_precision_name(precision), c->device);
    return s;
}

/* SyncBN's reduction of per-channel sums over the ranks. A failed
 * collective leaves the group broken, which the step's gradient sync
 * reports. */
static void bn_sync_allreduce(void *ctx, double *buf, int n) {
    visc_dist_allreduce(ctx, buf, (size_t)n, VISC_DT_F64, VISC_OP_SUM);
}

/* Identical starting point on every rank: rank 0's weights and buffers
 * (equal anyway when all are initialized from the same seed or files). */
static int share_weights(trainer *t) {
    visc_model *m = t->model;
    if (t->world == 1) return 0;
    if (visc_dist_broadcast(t->dist, m->params.data, m->params.total * sizeof(float), 0) ||
        share_buffers(t, m->buffers.data, NULL))
        return -1;
    if (t->ema_params &&
        visc_dist_broadcast(t->dist, t->ema_params, m->params.total * sizeof(float), 0))
        return -1;
    return 0;
}

/* --device cuda: the model and the optimizer's step move to the GPU once
 * everything that fills them on the host (weights, a checkpoint) is done.
 * What is not on the GPU yet is refused here, before any GPU is opened. */
static int open_gpu(trainer *t) {
    int index;
    if (visc_gpu_run_device(t->c, t->dist, &index)) return -1;
    if (index < 0) return 0;
    t->gpu = visc_gpu_open(index);
    if (!t->gpu || visc_gpu_memory_used(t->gpu, &t->gpu_mem_base)) return -1;
    visc_gpu_set_precision(t->gpu, t->precision);
    visc_gpu_set_conv_benchmark(t->gpu, t->c->cudnn_benchmark);
    if (visc_model_to_gpu(t->model, t->gpu)) return -1;
    t->gpu_opt = visc_gpu_optim_create(t->gpu, &t->opt);
    if (!t->gpu_opt) return -1;
    if (t->ema_params) { /* the EMA as loaded or started on the host */
        const size_t pb = t->model->params.total * sizeof(float);
        const size_t bb = t->model->buffers.total * sizeof(float);
        t->dev_ema_params = visc_gpu_alloc(t->gpu, pb);
        t->dev_ema_buffers = t->dev_ema_params ? visc_gpu_alloc(t->gpu, bb) : NULL;
        if (!t->dev_ema_buffers) return -1;
        visc_gpu_upload(t->gpu, t->dev_ema_params, t->ema_params, pb);
        visc_gpu_upload(t->gpu, t->dev_ema_buffers, t->ema_buffers, bb);
    }
    visc_gpu_pin_loader(t->gpu, t->loader, &t->pins);
    const visc_model_config *mc = &t->model->cfg;
    const size_t sample = (size_t)mc->in_channels * mc->image_size * mc->image_size *
                          (t->byte_batches ? 1 : sizeof(float));
    t->stage = visc_gpu_stage_create(t->gpu, mc->batch, mc->num_classes, sample, t->use_mixup);
    return t->stage ? 0 : -1;
}

static void trainer_free(trainer *t) {
    visc_grad_sync_free(t->gsync);
    visc_gpu_comm_close(t->comm); /* before the gradients it writes are freed */
    if (t->tb) visc_tb_close(t->tb);
    if (t->log) fclose(t->log);
    visc_optimizer_free(&t->opt);
    visc_gpu_optim_free(t->gpu_opt);
    visc_gpu_free(t->gpu, t->dev_ema_params);
    visc_gpu_free(t->gpu, t->dev_ema_buffers);
    visc_gpu_stage_free(t->stage);
    if (t->model) visc_model_destroy(t->model); /* its GPU memory too */
    visc_gpu_unpin(&t->pins);
    visc_gpu_close(t->gpu);
    visc_loader_free(t->loader);
    t->loader = NULL;
    if (t->train) visc_dataset_free(t->train);
    if (t->val) visc_dataset_free(t->val);
    visc_free_aligned(t->targets);
    visc_free_aligned(t->probs);
    visc_free_aligned(t->dlogits);
    visc_free_aligned(t->ema_params);
    visc_free_aligned(t->ema_buffers);
    free(t->config_text);
}

static int access_save(visc_train_access *a, const char *path) {
    trainer *t = a->trainer;
    return visc_save_checkpoint(t->model, &t->opt, t->ema_params, t->ema_buffers, &t->state,
                                t->config_text, path);
}

static int access_load(visc_train_access *a, const char *path) {
    trainer *t = a->trainer;
    return visc_load_checkpoint(t->model, &t->opt, t->ema_params, t->ema_buffers, &t->state, path);
}

int visc_train(const visc_train_config *c) {
    trainer t;
    memset(&t, 0, sizeof t);
    t.c = c;
    t.last_eval_step = -1;
    int rc = -1;
    /* Under mpirun: this process is one rank of the job. Alone: a group of
     * one, and nothing below talks to anybody. */
    t.dist = visc_dist_open(c->dist_backend, c->dist_timeout > 0 ? c->dist_timeout : 300);
    if (!t.dist) return -1;
    t.rank = visc_dist_rank(t.dist);
    t.world = visc_dist_world(t.dist);
    int workers = c->workers;
    if (c->threads > 0) visc_set_num_threads(c->threads);
    if (visc_dist_local_world(t.dist) > 1) {
        /* the machine's cores shared between its ranks */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int share = (int)(cores / visc_dist_local_world(t.dist));
        if (share < 1) share = 1;
        if (c->threads <= 0) visc_set_num_threads(share);
        if (workers <= 0) workers = share;
    }
    if (c->batch_size < 1 || c->epochs < 0) {
        visc_set_error("--batch-size must be >= 1 and --epochs >= 0");
        goto done;
    }
    if (c->batch_size % t.world) {
        visc_set_error("--batch-size %d (the whole job's) does not split evenly over %d processes",
                       c->batch_size, t.world);
        goto done;
    }
    /* this rank's share of every batch */
    const int B = c->batch_size / t.world;
    /* Process-wide and set on every run, so a fp32 run after a bf16 one is
     * fp32. On a GPU the products are the device's (open_gpu), which has
     * bf16 whatever the host CPU has; the host then does none. */
    visc_precision precision;
    if (visc_parse_precision(c->precision, &precision)) goto done;
    int gpu_index; /* checked now; the GPU itself is opened once the model is ready */
    if (visc_parse_device(c->device, &gpu_index)) goto done;
    if (gpu_index < 0) precision = visc_set_matmul_precision(precision);
    else visc_set_matmul_precision(VISC_PRECISION_FP32);
    t.precision = precision;
    const char *data_name = c->dataset;
    if (visc_is_image_data(c->data_dir)) {
        /* image files: decoded and augmented per sample by the recipe */
        int size = c->model.image_size > 0 ? c->model.image_size : 224;
        data_name = c->data_dir;
        t.train = visc_open_image_data(c, 1, size, &t.recipe[0], &t.pipeline[0]);
        if (!t.train) goto done;
        t.val = visc_open_image_data(c, 0, size, &t.recipe[1], &t.pipeline[1]);
        if (!t.val) goto done;
    } else {
        t.train = visc_open_dataset(c->dataset, c->data_dir, 1, &t.aug);
        if (!t.train) goto done;
        /* --subset: the same per-class draw as on image folders */
        if (c->subset > 0 && visc_dataset_keep_per_class(t.train, c->subset, c->seed)) goto done;
        t.val = visc_open_dataset(c->dataset, c->data_dir, 0, &t.aug);
        if (!t.val) goto done;
        t.aug.pad_crop = c->pad_crop;
        t.aug.hflip = c->hflip;
        /* --input-size larger than the images: centre them on a zero canvas
         * (Fashion-MNIST's 28 px for models that want 32). */
        if (c->model.image_size > 0 && c->model.image_size != t.train->height) {
            if (visc_dataset_pad_to(t.train, c->model.image_size) ||
                visc_dataset_pad_to(t.val, c->model.image_size)) {
                visc_set_error("--input-size %d: %s", c->model.image_size, visc_last_error());
                goto done;
            }
        }
    }
    if (t.val->num_classes != t.train->num_classes) {
        visc_set_error("the validation data has %d classes, the training data %d",
                       t.val->num_classes, t.train->num_classes);
        goto done;
    }
    visc_on_bad on_bad;
    if (!strcmp(c->on_bad_image, "skip")) on_bad = VISC_ON_BAD_SKIP;
    else if (!strcmp(c->on_bad_image, "error")) on_bad = VISC_ON_BAD_ERROR;
    else {
        visc_set_error("--on-bad-image: expected skip or error, got '%s'", c->on_bad_image);
        goto done;
    }
    visc_loader_config lc = {.batch_size = B,
                             .workers = workers,
                             .shuffle = 1,
                             .drop_last = 1,
                             .train = 1,
                             .rank = t.world == 1 && c->shard_count > 0 ? c->shard_index : t.rank,
                             .world = t.world == 1 && c->shard_count > 0 ? c->shard_count : t.world,
                             .seed = c->seed,
                             .aug = t.aug,
                             .on_bad = on_bad};
    /* On a GPU, image data without batch mixing (which works on the
     * floats) crosses the bus as bytes: 38.5 MB a step for ResNet-50 at
     * batch 256 instead of 154, and the GPU normalizes them. */
    t.byte_batches = lc.bytes = gpu_index >= 0 && t.train->get_bytes && t.train->channels == 3 &&
                                c->mixup == 0 && c->cutmix == 0;
    t.loader = visc_loader_new(t.train, &lc);
    if (!t.loader) goto done;
    t.steps_per_epoch = visc_loader_batches(t.loader);
    if (t.steps_per_epoch < 1 && !c->evaluate) {
        visc_set_error("--batch-size %d is larger than the training set (%lld samples)",
                       c->batch_size, (long long)t.train->size);
        goto done;
    }

    visc_model_config mc = c->model;
    mc.num_classes = mc.num_classes > 0 ? mc.num_classes : t.train->num_classes;
    mc.in_channels = t.train->channels;
    mc.image_size = t.train->height;
    mc.batch = B;
    mc.for_gpu = gpu_index >= 0;
    if (mc.num_classes < t.train->num_classes) {
        visc_set_error("--num-classes %d is smaller than the dataset's %d classes", mc.num_classes,
                       t.train->num_classes);
        goto done;
    }
    t.model = visc_model_create(&mc, c->seed);
    if (!t.model) goto done;
    visc_model *m = t.model;

    visc_opt_config oc;
    visc_opt_kind kind;
    if (visc_opt_parse_kind(c->opt, &kind)) goto done;
    oc = visc_opt_defaults(kind);
    if (kind == VISC_OPT_SGD || kind == VISC_OPT_LARS) {
        oc.momentum = c->momentum;
        oc.nesterov = c->nesterov;
    }
    oc.weight_decay = c->weight_decay;
    oc.decay_norm_and_bias = c->decay_norm_and_bias;
    visc_optimizer_init(&t.opt, &oc, &m->params);
    if (setup_schedule(&t, t.steps_per_epoch)) goto done;

    int K = mc.num_classes;
    if (c->mixup != 0 || c->cutmix != 0) {
        t.mixup = visc_mixup_default(K);
        t.mixup.mixup_alpha = c->mixup;
        t.mixup.cutmix_alpha = c->cutmix;
        t.mixup.prob = c->mixup_prob;
        t.mixup.switch_prob = c->mixup_switch_prob;
        t.mixup.label_smoothing = c->label_smoothing;
        if (visc_mixup_validate(&t.mixup)) goto done;
        if (B < 2) {
            visc_set_error("--mixup/--cutmix need --batch-size >= 2");
            goto done;
        }
        t.use_mixup = 1;
        t.targets = visc_alloc_aligned((size_t)B * K * sizeof(float), "soft targets");
    }
    t.probs = visc_alloc_aligned((size_t)B * K * sizeof(float), "probabilities");
    t.dlogits = visc_alloc_aligned((size_t)B * K * sizeof(float), "logit gradients");
    if (c->ema_decay > 0) {
        t.ema_params = visc_alloc_aligned(m->params.total * sizeof(float), "EMA weights");
        t.ema_buffers = visc_alloc_aligned(m->buffers.total * sizeof(float), "EMA buffers");
        memcpy(t.ema_params, m->params.data, m->params.total * sizeof(float));
        memcpy(t.ema_buffers, m->buffers.data, m->buffers.total * sizeof(float));
    }
    t.config_text = describe_config(c, m, t.precision);

    if (c->weights[0]) {
        /* --reset-head: the file is a backbone; a fresh classifier, as a
         * new torch.nn.Linear (the SSL benchmark's finetune evaluation) */
        if (c->reset_head) {
            if (visc_load_model_backbone(m, c->weights)) goto done;
            visc_reset_head(m, c->seed);
        } else if (visc_load_model(m, c->weights)) goto done;
        if (t.ema_params) {
            memcpy(t.ema_params, m->params.data, m->params.total * sizeof(float));
            memcpy(t.ema_buffers, m->buffers.data, m->buffers.total * sizeof(float));
        }
    }
    if (c->resume[0]) {
        if (visc_load_checkpoint(m, &t.opt, t.ema_params, t.ema_buffers, &t.state, c->resume))
            goto done;
        if (t.rank == 0)
            printf("resumed from %s at epoch %lld, step %lld\n", c->resume,
                   (long long)t.state.epoch, (long long)t.state.step);
        /* Each rank's own cursor when the job has the same shape; any other
         * number of processes starts every rank at step x per-rank batch
         * (exact unless images were skipped earlier in the epoch). */
        if (t.state.world != t.world) t.state.sample_pos = -1;
        else if (t.world > 1) t.state.sample_pos = t.state.rank_pos[t.rank];
    }
    if (share_weights(&t) || open_gpu(&t)) goto done;
    visc_train_access access = {.model = m,
                                .opt = &t.opt,
                                .state = &t.state,
                                .ema_params = t.ema_params,
                                .ema_buffers = t.ema_buffers,
                                .train_size = t.train->size,
                                .batch_size = B,
                                .max_steps = c->max_steps,
                                .save = access_save,
                                .load = access_load,
                                .trainer = &t};
    if (c->hooks) {
        int64_t sched_steps = 0;
        int started = c->hooks->start(c->hooks->ctx, &access, &sched_steps);
        if (started < 0) goto done;
        if (started > 0) { /* the hooks did the run's work (an auxiliary swarm peer) */
            rc = 0;
            goto done;
        }
        if (sched_steps > 0 && setup_schedule(&t, sched_steps)) goto done;
    }
    if (t.world > 1) {
        size_t bucket = (size_t)((c->bucket_cap_mb >= 0 ? c->bucket_cap_mb : 25.0f) * 1048576.0f);
        visc_grad_transport on_gpu = {0};
        if (t.gpu) { /* the buckets are averaged where the gradients are */
            t.comm =
                visc_gpu_comm_open(t.gpu, t.dist, c->gpu_allreduce, m->dev_grads, m->params.total);
            if (!t.comm) goto done;
            on_gpu = visc_gpu_comm_transport(t.comm);
        }
        t.gsync = visc_grad_sync_new(t.dist, &m->params, t.gpu ? m->dev_grads : m->grads, bucket,
                                     t.gpu ? &on_gpu : NULL);
        m->grad_ready = visc_grad_sync_ready;
        m->grad_ready_ctx = t.gsync;
        if (c->sync_bn) {
            if (!m->set_bn_sync) {
                visc_set_error("--sync-bn: %s has no BatchNorm layers", mc.arch);
                goto done;
            }
            m->set_bn_sync(m, bn_sync_allreduce, t.dist);
        }
    }

    if (c->evaluate) {
        visc_eval_result r;
        if (visc_evaluate_shard(m, t.val, &t.aug, c->label_smoothing, t.dist, &r)) goto done;
        if (t.rank == 0)
            printf("evaluate %s on %s test set (%lld images): loss %.4f top1 %.2f%% top5 %.2f%%\n",
                   mc.arch, data_name, (long long)r.count, r.loss, r.top1, r.top5);
        rc = 0;
        goto done;
    }

    if (t.rank == 0) { /* the job's files and words are rank 0's */
        if (visc_mkdirs(c->output)) goto done;
        char path[1024];
        snprintf(path, sizeof path, "%s/log.jsonl", c->output);
        t.log = fopen(path, c->resume[0] ? "a" : "w");
        if (!t.log) {
            visc_set_error("cannot write %s: %s", path, strerror(errno));
            goto done;
        }
        t.tb = visc_tb_open(c->output);
        if (!t.tb) goto done;
        log_json(&t, "{\"type\":\"config\",\"config\":%s}", t.config_text);
        char procs[128] = "";
        if (t.world > 1)
            snprintf(procs, sizeof procs, " (%d processes x %d, %s%s%s)", t.world, B,
                     visc_dist_backend_name(t.dist), t.comm ? ", GPU gradients " : "",
                     t.comm ? visc_gpu_comm_name(t.comm) : "");
        printf("training %s (%.2fM parameters, %.1f MFLOP/image forward, %.0f MiB of "
               "activations%s) on %s: %lld train / "
               "%lld test images, %d epochs of %lld steps, batch %d%s, %d threads%s%s%s%s\n",
               mc.arch, m->params.total / 1e6, m->flops_per_image / 1e6,
               (double)m->activation_bytes / (1 << 20),
               mc.grad_checkpointing ? ", recomputed in backward" : "", data_name,
               (long long)t.train->size, (long long)t.val->size, c->epochs,
               (long long)t.steps_per_epoch, c->batch_size, procs, visc_num_threads(),
               precision == VISC_PRECISION_BF16 ? ", bf16 matmuls" : "", t.gpu ? ", on " : "",
               t.gpu ? c->device : "", t.byte_batches ? " (batches as bytes)" : "");
    }
    double t0 = visc_now();
    int r = run_epochs(&t);
    if (r < 0) goto done;
    if (t.world > 1 && t.rank == 0)
        printf("communication: %.1fs waited for all-reduce and other collectives on rank 0 "
               "(%.1f%% of the run)\n",
               visc_dist_wait_seconds(t.dist),
               100.0 * visc_dist_wait_seconds(t.dist) / (visc_now() - t0));
    if (t.gpu && t.rank == 0) visc_gpu_print_memory(t.gpu, t.gpu_mem_base);
    if (r == 0 && t.rank == 0) {
        printf("done: best val top1 %.2f%% in %.0fs; checkpoints and logs in %s/\n",
               t.state.best_top1, visc_now() - t0, c->output);
        log_json(&t, "{\"type\":\"done\",\"best_top1\":%.4f,\"seconds\":%.1f}", t.state.best_top1,
                 visc_now() - t0);
    }
    rc = 0;
done:
    if (c->hooks && c->hooks->finish) c->hooks->finish(c->hooks->ctx);
    trainer_free(&t);
    if (rc && t.world > 1) {
        /* One rank failing fails the job: say why here, then end every
         * rank now rather than leave them waiting in a collective. */
        fprintf(stderr, "visc: rank %d: %s\n", t.rank, visc_last_error());
        visc_dist_abort(t.dist);
    }
    visc_dist_close(t.dist);
    return rc;
}

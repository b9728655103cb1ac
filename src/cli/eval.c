/* eval.c: `visc eval knn|linear|finetune`: the SSL benchmark's three
 * evaluations of a weights file, with the reference protocol's defaults
 * (ssl-benchmark.md; lightly's ImageNet benchmark):
 *
 *   knn       L2-normalized pooled features, eval transform on both splits,
 *             k = 200, t = 0.1 (both printed with every result)
 *   linear    frozen backbone in eval mode, Linear(D, C): 90 epochs, SGD
 *             lr 0.1 x batch / 256, momentum 0.9, wd 0, cosine per step,
 *             batch 256, RandomResizedCrop(0.08-1) + flip; best epoch
 *   finetune  all parameters, backbone in train mode, a fresh classifier:
 *             30 epochs, SGD lr 0.05 x batch / 256, momentum 0.9, wd 0,
 *             cosine per step (visc train --reset-head); best epoch
 *
 * Every flag of `visc train` that describes the model and the data works
 * here too (--model, --data/--dataset, --val-data, --input-size,
 * --small-stem, --crop-pct, --subset, --threads, --seed, ...): they are
 * parsed by the same table. Results go to stdout and, as JSON with the
 * settings and the wall time, to OUTPUT/eval_<mode>.json. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "options.h"
#include "visc/gpu.h"
#include "visc/io.h"
#include "visc/ssl_eval.h"

typedef struct {
    char mode[16];
    int k;
    float t;
    int random_weights;
    int lr_given, epochs_given, batch_given, momentum_given, wd_given, output_given;
    visc_train_config c;
} eval_args;

static void usage(FILE *f) {
    fputs("usage: visc eval knn|linear|finetune --weights FILE --model ARCH --data SPEC [options]\n"
          "\n"
          "Evaluates a backbone (any model file of a visc architecture, e.g. the\n"
          "model_last.safetensors of `visc pretrain` or `visc train`) as the SSL\n"
          "benchmark does:\n"
          "  knn       weighted kNN on L2-normalized pooled features (eval transform)\n"
          "  linear    a linear classifier on the frozen backbone (eval mode)\n"
          "  finetune  all parameters with a fresh classifier\n\n"
          "options (besides the model and data flags of `visc train --help`):\n"
          "  --weights FILE      the model file (its classifier is not needed)\n"
          "  --random-weights    evaluate the seeded random init instead (a baseline)\n"
          "  --k N               kNN neighbours (default 200)\n"
          "  --t T               kNN temperature (default 0.1)\n"
          "  --epochs N          linear 90, finetune 30\n"
          "  --batch-size N      default 256\n"
          "  --lr LR             peak lr (default linear 0.1, finetune 0.05, x batch / 256)\n"
          "  --momentum M        default 0.9\n"
          "  --wd W              default 0\n"
          "  --output DIR        where eval_<mode>.json goes (default runs/eval)\n",
          f);
}

static int parse_int(const char *flag, const char *v, int *out) {
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < 1 || x > 1 << 30)
        return visc_set_error("%s: expected a positive integer, got '%s'", flag, v);
    *out = (int)x;
    return 0;
}

static int parse_float(const char *flag, const char *v, float *out) {
    char *end;
    float x = strtof(v, &end);
    if (!*v || *end || !(x > 0) || x > 1e30f)
        return visc_set_error("%s: expected a positive number, got '%s'", flag, v);
    *out = x;
    return 0;
}

/* argument i names option `name` (--name, --name=V, or -alias) */
static int names(const char *arg, const char *name, const char *alias) {
    size_t n = strlen(name);
    if (arg[0] == '-' && arg[1] == '-' && !strncmp(arg + 2, name, n) &&
        (arg[2 + n] == 0 || arg[2 + n] == '='))
        return 1;
    return alias && arg[0] == '-' && arg[1] != '-' && !strcmp(arg + 1, alias);
}

static int parse_args(eval_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->k = VISC_KNN_DEFAULT_K;
    a->t = VISC_KNN_DEFAULT_T;
    if (argc < 1 || argv[0][0] == '-')
        return visc_set_error("eval: expected knn, linear or finetune (see `visc eval --help`)");
    if (strcmp(argv[0], "knn") && strcmp(argv[0], "linear") && strcmp(argv[0], "finetune"))
        return visc_set_error("eval: unknown evaluation '%s' (knn, linear or finetune)", argv[0]);
    snprintf(a->mode, sizeof a->mode, "%s", argv[0]);
    /* our own flags out; the rest goes to the `visc train` option table */
    char **rest = visc_malloc((size_t)argc * sizeof(char *), "eval arguments");
    int nrest = 0, rc = 0;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *arg = argv[i];
        const char *value = NULL;
        int is_k = names(arg, "k", NULL), is_t = names(arg, "t", NULL);
        if (is_k || is_t) {
            const char *eq = strchr(arg, '=');
            if (eq) value = eq + 1;
            else if (i + 1 < argc) value = argv[++i];
            else {
                rc = visc_set_error("option '%s' needs a value", arg);
                break;
            }
            rc = is_k ? parse_int("--k", value, &a->k) : parse_float("--t", value, &a->t);
            continue;
        }
        if (!strcmp(arg, "--random-weights")) {
            a->random_weights = 1;
            continue;
        }
        if (names(arg, "config", "c")) {
            rc = visc_set_error("eval: --config is not supported; give the settings as flags");
            break;
        }
        a->lr_given |= names(arg, "lr", NULL);
        a->epochs_given |= names(arg, "epochs", NULL);
        a->batch_given |= names(arg, "batch-size", "b");
        a->momentum_given |= names(arg, "momentum", NULL);
        a->wd_given |= names(arg, "wd", NULL) || names(arg, "weight-decay", NULL);
        a->output_given |= names(arg, "output", "o");
        rest[nrest++] = argv[i];
    }
    if (rc == 0) rc = visc_parse_train_args(&a->c, nrest, rest);
    free(rest);
    if (rc) return -1;
    visc_train_config *c = &a->c;
    if (!c->weights[0] && !a->random_weights)
        return visc_set_error("eval: --weights FILE is required (or --random-weights for a "
                              "random-init baseline)");
    if (c->weights[0] && a->random_weights)
        return visc_set_error("eval: --weights and --random-weights exclude each other");
    if (!a->batch_given) c->batch_size = 256;
    if (c->batch_size < 1) return visc_set_error("--batch-size must be >= 1");
    if (!a->output_given) snprintf(c->output, sizeof c->output, "runs/eval");
    if (!a->momentum_given) c->momentum = 0.9f;
    if (!a->wd_given) c->weight_decay = 0.0f;
    if (strcmp(a->mode, "knn") && (!strcmp(c->aug, "mocov2") || !strcmp(c->aug, "simclr")))
        return visc_set_error("eval %s: --aug %s is a two-view pretraining recipe; the protocol "
                              "trains with torchvision (RandomResizedCrop + flip)",
                              a->mode, c->aug);
    int linear = !strcmp(a->mode, "linear");
    if (!a->epochs_given) c->epochs = linear ? 90 : 30;
    if (!a->lr_given) c->lr = (linear ? 0.1f : 0.05f) * (float)c->batch_size / 256.0f;
    return 0;
}

/* The rank of this process under a launcher (0 alone): after visc_train,
 * whose process group is closed, only rank 0 reports. */
static int launcher_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

/* ---- JSON output ---- */
typedef struct {
    char buf[8192];
    size_t used;
} jbuf;

static void jraw(jbuf *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jraw(jbuf *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (j->used < sizeof j->buf) {
        int n = vsnprintf(j->buf + j->used, sizeof j->buf - j->used, fmt, ap);
        if (n > 0) j->used += (size_t)n;
        if (j->used > sizeof j->buf) j->used = sizeof j->buf;
    }
    va_end(ap);
}

static void jstr(jbuf *j, const char *key, const char *text) {
    jraw(j, "\"%s\":\"", key);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\') jraw(j, "\\%c", *p);
        else if (*p < 0x20) jraw(j, "\\u%04x", *p);
        else jraw(j, "%c", *p);
    }
    jraw(j, "\",");
}

/* The settings every evaluation shares (trailing comma left for more). */
static void common_settings(jbuf *j, const eval_args *a, int world) {
    const visc_train_config *c = &a->c;
    jstr(j, "model", c->model.arch);
    jstr(j, "weights", a->random_weights ? "(random init)" : c->weights);
    jstr(j, "data", visc_is_image_data(c->data_dir) ? c->data_dir : c->dataset);
    jstr(j, "val_data", c->val_data);
    jraw(j,
         "\"input_size\":%d,\"crop_pct\":%g,\"small_stem\":%d,\"batch_size\":%d,\"seed\":%llu,"
         "\"processes\":%d,\"threads\":%d,",
         c->model.image_size, (double)c->crop_pct, c->model.small_stem, c->batch_size,
         (unsigned long long)c->seed, world, visc_num_threads());
    jstr(j, "device", c->device);
    jstr(j, "precision", c->precision);
}

/* --precision and --device for the backbone of knn and linear: on a GPU
 * the model moves there (its forward uploads each batch and brings the
 * features back); the feature banks, the kNN and the probe's head stay on
 * the host. */
static int place_model(const visc_train_config *c, visc_dist *d, visc_model *m, visc_cuda **gpu) {
    visc_precision p;
    int index;
    if (visc_parse_precision(c->precision, &p) || visc_gpu_run_device(c, d, &index)) return -1;
    if (index < 0) {
        visc_set_matmul_precision(p);
        return 0;
    }
    visc_set_matmul_precision(VISC_PRECISION_FP32); /* the host's products: the head's */
    if (!(*gpu = visc_gpu_open(index))) return -1;
    visc_gpu_set_precision(*gpu, p);
    return visc_model_to_gpu(m, *gpu);
}

static int write_json(const eval_args *a, jbuf *j) {
    if (visc_mkdirs(a->c.output)) return -1;
    if (j->used >= sizeof j->buf) return visc_set_error("eval: JSON summary too long");
    char path[1100];
    snprintf(path, sizeof path, "%s/eval_%s.json", a->c.output, a->mode);
    const void *parts[1] = {j->buf};
    size_t sizes[1] = {j->used};
    if (visc_write_file_atomic(path, parts, sizes, 1)) return -1;
    printf("wrote %s\n", path);
    return 0;
}

static const char *data_name(const visc_train_config *c) {
    return visc_is_image_data(c->data_dir) ? c->data_dir : c->dataset;
}

/* ---- the three evaluations ---- */

static int run_knn(eval_args *a, visc_dist *d) {
    const visc_train_config *c = &a->c;
    int rank = visc_dist_rank(d), world = visc_dist_world(d);
    double t0 = visc_now();
    visc_augment aug[2];
    visc_transform_config tc[2];
    visc_sample_pipeline pl[2];
    visc_dataset *bank_ds = NULL, *val_ds = NULL;
    visc_model *m = NULL;
    visc_cuda *gpu = NULL;
    visc_feature_bank bank = {0}, val = {0};
    int rc = -1;
    if (!(bank_ds = visc_eval_open_data(c, 0, &aug[0], &tc[0], &pl[0]))) goto out;
    if (!(val_ds = visc_eval_open_data(c, 2, &aug[1], &tc[1], &pl[1]))) goto out;
    if (!(m = visc_eval_model(c, bank_ds, c->batch_size / world))) goto out;
    if (place_model(c, d, m, &gpu) || visc_extract_features(m, bank_ds, &aug[0], 1, d, &bank) ||
        visc_extract_features(m, val_ds, &aug[1], 1, d, &val))
        goto out;
    double t_feat = visc_now() - t0;
    /* each rank classifies a contiguous share of the queries */
    int64_t q0 = val.count * rank / world, q1 = val.count * (rank + 1) / world;
    visc_feature_bank share = val;
    share.feats = val.feats + (size_t)q0 * val.dim;
    share.labels = val.labels + q0;
    share.count = q1 - q0;
    visc_knn_counts k;
    if (visc_knn_classify(&bank, &share, a->k, a->t, &k)) goto out;
    double sums[3] = {(double)k.top1, (double)k.top5, (double)k.count};
    if (world > 1 && visc_dist_allreduce(d, sums, 3, VISC_DT_F64, VISC_OP_SUM)) goto out;
    double top1 = sums[2] > 0 ? 100.0 * sums[0] / sums[2] : 0;
    double top5 = sums[2] > 0 ? 100.0 * sums[1] / sums[2] : 0;
    double wall = visc_now() - t0;
    int k_used = (int64_t)a->k > bank.count ? (int)bank.count : a->k;
    rc = 0;
    if (rank != 0) goto out;
    printf("kNN k=%d t=%g: %s on %s: top1 %.2f%% top5 %.2f%% (%lld val / %lld bank images, "
           "%d-d features; %.1fs, features %.1fs%s%s)\n",
           a->k, (double)a->t, c->model.arch, data_name(c), top1, top5, (long long)sums[2],
           (long long)bank.count, bank.dim, wall, t_feat, gpu ? " on " : "", gpu ? c->device : "");
    if (k_used != a->k)
        printf("note: k=%d is larger than the bank: all %d bank images vote\n", a->k, k_used);
    jbuf j = {.used = 0};
    jraw(&j, "{\"eval\":\"knn\",\"metrics\":{\"knn_top1\":%.4f,\"knn_top5\":%.4f},\"settings\":{",
         top1, top5);
    jraw(&j,
         "\"k\":%d,\"t\":%g,\"k_used\":%d,\"feature_dim\":%d,\"bank_size\":%lld,"
         "\"val_size\":%lld,\"normalized\":true,",
         a->k, (double)a->t, k_used, bank.dim, (long long)bank.count, (long long)sums[2]);
    common_settings(&j, a, world);
    j.used--; /* the last comma */
    jraw(&j, "},\"wall_time_s\":%.2f,\"feature_time_s\":%.2f}\n", wall, t_feat);
    rc = write_json(a, &j);
out:
    visc_feature_bank_free(&bank);
    visc_feature_bank_free(&val);
    if (m) visc_model_destroy(m); /* its GPU memory too */
    visc_gpu_close(gpu);
    if (bank_ds) visc_dataset_free(bank_ds);
    if (val_ds) visc_dataset_free(val_ds);
    return rc;
}

static int run_linear(eval_args *a, visc_dist *d) {
    const visc_train_config *c = &a->c;
    int rank = visc_dist_rank(d), world = visc_dist_world(d);
    double t0 = visc_now();
    visc_augment aug[2];
    visc_transform_config tc[2];
    visc_sample_pipeline pl[2];
    visc_dataset *train_ds = NULL, *val_ds = NULL;
    visc_model *m = NULL;
    visc_cuda *gpu = NULL;
    float *head = NULL;
    int rc = -1;
    if (!(train_ds = visc_eval_open_data(c, 1, &aug[0], &tc[0], &pl[0]))) goto out;
    if (!(val_ds = visc_eval_open_data(c, 2, &aug[1], &tc[1], &pl[1]))) goto out;
    if (!(m = visc_eval_model(c, train_ds, c->batch_size / world)) || place_model(c, d, m, &gpu))
        goto out;
    visc_linear_probe_config pc;
    visc_linear_probe_defaults(&pc);
    pc.epochs = c->epochs;
    pc.lr = c->lr;
    pc.momentum = c->momentum;
    pc.weight_decay = c->weight_decay;
    pc.seed = c->seed;
    pc.workers = c->workers;
    pc.verbose = 1;
    int C = train_ds->num_classes, D = m->feature_dim;
    if (rank == 0)
        printf("linear probe of %s on %s: %lld train / %lld val images, %d-d features, %d "
               "epochs, batch %d, SGD lr %g momentum %g wd %g, cosine per step%s%s\n",
               c->model.arch, data_name(c), (long long)train_ds->size, (long long)val_ds->size, D,
               pc.epochs, c->batch_size, (double)pc.lr, (double)pc.momentum,
               (double)pc.weight_decay, gpu ? ", backbone on " : "", gpu ? c->device : "");
    head = visc_malloc(((size_t)C * D + C) * sizeof(float), "probe head");
    visc_linear_probe_result r;
    if (visc_linear_probe(m, train_ds, &aug[0], val_ds, &aug[1], &pc, d, head, &r)) goto out;
    double wall = visc_now() - t0;
    rc = 0;
    if (rank != 0) goto out;
    printf("linear: %s on %s: best top1 %.2f%% top5 %.2f%% (epoch %d of %d; last top1 %.2f%% "
           "top5 %.2f%%) in %.0fs\n",
           c->model.arch, data_name(c), r.best_top1, r.best_top5, r.best_epoch, pc.epochs,
           r.last_top1, r.last_top5, wall);
    /* the backbone with the probe as its classifier: a complete model file */
    char path[1100] = "";
    if (m->cfg.num_classes == C && visc_set_head(m, head, head + (size_t)C * D, C) == 0) {
        snprintf(path, sizeof path, "%s/model_linear.safetensors", c->output);
        if (visc_mkdirs(c->output) || visc_save_model(m, path, NULL)) {
            rc = -1;
            goto out;
        }
    }
    jbuf j = {.used = 0};
    jraw(&j,
         "{\"eval\":\"linear\",\"metrics\":{\"linear_top1\":%.4f,\"linear_top5\":%.4f,"
         "\"best_epoch\":%d,\"last_top1\":%.4f,\"last_top5\":%.4f,\"last_train_loss\":%.6f},"
         "\"settings\":{",
         r.best_top1, r.best_top5, r.best_epoch, r.last_top1, r.last_top5, r.last_loss);
    jraw(&j,
         "\"epochs\":%d,\"steps\":%lld,\"opt\":\"sgd\",\"lr\":%g,\"momentum\":%g,"
         "\"weight_decay\":%g,\"sched\":\"cosine per step to %gx\",\"backbone\":\"frozen, eval "
         "mode\",",
         pc.epochs, (long long)r.steps, (double)pc.lr, (double)pc.momentum, (double)pc.weight_decay,
         (double)pc.end_lr_factor);
    jstr(&j, "aug", visc_is_image_data(c->data_dir) ? c->aug : "pad-crop+flip");
    jstr(&j, "model_file", path);
    common_settings(&j, a, world);
    j.used--;
    jraw(&j, "},\"wall_time_s\":%.2f}\n", wall);
    rc = write_json(a, &j);
out:
    free(head);
    if (m) visc_model_destroy(m); /* its GPU memory too */
    visc_gpu_close(gpu);
    if (train_ds) visc_dataset_free(train_ds);
    if (val_ds) visc_dataset_free(val_ds);
    return rc;
}

static int run_finetune(eval_args *a) {
    visc_train_config *c = &a->c;
    double t0 = visc_now();
    c->reset_head = c->weights[0] != 0;
    c->nesterov = 0; /* torch.optim.SGD's default, as the benchmark */
    snprintf(c->opt, sizeof c->opt, "sgd");
    snprintf(c->sched, sizeof c->sched, "cosine");
    c->warmup_epochs = 0;
    c->min_lr = 0.001f * c->lr; /* lightly's cosine ends at 0.001x */
    if (visc_train(c)) return -1;
    if (launcher_rank() != 0) return 0;
    int epoch;
    double top1, top5, wall = visc_now() - t0;
    if (visc_best_val_epoch(c->output, &epoch, &top1, &top5)) return -1;
    printf("finetune: %s on %s: best top1 %.2f%% top5 %.2f%% (epoch %d of %d) in %.0fs\n",
           c->model.arch, data_name(c), top1, top5, epoch, c->epochs, wall);
    jbuf j = {.used = 0};
    jraw(&j,
         "{\"eval\":\"finetune\",\"metrics\":{\"finetune_top1\":%.4f,\"finetune_top5\":%.4f,"
         "\"best_epoch\":%d},\"settings\":{",
         top1, top5, epoch);
    jraw(&j,
         "\"epochs\":%d,\"opt\":\"sgd\",\"lr\":%g,\"momentum\":%g,\"weight_decay\":%g,"
         "\"sched\":\"cosine per step to 0.001x\",\"reset_head\":%d,\"backbone\":\"trained, "
         "train mode\",",
         c->epochs, (double)c->lr, (double)c->momentum, (double)c->weight_decay, c->reset_head);
    jstr(&j, "aug", visc_is_image_data(c->data_dir) ? c->aug : "pad-crop+flip");
    common_settings(&j, a, 1);
    j.used--;
    jraw(&j, "},\"wall_time_s\":%.2f}\n", wall);
    return write_json(a, &j);
}

int visc_cmd_eval(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    eval_args a;
    if (parse_args(&a, argc, argv)) visc_die("%s", visc_last_error());
    if (!strcmp(a.mode, "finetune")) {
        if (run_finetune(&a)) visc_die("%s", visc_last_error());
        return 0;
    }
    if (a.c.threads > 0) visc_set_num_threads(a.c.threads);
    visc_dist *d = visc_dist_open(a.c.dist_backend, a.c.dist_timeout > 0 ? a.c.dist_timeout : 300);
    if (!d) visc_die("%s", visc_last_error());
    int world = visc_dist_world(d);
    int rc;
    if (a.c.batch_size % world)
        rc = visc_set_error("--batch-size %d does not split evenly over %d processes",
                            a.c.batch_size, world);
    else rc = !strcmp(a.mode, "knn") ? run_knn(&a, d) : run_linear(&a, d);
    if (rc) {
        if (world > 1) {
            fprintf(stderr, "visc: rank %d: %s\n", visc_dist_rank(d), visc_last_error());
            visc_dist_abort(d);
        }
        visc_dist_close(d);
        visc_die("%s", visc_last_error());
    }
    visc_dist_close(d);
    return 0;
}

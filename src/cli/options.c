/* options.c: `visc train` flags and config-file keys, one table for both.
 * A config file (--config FILE, INI) sets the same keys as the long flags
 * (without the dashes); flags given on the command line override it. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "visc/io.h"
#include "visc/ssl.h"

enum kind { STR, INT, FLOAT, U64, FLAG, NOFLAG };

typedef struct {
    const char *name, *alias;
    enum kind kind;
    size_t offset, size;
    const char *help;
} option;

#define O(field) offsetof(visc_train_config, field), sizeof(((visc_train_config *)0)->field)
static const option options[] = {
    {"model", "arch", STR, O(model.arch), "architecture (see `visc models`)"},
    {"dataset", NULL, STR, O(dataset), "fashion-mnist | mnist | cifar10"},
    {"data", NULL, STR, O(data_dir),
     "dataset folder, or images: imagefolder:DIR | imagenet:DIR | flat:DIR | pack:DIR"},
    {"val-data", NULL, STR, O(val_data), "images: validation spec (default: beside --data)"},
    {"aug", NULL, STR, O(aug), "images: recipe torchvision | timm | mocov2 | simclr"},
    {"interpolation", NULL, STR, O(interp), "images: bilinear | bicubic | nearest"},
    {"scale", NULL, STR, O(scale), "images: RandomResizedCrop scale range, e.g. 0.08,1"},
    {"ratio", NULL, STR, O(ratio), "images: RandomResizedCrop aspect range, e.g. 0.75,1.3333"},
    {"aa", NULL, STR, O(aa), "images: RandAugment, e.g. rand-m9-mstd0.5-inc1"},
    {"color-jitter", NULL, FLOAT, O(color_jitter), "images: ColorJitter strength (0: off)"},
    {"reprob", NULL, FLOAT, O(reprob), "images: RandomErasing probability"},
    {"crop-pct", NULL, FLOAT, O(crop_pct), "images: eval center-crop fraction"},
    {"fast-decode", NULL, FLAG, O(fast_decode), "images: decode only the crop, downscaled"},
    {"subset", NULL, INT, O(subset), "keep N training samples per class (seeded draw)"},
    {"on-bad-image", NULL, STR, O(on_bad_image), "images: skip | error"},
    {"mixup", NULL, FLOAT, O(mixup), "mixup alpha (0: off)"},
    {"cutmix", NULL, FLOAT, O(cutmix), "cutmix alpha (0: off)"},
    {"mixup-prob", NULL, FLOAT, O(mixup_prob), "probability of mixing a batch"},
    {"mixup-switch-prob", NULL, FLOAT, O(mixup_switch_prob),
     "probability of cutmix when both are on"},
    {"epochs", NULL, INT, O(epochs), "number of epochs"},
    {"batch-size", "b", INT, O(batch_size),
     "batch size (total over all processes under mpirun, split evenly)"},
    {"opt", NULL, STR, O(opt), "sgd | adamw | lamb | lars"},
    {"lr", NULL, FLOAT, O(lr), "peak learning rate"},
    {"min-lr", NULL, FLOAT, O(min_lr), "final learning rate (cosine, onecycle)"},
    {"momentum", NULL, FLOAT, O(momentum), "SGD/LARS momentum"},
    {"nesterov", NULL, FLAG, O(nesterov), "Nesterov momentum"},
    {"no-nesterov", NULL, NOFLAG, O(nesterov), "plain momentum"},
    {"wd", "weight-decay", FLOAT, O(weight_decay), "weight decay"},
    {"decay-norm-bias", NULL, FLAG, O(decay_norm_and_bias), "also decay BN parameters and biases"},
    {"sched", NULL, STR, O(sched), "constant | step | multistep | cosine | onecycle"},
    {"warmup-epochs", NULL, FLOAT, O(warmup_epochs), "linear warmup length in epochs"},
    {"warmup-start", NULL, FLOAT, O(warmup_start), "warmup starts at this fraction of --lr"},
    {"lr-step", NULL, INT, O(lr_step_epochs), "step schedule: epochs between decays"},
    {"lr-gamma", NULL, FLOAT, O(lr_gamma), "step/multistep decay factor"},
    {"lr-milestones", NULL, STR, O(lr_milestones), "multistep: epochs, comma separated"},
    {"smoothing", "label-smoothing", FLOAT, O(label_smoothing), "label smoothing"},
    {"clip-grad", NULL, FLOAT, O(clip_grad), "clip gradients to this global L2 norm (0: off)"},
    {"model-ema-decay", NULL, FLOAT, O(ema_decay), "keep an EMA of the weights (0: off)"},
    {"pad-crop", NULL, INT, O(pad_crop), "random crop after zero padding by N pixels"},
    {"hflip", NULL, FLAG, O(hflip), "random horizontal flips"},
    {"no-hflip", NULL, NOFLAG, O(hflip), "no flips"},
    {"num-classes", NULL, INT, O(model.num_classes), "classifier outputs (default: the dataset's)"},
    {"small-stem", NULL, FLAG, O(model.small_stem), "3x3 stride-1 stem without max-pool"},
    {"zero-init-residual", NULL, FLAG, O(model.zero_init_residual),
     "zero-init last BN of each block"},
    {"width", NULL, INT, O(model.width), "base channel width (0: the model's own)"},
    {"input-size", "img-size", INT, O(model.image_size),
     "model input size (default: the images'; smaller images are zero-padded)"},
    {"drop", NULL, FLOAT, O(model.drop_rate), "dropout before the classifier head (transformers)"},
    {"drop-path", NULL, FLOAT, O(model.drop_path_rate),
     "stochastic depth rate at the last block (linear in depth)"},
    {"grad-checkpointing", NULL, FLAG, O(model.grad_checkpointing),
     "recompute each block's activations in backward instead of keeping them (less memory, "
     "about a third more compute, the same gradients)"},
    {"seed", NULL, U64, O(seed), "random seed (fixes the whole run)"},
    {"threads", NULL, INT, O(threads), "compute threads (default: all cores)"},
    {"precision", NULL, STR, O(precision),
     "fp32 | bf16: bf16 operands, fp32 accumulation in the linear layers (on a GPU also the "
     "ResNets' convolutions)"},
    {"device", NULL, STR, O(device),
     "where the model trains: cpu | cuda | cuda:N (under mpirun, cuda: each rank its own GPU)"},
    {"cudnn-benchmark", NULL, FLAG, O(cudnn_benchmark),
     "GPU: each convolution shape's algorithm by cuDNN's timed search, the fastest deterministic "
     "one (PyTorch's cudnn.benchmark; runs may then differ in their last bits)"},
    {"workers", "j", INT, O(workers), "data loading threads (default: all cores)"},
    {"print-freq", "p", INT, O(print_freq), "log every N steps"},
    {"output", "o", STR, O(output), "folder for checkpoints and logs"},
    {"resume", NULL, STR, O(resume), "continue from a checkpoint_last.safetensors"},
    {"weights", NULL, STR, O(weights), "start from (or evaluate) a model .safetensors file"},
    {"evaluate", "e", FLAG, O(evaluate), "only evaluate (with --resume or --weights)"},
    {"reset-head", NULL, FLAG, O(reset_head),
     "--weights is a backbone: skip its classifier, start a fresh one"},
    {"max-steps", NULL, INT, O(max_steps), "stop after N steps with a checkpoint (testing resume)"},
    {"eval-interval", NULL, INT, O(eval_interval),
     "also evaluate every N steps and when the run stops early (0: epoch ends only)"},
    {"no-progress", NULL, FLAG, O(no_progress), "plain log lines even on a terminal"},
    {"dist-backend", NULL, STR, O(dist_backend),
     "processes: auto (mpirun's, if launched) | none | mpi"},
    {"dist-timeout", NULL, FLOAT, O(dist_timeout),
     "processes: seconds a collective may take before the run fails (default 300)"},
    {"sync-bn", NULL, FLAG, O(sync_bn), "processes: BatchNorm statistics over all ranks"},
    {"gpu-allreduce", NULL, STR, O(gpu_allreduce),
     "processes on GPUs: auto (NCCL where every rank has a GPU of its own) | nccl | host "
     "(through host memory over the processes' backend)"},
    {"blur", NULL, FLOAT, O(blur_prob), "images: GaussianBlur probability (SSL recipes)"},
    {"method", NULL, STR, O(ssl.method), "mocov2 | simclr"},
    {"preset", NULL, STR, O(ssl.preset), "mocov2_resnet50_imagenet | mocov2_resnet18_cifar10"},
    {"temperature", NULL, FLOAT, O(ssl.temperature), "contrastive temperature"},
    {"bank-size", NULL, U64, O(ssl.bank_size), "MoCo: memory bank rows"},
    {"proj-hidden", NULL, INT, O(ssl.proj_hidden), "projection head hidden width"},
    {"proj-dim", NULL, INT, O(ssl.proj_dim), "projection output dimension"},
    {"moco-momentum", NULL, FLOAT, O(ssl.momentum), "MoCo: key encoder momentum"},
    {"momentum-cosine", NULL, FLAG, O(ssl.momentum_cosine),
     "MoCo: momentum follows a cosine from its value to 1"},
    {"fresh-key-head", NULL, FLAG, O(ssl.fresh_key_head),
     "MoCo: random key head (the reference library) instead of a copy"},
    {"symmetric", NULL, FLAG, O(ssl.symmetric),
     "MoCo: symmetric loss (each view also as the query); keys of both views enqueued once"},
    {"no-gather", NULL, FLAG, O(ssl.no_gather),
     "each process keeps its own keys / negatives (no all-gather)"},
    {"bucket-cap-mb", NULL, FLOAT, O(bucket_cap_mb),
     "processes: gradient all-reduce bucket size (0: one all-reduce after backward)"},
};
#define NUM_OPTIONS (int)(sizeof options / sizeof options[0])

/* The settings of visc_train_config.ssl belong to `visc pretrain` alone. */
static int pretrain_only(const option *o) {
    size_t start = offsetof(visc_train_config, ssl);
    return o->offset >= start && o->offset < start + sizeof(visc_ssl_config);
}

static const option *find(const char *name) {
    for (int i = 0; i < NUM_OPTIONS; i++)
        if (strcmp(options[i].name, name) == 0 ||
            (options[i].alias && strcmp(options[i].alias, name) == 0))
            return &options[i];
    return NULL;
}

static int set_value(visc_train_config *c, const option *o, const char *value, const char *where) {
    char *field = (char *)c + o->offset, *end;
    errno = 0;
    switch (o->kind) {
    case STR:
        if (strlen(value) >= o->size) return visc_set_error("%s%s: value too long", where, o->name);
        strcpy(field, value);
        return 0;
    case INT: {
        long v = strtol(value, &end, 10);
        if (!*value || *end || errno || v < INT_MIN || v > INT_MAX)
            return visc_set_error("%s%s: expected an integer, got '%s'", where, o->name, value);
        *(int *)field = (int)v;
        return 0;
    }
    case U64: {
        unsigned long long v = strtoull(value, &end, 10);
        if (!*value || *end || errno || value[0] == '-')
            return visc_set_error("%s%s: expected a non-negative integer, got '%s'", where, o->name,
                                  value);
        *(uint64_t *)field = v;
        return 0;
    }
    case FLOAT: {
        float v = strtof(value, &end);
        if (!*value || *end || errno || v != v)
            return visc_set_error("%s%s: expected a number, got '%s'", where, o->name, value);
        /* cppcheck-suppress invalidPointerCast ; field points at a float member (offsetof) */
        *(float *)field = v;
        return 0;
    }
    case FLAG:
    case NOFLAG: {
        int on;
        if (!strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "yes")) on = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "no")) on = 0;
        else return visc_set_error("%s%s: expected true or false, got '%s'", where, o->name, value);
        *(int *)field = o->kind == FLAG ? on : !on;
        return 0;
    }
    }
    return -1;
}

static int apply_config_file(visc_train_config *c, const char *path) {
    visc_config cfg = {0};
    if (visc_config_load(&cfg, path)) return -1;
    int rc = 0;
    for (int i = 0; i < cfg.count && rc == 0; i++) {
        const option *o = find(cfg.keys[i]);
        char where[600];
        snprintf(where, sizeof where, "%s: ", path);
        if (!o)
            rc = visc_set_error("%s: unknown key '%s' (keys are the long flags of `visc train "
                                "--help`)",
                                path, cfg.keys[i]);
        else rc = set_value(c, o, cfg.values[i], where);
    }
    visc_config_free(&cfg);
    return rc;
}

/* Defaults, the preset (pretrain), the config file, then the flags. */
static int parse_args(visc_train_config *c, int argc, char **argv, int pretrain) {
    const char *cmd = pretrain ? "pretrain" : "train";
    /* the preset first, then the config file, wherever they stand, so
     * that flags override both */
    for (int i = 0; pretrain && i < argc; i++) {
        const char *name = NULL;
        if (strcmp(argv[i], "--preset") == 0 && i + 1 < argc) name = argv[i + 1];
        else if (strncmp(argv[i], "--preset=", 9) == 0) name = argv[i] + 9;
        if (name && visc_ssl_preset(name, c)) return -1;
    }
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 || strcmp(argv[i], "-c") == 0) {
            if (i + 1 >= argc) return visc_set_error("--config needs a file name");
            if (apply_config_file(c, argv[i + 1])) return -1;
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            if (apply_config_file(c, argv[i] + 9)) return -1;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--config") == 0 || strcmp(arg, "-c") == 0) {
            i++;
            continue;
        }
        if (strncmp(arg, "--config=", 9) == 0) continue;
        if (arg[0] != '-' || !arg[1])
            return visc_set_error("unexpected argument '%s' (see `visc train --help`)", arg);
        const char *name = arg + (arg[1] == '-' ? 2 : 1);
        char key[64];
        const char *eq = strchr(name, '='), *value = NULL;
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        if (len >= sizeof key) return visc_set_error("unknown option '%s'", arg);
        memcpy(key, name, len);
        key[len] = 0;
        const option *o = find(key);
        if (!o) return visc_set_error("unknown option '%s' (see `visc %s --help`)", arg, cmd);
        if (pretrain_only(o) && !pretrain)
            return visc_set_error("%s is an option of `visc pretrain`, not of `visc train`", arg);
        if (eq) value = eq + 1;
        else if (o->kind == FLAG || o->kind == NOFLAG) value = "1";
        else if (i + 1 < argc) value = argv[++i];
        else return visc_set_error("option '%s' needs a value", arg);
        if (set_value(c, o, value, "--")) return -1;
    }
    return 0;
}

int visc_parse_train_args(visc_train_config *c, int argc, char **argv) {
    visc_train_config_defaults(c);
    return parse_args(c, argc, argv, 0);
}

int visc_parse_pretrain_args(visc_train_config *c, int argc, char **argv) {
    return visc_parse_pretrain_args_stepping(c, argc, argv, 0);
}

int visc_parse_pretrain_args_stepping(visc_train_config *c, int argc, char **argv,
                                      int64_t step_batch) {
    visc_pretrain_config_defaults(c);
    if (parse_args(c, argc, argv, 1)) return -1;
    int batch = c->batch_size;
    if (step_batch > 0 && batch >= 1)
        c->batch_size = step_batch > INT_MAX ? INT_MAX : (int)step_batch;
    int rc = visc_ssl_resolve(c);
    c->batch_size = batch;
    return rc;
}

static void print_help(FILE *f, int pretrain) {
    fprintf(f,
            "usage: visc %s [--config FILE] [options]\n\noptions (config-file keys are the "
            "long names):\n",
            pretrain ? "pretrain" : "train");
    for (int i = 0; i < NUM_OPTIONS; i++) {
        if (pretrain_only(&options[i]) && !pretrain) continue;
        char left[64];
        const char *arg = options[i].kind == FLAG || options[i].kind == NOFLAG ? "" : " V";
        if (options[i].alias)
            snprintf(left, sizeof left, "--%s, -%s%s%s", options[i].name,
                     strlen(options[i].alias) > 1 ? "-" : "", options[i].alias, arg);
        else snprintf(left, sizeof left, "--%s%s", options[i].name, arg);
        fprintf(f, "  %-30s %s\n", left, options[i].help);
    }
}

void visc_print_train_help(FILE *f) { print_help(f, 0); }

void visc_print_pretrain_help(FILE *f) {
    print_help(f, 1);
    fputs("\nUnset settings take the method's defaults (the reference SSL benchmark):\n"
          "  mocov2: SGD lr 0.03 x batch/256, momentum 0.9, wd 1e-4 (not on norms and biases),\n"
          "          cosine to 0.001 lr, temperature 0.2, bank 65536, momentum 0.999, --aug "
          "mocov2\n"
          "  simclr: LARS lr 0.075 x sqrt(batch), wd 1e-6, 10 warmup epochs, cosine,\n"
          "          temperature 0.1, --aug simclr\n"
          "--batch-size is the whole job's (split over the processes under mpirun).\n",
          f);
}

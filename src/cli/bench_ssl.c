/* bench_ssl.c: `visc bench-ssl`: the SSL benchmark end to end in one
 * command, as the reference library's benchmark script chains it:
 * pretraining (visc pretrain, every option of it), then the three
 * evaluations of the query encoder (visc eval knn / linear / finetune on
 * OUTPUT/model_last.safetensors, with the same model and data flags), then
 * a results table (OUTPUT/results.md) and a JSON summary with every metric,
 * the settings and the wall times (OUTPUT/results.json).
 *
 * Under mpirun every phase runs on all processes (the process group is
 * joined once for the whole command); rank 0 writes the summary. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_ssl.h"
#include "eval.h"
#include "options.h"
#include "visc/io.h"
#include "visc/json.h"
#include "visc/ssl.h"

static void usage(FILE *f) {
    fputs("usage: visc bench-ssl [visc pretrain options] [benchmark options]\n\n"
          "Pretrains, then evaluates the query encoder with kNN, a linear probe and\n"
          "finetuning (the SSL benchmark protocol), and writes OUTPUT/results.md and\n"
          "OUTPUT/results.json. `visc pretrain --help` lists the pretraining options.\n\n"
          "benchmark options:\n"
          "  --eval LIST            evaluations to run (default knn,linear,finetune)\n"
          "  --knn-k K, --knn-t T   kNN neighbours and temperature (default 200, 0.1)\n"
          "  --linear-epochs N      default 90\n"
          "  --finetune-epochs N    default 30\n"
          "  --eval-batch-size N    default 256 (the protocol's)\n"
          "  --eval-lr-scale X      multiplies the linear / finetune lr rules (default 1)\n",
          f);
}

typedef struct {
    char evals[64];
    const char *knn_k, *knn_t, *linear_epochs, *finetune_epochs, *eval_batch, *lr_scale;
} bench_args;

/* Moves the benchmark's own flags out of argv; the rest is pretraining's. */
static int split_args(bench_args *b, int *argc, char **argv) {
    snprintf(b->evals, sizeof b->evals, "knn,linear,finetune");
    struct {
        const char *flag;
        const char **value;
    } table[] = {{"--knn-k", &b->knn_k},
                 {"--knn-t", &b->knn_t},
                 {"--linear-epochs", &b->linear_epochs},
                 {"--finetune-epochs", &b->finetune_epochs},
                 {"--eval-batch-size", &b->eval_batch},
                 {"--eval-lr-scale", &b->lr_scale}};
    int out = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        int taken = 0;
        if (!strcmp(a, "--eval")) {
            if (i + 1 >= *argc) return visc_set_error("bench-ssl: --eval needs a value");
            snprintf(b->evals, sizeof b->evals, "%s", argv[++i]);
            taken = 1;
        }
        for (size_t k = 0; !taken && k < sizeof table / sizeof table[0]; k++)
            if (!strcmp(a, table[k].flag)) {
                if (i + 1 >= *argc) return visc_set_error("bench-ssl: %s needs a value", a);
                *table[k].value = argv[++i];
                taken = 1;
            }
        if (!taken) argv[out++] = argv[i];
    }
    *argc = out;
    for (const char *p = b->evals; *p;) {
        size_t n = strcspn(p, ",");
        if (!((n == 3 && !strncmp(p, "knn", 3)) || (n == 6 && !strncmp(p, "linear", 6)) ||
              (n == 8 && !strncmp(p, "finetune", 8))))
            return visc_set_error("bench-ssl: --eval: expected a list of knn, linear, finetune, "
                                  "got '%s'",
                                  b->evals);
        p += n + (p[n] == ',');
    }
    return 0;
}

static int wants(const bench_args *b, const char *mode) {
    for (const char *p = b->evals; *p;) {
        size_t n = strcspn(p, ",");
        if (n == strlen(mode) && !strncmp(p, mode, n)) return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* A growing argv of owned strings for one `visc eval` call. */
typedef struct {
    char *v[64];
    int n;
} arg_list;

static void push(arg_list *l, const char *flag, const char *value) {
    if (l->n + 2 >= 64) return;
    l->v[l->n++] = strdup(flag);
    if (value) l->v[l->n++] = strdup(value);
}

static void pushf(arg_list *l, const char *flag, const char *fmt, double x) {
    char text[64];
    snprintf(text, sizeof text, fmt, x);
    push(l, flag, text);
}

static int run_eval(const visc_train_config *c, const bench_args *b, const char *mode) {
    arg_list l = {.n = 0};
    char path[1100], out[1100];
    snprintf(path, sizeof path, "%s/model_last.safetensors", c->output);
    snprintf(out, sizeof out, "%s/eval", c->output);
    push(&l, mode, NULL);
    push(&l, "--weights", path);
    push(&l, "--model", c->model.arch);
    push(&l, "--data", c->data_dir);
    if (c->val_data[0]) push(&l, "--val-data", c->val_data);
    if (c->model.image_size > 0) pushf(&l, "--input-size", "%.0f", c->model.image_size);
    if (c->model.small_stem) push(&l, "--small-stem", NULL);
    if (c->model.width > 0) pushf(&l, "--width", "%.0f", c->model.width);
    if (c->subset > 0) pushf(&l, "--subset", "%.0f", c->subset);
    if (c->threads > 0) pushf(&l, "--threads", "%.0f", c->threads);
    if (c->workers > 0) pushf(&l, "--workers", "%.0f", c->workers);
    if (c->no_progress) push(&l, "--no-progress", NULL);
    pushf(&l, "--crop-pct", "%g", c->crop_pct);
    pushf(&l, "--seed", "%.0f", (double)c->seed);
    /* the evaluations where the pretraining ran, in its precision */
    push(&l, "--device", c->device);
    push(&l, "--precision", c->precision);
    push(&l, "--output", out);
    if (b->eval_batch) push(&l, "--batch-size", b->eval_batch);
    if (!strcmp(mode, "knn")) {
        if (b->knn_k) push(&l, "--k", b->knn_k);
        if (b->knn_t) push(&l, "--t", b->knn_t);
    } else {
        const char *epochs = !strcmp(mode, "linear") ? b->linear_epochs : b->finetune_epochs;
        if (epochs) push(&l, "--epochs", epochs);
        if (b->lr_scale) {
            /* the protocol's rule (0.1 or 0.05 x batch / 256) times the scale */
            double batch = b->eval_batch ? atof(b->eval_batch) : 256;
            double rule = (!strcmp(mode, "linear") ? 0.1 : 0.05) * batch / 256;
            pushf(&l, "--lr", "%g", rule * atof(b->lr_scale));
        }
    }
    printf("== visc eval %s\n", mode);
    int rc = visc_cmd_eval(l.n, l.v);
    for (int i = 0; i < l.n; i++) free(l.v[i]);
    return rc;
}

/* A number from a JSON file: metrics.<key> (or the top level); -1 if absent. */
static double json_metric(const char *path, const char *key) {
    size_t size;
    uint8_t *text = NULL;
    if (visc_read_maybe_gzip(path, &text, &size, 1 << 20)) return -1;
    visc_json root;
    double v = -1;
    if (visc_json_parse(&root, (const char *)text, size) == 0) {
        const visc_json *m = visc_json_get(&root, "metrics");
        const visc_json *x = visc_json_get(m ? m : &root, key);
        if (!x) x = visc_json_get(&root, key);
        if (x && x->type == VISC_JSON_NUMBER) v = atof(x->str);
        visc_json_free(&root);
    }
    free(text);
    return v;
}

/* The online classifier's best validation top-1 and top-5 over the epochs
 * (the "val" lines of the pretraining log). */
static void online_best(const char *dir, double *top1, double *top5) {
    char path[1100];
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    *top1 = *top5 = -1;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        visc_json root;
        if (visc_json_parse(&root, line, strlen(line))) continue;
        const visc_json *type = visc_json_get(&root, "type");
        const visc_json *t1 = visc_json_get(&root, "val_online_cls_top1");
        const visc_json *t5 = visc_json_get(&root, "val_online_cls_top5");
        if (type && type->type == VISC_JSON_STRING && !strcmp(type->str, "val") && t1 && t5) {
            if (atof(t1->str) > *top1) *top1 = atof(t1->str);
            if (atof(t5->str) > *top5) *top5 = atof(t5->str);
        }
        visc_json_free(&root);
    }
    fclose(f);
}

/* "61.50 / 84.10", or "-" for an evaluation that did not run. */
static void pair(char *out, size_t n, double a, double b) {
    if (a < 0) snprintf(out, n, "-");
    else snprintf(out, n, "%.2f / %.2f", a, b);
}

/* results.md and results.json in c->output (rank 0). */
static int write_results(const visc_train_config *c, const bench_args *b, const double wall[3],
                         double t_pre, double total) {
    visc_dist *d = visc_dist_open(c->dist_backend, c->dist_timeout);
    int rank = visc_dist_rank(d);
    visc_dist_close(d);
    if (rank != 0) return 0;
    static const char *const modes[3] = {"knn", "linear", "finetune"};
    double top1[3], top5[3], on1, on5;
    for (int i = 0; i < 3; i++) {
        char path[1100], k1[32], k5[32];
        snprintf(path, sizeof path, "%s/eval/eval_%s.json", c->output, modes[i]);
        snprintf(k1, sizeof k1, "%s_top1", modes[i]);
        snprintf(k5, sizeof k5, "%s_top5", modes[i]);
        top1[i] = wall[i] > 0 ? json_metric(path, k1) : -1;
        top5[i] = wall[i] > 0 ? json_metric(path, k5) : -1;
    }
    online_best(c->output, &on1, &on5);
    char cells[4][48];
    pair(cells[0], sizeof cells[0], on1, on5);
    for (int i = 0; i < 3; i++) pair(cells[i + 1], sizeof cells[i + 1], top1[i], top5[i]);
    char md[4096];
    snprintf(md, sizeof md,
             "# SSL benchmark: %s, %s\n\n"
             "| method | online top-1 / top-5 | kNN top-1 / top-5 (k=%s, t=%s) "
             "| linear top-1 / top-5 | finetune top-1 / top-5 |\n"
             "| --- | --- | --- | --- | --- |\n"
             "| %s | %s | %s | %s | %s |\n\n"
             "Data %s, %d epochs, batch %d, lr %g (%s), temperature %g%s%s; wall time: "
             "pretraining %.0f s, kNN %.0f s, linear %.0f s, finetune %.0f s, total %.0f s.\n",
             c->ssl.method, c->model.arch, b->knn_k ? b->knn_k : "200", b->knn_t ? b->knn_t : "0.1",
             c->ssl.method, cells[0], cells[1], cells[2], cells[3], c->data_dir, c->epochs,
             c->batch_size, (double)c->lr, c->opt, (double)c->ssl.temperature,
             c->ssl.preset[0] ? ", preset " : "", c->ssl.preset, t_pre, wall[0], wall[1], wall[2],
             total);
    char json[4096];
    snprintf(json, sizeof json,
             "{\"method\":\"%s\",\"model\":\"%s\",\"data\":\"%s\",\"preset\":\"%s\","
             "\"metrics\":{\"online_top1\":%.4f,\"online_top5\":%.4f,\"knn_top1\":%.4f,"
             "\"knn_top5\":%.4f,\"linear_top1\":%.4f,\"linear_top5\":%.4f,"
             "\"finetune_top1\":%.4f,\"finetune_top5\":%.4f},"
             "\"settings\":{\"epochs\":%d,\"batch_size\":%d,\"lr\":%g,\"opt\":\"%s\","
             "\"weight_decay\":%g,\"temperature\":%g,\"bank_size\":%lld,\"seed\":%llu},"
             "\"wall_time_s\":{\"pretrain\":%.1f,\"knn\":%.1f,\"linear\":%.1f,"
             "\"finetune\":%.1f,\"total\":%.1f},"
             "\"note\":\"-1: not run; per-evaluation settings in eval/eval_<mode>.json\"}\n",
             c->ssl.method, c->model.arch, c->data_dir, c->ssl.preset, on1, on5, top1[0], top5[0],
             top1[1], top5[1], top1[2], top5[2], c->epochs, c->batch_size, (double)c->lr, c->opt,
             (double)c->weight_decay, (double)c->ssl.temperature, (long long)c->ssl.bank_size,
             (unsigned long long)c->seed, t_pre, wall[0], wall[1], wall[2], total);
    char path[1100];
    const void *parts[1];
    size_t sizes[1];
    snprintf(path, sizeof path, "%s/results.md", c->output);
    parts[0] = md, sizes[0] = strlen(md);
    if (visc_write_file_atomic(path, parts, sizes, 1)) return -1;
    snprintf(path, sizeof path, "%s/results.json", c->output);
    parts[0] = json, sizes[0] = strlen(json);
    if (visc_write_file_atomic(path, parts, sizes, 1)) return -1;
    fputs(md, stdout);
    printf("wrote %s/results.md and %s/results.json\n", c->output, c->output);
    return 0;
}

int visc_cmd_bench_ssl(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    bench_args b = {.knn_k = NULL};
    if (split_args(&b, &argc, argv)) visc_die("%s", visc_last_error());
    visc_train_config c;
    if (visc_parse_pretrain_args(&c, argc, argv)) visc_die("%s", visc_last_error());
    double t0 = visc_now();
    printf("== visc pretrain\n");
    if (visc_pretrain(&c)) visc_die("%s", visc_last_error());
    double t_pre = visc_now() - t0;
    const char *modes[3] = {"knn", "linear", "finetune"};
    double wall[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) {
        if (!wants(&b, modes[i])) continue;
        double t = visc_now();
        if (run_eval(&c, &b, modes[i])) return 1;
        wall[i] = visc_now() - t;
    }
    if (write_results(&c, &b, wall, t_pre, visc_now() - t0)) visc_die("%s", visc_last_error());
    return 0;
}

/* main.c: the visc program: one command per job (train, pretrain, eval, ...). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_ssl.h"
#include "devices.h"
#include "diff.h"
#include "eval.h"
#include "options.h"
#include "pack.h"
#include "plot.h"
#include "swarm.h"
#include "swarm_train.h"
#include "visc/model.h"
#include "visc/ssl.h"
#include "visc/train.h"

static void usage(FILE *f) {
    fputs("usage: visc <command> [options]\n\n"
          "commands:\n"
          "  train     train (or with --evaluate, evaluate) a model\n"
          "  pretrain  self-supervised pretraining: MoCo v2 | SimCLR\n"
          "  bench-ssl pretrain, then kNN, linear and finetune evaluations, as one table\n"
          "  eval      evaluate a backbone: knn | linear | finetune (SSL benchmark)\n"
          "  plot      draw a run's curves (loss, accuracy, LR) as a PNG\n"
          "  pack      pack an image folder into shards (fast loading)\n"
          "  diff      compare the tensors of two safetensors files\n"
          "  swarm     keys, access tokens and DHT nodes for training in a swarm\n"
          "  models    list the architectures\n"
          "  devices   list the CPU and the CUDA devices\n"
          "  version   print the version\n\n"
          "`visc train --help` lists the training options.\n",
          f);
}

static int cmd_train(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            visc_print_train_help(stdout);
            visc_swarm_train_help(stdout);
            return 0;
        }
    /* --swarm and its flags first: the rest are the training flags */
    int bad;
    visc_swarm_train_opts *swarm = visc_swarm_train_parse(&argc, argv, &bad);
    if (bad) visc_die("%s", visc_last_error());
    visc_train_config c;
    if (visc_parse_train_args(&c, argc, argv)) visc_die("%s", visc_last_error());
    int rc = swarm ? visc_swarm_train(&c, swarm) : visc_train(&c);
    visc_swarm_train_free(swarm);
    if (rc) visc_die("%s", visc_last_error());
    return visc_stop_signal_exit_status();
}

static int cmd_pretrain(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            visc_print_pretrain_help(stdout);
            visc_swarm_train_help(stdout);
            return 0;
        }
    int bad;
    visc_swarm_train_opts *swarm = visc_swarm_train_parse(&argc, argv, &bad);
    if (bad) visc_die("%s", visc_last_error());
    visc_train_config c;
    if (visc_parse_pretrain_args_stepping(&c, argc, argv, visc_swarm_target_batch(swarm)))
        visc_die("%s", visc_last_error());
    int rc = swarm ? visc_swarm_run(&c, swarm, visc_pretrain) : visc_pretrain(&c);
    visc_swarm_train_free(swarm);
    if (rc) visc_die("%s", visc_last_error());
    return visc_stop_signal_exit_status();
}

/* OpenMP threads that wait by spinning take the cores from the loader's
 * threads, from the other ranks of an mpirun job and from anything else on
 * the machine (measured: MoCo v2 pretraining at 20 instead of 186 img/s on
 * a busy 2-core machine). libgomp reads OMP_WAIT_POLICY once, when it
 * loads, so the program re-executes itself with "passive" unless the user
 * chose a policy. */
static void prefer_passive_waiting(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("VISC_NO_REEXEC")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("VISC_NO_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the default policy */
}

int main(int argc, char **argv) {
    prefer_passive_waiting(argv);
    /* line by line even into a pipe or a log file, so progress is visible */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(cmd, "pretrain") == 0) return cmd_pretrain(argc - 2, argv + 2);
    if (strcmp(cmd, "bench-ssl") == 0) return visc_cmd_bench_ssl(argc - 2, argv + 2);
    if (strcmp(cmd, "eval") == 0) return visc_cmd_eval(argc - 2, argv + 2);
    if (strcmp(cmd, "plot") == 0) return visc_cmd_plot(argc - 2, argv + 2);
    if (strcmp(cmd, "pack") == 0) return visc_cmd_pack(argc - 2, argv + 2);
    if (strcmp(cmd, "diff") == 0) return visc_cmd_diff(argc - 2, argv + 2);
    if (strcmp(cmd, "swarm") == 0) return visc_cmd_swarm(argc - 2, argv + 2);
    if (strcmp(cmd, "devices") == 0) return visc_cmd_devices(argc - 2, argv + 2);
    if (strcmp(cmd, "models") == 0) {
        for (const char *const *n = visc_model_names(); *n; n++) puts(*n);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        puts("visc 0.1.0");
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    visc_die("unknown command '%s' (try `visc help`)", cmd);
}

/* main.c: the visc program: `visc train`, `visc models`, `visc version`. */
#include <stdio.h>
#include <string.h>

#include "diff.h"
#include "options.h"
#include "pack.h"
#include "plot.h"
#include "visc/model.h"
#include "visc/train.h"

static void usage(FILE *f) {
    fputs("usage: visc <command> [options]\n\n"
          "commands:\n"
          "  train     train (or with --evaluate, evaluate) a model\n"
          "  plot      draw a run's curves (loss, accuracy, LR) as a PNG\n"
          "  pack      pack an image folder into shards (fast loading)\n"
          "  diff      compare the tensors of two safetensors files\n"
          "  models    list the architectures\n"
          "  version   print the version\n\n"
          "`visc train --help` lists the training options.\n",
          f);
}

static int cmd_train(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            visc_print_train_help(stdout);
            return 0;
        }
    visc_train_config c;
    if (visc_parse_train_args(&c, argc, argv)) visc_die("%s", visc_last_error());
    if (visc_train(&c)) visc_die("%s", visc_last_error());
    return 0;
}

int main(int argc, char **argv) {
    /* line by line even into a pipe or a log file, so progress is visible */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(cmd, "plot") == 0) return visc_cmd_plot(argc - 2, argv + 2);
    if (strcmp(cmd, "pack") == 0) return visc_cmd_pack(argc - 2, argv + 2);
    if (strcmp(cmd, "diff") == 0) return visc_cmd_diff(argc - 2, argv + 2);
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

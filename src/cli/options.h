/* options.h: command-line and config-file options of `visc train`. */
#ifndef VISC_CLI_OPTIONS_H
#define VISC_CLI_OPTIONS_H

#include <stdio.h>

#include "visc/train.h"

/* Defaults, then --config FILE, then the flags. -1 with an error message. */
int visc_parse_train_args(visc_train_config *c, int argc, char **argv);
void visc_print_train_help(FILE *f);
/* `visc pretrain`: the same options plus the self-supervised ones, with
 * the method's defaults (ssl.h) for what is left unset. */
int visc_parse_pretrain_args(visc_train_config *c, int argc, char **argv);
/* The same for a run whose optimizer steps take step_batch samples (a
 * swarm's target batch; 0: --batch-size): the method's default learning
 * rate, a rule of the batch, follows the step's batch. */
int visc_parse_pretrain_args_stepping(visc_train_config *c, int argc, char **argv,
                                      int64_t step_batch);
void visc_print_pretrain_help(FILE *f);

#endif

/* swarm_train.h: `visc train --swarm ...` (and `visc pretrain --swarm`):
 * training as one peer of a swarm.
 * The swarm's flags are taken out of argv before the training flags are
 * parsed; the run is visc_train with the collaborative optimizer's hooks
 * (src/swarm/collab.h). */
#ifndef VISC_CLI_SWARM_TRAIN_H
#define VISC_CLI_SWARM_TRAIN_H

#include "visc/train.h"

typedef struct visc_swarm_train_opts visc_swarm_train_opts;

/* Removes every swarm flag from argv (updating *argc). Returns a new opts
 * (free with visc_swarm_train_free) when --swarm was given, NULL when it
 * was not (*error 0), or NULL with *error 1 and a message for a bad flag
 * (also: a swarm flag without --swarm, or a build without the swarm). */
visc_swarm_train_opts *visc_swarm_train_parse(int *argc, char **argv, int *error);
/* Runs training as a peer; 0 or -1 with an error. */
int visc_swarm_train(visc_train_config *c, visc_swarm_train_opts *o);
/* The same for another loop that takes step hooks (visc_pretrain). */
int visc_swarm_run(visc_train_config *c, visc_swarm_train_opts *o,
                   int (*run)(const visc_train_config *c));
void visc_swarm_train_free(visc_swarm_train_opts *o);
/* --target-batch-size (0 without it, or for NULL). */
int64_t visc_swarm_target_batch(const visc_swarm_train_opts *o);
/* The swarm flags' help. */
void visc_swarm_train_help(FILE *f);

#endif

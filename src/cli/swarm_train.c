/* swarm_train.c: `visc train --swarm` and `visc pretrain --swarm`: the
 * CLI's glue between a training loop (the trainer, or pretraining) and the
 * swarm (node, collaborative optimizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "swarm_train.h"
#include "visc/core.h"
#include "visc/io.h"

#ifndef VISC_WITH_SWARM
visc_swarm_train_opts *visc_swarm_train_parse(int *argc, char **argv, int *error) {
    *error = 0;
    for (int i = 0; i < *argc; i++)
        if (strcmp(argv[i], "--swarm") == 0) {
            *error = 1;
            visc_set_error("--swarm: this visc was built without the swarm (SWARM=0, or "
                           "libsodium-dev / libopendht-c-dev were missing at build time)");
        }
    return NULL;
}
int visc_swarm_run(visc_train_config *c, visc_swarm_train_opts *o,
                   int (*run)(const visc_train_config *c)) {
    (void)c, (void)o, (void)run;
    return visc_set_error("built without the swarm");
}
int visc_swarm_train(visc_train_config *c, visc_swarm_train_opts *o) {
    return visc_swarm_run(c, o, visc_train);
}
void visc_swarm_train_free(visc_swarm_train_opts *o) { (void)o; }
int64_t visc_swarm_target_batch(const visc_swarm_train_opts *o) {
    (void)o;
    return 0;
}
void visc_swarm_train_help(FILE *f) { (void)f; }
#else
#include "../swarm/collab.h"
#include "swarm_flags.h"

struct visc_swarm_train_opts {
    visc_swarm_flags flags;
    visc_collab_config collab;
    int client, auxiliary, shard_index, shard_count;
};

void visc_swarm_train_help(FILE *f) {
    fputs("\nswarm (collaborative training over the internet, `visc train --swarm ...`,\n"
          "`visc pretrain --swarm ...`):\n"
          "  --swarm                  train as one peer of a swarm\n"
          "  --target-batch-size N    samples the whole swarm processes per optimizer step\n"
          "                           (--batch-size is this peer's batch)\n"
          "  --averaging MODE         gradients (default: every peer applies the swarm's\n"
          "                           mean gradient) | parameters (local steps, averaged)\n"
          "  --lockstep               every peer contributes exactly one batch per step\n"
          "  --swarm-shard I/N        read shard I of N of the data (as rank I of N would)\n"
          "  --group-size N           peers per averaging group (default 16)\n"
          "  --matchmaking-time S     seconds to form a group (default 5)\n"
          "  --averaging-timeout S    seconds one all-reduce may take (default 60)\n"
          "  --on-failure POLICY      skip (default: no step, keep the gradient) | local\n"
          "                           (step alone, logged as divergence)\n"
          "  --compression C          none | fp16 | bf16 | q8 (default none)\n"
          "  --aggregation A          mean | trimmed | clip (robust to a hostile peer)\n"
          "  --client                 behind NAT: connect out only, reduce nothing\n"
          "  --auxiliary              no training: help the swarm's all-reduce (a shard\n"
          "                           by bandwidth, weight 0); same model flags as the\n"
          "                           peers, --max-steps to end with them\n"
          "  --delay-updates          (gradient averaging) average a step's gradient in\n"
          "                           the background while the next batches compute;\n"
          "                           applied one step late\n"
          "  --swarm-linger S         after training, serve the state S seconds more\n"
          "  --swarm-verbose          one line per averaging round (group, bytes, time)\n",
          f);
    fputs(visc_swarm_flags_help, f);
}

static int parse_number(const char *flag, const char *v, double lo, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x >= lo))
        return visc_set_error("%s: expected a number >= %g, got '%s'", flag, lo, v);
    *out = x;
    return 0;
}

/* One collaborative-optimizer flag at argv[i]: arguments used (1 or 2), 0
 * when it is not one, -1 on a bad value. */
static int take_collab_flag(visc_swarm_train_opts *o, int argc, char **argv, int i) {
    const char *a = argv[i];
    visc_collab_config *c = &o->collab;
    if (strcmp(a, "--lockstep") == 0) return c->lockstep = 1, 1;
    if (strcmp(a, "--client") == 0) return o->client = 1, 1;
    if (strcmp(a, "--auxiliary") == 0) return o->auxiliary = 1, 1;
    if (strcmp(a, "--delay-updates") == 0) return c->delay_updates = 1, 1;
    if (strcmp(a, "--swarm-verbose") == 0) return c->verbose = 1, 1;
    static const char *const with_value[] = {"--target-batch-size",
                                             "--averaging",
                                             "--swarm-shard",
                                             "--group-size",
                                             "--matchmaking-time",
                                             "--averaging-timeout",
                                             "--on-failure",
                                             "--compression",
                                             "--aggregation",
                                             "--swarm-linger",
                                             NULL};
    int known = 0;
    for (int k = 0; with_value[k]; k++) known |= strcmp(a, with_value[k]) == 0;
    if (!known) return 0;
    if (i + 1 >= argc) return visc_set_error("option '%s' needs a value", a);
    const char *v = argv[i + 1];
    double x = 0;
    if (strcmp(a, "--target-batch-size") == 0) {
        if (parse_number(a, v, 1, &x)) return -1;
        c->target_batch_size = (uint64_t)x;
    } else if (strcmp(a, "--averaging") == 0) {
        if (strcmp(v, "gradients") == 0) c->mode = VISC_COLLAB_GRADIENTS;
        else if (strcmp(v, "parameters") == 0) c->mode = VISC_COLLAB_PARAMETERS;
        else return visc_set_error("--averaging: expected gradients or parameters, got '%s'", v);
    } else if (strcmp(a, "--swarm-shard") == 0) {
        int idx, cnt, len = 0;
        if (sscanf(v, "%d/%d%n", &idx, &cnt, &len) != 2 || v[len] || cnt < 1 || idx < 0 ||
            idx >= cnt)
            return visc_set_error("--swarm-shard: expected I/N with 0 <= I < N, got '%s'", v);
        o->shard_index = idx, o->shard_count = cnt;
    } else if (strcmp(a, "--group-size") == 0) {
        if (parse_number(a, v, 2, &x) || x > VISC_GROUP_MAX)
            return visc_set_error("--group-size: expected 2..%d, got '%s'", VISC_GROUP_MAX, v);
        c->target_group_size = (int)x;
    } else if (strcmp(a, "--matchmaking-time") == 0) {
        if (parse_number(a, v, 0.1, &c->matchmaking_time_s)) return -1;
    } else if (strcmp(a, "--averaging-timeout") == 0) {
        if (parse_number(a, v, 0.1, &c->averaging_timeout_s)) return -1;
    } else if (strcmp(a, "--swarm-linger") == 0) {
        if (parse_number(a, v, 0, &c->linger_s)) return -1;
    } else if (strcmp(a, "--on-failure") == 0) {
        if (strcmp(v, "skip") == 0) c->on_failure = VISC_COLLAB_SKIP;
        else if (strcmp(v, "local") == 0) c->on_failure = VISC_COLLAB_STEP_LOCAL;
        else return visc_set_error("--on-failure: expected skip or local, got '%s'", v);
    } else if (strcmp(a, "--compression") == 0) {
        if (visc_compression_parse(v, &c->compression)) return -1;
    } else if (visc_aggregation_parse(v, &c->aggregate.mode)) {
        return -1;
    }
    return 2;
}

visc_swarm_train_opts *visc_swarm_train_parse(int *argc, char **argv, int *error) {
    *error = 0;
    visc_swarm_train_opts *o = visc_calloc(1, sizeof *o, "swarm options");
    if (!o) return *error = 1, NULL;
    visc_swarm_flags_default(&o->flags);
    visc_collab_config_default(&o->collab);
    int swarm = 0, any = 0, out = 0;
    for (int i = 0; i < *argc;) {
        int used = strcmp(argv[i], "--swarm") == 0 ? (swarm = 1) : 0;
        if (!used) used = visc_swarm_flags_take(&o->flags, *argc, argv, i);
        if (used == 0) used = take_collab_flag(o, *argc, argv, i);
        if (used < 0) {
            free(o);
            return *error = 1, NULL;
        }
        if (used == 0) {
            argv[out++] = argv[i++];
            continue;
        }
        any = 1;
        i += used;
    }
    *argc = out;
    if (!swarm) {
        free(o);
        if (any) {
            *error = 1;
            visc_set_error("swarm options need --swarm");
        }
        return NULL;
    }
    return o;
}

void visc_swarm_train_free(visc_swarm_train_opts *o) { free(o); }

int64_t visc_swarm_target_batch(const visc_swarm_train_opts *o) {
    return o ? (int64_t)o->collab.target_batch_size : 0;
}

int visc_swarm_train(visc_train_config *c, visc_swarm_train_opts *o) {
    return visc_swarm_run(c, o, visc_train);
}

int visc_swarm_run(visc_train_config *c, visc_swarm_train_opts *o,
                   int (*run)(const visc_train_config *c)) {
    if (!o->collab.target_batch_size)
        return visc_set_error("--swarm needs --target-batch-size (the swarm's batch per step)");
    if (o->auxiliary && o->client)
        return visc_set_error("--auxiliary reduces for others: it needs --listen, not --client");
    if (o->auxiliary && run != visc_train)
        return visc_set_error("--auxiliary: use `visc train --swarm --auxiliary` (same model "
                              "flags as the peers)");
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE"))
        return visc_set_error("--swarm and mpirun do not mix: start one peer per machine");
    visc_swarm_auth auth;
    if (visc_swarm_flags_auth(&o->flags, &auth)) return -1;
    visc_swarm_node_config nc = {.listen = o->client ? NULL : o->flags.listen,
                                 .dht_port = o->flags.dht_port,
                                 .initial_peers = o->flags.initial_peers,
                                 .auth = &auth,
                                 .client = o->client};
    visc_swarm_node *node = visc_swarm_node_open(&nc);
    if (!node) {
        visc_swarm_auth_free(&auth);
        return -1;
    }
    char peer[VISC_PEER_ID_CHARS + 1];
    visc_peer_id(auth.self.public_key, peer);
    int port = visc_dht_port(visc_swarm_node_dht(node));
    printf("swarm: peer %s of run '%s'%s%s, DHT port %d; others join with --initial-peers "
           "<this host>:%d\n",
           peer, o->flags.run_id,
           o->client      ? " (client)"
           : o->auxiliary ? " (auxiliary) at "
                          : " at ",
           o->client ? "" : visc_swarm_node_address(node), port, port);
    /* lockstep: every step is the whole group's, never a part of it */
    if (o->collab.lockstep) o->collab.min_group_size = o->collab.target_group_size;
    o->collab.node = node;
    o->collab.role = o->client ? VISC_ROLE_CLIENT : o->auxiliary ? VISC_ROLE_AUX : VISC_ROLE_FULL;
    o->collab.seed = c->seed;
    int rc = -1;
    if (visc_mkdirs(c->output) == 0) {
        visc_collab *collab = visc_collab_new(&o->collab);
        if (collab) {
            visc_step_hooks hooks = *visc_collab_hooks(collab);
            hooks.averages_parameters = o->collab.mode == VISC_COLLAB_PARAMETERS;
            c->hooks = &hooks;
            c->shard_index = o->shard_index;
            c->shard_count = o->shard_count;
            rc = run(c);
            c->hooks = NULL;
            char why[512];
            snprintf(why, sizeof why, "%s", visc_last_error());
            visc_collab_free(collab);
            if (rc) visc_set_error("%s", why);
        }
    }
    char why[512];
    snprintf(why, sizeof why, "%s", visc_last_error());
    visc_swarm_node_close(node);
    visc_swarm_auth_free(&auth);
    if (rc) visc_set_error("%s", why);
    return rc;
}
#endif

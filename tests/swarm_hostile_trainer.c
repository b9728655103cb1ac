/* swarm_hostile_trainer: an admitted (it holds the swarm secret) but
 * malicious peer of `visc train --swarm`, for tests/e2e_swarm_train_hostile.sh.
 *
 *   swarm_hostile_trainer --attack forge|epoch --run-id R --secret F --key F
 *                         --initial-peers H:P --target N --seconds S
 *   swarm_hostile_trainer --attack nan|huge|reducer --run-id R --secret F --key F
 *                         --initial-peers H:P --target N --group-size G
 *                         --model M --batch-size B --max-steps K --seed S --output DIR
 *
 * forge  publishes progress records at the swarm's epoch with 100 steps'
 *        worth of samples, growing by a step's worth every half second,
 *        while claiming 10 samples/s (forcing early steps if believed);
 * epoch  publishes a record one epoch ahead of the swarm, with a state
 *        hash and an address whose state server sends bytes that do not
 *        hash to it (a donor of poisoned state, if followed);
 * nan, huge  trains as a lockstep client peer with the real collaborative
 *        optimizer, but every part it sends into the all-reduce holds a NaN
 *        (or 1e8) in its middle;
 * reducer  trains as a lockstep full peer (it reduces a shard of every
 *        round) whose own parts are honest but whose results, the reduced
 *        values it sends back to every member, hold a NaN: without a ban
 *        that outlives the round it would fail every retry of every step.
 * It prints its peer id first ("hostile peer <id>"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "../src/swarm/collab.h"
#include "../src/swarm/record.h"
#include "visc/core.h"
#include "visc/train.h"

typedef struct {
    const char *attack, *run_id, *secret, *key, *peers, *model, *output;
    uint64_t target;
    int group_size, batch_size, max_steps;
    uint64_t seed;
    double seconds;
} opts;

/* ---- all-reduce faults (nan, huge) ---- */

static float g_poison;

static size_t poison_part(void *ctx, int peer, int k, float *values, size_t count) {
    (void)ctx, (void)peer, (void)k;
    values[count / 2] = g_poison;
    return count;
}

static void poison_result(void *ctx, int k, float *values, size_t count) {
    (void)ctx, (void)k;
    values[count / 2] = NAN;
}

static int train_poisoned(const opts *o, visc_swarm_node *node) {
    static const visc_allreduce_hooks part_hooks = {.on_send_part = poison_part};
    static const visc_allreduce_hooks result_hooks = {.on_result = poison_result};
    int reducer = strcmp(o->attack, "reducer") == 0;
    g_poison = strcmp(o->attack, "nan") == 0 ? NAN : 1e8f;
    visc_collab_config cc;
    visc_collab_config_default(&cc);
    cc.node = node;
    cc.role = reducer ? VISC_ROLE_FULL : VISC_ROLE_CLIENT;
    cc.lockstep = 1;
    cc.target_batch_size = o->target;
    cc.target_group_size = cc.min_group_size = o->group_size;
    cc.matchmaking_time_s = 3;
    cc.allreduce_hooks = reducer ? &result_hooks : &part_hooks;
    visc_collab *collab = visc_collab_new(&cc);
    if (!collab) return -1;
    visc_train_config tc;
    visc_train_config_defaults(&tc);
    snprintf(tc.model.arch, sizeof tc.model.arch, "%s", o->model);
    snprintf(tc.output, sizeof tc.output, "%s", o->output);
    tc.epochs = 1;
    tc.batch_size = o->batch_size;
    tc.max_steps = o->max_steps;
    tc.seed = o->seed; /* the honest peers' initialization: a round's members share the state */
    tc.no_progress = 1;
    tc.print_freq = 0;
    tc.threads = 1;
    tc.hooks = visc_collab_hooks(collab);
    int rc = visc_train(&tc);
    visc_collab_free(collab);
    return rc;
}

/* ---- forged records (forge, epoch) ---- */

/* The swarm's epoch: the one most of the other peers' records hold (the
 * highest of equals), so that two hostile peers do not follow each other. */
static uint64_t swarm_epoch(visc_dht *dht, const uint8_t self[VISC_KEY_BYTES]) {
    static visc_record recs[VISC_DHT_MAX_GET];
    static uint64_t epochs[VISC_DHT_MAX_GET];
    int n = visc_dht_get(dht, "progress", recs, VISC_DHT_MAX_GET, 5), k = 0;
    for (int i = 0; i < n; i++) {
        visc_progress_record r;
        if (memcmp(recs[i].signer, self, VISC_KEY_BYTES) != 0 &&
            visc_progress_parse(recs[i].value, recs[i].value_len, &r) == 0)
            epochs[k++] = r.epoch;
    }
    uint64_t best = 0;
    int best_count = 0;
    for (int i = 0; i < k; i++) {
        int count = 0;
        for (int j = 0; j < k; j++) count += epochs[j] == epochs[i];
        if (count > best_count || (count == best_count && epochs[i] > best))
            best = epochs[i], best_count = count;
    }
    return best;
}

static uint8_t g_poison_hash[32];

/* The poisoned donor: random bytes, announced under a hash they do not
 * have, at whatever epoch is asked for. */
static int serve_poison(void *ctx, uint64_t want_epoch, uint8_t **blob, size_t *n, uint64_t *epoch,
                        uint8_t hash[32]) {
    (void)ctx;
    size_t size = 4096;
    if (!(*blob = malloc(size))) return -1;
    randombytes_buf(*blob, size);
    *n = size;
    *epoch = want_epoch;
    memcpy(hash, g_poison_hash, 32);
    return 0;
}

static int forge(const opts *o, visc_swarm_node *node) {
    visc_dht *dht = visc_swarm_node_dht(node);
    const uint8_t *self = visc_swarm_node_auth(node)->self.public_key;
    int ahead = strcmp(o->attack, "epoch") == 0;
    visc_state_server *server = NULL;
    randombytes_buf(g_poison_hash, 32);
    if (ahead && !(server = visc_state_server_start(node, serve_poison, NULL))) return -1;
    uint64_t last_epoch = UINT64_MAX, samples = 0;
    double end = visc_now() + o->seconds;
    while (visc_now() < end) {
        uint64_t e = swarm_epoch(dht, self);
        visc_progress_record r;
        memset(&r, 0, sizeof r);
        r.role = VISC_ROLE_FULL;
        r.loss = 0.01f;
        r.time_ms = visc_unix_ms();
        if (ahead) {
            r.epoch = e + 1;
            r.samples_accumulated = 0;
            r.samples_per_second = 50;
            snprintf(r.addr, sizeof r.addr, "%s", visc_swarm_node_address(node));
            memcpy(r.state_hash, g_poison_hash, 32);
        } else {
            /* far more than a step's worth at once, growing by a step
             * with every record, while claiming 10 samples/s */
            if (e != last_epoch) samples = 100 * o->target;
            samples += o->target;
            r.epoch = e;
            r.samples_accumulated = samples;
            r.samples_per_second = 10;
        }
        last_epoch = e;
        uint8_t wire[VISC_PROGRESS_WIRE];
        if (visc_progress_encode(&r, wire) == 0)
            visc_dht_put(dht, "progress", wire, sizeof wire, 60, 5);
        struct timespec ts = {0, 500 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    visc_state_server_stop(server);
    return 0;
}

/* ---- main ---- */

static int parse(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->model = "resnet14", o->group_size = 3, o->batch_size = 16, o->max_steps = 4;
    o->seconds = 60;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--attack")) o->attack = v;
        else if (!strcmp(a, "--run-id")) o->run_id = v;
        else if (!strcmp(a, "--secret")) o->secret = v;
        else if (!strcmp(a, "--key")) o->key = v;
        else if (!strcmp(a, "--initial-peers")) o->peers = v;
        else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--output")) o->output = v;
        else if (!strcmp(a, "--target")) o->target = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--group-size")) o->group_size = atoi(v);
        else if (!strcmp(a, "--batch-size")) o->batch_size = atoi(v);
        else if (!strcmp(a, "--max-steps")) o->max_steps = atoi(v);
        else if (!strcmp(a, "--seconds")) o->seconds = atof(v);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else return fprintf(stderr, "swarm_hostile_trainer: unknown flag %s\n", a), -1;
    }
    if (!o->attack || !o->run_id || !o->secret || !o->key || !o->peers || !o->target)
        return fprintf(stderr, "swarm_hostile_trainer: needs --attack --run-id --secret --key "
                               "--initial-peers --target\n"),
               -1;
    int poison =
        !strcmp(o->attack, "nan") || !strcmp(o->attack, "huge") || !strcmp(o->attack, "reducer");
    if (!poison && strcmp(o->attack, "forge") && strcmp(o->attack, "epoch"))
        return fprintf(stderr, "swarm_hostile_trainer: unknown attack %s\n", o->attack), -1;
    if (poison && !o->output)
        return fprintf(stderr, "swarm_hostile_trainer: --attack %s needs --output\n", o->attack),
               -1;
    return 0;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o)) return 2;
    if (sodium_init() < 0) return 1;
    visc_identity id;
    visc_swarm_auth auth;
    if (visc_identity_load_or_create(o.key, &id) || visc_swarm_auth_init(&auth, o.run_id, &id) ||
        visc_swarm_auth_set_secret_file(&auth, o.secret) || visc_swarm_auth_check_config(&auth)) {
        fprintf(stderr, "swarm_hostile_trainer: %s\n", visc_last_error());
        return 1;
    }
    int client = !strcmp(o.attack, "nan") || !strcmp(o.attack, "huge");
    int trains = client || !strcmp(o.attack, "reducer");
    visc_swarm_node_config nc = {.listen = client ? NULL : "127.0.0.1:0",
                                 .initial_peers = o.peers,
                                 .auth = &auth,
                                 .client = client};
    visc_swarm_node *node = visc_swarm_node_open(&nc);
    if (!node) {
        fprintf(stderr, "swarm_hostile_trainer: %s\n", visc_last_error());
        visc_swarm_auth_free(&auth);
        return 1;
    }
    char pid[VISC_PEER_ID_CHARS + 1];
    visc_peer_id(id.public_key, pid);
    printf("hostile peer %s\n", pid);
    fflush(stdout);
    int rc = trains ? train_poisoned(&o, node) : forge(&o, node);
    if (rc) fprintf(stderr, "swarm_hostile_trainer: %s\n", visc_last_error());
    visc_swarm_node_close(node);
    visc_swarm_auth_free(&auth);
    return rc ? 1 : 0;
}

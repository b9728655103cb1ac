/* swarm_status.c: `visc swarm status` and `visc swarm monitor` (see
 * swarm_status.h): both join the swarm's DHT as a client peer (no
 * listener, no records of their own) and read the progress records. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "swarm_status.h"
#include "visc/core.h"

#ifndef VISC_WITH_SWARM
int visc_swarm_cmd_status(int argc, char **argv) {
    (void)argc, (void)argv;
    visc_die("swarm status: this visc was built without the swarm (SWARM=0, or libsodium-dev / "
             "libopendht-c-dev were missing at build time)");
}
int visc_swarm_cmd_monitor(int argc, char **argv) {
    (void)argc, (void)argv;
    visc_die("swarm monitor: this visc was built without the swarm (SWARM=0, or libsodium-dev / "
             "libopendht-c-dev were missing at build time)");
}
#else
#include "../swarm/node.h"
#include "../swarm/progress.h"
#include "swarm_flags.h"
#include "visc/io.h"

static volatile sig_atomic_t stop_requested;
static void on_stop(int sig) { (void)sig, stop_requested = 1; }

typedef struct {
    visc_swarm_flags flags;
    uint64_t target;
    double watch_s, seconds, interval_s;
    const char *logdir;
} options;

typedef struct {
    visc_swarm_auth auth;
    visc_swarm_node *node;
    visc_progress_tracker *tracker;
    visc_progress_record *records; /* VISC_DHT_MAX_GET */
} observer;

/* Where a command writes: stdout and stderr, or a test's files. */
typedef struct {
    FILE *out, *err;
} outputs;

static int fail(const outputs *io, const char *cmd, int status, const char *what) {
    fprintf(io->err, "visc: swarm %s: %s\n", cmd, what);
    fflush(io->err);
    return status;
}

static int parse_seconds(const char *v, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x > 0) || !isfinite(x))
        return visc_set_error("expected a number of seconds > 0, got '%s'", v);
    *out = x;
    return 0;
}

static int parse_count(const char *v, uint64_t *out) {
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || v[0] == '-' || x == 0 || x > VISC_PROGRESS_MAX_COUNT)
        return visc_set_error("expected a whole number > 0, got '%s'", v);
    *out = x;
    return 0;
}

/* Swarm flags and the commands' own; -1 with the error on a usage error.
 * `allowed` lists the own flags this command takes. */
static int parse(int argc, char **argv, const char *allowed, options *o) {
    memset(o, 0, sizeof *o);
    visc_swarm_flags_default(&o->flags);
    o->interval_s = 5;
    for (int i = 0; i < argc;) {
        int used = visc_swarm_flags_take(&o->flags, argc, argv, i);
        if (used < 0) return -1;
        if (used > 0) {
            i += used;
            continue;
        }
        const char *a = argv[i];
        if (a[0] != '-' || !strstr(allowed, a)) return visc_set_error("unknown option '%s'", a);
        if (i + 1 >= argc) return visc_set_error("option '%s' needs a value", a);
        const char *v = argv[i + 1];
        int rc = strcmp(a, "--target-batch-size") == 0 ? parse_count(v, &o->target)
                 : strcmp(a, "--watch") == 0           ? parse_seconds(v, &o->watch_s)
                 : strcmp(a, "--seconds") == 0         ? parse_seconds(v, &o->seconds)
                 : strcmp(a, "--interval") == 0        ? parse_seconds(v, &o->interval_s)
                 : strcmp(a, "--logdir") == 0          ? (o->logdir = v, 0)
                                                       : visc_set_error("unknown option '%s'", a);
        if (rc) return visc_set_error("%s: %s", a, visc_last_error());
        i += 2;
    }
    if (!o->flags.run_id) return visc_set_error("needs --run-id");
    if (!o->flags.initial_peers)
        return visc_set_error("needs --initial-peers HOST:PORT (a DHT node of the swarm)");
    return 0;
}

static void observer_close(observer *ob) {
    visc_progress_tracker_free(ob->tracker);
    if (ob->node) visc_swarm_node_close(ob->node);
    free(ob->records);
    visc_swarm_auth_free(&ob->auth);
    memset(ob, 0, sizeof *ob);
}

/* Joins as a client peer; -1 with the error when the swarm cannot be
 * reached (no bootstrap node answers). */
static int observer_open(observer *ob, const options *o) {
    memset(ob, 0, sizeof *ob);
    if (visc_swarm_flags_auth(&o->flags, &ob->auth)) return -1;
    visc_swarm_node_config nc = {.listen = o->flags.listen,
                                 .dht_port = o->flags.dht_port,
                                 .initial_peers = o->flags.initial_peers,
                                 .auth = &ob->auth,
                                 .client = 1};
    ob->node = visc_swarm_node_open(&nc);
    if (!ob->node) goto fail;
    if (visc_dht_node_count(visc_swarm_node_dht(ob->node)) == 0) {
        visc_set_error("cannot join run '%s': no DHT node answers at %s", o->flags.run_id,
                       o->flags.initial_peers);
        goto fail;
    }
    visc_progress_config pc = {.dht = visc_swarm_node_dht(ob->node),
                               .self_key = ob->auth.self.public_key,
                               .observe_only = 1,
                               .target_batch_size = o->target};
    ob->tracker = visc_progress_tracker_new(&pc);
    ob->records = visc_malloc(sizeof *ob->records * VISC_DHT_MAX_GET, "progress records");
    if (!ob->tracker || !ob->records) goto fail;
    return 0;
fail:;
    char why[512];
    snprintf(why, sizeof why, "%s", visc_last_error());
    observer_close(ob);
    return visc_set_error("%s", why);
}

static const char *role_name(uint8_t role) {
    return role == VISC_ROLE_CLIENT ? "client" : role == VISC_ROLE_AUX ? "aux" : "full";
}

/* Highest epoch first, then by peer id: the same swarm prints the same. */
static int cmp_record(const void *a, const void *b) {
    const visc_progress_record *x = a, *y = b;
    if (x->epoch != y->epoch) return x->epoch > y->epoch ? -1 : 1;
    return memcmp(x->peer, y->peer, VISC_KEY_BYTES);
}

static void print_status(FILE *out, const visc_swarm_progress_view *v, visc_progress_record *r,
                         int n) {
    qsort(r, (size_t)n, sizeof *r, cmp_record);
    uint64_t now_ms = visc_unix_ms();
    fprintf(out, "%-16s  %-6s  %8s  %12s  %10s  %8s  %9s  %s\n", "peer", "role", "epoch", "samples",
            "samples/s", "seen", "loss", "state address");
    for (int i = 0; i < n; i++) {
        char id[VISC_PEER_ID_CHARS + 1], loss[32] = "-";
        visc_peer_id(r[i].peer, id);
        if (!isnan(r[i].loss)) snprintf(loss, sizeof loss, "%.4f", (double)r[i].loss);
        double ago = now_ms > r[i].time_ms ? (double)(now_ms - r[i].time_ms) / 1000 : 0;
        fprintf(out, "%-16s  %-6s  %8llu  %12llu  %10.1f  %7.1fs  %9s  %s%s\n", id,
                role_name(r[i].role), (unsigned long long)r[i].epoch,
                (unsigned long long)r[i].samples_accumulated, r[i].samples_per_second, ago, loss,
                r[i].addr[0] ? r[i].addr : "-", r[i].paused ? "  (averaging)" : "");
    }
    char toward[96], eta[48];
    if (v->target)
        snprintf(toward, sizeof toward, "%llu of %llu samples toward the next step",
                 (unsigned long long)v->samples, (unsigned long long)v->target);
    else
        snprintf(toward, sizeof toward, "%llu samples toward the next step",
                 (unsigned long long)v->samples);
    if (v->ready) snprintf(eta, sizeof eta, "target reached");
    else if (isfinite(v->eta_s)) snprintf(eta, sizeof eta, "eta %.1f s", v->eta_s);
    else snprintf(eta, sizeof eta, "eta unknown");
    fprintf(out,
            "swarm: epoch %llu, %s, %.1f samples/s, %s, %d peers (%d at the epoch), %d "
            "distrusted, %d auxiliary\n",
            (unsigned long long)v->epoch, toward, v->samples_per_second, eta, v->peers,
            v->peers_at_epoch, v->distrusted, v->auxiliaries);
    fflush(out);
}

/* Sleeps until `until` (visc_now), or until a stop is asked for. */
static void sleep_until(double until) {
    while (!stop_requested) {
        double left = until - visc_now();
        if (left <= 0) break;
        struct timespec ts = {0, (long)(fmin(left, 0.05) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

typedef struct {
    struct sigaction old_int, old_term;
} signals;

static void catch_stop(signals *s) {
    stop_requested = 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &s->old_int);
    sigaction(SIGTERM, &sa, &s->old_term);
}

static void release_stop(const signals *s) {
    sigaction(SIGINT, &s->old_int, NULL);
    sigaction(SIGTERM, &s->old_term, NULL);
}

static int run_status(int argc, char **argv, const outputs *io) {
    options o;
    if (parse(argc, argv, "--target-batch-size --watch --seconds", &o))
        return fail(io, "status", 2, visc_last_error());
    observer ob;
    if (observer_open(&ob, &o)) return fail(io, "status", 1, visc_last_error());
    signals sig;
    catch_stop(&sig);
    double start = visc_now();
    int status = 0;
    for (int round = 0; !stop_requested; round++) {
        visc_swarm_progress_view v;
        int n = 0;
        if (visc_progress_refresh(ob.tracker, 1, &v, ob.records, VISC_DHT_MAX_GET, &n)) {
            status = fail(io, "status", 1, visc_last_error());
            break;
        }
        if (round) fputc('\n', io->out);
        print_status(io->out, &v, ob.records, n);
        if (o.watch_s <= 0) break;
        double next = start + (round + 1) * o.watch_s;
        if (o.seconds > 0 && next > start + o.seconds) break;
        sleep_until(next);
    }
    release_stop(&sig);
    observer_close(&ob);
    return status;
}

static void monitor_scalars(FILE *out, visc_tb_writer *tb, int64_t step,
                            const visc_swarm_progress_view *v, const visc_progress_record *r,
                            int n) {
    double loss = 0;
    int with_loss = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(r[i].loss)) loss += r[i].loss, with_loss++;
    visc_tb_scalar(tb, "swarm/samples_per_second", step, (float)v->samples_per_second);
    visc_tb_scalar(tb, "swarm/peers", step, (float)v->peers);
    visc_tb_scalar(tb, "swarm/epoch", step, (float)v->epoch);
    if (with_loss) visc_tb_scalar(tb, "swarm/loss", step, (float)(loss / with_loss));
    visc_tb_scalar(tb, "swarm/distrusted", step, (float)v->distrusted);
    visc_tb_flush(tb);
    char loss_text[32] = "-";
    if (with_loss) snprintf(loss_text, sizeof loss_text, "%.4f", loss / with_loss);
    fprintf(out,
            "swarm monitor: step %lld: epoch %llu, %d peers, %.1f samples/s, %llu samples toward "
            "the next step, loss %s, %d distrusted\n",
            (long long)step, (unsigned long long)v->epoch, v->peers, v->samples_per_second,
            (unsigned long long)v->samples, loss_text, v->distrusted);
    fflush(out);
}

static int run_monitor(int argc, char **argv, const outputs *io) {
    options o;
    if (parse(argc, argv, "--logdir --interval --seconds --target-batch-size", &o))
        return fail(io, "monitor", 2, visc_last_error());
    if (!o.logdir) return fail(io, "monitor", 2, "needs --logdir DIR (where the event file goes)");
    visc_tb_writer *tb = visc_tb_open(o.logdir);
    if (!tb) return fail(io, "monitor", 1, visc_last_error());
    observer ob;
    if (observer_open(&ob, &o)) {
        visc_tb_close(tb);
        return fail(io, "monitor", 1, visc_last_error());
    }
    fprintf(io->out, "swarm monitor: run '%s', scalars to %s every %.1f s\n", o.flags.run_id,
            visc_tb_path(tb), o.interval_s);
    signals sig;
    catch_stop(&sig);
    double start = visc_now();
    for (int64_t step = 0; !stop_requested; step++) {
        visc_swarm_progress_view v;
        int n = 0;
        /* a failed read is reported and the monitor keeps going: the
         * swarm may come back */
        if (visc_progress_refresh(ob.tracker, 1, &v, ob.records, VISC_DHT_MAX_GET, &n))
            fail(io, "monitor", 0, visc_last_error());
        monitor_scalars(io->out, tb, step, &v, ob.records, n);
        double next = start + (double)(step + 1) * o.interval_s;
        if (o.seconds > 0 && next > start + o.seconds) break;
        sleep_until(next);
    }
    release_stop(&sig);
    observer_close(&ob);
    visc_tb_close(tb);
    return 0;
}
int visc_swarm_cmd_status(int argc, char **argv) {
    outputs io = {stdout, stderr};
    return run_status(argc, argv, &io);
}

int visc_swarm_cmd_monitor(int argc, char **argv) {
    outputs io = {stdout, stderr};
    return run_monitor(argc, argv, &io);
}
#endif

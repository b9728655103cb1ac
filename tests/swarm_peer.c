/* swarm_peer.c: one peer of a test swarm, and the checker of what a swarm
 * of them produced (the multi-process all-reduce tests and the benchmark).
 *
 *   swarm_peer --keygen FILE            creates a key file, prints the public key
 *   swarm_peer [flags]                  one peer: one all-reduce round
 *   swarm_peer --check [flags] MEMBERS  verifies the peers' outputs
 *
 * A peer's vector is a pure function of (seed, index), values in [-1, 1),
 * so the checker can recompute everyone's input. The group comes from a
 * file the test writes (--group, after collecting every peer's --addr-out)
 * or from matchmaking on the DHT (--matchmake). The output file holds a
 * one-line JSON report, then the n floats of the result.
 *
 * Faults (--fault) are injected through the all-reduce hooks; a peer that
 * "dies" raises SIGKILL at that point, so nothing is cleaned up, as in a
 * real crash. */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "visc/core.h"
#include "visc/swarm.h"
#include "../src/swarm/allreduce.h"
#include "../src/swarm/wire.h"

typedef enum {
    F_NONE,
    F_NEVER_START,
    F_DIE_BEFORE_SEND,
    F_DIE_MID_STREAM,
    F_DIE_WHILE_REDUCING,
    F_STALL,
    F_NAN,
    F_INF,
    F_HUGE,
    F_WRONG_SIZE,
    F_OVERSIZED_LENGTH,
    F_REPLAY,
    F_UNKNOWN_KEY,
    F_NO_SECRET,
} fault_kind;

static const char *const fault_names[] = {"none",
                                          "never-start",
                                          "die-before-send",
                                          "die-mid-stream",
                                          "die-while-reducing",
                                          "stall",
                                          "nan",
                                          "inf",
                                          "huge",
                                          "wrong-size",
                                          "oversized-length",
                                          "replay",
                                          "unknown-key",
                                          "no-secret"};

typedef struct {
    const char *run, *key, *secret, *allow, *listen, *initial_peers, *addr_out, *group, *out;
    int dht_port, client, matchmake, group_size;
    uint64_t round;
    size_t n;
    uint64_t seed;
    double weight, bandwidth, wait_s, mm_time;
    fault_kind fault;
    visc_allreduce_config ar;
} peer_opts;

/* ---- the deterministic input vector ---- */

static uint64_t splitmix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Exactly representable: k / 2^23 - 1 for a 24-bit k. */
static float input_value(uint64_t seed, size_t i) {
    uint64_t u = splitmix(seed * 0x100000001b3ull ^ (uint64_t)i);
    return (float)((double)(u >> 40) / 8388608.0 - 1.0);
}

/* ---- faults ---- */

static fault_kind g_fault;
static atomic_int g_parts_sent;

static _Noreturn void die_now(void) {
    raise(SIGKILL);
    _exit(137);
}

/* Alive, connected, silent: sends no part and reduces nothing (the test
 * kills it). */
static _Noreturn void stall_forever(void) {
    for (int i = 0; i < 600; i++) sleep(1);
    _exit(3);
}

static size_t hook_send_part(void *ctx, int peer, int k, float *v, size_t count) {
    (void)ctx, (void)peer;
    switch (g_fault) {
    case F_DIE_BEFORE_SEND: die_now();
    case F_DIE_MID_STREAM:
        /* after some parts are on their way */
        if (k >= 1 || atomic_load(&g_parts_sent) >= 2) die_now();
        break;
    case F_STALL: stall_forever();
    case F_NAN: v[count / 2] = NAN; break;
    case F_INF: v[count / 2] = -INFINITY; break;
    case F_HUGE: v[count / 2] = 1e8f; break;
    case F_WRONG_SIZE: return count - 1;
    default: break;
    }
    atomic_fetch_add(&g_parts_sent, 1);
    return count;
}

static void hook_reduce(void *ctx, int k) {
    (void)ctx, (void)k;
    if (g_fault == F_DIE_WHILE_REDUCING) die_now();
    if (g_fault == F_STALL) stall_forever();
}

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        p += w, n -= (size_t)w;
    }
    return 0;
}

/* Reflects the first frame the other side sends (its hello) back to it:
 * genuine bytes of this very channel, replayed. */
static int reflect_first_frame(int fd) {
    uint8_t buf[4096];
    double end = visc_now() + 5;
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (visc_now() > end || poll(&pf, 1, 100) < 0) return -1;
        ssize_t got = recv(fd, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
        if (got == 0) return -1;
        if (got >= 4) {
            size_t len = 4 + visc_get_u32(buf);
            if (len > sizeof buf) return -1;
            if ((size_t)got >= len) return write_all(fd, buf, len);
        }
    }
}

static int hook_channel(void *ctx, int peer, visc_chan *ch) {
    (void)ctx, (void)peer;
    int fd = visc_chan_fd(ch);
    if (g_fault == F_OVERSIZED_LENGTH) {
        uint8_t junk[68];
        visc_put_u32(junk, 0xfffffff0u);
        for (int i = 4; i < 68; i++) junk[i] = (uint8_t)i;
        write_all(fd, junk, sizeof junk);
        return 1;
    }
    if (g_fault == F_REPLAY) {
        reflect_first_frame(fd);
        return 1;
    }
    return 0;
}

/* ---- files ---- */

static int write_file_atomic(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return visc_set_error("%s: %s", tmp, strerror(errno));
    int ok = fwrite(a, 1, na, f) == na && (nb == 0 || fwrite(b, 1, nb, f) == nb);
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) return visc_set_error("%s: cannot write", path);
    return 0;
}

static void hex(const uint8_t *p, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
}

static int parse_hex(const char *s, uint8_t *out, size_t n) {
    if (strlen(s) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (uint8_t)v;
    }
    return 0;
}

/* Group file: the group id (32 hex), then one line per member in group
 * order: public key (64 hex), address ("-" for a client), bandwidth,
 * client (0/1). Waits until it exists (the test writes it atomically). */
static int read_group(const char *path, const uint8_t self_key[32], double wait_s, visc_group *g) {
    double end = visc_now() + wait_s;
    FILE *f;
    while (!(f = fopen(path, "r"))) {
        if (visc_now() > end) return visc_set_error("group file %s did not appear", path);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    memset(g, 0, sizeof *g);
    g->self = -1;
    char id[64], key[130], addr[64];
    int rc = fscanf(f, "%63s", id) == 1 && parse_hex(id, g->id, 16) == 0 ? 0 : -1;
    double bw;
    int client;
    while (rc == 0 && fscanf(f, "%129s %63s %lf %d", key, addr, &bw, &client) == 4) {
        if (g->size >= VISC_GROUP_MAX) break;
        visc_group_member *mb = &g->members[g->size];
        if (parse_hex(key, mb->key, 32) != 0) rc = -1;
        snprintf(mb->addr, sizeof mb->addr, "%s", strcmp(addr, "-") ? addr : "");
        mb->bandwidth = bw, mb->client = client;
        if (memcmp(mb->key, self_key, 32) == 0) g->self = g->size;
        g->size++;
    }
    fclose(f);
    if (rc != 0 || g->self < 0)
        return visc_set_error("group file %s: malformed or without me", path);
    return 0;
}

/* ---- one peer ---- */

static int write_output(const peer_opts *o, int rc, int self, const visc_allreduce_report *r,
                        const float *x, const char *err) {
    char *js = malloc(16384);
    if (!js) return -1;
    size_t w = 0, cap = 16384;
    w += (size_t)snprintf(js + w, cap - w,
                          "{\"status\":%d,\"self\":%d,\"group_size\":%d,\"fraction\":%.17g,"
                          "\"failed_senders\":%"
                          "d,\"failed_reducers\":%d,\"banned\":%d,\"bytes_sent\":%llu,"
                          "\"bytes_received\":%llu,\"seconds\":%.6f,\"part_values\":%zu",
                          rc, self, r->group_size, r->averaged_fraction, r->failed_senders,
                          r->failed_reducers, r->banned, (unsigned long long)r->bytes_sent,
                          (unsigned long long)r->bytes_received, r->seconds, r->part_values);
    const char *names[] = {"member_failed", "parts_with", "results_back", "shard_begin"};
    for (int a = 0; a < 4; a++) {
        w += (size_t)snprintf(js + w, cap - w, ",\"%s\":[", names[a]);
        int cnt = a == 3 ? r->group_size + 1 : r->group_size;
        for (int i = 0; i < cnt; i++) {
            long long v = a == 0   ? r->member_failed[i]
                          : a == 1 ? r->parts_with[i]
                          : a == 2 ? r->results_back[i]
                                   : (long long)r->shard_begin[i];
            w += (size_t)snprintf(js + w, cap - w, "%s%lld", i ? "," : "", v);
        }
        w += (size_t)snprintf(js + w, cap - w, "]");
    }
    /* the message without quotes or backslashes, so the line stays JSON */
    char msg[600];
    snprintf(msg, sizeof msg, "%s", err ? err : r->what_failed);
    for (char *p = msg; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 32) *p = '\'';
    w += (size_t)snprintf(js + w, cap - w, ",\"what_failed\":\"%s\"}\n", msg);
    (void)o;
    int res = write_file_atomic(o->out, js, w, x, x ? o->n * sizeof(float) : 0);
    free(js);
    return res;
}

static int setup_auth(const peer_opts *o, visc_swarm_auth *auth) {
    visc_identity id;
    if (o->fault == F_UNKNOWN_KEY ? visc_identity_generate(&id)
                                  : visc_identity_load_or_create(o->key, &id))
        return -1;
    if (visc_swarm_auth_init(auth, o->run, &id) != 0) return -1;
    if (o->secret && o->fault != F_NO_SECRET &&
        visc_swarm_auth_set_secret_file(auth, o->secret) != 0)
        return -1;
    if (o->allow && visc_swarm_auth_allow_file(auth, o->allow) != 0) return -1;
    return visc_swarm_auth_check_config(auth);
}

static int run_peer(peer_opts *o) {
    g_fault = o->fault;
    visc_swarm_auth auth;
    memset(&auth, 0, sizeof auth);
    if (setup_auth(o, &auth) != 0) return -1;
    char pk[65];
    hex(auth.self.public_key, 32, pk);
    if (o->fault == F_NEVER_START) {
        /* a member the others expect, at an address where nobody listens */
        char line[128];
        int len = snprintf(line, sizeof line, "%s 127.0.0.1:1\n", pk);
        int rc = o->addr_out ? write_file_atomic(o->addr_out, line, (size_t)len, NULL, 0) : 0;
        visc_swarm_auth_free(&auth);
        return rc;
    }
    visc_swarm_node_config nc = {.listen = o->client ? NULL : o->listen,
                                 .dht_port = o->dht_port,
                                 .initial_peers = o->initial_peers,
                                 .auth = &auth,
                                 .bandwidth = o->bandwidth,
                                 .client = o->client};
    visc_swarm_node *node = visc_swarm_node_open(&nc);
    if (!node) {
        visc_swarm_auth_free(&auth);
        return -1;
    }
    if (o->addr_out) {
        char line[256];
        const char *addr = visc_swarm_node_address(node);
        visc_dht *d = visc_swarm_node_dht(node);
        int len = snprintf(line, sizeof line, "%s %s %d\n", pk, addr[0] ? addr : "-",
                           d ? visc_dht_port(d) : -1);
        if (write_file_atomic(o->addr_out, line, (size_t)len, NULL, 0) != 0) goto fail;
    }
    visc_group g;
    if (o->matchmake) {
        visc_matchmaking_config mc = {.round = o->round,
                                      .target_group_size = o->group_size,
                                      .min_group_size = 2,
                                      .matchmaking_time_s = o->mm_time};
        memcpy(mc.schema_hash, o->ar.schema_hash, 32);
        if (visc_matchmake(node, &mc, &g) != 0) goto fail;
    } else if (read_group(o->group, auth.self.public_key, o->wait_s, &g) != 0) {
        goto fail;
    }
    float *x = malloc(o->n * sizeof(float));
    float *err = o->ar.error_feedback ? calloc(o->n, sizeof(float)) : NULL;
    if (!x) goto fail;
    for (size_t i = 0; i < o->n; i++) x[i] = input_value(o->seed, i);
    visc_allreduce_hooks hooks = {.on_channel = hook_channel,
                                  .on_send_part = hook_send_part,
                                  .on_reduce = hook_reduce};
    o->ar.hooks = &hooks;
    visc_allreduce_report rep;
    int rc = visc_allreduce(node, &g, &o->ar, x, o->n, o->weight, err, &rep);
    char line[1024];
    visc_allreduce_report_line(&rep, line, sizeof line);
    fprintf(stderr, "swarm_peer %s: member %d of %d, rc %d: %s\n", pk, g.self, g.size, rc, line);
    int wr = write_output(o, rc, g.self, &rep, x, rc < 0 ? visc_last_error() : NULL);
    free(x);
    free(err);
    visc_swarm_node_close(node);
    visc_swarm_auth_free(&auth);
    return rc < 0 || wr != 0 ? -1 : 0;
fail:
    visc_swarm_node_close(node);
    visc_swarm_auth_free(&auth);
    return -1;
}

/* ---- the checker ---- */

typedef struct {
    int present, status, self, group_size, member_failed[VISC_GROUP_MAX];
    int parts_with[VISC_GROUP_MAX], results_back[VISC_GROUP_MAX];
    long long shard_begin[VISC_GROUP_MAX + 1];
    long long part_values;
    double fraction, seconds;
    char what_failed[600];
    float *x;
} peer_out;

static int json_array(const char *js, const char *key, long long *out, int cap) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":[", key);
    const char *p = strstr(js, pat);
    if (!p) return -1;
    p += strlen(pat);
    int cnt = 0;
    while (*p && *p != ']' && cnt < cap) {
        char *end;
        out[cnt++] = strtoll(p, &end, 10);
        if (end == p) return -1;
        p = *end == ',' ? end + 1 : end;
    }
    return cnt;
}

static int json_number(const char *js, const char *key, double *out) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(js, pat);
    if (!p) return -1;
    *out = strtod(p + strlen(pat), NULL);
    return 0;
}

static int load_output(const char *path, size_t n, peer_out *o) {
    FILE *f = fopen(path, "rb");
    if (!f) return visc_set_error("%s: no output", path);
    char line[16384];
    if (!fgets(line, sizeof line, f)) {
        fclose(f);
        return visc_set_error("%s: empty", path);
    }
    double v = 0;
    long long arr[VISC_GROUP_MAX + 1];
    int ok = json_number(line, "status", &v) == 0;
    o->status = (int)v;
    ok = ok && json_number(line, "self", &v) == 0;
    o->self = (int)v;
    ok = ok && json_number(line, "group_size", &v) == 0;
    o->group_size = (int)v;
    ok = ok && json_number(line, "fraction", &o->fraction) == 0;
    ok = ok && json_number(line, "seconds", &o->seconds) == 0;
    ok = ok && json_number(line, "part_values", &v) == 0;
    o->part_values = (long long)v;
    const char *names[] = {"member_failed", "parts_with", "results_back"};
    int *dst[] = {o->member_failed, o->parts_with, o->results_back};
    for (int a = 0; a < 3 && ok; a++) {
        ok = json_array(line, names[a], arr, VISC_GROUP_MAX) == o->group_size;
        for (int i = 0; ok && i < o->group_size; i++) dst[a][i] = (int)arr[i];
    }
    ok = ok &&
         json_array(line, "shard_begin", o->shard_begin, VISC_GROUP_MAX + 1) == o->group_size + 1;
    const char *w = strstr(line, "\"what_failed\":\"");
    if (w) snprintf(o->what_failed, sizeof o->what_failed, "%s", w + 15);
    o->x = malloc(n * sizeof(float));
    ok = ok && o->x && fread(o->x, sizeof(float), n, f) == n && fgetc(f) == EOF;
    fclose(f);
    if (!ok) return visc_set_error("%s: malformed output", path);
    o->present = 1;
    return 0;
}

typedef struct {
    int m;
    uint64_t seed[VISC_GROUP_MAX];
    double weight[VISC_GROUP_MAX];
    peer_out out[VISC_GROUP_MAX];
    size_t n;
    double tol;
} check_ctx;

static int fails;
#define BAD(...) (fprintf(stderr, "check: " __VA_ARGS__), fputc('\n', stderr), fails++)

/* Does part [b, e) equal the weighted mean of the members in mask? */
static int matches_mean(const check_ctx *c, unsigned long long mask, const float *v, size_t b,
                        size_t e, double *worst) {
    double wsum = 0;
    for (int p = 0; p < c->m; p++)
        if (mask >> p & 1) wsum += c->weight[p];
    *worst = 0;
    for (size_t i = b; i < e; i++) {
        double s = 0;
        for (int p = 0; p < c->m; p++)
            if (mask >> p & 1) s += c->weight[p] * input_value(c->seed[p], i);
        double d = fabs((double)v[i - b] - s / wsum);
        if (d > *worst) *worst = d;
    }
    return *worst <= c->tol;
}

/* Checks peer i's values on part k of shard j. */
static void check_part(const check_ctx *c, int i, int j, int k) {
    const peer_out *me = &c->out[i], *red = &c->out[j];
    size_t b = (size_t)me->shard_begin[j] + (size_t)k * (size_t)me->part_values;
    size_t e = (size_t)me->shard_begin[j + 1];
    if (e > b + (size_t)me->part_values) e = b + (size_t)me->part_values;
    const float *v = me->x + b;
    if (k >= me->results_back[j]) {
        for (size_t t = b; t < e; t++)
            if (me->x[t] != input_value(c->seed[i], t)) {
                BAD("peer %d: value %zu (shard %d part %d, not averaged) %.9g is not its own %.9g",
                    i, t, j, k, (double)me->x[t], (double)input_value(c->seed[i], t));
                return;
            }
        return;
    }
    double worst;
    if (red->present) {
        /* the reducer's report says who is in this part */
        unsigned long long mask = 0;
        for (int p = 0; p < c->m; p++)
            if (k < red->parts_with[p]) mask |= 1ull << p;
        if (!(mask >> j & 1)) BAD("shard %d part %d: its reducer is not in it", j, k);
        if (!matches_mean(c, mask, v, b, e, &worst))
            BAD("peer %d: shard %d part %d off the mean of its members by %g (tolerance %g)", i, j,
                k, worst, c->tol);
        if (memcmp(v, red->x + b, (e - b) * sizeof(float)) != 0)
            BAD("peer %d: shard %d part %d differs from what its reducer holds", i, j, k);
        return;
    }
    /* the reducer died after sending this part: it must be the mean of
     * some set of members that includes the reducer */
    for (unsigned long long mask = 0; mask < (1ull << c->m); mask++)
        if ((mask >> j & 1) && matches_mean(c, mask, v, b, e, &worst)) return;
    BAD("peer %d: shard %d part %d (reducer gone) is no mean of any members", i, j, k);
}

static int parse_expect_list(const char *s, int *flags, int m) {
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= m) return -1;
        flags[v] = 1;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return 0;
}

static int run_check(int argc, char **argv) {
    check_ctx *c = calloc(1, sizeof *c);
    const char *members = NULL, *complete = NULL;
    const char *lost = "", *excluded = "", *failed = "", *banned = "";
    visc_compression comp = VISC_COMP_NONE;
    double max_seconds = 1e9;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--n") && v) c->n = strtoull(v, NULL, 10), i++;
        else if (!strcmp(a, "--compression") && v) {
            if (visc_compression_parse(v, &comp) != 0) return 2;
            i++;
        } else if (!strcmp(a, "--expect-complete")) complete = "1";
        else if (!strcmp(a, "--max-seconds") && v) max_seconds = atof(v), i++;
        else if (!strcmp(a, "--expect-lost") && v) lost = v, i++;
        else if (!strcmp(a, "--expect-excluded") && v) excluded = v, i++;
        else if (!strcmp(a, "--expect-failed") && v) failed = v, i++;
        else if (!strcmp(a, "--expect-banned") && v) banned = v, i++;
        else if (a[0] != '-') members = a;
        else return fprintf(stderr, "check: unknown flag %s\n", a), 2;
    }
    /* each value passes through at most two roundings of the encoding (the
     * part sent, the result returned); inputs lie in [-1, 1) */
    c->tol = comp == VISC_COMP_NONE   ? 1e-6
             : comp == VISC_COMP_FP16 ? 2 * 0x1p-12 + 1e-6
             : comp == VISC_COMP_BF16 ? 2 * 0x1p-9 + 1e-6
                                      : 2.0 / 254 + 1e-5;
    FILE *f = members ? fopen(members, "r") : NULL;
    if (!f || c->n == 0) return fprintf(stderr, "check: need --n and a members file\n"), 2;
    /* lines: index seed weight output ("-": none); index "?": the group
     * index the output reports (groups formed by matchmaking) */
    char path[4096], idx_s[16];
    unsigned long long seed;
    double weight;
    int lines = 0;
    while (fscanf(f, "%15s %llu %lf %4095s", idx_s, &seed, &weight, path) == 4) {
        peer_out tmp = {0};
        int idx = lines;
        if (strcmp(idx_s, "?") == 0) {
            if (load_output(path, c->n, &tmp) != 0) BAD("%s", visc_last_error());
            idx = tmp.present ? tmp.self : -1;
        } else if (atoi(idx_s) != lines) {
            idx = -1;
        } else if (strcmp(path, "-") && load_output(path, c->n, &tmp) != 0) {
            BAD("member %d: %s", idx, visc_last_error());
        }
        if (idx < 0 || idx >= VISC_GROUP_MAX || c->out[idx].present || c->weight[idx] != 0) {
            free(tmp.x);
            fclose(f);
            return fprintf(stderr, "check: bad members file\n"), 2;
        }
        c->seed[idx] = seed, c->weight[idx] = weight, c->out[idx] = tmp;
        lines++;
    }
    fclose(f);
    c->m = lines;
    for (int i = 0; i < c->m; i++)
        if (c->weight[i] <= 0) return fprintf(stderr, "check: member %d missing\n", i), 2;
    int want_lost[VISC_GROUP_MAX] = {0}, want_excl[VISC_GROUP_MAX] = {0};
    int want_failed[VISC_GROUP_MAX] = {0}, want_banned[VISC_GROUP_MAX] = {0};
    if (parse_expect_list(lost, want_lost, c->m) || parse_expect_list(excluded, want_excl, c->m) ||
        parse_expect_list(failed, want_failed, c->m) ||
        parse_expect_list(banned, want_banned, c->m))
        return fprintf(stderr, "check: bad member list\n"), 2;
    int checked = 0;
    for (int i = 0; i < c->m; i++) {
        peer_out *o = &c->out[i];
        if (!o->present) continue;
        checked++;
        if (o->group_size != c->m) BAD("peer %d: group of %d, expected %d", i, o->group_size, c->m);
        if (o->seconds > max_seconds)
            BAD("peer %d: the round took %.2f s (at most %.2f)", i, o->seconds, max_seconds);
        if (o->status < 0) BAD("peer %d: round failed (%s", i, o->what_failed);
        if (complete && (o->status != 0 || o->fraction != 1.0 || o->what_failed[0] != '"'))
            BAD("peer %d: not complete: status %d, fraction %.6f, %s", i, o->status, o->fraction,
                o->what_failed);
        size_t lost_values = 0;
        for (int j = 0; j < c->m; j++) {
            size_t len = (size_t)(o->shard_begin[j + 1] - o->shard_begin[j]);
            int parts = (int)((len + (size_t)o->part_values - 1) / (size_t)o->part_values);
            if (o->results_back[j] < 0 || o->results_back[j] > parts)
                BAD("peer %d: results_back out of range", i);
            for (int k = 0; k < parts; k++) check_part(c, i, j, k);
            if (j == i) continue;
            if (want_lost[j]) {
                lost_values += len;
                if (o->results_back[j] != 0) BAD("peer %d: shard %d should be lost", i, j);
            }
            if (want_excl[j] && o->parts_with[j] != 0)
                BAD("peer %d: member %d's values are in %d parts", i, j, o->parts_with[j]);
            /* two clients share no channel */
            int linked = o->shard_begin[i] != o->shard_begin[i + 1] || len != 0;
            if (want_failed[j] && linked && !o->member_failed[j])
                BAD("peer %d: member %d not reported failed (%s", i, j, o->what_failed);
            if (want_banned[j] && o->member_failed[j] != 2)
                BAD("peer %d: member %d not reported banned (%s", i, j, o->what_failed);
            if (!want_failed[j] && !want_banned[j] && o->member_failed[j])
                BAD("peer %d: member %d reported failed (%s", i, j, o->what_failed);
        }
        if (lost[0]) {
            double want = 1.0 - (double)lost_values / (double)c->n;
            if (fabs(o->fraction - want) > 1e-12)
                BAD("peer %d: averaged fraction %.9f, expected %.9f", i, o->fraction, want);
        }
    }
    for (int i = 0; i < c->m; i++) free(c->out[i].x);
    free(c);
    fprintf(stderr, "check: %d peers checked, %d problems\n", checked, fails);
    return fails || !checked ? 1 : 0;
}

/* ---- flags ---- */

static int usage(void) {
    fprintf(
        stderr,
        "usage: swarm_peer --keygen FILE\n"
        "       swarm_peer --check --n N [--compression C] [--expect-complete] [--max-seconds S]\n"
        "                  [--expect-lost I,..] [--expect-excluded I,..] [--expect-failed I,..]\n"
        "                  [--expect-banned I,..] MEMBERS   (lines: index seed weight out|-)\n"
        "       swarm_peer --key F [--secret F] [--allow F] [--run ID] [--listen H:P] [--client]\n"
        "                  [--dht-port P] [--initial-peers L] [--addr-out F] (--group F | "
        "--matchmake\n"
        "                  [--group-size N] [--round R] [--mm-time S]) --n N --seed S [--weight "
        "W]\n"
        "                  [--bandwidth B] [--compression C] [--aggregation A] [--part-bytes B]\n"
        "                  [--round-timeout S] [--connect-timeout S] [--part-timeout S] [--slack "
        "X]\n"
        "                  [--error-feedback] [--wait S] [--fault F] --out F\n");
    return 2;
}

static int parse_peer(int argc, char **argv, peer_opts *o) {
    memset(o, 0, sizeof *o);
    o->run = "visc-test-run", o->listen = "127.0.0.1:0", o->dht_port = -1;
    o->weight = 1, o->bandwidth = 1e7, o->wait_s = 30, o->mm_time = 5, o->group_size = 2;
    visc_allreduce_config_default(&o->ar);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "--client")) o->client = 1, takes = 0;
        else if (!strcmp(a, "--matchmake")) o->matchmake = 1, takes = 0;
        else if (!strcmp(a, "--error-feedback")) o->ar.error_feedback = 1, takes = 0;
        else if (!v) return usage();
        else if (!strcmp(a, "--run")) o->run = v;
        else if (!strcmp(a, "--key")) o->key = v;
        else if (!strcmp(a, "--secret")) o->secret = v;
        else if (!strcmp(a, "--allow")) o->allow = v;
        else if (!strcmp(a, "--listen")) o->listen = v;
        else if (!strcmp(a, "--dht-port")) o->dht_port = atoi(v);
        else if (!strcmp(a, "--initial-peers")) o->initial_peers = v;
        else if (!strcmp(a, "--addr-out")) o->addr_out = v;
        else if (!strcmp(a, "--group")) o->group = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--group-size")) o->group_size = atoi(v);
        else if (!strcmp(a, "--round")) o->round = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--mm-time")) o->mm_time = atof(v);
        else if (!strcmp(a, "--n")) o->n = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--weight")) o->weight = atof(v);
        else if (!strcmp(a, "--bandwidth")) o->bandwidth = atof(v);
        else if (!strcmp(a, "--wait")) o->wait_s = atof(v);
        else if (!strcmp(a, "--part-bytes")) o->ar.part_bytes = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--round-timeout")) o->ar.round_timeout_s = atof(v);
        else if (!strcmp(a, "--connect-timeout")) o->ar.connect_timeout_s = atof(v);
        else if (!strcmp(a, "--part-timeout")) o->ar.part_timeout_min_s = atof(v);
        else if (!strcmp(a, "--slack")) o->ar.part_timeout_slack = atof(v);
        else if (!strcmp(a, "--compression")) {
            if (visc_compression_parse(v, &o->ar.compression) != 0) return usage();
        } else if (!strcmp(a, "--aggregation")) {
            if (visc_aggregation_parse(v, &o->ar.agg.mode) != 0) return usage();
        } else if (!strcmp(a, "--fault")) {
            int found = 0;
            for (size_t f = 0; f < sizeof fault_names / sizeof *fault_names; f++)
                if (!strcmp(v, fault_names[f])) o->fault = (fault_kind)f, found = 1;
            if (!found) return usage();
        } else return usage();
        i += takes;
    }
    if (!o->key || !o->out || !o->n || (!o->group && !o->matchmake)) return usage();
    if (o->matchmake && o->dht_port < 0) o->dht_port = 0;
    memset(o->ar.schema_hash, 0x5a, 32);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--check")) return run_check(argc, argv);
    if (argc == 3 && !strcmp(argv[1], "--keygen")) {
        visc_identity id;
        if (visc_identity_load_or_create(argv[2], &id) != 0) {
            fprintf(stderr, "swarm_peer: %s\n", visc_last_error());
            return 1;
        }
        char pk[65];
        hex(id.public_key, 32, pk);
        printf("%s\n", pk);
        return 0;
    }
    peer_opts o;
    if (parse_peer(argc, argv, &o) != 0) return 2;
    if (run_peer(&o) != 0) {
        fprintf(stderr, "swarm_peer: %s\n", visc_last_error());
        return 1;
    }
    return 0;
}

/* test_swarm_progress.c: progress records and the tracker (src/swarm/progress.c),
 * and `visc swarm status` / `visc swarm monitor` (src/cli/swarm_status.c).
 *
 * The wire form round-trips and parse refuses every malformed field. The
 * throughput EMA runs on a clock the test drives (so its values are
 * exact). Several DHT nodes in this process on 127.0.0.1 play the swarm:
 * trackers of honest peers, and "scripted" peers that publish records the
 * test writes (honest ones with chosen times, and forged ones). Times in
 * the records are real unix ms, so extrapolated counts are checked between
 * bounds taken before and after the refresh. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "../src/swarm/progress.h"
#include "swarm_join.h"
#include "test.h"
#include "visc/core.h"

/* The CLI's objects are in no library (the visc program links them), so
 * the commands under test are compiled into this binary. */
#include "../src/cli/swarm_flags.c"
#include "../src/cli/swarm_status.c"

#define RUN "progress-test"
#define OP_TIMEOUT 20.0 /* only reached when something is broken */
#define N_IDS 12

static const char secret[] = "progress test secret, 32+ bytes long";
static visc_identity ids[N_IDS];
static visc_swarm_auth auths[N_IDS];

static void setup(void) {
    static int done;
    if (done) return;
    done = 1;
    for (int i = 0; i < N_IDS; i++) {
        CHECK(visc_identity_generate(&ids[i]) == 0);
        CHECK(visc_swarm_auth_init(&auths[i], RUN, &ids[i]) == 0);
        CHECK(visc_swarm_auth_set_secret(&auths[i], secret, sizeof secret - 1) == 0);
    }
}

static visc_dht *open_node(int id, const visc_dht *peer) {
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", peer ? visc_dht_port(peer) : 0);
    visc_dht_config cfg = {.port = 0,
                           .initial_peers = peer ? peers : NULL,
                           .auth = &auths[id],
                           .bind_host = "127.0.0.1"};
    visc_dht *d = visc_dht_open(&cfg);
    CHECK_MSG(d != NULL, "open: %s", visc_last_error());
    return d;
}

/* 1 once the nodes d[0..n) have joined (see swarm_join.h) */
static int joined(visc_dht *const *d, int n) {
    int ok = swarm_await_joined(d, 0, n, OP_TIMEOUT) == 0;
    CHECK_MSG(ok, "the test's %d DHT nodes did not join", n);
    return ok;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void close_node(visc_dht *d) {
    double t0 = visc_now();
    visc_dht_close(d);
    if (getenv("VISC_DHT_TIMING")) fprintf(stderr, "# close: %.3f s\n", visc_now() - t0);
}

static double clock_of(void *ctx) { return *(double *)ctx; }

/* A tracker on node d for identity id, on the clock *now (NULL: real). */
static visc_progress_tracker *tracker(visc_dht *d, int id, double *now, uint64_t target,
                                      double expiration, double max_refresh) {
    visc_progress_config c = {.dht = d,
                              .self_key = ids[id].public_key,
                              .target_batch_size = target,
                              .expiration_s = expiration,
                              .max_refresh_s = max_refresh,
                              .op_timeout_s = OP_TIMEOUT,
                              .clock = now ? clock_of : NULL,
                              .clock_ctx = now};
    visc_progress_tracker *t = visc_progress_tracker_new(&c);
    CHECK_MSG(t != NULL, "tracker: %s", visc_last_error());
    return t;
}

/* A scripted peer's record, published from its own node. */
static void publish(visc_dht *d, uint64_t epoch, uint64_t samples, double sps, uint64_t time_ms,
                    int paused) {
    visc_progress_record r;
    memset(&r, 0, sizeof r);
    r.epoch = epoch, r.samples_accumulated = samples, r.samples_per_second = sps;
    r.time_ms = time_ms, r.paused = (uint8_t)paused, r.loss = NAN;
    uint8_t w[VISC_PROGRESS_WIRE];
    CHECK(visc_progress_encode(&r, w) == 0);
    CHECK_MSG(visc_dht_put(d, "progress", w, sizeof w, 30, OP_TIMEOUT) == 0, "put: %s",
              visc_last_error());
    sleep_s(0.005); /* the next record of this signer is issued later: newest wins */
}

static int refresh(visc_progress_tracker *t, visc_swarm_progress_view *v) {
    double t0 = visc_now();
    int rc = visc_progress_refresh(t, 1, v, NULL, 0, NULL);
    CHECK_MSG(rc == 0, "refresh: %s", visc_last_error());
    if (getenv("VISC_DHT_TIMING")) fprintf(stderr, "# refresh: %.3f s\n", visc_now() - t0);
    return rc;
}

/* ---- wire form ---- */

static visc_progress_record sample_record(void) {
    visc_progress_record r;
    memset(&r, 0, sizeof r);
    r.epoch = 7, r.samples_accumulated = 1234, r.samples_per_second = 98.5;
    r.time_ms = 1700000000123ull, r.role = VISC_ROLE_CLIENT, r.paused = 1, r.loss = 0.25f;
    strcpy(r.addr, "10.0.0.1:4000");
    for (int i = 0; i < 32; i++) r.state_hash[i] = (uint8_t)(i * 7 + 1);
    return r;
}

TEST(progress_wire_round_trip) {
    visc_progress_record r = sample_record(), back;
    uint8_t w[VISC_PROGRESS_WIRE];
    CHECK(visc_progress_encode(&r, w) == 0);
    CHECK(memcmp(w, "VSPR", 4) == 0 && w[4] == VISC_PROGRESS_VERSION);
    memset(&back, 0xaa, sizeof back);
    CHECK(visc_progress_parse(w, sizeof w, &back) == 0);
    CHECK(back.epoch == 7 && back.samples_accumulated == 1234);
    CHECK(back.samples_per_second == 98.5 && back.time_ms == 1700000000123ull);
    CHECK(back.role == VISC_ROLE_CLIENT && back.paused == 1 && back.loss == 0.25f);
    CHECK(strcmp(back.addr, "10.0.0.1:4000") == 0 &&
          memcmp(back.state_hash, r.state_hash, 32) == 0);
    for (int i = 0; i < VISC_KEY_BYTES; i++) CHECK(back.peer[i] == 0); /* not on the wire */
    /* no loss: NaN survives; an empty address is allowed */
    r.loss = NAN, r.addr[0] = 0, memset(r.addr, 0, sizeof r.addr);
    CHECK(visc_progress_encode(&r, w) == 0);
    CHECK(visc_progress_parse(w, sizeof w, &back) == 0 && isnan(back.loss) && !back.addr[0]);
    /* little-endian at the stated offsets */
    r = sample_record();
    CHECK(visc_progress_encode(&r, w) == 0);
    CHECK(w[7] == 7 && w[8] == 0 && w[15] == (1234 & 0xff) && w[16] == (1234 >> 8));
    CHECK(w[5] == VISC_ROLE_CLIENT && w[6] == 1 && memcmp(w + 43, "10.0.0.1:4000", 14) == 0);
}

TEST(progress_wire_rejects_malformed) {
    visc_progress_record r = sample_record(), back = r;
    uint8_t good[VISC_PROGRESS_WIRE + 1], w[VISC_PROGRESS_WIRE + 1];
    CHECK(visc_progress_encode(&r, good) == 0);
    good[VISC_PROGRESS_WIRE] = 0;
    CHECK(visc_progress_parse(good, VISC_PROGRESS_WIRE - 1, &back) == -1);
    CHECK(strstr(visc_last_error(), "expected 139") != NULL);
    CHECK(visc_progress_parse(good, VISC_PROGRESS_WIRE + 1, &back) == -1);
    CHECK(visc_progress_parse(good, 0, &back) == -1);
#define MUTATED(edit)                                                                              \
    (memcpy(w, good, sizeof good), (edit), visc_progress_parse(w, VISC_PROGRESS_WIRE, &back))
    CHECK(MUTATED(w[0] = 'X') == -1);
    CHECK(MUTATED(w[4] = 2) == -1);                /* version */
    CHECK(MUTATED(w[5] = 3) == -1);                /* role */
    CHECK(MUTATED(w[6] = 2) == -1);                /* flags */
    CHECK(MUTATED(w[14] = 0x40) == -1);            /* epoch beyond 2^53 */
    CHECK(MUTATED(w[22] = 0x01) == -1);            /* samples beyond 2^53 */
    CHECK(MUTATED(memset(w + 31, 0, 8)) == -1);    /* time 0 */
    CHECK(MUTATED(memset(w + 23, 0xff, 8)) == -1); /* NaN throughput */
    CHECK(MUTATED(w[30] = 0xc0) == -1);            /* negative throughput */
    CHECK(MUTATED((w[30] = 0x7f, w[29] = 0xf0, memset(w + 23, 0, 6))) == -1); /* +inf */
    CHECK(MUTATED((w[30] = 0x42, w[29] = 0x00)) == -1); /* 2^33-ish > 1e9 samples/s */
    CHECK(MUTATED((w[42] = 0x7f, w[41] = 0x80, w[40] = 0, w[39] = 0)) == -1); /* loss +inf */
    CHECK(MUTATED(memset(w + 43, 'a', 64)) == -1); /* address without its NUL */
    CHECK(MUTATED(w[45] = '\n') == -1);            /* a control byte */
    CHECK(MUTATED(w[45] = ' ') == -1);
    CHECK(MUTATED(w[43 + 30] = 'x') == -1);            /* bytes after the NUL */
    CHECK(MUTATED(w[44] = (uint8_t)0xc3) == -1);       /* not ASCII */
    CHECK(MUTATED(w[107] ^= 1) == 0);                  /* any state hash is fine */
    CHECK(MUTATED((w[42] = 0x7f, w[41] = 0xc0)) == 0); /* loss NaN: none */
#undef MUTATED
    /* encode refuses what parse would */
    uint8_t out[VISC_PROGRESS_WIRE];
    visc_progress_record bad = r;
    bad.samples_per_second = NAN;
    CHECK(visc_progress_encode(&bad, out) == -1);
    bad = r, bad.samples_per_second = -1;
    CHECK(visc_progress_encode(&bad, out) == -1);
    bad = r, bad.role = 3;
    CHECK(visc_progress_encode(&bad, out) == -1);
    bad = r, memset(bad.addr, 'a', sizeof bad.addr);
    CHECK(visc_progress_encode(&bad, out) == -1);
    bad = r, bad.loss = INFINITY;
    CHECK(visc_progress_encode(&bad, out) == -1);
    bad = r, bad.time_ms = 0;
    CHECK(visc_progress_encode(&bad, out) == -1);
}

/* ---- this peer's throughput (no network) ---- */

TEST(progress_throughput_ema_pauses_during_averaging) {
    setup();
    visc_dht *d = open_node(0, NULL);
    if (!d) return;
    double now = 100;
    visc_progress_tracker *t = tracker(d, 0, &now, 0, 0, 0);
    if (!t) return;
    visc_progress_record r;
    now += 1, visc_progress_add_samples(t, 100, 2.5f);
    visc_progress_local(t, &r);
    CHECK(r.samples_accumulated == 100 && r.samples_per_second == 100 && r.loss == 2.5f);
    CHECK(memcmp(r.peer, ids[0].public_key, VISC_KEY_BYTES) == 0);
    /* 5 s of averaging do not count: 100 samples in 1 s of compute */
    visc_progress_pause(t);
    visc_progress_local(t, &r);
    CHECK(r.paused == 1);
    now += 5;
    visc_progress_resume(t);
    now += 1, visc_progress_add_samples(t, 100, NAN);
    visc_progress_local(t, &r);
    CHECK(r.paused == 0 && r.loss == 2.5f); /* NaN keeps the last loss */
    CHECK_CLOSE(r.samples_per_second, 100, 1e-9, 0);
    /* a plain mean over the first 10 measurements (alpha 1/k) ... */
    double want = 100;
    now += 1, visc_progress_add_samples(t, 200, 1.0f);
    want += (200 - want) / 3;
    visc_progress_local(t, &r);
    CHECK_CLOSE(r.samples_per_second, want, 1e-9, 0);
    /* no time passed: folded into the next measurement (100 in 1 s) */
    visc_progress_add_samples(t, 50, 1.0f);
    visc_progress_local(t, &r);
    CHECK_CLOSE(r.samples_per_second, want, 1e-9, 0);
    now += 1, visc_progress_add_samples(t, 50, 1.0f);
    want += (100 - want) / 4;
    visc_progress_local(t, &r);
    CHECK_CLOSE(r.samples_per_second, want, 1e-9, 0);
    CHECK(r.samples_accumulated == 500);
    /* a pause within a measurement: 1 s compute, 3 s paused, 1 s compute */
    now += 1, visc_progress_pause(t), now += 3, visc_progress_resume(t), now += 1;
    visc_progress_add_samples(t, 218, 1.0f); /* 109 samples/s */
    want += (109 - want) / 5;
    visc_progress_local(t, &r);
    CHECK_CLOSE(r.samples_per_second, want, 1e-9, 0);
    for (int k = 6; k <= 10; k++) {
        now += 0.5, visc_progress_add_samples(t, 50, 1.0f);
        want += (100 - want) / k;
    }
    /* ... then the EMA with alpha 0.1 */
    now += 1, visc_progress_add_samples(t, 300, 1.0f);
    want = 0.9 * want + 0.1 * 300;
    visc_progress_local(t, &r);
    CHECK_CLOSE(r.samples_per_second, want, 1e-9, 0);
    double sps = want;
    /* the step: the count restarts, the throughput stays */
    visc_progress_set_epoch(t, 3);
    visc_progress_local(t, &r);
    CHECK(r.epoch == 3 && r.samples_accumulated == 0);
    CHECK_CLOSE(r.samples_per_second, sps, 1e-9, 0);
    /* delayed updates: samples computed while the step's round ran count
     * toward the new epoch, and are not measured again */
    visc_progress_carry_samples(t, 40);
    visc_progress_local(t, &r);
    CHECK(r.epoch == 3 && r.samples_accumulated == 40);
    CHECK_CLOSE(r.samples_per_second, sps, 1e-9, 0);
    /* local fields */
    visc_progress_set_local(t, VISC_ROLE_AUX, "127.0.0.1:9");
    uint8_t h[32] = {1, 2, 3};
    visc_progress_set_state_hash(t, h);
    visc_progress_local(t, &r);
    CHECK(r.role == VISC_ROLE_AUX && strcmp(r.addr, "127.0.0.1:9") == 0 && r.state_hash[2] == 3);
    visc_progress_set_local(t, VISC_ROLE_FULL, "bad address\x1b[2J");
    visc_progress_local(t, &r);
    CHECK(r.addr[0] == 0);
    visc_progress_tracker_free(t);
    /* bad configurations */
    visc_progress_config c = {.dht = d, .self_key = ids[0].public_key, .max_refresh_s = 60};
    CHECK(visc_progress_tracker_new(&c) == NULL); /* max refresh >= expiration */
    c.max_refresh_s = 0, c.min_refresh_s = -1;
    CHECK(visc_progress_tracker_new(&c) == NULL);
    c.min_refresh_s = 0, c.self_key = NULL;
    CHECK(visc_progress_tracker_new(&c) == NULL); /* a publisher without its key */
    c.dht = NULL, c.observe_only = 1;
    CHECK(visc_progress_tracker_new(&c) == NULL);
    close_node(d);
}

/* ---- the swarm's view ---- */

/* Peers at the global epoch add up, each extrapolated with its throughput
 * (a paused one not), the others do not; the epoch is the highest; a
 * step resets the count; eta and the refresh period follow. */
TEST(progress_view_sums_extrapolates_and_follows_the_epoch) {
    setup();
    visc_dht *d0 = open_node(0, NULL), *d1 = open_node(1, d0), *d2 = open_node(2, d0),
             *d3 = open_node(3, d0), *d4 = open_node(4, d0);
    if (!d0 || !d1 || !d2 || !d3 || !d4 || !joined((visc_dht *[]){d0, d1, d2, d3, d4}, 5)) return;
    double now0 = 0, now1 = 0;
    visc_progress_tracker *t0 = tracker(d0, 0, &now0, 2000, 60, 30);
    visc_progress_tracker *t1 = tracker(d1, 1, &now1, 2000, 60, 30);
    if (!t0 || !t1) return;
    visc_progress_set_local(t1, VISC_ROLE_FULL, "127.0.0.1:7001");
    uint64_t t_start = visc_unix_ms();
    now0 += 1, visc_progress_add_samples(t0, 100, 1.0f); /* 100 samples at 100/s */
    now1 += 2, visc_progress_add_samples(t1, 100, 1.0f); /* 100 samples at 50/s */
    uint64_t t_add = visc_unix_ms();
    visc_swarm_progress_view v;
    refresh(t1, &v);
    publish(d2, 0, 500, 40, t_add - 2000, 0);  /* measured 2 s ago: +80 */
    publish(d3, 0, 300, 10, t_add - 10000, 1); /* paused: exactly 300 */
    publish(d4, 1, 0, 0, t_add, 0);            /* a step ahead, nothing yet */
    publish(d4, 0, 60, 30, t_add, 0);          /* ... no: newest wins, epoch 0 */
    visc_progress_record recs[8];
    int n = 0;
    uint64_t before = visc_unix_ms();
    CHECK(visc_progress_refresh(t0, 1, &v, recs, 8, &n) == 0);
    uint64_t after = visc_unix_ms();
    CHECK(v.epoch == 0 && v.peers == 5 && v.peers_at_epoch == 5 && v.distrusted == 0);
    CHECK(n == 5 && memcmp(recs[0].peer, ids[0].public_key, VISC_KEY_BYTES) == 0);
    CHECK_CLOSE(v.samples_per_second, 100 + 50 + 40 + 10 + 30, 1e-9, 0);
    /* 100 + 100 + 500 + 300 + 60, plus each active peer's extrapolation:
     * t0 and t1 measured in [t_start, t_add], d2 at t_add - 2 s, d4 at t_add */
    double lo = 1060 + 80 + (double)(before - t_add) / 1000 * (100 + 50 + 40 + 30);
    double hi = 1060 + 80 + (double)(after - t_start) / 1000 * (100 + 50) +
                (double)(after - t_add) / 1000 * (40 + 30) + 1;
    CHECK_MSG((double)v.samples >= lo - 1 && (double)v.samples <= hi,
              "samples %llu not in [%.0f, %.0f]", (unsigned long long)v.samples, lo, hi);
    CHECK(!v.ready && v.target == 2000);
    CHECK_CLOSE(v.eta_s, (2000.0 - (double)v.samples) / 230, 1e-6, 0);
    CHECK_CLOSE(visc_progress_refresh_period(t0), v.eta_s / 4, 1e-6, 0);
    int seen_addr = 0;
    for (int i = 0; i < n; i++)
        seen_addr |= memcmp(recs[i].peer, ids[1].public_key, VISC_KEY_BYTES) == 0 &&
                     strcmp(recs[i].addr, "127.0.0.1:7001") == 0 && recs[i].loss == 1.0f;
    CHECK(seen_addr);
    /* t0 steps: the global epoch is 1 and only t0 counts, from 0 */
    visc_progress_set_epoch(t0, 1);
    before = visc_unix_ms();
    refresh(t0, &v);
    after = visc_unix_ms();
    CHECK(v.epoch == 1 && v.peers == 5 && v.peers_at_epoch == 1);
    CHECK_MSG(v.samples <= (after - before) / 10 + 1, "samples %llu",
              (unsigned long long)v.samples);
    CHECK_CLOSE(v.samples_per_second, 100, 1e-9, 0);
    /* ... and t1 sees t0's new record */
    refresh(t1, &v);
    CHECK(v.epoch == 1 && v.peers_at_epoch == 1 && v.peers == 5 && v.distrusted == 0);
    /* the target reached: ready, eta 0, the shortest period */
    visc_progress_set_epoch(t1, 1);
    now1 += 40, visc_progress_add_samples(t1, 2500, 1.0f); /* 62.5/s */
    refresh(t1, &v);
    CHECK(v.ready && v.eta_s == 0 && v.samples >= 2500 && v.peers_at_epoch == 2);
    CHECK(v.distrusted == 0);
    CHECK(visc_progress_refresh_period(t1) == 0.5);
    /* between refreshes nothing is read (the period has not passed) ... */
    publish(d2, 1, 700, 40, visc_unix_ms(), 0);
    CHECK(visc_progress_refresh(t1, 0, &v, NULL, 0, NULL) == 0 && v.peers_at_epoch == 2);
    /* ... and after it, the new record is */
    now1 += 0.5;
    CHECK(visc_progress_refresh(t1, 0, &v, NULL, 0, NULL) == 0 && v.peers_at_epoch == 3);
    CHECK(v.distrusted == 0 && v.peers == 5);
    /* no target: eta unknown, the longest period */
    visc_progress_tracker *t2 = tracker(d2, 2, NULL, 0, 60, 30);
    if (t2) {
        refresh(t2, &v);
        CHECK(!v.ready && isinf(v.eta_s) && visc_progress_refresh_period(t2) == 30);
        CHECK(v.distrusted == 0 && v.peers == 5 && v.epoch == 1);
        /* an auxiliary peer (its record replaces d2's, same signer) is in
         * no count but auxiliaries, even far ahead, and no peer of its own
         * view */
        visc_progress_set_local(t2, VISC_ROLE_AUX, "");
        visc_progress_set_epoch(t2, 9);
        CHECK(visc_progress_refresh(t2, 1, &v, recs, 8, &n) == 0);
        CHECK_MSG(v.peers == 4 && n == 4 && v.auxiliaries == 0 && v.epoch == 1,
                  "aux view: peers %d records %d auxiliaries %d epoch %llu", v.peers, n,
                  v.auxiliaries, (unsigned long long)v.epoch);
        refresh(t1, &v);
        CHECK_MSG(v.peers == 4 && v.auxiliaries == 1 && v.epoch == 1 && v.peers_at_epoch == 2 &&
                      v.distrusted == 0,
                  "peer view: peers %d auxiliaries %d epoch %llu at epoch %d", v.peers,
                  v.auxiliaries, (unsigned long long)v.epoch, v.peers_at_epoch);
        visc_progress_tracker_free(t2);
    }
    visc_progress_tracker_free(t1);
    visc_progress_tracker_free(t0);
    visc_dht *all[] = {d4, d3, d2, d1, d0};
    for (int i = 0; i < 5; i++) close_node(all[i]);
}

/* Redirects fd into a file (stderr, where distrust is reported); returns
 * the saved fd. */
static int redirect(int fd, const char *path) {
    fflush(stdout), fflush(stderr);
    int saved = dup(fd), f = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(saved >= 0 && f >= 0);
    dup2(f, fd);
    close(f);
    return saved;
}

static void restore(int fd, int saved) {
    fflush(stdout), fflush(stderr);
    dup2(saved, fd);
    close(saved);
}

static int count_of(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++) n++;
    return n;
}

static char *read_text(const char *path) {
    size_t size;
    char *text = (char *)visc_test_read_file(path, &size);
    CHECK_MSG(text != NULL, "cannot read %s", path);
    if (text) text[size] = 0;
    return text;
}

/* Forged progress: inflated samples (growth and a first record at a new
 * epoch), inflated throughput, an epoch far ahead. Each is distrusted and
 * reported once, and the swarm does not think the target is reached. */
TEST(progress_forged_peers_are_distrusted) {
    setup();
    enum { HONEST = 3, F_GROWTH = 3, F_SPS = 4, F_EPOCH = 5, F_NEW = 6, N = 7 };
    visc_dht *d[N] = {0};
    for (int i = 0; i < N; i++)
        if (!(d[i] = open_node(i, i ? d[0] : NULL))) return;
    if (!joined(d, N)) return;
    double clk[HONEST] = {0};
    visc_progress_tracker *t[HONEST];
    const double sps[HONEST] = {100, 120, 80};
    for (int i = 0; i < HONEST; i++) {
        if (!(t[i] = tracker(d[i], i, &clk[i], 100000, 20, 5))) return;
        clk[i] += 1, visc_progress_add_samples(t[i], (uint64_t)sps[i], 1.0f);
    }
    char path[] = "/tmp/visc-progress-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    int saved = redirect(2, path);
    visc_swarm_progress_view v[4];
    for (int i = HONEST - 1; i >= 0; i--) visc_progress_refresh(t[i], 1, &v[0], NULL, 0, NULL);
    uint64_t now = visc_unix_ms();
    publish(d[F_GROWTH], 0, 100, 100, now, 0);
    publish(d[F_SPS], 0, 100, 1e5, now, 0);
    publish(d[F_EPOCH], 50, 0, 100, now, 0);
    int rc1 = visc_progress_refresh(t[0], 1, &v[0], NULL, 0, NULL);
    clk[0] += 1;
    publish(d[F_GROWTH], 0, 1000000, 100, visc_unix_ms(), 0);
    int rc2 = visc_progress_refresh(t[0], 1, &v[1], NULL, 0, NULL);
    /* the honest peers step; a newcomer claims a full batch already */
    for (int i = 0; i < HONEST; i++) {
        visc_progress_set_epoch(t[i], 1);
        clk[i] += 1, visc_progress_add_samples(t[i], (uint64_t)sps[i], 1.0f);
        if (i) visc_progress_refresh(t[i], 1, &v[3], NULL, 0, NULL);
    }
    publish(d[F_NEW], 1, 200000, 100, visc_unix_ms(), 0);
    clk[0] += 1;
    visc_progress_record recs[16];
    int n = 0;
    int rc3 = visc_progress_refresh(t[0], 1, &v[2], recs, 16, &n);
    clk[0] += 1;
    int rc4 = visc_progress_refresh(t[0], 1, &v[3], NULL, 0, NULL); /* reported once */
    restore(2, saved);
    CHECK(rc1 == 0 && rc2 == 0 && rc3 == 0 && rc4 == 0);
    /* throughput and epoch at once; growth at the second read */
    CHECK_MSG(v[0].peers == 4 && v[0].distrusted == 2 && v[0].epoch == 0,
              "peers %d distrusted %d epoch %llu", v[0].peers, v[0].distrusted,
              (unsigned long long)v[0].epoch);
    CHECK(v[1].peers == 3 && v[1].distrusted == 3 && v[1].epoch == 0 && !v[1].ready);
    CHECK_MSG(v[1].samples < 300 + 300 * 5 + 1, "samples %llu", (unsigned long long)v[1].samples);
    CHECK(v[2].peers == 3 && v[2].distrusted == 4 && v[2].epoch == 1 && !v[2].ready);
    CHECK(v[2].peers_at_epoch == 3 && v[2].samples < 300 + 300 * 5 + 1);
    CHECK(v[3].distrusted == 4 && v[3].peers == 3);
    CHECK(n == 3);
    for (int i = 0; i < n; i++) {
        int honest = 0;
        for (int j = 0; j < HONEST; j++)
            honest |= memcmp(recs[i].peer, ids[j].public_key, VISC_KEY_BYTES) == 0;
        CHECK(honest);
    }
    char *err = read_text(path);
    unlink(path);
    if (!err) return;
    const char *reason[] = {"samples grew", "median", "more than one ahead",
                            "since the epoch began"};
    for (int f = F_GROWTH; f <= F_NEW; f++) {
        char line[128], id[VISC_PEER_ID_CHARS + 1];
        visc_peer_id(ids[f].public_key, id);
        snprintf(line, sizeof line, "visc: swarm: distrusting peer %s: ", id);
        /* each honest tracker may report it once; t0 does, and only once */
        const char *at = strstr(err, line);
        CHECK_MSG(at && strstr(at, reason[f - F_GROWTH]), "no report of peer %d (%s)", f,
                  reason[f - F_GROWTH]);
        CHECK_MSG(count_of(err, line) <= HONEST, "peer %d reported %d times", f,
                  count_of(err, line));
    }
    for (int j = 0; j < HONEST; j++) {
        char id[VISC_PEER_ID_CHARS + 1];
        visc_peer_id(ids[j].public_key, id);
        CHECK_MSG(!strstr(err, id), "honest peer %d distrusted:\n%s", j, err);
    }
    CHECK_MSG(count_of(err, "\n") == count_of(err, "visc: swarm: distrusting peer "),
              "other output on stderr:\n%s", err);
    free(err);
    for (int i = 0; i < HONEST; i++) visc_progress_tracker_free(t[i]);
    for (int i = N - 1; i >= 0; i--) close_node(d[i]);
}

/* One epoch ahead of the swarm: a liar that publishes the swarm's epoch
 * plus one, watched by the peer that steps last. Each scripted step of 1 s:
 * for 0.7 s the swarm is at e and the liar alone at e + 1; then another
 * peer has stepped to e + 1 (joining the liar there) while this one has
 * not. Without a 5 s break alone, only the share of time alone (0.7 of
 * it) gets the liar reported. Then an honest peer that always steps first
 * is alone ahead for 0.15 s of every step, joined for 0.15 s by the other
 * one, which steps second: never reported. */
static char *lone_epoch_run(int liar) {
    enum { SELF, FIRST, OTHER, N = 3, STEPS = 14 };
    visc_dht *d[N] = {0};
    char *err = NULL;
    for (int i = 0; i < N; i++)
        if (!(d[i] = open_node(liar ? 8 + i : i, i ? d[0] : NULL))) goto out;
    if (!joined(d, N)) goto out;
    double clk = 0;
    visc_progress_config c = {.dht = d[SELF],
                              .self_key = ids[liar ? 8 : 0].public_key,
                              .target_batch_size = 100000,
                              .expiration_s = 60,
                              .max_refresh_s = 5,
                              .op_timeout_s = OP_TIMEOUT,
                              .clock = clock_of,
                              .clock_ctx = &clk,
                              .corroborated_epochs = 1};
    visc_progress_tracker *t = visc_progress_tracker_new(&c);
    CHECK_MSG(t != NULL, "tracker: %s", visc_last_error());
    if (!t) goto out;
    char path[] = "/tmp/visc-progress-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    int saved = redirect(2, path);
    visc_swarm_progress_view v;
    for (uint64_t e = 0; e < STEPS; e++) {
        if (e) visc_progress_set_epoch(t, e);
        /* liar: FIRST is the liar one ahead, OTHER the swarm; honest:
         * FIRST steps first, OTHER with this peer */
        publish(d[FIRST], liar ? e + 1 : e, 0, 100, visc_unix_ms(), 0);
        publish(d[OTHER], e, 0, 100, visc_unix_ms(), 0);
        clk += 0.7;
        refresh(t, &v);
        if (!liar) { /* FIRST steps, alone ahead for a moment */
            publish(d[FIRST], e + 1, 0, 100, visc_unix_ms(), 0);
            clk += 0.15;
            refresh(t, &v);
        }
        publish(d[OTHER], e + 1, 0, 100, visc_unix_ms(), 0);
        clk += liar ? 0.3 : 0.15;
        refresh(t, &v);
    }
    restore(2, saved);
    err = read_text(path);
    unlink(path);
    visc_progress_tracker_free(t);
out:
    for (int i = N - 1; i >= 0; i--)
        if (d[i]) close_node(d[i]);
    return err;
}

TEST(progress_lone_epoch_ahead_is_reported_to_the_last_stepper) {
    setup();
    char id[VISC_PEER_ID_CHARS + 1];
    char *err = lone_epoch_run(1);
    visc_peer_id(ids[9].public_key, id);
    CHECK_MSG(err && strstr(err, id) && strstr(err, "not followed") &&
                  count_of(err, "not followed") == 1,
              "the liar %s not reported once:\n%s", id, err ? err : "(no output)");
    free(err);
    err = lone_epoch_run(0);
    visc_peer_id(ids[1].public_key, id);
    CHECK_MSG(err && !strstr(err, "not followed"), "an honest peer reported:\n%s",
              err ? err : "(no output)");
    free(err);
}

/* A peer that stops publishing drops out when its record expires. */
TEST(progress_dead_peer_expires_from_the_view) {
    setup();
    visc_dht *d0 = open_node(0, NULL), *d1 = open_node(1, d0), *d2 = open_node(2, d0);
    if (!d0 || !d1 || !d2 || !joined((visc_dht *[]){d0, d1, d2}, 3)) return;
    visc_progress_tracker *t0 = tracker(d0, 0, NULL, 0, 1.5, 1);
    visc_progress_tracker *t1 = tracker(d1, 1, NULL, 0, 1.5, 1);
    if (!t0 || !t1) return;
    visc_progress_add_samples(t1, 10, NAN);
    visc_swarm_progress_view v;
    double published = visc_now();
    refresh(t1, &v);
    refresh(t0, &v);
    CHECK(v.peers == 2);
    visc_progress_tracker_free(t1); /* dies: its record stays on the DHT until it expires */
    sleep_s(fmax(0, published + 1.6 - visc_now()));
    refresh(t0, &v);
    CHECK_MSG(v.peers == 1 && v.distrusted == 0, "peers %d", v.peers);
    visc_progress_tracker_free(t0);
    close_node(d2);
    close_node(d1);
    close_node(d0);
}

/* ---- visc swarm status / monitor ---- */

typedef struct {
    char dir[64], key[96], key2[96], secret[96], logdir[96];
} cli_files;

static void cli_files_make(cli_files *f) {
    snprintf(f->dir, sizeof f->dir, "/tmp/visc-status-XXXXXX");
    CHECK(mkdtemp(f->dir) != NULL);
    snprintf(f->key, sizeof f->key, "%s/key", f->dir);
    snprintf(f->secret, sizeof f->secret, "%s/secret", f->dir);
    snprintf(f->key2, sizeof f->key2, "%s/key2", f->dir);
    snprintf(f->logdir, sizeof f->logdir, "%s/tb", f->dir);
    int fd = open(f->secret, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, secret, sizeof secret - 1) == (ssize_t)(sizeof secret - 1));
    close(fd);
}

static void remove_tree(const char *dir) {
    DIR *dd = opendir(dir);
    if (!dd) return;
    struct dirent *e;
    while ((e = readdir(dd))) {
        if (e->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(p);
        else unlink(p);
    }
    closedir(dd);
    rmdir(dir);
}

/* Runs a command with its output and errors in files; its exit status.
 * text/err (free them) receive what it wrote. */
static int run_cli(int (*cmd)(int, char **, const outputs *), char **argv, char **text,
                   char **err) {
    int argc = 0;
    while (argv[argc]) argc++;
    outputs io = {tmpfile(), tmpfile()};
    CHECK(io.out && io.err);
    if (!io.out || !io.err) return -1;
    int rc = cmd(argc, argv, &io);
    FILE *f[2] = {io.out, io.err};
    char **dst[2] = {text, err};
    for (int i = 0; i < 2; i++) {
        long n = ftell(f[i]);
        rewind(f[i]);
        char *buf = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
        if (buf && n > 0 && fread(buf, 1, (size_t)n, f[i]) != (size_t)n) buf[0] = 0;
        fclose(f[i]);
        if (dst[i]) *dst[i] = buf;
        else free(buf);
    }
    return rc;
}

/* Joining through a port where nothing answers: one line, status 1. Runs
 * beside the other checks (it waits for the DHT's ping and close). */
typedef struct {
    char argv_peers[64], key[96], secret[96];
    int rc;
    char *err;
} unreachable_run;

static void *run_unreachable(void *arg) {
    unreachable_run *u = arg;
    char *argv[] = {"--run-id",
                    RUN,
                    "--initial-peers",
                    u->argv_peers,
                    "--key",
                    u->key,
                    "--swarm-secret-file",
                    u->secret,
                    "--listen",
                    "127.0.0.1:0",
                    NULL};
    u->rc = run_cli(run_status, argv, NULL, &u->err);
    return NULL;
}
typedef struct {
    int peers, epoch, loss, sps, distrusted;
    float last_peers, last_epoch, last_loss, last_sps;
} scalars_seen;

static void on_scalar(void *ctx, const char *tag, int64_t step, float value) {
    scalars_seen *s = ctx;
    (void)step;
    if (strcmp(tag, "swarm/peers") == 0) s->peers++, s->last_peers = value;
    if (strcmp(tag, "swarm/epoch") == 0) s->epoch++, s->last_epoch = value;
    if (strcmp(tag, "swarm/loss") == 0) s->loss++, s->last_loss = value;
    if (strcmp(tag, "swarm/samples_per_second") == 0) s->sps++, s->last_sps = value;
    if (strcmp(tag, "swarm/distrusted") == 0) s->distrusted++;
}

/* The table of two peers (t1: full, 64 samples at 64/s, loss 0.5, an
 * address; t2: client, 32 at 32/s, loss 1.5, none) at epoch 2. */
static void check_status_table(const char *out) {
    char id1[VISC_PEER_ID_CHARS + 1], id2[VISC_PEER_ID_CHARS + 1];
    visc_peer_id(ids[1].public_key, id1);
    visc_peer_id(ids[2].public_key, id2);
    CHECK_MSG(strstr(out, "peer ") == out && strstr(out, "state address\n"), "%s", out);
    const char *row1 = strstr(out, id1), *row2 = strstr(out, id2);
    CHECK_MSG(row1 && row2, "%s", out);
    if (!row1 || !row2) return;
    CHECK((row1 < row2) == (memcmp(ids[1].public_key, ids[2].public_key, 32) < 0));
    char id[32], role[16], loss[16], addr[80];
    unsigned long long epoch, samples;
    double sps, seen;
    CHECK(sscanf(row1, "%31s %15s %llu %llu %lf %lfs %15s %79s", id, role, &epoch, &samples, &sps,
                 &seen, loss, addr) == 8);
    CHECK(strcmp(id, id1) == 0 && strcmp(role, "full") == 0 && epoch == 2);
    CHECK(samples == 64 && sps == 64 && seen >= 0 && seen < 30);
    CHECK(strcmp(loss, "0.5000") == 0 && strcmp(addr, "127.0.0.1:7001") == 0);
    CHECK(sscanf(row2, "%31s %15s %llu %llu %lf %lfs %15s %79s", id, role, &epoch, &samples, &sps,
                 &seen, loss, addr) == 8);
    CHECK(strcmp(role, "client") == 0 && epoch == 2 && samples == 32 && sps == 32);
    CHECK(strcmp(loss, "1.5000") == 0 && strcmp(addr, "-") == 0);
    CHECK_MSG(strstr(out, "\nswarm: epoch 2, ") &&
                  strstr(out, " of 1000 samples toward the next step, 96.0 samples/s, eta ") &&
                  strstr(out, " s, 2 peers (2 at the epoch), 0 distrusted, 0 auxiliary\n"),
              "%s", out);
    CHECK(count_of(out, "\n") == 4); /* header, two peers, summary */
}

/* One event file with every scalar at every step; the last values. */
static void check_event_file(const char *logdir) {
    DIR *dd = opendir(logdir);
    CHECK(dd != NULL);
    int files = 0;
    scalars_seen s = {0};
    for (struct dirent *e; dd && (e = readdir(dd));) {
        if (!strstr(e->d_name, "events.out.tfevents.")) continue;
        files++;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", logdir, e->d_name);
        CHECK_MSG(visc_tb_read(p, on_scalar, &s) == 0, "%s", visc_last_error());
    }
    if (dd) closedir(dd);
    CHECK(files == 1);
    CHECK_MSG(s.peers >= 2 && s.peers == s.epoch && s.peers == s.loss && s.peers == s.sps &&
                  s.peers == s.distrusted,
              "scalars: peers %d epoch %d loss %d sps %d distrusted %d", s.peers, s.epoch, s.loss,
              s.sps, s.distrusted);
    CHECK(s.last_peers == 2 && s.last_epoch == 2 && s.last_loss == 1.0f && s.last_sps == 96);
}

TEST(progress_cli_status_and_monitor) {
    setup();
    cli_files f = {.dir = ""};
    cli_files_make(&f);
    /* a UDP port that never answers, for the unreachable case */
    int mute = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CHECK(mute >= 0 && bind(mute, (struct sockaddr *)&sa, sizeof sa) == 0 &&
          getsockname(mute, (struct sockaddr *)&sa, &sl) == 0);
    unreachable_run u = {.rc = -1};
    snprintf(u.argv_peers, sizeof u.argv_peers, "127.0.0.1:%d", ntohs(sa.sin_port));
    snprintf(u.key, sizeof u.key, "%s", f.key2);
    snprintf(u.secret, sizeof u.secret, "%s", f.secret);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, run_unreachable, &u) == 0);

    visc_dht *d0 = open_node(0, NULL), *d1 = open_node(1, d0), *d2 = open_node(2, d0);
    int up = d0 && d1 && d2 && joined((visc_dht *[]){d0, d1, d2}, 3);
    double c1 = 0, c2 = 0;
    visc_progress_tracker *t1 = up ? tracker(d1, 1, &c1, 0, 60, 30) : NULL;
    visc_progress_tracker *t2 = up ? tracker(d2, 2, &c2, 0, 60, 30) : NULL;
    if (t1 && t2) {
        visc_progress_set_local(t1, VISC_ROLE_FULL, "127.0.0.1:7001");
        visc_progress_set_local(t2, VISC_ROLE_CLIENT, NULL);
        visc_progress_set_epoch(t1, 2), visc_progress_set_epoch(t2, 2);
        c1 += 1, visc_progress_add_samples(t1, 64, 0.5f);
        c2 += 1, visc_progress_add_samples(t2, 32, 1.5f);
        visc_swarm_progress_view v;
        refresh(t1, &v);
        refresh(t2, &v);
        char peers[64];
        snprintf(peers, sizeof peers, "127.0.0.1:%d", visc_dht_port(d0));
        char *status[] = {"--run-id", RUN,           "--initial-peers",     peers,
                          "--key",    f.key,         "--swarm-secret-file", f.secret,
                          "--listen", "127.0.0.1:0", "--target-batch-size", "1000",
                          NULL};
        char *out = NULL, *err = NULL;
        int rc = run_cli(run_status, status, &out, &err);
        CHECK_MSG(rc == 0, "status: %d, %s", rc, err ? err : "");
        CHECK_MSG(err && !err[0], "stderr: %s", err ? err : "");
        if (out) check_status_table(out);
        free(out), free(err);
        /* usage errors: one line, status 2 */
        char *no_run[] = {"--initial-peers", peers, NULL};
        CHECK(run_cli(run_status, no_run, NULL, &err) == 2);
        CHECK_MSG(err && strcmp(err, "visc: swarm status: needs --run-id\n") == 0, "%s", err);
        free(err);
        char *unknown[] = {"--run-id", RUN, "--initial-peers", peers, "--logdir", "x", NULL};
        CHECK(run_cli(run_status, unknown, NULL, &err) == 2);
        CHECK_MSG(err && strcmp(err, "visc: swarm status: unknown option '--logdir'\n") == 0, "%s",
                  err);
        free(err);
        char *bad_target[] = {"--run-id", RUN, "--initial-peers", peers, "--target-batch-size",
                              "-5",       NULL};
        CHECK(run_cli(run_status, bad_target, NULL, NULL) == 2);
        char *no_logdir[] = {"--run-id", RUN, "--initial-peers", peers, NULL};
        CHECK(run_cli(run_monitor, no_logdir, NULL, NULL) == 2);
        /* the monitor: scalars each interval until --seconds */
        char *monitor[] = {"--run-id",
                           RUN,
                           "--initial-peers",
                           peers,
                           "--key",
                           f.key,
                           "--swarm-secret-file",
                           f.secret,
                           "--listen",
                           "127.0.0.1:0",
                           "--logdir",
                           f.logdir,
                           "--interval",
                           "0.25",
                           "--seconds",
                           "0.5",
                           NULL};
        rc = run_cli(run_monitor, monitor, &out, &err);
        CHECK_MSG(rc == 0, "monitor: %d %s", rc, err ? err : "");
        CHECK_MSG(out && count_of(out, "swarm monitor: step ") >= 2 &&
                      strstr(out, "step 0: epoch 2, 2 peers, 96.0 samples/s, ") &&
                      strstr(out, "loss 1.0000, 0 distrusted\n"),
                  "%s", out ? out : "");
        CHECK_MSG(err && !err[0], "stderr: %s", err ? err : "");
        free(out), free(err);
        check_event_file(f.logdir);
    }
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_MSG(u.rc == 1 && u.err &&
                  strstr(u.err, "visc: swarm status: cannot join run 'progress-test': no DHT "
                                "node answers at 127.0.0.1:") == u.err &&
                  count_of(u.err, "\n") == 1,
              "status %d: %s", u.rc, u.err ? u.err : "");
    free(u.err);
    if (mute >= 0) close(mute);
    remove_tree(f.dir);
    visc_progress_tracker_free(t2);
    visc_progress_tracker_free(t1);
    close_node(d2);
    close_node(d1);
    close_node(d0);
}

/* ---- a tracker on a lone DHT node (no other node stores anything) ---- */

/* Stores a record signed by identity id under "progress" on d (alone, so
 * the put "fails", but the node keeps it and reads it back). */
static void plant(visc_dht *d, int id, const uint8_t *value, size_t n) {
    static uint8_t wire[VISC_RECORD_MAX_WIRE];
    sleep_s(0.003); /* each record of a signer issued later than the last */
    uint64_t now = visc_unix_ms();
    int len =
        visc_record_encode(&auths[id], "progress", value, n, now, now + 30000, wire, sizeof wire);
    CHECK(len > 0);
    if (len > 0) visc_dht_put_wire(d, "progress", wire, (size_t)len, OP_TIMEOUT);
}

static void plant_progress(visc_dht *d, int id, uint64_t samples) {
    visc_progress_record r;
    memset(&r, 0, sizeof r);
    r.samples_accumulated = samples, r.samples_per_second = 100, r.loss = NAN;
    r.time_ms = visc_unix_ms();
    uint8_t w[VISC_PROGRESS_WIRE];
    CHECK(visc_progress_encode(&r, w) == 0);
    plant(d, id, w, sizeof w);
}

/* A peer gone for more than two expirations is forgotten: caught lying
 * again later, it is reported again (a remembered one is reported once). */
TEST(progress_forgets_peers_gone_for_long) {
    setup();
    visc_dht *d = open_node(0, NULL);
    if (!d) return;
    double clk = 100;
    visc_progress_config c = {.dht = d,
                              .observe_only = 1,
                              .expiration_s = 20,
                              .max_refresh_s = 5,
                              .op_timeout_s = OP_TIMEOUT,
                              .clock = clock_of,
                              .clock_ctx = &clk};
    visc_progress_tracker *t = visc_progress_tracker_new(&c);
    CHECK_MSG(t != NULL, "%s", visc_last_error());
    if (!t) return;
    char path[] = "/tmp/visc-progress-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    int saved = redirect(2, path);
    visc_swarm_progress_view v[4];
    int rc = 0;
    for (int pass = 0; pass < 2; pass++) {
        plant_progress(d, 1, 100);
        rc |= visc_progress_refresh(t, 1, &v[2 * pass], NULL, 0, NULL);
        clk += 1;
        plant_progress(d, 1, 10000000); /* far more than 100 samples/s allow */
        rc |= visc_progress_refresh(t, 1, &v[2 * pass + 1], NULL, 0, NULL);
        if (pass) break;
        /* it goes silent (its newest record no longer parses) for long */
        plant(d, 1, (const uint8_t *)"junk", 4);
        clk += 41;
        rc |= visc_progress_refresh(t, 1, NULL, NULL, 0, NULL);
        clk += 1;
        rc |= visc_progress_refresh(t, 1, NULL, NULL, 0, NULL);
    }
    restore(2, saved);
    CHECK_MSG(rc == 0, "%s", visc_last_error());
    CHECK(v[0].peers == 1 && v[0].distrusted == 0 && v[1].peers == 0 && v[1].distrusted == 1);
    CHECK(v[2].peers == 1 && v[2].distrusted == 0 && v[3].peers == 0 && v[3].distrusted == 1);
    char *err = read_text(path);
    unlink(path);
    char id[VISC_PEER_ID_CHARS + 1], line[96];
    visc_peer_id(ids[1].public_key, id);
    snprintf(line, sizeof line, "visc: swarm: distrusting peer %s: samples grew", id);
    CHECK_MSG(err && count_of(err, line) == 2, "%s", err ? err : "(no output)");
    free(err);
    visc_progress_tracker_free(t);
    close_node(d);
}

/* A publish no node confirms is an error (the view is filled all the
 * same), and so is a target batch size beyond what records can count. */
TEST(progress_failed_publish_is_reported) {
    setup();
    visc_dht *d = open_node(0, NULL);
    if (!d) return;
    visc_progress_tracker *t = tracker(d, 0, NULL, 100, 20, 5);
    if (!t) return;
    visc_progress_add_samples(t, 10, NAN);
    visc_swarm_progress_view v;
    memset(&v, 0, sizeof v);
    CHECK(visc_progress_refresh(t, 1, &v, NULL, 0, NULL) == -1);
    CHECK_MSG(strstr(visc_last_error(), "publishing progress: dht: put of \"progress\" failed"),
              "%s", visc_last_error());
    CHECK(v.peers == 1 && v.target == 100);
    /* still due: the next refresh tries again (and fails again) */
    CHECK(visc_progress_refresh(t, 0, &v, NULL, 0, NULL) == -1);
    visc_progress_tracker_free(t);
    visc_progress_config c = {.dht = d, .self_key = ids[0].public_key};
    c.target_batch_size = VISC_PROGRESS_MAX_COUNT + 1;
    CHECK(visc_progress_tracker_new(&c) == NULL && strstr(visc_last_error(), "too large"));
    close_node(d);
}

/* ---- background publishing and reading (what training peers use) ---- */

static visc_progress_tracker *background_tracker(visc_dht *d, int id) {
    /* no target: the period is the longest (30 s), so the reader thread
     * reads at its start and not again within this test: what arrives
     * later arrives pushed */
    visc_progress_config c = {.dht = d,
                              .self_key = ids[id].public_key,
                              .expiration_s = 60,
                              .max_refresh_s = 30,
                              .op_timeout_s = OP_TIMEOUT,
                              .background = 1};
    visc_progress_tracker *t = visc_progress_tracker_new(&c);
    CHECK_MSG(t != NULL, "tracker: %s", visc_last_error());
    return t;
}

/* Refreshes t without force until pred holds (bounded). */
static int await_view(visc_progress_tracker *t, int (*pred)(const visc_swarm_progress_view *),
                      visc_swarm_progress_view *v) {
    double until = visc_now() + OP_TIMEOUT;
    do {
        visc_progress_refresh(t, 0, v, NULL, 0, NULL);
        if (pred(v)) return 1;
        sleep_s(0.01);
    } while (visc_now() < until);
    return 0;
}

static int sees_two_peers(const visc_swarm_progress_view *v) { return v->peers == 2; }
static int at_epoch_4(const visc_swarm_progress_view *v) { return v->epoch == 4; }
static int sees_epoch_5(const visc_swarm_progress_view *v) {
    return v->epoch == 5 && v->peers_at_epoch == 1;
}

/* A background tracker publishes its record when it changes and follows
 * the others' records as they are published, with no forced refresh and
 * no read due: its refreshes only look at what the threads and the DHT's
 * pushes brought. */
TEST(progress_background_publishes_changes_and_follows_pushes) {
    setup();
    visc_dht *d0 = open_node(0, NULL), *d1 = open_node(1, d0), *d2 = open_node(2, d0);
    if (!d0 || !d1 || !d2 || !joined((visc_dht *[]){d0, d1, d2}, 3)) return;
    visc_progress_tracker *t1 = background_tracker(d1, 1);
    if (!t1) return;
    visc_swarm_progress_view v;
    publish(d0, 3, 10, 5, visc_unix_ms(), 0);
    CHECK_MSG(await_view(t1, sees_two_peers, &v), "peers %d", v.peers);
    /* the scripted peer steps: seen pushed, within await_view's bound
     * (OP_TIMEOUT, 20 s), before the next read is due (30 s) */
    publish(d0, 4, 0, 5, visc_unix_ms(), 0);
    CHECK_MSG(await_view(t1, at_epoch_4, &v), "epoch %llu", (unsigned long long)v.epoch);
    /* t1 steps, and nobody calls its refresh: the publisher sends it */
    visc_progress_set_epoch(t1, 5); /* one ahead: more would be distrusted */
    visc_progress_tracker *t2 = tracker(d2, 2, NULL, 0, 60, 30);
    int seen = 0;
    for (double until = visc_now() + OP_TIMEOUT; !seen && visc_now() < until; sleep_s(0.05)) {
        visc_progress_refresh(t2, 1, &v, NULL, 0, NULL);
        seen = sees_epoch_5(&v);
    }
    CHECK_MSG(seen, "t2 sees epoch %llu", (unsigned long long)v.epoch);
    visc_progress_tracker_free(t2);
    visc_progress_tracker_free(t1);
    close_node(d2);
    close_node(d1);
    close_node(d0);
}

static int failed_refresh(visc_progress_tracker *t) {
    visc_swarm_progress_view v;
    for (double until = visc_now() + OP_TIMEOUT; visc_now() < until; sleep_s(0.02))
        if (visc_progress_refresh(t, 0, &v, NULL, 0, NULL) == -1) return 1;
    return 0;
}

/* What the publisher thread fails at, the next refresh returns (once). */
TEST(progress_background_failed_publish_is_reported) {
    setup();
    visc_dht *d = open_node(0, NULL); /* alone: no node stores a record */
    if (!d) return;
    visc_progress_tracker *t = background_tracker(d, 0);
    if (!t) return;
    CHECK(failed_refresh(t));
    CHECK_MSG(strstr(visc_last_error(), "publishing progress: dht: put of \"progress\" failed"),
              "%s", visc_last_error());
    visc_progress_tracker_free(t);
    close_node(d);
}

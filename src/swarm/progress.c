/* progress.c: progress records (wire form), this peer's throughput, and the
 * swarm's view with its plausibility checks (progress.h says the rules). */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"
#include "visc/core.h"

#define KEY "progress"
#define EMA_ALPHA 0.1      /* after a warm-up of 1/EMA_ALPHA measurements */
#define MIN_MEASURE_S 1e-3 /* shorter stretches are folded into the next measurement */
#define GROWTH_FACTOR 3.0  /* slack on claimed throughput x elapsed time */
#define GROWTH_SLACK_S 2.0 /* plus this many seconds of claimed throughput */
#define SPS_MEDIAN_FACTOR 10.0
#define LONE_REPORT_S 5.0 /* a lone epoch ahead is reported after this long alone, */
#define LONE_SHARE 0.6    /* and alone for this share of the time since first seen */
#define PEER_TABLE_MAX (VISC_DHT_MAX_GET + 64)
#define POLL_S 0.05 /* the background threads look at their schedule this often */
/* With background, a put's confirmation is awaited this long: it comes in
 * a millisecond or two on a healthy swarm nearby (the record is stored
 * when the caller goes on), and only after seconds while a killed peer
 * lingers in the key's search (dht.h, visc_dht_send), when the live nodes
 * have the record all the same. */
#define SEND_WAIT_S 0.05

/* ---- wire form ---- */

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_f64(uint8_t *p, double d) {
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    put_u64(p, v);
}

static double get_f64(const uint8_t *p) {
    uint64_t v = get_u64(p);
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

static void put_f32(uint8_t *p, float f) {
    uint32_t v;
    memcpy(&v, &f, sizeof v);
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static float get_f32(const uint8_t *p) {
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &v, sizeof f);
    return f;
}

/* An address field: printable ASCII (no spaces: it ends up in terminals
 * and tables), NUL-terminated within the field, zeros after the NUL. */
static int check_addr(const char *a, size_t cap) {
    size_t len = 0;
    while (len < cap && a[len]) {
        if (a[len] < 0x21 || a[len] > 0x7e)
            return visc_set_error("progress record: address "
                                  "holds a non-printable byte");
        len++;
    }
    if (len == cap) return visc_set_error("progress record: address is not NUL-terminated");
    for (size_t i = len; i < cap; i++)
        if (a[i]) return visc_set_error("progress record: bytes after the address's end");
    return 0;
}

static int check_record(const visc_progress_record *p) {
    if (p->role > VISC_ROLE_AUX) return visc_set_error("progress record: unknown role %u", p->role);
    if (p->paused > 1) return visc_set_error("progress record: bad paused flag");
    if (p->epoch > VISC_PROGRESS_MAX_COUNT || p->samples_accumulated > VISC_PROGRESS_MAX_COUNT)
        return visc_set_error("progress record: epoch or samples out of range");
    if (p->time_ms == 0 || p->time_ms > VISC_PROGRESS_MAX_COUNT)
        return visc_set_error("progress record: time out of range");
    if (!isfinite(p->samples_per_second) || p->samples_per_second < 0 ||
        p->samples_per_second > VISC_PROGRESS_MAX_SPS)
        return visc_set_error("progress record: throughput is not a number in [0, %g]",
                              VISC_PROGRESS_MAX_SPS);
    if (isinf(p->loss)) return visc_set_error("progress record: infinite loss");
    return check_addr(p->addr, sizeof p->addr);
}

int visc_progress_encode(const visc_progress_record *p, uint8_t out[VISC_PROGRESS_WIRE]) {
    if (check_record(p)) return -1;
    memcpy(out, "VSPR", 4);
    out[4] = VISC_PROGRESS_VERSION;
    out[5] = p->role;
    out[6] = p->paused;
    put_u64(out + 7, p->epoch);
    put_u64(out + 15, p->samples_accumulated);
    put_f64(out + 23, p->samples_per_second);
    put_u64(out + 31, p->time_ms);
    put_f32(out + 39, isnan(p->loss) ? NAN : p->loss);
    memcpy(out + 43, p->addr, 64);
    memcpy(out + 107, p->state_hash, 32);
    return 0;
}

int visc_progress_parse(const uint8_t *value, size_t n, visc_progress_record *out) {
    if (n != VISC_PROGRESS_WIRE)
        return visc_set_error("progress record: %zu bytes, expected %d", n, VISC_PROGRESS_WIRE);
    if (memcmp(value, "VSPR", 4) != 0) return visc_set_error("progress record: bad magic");
    if (value[4] != VISC_PROGRESS_VERSION)
        return visc_set_error("progress record: unknown version %u", value[4]);
    if (value[6] > 1) return visc_set_error("progress record: unknown flags 0x%02x", value[6]);
    visc_progress_record r;
    memset(&r, 0, sizeof r);
    r.role = value[5];
    r.paused = value[6];
    r.epoch = get_u64(value + 7);
    r.samples_accumulated = get_u64(value + 15);
    r.samples_per_second = get_f64(value + 23);
    r.time_ms = get_u64(value + 31);
    r.loss = get_f32(value + 39);
    memcpy(r.addr, value + 43, 64);
    memcpy(r.state_hash, value + 107, 32);
    if (check_record(&r)) return -1;
    *out = r;
    return 0;
}

/* ---- the tracker ---- */

typedef struct {
    uint8_t key[VISC_KEY_BYTES];
    visc_progress_record cur;  /* from the latest read */
    visc_progress_record last; /* the one before: what growth is checked against */
    int has_last;
    int live;    /* in the latest read */
    int trusted; /* the verdict on cur */
    int reported;
    /* alone ahead (report_lone_epochs; tracker clock): without a break
     * since lone_since (lone); watched since lone_seen (watched), alone for
     * lone_total seconds of it, last looked at at lone_checked; said once */
    int lone, watched, ahead_reported;
    double lone_since, lone_seen, lone_total, lone_checked;
    double distrust_until; /* tracker clock */
    double seen_at;
} peer_entry;

typedef struct {
    uint8_t signer[VISC_KEY_BYTES];
    uint64_t issued_ms, expires_ms;
    int parsed;               /* 0: the newest record does not parse (the peer is not live) */
    visc_progress_record rec; /* when parsed */
} known_record;

struct visc_progress_tracker {
    visc_progress_config cfg;
    pthread_mutex_t mu;         /* guards the local fields and the publishing schedule */
    pthread_mutex_t publish_mu; /* held by whoever publishes */
    pthread_cond_t changed;     /* the record changed, or stopping: wakes the publisher */
    visc_progress_record local;
    int measured, paused;                /* measured: throughput measurements so far */
    uint64_t changes, published_changes; /* the record's changes made, and published */
    double active_s, active_since;       /* compute time since the last measurement */
    uint64_t pending;                    /* samples not yet in a measurement */
    int published;
    double last_publish;

    /* The records learned (learn): from reads, and with cfg.background
     * from the reader thread's reads and the DHT's pushes too. */
    pthread_mutex_t known_mu;
    known_record *known; /* PEER_TABLE_MAX */
    int n_known;
    visc_record *recs; /* the refresh caller's read buffer (VISC_DHT_MAX_GET), at its first read */

    /* The swarm as judged from them (absorb), guarded by view_mu */
    pthread_mutex_t view_mu;
    pthread_cond_t stop_cv; /* with view_mu: wakes the reader to stop */
    int fetched;
    double last_fetch, eta_s; /* last_fetch: the last absorb */
    peer_entry *peers;
    int n_peers;
    double *sps_scratch; /* PEER_TABLE_MAX + 1: check_throughput's (judged at every batch) */
    /* The epoch whose beginning this tracker saw (the global epoch rose by
     * one between two reads that both saw other peers): it began no
     * earlier than floor_time. */
    int has_floor, prev_others;
    int aux_live; /* auxiliary peers' live records at the last absorb */
    uint64_t floor_epoch, prev_global;
    double floor_time;

    /* cfg.background: the publisher and reader threads and the listener;
     * what failed in them, for the next refresh to return (under view_mu) */
    pthread_t publisher, reader;
    int publisher_started, reader_started, stopping, listening, listen_handle;
    char bg_error[256];
};

static int start_background(visc_progress_tracker *t);
static void stop_background(visc_progress_tracker *t);

static double tclock(const visc_progress_tracker *t) {
    return t->cfg.clock ? t->cfg.clock(t->cfg.clock_ctx) : visc_now();
}

static int positive_or_default(double *v, double def, const char *what) {
    if (*v == 0) *v = def;
    if (!(*v > 0) || !isfinite(*v)) return visc_set_error("progress tracker: bad %s", what);
    return 0;
}

visc_progress_tracker *visc_progress_tracker_new(const visc_progress_config *cfg) {
    visc_progress_config c = *cfg;
    if (!c.dht) return visc_set_error("progress tracker: no DHT"), NULL;
    if (!c.observe_only && !c.self_key)
        return visc_set_error("progress tracker: a publishing peer needs its key"), NULL;
    if (positive_or_default(&c.expiration_s, 60, "expiration") ||
        positive_or_default(&c.min_refresh_s, 0.5, "minimum refresh period") ||
        positive_or_default(&c.max_refresh_s, 30, "maximum refresh period") ||
        positive_or_default(&c.op_timeout_s, 5, "DHT timeout"))
        return NULL;
    if (c.min_refresh_s > c.max_refresh_s || c.max_refresh_s >= c.expiration_s)
        return visc_set_error("progress tracker: needs min refresh <= max refresh < expiration "
                              "(%g, %g, %g)",
                              c.min_refresh_s, c.max_refresh_s, c.expiration_s),
               NULL;
    if (c.target_batch_size > VISC_PROGRESS_MAX_COUNT)
        return visc_set_error("progress tracker: target batch size too large"), NULL;
    visc_progress_tracker *t = visc_calloc(1, sizeof *t, "progress tracker");
    if (!t) return NULL;
    t->cfg = c;
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->view_mu, NULL);
    pthread_mutex_init(&t->publish_mu, NULL);
    pthread_mutex_init(&t->known_mu, NULL);
    pthread_cond_init(&t->changed, NULL);
    pthread_cond_init(&t->stop_cv, NULL);
    if (c.self_key) memcpy(t->local.peer, c.self_key, VISC_KEY_BYTES);
    t->local.time_ms = visc_unix_ms();
    t->local.loss = NAN;
    t->active_since = tclock(t);
    t->eta_s = INFINITY;
    t->peers = visc_malloc(sizeof *t->peers * PEER_TABLE_MAX, "progress peers");
    t->known = visc_malloc(sizeof *t->known * PEER_TABLE_MAX, "progress records");
    t->sps_scratch = visc_malloc(sizeof *t->sps_scratch * (PEER_TABLE_MAX + 1), "throughputs");
    if (!t->peers || !t->known || !t->sps_scratch || (c.background && start_background(t))) {
        visc_progress_tracker_free(t);
        return NULL;
    }
    return t;
}

void visc_progress_tracker_free(visc_progress_tracker *t) {
    if (!t) return;
    stop_background(t);
    pthread_cond_destroy(&t->changed);
    pthread_cond_destroy(&t->stop_cv);
    pthread_mutex_destroy(&t->view_mu);
    pthread_mutex_destroy(&t->publish_mu);
    pthread_mutex_destroy(&t->known_mu);
    pthread_mutex_destroy(&t->mu);
    free(t->recs);
    free(t->known);
    free(t->sps_scratch);
    free(t->peers);
    free(t);
}

/* This peer's record changed: the next refresh publishes it, and with
 * cfg.background the publisher thread at once. t->mu held. */
static void note_change_locked(visc_progress_tracker *t) {
    t->changes++;
    pthread_cond_signal(&t->changed);
}

void visc_progress_set_local(visc_progress_tracker *t, visc_peer_role role, const char *addr) {
    char a[64] = {0};
    if (addr && strlen(addr) < sizeof a) strcpy(a, addr);
    if (check_addr(a, sizeof a)) memset(a, 0, sizeof a);
    pthread_mutex_lock(&t->mu);
    t->local.role = role <= VISC_ROLE_AUX ? (uint8_t)role : VISC_ROLE_FULL;
    memcpy(t->local.addr, a, sizeof a);
    note_change_locked(t);
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_set_state_hash(visc_progress_tracker *t, const uint8_t hash[32]) {
    pthread_mutex_lock(&t->mu);
    memcpy(t->local.state_hash, hash, 32);
    note_change_locked(t);
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_add_samples(visc_progress_tracker *t, uint64_t n, float loss) {
    pthread_mutex_lock(&t->mu);
    double now = tclock(t);
    double active = t->active_s + (t->paused ? 0 : now - t->active_since);
    uint64_t room = VISC_PROGRESS_MAX_COUNT - t->local.samples_accumulated;
    t->local.samples_accumulated += n < room ? n : room;
    t->pending = t->pending + n < t->pending ? UINT64_MAX : t->pending + n;
    if (isfinite(loss)) t->local.loss = loss;
    t->local.time_ms = visc_unix_ms();
    if (active >= MIN_MEASURE_S) {
        double rate = (double)t->pending / active;
        /* alpha 1/k for the first measurements (a plain mean), then 0.1:
         * a slow first batch (startup) does not linger in the claim */
        double alpha = fmax(EMA_ALPHA, 1.0 / (t->measured + 1));
        double ema = (1 - alpha) * t->local.samples_per_second + alpha * rate;
        t->local.samples_per_second = ema < VISC_PROGRESS_MAX_SPS ? ema : VISC_PROGRESS_MAX_SPS;
        if (t->measured < 1000) t->measured++;
        t->pending = 0;
        t->active_s = 0;
        t->active_since = now;
    }
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_set_epoch(visc_progress_tracker *t, uint64_t new_epoch) {
    pthread_mutex_lock(&t->mu);
    t->local.epoch = new_epoch < VISC_PROGRESS_MAX_COUNT ? new_epoch : VISC_PROGRESS_MAX_COUNT;
    t->local.samples_accumulated = 0;
    t->local.time_ms = visc_unix_ms();
    note_change_locked(t);
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_carry_samples(visc_progress_tracker *t, uint64_t n) {
    pthread_mutex_lock(&t->mu);
    uint64_t room = VISC_PROGRESS_MAX_COUNT - t->local.samples_accumulated;
    t->local.samples_accumulated += n < room ? n : room;
    note_change_locked(t);
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_pause(visc_progress_tracker *t) {
    pthread_mutex_lock(&t->mu);
    if (!t->paused) {
        t->active_s += tclock(t) - t->active_since;
        t->paused = 1;
        t->local.paused = 1;
        note_change_locked(t);
    }
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_resume(visc_progress_tracker *t) {
    pthread_mutex_lock(&t->mu);
    if (t->paused) {
        t->active_since = tclock(t);
        t->paused = 0;
        t->local.paused = 0;
        /* extrapolation restarts from now, not from before the pause */
        t->local.time_ms = visc_unix_ms();
        note_change_locked(t);
    }
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_local(visc_progress_tracker *t, visc_progress_record *out) {
    pthread_mutex_lock(&t->mu);
    *out = t->local;
    pthread_mutex_unlock(&t->mu);
}

/* view_mu held */
static double period_locked(const visc_progress_tracker *t) {
    double p = t->eta_s / 4;
    if (!(p < t->cfg.max_refresh_s)) p = t->cfg.max_refresh_s; /* also INFINITY, NaN */
    return p > t->cfg.min_refresh_s ? p : t->cfg.min_refresh_s;
}

double visc_progress_refresh_period(visc_progress_tracker *t) {
    pthread_mutex_lock(&t->view_mu);
    double p = period_locked(t);
    pthread_mutex_unlock(&t->view_mu);
    return p;
}

/* ---- reading and judging the swarm's records ---- */

static peer_entry *find_or_add(visc_progress_tracker *t, const uint8_t key[VISC_KEY_BYTES]) {
    for (int i = 0; i < t->n_peers; i++)
        if (memcmp(t->peers[i].key, key, VISC_KEY_BYTES) == 0) return &t->peers[i];
    if (t->n_peers == PEER_TABLE_MAX) return NULL;
    peer_entry *e = &t->peers[t->n_peers++];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, VISC_KEY_BYTES);
    return e;
}

static void distrust(visc_progress_tracker *t, peer_entry *e, double now, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void distrust(visc_progress_tracker *t, peer_entry *e, double now, const char *fmt, ...) {
    e->trusted = 0;
    e->distrust_until = now + t->cfg.expiration_s;
    if (e->reported) return;
    e->reported = 1;
    char id[VISC_PEER_ID_CHARS + 1], reason[256];
    visc_peer_id(e->key, id);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    fprintf(stderr, "visc: swarm: distrusting peer %s: %s\n", id, reason);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Samples grew within one epoch faster than the claimed throughput allows. */
static void check_growth(visc_progress_tracker *t, peer_entry *e, double now, uint64_t now_ms) {
    const visc_progress_record *c = &e->cur, *l = &e->last;
    if (!e->has_last || l->epoch != c->epoch || c->samples_accumulated <= l->samples_accumulated)
        return;
    uint64_t until = c->time_ms < now_ms ? c->time_ms : now_ms; /* no credit for future times */
    double dt = until > l->time_ms ? (double)(until - l->time_ms) / 1000 : 0;
    double sps = fmax(c->samples_per_second, l->samples_per_second);
    double allowed = (double)l->samples_accumulated + sps * (GROWTH_FACTOR * dt + GROWTH_SLACK_S);
    if ((double)c->samples_accumulated > allowed)
        distrust(t, e, now,
                 "samples grew from %llu to %llu in %.1f s, more than its claimed %.1f samples/s "
                 "allows",
                 (unsigned long long)l->samples_accumulated,
                 (unsigned long long)c->samples_accumulated, dt, sps);
}

/* Throughput more than SPS_MEDIAN_FACTOR x the fastest other peer's (this
 * peer included; when at least two others report one). Verdicts use the trusted set
 * as it was before this pass, so the order of peers does not matter. */
static void check_throughput(visc_progress_tracker *t, const visc_progress_record *self,
                             double now) {
    double *v = t->sps_scratch;
    int n = 0;
    if (self && self->samples_per_second > 0) v[n++] = self->samples_per_second;
    for (int i = 0; i < t->n_peers; i++)
        if (t->peers[i].live && t->peers[i].trusted && t->peers[i].cur.samples_per_second > 0)
            v[n++] = t->peers[i].cur.samples_per_second;
    if (n >= 3) {
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        double limit[PEER_TABLE_MAX];
        for (int i = 0; i < t->n_peers; i++) {
            const peer_entry *e = &t->peers[i];
            double s = e->cur.samples_per_second;
            /* the fastest of the others (this peer included), not their
             * median: peers that claim to be slow must not make an honest
             * fast peer look like a liar */
            double base = v[n - 1] == s ? v[n - 2] : v[n - 1];
            limit[i] = e->live && e->trusted && s > 0 ? SPS_MEDIAN_FACTOR * base : INFINITY;
        }
        for (int i = 0; i < t->n_peers; i++)
            if (t->peers[i].cur.samples_per_second > limit[i])
                distrust(t, &t->peers[i], now,
                         "claims %.1f samples/s, more than %g x the fastest other peer's "
                         "(%.1f), let alone their median",
                         t->peers[i].cur.samples_per_second, SPS_MEDIAN_FACTOR,
                         limit[i] / SPS_MEDIAN_FACTOR);
    }
}

/* An epoch more than one ahead of every other peer's (with at least two
 * others to compare with). */
static void check_epoch(visc_progress_tracker *t, const visc_progress_record *self, double now) {
    /* the two highest epochs of the trusted set, and who holds the highest */
    uint64_t top = 0, second = 0;
    int n = 0, top_at = -2; /* -1: self */
    for (int i = -1; i < t->n_peers; i++) {
        const visc_progress_record *r = i < 0 ? self : &t->peers[i].cur;
        if (!r || (i >= 0 && (!t->peers[i].live || !t->peers[i].trusted))) continue;
        if (n == 0 || r->epoch > top) second = top, top = r->epoch, top_at = i;
        else if (n == 1 || r->epoch > second) second = r->epoch;
        n++;
    }
    if (n < 3) return;
    int flagged[PEER_TABLE_MAX] = {0};
    for (int i = 0; i < t->n_peers; i++) {
        const peer_entry *e = &t->peers[i];
        uint64_t others = top_at == i ? second : top;
        flagged[i] = e->live && e->trusted && e->cur.epoch > others + 1;
    }
    for (int i = 0; i < t->n_peers; i++)
        if (flagged[i])
            distrust(t, &t->peers[i], now,
                     "epoch %llu is more than one ahead of every other peer's (highest: %llu)",
                     (unsigned long long)t->peers[i].cur.epoch,
                     (unsigned long long)(top_at == i ? second : top));
}

/* With corroborated_epochs, a trusted record ahead of this peer's epoch
 * counts only when another trusted peer has reached its epoch too (a step
 * is taken by a group of two or more). Not the same state hash: while the
 * swarm steps faster than records spread, a reader rarely sees two peers'
 * records at the same epoch at once. */
static int epoch_counts(const visc_progress_tracker *t, const visc_progress_record *self, int i) {
    const visc_progress_record *r = &t->peers[i].cur;
    if (!t->cfg.corroborated_epochs || !self || r->epoch <= self->epoch) return 1;
    for (int j = 0; j < t->n_peers; j++) {
        const peer_entry *o = &t->peers[j];
        if (j != i && o->live && o->trusted && o->cur.epoch >= r->epoch) return 1;
    }
    return 0;
}

static uint64_t global_epoch(const visc_progress_tracker *t, const visc_progress_record *self) {
    uint64_t g = self ? self->epoch : 0;
    for (int i = 0; i < t->n_peers; i++)
        if (t->peers[i].live && t->peers[i].trusted && t->peers[i].cur.epoch > g &&
            epoch_counts(t, self, i))
            g = t->peers[i].cur.epoch;
    return g;
}

/* Says once per peer that its epoch ahead is not followed, when it has
 * been alone there (no other peer at its epoch or beyond, this one behind
 * it) for LONE_REPORT_S without a break, or for LONE_REPORT_S in all and
 * most of the time since it was first seen so (LONE_SHARE).
 *
 * Right after a step an honest peer is alone ahead for a moment (the
 * group's members publish their new epoch one after the other), so a
 * peer joined at its epoch is no longer alone. A liar one epoch ahead of
 * the swarm is joined too, for moments, when the others have stepped to
 * its epoch and it has not yet read them; a peer that steps last sees
 * those moments at every step, and with steps shorter than LONE_REPORT_S
 * the break alone never came (a CI run: the slowest of three peers said
 * nothing of the liar). Hence the share: an honest peer is ahead of this
 * one only between their steps. */
static void report_lone_epochs(visc_progress_tracker *t, const visc_progress_record *self,
                               double now) {
    for (int i = 0; i < t->n_peers; i++) {
        peer_entry *e = &t->peers[i];
        const int trusted = e->live && e->trusted;
        const int alone = trusted && e->cur.epoch > self->epoch && !epoch_counts(t, self, i);
        /* the share: alone time over the time watched */
        if (e->watched) {
            if (alone) e->lone_total += now - e->lone_checked;
            e->lone_checked = now;
            const double span = now - e->lone_seen;
            if (!trusted || (span >= LONE_REPORT_S && e->lone_total < LONE_SHARE * span))
                e->watched = 0;
        } else if (alone) {
            e->watched = 1;
            e->lone_seen = e->lone_checked = now;
            e->lone_total = 0;
        }
        /* without a break: caught up with for a moment is no reason to
         * forget a liar (it stays ahead of every step); joined there is */
        if (!(trusted && e->cur.epoch <= self->epoch)) {
            if (alone && !e->lone) e->lone = 1, e->lone_since = now;
            if (!alone) e->lone = 0;
        }
        const int long_alone = e->lone && now - e->lone_since >= LONE_REPORT_S;
        const int mostly_alone = e->watched && e->lone_total >= LONE_REPORT_S;
        if (e->ahead_reported || !alone || !(long_alone || mostly_alone)) continue;
        e->ahead_reported = 1;
        char id[VISC_PEER_ID_CHARS + 1];
        visc_peer_id(e->key, id);
        fprintf(stderr,
                "visc: swarm: peer %s publishes epoch %llu (this peer: %llu) that no other "
                "peer has reached: not followed\n",
                id, (unsigned long long)e->cur.epoch, (unsigned long long)self->epoch);
    }
}

/* More samples at the epoch whose beginning we saw than the claimed
 * throughput allows since then (the growth check has no history for a
 * record that is already inflated when first seen). */
static void check_epoch_age(visc_progress_tracker *t, double now) {
    if (!t->has_floor) return;
    double age = now - t->floor_time;
    for (int i = 0; i < t->n_peers; i++) {
        peer_entry *e = &t->peers[i];
        if (!e->live || !e->trusted || e->cur.epoch != t->floor_epoch) continue;
        double sps = e->cur.samples_per_second;
        if ((double)e->cur.samples_accumulated > sps * (GROWTH_FACTOR * age + GROWTH_SLACK_S))
            distrust(t, e, now,
                     "claims %llu samples at epoch %llu, more than its claimed %.1f samples/s "
                     "allow since the epoch began (at most %.1f s ago)",
                     (unsigned long long)e->cur.samples_accumulated,
                     (unsigned long long)e->cur.epoch, sps, age);
    }
}

static void judge(visc_progress_tracker *t, const visc_progress_record *self, double now,
                  uint64_t now_ms) {
    for (int i = 0; i < t->n_peers; i++) {
        peer_entry *e = &t->peers[i];
        e->trusted = e->live && now >= e->distrust_until;
        if (e->trusted) check_growth(t, e, now, now_ms);
    }
    check_throughput(t, self, now);
    check_epoch(t, self, now);
    /* the global epoch rose by one since the last read, which saw other
     * peers (a first read that saw nobody proves nothing): the epoch began
     * after that read, less the longest a peer may wait before publishing
     * its new epoch */
    uint64_t g = global_epoch(t, self);
    if (t->fetched && t->prev_others > 0 && g == t->prev_global + 1 &&
        (!t->has_floor || g != t->floor_epoch)) {
        t->has_floor = 1;
        t->floor_epoch = g;
        t->floor_time = t->last_fetch - t->cfg.max_refresh_s;
    }
    check_epoch_age(t, now);
    if (t->cfg.corroborated_epochs && self) report_lone_epochs(t, self, now);
    t->prev_global = global_epoch(t, self);
    t->prev_others = 0;
    for (int i = 0; i < t->n_peers; i++) t->prev_others += t->peers[i].live && t->peers[i].trusted;
    for (int i = 0; i < t->n_peers; i++)
        if (t->peers[i].live) t->peers[i].last = t->peers[i].cur, t->peers[i].has_last = 1;
}

/* Forgets peers gone for a while (and not under distrust). */
static void prune(visc_progress_tracker *t, double now) {
    for (int i = 0; i < t->n_peers;) {
        const peer_entry *e = &t->peers[i];
        if (!e->live && now - e->seen_at > 2 * t->cfg.expiration_s && now >= e->distrust_until)
            t->peers[i] = t->peers[--t->n_peers];
        else i++;
    }
}

/* A record learned from a read, or pushed by the listener: the newest
 * signed by each peer (this one's own aside), kept until it expires. A
 * signed record of an admitted peer that does not parse counts as none
 * (the peer is not live), as when it is the newest a read finds. */
static void learn(visc_progress_tracker *t, const visc_record *r) {
    if (t->cfg.self_key && memcmp(r->signer, t->cfg.self_key, VISC_KEY_BYTES) == 0) return;
    visc_progress_record p;
    int parsed = visc_progress_parse(r->value, r->value_len, &p) == 0;
    if (parsed) memcpy(p.peer, r->signer, VISC_KEY_BYTES);
    pthread_mutex_lock(&t->known_mu);
    known_record *k = NULL;
    for (int i = 0; i < t->n_known && !k; i++)
        if (memcmp(t->known[i].signer, r->signer, VISC_KEY_BYTES) == 0) k = &t->known[i];
    if (!k && t->n_known < PEER_TABLE_MAX) {
        k = &t->known[t->n_known++];
        memcpy(k->signer, r->signer, VISC_KEY_BYTES);
        k->issued_ms = 0;
    }
    if (k && r->issued_ms >= k->issued_ms) {
        k->issued_ms = r->issued_ms;
        k->expires_ms = r->expires_ms;
        k->parsed = parsed;
        if (parsed) k->rec = p;
    }
    pthread_mutex_unlock(&t->known_mu);
}

static void on_pushed_record(const visc_record *r, void *ctx) { learn(ctx, r); }

/* The records learned, unexpired, become the live peers' (view_mu held),
 * judged against self. */
static void absorb(visc_progress_tracker *t, const visc_progress_record *self) {
    double now = tclock(t);
    uint64_t now_ms = visc_unix_ms();
    prune(t, now);
    for (int i = 0; i < t->n_peers; i++) t->peers[i].live = 0;
    t->aux_live = 0;
    pthread_mutex_lock(&t->known_mu);
    for (int i = 0; i < t->n_known;) {
        const known_record *k = &t->known[i];
        if (k->expires_ms <= now_ms) {
            t->known[i] = t->known[--t->n_known];
            continue;
        }
        i++;
        if (!k->parsed) continue;
        if (k->rec.role == VISC_ROLE_AUX) { /* counted apart, in nothing else */
            t->aux_live++;
            continue;
        }
        peer_entry *e = find_or_add(t, k->rec.peer);
        if (!e || e->live) continue;
        e->cur = k->rec;
        e->live = 1;
        e->seen_at = now;
    }
    pthread_mutex_unlock(&t->known_mu);
    judge(t, self, now, visc_unix_ms());
    t->fetched = 1;
    t->last_fetch = now;
}

static double extrapolated(const visc_progress_tracker *t, const visc_progress_record *r,
                           uint64_t now_ms) {
    double s = (double)r->samples_accumulated;
    if (r->paused || now_ms <= r->time_ms) return s;
    double dt = fmin((double)(now_ms - r->time_ms) / 1000, t->cfg.max_refresh_s);
    return s + r->samples_per_second * dt;
}

static void make_view(visc_progress_tracker *t, const visc_progress_record *self,
                      visc_swarm_progress_view *view, visc_progress_record *records, int cap,
                      int *count) {
    visc_swarm_progress_view v;
    memset(&v, 0, sizeof v);
    v.target = t->cfg.target_batch_size;
    v.epoch = global_epoch(t, self);
    uint64_t now_ms = visc_unix_ms();
    double samples = 0;
    int n_out = 0;
    for (int i = -1; i < t->n_peers; i++) {
        const visc_progress_record *r;
        if (i < 0) r = self;
        else if (!t->peers[i].live) continue;
        else if (!t->peers[i].trusted) {
            v.distrusted++;
            continue;
        } else r = &t->peers[i].cur;
        if (!r) continue;
        v.peers++;
        if (records && n_out < cap) records[n_out++] = *r;
        if (r->epoch != v.epoch) continue;
        v.peers_at_epoch++;
        v.samples_per_second += r->samples_per_second;
        samples += extrapolated(t, r, now_ms);
    }
    v.auxiliaries = t->aux_live;
    v.samples =
        samples < (double)VISC_PROGRESS_MAX_COUNT ? (uint64_t)samples : VISC_PROGRESS_MAX_COUNT;
    v.ready = v.target > 0 && v.samples >= v.target;
    if (v.ready) v.eta_s = 0;
    else if (v.target > 0 && v.samples_per_second > 0)
        v.eta_s = (double)(v.target - v.samples) / v.samples_per_second;
    else v.eta_s = INFINITY;
    t->eta_s = v.eta_s;
    if (view) *view = v;
    if (count) *count = n_out;
}

/* ---- publishing and reading: on the caller's thread, or in the background ---- */

/* This peer's record now, in *self; NULL for an observer and for an
 * auxiliary (no peer of its own view). */
static const visc_progress_record *own_record(visc_progress_tracker *t,
                                              visc_progress_record *self) {
    pthread_mutex_lock(&t->mu);
    *self = t->local;
    pthread_mutex_unlock(&t->mu);
    return !t->cfg.observe_only && self->role != VISC_ROLE_AUX ? self : NULL;
}

/* publish_if_due's work, publish_mu held */
static int publish_locked(visc_progress_tracker *t, int force, double period, char *err,
                          size_t cap) {
    double now = tclock(t);
    pthread_mutex_lock(&t->mu);
    uint64_t changes = t->changes;
    int due =
        force || t->published_changes < changes || !t->published || now - t->last_publish >= period;
    visc_progress_record rec = t->local;
    pthread_mutex_unlock(&t->mu);
    if (!due) return 0;
    uint8_t wire[VISC_PROGRESS_WIRE];
    /* with the listener on: sent is enough (dht.h, visc_dht_send) */
    int ok = visc_progress_encode(&rec, wire) == 0 &&
             (t->cfg.background ? visc_dht_send(t->cfg.dht, KEY, wire, sizeof wire,
                                                t->cfg.expiration_s, SEND_WAIT_S) >= 0
                                : visc_dht_put(t->cfg.dht, KEY, wire, sizeof wire,
                                               t->cfg.expiration_s, t->cfg.op_timeout_s) == 0);
    if (!ok) snprintf(err, cap, "publishing progress: %s", visc_last_error());
    pthread_mutex_lock(&t->mu);
    if (ok) {
        t->published = 1;
        t->last_publish = now;
        if (t->published_changes < changes) t->published_changes = changes;
    }
    pthread_mutex_unlock(&t->mu);
    return ok ? 1 : -1;
}

/* Publishes this peer's record when asked (force), when it changed since
 * it was last published, when it never was, or when the period passed. 1
 * published, 0 not due, -1 failed (err says why; a change stays due).
 * One publish at a time: the newest signed record must hold the newest
 * state (readers keep the newest per signer), and a change the publisher
 * thread is sending is not sent again. */
static int publish_if_due(visc_progress_tracker *t, int force, double period, char *err,
                          size_t cap) {
    if (t->cfg.observe_only) return 0;
    pthread_mutex_lock(&t->publish_mu);
    int rc = publish_locked(t, force, period, err, cap);
    pthread_mutex_unlock(&t->publish_mu);
    return rc;
}

/* Reads everyone's records into buf (VISC_DHT_MAX_GET) and learns them;
 * -1 when the read failed (err says why). */
static int read_records(visc_progress_tracker *t, visc_record *buf, char *err, size_t cap) {
    int n = visc_dht_get(t->cfg.dht, KEY, buf, VISC_DHT_MAX_GET, t->cfg.op_timeout_s);
    if (n < 0) {
        snprintf(err, cap, "reading progress: %s", visc_last_error());
        return -1;
    }
    for (int i = 0; i < n; i++) learn(t, &buf[i]);
    return 0;
}

/* The records are due to be judged again: at the first look, when the
 * period has passed. */
static int absorb_due(visc_progress_tracker *t) {
    pthread_mutex_lock(&t->view_mu);
    int due = !t->fetched || tclock(t) - t->last_fetch >= period_locked(t);
    pthread_mutex_unlock(&t->view_mu);
    return due;
}

/* What a background thread could not do, for the next refresh to say. */
static void note_bg_error(visc_progress_tracker *t, const char *err) {
    pthread_mutex_lock(&t->view_mu);
    snprintf(t->bg_error, sizeof t->bg_error, "%s", err);
    pthread_mutex_unlock(&t->view_mu);
}

static int stopping(visc_progress_tracker *t) {
    pthread_mutex_lock(&t->mu);
    int s = t->stopping;
    pthread_mutex_unlock(&t->mu);
    return s;
}

/* Waits on cv (mu held by the caller) until signalled or s seconds passed. */
static void nap_on(pthread_cond_t *cv, pthread_mutex_t *mu, double s) {
    struct timespec until = visc_deadline_after(s);
    pthread_cond_timedwait(cv, mu, &until);
}

/* The publisher: this peer's record goes out as soon as it changes, and
 * again each period; after a failure, again after min_refresh_s. */
static void *publisher_main(void *arg) {
    visc_progress_tracker *t = arg;
    char err[256];
    while (!stopping(t)) {
        if (publish_if_due(t, 0, visc_progress_refresh_period(t), err, sizeof err) < 0) {
            note_bg_error(t, err);
            pthread_mutex_lock(&t->mu);
            if (!t->stopping) nap_on(&t->changed, &t->mu, t->cfg.min_refresh_s);
            pthread_mutex_unlock(&t->mu);
        }
        pthread_mutex_lock(&t->mu);
        if (t->published_changes == t->changes && !t->stopping) nap_on(&t->changed, &t->mu, POLL_S);
        pthread_mutex_unlock(&t->mu);
    }
    return NULL;
}

/* The reader: everyone's records each period, into its own buffer (what
 * the pushes missed, if anything). */
static void *reader_main(void *arg) {
    visc_progress_tracker *t = arg;
    char err[256];
    visc_record *buf = visc_malloc(sizeof *buf * VISC_DHT_MAX_GET, "progress records");
    if (!buf) {
        note_bg_error(t, visc_last_error());
        return NULL;
    }
    double last_read = -INFINITY;
    while (!stopping(t)) {
        double now = tclock(t);
        if (now - last_read >= visc_progress_refresh_period(t)) {
            if (read_records(t, buf, err, sizeof err) < 0) note_bg_error(t, err);
            last_read = now;
        }
        pthread_mutex_lock(&t->view_mu);
        nap_on(&t->stop_cv, &t->view_mu, POLL_S);
        pthread_mutex_unlock(&t->view_mu);
    }
    free(buf);
    return NULL;
}

static int start_background(visc_progress_tracker *t) {
    t->listen_handle = visc_dht_listen(t->cfg.dht, KEY, on_pushed_record, t);
    if (t->listen_handle < 0) return -1;
    t->listening = 1;
    if (!t->cfg.observe_only) {
        if (pthread_create(&t->publisher, NULL, publisher_main, t) != 0)
            return visc_set_error("progress tracker: cannot start the publisher thread");
        t->publisher_started = 1;
    }
    if (pthread_create(&t->reader, NULL, reader_main, t) != 0)
        return visc_set_error("progress tracker: cannot start the reader thread");
    t->reader_started = 1;
    return 0;
}

/* Waits for a DHT operation under way (op_timeout_s at most). */
static void stop_background(visc_progress_tracker *t) {
    pthread_mutex_lock(&t->mu);
    t->stopping = 1;
    pthread_cond_broadcast(&t->changed);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_lock(&t->view_mu);
    pthread_cond_broadcast(&t->stop_cv);
    pthread_mutex_unlock(&t->view_mu);
    if (t->publisher_started) pthread_join(t->publisher, NULL);
    if (t->reader_started) pthread_join(t->reader, NULL);
    if (t->listening) visc_dht_unlisten(t->cfg.dht, t->listen_handle);
    t->publisher_started = t->reader_started = t->listening = 0;
}

int visc_progress_refresh(visc_progress_tracker *t, int force, visc_swarm_progress_view *view,
                          visc_progress_record *records, int cap, int *count) {
    visc_progress_record self;
    const visc_progress_record *me = own_record(t, &self);
    int rc = 0;
    char error[256] = "";
    /* With the background threads, only a forced refresh reads the DHT
     * here, and only a change publishes here, as without them: the caller
     * goes on once the swarm can see its new step (the publisher thread
     * may be sending it too; a record twice does no harm), and the DHT is
     * not waited on for the confirmation (visc_dht_send). */
    int on_this_thread = force || !t->cfg.background;
    double period = on_this_thread ? visc_progress_refresh_period(t) : INFINITY;
    if (publish_if_due(t, force, period, error, sizeof error) < 0) rc = -1;
    /* pushed records are judged at every refresh (a local look); reads
     * come when the period has passed */
    int judge_now = force || t->cfg.background || absorb_due(t);
    if (on_this_thread && judge_now) {
        if (!t->recs) t->recs = visc_malloc(sizeof *t->recs * VISC_DHT_MAX_GET, "progress records");
        if (!t->recs) snprintf(error, sizeof error, "%s", visc_last_error());
        if (!t->recs || read_records(t, t->recs, error, sizeof error) < 0) rc = -1, judge_now = 0;
    }
    pthread_mutex_lock(&t->view_mu);
    if (judge_now) absorb(t, me);
    if (t->bg_error[0] && !rc) {
        snprintf(error, sizeof error, "%s", t->bg_error);
        rc = -1;
    }
    t->bg_error[0] = 0;
    make_view(t, me, view, records, cap, count);
    pthread_mutex_unlock(&t->view_mu);
    if (rc) visc_set_error("%s", error);
    return rc;
}

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

struct visc_progress_tracker {
    visc_progress_config cfg;
    pthread_mutex_t mu; /* guards the local fields below */
    visc_progress_record local;
    int measured, paused, dirty;   /* measured: throughput measurements so far */
    double active_s, active_since; /* compute time since the last measurement */
    uint64_t pending;              /* samples not yet in a measurement */

    /* refresh side (one thread) */
    int published, fetched;
    double last_publish, last_fetch, eta_s;
    visc_record *recs; /* VISC_DHT_MAX_GET, allocated at the first read */
    peer_entry *peers;
    int n_peers;
    /* The epoch whose beginning this tracker saw (the global epoch rose by
     * one between two reads that both saw other peers): it began no
     * earlier than floor_time. */
    int has_floor, prev_others;
    int aux_live; /* auxiliary peers' records in the last read */
    uint64_t floor_epoch, prev_global;
    double floor_time;
};

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
    if (c.self_key) memcpy(t->local.peer, c.self_key, VISC_KEY_BYTES);
    t->local.time_ms = visc_unix_ms();
    t->local.loss = NAN;
    t->active_since = tclock(t);
    t->eta_s = INFINITY;
    return t;
}

void visc_progress_tracker_free(visc_progress_tracker *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t->recs);
    free(t->peers);
    free(t);
}

void visc_progress_set_local(visc_progress_tracker *t, visc_peer_role role, const char *addr) {
    char a[64] = {0};
    if (addr && strlen(addr) < sizeof a) strcpy(a, addr);
    if (check_addr(a, sizeof a)) memset(a, 0, sizeof a);
    pthread_mutex_lock(&t->mu);
    t->local.role = role <= VISC_ROLE_AUX ? (uint8_t)role : VISC_ROLE_FULL;
    memcpy(t->local.addr, a, sizeof a);
    t->dirty = 1;
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_set_state_hash(visc_progress_tracker *t, const uint8_t hash[32]) {
    pthread_mutex_lock(&t->mu);
    memcpy(t->local.state_hash, hash, 32);
    t->dirty = 1;
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
    t->dirty = 1;
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_carry_samples(visc_progress_tracker *t, uint64_t n) {
    pthread_mutex_lock(&t->mu);
    uint64_t room = VISC_PROGRESS_MAX_COUNT - t->local.samples_accumulated;
    t->local.samples_accumulated += n < room ? n : room;
    t->dirty = 1;
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_pause(visc_progress_tracker *t) {
    pthread_mutex_lock(&t->mu);
    if (!t->paused) {
        t->active_s += tclock(t) - t->active_since;
        t->paused = 1;
        t->local.paused = 1;
        t->dirty = 1;
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
        t->dirty = 1;
    }
    pthread_mutex_unlock(&t->mu);
}

void visc_progress_local(visc_progress_tracker *t, visc_progress_record *out) {
    pthread_mutex_lock(&t->mu);
    *out = t->local;
    pthread_mutex_unlock(&t->mu);
}

double visc_progress_refresh_period(visc_progress_tracker *t) {
    double p = t->eta_s / 4;
    if (!(p < t->cfg.max_refresh_s)) p = t->cfg.max_refresh_s; /* also INFINITY, NaN */
    return p > t->cfg.min_refresh_s ? p : t->cfg.min_refresh_s;
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
    double *v = visc_malloc(sizeof(double) * (size_t)(t->n_peers + 1), "throughputs");
    if (!v) return;
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
    free(v);
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

static int fetch(visc_progress_tracker *t, const visc_progress_record *self, double now) {
    if (!t->recs) {
        t->recs = visc_malloc(sizeof *t->recs * VISC_DHT_MAX_GET, "progress records");
        t->peers = visc_malloc(sizeof *t->peers * PEER_TABLE_MAX, "progress peers");
        if (!t->recs || !t->peers) {
            free(t->recs), free(t->peers);
            t->recs = NULL, t->peers = NULL;
            return -1;
        }
    }
    int n = visc_dht_get(t->cfg.dht, KEY, t->recs, VISC_DHT_MAX_GET, t->cfg.op_timeout_s);
    if (n < 0) return -1;
    now = tclock(t); /* the read may have taken a while */
    prune(t, now);
    for (int i = 0; i < t->n_peers; i++) t->peers[i].live = 0;
    t->aux_live = 0;
    for (int i = 0; i < n; i++) {
        const visc_record *r = &t->recs[i];
        if (t->cfg.self_key && memcmp(r->signer, t->cfg.self_key, VISC_KEY_BYTES) == 0) continue;
        visc_progress_record p;
        /* a signed record of an admitted peer that does not parse: ignored */
        if (visc_progress_parse(r->value, r->value_len, &p)) continue;
        if (p.role == VISC_ROLE_AUX) { /* counted apart, in nothing else */
            t->aux_live++;
            continue;
        }
        peer_entry *e = find_or_add(t, r->signer);
        if (!e || e->live) continue;
        memcpy(p.peer, r->signer, VISC_KEY_BYTES);
        e->cur = p;
        e->live = 1;
        e->seen_at = now;
    }
    judge(t, self, now, visc_unix_ms());
    t->fetched = 1;
    t->last_fetch = now;
    return 0;
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

int visc_progress_refresh(visc_progress_tracker *t, int force, visc_swarm_progress_view *view,
                          visc_progress_record *records, int cap, int *count) {
    double now = tclock(t), period = visc_progress_refresh_period(t);
    visc_progress_record self;
    int dirty = 0;
    pthread_mutex_lock(&t->mu);
    self = t->local;
    if (!t->cfg.observe_only) dirty = t->dirty, t->dirty = 0;
    pthread_mutex_unlock(&t->mu);
    const visc_progress_record *pub = t->cfg.observe_only ? NULL : &self;
    /* an auxiliary publishes, but is no peer of its own view */
    const visc_progress_record *me = pub && self.role != VISC_ROLE_AUX ? pub : NULL;
    int rc = 0;
    char error[256] = "";
    if (pub && (force || dirty || !t->published || now - t->last_publish >= period)) {
        uint8_t wire[VISC_PROGRESS_WIRE];
        if (visc_progress_encode(pub, wire) == 0 &&
            visc_dht_put(t->cfg.dht, KEY, wire, sizeof wire, t->cfg.expiration_s,
                         t->cfg.op_timeout_s) == 0) {
            t->published = 1;
            t->last_publish = now;
        } else {
            snprintf(error, sizeof error, "publishing progress: %s", visc_last_error());
            rc = -1;
            pthread_mutex_lock(&t->mu);
            t->dirty |= dirty; /* try again at the next refresh */
            pthread_mutex_unlock(&t->mu);
        }
    }
    if (force || !t->fetched || now - t->last_fetch >= period) {
        if (fetch(t, me, now) != 0) {
            snprintf(error, sizeof error, "reading progress: %s", visc_last_error());
            rc = -1;
        }
    }
    make_view(t, me, view, records, cap, count);
    if (rc) visc_set_error("%s", error);
    return rc;
}

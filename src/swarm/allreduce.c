/* allreduce.c: the butterfly all-reduce of one group (allreduce.h).
 *
 * One round is one ar_round: the caller's thread reduces this peer's
 * shard; per link to another member, a receiving thread (which also opens
 * the channel and checks the hello) and a sending thread. All shared state
 * is under one mutex; a condition variable announces every change (a part
 * arrived, a part was reduced, a link failed). Nothing blocks without a
 * deadline, and the round deadline ends every wait. */
#include "allreduce.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "visc/core.h"
#include "wire.h"

#define AR_VERSION 1
/* When a link's bandwidth has not been measured yet and no member declared
 * a usable one: the guess that sizes the first deadlines. */
#define AR_DEFAULT_BANDWIDTH 1e6
/* Bytes received on a link before its measured rate replaces the declared one. */
#define AR_MEASURE_MIN_BYTES (256u << 10)

void visc_allreduce_config_default(visc_allreduce_config *c) {
    memset(c, 0, sizeof *c);
    c->compression = VISC_COMP_NONE;
    c->part_bytes = 512u << 10;
    c->round_timeout_s = 60;
    c->connect_timeout_s = 10;
    c->part_timeout_min_s = 2;
    c->part_timeout_slack = 4;
    c->exact_from = SIZE_MAX;
    visc_aggregate_config_default(&c->agg);
}

/* ---- shards and wire messages ---- */

static double usable_bandwidth(double b) { return isfinite(b) && b > 0 ? b : 1.0; }

void visc_allreduce_shards(const visc_group *g, size_t n, size_t begin[VISC_GROUP_MAX + 1]) {
    int m = g->size < 0 ? 0 : g->size > VISC_GROUP_MAX ? VISC_GROUP_MAX : g->size;
    double total = 0;
    int last = -1;
    for (int i = 0; i < m; i++)
        if (!g->members[i].client) total += usable_bandwidth(g->members[i].bandwidth), last = i;
    double cum = 0;
    begin[0] = 0;
    for (int i = 0; i < m; i++) {
        size_t end = begin[i];
        if (!g->members[i].client) {
            cum += usable_bandwidth(g->members[i].bandwidth);
            double e = (double)n * (cum / total);
            end = i == last ? n : e >= (double)n ? n : (size_t)e;
            if (end < begin[i]) end = begin[i];
        }
        begin[i + 1] = end;
    }
    for (int i = m; i < VISC_GROUP_MAX; i++) begin[i + 1] = begin[m];
}

void visc_allreduce_report_line(const visc_allreduce_report *r, char *out, size_t cap) {
    double mb_sent = r->bytes_sent / 1e6, mb_recv = r->bytes_received / 1e6;
    double goodput = r->seconds > 0 ? (mb_sent + mb_recv) / 2 / r->seconds : 0;
    snprintf(out, cap,
             "all-reduce: group %d, averaged %.1f%%, sent %.1f MB, received %.1f MB in %.2f s "
             "(goodput %.1f MB/s)%s%s",
             r->group_size, 100.0 * r->averaged_fraction, mb_sent, mb_recv, r->seconds, goodput,
             r->what_failed[0] ? "; failed: " : "", r->what_failed);
}

size_t visc_allreduce_part_values(size_t part_bytes) {
    size_t v = part_bytes / sizeof(float);
    size_t cap = (VISC_CHAN_MAX_FRAME - 64 - VISC_AR_PART_HEADER) / sizeof(float);
    return v < 1 ? 1 : v > cap ? cap : v;
}

void visc_ar_hello_encode(const visc_ar_hello *h, uint8_t out[VISC_AR_HELLO_BYTES]) {
    out[0] = AR_VERSION;
    memcpy(out + 1, h->group_id, 16);
    memcpy(out + 17, h->schema_hash, 32);
    visc_put_u64(out + 49, h->n);
    visc_put_f64(out + 57, h->weight);
    out[65] = h->compression;
    out[66] = h->aggregation;
    visc_put_u32(out + 67, h->part_bytes);
}

int visc_ar_hello_parse(const uint8_t *msg, size_t n, visc_ar_hello *out) {
    if (n != VISC_AR_HELLO_BYTES)
        return visc_set_error("all-reduce hello of %zu bytes (expected %d)", n,
                              VISC_AR_HELLO_BYTES);
    if (msg[0] != AR_VERSION) return visc_set_error("all-reduce hello version %u", msg[0]);
    memcpy(out->group_id, msg + 1, 16);
    memcpy(out->schema_hash, msg + 17, 32);
    out->n = visc_get_u64(msg + 49);
    out->weight = visc_get_f64(msg + 57);
    out->compression = msg[65];
    out->aggregation = msg[66];
    out->part_bytes = visc_get_u32(msg + 67);
    if (out->compression > VISC_COMP_Q8)
        return visc_set_error("all-reduce hello: unknown compression %u", out->compression);
    if (out->aggregation > VISC_AGG_CENTERED_CLIP)
        return visc_set_error("all-reduce hello: unknown aggregation %u", out->aggregation);
    /* 0 only from an auxiliary member: exchange_hellos checks the role */
    if (!isfinite(out->weight) || signbit(out->weight))
        return visc_set_error("all-reduce hello: weight %g is negative or not finite", out->weight);
    return 0;
}

int visc_ar_part_parse(const uint8_t *msg, size_t n, uint32_t expect_index, visc_compression c,
                       float *out, size_t count) {
    if (n < VISC_AR_PART_HEADER) return visc_set_error("all-reduce part of %zu bytes", n);
    uint32_t k = visc_get_u32(msg);
    if (k != expect_index)
        return visc_set_error("all-reduce part %u out of order (expected %u)", k, expect_index);
    visc_compression enc = visc_compression_for(c, count);
    size_t want = visc_compressed_size(enc, count);
    if (n - VISC_AR_PART_HEADER != want)
        return visc_set_error("all-reduce part %u: %zu bytes for %zu values (expected %zu)", k,
                              n - VISC_AR_PART_HEADER, count, want);
    if (visc_decompress(enc, msg + VISC_AR_PART_HEADER, want, out, count) != 0)
        return visc_set_error("all-reduce part %u: %s", k, visc_last_error());
    for (size_t i = 0; i < count; i++)
        if (!isfinite(out[i]))
            return visc_set_error("all-reduce part %u: value %zu is not finite", k, i);
    return 0;
}

/* ---- one round ---- */

typedef struct ar_round ar_round;

typedef struct {
    ar_round *r;
    int idx; /* the member at the other end */
    visc_chan *ch;
    pthread_t rx, tx;
    int rx_started, tx_started, rx_done, tx_done;
    int ready;  /* hellos exchanged */
    int failed; /* 1 failed, 2 banned */
    char why[160];
    double weight;
    int parts_in;      /* parts of my shard received from it */
    int results_in;    /* parts of its shard received back */
    int parts_out;     /* parts of its shard sent to it */
    int parts_encoded; /* ... encoded (x no longer read): a result may follow */
    int results_out;   /* parts of my shard's result sent to it */
    double t_ready, last_rx;
    uint64_t rx_payload, tx_payload;
    double tx_busy;                 /* seconds spent in send */
    float *rx_scratch, *tx_scratch; /* part_values floats each: decoding, the send hook */
    uint8_t *wire;                  /* one encoded frame payload */
} ar_link;

struct ar_round {
    visc_swarm_node *node;
    const visc_group *g;
    const visc_allreduce_config *cfg;
    float *x;
    size_t n;
    double weight;
    float *error_buf;
    int m, self;
    size_t begin[VISC_GROUP_MAX + 1];
    size_t pv, wire_cap;
    int nparts[VISC_GROUP_MAX];
    ar_link links[VISC_GROUP_MAX];
    int has_link[VISC_GROUP_MAX];
    float **inbuf;     /* [part * m + member]: received parts of my shard, until reduced */
    uint8_t **res_enc; /* [part]: my shard's encoded results */
    size_t *res_len;
    int reduced;
    int parts_with[VISC_GROUP_MAX];
    double t0, deadline, connect_deadline, last_any_rx;
    int over;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* A shard is cut into parts of pv values, with one more cut at exact_from
 * when it falls inside the shard: every part is compressed whole or
 * travels whole as fp32 (a part across the boundary would put the lossy
 * range in fp32 too: a quarter of the gradients with 4 members). */
static size_t parts_before_exact(const ar_round *r, int member) {
    size_t b = r->begin[member], e = r->begin[member + 1], x = r->cfg->exact_from;
    return x > b && x < e ? (x - b + r->pv - 1) / r->pv : SIZE_MAX;
}
static size_t part_off(const ar_round *r, int member, int k) {
    size_t k1 = parts_before_exact(r, member), uk = (size_t)k;
    if (uk < k1) return r->begin[member] + uk * r->pv;
    return r->cfg->exact_from + (uk - k1) * r->pv;
}
static size_t part_len(const ar_round *r, int member, int k) {
    size_t off = part_off(r, member, k), e = r->begin[member + 1], x = r->cfg->exact_from;
    if (off < x && x < e) e = x;
    return e - off < r->pv ? e - off : r->pv;
}
static int shard_parts(const ar_round *r, int member) {
    size_t b = r->begin[member], e = r->begin[member + 1], k1 = parts_before_exact(r, member);
    if (k1 == SIZE_MAX) return (int)((e - b + r->pv - 1) / r->pv);
    size_t x = r->cfg->exact_from;
    return (int)(k1 + (e - x + r->pv - 1) / r->pv);
}

/* The encoding of part k of member's shard: the round's compression, or
 * plain fp32 in the exact range. */
static visc_compression part_encoding(const ar_round *r, int member, int k) {
    if (part_off(r, member, k) >= r->cfg->exact_from) return VISC_COMP_NONE;
    return r->cfg->compression;
}
static double dmin(double a, double b) { return a < b ? a : b; }
static double dmax(double a, double b) { return a > b ? a : b; }

/* Waits on the round's condition until deadline (visc_now() seconds);
 * called with the mutex held. */
static void wait_until(ar_round *r, double deadline) {
    double left = deadline - visc_now();
    if (left <= 0) return;
    if (left > 0.5) left = 0.5; /* re-check the round regularly */
    const struct timespec ts = visc_monotonic_deadline_after(left);
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
}

/* Marks a link failed (kind 1) or banned (kind 2) once, with the reason,
 * and unblocks both its threads. Called with the mutex held. */
static void fail_locked(ar_round *r, ar_link *L, int kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_locked(ar_round *r, ar_link *L, int kind, const char *fmt, ...) {
    if (L->failed) return;
    L->failed = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->why, sizeof L->why, fmt, ap);
    va_end(ap);
    if (L->ch) visc_chan_shutdown(L->ch);
    pthread_cond_broadcast(&r->cv);
}

/* -2: the peer sent something invalid (it is banned, not just failed). */
static int invalid(int set_error_result) {
    (void)set_error_result;
    return -2;
}

static int reduces(const ar_round *r, int member) { return r->nparts[member] > 0; }
/* Auxiliary and newcomer members contribute nothing: they send no parts,
 * with weight 0. Everyone but an auxiliary takes the group's result (a
 * newcomer steps with it). */
static int contributes(const ar_round *r, int member) {
    return visc_member_contributes(&r->g->members[member]);
}
static int takes_results(const ar_round *r, int member) { return !r->g->members[member].auxiliary; }

/* The rate (bytes/s) deadlines on this link are sized by: measured once
 * enough has arrived, else what the two members declared, shared among the
 * links of the group. */
static double link_rate(const ar_round *r, const ar_link *L) {
    double el = L->last_rx - L->t_ready;
    if (L->rx_payload >= AR_MEASURE_MIN_BYTES && el > 1e-3) return (double)L->rx_payload / el;
    if (L->tx_payload >= AR_MEASURE_MIN_BYTES && L->tx_busy > 1e-3)
        return (double)L->tx_payload / L->tx_busy;
    double a = r->g->members[r->self].bandwidth, b = r->g->members[L->idx].bandwidth;
    double d = dmin(isfinite(a) && a > 0 ? a : 0, isfinite(b) && b > 0 ? b : 0);
    if (d < 1e4) d = AR_DEFAULT_BANDWIDTH;
    return d / (r->m > 1 ? r->m - 1 : 1);
}

static double deadline_s(const ar_round *r, size_t bytes, double rate) {
    return r->cfg->part_timeout_min_s + r->cfg->part_timeout_slack * (double)bytes / rate;
}
/* With the mutex held (the link's counters move). */
static double part_deadline_s(const ar_round *r, const ar_link *L, size_t bytes) {
    return deadline_s(r, bytes, link_rate(r, L));
}

/* Connects (with retries: the other side may still be starting) or waits
 * for the other side's connection. */
static visc_chan *open_link(ar_round *r, ar_link *L) {
    const visc_group_member *p = &r->g->members[L->idx];
    const visc_group_member *me = &r->g->members[r->self];
    int initiate = me->client || (!p->client && r->self < L->idx);
    for (int tried = 0;; tried = 1) {
        double now = visc_now();
        if (now >= r->connect_deadline) {
            if (!tried) visc_set_error("timed out");
            return NULL;
        }
        pthread_mutex_lock(&r->mu);
        int over = r->over;
        pthread_mutex_unlock(&r->mu);
        if (over) {
            visc_set_error("round ended");
            return NULL;
        }
        visc_chan *ch;
        if (initiate) {
            if (!p->addr[0]) {
                visc_set_error("member has no address");
                return NULL;
            }
            ch = visc_swarm_node_connect(r->node, p->addr, VISC_PURPOSE_ALLREDUCE, r->g->id, p->key,
                                         r->connect_deadline);
            if (!ch) {
                struct timespec ts = {0, 100 * 1000000L};
                nanosleep(&ts, NULL);
            }
        } else {
            ch = visc_swarm_node_take(r->node, VISC_PURPOSE_ALLREDUCE, r->g->id, p->key,
                                      dmin(r->connect_deadline, now + 0.25));
        }
        if (ch) return ch;
    }
}

static int exchange_hellos(ar_round *r, ar_link *L, visc_ar_hello *peer) {
    const visc_allreduce_config *c = r->cfg;
    visc_ar_hello h = {.n = r->n,
                       .weight = r->weight,
                       .compression = (uint8_t)c->compression,
                       .aggregation = (uint8_t)c->agg.mode,
                       .part_bytes = (uint32_t)c->part_bytes};
    memcpy(h.group_id, r->g->id, 16);
    memcpy(h.schema_hash, c->schema_hash, 32);
    uint8_t msg[VISC_AR_HELLO_BYTES];
    visc_ar_hello_encode(&h, msg);
    double dl = dmax(r->connect_deadline, visc_now() + c->part_timeout_min_s);
    dl = dmin(dl, r->deadline);
    if (visc_chan_send(L->ch, VISC_MSG_AR_HELLO, msg, sizeof msg, dl) != 0) return -1;
    uint8_t type;
    size_t got;
    if (visc_chan_recv(L->ch, &type, msg, sizeof msg, &got, dl) != 0) return -1;
    if (type == VISC_MSG_AR_ABORT) return visc_set_error("aborted by the peer");
    if (type != VISC_MSG_AR_HELLO) return visc_set_error("frame type %u instead of a hello", type);
    if (visc_ar_hello_parse(msg, got, peer) != 0) return -2;
    if (memcmp(peer->group_id, r->g->id, 16) != 0) return invalid(visc_set_error("other group id"));
    if (memcmp(peer->schema_hash, c->schema_hash, 32) != 0)
        return invalid(visc_set_error("other schema hash"));
    if (peer->n != r->n)
        return invalid(
            visc_set_error("vector of %llu values (here %zu)", (unsigned long long)peer->n, r->n));
    if (peer->compression != h.compression || peer->aggregation != h.aggregation ||
        peer->part_bytes != h.part_bytes)
        return invalid(visc_set_error("other compression, aggregation or part size"));
    if (!(peer->weight <= c->agg.max_weight))
        return invalid(visc_set_error("weight %g above %g", peer->weight, c->agg.max_weight));
    /* weight 0 exactly for the members the group lists as contributing nothing */
    if ((peer->weight == 0) != !contributes(r, L->idx))
        return invalid(visc_set_error("weight %g from %s member", peer->weight,
                                      contributes(r, L->idx)            ? "a training"
                                      : r->g->members[L->idx].auxiliary ? "an auxiliary"
                                                                        : "a newcomer"));
    return 0;
}

/* One received PART (a part of my shard from this sender). 0, or -1 with
 * the link failed or banned. */
static int take_part(ar_round *r, ar_link *L, const uint8_t *msg, size_t got) {
    int k = L->parts_in;
    if (!contributes(r, L->idx))
        return invalid(visc_set_error("a part from a member that contributes nothing"));
    if (k >= r->nparts[r->self]) return invalid(visc_set_error("part beyond the shard"));
    size_t count = part_len(r, r->self, k);
    float *buf = visc_malloc(count * sizeof(float), "all-reduce part");
    if (!buf) return -1;
    if (visc_ar_part_parse(msg, got, (uint32_t)k, part_encoding(r, r->self, k), buf, count) != 0 ||
        visc_validate_part(&r->cfg->agg, buf, count, L->weight) != 0) {
        free(buf);
        return -2;
    }
    pthread_mutex_lock(&r->mu);
    if (L->failed) {
        free(buf);
    } else {
        r->inbuf[(size_t)k * r->m + L->idx] = buf;
        L->parts_in++;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* One received RESULT (a part of the sender's shard, reduced). */
static int take_result(ar_round *r, ar_link *L, const uint8_t *msg, size_t got) {
    int k = L->results_in;
    if (k >= r->nparts[L->idx]) return invalid(visc_set_error("result beyond the shard"));
    pthread_mutex_lock(&r->mu);
    int sent = L->parts_encoded;
    pthread_mutex_unlock(&r->mu);
    /* a result can only follow our own part: anything else is forged (a
     * member that contributes nothing sends no parts) */
    if (contributes(r, r->self) && k >= sent)
        return invalid(visc_set_error("result %d before part %d was sent", k, k));
    size_t count = part_len(r, L->idx, k);
    if (visc_ar_part_parse(msg, got, (uint32_t)k, part_encoding(r, L->idx, k), L->rx_scratch,
                           count) != 0 ||
        visc_validate_values(&r->cfg->agg, L->rx_scratch, count) != 0)
        return -2;
    pthread_mutex_lock(&r->mu);
    if (!L->failed) {
        memcpy(r->x + part_off(r, L->idx, k), L->rx_scratch, count * sizeof(float));
        L->results_in++;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static void receive_loop(ar_round *r, ar_link *L) {
    uint8_t *buf = visc_malloc(r->wire_cap, "all-reduce receive buffer");
    pthread_mutex_lock(&r->mu);
    if (!buf) fail_locked(r, L, 1, "%s", visc_last_error());
    for (;;) {
        if (L->failed || r->over) break;
        int want_parts = contributes(r, L->idx) && L->parts_in < r->nparts[r->self];
        int want_results = takes_results(r, r->self) && L->results_in < r->nparts[L->idx];
        if (!want_parts && !want_results) break;
        double dl;
        if (want_parts) {
            dl = L->last_rx + part_deadline_s(r, L, part_len(r, r->self, L->parts_in) * 4);
        } else {
            /* its result may wait for other senders' parts: allow for one
             * part deadline of theirs, counted from the last progress anywhere */
            double base = dmax(L->last_rx, r->last_any_rx);
            dl = base + r->cfg->part_timeout_min_s +
                 2 * part_deadline_s(r, L, part_len(r, L->idx, L->results_in) * 4);
        }
        dl = dmin(dl, r->deadline);
        pthread_mutex_unlock(&r->mu);
        uint8_t type = 0;
        size_t got = 0;
        int rc = visc_chan_recv(L->ch, &type, buf, r->wire_cap, &got, dl);
        char what[16];
        snprintf(what, sizeof what, "%s", want_parts ? "part" : "result");
        if (rc == 0) {
            double now = visc_now();
            if (type == VISC_MSG_AR_PART) rc = take_part(r, L, buf, got);
            else if (type == VISC_MSG_AR_RESULT) rc = take_result(r, L, buf, got);
            else if (type == VISC_MSG_AR_ABORT) rc = visc_set_error("aborted by the peer");
            else rc = invalid(visc_set_error("unexpected frame type %u", type));
            pthread_mutex_lock(&r->mu);
            L->last_rx = r->last_any_rx = now;
            L->rx_payload += got;
        } else {
            pthread_mutex_lock(&r->mu);
        }
        if (rc != 0) {
            fail_locked(r, L, rc == -2 ? 2 : 1, "%s%s: %s", rc == -2 ? "banned: " : "",
                        rc == -2 ? "invalid data" : what, visc_last_error());
            break;
        }
    }
    L->rx_done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    free(buf);
}

static void *rx_main(void *arg) {
    ar_link *L = arg;
    ar_round *r = L->r;
    visc_chan *ch = open_link(r, L);
    pthread_mutex_lock(&r->mu);
    if (!ch) {
        fail_locked(r, L, 1, "no connection: %s", visc_last_error());
    } else {
        L->ch = ch;
        if (r->over) fail_locked(r, L, 1, "round ended while connecting");
    }
    int ok = !L->failed;
    pthread_mutex_unlock(&r->mu);
    const visc_allreduce_hooks *hk = r->cfg->hooks;
    if (ok && hk && hk->on_channel && hk->on_channel(hk->ctx, L->idx, ch) != 0) {
        pthread_mutex_lock(&r->mu);
        fail_locked(r, L, 1, "abandoned (fault injected)");
        pthread_mutex_unlock(&r->mu);
        ok = 0;
    }
    visc_ar_hello peer;
    int rc = ok ? exchange_hellos(r, L, &peer) : 0;
    pthread_mutex_lock(&r->mu);
    if (ok && rc != 0) {
        fail_locked(r, L, rc == -2 ? 2 : 1, "%shello: %s", rc == -2 ? "banned: " : "",
                    visc_last_error());
    } else if (ok && !L->failed) {
        L->weight = peer.weight;
        L->ready = 1;
        L->t_ready = L->last_rx = visc_now();
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    if (ok && rc == 0) {
        receive_loop(r, L);
    } else {
        pthread_mutex_lock(&r->mu);
        L->rx_done = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

/* Encodes part k of the member's shard from x into L->wire; returns the
 * payload size. */
static size_t encode_part(ar_round *r, ar_link *L, int k) {
    size_t off = part_off(r, L->idx, k), count = part_len(r, L->idx, k);
    const float *src = r->x + off;
    const visc_allreduce_hooks *hk = r->cfg->hooks;
    if (hk && hk->on_send_part) {
        memcpy(L->tx_scratch, src, count * sizeof(float));
        size_t wire_count = hk->on_send_part(hk->ctx, L->idx, k, L->tx_scratch, count);
        count = wire_count < count ? wire_count : count;
        src = L->tx_scratch;
    }
    visc_put_u32(L->wire, (uint32_t)k);
    visc_compression enc = visc_compression_for(part_encoding(r, L->idx, k), count);
    float *err = r->error_buf && r->cfg->error_feedback ? r->error_buf + off : NULL;
    return VISC_AR_PART_HEADER + visc_compress(enc, src, count, L->wire + VISC_AR_PART_HEADER, err);
}

static void *tx_main(void *arg) {
    ar_link *L = arg;
    ar_round *r = L->r;
    pthread_mutex_lock(&r->mu);
    while (!L->ready && !L->failed && !r->over && visc_now() < r->deadline)
        wait_until(r, r->deadline);
    for (;;) {
        if (L->failed || r->over) break;
        int owe_parts = contributes(r, r->self) && L->parts_out < r->nparts[L->idx];
        int owe_results = takes_results(r, L->idx) ? r->nparts[r->self] : 0;
        /* every part before any result: reducers get their inputs as early
         * as possible (on rate-limited links, 0.92 of the butterfly bound
         * with 8 peers, against 0.78 with results first), and a peer's
         * first data frames are always its own (checked) parts */
        int result_ready =
            !owe_parts && L->results_out < r->reduced && L->results_out < owe_results;
        if (!owe_parts && L->results_out >= owe_results) break;
        if (!result_ready && !owe_parts) {
            wait_until(r, r->deadline);
            if (visc_now() >= r->deadline) break;
            continue;
        }
        int k = result_ready ? L->results_out : L->parts_out;
        const uint8_t *payload = NULL;
        size_t len = 0;
        if (result_ready) payload = r->res_enc[k], len = r->res_len[k];
        double rate = link_rate(r, L);
        pthread_mutex_unlock(&r->mu);
        if (!result_ready) {
            len = encode_part(r, L, k), payload = L->wire;
            pthread_mutex_lock(&r->mu);
            L->parts_encoded = k + 1;
            pthread_mutex_unlock(&r->mu);
        }
        double t = visc_now();
        double dl = dmin(r->deadline, t + deadline_s(r, len, rate));
        int rc = visc_chan_send(L->ch, result_ready ? VISC_MSG_AR_RESULT : VISC_MSG_AR_PART,
                                payload, len, dl);
        pthread_mutex_lock(&r->mu);
        if (rc != 0) {
            fail_locked(r, L, 1, "sending %s %d: %s", result_ready ? "result" : "part", k,
                        visc_last_error());
            break;
        }
        L->tx_busy += visc_now() - t;
        L->tx_payload += len;
        if (result_ready) L->results_out++;
        else L->parts_out++;
        pthread_cond_broadcast(&r->cv);
    }
    L->tx_done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Reduces part k of my shard once every sender still in the round has
 * delivered it. Called with the mutex held; returns it held. */
static int reduce_part(ar_round *r, int k, float *out) {
    const float *parts[VISC_GROUP_MAX];
    double weights[VISC_GROUP_MAX];
    int who[VISC_GROUP_MAX], cnt = 0;
    size_t off = part_off(r, r->self, k), count = part_len(r, r->self, k);
    if (contributes(r, r->self))
        parts[cnt] = r->x + off, weights[cnt] = r->weight, who[cnt++] = r->self;
    for (int p = 0; p < r->m; p++) {
        if (!r->has_link[p] || !contributes(r, p)) continue;
        float **slot = &r->inbuf[(size_t)k * r->m + p];
        if (r->links[p].failed) {
            free(*slot);
            *slot = NULL;
        } else {
            parts[cnt] = *slot, weights[cnt] = r->links[p].weight, who[cnt++] = p;
        }
    }
    pthread_mutex_unlock(&r->mu);
    const visc_allreduce_hooks *hk = r->cfg->hooks;
    if (hk && hk->on_reduce) hk->on_reduce(hk->ctx, k);
    int rc = visc_aggregate(&r->cfg->agg, parts, weights, cnt, count, out);
    /* a lying reducer (tests): the others get the hook's values, this
     * peer keeps the true ones */
    float *lie = NULL;
    if (rc == 0 && hk && hk->on_result) {
        lie = visc_malloc(count * sizeof(float), "all-reduce result (fault injection)");
        if (!lie) rc = -1;
        else {
            memcpy(lie, out, count * sizeof(float));
            hk->on_result(hk->ctx, k, lie, count);
        }
    }
    uint8_t *enc = NULL;
    size_t len = 0;
    if (rc == 0) {
        visc_compression c = visc_compression_for(part_encoding(r, r->self, k), count);
        enc =
            visc_malloc(VISC_AR_PART_HEADER + visc_compressed_size(c, count), "all-reduce result");
        if (!enc) rc = -1;
        else {
            visc_put_u32(enc, (uint32_t)k);
            len = VISC_AR_PART_HEADER +
                  visc_compress(c, lie ? lie : out, count, enc + VISC_AR_PART_HEADER, NULL);
            /* keep exactly what the others receive */
            if (!lie)
                rc = visc_decompress(c, enc + VISC_AR_PART_HEADER, len - VISC_AR_PART_HEADER, out,
                                     count);
        }
    }
    free(lie);
    pthread_mutex_lock(&r->mu);
    if (rc != 0) {
        free(enc);
        return -1;
    }
    memcpy(r->x + off, out, count * sizeof(float));
    r->res_enc[k] = enc, r->res_len[k] = len;
    for (int i = 0; i < cnt; i++) {
        r->parts_with[who[i]]++;
        if (who[i] != r->self) {
            free(r->inbuf[(size_t)k * r->m + who[i]]);
            r->inbuf[(size_t)k * r->m + who[i]] = NULL;
        }
    }
    r->reduced++;
    pthread_cond_broadcast(&r->cv);
    return 0;
}

/* The caller's part: reduce my shard in order as parts complete. With the
 * mutex held. */
static void reduce_shard(ar_round *r, float *out, char *err, size_t errcap) {
    int total = r->nparts[r->self];
    while (r->reduced < total && !r->over && visc_now() < r->deadline) {
        int k = r->reduced, complete = 1;
        for (int p = 0; p < r->m && complete; p++)
            if (r->has_link[p] && contributes(r, p) && !r->links[p].failed &&
                r->links[p].parts_in <= k)
                complete = 0;
        if (!complete) {
            wait_until(r, r->deadline);
            continue;
        }
        if (reduce_part(r, k, out) != 0) {
            snprintf(err, errcap, "reducing part %d: %s", k, visc_last_error());
            return;
        }
    }
}

static int all_done(const ar_round *r) {
    for (int p = 0; p < r->m; p++) {
        if (!r->has_link[p]) continue;
        const ar_link *L = &r->links[p];
        if ((L->rx_started && !L->rx_done) || (L->tx_started && !L->tx_done)) return 0;
    }
    return 1;
}

static void fill_report(ar_round *r, visc_allreduce_report *rep, const char *own_err) {
    memset(rep, 0, sizeof *rep);
    rep->group_size = r->m;
    rep->part_values = r->pv;
    memcpy(rep->shard_begin, r->begin, sizeof r->begin);
    size_t replaced = 0;
    for (int k = 0; k < r->reduced; k++) replaced += part_len(r, r->self, k);
    rep->values_reduced = replaced;
    rep->results_back[r->self] = r->reduced;
    size_t wl = 0;
    if (own_err && own_err[0])
        wl += (size_t)snprintf(rep->what_failed, sizeof rep->what_failed, "%s; ", own_err);
    for (int p = 0; p < r->m; p++) {
        rep->parts_with[p] = r->parts_with[p];
        if (!r->has_link[p]) continue;
        ar_link *L = &r->links[p];
        for (int k = 0; k < L->results_in; k++) replaced += part_len(r, p, k);
        rep->results_back[p] = L->results_in;
        if (L->ch) {
            rep->bytes_sent += visc_chan_bytes_sent(L->ch);
            rep->bytes_received += visc_chan_bytes_received(L->ch);
        }
        if (!L->failed) continue;
        rep->member_failed[p] = L->failed;
        memcpy(rep->failed_keys[rep->n_failed_keys++], r->g->members[p].key, VISC_KEY_BYTES);
        if (L->failed == 2) rep->banned++;
        if (reduces(r, p)) rep->failed_reducers++;
        if (reduces(r, r->self)) rep->failed_senders++;
        char id[VISC_PEER_ID_CHARS + 1];
        visc_peer_id(r->g->members[p].key, id);
        if (wl < sizeof rep->what_failed)
            wl += (size_t)snprintf(rep->what_failed + wl, sizeof rep->what_failed - wl,
                                   "member %d (%s): %s; ", p, id, L->why);
    }
    size_t len = strlen(rep->what_failed);
    if (len >= 2 && rep->what_failed[len - 2] == ';') rep->what_failed[len - 2] = '\0';
    /* an auxiliary holds no vector of its own: what it needs is its shard */
    size_t need = takes_results(r, r->self) ? r->n : r->begin[r->self + 1] - r->begin[r->self];
    rep->averaged_fraction = need ? (double)replaced / (double)need : 1;
}

static int check_args(const visc_group *g, const visc_allreduce_config *cfg, size_t n,
                      double weight) {
    if (g->size < 2 || g->size > VISC_GROUP_MAX)
        return visc_set_error("all-reduce: group of %d members", g->size);
    if (g->self < 0 || g->self >= g->size)
        return visc_set_error("all-reduce: self index %d outside the group", g->self);
    if (n == 0) return visc_set_error("all-reduce: empty vector");
    const visc_group_member *self = &g->members[g->self];
    if (!visc_member_contributes(self)
            ? weight != 0
            : !isfinite(weight) || weight <= 0 || weight > cfg->agg.max_weight)
        return visc_set_error("all-reduce: weight %g out of range%s", weight,
                              self->auxiliary  ? " (an auxiliary member's is 0)"
                              : self->newcomer ? " (a newcomer member's is 0)"
                                               : "");
    if ((unsigned)cfg->compression > VISC_COMP_Q8)
        return visc_set_error("all-reduce: unknown compression");
    if (cfg->part_bytes > UINT32_MAX) return visc_set_error("all-reduce: part size too large");
    /* what visc_aggregate would refuse, refused before the round starts
     * (not after every member has sent this peer its parts) */
    const visc_aggregate_config *a = &cfg->agg;
    if ((unsigned)a->mode > VISC_AGG_CENTERED_CLIP ||
        (a->mode == VISC_AGG_TRIMMED_MEAN && a->trim < 0) ||
        (a->mode == VISC_AGG_CENTERED_CLIP &&
         (!(a->clip_tau > 0 && isfinite(a->clip_tau)) || a->clip_iters < 0)))
        return visc_set_error("all-reduce: bad aggregation settings (mode %d, trim %d, clip tau "
                              "%g, %d iterations)",
                              (int)a->mode, a->trim, (double)a->clip_tau, a->clip_iters);
    if (!(cfg->round_timeout_s > 0) || !(cfg->part_timeout_min_s > 0) ||
        !(cfg->part_timeout_slack >= 0) || !(cfg->connect_timeout_s > 0))
        return visc_set_error("all-reduce: timeouts must be positive");
    int full = 0, contributors = 0;
    for (int i = 0; i < g->size; i++) {
        const visc_group_member *m = &g->members[i];
        if (m->client && (m->auxiliary || m->newcomer))
            return visc_set_error("all-reduce: member %d is a client and %s", i,
                                  m->auxiliary ? "an auxiliary" : "a newcomer");
        if (m->auxiliary && m->newcomer)
            return visc_set_error("all-reduce: member %d is an auxiliary and a newcomer", i);
        full += !m->client;
        contributors += visc_member_contributes(m);
    }
    if (!full) return visc_set_error("all-reduce: no member reduces (all are clients)");
    if (!contributors)
        return visc_set_error("all-reduce: no member contributes (every member is an auxiliary "
                              "or a newcomer)");
    return 0;
}

static int round_setup(ar_round *r) {
    visc_allreduce_shards(r->g, r->n, r->begin);
    r->pv = visc_allreduce_part_values(r->cfg->part_bytes);
    r->wire_cap = VISC_AR_PART_HEADER + visc_compressed_size(VISC_COMP_NONE, r->pv);
    for (int c = VISC_COMP_FP16; c <= VISC_COMP_Q8; c++) {
        size_t s = VISC_AR_PART_HEADER + visc_compressed_size((visc_compression)c, r->pv);
        if (s > r->wire_cap) r->wire_cap = s;
    }
    for (int i = 0; i < r->m; i++) r->nparts[i] = shard_parts(r, i);
    int own = r->nparts[r->self];
    r->inbuf = visc_calloc((size_t)own * r->m + 1, sizeof(float *), "all-reduce part table");
    r->res_enc = visc_calloc((size_t)own + 1, sizeof(uint8_t *), "all-reduce result table");
    r->res_len = visc_calloc((size_t)own + 1, sizeof(size_t), "all-reduce result table");
    if (!r->inbuf || !r->res_enc || !r->res_len) return -1;
    for (int p = 0; p < r->m; p++) {
        /* a link where one side takes what the other reduces (parts go only
         * to reducers from members that take results, too) */
        if (p == r->self || !((takes_results(r, r->self) && reduces(r, p)) ||
                              (takes_results(r, p) && reduces(r, r->self))))
            continue;
        ar_link *L = &r->links[p];
        L->r = r, L->idx = p;
        L->rx_scratch = visc_malloc(r->pv * sizeof(float), "all-reduce link buffer");
        L->tx_scratch = visc_malloc(r->pv * sizeof(float), "all-reduce link buffer");
        L->wire = visc_malloc(r->wire_cap, "all-reduce link buffer");
        r->has_link[p] = 1;
        if (!L->rx_scratch || !L->tx_scratch || !L->wire) return -1;
    }
    return 0;
}

static void round_free(ar_round *r) {
    int own = r->nparts[r->self];
    for (int p = 0; p < r->m; p++) {
        ar_link *L = &r->links[p];
        if (L->ch) visc_chan_close(L->ch);
        free(L->rx_scratch);
        free(L->tx_scratch);
        free(L->wire);
    }
    if (r->inbuf)
        for (size_t i = 0; i < (size_t)own * r->m; i++) free(r->inbuf[i]);
    if (r->res_enc)
        for (int k = 0; k < own; k++) free(r->res_enc[k]);
    free(r->inbuf);
    free(r->res_enc);
    free(r->res_len);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

int visc_allreduce(visc_swarm_node *node, const visc_group *g, const visc_allreduce_config *cfg,
                   float *x, size_t n, double weight, float *error_buf,
                   visc_allreduce_report *rep) {
    memset(rep, 0, sizeof *rep);
    if (check_args(g, cfg, n, weight) != 0) return -1;
    ar_round *r = visc_calloc(1, sizeof *r, "all-reduce round");
    if (!r) return -1;
    r->node = node, r->g = g, r->cfg = cfg, r->x = x, r->n = n, r->weight = weight;
    r->error_buf = error_buf, r->m = g->size, r->self = g->self;
    r->t0 = r->last_any_rx = visc_now();
    r->deadline = r->t0 + cfg->round_timeout_s;
    r->connect_deadline = dmin(r->deadline, r->t0 + cfg->connect_timeout_s);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&r->mu, NULL);
    char own_err[256] = "";
    float *out = NULL;
    if (round_setup(r) != 0 ||
        !(out = visc_malloc(r->pv * sizeof(float), "all-reduce result buffer"))) {
        round_free(r);
        return -1;
    }
    pthread_mutex_lock(&r->mu);
    for (int p = 0; p < r->m; p++) {
        if (!r->has_link[p]) continue;
        ar_link *L = &r->links[p];
        if (pthread_create(&L->rx, NULL, rx_main, L) == 0) L->rx_started = 1;
        else fail_locked(r, L, 1, "cannot start a thread");
        if (pthread_create(&L->tx, NULL, tx_main, L) == 0) L->tx_started = 1;
        else fail_locked(r, L, 1, "cannot start a thread");
    }
    reduce_shard(r, out, own_err, sizeof own_err);
    if (own_err[0]) {
        r->over = 1;
        pthread_cond_broadcast(&r->cv);
    }
    while (!all_done(r) && visc_now() < r->deadline) wait_until(r, r->deadline);
    /* the round deadline ends whatever is still running */
    r->over = 1;
    for (int p = 0; p < r->m; p++)
        if (r->has_link[p] && !(r->links[p].rx_done && r->links[p].tx_done))
            fail_locked(r, &r->links[p], 1, "round deadline (%.1f s) passed", cfg->round_timeout_s);
    if (r->reduced < r->nparts[r->self] && !own_err[0])
        snprintf(own_err, sizeof own_err, "own shard: %d of %d parts reduced by the deadline",
                 r->reduced, r->nparts[r->self]);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    for (int p = 0; p < r->m; p++) {
        if (r->links[p].rx_started) pthread_join(r->links[p].rx, NULL);
        if (r->links[p].tx_started) pthread_join(r->links[p].tx, NULL);
    }
    free(out);
    fill_report(r, rep, own_err);
    rep->seconds = visc_now() - r->t0;
    int complete = rep->n_failed_keys == 0 && !own_err[0] && rep->averaged_fraction >= 1.0;
    round_free(r);
    if (complete) return 0;
    if (rep->averaged_fraction > 0) return 1;
    return visc_set_error("all-reduce: nothing averaged: %s", rep->what_failed);
}

/* test_swarm_state.c: state download for late joiners (state_sync.h). Several
 * peers in this process on 127.0.0.1 without a DHT; the progress records a
 * downloader would read are built by hand from the donors' addresses and
 * hashes. Covers the messages, a multi-chunk download, randomized donor
 * choice, poisoned donors (wrong hash served, or bytes that differ from
 * the signed header), corroboration, the size cap (also against a donor
 * that ignores it), donors that die or stall mid-transfer, the one-line
 * error, and the cap on concurrent transfers. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "../src/swarm/state_sync.h"
#include "../src/swarm/wire.h"
#include "test.h"
#include "visc/core.h"

static const char secret[] = "state sync test secret, 32+ bytes long";

#define BLOB_BYTES ((1u << 20) + 12345u) /* 17 chunks, the last one partial */

typedef struct {
    visc_identity id;
    visc_swarm_auth auth;
    visc_swarm_node *node;
} peer;

static int peer_open(peer *p, int client) {
    memset(p, 0, sizeof *p);
    if (visc_identity_generate(&p->id) != 0) return -1;
    if (visc_swarm_auth_init(&p->auth, "state-test", &p->id) != 0) return -1;
    if (visc_swarm_auth_set_secret(&p->auth, secret, sizeof secret) != 0) return -1;
    visc_swarm_node_config c = {.listen = client ? NULL : "127.0.0.1:0",
                                .dht_port = -1,
                                .auth = &p->auth,
                                .bandwidth = 1e6,
                                .client = client};
    p->node = visc_swarm_node_open(&c);
    if (!p->node) fprintf(stderr, "peer_open: %s\n", visc_last_error());
    return p->node ? 0 : -1;
}

static void peer_close(peer *p) {
    visc_swarm_node_close(p->node);
    p->node = NULL;
    visc_swarm_auth_free(&p->auth);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Deterministic bytes; `salt` makes a different state. */
static uint8_t *make_blob(size_t n, uint32_t salt) {
    uint8_t *b = malloc(n);
    uint32_t x = 0x9e3779b9u ^ salt;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        b[i] = (uint8_t)(x >> 24);
    }
    return b;
}

/* What a donor serves: its blob, epoch, and the hash it claims (which a
 * poisoned donor sets to something other than the blob's hash). */
typedef struct {
    const uint8_t *blob;
    size_t n;
    uint64_t epoch;
    uint8_t claimed[32];
} donor_state;

static int snapshot(void *ctx, uint64_t want_epoch, uint8_t **blob, size_t *n, uint64_t *epoch,
                    uint8_t hash[32]) {
    (void)want_epoch;
    const donor_state *d = ctx;
    *blob = malloc(d->n);
    if (!*blob) return -1;
    memcpy(*blob, d->blob, d->n);
    *n = d->n;
    *epoch = d->epoch;
    memcpy(hash, d->claimed, 32);
    return 0;
}

static donor_state honest(const uint8_t *blob, size_t n, uint64_t epoch) {
    donor_state d = {.blob = blob, .n = n, .epoch = epoch};
    visc_state_hash(blob, n, d.claimed);
    return d;
}

/* The record a peer would publish; addr NULL: a peer that serves nothing. */
static visc_progress_record record(const peer *p, uint64_t epoch, const uint8_t hash[32],
                                   const char *addr) {
    visc_progress_record r;
    memset(&r, 0, sizeof r);
    memcpy(r.peer, p->id.public_key, VISC_KEY_BYTES);
    r.epoch = epoch;
    r.samples_per_second = 100;
    r.loss = NAN;
    if (addr) snprintf(r.addr, sizeof r.addr, "%s", addr);
    if (hash) memcpy(r.state_hash, hash, 32);
    return r;
}

static visc_state_download_config config(uint64_t seed) {
    visc_state_download_config c = visc_state_download_defaults(4u << 20);
    c.timeout_s = 20;
    c.seed = seed;
    return c;
}

/* A seed under which donor index `first` of records is tried first. */
static uint64_t seed_trying_first(const visc_progress_record *r, int n, int first) {
    int order[16];
    for (uint64_t seed = 1; seed < 1000; seed++)
        if (visc_state_donor_order(r, n, NULL, 1, seed, order) > 0 && order[0] == first)
            return seed;
    return 0;
}

static int wait_count(visc_state_server *s, uint64_t (*get)(visc_state_server *), uint64_t want) {
    double until = visc_now() + 10;
    while (get(s) != want && visc_now() < until) sleep_s(0.005);
    return get(s) == want;
}

static void download_ok(visc_swarm_node *node, const visc_progress_record *r, int n,
                        const visc_state_download_config *cfg, const uint8_t *want, size_t want_n,
                        uint64_t want_epoch) {
    uint8_t *blob = NULL, hash[32], want_hash[32];
    size_t size = 0;
    uint64_t epoch = 0;
    int rc = visc_state_download(node, r, n, cfg, &blob, &size, &epoch, hash);
    CHECK_MSG(rc == 0, "download: %s", visc_last_error());
    if (rc != 0) return;
    visc_state_hash(want, want_n, want_hash);
    CHECK(size == want_n && memcmp(blob, want, want_n) == 0);
    CHECK(epoch == want_epoch && memcmp(hash, want_hash, 32) == 0);
    free(blob);
}

static char last_err[512]; /* the message of the last download_fails */

/* Expects a failure whose (one-line) message contains `what`. */
static void download_fails(visc_swarm_node *node, const visc_progress_record *r, int n,
                           const visc_state_download_config *cfg, const char *what) {
    uint8_t *blob = NULL, hash[32];
    size_t size = 0;
    uint64_t epoch = 0;
    int rc = visc_state_download(node, r, n, cfg, &blob, &size, &epoch, hash);
    CHECK(rc == -1 && blob == NULL);
    snprintf(last_err, sizeof last_err, "%s", visc_last_error());
    const char *err = last_err;
    CHECK_MSG(strstr(err, what) != NULL, "error \"%s\" lacks \"%s\"", err, what);
    CHECK_MSG(strchr(err, '\n') == NULL, "error on several lines: %s", err);
}

/* ---- messages ---- */

TEST(state_messages_strict) {
    CHECK(sodium_init() >= 0);
    visc_state_request req = {.min_epoch = 9, .max_bytes = 1u << 20}, got;
    uint8_t m[VISC_STATE_HEADER_BYTES];
    visc_state_request_encode(&req, m);
    CHECK(visc_state_request_parse(m, VISC_STATE_REQUEST_BYTES, &got) == 0);
    CHECK(got.min_epoch == 9 && got.max_bytes == 1u << 20);
    CHECK(visc_state_request_parse(m, VISC_STATE_REQUEST_BYTES - 1, &got) == -1);
    CHECK(visc_state_request_parse(m, VISC_STATE_REQUEST_BYTES + 1, &got) == -1);
    m[0] = 2;
    CHECK(visc_state_request_parse(m, VISC_STATE_REQUEST_BYTES, &got) == -1);
    req.max_bytes = 0;
    visc_state_request_encode(&req, m);
    CHECK(visc_state_request_parse(m, VISC_STATE_REQUEST_BYTES, &got) == -1);

    visc_identity donor, other;
    CHECK(visc_identity_generate(&donor) == 0 && visc_identity_generate(&other) == 0);
    uint8_t run[32], run2[32];
    memset(run, 0x11, 32);
    memset(run2, 0x12, 32);
    visc_state_header h = {.epoch = 42, .size = 3u << 16}, hp;
    memset(h.hash, 0xab, 32);
    visc_state_header_sign(&h, run, &donor);
    visc_state_header_encode(&h, m);
    CHECK(visc_state_header_parse(m, sizeof m, run, donor.public_key, &hp) == 0);
    CHECK(hp.epoch == 42 && hp.size == 3u << 16 && memcmp(hp.hash, h.hash, 32) == 0);
    CHECK(visc_state_header_parse(m, sizeof m - 1, run, donor.public_key, &hp) == -1);
    CHECK(visc_state_header_parse(m, sizeof m, run2, donor.public_key, &hp) == -1);
    CHECK(visc_state_header_parse(m, sizeof m, run, other.public_key, &hp) == -1);
    for (size_t i = 1; i < sizeof m; i += 7) { /* any altered field breaks the signature */
        m[i] ^= 0x40;
        CHECK_MSG(visc_state_header_parse(m, sizeof m, run, donor.public_key, &hp) == -1,
                  "byte %zu altered and accepted", i);
        m[i] ^= 0x40;
    }
    h.size = 0; /* an empty state, even signed, is malformed */
    visc_state_header_sign(&h, run, &donor);
    visc_state_header_encode(&h, m);
    CHECK(visc_state_header_parse(m, sizeof m, run, donor.public_key, &hp) == -1);

    visc_state_refuse_reason why;
    visc_state_refuse_encode(VISC_STATE_REFUSE_BUSY, m);
    CHECK(visc_state_refuse_parse(m, 2, &why) == 0 && why == VISC_STATE_REFUSE_BUSY);
    m[1] = 0;
    CHECK(visc_state_refuse_parse(m, 2, &why) == -1);
    m[1] = 6;
    CHECK(visc_state_refuse_parse(m, 2, &why) == -1);
    CHECK(visc_state_refuse_parse(m, 3, &why) == -1);
}

/* ---- donor order ---- */

TEST(state_donor_order_randomized_among_highest_epoch) {
    peer a, b, c, d;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b), memset(&c, 0, sizeof c);
    memset(&d, 0, sizeof d);
    CHECK(visc_identity_generate(&a.id) == 0 && visc_identity_generate(&b.id) == 0);
    CHECK(visc_identity_generate(&c.id) == 0 && visc_identity_generate(&d.id) == 0);
    uint8_t h5[32], h4[32];
    memset(h5, 5, 32);
    memset(h4, 4, 32);
    visc_progress_record r[5] = {
        record(&c, 4, h4, "127.0.0.1:3"), /* lower epoch: after every epoch-5 donor */
        record(&a, 5, h5, "127.0.0.1:1"),
        record(&d, 4, h4, NULL), /* corroborates c; serves nothing */
        record(&b, 5, h5, "127.0.0.1:2"),
        record(&d, 5, NULL, "127.0.0.1:4"), /* no state hash: never a donor */
    };
    int order[5], first[5] = {0}, again[5];
    for (uint64_t seed = 1; seed <= 32; seed++) {
        CHECK(visc_state_donor_order(r, 5, NULL, 1, seed, order) == 3);
        CHECK((order[0] == 1 && order[1] == 3) || (order[0] == 3 && order[1] == 1));
        CHECK(order[2] == 0);
        first[order[0]]++;
        CHECK(visc_state_donor_order(r, 5, NULL, 1, seed, again) == 3);
        CHECK(memcmp(order, again, sizeof(int) * 3) == 0); /* a seed fixes the choice */
    }
    CHECK_MSG(first[1] >= 4 && first[3] >= 4, "first picks: a %d, b %d of 32", first[1], first[3]);
    /* self is never its own donor */
    CHECK(visc_state_donor_order(r, 5, a.id.public_key, 1, 7, order) == 2);
    CHECK(order[0] == 3 && order[1] == 0);
    /* seed 0: fresh randomness, still the same candidates */
    CHECK(visc_state_donor_order(r, 5, NULL, 1, 0, order) == 3 && order[2] == 0);
}

/* ---- downloads ---- */

typedef struct {
    peer p;
    donor_state state;
    visc_state_server *server;
} donor;

static int donor_start(donor *d, donor_state st) {
    if (peer_open(&d->p, 0) != 0) return -1;
    d->state = st;
    d->server = visc_state_server_start(d->p.node, snapshot, &d->state);
    return d->server ? 0 : -1;
}

static void donor_stop(donor *d) {
    visc_state_server_stop(d->server);
    d->server = NULL;
    peer_close(&d->p);
}

static const char *addr_of(const donor *d) { return visc_swarm_node_address(d->p.node); }

TEST(state_download_multichunk_and_random_donor) {
    uint8_t *blob = make_blob(BLOB_BYTES, 1), *old = make_blob(BLOB_BYTES - 7, 2);
    donor d[3];
    CHECK(donor_start(&d[0], honest(blob, BLOB_BYTES, 5)) == 0);
    CHECK(donor_start(&d[1], honest(blob, BLOB_BYTES, 5)) == 0);
    CHECK(donor_start(&d[2], honest(old, BLOB_BYTES - 7, 4)) == 0);
    peer me;
    CHECK(peer_open(&me, 1) == 0);
    visc_progress_record r[4] = {
        record(&d[0].p, 5, d[0].state.claimed, addr_of(&d[0])),
        record(&d[1].p, 5, d[1].state.claimed, addr_of(&d[1])),
        record(&d[2].p, 4, d[2].state.claimed, addr_of(&d[2])),
        record(&me, 3, NULL, NULL), /* the newcomer itself */
    };
    /* the donor that the seed puts first serves; over seeds, each of the two */
    uint64_t served[2] = {0, 0};
    for (int want = 0; want < 2; want++)
        for (int rep = 0; rep < 2; rep++) {
            uint64_t seed = seed_trying_first(r, 3, want) + (uint64_t)rep * 1000;
            int order[4];
            while (visc_state_donor_order(r, 4, NULL, 1, seed, order) < 1 || order[0] != want)
                seed++;
            visc_state_download_config cfg = config(seed);
            download_ok(me.node, r, 4, &cfg, blob, BLOB_BYTES, 5);
            served[want]++;
            CHECK(wait_count(d[want].server, visc_state_server_served, served[want]));
        }
    CHECK(visc_state_server_served(d[0].server) == 2 && visc_state_server_served(d[1].server) == 2);
    CHECK(visc_state_server_served(d[2].server) == 0); /* the older epoch is never the pick */
    CHECK(visc_state_server_refused(d[0].server) == 0);
    peer_close(&me);
    for (int i = 0; i < 3; i++) donor_stop(&d[i]);
    free(blob);
    free(old);
}

TEST(state_poisoned_donor_rejected) {
    uint8_t *blob = make_blob(BLOB_BYTES, 1), *bad = make_blob(BLOB_BYTES, 66);
    donor good, liar;
    CHECK(donor_start(&good, honest(blob, BLOB_BYTES, 8)) == 0);
    /* serves other bytes under their own (true) hash, while its record
     * carries the swarm's hash: the header's hash gives it away */
    CHECK(donor_start(&liar, honest(bad, BLOB_BYTES, 8)) == 0);
    peer me;
    CHECK(peer_open(&me, 1) == 0);
    visc_progress_record r[2] = {
        record(&liar.p, 8, good.state.claimed, addr_of(&liar)),
        record(&good.p, 8, good.state.claimed, addr_of(&good)),
    };
    visc_state_download_config cfg = config(seed_trying_first(r, 2, 0));
    download_ok(me.node, r, 2, &cfg, blob, BLOB_BYTES, 8);
    CHECK(wait_count(good.server, visc_state_server_served, 1));

    /* now the liar signs the swarm's hash over its other bytes: caught
     * when the bytes that arrived are hashed */
    memcpy(liar.state.claimed, good.state.claimed, 32);
    /* (the first transfer may or may not have reached the socket buffers
     * before we hung up: count from when it has ended) */
    double until = visc_now() + 10;
    while (visc_state_server_active(liar.server) > 0 && visc_now() < until) sleep_s(0.005);
    uint64_t liar_served = visc_state_server_served(liar.server);
    download_ok(me.node, r, 2, &cfg, blob, BLOB_BYTES, 8);
    CHECK(wait_count(liar.server, visc_state_server_served, liar_served + 1)); /* sent it all */
    CHECK(wait_count(good.server, visc_state_server_served, 2));

    /* with only the liar serving (the other peer corroborates the honest
     * hash but serves nothing), the download fails and says why */
    r[1].addr[0] = '\0';
    download_fails(me.node, r, 2, &cfg, "hashing to");
    peer_close(&me);
    donor_stop(&good);
    donor_stop(&liar);
    free(blob);
    free(bad);
}

TEST(state_corroboration_required) {
    uint8_t *blob = make_blob(BLOB_BYTES, 1), *lone_blob = make_blob(4000, 9);
    donor lone, a, b;
    CHECK(donor_start(&lone, honest(lone_blob, 4000, 12)) == 0);
    peer me;
    CHECK(peer_open(&me, 1) == 0);
    visc_progress_record r[3] = {record(&lone.p, 12, lone.state.claimed, addr_of(&lone))};
    visc_state_download_config cfg = config(3);
    download_fails(me.node, r, 1, &cfg, "no donor");
    CHECK(visc_state_server_served(lone.server) == 0);
    cfg.require_corroboration = 0;
    download_ok(me.node, r, 1, &cfg, lone_blob, 4000, 12);

    /* a lone high epoch does not hide a corroborated lower one */
    CHECK(donor_start(&a, honest(blob, BLOB_BYTES, 11)) == 0);
    CHECK(donor_start(&b, honest(blob, BLOB_BYTES, 11)) == 0);
    r[1] = record(&a.p, 11, a.state.claimed, addr_of(&a));
    r[2] = record(&b.p, 11, b.state.claimed, addr_of(&b));
    cfg.require_corroboration = 1;
    download_ok(me.node, r, 3, &cfg, blob, BLOB_BYTES, 11);
    CHECK(visc_state_server_served(lone.server) == 1); /* only the uncorroborated download */
    peer_close(&me);
    donor_stop(&lone);
    donor_stop(&a);
    donor_stop(&b);
    free(blob);
    free(lone_blob);
}

/* ---- hostile donors played by hand ---- */

typedef enum {
    DIES_MIDWAY,
    STALLS,
    CLAIMS_HUGE,
    NO_HEADER,   /* a chunk where the header belongs */
    FORGED,      /* a header signed by a key other than the donor's */
    OTHER_EPOCH, /* a valid header for another epoch than published */
    SHORT_CHUNK, /* a first chunk one byte short */
} misbehaviour;

typedef struct {
    peer *p;
    misbehaviour how;
    const uint8_t *blob;
    size_t n;
    uint64_t epoch;
    uint8_t hash[32];
    int reached_end; /* did its act up to the misbehaviour */
} rogue;

static void *rogue_main(void *arg) {
    rogue *g = arg;
    static const uint8_t zero_tag[16];
    visc_chan *c =
        visc_swarm_node_take(g->p->node, VISC_PURPOSE_STATE, zero_tag, NULL, visc_now() + 20);
    if (!c) return NULL;
    uint8_t type, msg[VISC_STATE_HEADER_BYTES];
    size_t got;
    visc_state_request req;
    if (visc_chan_recv(c, &type, msg, sizeof msg, &got, visc_now() + 5) != 0 ||
        type != VISC_MSG_STATE_REQUEST || visc_state_request_parse(msg, got, &req) != 0) {
        visc_chan_close(c);
        return NULL;
    }
    visc_state_header h = {.epoch = g->epoch, .size = g->n};
    memcpy(h.hash, g->hash, 32);
    if (g->how == CLAIMS_HUGE) h.size = 1ull << 60; /* ignores the requester's cap */
    if (g->how == OTHER_EPOCH) h.epoch++;
    visc_identity other;
    if (g->how == FORGED && visc_identity_generate(&other) == 0)
        visc_state_header_sign(&h, g->p->auth.run_hash, &other);
    else visc_state_header_sign(&h, g->p->auth.run_hash, &g->p->id);
    visc_state_header_encode(&h, msg);
    int ok = visc_chan_send(c, g->how == NO_HEADER ? VISC_MSG_STATE_CHUNK : VISC_MSG_STATE_HEADER,
                            msg, sizeof msg, visc_now() + 5) == 0;
    if (g->how == SHORT_CHUNK && ok)
        ok = visc_chan_send(c, VISC_MSG_STATE_CHUNK, g->blob, VISC_STATE_CHUNK - 1,
                            visc_now() + 5) == 0;
    if (g->how >= NO_HEADER && ok) /* until the requester hangs up */
        ok = visc_chan_recv(c, &type, msg, sizeof msg, &got, visc_now() + 10) != 0;
    if (g->how == DIES_MIDWAY) /* three chunks of the true state, then gone */
        for (int i = 0; ok && i < 3; i++)
            ok = visc_chan_send(c, VISC_MSG_STATE_CHUNK, g->blob + (size_t)i * VISC_STATE_CHUNK,
                                VISC_STATE_CHUNK, visc_now() + 5) == 0;
    if (g->how == STALLS && ok) /* silent until the requester gives up */
        ok = visc_chan_recv(c, &type, msg, sizeof msg, &got, visc_now() + 10) != 0;
    g->reached_end = ok;
    visc_chan_close(c);
    return NULL;
}

/* The rogue is tried first; the honest donor then serves. */
static void check_rogue(misbehaviour how, double chunk_timeout_s, const char *why_if_alone) {
    uint8_t *blob = make_blob(BLOB_BYTES, 1);
    donor good;
    peer bad, me;
    CHECK(donor_start(&good, honest(blob, BLOB_BYTES, 20)) == 0);
    CHECK(peer_open(&bad, 0) == 0 && peer_open(&me, 1) == 0);
    rogue g = {.p = &bad, .how = how, .blob = blob, .n = BLOB_BYTES, .epoch = 20};
    memcpy(g.hash, good.state.claimed, 32);
    visc_progress_record r[2] = {
        record(&bad, 20, g.hash, visc_swarm_node_address(bad.node)),
        record(&good.p, 20, g.hash, addr_of(&good)),
    };
    visc_state_download_config cfg = config(seed_trying_first(r, 2, 0));
    cfg.chunk_timeout_s = chunk_timeout_s;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, rogue_main, &g) == 0);
    double t0 = visc_now();
    download_ok(me.node, r, 2, &cfg, blob, BLOB_BYTES, 20);
    CHECK_MSG(visc_now() - t0 < 8, "took %.1f s", visc_now() - t0);
    pthread_join(t, NULL);
    CHECK(g.reached_end);
    CHECK(wait_count(good.server, visc_state_server_served, 1));

    /* alone, it fails the download with the reason */
    r[1].addr[0] = '\0';
    g.reached_end = 0;
    CHECK(pthread_create(&t, NULL, rogue_main, &g) == 0);
    download_fails(me.node, r, 2, &cfg, why_if_alone);
    pthread_join(t, NULL);
    CHECK(g.reached_end);
    peer_close(&me);
    peer_close(&bad);
    donor_stop(&good);
    free(blob);
}

TEST(state_donor_dies_mid_transfer) { check_rogue(DIES_MIDWAY, 0, "chunk at byte 196608"); }

TEST(state_donor_stalls_past_chunk_deadline) { check_rogue(STALLS, 1.0, "timed out"); }

TEST(state_oversized_refused_before_allocation) {
    /* the donor's claim of 2^60 bytes (signed, hash as published) must be
     * refused before anything is allocated: allocating it would fail (or,
     * under ASan, abort) instead of naming the cap */
    check_rogue(CLAIMS_HUGE, 0, "exceeds the cap");
    /* an honest donor refuses on its own when the request's cap is too small */
    uint8_t *blob = make_blob(BLOB_BYTES, 1);
    donor a;
    peer me;
    CHECK(donor_start(&a, honest(blob, BLOB_BYTES, 2)) == 0 && peer_open(&me, 1) == 0);
    visc_progress_record r[1] = {record(&a.p, 2, a.state.claimed, addr_of(&a))};
    visc_state_download_config cfg = config(1);
    cfg.require_corroboration = 0;
    cfg.max_bytes = BLOB_BYTES - 1;
    download_fails(me.node, r, 1, &cfg, "exceeds our cap");
    CHECK(wait_count(a.server, visc_state_server_refused, 1));
    cfg.max_bytes = BLOB_BYTES;
    download_ok(me.node, r, 1, &cfg, blob, BLOB_BYTES, 2);
    peer_close(&me);
    donor_stop(&a);
    free(blob);
}

TEST(state_no_donor_one_line_error) {
    peer me, x, y;
    CHECK(peer_open(&me, 1) == 0 && peer_open(&x, 0) == 0 && peer_open(&y, 0) == 0);
    visc_state_download_config cfg = config(1);
    download_fails(me.node, NULL, 0, &cfg, "no donor among 0 records");
    /* two donors whose nodes serve no state (nobody takes the channel: it
     * is dropped when unclaimed, so a tight timeout) */
    uint8_t h[32];
    memset(h, 3, 32);
    visc_progress_record r[2] = {record(&x, 1, h, visc_swarm_node_address(x.node)),
                                 record(&y, 1, h, visc_swarm_node_address(y.node))};
    cfg.timeout_s = 0.3;
    char idx[VISC_PEER_ID_CHARS + 1], idy[VISC_PEER_ID_CHARS + 1];
    visc_peer_id(x.id.public_key, idx);
    visc_peer_id(y.id.public_key, idy);
    download_fails(me.node, r, 2, &cfg, "2 of 2 donors tried");
    CHECK_MSG(strstr(last_err, idx) && strstr(last_err, idy), "%s", last_err);
    CHECK_MSG(strstr(last_err, "timed out"), "%s", last_err);
    /* a node that is gone: connection refused */
    char gone[64];
    snprintf(gone, sizeof gone, "%s", visc_swarm_node_address(y.node));
    peer_close(&y);
    cfg.max_attempts = 1;
    cfg.seed = seed_trying_first(r, 2, 1);
    download_fails(me.node, r, 2, &cfg, "1 of 2 donors tried");
    CHECK_MSG(strstr(last_err, gone) && !strstr(last_err, idx), "%s", last_err);
    peer_close(&me);
    peer_close(&x);
}

typedef struct {
    visc_swarm_node *node;
    const visc_progress_record *r;
    const uint8_t *blob;
    int rc;
} job;

static void *download_job(void *arg) {
    job *j = arg;
    visc_state_download_config cfg = config(1);
    cfg.require_corroboration = 0;
    uint8_t *blob = NULL, hash[32];
    size_t size = 0;
    uint64_t epoch = 0;
    j->rc = visc_state_download(j->node, j->r, 1, &cfg, &blob, &size, &epoch, hash);
    if (j->rc == 0 && (size != BLOB_BYTES || memcmp(blob, j->blob, size) != 0)) j->rc = -2;
    free(blob);
    return NULL;
}

TEST(state_concurrent_requests_capped) {
    uint8_t *blob = make_blob(BLOB_BYTES, 1);
    donor a;
    peer me;
    CHECK(donor_start(&a, honest(blob, BLOB_BYTES, 30)) == 0 && peer_open(&me, 1) == 0);
    visc_progress_record r[1] = {record(&a.p, 30, a.state.claimed, addr_of(&a))};

    /* VISC_STATE_MAX_SERVING downloads at once all succeed */
    job jobs[VISC_STATE_MAX_SERVING];
    pthread_t t[VISC_STATE_MAX_SERVING];
    for (int i = 0; i < VISC_STATE_MAX_SERVING; i++) {
        jobs[i] = (job){.node = me.node, .r = r, .blob = blob, .rc = -1};
        CHECK(pthread_create(&t[i], NULL, download_job, &jobs[i]) == 0);
    }
    for (int i = 0; i < VISC_STATE_MAX_SERVING; i++) {
        pthread_join(t[i], NULL);
        CHECK_MSG(jobs[i].rc == 0, "download %d: %d", i, jobs[i].rc);
    }
    CHECK(wait_count(a.server, visc_state_server_served, VISC_STATE_MAX_SERVING));

    /* requesters that hold every slot (connected, not asking yet) */
    static const uint8_t zero_tag[16];
    visc_chan *hold[VISC_STATE_MAX_SERVING];
    for (int i = 0; i < VISC_STATE_MAX_SERVING; i++) {
        hold[i] = visc_swarm_node_connect(me.node, addr_of(&a), VISC_PURPOSE_STATE, zero_tag, NULL,
                                          visc_now() + 5);
        CHECK(hold[i] != NULL);
    }
    double until = visc_now() + 10;
    while (visc_state_server_active(a.server) < VISC_STATE_MAX_SERVING && visc_now() < until)
        sleep_s(0.005);
    CHECK(visc_state_server_active(a.server) == VISC_STATE_MAX_SERVING);
    visc_state_download_config cfg = config(1);
    cfg.require_corroboration = 0;
    download_fails(me.node, r, 1, &cfg, "refused: busy");
    CHECK(wait_count(a.server, visc_state_server_refused, 1));
    /* one that never asks is dropped (after a short wait for its request) */
    visc_chan *mute = visc_swarm_node_connect(me.node, addr_of(&a), VISC_PURPOSE_STATE, zero_tag,
                                              NULL, visc_now() + 5);
    CHECK(mute != NULL);
    uint8_t type, buf[8];
    size_t got;
    if (mute) CHECK(visc_chan_recv(mute, &type, buf, sizeof buf, &got, visc_now() + 5) != 0);
    CHECK(wait_count(a.server, visc_state_server_refused, 2));
    visc_chan_close(mute);
    /* slots free again when the holders leave */
    for (int i = 0; i < VISC_STATE_MAX_SERVING; i++) visc_chan_close(hold[i]);
    until = visc_now() + 10;
    while (visc_state_server_active(a.server) > 0 && visc_now() < until) sleep_s(0.005);
    CHECK(visc_state_server_active(a.server) == 0);
    download_ok(me.node, r, 1, &cfg, blob, BLOB_BYTES, 30);

    /* stop ends a transfer waiting for its request at once */
    visc_chan *idle = visc_swarm_node_connect(me.node, addr_of(&a), VISC_PURPOSE_STATE, zero_tag,
                                              NULL, visc_now() + 5);
    CHECK(idle != NULL);
    until = visc_now() + 10;
    while (visc_state_server_active(a.server) < 1 && visc_now() < until) sleep_s(0.005);
    double t0 = visc_now();
    visc_state_server_stop(a.server);
    a.server = NULL;
    CHECK_MSG(visc_now() - t0 < 2, "stop took %.2f s", visc_now() - t0);
    visc_chan_close(idle);
    peer_close(&me);
    donor_stop(&a);
    free(blob);
}

/* A rogue donor alone (nobody corroborates or serves besides it): the
 * download fails, naming what the rogue did. */
static void rogue_alone(misbehaviour how, const char *why) {
    uint8_t *blob = make_blob(2 * VISC_STATE_CHUNK, 4);
    peer bad, me;
    CHECK(peer_open(&bad, 0) == 0 && peer_open(&me, 1) == 0);
    rogue g = {.p = &bad, .how = how, .blob = blob, .n = 2 * VISC_STATE_CHUNK, .epoch = 3};
    visc_state_hash(blob, g.n, g.hash);
    visc_progress_record r[1] = {record(&bad, 3, g.hash, visc_swarm_node_address(bad.node))};
    visc_state_download_config cfg = config(1);
    cfg.require_corroboration = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, rogue_main, &g) == 0);
    download_fails(me.node, r, 1, &cfg, why);
    pthread_join(t, NULL);
    CHECK_MSG(g.reached_end, "the rogue did not get to act (%d)", (int)how);
    peer_close(&me);
    peer_close(&bad);
    free(blob);
}

TEST(state_rogue_headers_and_chunks_rejected) {
    rogue_alone(NO_HEADER, "instead of a state header");
    rogue_alone(FORGED, "bad signature");
    rogue_alone(OTHER_EPOCH, "serves epoch 4, published 3");
    rogue_alone(SHORT_CHUNK, "chunk at byte 0: type");
}

static int no_snapshot(void *ctx, uint64_t want_epoch, uint8_t **blob, size_t *n, uint64_t *epoch,
                       uint8_t hash[32]) {
    (void)want_epoch;
    (void)ctx, (void)blob, (void)n, (void)epoch, (void)hash;
    return -1;
}

/* Sends one frame to the donor as a requester and returns the refusal. */
static int refusal_for(peer *me, const donor *d, uint8_t type, const uint8_t *msg, size_t n,
                       visc_state_refuse_reason *why) {
    static const uint8_t zero_tag[16];
    visc_chan *c = visc_swarm_node_connect(me->node, addr_of(d), VISC_PURPOSE_STATE, zero_tag,
                                           d->p.id.public_key, visc_now() + 5);
    if (!c) return -1;
    uint8_t rtype = 0, reply[VISC_STATE_HEADER_BYTES];
    size_t got = 0;
    int rc = visc_chan_send(c, type, msg, n, visc_now() + 5);
    if (rc == 0) rc = visc_chan_recv(c, &rtype, reply, sizeof reply, &got, visc_now() + 5);
    visc_chan_close(c);
    if (rc != 0 || rtype != VISC_MSG_STATE_REFUSE) return -1;
    return visc_state_refuse_parse(reply, got, why);
}

/* A donor with nothing to give, one behind the epoch asked for, and
 * requests that are not requests: each refused with its reason. */
TEST(state_donor_refusals) {
    uint8_t *blob = make_blob(5000, 7);
    donor empty, behind;
    peer me;
    CHECK(peer_open(&me, 1) == 0);
    memset(&empty, 0, sizeof empty), memset(&behind, 0, sizeof behind);
    CHECK(peer_open(&empty.p, 0) == 0);
    empty.server = visc_state_server_start(empty.p.node, no_snapshot, NULL);
    CHECK(empty.server != NULL);
    CHECK(donor_start(&behind, honest(blob, 5000, 6)) == 0);
    if (!empty.server || !behind.server) return;
    uint8_t h[32];
    memset(h, 9, 32);
    visc_progress_record r[2] = {record(&empty.p, 2, h, addr_of(&empty)),
                                 /* it published epoch 7, serves 6 */
                                 record(&behind.p, 7, behind.state.claimed, addr_of(&behind))};
    visc_state_download_config cfg = config(1);
    cfg.require_corroboration = 0;
    download_fails(me.node, r, 1, &cfg, "refused: no state available");
    download_fails(me.node, r + 1, 1, &cfg, "refused: its state is older than requested");
    CHECK(wait_count(empty.server, visc_state_server_refused, 1));
    CHECK(wait_count(behind.server, visc_state_server_refused, 1));

    visc_state_refuse_reason why = 0;
    uint8_t req[VISC_STATE_REQUEST_BYTES];
    visc_state_request q = {.min_epoch = 0, .max_bytes = 1u << 20};
    visc_state_request_encode(&q, req);
    CHECK(refusal_for(&me, &behind, VISC_MSG_STATE_REQUEST, req, VISC_STATE_REQUEST_BYTES - 1,
                      &why) == 0 &&
          why == VISC_STATE_REFUSE_BAD_REQUEST);
    why = 0;
    CHECK(refusal_for(&me, &behind, VISC_MSG_STATE_CHUNK, req, VISC_STATE_REQUEST_BYTES, &why) ==
              0 &&
          why == VISC_STATE_REFUSE_BAD_REQUEST);
    CHECK(strcmp(visc_state_refuse_name(why), "bad request") == 0);
    CHECK(strcmp(visc_state_refuse_name((visc_state_refuse_reason)99), "unknown reason") == 0);
    CHECK(wait_count(behind.server, visc_state_server_refused, 3));
    CHECK(visc_state_server_served(behind.server) == 0);

    /* arguments */
    CHECK(visc_state_server_start(NULL, snapshot, NULL) == NULL);
    CHECK(visc_state_server_start(me.node, NULL, NULL) == NULL);
    uint8_t *out = NULL;
    size_t size;
    uint64_t epoch;
    CHECK(visc_state_download(NULL, r, 1, &cfg, &out, &size, &epoch, h) == -1);
    CHECK(visc_state_download(me.node, NULL, 1, &cfg, &out, &size, &epoch, h) == -1);
    CHECK(visc_state_download(me.node, r, -1, &cfg, &out, &size, &epoch, h) == -1);
    cfg.max_bytes = 0;
    CHECK(visc_state_download(me.node, r, 1, &cfg, &out, &size, &epoch, h) == -1);
    CHECK(out == NULL);
    peer_close(&me);
    donor_stop(&empty);
    donor_stop(&behind);
    free(blob);
}

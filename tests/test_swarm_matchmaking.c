/* test_swarm_matchmaking.c: the swarm node (dispatch of incoming channels by
 * purpose and tag, expiry, caps, timeouts) and matchmaking among several
 * peers in this process (threads on 127.0.0.1, one DHT between them): one
 * group when the target is everyone, several groups or a reported leftover,
 * schema hashes, clients, hostile JOINs and a leader that dies. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <sodium.h>

#include "../src/swarm/matchmaking.h"
#include "../src/swarm/wire.h"
#include "swarm_join.h"
#include "test.h"
#include "visc/core.h"

static const char secret[] = "matchmaking test secret, 32+ bytes long";

typedef struct {
    visc_identity id;
    visc_swarm_auth auth;
    visc_swarm_node *node;
} peer;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* dht: -1 for none; bootstrap: DHT port of a live peer (0: first). */
static int peer_open(peer *p, int client, int dht, int bootstrap) {
    memset(p, 0, sizeof *p);
    if (visc_identity_generate(&p->id) != 0) return -1;
    if (visc_swarm_auth_init(&p->auth, "mm-test", &p->id) != 0) return -1;
    if (visc_swarm_auth_set_secret(&p->auth, secret, sizeof secret) != 0) return -1;
    char peers[64];
    snprintf(peers, sizeof peers, "127.0.0.1:%d", bootstrap);
    visc_swarm_node_config c = {.listen = client ? NULL : "127.0.0.1:0",
                                .dht_port = dht,
                                .initial_peers = bootstrap ? peers : NULL,
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

static const uint8_t *key_of(const peer *p) { return p->id.public_key; }

/* ---- node ---- */

static void tag_of(int i, uint8_t tag[16]) {
    memset(tag, 0, 16);
    tag[0] = (uint8_t)i;
}

/* Waits (bounded) until the node has `want` channels queued. */
static int wait_pending(visc_swarm_node *n, int want, double timeout) {
    double until = visc_now() + timeout;
    while (visc_swarm_node_pending(n) != want && visc_now() < until) sleep_s(0.01);
    return visc_swarm_node_pending(n);
}

/* 1 when the channel ends (EOF or error, not a timeout) within timeout. */
static int chan_ended(visc_chan *c, double timeout) {
    uint8_t type, buf[16];
    size_t n;
    double t0 = visc_now();
    int rc = visc_chan_recv(c, &type, buf, sizeof buf, &n, t0 + timeout);
    return rc != 0 && visc_now() - t0 < timeout * 0.9;
}

TEST(node_open_frame_parse) {
    uint8_t tag[16], msg[VISC_OPEN_BYTES], got[16];
    tag_of(7, tag);
    visc_open_encode(VISC_PURPOSE_ALLREDUCE, tag, msg);
    visc_purpose p;
    CHECK(visc_open_parse(msg, sizeof msg, &p, got) == 0);
    CHECK(p == VISC_PURPOSE_ALLREDUCE && memcmp(got, tag, 16) == 0);
    CHECK(visc_open_parse(msg, sizeof msg - 1, &p, got) != 0);
    msg[0] = 0;
    CHECK(visc_open_parse(msg, sizeof msg, &p, got) != 0);
    msg[0] = 4;
    CHECK(visc_open_parse(msg, sizeof msg, &p, got) != 0);
}

TEST(node_dispatch_by_purpose_tag_and_key) {
    peer a, b, c;
    CHECK(peer_open(&a, 0, -1, 0) == 0);
    CHECK(peer_open(&b, 1, -1, 0) == 0);
    CHECK(peer_open(&c, 1, -1, 0) == 0);
    if (!a.node || !b.node || !c.node) return;
    CHECK(strncmp(visc_swarm_node_address(a.node), "127.0.0.1:", 10) == 0);
    CHECK(visc_swarm_node_address(b.node)[0] == '\0');
    CHECK(visc_swarm_node_dht(a.node) == NULL);
    const char *addr = visc_swarm_node_address(a.node);
    double dl = visc_now() + 5;
    uint8_t t1[16], t2[16];
    tag_of(1, t1);
    tag_of(2, t2);
    /* b: ALLREDUCE t1 and JOIN t2; c: ALLREDUCE t1; each says who it is */
    visc_chan *b1 =
        visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_ALLREDUCE, t1, key_of(&a), dl);
    visc_chan *b2 = visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_JOIN, t2, NULL, dl);
    visc_chan *c1 = visc_swarm_node_connect(c.node, addr, VISC_PURPOSE_ALLREDUCE, t1, NULL, dl);
    CHECK(b1 && b2 && c1);
    if (!b1 || !b2 || !c1) return;
    CHECK(visc_chan_send(b1, 99, "b1", 2, dl) == 0);
    CHECK(visc_chan_send(b2, 99, "b2", 2, dl) == 0);
    CHECK(visc_chan_send(c1, 99, "c1", 2, dl) == 0);
    /* the wrong key is refused at connect */
    CHECK(visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_JOIN, t2, key_of(&c), dl) == NULL);

    struct {
        visc_purpose purpose;
        const uint8_t *tag, *key;
        const char *want;
    } cases[] = {{VISC_PURPOSE_ALLREDUCE, t1, key_of(&c), "c1"},
                 {VISC_PURPOSE_JOIN, t2, NULL, "b2"},
                 {VISC_PURPOSE_ALLREDUCE, t1, NULL, "b1"}};
    for (int i = 0; i < 3; i++) {
        visc_chan *got = visc_swarm_node_take(a.node, cases[i].purpose, cases[i].tag, cases[i].key,
                                              visc_now() + 5);
        CHECK(got != NULL);
        if (!got) continue;
        uint8_t type, buf[8];
        size_t n = 0;
        CHECK(visc_chan_recv(got, &type, buf, sizeof buf, &n, visc_now() + 5) == 0);
        CHECK(type == 99 && n == 2 && memcmp(buf, cases[i].want, 2) == 0);
        visc_chan_close(got);
    }
    /* nothing else is queued: a take for another purpose, tag or key times out */
    double t0 = visc_now();
    CHECK(visc_swarm_node_take(a.node, VISC_PURPOSE_STATE, t1, NULL, t0 + 0.3) == NULL);
    double took = visc_now() - t0;
    CHECK(took >= 0.29 && took < 2.0);
    CHECK(strstr(visc_last_error(), "timed out") != NULL);
    CHECK(visc_swarm_node_take(a.node, VISC_PURPOSE_JOIN, t1, NULL, visc_now() + 0.05) == NULL);
    CHECK(visc_swarm_node_pending(a.node) == 0);
    /* a client opens no listener: nobody can connect to it */
    CHECK(visc_swarm_node_connect(a.node, "", VISC_PURPOSE_JOIN, t1, NULL, dl) == NULL);
    visc_chan_close(b1);
    visc_chan_close(b2);
    visc_chan_close(c1);
    peer_close(&a);
    peer_close(&b);
    peer_close(&c);
}

static peer *open_limited(double unclaimed_s, int max_pending) {
    static peer p;
    memset(&p, 0, sizeof p);
    if (visc_identity_generate(&p.id) != 0) return NULL;
    visc_swarm_auth_init(&p.auth, "mm-test", &p.id);
    visc_swarm_auth_set_secret(&p.auth, secret, sizeof secret);
    visc_swarm_node_config c = {.listen = "127.0.0.1:0",
                                .dht_port = -1,
                                .auth = &p.auth,
                                .unclaimed_s = unclaimed_s,
                                .max_pending = max_pending};
    p.node = visc_swarm_node_open(&c);
    return p.node ? &p : NULL;
}

TEST(node_unclaimed_channels_expire) {
    peer *a = open_limited(0.3, 0), b;
    CHECK(a != NULL);
    CHECK(peer_open(&b, 1, -1, 0) == 0);
    if (!a || !b.node) return;
    uint8_t t[16];
    tag_of(3, t);
    visc_chan *c = visc_swarm_node_connect(b.node, visc_swarm_node_address(a->node),
                                           VISC_PURPOSE_STATE, t, NULL, visc_now() + 5);
    CHECK(c != NULL);
    if (!c) return;
    CHECK(wait_pending(a->node, 1, 5) == 1);
    /* nobody claims it: the node closes it, and the peer sees the end */
    CHECK(chan_ended(c, 5));
    CHECK(visc_swarm_node_pending(a->node) == 0);
    CHECK(visc_swarm_node_take(a->node, VISC_PURPOSE_STATE, t, NULL, visc_now() + 0.05) == NULL);
    visc_chan_close(c);
    peer_close(a);
    peer_close(&b);
}

/* Standing answers: a channel of an answered (purpose, tag) gets the
 * frame and is closed, whether it was queued before the answer or opens
 * after it; other tags still queue; the oldest answer gives way past
 * VISC_NODE_ANSWERS; a payload too large is refused. */
static int answered_with(visc_chan *c, const char *want) {
    uint8_t type = 0, buf[VISC_NODE_ANSWER_MAX_BYTES];
    size_t n = 0;
    int ok = c && visc_chan_recv(c, &type, buf, sizeof buf, &n, visc_now() + 5) == 0 &&
             type == 42 && n == strlen(want) && memcmp(buf, want, n) == 0 && chan_ended(c, 5);
    if (c) visc_chan_close(c);
    return ok;
}

TEST(node_standing_answers) {
    peer a, b;
    CHECK(peer_open(&a, 0, -1, 0) == 0 && peer_open(&b, 1, -1, 0) == 0);
    if (!a.node || !b.node) return;
    const char *addr = visc_swarm_node_address(a.node);
    uint8_t t[VISC_NODE_ANSWERS + 2][16];
    for (int i = 0; i < VISC_NODE_ANSWERS + 2; i++) tag_of(10 + i, t[i]);
    visc_chan *before =
        visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_JOIN, t[0], NULL, visc_now() + 5);
    CHECK(wait_pending(a.node, 1, 5) == 1);
    CHECK(visc_swarm_node_answer(a.node, VISC_PURPOSE_JOIN, t[0], 42, (const uint8_t *)"over", 4) ==
          0);
    CHECK(visc_swarm_node_pending(a.node) == 0);
    CHECK_MSG(answered_with(before, "over"), "the queued channel was not answered");
    CHECK_MSG(answered_with(visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_JOIN, t[0], NULL,
                                                    visc_now() + 5),
                            "over"),
              "a channel opened after the answer was not answered");
    /* another purpose with the same tag, and another tag, still queue */
    visc_chan *other =
        visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_STATE, t[0], NULL, visc_now() + 5);
    visc_chan *other_tag =
        visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_JOIN, t[1], NULL, visc_now() + 5);
    CHECK(wait_pending(a.node, 2, 5) == 2);
    visc_chan_close(other);
    visc_chan_close(other_tag);
    visc_chan *got = visc_swarm_node_take(a.node, VISC_PURPOSE_STATE, t[0], NULL, visc_now() + 5);
    CHECK(got != NULL);
    if (got) visc_chan_close(got);
    got = visc_swarm_node_take(a.node, VISC_PURPOSE_JOIN, t[1], NULL, visc_now() + 5);
    CHECK(got != NULL);
    if (got) visc_chan_close(got);
    /* VISC_NODE_ANSWERS newer answers: the first is gone, the newest kept */
    for (int i = 1; i <= VISC_NODE_ANSWERS; i++)
        CHECK(visc_swarm_node_answer(a.node, VISC_PURPOSE_JOIN, t[i + 1], 42,
                                     (const uint8_t *)"new", 3) == 0);
    visc_chan *forgotten =
        visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_JOIN, t[0], NULL, visc_now() + 5);
    CHECK_MSG(wait_pending(a.node, 1, 5) == 1, "the oldest answer was kept past the ring");
    visc_chan_close(forgotten);
    got = visc_swarm_node_take(a.node, VISC_PURPOSE_JOIN, t[0], NULL, visc_now() + 5);
    if (got) visc_chan_close(got);
    CHECK(answered_with(visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_JOIN,
                                                t[VISC_NODE_ANSWERS + 1], NULL, visc_now() + 5),
                        "new"));
    /* withdrawn: its channels queue again */
    visc_swarm_node_unanswer(a.node, VISC_PURPOSE_JOIN, t[VISC_NODE_ANSWERS + 1]);
    visc_chan *again = visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_JOIN,
                                               t[VISC_NODE_ANSWERS + 1], NULL, visc_now() + 5);
    CHECK_MSG(wait_pending(a.node, 1, 5) == 1, "a withdrawn answer still answered");
    visc_chan_close(again);
    got = visc_swarm_node_take(a.node, VISC_PURPOSE_JOIN, t[VISC_NODE_ANSWERS + 1], NULL,
                               visc_now() + 5);
    if (got) visc_chan_close(got);
    uint8_t big[VISC_NODE_ANSWER_MAX_BYTES + 1] = {0};
    CHECK(visc_swarm_node_answer(a.node, VISC_PURPOSE_JOIN, t[1], 42, big, sizeof big) == -1);
    CHECK(strstr(visc_last_error(), "standing answer") != NULL);
    peer_close(&a);
    peer_close(&b);
}

TEST(node_pending_cap_refuses_more) {
    peer *a = open_limited(0, 2), b;
    CHECK(a != NULL);
    CHECK(peer_open(&b, 1, -1, 0) == 0);
    if (!a || !b.node) return;
    uint8_t t[16];
    tag_of(4, t);
    visc_chan *c[3];
    for (int i = 0; i < 3; i++) {
        c[i] = visc_swarm_node_connect(b.node, visc_swarm_node_address(a->node), VISC_PURPOSE_JOIN,
                                       t, NULL, visc_now() + 5);
        CHECK(c[i] != NULL);
        if (!c[i]) return;
    }
    CHECK(wait_pending(a->node, 2, 5) == 2);
    /* exactly one of the three was refused (closed); two stay queued */
    int ended = 0;
    for (int i = 0; i < 3; i++) ended += chan_ended(c[i], 0.5);
    CHECK(ended == 1);
    CHECK(visc_swarm_node_pending(a->node) == 2);
    for (int i = 0; i < 3; i++) visc_chan_close(c[i]);
    peer_close(a);
    peer_close(&b);
}

/* A raw TCP connection that never handshakes holds one worker, not the
 * node; a bad OPEN is dropped; close() does not wait for handshakes. */
TEST(node_hostile_connections) {
    peer a, b;
    CHECK(peer_open(&a, 0, -1, 0) == 0);
    CHECK(peer_open(&b, 1, -1, 0) == 0);
    if (!a.node || !b.node) return;
    const char *addr = visc_swarm_node_address(a.node);
    int port = atoi(strchr(addr, ':') + 1);
    int raw[3];
    for (int i = 0; i < 3; i++) {
        raw[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        CHECK(connect(raw[i], (struct sockaddr *)&sa, sizeof sa) == 0);
    }
    uint8_t t[16];
    tag_of(5, t);
    double t0 = visc_now();
    visc_chan *c = visc_swarm_node_connect(b.node, addr, VISC_PURPOSE_ALLREDUCE, t, NULL, t0 + 5);
    CHECK(c != NULL);
    visc_chan *got = visc_swarm_node_take(a.node, VISC_PURPOSE_ALLREDUCE, t, NULL, t0 + 5);
    CHECK(got != NULL);
    CHECK(visc_now() - t0 < 2.0); /* not behind the silent connections' deadline */
    visc_chan_close(got);
    visc_chan_close(c);
    /* a channel whose first frame is not a valid OPEN is never queued */
    visc_chan *bad = visc_chan_connect(addr, &b.auth, visc_now() + 5);
    CHECK(bad != NULL);
    if (bad) {
        uint8_t open[VISC_OPEN_BYTES + 1] = {VISC_PURPOSE_JOIN};
        CHECK(visc_chan_send(bad, VISC_MSG_OPEN, open, sizeof open, visc_now() + 5) == 0);
        CHECK(chan_ended(bad, 5));
        visc_chan_close(bad);
    }
    CHECK(visc_swarm_node_pending(a.node) == 0);
    t0 = visc_now();
    peer_close(&a);
    CHECK(visc_now() - t0 < 2.0);
    for (int i = 0; i < 3; i++) close(raw[i]);
    peer_close(&b);
}

/* A thread blocked in take() is released by close(). */
static void *take_forever(void *arg) {
    uint8_t t[16];
    tag_of(6, t);
    return visc_swarm_node_take(arg, VISC_PURPOSE_STATE, t, NULL, visc_now() + 30);
}

TEST(node_close_releases_takers) {
    peer a;
    CHECK(peer_open(&a, 0, -1, 0) == 0);
    if (!a.node) return;
    pthread_t th;
    pthread_create(&th, NULL, take_forever, a.node);
    sleep_s(0.1);
    double t0 = visc_now();
    visc_swarm_node_close(a.node);
    void *r = (void *)1;
    pthread_join(th, &r);
    CHECK(r == NULL);
    CHECK(visc_now() - t0 < 2.0);
    visc_swarm_auth_free(&a.auth);
}

/* ---- wire messages ---- */

static visc_group sample_group(const uint8_t k[3][32]) {
    visc_group g;
    memset(&g, 0, sizeof g);
    memset(g.id, 0xab, 16);
    g.size = 3;
    for (int i = 0; i < 3; i++) {
        memcpy(g.members[i].key, k[i], 32);
        g.members[i].bandwidth = 1e6 * (i + 1);
        snprintf(g.members[i].addr, sizeof g.members[i].addr, "127.0.0.1:%d", 4000 + i);
    }
    g.members[2].client = 1;
    g.members[2].addr[0] = '\0';
    return g;
}

TEST(mm_group_message_strict) {
    uint8_t k[3][32], schema[32], other[32];
    for (int i = 0; i < 3; i++) memset(k[i], i + 1, 32);
    memset(schema, 5, 32);
    memset(other, 6, 32);
    visc_group g = sample_group(k), got;
    static uint8_t msg[VISC_MM_GROUP_MAX_BYTES];
    int n = visc_mm_group_encode(&g, 9, schema, msg, sizeof msg);
    CHECK(n > 0);
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[2], k[0], &got) == 0);
    CHECK(got.size == 3 && got.self == 2 && memcmp(got.id, g.id, 16) == 0);
    CHECK(got.members[2].client == 1 && got.members[2].addr[0] == '\0');
    CHECK(strcmp(got.members[1].addr, "127.0.0.1:4001") == 0);
    CHECK(got.members[1].bandwidth == 2e6);
    /* receiver, leader, round and schema must match */
    uint8_t stranger[32];
    memset(stranger, 9, 32);
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, stranger, k[0], &got) != 0);
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], stranger, &got) != 0);
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], k[2], &got) != 0); /* client */
    CHECK(visc_mm_group_parse(msg, (size_t)n, 8, schema, k[0], k[1], &got) != 0);
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, other, k[0], k[1], &got) != 0);
    /* truncated, trailing bytes */
    CHECK(visc_mm_group_parse(msg, (size_t)n - 1, 9, schema, k[0], k[1], &got) != 0);
    msg[n] = 0;
    CHECK(visc_mm_group_parse(msg, (size_t)n + 1, 9, schema, k[0], k[1], &got) != 0);
    /* a member twice */
    visc_group dup = g;
    memcpy(dup.members[1].key, k[0], 32);
    n = visc_mm_group_encode(&dup, 9, schema, msg, sizeof msg);
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], k[0], &got) != 0);
    /* a group of one; a count byte above the maximum */
    visc_group one = g;
    one.size = 1;
    CHECK(visc_mm_group_encode(&one, 9, schema, msg, sizeof msg) < 0);
    n = visc_mm_group_encode(&g, 9, schema, msg, sizeof msg);
    msg[57] = 1;
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], k[0], &got) != 0);
    msg[57] = VISC_GROUP_MAX + 1;
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], k[0], &got) != 0);
    msg[57] = 3;
    /* a NUL or a space inside an address; an address length past the end */
    size_t addr0 = 58 + 32 + 8 + 1 + 1;
    msg[addr0 + 3] = '\0';
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], k[0], &got) != 0);
    msg[addr0 + 3] = ' ';
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], k[0], &got) != 0);
    msg[addr0 + 3] = '.';
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], k[0], &got) == 0);
    msg[addr0 - 1] = 200;
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], k[0], &got) != 0);
    msg[addr0 - 1] = 14;
    /* a non-finite bandwidth */
    visc_put_f64(msg + 58 + 32, 0.0 / 0.0);
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[0], k[0], &got) != 0);
    /* an auxiliary member (role 2) travels; a group needs 2 members that
     * train; a client is never an auxiliary */
    visc_group aux = g;
    aux.members[1].auxiliary = 1;
    n = visc_mm_group_encode(&aux, 9, schema, msg, sizeof msg);
    CHECK(n > 0 && msg[58 + 32 + 8 + 1 + 1 + 14 + 32 + 8] == 2); /* member 1's role */
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[1], k[0], &got) == 0);
    CHECK(got.members[1].auxiliary == 1 && got.members[0].auxiliary == 0 && got.self == 1);
    CHECK(got.members[2].client == 1 && got.members[2].auxiliary == 0);
    aux.members[0].auxiliary = 1;
    n = visc_mm_group_encode(&aux, 9, schema, msg, sizeof msg);
    CHECK(n > 0 && visc_mm_group_parse(msg, (size_t)n, 9, schema, k[1], k[0], &got) != 0);
    CHECK(strstr(visc_last_error(), "training members") != NULL);
    /* a newcomer (role 3) travels, and does not count among the 2 that
     * train either */
    aux.members[0].auxiliary = 0, aux.members[0].newcomer = 1;
    n = visc_mm_group_encode(&aux, 9, schema, msg, sizeof msg);
    CHECK(n > 0 && msg[58 + 32 + 8] == 3); /* member 0's role */
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[1], k[0], &got) != 0);
    CHECK(strstr(visc_last_error(), "training members") != NULL);
    aux.members[1].auxiliary = 0;
    n = visc_mm_group_encode(&aux, 9, schema, msg, sizeof msg);
    CHECK(n > 0 && visc_mm_group_parse(msg, (size_t)n, 9, schema, k[1], k[0], &got) == 0);
    CHECK(got.members[0].newcomer == 1 && got.members[0].auxiliary == 0 &&
          got.members[1].newcomer == 0 && got.members[2].newcomer == 0);
    msg[58 + 32 + 8] = 4; /* no such role */
    CHECK(visc_mm_group_parse(msg, (size_t)n, 9, schema, k[1], k[0], &got) != 0);
    aux.members[0].newcomer = 0;
    aux.members[2].auxiliary = 1; /* and a client */
    CHECK(visc_mm_group_encode(&aux, 9, schema, msg, sizeof msg) < 0);
    aux.members[2].auxiliary = 0, aux.members[2].newcomer = 1; /* a client newcomer */
    CHECK(visc_mm_group_encode(&aux, 9, schema, msg, sizeof msg) < 0);
}

TEST(mm_info_and_reject_messages_strict) {
    visc_mm_info in = {.round = 3, .expires_ms = 123456, .bandwidth = 5e6, .client = 0}, out;
    memset(in.schema_hash, 7, 32);
    snprintf(in.addr, sizeof in.addr, "10.0.0.1:5000");
    uint8_t msg[VISC_MM_INFO_MAX_BYTES + 8];
    int n = visc_mm_info_encode(&in, msg, sizeof msg);
    CHECK(n == 59 + 13);
    CHECK(visc_mm_info_parse(msg, (size_t)n, &out) == 0);
    CHECK(out.round == 3 && out.expires_ms == 123456 && out.bandwidth == 5e6);
    CHECK(strcmp(out.addr, in.addr) == 0 && out.client == 0);
    CHECK(visc_mm_info_parse(msg, (size_t)n - 1, &out) != 0);
    CHECK(visc_mm_info_parse(msg, (size_t)n + 1, &out) != 0);
    msg[25] = 2; /* role: an auxiliary (it has an address: it reduces) */
    CHECK(visc_mm_info_parse(msg, (size_t)n, &out) == 0 && out.auxiliary == 1 && out.client == 0);
    uint8_t again[VISC_MM_INFO_MAX_BYTES];
    CHECK(visc_mm_info_encode(&out, again, sizeof again) == n &&
          memcmp(again, msg, (size_t)n) == 0);
    msg[25] = 3; /* a newcomer (it reduces too) */
    CHECK(visc_mm_info_parse(msg, (size_t)n, &out) == 0 && out.newcomer == 1 &&
          out.auxiliary == 0 && out.client == 0);
    CHECK(visc_mm_info_encode(&out, again, sizeof again) == n &&
          memcmp(again, msg, (size_t)n) == 0);
    out.auxiliary = 1; /* not both */
    CHECK(visc_mm_info_encode(&out, again, sizeof again) < 0);
    msg[25] = 4; /* no such role */
    CHECK(visc_mm_info_parse(msg, (size_t)n, &out) != 0);
    msg[25] = 1; /* a client with an address */
    CHECK(visc_mm_info_parse(msg, (size_t)n, &out) != 0);
    msg[25] = 0;
    msg[0] = 2;
    CHECK(visc_mm_info_parse(msg, (size_t)n, &out) != 0);
    msg[0] = 1;
    visc_put_f64(msg + 17, -1.0);
    CHECK(visc_mm_info_parse(msg, (size_t)n, &out) != 0);
    visc_put_f64(msg + 17, 1.0 / 0.0);
    CHECK(visc_mm_info_parse(msg, (size_t)n, &out) != 0);
    /* a full peer without an address cannot be encoded */
    in.addr[0] = '\0';
    CHECK(visc_mm_info_encode(&in, msg, sizeof msg) < 0);

    visc_mm_reject_reason why;
    uint8_t r[3] = {1, VISC_MM_REJECT_SCHEMA, 0};
    CHECK(visc_mm_reject_parse(r, 2, &why) == 0 && why == VISC_MM_REJECT_SCHEMA);
    CHECK(visc_mm_reject_parse(r, 3, &why) != 0);
    r[1] = 0;
    CHECK(visc_mm_reject_parse(r, 2, &why) != 0);
    r[1] = VISC_MM_REJECT_EXCLUDED;
    CHECK(visc_mm_reject_parse(r, 2, &why) == 0 && why == VISC_MM_REJECT_EXCLUDED);
    r[1] = VISC_MM_REJECT_LAST + 1;
    CHECK(visc_mm_reject_parse(r, 2, &why) != 0);
    r[1] = 99;
    CHECK(visc_mm_reject_parse(r, 2, &why) != 0);
}

/* ---- matchmaking among peers of one DHT ---- */

#define N_FULL 7
#define N_CLIENT 2
static peer swarm[N_FULL + N_CLIENT];
static int swarm_ready = -1;

/* Opens the test swarm once: full peers 0..N_FULL-1, then the clients. */
static int swarm_up(void) {
    if (swarm_ready >= 0) return swarm_ready;
    swarm_ready = 0;
    if (peer_open(&swarm[0], 0, 0, 0) != 0) return 0;
    int port = visc_dht_port(visc_swarm_node_dht(swarm[0].node));
    for (int i = 1; i < N_FULL + N_CLIENT; i++)
        if (peer_open(&swarm[i], i >= N_FULL, 0, port) != 0) return 0;
    visc_dht *d[N_FULL + N_CLIENT];
    for (int i = 0; i < N_FULL + N_CLIENT; i++) d[i] = visc_swarm_node_dht(swarm[i].node);
    if (swarm_await_joined(d, 0, N_FULL + N_CLIENT, 30) != 0) return 0;
    swarm_ready = 1;
    return 1;
}

typedef struct {
    peer *p;
    visc_matchmaking_config cfg;
    double start_delay;
    visc_group g;
    int rc;
    double took;
    char err[256];
} job;

static void *run_job(void *arg) {
    job *j = arg;
    if (j->start_delay > 0) sleep_s(j->start_delay);
    double t0 = visc_now();
    j->rc = visc_matchmake(j->p->node, &j->cfg, &j->g);
    j->took = visc_now() - t0;
    snprintf(j->err, sizeof j->err, "%s", j->rc ? visc_last_error() : "");
    return NULL;
}

static uint64_t next_round = 1000;

/* Runs visc_matchmake on peers idx[0..n-1] at once; expected: each
 * one's expected_group_size (NULL: 0, the target). */
static void run_round_expecting(job *jobs, const int *idx, int n, int target, double T,
                                const uint8_t *schemas /* n * 32 or NULL */, const int *expected) {
    pthread_t th[N_FULL + N_CLIENT + 1];
    uint64_t round = next_round++;
    for (int i = 0; i < n; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].p = &swarm[idx[i]];
        jobs[i].cfg = (visc_matchmaking_config){.round = round,
                                                .target_group_size = target,
                                                .min_group_size = 2,
                                                .matchmaking_time_s = T};
        memset(jobs[i].cfg.schema_hash, 0x5c, 32);
        if (schemas) memcpy(jobs[i].cfg.schema_hash, schemas + 32 * i, 32);
        if (expected) jobs[i].cfg.expected_group_size = expected[i];
    }
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, run_job, &jobs[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void run_round(job *jobs, const int *idx, int n, int target, double T,
                      const uint8_t *schemas /* n * 32 or NULL */) {
    run_round_expecting(jobs, idx, n, target, T, schemas, NULL);
}

static int in_group(const visc_group *g, const uint8_t *key) {
    int found = 0;
    for (int i = 0; i < g->size; i++) found += memcmp(g->members[i].key, key, 32) == 0;
    return found;
}

/* Every peer that got a group is its `self`, and every member of a group
 * got the identical group (id, size, order, addresses). Returns the number
 * of distinct groups. */
static int check_consistent(const job *jobs, int n) {
    int groups = 0;
    for (int i = 0; i < n; i++) {
        if (jobs[i].rc != 0) continue;
        const visc_group *g = &jobs[i].g;
        CHECK(g->size >= 2 && g->size <= jobs[i].cfg.target_group_size);
        CHECK(g->self >= 0 && g->self < g->size &&
              memcmp(g->members[g->self].key, key_of(jobs[i].p), 32) == 0);
        CHECK(in_group(g, key_of(jobs[i].p)) == 1);
        int first = 1;
        for (int k = 0; k < i; k++)
            if (jobs[k].rc == 0 && memcmp(jobs[k].g.id, g->id, 16) == 0) first = 0;
        groups += first;
        for (int m = 0; m < g->size; m++) {
            int seen = 0;
            for (int k = 0; k < n; k++) {
                if (memcmp(key_of(jobs[k].p), g->members[m].key, 32) != 0) continue;
                seen = 1;
                CHECK_MSG(jobs[k].rc == 0 && memcmp(jobs[k].g.id, g->id, 16) == 0,
                          "member %d of a group did not get it (%s)", m, jobs[k].err);
                CHECK(jobs[k].g.size == g->size);
                for (int q = 0; q < g->size && q < jobs[k].g.size; q++) {
                    CHECK(memcmp(jobs[k].g.members[q].key, g->members[q].key, 32) == 0);
                    CHECK(strcmp(jobs[k].g.members[q].addr, g->members[q].addr) == 0);
                    CHECK(jobs[k].g.members[q].client == g->members[q].client);
                }
            }
            CHECK_MSG(seen, "a group lists a peer that did not take part");
        }
    }
    return groups;
}

TEST(mm_all_peers_form_one_group) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    for (int n = 2; n <= 6; n++) {
        job jobs[6];
        int idx[6] = {0, 1, 2, 3, 4, 5};
        run_round(jobs, idx, n, n, 3.0, NULL);
        for (int i = 0; i < n; i++) {
            CHECK_MSG(jobs[i].rc == 0, "n=%d peer %d: %s", n, i, jobs[i].err);
            CHECK(jobs[i].took < 3.5);
            CHECK(jobs[i].g.size == n);
            for (int m = 0; m < jobs[i].g.size; m++) {
                CHECK(jobs[i].g.members[m].client == 0);
                CHECK(strcmp(jobs[i].g.members[m].addr,
                             visc_swarm_node_address(swarm[idx[0]].node)) == 0 ||
                      jobs[i].g.members[m].addr[0] != '\0');
            }
        }
        CHECK(check_consistent(jobs, n) == 1);
    }
}

/* A round whose whole group is there starts as soon as the declarations
 * are seen, not after the settling time (a fifth of the matchmaking time,
 * here 3 s): four peers, target 4, 15 s to match. */
TEST(mm_full_group_does_not_wait_out_the_settling_time) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    int idx[4] = {0, 1, 2, 3};
    job jobs[4];
    run_round(jobs, idx, 4, 4, 15.0, NULL);
    for (int i = 0; i < 4; i++) {
        CHECK_MSG(jobs[i].rc == 0, "peer %d: %s", i, jobs[i].err);
        CHECK_MSG(jobs[i].took < 2.5, "peer %d took %.2f s (settling alone: 3 s)", i, jobs[i].took);
    }
    CHECK(check_consistent(jobs, 4) == 1);
}

TEST(mm_five_peers_in_groups_of_two_or_three) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    int idx[5] = {0, 1, 2, 3, 4};
    job jobs[5];
    /* target 2: two groups of two and one peer told "no group" */
    run_round(jobs, idx, 5, 2, 3.0, NULL);
    int failed = 0;
    for (int i = 0; i < 5; i++) {
        CHECK(jobs[i].took < 3.5);
        if (jobs[i].rc != 0) {
            failed++;
            CHECK_MSG(strstr(jobs[i].err, "no group") != NULL, "%s", jobs[i].err);
        }
    }
    CHECK(failed == 1);
    CHECK(check_consistent(jobs, 5) == 2);
    /* target 3: a group of three and one of two, nobody left over */
    run_round(jobs, idx, 5, 3, 3.0, NULL);
    for (int i = 0; i < 5; i++) CHECK_MSG(jobs[i].rc == 0, "peer %d: %s", i, jobs[i].err);
    CHECK(check_consistent(jobs, 5) == 2);
}

/* The deal is the shared target's (16), whatever each peer expects: three
 * peers, one of which counted only two at its step (a progress view read
 * before the third published it), form one group of three. With the
 * expected count as the target, that peer dealt the three declarations
 * into two groups and the others into one: the round split. Each peer in
 * turn is the one that undercounts. */
TEST(mm_expected_count_never_splits_the_deal) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    int idx[3] = {0, 1, 2};
    for (int stale = 0; stale < 3; stale++) {
        job jobs[3];
        int expected[3] = {3, 3, 3};
        expected[stale] = 2;
        run_round_expecting(jobs, idx, 3, 16, 3.0, NULL, expected);
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(jobs[i].rc == 0, "stale %d, peer %d: %s", stale, i, jobs[i].err);
            CHECK(jobs[i].g.size == 3);
            CHECK_MSG(jobs[i].took < 2.0, "peer %d took %.2f s (the window: 3 s)", i, jobs[i].took);
        }
        CHECK(check_consistent(jobs, 3) == 1);
    }
}

/* Peers 0 and 1 form the group of a round (4 s to match); then peer
 * late_peer comes to the same round and schema, both declarations live. */
static void come_late_to_formed_round(job *late, int late_peer) {
    int idx[2] = {0, 1};
    job jobs[2];
    run_round(jobs, idx, 2, 2, 4.0, NULL);
    for (int i = 0; i < 2; i++) CHECK_MSG(jobs[i].rc == 0, "peer %d: %s", i, jobs[i].err);
    memset(late, 0, sizeof *late);
    late->p = &swarm[late_peer];
    late->cfg = jobs[0].cfg;
    run_job(late);
}

/* A peer that comes to a round after its group formed learns it from the
 * leader at once (REJECT FORMED, node.h's standing answer) and gives up
 * (VISC_MM_MISSED), instead of following until the leader's declaration
 * expires and then leading alone until its own deadline: a whole
 * matchmaking time (here 4 s) during which the swarm stepped on. */
TEST(mm_late_peer_learns_the_round_formed) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    job late;
    come_late_to_formed_round(&late, 2);
    CHECK_MSG(late.rc == VISC_MM_MISSED, "rc %d: %s", late.rc, late.err);
    CHECK_MSG(strstr(late.err, "formed without this peer") != NULL, "%s", late.err);
    CHECK_MSG(late.took < 2.0, "took %.2f s (the window: 4 s)", late.took);
}

/* Two peers late for a round at the same state: the first learns from the
 * group's leader that the round formed (MISSED), and answers the round's
 * JOINs so too; the second, which sees only the first's declaration (it
 * excludes the group's members here, as a view that lost their
 * declarations, or held them no longer), follows it and gives up at once.
 * Told NOT_LEADING instead, it led alone until its deadline (4 s) while
 * the swarm stepped on (seen in e2e_swarm_churn.sh: a newcomer that had
 * just taken the state followed another peer late for the same round). */
TEST(mm_late_peer_learns_the_round_formed_from_another_late_peer) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    job first, second;
    come_late_to_formed_round(&first, 2);
    CHECK_MSG(first.rc == VISC_MM_MISSED, "rc %d: %s", first.rc, first.err);
    uint8_t group[2][VISC_KEY_BYTES];
    memcpy(group[0], key_of(&swarm[0]), VISC_KEY_BYTES);
    memcpy(group[1], key_of(&swarm[1]), VISC_KEY_BYTES);
    memset(&second, 0, sizeof second);
    second.p = &swarm[3];
    second.cfg = first.cfg;
    second.cfg.excluded = (const uint8_t(*)[VISC_KEY_BYTES])group;
    second.cfg.n_excluded = 2;
    run_job(&second);
    CHECK_MSG(second.rc == VISC_MM_MISSED, "rc %d: %s", second.rc, second.err);
    CHECK_MSG(strstr(second.err, "formed without this peer") != NULL, "%s", second.err);
    CHECK_MSG(second.took < 2.0, "took %.2f s (the window: 4 s)", second.took);
}

TEST(mm_other_schema_is_not_grouped) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    int idx[4] = {0, 1, 2, 3};
    uint8_t schemas[4 * 32];
    memset(schemas, 0x11, sizeof schemas);
    memset(schemas + 3 * 32, 0x22, 32);
    job jobs[4];
    run_round(jobs, idx, 4, 4, 3.0, schemas);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(jobs[i].rc == 0, "peer %d: %s", i, jobs[i].err);
        CHECK(jobs[i].g.size == 3);
        CHECK(in_group(&jobs[i].g, key_of(&swarm[3])) == 0);
    }
    CHECK(jobs[3].rc != 0 && strstr(jobs[3].err, "no group") != NULL);
    CHECK(jobs[3].took < 3.5);
    CHECK(check_consistent(jobs, 3) == 1);
}

/* Peers 0-2 exclude peer 3 (a member that sent them invalid data): they
 * form one group of three without it, whoever would have led, and peer 3,
 * which excludes nobody, gets no group. Then only peer 0 excludes peer 3:
 * peer 3 is never in peer 0's group. */
TEST(mm_excluded_peer_is_not_grouped) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    int idx[4] = {0, 1, 2, 3};
    uint8_t banned[1][VISC_KEY_BYTES];
    memcpy(banned[0], key_of(&swarm[3]), VISC_KEY_BYTES);
    job jobs[4];
    for (int rep = 0; rep < 3; rep++) { /* peer 3 leads, joins, or comes late */
        pthread_t th[4];
        memset(jobs, 0, sizeof jobs);
        uint64_t round = next_round++;
        for (int i = 0; i < 4; i++) {
            jobs[i].p = &swarm[idx[i]];
            jobs[i].cfg = (visc_matchmaking_config){.round = round,
                                                    .target_group_size = 4,
                                                    .min_group_size = 2,
                                                    .matchmaking_time_s = 3.0};
            memset(jobs[i].cfg.schema_hash, 0x5c, 32);
            if (i < 3) jobs[i].cfg.excluded = banned, jobs[i].cfg.n_excluded = 1;
        }
        jobs[3].start_delay = rep == 0 ? 0 : rep == 1 ? 0.05 : 0.5;
        /* rep 0: peer 3 first, so its declaration expires first (it would lead) */
        if (rep == 0)
            for (int i = 0; i < 3; i++) jobs[i].start_delay = 0.1;
        for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, run_job, &jobs[i]);
        for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(jobs[i].rc == 0, "rep %d peer %d: %s", rep, i, jobs[i].err);
            CHECK(jobs[i].g.size == 3);
            CHECK(in_group(&jobs[i].g, key_of(&swarm[3])) == 0);
        }
        CHECK_MSG(jobs[3].rc != 0 && strstr(jobs[3].err, "no group") != NULL, "rep %d: %s", rep,
                  jobs[3].err);
        CHECK(check_consistent(jobs, 3) == 1);
    }
    /* a bad list is refused */
    visc_matchmaking_config bad = {.round = next_round++,
                                   .target_group_size = 2,
                                   .min_group_size = 2,
                                   .matchmaking_time_s = 1.0,
                                   .n_excluded = 1};
    visc_group g;
    CHECK(visc_matchmake(swarm[0].node, &bad, &g) != 0);
}

TEST(mm_client_is_grouped_but_never_leads) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    /* the client starts first: its declaration expires first, so it would
     * lead if clients could */
    int idx[3] = {N_FULL, 0, 1};
    job jobs[3];
    pthread_t th[3];
    uint64_t round = next_round++;
    for (int i = 0; i < 3; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].p = &swarm[idx[i]];
        jobs[i].cfg = (visc_matchmaking_config){.round = round,
                                                .target_group_size = 3,
                                                .min_group_size = 2,
                                                .matchmaking_time_s = 3};
        jobs[i].start_delay = i ? 0.3 : 0;
    }
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, run_job, &jobs[i]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(jobs[i].rc == 0, "peer %d: %s", i, jobs[i].err);
        CHECK(jobs[i].g.size == 3);
    }
    CHECK(check_consistent(jobs, 3) == 1);
    const visc_group *g = &jobs[0].g;
    if (jobs[0].rc == 0) {
        CHECK(g->members[g->self].client == 1 && g->members[g->self].addr[0] == '\0');
        int clients = 0;
        for (int m = 0; m < g->size; m++) clients += g->members[m].client;
        CHECK(clients == 1);
    }
    /* clients alone: nobody can lead, both report it */
    int only[2] = {N_FULL, N_FULL + 1};
    run_round(jobs, only, 2, 2, 1.5, NULL);
    for (int i = 0; i < 2; i++) {
        CHECK(jobs[i].rc != 0 && strstr(jobs[i].err, "no group") != NULL);
        CHECK(jobs[i].took < 2.0);
    }
}

/* An auxiliary is grouped like a full peer (it counts toward the group
 * size and its role reaches every member); with one training peer there
 * is no group. */
TEST(mm_auxiliary_is_grouped_and_needs_two_trainers) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    job jobs[3];
    int idx[3] = {0, 1, 2};
    run_round(jobs, idx, 3, 3, 3, NULL); /* fills the configs; a plain round first */
    for (int i = 0; i < 3; i++) CHECK_MSG(jobs[i].rc == 0, "peer %d: %s", i, jobs[i].err);
    pthread_t th[3];
    uint64_t round = next_round++;
    for (int i = 0; i < 3; i++) {
        jobs[i].cfg.round = round;
        jobs[i].cfg.auxiliary = i == 0; /* it would lead: its declaration expires first */
        jobs[i].start_delay = i ? 0.3 : 0;
    }
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, run_job, &jobs[i]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++) CHECK_MSG(jobs[i].rc == 0, "peer %d: %s", i, jobs[i].err);
    CHECK(check_consistent(jobs, 3) == 1);
    if (jobs[1].rc == 0) {
        const visc_group *g = &jobs[1].g;
        int aux = 0;
        for (int m = 0; m < g->size; m++) {
            aux += g->members[m].auxiliary;
            if (g->members[m].auxiliary)
                CHECK(memcmp(g->members[m].key, key_of(&swarm[0]), VISC_KEY_BYTES) == 0);
        }
        CHECK(g->size == 3 && aux == 1);
    }
    /* an auxiliary and one training peer: no group for either */
    round = next_round++;
    for (int i = 0; i < 2; i++) {
        jobs[i].cfg.round = round, jobs[i].cfg.matchmaking_time_s = 1.5;
        jobs[i].cfg.target_group_size = jobs[i].cfg.min_group_size = 2;
        jobs[i].start_delay = 0;
    }
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, run_job, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        CHECK_MSG(jobs[i].rc != 0 && strstr(jobs[i].err, "no group") != NULL, "peer %d: %s", i,
                  jobs[i].err);
}

/* Sends one JOIN-purpose frame to a leader and returns the reply type and
 * payload (REJECT reason or GROUP bytes). */
static int hostile_join(peer *from, peer *leader, uint64_t round, uint8_t type,
                        const uint8_t *payload, size_t n, uint8_t *reply, size_t *reply_n) {
    uint8_t tag[16];
    visc_mm_join_tag(round, tag);
    visc_chan *c = visc_swarm_node_connect(from->node, visc_swarm_node_address(leader->node),
                                           VISC_PURPOSE_JOIN, tag, key_of(leader), visc_now() + 5);
    if (!c) return -1;
    uint8_t rtype = 0;
    int rc = visc_chan_send(c, type, payload, n, visc_now() + 5);
    if (rc == 0)
        rc = visc_chan_recv(c, &rtype, reply, VISC_MM_GROUP_MAX_BYTES, reply_n, visc_now() + 5);
    visc_chan_close(c);
    return rc == 0 ? rtype : -1;
}

typedef struct {
    peer *leader;
    job j;
} leader_job;

TEST(mm_leader_refuses_hostile_joins) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    peer *leader = &swarm[5], *h = &swarm[6];
    job lj;
    memset(&lj, 0, sizeof lj);
    lj.p = leader;
    uint64_t round = next_round++;
    lj.cfg = (visc_matchmaking_config){.round = round,
                                       .target_group_size = 2,
                                       .min_group_size = 2,
                                       .matchmaking_time_s = 5};
    memset(lj.cfg.schema_hash, 0x5c, 32);
    pthread_t th;
    pthread_create(&th, NULL, run_job, &lj);

    visc_mm_info info = {.round = round, .bandwidth = 1e6};
    info.expires_ms = visc_unix_ms() + 5000;
    memset(info.schema_hash, 0x5c, 32);
    snprintf(info.addr, sizeof info.addr, "%s", visc_swarm_node_address(h->node));
    static uint8_t msg[VISC_MM_INFO_MAX_BYTES + 1], reply[VISC_MM_GROUP_MAX_BYTES];
    size_t rn = 0;
    visc_mm_reject_reason why = 0;

    info.round = round + 1; /* wrong round */
    int n = visc_mm_info_encode(&info, msg, sizeof msg);
    CHECK(hostile_join(h, leader, round, VISC_MSG_JOIN, msg, (size_t)n, reply, &rn) ==
          VISC_MSG_REJECT);
    CHECK(visc_mm_reject_parse(reply, rn, &why) == 0 && why == VISC_MM_REJECT_ROUND);
    info.round = round;
    n = visc_mm_info_encode(&info, msg, sizeof msg);
    msg[n] = 0; /* one byte too many */
    CHECK(hostile_join(h, leader, round, VISC_MSG_JOIN, msg, (size_t)n + 1, reply, &rn) ==
          VISC_MSG_REJECT);
    CHECK(visc_mm_reject_parse(reply, rn, &why) == 0 && why == VISC_MM_REJECT_MALFORMED);
    CHECK(hostile_join(h, leader, round, VISC_MSG_GROUP, msg, (size_t)n, reply, &rn) ==
          VISC_MSG_REJECT);
    CHECK(visc_mm_reject_parse(reply, rn, &why) == 0 && why == VISC_MM_REJECT_MALFORMED);
    memset(info.schema_hash, 0x77, 32);
    n = visc_mm_info_encode(&info, msg, sizeof msg);
    CHECK(hostile_join(h, leader, round, VISC_MSG_JOIN, msg, (size_t)n, reply, &rn) ==
          VISC_MSG_REJECT);
    CHECK(visc_mm_reject_parse(reply, rn, &why) == 0 && why == VISC_MM_REJECT_SCHEMA);

    /* a correct JOIN gets the group, with both of us in it */
    memset(info.schema_hash, 0x5c, 32);
    n = visc_mm_info_encode(&info, msg, sizeof msg);
    CHECK(hostile_join(h, leader, round, VISC_MSG_JOIN, msg, (size_t)n, reply, &rn) ==
          VISC_MSG_GROUP);
    visc_group g;
    CHECK(visc_mm_group_parse(reply, rn, round, lj.cfg.schema_hash, key_of(h), key_of(leader),
                              &g) == 0);
    pthread_join(th, NULL);
    CHECK_MSG(lj.rc == 0, "%s", lj.err);
    CHECK(g.size == 2 && lj.g.size == 2 && memcmp(g.id, lj.g.id, 16) == 0);
    CHECK(memcmp(g.members[lj.g.self].key, key_of(leader), 32) == 0);
    CHECK(strcmp(g.members[g.self].addr, info.addr) == 0);
}

typedef struct {
    peer p;
    int port;
    uint64_t round;
    int taken;
} doomed_leader;

/* Declares itself with the earliest expiry, takes the JOINs of two
 * followers, then dies (its node closes) without sending GROUP. */
static void *doomed_leader_run(void *arg) {
    doomed_leader *d = arg;
    uint8_t tag[16];
    visc_mm_join_tag(d->round, tag);
    visc_chan *c[2] = {NULL, NULL};
    double until = visc_now() + 3;
    for (int i = 0; i < 2; i++) {
        c[i] = visc_swarm_node_take(d->p.node, VISC_PURPOSE_JOIN, tag, NULL, until);
        d->taken += c[i] != NULL;
    }
    for (int i = 0; i < 2; i++)
        if (c[i]) visc_chan_close(c[i]);
    visc_swarm_node_close(d->p.node);
    d->p.node = NULL;
    return NULL;
}

TEST(mm_leader_dies_before_group) {
    CHECK(swarm_up());
    if (swarm_ready != 1) return;
    static doomed_leader d;
    memset(&d, 0, sizeof d);
    int port = visc_dht_port(visc_swarm_node_dht(swarm[0].node));
    CHECK(peer_open(&d.p, 0, 0, port) == 0);
    if (!d.p.node) return;
    d.round = next_round++;
    visc_mm_info info = {.round = d.round, .bandwidth = 1e6};
    info.expires_ms = visc_unix_ms() + 2000; /* earlier than the followers' */
    memset(info.schema_hash, 0x5c, 32);
    snprintf(info.addr, sizeof info.addr, "%s", visc_swarm_node_address(d.p.node));
    uint8_t value[VISC_MM_INFO_MAX_BYTES];
    int n = visc_mm_info_encode(&info, value, sizeof value);
    char key[32];
    snprintf(key, sizeof key, "mm.%llu", (unsigned long long)d.round);
    CHECK(visc_dht_put(visc_swarm_node_dht(d.p.node), key, value, (size_t)n, 5, 3) == 0);

    pthread_t dt, th[2];
    pthread_create(&dt, NULL, doomed_leader_run, &d);
    job jobs[2];
    for (int i = 0; i < 2; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].p = &swarm[i];
        jobs[i].cfg = (visc_matchmaking_config){.round = d.round,
                                                .target_group_size = 3,
                                                .min_group_size = 2,
                                                .matchmaking_time_s = 4};
        memset(jobs[i].cfg.schema_hash, 0x5c, 32);
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_join(dt, NULL);
    CHECK(d.taken == 2); /* both followers did go to the doomed leader first */
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(jobs[i].rc == 0, "follower %d: %s", i, jobs[i].err);
        CHECK(jobs[i].took < 4.5);
        CHECK(jobs[i].g.size == 2);
        CHECK(in_group(&jobs[i].g, key_of(&d.p)) == 0);
    }
    CHECK(check_consistent(jobs, 2) == 1);
    visc_swarm_auth_free(&d.p.auth);
}

TEST(mm_bad_config_and_no_dht) {
    peer a;
    CHECK(peer_open(&a, 0, -1, 0) == 0);
    if (!a.node) return;
    visc_matchmaking_config c = {.round = 1,
                                 .target_group_size = 2,
                                 .min_group_size = 2,
                                 .matchmaking_time_s = 1};
    visc_group g;
    /* each refused for what is wrong with it (the node has no DHT: a
     * config that passed would be refused for that instead) */
#define REFUSED_FOR(what)                                                                          \
    do {                                                                                           \
        CHECK(visc_matchmake(a.node, &c, &g) == -1);                                               \
        CHECK_MSG(strstr(visc_last_error(), what) != NULL, "%s", visc_last_error());               \
    } while (0)
    REFUSED_FOR("needs the node's DHT");
    c.target_group_size = 1;
    REFUSED_FOR("target group size");
    c.target_group_size = VISC_GROUP_MAX + 1;
    REFUSED_FOR("target group size");
    c.target_group_size = 3;
    c.min_group_size = 4;
    REFUSED_FOR("min group size");
    c.min_group_size = 2;
    c.expected_group_size = 1;
    REFUSED_FOR("expected group size");
    c.expected_group_size = 4;
    REFUSED_FOR("expected group size");
    c.expected_group_size = 3;
    REFUSED_FOR("needs the node's DHT");
    c.matchmaking_time_s = 0.0 / 0.0;
    REFUSED_FOR("matchmaking time");
#undef REFUSED_FOR
    peer_close(&a);
}

/* Last (tests run in file order): closes the shared swarm. */
TEST(mm_zz_close_swarm) {
    if (swarm_ready != 1) return;
    for (int i = 0; i < N_FULL + N_CLIENT; i++)
        if (swarm[i].node) peer_close(&swarm[i]);
}

/* ---- hostile and unlucky rounds on small private setups (the shared
 * swarm is closed by now) ---- */

TEST(mm_info_parse_refuses_bad_sizes) {
    uint8_t msg[VISC_MM_INFO_MAX_BYTES + 1];
    memset(msg, 0, sizeof msg);
    msg[0] = 1;
    visc_mm_info out;
    CHECK(visc_mm_info_parse(msg, 58, &out) != 0 && strstr(visc_last_error(), "58 bytes"));
    CHECK(visc_mm_info_parse(msg, sizeof msg, &out) != 0);
}

/* A JOIN for round `round` from `from` to `leader`, expiring at
 * expires_ms, on a channel left open (NULL on failure). */
static visc_chan *join_open(peer *from, peer *leader, uint64_t round, uint64_t expires_ms) {
    uint8_t tag[16];
    visc_mm_join_tag(round, tag);
    visc_mm_info info = {.round = round, .bandwidth = 1e6, .expires_ms = expires_ms};
    memset(info.schema_hash, 0x5c, 32);
    snprintf(info.addr, sizeof info.addr, "%s", visc_swarm_node_address(from->node));
    uint8_t msg[VISC_MM_INFO_MAX_BYTES];
    int n = visc_mm_info_encode(&info, msg, sizeof msg);
    visc_chan *c = visc_swarm_node_connect(from->node, visc_swarm_node_address(leader->node),
                                           VISC_PURPOSE_JOIN, tag, key_of(leader), visc_now() + 5);
    if (c && (n < 0 || visc_chan_send(c, VISC_MSG_JOIN, msg, (size_t)n, visc_now() + 5) != 0)) {
        visc_chan_close(c);
        c = NULL;
    }
    return c;
}

/* The REJECT reason that arrives on c (-1: something else or nothing).
 * 12 s: a leader answers every JOIN within its window, even one that
 * waited behind its settling and its DHT reads on a loaded machine. */
static int reject_on(visc_chan *c) {
    uint8_t type = 0, msg[VISC_MM_GROUP_MAX_BYTES];
    size_t n = 0;
    visc_mm_reject_reason why;
    if (!c || visc_chan_recv(c, &type, msg, sizeof msg, &n, visc_now() + 12) != 0) return -1;
    if (type != VISC_MSG_REJECT || visc_mm_reject_parse(msg, n, &why) != 0) return -1;
    return (int)why;
}

/* Which of two channels has something to read first, within timeout_s
 * (-1: neither). */
static int first_readable(visc_chan *a, visc_chan *b, double timeout_s) {
    if (!a || !b) return -1;
    struct pollfd p[2] = {{.fd = visc_chan_fd(a), .events = POLLIN},
                          {.fd = visc_chan_fd(b), .events = POLLIN}};
    if (poll(p, 2, (int)(timeout_s * 1000)) <= 0) return -1;
    return p[0].revents ? 0 : 1;
}

/* A leader alone on its DHT: a joiner whose own deadline has passed is
 * turned away; the same joiner twice is a duplicate; a joiner that leaves
 * before GROUP is not counted, so the group that a third peer's JOIN
 * completes is the leader and that peer.
 *
 * The duplicate is whichever of the two JOINs the leader reads second.
 * Their handshakes run on two of the leader's workers and may finish in
 * either order: the test once waited for a REJECT on the second one sent,
 * and under CI's load the leader had taken that one first, made it a
 * member, and sent it GROUP at the end of its window. The window is long
 * (30 s) because gathering ends as soon as the group is full. */
TEST(mm_leader_turns_away_late_duplicate_and_vanished_joiners) {
    peer leader, h, h2;
    CHECK(peer_open(&leader, 0, 0, 0) == 0 && peer_open(&h, 0, -1, 0) == 0 &&
          peer_open(&h2, 0, -1, 0) == 0);
    if (!leader.node || !h.node || !h2.node) return;
    job lj;
    memset(&lj, 0, sizeof lj);
    lj.p = &leader;
    uint64_t round = 77001;
    const double window_s = 30;
    lj.cfg = (visc_matchmaking_config){.round = round,
                                       .target_group_size = 3,
                                       .min_group_size = 2,
                                       .matchmaking_time_s = window_s};
    memset(lj.cfg.schema_hash, 0x5c, 32);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, run_job, &lj) == 0);
    visc_chan *late = join_open(&h, &leader, round, visc_unix_ms() - 1);
    CHECK(reject_on(late) == VISC_MM_REJECT_FULL);
    visc_chan_close(late);
    /* deadlines past the leader's window, so that none ends its gathering */
    const uint64_t expires = visc_unix_ms() + 60000;
    visc_chan *join[2] = {join_open(&h, &leader, round, expires),
                          join_open(&h, &leader, round, expires)};
    CHECK(join[0] != NULL && join[1] != NULL);
    const int dup = first_readable(join[0], join[1], 12);
    CHECK_MSG(dup >= 0, "neither of the two JOINs was answered within 12 s");
    if (dup >= 0) {
        const int why = reject_on(join[dup]);
        CHECK_MSG(why == VISC_MM_REJECT_DUPLICATE, "JOIN %d got %d (want %d: duplicate)", dup, why,
                  VISC_MM_REJECT_DUPLICATE);
        /* the other is a member now, waiting for GROUP */
        struct pollfd p = {.fd = visc_chan_fd(join[1 - dup]), .events = POLLIN};
        CHECK_MSG(poll(&p, 1, 0) == 0, "the member was sent something before its group formed");
    }
    visc_chan_close(join[0]); /* the member is gone before its group forms */
    visc_chan_close(join[1]);
    visc_chan *third = join_open(&h2, &leader, round, expires);
    uint8_t type = 0;
    static uint8_t msg[VISC_MM_GROUP_MAX_BYTES];
    size_t n = 0;
    visc_group seen;
    CHECK_MSG(third && visc_chan_recv(third, &type, msg, sizeof msg, &n, visc_now() + 12) == 0 &&
                  type == VISC_MSG_GROUP &&
                  visc_mm_group_parse(msg, n, round, lj.cfg.schema_hash, key_of(&h2),
                                      key_of(&leader), &seen) == 0,
              "the third peer got no GROUP (type %d): %s", type, visc_last_error());
    visc_chan_close(third);
    pthread_join(th, NULL);
    CHECK_MSG(lj.rc == 0, "%s", lj.err);
    CHECK_MSG(lj.rc != 0 || lj.g.size == 2, "a group of %d, want the leader and the third peer",
              lj.g.size);
    for (int i = 0; lj.rc == 0 && i < lj.g.size; i++)
        CHECK_MSG(memcmp(lj.g.members[i].key, key_of(&h), VISC_KEY_BYTES) != 0,
                  "the joiner that left is member %d", i);
    CHECK_MSG(lj.took < window_s / 2,
              "the leader took %.1f s: it waited out its %.0f s window "
              "though its group was full",
              lj.took, window_s);
    peer_close(&h2);
    peer_close(&h);
    peer_close(&leader);
}

typedef enum { FAKE_REJECTS, FAKE_BABBLES, FAKE_GROUPS } fake_play;

typedef struct {
    peer p;
    fake_play play;
    uint64_t round;
    peer *follower, *other; /* FAKE_GROUPS: the follower, and a peer that joins it meanwhile */
    int acted, other_reject;
} fake_leader;

/* Takes the follower's JOIN and answers it: a REJECT, a frame of the
 * wrong type, or a GROUP of the two of them (sent once another peer's
 * JOIN waits at the follower, which must then turn it away). */
static void *fake_leader_run(void *arg) {
    fake_leader *f = arg;
    uint8_t tag[16];
    visc_mm_join_tag(f->round, tag);
    visc_chan *c = visc_swarm_node_take(f->p.node, VISC_PURPOSE_JOIN, tag, NULL, visc_now() + 5);
    if (!c) return NULL;
    static uint8_t msg[VISC_MM_GROUP_MAX_BYTES];
    uint8_t type = 0;
    size_t n = 0;
    int ok =
        visc_chan_recv(c, &type, msg, sizeof msg, &n, visc_now() + 5) == 0 && type == VISC_MSG_JOIN;
    visc_chan *pending = NULL;
    if (ok && f->play == FAKE_REJECTS) {
        uint8_t r[2] = {1, VISC_MM_REJECT_FULL};
        ok = visc_chan_send(c, VISC_MSG_REJECT, r, 2, visc_now() + 5) == 0;
    } else if (ok && f->play == FAKE_BABBLES) {
        ok = visc_chan_send(c, VISC_MSG_JOIN, msg, 2, visc_now() + 5) == 0;
    } else if (ok) {
        pending = join_open(f->other, f->follower, f->round, visc_unix_ms() + 1000);
        ok = pending && wait_pending(f->follower->node, 1, 5) == 1;
        visc_group g;
        memset(&g, 0, sizeof g);
        g.size = 2;
        randombytes_buf(g.id, sizeof g.id);
        peer *who[2] = {&f->p, f->follower};
        for (int i = 0; i < 2; i++) {
            memcpy(g.members[i].key, key_of(who[i]), 32);
            g.members[i].bandwidth = 1e6;
            snprintf(g.members[i].addr, sizeof g.members[i].addr, "%s",
                     visc_swarm_node_address(who[i]->node));
        }
        uint8_t schema[32];
        memset(schema, 0x5c, 32);
        int len = visc_mm_group_encode(&g, f->round, schema, msg, sizeof msg);
        ok = ok && len > 0 &&
             visc_chan_send(c, VISC_MSG_GROUP, msg, (size_t)len, visc_now() + 5) == 0;
        f->other_reject = reject_on(pending);
        visc_chan_close(pending);
    }
    /* until the follower hangs up */
    if (ok) ok = visc_chan_recv(c, &type, msg, sizeof msg, &n, visc_now() + 5) != 0;
    f->acted = ok;
    visc_chan_close(c);
    return NULL;
}

/* A follower tries the leaders in order: one refuses, one answers with
 * nonsense, the third gives a group. A JOIN that reached the follower
 * meanwhile is turned away: the round's group has formed (FORMED, the
 * standing answer that also reaches a JOIN queued before the group). */
TEST(mm_follower_moves_on_from_refusing_and_babbling_leaders) {
    peer me;
    CHECK(peer_open(&me, 0, 0, 0) == 0);
    if (!me.node) return;
    static fake_leader f[3];
    uint64_t round = 77002;
    char key[32];
    snprintf(key, sizeof key, "mm.%llu", (unsigned long long)round);
    uint64_t now = visc_unix_ms();
    for (int i = 0; i < 3; i++) {
        memset(&f[i], 0, sizeof f[i]);
        CHECK(peer_open(&f[i].p, 0, -1, 0) == 0);
        if (!f[i].p.node) return;
        f[i].play = (fake_play)i;
        f[i].round = round;
        f[i].follower = &me;
        f[i].other = &f[0].p;
        /* declarations that expire before ours, in this order */
        visc_mm_info info = {.round = round, .bandwidth = 1e6, .expires_ms = now + 1200 + 100 * i};
        memset(info.schema_hash, 0x5c, 32);
        snprintf(info.addr, sizeof info.addr, "%s", visc_swarm_node_address(f[i].p.node));
        uint8_t value[VISC_MM_INFO_MAX_BYTES], wire[VISC_RECORD_MAX_WIRE];
        int n = visc_mm_info_encode(&info, value, sizeof value);
        int len = visc_record_encode(&f[i].p.auth, key, value, (size_t)n, now, now + 5000, wire,
                                     sizeof wire);
        CHECK(len > 0);
        /* stored by my DHT node, the only one (it says no other node stored it) */
        visc_dht_put_wire(visc_swarm_node_dht(me.node), key, wire, (size_t)len, 2);
    }
    visc_record recs[4];
    CHECK(visc_dht_get(visc_swarm_node_dht(me.node), key, recs, 4, 2) == 3);
    pthread_t t[3];
    for (int i = 0; i < 3; i++) CHECK(pthread_create(&t[i], NULL, fake_leader_run, &f[i]) == 0);
    job j;
    memset(&j, 0, sizeof j);
    j.p = &me;
    j.cfg = (visc_matchmaking_config){.round = round,
                                      .target_group_size = 4,
                                      .min_group_size = 2,
                                      .matchmaking_time_s = 2};
    memset(j.cfg.schema_hash, 0x5c, 32);
    run_job(&j);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    CHECK_MSG(j.rc == 0, "%s", j.err);
    for (int i = 0; i < 3; i++) CHECK_MSG(f[i].acted, "fake leader %d did not act", i);
    CHECK(j.g.size == 2 && in_group(&j.g, key_of(&f[2].p)) && in_group(&j.g, key_of(&me)));
    CHECK(f[2].other_reject == VISC_MM_REJECT_FORMED);
    for (int i = 2; i >= 0; i--) peer_close(&f[i].p);
    peer_close(&me);
}

/* test_swarm_allreduce.c: the all-reduce's shard split and wire messages,
 * and whole rounds among nodes in this process (one thread per peer). The
 * multi-process rounds, faults and attacks are tests/e2e_swarm_*.sh. */
#include <pthread.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "test.h"
#include "visc/core.h"
#include "../src/swarm/allreduce.h"
#include "../src/swarm/wire.h"

static visc_group group_of(int m, const double *bw, const int *client) {
    visc_group g;
    memset(&g, 0, sizeof g);
    g.size = m;
    for (int i = 0; i < m; i++) {
        g.members[i].bandwidth = bw[i];
        g.members[i].client = client[i];
        g.members[i].key[0] = (uint8_t)(i + 1);
    }
    return g;
}

TEST(shards_follow_bandwidth_and_skip_clients) {
    double bw[4] = {1, 5, 3, 0}; /* 0: unknown, counts as 1 */
    int client[4] = {0, 1, 0, 0};
    visc_group g = group_of(4, bw, client);
    size_t b[VISC_GROUP_MAX + 1];
    visc_allreduce_shards(&g, 1000, b);
    CHECK(b[0] == 0 && b[4] == 1000);
    CHECK(b[2] - b[1] == 0); /* the client */
    CHECK(b[1] - b[0] == 200 && b[3] - b[2] == 600 && b[4] - b[3] == 200);
    /* fewer values than members: every value still has exactly one owner */
    visc_allreduce_shards(&g, 2, b);
    CHECK(b[0] == 0 && b[4] == 2);
    for (int i = 0; i < 4; i++) CHECK(b[i] <= b[i + 1]);
    CHECK(visc_allreduce_part_values(0) == 1);
    CHECK(visc_allreduce_part_values(16384) == 4096);
    CHECK(visc_allreduce_part_values((size_t)1 << 40) * 4 < VISC_CHAN_MAX_FRAME);
}

TEST(hello_round_trip_and_rejects) {
    visc_ar_hello h = {.n = 123456789,
                       .weight = 2.5,
                       .compression = 3,
                       .aggregation = 2,
                       .part_bytes = 65536};
    memset(h.group_id, 0x11, 16);
    memset(h.schema_hash, 0x22, 32);
    uint8_t m[VISC_AR_HELLO_BYTES];
    visc_ar_hello_encode(&h, m);
    visc_ar_hello back;
    CHECK(visc_ar_hello_parse(m, sizeof m, &back) == 0);
    CHECK(back.n == h.n && back.weight == 2.5 && back.compression == 3 && back.aggregation == 2);
    CHECK(back.part_bytes == 65536 && memcmp(back.group_id, h.group_id, 16) == 0);
    CHECK(visc_ar_hello_parse(m, sizeof m - 1, &back) != 0);
    uint8_t bad[VISC_AR_HELLO_BYTES];
    memcpy(bad, m, sizeof m);
    bad[0] = 9; /* version */
    CHECK(visc_ar_hello_parse(bad, sizeof bad, &back) != 0);
    memcpy(bad, m, sizeof m);
    bad[65] = 4; /* compression */
    CHECK(visc_ar_hello_parse(bad, sizeof bad, &back) != 0);
    /* 0 parses (an auxiliary member's; the round checks the role), a
     * negative zero does not (one encoding per value) */
    memcpy(bad, m, sizeof m);
    visc_put_f64(bad + 57, 0.0);
    CHECK(visc_ar_hello_parse(bad, sizeof bad, &back) == 0 && back.weight == 0);
    const double weights[] = {-0.0, -1.0, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        memcpy(bad, m, sizeof m);
        visc_put_f64(bad + 57, weights[i]);
        CHECK(visc_ar_hello_parse(bad, sizeof bad, &back) != 0);
    }
}

TEST(part_parse_checks_index_size_and_values) {
    float x[2048], out[2048];
    for (int i = 0; i < 2048; i++) x[i] = (float)i / 2048 - 0.5f;
    static uint8_t msg[4 + 2048 * 4];
    visc_put_u32(msg, 7);
    size_t len = 4 + visc_compress(VISC_COMP_FP16, x, 2048, msg + 4, NULL);
    CHECK(visc_ar_part_parse(msg, len, 7, VISC_COMP_FP16, out, 2048) == 0);
    CHECK_ARRAYS("fp16 part", out, x, 2048, 1e-3, 0);
    CHECK(visc_ar_part_parse(msg, len, 6, VISC_COMP_FP16, out, 2048) != 0);     /* order */
    CHECK(visc_ar_part_parse(msg, len - 2, 7, VISC_COMP_FP16, out, 2048) != 0); /* size */
    CHECK(visc_ar_part_parse(msg, len, 7, VISC_COMP_FP16, out, 2047) != 0);
    CHECK(visc_ar_part_parse(msg, len, 7, VISC_COMP_NONE, out, 2048) != 0);
    CHECK(visc_ar_part_parse(msg, 3, 7, VISC_COMP_FP16, out, 2048) != 0);
    /* small parts travel uncompressed; a NaN in them is refused */
    len = 4 + visc_compress(VISC_COMP_NONE, x, 10, msg + 4, NULL);
    CHECK(visc_ar_part_parse(msg, len, 7, VISC_COMP_Q8, out, 10) == 0);
    float nan = NAN;
    memcpy(msg + 4 + 3 * 4, &nan, 4);
    CHECK(visc_ar_part_parse(msg, len, 7, VISC_COMP_Q8, out, 10) != 0);
}

/* ---- rounds among nodes of this process ---- */

#define PEERS 3
typedef struct {
    visc_swarm_node *node;
    visc_group g;
    visc_allreduce_config cfg;
    float *x;
    size_t n;
    double weight;
    int rc;
    visc_allreduce_report rep;
} peer;

static void *run_peer(void *arg) {
    peer *p = arg;
    p->rc = visc_allreduce(p->node, &p->g, &p->cfg, p->x, p->n, p->weight, NULL, &p->rep);
    return NULL;
}

/* Opens PEERS nodes (the last a client when with_client), runs one round
 * with `alive` of them taking part, returns the results in peers. */
/* Optional: the round's compression and exact range, and values that a
 * lossy code cannot carry (tiny entries beside large ones in each block). */
static visc_compression round_compression = VISC_COMP_NONE;
static size_t round_exact_from = SIZE_MAX;
static int round_tiny_values = 0;
static int round_auxiliary = -1; /* this member joins as an auxiliary (weight 0) */
static int round_newcomer = -1;  /* this member joins as a newcomer (weight 0) */

static float test_value(int i, size_t j) {
    if (round_tiny_values && j % 2) return 1e-5f * (float)((i + 1) * (int)(j % 13));
    return (float)((i + 1) * (j % 7)) - 3.0f;
}

static int round_in_process(peer *ps, int alive, int with_client, size_t n, size_t part_bytes) {
    visc_swarm_auth auth[PEERS];
    visc_group g;
    memset(&g, 0, sizeof g);
    g.size = PEERS;
    memset(g.id, 0x42, 16);
    int ok = 1;
    for (int i = 0; i < PEERS; i++) {
        visc_identity id;
        ok = ok && visc_identity_generate(&id) == 0 &&
             visc_swarm_auth_init(&auth[i], "allreduce-test", &id) == 0 &&
             visc_swarm_auth_set_secret(&auth[i], "a secret of the test swarm", 26) == 0;
        int client = with_client && i == PEERS - 1;
        visc_swarm_node_config nc = {.listen = client ? NULL : "127.0.0.1:0",
                                     .dht_port = -1,
                                     .auth = &auth[i],
                                     .bandwidth = 1e7 * (i + 1),
                                     .client = client};
        ps[i].node = ok ? visc_swarm_node_open(&nc) : NULL;
        ok = ok && ps[i].node;
        if (!ok) break;
        memcpy(g.members[i].key, id.public_key, VISC_KEY_BYTES);
        snprintf(g.members[i].addr, sizeof g.members[i].addr, "%s",
                 visc_swarm_node_address(ps[i].node));
        g.members[i].bandwidth = 1e7 * (i + 1);
        g.members[i].client = client;
        g.members[i].auxiliary = i == round_auxiliary;
        g.members[i].newcomer = i == round_newcomer;
    }
    CHECK_MSG(ok, "opening nodes: %s", visc_last_error());
    pthread_t th[PEERS];
    for (int i = 0; ok && i < alive; i++) {
        ps[i].g = g;
        ps[i].g.self = i;
        visc_allreduce_config_default(&ps[i].cfg);
        ps[i].cfg.part_bytes = part_bytes;
        ps[i].cfg.connect_timeout_s = 2;
        ps[i].cfg.part_timeout_min_s = 1;
        ps[i].cfg.compression = round_compression;
        ps[i].cfg.exact_from = round_exact_from;
        ps[i].n = n;
        ps[i].weight = i == round_auxiliary || i == round_newcomer ? 0 : i + 1;
        ps[i].x = malloc(n * sizeof(float));
        for (size_t j = 0; j < n; j++) ps[i].x[j] = test_value(i, j);
        pthread_create(&th[i], NULL, run_peer, &ps[i]);
    }
    for (int i = 0; ok && i < alive; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < PEERS; i++) {
        if (ps[i].node) visc_swarm_node_close(ps[i].node);
        visc_swarm_auth_free(&auth[i]);
    }
    return ok ? 0 : -1;
}

TEST(round_in_process_gives_the_weighted_mean) {
    peer ps[PEERS];
    memset(ps, 0, sizeof ps);
    size_t n = 5000;
    if (round_in_process(ps, PEERS, 1, n, 4096) == 0) {
        /* weights 1, 2, 3 on values (i + 1) * (j % 7) - 3: the mean is
         * (1 + 4 + 9) / 6 * (j % 7) - 3 */
        for (int i = 0; i < PEERS; i++) {
            CHECK_MSG(ps[i].rc == 0, "peer %d: rc %d (%s)", i, ps[i].rc, ps[i].rep.what_failed);
            CHECK(ps[i].rep.averaged_fraction == 1.0 && ps[i].rep.n_failed_keys == 0);
            float want[5000];
            for (size_t j = 0; j < n; j++) want[j] = (float)(14.0 / 6 * (double)(j % 7) - 3);
            CHECK_ARRAYS("mean", ps[i].x, want, n, 1e-6, 1e-6);
        }
        CHECK(ps[2].rep.parts_with[2] == 0); /* the client reduces nothing */
        CHECK(ps[0].rep.bytes_sent > n * 4 / 3);
    }
    for (int i = 0; i < PEERS; i++) free(ps[i].x);
}

/* A member that contributes nothing (the last: the largest bandwidth, so
 * the largest shard) reduces its shard with weight 0: the training members
 * end with exactly the weighted mean of their own values, and the silent
 * member's values never enter it. An auxiliary holds the result of its
 * shard only; a newcomer (it has just taken the swarm's state and holds no
 * gradient) takes every result and ends with the whole mean too. */
static void round_with_a_silent_member(int newcomer) {
    const char *role = newcomer ? "newcomer" : "auxiliary";
    peer ps[PEERS];
    memset(ps, 0, sizeof ps);
    size_t n = 6000;
    *(newcomer ? &round_newcomer : &round_auxiliary) = PEERS - 1;
    if (round_in_process(ps, PEERS, 0, n, 4096) == 0) {
        static float want[6000];
        for (size_t j = 0; j < n; j++) /* weights 1 and 2; small integers: exact in double */
            want[j] = (float)((1.0 * test_value(0, j) + 2.0 * test_value(1, j)) / 3.0);
        int whole = newcomer ? PEERS : PEERS - 1; /* the members that take every result */
        for (int i = 0; i < PEERS; i++)
            CHECK_MSG(ps[i].rc == 0, "peer %d: rc %d (%s)", i, ps[i].rc, ps[i].rep.what_failed);
        for (int i = 0; i < whole; i++) {
            CHECK(ps[i].rep.averaged_fraction == 1.0 && ps[i].rep.n_failed_keys == 0);
            CHECK_ARRAYS("mean of the training members", ps[i].x, want, n, 0, 0);
            CHECK(ps[i].rep.parts_with[PEERS - 1] == 0); /* nothing of the silent member's */
        }
        const visc_allreduce_report *a = &ps[PEERS - 1].rep;
        size_t b0 = a->shard_begin[PEERS - 1], b1 = a->shard_begin[PEERS];
        CHECK_MSG(b1 - b0 == n / 2, "the %s's shard: %zu values", role, b1 - b0);
        CHECK(a->values_reduced == b1 - b0 && a->averaged_fraction == 1.0);
        CHECK(a->parts_with[PEERS - 1] == 0 && a->parts_with[0] == a->parts_with[1] &&
              a->parts_with[0] > 1);
        CHECK_ARRAYS("the silent member's shard", ps[PEERS - 1].x + b0, want + b0, b1 - b0, 0, 0);
        for (size_t j = 0; !newcomer && j < b0; j++)
            if (ps[PEERS - 1].x[j] != test_value(PEERS - 1, j)) {
                CHECK_MSG(0, "the auxiliary's value %zu changed outside its shard", j);
                break;
            }
        /* it sent only results: its shard once to each of the 2 others */
        CHECK(a->bytes_sent >= 2 * (b1 - b0) * 4 && a->bytes_sent < 2 * (b1 - b0) * 4 + 4096);
        /* a newcomer received the 2 others' parts of its shard and their results */
        if (newcomer) CHECK(a->bytes_received >= (2 * (b1 - b0) + (n - (b1 - b0))) * 4);
    }
    round_auxiliary = round_newcomer = -1;
    for (int i = 0; i < PEERS; i++) free(ps[i].x);
}

TEST(round_with_an_auxiliary_gives_the_mean_of_the_others) { round_with_a_silent_member(0); }

TEST(round_with_a_newcomer_gives_everyone_the_mean_of_the_others) { round_with_a_silent_member(1); }

/* q8 with an exact range: values from exact_from on arrive as the exact
 * weighted mean (tiny statistics survive), values before it went through
 * the lossy code (the tiny ones are visibly off there). */
TEST(round_keeps_the_exact_range_uncompressed) {
    peer ps[PEERS];
    memset(ps, 0, sizeof ps);
    size_t n = 40000, exact_from = 30000;
    round_compression = VISC_COMP_Q8, round_exact_from = exact_from, round_tiny_values = 1;
    if (round_in_process(ps, PEERS, 0, n, 16384) == 0) {
        for (int i = 0; i < PEERS; i++) {
            CHECK_MSG(ps[i].rc == 0, "peer %d: rc %d (%s)", i, ps[i].rc, ps[i].rep.what_failed);
            size_t lossy = 0;
            for (size_t j = 0; j < n; j++) {
                double want = 0;
                for (int p = 0; p < PEERS; p++) want += (p + 1) * (double)test_value(p, j) / 6;
                double err = fabs(ps[i].x[j] - want);
                if (j >= exact_from)
                    CHECK_MSG(err <= 1e-6 * fabs(want) + 1e-12, "value %zu: %g, want %g", j,
                              ps[i].x[j], want);
                else if (j % 2 && err > 0.5 * fabs(want)) lossy++;
            }
            CHECK_MSG(lossy > 1000, "only %zu tiny values before exact_from were lost", lossy);
        }
        /* fp32 everywhere: every value goes out twice (part, result) from
         * each of the 2 other members: 16 n bytes; q8 before exact_from
         * makes it about 7 n */
        uint64_t sent = 0;
        for (int i = 0; i < PEERS; i++) sent += ps[i].rep.bytes_sent;
        CHECK_MSG(sent < n * 16 * 6 / 10, "%llu bytes sent", (unsigned long long)sent);
    }
    for (int i = 0; i < PEERS; i++) free(ps[i].x);
    /* One part per shard (as with the default 512 KiB parts and a small
     * model): the shard that holds exact_from is cut there, so its lossy
     * range still goes as q8. q8 up to 39000, fp32 after: about 4.3 n
     * bytes; the last shard whole in fp32 would be 8 n. */
    memset(ps, 0, sizeof ps);
    exact_from = 39000, round_exact_from = exact_from;
    if (round_in_process(ps, PEERS, 0, n, (size_t)1 << 20) == 0) {
        uint64_t sent = 0;
        for (int i = 0; i < PEERS; i++) {
            CHECK_MSG(ps[i].rc == 0, "peer %d: rc %d (%s)", i, ps[i].rc, ps[i].rep.what_failed);
            sent += ps[i].rep.bytes_sent;
            for (size_t j = exact_from; j < n; j++) {
                double want = 0;
                for (int p = 0; p < PEERS; p++) want += (p + 1) * (double)test_value(p, j) / 6;
                if (fabs(ps[i].x[j] - want) > 1e-6 * fabs(want) + 1e-12) {
                    CHECK_MSG(0, "value %zu: %g, want %g", j, ps[i].x[j], want);
                    break;
                }
            }
        }
        CHECK_MSG(sent < n * 16 * 3 / 10, "%llu bytes sent", (unsigned long long)sent);
    }
    round_compression = VISC_COMP_NONE, round_exact_from = SIZE_MAX, round_tiny_values = 0;
    for (int i = 0; i < PEERS; i++) free(ps[i].x);
}

TEST(round_with_a_missing_member_reports_it) {
    peer ps[PEERS];
    memset(ps, 0, sizeof ps);
    size_t n = 3000;
    /* member 2 (a full peer here) never calls visc_allreduce */
    if (round_in_process(ps, 2, 0, n, 4096) == 0) {
        size_t b[VISC_GROUP_MAX + 1];
        visc_allreduce_shards(&ps[0].g, n, b);
        for (int i = 0; i < 2; i++) {
            CHECK(ps[i].rc == 1);
            CHECK(ps[i].rep.n_failed_keys == 1 && ps[i].rep.member_failed[2]);
            CHECK(strstr(ps[i].rep.what_failed, "member 2") != NULL);
            CHECK_CLOSE(ps[i].rep.averaged_fraction, 1.0 - (double)(b[3] - b[2]) / n, 1e-12, 0);
            for (size_t j = 0; j < n; j++) {
                float local = (float)((i + 1) * (j % 7)) - 3.0f;
                float want = j >= b[2] ? local : (float)(5.0 / 3 * (double)(j % 7) - 3);
                if (fabsf(ps[i].x[j] - want) > 1e-6f) {
                    CHECK_MSG(0, "peer %d value %zu: %g, expected %g", i, j, ps[i].x[j], want);
                    break;
                }
            }
        }
    }
    for (int i = 0; i < PEERS; i++) free(ps[i].x);
}

TEST(bad_arguments_are_refused) {
    visc_group g;
    memset(&g, 0, sizeof g);
    g.size = 1;
    visc_allreduce_config c;
    visc_allreduce_config_default(&c);
    visc_allreduce_report rep;
    float x[4] = {0};
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1);
    g.size = 2;
    g.members[0].client = g.members[1].client = 1;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1); /* nobody reduces */
    g.members[0].client = 0;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, -1, NULL, &rep) == -1);
    CHECK(visc_allreduce(NULL, &g, &c, x, 0, 1, NULL, &rep) == -1);
    g.self = 5;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1);
    /* an auxiliary's weight is 0, a training member's is not; someone trains */
    g.self = 0;
    g.members[1].client = 0;
    g.members[0].auxiliary = 1;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1);
    CHECK(strstr(visc_last_error(), "auxiliary") != NULL);
    g.members[0].auxiliary = 0;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 0, NULL, &rep) == -1);
    g.members[0].auxiliary = g.members[1].auxiliary = 1;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 0, NULL, &rep) == -1);
    CHECK(strstr(visc_last_error(), "no member contributes") != NULL);
    /* a newcomer's weight is 0 too; a client is neither */
    g.members[0].auxiliary = g.members[1].auxiliary = 0;
    g.members[0].newcomer = 1;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1);
    CHECK(strstr(visc_last_error(), "newcomer") != NULL);
    g.members[1].newcomer = 1;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 0, NULL, &rep) == -1);
    CHECK(strstr(visc_last_error(), "no member contributes") != NULL);
    g.members[1].newcomer = 0;
    g.members[1].client = 1;
    g.members[0].client = 1;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 0, NULL, &rep) == -1);
    CHECK(strstr(visc_last_error(), "a client and a newcomer") != NULL);
}

TEST(messages_refuse_unknown_aggregation_and_non_finite_values) {
    visc_ar_hello h = {.n = 10, .weight = 1, .compression = 0, .aggregation = 0, .part_bytes = 64};
    uint8_t m[VISC_AR_HELLO_BYTES];
    visc_ar_hello_encode(&h, m);
    visc_ar_hello back;
    CHECK(visc_ar_hello_parse(m, sizeof m, &back) == 0);
    m[66] = VISC_AGG_CENTERED_CLIP + 1;
    CHECK(visc_ar_hello_parse(m, sizeof m, &back) != 0 &&
          strstr(visc_last_error(), "unknown aggregation"));
    /* an fp16 part may carry an infinity: decoded, then refused */
    float x[2048], out[2048];
    for (int i = 0; i < 2048; i++) x[i] = 1.0f;
    static uint8_t msg[4 + 2048 * 4];
    visc_put_u32(msg, 0);
    size_t len = 4 + visc_compress(VISC_COMP_FP16, x, 2048, msg + 4, NULL);
    CHECK(visc_ar_part_parse(msg, len, 0, VISC_COMP_FP16, out, 2048) == 0);
    msg[4 + 2 * 100] = 0x00, msg[4 + 2 * 100 + 1] = 0x7c; /* +inf in half precision */
    CHECK(visc_ar_part_parse(msg, len, 0, VISC_COMP_FP16, out, 2048) != 0);
}

TEST(bad_settings_are_refused_before_the_round) {
    visc_group g;
    memset(&g, 0, sizeof g);
    g.size = 2;
    visc_allreduce_config c;
    visc_allreduce_report rep;
    float x[4] = {0};
    /* node NULL: a round that started would crash, so each is refused first */
    visc_allreduce_config_default(&c);
    c.compression = (visc_compression)(VISC_COMP_Q8 + 1);
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1);
    visc_allreduce_config_default(&c);
    c.round_timeout_s = 0;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1);
    visc_allreduce_config_default(&c);
    c.part_timeout_slack = NAN;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1);
    visc_allreduce_config_default(&c);
    c.agg.mode = VISC_AGG_TRIMMED_MEAN, c.agg.trim = -1;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1 &&
          strstr(visc_last_error(), "aggregation"));
    visc_allreduce_config_default(&c);
    c.agg.mode = VISC_AGG_CENTERED_CLIP, c.agg.clip_tau = 0;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1);
    visc_allreduce_config_default(&c);
    c.agg.mode = (visc_aggregation)7;
    CHECK(visc_allreduce(NULL, &g, &c, x, 4, 1, NULL, &rep) == -1);
}

/* ---- one honest peer against a hand-played one ---- */

typedef enum {
    H_OTHER_SCHEMA,
    H_OTHER_N,
    H_OTHER_COMPRESSION,
    H_HEAVY, /* weight above the limit */
    H_ABORTS,
    H_NAN_RESULT,
    H_SECOND_HELLO,  /* a hello where data belongs */
    H_WEIGHTLESS,    /* weight 0 without the auxiliary role */
    H_NEWCOMER_PART, /* listed as a newcomer (weight 0), it sends a part */
    H_SILENT,
} hand_play;

typedef struct {
    visc_swarm_node *node;
    const visc_group *g;
    const uint8_t *honest_key;
    hand_play play;
    int acted;
} hand;

/* Member 1 of a group of two, played by hand: takes the honest peer's
 * channel, answers its hello (altered per play), then misbehaves. */
static void *hand_main(void *arg) {
    hand *h = arg;
    visc_chan *c = visc_swarm_node_take(h->node, VISC_PURPOSE_ALLREDUCE, h->g->id, h->honest_key,
                                        visc_now() + 10);
    if (!c) return NULL;
    static uint8_t buf[VISC_CHAN_MAX_FRAME];
    uint8_t type = 0;
    size_t got = 0;
    visc_ar_hello hello;
    if (visc_chan_recv(c, &type, buf, sizeof buf, &got, visc_now() + 5) != 0 ||
        type != VISC_MSG_AR_HELLO || visc_ar_hello_parse(buf, got, &hello) != 0) {
        visc_chan_close(c);
        return NULL;
    }
    if (h->play == H_OTHER_SCHEMA) hello.schema_hash[0] ^= 1;
    if (h->play == H_OTHER_N) hello.n++;
    if (h->play == H_OTHER_COMPRESSION) hello.compression = VISC_COMP_FP16;
    if (h->play == H_HEAVY) hello.weight = 1e12;
    if (h->play == H_WEIGHTLESS || h->play == H_NEWCOMER_PART)
        hello.weight = 0; /* an auxiliary's or a newcomer's: only the latter is listed so */
    uint8_t m[VISC_AR_HELLO_BYTES];
    visc_ar_hello_encode(&hello, m);
    int ok = visc_chan_send(c, VISC_MSG_AR_HELLO, m, sizeof m, visc_now() + 5) == 0;
    if (ok && h->play == H_ABORTS)
        ok = visc_chan_send(c, VISC_MSG_AR_ABORT, m, 0, visc_now() + 5) == 0;
    if (ok && h->play == H_SECOND_HELLO)
        ok = visc_chan_send(c, VISC_MSG_AR_HELLO, m, sizeof m, visc_now() + 5) == 0;
    if (ok && h->play == H_NEWCOMER_PART) {
        /* the honest peer's part of our shard, sent back as a part of ours */
        ok = visc_chan_recv(c, &type, buf, sizeof buf, &got, visc_now() + 5) == 0 &&
             type == VISC_MSG_AR_PART;
        ok = ok && visc_chan_send(c, VISC_MSG_AR_PART, buf, got, visc_now() + 5) == 0;
    }
    if (ok && h->play == H_NAN_RESULT) {
        /* the honest peer's part of our shard, then a "result" with a NaN */
        ok = visc_chan_recv(c, &type, buf, sizeof buf, &got, visc_now() + 5) == 0 &&
             type == VISC_MSG_AR_PART && got > VISC_AR_PART_HEADER;
        float nan = NAN;
        if (ok) memcpy(buf + VISC_AR_PART_HEADER, &nan, sizeof nan);
        ok = ok && visc_chan_send(c, VISC_MSG_AR_RESULT, buf, got, visc_now() + 5) == 0;
    }
    /* then read (and ignore) whatever comes until the honest peer hangs up */
    double until = visc_now() + 10;
    while (ok && visc_chan_recv(c, &type, buf, sizeof buf, &got, until) == 0) continue;
    ok = ok && visc_now() < until;
    h->acted = ok;
    visc_chan_close(c);
    return NULL;
}

typedef struct {
    visc_swarm_auth auth[2];
    visc_swarm_node *node[2];
    visc_group g;
} pair;

/* Two nodes on 127.0.0.1 and their group: member 0 (a client when
 * client_self) and member 1, both with addresses. */
static int pair_open(pair *p, int client_self) {
    memset(p, 0, sizeof *p);
    p->g.size = 2;
    randombytes_buf(p->g.id, 16);
    for (int i = 0; i < 2; i++) {
        visc_identity id;
        if (visc_identity_generate(&id) != 0 ||
            visc_swarm_auth_init(&p->auth[i], "allreduce-test", &id) != 0 ||
            visc_swarm_auth_set_secret(&p->auth[i], "a secret of the test swarm", 26) != 0)
            return -1;
        int client = i == 0 && client_self;
        visc_swarm_node_config nc = {.listen = client ? NULL : "127.0.0.1:0",
                                     .dht_port = -1,
                                     .auth = &p->auth[i],
                                     .bandwidth = 1e7,
                                     .client = client};
        if (!(p->node[i] = visc_swarm_node_open(&nc))) return -1;
        memcpy(p->g.members[i].key, id.public_key, VISC_KEY_BYTES);
        snprintf(p->g.members[i].addr, sizeof p->g.members[i].addr, "%s",
                 visc_swarm_node_address(p->node[i]));
        p->g.members[i].bandwidth = 1e7;
        p->g.members[i].client = client;
    }
    return 0;
}

static void pair_close(pair *p) {
    for (int i = 0; i < 2; i++) {
        if (p->node[i]) visc_swarm_node_close(p->node[i]);
        visc_swarm_auth_free(&p->auth[i]);
    }
}

/* One round of the honest member 0 against the play; its report. */
static int round_against(hand_play play, double round_timeout_s, visc_allreduce_report *rep,
                         float *x, size_t n) {
    pair p;
    int rc = -3;
    if (pair_open(&p, 0) != 0) {
        CHECK_MSG(0, "opening nodes: %s", visc_last_error());
        pair_close(&p);
        return rc;
    }
    p.g.members[1].newcomer = play == H_NEWCOMER_PART;
    hand h = {.node = p.node[1], .g = &p.g, .honest_key = p.g.members[0].key, .play = play};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, hand_main, &h) == 0);
    visc_allreduce_config cfg;
    visc_allreduce_config_default(&cfg);
    cfg.round_timeout_s = round_timeout_s;
    cfg.connect_timeout_s = 5;
    p.g.self = 0;
    rc = visc_allreduce(p.node[0], &p.g, &cfg, x, n, 1, NULL, rep);
    pthread_join(t, NULL);
    CHECK_MSG(h.acted, "play %d: the hand did not get to act", (int)play);
    pair_close(&p);
    return rc;
}

TEST(round_bans_a_peer_with_another_hello_or_a_forged_result) {
    const hand_play plays[] = {H_OTHER_SCHEMA, H_OTHER_N,      H_OTHER_COMPRESSION,
                               H_HEAVY,        H_NAN_RESULT,   H_SECOND_HELLO,
                               H_WEIGHTLESS,   H_NEWCOMER_PART};
    const char *why[] = {"other schema hash",
                         "vector of 65 values (here 64)",
                         "other compression",
                         "weight 1e+12 above",
                         "banned: invalid data",
                         "unexpected frame type",
                         "weight 0 from a training member",
                         "a part from a member that contributes nothing"};
    for (int i = 0; i < 8; i++) {
        float x[64];
        for (int j = 0; j < 64; j++) x[j] = (float)j;
        visc_allreduce_report rep;
        int rc = round_against(plays[i], 20, &rep, x, 64);
        /* its own shard alone: half the vector, unchanged (a mean of one) */
        CHECK_MSG(rc == 1, "play %d: rc %d (%s)", i, rc, rep.what_failed);
        CHECK(rep.member_failed[1] == 2 && rep.banned == 1 && rep.n_failed_keys == 1);
        CHECK_MSG(strstr(rep.what_failed, why[i]), "play %d: %s", i, rep.what_failed);
        CHECK_CLOSE(rep.averaged_fraction, 0.5, 1e-12, 0);
        for (int j = 0; j < 64; j++) CHECK(x[j] == (float)j); /* the NaN never landed */
    }
}

TEST(round_reports_an_abort_and_a_silent_peer) {
    /* set: a NaN left on the stack fails the own shard's reduction, and
     * nothing is averaged (rc -1: CI's coverage build, 2026-12-08) */
    float x[64];
    for (int j = 0; j < 64; j++) x[j] = (float)j;
    visc_allreduce_report rep;
    int rc = round_against(H_ABORTS, 20, &rep, x, 64);
    CHECK_MSG(rc == 1 && rep.member_failed[1] == 1 && rep.banned == 0, "rc %d", rc);
    CHECK_MSG(strstr(rep.what_failed, "aborted by the peer"), "%s", rep.what_failed);
    /* silent after its hello: our own shard waits for its part until the
     * round deadline, and nothing is averaged */
    double t0 = visc_now();
    rc = round_against(H_SILENT, 0.5, &rep, x, 64);
    CHECK(rc == -1 && rep.averaged_fraction == 0);
    CHECK_MSG(strstr(rep.what_failed, "own shard: 0 of 1 parts reduced by the deadline"), "%s",
              rep.what_failed);
    CHECK(strstr(visc_last_error(), "nothing averaged"));
    CHECK(visc_now() - t0 < 5);
}

/* A client whose only reducer announced no address: nothing to average. */
TEST(round_without_a_reachable_reducer_averages_nothing) {
    pair p;
    if (pair_open(&p, 1) != 0) {
        CHECK_MSG(0, "opening nodes: %s", visc_last_error());
        pair_close(&p);
        return;
    }
    p.g.members[1].addr[0] = '\0';
    p.g.self = 0;
    visc_allreduce_config cfg;
    visc_allreduce_config_default(&cfg);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    visc_allreduce_report rep;
    CHECK(visc_allreduce(p.node[0], &p.g, &cfg, x, 8, 1, NULL, &rep) == -1);
    CHECK_MSG(strstr(visc_last_error(), "member has no address"), "%s", visc_last_error());
    CHECK(rep.averaged_fraction == 0 && rep.member_failed[1] == 1 && x[7] == 8);
    pair_close(&p);
}

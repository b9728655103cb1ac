/* test_swarm_record.c: signed DHT records: round trip, and every corruption
 * or misuse rejected with its own reason. */
#include <string.h>

#include "../src/swarm/record.h"
#include "test.h"
#include "visc/core.h"

/* A swarm "run-a" with an allowlist holding `self` (and a secret). */
static void make_auth(visc_swarm_auth *a, visc_identity *self, const char *run) {
    CHECK(visc_identity_generate(self) == 0);
    CHECK(visc_swarm_auth_init(a, run, self) == 0);
    CHECK(visc_swarm_auth_set_secret(a, "a swarm secret of enough bytes", 30) == 0);
    CHECK(visc_swarm_auth_allow(a, self->public_key) == 0);
}

/* Parses wire as key "progress" at now and expects an error containing why. */
static void expect_reject(const visc_swarm_auth *a, const uint8_t *wire, size_t n, uint64_t now,
                          const char *why) {
    visc_record r;
    int rc = visc_record_parse(a, "progress", wire, n, now, &r);
    CHECK_MSG(rc == -1, "accepted a record that should fail with \"%s\"", why);
    if (rc == -1)
        CHECK_MSG(strstr(visc_last_error(), why) != NULL, "error \"%s\", expected \"%s\"",
                  visc_last_error(), why);
}

static uint8_t wire[VISC_RECORD_MAX_WIRE + 16];

TEST(record_round_trip) {
    visc_swarm_auth a;
    visc_identity self;
    make_auth(&a, &self, "run-a");
    uint64_t now = visc_unix_ms();
    CHECK(now > 1600000000000ull);
    const char value[] = "epoch=3 samples=128";
    int n =
        visc_record_encode(&a, "progress", value, sizeof value, now, now + 5000, wire, sizeof wire);
    CHECK(n == VISC_RECORD_OVERHEAD + (int)sizeof value);
    visc_record r;
    CHECK(visc_record_parse(&a, "progress", wire, (size_t)n, now + 10, &r) == 0);
    CHECK(memcmp(r.signer, self.public_key, VISC_KEY_BYTES) == 0);
    CHECK(r.issued_ms == now && r.expires_ms == now + 5000);
    CHECK(r.value_len == sizeof value && memcmp(r.value, value, sizeof value) == 0);
    /* an empty value and the largest value */
    CHECK(visc_record_encode(&a, "progress", NULL, 0, now, now + 1, wire, sizeof wire) ==
          VISC_RECORD_OVERHEAD);
    CHECK(visc_record_parse(&a, "progress", wire, VISC_RECORD_OVERHEAD, now, &r) == 0);
    CHECK(r.value_len == 0);
    static uint8_t big[VISC_RECORD_MAX_VALUE];
    memset(big, 0xab, sizeof big);
    n = visc_record_encode(&a, "progress", big, sizeof big, now, now + 1000, wire, sizeof wire);
    CHECK(n == VISC_RECORD_OVERHEAD + VISC_RECORD_MAX_VALUE);
    CHECK(visc_record_parse(&a, "progress", wire, (size_t)n, now, &r) == 0);
    CHECK(r.value_len == sizeof big && r.value[sizeof big - 1] == 0xab);
    visc_swarm_auth_free(&a);
}

TEST(record_encode_refuses_misuse) {
    visc_swarm_auth a;
    visc_identity self;
    make_auth(&a, &self, "run-a");
    uint64_t now = visc_unix_ms();
    static uint8_t big[VISC_RECORD_MAX_VALUE + 1];
    CHECK(visc_record_encode(&a, "k", big, sizeof big, now, now + 1, wire, sizeof wire) == -1);
    CHECK(strstr(visc_last_error(), "over the cap") != NULL);
    CHECK(visc_record_encode(&a, "k", "x", 1, now, now, wire, sizeof wire) == -1);
    CHECK(visc_record_encode(&a, "k", "x", 1, now, now + 1, wire, VISC_RECORD_OVERHEAD) == -1);
    CHECK(strstr(visc_last_error(), "buffer") != NULL);
    visc_swarm_auth_free(&a);
}

TEST(record_every_corruption_rejected) {
    visc_swarm_auth a;
    visc_identity self;
    make_auth(&a, &self, "run-a");
    uint64_t now = visc_unix_ms();
    const char value[] = "hello";
    int n =
        visc_record_encode(&a, "progress", value, sizeof value, now, now + 5000, wire, sizeof wire);
    CHECK(n == VISC_RECORD_OVERHEAD + (int)sizeof value);
    if (n != VISC_RECORD_OVERHEAD + (int)sizeof value) return;
    static uint8_t bad[sizeof wire];
    /* every byte flipped: some field's check or the signature catches it */
    for (int i = 0; i < n; i++) {
        memcpy(bad, wire, (size_t)n);
        bad[i] ^= 0x40;
        visc_record r;
        CHECK_MSG(visc_record_parse(&a, "progress", bad, (size_t)n, now, &r) == -1,
                  "byte %d flipped was accepted", i);
    }
    /* each field with its own reason */
    memcpy(bad, wire, (size_t)n);
    bad[0] = 'X';
    expect_reject(&a, bad, (size_t)n, now, "bad magic");
    memcpy(bad, wire, (size_t)n);
    bad[4] = 2;
    expect_reject(&a, bad, (size_t)n, now, "version 2");
    memcpy(bad, wire, (size_t)n);
    bad[5] ^= 1;
    expect_reject(&a, bad, (size_t)n, now, "another run");
    memcpy(bad, wire, (size_t)n);
    bad[5 + 32] ^= 1;
    expect_reject(&a, bad, (size_t)n, now, "another key");
    memcpy(bad, wire, (size_t)n);
    bad[5 + 64] ^= 1; /* signer */
    expect_reject(&a, bad, (size_t)n, now, "bad signature");
    memcpy(bad, wire, (size_t)n);
    bad[5 + 96] ^= 1; /* issued_ms */
    expect_reject(&a, bad, (size_t)n, now, "bad signature");
    memcpy(bad, wire, (size_t)n);
    bad[5 + 104] ^= 1; /* expires_ms */
    expect_reject(&a, bad, (size_t)n, now, "bad signature");
    memcpy(bad, wire, (size_t)n);
    bad[n - 1] ^= 1; /* signature */
    expect_reject(&a, bad, (size_t)n, now, "bad signature");
    memcpy(bad, wire, (size_t)n);
    bad[5 + 112 + 4] ^= 1; /* value */
    expect_reject(&a, bad, (size_t)n, now, "bad signature");
    /* value length: oversize, past the end, short of the end */
    const int len_at = 5 + 112;
    memcpy(bad, wire, (size_t)n);
    bad[len_at + 3] = 0x80;
    expect_reject(&a, bad, (size_t)n, now, "over the cap");
    memcpy(bad, wire, (size_t)n);
    bad[len_at] = 200;
    expect_reject(&a, bad, (size_t)n, now, "past the end");
    memcpy(bad, wire, (size_t)n);
    bad[len_at] = 2;
    expect_reject(&a, bad, (size_t)n, now, "token length");
    /* token length that is neither 0 nor a token */
    memcpy(bad, wire, (size_t)n);
    bad[len_at + 4 + sizeof value] = 7;
    expect_reject(&a, bad, (size_t)n, now, "token length 7");
    /* truncated at every length, and trailing bytes */
    for (int cut = 0; cut < n; cut++) {
        visc_record r;
        CHECK_MSG(visc_record_parse(&a, "progress", wire, (size_t)cut, now, &r) == -1,
                  "truncated to %d accepted", cut);
    }
    expect_reject(&a, wire, 10, now, "truncated");
    memcpy(bad, wire, (size_t)n);
    expect_reject(&a, bad, (size_t)n + 1, now, "its lengths say");
    expect_reject(&a, bad, VISC_RECORD_MAX_WIRE + 1, now, "over the cap");
    /* asked under another key */
    visc_record r;
    CHECK(visc_record_parse(&a, "other", wire, (size_t)n, now, &r) == -1);
    CHECK(strstr(visc_last_error(), "another key") != NULL);
    visc_swarm_auth_free(&a);
}

TEST(record_time_checks) {
    visc_swarm_auth a;
    visc_identity self;
    make_auth(&a, &self, "run-a");
    uint64_t now = visc_unix_ms();
    int n = visc_record_encode(&a, "progress", "v", 1, now, now + 5000, wire, sizeof wire);
    expect_reject(&a, wire, (size_t)n, now + 5000, "expired");
    expect_reject(&a, wire, (size_t)n, now + 60000, "expired");
    /* issued too far ahead of the reader's clock */
    expect_reject(&a, wire, (size_t)n, now - VISC_RECORD_MAX_SKEW_MS - 1, "in the future");
    /* expiring too far ahead */
    n = visc_record_encode(&a, "progress", "v", 1, now, now + VISC_RECORD_MAX_TTL_MS + 1000, wire,
                           sizeof wire);
    CHECK(n > 0);
    expect_reject(&a, wire, (size_t)n, now, "over the cap");
    visc_record r;
    CHECK(visc_record_parse(&a, "progress", wire, (size_t)n, now + 2000, &r) == 0);
    visc_swarm_auth_free(&a);
}

TEST(record_signer_must_be_admitted) {
    visc_swarm_auth a, b;
    visc_identity self, stranger;
    make_auth(&a, &self, "run-a");
    make_auth(&b, &stranger, "run-a"); /* same run and secret, not on a's allowlist */
    uint64_t now = visc_unix_ms();
    int n = visc_record_encode(&b, "progress", "v", 1, now, now + 5000, wire, sizeof wire);
    expect_reject(&a, wire, (size_t)n, now, "not admitted");
    /* admitted by an owner token it carries */
    visc_identity owner;
    CHECK(visc_identity_generate(&owner) == 0);
    a.has_owner = 1;
    memcpy(a.owner_key, owner.public_key, VISC_KEY_BYTES);
    visc_token_sign(&owner, stranger.public_key, "run-a", (uint64_t)(now / 1000) + 3600, b.token);
    b.has_token = 1;
    n = visc_record_encode(&b, "progress", "v", 1, now, now + 5000, wire, sizeof wire);
    CHECK(n == VISC_RECORD_OVERHEAD + VISC_TOKEN_BYTES + 1);
    visc_record r;
    CHECK(visc_record_parse(&a, "progress", wire, (size_t)n, now, &r) == 0);
    CHECK(memcmp(r.signer, stranger.public_key, VISC_KEY_BYTES) == 0);
    /* a token for another peer does not admit */
    visc_token_sign(&owner, self.public_key, "run-a", (uint64_t)(now / 1000) + 3600, b.token);
    n = visc_record_encode(&b, "progress", "v", 1, now, now + 5000, wire, sizeof wire);
    expect_reject(&a, wire, (size_t)n, now, "not admitted");
    visc_swarm_auth_free(&a);
    visc_swarm_auth_free(&b);
}

TEST(record_needs_the_swarm_secret) {
    /* secret-only swarms admit anyone who knows the secret: a record signed
     * without it (any key) must not verify */
    visc_identity x, y;
    CHECK(visc_identity_generate(&x) == 0 && visc_identity_generate(&y) == 0);
    visc_swarm_auth a, outsider, other_run;
    CHECK(visc_swarm_auth_init(&a, "run-a", &x) == 0);
    CHECK(visc_swarm_auth_set_secret(&a, "the right secret, 16+ bytes", 27) == 0);
    CHECK(visc_swarm_auth_init(&outsider, "run-a", &y) == 0);
    CHECK(visc_swarm_auth_set_secret(&outsider, "a wrong secret, also 16+ bytes", 30) == 0);
    CHECK(visc_swarm_auth_init(&other_run, "run-b", &y) == 0);
    CHECK(visc_swarm_auth_set_secret(&other_run, "the right secret, 16+ bytes", 27) == 0);
    uint64_t now = visc_unix_ms();
    int n = visc_record_encode(&a, "progress", "v", 1, now, now + 5000, wire, sizeof wire);
    visc_record r;
    CHECK(visc_record_parse(&a, "progress", wire, (size_t)n, now, &r) == 0);
    n = visc_record_encode(&outsider, "progress", "v", 1, now, now + 5000, wire, sizeof wire);
    expect_reject(&a, wire, (size_t)n, now, "bad signature");
    n = visc_record_encode(&other_run, "progress", "v", 1, now, now + 5000, wire, sizeof wire);
    expect_reject(&a, wire, (size_t)n, now, "another run");
    /* no secret at all: the outsider signs a plain digest */
    outsider.has_secret = 0;
    n = visc_record_encode(&outsider, "progress", "v", 1, now, now + 5000, wire, sizeof wire);
    expect_reject(&a, wire, (size_t)n, now, "bad signature");
    visc_swarm_auth_free(&a);
    visc_swarm_auth_free(&outsider);
    visc_swarm_auth_free(&other_run);
}

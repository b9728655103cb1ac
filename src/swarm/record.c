/* record.c: encoding, signing, parsing and validation of DHT records
 * (format in record.h). Everything read here came from the network. */
#include "record.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "visc/core.h"

#define RECORD_MAGIC "VSRC"
#define RECORD_VERSION 1
/* Offsets of the fixed fields. */
#define OFF_RUN 5
#define OFF_KEY (OFF_RUN + 32)
#define OFF_SIGNER (OFF_KEY + 32)
#define OFF_ISSUED (OFF_SIGNER + 32)
#define OFF_EXPIRES (OFF_ISSUED + 8)
#define OFF_VALUE_LEN (OFF_EXPIRES + 8)
#define OFF_VALUE (OFF_VALUE_LEN + 4)

uint64_t visc_unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void visc_record_key_hash(const visc_swarm_auth *a, const char *key, uint8_t out[32]) {
    crypto_generichash(out, 32, (const uint8_t *)key, strlen(key), a->run_hash, sizeof a->run_hash);
}

/* What the signature covers: a digest of the body, keyed with the swarm
 * secret when there is one, so a record proves its signer knows it. */
static void signed_digest(const visc_swarm_auth *a, const uint8_t *body, size_t n,
                          uint8_t out[64]) {
    crypto_generichash(out, 64, body, n, a->has_secret ? a->secret : NULL,
                       a->has_secret ? sizeof a->secret : 0);
}

int visc_record_encode(const visc_swarm_auth *a, const char *key, const void *value, size_t n,
                       uint64_t issued_ms, uint64_t expires_ms, uint8_t *out, size_t cap) {
    if (sodium_init() < 0) return visc_set_error("record: libsodium failed to initialize");
    if (n > VISC_RECORD_MAX_VALUE)
        return visc_set_error("record: value of %zu bytes over the cap of %d", n,
                              VISC_RECORD_MAX_VALUE);
    if (expires_ms <= issued_ms) return visc_set_error("record: expires before it is issued");
    size_t token_len = a->has_token ? VISC_TOKEN_BYTES : 0;
    size_t total = VISC_RECORD_OVERHEAD + n + token_len;
    if (cap < total) return visc_set_error("record: buffer of %zu bytes, needs %zu", cap, total);
    memcpy(out, RECORD_MAGIC, 4);
    out[4] = RECORD_VERSION;
    memcpy(out + OFF_RUN, a->run_hash, 32);
    visc_record_key_hash(a, key, out + OFF_KEY);
    memcpy(out + OFF_SIGNER, a->self.public_key, 32);
    put_u64(out + OFF_ISSUED, issued_ms);
    put_u64(out + OFF_EXPIRES, expires_ms);
    put_u32(out + OFF_VALUE_LEN, (uint32_t)n);
    if (n) memcpy(out + OFF_VALUE, value, n);
    uint8_t *p = out + OFF_VALUE + n;
    p[0] = (uint8_t)token_len;
    p[1] = (uint8_t)(token_len >> 8);
    if (token_len) memcpy(p + 2, a->token, token_len);
    size_t body = total - crypto_sign_BYTES;
    uint8_t digest[64];
    signed_digest(a, out, body, digest);
    crypto_sign_detached(out + body, NULL, digest, sizeof digest, a->self.secret_key);
    return (int)total;
}

int visc_record_parse(const visc_swarm_auth *a, const char *key, const uint8_t *wire, size_t n,
                      uint64_t now_ms, visc_record *out) {
    if (sodium_init() < 0) return visc_set_error("record: libsodium failed to initialize");
    if (n < VISC_RECORD_OVERHEAD)
        return visc_set_error("record: truncated (%zu bytes, at least %d)", n,
                              VISC_RECORD_OVERHEAD);
    if (n > VISC_RECORD_MAX_WIRE)
        return visc_set_error("record: %zu bytes, over the cap of %d", n, VISC_RECORD_MAX_WIRE);
    if (memcmp(wire, RECORD_MAGIC, 4) != 0) return visc_set_error("record: bad magic");
    if (wire[4] != RECORD_VERSION)
        return visc_set_error("record: version %d, expected %d", wire[4], RECORD_VERSION);
    if (memcmp(wire + OFF_RUN, a->run_hash, 32) != 0)
        return visc_set_error("record: for another run");
    uint8_t key_hash[32];
    visc_record_key_hash(a, key, key_hash);
    if (memcmp(wire + OFF_KEY, key_hash, 32) != 0)
        return visc_set_error("record: for another key than \"%s\"", key);
    uint32_t value_len = get_u32(wire + OFF_VALUE_LEN);
    if (value_len > VISC_RECORD_MAX_VALUE)
        return visc_set_error("record: value length %u over the cap of %d", value_len,
                              VISC_RECORD_MAX_VALUE);
    size_t fixed = VISC_RECORD_OVERHEAD + value_len; /* no overflow: value_len is capped */
    if (n < fixed)
        return visc_set_error("record: value length %u past the end (%zu bytes)", value_len, n);
    const uint8_t *tok = wire + OFF_VALUE + value_len;
    size_t token_len = (size_t)tok[0] | (size_t)tok[1] << 8;
    if (token_len != 0 && token_len != VISC_TOKEN_BYTES)
        return visc_set_error("record: token length %zu (0 or %d)", token_len, VISC_TOKEN_BYTES);
    if (n != fixed + token_len)
        return visc_set_error("record: %zu bytes, its lengths say %zu", n, fixed + token_len);
    size_t body = n - crypto_sign_BYTES;
    uint8_t digest[64];
    signed_digest(a, wire, body, digest);
    const uint8_t *signer = wire + OFF_SIGNER;
    if (crypto_sign_verify_detached(wire + body, digest, sizeof digest, signer) != 0)
        return visc_set_error("record: bad signature (or signed without the swarm secret)");
    uint64_t issued = get_u64(wire + OFF_ISSUED), expires = get_u64(wire + OFF_EXPIRES);
    if (expires <= issued) return visc_set_error("record: expires before it was issued");
    if (issued > now_ms + VISC_RECORD_MAX_SKEW_MS)
        return visc_set_error("record: issued %llu ms in the future",
                              (unsigned long long)(issued - now_ms));
    if (expires <= now_ms) return visc_set_error("record: expired");
    if (expires - now_ms > VISC_RECORD_MAX_TTL_MS)
        return visc_set_error("record: expires %llu s ahead, over the cap of %llu s",
                              (unsigned long long)((expires - now_ms) / 1000),
                              (unsigned long long)(VISC_RECORD_MAX_TTL_MS / 1000));
    if (visc_swarm_auth_admit(a, signer, token_len ? tok + 2 : NULL, token_len) != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", visc_last_error());
        return visc_set_error("record: signer not admitted (%s)", why);
    }
    memcpy(out->signer, signer, VISC_KEY_BYTES);
    out->issued_ms = issued;
    out->expires_ms = expires;
    out->value_len = value_len;
    if (value_len) memcpy(out->value, wire + OFF_VALUE, value_len);
    return 0;
}

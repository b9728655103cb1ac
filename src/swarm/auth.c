/* auth.c: swarm credentials and the rule for who may join.
 *
 * Two independent gates, either or both configured:
 *  - a shared secret: proven in the handshake (channel.c), mixed into the
 *    session keys; nothing to check here beyond that it exists;
 *  - an allowlist of public keys and/or a run-owner key: a peer's key must
 *    be listed, or it must present a token the owner signed for this run,
 *    for this key, that has not expired.
 * Token layout (VISC_TOKEN_BYTES = 140):
 *   0 "VTK1" | 4 peer key (32) | 36 run hash (32) | 68 expiry, unix s, u64 LE
 *   | 76 Ed25519 signature (64) over "visc-swarm-token-v1" || bytes 0..75. */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "visc/core.h"
#include "visc/swarm.h"

#define TOKEN_MAGIC "VTK1"
#define TOKEN_DOMAIN "visc-swarm-token-v1"
#define TOKEN_SIGNED 76
#define SECRET_FILE_MAX (1u << 20)
#define ALLOWLIST_FILE_MAX (1u << 20)
#define ALLOWLIST_MAX_KEYS 65536

int visc_swarm_auth_init(visc_swarm_auth *a, const char *run_id, const visc_identity *self) {
    memset(a, 0, sizeof *a);
    if (sodium_init() < 0) return visc_set_error("libsodium failed to initialize");
    size_t n = strnlen(run_id, sizeof a->run_id);
    if (n == 0 || n >= sizeof a->run_id)
        return visc_set_error("run id must be 1..%zu characters", sizeof a->run_id - 1);
    memcpy(a->run_id, run_id, n);
    crypto_generichash(a->run_hash, sizeof a->run_hash, (const uint8_t *)run_id, n, NULL, 0);
    a->self = *self;
    a->encrypt = 1;
    return 0;
}

int visc_swarm_auth_set_secret(visc_swarm_auth *a, const void *bytes, size_t n) {
    if (n < 16)
        return visc_set_error("swarm secret of %zu bytes is too short (at least 16 random bytes)",
                              n);
    crypto_generichash(a->secret, sizeof a->secret, bytes, n, NULL, 0);
    a->has_secret = 1;
    return 0;
}

int visc_swarm_auth_set_secret_file(visc_swarm_auth *a, const char *path) {
    uint8_t *buf = visc_malloc(SECRET_FILE_MAX + 1, "swarm secret file");
    size_t n = 0;
    int rc = visc_read_private_file(path, "swarm secret file", buf, SECRET_FILE_MAX + 1, &n);
    if (rc == 0 && n > SECRET_FILE_MAX)
        rc =
            visc_set_error("swarm secret file '%s' is larger than %u bytes", path, SECRET_FILE_MAX);
    if (rc == 0 && n < 16)
        rc = visc_set_error("swarm secret file '%s' holds %zu bytes; at least 16 random bytes "
                            "are needed",
                            path, n);
    if (rc == 0) rc = visc_swarm_auth_set_secret(a, buf, n);
    sodium_memzero(buf, n);
    free(buf);
    return rc;
}

static int is_allowed(const visc_swarm_auth *a, const uint8_t pk[VISC_KEY_BYTES]) {
    for (int i = 0; i < a->n_allowed; i++)
        if (memcmp(a->allowed[i], pk, VISC_KEY_BYTES) == 0) return 1;
    return 0;
}

int visc_swarm_auth_allow(visc_swarm_auth *a, const uint8_t pk[VISC_KEY_BYTES]) {
    if (is_allowed(a, pk)) return 0;
    if (a->n_allowed >= ALLOWLIST_MAX_KEYS)
        return visc_set_error("allowlist holds more than %d keys", ALLOWLIST_MAX_KEYS);
    a->allowed =
        visc_realloc(a->allowed, (size_t)(a->n_allowed + 1) * VISC_KEY_BYTES, "swarm allowlist");
    memcpy(a->allowed[a->n_allowed++], pk, VISC_KEY_BYTES);
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

int visc_swarm_auth_allow_text(visc_swarm_auth *a, const char *text, size_t n, const char *source) {
    size_t pos = 0;
    for (int line = 1; pos < n; line++) {
        size_t end = pos;
        while (end < n && text[end] != '\n') end++;
        size_t b = pos, e = end;
        for (size_t i = b; i < e; i++)
            if (text[i] == '#') e = i;
        while (b < e && is_space(text[b])) b++;
        while (e > b && is_space(text[e - 1])) e--;
        if (e > b) {
            char hex[2 * VISC_KEY_BYTES + 1];
            uint8_t pk[VISC_KEY_BYTES];
            if (e - b != 2 * VISC_KEY_BYTES)
                return visc_set_error("%s:%d: expected a public key (%d hex digits), got %zu "
                                      "characters",
                                      source, line, 2 * VISC_KEY_BYTES, e - b);
            memcpy(hex, text + b, e - b);
            hex[e - b] = 0;
            if (visc_public_key_parse_hex(hex, pk) != 0)
                return visc_set_error("%s:%d: not a hex public key", source, line);
            if (visc_swarm_auth_allow(a, pk) != 0)
                return visc_set_error("%s:%d: %s", source, line, visc_last_error());
        }
        pos = end + 1;
    }
    return 0;
}

int visc_swarm_auth_allow_file(visc_swarm_auth *a, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return visc_set_error("cannot read allowlist '%s'", path);
    char *buf = visc_malloc(ALLOWLIST_FILE_MAX + 1, "allowlist file");
    size_t n = fread(buf, 1, ALLOWLIST_FILE_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    int rc;
    if (bad) rc = visc_set_error("cannot read allowlist '%s'", path);
    else if (n > ALLOWLIST_FILE_MAX)
        rc = visc_set_error("allowlist '%s' is larger than %u bytes", path, ALLOWLIST_FILE_MAX);
    else rc = visc_swarm_auth_allow_text(a, buf, n, path);
    free(buf);
    return rc;
}

void visc_swarm_auth_free(visc_swarm_auth *a) {
    free(a->allowed);
    sodium_memzero(a, sizeof *a);
}

static void token_message(const uint8_t *token,
                          uint8_t msg[sizeof TOKEN_DOMAIN - 1 + TOKEN_SIGNED]) {
    memcpy(msg, TOKEN_DOMAIN, sizeof TOKEN_DOMAIN - 1);
    memcpy(msg + sizeof TOKEN_DOMAIN - 1, token, TOKEN_SIGNED);
}

void visc_token_sign(const visc_identity *owner, const uint8_t peer_key[VISC_KEY_BYTES],
                     const char *run_id, uint64_t expires_unix, uint8_t token[VISC_TOKEN_BYTES]) {
    memcpy(token, TOKEN_MAGIC, 4);
    memcpy(token + 4, peer_key, VISC_KEY_BYTES);
    crypto_generichash(token + 36, 32, (const uint8_t *)run_id, strlen(run_id), NULL, 0);
    for (int i = 0; i < 8; i++) token[68 + i] = (uint8_t)(expires_unix >> (8 * i));
    uint8_t msg[sizeof TOKEN_DOMAIN - 1 + TOKEN_SIGNED];
    token_message(token, msg);
    crypto_sign_detached(token + TOKEN_SIGNED, NULL, msg, sizeof msg, owner->secret_key);
}

int visc_token_check(const visc_swarm_auth *a, const uint8_t peer_key[VISC_KEY_BYTES],
                     const uint8_t *token, size_t n, uint64_t now_unix) {
    if (n != VISC_TOKEN_BYTES || memcmp(token, TOKEN_MAGIC, 4) != 0)
        return visc_set_error("token malformed (%zu bytes, expected %d starting \"VTK1\")", n,
                              VISC_TOKEN_BYTES);
    if (!a->has_owner) return visc_set_error("token not accepted: no run owner key configured");
    uint8_t msg[sizeof TOKEN_DOMAIN - 1 + TOKEN_SIGNED];
    token_message(token, msg);
    if (crypto_sign_verify_detached(token + TOKEN_SIGNED, msg, sizeof msg, a->owner_key) != 0)
        return visc_set_error("token not signed by the run owner");
    if (sodium_memcmp(token + 36, a->run_hash, 32) != 0)
        return visc_set_error("token is for another run");
    if (sodium_memcmp(token + 4, peer_key, VISC_KEY_BYTES) != 0)
        return visc_set_error("token is for another peer key");
    uint64_t expires = 0;
    for (int i = 0; i < 8; i++) expires |= (uint64_t)token[68 + i] << (8 * i);
    if (expires <= now_unix)
        return visc_set_error("token expired %llu s ago", (unsigned long long)(now_unix - expires));
    return 0;
}

int visc_swarm_auth_admit(const visc_swarm_auth *a, const uint8_t peer_key[VISC_KEY_BYTES],
                          const uint8_t *token, size_t token_len) {
    if (a->n_allowed == 0 && !a->has_owner) {
        /* the secret alone admits; the handshake has proven it */
        if (a->has_secret) return 0;
        return visc_set_error("swarm has neither a secret nor an allowlist: nobody is admitted");
    }
    if (is_allowed(a, peer_key)) return 0;
    char id[VISC_PEER_ID_CHARS + 1];
    visc_peer_id(peer_key, id);
    if (!token || token_len == 0)
        return visc_set_error("peer %s: not on the allowlist and no valid token (none presented)",
                              id);
    time_t now = time(NULL);
    if (visc_token_check(a, peer_key, token, token_len, now < 0 ? 0 : (uint64_t)now) != 0)
        return visc_set_error("peer %s: not on the allowlist and no valid token (%s)", id,
                              visc_last_error());
    return 0;
}

int visc_swarm_auth_check_config(const visc_swarm_auth *a) {
    if (!a->run_id[0]) return visc_set_error("swarm credentials: no run id");
    if (!a->has_secret && a->n_allowed == 0 && !a->has_owner)
        return visc_set_error("swarm credentials: neither a swarm secret nor an allowlist or "
                              "owner key is configured, so anyone could join; refusing");
    return 0;
}

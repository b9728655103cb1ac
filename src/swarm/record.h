/* record.h: small signed records published on the DHT.
 *
 * Wire form (little-endian): magic "VSRC", version (1 byte), run hash (32),
 * key hash (32), signer public key (32), issued_ms (u64, unix ms), expires_ms
 * (u64), value length (u32), value, token length (u16: 0 or
 * VISC_TOKEN_BYTES), token (the signer's owner-signed access token, when it
 * has one: a token-admitted peer must show it to be admitted), Ed25519
 * signature (64) over BLAKE2b-512 of everything before it, keyed with the
 * swarm secret when the swarm has one (so that without the secret no one
 * can make a record that verifies, whatever key they sign with).
 *
 * A record is valid when its signature verifies, its run and key hashes
 * match what was asked for, it was issued before its expiry and not more
 * than VISC_RECORD_MAX_SKEW_MS ahead of our clock, it has not expired, its
 * expiry is not further than VISC_RECORD_MAX_TTL_MS ahead, its signer is
 * admitted by the swarm's credentials (visc_swarm_auth_admit, with the
 * token it carries), and its value is at most VISC_RECORD_MAX_VALUE bytes.
 * Among valid records of one signer under one key, the newest issued_ms
 * wins (dht.c). */
#ifndef VISC_SWARM_RECORD_H
#define VISC_SWARM_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "visc/swarm.h"

#define VISC_RECORD_MAX_VALUE 4096
#define VISC_RECORD_MAX_TTL_MS (3600ull * 1000)
/* Clocks of peers must agree this well: a record issued further ahead is
 * refused (it would otherwise win "newest" until it expires). */
#define VISC_RECORD_MAX_SKEW_MS (60ull * 1000)
/* Fixed part of the wire form: everything but the value and the token. */
#define VISC_RECORD_OVERHEAD (4 + 1 + 32 + 32 + 32 + 8 + 8 + 4 + 2 + 64)
/* The largest record: a buffer of this size always holds one. */
#define VISC_RECORD_MAX_WIRE (VISC_RECORD_OVERHEAD + VISC_TOKEN_BYTES + VISC_RECORD_MAX_VALUE)

typedef struct {
    uint8_t signer[VISC_KEY_BYTES];
    uint64_t issued_ms, expires_ms;
    uint32_t value_len;
    uint8_t value[VISC_RECORD_MAX_VALUE];
} visc_record;

/* Wall-clock time (records expire by it, so peers' clocks must roughly agree). */
uint64_t visc_unix_ms(void);
/* The key hash of a record key (a string such as "progress" or "mm.17"):
 * BLAKE2b-256 keyed with the run hash. */
void visc_record_key_hash(const visc_swarm_auth *a, const char *key, uint8_t out[32]);
/* Encodes and signs with a->self (and a->token when a->has_token); returns
 * the wire size or -1. cap >= VISC_RECORD_MAX_WIRE always suffices. */
int visc_record_encode(const visc_swarm_auth *a, const char *key, const void *value, size_t n,
                       uint64_t issued_ms, uint64_t expires_ms, uint8_t *out, size_t cap);
/* Parses and validates (see above) at time now_ms. 0 or -1 with the reason. */
int visc_record_parse(const visc_swarm_auth *a, const char *key, const uint8_t *wire, size_t n,
                      uint64_t now_ms, visc_record *out);

#endif

/* fuzz_swarm_token.c: libFuzzer target for the two credential parsers fed
 * from outside: access tokens (inside a stranger's hello) and allowlist
 * files. `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_swarm_token fuzz/corpus/fuzz_swarm_token
 * Input: 'T' then a token (checked for the peer key of fixed seed 3 against
 * the owner of seed 2, at unix time 1e9), or 'A' then allowlist text.
 * A token that passes must say what it admits; an allowlist that parses
 * holds no more keys than it has lines, each listed once. */
#include <sodium.h>
#include <stdint.h>
#include <string.h>

#include "visc/core.h"
#include "visc/swarm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void seeded(visc_identity *id, uint8_t seed_byte) {
    uint8_t seed[32];
    memset(seed, seed_byte, sizeof seed);
    crypto_sign_seed_keypair(id->public_key, id->secret_key, seed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || sodium_init() < 0) return 0;
    visc_identity self, owner, peer;
    seeded(&self, 1);
    seeded(&owner, 2);
    seeded(&peer, 3);
    visc_swarm_auth a;
    if (visc_swarm_auth_init(&a, "fuzz-run", &self) != 0) return 0;
    a.has_owner = 1;
    memcpy(a.owner_key, owner.public_key, VISC_KEY_BYTES);
    if (data[0] == 'T') {
        const uint64_t now = 1000000000u;
        if (visc_token_check(&a, peer.public_key, data + 1, size - 1, now) == 0) {
            VISC_ASSERT(size - 1 == VISC_TOKEN_BYTES);
            VISC_ASSERT(memcmp(data + 1 + 4, peer.public_key, VISC_KEY_BYTES) == 0);
            VISC_ASSERT(memcmp(data + 1 + 36, a.run_hash, 32) == 0);
        }
    } else if (data[0] == 'A') {
        if (visc_swarm_auth_allow_text(&a, (const char *)data + 1, size - 1, "fuzz") == 0) {
            int lines = 1;
            for (size_t i = 1; i < size; i++) lines += data[i] == '\n';
            VISC_ASSERT(a.n_allowed <= lines);
            for (int i = 0; i < a.n_allowed; i++)
                for (int j = 0; j < i; j++)
                    VISC_ASSERT(memcmp(a.allowed[i], a.allowed[j], VISC_KEY_BYTES) != 0);
        }
    }
    visc_swarm_auth_free(&a);
    return 0;
}

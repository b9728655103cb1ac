/* fuzz_swarm_hello.c: libFuzzer target for the channel handshake's hello,
 * the first bytes a stranger sends to a peer. `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_swarm_hello fuzz/corpus/fuzz_swarm_hello
 * Input: one byte choosing this peer's credentials (bit 0 encrypt, bit 1
 * secret, bit 2 an allowlist naming the corpus's peer key, bit 3 an owner
 * key for tokens), then the hello. Keys come from fixed seeds, so the seed
 * corpus holds hellos (and tokens) that pass. A hello that parses must
 * name a peer this configuration admits. */
#include <sodium.h>
#include <stdint.h>
#include <string.h>

#include "../src/swarm/channel.h"
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
    uint8_t mode = data[0];
    a.encrypt = mode & 1;
    if (mode & 2) visc_swarm_auth_set_secret(&a, "fuzz-swarm-secret", 17);
    if (mode & 4) visc_swarm_auth_allow(&a, peer.public_key);
    if (mode & 8) {
        a.has_owner = 1;
        memcpy(a.owner_key, owner.public_key, VISC_KEY_BYTES);
    }
    uint8_t key[VISC_KEY_BYTES];
    if (visc_chan_parse_hello(data + 1, size - 1, &a, key) == 0) {
        VISC_ASSERT(visc_swarm_auth_check_config(&a) == 0);
        VISC_ASSERT(memcmp(key, data + 1 + 72, VISC_KEY_BYTES) == 0);
        VISC_ASSERT(memcmp(data + 1 + 8, a.run_hash, 32) == 0);
    }
    visc_swarm_auth_free(&a);
    return 0;
}

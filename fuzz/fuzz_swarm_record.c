/* fuzz_swarm_record.c: libFuzzer target for DHT records (src/swarm/record.c):
 * bytes any DHT node may store under our keys. `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_swarm_record fuzz/corpus/fuzz_swarm_record
 * The swarm's credentials are fixed (seeded key, secret, allowlist), so the
 * corpus holds records that verify. A record that parses must be in range;
 * every input must be rejected or accepted without a crash. */
#include <stdint.h>
#include <string.h>

#include <sodium.h>

#include "../src/swarm/record.h"
#include "visc/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The corpus was written at FUZZ_NOW_MS with this swarm (see
 * make_corpus() below, compiled with -DFUZZ_WRITE_CORPUS). */
#define FUZZ_NOW_MS 1700000000000ull

static visc_swarm_auth auth;

static void setup(void) {
    static int done;
    if (done) return;
    done = 1;
    VISC_ASSERT(sodium_init() >= 0);
    uint8_t seed[crypto_sign_SEEDBYTES] = {7};
    visc_identity id;
    crypto_sign_seed_keypair(id.public_key, id.secret_key, seed);
    VISC_ASSERT(visc_swarm_auth_init(&auth, "fuzz-run", &id) == 0);
    VISC_ASSERT(visc_swarm_auth_set_secret(&auth, "fuzz swarm secret", 17) == 0);
    VISC_ASSERT(visc_swarm_auth_allow(&auth, id.public_key) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    visc_record r;
    if (visc_record_parse(&auth, "progress", data, size, FUZZ_NOW_MS, &r) == 0) {
        VISC_ASSERT(r.value_len <= VISC_RECORD_MAX_VALUE);
        VISC_ASSERT(r.expires_ms > FUZZ_NOW_MS && r.issued_ms < r.expires_ms);
        VISC_ASSERT(r.expires_ms - FUZZ_NOW_MS <= VISC_RECORD_MAX_TTL_MS);
    }
    return 0;
}

#ifdef FUZZ_WRITE_CORPUS
#include <stdio.h>
int main(int argc, char **argv);
int main(int argc, char **argv) {
    setup();
    static uint8_t wire[VISC_RECORD_MAX_WIRE];
    const char *values[] = {"epoch=3 samples=128", "", "x"};
    for (int i = 0; i < 3; i++) {
        int n =
            visc_record_encode(&auth, "progress", values[i], strlen(values[i]), FUZZ_NOW_MS - 1000,
                               FUZZ_NOW_MS + 60000 * (i + 1), wire, sizeof wire);
        char path[512];
        snprintf(path, sizeof path, "%s/record_%d", argc > 1 ? argv[1] : ".", i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(wire, 1, (size_t)n, f) != (size_t)n) return 1;
        fclose(f);
    }
    return 0;
}
#endif

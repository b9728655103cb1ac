/* fuzz_swarm_progress.c: libFuzzer target for progress records
 * (src/swarm/progress.c): the value any admitted peer may publish under
 * "progress". `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_swarm_progress fuzz/corpus/fuzz_swarm_progress
 * A record that parses must be in range and survive encode and parse
 * unchanged; every input must be rejected or accepted without a crash. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../src/swarm/progress.h"
#include "visc/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    visc_progress_record r, back;
    if (visc_progress_parse(data, size, &r) != 0) return 0;
    VISC_ASSERT(size == VISC_PROGRESS_WIRE);
    VISC_ASSERT(r.role <= VISC_ROLE_AUX && r.paused <= 1);
    VISC_ASSERT(r.epoch <= VISC_PROGRESS_MAX_COUNT &&
                r.samples_accumulated <= VISC_PROGRESS_MAX_COUNT);
    VISC_ASSERT(r.time_ms > 0 && r.time_ms <= VISC_PROGRESS_MAX_COUNT);
    VISC_ASSERT(isfinite(r.samples_per_second) && r.samples_per_second >= 0 &&
                r.samples_per_second <= VISC_PROGRESS_MAX_SPS);
    VISC_ASSERT(!isinf(r.loss));
    VISC_ASSERT(memchr(r.addr, 0, sizeof r.addr) != NULL);
    for (const char *c = r.addr; *c; c++) VISC_ASSERT(*c > 0x20 && *c < 0x7f);
    uint8_t wire[VISC_PROGRESS_WIRE];
    VISC_ASSERT(visc_progress_encode(&r, wire) == 0);
    VISC_ASSERT(visc_progress_parse(wire, sizeof wire, &back) == 0);
    /* the same record (a NaN loss may come back with another payload) */
    VISC_ASSERT(back.epoch == r.epoch && back.samples_accumulated == r.samples_accumulated);
    VISC_ASSERT(back.samples_per_second == r.samples_per_second && back.time_ms == r.time_ms);
    VISC_ASSERT(back.role == r.role && back.paused == r.paused);
    VISC_ASSERT(memcmp(back.addr, r.addr, sizeof r.addr) == 0);
    VISC_ASSERT(memcmp(back.state_hash, r.state_hash, sizeof r.state_hash) == 0);
    VISC_ASSERT(isnan(r.loss) ? isnan(back.loss) : back.loss == r.loss);
    VISC_ASSERT(memcmp(wire, data, 39) == 0 && memcmp(wire + 43, data + 43, 96) == 0);
    return 0;
}

#ifdef FUZZ_WRITE_CORPUS
#include <stdio.h>
int main(int argc, char **argv);
int main(int argc, char **argv) {
    visc_progress_record r[3];
    memset(r, 0, sizeof r);
    r[0].epoch = 3, r[0].samples_accumulated = 128, r[0].samples_per_second = 97.5;
    r[0].time_ms = 1700000000000ull, r[0].loss = 0.75f;
    strcpy(r[0].addr, "10.0.0.2:4000");
    r[1].time_ms = 1, r[1].role = VISC_ROLE_AUX, r[1].loss = NAN;
    r[2].epoch = 1ull << 40, r[2].samples_accumulated = 1ull << 53, r[2].paused = 1;
    r[2].samples_per_second = 1e9, r[2].time_ms = 1ull << 53, r[2].role = VISC_ROLE_CLIENT;
    r[2].loss = -3.5f;
    memset(r[2].state_hash, 0xab, 32);
    strcpy(r[2].addr, "[fe80::1]:65535");
    for (int i = 0; i < 4; i++) {
        uint8_t wire[VISC_PROGRESS_WIRE];
        if (visc_progress_encode(&r[i < 3 ? i : 2], wire) != 0) return 1;
        char path[512];
        snprintf(path, sizeof path, "%s/progress_%d", argc > 1 ? argv[1] : ".", i);
        FILE *f = fopen(path, "wb");
        /* the last one truncated by one byte: a rejected neighbour */
        size_t n = i == 3 ? sizeof wire - 1 : sizeof wire;
        if (!f || fwrite(wire, 1, n, f) != n) return 1;
        fclose(f);
    }
    return 0;
}
#endif

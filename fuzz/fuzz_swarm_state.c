/* fuzz_swarm_state.c: libFuzzer target for what a state download reads from
 * the network (src/swarm/state_sync.c): a donor's STATE_REQUEST as the
 * server parses it, the signed STATE_HEADER and STATE_REFUSE as the
 * downloader parses them, and the donor order over progress records (which
 * come from other peers: their addresses need not be terminated). The first
 * byte picks the parser, the rest is the message. `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_swarm_state fuzz/corpus/fuzz_swarm_state
 * Headers are checked against the donor key seeded with {9} and a run hash
 * of 32 bytes 0x33 (the seeds are signed with these: make_corpus() below,
 * compiled with -DFUZZ_WRITE_CORPUS). What parses must be canonical
 * (encoding it again gives the same bytes); the donor order must be valid. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "../src/swarm/state_sync.h"
#include "visc/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static visc_identity donor;
static uint8_t run_hash[32];

static void setup(void) {
    static int done;
    if (done) return;
    done = 1;
    VISC_ASSERT(sodium_init() >= 0);
    uint8_t seed[crypto_sign_SEEDBYTES] = {9};
    crypto_sign_seed_keypair(donor.public_key, donor.secret_key, seed);
    memset(run_hash, 0x33, sizeof run_hash);
}

static void check_order(const uint8_t *msg, size_t n) {
    enum { MAX_RECORDS = 16 };
    visc_progress_record r[MAX_RECORDS];
    int count = (int)(n / sizeof r[0]);
    if (count > MAX_RECORDS) count = MAX_RECORDS;
    memcpy(r, msg, (size_t)count * sizeof r[0]);
    uint64_t seed = count > 0 ? r[0].epoch : 1;
    int order[MAX_RECORDS];
    for (int corroborate = 0; corroborate < 2; corroborate++) {
        int k = visc_state_donor_order(r, count, r[0].peer, corroborate, seed ? seed : 1, order);
        VISC_ASSERT(k >= 0 && k <= count);
        for (int i = 0; i < k; i++) {
            VISC_ASSERT(order[i] >= 0 && order[i] < count);
            /* cppcheck-suppress negativeIndex ; the VISC_ASSERT above aborts on it */
            const visc_progress_record *p = &r[order[i]];
            VISC_ASSERT(strnlen(p->addr, sizeof p->addr) < sizeof p->addr && p->addr[0]);
            VISC_ASSERT(i == 0 || r[order[i - 1]].epoch >= p->epoch);
            for (int j = 0; j < i; j++) VISC_ASSERT(order[j] != order[i]);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    setup();
    const uint8_t *msg = data + 1;
    size_t n = size - 1;
    uint8_t again[VISC_STATE_HEADER_BYTES];
    switch (data[0] % 4) {
    case 0: {
        visc_state_request req;
        if (visc_state_request_parse(msg, n, &req) != 0) break;
        VISC_ASSERT(req.max_bytes > 0);
        visc_state_request_encode(&req, again);
        VISC_ASSERT(n == VISC_STATE_REQUEST_BYTES && memcmp(again, msg, n) == 0);
        break;
    }
    case 1: {
        visc_state_header h;
        if (visc_state_header_parse(msg, n, run_hash, donor.public_key, &h) != 0) break;
        VISC_ASSERT(h.size > 0);
        visc_state_header_encode(&h, again);
        VISC_ASSERT(n == VISC_STATE_HEADER_BYTES && memcmp(again, msg, n) == 0);
        break;
    }
    case 2: {
        visc_state_refuse_reason why;
        if (visc_state_refuse_parse(msg, n, &why) != 0) break;
        VISC_ASSERT(why >= VISC_STATE_REFUSE_BUSY && why <= VISC_STATE_REFUSE_BAD_REQUEST);
        visc_state_refuse_encode(why, again);
        VISC_ASSERT(n == VISC_STATE_REFUSE_BYTES && memcmp(again, msg, n) == 0);
        break;
    }
    default: check_order(msg, n); break;
    }
    return 0;
}

#ifdef FUZZ_WRITE_CORPUS
#include <stdio.h>

static int write_seed(const char *dir, const char *name, uint8_t kind, const void *msg, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    int bad = fwrite(&kind, 1, 1, f) != 1 || fwrite(msg, 1, n, f) != n;
    return fclose(f) != 0 || bad;
}

int main(int argc, char **argv);
int main(int argc, char **argv) {
    setup();
    const char *dir = argc > 1 ? argv[1] : ".";
    uint8_t m[VISC_STATE_HEADER_BYTES];
    visc_state_request req = {.min_epoch = 5, .max_bytes = 1u << 20};
    visc_state_request_encode(&req, m);
    int bad = write_seed(dir, "request", 0, m, VISC_STATE_REQUEST_BYTES);
    visc_state_header h = {.epoch = 5, .size = (1u << 20) + 7};
    memset(h.hash, 0xa5, sizeof h.hash);
    visc_state_header_sign(&h, run_hash, &donor);
    visc_state_header_encode(&h, m);
    bad |= write_seed(dir, "header", 1, m, VISC_STATE_HEADER_BYTES);
    m[20] ^= 1;
    bad |= write_seed(dir, "header_altered", 1, m, VISC_STATE_HEADER_BYTES);
    visc_state_refuse_encode(VISC_STATE_REFUSE_BUSY, m);
    bad |= write_seed(dir, "refuse_busy", 2, m, VISC_STATE_REFUSE_BYTES);
    /* three records: two donors at epoch 5 with one hash, one without an address */
    visc_progress_record r[3];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 3; i++) {
        memset(r[i].peer, 0x10 + i, VISC_KEY_BYTES);
        r[i].epoch = 5;
        memset(r[i].state_hash, 0xa5, 32);
        if (i < 2) snprintf(r[i].addr, sizeof r[i].addr, "127.0.0.1:%d", 4000 + i);
    }
    bad |= write_seed(dir, "records", 3, r, sizeof r);
    return bad;
}
#endif

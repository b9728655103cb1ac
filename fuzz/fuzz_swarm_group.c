/* fuzz_swarm_group.c: libFuzzer target for the matchmaking messages a peer
 * receives from the network: the info of a JOIN or a DHT declaration, a
 * GROUP, a REJECT, and the node's OPEN frame. The first byte picks the
 * parser, the rest is the message. `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_swarm_group fuzz/corpus/fuzz_swarm_group
 * A message that parses must be usable and canonical: encoding it again
 * gives the same bytes. GROUPs are parsed as received by the peer whose
 * key is 32 bytes of 0x01 from the leader 0x02, for round 7 and a schema
 * hash of 32 bytes 0x5c (the seeds use these). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/swarm/matchmaking.h"
#include "visc/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_member(const visc_group_member *m) {
    VISC_ASSERT(strlen(m->addr) <= VISC_MM_ADDR_MAX);
    VISC_ASSERT(isfinite(m->bandwidth) && m->bandwidth > 0);
    VISC_ASSERT((m->client == 0 || m->client == 1) && (m->auxiliary == 0 || m->auxiliary == 1));
    VISC_ASSERT(!(m->client && m->auxiliary));
    VISC_ASSERT(m->client ? m->addr[0] == '\0' : m->addr[0] != '\0');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *msg = data + 1;
    size_t n = size - 1;
    static uint8_t again[VISC_MM_GROUP_MAX_BYTES];
    switch (data[0] % 4) {
    case 0: {
        visc_mm_info info;
        if (visc_mm_info_parse(msg, n, &info) != 0) break;
        VISC_ASSERT(strlen(info.addr) <= VISC_MM_ADDR_MAX);
        VISC_ASSERT(isfinite(info.bandwidth) && info.bandwidth > 0);
        int k = visc_mm_info_encode(&info, again, sizeof again);
        VISC_ASSERT(k >= 0 && (size_t)k == n && memcmp(again, msg, n) == 0);
        break;
    }
    case 1: {
        uint8_t self[VISC_KEY_BYTES], leader[VISC_KEY_BYTES], schema[32];
        memset(self, 0x01, sizeof self);
        memset(leader, 0x02, sizeof leader);
        memset(schema, 0x5c, sizeof schema);
        visc_group g;
        if (visc_mm_group_parse(msg, n, 7, schema, self, leader, &g) != 0) break;
        VISC_ASSERT(g.size >= 2 && g.size <= VISC_GROUP_MAX);
        VISC_ASSERT(g.self >= 0 && g.self < g.size &&
                    memcmp(g.members[g.self].key, self, VISC_KEY_BYTES) == 0);
        for (int i = 0; i < g.size; i++) {
            check_member(&g.members[i]);
            for (int j = 0; j < i; j++)
                VISC_ASSERT(memcmp(g.members[i].key, g.members[j].key, VISC_KEY_BYTES) != 0);
        }
        int k = visc_mm_group_encode(&g, 7, schema, again, sizeof again);
        VISC_ASSERT(k >= 0 && (size_t)k == n && memcmp(again, msg, n) == 0);
        break;
    }
    case 2: {
        visc_mm_reject_reason why;
        if (visc_mm_reject_parse(msg, n, &why) == 0)
            VISC_ASSERT(why >= VISC_MM_REJECT_FULL && why <= VISC_MM_REJECT_LAST);
        break;
    }
    default: {
        visc_purpose p;
        uint8_t tag[16];
        if (visc_open_parse(msg, n, &p, tag) == 0) {
            visc_open_encode(p, tag, again);
            VISC_ASSERT(n == VISC_OPEN_BYTES && memcmp(again, msg, n) == 0);
        }
        break;
    }
    }
    return 0;
}

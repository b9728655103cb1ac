/* swarm_join.h: waits until a test's fresh DHT nodes have joined.
 *
 * A node's routing table starts empty and fills as its bootstrap peer
 * answers; until then a put finds no node to store it and fails at once
 * (OpenDHT ends a search with no nodes). A test that puts right after
 * opening its nodes then fails only on a loaded machine: seen in CI, where
 * the first node published before the others' pings had reached it. So the
 * swarm tests first wait here: every node but the first has its bootstrap
 * peer answer, then every node stores a "probe" record and every node sees
 * all of them. */
#ifndef VISC_TESTS_SWARM_JOIN_H
#define VISC_TESTS_SWARM_JOIN_H

#include <stdio.h>
#include <time.h>

#include "../src/swarm/dht.h"
#include "visc/core.h"

/* Nodes d[0..to) where d[from..to) are new (d[0] joined through no one);
 * 0 once joined, -1 (with a line on stderr) after timeout_s. Each node
 * signs with an identity of its own: the count of probes is the count of
 * nodes. */
static inline int swarm_await_joined(visc_dht *const *d, int from, int to, double timeout_s) {
    const double until = visc_now() + timeout_s;
    const struct timespec pause = {0, 20 * 1000 * 1000};
    for (int i = from > 1 ? from : 1; i < to; i++)
        while (visc_dht_node_count(d[i]) < 1) {
            if (visc_now() > until) {
                fprintf(stderr, "node %d: its bootstrap peer never answered\n", i);
                return -1;
            }
            nanosleep(&pause, NULL);
        }
    for (int i = from; i < to; i++)
        while (visc_dht_put(d[i], "probe", "x", 1, 120, 1) != 0) {
            if (visc_now() > until) {
                fprintf(stderr, "node %d: no node stores its probe: %s\n", i, visc_last_error());
                return -1;
            }
            nanosleep(&pause, NULL);
        }
    static visc_record recs[64]; /* 4 KB each: not on the stack */
    if (to >= 64) {
        fprintf(stderr, "swarm_await_joined: %d nodes, at most 63\n", to);
        return -1;
    }
    for (int i = 0; i < to; i++)
        while (visc_dht_get(d[i], "probe", recs, 64, 1) != to) {
            if (visc_now() > until) {
                fprintf(stderr, "node %d does not see the %d probe records\n", i, to);
                return -1;
            }
            nanosleep(&pause, NULL);
        }
    return 0;
}

#endif

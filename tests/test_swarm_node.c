/* test_swarm_node.c: the swarm node's limits and failure paths (its
 * dispatch, expiry and pending cap are in test_swarm_matchmaking.c): bad
 * configurations, a listen address it cannot have, a flood of silent
 * connections beyond the accept queue, and running out of descriptors.
 * Everything on 127.0.0.1, port 0, no DHT. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../src/swarm/node.h"
#include "../src/swarm/wire.h"
#include "test.h"
#include "visc/core.h"

static const char secret[] = "node test secret, at least 16 bytes";

typedef struct {
    visc_identity id;
    visc_swarm_auth auth;
} creds;

static void creds_init(creds *c) {
    VISC_ASSERT(visc_identity_generate(&c->id) == 0);
    VISC_ASSERT(visc_swarm_auth_init(&c->auth, "node-test", &c->id) == 0);
    VISC_ASSERT(visc_swarm_auth_set_secret(&c->auth, secret, sizeof secret) == 0);
}

static int error_has(const char *what) { return strstr(visc_last_error(), what) != NULL; }

static visc_swarm_node *open_listener(const visc_swarm_auth *auth) {
    visc_swarm_node_config c = {.listen = "127.0.0.1:0", .dht_port = -1, .auth = auth};
    visc_swarm_node *n = visc_swarm_node_open(&c);
    if (!n) fprintf(stderr, "open: %s\n", visc_last_error());
    return n;
}

/* A plain TCP connection to the node that says nothing. */
static int silent_connect(const char *addr) {
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(strrchr(addr, ':') + 1))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VISC_ASSERT(fd >= 0);
    VISC_ASSERT(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    return fd;
}

/* 1 when the node has closed fd (EOF after whatever it sent), without waiting. */
static int closed_by_node(int fd) {
    uint8_t buf[512];
    for (;;) {
        ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (k == 0) return 1;
        if (k < 0) return 0; /* nothing more yet (or an error other than EOF) */
    }
}

TEST(node_config_refused) {
    creds a;
    creds_init(&a);
    CHECK(visc_swarm_node_open(NULL) == NULL && error_has("no credentials"));
    visc_swarm_node_config c = {.listen = "127.0.0.1:0", .dht_port = -1};
    CHECK(visc_swarm_node_open(&c) == NULL && error_has("no credentials"));
    c.auth = &a.auth;
    c.listen = NULL;
    CHECK(visc_swarm_node_open(&c) == NULL && error_has("needs a listen address"));
    c.listen = "";
    CHECK(visc_swarm_node_open(&c) == NULL && error_has("needs a listen address"));
    c.listen = "127.0.0.1:0";
    const visc_swarm_node_config bad[] = {{.max_pending = -1},
                                          {.max_pending = VISC_NODE_MAX_PENDING + 1},
                                          {.unclaimed_s = -1},
                                          {.bandwidth = -1},
                                          {.bandwidth = NAN}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        visc_swarm_node_config b = bad[i];
        b.listen = c.listen;
        b.dht_port = -1;
        b.auth = &a.auth;
        CHECK_MSG(visc_swarm_node_open(&b) == NULL && error_has("bad limits"), "case %zu", i);
    }
    char peers[1100];
    memset(peers, '1', sizeof peers - 1);
    peers[sizeof peers - 1] = 0;
    c.initial_peers = peers;
    CHECK(visc_swarm_node_open(&c) == NULL && error_has("initial peers list too long"));
    c.initial_peers = NULL;
    /* the defaults are filled in, the caller's strings copied */
    char listen[32] = "127.0.0.1:0";
    c.listen = listen;
    visc_swarm_node *n = visc_swarm_node_open(&c);
    CHECK(n != NULL);
    if (!n) return;
    listen[0] = 'x';
    const visc_swarm_node_config *got = visc_swarm_node_config_of(n);
    CHECK(got->bandwidth == 1 && strcmp(got->listen, "127.0.0.1:0") == 0);
    CHECK(visc_swarm_node_auth(n) == &a.auth);
    visc_swarm_node_close(n);
    visc_swarm_node_close(NULL);
    visc_swarm_auth_free(&a.auth);
}

/* A listen address the node cannot have: open fails with the reason and
 * leaves nothing running. */
TEST(node_listen_failure) {
    creds a;
    creds_init(&a);
    visc_swarm_node_config c = {.listen = "127.0.0.1:99999", .dht_port = -1, .auth = &a.auth};
    CHECK(visc_swarm_node_open(&c) == NULL && error_has("port must be 0..65535"));
    visc_swarm_node *first = open_listener(&a.auth);
    CHECK(first != NULL);
    if (first) {
        c.listen = visc_swarm_node_address(first); /* taken */
        CHECK(visc_swarm_node_open(&c) == NULL && error_has("cannot listen on"));
        visc_swarm_node_close(first);
    }
    visc_swarm_auth_free(&a.auth);
}

/* Silent connections fill the accept queue (VISC_NODE_MAX_ACCEPTING, the
 * workers' sockets included); one more is closed at once rather than held,
 * and close() does not wait for the silent ones' handshake deadline. */
TEST(node_accept_queue_cap) {
    creds a;
    creds_init(&a);
    visc_swarm_node *n = open_listener(&a.auth);
    CHECK(n != NULL);
    if (!n) return;
    enum { FLOOD = VISC_NODE_MAX_ACCEPTING + 1 };
    int fd[FLOOD];
    double t0 = visc_now();
    for (int i = 0; i < FLOOD; i++) fd[i] = silent_connect(visc_swarm_node_address(n));
    /* the silent ones are held until VISC_NODE_HANDSHAKE_S after accept */
    int ended[FLOOD] = {0}, closed = 0;
    while (closed == 0 && visc_now() - t0 < VISC_NODE_HANDSHAKE_S / 2) {
        poll(NULL, 0, 20);
        for (int i = 0; i < FLOOD; i++)
            if (!ended[i] && closed_by_node(fd[i])) ended[i] = 1, closed++;
    }
    poll(NULL, 0, 100); /* time for a wrong second refusal to show */
    for (int i = 0; i < FLOOD; i++)
        if (!ended[i] && closed_by_node(fd[i])) ended[i] = 1, closed++;
    CHECK_MSG(closed == 1, "%d connections closed", closed);
    CHECK(visc_now() - t0 < VISC_NODE_HANDSHAKE_S * 0.8);
    t0 = visc_now();
    visc_swarm_node_close(n);
    CHECK(visc_now() - t0 < 2.0);
    for (int i = 0; i < FLOOD; i++) close(fd[i]);
    visc_swarm_auth_free(&a.auth);
}

/* With no descriptor left, accept fails (EMFILE) and the connection stays
 * in the kernel's queue; the node must neither spin nor stop accepting, and
 * serves the connection once descriptors are back. */
TEST(node_survives_descriptor_exhaustion) {
    creds a, b;
    creds_init(&a);
    creds_init(&b);
    visc_swarm_node *n = open_listener(&a.auth);
    CHECK(n != NULL);
    if (!n) return;
    const char *addr = visc_swarm_node_address(n);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(strrchr(addr, ':') + 1))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VISC_ASSERT(fd >= 0);
    /* every descriptor below the lowest free one is taken: make that the limit */
    int lowest_free = fcntl(fd, F_DUPFD, 0);
    VISC_ASSERT(lowest_free >= 0);
    close(lowest_free);
    struct rlimit saved, low;
    VISC_ASSERT(getrlimit(RLIMIT_NOFILE, &saved) == 0);
    low = saved;
    low.rlim_cur = (rlim_t)lowest_free;
    VISC_ASSERT(setrlimit(RLIMIT_NOFILE, &low) == 0);
    int dup_fails = fcntl(fd, F_DUPFD, 0) < 0;
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    poll(NULL, 0, 300); /* several accept attempts fail meanwhile */
    int pending_then = visc_swarm_node_pending(n);
    VISC_ASSERT(setrlimit(RLIMIT_NOFILE, &saved) == 0);
    CHECK(dup_fails);
    CHECK(rc == 0);
    CHECK(pending_then == 0);
    /* descriptors are back: the queued connection is served like any other */
    double dl = visc_now() + 10;
    visc_chan *c = visc_chan_handshake(fd, 1, &b.auth, dl);
    CHECK_MSG(c != NULL, "%s", visc_last_error());
    uint8_t tag[16] = {42}, open[VISC_OPEN_BYTES];
    visc_open_encode(VISC_PURPOSE_STATE, tag, open);
    if (c) CHECK(visc_chan_send(c, VISC_MSG_OPEN, open, sizeof open, dl) == 0);
    visc_chan *got = visc_swarm_node_take(n, VISC_PURPOSE_STATE, tag, b.id.public_key, dl);
    CHECK_MSG(got != NULL, "%s", visc_last_error());
    visc_chan_close(got);
    visc_chan_close(c);
    visc_swarm_node_close(n);
    visc_swarm_auth_free(&a.auth);
    visc_swarm_auth_free(&b.auth);
}

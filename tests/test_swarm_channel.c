/* test_swarm_channel.c: the authenticated channel between two peers, both
 * ends in threads of this process on 127.0.0.1 (port 0). Covers the
 * handshake's admission rules (secret, allowlist, tokens, run, mode), the
 * frames both ways, and attacks: replayed handshakes, duplicated or altered
 * frames, oversized length prefixes, stalling and garbage peers. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../src/swarm/channel.h"
#include "test.h"
#include "visc/core.h"
#include "visc/swarm.h"

#define RUN "test-run"
#define SECRET "0123456789abcdef-swarm-secret"
#define DEADLINE_S 20.0 /* generous: CI is a loaded 2-core machine */

/* ---- helpers ---- */

static visc_identity new_identity(void) {
    visc_identity id;
    VISC_ASSERT(visc_identity_generate(&id) == 0);
    return id;
}

/* Credentials for run with a secret (when secret is not NULL). */
static void make_auth(visc_swarm_auth *a, const char *run, const visc_identity *id,
                      const char *secret) {
    VISC_ASSERT(visc_swarm_auth_init(a, run, id) == 0);
    if (secret) VISC_ASSERT(visc_swarm_auth_set_secret(a, secret, strlen(secret)) == 0);
}

typedef struct {
    const visc_swarm_auth *auth;
    int listen_fd;
    double deadline;
    visc_chan *chan;
    char err[512];
} acceptor;

static void *accept_thread(void *arg) {
    acceptor *ac = arg;
    ac->chan = visc_chan_accept(ac->listen_fd, ac->auth, ac->deadline);
    if (!ac->chan) snprintf(ac->err, sizeof ac->err, "%s", visc_last_error());
    return NULL;
}

typedef struct {
    visc_chan *server, *client;
    char server_err[512], client_err[512];
} pair;

static int listen_any(char *addr, size_t cap) {
    int fd = visc_tcp_listen("127.0.0.1:0", addr, cap);
    VISC_ASSERT(fd >= 0);
    return fd;
}

/* Runs one handshake: the server accepts in a thread, the client connects. */
static pair run_pair(const visc_swarm_auth *server_auth, const visc_swarm_auth *client_auth) {
    pair p;
    memset(&p, 0, sizeof p);
    char addr[64];
    int lfd = listen_any(addr, sizeof addr);
    acceptor ac = {.auth = server_auth, .listen_fd = lfd, .deadline = visc_now() + DEADLINE_S};
    pthread_t th;
    VISC_ASSERT(pthread_create(&th, NULL, accept_thread, &ac) == 0);
    p.client = visc_chan_connect(addr, client_auth, visc_now() + DEADLINE_S);
    if (!p.client) snprintf(p.client_err, sizeof p.client_err, "%s", visc_last_error());
    pthread_join(th, NULL);
    p.server = ac.chan;
    memcpy(p.server_err, ac.err, sizeof ac.err);
    close(lfd);
    return p;
}

static void close_pair(pair *p) {
    visc_chan_close(p->server);
    visc_chan_close(p->client);
    p->server = p->client = NULL;
}

/* Checks that both sides refused, and that one of them said `why`. */
static void check_refused(const pair *p, const char *why) {
    CHECK_MSG(!p->server && !p->client, "handshake should fail: server %s, client %s",
              p->server ? "connected" : p->server_err, p->client ? "connected" : p->client_err);
    CHECK_MSG(strstr(p->server_err, why) || strstr(p->client_err, why),
              "expected \"%s\"; server: %s; client: %s", why, p->server_err, p->client_err);
}

static void fill_pattern(uint8_t *buf, size_t n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        buf[i] = (uint8_t)(x >> 24);
    }
}

/* ---- frames both ways ---- */

typedef struct {
    visc_chan *chan;
    int frames;
    size_t size;
    uint32_t seed;
    int rc;
    char err[512];
} sender;

static void *send_thread(void *arg) {
    sender *s = arg;
    uint8_t *buf = malloc(s->size + 1);
    s->rc = 0;
    for (int i = 0; i < s->frames && s->rc == 0; i++) {
        size_t n = (s->size * (size_t)(i + 1)) / (size_t)s->frames; /* sizes 0..size vary */
        if (i == 0) n = 0;
        fill_pattern(buf, n, s->seed + (uint32_t)i);
        s->rc = visc_chan_send(s->chan, (uint8_t)(i & 0xff), buf, n, visc_now() + DEADLINE_S);
    }
    if (s->rc) snprintf(s->err, sizeof s->err, "%s", visc_last_error());
    free(buf);
    return NULL;
}

/* Receives what send_thread sends; returns the number of bad frames. */
static int receive_frames(visc_chan *c, int frames, size_t size, uint32_t seed) {
    uint8_t *buf = malloc(size + 1), *want = malloc(size + 1);
    int bad = 0;
    for (int i = 0; i < frames; i++) {
        size_t expect = i == 0 ? 0 : (size * (size_t)(i + 1)) / (size_t)frames, n = 0;
        uint8_t type = 0;
        if (visc_chan_recv(c, &type, buf, size, &n, visc_now() + DEADLINE_S) != 0) {
            fprintf(stderr, "recv frame %d: %s\n", i, visc_last_error());
            bad += frames - i;
            break;
        }
        fill_pattern(want, expect, seed + (uint32_t)i);
        if (type != (uint8_t)(i & 0xff) || n != expect || memcmp(buf, want, n) != 0) bad++;
    }
    free(buf);
    free(want);
    return bad;
}

static void exchange_both_ways(int encrypt) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    sa.encrypt = ca.encrypt = encrypt;
    pair p = run_pair(&sa, &ca);
    CHECK_MSG(p.server && p.client, "handshake: server %s, client %s", p.server_err, p.client_err);
    if (p.server && p.client) {
        CHECK(memcmp(visc_chan_peer_key(p.server), b.public_key, VISC_KEY_BYTES) == 0);
        CHECK(memcmp(visc_chan_peer_key(p.client), a.public_key, VISC_KEY_BYTES) == 0);
        enum { FRAMES = 40 };
        const size_t size = 70000;
        sender to_server = {.chan = p.client, .frames = FRAMES, .size = size, .seed = 1};
        sender to_client = {.chan = p.server, .frames = FRAMES, .size = size, .seed = 1000};
        pthread_t t1, t2;
        pthread_create(&t1, NULL, send_thread, &to_server);
        pthread_create(&t2, NULL, send_thread, &to_client);
        /* each side receives in this thread while its own sender runs */
        int bad_server = receive_frames(p.server, FRAMES, size, 1);
        int bad_client = receive_frames(p.client, FRAMES, size, 1000);
        pthread_join(t1, NULL);
        pthread_join(t2, NULL);
        CHECK_MSG(to_server.rc == 0 && to_client.rc == 0, "send: %s %s", to_server.err,
                  to_client.err);
        CHECK(bad_server == 0);
        CHECK(bad_client == 0);
        /* the wire carries each frame with 5 header bytes and a tag */
        CHECK(visc_chan_bytes_sent(p.client) == visc_chan_bytes_received(p.server));
        CHECK(visc_chan_bytes_sent(p.server) == visc_chan_bytes_received(p.client));
        CHECK(visc_chan_bytes_sent(p.client) > (uint64_t)FRAMES * size / 2);
    }
    close_pair(&p);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

TEST(frames_both_ways_encrypted) { exchange_both_ways(1); }

TEST(frames_both_ways_mac_only) { exchange_both_ways(0); }

TEST(large_frame_and_cap) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    pair p = run_pair(&sa, &ca);
    CHECK_MSG(p.server && p.client, "%s %s", p.server_err, p.client_err);
    if (p.server && p.client) {
        const size_t big = 4u << 20;
        sender s = {.chan = p.client, .frames = 2, .size = big, .seed = 7};
        pthread_t t;
        pthread_create(&t, NULL, send_thread, &s);
        CHECK(receive_frames(p.server, 2, big, 7) == 0);
        pthread_join(t, NULL);
        CHECK(s.rc == 0);
        /* a frame above the receiver's cap is refused from its length alone */
        uint8_t small[100], type;
        size_t n;
        uint8_t *payload = calloc(1, 1000);
        CHECK(visc_chan_send(p.client, 1, payload, 1000, visc_now() + DEADLINE_S) == 0);
        CHECK(visc_chan_recv(p.server, &type, small, sizeof small, &n, visc_now() + DEADLINE_S) ==
              -1);
        CHECK_MSG(strstr(visc_last_error(), "exceeds the receiver's cap"), "%s", visc_last_error());
        /* and the channel is over afterwards, on both ends */
        CHECK(visc_chan_recv(p.server, &type, small, sizeof small, &n, visc_now() + DEADLINE_S) ==
              -1);
        CHECK(visc_chan_recv(p.client, &type, small, sizeof small, &n, visc_now() + DEADLINE_S) ==
              -1);
        /* a sender cannot exceed the protocol's maximum either */
        CHECK(visc_chan_send(p.server, 1, payload, (size_t)VISC_CHAN_MAX_FRAME + 1,
                             visc_now() + DEADLINE_S) == -1);
        free(payload);
    }
    close_pair(&p);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

/* ---- admission ---- */

TEST(mode_mismatch_fails) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    ca.encrypt = 0;
    pair p = run_pair(&sa, &ca);
    check_refused(&p, "both sides must agree");
    close_pair(&p);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

TEST(other_run_fails) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, "another-run", &b, SECRET);
    pair p = run_pair(&sa, &ca);
    check_refused(&p, "another run");
    close_pair(&p);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

/* A peer without the secret (none, or a wrong one), as client and as server. */
TEST(peer_without_secret_fails) {
    visc_identity a = new_identity(), b = new_identity();
    for (int wrong = 0; wrong < 2; wrong++)
        for (int client_lacks = 0; client_lacks < 2; client_lacks++) {
            visc_swarm_auth good, bad;
            make_auth(&good, RUN, client_lacks ? &a : &b, SECRET);
            make_auth(&bad, RUN, client_lacks ? &b : &a, wrong ? "a-different-secret!!" : NULL);
            /* both admit each other's key, so only the secret is at stake */
            visc_swarm_auth_allow(&good, client_lacks ? b.public_key : a.public_key);
            visc_swarm_auth_allow(&bad, client_lacks ? a.public_key : b.public_key);
            pair p = client_lacks ? run_pair(&good, &bad) : run_pair(&bad, &good);
            check_refused(&p, "swarm secret");
            close_pair(&p);
            visc_swarm_auth_free(&good);
            visc_swarm_auth_free(&bad);
        }
}

TEST(allowlist) {
    visc_identity a = new_identity(), b = new_identity(), other = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    visc_swarm_auth_allow(&sa, other.public_key);
    pair p = run_pair(&sa, &ca);
    check_refused(&p, "not on the allowlist and no valid token");
    close_pair(&p);
    /* listed: admitted */
    visc_swarm_auth_allow(&sa, b.public_key);
    p = run_pair(&sa, &ca);
    CHECK_MSG(p.server && p.client, "%s %s", p.server_err, p.client_err);
    close_pair(&p);
    /* admission is mutual: the client refuses a server it does not list */
    visc_swarm_auth_allow(&ca, other.public_key);
    p = run_pair(&sa, &ca);
    CHECK_MSG(!p.client && strstr(p.client_err, "not on the allowlist"), "client: %s",
              p.client_err);
    close_pair(&p);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

/* The server admits by the owner's tokens only (no secret, no list). */
static void check_token(const visc_identity *owner, const visc_identity *signer,
                        const visc_identity *holder, const uint8_t *token_key, const char *run,
                        int64_t expires_in, const char *refusal) {
    visc_identity server = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &server, NULL);
    sa.has_owner = 1;
    memcpy(sa.owner_key, owner->public_key, VISC_KEY_BYTES);
    sa.encrypt = 1;
    CHECK(visc_swarm_auth_check_config(&sa) == 0);
    make_auth(&ca, RUN, holder, NULL);
    visc_swarm_auth_allow(&ca, server.public_key);
    ca.has_token = 1;
    visc_token_sign(signer, token_key, run, (uint64_t)((int64_t)time(NULL) + expires_in), ca.token);
    pair p = run_pair(&sa, &ca);
    if (!refusal) CHECK_MSG(p.server && p.client, "%s %s", p.server_err, p.client_err);
    else check_refused(&p, refusal);
    close_pair(&p);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

TEST(tokens) {
    visc_identity owner = new_identity(), peer = new_identity(), other = new_identity();
    check_token(&owner, &owner, &peer, peer.public_key, RUN, 3600, NULL);
    check_token(&owner, &owner, &peer, peer.public_key, RUN, -10, "expired");
    check_token(&owner, &owner, &peer, peer.public_key, "other-run", 3600, "another run");
    check_token(&owner, &owner, &peer, other.public_key, RUN, 3600, "another peer key");
    check_token(&owner, &other, &peer, peer.public_key, RUN, 3600, "not signed by the run owner");
}

/* ---- a man in the middle: forwards bytes, records and tampers ---- */

#define HANDSHAKE_C2S 374 /* the client's hello (278) and proof (96) */

typedef struct {
    int listen_fd;
    char target[64];
    /* client-to-server stream: recorded; byte xor_pos is xored with xor_mask;
     * after byte dup_end has passed, bytes [dup_start, dup_end) are sent again */
    uint8_t *record;
    size_t recorded, record_cap;
    long xor_pos;
    uint8_t xor_mask;
    long dup_start, dup_end;
} relay;

static int raw_connect(const char *addr) {
    struct sockaddr_in sa = {.sin_family = AF_INET};
    const char *colon = strrchr(addr, ':');
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    VISC_ASSERT(fd >= 0);
    VISC_ASSERT(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    return fd;
}

static int write_fully(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void *relay_thread(void *arg) {
    relay *r = arg;
    struct pollfd lp = {.fd = r->listen_fd, .events = POLLIN};
    if (poll(&lp, 1, (int)(DEADLINE_S * 1000)) != 1) return NULL;
    int client = accept(r->listen_fd, NULL, NULL);
    if (client < 0) return NULL;
    int server = raw_connect(r->target);
    int open_c = 1, open_s = 1, dup_done = 0;
    double deadline = visc_now() + DEADLINE_S;
    uint8_t buf[65536];
    while ((open_c || open_s) && visc_now() < deadline) {
        struct pollfd p[2] = {{.fd = open_c ? client : -1, .events = POLLIN},
                              {.fd = open_s ? server : -1, .events = POLLIN}};
        if (poll(p, 2, 100) <= 0) continue;
        if (p[0].revents) {
            ssize_t k = recv(client, buf, sizeof buf, 0);
            if (k <= 0) {
                open_c = 0;
                shutdown(server, SHUT_WR);
            } else {
                size_t at = r->recorded;
                if (r->recorded + (size_t)k <= r->record_cap) {
                    memcpy(r->record + at, buf, (size_t)k);
                    r->recorded += (size_t)k;
                }
                if (r->xor_pos >= (long)at && r->xor_pos < (long)at + k)
                    buf[r->xor_pos - (long)at] ^= r->xor_mask;
                /* the copy goes in right after the original, wherever the chunk ends */
                size_t first = (size_t)k;
                int dup_now = !dup_done && r->dup_end > (long)at && r->dup_end <= (long)at + k;
                if (dup_now) first = (size_t)(r->dup_end - (long)at);
                if (write_fully(server, buf, first) != 0) open_c = 0;
                if (dup_now) {
                    dup_done = 1;
                    write_fully(server, r->record + r->dup_start,
                                (size_t)(r->dup_end - r->dup_start));
                    write_fully(server, buf + first, (size_t)k - first);
                }
            }
        }
        if (p[1].revents) {
            ssize_t k = recv(server, buf, sizeof buf, 0);
            if (k <= 0) {
                open_s = 0;
                shutdown(client, SHUT_WR);
            } else if (write_fully(client, buf, (size_t)k) != 0) open_s = 0;
        }
    }
    close(client);
    close(server);
    return NULL;
}

typedef struct {
    relay r;
    pthread_t relay_th, accept_th;
    acceptor ac;
    int server_lfd;
    char relay_addr[64];
} mitm;

/* Starts a server accepting through a relay; the caller connects to m->relay_addr. */
static void mitm_start(mitm *m, const visc_swarm_auth *server_auth) {
    m->server_lfd = listen_any(m->r.target, sizeof m->r.target);
    m->r.listen_fd = listen_any(m->relay_addr, sizeof m->relay_addr);
    m->r.record_cap = 1u << 20;
    m->r.record = malloc(m->r.record_cap);
    m->ac = (acceptor){.auth = server_auth,
                       .listen_fd = m->server_lfd,
                       .deadline = visc_now() + DEADLINE_S};
    pthread_create(&m->relay_th, NULL, relay_thread, &m->r);
    pthread_create(&m->accept_th, NULL, accept_thread, &m->ac);
}

static void mitm_join(mitm *m) { pthread_join(m->accept_th, NULL); }

static void mitm_end(mitm *m) {
    pthread_join(m->relay_th, NULL);
    close(m->server_lfd);
    close(m->r.listen_fd); /* m->r.record stays, for replaying: the caller frees it */
}

TEST(replayed_handshake_fails) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    /* a real session, recorded */
    mitm m;
    memset(&m, 0, sizeof m);
    m.r.xor_pos = -1;
    mitm_start(&m, &sa);
    visc_chan *c = visc_chan_connect(m.relay_addr, &ca, visc_now() + DEADLINE_S);
    CHECK_MSG(c != NULL, "%s", visc_last_error());
    mitm_join(&m);
    CHECK_MSG(m.ac.chan != NULL, "%s", m.ac.err);
    if (c) CHECK(visc_chan_send(c, 3, "transfer", 8, visc_now() + DEADLINE_S) == 0);
    uint8_t type, got[16];
    size_t n = 0;
    if (m.ac.chan)
        CHECK(visc_chan_recv(m.ac.chan, &type, got, sizeof got, &n, visc_now() + DEADLINE_S) == 0);
    visc_chan_close(c);
    visc_chan_close(m.ac.chan);
    mitm_end(&m);
    CHECK(m.r.recorded > HANDSHAKE_C2S);
    /* the same bytes again, to a fresh acceptor: its new hello changes the
     * transcript, so the recorded proof no longer verifies */
    char addr[64];
    int lfd = listen_any(addr, sizeof addr);
    acceptor ac = {.auth = &sa, .listen_fd = lfd, .deadline = visc_now() + DEADLINE_S};
    pthread_t th;
    pthread_create(&th, NULL, accept_thread, &ac);
    int fd = raw_connect(addr);
    write_fully(fd, m.r.record, m.r.recorded);
    pthread_join(th, NULL);
    CHECK(ac.chan == NULL);
    CHECK_MSG(strstr(ac.err, "does not verify"), "%s", ac.err);
    close(fd);
    close(lfd);
    free(m.r.record);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

/* Sends frames of 100 and 50 bytes through a tampering relay; the server
 * must take the frames before the tampering and refuse the rest. */
static void tampered_session(int encrypt, long xor_pos, uint8_t mask, int dup_first,
                             int good_frames, const char *why) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    sa.encrypt = ca.encrypt = encrypt;
    size_t tag = 16; /* both modes end frames in a 16-byte tag */
    mitm m;
    memset(&m, 0, sizeof m);
    m.r.xor_pos = xor_pos;
    m.r.xor_mask = mask;
    if (dup_first) {
        m.r.dup_start = HANDSHAKE_C2S;
        m.r.dup_end = HANDSHAKE_C2S + 5 + 100 + (long)tag;
    }
    mitm_start(&m, &sa);
    visc_chan *c = visc_chan_connect(m.relay_addr, &ca, visc_now() + DEADLINE_S);
    CHECK_MSG(c != NULL, "%s", visc_last_error());
    mitm_join(&m);
    visc_chan *s = m.ac.chan;
    CHECK_MSG(s != NULL, "%s", m.ac.err);
    if (c && s) {
        uint8_t p1[100], p2[50], got[200], type;
        fill_pattern(p1, sizeof p1, 1);
        fill_pattern(p2, sizeof p2, 2);
        CHECK(visc_chan_send(c, 1, p1, sizeof p1, visc_now() + DEADLINE_S) == 0);
        CHECK(visc_chan_send(c, 2, p2, sizeof p2, visc_now() + DEADLINE_S) == 0);
        size_t n = 0;
        for (int i = 0; i < good_frames; i++)
            CHECK(visc_chan_recv(s, &type, got, sizeof got, &n, visc_now() + DEADLINE_S) == 0);
        double t0 = visc_now();
        CHECK(visc_chan_recv(s, &type, got, sizeof got, &n, visc_now() + DEADLINE_S) == -1);
        CHECK_MSG(strstr(visc_last_error(), why), "expected \"%s\": %s", why, visc_last_error());
        /* refused at once, not after waiting for bytes that never come */
        CHECK(visc_now() - t0 < DEADLINE_S / 2);
    }
    visc_chan_close(c);
    visc_chan_close(s);
    mitm_end(&m);
    free(m.r.record);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

TEST(duplicated_frame_fails) {
    for (int enc = 0; enc < 2; enc++)
        tampered_session(enc, -1, 0, 1, 1, "frame authentication failed");
}

TEST(altered_frame_fails) {
    for (int enc = 0; enc < 2; enc++) {
        /* a payload byte, the type byte, the length's low byte */
        tampered_session(enc, HANDSHAKE_C2S + 5 + 40, 0x01, 0, 0, "frame authentication failed");
        tampered_session(enc, HANDSHAKE_C2S + 4, 0x80, 0, 0, "frame authentication failed");
        tampered_session(enc, HANDSHAKE_C2S + 0, 0x01, 0, 0, "frame authentication failed");
    }
}

TEST(oversized_length_prefix_refused_before_reading) {
    for (int enc = 0; enc < 2; enc++) {
        /* the length's top byte: about 2 GiB announced, nothing behind it */
        tampered_session(enc, HANDSHAKE_C2S + 3, 0x80, 0, 0, "exceeds the maximum");
        /* 64 KiB more than sent: above this receiver's 200-byte cap */
        tampered_session(enc, HANDSHAKE_C2S + 2, 0x01, 0, 0, "exceeds the receiver's cap");
    }
}

/* ---- peers that stall or talk garbage ---- */

TEST(stalled_handshake_hits_deadline) {
    visc_identity a = new_identity();
    visc_swarm_auth sa;
    make_auth(&sa, RUN, &a, SECRET);
    char addr[64];
    int lfd = listen_any(addr, sizeof addr);
    /* a client that sends half a hello and then nothing; it is queued
     * before the acceptor starts, so the deadline is spent in the handshake */
    int fd = raw_connect(addr);
    write_fully(fd, (const uint8_t *)"VSWH\001\003\000\000", 8);
    double t0 = visc_now();
    acceptor ac = {.auth = &sa, .listen_fd = lfd, .deadline = visc_now() + 1.0};
    pthread_t th;
    pthread_create(&th, NULL, accept_thread, &ac);
    pthread_join(th, NULL);
    CHECK(ac.chan == NULL);
    CHECK_MSG(strstr(ac.err, "handshake") && strstr(ac.err, "timed out"), "%s", ac.err);
    CHECK(visc_now() - t0 >= 0.9 && visc_now() - t0 < 10.0);
    /* a server that takes the connection (the kernel's backlog) but never answers */
    t0 = visc_now();
    visc_chan *c = visc_chan_connect(addr, &sa, visc_now() + 0.5);
    CHECK(c == NULL);
    CHECK_MSG(strstr(visc_last_error(), "timed out"), "%s", visc_last_error());
    CHECK(visc_now() - t0 >= 0.4 && visc_now() - t0 < 10.0);
    close(fd);
    close(lfd);
    visc_swarm_auth_free(&sa);
}

TEST(garbage_client_does_not_hurt_acceptor) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    char addr[64];
    int lfd = listen_any(addr, sizeof addr);
    uint8_t junk[4096];
    fill_pattern(junk, sizeof junk, 99);
    const size_t sizes[] = {0, 3, 278, sizeof junk};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        acceptor ac = {.auth = &sa, .listen_fd = lfd, .deadline = visc_now() + DEADLINE_S};
        pthread_t th;
        pthread_create(&th, NULL, accept_thread, &ac);
        int fd = raw_connect(addr);
        write_fully(fd, junk, sizes[i]);
        shutdown(fd, SHUT_WR);
        pthread_join(th, NULL);
        CHECK(ac.chan == NULL);
        CHECK_MSG(ac.err[0] && !strstr(ac.err, "timed out"), "%s", ac.err);
        close(fd);
    }
    /* a hello with the right magic but a token length that lies */
    uint8_t hello[278] = "VSWH\001\003";
    hello[136] = 0xff;
    uint8_t key[VISC_KEY_BYTES];
    CHECK(visc_chan_parse_hello(hello, sizeof hello, &sa, key) == -1);
    /* the acceptor is still fine for an honest peer */
    close(lfd);
    pair p = run_pair(&sa, &ca);
    CHECK_MSG(p.server && p.client, "%s %s", p.server_err, p.client_err);
    close_pair(&p);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

typedef struct {
    visc_chan *chan;
    const uint8_t *buf;
    size_t size;
    int frames, rc;
} bulk;

static void *bulk_send(void *arg) {
    bulk *b = arg;
    for (int i = 0; i < b->frames && b->rc == 0; i++)
        b->rc = visc_chan_send(b->chan, 9, b->buf, b->size, visc_now() + DEADLINE_S);
    return NULL;
}

/* Not a check of speed (CI machines vary): prints it, checks the bytes. */
TEST(throughput_512k_frames) {
    visc_identity a = new_identity(), b = new_identity();
    for (int enc = 1; enc >= 0; enc--) {
        visc_swarm_auth sa, ca;
        make_auth(&sa, RUN, &a, SECRET);
        make_auth(&ca, RUN, &b, SECRET);
        sa.encrypt = ca.encrypt = enc;
        pair p = run_pair(&sa, &ca);
        CHECK_MSG(p.server && p.client, "%s %s", p.server_err, p.client_err);
        if (p.server && p.client) {
            enum { FRAMES = 128 };
            const size_t size = 512u << 10;
            uint8_t *out = malloc(size), *in = malloc(size);
            fill_pattern(out, size, 5);
            double t0 = visc_now();
            pthread_t th;
            bulk job = {p.client, out, size, FRAMES, 0};
            /* one thread sends, this one receives */
            pthread_create(&th, NULL, bulk_send, &job);
            int bad = 0;
            for (int i = 0; i < FRAMES; i++) {
                uint8_t type;
                size_t n = 0;
                if (visc_chan_recv(p.server, &type, in, size, &n, visc_now() + DEADLINE_S) != 0 ||
                    n != size)
                    bad++;
            }
            pthread_join(th, NULL);
            double dt = visc_now() - t0;
            CHECK(bad == 0 && job.rc == 0);
            CHECK(memcmp(in, out, size) == 0);
            fprintf(stderr, "# %s 512 KiB frames on loopback: %.0f MB/s\n",
                    enc ? "encrypted" : "MAC-only", FRAMES * (double)size / dt / 1e6);
            free(out);
            free(in);
        }
        close_pair(&p);
        visc_swarm_auth_free(&sa);
        visc_swarm_auth_free(&ca);
    }
}

/* ---- addresses, refused and silent listeners ---- */

TEST(bad_addresses_refused) {
    const char *bad[] = {"nocolon",        ":80",          "127.0.0.1:",    "127.0.0.1:99999",
                         "127.0.0.1:-1",   "127.0.0.1:+5", "127.0.0.1: 80", "127.0.0.1:8x",
                         "example.org:80", "::1:80",       "256.1.1.1:80",  "*:0x10"};
    char bound[64];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(visc_tcp_listen(bad[i], bound, sizeof bound) == -1, "listen on %s", bad[i]);
        CHECK_MSG(strstr(visc_last_error(), bad[i]), "%s: %s", bad[i], visc_last_error());
    }
    char long_host[100];
    memset(long_host, '1', sizeof long_host);
    snprintf(long_host + 80, 20, ":80");
    CHECK(visc_tcp_listen(long_host, bound, sizeof bound) == -1);
    CHECK(strstr(visc_last_error(), "not host:port") != NULL);
    /* "*" is any address for a listener only; port 0 is no peer's port */
    visc_identity a = new_identity();
    visc_swarm_auth sa;
    make_auth(&sa, RUN, &a, SECRET);
    CHECK(visc_chan_connect("*:80", &sa, visc_now() + DEADLINE_S) == NULL);
    CHECK_MSG(strstr(visc_last_error(), "not an IPv4 address"), "%s", visc_last_error());
    CHECK(visc_chan_connect("127.0.0.1:0", &sa, visc_now() + DEADLINE_S) == NULL);
    CHECK_MSG(strstr(visc_last_error(), "port 0"), "%s", visc_last_error());
    /* the good forms */
    int fd = visc_tcp_listen("localhost:0", bound, sizeof bound);
    CHECK(fd >= 0 && strncmp(bound, "127.0.0.1:", 10) == 0);
    /* the bound port is taken now: a second listener on it fails */
    CHECK(visc_tcp_listen(bound, NULL, 0) == -1);
    CHECK_MSG(strstr(visc_last_error(), "cannot listen on"), "%s", visc_last_error());
    close(fd);
    fd = visc_tcp_listen("*:0", bound, sizeof bound);
    CHECK(fd >= 0 && strncmp(bound, "0.0.0.0:", 8) == 0);
    close(fd);
    visc_swarm_auth_free(&sa);
}

TEST(connect_refused_and_timed_out) {
    visc_identity a = new_identity();
    visc_swarm_auth sa;
    make_auth(&sa, RUN, &a, SECRET);
    /* a port that is bound but not listening: the kernel refuses at once */
    int holder = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET};
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    VISC_ASSERT(bind(holder, (struct sockaddr *)&sin, sizeof sin) == 0);
    socklen_t len = sizeof sin;
    VISC_ASSERT(getsockname(holder, (struct sockaddr *)&sin, &len) == 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)ntohs(sin.sin_port));
    double t0 = visc_now();
    CHECK(visc_chan_connect(addr, &sa, t0 + DEADLINE_S) == NULL);
    CHECK_MSG(strstr(visc_last_error(), "refused"), "%s", visc_last_error());
    CHECK(visc_now() - t0 < DEADLINE_S / 2);
    close(holder);
    /* a listener whose accept queue is full drops the SYN: the connect
     * itself (not the handshake) runs into the deadline */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    sin.sin_port = 0;
    VISC_ASSERT(bind(lfd, (struct sockaddr *)&sin, sizeof sin) == 0 && listen(lfd, 0) == 0);
    len = sizeof sin;
    VISC_ASSERT(getsockname(lfd, (struct sockaddr *)&sin, &len) == 0);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)ntohs(sin.sin_port));
    int queued = raw_connect(addr);
    t0 = visc_now();
    CHECK(visc_chan_connect(addr, &sa, t0 + 0.3) == NULL);
    CHECK_MSG(strstr(visc_last_error(), "connect to") && strstr(visc_last_error(), "timed out"),
              "%s", visc_last_error());
    CHECK(visc_now() - t0 >= 0.29 && visc_now() - t0 < 10.0);
    close(queued);
    close(lfd);
    visc_swarm_auth_free(&sa);
}

TEST(accept_timeout_and_error) {
    visc_identity a = new_identity();
    visc_swarm_auth sa;
    make_auth(&sa, RUN, &a, SECRET);
    char addr[64];
    int lfd = listen_any(addr, sizeof addr);
    double t0 = visc_now();
    CHECK(visc_chan_accept(lfd, &sa, t0 + 0.2) == NULL);
    CHECK_MSG(strstr(visc_last_error(), "accept: timed out"), "%s", visc_last_error());
    CHECK(visc_now() - t0 >= 0.19 && visc_now() - t0 < 10.0);
    close(lfd);
    /* a socket that is not listening */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    CHECK(visc_chan_accept(fd, &sa, visc_now() + DEADLINE_S) == NULL);
    CHECK_MSG(strstr(visc_last_error(), "accept: "), "%s", visc_last_error());
    close(fd);
    /* the handshake on something that is not an open descriptor */
    CHECK(visc_chan_handshake(-1, 1, &sa, visc_now() + DEADLINE_S) == NULL);
    CHECK_MSG(strstr(visc_last_error(), "fcntl"), "%s", visc_last_error());
    visc_swarm_auth_free(&sa);
}

/* ---- a hand-built peer that follows the wire format of channel.c ---- */

#define HELLO_BYTES 278
#define PROOF_BYTES 96

static void fake_hello(const visc_swarm_auth *a, const uint8_t eph_pk[32], uint8_t h[HELLO_BYTES]) {
    memset(h, 0, HELLO_BYTES);
    memcpy(h, "VSWH", 4);
    h[4] = 1;
    h[5] = (uint8_t)((a->encrypt ? 1 : 0) | (a->has_secret ? 2 : 0));
    memcpy(h + 8, a->run_hash, 32);
    memcpy(h + 40, eph_pk, 32);
    memcpy(h + 72, a->self.public_key, 32);
    randombytes_buf(h + 104, 32);
}

static void fake_transcript(const uint8_t *hello_i, const uint8_t *hello_r, uint8_t t[32]) {
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)"visc-swarm-transcript-v1", 24);
    crypto_generichash_update(&st, hello_i, HELLO_BYTES);
    crypto_generichash_update(&st, hello_r, HELLO_BYTES);
    crypto_generichash_final(&st, t, 32);
}

/* label | role | T */
static size_t fake_proof_message(const char *label, char role, const uint8_t t[32], uint8_t *m) {
    size_t l = strlen(label);
    memcpy(m, label, l);
    m[l] = (uint8_t)role;
    memcpy(m + l + 1, t, 32);
    return l + 33;
}

static void fake_proof(const visc_swarm_auth *a, char role, const uint8_t t[32],
                       uint8_t proof[PROOF_BYTES]) {
    uint8_t m[64];
    size_t n = fake_proof_message("visc-swarm-proof-v1", role, t, m);
    crypto_sign_detached(proof, NULL, m, n, a->self.secret_key);
    memset(proof + 64, 0, 32);
    if (a->has_secret) {
        n = fake_proof_message("visc-swarm-secret-v1", role, t, m);
        crypto_generichash(proof + 64, 32, m, n, a->secret, 32);
    }
}

static int fake_proof_ok(const uint8_t *peer_key, char role, const uint8_t t[32],
                         const uint8_t proof[PROOF_BYTES]) {
    uint8_t m[64];
    size_t n = fake_proof_message("visc-swarm-proof-v1", role, t, m);
    return crypto_sign_verify_detached(proof, m, n, peer_key) == 0;
}

static int read_fully(int fd, uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* visc's side of a handshake over a socketpair, in a thread */
typedef struct {
    int fd, initiator;
    const visc_swarm_auth *auth;
    visc_chan *chan;
    char err[512];
} handshaker;

static void *handshake_thread(void *arg) {
    handshaker *h = arg;
    h->chan = visc_chan_handshake(h->fd, h->initiator, h->auth, visc_now() + DEADLINE_S);
    if (!h->chan) snprintf(h->err, sizeof h->err, "%s", visc_last_error());
    return NULL;
}

/* The hand-built responder answers a visc initiator; with zero_eph its
 * ephemeral key is the all-zero point, which would make the shared secret
 * a constant: the initiator must refuse even though every proof checks. */
static void fake_responder(int zero_eph, const char *refusal) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth ours, theirs;
    make_auth(&ours, RUN, &a, SECRET);
    make_auth(&theirs, RUN, &b, SECRET);
    int sv[2];
    VISC_ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    handshaker h = {.fd = sv[0], .initiator = 1, .auth = &ours};
    pthread_t th;
    pthread_create(&th, NULL, handshake_thread, &h);
    uint8_t eph_pk[32], eph_sk[32], hello_i[HELLO_BYTES], hello_r[HELLO_BYTES], t[32];
    uint8_t proof[PROOF_BYTES];
    crypto_kx_keypair(eph_pk, eph_sk);
    if (zero_eph) memset(eph_pk, 0, sizeof eph_pk);
    fake_hello(&theirs, eph_pk, hello_r);
    CHECK(read_fully(sv[1], hello_i, HELLO_BYTES) == 0);
    CHECK(write_fully(sv[1], hello_r, HELLO_BYTES) == 0);
    fake_transcript(hello_i, hello_r, t);
    CHECK(read_fully(sv[1], proof, PROOF_BYTES) == 0);
    CHECK(fake_proof_ok(a.public_key, 'I', t, proof));
    CHECK(!fake_proof_ok(a.public_key, 'R', t, proof)); /* bound to the role */
    fake_proof(&theirs, 'R', t, proof);
    CHECK(write_fully(sv[1], proof, PROOF_BYTES) == 0);
    pthread_join(th, NULL);
    if (!refusal) {
        CHECK_MSG(h.chan != NULL, "%s", h.err);
        if (h.chan) CHECK(memcmp(visc_chan_peer_key(h.chan), b.public_key, VISC_KEY_BYTES) == 0);
    } else {
        CHECK(h.chan == NULL);
        CHECK_MSG(strstr(h.err, refusal), "expected \"%s\": %s", refusal, h.err);
    }
    visc_chan_close(h.chan);
    close(sv[1]);
    visc_swarm_auth_free(&ours);
    visc_swarm_auth_free(&theirs);
}

TEST(hand_built_responder_interoperates) { fake_responder(0, NULL); }

TEST(zero_ephemeral_key_refused) { fake_responder(1, "ephemeral key is unusable"); }

/* An initiator that stops reading once its proof is out: the responder's
 * own proof cannot be delivered, and it says so instead of succeeding. */
TEST(responder_proof_undeliverable) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth ours, theirs;
    make_auth(&ours, RUN, &a, SECRET);
    make_auth(&theirs, RUN, &b, SECRET);
    int sv[2];
    VISC_ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    handshaker h = {.fd = sv[0], .initiator = 0, .auth = &ours};
    pthread_t th;
    pthread_create(&th, NULL, handshake_thread, &h);
    uint8_t eph_pk[32], eph_sk[32], hello_i[HELLO_BYTES], hello_r[HELLO_BYTES], t[32];
    uint8_t proof[PROOF_BYTES];
    crypto_kx_keypair(eph_pk, eph_sk);
    fake_hello(&theirs, eph_pk, hello_i);
    CHECK(write_fully(sv[1], hello_i, HELLO_BYTES) == 0);
    CHECK(read_fully(sv[1], hello_r, HELLO_BYTES) == 0);
    fake_transcript(hello_i, hello_r, t);
    fake_proof(&theirs, 'I', t, proof);
    /* on a Unix socket, a send to a peer that shut its reading side fails */
    shutdown(sv[1], SHUT_RD);
    CHECK(write_fully(sv[1], proof, PROOF_BYTES) == 0);
    pthread_join(th, NULL);
    CHECK(h.chan == NULL);
    CHECK_MSG(strstr(h.err, "proof") && strstr(h.err, "send"), "%s", h.err);
    close(sv[1]);
    visc_swarm_auth_free(&ours);
    visc_swarm_auth_free(&theirs);
}

/* A "peer" that sends our own hello back (a reflection) is caught before
 * any proof is made. */
TEST(reflected_hello_refused) {
    visc_identity a = new_identity();
    visc_swarm_auth sa;
    make_auth(&sa, RUN, &a, SECRET);
    int sv[2];
    VISC_ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    handshaker h = {.fd = sv[0], .initiator = 1, .auth = &sa};
    pthread_t th;
    pthread_create(&th, NULL, handshake_thread, &h);
    uint8_t hello[HELLO_BYTES];
    CHECK(read_fully(sv[1], hello, HELLO_BYTES) == 0);
    CHECK(write_fully(sv[1], hello, HELLO_BYTES) == 0);
    pthread_join(th, NULL);
    CHECK(h.chan == NULL);
    CHECK_MSG(strstr(h.err, "echoed our own hello"), "%s", h.err);
    close(sv[1]);
    visc_swarm_auth_free(&sa);
}

/* Every field of the hello is checked. */
TEST(hello_fields_checked) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, peer;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&peer, RUN, &b, SECRET);
    uint8_t eph[32] = {9}, good[HELLO_BYTES], h[HELLO_BYTES], key[VISC_KEY_BYTES];
    fake_hello(&peer, eph, good);
    CHECK_MSG(visc_chan_parse_hello(good, sizeof good, &sa, key) == 0, "%s", visc_last_error());
    CHECK(memcmp(key, b.public_key, VISC_KEY_BYTES) == 0);
    CHECK(visc_chan_parse_hello(good, sizeof good - 1, &sa, key) == -1);
    CHECK(strstr(visc_last_error(), "277 bytes") != NULL);
    struct {
        int at;
        uint8_t value;
        const char *why;
    } cases[] = {{0, 'X', "bad magic"},
                 {4, 2, "version 2"},
                 {5, 0x07, "unknown flags"},
                 {6, 1, "unknown flags"},
                 {7, 1, "unknown flags"},
                 {8, 0, "another run"},
                 {5, 0x02, "encryption off"},
                 {5, 0x01, "does not know the swarm secret"},
                 {136, 1, "token length 1"},
                 {137, 1, "token length 256"},
                 {200, 1, "bytes after an empty token"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memcpy(h, good, sizeof h);
        h[cases[i].at] = cases[i].at == 8 ? (uint8_t)(h[8] ^ 0xff) : cases[i].value;
        CHECK(visc_chan_parse_hello(h, sizeof h, &sa, key) == -1);
        CHECK_MSG(strstr(visc_last_error(), cases[i].why), "byte %d: expected \"%s\": %s",
                  cases[i].at, cases[i].why, visc_last_error());
    }
    /* a static key that is not a point on the curve */
    memcpy(h, good, sizeof h);
    memset(h + 72, 0xff, 32);
    CHECK(visc_chan_parse_hello(h, sizeof h, &sa, key) == -1);
    CHECK_MSG(strstr(visc_last_error(), "not a valid Ed25519 key"), "%s", visc_last_error());
    /* a peer without the secret, seen from one that has none either */
    visc_swarm_auth open_peer;
    make_auth(&open_peer, RUN, &a, NULL);
    CHECK(visc_chan_parse_hello(good, sizeof good, &open_peer, key) == -1);
    CHECK(strstr(visc_last_error(), "requires a swarm secret") != NULL);
    visc_swarm_auth_free(&open_peer);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&peer);
}

/* ---- a channel that breaks after the handshake ---- */

/* The server hangs up: the client's sends fail (the first may still land in
 * the kernel), and the channel stays failed. */
TEST(send_after_peer_closed_fails) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    for (int enc = 0; enc < 2; enc++) {
        sa.encrypt = ca.encrypt = enc;
        pair p = run_pair(&sa, &ca);
        CHECK_MSG(p.server && p.client, "%s %s", p.server_err, p.client_err);
        if (!p.server || !p.client) continue;
        visc_chan_close(p.server);
        p.server = NULL;
        int rc = 0;
        double until = visc_now() + DEADLINE_S;
        for (int i = 0; rc == 0 && visc_now() < until; i++) {
            rc = visc_chan_send(p.client, 1, "after close", 11, until);
            if (rc == 0) poll(NULL, 0, 5);
        }
        CHECK(rc == -1);
        CHECK_MSG(strstr(visc_last_error(), "send: "), "%s", visc_last_error());
        CHECK(visc_chan_send(p.client, 1, "x", 1, until) == -1);
        CHECK_MSG(strstr(visc_last_error(), "unusable after an earlier error"), "%s",
                  visc_last_error());
        close_pair(&p);
    }
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

/* A peer that dies in the middle of a frame: the receiver reports the
 * closed connection, not a frame. */
TEST(truncated_frame_fails) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    pair p = run_pair(&sa, &ca);
    CHECK_MSG(p.server && p.client, "%s %s", p.server_err, p.client_err);
    if (p.server && p.client) {
        /* a header announcing 100 bytes and a tag, and 40 of them */
        uint8_t raw[5 + 40] = {117, 0, 0, 0, 1};
        CHECK(write_fully(visc_chan_fd(p.client), raw, sizeof raw) == 0);
        shutdown(visc_chan_fd(p.client), SHUT_WR);
        uint8_t type, got[200];
        size_t n = 0;
        double t0 = visc_now();
        CHECK(visc_chan_recv(p.server, &type, got, sizeof got, &n, t0 + DEADLINE_S) == -1);
        CHECK_MSG(strstr(visc_last_error(), "connection closed by the peer"), "%s",
                  visc_last_error());
        CHECK(visc_now() - t0 < DEADLINE_S / 2);
    }
    close_pair(&p);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

TEST(frame_length_too_short) {
    for (int enc = 0; enc < 2; enc++)
        /* the first frame's length is 117 (0x75); 0x75 ^ 0x70 = 5: not even a tag */
        tampered_session(enc, HANDSHAKE_C2S + 0, 0x70, 0, 0, "is too short");
}

/* visc_chan_shutdown wakes a thread blocked in recv on the same channel. */
typedef struct {
    visc_chan *chan;
    int rc;
    double took;
} blocked_recv;

static void *recv_blocked(void *arg) {
    blocked_recv *r = arg;
    uint8_t type, buf[16];
    size_t n;
    double t0 = visc_now();
    r->rc = visc_chan_recv(r->chan, &type, buf, sizeof buf, &n, t0 + DEADLINE_S);
    r->took = visc_now() - t0;
    return NULL;
}

TEST(shutdown_wakes_receiver) {
    visc_identity a = new_identity(), b = new_identity();
    visc_swarm_auth sa, ca;
    make_auth(&sa, RUN, &a, SECRET);
    make_auth(&ca, RUN, &b, SECRET);
    pair p = run_pair(&sa, &ca);
    CHECK_MSG(p.server && p.client, "%s %s", p.server_err, p.client_err);
    if (p.server && p.client) {
        blocked_recv r = {.chan = p.server};
        pthread_t th;
        pthread_create(&th, NULL, recv_blocked, &r);
        poll(NULL, 0, 50);
        visc_chan_shutdown(p.server);
        pthread_join(th, NULL);
        CHECK(r.rc == -1);
        CHECK(r.took < DEADLINE_S / 2);
    }
    visc_chan_shutdown(NULL); /* a no-op, like close(NULL) */
    close_pair(&p);
    visc_swarm_auth_free(&sa);
    visc_swarm_auth_free(&ca);
}

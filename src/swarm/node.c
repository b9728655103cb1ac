/* node.c: a swarm peer's listener. One accept thread polls the listening
 * socket (and a pipe that close() writes to wake it); accepted sockets go
 * to a bounded queue served by a few handshake workers; a channel that
 * passes the handshake and sends a well-formed OPEN is queued for
 * visc_swarm_node_take. The accept thread also closes queued channels that
 * nobody claimed in time. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "node.h"
#include "visc/core.h"
#include "wire.h"

typedef struct {
    visc_purpose purpose;
    uint8_t tag[16];
    uint8_t key[VISC_KEY_BYTES];
    visc_chan *chan;
    double queued_at;
} pending_chan;

/* A standing answer (visc_swarm_node_answer). */
typedef struct {
    visc_purpose purpose;
    uint8_t tag[16];
    uint8_t type, payload[VISC_NODE_ANSWER_MAX_BYTES];
    size_t len;
} standing_answer;

/* An accepted socket waiting for a handshake worker. `fd` stays open until
 * the worker is done so that close() can shutdown(2) it (and so end the
 * handshake at once); the worker hands the handshake a dup of it. */
typedef struct {
    int fd;
    double accepted_at;
    int busy; /* a worker is handshaking it */
} accepting_sock;

struct visc_swarm_node {
    visc_swarm_node_config cfg;
    char listen_copy[128], peers_copy[1024];
    char address[64];
    visc_dht *dht;
    int listen_fd;
    int wake[2];
    pthread_t accept_thread, workers[VISC_NODE_HANDSHAKE_WORKERS];
    int n_workers, has_accept_thread;

    pthread_mutex_t mu;
    pthread_cond_t changed; /* a channel was queued, a socket accepted, or closing */
    int closing, takers;
    double unclaimed_s;
    int max_pending;
    pending_chan pending[VISC_NODE_MAX_PENDING];
    int n_pending;
    accepting_sock accepting[VISC_NODE_MAX_ACCEPTING];
    int n_accepting;
    standing_answer answers[VISC_NODE_ANSWERS]; /* a ring: the newest at (n_answers - 1) % size */
    int n_answers;
};

void visc_open_encode(visc_purpose purpose, const uint8_t tag[16], uint8_t out[VISC_OPEN_BYTES]) {
    out[0] = (uint8_t)purpose;
    memcpy(out + 1, tag, 16);
}

int visc_open_parse(const uint8_t *msg, size_t n, visc_purpose *purpose, uint8_t tag[16]) {
    if (n != VISC_OPEN_BYTES) return visc_set_error("OPEN frame of %zu bytes (want 17)", n);
    if (msg[0] != VISC_PURPOSE_JOIN && msg[0] != VISC_PURPOSE_ALLREDUCE &&
        msg[0] != VISC_PURPOSE_STATE)
        return visc_set_error("OPEN frame with unknown purpose %u", msg[0]);
    *purpose = (visc_purpose)msg[0];
    memcpy(tag, msg + 1, 16);
    return 0;
}

/* pthread_cond_timedwait on the monotonic clock until deadline (visc_now). */
static void wait_until(visc_swarm_node *n, double deadline) {
    double left = deadline - visc_now();
    if (left <= 0) return;
    if (left > 1.0) left = 1.0; /* re-check conditions at least once a second */
    const struct timespec ts = visc_monotonic_deadline_after(left);
    pthread_cond_timedwait(&n->changed, &n->mu, &ts);
}

/* The standing answer for (purpose, tag), or NULL; under mu. */
static const standing_answer *answer_for(const visc_swarm_node *n, visc_purpose purpose,
                                         const uint8_t tag[16]) {
    int kept = n->n_answers < VISC_NODE_ANSWERS ? n->n_answers : VISC_NODE_ANSWERS;
    for (int i = 0; i < kept; i++) {
        const standing_answer *a = &n->answers[i];
        if (a->purpose == purpose && memcmp(a->tag, tag, 16) == 0) return a;
    }
    return NULL;
}

/* Sends a standing answer (a copy, taken under mu) and closes the channel. */
static void answer_and_close(visc_chan *c, const standing_answer *a) {
    visc_chan_send(c, a->type, a->payload, a->len, visc_now() + 1.0);
    visc_chan_close(c);
}

/* Queues an authenticated channel, answers it (a standing answer), or
 * closes it when the queue is full. */
static void enqueue(visc_swarm_node *n, visc_purpose purpose, const uint8_t tag[16], visc_chan *c) {
    pthread_mutex_lock(&n->mu);
    const standing_answer *found = answer_for(n, purpose, tag);
    if (found) {
        standing_answer a = *found;
        pthread_mutex_unlock(&n->mu);
        answer_and_close(c, &a);
        return;
    }
    if (n->closing || n->n_pending >= n->max_pending) {
        pthread_mutex_unlock(&n->mu);
        visc_chan_close(c); /* refused: the peer sees the connection end */
        return;
    }
    pending_chan *p = &n->pending[n->n_pending++];
    p->purpose = purpose;
    memcpy(p->tag, tag, 16);
    memcpy(p->key, visc_chan_peer_key(c), VISC_KEY_BYTES);
    p->chan = c;
    p->queued_at = visc_now();
    pthread_cond_broadcast(&n->changed);
    pthread_mutex_unlock(&n->mu);
}

/* One accepted socket: handshake, then the OPEN frame, within one deadline. */
static void serve_socket(visc_swarm_node *n, int fd, double accepted_at) {
    /* the deadline counts from accept, so a flood of idle connections is
     * flushed from the queue within VISC_NODE_HANDSHAKE_S */
    double deadline = accepted_at + VISC_NODE_HANDSHAKE_S;
    if (visc_now() >= deadline) return;
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) return;
    visc_chan *c = visc_chan_handshake(dup_fd, 0, n->cfg.auth, deadline);
    if (!c) return;
    uint8_t type = 0, msg[VISC_OPEN_BYTES];
    size_t got = 0;
    visc_purpose purpose = VISC_PURPOSE_JOIN;
    uint8_t tag[16] = {0};
    if (visc_chan_recv(c, &type, msg, sizeof msg, &got, deadline) != 0 || type != VISC_MSG_OPEN ||
        visc_open_parse(msg, got, &purpose, tag) != 0) {
        visc_chan_close(c);
        return;
    }
    enqueue(n, purpose, tag, c);
}

static void *handshake_worker(void *arg) {
    visc_swarm_node *n = arg;
    pthread_mutex_lock(&n->mu);
    for (;;) {
        int slot = -1;
        for (int i = 0; i < n->n_accepting && slot < 0; i++)
            if (!n->accepting[i].busy) slot = i;
        if (n->closing) break;
        if (slot < 0) {
            pthread_cond_wait(&n->changed, &n->mu);
            continue;
        }
        n->accepting[slot].busy = 1;
        int fd = n->accepting[slot].fd;
        double accepted_at = n->accepting[slot].accepted_at;
        pthread_mutex_unlock(&n->mu);
        serve_socket(n, fd, accepted_at);
        pthread_mutex_lock(&n->mu);
        /* the array may have shifted: find the fd again, then drop it */
        for (int i = 0; i < n->n_accepting; i++)
            if (n->accepting[i].fd == fd) {
                n->accepting[i] = n->accepting[--n->n_accepting];
                break;
            }
        close(fd);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

/* Closes queued channels nobody claimed within unclaimed_s. */
static void expire_unclaimed(visc_swarm_node *n) {
    visc_chan *stale[VISC_NODE_MAX_PENDING];
    int n_stale = 0;
    pthread_mutex_lock(&n->mu);
    double now = visc_now();
    for (int i = 0; i < n->n_pending;) {
        if (now - n->pending[i].queued_at >= n->unclaimed_s) {
            stale[n_stale++] = n->pending[i].chan;
            memmove(&n->pending[i], &n->pending[i + 1],
                    (size_t)(n->n_pending - i - 1) * sizeof n->pending[0]);
            n->n_pending--;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&n->mu);
    for (int i = 0; i < n_stale; i++) visc_chan_close(stale[i]);
}

static void *accept_loop(void *arg) {
    visc_swarm_node *n = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = n->listen_fd, .events = POLLIN},
                              {.fd = n->wake[0], .events = POLLIN}};
        /* wake at least every 200 ms to expire unclaimed channels */
        int r = poll(p, 2, 200);
        if (p[1].revents) break;
        expire_unclaimed(n);
        if (r <= 0 || !(p[0].revents & POLLIN)) continue;
        int fd = accept4(n->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) usleep(50000); /* do not spin */
            continue;
        }
        pthread_mutex_lock(&n->mu);
        if (n->n_accepting >= VISC_NODE_MAX_ACCEPTING) {
            pthread_mutex_unlock(&n->mu);
            close(fd);
            continue;
        }
        n->accepting[n->n_accepting++] = (accepting_sock){fd, visc_now(), 0};
        pthread_cond_broadcast(&n->changed);
        pthread_mutex_unlock(&n->mu);
    }
    return NULL;
}

static int start_listener(visc_swarm_node *n) {
    n->listen_fd = visc_tcp_listen(n->cfg.listen, n->address, sizeof n->address);
    if (n->listen_fd < 0) return -1;
    if (pipe2(n->wake, O_CLOEXEC) != 0) return visc_set_error("pipe: %s", strerror(errno));
    for (int i = 0; i < VISC_NODE_HANDSHAKE_WORKERS; i++) {
        if (pthread_create(&n->workers[i], NULL, handshake_worker, n) != 0)
            return visc_set_error("cannot start a handshake thread");
        n->n_workers++;
    }
    if (pthread_create(&n->accept_thread, NULL, accept_loop, n) != 0)
        return visc_set_error("cannot start the accept thread");
    n->has_accept_thread = 1;
    return 0;
}

visc_swarm_node *visc_swarm_node_open(const visc_swarm_node_config *cfg) {
    if (!cfg || !cfg->auth) {
        visc_set_error("swarm node: no credentials");
        return NULL;
    }
    if (!cfg->client && (!cfg->listen || !cfg->listen[0])) {
        visc_set_error("swarm node: a full peer needs a listen address (or client mode)");
        return NULL;
    }
    if (cfg->max_pending < 0 || cfg->max_pending > VISC_NODE_MAX_PENDING || cfg->unclaimed_s < 0 ||
        cfg->bandwidth < 0 || cfg->bandwidth != cfg->bandwidth) {
        visc_set_error("swarm node: bad limits in the configuration");
        return NULL;
    }
    if (sodium_init() < 0) {
        visc_set_error("libsodium failed to initialize");
        return NULL;
    }
    visc_swarm_node *n = visc_calloc(1, sizeof *n, "swarm node");
    if (!n) return NULL;
    n->cfg = *cfg;
    n->listen_fd = -1;
    n->wake[0] = n->wake[1] = -1;
    n->unclaimed_s = cfg->unclaimed_s > 0 ? cfg->unclaimed_s : VISC_NODE_UNCLAIMED_S;
    n->max_pending = cfg->max_pending > 0 ? cfg->max_pending : VISC_NODE_MAX_PENDING;
    if (n->cfg.bandwidth == 0) n->cfg.bandwidth = 1;
    /* the config's strings are the caller's: keep copies */
    if (cfg->listen) snprintf(n->listen_copy, sizeof n->listen_copy, "%s", cfg->listen);
    n->cfg.listen = cfg->listen ? n->listen_copy : NULL;
    if (cfg->initial_peers) {
        if (strlen(cfg->initial_peers) >= sizeof n->peers_copy) {
            visc_set_error("swarm node: initial peers list too long");
            free(n);
            return NULL;
        }
        snprintf(n->peers_copy, sizeof n->peers_copy, "%s", cfg->initial_peers);
        n->cfg.initial_peers = n->peers_copy;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->changed, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&n->mu, NULL);

    if (cfg->dht_port >= 0) {
        /* the DHT binds the listen address's host too: a peer told to
         * listen on one interface opens nothing on the others */
        char host[128] = "";
        const char *colon = cfg->listen ? strrchr(n->listen_copy, ':') : NULL;
        if (colon)
            snprintf(host, sizeof host, "%.*s", (int)(colon - n->listen_copy), n->listen_copy);
        visc_dht_config dc = {.port = cfg->dht_port,
                              .initial_peers = n->cfg.initial_peers,
                              .auth = cfg->auth,
                              .bind_host = host[0] ? host : NULL};
        n->dht = visc_dht_open(&dc);
        if (!n->dht) goto fail;
    }
    if (!cfg->client && start_listener(n) != 0) goto fail;
    return n;
fail:;
    char why[512];
    snprintf(why, sizeof why, "%s", visc_last_error());
    visc_swarm_node_close(n);
    visc_set_error("%s", why);
    return NULL;
}

const char *visc_swarm_node_address(const visc_swarm_node *n) { return n->address; }
visc_dht *visc_swarm_node_dht(visc_swarm_node *n) { return n->dht; }
const visc_swarm_auth *visc_swarm_node_auth(const visc_swarm_node *n) { return n->cfg.auth; }
const visc_swarm_node_config *visc_swarm_node_config_of(const visc_swarm_node *n) {
    return &n->cfg;
}

visc_chan *visc_swarm_node_connect(visc_swarm_node *n, const char *addr, visc_purpose purpose,
                                   const uint8_t tag[16], const uint8_t *expect_key,
                                   double deadline) {
    if (!addr || !addr[0]) {
        visc_set_error("connect: the peer has no address (a client peer accepts nothing)");
        return NULL;
    }
    visc_chan *c = visc_chan_connect(addr, n->cfg.auth, deadline);
    if (!c) return NULL;
    if (expect_key && sodium_memcmp(visc_chan_peer_key(c), expect_key, VISC_KEY_BYTES) != 0) {
        char want[VISC_PEER_ID_CHARS + 1], got[VISC_PEER_ID_CHARS + 1];
        visc_peer_id(expect_key, want);
        visc_peer_id(visc_chan_peer_key(c), got);
        visc_chan_close(c);
        visc_set_error("connect %s: expected peer %s, found %s", addr, want, got);
        return NULL;
    }
    uint8_t open[VISC_OPEN_BYTES];
    visc_open_encode(purpose, tag, open);
    if (visc_chan_send(c, VISC_MSG_OPEN, open, sizeof open, deadline) != 0) {
        visc_chan_close(c);
        return NULL;
    }
    return c;
}

visc_chan *visc_swarm_node_take(visc_swarm_node *n, visc_purpose purpose, const uint8_t tag[16],
                                const uint8_t *peer_key, double deadline) {
    visc_chan *found = NULL;
    pthread_mutex_lock(&n->mu);
    n->takers++;
    for (;;) {
        for (int i = 0; i < n->n_pending && !found; i++) {
            pending_chan *p = &n->pending[i];
            if (p->purpose != purpose || memcmp(p->tag, tag, 16) != 0) continue;
            if (peer_key && memcmp(p->key, peer_key, VISC_KEY_BYTES) != 0) continue;
            found = p->chan;
            memmove(p, p + 1, (size_t)(n->n_pending - i - 1) * sizeof *p);
            n->n_pending--;
        }
        if (found || n->closing || visc_now() >= deadline) break;
        wait_until(n, deadline);
    }
    int closing = n->closing;
    if (--n->takers == 0) pthread_cond_broadcast(&n->changed);
    pthread_mutex_unlock(&n->mu);
    if (!found) visc_set_error(closing ? "swarm node closed" : "timed out");
    return found;
}

int visc_swarm_node_answer(visc_swarm_node *n, visc_purpose purpose, const uint8_t tag[16],
                           uint8_t type, const uint8_t *payload, size_t len) {
    if (len > VISC_NODE_ANSWER_MAX_BYTES)
        return visc_set_error("a standing answer of %zu bytes (at most %d)", len,
                              VISC_NODE_ANSWER_MAX_BYTES);
    standing_answer a = {.purpose = purpose, .type = type, .len = len};
    memcpy(a.tag, tag, 16);
    if (len) memcpy(a.payload, payload, len);
    visc_chan *queued[VISC_NODE_MAX_PENDING];
    int n_queued = 0;
    pthread_mutex_lock(&n->mu);
    n->answers[n->n_answers++ % VISC_NODE_ANSWERS] = a;
    if (n->n_answers >= 2 * VISC_NODE_ANSWERS) n->n_answers -= VISC_NODE_ANSWERS; /* no overflow */
    for (int i = 0; i < n->n_pending;) {
        pending_chan *p = &n->pending[i];
        if (p->purpose == purpose && memcmp(p->tag, tag, 16) == 0) {
            queued[n_queued++] = p->chan;
            memmove(p, p + 1, (size_t)(n->n_pending - i - 1) * sizeof *p);
            n->n_pending--;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&n->mu);
    for (int i = 0; i < n_queued; i++) answer_and_close(queued[i], &a);
    return 0;
}

void visc_swarm_node_unanswer(visc_swarm_node *n, visc_purpose purpose, const uint8_t tag[16]) {
    pthread_mutex_lock(&n->mu);
    const standing_answer *a;
    while ((a = answer_for(n, purpose, tag)) != NULL)
        n->answers[a - n->answers].purpose = 0; /* no purpose: matches nothing */
    pthread_mutex_unlock(&n->mu);
}

int visc_swarm_node_pending(visc_swarm_node *n) {
    pthread_mutex_lock(&n->mu);
    int k = n->n_pending;
    pthread_mutex_unlock(&n->mu);
    return k;
}

void visc_swarm_node_close(visc_swarm_node *n) {
    if (!n) return;
    pthread_mutex_lock(&n->mu);
    n->closing = 1;
    /* end handshakes in progress now rather than at their deadline */
    for (int i = 0; i < n->n_accepting; i++) shutdown(n->accepting[i].fd, SHUT_RDWR);
    pthread_cond_broadcast(&n->changed);
    pthread_mutex_unlock(&n->mu);
    if (n->wake[1] >= 0) {
        ssize_t w = write(n->wake[1], "x", 1);
        (void)w;
    }
    if (n->has_accept_thread) pthread_join(n->accept_thread, NULL);
    for (int i = 0; i < n->n_workers; i++) pthread_join(n->workers[i], NULL);
    pthread_mutex_lock(&n->mu);
    while (n->takers > 0) pthread_cond_wait(&n->changed, &n->mu);
    pthread_mutex_unlock(&n->mu);
    for (int i = 0; i < n->n_accepting; i++) close(n->accepting[i].fd);
    for (int i = 0; i < n->n_pending; i++) visc_chan_close(n->pending[i].chan);
    if (n->listen_fd >= 0) close(n->listen_fd);
    for (int i = 0; i < 2; i++)
        if (n->wake[i] >= 0) close(n->wake[i]);
    if (n->dht) visc_dht_close(n->dht);
    pthread_cond_destroy(&n->changed);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

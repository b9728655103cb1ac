/* dht.c: visc_dht on OpenDHT's C API (the only file that includes it).
 *
 * OpenDHT calls back on its own thread, and may do so after we stopped
 * waiting (a get or put that timed out) or never (the runner shut down
 * first). So every pending operation is a heap object on a list owned by
 * the visc_dht: the waiter marks it abandoned on timeout, the callback
 * frees an abandoned one when it finishes, and close frees whatever is
 * left once the runner (and its threads) are gone. */
#include "dht.h"
#include "dht_bind.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <opendht/opendht_c.h>

#include "visc/core.h"

#define MAX_BOOTSTRAP 64
#define MAX_KEY_CHARS 128
#define PING_TIMEOUT_S 2.0
#define SHUTDOWN_TIMEOUT_S 5.0

typedef enum { OP_GET, OP_PUT, OP_PING } op_kind;

typedef struct op {
    struct op *next;
    visc_dht *d;
    op_kind kind;
    int done, ok, abandoned;
    char key[MAX_KEY_CHARS];
    visc_record *recs; /* OP_GET: newest valid record per signer */
    int n, cap;
} op;

typedef struct listener {
    struct listener *next;
    visc_dht *d;
    int handle;
    char key[MAX_KEY_CHARS];
    dht_infohash hash;
    dht_op_token *token;
    visc_dht_listen_fn fn;
    void *ctx;
    /* calling: held while fn runs, so unlisten can wait it out */
    pthread_mutex_t calling;
    int cancelled; /* under calling: fn is not called any more */
    /* under d->mu: unlisten began / ended; OpenDHT dropped its callback.
     * The listener is freed by whichever of unlisten and the release
     * comes last (or by close). */
    int unlistening, unlistened, released;
} listener;

struct visc_dht {
    dht_runner *runner;
    const visc_swarm_auth *auth;
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op *ops;
    listener *listeners;
    int next_handle;
    struct sockaddr_storage peers[MAX_BOOTSTRAP];
    socklen_t peer_len[MAX_BOOTSTRAP];
    int n_peers;
    /* re-bootstrapping thread */
    pthread_t maint;
    int maint_started, stopping;
    double rebootstrap_s;
    int shut_down;
    uint64_t last_issued_ms; /* under mu: put_value's last issue time */
};

/* ---- pending operations ---- */

static op *op_new(visc_dht *d, op_kind kind, const char *key, int cap) {
    op *o = visc_calloc(1, sizeof *o, "DHT operation");
    if (!o) return NULL;
    o->d = d;
    o->kind = kind;
    if (key) snprintf(o->key, sizeof o->key, "%s", key);
    if (cap > 0) {
        o->recs = visc_calloc((size_t)cap, sizeof *o->recs, "DHT get results");
        if (!o->recs) {
            free(o);
            return NULL;
        }
        o->cap = cap;
    }
    pthread_mutex_lock(&d->mu);
    o->next = d->ops;
    d->ops = o;
    pthread_mutex_unlock(&d->mu);
    return o;
}

/* Unlinks and frees; d->mu held. */
static void op_free_locked(visc_dht *d, op *o) {
    for (op **p = &d->ops; *p; p = &(*p)->next)
        if (*p == o) {
            *p = o->next;
            break;
        }
    free(o->recs);
    free(o);
}

static void on_done(bool ok, void *user) {
    op *o = user;
    visc_dht *d = o->d;
    pthread_mutex_lock(&d->mu);
    if (o->abandoned) {
        op_free_locked(d, o);
    } else {
        o->done = 1;
        o->ok = ok;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
}

/* Waits for o's done callback until timeout_s; d->mu held. 1 when done. */
static int op_wait_locked(visc_dht *d, op *o, double timeout_s) {
    struct timespec until = visc_deadline_after(timeout_s);
    while (!o->done)
        if (pthread_cond_timedwait(&d->cv, &d->mu, &until) == ETIMEDOUT) break;
    return o->done;
}

/* Ends the caller's interest in o; d->mu held. */
static void op_release_locked(visc_dht *d, op *o) {
    if (o->done) op_free_locked(d, o);
    else o->abandoned = 1; /* on_done frees it, or close does */
}

/* ---- keys and records ---- */

static int check_key(const char *key) {
    if (!key || !*key) return visc_set_error("dht: empty record key");
    if (strlen(key) >= MAX_KEY_CHARS)
        return visc_set_error("dht: record key longer than %d characters", MAX_KEY_CHARS - 1);
    return 0;
}

/* Where records of key live: hash(run hash, key). */
static dht_infohash key_infohash(const visc_dht *d, const char *key) {
    uint8_t buf[32 + MAX_KEY_CHARS];
    size_t n = strlen(key);
    memcpy(buf, d->auth->run_hash, 32);
    memcpy(buf + 32, key, n);
    dht_infohash h;
    dht_infohash_get(&h, buf, 32 + n);
    return h;
}

/* Keeps r in recs if it is the newest of its signer; when full, it
 * replaces the oldest record if newer. */
static void keep_newest(visc_record *recs, int *n, int cap, const visc_record *r) {
    for (int i = 0; i < *n; i++)
        if (memcmp(recs[i].signer, r->signer, VISC_KEY_BYTES) == 0) {
            if (r->issued_ms > recs[i].issued_ms) recs[i] = *r;
            return;
        }
    if (*n < cap) {
        recs[(*n)++] = *r;
        return;
    }
    int oldest = 0;
    for (int i = 1; i < *n; i++)
        if (recs[i].issued_ms < recs[oldest].issued_ms) oldest = i;
    if (cap > 0 && r->issued_ms > recs[oldest].issued_ms) recs[oldest] = *r;
}

static bool on_get_value(const dht_value *value, void *user) {
    op *o = user;
    visc_dht *d = o->d;
    dht_data_view v = dht_value_get_data(value);
    visc_record *r = malloc(sizeof *r);
    if (!r) return true;
    int valid = visc_record_parse(d->auth, o->key, v.data, v.size, visc_unix_ms(), r) == 0;
    pthread_mutex_lock(&d->mu);
    int wanted = !o->abandoned;
    if (valid && wanted) keep_newest(o->recs, &o->n, o->cap, r);
    pthread_mutex_unlock(&d->mu);
    free(r);
    return wanted; /* false stops a get nobody waits for */
}

/* ---- bootstrap ---- */

/* Splits "host:port" (or "[v6]:port") into host and port strings. */
static int split_host_port(const char *item, size_t len, char *host, size_t host_cap, char *port,
                           size_t port_cap) {
    const char *end = item + len, *colon;
    const char *h = item, *h_end;
    if (len && item[0] == '[') {
        h = item + 1;
        h_end = memchr(h, ']', (size_t)(end - h));
        if (!h_end || h_end + 1 >= end || h_end[1] != ':') return -1;
        colon = h_end + 1;
    } else {
        colon = NULL;
        for (const char *p = item; p < end; p++)
            if (*p == ':') colon = p;
        if (!colon) return -1;
        h_end = colon;
    }
    size_t hn = (size_t)(h_end - h), pn = (size_t)(end - colon - 1);
    if (hn == 0 || hn >= host_cap || pn == 0 || pn >= port_cap) return -1;
    memcpy(host, h, hn);
    host[hn] = '\0';
    memcpy(port, colon + 1, pn);
    port[pn] = '\0';
    for (size_t i = 0; i < pn; i++)
        if (port[i] < '0' || port[i] > '9') return -1;
    return 0;
}

int visc_dht_bootstrap(visc_dht *d, const char *peers) {
    if (!peers) return 0;
    const char *p = peers;
    while (*p) {
        size_t len = strcspn(p, ",");
        while (len && (*p == ' ')) p++, len--;
        if (len) {
            char host[256], port[16];
            if (split_host_port(p, len, host, sizeof host, port, sizeof port) != 0)
                return visc_set_error("dht: bad peer \"%.*s\" (expected host:port)", (int)len, p);
            struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
            int rc = getaddrinfo(host, port, &hints, &res);
            if (rc != 0)
                return visc_set_error("dht: cannot resolve peer %s:%s (%s)", host, port,
                                      gai_strerror(rc));
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                if (ai->ai_addrlen > sizeof(struct sockaddr_storage)) continue;
                pthread_mutex_lock(&d->mu);
                if (d->n_peers < MAX_BOOTSTRAP) {
                    memcpy(&d->peers[d->n_peers], ai->ai_addr, ai->ai_addrlen);
                    d->peer_len[d->n_peers++] = ai->ai_addrlen;
                }
                pthread_mutex_unlock(&d->mu);
            }
            freeaddrinfo(res);
            dht_runner_bootstrap(d->runner, host, port);
        }
        p += len;
        if (*p == ',') p++;
    }
    return 0;
}

static void on_ping_ignored(bool ok, void *user) {}

/* Pings every bootstrap peer; when count is set, waits (up to
 * PING_TIMEOUT_S) and returns how many answered. */
static int ping_peers(visc_dht *d, int count) {
    op *ops[MAX_BOOTSTRAP];
    int n = 0, answered = 0;
    pthread_mutex_lock(&d->mu);
    int n_peers = d->n_peers;
    struct sockaddr_storage peers[MAX_BOOTSTRAP];
    socklen_t lens[MAX_BOOTSTRAP];
    memcpy(peers, d->peers, sizeof peers);
    memcpy(lens, d->peer_len, sizeof lens);
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < n_peers; i++) {
        if (!count) {
            dht_runner_ping(d->runner, (struct sockaddr *)&peers[i], lens[i], on_ping_ignored,
                            NULL);
            continue;
        }
        op *o = op_new(d, OP_PING, NULL, 0);
        if (!o) break;
        ops[n++] = o;
        dht_runner_ping(d->runner, (struct sockaddr *)&peers[i], lens[i], on_done, o);
    }
    pthread_mutex_lock(&d->mu);
    double until = visc_now() + PING_TIMEOUT_S;
    for (int i = 0; i < n; i++) {
        op_wait_locked(d, ops[i], until - visc_now());
        answered += ops[i]->done && ops[i]->ok;
        op_release_locked(d, ops[i]);
    }
    pthread_mutex_unlock(&d->mu);
    return answered;
}

int visc_dht_node_count(visc_dht *d) { return ping_peers(d, 1); }

/* Pings the bootstrap peers every rebootstrap_s until close. */
static void *maintain(void *arg) {
    visc_dht *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stopping) {
        struct timespec until = visc_deadline_after(d->rebootstrap_s);
        while (!d->stopping)
            if (pthread_cond_timedwait(&d->cv, &d->mu, &until) == ETIMEDOUT) break;
        if (d->stopping) break;
        pthread_mutex_unlock(&d->mu);
        ping_peers(d, 0);
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- open and close ---- */

visc_dht *visc_dht_open(const visc_dht_config *cfg) {
    if (!cfg || !cfg->auth) {
        visc_set_error("dht: no swarm credentials");
        return NULL;
    }
    if (cfg->port < 0 || cfg->port > 65535) {
        visc_set_error("dht: port %d out of range", cfg->port);
        return NULL;
    }
    /* OpenDHT wakes its network thread through a pipe; a wake-up written
     * while a node shuts down can hit a closed pipe, and SIGPIPE would end
     * the whole process (seen once in a test run). Ignored, a failed write
     * is just an error code. */
    signal(SIGPIPE, SIG_IGN);
    visc_dht *d = visc_calloc(1, sizeof *d, "DHT node");
    if (!d) return NULL;
    d->auth = cfg->auth;
    d->rebootstrap_s = cfg->rebootstrap_s > 0 ? cfg->rebootstrap_s : VISC_DHT_REBOOTSTRAP_S;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    d->runner = dht_runner_new();
    dht_runner_config conf;
    dht_runner_config_default(&conf);
    conf.threaded = true;
    conf.peer_discovery = false; /* no multicast: peers come from bootstrap only */
    conf.peer_publish = false;
    conf.log = false;
    /* the network id keeps nodes of other runs (and of the public DHT) apart */
    const uint8_t *h = cfg->auth->run_hash;
    conf.dht_config.node_config.network =
        (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24;
    if (visc_dht_bind_scope_begin(cfg->bind_host)) {
        dht_runner_delete(d->runner);
        d->runner = NULL;
        visc_dht_close(d);
        return NULL;
    }
    int rc = dht_runner_run_config(d->runner, (in_port_t)cfg->port, &conf);
    visc_dht_bind_scope_end();
    if (rc != 0) {
        visc_set_error("dht: cannot start a node on UDP port %d (%s)", cfg->port,
                       strerror(rc < 0 ? -rc : rc));
        dht_runner_delete(d->runner);
        d->runner = NULL;
        visc_dht_close(d);
        return NULL;
    }
    d->port = dht_runner_get_bound_port(d->runner, AF_INET);
    /* bound to an IPv6 address only: there is no IPv4 socket */
    if (d->port == 0) d->port = dht_runner_get_bound_port(d->runner, AF_INET6);
    if (visc_dht_bootstrap(d, cfg->initial_peers) != 0) {
        visc_dht_close(d);
        return NULL;
    }
    if (pthread_create(&d->maint, NULL, maintain, d) != 0) {
        visc_set_error("dht: cannot start the maintenance thread");
        visc_dht_close(d);
        return NULL;
    }
    d->maint_started = 1;
    return d;
}

int visc_dht_port(const visc_dht *d) { return d->port; }

static void on_shutdown(void *user) {
    visc_dht *d = user;
    pthread_mutex_lock(&d->mu);
    d->shut_down = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

static void free_listener(listener *l) {
    pthread_mutex_destroy(&l->calling);
    free(l);
}

void visc_dht_close(visc_dht *d) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->stopping = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    if (d->maint_started) pthread_join(d->maint, NULL);
    /* no user callback runs from here on */
    for (listener *l = d->listeners; l; l = l->next) {
        pthread_mutex_lock(&l->calling);
        l->cancelled = 1;
        pthread_mutex_unlock(&l->calling);
    }
    if (d->runner) {
        dht_runner_shutdown(d->runner, on_shutdown, d);
        pthread_mutex_lock(&d->mu);
        struct timespec until = visc_deadline_after(SHUTDOWN_TIMEOUT_S);
        while (!d->shut_down)
            if (pthread_cond_timedwait(&d->cv, &d->mu, &until) == ETIMEDOUT) break;
        pthread_mutex_unlock(&d->mu);
        /* joins OpenDHT's threads: no callback runs after this */
        dht_runner_delete(d->runner);
    }
    while (d->ops) op_free_locked(d, d->ops);
    while (d->listeners) {
        listener *l = d->listeners;
        d->listeners = l->next;
        if (l->token) dht_op_token_delete(l->token);
        free_listener(l);
    }
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

/* ---- put and get ---- */

/* Stores wire; 0 once confirmed. Not confirmed within timeout_s: 1 when
 * late_ok (the store goes on), else -1. */
static int put_wire(visc_dht *d, const char *key, const uint8_t *wire, size_t n, double timeout_s,
                    int late_ok) {
    if (n == 0 || n > VISC_RECORD_MAX_WIRE)
        return visc_set_error("dht: record of %zu bytes (1 to %d)", n, VISC_RECORD_MAX_WIRE);
    op *o = op_new(d, OP_PUT, key, 0);
    if (!o) return -1;
    dht_infohash h = key_infohash(d, key);
    dht_value *v = dht_value_new(wire, n);
    dht_runner_put(d->runner, &h, v, on_done, o, false);
    dht_value_unref(v); /* the runner holds its own reference */
    pthread_mutex_lock(&d->mu);
    int done = op_wait_locked(d, o, timeout_s), ok = o->ok;
    op_release_locked(d, o);
    pthread_mutex_unlock(&d->mu);
    if (!done && late_ok) return 1;
    if (!done)
        return visc_set_error("dht: put of \"%s\" not confirmed within %g s", key, timeout_s);
    if (!ok) return visc_set_error("dht: put of \"%s\" failed (no node stored it)", key);
    return 0;
}

int visc_dht_put_wire(visc_dht *d, const char *key, const uint8_t *wire, size_t n,
                      double timeout_s) {
    if (check_key(key) != 0) return -1;
    return put_wire(d, key, wire, n, timeout_s, 0);
}

/* Signs and stores value (put_wire's results). */
static int put_value(visc_dht *d, const char *key, const void *value, size_t n, double ttl_s,
                     double timeout_s, int late_ok) {
    if (check_key(key) != 0) return -1;
    if (!(ttl_s > 0) || ttl_s * 1000.0 > (double)VISC_RECORD_MAX_TTL_MS)
        return visc_set_error("dht: ttl %g s out of range (0, %llu]", ttl_s,
                              (unsigned long long)(VISC_RECORD_MAX_TTL_MS / 1000));
    uint8_t *wire = visc_malloc(VISC_RECORD_MAX_WIRE, "DHT record");
    if (!wire) return -1;
    /* Readers keep the newest record per signer, by issue time: two puts
     * in one millisecond must not tie (the older could win), so issue
     * times strictly increase. */
    pthread_mutex_lock(&d->mu);
    uint64_t now = visc_unix_ms();
    if (now <= d->last_issued_ms) now = d->last_issued_ms + 1;
    d->last_issued_ms = now;
    pthread_mutex_unlock(&d->mu);
    int len = visc_record_encode(d->auth, key, value, n, now, now + (uint64_t)(ttl_s * 1000.0),
                                 wire, VISC_RECORD_MAX_WIRE);
    int rc = len < 0 ? -1 : put_wire(d, key, wire, (size_t)len, timeout_s, late_ok);
    free(wire);
    return rc;
}

int visc_dht_put(visc_dht *d, const char *key, const void *value, size_t n, double ttl_s,
                 double timeout_s) {
    return put_value(d, key, value, n, ttl_s, timeout_s, 0);
}

int visc_dht_send(visc_dht *d, const char *key, const void *value, size_t n, double ttl_s,
                  double wait_s) {
    return put_value(d, key, value, n, ttl_s, wait_s, 1);
}

int visc_dht_get(visc_dht *d, const char *key, visc_record *out, int cap, double timeout_s) {
    if (check_key(key) != 0) return -1;
    if (cap < 1 || cap > VISC_DHT_MAX_GET)
        return visc_set_error("dht: get of %d records (1 to %d)", cap, VISC_DHT_MAX_GET);
    op *o = op_new(d, OP_GET, key, cap);
    if (!o) return -1;
    dht_infohash h = key_infohash(d, key);
    dht_runner_get(d->runner, &h, on_get_value, on_done, o);
    pthread_mutex_lock(&d->mu);
    op_wait_locked(d, o, timeout_s);
    int n = o->n;
    memcpy(out, o->recs, (size_t)n * sizeof *out);
    o->n = 0;
    op_release_locked(d, o);
    pthread_mutex_unlock(&d->mu);
    return n;
}

/* ---- listen ---- */

static bool on_listen_value(const dht_value *value, bool expired, void *user) {
    listener *l = user;
    if (expired) return true;
    dht_data_view v = dht_value_get_data(value);
    visc_record *r = malloc(sizeof *r);
    if (!r) return true;
    if (visc_record_parse(l->d->auth, l->key, v.data, v.size, visc_unix_ms(), r) == 0) {
        pthread_mutex_lock(&l->calling);
        if (!l->cancelled) l->fn(r, l->ctx);
        pthread_mutex_unlock(&l->calling);
    }
    free(r);
    return true;
}

/* OpenDHT dropped the listen callback: the listener may go once unlistened. */
static void on_listen_released(void *user) {
    listener *l = user;
    visc_dht *d = l->d;
    pthread_mutex_lock(&d->mu);
    l->released = 1;
    if (l->unlistened && !d->stopping) {
        for (listener **p = &d->listeners; *p; p = &(*p)->next)
            if (*p == l) {
                *p = l->next;
                break;
            }
        free_listener(l);
    }
    pthread_mutex_unlock(&d->mu);
}

int visc_dht_listen(visc_dht *d, const char *key, visc_dht_listen_fn fn, void *ctx) {
    if (check_key(key) != 0) return -1;
    if (!fn) return visc_set_error("dht: listen without a callback");
    listener *l = visc_calloc(1, sizeof *l, "DHT listener");
    if (!l) return -1;
    l->d = d;
    snprintf(l->key, sizeof l->key, "%s", key);
    l->hash = key_infohash(d, key);
    l->fn = fn;
    l->ctx = ctx;
    pthread_mutex_init(&l->calling, NULL);
    pthread_mutex_lock(&d->mu);
    l->handle = d->next_handle++;
    l->next = d->listeners;
    d->listeners = l;
    pthread_mutex_unlock(&d->mu);
    l->token = dht_runner_listen(d->runner, &l->hash, on_listen_value, on_listen_released, l);
    return l->handle;
}

void visc_dht_unlisten(visc_dht *d, int handle) {
    pthread_mutex_lock(&d->mu);
    listener *l = d->listeners;
    while (l && l->handle != handle) l = l->next;
    if (!l || l->unlistening) {
        pthread_mutex_unlock(&d->mu);
        return;
    }
    l->unlistening = 1;
    pthread_mutex_unlock(&d->mu);
    /* waits out a running fn; none starts after this */
    pthread_mutex_lock(&l->calling);
    l->cancelled = 1;
    pthread_mutex_unlock(&l->calling);
    dht_op_token *token = l->token;
    dht_runner_cancel_listen(d->runner, &l->hash, token);
    dht_op_token_delete(token);
    pthread_mutex_lock(&d->mu);
    l->token = NULL;
    l->unlistened = 1;
    if (l->released) {
        for (listener **p = &d->listeners; *p; p = &(*p)->next)
            if (*p == l) {
                *p = l->next;
                break;
            }
        free_listener(l);
    }
    pthread_mutex_unlock(&d->mu);
}

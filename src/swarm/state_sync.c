/* state_sync.c: state download for late joiners and laggards (the protocol
 * is in state_sync.h). First the messages and their strict parsers, then
 * the donor's server (one thread taking channels, a capped set of transfer
 * threads), then the downloader: donor order, one attempt, the retry loop. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "state_sync.h"
#include "visc/core.h"
#include "visc/rng.h"
#include "wire.h"

#define STATE_VERSION 1
#define SIGN_LABEL "visc-state-v1"
#define SIGNED_BYTES (sizeof SIGN_LABEL - 1 + 32 + 8 + 8 + 32)
#define TAKE_POLL_S 0.05  /* how often the server thread looks at `stopping` */
#define BUSY_DRAIN_S 0.5  /* a refused requester's request is read (not RST) for this long */
#define RNG_STREAM 0x5354 /* "ST": the donor shuffle's Philox stream */

static const uint8_t state_tag[16]; /* every state channel: all zeros */

/* ---- messages ---- */

void visc_state_request_encode(const visc_state_request *r, uint8_t out[VISC_STATE_REQUEST_BYTES]) {
    out[0] = STATE_VERSION;
    visc_put_u64(out + 1, r->min_epoch);
    visc_put_u64(out + 9, r->max_bytes);
}

int visc_state_request_parse(const uint8_t *msg, size_t n, visc_state_request *out) {
    if (n != VISC_STATE_REQUEST_BYTES)
        return visc_set_error("state request of %zu bytes (want %d)", n, VISC_STATE_REQUEST_BYTES);
    if (msg[0] != STATE_VERSION) return visc_set_error("state request version %u", msg[0]);
    out->min_epoch = visc_get_u64(msg + 1);
    out->max_bytes = visc_get_u64(msg + 9);
    if (out->max_bytes == 0) return visc_set_error("state request with a cap of 0 bytes");
    return 0;
}

static void signed_message(const visc_state_header *h, const uint8_t run_hash[32],
                           uint8_t m[SIGNED_BYTES]) {
    size_t off = sizeof SIGN_LABEL - 1;
    memcpy(m, SIGN_LABEL, off);
    memcpy(m + off, run_hash, 32), off += 32;
    visc_put_u64(m + off, h->epoch), off += 8;
    visc_put_u64(m + off, h->size), off += 8;
    memcpy(m + off, h->hash, 32);
}

void visc_state_header_sign(visc_state_header *h, const uint8_t run_hash[32],
                            const visc_identity *donor) {
    uint8_t m[SIGNED_BYTES];
    signed_message(h, run_hash, m);
    crypto_sign_detached(h->signature, NULL, m, sizeof m, donor->secret_key);
}

void visc_state_header_encode(const visc_state_header *h, uint8_t out[VISC_STATE_HEADER_BYTES]) {
    out[0] = STATE_VERSION;
    visc_put_u64(out + 1, h->epoch);
    visc_put_u64(out + 9, h->size);
    memcpy(out + 17, h->hash, 32);
    memcpy(out + 49, h->signature, 64);
}

int visc_state_header_parse(const uint8_t *msg, size_t n, const uint8_t run_hash[32],
                            const uint8_t donor_key[VISC_KEY_BYTES], visc_state_header *out) {
    if (n != VISC_STATE_HEADER_BYTES)
        return visc_set_error("state header of %zu bytes (want %d)", n, VISC_STATE_HEADER_BYTES);
    if (msg[0] != STATE_VERSION) return visc_set_error("state header version %u", msg[0]);
    out->epoch = visc_get_u64(msg + 1);
    out->size = visc_get_u64(msg + 9);
    memcpy(out->hash, msg + 17, 32);
    memcpy(out->signature, msg + 49, 64);
    if (out->size == 0) return visc_set_error("state header announces an empty state");
    uint8_t m[SIGNED_BYTES];
    signed_message(out, run_hash, m);
    if (crypto_sign_verify_detached(out->signature, m, sizeof m, donor_key) != 0)
        return visc_set_error("state header: bad signature");
    return 0;
}

void visc_state_refuse_encode(visc_state_refuse_reason why, uint8_t out[VISC_STATE_REFUSE_BYTES]) {
    out[0] = STATE_VERSION;
    out[1] = (uint8_t)why;
}

int visc_state_refuse_parse(const uint8_t *msg, size_t n, visc_state_refuse_reason *why) {
    if (n != VISC_STATE_REFUSE_BYTES || msg[0] != STATE_VERSION)
        return visc_set_error("malformed state refusal");
    if (msg[1] < VISC_STATE_REFUSE_BUSY || msg[1] > VISC_STATE_REFUSE_BAD_REQUEST)
        return visc_set_error("state refusal with unknown reason %u", msg[1]);
    *why = (visc_state_refuse_reason)msg[1];
    return 0;
}

const char *visc_state_refuse_name(visc_state_refuse_reason why) {
    switch (why) {
    case VISC_STATE_REFUSE_BUSY: return "busy";
    case VISC_STATE_REFUSE_UNAVAILABLE: return "no state available";
    case VISC_STATE_REFUSE_STALE: return "its state is older than requested";
    case VISC_STATE_REFUSE_TOO_LARGE: return "its state exceeds our cap";
    case VISC_STATE_REFUSE_BAD_REQUEST: return "bad request";
    }
    return "unknown reason";
}

int visc_state_hash(const uint8_t *blob, size_t n, uint8_t out[32]) {
    if (!blob && n) return visc_set_error("state hash of a NULL blob");
    if (sodium_init() < 0) return visc_set_error("libsodium failed to initialize");
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    /* in pieces: crypto_generichash takes an unsigned long long length, and
     * a state may be larger than anything worth passing at once */
    for (size_t off = 0; off < n; off += VISC_STATE_CHUNK) {
        size_t k = n - off < VISC_STATE_CHUNK ? n - off : VISC_STATE_CHUNK;
        crypto_generichash_update(&st, blob + off, k);
    }
    crypto_generichash_final(&st, out, 32);
    return 0;
}

/* ---- the donor's server ---- */

typedef struct {
    visc_state_server *server;
    visc_chan *chan; /* NULL once the transfer thread closes it */
    pthread_t thread;
    int used, done;
} transfer_slot;

struct visc_state_server {
    visc_swarm_node *node;
    visc_state_snapshot_fn snapshot;
    void *ctx;
    pthread_t thread;
    pthread_mutex_t mu;
    int stopping;
    transfer_slot slots[VISC_STATE_MAX_SERVING];
    uint64_t served, refused;
};

static void count(visc_state_server *s, uint64_t *counter) {
    pthread_mutex_lock(&s->mu);
    (*counter)++;
    pthread_mutex_unlock(&s->mu);
}

static void refuse(visc_state_server *s, visc_chan *c, visc_state_refuse_reason why) {
    uint8_t msg[VISC_STATE_REFUSE_BYTES];
    visc_state_refuse_encode(why, msg);
    visc_chan_send(c, VISC_MSG_STATE_REFUSE, msg, sizeof msg, visc_now() + 1.0);
    count(s, &s->refused);
}

/* One transfer: request, snapshot, header, chunks. */
static void serve(visc_state_server *s, visc_chan *c) {
    const visc_swarm_auth *auth = visc_swarm_node_auth(s->node);
    uint8_t type = 0, msg[VISC_STATE_REQUEST_BYTES];
    size_t got = 0;
    visc_state_request req;
    if (visc_chan_recv(c, &type, msg, sizeof msg, &got, visc_now() + VISC_STATE_REQUEST_S) != 0)
        return; /* gone, or too slow to ask: nothing to answer */
    if (type != VISC_MSG_STATE_REQUEST || visc_state_request_parse(msg, got, &req) != 0) {
        refuse(s, c, VISC_STATE_REFUSE_BAD_REQUEST);
        return;
    }
    uint8_t *blob = NULL;
    size_t n = 0;
    visc_state_header h;
    memset(&h, 0, sizeof h);
    if (s->snapshot(s->ctx, req.min_epoch, &blob, &n, &h.epoch, h.hash) != 0 || !blob || n == 0) {
        free(blob);
        refuse(s, c, VISC_STATE_REFUSE_UNAVAILABLE);
        return;
    }
    if (h.epoch < req.min_epoch || (uint64_t)n > req.max_bytes) {
        free(blob);
        refuse(s, c,
               h.epoch < req.min_epoch ? VISC_STATE_REFUSE_STALE : VISC_STATE_REFUSE_TOO_LARGE);
        return;
    }
    h.size = n;
    visc_state_header_sign(&h, auth->run_hash, &auth->self);
    uint8_t head[VISC_STATE_HEADER_BYTES];
    visc_state_header_encode(&h, head);
    double start = visc_now();
    double total = start + VISC_STATE_CHUNK_S + (double)n / VISC_STATE_MIN_RATE;
    int ok = visc_chan_send(c, VISC_MSG_STATE_HEADER, head, sizeof head,
                            start + VISC_STATE_CHUNK_S) == 0;
    for (size_t off = 0; ok && off < n; off += VISC_STATE_CHUNK) {
        size_t k = n - off < VISC_STATE_CHUNK ? n - off : VISC_STATE_CHUNK;
        double deadline = visc_now() + VISC_STATE_CHUNK_S;
        if (deadline > total) deadline = total;
        ok = visc_chan_send(c, VISC_MSG_STATE_CHUNK, blob + off, k, deadline) == 0;
    }
    free(blob);
    if (ok) count(s, &s->served);
}

static void *transfer_main(void *arg) {
    transfer_slot *slot = arg;
    visc_state_server *s = slot->server;
    serve(s, slot->chan);
    pthread_mutex_lock(&s->mu);
    visc_chan *c = slot->chan;
    slot->chan = NULL; /* stop() no longer shuts it down: it is about to be freed */
    slot->done = 1;
    pthread_mutex_unlock(&s->mu);
    visc_chan_close(c);
    return NULL;
}

/* Joins finished transfer threads (all of them when `all`). */
static void reap(visc_state_server *s, int all) {
    for (int i = 0; i < VISC_STATE_MAX_SERVING; i++) {
        transfer_slot *slot = &s->slots[i];
        pthread_mutex_lock(&s->mu);
        int join = slot->used && (slot->done || all);
        pthread_mutex_unlock(&s->mu);
        if (!join) continue;
        pthread_join(slot->thread, NULL);
        pthread_mutex_lock(&s->mu);
        slot->used = 0;
        pthread_mutex_unlock(&s->mu);
    }
}

/* Refused for lack of a slot: read the request first (briefly), so that
 * closing with unread bytes does not reset the connection before the
 * requester reads why. */
static void refuse_busy(visc_state_server *s, visc_chan *c) {
    uint8_t type, msg[VISC_STATE_REQUEST_BYTES];
    size_t got;
    if (visc_chan_recv(c, &type, msg, sizeof msg, &got, visc_now() + BUSY_DRAIN_S) == 0)
        refuse(s, c, VISC_STATE_REFUSE_BUSY);
    else count(s, &s->refused);
    visc_chan_close(c);
}

static void *server_main(void *arg) {
    visc_state_server *s = arg;
    for (;;) {
        reap(s, 0);
        pthread_mutex_lock(&s->mu);
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stopping) break;
        visc_chan *c = visc_swarm_node_take(s->node, VISC_PURPOSE_STATE, state_tag, NULL,
                                            visc_now() + TAKE_POLL_S);
        if (!c) continue;
        reap(s, 0); /* transfers that ended while we waited free their slots */
        transfer_slot *slot = NULL;
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < VISC_STATE_MAX_SERVING && !slot && !s->stopping; i++)
            if (!s->slots[i].used) slot = &s->slots[i];
        if (slot) {
            slot->used = 1;
            slot->done = 0;
            slot->chan = c;
            if (pthread_create(&slot->thread, NULL, transfer_main, slot) != 0) {
                slot->used = 0;
                slot->chan = NULL;
                slot = NULL;
            }
        }
        pthread_mutex_unlock(&s->mu);
        if (!slot) refuse_busy(s, c);
    }
    return NULL;
}

visc_state_server *visc_state_server_start(visc_swarm_node *node, visc_state_snapshot_fn fn,
                                           void *ctx) {
    if (!node || !fn) {
        visc_set_error("state server: no node or no snapshot function");
        return NULL;
    }
    if (sodium_init() < 0) {
        visc_set_error("libsodium failed to initialize");
        return NULL;
    }
    visc_state_server *s = visc_calloc(1, sizeof *s, "state server");
    if (!s) return NULL;
    s->node = node;
    s->snapshot = fn;
    s->ctx = ctx;
    for (int i = 0; i < VISC_STATE_MAX_SERVING; i++) s->slots[i].server = s;
    pthread_mutex_init(&s->mu, NULL);
    if (pthread_create(&s->thread, NULL, server_main, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        visc_set_error("state server: cannot start its thread");
        return NULL;
    }
    return s;
}

void visc_state_server_stop(visc_state_server *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    for (int i = 0; i < VISC_STATE_MAX_SERVING; i++)
        if (s->slots[i].used && s->slots[i].chan) visc_chan_shutdown(s->slots[i].chan);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    reap(s, 1);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int visc_state_server_active(visc_state_server *s) {
    int k = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < VISC_STATE_MAX_SERVING; i++) k += s->slots[i].used && !s->slots[i].done;
    pthread_mutex_unlock(&s->mu);
    return k;
}

uint64_t visc_state_server_served(visc_state_server *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t k = s->served;
    pthread_mutex_unlock(&s->mu);
    return k;
}

uint64_t visc_state_server_refused(visc_state_server *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t k = s->refused;
    pthread_mutex_unlock(&s->mu);
    return k;
}

/* ---- donor order ---- */

static int hash_known(const uint8_t h[32]) {
    static const uint8_t zero[32];
    return sodium_memcmp(h, zero, 32) != 0;
}

static int addr_ok(const char addr[64]) {
    size_t len = strnlen(addr, 64);
    return len > 0 && len < 64;
}

static int servable(const visc_progress_record *r, const uint8_t *self_key) {
    if (self_key && memcmp(r->peer, self_key, VISC_KEY_BYTES) == 0) return 0;
    return addr_ok(r->addr) && hash_known(r->state_hash);
}

/* Another peer's record states the same (epoch, hash). */
static int corroborated(const visc_progress_record *records, int n, int i) {
    for (int j = 0; j < n; j++)
        if (j != i && records[j].epoch == records[i].epoch &&
            memcmp(records[j].peer, records[i].peer, VISC_KEY_BYTES) != 0 &&
            memcmp(records[j].state_hash, records[i].state_hash, 32) == 0)
            return 1;
    return 0;
}

int visc_state_donor_order(const visc_progress_record *records, int n, const uint8_t *self_key,
                           int require_corroboration, uint64_t seed, int *order) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (servable(&records[i], self_key) &&
            (!require_corroboration || corroborated(records, n, i)))
            order[k++] = i;
    /* highest epoch first (insertion sort: a swarm's records, not millions) */
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && records[order[j]].epoch > records[order[j - 1]].epoch; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    if (seed == 0) randombytes_buf(&seed, sizeof seed);
    visc_rng rng = visc_rng_make(seed, RNG_STREAM, 0);
    for (int lo = 0; lo < k;) {
        int hi = lo;
        while (hi < k && records[order[hi]].epoch == records[order[lo]].epoch) hi++;
        for (int i = hi - 1; i > lo; i--) { /* Fisher-Yates within [lo, hi) */
            int j = lo + (int)visc_rng_below(&rng, (uint32_t)(i - lo + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        lo = hi;
    }
    return k;
}

/* ---- the downloader ---- */

static void hex8(const uint8_t *h, char out[17]) {
    for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* Each frame from a donor is due within `step`, and all by `deadline`. */
static double next_deadline(double step, double deadline) {
    double t = visc_now() + step;
    return t < deadline ? t : deadline;
}

/* What to ask a donor for: the state of `epoch` whose hash is `hash`. */
typedef struct {
    int donor; /* index into the records */
    uint64_t epoch;
    const uint8_t *hash;
} target;

/* One donor: 0 with the verified blob, or -1 with why (one phrase). */
static int attempt(visc_swarm_node *node, const visc_progress_record *r, const target *want,
                   const visc_state_download_config *cfg, uint8_t **blob_out, size_t *n_out) {
    double deadline = visc_now() + cfg->timeout_s;
    double step = cfg->chunk_timeout_s;
    visc_chan *c = visc_swarm_node_connect(node, r->addr, VISC_PURPOSE_STATE, state_tag, r->peer,
                                           next_deadline(step, deadline));
    if (!c) return -1;
    uint8_t *blob = NULL;
    uint8_t msg[VISC_STATE_HEADER_BYTES], type = 0;
    size_t got = 0;
    visc_state_request req = {.min_epoch = want->epoch, .max_bytes = cfg->max_bytes};
    visc_state_request_encode(&req, msg);
    if (visc_chan_send(c, VISC_MSG_STATE_REQUEST, msg, VISC_STATE_REQUEST_BYTES,
                       next_deadline(step, deadline)) != 0 ||
        visc_chan_recv(c, &type, msg, sizeof msg, &got, next_deadline(step, deadline)) != 0)
        goto fail;
    visc_state_refuse_reason reason = VISC_STATE_REFUSE_BAD_REQUEST;
    if (type == VISC_MSG_STATE_REFUSE) {
        if (visc_state_refuse_parse(msg, got, &reason) == 0)
            visc_set_error("refused: %s", visc_state_refuse_name(reason));
        goto fail;
    }
    visc_state_header h;
    if (type != VISC_MSG_STATE_HEADER) {
        visc_set_error("sent frame type %u instead of a state header", type);
        goto fail;
    }
    if (visc_state_header_parse(msg, got, visc_swarm_node_auth(node)->run_hash, r->peer, &h) != 0)
        goto fail;
    char want_hex[17], have[17];
    hex8(want->hash, want_hex);
    hex8(h.hash, have);
    if (h.epoch != want->epoch) {
        visc_set_error("serves epoch %llu, published %llu", (unsigned long long)h.epoch,
                       (unsigned long long)want->epoch);
        goto fail;
    }
    if (sodium_memcmp(h.hash, want->hash, 32) != 0) {
        visc_set_error("serves hash %s, published %s", have, want_hex);
        goto fail;
    }
    /* before allocating anything */
    if (h.size > (uint64_t)cfg->max_bytes) {
        visc_set_error("state of %llu bytes exceeds the cap of %zu", (unsigned long long)h.size,
                       cfg->max_bytes);
        goto fail;
    }
    size_t n = (size_t)h.size;
    blob = visc_malloc(n, "downloaded state");
    if (!blob) goto fail;
    for (size_t off = 0; off < n; off += VISC_STATE_CHUNK) {
        size_t k = n - off < VISC_STATE_CHUNK ? n - off : VISC_STATE_CHUNK;
        if (visc_chan_recv(c, &type, blob + off, k, &got, next_deadline(step, deadline)) != 0) {
            char why[256];
            snprintf(why, sizeof why, "%s", visc_last_error());
            visc_set_error("chunk at byte %zu of %zu: %s", off, n, why);
            goto fail;
        }
        if (type != VISC_MSG_STATE_CHUNK || got != k) {
            visc_set_error("chunk at byte %zu: type %u, %zu bytes (want %zu)", off, type, got, k);
            goto fail;
        }
    }
    uint8_t actual[32];
    visc_state_hash(blob, n, actual);
    if (sodium_memcmp(actual, h.hash, 32) != 0) {
        hex8(actual, have);
        visc_set_error("sent bytes hashing to %s, not the signed %s", have, want_hex);
        goto fail;
    }
    visc_chan_close(c);
    *blob_out = blob;
    *n_out = n;
    return 0;
fail:
    free(blob);
    visc_chan_close(c);
    return -1;
}

/* The attempts, best first: each donor of `order` for the state it
 * publishes (corroborated by another record), then, with corroboration,
 * pairs that records alone do not show: a state (epoch, hash) that one peer
 * publishes, asked of another peer that has moved on by fewer than
 * VISC_STATE_HISTORY epochs (it still serves it; its signed header vouches
 * for the hash, the publisher's record for the same). While the swarm steps
 * faster than records spread, two records rarely show one epoch at once.
 * Highest epoch first; the pairs keep the donors' shuffled order. States
 * below cfg->min_epoch are left out. */
static int targets(const visc_progress_record *records, int n, const uint8_t *self,
                   const int *order, int k, const visc_state_download_config *cfg, target *out) {
    int m = 0;
    for (int i = 0; i < k; i++)
        if (records[order[i]].epoch >= cfg->min_epoch)
            out[m++] = (target){order[i], records[order[i]].epoch, records[order[i]].state_hash};
    if (cfg->require_corroboration)
        for (int q = 0; q < n; q++) {
            const visc_progress_record *pub = &records[q];
            if (!hash_known(pub->state_hash) || pub->epoch < cfg->min_epoch ||
                (self && memcmp(pub->peer, self, VISC_KEY_BYTES) == 0))
                continue;
            for (int i = 0; i < k + n; i++) { /* donors: shuffled ones, then the rest */
                int d = i < k ? order[i] : i - k;
                const visc_progress_record *r = &records[d];
                int in_order = 0;
                for (int j = 0; j < k && i >= k; j++) in_order |= order[j] == d;
                if (in_order || d == q || !servable(r, self) || r->epoch <= pub->epoch ||
                    r->epoch - pub->epoch >= VISC_STATE_HISTORY ||
                    memcmp(r->peer, pub->peer, VISC_KEY_BYTES) == 0)
                    continue;
                out[m++] = (target){d, pub->epoch, pub->state_hash};
            }
        }
    /* highest epoch first, stable (insertion sort: a swarm's records) */
    for (int i = 1; i < m; i++)
        for (int j = i; j > 0 && out[j].epoch > out[j - 1].epoch; j--) {
            target t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return m;
}

visc_state_download_config visc_state_download_defaults(size_t max_bytes) {
    visc_state_download_config c;
    memset(&c, 0, sizeof c);
    c.max_bytes = max_bytes;
    c.require_corroboration = 1;
    return c;
}

/* Appends a formatted phrase to the failure line (truncating). */
__attribute__((format(printf, 3, 4))) static void note(char *line, size_t cap, const char *fmt,
                                                       ...) {
    size_t len = strlen(line);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + len, cap - len, fmt, ap);
    va_end(ap);
}

int visc_state_download(visc_swarm_node *node, const visc_progress_record *records, int n,
                        const visc_state_download_config *cfg_in, uint8_t **blob, size_t *size,
                        uint64_t *epoch, uint8_t hash[32]) {
    if (!node || !cfg_in || (n > 0 && !records) || n < 0)
        return visc_set_error("state download: bad arguments");
    if (cfg_in->max_bytes == 0) return visc_set_error("state download: no size cap (max_bytes 0)");
    if (sodium_init() < 0) return visc_set_error("libsodium failed to initialize");
    visc_state_download_config cfg = *cfg_in;
    if (!(cfg.timeout_s > 0)) cfg.timeout_s = 60;
    if (!(cfg.chunk_timeout_s > 0)) cfg.chunk_timeout_s = VISC_STATE_CHUNK_S;
    if (cfg.max_attempts <= 0) cfg.max_attempts = 3;
    const uint8_t *self = visc_swarm_node_auth(node)->self.public_key;
    int *order = visc_malloc((size_t)(n > 0 ? n : 1) * sizeof *order, "donor order");
    int k = 0, m = 0;
    target *want =
        order ? visc_malloc((size_t)(n * (n > 1 ? n : 1) + 1) * sizeof *want, "donor targets")
              : NULL;
    if (want) {
        k = visc_state_donor_order(records, n, self, cfg.require_corroboration, cfg.seed, order);
        m = targets(records, n, self, order, k, &cfg, want);
    }
    char line[480] = "";
    for (int a = 0; a < m && a < cfg.max_attempts; a++) {
        const visc_progress_record *r = &records[want[a].donor];
        uint8_t *got = NULL;
        size_t got_n = 0;
        if (attempt(node, r, &want[a], &cfg, &got, &got_n) == 0) {
            /* the attempt checked the header's epoch and hash against the
             * target, and the bytes against the header */
            *blob = got;
            *size = got_n;
            *epoch = want[a].epoch;
            memcpy(hash, want[a].hash, 32);
            free(want);
            free(order);
            return 0;
        }
        char id[VISC_PEER_ID_CHARS + 1];
        visc_peer_id(r->peer, id);
        note(line, sizeof line, "%s%s@%s: %s", line[0] ? "; " : "", id, r->addr, visc_last_error());
    }
    free(want);
    if (!order) return -1;
    /* records that could have served but were not corroborated */
    int skipped = 0;
    for (int i = 0; i < n; i++)
        if (servable(&records[i], self) && cfg.require_corroboration &&
            !corroborated(records, n, i))
            skipped++;
    free(order);
    if (m == 0)
        return visc_set_error("state download: no donor among %d records (%d with a state hash "
                              "that no other peer published)",
                              n, skipped);
    int tried = m < cfg.max_attempts ? m : cfg.max_attempts;
    return visc_set_error("state download failed (%d of %d donors tried%s): %s", tried, m,
                          skipped ? ", uncorroborated ones skipped" : "", line);
}

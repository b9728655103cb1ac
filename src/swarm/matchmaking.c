/* matchmaking.c: forming the groups of one averaging round (the protocol is
 * described in matchmaking.h). First the wire messages and their strict
 * parsers, then the view of the round's declarations, then the two roles:
 * leading (gathering JOINs, sending GROUP) and following (JOIN, waiting
 * for GROUP or REJECT), and visc_matchmake, which moves between them until
 * a group forms or the time is up. */
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "matchmaking.h"
#include "visc/core.h"
#include "wire.h"

#define MM_VERSION 1
#define MM_MAX_BANDWIDTH 1e13 /* bytes/s; anything above is a lie */
#define MM_MAX_DECLARATIONS 256

/* ---- wire messages ---- */

/* Addresses are "host:port" with a DNS name, an IPv4 or a bracketed IPv6. */
static int addr_char_ok(char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           ch == '.' || ch == ':' || ch == '-' || ch == '[' || ch == ']' || ch == '_';
}

/* Reads an address (length byte, bytes) at *off; NUL-terminated into out. */
static int get_addr(const uint8_t *msg, size_t n, size_t *off, char out[VISC_MM_ADDR_MAX + 1]) {
    if (*off >= n) return visc_set_error("matchmaking message truncated before an address");
    size_t len = msg[(*off)++];
    if (len > VISC_MM_ADDR_MAX) return visc_set_error("address of %zu bytes (max 63)", len);
    if (n - *off < len) return visc_set_error("matchmaking message truncated in an address");
    for (size_t i = 0; i < len; i++)
        if (!addr_char_ok((char)msg[*off + i]))
            return visc_set_error("address with a byte 0x%02x", msg[*off + i]);
    memcpy(out, msg + *off, len);
    out[len] = '\0';
    *off += len;
    return 0;
}

static size_t put_addr(uint8_t *p, const char *addr) {
    size_t len = strlen(addr);
    p[0] = (uint8_t)len;
    memcpy(p + 1, addr, len);
    return 1 + len;
}

static int bandwidth_ok(double b) { return isfinite(b) && b > 0 && b <= MM_MAX_BANDWIDTH; }

/* A full peer (and an auxiliary or a newcomer: they reduce) needs an
 * address to be reached at; a client has none. */
static int role_ok(int client, int auxiliary, int newcomer, const char *addr) {
    if (client && (auxiliary || newcomer))
        return visc_set_error("a client cannot be an auxiliary or newcomer peer");
    if (auxiliary && newcomer) return visc_set_error("a peer both auxiliary and newcomer");
    if (client) return addr[0] == '\0' ? 0 : visc_set_error("a client peer with an address");
    return addr[0] ? 0 : visc_set_error("a full peer without an address");
}

/* The role byte: 0 full, 1 client, 2 auxiliary, 3 newcomer. */
static uint8_t role_byte(int client, int auxiliary, int newcomer) {
    return client ? 1 : auxiliary ? 2 : newcomer ? 3 : 0;
}

static int addr_ok(const char *addr) {
    size_t len = strnlen(addr, VISC_MM_ADDR_MAX + 1);
    if (len > VISC_MM_ADDR_MAX) return visc_set_error("address too long");
    for (size_t i = 0; i < len; i++)
        if (!addr_char_ok(addr[i])) return visc_set_error("address with a bad character");
    return 0;
}

int visc_mm_info_encode(const visc_mm_info *info, uint8_t *out, size_t cap) {
    if (addr_ok(info->addr) != 0 ||
        role_ok(info->client, info->auxiliary, info->newcomer, info->addr) != 0)
        return -1;
    if (!bandwidth_ok(info->bandwidth)) return visc_set_error("bandwidth out of range");
    size_t need = 59 + strlen(info->addr);
    if (cap < need) return visc_set_error("matchmaking info: buffer too small");
    uint8_t *p = out;
    *p++ = MM_VERSION;
    visc_put_u64(p, info->round), p += 8;
    visc_put_u64(p, info->expires_ms), p += 8;
    visc_put_f64(p, info->bandwidth), p += 8;
    *p++ = role_byte(info->client, info->auxiliary, info->newcomer);
    memcpy(p, info->schema_hash, 32), p += 32;
    p += put_addr(p, info->addr);
    return (int)(p - out);
}

int visc_mm_info_parse(const uint8_t *msg, size_t n, visc_mm_info *out) {
    if (n < 59 || n > VISC_MM_INFO_MAX_BYTES)
        return visc_set_error("matchmaking info of %zu bytes", n);
    if (msg[0] != MM_VERSION) return visc_set_error("matchmaking info version %u", msg[0]);
    memset(out, 0, sizeof *out);
    out->round = visc_get_u64(msg + 1);
    out->expires_ms = visc_get_u64(msg + 9);
    out->bandwidth = visc_get_f64(msg + 17);
    if (msg[25] > 3) return visc_set_error("matchmaking info: role %u", msg[25]);
    out->client = msg[25] == 1, out->auxiliary = msg[25] == 2, out->newcomer = msg[25] == 3;
    memcpy(out->schema_hash, msg + 26, 32);
    size_t off = 58;
    if (get_addr(msg, n, &off, out->addr) != 0) return -1;
    if (off != n) return visc_set_error("matchmaking info: %zu trailing bytes", n - off);
    if (!bandwidth_ok(out->bandwidth)) return visc_set_error("matchmaking info: bad bandwidth");
    return role_ok(out->client, out->auxiliary, out->newcomer, out->addr);
}

int visc_mm_group_encode(const visc_group *g, uint64_t round, const uint8_t schema_hash[32],
                         uint8_t *out, size_t cap) {
    if (g->size < 2 || g->size > VISC_GROUP_MAX) return visc_set_error("group of %d", g->size);
    if (cap < VISC_MM_GROUP_MAX_BYTES) return visc_set_error("group: buffer too small");
    uint8_t *p = out;
    *p++ = MM_VERSION;
    visc_put_u64(p, round), p += 8;
    memcpy(p, g->id, 16), p += 16;
    memcpy(p, schema_hash, 32), p += 32;
    *p++ = (uint8_t)g->size;
    for (int i = 0; i < g->size; i++) {
        const visc_group_member *m = &g->members[i];
        if (addr_ok(m->addr) != 0 || role_ok(m->client, m->auxiliary, m->newcomer, m->addr) != 0)
            return -1;
        if (!bandwidth_ok(m->bandwidth)) return visc_set_error("group: bad bandwidth");
        memcpy(p, m->key, VISC_KEY_BYTES), p += VISC_KEY_BYTES;
        visc_put_f64(p, m->bandwidth), p += 8;
        *p++ = role_byte(m->client, m->auxiliary, m->newcomer);
        p += put_addr(p, m->addr);
    }
    return (int)(p - out);
}

int visc_mm_group_parse(const uint8_t *msg, size_t n, uint64_t round, const uint8_t schema_hash[32],
                        const uint8_t self_key[VISC_KEY_BYTES],
                        const uint8_t leader_key[VISC_KEY_BYTES], visc_group *out) {
    if (n < 58 || n > VISC_MM_GROUP_MAX_BYTES) return visc_set_error("GROUP of %zu bytes", n);
    if (msg[0] != MM_VERSION) return visc_set_error("GROUP version %u", msg[0]);
    if (visc_get_u64(msg + 1) != round) return visc_set_error("GROUP for another round");
    if (memcmp(msg + 25, schema_hash, 32) != 0) return visc_set_error("GROUP: other schema");
    int count = msg[57];
    if (count < 2 || count > VISC_GROUP_MAX) return visc_set_error("GROUP of %d members", count);
    memset(out, 0, sizeof *out);
    memcpy(out->id, msg + 9, 16);
    out->size = count;
    out->self = -1;
    int leader_at = -1;
    size_t off = 58;
    for (int i = 0; i < count; i++) {
        visc_group_member *m = &out->members[i];
        if (n - off < 42) return visc_set_error("GROUP truncated at member %d", i);
        memcpy(m->key, msg + off, VISC_KEY_BYTES);
        m->bandwidth = visc_get_f64(msg + off + 32);
        uint8_t role = msg[off + 40];
        if (role > 3) return visc_set_error("GROUP member %d: role %u", i, role);
        m->client = role == 1, m->auxiliary = role == 2, m->newcomer = role == 3;
        off += 41;
        if (get_addr(msg, n, &off, m->addr) != 0) return -1;
        if (!bandwidth_ok(m->bandwidth)) return visc_set_error("GROUP member %d: bandwidth", i);
        if (role_ok(m->client, m->auxiliary, m->newcomer, m->addr) != 0) return -1;
        for (int j = 0; j < i; j++)
            if (memcmp(out->members[j].key, m->key, VISC_KEY_BYTES) == 0)
                return visc_set_error("GROUP lists a member twice");
        if (memcmp(m->key, self_key, VISC_KEY_BYTES) == 0) out->self = i;
        if (memcmp(m->key, leader_key, VISC_KEY_BYTES) == 0) leader_at = i;
    }
    if (off != n) return visc_set_error("GROUP: %zu trailing bytes", n - off);
    int contributors = 0;
    for (int i = 0; i < count; i++) contributors += visc_member_contributes(&out->members[i]);
    if (contributors < 2) return visc_set_error("GROUP of %d training members", contributors);
    if (out->self < 0) return visc_set_error("GROUP without this peer");
    if (leader_at < 0 || out->members[leader_at].client)
        return visc_set_error("GROUP without its leader as a full member");
    return 0;
}

int visc_mm_reject_parse(const uint8_t *msg, size_t n, visc_mm_reject_reason *reason) {
    if (n != 2 || msg[0] != MM_VERSION) return visc_set_error("malformed REJECT");
    if (msg[1] < VISC_MM_REJECT_FULL || msg[1] > VISC_MM_REJECT_LAST)
        return visc_set_error("REJECT with unknown reason %u", msg[1]);
    *reason = (visc_mm_reject_reason)msg[1];
    return 0;
}

void visc_mm_join_tag(uint64_t round, uint8_t tag[16]) {
    uint8_t in[16];
    memcpy(in, "visc.mm.", 8);
    visc_put_u64(in + 8, round);
    crypto_generichash(tag, 16, in, sizeof in, NULL, 0);
}

static void send_reject(visc_chan *c, visc_mm_reject_reason why) {
    uint8_t msg[2] = {MM_VERSION, (uint8_t)why};
    visc_chan_send(c, VISC_MSG_REJECT, msg, sizeof msg, visc_now() + 1.0);
}

/* ---- one round's state ---- */

typedef struct {
    uint8_t key[VISC_KEY_BYTES];
    visc_mm_info info;
} peer;

typedef struct {
    visc_swarm_node *node;
    const visc_matchmaking_config *cfg;
    const uint8_t *self_key;
    visc_mm_info self;
    uint8_t tag[16];
    double deadline, margin, recheck_s;
    char dht_key[40];
    uint8_t declaration[VISC_MM_INFO_MAX_BYTES];
    int declaration_len, declared;  /* declared: the DHT confirmed our put */
    peer view[MM_MAX_DECLARATIONS]; /* sorted: full peers by (expiry, key), then clients */
    int n_view;
    uint8_t tried[MM_MAX_DECLARATIONS][VISC_KEY_BYTES];
    int n_tried;
    int formed;           /* leaders that said the round's group has formed */
    visc_record *records; /* scratch for DHT reads */
} round_state;

static int excluded(const visc_matchmaking_config *cfg, const uint8_t *key) {
    for (int i = 0; i < cfg->n_excluded; i++)
        if (memcmp(cfg->excluded[i], key, VISC_KEY_BYTES) == 0) return 1;
    return 0;
}

/* Local monotonic time at which a peer's declared unix-ms expiry falls. */
static double local_time_of(uint64_t unix_ms) {
    return visc_now() + ((double)unix_ms - (double)visc_unix_ms()) / 1000.0;
}

static int peer_before(const peer *a, const peer *b) {
    if (a->info.client != b->info.client) return !a->info.client;
    if (!a->info.client && a->info.expires_ms != b->info.expires_ms)
        return a->info.expires_ms < b->info.expires_ms;
    return memcmp(a->key, b->key, VISC_KEY_BYTES) < 0;
}

static void add_to_view(round_state *s, const uint8_t key[VISC_KEY_BYTES],
                        const visc_mm_info *info) {
    for (int i = 0; i < s->n_view; i++)
        if (memcmp(s->view[i].key, key, VISC_KEY_BYTES) == 0) return;
    if (s->n_view >= MM_MAX_DECLARATIONS) return;
    peer p;
    memcpy(p.key, key, VISC_KEY_BYTES);
    p.info = *info;
    int at = s->n_view++;
    while (at > 0 && peer_before(&p, &s->view[at - 1])) {
        s->view[at] = s->view[at - 1];
        at--;
    }
    s->view[at] = p;
}

/* Rebuilds the view from the DHT: live declarations of this round with our
 * schema hash, and always this peer itself. A failed read leaves only us. */
static void read_view(round_state *s) {
    s->n_view = 0;
    add_to_view(s, s->self_key, &s->self);
    int got = visc_dht_get(visc_swarm_node_dht(s->node), s->dht_key, s->records,
                           MM_MAX_DECLARATIONS, s->recheck_s);
    uint64_t now_ms = visc_unix_ms();
    for (int i = 0; i < got; i++) {
        visc_mm_info info;
        const visc_record *r = &s->records[i];
        if (visc_mm_info_parse(r->value, r->value_len, &info) != 0) continue;
        if (info.round != s->cfg->round || info.expires_ms <= now_ms) continue;
        if (memcmp(info.schema_hash, s->cfg->schema_hash, 32) != 0) continue;
        if (excluded(s->cfg, r->signer)) continue;
        add_to_view(s, r->signer, &info);
    }
}

static int view_index(const round_state *s, const uint8_t *key) {
    for (int i = 0; i < s->n_view; i++)
        if (memcmp(s->view[i].key, key, VISC_KEY_BYTES) == 0) return i;
    return -1;
}

static int was_tried(const round_state *s, const uint8_t *key) {
    for (int i = 0; i < s->n_tried; i++)
        if (memcmp(s->tried[i], key, VISC_KEY_BYTES) == 0) return 1;
    return 0;
}

static void mark_tried(round_state *s, const uint8_t *key) {
    if (s->n_tried < MM_MAX_DECLARATIONS && !was_tried(s, key))
        memcpy(s->tried[s->n_tried++], key, VISC_KEY_BYTES);
}

/* The leader this peer is dealt to when views agree: the view is dealt
 * round-robin into k = ceil(n / target) groups led by its first k full
 * peers. Returns a view index (ours when we lead), or -1 for none. */
static int planned_leader(const round_state *s) {
    int n = s->n_view, full = 0, target = s->cfg->target_group_size;
    for (int i = 0; i < n; i++) full += !s->view[i].info.client;
    int k = (n + target - 1) / target;
    if (k > full) k = full;
    int me = view_index(s, s->self_key);
    if (k == 0 || me < 0 || me >= k * target) return -1;
    return me % k;
}

/* The peers this round waits for: the caller's expected count and the
 * ones the view deals to our planned leader (us, when we lead), at most a
 * whole group. */
static int expected_members(const round_state *s) {
    int target = s->cfg->target_group_size, expect = s->cfg->expected_group_size;
    if (expect <= 0) expect = target;
    int n = s->n_view, full = 0;
    for (int i = 0; i < n; i++) full += !s->view[i].info.client;
    int k = (n + target - 1) / target;
    if (k > full) k = full;
    int leader = planned_leader(s), dealt = 0;
    for (int i = 0; leader >= 0 && i < n && i < k * target; i++) dealt += i % k == leader;
    int want = dealt > expect ? dealt : expect;
    return want < target ? want : target;
}

/* After a failure: the first untried full peer before us in the order
 * (any full peer, for a client); our own index when none is left and we
 * may lead; -1 otherwise. */
static int next_leader(const round_state *s) {
    int me = view_index(s, s->self_key);
    for (int i = 0; i < s->n_view; i++) {
        if (i == me) return s->self.client ? -1 : me;
        if (!s->view[i].info.client && !was_tried(s, s->view[i].key)) return i;
    }
    return -1;
}

/* Publishes (again, until the DHT confirms) this peer's declaration. */
static void declare(round_state *s, double timeout) {
    if (s->declared) return;
    double ttl = s->deadline - visc_now();
    if (ttl < 0.1) return;
    s->declared = visc_dht_put(visc_swarm_node_dht(s->node), s->dht_key, s->declaration,
                               (size_t)s->declaration_len, ttl, timeout) == 0;
}

/* Whom to join (or lead, when it is us): the planned leader while we have
 * not tried it, then the next one in order. */
static int choose_leader(const round_state *s) {
    int p = planned_leader(s);
    if (p >= 0 &&
        (memcmp(s->view[p].key, s->self_key, VISC_KEY_BYTES) == 0 || !was_tried(s, s->view[p].key)))
        return p;
    return next_leader(s);
}

/* Answers every JOIN waiting for us this round with a REJECT. */
static void refuse_pending_joins(round_state *s, visc_mm_reject_reason why) {
    visc_chan *c;
    while ((c = visc_swarm_node_take(s->node, VISC_PURPOSE_JOIN, s->tag, NULL, 0)) != NULL) {
        send_reject(c, why);
        visc_chan_close(c);
    }
}

/* ---- leading ---- */

typedef struct {
    visc_group_member m;
    visc_chan *chan; /* NULL for the leader itself */
} joiner;

/* Reads and checks one JOIN; returns 0 and the member, or -1 after
 * answering with the reason (or dropping a channel that failed). */
static int read_join(round_state *s, visc_chan *c, const joiner *have, int n_have,
                     double *gather_end, visc_group_member *m) {
    uint8_t type = 0, msg[VISC_MM_INFO_MAX_BYTES];
    size_t got = 0;
    /* an honest follower sends JOIN right after OPEN: a short bound */
    double until = visc_now() + 1.0;
    if (until > s->deadline) until = s->deadline;
    if (visc_chan_recv(c, &type, msg, sizeof msg, &got, until) != 0) return -1;
    visc_mm_info info;
    if (type != VISC_MSG_JOIN || visc_mm_info_parse(msg, got, &info) != 0) {
        send_reject(c, VISC_MM_REJECT_MALFORMED);
        return -1;
    }
    if (info.round != s->cfg->round) {
        send_reject(c, VISC_MM_REJECT_ROUND);
        return -1;
    }
    if (memcmp(info.schema_hash, s->cfg->schema_hash, 32) != 0) {
        send_reject(c, VISC_MM_REJECT_SCHEMA);
        return -1;
    }
    const uint8_t *key = visc_chan_peer_key(c);
    if (excluded(s->cfg, key)) {
        send_reject(c, VISC_MM_REJECT_EXCLUDED);
        return -1;
    }
    for (int i = 0; i < n_have; i++)
        if (memcmp(have[i].m.key, key, VISC_KEY_BYTES) == 0) {
            send_reject(c, VISC_MM_REJECT_DUPLICATE);
            return -1;
        }
    /* never keep a joiner waiting past its own deadline */
    double joiner_end = local_time_of(info.expires_ms) - s->margin;
    if (joiner_end <= visc_now()) {
        send_reject(c, VISC_MM_REJECT_FULL);
        return -1;
    }
    if (joiner_end < *gather_end) *gather_end = joiner_end;
    memcpy(m->key, key, VISC_KEY_BYTES);
    m->bandwidth = info.bandwidth;
    m->client = info.client;
    m->auxiliary = info.auxiliary;
    m->newcomer = info.newcomer;
    memcpy(m->addr, info.addr, sizeof m->addr);
    return 0;
}

/* A joiner whose channel shows EOF (or anything: followers send nothing
 * after JOIN) before GROUP is gone. */
static int joiner_gone(visc_chan *c) {
    struct pollfd p = {.fd = visc_chan_fd(c), .events = POLLIN};
    return poll(&p, 1, 0) != 0;
}

static void close_joiners(joiner *j, int n, visc_mm_reject_reason why) {
    for (int i = 0; i < n; i++)
        if (j[i].chan) {
            if (why) send_reject(j[i].chan, why);
            visc_chan_close(j[i].chan);
        }
}

/* 0: a group (out), 1: we yielded to another leader (the joiners were told
 * to look elsewhere), -1: no group. */
static int lead(round_state *s, visc_group *out) {
    joiner j[VISC_GROUP_MAX];
    int n = 1;
    memset(j, 0, sizeof j);
    memcpy(j[0].m.key, s->self_key, VISC_KEY_BYTES);
    j[0].m.bandwidth = s->self.bandwidth;
    j[0].m.auxiliary = s->self.auxiliary;
    j[0].m.newcomer = s->self.newcomer;
    memcpy(j[0].m.addr, s->self.addr, sizeof j[0].m.addr);
    double gather_end = s->deadline - s->margin;
    double next_check = visc_now() + s->recheck_s;
    int fresh = 1; /* the view was read after the last JOIN (run_round read it before) */
    while (n < s->cfg->target_group_size && visc_now() < gather_end) {
        if (n >= expected_members(s)) {
            if (fresh) break;
            /* one more look before starting short of a whole group: a
             * peer that declared since the last read is waited for too */
            read_view(s);
            fresh = 1;
            continue;
        }
        double until = next_check < gather_end ? next_check : gather_end;
        visc_chan *c = visc_swarm_node_take(s->node, VISC_PURPOSE_JOIN, s->tag, NULL, until);
        if (!c && visc_now() >= next_check && visc_now() < gather_end) {
            /* a slow DHT may have hidden a peer that should lead instead:
             * with a fresher view, go to our planned leader if it is another */
            declare(s, s->recheck_s);
            read_view(s);
            fresh = 1;
            int p = planned_leader(s);
            if (p >= 0 && memcmp(s->view[p].key, s->self_key, VISC_KEY_BYTES) != 0 &&
                !was_tried(s, s->view[p].key)) {
                close_joiners(j, n, VISC_MM_REJECT_DISBANDED);
                return 1;
            }
            next_check = visc_now() + s->recheck_s;
            continue;
        }
        if (!c) break;
        if (read_join(s, c, j, n, &gather_end, &j[n].m) != 0) {
            visc_chan_close(c);
            continue;
        }
        j[n++].chan = c;
        fresh = 0;
    }
    /* JOINs still queued are answered when the round ends (visc_matchmake):
     * FORMED when this group starts, NOT_LEADING when it disbands */
    for (int i = 1; i < n;) {
        if (joiner_gone(j[i].chan)) {
            visc_chan_close(j[i].chan);
            j[i] = j[--n];
        } else {
            i++;
        }
    }
    int contributors = 0;
    for (int i = 0; i < n; i++) contributors += visc_member_contributes(&j[i].m);
    if (n < s->cfg->min_group_size || contributors < 2) {
        close_joiners(j, n, VISC_MM_REJECT_DISBANDED);
        if (n < s->cfg->min_group_size)
            return visc_set_error("no group: %d of at least %d peers joined this leader by the "
                                  "deadline",
                                  n, s->cfg->min_group_size);
        return visc_set_error("no group: %d peers joined this leader, %d of them training (a "
                              "group needs 2)",
                              n, contributors);
    }
    /* one shuffled order for everyone (Fisher-Yates) */
    for (int i = n - 1; i > 0; i--) {
        int r = (int)randombytes_uniform((uint32_t)i + 1);
        joiner t = j[i];
        j[i] = j[r];
        j[r] = t;
    }
    memset(out, 0, sizeof *out);
    randombytes_buf(out->id, sizeof out->id);
    out->size = n;
    for (int i = 0; i < n; i++) {
        out->members[i] = j[i].m;
        if (!j[i].chan) out->self = i;
    }
    uint8_t *msg = visc_malloc(VISC_MM_GROUP_MAX_BYTES, "GROUP message");
    int len = msg ? visc_mm_group_encode(out, s->cfg->round, s->cfg->schema_hash, msg,
                                         VISC_MM_GROUP_MAX_BYTES)
                  : -1;
    if (len < 0) {
        free(msg);
        close_joiners(j, n, VISC_MM_REJECT_DISBANDED);
        return -1;
    }
    /* a member that cannot be sent its GROUP is still listed: the
     * all-reduce treats it as a peer that failed */
    for (int i = 0; i < n; i++)
        if (j[i].chan) visc_chan_send(j[i].chan, VISC_MSG_GROUP, msg, (size_t)len, s->deadline);
    free(msg);
    close_joiners(j, n, 0);
    return 0;
}

/* ---- following ---- */

/* 0 with out filled; -1 when this leader will not give us a group
 * (s->formed counts a REJECT FORMED). */
static int follow(round_state *s, const peer *leader, visc_group *out) {
    double until = local_time_of(leader->info.expires_ms);
    if (until > s->deadline) until = s->deadline;
    double connect_by = visc_now() + 2.0;
    if (connect_by > until) connect_by = until;
    visc_chan *c = visc_swarm_node_connect(s->node, leader->info.addr, VISC_PURPOSE_JOIN, s->tag,
                                           leader->key, connect_by);
    if (!c) return -1;
    uint8_t info[VISC_MM_INFO_MAX_BYTES];
    int len = visc_mm_info_encode(&s->self, info, sizeof info);
    if (len < 0 || visc_chan_send(c, VISC_MSG_JOIN, info, (size_t)len, connect_by) != 0) {
        visc_chan_close(c);
        return -1;
    }
    uint8_t *msg = visc_malloc(VISC_MM_GROUP_MAX_BYTES, "GROUP message");
    int rc = -1;
    uint8_t type = 0;
    size_t got = 0;
    if (msg && visc_chan_recv(c, &type, msg, VISC_MM_GROUP_MAX_BYTES, &got, until) == 0) {
        visc_mm_reject_reason why = VISC_MM_REJECT_MALFORMED;
        if (type == VISC_MSG_GROUP) {
            rc = visc_mm_group_parse(msg, got, s->cfg->round, s->cfg->schema_hash, s->self_key,
                                     leader->key, out);
            for (int i = 0; rc == 0 && i < out->size; i++)
                if (excluded(s->cfg, out->members[i].key))
                    rc = visc_set_error("the leader's group lists member %d, a peer this one "
                                        "excludes",
                                        i);
        } else if (type == VISC_MSG_REJECT && visc_mm_reject_parse(msg, got, &why) == 0) {
            s->formed += why == VISC_MM_REJECT_FORMED;
            visc_set_error("the leader refused (reason %d)", (int)why);
        } else visc_set_error("unexpected frame %u from the leader", type);
    }
    free(msg);
    visc_chan_close(c);
    return rc;
}

/* ---- the round ---- */

static int check_config(const visc_matchmaking_config *cfg) {
    if (cfg->target_group_size < 2 || cfg->target_group_size > VISC_GROUP_MAX)
        return visc_set_error("target group size %d (2..%d)", cfg->target_group_size,
                              VISC_GROUP_MAX);
    if (cfg->min_group_size < 2 || cfg->min_group_size > cfg->target_group_size)
        return visc_set_error("min group size %d (2..target)", cfg->min_group_size);
    if (cfg->expected_group_size != 0 &&
        (cfg->expected_group_size < 2 || cfg->expected_group_size > cfg->target_group_size))
        return visc_set_error("expected group size %d (0, or 2..target)", cfg->expected_group_size);
    if (!(cfg->matchmaking_time_s > 0 && cfg->matchmaking_time_s <= 3600))
        return visc_set_error("matchmaking time %g s (0..3600)", cfg->matchmaking_time_s);
    if (cfg->n_excluded < 0 || (cfg->n_excluded > 0 && !cfg->excluded))
        return visc_set_error("matchmaking: %d excluded keys without a list", cfg->n_excluded);
    return 0;
}

static void sleep_until(double t) {
    double left = t - visc_now();
    if (left <= 0) return;
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    nanosleep(&ts, NULL);
}

static double clamp(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Waits until `until` for the round's declarations to spread, then reads
 * the view; but a view that already holds every peer expected
 * (expected_members, this one's declaration confirmed) and has not changed
 * since the previous read ends the wait at once: a round whose peers are all there
 * starts within two polls instead of after a fifth of the matchmaking time
 * (3 s at hivemind's 15 s), as hivemind's leader starts a full group at
 * once. The poll is a tenth of the settling time (at least 0.1 s), so a
 * round costs at most ten DHT reads more than before, whatever its length.
 * Views that still differ (more peers than a group, some not yet seen) are
 * what the protocol absorbs anyway: a leader re-reads and yields, a
 * refused follower tries the next leader. */
static void settle_view(round_state *s, double settle, double until) {
    const double poll = settle / 10 > 0.1 ? settle / 10 : 0.1;
    int last = -1;
    while (visc_now() + poll < until) {
        sleep_until(visc_now() + poll);
        read_view(s);
        if (s->declared && s->n_view >= expected_members(s) && s->n_view == last) return;
        last = s->n_view;
    }
    sleep_until(until);
    read_view(s);
}

static int run_round(round_state *s, visc_group *out) {
    const visc_matchmaking_config *cfg = s->cfg;
    double t0 = visc_now(), T = cfg->matchmaking_time_s;
    /* time for declarations to spread before the view is read */
    double settle = clamp(0.2 * T, 0.1, 3.0);
    s->declaration_len = visc_mm_info_encode(&s->self, s->declaration, sizeof s->declaration);
    if (s->declaration_len < 0) return -1;
    /* a failed put is not fatal: we retry it, and can join a leader we see */
    declare(s, settle);
    settle_view(s, settle, t0 + settle);
    while (visc_now() < s->deadline) {
        int at = choose_leader(s);
        if (at >= 0 && memcmp(s->view[at].key, s->self_key, VISC_KEY_BYTES) == 0 && s->formed) {
            visc_set_error("no group: the group of round %llu formed without this peer",
                           (unsigned long long)cfg->round);
            return VISC_MM_MISSED;
        }
        if (at >= 0 && memcmp(s->view[at].key, s->self_key, VISC_KEY_BYTES) == 0) {
            int rc = lead(s, out);
            if (rc <= 0) return rc;
        } else if (at >= 0) {
            peer leader = s->view[at];
            mark_tried(s, leader.key);
            if (follow(s, &leader, out) == 0) return 0;
        } else {
            /* a client with no untried leader: look again a little later */
            sleep_until(visc_now() + s->recheck_s);
        }
        if (visc_now() >= s->deadline) break;
        declare(s, s->recheck_s);
        read_view(s); /* newcomers may lead */
    }
    return visc_set_error("no group for round %llu within %g s", (unsigned long long)cfg->round, T);
}

int visc_matchmake(visc_swarm_node *n, const visc_matchmaking_config *cfg, visc_group *out) {
    if (check_config(cfg) != 0) return -1;
    if (!visc_swarm_node_dht(n)) return visc_set_error("matchmaking needs the node's DHT");
    round_state *s = visc_calloc(1, sizeof *s, "matchmaking state");
    if (!s) return -1;
    s->records = visc_calloc(MM_MAX_DECLARATIONS, sizeof *s->records, "declarations");
    if (!s->records) {
        free(s);
        return -1;
    }
    const visc_swarm_node_config *nc = visc_swarm_node_config_of(n);
    s->node = n;
    s->cfg = cfg;
    s->self_key = visc_swarm_node_auth(n)->self.public_key;
    double T = cfg->matchmaking_time_s;
    s->deadline = visc_now() + T;
    s->margin = clamp(0.15 * T, 0.2, 2.0);
    s->recheck_s = clamp(0.1 * T, 0.1, 1.0);
    snprintf(s->dht_key, sizeof s->dht_key, "mm.%llu", (unsigned long long)cfg->round);
    s->self.round = cfg->round;
    s->self.expires_ms = visc_unix_ms() + (uint64_t)(T * 1000.0);
    s->self.bandwidth = nc->bandwidth > 0 ? nc->bandwidth : 1.0;
    s->self.client = nc->client ? 1 : 0;
    s->self.auxiliary = cfg->auxiliary && !nc->client;
    s->self.newcomer = cfg->newcomer && !cfg->auxiliary && !nc->client;
    memcpy(s->self.schema_hash, cfg->schema_hash, 32);
    snprintf(s->self.addr, sizeof s->self.addr, "%s", nc->client ? "" : visc_swarm_node_address(n));
    visc_mm_join_tag(cfg->round, s->tag);
    /* this round again (its group failed): JOINs are welcome once more */
    visc_swarm_node_unanswer(n, VISC_PURPOSE_JOIN, s->tag);

    int rc = run_round(s, out);
    char why[512];
    snprintf(why, sizeof why, "%s", visc_last_error());
    if (rc == 0 || rc == VISC_MM_MISSED) {
        /* late JOINs of this round learn at once that it is over; a peer
         * that came late itself passes on what its leader told it: two
         * late peers at the same state saw each other's declaration, one
         * followed the other, was told NOT_LEADING, and led alone until
         * its deadline while the swarm stepped on (e2e_swarm_churn.sh: a
         * newcomer lost a matchmaking time so) */
        uint8_t formed[2] = {MM_VERSION, VISC_MM_REJECT_FORMED};
        visc_swarm_node_answer(n, VISC_PURPOSE_JOIN, s->tag, VISC_MSG_REJECT, formed,
                               sizeof formed);
    } else {
        refuse_pending_joins(s, VISC_MM_REJECT_NOT_LEADING);
    }
    free(s->records);
    free(s);
    if (rc != 0) visc_set_error("%s", why);
    return rc;
}

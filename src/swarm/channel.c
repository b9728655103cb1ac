/* channel.c: the authenticated TCP channel of channel.h.
 *
 * Wire format (all sizes fixed; anything else ends the handshake):
 *   hello (HELLO_BYTES = 278):
 *     0 "VSWH" | 4 version | 5 flags (bit 0 encrypt, bit 1 has secret)
 *     | 6 two zero bytes | 8 run hash (32) | 40 ephemeral X25519 key (32)
 *     | 72 static Ed25519 key (32) | 104 random (32) | 136 token length u16 LE
 *     (0 or VISC_TOKEN_BYTES) | 138 token (140; zeros when absent)
 *   proof (PROOF_BYTES = 96): Ed25519 signature (64) over
 *     "visc-swarm-proof-v1" | role | T, then BLAKE2b-256 keyed by the
 *     secret over "visc-swarm-secret-v1" | role | T (zeros without a secret),
 *     where T = BLAKE2b-256("visc-swarm-transcript-v1" | initiator's hello |
 *     responder's hello) and role is 'I' or 'R': a signature made as one
 *     role never verifies as the other, so reflecting it back fails.
 * Both hellos cross at once; then the initiator sends its proof and the
 * responder answers only after checking it, so a stranger who connects
 * learns nothing derived from the secret.
 * Session keys: crypto_kx on the ephemeral keys gives one key per
 * direction; each is hashed with the direction label and T, keyed by the
 * secret when there is one.
 *   frame: length u32 LE of what follows | type | body
 *     encrypt: body = XChaCha20-Poly1305 ciphertext of the payload and its
 *              16-byte tag; length and type are the additional data
 *     MAC only: body = payload and a 16-byte Poly1305 tag over length |
 *              type | payload, under the one-time key that XChaCha20 gives
 *              for the direction key and the counter (as in the AEAD)
 *   The nonce (or MAC input) is the direction's frame counter, never sent.
 * Payloads are encrypted straight from the caller's buffer into a reusable
 * send buffer and decrypted in place in the caller's receive buffer: no
 * copies besides the cipher's own pass. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "channel.h"
#include "visc/core.h"

#define HELLO_MAGIC "VSWH"
#define HELLO_VERSION 1
#define HELLO_BYTES 278
#define PROOF_BYTES 96
#define FLAG_ENCRYPT 1u
#define FLAG_SECRET 2u
#define FRAME_HEAD 5 /* length (4) and type (1) */
#define AEAD_TAG crypto_aead_xchacha20poly1305_ietf_ABYTES
#define MAC_TAG crypto_onetimeauth_BYTES
_Static_assert(AEAD_TAG == MAC_TAG, "both frame kinds end in a 16-byte tag");

struct visc_chan {
    int fd;
    int encrypt;
    uint8_t peer_key[VISC_KEY_BYTES];
    char peer_id[VISC_PEER_ID_CHARS + 1];
    /* send side: touched only by the sending thread */
    uint8_t send_key[32];
    uint64_t send_counter;
    uint8_t *send_buf;
    size_t send_cap;
    int send_failed;
    /* receive side: touched only by the receiving thread */
    uint8_t recv_key[32];
    uint64_t recv_counter;
    int recv_failed;
    _Atomic uint64_t bytes_sent, bytes_received;
};

/* ---- socket I/O with absolute deadlines ---- */

/* Waits until fd is ready for events or the deadline passes. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - visc_now();
        if (!(left > 0)) return visc_set_error("timed out");
        double ms = ceil(left * 1000.0);
        struct pollfd p = {.fd = fd, .events = events};
        int k = poll(&p, 1, ms > INT_MAX ? INT_MAX : (int)ms);
        if (k > 0) return 0; /* ready, or an error/hangup the next call reports */
        if (k < 0 && errno != EINTR) return visc_set_error("poll: %s", strerror(errno));
    }
}

/* Sends every byte of iov[0..n) (modified in place). */
static int send_iov(int fd, struct iovec *iov, int n, double deadline, _Atomic uint64_t *counter) {
    while (n > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (wait_fd(fd, POLLOUT, deadline) != 0) return -1;
                continue;
            }
            return visc_set_error("send: %s", strerror(errno));
        }
        atomic_fetch_add_explicit(counter, (uint64_t)k, memory_order_relaxed);
        size_t done = (size_t)k;
        while (n > 0 && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
    return 0;
}

static int send_all(int fd, const void *buf, size_t len, double deadline,
                    _Atomic uint64_t *counter) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return send_iov(fd, &iov, 1, deadline, counter);
}

static int recv_all(int fd, void *buf, size_t len, double deadline, _Atomic uint64_t *counter) {
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t k = recv(fd, p, len, 0);
        if (k > 0) {
            atomic_fetch_add_explicit(counter, (uint64_t)k, memory_order_relaxed);
            p += k;
            len -= (size_t)k;
            continue;
        }
        if (k == 0) return visc_set_error("connection closed by the peer");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_fd(fd, POLLIN, deadline) != 0) return -1;
            continue;
        }
        return visc_set_error("recv: %s", strerror(errno));
    }
    return 0;
}

/* ---- addresses and sockets ---- */

static int parse_host_port(const char *host_port, int listening, struct sockaddr_in *sa) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    const char *colon = strrchr(host_port, ':');
    size_t hl = colon ? (size_t)(colon - host_port) : 0;
    if (!colon || hl == 0 || hl >= 64 || !colon[1])
        return visc_set_error("address '%s' is not host:port", host_port);
    char host[64];
    memcpy(host, host_port, hl);
    host[hl] = 0;
    char *end = NULL;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    /* digits only: strtol alone would also take " 80", "+80" and "-0" */
    if (errno || *end || port < 0 || port > 65535 || colon[1] < '0' || colon[1] > '9')
        return visc_set_error("address '%s': port must be 0..65535", host_port);
    if (!listening && port == 0) return visc_set_error("address '%s': port 0", host_port);
    sa->sin_port = htons((uint16_t)port);
    if (strcmp(host, "*") == 0 && listening) sa->sin_addr.s_addr = htonl(INADDR_ANY);
    else if (strcmp(host, "localhost") == 0) sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return visc_set_error("address '%s': '%s' is not an IPv4 address", host_port, host);
    return 0;
}

int visc_tcp_listen(const char *host_port, char *bound, size_t bound_cap) {
    struct sockaddr_in sa;
    if (parse_host_port(host_port, 1, &sa) != 0) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return visc_set_error("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        return visc_set_error("cannot listen on %s: %s", host_port, strerror(e));
    }
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        int e = errno;
        close(fd);
        return visc_set_error("getsockname: %s", strerror(e));
    }
    if (bound && bound_cap > 0) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
        snprintf(bound, bound_cap, "%s:%u", ip, (unsigned)ntohs(sa.sin_port));
    }
    return fd;
}

visc_chan *visc_chan_connect(const char *host_port, const visc_swarm_auth *auth, double deadline) {
    struct sockaddr_in sa;
    if (parse_host_port(host_port, 0, &sa) != 0) return NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        visc_set_error("socket: %s", strerror(errno));
        return NULL;
    }
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (rc != 0 && errno == EINPROGRESS) {
        if (wait_fd(fd, POLLOUT, deadline) != 0) {
            close(fd);
            visc_set_error("connect to %s: timed out", host_port);
            return NULL;
        }
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        errno = err;
        rc = err ? -1 : 0;
    }
    if (rc != 0) {
        int e = errno;
        close(fd);
        visc_set_error("connect to %s: %s", host_port, strerror(e));
        return NULL;
    }
    visc_chan *c = visc_chan_handshake(fd, 1, auth, deadline);
    if (!c) visc_set_error("%s: %s", host_port, visc_last_error());
    return c;
}

visc_chan *visc_chan_accept(int listen_fd, const visc_swarm_auth *auth, double deadline) {
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) return visc_chan_handshake(fd, 0, auth, deadline);
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            visc_set_error("accept: %s", strerror(errno));
            return NULL;
        }
        if (wait_fd(listen_fd, POLLIN, deadline) != 0) {
            visc_set_error("accept: timed out");
            return NULL;
        }
    }
}

/* ---- handshake ---- */

static void build_hello(const visc_swarm_auth *auth, const uint8_t eph_pk[32],
                        uint8_t hello[HELLO_BYTES]) {
    memset(hello, 0, HELLO_BYTES);
    memcpy(hello, HELLO_MAGIC, 4);
    hello[4] = HELLO_VERSION;
    hello[5] = (uint8_t)((auth->encrypt ? FLAG_ENCRYPT : 0) | (auth->has_secret ? FLAG_SECRET : 0));
    memcpy(hello + 8, auth->run_hash, 32);
    memcpy(hello + 40, eph_pk, 32);
    memcpy(hello + 72, auth->self.public_key, 32);
    randombytes_buf(hello + 104, 32);
    if (auth->has_token) {
        hello[136] = (uint8_t)(VISC_TOKEN_BYTES & 0xff);
        hello[137] = (uint8_t)(VISC_TOKEN_BYTES >> 8);
        memcpy(hello + 138, auth->token, VISC_TOKEN_BYTES);
    }
}

int visc_chan_parse_hello(const uint8_t *msg, size_t n, const visc_swarm_auth *auth,
                          uint8_t peer_static[VISC_KEY_BYTES]) {
    if (n != HELLO_BYTES)
        return visc_set_error("handshake: hello of %zu bytes (expected %d)", n, HELLO_BYTES);
    if (memcmp(msg, HELLO_MAGIC, 4) != 0)
        return visc_set_error("handshake: not a visc swarm peer (bad magic)");
    if (msg[4] != HELLO_VERSION)
        return visc_set_error("handshake: peer speaks protocol version %u (we speak %u)", msg[4],
                              HELLO_VERSION);
    if ((msg[5] & ~(FLAG_ENCRYPT | FLAG_SECRET)) != 0 || msg[6] != 0 || msg[7] != 0)
        return visc_set_error("handshake: unknown flags in hello");
    if (sodium_memcmp(msg + 8, auth->run_hash, 32) != 0)
        return visc_set_error("handshake: peer belongs to another run");
    int peer_encrypt = (msg[5] & FLAG_ENCRYPT) != 0;
    if (peer_encrypt != (auth->encrypt != 0))
        return visc_set_error("handshake: peer has encryption %s and we have it %s; both sides "
                              "must agree",
                              peer_encrypt ? "on" : "off", auth->encrypt ? "on" : "off");
    int peer_secret = (msg[5] & FLAG_SECRET) != 0;
    if (peer_secret != (auth->has_secret != 0))
        return visc_set_error(auth->has_secret
                                  ? "handshake: peer does not know the swarm secret"
                                  : "handshake: peer requires a swarm secret that we do not have");
    unsigned token_len = (unsigned)msg[136] | (unsigned)msg[137] << 8;
    if (token_len != 0 && token_len != VISC_TOKEN_BYTES)
        return visc_set_error("handshake: token length %u (expected 0 or %d)", token_len,
                              VISC_TOKEN_BYTES);
    if (token_len == 0)
        for (int i = 0; i < VISC_TOKEN_BYTES; i++)
            if (msg[138 + i] != 0) return visc_set_error("handshake: bytes after an empty token");
    if (crypto_core_ed25519_is_valid_point(msg + 72) != 1)
        return visc_set_error("handshake: peer's public key is not a valid Ed25519 key");
    if (visc_swarm_auth_admit(auth, msg + 72, token_len ? msg + 138 : NULL, token_len) != 0)
        return -1;
    memcpy(peer_static, msg + 72, VISC_KEY_BYTES);
    return 0;
}

static void transcript_hash(const uint8_t *hello_i, const uint8_t *hello_r, uint8_t t[32]) {
    static const char label[] = "visc-swarm-transcript-v1";
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, (const uint8_t *)label, sizeof label - 1);
    crypto_generichash_update(&st, hello_i, HELLO_BYTES);
    crypto_generichash_update(&st, hello_r, HELLO_BYTES);
    crypto_generichash_final(&st, t, 32);
}

/* What a role signs and MACs: label | role | T. */
static void proof_message(const char *label, char role, const uint8_t t[32], uint8_t *out,
                          size_t *n) {
    size_t l = strlen(label);
    memcpy(out, label, l);
    out[l] = (uint8_t)role;
    memcpy(out + l + 1, t, 32);
    *n = l + 33;
}

static void make_proof(const visc_swarm_auth *auth, char role, const uint8_t t[32],
                       uint8_t proof[PROOF_BYTES]) {
    uint8_t m[64];
    size_t n;
    proof_message("visc-swarm-proof-v1", role, t, m, &n);
    crypto_sign_detached(proof, NULL, m, n, auth->self.secret_key);
    memset(proof + 64, 0, 32);
    if (auth->has_secret) {
        proof_message("visc-swarm-secret-v1", role, t, m, &n);
        crypto_generichash(proof + 64, 32, m, n, auth->secret, 32);
    }
}

static int check_proof(const visc_swarm_auth *auth, char role, const uint8_t t[32],
                       const uint8_t peer_key[32], const uint8_t proof[PROOF_BYTES]) {
    uint8_t m[64];
    size_t n;
    proof_message("visc-swarm-proof-v1", role, t, m, &n);
    if (crypto_sign_verify_detached(proof, m, n, peer_key) != 0)
        return visc_set_error("its signature over this handshake does not verify "
                              "(replayed, reflected or forged)");
    if (auth->has_secret) {
        uint8_t want[32];
        proof_message("visc-swarm-secret-v1", role, t, m, &n);
        crypto_generichash(want, 32, m, n, auth->secret, 32);
        if (crypto_verify_32(want, proof + 64) != 0)
            return visc_set_error("it does not know the swarm secret");
    }
    return 0;
}

static void session_key(const visc_swarm_auth *auth, const char *direction, const uint8_t kx[32],
                        const uint8_t t[32], uint8_t out[32]) {
    static const char label[] = "visc-swarm-session-v1";
    crypto_generichash_state st;
    crypto_generichash_init(&st, auth->has_secret ? auth->secret : NULL, auth->has_secret ? 32 : 0,
                            32);
    crypto_generichash_update(&st, (const uint8_t *)label, sizeof label - 1);
    crypto_generichash_update(&st, (const uint8_t *)direction, strlen(direction));
    crypto_generichash_update(&st, kx, 32);
    crypto_generichash_update(&st, t, 32);
    crypto_generichash_final(&st, out, 32);
}

/* The handshake proper; c->fd is connected and non-blocking. */
static int handshake(visc_chan *c, int initiator, const visc_swarm_auth *auth, double deadline) {
    uint8_t eph_pk[crypto_kx_PUBLICKEYBYTES], eph_sk[crypto_kx_SECRETKEYBYTES];
    crypto_kx_keypair(eph_pk, eph_sk);
    uint8_t mine[HELLO_BYTES], theirs[HELLO_BYTES];
    build_hello(auth, eph_pk, mine);
    int rc = -1;
    uint8_t t[32], proof[PROOF_BYTES], rx[32], tx[32];
    if (send_all(c->fd, mine, HELLO_BYTES, deadline, &c->bytes_sent) != 0 ||
        recv_all(c->fd, theirs, HELLO_BYTES, deadline, &c->bytes_received) != 0) {
        visc_set_error("handshake: hello: %s", visc_last_error());
        goto out;
    }
    if (visc_chan_parse_hello(theirs, HELLO_BYTES, auth, c->peer_key) != 0) goto out;
    visc_peer_id(c->peer_key, c->peer_id);
    if (sodium_memcmp(theirs + 104, mine + 104, 32) == 0) {
        visc_set_error("handshake: peer echoed our own hello");
        goto out;
    }
    const uint8_t *hello_i = initiator ? mine : theirs, *hello_r = initiator ? theirs : mine;
    transcript_hash(hello_i, hello_r, t);
    char my_role = initiator ? 'I' : 'R', peer_role = initiator ? 'R' : 'I';
    if (initiator) {
        make_proof(auth, my_role, t, proof);
        if (send_all(c->fd, proof, PROOF_BYTES, deadline, &c->bytes_sent) != 0 ||
            recv_all(c->fd, proof, PROOF_BYTES, deadline, &c->bytes_received) != 0) {
            visc_set_error("handshake with peer %s: proof: %s (did it refuse us?)", c->peer_id,
                           visc_last_error());
            goto out;
        }
        if (check_proof(auth, peer_role, t, c->peer_key, proof) != 0) goto refused;
    } else {
        if (recv_all(c->fd, proof, PROOF_BYTES, deadline, &c->bytes_received) != 0) {
            visc_set_error("handshake with peer %s: proof: %s", c->peer_id, visc_last_error());
            goto out;
        }
        if (check_proof(auth, peer_role, t, c->peer_key, proof) != 0) goto refused;
        make_proof(auth, my_role, t, proof);
        if (send_all(c->fd, proof, PROOF_BYTES, deadline, &c->bytes_sent) != 0) {
            visc_set_error("handshake with peer %s: proof: %s", c->peer_id, visc_last_error());
            goto out;
        }
    }
    const uint8_t *peer_eph = theirs + 40;
    int kx = initiator ? crypto_kx_client_session_keys(rx, tx, eph_pk, eph_sk, peer_eph)
                       : crypto_kx_server_session_keys(rx, tx, eph_pk, eph_sk, peer_eph);
    if (kx != 0) {
        visc_set_error("handshake: peer's ephemeral key is unusable");
        goto out;
    }
    /* client tx == server rx: label keys by direction, not by side */
    session_key(auth, initiator ? "I>R" : "R>I", tx, t, c->send_key);
    session_key(auth, initiator ? "R>I" : "I>R", rx, t, c->recv_key);
    c->encrypt = auth->encrypt != 0;
    rc = 0;
    goto out;
refused:
    visc_set_error("handshake: peer %s: %s", c->peer_id, visc_last_error());
out:
    sodium_memzero(eph_sk, sizeof eph_sk);
    sodium_memzero(rx, sizeof rx);
    sodium_memzero(tx, sizeof tx);
    return rc;
}

visc_chan *visc_chan_handshake(int fd, int initiator, const visc_swarm_auth *auth,
                               double deadline) {
    if (sodium_init() < 0) {
        close(fd);
        visc_set_error("libsodium failed to initialize");
        return NULL;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        close(fd);
        visc_set_error("fcntl: %s", strerror(errno));
        return NULL;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    visc_chan *c = visc_calloc(1, sizeof *c, "swarm channel");
    c->fd = fd;
    if (handshake(c, initiator, auth, deadline) != 0) {
        visc_chan_close(c);
        return NULL;
    }
    return c;
}

/* ---- frames ---- */

static void counter_nonce(uint64_t counter, uint8_t nonce[24]) {
    memset(nonce, 0, 24);
    for (int i = 0; i < 8; i++) nonce[i] = (uint8_t)(counter >> (8 * i));
}

/* MAC-only frames: Poly1305 (six times faster than keyed BLAKE2b here)
 * under a one-time key, the first 32 bytes of the XChaCha20 keystream for
 * this frame's counter, as the AEAD derives it; streaming, so the payload
 * is authenticated where it lies. */
static void frame_mac(const uint8_t key[32], uint64_t counter, const uint8_t head[FRAME_HEAD],
                      const void *payload, size_t n, uint8_t mac[MAC_TAG]) {
    uint8_t nonce[24], one_time[32];
    counter_nonce(counter, nonce);
    crypto_stream_xchacha20(one_time, sizeof one_time, nonce, key);
    crypto_onetimeauth_state st;
    crypto_onetimeauth_init(&st, one_time);
    crypto_onetimeauth_update(&st, head, FRAME_HEAD);
    if (n > 0) crypto_onetimeauth_update(&st, payload, n);
    crypto_onetimeauth_final(&st, mac);
    sodium_memzero(one_time, sizeof one_time);
    sodium_memzero(&st, sizeof st);
}

static void put_head(uint8_t head[FRAME_HEAD], size_t body_len, uint8_t type) {
    uint32_t len = (uint32_t)(1 + body_len);
    for (int i = 0; i < 4; i++) head[i] = (uint8_t)(len >> (8 * i));
    head[4] = type;
}

static int send_failed(visc_chan *c, const char *what) {
    c->send_failed = 1;
    shutdown(c->fd, SHUT_RDWR); /* the channel is over: wake a receiving thread too */
    return visc_set_error("channel to peer %s: send: %s", c->peer_id, what);
}

int visc_chan_send(visc_chan *c, uint8_t type, const void *payload, size_t n, double deadline) {
    if (c->send_failed)
        return visc_set_error("channel to peer %s: unusable after an earlier error", c->peer_id);
    if (n > VISC_CHAN_MAX_FRAME)
        return visc_set_error("channel to peer %s: frame of %zu bytes exceeds the maximum %u",
                              c->peer_id, n, VISC_CHAN_MAX_FRAME);
    int rc;
    if (c->encrypt) {
        size_t need = FRAME_HEAD + n + AEAD_TAG;
        if (need > c->send_cap) {
            free(c->send_buf);
            c->send_buf = visc_malloc(need, "channel send buffer");
            c->send_cap = need;
        }
        uint8_t *b = c->send_buf, nonce[24];
        put_head(b, n + AEAD_TAG, type);
        counter_nonce(c->send_counter, nonce);
        crypto_aead_xchacha20poly1305_ietf_encrypt_detached(b + FRAME_HEAD, b + FRAME_HEAD + n,
                                                            NULL, payload, n, b, FRAME_HEAD, NULL,
                                                            nonce, c->send_key);
        rc = send_all(c->fd, b, need, deadline, &c->bytes_sent);
    } else {
        uint8_t head[FRAME_HEAD], mac[MAC_TAG];
        put_head(head, n + MAC_TAG, type);
        frame_mac(c->send_key, c->send_counter, head, payload, n, mac);
        struct iovec iov[3] = {{head, FRAME_HEAD}, {(void *)payload, n}, {mac, MAC_TAG}};
        rc = send_iov(c->fd, iov, 3, deadline, &c->bytes_sent);
    }
    if (rc != 0) return send_failed(c, visc_last_error());
    c->send_counter++;
    return 0;
}

static int recv_failed(visc_chan *c, const char *what) {
    c->recv_failed = 1;
    shutdown(c->fd, SHUT_RDWR);
    return visc_set_error("channel from peer %s: %s", c->peer_id, what);
}

int visc_chan_recv(visc_chan *c, uint8_t *type, void *payload, size_t cap, size_t *n,
                   double deadline) {
    if (c->recv_failed)
        return visc_set_error("channel from peer %s: unusable after an earlier error", c->peer_id);
    uint8_t head[FRAME_HEAD];
    if (recv_all(c->fd, head, FRAME_HEAD, deadline, &c->bytes_received) != 0)
        return recv_failed(c, visc_last_error());
    size_t len =
        (size_t)head[0] | (size_t)head[1] << 8 | (size_t)head[2] << 16 | (size_t)head[3] << 24;
    size_t tag = c->encrypt ? AEAD_TAG : MAC_TAG;
    /* the length is checked before a single byte more is read */
    if (len < 1 + tag) {
        char msg[96];
        snprintf(msg, sizeof msg, "frame length %zu is too short", len);
        return recv_failed(c, msg);
    }
    size_t body = len - 1 - tag;
    if (body > VISC_CHAN_MAX_FRAME || body > cap) {
        char msg[128];
        snprintf(msg, sizeof msg, "frame of %zu bytes exceeds the %s of %zu bytes", body,
                 body > VISC_CHAN_MAX_FRAME ? "maximum" : "receiver's cap",
                 body > VISC_CHAN_MAX_FRAME ? (size_t)VISC_CHAN_MAX_FRAME : cap);
        return recv_failed(c, msg);
    }
    uint8_t mac[MAC_TAG];
    if (recv_all(c->fd, payload, body, deadline, &c->bytes_received) != 0 ||
        recv_all(c->fd, mac, tag, deadline, &c->bytes_received) != 0)
        return recv_failed(c, visc_last_error());
    int ok;
    if (c->encrypt) {
        uint8_t nonce[24];
        counter_nonce(c->recv_counter, nonce);
        ok = crypto_aead_xchacha20poly1305_ietf_decrypt_detached(payload, NULL, payload, body, mac,
                                                                 head, FRAME_HEAD, nonce,
                                                                 c->recv_key) == 0;
    } else {
        uint8_t want[MAC_TAG];
        frame_mac(c->recv_key, c->recv_counter, head, payload, body, want);
        ok = crypto_verify_16(want, mac) == 0;
    }
    if (!ok)
        return recv_failed(c, "frame authentication failed (replayed, altered or out of order)");
    c->recv_counter++;
    *type = head[4];
    *n = body;
    return 0;
}

const uint8_t *visc_chan_peer_key(const visc_chan *c) { return c->peer_key; }

int visc_chan_fd(const visc_chan *c) { return c->fd; }

uint64_t visc_chan_bytes_sent(const visc_chan *c) {
    return atomic_load_explicit(&c->bytes_sent, memory_order_relaxed);
}

uint64_t visc_chan_bytes_received(const visc_chan *c) {
    return atomic_load_explicit(&c->bytes_received, memory_order_relaxed);
}

void visc_chan_shutdown(visc_chan *c) {
    if (c) shutdown(c->fd, SHUT_RDWR);
}

void visc_chan_close(visc_chan *c) {
    if (!c) return;
    close(c->fd);
    free(c->send_buf);
    sodium_memzero(c, sizeof *c);
    free(c);
}

/* swarm.h: training across volunteers' machines with no master, in the
 * style of hivemind, without its defects: every peer authenticated, every
 * message and record bound to its sender, every tensor validated.
 *
 * identity.c    Ed25519 key pairs, peer ids, key files (0600)
 * auth.c        swarm credentials: shared secret, allowlist, owner-signed
 *               access tokens with an expiry; who may join
 * channel.c     TCP connections with a mutual handshake (signatures over
 *               a fresh transcript), then AEAD-encrypted (or MAC-only)
 *               frames with implicit counters: replays fail
 * record.c      signed DHT records with expiry; newest wins per signer
 * dht.c         discovery and records on OpenDHT, behind a small interface
 *               (the only file that includes OpenDHT's header)
 * compress.c    none, fp16, bf16, blockwise 8-bit (with error feedback)
 * aggregate.c   validation of received parts; mean, trimmed mean and
 *               centered clipping
 * node.c        a peer: listener, accept thread, dispatch of incoming
 *               connections by purpose
 * matchmaking.c forming groups for one averaging round
 * allreduce.c   the butterfly all-reduce with per-part deadlines and
 *               stated failure semantics
 *
 * Licence: dht.c links OpenDHT (GPL-3). The swarm is built as its own
 * library (build/libvisc_swarm.a); `make SWARM=0` builds visc without it. */
#ifndef VISC_SWARM_H
#define VISC_SWARM_H

#include <stddef.h>
#include <stdint.h>

#define VISC_KEY_BYTES 32
#define VISC_PEER_ID_CHARS 16 /* hex of the first 8 bytes of BLAKE2b(public key) */
#define VISC_TOKEN_BYTES 140  /* "VTK1", peer key, run hash, expiry (u64 LE), signature */
/* The token's signature covers "visc-swarm-token-v1" and the 76 bytes before
 * it, so no other signed message of the owner's key can pass for a token. */
#define VISC_GROUP_MAX 64

/* ---- identity (identity.c) ---- */
typedef struct {
    uint8_t public_key[VISC_KEY_BYTES];
    uint8_t secret_key[64]; /* libsodium's Ed25519 secret key (seed + public key) */
} visc_identity;

/* A fresh key pair. Needs libsodium initialized (done here, idempotent). */
int visc_identity_generate(visc_identity *id);
/* Reads the key file at path; if it does not exist, creates it (mode 0600,
 * written atomically). A key file readable by group or others, of the wrong
 * size, or corrupt is an error naming the path. */
int visc_identity_load_or_create(const char *path, visc_identity *id);
int visc_identity_load(const char *path, visc_identity *id);
/* A public key file (the hex of the key and a newline) for allowlists. */
int visc_public_key_write(const char *path, const uint8_t pk[VISC_KEY_BYTES]);
int visc_public_key_parse_hex(const char *hex, uint8_t pk[VISC_KEY_BYTES]);
/* Reads up to cap bytes (*n: how many) of a regular file that only its
 * owner may read (no group/other permission bits); what names it in errors. */
int visc_read_private_file(const char *path, const char *what, void *buf, size_t cap, size_t *n);
/* out: VISC_PEER_ID_CHARS hex digits and a NUL. */
void visc_peer_id(const uint8_t pk[VISC_KEY_BYTES], char out[VISC_PEER_ID_CHARS + 1]);

/* ---- credentials (auth.c) ---- */
typedef struct {
    char run_id[128];
    uint8_t run_hash[32]; /* BLAKE2b-256 of run_id: what records and tokens bind to */
    visc_identity self;
    /* (a) a shared swarm secret: every peer proves it knows it in the handshake,
     * and it is mixed into the session keys */
    int has_secret;
    uint8_t secret[32]; /* BLAKE2b-256 of the secret file's contents */
    /* (b) who may join: public keys listed here, or holders of a token that
     * owner_key signed for this run and that has not expired */
    uint8_t (*allowed)[VISC_KEY_BYTES];
    int n_allowed;
    int has_owner;
    uint8_t owner_key[VISC_KEY_BYTES];
    /* the token this peer presents (from the owner), if any */
    int has_token;
    uint8_t token[VISC_TOKEN_BYTES];
    int encrypt; /* 1 (default): AEAD on every frame; 0: authenticated only */
} visc_swarm_auth;

/* Fills run id, run hash, self, encrypt = 1; nothing else. */
int visc_swarm_auth_init(visc_swarm_auth *a, const char *run_id, const visc_identity *self);
/* Reads a secret file (at least 16 bytes; a group/world-readable file is an error). */
int visc_swarm_auth_set_secret_file(visc_swarm_auth *a, const char *path);
int visc_swarm_auth_set_secret(visc_swarm_auth *a, const void *bytes, size_t n);
/* Adds one public key to the allowlist (copied). */
int visc_swarm_auth_allow(visc_swarm_auth *a, const uint8_t pk[VISC_KEY_BYTES]);
/* Reads an allowlist file: one hex public key per line, '#' comments,
 * blank lines; at most 1 MiB. */
int visc_swarm_auth_allow_file(visc_swarm_auth *a, const char *path);
/* The same over text in memory; errors name source:line. */
int visc_swarm_auth_allow_text(visc_swarm_auth *a, const char *text, size_t n, const char *source);
void visc_swarm_auth_free(visc_swarm_auth *a);
/* A token by which the run's owner admits peer_key to run_id until expires_unix. */
void visc_token_sign(const visc_identity *owner, const uint8_t peer_key[VISC_KEY_BYTES],
                     const char *run_id, uint64_t expires_unix, uint8_t token[VISC_TOKEN_BYTES]);
/* 0 when token admits peer_key to the run of a, now (unix seconds); -1 with
 * the reason (wrong signer, other run, other key, expired, malformed). */
int visc_token_check(const visc_swarm_auth *a, const uint8_t peer_key[VISC_KEY_BYTES],
                     const uint8_t *token, size_t n, uint64_t now_unix);
/* 0 when a peer with this key (and token, NULL if none) may take part. A
 * swarm with neither a secret nor an allowlist/owner is refused at setup
 * (visc_swarm_auth_check_config). */
int visc_swarm_auth_admit(const visc_swarm_auth *a, const uint8_t peer_key[VISC_KEY_BYTES],
                          const uint8_t *token, size_t token_len);
int visc_swarm_auth_check_config(const visc_swarm_auth *a);

/* ---- compression of averaged parts (compress.c) ---- */
typedef enum {
    VISC_COMP_NONE = 0,
    VISC_COMP_FP16 = 1, /* clamped to +-65504 */
    VISC_COMP_BF16 = 2,
    VISC_COMP_Q8 = 3, /* blockwise 8-bit: per block of 4096, absmax scale */
} visc_compression;
/* "none", "fp16", "bf16", "q8" (also "int8", "8bit"); -1 and an error otherwise. */
int visc_compression_parse(const char *name, visc_compression *out);
const char *visc_compression_name(visc_compression c);

/* ---- robust aggregation (aggregate.c) ---- */
typedef enum {
    VISC_AGG_MEAN = 0,          /* weighted mean */
    VISC_AGG_TRIMMED_MEAN = 1,  /* coordinate-wise: drop the trim largest and smallest */
    VISC_AGG_CENTERED_CLIP = 2, /* clip each peer's distance to the median into a ball */
} visc_aggregation;
int visc_aggregation_parse(const char *name, visc_aggregation *out);

#endif

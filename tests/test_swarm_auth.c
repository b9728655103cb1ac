/* test_swarm_auth.c: key files, secrets, allowlists and access tokens. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "visc/core.h"
#include "visc/swarm.h"

static char tmpdir[64];

static const char *tmp_path(const char *name) {
    static char path[256];
    if (!tmpdir[0]) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/visc_swarm_auth_XXXXXX");
        VISC_ASSERT(mkdtemp(tmpdir) != NULL);
    }
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    return path;
}

/* every test unlinks its files; the directory goes last */
__attribute__((destructor)) static void remove_tmpdir(void) {
    if (tmpdir[0]) rmdir(tmpdir);
}

static void write_text(const char *path, const void *text, size_t n, mode_t mode) {
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    VISC_ASSERT(fd >= 0);
    VISC_ASSERT(fchmod(fd, mode) == 0);
    VISC_ASSERT(write(fd, text, n) == (ssize_t)n);
    close(fd);
}

static int error_has(const char *what) { return strstr(visc_last_error(), what) != NULL; }

TEST(key_file_created_0600_and_reloaded) {
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("node.key"));
    unlink(path);
    visc_identity a, b;
    CHECK(visc_identity_load_or_create(path, &a) == 0);
    struct stat st;
    CHECK(stat(path, &st) == 0);
    CHECK_MSG((st.st_mode & 0777) == 0600, "mode %o", (unsigned)(st.st_mode & 0777));
    CHECK(visc_identity_load_or_create(path, &b) == 0);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    CHECK(visc_identity_load(path, &b) == 0);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    /* no temporary file left behind: the key is the directory's only entry */
    DIR *d = opendir(tmpdir);
    CHECK(d != NULL);
    int entries = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) entries++;
    if (d) closedir(d);
    CHECK_MSG(entries == 1, "%d entries in %s", entries, tmpdir);
    /* the peer id is 16 hex digits and differs between keys */
    visc_identity c;
    CHECK(visc_identity_generate(&c) == 0);
    char ia[VISC_PEER_ID_CHARS + 1], ic[VISC_PEER_ID_CHARS + 1];
    visc_peer_id(a.public_key, ia);
    visc_peer_id(c.public_key, ic);
    CHECK(strlen(ia) == VISC_PEER_ID_CHARS && strspn(ia, "0123456789abcdef") == 16);
    CHECK(strcmp(ia, ic) != 0);
    unlink(path);
}

TEST(key_file_readable_by_others_refused) {
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("open.key"));
    unlink(path);
    visc_identity a;
    CHECK(visc_identity_load_or_create(path, &a) == 0);
    CHECK(chmod(path, 0644) == 0);
    CHECK(visc_identity_load(path, &a) == -1);
    CHECK(error_has(path) && error_has("readable by group or others"));
    CHECK(visc_identity_load_or_create(path, &a) == -1); /* never silently replaced */
    CHECK(chmod(path, 0640) == 0);
    CHECK(visc_identity_load(path, &a) == -1);
    unlink(path);
}

TEST(key_file_corrupt_or_short) {
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("bad.key"));
    visc_identity a;
    CHECK(visc_identity_generate(&a) == 0);
    char good[256];
    int n = snprintf(good, sizeof good, "visc-swarm-key v1\n");
    for (int i = 0; i < 64; i++)
        n += snprintf(good + n, sizeof good - (size_t)n, "%02x", a.secret_key[i]);
    n += snprintf(good + n, sizeof good - (size_t)n, "\n");
    write_text(path, good, (size_t)n, 0600);
    visc_identity b;
    CHECK(visc_identity_load(path, &b) == 0);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    /* short */
    write_text(path, good, (size_t)n - 10, 0600);
    CHECK(visc_identity_load(path, &b) == -1 && error_has(path) && error_has("corrupt"));
    /* empty */
    write_text(path, "", 0, 0600);
    CHECK(visc_identity_load(path, &b) == -1 && error_has("corrupt"));
    /* a non-hex digit */
    char bad[256];
    memcpy(bad, good, (size_t)n);
    bad[30] = 'g';
    write_text(path, bad, (size_t)n, 0600);
    CHECK(visc_identity_load(path, &b) == -1 && error_has("corrupt"));
    /* the public half does not match the seed */
    memcpy(bad, good, (size_t)n);
    bad[n - 2] = bad[n - 2] == '0' ? '1' : '0';
    write_text(path, bad, (size_t)n, 0600);
    CHECK(visc_identity_load(path, &b) == -1 && error_has("does not match"));
    /* other magic, trailing bytes */
    memcpy(bad, good, (size_t)n);
    bad[16] = '2';
    write_text(path, bad, (size_t)n, 0600);
    CHECK(visc_identity_load(path, &b) == -1 && error_has("corrupt"));
    memcpy(bad, good, (size_t)n);
    bad[n] = '\n';
    write_text(path, bad, (size_t)n + 1, 0600);
    CHECK(visc_identity_load(path, &b) == -1 && error_has("corrupt"));
    /* missing */
    unlink(path);
    CHECK(visc_identity_load(path, &b) == -1 && error_has(path));
}

TEST(public_key_file) {
    visc_identity a;
    CHECK(visc_identity_generate(&a) == 0);
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("node.pub"));
    CHECK(visc_public_key_write(path, a.public_key) == 0);
    size_t n = 0;
    uint8_t *text = visc_test_read_file(path, &n);
    CHECK(text && n == 65 && text[64] == '\n');
    uint8_t pk[VISC_KEY_BYTES];
    if (text) {
        text[64] = 0;
        CHECK(visc_public_key_parse_hex((char *)text, pk) == 0);
        CHECK(memcmp(pk, a.public_key, VISC_KEY_BYTES) == 0);
    }
    free(text);
    CHECK(visc_public_key_parse_hex("abcd", pk) == -1);
    char hex[66];
    memset(hex, 'z', 64);
    hex[64] = 0;
    CHECK(visc_public_key_parse_hex(hex, pk) == -1);
    memset(hex, 'a', 65);
    hex[65] = 0;
    CHECK(visc_public_key_parse_hex(hex, pk) == -1);
    unlink(path);
}

TEST(secret_file) {
    visc_identity a;
    CHECK(visc_identity_generate(&a) == 0);
    visc_swarm_auth s;
    CHECK(visc_swarm_auth_init(&s, "run", &a) == 0);
    CHECK(s.encrypt == 1 && !s.has_secret);
    CHECK(visc_swarm_auth_check_config(&s) == -1 && error_has("anyone could join"));
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("secret"));
    write_text(path, "0123456789abcdefXYZ", 19, 0644);
    CHECK(visc_swarm_auth_set_secret_file(&s, path) == -1 && error_has("readable by group"));
    write_text(path, "short", 5, 0600);
    CHECK(visc_swarm_auth_set_secret_file(&s, path) == -1 && error_has("at least 16"));
    CHECK(!s.has_secret);
    write_text(path, "0123456789abcdefXYZ", 19, 0600);
    CHECK(visc_swarm_auth_set_secret_file(&s, path) == 0 && s.has_secret);
    CHECK(visc_swarm_auth_check_config(&s) == 0);
    /* the same bytes given directly make the same key */
    visc_swarm_auth t;
    CHECK(visc_swarm_auth_init(&t, "run", &a) == 0);
    CHECK(visc_swarm_auth_set_secret(&t, "0123456789abcdefXYZ", 19) == 0);
    CHECK(memcmp(s.secret, t.secret, 32) == 0);
    CHECK(visc_swarm_auth_set_secret(&t, "0123", 4) == -1);
    /* a run id that does not fit */
    char long_id[200];
    memset(long_id, 'r', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = 0;
    CHECK(visc_swarm_auth_init(&t, long_id, &a) == -1);
    CHECK(visc_swarm_auth_init(&t, "", &a) == -1);
    visc_swarm_auth_free(&s);
    visc_swarm_auth_free(&t);
    unlink(path);
}

TEST(allowlist_parsing) {
    visc_identity a, b;
    CHECK(visc_identity_generate(&a) == 0 && visc_identity_generate(&b) == 0);
    char ha[65], hb[65];
    for (int i = 0; i < 32; i++) {
        snprintf(ha + 2 * i, 3, "%02x", a.public_key[i]);
        snprintf(hb + 2 * i, 3, "%02X", b.public_key[i]); /* upper case is fine too */
    }
    char text[512];
    int n = snprintf(text, sizeof text, "# who may join\n\n  %s  # alice\r\n%s\n%s\n", ha, hb, ha);
    visc_swarm_auth s;
    CHECK(visc_swarm_auth_init(&s, "run", &a) == 0);
    CHECK(visc_swarm_auth_allow_text(&s, text, (size_t)n, "list") == 0);
    CHECK(s.n_allowed == 2); /* the repeated key counted once */
    CHECK(visc_swarm_auth_check_config(&s) == 0);
    CHECK(visc_swarm_auth_admit(&s, a.public_key, NULL, 0) == 0);
    CHECK(visc_swarm_auth_admit(&s, b.public_key, NULL, 0) == 0);
    visc_identity c;
    CHECK(visc_identity_generate(&c) == 0);
    CHECK(visc_swarm_auth_admit(&s, c.public_key, NULL, 0) == -1);
    CHECK(error_has("not on the allowlist and no valid token"));
    /* errors name the line */
    n = snprintf(text, sizeof text, "%s\nnot-a-key\n", ha);
    CHECK(visc_swarm_auth_allow_text(&s, text, (size_t)n, "list") == -1 && error_has("list:2"));
    n = snprintf(text, sizeof text, "%.63s\n", ha);
    CHECK(visc_swarm_auth_allow_text(&s, text, (size_t)n, "list") == -1 && error_has("list:1"));
    n = snprintf(text, sizeof text, "%.63sz\n", ha);
    CHECK(visc_swarm_auth_allow_text(&s, text, (size_t)n, "list") == -1 && error_has("list:1"));
    /* from a file */
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("allow"));
    n = snprintf(text, sizeof text, "%s\n", hb);
    write_text(path, text, (size_t)n, 0644);
    visc_swarm_auth t;
    CHECK(visc_swarm_auth_init(&t, "run", &a) == 0);
    CHECK(visc_swarm_auth_allow_file(&t, path) == 0 && t.n_allowed == 1);
    unlink(path);
    CHECK(visc_swarm_auth_allow_file(&t, path) == -1 && error_has(path));
    visc_swarm_auth_free(&s);
    visc_swarm_auth_free(&t);
}

TEST(token_sign_and_check) {
    visc_identity owner, peer, other;
    CHECK(visc_identity_generate(&owner) == 0 && visc_identity_generate(&peer) == 0 &&
          visc_identity_generate(&other) == 0);
    visc_swarm_auth s;
    CHECK(visc_swarm_auth_init(&s, "run-1", &owner) == 0);
    uint8_t tok[VISC_TOKEN_BYTES];
    visc_token_sign(&owner, peer.public_key, "run-1", 1000, tok);
    CHECK(memcmp(tok, "VTK1", 4) == 0);
    /* no owner configured: nothing is accepted */
    CHECK(visc_token_check(&s, peer.public_key, tok, sizeof tok, 10) == -1 &&
          error_has("no run owner"));
    s.has_owner = 1;
    memcpy(s.owner_key, owner.public_key, VISC_KEY_BYTES);
    CHECK(visc_swarm_auth_check_config(&s) == 0);
    CHECK(visc_token_check(&s, peer.public_key, tok, sizeof tok, 999) == 0);
    CHECK(visc_token_check(&s, peer.public_key, tok, sizeof tok, 1000) == -1 &&
          error_has("expired"));
    CHECK(visc_token_check(&s, other.public_key, tok, sizeof tok, 10) == -1 &&
          error_has("another peer key"));
    CHECK(visc_token_check(&s, peer.public_key, tok, sizeof tok - 1, 10) == -1 &&
          error_has("malformed"));
    /* every byte matters */
    for (int i = 0; i < VISC_TOKEN_BYTES; i++) {
        uint8_t bad[VISC_TOKEN_BYTES];
        memcpy(bad, tok, sizeof bad);
        bad[i] ^= 0x20;
        CHECK_MSG(visc_token_check(&s, peer.public_key, bad, sizeof bad, 10) == -1, "byte %d", i);
    }
    /* another run, another signer */
    visc_token_sign(&owner, peer.public_key, "run-2", 1000, tok);
    CHECK(visc_token_check(&s, peer.public_key, tok, sizeof tok, 10) == -1 &&
          error_has("another run"));
    visc_token_sign(&other, peer.public_key, "run-1", 1000, tok);
    CHECK(visc_token_check(&s, peer.public_key, tok, sizeof tok, 10) == -1 &&
          error_has("not signed by the run owner"));
    /* admit: a valid token admits a key that no list names */
    visc_swarm_auth_allow(&s, other.public_key);
    uint64_t later = (uint64_t)time(NULL) + 3600;
    visc_token_sign(&owner, peer.public_key, "run-1", later, tok);
    CHECK(visc_swarm_auth_admit(&s, peer.public_key, tok, sizeof tok) == 0);
    CHECK(visc_swarm_auth_admit(&s, peer.public_key, NULL, 0) == -1);
    CHECK(visc_swarm_auth_admit(&s, other.public_key, NULL, 0) == 0);
    visc_token_sign(&owner, peer.public_key, "run-1", (uint64_t)time(NULL) - 1, tok);
    CHECK(visc_swarm_auth_admit(&s, peer.public_key, tok, sizeof tok) == -1 &&
          error_has("expired"));
    visc_swarm_auth_free(&s);
}

/* A secret alone admits every key (the handshake proves the secret). */
TEST(admit_by_secret_alone) {
    visc_identity a, b;
    CHECK(visc_identity_generate(&a) == 0 && visc_identity_generate(&b) == 0);
    visc_swarm_auth s;
    CHECK(visc_swarm_auth_init(&s, "run", &a) == 0);
    CHECK(visc_swarm_auth_admit(&s, b.public_key, NULL, 0) == -1);
    CHECK(visc_swarm_auth_set_secret(&s, "0123456789abcdef", 16) == 0);
    CHECK(visc_swarm_auth_admit(&s, b.public_key, NULL, 0) == 0);
    visc_swarm_auth_free(&s);
}

/* ---- files that are not what they should be ---- */

/* A key path that is a directory or a FIFO is refused at once (a FIFO
 * with no writer must not block the load forever). */
TEST(key_file_not_a_regular_file) {
    visc_identity a;
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("dir.key"));
    CHECK(mkdir(path, 0700) == 0);
    CHECK(visc_identity_load(path, &a) == -1 && error_has("not a regular file"));
    CHECK(visc_identity_load_or_create(path, &a) == -1 && error_has("not a regular file"));
    rmdir(path);
    snprintf(path, sizeof path, "%s", tmp_path("fifo.key"));
    CHECK(mkfifo(path, 0600) == 0);
    double t0 = visc_now();
    CHECK(visc_identity_load(path, &a) == -1 && error_has("not a regular file"));
    CHECK(visc_now() - t0 < 5.0);
    unlink(path);
}

/* A regular 0600 file whose read fails: /proc/self/mem reads at offset 0
 * (unmapped) end in EIO. */
TEST(key_file_read_error) {
    visc_identity a;
    CHECK(visc_identity_load("/proc/self/mem", &a) == -1);
    CHECK_MSG(error_has("cannot read key file") && error_has("/proc/self/mem"), "%s",
              visc_last_error());
}

/* A new key cannot be created in a directory that does not exist; nothing is
 * left behind and nothing is returned. */
TEST(key_file_cannot_be_created) {
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("missing-dir/node.key"));
    visc_identity a;
    memset(&a, 0x5a, sizeof a);
    CHECK(visc_identity_load_or_create(path, &a) == -1);
    CHECK_MSG(error_has("cannot create key file") && error_has(path), "%s", visc_last_error());
    CHECK(a.public_key[0] == 0x5a && a.secret_key[63] == 0x5a);
}

/* Threads of one process creating the same key at once all end up with the
 * one identity that is in the file (each uses its own temporary file). */
enum { RACERS = 8 };
typedef struct {
    const char *path;
    pthread_barrier_t *start;
    visc_identity id;
    int rc;
    char err[256];
} key_racer;

static void *race_for_key(void *arg) {
    key_racer *r = arg;
    pthread_barrier_wait(r->start);
    r->rc = visc_identity_load_or_create(r->path, &r->id);
    if (r->rc) snprintf(r->err, sizeof r->err, "%s", visc_last_error());
    return NULL;
}

TEST(key_file_created_once_by_racing_threads) {
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("race.key"));
    for (int round = 0; round < 5; round++) {
        unlink(path);
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, RACERS);
        key_racer r[RACERS];
        pthread_t th[RACERS];
        for (int i = 0; i < RACERS; i++) {
            r[i] = (key_racer){.path = path, .start = &start};
            pthread_create(&th[i], NULL, race_for_key, &r[i]);
        }
        for (int i = 0; i < RACERS; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        visc_identity on_disk;
        CHECK(visc_identity_load(path, &on_disk) == 0);
        for (int i = 0; i < RACERS; i++) {
            CHECK_MSG(r[i].rc == 0, "round %d racer %d: %s", round, i, r[i].err);
            CHECK_MSG(memcmp(&r[i].id, &on_disk, sizeof on_disk) == 0,
                      "round %d racer %d holds a key that is not the file's", round, i);
        }
    }
    unlink(path);
}

TEST(secret_file_too_large) {
    visc_identity a;
    CHECK(visc_identity_generate(&a) == 0);
    visc_swarm_auth s;
    CHECK(visc_swarm_auth_init(&s, "run", &a) == 0);
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("big-secret"));
    size_t n = (1u << 20) + 1;
    char *big = malloc(n);
    memset(big, 's', n);
    write_text(path, big, n, 0600);
    CHECK(visc_swarm_auth_set_secret_file(&s, path) == -1 && error_has("larger than"));
    CHECK(!s.has_secret);
    write_text(path, big, n - 1, 0600); /* exactly the maximum is fine */
    CHECK(visc_swarm_auth_set_secret_file(&s, path) == 0 && s.has_secret);
    free(big);
    unlink(path);
    visc_swarm_auth_free(&s);
}

TEST(allowlist_file_too_large) {
    visc_identity a;
    CHECK(visc_identity_generate(&a) == 0);
    visc_swarm_auth s;
    CHECK(visc_swarm_auth_init(&s, "run", &a) == 0);
    char path[256];
    snprintf(path, sizeof path, "%s", tmp_path("big-allow"));
    size_t n = (1u << 20) + 1;
    char *big = malloc(n);
    memset(big, '#', n); /* one long comment: valid text, but too much of it */
    write_text(path, big, n, 0644);
    CHECK(visc_swarm_auth_allow_file(&s, path) == -1 && error_has("larger than"));
    write_text(path, big, n - 1, 0644);
    CHECK(visc_swarm_auth_allow_file(&s, path) == 0 && s.n_allowed == 0);
    /* a directory cannot be read as an allowlist */
    CHECK(visc_swarm_auth_allow_file(&s, tmpdir) == -1 && error_has("cannot read allowlist"));
    free(big);
    unlink(path);
    visc_swarm_auth_free(&s);
}

/* The allowlist holds at most 65536 keys (filled directly: adding them one by
 * one is quadratic); the next one is refused, with the line when from text. */
TEST(allowlist_key_cap) {
    visc_identity a;
    CHECK(visc_identity_generate(&a) == 0);
    visc_swarm_auth s;
    CHECK(visc_swarm_auth_init(&s, "run", &a) == 0);
    enum { CAP = 65536 };
    s.allowed = calloc(CAP, VISC_KEY_BYTES);
    for (int i = 0; i < CAP; i++) memcpy(s.allowed[i], &i, sizeof i);
    s.n_allowed = CAP;
    uint8_t listed[VISC_KEY_BYTES] = {0};
    int last = CAP - 1;
    memcpy(listed, &last, sizeof last);
    CHECK(visc_swarm_auth_allow(&s, listed) == 0); /* already there: no growth */
    CHECK(visc_swarm_auth_allow(&s, a.public_key) == -1 && error_has("more than 65536"));
    char text[80];
    int n = 0;
    for (int i = 0; i < 32; i++) n += snprintf(text + n, sizeof text - (size_t)n, "%02x", 0xee);
    text[n++] = '\n';
    CHECK(visc_swarm_auth_allow_text(&s, text, (size_t)n, "keys") == -1 && error_has("keys:1") &&
          error_has("more than 65536"));
    CHECK(s.n_allowed == CAP);
    visc_swarm_auth_free(&s);
}

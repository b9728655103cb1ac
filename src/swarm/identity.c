/* identity.c: a peer's Ed25519 key pair, its peer id, and its key file.
 *
 * Key file: "visc-swarm-key v1\n" and the hex of libsodium's 64-byte secret
 * key (seed + public key) and a newline, mode 0600. Loading checks the
 * permissions (a key others can read is not secret any more), the exact
 * layout, and that the public half matches the seed, so a truncated or
 * hand-edited file is an error rather than a different identity. */
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "visc/core.h"
#include "visc/io.h"
#include "visc/swarm.h"

#define KEY_FILE_MAGIC "visc-swarm-key v1\n"
#define KEY_FILE_BYTES (sizeof(KEY_FILE_MAGIC) - 1 + 128 + 1)

static int sodium_ready(void) {
    if (sodium_init() < 0) return visc_set_error("libsodium failed to initialize");
    return 0;
}

int visc_identity_generate(visc_identity *id) {
    if (sodium_ready() != 0) return -1;
    crypto_sign_keypair(id->public_key, id->secret_key);
    return 0;
}

void visc_peer_id(const uint8_t pk[VISC_KEY_BYTES], char out[VISC_PEER_ID_CHARS + 1]) {
    uint8_t h[32];
    crypto_generichash(h, sizeof h, pk, VISC_KEY_BYTES, NULL, 0);
    sodium_bin2hex(out, VISC_PEER_ID_CHARS + 1, h, VISC_PEER_ID_CHARS / 2);
}

int visc_public_key_parse_hex(const char *hex, uint8_t pk[VISC_KEY_BYTES]) {
    size_t n = strnlen(hex, 2 * VISC_KEY_BYTES + 1);
    if (n != 2 * VISC_KEY_BYTES)
        return visc_set_error("a public key must be %d hex digits", 2 * VISC_KEY_BYTES);
    size_t got = 0;
    if (sodium_hex2bin(pk, VISC_KEY_BYTES, hex, n, NULL, &got, NULL) != 0 || got != VISC_KEY_BYTES)
        return visc_set_error("a public key must be %d hex digits", 2 * VISC_KEY_BYTES);
    return 0;
}

int visc_read_private_file(const char *path, const char *what, void *buf, size_t cap, size_t *n) {
    /* O_NONBLOCK: opening a FIFO would otherwise wait for a writer; it is
     * refused below like anything else that is not a regular file */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return visc_set_error("cannot read %s '%s': %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return visc_set_error("%s '%s' is not a regular file", what, path);
    }
    if (st.st_mode & 077) {
        close(fd);
        return visc_set_error("%s '%s' is readable by group or others (mode %03o); chmod 600 it",
                              what, path, (unsigned)(st.st_mode & 0777));
    }
    size_t got = 0;
    while (got < cap) {
        ssize_t k = read(fd, (uint8_t *)buf + got, cap - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            close(fd);
            return visc_set_error("cannot read %s '%s': %s", what, path, strerror(e));
        }
        if (k == 0) break;
        got += (size_t)k;
    }
    close(fd);
    *n = got;
    return 0;
}

/* Parses a key file image; the checks are the format's whole definition. */
static int parse_key_file(const char *path, const uint8_t *buf, size_t n, visc_identity *id) {
    size_t magic = sizeof(KEY_FILE_MAGIC) - 1;
    if (n != KEY_FILE_BYTES || memcmp(buf, KEY_FILE_MAGIC, magic) != 0 || buf[n - 1] != '\n')
        return visc_set_error("key file '%s' is corrupt (expected \"visc-swarm-key v1\" "
                              "and 128 hex digits)",
                              path);
    uint8_t sk[64];
    size_t got = 0;
    if (sodium_hex2bin(sk, sizeof sk, (const char *)buf + magic, 128, NULL, &got, NULL) != 0 ||
        got != sizeof sk)
        return visc_set_error("key file '%s' is corrupt (not 128 hex digits)", path);
    /* The public half must be what the seed derives: a flipped digit would
     * otherwise sign with one key and claim another. */
    visc_identity check;
    crypto_sign_seed_keypair(check.public_key, check.secret_key, sk);
    int ok = sodium_memcmp(check.secret_key, sk, sizeof sk) == 0;
    sodium_memzero(sk, sizeof sk);
    if (!ok) {
        sodium_memzero(&check, sizeof check);
        return visc_set_error("key file '%s' is corrupt (public key does not match the seed)",
                              path);
    }
    *id = check;
    sodium_memzero(&check, sizeof check);
    return 0;
}

int visc_identity_load(const char *path, visc_identity *id) {
    if (sodium_ready() != 0) return -1;
    uint8_t buf[KEY_FILE_BYTES + 1];
    size_t n = 0;
    if (visc_read_private_file(path, "key file", buf, sizeof buf, &n) != 0) return -1;
    int rc = parse_key_file(path, buf, n, id);
    sodium_memzero(buf, sizeof buf);
    return rc;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Creates path with mode 0600 holding buf, only if it does not exist yet:
 * the data goes to a temporary file first (fsynced), then link(2) gives it
 * its name, which fails if another process or thread created the key
 * meanwhile (returns 1 then). The temporary name has random bytes besides
 * the pid: threads of one process racing for the same key must not share
 * (and unlink) each other's temporary file. visc_write_file_atomic would
 * replace an existing file and creates it with the umask's mode, so it does
 * not fit here. */
static int create_private_file(const char *path, const uint8_t *buf, size_t n) {
    size_t cap = strlen(path) + 48;
    char *tmp = visc_malloc(cap, "temporary key file name");
    snprintf(tmp, cap, "%s.tmp.%ld.%08x", path, (long)getpid(), (unsigned)randombytes_random());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return visc_set_error("cannot create key file '%s': %s", path, strerror(e));
    }
    int ok = fchmod(fd, 0600) == 0 && write_all(fd, buf, n) == 0 && fsync(fd) == 0;
    int e = errno;
    if (close(fd) != 0 && ok) ok = 0, e = errno;
    int rc = 0;
    if (!ok) rc = visc_set_error("cannot write key file '%s': %s", path, strerror(e));
    else if (link(tmp, path) != 0) {
        if (errno == EEXIST) rc = 1;
        else rc = visc_set_error("cannot create key file '%s': %s", path, strerror(errno));
    }
    unlink(tmp);
    free(tmp);
    if (rc == 0) {
        /* make the new name durable too */
        char *dir = visc_strdup(path);
        char *slash = strrchr(dir, '/');
        if (!slash) strcpy(dir, ".");
        else if (slash == dir) dir[1] = 0;
        else *slash = 0;
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    return rc;
}

int visc_identity_load_or_create(const char *path, visc_identity *id) {
    if (sodium_ready() != 0) return -1;
    struct stat st;
    if (lstat(path, &st) == 0 || errno != ENOENT) return visc_identity_load(path, id);
    visc_identity fresh;
    visc_identity_generate(&fresh);
    uint8_t buf[KEY_FILE_BYTES + 1];
    size_t magic = sizeof(KEY_FILE_MAGIC) - 1;
    memcpy(buf, KEY_FILE_MAGIC, magic);
    sodium_bin2hex((char *)buf + magic, 129, fresh.secret_key, sizeof fresh.secret_key);
    buf[KEY_FILE_BYTES - 1] = '\n';
    int rc = create_private_file(path, buf, KEY_FILE_BYTES);
    sodium_memzero(buf, sizeof buf);
    if (rc == 0) *id = fresh;
    sodium_memzero(&fresh, sizeof fresh);
    if (rc == 1) return visc_identity_load(path, id); /* another process won the race */
    return rc;
}

int visc_public_key_write(const char *path, const uint8_t pk[VISC_KEY_BYTES]) {
    char hex[2 * VISC_KEY_BYTES + 2];
    sodium_bin2hex(hex, sizeof hex - 1, pk, VISC_KEY_BYTES);
    hex[2 * VISC_KEY_BYTES] = '\n';
    const void *parts[1] = {hex};
    size_t sizes[1] = {2 * VISC_KEY_BYTES + 1};
    return visc_write_file_atomic(path, parts, sizes, 1);
}

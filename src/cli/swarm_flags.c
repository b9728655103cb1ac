/* swarm_flags.c: the credentials and network flags of `visc swarm ...` and
 * `visc train --swarm`. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "swarm_flags.h"
#include "visc/core.h"

#ifdef VISC_WITH_SWARM
const char visc_swarm_flags_help[] =
    "  --run-id RUN             the swarm's name: peers of one run train one model\n"
    "  --key FILE               this peer's key (created if missing; default\n"
    "                           ~/.visc/swarm.key)\n"
    "  --swarm-secret-file F    the secret every peer of the run knows (mode 0600)\n"
    "  --allow-file F           public keys (hex, one per line) admitted\n"
    "  --owner-key-pub HEX      admit holders of tokens this key signed\n"
    "  --token FILE             the token this peer presents\n"
    "  --no-encrypt             authenticate frames but do not encrypt them\n"
    "  --listen HOST:PORT       where peers reach this one (TCP; the DHT binds the\n"
    "                           same host; default 0.0.0.0:0)\n"
    "  --dht-port P             UDP port of the DHT node (default: any free port)\n"
    "  --initial-peers H:P,...  DHT nodes to join through (none: start a swarm)\n";

void visc_swarm_flags_default(visc_swarm_flags *f) {
    memset(f, 0, sizeof *f);
    f->listen = "0.0.0.0:0";
    f->encrypt = 1;
}

int visc_swarm_flags_take(visc_swarm_flags *f, int argc, char **argv, int i) {
    const char *a = argv[i];
    if (strcmp(a, "--no-encrypt") == 0) {
        f->encrypt = 0;
        return 1;
    }
    const char **slot = NULL;
    if (strcmp(a, "--run-id") == 0) slot = &f->run_id;
    else if (strcmp(a, "--key") == 0) slot = &f->key;
    else if (strcmp(a, "--swarm-secret-file") == 0) slot = &f->secret_file;
    else if (strcmp(a, "--allow-file") == 0) slot = &f->allow_file;
    else if (strcmp(a, "--owner-key-pub") == 0) slot = &f->owner_hex;
    else if (strcmp(a, "--token") == 0) slot = &f->token_file;
    else if (strcmp(a, "--listen") == 0) slot = &f->listen;
    else if (strcmp(a, "--initial-peers") == 0) slot = &f->initial_peers;
    else if (strcmp(a, "--dht-port") != 0) return 0;
    if (i + 1 >= argc) return visc_set_error("option '%s' needs a value", a);
    const char *v = argv[i + 1];
    if (slot) {
        *slot = v;
        return 2;
    }
    char *end;
    long port = strtol(v, &end, 10);
    if (!*v || *end || port < 0 || port > 65535)
        return visc_set_error("%s: expected a port 0..65535, got '%s'", a, v);
    f->dht_port = (int)port;
    return 2;
}

int visc_read_hex_file(const char *path, uint8_t *out, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return visc_set_error("%s: %s", path, strerror(errno));
    char line[2 * VISC_TOKEN_BYTES + 8];
    size_t len = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[len] = '\0';
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
        line[--len] = '\0';
    if (len != 2 * n)
        return visc_set_error("%s: expected %zu hex digits, found %zu", path, 2 * n, len);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (!strchr("0123456789abcdefABCDEF", line[2 * i]) ||
            !strchr("0123456789abcdefABCDEF", line[2 * i + 1]) ||
            sscanf(line + 2 * i, "%2x", &v) != 1)
            return visc_set_error("%s: not a hex string at character %zu", path, 2 * i + 1);
        out[i] = (uint8_t)v;
    }
    return 0;
}

/* ~/.visc/swarm.key, its folder created (owner only) when missing. */
static const char *default_key_path(void) {
    static char path[1024];
    const char *home = getenv("HOME");
    snprintf(path, sizeof path, "%s/.visc", home && *home ? home : ".");
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        visc_set_error("cannot create %s for the swarm key: %s", path, strerror(errno));
        return NULL;
    }
    strncat(path, "/swarm.key", sizeof path - strlen(path) - 1);
    return path;
}

int visc_swarm_flags_auth(const visc_swarm_flags *f, visc_swarm_auth *auth) {
    memset(auth, 0, sizeof *auth);
    if (!f->run_id || !f->run_id[0]) return visc_set_error("swarm: needs --run-id");
    visc_identity id;
    const char *key = f->key ? f->key : default_key_path();
    if (!key || visc_identity_load_or_create(key, &id)) return -1;
    if (visc_swarm_auth_init(auth, f->run_id, &id)) return -1;
    auth->encrypt = f->encrypt;
    if (f->secret_file && visc_swarm_auth_set_secret_file(auth, f->secret_file)) goto fail;
    if (f->allow_file && visc_swarm_auth_allow_file(auth, f->allow_file)) goto fail;
    if (f->owner_hex) {
        if (visc_public_key_parse_hex(f->owner_hex, auth->owner_key)) {
            visc_set_error("--owner-key-pub: %s", visc_last_error());
            goto fail;
        }
        auth->has_owner = 1;
    }
    if (f->token_file) {
        if (visc_read_hex_file(f->token_file, auth->token, VISC_TOKEN_BYTES)) goto fail;
        auth->has_token = 1;
    }
    if (visc_swarm_auth_check_config(auth)) goto fail;
    return 0;
fail:
    visc_swarm_auth_free(auth);
    return -1;
}
#endif

/* swarm.c: `visc swarm`: the commands that set a swarm up.
 *
 *   keygen KEY [--public PUB]   a new Ed25519 key pair in KEY (mode 0600)
 *   pubkey KEY                  the public key and peer id of KEY
 *   token --owner-key OWNER --peer HEX|--peer-file PUB --run-id R
 *         [--valid-days D] -o TOKEN
 *                               an access token by which the run's owner
 *                               admits one peer until an expiry
 *   node --run-id R [credentials] [--listen H:P] [--dht-port P]
 *        [--initial-peers H:P,...] [--seconds S]
 *                               a standing peer with no data: a DHT node
 *                               that others bootstrap from
 * The credentials (--key, --swarm-secret-file, --allow-file, --owner-key,
 * --token, --no-encrypt) are the ones `visc train --swarm` takes. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "swarm.h"
#include "visc/core.h"

#ifndef VISC_WITH_SWARM
int visc_cmd_swarm(int argc, char **argv) {
    (void)argc, (void)argv;
    visc_die("swarm: this visc was built without the swarm (SWARM=0, or libsodium-dev / "
             "libopendht-c-dev were missing at build time)");
}
#else
#include "../swarm/node.h"
#include "swarm_flags.h"
#include "swarm_status.h"
#include "visc/swarm.h"

static void usage(FILE *f) {
    fputs("usage: visc swarm <command> [options]\n\n"
          "  keygen KEY [--public PUB]  create an Ed25519 key pair in KEY (mode 0600);\n"
          "                             PUB gets the public key (for allowlists)\n"
          "  pubkey KEY                 print KEY's public key and peer id\n"
          "  token --owner-key OWNER --peer HEX | --peer-file PUB --run-id RUN\n"
          "        [--valid-days D] -o TOKEN\n"
          "                             let one peer into RUN until D days from now\n"
          "                             (default 30), signed with the owner's key\n"
          "  node --run-id RUN [credentials] [--listen HOST:PORT] [--dht-port P]\n"
          "       [--initial-peers HOST:PORT,...] [--seconds S]\n"
          "                             a standing DHT node others join through\n"
          "  status --run-id RUN --initial-peers H:P [--target-batch-size N] [--watch S]\n"
          "                             the peers of a run: epoch, samples, throughput\n"
          "  monitor --run-id RUN --initial-peers H:P --logdir DIR [--interval S]\n"
          "                             the swarm's progress as TensorBoard scalars\n\n"
          "swarm options (credentials: at least a secret, or an allowlist / owner key):\n",
          f);
    fputs(visc_swarm_flags_help, f);
}

static int write_text_atomic(const char *path, const char *text) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return visc_set_error("%s: %s", tmp, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return visc_set_error("%s: could not write", path);
    }
    return 0;
}

static void hex(const uint8_t *b, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

static int cmd_keygen(int argc, char **argv) {
    const char *key = NULL, *pub = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--public") == 0 && i + 1 < argc) pub = argv[++i];
        else if (argv[i][0] != '-' && !key) key = argv[i];
        else visc_die("swarm keygen: unexpected argument '%s'", argv[i]);
    }
    if (!key) visc_die("swarm keygen: name the key file (visc swarm keygen KEY)");
    if (access(key, F_OK) == 0) visc_die("swarm keygen: %s exists; not overwriting a key", key);
    visc_identity id;
    if (visc_identity_load_or_create(key, &id)) visc_die("%s", visc_last_error());
    if (pub && visc_public_key_write(pub, id.public_key)) visc_die("%s", visc_last_error());
    char peer[VISC_PEER_ID_CHARS + 1], pk[2 * VISC_KEY_BYTES + 1];
    visc_peer_id(id.public_key, peer);
    hex(id.public_key, VISC_KEY_BYTES, pk);
    printf("key %s: peer %s, public key %s\n", key, peer, pk);
    return 0;
}

static int cmd_pubkey(int argc, char **argv) {
    if (argc != 1) visc_die("swarm pubkey: expected one key file");
    visc_identity id;
    if (visc_identity_load(argv[0], &id)) visc_die("%s", visc_last_error());
    char peer[VISC_PEER_ID_CHARS + 1], pk[2 * VISC_KEY_BYTES + 1];
    visc_peer_id(id.public_key, peer);
    hex(id.public_key, VISC_KEY_BYTES, pk);
    printf("%s peer %s\n", pk, peer);
    return 0;
}

static double parse_positive(const char *flag, const char *v) {
    char *end;
    double x = strtod(v, &end);
    if (!*v || *end || !(x > 0)) visc_die("swarm: %s: expected a number > 0, got '%s'", flag, v);
    return x;
}

static int cmd_token(int argc, char **argv) {
    const char *owner = NULL, *peer_hex = NULL, *peer_file = NULL, *run = NULL, *out = NULL;
    double days = 30;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) visc_die("swarm token: %s needs a value", a);
        if (strcmp(a, "--owner-key") == 0) owner = v;
        else if (strcmp(a, "--peer") == 0) peer_hex = v;
        else if (strcmp(a, "--peer-file") == 0) peer_file = v;
        else if (strcmp(a, "--run-id") == 0) run = v;
        else if (strcmp(a, "--valid-days") == 0) days = parse_positive(a, v);
        else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) out = v;
        else visc_die("swarm token: unknown option '%s'", a);
        i++;
    }
    if (!owner || !run || !out || !(peer_hex || peer_file))
        visc_die("swarm token: needs --owner-key, --peer or --peer-file, --run-id and -o");
    visc_identity id;
    if (visc_identity_load(owner, &id)) visc_die("%s", visc_last_error());
    uint8_t pk[VISC_KEY_BYTES];
    if (peer_hex ? visc_public_key_parse_hex(peer_hex, pk)
                 : visc_read_hex_file(peer_file, pk, sizeof pk))
        visc_die("swarm token: %s", visc_last_error());
    uint64_t expires = (uint64_t)time(NULL) + (uint64_t)(days * 86400);
    uint8_t token[VISC_TOKEN_BYTES];
    visc_token_sign(&id, pk, run, expires, token);
    char text[2 * VISC_TOKEN_BYTES + 2];
    hex(token, VISC_TOKEN_BYTES, text);
    strcat(text, "\n");
    if (write_text_atomic(out, text)) visc_die("%s", visc_last_error());
    printf("token for run '%s' written to %s, valid %.0f days\n", run, out, days);
    return 0;
}

static volatile sig_atomic_t stop_requested;
static void on_stop(int sig) { (void)sig, stop_requested = 1; }

static int cmd_node(int argc, char **argv) {
    visc_swarm_flags f;
    visc_swarm_flags_default(&f);
    double seconds = 0;
    for (int i = 0; i < argc;) {
        int used = visc_swarm_flags_take(&f, argc, argv, i);
        if (used < 0) visc_die("swarm node: %s", visc_last_error());
        if (used > 0) {
            i += used;
            continue;
        }
        if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = parse_positive(argv[i], argv[i + 1]);
        else visc_die("swarm node: unknown option '%s'", argv[i]);
        i += 2;
    }
    visc_swarm_auth auth;
    if (visc_swarm_flags_auth(&f, &auth)) visc_die("%s", visc_last_error());
    visc_swarm_node_config cfg = {.listen = f.listen,
                                  .dht_port = f.dht_port,
                                  .initial_peers = f.initial_peers,
                                  .auth = &auth};
    visc_swarm_node *node = visc_swarm_node_open(&cfg);
    if (!node) visc_die("%s", visc_last_error());
    char peer[VISC_PEER_ID_CHARS + 1];
    visc_peer_id(auth.self.public_key, peer);
    int port = visc_dht_port(visc_swarm_node_dht(node));
    printf("visc swarm: peer %s of run '%s' at %s, DHT port %d; others join with "
           "--initial-peers <this host>:%d\n",
           peer, f.run_id, visc_swarm_node_address(node), port, port);
    signal(SIGINT, on_stop);
    signal(SIGTERM, on_stop);
    double end = seconds > 0 ? visc_now() + seconds : 0;
    while (!stop_requested && (end == 0 || visc_now() < end)) usleep(100 * 1000);
    visc_swarm_node_close(node);
    visc_swarm_auth_free(&auth);
    return 0;
}

int visc_cmd_swarm(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0) {
        usage(argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    const char *cmd = argv[0];
    if (strcmp(cmd, "keygen") == 0) return cmd_keygen(argc - 1, argv + 1);
    if (strcmp(cmd, "pubkey") == 0) return cmd_pubkey(argc - 1, argv + 1);
    if (strcmp(cmd, "token") == 0) return cmd_token(argc - 1, argv + 1);
    if (strcmp(cmd, "node") == 0) return cmd_node(argc - 1, argv + 1);
    if (strcmp(cmd, "status") == 0) return visc_swarm_cmd_status(argc - 1, argv + 1);
    if (strcmp(cmd, "monitor") == 0) return visc_swarm_cmd_monitor(argc - 1, argv + 1);
    visc_die("swarm: unknown command '%s' (try `visc swarm --help`)", cmd);
}
#endif

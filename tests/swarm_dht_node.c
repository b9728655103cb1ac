/* swarm_dht_node.c: one DHT node for multi-process tests
 * (tests/e2e_swarm_dht.sh). It joins a secret-only swarm and answers
 * commands read from stdin, one per line, each starting with an id that
 * its one-line answer on stdout repeats:
 *   ID put KEY VALUE TTL_S          -> ID ok | ID error MESSAGE
 *   ID see KEY TIMEOUT_S V1 [V2...]  -> ID ok SECONDS | ID missing V...
 *        (gets KEY until records with all these values are seen)
 *   ID get KEY                       -> ID values V1 V2 ... (sorted)
 *   ID quit
 * Usage: swarm_dht_node --run ID --secret TEXT [--port P] [--peers H:P,...]
 *                       [--rebootstrap S]
 * It prints "ready PORT" once its node runs. Values are short strings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/swarm/dht.h"
#include "visc/core.h"

#define MAX_RECORDS 64
#define GET_TIMEOUT_S 2.0
#define PUT_TIMEOUT_S 30.0

static visc_record recs[MAX_RECORDS];

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Values of the records under key, sorted, as NUL-terminated strings. */
static int get_values(visc_dht *d, const char *key, const char **out) {
    int n = visc_dht_get(d, key, recs, MAX_RECORDS, GET_TIMEOUT_S);
    int m = 0;
    for (int i = 0; i < n; i++) {
        visc_record *r = &recs[i];
        if (r->value_len == 0 || r->value[r->value_len - 1] != '\0') continue;
        out[m++] = (const char *)r->value;
    }
    qsort(out, (size_t)m, sizeof *out, cmp_str);
    return m;
}

static int has_value(const char **vals, int n, const char *v) {
    for (int i = 0; i < n; i++)
        if (strcmp(vals[i], v) == 0) return 1;
    return 0;
}

static void cmd_see(visc_dht *d, const char *id, char *args) {
    char *key = strtok(args, " "), *timeout = strtok(NULL, " ");
    if (!key || !timeout) {
        printf("%s error usage: see KEY TIMEOUT V...\n", id);
        return;
    }
    char *want[MAX_RECORDS];
    int n_want = 0;
    for (char *v; n_want < MAX_RECORDS && (v = strtok(NULL, " "));) want[n_want++] = v;
    double t0 = visc_now(), until = t0 + atof(timeout);
    const char *vals[MAX_RECORDS] = {0};
    int n;
    for (;;) {
        n = get_values(d, key, vals);
        int all = 1;
        for (int i = 0; i < n_want; i++) all &= has_value(vals, n, want[i]);
        if (all) {
            printf("%s ok %.2f\n", id, visc_now() - t0);
            return;
        }
        if (visc_now() >= until) break;
    }
    printf("%s missing", id);
    for (int i = 0; i < n_want; i++)
        if (!has_value(vals, n, want[i])) printf(" %s", want[i]);
    printf("\n");
}

static int run_commands(visc_dht *d) {
    char line[1024];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = '\0';
        char *id = strtok(line, " "), *cmd = strtok(NULL, " ");
        if (!id || !cmd) continue;
        char *rest = strtok(NULL, "");
        if (strcmp(cmd, "quit") == 0) {
            printf("%s ok\n", id);
            return 0;
        } else if (strcmp(cmd, "put") == 0) {
            char *key = rest ? strtok(rest, " ") : NULL, *value = strtok(NULL, " ");
            char *ttl = strtok(NULL, " ");
            if (!key || !value || !ttl) printf("%s error usage: put KEY VALUE TTL\n", id);
            else if (visc_dht_put(d, key, value, strlen(value) + 1, atof(ttl), PUT_TIMEOUT_S) != 0)
                printf("%s error %s\n", id, visc_last_error());
            else printf("%s ok\n", id);
        } else if (strcmp(cmd, "get") == 0) {
            const char *vals[MAX_RECORDS] = {0};
            int n = rest ? get_values(d, rest, vals) : 0;
            printf("%s values", id);
            for (int i = 0; i < n; i++) printf(" %s", vals[i]);
            printf("\n");
        } else if (strcmp(cmd, "see") == 0 && rest) {
            cmd_see(d, id, rest);
        } else {
            printf("%s error unknown command %s\n", id, cmd);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *run = NULL, *secret = NULL, *peers = NULL;
    int port = 0;
    double rebootstrap = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--run") == 0) run = argv[i + 1];
        else if (strcmp(argv[i], "--secret") == 0) secret = argv[i + 1];
        else if (strcmp(argv[i], "--peers") == 0) peers = argv[i + 1];
        else if (strcmp(argv[i], "--port") == 0) port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rebootstrap") == 0) rebootstrap = atof(argv[i + 1]);
        else visc_die("unknown option %s", argv[i]);
    }
    if (!run || !secret) visc_die("usage: swarm_dht_node --run ID --secret TEXT [--port P] ...");
    setvbuf(stdout, NULL, _IOLBF, 0);
    visc_identity self;
    visc_swarm_auth auth;
    if (visc_identity_generate(&self) != 0 || visc_swarm_auth_init(&auth, run, &self) != 0 ||
        visc_swarm_auth_set_secret(&auth, secret, strlen(secret)) != 0)
        visc_die("%s", visc_last_error());
    visc_dht_config cfg = {.port = port,
                           .initial_peers = peers,
                           .auth = &auth,
                           .rebootstrap_s = rebootstrap};
    visc_dht *d = visc_dht_open(&cfg);
    if (!d) visc_die("%s", visc_last_error());
    printf("ready %d\n", visc_dht_port(d));
    int rc = run_commands(d);
    visc_dht_close(d);
    visc_swarm_auth_free(&auth);
    return rc;
}

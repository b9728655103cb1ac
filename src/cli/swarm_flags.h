/* swarm_flags.h: the flags every swarm command shares (credentials, where to
 * listen, whom to join), parsed once and turned into credentials. */
#ifndef VISC_CLI_SWARM_FLAGS_H
#define VISC_CLI_SWARM_FLAGS_H

#ifdef VISC_WITH_SWARM
#include "visc/swarm.h"

typedef struct {
    const char *run_id, *key, *secret_file, *allow_file, *owner_hex, *token_file;
    const char *listen, *initial_peers;
    int dht_port, encrypt;
} visc_swarm_flags;

void visc_swarm_flags_default(visc_swarm_flags *f);
/* Takes argv[i] (and its value) when it is a swarm flag: returns how many
 * arguments it used (1 or 2), 0 when argv[i] is not one of ours, -1 with
 * an error for a flag without its value or a bad value. */
int visc_swarm_flags_take(visc_swarm_flags *f, int argc, char **argv, int i);
/* The credentials the flags describe; the key file is created when missing.
 * -1 with an error (no run id, unreadable files, no credentials at all). */
int visc_swarm_flags_auth(const visc_swarm_flags *f, visc_swarm_auth *auth);
/* The flags' help text, for usage messages. */
extern const char visc_swarm_flags_help[];
/* Reads a hex file of exactly n bytes (tokens, public keys). */
int visc_read_hex_file(const char *path, uint8_t *out, size_t n);
#endif

#endif

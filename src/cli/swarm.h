/* swarm.h: `visc swarm <keygen|pubkey|token|node>`: keys, access tokens and
 * a standing DHT node for a swarm. */
#ifndef VISC_CLI_SWARM_H
#define VISC_CLI_SWARM_H

/* argv holds the arguments after "swarm"; 0 on success, 1 on an error (one
 * "visc: ..." line), 2 for usage errors. */
int visc_cmd_swarm(int argc, char **argv);

#endif

/* swarm_status.h: `visc swarm status` and `visc swarm monitor`: observers
 * of a swarm's progress records (src/swarm/progress.h) that publish none.
 *
 *   status --run-id R --initial-peers H:P [credentials]
 *          [--target-batch-size N] [--watch S [--seconds T]]
 *       a table of the peers (id, role, epoch, samples, samples/s, last
 *       measured, loss, state address) and the swarm's summary; --watch
 *       repeats it every S seconds (until SIGINT/SIGTERM or T seconds)
 *   monitor --run-id R --initial-peers H:P [credentials] --logdir DIR
 *           [--interval S] [--seconds T] [--target-batch-size N]
 *       TensorBoard scalars every S seconds (default 5) until T seconds or
 *       SIGINT/SIGTERM: swarm/samples_per_second, swarm/peers, swarm/epoch,
 *       swarm/loss (the mean of the peers' reported losses), swarm/distrusted;
 *       one line per refresh on stdout. */
#ifndef VISC_CLI_SWARM_STATUS_H
#define VISC_CLI_SWARM_STATUS_H

/* argv holds the arguments after "status" / "monitor"; returns the exit
 * status: 0, 1 on an error (one "visc: ..." line on stderr: cannot join,
 * bad credentials), 2 on a usage error. */
int visc_swarm_cmd_status(int argc, char **argv);
int visc_swarm_cmd_monitor(int argc, char **argv);

#endif

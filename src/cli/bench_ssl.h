/* bench_ssl.h: `visc bench-ssl`: pretraining, kNN, linear and finetune
 * evaluations, and their results table, in one command. */
#ifndef VISC_CLI_BENCH_SSL_H
#define VISC_CLI_BENCH_SSL_H

/* argv holds the arguments after "bench-ssl"; returns the exit status
 * (errors: one "visc: ..." line, status 1). */
int visc_cmd_bench_ssl(int argc, char **argv);

#endif

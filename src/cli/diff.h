/* diff.h: `visc diff A.safetensors B.safetensors [--rtol R] [--atol A]`. */
#ifndef VISC_CLI_DIFF_H
#define VISC_CLI_DIFF_H

/* argv holds the arguments after "diff"; returns 0 when every tensor
 * matches within the tolerance, 1 when one does not or on an error (one
 * "visc: ..." line), 2 for usage errors. */
int visc_cmd_diff(int argc, char **argv);

#endif

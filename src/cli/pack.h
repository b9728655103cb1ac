/* pack.h: `visc pack SRC DST [options]` (src/loader/pack.c does the work). */
#ifndef VISC_CLI_PACK_H
#define VISC_CLI_PACK_H

/* argv holds the arguments after "pack"; returns the exit status (errors
 * go to stderr as one "visc: ..." line with status 1, usage errors 2). */
int visc_cmd_pack(int argc, char **argv);

#endif

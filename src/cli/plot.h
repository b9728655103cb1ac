/* plot.h: `visc plot RUN_DIR [-o FILE.png] [--log | --linear]`. */
#ifndef VISC_CLI_PLOT_H
#define VISC_CLI_PLOT_H

/* argv holds the arguments after "plot"; returns the exit status (errors
 * go to stderr as one "visc: ..." line with status 1, usage errors 2). */
int visc_cmd_plot(int argc, char **argv);

#endif

/* devices.h: `visc devices`: the CPU and the CUDA devices this visc can use. */
#ifndef VISC_CLI_DEVICES_H
#define VISC_CLI_DEVICES_H

/* argv holds the arguments after "devices" (none); returns the exit status:
 * 0 (a machine without a GPU is not an error), 2 on a usage error. */
int visc_cmd_devices(int argc, char **argv);

#endif

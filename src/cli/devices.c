/* devices.c: `visc devices`: one line for the CPU, then one per CUDA device,
 * or one line saying why there is none (not built in, no driver, no GPU).
 * This is the only place where visc itself touches the CUDA runtime before
 * a GPU is asked for, so it is also the check that a visc linked with the
 * CUDA backend starts and reports cleanly on a machine without a GPU. */
#include <stdio.h>

#include "devices.h"
#include "visc/core.h"
#ifdef VISC_WITH_CUDA
#include "visc/cuda.h"
#endif

static void list_cuda(void) {
#ifdef VISC_WITH_CUDA
    const int n = visc_cuda_device_count();
    if (n < 0) {
        printf("cuda: none usable (%s)\n", visc_last_error());
        return;
    }
    for (int d = 0; d < n; d++) {
        char line[256];
        if (visc_cuda_describe(d, line, sizeof line) == 0) printf("cuda:%d %s\n", d, line);
        else printf("cuda:%d unreadable (%s)\n", d, visc_last_error());
    }
#else
    puts("cuda: not built into this visc (make CUDA=1 where nvcc and cuBLASLt are installed)");
#endif
}

int visc_cmd_devices(int argc, char **argv) {
    if (argc > 0) {
        fprintf(stderr, "visc: devices takes no arguments ('%s'); usage: visc devices\n", argv[0]);
        return 2;
    }
    printf("cpu: %d threads\n", visc_num_threads());
    list_cuda();
    return 0;
}

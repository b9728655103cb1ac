/* stop_signal.c: a run asked to stop by a signal stops at a step boundary.
 *
 * Ctrl-C, a scheduler's preemption notice (SLURM's SIGTERM, or the signal
 * of `sbatch --signal`) and mpirun's forwarded SIGUSR1 all mean "stop, and
 * keep what was done": the handler only records the signal; the training
 * loops read it after each step, save their checkpoint as --max-steps
 * does, and the program exits with 128 + the signal's number, so a
 * --resume continues bit for bit. The handler is one-shot: a second
 * signal gets the default action and ends the process at once. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "visc/core.h"

static volatile sig_atomic_t received;

static void on_stop_signal(int sig) {
    received = sig;
    /* write(2) is async-signal-safe where printf is not */
    static const char msg[] = "\nvisc: stopping after this step with a checkpoint "
                              "(signal again to stop at once)\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
}

void visc_stop_signals_install(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGUSR1};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND | SA_RESTART; /* the second one: the default action */
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
}

int visc_stop_signal(void) { return received; }

static int obeyed;

void visc_stop_signal_obeyed(int sig, long long step, const char *output, int rank) {
    obeyed = sig;
    if (rank == 0)
        printf("stopped by %s after step %lld; --resume %s/checkpoint_last.safetensors goes on\n",
               visc_signal_name(sig), step, output);
}

int visc_stop_signal_exit_status(void) { return obeyed ? 128 + obeyed : 0; }

const char *visc_signal_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
    }
}

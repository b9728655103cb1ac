/* fuzz_ssl_state.c: libFuzzer target for the resume state of a pretraining
 * checkpoint (the JSON in its "visc_train_state" metadata, with the ranks'
 * loader cursors as a comma list): a file a crash or a hand edit may have
 * mangled. `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_ssl_state fuzz/corpus/fuzz_ssl_state
 * A state that parses must be usable: counts not negative, the rank count
 * within what a checkpoint can hold. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/ssl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    visc_ssl_state s;
    if (visc_ssl_state_parse(text, &s) == 0) {
        VISC_ASSERT(s.train.epoch >= 0 && s.train.step >= 0 && s.train.step_in_epoch >= 0);
        VISC_ASSERT(s.train.world >= 0 && s.train.world <= VISC_MAX_SAVED_RANKS);
        VISC_ASSERT(strlen(s.method) < sizeof s.method);
        VISC_ASSERT(s.key_step >= -1 && s.key_step <= s.train.step);
    }
    free(text);
    return 0;
}

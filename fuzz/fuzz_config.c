/* fuzz_config.c: libFuzzer target for the INI config parser. On success
 * every key is retrievable and well-formed; on failure nothing leaks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "visc/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1); /* not NUL-terminated, on purpose */
    memcpy(text, data, size);
    visc_config c;
    if (visc_config_parse(&c, text, size, "fuzz.ini") == 0) {
        for (int i = 0; i < c.count; i++) {
            if (!c.keys[i][0] || visc_config_get(&c, c.keys[i]) != c.values[i]) abort();
            for (const char *k = c.keys[i]; *k; k++)
                if (strchr(" =#;[]\"'\n", *k)) abort();
        }
    } else if (c.count != 0 || c.keys != NULL) {
        abort();
    }
    visc_config_free(&c);
    free(text);
    return 0;
}

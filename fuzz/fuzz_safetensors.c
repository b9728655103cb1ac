/* fuzz_safetensors.c: libFuzzer target for the safetensors reader (and the
 * JSON tokenizer under it). A parse either fails cleanly or yields an index
 * whose every tensor can be found and converted without leaving the buffer. */
#include <stdint.h>
#include <stdlib.h>

#include "visc/io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy, so reads past the input are caught by ASan exactly. */
    uint8_t *buf = malloc(size ? size : 1);
    for (size_t i = 0; i < size; i++) buf[i] = data[i];
    visc_safetensors st;
    if (visc_safetensors_parse(&st, buf, size) == 0) {
        for (int i = 0; i < st.count; i++) {
            const visc_st_tensor *t = &st.tensors[i];
            if (visc_safetensors_find(&st, t->name) != t) abort();
            if (t->begin > t->end || t->end > st.data_size) abort();
            float *out = malloc(t->numel * sizeof(float) + 1);
            if (visc_safetensors_read_f32(&st, t->name, out, t->numel) != 0) abort();
            if (t->numel && visc_safetensors_read_f32(&st, t->name, out, t->numel - 1) == 0)
                abort();
            free(out);
        }
        for (int i = 0; i < st.meta_count; i++)
            if (!visc_safetensors_meta(&st, st.meta_keys[i])) abort();
    }
    visc_safetensors_close(&st);
    free(buf);
    return 0;
}

/* fuzz_swarm_collab_state.c: libFuzzer target for the state blob a
 * collaborative peer downloads from a donor (src/swarm/collab_state.c).
 * The first byte picks one of a few layouts (with and without EMA and
 * optimizer slots, an empty buffer table); the rest is the blob. What
 * parses must be canonical: encoding the parsed values again gives the same
 * bytes. `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_swarm_collab_state fuzz/corpus/fuzz_swarm_collab_state
 * The seeds (make_corpus() below, compiled with -DFUZZ_WRITE_CORPUS) are
 * valid blobs of these layouts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/swarm/collab.h"
#include "visc/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static visc_collab_layout layout_of(uint8_t pick) {
    visc_collab_layout l;
    memset(&l, 0, sizeof l);
    memset(l.schema, 0x5c, sizeof l.schema);
    switch (pick % 4) {
    case 0: l = (visc_collab_layout){.n_params = 3, .n_buffers = 2, .slots = 1, .ema = 1}; break;
    case 1: l = (visc_collab_layout){.n_params = 4, .n_buffers = 0, .slots = 2}; break;
    case 2:
        l = (visc_collab_layout){.mode = VISC_COLLAB_PARAMETERS,
                                 .n_params = 1,
                                 .n_buffers = 1,
                                 .slots = 0};
        break;
    default: l = (visc_collab_layout){.n_params = 0, .n_buffers = 0, .slots = 0}; break;
    }
    memset(l.schema, 0x5c, sizeof l.schema);
    return l;
}

static float *floats_of(const uint8_t *p, size_t n) {
    float *f = malloc(n ? n * sizeof *f : 1);
    VISC_ASSERT(f);
    if (n) memcpy(f, p, n * sizeof *f);
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    visc_collab_layout l = layout_of(data[0]);
    const uint8_t *blob = data + 1;
    size_t n = size - 1;
    visc_collab_state_view v;
    if (visc_collab_state_parse(blob, n, &l, &v) != 0) return 0;
    size_t P = (size_t)l.n_params, B = (size_t)l.n_buffers;
    VISC_ASSERT(n == visc_collab_state_size(&l));
    VISC_ASSERT(v.params == blob + VISC_COLLAB_STATE_HEADER);
    VISC_ASSERT((v.ema_params != NULL) == (l.ema != 0));
    float *p = floats_of(v.params, P), *b = floats_of(v.buffers, B),
          *o = floats_of(v.opt, l.slots * P);
    float *ep = l.ema ? floats_of(v.ema_params, P) : NULL;
    float *eb = l.ema ? floats_of(v.ema_buffers, B) : NULL;
    uint8_t *again = malloc(n);
    if (!again) abort();
    visc_collab_state_encode(&l, v.step, v.opt_step, p, b, o, ep, eb, again);
    VISC_ASSERT(memcmp(again, blob, n) == 0);
    free(again);
    free(p);
    free(b);
    free(o);
    free(ep);
    free(eb);
    return 0;
}

#ifdef FUZZ_WRITE_CORPUS
#include <stdio.h>

int main(int argc, char **argv);
int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    int bad = 0;
    for (uint8_t pick = 0; pick < 4; pick++) {
        visc_collab_layout l = layout_of(pick);
        size_t n = visc_collab_state_size(&l);
        uint8_t *blob = malloc(n);
        float vals[16];
        for (int i = 0; i < 16; i++) vals[i] = 0.25f * (float)i - 1.0f;
        visc_collab_state_encode(&l, 7, 3, vals, vals, vals, vals, vals, blob);
        char path[512];
        snprintf(path, sizeof path, "%s/layout%u", dir, pick);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(&pick, 1, 1, f) != 1 || fwrite(blob, 1, n, f) != n) bad = 1;
        if (f && fclose(f) != 0) bad = 1;
        free(blob);
    }
    return bad;
}
#endif

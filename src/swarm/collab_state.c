/* collab_state.c: the canonical state blob a collaborative peer serves to
 * newcomers (layout in collab.h). A received blob was already checked
 * against a corroborated hash, but is parsed as hostile anyway: a peer
 * that two colluders vouch for could still send anything. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "collab.h"
#include "visc/core.h"
#include "wire.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the state blob stores floats in host order: little-endian hosts only"
#endif

static const uint8_t magic[4] = {'V', 'C', 'S', 'T'};

/* Floats in the blob, or 0 on overflow. */
static uint64_t float_count(const visc_collab_layout *l) {
    uint64_t p = l->n_params, b = l->n_buffers, s = l->slots;
    uint64_t cap = (SIZE_MAX - VISC_COLLAB_STATE_HEADER) / sizeof(float);
    if (p > cap || b > cap || s > 64) return 0;
    uint64_t n = p + b + s * p + (l->ema ? p + b : 0);
    return n <= cap ? n : 0;
}

size_t visc_collab_state_size(const visc_collab_layout *l) {
    uint64_t n = float_count(l);
    if (n == 0 && (l->n_params || l->n_buffers)) return 0;
    return VISC_COLLAB_STATE_HEADER + (size_t)n * sizeof(float);
}

static uint8_t *put_floats(uint8_t *p, const float *x, uint64_t n) {
    if (n) memcpy(p, x, (size_t)n * sizeof(float));
    return p + n * sizeof(float);
}

void visc_collab_state_encode(const visc_collab_layout *l, uint64_t step, uint64_t opt_step,
                              const float *params, const float *buffers, const float *opt,
                              const float *ema_params, const float *ema_buffers, uint8_t *out) {
    memcpy(out, magic, 4);
    out[4] = VISC_COLLAB_STATE_VERSION;
    out[5] = (uint8_t)l->mode;
    out[6] = l->ema ? 1 : 0;
    out[7] = 0;
    memcpy(out + 8, l->schema, 32);
    visc_put_u64(out + 40, step);
    visc_put_u64(out + 48, opt_step);
    visc_put_u64(out + 56, l->n_params);
    visc_put_u64(out + 64, l->n_buffers);
    visc_put_u32(out + 72, l->slots);
    uint8_t *p = out + VISC_COLLAB_STATE_HEADER;
    p = put_floats(p, params, l->n_params);
    p = put_floats(p, buffers, l->n_buffers);
    p = put_floats(p, opt, (uint64_t)l->slots * l->n_params);
    if (l->ema) {
        p = put_floats(p, ema_params, l->n_params);
        put_floats(p, ema_buffers, l->n_buffers);
    }
}

int visc_collab_state_parse(const uint8_t *blob, size_t n, const visc_collab_layout *l,
                            visc_collab_state_view *out) {
    size_t want = visc_collab_state_size(l);
    if (want == 0) return visc_set_error("swarm state: this model's state is too large");
    if (n != want)
        return visc_set_error("swarm state: %zu bytes, this model's state has %zu", n, want);
    if (memcmp(blob, magic, 4) != 0 || blob[4] != VISC_COLLAB_STATE_VERSION)
        return visc_set_error("swarm state: not a version %d state blob",
                              VISC_COLLAB_STATE_VERSION);
    if (blob[5] != (uint8_t)l->mode || blob[6] != (l->ema ? 1 : 0) || blob[7] != 0)
        return visc_set_error("swarm state: mode or flags differ from this peer's (%u, %u)",
                              blob[5], blob[6]);
    if (memcmp(blob + 8, l->schema, 32) != 0)
        return visc_set_error("swarm state: of another model or optimizer (schema hash differs)");
    if (visc_get_u64(blob + 56) != l->n_params || visc_get_u64(blob + 64) != l->n_buffers ||
        visc_get_u32(blob + 72) != l->slots)
        return visc_set_error("swarm state: tensor sizes differ from this model's");
    uint64_t step = visc_get_u64(blob + 40), opt_step = visc_get_u64(blob + 48);
    if (step > VISC_PROGRESS_MAX_COUNT || opt_step > VISC_PROGRESS_MAX_COUNT)
        return visc_set_error("swarm state: step %llu / optimizer step %llu out of range",
                              (unsigned long long)step, (unsigned long long)opt_step);
    const uint8_t *f = blob + VISC_COLLAB_STATE_HEADER;
    size_t count = (n - VISC_COLLAB_STATE_HEADER) / sizeof(float);
    for (size_t i = 0; i < count; i++) {
        float v;
        memcpy(&v, f + i * sizeof v, sizeof v);
        if (!isfinite(v))
            return visc_set_error("swarm state: value %zu is not finite (%g)", i, (double)v);
    }
    out->step = step;
    out->opt_step = opt_step;
    out->params = f;
    out->buffers = out->params + l->n_params * sizeof(float);
    out->opt = out->buffers + l->n_buffers * sizeof(float);
    const uint8_t *ema = out->opt + (uint64_t)l->slots * l->n_params * sizeof(float);
    out->ema_params = l->ema ? ema : NULL;
    out->ema_buffers = l->ema ? ema + l->n_params * sizeof(float) : NULL;
    return 0;
}

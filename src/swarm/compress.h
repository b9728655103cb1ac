/* compress.h: encodings of float parts for averaging traffic.
 *
 * none  4 bytes per value, bit-exact
 * fp16  2 bytes, round to nearest even, clamped to +-65504
 * bf16  2 bytes, round to nearest even (finite values that would round
 *       to infinity saturate at the largest bf16)
 * q8    per block of VISC_Q8_BLOCK values (the last may be shorter): a
 *       float scale (absmax / 127), then one int8 per value (nearest, ties
 *       away from zero); |error| <= scale / 2 (plus float rounding); a
 *       block with absmax < 1e-30 is all zeros with scale 0; optional
 *       error feedback (the rounding error of this call is added to the
 *       input of the next)
 * All little-endian. A non-finite input value stays non-finite (a q8
 * block holding one gets a NaN scale), so the receiver rejects it.
 * Decoding checks the exact byte size for n values, that every q8 scale
 * is finite and >= 0, and that every decoded value is finite, before
 * writing anything: a rejected part leaves x untouched. */
#ifndef VISC_SWARM_COMPRESS_H
#define VISC_SWARM_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "visc/swarm.h"

#define VISC_Q8_BLOCK 4096
/* Tensors (parts) with fewer values than this go uncompressed. */
#define VISC_COMPRESS_MIN_VALUES 1024

/* Bytes of n values in c: 0 for an unknown c, SIZE_MAX for an n too large
 * for any buffer (so it matches no received size). */
size_t visc_compressed_size(visc_compression c, size_t n);
/* The encoding actually used for n values when c is asked for. */
visc_compression visc_compression_for(visc_compression c, size_t n);
/* Encodes n values into out (visc_compressed_size bytes). error, if not
 * NULL and c is q8, holds n floats of error feedback (read and updated;
 * the other encodings leave it alone). */
size_t visc_compress(visc_compression c, const float *x, size_t n, uint8_t *out, float *error);
/* 0, or -1 with an error (size mismatch, non-finite value or scale). */
int visc_decompress(visc_compression c, const uint8_t *in, size_t bytes, float *x, size_t n);

#endif

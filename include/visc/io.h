/* io.h: files in the ecosystem's formats.
 *
 * safetensors.c  read (mmap, validated) and write (atomic) safetensors files
 * json.c         the strict JSON reader under it (visc/json.h)
 * checksum.c     CRC-32 of buffers of any size (pack and scan-cache indexes)
 * atomic.c       write-temp + fsync + rename + fsync(dir): no half-written file
 * tensorboard.c  TensorBoard event files (events.out.tfevents.*) with scalars
 * config.c       INI-style config files ("key = value", [section] prefixes)
 *
 * Every parser returns -1 with visc_last_error() set on bad input and never
 * exits or crashes; each has a fuzz target in fuzz/. */
#ifndef VISC_IO_H
#define VISC_IO_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

/* ---- checksum.c ---- */
/* zlib's CRC-32 of a buffer of any size (zlib takes uInt lengths, so a large
 * buffer goes in pieces). */
uint32_t visc_crc32(const uint8_t *buf, size_t size);

/* ---- atomic.c ---- */
/* Writes the concatenation of parts to path atomically. */
int visc_write_file_atomic(const char *path, const void *const *parts, const size_t *sizes,
                           int nparts);
/* mkdir -p; returns -1 with an error message on failure. */
int visc_mkdirs(const char *path);

/* ---- safetensors.c ---- */
typedef enum {
    VISC_DTYPE_F32,
    VISC_DTYPE_F16,
    VISC_DTYPE_BF16,
    VISC_DTYPE_F64,
    VISC_DTYPE_I64,
    VISC_DTYPE_I32,
    VISC_DTYPE_U8,
    VISC_DTYPE_BOOL,
} visc_dtype;
size_t visc_dtype_size(visc_dtype t);
const char *visc_dtype_name(visc_dtype t); /* "F32", "I64", ... as in the format */

#define VISC_ST_MAX_DIMS 8
typedef struct {
    char name[VISC_MAX_NAME];
    visc_dtype dtype;
    int ndim;
    int64_t shape[VISC_ST_MAX_DIMS];
    size_t numel;
    size_t begin, end; /* byte offsets into the data section */
} visc_st_tensor;

typedef struct {
    visc_st_tensor *tensors;
    int count;
    char **meta_keys, **meta_values; /* the "__metadata__" string map */
    int meta_count;
    const uint8_t *data; /* start of the data section */
    size_t data_size;
    void *mapping; /* the mmap of the file, or NULL when parsed from memory */
    size_t mapping_size;
    char *source; /* the path, or "<memory>", for error messages */
} visc_safetensors;

/* Validates everything: header length, JSON syntax, dtypes, shapes, offsets
 * inside the data section and non-overlapping, numel * dtype size = bytes,
 * unique names shorter than VISC_MAX_NAME. st->tensors is sorted by name.
 * On failure st is left empty (closing it is harmless). */
int visc_safetensors_open(visc_safetensors *st, const char *path);
/* Parses a file image held in memory (buf must outlive st). */
int visc_safetensors_parse(visc_safetensors *st, const uint8_t *buf, size_t size);
const visc_st_tensor *visc_safetensors_find(const visc_safetensors *st, const char *name);
const char *visc_safetensors_meta(const visc_safetensors *st, const char *key);
/* Copies tensor `name` into dst as float32, converting from F32/F16/BF16/F64/
 * I64/I32/U8/BOOL; fails unless it has exactly `numel` elements. */
int visc_safetensors_read_f32(const visc_safetensors *st, const char *name, float *dst,
                              size_t numel);
/* The same, but the tensor must have exactly this shape (for loading a model
 * whose layout is known: "[64, 3, 7, 7]" vs "[64, 3, 3, 3]" in the error). */
int visc_safetensors_read_f32_shaped(const visc_safetensors *st, const char *name, float *dst,
                                     int ndim, const int64_t *shape);
void visc_safetensors_close(visc_safetensors *st);

typedef struct visc_st_writer visc_st_writer;
visc_st_writer *visc_st_writer_new(void);
/* Records a tensor; `data` is copied at add time. Names must be unique and
 * shorter than VISC_MAX_NAME (programming errors: asserted). */
void visc_st_writer_add(visc_st_writer *w, const char *name, visc_dtype dtype, int ndim,
                        const int64_t *shape, const void *data);
/* Adds every entry of t as F32, named prefix + entry name (prefix may be NULL). */
void visc_st_writer_add_table(visc_st_writer *w, const visc_table *t, const char *prefix);
void visc_st_writer_meta(visc_st_writer *w, const char *key, const char *value);
/* Tensors sorted by name, as the Python library writes them; atomic. */
int visc_st_writer_save(visc_st_writer *w, const char *path);
void visc_st_writer_free(visc_st_writer *w);

/* ---- tensorboard.c ---- */
typedef struct visc_tb_writer visc_tb_writer;
/* Creates logdir (mkdir -p) and <logdir>/events.out.tfevents.<seconds>.<host>.<pid>.v2
 * (a ".<n>" before ".v2" if that name is taken); NULL with the error set on failure. */
visc_tb_writer *visc_tb_open(const char *logdir);
const char *visc_tb_path(const visc_tb_writer *w);
int visc_tb_scalar(visc_tb_writer *w, const char *tag, int64_t step, float value);
void visc_tb_flush(visc_tb_writer *w);
void visc_tb_close(visc_tb_writer *w);
/* Reads back the scalars of an event file (for tests and `visc plot`):
 * calls fn for each (tag, step, value); checks every record's CRCs. */
typedef void (*visc_tb_scalar_fn)(void *ctx, const char *tag, int64_t step, float value);
int visc_tb_read(const char *path, visc_tb_scalar_fn fn, void *ctx);
/* The same over a file image in memory (used by the fuzz target). */
int visc_tb_parse(const uint8_t *buf, size_t size, visc_tb_scalar_fn fn, void *ctx);
/* The Castagnoli CRC, chained like zlib's crc32: start with crc = 0. */
uint32_t visc_crc32c(uint32_t crc, const void *data, size_t n);

/* ---- config.c ---- */
typedef struct {
    char **keys, **values;
    int count;
} visc_config;
/* "key = value" lines; "# ..." and "; ..." comments (also after a value,
 * when preceded by whitespace); "[section]" makes keys "section.key"; later
 * keys override earlier ones. Keys are [A-Za-z0-9_.-]+; values may be
 * quoted with "..." (escapes \" \\ \n \t) or '...' (literal). Parse starts
 * c afresh; on error c is left empty and the message names source:line. */
int visc_config_parse(visc_config *c, const char *text, size_t size, const char *source_name);
int visc_config_load(visc_config *c, const char *path);
const char *visc_config_get(const visc_config *c, const char *key);
void visc_config_set(visc_config *c, const char *key, const char *value);
void visc_config_free(visc_config *c);

/* ---- png.c ---- */
/* 8-bit RGB images (rows top to bottom, 3 bytes a pixel, no row padding) as
 * PNG: IHDR, one zlib-compressed IDAT, IEND. For plots, not photographs:
 * every scanline uses filter type 0 (flat colours compress well anyway). */
/* Encodes into a visc_malloc'd buffer (*out, *out_size); -1 with the error
 * set when the size is out of range (1..16384 a side) or zlib fails. */
int visc_png_encode(const uint8_t *rgb, int width, int height, uint8_t **out, size_t *out_size);
/* Encodes and writes atomically (visc_write_file_atomic). */
int visc_png_write(const char *path, const uint8_t *rgb, int width, int height);

#endif

/* io.h: files in the ecosystem's formats.
 *
 * safetensors.c  read (mmap, validated) and write (atomic) safetensors files
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
} visc_safetensors;

/* Validates everything: header length, JSON syntax, dtypes, shapes, offsets
 * inside the data section and non-overlapping, numel * dtype size = bytes. */
int visc_safetensors_open(visc_safetensors *st, const char *path);
/* Parses a file image held in memory (buf must outlive st). */
int visc_safetensors_parse(visc_safetensors *st, const uint8_t *buf, size_t size);
const visc_st_tensor *visc_safetensors_find(const visc_safetensors *st, const char *name);
const char *visc_safetensors_meta(const visc_safetensors *st, const char *key);
/* Copies tensor `name` into dst as float32, converting from F32/F16/BF16/F64/
 * I64/I32; fails unless it has exactly `numel` elements. */
int visc_safetensors_read_f32(const visc_safetensors *st, const char *name, float *dst,
                              size_t numel);
void visc_safetensors_close(visc_safetensors *st);

typedef struct visc_st_writer visc_st_writer;
visc_st_writer *visc_st_writer_new(void);
/* Records a tensor; `data` is copied at add time. */
void visc_st_writer_add(visc_st_writer *w, const char *name, visc_dtype dtype, int ndim,
                        const int64_t *shape, const void *data);
void visc_st_writer_add_table(visc_st_writer *w, const visc_table *t, const char *prefix);
void visc_st_writer_meta(visc_st_writer *w, const char *key, const char *value);
/* Tensors sorted by name, as the Python library writes them; atomic. */
int visc_st_writer_save(visc_st_writer *w, const char *path);
void visc_st_writer_free(visc_st_writer *w);

/* ---- tensorboard.c ---- */
typedef struct visc_tb_writer visc_tb_writer;
/* Creates <logdir>/events.out.tfevents.<seconds>.<host>.<pid>.v2 */
visc_tb_writer *visc_tb_open(const char *logdir);
int visc_tb_scalar(visc_tb_writer *w, const char *tag, int64_t step, float value);
void visc_tb_flush(visc_tb_writer *w);
void visc_tb_close(visc_tb_writer *w);
/* Reads back the scalars of an event file (for tests and `visc plot`):
 * calls fn for each (tag, step, value); checks every record's CRCs. */
int visc_tb_read(const char *path,
                 void (*fn)(void *ctx, const char *tag, int64_t step, float value), void *ctx);
uint32_t visc_crc32c(uint32_t crc, const void *data, size_t n);

/* ---- config.c ---- */
typedef struct {
    char **keys, **values;
    int count;
} visc_config;
/* "key = value" lines; "# ..." and "; ..." comments; "[section]" makes keys
 * "section.key"; later keys override earlier ones. */
int visc_config_parse(visc_config *c, const char *text, size_t size, const char *source_name);
int visc_config_load(visc_config *c, const char *path);
const char *visc_config_get(const visc_config *c, const char *key);
void visc_config_set(visc_config *c, const char *key, const char *value);
void visc_config_free(visc_config *c);

#endif

/* loader.h: image datasets on disk and the threaded batch loader.
 *
 * image_folder.c  scanning: ImageFolder (root/<class>/<file>), the ImageNet
 *                 layout (root/train, root/val) and flat <wnid>_<name>.JPEG
 *                 folders; per-class subsets
 * file_index.c    a cached scan (1.28M files are not re-listed at every start)
 * pack.c          packed shards: a few large files of pre-resized JPEGs or
 *                 raw pixels plus a validated, checksummed index
 * image_dataset.c a visc_dataset (data.h) over a file list or a pack that
 *                 runs a per-sample pipeline on the encoded bytes
 * loader.c        worker threads, a bounded prefetch ring, ordered batches
 *
 * Bad samples: an image dataset's get() returns VISC_SAMPLE_BAD (-2) with
 * visc_last_error() = "<file>: <reason>" when one file cannot be used
 * (empty, truncated, not an image). -1 stays "stop everything". The loader
 * skips and records bad samples (VISC_ON_BAD_SKIP) or stops with the error
 * (VISC_ON_BAD_ERROR). */
#ifndef VISC_LOADER_H
#define VISC_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "data.h"
#include "transforms.h"

#define VISC_SAMPLE_BAD (-2)

/* ---- image_folder.c ---- */

typedef enum { VISC_LAYOUT_IMAGEFOLDER = 1, VISC_LAYOUT_FLAT = 2 } visc_layout;

/* The files of a data set: names relative to root, labels, class names.
 * Names live in one blob (a 1.28M-file list is two allocations, not 1.28M). */
typedef struct {
    char *root; /* the scanned folder, no trailing '/' */
    int64_t count;
    int64_t *name_off; /* [count]: offset of file i's name in names */
    char *names;       /* NUL-terminated names, e.g. "n01440764/x.JPEG" */
    size_t names_size;
    int32_t *labels; /* [count] */
    int num_classes;
    char **class_names; /* [num_classes], sorted by bytes */
} visc_file_list;

/* Lists root as an ImageFolder, as torchvision.datasets.ImageFolder does:
 * classes are the subfolders sorted by name (bytes), files are those ending
 * in .jpg .jpeg .png (any case) anywhere below a class folder, ordered as
 * sorted(os.walk(...)) then sorted(files). Differences, on purpose: names
 * starting with '.' (files and folders) are skipped. A class folder without
 * any image is an error naming it (torchvision: FileNotFoundError). */
int visc_scan_imagefolder(visc_file_list *fl, const char *root);
/* A flat folder of <class>_<anything>.<ext> files (ImageNet samples:
 * n01440764_tench.JPEG); classes are the sorted distinct prefixes before the
 * first '_'; an image without '_' is an error. */
int visc_scan_flat(visc_file_list *fl, const char *root);
/* Opens a data set spec, through the index cache (file_index.c):
 *   "imagefolder:/p"  /p is an ImageFolder
 *   "imagenet:/p"     /p/train (train = 1) or /p/val (train = 0)
 *   "flat:/p"         /p is a flat <wnid>_<name> folder
 * A spec without a known prefix is an error. */
int visc_file_list_open(visc_file_list *fl, const char *spec, int train);
/* Keeps n files per class (classes with fewer keep all): the first n in
 * scan order (seeded = 0), or n drawn without replacement from the Philox
 * stream (seed, VISC_STREAM_SHUFFLE, 2^62 + class), kept in scan order. */
void visc_file_list_subset(visc_file_list *fl, int64_t n, int seeded, uint64_t seed);
static inline const char *visc_file_list_name(const visc_file_list *fl, int64_t i) {
    return fl->names + fl->name_off[i];
}
/* root + "/" + name into buf; -1 with an error if it does not fit. */
int visc_file_list_path(const visc_file_list *fl, int64_t i, char *buf, size_t size);
void visc_file_list_free(visc_file_list *fl);

/* ---- file_index.c ---- */
/* The scan of root (layout), from the cache when it is still valid: an
 * index file in the cache folder ($VISC_CACHE_DIR, else
 * $XDG_CACHE_HOME/visc, else $HOME/.cache/visc; never inside the data,
 * which may be read-only, and whose folder mtime the index would change)
 * keyed by the real path and layout. Valid means: magic, version, checksum
 * and every bound check pass, the same root, and the mtime of root and of
 * every class folder unchanged (adding, removing or renaming a file changes
 * its folder's mtime). Anything else rescans and rewrites it atomically; a
 * cache that cannot be written is not an error. *reused (may be NULL) = 1
 * when the cache was used. */
int visc_file_index_load(visc_file_list *fl, const char *root, visc_layout layout, int *reused);
/* Serialization, exposed for tests and fuzzing. */
int visc_file_index_encode(const visc_file_list *fl, visc_layout layout, uint8_t **out,
                           size_t *size);
int visc_file_index_decode(visc_file_list *fl, const uint8_t *buf, size_t size,
                           visc_layout *layout);

/* ---- pack.c ---- */

typedef struct {
    int max_side;        /* > 0: shrink so the longer side is at most this (aspect kept) */
    int shorter_side;    /* > 0: shrink so the shorter side is this (never enlarged) */
    int quality;         /* JPEG quality of re-encoded images (default 90) */
    int raw;             /* store decoded RGB bytes instead of JPEG */
    int64_t shard_bytes; /* a new shard starts past this size (default 1 GiB) */
    int threads;         /* 0: all cores */
    int verbose;         /* progress lines on stderr */
} visc_pack_options;

void visc_pack_options_default(visc_pack_options *o);
/* Packs fl into the folder dst (created): dst/shard-NNNNN.bin and
 * dst/index.bin (written last and atomically: the pack exists once the
 * index does). Images are stored as they are unless a resize or raw is
 * asked for. A source file that cannot be read or decoded is an error. */
int visc_pack_write(const visc_file_list *fl, const char *dst, const visc_pack_options *o);

typedef struct {
    int32_t shard, label;
    uint64_t offset, size;
    uint32_t width, height; /* pixels as stored */
    uint32_t crc;           /* crc32 (zlib) of the stored bytes */
    uint32_t name_len;
    uint64_t name_off; /* into names */
} visc_pack_record;

typedef struct {
    int raw;
    int64_t count;
    int num_classes, num_shards;
    visc_pack_record *records; /* [count] */
    char **class_names;        /* [num_classes] */
    char *names;               /* source file names */
    uint64_t *shard_sizes;     /* [num_shards] as the index records them */
    const uint8_t **shards;    /* [num_shards] mmaps (NULL when parsed from memory) */
    char *dir;
} visc_pack;

/* Maps dst/index.bin and the shards; validates the index (magic, version,
 * checksum, counts, every record inside its shard, labels, names) and each
 * shard's size. The data of a record is checked (crc) when it is read. */
int visc_pack_open(visc_pack *p, const char *dir);
/* The index alone, from memory (fuzzing): every check but the shard files. */
int visc_pack_parse_index(visc_pack *p, const uint8_t *buf, size_t size);
/* The stored bytes of record i; -1 when its checksum does not match. */
int visc_pack_bytes(const visc_pack *p, int64_t i, const uint8_t **data, size_t *size);
void visc_pack_close(visc_pack *p);

/* ---- image_dataset.c ---- */

/* The per-sample pipeline: encoded image bytes (or, for a raw pack, RGB
 * bytes of width x height) -> views x C x H x W floats. Its randomness must
 * be a pure function of (seed, epoch, idx). Returns 0, VISC_SAMPLE_BAD for
 * an unusable image, or -1. */
typedef int (*visc_sample_fn)(void *ctx, const uint8_t *bytes, size_t size, int raw_width,
                              int raw_height, int train, uint64_t seed, int64_t epoch, int64_t idx,
                              float *out);
/* The same up to ToTensor: views x C x H x W bytes, for a device that
 * normalizes the batch itself. */
typedef int (*visc_sample_bytes_fn)(void *ctx, const uint8_t *bytes, size_t size, int raw_width,
                                    int raw_height, int train, uint64_t seed, int64_t epoch,
                                    int64_t idx, uint8_t *out);

typedef struct {
    visc_sample_fn fn;
    visc_sample_bytes_fn fn_bytes; /* NULL: no byte form (the recipe erases) */
    void *ctx;
    int channels, height, width, views; /* what fn writes */
    float mean[3], std[3]; /* fn's Normalize: fn_bytes' output normalized with these is fn's */
} visc_sample_pipeline;

/* The transforms.h recipe cfg (validated here; it must outlive the
 * dataset) as a pipeline: bytes -> visc_transform_sample, raw pack samples
 * -> visc_transform_image (fn_bytes: their _bytes forms, where the recipe
 * has them). Any failure of a sample counts as a bad image. */
int visc_transform_pipeline(const visc_transform_config *cfg, visc_sample_pipeline *pl);

/* A dataset over the files of fl (taken over: freed with the dataset) or
 * over an opened pack (taken over). get() maps the file / the shard bytes
 * and calls the pipeline; its augment argument is ignored (the pipeline
 * owns augmentation). Names for errors: visc_image_dataset_name. */
visc_dataset *visc_image_dataset_from_files(visc_file_list *fl, const visc_sample_pipeline *pl);
visc_dataset *visc_image_dataset_from_pack(visc_pack *p, const visc_sample_pipeline *pl);
/* "imagefolder:", "imagenet:", "flat:" specs or "pack:/dir" (a folder
 * holding index.bin also works without the prefix). */
visc_dataset *visc_image_dataset_open(const char *spec, int train, const visc_sample_pipeline *pl);
/* The file name of sample idx (relative to the root), for messages. */
const char *visc_image_dataset_name(const visc_dataset *ds, int64_t idx);

/* ---- loader.c ---- */

typedef enum { VISC_ON_BAD_SKIP = 0, VISC_ON_BAD_ERROR = 1 } visc_on_bad;

typedef struct {
    int batch_size;
    int workers;  /* threads; 0: online cores */
    int prefetch; /* batches decoded ahead (the ring holds prefetch x batch_size samples); 0: 2 */
    int shuffle, drop_last, train;
    int rank, world; /* this process's share; world 0 or 1: everything */
    uint64_t seed;
    visc_augment aug; /* passed to get() (in-memory datasets use it) */
    visc_on_bad on_bad;
    /* 1: batches of the samples' bytes before ToTensor + Normalize
     * (get_bytes; x8 instead of x), for a GPU that normalizes them itself:
     * a quarter of the floats' bytes on the bus */
    int bytes;
} visc_loader_config;

/* One delivered batch, valid until the next visc_loader_next / _start.
 * x holds views blocks of batch_size samples: view v of sample b is at
 * x + (v * batch_size + b) * C*H*W (so for one view, x is [count][C][H][W];
 * a short batch leaves the tail of each block unused). */
typedef struct {
    float *x;
    uint8_t *x8;      /* instead of x for a loader of bytes (visc_loader_config.bytes) */
    int32_t *y;       /* [count] */
    int64_t *indices; /* [count] dataset indices */
    int count;        /* samples in this batch (<= batch_size) */
    int views;
    int64_t epoch, index; /* batch index within the epoch for this rank */
    int64_t next_pos;     /* the rank cursor after this batch (for resume) */
} visc_batch;

typedef struct visc_loader visc_loader;

/* Sharding: every rank draws the same permutation visc_epoch_order(seed,
 * epoch); rank r of world n takes the positions r, r + n, r + 2n, ... of it
 * (rank-strided), its "slice". Without drop_last all N samples are spread
 * (ranks differ by at most one sample). With drop_last every rank takes
 * floor(N / n) samples and delivers floor(floor(N / n) / B) full batches:
 * equal batch counts on every rank.
 *
 * Batches and bad samples: a rank keeps a cursor into its slice. A batch
 * takes samples from the cursor on, skipping bad ones, until it has B good
 * ones or the slice ends, and reports the cursor after it (next_pos). With
 * no bad sample, batch k starts at cursor k * B. With bad samples the batch
 * still holds B samples (refilled from the next positions), and a resumed
 * run passes the saved next_pos to be exact. The epoch ends after
 * visc_loader_batches() batches or when the slice is used up (then the last
 * batch may be short; with drop_last, bad samples are the only reason). */
visc_loader *visc_loader_new(const visc_dataset *ds, const visc_loader_config *c);
/* Batches per epoch for this rank (without bad samples). */
int64_t visc_loader_batches(const visc_loader *l);
/* Starts (or restarts) an epoch at batch start_batch whose first sample is
 * at cursor start_pos in the slice (start_pos < 0: start_batch * B). Work
 * of a previous epoch still in flight is discarded. -1 on bad arguments. */
int visc_loader_start(visc_loader *l, int64_t epoch, int64_t start_batch, int64_t start_pos);
/* The next batch of the epoch in order: 1 and *b filled, 0 at the end of
 * the epoch, -1 with the error set (a failing get(), a bad sample under
 * VISC_ON_BAD_ERROR: the message names the file). After -1 the epoch is
 * over; visc_loader_start begins another. */
int visc_loader_next(visc_loader *l, visc_batch *b);
/* Bad samples skipped in the current epoch, and "<name>: <reason>" of each
 * (i < count), in order. */
int64_t visc_loader_bad_count(const visc_loader *l);
const char *visc_loader_bad_message(const visc_loader *l, int64_t i);
int64_t visc_loader_bad_index(const visc_loader *l, int64_t i);
/* The memory every batch's x is delivered in (the prefetch ring, and the
 * gather buffer, made now if it was not), one call fn(ctx, p, bytes) per
 * region: for a caller that page-locks it so that batches go to a GPU at
 * the bus's speed. The regions live until visc_loader_free. Returns the
 * first non-zero fn result (the rest are not called), else 0. */
int visc_loader_each_buffer(visc_loader *l, int (*fn)(void *ctx, void *p, size_t bytes), void *ctx);
/* Stops and joins the workers (safe at any point, also mid-epoch). */
void visc_loader_free(visc_loader *l);

#endif

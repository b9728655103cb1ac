/* data.h: datasets and batches.
 *
 * idx.c        IDX files (MNIST, Fashion-MNIST), gzip or plain
 * cifar_bin.c  the CIFAR-10 binary format (data_batch_*.bin, test_batch.bin)
 * gzip.c       whole-file reads with transparent gunzip (zlib), size-capped
 * augment.c    random crop with padding, horizontal flip, normalization
 * batch.c      epoch order and batch assembly
 * dataset_memory.c  the in-memory uint8 dataset behind IDX and CIFAR
 *
 * A dataset is an interface (get one sample, augmented, as CHW floats), so
 * the JPEG/ImageFolder pipeline plugs in beside the in-memory formats.
 * Augmentation randomness is a pure function of (seed, epoch, sample index):
 * the same sample in the same epoch is augmented the same way in a resumed
 * run, whatever the batch or thread it lands in. */
#ifndef VISC_DATA_H
#define VISC_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int pad_crop; /* random crop of the input size after zero padding by this much; 0: off */
    int hflip;    /* random horizontal flip with probability 1/2 */
    float mean[3], std[3];
    int pad_to; /* centre the image on a zero canvas of this size first (0: none) */
} visc_augment;

typedef struct visc_dataset visc_dataset;
struct visc_dataset {
    int64_t size;
    int channels, height, width, num_classes;
    int views; /* augmented views get() writes per sample, one after another (SSL: 2); 0 or 1: one
                */
    /* Writes sample idx as normalized CHW floats into out (views x C x H x W
     * for multi-view datasets), its label into
     * *label. train = 1 applies the random augmentation drawn from
     * (seed, epoch, idx); train = 0 only normalizes. Returns 0, or -1 with
     * visc_last_error() set. Safe to call from several threads at once. */
    int (*get)(const visc_dataset *ds, int64_t idx, const visc_augment *aug, int train,
               uint64_t seed, int64_t epoch, float *out, int32_t *label);
    /* As get, up to ToTensor + Normalize: the sample's bytes (CHW), whose
     * visc_normalize_bytes (with the recipe's mean and std) is get's
     * output, for a device that normalizes the batch itself. NULL where
     * there is no byte form (in-memory data; a recipe that erases). */
    int (*get_bytes)(const visc_dataset *ds, int64_t idx, int train, uint64_t seed, int64_t epoch,
                     uint8_t *out, int32_t *label);
    float byte_mean[3], byte_std[3]; /* with get_bytes: the recipe's Normalize */
    void (*destroy)(visc_dataset *ds);
    void *impl;
};

/* In-memory uint8 images [n, c, h, w] with int32 labels: the backing store of
 * IDX and CIFAR datasets; takes ownership of both arrays. */
visc_dataset *visc_dataset_from_memory(uint8_t *images, int32_t *labels, int64_t n, int c, int h,
                                       int w, int num_classes);
void visc_dataset_free(visc_dataset *ds);
/* --subset N on an in-memory dataset: keeps N samples of each class (all of
 * a class with fewer), drawn as visc_subset_per_class does with seeded = 1,
 * in their stored order. Fails on any other kind of dataset. */
int visc_dataset_keep_per_class(visc_dataset *ds, int64_t n, uint64_t seed);

/* ---- subset.c ---- */
/* The samples a per-class subset keeps, the same rule for every data set:
 * per class (labels in 0..num_classes-1), n of its samples drawn without
 * replacement from the Philox stream (seed, VISC_STREAM_SHUFFLE, 2^62 +
 * class), or its first n when seeded = 0; classes with at most n keep all.
 * Writes the kept indices, ascending, to kept (room for count) and returns
 * how many. */
int64_t visc_subset_per_class(const int32_t *labels, int64_t count, int num_classes, int64_t n,
                              int seeded, uint64_t seed, int64_t *kept);
/* Makes an in-memory dataset deliver its images centred on a zero-padded
 * size x size canvas (as torchvision's Pad before ToTensor): Fashion-MNIST's
 * 28 px for models that want 32. size must be >= the image size. */
int visc_dataset_pad_to(visc_dataset *ds, int size);

/* ---- idx.c ---- */
/* Loads images (idx3 ubyte) and labels (idx1 ubyte), gzip-compressed or not. */
visc_dataset *visc_idx_load(const char *images_path, const char *labels_path);
/* Parses in-memory (already decompressed) IDX images/labels; for fuzzing. */
int visc_idx_parse_images(const uint8_t *buf, size_t size, uint8_t **images, int64_t *n, int *h,
                          int *w);
int visc_idx_parse_labels(const uint8_t *buf, size_t size, int32_t **labels, int64_t *n);
/* Reads a whole file, gunzipping if it starts with the gzip magic; caps the
 * decompressed size at max_bytes. */
int visc_read_maybe_gzip(const char *path, uint8_t **out, size_t *size, size_t max_bytes);
/* The in-memory half of the above: if buf starts with the gzip magic,
 * inflates it (all members) into a new buffer of at most max_bytes; else
 * copies it. Error messages carry no file name (the caller adds it). */
int visc_gunzip_memory(const uint8_t *buf, size_t size, uint8_t **out, size_t *out_size,
                       size_t max_bytes);

/* ---- cifar_bin.c ---- */
/* Loads CIFAR-10 binary batch files (each record: label byte + 3072 bytes). */
visc_dataset *visc_cifar_bin_load(const char *const *paths, int npaths);
int visc_cifar_bin_parse(const uint8_t *buf, size_t size, uint8_t **images, int32_t **labels,
                         int64_t *n);

/* ---- augment.c ---- */
/* Applies the augmentation to one uint8 CHW image, writing normalized floats. */
void visc_augment_apply(const visc_augment *aug, const uint8_t *img, int c, int h, int w, int train,
                        uint64_t seed, int64_t epoch, int64_t idx, float *out);
/* The random part, split out so it can be tested: the crop offsets into the
 * padded image (each in [0, 2 * pad_crop]; pad_crop, pad_crop is the
 * centre, i.e. no shift) and the flip, drawn from (seed, epoch, idx). */
void visc_augment_draw(const visc_augment *aug, uint64_t seed, int64_t epoch, int64_t idx, int *dy,
                       int *dx, int *flip);
/* The deterministic part: crop at (dy, dx) of the image zero-padded by
 * aug->pad_crop, mirror if flip, normalize. dy = dx = pad_crop, flip = 0
 * is plain normalization. With aug->pad_to > h (or w) the image is first
 * centred on a pad_to canvas (offset (pad_to - h) / 2) and out is that size. */
void visc_augment_apply_at(const visc_augment *aug, const uint8_t *img, int c, int h, int w, int dy,
                           int dx, int flip, float *out);

/* ---- batch.c ---- */
/* The sample order of an epoch: a permutation drawn from (seed, epoch), or
 * 0..n-1 when shuffle = 0. */
void visc_epoch_order(int64_t *order, int64_t n, int shuffle, uint64_t seed, int64_t epoch);
/* Fills x [B, C, H, W] and y [B] with samples order[0..B-1], in parallel.
 * Returns 0 or -1 (the first failing sample's error). */
int visc_make_batch(const visc_dataset *ds, const int64_t *order, int B, const visc_augment *aug,
                    int train, uint64_t seed, int64_t epoch, float *x, int32_t *y);

#endif

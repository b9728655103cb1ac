/* datasets.c: named datasets, where they live, and how they are normalized. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "visc/train.h"

static void set_norm(visc_augment *aug, const float *mean, const float *std) {
    for (int c = 0; c < 3; c++) {
        aug->mean[c] = mean[c];
        aug->std[c] = std[c];
    }
}

visc_dataset *visc_open_dataset(const char *name, const char *dir, int train, visc_augment *aug) {
    char images[1024], labels[1024];
    if (strcmp(name, "fashion-mnist") == 0 || strcmp(name, "mnist") == 0) {
        int fashion = name[0] == 'f';
        if (!dir || !dir[0]) dir = fashion ? "/usr/share/datasets/fashion-mnist" : "data/mnist";
        const char *split = train ? "train" : "t10k";
        snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte.gz", dir, split);
        snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte.gz", dir, split);
        /* accept uncompressed copies too */
        FILE *f = fopen(images, "rb");
        if (f) fclose(f);
        else {
            snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte", dir, split);
            snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte", dir, split);
        }
        /* statistics of the training sets, as commonly used */
        static const float fm_mean[3] = {0.2860f, 0.2860f, 0.2860f},
                           fm_std[3] = {0.3530f, 0.3530f, 0.3530f};
        static const float m_mean[3] = {0.1307f, 0.1307f, 0.1307f},
                           m_std[3] = {0.3081f, 0.3081f, 0.3081f};
        set_norm(aug, fashion ? fm_mean : m_mean, fashion ? fm_std : m_std);
        visc_dataset *ds = visc_idx_load(images, labels);
        if (!ds && fashion && strcmp(dir, "/usr/share/datasets/fashion-mnist") == 0)
            visc_set_error("%s (install it with: apt-get install dataset-fashion-mnist)",
                           visc_last_error());
        return ds;
    }
    if (strcmp(name, "cifar10") == 0) {
        if (!dir || !dir[0]) dir = "data/cifar-10-batches-bin";
        static const float mean[3] = {0.4914f, 0.4822f, 0.4465f},
                           std[3] = {0.2470f, 0.2435f, 0.2616f};
        set_norm(aug, mean, std);
        char paths[5][1024];
        const char *ptrs[5];
        int n = train ? 5 : 1;
        for (int i = 0; i < n; i++) {
            if (train) snprintf(paths[i], sizeof paths[i], "%s/data_batch_%d.bin", dir, i + 1);
            else snprintf(paths[i], sizeof paths[i], "%s/test_batch.bin", dir);
            ptrs[i] = paths[i];
        }
        return visc_cifar_bin_load(ptrs, n);
    }
    visc_set_error("unknown dataset '%s' (known: fashion-mnist, mnist, cifar10)", name);
    return NULL;
}

int visc_is_image_data(const char *data) {
    static const char *const prefixes[] = {"imagefolder:", "imagenet:", "flat:", "pack:"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (strncmp(data, prefixes[i], strlen(prefixes[i])) == 0) return 1;
    /* Any other "word:" prefix is a spec too (an unknown one, which the
     * image-data opener reports), not a folder of IDX files. */
    size_t word = strspn(data, "abcdefghijklmnopqrstuvwxyz-");
    if (word > 0 && data[word] == ':') return 1;
    char probe[1100];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/index.bin", data);
    return data[0] && stat(probe, &st) == 0;
}

/* "lo,hi" -> two floats (lo <= hi checked by the recipe's validation). */
static int parse_range(const char *flag, const char *text, float out[2]) {
    char *end;
    out[0] = strtof(text, &end);
    if (end == text || *end != ',') goto bad;
    const char *second = end + 1;
    out[1] = strtof(second, &end);
    if (end == second || *end) goto bad;
    return 0;
bad:
    return visc_set_error("--%s: expected two numbers 'lo,hi', got '%s'", flag, text);
}

/* The recipe of the config: the preset, then each flag that is set. */
static int make_recipe(const visc_train_config *c, int train, int size, visc_transform_config *tc) {
    if (visc_transform_preset(train ? c->aug : "eval", size, tc)) return -1;
    if (c->interp[0] && visc_interp_parse(c->interp, &tc->interp)) return -1;
    if (!train) {
        tc->crop_pct = c->crop_pct;
        return visc_transform_validate(tc);
    }
    if (c->scale[0] && parse_range("scale", c->scale, tc->scale)) return -1;
    if (c->ratio[0] && parse_range("ratio", c->ratio, tc->ratio)) return -1;
    if (c->aa[0]) snprintf(tc->randaugment, sizeof tc->randaugment, "%s", c->aa);
    if (c->color_jitter > 0) {
        /* timm: one strength for brightness, contrast and saturation */
        tc->jitter.brightness = tc->jitter.contrast = tc->jitter.saturation = c->color_jitter;
        if (tc->jitter_p <= 0) tc->jitter_p = 1;
    }
    if (c->reprob >= 0) tc->reprob = c->reprob;
    if (c->blur_prob >= 0) tc->blur_p = c->blur_prob;
    if (!c->hflip) tc->hflip = 0;
    tc->fast_decode = c->fast_decode;
    return visc_transform_validate(tc);
}

visc_dataset *visc_open_image_data(const visc_train_config *c, int train, int size,
                                   visc_transform_config *tc, visc_sample_pipeline *pl) {
    if (make_recipe(c, train, size, tc) || visc_transform_pipeline(tc, pl)) return NULL;
    /* Validation: --val-data, else the split beside the training data
     * (imagenet: val/ or test/); an ImageFolder or flat folder without a
     * split validates on its own images, which the run announces. */
    const char *spec = train || !c->val_data[0] ? c->data_dir : c->val_data;
    if (!train && !c->val_data[0] && strncmp(spec, "imagenet:", 9) != 0)
        printf("note: no --val-data; validating on the training images of %s\n", spec);
    int is_pack = strncmp(spec, "pack:", 5) == 0 || strchr(spec, ':') == NULL;
    if (is_pack || c->subset <= 0) {
        if (is_pack && c->subset > 0) {
            visc_set_error("--subset works on image folders, not on packs");
            return NULL;
        }
        return visc_image_dataset_open(spec, train, pl);
    }
    visc_file_list fl;
    if (visc_file_list_open(&fl, spec, train)) return NULL;
    if (train) visc_file_list_subset(&fl, c->subset, 1, c->seed);
    return visc_image_dataset_from_files(&fl, pl);
}

/* datasets.c: named datasets, where they live, and how they are normalized. */
#include <stdio.h>
#include <string.h>

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

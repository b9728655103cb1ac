/* features.c: what every SSL evaluation starts from: the protocol's
 * datasets, a model holding the backbone of a weights file, and the pooled
 * backbone features of a whole dataset.
 *
 * Extraction runs the model in eval mode (BatchNorm uses its running
 * statistics and is not updated), batches in dataset order, the last one
 * padded with copies of its first sample (eval-mode layers are per sample,
 * so the padding changes nothing). Several processes: each rank extracts
 * the samples the loader gives it (every world-th), writes them at their
 * dataset positions of a zeroed full-size bank, and one SUM all-reduce
 * assembles the bank on every rank (positions are disjoint, so the sum is
 * exact). Skipped bad images leave holes that are squeezed out after. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "visc/gpu.h"
#include "visc/ssl_eval.h"

void visc_feature_bank_free(visc_feature_bank *b) {
    visc_free_aligned(b->feats);
    free(b->labels);
    memset(b, 0, sizeof *b);
}

/* F.normalize(x, dim=1): x / max(||x||, 1e-12) */
static void l2_normalize_rows(float *x, int64_t n, int dim) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float *row = x + (size_t)i * dim;
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)row[j] * row[j];
        double norm = sqrt(ss);
        float inv = (float)(1.0 / (norm > 1e-12 ? norm : 1e-12));
        for (int j = 0; j < dim; j++) row[j] *= inv;
    }
}

int visc_extract_features(visc_model *m, const visc_dataset *ds, const visc_augment *aug,
                          int normalize, visc_dist *d, visc_feature_bank *out) {
    memset(out, 0, sizeof *out);
    const int B = m->cfg.batch, D = m->feature_dim;
    const int64_t N = ds->size;
    const size_t sample = (size_t)ds->channels * ds->height * ds->width;
    visc_loader_config lc = {.batch_size = B,
                             .train = 0,
                             .on_bad = VISC_ON_BAD_SKIP,
                             .rank = visc_dist_rank(d),
                             .world = visc_dist_world(d)};
    if (aug) lc.aug = *aug;
    visc_loader *l = visc_loader_new(ds, &lc);
    if (!l) return -1;
    float *feats = visc_alloc_aligned((size_t)(N > 0 ? N : 1) * D * sizeof(float), "feature bank");
    /* label + 1 of every extracted sample, 0 for a hole; doubles so one
     * all-reduce type serves (labels are small integers: exact) */
    double *tags = visc_calloc((size_t)(N > 0 ? N : 1), sizeof(double), "feature bank labels");
    int rc = visc_loader_start(l, 0, 0, -1);
    visc_batch b;
    while (rc == 0 && (rc = visc_loader_next(l, &b)) == 1) {
        for (int i = b.count; i < B; i++) memcpy(b.x + i * sample, b.x, sample * sizeof(float));
        m->forward(m, b.x, 0);
        for (int i = 0; i < b.count; i++) {
            int64_t idx = b.indices[i];
            memcpy(feats + (size_t)idx * D, m->features + (size_t)i * D, D * sizeof(float));
            tags[idx] = (double)b.y[i] + 1.0;
        }
        rc = 0;
    }
    if (rc == 0 && visc_loader_bad_count(l) > 0)
        fprintf(stderr,
                "visc: warning: feature extraction skipped %lld unusable image(s) "
                "(first: %s)\n",
                (long long)visc_loader_bad_count(l), visc_loader_bad_message(l, 0));
    visc_loader_free(l);
    if (rc == 0 && visc_dist_world(d) > 1 &&
        (visc_dist_allreduce(d, feats, (size_t)N * D, VISC_DT_F32, VISC_OP_SUM) ||
         visc_dist_allreduce(d, tags, (size_t)N, VISC_DT_F64, VISC_OP_SUM)))
        rc = -1;
    if (rc < 0) {
        visc_free_aligned(feats);
        free(tags);
        return -1;
    }
    int32_t *labels = visc_malloc((size_t)(N > 0 ? N : 1) * sizeof(int32_t), "bank labels");
    int64_t kept = 0;
    for (int64_t i = 0; i < N; i++) {
        if (tags[i] < 0.5) continue; /* a skipped image */
        if (kept != i) memmove(feats + (size_t)kept * D, feats + (size_t)i * D, D * sizeof(float));
        labels[kept++] = (int32_t)llround(tags[i]) - 1;
    }
    free(tags);
    if (normalize) l2_normalize_rows(feats, kept, D);
    out->feats = feats;
    out->labels = labels;
    out->count = kept;
    out->dim = D;
    out->num_classes = ds->num_classes;
    return 0;
}

/* The recipe of an eval-transform image dataset (timm's eval: Resize
 * floor(size / crop_pct), CenterCrop size) with the config's overrides. */
static int eval_recipe(const visc_train_config *c, int size, visc_transform_config *tc) {
    if (visc_transform_preset("eval", size, tc)) return -1;
    if (c->interp[0] && visc_interp_parse(c->interp, &tc->interp)) return -1;
    tc->crop_pct = c->crop_pct;
    return visc_transform_validate(tc);
}

static visc_dataset *open_images(const visc_train_config *c, int which, visc_transform_config *tc,
                                 visc_sample_pipeline *pl) {
    int size = c->model.image_size > 0 ? c->model.image_size : 224;
    if (which != 0) return visc_open_image_data(c, which == 1, size, tc, pl);
    /* the training images through the eval transform (the kNN bank) */
    if (eval_recipe(c, size, tc) || visc_transform_pipeline(tc, pl)) return NULL;
    const char *spec = c->data_dir;
    int is_pack = strncmp(spec, "pack:", 5) == 0 || strchr(spec, ':') == NULL;
    if (is_pack || c->subset <= 0) {
        if (is_pack && c->subset > 0) {
            visc_set_error("--subset works on image folders, not on packs");
            return NULL;
        }
        return visc_image_dataset_open(spec, 1, pl);
    }
    visc_file_list fl;
    if (visc_file_list_open(&fl, spec, 1)) return NULL;
    visc_file_list_subset(&fl, c->subset, 1, c->seed); /* the subset visc train uses */
    return visc_image_dataset_from_files(&fl, pl);
}

visc_dataset *visc_eval_open_data(const visc_train_config *c, int which, visc_augment *aug,
                                  visc_transform_config *tc, visc_sample_pipeline *pl) {
    memset(aug, 0, sizeof *aug);
    if (which < 0 || which > 2) {
        visc_set_error("visc_eval_open_data: which must be 0, 1 or 2");
        return NULL;
    }
    if (visc_is_image_data(c->data_dir)) return open_images(c, which, tc, pl);
    visc_dataset *ds = visc_open_dataset(c->dataset, c->data_dir, which != 2, aug);
    if (!ds) return NULL;
    /* the training subset visc train uses, for the bank and the probe alike */
    if (which != 2 && c->subset > 0 && visc_dataset_keep_per_class(ds, c->subset, c->seed)) {
        visc_dataset_free(ds);
        return NULL;
    }
    if (which == 1) {
        aug->pad_crop = c->pad_crop;
        aug->hflip = c->hflip;
    }
    /* --input-size larger than the images: centred on a zero canvas, as visc train */
    if (c->model.image_size > 0 && c->model.image_size != ds->height &&
        visc_dataset_pad_to(ds, c->model.image_size)) {
        visc_set_error("--input-size %d: %s", c->model.image_size, visc_last_error());
        visc_dataset_free(ds);
        return NULL;
    }
    return ds;
}

visc_model *visc_eval_model(const visc_train_config *c, const visc_dataset *ds, int batch) {
    visc_model_config mc = c->model;
    mc.num_classes = mc.num_classes > 0 ? mc.num_classes : ds->num_classes;
    mc.in_channels = ds->channels;
    mc.image_size = ds->height;
    mc.batch = batch;
    mc.forward_only = 1;
    mc.grad_checkpointing = 0;
    int gpu_index;
    if (visc_parse_device(c->device, &gpu_index)) return NULL;
    mc.for_gpu = gpu_index >= 0;
    visc_model *m = visc_model_create(&mc, c->seed);
    if (!m) return NULL;
    if (c->weights[0] && visc_load_model_backbone(m, c->weights)) {
        visc_model_destroy(m);
        return NULL;
    }
    return m;
}

/* augment.c: train-time random crop and flip, then normalization.
 *
 * Semantics are torchvision's RandomCrop(size, padding=p) ->
 * RandomHorizontalFlip() -> ToTensor() -> Normalize(mean, std):
 *   1. pad the uint8 image with p zero pixels on every side, and take the
 *      h x w window at (dy, dx), each uniform in [0, 2p]. Padding happens
 *      before normalization, so a padded pixel becomes (0 - mean) / std,
 *      not 0;
 *   2. mirror left-right with probability 1/2;
 *   3. x / 255, then (x - mean[c]) / std[c], in that order and in float,
 *      which is bit-for-bit what ToTensor + Normalize compute.
 * Eval (train = 0) is step 3 only.
 *
 * Randomness: sample idx of epoch e draws from the Philox stream
 *   visc_rng_make(seed, VISC_STREAM_AUGMENT + 16 * e, idx)
 * and always takes, in this order, dy = below(2p + 1), dx = below(2p + 1),
 * then one word whose top bit is the flip. The stride of 16 keeps every
 * epoch's stream apart from the other fixed streams of rng.h (1..15), and
 * the draws are the same whether or not crop/flip are enabled, so turning
 * one on does not reshuffle the other. So (seed, epoch, idx) alone fixes a
 * sample's augmentation: batch composition, thread and resume point do not
 * matter.
 *
 * Channels: mean/std have three entries; channel c uses entry min(c, 2), so
 * grayscale uses mean[0]/std[0]. A std of 0 (an unset, zeroed struct) is
 * taken as 1, and aug == NULL means plain x / 255. */
#include "visc/data.h"
#include "visc/rng.h"

static const visc_augment no_augment = {0, 0, {0, 0, 0}, {1, 1, 1}, 0};

void visc_augment_draw(const visc_augment *aug, uint64_t seed, int64_t epoch, int64_t idx, int *dy,
                       int *dx, int *flip) {
    if (!aug) aug = &no_augment;
    int p = aug->pad_crop > 0 ? aug->pad_crop : 0;
    visc_rng r = visc_rng_make(seed, VISC_STREAM_AUGMENT + 16 * (uint64_t)epoch, (uint64_t)idx);
    uint32_t span = 2 * (uint32_t)p + 1;
    *dy = (int)visc_rng_below(&r, span);
    *dx = (int)visc_rng_below(&r, span);
    uint32_t coin = visc_rng_u32(&r) >> 31;
    *flip = aug->hflip ? (int)coin : 0;
}

void visc_augment_apply_at(const visc_augment *aug, const uint8_t *img, int c, int h, int w, int dy,
                           int dx, int flip, float *out) {
    if (!aug) aug = &no_augment;
    int p = aug->pad_crop > 0 ? aug->pad_crop : 0;
    /* The output canvas and where the image sits on it (pad_to). */
    int oh = aug->pad_to > h ? aug->pad_to : h, ow = aug->pad_to > w ? aug->pad_to : w;
    int top = (oh - h) / 2, left = (ow - w) / 2;
    /* Shift of the window relative to the unpadded image. */
    int oy = dy - p - top, ox = dx - p - left;
    for (int ch = 0; ch < c; ch++) {
        int k = ch < 2 ? ch : 2;
        float mean = aug->mean[k], std = aug->std[k] != 0 ? aug->std[k] : 1.0f;
        float zero = (0.0f - mean) / std; /* a padded pixel */
        const uint8_t *src = img + (size_t)ch * h * w;
        float *dst = out + (size_t)ch * oh * ow;
        /* Output columns x whose source column lies inside the image; with
         * flip the source column is ow - 1 - x + ox, else x + ox. */
        int x0 = flip ? ow - w + ox : -ox, x1 = flip ? ow + ox : w - ox;
        if (x0 < 0) x0 = 0;
        if (x1 > ow) x1 = ow;
        for (int y = 0; y < oh; y++) {
            float *row = dst + (size_t)y * ow;
            int sy = y + oy;
            if (sy < 0 || sy >= h || x0 >= x1) {
                for (int x = 0; x < ow; x++) row[x] = zero;
                continue;
            }
            const uint8_t *srow = src + (size_t)sy * w;
            for (int x = 0; x < x0; x++) row[x] = zero;
            if (flip) {
                for (int x = x0; x < x1; x++)
                    row[x] = ((float)srow[ow - 1 - x + ox] / 255.0f - mean) / std;
            } else {
                for (int x = x0; x < x1; x++) row[x] = ((float)srow[x + ox] / 255.0f - mean) / std;
            }
            for (int x = x1; x < ow; x++) row[x] = zero;
        }
    }
}

void visc_augment_apply(const visc_augment *aug, const uint8_t *img, int c, int h, int w, int train,
                        uint64_t seed, int64_t epoch, int64_t idx, float *out) {
    if (!aug) aug = &no_augment;
    int p = aug->pad_crop > 0 ? aug->pad_crop : 0;
    int dy = p, dx = p, flip = 0;
    if (train) visc_augment_draw(aug, seed, epoch, idx, &dy, &dx, &flip);
    visc_augment_apply_at(aug, img, c, h, w, dy, dx, flip, out);
}

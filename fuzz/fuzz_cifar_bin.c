/* fuzz_cifar_bin.c: libFuzzer target for the CIFAR-10 binary parser and
 * the in-memory dataset it feeds. Build and run:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude fuzz/fuzz_cifar_bin.c \
 *       src/data/cifar_bin.c src/data/gzip.c src/data/augment.c src/data/dataset_memory.c \
 *       src/core/error.c src/core/memory.c src/core/rng.c -lz -lm -o build/fuzz_cifar_bin
 *   ./build/fuzz_cifar_bin -max_len=20000 fuzz/corpus/fuzz_cifar_bin
 * A parsed input becomes a dataset; its first and last samples are fetched
 * with augmentation, and an index past the end must be refused. */
#include <stdint.h>
#include <stdlib.h>

#include "visc/core.h"
#include "visc/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *images;
    int32_t *labels;
    int64_t n;
    if (visc_cifar_bin_parse(data, size, &images, &labels, &n)) return 0;
    visc_dataset *ds = visc_dataset_from_memory(images, labels, n, 3, 32, 32, 10);
    visc_augment aug = {4, 1, {0.4914f, 0.4822f, 0.4465f}, {0.247f, 0.243f, 0.261f}, 0};
    float out[3 * 32 * 32];
    int32_t label;
    if (ds->get(ds, 0, &aug, 1, data[0], 1, out, &label) || label < 0 || label > 9) abort();
    if (ds->get(ds, n - 1, &aug, 0, 0, 0, out, &label) || label < 0 || label > 9) abort();
    if (ds->get(ds, n, &aug, 0, 0, 0, out, &label) != -1) abort();
    visc_dataset_free(ds);
    return 0;
}

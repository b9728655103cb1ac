/* fuzz_pack.c: libFuzzer target for the packed-shard index parser and the
 * file-index (scan cache) decoder: both read files a crash or a disk error
 * may have mangled. `make fuzz` builds it; run:
 *   ./build-fuzz/fuzz/fuzz_pack fuzz/corpus/fuzz_pack
 * The first byte picks the parser. A pack index that parses must be
 * internally consistent: every record inside its declared shard, every
 * name terminated, labels below the class count (checked here, so a parser
 * that accepts a lie is a crash, not a silent pass). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/loader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 1) {
        visc_file_list fl;
        visc_layout layout;
        if (visc_file_index_decode(&fl, data + 1, size - 1, &layout) == 0) {
            for (int64_t i = 0; i < fl.count; i++) {
                VISC_ASSERT(fl.labels[i] >= 0 && fl.labels[i] < fl.num_classes);
                VISC_ASSERT(strlen(visc_file_list_name(&fl, i)) > 0);
            }
            visc_file_list_free(&fl);
        }
        return 0;
    }
    visc_pack p;
    if (visc_pack_parse_index(&p, data + 1, size - 1) == 0) {
        for (int64_t i = 0; i < p.count; i++) {
            const visc_pack_record *r = &p.records[i];
            VISC_ASSERT(r->shard >= 0 && r->shard < p.num_shards);
            VISC_ASSERT(r->label >= 0 && r->label < p.num_classes);
            VISC_ASSERT(r->offset + r->size <= p.shard_sizes[r->shard]);
            VISC_ASSERT(strlen(p.names + r->name_off) == r->name_len);
        }
        for (int c = 0; c < p.num_classes; c++) VISC_ASSERT(p.class_names[c] != NULL);
        visc_pack_close(&p);
    }
    return 0;
}

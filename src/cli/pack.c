/* pack.c: `visc pack SRC DST`, turning an image folder into packed shards.
 *
 *   visc pack imagenet:/data/imagenet/train-or-val... DST
 *   visc pack /data/imagenet/train /fast/in1k-train-256 --shorter-side 256
 *
 * SRC is a data set spec (imagefolder:, flat:, imagenet: which packs the
 * train split, imagenet-val: the val split) or a plain folder, read as an
 * ImageFolder. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pack.h"
#include "visc/core.h"
#include "visc/loader.h"

static void usage(FILE *f) {
    fputs("usage: visc pack SRC DST [--shorter-side N | --max-side N] [--quality Q]\n"
          "                 [--shard-size BYTES[K|M|G|KiB|MiB|GiB]] [--raw] [--subset N]\n"
          "                 [--threads N] [--quiet]\n"
          "SRC: imagefolder:PATH, flat:PATH, imagenet:PATH (train), imagenet-val:PATH, or a\n"
          "folder (ImageFolder). Images are stored as they are unless resized or --raw.\n",
          f);
}

/* A positive integer flag value; -1 with an error otherwise. */
static int parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return visc_set_error("%s '%s': expected an integer in %lld..%lld", flag, s, lo, hi);
    *out = v;
    return 0;
}

static int parse_bytes(const char *s, long long *out) {
    if (visc_parse_size(s, out))
        return visc_set_error("--shard-size '%s': expected a size such as 1GiB or 512M", s);
    if (*out < 1024 || *out > (long long)1e15)
        return visc_set_error("--shard-size '%s': out of range (1 KiB .. 1 PB)", s);
    return 0;
}

int visc_cmd_pack(int argc, char **argv) {
    visc_pack_options o;
    visc_pack_options_default(&o);
    o.verbose = 1;
    const char *pos[2] = {NULL, NULL};
    int npos = 0;
    long long subset = 0, v = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--raw")) {
            o.raw = 1;
        } else if (!strcmp(a, "--quiet")) {
            o.verbose = 0;
        } else if (a[0] == '-' && a[1] == '-') {
            if (!val) {
                fprintf(stderr, "visc: %s needs a value\n", a);
                return 2;
            }
            i++;
            if (!strcmp(a, "--shorter-side"))
                rc = parse_int(a, val, 1, 65535, &v), o.shorter_side = (int)v;
            else if (!strcmp(a, "--max-side"))
                rc = parse_int(a, val, 1, 65535, &v), o.max_side = (int)v;
            else if (!strcmp(a, "--quality"))
                rc = parse_int(a, val, 1, 100, &v), o.quality = (int)v;
            else if (!strcmp(a, "--threads"))
                rc = parse_int(a, val, 1, 4096, &v), o.threads = (int)v;
            else if (!strcmp(a, "--subset")) rc = parse_int(a, val, 1, (long long)1 << 40, &subset);
            else if (!strcmp(a, "--shard-size")) rc = parse_bytes(val, &v), o.shard_bytes = v;
            else {
                fprintf(stderr, "visc: unknown option '%s' (try `visc pack --help`)\n", a);
                return 2;
            }
        } else if (npos < 2) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "visc: unexpected argument '%s'\n", a);
            return 2;
        }
        if (rc) {
            fprintf(stderr, "visc: %s\n", visc_last_error());
            return 2;
        }
    }
    if (npos != 2) {
        usage(stderr);
        return 2;
    }
    if (o.shorter_side > 0 && o.max_side > 0) {
        fprintf(stderr, "visc: --shorter-side and --max-side exclude each other\n");
        return 2;
    }
    visc_file_list fl;
    int rc;
    if (strncmp(pos[0], "imagenet-val:", 13) == 0) {
        char spec[4200];
        snprintf(spec, sizeof spec, "imagenet:%s", pos[0] + 13);
        rc = visc_file_list_open(&fl, spec, 0);
    } else if (strchr(pos[0], ':')) {
        rc = visc_file_list_open(&fl, pos[0], 1);
    } else {
        rc = visc_file_index_load(&fl, pos[0], VISC_LAYOUT_IMAGEFOLDER, NULL);
    }
    if (rc) visc_die("%s", visc_last_error());
    if (subset > 0) visc_file_list_subset(&fl, subset, 0, 0);
    double t0 = visc_now();
    if (visc_pack_write(&fl, pos[1], &o)) {
        visc_file_list_free(&fl);
        visc_die("%s", visc_last_error());
    }
    printf("packed %lld images of %d classes into %s in %.1f s\n", (long long)fl.count,
           fl.num_classes, pos[1], visc_now() - t0);
    visc_file_list_free(&fl);
    return 0;
}

/* image_folder.c: which files make a data set, and their labels.
 *
 * The orders follow torchvision so that label i here is label i there:
 * ImageFolder classes are sorted(os.scandir(root)) folder names, and the
 * files of a class come as sorted(os.walk(class_dir)) then sorted(fnames),
 * i.e. sorted by (folder path, file name) byte-wise. Sorting here uses
 * strcmp, which is byte order, as Python's str order is for UTF-8 names
 * (code point order = UTF-8 byte order).
 *
 * Names go into one growing blob with an offset table: a 1.28M-file
 * ImageNet train list is a few allocations, not a million. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "visc/core.h"
#include "visc/data.h"
#include "visc/loader.h"
#include "visc/rng.h"

#define MAX_DEPTH 32 /* symlink loops end here instead of recursing forever */

typedef struct {
    char **items;
    size_t count, cap;
} strvec;

static void strvec_push(strvec *v, const char *s) {
    if (v->count == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 64;
        v->items = visc_realloc(v->items, v->cap * sizeof *v->items, "name list");
    }
    v->items[v->count++] = visc_strdup(s);
}

static void strvec_free(strvec *v) {
    for (size_t i = 0; i < v->count; i++) free(v->items[i]);
    free(v->items);
    v->items = NULL;
    v->count = v->cap = 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* os.walk order: by the folder part of the path, then by the file name. */
static int cmp_walk(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    const char *sx = strrchr(x, '/'), *sy = strrchr(y, '/');
    size_t dx = sx ? (size_t)(sx - x) : 0, dy = sy ? (size_t)(sy - y) : 0;
    size_t n = dx < dy ? dx : dy;
    int c = memcmp(x, y, n);
    if (c) return c;
    if (dx != dy) return dx < dy ? -1 : 1; /* a prefix folder sorts first */
    return strcmp(sx ? sx + 1 : x, sy ? sy + 1 : y);
}

static int has_image_ext(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return 0;
    return !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") || !strcasecmp(dot, ".png");
}

/* Appends one name to the list under construction. */
static void list_add(visc_file_list *fl, size_t *cap_files, size_t *cap_names, const char *name,
                     int32_t label) {
    if ((size_t)fl->count == *cap_files) {
        *cap_files = *cap_files ? 2 * *cap_files : 1024;
        fl->name_off = visc_realloc(fl->name_off, *cap_files * sizeof *fl->name_off, "file list");
        fl->labels = visc_realloc(fl->labels, *cap_files * sizeof *fl->labels, "file labels");
    }
    size_t len = strlen(name) + 1;
    if (fl->names_size + len > *cap_names) {
        while (fl->names_size + len > *cap_names) *cap_names = *cap_names ? 2 * *cap_names : 65536;
        fl->names = visc_realloc(fl->names, *cap_names, "file names");
    }
    memcpy(fl->names + fl->names_size, name, len);
    fl->name_off[fl->count] = (int64_t)fl->names_size;
    fl->labels[fl->count] = label;
    fl->names_size += len;
    fl->count++;
}

/* Collects the image files below dir (path relative to base: rel). */
static int walk(const char *base, const char *rel, strvec *out, int depth) {
    char path[4096];
    int n = rel[0] ? snprintf(path, sizeof path, "%s/%s", base, rel)
                   : snprintf(path, sizeof path, "%s", base);
    if (n < 0 || (size_t)n >= sizeof path) return visc_set_error("path too long under '%s'", base);
    if (depth > MAX_DEPTH)
        return visc_set_error("folders nested deeper than %d at '%s' (a symlink loop?)", MAX_DEPTH,
                              path);
    DIR *d = opendir(path);
    if (!d) return visc_set_error("cannot list '%s': %s", path, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue; /* ".", "..", hidden files and folders */
        char child[4096], full[4096];
        int k = rel[0] ? snprintf(child, sizeof child, "%s/%s", rel, e->d_name)
                       : snprintf(child, sizeof child, "%s", e->d_name);
        int m = snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        if (k < 0 || (size_t)k >= sizeof child || m < 0 || (size_t)m >= sizeof full) {
            rc = visc_set_error("path too long under '%s'", path);
            break;
        }
        int is_dir = e->d_type == DT_DIR, is_reg = e->d_type == DT_REG;
        if (e->d_type == DT_UNKNOWN ||
            e->d_type == DT_LNK) { /* follow links, as followlinks=True */
            struct stat st;
            if (stat(full, &st) != 0) continue; /* a dangling link is no image */
            is_dir = S_ISDIR(st.st_mode);
            is_reg = S_ISREG(st.st_mode);
        }
        if (is_dir) {
            if ((rc = walk(base, child, out, depth + 1)) != 0) break;
        } else if (is_reg && has_image_ext(e->d_name)) {
            strvec_push(out, child);
        }
    }
    closedir(d);
    return rc;
}

/* The subfolders of root (not hidden), sorted. */
static int list_class_dirs(const char *root, strvec *classes) {
    DIR *d = opendir(root);
    if (!d) return visc_set_error("cannot list '%s': %s", root, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        int is_dir = e->d_type == DT_DIR;
        if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
            char full[4096];
            struct stat st;
            int m = snprintf(full, sizeof full, "%s/%s", root, e->d_name);
            is_dir =
                m > 0 && (size_t)m < sizeof full && stat(full, &st) == 0 && S_ISDIR(st.st_mode);
        }
        if (is_dir) strvec_push(classes, e->d_name);
    }
    closedir(d);
    qsort(classes->items, classes->count, sizeof *classes->items, cmp_str);
    return 0;
}

static void list_init(visc_file_list *fl, const char *root) {
    memset(fl, 0, sizeof *fl);
    fl->root = visc_strdup(root);
    size_t n = strlen(fl->root);
    while (n > 1 && fl->root[n - 1] == '/') fl->root[--n] = 0;
}

int visc_scan_imagefolder(visc_file_list *fl, const char *root) {
    list_init(fl, root);
    strvec classes = {0};
    if (list_class_dirs(fl->root, &classes)) goto fail;
    if (classes.count == 0) {
        visc_set_error("'%s' has no class folders (expected root/<class>/<image>)", fl->root);
        goto fail;
    }
    if (classes.count > INT32_MAX) {
        visc_set_error("'%s': too many class folders", fl->root);
        goto fail;
    }
    size_t cap_files = 0, cap_names = 0;
    for (size_t c = 0; c < classes.count; c++) {
        strvec files = {0};
        if (walk(fl->root, classes.items[c], &files, 0)) {
            strvec_free(&files);
            goto fail;
        }
        if (files.count == 0) {
            strvec_free(&files);
            visc_set_error("class folder '%s/%s' has no .jpg, .jpeg or .png file", fl->root,
                           classes.items[c]);
            goto fail;
        }
        qsort(files.items, files.count, sizeof *files.items, cmp_walk);
        for (size_t i = 0; i < files.count; i++)
            list_add(fl, &cap_files, &cap_names, files.items[i], (int32_t)c);
        strvec_free(&files);
    }
    fl->num_classes = (int)classes.count;
    fl->class_names = classes.items; /* taken over */
    return 0;
fail:
    strvec_free(&classes);
    visc_file_list_free(fl);
    return -1;
}

int visc_scan_flat(visc_file_list *fl, const char *root) {
    list_init(fl, root);
    strvec files = {0}, classes = {0};
    DIR *d = opendir(fl->root);
    if (!d) {
        visc_set_error("cannot list '%s': %s", fl->root, strerror(errno));
        goto fail;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !has_image_ext(e->d_name)) continue;
        if (e->d_type != DT_REG && e->d_type != DT_LNK && e->d_type != DT_UNKNOWN) continue;
        strvec_push(&files, e->d_name);
    }
    closedir(d);
    if (files.count == 0) {
        visc_set_error("'%s' has no .jpg, .jpeg or .png file", fl->root);
        goto fail;
    }
    qsort(files.items, files.count, sizeof *files.items, cmp_str);
    /* the class prefixes, sorted and made unique */
    for (size_t i = 0; i < files.count; i++) {
        const char *us = strchr(files.items[i], '_');
        if (!us || us == files.items[i]) {
            visc_set_error("'%s/%s': a flat folder needs names <class>_<name> (no '_' prefix)",
                           fl->root, files.items[i]);
            goto fail;
        }
        char prefix[4096];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(us - files.items[i]), files.items[i]);
        strvec_push(&classes, prefix);
    }
    qsort(classes.items, classes.count, sizeof *classes.items, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < classes.count; i++) {
        if (u > 0 && strcmp(classes.items[u - 1], classes.items[i]) == 0) {
            free(classes.items[i]);
            continue;
        }
        classes.items[u++] = classes.items[i];
    }
    classes.count = u;
    size_t cap_files = 0, cap_names = 0;
    for (size_t i = 0; i < files.count; i++) {
        char prefix[4096];
        const char *us = strchr(files.items[i], '_');
        snprintf(prefix, sizeof prefix, "%.*s", (int)(us - files.items[i]), files.items[i]);
        const char *key = prefix;
        char **hit = bsearch(&key, classes.items, classes.count, sizeof *classes.items, cmp_str);
        VISC_ASSERT(hit); /* every prefix was put into classes above */
        int32_t label = hit ? (int32_t)(hit - classes.items) : 0;
        list_add(fl, &cap_files, &cap_names, files.items[i], label);
    }
    strvec_free(&files);
    fl->num_classes = (int)classes.count;
    fl->class_names = classes.items;
    return 0;
fail:
    strvec_free(&files);
    strvec_free(&classes);
    visc_file_list_free(fl);
    return -1;
}

int visc_file_list_open(visc_file_list *fl, const char *spec, int train) {
    memset(fl, 0, sizeof *fl);
    if (strncmp(spec, "imagefolder:", 12) == 0)
        return visc_file_index_load(fl, spec + 12, VISC_LAYOUT_IMAGEFOLDER, NULL);
    if (strncmp(spec, "flat:", 5) == 0)
        return visc_file_index_load(fl, spec + 5, VISC_LAYOUT_FLAT, NULL);
    if (strncmp(spec, "imagenet:", 9) == 0) {
        /* The validation split is val/ (ImageNet), or test/ when there is
         * no val/ (the CIFAR-10 JPEG copy). */
        char path[4096];
        int n = snprintf(path, sizeof path, "%s/%s", spec + 9, train ? "train" : "val");
        if (n < 0 || (size_t)n >= sizeof path)
            return visc_set_error("data path too long: '%s'", spec);
        struct stat st;
        if (!train && stat(path, &st) != 0) snprintf(path, sizeof path, "%s/test", spec + 9);
        return visc_file_index_load(fl, path, VISC_LAYOUT_IMAGEFOLDER, NULL);
    }
    return visc_set_error("unknown data set '%s' (expected imagefolder:PATH, imagenet:PATH, "
                          "flat:PATH or pack:PATH)",
                          spec);
}

void visc_file_list_subset(visc_file_list *fl, int64_t n, int seeded, uint64_t seed) {
    if (n <= 0) return;
    /* files of a class are contiguous in every layout but flat; the rule
     * selects per class by label, keeping scan order */
    int64_t *kept =
        visc_malloc((size_t)(fl->count > 0 ? fl->count : 1) * sizeof *kept, "subset indices");
    int64_t out =
        visc_subset_per_class(fl->labels, fl->count, fl->num_classes, n, seeded, seed, kept);
    for (int64_t i = 0; i < out; i++) {
        fl->name_off[i] = fl->name_off[kept[i]];
        fl->labels[i] = fl->labels[kept[i]];
    }
    fl->count = out;
    free(kept);
}

int visc_file_list_path(const visc_file_list *fl, int64_t i, char *buf, size_t size) {
    int n = snprintf(buf, size, "%s/%s", fl->root, visc_file_list_name(fl, i));
    if (n < 0 || (size_t)n >= size)
        return visc_set_error("path too long: '%s/%s'", fl->root, visc_file_list_name(fl, i));
    return 0;
}

void visc_file_list_free(visc_file_list *fl) {
    if (!fl) return;
    free(fl->root);
    free(fl->name_off);
    free(fl->names);
    free(fl->labels);
    for (int c = 0; c < fl->num_classes; c++) free(fl->class_names[c]);
    free(fl->class_names);
    memset(fl, 0, sizeof *fl);
}

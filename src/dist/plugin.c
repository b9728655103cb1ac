/* plugin.c: finding a collective backend plugin and loading it.
 *
 * The MPI backend lives in its own shared object so that the visc program
 * itself never links libmpi: a single-process run works on a machine
 * without MPI, and only a launched run loads it. Search order:
 * $VISC_DIST_PLUGIN_DIR, the program's own folder, its parent (the test
 * programs in build/tests/ find build/libvisc_mpi.so), then the dynamic
 * loader's default path. RTLD_GLOBAL: Open MPI loads its own components
 * with dlopen and they resolve symbols of libmpi / libopen-pal globally. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "plugin.h"
#include "visc/core.h"

static void *try_open(const char *dir, const char *file, char *tried, size_t tried_size) {
    char path[PATH_MAX + 64];
    if (dir) snprintf(path, sizeof path, "%s/%s", dir, file);
    else snprintf(path, sizeof path, "%s", file);
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        size_t used = strlen(tried);
        const char *why = dlerror();
        /* the first failure is the one worth showing (later ones are "not found") */
        if (used == 0 && why) snprintf(tried, tried_size, "%s", why);
    }
    return h;
}

const visc_dist_backend *visc_dist_load_plugin(const char *name) {
    char file[64], exe[PATH_MAX], tried[512] = "";
    snprintf(file, sizeof file, "libvisc_%s.so", name);
    void *h = NULL;
    const char *env = getenv("VISC_DIST_PLUGIN_DIR");
    if (env && *env) h = try_open(env, file, tried, sizeof tried);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (!h && n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            h = try_open(exe, file, tried, sizeof tried);
            slash = strrchr(exe, '/');
            if (!h && slash) {
                *slash = '\0';
                h = try_open(exe, file, tried, sizeof tried);
            }
        }
    }
    if (!h) h = try_open(NULL, file, tried, sizeof tried);
    if (!h) {
        visc_set_error("cannot load the %s backend %s (%s): install libopenmpi-dev and rebuild "
                       "visc (make), or set VISC_DIST_PLUGIN_DIR",
                       name, file, tried[0] ? tried : "not found");
        return NULL;
    }
    visc_dist_backend_get_fn get = (visc_dist_backend_get_fn)dlsym(h, "visc_dist_backend_get");
    const visc_dist_backend *b = get ? get() : NULL;
    if (!b || b->abi != VISC_DIST_BACKEND_ABI) {
        visc_set_error("%s is not a visc %s backend of this version", file, name);
        dlclose(h);
        return NULL;
    }
    /* never dlclose'd: the MPI library keeps threads and atexit handlers */
    return b;
}

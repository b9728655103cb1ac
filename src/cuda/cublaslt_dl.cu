/* cublaslt_dl.cu: cuBLASLt, loaded with dlopen by the first matrix product.
 *
 * Linked the ordinary way, libcublasLt (540 MB) would be mapped and
 * relocated at every start of every program that links the backend: visc
 * --help took 0.35 s and 224 MB instead of 0.03 s and 14 MB, and the test
 * suites start visc hundreds of times. So the backend reaches cuBLASLt
 * through this table, filled on first use; a machine without the library
 * gets one error line from its first matrix product and nothing else
 * changes. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "common.cuh"

#define VISC_STR2(x) #x
#define VISC_STR(x) VISC_STR2(x)
#define LT_SONAME "libcublasLt.so." VISC_STR(CUBLAS_VER_MAJOR)

visc_lt_api visc_lt;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_error[512];

template <typename F> static int resolve(void *lib, F *fn, const char *name) {
    *fn = (F)dlsym(lib, name);
    if (*fn) return 0;
    snprintf(load_error, sizeof load_error, "%s has no %s (%s)", LT_SONAME, name, dlerror());
    return -1;
}

static void load(void) {
    /* The loader's search path first, then the toolkit the library was
     * built with (an rpath that costs nothing at startup). */
    void *lib = dlopen(LT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen(VISC_CUDA_LIBDIR "/" LT_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof load_error, "cannot load cuBLASLt (%s, also tried in %s): %s",
                 LT_SONAME, VISC_CUDA_LIBDIR, dlerror());
        return;
    }
    visc_lt_api t;
    if (resolve(lib, &t.create, "cublasLtCreate") || resolve(lib, &t.destroy, "cublasLtDestroy") ||
        resolve(lib, &t.status_string, "cublasLtGetStatusString") ||
        resolve(lib, &t.matmul, "cublasLtMatmul") ||
        resolve(lib, &t.heuristic, "cublasLtMatmulAlgoGetHeuristic") ||
        resolve(lib, &t.desc_create, "cublasLtMatmulDescCreate") ||
        resolve(lib, &t.desc_destroy, "cublasLtMatmulDescDestroy") ||
        resolve(lib, &t.desc_set, "cublasLtMatmulDescSetAttribute") ||
        resolve(lib, &t.layout_create, "cublasLtMatrixLayoutCreate") ||
        resolve(lib, &t.layout_destroy, "cublasLtMatrixLayoutDestroy") ||
        resolve(lib, &t.layout_set, "cublasLtMatrixLayoutSetAttribute") ||
        resolve(lib, &t.pref_create, "cublasLtMatmulPreferenceCreate") ||
        resolve(lib, &t.pref_destroy, "cublasLtMatmulPreferenceDestroy") ||
        resolve(lib, &t.pref_set, "cublasLtMatmulPreferenceSetAttribute")) {
        dlclose(lib);
        return;
    }
    visc_lt = t; /* published whole, or not at all */
}

int visc_lt_load(void) {
    pthread_once(&once, load);
    if (visc_lt.create) return 0;
    return visc_set_error("%s", load_error);
}

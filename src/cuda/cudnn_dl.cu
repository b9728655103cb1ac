/* cudnn_dl.cu: cuDNN, loaded with dlopen by the first convolution.
 *
 * For the reason cuBLASLt is (cublaslt_dl.cu): libcudnn.so.9 is a small
 * shim, but it pulls in libcudnn_cnn and the engine libraries (about a
 * gigabyte together), and most runs (ViT, Swin) never convolve on the GPU.
 * A machine without cuDNN gets one error line from its first convolution.
 * The legacy convolution calls used here (cudnnConvolutionForward and its
 * backward twins, the _v7 heuristics) are marked deprecated in cuDNN 9 but
 * still shipped, in libcudnn_cnn; the shim exports them. */
#if __has_include(<cudnn.h>) /* else conv.cu says that there is no cuDNN */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "cudnn_dl.cuh"

#define VISC_STR2(x) #x
#define VISC_STR(x) VISC_STR2(x)
#define DNN_SONAME "libcudnn.so." VISC_STR(CUDNN_MAJOR)

visc_dnn_api visc_dnn;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char load_error[512];

template <typename F> static int resolve(void *lib, F *fn, const char *name) {
    *fn = (F)dlsym(lib, name);
    if (*fn) return 0;
    snprintf(load_error, sizeof load_error, "%s has no %s (%s)", DNN_SONAME, name, dlerror());
    return -1;
}

static void load(void) {
    void *lib = dlopen(DNN_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen(VISC_CUDA_LIBDIR "/" DNN_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof load_error,
                 "cannot load cuDNN (%s, also tried in %s; install cuDNN %d): %s", DNN_SONAME,
                 VISC_CUDA_LIBDIR, CUDNN_MAJOR, dlerror());
        return;
    }
    visc_dnn_api t;
    if (resolve(lib, &t.create, "cudnnCreate") || resolve(lib, &t.destroy, "cudnnDestroy") ||
        resolve(lib, &t.set_stream, "cudnnSetStream") ||
        resolve(lib, &t.error_string, "cudnnGetErrorString") ||
        resolve(lib, &t.tensor_create, "cudnnCreateTensorDescriptor") ||
        resolve(lib, &t.tensor_destroy, "cudnnDestroyTensorDescriptor") ||
        resolve(lib, &t.tensor_set, "cudnnSetTensor4dDescriptor") ||
        resolve(lib, &t.filter_create, "cudnnCreateFilterDescriptor") ||
        resolve(lib, &t.filter_destroy, "cudnnDestroyFilterDescriptor") ||
        resolve(lib, &t.filter_set, "cudnnSetFilter4dDescriptor") ||
        resolve(lib, &t.conv_create, "cudnnCreateConvolutionDescriptor") ||
        resolve(lib, &t.conv_destroy, "cudnnDestroyConvolutionDescriptor") ||
        resolve(lib, &t.conv_set, "cudnnSetConvolution2dDescriptor") ||
        resolve(lib, &t.conv_math, "cudnnSetConvolutionMathType") ||
        resolve(lib, &t.fwd_algos, "cudnnGetConvolutionForwardAlgorithm_v7") ||
        resolve(lib, &t.bwd_data_algos, "cudnnGetConvolutionBackwardDataAlgorithm_v7") ||
        resolve(lib, &t.bwd_filter_algos, "cudnnGetConvolutionBackwardFilterAlgorithm_v7") ||
        resolve(lib, &t.fwd_find, "cudnnFindConvolutionForwardAlgorithm") ||
        resolve(lib, &t.bwd_data_find, "cudnnFindConvolutionBackwardDataAlgorithm") ||
        resolve(lib, &t.bwd_filter_find, "cudnnFindConvolutionBackwardFilterAlgorithm") ||
        resolve(lib, &t.fwd_ws, "cudnnGetConvolutionForwardWorkspaceSize") ||
        resolve(lib, &t.bwd_data_ws, "cudnnGetConvolutionBackwardDataWorkspaceSize") ||
        resolve(lib, &t.bwd_filter_ws, "cudnnGetConvolutionBackwardFilterWorkspaceSize") ||
        resolve(lib, &t.fwd, "cudnnConvolutionForward") ||
        resolve(lib, &t.bwd_data, "cudnnConvolutionBackwardData") ||
        resolve(lib, &t.bwd_filter, "cudnnConvolutionBackwardFilter")) {
        dlclose(lib);
        return;
    }
    visc_dnn = t; /* published whole, or not at all */
}

int visc_dnn_load(void) {
    pthread_once(&once, load);
    if (visc_dnn.create) return 0;
    return visc_set_error("%s", load_error);
}

int visc_dnn_check(cudnnStatus_t s, const char *what) {
    if (s == CUDNN_STATUS_SUCCESS) return 0;
    if (!visc_dnn.error_string) return visc_set_error("%s: cuDNN status %d", what, (int)s);
    return visc_set_error("%s: %s", what, visc_dnn.error_string(s));
}
#endif

/* cudnn_dl.cuh: cuDNN's entry points, loaded with dlopen by the first
 * convolution (cudnn_dl.cu), and the context's cuDNN state (conv.cu).
 * Only the convolution files include cudnn.h. */
#ifndef VISC_CUDA_CUDNN_DL_CUH
#define VISC_CUDA_CUDNN_DL_CUH

#include <cudnn.h>

#include "common.cuh"

typedef struct {
    decltype(&cudnnCreate) create;
    decltype(&cudnnDestroy) destroy;
    decltype(&cudnnSetStream) set_stream;
    decltype(&cudnnGetErrorString) error_string;
    decltype(&cudnnCreateTensorDescriptor) tensor_create;
    decltype(&cudnnDestroyTensorDescriptor) tensor_destroy;
    decltype(&cudnnSetTensor4dDescriptor) tensor_set;
    decltype(&cudnnCreateFilterDescriptor) filter_create;
    decltype(&cudnnDestroyFilterDescriptor) filter_destroy;
    decltype(&cudnnSetFilter4dDescriptor) filter_set;
    decltype(&cudnnCreateConvolutionDescriptor) conv_create;
    decltype(&cudnnDestroyConvolutionDescriptor) conv_destroy;
    decltype(&cudnnSetConvolution2dDescriptor) conv_set;
    decltype(&cudnnSetConvolutionMathType) conv_math;
    decltype(&cudnnGetConvolutionForwardAlgorithm_v7) fwd_algos;
    decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7) bwd_data_algos;
    decltype(&cudnnGetConvolutionBackwardFilterAlgorithm_v7) bwd_filter_algos;
    decltype(&cudnnFindConvolutionForwardAlgorithm) fwd_find;
    decltype(&cudnnFindConvolutionBackwardDataAlgorithm) bwd_data_find;
    decltype(&cudnnFindConvolutionBackwardFilterAlgorithm) bwd_filter_find;
    decltype(&cudnnGetConvolutionForwardWorkspaceSize) fwd_ws;
    decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize) bwd_data_ws;
    decltype(&cudnnGetConvolutionBackwardFilterWorkspaceSize) bwd_filter_ws;
    decltype(&cudnnConvolutionForward) fwd;
    decltype(&cudnnConvolutionBackwardData) bwd_data;
    decltype(&cudnnConvolutionBackwardFilter) bwd_filter;
} visc_dnn_api;
extern visc_dnn_api visc_dnn;
/* 0 once the table is filled (thread-safe, loads once); -1 with the reason. */
int visc_dnn_load(void);
/* 0 if ok, else -1 with "<what>: <cuDNN's message>" as the error. */
int visc_dnn_check(cudnnStatus_t s, const char *what);

#endif

/* standin.h: what the stand-in GPU's files share: cpu_standin.c (the
 * kernels, memory and copies), standin_nhwc.c (bf16 channels-last
 * tensors) and standin_nccl.c (NCCL's part). */
#ifndef VISC_TESTS_GPU_STANDIN_H
#define VISC_TESTS_GPU_STANDIN_H

#include <stddef.h>
#include <stdint.h>

#include "visc/cuda.h"

#define STANDIN_MAX_IN_FLIGHT 8
/* An event: the asynchronous copies recorded on it (their host memory must
 * not change before it is waited for), and the stand-in NCCL's work it
 * marks. */
struct visc_cuda_event {
    struct {
        const unsigned char *src;
        size_t bytes;
        uint64_t hash;
    } in_flight[STANDIN_MAX_IN_FLIGHT];
    int count;
    int64_t nccl_seq; /* done once the stand-in NCCL has finished this many all-reduces */
};

/* 1 once the NCCL work e marks is done (or it marks none). */
int standin_nccl_done(const visc_cuda_event *e);
/* Ends the stand-in NCCL of this process (visc_cuda_close). */
void standin_nccl_close(void);

/* A bf16 channels-last tensor [N, HW, C] as a new fp32 NCHW one
 * (visc_free_aligned), and an fp32 NCHW one into bf16 channels-last,
 * rounded to nearest even. */
float *standin_nhwc_to_nchw(const void *src, int N, int C, int HW);
void standin_nchw_to_nhwc(void *dst, const float *src, int N, int C, int HW);

#endif

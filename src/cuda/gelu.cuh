/* gelu.cuh: GELU in its exact erf form (torch.nn.GELU()) and its
 * derivative, for every kernel that applies them (gelu.cu; context.cu's
 * column sums, which take GELU' into a linear layer's dY):
 *   y  = x Phi(x),            Phi(x) = erfc(-x / sqrt 2) / 2
 *   y' = Phi(x) + x phi(x),   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
 * Phi through erfcf keeps its precision for large negative x, where
 * 1 + erf(x) would cancel. */
#ifndef VISC_CUDA_GELU_CUH
#define VISC_CUDA_GELU_CUH

#define VISC_INV_SQRT2 0.70710678118654752f
#define VISC_INV_SQRT_2PI 0.39894228040143268f

__device__ __forceinline__ float visc_gelu(float x) { return x * 0.5f * erfcf(-x * VISC_INV_SQRT2); }
__device__ __forceinline__ float visc_gelu_grad(float x) {
    return 0.5f * erfcf(-x * VISC_INV_SQRT2) + x * VISC_INV_SQRT_2PI * expf(-0.5f * x * x);
}

#endif

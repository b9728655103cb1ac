/* gelu_linear.c: GELU followed by a linear layer (the second half of a
 * transformer MLP), with the GELU output kept for backward.
 *
 * In bf16 mode (visc_set_matmul_precision) the linear layer only ever sees
 * its input rounded to bf16, in forward and in the weight gradient, so the
 * GELU writes that rounded form directly into `act` instead of fp32: a
 * quarter of a Swin-T step's rounding work (and of the GELU's stores)
 * disappears, with bit-identical results to visc_gelu_forward followed by
 * visc_linear_forward. Otherwise (fp32, or a shape without bf16 kernels) it
 * is exactly those two calls. The choice is a function of the precision and
 * the shape, so forward and backward always agree on what `act` holds. */
#include "linear_bf16.h"
#include "visc/nn.h"
#include "visc/tokens.h"

void visc_gelu_linear_act(float *act, const float *h, int N, int hidden, int out_features,
                          int has_bias) {
    const size_t n = (size_t)N * hidden;
    /* act's storage is untyped (an arena or malloc block): in bf16 it holds bf16 */
    if (visc_linear_bf16_ready(N, hidden, out_features, has_bias))
        visc_gelu_forward_bf16((void *)act, h, n);
    else visc_gelu_forward(act, h, n);
}

void visc_gelu_linear_forward(float *out, float *act, const float *h, const float *weight,
                              const float *bias, int N, int hidden, int out_features) {
    visc_gelu_linear_act(act, h, N, hidden, out_features, bias != NULL);
    if (!visc_linear_bf16_ready(N, hidden, out_features, bias != NULL)) {
        visc_linear_forward(out, act, weight, bias, N, hidden, out_features);
        return;
    }
    if (visc_linear_bf16_forward_rounded(out, (const void *)act, weight, bias, N, hidden,
                                         out_features) != 0)
        visc_die("gelu_linear: bf16 product unavailable after the check");
}

void visc_gelu_linear_backward(float *dh, float *dweight, float *dbias, const float *dout,
                               const float *act, const float *h, const float *weight, int N,
                               int hidden, int out_features) {
    if (visc_linear_bf16_ready(N, hidden, out_features, dbias != NULL)) {
        if (visc_linear_bf16_backward_rounded(dh, dweight, dbias, dout, (const void *)act, weight,
                                              N, hidden, out_features) != 0)
            visc_die("gelu_linear: bf16 product unavailable after the check");
    } else {
        visc_linear_backward(dh, dweight, dbias, dout, act, weight, N, hidden, out_features);
    }
    visc_gelu_backward(dh, dh, h, (size_t)N * hidden);
}

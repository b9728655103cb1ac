#!/usr/bin/python3
"""gen_golden_tokens.py: PyTorch reference outputs for the token-layer parity test.

Run with Debian's PyTorch (torch 1.13) and timm:
    /usr/bin/python3 tools/gen_golden_tokens.py      # writes tests/golden/tokens.safetensors

Read by tests/test_tokens_parity.c. As in gen_golden.py, inputs are float32,
references are computed in float64 and stored as float32, so the C test
measures only visc's own fp32 error. Each case's shape is in "<case>.config"
(int32); attention tensors are stored as [B, H, N, D] and the C test lays
them out in its strided layouts itself.

Cases:
  ln<i>.*     F.layer_norm, forward and backward (with and without affine)
  gelu.*      F.gelu (erf form), forward and backward
  attn<i>.*   attention written out as timm's Attention / Swin's
              WindowAttention do it: (q @ k^T) * scale (or a per-head scale)
              + relative bias [H, N, N] + window mask [nW, N, N] (the batch
              viewed as [B / nW, nW, ...]), softmax, @ v
  pos<i>.*    timm's resample_abs_pos_embed (bicubic, align_corners=False)
              with antialias=False, i.e. F.interpolate's plain bicubic
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import OUT_DIR, f32, save_safetensors  # noqa: E402

D64 = torch.float64


def main():
    torch.manual_seed(7)
    out = {}

    def rand(*shape, scale=1.0, shift=0.0):
        t = (torch.randn(*shape) * scale + shift).to(torch.float32)
        return t.to(D64)

    def put(name, t):
        out[name] = t.numpy() if t.dtype == torch.int32 else f32(t)

    def config(pre, vals):
        put(pre + "config", torch.tensor(vals, dtype=torch.int32))

    # ---- layernorm: (rows, C, affine, shift, eps_exponent) ----
    for i, (rows, C, affine, shift, eps_e) in enumerate([(6, 32, 1, 0.0, 6), (5, 20, 0, 2.0, 5),
                                                         (3, 96, 1, -4.0, 5)]):
        pre = f"ln{i}."
        x = rand(rows, C, scale=1.5, shift=shift).requires_grad_()
        gamma = rand(C, scale=0.3, shift=1.0).requires_grad_() if affine else None
        beta = rand(C, scale=0.3).requires_grad_() if affine else None
        y = F.layer_norm(x, (C,), gamma, beta, eps=10.0 ** -eps_e)
        dy = rand(rows, C)
        y.backward(dy)
        config(pre, [rows, C, affine, eps_e])
        put(pre + "x", x), put(pre + "y", y), put(pre + "dy", dy), put(pre + "dx", x.grad)
        if affine:
            put(pre + "gamma", gamma), put(pre + "beta", beta)
            put(pre + "dgamma", gamma.grad), put(pre + "dbeta", beta.grad)

    # ---- gelu ----
    x = rand(300, scale=2.5).requires_grad_()
    y = F.gelu(x)
    dy = rand(300)
    y.backward(dy)
    config("gelu.", [300])
    put("gelu.x", x), put("gelu.y", y), put("gelu.dy", dy), put("gelu.dx", x.grad)

    # ---- attention: (B, H, Nq, Nk, D, layout, bias, nmask, head_scale) ----
    # layout as in the C test: 0 separate [B, H, N, D]; 1 fused qkv [B, N, 3, H, D];
    # 2 separate [B, N, H, D]
    attns = [
        (2, 3, 17, 17, 16, 1, 0, 0, 0),   # ViT
        (4, 2, 9, 9, 8, 1, 1, 2, 0),      # Swin V1 window attention, shifted
        (4, 2, 9, 9, 8, 1, 1, 2, 1),      # Swin V2 (cosine attention's logit scale)
        (3, 2, 1, 10, 8, 2, 0, 0, 0),     # CaiT class attention
        (2, 2, 5, 9, 8, 0, 1, 0, 1),      # cross attention, Nq != Nk
    ]
    for i, (B, H, Nq, Nk, D, layout, has_bias, nmask, has_hs) in enumerate(attns):
        pre = f"attn{i}."
        q = rand(B, H, Nq, D).requires_grad_()
        k = rand(B, H, Nk, D).requires_grad_()
        v = rand(B, H, Nk, D).requires_grad_()
        scale = D ** -0.5
        if has_hs:
            hs = (rand(H, scale=0.1, shift=0.4)).requires_grad_()
            attn = (q @ k.transpose(-2, -1)) * hs.view(1, H, 1, 1)
        else:
            attn = (q @ k.transpose(-2, -1)) * torch.tensor(scale, dtype=torch.float32).to(D64)
        if has_bias:
            bias = rand(H, Nq, Nk, scale=0.5).requires_grad_()
            attn = attn + bias.unsqueeze(0)
        if nmask:
            m = (torch.rand(nmask, Nq, Nk) < 0.3).to(D64) * -100.0
            m = m * (1 - torch.eye(Nq, Nk, dtype=D64))   # every row keeps its diagonal
            attn = attn.view(B // nmask, nmask, H, Nq, Nk) + m.unsqueeze(1).unsqueeze(0)
            attn = attn.view(B, H, Nq, Nk)
        lse = torch.logsumexp(attn, dim=-1)
        o = attn.softmax(dim=-1) @ v
        do = rand(B, H, Nq, D)
        o.backward(do)
        config(pre, [B, H, Nq, Nk, D, layout, has_bias, nmask, has_hs])
        put(pre + "q", q), put(pre + "k", k), put(pre + "v", v)
        put(pre + "out", o), put(pre + "lse", lse), put(pre + "dout", do)
        put(pre + "dq", q.grad), put(pre + "dk", k.grad), put(pre + "dv", v.grad)
        if has_bias:
            put(pre + "bias", bias), put(pre + "dbias", bias.grad)
        if nmask:
            put(pre + "mask", m)
        if has_hs:
            put(pre + "head_scale", hs), put(pre + "dhead_scale", hs.grad)

    # ---- pos_embed: (old_h, old_w, new_h, new_w, C) ----
    from timm.layers import resample_abs_pos_embed
    for i, (oh, ow, nh, nw, C) in enumerate([(4, 4, 8, 8, 6), (7, 5, 3, 9, 4), (14, 14, 4, 4, 3)]):
        pre = f"pos{i}."
        grid = rand(1, oh * ow, C)
        ref = F.interpolate(grid.reshape(1, oh, ow, C).permute(0, 3, 1, 2), size=(nh, nw),
                            mode="bicubic", align_corners=False).permute(0, 2, 3, 1)
        # timm itself interpolates in float32; it agrees to fp32 rounding.
        r = resample_abs_pos_embed(grid, (nh, nw), (oh, ow), num_prefix_tokens=0,
                                   interpolation="bicubic", antialias=False)
        assert torch.allclose(r.reshape(1, nh, nw, C), ref, atol=1e-5)
        config(pre, [oh, ow, nh, nw, C])
        put(pre + "in", grid), put(pre + "out", ref)

    os.makedirs(OUT_DIR, exist_ok=True)
    save_safetensors(os.path.join(OUT_DIR, "tokens.safetensors"), out,
                     {"generator": "tools/gen_golden_tokens.py", "torch": torch.__version__})


if __name__ == "__main__":
    main()

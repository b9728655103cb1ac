#!/usr/bin/python3
"""gen_golden_swin.py: timm 0.9.16 references for the Swin V1/V2 tests.

Run with Debian's PyTorch (torch 1.13) and pip's timm 0.9.16:
    /usr/bin/python3 tools/gen_golden_swin.py     # writes tests/golden/swin_*.safetensors

Files:
  swin_masks.safetensors   timm's shifted-window attn_mask, relative_position_index,
                           V2 relative_coords_table and the roll + window_partition
                           order, for square and non-square token grids
  swin_names.safetensors   metadata only: timm's state_dict (name:shape list) of
                           every Swin model visc builds (10 classes)
  swin_<case>.safetensors  parity cases: hash-filled weights (tests/golden.h plus the
                           Swin rules below), logits, label-smoothed (0.1)
                           cross-entropy and every parameter's gradient (tensors of
                           more than FULL_LIMIT elements as SAMPLES samples + norm)

References are computed in float64 from the float32 weights and inputs (see
gen_golden.py); torch's own float32 error is recorded in the metadata so the
C test can refuse an ill-conditioned case.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_golden as gg  # noqa: E402  (safetensors writer and the shared hash fill)
import timm  # noqa: E402
from timm.models import swin_transformer as sw1  # noqa: E402
from timm.models import swin_transformer_v2 as sw2  # noqa: E402

OUT = gg.OUT_DIR
FULL_LIMIT = 256
SAMPLES = 128
K = 10  # classes


# ---- the Swin fill rules (mirrored by swin_kind() in tests/test_swin_parity.c) ----

def swin_kind(name, shape):
    if name.endswith("relative_position_bias_table"):
        return np.float32(2.0), np.float32(0.0)
    if name.endswith("logit_scale"):
        # exp() in [6, 16] around timm's init of 10. Temperatures near the clamp
        # (100) make the hash-filled V2 chaotic: torch's own fp32 gradients were
        # then 2e-3 off float64 (swinv2_tiny). The clamp has its own C test.
        return np.float32(1.0), np.float32(2.3)
    if name.endswith("q_bias") or name.endswith("v_bias"):
        return np.float32(0.2), np.float32(0.0)
    return gg.hash_kind(name, shape)


def hash_fill(name, shape):
    scale, offset = swin_kind(name, shape)
    u = gg.hash_u01(gg.fnv1a(name), int(np.prod(shape)))
    return ((u - np.float32(0.5)) * scale + offset).reshape(shape)


def fill(model):
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(torch.from_numpy(hash_fill(k, tuple(v.shape))))


# ---- models: timm's registered ones, and visc's 32 px ones built from the same classes ----

SMALL = {
    "swin_tiny_patch2_window4_32": (sw1.SwinTransformer, dict(
        patch_size=2, window_size=4, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))),
    "swinv2_tiny_patch2_window4_32": (sw2.SwinTransformerV2, dict(
        patch_size=2, window_size=4, embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))),
    "swin_micro_patch2_window4_32": (sw1.SwinTransformer, dict(
        patch_size=2, window_size=4, embed_dim=32, depths=(2, 2, 2), num_heads=(2, 4, 8))),
    "swinv2_micro_patch2_window4_32": (sw2.SwinTransformerV2, dict(
        patch_size=2, window_size=4, embed_dim=32, depths=(2, 2, 2), num_heads=(2, 4, 8))),
}


def build(arch, in_chans, img):
    kw = dict(num_classes=K, in_chans=in_chans, img_size=img, drop_path_rate=0.0)
    if arch in SMALL:
        cls, args = SMALL[arch]
        return cls(**args, **kw)
    return timm.create_model(arch, **kw)


def names_meta(model):
    return ";".join(f"{k}:{'x'.join(str(d) for d in v.shape)}" for k, v in model.state_dict().items())


# ---- parity cases ----

def run(model, x, labels, dtype):
    model = model.to(dtype)
    model.zero_grad()
    logits = model(x.to(dtype))
    loss = F.cross_entropy(logits, labels, label_smoothing=0.1)
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def rel_err(a, b):
    """max |a - b| / max |b| (the C test's elementwise measure)."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def norm_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def parity_case(fname, arch, in_chans, img, batch):
    torch.manual_seed(0)
    model = build(arch, in_chans, img)
    model.train()  # drop-path 0, so train = eval apart from nothing
    fill(model)
    n = batch * in_chans * img * img
    x = torch.from_numpy(((gg.hash_u01(gg.fnv1a("input"), n) - np.float32(0.5)) * np.float32(2.0))
                         .reshape(batch, in_chans, img, img))
    labels = torch.tensor([(3 * i + 1) % K for i in range(batch)])
    l64, loss64, g64 = run(model, x, labels, torch.float64)
    l32, loss32, g32 = run(model, x, labels, torch.float32)
    out = {"logits": gg.f32(l64), "loss": gg.f32(loss64.reshape(1))}
    gmax = gnorm = 0.0
    for k, g in g64.items():
        g = g.reshape(-1)
        gmax = max(gmax, rel_err(g32[k].reshape(-1), g))
        gnorm = max(gnorm, norm_err(g32[k].reshape(-1), g))
        if g.numel() <= FULL_LIMIT:
            out["grad." + k] = gg.f32(g)
        else:
            stride = g.numel() // SAMPLES
            out["grad." + k + ":sample"] = gg.f32(g[::stride][:SAMPLES])
            out["grad." + k + ":norm"] = gg.f32(g.norm().reshape(1))
    meta = {
        "arch": arch, "in_channels": in_chans, "image": img, "batch": batch,
        "params": len(g64), "names": names_meta(model),
        "torch_fp32_err.logits": f"{rel_err(l32, l64):.3g}",
        "torch_fp32_err.grad_max": f"{gmax:.3g}",
        "torch_fp32_err.grad_norm": f"{gnorm:.3g}",
    }
    gg.save_safetensors(os.path.join(OUT, fname), out, meta)


# ---- masks and index tables ----

def mask_cases():
    out, meta = {}, {}
    # (H, W, window): square and non-square grids, including axes that fit one window
    grids = [(14, 14, 7), (8, 8, 4), (16, 16, 8), (8, 12, 4), (16, 4, 8), (4, 12, 4), (12, 8, 4)]
    for ci, (H, W, win) in enumerate(grids):
        blk = sw1.SwinTransformerBlock(dim=8, input_resolution=(H, W), num_heads=2,
                                       window_size=win, shift_size=win // 2)
        blk2 = sw2.SwinTransformerV2Block(dim=8, input_resolution=(H, W), num_heads=2,
                                          window_size=win, shift_size=win // 2)
        assert blk.window_size == blk2.window_size and blk.shift_size == blk2.shift_size
        assert torch.equal(blk.attn_mask, blk2.attn_mask)
        wh, ww = blk.window_size
        sh, sw = blk.shift_size
        pre = f"case{ci}."
        out[pre + "config"] = np.array([H, W, win, wh, ww, sh, sw], dtype=np.int32)
        out[pre + "attn_mask"] = gg.f32(blk.attn_mask)
        out[pre + "relative_position_index"] = blk.attn.relative_position_index.to(torch.int32).numpy()
        assert torch.equal(blk.attn.relative_position_index, blk2.attn.relative_position_index)
        out[pre + "relative_coords_table"] = gg.f32(blk2.attn.relative_coords_table.reshape(-1, 2))
        # which token each windowed row holds: roll by -shift, then window_partition
        ids = torch.arange(H * W, dtype=torch.float32).reshape(1, H, W, 1)
        rolled = torch.roll(ids, shifts=(-sh, -sw), dims=(1, 2))
        out[pre + "order"] = sw1.window_partition(rolled, (wh, ww)).reshape(-1).to(torch.int32).numpy()
    meta["cases"] = len(grids)
    gg.save_safetensors(os.path.join(OUT, "swin_masks.safetensors"), out, meta)


def names_file():
    meta = {}
    for arch in ["swin_tiny_patch4_window7_224", "swin_small_patch4_window7_224",
                 "swin_base_patch4_window7_224", "swinv2_tiny_window8_256",
                 "swinv2_small_window8_256", "swinv2_base_window8_256"] + list(SMALL):
        model = build(arch, 3, 32 if arch in SMALL else (224 if "224" in arch else 256))
        meta[arch] = names_meta(model)
    gg.save_safetensors(os.path.join(OUT, "swin_names.safetensors"),
                        {"dummy": np.zeros(1, dtype=np.float32)}, meta)


if __name__ == "__main__":
    torch.set_num_threads(2)
    which = sys.argv[1:] or ["masks", "names", "parity"]
    if "masks" in which:
        mask_cases()
    if "names" in which:
        names_file()
    if "parity" in which:
        parity_case("swin_tiny.safetensors", "swin_tiny_patch4_window7_224", 3, 224, 1)
        parity_case("swinv2_tiny.safetensors", "swinv2_tiny_window8_256", 3, 256, 1)
        parity_case("swin_micro.safetensors", "swin_micro_patch2_window4_32", 1, 32, 2)
        parity_case("swinv2_micro.safetensors", "swinv2_micro_patch2_window4_32", 1, 32, 2)
        parity_case("swin_tiny32.safetensors", "swin_tiny_patch2_window4_32", 3, 32, 2)
        parity_case("swinv2_tiny32.safetensors", "swinv2_tiny_patch2_window4_32", 3, 32, 2)

#!/usr/bin/python3
"""gen_golden_vit.py: timm references for the ViT / DeiT / CaiT parity tests.

Run with Debian's PyTorch (torch 1.13) and timm 0.9.16:
    /usr/bin/python3 tools/gen_golden_vit.py      # writes tests/golden/vit_*.safetensors

Each case builds the model with timm itself (timm.create_model, or timm's
VisionTransformer class with the hyperparameters of a visc-only small-image
variant), fills every parameter from the integer hash shared with the C side
(tools/gen_golden.py + tests/golden.h, extended below for the tensors a
ResNet does not have), and fills the input batch from the same hash, so the
file stores no weights and no images. The reference is computed in float64
from those float32 values: logits, the label-smoothed (0.1) cross-entropy,
one backward, and then
  grad_norms          the L2 norm of every parameter's gradient, state_dict order
  grad.<name>         selected gradients in full (<= 1024 elements) or as
  grad.<name>:sample  256 samples at indices i * (numel // 256)
The femto case also holds its hash-filled pos_embed refitted from the 7x7
grid to 4x4 and 10x10, by plain bicubic and by timm's resample_abs_pos_embed.
The metadata records torch's own fp32 error on the same case (worst tensor,
relative to max|want|), so the test can reject a case fp32 cannot match.

Extra hash rules (mirrored in tests/test_vit_parity.c):
  cls_token, pos_embed   +-0.1            (scale 0.2, offset 0)
  *.gamma_1, *.gamma_2   0.3 +- 0.1       (CaiT's LayerScale; timm's 1e-5
                                           would hide the blocks' gradients)
  input x                U(-1, 1)         (tensor name "input", scale 2)
Labels are (3 b + 1) % classes.

vit_params.safetensors stores, for the models too big for a forward here,
the "name:shape" list of timm's state_dict (metadata "params.<arch>").
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_golden as gg  # noqa: E402  (hash fill and safetensors writer)

import timm  # noqa: E402
from timm.layers import resample_abs_pos_embed  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

OUT_DIR = gg.OUT_DIR
SAMPLES = 256
FULL_LIMIT = 1024
SMOOTHING = 0.1
GRAD_FLOOR = 1e-3  # mirrored in tests/test_vit_parity.c


def hash_kind(name, shape):
    if name in ("cls_token", "pos_embed"):
        return np.float32(0.2), np.float32(0.0)
    if name.endswith(".gamma_1") or name.endswith(".gamma_2"):
        return np.float32(0.2), np.float32(0.3)
    if name == "input":
        return np.float32(2.0), np.float32(0.0)
    return gg.hash_kind(name, shape)


def hash_fill(name, shape):
    scale, offset = hash_kind(name, shape)
    u = gg.hash_u01(gg.fnv1a(name), int(np.prod(shape)))
    v = (u - np.float32(0.5)) * scale + offset
    assert v.dtype == np.float32
    return v.reshape(shape)


def fill_model(model):
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(torch.from_numpy(hash_fill(k, tuple(v.shape))))


def small_vit(img, patch, embed, depth, heads, in_chans, classes):
    """A visc small-image variant as timm's own VisionTransformer class."""
    return VisionTransformer(img_size=img, patch_size=patch, in_chans=in_chans,
                             num_classes=classes, embed_dim=embed, depth=depth,
                             num_heads=heads)


def run(make, dtype, x, labels):
    model = make().to(dtype)
    fill_model(model)
    model.train()
    logits = model(x.to(dtype))
    loss = F.cross_entropy(logits, labels, label_smoothing=SMOOTHING)
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads, model


def rel_err(got, want, floor=0.0):
    """max |got - want| / max(max|want|, floor)."""
    want = want.to(torch.float64)
    got = got.to(torch.float64)
    scale = max(want.abs().max().item(), floor)
    return (got - want).abs().max().item() / scale if scale > 0 else 0.0


def norm_err(got, want, floor=0.0):
    want = want.to(torch.float64)
    got = got.to(torch.float64)
    n = max(want.norm().item(), floor)
    return (got - want).norm().item() / n if n > 0 else 0.0


def golden_case(make, in_chans, img, batch, classes, selected, pos_grid=()):
    x = torch.from_numpy(hash_fill("input", (batch, in_chans, img, img)))
    labels = torch.tensor([(3 * b + 1) % classes for b in range(batch)])
    logits, loss, grads, model = run(make, torch.float64, x, labels)
    logits32, loss32, grads32, _ = run(make, torch.float32, x, labels)
    names = [k for k, _ in model.named_parameters()]
    assert names == list(model.state_dict().keys())
    out = {"logits": gg.f32(logits), "loss": gg.f32(loss.reshape(1)),
           "labels": np.array([int(v) for v in labels], dtype=np.int32)}
    out["grad_norms"] = np.array([grads[k].norm().item() for k in names], dtype=np.float32)
    for k in selected:
        g = grads[k].reshape(-1)
        if g.numel() <= FULL_LIMIT:
            out["grad." + k] = gg.f32(g)
        else:
            stride = g.numel() // SAMPLES
            out["grad." + k + ":sample"] = gg.f32(g[::stride][:SAMPLES])
    # Some gradients are 0 in exact arithmetic (CaiT's proj_l.bias: a per-head
    # constant added before a softmax); they are measured against a floor of
    # GRAD_FLOOR x the largest gradient instead of their own ~1e-17 scale.
    top_max = max(grads[k].abs().max().item() for k in names)
    top_norm = max(grads[k].norm().item() for k in names)
    gmax = max(rel_err(grads32[k], grads[k], GRAD_FLOOR * top_max) for k in names)
    gnorm = max(norm_err(grads32[k], grads[k], GRAD_FLOOR * top_norm) for k in names)
    meta = {
        "params": len(names),
        "param_numel": sum(grads[k].numel() for k in names),
        "param_list": ";".join(f"{k}:{'x'.join(str(d) for d in grads[k].shape)}" for k in names),
        "torch_fp32_err.logits": f"{rel_err(logits32, logits):.3e}",
        "torch_fp32_err.grad_max": f"{gmax:.3e}",
        "torch_fp32_err.grad_norm": f"{gnorm:.3e}",
        "generator": "tools/gen_golden_vit.py", "torch": torch.__version__,
        "timm": timm.__version__,
    }
    if pos_grid:
        # pos_embed refitted to another grid: plain bicubic (F.interpolate,
        # align_corners=False), and timm's resample_abs_pos_embed (antialias=True)
        pe = torch.from_numpy(hash_fill("pos_embed", tuple(model.pos_embed.shape)))
        hw = int(round((pe.shape[1] - 1) ** 0.5))
        grid = pe[:, 1:].reshape(1, hw, hw, -1).permute(0, 3, 1, 2).to(torch.float64)
        for g in pos_grid:
            r = F.interpolate(grid, size=(g, g), mode="bicubic", align_corners=False)
            r = torch.cat([pe[:, :1].to(torch.float64), r.permute(0, 2, 3, 1).reshape(1, g * g, -1)], 1)
            out[f"pos_embed_bicubic_{g}"] = gg.f32(r)
            out[f"pos_embed_timm_{g}"] = gg.f32(resample_abs_pos_embed(pe, [g, g]))
    print(f"  loss {loss.item():.6f}; torch fp32 err: logits {meta['torch_fp32_err.logits']} "
          f"grad {gmax:.2e}/{gnorm:.2e}")
    return out, meta


VIT_SELECTED = ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias",
                "blocks.0.norm1.weight", "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias",
                "blocks.1.mlp.fc1.weight", "blocks.{L}.attn.proj.weight",
                "blocks.{L}.mlp.fc2.bias", "blocks.{L}.norm2.bias", "norm.weight", "norm.bias",
                "head.weight", "head.bias"]
CAIT_SELECTED = ["cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.gamma_1",
                 "blocks.0.attn.qkv.weight", "blocks.0.attn.proj_l.weight",
                 "blocks.0.attn.proj_l.bias", "blocks.0.attn.proj_w.weight",
                 "blocks.0.attn.proj_w.bias", "blocks.23.gamma_2", "blocks.23.mlp.fc2.weight",
                 "blocks_token_only.0.attn.q.weight", "blocks_token_only.0.attn.k.bias",
                 "blocks_token_only.0.attn.v.weight", "blocks_token_only.0.norm1.weight",
                 "blocks_token_only.1.gamma_1", "blocks_token_only.1.mlp.fc1.weight",
                 "norm.weight", "head.weight", "head.bias"]


def vit_sel(depth):
    return [s.replace("{L}", str(depth - 1)) for s in VIT_SELECTED]


# (file, make, in_chans, image, batch, classes, selected)
CASES = [
    ("vit_tiny_patch16_224",
     lambda: timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10),
     3, 224, 2, 10, vit_sel(12)),
    ("vit_tiny_patch4_32", lambda: small_vit(32, 4, 192, 12, 3, 3, 10), 3, 32, 2, 10, vit_sel(12)),
    ("vit_femto_patch4_28", lambda: small_vit(28, 4, 64, 4, 2, 1, 10), 1, 28, 4, 10, vit_sel(4)),
    ("cait_xxs24_64",
     lambda: timm.create_model("cait_xxs24_224", pretrained=False, num_classes=10, img_size=64),
     3, 64, 2, 10, CAIT_SELECTED),
]

# Parameter lists only: (visc arch, how timm builds it).
LISTS = [
    ("vit_small_patch16_224", lambda: timm.create_model("vit_small_patch16_224", num_classes=1000)),
    ("vit_base_patch16_224", lambda: timm.create_model("vit_base_patch16_224", num_classes=1000)),
    ("deit_tiny_patch16_224", lambda: timm.create_model("deit_tiny_patch16_224", num_classes=1000)),
    ("deit_small_patch16_224",
     lambda: timm.create_model("deit_small_patch16_224", num_classes=1000)),
    ("deit_base_patch16_224", lambda: timm.create_model("deit_base_patch16_224", num_classes=1000)),
    ("cait_s24_224", lambda: timm.create_model("cait_s24_224", num_classes=1000)),
    ("vit_small_patch4_32", lambda: small_vit(32, 4, 384, 12, 6, 3, 1000)),
    ("vit_pico_patch4_28", lambda: small_vit(28, 4, 96, 6, 3, 1, 1000)),
]


def main():
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    which = set(sys.argv[1:])
    for fname, make, cin, img, batch, classes, sel in CASES:
        if which and fname not in which:
            continue
        print(fname)
        torch.manual_seed(0)
        out, meta = golden_case(make, cin, img, batch, classes, sel,
                                (4, 10) if fname == "vit_femto_patch4_28" else ())
        gg.save_safetensors(os.path.join(OUT_DIR, f"vit_{fname}.safetensors"
                                         if not fname.startswith("vit_") else f"{fname}.safetensors"),
                            out, meta)
    if not which or "lists" in which:
        meta = {"generator": "tools/gen_golden_vit.py", "timm": timm.__version__}
        for arch, make in LISTS:
            sd = make().state_dict()
            meta["params." + arch] = ";".join(
                f"{k}:{'x'.join(str(d) for d in v.shape)}" for k, v in sd.items())
            meta["numel." + arch] = str(sum(v.numel() for v in sd.values()))
        gg.save_safetensors(os.path.join(OUT_DIR, "vit_params.safetensors"),
                            {"dummy": np.zeros(1, np.float32)}, meta)
    print(json.dumps({"hash input[0..2]": [float(v) for v in hash_fill("input", (3,))]}))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Checks that a safetensors file written by visc loads into torchvision (ResNets)
or timm (ViT, DeiT, CaiT, Swin: timm 0.9.16, pip).

    /usr/bin/python3 tools/check_torch_load.py FILE [--model resnet18] [--num-classes 10]
        [--in-channels 1] [--image-size 28] [--eval-fashion-mnist]

--eval-fashion-mnist then runs the loaded model on the Fashion-MNIST test set
with visc's preprocessing (x / 255, normalized with 0.2860 / 0.3530, zero-
padded to --image-size) and prints loss / top-1 / top-5, to set beside
`visc train --model M --weights FILE --evaluate` (they agree to rounding).

Parses the file by hand (the format is simple, and this way the check does
not depend on visc's own reader nor on the safetensors package), converts
each tensor to the dtype the model's state dict uses (visc stores float32
everywhere except I64 counters such as BatchNorm's num_batches_tracked), and
calls load_state_dict(strict=True). Prints OK, or what is missing/unexpected
and exits 1. A dev tool, not part of the test suite."""
import argparse
import json
import os
import struct
import sys

import torch
import torchvision

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
          "U8": torch.uint8, "BOOL": torch.bool}


def load_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        sys.exit(f"{path}: header length {n} exceeds the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    if n % 8:
        print(f"note: header length {n} is not a multiple of 8", file=sys.stderr)
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    out, end_max = {}, 0
    for name, info in header.items():
        b, e = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        raw = bytearray(data[b:e])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
        end_max = max(end_max, e)
    if end_max != len(data):
        print(f"note: data section has {len(data) - end_max} trailing bytes", file=sys.stderr)
    return out, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--in-channels", type=int, default=3)
    ap.add_argument("--image-size", type=int, default=None,
                    help="input size the transformer was built for (default: the model's)")
    ap.add_argument("--eval-fashion-mnist", action="store_true",
                    help="also evaluate on the Fashion-MNIST test set (see above)")
    ap.add_argument("--small-stem", action="store_true",
                    help="3x3 stride-1 stem conv, no max-pool (visc --small-stem)")
    args = ap.parse_args()

    tensors, meta = load_safetensors(args.file)
    try:  # cross-check with the reference reader when it is installed
        from safetensors.torch import load_file
        ref = load_file(args.file)
        assert ref.keys() == tensors.keys(), "safetensors package sees other tensors"
        for k in ref:
            assert torch.equal(ref[k], tensors[k]), f"safetensors package reads {k} differently"
        print("safetensors package: same tensors", file=sys.stderr)
    except ImportError:
        pass

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timm_variants import is_timm_name, timm_model
    if is_timm_name(args.model):
        model = timm_model(args.model, args.num_classes, args.in_channels, args.image_size)
    else:
        model = getattr(torchvision.models, args.model)(num_classes=args.num_classes)
    if not is_timm_name(args.model) and (args.small_stem or args.in_channels != 3):
        k, st, p = (3, 1, 1) if args.small_stem else (7, 2, 3)
        model.conv1 = torch.nn.Conv2d(args.in_channels, model.conv1.out_channels, k, st, p, bias=False)
        if args.small_stem:
            model.maxpool = torch.nn.Identity()
    want = model.state_dict()
    state = {}
    for k, t in tensors.items():
        if k in want and want[k].shape != t.shape:
            sys.exit(f"{k}: file has shape {list(t.shape)}, model wants {list(want[k].shape)}")
        state[k] = t.to(want[k].dtype) if k in want else t
        if k in want and t.dtype != want[k].dtype:
            print(f"note: {k} stored as {t.dtype}, model uses {want[k].dtype}", file=sys.stderr)
    result = model.load_state_dict(state, strict=True)
    sd = model.state_dict()
    for k, t in state.items():
        assert torch.equal(sd[k], t), f"{k} changed while loading"
    print(f"OK {args.model} num_classes={args.num_classes}: {len(state)} tensors, metadata {meta} {result}")
    if args.eval_fashion_mnist:
        evaluate_fashion_mnist(model, args.image_size or 28)


def evaluate_fashion_mnist(model, size):
    import gzip
    import numpy as np
    import torch.nn.functional as F
    root = "/usr/share/datasets/fashion-mnist/"
    raw = gzip.open(root + "t10k-images-idx3-ubyte.gz").read()[16:]
    labels = gzip.open(root + "t10k-labels-idx1-ubyte.gz").read()[8:]
    x = torch.from_numpy(np.frombuffer(raw, np.uint8).reshape(-1, 1, 28, 28).astype(np.float32))
    pad = (size - 28) // 2
    x = F.pad(x / 255.0, (pad, size - 28 - pad, pad, size - 28 - pad))
    x = (x - 0.2860) / 0.3530
    y = torch.from_numpy(np.frombuffer(labels, np.uint8).astype(np.int64))
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(x[i:i + 500]) for i in range(0, len(x), 500)])
    top1 = (logits.argmax(1) == y).float().mean().item() * 100
    top5 = (logits.topk(5, 1).indices == y[:, None]).any(1).float().mean().item() * 100
    print(f"Fashion-MNIST test set ({len(x)} images): loss {F.cross_entropy(logits, y).item():.4f} "
          f"top1 {top1:.2f}% top5 {top5:.2f}%")


if __name__ == "__main__":
    main()

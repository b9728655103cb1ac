#!/usr/bin/python3
"""Checks that a safetensors file written by visc loads into torchvision.

    /usr/bin/python3 tools/check_torch_load.py FILE [--model resnet18] [--num-classes 10]

Parses the file by hand (the format is simple, and this way the check does
not depend on visc's own reader nor on the safetensors package), converts
each tensor to the dtype the model's state dict uses (visc stores float32
everywhere except I64 counters such as BatchNorm's num_batches_tracked), and
calls load_state_dict(strict=True). Prints OK, or what is missing/unexpected
and exits 1. A dev tool, not part of the test suite."""
import argparse
import json
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

    model = getattr(torchvision.models, args.model)(num_classes=args.num_classes)
    if args.small_stem or args.in_channels != 3:
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


if __name__ == "__main__":
    main()

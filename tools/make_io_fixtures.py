#!/usr/bin/python3
"""Writes tests/golden/io_fixture.safetensors with the Python safetensors
library (falls back to crafting the bytes by hand per the format spec), so
tests/test_io.c can check that visc reads files from the ecosystem exactly.
Also writes tests/golden/io_fixture.tfevents with PyTorch's TensorBoard
SummaryWriter (needs the tensorboard package; skipped without it).

Values are chosen to be exactly representable in their dtype, so the C test
states them as literals. Run: /usr/bin/python3 tools/make_io_fixtures.py"""
import json
import os
import struct
import sys

import torch

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden")
OUT = os.path.join(GOLDEN, "io_fixture.safetensors")
TB_OUT = os.path.join(GOLDEN, "io_fixture.tfevents")

# (tag, step, value): the C test repeats these.
TB_SCALARS = [("loss/train", 0, 2.5), ("loss/train", 7, 0.125), ("lr", 7, 0.001),
              ("loss/train", 1 << 40, -3.0)]


def tensors():
    return {
        "conv.weight": (torch.arange(6, dtype=torch.float32) * 0.5 - 1.25).reshape(2, 3),
        "half": torch.tensor([1.5, -2.0, 2.0**-24, 65504.0, 2.0**-14, -0.0], dtype=torch.float16),
        "brain": torch.tensor([1.0, -3.140625, 2.0**100, 0.0078125], dtype=torch.bfloat16),
        "double": torch.tensor([0.1, -1e10, 2.5], dtype=torch.float64),
        "bn.num_batches_tracked": torch.tensor(123456789, dtype=torch.int64),  # shape []
        "ints": torch.tensor([[-7, 0], [7, 2147483647]], dtype=torch.int32),
        "bytes": torch.tensor([0, 128, 255], dtype=torch.uint8),
        "mask": torch.tensor([True, False, True, True]),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
    }


METADATA = {"format": "pt", "source": "tools/make_io_fixtures.py"}


def save_by_hand(ts, path):
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
             torch.uint8: "U8", torch.bool: "BOOL"}
    header, blobs, off = {"__metadata__": METADATA}, [], 0
    for name in sorted(ts):
        t = ts[name].contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        if t.dtype == torch.bfloat16 and t.numel():
            raw = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    ts = tensors()
    try:
        from safetensors.torch import save_file
        save_file(ts, OUT, metadata=METADATA)
        how = "safetensors " + __import__("safetensors").__version__
    except ImportError:
        save_by_hand(ts, OUT)
        how = "hand-crafted bytes"
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes) with {how}", file=sys.stderr)

    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("tensorboard not installed: io_fixture.tfevents left as is", file=sys.stderr)
        return
    import glob
    import shutil
    import tempfile
    tmp = tempfile.mkdtemp()
    w = SummaryWriter(tmp)
    for tag, step, value in TB_SCALARS:
        w.add_scalar(tag, value, step)
    w.close()
    (src,) = glob.glob(os.path.join(tmp, "events.out.tfevents.*"))
    shutil.copyfile(src, TB_OUT)
    shutil.rmtree(tmp)
    print(f"wrote {os.path.normpath(TB_OUT)} ({os.path.getsize(TB_OUT)} bytes) with "
          "torch.utils.tensorboard", file=sys.stderr)


if __name__ == "__main__":
    main()

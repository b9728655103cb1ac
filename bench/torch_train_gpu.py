#!/usr/bin/env python3
"""torch_train_gpu.py: PyTorch's training speed on a GPU, the setting bench_train --device cuda measures.

The same step as bench/bench_train.c (a fixed random batch, CrossEntropyLoss,
SGD with momentum 0.9), with PyTorch at its best on the GPU as the CUDA
issue asks: bf16 autocast, channels_last for the CNNs, and optionally
torch.compile. Prints images/s and peak memory (torch.cuda.max_memory_allocated)
and one machine-readable "RESULT ..." line. The model comes from
bench/torch_train.py's build() (torchvision ResNets, timm transformers).
"""
import argparse
import os
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import build  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--in-channels", type=int, default=3)
    ap.add_argument("--small-stem", action="store_true")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_train_gpu: no CUDA device for PyTorch", file=sys.stderr)
        sys.exit(1)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model = build(args).to(dev).train()
    cnn = args.model.startswith("resnet")
    x = torch.randn(args.batch, args.in_channels, args.image_size, args.image_size, device=dev)
    y = torch.randint(0, args.classes, (args.batch,), device=dev)
    if cnn:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    run = torch.compile(model) if args.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    amp = args.precision == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(run(x), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    ips = args.steps * args.batch / dt
    mem = torch.cuda.max_memory_allocated() / 2**20
    mode = "compile" if args.compile else "eager"
    print("torch %s %s batch %d %dpx, %s %s%s: %.1f img/s, %.1f ms/step, peak %.0f MiB"
          % (torch.__version__, args.model, args.batch, args.image_size, args.precision, mode,
             ", channels_last" if cnn else "", ips, dt / args.steps * 1e3, mem))
    print("RESULT engine=torch-%s model=%s batch=%d res=%d img_s=%.2f ms_step=%.2f mem_mib=%.0f "
          "precision=%s" % (mode, args.model, args.batch, args.image_size, ips,
                            dt / args.steps * 1e3, mem, args.precision))


if __name__ == "__main__":
    main()

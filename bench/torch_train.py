#!/usr/bin/python3
"""torch_train.py: PyTorch's training speed on the setting bench_train measures.

The same step as bench/bench_train.c: torchvision ResNet (standard ImageNet
stem unless --small-stem) or timm's transformer of the same name, a fixed random batch, CrossEntropyLoss, SGD with
momentum 0.9, warm-up steps and then timed steps; prints images/s and one
machine-readable "RESULT ..." line.

Run it with Debian's PyTorch (/usr/bin/python3, torch 1.13) and
OPENBLAS_CORETYPE set for the CPU (Debian's OpenBLAS misdetects recent Xeons
and runs sgemm ~7x slower without SkylakeX; on the AVX2 EPYCs Zen is the
fastest; bench/train_vs_pytorch.sh picks it).

--channels-last auto (default) times a few steps in each memory format and
keeps the faster, so the comparison is against PyTorch at its best; the
RESULT line says which one ran. "CPU images/s" is as in bench_train.c:
images per CPU-second of the process times the thread count.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torchvision


def build(args):
    if not hasattr(torchvision.models, args.model):
        # transformers: timm itself, as visc's name mirrors it
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
        from timm_variants import timm_model
        return timm_model(args.model, args.classes, args.in_channels, args.image_size)
    ctor = getattr(torchvision.models, args.model)
    model = ctor(num_classes=args.classes)
    if args.in_channels != 3 or args.small_stem:
        k, s, p = (3, 1, 1) if args.small_stem else (7, 2, 3)
        model.conv1 = nn.Conv2d(args.in_channels, 64, k, s, p, bias=False)
    if args.small_stem:
        model.maxpool = nn.Identity()
    return model


def make_step(model, x, y, opt, loss_fn):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def timed_steps(step, warmup, steps, seconds):
    for _ in range(warmup):
        step()
    times = []
    total = 0.0
    c0 = time.process_time()
    while len(times) < steps or total < seconds:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        total += times[-1]
    return times, time.process_time() - c0


def setup(args, channels_last):
    torch.manual_seed(0)
    model = build(args).train()
    x = torch.randn(args.batch, args.in_channels, args.image_size, args.image_size)
    y = torch.randint(0, args.classes, (args.batch,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return make_step(model, x, y, opt, nn.CrossEntropyLoss())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--in-channels", type=int, default=3)
    ap.add_argument("--small-stem", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--channels-last", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--probe-steps", type=int, default=2,
                    help="steps timed per format when --channels-last auto")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if os.environ.get("OPENBLAS_CORETYPE") is None and not args.quiet:
        print("warning: OPENBLAS_CORETYPE is not set; Debian's OpenBLAS may pick a slow kernel")

    if args.channels_last == "auto":
        # Both formats alternately, best step of each: a load change on a
        # shared machine then hits both alike.
        steps = {cl: setup(args, cl) for cl in (False, True)}
        probe = {False: float("inf"), True: float("inf")}
        for cl in (False, True):
            steps[cl]()  # first call: allocation and kernel selection
        for _ in range(args.probe_steps):
            for cl in (False, True):
                probe[cl] = min(probe[cl], timed_steps(steps[cl], 0, 1, 0.0)[0][0])
        del steps
        channels_last = probe[True] < probe[False]
        if not args.quiet:
            print("probe: NCHW %.1f ms/step, channels_last %.1f ms/step"
                  % (probe[False] * 1e3, probe[True] * 1e3))
    else:
        channels_last = args.channels_last == "on"

    step = setup(args, channels_last)
    times, cpu = timed_steps(step, args.warmup, args.steps, args.seconds)
    total = sum(times)
    ips = len(times) * args.batch / total
    threads = torch.get_num_threads()
    cpu_ips = len(times) * args.batch / (cpu / threads)
    fmt = "channels_last" if channels_last else "nchw"
    if not args.quiet:
        print("torch %s %s batch %d %dpx, %d threads, %s: %d steps, median %.1f ms/step"
              % (torch.__version__, args.model, args.batch, args.image_size,
                 torch.get_num_threads(), fmt, len(times), statistics.median(times) * 1e3))
        print("%.1f img/s, %.1f ms/step" % (ips, total / len(times) * 1e3))
        print("CPU time %.1f ms/step over %d threads: %.1f img/s with the cores to itself"
              % (cpu / len(times) * 1e3, threads, cpu_ips))
    print("RESULT engine=torch model=%s batch=%d res=%d img_s=%.2f ms_step=%.2f cpu_img_s=%.2f "
          "threads=%d format=%s steps=%d"
          % (args.model, args.batch, args.image_size, ips, total / len(times) * 1e3, cpu_ips,
             threads, fmt, len(times)))


if __name__ == "__main__":
    main()

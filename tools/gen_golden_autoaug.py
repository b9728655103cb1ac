#!/usr/bin/python3
"""gen_golden_autoaug.py: timm / PIL / torch references for tests/test_autoaug.c.

Run with Debian's Python (PIL 9.4, torch 1.13) and the pip-installed timm 0.9.16:
    /usr/bin/python3 tools/gen_golden_autoaug.py   # writes tests/golden/autoaug.safetensors

Contents (all small; images are 40 x 32 RGB uint8, one 32 x 32):
  img.<i>                    the test images [H, W, 3] U8
  op.<n>.cfg / .arg / .out   one PIL op through timm's op function (NAME_TO_OP),
                             cfg = [op enum, image, bicubic], arg its argument
                             (float32-exact, so the C side reads the same double)
  chain.<n>.cfg / .mag / .out  timm's AugmentOp(name, prob=1, magnitude) with the
                             random sign forced: level -> argument -> op;
                             cfg = [op enum, image, bicubic, negate]
  level.cfg / level.mag / level.arg   LEVEL_TO_ARG for every op and a range of
                             magnitudes and both signs
  mix.<n>.*                  timm Mixup (mode 'batch') with a given lam and the
                             cutmix box timm drew: x in/out, targets, box, lam
  soft.*                     SoftTargetCrossEntropy in float64: loss, dlogits

The op enum order is visc_ra_op's in include/visc/autoaug.h; keep them in sync.
"""
import os
import sys
import random

import numpy as np
import torch
from PIL import Image

import timm.data.auto_augment as aa
import timm.data.mixup as tmix
from timm.loss import SoftTargetCrossEntropy
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import save_safetensors  # noqa: E402  (the shared writer)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                   "autoaug.safetensors")

OPS = ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "PosterizeIncreasing",
       "Solarize", "SolarizeIncreasing", "SolarizeAdd", "Color", "ColorIncreasing", "Contrast",
       "ContrastIncreasing", "Brightness", "BrightnessIncreasing", "Sharpness",
       "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]
FILL = (124, 116, 104)
BILINEAR, BICUBIC = Image.Resampling.BILINEAR, Image.Resampling.BICUBIC


def f32(v):
    """v rounded to float32 and back: the C test reads exactly this double."""
    return float(np.float32(v))


def make_images(rng):
    h, w = 32, 40
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 5 + yy * 2, 200 - xx * 3 + yy, (xx * yy) % 97 + 60], axis=-1)
    a = np.clip(base + rng.normal(0, 12, (h, w, 3)), 20, 235).astype(np.uint8)
    b = (70 + (a.astype(np.int32) * 100) // 255).astype(np.uint8)  # narrow range: 70..170
    c = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)             # full range, noisy
    d = np.ascontiguousarray(a[:, 4:36])                            # square 32 x 32
    return [a, b, c, d]


def run_op(name, img, arg, bicubic):
    fn = aa.NAME_TO_OP[name]
    kw = dict(fillcolor=FILL, resample=BICUBIC if bicubic else BILINEAR)
    args = () if arg is None else (arg,)
    return np.asarray(fn(img, *args, **kw))


class ForcedSign:
    """random.random() as _randomly_negate sees it: > 0.5 negates."""

    def __init__(self, negate):
        self.value = 0.9 if negate else 0.1

    def __enter__(self):
        self.saved = random.random
        random.random = lambda: self.value

    def __exit__(self, *exc):
        random.random = self.saved


def main():
    rng = np.random.default_rng(1234)
    images = make_images(rng)
    pil = [Image.fromarray(i) for i in images]
    t = {}
    for i, im in enumerate(images):
        t[f"img.{i}"] = im

    # ---- single ops with explicit arguments ----
    cases = []
    for i in (0, 1, 2):
        cases += [("AutoContrast", i, None, 0), ("Equalize", i, None, 0)]
    cases += [("Invert", 0, None, 0)]
    for bits in (0, 1, 2, 3, 4, 8):
        cases.append(("Posterize", 0, bits, 0))
    for th in (0, 26, 100, 128, 256):
        cases.append(("Solarize", 2, th, 0))
    for add in (0, 37, 110):
        cases.append(("SolarizeAdd", 0, add, 0))
    for name in ("Color", "Contrast", "Brightness", "Sharpness"):
        for fac in (0.0, 0.1, 0.55, 1.0, 1.37, 1.9):
            cases.append((name, 0, f32(fac), 0))
        for fac in (0.3, 1.9):
            cases.append((name, 2, f32(fac), 0))
    for bic in (0, 1):
        for deg in (13.5, -27.0, 30.0, 7.3):
            cases.append(("Rotate", 0, f32(deg), bic))
        cases.append(("Rotate", 3, 90.0, bic))   # square: an exact transpose
        cases.append(("Rotate", 3, -90.0, bic))
        cases.append(("Rotate", 0, 180.0, bic))
        cases.append(("Rotate", 0, 90.0, bic))   # not square: resampled
        for fac in (0.27, -0.13):
            cases.append(("ShearX", 2, f32(fac), bic))
            cases.append(("ShearY", 2, f32(fac), bic))
        for pct in (0.405, -0.21, 0.1):
            cases.append(("TranslateXRel", 2, f32(pct), bic))
            cases.append(("TranslateYRel", 2, f32(pct), bic))
    for n, (name, img, arg, bic) in enumerate(cases):
        t[f"op.{n}.cfg"] = np.array([OPS.index(name), img, bic], np.int32)
        t[f"op.{n}.arg"] = np.array([0.0 if arg is None else arg], np.float32)
        t[f"op.{n}.out"] = run_op(name, pil[img], arg, bic)
    t["op.count"] = np.array([len(cases)], np.int32)

    # ---- AugmentOp: magnitude -> argument -> op, sign forced ----
    hp = dict(translate_const=100, img_mean=FILL)
    chains = []
    incr = aa._RAND_INCREASING_TRANSFORMS
    unsigned = ("AutoContrast", "Equalize", "Invert", "PosterizeIncreasing", "SolarizeIncreasing",
                "SolarizeAdd")
    for k, name in enumerate(incr):
        for negate in ((0,) if name in unsigned else (0, 1)):
            chains.append((name, k % 3, f32(9.0 if negate else 6.3), k % 2, negate))
    for k, name in enumerate(aa._RAND_TRANSFORMS):
        if name not in incr:
            chains.append((name, 0, f32(4.7), 0, k % 2))
    for n, (name, img, mag, bic, negate) in enumerate(chains):
        hpn = dict(hp, interpolation=BICUBIC if bic else BILINEAR)
        op = aa.AugmentOp(name, prob=1.0, magnitude=mag, hparams=hpn)
        with ForcedSign(negate):
            out = op(pil[img])
        t[f"chain.{n}.cfg"] = np.array([OPS.index(name), img, bic, negate], np.int32)
        t[f"chain.{n}.mag"] = np.array([mag], np.float32)
        t[f"chain.{n}.out"] = np.asarray(out)
    t["chain.count"] = np.array([len(chains)], np.int32)

    # ---- LEVEL_TO_ARG over magnitudes ----
    cfg, mags, args = [], [], []
    for k, name in enumerate(OPS):
        fn = aa.LEVEL_TO_ARG[name]
        if fn is None:
            continue
        for mag in (0.0, 0.5, 2.5, 3.3, 5.0, 7.77, 9.0, 9.5, 10.0):
            for negate in (0, 1):
                m = f32(mag)
                with ForcedSign(negate):
                    a = fn(m, dict(hp))[0]
                cfg.append([k, negate])
                mags.append(m)
                args.append(a)
    t["level.cfg"] = np.array(cfg, np.int32)
    t["level.mag"] = np.array(mags, np.float32)
    t["level.arg"] = np.array(args, np.float32)

    # ---- Mixup / CutMix, mode 'batch' ----
    torch.manual_seed(0)
    np.random.seed(7)
    B, C, H, W, K = 4, 3, 8, 10, 5
    mixes = [(False, 0.3137), (True, 0.6), (True, 0.25), (False, 1.0), (True, 0.9)]
    for n, (cut, lam) in enumerate(mixes):
        x = torch.randn(B, C, H, W)
        y = torch.tensor([n % K, 3, 1, (n + 2) % K])
        m = tmix.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=K)
        lam = f32(lam)
        m._params_per_batch = lambda lam=lam, cut=cut: (lam, cut)
        box = [0, 0, 0, 0]
        orig = tmix.cutmix_bbox_and_lam

        def spy(*a, **kw):
            (yl, yh, xl, xh), lam2 = orig(*a, **kw)
            box[:] = [int(yl), int(yh), int(xl), int(xh)]
            return (yl, yh, xl, xh), lam2

        tmix.cutmix_bbox_and_lam = spy
        x_in = x.clone()
        x_out, target = m(x, y)
        tmix.cutmix_bbox_and_lam = orig
        t[f"mix.{n}.cfg"] = np.array([int(cut)] + box + [B, C, H, W, K], np.int32)
        t[f"mix.{n}.lam"] = np.array([lam], np.float32)
        t[f"mix.{n}.labels"] = y.numpy().astype(np.int32)
        t[f"mix.{n}.x_in"] = x_in.numpy()
        t[f"mix.{n}.x_out"] = x_out.numpy()
        t[f"mix.{n}.targets"] = target.numpy().astype(np.float32)
    t["mix.count"] = np.array([len(mixes)], np.int32)

    # ---- SoftTargetCrossEntropy in float64 ----
    N, K = 6, 7
    logits = (torch.randn(N, K) * 3).float()
    tg = torch.distributions.Dirichlet(torch.full((K,), 0.5)).sample((N,)).float()
    tg[2] *= 0.7  # a row that does not sum to 1: the general gradient
    x64 = logits.double().requires_grad_(True)
    loss = SoftTargetCrossEntropy()(x64, tg.double())
    loss.backward()
    t["soft.logits"] = logits.numpy()
    t["soft.targets"] = tg.numpy()
    t["soft.loss"] = np.array([loss.item()], np.float32)
    t["soft.dlogits"] = x64.grad.float().numpy()
    t["soft.probs"] = torch.softmax(logits.double(), -1).float().numpy()

    save_safetensors(OUT, t)
    print(f"wrote {OUT}: {os.path.getsize(OUT)} bytes, {len(cases)} ops, {len(chains)} chains")


if __name__ == "__main__":
    main()

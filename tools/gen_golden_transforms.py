#!/usr/bin/python3
"""gen_golden_transforms.py: torchvision 0.14 / Pillow 9 reference outputs for
tests/test_transforms.c.

Run with Debian's PyTorch (torch 1.13, torchvision 0.14, Pillow 9.4):
    /usr/bin/python3 tools/gen_golden_transforms.py   # writes tests/golden/transforms.safetensors

Every case applies one torchvision functional op with FIXED parameters to a
small uint8 RGB image, so the C test can compare op by op without any
random draw in common. Two inputs:
  img.a  37 x 29 (w x h): random bytes, smoothed along rows (sharp and flat areas)
  img.b  48 x 40: a real photo (n01440764_tench.JPEG) resized down by PIL
Tensors (U8 images are H x W x 3):
  <case>.params  F32: the op's parameters (layout per op in the C test)
  <case>.out     U8 (or F32 for normalize): the reference output
"""
import os
import sys

import numpy as np
import torchvision.transforms.functional as F
from PIL import Image
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import save_safetensors  # noqa: E402  (the shared writer)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "golden", "transforms.safetensors")
SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "imagenet-samples", "n01440764_tench.JPEG")


def main():
    rs = np.random.RandomState(20240)
    a = rs.randint(0, 256, (29, 37, 3)).astype(np.int32)
    a = ((a + np.roll(a, 1, axis=1) + np.roll(a, 2, axis=1)) // 3).astype(np.uint8)
    a[10:20, 5:15] = (200, 40, 90)  # a flat block: edges and a plateau
    b = np.array(Image.open(SAMPLE).convert("RGB").resize((48, 40), Image.BILINEAR))
    imgs = {"a": a, "b": b}
    t = {"img.a": a, "img.b": b}

    def put(name, params, out):
        t[name + ".params"] = np.array(params, np.float32)
        t[name + ".out"] = np.asarray(out)

    # resize: params = [img (0 a, 1 b), out_w, out_h, interp, has_box, x0, y0, x1, y1]
    n = 0
    for key, img in imgs.items():
        pil = Image.fromarray(img)
        w, h = pil.size
        for interp in (0, 2, 3):
            for (ow, oh, box) in ((17, 13, None), (53, 61, None), (31, 7, None),
                                  (23, 19, (3.25, 2.5, w - 4.75, h - 1.125)),
                                  (40, 44, (1.5, 0.0, 12.75, 9.5))):
                out = np.array(pil.resize((ow, oh), interp, box=box))
                bx = box if box else (0, 0, 0, 0)
                put("resize.%d" % n, [0 if key == "a" else 1, ow, oh, interp, box is not None, *bx],
                    out)
                n += 1
    # resized_crop: params = [img, top, left, h, w, out_w, out_h, interp]
    n = 0
    for key, img in imgs.items():
        pil = Image.fromarray(img)
        for (top, left, hh, ww, osz, interp) in ((3, 5, 20, 17, 24, 2), (0, 11, 29, 26, 13, 3),
                                                   (7, 1, 9, 30, 32, 2), (2, 2, 12, 12, 12, 0)):
            out = np.array(F.resized_crop(pil, top, left, hh, ww, [osz, osz],
                                          F.InterpolationMode(["nearest", "", "bilinear",
                                                               "bicubic"][interp])))
            put("rcrop.%d" % n, [0 if key == "a" else 1, top, left, hh, ww, osz, osz, interp], out)
            n += 1
    # eval geometry: Resize(shorter) + CenterCrop; params = [img, resize, crop, interp]
    n = 0
    for key, img in imgs.items():
        pil = Image.fromarray(img)
        for (rsz, crop, interp) in ((24, 20, 2), (33, 32, 3), (16, 15, 2), (20, 25, 2)):
            mode = F.InterpolationMode("bilinear" if interp == 2 else "bicubic")
            out = np.array(F.center_crop(F.resize(pil, rsz, mode), [crop, crop]))
            put("eval.%d" % n, [0 if key == "a" else 1, rsz, crop, interp], out)
            n += 1
    # flip, grayscale
    for key, img in imgs.items():
        pil = Image.fromarray(img)
        put("hflip.%s" % key, [0 if key == "a" else 1], np.array(F.hflip(pil)))
        put("gray.%s" % key, [0 if key == "a" else 1], np.array(F.rgb_to_grayscale(pil, 3)))
    # colour ops: params = [img, op (0 b, 1 c, 2 s, 3 h, 4 solarize), factor]
    n = 0
    for key, img in imgs.items():
        pil = Image.fromarray(img)
        for op, factors in ((0, (0.0, 0.37, 1.0, 1.61)), (1, (0.0, 0.52, 1.83)),
                            (2, (0.0, 0.44, 1.77)), (3, (-0.5, -0.31, -0.02, 0.07, 0.29, 0.5)),
                            (4, (0, 77, 128, 255))):
            for f in factors:
                f32 = float(np.float32(f))  # the C side takes a float
                if op == 0: out = F.adjust_brightness(pil, f32)
                elif op == 1: out = F.adjust_contrast(pil, f32)
                elif op == 2: out = F.adjust_saturation(pil, f32)
                elif op == 3: out = F.adjust_hue(pil, f32)
                else: out = F.solarize(pil, int(f))
                put("color.%d" % n, [0 if key == "a" else 1, op, f32], np.array(out))
                n += 1
    # gaussian blur: params = [img, kernel, sigma]
    n = 0
    for key, img in imgs.items():
        pil = Image.fromarray(img)
        for (k, s) in ((3, 0.6), (5, 1.3), (9, 2.0), (23, 1.7), (23, 0.1)):
            s32 = float(np.float32(s))
            put("blur.%d" % n, [0 if key == "a" else 1, k, s32],
                np.array(F.gaussian_blur(pil, [k, k], [s32, s32])))
            n += 1
    # normalize: params = [img, mean3, std3]
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    x = F.normalize(F.to_tensor(Image.fromarray(b)), mean, std)
    put("normalize.b", [1, *mean, *std], x.numpy().astype(np.float32))
    save_safetensors(OUT, t)
    print("wrote %s (%d bytes, %d tensors)" % (OUT, os.path.getsize(OUT), len(t)))


if __name__ == "__main__":
    main()

"""torchvision + PIL reference for bench/bench_pipeline.c: the same work
(read + decode + RandomResizedCrop(224) + flip + ToTensor + Normalize, or
the MoCo v2 two-view recipe) over the same files, one process, no
DataLoader workers. Run with Debian's /usr/bin/python3.
   torchvision_pipeline.py DIR [torchvision|mocov2] [epochs]
DIR is a flat folder or an ImageFolder; prints images per CPU-second of
the loop and images/s by the wall clock."""
import os
import sys
import time

import torch
from PIL import Image, ImageFilter
import random
from torchvision import transforms as T

torch.set_num_threads(1)
root = sys.argv[1]
recipe = sys.argv[2] if len(sys.argv) > 2 else "torchvision"
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
files = []
for dirpath, _, names in sorted(os.walk(root)):
    files += [os.path.join(dirpath, n) for n in sorted(names)
              if n.lower().endswith((".jpg", ".jpeg", ".png")) and not n.startswith(".")]
norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


class Blur:  # MoCo v2's GaussianBlur
    def __call__(self, x):
        return x.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))


if recipe == "mocov2":
    one = T.Compose([T.RandomResizedCrop(224, scale=(0.2, 1.0)),
                     T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                     T.RandomGrayscale(p=0.2), T.RandomApply([Blur()], p=0.5),
                     T.RandomHorizontalFlip(), T.ToTensor(), norm])
    tf = lambda im: (one(im), one(im))
else:
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])

t0, c0 = time.time(), time.process_time()
n = 0
for _ in range(epochs):
    for f in files:
        with open(f, "rb") as fh:
            im = Image.open(fh).convert("RGB")
        tf(im)
        n += 1
dt, dc = time.time() - t0, time.process_time() - c0
# per CPU-s: CPU time of the loop only (not Python's start and imports)
print(f"torchvision {root} {recipe} threads=1 images={n} {n / dc:.1f} per CPU-s "
      f"{n / dt:.1f} images/s")

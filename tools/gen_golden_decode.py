#!/usr/bin/python3
"""gen_golden_decode.py: PIL references for the image decoder tests.

Run with Debian's Python (Pillow 9.4 linked to the system libjpeg-turbo 2.1.5):
    /usr/bin/python3 tools/gen_golden_decode.py

Writes:
  tests/data/images/*        tiny test images of every kind the decoder must
                             handle (JPEG gray/4:4:4/4:2:2/progressive/CMYK;
                             PNG RGB/RGBA/palette/palette+tRNS/gray/1-bit/
                             2-bit/gray+alpha/16-bit/interlaced; a PNG named
                             .JPEG). PNG variants that PIL cannot write are
                             written by hand below.
  tests/golden/decode_small.bin     every pixel of each tiny image, as PIL
                                    decodes it (JPEGs also at 1/2, 1/4, 1/8)
  tests/golden/decode_imagenet.bin  for each file of ../shared/data/imagenet-samples:
                                    size, per-channel pixel sums and 32 sampled
                                    pixels at full resolution; every 8th file
                                    also at 1/2, 1/4, 1/8 (PIL's Image.draft)

Reference pixels are PIL's Image.open(f).convert("RGB"); the reduced decodes
are Image.draft("RGB", (W // s, H // s)), which asks libjpeg for scale 1/s
(the assert below checks that PIL picked exactly s). One deliberate
exception: a 16-bit gray PNG's reference is its high byte (PIL clips the
16-bit value to 255 instead; see include/visc/image.h).

File format (little endian), both files:
  "VISCDEC1", u32 record count, u32 samples per record (0: all pixels)
  each record: char name[48] (NUL padded), i32 scale, i32 width, i32 height,
               u64 sum[3] (per channel, over all pixels),
               then 3 * samples bytes (RGB of the sampled pixels), or
               3 * width * height bytes when samples is 0.
Sampled pixel i (0 <= i < 32) of a width x height image is at
  v = ((i + 1) * 2654435761) mod 2^32,  x = v mod width,  y = (v >> 11) mod height
(mirrored by sample_xy() in tests/test_image_decode.c).
"""
import os
import struct
import zlib

import numpy as np
from PIL import Image

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
IMAGES = os.path.join(ROOT, "tests", "data", "images")
GOLDEN = os.path.join(ROOT, "tests", "golden")
IMAGENET = os.path.join(ROOT, "..", "shared", "data", "imagenet-samples")
SAMPLES = 32
SCALED_EVERY = 8
NAME_LEN = 48


def sample_xy(i, w, h):
    v = ((i + 1) * 2654435761) & 0xFFFFFFFF
    return v % w, (v >> 11) % h


def pil_rgb(path, scale=1):
    im = Image.open(path)
    if scale > 1:
        w, h = im.size
        im.draft("RGB", (w // scale, h // scale))
        assert im.decoderconfig[0] == scale, (path, scale, im.decoderconfig)
    return np.asarray(im.convert("RGB"))


def record(name, scale, rgb, samples):
    h, w, _ = rgb.shape
    assert len(name.encode()) < NAME_LEN, name
    out = struct.pack("<%dsiii" % NAME_LEN, name.encode(), scale, w, h)
    out += struct.pack("<3Q", *(int(rgb[:, :, c].sum(dtype=np.uint64)) for c in range(3)))
    if samples:
        out += b"".join(rgb[y, x].tobytes() for x, y in (sample_xy(i, w, h) for i in range(samples)))
    else:
        out += rgb.tobytes()
    return out


def write_golden(path, records, samples):
    with open(path, "wb") as f:
        f.write(b"VISCDEC1" + struct.pack("<II", len(records), samples) + b"".join(records))
    print("%s: %d records, %d bytes" % (os.path.relpath(path, ROOT), len(records), os.path.getsize(path)))


# ---- tiny images ----
def pattern(w, h):
    """Smooth gradients plus sharp edges, so chroma subsampling and IDCT matter."""
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(w - 1, 1))
    g = (y * 255 // max(h - 1, 1))
    b = ((x // 5 + y // 3) % 2) * 200 + 20
    return np.stack([r, g, b], axis=2).astype(np.uint8)


def png_chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def write_png(path, pixels, color_type, depth, interlace=False, palette=None):
    """A PNG written by hand, for layouts PIL cannot save (16-bit color,
    2-bit gray, Adam7). pixels: h x w x channels array of sample values."""
    h, w = pixels.shape[:2]
    pixels = pixels.reshape(h, w, -1)

    def rows(img):
        out = b""
        for row in img:
            if depth == 16:
                data = row.astype(">u2").tobytes()
            elif depth == 8:
                data = row.astype(np.uint8).tobytes()
            else:  # pack sub-byte samples, most significant first
                bits = "".join(format(int(v), "0%db" % depth) for v in row.reshape(-1))
                bits += "0" * (-len(bits) % 8)
                data = bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8))
            out += b"\0" + data  # filter type 0
        return out

    if interlace:  # Adam7: seven sub-images, each filtered on its own
        passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
        raw = b"".join(rows(pixels[y0::dy, x0::dx]) for x0, y0, dx, dy in passes
                       if pixels[y0::dy, x0::dx].size)
    else:
        raw = rows(pixels)
    png = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, int(interlace)))
    if palette is not None:
        png += png_chunk(b"PLTE", bytes(palette))
    png += png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def make_images():
    os.makedirs(IMAGES, exist_ok=True)
    for f in os.listdir(IMAGES):
        os.remove(os.path.join(IMAGES, f))
    rgb = pattern(61, 45)
    im = Image.fromarray(rgb)
    p = lambda name: os.path.join(IMAGES, name)
    im.convert("L").save(p("gray.jpg"), quality=90)
    im.save(p("rgb444.jpg"), quality=90, subsampling=0)
    im.save(p("rgb422.jpg"), quality=90, subsampling=1)
    im.save(p("progressive.jpg"), quality=90, progressive=True)
    im.convert("CMYK").save(p("cmyk.jpg"), quality=90)
    small = Image.fromarray(pattern(23, 17))
    small.save(p("rgb.png"))
    rgba = small.convert("RGBA")
    rgba.putalpha(Image.fromarray((pattern(23, 17)[:, :, 0] // 2).astype(np.uint8)))
    rgba.save(p("rgba.png"))
    small.convert("P", palette=Image.ADAPTIVE, colors=16).save(p("palette.png"), bits=4)
    pal = small.convert("P", palette=Image.ADAPTIVE, colors=8)
    pal.save(p("palette_trns.png"), transparency=3)
    small.convert("L").save(p("gray.png"))
    small.convert("1").save(p("gray1.png"))
    small.convert("LA").save(p("la.png"))
    small.save(p("png_named.JPEG"), format="PNG")  # content decides, not the name
    # 16-bit samples: the high byte is the pattern, the low byte something else.
    g16 = (pattern(23, 17)[:, :, 0].astype(np.int64) * 256 + np.arange(17)[:, None] * 13).astype(np.uint16)
    Image.fromarray(g16).save(p("gray16.png"))  # PIL writes mode I;16 as 16-bit gray
    c16 = pattern(23, 17).astype(np.int64) * 256 + (np.arange(23)[None, :, None] * 11 + 128) % 256
    write_png(p("rgb16.png"), c16, 2, 16)
    a16 = np.concatenate([c16, np.full((17, 23, 1), 40000)], axis=2)
    write_png(p("rgba16.png"), a16, 6, 16)
    write_png(p("gray2.png"), pattern(23, 17)[:, :, 0] >> 6, 0, 2)
    write_png(p("interlaced.png"), pattern(23, 17), 2, 8, interlace=True)
    write_png(p("interlaced_palette.png"), (pattern(23, 17)[:, :, 2] > 100).astype(np.uint8), 3, 1,
              interlace=True, palette=[10, 20, 30, 200, 150, 100])


def reference(name):
    path = os.path.join(IMAGES, name)
    if name == "gray16.png":  # high byte, by design (PIL would clip)
        v = (np.asarray(Image.open(path)).astype(np.uint32) >> 8).astype(np.uint8)
        return np.repeat(v[:, :, None], 3, axis=2)
    return pil_rgb(path)


def main():
    make_images()
    small = []
    for name in sorted(os.listdir(IMAGES)):
        small.append(record(name, 1, reference(name), 0))
        if Image.open(os.path.join(IMAGES, name)).format == "JPEG":
            for s in (2, 4, 8):
                small.append(record(name, s, pil_rgb(os.path.join(IMAGES, name), s), 0))
    # Self-checks of the hand-written PNGs: PIL agrees on the high byte.
    assert (pil_rgb(os.path.join(IMAGES, "rgb16.png")) == np.asarray(Image.open(os.path.join(IMAGES, "rgb.png")))).all()
    write_golden(os.path.join(GOLDEN, "decode_small.bin"), small, 0)

    imagenet = []
    for k, name in enumerate(sorted(os.listdir(IMAGENET))):
        path = os.path.join(IMAGENET, name)
        imagenet.append(record(name, 1, pil_rgb(path), SAMPLES))
        if k % SCALED_EVERY == 0:
            for s in (2, 4, 8):
                imagenet.append(record(name, s, pil_rgb(path, s), SAMPLES))
    write_golden(os.path.join(GOLDEN, "decode_imagenet.bin"), imagenet, SAMPLES)


if __name__ == "__main__":
    main()

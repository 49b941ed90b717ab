"""Writes a small data set in MNIST's own IDX file format, for machines with no internet.

The digits are drawn from a 5x7 bitmap font with random scale, shift, slant, stroke width and
noise, so a CNN has something real to learn (well above chance after one epoch), and
torchvision.datasets.MNIST(root, download=False) reads them as it reads the real files.
It is NOT the real MNIST: with internet access, `--download` fetches the real one instead
(through torchvision, certificates verified).

    python jobs/make_mnist.py jobs/data [--train 12000] [--test 1000]
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import numpy as np

FONT = {  # 5 columns x 7 rows, one string per row
    0: ["01110", "10001", "10011", "10101", "11001", "10001", "01110"],
    1: ["00100", "01100", "00100", "00100", "00100", "00100", "01110"],
    2: ["01110", "10001", "00001", "00010", "00100", "01000", "11111"],
    3: ["11110", "00001", "00001", "01110", "00001", "00001", "11110"],
    4: ["00010", "00110", "01010", "10010", "11111", "00010", "00010"],
    5: ["11111", "10000", "11110", "00001", "00001", "10001", "01110"],
    6: ["00110", "01000", "10000", "11110", "10001", "10001", "01110"],
    7: ["11111", "00001", "00010", "00100", "01000", "01000", "01000"],
    8: ["01110", "10001", "10001", "01110", "10001", "10001", "01110"],
    9: ["01110", "10001", "10001", "01111", "00001", "00010", "01100"],
}


def draw(digit: int, rng: np.random.Generator) -> np.ndarray:
    glyph = np.array([[c == "1" for c in row] for row in FONT[digit]], dtype=np.float32)
    img = np.zeros((28, 28), dtype=np.float32)
    scale = rng.uniform(2.4, 3.2)
    slant = rng.uniform(-0.35, 0.35)
    width = rng.uniform(0.9, 1.6)
    h, w = 7 * scale, 5 * scale
    top = rng.uniform(2, 26 - h)
    left = rng.uniform(2, 26 - w)
    ys, xs = np.mgrid[0:28, 0:28].astype(np.float32)
    gy = (ys - top) / scale
    gx = (xs - left - slant * (ys - top - h / 2)) / scale
    for r in range(7):
        for c in range(5):
            if glyph[r, c]:
                d = np.maximum(np.abs(gy - (r + 0.5)), np.abs(gx - (c + 0.5)))
                img = np.maximum(img, np.clip((0.35 + 0.2 * width - d) * 4, 0, 1))
    img += rng.normal(0, 0.08, img.shape).astype(np.float32)
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def write_idx(path: Path, array: np.ndarray) -> None:
    code = 0x08  # unsigned byte
    header = struct.pack(">HBB", 0, code, array.ndim) + b"".join(
        struct.pack(">I", n) for n in array.shape)
    path.write_bytes(header + array.tobytes())


def make(root: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = np.stack([draw(int(d), rng) for d in labels])
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--train", type=int, default=12000)
    ap.add_argument("--test", type=int, default=1000)
    ap.add_argument("--download", action="store_true",
                    help="fetch the real MNIST through torchvision instead")
    args = ap.parse_args()
    if args.download:
        from torchvision.datasets import MNIST
        MNIST(str(args.root), train=True, download=True)
        MNIST(str(args.root), train=False, download=True)
        print(f"real MNIST downloaded into {args.root}", file=sys.stderr)
        return
    raw = make(args.root, args.train, args.test)
    print(f"wrote a synthetic MNIST-format data set ({args.train} train, {args.test} test "
          f"images drawn from a bitmap font; NOT the real MNIST) to {raw}", file=sys.stderr)


if __name__ == "__main__":
    main()

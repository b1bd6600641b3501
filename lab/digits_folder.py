"""scikit-learn's handwritten digits (1,797 grey 8x8 images in 10 classes, shipped inside the package) written as
an image folder, for the small-image recipe of docs/DATA.md:

    pip install scikit-learn
    python lab/digits_folder.py <out>          # <out>/{train,test}/<digit>/<n>.png

The test split is every fifth image of each class (355 images), the rest train (1,442): a fixed split, the same on
every machine. Pixels 0-16 are scaled to 0-255.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the folder to write (train/ and test/ below it)")
    args = parser.parse_args()
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("digits_folder: scikit-learn is not installed (pip install scikit-learn); it ships the digits")
    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)  # (1797, 8, 8), 0-16 -> 0-255
    seen = np.zeros(10, dtype=int)
    for n, (image, label) in enumerate(zip(images, digits.target, strict=True)):
        split = "test" if seen[label] % 5 == 4 else "train"
        seen[label] += 1
        folder = args.out / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(folder / f"{n:04d}.png")
    counts = {split: sum(1 for _ in (args.out / split).rglob("*.png")) for split in ("train", "test")}
    print(f"{args.out}: {counts['train']} train and {counts['test']} test images of 8x8 px, 10 classes")


if __name__ == "__main__":
    main()

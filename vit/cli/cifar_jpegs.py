"""Write torchvision's CIFAR-10 out as JPEG files in image-net style class folders, the layout data=imagefolder
reads, optionally packed into a .tar.gz (data.root takes the folder or the archive).

usage: vit-cifar-jpegs root=<torchvision root> out=<folder> [download=false] [tar=<file>]
    [quality=75]

Reads CIFAR-10 with torchvision.datasets.CIFAR10 from `root` (the folder holding cifar-10-batches-py/;
`download=true` lets torchvision fetch it there first, 163 MB, checked against its md5 sums) and writes

    <out>/cifar10/train/<class>/0000.jpg ... 4999.jpg   (5,000 per class, in the dataset's order)
    <out>/cifar10/test/<class>/0000.jpg ... 0999.jpg    (1,000 per class; data=imagefolder validates on test/)

Each 32x32 image is one baseline JPEG at quality 75 with 4:2:0 chroma subsampling (Pillow's defaults, about
0.9 KB a file; lossy, so accuracies come out a few tenths below the PNG-exact dataset; `quality=` sets another,
1 to 95). `tar=<file>` also packs <out>/cifar10 into that .tar.gz. Then train with data=imagefolder
data.root=<out>/cifar10 (or the archive).

Example:

    vit-cifar-jpegs root=data/torchvision download=true out=data tar=data/cifar10-jpeg.tar.gz
    python train.py experiment=cifar10_plain data=imagefolder data.root=data/cifar10-jpeg.tar.gz

Bad input (no CIFAR-10 under `root`, an output that cannot be written, an unknown key or a bad value): one line on
stderr, exit code 2.
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from vit.cli.args import Key, keys_help, parse_args, run_script
from vit.errors import UsageError

SPLITS = (("train", True), ("test", False))


KEYS = {
    "root": Key("torchvision's CIFAR-10 root (the folder holding cifar-10-batches-py/)", kind="path"),
    "out": Key("the folder <out>/cifar10/{train,test}/<class>/ is written in", kind="path"),
    "download": Key("let torchvision fetch CIFAR-10 into root first (163 MB)", "false", kind="flag"),
    "tar": Key("also pack <out>/cifar10 into this .tar.gz", kind="path"),
    "quality": Key("the JPEG quality", "75", kind="int", low=1, high=95),
}


def read_split(root: Path, train: bool, download: bool) -> tuple[np.ndarray, list[int], list[str]]:
    """(images (N, 32, 32, 3) uint8, labels, class names) of one split, as torchvision reads them."""
    from torchvision.datasets import CIFAR10

    try:
        dataset = CIFAR10(str(root), train=train, download=download)
    except RuntimeError as err:  # torchvision: "Dataset not found or corrupted. You can use download=True ..."
        hint = "" if download else "; download=true fetches it there"
        raise UsageError(f"root={str(root)!r}: no readable CIFAR-10 ({err}){hint}") from None
    except OSError as err:  # with download=true: no network (URLError), a refused or cut download
        if not download or err.filename is not None:  # a file it could not write: main() names it
            raise
        raise UsageError(
            f"download=true: cannot fetch CIFAR-10 into root={str(root)!r} ({' '.join(str(err).split())}); without "
            "network, put cifar-10-python.tar.gz or its cifar-10-batches-py/ folder there and leave download=true out"
        ) from None
    return dataset.data, list(dataset.targets), list(dataset.classes)


def write_split(images: np.ndarray, labels: list[int], classes: list[str], folder: Path, quality: int) -> int:
    """Each image as <folder>/<class>/<i>.jpg, i counting within its class in the dataset's order."""
    for name in classes:
        (folder / name).mkdir(parents=True, exist_ok=True)
    counts = [0] * len(classes)
    for image, label in zip(images, labels, strict=True):
        path = folder / classes[label] / f"{counts[label]:04d}.jpg"
        Image.fromarray(image).save(path, format="JPEG", quality=quality, subsampling="4:2:0")
        counts[label] += 1
    return sum(counts)


def main(argv: list[str]) -> int:
    args = parse_args(argv, KEYS, ("root", "out"))
    root, out, download = Path(args["root"]), Path(args["out"]), args.flag("download")
    tar = Path(args["tar"]) if args["tar"] else None
    quality = int(args["quality"])
    tree = out / "cifar10"
    try:
        for split, train in SPLITS:
            images, labels, classes = read_split(root, train, download)
            count = write_split(images, labels, classes, tree / split, quality)
            print(f"wrote {count} images of {len(classes)} classes into {tree / split}")
        if tar:
            tar.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(tar, "w:gz") as archive:
                archive.add(tree, arcname="cifar10")
            print(f"wrote {tar}")
    except OSError as err:
        raise UsageError(f"cannot write {err.filename or out}: {err.strerror or err}") from None
    print(f"train with: python train.py data=imagefolder data.root={tar or tree}")
    return 0


def console() -> None:
    """`vit-cifar-jpegs`."""
    sys.exit(run_script(main, usage=__doc__, keys=keys_help(KEYS)))

"""Images per second per CPU core of the training pipeline for ImageNet-sized JPEGs: this project's (data=imagefolder:
random-resized crop 224 in the loader worker, then flip, rand-m9-mstd0.5-inc1 and normalisation on the batch)
against timm's `create_transform(224, is_training=True, auto_augment=...)` on the same files.

    python scripts/bench_cpu_loader.py --images 300 --repeats 5

One process, one thread (torch and Pillow), so the figures are per core; both end in batches of --batch images
(stacked as a DataLoader collates them); ours and timm's alternate over the same files in every repeat (which goes
first alternates too), and the table gives medians over the repeats. Two rows:
  full pipeline on the CPU  ours: worker transform + `BatchAugment` on the CPU in batches of --batch;
                            timm: its transform with ToTensor and Normalize (what its CPU loader workers run);
  loader workers only       what the CPU workers do when a GPU trains: ours decodes and crops (flip, policy and
                            normalisation run on the GPU); timm's with `use_prefetcher=True` still runs its
                            RandAugment in the worker (only ToTensor/Normalize move to the GPU).
With no --folder, the JPEGs are generated (varied sizes around 500 x 375, quality 90, smooth shapes plus noise).

timm's PosterizeIncreasing asks Pillow for 0 bits at magnitude >= 10, which Pillow 13 refuses with ValueError; for
timm's side to run at all, its posterize is patched here to return a black image for 0 bits, as Pillow < 13 did.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from timm.data import auto_augment as timm_aa
from timm.data import create_transform

from vit.data.augment import AugmentSpec, BatchAugment
from vit.data.datasets import load_rgb
from vit.data.transforms import MEAN_STD, train_geometry

SIZES = ((500, 375), (500, 333), (375, 500), (640, 480), (500, 400), (333, 500))


def make_jpegs(folder: Path, count: int, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        width, height = SIZES[i % len(SIZES)]
        coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        image = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), dtype=np.int16)
        image = np.clip(image + rng.normal(0, 12, image.shape), 0, 255).astype(np.uint8)
        path = folder / f"{i:04d}.jpg"
        Image.fromarray(image).save(path, quality=90)
        paths.append(path)
    return paths


def patch_timm_posterize() -> None:
    """timm's posterize with Pillow < 13's answer for 0 bits (a black image) instead of Pillow 13's ValueError."""
    original = timm_aa.posterize

    def posterize(img, bits_to_keep, **kwargs):
        if bits_to_keep <= 0:
            return img.point(lambda _: 0)
        return original(img, bits_to_keep, **kwargs)

    for name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
        timm_aa.NAME_TO_OP[name] = posterize


def ours(paths: list[Path], policy: str, batch: int, with_batch_stage: bool) -> float:
    cfg = {"img_size": 224}
    spec = AugmentSpec.from_config({"crop": "rrc", "auto_augment": policy, "label_smoothing": 0.1})
    worker = train_geometry(cfg, spec)
    stage = BatchAugment(spec, *MEAN_STD["imagenet"], 224, train=True, crop_done=True)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    pending = []
    for path in paths:
        pending.append(worker(load_rgb(str(path))))
        if len(pending) == batch:  # collated as the DataLoader does, then the batch stage where the CPU runs it
            collated = torch.stack(pending)
            if with_batch_stage:
                stage(collated, generator)
            pending = []
    if pending:
        collated = torch.stack(pending)
        if with_batch_stage:
            stage(collated, generator)
    return len(paths) / (time.perf_counter() - start)


def timm_pipeline(paths: list[Path], policy: str, prefetcher: bool, batch: int) -> float:
    mean, std = MEAN_STD["imagenet"]
    transform = create_transform(
        224, is_training=True, auto_augment=policy, interpolation="bilinear", mean=mean, std=std,
        use_prefetcher=prefetcher,
    )  # fmt: skip
    start = time.perf_counter()
    pending = []
    for path in paths:
        with open(path, "rb") as handle:  # timm's default loader: open, convert to RGB
            pending.append(transform(Image.open(handle).convert("RGB")))
        if len(pending) == batch:  # collated as its DataLoader would (float32, or uint8 with the prefetcher)
            torch.stack(pending)
            pending = []
    if pending:
        torch.stack(pending)
    return len(paths) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=None, help="JPEGs to read (default: generate --images)")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32, help="batch size of our batch stage")
    parser.add_argument("--policy", default="rand-m9-mstd0.5-inc1")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    patch_timm_posterize()
    with tempfile.TemporaryDirectory() as tmp:
        paths = sorted(args.folder.glob("*.jp*g")) if args.folder else make_jpegs(Path(tmp), args.images)
        cases = {
            "full pipeline on the CPU": (
                lambda: ours(paths, args.policy, args.batch, True),
                lambda: timm_pipeline(paths, args.policy, False, args.batch),
            ),
            "loader workers only (GPU training)": (
                lambda: ours(paths, args.policy, args.batch, False),
                lambda: timm_pipeline(paths, args.policy, True, args.batch),
            ),
        }
        rates = {(row, side): [] for row in cases for side in ("ours", "timm")}
        for repeat in range(args.repeats):
            for row, (ours_fn, timm_fn) in cases.items():
                order = [("ours", ours_fn), ("timm", timm_fn)]
                for side, fn in order if repeat % 2 == 0 else order[::-1]:
                    rates[row, side].append(fn())
    print(f"{len(paths)} JPEGs, 1 thread, policy {args.policy}, median of {args.repeats} interleaved repeats")
    print()
    print("| pipeline | ours img/s per core | timm img/s per core | ours / timm |")
    print("|---|---|---|---|")
    for row in cases:
        mine, theirs = statistics.median(rates[row, "ours"]), statistics.median(rates[row, "timm"])
        print(f"| {row} | {mine:.1f} | {theirs:.1f} | {mine / theirs:.2f} |")


if __name__ == "__main__":
    main()

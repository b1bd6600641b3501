"""Images per second per CPU core of the training pipeline for ImageNet-sized JPEGs: this project's (data=imagefolder:
random-resized crop 224 in the loader worker, then flip, rand-m9-mstd0.5-inc1 and normalisation on the batch)
against timm's `create_transform(224, is_training=True, auto_augment=...)` on the same files.

usage: python lab/bench_cpu_loader.py [folder=<JPEG folder>] [images=300] [repeats=5] [batch=32]
    [policy=rand-m9-mstd0.5-inc1] [json=<file>]

    python lab/bench_cpu_loader.py images=300 repeats=5 json=loader.json

One process, one thread (torch and Pillow), so the figures are per core; both end in batches of `batch` images
(stacked as a DataLoader collates them); ours and timm's alternate over the same files in every repeat (which goes
first alternates too), batch by batch, and the ratio is the median over the batches of timm's time / ours. Rows:
  full pipeline on the CPU  ours: worker transform + `BatchAugment` on the CPU in batches of `batch`;
                            timm: its transform with ToTensor and Normalize (what its CPU loader workers run);
  loader workers only       what the CPU workers do when a GPU trains: ours decodes and crops (flip, policy and
                            normalisation run on the GPU); timm's with `use_prefetcher=True` still runs its
                            RandAugment in the worker (only ToTensor/Normalize move to the GPU).
With no folder=, `images` JPEGs are generated (varied sizes around 500 x 375, quality 90, smooth shapes plus noise).
json=<file> writes the measurement record: every batch's seconds on each side and their ratio, row by row, the
img/s and median ratios, and the provenance (command, commit, machine, versions: vit/records/provenance.py).

timm's PosterizeIncreasing asks Pillow for 0 bits at magnitude >= 10, which Pillow 13 refuses with ValueError; for
timm's side to run at all, its posterize is patched here to return a black image for 0 bits, as Pillow < 13 did.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from records import measurement_record, script_command, write_record
from timm.data import auto_augment as timm_aa
from timm.data import create_transform

from vit.cli.args import parse_args, run_script
from vit.data.augment.batch import BatchAugment
from vit.data.augment.spec import augment_settings
from vit.data.augment.transforms import train_geometry
from vit.data.images import read_rgb
from vit.data.sources.registry import IMAGENET_MEAN_STD
from vit.errors import UsageError
from vit.settings.data import DataSettings

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


class Ours:
    """This project's pipeline on a batch of files: the worker transform, collation, and (with_batch_stage) the
    batch stage where the CPU runs it."""

    def __init__(self, policy: str, with_batch_stage: bool) -> None:
        spec = augment_settings({"crop": "rrc", "auto_augment": policy, "label_smoothing": 0.1})
        self.worker = train_geometry(DataSettings(img_size=224), spec)
        self.stage = BatchAugment(spec, *IMAGENET_MEAN_STD, 224, train=True, crop_done=True)
        self.with_batch_stage = with_batch_stage
        self.generator = torch.Generator().manual_seed(0)

    def __call__(self, paths: list[Path]) -> None:
        batch = torch.stack([self.worker(read_rgb(path)) for path in paths])  # as the DataLoader collates
        if self.with_batch_stage:
            self.stage(batch, self.generator)


class Timm:
    """timm's training transform on a batch of files, opened as its default loader does, collated as its
    DataLoader would (float32, or uint8 with the prefetcher)."""

    def __init__(self, policy: str, prefetcher: bool) -> None:
        mean, std = IMAGENET_MEAN_STD
        self.transform = create_transform(
            224, is_training=True, auto_augment=policy, interpolation="bilinear", mean=mean, std=std,
            use_prefetcher=prefetcher,
        )  # fmt: skip

    def __call__(self, paths: list[Path]) -> None:
        images = []
        for path in paths:
            with open(path, "rb") as handle:
                images.append(self.transform(Image.open(handle).convert("RGB")))
        torch.stack(images)


def timed(fn, paths: list[Path]) -> float:
    start = time.perf_counter()
    fn(paths)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    known = {"folder": None, "images": "300", "repeats": "5", "batch": "32", "policy": "rand-m9-mstd0.5-inc1"}
    args = parse_args(argv, {**known, "json": None})
    images, repeats, batch = args.integer("images"), args.integer("repeats"), args.integer("batch")
    folder, policy = Path(args["folder"]) if args["folder"] else None, args["policy"]
    if folder is not None and not folder.is_dir():
        raise UsageError(f"folder={args['folder']!r} is not a folder")
    torch.set_num_threads(1)
    patch_timm_posterize()
    rows = {
        "full pipeline on the CPU": (Ours(policy, True), Timm(policy, False)),
        "loader workers only (GPU training)": (Ours(policy, False), Timm(policy, True)),
    }
    seconds = {(row, side): 0.0 for row in rows for side in ("ours", "timm")}
    ratios: dict[str, list[float]] = {row: [] for row in rows}
    batches: dict[str, list[dict]] = {row: [] for row in rows}  # every batch's times, in order
    with tempfile.TemporaryDirectory() as tmp:
        paths = sorted(folder.glob("*.jp*g")) if folder else make_jpegs(Path(tmp), images)
        if not paths:
            raise UsageError(f"folder={args['folder']!r} holds no JPEGs (*.jpg, *.jpeg)")
        chunks = [paths[i : i + batch] for i in range(0, len(paths), batch)]
        for repeat in range(repeats):
            for index, chunk in enumerate(chunks):
                for row, (ours, theirs) in rows.items():
                    # Each batch through both pipelines back to back, in alternating order: a slow moment of the
                    # machine hits both, and the ratio is taken per batch.
                    first_ours = (repeat + index) % 2 == 0
                    pair = [("ours", ours), ("timm", theirs)] if first_ours else [("timm", theirs), ("ours", ours)]
                    took = {side: timed(fn, chunk) for side, fn in pair}
                    seconds[row, "ours"] += took["ours"]
                    seconds[row, "timm"] += took["timm"]
                    ratios[row].append(took["timm"] / took["ours"])
                    batches[row].append({"repeat": repeat, "images": len(chunk), "ours_s": took["ours"]})
                    batches[row][-1] |= {"timm_s": took["timm"], "ours_first": first_ours}
    count = len(paths) * repeats
    print(f"{len(paths)} JPEGs x {repeats} repeats, batches of {batch}, 1 thread, policy {policy}")
    print()
    print("| pipeline | ours img/s per core | timm img/s per core | ours / timm, median per batch [quartiles] |")
    print("|---|---|---|---|")
    table = []
    for row in rows:
        one = ratios[row] * 2 if len(ratios[row]) == 1 else ratios[row]  # quartiles of a single batch: itself
        q1, median, q3 = statistics.quantiles(one, n=4)
        mine, theirs = count / seconds[row, "ours"], count / seconds[row, "timm"]
        print(f"| {row} | {mine:.1f} | {theirs:.1f} | {median:.2f} [{q1:.2f}, {q3:.2f}] |")
        table.append({"pipeline": row, "ours_img_per_s": mine, "timm_img_per_s": theirs, "batches": batches[row]})
        table[-1] |= {"ours_over_timm_median": median, "ours_over_timm_quartiles": [q1, q3]}
    if args["json"]:
        values = {"images": len(paths), "repeats": repeats, "batch": batch, "policy": policy}
        values |= {"threads": 1, "rows": table}
        write_record(measurement_record("bench_cpu_loader", values, script_command(__file__, argv)), args["json"])
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

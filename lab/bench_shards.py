"""Training images per second of data=webdataset (tar shards) against data=imagefolder (one file per image) on the
same JPEGs, each read through its real loader (`build_data`), on the CPU.

usage: python lab/bench_shards.py archive=<image-folder archive> [work=/tmp/vit-bench-shards] [repeats=5]
    [images=10000] [batch=256] [workers=2] [samples_per_shard=5000] [json=<file>]

Example (the CIFAR-10 JPEGs that vit-cifar-jpegs writes):

    python lab/bench_shards.py archive=data/cifar10-jpeg.tar.gz work=/tmp/bench-shards

The archive (an image-folder tree: train/<class>/*, test/<class>/*; default: $VIT_CIFAR10_ARCHIVE) is extracted
into `work` once, and written as shards there with vit-shards (`samples_per_shard` images a shard).
Both loaders then run with the same settings: `batch` images per batch, `workers` loader workers, the first
`images` training images of the epoch (data.limit_train_samples), 32 px, CIFAR-10's augmentation (pad-and-crop,
flip, AutoAugment) on the batch. A pass is a whole (limited) epoch, loader start-up included: the folder loader's
workers persist across epochs, the shard loader starts fresh workers every epoch and fills its shuffle buffer
first. Rows:
  loader workers only   the DataLoader's uint8 batches (decode and geometry in the workers: what a GPU waits on)
  full pipeline         the same plus `BatchAugment` on the CPU in the main process (what a CPU run trains on)
  reading only          the encoded images alone, in the main process, nothing decoded: the shard loader's raw
                        samples (tar headers parsed by the webdataset library) against opening and reading files
The two loaders alternate within every repeat (which goes first alternates too); the table gives the median
images/s over `repeats` and the median of the per-repeat ratios shards / folders. json=<file> writes the
measurement record: every repeat's images/s of every row and loader, the medians and ratios, and the provenance
(command, commit, machine, versions: vit/records/provenance.py).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from records import measurement_record, script_command, write_record

from vit.cli.args import parse_args, run_script
from vit.data import build_data
from vit.data.sources.archive import extract_archive
from vit.data.sources.folders import find_tree_root
from vit.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
READ_ONLY = "reading only, 1 process"


def read_args(argv: list[str]) -> SimpleNamespace:
    known = {"archive": os.environ.get("VIT_CIFAR10_ARCHIVE"), "work": "/tmp/vit-bench-shards", "json": None}
    numbers = {"samples_per_shard": "5000", "batch": "256", "workers": "2", "images": "10000", "repeats": "5"}
    args = parse_args(argv, {**known, **numbers})
    values = {key: args.integer(key, minimum=0 if key == "workers" else 1) for key in numbers}
    return SimpleNamespace(archive=args["archive"], work=Path(args["work"]), json=args["json"], **values)


def prepare(args) -> tuple[Path, Path]:
    """(the tree's root, the shard folder), extracted and written once into `work`."""
    if not args.archive:
        raise UsageError("archive=<image-folder archive> is required (or VIT_CIFAR10_ARCHIVE)")
    tree = find_tree_root(extract_archive(args.archive, args.work / "extracted"))
    shards = args.work / "shards"
    if not (shards / "_info.json").is_file():
        from vit.cli.shards import main as make_shards

        make_shards([f"source={tree}", f"out={shards}", f"samples_per_shard={args.samples_per_shard}"])
    return tree, shards


def loaders(args, tree: Path, shards: Path) -> dict:
    common = {"img_size": 32, "batch_size": args.batch, "num_workers": args.workers, "pin_memory": False}
    common["limit_train_samples"] = args.images
    folder = {"name": "imagefolder", "root": str(tree), "scan_images": False, "loader": "torch", **common}
    urls = sorted(str(p) for p in shards.glob("train-*.tar"))
    stream = {"name": "webdataset", "urls": urls, "val_urls": sorted(str(p) for p in shards.glob("test-*.tar"))}
    return {"folders": build_data(folder).train_loader, "shards": build_data({**stream, **common}).train_loader}


def timed_pass(loader, epoch: int, row: str) -> float:
    """Images per second of one pass (epoch `epoch`) of `row`."""
    loader.set_epoch(epoch)
    if row == READ_ONLY:
        return read_rate(loader, epoch)
    source = loader.loader if row == "loader workers only" else loader
    images, start = 0, time.perf_counter()
    for batch in source:
        images += batch[0].shape[0]
    return images / (time.perf_counter() - start)


def read_rate(loader, epoch: int) -> float:
    """Encoded images per second read in this process, nothing decoded: the shard loader's raw samples of every
    worker's piece in turn, or the files of the folder loader's epoch (as many), opened and read."""
    dataset = loader.loader.dataset
    start = time.perf_counter()
    if hasattr(dataset, "plan"):  # the shard stream
        quotas = [count * dataset.batch_size for count in dataset.batches()]
        pieces = zip(dataset.plan(), quotas, strict=True)
        images = sum(sum(1 for _ in dataset._raw(piece, quota)) for piece, quota in pieces)
    else:  # Transformed(Subset(ImageFolder)) (data.limit_train_samples) in the sampler's order
        subset = dataset.dataset
        indices = list(loader.sampler)[: len(loader) * loader.batch_size]
        for index in indices:
            Path(subset.dataset.samples[subset.indices[index]][0]).read_bytes()
        images = len(indices)
    return images / (time.perf_counter() - start)


def main(argv: list[str]) -> int:
    args = read_args(argv)
    torch.set_num_threads(1)
    tree, shards = prepare(args)
    built = loaders(args, tree, shards)
    rows = ["loader workers only", "full pipeline", READ_ONLY]
    rates = {(row, kind): [] for row in rows for kind in built}
    for repeat in range(args.repeats):
        for row in rows:
            order = list(built) if repeat % 2 == 0 else list(reversed(built))
            for kind in order:
                rates[row, kind].append(timed_pass(built[kind], repeat, row))
            print(f"repeat {repeat + 1} {row}: " + ", ".join(f"{k} {rates[row, k][-1]:.0f} img/s" for k in built))
    print(f"\n| {'row':<23} | folders img/s | shards img/s | shards / folders |")
    print(f"|{'-' * 25}|---------------|--------------|------------------|")
    table = []
    for row in rows:
        folders, shard = rates[row, "folders"], rates[row, "shards"]
        ratio = statistics.median(s / f for s, f in zip(shard, folders, strict=True))
        print(f"| {row:<23} | {statistics.median(folders):13.0f} | {statistics.median(shard):12.0f} | {ratio:16.2f} |")
        table.append({"row": row, "folders_img_per_s_repeats": folders, "shards_img_per_s_repeats": shard})
        table[-1] |= {"folders_img_per_s": statistics.median(folders), "shards_img_per_s": statistics.median(shard)}
        table[-1]["shards_over_folders"] = ratio
    if args.json:
        settings = {key: getattr(args, key) for key in ("images", "batch", "workers", "samples_per_shard", "repeats")}
        values = {"archive": str(args.archive), **settings, "rows": table}
        write_record(measurement_record("bench_shards", values, script_command(__file__, argv)), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

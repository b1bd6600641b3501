"""Does fine-tuning transfer knowledge? A CPU-sized experiment on CIFAR-10 (docs/FINETUNE.md).

A small ViT/4 is pretrained on 5 of CIFAR-10's classes (all their training images); then, on the other 5 classes
with a small labelled set, three ways of training the same model for the same steps are compared, each with
several seeds:
    finetune   start from the pretrained weights (new head, layer-wise lr decay), train everything
    probe      start from the pretrained weights, train only the head (model.freeze=backbone)
    scratch    start from a random init, train everything
Every per-epoch number is measured on a class-balanced holdout taken from the target classes' training images
(data.holdout); the settings were fixed before any run. The test split of the target classes (1,000 images a
class), which no choice looked at, is evaluated once after training: that is the reported number.

usage: python lab/transfer_experiment.py data=<CIFAR-10 JPEG tree> work=<folder> [out=<figure.png>]
    [seeds=0,1,2] [per_class=200] [holdout_per_class=100] [source_per_class=<all>] [pretrain_epochs=8]
    [epochs=40] [jobs=2] [plot_only=false]

Example:

    python lab/transfer_experiment.py data=/tmp/cifar10 work=/tmp/transfer out=docs/img/finetune_transfer.png

`data` is the extracted CIFAR-10 JPEG tree (cifar10/train/<class>/, cifar10/test/<class>/); the split trees are
made of hard links under `work`, and every run is a `train.py` process with one thread (`jobs` at a time).
`seeds` are the target runs' seeds; `per_class` the labelled training images of each target class and
`holdout_per_class` its holdout images; `source_per_class` the source images of each class (default: all);
`pretrain_epochs` the epochs over the source classes, `epochs` those of every target run; `out` is the figure of
holdout top-1 against steps; `plot_only=true` redraws it from `<work>/results.json` without training.
`<work>/results.json` is the measurement record: the provenance (command, commit, machine, versions:
vit/records/provenance.py) beside every run's metrics (each seed's curve and test top-1), the commands, settings and
summary.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from experiments import (
    CIFAR_JPEGS,
    CPU_TRAINER,
    SMALL_VIT,
    plot_seed_curves,
    run_or_load,
    seed_table,
    train,
)
from records import script_command

from vit.cli.args import parse_args, run_script

SOURCE_CLASSES = ("airplane", "automobile", "bird", "cat", "deer")
TARGET_CLASSES = ("dog", "frog", "horse", "ship", "truck")
METHODS = ("finetune", "probe", "scratch")
# The small ViT/4 of every run (0.46 M parameters with a 5-class head) and the data and trainer settings they share.
MODEL, DATA, TRAINER = SMALL_VIT, CIFAR_JPEGS, CPU_TRAINER


DEFAULTS = {
    "data": None,
    "work": None,
    "out": None,
    "seeds": "0,1,2",
    "per_class": "200",
    "holdout_per_class": "100",
    "source_per_class": None,
    "pretrain_epochs": "8",
    "epochs": "40",
    "jobs": "2",
    "plot_only": "false",
}


def parse_settings(argv: list[str]) -> SimpleNamespace:
    """The `key=value` arguments as the experiment's settings: paths, numbers and the flag, typed."""
    args = parse_args(argv, DEFAULTS, ("data", "work"), lists=("seeds",))
    return SimpleNamespace(
        data=Path(args["data"]),
        work=Path(args["work"]),
        out=Path(args["out"]) if args["out"] else None,
        seeds=args.whole_numbers("seeds"),
        per_class=args.integer("per_class"),
        holdout_per_class=args.integer("holdout_per_class"),
        source_per_class=args.integer("source_per_class") if args["source_per_class"] else None,
        pretrain_epochs=args.integer("pretrain_epochs"),
        epochs=args.integer("epochs"),
        jobs=args.integer("jobs"),
        plot_only=args.flag("plot_only"),
    )


def link_tree(src: Path, dst: Path, classes: tuple[str, ...], count: int | None) -> None:
    """dst/<class>/ holding hard links to the first `count` images (sorted names) of src/<class>/."""
    for name in classes:
        (dst / name).mkdir(parents=True, exist_ok=True)
        for image in sorted((src / name).iterdir())[:count]:
            target = dst / name / image.name
            if not target.exists():
                os.link(image, target)


def make_trees(data: Path, work: Path, per_class: int, source_per_class: int | None) -> tuple[Path, Path]:
    """work/source: the 5 source classes (all their images by default); work/target: the target classes' first
    `per_class` training images (labelled set and holdout together) and their whole test split."""
    source, target = work / "source", work / "target"
    link_tree(data / "train", source / "train", SOURCE_CLASSES, source_per_class)
    link_tree(data / "test", source / "test", SOURCE_CLASSES, None)
    link_tree(data / "train", target / "train", TARGET_CLASSES, per_class)
    link_tree(data / "test", target / "test", TARGET_CLASSES, None)
    return source, target


def pretrain_args(source: Path, epochs: int) -> list[str]:
    return [*MODEL, *DATA, *TRAINER, f"data.root={source}", "data.batch_size=128", f"trainer.epochs={epochs}"] + [
        "optim.lr=1e-3",
        "optim.lr_batch=128",
        "optim.weight_decay=0.05",
        "sched.warmup_epochs=1",
        "trainer.val_every_n_epochs=2",
    ]


def target_args(method: str, target: Path, seed: int, args: SimpleNamespace, source_ckpt: Path) -> list[str]:
    """The same model, data, steps and schedule for the three methods; only the start and what trains differ."""
    common = [*MODEL, *DATA, *TRAINER, f"data.root={target}", "data.batch_size=64", f"trainer.epochs={args.epochs}"]
    common += [f"data.holdout={args.holdout_per_class * len(TARGET_CLASSES)}", f"trainer.seed={seed}"]
    common += ["sched.warmup_epochs=2", "optim.lr_batch=64", "trainer.val_every_n_epochs=2"]
    if method == "scratch":
        return [*common, "optim.lr=5e-4", "optim.weight_decay=0.05"]
    start = [f"model.pretrained={source_ckpt}"]
    if method == "finetune":
        return [*common, *start, "optim.lr=5e-4", "optim.weight_decay=0.05", "optim.layer_decay=0.75"]
    return [*common, *start, "model.freeze=backbone", "optim.lr=5e-3", "optim.weight_decay=0.0"]


def run_all(args: SimpleNamespace) -> dict:
    source, target = make_trees(args.data, args.work, args.per_class + args.holdout_per_class, args.source_per_class)
    source_ckpt = args.work / "runs" / "pretrain" / "checkpoints" / "last.pt"
    results: dict = {"commands": {}, "runs": {}}

    def job(name: str, overrides: list[str]) -> None:
        results["commands"][name] = overrides
        results["runs"][name] = train(name, overrides, args.work)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # the scratch runs need no pretrained weights
        waiting = [pool.submit(job, "pretrain", pretrain_args(source, args.pretrain_epochs))]
        for seed in args.seeds:
            waiting.append(pool.submit(job, f"scratch-{seed}", target_args("scratch", target, seed, args, source_ckpt)))
        waiting[0].result()
        for method in ("finetune", "probe"):
            for seed in args.seeds:
                overrides = target_args(method, target, seed, args, source_ckpt)
                waiting.append(pool.submit(job, f"{method}-{seed}", overrides))
        for future in waiting:
            future.result()
    return results


def summary(results: dict) -> dict:
    """Per method: test top-1 of each seed, mean, sample standard deviation, min and max."""
    table = {method: seed_table(results["runs"], method) for method in METHODS}
    pre = results["runs"]["pretrain"]
    table["pretrain"] = {"val_top1": pre["final"]["val_top1"], "seconds": pre["wall_time_s"]}
    return table


def plot(results: dict, out: Path) -> None:
    """Holdout top-1 against optimizer steps: each method's seed mean, with the seeds' range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for method, color in zip(METHODS, ("tab:blue", "tab:orange", "tab:gray"), strict=True):
        plot_seed_curves(ax, results["runs"], method, color)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("holdout top-1 (%)")
    per_class = results.get("settings", {}).get("per_class", "?")
    ax.set_title(f"5 new CIFAR-10 classes, {per_class} labelled images each (CPU, ViT/4 0.46 M)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str]) -> int:
    args = parse_settings(argv)
    command = script_command(__file__, argv)
    results = run_or_load(args, run_all, summary, measurement="transfer_experiment", command=command)
    print(json.dumps(results["summary"], indent=1))
    if args.out is not None:
        plot(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

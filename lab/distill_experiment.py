"""Does distillation help a small ViT? A CPU-sized experiment on CIFAR-10 (docs/DISTILLATION.md).

A teacher is trained by this project's trainer on a small subset of CIFAR-10's training images (longer than the
students); then the same small ViT/4 student is trained three ways, for the same epochs and steps, with several
seeds each:
    alone   the plain ViT, labels only (no distillation token)
    hard    model.distill_token=true, distill.type=hard: the dist head learns the teacher's top-1 class
    soft    model.distill_token=true, distill.type=soft: the dist head learns the teacher's tempered distribution
Every per-epoch number is measured on a class-balanced holdout of the training images (data.holdout, the same
slice for teacher and students, which neither trains on); the settings were fixed before any run. The test images
(the first `test_per_class` of each class's test folder), which nothing was chosen on, are evaluated once after
training: that is the reported number.

usage: python lab/distill_experiment.py data=<CIFAR-10 JPEG tree> work=<folder> [out=<figure.png>]
    [seeds=0,1,2] [per_class=300] [holdout_per_class=50] [test_per_class=200] [teacher_epochs=12] [epochs=5]
    [alpha=0.5] [tau=1.0] [jobs=2] [plot_only=false]

Example:

    python lab/distill_experiment.py data=/tmp/cifar10 work=/tmp/distill out=docs/img/distill_cifar10.png

`data` is the extracted CIFAR-10 JPEG tree (cifar10/train/<class>/, cifar10/test/<class>/); the subset trees are
made of symbolic links under `work`, and every run is a `train.py` process with one thread (`jobs` at a time).
`seeds` are the student runs' seeds; `per_class` the training images of each class (holdout included),
`holdout_per_class` of those the holdout's; `alpha` and `tau` are distill.alpha of the hard and soft runs and
distill.tau of the soft ones; `out` is the figure of holdout top-1 against steps; `plot_only=true` redraws it from
`<work>/results.json` without training.
`<work>/results.json` is the measurement record: the provenance (command, commit, machine, versions:
vit/records/provenance.py) beside every run's metrics (each seed's curve and test top-1), the commands, settings and
summary.
"""

from __future__ import annotations

import json
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

METHODS = ("alone", "hard", "soft")
# The ViT/4 of every run (0.46 M parameters) and the data and trainer settings they share.
MODEL, DATA = SMALL_VIT, [*CIFAR_JPEGS, "data.batch_size=64"]
TRAINER = [*CPU_TRAINER, "optim.lr=1e-3", "optim.lr_batch=64", "optim.weight_decay=0.05", "sched.warmup_epochs=1"]


DEFAULTS = {
    "data": None,
    "work": None,
    "out": None,
    "seeds": "0,1,2",
    "per_class": "300",
    "holdout_per_class": "50",
    "test_per_class": "200",
    "teacher_epochs": "12",
    "epochs": "5",
    "alpha": "0.5",
    "tau": "1.0",
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
        test_per_class=args.integer("test_per_class"),
        teacher_epochs=args.integer("teacher_epochs"),
        epochs=args.integer("epochs"),
        alpha=args.number("alpha"),
        tau=args.number("tau"),
        jobs=args.integer("jobs"),
        plot_only=args.flag("plot_only"),
    )


def link_tree(src: Path, dst: Path, count: int) -> None:
    """dst/<class>/ holding links to the first `count` images (sorted names) of every src/<class>/."""
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / folder.name).mkdir(parents=True, exist_ok=True)
        for image in sorted(folder.iterdir())[:count]:
            target = dst / folder.name / image.name
            if not target.exists():
                target.symlink_to(image.resolve())


def common_args(root: Path, args: SimpleNamespace) -> list[str]:
    classes = sum(1 for p in (args.data / "train").iterdir() if p.is_dir())
    return [*MODEL, *DATA, *TRAINER, f"data.root={root}", f"data.holdout={args.holdout_per_class * classes}"]


def teacher_args(root: Path, args: SimpleNamespace) -> list[str]:
    return [*common_args(root, args), f"trainer.epochs={args.teacher_epochs}", "trainer.val_every_n_epochs=2"]


def student_args(method: str, root: Path, seed: int, args: SimpleNamespace, teacher: Path) -> list[str]:
    """The same model, data, steps and schedule for the three methods; only the teacher signal differs."""
    common = [*common_args(root, args), f"trainer.epochs={args.epochs}", f"trainer.seed={seed}"]
    if method == "alone":
        return common
    return [*common, "model.distill_token=true", f"distill.teacher={teacher}", f"distill.type={method}"] + [
        f"distill.alpha={args.alpha}",
        f"distill.tau={args.tau}",
    ]


def run_all(args: SimpleNamespace) -> dict:
    root = args.work / "data"
    link_tree(args.data / "train", root / "train", args.per_class)
    link_tree(args.data / "test", root / "test", args.test_per_class)
    teacher = args.work / "runs" / "teacher" / "checkpoints" / "last.pt"
    results: dict = {"commands": {}, "runs": {}}

    def job(name: str, overrides: list[str]) -> None:
        results["commands"][name] = overrides
        results["runs"][name] = train(name, overrides, args.work)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # the students alone need no teacher
        waiting = [pool.submit(job, "teacher", teacher_args(root, args))]
        for seed in args.seeds:
            waiting.append(pool.submit(job, f"alone-{seed}", student_args("alone", root, seed, args, teacher)))
        waiting[0].result()
        for seed in args.seeds:
            for method in ("hard", "soft"):
                waiting.append(pool.submit(job, f"{method}-{seed}", student_args(method, root, seed, args, teacher)))
        for future in waiting:
            future.result()
    return results


def summary(results: dict) -> dict:
    """Per method: test top-1 of each seed, mean, sample standard deviation, min and max, wall times; the
    teacher's test top-1, and the distilled students' final holdout agreement with it."""
    table = {}
    for method in METHODS:
        table[method] = seed_table(results["runs"], method)
        runs = {k: v for k, v in results["runs"].items() if k.startswith(f"{method}-")}
        table[method]["holdout_top1"] = [runs[k]["final"]["val_top1"] for k in sorted(runs)]
        agreement = [runs[k]["final"].get("val_teacher_agreement") for k in sorted(runs)]
        if all(a is not None for a in agreement):
            table[method]["holdout_agreement"] = agreement
    teacher = results["runs"]["teacher"]
    table["teacher"] = {
        "test_top1": teacher["test"]["top1"],
        "holdout_top1": teacher["final"]["val_top1"],
        "seconds": teacher["wall_time_s"],
        "steps": teacher["final"]["step"],
    }
    return table


def plot(results: dict, out: Path) -> None:
    """Holdout top-1 against optimizer steps: each method's seed mean, the seeds' range shaded; the teacher's
    final holdout top-1 as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for method, color in zip(METHODS, ("tab:gray", "tab:blue", "tab:orange"), strict=True):
        plot_seed_curves(ax, results["runs"], method, color, marker="o")
    teacher = results["runs"]["teacher"]
    label = f"teacher after {teacher['final']['step']} steps"
    ax.axhline(teacher["final"]["val_top1"], color="black", linestyle="--", linewidth=1, label=label)
    ax.set_xlabel("optimizer step (student)")
    ax.set_ylabel("holdout top-1 (%)")
    ax.set_title("CIFAR-10 subset, 32 px, ViT/4 0.46 M student (CPU)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str]) -> int:
    args = parse_settings(argv)
    command = script_command(__file__, argv)
    results = run_or_load(
        args, run_all, summary, setting_types=(int, float), measurement="distill_experiment", command=command
    )
    print(json.dumps(results["summary"], indent=1))
    if args.out is not None:
        plot(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

"""Does distillation help a small ViT? A CPU-sized experiment on CIFAR-10 (docs/DISTILLATION.md).

A teacher is trained by this project's trainer on a small subset of CIFAR-10's training images (longer than the
students); then the same small ViT/4 student is trained three ways, for the same epochs and steps, with several
seeds each:
    alone   the plain ViT, labels only (no distillation token)
    hard    model.distill_token=true, distill.type=hard: the dist head learns the teacher's top-1 class
    soft    model.distill_token=true, distill.type=soft: the dist head learns the teacher's tempered distribution
Every per-epoch number is measured on a class-balanced holdout of the training images (data.holdout, the same
slice for teacher and students, which neither trains on); the settings were fixed before any run. The test images
(the first --test-per-class of each class's test folder), which nothing was chosen on, are evaluated once after
training: that is the reported number.

    python scripts/distill_experiment.py --data /tmp/cifar10 --work /tmp/distill --out docs/img/distill_cifar10.png

`--data` is the extracted CIFAR-10 JPEG tree (cifar10/train/<class>/, cifar10/test/<class>/); the subset trees are
made of symbolic links under `--work`, and every run is a `train.py` process with one thread (`--jobs` at a time).
`<work>/results.json` is the measurement record: the provenance (command, commit, machine, versions:
vit/engine/provenance.py) beside every run's metrics (each seed's curve and test top-1), the commands, settings and
summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vit.analysis.experiments import (
    CIFAR_JPEGS,
    CPU_TRAINER,
    SMALL_VIT,
    plot_seed_curves,
    run_or_load,
    seed_table,
    train,
)
from vit.cli.args import script_command

METHODS = ("alone", "hard", "soft")
# The ViT/4 of every run (0.46 M parameters) and the data and trainer settings they share.
MODEL, DATA = SMALL_VIT, [*CIFAR_JPEGS, "data.batch_size=64"]
TRAINER = [*CPU_TRAINER, "optim.lr=1e-3", "optim.lr_batch=64", "optim.weight_decay=0.05", "sched.warmup_epochs=1"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="extracted CIFAR-10 JPEG tree (train/, test/)")
    parser.add_argument("--work", type=Path, required=True, help="folder for the subset trees, runs and results")
    parser.add_argument("--out", type=Path, default=None, help="figure of holdout top-1 against steps (.png)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the student runs")
    parser.add_argument("--per-class", type=int, default=300, help="training images per class (holdout included)")
    parser.add_argument("--holdout-per-class", type=int, default=50, help="of those, holdout images per class")
    parser.add_argument("--test-per-class", type=int, default=200, help="test images per class")
    parser.add_argument("--teacher-epochs", type=int, default=12, help="epochs of the teacher")
    parser.add_argument("--epochs", type=int, default=5, help="epochs of every student run")
    parser.add_argument("--alpha", type=float, default=0.5, help="distill.alpha of the hard and soft runs")
    parser.add_argument("--tau", type=float, default=1.0, help="distill.tau of the soft runs")
    parser.add_argument("--jobs", type=int, default=2, help="train.py processes at a time (one thread each)")
    parser.add_argument("--plot-only", action="store_true", help="redraw the figure from <work>/results.json")
    return parser.parse_args(argv)


def link_tree(src: Path, dst: Path, count: int) -> None:
    """dst/<class>/ holding links to the first `count` images (sorted names) of every src/<class>/."""
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / folder.name).mkdir(parents=True, exist_ok=True)
        for image in sorted(folder.iterdir())[:count]:
            target = dst / folder.name / image.name
            if not target.exists():
                target.symlink_to(image.resolve())


def common_args(root: Path, args: argparse.Namespace) -> list[str]:
    classes = sum(1 for p in (args.data / "train").iterdir() if p.is_dir())
    return [*MODEL, *DATA, *TRAINER, f"data.root={root}", f"data.holdout={args.holdout_per_class * classes}"]


def teacher_args(root: Path, args: argparse.Namespace) -> list[str]:
    return [*common_args(root, args), f"trainer.epochs={args.teacher_epochs}", "trainer.val_every_n_epochs=2"]


def student_args(method: str, root: Path, seed: int, args: argparse.Namespace, teacher: Path) -> list[str]:
    """The same model, data, steps and schedule for the three methods; only the teacher signal differs."""
    common = [*common_args(root, args), f"trainer.epochs={args.epochs}", f"trainer.seed={seed}"]
    if method == "alone":
        return common
    return [*common, "model.distill_token=true", f"distill.teacher={teacher}", f"distill.type={method}"] + [
        f"distill.alpha={args.alpha}",
        f"distill.tau={args.tau}",
    ]


def run_all(args: argparse.Namespace) -> dict:
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = script_command(__file__, argv)
    results = run_or_load(
        args, run_all, summary, setting_types=(int, float), measurement="distill_experiment", command=command
    )
    print(json.dumps(results["summary"], indent=1))
    if args.out is not None:
        plot(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The accuracy-against-images map: how much the recipe family learns per image and per FLOP, whatever the machine.

usage: python lab/accuracy_map.py runs=<folder> [budget=<folder>[,<folder>...]] [out=<figure.png>] [json=<record>]

`runs` holds train.py run folders (metrics.json beside .hydra/config.yaml) of runs for a fixed number of epochs
with a holdout (`data.holdout=5000`), for example

    python train.py experiment=cifar10_cpu data.root=<cifar10> data.holdout=5000 trainer.budget=null \\
        trainer.epochs=8 model.embed_dim=144 model.num_heads=3 trainer.seed=0 hydra.run.dir=<runs>/w144_e8/seed0
    python lab/accuracy_map.py runs=<runs> out=docs/img/cifar10_accuracy_map.png json=<runs>/map.json

Each run is one point: the model's width and depth, its epochs and seed, the holdout top-1 at its end (every choice
is made on it), the test top-1 (read once, after the last epoch), the images it trained on and its training FLOPs:
for every epoch its images times three forward passes at that epoch's image size (`vit.models.complexity`, the
backward pass counted as two forwards, the usual convention), so progressive resizing's cheap 16 px epochs count as
what they cost. A machine's measured step speed turns the epochs of a point into seconds.

`budget=` adds runs of the recipe as a time budget (`trainer.budget=30m`, no holdout) for comparison: each at its
planned epochs (of all 50,000 training images) with its test top-1, read once at its end.

The figure: holdout top-1 against epochs and against training PFLOPs, one colour per width (each seed a dot, the
mean a line), beside the anchors' published test accuracies after a number of epochs (ConvMixer-256/8, kernel 5,
patch 2, one 25-epoch run: 83.3% after 7 epochs, 90.2% after 17, 92.6% after 25; CCT-7/3x1 94.78% after 200), the
ConvMixer's FLOPs counted here from its architecture (`convmixer_flops`). The record (`json=`) holds every point
and the anchors beside the provenance.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch
from omegaconf import OmegaConf
from record_tables import map_table
from records import measurement_record, script_command, write_record
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.models.complexity import complexity
from vit.tasks.build import build_model_from_config

# (label, epochs, published test top-1, FLOPs a training image: None where not counted here)
CONVMIXER = "ConvMixer-256/8 (published, one 25-epoch run)"
ANCHORS = [(CONVMIXER, 7, 83.3), (CONVMIXER, 17, 90.2), (CONVMIXER, 25, 92.6)]
ANCHORS += [("CCT-7/3x1 (published, 200 epochs)", 200, 94.78)]
TRAIN_IMAGES = 50_000  # the anchors' epochs are of CIFAR-10's whole training split


def convmixer_flops(width: int = 256, depth: int = 8, kernel: int = 5, patch: int = 2, img_size: int = 32) -> int:
    """Forward FLOPs of one image through a ConvMixer (Trockman & Kolter, 2022): a patch convolution, then `depth`
    blocks of a residual depthwise convolution and a pointwise one, each followed by GELU and BatchNorm; counted by
    torch's FlopCounterMode."""

    def activated(conv: nn.Module) -> nn.Sequential:
        return nn.Sequential(conv, nn.GELU(), nn.BatchNorm2d(width))

    layers = [activated(nn.Conv2d(3, width, patch, stride=patch))]
    for _ in range(depth):
        layers += [activated(nn.Conv2d(width, width, kernel, groups=width, padding="same"))]
        layers += [activated(nn.Conv2d(width, width, 1))]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10)).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, 3, img_size, img_size))
    return int(counter.get_total_flops())


def run_point(folder: Path, macs_at: dict, budgeted: bool = False) -> dict:
    """One run folder as a point of the map (the module docstring); `budgeted`: a run of the recipe as a time
    budget (no holdout: its top-1 the test split's, read once at its end)."""
    metrics = json.loads((folder / "metrics.json").read_text())
    cfg = OmegaConf.load(folder / ".hydra" / "config.yaml")
    if not budgeted and (cfg.data.get("holdout") is None or "test" not in metrics):
        raise UsageError(f"{folder}: not a run with data.holdout (its choices would have read the test split)")
    model_key = json.dumps(OmegaConf.to_container(cfg.model, resolve=True), sort_keys=True)
    sizes = {int(epoch.get("train_img_size") or cfg.data.img_size) for epoch in metrics["history"]}
    if not sizes <= set(macs_at.get(model_key, {})):
        model = build_model_from_config(cfg.model, num_classes=metrics["num_classes"], dynamic_img_size=True)
        macs_at.setdefault(model_key, {}).update({size: complexity(model, img_size=size).macs for size in sizes})
    images, flops, step = 0, 0, 0
    for epoch in metrics["history"]:
        seen = (epoch["step"] - step) * int(cfg.data.batch_size)
        step = epoch["step"]
        images += seen
        flops += seen * 3 * 2 * macs_at[model_key][int(epoch.get("train_img_size") or cfg.data.img_size)]
    arch = metrics["architecture"]
    curve = [(e["epoch"], e["val_top1"]) for e in metrics["history"] if e["val_top1"] is not None]
    point = dict(run=folder.name, width=arch["embed_dim"], depth=arch["depth"], heads=arch["num_heads"],
                 params=metrics["params"], epochs=metrics["epochs_done"], seed=int(cfg.trainer.seed), images=images,
                 train_flops=flops, precision=metrics["precision"], curve=curve)  # fmt: skip
    if budgeted:  # the budget's planned epochs (the last one partial), the test split's top-1
        budget = metrics["budget"]
        return point | dict(epochs=budget["planned_epochs"], budget_s=budget["budget_s"],
                            test_top1=metrics["final"]["val_top1"])  # fmt: skip
    return point | dict(holdout_top1=metrics["final"]["val_top1"], test_top1=metrics["test"]["top1"])


def budget_points(folders: list[Path], macs_at: dict) -> list[dict]:
    """The budgeted runs under `folders` (each run's metrics.json beside .hydra/), as points."""
    runs = sorted(path.parent for folder in folders for path in folder.rglob("metrics.json"))
    missing = [folder for folder in folders if not folder.is_dir()]
    if missing or not runs:
        raise UsageError(f"budget={missing[0] if missing else folders[0]} holds no finished run")
    return [run_point(run, macs_at, budgeted=True) for run in runs]


def map_points(runs: Path, macs_at: dict) -> list[dict]:
    folders = sorted(path.parent for path in runs.rglob("metrics.json"))
    if not folders:
        raise UsageError(f"runs={runs} holds no finished run (a metrics.json beside .hydra/)")
    points = [run_point(folder, macs_at) for folder in folders]
    for point, folder in zip(points, folders, strict=True):
        point["run"] = folder.relative_to(runs).as_posix()
    return sorted(points, key=lambda p: (p["width"], p["epochs"], p["seed"]))


def group_by(points: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups = defaultdict(list)
    for point in points:
        groups[tuple(point[key] for key in keys)].append(point)
    return groups


def draw(points: list[dict], budgeted: list[dict], anchor_flops: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    by_width = defaultdict(list)
    for point in points:
        by_width[point["width"]].append(point)
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    for (width, mine), color in zip(sorted(by_width.items()), colors, strict=False):  # at most five widths drawn
        groups = defaultdict(list)
        for point in mine:
            groups[point["epochs"]].append(point)
        label = f"{width} wide, {mine[0]['depth']} deep ({mine[0]['params'] / 1e6:.2f} M), holdout"
        for ax, x in zip(axes, ("epochs", "train_flops"), strict=True):
            unit = 1e15 if x == "train_flops" else 1  # PFLOPs
            xs = [statistics.fmean(p[x] for p in group) / unit for group in groups.values()]
            ys = [statistics.fmean(p["holdout_top1"] for p in group) for group in groups.values()]
            ax.plot(xs, ys, "-o", color=color, label=label)
            for p in mine:
                ax.plot(p[x] / unit, p["holdout_top1"], ".", color=color, alpha=0.5)
    budget_groups = sorted(group_by(budgeted, ("width", "budget_s")).items())
    for ((width, budget_s), mine), marker in zip(budget_groups, "DPX*", strict=False):  # at most four drawn
        label = f"the recipe ({width} wide) as a {budget_s / 60:.0f}-minute budget, test"
        for ax, x, unit in ((axes[0], "epochs", 1), (axes[1], "train_flops", 1e15)):
            xs, ys = [p[x] / unit for p in mine], [p["test_top1"] for p in mine]
            ax.plot(xs, ys, marker, color="black", mfc="none", label=label)
    for label, marker in ((CONVMIXER, "s"), (ANCHORS[-1][0], "^")):
        mine = [(epochs, top1) for name, epochs, top1 in ANCHORS if name == label]
        axes[0].plot(*zip(*mine, strict=True), marker, color="gray", label=label + ", test")
        if label == CONVMIXER:
            flops = [epochs * TRAIN_IMAGES * 3 * anchor_flops / 1e15 for epochs, _ in mine]
            axes[1].plot(flops, [top1 for _, top1 in mine], marker, color="gray", label=label + ", test")
    axes[0].set(xscale="log", xlabel="epochs", ylabel="top-1 (%)", title="Top-1 against epochs")
    axes[1].set(xscale="log", xlabel="training PFLOPs", title="Top-1 against training FLOPs")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    known = {"runs": None, "budget": None, "out": None, "json": None}
    args = parse_args(sys.argv[1:] if argv is None else argv, known, ("runs",), lists=("budget",))
    runs = Path(args["runs"])
    if not runs.is_dir():
        raise UsageError(f"runs={runs} is not a folder")
    macs_at: dict = {}
    points = map_points(runs, macs_at)
    budgeted = budget_points([Path(f) for f in args["budget"]], macs_at) if args["budget"] else []
    anchor_flops = convmixer_flops()
    if args["out"]:
        draw(points, budgeted, anchor_flops, Path(args["out"]))
    if args["json"]:
        anchors = [dict(label=label, epochs=epochs, test_top1=top1) for label, epochs, top1 in ANCHORS]
        values = dict(points=points, budget_runs=budgeted, anchors=anchors, convmixer_forward_flops=anchor_flops)
        write_record(measurement_record("accuracy_map", values, script_command(__file__, argv)), args["json"])
    print(map_table(points))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

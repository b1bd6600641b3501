"""The reference for experiment=cifar10_cpu: a plain timm + torchvision CIFAR-10 training loop, as a user would write
it, given the same wall-clock budget on the same machine (docs/RESULTS.md, "CIFAR-10 on a 2-core CPU in a 30-minute
budget").

usage: python lab/cifar10_cpu_reference.py data.root=<CIFAR-10 JPEG folder or archive> out=<folder>
    [budget_s=1800] [seed=0] [batch_size=128] [workers=2] [lr=5e-4] [weight_decay=0.05] [embed_dim=96]
    [depth=6] [num_heads=2] [mlp_ratio=2.0] [qk_norm=true] [eval_every=2]

What runs: timm's `VisionTransformer` of the recipe's size and of its family as far as timm builds it (32 px,
patch 4, 96 wide, 6 deep, 2 heads, MLP ratio 2, qk-norm), with timm's learned position embedding and linear patch
embedding where the recipe has mixed rotary positions and a convolutional stem (timm's `VisionTransformer` has
neither); the runs in docs/RESULTS.md before 2026-11-26 were of the earlier recipe's size (embed_dim=128
num_heads=4 qk_norm=false). It reads torchvision's `ImageFolder` (train/ and test/ class folders; an archive is
extracted once into the cache) with RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor and Normalize in a
`DataLoader` with `workers` worker processes; AdamW on every parameter, label smoothing 0.1, fp32, a linear warmup
over the first epoch, then a cosine to 0 per step. The budget decides the epoch count: the first epoch is timed
(with one test evaluation), and the cosine is laid over as many more epochs as fit in what is left, so the loop
ends with its learning rate at 0 and its final test evaluation inside `budget_s`, counted from process start, as
the recipe's clock is.

Writes `<out>/metrics.json`: params, epochs, images seen, wall time, final test top-1, and the history of test
top-1 against elapsed seconds (the test split is evaluated every `eval_every` epochs for that curve; nothing is
chosen by it) in the trainer's metrics.json layout, with its `provenance` (command, commit, machine, versions:
vit/records/provenance.py) as the trainer's, and its settings and command-line keys in a run folder's
`.hydra/config.yaml` and `.hydra/overrides.yaml` (as `experiment=timm_torchvision_reference`), so
lab/plot_recipes.py tables and draws it beside the recipe's runs.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
import yaml
from records import script_command
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from vit.cli.args import parse_args, run_script
from vit.data.sources.archive import extract_archive, is_archive
from vit.data.sources.folders import find_tree_root
from vit.errors import UsageError
from vit.records.provenance import provenance
from vit.train.run import startup_seconds

DEFAULTS = {
    "data.root": None,
    "out": None,
    "budget_s": "1800",
    "seed": "0",
    "batch_size": "128",
    "workers": "2",
    "lr": "5e-4",
    "weight_decay": "0.05",
    "embed_dim": "96",
    "depth": "6",
    "num_heads": "2",
    "mlp_ratio": "2.0",
    "qk_norm": "true",
    "eval_every": "2",
}
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def number(args: dict, key: str, kind=float):
    try:
        value = kind(args[key])
    except ValueError:
        raise UsageError(f"{key}={args[key]!r} must be a {kind.__name__}") from None
    if value <= 0:
        raise UsageError(f"{key}={args[key]!r} must be positive")
    return value


def loaders(root: str, batch_size: int, workers: int, seed: int) -> tuple[DataLoader, DataLoader]:
    folder = extract_archive(root) if is_archive(root) else Path(root)
    if not folder.is_dir():
        raise UsageError(f"data.root={root!r} is neither a folder nor an archive")
    tree = find_tree_root(folder)
    normalize = transforms.Normalize(MEAN, STD)
    train_tf = transforms.Compose(
        [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]
    )
    test_tf = transforms.Compose([transforms.ToTensor(), normalize])
    train = datasets.ImageFolder(str(tree / "train"), train_tf)
    test = datasets.ImageFolder(str(tree / "test"), test_tf)
    common = dict(num_workers=workers, persistent_workers=workers > 0)
    generator = torch.Generator().manual_seed(seed)
    train_loader = DataLoader(train, batch_size, shuffle=True, drop_last=True, generator=generator, **common)
    return train_loader, DataLoader(test, 256, shuffle=False, **common)


@torch.no_grad()
def test_top1(model: torch.nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = total = 0
    for images, targets in loader:
        correct += (model(images).argmax(-1) == targets).sum().item()
        total += len(targets)
    model.train()
    return 100.0 * correct / total


def main(argv: list[str]) -> int:
    args = parse_args(argv, DEFAULTS, ("data.root", "out"))
    start = time.perf_counter() - startup_seconds()  # the clock runs from process start
    budget = number(args, "budget_s")
    if not args["seed"].isdigit():
        raise UsageError(f"seed={args['seed']!r} must be a whole number >= 0")
    seed = int(args["seed"])
    batch_size, workers = number(args, "batch_size", int), int(args["workers"])
    eval_every = number(args, "eval_every", int)
    if args["qk_norm"] not in ("true", "false"):
        raise UsageError(f"qk_norm={args['qk_norm']!r} must be true or false")
    out = Path(args["out"])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    train_loader, test_loader = loaders(args["data.root"], batch_size, workers, seed)
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=32,
        patch_size=4,
        num_classes=10,
        embed_dim=number(args, "embed_dim", int),
        depth=number(args, "depth", int),
        num_heads=number(args, "num_heads", int),
        mlp_ratio=number(args, "mlp_ratio"),
        qk_norm=args["qk_norm"] == "true",
    )
    lr = number(args, "lr")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=number(args, "weight_decay"))
    steps_per_epoch = len(train_loader)
    epochs, step, history = None, 0, []  # epochs: decided after the first, timed epoch
    epoch = 0
    while epochs is None or epoch < epochs:
        epoch += 1
        epoch_start = time.perf_counter()
        for images, targets in train_loader:
            if epoch == 1:  # linear warmup over the first epoch
                scale = (step + 1) / steps_per_epoch
            else:  # cosine to 0 over the remaining steps
                done = (step - steps_per_epoch) / ((epochs - 1) * steps_per_epoch)
                scale = 0.5 * (1 + math.cos(math.pi * min(1.0, done)))
            for group in optimizer.param_groups:
                group["lr"] = lr * scale
            loss = F.cross_entropy(model(images), targets, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
        epoch_s = time.perf_counter() - epoch_start
        record = {"epoch": epoch, "train_loss": round(loss.item(), 4)}
        if epoch == 1 or epoch % eval_every == 0 or epoch == epochs:
            eval_start = time.perf_counter()
            record["val_top1"] = test_top1(model, test_loader)
            eval_s = time.perf_counter() - eval_start
            if epoch == 1:  # what fits: each later epoch plus its share of evaluations, and the final evaluation
                left = budget - (time.perf_counter() - start) - eval_s
                epochs = 1 + max(1, int(left / (epoch_s + eval_s / eval_every)))
        record["elapsed_s"] = round(time.perf_counter() - start, 1)
        history.append(record)
        print(json.dumps(record), flush=True)
    wall = time.perf_counter() - start
    metrics = {
        "model": "timm VisionTransformer",
        "params": sum(p.numel() for p in model.parameters()),
        "epochs_done": epochs,
        "images_seen": epochs * steps_per_epoch * batch_size,
        "wall_time_s": round(wall, 1),
        "test": {"split": "test", "top1": history[-1]["val_top1"]},
        "final": history[-1],
        "threads": torch.get_num_threads(),
        "loader_workers": workers,
        "history": history,
        "val_split": "test",
        "provenance": provenance(script_command(__file__, argv)),  # command, commit, machine, versions, date
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    settings = {key: value for key, value in args.items() if key not in ("data.root", "out")}
    config = {"model": {"name": metrics["model"]}, "trainer": {"seed": seed, "epochs": epochs}, "reference": settings}
    (out / ".hydra").mkdir(exist_ok=True)
    (out / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    overrides = ["experiment=timm_torchvision_reference", f"trainer.seed={seed}"]
    (out / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    print(f"test top-1 {metrics['test']['top1']:.2f}% after {epochs} epochs in {wall:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

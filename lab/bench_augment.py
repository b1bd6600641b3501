"""What the batch augmentation (vit/data/augment/batch.py's `BatchAugment`: pad-crop, flip, policy, normalisation) costs
per batch, against torchvision's v2 policies called on chunks of 16 images (one draw per call: the way a loader
uses them on batches): wall time and the number of aten ops dispatched, the proxy for kernel launches on a GPU.

usage: python lab/bench_augment.py [policies=autoaug,trivial,rand-m9-mstd0.5-inc1] [batch=512] [size=32]
    [repeats=15] [warmup=3] [count_batches=10] [device=cpu] [threads=<n>] [json=<file>]

    python lab/bench_augment.py batch=512 size=32 repeats=15 json=augment.json

Every policy and implementation is timed in one process, interleaved, on fresh random uint8 batches; the table
reports medians. "ours (whole batch)" is the CUDA code path (each op on the whole batch, kept by torch.where: no
host sync) forced on this device; "ours" is the device's own path. torchvision has no counterpart of timm's
RandAugment strings, so those rows have no torchvision line. `policies` is a comma list of auto_augment values;
`repeats` batches of each row are timed (after `warmup` untimed ones), the op counts are a mean over `count_batches`
batches; `threads` sets torch's CPU threads (default: torch's). Prints a markdown table; json=<file> writes the
measurement record: every timed batch's milliseconds of every row, the medians and op counts, and the provenance
(command, commit, machine, versions: vit/records/provenance.py).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter

import numpy as np
import torch
from records import measurement_record, script_command, write_record
from torch.utils._python_dispatch import TorchDispatchMode
from torchvision.transforms import v2

from vit.cli.args import parse_args, run_script
from vit.data.augment.batch import BatchAugment
from vit.data.augment.policies import is_small
from vit.data.augment.spec import augment_settings
from vit.data.sources.registry import DATASETS
from vit.errors import UsageError

# (label, implementation, force the whole-batch path)
IMPLS = (
    ("torchvision", "torchvision", False),
    ("ours", "ours", False),
    ("ours (whole batch)", "ours", True),
)
CHUNK = 16  # images per torchvision policy call


class CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched inside it: all, those that are views (no kernel), and those whose outputs
    have fewer than 16 elements (0-d draws, 2x3 matrices: host-side scalars when the images live on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.counts["all"] += 1
        if func.is_view:
            self.counts["views"] += 1
        else:
            outs = out if isinstance(out, (tuple, list)) else [out]
            if all(isinstance(t, torch.Tensor) and t.numel() < 16 for t in outs):
                self.counts["small"] += 1
        return out


def torchvision_policy(policy: str, size: int):
    if policy == "autoaug":
        return v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10 if is_small(size) else v2.AutoAugmentPolicy.IMAGENET)
    return v2.TrivialAugmentWide() if policy == "trivial" else None


def make_augment(policy: str | None, impl: str, whole_batch: bool, size: int):
    """(uint8 batch, generator) -> float batch, for one row of the table; None where there is no such row."""
    spec = augment_settings(
        {"crop": "pad", "pad": 4, "scale_min": 0.08, "hflip": True, "re_prob": 0.0, "mixup_alpha": 0.0,
         "cutmix_alpha": 0.0, "mixup_prob": 1.0, "label_smoothing": 0.0,
         "auto_augment": policy if impl == "ours" else None}
    )  # fmt: skip
    augment = BatchAugment(spec, *DATASETS["cifar10"].mean_std, size, train=True)
    if impl == "ours":
        if whole_batch and augment.policy is not None:
            augment.policy.subsets = False
            augment.policy.pillow = False  # timm's RandAugment: its tensor kernels, not Pillow's
        return augment
    reference = torchvision_policy(policy, size) if policy else None
    if policy and reference is None:
        return None

    def with_torchvision(x, generator):  # the policy per chunk (before the crop and flip: the same cost), then ours
        if reference is not None:
            x = torch.cat([reference(chunk) for chunk in x.split(CHUNK)])
        return augment(x, generator)

    return with_torchvision


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str]) -> int:
    known = {"policies": "autoaug,trivial,rand-m9-mstd0.5-inc1", "batch": "512", "size": "32", "repeats": "15"}
    known |= {"warmup": "3", "count_batches": "10", "device": "cpu", "threads": None, "json": None}
    args = parse_args(argv, known, lists=("policies",))
    batch_size, size, repeats = args.integer("batch"), args.integer("size"), args.integer("repeats")
    warmup, count_batches = args.integer("warmup", minimum=0), args.integer("count_batches")
    threads = args.integer("threads")
    try:
        device = torch.device(args["device"])
    except RuntimeError:
        raise UsageError(f"device={args['device']!r} is not a torch device (cpu, cuda, cuda:1, ...)") from None
    if threads is not None:
        torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch_size, size, size, 3), dtype=np.uint8)
    torch.manual_seed(0)

    cases = [(p, *impl) for p in ["none", *args["policies"]] for impl in (IMPLS if p != "none" else IMPLS[:1])]
    augments = {
        (p, label): make_augment(None if p == "none" else p, impl, whole, size) for p, label, impl, whole in cases
    }
    augments = {key: fn for key, fn in augments.items() if fn is not None}
    generator = torch.Generator(device=device).manual_seed(0)
    batch = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device)  # (B, 3, H, W) uint8

    def run(key) -> float:
        x = batch[torch.randperm(len(batch), device=device)]
        sync(device)
        start = time.perf_counter()
        augments[key](x, generator)
        sync(device)
        return time.perf_counter() - start

    ops = {}
    for key in augments:
        for _ in range(warmup):
            run(key)
        with CountOps() as counter:  # the draws decide which ops run: a mean over several batches
            for _ in range(count_batches):
                augments[key](batch, generator)
        ops[key] = {name: count / count_batches for name, count in counter.counts.items()}
    times: dict[tuple, list[float]] = {key: [] for key in augments}
    for _ in range(repeats):  # interleaved: a slow phase of the machine hits every case alike
        for key in augments:
            times[key].append(run(key))

    print(
        f"batch {batch_size} x 3 x {size} x {size} uint8, device {device}, {torch.get_num_threads()} "
        f"threads; time: median of {repeats}, interleaved; ops: mean of {count_batches} batches"
    )
    print()
    print(
        "| policy | implementation | ms / batch (median) | aten ops / batch | of them views | of them < 16 elements |"
    )
    print("|---|---|---|---|---|---|")
    rows = []
    for key in augments:
        policy, label = key
        count = {name: round(ops[key].get(name, 0)) for name in ("all", "views", "small")}
        impl = "-" if policy == "none" else label
        median_ms = 1e3 * statistics.median(times[key])
        print(f"| {policy} | {impl} | {median_ms:.1f} | {count['all']} | {count['views']} | {count['small']} |")
        rows.append({"policy": policy, "implementation": impl, "ms_repeats": [1e3 * t for t in times[key]]})
        rows[-1] |= {"ms_median": median_ms, "ops_per_batch": ops[key]}
    if args["json"]:
        values = {"batch": batch_size, "size": size, "device": str(device), "threads": torch.get_num_threads()}
        values |= {"repeats": repeats, "count_batches": count_batches, "rows": rows}
        write_record(measurement_record("bench_augment", values, script_command(__file__, argv)), args["json"])
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

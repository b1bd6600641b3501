"""What the GPU loader's augmentation costs per batch with `data.augment.policy_impl=torchvision` (v2 policies on
chunks of `policy_chunk` images) and `batched` (vit/data/batched_policy.py): wall time of `GpuLoader.augment` and
the number of aten ops it dispatches, the proxy for kernel launches on a GPU.

    python scripts/bench_augment.py --batch 512 --size 32 --repeats 15

Every policy and implementation is timed in one process, interleaved, on fresh random uint8 batches; the table
reports medians. "batched (whole batch)" is the CUDA code path (each op on the whole batch, kept by torch.where:
no host sync) forced on this device; "batched" is the device's own path. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vit.data.batched_policy import BatchedPolicy
from vit.data.gpu_loader import GpuLoader

# (label, policy_impl, force the whole-batch path)
IMPLS = (
    ("torchvision", "torchvision", False),
    ("batched", "batched", False),
    ("batched (whole batch)", "batched", True),
)


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


def make_loader(policy: str, impl: str, whole_batch: bool, images: np.ndarray, device: torch.device) -> GpuLoader:
    aug = {"crop": "pad", "pad": 4, "hflip": True, "auto_augment": policy, "policy_impl": impl}
    loader = GpuLoader(
        images, np.zeros(len(images)), {"name": "cifar10", "augment": aug}, batch_size=len(images), device=device,
        train=True, seed=0,
    )  # fmt: skip
    if whole_batch and isinstance(loader.policy, BatchedPolicy):
        loader.policy.subsets = False
    return loader


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="autoaug,trivial,rand-m9-n2", help="comma list of auto_augment values")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=15, help="timed batches per policy and implementation")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--count-batches", type=int, default=10, help="batches the op counts are averaged over")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.batch, args.size, args.size, 3), dtype=np.uint8)
    torch.manual_seed(0)

    cases = [(p, *impl) for p in ["none", *args.policies.split(",")] for impl in (IMPLS if p != "none" else IMPLS[:1])]
    loaders = {
        (p, label): make_loader(None if p == "none" else p, impl, whole, images, device)
        for p, label, impl, whole in cases
    }
    generator = torch.Generator(device=device).manual_seed(0)
    batch = loaders[cases[0][0], cases[0][1]].images  # (B, 3, H, W) uint8 on the device

    def run(key) -> float:
        x = batch[torch.randperm(len(batch), device=device)]
        sync(device)
        start = time.perf_counter()
        loaders[key].augment(x, generator)
        sync(device)
        return time.perf_counter() - start

    ops = {}
    for key in loaders:
        for _ in range(args.warmup):
            run(key)
        with CountOps() as counter:  # the draws decide which ops run: a mean over several batches
            for _ in range(args.count_batches):
                loaders[key].augment(batch, generator)
        ops[key] = {name: count / args.count_batches for name, count in counter.counts.items()}
    times: dict[tuple, list[float]] = {key: [] for key in loaders}
    for _ in range(args.repeats):  # interleaved: a slow phase of the machine hits every case alike
        for key in loaders:
            times[key].append(run(key))

    print(
        f"batch {args.batch} x 3 x {args.size} x {args.size} uint8, device {device}, {torch.get_num_threads()} "
        f"threads; time: median of {args.repeats}, interleaved; ops: mean of {args.count_batches} batches"
    )
    print()
    print("| policy | policy_impl | ms / batch (median) | aten ops / batch | of them views | of them < 16 elements |")
    print("|---|---|---|---|---|---|")
    for key in loaders:
        policy, label = key
        count = {name: round(ops[key].get(name, 0)) for name in ("all", "views", "small")}
        impl = "-" if policy == "none" else label
        median_ms = 1e3 * statistics.median(times[key])
        print(f"| {policy} | {impl} | {median_ms:.1f} | {count['all']} | {count['views']} | {count['small']} |")


if __name__ == "__main__":
    main()

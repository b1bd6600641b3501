"""Per-rank memory and step time of data-parallel training, DDP against FSDP (trainer.strategy=ddp | fsdp, and
fsdp with trainer.reshard_after_forward=false).

usage: python lab/bench_fsdp.py [models=vit_base,vit_large] [strategies=ddp,fsdp,fsdp_zero2] [world_size=2]
    [img_size=224] [batch_size=2] [steps=3] [repeats=1] [device=cpu] [json=<file>]

Each (model, strategy) runs in a fresh process group of `world_size` processes (gloo on the CPU, nccl on CUDA), so
each process's peak resident set size (`ru_maxrss`) or peak CUDA memory is that setting's alone. Every rank builds
the model from the same seed (vit_large: ViT-L/16, the vit_base entry made 1024 wide, 24 deep, 16 heads), wraps
it as the trainer does (DistributedDataParallel, or `shard_model` of vit/runtime/sharding.py: each block, then the
root; `fsdp` frees each block's gathered weights after its forward and gathers them again for its backward, ZeRO-3,
`fsdp_zero2` keeps them from the forward to the backward, ZeRO-2: one all-gather a step fewer, more memory), and
trains `steps` AdamW steps (fp32, cross-entropy against random labels, one untimed first step) on its own random
batch of `batch_size` images. It reports, per rank:
    params / grads / optimizer MiB   the bytes of the tensors this rank holds (a sharded parameter's local shard;
                                     the gradients after a backward pass; AdamW's two moments and step after a step)
    peak MiB                         the process's peak RSS on the CPU, peak allocated memory on CUDA
    step s                           the median time of the timed steps (forward, backward, optimizer step)
The strategies alternate, model by model, `repeats` times. json=<file> writes the measurement record (every rank's
row and the provenance: command, commit, machine, versions).

    python lab/bench_fsdp.py                                   # ViT-B/16 and ViT-L/16, 2 processes, 224 px
    python lab/bench_fsdp.py models=vit_tiny img_size=32 batch_size=4 steps=2 json=fsdp.json
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from records import script_command  # noqa: E402

from vit.cli.args import parse_args, run_script  # noqa: E402  (this checkout's vit)
from vit.errors import UsageError  # noqa: E402

# strategy -> shard_model's reshard_after_forward (None: not sharded, DistributedDataParallel)
STRATEGIES = {"ddp": None, "fsdp": True, "fsdp_zero2": False}
NUMBERS = ("world_size", "img_size", "batch_size", "steps", "repeats")
KNOWN = {"models": "vit_base,vit_large", "strategies": ",".join(STRATEGIES), "world_size": "2", "img_size": "224"}
KNOWN |= {"batch_size": "2", "steps": "3", "repeats": "1", "device": "cpu", "json": None}
# ViT-L/16 (timm vit_large_patch16_224): not a registered name here, so the ViT-B entry with its shape.
SHAPES = {"vit_large": ("vit_base", {"embed_dim": 1024, "depth": 24, "num_heads": 16})}
MIB = 2**20


def read_args(argv: list[str]) -> SimpleNamespace:
    args = parse_args(argv, KNOWN, lists=("models", "strategies"))
    numbers = {key: args.integer(key) for key in NUMBERS}
    if min(numbers.values()) < 1:
        raise UsageError(f"{', '.join(NUMBERS)} must be whole numbers >= 1")
    if args["device"] not in ("cpu", "cuda"):
        raise UsageError(f"device={args['device']!r} must be cpu or cuda")
    models = args["models"]
    from vit.models import list_models

    unknown = [name for name in models if name not in SHAPES and name not in list_models()]
    if unknown or not models:
        raise UsageError(f"models={args['models']!r}: {unknown[0] if unknown else 'none'} is not a model name")
    strategies = args["strategies"]
    bad = [name for name in strategies if name not in STRATEGIES]
    if bad or not strategies:
        raise UsageError(f"strategies={args['strategies']!r}: each of {', '.join(STRATEGIES)}")
    return SimpleNamespace(models=models, strategies=strategies, device=args["device"], json=args["json"], **numbers)


def tensor_mib(tensors) -> float:
    """The bytes this rank holds of `tensors` (a DTensor's local shard), in MiB."""
    from vit.runtime.sharding import local

    return sum(local(t).numel() * t.element_size() for t in tensors if t is not None) / MIB


def peak_mib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def build(name: str, img_size: int):
    from vit.models import create_model

    base, shape = SHAPES.get(name, (name, {}))
    return create_model(base, img_size=img_size, num_classes=1000, **shape)


def rank_main(rank: int, args: SimpleNamespace, model_name: str, strategy: str, port: int, queue) -> None:
    """One rank of one setting: build, wrap, train `steps` steps; its row goes to `queue`."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from vit.runtime.sharding import shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.world_size)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world_size))
    torch.manual_seed(0)
    model = build(model_name, args.img_size).to(device).train()
    if STRATEGIES[strategy] is not None:
        model = shard_model(model, None, reshard_after_forward=STRATEGIES[strategy])
        step_model = model
    else:
        step_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(args.batch_size, 3, args.img_size, args.img_size, generator=generator).to(device)
    labels = torch.randint(0, 1000, (args.batch_size,), generator=generator).to(device)
    times, grads_mib = [], 0.0
    for step in range(args.steps + 1):  # the first step (allocations, lazy optimizer state) is not timed
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        F.cross_entropy(step_model(images), labels).backward()
        grads_mib = tensor_mib(p.grad for p in model.parameters())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        if step:
            times.append(time.perf_counter() - start)
    state = [value for values in optimizer.state.values() for value in values.values() if torch.is_tensor(value)]
    row = {
        "model": model_name,
        "strategy": strategy,
        "rank": rank,
        "params_mib": tensor_mib(model.parameters()),
        "grads_mib": grads_mib,
        "optimizer_mib": tensor_mib(state),
        "peak_mib": peak_mib(device),
        "step_s": statistics.median(times),
    }
    queue.put(row)
    dist.barrier()
    dist.destroy_process_group()


def run_setting(args: SimpleNamespace, model_name: str, strategy: str) -> list[dict]:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(
        rank_main, (args, model_name, strategy, free_port(), queue), nprocs=args.world_size, start_method="spawn"
    )
    return sorted((queue.get() for _ in range(args.world_size)), key=lambda row: row["rank"])


def free_port() -> int:
    """A TCP port free on this machine now, for the process group's rendezvous."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def summary(rows: list[dict]) -> str:
    lines = ["model      strategy    rank   params MiB   grads MiB   optimizer MiB   peak MiB   step s"]
    for r in rows:
        lines.append(
            f"{r['model']:<10} {r['strategy']:<11} {r['rank']:>4} {r['params_mib']:>12.1f} {r['grads_mib']:>11.1f} "
            f"{r['optimizer_mib']:>15.1f} {r['peak_mib']:>10.0f} {r['step_s']:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = read_args(argv)
    rows = []
    for repeat in range(args.repeats):
        for model_name in args.models:
            for strategy in args.strategies:  # interleaved: a drift in the machine's load touches both alike
                rows += [{**row, "repeat": repeat} for row in run_setting(args, model_name, strategy)]
                print(summary(rows[-args.world_size :]).splitlines()[-1], flush=True)
    print(summary(rows))
    if args.json:
        from records import measurement_record, write_record

        settings = {"models": args.models, "strategies": args.strategies, "device": args.device}
        settings |= {key: getattr(args, key) for key in NUMBERS}
        record = measurement_record("bench_fsdp", {"settings": settings, "rows": rows}, script_command(__file__, argv))
        write_record(record, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

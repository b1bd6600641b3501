"""Data-parallel training under `torchrun`: one process per GPU (or CPU process with gloo), set up from the
environment torchrun provides (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT). A plain `python train.py` sees
no WORLD_SIZE and stays single-process: every helper here is then a no-op.

Conventions: `data.batch_size` is per process, so the global batch is batch_size x world_size x accum_steps
(the learning rate is scaled by that global batch). Rank 0 alone writes TensorBoard, checkpoints and metrics;
every rank reads the same checkpoint file to resume, so multi-node runs need a shared output directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this run created the process group (and so destroys it at the end)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """The device of this rank: cuda:<LOCAL_RANK> under torchrun on GPUs."""
        if self.enabled and device.type == "cuda":
            return torch.device("cuda", self.local_rank)
        return device

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce (sum) in place over the ranks; returns the tensor."""
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank when it is true on one: ranks must agree on when to stop."""
        if not self.enabled:
            return flag
        return bool(self.max_(torch.tensor([int(flag)], device=device)).item())

    def broadcast(self, obj):
        """Rank 0's value of a picklable object, on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's value of a picklable object, in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def env_rank() -> int:
    """This process's rank as torchrun announces it (0 outside torchrun), readable before any setup."""
    return int(os.environ.get("RANK", "0"))


def worker_hydra_overrides() -> list[str]:
    """Extra Hydra overrides for torchrun ranks other than 0: no .hydra/ copy of the config and no log file,
    so a worker whose clock named a different run folder leaves it empty (`run` then removes it)."""
    if env_rank() == 0:
        return []
    return ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]


def setup_distributed(device: torch.device, strategy: str = "ddp") -> Distributed:
    """Join (or create) the process group torchrun describes: nccl on CUDA, gloo on CPU. Outside torchrun a run
    stays without a group, except under trainer.strategy=fsdp, whose sharded parameters need one: a group of one
    process (an in-memory store, no port), so the same command runs with and without torchrun."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1 and strategy != "fsdp":
        return Distributed()
    rank, local_rank = env_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    owns_group = False
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if world_size <= 1:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
        owns_group = True
    return Distributed(dist.get_rank(), dist.get_world_size(), local_rank, owns_group)

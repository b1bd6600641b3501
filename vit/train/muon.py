"""Muon (`optim.name=muon|nmuon`) as timm computes it, with its Newton-Schulz iterations batched and in a precision the
device computes natively.

timm's Muon orthogonalises each weight matrix's update on its own: five Newton-Schulz iterations (three matrix
products each) per matrix, in bf16. That costs more than its arithmetic says where the matrices are small and bf16
is not native: the CPU recipe's model has 24 matrices of four shapes (a block's qkv (288, 96), proj (96, 96), fc1
(192, 96) and fc2 (96, 192), six blocks), and on an AVX2 CPU, where bf16 is emulated, timm's step took longer than
the model's forward and backward (docs/BENCHMARKS.md, "The optimizer step on the CPU").

`BatchedMuon` keeps timm's class, and with it every rule of what goes to Muon and what to its AdamW fallback, the
momentum, weight decay and the per-shape rate scale; only the function its step calls for the Muon half is
replaced (`batched_muon`), for the duration of the step. It stacks the updates of one shape into a (B, m, n)
batch and runs timm's own `zeropower_via_newtonschulz` once per shape (batched matrix products, the same
normalisation per matrix), in bf16 where the device has it natively (a GPU from Ampere on, a CPU with AVX512-BF16
or AMX) and in fp32 elsewhere. Per matrix the result is timm's to floating-point rounding: the same iterations on
the same numbers (tests/train/test_muon.py compares it with timm's per-matrix step).
"""

from __future__ import annotations

import functools
from collections import defaultdict

import timm.optim.muon as timm_muon
import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from vit.runtime.device import cpu_has_native_bf16, cuda_has_native_bf16


def native_ns_dtype(device: torch.device) -> torch.dtype:
    """bf16 where `device` computes it natively, else fp32 (emulated bf16 is slower than fp32 on a CPU)."""
    native = cuda_has_native_bf16(device) if device.type == "cuda" else cpu_has_native_bf16()
    return torch.bfloat16 if native else torch.float32


def batched_muon(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    momentum_bufs: list[torch.Tensor],
    *,
    dtype: torch.dtype,
    timm_step,
    **settings,
) -> None:
    """timm's functional Muon step (`timm.optim.muon.muon`, whose keywords `settings` are) with the Newton-Schulz
    iterations of same-shaped matrices run as one batch in `dtype`. Updates that are not matrices (a conv kernel,
    reshaped by timm's conv_mode) and a capturable step (CUDA graphs, tensor rates) go to timm's own `timm_step`.
    Sharded parameters (DTensors, trainer.strategy=fsdp): the decay and momentum act on each rank's shards; the
    iterations need each matrix whole, so every rank gathers the updates, runs them as an unsharded run does (the
    same batches, the same precision) and keeps its own shard of the result."""
    if settings.get("capturable") or any(p.ndim != 2 for p in params):
        timm_step(params, grads, momentum_bufs, **settings)
        return
    lr, momentum = settings["lr"], settings["momentum"]
    coefficients = timm_muon.resolve_ns_coefficients(settings["ns_coefficients"], timm_muon._COEFFICIENTS)
    torch._foreach_mul_(params, 1 - lr * settings["weight_decay"])  # decoupled weight decay, as timm's
    torch._foreach_lerp_(momentum_bufs, grads, 1 - momentum)
    updates = torch._foreach_lerp(grads, momentum_bufs, momentum) if settings["nesterov"] else momentum_bufs
    sharded = [update if isinstance(update, DTensor) else None for update in updates]
    updates = [update.full_tensor() if isinstance(update, DTensor) else update for update in updates]  # gathered
    by_shape: dict[torch.Size, list[int]] = defaultdict(list)
    for i, update in enumerate(updates):
        by_shape[update.shape].append(i)
    for shape, indices in by_shape.items():
        stacked = torch.stack([updates[i] for i in indices])  # (B, m, n): every matrix of this shape
        ortho = timm_muon.zeropower_via_newtonschulz(
            stacked,
            settings["ns_steps"],
            coefficients,
            eps=settings["eps"],
            safety_factor=settings["safety_factor"],
            dtype=dtype,
            scale_eps=settings["scale_eps"],
        )
        adjust = settings["adjust_lr_fn"]
        scale = timm_muon.get_lr_scale(shape, adjust) if adjust else 1.0
        targets = [params[i] for i in indices]
        results = [
            own_shard(o.to(p.dtype), sharded[i]) for o, p, i in zip(ortho.unbind(0), targets, indices, strict=True)
        ]
        torch._foreach_add_(targets, results, alpha=-lr * scale)


def own_shard(whole: torch.Tensor, like: DTensor | None) -> torch.Tensor:
    """`whole` as it is, or (`like` a sharded update) this rank's shard of it, laid out as `like` (every rank holds
    the same `whole`: nothing is sent)."""
    if like is None:
        return whole
    return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None)


class BatchedMuon(timm_muon.Muon):
    """timm's Muon whose step batches the Newton-Schulz iterations by shape, in `ns_dtype` (see the module)."""

    def __init__(self, params, *, ns_dtype: torch.dtype = torch.float32, **settings) -> None:
        super().__init__(params, **settings)
        self.ns_dtype = ns_dtype

    @classmethod
    def of(cls, built: timm_muon.Muon, device: torch.device) -> BatchedMuon:
        """The same optimizer as `built` (timm's factory's, before any step): its groups and defaults as they are."""
        return cls(built.param_groups, ns_dtype=native_ns_dtype(device), **built.defaults)

    def step(self, closure=None):
        timm_step = timm_muon.muon  # the functional step timm's Muon.step calls for its Muon half
        timm_muon.muon = functools.partial(batched_muon, dtype=self.ns_dtype, timm_step=timm_step)
        try:
            return super().step(closure)
        finally:
            timm_muon.muon = timm_step

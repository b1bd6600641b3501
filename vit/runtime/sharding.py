"""Sharded data parallel (`trainer.strategy=fsdp`): PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`) over the
ranks of a torchrun launch, or over one process without it.

Each unit below is sharded on its own, then the root takes what is left (patch embedding, tokens, positions, the
final norm and head): a parameter becomes a DTensor holding 1/world_size of its rows on each rank, and so do its
gradient and its optimizer state. A unit's parameters are gathered just before its forward and freed after it
(`reshard_after_forward`, ZeRO-3) or kept to its backward (ZeRO-2); its gradients are reduce-scattered in the
backward pass, so each rank keeps only its shard. The units are the model's repeated layers, where the memory is:
    encoder blocks (and an MAE's decoder blocks)       vit.models.layers.Block
    T2T-ViT's token modules                            TokenTransformer, TokenPerformer

Precision: under bf16 (`trainer.amp`, vit/runtime/device.py) the gathered parameters are cast to bf16, halving the
all-gathers, and the gradients are reduced in fp32 (`MixedPrecisionPolicy`); the autocast around the forward pass
stays what it is without sharding. fp16 is refused: its gradient scaler does not take sharded gradients.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from vit.models.layers import Block
from vit.models.performer import TokenPerformer
from vit.models.t2t import TokenTransformer

SHARD_UNITS: tuple[type[nn.Module], ...] = (Block, TokenTransformer, TokenPerformer)


def shard_model(model: nn.Module, dtype: torch.dtype | None, reshard_after_forward: bool = True) -> nn.Module:
    """Shard `model` in place over the default process group: each of its SHARD_UNITS, then the root. `dtype`: the
    precision's autocast dtype (None for fp32). Returns the model, now also an FSDPModule."""
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype is not None else None)
    for module in list(model.modules()):
        if module is not model and isinstance(module, SHARD_UNITS):
            fully_shard(module, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; any other tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def gathered(tensor: torch.Tensor) -> torch.Tensor:
    """The whole value of a DTensor on every rank (a collective: every rank must call it); any other tensor as it
    is. A gradient norm computed over sharded gradients is a DTensor whose full value is the global norm."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def reshard(model: nn.Module) -> None:
    """Free every gathered block of a sharded model, so its parameters are the sharded ones again (what the optimizer
    holds and a checkpoint saves). Under reshard_after_forward=false a forward pass without a backward (an
    evaluation, a figure) leaves them gathered. Any other model: nothing to do."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()

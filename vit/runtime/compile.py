"""What `trainer.compile` compiles: the whole training model, or (`trainer.compile_scope=blocks`) each encoder
block on its own, "regional compilation".

A ViT is the same block twelve times. Compiled whole, torch.compile traces and optimises all twelve as one graph;
compiled block by block, it builds the graph of one block once and every other block reuses it (same code, same
shapes, only the weights differ), so compiling costs a fraction of the time: measured on the dev CPU, ViT-Ti/4's
first training step took 14.3-14.6 s instead of 32.8-33.2 s with fresh caches, later steps equal
(docs/BENCHMARKS.md). What it gives up is fusion across the block boundaries (the patch embedding, the head and the
residual stream between blocks stay eager). The blocks are compiled in place (`nn.Module.compile`), so the state
dict, checkpoints and EMA are those of the plain model.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from vit.models.layers import Block
from vit.models.performer import TokenPerformer
from vit.models.t2t import TokenTransformer

# The repeated units of our models: the encoder Block, and T2T-ViT's two token blocks.
REGIONS = (Block, TokenTransformer, TokenPerformer)


def compile_blocks(model: nn.Module, mode: str | None = None, dynamic: bool | None = None) -> int:
    """Compile every encoder block of `model` in place; returns how many."""
    blocks = [module for module in model.modules() if isinstance(module, REGIONS)]
    for block in blocks:
        block.compile(mode=mode, dynamic=dynamic)
    return len(blocks)


def eager():
    """Run compiled code eagerly inside this context (evaluation: a small share of the time, and compiling it too
    would add graphs for eval mode and for the last, smaller batch)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else nullcontext()

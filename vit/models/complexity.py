"""Parameters and multiply-adds of a model, counted from the formulas of its layers.

For one image, with N tokens of width C:
    multi-head self-attention  4·N·C² + 2·N²·C   (Q, K, V and output projections; Q·Kᵀ and attn·V)
    MLP                        2·N·C·hidden      (fc1 and fc2)
    patch embedding            N·C·(in_chans·p²)   (N·C·(5·in_chans·p²) with Shifted Patch Tokenization)
A forward pass of one image records each layer's token count and width; the formulas do the rest. FLOPs
are counted as 2 per multiply-add, the convention of `torch.utils.flop_counter`. Norms, softmax, GELU and
additions are left out, as they are there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from vit.models.attention import Attention


def attention_macs(num_tokens: int, dim: int, dim_out: int | None = None) -> int:
    """Multiply-adds of one self-attention layer: 4·N·C² + 2·N²·C when dim_out == dim == C.

    qkv: N·dim·3·dim_out, Q·Kᵀ: N²·dim_out, attn·V: N²·dim_out, proj: N·dim_out².
    """
    dim_out = dim if dim_out is None else dim_out
    return num_tokens * dim * 3 * dim_out + 2 * num_tokens**2 * dim_out + num_tokens * dim_out * dim_out


def mlp_macs(num_tokens: int, dim: int, hidden: int, out: int | None = None) -> int:
    """Multiply-adds of fc1 and fc2: 2·N·C·hidden when out == dim."""
    out = dim if out is None else out
    return num_tokens * hidden * (dim + out)


@dataclass
class Complexity:
    params: int  # every parameter, frozen ones (a sinusoidal position table) included
    trainable_params: int
    macs: int
    by_component: dict[str, int] = field(default_factory=dict)  # multiply-adds per component

    @property
    def flops(self) -> int:
        return 2 * self.macs

    def summary(self) -> str:
        gmacs, gflops = self.macs / 1e9, self.flops / 1e9
        lines = [f"params {self.params / 1e6:.2f} M   MACs {gmacs:.3f} G   FLOPs {gflops:.3f} G"]
        for name, macs in self.by_component.items():
            lines.append(f"  {name:<14} {macs / 1e9:9.4f} GMACs  ({100 * macs / max(self.macs, 1):5.1f}%)")
        return "\n".join(lines)


def _component(qualified_name: str) -> str:
    """Which part of the model a module belongs to, for the per-component table."""
    parts = qualified_name.split(".")
    if parts[0] == "tokens_to_token":  # the whole T2T module is the tokeniser, like patch_embed
        return "tokens_to_token"
    if ".attn" in f".{qualified_name}" or any(p.startswith("attention") for p in parts):
        return "attention"
    if "mlp" in parts:
        return "mlp"
    return parts[0] or "other"


def complexity(model: nn.Module, img_size: int | tuple[int, int] | None = None, in_chans: int = 3) -> Complexity:
    """Count parameters and per-image multiply-adds of `model`.

    Layers report themselves: an `Attention` (and its variants) by `attention_macs`, a module with a
    `macs(x, out)` method (the T2T performer) by that, a Linear by N·in·out, a Conv2d by output size × kernel
    volume. Modules inside an `Attention` are not counted twice.
    """
    if img_size is None:
        img_size = getattr(model, "img_size", None)
        if img_size is None:
            raise ValueError(f"{type(model).__name__} has no img_size attribute: pass img_size")
    height, width = (img_size, img_size) if isinstance(img_size, int) else img_size

    by_component: dict[str, int] = {}
    hooks = []
    counted_inside: set[int] = set()
    for module in model.modules():
        if isinstance(module, Attention) or hasattr(module, "macs"):
            counted_inside.update(id(m) for m in module.modules() if m is not module)

    def record(name: str, macs: int) -> None:
        key = _component(name)
        by_component[key] = by_component.get(key, 0) + int(macs)

    def make_hook(name: str, module: nn.Module):
        def hook(mod, inputs, output):
            x = inputs[0]
            if isinstance(mod, Attention):
                batch, tokens, _ = x.shape
                record(name, attention_macs(tokens, mod.dim, mod.dim_out))
            elif hasattr(mod, "macs"):
                record(name, mod.macs(x, output))
            elif isinstance(mod, nn.Linear):
                rows = x.numel() // x.shape[-1]
                record(name, rows * mod.in_features * mod.out_features)
            elif isinstance(mod, nn.Conv2d):
                kernel = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
                record(name, output.numel() * kernel)

        return hook

    for name, module in model.named_modules():
        if id(module) in counted_inside:
            continue
        if isinstance(module, (Attention, nn.Linear, nn.Conv2d)) or hasattr(module, "macs"):
            hooks.append(module.register_forward_hook(make_hook(name, module)))

    was_training = model.training
    try:
        model.eval()
        device = next(model.parameters()).device
        with torch.no_grad():
            model(torch.zeros(1, in_chans, height, width, device=device))
    finally:
        for handle in hooks:
            handle.remove()
        model.train(was_training)

    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return Complexity(
        params=params, trainable_params=trainable, macs=sum(by_component.values()), by_component=by_component
    )

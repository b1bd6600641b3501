"""Parameters and multiply-adds (GMACs, the training log's unit; 1 MAC = 2 FLOPs) per component of a configured
model, the multiply-adds of each self-attention layer (4·N·C² + 2·N²·C for N tokens of width C) beside the measured
count, and multiply-adds against image size.

usage: python scripts/complexity.py [<config override> ...] [out=complexity.png]

Any override train.py takes (`model=`, `data=`, `model.<key>=`, ...) composes the real configs in configs/.
The formula column is `vit.models.complexity` (each layer's multiply-adds from its token count and width); the
measured column is `torch.utils.flop_counter` (FLOPs, halved) on a forward pass with attention on the math path, so
Q·Kᵀ and attn·V are real matmuls it can see (the fused SDPA kernel of the CPU is invisible to it). Prints the
tables and writes `out=` (a PNG of GMACs against image size).

Example:

    python scripts/complexity.py model=vit_tiny model.img_size=64 out=complexity.png
"""

from __future__ import annotations

import sys
from collections import Counter

import torch
from torch.utils.flop_counter import FlopCounterMode

from vit.analysis.plots import macs_vs_size_figure
from vit.cli.args import run_script
from vit.config.compose import compose
from vit.errors import UsageError
from vit.models import Attention, complexity
from vit.models.complexity import _component  # the grouping of the formula table, reused for params
from vit.tasks.build import build_model_from_config


def image_shape(model) -> tuple[int, int]:
    size = model.img_size
    return (size, size) if isinstance(size, int) else tuple(size)


def attention_layers(model) -> list[tuple[str, int, int, int]]:
    """(name, N, dim, C = dim_out) of every self-attention layer, from one forward pass of one image."""
    found, hooks = [], []
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            hook = module.register_forward_hook(
                lambda m, i, o, name=name: found.append((name, i[0].shape[1], m.dim, m.dim_out))
            )
            hooks.append(hook)
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            model.eval()(torch.zeros(1, 3, *image_shape(model), device=device))
    finally:
        for hook in hooks:
            hook.remove()
    return found


def attention_split(model) -> tuple[int, int]:
    """MACs of all self-attention layers split into the terms linear in N (4·N·C² when dim == chan: the qkv and
    output projections) and quadratic in N (2·N²·C: Q·Kᵀ and attn·V)."""
    layers = attention_layers(model)
    linear = sum(n * dim * 3 * chan + n * chan * chan for _, n, dim, chan in layers)
    quadratic = sum(2 * n * n * chan for _, n, _, chan in layers)
    return linear, quadratic


def measured_macs(model) -> tuple[int, dict[str, int]]:
    """Multiply-adds counted by torch on one image (its FLOPs, halved): the total and those inside each named
    module."""
    attention = [m for m in model.modules() if isinstance(m, Attention)]
    backends = [m.attn_backend for m in attention]
    for module in attention:
        module.attn_backend = "math"
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model.eval()(torch.zeros(1, 3, *image_shape(model)))
    finally:
        for module, backend in zip(attention, backends, strict=True):
            module.attn_backend = backend
    prefix = type(model).__name__ + "."
    per_module = {
        name[len(prefix) :]: sum(ops.values()) // 2
        for name, ops in counter.get_flop_counts().items()
        if name.startswith(prefix)
    }
    return counter.get_total_flops() // 2, per_module


def component_roots(model) -> dict[str, str]:
    """Module name -> component, for the outermost module of each component (blocks.0.attn, not .qkv)."""
    roots = {}
    for name, _ in model.named_modules():
        if not name:
            continue
        parent = name.rpartition(".")[0]
        if not parent or _component(parent) != _component(name):
            roots[name] = _component(name)
    return roots


def crossover_size(sizes, linear, quadratic) -> float | None:
    """The image side where the N² term equals the rest. Their ratio grows linearly in N ∝ side², so it is
    interpolated in side² between the two sampled sizes around 1."""
    ratios = [q / lin for lin, q in zip(linear, quadratic, strict=True)]
    for i in range(len(sizes) - 1):
        (s0, r0), (s1, r1) = (sizes[i], ratios[i]), (sizes[i + 1], ratios[i + 1])
        if r0 < 1 <= r1:
            area = s0**2 + (1 - r0) * (s1**2 - s0**2) / (r1 - r0)
            return area**0.5
    return None


def component_table(cfg, model, measured_total: int, measured: dict[str, int]) -> None:
    """Parameters and multiply-adds of each component: the formula's count beside torch's."""
    cost = complexity(model)
    height, width = image_shape(model)
    # Parameters of each component; cls token, position table and norms outside the components go to "other".
    params = Counter()
    for name, param in model.named_parameters():
        params[_component(name.rpartition(".")[0] or name)] += param.numel()
    measured_by = Counter()
    for name, component in component_roots(model).items():
        measured_by[component] += measured.get(name, 0)

    print(
        f"{cfg.model.name} at {height}x{width} px: {cost.params / 1e6:.3f} M parameters, {cost.macs / 1e9:.4f} GMACs "
        "(1 MAC = 2 FLOPs)"
    )
    print(f"{'component':<16}{'params (M)':>11}{'GMACs formula':>16}{'GMACs measured':>17}{'share':>8}")
    for component, macs in cost.by_component.items():
        print(
            f"{component:<16}{params.pop(component, 0) / 1e6:>11.3f}{macs / 1e9:>16.4f}"
            f"{measured_by[component] / 1e9:>17.4f}{100 * macs / cost.macs:>7.1f}%"
        )
    other = sum(params.values())
    rest = ", ".join(sorted(params)).replace("blocks", "block norms")
    print(f"{'other':<16}{other / 1e6:>11.3f}{'-':>16}{'-':>17}{'':>8}  ({rest})")
    print(f"{'total':<16}{cost.params / 1e6:>11.3f}{cost.macs / 1e9:>16.4f}{measured_total / 1e9:>17.4f}")


def attention_table(model, measured: dict[str, int]) -> None:
    """The multiply-adds of one self-attention layer, 4·N·C² + 2·N²·C, for each layer shape of the model,
    beside torch's count of those layers."""
    layers = attention_layers(model)
    print("\nself-attention, 4·N·C² + 2·N²·C multiply-adds per layer:")
    for (n, dim, chan), count in Counter((n, d, c) for _, n, d, c in layers).items():
        # A T2T token stage changes the width (dim -> C), so its projections are N·dim·3C + N·C², not 4·N·C².
        shape, linear_name = (f"C={chan}", "4·N·C²") if dim == chan else (f"dim={dim}, C={chan}", "N·dim·3C + N·C²")
        linear = n * dim * 3 * chan + n * chan * chan
        quadratic = 2 * n * n * chan
        print(
            f"  {count:>2} x N={n}, {shape}: {linear_name} = {linear / 1e6:.3f} M, 2·N²·C = {quadratic / 1e6:.3f} M"
            f"  -> {count * (linear + quadratic) / 1e9:.4f} GMACs"
        )
    formula = sum(n * d * 3 * c + n * c * c + 2 * n * n * c for _, n, d, c in layers)
    counted = sum(measured.get(name, 0) for name, *_ in layers)
    print(f"  all layers: formula {formula / 1e9:.4f} GMACs, measured {counted / 1e9:.4f} GMACs")


def size_sweep(cfg, num_classes: int, width: int) -> tuple[list[int], list[int], list[int]]:
    """(image sides, MACs linear in N, MACs of the N² attention terms) from half to 8x the configured side."""
    patch = int(cfg.model.get("patch_size") or 16)
    sizes = sorted(
        {s for s in (width // 2, width, 2 * width, 3 * width, 4 * width, 6 * width, 8 * width) if s % patch == 0}
    )
    kept, lin_macs, quad_macs = [], [], []
    for size in sizes:
        try:
            sized = build_model_from_config({**cfg.model, "img_size": size}, num_classes=num_classes)
        except Exception:  # noqa: BLE001 - a size this model cannot take (T2T tiling) is left out
            continue
        # Only shapes matter here: on the meta device the forward pass allocates and computes nothing, so
        # 8x the image size (64x the tokens, 4096x the attention matrix) costs no memory.
        sized = sized.to("meta")
        _, q = attention_split(sized)
        kept.append(size)
        lin_macs.append(complexity(sized).macs - q)
        quad_macs.append(q)
    return kept, lin_macs, quad_macs


def main(argv: list[str]) -> int:
    bad = [arg for arg in argv if "=" not in arg]
    if bad:
        raise UsageError(f"argument {bad[0]!r} must look like key=value")
    out = ([arg[len("out=") :] for arg in argv if arg.startswith("out=")] or ["complexity.png"])[-1]
    cfg = compose([arg for arg in argv if not arg.startswith("out=")])
    num_classes = cfg.data.num_classes or 1000
    model = build_model_from_config(cfg.model, num_classes=num_classes)
    measured_total, measured = measured_macs(model)
    component_table(cfg, model, measured_total, measured)
    attention_table(model, measured)

    kept, lin_macs, quad_macs = size_sweep(cfg, num_classes, image_shape(model)[1])
    cross = crossover_size(kept, lin_macs, quad_macs)
    where = f"at about {cross:.0f} px" if cross else f"not within {kept[0]}-{kept[-1]} px"
    print(f"\nthe N² attention term overtakes everything linear in N {where}")
    title = f"{cfg.model.name}: multiply-adds against image size"
    figure = macs_vs_size_figure(kept, lin_macs, quad_macs, out, title, crossover=cross)
    print(f"wrote {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

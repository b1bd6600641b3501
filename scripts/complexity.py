"""Parameters and FLOPs per component of a configured model, the seed's formula beside the measured count,
and FLOPs against image size.

    python scripts/complexity.py model=vit_tiny [model.img_size=64] [data=imagefolder] [out=complexity.png]

`model=`/`data=` and `model.<key>=` overrides compose the real configs in configs/ (like train.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from vit.analysis.figures import flops_vs_size_figure
from vit.analysis.inputs import UsageError, run_script
from vit.models import Attention, complexity
from vit.train.config import build_model_from_config

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise UsageError(str(err).splitlines()[0]) from err


def attention_split(model) -> tuple[int, int]:
    """MACs of all self-attention layers split into the terms linear in N (4·N·C²) and quadratic (2·N²·C)."""
    linear = quadratic = 0
    hooks = []

    def hook(mod, inputs, _output):
        nonlocal linear, quadratic
        n = inputs[0].shape[1]
        linear += n * mod.dim * 3 * mod.chan + n * mod.chan**2
        quadratic += 2 * n * n * mod.chan

    for module in model.modules():
        if isinstance(module, Attention):
            hooks.append(module.register_forward_hook(hook))
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, *model.img_size))
    for h in hooks:
        h.remove()
    return linear, quadratic


def main(argv: list[str]) -> int:
    out = "complexity.png"
    overrides = []
    for arg in argv:
        if arg.startswith("out="):
            out = arg[4:]
        elif "=" not in arg:
            raise UsageError(f"argument {arg!r} must look like key=value")
        else:
            overrides.append(arg)
    cfg = compose(overrides)
    model = build_model_from_config(cfg.model, num_classes=cfg.data.num_classes or 1000)
    cost = complexity(model)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.eval()(torch.zeros(1, 3, *model.img_size))
    linear, quadratic = attention_split(model)
    print(f"{cfg.model.name} at {model.img_size[0]} px: {cost.params / 1e6:.2f} M parameters")
    print(f"{'component':<16}{'GFLOPs':>10}{'share':>8}")
    for name, macs in cost.by_component.items():
        print(f"{name:<16}{2 * macs / 1e9:>10.4f}{100 * macs / cost.macs:>7.1f}%")
    print(f"{'total (formulas)':<16}{cost.flops / 1e9:>10.4f}")
    print(f"{'torch flop count':<16}{counter.get_total_flops() / 1e9:>10.4f}  (SDPA on the CPU may go uncounted)")
    print(f"self-attention: 4·N·C² = {2 * linear / 1e9:.4f} GFLOPs, 2·N²·C = {2 * quadratic / 1e9:.4f} GFLOPs")

    patch = int(cfg.model.get("patch_size") or 16)
    base = model.img_size[0]
    sizes = sorted({s for s in (base // 2, base, 2 * base, 3 * base, 4 * base, 6 * base, 8 * base) if s % patch == 0})
    lin_flops, quad_flops = [], []
    for size in sizes:
        try:
            sized = build_model_from_config({**cfg.model, "img_size": size}, num_classes=cfg.data.num_classes or 1000)
        except Exception:  # noqa: BLE001 - a size this model cannot take (T2T tiling) is left out
            continue
        total = complexity(sized).macs
        _, q = attention_split(sized)
        lin_flops.append(2 * (total - q))
        quad_flops.append(2 * q)
    sizes = sizes[: len(lin_flops)]
    figure = flops_vs_size_figure(sizes, lin_flops, quad_flops, out, f"{cfg.model.name}: FLOPs against image size")
    print(f"wrote {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))

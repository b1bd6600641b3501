"""LayerNorm under CPU autocast: how far its weight and bias gradients are from float64's, PyTorch's bf16 kernel
against vit/models/norm.py's LayerNorm (float32 inside autocast), and what each costs in a training step.

usage: python lab/bench_layernorm.py [rows=64,4096,16384,49152] [widths=48,144] [case=vit_cpu_recipe_144]
           [img_size=32] [rounds=8] [threads=2] [json=<file>]

Errors: for each width and row count, a LayerNorm (weight and bias drawn off their init) on random bf16 rows and a
random bf16 incoming gradient, under `torch.autocast("cpu", torch.bfloat16)`; the relative error ||g - g64|| /
||g64|| of the input, weight and bias gradients against float64 on the same values. Speed: lab/bench_cases.py's
`case` trained in bf16 at batch 256 (lab/step_timing.py's step), its LayerNorms in bf16 (PyTorch's kernel) and
in float32 in alternating rounds of 3 steps after one untimed step; img/s per round and the median of their ratios.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from bench_cases import CASES, build_side
from records import measurement_record, script_command, write_record
from step_timing import make_train_step
from torch import nn

import vit.models.norm as norm
from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.runtime.device import choose_precision

STEPS_PER_ROUND = 3


def gradient_errors(rows: int, width: int) -> dict[str, dict[str, float]]:
    """{"pytorch_bf16" | "float32_inside": {"input" | "weight" | "bias": relative error against float64}}."""
    torch.manual_seed(0)
    x, grad = torch.randn(rows, width).bfloat16(), torch.randn(rows, width).bfloat16()
    weight, bias = torch.randn(width), torch.randn(width)

    def gradients(layer: nn.LayerNorm, dtype: torch.dtype | None, autocast: bool) -> list[torch.Tensor]:
        with torch.no_grad():
            layer.weight.copy_(weight), layer.bias.copy_(bias)
        inputs = (x if dtype is None else x.to(dtype)).detach().requires_grad_()  # a gradient of its own
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = layer(inputs)
        out.backward(grad.to(out.dtype))
        return [inputs.grad.double(), layer.weight.grad.double(), layer.bias.grad.double()]

    exact = gradients(nn.LayerNorm(width, eps=1e-6).double(), torch.float64, False)
    sides = {"pytorch_bf16": nn.LayerNorm(width, eps=1e-6), "float32_inside": norm.LayerNorm(width, eps=1e-6)}
    return {
        side: {
            name: round(((g - e).norm() / e.norm()).item(), 5)
            for name, g, e in zip(("input", "weight", "bias"), gradients(layer, None, True), exact, strict=True)
        }
        for side, layer in sides.items()
    }


def step_speed(case_name: str, img_size: int, rounds: int) -> dict[str, list[float]]:
    """img/s per round of the case's bf16 training step, its LayerNorms in bf16 and in float32, alternating."""
    case = CASES[case_name]
    device = torch.device("cpu")
    model = build_side(case, "ours")
    step = make_train_step(model, case.batch, img_size, device, None, choose_precision("bf16", device, model))
    inside = norm.upcast_on_cpu
    sides = {"pytorch_bf16": lambda x, weight: False, "float32_inside": inside}
    speeds: dict[str, list[float]] = {side: [] for side in sides}
    try:
        for round_index in range(rounds):
            for side in sides if round_index % 2 == 0 else list(sides)[::-1]:
                norm.upcast_on_cpu = sides[side]
                step()
                start = time.perf_counter()
                for _ in range(STEPS_PER_ROUND):
                    step()
                speeds[side].append(round(STEPS_PER_ROUND * case.batch / (time.perf_counter() - start), 1))
    finally:
        norm.upcast_on_cpu = inside
    return speeds


def main(argv: list[str]) -> int:
    defaults = {"rows": "64,4096,16384,49152", "widths": "48,144", "case": "vit_cpu_recipe_144", "img_size": "32"}
    args = parse_args(argv, {**defaults, "rounds": "8", "threads": "2", "json": None}, lists=("rows", "widths"))
    if args["case"] not in CASES:
        raise UsageError(f"case={args['case']!r} is not one of lab/bench_cases.py's cases")
    torch.set_num_threads(args.integer("threads"))
    errors = [
        {"rows": int(rows), "width": int(width), **gradient_errors(int(rows), int(width))}
        for width in args["widths"]
        for rows in args["rows"]
    ]
    for row in errors:
        bf16, inside = row["pytorch_bf16"]["weight"], row["float32_inside"]["weight"]
        print(f"{row['width']:4d} wide, {row['rows']:6d} rows: weight gradient off by {bf16:.1%} (bf16), {inside:.4%}")
    speeds = step_speed(args["case"], args.integer("img_size"), args.integer("rounds"))
    ratios = [f / b for f, b in zip(speeds["float32_inside"], speeds["pytorch_bf16"], strict=True)]
    print(f"{args['case']} at {args['img_size']} px: float32 LayerNorms / bf16 = {statistics.median(ratios):.3f} "
          f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")  # fmt: skip
    values = {
        "torch": torch.__version__,
        "errors": errors,
        "case": args["case"],
        "img_size": args.integer("img_size"),
        "steps_per_round": STEPS_PER_ROUND,
        "img_per_s_rounds": speeds,
        "ratio_rounds": [round(r, 4) for r in ratios],
        "ratio_median": round(statistics.median(ratios), 4),
    }
    record = measurement_record("bench_layernorm", values, script_command(__file__, argv))
    if args.get("json"):
        write_record(record, args["json"])
    print(json.dumps(record)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

"""Which attention kernel is faster on this CPU: torch's fused `F.scaled_dot_product_attention` against the
written-out softmax(Q Kᵀ · scale) V, across token count, head width, heads, batch and precision.

usage: python lab/bench_attention.py [threads=2] [rounds=5] [precisions=fp32,bf16]
    [cases=<tokens>x<head_dim>x<heads>x<batch>,...] [json=<file>]

Each case times `Attention.attend` (vit/models/attention.py) with attn_backend=sdpa and with attn_backend=math on
fixed random q, k, v of shape (batch, heads, tokens, head_dim): forward and backward as a training step runs them
(under `torch.autocast("cpu", dtype=torch.bfloat16)` for bf16, on bf16 q, k, v as the qkv projection gives them
there), and the forward alone under no_grad as inference runs it. Rounds are interleaved (sdpa, math, sdpa, ...;
at least 0.2 s of calls a round after one untimed call) and each figure is the median's milliseconds per call.
json=<file> writes the record: every round of each, the medians and ratios, the provenance
(vit/records/provenance.py). The default cases are the CPU recipe's attention at its image sizes (16, 24 and 32 px:
16, 36 and 64 tokens, 48 wide heads), ViT-Ti/4 on CIFAR (65 tokens), ViT-S/16 at 224 px (197) and longer
sequences, behind `Attention`'s choice for attn_backend=auto on a CPU (`CPU_MATH_MAX_TOKENS`).
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import nullcontext

import torch
from records import measurement_record, script_command, write_record

from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.models import Attention

DEFAULT_CASES = "16x48x3x256,36x48x3x256,64x48x3x256,64x48x2x256,65x64x3x128,197x64x6x64,256x64x6x32,576x64x6x8"
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
BACKENDS = ("sdpa", "math")


def make_calls(tokens: int, head_dim: int, heads: int, batch: int, dtype: torch.dtype | None):
    """{backend: (training call, inference call)} on the same q, k, v (batch, heads, tokens, head_dim)."""
    torch.manual_seed(0)
    shape = (batch, heads, tokens, head_dim)
    q, k, v = (torch.randn(shape, dtype=dtype or torch.float32).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, dtype=dtype or torch.float32)
    autocast = (lambda: torch.autocast("cpu", dtype=dtype)) if dtype is not None else nullcontext
    calls = {}
    for backend in BACKENDS:
        attention = Attention(heads * head_dim, num_heads=heads, attn_backend=backend)

        def train(attention=attention) -> None:
            with autocast():
                out = attention.attend(q, k, v)  # (B, heads, N, head_dim)
            out.backward(grad)

        def infer(attention=attention) -> None:
            with torch.no_grad(), autocast():
                attention.attend(q, k, v)

        calls[backend] = (train, infer)
    return calls


def time_rounds(calls: dict, which: int, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per call of each backend's call `which` (0 training, 1 inference), round by round."""
    for backend in BACKENDS:
        calls[backend][which]()  # untimed: allocations, first-call costs
    start = time.perf_counter()
    calls["sdpa"][which]()
    per_round = max(1, int(0.2 / max(time.perf_counter() - start, 1e-6)))
    times: dict[str, list[float]] = {backend: [] for backend in BACKENDS}
    for _ in range(rounds):
        for backend in BACKENDS:
            start = time.perf_counter()
            for _ in range(per_round):
                calls[backend][which]()
            times[backend].append(1000.0 * (time.perf_counter() - start) / per_round)
    return times


def parse_case(text: str) -> tuple[int, int, int, int]:
    try:
        values = tuple(int(part) for part in text.split("x"))
        tokens, head_dim, heads, batch = values
    except ValueError:
        raise UsageError(f"cases: {text!r} must look like <tokens>x<head_dim>x<heads>x<batch>") from None
    if min(values) < 1:
        raise UsageError(f"cases: {text!r}: every number must be positive")
    return tokens, head_dim, heads, batch


def main(argv: list[str]) -> int:
    defaults = {"threads": "2", "rounds": "5", "precisions": "fp32,bf16", "cases": DEFAULT_CASES, "json": None}
    args = parse_args(argv, defaults, lists=("cases", "precisions"))
    rounds = args.integer("rounds")
    torch.set_num_threads(args.integer("threads"))
    cases = [parse_case(c) for c in args["cases"]]
    for name in args["precisions"]:
        if name not in PRECISIONS:
            raise UsageError(f"precisions: {name!r} must be one of {tuple(PRECISIONS)}")
    rows = []
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}; milliseconds per call (median)")
    print("| precision | tokens | head_dim | heads | batch | train sdpa | train math | sdpa / math | infer sdpa "
          "| infer math | sdpa / math |\n|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    for name in args["precisions"]:
        for tokens, head_dim, heads, batch in cases:
            calls = make_calls(tokens, head_dim, heads, batch, PRECISIONS[name])
            row = {"precision": name, "tokens": tokens, "head_dim": head_dim, "heads": heads, "batch": batch}
            cells = []
            for which, kind in enumerate(("train", "infer")):
                times = time_rounds(calls, which, rounds)
                sdpa, math = statistics.median(times["sdpa"]), statistics.median(times["math"])
                row |= {f"{kind}_sdpa_ms_rounds": times["sdpa"], f"{kind}_math_ms_rounds": times["math"]}
                row |= {f"{kind}_sdpa_ms": sdpa, f"{kind}_math_ms": math, f"{kind}_sdpa_over_math": sdpa / math}
                cells += [f"{sdpa:.2f}", f"{math:.2f}", f"{sdpa / math:.2f}"]
            print(f"| {name} | {tokens} | {head_dim} | {heads} | {batch} | {' | '.join(cells)} |", flush=True)
            rows.append(row)
    if args["json"]:
        values = {"rounds": rounds, "threads": torch.get_num_threads(), "cases": rows}
        write_record(measurement_record("bench_attention", values, script_command(__file__, argv)), args["json"])
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

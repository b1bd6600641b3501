"""Where bf16 autocast pays on this CPU: a ViT training step (forward, cross-entropy, backward, gradient clipping,
AdamW) in fp32 and under `torch.autocast("cpu", dtype=torch.bfloat16)`, across width, token count and batch.

usage: python lab/bench_cpu_bf16.py [threads=2] [rounds=5] [cases=<width>x<tokens>x<batch>x<heads>,...]
    [json=<file>]

Each case builds `create_model("vit_tiny", embed_dim=<width>, depth=6, mlp_ratio=2, ...)` at 32 px with patch 4
(64 tokens), 8 (16 tokens) or 2 (256 tokens), times fp32 and bf16 steps on fixed random data in interleaved rounds
(fp32, bf16, fp32, ...; about 640 images a round after 2 warm-up steps) and prints the median img/s of each and
their ratio. json=<file> writes the measurement record: every case's img/s in every round of each precision, the
medians and ratio, and the provenance (command, commit, machine, versions: vit/records/provenance.py). The default
cases are those behind trainer.amp=auto's width bar (vit/runtime/device.py, `CPU_BF16_MIN_WIDTH`;
docs/BENCHMARKS.md, "bf16 on the CPU").
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from records import measurement_record, script_command, write_record

from vit.cli.args import parse_args, run_script
from vit.errors import UsageError
from vit.models import create_model

DEFAULT_CASES = (
    "32x64x128x2,48x64x128x3,64x64x128x2,96x64x128x3,128x64x128x4,192x64x128x3,"
    "64x64x32x2,96x64x32x3,192x64x32x3,96x16x128x3,192x16x128x3,64x256x64x2,96x256x64x3"
)
PATCH_FOR_TOKENS = {16: 8, 64: 4, 256: 2}  # at 32 px


def make_step(width: int, tokens: int, batch: int, heads: int, bf16: bool):
    torch.manual_seed(0)
    model = create_model(
        "vit_tiny",
        img_size=32,
        patch_size=PATCH_FOR_TOKENS[tokens],
        num_classes=10,
        embed_dim=width,
        depth=6,
        num_heads=heads,
        mlp_ratio=2.0,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images, targets = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
            loss = F.cross_entropy(model(images), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    return step


def parse_case(text: str) -> tuple[int, int, int, int]:
    try:
        width, tokens, batch, heads = (int(part) for part in text.split("x"))
    except ValueError:
        raise UsageError(f"cases: {text!r} must look like <width>x<tokens>x<batch>x<heads>") from None
    if tokens not in PATCH_FOR_TOKENS:
        raise UsageError(f"cases: {text!r}: tokens must be one of {tuple(PATCH_FOR_TOKENS)}")
    if min(width, batch, heads) < 1 or width % heads:
        raise UsageError(f"cases: {text!r}: width, batch and heads must be positive, heads must divide width")
    return width, tokens, batch, heads


def main(argv: list[str]) -> int:
    args = parse_args(argv, {"threads": "2", "rounds": "5", "cases": DEFAULT_CASES, "json": None}, lists=("cases",))
    rounds = args.integer("rounds")
    torch.set_num_threads(args.integer("threads"))
    cases = [parse_case(c) for c in args["cases"]]
    rows = []
    print(f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| width | heads | tokens | batch | fp32 img/s | bf16 img/s | bf16 / fp32 |\n|---|---|---|---|---|---|---|")
    for width, tokens, batch, heads in cases:
        steps = {bf16: make_step(width, tokens, batch, heads, bf16) for bf16 in (False, True)}
        per_round = max(2, 640 // batch)
        speed: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for bf16 in (False, True):
                start = time.perf_counter()
                for _ in range(per_round):
                    steps[bf16]()
                speed[bf16].append(per_round * batch / (time.perf_counter() - start))
        fp32, bf16 = statistics.median(speed[False]), statistics.median(speed[True])
        print(f"| {width} | {heads} | {tokens} | {batch} | {fp32:.0f} | {bf16:.0f} | {bf16 / fp32:.2f} |", flush=True)
        rows.append(
            {"width": width, "heads": heads, "tokens": tokens, "batch": batch, "steps_per_round": per_round}
            | {"fp32_img_per_s_rounds": speed[False], "bf16_img_per_s_rounds": speed[True]}
            | {"fp32_img_per_s": fp32, "bf16_img_per_s": bf16, "bf16_over_fp32": bf16 / fp32}
        )
    if args["json"]:
        values = {"rounds": rounds, "threads": torch.get_num_threads(), "cases": rows}
        write_record(measurement_record("bench_cpu_bf16", values, script_command(__file__, argv)), args["json"])
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, usage=__doc__))

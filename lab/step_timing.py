"""Training-step throughput of our models, alone or against a peer of the same shape, timed side by side.

The protocol: random inputs already on the device, autocast (bf16 on CUDA), cross-entropy, backward, fused AdamW
step (on CUDA), `zero_grad(set_to_none=True)`; the cases are lab/bench_cases.py's.

Comparisons interleave rounds (ours, peer, ours, peer, ...), each round at least `min_round_s` long, and
report the median of the per-round ratios with its 10th-90th percentile spread: sequential timing drifts
with clocks and temperature by more than the differences we want to see. Peak memory of two models in one
process is unreliable, so `measure_peak_memory` runs each side in a process of its own. Where a step spends its
time is lab/step_profile.py's.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from bench_cases import H100_BF16_PEAK_FLOPS, BenchCase, build_side, num_classes_of, peer_available
from records import measurement_record
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vit.runtime.device import Precision, choose_precision


def make_train_step(
    model: nn.Module,
    batch: int,
    img_size: int,
    device: torch.device,
    compile_mode: str | None,
    precision: Precision | None = None,
) -> Callable[[], None]:
    """A closure running one full training step on fixed random data; no host synchronisation inside. The
    forward pass runs in `precision` (default: what trainer.amp=auto gives this model on this device)."""
    precision = precision or choose_precision("auto", device, model)
    model = model.to(device).train()
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    images = torch.randn(batch, 3, img_size, img_size, device=device)
    targets = torch.randint(0, num_classes_of(model), (batch,), device=device)
    forward = torch.compile(model, mode=compile_mode) if compile_mode else model

    def step() -> None:
        with precision.autocast(device):
            loss = F.cross_entropy(forward(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[], None], steps: int, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return time.perf_counter() - start


def steps_for(step: Callable[[], None], min_round_s: float, device: torch.device) -> int:
    """How many steps make a round of at least `min_round_s` (measured on 3 steps after warm-up)."""
    per_step = time_steps(step, 3, device) / 3
    return max(1, int(min_round_s / max(per_step, 1e-9)) + 1)


def train_flops(model: nn.Module, batch: int, img_size: int, device: torch.device) -> int:
    """FLOPs of one forward + backward, counted by torch's flop counter on the eager model."""
    model = model.to(device).train()
    x = torch.randn(batch, 3, img_size, img_size, device=device)
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(x).float().logsumexp(-1).sum()
        loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = int(position), min(int(position) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class SideResult:
    side: str  # "ours" or "peer"
    img_per_s: float  # the median of round_img_per_s
    step_ms: float
    mfu: float | None
    peak_gib: float | None = None
    steps_per_round: int = 0
    round_seconds: list[float] = field(default_factory=list)  # every timed round's wall time, in order
    round_img_per_s: list[float] = field(default_factory=list)  # steps_per_round x batch / round_seconds
    flops_per_image: float | None = None  # a forward and backward, torch's flop counter


@dataclass
class CaseResult:
    case: str
    batch: int
    img_size: int
    compile_mode: str | None
    device: str
    sides: list[SideResult]
    precision: str = "fp32"  # what ours ran in (`amp`, decided by vit/runtime/device.py's rule)
    peer_precision: str | None = None
    ratio_median: float | None = None
    ratio_p10: float | None = None
    ratio_p90: float | None = None
    rounds: int = 0


def bench_case(
    case: BenchCase,
    device: torch.device,
    *,
    batch: int | None = None,
    compile_mode: str | None = None,
    peer_compile_mode: str | None = "same",
    vs_peer: bool = False,
    rounds: int = 5,
    warmup: int = 5,
    min_round_s: float = 0.5,
    peak_flops: float = H100_BF16_PEAK_FLOPS,
    amp: str = "auto",
    peer_amp: str = "same",
) -> CaseResult:
    """`amp` (auto | bf16 | fp16 | none) is trainer.amp for our model; `peer_amp` the peer's, "same" for ours."""
    batch = batch or case.batch
    peer_mode = compile_mode if peer_compile_mode == "same" else peer_compile_mode
    sides = ["ours"] + (["peer"] if vs_peer and peer_available(case) else [])
    steps, flops, precisions = {}, {}, {}
    for side in sides:
        torch.manual_seed(0)
        model = build_side(case, side)
        flops[side] = train_flops(model, batch, case.img_size, device)
        setting = amp if side == "ours" or peer_amp == "same" else peer_amp
        precisions[side] = choose_precision(setting, device, model)
        steps[side] = make_train_step(
            model, batch, case.img_size, device, compile_mode if side == "ours" else peer_mode, precisions[side]
        )
        for _ in range(warmup):  # compiles, autotunes, fills the allocator's cache
            steps[side]()
    per_round = {side: steps_for(steps[side], min_round_s, device) for side in sides}

    seconds: dict[str, list[float]] = {side: [] for side in sides}
    throughput: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side in sides:  # interleaved: ours, peer, ours, peer, ...
            seconds[side].append(time_steps(steps[side], per_round[side], device))
            throughput[side].append(per_round[side] * batch / seconds[side][-1])

    results = []
    for side in sides:
        img_s = statistics.median(throughput[side])
        step_s = batch / img_s
        mfu = flops[side] / step_s / peak_flops if device.type == "cuda" else None
        rounds_of = (per_round[side], seconds[side], throughput[side])
        results.append(SideResult(side, img_s, 1000 * step_s, mfu, None, *rounds_of, flops[side] / batch))
    out = CaseResult(case.name, batch, case.img_size, compile_mode, str(device), results, rounds=rounds)
    out.precision = precisions["ours"].name
    out.peer_precision = precisions["peer"].name if "peer" in precisions else None
    if len(sides) == 2:
        ratios = [a / b for a, b in zip(throughput["ours"], throughput["peer"], strict=True)]
        out.ratio_median = statistics.median(ratios)
        out.ratio_p10, out.ratio_p90 = percentile(ratios, 0.1), percentile(ratios, 0.9)
    return out


def peak_memory_gib(case: BenchCase, side: str, batch: int, compile_mode: str | None, steps: int = 3) -> float:
    """Peak CUDA memory of `steps` training steps of one side ("ours" or "peer"), in this process."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    step = make_train_step(build_side(case, side), batch, case.img_size, device, compile_mode)
    step()
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(steps):
        step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**30


def measure_peak_memory(case: BenchCase, side: str, batch: int, compile_mode: str | None) -> float:
    """Run `peak_memory_gib` in a child process so the two sides do not share an allocator."""
    code = (
        "import json; from bench_cases import CASES; from step_timing import peak_memory_gib; "
        f"print(json.dumps(peak_memory_gib(CASES[{case.name!r}], {side!r}, {batch}, {compile_mode!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe of {case.name}/{side} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def to_markdown(results: list[CaseResult]) -> str:
    columns = ["model", "img px", "batch", "compile", "precision", "ours img/s", "peer img/s", "ratio (p10-p90)"]
    columns += ["ours MFU", "ours GiB", "peer GiB"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in results:
        ours = r.sides[0]
        peer = r.sides[1] if len(r.sides) > 1 else None

        def fmt(v, spec):
            return "-" if v is None else format(v, spec)

        ratio = f"{r.ratio_median:.3f} ({r.ratio_p10:.3f}-{r.ratio_p90:.3f})" if r.ratio_median is not None else "-"
        precision = r.precision + (f" / {r.peer_precision}" if r.peer_precision else "")
        lines.append(
            f"| {r.case} | {r.img_size} | {r.batch} | {r.compile_mode or 'eager'} | {precision} | "
            f"{ours.img_per_s:,.0f} | "
            f"{fmt(peer and peer.img_per_s, ',.0f')} | {ratio} | "
            f"{fmt(ours.mfu and 100 * ours.mfu, '.1f')}{'%' if ours.mfu else ''} | "
            f"{fmt(ours.peak_gib, '.2f')} | {fmt(peer and peer.peak_gib, '.2f')} |"
        )
    return "\n".join(lines)


def to_record(results: list[CaseResult], argv: list[str] | None = None) -> dict:
    """The measurement record of the cases (vit/records/provenance.py: the command, code and machine beside the
    values): each case with every timed round's seconds and img/s per side, beside their medians and ratios."""
    return measurement_record("benchmark", {"results": [asdict(r) for r in results]}, argv)


# Kernel families for the profile summary, matched on lower-case kernel/op names (CUDA kernels under
# compile are Triton kernels named by their fused ops; cuBLAS/CUTLASS GEMMs carry gemm/xmma/cutlass).

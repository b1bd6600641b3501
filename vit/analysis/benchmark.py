"""Training-step throughput of our models, alone or against a peer of the same shape, timed side by side.

The protocol is the one of `shared/ANCHORS.md`: random inputs already on the device, autocast (bf16 on
CUDA), cross-entropy, backward, fused AdamW step (on CUDA), `zero_grad(set_to_none=True)`.

Comparisons interleave rounds (ours, peer, ours, peer, ...), each round at least `min_round_s` long, and
report the median of the per-round ratios with its 10th-90th percentile spread: sequential timing drifts
with clocks and temperature by more than the differences we want to see. Peak memory of two models in one
process is unreliable, so `measure_peak_memory` runs each side in a process of its own.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vit.models import create_model

# bf16 dense matmul measured on the H100 of the GPU machine (shared/ANCHORS.md); MFU is relative to it.
H100_BF16_PEAK_FLOPS = 798e12


@dataclass(frozen=True)
class BenchCase:
    """One model shape: how we build it and how the peer (timm) builds the same thing."""

    name: str
    ours: str
    kwargs: dict
    img_size: int
    batch: int
    # "timm": timm's VisionTransformer(**peer_kwargs); "official": the function of the same name in the
    # official T2T-ViT code (models/t2t_vit.py of yitu-opensource/T2T-ViT, a checkout named by the
    # environment variable VIT_T2T_OFFICIAL; never part of this project); None: no peer.
    peer: str | None
    peer_kwargs: dict = field(default_factory=dict)


def _vit_peer(embed_dim, depth, heads, img, patch, classes=1000, drop_path=0.0):
    return dict(
        img_size=img,
        patch_size=patch,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=heads,
        num_classes=classes,
        drop_path_rate=drop_path,
    )


CASES: dict[str, BenchCase] = {
    c.name: c
    for c in [
        BenchCase(
            "vit_tiny_cifar",
            "vit_tiny",
            {"img_size": 32, "patch_size": 4, "num_classes": 10},
            32,
            512,
            "timm",
            _vit_peer(192, 12, 3, 32, 4, classes=10),
        ),
        # A toy shape so the whole protocol runs in seconds on a CPU (tests, smoke checks).
        BenchCase(
            "toy",
            "vit_tiny",
            {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10},
            32,
            8,
            "timm",
            _vit_peer(32, 2, 2, 32, 8, classes=10),
        ),
        BenchCase("vit_tiny", "vit_tiny", {}, 224, 256, "timm", _vit_peer(192, 12, 3, 224, 16)),
        BenchCase("vit_small", "vit_small", {}, 224, 256, "timm", _vit_peer(384, 12, 6, 224, 16)),
        BenchCase("vit_base", "vit_base", {}, 224, 128, "timm", _vit_peer(768, 12, 12, 224, 16)),
        BenchCase("t2t_vit_7", "t2t_vit_7", {}, 224, 256, "official"),
        BenchCase("t2t_vit_14", "t2t_vit_14", {}, 224, 128, "official"),
        BenchCase("t2t_vit_t_14", "t2t_vit_t_14", {}, 224, 128, "official"),
    ]
}


def build_side(case: BenchCase, side: str) -> nn.Module:
    if side == "ours":
        return create_model(case.ours, **case.kwargs)
    if side == "peer" and case.peer == "timm":
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(**case.peer_kwargs)
    if side == "peer" and case.peer == "official":
        return official_t2t(case.ours)
    raise ValueError(f"side={side!r} of case {case.name!r} has no model (peer: {case.peer})")


def official_t2t(name: str) -> nn.Module:
    """Build `name` (e.g. "t2t_vit_14") from the official T2T-ViT checkout at $VIT_T2T_OFFICIAL."""
    import importlib

    root = os.environ.get("VIT_T2T_OFFICIAL")
    if not root or not os.path.isfile(os.path.join(root, "models", "t2t_vit.py")):
        raise RuntimeError(
            f"VIT_T2T_OFFICIAL={root!r} must name a checkout of yitu-opensource/T2T-ViT "
            "(the folder holding models/t2t_vit.py)"
        )
    if root not in sys.path:
        sys.path.insert(0, root)
    return getattr(importlib.import_module("models.t2t_vit"), name)()


def peer_available(case: BenchCase) -> bool:

    if case.peer == "official":
        return bool(os.environ.get("VIT_T2T_OFFICIAL"))
    return case.peer is not None


def num_classes_of(model: nn.Module) -> int:
    return int(getattr(model, "num_classes", 1000))


def make_train_step(
    model: nn.Module, batch: int, img_size: int, device: torch.device, compile_mode: str | None
) -> Callable[[], None]:
    """A closure running one full training step on fixed random data; no host synchronisation inside."""
    model = model.to(device).train()
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    images = torch.randn(batch, 3, img_size, img_size, device=device)
    targets = torch.randint(0, num_classes_of(model), (batch,), device=device)
    amp_dtype = torch.bfloat16
    forward = torch.compile(model, mode=compile_mode) if compile_mode else model

    def step() -> None:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
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
    img_per_s: float
    step_ms: float
    mfu: float | None
    peak_gib: float | None = None


@dataclass
class CaseResult:
    case: str
    batch: int
    img_size: int
    compile_mode: str | None
    device: str
    sides: list[SideResult]
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
) -> CaseResult:
    batch = batch or case.batch
    peer_mode = compile_mode if peer_compile_mode == "same" else peer_compile_mode
    sides = ["ours"] + (["peer"] if vs_peer and peer_available(case) else [])
    steps, flops = {}, {}
    for side in sides:
        torch.manual_seed(0)
        model = build_side(case, side)
        flops[side] = train_flops(model, batch, case.img_size, device)
        steps[side] = make_train_step(
            model, batch, case.img_size, device, compile_mode if side == "ours" else peer_mode
        )
        for _ in range(warmup):  # compiles, autotunes, fills the allocator's cache
            steps[side]()
    per_round = {side: steps_for(steps[side], min_round_s, device) for side in sides}

    throughput: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side in sides:  # interleaved: ours, peer, ours, peer, ...
            seconds = time_steps(steps[side], per_round[side], device)
            throughput[side].append(per_round[side] * batch / seconds)

    results = []
    for side in sides:
        img_s = statistics.median(throughput[side])
        step_s = batch / img_s
        mfu = flops[side] / step_s / peak_flops if device.type == "cuda" else None
        results.append(SideResult(side, img_s, 1000 * step_s, mfu))
    out = CaseResult(case.name, batch, case.img_size, compile_mode, str(device), results, rounds=rounds)
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
        "import json, sys; from vit.analysis.benchmark import CASES, peak_memory_gib; "
        f"print(json.dumps(peak_memory_gib(CASES[{case.name!r}], {side!r}, {batch}, {compile_mode!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe of {case.name}/{side} failed:\n{done.stderr[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def to_markdown(results: list[CaseResult]) -> str:
    columns = ["model", "img px", "batch", "compile", "ours img/s", "peer img/s", "ratio (p10-p90)"]
    columns += ["ours MFU", "ours GiB", "peer GiB"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in results:
        ours = r.sides[0]
        peer = r.sides[1] if len(r.sides) > 1 else None

        def fmt(v, spec):
            return "-" if v is None else format(v, spec)

        ratio = f"{r.ratio_median:.3f} ({r.ratio_p10:.3f}-{r.ratio_p90:.3f})" if r.ratio_median is not None else "-"
        lines.append(
            f"| {r.case} | {r.img_size} | {r.batch} | {r.compile_mode or 'eager'} | {ours.img_per_s:,.0f} | "
            f"{fmt(peer and peer.img_per_s, ',.0f')} | {ratio} | "
            f"{fmt(ours.mfu and 100 * ours.mfu, '.1f')}{'%' if ours.mfu else ''} | "
            f"{fmt(ours.peak_gib, '.2f')} | {fmt(peer and peer.peak_gib, '.2f')} |"
        )
    return "\n".join(lines)


def to_json(results: list[CaseResult]) -> str:
    return json.dumps([asdict(r) for r in results], indent=2)


# Kernel families for the profile summary, matched on lower-case kernel/op names (CUDA kernels under
# compile are Triton kernels named by their fused ops; cuBLAS/CUTLASS GEMMs carry gemm/xmma/cutlass).
KERNEL_FAMILIES = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
    ("patch embed (conv)", ("convolution", "conv2d", "cudnn", "implicit_gemm")),
    ("matmul", ("gemm", "xmma", "cutlass", "matmul", "addmm", "aten::mm", "aten::bmm", "linear", "cublas")),
    ("optimizer", ("adam", "foreach", "multi_tensor", "fused_adamw")),
    ("norm", ("layer_norm", "layernorm", "native_layer_norm", "rms_norm")),
    ("softmax / loss", ("softmax", "cross_entropy", "nll_loss", "log_softmax")),
    ("copies / casts", ("copy", "cast", "to_copy", "memcpy", "memset", "fill")),
    ("fused (triton)", ("triton",)),
)


def kernel_family(name: str) -> str:
    lowered = name.lower()
    for family, needles in KERNEL_FAMILIES:
        if any(needle in lowered for needle in needles):
            return family
    return "elementwise / other"


@dataclass
class ProfileSummary:
    case: str
    batch: int
    compile_mode: str | None
    device: str
    time_kind: str  # "CUDA" (kernel time on the GPU) or "CPU" (self time of the ops on the host)
    steps: int
    step_ms: float  # wall time per step while profiled
    total_ms: float  # summed self time of all kernels/ops over the profiled steps
    top: list[tuple[str, float, int]]  # (name, self ms per step, calls per step), the largest first
    families: dict[str, float]  # family -> share of total_ms (%)


def profile_case(
    case: BenchCase,
    device: torch.device,
    batch: int | None = None,
    compile_mode: str | None = None,
    steps: int = 10,
    warmup: int = 5,
    top: int = 15,
) -> ProfileSummary:
    """Where a training step of our model spends its time: torch.profiler over `steps` steps after warm-up,
    the kernels (CUDA) or ops (CPU) with the most self time, and the share of each kernel family."""
    from torch.profiler import ProfilerActivity, profile

    batch = batch or case.batch
    step = make_train_step(build_side(case, "ours"), batch, case.img_size, device, compile_mode)
    for _ in range(warmup):
        step()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        wall = time.perf_counter() - start
    on_gpu = device.type == "cuda"
    rows = []
    for event in prof.key_averages():
        self_us = event.self_device_time_total if on_gpu else event.self_cpu_time_total
        if on_gpu and getattr(event, "device_type", None) is not None and "CUDA" not in str(event.device_type):
            continue  # host-side ops: their kernels are counted under the kernel names
        if self_us > 0:
            rows.append((event.key, self_us / 1000.0, event.count))
    rows.sort(key=lambda r: r[1], reverse=True)
    total = sum(r[1] for r in rows) or 1e-9
    families: dict[str, float] = {}
    for name, ms, _ in rows:
        families[kernel_family(name)] = families.get(kernel_family(name), 0.0) + 100.0 * ms / total
    return ProfileSummary(
        case=case.name,
        batch=batch,
        compile_mode=compile_mode,
        device=str(device),
        time_kind="CUDA" if on_gpu else "CPU",
        steps=steps,
        step_ms=1000.0 * wall / steps,
        total_ms=total / steps,
        top=[(name, ms / steps, round(count / steps)) for name, ms, count in rows[:top]],
        families=dict(sorted(families.items(), key=lambda kv: kv[1], reverse=True)),
    )


def profile_markdown(summary: ProfileSummary) -> str:
    """The profile as markdown: step time, busy share, families, top kernels."""
    mode = summary.compile_mode or "eager"
    busy = 100.0 * summary.total_ms / max(summary.step_ms, 1e-9)
    idle = " The GPU idles the rest of the step: launch- or host-bound." if summary.time_kind == "CUDA" else ""
    lines = [
        f"### {summary.case}, batch {summary.batch}, {mode}, {summary.device}",
        "",
        f"{summary.step_ms:.2f} ms per step (profiled); {summary.time_kind} self time {summary.total_ms:.2f} ms "
        f"per step, {busy:.0f}% of it.{idle if busy < 90 else ''}",
        "",
        "| family | share of kernel time |",
        "|---|---|",
        *[f"| {family} | {share:.1f}% |" for family, share in summary.families.items()],
        "",
        f"| top {summary.time_kind} kernels / ops | ms per step | calls per step | family |",
        "|---|---|---|---|",
    ]
    for name, ms, calls in summary.top:
        short = name if len(name) <= 80 else name[:77] + "..."
        lines.append(f"| `{short}` | {ms:.3f} | {calls} | {kernel_family(name)} |")
    return "\n".join(lines)

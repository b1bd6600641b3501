"""Where a training step of our model spends its time: torch.profiler over a few steps of a benchmark case, the
kernels (CUDA) or ops (CPU) with the most self time, and each kernel family's share, as a markdown section."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from bench_cases import BenchCase, build_side
from step_timing import make_train_step, synchronize

from vit.runtime.device import choose_precision

KERNEL_FAMILIES = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
    ("patch embed (conv)", ("convolution", "conv2d", "cudnn", "implicit_gemm")),
    # cuBLASLt's Hopper kernels are named nvjet_sm90_...: matmuls, not elementwise work.
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "matmul", "addmm", "aten::mm", "aten::bmm", "linear", "cublas")),
    ("optimizer", ("adam", "foreach", "multi_tensor", "fused_adamw")),
    # GammaBetaBackward is LayerNorm's weight and bias gradient.
    ("norm", ("layer_norm", "layernorm", "native_layer_norm", "rms_norm", "gammabetabackward")),
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
    precision: str  # what the forward passes ran in: fp32, bf16, fp16
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
    amp: str = "auto",
) -> ProfileSummary:
    """Where a training step of our model spends its time: torch.profiler over `steps` steps after warm-up,
    the kernels (CUDA) or ops (CPU) with the most self time, and the share of each kernel family. `amp`: the
    precision, as trainer.amp."""
    from torch.profiler import ProfilerActivity, profile

    batch = batch or case.batch
    model = build_side(case, "ours")
    precision = choose_precision(amp, device, model)
    step = make_train_step(model, batch, case.img_size, device, compile_mode, precision)
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
        precision=precision.name,
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
        f"### {summary.case}, batch {summary.batch}, {mode}, {summary.precision}, {summary.device}",
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

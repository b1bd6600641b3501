"""Inference speed of our models against timm's of the same shape: PyTorch eager, torch.compile, and the ONNX
export run by onnxruntime, at batch 1 (latency) and a large batch (throughput).

Protocol: fixed random inputs (fp32) already on the device, `torch.no_grad()`, the model in eval mode. Every
variant (ours and the peer, per runtime) is warmed up, then timed in interleaved rounds, each variant's turn at
least `min_round_s` of back-to-back calls, in a new (seeded) random order every round, so that no variant always
runs after the same one. onnxruntime gets the same number of threads as torch and does not spin its threads
between calls (`session.intra_op.allow_spinning=0`): spinning threads would keep the cores busy into the next
variant's turn. A variant's latency is the median over rounds of its mean call time, and the ratio column the
median of the per-round throughput ratios ours/peer with its 10th-90th percentile spread, so that a neighbour's
load or a clock change hits both sides alike.

`onnxruntime-int8-dynamic` and `onnxruntime-int8-static` run the ONNX export quantized as `vit-export
quantize=...` quantizes it (vit/deploy/quantize.py; the static one calibrated on the timed inputs, which sets its
scales, not its speed).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from bench_cases import BenchCase, build_side, peer_available
from records import measurement_record
from step_timing import percentile, synchronize
from torch import nn

from vit.runtime.device import Precision, choose_precision

RUNTIMES = ("eager", "compiled", "onnxruntime", "onnxruntime-int8-dynamic", "onnxruntime-int8-static")
ONNX_RUNTIMES = tuple(r for r in RUNTIMES if r.startswith("onnxruntime"))


@dataclass
class Variant:
    side: str  # "ours" or "peer"
    runtime: str  # one of RUNTIMES
    call: Callable[[], object]


@dataclass
class RuntimeResult:
    runtime: str
    ours_ms: float
    ours_p10_ms: float | None = None  # the spread of the per-round latencies
    ours_p90_ms: float | None = None
    peer_ms: float | None = None
    ratio_median: float | None = None  # throughput ours / peer
    ratio_p10: float | None = None
    ratio_p90: float | None = None
    ours_calls_per_round: int = 0
    ours_round_ms: list[float] = field(default_factory=list)  # every round's mean call time, in order
    peer_calls_per_round: int | None = None
    peer_round_ms: list[float] | None = None


@dataclass
class InferenceResult:
    case: str
    img_size: int
    batch: int
    device: str
    threads: int
    rounds: int
    runtimes: list[RuntimeResult] = field(default_factory=list)


def onnx_session(
    model: nn.Module, example: torch.Tensor, folder: Path, name: str, threads: int, runtime: str = "onnxruntime"
):
    """Export `model` with the project's exporter (dynamic batch), quantize it for an INT8 runtime, and open it in
    onnxruntime on the CPU with `threads` threads that do not spin between calls."""
    import onnxruntime as ort

    from vit.deploy.export import INPUT_NAME, write_onnx
    from vit.deploy.quantize import quantize_file

    path = folder / f"{name}.onnx"
    if not path.is_file():
        with torch.no_grad():
            write_onnx(model, example[:2].contiguous(), path, dynamic=True)
    if runtime != "onnxruntime":
        mode = runtime.removeprefix("onnxruntime-")
        quantized = folder / f"{name}.{mode}.onnx"
        quantize_file(path, quantized, mode, INPUT_NAME, example.numpy() if mode == "int8-static" else None)
        path = quantized
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def build_variants(
    case: BenchCase,
    batch: int,
    device: torch.device,
    runtimes: tuple[str, ...],
    vs_peer: bool,
    folder: Path,
    amps: tuple[str, str] = ("auto", "same"),
) -> list[Variant]:
    """The timed calls; the PyTorch runtimes run in the precision trainer.amp=`amps[0]` gives our model on this
    device (vit/runtime/device.py), the peer's in `amps[1]` ("same": ours); onnxruntime in the file's fp32."""
    sides = ["ours"] + (["peer"] if vs_peer and peer_available(case) else [])
    x = torch.randn(batch, 3, case.img_size, case.img_size, device=device)
    threads = torch.get_num_threads()
    variants = []
    for side in sides:
        torch.manual_seed(0)
        model = build_side(case, side).to(device).eval()
        precision = choose_precision(amps[0] if side == "ours" or amps[1] == "same" else amps[1], device, model)
        for runtime in runtimes:
            if runtime == "eager":
                variants.append(Variant(side, runtime, _torch_call(model, x, precision)))
            elif runtime == "compiled":
                variants.append(Variant(side, runtime, _torch_call(torch.compile(model), x, precision)))
            elif runtime in ONNX_RUNTIMES and device.type == "cpu":
                session = onnx_session(model, x, folder, f"{case.name}_{side}", threads, runtime)
                feed = {session.get_inputs()[0].name: x.numpy()}
                variants.append(Variant(side, runtime, lambda s=session, f=feed: s.run(None, f)))
    # Interleaved by runtime: ours eager, peer eager, ours compiled, peer compiled, ...
    return sorted(variants, key=lambda v: (RUNTIMES.index(v.runtime), sides.index(v.side)))


def _torch_call(model: nn.Module, x: torch.Tensor, precision: Precision) -> Callable[[], object]:
    def call() -> object:
        with torch.no_grad(), precision.autocast(x.device):
            return model(x)

    return call


def time_calls(call: Callable[[], object], calls: int, device: torch.device) -> float:
    """Seconds per call over `calls` back-to-back calls."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    synchronize(device)
    return (time.perf_counter() - start) / calls


def bench_inference(
    case: BenchCase,
    device: torch.device,
    batch: int,
    *,
    runtimes: tuple[str, ...] = ("eager",),
    vs_peer: bool = True,
    rounds: int = 15,
    warmup: int = 3,
    min_round_s: float = 0.3,
    amps: tuple[str, str] = ("auto", "same"),
) -> InferenceResult:
    """Median latency of each (side, runtime) at `batch`, timed in interleaved rounds (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="vit-infer-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings of the exporters
        variants = build_variants(case, batch, device, runtimes, vs_peer, Path(tmp), amps)
        for variant in variants:  # compiles, fills caches, lets onnxruntime allocate
            for _ in range(warmup):
                variant.call()
        calls = {id(v): max(1, int(min_round_s / max(time_calls(v.call, 2, device), 1e-9)) + 1) for v in variants}
        seconds: dict[tuple[str, str], list[float]] = {(v.side, v.runtime): [] for v in variants}
        shuffle = random.Random(0).shuffle
        for _ in range(rounds):
            order = list(variants)
            shuffle(order)  # a new order each round (module docstring)
            for variant in order:
                seconds[(variant.side, variant.runtime)].append(time_calls(variant.call, calls[id(variant)], device))
    counts = {(v.side, v.runtime): calls[id(v)] for v in variants}
    result = InferenceResult(case.name, case.img_size, batch, str(device), torch.get_num_threads(), rounds)
    for runtime in runtimes:
        ours = seconds.get(("ours", runtime))
        if not ours:
            continue
        peer = seconds.get(("peer", runtime))
        row = RuntimeResult(runtime, 1000 * statistics.median(ours))
        row.ours_p10_ms, row.ours_p90_ms = 1000 * percentile(ours, 0.1), 1000 * percentile(ours, 0.9)
        row.ours_calls_per_round, row.ours_round_ms = counts[("ours", runtime)], [1000 * s for s in ours]
        if peer:
            row.peer_ms = 1000 * statistics.median(peer)
            row.peer_calls_per_round, row.peer_round_ms = counts[("peer", runtime)], [1000 * s for s in peer]
            ratios = [p / o for o, p in zip(ours, peer, strict=True)]  # throughput ours / peer, per round
            row.ratio_median = statistics.median(ratios)
            row.ratio_p10, row.ratio_p90 = percentile(ratios, 0.1), percentile(ratios, 0.9)
        result.runtimes.append(row)
    return result


def inference_markdown(results: list[InferenceResult]) -> str:
    columns = ["model", "img px", "batch", "runtime", "ours ms", "ours ms p10-p90", "ours img/s", "timm ms"]
    columns.append("timm img/s")
    columns.append("ratio ours/timm (p10-p90)")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in results:
        for row in r.runtimes:
            peer = "- | -" if row.peer_ms is None else f"{row.peer_ms:.2f} | {1000 * r.batch / row.peer_ms:,.0f}"
            ratio = "-"
            if row.ratio_median is not None:
                ratio = f"{row.ratio_median:.3f} ({row.ratio_p10:.3f}-{row.ratio_p90:.3f})"
            spread = "-" if row.ours_p10_ms is None else f"{row.ours_p10_ms:.2f}-{row.ours_p90_ms:.2f}"
            lines.append(
                f"| {r.case} | {r.img_size} | {r.batch} | {row.runtime} | {row.ours_ms:.2f} | {spread} | "
                f"{1000 * r.batch / row.ours_ms:,.0f} | {peer} | {ratio} |"
            )
    return "\n".join(lines)


def inference_record(results: list[InferenceResult], argv: list[str] | None = None) -> dict:
    """The measurement record of the cases (vit/records/provenance.py: the command, code and machine beside the
    values): each case and runtime with every round's mean call time per side, beside their medians and ratios."""
    return measurement_record("benchmark_inference", {"results": [asdict(r) for r in results]}, argv)

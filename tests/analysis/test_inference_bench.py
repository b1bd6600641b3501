"""lab/benchmark.py mode=inference on the toy shape: every runtime asked for gets a row beside timm's, the ONNX
sessions compute the models' logits, bad arguments exit 2, a planted slowdown moves the ratio as predicted (no timing
assertions: speed lives in the docs)."""

import json
import sys

import numpy as np
import pytest
import torch
from bench_cases import CASES
from inference_timing import build_variants
from trainer_utils import VirtualClock, assert_measurement_record, load_script

from vit.cli.args import run_script

benchmark = load_script("benchmark")


def test_toy_inference_against_timm_writes_json_and_table(tmp_path, capsys):
    out_json, out_md = tmp_path / "i.json", tmp_path / "i.md"
    args = ["mode=inference", "models=toy", "batches=1,4", "vs_timm=true", "runtimes=eager,onnxruntime"]
    # One thread: two-threaded calls of a tiny model wait on each other when neighbours load the cores.
    args += ["rounds=3", "warmup=1", "min_round_s=0.02", "device=cpu", "threads=1"]
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # the caller's setting, other than the benchmark's 1
    try:
        assert benchmark.main([*args, f"json={out_json}", f"md={out_md}"]) == 0
        assert torch.get_num_threads() == 3  # the caller's setting is back
    finally:
        torch.set_num_threads(threads)
    record = json.loads(out_json.read_text())
    assert_measurement_record(record, "benchmark_inference", "mode=inference models=toy batches=1,4")
    results = record["results"]
    assert [(r["case"], r["batch"]) for r in results] == [("toy", 1), ("toy", 4)]
    for result in results:
        assert [row["runtime"] for row in result["runtimes"]] == ["eager", "onnxruntime"]
        for row in result["runtimes"]:
            assert row["ours_ms"] > 0 and row["peer_ms"] > 0
            for side in ("ours", "peer"):  # every round's mean call time, their median the latency
                assert len(row[f"{side}_round_ms"]) == 3 and row[f"{side}_calls_per_round"] >= 1
                assert row[f"{side}_ms"] == pytest.approx(sorted(row[f"{side}_round_ms"])[1])
            assert row["ours_p10_ms"] <= row["ours_ms"] <= row["ours_p90_ms"]
            assert row["ratio_p10"] <= row["ratio_median"] <= row["ratio_p90"]
    table = out_md.read_text()
    assert "| toy | 32 | 4 | onnxruntime |" in table and "| toy | 32 | 1 | eager |" in table
    assert "| toy | 32 | 4 | onnxruntime |" in capsys.readouterr().out


def test_the_timed_onnx_sessions_compute_the_models_logits(tmp_path):
    """What is timed is the model: each ONNX variant's output equals the eager variant's of the same side (both in
    fp32: the file's precision, whatever trainer.amp's rule gives the eager model on this CPU)."""
    runtimes = ("eager", "onnxruntime")
    variants = build_variants(CASES["toy"], 3, torch.device("cpu"), runtimes, True, tmp_path, amps=("none", "same"))
    assert [(v.side, v.runtime) for v in variants] == [
        ("ours", "eager"),
        ("peer", "eager"),
        ("ours", "onnxruntime"),
        ("peer", "onnxruntime"),
    ]
    outputs = {(v.side, v.runtime): v.call() for v in variants}
    for side in ("ours", "peer"):
        eager = outputs[(side, "eager")].numpy()
        assert eager.shape == (3, 10)
        assert np.abs(outputs[(side, "onnxruntime")][0] - eager).max() <= 1e-4


def test_the_int8_sessions_are_quantized_files_close_to_the_model(tmp_path):
    """The INT8 runtimes time the export quantized as export.py quantize= quantizes it: integer products in the
    graph, logits near the float model's (not equal)."""
    import onnx

    runtimes = ("eager", "onnxruntime-int8-dynamic", "onnxruntime-int8-static")
    variants = build_variants(CASES["toy"], 3, torch.device("cpu"), runtimes, False, tmp_path, amps=("none", "same"))
    outputs = {v.runtime: v.call() for v in variants}
    eager = outputs["eager"].numpy()
    for runtime in runtimes[1:]:
        difference = np.abs(outputs[runtime][0] - eager).max()
        assert 0 < difference < 0.1 * np.abs(eager).max() + 0.05, (runtime, difference)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "toy_ours.int8-static.onnx")).graph.node}
    assert "QuantizeLinear" in ops
    ops = {n.op_type for n in onnx.load(str(tmp_path / "toy_ours.int8-dynamic.onnx")).graph.node}
    assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops


def test_each_variant_runs_after_each_other_one(monkeypatch):
    """The timed order turns every round: no variant always follows the same one (a runtime's leftover threads
    would bill the next)."""
    import inference_timing as inference

    order = []
    monkeypatch.setattr(inference, "time_calls", lambda call, calls, device: order.append(call()) or 1e-3)
    fake = [
        inference.Variant(s, r, lambda s=s, r=r: (s, r)) for r in ("eager", "onnxruntime") for s in ("ours", "peer")
    ]
    monkeypatch.setattr(inference, "build_variants", lambda *a, **k: fake)
    inference.bench_inference(
        CASES["toy"], torch.device("cpu"), 1, runtimes=("eager", "onnxruntime"), rounds=4, warmup=0
    )
    timed = order[len(fake) :]  # after the calibration calls
    followers = {v: {timed[i + 1] for i in range(len(timed) - 1) if timed[i] == v} for v in set(timed)}
    assert all(len(f) >= 2 for f in followers.values()), followers


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["runtimes=tensorrt"], "usage error: runtimes='tensorrt' is not a runtime"),
        (["batches=0"], "usage error: batches='0' must be positive integers (batches=[1,64])"),
    ],
)
def test_bad_arguments_exit_2(capsys, args, needle):
    assert run_script(benchmark.main, ["mode=inference", "models=toy", "device=cpu", *args]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(needle), line


def test_onnxruntime_without_the_export_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert run_script(benchmark.main, ["mode=inference", "models=toy", "device=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("usage error: runtimes=onnxruntime: needs onnxruntime") and "'.[export]'" in err


def test_a_planted_slowdown_in_the_peer_raises_the_ratio_by_its_size(monkeypatch):
    """The ratio is ours over the peer's throughput, per round: with the calls charged known costs on a virtual
    clock (ours 2 ms, the peer 3 ms), the latencies are those costs, and a 10 ms slowdown planted in the peer's call
    raises the peer's latency by 10 ms and the ratio from 3/2 to 13/2."""
    import inference_timing as inference

    clock = VirtualClock()
    monkeypatch.setattr(inference, "time", clock)
    real = inference._torch_call

    def measure(peer_s: float):
        built = []

        def torch_call(model, x, precision):
            built.append(model)  # ours is built first, then the peer
            return clock.costing(real(model, x, precision), 0.002 if len(built) == 1 else peer_s)

        monkeypatch.setattr(inference, "_torch_call", torch_call)
        return inference.bench_inference(
            CASES["toy"], torch.device("cpu"), 4, rounds=3, warmup=1, min_round_s=0.01
        ).runtimes[0]

    before, after = measure(0.003), measure(0.003 + 0.010)
    assert (before.ours_ms, before.peer_ms, before.ratio_median) == pytest.approx((2.0, 3.0, 1.5))
    assert (after.ours_ms, after.peer_ms, after.ratio_median) == pytest.approx((2.0, 13.0, 6.5))

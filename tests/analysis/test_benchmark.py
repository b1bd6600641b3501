"""The benchmark runs end to end on CPU with a toy shape (no timing assertions: speed lives in the docs), and its ratio
follows a slowdown planted in one side."""

import json

import benchmark
import pytest
import torch
from bench_cases import CASES, build_side
from step_timing import percentile
from trainer_utils import VirtualClock, assert_measurement_record

from vit.cli.args import run_script


def test_toy_benchmark_against_timm_writes_json_and_table(tmp_path, capsys):
    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    code = benchmark.main(
        ["models=toy", "vs_timm=true", "rounds=2", "warmup=1", "min_round_s=0.05"]
        + ["device=cpu", f"json={out_json}", f"md={out_md}"]
    )
    assert code == 0
    record = json.loads(out_json.read_text())
    assert_measurement_record(record, "benchmark", "lab/benchmark.py models=toy vs_timm=true")
    (result,) = record["results"]
    assert result["case"] == "toy" and result["rounds"] == 2
    assert [s["side"] for s in result["sides"]] == ["ours", "peer"]
    for side in result["sides"]:  # every round's time, and the median of their throughputs
        assert len(side["round_seconds"]) == len(side["round_img_per_s"]) == 2 and side["img_per_s"] > 0
        steps, seconds = side["steps_per_round"], side["round_seconds"]
        assert side["round_img_per_s"] == pytest.approx([steps * result["batch"] / s for s in seconds])
        assert side["img_per_s"] == pytest.approx(sum(side["round_img_per_s"]) / 2)
    assert result["ratio_p10"] <= result["ratio_median"] <= result["ratio_p90"]
    assert "| toy | 32 | 8 | eager |" in out_md.read_text()
    assert "| toy |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["models=vit_giant"], "usage error: models='vit_giant' is not a benchmark case; choose from "),
        (["--models", "toy"], "usage error: argument '--models' must look like key=value"),
        (["mode=train"], "usage error: mode='train' must be one of steps, inference, e2e, profile"),
        (["rounds=0"], "usage error: rounds='0' must be an integer >= 1"),
        (["min_round_s=fast"], "usage error: min_round_s='fast' must be a number"),
        (["min_round_s=-1"], "usage error: min_round_s='-1' must be a number >= 0"),
        (["vs_timm=maybe"], "usage error: vs_timm='maybe' must be true or false"),
        (["mode=profile", "models=toy"], "usage error: mode=profile writes its markdown to md=<path>"),
        (["models=toy,toy", "batch=2,4,8"], "usage error: batch=2,4,8 has 3 values for 2 models"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it(args, message, capsys):
    assert run_script(benchmark.main, args) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(message), line


def test_every_case_builds_the_same_shape_as_its_peer():
    for case in CASES.values():
        if case.peer == "timm" and not case.timm_name:
            assert case.kwargs.get("img_size", 224) == case.peer_kwargs["img_size"] == case.img_size


def test_a_case_by_timm_name_builds_timms_architecture_on_both_sides():
    """The foundation cases: ours has timm's parameter count for the name at the case's size, the peer is timm's
    own model of that name."""
    for case in (CASES["deit3_small"], CASES["eva02_tiny"]):
        ours, peer = build_side(case, "ours"), build_side(case, "peer")
        assert type(peer).__module__.startswith("timm.") and not type(ours).__module__.startswith("timm.")
        assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in peer.parameters()), case.name
        assert peer.patch_embed.img_size == (case.img_size, case.img_size)


@pytest.mark.parametrize(("q", "expected"), [(0.0, 1.0), (0.5, 2.5), (1.0, 4.0), (0.1, 1.3)])
def test_percentile_interpolates(q, expected):
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("aten::addmm", "matmul"),
        ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "matmul"),  # cuBLASLt on Hopper
        ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float>", "norm"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("triton_per_fused_add_native_layer_norm_0", "norm"),  # a fused LayerNorm is counted as a norm
        ("triton_poi_fused_gelu_mul_3", "fused (triton)"),
        ("aten::mkldnn_convolution", "patch embed (conv)"),
        ("aten::gelu", "elementwise / other"),
    ],
)
def test_kernel_families(name, family):
    from step_profile import kernel_family

    assert kernel_family(name) == family


def test_profile_writes_families_and_top_kernels(tmp_path):
    out = tmp_path / "profile.md"
    args = ["mode=profile", "models=toy", "device=cpu", f"md={out}", "profile_steps=2", "warmup=1", "amp=bf16"]
    assert benchmark.main(args) == 0
    text = out.read_text()
    assert text.startswith("### toy, batch ") and ", eager, bf16, cpu" in text.splitlines()[0]
    shares = [float(line.split("|")[2].strip().rstrip("%")) for line in text.splitlines() if line.endswith("% |")]
    assert sum(shares) == pytest.approx(100.0, abs=0.5)
    # The toy ViT's linear layers, and its attention written out on a CPU (attn_backend=auto): products, softmax.
    assert "| matmul |" in text and "| softmax / loss |" in text
    times = [float(line.split("|")[2]) for line in text.splitlines() if line.startswith("| `")]
    assert len(times) == 15 and times == sorted(times, reverse=True)


# End to end through the trainer ------------------------------------------------------------------------------


def test_alternating_loader_replays_the_first_real_batch_on_odd_passes():
    from e2e_timing import AlternatingStaticLoader

    class Loader(list):
        epoch = None

        def set_epoch(self, epoch):
            self.epoch = epoch

    batches = Loader([(torch.full((2, 3), float(i)), torch.tensor([i, i])) for i in range(3)])
    wrapped = AlternatingStaticLoader(batches)
    assert len(wrapped) == 3
    wrapped.set_epoch(7)  # what the trainer calls reaches the real loader
    assert batches.epoch == 7
    real = list(wrapped)
    assert [int(y[0]) for _, y in real] == [0, 1, 2]
    static = list(wrapped)
    assert len(static) == 3 and all(torch.equal(x, real[0][0]) and torch.equal(y, real[0][1]) for x, y in static)
    assert [int(y[0]) for _, y in wrapped] == [0, 1, 2]  # the third pass is real again


def test_pairs_skip_the_warm_up_epochs():
    from e2e_timing import pair_overheads

    history = [{"train_img_per_s": v} for v in (10.0, 99.0, 100.0, 125.0, 110.0, 121.0, 5.0)]
    # Epoch 0 (compile) and 1 are not counted; (2, 3) and (4, 5) are pairs; 6 has no static partner.
    assert pair_overheads(history) == ([100.0, 110.0], [125.0, 121.0])


def test_e2e_benchmark_trains_through_the_trainer_and_reports_the_data_path_cost(tmp_path, capsys):
    out_json, run_dir = tmp_path / "e2e.json", tmp_path / "run"
    overrides = ["data=synthetic", "data.synthetic.num_train=128", "data.synthetic.num_val=32", "data.batch_size=32"]
    overrides += ["model.embed_dim=32", "model.depth=1", "model.num_heads=2", "trainer.device=cpu"]
    overrides += ["data.loader=torch"]  # the loader whose data path has a cost to measure (auto: in memory on a CPU)
    args = ["mode=e2e", "epochs=6", f"e2e_dir={run_dir}", f"json={out_json}", *overrides]
    assert benchmark.main(args) == 0
    result = json.loads(out_json.read_text())
    assert_measurement_record(result, "benchmark_e2e", "mode=e2e epochs=6", "data.loader=torch")
    # Recomputed from the run's own metrics.json: epochs 2 and 4 real, 3 and 5 static.
    rates = [r["train_img_per_s"] for r in json.loads((run_dir / "metrics.json").read_text())["history"]]
    assert len(rates) == 6
    assert result["real_img_per_s"] == [rates[2], rates[4]] and result["static_img_per_s"] == [rates[3], rates[5]]
    ratios = sorted([rates[3] / rates[2] - 1, rates[5] / rates[4] - 1])
    assert result["overhead"] == pytest.approx(sum(ratios) / 2)
    assert result["overhead_p10"] <= result["overhead"] <= result["overhead_p90"]
    assert result["loader"] == "torch" and result["batch"] == 32 and not result["compiled"]
    assert "| torch | off | 32 |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["mode=e2e", "epochs=3", "data=synthetic"], "epochs=3: the end-to-end benchmark needs >= 4"),
        (["models=toy", "data=synthetic"], "'data=synthetic': config overrides only go with mode=e2e"),
        (["mode=e2e", "model.embed_dim=64", "trainer.device=cpu"], "model.num_heads=3 must be a positive divisor"),
    ],
)
def test_e2e_arguments_are_checked(args, message, capsys):
    assert run_script(benchmark.main, args) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert message in line


@pytest.mark.parametrize(("side", "ratio"), [("peer", 13 / 2), ("ours", 3 / 12)])
def test_a_planted_slowdown_moves_the_ratio_by_its_size(side, ratio, monkeypatch):
    """The reported ratio is ours over the peer's throughput: with the steps charged known costs on a virtual clock
    (ours 2 ms, the peer 3 ms; 3/2 unplanted), a 10 ms slowdown planted in one side's step grows that side's step
    time by 10 ms and moves the ratio to what those step times give."""
    import step_timing as bench

    clock = VirtualClock()
    monkeypatch.setattr(bench, "time", clock)
    real = bench.make_train_step

    def measure(planted: str | None):
        built = []

        def make(*args, **kwargs):
            built.append(args[0])  # ours is built first, then the peer
            name = "ours" if len(built) == 1 else "peer"
            cost = {"ours": 0.002, "peer": 0.003}[name] + (0.010 if name == planted else 0.0)
            return clock.costing(real(*args, **kwargs), cost)

        monkeypatch.setattr(bench, "make_train_step", make)
        result = bench.bench_case(CASES["toy"], torch.device("cpu"), vs_peer=True, rounds=3, warmup=1, min_round_s=0.01)
        return {s.side: s.step_ms for s in result.sides}, result.ratio_median

    assert measure(None) == (pytest.approx({"ours": 2.0, "peer": 3.0}), pytest.approx(1.5))
    step_ms, planted_ratio = measure(side)
    assert step_ms[side] == pytest.approx(12.0 if side == "ours" else 13.0)
    assert planted_ratio == pytest.approx(ratio)


def test_a_lever_case_times_our_model_without_the_lever():
    """The deeper stem's cases: the peer is the recipe's model as it is, so the ratio is the lever's cost alone."""
    for convs in (2, 3):
        case = CASES[f"vit_cpu_recipe_144_stem{convs}"]
        ours, peer = build_side(case, "ours"), build_side(case, "peer")
        assert len(ours.patch_embed.stem) == 2 * convs + 1 and len(peer.patch_embed.stem) == 3
        outside = lambda model: {k: v.shape for k, v in model.state_dict().items() if ".stem." not in k}  # noqa: E731
        assert outside(ours) == outside(peer)

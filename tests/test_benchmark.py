"""The benchmark runs end to end on CPU with a toy shape (no timing assertions: speed lives in the docs)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import benchmark  # noqa: E402

from vit.analysis.benchmark import CASES, percentile  # noqa: E402


def test_toy_benchmark_against_timm_writes_json_and_table(tmp_path, capsys):
    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    code = benchmark.main(
        ["--models", "toy", "--vs-timm", "--rounds", "2", "--warmup", "1", "--min-round-s", "0.05"]
        + ["--device", "cpu", "--json", str(out_json), "--md", str(out_md)]
    )
    assert code == 0
    (result,) = json.loads(out_json.read_text())
    assert result["case"] == "toy" and result["rounds"] == 2
    assert [s["side"] for s in result["sides"]] == ["ours", "peer"]
    assert all(s["img_per_s"] > 0 for s in result["sides"])
    assert result["ratio_p10"] <= result["ratio_median"] <= result["ratio_p90"]
    assert "| toy | 32 | 8 | eager |" in out_md.read_text()
    assert "| toy |" in capsys.readouterr().out


def test_unknown_case_is_named(capsys):
    assert benchmark.main(["--models", "vit_giant"]) == 2
    assert "'vit_giant' is not a benchmark case" in capsys.readouterr().out


def test_every_case_builds_the_same_shape_as_its_peer():
    for case in CASES.values():
        if case.peer == "timm":
            assert case.kwargs.get("img_size", 224) == case.peer_kwargs["img_size"] == case.img_size


@pytest.mark.parametrize(("q", "expected"), [(0.0, 1.0), (0.5, 2.5), (1.0, 4.0), (0.1, 1.3)])
def test_percentile_interpolates(q, expected):
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("aten::addmm", "matmul"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("triton_per_fused_add_native_layer_norm_0", "norm"),  # a fused LayerNorm is counted as a norm
        ("triton_poi_fused_gelu_mul_3", "fused (triton)"),
        ("aten::mkldnn_convolution", "patch embed (conv)"),
        ("aten::gelu", "elementwise / other"),
    ],
)
def test_kernel_families(name, family):
    from vit.analysis.benchmark import kernel_family

    assert kernel_family(name) == family


def test_profile_writes_families_and_top_kernels(tmp_path):
    out = tmp_path / "profile.md"
    args = ["--models", "toy", "--device", "cpu", "--profile", str(out), "--profile-steps", "2", "--warmup", "1"]
    assert benchmark.main(args) == 0
    text = out.read_text()
    shares = [float(line.split("|")[2].strip().rstrip("%")) for line in text.splitlines() if line.endswith("% |")]
    assert sum(shares) == pytest.approx(100.0, abs=0.5)
    assert "| matmul |" in text and "| attention |" in text  # the linear layers and SDPA of the toy ViT
    times = [float(line.split("|")[2]) for line in text.splitlines() if line.startswith("| `")]
    assert len(times) == 15 and times == sorted(times, reverse=True)

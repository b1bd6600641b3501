"""The analysis scripts on tiny checkpoints: PNGs that are not blank, tables with the expected rows, one-line
errors for bad arguments."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from trainer_utils import QUICK_SYNTHETIC, TINY_MODEL, compose_config, fake_run, load_script, run_cli

from vit.cli.args import run_script
from vit.tasks.figures import rollout
from vit.train import run


def assert_png(path: Path, min_side: int = 100):
    image = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)
    assert min(image.shape[:2]) >= min_side and image.std() > 1.0


@pytest.fixture(scope="module")
def vit_checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    run(compose_config([*QUICK_SYNTHETIC, *TINY_MODEL, "trainer=debug"]), output_dir=out)
    return out / "checkpoints" / "last.pt"


@pytest.fixture(scope="module")
def t2t_checkpoint(tmp_path_factory):
    cfg = compose_config(
        ["model=t2t_vit_t_14", "model.depth=2", "model.embed_dim=48", "model.num_heads=2", "data=synthetic"]
    )
    from omegaconf import OmegaConf

    from vit.tasks.build import build_model_from_config

    model = build_model_from_config(cfg.model)
    path = tmp_path_factory.mktemp("t2t") / "t2t.pt"
    config = OmegaConf.to_container(cfg, resolve=True)
    torch.save({"model": model.state_dict(), "config": config, "class_to_idx": {f"c{i}": i for i in range(10)}}, path)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
    return folder


def test_visualize_attention_vit(vit_checkpoint, images, tmp_path):
    out = tmp_path / "att.png"
    assert (
        run_script(
            load_script("visualize_attention").main, [f"checkpoint={vit_checkpoint}", f"image={images}", f"out={out}"]
        )
        == 0
    )
    assert_png(out)


def test_visualize_attention_t2t_adds_the_token_stage(t2t_checkpoint, images, tmp_path, capsys):
    out = tmp_path / "att.png"
    args = [f"checkpoint={t2t_checkpoint}", f"image={images / 'img0.png'}", f"out={out}", "layer=0"]
    assert run_script(load_script("visualize_attention").main, args) == 0
    assert_png(out)
    with Image.open(out) as picture:
        width_t2t = picture.size[0]
    assert "2 heads" in capsys.readouterr().out
    # input + 2 heads + rollout + T2T stage = 5 columns of ~160 px
    assert width_t2t >= 5 * 150


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["checkpoint={ckpt}", "image={images}", "layer=7"], "layer=7 is out of range: the model has 2"),
        (["checkpoint={tmp}/none.pt", "image={images}"], "none.pt"),
        (["checkpoint={ckpt}", "image={tmp}/no.png"], "no.png"),
        (["checkpoint={ckpt}"], "image=<...> is required"),
        (["checkpoint={ckpt}", "image={images}", "colour=red"], "unknown argument 'colour'"),
        (["checkpoint={ckpt}", "image={images}", "layer=last"], "layer='last' must be an integer"),
        (["checkpoint={ckpt}", "image={images}", "max_images=0"], "max_images=0 must be at least 1"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(vit_checkpoint, images, tmp_path, capsys, args, needle):
    argv = [a.format(ckpt=vit_checkpoint, images=images, tmp=tmp_path) for a in args]
    assert run_script(load_script("visualize_attention").main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


@pytest.mark.parametrize("which", ["vit", "t2t"])
def test_plot_pos_embed(vit_checkpoint, t2t_checkpoint, tmp_path, which):
    out = tmp_path / "pos.png"
    checkpoint = vit_checkpoint if which == "vit" else t2t_checkpoint
    assert run_script(load_script("plot_pos_embed").main, [f"checkpoint={checkpoint}", f"out={out}"]) == 0
    assert_png(out)


def test_predict_top5_json(vit_checkpoint, images, tmp_path, capsys):
    out = tmp_path / "pred.json"
    assert (
        run_script(load_script("predict").main, [f"checkpoint={vit_checkpoint}", f"image={images}", f"json={out}"]) == 0
    )
    results = json.loads(out.read_text())
    assert [Path(r["image"]).name for r in results] == ["img0.png", "img1.png", "img2.png"]
    for r in results:
        probs = [p["prob"] for p in r["top"]]
        assert len(probs) == 5 and probs == sorted(probs, reverse=True) and sum(probs) <= 1.0001
        assert all(p["class"].startswith("class_") for p in r["top"])
    assert f"{images / 'img0.png'}: class_" in capsys.readouterr().out  # the path: a base name can repeat
    assert run_script(load_script("predict").main, [f"checkpoint={vit_checkpoint}", f"image={images}", "json=-"]) == 0
    assert json.loads(capsys.readouterr().out) == results  # json=-: the same JSON on stdout, no text lines


def test_predict_runs_in_the_precision_the_trainers_rule_gives(vit_checkpoint, images, monkeypatch, capsys):
    """The run's trainer.amp (auto) on a CPU with native bf16: the rule's precision for the 32-wide model, not said
    (the output is the predictions); amp=bf16 runs bf16 (close to, not equal to, amp=none's fp32 probabilities);
    fp16 on a CPU without it says what runs instead."""
    from vit.runtime import device as precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(precision, "cpu_has_native_fp16", lambda: False)
    predict = load_script("predict").main
    args = [f"checkpoint={vit_checkpoint}", f"image={images}", "json=-"]
    outputs = {}
    for amp in ("auto", "none", "bf16", "fp16"):
        assert run_script(predict, [*args, f"amp={amp}"]) == 0
        captured = capsys.readouterr()
        outputs[amp] = [p["prob"] for r in json.loads(captured.out) for p in r["top"]]
        # the precision's lines (the other one names the weights read: tests/deploy/test_tool_rules.py)
        outputs[amp + " stderr"] = [line for line in captured.err.strip().splitlines() if "precision" in line]
    assert outputs["auto stderr"] == outputs["none stderr"] == outputs["bf16 stderr"] == []
    assert outputs["bf16"] == pytest.approx(outputs["none"], abs=0.02) and outputs["bf16"] != outputs["none"]
    assert outputs["auto"] == outputs["bf16" if precision.CPU_BF16_MIN_WIDTH <= 32 else "none"]
    assert outputs["fp16 stderr"][0].startswith("warning: precision: bf16 (trainer.amp=fp16 but this CPU has no")
    assert run_script(predict, [*args, "amp=fp8"]) == 2
    assert "amp='fp8' must be one of" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("script", "args", "needle"),
    [
        ("predict", ["checkpoint={tmp}/none.pt", "image={images}"], "none.pt' does not exist"),
        ("predict", ["checkpoint={ckpt}", "image={tmp}/no.png"], "no.png' does not exist"),
        ("predict", ["checkpoint={ckpt}", "image={images}", "top=0"], "top='0' must be an integer >= 1"),
        ("predict", ["image={images}"], "checkpoint=<...> is required"),
        ("plot_pos_embed", ["checkpoint={tmp}/none.pt"], "none.pt' does not exist"),
        ("plot_pos_embed", ["checkpoint={ckpt}", "layer=1"], "unknown argument 'layer'"),
        ("complexity", ["model=vit_tiny", "model.colour=red"], "model.colour"),
        ("complexity", ["vit_tiny"], "argument 'vit_tiny' must look like key=value"),
        ("summarize_runs", ["{tmp}/nothing"], "nothing' does not exist"),
        ("summarize_runs", ["{tmp}"], "holds no runs"),
        ("summarize_runs", ["{tmp}", "colour=red"], "unknown argument 'colour'"),
    ],
)
def test_other_scripts_bad_arguments_exit_2_with_one_line(
    vit_checkpoint, images, tmp_path, capsys, script, args, needle
):
    argv = [a.format(ckpt=vit_checkpoint, images=images, tmp=tmp_path) for a in args]
    assert run_script(load_script(script).main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_complexity_table_and_figure(tmp_path, capsys):
    out = tmp_path / "cx.png"
    args = ["model=vit_tiny", "model.img_size=64", "model.patch_size=8", "model.depth=2", f"out={out}"]
    assert run_script(load_script("complexity").main, args) == 0
    text = capsys.readouterr().out
    for row in ("patch_embed", "attention", "mlp", "head", "4·N·C²", "2·N²·C", "params (M)"):
        assert row in text
    # 64 px / patch 8: 65 tokens of width 192 in 2 layers; torch's count on the math path agrees with the formula.
    assert "2 x N=65, C=192: 4·N·C² = 9.585 M, 2·N²·C = 1.622 M" in text
    attention = next(line.split() for line in text.splitlines() if line.startswith("attention"))
    assert attention[2] == attention[3] == "0.0224"  # GMACs: formula, measured (torch's FLOPs halved)
    formula, measured = [line for line in text.splitlines() if "all layers" in line][0].split(" GMACs")[:2]
    assert formula.split()[-1] == measured.split()[-1] == "0.0224"
    # Per layer 2·N²·C against 12·N·C² (projections + MLP), plus the patch embedding's N·C·192 once for both
    # layers: equal at N = 6·C·(1 + 1/24) = 1200 tokens, 34.6 patches of 8 px a side.
    assert "overtakes everything linear in N at about 277 px" in text
    assert_png(out)


def test_complexity_counts_the_performer_t2t_models(tmp_path, capsys):
    """T2T-ViT's performer keeps its kernel attention out of autocast; on the meta device, where the script counts
    without weights, that must not stop it (torch.autocast refuses the meta device)."""
    out = tmp_path / "t2t.png"
    assert run_script(load_script("complexity").main, ["model=t2t_vit_7", "model.depth=2", f"out={out}"]) == 0
    assert "params (M)" in capsys.readouterr().out
    assert_png(out)


def test_crossover_interpolates_in_token_count():
    crossover = load_script("complexity").crossover_size
    assert crossover([10, 20], [1.0, 1.0], [0.5, 2.0]) == pytest.approx((100 + 0.5 * 300 / 1.5) ** 0.5)
    assert crossover([10, 20], [1.0, 1.0], [0.1, 0.2]) is None


def test_complexity_unknown_model_is_one_line(capsys):
    assert run_script(load_script("complexity").main, ["model=vit_giant"]) == 2
    assert "vit_giant" in capsys.readouterr().err


def test_rollout_of_identity_attention_is_identity():
    eye = torch.eye(5).expand(2, 3, 5, 5)
    torch.testing.assert_close(rollout([eye, eye, eye]), torch.eye(5).expand(2, 5, 5))


def test_summarize_runs_on_a_real_multirun(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "experiment=ablation_qkv_bias", *QUICK_SYNTHETIC, *TINY_MODEL, "trainer=debug", "trainer.epochs=1"]
    done = run_cli([*args, f"hydra.sweep.dir={sweep}"], cwd=tmp_path, process=True)  # its start-up is checked
    assert done.returncode == 0, done.stderr[-2000:]
    summarize = load_script("summarize_runs")
    assert run_script(summarize.main, [str(sweep)]) == 0
    table = (sweep / "summary.md").read_text()
    header = "| run | model.qkv_bias | params (M) | GMACs | img/s | steps | images | epochs | precision | final top-1 "
    assert header + "| best top-1 | run s | start-up s |" in table
    assert "note: these runs trained different amounts" not in table  # both trained 5 steps of 32: 160 images
    assert all(row.split(" | ")[5:8] == ["5", "160", "1"] for row in table.splitlines() if row[:4] in ("| 0 ", "| 1 "))
    rows = [line for line in table.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert rows[0].startswith("| 0 | True |") and rows[1].startswith("| 1 | False |") and len(rows) == 2
    assert all("-" not in cell for row in rows for cell in row.split("|")[3:-1])  # every metric was found
    # The process's start-up (imports) is charged to the first run of the sweep only, in a column of its own.
    startups = [float(row.split("|")[-2]) for row in rows]
    assert startups[0] > 0 and startups[1] == 0
    assert_png(sweep / "summary.png")
    assert run_script(summarize.main, [str(tmp_path / "nothing")]) == 2


def test_summarize_runs_of_a_lever_screen_plots_each_setting_in_a_row(tmp_path):
    model = {"name": "vit_tiny", "embed_dim": 96, "num_heads": 3}
    levers = {
        "base": [],
        "spt": ["model.patch_embed=spt"],
        "lsa": ["model.lsa=true"],
        "erase": ["data.augment.re_prob=0.25"],
        "noaug": ["data.augment.auto_augment=null"],
    }
    for name, overrides in levers.items():
        for seed in (0, 1):
            metrics = {"final": {"val_top1": 40.0 + seed}, "wall_time_s": 10.0}
            fake_run(tmp_path / name / f"seed{seed}", [*overrides, f"trainer.seed={seed}"], model, metrics)
    assert run_script(load_script("summarize_runs").main, [str(tmp_path)]) == 0
    table = (tmp_path / "summary.md").read_text()
    assert "| overrides | seeds | final top-1 mean |" in table and "| model.lsa=true | 2 | 40.50 |" in table
    assert_png(tmp_path / "summary.png")
    assert Image.open(tmp_path / "summary.png").height >= 0.4 * 5 * 100  # a row per setting

"""INT8 export (vit-export quantize=..., vit/deploy/quantize.py): a trained checkpoint becomes an INT8 ONNX
file through the command line, its accuracy against the float file is measured in the same command and recorded,
the file is refused past max_drop, predict.py runs it, and bad options are one line with exit code 2."""

import json

import numpy as np
import onnx
import pytest
import torch
from trainer_utils import QUICK, load_script, run_cli

from vit.analysis.inputs import load_model
from vit.cli.args import run_script

export_script = load_script("export")
predict_script = load_script("predict")


def export(argv):
    return run_script(export_script.main, argv, usage=export_script.__doc__)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny ViT trained for 3 epochs on the synthetic data (it learns its classes), and its run folder."""
    run_dir = tmp_path_factory.mktemp("int8")
    args = [*QUICK, "data.synthetic.num_val=128", "trainer.epochs=3", f"hydra.run.dir={run_dir}"]
    done = run_cli(args, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir / "checkpoints" / "last.pt"


def test_a_checkpoint_exports_to_int8_with_its_accuracy_measured(trained, tmp_path, capsys):
    out = tmp_path / "model.int8.onnx"
    assert export([f"checkpoint={trained}", "quantize=int8-dynamic", f"output={out}"]) == 0
    printed = capsys.readouterr().out
    meta = json.loads((tmp_path / "model.int8.onnx.json").read_text())
    report = meta["quantization"]
    assert report["mode"] == "int8-dynamic" and report["images"] == 128 and report["calibration_images"] is None
    assert report["int8_bytes"] == out.stat().st_size < report["float_bytes"]
    assert 0 <= report["agreement"] <= 100 and report["max_abs_logit_diff"] > 0  # INT8 never equals float
    # the float top-1 is the PyTorch model's own on the same images
    images, labels, split = export_script.labelled_images(load_model(trained)[1]["data"], "val", None, pre_of(trained))
    assert split == report["split"] == "val"
    model = load_model(trained)[0]
    with torch.no_grad():
        top1 = 100.0 * (model(torch.from_numpy(images)).argmax(1).numpy() == labels).mean()
    assert report["float_top1"] == pytest.approx(top1)
    assert report["top1_drop"] == pytest.approx(report["float_top1"] - report["int8_top1"])
    assert "INT8 against float on the val split: top-1" in printed
    # MatMul weights are int8 now: the graph runs integer matrix products
    ops = {node.op_type for node in onnx.load(str(out)).graph.node}
    assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops


def pre_of(checkpoint):
    from vit.deploy.preprocessing import from_data_config

    return from_data_config(load_model(checkpoint)[1]["data"])


def test_static_int8_is_calibrated_on_training_images_and_written_as_qdq(trained, tmp_path):
    out = tmp_path / "static.onnx"
    args = [f"checkpoint={trained}", "quantize=int8-static", "calibration=32", "check_images=64", f"output={out}"]
    assert export(args) == 0
    report = json.loads((tmp_path / "static.onnx.json").read_text())["quantization"]
    assert report["mode"] == "int8-static" and report["calibration_images"] == 32 and report["images"] == 64
    ops = [node.op_type for node in onnx.load(str(out)).graph.node]
    assert ops.count("QuantizeLinear") > 0 and ops.count("DequantizeLinear") > 0
    assert "LayerNormalization" in ops  # kept in float


def test_the_default_int8_file_sits_beside_the_checkpoint(trained):
    assert export([f"checkpoint={trained}", "quantize=int8", "check_images=32"]) == 0
    path = trained.with_name("last.int8.onnx")
    meta = json.loads(path.with_name("last.int8.onnx.json").read_text())
    assert meta["quantization"]["mode"] == export_script.resolve_mode("int8")


def test_an_int8_file_over_the_bar_is_refused_and_nothing_is_written(trained, tmp_path, capsys):
    out = tmp_path / "refused.onnx"
    # a negative bar asks the INT8 file to gain 100 points: no file can
    assert export([f"checkpoint={trained}", "quantize=int8", "max_drop=-100", f"output={out}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("export check failed: the int8-dynamic file loses ") and "nothing was written" in err
    assert list(tmp_path.iterdir()) == []


def test_predict_runs_the_int8_file_and_agrees_with_the_float_model(trained, tmp_path):
    out = tmp_path / "model.onnx"
    assert export([f"checkpoint={trained}", "quantize=int8", f"output={out}"]) == 0
    folder = tmp_path / "images"
    folder.mkdir()
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(8):  # the synthetic data's kind of image: smooth colour fields
        coarse = rng.integers(0, 255, (4, 4, 3), dtype=np.uint8)
        Image.fromarray(coarse).resize((32, 32), Image.Resampling.BICUBIC).save(folder / f"{i}.png")
    tops = {}
    for which, source in (("float", trained), ("int8", out)):
        result = tmp_path / f"{which}.json"
        assert run_script(predict_script.main, [f"checkpoint={source}", f"image={folder}", f"json={result}"]) == 0
        tops[which] = [r["top"][0]["class"] for r in json.loads(result.read_text())]
    agree = sum(a == b for a, b in zip(tops["float"], tops["int8"], strict=True))
    assert agree >= 7, tops  # of 8 images; the INT8 file is not the float one, but close


@pytest.mark.parametrize(
    "args, message",
    [
        (["quantize=int4"], "quantize=int4 is not a known mode; choose from int8, int8-dynamic, int8-static"),
        (["quantize=int8-static", "calibration=0"], "calibration='0' must be an integer >= 1"),
        (["quantize=int8", "format=torchscript"], "quantize=int8 writes ONNX: it needs format=onnx"),
        (["calibration=8"], "calibration= is a setting of quantize=int8"),
        (["quantize=int8", "max_drop=lots"], "max_drop='lots' must be a number of top-1 points"),
    ],
)
def test_bad_quantize_options_exit_2_with_one_line(trained, tmp_path, capsys, args, message):
    assert export([f"checkpoint={trained}", f"output={tmp_path / 'x.onnx'}", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []

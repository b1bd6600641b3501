"""vit-export and predict.py with an ONNX file: the exported files compute the PyTorch model's logits (checked
here by onnxruntime / PyTorch on images the trainer's own validation transform makes), any batch size runs, the
side JSON holds what a server needs, and bad input is one line with exit code 2."""

import errno
import json
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from trainer_utils import compose_config, load_script

from vit.analysis.inputs import load_model
from vit.cli.args import run_script
from vit.data.augment.transforms import val_transform
from vit.data.images import read_rgb
from vit.data.sources.registry import mean_std
from vit.deploy.preprocessing import from_data_config
from vit.deploy.runtime import OnnxClassifier, preprocess
from vit.models import capture_attention
from vit.tasks.build import build_model_from_config

export_script = load_script("export")
predict_script = load_script("predict")

# Two encoder blocks instead of 12 (or 7) keep the suite fast: every kind of layer is there, and what exports one
# block exports twelve (test_full_depth_models_export, marked slow, exports the full models).
SHALLOW = "model.depth=2"
CASES = {
    # name: (overrides composing the checkpoint's config, (width, height) of the generated test images)
    "vit_tiny_cifar": (["model=vit_tiny", "data=cifar10", SHALLOW], (40, 36)),
    "vit_tiny_224": (["model=vit_tiny", "data=imagefolder", SHALLOW], (300, 260)),
    # T2T-ViT's CIFAR soft splits here; the 224 px (ImageNet) splits in the full-depth test below.
    "t2t_vit_7": (["model=t2t_vit_7", "data=cifar10", SHALLOW], (40, 36)),
}


def export(argv):
    return run_script(export_script.main, argv, usage=export_script.__doc__)


def make_checkpoint(path, overrides, num_classes=10):
    """A checkpoint as the trainer writes it (weights, resolved config, class map), random weights."""
    cfg = compose_config(overrides)
    torch.manual_seed(0)
    model = build_model_from_config(cfg.model, num_classes=num_classes)
    classes = {f"class_{i}": i for i in range(num_classes)}
    config = OmegaConf.to_container(cfg, resolve=True)
    torch.save({"model": model.state_dict(), "config": config, "class_to_idx": classes, "ema": None}, path)
    return path


def make_images(folder, size, count=5, seed=0):
    """Smooth colour blobs plus noise, of a non-square size (so resize and crop both matter)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    width, height = size
    for i in range(count):
        coarse = rng.integers(0, 255, (4, 5, 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
        noisy = np.asarray(image, dtype=np.int16) + rng.integers(-20, 20, (height, width, 3))
        Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(folder / f"img{i}.png")
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    out = {}
    for name, (overrides, size) in CASES.items():
        folder = root / name
        folder.mkdir()
        count = 5 if size[0] < 100 else 3  # 224 px models cost more per image
        out[name] = (make_checkpoint(folder / "best.pt", overrides), make_images(folder / "images", size, count))
    return out


def trainer_view(checkpoint, images):
    """The checkpoint's model and the images as the trainer's validation transform makes them."""
    model, config, classes = load_model(checkpoint)
    transform = val_transform(config["data"])
    paths = sorted(images.glob("*.png"))
    return model, torch.stack([transform(read_rgb(p)) for p in paths]), config, classes


@pytest.mark.parametrize("name", list(CASES))
def test_onnx_round_trip_matches_pytorch_for_two_batch_sizes(checkpoints, name, capsys):
    checkpoint, images = checkpoints[name]
    assert export([f"checkpoint={checkpoint}", f"image={images}"]) == 0
    onnx_path = checkpoint.with_name("best.onnx")
    line = capsys.readouterr().out.strip()
    assert "checked with onnxruntime" in line and "max |diff|" in line
    model, x, config, classes = trainer_view(checkpoint, images)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for batch in (1, len(x)):
        got = session.run(None, {"images": x[:batch].numpy()})[0]
        with torch.no_grad():
            expected = model(x[:batch]).numpy()
        assert got.shape == (batch, 10)
        assert np.abs(got - expected).max() <= 1e-4
    meta = json.loads(onnx_path.with_name("best.onnx.json").read_text())
    mean, std = mean_std(config["data"])
    size = config["data"]["img_size"]
    assert meta["preprocessing"]["mean"] == pytest.approx(list(mean)) and meta["preprocessing"]["std"] == pytest.approx(
        list(std)
    )
    assert meta["preprocessing"]["img_size"] == size and meta["input"]["shape"] == ["batch", 3, size, size]
    assert meta["classes"] == sorted(classes, key=classes.get) and meta["batch"] == "dynamic"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["vit_tiny", "t2t_vit_7"])
def test_full_depth_models_export(tmp_path, model):
    checkpoint = make_checkpoint(tmp_path / "best.pt", [f"model={model}", "data=imagefolder"])
    images = make_images(tmp_path / "images", (300, 260))
    assert export([f"checkpoint={checkpoint}", f"image={images}"]) == 0
    model, x, _, _ = trainer_view(checkpoint, images)
    session = ort.InferenceSession(str(tmp_path / "best.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        assert np.abs(session.run(None, {"images": x.numpy()})[0] - model(x).numpy()).max() <= 1e-4


def test_runtime_preprocessing_is_the_trainers_validation_transform(checkpoints):
    for name in ("vit_tiny_cifar", "vit_tiny_224"):
        checkpoint, images = checkpoints[name]
        _, x, config, _ = trainer_view(checkpoint, images)
        pre = from_data_config(config["data"]).to_dict()
        ours = np.stack([preprocess(read_rgb(p), pre) for p in sorted(images.glob("*.png"))])
        assert ours.shape == tuple(x.shape)
        assert np.abs(ours - x.numpy()).max() <= 1e-6


def test_fixed_batch_torchscript_and_exported_program(checkpoints, tmp_path, capfd):
    checkpoint, images = checkpoints["vit_tiny_cifar"]
    model, x, _, _ = trainer_view(checkpoint, images)
    with torch.no_grad():
        expected = model(x[:4])
    fixed = tmp_path / "fixed.onnx"
    assert export([f"checkpoint={checkpoint}", f"image={images}", f"output={fixed}", "batch=4"]) == 0
    session = ort.InferenceSession(str(fixed), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == [4, 3, 32, 32]
    assert np.abs(session.run(None, {"images": x[:4].numpy()})[0] - expected.numpy()).max() <= 1e-4
    assert json.loads((tmp_path / "fixed.onnx.json").read_text())["batch"] == 4

    ts, ep = tmp_path / "m.torchscript.pt", tmp_path / "m.pt2"
    assert export([f"checkpoint={checkpoint}", "format=torchscript", f"output={ts}"]) == 0
    capfd.readouterr()
    assert export([f"checkpoint={checkpoint}", "format=exported-program", f"output={ep}"]) == 0
    assert "ending in .pt2" not in capfd.readouterr().err  # torch's log line: its temporary file ends in .pt2 too
    scripted, program = torch.jit.load(str(ts)), torch.export.load(str(ep)).module()
    with torch.no_grad():
        for batch in (1, 4):
            torch.testing.assert_close(scripted(x[:batch]), expected[:batch], atol=1e-5, rtol=0)
            torch.testing.assert_close(program(x[:batch]), expected[:batch], atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_attention_backends_and_capture_do_not_break_export(tmp_path, backend):
    overrides = ["model=vit_tiny", "data=cifar10", SHALLOW, f"model.attn_backend={backend}"]
    checkpoint = make_checkpoint(tmp_path / "best.pt", overrides)
    model, config, _ = load_model(checkpoint)
    x = torch.randn(3, 3, 32, 32)
    with capture_attention(model) as maps, torch.no_grad():  # hooks on, then off again before the export
        model(x)
    assert len(maps) == 2
    assert export([f"checkpoint={checkpoint}"]) == 0  # no image=: checked on generated images
    session = ort.InferenceSession(str(tmp_path / "best.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        assert np.abs(session.run(None, {"images": x.numpy()})[0] - model(x).numpy()).max() <= 1e-4


def test_rotary_positions_export(tmp_path):
    # Eager rotary attention turns q and k by complex multiplies (vit/models/rope.py), which ONNX has no type for:
    # the export traces the real form, and the file computes what the eager model does.
    overrides = ["model=vit_tiny", "data=cifar10", SHALLOW, "model.pos_embed=rope_mixed", "model.qk_norm=true"]
    checkpoint = make_checkpoint(tmp_path / "best.pt", overrides)
    model, _, _ = load_model(checkpoint)
    assert export([f"checkpoint={checkpoint}"]) == 0
    session = ort.InferenceSession(str(tmp_path / "best.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert np.abs(session.run(None, {"images": x.numpy()})[0] - model(x).numpy()).max() <= 1e-4


def test_predict_with_the_onnx_file_gives_the_checkpoints_top1(checkpoints, tmp_path):
    checkpoint, images = checkpoints["vit_tiny_224"]
    onnx_path = tmp_path / "model.onnx"
    assert export([f"checkpoint={checkpoint}", f"image={images}", f"output={onnx_path}"]) == 0

    tops = {}
    for which, source in (("ckpt", checkpoint), ("onnx", onnx_path)):
        out = tmp_path / f"{which}.json"
        assert run_script(predict_script.main, [f"checkpoint={source}", f"image={images}", f"json={out}"]) == 0
        tops[which] = [(r["image"], [p["class"] for p in r["top"]]) for r in json.loads(out.read_text())]
    assert tops["onnx"] == tops["ckpt"] and len(tops["onnx"]) == 3
    # The classifier alone (no model code), on a list of files, agrees with the PyTorch probabilities.
    model, x, _, _ = trainer_view(checkpoint, images)
    with torch.no_grad():
        expected = model(x).softmax(-1).numpy()
    got = OnnxClassifier(onnx_path).predict_proba(sorted(images.glob("*.png")))
    assert np.abs(got - expected).max() <= 1e-5
    # a file of square images takes no seq_len (a NaFlex file is exported with one)
    argv = [f"checkpoint={onnx_path}", f"image={images}", "seq_len=196"]
    assert run_script(predict_script.main, argv) == 2


def test_a_file_that_does_not_match_pytorch_is_refused_and_not_kept(checkpoints, tmp_path, monkeypatch, capsys):
    checkpoint, images = checkpoints["vit_tiny_cifar"]
    import vit.deploy.export as export_module

    real = export_module.run_exported
    monkeypatch.setattr(export_module, "run_exported", lambda *args: real(*args) + 1e-3)
    out = tmp_path / "bad.onnx"
    assert export([f"checkpoint={checkpoint}", f"output={out}"]) == 1
    assert "differ from PyTorch's by up to 0.001" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _one_error_line(capsys):
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_unknown_format(checkpoints, capsys):
    assert export([f"checkpoint={checkpoints['vit_tiny_cifar'][0]}", "format=tflite"]) == 2
    assert "format=tflite is not a known format; choose from onnx, torchscript, exported-program" in _one_error_line(
        capsys
    )


def test_a_foreign_checkpoint_without_a_model_name(tmp_path, capsys):
    import timm

    path = tmp_path / "timm.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", pretrained=False).state_dict(), path)
    assert export([f"checkpoint={path}"]) == 2
    line = _one_error_line(capsys)
    assert f"'{path}' is not a checkpoint of this trainer" in line and "model=<name> model.pretrained=" in line


def test_an_export_path_under_a_file(checkpoints, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert export([f"checkpoint={checkpoints['vit_tiny_cifar'][0]}", f"output={blocker / 'm.onnx'}"]) == 2
    assert f"cannot write the export to '{blocker / 'm.onnx'}'" in _one_error_line(capsys)


def test_an_unwritable_export_folder(checkpoints, tmp_path, monkeypatch, capsys):
    """Root ignores permissions, so the OS's refusal is raised by hand."""

    def refused(*args, **kwargs):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr("vit.deploy.export.tempfile.TemporaryFile", refused)
    out = tmp_path / "locked" / "m.onnx"
    assert export([f"checkpoint={checkpoints['vit_tiny_cifar'][0]}", f"output={out}"]) == 2
    assert _one_error_line(capsys).endswith(f"cannot write the export to '{out}': Permission denied")


@pytest.mark.parametrize("missing", ["onnx", "onnxruntime"])
def test_the_export_extra_missing(checkpoints, monkeypatch, capsys, missing):
    monkeypatch.setitem(sys.modules, missing, None)  # `import onnx` now raises ImportError
    assert export([f"checkpoint={checkpoints['vit_tiny_cifar'][0]}"]) == 2
    line = _one_error_line(capsys)
    assert f"format=onnx needs {missing}" in line and "pip install -e '.[export]'" in line


def test_help_prints_the_usage(capsys):
    assert export(["--help"]) == 0
    assert "format=onnx|torchscript|exported-program" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("weights", "fmt", "expected"),
    [
        ("run/checkpoints/best.pt", "onnx", "run/checkpoints/best.onnx"),
        ("81.5_T2T_ViT_7.pth.tar", "torchscript", "81.5_T2T_ViT_7.torchscript.pt"),
        ("vit.safetensors", "exported-program", "vit.pt2"),
    ],
)
def test_the_default_output_sits_beside_the_weights(weights, fmt, expected):
    from pathlib import Path

    from vit.deploy.export import default_output

    assert default_output(weights, fmt) == Path(expected)


def test_predict_with_an_onnx_file_needs_the_export_extra(checkpoints, monkeypatch, capsys):

    checkpoint, images = checkpoints["vit_tiny_cifar"]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert run_script(predict_script.main, [f"checkpoint={checkpoint.with_name('x.onnx')}", f"image={images}"]) == 2
    line = _one_error_line(capsys)
    assert "x.onnx needs onnxruntime" in line and "pip install -e '.[export]'" in line

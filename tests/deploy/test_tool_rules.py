"""What the tools after training (vit-eval, vit-predict, vit-export) share and what they say: one rule for which
weights of a checkpoint they read (EMA or raw), a refusal to name classes with a classifier that was never trained
(and `features=true` for the pooled image features instead), advice that fits the tool, and output that holds the
answer only."""

import importlib
import json
import sys

import pytest
import timm
import tomllib
import torch
from trainer_utils import REPO, make_tree, saved_timm_model

from vit.cli import evaluate as evaluate_tool
from vit.deploy.loaded_model import EMA_RULE

# A 3-class, 2-block ViT-Ti/16 of timm (224 px): small enough to build and run in a moment on a CPU.
TIMM_TINY = "vit_tiny_patch16_224"
FOREIGN = ["model=vit_tiny", "model.depth=2"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """root/{train,val}/{cat,dog,frog}/*: 4 training and 2 validation noise images a class."""
    return make_tree(tmp_path_factory.mktemp("tree"), per_class=4, size=24)


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory):
    """A 3-class timm ViT-Ti/16 of 2 blocks saved as a plain state dict (its head included)."""
    return saved_timm_model(tmp_path_factory.mktemp("timm"), TIMM_TINY, num_classes=3)[0]


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err, "nothing on stderr"
    return err[0]


# --- advice that fits the tool --------------------------------------------------------------------------------


def test_bad_images_in_an_evaluation_are_not_answered_with_advice_to_train(tree, timm_file, tmp_path, capsys):
    """vit-eval on a folder with an unreadable image stops with exit 2 and names data.on_bad_image=skip, in words
    that fit an evaluation (the same message serves training: it must not say "train on the rest")."""
    import shutil

    root = tmp_path / "tree"
    shutil.copytree(tree, root)
    (root / "val" / "dog" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    argv = [*FOREIGN, f"model.pretrained={timm_file}", "data=imagefolder", f"data.root={root}", "device=cpu"]
    assert evaluate_tool.cli([*argv, "data.num_workers=0", "amp=none"]) == 2
    err = capsys.readouterr().err
    assert "broken.jpg" in err and "data.on_bad_image=skip" in err
    assert "train on the rest" not in err, err
    skipped = evaluate_tool.cli([*argv, "data.num_workers=0", "amp=none", "data.on_bad_image=skip"])
    assert skipped == 0
    assert json.loads(capsys.readouterr().out)["count"] == 6  # 2 images a class, the broken file left out


# --- output that holds the answer -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """A checkpoint as the trainer writes it (generated data, random 2-block weights) whose EMA weights differ from
    its raw ones, and a few 32 px images to predict on."""
    from omegaconf import OmegaConf
    from PIL import Image
    from trainer_utils import compose_config, noise_image

    from vit.tasks.build import build_model_from_config

    cfg = compose_config(["data=synthetic", "model.embed_dim=32", "model.depth=2", "model.num_heads=2"])
    cfg.data.synthetic.num_val = 24
    cfg.trainer.ema = True
    torch.manual_seed(4)
    model = build_model_from_config(cfg.model, num_classes=10)
    raw = model.state_dict()
    ema = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v for k, v in raw.items()}
    folder = tmp_path_factory.mktemp("ours")
    classes = {f"class_{i}": i for i in range(10)}
    config = OmegaConf.to_container(cfg, resolve=True)
    torch.save({"model": raw, "ema": ema, "config": config, "class_to_idx": classes}, folder / "best.pt")
    torch.save({"model": raw, "ema": None, "config": config, "class_to_idx": classes}, folder / "no_ema.pt")
    images = folder / "images"
    images.mkdir()
    for i in range(3):
        noise_image("RGB", 32, seed=i).save(images / f"{i}.jpg")
    assert Image.open(images / "0.jpg").size == (32, 32)
    return folder


def predict(argv, capsys) -> tuple[int, str, str]:
    from vit.cli import predict as predict_tool
    from vit.cli.args import run_script

    code = run_script(predict_tool.main, argv, usage=predict_tool.__doc__)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_predict_prints_the_classes_only_and_names_a_precision_it_could_not_run(ours, monkeypatch, capsys):
    """The precision a prediction runs in is no news on every call: stdout holds one line an image and stderr
    stays empty. Only an amp= given on the command that cannot run here is said, as a warning."""
    argv = [f"checkpoint={ours / 'best.pt'}", f"image={ours / 'images'}"]
    code, out, err = predict(argv, capsys)
    assert code == 0 and len(out.splitlines()) == 3
    assert "precision" not in err, err
    code, out, err = predict([*argv, "amp=none"], capsys)
    assert code == 0 and "precision" not in err, err
    monkeypatch.setattr("vit.runtime.device.cpu_has_native_fp16", lambda: False)
    code, out, err = predict([*argv, "amp=fp16"], capsys)
    assert code == 0 and len(out.splitlines()) == 3
    (line,) = [line for line in err.splitlines() if "precision" in line]
    assert line.startswith("warning: precision: ") and "amp=fp16 but this CPU has no native fp16" in line, line


# --- one rule for which weights of a checkpoint a tool reads -----------------------------------------------------


def model_of(checkpoint, key: str):
    """The checkpoint's model with its `key` weights ("model": raw, "ema"), fp32, eval mode."""
    from omegaconf import OmegaConf

    from vit.tasks.build import build_model_from_config

    state = torch.load(checkpoint, weights_only=True)
    model = build_model_from_config(OmegaConf.create(state["config"]["model"]), num_classes=10)
    model.load_state_dict(state[key])
    return model.eval()


def test_evaluate_predict_and_export_read_the_same_weights_by_default(ours, tmp_path, capsys):
    """On a checkpoint holding EMA weights, vit-eval, vit-predict and vit-export all read the EMA ones unless
    ema=false (as model.pretrained=<checkpoint> starts a run), and each names them: the accuracy vit-eval reports is
    that of the model vit-export writes and vit-predict runs."""
    from vit.cli import export as export_tool

    checkpoint = ours / "best.pt"
    common = ["device=cpu", "data.num_workers=0", "amp=none"]
    evaluations = {}
    for ema in (None, "true", "false"):
        argv = [f"checkpoint={checkpoint}", *common] + ([f"ema={ema}"] if ema else [])
        assert evaluate_tool.cli(argv) == 0
        captured = capsys.readouterr()
        evaluations[ema] = json.loads(captured.out)
        assert f"weights: {evaluations[ema]['weights']}" in captured.err  # the summary line names them
    assert evaluations[None]["weights"] == evaluations["true"]["weights"] == "ema"
    assert evaluations["false"]["weights"] == "raw"
    assert evaluations[None]["loss"] == evaluations["true"]["loss"] != evaluations["false"]["loss"]

    images = ours / "images"
    predictions = {}
    for ema in (None, "true", "false"):
        argv = [f"checkpoint={checkpoint}", f"image={images}", "json=-", "top=10", "amp=none"]
        code, out, err = predict(argv + ([f"ema={ema}"] if ema else []), capsys)
        assert code == 0, err
        records = json.loads(out)
        predictions[ema] = [sorted((p["index"], p["prob"]) for p in r["top"]) for r in records]
        assert {r["weights"] for r in records} == {f"{'raw' if ema == 'false' else 'ema'} ({checkpoint})"}
        assert err.strip() == f"weights: {records[0]['weights']}"
    assert predictions[None] == predictions["true"] != predictions["false"]

    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for ema, key in ((None, "ema"), ("false", "model")):
        output = tmp_path / f"{ema}.torchscript.pt"
        argv = [f"checkpoint={checkpoint}", "format=torchscript", f"output={output}", f"image={images}"]
        assert export_tool.main(argv + ([f"ema={ema}"] if ema else [])) == 0
        assert f"weights: {'raw' if ema else 'ema'})" in capsys.readouterr().out
        side = json.loads(output.with_name(output.name + ".json").read_text())
        assert side["weights"] == ("raw" if ema else "ema")
        with torch.no_grad():
            torch.testing.assert_close(torch.jit.load(str(output))(x), model_of(checkpoint, key)(x))


@pytest.mark.parametrize(
    ("tool", "args", "needle"),
    [
        ("evaluate", ["checkpoint={ours}/no_ema.pt", "ema=true"], "has no EMA weights"),
        ("predict", ["checkpoint={ours}/no_ema.pt", "ema=true", "image={ours}/images"], "has no EMA weights"),
        ("export", ["checkpoint={ours}/no_ema.pt", "ema=true", "output={tmp}/x.pt2"], "has no EMA weights"),
        ("evaluate", ["checkpoint={ours}/best.pt", "ema=maybe"], "ema='maybe' must be one of auto, true, false"),
        ("predict", ["checkpoint={ours}/best.pt", "ema=maybe", "image={ours}/images"], "ema='maybe' must be one of"),
        ("export", ["checkpoint={ours}/best.pt", "ema=maybe", "output={tmp}/x.pt2"], "ema='maybe' must be one of"),
        ("evaluate", FOREIGN + ["model.pretrained={timm}", "ema=true"], "holds no EMA weights (no state_dict_ema"),
    ],
)
def test_ema_true_without_ema_weights_and_a_bad_ema_value_are_one_line(
    ours, timm_file, tmp_path, capsys, tool, args, needle
):
    from vit.cli import export as export_tool
    from vit.cli.args import run_script

    fill = {"ours": ours, "tmp": tmp_path, "timm": timm_file}
    argv = [a.format(**fill) for a in args]
    if tool == "evaluate":
        code = evaluate_tool.cli([*argv, "device=cpu", "data.num_workers=0"])
        err = capsys.readouterr().err
    elif tool == "predict":
        code, _, err = predict(argv, capsys)
    else:
        code = run_script(export_tool.main, argv)
        err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], lines


@pytest.mark.parametrize("command", ["vit-eval", "vit-predict", "vit-export", "vit-average"])
def test_every_tool_states_the_one_ema_rule_in_its_help(command, monkeypatch, capsys):
    commands = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = commands[command].partition(":")
    monkeypatch.setattr(sys, "argv", [command, "--help"])
    with pytest.raises(SystemExit):
        getattr(importlib.import_module(module), function)()
    assert EMA_RULE in " ".join(capsys.readouterr().out.split()), command


# --- no classes from a classifier the weights did not train ------------------------------------------------------


def encoder_only(name: str, path, **kwargs):
    """timm's `name` (random weights) saved as a safetensors state dict without its classifier, as an encoder
    released for pretraining (EVA-02's mim_in22k, MAE, DINO) is; and the timm model."""
    from safetensors.torch import save_file

    torch.manual_seed(2)
    model = timm.create_model(name, pretrained=False, num_classes=0, **kwargs).eval()
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert not any(k.startswith("head.") for k in state)
    save_file(state, str(path))
    return model


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("encoder") / "vit_tiny_encoder.safetensors"
    return path, encoder_only(TIMM_TINY, path, depth=2)


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (FOREIGN + ["model.pretrained={encoder}"], "the weights hold no classifier (an encoder only)"),
        (
            [
                "model=vit_small",
                "model.pretrained=timm:eva02_tiny_patch14_224.mim_in22k",
                "model.pretrained_file={eva}",
            ],
            "the weights hold no classifier (an encoder only)",
        ),
        (FOREIGN + ["model.pretrained={timm}", "model.num_classes=5"], "the weights' classifier has 3 classes and"),
    ],
)
def test_predict_refuses_classes_from_an_untrained_classifier(
    encoder_file, timm_file, tree, tmp_path, capsys, caplog, args, reason
):
    """Weights without a trained classifier for the model's head (an encoder, a head of another class count) leave
    it freshly initialised: its "classes" would be random, so vit-predict refuses in one line naming why and what
    to do, exit code 2, before reading any image."""
    eva = tmp_path / "eva02_tiny_encoder.safetensors"
    if any("{eva}" in a for a in args):
        encoder_only("eva02_tiny_patch14_224", eva)
    argv = [a.format(encoder=encoder_file[0], timm=timm_file, eva=eva) for a in args]
    code, out, err = predict([*argv, f"image={tree / 'val' / 'cat'}", "amp=none"], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert reason in lines[0] and "freshly initialised" in lines[0] and "features=true" in lines[0], lines[0]


def test_features_true_prints_the_pooled_features_timm_computes(encoder_file, tree, tmp_path, capsys):
    """features=true: each image's pre-logits embedding (the pooled, normed token the head would read), what timm's
    own model gives (forward_head(pre_logits=True)) on timm's transform of the image, as lines and as JSON."""
    from timm.data import create_transform, resolve_data_config

    from vit.data.images import read_rgb

    path, model = encoder_file
    images = tree / "val" / "cat"
    argv = [*FOREIGN, f"model.pretrained={path}", f"preprocess=timm:{TIMM_TINY}", f"image={images}", "amp=none"]
    code, out, err = predict([*argv, "features=true", "json=-"], capsys)
    assert code == 0, err
    records = json.loads(out)
    transform = create_transform(**resolve_data_config({}, model=model))
    for record in records:
        x = transform(read_rgb(record["image"])).unsqueeze(0)
        with torch.no_grad():
            expected = model.forward_head(model.forward_features(x), pre_logits=True)[0]
        assert len(record["features"]) == 192 == expected.numel()
        assert record["features"] == pytest.approx(expected.tolist(), abs=1e-4)
    code, out, err = predict([*argv, "features=true"], capsys)
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(records) == 2
    assert [float(v) for v in lines[0].split(": ", 1)[1].split()] == pytest.approx(records[0]["features"], abs=1e-4)


def test_features_true_on_our_checkpoint_and_the_settings_it_does_not_take(ours, tmp_path, capsys):
    images = ours / "images"
    code, out, err = predict([f"checkpoint={ours / 'best.pt'}", f"image={images}", "features=true", "json=-"], capsys)
    assert code == 0, err
    assert [len(r["features"]) for r in json.loads(out)] == [32, 32, 32]  # the model's width
    for extra, needle in (
        (["top=3"], "top=3 ranks classes, and features=true prints features"),
        ([f"checkpoint={tmp_path / 'best.onnx'}"], "computes the logits only"),
        (["features=maybe"], "features='maybe' must be true or false"),
    ):
        argv = [f"checkpoint={ours / 'best.pt'}", f"image={images}", "features=true", *extra]
        code, out, err = predict(argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and needle in lines[0], lines


def test_evaluate_and_export_say_when_the_classifier_was_never_trained(encoder_file, tree, tmp_path, capsys):
    """vit-eval's figures of a freshly initialised head are a random classifier's, and vit-export's file names noise
    unless it is kept for its features: both still run (an encoder is worth exporting), each with one warning."""
    from vit.cli import export as export_tool

    path, _ = encoder_file
    argv = [*FOREIGN, "model.num_classes=3", f"model.pretrained={path}", f"preprocess=timm:{TIMM_TINY}"]
    assert evaluate_tool.main([*argv, f"data.root={tree}", "device=cpu", "amp=none"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].endswith("this evaluates a random classifier"), warnings
    output = tmp_path / "encoder.pt2"
    assert export_tool.main([*argv, "format=exported-program", f"output={output}", f"image={tree / 'val'}"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "the exported file's classes are random" in warnings[0], warnings


def test_predict_at_the_images_own_shapes_packs_them_whole(ours, tmp_path, capsys):
    """seq_len=<n>: each image whole, its aspect ratio kept, at most n patches, run as one NaFlex batch (padding
    masked): a square 32 px image at 64 tokens is the 32 px image the default path sees, so the same classes and
    probabilities; a wide one (5 x 10 patches, padded to 64 in the batch) answers as it does alone."""
    from PIL import Image
    from trainer_utils import noise_image

    from vit.data.images import read_rgb
    from vit.deploy.preprocessing import Preprocessing

    images = tmp_path / "images"
    images.mkdir()
    noise_image("RGB", 32, seed=0).save(images / "a_square.png")
    noise_image("RGB", 64, seed=1).resize((64, 32)).save(images / "b_wide.png")
    base = [f"checkpoint={ours / 'best.pt'}", "amp=none", "ema=false", "json=-", "top=10"]
    code, out, err = predict([*base, f"image={images}", "seq_len=64"], capsys)
    assert code == 0, err
    square, wide = json.loads(out)
    code, out, err = predict([*base, f"image={images / 'a_square.png'}"], capsys)
    assert code == 0, err
    plain = {p["class"]: p["prob"] for p in json.loads(out)[0]["top"]}
    assert {p["class"]: p["prob"] for p in square["top"]} == pytest.approx(plain, abs=1e-4)
    code, out, err = predict([*base, f"image={images / 'b_wide.png'}", "seq_len=64"], capsys)
    assert code == 0, err
    alone = {p["class"]: p["prob"] for p in json.loads(out)[0]["top"]}
    assert {p["class"]: p["prob"] for p in wide["top"]} == pytest.approx(alone, abs=1e-4)
    pre = Preprocessing(32, 32, "bilinear", (0.5,) * 3, (0.25,) * 3, origin="test")
    x = pre.naflex_transform(64, 4)(read_rgb(images / "b_wide.png"))
    assert tuple(x.shape) == (3, 20, 40) and Image.open(images / "b_wide.png").size == (64, 32)  # 5 x 10 patches
    for extra, needle in ((["seq_len=0"], "seq_len='0' must be an integer >= 1"),):
        code, out, err = predict([*base, f"image={images}", "seq_len=64", *extra], capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and needle in lines[0], lines


def test_evaluate_at_the_images_own_shapes_matches_the_square_path_at_their_size(ours, capsys):
    """vit-eval seq_len=<n>: the split's images whole as NaFlex batches. The synthetic split's 32 px squares at 64
    tokens are the 32 px tensors of the default path: the same top-1 and loss; at 16 tokens (16 px) another figure."""
    base = [f"checkpoint={ours / 'best.pt'}", "amp=none", "ema=false", "device=cpu", "data.num_workers=0"]
    results = {}
    for extra in ([], ["seq_len=64"], ["seq_len=16"]):
        assert evaluate_tool.main([*base, *extra]) == 0
        results[tuple(extra)] = json.loads(capsys.readouterr().out)
    square, at_64, at_16 = results.values()
    assert at_64["seq_len"] == 64 and square["seq_len"] is None and at_64["count"] == square["count"] == 24
    assert at_64["top1"] == square["top1"] and at_64["loss"] == pytest.approx(square["loss"], abs=1e-5)
    assert at_16["loss"] != pytest.approx(square["loss"], abs=1e-5)
    assert evaluate_tool.cli([*base, "seq_len=64", "flip=true"]) == 2
    assert "leave out flip and shift" in one_error_line(capsys)


def test_export_at_the_images_own_shapes_takes_naflex_batches(ours, tmp_path, capsys):
    """vit-export seq_len=<n>: a file with three inputs (patches, their coordinates, the valid mask), checked on
    the images at their own shapes; run on a batch of shapes and lengths it was not traced on (wide, tall and
    square, padded to n), onnxruntime and TorchScript give the PyTorch model's logits. What it cannot write is
    refused in one line, before the weights are read."""
    import onnxruntime as ort
    from trainer_utils import noise_image

    from vit.cli import export as export_tool
    from vit.cli.args import run_script
    from vit.naflex import pack

    images = tmp_path / "images"
    images.mkdir()
    for i, size in enumerate([(32, 32), (64, 32), (24, 48)]):
        noise_image("RGB", 64, seed=i).resize(size).save(images / f"{i}.png")
    checkpoint = ours / "best.pt"
    base = [f"checkpoint={checkpoint}", "ema=false", f"image={images}", "seq_len=64"]
    onnx_file, script_file = tmp_path / "naflex.onnx", tmp_path / "naflex.torchscript.pt"
    assert export_tool.main([*base, f"output={onnx_file}"]) == 0
    assert "NaFlex batches of 64 tokens" in capsys.readouterr().out
    assert export_tool.main([*base, "format=torchscript", f"output={script_file}", "batch=3"]) == 0
    capsys.readouterr()
    side = json.loads(onnx_file.with_name(onnx_file.name + ".json").read_text())
    assert side["input"]["names"] == ["patches", "patch_coord", "patch_valid"]
    assert side["input"]["shapes"][0] == ["batch", 64, 48] and side["input"]["patch_size"] == 4
    assert side["preprocessing"]["seq_len"] == 64

    generator = torch.Generator().manual_seed(5)
    shapes = [(12, 20), (28, 8), (32, 32)]  # 3 x 5, 7 x 2 and 8 x 8 patches: grids the trace never saw
    batch = pack([torch.randn(3, h, w, generator=generator) for h, w in shapes], (4, 4), seq_len=64)
    with torch.no_grad():
        expected = model_of(checkpoint, "model")(batch).numpy()
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    got = session.run(None, {key: value.numpy() for key, value in batch.items()})[0]
    assert abs(got - expected).max() <= 1e-4
    with torch.no_grad():
        scripted = torch.jit.load(str(script_file))(batch["patches"], batch["patch_coord"], batch["patch_valid"])
    assert abs(scripted.numpy() - expected).max() <= 1e-4

    # vit-predict reads the file (its seq_len by default) as it reads the checkpoint at seq_len=64
    answers = []
    for argv in (
        [f"checkpoint={checkpoint}", "ema=false", "amp=none", "seq_len=64"],
        [f"checkpoint={onnx_file}"],
    ):
        code, out, err = predict([*argv, f"image={images}", "json=-", "top=10"], capsys)
        assert code == 0, err
        answers.append([{p["class"]: p["prob"] for p in r["top"]} for r in json.loads(out)])
    from_checkpoint, from_file = answers
    assert len(from_file) == 3
    for got_probs, expected_probs in zip(from_file, from_checkpoint, strict=True):
        assert got_probs == pytest.approx(expected_probs, abs=1e-4)
    code, out, err = predict([f"checkpoint={onnx_file}", f"image={images}", "seq_len=16"], capsys)
    assert code == 2 and "takes NaFlex batches of 64 tokens (as exported)" in err

    for extra, needle in (
        (["format=exported-program", f"output={tmp_path / 'x.pt2'}"], "it needs format=onnx|torchscript"),
        (["quantize=int8", f"output={tmp_path / 'x.onnx'}"], "seq_len= with quantize=int8"),
        (["seq_len=x", f"output={tmp_path / 'x.onnx'}"], "seq_len='x' must be an integer >= 1"),
    ):
        assert run_script(export_tool.main, [*base, *extra], usage=export_tool.__doc__) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], lines


def test_the_runtimes_naflex_sizes_are_the_trainers():
    """The torch-free runtime's `naflex_size` (vit/deploy/runtime.py) gives every image the size the PyTorch tools
    and the trainer give it (`grid_for`, timm's `get_image_size_for_seq`), from a 1 px image to a long strip."""
    from vit.data.loading.naflex_loader import grid_for
    from vit.deploy.runtime import naflex_size

    for shape in [(1, 1), (7, 300), (32, 32), (480, 640), (1000, 37), (224, 224)]:
        for patch in (4, 14, 16):
            for seq_len in (1, 16, 64, 256, 577):
                assert naflex_size(shape, patch, seq_len) == grid_for(shape, patch, seq_len), (shape, patch, seq_len)

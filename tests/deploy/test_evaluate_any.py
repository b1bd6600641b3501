"""vit-eval on weights that are not a checkpoint of ours: a timm-layout file gives the top-1 and loss that
timm's own model gives on the same images with timm's preprocessing (computed here with timm), an official-layout
T2T-ViT file those of our model loaded directly, 1000-class weights on a folder of a few synsets compare only those
classes; and on our checkpoints the numbers of the trainer's own evaluation."""

import functools
import json
import os
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from PIL import Image
from timm.data import ImageNetInfo, create_transform, resolve_data_config
from trainer_utils import (
    FOUNDATION_FAMILIES,
    TINY_MODEL,
    ForkedRun,
    compose_config,
    saved_timm_model,
    trainer_path_evaluation,
)

from vit.cli.evaluate import cli
from vit.data.augment.transforms import val_transform
from vit.data.images import read_rgb
from vit.models import create_model
from vit.models.registry import official_qk_scale
from vit.tasks.build import build_model_from_config

TIMM_NAME = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"  # bicubic, crop_pct 0.9, mean = std = 0.5
ARCHIVE = os.environ.get("VIT_CIFAR10_ARCHIVE")


def make_folder(root, classes, per_class=3, size=(90, 70), seed=0, train_per_class=1):
    """root/{train,val}/<class>/*.png: smooth colour blobs plus noise, one colour scheme per class."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train_per_class), ("val", per_class)):
        for c, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                coarse = rng.integers(0, 255, (3, 4, 3)).astype(np.float64)
                coarse[..., c % 3] = 255 - 40 * (c // 3)
                image = Image.fromarray(coarse.astype(np.uint8)).resize(size, Image.Resampling.BICUBIC)
                image.save(folder / f"{i}.png")
    return root


def evaluate(argv, capsys):
    # fp32 unless a test asks otherwise: the references here are computed in fp32 (amp=auto would pick bf16 for a
    # model this wide on a CPU with native bf16).
    amp = [] if any(a.startswith("amp=") for a in argv) else ["amp=none"]
    code = cli([*argv, "device=cpu", "data.num_workers=0", *amp])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out), captured.err.strip()


def val_images(root):
    """(paths, labels) of root/val in ImageFolder order."""
    classes = sorted(p.name for p in (root / "val").iterdir())
    items = [(p, c) for c, name in enumerate(classes) for p in sorted((root / "val" / name).glob("*.png"))]
    return [p for p, _ in items], torch.tensor([c for _, c in items])


def reference(logits, labels):
    """top-1 (%), mean cross-entropy and per-class top-1 of logits against labels, computed here."""
    hits = logits.argmax(-1) == labels
    per_class = [100.0 * hits[labels == c].float().mean().item() for c in range(int(labels.max()) + 1)]
    return 100.0 * hits.float().mean().item(), F.cross_entropy(logits, labels).item(), per_class


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("folder"), ["ant", "bee", "cat", "dog"], per_class=2)


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory):
    """A 4-class, 2-block ViT-Ti/16 of timm saved as a plain state dict, and the timm model itself."""
    return saved_timm_model(tmp_path_factory.mktemp("timm"), TIMM_NAME, num_classes=4)


def test_a_limited_evaluation_is_class_balanced_and_unseen_classes_have_no_accuracy(folder, timm_file, capsys):
    """limit_batches over a split sorted by class (an image folder) takes every class in turn, not the first class's
    images; with fewer images than classes, the classes not evaluated get no entry, not 0%."""
    path, _ = timm_file
    argv = ["model=vit_tiny", "model.depth=2", f"model.pretrained={path}", "data=imagefolder", f"data.root={folder}"]
    argv += [f"preprocess=timm:{TIMM_NAME}", "limit_batches=1"]
    result, _ = evaluate([*argv, "data.batch_size=4"], capsys)
    assert result["count"] == 4 and list(result["per_class_top1"]) == ["ant", "bee", "cat", "dog"]
    result, _ = evaluate([*argv, "data.batch_size=2"], capsys)
    assert result["count"] == 2 and len(result["per_class_top1"]) == 2


def test_a_timm_file_gives_timms_top1_with_timms_preprocessing(folder, timm_file, capsys):
    path, model = timm_file
    paths, labels = val_images(folder)
    transform = create_transform(**resolve_data_config({}, model=model))  # timm's eval transform for those weights
    with torch.no_grad():
        logits = model(torch.stack([transform(Image.open(p).convert("RGB")) for p in paths]))
    top1, loss, per_class = reference(logits, labels)

    argv = ["model=vit_tiny", "model.depth=2", f"model.pretrained={path}", "data=imagefolder", f"data.root={folder}"]
    result, summary = evaluate([*argv, f"preprocess=timm:{TIMM_NAME}"], capsys)
    assert result["top1"] == pytest.approx(top1) and result["loss"] == pytest.approx(loss, abs=1e-5)
    assert list(result["per_class_top1"].values()) == pytest.approx(per_class, abs=0.01)
    assert result["count"] == len(paths) and result["images_per_s"] > 0 and result["split"] == "val"
    pre = result["preprocessing"]
    assert (pre["resize"], pre["interpolation"], pre["mean"]) == (248, "bicubic", [0.5, 0.5, 0.5])
    assert f"timm pretrained config of '{TIMM_NAME}'" in summary and "top-1" in summary
    assert len(summary.splitlines()) == 1

    # The data config's preprocessing (bilinear, 0.875, ImageNet mean/std) is another input: another loss.
    other, _ = evaluate(argv, capsys)
    assert other["preprocessing"]["interpolation"] == "bilinear" and other["loss"] != pytest.approx(loss, abs=1e-5)


def test_the_precision_follows_the_trainers_rule_and_amp(folder, timm_file, monkeypatch, capsys):
    """Without amp=, foreign weights are evaluated as trainer.amp=auto decides for this device and model (bf16 on a
    CPU with native bf16 for a model 192 wide, simulated here); amp= overrides it; the JSON and summary say it."""
    from vit.runtime import device as precision

    path, _ = timm_file
    argv = ["model=vit_tiny", "model.depth=2", f"model.pretrained={path}", "data=imagefolder", f"data.root={folder}"]
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    auto, summary = evaluate([*argv, "amp=auto"], capsys)
    fp32, _ = evaluate(argv, capsys)
    assert (auto["precision"], fp32["precision"]) == ("bf16", "fp32") and "in bf16" in summary
    assert "192 wide" in auto["precision_reason"]
    assert auto["loss"] == pytest.approx(fp32["loss"], abs=0.05) and auto["loss"] != fp32["loss"]
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert evaluate([*argv, "amp=auto"], capsys)[0]["precision"] == "fp32"
    assert cli([*argv, "device=cpu", "amp=fp8"]) == 2
    assert "amp='fp8' must be one of" in capsys.readouterr().err


@pytest.mark.parametrize("name", FOUNDATION_FAMILIES)
def test_a_timm_name_and_its_file_give_timms_numbers_with_timms_preprocessing(name, folder, tmp_path, capsys):
    """`model.pretrained=timm:<name> model.pretrained_file=<file>` (the download stood in for by a file: no network
    here) builds timm's architecture for `<name>` (EVA-02's too: its own names, rotary positions, SwiGLU), loads the
    file and takes timm's eval config of those weights (EVA-02: CLIP's mean and std; SigLIP: 0.5) by default."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=4).eval()
    with torch.no_grad():
        for param in model.parameters():  # off its init: LayerScale, zero-initialised heads
            param.add_(0.02 * torch.randn_like(param))
    path = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    paths, labels = val_images(folder)
    transform = create_transform(**resolve_data_config({}, model=model))
    with torch.no_grad():
        top1, loss, _ = reference(model(torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])), labels)
    argv = [f"model.pretrained=timm:{name}", f"model.pretrained_file={path}", f"data.root={folder}"]
    result, summary = evaluate(argv, capsys)
    assert result["source"] == result["model"] == f"timm:{name}"  # the architecture built, not the default config's
    assert summary.startswith(f"timm:{name}") or f" timm:{name}" in summary.splitlines()[-1], summary
    assert result["top1"] == pytest.approx(top1) and result["loss"] == pytest.approx(loss, abs=1e-5)
    assert f"preprocessing: timm pretrained config of '{name}'" in summary


def test_a_weights_file_is_for_a_timm_name_only(folder, timm_file, capsys):
    path, _ = timm_file
    code = cli([f"model.pretrained={path}", "model=vit_tiny", f"model.pretrained_file={path}", f"data.root={folder}"])
    assert code == 2 and "a weights file is given for a timm:<name> source" in capsys.readouterr().err


def test_1000_class_weights_on_a_folder_of_some_synsets(tmp_path, capsys):
    synsets = ImageNetInfo().label_names()
    chosen = [synsets[i] for i in (7, 300, 951)]  # folders sort in this order too
    root = make_folder(tmp_path / "in", chosen, per_class=2)
    torch.manual_seed(2)
    model = timm.create_model(TIMM_NAME, pretrained=False, depth=2).eval()
    path = tmp_path / "in1k.safetensors"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    paths, labels = val_images(root)
    transform = create_transform(**resolve_data_config({}, model=model))
    with torch.no_grad():
        logits = model(torch.stack([transform(Image.open(p).convert("RGB")) for p in paths]))[:, [7, 300, 951]]
    top1, loss, _ = reference(logits, labels)

    argv = ["model=vit_tiny", "model.depth=2", f"model.pretrained={path}", f"data.root={root}"]
    result, _ = evaluate([*argv, f"preprocess=timm:{TIMM_NAME}"], capsys)
    assert result["classes"]["weights"] == 1000 and result["classes"]["data"] == 3
    assert "ImageNet-1k synsets" in result["classes"]["mapping"]
    assert result["top1"] == pytest.approx(top1) and result["loss"] == pytest.approx(loss, abs=1e-5)


def test_an_official_t2t_file_gives_our_models_numbers(folder, tmp_path, capsys):
    scale = official_qk_scale("t2t_vit_7")
    torch.manual_seed(3)
    ema = create_model("t2t_vit_7", depth=2, num_classes=4, qk_scale=scale).state_dict()
    raw = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in ema.items()}
    path = tmp_path / "81.5_T2T_ViT_7.pth.tar"  # the release's layout: EMA and raw weights side by side
    torch.save({"state_dict_ema": ema, "state_dict": raw, "epoch": 310}, path)

    direct = create_model("t2t_vit_7", depth=2, num_classes=4, qk_scale=scale).eval()
    direct.load_state_dict(ema)
    paths, labels = val_images(folder)
    transform = val_transform(compose_config(["data=imagefolder"]).data)  # the trainer's validation transform
    with torch.no_grad():
        logits = direct(torch.stack([transform(read_rgb(p)) for p in paths]))
    top1, loss, _ = reference(logits, labels)

    argv = ["model=t2t_vit_7", "model.depth=2", f"model.qk_scale={scale}", f"model.pretrained={path}"]
    result, _ = evaluate([*argv, f"data.root={folder}"], capsys)
    assert result["top1"] == pytest.approx(top1) and result["loss"] == pytest.approx(loss, abs=1e-5)
    assert result["preprocessing"]["origin"] == "data config 'imagefolder'"


@pytest.fixture(scope="module")
def our_checkpoint(tmp_path_factory):
    """A checkpoint as the trainer writes it, on generated data (no files), random 2-block weights."""
    cfg = compose_config(["data=synthetic", "model.embed_dim=32", "model.depth=2", "model.num_heads=2"])
    cfg.data.synthetic.num_val = 48
    torch.manual_seed(4)
    model = build_model_from_config(cfg.model, num_classes=10)
    path = tmp_path_factory.mktemp("ours") / "best.pt"
    config = OmegaConf.to_container(cfg, resolve=True)
    classes = {f"class_{i}": i for i in range(10)}
    torch.save({"model": model.state_dict(), "config": config, "class_to_idx": classes, "ema": None}, path)
    return path


def test_our_checkpoint_gives_the_trainers_evaluation(our_checkpoint, tmp_path, capsys):
    expected = trainer_path_evaluation(our_checkpoint)
    out = tmp_path / "eval.json"
    result, summary = evaluate([f"checkpoint={our_checkpoint}", f"json={out}"], capsys)
    assert json.loads(out.read_text()) == result
    for key in ("top1", "top5", "loss", "count", "split"):
        assert result[key] == pytest.approx(expected[key]), key
    assert result["per_class_top1"] == pytest.approx(expected["per_class_top1"])
    flipped = trainer_path_evaluation(our_checkpoint, flip=True)
    result_flip, _ = evaluate([f"checkpoint={our_checkpoint}", "flip=true"], capsys)
    assert result_flip["flip"] and result_flip["loss"] == pytest.approx(flipped["loss"])
    assert result_flip["loss"] != pytest.approx(result["loss"])
    shifted = trainer_path_evaluation(our_checkpoint, flip=True, shift=1)
    result_shift, summary_shift = evaluate([f"checkpoint={our_checkpoint}", "flip=true", "shift=1"], capsys)
    assert result_shift["shift"] == 1 and result_shift["loss"] == pytest.approx(shifted["loss"])
    assert result_shift["loss"] != pytest.approx(result_flip["loss"]) and ", flip, shift 1;" in summary_shift
    # The same file as the weights of a named model: the same numbers.
    named, _ = evaluate(["model=vit_tiny", f"model.pretrained={our_checkpoint}"], capsys)
    assert named["top1"] == pytest.approx(expected["top1"]) and named["loss"] == pytest.approx(expected["loss"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["checkpoint={timm}"], "is not a checkpoint of this trainer (no config inside): name the model"),
        (["model=vit_tiny", "model.depth=2", "model.pretrained={timm}", "data=synthetic"], "give class_map="),
        (["model=vit_huge", "model.pretrained={timm}"], "model=vit_huge is not a known model"),
        (["checkpoint={ours}", "data=mnist"], "data=mnist is not a known data config"),
        (["checkpoint={ours}", "colour=red"], "unknown argument 'colour'"),
        (["checkpoint={ours}", "shift=-1"], "shift='-1' must be an integer >= 0"),
        (["checkpoint={ours}", "class_map={tmp}/none.txt"], "class_map="),
        (["model=vit_tiny", "model.pretrained={tmp}/none.pth"], "model.pretrained={tmp}/none.pth: no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(timm_file, our_checkpoint, tmp_path, capsys, args, needle):
    fill = {"timm": timm_file[0], "ours": our_checkpoint, "tmp": tmp_path}
    assert cli([a.format(**fill) for a in args] + ["device=cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle.format(**fill) in lines[0], lines


def test_help(capsys):
    assert cli(["--help"]) == 0
    assert "model.pretrained=" in capsys.readouterr().out


@pytest.mark.skipif(not ARCHIVE, reason="VIT_CIFAR10_ARCHIVE is not set (CI sets it)")
def test_a_timm_file_on_real_cifar10_images(timm_file, tmp_path_factory, cifar10_cache, capsys):
    """100 real CIFAR-10 test images (class-balanced), upsampled by timm's preprocessing: timm's numbers."""
    from vit.data.sources.registry import build_splits

    torch.manual_seed(5)
    model = timm.create_model(TIMM_NAME, pretrained=False, num_classes=10, depth=2).eval()
    path = tmp_path_factory.mktemp("cifar-timm") / "w.pth"
    torch.save(model.state_dict(), path)
    data = [
        f"data.root={ARCHIVE}",
        f"data.cache_dir={cifar10_cache}",
        "data.limit_val_samples=100",
        "data.scan_images=false",
    ]
    argv = ["model=vit_tiny", "model.depth=2", f"model.pretrained={path}", *data, f"preprocess=timm:{TIMM_NAME}"]
    result, _ = evaluate(argv, capsys)

    cfg = compose_config(["data=imagefolder", *data])
    val = build_splits(cfg.data).val
    transform = create_transform(**resolve_data_config({}, model=model))
    images, labels = zip(*(val[i] for i in range(len(val))), strict=True)
    with torch.no_grad():
        logits = torch.cat([model(torch.stack([transform(im) for im in images[i : i + 50]])) for i in (0, 50)])
    top1, loss, _ = reference(logits, torch.tensor(labels))
    assert result["count"] == 100 and result["split"] == "test"
    assert result["top1"] == pytest.approx(top1) and result["loss"] == pytest.approx(loss, abs=1e-5)


def test_a_limit_in_the_checkpoints_config_is_named_and_not_applied(our_checkpoint, tmp_path, capsys):
    """A run trained with data.limit_val_samples evaluated every epoch on a subset; an evaluation of the dataset
    evaluates all of it, unless this command limits it."""
    state = torch.load(our_checkpoint, weights_only=True)
    state["config"]["data"]["limit_val_samples"] = 20
    limited = tmp_path / "limited.pt"
    torch.save(state, limited)
    result, err = evaluate([f"checkpoint={limited}"], capsys)
    assert result["count"] == 48  # every image of the split
    lines = [line for line in err.splitlines() if "limit_val_samples" in line]
    assert lines == [
        "data.limit_val_samples=20 of the checkpoint's training config is not applied: every image of the split "
        "is evaluated (data.limit_val_samples=<n> on this command limits it)"
    ]
    asked, _ = evaluate([f"checkpoint={limited}", "data.limit_val_samples=20"], capsys)
    assert asked["count"] == 20


TIMM_SCRIPTS = os.environ.get("VIT_TIMM_SCRIPTS")


@pytest.mark.skipif(not TIMM_SCRIPTS, reason="VIT_TIMM_SCRIPTS (a folder holding timm's validate.py) is not set")
def test_timms_validate_script_gives_our_top1_for_a_trained_checkpoint(tmp_path, capsys):
    """An outside check of vit-eval: a checkpoint the trainer wrote, evaluated by timm's own evaluation
    script (unmodified, run from its folder with the installed timm) with the same preprocessing."""
    from vit.train import run

    root = make_folder(tmp_path / "tree", ["ant", "bee", "cat"], per_class=8, size=(32, 32), train_per_class=8)
    data = ["data=imagefolder", f"data.root={root}", "data.img_size=32", "data.patch_size=4", "data.batch_size=8"]
    overrides = [*data, *TINY_MODEL, "data.num_workers=0", "trainer.device=cpu", "trainer.epochs=3"]
    run(compose_config([*overrides, "trainer.attn_maps_every_n_epochs=0"]), output_dir=tmp_path / "run")
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    ours, _ = evaluate([f"checkpoint={checkpoint}"], capsys)
    pre = ours["preprocessing"]
    assert pre["resize"] == pre["img_size"] == 32  # crop_pct 1.0 for timm
    command = [sys.executable, str(Path(TIMM_SCRIPTS) / "validate.py"), str(root), "--split", "val"]
    command += ["--model", "vit_tiny_patch16_224", "--num-classes", "3", "--img-size", "32", "--crop-pct", "1.0"]
    command += ["--model-kwargs", "embed_dim=32", "depth=2", "num_heads=2", "patch_size=4", "img_size=32"]
    command += ["--interpolation", pre["interpolation"], "--mean", *map(str, pre["mean"]), "--std"]
    command += [*map(str, pre["std"]), "--checkpoint", str(checkpoint), "--device", "cpu", "-j", "0", "-b", "8"]
    # `python validate.py <args>` in a forked child whose torch and timm are already loaded (run as a script, the
    # file itself is compiled in memory: nothing is written beside it).
    script = Path(TIMM_SCRIPTS).resolve() / "validate.py"
    main = functools.partial(runpy.run_path, str(script), run_name="__main__")
    done = ForkedRun(main, command[1:], tmp_path, merge=False)
    out, err = done.communicate(timeout=240)
    assert done.returncode == 0, err[-3000:]
    theirs = json.loads(out.split("--result", 1)[1])
    assert ours["count"] == 24 and theirs["top1"] == pytest.approx(ours["top1"], abs=1e-3), (theirs, ours)
    assert theirs["top5"] == pytest.approx(ours["top5"], abs=1e-3)


def test_predict_takes_foreign_weights_and_gives_timms_probabilities(folder, timm_file, capsys):
    """vit-predict with model= and model.pretrained=<file>, preprocessed as timm's config of those weights: the
    probabilities timm's own model gives on timm's own transform of each image."""
    from trainer_utils import load_script

    from vit.cli.args import run_script

    path, model = timm_file
    images = folder / "val" / "cat"
    argv = ["model=vit_tiny", f"model.pretrained={path}", "model.depth=2", f"preprocess=timm:{TIMM_NAME}"]
    assert run_script(load_script("predict").main, [*argv, f"image={images}", "json=-", "top=4", "amp=none"]) == 0
    results = json.loads(capsys.readouterr().out)
    transform = create_transform(**resolve_data_config({}, model=model))  # timm's eval transform for those weights
    for result in results:
        with torch.no_grad():
            expected = model(transform(read_rgb(result["image"])).unsqueeze(0)).softmax(-1)[0]
        got = {int(p["index"]): p["prob"] for p in result["top"]}
        assert got == pytest.approx({i: round(float(expected[i]), 4) for i in range(4)}, abs=1e-4)
    assert run_script(load_script("predict").main, [*argv, "checkpoint=x.pt", f"image={images}"]) == 2
    assert (
        "give checkpoint=<our checkpoint> or model=<name> model.pretrained=<source>, not both"
        in capsys.readouterr().err
    )

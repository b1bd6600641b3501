"""Distillation: the distillation token against timm's distilled DeiT, the loss against a hand computation, the
teacher's input adapter, a run with a teacher (no gradients, student-only checkpoints, exact resume) and the bad
settings (exit 2, one line)."""

import importlib
import importlib.util
import json
import logging
import math

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from timm.data import IMAGENET_DEFAULT_MEAN
from timm.layers import resample_abs_pos_embed
from torch import nn
from torchvision.transforms import functional as TF
from trainer_utils import (
    QUICK_SYNTHETIC,
    TINY_MODEL,
    assert_measurement_record,
    compose_config,
    empty_image_tree,
    load_script,
    run_cli,
)

from vit.errors import ConfigError
from vit.models import create_model
from vit.tasks.build import build_model_from_config
from vit.train import run
from vit.train.config import validate
from vit.train.distill import Distiller, TeacherView, load_teacher
from vit.weights.read import CheckpointError, load_checkpoint, load_pretrained

setup_phase = importlib.import_module("vit.train.setup")  # where a run builds its model and data
CPU = ["trainer.device=cpu", "trainer.attn_maps_every_n_epochs=0", "trainer.ema=false"]


def save_safetensors(state_dict, path):
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(path))
    return path


# --- the distillation token against timm's VisionTransformerDistilled --------------------------------------------


@pytest.fixture(scope="module")
def deit_pair():
    """timm's distilled DeiT-Ti (2 blocks, random weights) and ours with its state dict."""
    torch.manual_seed(0)
    theirs = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, depth=2)
    theirs.set_distilled_training(True)  # timm returns both heads in training mode only with this switch
    ours = create_model("vit_tiny", depth=2, distill_token=True)
    ours.load_state_dict(theirs.state_dict(), strict=True)  # the same names and shapes, nothing left over
    return theirs, ours


def test_distilled_deit_outputs_both_heads_and_the_average(deit_pair):
    theirs, ours = deit_pair
    x = torch.randn(2, 3, 224, 224)
    theirs.train()
    ours.train()
    cls_t, dist_t = theirs(x)
    cls_o, dist_o = ours(x)
    torch.testing.assert_close(cls_o, cls_t, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dist_o, dist_t, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(cls_o, dist_o)  # two different heads, not one read twice
    theirs.eval()
    ours.eval()
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours(x), (cls_t + dist_t) / 2, rtol=1e-5, atol=1e-5)


def test_distilled_deit_gradients_match_timm(deit_pair):
    theirs, ours = deit_pair
    x = torch.randn(2, 3, 224, 224)
    target = torch.tensor([3, 7])
    for model in (theirs, ours):
        model.train()
        model.zero_grad()
        cls, dist = model(x)
        (F.cross_entropy(cls, target) + 0.3 * F.cross_entropy(dist, target)).backward()
    grads_t = dict(theirs.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param.grad, grads_t[name].grad, rtol=1e-4, atol=1e-6, msg=name)
    assert ours.dist_token.grad.abs().sum() > 0 and ours.head_dist.weight.grad.abs().sum() > 0


def test_distilled_deit_weights_load_at_cifar_size(deit_pair, tmp_path):
    """224/16 -> 32/4 through the pretrained loader: both prefix rows kept, the grid resampled, both heads replaced."""
    theirs, _ = deit_pair
    source = save_safetensors(theirs.state_dict(), tmp_path / "deit.safetensors")
    model = create_model("vit_tiny", depth=2, distill_token=True, img_size=32, patch_size=4, num_classes=10)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    load_pretrained(model, str(source))
    expected = resample_abs_pos_embed(theirs.pos_embed.detach(), [8, 8], [14, 14], num_prefix_tokens=2)
    torch.testing.assert_close(model.pos_embed.detach(), expected, rtol=0, atol=0)
    torch.testing.assert_close(model.dist_token.detach(), theirs.dist_token.detach(), rtol=0, atol=0)
    for key in ("head.weight", "head_dist.weight"):
        assert torch.equal(model.state_dict()[key], fresh[key]), key  # 1000 -> 10 classes: the fresh heads


def test_t2t_vit_takes_the_token_too_and_avg_pool_is_refused():
    t2t = build_model_from_config(compose_config(["model=t2t_vit_7", "model.distill_token=true"]).model, 10)
    assert t2t.dist_token.shape == t2t.cls_token.shape and t2t.head_dist.out_features == 10
    assert t2t.pos_embed.shape[1] == t2t.tokens_to_token.num_patches + 2  # a position row for each prefix token
    with pytest.raises(ConfigError, match="distill_token=true needs global_pool=token"):
        build_model_from_config(
            compose_config(["model.distill_token=true", "model.global_pool=avg", *TINY_MODEL]).model, 10
        )


# --- the loss against a hand computation -----------------------------------------------------------------------


class FixedTeacher(nn.Module):
    """Returns the same logits whatever it is given; remembers its input."""

    def __init__(self, logits):
        super().__init__()
        self.logits = logits
        self.seen = None

    def forward(self, x):
        self.seen = x
        return self.logits


def log_softmax_row(row):
    top = max(row)
    log_sum = top + math.log(sum(math.exp(v - top) for v in row))
    return [v - log_sum for v in row]


def hand_cross_entropy(logits, labels):
    return sum(-log_softmax_row(row)[y] for row, y in zip(logits.tolist(), labels, strict=True)) / len(labels)


def hand_soft(student, teacher, tau):
    """sum over batch and classes of p_t (log p_t - log p_s) at temperature tau, times tau^2 / (B * K)."""
    total = 0.0
    for s_row, t_row in zip(student.tolist(), teacher.tolist(), strict=True):
        log_s = log_softmax_row([v / tau for v in s_row])
        log_t = log_softmax_row([v / tau for v in t_row])
        total += sum(math.exp(lt) * (lt - ls) for ls, lt in zip(log_s, log_t, strict=True))
    return total * tau * tau / student.numel()


def hand_hard(student, teacher):
    argmax = [row.index(max(row)) for row in teacher.tolist()]
    return hand_cross_entropy(student, argmax)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(1)
    cls, dist = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    teacher = 3 * torch.randn(4, 5, generator=g)
    return cls, dist, teacher, [0, 2, 4, 1]


@pytest.mark.parametrize(("kind", "alpha", "tau"), [("soft", 0.3, 2.0), ("soft", 0.5, 1.0), ("hard", 0.5, 1.0)])
def test_the_loss_is_the_hand_computation(kind, alpha, tau, batch):
    cls, dist, teacher_logits, labels = batch
    distiller = Distiller(nn.CrossEntropyLoss(), FixedTeacher(teacher_logits), kind, alpha, tau)
    loss = distiller.loss(torch.zeros(4, 3, 8, 8), (cls, dist), torch.tensor(labels))
    term = hand_soft(dist, teacher_logits, tau) if kind == "soft" else hand_hard(dist, teacher_logits)
    label_loss = hand_cross_entropy(cls, labels)
    assert loss.item() == pytest.approx((1 - alpha) * label_loss + alpha * term, rel=1e-5)
    logged = distiller.log_values()
    assert logged["train/loss_label"] == pytest.approx(label_loss, rel=1e-5)
    assert logged["train/loss_distill"] == pytest.approx(term, rel=1e-5)


def test_without_the_token_the_class_head_learns_both(batch):
    cls, _, teacher_logits, labels = batch
    distiller = Distiller(nn.CrossEntropyLoss(), FixedTeacher(teacher_logits), "hard", 0.25, 1.0)
    loss = distiller.loss(torch.zeros(4, 3, 8, 8), cls, torch.tensor(labels))
    expected = 0.75 * hand_cross_entropy(cls, labels) + 0.25 * hand_hard(cls, teacher_logits)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_without_a_teacher_both_heads_learn_the_labels_through_their_average(batch):
    cls, dist, _, labels = batch
    loss = Distiller(nn.CrossEntropyLoss(), None, "none", 0.5, 1.0).loss(None, (cls, dist), torch.tensor(labels))
    assert loss.item() == pytest.approx(hand_cross_entropy((cls + dist) / 2, labels), rel=1e-5)


def test_the_teacher_sees_the_batch_resized_and_renormalised():
    """A 16 px student batch, normalised with the student's statistics, becomes the 32 px image the teacher's
    own preprocessing would give: pixels resized, then normalised with the teacher's mean and std."""
    pixels = torch.rand(2, 3, 16, 16)
    s_mean, s_std, t_mean, t_std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    student_batch = TF.normalize(pixels, s_mean, s_std)
    teacher = FixedTeacher(torch.zeros(2, 10))
    view = TeacherView(teacher, 32, t_mean, t_std, s_mean, s_std)
    view.train()
    assert not teacher.training  # eval mode whatever is asked
    view(student_batch)
    expected = TF.normalize(TF.resize(pixels, [32, 32], antialias=False), t_mean, t_std)
    torch.testing.assert_close(teacher.seen, expected, rtol=1e-4, atol=1e-5)


# --- a run with a teacher ----------------------------------------------------------------------------------------

RUN = [*QUICK_SYNTHETIC, *TINY_MODEL, *CPU, "data.synthetic.num_train=64", "data.synthetic.num_val=32"]
RUN += ["trainer.epochs=2", "trainer.deterministic=true", "model.distill_token=true"]


@pytest.fixture(scope="module")
def resnet_file(tmp_path_factory):
    """A small timm ResNet (random weights, 10 classes) saved as a state dict file."""
    torch.manual_seed(3)
    model = timm.create_model("test_resnet", pretrained=False, num_classes=10)
    return save_safetensors(model.state_dict(), tmp_path_factory.mktemp("teacher") / "resnet.safetensors")


def teacher_overrides(path, kind="soft"):
    return [f"distill.teacher={path}", "distill.teacher_model=test_resnet", f"distill.type={kind}"]


def test_a_distillation_run_leaves_the_teacher_alone_and_resumes_exactly(resnet_file, tmp_path, monkeypatch):
    captured = []
    real = setup_phase.build_distiller
    monkeypatch.setattr(setup_phase, "build_distiller", lambda *a, **k: captured.append(real(*a, **k)) or captured[-1])
    args = [*RUN, *teacher_overrides(resnet_file), "distill.teacher_img_size=48", "distill.tau=2.0"]
    whole = run(compose_config(args), output_dir=tmp_path / "whole")

    from safetensors.torch import load_file

    teacher = captured[0].teacher.teacher
    for name, value in teacher.state_dict().items():  # weights and BatchNorm statistics: the file's
        assert torch.equal(value, load_file(str(resnet_file))[name]), name
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    state = load_checkpoint(tmp_path / "whole" / "checkpoints" / "last.pt")
    student_keys = set(create_model("vit_tiny", embed_dim=32, depth=2, num_heads=2, distill_token=True).state_dict())
    assert set(state["model"]) == student_keys  # the student only: no conv1.*, fc.* of the teacher
    assert not any("teacher" in key for key in state)
    assert 0 <= whole["teacher"]["top1"] <= 100 and whole["teacher"]["count"] == 32
    assert all(0 <= r["val_teacher_agreement"] <= 100 for r in whole["history"])

    half = [*args, "trainer.stop_after_epoch=1"]
    run(compose_config(half), output_dir=tmp_path / "halves")
    run(compose_config([*args, "trainer.resume=auto"]), output_dir=tmp_path / "halves")
    resumed = load_checkpoint(tmp_path / "halves" / "checkpoints" / "last.pt")
    for key, value in state["model"].items():
        assert torch.equal(resumed["model"][key], value), key


def test_a_checkpoint_of_ours_teaches_and_its_top1_is_its_own(tmp_path):
    """The teacher's logged top-1 on the validation split equals the one its own run measured there."""
    first = run(compose_config([*RUN, "trainer.epochs=1"]), output_dir=tmp_path / "teacher")
    ckpt = tmp_path / "teacher" / "checkpoints" / "last.pt"
    args = [*RUN, "trainer.epochs=1", "model.distill_token=false", f"distill.teacher={ckpt}", "distill.type=hard"]
    second = run(compose_config(args), output_dir=tmp_path / "student")
    assert second["teacher"]["top1"] == pytest.approx(first["final"]["val_top1"])


# --- bad settings: one line, exit code 2, before any data is read ------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["distill.type=hard"], "distill.type=hard needs a teacher: set distill.teacher=<source>"),
        (["distill.teacher=x.pt", "distill.type=soft", "distill.tau=-1"], "distill.tau=-1 must be > 0"),
        (["distill.teacher=x.pt", "distill.type=soft", "distill.alpha=1.5"], "distill.alpha=1.5 must be in [0, 1]"),
        (["distill.type=medium"], "distill.type='medium' must be one of"),
        (["distill.teacher=x.pt"], "is set but distill.type=none"),
    ],
)
def test_bad_distillation_settings_are_named(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate(compose_config([*QUICK_SYNTHETIC, *override]))


def test_an_unreadable_or_unnamed_teacher_file_is_named(tmp_path):
    broken = tmp_path / "teacher.pth"
    broken.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match=r"distill.teacher='.*teacher.pth': cannot read .* with weights_only"):
        load_teacher({"teacher": str(broken)})
    with pytest.raises(CheckpointError, match="no such file"):
        load_teacher({"teacher": str(tmp_path / "missing.pt")})
    bare = save_safetensors(timm.create_model("test_resnet", num_classes=10).state_dict(), tmp_path / "r.safetensors")
    with pytest.raises(CheckpointError, match="set distill.teacher_model=<timm model name>"):
        load_teacher({"teacher": str(bare)})


def test_a_timm_distilled_deit_file_is_a_teacher_computing_what_timm_computes(tmp_path):
    """A timm architecture with two classifiers (head, head_dist): the file's class count, timm's eval output."""
    reference = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, num_classes=7).eval()
    path = save_safetensors(reference.state_dict(), tmp_path / "deit.safetensors")
    teacher = load_teacher({"teacher": str(path), "teacher_model": "deit_tiny_distilled_patch16_224"})
    assert teacher.num_classes == 7 and teacher.img_size is None  # a file: the student's size unless set
    x = torch.randn(2, 3, 224, 224)
    torch.testing.assert_close(teacher.model.eval()(x), reference(x), rtol=0, atol=0)


def test_a_timm_teacher_without_network_or_cache_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr("vit.weights.read.host_reachable", lambda *a, **k: False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointError, match=r"distill.teacher='timm:resnet18.a1_in1k': cannot download") as err:
        load_teacher({"teacher": "timm:resnet18.a1_in1k"})
    assert "\n" not in str(err.value)
    assert "give a file: distill.teacher_file=" in str(err.value) and "model.pretrained" not in str(err.value)


def test_a_timm_teacher_from_its_file_is_built_as_model_pretrained_builds_it_with_its_preprocessing(tmp_path):
    """`distill.teacher=timm:<name> distill.teacher_file=<file>` (the file in place of timm's download, as
    model.pretrained_file): EVA-02-Ti, in Eva's key layout, gives timm's logits, at the size and normalisation of
    its pretrained config (CLIP's mean and std), with the file's class count."""
    name = "eva02_tiny_patch14_224.mim_in22k"
    torch.manual_seed(0)
    reference = timm.create_model(name, pretrained=False, num_classes=7).eval()
    with torch.no_grad():
        for param in reference.parameters():  # off its init: LayerScale and the zero-initialised head count
            param.add_(0.02 * torch.randn_like(param))
    path = save_safetensors(reference.state_dict(), tmp_path / "eva02.safetensors")
    teacher = load_teacher({"teacher": f"timm:{name}", "teacher_file": str(path)})
    cfg = reference.pretrained_cfg
    assert teacher.num_classes == 7 and teacher.img_size == cfg["input_size"][-1] == 224
    assert teacher.mean == tuple(cfg["mean"]) != IMAGENET_DEFAULT_MEAN and teacher.std == tuple(cfg["std"])
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(teacher.model.eval()(x), reference(x), rtol=0, atol=1e-5)


def test_a_teacher_model_beside_a_source_that_names_its_architecture_is_named_as_unused(resnet_file, caplog):
    path = save_safetensors(
        timm.create_model("test_vit", num_classes=10).state_dict(), resnet_file.parent / "vit.safetensors"
    )
    source = {"teacher": "timm:test_vit", "teacher_file": str(path), "teacher_model": "resnet18"}
    with caplog.at_level(logging.WARNING, logger="vit.train"):
        load_teacher(source)
    assert "distill.teacher_model=resnet18 is not used: distill.teacher='timm:test_vit'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vit.train"):
        load_teacher({"teacher": str(resnet_file), "teacher_model": "test_resnet"})  # a state dict: it is used
    assert "is not used" not in caplog.text


def test_a_teacher_file_is_for_a_timm_name_and_must_exist(resnet_file, tmp_path):
    with pytest.raises(CheckpointError, match=r"distill.teacher_file=.*missing.safetensors: no such file"):
        load_teacher({"teacher": "timm:resnet18.a1_in1k", "teacher_file": str(tmp_path / "missing.safetensors")})
    with pytest.raises(CheckpointError, match="a weights file is given for a timm:<name> source"):
        load_teacher({"teacher": str(resnet_file), "teacher_file": str(resnet_file)})


def test_a_teacher_of_other_classes_stops_before_the_data(resnet_file, tmp_path, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("the data was read")

    monkeypatch.setattr(setup_phase, "build_data", no_data)
    cfg = compose_config([*RUN, "data.num_classes=7", *teacher_overrides(resnet_file)])
    with pytest.raises(CheckpointError, match="the teacher predicts 10 classes, the data has 7"):
        run(cfg, output_dir=tmp_path / "run")


def test_the_command_line_says_it_in_one_line_with_exit_code_2(resnet_file, tmp_path):
    done = run_cli([*RUN, "data.num_classes=7", *teacher_overrides(resnet_file, "hard")], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("checkpoint error: distill.teacher="), lines
    assert "predicts 10 classes, the data has 7" in lines[0]


def test_the_experiment_script_records_every_seed_beside_its_provenance(tmp_path, monkeypatch):
    """lab/distill_experiment.py with its train.py runs answered from a table (the runs themselves: the tests
    above): results.json is its measurement record, each seed's run and the summary beside the provenance."""
    script = load_script("distill_experiment")
    empty_image_tree(tmp_path / "data", ("cat", "dog"))
    top1 = {"teacher": 60.0, "alone": 40.0, "hard": 45.0, "soft": 50.0}

    def train(name, overrides, work):
        method, _, seed = name.partition("-")
        final = {"val_top1": top1[method] - 5, "step": 10, "val_teacher_agreement": 0.5 if seed else None}
        return {"test": {"top1": top1[method] + int(seed or 0)}, "final": final, "wall_time_s": 1.0}

    monkeypatch.setattr(script, "train", train)
    work = tmp_path / "work"
    assert script.main([f"data={tmp_path / 'data'}", f"work={work}", "seeds=0,1"]) == 0
    record = json.loads((work / "results.json").read_text())
    assert_measurement_record(record, "distill_experiment", "seeds=0,1")
    assert record["runs"]["soft-1"]["test"]["top1"] == 51.0 and "distill.type=soft" in record["commands"]["soft-1"]
    assert record["summary"]["hard"]["test_top1"] == [45.0, 46.0] and record["summary"]["teacher"]["test_top1"] == 60
    assert record["settings"]["per_class"] == 300 and record["settings"]["alpha"] == 0.5
    args = [f"data={tmp_path / 'data'}", f"work={work}", "plot_only=true"]
    assert script.main(args) == 0 and json.loads((work / "results.json").read_text()) == record  # read, not rerun


@pytest.mark.parametrize(
    ("arg", "named"),
    [
        ("seeds=0,x", "seeds='0,x' must be whole numbers >= 0"),
        ("alpha=half", "alpha='half' must be a number"),
        ("jobs=0", "jobs='0' must be an integer >= 1"),
        ("--teacher-epochs", "argument '--teacher-epochs' must look like key=value"),
    ],
)
def test_the_experiment_script_says_a_bad_argument_in_one_line_with_exit_code_2(arg, named, tmp_path, capsys):
    from vit.cli.args import run_script

    script = load_script("distill_experiment")
    script.train = None  # nothing trains: the arguments are read first
    assert run_script(script.main, [f"data={tmp_path}", f"work={tmp_path / 'work'}", arg]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("usage error: ") and named in err[0], err

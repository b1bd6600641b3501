"""Bad input gets one clear message and loses nothing: unknown or non-numeric settings, checkpoints of another
model or class count, truncated or code-carrying checkpoints, a full disk or unwritable folder, a diverging loss."""

import errno
import importlib
import os
import re
import subprocess

import pytest
import torch
from trainer_utils import QUICK_SYNTHETIC, TINY_MODEL, compose_config, run_cli

from vit.cli import check_override_keys
from vit.train import CheckpointError, atomic_save, load_checkpoint, run
from vit.train.config import ConfigError, build_model_from_config, validate
from vit.train.loop import NonFiniteLossError, weights_finite

run_module = importlib.import_module("vit.train.run")  # the module (vit.train.run is also the function's name)
QUICK = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.device=cpu", "trainer.attn_maps_every_n_epochs=0"]


# --- settings --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arg", "suggestion"),
    [
        ("model.num_head=4", "did you mean model.num_heads?"),
        ("data.batchsize=8", "did you mean data.batch_size?"),
        ("data.augment.reprob=0.1", "did you mean data.augment.re_prob?"),
        ("trainr.epochs=3", "did you mean trainer.epochs?"),
        ("num_heads=3", "did you mean model.num_heads?"),
        ("model.zebra=1", "unknown key model.zebra (a new key"),
    ],
)
def test_unknown_key_exits_2_suggesting_the_nearest(arg, suggestion, capsys):
    with pytest.raises(SystemExit) as exit_info:
        check_override_keys([arg])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: unknown key {arg.split('=')[0]}") and suggestion in err


@pytest.mark.parametrize(
    "args",
    [
        ["model.num_heads=4", "data.augment.re_prob=0.2"],
        ["experiment=ablation_heads", "model.num_heads=1,2"],  # a sweep's values, an experiment's keys
        ["model=t2t_vit_7", "model.token_dim=32"],  # a key only the T2T configs have
        ["+model.new_knob=1", "~trainer.eval_flip", "hydra.run.dir=x", "-m", "--cfg", "job"],
    ],
)
def test_known_keys_and_hydra_syntax_pass(args):
    check_override_keys(args)


def test_unknown_key_through_the_cli_exits_2_before_training(tmp_path):
    done = run_cli(["model.num_head=4"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("config error: unknown key model.num_head; did you mean model.num_heads?")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("model.img_size=abc", "model.img_size='abc' must be an integer"),
        ("model.embed_dim=19.5", "model.embed_dim=19.5 must be an integer"),
        ("model.drop_path_rate=lots", "model.drop_path_rate='lots' must be a number"),
        ("model.qk_scale=big", "model.qk_scale='big' must be a number"),
        ("data.batch_size=x", "data.batch_size='x' must be an integer"),
        ("optim.lr=fast", "optim.lr='fast' must be a number"),
        ("trainer.epochs=true", "trainer.epochs=True must be an integer"),
        ("data.augment.re_prob=some", "data.augment.re_prob='some' must be a number"),
        ("sched.min_lr=-1", "sched.min_lr=-1 must be >= 0"),
        ("data.num_workers=-2", "data.num_workers=-2 must be >= 0"),
        ("data.augment.scale_min=0", "data.augment.scale_min=0.0 must be in (0, 1]"),
        ("optim.momentum=1.5", "optim.momentum=1.5 must be in [0, 1)"),
        ("optim.weight_decay_end=-0.1", "optim.weight_decay_end=-0.1 must be >= 0"),
        ("trainer.max_bad_steps=0", "trainer.max_bad_steps=0 must be >= 1"),
        ("data.synthetic.num_train=0", "data.synthetic.num_train=0 must be >= 1"),
    ],
)
def test_every_numeric_knob_is_typed_and_range_checked(override, needle):
    cfg = compose_config(["data=synthetic", override])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
        build_model_from_config(cfg.model)
    assert needle in str(err.value)


def test_a_non_numeric_model_value_is_named_through_the_cli(tmp_path):
    done = run_cli(["model.img_size=abc", "data=synthetic"], cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == "config error: model.img_size='abc' must be an integer"


# --- checkpoints -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 1-epoch run of the tiny model: its last.pt is what the resume tests feed back."""
    run_dir = tmp_path_factory.mktemp("trained")
    run(compose_config([*QUICK, "trainer.epochs=1"]), output_dir=run_dir)
    return run_dir / "checkpoints" / "last.pt"


@pytest.mark.parametrize(
    ("other", "needle"),
    [
        (["model.embed_dim=64"], "patch_embed.proj.weight: checkpoint (32, 3, 4, 4) vs model (64, 3, 4, 4)"),
        (["model.depth=3"], "missing keys (e.g. blocks.2."),
        (["data.num_classes=7", "model.num_classes=7"], "head.weight: checkpoint (10, 32) vs model (7, 32)"),
    ],
)
def test_resuming_another_model_names_the_first_differences(trained, tmp_path, other, needle):
    cfg = compose_config([*QUICK, "trainer.epochs=2", *other, f"trainer.resume={trained}"])
    with pytest.raises(CheckpointError) as err:
        run(cfg, output_dir=tmp_path)
    assert str(trained) in str(err.value) and needle in str(err.value)


def test_resuming_a_vit_tiny_checkpoint_as_vit_small_through_the_cli(trained, tmp_path):
    args = [*QUICK_SYNTHETIC, "model=vit_small", "trainer.device=cpu", "trainer.epochs=2", f"trainer.resume={trained}"]
    done = run_cli([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if "error" in x]
    assert line.startswith(f"checkpoint error: checkpoint '{trained}' (vit_tiny) does not fit")
    assert re.search(r"shape mismatches \(cls_token: checkpoint \(1, 1, 32\) vs model \(1, 1, 384\)", line)
    assert "missing keys (e.g. blocks.2." in line  # 12 blocks against the checkpoint's 2


def test_resuming_with_another_optimizer_is_named(trained, tmp_path):
    cfg = compose_config([*QUICK, "trainer.epochs=2", "optim=sgd", f"trainer.resume={trained}"])
    with pytest.raises(CheckpointError, match="was trained with optim.name=adamw, this run uses SGD"):
        run(cfg, output_dir=tmp_path)


def test_a_file_of_weights_alone_cannot_be_resumed(trained, tmp_path):
    weights = tmp_path / "weights.pt"
    torch.save({"model": load_checkpoint(trained)["model"]}, weights)
    with pytest.raises(CheckpointError, match="holds no optimizer or scheduler state"):
        run(compose_config([*QUICK, "trainer.epochs=2", f"trainer.resume={weights}"]), output_dir=tmp_path / "run")


@pytest.mark.parametrize(
    ("cut", "reason"),
    [
        (0.5, r"the file is truncated or corrupted \(PytorchStreamReader failed reading zip archive"),
        (0.0, r"the file is empty \(0 bytes\)"),
    ],
)
def test_a_truncated_checkpoint_is_refused_with_its_path(trained, tmp_path, cut, reason):
    path = tmp_path / "cut.pt"
    data = trained.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(CheckpointError, match=rf"cannot read checkpoint '.*cut\.pt'.*: {reason}") as err:
        run(compose_config([*QUICK, "trainer.epochs=2", f"trainer.resume={path}"]), output_dir=tmp_path / "run")
    assert "\n" not in str(err.value)


class RunsCode:
    """Unpickling this would create a marker file: weights_only=True must refuse before that happens."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_carrying_code_is_refused_and_the_code_never_runs(trained, tmp_path):
    marker = tmp_path / "code-ran"
    state = load_checkpoint(trained)
    state["extra"] = RunsCode(marker)
    evil = tmp_path / "evil.pt"
    torch.save(state, evil)
    done = run_cli(
        [*QUICK, "trainer.epochs=2", f"trainer.resume={evil}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path
    )
    assert done.returncode == 2 and not marker.exists()
    (line,) = [x for x in done.stderr.splitlines() if "error" in x]  # one line, not torch's dozen
    assert line.startswith(f"checkpoint error: cannot read checkpoint '{evil}' (weights_only=True): it holds pickled")
    assert "GLOBAL io.open" in line and "refuses without running them" in line
    assert torch.load(evil, weights_only=False) is not None and marker.exists()  # the payload was real


# --- disk ------------------------------------------------------------------------------------------------------


def test_a_full_disk_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    """The second epoch's checkpoint write fails half way as a full disk makes torch.save fail; the run stops with
    one clear error and last.pt is still epoch 1's."""
    real_save = torch.save
    calls = {"n": 0}

    def save_until_full(obj, handle, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 2:  # epoch 1: last.pt and best.pt
            return real_save(obj, handle, *args, **kwargs)
        handle.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("vit.train.checkpoint.torch.save", save_until_full)
    with pytest.raises(CheckpointError) as err:
        run(compose_config([*QUICK, "trainer.epochs=3"]), output_dir=tmp_path)
    message = str(err.value)
    assert "No space left on device" in message and "the previous file is intact" in message
    assert "last.pt" in message
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["epoch"] == 1
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")] == []  # no temp left


def test_a_real_full_disk_is_reported_with_its_free_space(tmp_path):
    """The same on a real 64 KiB tmpfs, where torch.save fails with its own RuntimeError (needs mount rights)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root); the monkeypatched test above covers the logic")
    try:
        atomic_save({"model": {"w": torch.zeros(4)}}, mount / "last.pt")
        with pytest.raises(CheckpointError, match=r"MiB free there\); the previous file is intact"):
            atomic_save({"model": {"w": torch.zeros(100_000)}}, mount / "last.pt")
        assert torch.equal(load_checkpoint(mount / "last.pt")["model"]["w"], torch.zeros(4))
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_an_unwritable_output_folder_is_named(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the checkpoint folder should be")
    done = run_cli([*QUICK, "trainer.epochs=1", f"hydra.run.dir={tmp_path}"], tmp_path)
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"checkpoint error: cannot write checkpoint '{tmp_path / 'checkpoints' / 'last.pt'}'")
    assert f"'{tmp_path / 'checkpoints'}' is a file, not a folder" in line and "there was no earlier file" in line


@pytest.mark.parametrize(
    ("code", "where"),
    [(errno.ENOSPC, "write"), (errno.EACCES, "open"), (errno.EROFS, "open"), (errno.EIO, "rename")],
)
def test_every_os_error_while_saving_names_path_and_reason_and_keeps_the_old_file(tmp_path, monkeypatch, code, where):
    """A full disk, a folder without write permission, a read-only file system, a failing disk: whichever step
    meets it (root ignores permissions, so the OS errors are raised by hand), one message, the old file kept."""
    path = tmp_path / "checkpoints" / "last.pt"
    atomic_save({"model": {"w": torch.ones(2)}, "epoch": 1}, path)
    failure = OSError(code, os.strerror(code))
    real_open, real_save = open, torch.save

    def failing_open(file, *args, **kwargs):
        if where == "open" and ".tmp-" in str(file):
            raise failure
        return real_open(file, *args, **kwargs)

    def failing_save(obj, handle):
        real_save(obj, handle)
        if where == "write":
            raise failure

    def failing_replace(src, dst):
        raise failure

    monkeypatch.setattr("builtins.open", failing_open)
    monkeypatch.setattr("vit.train.checkpoint.torch.save", failing_save)
    if where == "rename":
        monkeypatch.setattr("vit.train.checkpoint.os.replace", failing_replace)
    with pytest.raises(CheckpointError) as err:
        atomic_save({"model": {"w": torch.zeros(2)}, "epoch": 2}, path)
    monkeypatch.undo()
    assert str(err.value).startswith(f"cannot write checkpoint '{path}': {os.strerror(code)} (")
    assert str(err.value).endswith("free there); the previous file is intact")
    assert load_checkpoint(path)["epoch"] == 1 and [p.name for p in path.parent.iterdir()] == ["last.pt"]


# --- divergence ------------------------------------------------------------------------------------------------


def test_a_diverging_run_exits_3_naming_the_step(tmp_path):
    args = [*QUICK, "optim.name=sgd", "optim.lr=1e30", "trainer.grad_clip=null", "sched.warmup_epochs=0"]
    args += ["trainer.max_bad_steps=2", "trainer.log_every_n_steps=1", f"hydra.run.dir={tmp_path}"]
    done = run_cli(args, tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("training stopped:")]
    assert "finite" in line and re.search(r"step \d+", line)  # the wording is the loop's; a step is named
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "checkpoints" / "last.pt").exists()  # nothing non-finite was saved


def test_divergence_in_epoch_2_keeps_epoch_1s_checkpoints(tmp_path, monkeypatch):
    real_build = run_module.build_data

    class NanAfter(torch.nn.CrossEntropyLoss):
        """NaN losses from the 10th call on (epoch 2 of 8 steps), with the gradients to match."""

        calls = 0

        def forward(self, logits, targets):
            NanAfter.calls += 1
            loss = super().forward(logits, targets)
            return loss * float("nan") if NanAfter.calls >= 10 else loss

    def build_data(*args, **kwargs):
        bundle = real_build(*args, **kwargs)
        bundle.train_criterion = NanAfter()
        return bundle

    monkeypatch.setattr(run_module, "build_data", build_data)
    with pytest.raises(NonFiniteLossError, match="step"):
        run(compose_config([*QUICK, "trainer.epochs=3", "trainer.max_bad_steps=3"]), output_dir=tmp_path)
    for name in ("last.pt", "best.pt"):
        state = load_checkpoint(tmp_path / "checkpoints" / name)
        model = build_model_from_config(compose_config(QUICK).model)
        model.load_state_dict(state["model"])
        assert state["epoch"] == 1 and weights_finite(model)

"""The trainer end to end: the real CLI, TensorBoard contents, image folders and archives, evaluation."""

import json
import math
import os
import subprocess
import tarfile
import time
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from trainer_utils import (
    QUICK_SYNTHETIC,
    REPO,
    TINY_MODEL,
    assert_evaluates_as_the_run,
    compose_config,
    make_tree,
    run_cli,
    trainer_path_evaluation,
)

from vit.cli.evaluate import cli as evaluate_main
from vit.tasks.build import build_model_from_config
from vit.train import run
from vit.train.optimizer import build_optimizer, build_scheduler, param_groups, scaled_lr
from vit.train.step_parts import count_skipped_steps
from vit.weights.read import load_checkpoint

EXPECTED_TAGS = {
    "train/loss",
    "train/lr",
    "train/grad_norm",
    "train/img_per_s",
    "val/top1",
    "val/top5",
    "val/loss",
    "val_ema/top1",
    "time/epoch_s",
}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """One real `python train.py` run on synthetic data: 2 epochs of a tiny ViT."""
    cwd = tmp_path_factory.mktemp("cli")
    run_dir = cwd / "run"
    args = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.epochs=2", "trainer.device=cpu"]  # log_every_n_steps=auto
    args += ["optim.lr=3e-3", "sched.warmup_epochs=0.25", "trainer.attn_maps_every_n_epochs=1"]
    done = run_cli([*args, f"hydra.run.dir={run_dir}"], cwd=cwd, process=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir, done


def test_cli_run_directory_layout(cli_run):
    run_dir, done = cli_run
    for path in (".hydra/config.yaml", "checkpoints/last.pt", "checkpoints/best.pt", "metrics.json"):
        assert (run_dir / path).is_file(), path
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    metrics = json.loads((run_dir / "metrics.json").read_text())
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    params = sum(v.numel() for v in state["model"].values())  # the tiny ViT's state is its parameters
    assert metrics["epochs_done"] == 2 and metrics["params"] == params and metrics["wall_time_s"] > 0
    assert metrics["final"]["val_top1"] == metrics["history"][-1]["val_top1"]
    # best.pt is chosen by the weights the tools read: the EMA's (trainer.ema), the best of the evaluated epochs.
    best = metrics["best"]
    assert best["chosen_by"] == "val_ema" and best["val_ema_top1"] >= metrics["final"]["val_ema_top1"]
    assert best["val_ema_top1"] == max(r["val_ema_top1"] for r in metrics["history"])
    assert load_checkpoint(run_dir / "checkpoints" / "best.pt")["epoch"] == best["epoch"]
    assert "epoch 2/2" in done.stdout  # plain log lines when not on a terminal
    assert f"run folder: {run_dir.resolve()}" in done.stdout.splitlines()[0]  # the first line says where it writes
    # Where the run came from: this checkout's commit, the command, this machine (vit/records/provenance.py).
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    source = metrics["provenance"]
    assert source["commit"] == head and source["command"].split()[0].endswith("train.py")
    assert "trainer.epochs=2" in source["command"] and source["machine"]["cpu"]["cores"] == os.cpu_count()


def test_cli_tensorboard_holds_finite_scalars_and_a_falling_loss(cli_run):
    run_dir, _ = cli_run
    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "images": 0}).Reload()
    tags = set(events.Tags()["scalars"])
    assert EXPECTED_TAGS <= tags, EXPECTED_TAGS - tags
    for tag in EXPECTED_TAGS:
        assert all(math.isfinite(e.value) for e in events.Scalars(tag)), tag
    losses = [e.value for e in events.Scalars("train/loss")]
    # 16 batches, fewer than auto's 20 points at most every 50 batches: a point a batch draws the curve
    assert len(losses) == 16 and losses[-1] < losses[0]
    assert "attention/heads_and_rollout" in events.Tags()["images"]


def test_cli_checkpoint_contents(cli_run):
    run_dir, _ = cli_run
    state = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert state["epoch"] == 2 and state["step"] == 16
    assert state["config"]["model"]["embed_dim"] == 32
    assert state["class_to_idx"] == {f"class_{i}": i for i in range(10)}
    for key in ("optimizer", "scheduler", "ema", "rng"):
        assert state[key] is not None, key


def test_evaluate_reproduces_the_val_metrics(cli_run, tmp_path, capsys):
    """`vit-eval` (the same `main`, called in-process to spare a Python start-up)."""
    run_dir, _ = cli_run
    argv = [f"checkpoint={run_dir / 'checkpoints' / 'last.pt'}", f"confusion={tmp_path / 'cm.png'}", "device=cpu"]
    assert evaluate_main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    # ema=auto, the default: the EMA weights, which the run kept and evaluated beside the raw ones.
    assert result["weights"] == "ema"
    assert_evaluates_as_the_run(result, json.loads((run_dir / "metrics.json").read_text()), "val_ema")
    assert len(result["per_class_top1"]) == 10 and (tmp_path / "cm.png").stat().st_size > 1000


def test_evaluate_names_a_missing_checkpoint(tmp_path, capsys):
    assert evaluate_main([f"checkpoint={tmp_path / 'none.pt'}"]) == 2
    err = capsys.readouterr().err
    assert "none.pt" in err and len(err.strip().splitlines()) == 1


def test_fp16_skipped_steps_are_counted_from_the_scale_at_log_time():
    """Each skipped fp16 step halves the GradScaler's scale; the loop counts skips without a per-step sync."""

    class Scaler:  # the two GradScaler methods the count reads
        def __init__(self, scales):
            self.scales = iter(scales)

        def get_scale(self):
            return next(self.scales)

        def get_backoff_factor(self):
            return 0.5

    ctx = SimpleNamespace(scaler=Scaler([65536.0, 16384.0, 32768.0, 32768.0]), last_scale=None, skipped_steps=0)
    counts = []
    for _ in range(4):
        count_skipped_steps(ctx, ctx)  # the settings' scaler, the state's counters
        counts.append(ctx.skipped_steps)
    assert counts == [0, 2, 2, 2]  # two skips, then a growth (not a skip), then nothing


def _folder_run(root, tmp_path, extra=()):
    cfg = compose_config(
        ["data=imagefolder", f"data.root={root}", "data.img_size=16", "data.patch_size=4", "data.batch_size=8"]
        + ["data.num_workers=0", f"data.cache_dir={tmp_path / 'cache'}", *TINY_MODEL, "trainer=debug", *extra]
    )
    return run(cfg, output_dir=tmp_path / "run")


def test_imagefolder_tree_trains(tmp_path):
    from vit.analysis.inputs import load_images, load_model

    tree = make_tree(tmp_path / "tree")
    metrics = _folder_run(tree, tmp_path)
    assert metrics["epochs_done"] == 2
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert state["class_to_idx"] == {"cat": 0, "dog": 1, "frog": 2}
    # The final val top-1, computed again image by image: the last weights on the 12 val images, each read and
    # transformed on its own (PIL, the validation transform), against the class of its folder.
    model, config, classes = load_model(tmp_path / "run" / "checkpoints" / "last.pt")
    correct = 0
    for name, index in classes.items():
        _, images = load_images(tree / "val" / name, config)
        with torch.no_grad():
            correct += int((model(images).argmax(-1) == index).sum())
    assert metrics["final"]["val_top1"] == pytest.approx(100 * correct / 12)


def test_imagefolder_archive_trains(tmp_path):
    tree = make_tree(tmp_path / "src" / "pets")
    archive = tmp_path / "pets.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname="pets")
    metrics = _folder_run(archive, tmp_path, ["data.augment.mixup_alpha=0.8", "data.augment.cutmix_alpha=1.0"])
    assert metrics["epochs_done"] == 2


def test_weight_decay_skips_norms_biases_pos_embed_and_cls_token():
    net = build_model_from_config(compose_config(TINY_MODEL).model)
    decay, no_decay = param_groups(net, 0.05)
    name_of = {id(p): n for n, p in net.named_parameters()}
    skipped = {name_of[id(p)] for p in no_decay["params"]}
    assert {"cls_token", "pos_embed", "norm.weight", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias"} <= skipped
    assert all(p.ndim == 2 or p.ndim == 4 for p in decay["params"])  # linear and patch-conv weights only
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(net.parameters()))


def test_lr_per_512_images_scaled_warmup_then_cosine_per_step():
    cfg = compose_config(["optim.lr=1e-3", "sched.warmup_epochs=1", "sched.warmup_lr_init=0", "sched.min_lr=0"])
    assert scaled_lr(cfg.optim, global_batch=256) == pytest.approx(5e-4)
    assert scaled_lr(cfg.optim, global_batch=2048) == pytest.approx(4e-3)
    optimizer = build_optimizer(torch.nn.Linear(4, 4), cfg.optim, lr=1e-3, device=torch.device("cpu"))
    scheduler = build_scheduler(optimizer, cfg.sched, epochs=4, steps_per_epoch=10)
    lrs = []  # the lr each of the 40 optimizer steps uses
    for step in range(40):
        lrs.append(optimizer.param_groups[0]["lr"])
        scheduler.step_update(num_updates=step + 1)
    assert lrs[5] == pytest.approx(5e-4) and lrs[10] == pytest.approx(1e-3)  # linear warmup over epoch 1
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))  # then only down
    assert lrs[25] == pytest.approx(5e-4, rel=0.06) and lrs[-1] < 1e-5  # half way, and ~min_lr at the end


def test_flip_evaluation_averages_the_probabilities_of_image_and_mirror():
    from vit.tasks.evaluation import evaluate

    gen = torch.Generator().manual_seed(0)
    images, targets = torch.randn(32, 3, 4, 4, generator=gen), torch.randint(0, 5, (32,), generator=gen)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 5))  # not mirror-symmetric
    loader = [(images[:16], targets[:16]), (images[16:], targets[16:])]
    with torch.no_grad():
        probs = (model(images).softmax(-1) + model(images.flip(-1)).softmax(-1)) / 2
    result = evaluate(model, loader, torch.device("cpu"), None, flip=True)
    assert result["top1"] == pytest.approx(100.0 * (probs.argmax(-1) == targets).float().mean().item())
    assert result["loss"] == pytest.approx(-probs.log()[torch.arange(32), targets].mean().item(), rel=1e-5)
    plain = evaluate(model, loader, torch.device("cpu"), None)
    assert plain["loss"] != pytest.approx(result["loss"])


def test_shifted_crop_evaluation_weighs_the_image_and_its_two_shifts_and_their_mirrors():
    """trainer.eval_shift=2 with eval_flip: 1/4 on the image and on its mirror, 1/8 on each of the image moved 2 px
    down-right and up-left (zero-filled) and on their mirrors; the shifts built here by slicing a padded copy."""
    from vit.tasks.evaluation import evaluate, tta_views

    gen = torch.Generator().manual_seed(0)
    images, targets = torch.randn(32, 3, 6, 6, generator=gen), torch.randint(0, 5, (32,), generator=gen)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(108, 5))  # sees where every pixel is
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    down_right, up_left = padded[..., 0:6, 0:6], padded[..., 4:10, 4:10]
    assert torch.equal(down_right[..., 2:, 2:], images[..., :4, :4]) and (down_right[..., :2, :] == 0).all()
    weights = [w for w, _ in tta_views(images, flip=True, shift=2)]
    assert weights == [0.25, 0.25, 0.125, 0.125, 0.125, 0.125]
    with torch.no_grad():
        p = lambda x: model(x).softmax(-1)  # noqa: E731
        probs = (p(images) + p(images.flip(-1))) / 4
        probs += (p(down_right) + p(down_right.flip(-1)) + p(up_left) + p(up_left.flip(-1))) / 8
    loader = [(images[:16], targets[:16]), (images[16:], targets[16:])]
    result = evaluate(model, loader, torch.device("cpu"), None, flip=True, shift=2)
    assert result["top1"] == pytest.approx(100.0 * (probs.argmax(-1) == targets).float().mean().item())
    assert result["loss"] == pytest.approx(-probs.log()[torch.arange(32), targets].mean().item(), rel=1e-5)
    alone = evaluate(model, loader, torch.device("cpu"), None, shift=2)  # without the mirrors: 1/2, 1/4, 1/4
    with torch.no_grad():
        probs = p(images) / 2 + p(down_right) / 4 + p(up_left) / 4
    assert alone["loss"] == pytest.approx(-probs.log()[torch.arange(32), targets].mean().item(), rel=1e-5)


def test_weight_decay_cosine_from_start_to_end_on_decaying_groups_only():
    cfg = compose_config(["optim.weight_decay=0.05", "optim.weight_decay_end=0.45"])
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, cfg.optim, lr=1e-3, device=torch.device("cpu"))
    scheduler = build_scheduler(optimizer, cfg.sched, 2, 10, cfg.optim.weight_decay_end)
    decays = []
    for step in range(21):
        scheduler.step_update(num_updates=step)
        decays.append([group["weight_decay"] for group in optimizer.param_groups])
    assert decays[0] == pytest.approx([0.05, 0.0])
    assert decays[10] == pytest.approx([0.25, 0.0])  # the cosine's midpoint: (0.05 + 0.45) / 2
    assert decays[20] == pytest.approx([0.45, 0.0])
    assert all(a[0] <= b[0] for a, b in zip(decays, decays[1:], strict=False))
    assert scheduler.state_dict()["base_values"] == [1e-3, 1e-3]  # the checkpointed state is the lr schedule's


def test_metrics_report_the_first_step_apart(cli_run):
    run_dir, _ = cli_run
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0 < metrics["first_step_seconds"] < metrics["wall_time_s"]


@pytest.mark.parametrize("loader", ["torch", "resident"])
def test_holdout_selects_and_the_test_split_is_reported_once_at_the_end(tmp_path, loader):
    from vit.train import run

    args = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.epochs=2", "trainer.device=cpu", "data.holdout=32"]
    metrics = run(compose_config([*args, f"data.loader={loader}", "trainer.ema=true"]), output_dir=tmp_path)
    assert metrics["val_split"] == "holdout" and metrics["test"]["split"] == "val"
    # The report is the final weights on the untouched val split: what evaluate.py says with the holdout off.
    ckpt = tmp_path / "checkpoints" / "last.pt"
    for weights, key in (("false", "top1"), ("true", "ema_top1")):
        direct = trainer_path_evaluation(ckpt, "holdout=null", ema=weights == "true")
        assert direct["count"] == 64 and direct["top1"] == pytest.approx(metrics["test"][key])
        assert direct["split"] == "val"
    on_holdout = trainer_path_evaluation(ckpt)  # the run's own selection split
    assert on_holdout["split"] == "holdout" and on_holdout["count"] == 32
    assert on_holdout["top1"] == pytest.approx(metrics["final"]["val_top1"])
    plain = run(compose_config([*args[:-1], f"data.loader={loader}"]), output_dir=tmp_path / "plain")
    assert "test" not in plain and plain["val_split"] == "val"
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert "test/top1" in events.Tags()["scalars"]


def test_val_every_n_epochs_evaluates_only_when_due(tmp_path):
    base = [*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.device=cpu", "trainer.epochs=5", "trainer.val_every_n_epochs=2"]
    metrics = run(compose_config(base), output_dir=tmp_path / "every2")
    evaluated = [r["epoch"] for r in metrics["history"] if r["val_top1"] is not None]
    assert evaluated == [2, 4, 5]  # every second epoch, and the last one
    assert all(r["val_loss"] is None and "val_ema_top1" not in r for r in metrics["history"] if r["epoch"] in (1, 3))
    assert metrics["best"]["epoch"] in evaluated and metrics["final"]["val_top1"] is not None
    events = EventAccumulator(str(tmp_path / "every2" / "tb")).Reload()
    assert len(events.Scalars("val/top1")) == 3 and len(events.Scalars("time/epoch_s")) == 5
    # A run stopped by trainer.stop_after_epoch is evaluated where it stops, so each slice reports.
    sliced = run(compose_config([*base, "trainer.stop_after_epoch=3"]), output_dir=tmp_path / "sliced")
    assert [r["epoch"] for r in sliced["history"] if r["val_top1"] is not None] == [2, 3]


MODULE_IMPORTED_AT = time.perf_counter()


def test_the_command_line_clock_starts_with_the_process_and_a_python_call_at_the_call(tmp_path, monkeypatch):
    import importlib

    run_module = importlib.import_module("vit.train.run")  # the module (vit.train's `run` is the function)

    monkeypatch.setattr(run_module, "_count_from_process_start", False)
    # Called from Python (notebook, test): the clock starts at the call, not when the interpreter started.
    start = time.perf_counter()
    metrics = run(compose_config([*QUICK_SYNTHETIC, *TINY_MODEL, "trainer.device=cpu", "trainer.epochs=1"]), tmp_path)
    assert 0 < metrics["wall_time_s"] <= time.perf_counter() - start
    # train.py's process: the first run's clock includes the process's life before it (imports, composition)...
    run_module.count_from_process_start()
    assert run_module.startup_seconds() >= time.perf_counter() - MODULE_IMPORTED_AT
    assert run_module.startup_seconds() == 0.0  # ...and only the first run's (a multirun's later jobs start at 0)

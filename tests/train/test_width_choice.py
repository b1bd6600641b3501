"""trainer.width_by_budget: a budgeted run times its widths on this machine and trains the widest that the budget
buys `min_epochs` of; a slowed machine picks the narrower one, and the first lines say so; the picked run trains
what a run configured with that width trains; a resumed run keeps its checkpoint's width; bad settings are one
line."""

import json
import logging
import time

import pytest
import torch
from trainer_utils import QUICK, compose_config, make_tree, run_cli

from vit.errors import ConfigError
from vit.runtime import device
from vit.tasks.build import built_config_file
from vit.train import run, width_choice
from vit.train.config import validate
from vit.train.progressive import ResizeSchedule
from vit.weights.read import load_checkpoint

# 256 synthetic images in batches of 32: 8 batches an epoch. In 30 s the tiny model's batch of a few milliseconds
# buys a hundred epochs and more; a batch 0.25 s slower buys at most 30 / (8 x 0.25) = 15, under min_epochs.
WIDTHS = ["trainer.width_by_budget.widths=[32,64]", "trainer.width_by_budget.min_epochs=20", "trainer.threads=1"]
WIDTHS.append("trainer.amp=none")  # one precision timed on every CPU (trainer.amp=auto's timing of two: below)
# A long run (the picked width's epochs reach long_epochs) also trains with a model key and a data key set.
LONG_SET = ["model.drop_path_rate=0.2", "data.augment.re_prob=0.5"]
LONG = [
    "trainer.width_by_budget.long_epochs=20",
    f"trainer.width_by_budget.long_overrides=[{','.join(repr(o) for o in LONG_SET)}]",
]
PICKING = [*QUICK, *WIDTHS, *LONG, "trainer.budget=30s", "trainer.epochs=1", "trainer.ema=false"]
SLOW_S = 0.25


def slowed_machine(monkeypatch, precision: str | None = None) -> None:
    """Every timed batch of every width (in `precision`, where given) 0.25 s slower: a sleep in the timed batch."""
    real = width_choice.batch_seconds

    def slowed(*args):
        start = time.perf_counter()
        if precision in (None, args[4].name):  # args: model, task, criterion, optimizer, precision, ...
            time.sleep(SLOW_S)
        return real(*args) + time.perf_counter() - start

    monkeypatch.setattr(width_choice, "batch_seconds", slowed)


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("trainer.width_by_budget")]


@pytest.fixture(scope="module")
def picked(tmp_path_factory):
    """The budgeted run on this machine, with the lines it said."""
    folder = tmp_path_factory.mktemp("picked")
    handler, logger = ListHandler(), logging.getLogger("vit.train")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        metrics = run(compose_config(PICKING), output_dir=folder)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return folder, metrics, handler.lines


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record) -> None:
        self.lines.append(record.getMessage())


def test_a_fast_machine_trains_the_wider_model_and_says_why(picked):
    folder, metrics, lines = picked
    chosen = [line for line in lines if line.startswith("trainer.width_by_budget")]
    assert len(chosen) == 3, chosen
    assert "32 wide (2 heads, fp32): " in chosen[0] and "64 wide (4 heads, fp32): " in chosen[0]
    assert chosen[1].startswith("trainer.width_by_budget: 64 wide picked (model.embed_dim=64 model.num_heads=4): ")
    assert "the widest whose epochs reach min_epochs=20" in chosen[1]
    # and a long run: the overrides it trains with too
    assert chosen[2].startswith("trainer.width_by_budget: 64 wide buys ")
    assert chosen[2].endswith(" epochs, at least long_epochs=20: also " + " ".join(LONG_SET))
    assert lines.index(chosen[2]) < min(i for i, line in enumerate(lines) if line.startswith("budget 30s: "))
    saved = load_checkpoint(folder / "checkpoints" / "last.pt")
    assert saved["config"]["model"]["embed_dim"] == 64 and saved["model"]["cls_token"].shape[-1] == 64
    assert saved["config"]["model"]["drop_path_rate"] == 0.2 and saved["config"]["data"]["augment"]["re_prob"] == 0.5
    assert "trainer.width_by_budget picked model.embed_dim=64" in (folder / built_config_file("model")).read_text()
    data = (folder / built_config_file("data")).read_text()  # beside Hydra's composed config: what was trained
    assert "trainer.width_by_budget.long_overrides set it" in data and "re_prob: 0.5" in data
    assert metrics["width_by_budget"]["long"] is True


def test_a_slowed_machine_picks_the_narrower_model_and_says_so(tmp_path, monkeypatch, caplog):
    slowed_machine(monkeypatch)
    with caplog.at_level(logging.INFO, logger="vit.train"):
        run(compose_config(PICKING), output_dir=tmp_path)
    timed, chosen, short = said(caplog)
    assert "32 wide (2 heads, fp32): " in timed and "64 wide" not in timed  # the wider one is slower still
    assert chosen.startswith("trainer.width_by_budget: 32 wide picked (model.embed_dim=32 model.num_heads=2): ")
    assert "none reaches min_epochs=20, so the narrowest; 64 wide not timed" in chosen
    epochs = float(timed.split(" img/s, ")[1].split(" epochs")[0])
    assert 5 < epochs < 16  # 30 s less the start over 8 batches of at least 0.25 s
    assert short.endswith(" epochs, under long_epochs=20: without " + " ".join(LONG_SET))
    config = load_checkpoint(tmp_path / "checkpoints" / "last.pt")["config"]
    assert config["model"]["embed_dim"] == 32
    composed = compose_config(PICKING)  # as configured
    assert config["model"]["drop_path_rate"] == composed.model.drop_path_rate != 0.2
    assert config["data"]["augment"]["re_prob"] == composed.data.augment.re_prob != 0.5
    assert not (tmp_path / built_config_file("model")).exists()  # the width configured: nothing to say


def test_the_picked_width_trains_what_that_width_configured_trains(picked, tmp_path, caplog):
    """Without a budget the choice is off (one line), and a run configured 64 wide, with the long run's overrides
    given, ends on the picked run's weights: the timing leaves no trace in the random state, and the data and the
    model built again are what that run builds."""
    configured = [*QUICK, *WIDTHS, "trainer.epochs=1", "trainer.ema=false", "model.embed_dim=64", "model.num_heads=4"]
    with caplog.at_level(logging.INFO, logger="vit.train"):
        run(compose_config([*configured, *LONG_SET]), output_dir=tmp_path)
    assert said(caplog) == ["trainer.width_by_budget: off without trainer.budget; the model is 64 wide as configured"]
    a = load_checkpoint(picked[0] / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "checkpoints" / "last.pt")["model"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_resumed_run_keeps_its_checkpoints_width(tmp_path, monkeypatch, caplog):
    two = [*PICKING, "trainer.epochs=2", "trainer.stop_after_epoch=1"]
    run(compose_config(two), output_dir=tmp_path)  # this machine: 64 wide
    slowed_machine(monkeypatch)  # would pick 32 wide now
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vit.train"):
        run(compose_config([*two, "trainer.resume=auto"]), output_dir=tmp_path)
    (line,) = said(caplog)
    assert line == (
        f"trainer.width_by_budget: 64 wide, the width of {tmp_path / 'checkpoints' / 'last.pt'}, which this run "
        f"continues; with its long_overrides, as that run trained ({' '.join(LONG_SET)})"
    )
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert saved["epoch"] == 2 and saved["config"]["model"]["embed_dim"] == 64
    assert saved["config"]["model"]["drop_path_rate"] == 0.2 and saved["config"]["data"]["augment"]["re_prob"] == 0.5


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["trainer.width_by_budget.widths=[32,40]"], "trainer.width_by_budget.widths=[32, 40]: 40 is not a whole "),
        (["trainer.width_by_budget.widths=[32]", "model.pretrained=timm:vit_tiny_patch16_224"], "fixes the width"),
        (["trainer.width_by_budget.long_epochs=40"], "long_overrides is empty: nothing to apply"),
        (
            ["trainer.width_by_budget.long_overrides=['trainer.epochs=3']"],
            "'trainer.epochs=3' sets trainer.epochs; a long run's overrides set keys of data.*, model.*, optim.*",
        ),
        (
            ["trainer.width_by_budget.long_overrides=['data.augment.re_prob=2']"],
            "long_overrides=['data.augment.re_prob=2']: with them applied, data.augment.re_prob=2 must be in [0, 1)",
        ),
        (
            ["trainer.width_by_budget.long_overrides=['model.nope=0.1']"],
            "the run's config has no model.nope; add it with +model.nope=0.1",
        ),
    ],
)
def test_bad_widths_are_one_line(overrides, needle):
    with pytest.raises(ConfigError) as err:
        validate(compose_config([*QUICK, *overrides]))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_an_epoch_under_progressive_resizing_costs_its_sizes_tokens():
    assert width_choice.epoch_cost(None) == 1.0
    assert width_choice.epoch_cost(ResizeSchedule(32, 32, 0.0, 0.5, multiple=4)) == 1.0
    half = width_choice.epoch_cost(ResizeSchedule(16, 32, 0.0, 0.5, multiple=4))
    whole = width_choice.epoch_cost(ResizeSchedule(16, 32, 0.0, 1.0, multiple=4))
    # 16 px costs a quarter of 32 px; a ramp over half the run costs more than one over all of it
    assert 0.25 < whole < half < 1.0
    assert width_choice.epoch_cost(ResizeSchedule(16, 32, 1.0, 1.0, multiple=4)) == pytest.approx(0.25 * 0.99 + 0.01)


def test_a_width_given_on_the_command_line_is_trained_as_given(tmp_path):
    """The recipe picks among its widths; a command line that gives model.embed_dim gets that width, one line
    saying the choice is off; giving the widths too is refused in one line."""
    tree = make_tree(tmp_path / "data", classes=("a", "b"), per_class=4, val="test", size=32)
    small = ["model.depth=1", "data.batch_size=4", "trainer.epochs=1", "trainer.eval_flip=false"]
    given = ["experiment=cifar10_cpu", f"data.root={tree}", f"data.cache_dir={tmp_path / 'cache'}", *small]
    given += ["model.embed_dim=64", "model.num_heads=1"]  # 64-wide heads: the recipe's 96 and 144 do not fit them
    done = run_cli([*given, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "run" / "train.log").read_text()
    line = "trainer.width_by_budget: off, the command line gives model.embed_dim=64 model.num_heads=1; the recipe "
    assert line + "would pick among 96, 144 wide" in log
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["architecture"]["embed_dim"] == 64
    both = run_cli([*given, "trainer.width_by_budget.widths=[64,128]", f"hydra.run.dir={tmp_path / 'b'}"], cwd=tmp_path)
    assert both.returncode == 2
    assert both.stderr.strip() == (
        "config error: model.embed_dim=64 fixes the width and trainer.width_by_budget.widths=[64, 128] picks it: "
        "give one of them"
    )


@pytest.mark.parametrize(("slow", "kept"), [("fp32", "bf16"), ("bf16", "fp32")])
def test_auto_precision_trains_in_the_precision_timed_the_faster(slow, kept, tmp_path, monkeypatch, caplog):
    """trainer.amp=auto on a CPU with native bf16: each width timed in fp32 and bf16, the run trains in the faster
    one at the picked width, and says so; a resumed run times its kept width's precision on its own machine."""
    for module in (width_choice, device):  # as torch reports an AVX512-BF16 CPU, to the timing and to the rule
        monkeypatch.setattr(module, "cpu_has_native_bf16", lambda: True)
    slowed_machine(monkeypatch, slow)
    widths = ["trainer.width_by_budget.widths=[32]", "trainer.amp=auto", "trainer.threads=1"]
    two = [*QUICK, *widths, "trainer.budget=30s", "trainer.epochs=2", "trainer.ema=false", "trainer.stop_after_epoch=1"]
    with caplog.at_level(logging.INFO, logger="vit.train"):
        metrics = run(compose_config(two), output_dir=tmp_path)
    timed = said(caplog)[0]
    assert f"32 wide (2 heads, {kept}): " in timed and f"({slow}: " in timed, timed
    assert metrics["precision"] == kept
    assert f"{kept} at 32 wide, timed on this CPU (" in metrics["precision_reason"]
    ruled = "bf16" if 32 >= device.CPU_BF16_MIN_WIDTH else "fp32"  # the rule's precision at 32 wide over 64 tokens
    rule = "at least 5% faster" if kept != ruled else f"the rule's ({slow} not 5% faster)"
    assert metrics["precision_reason"].endswith(rule), metrics["precision_reason"]
    assert metrics["width_by_budget"]["precision"] == kept
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vit.train"):
        resumed = run(compose_config([*two, "trainer.resume=auto"]), output_dir=tmp_path)
    kept_line, timed_line = said(caplog)
    assert "32 wide, the width of" in kept_line and f"32 wide (2 heads, {kept}): " in timed_line
    assert resumed["precision"] == kept


@pytest.mark.parametrize(
    ("seconds", "kept", "rule"),
    [
        ({"fp32": 1.0, "bf16": 0.94}, "bf16", "at least 5% faster"),
        ({"fp32": 1.0, "bf16": 0.97}, "fp32", "the rule's (bf16 not 5% faster)"),
        ({"fp32": 0.9, "bf16": 1.0}, "fp32", "the rule's (bf16 not 5% faster)"),
    ],
)
def test_the_other_precision_than_the_rules_needs_the_margin(seconds, kept, rule):
    timing = width_choice.width_timing(96, 2, (seconds, "fp32"), lambda s: 10 / s)
    assert (timing.precision, timing.batch_s, timing.rule) == (kept, seconds[kept], rule)
    assert timing.other == ({"fp32", "bf16"} - {kept}).pop() and timing.epochs == 10 / seconds[kept]
    assert width_choice.width_timing(96, 2, ({"fp32": 1.0}, "fp32"), lambda s: 10 / s).other is None


def test_min_epochs_and_long_epochs_without_widths_are_named_unused(tmp_path, caplog):
    quick = [*QUICK, "trainer.epochs=1", "trainer.width_by_budget.min_epochs=8", *LONG]
    with caplog.at_level(logging.INFO, logger="vit.train"):
        run(compose_config(quick), output_dir=tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "_epochs" in r.getMessage()]
    unused = "is unused: it weighs the widths of trainer.width_by_budget.widths, which is null (the model is "
    width = compose_config(quick).model.embed_dim
    assert lines == [
        f"trainer.width_by_budget.min_epochs=8 {unused}{width} wide as configured)",
        f"trainer.width_by_budget.long_epochs=20 {unused}{width} wide as configured)",
    ]
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.pt")["config"]
    assert saved["model"]["drop_path_rate"] != 0.2  # the long run's overrides: not applied


def test_a_checkpoint_holds_the_long_overrides_only_with_every_value_they_set():
    from vit.train.long_overrides import apply_long_overrides
    from vit.train.resume import holds_overrides, recorded_config

    cfg = compose_config(PICKING)
    overrides = tuple(cfg.trainer.width_by_budget.long_overrides)
    long = compose_config([*PICKING, *LONG_SET])
    assert holds_overrides(cfg, recorded_config(long), overrides)
    assert not holds_overrides(cfg, recorded_config(cfg), overrides)
    half = compose_config([*PICKING, LONG_SET[0]])  # drop path set, random erasing not
    assert not holds_overrides(cfg, recorded_config(half), overrides)
    apply_long_overrides(cfg, overrides)  # as a run applies them: the config then holds them
    assert cfg.model.drop_path_rate == 0.2 and cfg.data.augment.re_prob == 0.5

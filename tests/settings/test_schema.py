"""vit/settings: one declaration per config group gives Hydra's defaults, the checks and the typed object."""

import typing
from dataclasses import dataclass
from typing import ClassVar, Literal

import pytest
from omegaconf import OmegaConf
from trainer_utils import compose_config

from vit.config.value_types import check_types
from vit.data.sources.registry import DATASETS, data_defaults
from vit.errors import ConfigError
from vit.search.trial import METRICS, optimized_metric
from vit.settings import SETTINGS, RunSettings, TrainerSettings
from vit.settings.run import Metric
from vit.settings.schema import Settings, knob
from vit.settings.trainer import log_interval
from vit.tasks import TASKS, task_of


@dataclass(frozen=True)
class Inner(Settings):
    group: ClassVar[str] = "outer.inner"

    size: int | None = knob(None, low=1)


@dataclass(frozen=True)
class Outer(Settings):
    group: ClassVar[str] = "outer"

    rate: float = knob(0.5, low=0.0, high=1.0, high_open=True)
    count: int = knob(3, low=1, text="must be positive")
    kind: Literal["a", "b"] = knob("a")
    pair: tuple[float, float] | None = knob(None, low=0.0)
    label: str | None = knob(None)
    inner: Inner = knob(Inner(size=4))


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"rate": 1.0}, "outer.rate=1.0 must be in [0, 1)"),
        ({"rate": "fast"}, "outer.rate='fast' must be a number"),
        ({"rate": float("inf")}, "outer.rate=inf must be a finite number"),
        ({"rate": float("nan")}, "outer.rate=nan must be a finite number"),
        ({"pair": [0.1, float("-inf")]}, "outer.pair=[0.1, -inf] must be finite numbers"),
        ({"count": 0}, "outer.count=0 must be positive"),
        ({"count": 2.0}, "outer.count=2.0 must be an integer"),
        ({"count": True}, "outer.count=True must be an integer"),
        ({"kind": "c"}, "outer.kind='c' must be one of ('a', 'b')"),
        ({"pair": [0.1]}, "outer.pair=[0.1] must be a list of 2 numbers or null"),
        ({"pair": [0.1, -1]}, "outer.pair=[0.1, -1] must all be >= 0 or null"),
        ({"inner": {"size": 0}}, "outer.inner.size=0 must be >= 1 or null"),
        ({"inner": 3}, "outer.inner=3 must be a mapping"),
        ({"label": [1]}, "outer.label=[1] must be a string"),
    ],
)
def test_a_value_of_the_wrong_type_or_range_is_one_line_naming_the_key(node, message):
    with pytest.raises(ConfigError) as err:
        Outer.check(OmegaConf.create(node))
    assert str(err.value) == message


def test_the_typed_object_and_the_stored_defaults_come_from_the_same_declaration():
    assert Outer.defaults() == {"rate": 0.5, "count": 3, "kind": "a", "pair": None, "label": None, "inner": {"size": 4}}
    read = Outer.of(OmegaConf.create({"rate": 0, "pair": [1, 2], "label": 2024, "inner": {"size": 2}}))
    assert read == Outer(rate=0.0, pair=(1.0, 2.0), label="2024", inner=Inner(size=2))
    assert isinstance(read.rate, float) and read.count == 3  # an int read as the float it is declared; a default
    assert Outer.of(read) is read
    with pytest.raises(TypeError, match="Outer has no field for outer.rates"):
        Outer.of({"rates": 1})


def test_every_group_composes_exactly_its_declared_defaults():
    """The YAML of each group adds nothing its class does not declare (Hydra would then refuse `<group>.<key>=`
    for a key the class lacks, or keep a second default)."""
    cfg = compose_config(["task=mae"])
    for group, settings in SETTINGS.items():
        assert set(cfg[group]) == set(settings.defaults()), group
    plain = compose_config([])  # configs/trainer/default.yaml chooses nothing beyond the declaration
    assert OmegaConf.to_container(plain.trainer) == TrainerSettings.defaults()
    for name in DATASETS:
        composed = OmegaConf.to_container(compose_config([f"data={name}"]).data, resolve=True)
        assert composed == data_defaults(name), name


def test_the_roots_keys_are_declared_once_and_checked_with_the_types():
    """`task` and `optimized_metric` come from RunSettings (stored as schema/run): the composed root holds its
    defaults, a value outside the choices is one line naming the key, and the choices are what the tasks and the
    metrics' table know."""
    cfg = compose_config([])
    assert (
        {key: cfg[key] for key in RunSettings.defaults()}
        == RunSettings.defaults()
        == {
            "task": "classify",
            "optimized_metric": None,
        }
    )
    assert RunSettings.of(compose_config(["task=mae", "optimized_metric=val_loss"])) == RunSettings("mae", "val_loss")
    assert RunSettings.of({}) == RunSettings()  # a checkpoint's config from before a key: its default
    unknown_task = compose_config([])
    unknown_task.task = "segment"  # as a config file or a checkpoint may hold it (`task=` is the group's choice)
    for cfg, message in [
        (unknown_task, "task='segment' must be one of ('classify', 'mae')"),
        (compose_config(["optimized_metric=val_top7"]), "optimized_metric='val_top7' must be one of ('val_top1', "),
    ]:
        with pytest.raises(ConfigError) as err:
            check_types(cfg)
        assert str(err.value).startswith(message) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="task='segment' must be one of"):
        task_of({"task": "segment"})
    assert set(typing.get_args(typing.get_type_hints(RunSettings)["task"])) <= set(TASKS)
    for name in typing.get_args(Metric):  # every choice is a score a run returns
        assert optimized_metric(compose_config([f"optimized_metric={name}", "trainer.ema=true"])) == name
    assert METRICS["val_ema_loss"] == ("val_ema", "loss", "minimize")
    assert METRICS["val_top5"] == ("val", "top5", "maximize")


def test_log_every_auto_draws_a_curve_of_a_short_run_and_keeps_a_count_given():
    assert log_interval("auto", 1, 10) == 1  # 10 batches: each one (a 10-step run logged one point)
    assert log_interval("auto", 2, 100) == 10  # 200 batches: 20 points
    assert log_interval("auto", 100, 1000) == 50  # a long run: every 50 batches
    assert log_interval(7, 1, 10) == 7

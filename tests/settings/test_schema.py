"""vit/settings: one declaration per config group gives Hydra's defaults, the checks and the typed object."""

from dataclasses import dataclass
from typing import ClassVar, Literal

import pytest
from omegaconf import OmegaConf
from trainer_utils import compose_config

from vit.data.sources.registry import DATASETS, data_defaults
from vit.errors import ConfigError
from vit.settings import SETTINGS, TrainerSettings
from vit.settings.schema import Settings, knob


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

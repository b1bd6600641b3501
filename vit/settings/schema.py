"""One typed, frozen declaration per config group: every key's default, type and allowed values in one place.

A group's settings are a frozen dataclass whose fields are declared with `knob`:

    @dataclass(frozen=True)
    class SchedSettings(Settings):
        group: ClassVar[str] = "sched"
        name: Literal["cosine", "constant"] = knob("cosine")
        warmup_epochs: float = knob(3.0, low=0.0)

From that one declaration come
- the defaults Hydra composes (`Settings.defaults()`, stored as `<group>/schema/defaults`, and a dataset's as
  `data/schema/<name>`, by vit/config/compose.py's register_configs; the group's YAML files start from it and list
  only what they choose);
- the type and range checks of the composed config (`Settings.check(node)`): one line naming the key and value,
  `config error: sched.warmup_epochs=-1 must be >= 0`, before any data is read;
- the typed object the code reads (`Settings.of(node)`): `OptimSettings.of(cfg.optim).lr` is a float, never
  `float(cfg.optim.lr)`.

Types understood: bool, int, float (an int is taken), str, `Literal[...]` (one of the values), `X | None`,
`tuple[float, ...]` of a fixed length, `dict` (a mapping, passed through) and a sub-group (a field whose type is
another settings class). Ranges: `low` / `high`, open or closed; `choices` is the Literal's values.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf

from vit.errors import ConfigError


def knob(default: Any, *, low: float | None = None, high: float | None = None, low_open: bool = False,
         high_open: bool = False, why: str = "", text: str = "", parse: Callable[[Any], Any] | None = None
         ) -> Any:  # fmt: skip
    """A field of a settings class: its default and the range its value must lie in (`why`: a reason added to the
    range's message; `text`: the message's words instead of the generated ones, as "must be positive"). `parse`
    replaces the type and range checks for a value written in its own syntax (a duration, `auto` or a number): it
    returns the typed value or raises ConfigError naming the key."""
    meta = {"low": low, "high": high, "low_open": low_open, "high_open": high_open, "why": why, "text": text}
    meta["parse"] = parse
    if isinstance(default, Settings):
        return field(default_factory=lambda: default, metadata=meta)
    if isinstance(default, list):
        return field(default_factory=lambda: tuple(default), metadata=meta)
    if isinstance(default, dict):  # a fresh copy each time: the object is frozen, a dict in it is not
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def as_given(value: Any) -> Any:
    """A `parse` for a key whose syntax is checked where it is read (`data.holdout`, shard lists): taken as given."""
    return _plain(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    """inf and nan pass every range check (nan compares false both ways): refused as numbers here."""
    return _is_number(value) and math.isfinite(value)


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


@dataclass(frozen=True)
class Kind:
    """What a field's annotation allows, read once from the class."""

    base: Any  # bool | int | float | str | dict | tuple
    optional: bool
    choices: tuple = ()
    length: int | None = None  # tuple[float, float]: 2; None: any length

    @classmethod
    def of(cls, annotation: Any) -> Kind:
        args = typing.get_args(annotation)
        optional = False
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
            rest = [a for a in args if a is not type(None)]
            optional, annotation, args = len(rest) < len(args), rest[0], typing.get_args(rest[0])
        origin = typing.get_origin(annotation)
        if origin is Literal:
            return cls(type(args[0]), optional, choices=args)
        if origin is tuple:  # tuple[float, float]: 2; tuple[int, ...]: any length (None)
            return cls(tuple, optional, length=None if Ellipsis in args else len(args))
        if origin in (dict, Mapping):
            return cls(dict, optional)
        return cls(annotation, optional)

    @property
    def nested(self) -> bool:
        """The field is a sub-group with settings of its own (`trainer.progressive_resize`)."""
        return isinstance(self.base, type) and issubclass(self.base, Settings)

    def problem(self, value: Any) -> str | None:
        """Why `value` does not fit, as the end of the message, or None."""
        if value is None:
            return None if self.optional else "must be set"
        if self.nested:
            return None if isinstance(value, Mapping) else "must be a mapping"
        if self.choices:
            return None if value in self.choices else f"must be one of {self.choices}"
        if self.base is bool:
            return None if isinstance(value, bool) else "must be true or false"
        if self.base is int:
            return None if _is_number(value) and isinstance(value, int) else "must be an integer"
        if self.base is float:
            if _is_number(value) and not _is_finite(value):
                return "must be a finite number"
            return None if _is_number(value) else "must be a number"
        if self.base is str:  # a number is text too: a folder named 2024, a split named 2017
            return None if isinstance(value, str) or _is_number(value) else "must be a string"
        if self.base is dict:
            return None if isinstance(value, Mapping) else "must be a mapping" + (" or null" if self.optional else "")
        if self.base is tuple:
            fits = self.length is None or len(value) == self.length if isinstance(value, (list, tuple)) else False
            ok = isinstance(value, (list, tuple)) and fits and all(map(_is_number, value))
            if ok and not all(map(_is_finite, value)):
                return "must be finite numbers"
            count = "" if self.length is None else f"{self.length} "
            return None if ok else f"must be a list of {count}numbers" + (" or null" if self.optional else "")
        return None

    def convert(self, value: Any) -> Any:
        if value is None:
            return None
        if self.nested:
            return self.base.of(value)
        if self.base is float:
            return float(value)
        if self.base is str and not self.choices:
            return str(value)
        if self.base is tuple:
            return tuple(float(v) for v in value)
        if self.base is dict:
            return dict(value)
        return value


def _number(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def _stored(value: Any) -> Any:
    if isinstance(value, Settings):
        return value.values()
    return list(value) if isinstance(value, tuple) else value


def range_text(meta: Mapping) -> str:
    """A field's declared range as the messages and the docs write it: ">= 0", "< 1", "(0, 1]"; "" without one."""
    low, high = meta.get("low"), meta.get("high")
    if high is None:
        return "" if low is None else f"{'>' if meta['low_open'] else '>='} {_number(low)}"
    if low is None:
        return f"{'<' if meta['high_open'] else '<='} {_number(high)}"
    left, right = "(" if meta["low_open"] else "[", ")" if meta["high_open"] else "]"
    return f"{left}{_number(low)}, {_number(high)}{right}"


def _range_problem(meta: Mapping, value: Any, optional: bool) -> str | None:
    """The range's message for a number (each element of a list) outside it, or None."""
    low, high = meta.get("low"), meta.get("high")
    if value is None or (low is None and high is None):
        return None
    values = value if isinstance(value, (list, tuple)) else [value]
    inside = all(
        (low is None or (v > low if meta["low_open"] else v >= low))
        and (high is None or (v < high if meta["high_open"] else v <= high))
        for v in values
    )
    if inside:
        return None
    if meta.get("text"):
        return meta["text"]
    text = f"must be {'in ' if low is not None and high is not None else ''}{range_text(meta)}"
    if isinstance(value, (list, tuple)):
        text = text.replace("must be", "must all be", 1)
    text += " or null" if optional else ""
    return text + (f" ({meta['why']})" if meta.get("why") else "")


class Settings:
    """The base of a group's settings class (a frozen dataclass with `group` and `knob` fields)."""

    group: ClassVar[str]

    @classmethod
    def kinds(cls) -> dict[str, tuple[Kind, Mapping]]:
        hints = typing.get_type_hints(cls)
        return {f.name: (Kind.of(hints[f.name]), f.metadata) for f in fields(cls)}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every key with its declared default, as Hydra stores it (tuples as lists)."""
        return {f.name: _stored(f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in fields(cls)}  # fmt: skip

    def values(self) -> dict[str, Any]:
        """This object's values, as Hydra stores them (a sub-group as a mapping, tuples as lists)."""
        return {f.name: _stored(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def check(cls, node: DictConfig | Mapping | None, where: str | None = None) -> None:
        """ConfigError for the first key of the group whose value has the wrong type or lies outside its range;
        keys the class does not declare are left to Hydra's struct mode (a misspelt key is refused there).
        `where`: the group's dotted name (a sub-group's is its parent's and its own; the root's keys have none)."""
        node, where = (node if node is not None else {}), cls.group if where is None else where
        for name, (kind, meta) in cls.kinds().items():
            if name not in node:
                continue
            value, key = _plain(node[name]), f"{where}.{name}" if where else name
            if meta.get("parse"):
                meta["parse"](value)  # raises ConfigError naming the key
                continue
            if kind.nested and isinstance(value, Mapping):
                kind.base.check(value, key)
                continue
            problem = kind.problem(value) or _range_problem(meta, value, kind.optional)
            if problem:
                raise ConfigError(f"{key}={value!r} {problem}")

    @classmethod
    def of(cls, node: DictConfig | Mapping | None):
        """The typed settings of the composed group (checked first); a key missing from the node takes its default,
        a key the class does not declare is a TypeError (the YAML and the class must agree). Settings already
        read are returned as they are."""
        if isinstance(node, cls):
            return node
        cls.check(node)
        raw = {} if node is None else {k: _plain(v) for k, v in node.items()}
        kinds = cls.kinds()
        unknown = sorted(set(raw) - set(kinds))
        if unknown:
            raise TypeError(f"{cls.__name__} has no field for {cls.group}.{unknown[0]}")
        typed = {}
        for name, value in raw.items():
            kind, meta = kinds[name]
            typed[name] = meta["parse"](value) if meta.get("parse") else kind.convert(value)
        return cls(**typed)

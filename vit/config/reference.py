"""Every key of the training config with its default, what it takes, its range and its help, read from the
declarations: the settings classes of vit/settings and the models' config classes (the help is the comment beside
each field, vit/settings/help.py). From these come docs/CONFIG.md (`python scripts/config_reference.py`) and the
keys `python train.py --help` lists (vit/cli/train.py)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import textwrap
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from vit.data.sources.registry import DATASETS, data_settings
from vit.models.registry import MODELS
from vit.settings import SETTINGS, RunSettings
from vit.settings.data import DataSettings
from vit.settings.help import field_help
from vit.settings.model_start import ModelStartSettings
from vit.settings.schema import Kind, Settings, range_text

# The model group's own key that is no field of a config class.
MODEL_NAME_HELP = "the registered model (vit/models/registry.py) whose width, depth and heads the other keys start from"


@dataclass(frozen=True)
class KeyDoc:
    key: str  # as the command line writes it: trainer.budget, data.augment.re_prob
    default: Any
    takes: str  # what the value may be: "a number", "true | false", "cosine | constant", ...
    bounds: str  # the range the declaration checks: ">= 0", "(0, 1]"; "" without one
    help: str
    section: str = ""  # the heading the field is declared under (the model's: tokens, positions, ...)


def takes(kind: Kind) -> str:
    """What a value of `kind` may be, in the command line's words."""
    if kind.choices:
        text = " | ".join(str(c) for c in kind.choices)
    elif kind.nested:
        text = "a group of keys"
    else:
        words = {bool: "true | false", int: "an integer", float: "a number", str: "text", dict: "a mapping"}
        count = "" if kind.length is None else f"{kind.length} "
        text = f"a list of {count}numbers" if kind.base is tuple else words.get(kind.base, str(kind.base))
    return text + (" or null" if kind.optional and not kind.nested else "")


def bounds(meta: Mapping) -> str:
    return "its own syntax (see its help)" if meta.get("parse") else range_text(meta)


def settings_keys(cls: type[Settings], prefix: str) -> Iterator[KeyDoc]:
    """The keys of a settings class under `prefix` (`trainer.`; "" for the root's), a sub-group's keys after its
    own line."""
    helps, defaults = field_help(cls), cls.defaults()
    for name, (kind, meta) in cls.kinds().items():
        key = f"{prefix}{name}"
        if kind.nested:
            yield from settings_keys(kind.base, f"{key}.")
            continue
        yield KeyDoc(key, defaults[name], takes(kind), bounds(meta), helps[name].text, helps[name].section)


def model_keys(config: type) -> Iterator[KeyDoc]:
    """The settings of a model config class (its `init=False` fields are the family's fixed choices, no keys)."""
    helps, hints = field_help(config), typing.get_type_hints(config)
    for f in dataclasses.fields(config):
        if f.init:
            yield KeyDoc(f"model.{f.name}", f.default, takes(Kind.of(hints[f.name])), "", helps[f.name].text,
                         helps[f.name].section)  # fmt: skip


def model_families() -> dict[type, list[str]]:
    """Each model config class with the registered names built on it."""
    families: dict[type, list[str]] = {}
    for name, entry in MODELS.items():
        families.setdefault(entry.config, []).append(name)
    return families


@functools.cache
def all_keys() -> dict[str, KeyDoc]:
    """Every key any composed config can hold, by its dotted name: the root's, each group's, every dataset's and
    every model family's (a key several declare: the first declaration, its help from the first that has one)."""
    docs: dict[str, KeyDoc] = {}

    def add(keys):
        for doc in keys:
            if doc.key not in docs or (doc.help and not docs[doc.key].help):
                docs[doc.key] = doc

    add(settings_keys(RunSettings, ""))
    for group, cls in SETTINGS.items():
        add(settings_keys(cls, f"{group}."))
    add(settings_keys(DataSettings, "data."))
    for name in DATASETS:
        add(settings_keys(data_settings(name), "data."))
    add([KeyDoc("model.name", None, "a registered model", "", MODEL_NAME_HELP)])
    for config in model_families():
        add(model_keys(config))
    add(settings_keys(ModelStartSettings, "model."))
    return docs


def help_lines(values: Mapping[str, Any], width: int = 100) -> list[str]:
    """`key=value` for each composed key (dotted), its help wrapped below it."""
    docs, lines = all_keys(), []
    for key, value in values.items():
        doc = docs.get(key)
        lines.append(f"  {key}={_shown(value)}")
        text = doc.help if doc is not None else ""
        lines += textwrap.wrap(text, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return lines


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def markdown(groups: Mapping[str, list[str]]) -> str:
    """docs/CONFIG.md: the groups and their options, then every key of every group with its default, what it takes,
    its range and its help, grouped as the config tree is."""
    out = [
        "# Every setting",
        "",
        "<!-- Generated by `python scripts/config_reference.py out=docs/CONFIG.md` from the declarations in"
        " vit/settings/ and vit/models/ (the comment beside each field). tests/cli/test_config_reference.py fails"
        " when it is stale. -->",
        "",
        "After this page you know every key a run and the installed commands take: its default, what it takes, its",
        "range and what it does.",
        "",
        "Set any key on the command line: `python train.py trainer.budget=30m data.batch_size=256`. A group option",
        "(`model=vit_small`) chooses a YAML file of configs/, which may set other defaults than the ones below;",
        "`python train.py <options> --help` lists the keys with the values that command runs with.",
        "",
        "## Groups and their options",
        "",
        "| group | options |",
        "|---|---|",
        *[f"| `{group}` | {', '.join(f'`{o}`' for o in options)} |" for group, options in groups.items()],
        "",
    ]
    out += _section("The root: what a run trains for", list(settings_keys(RunSettings, "")))
    for group, cls in SETTINGS.items():
        out += _section(f"`{group}`", list(settings_keys(cls, f"{group}.")))
    out += _section("`data`: every dataset's keys (CIFAR-10's defaults)", list(settings_keys(DataSettings, "data.")))
    common = {doc.key: doc for doc in settings_keys(DataSettings, "data.")}
    for name in DATASETS:
        changed = [doc for doc in settings_keys(data_settings(name), "data.") if common.get(doc.key) != doc]
        if changed:
            out += _section(f"`data={name}`: its own keys and defaults", changed, level="###")
    start = [KeyDoc("model.name", None, "a registered model", "", MODEL_NAME_HELP)]
    out += _section("`model`: how it starts", start + list(settings_keys(ModelStartSettings, "model.")))
    seen: dict[str, Any] = {}  # each key of the families above, with its default there
    for config, names in model_families().items():
        keys = [doc for doc in model_keys(config) if doc.key not in seen or seen[doc.key] != doc.default]
        title = f"`model`: {config.__name__}'s settings ({', '.join(f'`{n}`' for n in names)})"
        if seen:
            title += ": its own, and the defaults it changes"
        seen.update({doc.key: doc.default for doc in model_keys(config) if doc.key not in seen})
        out += _section(title, keys)
    return "\n".join(out).rstrip() + "\n"


def _section(title: str, docs: list[KeyDoc], level: str = "##") -> list[str]:
    """A heading, then one table per run of keys declared under the same section heading."""
    lines = [f"{level} {title}", ""]
    for section, run in itertools.groupby(docs, key=lambda doc: doc.section):
        lines += [f"*{section}*", ""] if section else []
        lines += ["| key | default | takes | range | what it does |", "|---|---|---|---|---|"]
        for doc in run:
            cells = (f"`{doc.key}`", f"`{_shown(doc.default)}`", doc.takes, doc.bounds, doc.help)
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
        lines.append("")
    return lines


def _cell(text: str) -> str:
    """Text in a Markdown table cell: a bar would end the cell, an angle bracket would open an HTML tag."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")

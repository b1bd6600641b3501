"""Every knob described once, where it is declared: the comment beside each field is its help (vit/settings/help.py),
docs/CONFIG.md is generated from the declarations, and `train.py --help` lists each composed key with its help."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.trainer_utils import compose_config
from vit.config.reference import all_keys, model_families
from vit.data.sources.registry import DATASETS, data_settings
from vit.settings import SETTINGS, RunSettings
from vit.settings.help import FieldHelp, field_help
from vit.settings.model_start import ModelStartSettings
from vit.settings.schema import Settings

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Declared:
    width: int = 4  # the trailing comment
    # the comment above,
    # on two lines
    depth: int = 2
    # -- a section --
    rate: float = 0.1  # fmt: skip
    bare: bool = False


@dataclasses.dataclass(frozen=True)
class Redeclared(Declared):
    width: int = 8  # the subclass's reason
    depth: int = 3


def test_the_help_is_the_comment_beside_or_above_a_field_and_headings_are_sections():
    helps = field_help(Declared)
    assert helps["width"] == FieldHelp("the trailing comment", "")
    assert helps["depth"] == FieldHelp("the comment above, on two lines", "")
    assert helps["rate"] == FieldHelp("", "a section")  # a tool's directive is no help, the heading no comment
    assert helps["bare"] == FieldHelp("", "a section")
    again = field_help(Redeclared)
    assert again["width"].text == "the trailing comment (here: the subclass's reason)"
    assert again["depth"].text == "the comment above, on two lines"  # re-declared without a comment: the base's


def settings_classes() -> list[type[Settings]]:
    found, todo = [], [RunSettings, ModelStartSettings, *SETTINGS.values(), *(data_settings(n) for n in DATASETS)]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.append(cls)
            todo += [kind.base for kind, _ in cls.kinds().values() if kind.nested]
    return found


def test_every_setting_of_every_group_and_model_says_what_it_does():
    """A new field without a comment fails here, named, so --help and docs/CONFIG.md never show an empty line."""
    configs = [*settings_classes(), *model_families()]
    missing = [
        f"{cls.__name__}.{name}"
        for cls in configs
        for name, entry in field_help(cls).items()
        if not entry.text and not _nested(cls, name) and _is_setting(cls, name)
    ]
    assert not missing, f"fields without a comment: {missing}"
    assert len(configs) >= 15


def _nested(cls, name: str) -> bool:
    return issubclass(cls, Settings) and cls.kinds()[name][0].nested


def _is_setting(cls, name: str) -> bool:
    return next(f for f in dataclasses.fields(cls) if f.name == name).init


def test_docs_config_md_is_what_the_declarations_generate():
    """After changing a setting's default, range or comment: python scripts/config_reference.py out=docs/CONFIG.md"""
    from vit.cli.tool_keys import reference_page

    written = (ROOT / "docs" / "CONFIG.md").read_text()
    assert written == reference_page(), "docs/CONFIG.md is stale: run the command in this docstring"
    for key in ("trainer.budget", "data.augment.re_prob", "model.qk_scale", "model.tokens_type", "optim.lr"):
        assert f"| `{key}` |" in written
    for command in ("vit-eval", "vit-export", "vit-predict", "vit-average", "vit-shards", "vit-cifar-jpegs"):
        assert f"### `{command}`" in written


def test_a_commands_key_that_mirrors_a_setting_says_what_the_setting_says():
    """`vit-eval flip=` is trainer.eval_flip at evaluation: one declaration, so one help text and one default, in
    --help and in docs/CONFIG.md; and the commands listed are pyproject.toml's."""
    import tomllib

    from vit.cli import evaluate
    from vit.cli.args import keys_help
    from vit.cli.tool_keys import COMMANDS
    from vit.settings.trainer import TrainerSettings

    helps = field_help(TrainerSettings)
    for key, setting in (("flip", "eval_flip"), ("shift", "eval_shift"), ("threads", "threads")):
        assert evaluate.KEYS[key].help.startswith(helps[setting].text) and helps[setting].text
        assert evaluate.KEYS[key].default == str(TrainerSettings.defaults()[setting]).lower()
    listed = " ".join(keys_help(evaluate.KEYS, model_keys=True, data_keys=True).split())  # its lines unwrapped
    assert f"{helps['eval_flip'].text} (as trainer.eval_flip)" in listed
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {name: target.split(":")[0] for name, target in scripts.items() if name != "vit-train"} == COMMANDS


@pytest.mark.parametrize(
    "overrides",
    [[], ["data=imagefolder"], ["data=hf"], ["data=synthetic"], ["data=webdataset"], ["model=t2t_vit_7"],
     ["task=mae"], ["experiment=cifar10_cpu"], ["experiment=finetune"]],
)  # fmt: skip
def test_every_key_a_command_composes_has_its_help(overrides):
    """What `train.py <overrides> --help` lists: each leaf of the composed config has a declaration with help."""
    from omegaconf import OmegaConf

    from vit.cli.train import dotted_leaves

    docs = all_keys()
    leaves = dotted_leaves(OmegaConf.to_container(compose_config(overrides)), docs)
    bare = [key for key in leaves if key not in docs or not docs[key].help]
    assert not bare, f"keys without a declaration or help: {bare}"

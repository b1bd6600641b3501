"""The keys several installed commands share, declared once, and every command's keys as docs/CONFIG.md lists them.

A key that does at evaluation what a training setting does (`flip=` is `trainer.eval_flip`) takes that setting's
help and default from its declaration in vit/settings/trainer.py, so the two cannot drift apart.
"""

from __future__ import annotations

import importlib

from vit.cli.args import Key
from vit.cli.overrides import config_groups
from vit.config.reference import markdown
from vit.deploy.loaded_model import EMA_CHOICES
from vit.settings.help import field_help
from vit.settings.trainer import AMP_MODES, TrainerSettings

# The installed commands (pyproject.toml's [project.scripts], but for vit-train) and the module of each.
COMMANDS = {
    "vit-eval": "vit.cli.evaluate",
    "vit-export": "vit.cli.export",
    "vit-predict": "vit.cli.predict",
    "vit-average": "vit.cli.average",
    "vit-consolidate": "vit.cli.consolidate",
    "vit-shards": "vit.cli.shards",
    "vit-cifar-jpegs": "vit.cli.cifar_jpegs",
}


def like_setting(name: str, kind: str = "text", **checks) -> Key:
    """The key that does what `trainer.<name>` does in training: that setting's help, with its default."""
    default = TrainerSettings.defaults()[name]
    text = str(default).lower() if isinstance(default, bool) else str(default)
    return Key(f"{field_help(TrainerSettings)[name].text} (as trainer.{name})", text, kind=kind, **checks)


MODEL = Key("the registry's model for foreign weights (with model.pretrained=<timm:name | file>)")
DATA = Key("the data config for foreign weights (configs/data/<name>.yaml; default: imagefolder)")
EMA = Key("which weights of a checkpoint (see Weights above; default: auto)", choices=EMA_CHOICES)
PREPROCESS = Key("data (the data config's transform) or timm:<name> (timm's config of those weights)")
SEQ_LEN = Key("each image whole, at most this many patches, in NaFlex batches", kind="int", low=1)
AMP = Key("the precision (default: the run's trainer.amp, else auto), decided as trainer.amp is", choices=AMP_MODES)
FLIP = like_setting("eval_flip", kind="flag")
SHIFT = like_setting("eval_shift", kind="int", low=0)
THREADS = like_setting("threads")


def commands_markdown() -> list[str]:
    """docs/CONFIG.md's section on the installed commands: each one's keys, from its KEYS table."""
    out = ["## The installed commands", ""]
    out += [
        "Each reads `key=value` arguments in the grammar of train.py's overrides. `<command> --help` says the same,",
        "with examples. The commands that build a model or read data also take `model.<key>=` and `data.<key>=` for",
        "any key above.",
        "",
    ]
    for command, module in COMMANDS.items():
        keys: dict[str, Key] = importlib.import_module(module).KEYS
        out += [f"### `{command}`", "", "| key | takes | default | what it does |", "|---|---|---|---|"]
        for name, key in keys.items():
            cell = lambda text: text.replace("|", "\\|")  # noqa: E731 (a table cell: its pipes escaped)
            takes = "`" + cell(key.form(name).split("=", 1)[1]) + "`"
            default = "" if key.default is None else f"`{key.default}`"
            out.append(f"| `{name}` | {takes} | {default} | {cell(key.help)} |")
        out.append("")
    return out


def reference_page() -> str:
    """docs/CONFIG.md whole: every key of the training config, then every installed command's."""
    return markdown(config_groups()) + "\n" + "\n".join(commands_markdown()).rstrip() + "\n"

"""The trainer's command line, checked before Hydra runs it: the flags and overrides as Hydra will read them, the
group choices, the keys (with the nearest existing one for a misspelt key) and the output folder. Every bad setting
is one line on stderr and exit code 2, as the trainer's own errors are (vit/cli/train.py says why Hydra cannot do
this itself). The overrides are read with Hydra's public override grammar (OverridesParser) and the config composed
with its compose API (vit/config/compose.py)."""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import NoReturn

from vit.config.compose import CONFIG_DIR, compose
from vit.errors import ConfigError, UserError, exit_with


class CommandLineError(UserError):
    """A bad override, found before Hydra composes anything (and before torch is imported)."""

    kind = "config"


def override_keys(overrides: list[str]) -> set[str]:
    """The keys and groups an override list sets (`optim.lr=...`, `+optim.kwargs.x=1`, `optim=lion`: optim.lr,
    optim.kwargs.x, optim), read with Hydra's own override grammar."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {override.key_or_group for override in OverridesParser.create().parse_overrides(list(overrides))}


def group_options(group: str) -> list[str]:
    """The options of a config group a command line chooses from: its YAML files in configs/<group>/."""
    return sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))


def config_groups() -> dict[str, list[str]]:
    """The groups a command line chooses from (the folders of configs/ but Hydra's), each with its options."""
    groups = sorted(p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir() and p.name != "hydra")
    return {group: group_options(group) for group in groups}


def check_group_choices(args: list[str]) -> None:
    """`model=vit_huge`: Hydra would stop with exit code 1; like every other bad setting it exits 2 here, naming
    the known options. Comma lists (multirun sweeps over groups) are checked choice by choice. A group inside another
    (`optim/schema=...`, `model/shared=...`) is what that group's configs are built from, not a choice: refused."""
    for arg in args:
        group, sep, value = arg.partition("=")
        inner, _, _ = group.lstrip("+~").partition("@")
        top = inner.partition("/")[0]
        if "/" in inner and top != "hydra" and top.isidentifier():
            if not (Path(CONFIG_DIR) / top).is_dir():  # mae/schema: task=mae takes it
                exit_config_error(f"{inner} is not a config group to choose: it holds what configs are built from "
                                   "(the groups to choose from: --help)")  # fmt: skip
            known = ", ".join(group_options(top))
            exit_config_error(
                f"{inner} is not a config group to choose: it holds what the {top} configs are built from; "
                f"choose {top}=<name> ({known})"
            )
        group_dir = Path(CONFIG_DIR) / group
        if not sep or not group.isidentifier() or not group_dir.is_dir() or "(" in value:
            continue  # not a group choice (a key, hydra.*, +/~ edits), or a sweep function Hydra expands
        known = group_options(group)
        for choice in value.split(","):
            if choice not in known and not (group == "experiment" and choice == "null"):
                exit_config_error(f"{group}={choice} is not a known {group} config; known: {', '.join(known)}")


def dotted_keys(node, prefix: str = "") -> list[str]:
    """Every key path of a composed config: model.num_heads, data.augment.re_prob, ..."""
    from omegaconf import DictConfig

    keys = []
    for key in node:
        path = f"{prefix}{key}"
        keys.append(path)
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            keys.extend(dotted_keys(child, f"{path}."))
    return keys


@functools.lru_cache(maxsize=64)
def composed_keys(choices: tuple[str, ...], config_name: str):
    """(the config composed with these group choices, its dotted keys), composed once per process: a sweep's runs,
    and the commands a test checks one after another, share their choices (read only, never changed)."""
    cfg = compose(list(choices), config_name=config_name)
    return cfg, tuple(dotted_keys(cfg))


MAX_SWEEP_COMPOSITIONS = 32  # a sweep over more group combinations is checked one group at a time


# Hydra's command-line flags (`python train.py --hydra-help` lists them), as `hydra.main` reads them: the pre-check
# must see the overrides Hydra will. Hydra's own parser is private API; a flag missing here only makes the pre-check
# step aside (parse_command_line returns None) and leave the whole command line to Hydra.
HYDRA_FLAGS = [
    (("--help", "-h"), {"action": "store_true"}),
    (("--hydra-help",), {"action": "store_true"}),
    (("--version",), {"action": "store_true"}),
    (("--cfg", "-c"), {"choices": ["job", "hydra", "all"]}),
    (("--resolve",), {"action": "store_true"}),
    (("--package", "-p"), {}),
    (("--run", "-r"), {"action": "store_true"}),
    (("--multirun", "-m"), {"action": "store_true"}),
    (("--shell-completion", "-sc"), {"action": "store_true"}),
    (("--config-path", "-cp"), {}),
    (("--config-name", "-cn"), {}),
    (("--config-dir", "-cd"), {}),
    (("--experimental-rerun",), {}),
    (("--info", "-i"), {"nargs": "?", "const": "all"}),
]


def hydra_flags() -> argparse.ArgumentParser:
    """A parser of HYDRA_FLAGS and the overrides after them (`flags.overrides`)."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("overrides", nargs="*")
    for names, options in HYDRA_FLAGS:
        parser.add_argument(*names, **options)
    return parser


def parse_command_line(args: list[str]):
    """The command line as Hydra reads it: (flags, overrides), or None where Hydra itself refuses it (it then says
    why) or where the config comes from elsewhere (--config-path, --config-dir) or nothing runs (--help, --info,
    --version)."""
    import contextlib
    import io

    try:
        # Hydra says itself what is wrong with the flags when it parses them after this
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            flags, unknown = hydra_flags().parse_known_args(args)
    except (SystemExit, argparse.ArgumentError):
        return None
    if unknown or flags.version:
        return None  # a flag not listed in HYDRA_FLAGS (a newer Hydra's?): Hydra reads it and says what is wrong
    if flags.config_path or flags.config_dir or flags.help or flags.hydra_help or flags.shell_completion:
        return None
    if flags.info or flags.experimental_rerun is not None:
        return None
    if not (Path(CONFIG_DIR) / f"{flags.config_name or 'config'}.yaml").is_file():
        return None
    return flags, list(flags.overrides or [])


def parse_overrides(args: list[str]) -> list:
    """Hydra's override objects; one that does not parse exits 2 naming it (Hydra would exit 1)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = []
    for arg in args:
        try:
            parsed.extend(parser.parse_overrides([arg]))
        except OverrideParseException as err:
            reason = str(err).strip().splitlines()[0]
            exit_config_error(f"cannot parse the override {arg!r}: {reason}")
    return parsed


def group_compositions(overrides: list) -> list[list[str]] | None:
    """The group choices to compose the config with: one list for a plain run, one per combination of a sweep's
    group choices (`model=vit_tiny,t2t_vit_7` runs jobs with different keys). None: a sweep form left to Hydra."""
    import itertools

    from hydra.core.override_parser.types import ChoiceSweep, Glob, OverrideType

    fixed, swept = [], []
    for override in overrides:
        group = override.key_or_group
        group_dir = Path(CONFIG_DIR) / group
        if override.package is not None or group.startswith("hydra") or not group_dir.is_dir():
            continue
        if override.type != OverrideType.CHANGE:
            fixed.append(override.input_line)  # +group=..., ~group: as given
            continue
        value = override.value()
        if isinstance(value, ChoiceSweep):
            values = value.list
        elif isinstance(value, Glob):
            values = value.filter(group_options(group))
        elif override.is_sweep_override():
            return None  # range(...) or interval(...) over config names: Hydra's business
        else:
            values = [value]
        # `experiment=null` (no experiment) is composed as Hydra runs it, `~experiment` (see without_null_groups).
        swept.append([f"~{group}" if v is None or v == "null" else f"{group}={v}" for v in values] or [f"~{group}"])
    combos = [list(combo) for combo in itertools.product(*swept)]
    if len(combos) > MAX_SWEEP_COMPOSITIONS:  # the first choices, and each other choice of one group at a time
        base = [choices[0] for choices in swept]
        combos = [base] + [
            [*base[:i], choice, *base[i + 1 :]] for i, choices in enumerate(swept) for choice in choices[1:]
        ]
    return [[*fixed, *combo] for combo in combos]


def nearest_key(key: str, known: list[str]) -> str | None:
    """The existing key `key` most likely meant: among its siblings first, then whole paths, then the same last part
    elsewhere (`num_heads` for model.num_heads)."""
    import difflib

    parent, _, leaf = key.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
    if siblings:  # compare the last part (the shared "model." would make every key look close)
        matches = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
        close = [f"{parent}.{m}" if parent else m for m in matches]
    else:  # the parent itself is misspelt: compare whole paths
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not close:
        leaves = {k.rpartition(".")[2]: k for k in reversed(known)}
        close = [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.8)]
    return close[0] if close else None


def check_override_keys(args: list[str]) -> None:
    """`model.num_head=4`: Hydra would stop with exit code 1 and a traceback-like message; here it exits 2 naming
    the nearest existing key. The config is composed with the command line's group choices (every combination of
    a sweep's, as each of its jobs must take the key) so an experiment's or a model's own keys count. `+key=` must
    be new and `~key` must exist, as Hydra requires; `++key=`, hydra.* and `key@package` are left to Hydra."""
    from hydra.core.override_parser.types import OverrideType
    from omegaconf import OmegaConf

    command_line = parse_command_line(args)
    if command_line is None:
        return
    flags, raw = command_line
    overrides = parse_overrides(raw)
    keys = [
        o
        for o in overrides
        if o.package is None
        and o.type != OverrideType.FORCE_ADD
        and not o.key_or_group.startswith("hydra")
        and not (Path(CONFIG_DIR) / o.key_or_group).is_dir()
    ]
    compositions = group_compositions(overrides) if keys else None
    if not compositions:
        return
    absent = object()
    for choices in compositions:
        try:
            cfg, known = composed_keys(tuple(choices), flags.config_name or "config")
        except ConfigError:
            return  # a composition Hydra refuses: it says why itself
        where = f" in the sweep's run with {' '.join(choices)}" if len(compositions) > 1 else ""
        for override in keys:
            key = override.key_or_group
            exists = (
                key in known
                or OmegaConf.select(cfg, key, default=absent, throw_on_resolution_failure=False) is not absent
            )
            if override.type == OverrideType.ADD and exists:
                exit_config_error(f"{key} already exists{where}: set it with {key}=... (+ adds new keys only)")
            if exists or override.type not in (OverrideType.CHANGE, OverrideType.DEL):
                continue
            close = nearest_key(key, known)
            hint = f"; did you mean {close}?" if close else ""
            new = "" if where or override.type == OverrideType.DEL else f" (a new key would be +{key}=...)"
            exit_config_error(f"unknown key {key}{hint}{where}{new}")


def check_output_dir(args: list[str]) -> None:
    """`hydra.run.dir=<a file>`, a folder under a file, an unwritable or full disk: Hydra would stop with a
    traceback when it makes the folder; here it exits 2 with one line naming the path, before any data is read.
    A multirun checks hydra.sweep.dir; a path with interpolations (the default outputs/${now:...}) is checked up
    to its first `${`. Nothing is created (`--cfg` prints the config and writes nothing)."""
    from omegaconf import OmegaConf

    from vit.records.files import OutputError, check_run_dir

    command_line = parse_command_line(args)
    if command_line is None or command_line[0].cfg:
        return
    flags, raw = command_line
    key = "hydra.sweep.dir" if flags.multirun else "hydra.run.dir"
    given = [o.value() for o in parse_overrides(raw) if o.key_or_group == key and o.package is None]
    if given:
        value = given[-1]
    else:
        config = OmegaConf.load(Path(CONFIG_DIR) / f"{flags.config_name or 'config'}.yaml")
        value = OmegaConf.to_container(config, resolve=False).get("hydra", {}).get(key.split(".")[1], {}).get("dir")
    if not isinstance(value, str) or not value:
        return  # a sweep over run folders, or none set: Hydra's business
    path = value
    if "${" in value:  # the literal part: the folder the interpolated names will be made in
        path = os.path.dirname(value.split("${", 1)[0]) or "."
    try:
        check_run_dir(path, create=False, setting=f"{key}={value}")
    except OutputError as err:
        exit_with(err)


def exit_config_error(message: str) -> NoReturn:
    exit_with(CommandLineError(message))


def without_null_groups(args: list[str]) -> list[str]:
    """`experiment=null` (the default, written out) as `~experiment`: Hydra itself stops with a ValueError
    traceback on a null group choice from the command line."""
    out = []
    for arg in args:
        group, _, value = arg.partition("=")
        is_group = group.isidentifier() and (Path(CONFIG_DIR) / group).is_dir()
        out.append(f"~{group}" if is_group and value == "null" else arg)
    return out

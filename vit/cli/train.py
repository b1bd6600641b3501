"""`vit-train` and `python train.py`: the trainer as a Hydra app.

Before Hydra runs the training, the command line is checked here so that every bad setting (an unknown group
choice or key, an override that does not parse, an output folder that cannot be made) is one line on stderr and
exit code 2, as the trainer's own errors are. Hydra cannot do this itself: its error path (`run_and_report` in
hydra/_internal/utils.py) prints the exception's several lines and a hint about HYDRA_FULL_ERROR, and exits with
code 1 whatever went wrong, with no setting or hook to change either. So the overrides are read with Hydra's own
parsers (its argument parser and override grammar) and the config composed with its compose API, here, first;
what this adds is only the exit code, the one line and the nearest existing key.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from hydra.experimental.callback import Callback

from vit.cli.fast_exit import exit_process
from vit.engine.compose import CONFIG_DIR, compose
from vit.errors import ConfigError, UserError, exit_with


class CommandLineError(UserError):
    """A bad override, found before Hydra composes anything (and before torch is imported)."""

    kind = "config"


def train_task(cfg) -> float | None:
    """The Hydra task: run one training and return `optimized_metric` (the value a sweeper optimises); bad
    settings exit with code 2 and one line on stderr, a diverged training with code 1 (vit/cli/__init__.py). In a
    trial of an Optuna search (vit/sweeper.py) a diverged training returns NaN, which the study records as failed,
    and a trial its pruner stopped raises optuna.TrialPruned: neither ends the search. A trial stopped by a signal
    raises TrialInterrupted, which does."""
    from vit.train import run
    from vit.train.config import validate
    from vit.train.loop import NonFiniteLossError
    from vit.train.search import TrialInterrupted, is_trial, optimized_metric

    logging.getLogger("vit").setLevel(logging.INFO)
    try:
        metric = optimized_metric(cfg)
        # The settings first (run() checks them again, in milliseconds): the warnings below speak of a run that can
        # start, and a refused one says only why.
        validate(cfg)
        warn_kept_optimizer_settings(cfg)
        metrics = run(cfg)
    except UserError as err:  # a setting, the data, a checkpoint, the run folder: "<kind> error: ..." and exit 2
        forget_refused_run(err)
        exit_with(err)
    except NonFiniteLossError as err:  # "training stopped: ..." and exit 1
        if is_trial(cfg):
            print(f"training stopped: {err}", file=sys.stderr, flush=True)
            return float("nan")
        exit_with(err)
    if is_trial(cfg) and metrics.get("stopped_by_signal"):
        raise TrialInterrupted(metrics["stopped_by_signal"])
    pruned = (metrics.get("search") or {}).get("pruned_after_epoch")
    if pruned is not None:
        import optuna

        raise optuna.TrialPruned(f"pruned after epoch {pruned}")
    return (metrics.get("final") or {}).get(metric)


@dataclasses.dataclass(frozen=True)
class NewFolders:
    """What existed, before Hydra made anything, of the folder a command's runs go to (hydra.run.dir, or a sweep's
    hydra.sweep.dir holding one folder per job)."""

    top: str  # the folder, absolute
    existed: bool
    entries: frozenset[str]  # a sweep folder that existed: what it held (an earlier sweep's job folders)
    keep: str  # its nearest ancestor that existed: emptied parents are removed up to it, never it


_NEW_FOLDERS: dict[str, NewFolders] = {}  # by `top`, noted by RunFolders for this command's runs


def _note_folder(path) -> None:
    top = os.path.abspath(str(path))
    keep = Path(top)
    while not keep.exists() and keep != keep.parent:
        keep = keep.parent
    entries = frozenset(os.listdir(top)) if os.path.isdir(top) else frozenset()
    _NEW_FOLDERS[top] = NewFolders(top, os.path.exists(top), entries, str(keep))


class RunFolders(Callback):
    """A Hydra callback (configs/config.yaml: hydra.callbacks.run_folders): before Hydra makes a run's folder, it
    notes whether the folder, or a sweep's, existed, so that a run refused before it wrote anything of its own can
    take away the folder made for it (forget_refused_run) and never one the user named that was there before. The
    folder's name is resolved here from the config the run then uses, so the ${now:...} in it is the same."""

    def on_run_start(self, config, **kwargs) -> None:
        _note_folder(config.hydra.run.dir)

    def on_multirun_start(self, config, **kwargs) -> None:
        _note_folder(config.hydra.sweep.dir)

    def on_run_end(self, config, **kwargs) -> None:
        _NEW_FOLDERS.clear()

    def on_multirun_end(self, config, **kwargs) -> None:
        _NEW_FOLDERS.clear()


def forget_refused_run(err: BaseException) -> None:
    """A run refused (a setting, the data, a checkpoint) leaves no folder behind when it wrote nothing of its own:
    Hydra made the folder and wrote its config copy (.hydra/) and the log before the task started, so without this
    every refused command left an outputs/<date>/<time>/ whose log does not even hold the error. The folder goes
    where it holds only those and this command made it (RunFolders), and so do the parents it emptied that this
    command made (outputs/<date>/, a sweep's folder holding only its multirun.yaml). A folder kept, holding
    checkpoints, TensorBoard events or metrics, or the user's own from before, gets the error line in its log."""
    import shutil

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from vit.errors import one_line

    noted_folders = list(_NEW_FOLDERS.values())
    _NEW_FOLDERS.clear()  # this command's: a later run in this process (a test, a notebook) notes its own
    if not HydraConfig.initialized() or not noted_folders:
        return
    hydra_cfg = HydraConfig.get()
    output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None, throw_on_missing=False)
    if not output_dir:  # Hydra's compose API sets its config without a folder: no run of a command
        return
    folder = os.path.abspath(output_dir)
    noted = next((n for n in noted_folders if folder == n.top or folder.startswith(n.top + os.sep)), None)
    log_name = f"{hydra_cfg.job.name}.log"
    own = {log_name, *([hydra_cfg.output_subdir] if hydra_cfg.output_subdir else [])}  # what Hydra wrote there
    made = noted is not None and not noted.existed
    if noted is not None and noted.existed and folder != noted.top:  # a job's folder in a sweep folder of before
        made = os.path.relpath(folder, noted.top).split(os.sep)[0] not in noted.entries
    if made and os.path.isdir(folder) and set(os.listdir(folder)) <= own:
        _close_logs_in(folder)
        shutil.rmtree(folder, ignore_errors=True)
        _remove_emptied_parents(Path(folder).parent, noted)
        return
    for handler in _logs_in(folder):  # kept: the log says why the run stopped, as the console did
        handler.handle(logging.makeLogRecord({"name": "vit.train", "levelno": logging.ERROR,
                                              "levelname": "ERROR", "msg": one_line(err)}))  # fmt: skip


def _logs_in(folder: str) -> list[logging.FileHandler]:
    handlers = logging.getLogger().handlers
    return [h for h in handlers if isinstance(h, logging.FileHandler) and os.path.dirname(h.baseFilename) == folder]


def _close_logs_in(folder: str) -> None:
    for handler in _logs_in(folder):
        logging.getLogger().removeHandler(handler)
        handler.close()


def _remove_emptied_parents(parent: Path, noted: NewFolders) -> None:
    """The folders above a removed run folder that this command made and that are now empty, up to the nearest one
    that existed before; a sweep's folder counts as empty holding only its multirun.yaml (Hydra's record of the
    sweep, written before the first job)."""
    while str(parent) != noted.keep and parent != parent.parent and parent.is_dir():
        entries = set(os.listdir(parent))
        if str(parent) == noted.top and not noted.existed:
            entries -= {"multirun.yaml"}
        if entries:
            return
        (parent / "multirun.yaml").unlink(missing_ok=True)
        parent.rmdir()
        parent = parent.parent


def override_keys(overrides: list[str]) -> set[str]:
    """The keys and groups an override list sets (`optim.lr=...`, `+optim.kwargs.x=1`, `optim=lion`: optim.lr,
    optim.kwargs.x, optim), read with Hydra's own override grammar."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {override.key_or_group for override in OverridesParser.create().parse_overrides(list(overrides))}


def warn_kept_optimizer_settings(cfg) -> None:
    """`optim.name=lion` beside the default `optim=adamw` trains Lion with AdamW's rate and weight decay: one warning
    line naming them and the group to use (vit/train/optimizer.py: kept_settings_warning), unless the command line
    set them. Which group the run composed and which keys the user set are Hydra's record of this job: its choices
    and its overrides (a sweep's or a search's values among them). Rank 0 alone speaks under torchrun."""
    from hydra.core.hydra_config import HydraConfig

    from vit.engine.distributed import env_rank
    from vit.train.optimizer import kept_settings_warning

    if env_rank() != 0 or not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    line = kept_settings_warning(
        cfg.optim, hydra_cfg.runtime.choices.get("optim"), override_keys(hydra_cfg.overrides.task)
    )
    if line:
        logging.getLogger("vit.train").warning(line)


def user_config_groups() -> str:
    """The config groups `--help` lists (configs/config.yaml's help template, `${vit_config_groups:}`), with their
    options, one line each as Hydra writes them: the groups a command line chooses from, the folders of configs/
    and their YAML files. Hydra's own list ($APP_CONFIG_GROUPS) also holds every group inside another, which no
    command chooses: the settings' declared defaults and the models' (optim/schema, data/schema, model/registry:
    hydra_plugins/) and the pieces the model configs are built from (model/shared). Read from the folders, not
    through Hydra's config loader, which copies every stored config once per group it is asked about (seconds)."""
    groups = sorted(p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir() and p.name != "hydra")
    return "\n".join(f"{group}: {', '.join(group_options(group))}" for group in groups)


def group_options(group: str) -> list[str]:
    """The options of a config group a command line chooses from: its YAML files in configs/<group>/."""
    return sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))


HELP_FLAGS = {"--help", "-h"}


def print_help(args: list[str]) -> bool:
    """`--help` (with overrides, and `--resolve`), rendered from configs/config.yaml's help template as Hydra renders
    it, but without Hydra's $APP_CONFIG_GROUPS and $HYDRA_CONFIG_GROUPS, which Hydra builds for every help whether
    the template uses them or not (a copy of every stored config per group: 10 s and more on a 2-core CPU). False
    where the command is not an app help (other flags go to Hydra)."""
    flags = {arg for arg in args if arg.startswith("-")}
    if not flags & HELP_FLAGS or not flags <= HELP_FLAGS | {"--resolve"}:
        return False
    import string

    from omegaconf import OmegaConf, open_dict

    OmegaConf.register_new_resolver("vit_config_groups", user_config_groups, replace=True)
    try:
        cfg = compose([arg for arg in args if not arg.startswith("-")], with_hydra=True)
    except ConfigError as err:
        _exit_config_error(str(err))
    template = cfg.hydra.help.template  # its interpolations resolved: the header, the groups, the footer
    with open_dict(cfg):
        del cfg["hydra"]  # the job's config, as Hydra's help shows it
    print(string.Template(template).safe_substitute(CONFIG=OmegaConf.to_yaml(cfg, resolve="--resolve" in flags)))
    return True


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
                _exit_config_error(f"{inner} is not a config group to choose: it holds what configs are built from "
                                   "(the groups to choose from: --help)")  # fmt: skip
            known = ", ".join(group_options(top))
            _exit_config_error(
                f"{inner} is not a config group to choose: it holds what the {top} configs are built from; "
                f"choose {top}=<name> ({known})"
            )
        group_dir = Path(CONFIG_DIR) / group
        if not sep or not group.isidentifier() or not group_dir.is_dir() or "(" in value:
            continue  # not a group choice (a key, hydra.*, +/~ edits), or a sweep function Hydra expands
        known = group_options(group)
        for choice in value.split(","):
            if choice not in known and not (group == "experiment" and choice == "null"):
                _exit_config_error(f"{group}={choice} is not a known {group} config; known: {', '.join(known)}")


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


def parse_command_line(args: list[str]):
    """The command line as Hydra reads it: (flags, overrides), or None where Hydra itself refuses it (it then says
    why) or where the config comes from elsewhere (--config-path, --config-dir) or nothing runs (--help, --info,
    --version)."""
    import contextlib
    import io

    from hydra._internal.utils import get_args_parser  # the parser hydra.main itself reads the command line with

    try:
        # Hydra says itself what is wrong with the flags, and prints --version, when it parses them after this
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            flags, unknown = get_args_parser().parse_known_args(args)
    except SystemExit:
        return None
    if unknown:
        return None  # a flag Hydra does not know: Hydra says so (--version printed and exited above)
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
            _exit_config_error(f"cannot parse the override {arg!r}: {reason}")
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
                _exit_config_error(f"{key} already exists{where}: set it with {key}=... (+ adds new keys only)")
            if exists or override.type not in (OverrideType.CHANGE, OverrideType.DEL):
                continue
            close = nearest_key(key, known)
            hint = f"; did you mean {close}?" if close else ""
            new = "" if where or override.type == OverrideType.DEL else f" (a new key would be +{key}=...)"
            _exit_config_error(f"unknown key {key}{hint}{where}{new}")


def check_output_dir(args: list[str]) -> None:
    """`hydra.run.dir=<a file>`, a folder under a file, an unwritable or full disk: Hydra would stop with a
    traceback when it makes the folder; here it exits 2 with one line naming the path, before any data is read.
    A multirun checks hydra.sweep.dir; a path with interpolations (the default outputs/${now:...}) is checked up
    to its first `${`. Nothing is created (`--cfg` prints the config and writes nothing)."""
    from omegaconf import OmegaConf

    from vit.engine.files import OutputError, check_run_dir

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


def _exit_config_error(message: str) -> NoReturn:
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


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    from vit.engine.distributed import worker_hydra_overrides
    from vit.train.run import count_from_process_start

    count_from_process_start()  # this process exists for the run: its wall time counts from the process start

    OmegaConf.register_new_resolver("vit_config_groups", user_config_groups, replace=True)  # for --help
    _NEW_FOLDERS.clear()  # RunFolders notes this command's folders
    check_group_choices(sys.argv[1:])
    sys.argv[1:] = without_null_groups(sys.argv[1:])
    check_override_keys(sys.argv[1:])
    check_output_dir(sys.argv[1:])
    if print_help(sys.argv[1:]):
        return
    sys.argv.extend(worker_hydra_overrides())  # torchrun ranks > 0: no config copy or log file of their own
    hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")(train_task)()


def console() -> NoReturn:
    """`vit-train` and `python train.py`: `main`, then the process ends at once (vit/cli/fast_exit.py), so a run's
    wall time and its trainer.budget end with the process. Tests call `main` in their own process instead."""
    try:
        main()
    except SystemExit as done:  # a refused setting (exit 2), a diverged run (1), --help, Hydra's own exits
        exit_process(done.code)
    exit_process(0)

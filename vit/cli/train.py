"""`vit-train` and `python train.py`: the trainer as a Hydra app.

Before Hydra runs the training, the command line is checked here so that every bad setting (an unknown group
choice or key, an override that does not parse, an output folder that cannot be made) is one line on stderr and
exit code 2, as the trainer's own errors are. Hydra cannot do this itself: its error path (`run_and_report` in
hydra/_internal/utils.py) prints the exception's several lines and a hint about HYDRA_FULL_ERROR, and exits with
code 1 whatever went wrong, with no setting or hook to change either. So the command line is read as Hydra will
read it (its flags, its public override grammar) and the config composed with its compose API first, in
vit/cli/overrides.py; what this adds is only the exit code, the one line and the nearest existing key.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from hydra.experimental.callback import Callback

from vit.cli.fast_exit import exit_process
from vit.cli.overrides import (
    check_group_choices,
    check_output_dir,
    check_override_keys,
    exit_config_error,
    group_options,
    override_keys,
    without_null_groups,
)
from vit.config.compose import CONFIG_DIR, compose, register_configs
from vit.errors import ConfigError, UserError, exit_with


def train_task(cfg) -> float | None:
    """The Hydra task: run one training and return `optimized_metric` (the value a sweeper optimises); bad
    settings exit with code 2 and one line on stderr, a diverged training with code 3 (vit/cli/__init__.py). In a
    trial of an Optuna search (vit/search/sweeper.py) a diverged training returns NaN, which the study records as
    failed, and a trial its pruner stopped raises optuna.TrialPruned: neither ends the search. A trial stopped by a
    signal raises TrialInterrupted, which does. A job of a sweep (`-m`) that fails either way is noted in its
    folder and the sweep goes on with its next job (fail_job), then exits with the failure's code (SweepEnd)."""
    from vit.search.trial import TrialInterrupted, is_trial, optimized_metric
    from vit.train import run
    from vit.train.config import validate
    from vit.train.step_parts import TrainingDiverged

    logging.getLogger("vit").setLevel(logging.INFO)
    try:
        metric = optimized_metric(cfg)
        # The settings first (run() checks them again, in milliseconds): the warnings below speak of a run that can
        # start, and a refused one says only why.
        keep_given_width(cfg)  # before the checks: the recipe's widths need not fit a width the command line gives
        validate(cfg)
        warn_kept_optimizer_settings(cfg)
        metrics = run(cfg)
    except UserError as err:  # a setting, the data, a checkpoint, the run folder: "<kind> error: ..." and exit 2
        if in_sweep(cfg):
            return fail_job(err)
        forget_refused_run(err)
        exit_with(err)
    except TrainingDiverged as err:  # "training stopped: ..." and exit 3
        if in_sweep(cfg):
            return fail_job(err)
        log_in_run_folder(err)
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


FAILED_FILE = "failed.json"  # in a sweep job's folder: why it failed (scripts/summarize_runs.py lists it)


def in_sweep(cfg) -> bool:
    """A job of `train.py -m` under any launcher, but not a trial of a search, whose study records its failures."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from vit.search.trial import is_trial

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN and not is_trial(cfg)


def fail_job(err: BaseException) -> None:
    """A failed job of a sweep: its line on stderr and in its train.log, and FAILED_FILE in its folder (the exit
    code, the line, the job's overrides). Nothing is raised: the launcher goes on with the sweep's next job (one
    refused budget ended a sweep of three before), and SweepEnd exits with the code once every job has run."""
    import json

    from hydra.core.hydra_config import HydraConfig

    from vit.errors import one_line

    line = one_line(err)
    print(line, file=sys.stderr, flush=True)
    log_in_run_folder(err)
    hydra_cfg = HydraConfig.get()
    record = {
        "job": hydra_cfg.job.num,
        "exit_code": getattr(err, "exit_code", 2),
        "line": line,
        "overrides": list(hydra_cfg.overrides.task),
    }
    folder = Path(hydra_cfg.runtime.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FAILED_FILE).write_text(json.dumps(record, indent=1) + "\n")


def written_since(sweep_dir: Path, name: str, since: float) -> list[Path]:
    """The files called `name` below `sweep_dir` written from `since` on: this sweep's (a folder reused by an
    earlier sweep keeps that sweep's files)."""
    return [p for p in sweep_dir.glob(f"**/{name}") if p.stat().st_mtime >= since]


class SweepEnd(Callback):
    """A Hydra callback (configs/config.yaml: hydra.callbacks.sweep_end): after a sweep's last job, the jobs that
    failed (fail_job), one line each, and the exit code of the first; a sweep whose jobs all ran exits 0. When
    every job failed with the same line, the setting is bad for the whole sweep, not for a job: each job said it
    once already, and the folders made for them that hold nothing else go, as a refused run's do."""

    def on_multirun_start(self, config, **kwargs) -> None:
        import time

        self.started = time.time() - 1.0  # file times are whole seconds on some file systems
        top = os.path.abspath(str(config.hydra.sweep.dir))
        self.noted = _NEW_FOLDERS.get(top)  # RunFolders, before this callback, noted what existed

    def on_multirun_end(self, config, **kwargs) -> None:
        import json

        sweep_dir, since = Path(str(config.hydra.sweep.dir)), getattr(self, "started", 0.0)
        failed = written_since(sweep_dir, FAILED_FILE, since)
        failures = sorted((json.loads(p.read_text()) for p in failed), key=lambda record: record["job"])
        if not failures:
            return
        subdir = config.hydra.output_subdir or ".hydra"  # where Hydra writes each job's config.yaml
        jobs = [p.parent for p in written_since(sweep_dir, "config.yaml", since) if p.parent.name == subdir]
        if len(failures) == len(jobs) and len({record["line"] for record in failures}) == 1:
            self.forget([p.parent for p in failed], config.hydra)
            raise SystemExit(failures[0]["exit_code"])
        jobs_failed = f"{len(failures)} job{'s' * (len(failures) > 1)} failed"
        print(f"sweep: {jobs_failed} in {sweep_dir} (the others ran; python scripts/summarize_runs.py <that folder> "
              "tables them):", file=sys.stderr)  # fmt: skip
        for record in failures:
            print(f"  job {record['job']} ({' '.join(record['overrides'])}): {record['line']}", file=sys.stderr)
        sys.stderr.flush()
        raise SystemExit(failures[0]["exit_code"])

    def forget(self, jobs: list[Path], hydra_cfg) -> None:
        """The job folders this command made that hold only what Hydra wrote (as forget_refused_run counts it) and
        FAILED_FILE, and the parents this command made that they leave empty."""
        import shutil

        noted = getattr(self, "noted", None)
        if noted is None:
            return
        before = noted.entries if noted.existed else frozenset()
        subdir = [hydra_cfg.output_subdir] if hydra_cfg.output_subdir else []
        own = {f"{hydra_cfg.job.name}.log", FAILED_FILE, *subdir}
        for job in map(os.path.abspath, jobs):
            made = Path(job).relative_to(noted.top).parts[0] not in before
            if made and set(os.listdir(job)) <= own:
                _close_logs_in(job)
                shutil.rmtree(job, ignore_errors=True)
        _remove_emptied_parents(Path(noted.top), noted)


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
    log_in_run_folder(err)  # kept: the log says why the run stopped, as the console did


def log_in_run_folder(err: BaseException) -> None:
    """The line that ends a run (`one_line(err)`) written to the run folder's log (train.log) too: on the console
    alone, it was gone with the terminal. Not through the "vit.train" logger, whose console handler would print it
    a second time beside exit_with's line on stderr."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from vit.errors import one_line

    if not HydraConfig.initialized():
        return
    output_dir = OmegaConf.select(HydraConfig.get(), "runtime.output_dir", default=None, throw_on_missing=False)
    if not output_dir:
        return
    for handler in _logs_in(os.path.abspath(output_dir)):
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


def warn_kept_optimizer_settings(cfg) -> None:
    """`optim.name=lion` beside the default `optim=adamw` trains Lion with AdamW's rate and weight decay: one warning
    line naming them and the group to use (vit/train/optimizer.py: kept_settings_warning), unless the command line
    set them. Which group the run composed and which keys the user set are Hydra's record of this job: its choices
    and its overrides (a sweep's or a search's values among them). Rank 0 alone speaks under torchrun."""
    from hydra.core.hydra_config import HydraConfig

    from vit.runtime.distributed import env_rank
    from vit.train.optimizer import kept_settings_warning

    if env_rank() != 0 or not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    line = kept_settings_warning(
        cfg.optim, hydra_cfg.runtime.choices.get("optim"), override_keys(hydra_cfg.overrides.task)
    )
    if line:
        logging.getLogger("vit.train").warning(line)


def keep_given_width(cfg) -> None:
    """A width the command line gives (model.embed_dim or model.num_heads) is trained as given: the recipe's choice
    among widths (trainer.width_by_budget.widths) is turned off, one line saying so; both given is refused."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from vit.runtime.distributed import env_rank

    widths = (cfg.trainer.get("width_by_budget") or {}).get("widths")
    if widths is None or not HydraConfig.initialized():
        return
    given = override_keys(HydraConfig.get().overrides.task)
    fixed = sorted(key for key in ("model.embed_dim", "model.num_heads") if key in given)
    if not fixed:
        return
    if {"trainer.width_by_budget.widths", "trainer.width_by_budget"} & given:
        raise ConfigError(
            f"{fixed[0]}={OmegaConf.select(cfg, fixed[0])} fixes the width and trainer.width_by_budget.widths="
            f"{list(widths)} picks it: give one of them"
        )
    setting = cfg.trainer.width_by_budget
    long = setting.get("long_epochs")
    also = f", and train with {list(setting.long_overrides)} from {long:g} epochs" if long is not None else ""
    # the long run's overrides come with the width's timing: off with it
    setting.widths, setting.long_epochs, setting.long_overrides = None, None, []
    if env_rank() == 0:
        logging.getLogger("vit.train").info(
            "trainer.width_by_budget: off, the command line gives %s; the recipe would pick among %s wide%s",
            " ".join(f"{key}={OmegaConf.select(cfg, key)}" for key in fixed),
            ", ".join(map(str, widths)),
            also,
        )


def user_config_groups() -> str:
    """The config groups `--help` lists (configs/config.yaml's help template, `${vit_config_groups:}`), with their
    options, one line each as Hydra writes them: the groups a command line chooses from, the folders of configs/
    and their YAML files. Hydra's own list ($APP_CONFIG_GROUPS) also holds every group inside another, which no
    command chooses: the settings' declared defaults and the models' (optim/schema, data/schema, model/registry:
    vit/config/compose.py's register_configs) and the pieces the model configs are built from (model/shared). Read
    from the folders, not through Hydra's config loader, which copies every stored config once per group it is
    asked about (seconds)."""
    groups = sorted(p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir() and p.name != "hydra")
    return "\n".join(f"{group}: {', '.join(group_options(group))}" for group in groups)


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
        exit_config_error(str(err))
    template = cfg.hydra.help.template  # its interpolations resolved: the header, the groups, the footer
    with open_dict(cfg):
        del cfg["hydra"]  # the job's config, as Hydra's help shows it
    print(string.Template(template).safe_substitute(CONFIG=OmegaConf.to_yaml(cfg, resolve="--resolve" in flags)))
    return True


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    from vit.runtime.distributed import worker_hydra_overrides
    from vit.train.run import count_from_process_start

    count_from_process_start()  # this process exists for the run: its wall time counts from the process start

    OmegaConf.register_new_resolver("vit_config_groups", user_config_groups, replace=True)  # for --help
    register_configs()  # the groups' defaults from the code, before Hydra composes anything
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

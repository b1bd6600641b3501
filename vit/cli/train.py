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

import logging
import sys
from collections.abc import Container
from typing import NoReturn

from vit.cli.fast_exit import exit_process
from vit.cli.overrides import (
    check_group_choices,
    check_output_dir,
    check_override_keys,
    config_groups,
    exit_config_error,
    override_keys,
    without_null_groups,
)
from vit.cli.run_folders import NEW_FOLDERS, forget_refused_run, log_in_run_folder
from vit.cli.sweeps import fail_job, in_sweep
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
    return "\n".join(f"{group}: {', '.join(options)}" for group, options in config_groups().items())


HELP_FLAGS = {"--help", "-h"}


def print_help(args: list[str]) -> bool:
    """`--help` (with overrides, and `--resolve`), rendered from configs/config.yaml's help template as Hydra renders
    it, with every key of the composed config, its value and its help in place of Hydra's config dump. Hydra's
    $APP_CONFIG_GROUPS and $HYDRA_CONFIG_GROUPS are left out: Hydra builds them for every help whether the template
    uses them or not (a copy of every stored config per group: seconds). False where the command is not an app
    help (other flags go to Hydra)."""
    flags = {arg for arg in args if arg.startswith("-")}
    if not flags & HELP_FLAGS or not flags <= HELP_FLAGS | {"--resolve"}:
        return False
    import string

    from omegaconf import OmegaConf, open_dict

    from vit.config.reference import all_keys, help_lines

    OmegaConf.register_new_resolver("vit_config_groups", user_config_groups, replace=True)
    try:
        cfg = compose([arg for arg in args if not arg.startswith("-")], with_hydra=True)
    except ConfigError as err:
        exit_config_error(str(err))
    template = cfg.hydra.help.template  # its interpolations resolved: the header, the groups, the footer
    with open_dict(cfg):
        del cfg["hydra"]  # the job's config
    values = dotted_leaves(OmegaConf.to_container(cfg, resolve="--resolve" in flags), all_keys())
    keys = "\n".join(help_lines(values))  # each key with its value and its help (vit/config/reference.py)
    print(string.Template(template).safe_substitute(KEYS=keys))
    return True


def dotted_leaves(node: dict, declared: Container[str] = (), prefix: str = "") -> dict:
    """{"trainer": {"budget": None}} -> {"trainer.budget": None}: every value that is not a mapping, by its key; a
    key `declared` as one setting stays whole, its mapping its value (`optim.kwargs`)."""
    out = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and name not in declared:
            out.update(dotted_leaves(value, declared, f"{name}."))
        else:
            out[name] = value
    return out


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    from vit.runtime.distributed import worker_hydra_overrides
    from vit.train.run import count_from_process_start

    count_from_process_start()  # this process exists for the run: its wall time counts from the process start

    OmegaConf.register_new_resolver("vit_config_groups", user_config_groups, replace=True)  # for --help
    register_configs()  # the groups' defaults from the code, before Hydra composes anything
    NEW_FOLDERS.clear()  # RunFolders notes this command's folders
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

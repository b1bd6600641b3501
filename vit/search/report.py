"""Reading an Optuna search (vit/search/sweeper.py): its study's trials, the best one, the parameters' importances and
the compute its pruner saved, for scripts/summarize_runs.py."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import yaml

from vit.search.study import counted_trials

STUDY_FILE = "optuna.db"  # the search configs' default storage: sqlite:///<the search's folder>/optuna.db


@dataclass
class TrialRow:
    number: int
    state: str  # complete | pruned | fail | running | waiting
    value: float | None
    params: dict
    epochs_run: int | None  # trained epochs (a pruned trial stops after its last report)
    epochs_asked: int | None
    rung: int | None = None  # its rung in a successive-halving search (hydra.sweeper.fidelity), else None


def study_url(folder: Path, storage: str | None) -> str | None:
    """`storage` as given, else the SQLite file the search configs keep in the search's folder (None: none there)."""
    if storage:
        return storage
    path = Path(folder) / STUDY_FILE
    return f"sqlite:///{path.resolve()}" if path.is_file() else None


def load_studies(url: str) -> list:
    """Every study in the database at `url`."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url, skip_table_creation=True)  # reading: never create tables
    names = [summary.study_name for summary in optuna.get_all_study_summaries(storage)]
    return [optuna.load_study(study_name=name, storage=storage) for name in names]


def metric_name(study) -> str:
    names = study.metric_names
    return names[0] if names else "objective"


def trial_rows(study, folder: Path) -> list[TrialRow]:
    """One row per trial. Epochs run come from the trial's metrics.json where its folder is at hand (the run folder
    the trial recorded, else <folder>/trial_<n>), else from its last reported epoch."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        run_dir = Path(trial.user_attrs.get("run_dir") or Path(folder) / f"trial_{trial.number}")
        metrics = _json(run_dir / "metrics.json")
        asked = trial.user_attrs.get("epochs") or _epochs_asked(run_dir)
        state = trial.state.name.lower()
        if metrics.get("epochs_done") is not None:
            run = int(metrics["epochs_done"])
        elif state == "complete":
            run = asked
        else:
            run = max(trial.intermediate_values, default=None)
        rung = trial.user_attrs.get("rung")
        rows.append(TrialRow(trial.number, state, trial.value, dict(trial.params), run, asked, rung))
    return rows


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _epochs_asked(run_dir: Path) -> int | None:
    try:
        config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
        return int(config["trainer"]["epochs"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None


def importances(study) -> dict[str, float] | None:
    """Optuna's parameter importances (fANOVA) over the complete trials; None where it cannot give them (fewer
    than two complete trials, or one value only)."""
    import optuna

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError):
        return None


def min_trials_for_importance(num_params: int) -> int:
    """Complete trials below which the importances are not shown: fANOVA fits a random forest of the objective over
    the parameters, and with fewer trials than two per parameter (or ten) it splits on noise (two tied trials gave
    every one of 8 parameters 0.125)."""
    return max(10, 2 * num_params)


def first_rung(study):
    """A successive-halving study's first rung as a study of its own (in memory): the trials that ran every
    setting at one length, which alone can be compared for the importances; the study itself where it has no
    rungs."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    if not any("rung" in t.user_attrs for t in trials):
        return study
    alone = optuna.create_study(direction=study.direction)
    alone.add_trials([t for t in trials if t.user_attrs.get("rung", 0) == 0 and t.state.is_finished()])
    return alone


def importance_lines(study) -> list[str]:
    """The parameters' importances with the count of trials behind them, or one line saying why there are none.
    In a successive-halving search, over its first rung only."""
    import optuna

    study = first_rung(study)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    keys = sorted({k for r in complete for k in r.params})
    needed = min_trials_for_importance(len(keys))
    if len(complete) < needed:
        return [
            f"Parameter importances: not shown, {len(complete)} complete trials (at least {needed} are needed for "
            f"{len(keys)} parameters).",
            "",
        ]
    if len({r.value for r in complete}) == 1:
        return [f"Parameter importances: not shown, the {len(complete)} complete trials all scored the same.", ""]
    found = importances(study)
    if not found:
        return []
    lines = [f"Parameter importances (Optuna's fANOVA over the {len(complete)} complete trials):", ""]
    lines += ["| parameter | importance |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in found.items()]
    return [*lines, ""]


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "null" if value is None else str(value)


def search_report(study, folder: Path) -> str:
    """The study as Markdown: what it is, trials run and pruned, the compute pruning saved, the best trial, the
    parameters' importances and the trials table."""
    rows = trial_rows(study, folder)
    metric = metric_name(study)
    states = {s: sum(r.state == s for r in rows) for s in ("complete", "pruned", "fail", "running", "waiting")}
    counts = ", ".join(f"{n} {s}" for s, n in states.items() if n)
    aim = f"{study.direction.name.lower()} {metric}"
    lines = [f"## Study {study.study_name!r}: {len(rows)} trials ({counts}), {aim}", ""]
    counted = {t.number for t in counted_trials(study)}
    ended = [r for r in rows if r.number in counted]
    if ended and all(r.epochs_run is not None and r.epochs_asked for r in ended):
        run, asked = sum(r.epochs_run for r in ended), sum(r.epochs_asked for r in ended)
        lines.append(
            f"Trial-epochs run: {run} of {asked} asked by the {len(ended)} trials the study counts "
            f"({100 * (1 - run / asked):.0f}% saved by pruning)."
        )
        others = [r for r in rows if r.state == "fail" and r.number not in counted]
        if others:
            lost = ", ".join(f"trial {r.number} ({_value(r.epochs_run)} epochs)" for r in others)
            lines.append(f"Not counted, run again or refused for a bad setting: {lost}.")
        lines.append("")
    complete = [r for r in rows if r.state == "complete"]
    rungs = any(r.rung is not None for r in rows)
    if complete:
        where = ""
        if rungs:  # the best of the highest rung: only runs of one length are compared
            top = max(r.rung or 0 for r in complete)
            ranked = sorted((r for r in complete if (r.rung or 0) == top), key=lambda r: r.value)
            best = ranked[-1] if study.direction.name.lower() == "maximize" else ranked[0]
            where = f" (rung {top})"
        else:
            best = study.best_trial
        shown = " ".join(f"{k}={_value(v)}" for k, v in best.params.items())
        lines += [f"Best trial: {best.number}{where}, {metric} {best.value:.2f}, with `{shown}`.", ""]
    lines += importance_lines(study)
    keys = sorted({k for r in rows for k in r.params})
    header = ["trial", *(["rung"] if rungs else []), "state", metric, "epochs", *keys]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        epochs = f"{_value(r.epochs_run)}/{_value(r.epochs_asked)}"
        value = "-" if r.value is None else f"{r.value:.2f}"
        rung = [_value(r.rung)] if rungs else []
        cells = [str(r.number), *rung, r.state, value, epochs, *(_value(r.params.get(k)) for k in keys)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

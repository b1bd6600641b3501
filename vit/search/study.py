"""An Optuna search's study: opening it (its storage URL, its name, the same search space as before), the trials
that count towards n_trials as both the sweeper (vit/search/sweeper.py) and the report (vit/search/report.py) count
them, and a stopped trial queued again."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from vit.errors import UserError


def counted_trials(study) -> list:
    """The trials that count towards a search's n_trials: complete, pruned, or failed while running (diverged,
    errors). Not counted: a trial failed because its process died (its heartbeat stopped) or was stopped by a signal
    (its retry, with the same parameters, is queued in its place), and one whose run refused a bad setting (exit
    code 2, recorded as its `exit_code` user attribute)."""
    import warnings

    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback as Retry

    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    with warnings.catch_warnings():  # marked experimental in Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        retried = {n for t in trials for n in Retry.retry_history(t)}
    return [
        t
        for t in trials
        if t.state in (states.COMPLETE, states.PRUNED)
        or (t.state == states.FAIL and t.number not in retried and "exit_code" not in t.user_attrs)
    ]


class SearchError(UserError):
    """A setting of the search itself that cannot work: one line, exit code 2."""

    kind = "config"


def sqlite_path(url: str) -> Path | None:
    """The file of a sqlite:/// URL (relative to the working folder, as SQLAlchemy reads it), else None."""
    prefix = "sqlite:///"
    return Path(url[len(prefix) :]) if url.startswith(prefix) and url != prefix + ":memory:" else None


def absolute_storage(url: str) -> str:
    """The URL with a relative SQLite path made absolute: the trials' runs open it too."""
    path = sqlite_path(url)
    return f"sqlite:///{path.resolve()}" if path is not None else url


def shown_url(url: str) -> str:
    """The URL for a message, its password hidden."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def open_study(url: str, name: str, direction: str, heartbeat_interval: int, grace_period: int):
    """The study `name` in `url`, created or loaded; SearchError naming the URL if the database cannot be opened.
    Heartbeats mark a trial whose process died as failed after `grace_period` s; the retry callback queues it again
    with the same parameters, once."""

    path = sqlite_path(url)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SearchError(f"hydra.sweeper.storage={url}: cannot make {path.parent}: {err.strerror}") from None
    for attempt in range(3):  # workers started together race to make the tables: the loser tries again
        try:
            study = _open_study(url, name, direction, heartbeat_interval, grace_period)
            break
        except SearchError:
            if attempt == 2:
                raise
            time.sleep(1.0)
    if study.direction.name.lower() != direction:
        raise SearchError(
            f"study {name!r} in {shown_url(url)} was made to {study.direction.name.lower()}, not to {direction}: "
            "give hydra.sweeper.study_name a new name"
        )
    return study


def _open_study(url: str, name: str, direction: str, heartbeat_interval: int, grace_period: int):
    import optuna

    try:
        with warnings.catch_warnings():  # heartbeats are marked experimental in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(
                absolute_storage(url),
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1),
            )
        study = optuna.create_study(study_name=name, storage=storage, direction=direction, load_if_exists=True)
    except Exception as err:  # SQLAlchemy's errors for a bad URL, a missing driver, an unreachable server
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SearchError(f"hydra.sweeper.storage={shown_url(url)} cannot be opened: {reason}") from None
    return study


def requeue(study, number: int) -> None:
    """Record an interrupted trial as failed and queue it again with its parameters (marked as its retry, so the
    study's total counts it once)."""
    import optuna

    study.tell(number, state=optuna.trial.TrialState.FAIL)
    [trial] = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback()(study, trial)


def check_same_space(study, space: dict, name: str) -> None:
    """A study continues with the search space it was made with: a parameter Optuna cannot compare with its
    earlier trials' (another kind, other choices) would fail every new trial."""
    from optuna.distributions import check_distribution_compatibility

    for trial in study.get_trials(deepcopy=False):
        for key, earlier in trial.distributions.items():
            if key in space:
                try:
                    check_distribution_compatibility(earlier, space[key])
                except ValueError as err:
                    raise SearchError(
                        f"{key}: the search space differs from study {name!r}'s ({err}); keep its space or give "
                        "hydra.sweeper.study_name a new name"
                    ) from None

"""An Optuna search's study as both its sweeper (vit/search/sweeper.py) and its report (vit/search/report.py) count
it."""

from __future__ import annotations


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

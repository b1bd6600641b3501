"""The Optuna sweeper: `python train.py -m hparams_search=<name>` searches with current Optuna, its study kept in a
database.

Hydra finds sweepers only inside the `hydra_plugins` package, so hydra_plugins/vit_sweeper/ names this class
there; configs/hydra/sweeper/optuna.yaml selects it and declares its settings. It does the job of the
hydra-optuna-sweeper plugin (the `params:` grammar with choice/range/interval/tag(log, ...), the task's return
value as the objective), written for today's Optuna because that plugin requires optuna<3 (docs/SEARCH.md).
What it adds:
- the study lives in `storage` (SQLite under the search's folder by default, PostgreSQL or MySQL across machines):
  every process pointed at it works on the same study, and the same command continues a stopped search;
- `n_trials` is the study's total: finished trials (complete, pruned or failed) count once and are never re-run;
  a trial whose process died (its heartbeat stopped) is run again with the same parameters;
- each trial's run knows its study and trial (`search.*`), so it reports its score after every evaluation and the
  pruner can stop it early (vit/search/trial.py);
- a trial that diverges or fails is recorded as failed and the search goes on; a bad setting of the search
  itself (an unknown key, a storage that cannot be opened) is one line and exit code 2, before any trial runs;
- `fidelity` makes it a successive-halving search across budgets (Jamieson & Talwalkar 2016; Hyperband's inner
  loop): `n_trials` settings at the first value of a key (`trainer.budget: [5m, 15m, 30m]`), the best 1/eta of them
  run again at the next, and so on, each rung's trials ranked only against each other. A trial is then judged by
  where a run of that length ends, not by its first epochs (whose cosine has not ended, and which a pruner would
  compare with other trials' first epochs).
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from vit.errors import exit_with
from vit.search.space import first_value, format_value, quote, search_space, suggest
from vit.search.study import (
    SearchError,
    absolute_storage,
    check_same_space,
    counted_trials,
    open_study,
    requeue,
    shown_url,
    sqlite_path,
)
from vit.search.trial import TrialInterrupted

log = logging.getLogger("vit.search")

DIRECTIONS = ("maximize", "minimize")


@dataclass(frozen=True)
class Fidelity:
    """A successive-halving search's rungs: rung r runs its trials with `key=values[r]`; the first rung holds
    `n_trials` sampled settings, each later one the best 1/`eta` of the rung below (at least one)."""

    key: str
    values: tuple[str, ...]
    eta: int

    @classmethod
    def of(cls, config: Any) -> Fidelity | None:
        """From `hydra.sweeper.fidelity` ({key, values, eta}, or null), each bad setting a SearchError."""
        if config is None:
            return None
        config = OmegaConf.to_container(config, resolve=True) if OmegaConf.is_config(config) else dict(config)
        where = "hydra.sweeper.fidelity"
        unknown = sorted(set(config) - {"key", "values", "eta"})
        if unknown:
            raise SearchError(f"{where}.{unknown[0]} is not a setting of the fidelity (key, values, eta)")
        key, values, eta = config.get("key"), config.get("values"), config.get("eta", 3)
        if not isinstance(key, str) or not key:
            raise SearchError(f"{where}.key={key!r} must name the setting each rung changes, e.g. trainer.budget")
        if not isinstance(values, (list, tuple)) or len(values) < 2:
            raise SearchError(f"{where}.values={values!r} must list at least two values, the smallest first")
        if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
            raise SearchError(f"{where}.eta={eta!r} must be an integer >= 2 (each rung keeps the best 1/eta)")
        return cls(key, tuple(str(v) for v in values), eta)

    def sizes(self, n_trials: int) -> list[int]:
        """How many trials each rung runs: n, ceil(n / eta), ceil(n / eta^2), ..."""
        return [max(1, math.ceil(n_trials / self.eta**rung)) for rung in range(len(self.values))]


class OptunaSweeper(Sweeper):
    """Hydra's Sweeper interface around an Optuna study (see the module's docstring)."""

    def __init__(
        self,
        study_name: str,
        storage: str,
        direction: str = "maximize",
        n_trials: int = 20,
        sampler: Any = None,
        params: Any = None,
        heartbeat_interval: int = 10,
        grace_period: int = 30,
        fidelity: Any = None,
    ):
        self.study_name = str(study_name)
        self.storage_url = str(storage)
        self.direction = str(direction)
        self.n_trials = int(n_trials)
        self.sampler_config = sampler
        self.params = dict(params or {})
        self.heartbeat_interval = int(heartbeat_interval)
        self.grace_period = int(grace_period)
        self.fidelity_config = fidelity
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]) -> list:
        logging.getLogger("vit").setLevel(logging.INFO)
        try:
            search = self.prepare(arguments)
        except SearchError as err:
            exit_with(err)
        return search.run()

    def prepare(self, arguments: list[str]) -> Search:
        """Everything checked before the first trial: the metric and its direction, the search space (each key
        composes), the sampler and the study in its storage."""
        try:
            import optuna
        except ImportError:
            raise SearchError("the Optuna sweeper needs optuna: pip install -e '.[search]'") from None
        assert self.config is not None
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the study's and the trials' lines are ours
        metric = self.check_metric()
        space, fixed = search_space(self.params, arguments)
        if self.n_trials < 1:
            raise SearchError(f"hydra.sweeper.n_trials={self.n_trials} must be at least 1")
        fidelity = self.check_fidelity(space)
        self.check_space(space, fixed, fidelity)
        study = open_study(
            self.storage_url, self.study_name, self.direction, self.heartbeat_interval, self.grace_period
        )
        check_same_space(study, space, self.study_name)
        # A seeded sampler restarted on a study with trials would repeat its first suggestions: its seed moves on
        # by the trials already there (reproducible for a resumed search; several workers get their own seeds).
        study.sampler = self.sampler(seed_offset=len(study.get_trials(deepcopy=False)))
        with warnings.catch_warnings():  # metric names are marked experimental in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([metric])  # the dashboard and summarize_runs name the objective
        return Search(self, study, space, fixed, metric, fidelity)

    def check_metric(self) -> str:
        from vit.errors import ConfigError
        from vit.search.trial import metric_direction, optimized_metric

        if self.direction not in DIRECTIONS:
            raise SearchError(f"hydra.sweeper.direction={self.direction!r} must be one of {DIRECTIONS}")
        try:
            metric = optimized_metric(self.config)
            wanted = metric_direction(metric)
        except ConfigError as err:
            raise SearchError(str(err)) from None
        if wanted != self.direction:
            raise SearchError(f"optimized_metric={metric} is to {wanted} but hydra.sweeper.direction={self.direction}")
        return metric

    def check_fidelity(self, space: dict) -> Fidelity | None:
        """`hydra.sweeper.fidelity`, checked against the search: its key is not also searched, and no pruner
        compares a trial's epochs with those of trials of another length (`search.pruner` must be null)."""
        fidelity = Fidelity.of(self.fidelity_config)
        if fidelity is None:
            return None
        if fidelity.key in space:
            raise SearchError(f"hydra.sweeper.fidelity.key={fidelity.key} is also searched: give it one or the other")
        if self.config.get("search") is not None and self.config.search.get("pruner") is not None:
            raise SearchError(
                "hydra.sweeper.fidelity ranks trials where their runs end, and a pruner would stop them on their "
                "first epochs against trials of other lengths: set search.pruner=null"
            )
        return fidelity

    def check_space(self, space: dict, fixed: list[str], fidelity: Fidelity | None = None) -> None:
        """Compose one trial's config (each parameter at its first value, and at each rung's fidelity value) so an
        unknown key or a bad value shows now, not in the first trial."""
        first = [f"{key}={format_value(first_value(dist))}" for key, dist in space.items()]
        rungs = [[]] if fidelity is None else [[f"{fidelity.key}={value}"] for value in fidelity.values]
        try:
            self.validate_batch_is_legal([fixed + first + rung for rung in rungs])
        except Exception as err:  # Hydra's ConfigCompositionException and its kin: the search space is wrong
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise SearchError(f"the search space does not compose: {reason}") from None

    def sampler(self, seed_offset: int = 0):
        if self.sampler_config is None:
            import optuna

            return optuna.samplers.TPESampler()
        from hydra.utils import instantiate

        config = OmegaConf.create(OmegaConf.to_container(self.sampler_config, resolve=True))
        if config.get("seed") is not None:
            config.seed = int(config.seed) + seed_offset
        try:
            return instantiate(config)
        except Exception as err:
            raise SearchError(f"hydra.sweeper.sampler cannot be built: {str(err).splitlines()[0]}") from None


class Search:
    """One process's part of a study: asks for trials until the study has `n_trials` finished ones, or, with a
    `fidelity`, until each rung has its trials, promoting the best of each rung to the next."""

    def __init__(
        self, sweeper: OptunaSweeper, study, space: dict, fixed: list[str], metric: str, fidelity: Fidelity | None
    ):
        self.sweeper, self.study, self.space, self.fixed, self.metric = sweeper, study, space, fixed, metric
        self.fidelity = fidelity
        self.returns: list = []
        self.exit_code: int | None = None
        self.running: int | None = None  # the number of the trial being run
        self.rung: int | None = None  # the rung being run (a fidelity search), else None
        self.target = sweeper.n_trials  # the finished trials the current stage needs

    def run(self) -> list:
        import optuna

        where = sqlite_path(self.sweeper.storage_url) or shown_url(self.sweeper.storage_url)  # no password shown
        if self.fidelity is None:
            done = self.finished()
            todo = self.sweeper.n_trials - done
            log.info(
                "study %r in %s: %d of %d trials finished, %s", self.study.study_name, where, done,
                self.sweeper.n_trials, f"{todo} to run" if todo > 0 else "nothing to run",
            )  # fmt: skip
            if not self.optimize(todo):
                return self.returns
        else:
            sizes = self.fidelity.sizes(self.sweeper.n_trials)
            log.info(
                "study %r in %s: successive halving over %s, %s trials (eta %d)", self.study.study_name, where,
                self.fidelity.key, " -> ".join(f"{v}: {n}" for v, n in zip(self.fidelity.values, sizes, strict=True)),
                self.fidelity.eta,
            )  # fmt: skip
            for rung, size in enumerate(sizes):
                self.rung = rung
                if rung > 0:
                    size = self.promote(rung, size)
                    if size == 0:
                        break
                self.target = size
                done = self.finished()
                todo = size - done
                log.info(
                    "rung %d (%s=%s): %d of %d trials finished, %s", rung, self.fidelity.key,
                    self.fidelity.values[rung], done, size, f"{todo} to run" if todo > 0 else "nothing to run",
                )  # fmt: skip
                if not self.optimize(todo):
                    return self.returns
                if self.exit_code is not None:
                    break
        if self.exit_code is not None:
            raise SystemExit(self.exit_code)
        self.summary(optuna)
        return self.returns

    def optimize(self, todo: int) -> bool:
        """Run `todo` trials (queued ones first); False when a signal stopped the search (its trial queued again)."""
        if todo <= 0:
            return True
        try:
            self.study.optimize(self.objective, n_trials=todo, callbacks=[self.stop_when_done], catch=(Exception,))
        except TrialInterrupted as stop:
            requeue(self.study, self.running)
            log.info(
                "search stopped by %s; trial %d is queued again with its parameters: the same command continues "
                "the study", stop, self.running,
            )  # fmt: skip
            return False
        return True

    def finished(self) -> int:
        """The finished trials of the current stage: the study's, or the current rung's."""
        return len(self.counted())

    def counted(self) -> list:
        trials = counted_trials(self.study)
        return trials if self.rung is None else [t for t in trials if rung_of(t) == self.rung]

    def promote(self, rung: int, size: int) -> int:
        """Queue the best `size` completed trials of rung `rung - 1` (those not queued already) to run at this
        rung's value; returns how many this rung holds (fewer when fewer completed below)."""
        import optuna

        below = [t for t in counted_trials(self.study) if rung_of(t) == rung - 1]
        complete = [t for t in below if t.state == optuna.trial.TrialState.COMPLETE]
        complete.sort(key=lambda t: t.value, reverse=self.sweeper.direction == "maximize")
        chosen = complete[:size]
        queued = {t.user_attrs.get("promoted_from") for t in self.study.get_trials(deepcopy=False)}
        queued.discard(None)
        for trial in chosen:
            if trial.number not in queued:
                self.study.enqueue_trial(
                    trial.params, user_attrs={"rung": rung, "promoted_from": trial.number}, skip_if_exists=False
                )
        if chosen:
            log.info(
                "rung %d: trials %s promoted from rung %d (%s)", rung, ", ".join(str(t.number) for t in chosen),
                rung - 1, ", ".join(f"{t.value:.4f}" for t in chosen),
            )  # fmt: skip
        else:
            log.info("rung %d: no trial of rung %d completed, nothing to promote", rung, rung - 1)
        return len(chosen)

    def objective(self, trial) -> float:
        from hydra.core.utils import JobStatus

        params = {key: suggest(trial, key, dist) for key, dist in self.space.items()}
        # A promoted trial (or a retry) carries its rung; a sampled one belongs to the rung being run.
        rung = trial.user_attrs.get("rung", self.rung) if self.fidelity is not None else None
        at_rung = []
        if rung is not None:
            trial.set_user_attr("rung", rung)
            at_rung = [f"{self.fidelity.key}={self.fidelity.values[rung]}"]
        overrides = [
            *self.fixed,
            *(f"{key}={format_value(value)}" for key, value in params.items()),
            *at_rung,
            f"search.storage={quote(absolute_storage(self.sweeper.storage_url))}",
            f"search.study={quote(self.study.study_name)}",
            f"search.trial={trial.number}",
        ]
        shown = " ".join(f"{k}={format_value(v)}" for k, v in params.items())
        if rung is not None:
            log.info("trial %d (rung %d, %s): %s", trial.number, rung, at_rung[0], shown)
        else:
            log.info("trial %d: %s", trial.number, shown)
        self.running = trial.number
        try:
            [job] = self.sweeper.launcher.launch([overrides], initial_job_idx=trial.number)
        except SystemExit as exit_:  # a bad setting in this trial's config: the run said why in one line
            self.exit_code = exit_.code if isinstance(exit_.code, int) else 2
            trial.set_user_attr("exit_code", self.exit_code)  # failed, but not counted: the setting is to blame
            self.study.stop()  # recorded as failed (NaN); the search ends with the run's exit code
            return float("nan")
        self.returns.append(job)
        if job.status == JobStatus.FAILED:
            # Hydra keeps the task's exception as the job's return value; a pruned trial raised TrialPruned.
            raise job._return_value
        value = job.return_value
        # A diverged run returns NaN: Optuna records the trial as failed, with one warning line.
        return float("nan") if value is None or not math.isfinite(float(value)) else float(value)

    def stop_when_done(self, study, trial) -> None:
        """Another process sharing the study may have finished trials too: stop at the stage's total."""
        state = trial.state.name.lower()
        value = f" {self.metric} {trial.value:.4f}" if trial.value is not None else ""
        log.info("trial %d %s%s", trial.number, state, value)
        if self.finished() >= self.target:
            study.stop()

    def summary(self, optuna) -> None:
        complete = [t for t in self.study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            log.info("no trial of the study has completed yet")
            return
        if self.fidelity is None:
            best = self.study.best_trial
            where = ""
        else:  # the best of the highest rung reached: only trials of one length are compared
            top = max(rung_of(t) for t in complete)
            ranked = sorted((t for t in complete if rung_of(t) == top), key=lambda t: t.value)
            best = ranked[-1] if self.sweeper.direction == "maximize" else ranked[0]
            where = f" at rung {top} ({self.fidelity.key}={self.fidelity.values[top]})"
        shown = " ".join(f"{k}={format_value(v)}" for k, v in best.params.items())
        log.info("best trial %d%s: %s %.4f with %s", best.number, where, self.metric, best.value, shown)


def rung_of(trial) -> int:
    """A trial's rung in a successive-halving search (0 for a trial that has none)."""
    return int(trial.user_attrs.get("rung", 0))

"""The jobs of a sweep (`train.py -m`, any launcher): a failing job noted in its folder while the sweep goes on
(fail_job), and after the last job the failures listed and the exit code given (SweepEnd, a Hydra callback, which
also counts the jobs for trainer.sweep_budget at the sweep's start: vit/train/sweep_budget.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from vit.cli.run_folders import NEW_FOLDERS, close_logs_in, log_in_run_folder, remove_emptied_parents
from vit.records.sweep_files import CLAIM_FILE, FAILED_FILE, LENGTH_FILE, SWEEP_FILE


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
        import json
        import time

        from vit.records.files import atomic_write_text

        self.started = time.time() - 1.0  # file times are whole seconds on some file systems
        top = os.path.abspath(str(config.hydra.sweep.dir))
        self.noted = NEW_FOLDERS.get(top)  # RunFolders, before this callback, noted what existed
        for name in (SWEEP_FILE, LENGTH_FILE, CLAIM_FILE):  # an earlier sweep's, in a folder used again
            (Path(top) / name).unlink(missing_ok=True)
        described = describe_sweep(config)
        if described is not None:  # the jobs' HParams columns, trainer.sweep_budget's shares
            Path(top).mkdir(parents=True, exist_ok=True)
            atomic_write_text(json.dumps(described, indent=1) + "\n", Path(top) / SWEEP_FILE)

    def on_multirun_end(self, config, **kwargs) -> None:
        import json

        sweep_dir, since = Path(str(config.hydra.sweep.dir)), getattr(self, "started", 0.0)
        print_sweep_budget(sweep_dir, since)
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
                close_logs_in(job)
                shutil.rmtree(job, ignore_errors=True)
        remove_emptied_parents(Path(noted.top), noted)


def print_sweep_budget(sweep_dir: Path, since: float) -> None:
    """trainer.sweep_budget's last line: the sweep's time against its budget, and the epochs every job trained."""
    import json
    import time

    from vit.settings.trainer import duration

    try:
        sweep = json.loads((sweep_dir / SWEEP_FILE).read_text())["sweep_budget"]
        length = json.loads((sweep_dir / LENGTH_FILE).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return
    used = time.time() - since - 1.0
    print(
        f"sweep budget {duration(sweep['budget_s'])}: {used:.0f} s used by {sweep['jobs']} jobs; each trained the "
        f"{length['epochs']} epochs ({length['steps']:,} steps) its first job fitted to its share of "
        f"{duration(sweep['share_s'])}",
        flush=True,
    )


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"  # hydra/sweeper=basic, the default


def swept_values(params, arguments) -> dict[str, int]:
    """Each key of a sweep and its count of values, as Hydra's basic sweeper reads its `params` (a config's
    hydra.sweeper.params) and the command line's overrides: the command line's value of a key replaces the
    config's. The sweep's jobs are the product of the counts."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    texts = [f"{key}={value}" for key, value in (params or {}).items()] + [str(text) for text in arguments]
    values = {}
    for override in OverridesParser.create().parse_overrides(texts):
        many = override.is_sweep_override()
        values[override.get_key_element()] = len(list(override.sweep_string_iterator())) if many else 1
    return values


def describe_sweep(config) -> dict | None:
    """SWEEP_FILE's record of a sweep that Hydra's basic sweeper runs (None for another sweeper): its jobs, the
    keys it sweeps (TensorBoard's HParams columns: vit/train/report.py) and, with trainer.sweep_budget, each job's
    share (vit/train/sweep_budget.py). A budget that does not parse gets no share: each job then says why."""
    import math

    from vit.errors import ConfigError
    from vit.settings.trainer import parse_sweep_budget

    if config.hydra.sweeper.get("_target_") != BASIC_SWEEPER:
        return None
    values = swept_values(config.hydra.sweeper.get("params"), config.hydra.overrides.task)
    jobs = math.prod(values.values())
    record = {"jobs": jobs, "swept": sorted(key for key, count in values.items() if count > 1)}
    try:
        budget_s = parse_sweep_budget(config.trainer.get("sweep_budget"))
    except ConfigError:
        budget_s = None
    if budget_s is not None:
        launcher = str(config.hydra.launcher.get("_target_", ""))
        at_once = min(jobs, int(config.hydra.launcher.get("array_parallelism", 1))) if "Slurm" in launcher else 1
        share = {"budget_s": budget_s, "jobs": jobs, "at_once": at_once, "share_s": budget_s * at_once / jobs}
        record["sweep_budget"] = share
    return record

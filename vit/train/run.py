"""`run(cfg)`: one training run from a composed config, start (or resume) to `metrics.json`.

`build_run` builds the one `Run` object every phase takes (vit/train/setup.py): the trainer's typed settings
(vit/settings/trainer.py), torch set up, the model and the data, the optimisation (vit/train/assemble.py), the
checkpoints resumed (vit/train/checkpoints.py), the writers (vit/train/report.py) and the callbacks (the budget,
a search trial's pruner, the teacher's check: vit/train/callbacks.py). `train` (vit/train/trainer.py) is the
loop, read top to bottom: for each epoch its steps, the evaluation, the record and the checkpoint; finally the test
split and metrics.json.

Run directory (Hydra's, or `output_dir`): .hydra/ (written by Hydra), tb/ (TensorBoard events),
checkpoints/{last,best}.pt (and epoch_NNNN.pt with trainer.keep_last), metrics.json.

Under `torchrun` (see vit/runtime/distributed.py) every rank runs this same function on its shard of the data;
rank 0's run directory is the run's, and only rank 0 writes into it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from omegaconf import DictConfig

from vit.errors import ConfigError
from vit.records.files import check_run_dir
from vit.records.provenance import provenance
from vit.runtime.cpu_load import process_cpus
from vit.runtime.device import resolve_device
from vit.runtime.distributed import Distributed, setup_distributed
from vit.runtime.sharding import is_sharded
from vit.search.trial import TrialReport, check_search, is_trial
from vit.settings import TrainerSettings
from vit.tasks import task_of
from vit.train.assemble import build_step_parts
from vit.train.budget_hooks import attach_budget
from vit.train.callbacks import TeacherCheck, TrialPruning
from vit.train.checkpoints import Checkpointer, RunProgress, resume
from vit.train.config import validate
from vit.train.report import Reporter
from vit.train.setup import Run, build_setup, setup_torch
from vit.train.signals import StopSignal, restart_count
from vit.train.step_parts import StepState
from vit.train.sweep_budget import PublishLength, fit_to_sweep, release_claims
from vit.train.thread_fit import ThreadFit, fits_while_training
from vit.train.trainer import train

log = logging.getLogger("vit.train")


def run(
    cfg: DictConfig,
    output_dir: str | Path | None = None,
    train_loader_wrapper: Callable[[Iterable], Iterable] | None = None,
) -> dict:
    """Train as `cfg` says; write checkpoints, TensorBoard events and metrics.json into the run directory
    (`output_dir`, else Hydra's). Returns the metrics written to metrics.json.
    `train_loader_wrapper`: wraps the train loader (the end-to-end benchmark's real and static epochs,
    lab/e2e_timing.py)."""
    # Wall time counts from the process start (imports, config composition) for the first run of a train.py process:
    # the recipes' time goals are "process start to final evaluation". Other runs count from here.
    startup_s = startup_seconds()
    wall_start = time.perf_counter() - startup_s
    validate(cfg)
    check_search(cfg)
    own_dir = Path(output_dir) if output_dir is not None else hydra_output_dir()
    if own_dir is None:
        raise ConfigError("no run directory: call run(cfg, output_dir=...) or start through train.py")
    dist = setup_distributed(resolve_device(cfg.trainer.device), cfg.trainer.strategy)
    if not dist.is_main:  # the console is rank 0's; other ranks speak only of problems
        logging.getLogger("vit").setLevel(logging.WARNING)
    # Each torchrun worker's Hydra names its directory by its own clock: rank 0's is the run's.
    run_dir = Path(dist.broadcast(str(own_dir)))
    if dist.is_main:
        check_run_dir(run_dir, create=True)  # a file in the way, a read-only or full disk: OutputError, no data read
        log.info("run folder: %s", run_dir.resolve())  # checkpoints, metrics.json, TensorBoard events, the log
    elif own_dir != run_dir and own_dir.is_dir() and not any(own_dir.iterdir()):
        own_dir.rmdir()  # the empty directory this worker's Hydra made for itself
    # Deterministic mode and the thread count (trainer.threads) are process-wide: put them back afterwards, so later
    # work in this process (tests, notebooks) is not slowed or broken by them.
    previous = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    threads = torch.get_num_threads()
    try:
        return train(build_run(cfg, run_dir, wall_start, dist, train_loader_wrapper, startup_s))
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.set_num_threads(threads)
        dist.close()
        release_claims()  # trainer.sweep_budget: a waiting job fits the length itself if this one never planned
        while _CONTINUATION_LOGS:
            handler = _CONTINUATION_LOGS.pop()
            logging.getLogger().removeHandler(handler)
            handler.close()


def continued_run_dir(setting, resume_path: Path | None, run_dir: Path, main: bool) -> Path:
    """Where the run writes: `run_dir`, except that `trainer.resume=auto` continuing an earlier run folder (Hydra's
    outputs/<date>/<time>, a new one per command) continues in that folder, so its checkpoints, TensorBoard curves
    and metrics.json stay one run. Hydra's new folder keeps this command's config and log, whose first lines say
    where the run went; the earlier folder's train.log gets the rest of the log too."""
    auto = str(setting) == "auto" or (not setting and restart_count() is not None)  # a restart resumes as auto
    if not auto or resume_path is None or resume_path.parent.name != "checkpoints":
        return run_dir
    earlier = resume_path.parent.parent
    if earlier.resolve() == run_dir.resolve():
        return run_dir
    if main:
        log.info(
            "trainer.resume=auto: the run continues in %s, where it started; %s holds this command's log",
            earlier,
            run_dir,
        )
        handler = logging.FileHandler(earlier / "train.log", mode="a", encoding="utf-8")
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        logging.getLogger().addHandler(handler)
        _CONTINUATION_LOGS.append(handler)
    return earlier


_CONTINUATION_LOGS: list[logging.Handler] = []  # closed when `run` returns


def build_run(
    cfg: DictConfig, run_dir: Path, wall_start: float, dist: Distributed, loader_wrapper=None, startup_s: float = 0.0
) -> Run:
    """The run object every phase takes: torch set up, the model and the data, the optimisation, the checkpoints
    resumed, and the writers. Only rank 0 writes: events, checkpoints, console lines, metrics.json."""
    trainer, sweep_fit = fit_to_sweep(TrainerSettings.of(cfg.trainer), dist.world_size)  # trainer.sweep_budget
    device = setup_torch(trainer, dist)
    budget_left = (lambda: trainer.budget - (time.perf_counter() - wall_start)) if trainer.budget else None
    setup = build_setup(cfg, trainer, run_dir, device, dist, loader_wrapper, budget_left)
    run_dir = continued_run_dir(trainer.resume, setup.resume_path, run_dir, dist.is_main)
    step_parts, step_state = build_step_parts(cfg, trainer, setup, device, dist), StepState()
    progress = RunProgress(wall_start)
    if setup.resume_path is not None:
        args = (setup.bundle.class_to_idx, wall_start, cfg.optim.name)
        progress = resume(setup.resume_path, step_parts, step_state, *args)
    progress.startup_s = startup_s
    checkpoints = Checkpointer(
        run_dir / "checkpoints",
        enabled=trainer.save_checkpoints,  # rank 0 writes (every rank its shards under fsdp)
        keep_last=trainer.keep_last,
        step_parts=step_parts,
        class_to_idx=setup.bundle.class_to_idx,
        config=setup.resolved,
    )
    report = Reporter(
        str(run_dir / "tb"),
        trainer.progress,
        enabled=dist.is_main,
        attn_every=trainer.attn_maps_every_n_epochs,  # 0 with task=mae (vit/train/config.py refuses any other)
        recon_every=trainer.recon_images_every_n_epochs if task_of(cfg).reconstructs else 0,
        collective=is_sharded(step_parts.model),
    )
    stop = StopSignal()
    step_parts.stop_requested = stop.requested
    trial = TrialReport.of(cfg, run_dir, trainer.epochs) if is_trial(cfg) and dist.is_main else None
    run = Run(cfg, trainer, run_dir, setup, step_parts, step_state, progress, checkpoints, report, stop, trial)
    run.provenance = provenance()
    if setup.distiller is not None and setup.distiller.teacher is not None:
        run.callbacks.append(TeacherCheck(setup.distiller, str(cfg.distill.teacher)))
    if is_trial(cfg):
        run.callbacks.append(TrialPruning(trial))  # every rank: all of them stop together
    if fits_while_training(trainer.threads, device, dist):  # re-decided as the machine's load changes
        images = cfg.data.batch_size * trainer.accum_steps
        run.callbacks.append(ThreadFit(len(process_cpus()), setup.threads, images, speaks=dist.is_main))
    budget = attach_budget(run, sweep_plan=sweep_fit is not None)  # plans the steps (vit/train/budget_hooks.py)
    if sweep_fit is not None:
        run.callbacks.append(PublishLength(sweep_fit, budget))
    return run


def hydra_output_dir() -> Path | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):
        return None


# Set by the command line (train.py, vit-train): its process exists for the run, so the run's clock starts with
# the process. A `run()` called from a notebook or a test starts its clock at the call.
_count_from_process_start = False


def count_from_process_start() -> None:
    global _count_from_process_start
    _count_from_process_start = True


def startup_seconds() -> float:
    """Seconds the command-line process lived before its first `run` (imports, config composition); 0 for later
    runs (a multirun sweep's), for `run()` called from Python, and where /proc is not there."""
    global _count_from_process_start
    if not _count_from_process_start:
        return 0.0
    _count_from_process_start = False
    try:  # field 22 of /proc/self/stat: the start time in clock ticks after boot; /proc/uptime: now after boot
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0

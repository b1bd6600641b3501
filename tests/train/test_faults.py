"""Surviving interruptions: SIGTERM stops cleanly with a resume hint; kill -9 at random moments (also during a
checkpoint write) never leaves a broken last.pt, and resuming each time ends with the uninterrupted weights."""

import io
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from trainer_utils import TINY_MODEL, ForkedRun, run_cli

from vit.weights.read import CheckpointError, load_checkpoint

ARGS = ["data=synthetic", "data.synthetic.num_train=512", "data.synthetic.num_val=32", "data.batch_size=16"]
ARGS += [*TINY_MODEL, "trainer.epochs=3", "trainer.device=cpu", "trainer.deterministic=true"]
ARGS += ["trainer.log_every_n_steps=1000", "trainer.attn_maps_every_n_epochs=0", "data.augment.hflip=true"]
# One thread in every run: a forked run computes on one (ForkedRun), and bitwise-equal weights need equal reductions.
ARGS += ["trainer.threads=1"]


def start(run_dir, extra=()) -> ForkedRun:
    """The run in a process of its own for the signals to stop or kill, forked (no imports to wait for,
    ForkedRun): what a signal does to it is what it does to `python train.py`, whose handlers are the same code."""
    return ForkedRun.train([*ARGS, *extra, f"hydra.run.dir={run_dir}"], run_dir)


def resume_here(run_dir) -> subprocess.CompletedProcess:
    """The same command plus trainer.resume=auto, in this process (`run_cli`): a new process costs seconds of
    imports, and the reference shows a run here ends on the weights of one in its own process."""
    return run_cli([*ARGS, "trainer.resume=auto", f"hydra.run.dir={run_dir}"], run_dir)


def finished_epochs(run_dir) -> int:
    path = run_dir / "checkpoints" / "last.pt"
    try:
        return int(load_checkpoint(path)["epoch"]) if path.exists() else 0
    except CheckpointError:
        pytest.fail(f"{path} exists but cannot be read: a torn checkpoint")


def wait_for_epoch(proc, run_dir, epoch, timeout=120) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        if finished_epochs(run_dir) >= epoch:
            return True
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"epoch {epoch} not reached in {timeout}s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, in this process (`run_cli`): the same command, the same weights as in its own."""
    run_dir = tmp_path_factory.mktemp("reference")
    done = run_cli([*ARGS, f"hydra.run.dir={run_dir}"], run_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    return load_checkpoint(run_dir / "checkpoints" / "last.pt")


def assert_same_weights(a, b):
    assert a["epoch"] == b["epoch"] and a["step"] == b["step"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_sigterm_stops_after_the_step_and_resumes_exactly(tmp_path, reference):
    run_dir = tmp_path / "run"
    proc = start(run_dir)
    assert wait_for_epoch(proc, run_dir, 1)
    time.sleep(0.15)  # into epoch 2
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:]
    if "SIGTERM received" in out:  # (if the run had already ended, there was nothing to stop)
        assert "Resume with the same command plus trainer.resume=auto" in out
        assert finished_epochs(run_dir) < 3
        logged = (run_dir / "train.log").read_text()  # the run folder says how it ended, as the console did
        assert "stopped by SIGTERM in epoch " in logged and "Resume with the same command" in logged
    resumed = resume_here(run_dir)  # the stop needed a process; the resume does not
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_weights(load_checkpoint(run_dir / "checkpoints" / "last.pt"), reference)


def test_sigusr1_saves_requeues_the_slurm_job_and_the_requeued_job_resumes_unasked(tmp_path, reference, monkeypatch):
    """SLURM's warning signal (#SBATCH --signal=USR1@<s>): the run stops at a step with last.pt and asks for a
    requeue (a stand-in `scontrol` records its arguments); the requeued job (SLURM_RESTART_COUNT=1) runs the same
    command, without trainer.resume, and ends on the uninterrupted weights."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol_calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    run_dir = tmp_path / "run"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    proc = ForkedRun.train([*ARGS, f"hydra.run.dir={run_dir}"], run_dir, env)
    assert wait_for_epoch(proc, run_dir, 1)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:]
    assert "SIGUSR1 received" in out and "SLURM job 4242 requeued (scontrol requeue)" in out, out[-2000:]
    assert calls.read_text().split() == ["requeue", "4242"]
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    resumed = run_cli([*ARGS, f"hydra.run.dir={run_dir}"], run_dir)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "SLURM_RESTART_COUNT=1: this launch is a restart" in resumed.stdout + resumed.stderr
    assert_same_weights(load_checkpoint(run_dir / "checkpoints" / "last.pt"), reference)


def test_requeue_says_what_happened_outside_slurm_and_when_scontrol_fails(monkeypatch):
    from vit.train.signals import requeue

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert requeue().startswith("SIGUSR1 outside a SLURM job (no SLURM_JOB_ID)")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    failed = subprocess.CompletedProcess([], 1, "", "scontrol: error: Invalid job id specified\n")
    line = requeue(lambda args: failed)
    assert line == "SIGUSR1: scontrol requeue 7 failed (scontrol: error: Invalid job id specified); resume by hand"

    def missing(args):
        raise FileNotFoundError(2, "No such file or directory", "scontrol")

    assert "could not requeue SLURM job 7 (FileNotFoundError" in requeue(missing)


def test_kill_9_at_random_moments_then_resume(tmp_path, reference):
    rng = random.Random(7)
    run_dir = tmp_path / "run"
    for target_epoch in (1, 2):
        proc = start(run_dir, ["trainer.resume=auto"])
        if wait_for_epoch(proc, run_dir, target_epoch):
            time.sleep(rng.uniform(0.0, 0.4))  # somewhere in the next epoch, or inside its checkpoint write
            proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        finished_epochs(run_dir)  # whatever is on disk must load
    final = resume_here(run_dir)
    assert final.returncode == 0, final.stderr[-2000:]
    assert_same_weights(load_checkpoint(run_dir / "checkpoints" / "last.pt"), reference)


def test_a_second_signal_exits_at_once():
    """The first SIGTERM only asks for a stop after the step; a second one raises SystemExit(128 + 15) at once,
    wherever the program is (real signals sent to this process)."""
    from vit.train.signals import StopSignal

    stop = StopSignal()
    previous = stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs at the next bytecode boundary
        assert stop.requested() and stop.name == "SIGTERM"
        with pytest.raises(SystemExit) as exit_info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert exit_info.value.code == 128 + signal.SIGTERM
    finally:
        stop.restore(previous)


def test_a_signal_after_the_epochs_lets_the_final_evaluation_end(tmp_path, monkeypatch):
    """SIGTERM once the epochs are over (here as the final evaluation starts) is still the run's to handle: the
    default handler there would end the process, and under torchrun that rank alone, while the others wait for it
    in the evaluation's gathers. The run ends its evaluation, writes metrics.json and exits 0; nothing was stopped,
    and a second signal would still exit at once."""
    import importlib
    import json

    trainer = importlib.import_module("vit.train.trainer")
    finish = trainer.finish

    def signalled_finish(run):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs at the next bytecode boundary
        return finish(run)

    reached_outside = []  # where the run's handlers are not installed, the signal lands here, not in pytest's death
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: reached_outside.append(signum))
    monkeypatch.setattr(trainer, "finish", signalled_finish)
    try:
        done = run_cli([*ARGS, "trainer.epochs=1", "data.holdout=32", f"hydra.run.dir={tmp_path}"], tmp_path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not reached_outside, "the signal met the handler outside the run"
    assert done.returncode == 0, done.stderr[-2000:]
    assert "SIGTERM received after training: finishing the final evaluation" in done.stdout + done.stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["stopped_by_signal"] is None and metrics["test"]["top1"] >= 0.0


class SignalMidWrite(io.RawIOBase):
    """A pipe's write end that runs `on_write` the first time its buffer flushes into it: a signal landing while
    the program is in the middle of writing a line, deterministically."""

    def __init__(self, fd: int, on_write) -> None:
        self.fd, self.on_write = fd, on_write

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data) -> int:
        on_write, self.on_write = self.on_write, None
        if on_write is not None:
            on_write()
        return os.write(self.fd, data)


def test_the_stop_line_of_a_signal_landing_mid_write_loses_neither_line(monkeypatch):
    """The handler's line cannot re-enter sys.stdout's buffer while it is flushing a log line (a print there raised
    "reentrant call" inside the interrupted write, and logging printed a traceback instead of the line)."""
    from vit.train.signals import StopSignal

    stop = StopSignal()
    read_end, write_end = os.pipe()
    raw = SignalMidWrite(write_end, lambda: stop._handle(signal.SIGTERM, None))
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BufferedWriter(raw), line_buffering=True))
    print("epoch 1/8 step 50/175 loss 2.2295")
    sys.stdout.flush()
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        written = pipe.read()
    assert stop.requested()
    assert "SIGTERM received: stopping after this step" in written and "step 50/175 loss 2.2295\n" in written

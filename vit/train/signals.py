"""Stopping a run cleanly: SIGTERM/SIGINT ask the loop to stop after the current step, a second one exits.
SIGUSR1 stops the same way, then asks SLURM to requeue the job (`scontrol requeue $SLURM_JOB_ID`): the signal
`#SBATCH --signal=USR1@<seconds>` sends that long before the job's time ends, so a preempted or time-limited job
saves, goes back in the queue and resumes from its last.pt when it starts again (`restart_resume`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator

from vit.runtime.distributed import env_rank


class StopSignal:
    """`with stop.installed():` the handlers are this object's; poll `requested()` once per step; set `finishing`
    when the epochs are over.

    The loop checks the flag between steps, so a stop never lands inside an optimizer update or a checkpoint
    write; a second signal raises SystemExit(128 + signum) at once, as a shell would report it. The handler's one
    line goes to the standard output's file descriptor, not through `print`: a signal that lands while the program
    is writing a log line would otherwise re-enter sys.stdout's buffer ("reentrant call"), and the log line would be
    lost to a logging error.
    """

    def __init__(self) -> None:
        self.signum: int | None = None  # the signal that stopped training
        # Set once training is over: a signal then lets the final evaluation end (every rank is in its gathers, and
        # the results are moments away) and is kept apart, since it stopped nothing.
        self.finishing = False
        self.late_signum: int | None = None

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None or self.late_signum is not None:
            raise SystemExit(128 + signum)
        if self.finishing:
            self.late_signum = signum
            if env_rank() == 0:
                announce(
                    f"{signal.Signals(signum).name} received after training: finishing the final evaluation "
                    "(send it again to exit now)"
                )
            return
        self.signum = signum
        if env_rank() == 0:  # under torchrun every rank gets the signal; one line is enough
            announce(f"{self.name} received: stopping after this step (send it again to exit now)")

    @property
    def requeues(self) -> bool:
        """Whether the stop was asked for by SIGUSR1: after the checkpoint, the job is requeued (`requeue`)."""
        return self.name == "SIGUSR1"

    def install(self) -> dict:
        previous = {}
        for signum in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)):
            if signum is None:  # Windows has no SIGUSR1
                continue
            try:
                previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread (e.g. a notebook worker): no handlers, no graceful stop
                pass
        return previous

    @staticmethod
    def restore(previous: dict) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignal]:
        previous = self.install()
        try:
            yield self
        finally:
            self.restore(previous)


def announce(line: str) -> None:
    """Write one line from a signal handler: straight to the file descriptor under sys.stdout (a system call holds
    no Python-level lock); where there is none (a notebook's stream), to sys.stderr, which nothing here buffers."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        print(line, file=sys.stderr, flush=True)
        return
    os.write(fd, f"\n{line}\n".encode())


# The variables a restarted launch sets: torchrun's elastic agent on each restart of the workers (--max-restarts),
# SLURM on a requeued job.
RESTART_COUNTS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")


def restart_count() -> tuple[str, int] | None:
    """(variable, count) when this process is a restart of an earlier launch of the same command, else None."""
    for name in RESTART_COUNTS:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return name, int(value)
    return None


def requeue(run_command=None) -> str:
    """Ask SLURM to put this job back in the queue (after SIGUSR1's checkpoint); the line that says what happened.
    `run_command(args)`: how `scontrol` runs (subprocess.run; tests pass their own)."""
    import subprocess

    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return "SIGUSR1 outside a SLURM job (no SLURM_JOB_ID): stopped with last.pt; resume with trainer.resume=auto"
    run_command = run_command or (lambda args: subprocess.run(args, capture_output=True, text=True, timeout=60))
    try:
        result = run_command(["scontrol", "requeue", job])
    except (OSError, subprocess.SubprocessError) as err:
        return f"SIGUSR1: could not requeue SLURM job {job} ({type(err).__name__}: {err}); resume it by hand"
    if result.returncode != 0:
        reason = (result.stderr or result.stdout or "").strip().splitlines()
        return f"SIGUSR1: scontrol requeue {job} failed ({reason[0] if reason else result.returncode}); resume by hand"
    return f"SIGUSR1: SLURM job {job} requeued (scontrol requeue); it resumes from last.pt when it starts again"

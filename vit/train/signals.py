"""Stopping a run cleanly: SIGTERM/SIGINT ask the loop to stop after the current step, a second one exits."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator

from vit.engine.distributed import env_rank


class StopSignal:
    """`with stop.installed():` the handlers are this object's; poll `requested()` once per step.

    The loop checks the flag between steps, so a stop never lands inside an optimizer update or a checkpoint
    write; a second signal raises SystemExit(128 + signum) at once, as a shell would report it. The handler's one
    line goes to the standard output's file descriptor, not through `print`: a signal that lands while the program
    is writing a log line would otherwise re-enter sys.stdout's buffer ("reentrant call"), and the log line would be
    lost to a logging error.
    """

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            raise SystemExit(128 + signum)
        self.signum = signum
        if env_rank() == 0:  # under torchrun every rank gets the signal; one line is enough
            announce(f"{self.name} received: stopping after this step (send it again to exit now)")

    def install(self) -> dict:
        previous = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
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

"""Stopping a run cleanly: SIGTERM/SIGINT ask the loop to stop after the current step, a second one exits."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from vit.engine.distributed import env_rank


class StopSignal:
    """`with stop.installed():` the handlers are this object's; poll `requested()` once per step.

    The loop checks the flag between steps, so a stop never lands inside an optimizer update or a checkpoint
    write; a second signal raises SystemExit(128 + signum) at once, as a shell would report it.
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
            print(f"{self.name} received: stopping after this step (send it again to exit now)", flush=True)

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

"""Progress through a stretch of work a user would otherwise watch in silence (decoding a dataset, evaluating
one, checking an export): a tqdm bar on a terminal, and elsewhere (a log file, CI) one line on stderr every
`every_s` seconds once the work has run that long, so a short stretch prints nothing. While a bar is open, log
records are written through tqdm, above the bar, instead of through it. It sits below every layer and imports
nothing of the project."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(
    items: Iterable[T], total: int | None, what: str, *, unit: str = "it", scale: int = 1, every_s: float = 10.0
) -> Iterator[T]:
    """Yield `items`; `total` of them (each counting `scale` units, e.g. a batch of 256 images) for `what`."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        redirect = redirect_logging_to_tqdm()
        try:
            with tqdm(total=total * scale if total else None, desc=what, unit=unit, leave=False) as bar:
                for item in items:
                    yield item
                    bar.update(scale)
        finally:
            if redirect is not None:
                redirect.__exit__(None, None, None)
        return
    start = last = time.perf_counter()
    for done, item in enumerate(items, 1):
        yield item
        now = time.perf_counter()
        if now - last >= every_s:
            last = now
            share = f" ({100 * done / total:.0f}%)" if total else ""
            count = f"{done * scale:,}" + (f" / {total * scale:,}" if total else "")
            print(f"{what}: {count} {unit}{share}, {now - start:.0f} s", file=sys.stderr, flush=True)


def redirect_logging_to_tqdm():
    """Enter tqdm's logging_redirect_tqdm (the root logger's console handlers write through tqdm.write, which clears
    the open bars, prints the line and draws them again) and return it, for the caller to exit when its bar
    closes; None where the root logger has no console handler (a test, a notebook), which then gains none."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    console = (sys.stdout, sys.stderr)
    handlers = logging.getLogger().handlers
    if not any(isinstance(h, logging.StreamHandler) and h.stream in console for h in handlers):
        return None
    redirect = logging_redirect_tqdm()
    redirect.__enter__()
    return redirect

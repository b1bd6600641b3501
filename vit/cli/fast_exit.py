"""The end of a command-line process that has finished its work.

Python's own teardown frees the interpreter's objects one by one: about a second with torch, timm and torchvision
imported (tests/cli/test_fast_exit.py), time no one needs and a time budget cannot see,
since it comes after the last line of the program. `trainer.budget` is the process's wall time from start to exit,
so the trainer's command ends with `exit_process`: every file is closed and flushed by then; the exit handlers
(logging's flush, multiprocessing's join of child processes, compile workers' shutdown) and the other non-daemon
threads still run, and `os._exit` then skips only the freeing of memory the operating system takes back anyway.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_code(code: object) -> int:
    """SystemExit's code as the process's: None is 0, a message is printed and is 1 (as Python does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr, flush=True)
    return 1


def exit_process(code: object = 0) -> NoReturn:
    # The interpreter's exit, in its order: threading's own exit hooks, which tell a process pool's manager thread
    # to stop (joblib's and concurrent.futures' executors: joining that thread first waits forever), then every
    # non-daemon thread joined, then the exit handlers.
    threading._shutdown()  # noqa: SLF001 - what Python's finalisation calls first (wait_for_thread_shutdown)
    atexit._run_exitfuncs()  # noqa: SLF001 - the handlers the interpreter's exit runs, in the same order
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
            pass
    os._exit(exit_code(code))

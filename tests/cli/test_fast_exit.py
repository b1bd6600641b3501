"""The trainer's command ends with `exit_process`: the exit handlers, the other threads and the buffered output all
complete, the exit code is kept, and Python's teardown (about a second with torch and timm imported) is skipped, so
the process ends when the run's record says it ended."""

import subprocess
import sys
import time

SCRIPT = """
import atexit, sys, threading, time
IMPORTS
from vit.cli.fast_exit import exit_process
atexit.register(lambda: open(sys.argv[1], "a").write("atexit;"))
threading.Thread(target=lambda: (time.sleep(0.3), open(sys.argv[1], "a").write("thread;"))).start()
sys.stdout.write("buffered, no newline")
print(f"{time.perf_counter():.6f}", file=sys.stderr)
exit_process(CODE)
"""


def run_script(tmp_path, code: str, imports: str = "") -> tuple[subprocess.CompletedProcess, str, float]:
    marks = tmp_path / "marks.txt"
    marks.unlink(missing_ok=True)
    script = SCRIPT.replace("IMPORTS", imports).replace("CODE", code)
    done = subprocess.run([sys.executable, "-c", script, str(marks)], capture_output=True, text=True, timeout=120)
    ended = time.perf_counter()  # the same monotonic clock as the child's (CLOCK_MONOTONIC on Linux)
    left = ended - float(done.stderr.strip().splitlines()[0])
    return done, marks.read_text() if marks.exists() else "", left


def test_the_process_ends_without_the_interpreters_teardown_and_loses_nothing(tmp_path):
    """From the call to the end of the process: the 0.3 s thread, and little else (the teardown it skips is about
    1 s with torch and timm); a generous bound for a loaded machine."""
    done, marks, left = run_script(tmp_path, "3", imports="import torch, timm")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, no newline"
    assert marks == "thread;atexit;"  # the thread is joined first, as the interpreter does, then the handlers
    assert left < 0.3 + 0.6, left


def test_a_message_exits_1_and_none_exits_0(tmp_path):
    done, _, _ = run_script(tmp_path, "'usage: something'")
    assert done.returncode == 1 and "usage: something" in done.stderr
    assert run_script(tmp_path, "None")[0].returncode == 0


def test_a_process_pool_left_running_does_not_hold_the_exit(tmp_path):
    """An executor's manager thread stops on threading's exit hook (a joblib sweep's worker pool: joined before that
    hook, the process waited forever after the sweep)."""
    pool = "from concurrent.futures import ProcessPoolExecutor as Pool; POOL = Pool(1); POOL.submit(abs, -1).result()"
    done, marks, _ = run_script(tmp_path, "0", imports=pool)
    assert done.returncode == 0 and marks == "thread;atexit;", done.stderr

"""trainer.malloc: glibc's malloc keeps a step's freed blocks for the next step (vit/runtime/host_memory.py). What
each setting applies, what it says, and, on this machine's glibc, that reused memory no longer faults."""

import json
import subprocess
import sys
import textwrap

import pytest
from trainer_utils import QUICK, run_cli

from vit.runtime.host_memory import (
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MMAP_THRESHOLD,
    MMAP_THRESHOLD_OLDER_GLIBC,
    TRIM_THRESHOLD,
    is_glibc,
    set_malloc,
    user_allocator,
)


class FakeLibc:
    """glibc's mallopt as a test sees it: records each call; refuses mmap thresholds above `max_mmap`."""

    def __init__(self, max_mmap: int | None = None):
        self.calls: list[tuple[int, int]] = []
        self.max_mmap = max_mmap

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        refused = param == M_MMAP_THRESHOLD and self.max_mmap is not None and value > self.max_mmap
        return 0 if refused else 1


def test_reuse_raises_both_thresholds():
    libc = FakeLibc()
    line = set_malloc("reuse", "cpu", environ={}, libc=libc)
    assert libc.calls == [(M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD)]
    assert not line.warning
    assert "under 1 GiB stay in the heap" in line.text and "trainer.malloc=reuse" in line.text


def test_auto_reuses_on_a_cpu_and_leaves_a_gpu_run_alone():
    libc = FakeLibc()
    assert "trainer.malloc=auto on a CPU" in set_malloc("auto", "cpu", environ={}, libc=libc).text
    assert len(libc.calls) == 2
    gpu = FakeLibc()
    assert set_malloc("auto", "cuda", environ={}, libc=gpu) is None and gpu.calls == []


def test_system_changes_nothing():
    libc = FakeLibc()
    assert set_malloc("system", "cpu", environ={}, libc=libc) is None and libc.calls == []


def test_an_older_glibc_gets_its_largest_threshold():
    libc = FakeLibc(max_mmap=MMAP_THRESHOLD_OLDER_GLIBC)
    line = set_malloc("reuse", "cpu", environ={}, libc=libc)
    assert libc.calls[1] == (M_MMAP_THRESHOLD, MMAP_THRESHOLD_OLDER_GLIBC)
    assert "under 32 MiB" in line.text and not line.warning


def test_a_refused_threshold_is_a_warning_and_nothing_else_changes():
    libc = FakeLibc(max_mmap=1 << 20)
    line = set_malloc("reuse", "cpu", environ={}, libc=libc)
    assert line.warning and "glibc refused the mmap threshold" in line.text
    assert all(param == M_MMAP_THRESHOLD for param, _ in libc.calls)


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjem"),
        ({"LD_PRELOAD": "libfoo.so:libtcmalloc_minimal.so.4"}, "LD_PRELOAD=libtcmalloc_minimal.so.4"),
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, "MALLOC_TRIM_THRESHOLD_=0"),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, "GLIBC_TUNABLES=glibc.malloc.mmap_threshold"),
    ],
)
def test_auto_keeps_the_allocator_the_environment_chose(environ, named):
    libc = FakeLibc()
    line = set_malloc("auto", "cpu", environ=environ, libc=libc)
    assert libc.calls == [] and named in line.text and "kept" in line.text and not line.warning


def test_an_unrelated_preload_is_not_an_allocator():
    assert user_allocator({"LD_PRELOAD": "libfoo.so", "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}) is None


def test_reuse_over_a_preloaded_allocator_says_it_changes_nothing():
    libc = FakeLibc()
    line = set_malloc("reuse", "cpu", environ={"LD_PRELOAD": "libjemalloc.so.2"}, libc=libc)
    assert libc.calls == [] and line.warning and "changes nothing" in line.text


def test_reuse_over_glibc_settings_from_the_environment_names_them():
    libc = FakeLibc()
    line = set_malloc("reuse", "cpu", environ={"MALLOC_MMAP_THRESHOLD_": "65536"}, libc=libc)
    assert len(libc.calls) == 2 and "over MALLOC_MMAP_THRESHOLD_=65536 from the environment" in line.text


# Allocates and frees a 48 MiB block (over glibc's largest adaptive mmap threshold, 32 MiB) 20 times, writing every
# page, and prints the minor page faults of those rounds.
FAULTS = textwrap.dedent(
    """
    import resource, sys
    from vit.runtime.host_memory import set_malloc
    print(set_malloc(sys.argv[1], "cpu", environ={}), file=sys.stderr)
    bytearray(48 << 20)  # the first allocation may fault in either setting
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        block = bytearray(48 << 20)
        del block
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


@pytest.mark.skipif(not is_glibc(), reason="the page faults are glibc malloc's; elsewhere reuse only says so")
def test_reuse_stops_the_page_faults_of_reallocated_memory():
    faults = {}
    for setting in ("system", "reuse"):
        out = subprocess.run([sys.executable, "-c", FAULTS, setting], capture_output=True, text=True, check=True)
        faults[setting] = int(out.stdout.strip())
    pages = 20 * (48 << 20) // 4096
    assert faults["system"] > pages // 2, faults  # each round's fresh mmap faults its pages in
    assert faults["reuse"] < pages // 100, faults  # the heap's pages, already there


def test_a_run_logs_the_choice(tmp_path):
    done = run_cli([*QUICK, "trainer.epochs=1", "trainer.malloc=reuse", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "run" / "train.log").read_text()
    expected = "stay in the heap for the next step" if is_glibc() else "trainer.malloc=reuse needs glibc's malloc"
    assert log.count("trainer.malloc=reuse") == 1 and expected in log
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert expected in metrics["host_memory"]  # the run's record says it too

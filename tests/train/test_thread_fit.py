"""trainer.threads=auto on a busy CPU (vit/train/thread_fit.py, vit/runtime/cpu_load.py): the load of other
processes read from the kernel's counters, the count chosen at the start beside a busy neighbour, the switch while
training when a neighbour starts part-way, and what the environment sets (vit/runtime/openmp.py) kept.

The live tests widen this pytest worker's CPU mask to every CPU for the run (conftest.py pins each worker to its
share) and start one busy loop per CPU, so that the rule's answer is one thread on any machine."""

import logging
import math
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from trainer_utils import FP32, QUICK, compose_config

from vit.runtime import cpu_load
from vit.runtime.cpu_load import CpuSample, busy_now, fitting_threads, others_busy
from vit.runtime.openmp import user_thread_count, wait_policy
from vit.train import run, thread_fit
from vit.train.thread_fit import ThreadFit, choose_threads

CPU = torch.device("cpu")
LINUX = pytest.mark.skipif(not os.path.isdir("/proc/self") or not hasattr(os, "sched_setaffinity"), reason="Linux")


@contextmanager
def every_cpu():
    """This process on every CPU of the machine for the block, its own mask back afterwards."""
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count()))
    try:
        yield sorted(os.sched_getaffinity(0))
    finally:
        os.sched_setaffinity(0, own)


@contextmanager
def busy_loops(cpus):
    """One busy Python loop pinned to each of `cpus`, stopped at the block's end. Each is started through a process
    that exits at once, so it is no child of this one: the load reading counts a child's time as the run's own (its
    loader's workers)."""
    loop = "import os\nos.sched_setaffinity(0, {%d})\nwhile True: pass"
    start = "import subprocess as s, sys; print(s.Popen([sys.executable, '-c', sys.argv[1]], stdin=s.DEVNULL, "
    start += "stdout=s.DEVNULL, stderr=s.DEVNULL).pid)"  # no pipe of ours held open by the loop
    pids = [
        int(subprocess.run([sys.executable, "-c", start, loop % c], capture_output=True, text=True, timeout=30).stdout)
        for c in cpus
    ]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(spinning(pid) for pid in pids):
        time.sleep(0.02)  # each loop's Python starts up first: the load is there only once they spin
    try:
        yield pids
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


def spinning(pid: int) -> bool:
    """Whether the process has spent 0.1 s on a CPU (utime, field 14 of /proc/<pid>/stat): past its start-up."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK") >= 0.1


def test_the_rule_leaves_the_busy_cpus_and_keeps_one_thread():
    assert [fitting_threads(2, load) for load in (0.0, 0.4, 0.6, 1.0, 1.6, 3.0)] == [2, 2, 1, 1, 1, 1]
    assert fitting_threads(8, 2.2) == 6 and fitting_threads(4, None) == 4  # unknown load: every CPU


def test_the_load_is_the_cpus_busy_time_less_this_process_tree():
    hz = os.sysconf("SC_CLK_TCK")
    before, after = CpuSample(10.0, 1000, 300), CpuSample(12.0, 1000 + 3 * hz, 300 + 1 * hz)
    assert math.isclose(others_busy(before, after), 1.0)  # 3 CPU-seconds in 2 s, 1 of them ours
    assert others_busy(before, CpuSample(10.01, 1000, 300)) is None  # too short to read
    assert others_busy(None, after) is None


def test_the_counters_are_read_from_proc(tmp_path, monkeypatch):
    (tmp_path / "self").mkdir()
    (tmp_path / "stat").write_text(
        "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 100 0 50 800 10 0 0 5 0 0\ncpu1 7 0 0 1 0 0 0 0 0 0\n"
    )
    (tmp_path / "self" / "stat").write_text(f"{os.getpid()} (py thon) S 1 1 1 0 -1 0 0 0 0 0 40 2 0 0 20 0 1\n")
    monkeypatch.setattr(cpu_load, "PROC", tmp_path)
    reading = cpu_load.sample({0})
    assert (reading.busy_ticks, reading.own_ticks) == (155, 42)  # user + system + steal of cpu0; utime + stime


@LINUX
def test_a_busy_neighbour_reads_as_a_busy_cpu():
    cpu = sorted(os.sched_getaffinity(0))[0]
    with busy_loops([cpu]):
        busy_now(0.2, {cpu})  # the loop's interpreter starts first
        assert busy_now(0.5, {cpu}) > 0.6


@LINUX
def test_auto_leaves_a_busy_neighbour_its_core_and_says_why_while_a_given_count_is_kept(tmp_path, caplog):
    with every_cpu() as cpus, busy_loops(cpus):
        busy_now(0.2)  # the loops' interpreters start first
        threads, why = choose_threads("auto", CPU)
        assert threads == 1, why
        assert f"1 of the {len(cpus)} CPUs of this process: other processes keep" in why
        assert choose_threads(2, CPU)[0] == 2  # trainer.threads=2 as given, loaded or not
        with caplog.at_level(logging.INFO):
            metrics = run(compose_config([*QUICK, "trainer.epochs=1"]), output_dir=tmp_path / "auto")
    assert metrics["threads"] == 1 and "busy" in metrics["threads_reason"]
    assert f"threads: 1 ({metrics['threads_reason']})" in [r.getMessage() for r in caplog.records]


def test_the_environments_count_and_wait_policy_are_kept_and_named(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    threads, why = choose_threads("auto", CPU)
    assert threads == 3 and "OMP_NUM_THREADS=3 from the environment, kept" in why
    assert "OMP_WAIT_POLICY=PASSIVE from the environment, kept" in why
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")
    assert user_thread_count() == 4
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert user_thread_count() is None and wait_policy() == "OpenMP's default wait"


def test_the_entry_points_leave_the_wait_policy_to_the_environment():
    """The trainer's entry point imports torch with OMP_WAIT_POLICY as the environment has it (unset here): OpenMP's
    spinning wait is the fastest alone, and trainer.threads=auto, not the policy, adapts to a busy machine."""
    code = "import os, vit.cli.train, torch; torch.ones(1); print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "None"


class NeighbourAfter:
    """The training loader, with one busy loop per CPU started after `batches` of the first epoch. From then on a
    batch taken while torch runs more than one thread waits `spin_s` first: the collapse of a many-threaded step
    beside busy cores (OpenMP's threads spinning, docs/BENCHMARKS.md "A busy CPU") made certain. This test's tiny
    model barely slows on some CPUs, and a second pytest worker beside it makes the two counts' speeds a coin toss;
    what is tested here is the switch (the load read, the counts tried, the line), not the CPU."""

    def __init__(self, loader, batches: int, cpus, started: list, spin_s: float = 0.03) -> None:
        self.loader, self.batches, self.cpus, self.started = loader, batches, cpus, started
        self.spin_s = spin_s

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if i == self.batches and not self.started:
                self.started.append(busy_loops(self.cpus))
                self.started[0].__enter__()
            if self.started and torch.get_num_threads() > 1:
                time.sleep(self.spin_s)
            yield batch

    def __getattr__(self, name):
        return getattr(self.loader, name)


SWITCH_RUN = [*QUICK, *FP32, "data.synthetic.num_train=3072", "data.batch_size=16", "trainer.epochs=1"]
SWITCH_RUN += ["trainer.log_every_n_steps=1000", "trainer.save_checkpoints=true"]


@LINUX
def test_a_neighbour_started_part_way_makes_the_run_switch_once_and_say_so(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(ThreadFit, "WINDOW_S", 0.5)
    monkeypatch.setattr(ThreadFit, "MIN_READ_S", 0.4)
    monkeypatch.setattr(ThreadFit, "CALM_WINDOWS", 1000)  # one try at a like load
    # The start reads a free machine (the suite's other worker may be busy beside this one): the run starts on
    # every CPU, and what follows is the switch while training
    monkeypatch.setattr(thread_fit, "busy_now", lambda *args: 0.0)
    started: list = []
    # ... and so do the windows before the loops start: the suite's other worker alone once made the run try one
    # thread there, against a two-thread window of before, and a like load later was not tried again
    real_others_busy = thread_fit.others_busy
    monkeypatch.setattr(thread_fit, "others_busy", lambda *args: real_others_busy(*args) if started else 0.0)
    with every_cpu() as cpus:
        if len(cpus) < 2:
            pytest.skip("one CPU: there is no other count to switch to")
        try:
            with caplog.at_level(logging.INFO):
                metrics = run(
                    compose_config(SWITCH_RUN),
                    output_dir=tmp_path / "auto",
                    train_loader_wrapper=lambda loader: NeighbourAfter(loader, 80, cpus, started),
                )
        finally:
            if started:
                started[0].__exit__(None, None, None)
        switches = [r.getMessage() for r in caplog.records if r.getMessage().startswith("threads: ")]
        fixed = run(compose_config([*SWITCH_RUN, "trainer.threads=1"]), output_dir=tmp_path / "fixed")
    assert metrics["threads"] == len(cpus), switches
    changed = [line for line in switches if " -> " in line and " at step " in line]
    assert len(changed) == len(metrics["thread_switches"]), switches  # each change said once
    assert f"threads: {len(cpus)} -> 1 at step" in changed[0], switches
    assert "other processes keeping" in changed[0] and "img/s" in changed[0]
    assert metrics["thread_switches"][-1]["to"] == 1  # beside the loops the run ended on one thread
    losses = [e["train_loss"] for e in metrics["history"]]
    assert losses == pytest.approx([e["train_loss"] for e in fixed["history"]], rel=1e-4)


def test_a_resumed_run_decides_its_threads_again(tmp_path, caplog):
    first = compose_config([*QUICK, "trainer.epochs=2", "trainer.stop_after_epoch=1"])
    run(first, output_dir=tmp_path)
    with caplog.at_level(logging.INFO):
        run(compose_config([*QUICK, "trainer.epochs=2", "trainer.resume=auto"]), output_dir=tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("threads: ")]
    assert lines and lines[-1].endswith("; decided again on resume)"), lines


def test_an_epoch_that_ends_just_after_a_window_rolled_over_reads_the_last_full_window(monkeypatch, caplog):
    """A budget's plan can end a moment after a window began: too short a reading to act on. The evaluation then
    takes the count the last full window's load asks for, not the training's count as it was."""
    monkeypatch.setattr(thread_fit, "sample", lambda: None)
    monkeypatch.setattr(thread_fit, "others_busy", lambda before, after: 1.0)  # a neighbour keeps one CPU busy
    monkeypatch.setattr(ThreadFit, "WINDOW_S", 0.0)
    monkeypatch.setattr(ThreadFit, "MIN_READ_S", 60.0)  # the epoch's last, partial window is too short to read
    counts: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", counts.append)
    fit = ThreadFit(cpus=2, threads=2, images_per_step=8)
    run = SimpleNamespace(step_state=SimpleNamespace(train_img_size=32))
    fit.on_epoch_start(run, 0)
    fit.on_step_end(1)  # the window starts
    fit.on_step_end(2)  # one full window read: it asks for 1 thread once, too few times to try it
    assert fit.threads == 2 and counts == []
    with caplog.at_level(logging.INFO, logger="vit.train"):
        fit.on_epoch_trained(run, 0)
    assert fit.threads == 1 and counts == [1]
    assert "threads: 2 -> 1 for the evaluation" in caplog.text


def test_a_try_measures_against_a_window_at_the_new_load_not_the_one_that_mixed_two(monkeypatch):
    """A window slowed by something brief asks once; the next one, where a neighbour started part-way, reads a mixed
    load at the old speed. Trying there would compare the one thread with a speed the load no longer allows, and
    keep the two threads. The try waits for two asking windows at a like load and measures against the second."""
    clock = SimpleNamespace(now=0.0)
    loads = iter([0.0, 0.0, 0.9, 1.8, 1.8, 1.8])  # free, free but slowed, mixed, loaded, loaded, the try's window
    monkeypatch.setattr(time, "perf_counter", lambda: clock.now)
    monkeypatch.setattr(thread_fit, "sample", lambda: None)
    monkeypatch.setattr(thread_fit, "others_busy", lambda before, after: next(loads))
    monkeypatch.setattr(ThreadFit, "WINDOW_S", 1.0)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    fit = ThreadFit(cpus=2, threads=2, images_per_step=10, speaks=False)
    fit.on_epoch_start(SimpleNamespace(step_state=SimpleNamespace(train_img_size=32)), 0)
    step = 0
    fit.on_step_end(step)  # the window starts
    for steps in [10, 5, 10, 3, 3]:  # one window a second: 100, 50 (slowed), 100 (mixed), 30, 30 img/s
        clock.now, step = clock.now + 1.0, step + steps
        fit.on_step_end(step)
        if steps == 10 and step > 10:
            assert fit.trying is None, "a try started on the window that mixed two loads"
    assert fit.trying == (2, pytest.approx(30.0), 1.8)  # measured against a window fully at the new load
    clock.now, step = clock.now + 1.0, step + 5  # one thread beside the neighbour: 50 img/s
    fit.on_step_end(step)
    assert fit.threads == 1 and fit.switches[-1]["before"] == pytest.approx(30.0)

"""trainer.threads=auto: torch's CPU threads fitted to the machine as it is, at the start and while the run trains.

- At the start (`choose_threads`): the CPUs of this process (its affinity, shared out among torchrun's processes),
  less those other processes keep busy over a short reading (vit/runtime/cpu_load.py), at least one. Beside one busy
  core on two, one thread runs the step about as fast as two that share their cores with it, and leaves the
  neighbour its core (docs/BENCHMARKS.md, "A busy CPU"). A resumed run decides again.
- While training (`ThreadFit`, a callback of the loop): every window of WINDOW_S seconds it reads the step's speed and
  the other processes' load. When two windows in a row at a like load ask for another count (the load's, or the
  step ran SLOWER times slower than this count ran at this image size before), it tries the other count for one
  window and keeps the faster, said in one line with what it saw and the speeds. The evaluation after an epoch
  runs with the count the load asks for then.
- `trainer.threads=<n>` is kept as given, and nothing is tried. On CUDA torch's default count stays: the step runs on
  the GPU.

OMP_NUM_THREADS in the environment is a count the user gave: auto keeps it and fits nothing. How the threads wait
(OMP_WAIT_POLICY) is libgomp's, read when torch loads: the threads line names it (vit/runtime/openmp.py says why the
default stays)."""

from __future__ import annotations

import logging
import time

import torch

from vit.runtime.cpu_load import busy_now, fitting_threads, others_busy, process_cpus, sample
from vit.runtime.distributed import Distributed
from vit.runtime.openmp import user_thread_count, wait_policy
from vit.train.callbacks import Callback

log = logging.getLogger("vit.train")


def choose_threads(setting, device: torch.device, processes: int = 1, resumed: bool = False) -> tuple[int, str]:
    """(torch's intra-op threads for this process, why, in words). trainer.threads=<n> as asked, and OMP_NUM_THREADS
    from the environment kept under auto; auto: on a CPU, the CPUs of this process that other processes leave free
    (one of the `processes` of a torchrun launch takes its share of them, without reading the load: its sibling ranks
    are the load)."""
    policy = wait_policy()
    if str(setting) != "auto":
        return int(setting), f"trainer.threads={setting}, as given; {policy}"
    if device.type != "cpu":
        return torch.get_num_threads(), f"trainer.threads=auto: torch's default, the step runs on {device.type}"
    given = user_thread_count()
    if given is not None:
        return given, f"trainer.threads=auto: OMP_NUM_THREADS={given} from the environment, kept; {policy}"
    cpus = max(1, len(process_cpus()) // processes)
    if processes > 1:
        return cpus, f"trainer.threads=auto: {cpus} of the CPUs, {processes} processes sharing them; {policy}"
    again = "; decided again on resume" if resumed else ""
    if cpus == 1:  # one thread whatever the load: nothing to read (a pinned process, each test worker)
        return 1, f"trainer.threads=auto: the one CPU of this process; {policy}{again}"
    others = busy_now(0.5)
    threads = fitting_threads(cpus, others)
    return threads, f"trainer.threads=auto: {load_words(cpus, others, threads)}; {policy}{again}"


def fits_while_training(setting, device: torch.device, dist: Distributed) -> bool:
    """Whether the run re-decides its threads as it trains (ThreadFit): auto on a CPU, one process on more than one
    CPU, no count given by OMP_NUM_THREADS."""
    alone = dist.world_size == 1 and len(process_cpus()) > 1  # one CPU: one thread, nothing to re-decide
    return str(setting) == "auto" and device.type == "cpu" and alone and user_thread_count() is None


def load_words(cpus: int, others: float | None, threads: int) -> str:
    """Why `threads` of `cpus`, in words: what the other processes keep busy."""
    if others is None:
        return f"the {cpus} CPUs of this process (their load cannot be read here)"
    if threads == cpus:
        return f"the {cpus} CPUs of this process, other processes keeping {others:.1f} of them busy"
    return f"{threads} of the {cpus} CPUs of this process: other processes keep {others:.1f} of them busy"


def like_loads(one: float | None, other: float | None) -> bool:
    """Two readings of the other processes' load within half a CPU of each other; two unreadable ones are alike (the
    speed alone decides there)."""
    if one is None or other is None:
        return one is None and other is None
    return abs(one - other) < 0.5


class ThreadFit(Callback):
    """trainer.threads=auto on a CPU: re-decide the thread count when the machine's load changes (module docstring).
    Speeds are images per second, compared only at one image size; a new size (progressive resizing)
    starts afresh after its first step, which compiles."""

    WINDOW_S = 10.0  # a window: the steps of at least this long, read together
    SLOWER = 1.3  # a window this much slower than the count's earlier speed at this size points to contention
    MIN_READ_S = 2.0  # the kernel counts CPU time in ticks of 10 ms: a shorter reading is too coarse to act on
    CALM_WINDOWS = 6  # after a try, windows before another one at a like load (a different load may try at once)

    def __init__(self, cpus: int, threads: int, images_per_step: float, speaks: bool = True) -> None:
        self.cpus, self.threads, self.speaks = cpus, threads, speaks
        self.images_per_step = images_per_step
        self.img_size: int | None = None
        self.window: tuple[int, float, object] | None = None  # (step, clock, CpuSample) where the window started
        self.speeds: dict[int, float] = {}  # threads -> img/s at this size, the latest window that ran it
        self.trying: tuple[int, float, float | None] | None = None  # (count before, its speed, the load then)
        self.tried: tuple[float | None, int] | None = None  # (the load at the last try, windows since)
        self.asks = 0  # windows in a row, at a like load, whose load or speed asked for another count
        self.ask_load: float | None = None  # the load of the last window that asked
        self.last_load: float | None = None  # what the other processes kept busy over the last full window
        self.switches: list[dict] = []  # every change kept, for metrics.json

    def on_epoch_start(self, run, epoch: int) -> None:
        self.last_load = None  # an epoch reads its own load: the evaluation between them is not the training's
        size = run.step_state.train_img_size
        if size != self.img_size:  # another step cost: nothing measured so far compares
            self.img_size, self.speeds, self.asks = size, {}, 0
        self.window = None  # the epoch end (evaluation, checkpoint) is not a step: the window starts afresh

    def on_epoch_trained(self, run, epoch: int) -> None:
        """Before the evaluation: the count the load asks for now (no timing to compare against there). An epoch
        that ends just after a window rolled over reads the last full window instead: a budget's last evaluation
        is its longest, and beside a neighbour that came late it would otherwise run on every thread."""
        if self.trying is not None:  # a try cut short by the epoch's end: back to the count it left
            self.set(self.trying[0])
            self.trying = None
        long_enough = self.window is not None and time.perf_counter() - self.window[1] >= self.MIN_READ_S
        others = others_busy(self.window[2], sample()) if long_enough else self.last_load
        wanted = fitting_threads(self.cpus, others)
        if others is not None and wanted != self.threads:
            self.say(f"threads: {self.threads} -> {wanted} for the evaluation: {load_words(self.cpus, others, wanted)}")
            self.set(wanted)
            self.speeds.pop(wanted, None)
        self.window = None

    def on_step_end(self, step: int) -> None:
        now = time.perf_counter()
        if self.window is None:  # the first step of a window is its start (a new size's compile is not timed)
            self.window = (step, now, sample())
            return
        first, started, load_before = self.window
        if now - started < self.WINDOW_S or step <= first:
            return
        after = sample()
        speed = (step - first) * self.images_per_step / (now - started)
        others = others_busy(load_before, after)
        self.window, self.last_load = (step, now, after), others
        if self.trying is not None:
            self.settle(step, speed, others)
            return
        earlier = self.speeds.get(self.threads)
        self.speeds[self.threads] = speed
        if self.tried is not None:
            self.tried = (self.tried[0], self.tried[1] + 1)
        wanted = fitting_threads(self.cpus, others)
        slowed = earlier is not None and speed * self.SLOWER < earlier
        # Two windows in a row at a like load must ask for the change: the first one after the load changed mixes
        # the two loads, and its speed (the try's yardstick) is no fair measure of the count it ran
        asking = wanted != self.threads or slowed
        if not asking:
            self.asks = 0
        else:
            self.asks = self.asks + 1 if self.asks and like_loads(self.ask_load, others) else 1
            self.ask_load = others
        if self.asks >= 2 and self.may_try(others):
            other = wanted if wanted != self.threads else (1 if self.threads > 1 else self.cpus)
            if other != self.threads:
                self.trying, self.asks = (self.threads, speed, others), 0
                self.set(other)

    def may_try(self, others: float | None) -> bool:
        """Not again at a like load until CALM_WINDOWS have passed since the last try."""
        if self.tried is None:
            return True
        load, windows = self.tried
        return not like_loads(load, others) or windows >= self.CALM_WINDOWS

    def settle(self, step: int, speed: float, others: float | None) -> None:
        """The try's window is read: keep the faster count, say what was seen once."""
        before, before_speed, load = self.trying
        tried, self.trying, self.tried = self.threads, None, (others, 0)
        self.speeds[tried] = speed
        seen = "the other processes' load" if load is None else f"other processes keeping {load:.1f} CPUs busy"
        speeds = f"{before_speed:,.0f} img/s on {before} thread{'s' * (before > 1)}, {speed:,.0f} on {tried}"
        if speed > before_speed:
            self.switches.append({"step": step, "from": before, "to": tried, "before": before_speed, "after": speed})
            self.say(f"threads: {before} -> {tried} at step {step:,}: {seen}; {speeds}, so {tried} it is")
        else:
            self.set(before)
            self.say(f"threads: {before} kept at step {step:,}: {seen}; {speeds}, so back to {before}")

    def set(self, threads: int) -> None:
        self.threads = threads
        torch.set_num_threads(threads)

    def say(self, line: str) -> None:
        if self.speaks:
            log.info(line)

    def on_epoch_record(self, run, record: dict, scalars: dict, val: dict | None) -> None:
        scalars["threads/count"] = self.threads

    def on_train_end(self, run, metrics: dict) -> None:
        metrics["thread_switches"] = list(self.switches)

"""Shared test settings and fixtures: each pytest-xdist worker on its own share of the CPUs, a fixed seed per test,
and a finished 1-epoch run of the tiny model, the GPU tier skipped where no CUDA device is. Plain helpers are in
trainer_utils.py."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from trainer_utils import QUICK, compose_config


def _own_cpus() -> int:
    """Pin this pytest-xdist worker to its share of the CPUs (worker k of n: every n-th CPU from the k-th) and
    return the count. The tests' trainings use every CPU they may run on (trainer.threads=auto, the loader's
    workers, the train.py processes they start, which inherit the mask): unpinned, n workers would each start that
    many threads on the same cores, and PyTorch's spinning threads slow each other down when they outnumber them."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return min(2, os.cpu_count() or 1)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= count:
        os.sched_setaffinity(0, cpus[int(worker.removeprefix("gw")) % count :: count])
    return len(os.sched_getaffinity(0))


torch.set_num_threads(_own_cpus())


# The folders whose files take longest first (they train end to end): pytest-xdist hands a worker one file at a time
# in this order (`make test` turns off its own reordering by test count), and a long file handed out last would keep
# one worker busy while the other idles.
LONGEST_FIRST = ["e2e", "train", "deploy", "models", "cli", "data", "analysis", "settings"]


def pytest_collection_modifyitems(config, items):
    """The files of LONGEST_FIRST's folders in its order, each file's tests in theirs. The GPU tier (tests marked
    `cuda`) runs where a CUDA device is, and is skipped, with that reason, elsewhere."""
    here = Path(__file__).parent

    def rank(item) -> int:
        folder = Path(item.path).relative_to(here).parts[0]
        return LONGEST_FIRST.index(folder) if folder in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the collection's order within a rank
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="marked cuda: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 1-epoch run of the tiny model: its last.pt is what the resume tests feed back."""
    from vit.train import run

    run_dir = tmp_path_factory.mktemp("trained")
    run(compose_config([*QUICK, "trainer.epochs=1"]), output_dir=run_dir)
    return run_dir / "checkpoints" / "last.pt"


# The session's CIFAR-10 cache folder: chosen by the process that starts the session (pytest-xdist's controller, or
# pytest alone) and handed to the workers it starts through the environment they inherit.
CIFAR10_CACHE_ENV = "VIT_TESTS_CIFAR10_CACHE"


def pytest_configure(config):
    """In memory (/dev/shm) where the machine has it: extracting the archive's 60,000 files to an ext4 disk measured
    49 s of system time on the 2-core CI-like machine (2026-11-26), 1.5 s to tmpfs; in the system's temporary folder
    elsewhere."""
    if hasattr(config, "workerinput") or CIFAR10_CACHE_ENV in os.environ:
        return
    shm = Path("/dev/shm")
    where = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    os.environ[CIFAR10_CACHE_ENV] = tempfile.mkdtemp(prefix="vit-tests-", dir=where)
    config._vit_cifar10_cache_owner = True


def pytest_unconfigure(config):
    """The cache leaves memory with the session, removed by the process that chose it once its workers are done."""
    if getattr(config, "_vit_cifar10_cache_owner", False):
        shutil.rmtree(os.environ.pop(CIFAR10_CACHE_ENV), ignore_errors=True)


@pytest.fixture(scope="session")
def cifar10_cache():
    """One cache folder for the CIFAR-10 archive (VIT_CIFAR10_ARCHIVE) shared by every test and pytest-xdist worker of
    the session: it is extracted and scanned once (the extraction and the cache files are atomic, so two workers
    reading it at once each get a whole copy)."""
    folder = Path(os.environ[CIFAR10_CACHE_ENV]) / "cifar10-cache"
    folder.mkdir(parents=True, exist_ok=True)
    return folder

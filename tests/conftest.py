"""Shared test settings and fixtures: each pytest-xdist worker on its own share of the CPUs, a fixed seed per test,
and a finished 1-epoch run of the tiny model, the GPU tier skipped where no CUDA device is. Plain helpers are in
trainer_utils.py."""

import os

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


def pytest_collection_modifyitems(config, items):
    """The GPU tier (tests marked `cuda`) runs where a CUDA device is, and is skipped, with that reason, elsewhere."""
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


@pytest.fixture(scope="session")
def cifar10_cache(tmp_path_factory, request):
    """One cache folder for the CIFAR-10 archive (VIT_CIFAR10_ARCHIVE) shared by every test and pytest-xdist worker of
    the session: it is extracted and scanned once (the extraction and the cache files are atomic, so two workers
    reading it at once each get a whole copy)."""
    base = tmp_path_factory.getbasetemp()
    worker = getattr(request.config, "workerinput", None)  # set in a pytest-xdist worker, whose basetemp is its own
    folder = (base.parent if worker else base) / "cifar10-cache"
    folder.mkdir(exist_ok=True)
    return folder

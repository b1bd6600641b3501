"""Shared test settings and fixtures: small thread count (CI has 2 cores), a fixed seed per test, and a finished
1-epoch run of the tiny model, the GPU tier skipped where no CUDA device is. Plain helpers are in trainer_utils.py."""

import pytest
import torch
from trainer_utils import QUICK, compose_config

torch.set_num_threads(2)


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

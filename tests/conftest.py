"""Shared test settings: small thread count (CI has 2 cores) and a fixed seed per test."""

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)

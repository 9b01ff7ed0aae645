"""Shared test settings."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # The test problems are small: on a shared 2-core machine extra intra-op
    # threads only spin and contend (measured 2-3x slower suites with 2 threads).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

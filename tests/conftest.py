"""Shared test settings."""

import os

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


@pytest.fixture
def device():
    """The device of device-generic tests: ``$BACKDRIVE_TEST_DEVICE`` (``make test-cuda`` sets cuda), else the CPU."""
    dev = torch.device(os.environ.get("BACKDRIVE_TEST_DEVICE", "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.fail("BACKDRIVE_TEST_DEVICE asks for CUDA, but torch sees no CUDA device")
    return dev

"""backdrive.runtime: the allocator setting for large CPU batches."""

import ctypes
import ctypes.util
import json
import subprocess
import sys

import pytest
import torch

from backdrive import InputError, runtime


def _glibc() -> bool:
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").gnu_get_libc_version
    except (OSError, AttributeError):
        return False
    return sys.platform.startswith("linux")


@pytest.mark.parametrize("bad", [-1, 2**31, 1.5, True, "256M", None])
def test_retain_freed_memory_rejects_bad_limits(bad):
    with pytest.raises(InputError, match="max_bytes"):
        runtime.retain_freed_memory(bad)


# In a fresh process (the setting lasts for the life of a process): the page
# faults of a third array of the size of two freed ones, with glibc's defaults
# (48 MiB: above anything glibc serves from its heaps by itself) and after
# retain_freed_memory() (24 MiB: the heap keeps it), and forward dynamics of the
# Panda at 10,000 samples before and after, which must be identical.
_SCRIPT = r"""
import json, resource, torch
import backdrive as bd
from backdrive import runtime
from backdrive.dynamics import forward_dynamics
torch.set_num_threads(1)

def refault(nbytes):
    for _ in range(4):  # aligned requests need a little more than a freed block: a few rounds
        x = torch.ones(nbytes // 4)  # touches every page
        del x
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = torch.ones(nbytes // 4)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (nbytes / 4096)

robot = bd.RobotModel.from_urdf(bd.data.get_data_path("panda"))
g = torch.Generator().manual_seed(0)
q = robot.random_q(10000, generator=g)
v = torch.randn(10000, robot.nv, generator=g, dtype=robot.dtype)
tau = torch.randn(10000, robot.nv, generator=g, dtype=robot.dtype)
default = refault(48 << 20)
a0 = forward_dynamics(robot, q, v, tau)
applied = runtime.retain_freed_memory()
retained = refault(24 << 20)
a1 = forward_dynamics(robot, q, v, tau)
print(json.dumps({"applied": applied, "default": default, "retained": retained, "same": bool(torch.equal(a0, a1))}))
"""


def test_retain_freed_memory_reuses_pages_and_changes_no_result():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["applied"] is _glibc()
    assert r["same"]
    if r["applied"]:
        # Fractions of the array's pages faulted in again: glibc's defaults
        # give the second array fresh pages, the retained heap its old ones.
        assert r["default"] > 0.5, r
        assert r["retained"] < 0.05, r


def test_retain_freed_memory_returns_false_without_glibc(monkeypatch):
    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    assert runtime.retain_freed_memory() is False


# ----------------------------------------------------------------------------- thread count


def test_threads_for_batch_uses_one_thread_for_small_batches_and_restores():
    from backdrive.runtime import SMALL_BATCH, adaptive_threads, threads_for_batch

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threads_for_batch(SMALL_BATCH - 1):
            assert torch.get_num_threads() == 1
            with threads_for_batch(4):  # nested: nothing to restore twice
                assert torch.get_num_threads() == 1
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with threads_for_batch(SMALL_BATCH):
            assert torch.get_num_threads() == 2
        assert adaptive_threads(False) is True
        try:
            with threads_for_batch(1):
                assert torch.get_num_threads() == 2
        finally:
            adaptive_threads(True)
        with pytest.raises(InputError, match="adaptive_threads"):
            adaptive_threads("yes")
    finally:
        torch.set_num_threads(previous)


def test_simulator_rollout_of_a_small_batch_runs_on_one_thread():
    from backdrive.sim import MassSpringDamper, Simulator

    seen = []

    class Recording(MassSpringDamper):
        def forward_dynamics(self, q, v, tau):
            seen.append(torch.get_num_threads())
            return super().forward_dynamics(q, v, tau)

    sim = Simulator(Recording(), dt=0.01)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        sim.rollout(sim.initial_state(torch.zeros(8, 1, dtype=torch.float64)), sim.zero_controls(3, 8))
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
        seen.clear()
        big = 2048
        sim.rollout(sim.initial_state(torch.zeros(big, 1, dtype=torch.float64)), sim.zero_controls(2, big))
        assert set(seen) == {2}
    finally:
        torch.set_num_threads(previous)

"""backdrive.runtime: the allocator setting for large CPU batches."""

import contextlib
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


@contextlib.contextmanager
def _load(others: float, cores: int = 2):
    """Mock what the thread policy reads: other processes' load and the cores."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime, "other_load", lambda: others)
        mp.setattr(runtime, "available_cores", lambda: cores)
        yield


def test_threads_for_load_leaves_the_cores_other_processes_take():
    from backdrive.runtime import BUSY_CORE_SHARE, threads_for_load

    assert threads_for_load(2, 2, 0.0) == 2  # quiet
    assert threads_for_load(2, 2, BUSY_CORE_SHARE) == 2  # a light competitor takes no core
    assert threads_for_load(2, 2, 0.3) == 1  # one that keeps a core busy a third of the time does
    assert threads_for_load(2, 2, 1.0) == 1
    assert threads_for_load(2, 2, 9.0) == 1  # never below one thread
    assert threads_for_load(8, 8, 1.2) == 7
    assert threads_for_load(8, 8, 1.3) == 6
    assert threads_for_load(4, 8, 2.0) == 4  # never above torch's count
    assert threads_for_load(1, 8, 0.0) == 1


def test_threads_for_batch_takes_one_thread_for_a_large_batch_under_load_and_restores():
    from backdrive.runtime import SMALL_BATCH, threads_for_batch

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with _load(1.0), threads_for_batch(10 * SMALL_BATCH):  # another process busy on one of 2 cores
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with _load(0.1), threads_for_batch(10 * SMALL_BATCH):
            assert torch.get_num_threads() == 2
        with _load(1.0, cores=4), threads_for_batch(10 * SMALL_BATCH):  # 3 cores free, torch has 2 threads
            assert torch.get_num_threads() == 2
        runtime.adaptive_threads(False)
        try:
            with _load(5.0), threads_for_batch(10 * SMALL_BATCH):
                assert torch.get_num_threads() == 2
        finally:
            runtime.adaptive_threads(True)
    finally:
        torch.set_num_threads(previous)


def test_other_load_subtracts_this_process_and_averages_over_probes(monkeypatch):
    # 5 runnable tasks system-wide, 2 of them this process's threads: 3 others now.
    monkeypatch.setattr(runtime, "_runnable_now", lambda: (5, 2))
    monkeypatch.setattr(runtime, "_others", runtime._LoadAverage())
    assert runtime.other_load() == 3.0
    avg = runtime._LoadAverage()
    assert avg.update(1.0, now=0.0) == 1.0
    # The competitor pauses: the instant count is 0, the average still holds it.
    held = avg.update(0.0, now=1.0)
    assert 0.8 < held < 1.0
    # Long after, it has decayed; a competitor busy now always counts in full.
    assert avg.update(0.0, now=100.0) < 1e-3
    assert avg.update(2.0, now=100.5) == 2.0
    # Without /proc: the 1-minute load average less this process's own core.
    monkeypatch.setattr(runtime, "_runnable_now", lambda: None)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (2.5, 2.0, 1.0))
    assert runtime.other_load() == 1.5


def test_runnable_now_reads_this_process_on_linux():
    if not runtime.sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    running, own = runtime._runnable_now()
    assert running >= 1 and own >= 1  # the reading thread runs (both are snapshots: no order between them)
    assert 1 <= runtime.available_cores() <= (runtime.os.cpu_count() or 1)


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
        with _load(0.0), threads_for_batch(SMALL_BATCH):  # a quiet machine: torch's count stays
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
        with _load(0.0):  # a quiet machine: a large batch keeps torch's count
            sim.rollout(sim.initial_state(torch.zeros(big, 1, dtype=torch.float64)), sim.zero_controls(2, big))
        assert set(seen) == {2}
        seen.clear()
        with _load(1.0):  # another process busy on one of the two cores
            sim.rollout(sim.initial_state(torch.zeros(big, 1, dtype=torch.float64)), sim.zero_controls(2, big))
        assert set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)


# ----------------------------------------------------------------------------- workspaces


def test_workspace_hands_out_only_arrays_nothing_else_holds():
    like = torch.empty(1)
    shape = (4, 50000)
    with runtime.reuse_workspaces():
        a = runtime.workspace_empty(shape, like)
        ptr = a.data_ptr()
        del a
        b = runtime.workspace_empty(shape, like)
        assert b.data_ptr() == ptr  # freed: reused
        row = b[1]
        del b
        assert runtime.workspace_empty(shape, like).data_ptr() != ptr  # a view is alive
        del row
        c = runtime.workspace_empty(shape, like)
        assert c.data_ptr() == ptr
        w = torch.randn(shape, requires_grad=True)
        y = c * w  # autograd saves c for the backward pass
        del c
        assert runtime.workspace_empty(shape, like).data_ptr() != ptr
        del y
        assert runtime.workspace_empty(shape, like).data_ptr() == ptr
        small = runtime.workspace_empty((3,), like)  # below WORKSPACE_MIN_BYTES: plain torch.empty
        assert small.shape == (3,)
    # Outside a block every array is new.
    x = runtime.workspace_empty(shape, like)
    del x
    with pytest.raises(InputError):
        runtime.reuse_workspaces(max_bytes=-1)


def _humanoid_states(n: int, seed: int):
    import backdrive as bd

    robot = bd.RobotModel.from_urdf(bd.data.get_data_path("quadruped"), floating_base=True)
    g = torch.Generator().manual_seed(seed)
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=robot.dtype)
    tau = torch.randn(n, robot.nv, generator=g, dtype=robot.dtype)
    return robot, q, v, tau


def test_dynamics_in_a_workspace_block_match_and_results_survive_later_calls():
    from backdrive.dynamics import forward_dynamics, inverse_dynamics, mass_matrix

    robot, q, v, tau = _humanoid_states(1500, 0)
    _, q2, v2, tau2 = _humanoid_states(1500, 1)
    with torch.no_grad():
        ref = [f(*x) for f, x in ((lambda *x: forward_dynamics(robot, *x), (q, v, tau)),
                                  (lambda *x: inverse_dynamics(robot, *x), (q, v, tau)),
                                  (lambda q: mass_matrix(robot, q), (q,)))]
        with runtime.reuse_workspaces():
            got = []
            for _ in range(2):
                got = [forward_dynamics(robot, q, v, tau), inverse_dynamics(robot, q, v, tau), mass_matrix(robot, q)]
                # Later calls with other inputs must not overwrite earlier results.
                forward_dynamics(robot, q2, v2, tau2)
                mass_matrix(robot, q2)
                inverse_dynamics(robot, q2, v2, tau2)
                for r, x in zip(ref, got):
                    assert torch.equal(r, x)


def test_gradients_in_a_workspace_block_survive_calls_between_forward_and_backward():
    from backdrive.dynamics import forward_dynamics
    from backdrive.kinematics import forward_kinematics

    robot, q, v, tau = _humanoid_states(1500, 0)
    _, q2, v2, tau2 = _humanoid_states(1500, 1)

    def grads():
        qq, vv, tt = (x.clone().requires_grad_(True) for x in (q, v, tau))
        a = forward_dynamics(robot, qq, vv, tt)
        T = forward_kinematics(robot, qq)
        with torch.no_grad():  # other work between forward and backward
            forward_dynamics(robot, q2, v2, tau2)
            forward_kinematics(robot, q2)
        (a.square().sum() + T.sum()).backward()
        return qq.grad, vv.grad, tt.grad

    ref = grads()
    with runtime.reuse_workspaces():
        got = grads()
        got2 = grads()
    for r, x, y in zip(ref, got, got2):
        torch.testing.assert_close(x, r, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(y, r, rtol=1e-12, atol=1e-12)


def test_threads_for_batch_opens_a_workspace():
    like = torch.empty(1)
    with runtime.threads_for_batch(10):
        a = runtime.workspace_empty((4, 50000), like)
        ptr = a.data_ptr()
        del a
        assert runtime.workspace_empty((4, 50000), like).data_ptr() == ptr

"""The training hot paths on the test device (``BACKDRIVE_TEST_DEVICE``, ``make test-cuda``).

On the CPU these check results; on CUDA they also check that the contact
step and an env step make no host synchronisation but the one documented
in :func:`~backdrive.contact._model.active_set_passes` (one per pass of the
unilateral step, at most ``UNILATERAL_PASSES`` per contact substep: it
decides whether to solve again), and that nothing is built on the CPU by
mistake. The syncs are watched with ``torch.cuda.set_sync_debug_mode("warn")``
after one warm-up step, so that constants memoised on their first call
(``geometry_constants``) are built outside the watch.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import warnings

import pytest
import torch

from backdrive.contact._model import UNILATERAL_PASSES, _spd_factor, active_set_passes
from backdrive.envs import QuadrupedWalk
from backdrive.sim import State


@contextlib.contextmanager
def _host_syncs(device: torch.device):
    """On CUDA: yields a list that, after the block, holds ``(filename,
    lineno)`` of every host synchronisation inside (sync debug mode "warn").
    On the CPU: nothing to watch (the list stays empty)."""
    found: list[tuple[str, int]] = []
    if device.type != "cuda":
        yield found
        return
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    found.extend((w.filename, w.lineno) for w in caught if "synchronizing CUDA operation" in str(w.message))


def _active_set_sync() -> tuple[str, int]:
    """``(filename, lineno)`` of the documented sync: ``active_set_passes``'s test of a negative row."""
    lines, start = inspect.getsourcelines(active_set_passes)
    hits = [start + i for i, line in enumerate(lines) if "bool(neg.any())" in line]
    assert len(hits) == 1, hits
    return active_set_passes.__code__.co_filename, hits[0]


def _assert_only_active_set_syncs(found, substeps: int) -> None:
    """Every sync in ``found`` is the active set's, at most one per pass of ``substeps`` contact steps."""
    path, line = _active_set_sync()
    same = os.path.normcase(os.path.abspath(path))
    other = [(f, n) for f, n in found if (os.path.normcase(os.path.abspath(f)), n) != (same, line)]
    assert not other, f"host synchronisations other than active_set_passes's (line {line}): {other}"
    assert len(found) <= substeps * UNILATERAL_PASSES, (len(found), substeps)


def _walker(device, n=4, **kw):
    return QuadrupedWalk(n, gait_frequency=3.0, gait_amplitude=0.15, dtype=torch.float64, device=device, **kw)


def test_contact_substep_runs_without_host_sync(device):
    env = _walker(device)
    env.reset(seed=0)
    p = env.split(env.state)
    q, v = p["q"], p["v"]
    u = (env.q_stand + 0.1).expand(env.num_envs, 12)
    env.sim.rollout(State(q, v), u[:, None, :], check_finite=False)  # warm-up: memoised constants built
    with _host_syncs(device) as found:
        traj = env.sim.rollout(State(q, v), u[:, None, :], check_finite=False)
    _assert_only_active_set_syncs(found, substeps=1)
    assert traj.q.device == q.device and traj.contact.normal_force.device == q.device
    # The same step as Simulator.step (with its finiteness check, outside the watch).
    ref = env.sim.step(State(q, v), u)
    torch.testing.assert_close(traj.q[:, -1], ref.q, rtol=0, atol=0)
    torch.testing.assert_close(traj.v[:, -1], ref.v, rtol=0, atol=0)


def test_quadruped_env_step_runs_without_host_sync(device):
    env = _walker(device)
    obs = env.reset(seed=1)
    action = torch.full((env.num_envs, 12), 0.1, dtype=env.dtype, device=device)
    env.step(action)  # warm-up: memoised constants built
    steps = 2
    with _host_syncs(device) as found:
        for _ in range(steps):
            obs, reward, terminated, truncated, _ = env.step(action)
    _assert_only_active_set_syncs(found, substeps=steps * env.substeps)
    assert obs.device == reward.device == terminated.device == env.device
    assert bool(torch.isfinite(obs).all()) and bool(torch.isfinite(reward).all())


def test_spd_factor_without_its_check_is_the_factor_or_nan():
    # The GPU's factorisation (no error check, no host sync), taken here on
    # the CPU: the checked factor where the matrix is positive definite, NaN
    # where it is not (that sample's state turns non-finite, which the
    # rollout reports), where the checked one raises.
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 4, 4, dtype=torch.float64, generator=g)
    A = X @ X.mT + 0.1 * torch.eye(4, dtype=torch.float64)
    A[1] = -A[1]
    L = _spd_factor(A, check=False)
    for k in (0, 2):
        assert torch.equal(L[k], _spd_factor(A[k], check=True))
    assert bool(torch.isnan(L[1]).all())
    with pytest.raises(torch.linalg.LinAlgError):
        _spd_factor(A, check=True)


def test_quadruped_evaluate_on_the_test_device(device):
    env = _walker(device, n=2)

    def still(obs):
        return torch.zeros(obs.shape[0], 12, dtype=obs.dtype, device=obs.device)

    m = env.evaluate(still, seconds=0.2, settle=0.0)
    assert m["q"].device == env.device and m["q"].shape == (11, 2, 19)
    assert math.isfinite(m["distance"]) and m["upright"] == 1.0

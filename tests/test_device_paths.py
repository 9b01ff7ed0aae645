"""The training hot paths on the test device (``BACKDRIVE_TEST_DEVICE``, ``make test-cuda``).

On the CPU these check results; on CUDA they also check that the contact
step and an env step make no host synchronisation
(``torch.cuda.set_sync_debug_mode("error")`` turns one into an error) and
that nothing is built on the CPU by mistake.
"""

from __future__ import annotations

import contextlib
import math

import torch

from backdrive.envs import QuadrupedWalk
from backdrive.sim import State


@contextlib.contextmanager
def _no_host_sync(device: torch.device):
    """On CUDA: any host synchronisation inside raises. On the CPU: nothing to watch."""
    if device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _walker(device, n=4, **kw):
    return QuadrupedWalk(n, gait_frequency=3.0, gait_amplitude=0.15, dtype=torch.float64, device=device, **kw)


def test_contact_substep_runs_without_host_sync(device):
    env = _walker(device)
    env.reset(seed=0)
    p = env.split(env.state)
    q, v = p["q"], p["v"]
    u = (env.q_stand + 0.1).expand(env.num_envs, 12)
    with _no_host_sync(device):
        traj = env.sim.rollout(State(q, v), u[:, None, :], check_finite=False)
    assert traj.q.device == q.device and traj.contact.normal_force.device == q.device
    # The same step as Simulator.step (with its finiteness check, outside the watch).
    ref = env.sim.step(State(q, v), u)
    torch.testing.assert_close(traj.q[:, -1], ref.q, rtol=0, atol=0)
    torch.testing.assert_close(traj.v[:, -1], ref.v, rtol=0, atol=0)


def test_quadruped_env_step_runs_without_host_sync(device):
    env = _walker(device)
    obs = env.reset(seed=1)
    action = torch.full((env.num_envs, 12), 0.1, dtype=env.dtype, device=device)
    with _no_host_sync(device):
        for _ in range(2):
            obs, reward, terminated, truncated, _ = env.step(action)
    assert obs.device == reward.device == terminated.device == env.device
    assert bool(torch.isfinite(obs).all()) and bool(torch.isfinite(reward).all())


def test_quadruped_evaluate_on_the_test_device(device):
    env = _walker(device, n=2)

    def still(obs):
        return torch.zeros(obs.shape[0], 12, dtype=obs.dtype, device=obs.device)

    m = env.evaluate(still, seconds=0.2, settle=0.0)
    assert m["q"].device == env.device and m["q"].shape == (11, 2, 19)
    assert math.isfinite(m["distance"]) and m["upright"] == 1.0

"""``QuadrupedWalk(contact=, action_delay=)``: the physics a calibration gives (a contact law and a control
delay) in the training env. The delay is checked against :class:`HookedDelay`, the version the benchmarks'
``DelayedWalk`` used before the env had the setting (the earlier closed-loop runs'). The route from a real fit to
the env is tested in ``tests/test_sysid_contact.py``."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from backdrive import InputError
from backdrive.contact import ContactParameters
from backdrive.envs import QuadrupedWalk

ROOT = Path(__file__).resolve().parents[1]


def _rollout(env, actions, seed=3):
    env.reset(seed=seed)
    state = env.state
    out = []
    for a in actions:
        state = env.transition(state, a)
        out.append(state)
    return torch.stack(out)


class HookedDelay(QuadrupedWalk):
    """The reference: the delay as ``benchmarks/calibration_loop.DelayedWalk`` did it before the env had it
    (19th session), by replacing the servo target of the first ``delay`` physics substeps."""

    delay = 0

    def transition(self, state, action):
        if not self.delay:
            return super().transition(state, action)
        p = self.split(state)
        phase = p["phase"] - 2 * math.pi * self.gait_frequency * self.dt
        prev = self.to_robot_order(self.q_stand + self.action_scale * p["last_action"] + self.gait_offsets(phase))
        calls = [0]
        inner = QuadrupedWalk._substep

        def substep(groups, q, v, u):
            if calls[0] < self.delay:
                u = torch.where(torch.isfinite(prev), prev, u)
            calls[0] += 1
            return inner(groups, q, v, u)

        self._substep = substep
        try:
            return super().transition(state, action)
        finally:
            del self._substep


def test_action_delay_holds_the_previous_target_for_its_substeps():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import calibration_loop as CL

    torch.manual_seed(0)
    actions = torch.rand(6, 3, 12, dtype=torch.float64) * 2 - 1
    kw = {"num_envs": 3, "dtype": torch.float64, "gait_frequency": 2.0}
    for delay in (1, 3):
        ours = QuadrupedWalk(action_delay=delay, **kw)
        reference = HookedDelay(**kw)
        reference.delay = delay
        bench = CL.DelayedWalk(**kw)
        bench.delay = delay  # the benchmarks' name for the same setting
        a, b = _rollout(ours, actions), _rollout(reference, actions)
        assert torch.allclose(a, b, atol=1e-12, rtol=0)
        assert torch.equal(a, _rollout(bench, actions))
    with pytest.raises(ValueError, match="exceeds"):
        bench.delay = 5
    # Without delay the env is unchanged, and a delay changes the motion.
    plain, late = _rollout(QuadrupedWalk(**kw), actions), _rollout(QuadrupedWalk(action_delay=2, **kw), actions)
    assert torch.equal(plain, _rollout(QuadrupedWalk(action_delay=0, **kw), actions))
    assert (plain - late).abs().max() > 1e-4


def test_action_delay_keeps_the_gradient():
    env = QuadrupedWalk(num_envs=1, dtype=torch.float64, action_delay=2)
    env.reset(seed=0)
    state = env.state
    a = torch.zeros(1, 12, dtype=torch.float64, requires_grad=True)
    s1 = env.transition(state, a)
    s2 = env.transition(s1, torch.zeros(1, 12, dtype=torch.float64))
    g, = torch.autograd.grad(s2[:, :19].sum(), a)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_contact_law_is_the_envs_ground():
    law = ContactParameters(stiffness=1.3e4, damping=180.0, friction=0.55)
    env = QuadrupedWalk(num_envs=2, contact=law)
    assert env.nominal_contact == law and env.contact.params.friction == pytest.approx(0.55)
    assert env.sim.contact is env.contact
    zero = torch.zeros(2, 12)
    moved = _rollout(env, [zero] * 25) - _rollout(QuadrupedWalk(num_envs=2), [zero] * 25)
    assert moved[-1, :, :19].abs().max() > 1e-3  # another ground, another motion


@pytest.mark.parametrize("kw, match", [({"action_delay": 5}, "action_delay"), ({"action_delay": -1}, "action_delay"),
                                       ({"action_delay": 1.0}, "action_delay"), ({"action_delay": True}, "action_delay"),
                                       ({"contact": {"friction": 0.5}}, "ContactParameters")])
def test_bad_physics_settings_are_refused(kw, match):
    with pytest.raises(InputError, match=match):
        QuadrupedWalk(num_envs=1, **kw)


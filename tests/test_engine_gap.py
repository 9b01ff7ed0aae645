"""The calibration loop's two engines on the same Go1 (12th session, ``benchmarks/calibration_gap.py``).

* Without contact, one physics step of backdrive's loop sim and of MuJoCo's
  "reality" model agree, with and without the 0.01 kg m^2 armature.
* The control delay means the same in both: ``DelayedWalk``'s control step
  equals MuJoCo stepped with the previous servo target for ``delay``
  substeps and the new one after (``run_mujoco(delay=)``'s schedule), for a
  scripted action sequence.
* ``NoAdhesionSimulator``'s contact step applies no negative normal force,
  takes the feet it would have pulled down out of the step, and equals the
  library's step where no normal force is negative.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

mujoco = pytest.importorskip("mujoco")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _mujoco_contact as mc  # noqa: E402
import calibration_loop as cl  # noqa: E402
import locomotion_transfer as lt  # noqa: E402

from backdrive.sim import State  # noqa: E402

F64 = torch.float64


def _engines(armature: float, robot_delay: int = 0, no_adhesion: bool = False):
    """The loop's backdrive env (float64, no joint Coulomb friction: MuJoCo's model has none) and MuJoCo's
    reality model, both with the loop's nominal parameters and ``armature``."""
    env, _ = cl.DelayedWalk.pretrained(1, robot="go1", dtype=F64)
    params = {**cl.nominal_params(env.robot), "joint_friction": 0.0, "armature": armature, "delay": robot_delay,
              "no_adhesion": no_adhesion}
    benv = cl.make_env(params, 1, dtype=F64, robot_name="go1")
    truth = {"mass": params["body_mass"], "damping": params["damping"], "strength": 1.0, "friction": 0.75,
             "delay": robot_delay, "armature": armature}
    return benv, lt.build_hidden(benv, truth, benv.physics_dt)


def _to_backdrive(d, perm):
    R = mc.quat_to_matrix(d.qpos[3:7])
    q = np.concatenate([d.qpos[:7], d.qpos[7:][perm]])
    v = np.concatenate([R.T @ d.qvel[:3], d.qvel[3:6], d.qvel[6:][perm]])
    return torch.tensor(q, dtype=F64), torch.tensor(v, dtype=F64)


def _airborne(benv, model, perm, seed=0):
    """A MuJoCo state 1 m above the floor with random joint and base velocities."""
    rng = np.random.default_rng(seed)
    d = mujoco.MjData(model)
    q0 = benv._safe_q.double().numpy().copy()
    qpos, _ = lt.to_mujoco(q0, np.zeros(18), perm)
    qpos[2] += 1.0
    qpos[7:] += rng.uniform(-0.2, 0.2, 12)
    d.qpos[:] = qpos
    d.qvel[:6] = rng.normal(0.0, 0.3, 6)
    d.qvel[6:] = rng.normal(0.0, 2.0, 12)
    mujoco.mj_forward(model, d)
    return d, rng


@pytest.mark.parametrize("armature", [0.0, 0.01])
def test_one_step_without_contact_agrees_with_mujoco(armature):
    torch.set_num_threads(1)
    benv, (model, perm) = _engines(armature)
    d, rng = _airborne(benv, model, perm)
    q, v = _to_backdrive(d, perm)
    target = benv.q_stand.double().numpy() + rng.normal(0.0, 0.3, 12)  # env order
    d.ctrl[:] = cl.to_ctrl(target, lt.env_order(benv, perm))
    mujoco.mj_step(model, d)
    q1, v1 = _to_backdrive(d, perm)
    tr = benv.sim.rollout(State(q[None], v[None]), benv.to_robot_order(torch.tensor(target))[None, None])
    dv = v1 - v
    assert float(dv[6:].abs().max()) > 1.0  # a real step (the servos accelerate the joints)
    assert torch.allclose(tr.v[0, -1], v1, atol=1e-4 * float(dv.abs().max()))
    assert torch.allclose(tr.q[0, -1], q1, atol=1e-7)


@pytest.mark.parametrize("delay", [0, 2])
def test_delayed_target_timing_is_the_same_in_both_engines(delay):
    # Three control steps of scripted actions in the air: DelayedWalk.transition against MuJoCo holding the
    # previous target (the last action at the previous clock phase) for `delay` substeps, as run_mujoco does.
    torch.set_num_threads(1)
    benv, (model, perm) = _engines(0.01, delay)
    d, rng = _airborne(benv, model, perm, seed=1)
    eperm = lt.env_order(benv, perm)
    q, v = _to_backdrive(d, perm)
    benv.reset(seed=0)
    state = benv.state.clone()
    parts = benv.split(state)
    parts["q"].copy_(q[None])
    parts["v"].copy_(v[None])
    parts["last_action"].copy_(torch.tensor(rng.uniform(-0.5, 0.5, 12))[None])
    dphase = 2 * math.pi * benv.gait_frequency * benv.dt
    last, phase = parts["last_action"][0].clone(), parts["phase"][0].clone()
    previous = (benv.q_stand + benv.action_scale * last + benv.gait_offsets(phase - dphase)).numpy()
    for step in range(3):
        action = torch.tensor(rng.uniform(-0.8, 0.8, 12))
        target = (benv.q_stand + benv.action_scale * action + benv.gait_offsets(phase)).numpy()
        for k in range(benv.substeps):
            d.ctrl[:] = cl.to_ctrl(previous if k < delay else target, eperm)
            mujoco.mj_step(model, d)
        previous, phase = target, torch.remainder(phase + dphase, 2 * math.pi)
        before, state = state, benv.transition(state, action[None])
        qm, vm = _to_backdrive(d, perm)
        p = benv.split(state)
        # The engines integrate the free base differently (MuJoCo: world-frame Euler; backdrive: on SE(3)),
        # which drifts ~1e-3 rad/s over 8 substeps of random joint motion.
        assert torch.allclose(p["v"][0], vm, atol=5e-3), (step, float((p["v"][0] - vm).abs().max()))
        assert torch.allclose(p["q"][0], qm, atol=1e-4)
    # The schedule matters far beyond that tolerance: the last step with the delay off by one ends elsewhere.
    benv.delay = delay + 1
    other = benv.split(benv.transition(before, action[None]))["v"][0]
    assert float((other - p["v"][0]).abs().max()) > 0.1


def test_no_adhesion_step_keeps_normal_forces_non_negative():
    torch.set_num_threads(1)
    plain, _ = _engines(0.01)
    free, _ = _engines(0.01, no_adhesion=True)
    assert type(free.sim) is cl.NoAdhesionSimulator and type(plain.sim) is not cl.NoAdhesionSimulator
    q = plain._safe_q.clone()[None]
    v = torch.zeros(1, 18, dtype=F64)
    q[0, 2] -= float(plain.contact.forces(plain.robot, q, v).penetration.min()) - 0.001  # feet 1 mm in
    stand = plain._q_stand_robot.clone()[None]
    # Standing still: every foot pushes; the two steps are the same.
    a, b = (e.sim.rollout(State(q, v), stand[:, None]) for e in (plain, free))
    assert bool((a.contact.normal_force > 0).all())
    # The library's default step (the contact's own step since the 12th
    # session) agrees to rounding; its joint-solve step, which
    # NoAdhesionSimulator re-runs with feet taken out, exactly.
    assert torch.allclose(a.v, b.v, rtol=1e-9, atol=1e-9)
    assert torch.allclose(a.contact.normal_force, b.contact.normal_force, rtol=1e-9, atol=1e-7)
    plain.sim._joint_solve_contact = True
    a = plain.sim.rollout(State(q, v), stand[:, None])
    assert torch.equal(a.v, b.v) and torch.equal(a.contact.normal_force, b.contact.normal_force)
    plain.sim._joint_solve_contact = False
    # One calf servo lifts its foot hard (FL calf: robot joint 5, foot 0 in the env's order FL, FR, RL, RR).
    lift = stand.clone()
    lift[0, 5] -= 0.6
    a, b = (e.sim.rollout(State(q, v), lift[:, None]) for e in (plain, free))
    fa, fb = a.contact.normal_force[0, -1], b.contact.normal_force[0, -1]
    assert bool((fb >= 0).all()) and float(fb[0]) == 0.0 and bool((fb[1:] > 10).all())
    if bool((fa < 0).any()):  # the library's linearised step pulled that foot down (before the 12th session)
        assert float(fa[0]) < 0 and float(b.v[0, -1, 6 + 5]) < float(a.v[0, -1, 6 + 5])  # lifts faster


def test_no_adhesion_simulator_replace_keeps_the_step():
    """``ContactFit`` rebuilds its simulator with ``replace`` at every parameter value (13th session): the
    calibration through ``NoAdhesionSimulator`` must step without adhesion at every trial, not only at the start."""
    torch.set_num_threads(1)
    free, _ = _engines(0.01, no_adhesion=True)
    heavier = free.sim.replace(robot=free.robot.replace(body_mass=free.robot.body_mass * 1.05))
    assert type(heavier) is cl.NoAdhesionSimulator and heavier.passes == free.sim.passes
    assert torch.equal(heavier.robot.body_mass, free.robot.body_mass * 1.05)
    q = free._safe_q.clone()[None]
    v = torch.zeros(1, 18, dtype=F64)
    q[0, 2] -= float(free.contact.forces(free.robot, q, v).penetration.min()) - 0.001
    lift = free._q_stand_robot.clone()[None]
    lift[0, 5] -= 0.6  # the FL calf lifts its loaded foot: the library's linearised step would pull it down
    n = heavier.rollout(State(q, v), lift[:, None]).contact.normal_force[0, -1]
    assert bool((n >= 0).all()) and float(n[0]) == 0.0

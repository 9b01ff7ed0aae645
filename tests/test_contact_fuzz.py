"""Fuzzing contact rollouts: random drops, pushes (at the start and half-way),
orientations and velocities of the quadruped and the G1 humanoid, forward and
backward, must stay finite;
a state that does explode is reported with its step and its contact.

``benchmarks/contact_fuzz.py`` runs the longer sweep whose numbers are in
``docs/contact.md`` (*Gradients*).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from backdrive import NonFiniteError
from backdrive.contact import ContactGeometry, ContactModel, ContactParameters
from backdrive.data import load
from backdrive.sim import PDActuator, Simulator, State
from backdrive.spatial import rotvec_to_quat

from _robots import g1_contact_geometry


def quadruped_sim(dt=2e-3, params=None, unilateral=True):
    robot = load("quadruped", floating_base=True)
    # every URDF shape: trunk and thigh boxes, foot spheres, and the hip and
    # calf cylinders read as capsules (2 points each instead of 16)
    cm = ContactModel(robot, ContactGeometry.from_model(robot, cylinders="capsule"), params=params,
                      unilateral=unilateral)
    return Simulator(robot, dt, actuator=PDActuator(kp=200.0, kd=6.0), contact=cm)


def g1_sim(dt=2e-3, params=None):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its meshes are not used for contact
            robot = load("example-robot-data:g1", floating_base=True)
    except Exception as exc:  # noqa: BLE001 - the data package is optional
        pytest.skip(f"example-robot-data G1 not available: {exc}")
    cm = ContactModel(robot, g1_contact_geometry(robot), params=params)
    return Simulator(robot, dt, actuator=PDActuator(kp=100.0, kd=3.0), contact=cm)


def random_drops(sim, n: int, seed: int):
    """``n`` random initial states and PD targets.

    Uniformly random orientations (any side may land first), joint angles
    inside their limits, the lowest shape 2 cm inside the ground to 4 cm
    above it, base velocities N(0, 0.5) m/s plus a horizontal push of up to
    3 m/s and a downward speed of 1 to 3 m/s, angular velocities N(0, 2)
    rad/s, joint rates N(0, 2) rad/s; PD targets uniform inside the limits.
    """
    robot = sim.robot
    gen = torch.Generator().manual_seed(seed)
    dt = robot.dtype

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=dt)

    lo, hi = robot.lower.clamp(min=-math.pi), robot.upper.clamp(max=math.pi)
    q = robot.neutral().expand(n, -1).clone()
    axis = torch.randn(n, 3, generator=gen, dtype=dt)
    q[:, 3:7] = rotvec_to_quat(math.pi * rand(n, 1) * axis / axis.norm(dim=-1, keepdim=True))
    q[:, 7:] = lo + (hi - lo) * rand(n, robot.num_joints)
    q[:, 2] = 0.0
    v = torch.randn(n, robot.nv, generator=gen, dtype=dt)
    v[:, :3] *= 0.5
    v[:, 3:6] *= 2.0
    v[:, 6:] *= 2.0
    with torch.no_grad():
        deepest = sim.contact.forces(robot, q, v).penetration.amax(-1)
    q[:, 2] = deepest - 0.02 + 0.06 * rand(n)
    # base-frame velocity from a world-frame push and fall
    from backdrive.spatial import quat_apply, quat_conjugate

    push = torch.zeros(n, 3, dtype=dt)
    angle = 2 * math.pi * rand(n)
    push[:, 0], push[:, 1] = torch.cos(angle), torch.sin(angle)
    push = 3.0 * rand(n, 1) * push
    push[:, 2] = -1.0 - 2.0 * rand(n)
    v[:, :3] += quat_apply(quat_conjugate(q[:, 3:7]), push)
    targets = lo + (hi - lo) * rand(n, robot.num_joints)
    return q, v, targets


def fuzz(sim, n: int, steps: int, seed: int, checkpoint_every=None):
    """One batched rollout of ``n`` random drops, forward and backward.

    The drop runs ``steps // 2`` steps; then every sample is pushed (its base
    velocity jumps by a random horizontal 0-3 m/s and a random N(0, 2) rad/s
    spin, as from a kick, whether it has landed or is still falling) and
    runs the remaining steps. The loss sums the final state, the contact
    forces and the slip of both parts, so the backward pass goes through
    the push to the initial state.

    Returns the two trajectories, the gradients with respect to the initial
    state, the controls and the pushes, and the fraction of samples whose
    contact was loaded.
    """
    from backdrive.spatial import quat_apply, quat_conjugate

    q0, v0, targets = random_drops(sim, n, seed)
    gen = torch.Generator().manual_seed(10_000 + seed)
    dt = q0.dtype
    angle = 2 * math.pi * torch.rand(n, generator=gen, dtype=dt)
    push = 3.0 * torch.rand(n, 1, generator=gen, dtype=dt) * torch.stack(
        [torch.cos(angle), torch.sin(angle), torch.zeros_like(angle)], -1
    )
    spin = 2.0 * torch.randn(n, 3, generator=gen, dtype=dt)
    q0.requires_grad_()
    v0.requires_grad_()
    push.requires_grad_()
    first = steps // 2
    U = targets[:, None, :].expand(n, steps, -1).clone().requires_grad_()
    # raises NonFiniteError on a NaN state
    a = sim.rollout(State(q0, v0), U[:, :first], checkpoint_every=checkpoint_every)
    qm, vm = a.q[:, -1], a.v[:, -1]
    kick = torch.cat([quat_apply(quat_conjugate(qm[:, 3:7]), push), spin, torch.zeros_like(vm[:, 6:])], -1)
    b = sim.rollout(State(qm, vm + kick), U[:, first:], checkpoint_every=checkpoint_every)
    loss = 0.0
    for traj in (a, b):
        c = traj.contact
        loss = loss + (traj.q[:, -1, :3] ** 2).sum() + (traj.v[:, -1] ** 2).sum() + 1e-3 * c.normal_force.sum()
        loss = loss + (c.slip_velocity ** 2).sum()
    grads = torch.autograd.grad(loss, (q0, v0, U, push))
    touched = torch.zeros(n, dtype=torch.bool)
    for traj in (a, b):
        c = traj.contact
        touched |= ((c.penetration.detach() > 0) | (c.normal_force.detach() > 1.0)).flatten(1).any(-1)
    return (a, b), grads, float(touched.double().mean())


#: Drops per robot in the test suite (the 1,000-drop sweep: benchmarks/contact_fuzz.py).
SUITE_DROPS = 100


@pytest.mark.slow
@pytest.mark.parametrize("robot", ["quadruped", "g1"])
def test_fuzz_random_drops_forward_and_backward_stay_finite(robot):
    """100 random drops per robot, 20 steps of 2 ms, a random push, 20 more
    steps, every shape in contact: no NaN or Inf in any state, contact force
    or gradient (initial state, controls, push), and nearly every sample hits
    the ground."""
    sim = quadruped_sim() if robot == "quadruped" else g1_sim()
    trajs, grads, touched = fuzz(sim, SUITE_DROPS, 40, seed=0)
    for traj in trajs:
        c = traj.contact
        for name, x in (("q", traj.q), ("v", traj.v), ("force", c.force), ("slip", c.slip_velocity)):
            assert bool(torch.isfinite(x).all()), name
    for g in grads:
        assert bool(torch.isfinite(g).all())
        assert float(g.abs().max()) > 0
    assert touched > 0.9, touched


def test_an_exploding_rollout_names_the_step_and_the_contact():
    """Contact stiffnesses of 1e10-1e12 N/m without damping at 50 ms steps, far
    beyond anything a step can integrate: the rollout raises NonFiniteError
    (not a bare linear-algebra error) naming the step and the contact with
    the largest force, the same in the plain and the checkpointed rollout.
    On the adhesive step (``unilateral=False``): the unilateral one (the
    default) no longer explodes here, its springs cannot pull a released
    point back."""
    raised = 0
    for stiffness in (1e10, 1e11, 1e12):
        sim = quadruped_sim(dt=0.05, params=ContactParameters(stiffness=stiffness, damping=0.0), unilateral=False)
        q0, v0, targets = random_drops(sim, 4, seed=0)
        steps = []
        for k in (None, 4):
            try:
                sim.rollout(State(q0, v0), targets[:, None, :].expand(4, 60, -1), checkpoint_every=k)
            except NonFiniteError as err:
                text = str(err)
                assert isinstance(err.step, int) and 0 < err.step <= 60
                assert f"step {err.step}" in text, text
                assert "contact force" in text and "on the ground (row" in text, text
                steps.append(err.step)
        assert len(steps) in (0, 2) and len(set(steps)) <= 1, steps
        raised += bool(steps)
    assert raised >= 1

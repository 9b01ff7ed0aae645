"""The Simulator's implicit contact step on the contact's own step (12th session).

With ``joint_forces="implicit"`` (the default) a contact step used to pass the
contact's terms to ``ImplicitJointForces.velocity`` (dense mass matrix and
Cholesky at every batch size); it now runs ``ContactModel.acceleration`` (its
fast path from ``FAST_MIN_BATCH["contact_step"]`` samples) with the joint
damping joined to the implicit damping, and joint friction solved on the fast
step (``contact/_fast.py``, ``JointFriction``). The old step stays reachable
through ``Simulator._joint_solve_contact``: both must give the same states
and gradients to float64 rounding, at batch 1 (reference paths) and at 200
samples (fast paths).
"""

from __future__ import annotations

import pytest
import torch

from backdrive.contact import ContactGeometry, ContactModel, ContactParameters
from backdrive.contact import _fast
from backdrive.data import load
from backdrive.sim import PDActuator, Simulator, State
from _robots import go1_robot  # shared fixture

DT = 2e-3
TOL = 1e-10  # relative to the largest entry


def _setup(name, batch, seed=0, damping=None, friction=None, params=None):
    robot = load(name, floating_base=True)
    if damping is not None:
        robot = robot.replace(damping=damping)
    if friction is not None:
        robot = robot.replace(friction=friction)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet), params=params)
    sim = Simulator(robot, DT, actuator=PDActuator(kp=30.0, kd=1.0), contact=cm)
    g = torch.Generator().manual_seed(seed)
    kw = {"dtype": robot.dtype}
    q = robot.neutral().expand(batch, -1).clone()
    q[:, 7:] = torch.tensor([0.0, 0.8, -1.5] * 4, **kw) + 0.1 * torch.randn(batch, 12, generator=g, **kw)
    # Sunk 3 mm: every foot in contact, most of them sticking or slipping.
    q = cm.place_on_terrain(robot, q, clearance=-0.003)
    v = 0.3 * torch.randn(batch, robot.nv, generator=g, **kw)
    u = q[:, None, 7:] + 0.2 * torch.randn(batch, 5, 12, generator=g, **kw)
    return robot, sim, q, v, u


def _run(sim, q0, v0, u, legacy, params=()):
    sim._joint_solve_contact = legacy
    try:
        q, v, uu = (x.clone().requires_grad_(True) for x in (q0, v0, u))
        tr = sim.rollout(State(q, v), uu)
        w = torch.linspace(-1.0, 1.0, tr.v.shape[-1], dtype=tr.v.dtype)
        loss = (tr.q[:, -1, :3] ** 2).sum() + (tr.v[:, -1] * w).sum() + 1e-3 * tr.contact.normal_force.sum()
        grads = torch.autograd.grad(loss, (q, v, uu, *params))
    finally:
        sim._joint_solve_contact = False
    return (tr.q.detach(), tr.v.detach(), *grads)


def _assert_same(old, new, rows=None):
    for a, b in zip(old, new):
        if rows is not None:  # samples along the first axis
            a, b = a[rows], b[rows]
        scale = float(a.abs().max())
        assert scale > 0
        assert float((a - b).abs().max()) <= TOL * scale


class _Count:
    """Counts the fast contact steps taken (``_fast._step``)."""

    def __init__(self, monkeypatch):
        self.n = 0
        real = _fast._step

        def step(*a, **k):
            self.n += 1
            return real(*a, **k)

        monkeypatch.setattr(_fast, "_step", step)


@pytest.mark.parametrize("batch", [1, 200])
def test_quadruped_default_step_equals_the_joint_solve_step(batch, monkeypatch):
    """The shipped quadruped (no joint damping or friction): states and
    gradients (initial state, controls, a grad-requiring damping, contact
    stiffness) as the old step's; from 200 samples on the fast step."""
    robot, sim, q, v, u = _setup("quadruped", batch)
    count = _Count(monkeypatch)
    old = _run(sim, q, v, u, legacy=True)
    assert count.n == 0
    new = _run(sim, q, v, u, legacy=False)
    assert count.n == (5 if batch >= 160 else 0)  # the fast step, recorded, once per step
    _assert_same(old, new)
    assert float((new[0][:, -1] - q).abs().max()) > 1e-4  # it moved

    # A damping that requires grad (calibration fits it): through the fast
    # step's tau and extra_damping; armature stays on the reference path.
    d = torch.full((12,), 0.3, dtype=robot.dtype, requires_grad=True)
    robot_d, sim_d, *_ = _setup("quadruped", batch, damping=d)
    count.n = 0
    old = _run(sim_d, q, v, u, legacy=True, params=(d,))
    new = _run(sim_d, q, v, u, legacy=False, params=(d,))
    assert count.n == (5 if batch >= 160 else 0)
    _assert_same(old, new)


def test_contact_parameter_gradient_equals_the_joint_solve_step():
    """A contact stiffness that requires grad takes the reference contact
    step (the fast backward differentiates the state and forces only): the
    same gradient as the old step."""
    k = torch.tensor(3.0e4, dtype=torch.float64, requires_grad=True)
    robot, sim, q, v, u = _setup("quadruped", 160, params=ContactParameters(stiffness=k))
    old = _run(sim, q, v, u, legacy=True, params=(k,))
    new = _run(sim, q, v, u, legacy=False, params=(k,))
    _assert_same(old, new)


def _converged_rows(sim, q, v, u):
    """The samples whose friction solve ended consistent in every step of
    the old step's rollout. The reference iteration stops after
    FRICTION_PASSES; where a sticking joint's ratio still exceeds 1 there,
    its clamp leaves the other sticking joints solved against the unclamped
    value: the old step's gradient is then that of the unconverged iterate,
    the fast step's that of the final active set's linear step (the same
    state)."""
    imp = sim._implicit
    real = imp._friction_ratio
    bad = []

    def spy(A, v_free, F, with_set=False):
        w, K = imp.width, imp.dt * A * F
        g, stick = real(A, v_free, F, with_set=True)
        r = -(v_free + (K @ g[..., None])[..., 0]) / w
        # Consistent: every sticking joint's force is its -F v1 / w.
        bad.append((stick & ((r - g).abs() > 1e-8)).any(-1))
        return (g, stick) if with_set else g

    imp._friction_ratio = spy
    sim._joint_solve_contact = True
    try:
        with torch.no_grad():
            sim.rollout(State(q, v), u)
    finally:
        sim._joint_solve_contact = False
        del imp._friction_ratio
    return torch.nonzero(~torch.stack(bad).reshape(len(bad), -1).any(0)).flatten()


@pytest.mark.parametrize("batch", [1, 200])
def test_go1_friction_on_the_fast_step(batch, monkeypatch):
    """Go1 (URDF friction 0.2, damping 0.01): the joint friction solved on
    the fast step gives the old step's states at every sample, and its
    gradients (also with respect to the friction levels) wherever the old
    active-set iteration converged."""
    go1_robot()
    F = torch.full((12,), 0.2, dtype=torch.float64, requires_grad=True)
    robot, sim, q, v, u = _setup("example-robot-data:go1", batch, friction=F)
    count = _Count(monkeypatch)
    old = _run(sim, q, v, u, legacy=True, params=(F,))
    new = _run(sim, q, v, u, legacy=False, params=(F,))
    assert count.n == (5 if batch >= 160 else 0)
    _assert_same(old[:2], new[:2])  # states: every sample
    rows = _converged_rows(sim, q, v, u)
    assert rows.numel() >= 0.9 * batch
    _assert_same(old[2:5], new[2:5], rows)
    if rows.numel() == batch:
        _assert_same(old[5:], new[5:])
    else:  # the friction gradient sums over samples: compare those that converged
        old = _run(sim, q[rows], v[rows], u[rows], legacy=True, params=(F,))
        new = _run(sim, q[rows], v[rows], u[rows], legacy=False, params=(F,))
        _assert_same(old[5:], new[5:])


def test_go1_fast_friction_step_against_finite_differences():
    """The fast step with friction, one step at 160 samples: its gradient
    with respect to the control matches central differences of the step
    itself (float64) in a converged sample."""
    go1_robot()
    robot, sim, q, v, u = _setup("example-robot-data:go1", 160, seed=3)
    rows = _converged_rows(sim, q, v, u[:, :1])
    i = int(rows[0])
    u1 = u[:, 0].clone().requires_grad_(True)
    w = torch.linspace(-1.0, 1.0, robot.nv, dtype=torch.float64)
    s = sim.step(State(q, v), u1)
    (g,) = torch.autograd.grad((s.v[i] * w).sum(), u1)
    h = 1e-6
    with torch.no_grad():
        for k in (0, 4, 11):
            e = torch.zeros_like(u1)
            e[i, k] = h
            fd = ((sim.step(State(q, v), u1 + e).v[i] - sim.step(State(q, v), u1 - e).v[i]) * w).sum() / (2 * h)
            assert abs(float(fd) - float(g[i, k])) <= 1e-5 * (abs(float(fd)) + 1.0)


def test_quadruped_walk_step_equals_the_joint_solve_step(monkeypatch):
    """The env's step (4 substeps) and its gradient with respect to the action."""
    from backdrive.envs import QuadrupedWalk

    outs = []
    for legacy in (True, False):
        monkeypatch.setattr(Simulator, "_joint_solve_contact", legacy)
        env = QuadrupedWalk(160, dtype=torch.float64)
        env.reset(seed=2)
        a = (0.5 * torch.randn(160, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)).requires_grad_()
        s = env.transition(env.state, a)
        w = torch.randn(s.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        (g,) = torch.autograd.grad((s * w).sum(), a)
        outs.append((s.detach(), g))
    _assert_same(outs[0], outs[1])

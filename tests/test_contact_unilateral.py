"""The unilateral implicit contact step: a lifting foot is never pulled onto the floor (issue 11).

The implicit step linearises each contact point's force in the new velocity;
where a loaded foot lifts within the step its normal damping, extrapolated,
makes the applied normal force negative (adhesion). With
``ContactModel(unilateral=True)`` (the default) such points leave the step,
which is solved again. Checked on every implicit step the simulator can take
below the fast path: ``ContactModel.acceleration``'s reference path, the
joint-friction step (``ImplicitJointForces.contact_acceleration``, Go1) and
the joint-solve step (``Simulator._joint_solve_contact``).
"""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from backdrive._errors import InputError
from backdrive.contact import ContactGeometry, ContactModel
from backdrive.data import load
from backdrive.sim import PDActuator, Simulator

from test_sim_fast_contact import _converged_rows

DT = 2e-3
F64 = torch.float64


def _robot(name):
    try:
        robot = load(name, floating_base=True, dtype=F64)
    except Exception as exc:  # noqa: BLE001 - example-robot-data is optional
        pytest.skip(f"{name} not available: {exc}")
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    return robot, feet


def _setup(name, unilateral=True, batch=1, links=None):
    """A robot standing 3 mm sunk; control ``u (batch, nj)``: sample 0 pulls
    its first leg up hard (thigh forward, calf bent), the others hold the
    stance."""
    robot, feet = _robot(name)
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet if links is None else links(feet)),
                      unilateral=unilateral)
    sim = Simulator(robot, DT, actuator=PDActuator(kp=60.0, kd=1.0), contact=cm)
    q = robot.neutral().clone()
    q[7:] = torch.tensor([0.0, 0.8, -1.5] * 4, dtype=F64)
    q = ContactModel(robot, ContactGeometry.from_model(robot, links=feet)).place_on_terrain(robot, q, clearance=-0.003)
    q = q.expand(batch, -1).clone()
    v = torch.zeros(batch, robot.nv, dtype=F64)
    u = q[:, 7:].clone()
    u[0, 1] += 1.0
    u[0, 2] -= 1.0
    return robot, cm, sim, q, v, u


def _tau(sim, q, v, u):
    """The PD torque of the simulator's actuator and its damping (the step's ``tau`` and ``extra_damping``)."""
    tau, _ = sim.efforts(q, v, u)
    return tau, sim._pd_damping(q)


@pytest.mark.parametrize("name", ["quadruped", "example-robot-data:go1"])
def test_lifting_foot_gets_no_pulling_force(name):
    """Off: the lifting foot's applied normal force is strongly negative.
    On: every applied normal force is >= 0, the lifted foot's force, friction
    and body wrench are exactly zero, and the step is the step of a model
    without that foot. Quadruped: the Simulator's step is
    ``ContactModel.acceleration`` (reference path); Go1 (joint friction):
    ``ImplicitJointForces.contact_acceleration``."""
    *_, sim_off, q, v, u = _setup(name, unilateral=False)
    _, _, _, res_off = sim_off._advance_contact(q, v, u)
    assert float(res_off.normal_force[0, 0]) < -100.0  # adhesion of hundreds of N
    robot, cm, sim, q, v, u = _setup(name)
    q1, v1, _, res = sim._advance_contact(q, v, u)
    fn = res.normal_force[0]
    assert bool((fn >= 0).all()), fn
    assert float(fn[0]) == 0.0 and bool((res.force[0, 0] == 0).all()) and bool((res.friction_force[0, 0] == 0).all())
    assert bool((fn[1:] > 1.0).all())  # the others still carry the robot
    body = int(cm.geometry.point_body[0])
    assert bool((res.f_ext[0, body] == 0).all())
    # J^T f of the applied forces is what the step applied: the same step
    # as a model whose geometry lacks the lifted foot (unilateral or not).
    *_, sim3, _, _, _ = _setup(name, unilateral=False, links=lambda feet: feet[1:])
    q3, v3, _, res3 = sim3._advance_contact(q, v, u)
    scale = float(v1.abs().max())
    assert float((v3 - v1).abs().max()) <= 1e-10 * scale
    assert float((res3.force[0] - res.force[0, 1:]).abs().max()) <= 1e-9 * float(res.force.abs().max())


@pytest.mark.parametrize("name", ["quadruped", "example-robot-data:go1"])
@pytest.mark.parametrize("grad", [False, True])
def test_samples_without_negative_force_are_bit_identical(name, grad):
    """In a batch where only sample 0 drops a foot, the other samples' step
    is the single solve bit for bit (with and without autograd recording)."""
    robot, cm_on, sim_on, q, v, u = _setup(name, batch=3)
    *_, sim_off, _, _, _ = _setup(name, unilateral=False, batch=3)
    u = u.clone()
    u[2] += 0.05  # a third sample that moves without lifting
    with torch.set_grad_enabled(grad):
        if grad:
            u = u.clone().requires_grad_(True)
        outs = [s._advance_contact(q, v, u) for s in (sim_off, sim_on)]
    (q0, v0, _, r0), (q1, v1, _, r1) = ((a.detach(), b.detach(), c, dataclasses.replace(r, **{k: getattr(r, k).detach() for k in ("force", "normal_force", "friction_force", "f_ext")})) for a, b, c, r in outs)
    assert bool((r0.normal_force[1:] > 0).all())
    assert float(r0.normal_force[0, 0]) < 0 and float(r1.normal_force[0, 0]) == 0.0
    assert torch.equal(v0[1:], v1[1:]) and torch.equal(q0[1:], q1[1:])
    for f in ("force", "normal_force", "friction_force", "f_ext"):
        assert torch.equal(getattr(r0, f)[1:], getattr(r1, f)[1:]), f
    assert float((v0[0] - v1[0]).abs().max()) > 1e-3


def test_contact_acceleration_reference_gradcheck_with_a_dropped_foot():
    """float64 gradcheck of ``ContactModel.acceleration`` (reference path)
    in a step that drops the lifting foot, away from the switch: the
    gradient is the final solve's with the foot out of the step."""
    robot, cm, sim, q, v, u = _setup("quadruped")
    tau, kd = _tau(sim, q, v, u)
    _, r = cm.acceleration(robot, q, v, tau, dt=DT, extra_damping=kd)
    fn = r.normal_force[0]
    assert float(fn[0]) == 0.0 and bool((fn[1:] > 1.0).all())
    off = ContactModel(robot, cm.geometry, unilateral=False)
    assert float(off.acceleration(robot, q, v, tau, dt=DT, extra_damping=kd)[1].normal_force[0, 0]) < -100.0

    def f(qj, vv, tt):
        qq = torch.cat([q[:, :7], qj], -1)
        a, res = cm.acceleration(robot, qq, vv, tt, dt=DT, extra_damping=kd)
        return a, res.force

    ins = (q[:, 7:].clone().requires_grad_(True), (v + 0.01).requires_grad_(True), tau.clone().requires_grad_(True))
    assert torch.autograd.gradcheck(f, ins, eps=1e-6, atol=1e-5, rtol=1e-5)


def test_go1_friction_step_gradcheck_with_a_dropped_foot():
    """The same through the joint-friction step (Go1), in ``tau``."""
    robot, cm, sim, q, v, u = _setup("example-robot-data:go1")

    def f(uu):
        _, v1, _, res = sim._advance_contact(q, v, uu)
        return v1, res.normal_force

    _, fn = f(u)
    assert float(fn[0, 0]) == 0.0 and bool((fn[0, 1:] > 1.0).all())
    assert torch.autograd.gradcheck(f, (u.clone().requires_grad_(True),), eps=1e-6, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["quadruped", "example-robot-data:go1"])
def test_joint_solve_step_agrees(name, monkeypatch):
    """The joint-solve step (``Simulator._joint_solve_contact``, the compiled
    step's) drops the same foot: the same state and forces to rounding."""
    robot, cm, sim, q, v, u = _setup(name, batch=2)
    new = sim._advance_contact(q, v, u)
    monkeypatch.setattr(Simulator, "_joint_solve_contact", True)
    old = sim._advance_contact(q, v, u)
    assert float(old[3].normal_force[0, 0]) == 0.0
    for a, b in ((old[0], new[0]), (old[1], new[1]), (old[3].force, new[3].force)):
        assert float((a - b).abs().max()) <= 1e-10 * float(a.abs().max())


def test_switch_is_carried():
    robot, feet = _robot("quadruped")
    geo = ContactGeometry.from_model(robot, links=feet)
    cm = ContactModel(robot, geo)
    assert cm.unilateral is True and "unilateral" not in repr(cm)
    off = cm.replace(unilateral=False, robot=robot)
    assert off.unilateral is False and "unilateral=False" in repr(off)
    assert off.replace(params=off.params, robot=robot).unilateral is False  # kept unless given
    assert pickle.loads(pickle.dumps(off)).unilateral is False
    sim = Simulator(robot, DT, contact=off)
    assert pickle.loads(pickle.dumps(sim)).contact.unilateral is False
    old = pickle.loads(pickle.dumps(off))
    del old.__dict__["unilateral"]  # a model pickled before the switch: today's default
    assert old.unilateral is True
    with pytest.raises(InputError, match="unilateral"):
        ContactModel(robot, geo, unilateral=1)
    # The library's own rebuilds of a model from its parts keep the switch too.
    from backdrive.analysis._sensitivity import _with_parameters

    rebuilt, _ = _with_parameters(sim, ["contact.friction", "body_mass"])
    assert rebuilt.contact.unilateral is False


def _batch(name, batch, seed=0, unilateral=True):
    """``batch`` random stances (3 mm sunk, random velocities); in every other
    sample one random leg is pulled up hard. Returns the robot, the contact
    model, the simulator and ``q, v, u``."""
    robot, feet = _robot(name)
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet), unilateral=unilateral)
    sim = Simulator(robot, DT, actuator=PDActuator(kp=60.0, kd=1.0), contact=cm)
    g = torch.Generator().manual_seed(seed)
    q = robot.neutral().expand(batch, -1).clone()
    q[:, 7:] = torch.tensor([0.0, 0.8, -1.5] * 4, dtype=F64) + 0.1 * torch.randn(batch, 12, generator=g, dtype=F64)
    q = cm.place_on_terrain(robot, q, clearance=-0.003)
    v = 0.3 * torch.randn(batch, robot.nv, generator=g, dtype=F64)
    u = q[:, 7:] + 0.05 * torch.randn(batch, 12, generator=g, dtype=F64)
    leg = torch.randint(0, 4, (batch,), generator=g)
    lift = torch.arange(batch) % 2 == 0
    rows = torch.nonzero(lift).flatten()
    u[rows, 3 * leg[rows] + 1] += 1.0
    u[rows, 3 * leg[rows] + 2] -= 1.0
    return robot, cm, sim, q, v, u


def _close(x, y, tol, name=""):
    assert y.shape == x.shape, name
    assert float((x - y).abs().max()) <= tol * (float(x.abs().max()) + 1e-300), name


RESULT_FIELDS = ("normal_force", "friction_force", "force", "f_ext", "point", "normal", "penetration",
                 "normal_velocity", "slip_velocity", "jacobian")


def test_fast_step_and_gradient_equal_reference_with_dropped_points():
    """Batch 200 (the fast path when forced), float64, a quarter of the
    samples dropping a foot: the fast step (``_fast._step``) and its
    written-out backward (``_ImplicitStepFast``) equal the reference path."""
    from backdrive.kinematics import use_path

    robot, cm, sim, q, v, u = _batch("quadruped", 200)
    tau, kd = _tau(sim, q, v, u)
    off = ContactModel(robot, cm.geometry, unilateral=False)
    with torch.no_grad(), use_path("reference"):
        dropped = off.acceleration(robot, q, v, tau, dt=DT, extra_damping=kd)[1].normal_force < 0
        a0, r0 = cm.acceleration(robot, q, v, tau, dt=DT, extra_damping=kd)
    assert int(dropped.sum()) >= 20 and bool((r0.normal_force[dropped] == 0).all())
    assert bool((r0.normal_force >= 0).all())
    with torch.no_grad(), use_path("fast"):
        a1, r1 = cm.acceleration(robot, q, v, tau, dt=DT, extra_damping=kd)
    _close(a0, a1, 1e-10, "a")
    for f in RESULT_FIELDS + ("_c_n", "_k_n", "_mu_fn_over_s", "_s", "_mu"):
        _close(getattr(r0, f), getattr(r1, f), 1e-10, f)

    g = torch.Generator().manual_seed(7)
    w = [torch.randn(x.shape, generator=g, dtype=F64) for x in [a0] + [getattr(r0, k) for k in RESULT_FIELDS]]

    def grads(path):
        xs = [x.clone().requires_grad_(True) for x in (q, v, tau, kd)]
        with use_path(path):
            a, res = cm.acceleration(robot, *xs[:3], dt=DT, extra_damping=xs[3])
            loss = sum((o * wi).sum() for o, wi in zip([a] + [getattr(res, k) for k in RESULT_FIELDS], w))
            return torch.autograd.grad(loss, xs)

    for name, x, y in zip(("q", "v", "tau", "damping"), grads("reference"), grads("fast")):
        assert float(x.abs().max()) > 0, name
        _close(x, y, 1e-9, name)


def test_go1_fast_friction_step_equals_reference_with_dropped_points():
    """Go1's joint friction on the fast step (``JointFriction``) at 200
    samples with dropped feet: the Simulator's step and its gradient in the
    controls equal the reference step's (``ImplicitJointForces.contact_acceleration``)."""
    from backdrive.kinematics import use_path

    robot, cm, sim, q, v, u = _batch("example-robot-data:go1", 200, seed=1)
    out = {}
    for path in ("reference", "fast"):
        uu = u.clone().requires_grad_(True)
        with use_path(path):
            q1, v1, _, res = sim._advance_contact(q, v, uu)
        w = torch.linspace(-1.0, 1.0, robot.nv, dtype=F64)
        (gu,) = torch.autograd.grad((v1 * w).sum() + 1e-3 * res.normal_force.sum(), uu)
        out[path] = (v1.detach(), res.normal_force.detach(), res.f_ext.detach(), gu)
    assert int((out["reference"][1] == 0).sum()) >= 20  # dropped (and unloaded) feet
    assert bool((out["fast"][1] >= 0).all())
    # The gradient where the friction iteration converged (test_sim_fast_contact
    # explains the others: one sample here, the same with unilateral=False).
    rows = _converged_rows(sim, q, v, u[:, None])
    assert rows.numel() >= 190
    for x, y in zip(out["reference"], out["fast"]):
        _close(x[rows], y[rows], 1e-9)


@pytest.mark.parametrize("name", ["quadruped", "example-robot-data:go1"])
def test_fast_step_resolves_only_the_dropping_samples(name, monkeypatch):
    """At 200 samples, a quarter dropping a foot, the fast step solves again
    only those samples (``_merge_factor`` writes them back) and gives the
    same step and gradient as re-solving the whole batch (``_SUBSET_MIN``
    raised past the batch): bit for bit in the samples that dropped
    nothing, to rounding in the others."""
    from backdrive.contact import _fast
    from backdrive.kinematics import use_path

    robot, cm, sim, q, v, u = _batch(name, 200, seed=2)
    merged = []
    orig = _fast._merge_factor
    monkeypatch.setattr(_fast, "_merge_factor", lambda F, part, rows: merged.append(rows.numel()) or orig(F, part, rows))

    def run():
        uu = u.clone().requires_grad_(True)
        with use_path("fast"):
            q1, v1, _, res = sim._advance_contact(q, v, uu)
        w = torch.linspace(-1.0, 1.0, robot.nv, dtype=F64)
        (gu,) = torch.autograd.grad((v1 * w).sum() + 1e-3 * res.normal_force.sum(), uu)
        return v1.detach(), res.normal_force.detach(), res.force.detach(), gu

    subset = run()
    assert merged and 20 <= merged[0] <= 100  # the dropping samples only
    monkeypatch.setattr(_fast, "_SUBSET_MIN", 10**9)
    n = len(merged)
    whole = run()
    assert len(merged) == n  # no subset re-solve this time
    assert int((whole[1] == 0).sum()) >= 20
    for x, y in zip(whole, subset):
        _close(x, y, 1e-13)  # the re-solved samples: rounding (a smaller batch's kernels)
        same = (x == y).reshape(x.shape[0], -1).all(-1)
        assert int(same.sum()) >= 100  # every sample that dropped nothing: bit for bit

"""MuJoCo's soft-constraint contact (``SoftContactParameters``): the step's
acceleration and a rollout against MuJoCo itself, the resting penetration in
closed form, gradients against finite differences, forward mode against
reverse mode, the calibration of its parameters, and bad input."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from backdrive import InputError
from backdrive._errors import ConfigError, InvalidValueError, UnknownNameError
from backdrive.contact import ContactGeometry, ContactModel, ContactParameters, SelfCollision, SoftContactParameters
from backdrive.data import load
from backdrive.optim import ContactFit, SolverOptions, identify
from backdrive.sim import PDActuator, Simulator, State

from _robots import random_targets, sphere_robot, state  # noqa: E402  (shared fixtures)
from test_sysid_contact import delayed  # noqa: E402  (commands acting d steps late)

F64 = torch.float64
DT = 0.002
ARMATURE = 0.01


def _mc():
    pytest.importorskip("mujoco")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import _mujoco_contact as mc

    return mc


@pytest.fixture(scope="module")
def quadruped():
    robot = load("quadruped", floating_base=True, dtype=F64)
    robot = robot.replace(armature=torch.full((robot.num_joints,), ARMATURE, dtype=F64))
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    return robot, ContactGeometry.from_model(robot, links=feet)


def _to_backdrive(mujoco, data, perm):
    """backdrive's ``(q, v)`` of MuJoCo's state (base-frame linear velocity)."""
    R = np.empty(9)
    mujoco.mju_quat2Mat(R, data.qpos[3:7])
    v = data.qvel.copy()
    v[:3] = R.reshape(3, 3).T @ v[:3]
    q = np.concatenate([data.qpos[:7], data.qpos[7:][perm]])
    return torch.tensor(q, dtype=F64), torch.tensor(np.concatenate([v[:6], v[6:][perm]]), dtype=F64), R.reshape(3, 3)


@pytest.mark.parametrize("friction", [0.7, 0.15])
def test_acceleration_matches_mujoco(quadruped, friction):
    """In random states with one to four feet in the floor, sticking and
    sliding (friction 0.15: on the cone), backdrive's acceleration equals
    MuJoCo's ``qacc`` (``mj_forward``, Newton solver at tolerance 1e-12) to
    1e-7 of its size, and so do the normal forces (``efc_force``)."""
    mujoco = pytest.importorskip("mujoco")
    mc = _mc()
    robot, geo = quadruped
    model = mc.build_model("quadruped", dt=DT, native=True, friction=friction, armature=ARMATURE)
    model.opt.tolerance = 1e-12
    data = mujoco.MjData(model)
    cm = ContactModel(robot, geo, params=SoftContactParameters(friction=friction))
    perm = mc.joint_permutation(model, robot.joint_names)
    feet = mc._foot_geoms(model, mc.ROBOTS["quadruped"])
    rng = np.random.default_rng(3)
    contacts = sliding = 0
    for _ in range(12):
        qpos, ctrl = mc.standing_state(model, "quadruped")
        qpos[7:] += rng.normal(0, 0.1, 12)
        data.qpos[:] = qpos
        mujoco.mj_forward(model, data)
        data.qpos[2] -= (data.geom_xpos[feet, 2] - model.geom_size[feet, 0]).min() + rng.uniform(3e-4, 3e-3)
        quat = np.empty(4)
        mujoco.mju_euler2Quat(quat, rng.normal(0, 0.05, 3), "xyz")
        data.qpos[3:7] = quat
        data.qvel[:] = rng.normal(0, 0.3, model.nv)
        data.ctrl[:] = ctrl + rng.normal(0, 0.1, 12)
        mujoco.mj_forward(model, data)
        q, v, R = _to_backdrive(mujoco, data, perm)
        tau = torch.tensor(np.concatenate([np.zeros(6), data.qfrc_actuator[6:][perm]]), dtype=F64)
        a, res = cm.acceleration(robot, q, v, tau, dt=DT)
        a = a.numpy()
        # MuJoCo's free joint: the world-frame derivative of the origin's velocity.
        lin = R @ (a[:3] + np.cross(v[3:6].numpy(), v[:3].numpy()))
        mine = np.concatenate([lin, a[3:6], a[6:]])
        ref = np.concatenate([data.qacc[:6], data.qacc[6:][perm]])
        assert np.abs(mine - ref).max() <= 1e-7 * (1 + np.abs(ref).max())
        for i in range(data.ncon):
            c = data.contact[i]
            k = int(np.flatnonzero(feet == (c.geom2 if c.geom2 in feet else c.geom1))[0])
            adr = c.efc_address
            assert float(res.normal_force[k]) == pytest.approx(data.efc_force[adr], rel=1e-6, abs=1e-6)
            contacts += 1
            sliding += int(data.efc_state[adr] == mujoco.mjtConstraintState.mjCNSTRSTATE_CONE)
    assert contacts >= 10
    if friction < 0.5:
        assert sliding >= 3  # the cone's middle zone was exercised


def test_inverse_inertia_matches_mujoco(quadruped):
    """The regulariser's constant ``A~`` of each foot equals MuJoCo's
    ``body_invweight0`` of the link that carries it, to 1e-12."""
    mc = _mc()
    robot, geo = quadruped
    model = mc.build_model("quadruped", dt=DT, native=True, armature=ARMATURE)
    feet = mc._foot_geoms(model, mc.ROBOTS["quadruped"])
    cm = ContactModel(robot, geo, params=SoftContactParameters())
    ref = model.body_invweight0[model.geom_bodyid[feet], 0]
    assert np.allclose(cm._invweight0.numpy(), ref, rtol=1e-12)


def test_rollout_matches_mujoco_implicitfast(quadruped):
    """A Simulator with the soft contact, PD servos (kp 80, kd 2) and joint
    damping 0.1 follows MuJoCo's ``implicitfast`` rollout of the same robot
    (dropped 2 mm, random targets) for 0.3 s: base within 1e-8 m, joints
    within 1e-7 rad (measured: 4e-10 m and 3e-9 rad; MuJoCo's solver at
    tolerance 1e-12, at its default 1e-8 the gap is 7e-8 m)."""
    mujoco = pytest.importorskip("mujoco")
    mc = _mc()
    robot, geo = quadruped
    robot = robot.replace(damping=torch.full((12,), 0.1, dtype=F64))
    model = mc.build_model("quadruped", dt=DT, native=True, friction=0.7, armature=ARMATURE,
                           integrator="implicitfast", kp=80.0, kd=2.0)
    model.dof_damping[6:] = 0.1
    model.opt.tolerance = 1e-12
    data = mujoco.MjData(model)
    perm = mc.joint_permutation(model, robot.joint_names)
    qpos, ctrl = mc.drop_state(model, "quadruped", 0.002)
    data.qpos[:] = qpos
    mujoco.mj_forward(model, data)
    n = 150
    rng = np.random.default_rng(1)
    cmd = ctrl[perm] + np.cumsum(rng.normal(0, 0.01, (n, 12)), 0)
    qs = []
    for k in range(n):
        c = np.empty(12)
        c[perm] = cmd[k]
        data.ctrl[:] = c
        mujoco.mj_step(model, data)
        qs.append(_to_backdrive(mujoco, data, perm)[0].numpy())
    sim = Simulator(robot, DT, actuator=PDActuator(kp=80.0, kd=2.0, effort_limit=math.inf),
                    contact=ContactModel(robot, geo, params=SoftContactParameters(friction=0.7)))
    q0 = torch.tensor(np.concatenate([qpos[:7], qpos[7:][perm]]), dtype=F64)
    with torch.no_grad():
        tr = sim.rollout(State(q0, torch.zeros(robot.nv, dtype=F64)), torch.tensor(cmd, dtype=F64))
    Q = tr.q[1:].numpy()
    qs = np.array(qs)
    assert float(tr.contact.normal_force[-1].sum()) > 50.0  # standing on the floor
    assert np.abs(Q[:, :3] - qs[:, :3]).max() < 1e-8
    assert np.abs(Q[:, 7:] - qs[:, 7:]).max() < 1e-7


def test_resting_penetration_has_the_closed_form():
    """A sphere at rest sinks until the soft constraint carries its weight:
    with a constant impedance ``d`` the reference acceleration ``k d p``
    equals ``g R m`` (``R = (1 - d) / d / m``, ``k = 1 / (d^2 tc^2
    zeta^2)``), so ``p = g (1 - d) tc^2 zeta^2``. The acceleration there is
    zero to 1e-10 m/s^2, and a drop settles to it within 1e-9 m."""
    robot = sphere_robot()
    d, tc, zeta, g = 0.9, 0.02, 1.3, 9.81
    params = SoftContactParameters(timeconst=tc, dampratio=zeta, impedance=(d, d, 0.001, 0.5, 2.0))
    cm = ContactModel(robot, ContactGeometry.from_model(robot), params=params)
    p = g * (1 - d) * tc * tc * zeta * zeta
    q, v = state(robot, (0.0, 0.0, 0.1 - p))
    a, res = cm.acceleration(robot, q, v, torch.zeros(6, dtype=F64), dt=DT)
    assert a.abs().max() < 1e-10
    assert float(res.normal_force[0]) == pytest.approx(g, rel=1e-12)
    sim = Simulator(robot, DT, contact=cm)
    q0, v0 = state(robot, (0.0, 0.0, 0.102))
    with torch.no_grad():
        tr = sim.rollout(State(q0, v0), torch.zeros(600, 0, dtype=F64))
    assert float(tr.q[-1, 2]) == pytest.approx(0.1 - p, abs=1e-9)


def _grad_case(robot, geo, q, v, tau, extra=None):
    def f(v, tau, tc, zeta, mu, mass):
        r = robot.replace(body_mass=mass)
        cm = ContactModel(r, geo, params=SoftContactParameters(timeconst=tc, dampratio=zeta, friction=mu))
        a, res = cm.acceleration(r, q, v, tau, dt=DT, extra_damping=extra)
        return torch.cat([a, res.force.reshape(-1)])  # the step and the forces it applied

    args = (v.clone().requires_grad_(), tau.clone().requires_grad_(), torch.tensor(0.02, dtype=F64, requires_grad=True),
            torch.tensor(1.1, dtype=F64, requires_grad=True), torch.tensor(0.6, dtype=F64, requires_grad=True),
            robot.body_mass.clone().requires_grad_())
    return f, args


def test_gradients_match_finite_differences_sticking(quadruped):
    """Standing with all four feet 0.7 mm in the floor (the impedance's
    smooth part), feet sticking: the gradient of the acceleration and of the
    contact forces with respect to velocity, torques, time constant, damping
    ratio, friction and masses passes ``gradcheck`` in float64 (the
    implicit-function gradient of the converged solve)."""
    robot, geo = quadruped
    q = robot.neutral()
    q[7:] = torch.tensor([0.0, 0.8, -1.6] * 4, dtype=F64)
    q = ContactModel(robot, geo, params=SoftContactParameters()).place_on_terrain(robot, q, clearance=-7e-4)
    g = torch.Generator().manual_seed(0)
    v = 0.05 * torch.randn(robot.nv, generator=g, dtype=F64)
    tau = torch.cat([torch.zeros(6, dtype=F64), torch.randn(12, generator=g, dtype=F64)])
    f, args = _grad_case(robot, geo, q, v, tau, extra=torch.full((18,), 0.5, dtype=F64))
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_gradients_match_finite_differences_sliding():
    """A sphere sliding at 1 m/s, spinning, 0.5 mm in the floor (on the
    friction cone): ``gradcheck`` passes with respect to the velocity, the
    contact parameters and the mass."""
    robot = sphere_robot()
    geo = ContactGeometry.from_model(robot)
    q, _ = state(robot, (0.0, 0.0, 0.0995))
    v = torch.tensor([1.0, 0.3, -0.05, 0.5, -2.0, 1.0], dtype=F64)
    f, args = _grad_case(robot, geo, q, v, torch.zeros(6, dtype=F64))
    a = f(*args).detach()
    assert float(a[0]) < -1.0  # friction decelerates it
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_forward_mode_matches_reverse_mode(quadruped):
    """``torch.func.jacfwd`` through the solve (ContactFit's default
    Jacobian) equals the reverse-mode Jacobian to 1e-10 of its size."""
    robot, geo = quadruped
    q = robot.neutral()
    q[7:] = torch.tensor([0.0, 0.8, -1.6] * 4, dtype=F64)
    q = ContactModel(robot, geo, params=SoftContactParameters()).place_on_terrain(robot, q, clearance=-7e-4)
    v = torch.zeros(robot.nv, dtype=F64)
    v[0] = 0.2

    def f(x):
        cm = ContactModel(robot, geo, params=SoftContactParameters(timeconst=x[0], dampratio=x[1], friction=x[2]))
        return cm.acceleration(robot, q, v, torch.zeros(robot.nv, dtype=F64), dt=DT)[0]

    x = torch.tensor([0.02, 1.0, 0.5], dtype=F64)
    Jf = torch.func.jacfwd(f)(x)
    Jr = torch.autograd.functional.jacobian(f, x)
    assert (Jf - Jr).abs().max() <= 1e-10 * Jr.abs().max()
    assert Jr.abs().max() > 1.0


def _quadruped_sim(robot, geo, tc, zeta, mu, strength=1.0):
    cm = ContactModel(robot, geo, params=SoftContactParameters(timeconst=tc, dampratio=zeta, friction=mu))
    return Simulator(robot, DT, actuator=PDActuator(kp=60.0 * strength, kd=1.5 * strength, effort_limit=math.inf),
                     contact=cm)


def test_contact_fit_recovers_the_soft_law_trunk_mass_strength_and_delay(quadruped):
    """The quadruped under random PD targets, simulated with the soft contact
    (time constant 0.03 s, damping ratio 0.8, friction 0.6, trunk 5.6 kg,
    motor strength 0.9, delay 2 steps; the commands sent before the
    recordings given as ``history``), seen through encoders and an IMU: from
    MuJoCo's defaults, friction 0.8, trunk 5.0 kg and strength 1 the fit
    returns every value within 1e-4 and the delay."""
    robot, geo = quadruped
    qj = torch.tensor([0.0, 0.8, -1.6] * 4, dtype=F64)
    q = robot.neutral()
    q[7:] = qj
    q = ContactModel(robot, geo, params=SoftContactParameters()).place_on_terrain(robot, q, clearance=-3e-4)
    B, steps, lead = 2, 70, 3
    u = random_targets(qj, B, steps, seed=3)  # (B, steps, 12)
    masses = robot.body_mass.clone()
    masses[0] = 5.6
    truth = robot.replace(body_mass=masses)
    v0 = torch.zeros(B, robot.nv, dtype=F64)
    v0[:, 0] = 0.15
    traj = _quadruped_sim(truth, geo, 0.03, 0.8, 0.6, 0.9).rollout(State(q.expand(B, -1), v0), delayed(u, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = identify(robot, traj.q[:, lead:], traj.v[:, lead:], dt=DT, bodies=["trunk"],
                       params=("body_mass", "contact_timeconst", "contact_dampratio", "contact_friction",
                               "motor_strength"),
                       method=ContactFit(_quadruped_sim(robot, geo, 0.02, 1.0, 0.8), u[:, lead:], segment=10,
                                         delays=(1, 2, 3), history=u[:, :lead], jacobian="differences"),
                       options=SolverOptions("gauss_newton", iterations=12))
    p = fit.params
    assert fit.delay == 2
    assert float(p["body_mass"][0]) == pytest.approx(5.6, rel=1e-4)
    for name, value in (("contact_timeconst", 0.03), ("contact_dampratio", 0.8), ("contact_friction", 0.6),
                        ("motor_strength", 0.9)):
        assert float(p[name]) == pytest.approx(value, rel=1e-4), name
    assert fit.simulator.contact.soft and fit.not_identified == []


def test_bad_soft_settings_give_typed_errors(quadruped):
    robot, geo = quadruped
    for bad in (dict(timeconst=-0.02), dict(dampratio=0.0), dict(friction=float("nan")), dict(timeconst="fast")):
        with pytest.raises(InvalidValueError):
            ContactModel(robot, geo, params=SoftContactParameters(**bad))
    with pytest.raises(InvalidValueError, match="impedance"):
        ContactModel(robot, geo, params=SoftContactParameters(impedance=(0.9, 1.2, 0.001, 0.5, 2.0)))
    with pytest.raises(InvalidValueError, match="impedance"):
        ContactModel(robot, geo, params=SoftContactParameters(impedance=(0.9, 0.95)))
    with pytest.raises(InvalidValueError, match="impratio"):
        ContactModel(robot, geo, params=SoftContactParameters(impratio=0))
    with pytest.raises(InputError, match="shapes"):
        ContactModel(robot, geo, params=SoftContactParameters(friction=torch.ones(3, dtype=F64)))
    with pytest.raises(UnknownNameError):
        SoftContactParameters().replace(stiffness=1e4)
    cm = ContactModel(robot, geo, params=SoftContactParameters())
    q = robot.neutral()
    v = torch.zeros(robot.nv, dtype=F64)
    with pytest.raises(InputError, match="soft constraint"):
        cm.forces(robot, q, v)
    with pytest.raises(InputError, match="dt > 0"):
        cm.acceleration(robot, q, v, torch.zeros(robot.nv, dtype=F64))
    with pytest.raises(InputError, match="self-collision"):
        ContactModel(robot, geo, params=SoftContactParameters(), self_collision=SelfCollision.build(robot))
    sim = Simulator(robot, DT, actuator=PDActuator(kp=80.0, kd=2.0), contact=cm)
    with pytest.raises(InputError, match="penalty law"):
        identify(robot, q.expand(1, 21, -1), v.expand(1, 21, -1), dt=DT, params=("contact_stiffness",),
                 method=ContactFit(sim, torch.zeros(1, 20, 12, dtype=F64), segment=10))
    penalty = Simulator(robot, DT, actuator=PDActuator(kp=80.0, kd=2.0),
                        contact=ContactModel(robot, geo, params=ContactParameters()))
    with pytest.raises(InputError, match="soft-constraint"):
        identify(robot, q.expand(1, 21, -1), v.expand(1, 21, -1), dt=DT, params=("contact_timeconst",),
                 method=ContactFit(penalty, torch.zeros(1, 20, 12, dtype=F64), segment=10))
    with pytest.raises(ConfigError, match="history"):
        ContactFit(sim, torch.zeros(1, 20, 12, dtype=F64), history=torch.zeros(2, 3, 12, dtype=F64))


def test_joint_friction_with_the_soft_contact_is_refused(quadruped):
    """The implicit joint friction is solved with the penalty contact only: a
    Simulator with the soft contact and a robot with joint friction says so."""
    robot, geo = quadruped
    rough = robot.replace(friction=torch.full((12,), 0.2, dtype=F64))
    with pytest.raises(InputError, match="joint friction"):
        Simulator(rough, DT, actuator=PDActuator(kp=80.0, kd=2.0),
                  contact=ContactModel(rough, geo, params=SoftContactParameters()))



def test_batched_step_equals_single_samples(quadruped):
    """A batch of states with a friction per foot and a batch of time
    constants gives each sample's own step, to 1e-12."""
    robot, geo = quadruped
    q = robot.neutral()
    q[7:] = torch.tensor([0.0, 0.8, -1.6] * 4, dtype=F64)
    q = ContactModel(robot, geo, params=SoftContactParameters()).place_on_terrain(robot, q, clearance=-5e-4)
    g = torch.Generator().manual_seed(2)
    qb = q.expand(3, -1).clone()
    qb[:, 7:] += 0.02 * torch.randn(3, 12, generator=g, dtype=F64)
    vb = 0.3 * torch.randn(3, robot.nv, generator=g, dtype=F64)
    tau = torch.zeros(robot.nv, dtype=F64)
    mu = torch.tensor([0.3, 0.6, 0.9, 1.2], dtype=F64)
    tc = torch.tensor([[0.01], [0.02], [0.03]], dtype=F64)
    a, res = ContactModel(robot, geo, params=SoftContactParameters(timeconst=tc, friction=mu)).acceleration(
        robot, qb, vb, tau, dt=DT)
    for i in range(3):
        cm = ContactModel(robot, geo, params=SoftContactParameters(timeconst=float(tc[i]), friction=mu))
        ai, ri = cm.acceleration(robot, qb[i], vb[i], tau, dt=DT)
        assert torch.allclose(a[i], ai, rtol=1e-12, atol=1e-10)
        assert torch.allclose(res.normal_force[i], ri.normal_force, rtol=1e-12, atol=1e-10)
    assert float(res.normal_force.sum()) > 0


def test_states_and_gradients_stay_finite_under_fuzzing(quadruped):
    """64 random states (feet from 5 mm above to 5 mm into the floor, random
    attitude, velocities up to a few m/s, random torques): the step's
    acceleration, forces and the gradient of both with respect to state,
    torques and contact parameters are finite."""
    robot, geo = quadruped
    g = torch.Generator().manual_seed(11)
    n = 64
    q = robot.neutral().expand(n, -1).clone()
    q[:, 7:] = torch.tensor([0.0, 0.8, -1.6] * 4, dtype=F64) + 0.3 * torch.randn(n, 12, generator=g, dtype=F64)
    from backdrive.spatial import rotvec_to_quat

    q[:, 3:7] = rotvec_to_quat(0.2 * torch.randn(n, 3, generator=g, dtype=F64))
    base = ContactModel(robot, geo, params=SoftContactParameters())
    q = base.place_on_terrain(robot, q) + 0.0
    q[:, 2] += 0.01 * (torch.rand(n, generator=g, dtype=F64) - 0.5)
    v = 2.0 * torch.randn(n, robot.nv, generator=g, dtype=F64)
    tau = torch.cat([torch.zeros(n, 6, dtype=F64), 20.0 * torch.randn(n, 12, generator=g, dtype=F64)], -1)
    x = torch.tensor([0.02, 1.0, 0.7], dtype=F64, requires_grad=True)
    q.requires_grad_(True)
    v.requires_grad_(True)
    tau.requires_grad_(True)
    cm = ContactModel(robot, geo, params=SoftContactParameters(timeconst=x[0], dampratio=x[1], friction=x[2]))
    a, res = cm.acceleration(robot, q, v, tau, dt=DT, extra_damping=torch.full((18,), 2.0, dtype=F64))
    assert bool(torch.isfinite(a).all()) and bool(torch.isfinite(res.force).all())
    assert int((res.penetration > 0).sum()) > 20 and int((res.penetration <= 0).sum()) > 20
    grads = torch.autograd.grad(a.sum() + res.force.sum(), (q, v, tau, x))
    assert all(bool(torch.isfinite(gr).all()) for gr in grads)

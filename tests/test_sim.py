"""Simulator: integrators, actuators, soft limits, truncation, NaN reporting, robots."""

from __future__ import annotations

import io
import math

import pytest
import torch

import backdrive.sim as bsim
from backdrive import InputError, UnknownNameError
from backdrive.model import RobotModel
from backdrive.sim import (
    MassSpringDamper,
    NonFiniteError,
    PDActuator,
    SimulationError,
    Simulator,
    SoftJointLimits,
    State,
    TorqueActuator,
    smooth_saturation,
)

F64 = torch.float64



def msd_state(x=1.0, v=0.0, dtype=F64):
    return State(torch.tensor([x], dtype=dtype), torch.tensor([v], dtype=dtype))


def test_public_names_resolve():
    for name in bsim.__all__:
        assert getattr(bsim, name) is not None, name


# ---------------------------------------------------------------- mass-spring-damper


def test_semi_implicit_is_velocity_then_position():
    sim = Simulator(MassSpringDamper(), 0.01)
    u = torch.linspace(-1.0, 2.0, 7, dtype=F64)[:, None]
    traj = sim.rollout(msd_state(), u)
    x, v = 1.0, 0.0
    for t in range(7):
        v = v + 0.01 * (float(u[t, 0]) - 15.0 * x - 0.5 * v)
        x = x + 0.01 * v
        assert traj.q[t + 1, 0].item() == pytest.approx(x, abs=1e-15)
        assert traj.v[t + 1, 0].item() == pytest.approx(v, abs=1e-15)
    assert traj.q.shape == (8, 1) and traj.effort.shape == (7, 1)
    assert torch.equal(traj.effort, u)  # no effort limit on the built-in system


def _msd_exact(t, x0=1.0, k=15.0, c=0.5, m=1.0):
    # Under-damped free response with v(0) = 0.
    zeta = c / (2 * math.sqrt(k * m))
    wn = math.sqrt(k / m)
    wd = wn * math.sqrt(1 - zeta * zeta)
    return x0 * math.exp(-zeta * wn * t) * (math.cos(wd * t) + zeta * wn / wd * math.sin(wd * t))


@pytest.mark.parametrize("integrator, order", [("semi_implicit", 1), ("euler", 1), ("rk4", 4)])
def test_integrator_convergence_order(integrator, order):
    errors = []
    for dt in (0.02, 0.01):
        sim = Simulator(MassSpringDamper(), dt, integrator=integrator)
        n = round(1.0 / dt)
        traj = sim.rollout(msd_state(), sim.zero_controls(n))
        errors.append(abs(traj.q[-1, 0].item() - _msd_exact(1.0)))
    observed = math.log2(errors[0] / errors[1])
    assert abs(observed - order) < 0.25, (errors, observed)


def test_batched_rollout_matches_single_rollouts():
    sim = Simulator(MassSpringDamper(), 0.01, integrator="rk4")
    g = torch.Generator().manual_seed(0)
    q0 = torch.randn(3, 1, generator=g, dtype=F64)
    u = torch.randn(3, 9, 1, generator=g, dtype=F64)
    batched = sim.rollout(State(q0, torch.zeros(1, dtype=F64)), u)
    assert batched.q.shape == (3, 10, 1)
    for i in range(3):
        single = sim.rollout(State(q0[i], torch.zeros(1, dtype=F64)), u[i])
        torch.testing.assert_close(batched.q[i], single.q, rtol=0, atol=1e-15)
        torch.testing.assert_close(batched.v[i], single.v, rtol=0, atol=1e-15)


def test_step_matches_rollout_and_float32_runs():
    for dtype in (F64, torch.float32):
        sim = Simulator(MassSpringDamper(dtype=dtype), 0.01)
        u = torch.full((3, 1), 0.5, dtype=dtype)
        s = msd_state(dtype=dtype)
        for t in range(3):
            s = sim.step(s, u[t])
        traj = sim.rollout(msd_state(dtype=dtype), u)
        assert s.q.dtype == dtype
        torch.testing.assert_close(s.q, traj.q[-1])
        torch.testing.assert_close(s.v, traj.v[-1])


def test_gradcheck_rollout_msd_all_integrators():
    for integrator in ("semi_implicit", "rk4"):
        q0 = torch.tensor([0.3], dtype=F64, requires_grad=True)
        v0 = torch.tensor([-0.2], dtype=F64, requires_grad=True)
        u = torch.randn(20, 1, dtype=F64, generator=torch.Generator().manual_seed(1)).requires_grad_()
        k = torch.tensor(15.0, dtype=F64, requires_grad=True)
        c = torch.tensor(0.5, dtype=F64, requires_grad=True)
        m = torch.tensor(1.3, dtype=F64, requires_grad=True)

        def f(q0, v0, u, k, c, m):
            sim = Simulator(MassSpringDamper(m, k, c), 0.01, integrator=integrator)
            tr = sim.rollout(State(q0, v0), u)
            return torch.cat([tr.q[-1], tr.v[-1], tr.q[10]])

        assert torch.autograd.gradcheck(f, (q0, v0, u, k, c, m))


# ---------------------------------------------------------------- actuators and limits


def test_smooth_saturation():
    limit = torch.tensor([2.0, math.inf, 0.5], dtype=F64)
    x = torch.linspace(-5, 5, 101, dtype=F64)[:, None].expand(101, 3).clone().requires_grad_()
    y = smooth_saturation(x, limit)
    assert bool((y[:, 0].abs() < 2.0).all()) and bool((y[:, 2].abs() <= 0.5).all())
    torch.testing.assert_close(y[:, 1], x[:, 1])  # infinite limit passes through
    below = x[:, 0].abs() <= 1.8  # exact below 90 % of the limit
    assert torch.equal(y[below, 0], x[below, 0])
    y.sum().backward()
    assert bool(torch.isfinite(x.grad).all())
    assert x.grad[50].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert bool((x.grad[:, 0] > 0).all())  # never exactly flat, unlike a clamp
    assert smooth_saturation(torch.tensor([1e6], dtype=F64), limit[:1]).item() == 2.0
    # Value, slope and curvature are continuous at the knee.
    knee = torch.tensor([1.8 - 1e-6, 1.8 + 1e-6], dtype=F64, requires_grad=True)
    yk = smooth_saturation(knee, torch.tensor(2.0, dtype=F64))
    (g,) = torch.autograd.grad(yk.sum(), knee)
    assert abs(yk[1].item() - yk[0].item() - 2e-6) < 1e-12 and g.tolist() == pytest.approx([1.0, 1.0])
    assert torch.autograd.gradcheck(lambda t: smooth_saturation(t, limit), (x.detach()[::7].clone().requires_grad_(),))


def test_pd_actuator_steady_state_and_gain_gradients():
    # m x'' = kp (u - x) - kd x' - k x: rest at x = kp u / (kp + k).
    kp = torch.tensor(40.0, dtype=F64, requires_grad=True)
    kd = torch.tensor(12.0, dtype=F64, requires_grad=True)
    sim = Simulator(MassSpringDamper(), 0.01, integrator="rk4", actuator=PDActuator(kp, kd))
    target = torch.full((800, 1), 0.3, dtype=F64)
    traj = sim.rollout(msd_state(0.0), target)
    assert traj.q[-1, 0].item() == pytest.approx(40.0 * 0.3 / 55.0, abs=1e-6)
    traj.q[200, 0].backward()
    assert kp.grad is not None and kd.grad is not None
    assert float(kp.grad) != 0.0 and float(kd.grad) != 0.0

    def f(kp, kd):
        s = Simulator(MassSpringDamper(), 0.01, actuator=PDActuator(kp, kd, effort_limit=5.0))
        return s.rollout(msd_state(0.0), target[:15]).q[-1]

    assert torch.autograd.gradcheck(f, (kp.detach().requires_grad_(), kd.detach().requires_grad_()))


SLIDER = """<robot name="slider">
  <link name="base"/>
  <joint name="x" type="prismatic">
    <parent link="base"/><child link="block"/><axis xyz="1 0 0"/>
    <limit lower="-0.1" upper="0.1" effort="50" velocity="1"/>
  </joint>
  <link name="block"><inertial><mass value="2"/>
    <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" iyz="0" izz="0.01"/></inertial></link>
  <joint name="spin" type="continuous">
    <parent link="block"/><child link="wheel"/><axis xyz="1 0 0"/>
  </joint>
  <link name="wheel"><inertial><mass value="0.5"/>
    <inertia ixx="0.02" ixy="0" ixz="0" iyy="0.01" iyz="0" izz="0.01"/></inertial></link>
</robot>"""


def test_soft_limits_balance_a_constant_force():
    robot = RobotModel.from_urdf(SLIDER)
    limits = SoftJointLimits(stiffness=2000.0, damping=200.0)
    sim = Simulator(robot, 0.004, limits=limits)
    u = torch.tensor([10.0, 0.3], dtype=F64).expand(300, 2)
    traj = sim.rollout(sim.initial_state(torch.tensor([0.1, 0.0], dtype=F64)), u)
    # The spring balances the push (20 % of the effort limit: applied exactly).
    push = 10.0
    assert traj.q[-1, 0].item() == pytest.approx(0.1 + push / 2000.0, abs=1e-6)
    # The continuous joint has no limits and no effort limit: it spins up freely.
    assert traj.v[-1, 1].item() == pytest.approx(0.3 / 0.02 * 1.2, rel=1e-9)
    free = Simulator(robot, 0.004).rollout(sim.initial_state(), u[:100])
    assert free.q[-1, 0].item() > 0.3  # without limits the block passes the stop


def test_effort_limit_from_model_and_passive_joints():
    robot = RobotModel.from_urdf(SLIDER)
    sim = Simulator(robot, 0.01, actuator=TorqueActuator(joints=["x"]))
    assert sim.nu == 1 and sim.actuated == (0,)
    assert sim.effort_limit.tolist() == [50.0]
    tau, effort = sim.efforts(robot.neutral(), torch.zeros(2, dtype=F64), torch.tensor([1e4], dtype=F64))
    assert effort.item() == pytest.approx(50.0)
    assert tau.tolist() == pytest.approx([50.0, 0.0])  # the wheel is not driven
    with pytest.raises(UnknownNameError):
        Simulator(robot, 0.01, actuator=TorqueActuator(joints=["y"]))


def test_input_errors():
    sim = Simulator(MassSpringDamper(), 0.01)
    with pytest.raises(InputError, match="controls"):
        sim.rollout(msd_state(), torch.zeros(5, 2, dtype=F64))
    with pytest.raises(InputError, match="dtype"):
        sim.rollout(msd_state(dtype=torch.float32), torch.zeros(5, 1, dtype=F64))
    with pytest.raises(InputError, match="integrator"):
        Simulator(MassSpringDamper(), 0.01, integrator="verlet")
    with pytest.raises(InputError, match="dt"):
        Simulator(MassSpringDamper(), -0.01)
    with pytest.raises(InputError, match="truncate_every"):
        sim.rollout(msd_state(), torch.zeros(5, 1, dtype=F64), truncate_every=0)
    with pytest.raises(InputError, match="RobotModel"):
        Simulator("pendulum", 0.01)


# ---------------------------------------------------------------- long rollouts


def test_truncation_cuts_gradients_beyond_the_window():
    sim = Simulator(MassSpringDamper(), 0.01)
    u = torch.zeros(30, 1, dtype=F64, requires_grad=True)
    traj = sim.rollout(msd_state(), u, truncate_every=10)
    traj.q[-1, 0].backward()
    g_trunc = u.grad.clone()
    u.grad = None
    sim.rollout(msd_state(), u).q[-1, 0].backward()
    g_full = u.grad
    assert bool((g_trunc[:20] == 0).all())
    torch.testing.assert_close(g_trunc[20:], g_full[20:], rtol=0, atol=0)
    assert bool((g_full[:20] != 0).all())
    # Values are not changed by truncation.
    torch.testing.assert_close(traj.q, sim.rollout(msd_state(), u.detach()).q, rtol=0, atol=0)


def test_gradient_norms_are_reported():
    sim = Simulator(MassSpringDamper(), 0.01)
    q0 = torch.tensor([1.0], dtype=F64, requires_grad=True)
    v0 = torch.tensor([0.0], dtype=F64, requires_grad=True)
    traj = sim.rollout(State(q0, v0), sim.zero_controls(25), monitor_gradients=True)
    loss = 3.0 * traj.q[-1, 0]
    loss.backward()
    norms = traj.state_gradient_norms()
    assert norms.shape == (26,)
    assert norms[-1].item() == pytest.approx(3.0)
    assert norms[0].item() == pytest.approx(math.hypot(q0.grad.item(), v0.grad.item()))
    unmonitored = sim.rollout(msd_state(), sim.zero_controls(3))
    with pytest.raises(SimulationError, match="monitor_gradients"):
        unmonitored.state_gradient_norms()


def test_non_finite_gradient_names_the_step():
    sim = Simulator(MassSpringDamper(), 0.01)
    u = torch.zeros(10, 1, dtype=F64, requires_grad=True)
    traj = sim.rollout(msd_state(), u, monitor_gradients=True)
    # d sqrt(x)/dx is infinite at 0: the bad gradient enters at state 6.
    loss = torch.sqrt(traj.q[6, 0] - traj.q[6, 0].detach()) + traj.q[-1, 0]
    loss.backward()
    with pytest.raises(NonFiniteError, match="step 6") as info:
        traj.state_gradient_norms()
    assert info.value.step == 6 and info.value.what == "gradient"


def test_nan_control_names_the_step():
    sim = Simulator(MassSpringDamper(), 0.01)
    u = torch.zeros(12, 1, dtype=F64)
    u[7, 0] = math.nan
    with pytest.raises(NonFiniteError, match="step 8") as info:
        sim.rollout(msd_state(), u)
    assert info.value.step == 8 and "control of step 7" in str(info.value)
    with pytest.raises(NonFiniteError, match="non-finite input: control"):
        sim.step(msd_state(), u[7])


def test_a_failed_solve_is_reported_alike_by_step_and_rollout(monkeypatch):
    # A step's matrix that stops being positive definite raises LinAlgError in
    # the solve (the contact step's Cholesky); step and rollout report it with
    # one wording, naming the step and a non-finite input when there is one.
    sim = Simulator(MassSpringDamper(), 0.01)
    real, calls = sim._advance, []

    def failing(q, v, u):
        calls.append(1)
        if len(calls) == 4:
            raise torch.linalg.LinAlgError("linalg.cholesky: The factorization could not be completed")
        return real(q, v, u)

    monkeypatch.setattr(sim, "_advance", failing)
    solve = r"could not be solved \(linalg.cholesky: The factorization could not be completed\)"
    with pytest.raises(NonFiniteError, match=r"from state 3 \(t = 0.03 s\) to step 4 " + solve) as info:
        sim.rollout(msd_state(), sim.zero_controls(10))
    assert info.value.step == 4 and "the state and controls were finite, so the dynamics diverged" in str(info.value)
    calls[:] = [1, 1, 1]
    with pytest.raises(NonFiniteError, match=r"from state 0 \(t = 0 s\) to step 1 " + solve) as info:
        sim.step(msd_state(), torch.zeros(1, dtype=F64))
    assert info.value.step == 1 and "the state and controls were finite, so the dynamics diverged" in str(info.value)
    calls[:] = [1, 1, 1]
    with pytest.raises(NonFiniteError, match=solve + r" \(non-finite input: control\)"):
        sim.step(msd_state(), torch.full((1,), math.nan, dtype=F64))
    u = sim.zero_controls(10)
    u[3] = math.nan
    calls.clear()
    with pytest.raises(NonFiniteError, match=r"to step 4 " + solve + r" \(non-finite input: control\)"):
        sim.rollout(msd_state(), u)


def test_divergence_names_the_step():
    # Semi-implicit Euler is unstable for dt * sqrt(k / m) > 2.
    sim = Simulator(MassSpringDamper(stiffness=1e6, damping=0.0), 0.01)
    with pytest.raises(NonFiniteError, match="diverged") as info:
        sim.rollout(msd_state(), sim.zero_controls(400))
    assert 0 < info.value.step < 400
    # Without the check the NaN/Inf is returned as is.
    traj = sim.rollout(msd_state(), sim.zero_controls(400), check_finite=False)
    assert not bool(torch.isfinite(traj.q[-1]).all())


def test_replace_keeps_settings():
    sim = Simulator(MassSpringDamper(), 0.01, integrator="rk4")
    other = sim.replace(system=MassSpringDamper(mass=2.0), dt=0.02)
    assert other.integrator == "rk4" and other.dt == 0.02 and float(other.system.mass) == 2.0
    with pytest.raises(InputError, match="unknown simulator settings"):
        sim.replace(gravity=1.0)
    assert "MassSpringDamper" in repr(sim)
    buf = io.StringIO()
    buf.write(repr(sim.initial_state()))
    assert "State" in buf.getvalue()

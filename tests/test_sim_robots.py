"""Simulating URDF robots: closed forms, energy conservation, gradients, floating base."""

from __future__ import annotations

import math

import pytest
import torch

from backdrive.data import load
from backdrive.dynamics import center_of_mass, kinetic_energy, potential_energy
from backdrive.sim import PDActuator, Simulator, SoftJointLimits, State, TorqueActuator

F64 = torch.float64
G = 9.81



def energy(robot, traj):
    return kinetic_energy(robot, traj.q, traj.v) + potential_energy(robot, traj.q)


def pendulum_period(theta0: float) -> float:
    """Exact period of the point pendulum (L = 1 m, I = m L^2 + 1e-9):
    ``4 K(sin(theta0 / 2)) / omega0`` with ``K`` from the arithmetic-geometric mean."""
    k = math.sin(theta0 / 2)
    a, b = 1.0, math.sqrt(1 - k * k)
    for _ in range(30):
        a, b = (a + b) / 2, math.sqrt(a * b)
    K = math.pi / (2 * a)
    omega0 = math.sqrt(G / (1.0 + 1e-9))
    return 4 * K / omega0


def test_pendulum_acceleration_is_the_closed_form():
    robot = load("pendulum")
    sim = Simulator(robot, 0.01)
    g = torch.Generator().manual_seed(0)
    q = 4 * torch.rand(50, 1, generator=g, dtype=F64) - 2
    v = torch.randn(50, 1, generator=g, dtype=F64)
    u = 5 * torch.randn(50, 1, generator=g, dtype=F64)
    a = sim.acceleration(q, v, u)
    # |u| is far below the 1000 N m effort limit: applied exactly.
    expected = (u - G * torch.sin(q)) / (1.0 + 1e-9)
    torch.testing.assert_close(a, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("theta0", [0.3, 2.5])
def test_pendulum_swings_with_the_exact_period(theta0):
    robot = load("pendulum")
    period = pendulum_period(theta0)
    n = 160
    sim = Simulator(robot, period / n, integrator="rk4")
    traj = sim.rollout(sim.initial_state(torch.tensor([theta0], dtype=F64)), sim.zero_controls(n))
    # Half a period later it is at the other extreme, a period later back at rest.
    assert traj.q[n // 2, 0].item() == pytest.approx(-theta0, abs=1e-6)
    assert traj.q[-1, 0].item() == pytest.approx(theta0, abs=1e-6)
    assert abs(traj.v[-1, 0].item()) < 1e-5
    assert float((traj.q[:, 0].abs() <= theta0 + 1e-9).all()) == 1.0


@pytest.mark.slow
def test_double_pendulum_rk4_conserves_energy():
    robot = load("double_pendulum")
    assert float(robot.damping.abs().sum() + robot.friction.abs().sum()) == 0.0
    sim = Simulator(robot, 1e-3, integrator="rk4")
    q0 = torch.tensor([[1.0, -0.5], [2.0, 1.0], [0.3, 2.5]], dtype=F64)
    v0 = torch.tensor([[0.0, 0.0], [1.0, -2.0], [-3.0, 1.0]], dtype=F64)
    traj = sim.rollout(State(q0, v0), sim.zero_controls(1000, 3))
    E = energy(robot, traj)  # (3, 1001)
    # Relative to the energy scale m g L of the swing (E is 0 at rest hanging
    # only up to the potential's zero, so take the spread of KE and PE).
    scale = kinetic_energy(robot, traj.q, traj.v).amax(-1)
    drift = ((E - E[:, :1]).abs().amax(-1) / scale).max().item()
    assert drift < 1e-6, drift
    assert float(traj.q.abs().max()) > 1.0  # it really moved
    # Semi-implicit Euler at the same step is only first order: far larger error.
    semi = Simulator(robot, 1e-3).rollout(State(q0, v0), sim.zero_controls(200, 3))
    semi_drift = ((energy(robot, semi) - E[:, :1]).abs().amax(-1) / scale).max().item()
    assert semi_drift > 100 * drift


def test_cartpole_matches_the_textbook_equations():
    robot = load("cartpole")
    sim = Simulator(robot, 0.02, actuator=TorqueActuator(joints=["slider"]))
    assert sim.nu == 1 and sim.effort_limit.tolist() == [10.0]
    g = torch.Generator().manual_seed(1)
    q = torch.randn(20, 2, generator=g, dtype=F64)
    v = torch.randn(20, 2, generator=g, dtype=F64)
    F = 8 * torch.rand(20, 1, generator=g, dtype=F64) - 4
    a = sim.acceleration(q, v, F)
    mc, mp, l, inertia = 1.0, 0.1, 0.5, 1.0 / 120
    th, thd = q[:, 1], v[:, 1]
    force = F[:, 0]  # below 90 % of the 10 N limit: applied exactly
    # (mc + mp) x'' + mp l cos(th) th'' - mp l sin(th) th'^2 = F
    # mp l cos(th) x'' + (I + mp l^2) th'' - mp g l sin(th) = 0
    A = torch.stack(
        [torch.stack([torch.full_like(th, mc + mp), mp * l * torch.cos(th)], -1),
         torch.stack([mp * l * torch.cos(th), torch.full_like(th, inertia + mp * l * l)], -1)], -2
    )
    b = torch.stack([force + mp * l * torch.sin(th) * thd**2, mp * G * l * torch.sin(th)], -1)
    torch.testing.assert_close(a, torch.linalg.solve(A, b), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- gradients


def test_gradcheck_20_step_rollout_state_and_physical_parameters():
    robot = load("double_pendulum")
    sim = Simulator(robot, 0.01, actuator=TorqueActuator(effort_limit=3.0))
    u = torch.randn(20, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    inputs = (
        torch.tensor([0.4, -0.3], dtype=F64),  # q0
        torch.tensor([0.5, 1.0], dtype=F64),  # v0
        robot.body_mass.clone(),
        torch.tensor([0.2, 0.1], dtype=F64),  # damping
        torch.tensor([0.05, 0.08], dtype=F64),  # friction (smoothed Coulomb)
        torch.tensor([0.01, 0.02], dtype=F64),  # armature
    )

    def final_state(q0, v0, mass, damping, friction, armature):
        model = robot.replace(body_mass=mass, damping=damping, friction=friction, armature=armature)
        traj = sim.replace(robot=model).rollout(State(q0, v0), u)
        return traj.final.to_vector()

    assert torch.autograd.gradcheck(final_state, tuple(x.requires_grad_() for x in inputs))


def test_gradcheck_20_step_rollout_controls_and_com():
    robot = load("double_pendulum")
    sim = Simulator(robot, 0.01, actuator=TorqueActuator(effort_limit=3.0))
    s0 = State(torch.tensor([0.4, -0.3], dtype=F64), torch.tensor([0.5, 1.0], dtype=F64))
    u = torch.randn(20, 2, dtype=F64, generator=torch.Generator().manual_seed(3)).requires_grad_()
    com = robot.body_com.clone().requires_grad_()

    def f(u, com):
        traj = sim.replace(robot=robot.replace(body_com=com)).rollout(s0, u)
        return torch.cat([traj.q[..., 10, :], traj.final.to_vector()])

    assert torch.autograd.gradcheck(f, (u, com), fast_mode=True)


def test_gradcheck_rk4_with_pd_gains_and_soft_limits():
    robot = load("cartpole")
    limits = SoftJointLimits(stiffness=200.0, damping=5.0, width=0.05)
    s0 = State(torch.tensor([2.35, 3.0], dtype=F64), torch.tensor([1.0, 0.0], dtype=F64))  # hits the 2.4 m stop
    target = torch.full((10, 1), 2.6, dtype=F64)

    def f(kp, kd, q0):
        sim = Simulator(robot, 0.02, integrator="rk4", limits=limits,
                        actuator=PDActuator(kp, kd, joints=["slider"]))
        traj = sim.rollout(State(q0, s0.v), target)
        return traj.final.to_vector()

    traj = Simulator(robot, 0.02, integrator="rk4", limits=limits,
                     actuator=PDActuator(20.0, 2.0, joints=["slider"])).rollout(s0, target)
    assert float(traj.q[:, 0].max()) > 2.4  # the limit spring is engaged
    kp = torch.tensor(20.0, dtype=F64, requires_grad=True)
    kd = torch.tensor(2.0, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (kp, kd, s0.q.clone().requires_grad_()))


# ---------------------------------------------------------------- floating base


def spinning_quadruped():
    robot = load("quadruped", floating_base=True)
    q0 = robot.neutral().clone()
    q0[7:] = torch.tensor([0.1, 0.8, -1.5] * 4, dtype=F64)
    v0 = torch.zeros(robot.nv, dtype=F64)
    v0[:3] = torch.tensor([0.3, 0.0, 1.0], dtype=F64)
    v0[3:6] = torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    v0[6:] = 0.5
    return robot, State(q0, v0)


@pytest.mark.slow
def test_floating_base_rk4_is_fourth_order_on_the_manifold():
    robot, s0 = spinning_quadruped()
    drifts = []
    for dt, n in ((0.01, 25), (0.005, 50)):
        sim = Simulator(robot, dt, integrator="rk4")
        traj = sim.rollout(s0, sim.zero_controls(n))
        E = energy(robot, traj)
        drifts.append(((E - E[0]).abs().max() / E[0].abs()).item())
        # The quaternion stays a unit quaternion: integrated on the manifold.
        assert (traj.q[:, 3:7].norm(dim=-1) - 1).abs().max().item() < 1e-12
        # Free flight: the centre of mass falls at g whatever the legs do.
        com = center_of_mass(robot, traj.q)
        acc = (com[2:] - 2 * com[1:-1] + com[:-2]) / dt**2
        torch.testing.assert_close(acc, robot.gravity.expand_as(acc), rtol=0, atol=1e-5)
    assert drifts[0] < 1e-6
    assert drifts[0] / drifts[1] > 12.0  # 2^4 = 16 for a fourth-order method


def test_floating_base_free_fall_semi_implicit_is_exact():
    robot, s0 = spinning_quadruped()
    at_rest = State(robot.neutral(), torch.zeros(robot.nv, dtype=F64))
    sim = Simulator(robot, 0.01)
    n = 20
    traj = sim.rollout(at_rest, sim.zero_controls(n))
    # v_k = g k dt, p_n = g dt^2 n (n + 1) / 2; no rotation, legs do not move.
    z = traj.q[-1, 2].item()
    assert z == pytest.approx(-G * 0.01**2 * n * (n + 1) / 2, rel=1e-12)
    torch.testing.assert_close(traj.q[-1, 3:], at_rest.q[3:], rtol=0, atol=1e-12)


def test_gradcheck_floating_base_rollout():
    robot, s0 = spinning_quadruped()
    sim = Simulator(robot, 0.01, integrator="rk4")
    u = torch.randn(3, robot.num_joints, dtype=F64, generator=torch.Generator().manual_seed(4))

    def f(v0, u):
        return sim.rollout(State(s0.q, v0), u).final.to_vector()

    assert torch.autograd.gradcheck(f, (s0.v.clone().requires_grad_(), u.requires_grad_()), fast_mode=True)

"""Contact on whole robots: a floating-base quadruped stands on the ground under PD."""

from __future__ import annotations

import pytest
import torch

from backdrive.contact import ContactGeometry, ContactModel, integrate_world
from backdrive.data import load
from backdrive.kinematics import forward_kinematics

G = 9.81


def stand(robot, feet, qj, *, dt=2e-3, seconds=1.5, kp=200.0, kd=6.0, radius=None):
    """PD-hold ``qj`` from a drop of 1 cm; returns the final state and contact result."""
    q = robot.neutral()
    q[7:] = qj
    T = forward_kinematics(robot, q)
    q[2] = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + (radius or 0.02) + 0.01
    geom = ContactGeometry.from_model(robot, links=feet) if radius is None else ContactGeometry.spheres(
        robot, {f: radius for f in feet}
    )
    cm = ContactModel(robot, geom)
    v = torch.zeros(robot.nv, dtype=robot.dtype)
    zeros6 = torch.zeros(6, dtype=robot.dtype)
    damping = torch.cat([zeros6, torch.full((robot.num_joints,), kd, dtype=robot.dtype)])
    heights = []
    for _ in range(int(seconds / dt)):
        tau = torch.cat([zeros6, kp * (qj - q[7:]) - kd * v[6:]])
        a, res = cm.acceleration(robot, q, v, tau, dt=dt, extra_damping=damping)
        q, v = integrate_world(robot, q, v, a, dt)
        heights.append(float(q[2]))
    return q, v, res, heights


@pytest.mark.slow
def test_shipped_quadruped_stands_and_ground_reaction_equals_weight():
    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    qj = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=robot.dtype)
    q, v, res, heights = stand(robot, feet, qj)
    weight = float(robot.total_mass) * G
    assert abs(float(res.total_force[2]) / weight - 1.0) < 0.01
    assert float(res.total_force[:2].norm()) < 0.01 * weight
    # settled: the base moved less than 1 mm over the last 0.5 s, and is upright
    assert max(heights[-250:]) - min(heights[-250:]) < 1e-3
    assert float(v.abs().max()) < 0.01
    assert float(q[3]) > 0.999
    # every foot carries load
    assert bool((res.normal_force > 0.1 * weight / 4).all())


@pytest.mark.slow
def test_go1_from_example_robot_data_stands_on_its_foot_spheres():
    import pytest

    try:
        robot = load("example-robot-data:go1", floating_base=True)
    except Exception as exc:  # noqa: BLE001 - the data package is optional
        pytest.skip(f"example-robot-data Go1 not available: {exc}")
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    assert len(feet) == 4
    qj = torch.tensor([0.0, 0.8, -1.5] * 4, dtype=robot.dtype)
    q, v, res, heights = stand(robot, feet, qj)
    weight = float(robot.total_mass) * G
    assert abs(float(res.total_force[2]) / weight - 1.0) < 0.01
    assert max(heights[-250:]) - min(heights[-250:]) < 1e-3
    assert float(q[3]) > 0.999
    assert bool((res.normal_force > 0.1 * weight / 4).all())


def test_quadruped_rollout_gradient_matches_central_differences():
    """32 steps of 2 ms: the quadruped lands on its feet (touch-down, friction
    active) under PD; the gradient of a loss on the final base pose with
    respect to the PD targets matches central differences along two directions."""
    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    qj0 = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=robot.dtype)
    q0 = robot.neutral()
    q0[7:] = qj0
    T = forward_kinematics(robot, q0)
    q0[2] = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + 0.02 + 0.002
    v0 = torch.zeros(robot.nv, dtype=robot.dtype)
    v0[0] = 0.2  # drifting forward: the feet slide on landing
    zeros6 = torch.zeros(6, dtype=robot.dtype)
    kp, kd, dt = 200.0, 6.0, 2e-3
    damping = torch.cat([zeros6, torch.full((12,), kd, dtype=robot.dtype)])

    def loss(target):
        q, v = q0, v0
        normal = []
        for _ in range(32):
            tau = torch.cat([zeros6, kp * (target - q[7:]) - kd * v[6:]])
            a, res = cm.acceleration(robot, q, v, tau, dt=dt, extra_damping=damping)
            q, v = integrate_world(robot, q, v, a, dt)
            normal.append(res.normal_force.detach())
        return q[0] + 2.0 * q[2] + q[4] + 0.1 * v[:6].sum(), torch.stack(normal)

    target = qj0.clone().requires_grad_()
    L, normal = loss(target)
    (g,) = torch.autograd.grad(L, target)
    assert float(normal[-1].min()) > 1.0 and float(normal[0].max()) < 1e-3  # it landed
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        d = torch.randn(12, generator=gen, dtype=robot.dtype)
        h = 1e-7
        with torch.no_grad():
            fd = (loss(qj0 + h * d)[0] - loss(qj0 - h * d)[0]) / (2 * h)
        assert float(g @ d) == pytest.approx(float(fd), rel=1e-6, abs=1e-9)


@pytest.mark.slow
def test_simulator_with_contact_keeps_per_step_contact_in_the_trajectory():
    from backdrive._errors import InputError
    from backdrive.sim import PDActuator, Simulator

    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    sim = Simulator(robot, 2e-3, actuator=PDActuator(kp=200.0, kd=6.0), contact=cm)
    qj = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=robot.dtype)
    q0 = robot.neutral()
    q0[7:] = qj
    T = forward_kinematics(robot, q0)
    q0[2] = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + 0.02 + 0.005
    steps = 500
    traj = sim.rollout(sim.initial_state(q0), qj.expand(steps, 12))
    c = traj.contact
    assert c.normal_force.shape == (steps, 4) and c.force.shape == (steps, 4, 3)
    assert c.f_ext.shape == (steps, robot.num_bodies, 6) and c.slip_velocity.shape == (steps, 4, 3)
    weight = float(robot.total_mass) * G
    assert float(c.normal_force[0].max()) < 1e-3  # starts in the air
    assert abs(float(c.force[-1, :, 2].sum()) / weight - 1.0) < 0.01
    # the same step as the contact package's own loop (PD kd implicit)
    zeros6 = torch.zeros(6, dtype=robot.dtype)
    q, v = q0, torch.zeros(robot.nv, dtype=robot.dtype)
    damping = torch.cat([zeros6, torch.full((12,), 6.0, dtype=robot.dtype)])
    for _ in range(3):
        tau = torch.cat([zeros6, 200.0 * (qj - q[7:]) - 6.0 * v[6:]])
        a, _ = cm.acceleration(robot, q, v, tau, dt=2e-3, extra_damping=damping)
        q, v = integrate_world(robot, q, v, a, 2e-3)
    assert torch.allclose(q, traj.q[3], atol=1e-12) and torch.allclose(v, traj.v[3], atol=1e-12)
    with pytest.raises(InputError, match="semi_implicit"):
        Simulator(robot, 2e-3, integrator="rk4", contact=cm)
    with pytest.raises(InputError, match="built for robot"):
        Simulator(load("pendulum"), 2e-3, contact=cm)


@pytest.mark.slow
def test_unactuated_quadruped_tumbling_onto_the_ground_never_gains_energy():
    """Passivity: dropped from 0.25 m, tilted and spinning, with every body's
    shape in contact (boxes, cylinders, feet) and no actuation, the mechanical
    energy never rises above its initial value (the contact springs only
    store what the fall gave them) and ends well below it."""
    from backdrive.dynamics import kinetic_energy, potential_energy
    from backdrive.spatial import rotvec_to_quat

    robot = load("quadruped", floating_base=True)
    cm = ContactModel(robot, ContactGeometry.from_model(robot))
    gen = torch.Generator().manual_seed(4)
    B = 8
    q = robot.neutral().expand(B, -1).clone()
    q[:, 2] = 0.65
    q[:, 3:7] = rotvec_to_quat(0.8 * torch.randn(B, 3, generator=gen, dtype=robot.dtype))
    q[:, 7:] = 0.5 * torch.randn(B, 12, generator=gen, dtype=robot.dtype)
    v = torch.randn(B, robot.nv, generator=gen, dtype=robot.dtype)
    energy = [kinetic_energy(robot, q, v) + potential_energy(robot, q)]
    tau = torch.zeros_like(v)
    touched = torch.zeros(B, dtype=torch.bool)
    for _ in range(250):
        a, res = cm.acceleration(robot, q, v, tau, dt=2e-3)
        q, v = integrate_world(robot, q, v, a, 2e-3)
        energy.append(kinetic_energy(robot, q, v) + potential_energy(robot, q))
        touched |= (res.normal_force > 1.0).any(-1)
    E = torch.stack(energy)  # (T + 1, B)
    assert bool(touched.all()) and bool(torch.isfinite(E).all())
    assert float((E - E[0]).max()) < 1e-6 * float(E[0].abs().max())
    assert bool((E[-1] < E[0] - 1.0).all())


def test_divergence_report_names_the_contact():
    from backdrive.sim import Simulator

    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet + ["trunk"]))
    # from_model keeps the URDF's order: the trunk's 8 corners, then the feet
    assert cm.num_rows == 12 and cm.row_label(0) == "trunk (box) on the ground"
    assert cm.row_label(8) == "FL_foot (sphere) on the ground"
    sim = Simulator(robot, 2e-3, contact=cm)
    q = robot.neutral()
    q[2] = 0.395  # every foot 2.5 cm deep
    text = sim._diagnose(q[None], torch.zeros(1, robot.nv, dtype=robot.dtype), torch.zeros(1, 12, dtype=robot.dtype))
    assert "largest contact force" in text and "_foot (sphere) on the ground" in text


@pytest.mark.slow
def test_quadruped_stands_on_rough_heightfield():
    """Random bumps of +-1 cm every 5 cm and a 2 cm step under the rear feet."""
    from backdrive.contact import Heightfield

    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    gen = torch.Generator().manual_seed(2)
    H = 0.01 * (2 * torch.rand(41, 41, generator=gen, dtype=robot.dtype) - 1)
    H[:18] += 0.02  # x < -0.1 m: the rear feet stand 2 cm higher
    hf = Heightfield(H, spacing=0.025)
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet), hf)
    qj = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=robot.dtype)
    q = robot.neutral()
    q[7:] = qj
    q[2] = 0.36
    v = torch.zeros(robot.nv, dtype=robot.dtype)
    zeros6 = torch.zeros(6, dtype=robot.dtype)
    damping = torch.cat([zeros6, torch.full((12,), 6.0, dtype=robot.dtype)])
    lift = []
    for _ in range(800):
        tau = torch.cat([zeros6, 200.0 * (qj - q[7:]) - 6.0 * v[6:]])
        a, res = cm.acceleration(robot, q, v, tau, dt=2e-3, extra_damping=damping)
        q, v = integrate_world(robot, q, v, a, 2e-3)
        lift.append(float(res.total_force[2]))
    weight = float(robot.total_mass) * G
    # A foot on a cell edge sees the slope jump from one cell to the next, so
    # the force jitters by a few percent step to step (docs/contact.md); its
    # average over the last 0.2 s carries the weight.
    last = torch.tensor(lift[-100:])
    assert abs(float(last.mean()) / weight - 1.0) < 0.01
    assert float((last / weight - 1.0).abs().max()) < 0.2
    assert bool((res.normal_force > 0.05 * weight).all())
    assert float(v.abs().max()) < 0.5
    # rear feet higher: the base pitches nose down (positive pitch about y)
    from backdrive.spatial import quat_to_matrix

    R = quat_to_matrix(q[3:7])
    assert float(R[2, 0]) < -0.01  # the body x axis points downwards

"""Contact: closed-form validation (drop, bounce, slide, incline, roll), bad input."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from backdrive import InvalidValueError, RobotModel, UnknownNameError
from backdrive._errors import InputError
from backdrive.contact import (
    ContactApproximationWarning,
    ContactGeometry,
    ContactModel,
    ContactParameters,
    ContactShape,
    GroundPlane,
    Heightfield,
    contact_step,
    restitution,
)
from backdrive.dynamics import integrate, inverse_dynamics

G = 9.81
DT = 1e-3


def body_urdf(shape: str, mass: float, inertia: tuple[float, float, float], name: str = "body") -> str:
    """A single link with a collision ``shape`` (URDF geometry XML)."""
    ixx, iyy, izz = inertia
    return f"""<?xml version="1.0"?>
<robot name="{name}">
  <link name="{name}">
    <inertial><mass value="{mass}"/><origin xyz="0 0 0"/>
      <inertia ixx="{ixx}" iyy="{iyy}" izz="{izz}" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="0 0 0" rpy="0 0 0"/><geometry>{shape}</geometry></collision>
  </link>
</robot>"""


def sphere_robot(r=0.1, m=1.0, dtype=torch.float64):
    i = 0.4 * m * r * r
    return RobotModel.from_urdf(body_urdf(f'<sphere radius="{r}"/>', m, (i, i, i), "ball"), floating_base=True, dtype=dtype)


def box_robot(s=0.2, m=1.0, dtype=torch.float64):
    i = m * s * s / 6.0
    return RobotModel.from_urdf(body_urdf(f'<box size="{s} {s} {s}"/>', m, (i, i, i), "box"), floating_base=True, dtype=dtype)


def state(robot, pos, quat=(1.0, 0.0, 0.0, 0.0), lin=(0.0, 0.0, 0.0), ang=(0.0, 0.0, 0.0), batch=()):
    q = torch.tensor([*pos, *quat], dtype=robot.dtype).expand(*batch, 7).clone()
    v = torch.tensor([*lin, *ang], dtype=robot.dtype).expand(*batch, 6).clone()
    return q, v


def simulate(robot, cm, q, v, steps, dt=DT, scheme="implicit", record=None):
    """``steps`` of :func:`contact_step`; ``record(q, v, res)`` after each."""
    tau = torch.zeros_like(v)
    for _ in range(steps):
        q, v, res = contact_step(robot, cm, q, v, tau, dt, scheme=scheme)
        if record is not None:
            record(q, v, res)
    return q, v


def world_velocity(q, v):
    """Linear velocity of the base in the world frame (``v`` is base-frame)."""
    from backdrive.spatial import quat_apply

    return quat_apply(q[..., 3:7], v[..., :3])


# ----------------------------------------------------------------- normal direction


def test_ball_rest_penetration_is_mg_over_k():
    robot = sphere_robot()
    k = 1e4
    params = ContactParameters(stiffness=k, damping=2 * math.sqrt(k * 1.0), normal_width=1e-6)
    cm = ContactModel(robot, terrain=GroundPlane(), params=params)
    q, v = state(robot, (0.0, 0.0, 0.15))
    q, v = simulate(robot, cm, q, v, 1500)
    res = cm.forces(robot, q, v)
    pen = float(res.penetration[0])
    assert pen == pytest.approx(1.0 * G / k, rel=2e-3)
    assert float(res.normal_force[0]) == pytest.approx(1.0 * G, rel=1e-4)
    assert float(v.abs().max()) < 1e-6


def test_linear_spring_damper_restitution_and_contact_time():
    robot = sphere_robot().replace(gravity=torch.zeros(3, dtype=torch.float64))
    k, m, zeta = 1e4, 1.0, 0.2
    d = 2 * zeta * math.sqrt(k * m)
    params = ContactParameters(stiffness=k, damping=d, normal_width=1e-7, clamp_normal=False)
    cm = ContactModel(robot, params=params)
    dt = 2e-5
    q, v = state(robot, (0.0, 0.0, 0.1 + 1e-4), lin=(0.0, 0.0, -1.0))
    inside = []
    q, v = simulate(robot, cm, q, v, 2000, dt=dt, scheme="explicit", record=lambda q, v, r: inside.append(float(r.penetration[0]) > 0))
    e = float(v[2])
    assert e == pytest.approx(restitution(zeta), rel=5e-3)
    wd = math.sqrt(k / m) * math.sqrt(1 - zeta * zeta)
    assert sum(inside) * dt == pytest.approx(math.pi / wd, rel=5e-3)


# ----------------------------------------------------------------- friction


def _box_on_ground(robot, k, batch=()):
    s = 0.2
    return state(robot, (0.0, 0.0, s / 2 - G / (4 * k)), lin=(3.0, 0.0, 0.0), batch=batch)


def _slide(mu, width, steps, batch=()):
    robot = box_robot()
    k = 4e4
    params = ContactParameters(stiffness=k, damping=400.0, friction=mu, stiction_width=width, normal_width=1e-6)
    cm = ContactModel(robot, params=params)
    q, v = _box_on_ground(robot, k, batch)
    speeds = []
    q, v = simulate(robot, cm, q, v, steps, record=lambda q, v, r: speeds.append(world_velocity(q, v)[..., 0]))
    return q, torch.stack(speeds, -1)


def excess_distance(v0: float, mu: float, w: float) -> float:
    """Extra stopping distance of friction ``mu g v / sqrt(v^2 + w^2)`` over Coulomb's:
    ``(1 / mu g) int_0^v0 (sqrt(v^2 + w^2) - v) dv``."""
    s = math.sqrt(v0 * v0 + w * w)
    return (0.5 * v0 * s + 0.5 * w * w * math.asinh(v0 / w) - 0.5 * v0 * v0) / (mu * G)


def test_box_sliding_speed_and_stopping_distance_shrinks_with_width():
    mu, v0 = 0.5, 3.0
    exact = v0 * v0 / (2 * mu * G)
    assert exact == pytest.approx(0.917, abs=1e-3)
    # semi-implicit Euler moves with the updated speed: x_N = exact - v0 dt / 2
    discrete = exact - 0.5 * v0 * DT
    widths = torch.tensor([[0.1], [0.03], [0.01], [0.001]], dtype=torch.float64)
    q, speeds = _slide(mu, widths, 900, batch=(4,))
    t = 0.3
    assert float(speeds[3, int(round(t / DT)) - 1]) == pytest.approx(v0 - mu * G * t, rel=2e-3)
    errors = (q[:, 0] - discrete).tolist()
    assert errors[0] > errors[1] > errors[2] > errors[3]  # the bias shrinks with the width
    assert abs(errors[2]) < 1e-3 and abs(errors[3]) < 1e-3
    # the excess over the narrowest width follows the closed form of the smoothing
    for i in (0, 1):
        w = float(widths[i])
        expected = excess_distance(v0, mu, w) - excess_distance(v0, mu, 0.001)
        assert errors[i] - errors[3] == pytest.approx(expected, rel=0.05)


def test_box_sliding_friction_sweep():
    mus = torch.tensor([[0.3], [0.8], [0.1]], dtype=torch.float64)
    q, speeds = _slide(mus, 0.001, 1200, batch=(3,))
    for i, mu in enumerate((0.3, 0.8)):
        assert float(q[i, 0]) == pytest.approx(9.0 / (2 * mu * G) - 1.5 * DT, abs=1e-3)
    # mu 0.1 is still sliding at 1.2 s: speed v0 - mu g t
    assert float(speeds[2, -1]) == pytest.approx(3.0 - 0.1 * G * 1.2, rel=2e-3)


def _box_on_incline(angle_deg, mu, width, steps):
    robot = box_robot()
    a = math.radians(angle_deg)
    k = 4e4
    cm = ContactModel(
        robot,
        terrain=GroundPlane.incline(a),
        params=ContactParameters(stiffness=k, damping=400.0, friction=mu, stiction_width=width),
    )
    depth = 0.1 - G * math.cos(a) / (4 * k)
    n = (math.sin(a), 0.0, math.cos(a))
    q, v = state(robot, tuple(depth * c for c in n), quat=(math.cos(a / 2), 0.0, math.sin(a / 2), 0.0))
    xs = []
    q, v = simulate(robot, cm, q, v, steps, record=lambda q, v, r: xs.append(q[:3].clone()))
    return torch.stack(xs), (math.cos(a), 0.0, -math.sin(a))


def test_incline_25_degrees_sticks():
    xs, down = _box_on_incline(25.0, 0.7, 1e-4, 1000)
    drift = float((xs[-1] - xs[0]).norm())
    assert drift < 1e-3


def test_incline_35_degrees_slides_with_closed_form_acceleration():
    xs, down = _box_on_incline(35.0, 0.3, 1e-3, 800)
    d = xs @ torch.tensor(down, dtype=torch.float64)
    a = math.radians(35.0)
    expected = G * (math.sin(a) - 0.3 * math.cos(a))
    # second difference of the along-slope position over [0.2, 0.8] s
    t0, t1 = 200, 799
    vel0 = (d[t0 + 1] - d[t0 - 1]) / (2 * DT)
    vel1 = (d[t1] - d[t1 - 2]) / (2 * DT)
    accel = float(vel1 - vel0) / ((t1 - 1 - t0) * DT)
    assert accel == pytest.approx(expected, rel=0.02)


def test_sphere_slide_to_roll_final_speed():
    robot = sphere_robot()
    k = 1e4
    cm = ContactModel(robot, params=ContactParameters(stiffness=k, damping=200.0, friction=0.3, stiction_width=1e-3))
    q, v = state(robot, (0.0, 0.0, 0.1 - G / k), lin=(2.0, 0.0, 0.0))
    q, v = simulate(robot, cm, q, v, 500)
    speed = float(v[:3].norm())
    assert speed == pytest.approx(5.0 / 7.0 * 2.0, rel=5e-3)
    # rolling without slip: omega r = speed
    assert float(v[3:].norm()) * 0.1 == pytest.approx(speed, rel=5e-3)

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

from _robots import body_urdf, box_robot, sphere_robot, state  # noqa: F401  (shared fixtures)

G = 9.81
DT = 1e-3


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
    q, v = state(robot, (0.0, 0.0, 0.105))
    q, v = simulate(robot, cm, q, v, 400)
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
    dt = 5e-5
    q, v = state(robot, (0.0, 0.0, 0.1 + 2e-5), lin=(0.0, 0.0, -1.0))
    inside = []
    q, v = simulate(robot, cm, q, v, 700, dt=dt, scheme="explicit", record=lambda q, v, r: inside.append(float(r.penetration[0]) > 0))
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_incline_25_degrees_sticks():
    xs, down = _box_on_incline(25.0, 0.7, 1e-4, 1000)
    drift = float((xs[-1] - xs[0]).norm())
    assert drift < 1e-3


@pytest.mark.slow
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


# ----------------------------------------------------------------- geometry and terrain


def test_geometry_from_quadruped_urdf_and_feet_positions():
    from backdrive.data import load
    from backdrive.kinematics import forward_kinematics

    robot = load("quadruped", floating_base=True)
    g = ContactGeometry.from_model(robot)
    kinds = sorted({s.kind for s in g.shapes})
    assert kinds == ["box", "cylinder", "sphere"]
    assert g.num_points == sum({"box": 8, "cylinder": 16, "sphere": 1}[s.kind] for s in g.shapes)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    gf = ContactGeometry.spheres(robot, {f: 0.02 for f in feet})
    cm = ContactModel(robot, gf)
    q = robot.random_q(generator=torch.Generator().manual_seed(1))
    res = cm.forces(robot, q, torch.zeros(robot.nv, dtype=robot.dtype))
    T = forward_kinematics(robot, q)
    centres = torch.stack([T[robot.frame_index(f), :3, 3] for f in feet])
    assert torch.allclose(res.point, centres - 0.02 * res.normal, atol=1e-12)
    assert torch.allclose(res.penetration, 0.02 - centres[:, 2], atol=1e-12)
    caps = ContactGeometry.from_model(robot, links=["FL_calf"], cylinders="capsule")
    assert [s.kind for s in caps.shapes] == ["capsule"] and caps.num_points == 2
    both = gf + caps
    assert both.num_shapes == 5 and both.without(robot, "FL_calf").num_shapes == 4


def test_point_jacobian_and_wrenches_match_dynamics():
    from backdrive.data import load

    robot = load("quadruped", floating_base=True)
    g = ContactGeometry.from_model(robot, links=["trunk", "FL_thigh", "RR_calf"])  # radius-0 points
    cm = ContactModel(robot, g)
    gen = torch.Generator().manual_seed(3)
    q = robot.random_q(generator=gen)
    v = torch.randn(robot.nv, generator=gen, dtype=robot.dtype)
    res = cm.forces(robot, q, v)
    eps = 1e-6
    c1 = cm.forces(robot, integrate(robot, q, v, eps), v).point
    c0 = cm.forces(robot, integrate(robot, q, v, -eps), v).point
    assert torch.allclose((c1 - c0) / (2 * eps), res.jacobian @ v, atol=1e-7)
    # the body wrenches are the point forces: J^T f == inverse-dynamics difference
    a = torch.zeros(robot.nv, dtype=robot.dtype)
    via_fext = inverse_dynamics(robot, q, v, a) - inverse_dynamics(robot, q, v, a, f_ext=res.f_ext)
    assert torch.allclose(via_fext, res.generalized_force(), atol=1e-9)


@pytest.mark.parametrize("floating", [False, True])
def test_point_jacobians_match_finite_differences_with_prismatic_and_mimic_joints(floating):
    # The one Jacobian kernel behind ContactModel's points and frame_jacobian,
    # on a tree with a tilted axis, a prismatic joint, a branch and a mimic joint.
    from _robots import SMALL_URDF

    from backdrive.kinematics import body_transforms, frame_jacobian
    from backdrive.kinematics._fk import point_jacobians, point_support

    robot = RobotModel.from_urdf(SMALL_URDF, floating_base=floating)
    gen = torch.Generator().manual_seed(5)
    body = torch.arange(robot.num_bodies).repeat(2)  # two points on every body
    local = torch.randn(body.shape[0], 3, generator=gen, dtype=robot.dtype) * 0.1
    q = robot.random_q(3, generator=gen)
    v = torch.randn(3, robot.nv, generator=gen, dtype=robot.dtype)

    def points(q):
        Rb, pb = body_transforms(robot, q)
        return (Rb[..., body, :, :] @ local[:, :, None])[..., 0] + pb[..., body, :]

    Rb, pb = body_transforms(robot, q)
    J = point_jacobians(robot, Rb, pb, points(q), point_support(robot, body), angular=True)  # (3, np, 6, nv)
    eps = 1e-6
    fd = (points(integrate(robot, q, v, eps)) - points(integrate(robot, q, v, -eps))) / (2 * eps)
    torch.testing.assert_close(J[..., :3, :] @ v[:, None, :, None], fd[..., None], atol=1e-8, rtol=0)
    # The linear rows alone are the first three rows; a frame's Jacobian is its origin's.
    lin = point_jacobians(robot, Rb, pb, points(q), point_support(robot, body))
    assert torch.equal(lin, J[..., :3, :])
    for f in range(robot.num_frames):
        b = int(robot.frame_body[f])
        Tf = robot.frame_placement[f]
        origin = (Rb[..., b, :, :] @ Tf[:3, 3:4])[..., 0] + pb[..., b, :]
        Jf = point_jacobians(robot, Rb, pb, origin[..., None, :], point_support(robot, robot.frame_body[f : f + 1]), angular=True)
        torch.testing.assert_close(frame_jacobian(robot, q, f), Jf[..., 0, :, :], atol=1e-15, rtol=0)
    # The contact points' Jacobians are this kernel's (mimic joints included).
    cm = ContactModel(robot, ContactGeometry.spheres(robot, {robot.link_names[-1]: 0.05}))
    res = cm.forces(robot, q, v)
    Jc = point_jacobians(robot, Rb, pb, res.point, point_support(robot, cm.geometry.point_body))
    assert torch.equal(res.jacobian, Jc)


def test_place_on_terrain_touches_at_the_lowest_shape():
    from backdrive.data import load

    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    q = robot.random_q(4, generator=torch.Generator().manual_seed(2))
    zero = torch.zeros(robot.nv, dtype=robot.dtype)
    slope = torch.tensor([[0.0, 0.0, 0.0], [0.1, 0.3, 0.5]], dtype=robot.dtype).repeat_interleave(2, 0)
    for terrain in (None, GroundPlane(height=0.3, normal=(0.2, 0.0, 1.0)), Heightfield(slope, spacing=1.0, origin=(-1.0, -1.0))):
        cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet), terrain=terrain)
        for clearance in (0.0, 0.01, -0.002):
            placed = cm.place_on_terrain(robot, q, clearance=clearance)
            assert torch.equal(placed[:, :2], q[:, :2]) and torch.equal(placed[:, 3:], q[:, 3:])
            pen = cm.forces(robot, placed, zero).penetration  # (4, np)
            torch.testing.assert_close(pen.amax(-1), torch.full((4,), -clearance, dtype=robot.dtype), atol=1e-12, rtol=0)
    q0 = q[0].clone().requires_grad_()
    cm.place_on_terrain(robot, q0)[2].backward()
    assert q0.grad is not None and bool(torch.isfinite(q0.grad).all())
    with pytest.raises(InputError, match="clearance"):
        cm.place_on_terrain(robot, q, clearance=float("nan"))
    fixed = load("quadruped")
    with pytest.raises(InputError, match="fixed base"):
        ContactModel(fixed, ContactGeometry.from_model(fixed, links=feet)).place_on_terrain(fixed, fixed.neutral())


def test_heightfield_matches_plane_on_a_slope_and_steps():
    slope = 0.3
    xs = torch.linspace(-1.0, 1.0, 21, dtype=torch.float64)
    H = (slope * xs)[:, None].expand(21, 11).clone()
    hf = Heightfield(H, spacing=(0.1, 0.2))
    n = torch.tensor([-slope, 0.0, 1.0], dtype=torch.float64)
    plane = GroundPlane(0.0, n)
    pts = torch.tensor([[0.13, 0.4, 0.2], [-0.57, -0.33, -0.1], [0.91, 0.0, 0.5]], dtype=torch.float64)
    d_h, n_h = hf.query(pts)
    d_p, n_p = plane.query(pts)
    assert torch.allclose(d_h, d_p, atol=1e-12) and torch.allclose(n_h, n_p, atol=1e-12)
    # a 5 cm step between two cells: height ramps across exactly one cell
    S = torch.zeros(4, 4, dtype=torch.float64)
    S[2:] = 0.05
    step = Heightfield(S, spacing=0.1, origin=(0.0, 0.0))
    h, hx, hy = step.height(torch.tensor([[0.05, 0.1], [0.15, 0.1], [0.25, 0.1]], dtype=torch.float64))
    assert torch.allclose(h, torch.tensor([0.0, 0.025, 0.05], dtype=torch.float64), atol=1e-12)
    assert float(hx[1]) == pytest.approx(0.5)


def test_ball_rests_on_heightfield_at_mg_over_k():
    robot = sphere_robot()
    H = torch.zeros(3, 3, dtype=torch.float64)
    hf = Heightfield(H, spacing=1.0)
    cm = ContactModel(robot, terrain=hf, params=ContactParameters(stiffness=1e4, damping=200.0, normal_width=1e-6))
    q, v = state(robot, (0.2, -0.3, 0.102))
    q, v = simulate(robot, cm, q, v, 300)
    assert float(cm.forces(robot, q, v).penetration[0]) == pytest.approx(G / 1e4, rel=5e-3)


# ----------------------------------------------------------------- bad input


def test_bad_parameters_name_the_parameter_and_link():
    robot = box_robot()
    with pytest.raises(InvalidValueError, match="stiffness"):
        ContactModel(robot, params=ContactParameters(stiffness=-1.0))
    with pytest.raises(InvalidValueError, match="friction.*'box'"):
        ContactModel(robot, params=ContactParameters(friction=torch.tensor([float("nan")], dtype=torch.float64)))
    with pytest.raises(InvalidValueError, match="stiction_width"):
        ContactModel(robot, params=ContactParameters(stiction_width=0.0))
    with pytest.raises(InputError, match="damping"):
        ContactModel(robot, params=ContactParameters(damping=torch.ones(3, dtype=torch.float64)))
    with pytest.raises(InvalidValueError, match="friction"):
        GroundPlane(friction=float("nan"))


def test_bad_heightfield_and_names():
    with pytest.raises(InvalidValueError, match=r"heights\[1, 2\]"):
        H = torch.zeros(3, 4, dtype=torch.float64)
        H[1, 2] = float("nan")
        Heightfield(H)
    with pytest.raises(InputError, match="shape"):
        Heightfield(torch.zeros(5, dtype=torch.float64))
    robot = box_robot()
    with pytest.raises(UnknownNameError, match="boxx"):
        ContactGeometry.spheres(robot, {"boxx": 0.1})
    with pytest.raises(UnknownNameError):
        ContactGeometry.from_model(robot, links=["nope"])
    with pytest.raises(InvalidValueError, match="kind"):
        ContactGeometry.from_shapes(robot, [ContactShape("box", "cone", (0.1,))])
    with pytest.raises(InputError, match="built for robot"):
        ContactModel(sphere_robot(), ContactGeometry.from_model(robot))


def test_mesh_collisions_are_approximated_or_skipped_with_a_warning(tmp_path):
    stl = tmp_path / "part.stl"
    trimesh = pytest.importorskip("trimesh")
    trimesh.creation.box(extents=(0.2, 0.4, 0.6)).export(stl)
    urdf = body_urdf(f'<mesh filename="{stl}" scale="1 1 0.5"/>', 1.0, (0.1, 0.1, 0.1), "shell")
    robot = RobotModel.from_urdf(urdf, floating_base=True)
    with pytest.warns(ContactApproximationWarning, match="'shell'.*bounding box"):
        g = ContactGeometry.from_model(robot)
    assert g.shapes[0].kind == "box"
    assert g.shapes[0].size == pytest.approx((0.2, 0.4, 0.3))
    missing = RobotModel.from_urdf(body_urdf('<mesh filename="nowhere.stl"/>', 1.0, (0.1, 0.1, 0.1), "ghost"))
    with pytest.warns(ContactApproximationWarning, match="'ghost'.*could not be loaded"):
        assert ContactGeometry.from_model(missing).num_shapes == 0
    with pytest.raises(InvalidValueError, match="'ghost'"):
        ContactGeometry.from_model(missing, meshes="error")


def test_public_names_resolve():
    import backdrive.contact as contact

    for name in contact.__all__:
        assert getattr(contact, name, None) is not None, name


def test_float32_step_matches_float64():
    from backdrive.data import load

    out = {}
    for dtype in (torch.float64, torch.float32):
        robot = load("quadruped", floating_base=True, dtype=dtype)
        feet = [n for n in robot.link_names if n.endswith("_foot")]
        cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
        q = robot.neutral()
        q[7:] = torch.tensor([0.0, 0.7, -1.4] * 4, dtype=dtype)
        q[2] = 0.3222
        v = torch.zeros(robot.nv, dtype=dtype)
        v[0], v[2] = 0.1, -0.05
        a, res = cm.acceleration(robot, q, v, torch.zeros_like(v), dt=2e-3)
        out[dtype] = (a.double(), res.normal_force.double())
    (a64, f64), (a32, f32) = out[torch.float64], out[torch.float32]
    assert float(f64.min()) > 1.0
    assert torch.allclose(f32, f64, rtol=1e-3, atol=1e-2)
    assert float((a32 - a64).norm() / a64.norm()) < 1e-3

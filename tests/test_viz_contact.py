"""Contact in the previews and plots: arrows and points from a ContactResult,
terrain meshes, the ground-reaction plot, bad input, and (headless Chromium)
the arrows on screen."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import backdrive.viz as viz
from backdrive._errors import InputError
from backdrive.contact import ContactGeometry, ContactModel, GroundPlane, Heightfield
from backdrive.data import load
from backdrive.kinematics import forward_kinematics
from backdrive.viz._contact import (
    ContactArrays,
    ContactLayer,
    auto_force_scale,
    contact_arrays,
    force_arrows,
    frame_steps,
    group_series,
    heightfield_mesh,
)
from backdrive.viz._plots import contact_groups

STANCE = (0.0, 0.7, -1.4)


@pytest.fixture(scope="module")
def quadruped():
    robot = load("quadruped", floating_base=True)
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    cm = ContactModel(robot, ContactGeometry.from_model(robot, links=feet))
    q = robot.neutral()
    q[7:] = torch.tensor(STANCE * 4, dtype=robot.dtype)
    T = forward_kinematics(robot, q)
    touch = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + 0.02  # feet just touching
    return robot, feet, cm, q, touch


@pytest.fixture(scope="module")
def three_steps(quadruped):
    """A ContactResult with a time axis of 3: in the air, 1 mm and 2 mm deep, sliding along x."""
    robot, feet, cm, q, touch = quadruped
    qs = q.repeat(3, 1)
    qs[:, 2] = touch + torch.tensor([0.05, -0.001, -0.002], dtype=robot.dtype)
    qs[2, 3:7] = torch.tensor([math.cos(0.005), math.sin(0.005), 0.0, 0.0], dtype=robot.dtype)  # rolled: unequal loads
    v = torch.zeros(3, robot.nv, dtype=robot.dtype)
    v[:, 0] = 0.2
    return cm.forces(robot, qs, v)


def test_arrows_start_at_the_contact_points_and_scale_with_the_forces(three_steps):
    res = three_steps
    c = contact_arrays(res)
    assert c.steps == 3 and c.num_points == 4
    np.testing.assert_allclose(c.point, res.point.numpy())
    scale = 150.0
    min_force = 0.01 * float(res.normal_force.max())
    # In the air: nothing drawn.
    p, normal, friction = force_arrows(c, 0, scale, min_force)
    assert p.shape == (0, 3) and normal.shape == (0, 2, 3) and friction.shape == (0, 2, 3)
    for step in (1, 2):
        p, normal, friction = force_arrows(c, step, scale, min_force)
        point = res.point[step].numpy()
        fn = res.normal_force[step].numpy()
        assert p.shape == (4, 3) and bool((fn > 10.0).all())
        np.testing.assert_allclose(normal[:, 0], point)
        np.testing.assert_allclose(friction[:, 0], point)
        # Normal arrow: along the normal, f_n / scale metres long.
        np.testing.assert_allclose(normal[:, 1], point + fn[:, None] * res.normal[step].numpy() / scale)
        np.testing.assert_allclose(np.linalg.norm(normal[:, 1] - normal[:, 0], axis=-1), fn / scale)
        # Friction arrow: the friction force / scale, opposing the slip (+x).
        np.testing.assert_allclose(friction[:, 1], point + res.friction_force[step].numpy() / scale)
        assert bool((friction[:, 1, 0] < friction[:, 0, 0]).all())
    # The rolled step loads one side more: arrows of different lengths.
    lengths = np.linalg.norm(force_arrows(c, 2, scale, min_force)[1][:, 1] - c.point[2], axis=-1)
    assert lengths.max() > 1.2 * lengths.min()


class _Handle:
    def __init__(self, log, name, **props):
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "visible", props.pop("visible", True))
        object.__setattr__(self, "points", props.get("points"))

    def __setattr__(self, key, value):
        self._log.append((self._name, key, value))
        object.__setattr__(self, key, value)


class _Scene:
    """Records what a ContactLayer sends (no viser needed)."""

    def __init__(self):
        self.log, self.handles = [], {}

    def add_frame(self, name, **_):
        return _Handle(self.log, name)

    def _add(self, name, **props):
        h = self.handles[name] = _Handle(self.log, name, **props)
        return h

    def add_point_cloud(self, name, **props):
        return self._add(name, **props)

    def add_arrows(self, name, **props):
        return self._add(name, **props)


def test_contact_layer_sends_each_steps_points_and_arrows_and_hides_empty_ones(three_steps):
    c = contact_arrays(three_steps)
    scene = _Scene()
    size = 0.01
    layer = ContactLayer(scene, c, 100.0, 1.0, size)
    h = scene.handles
    assert not h["/contact/points"].visible and not h["/contact/normal"].visible
    layer.show(0)  # airborne: stays hidden
    assert not h["/contact/normal"].visible
    layer.show(2)
    p, normal, friction = force_arrows(c, 2, 100.0, 1.0)
    assert h["/contact/normal"].visible and h["/contact/points"].visible
    np.testing.assert_allclose(h["/contact/normal"].points, normal.astype(np.float32))
    np.testing.assert_allclose(h["/contact/points"].points, p.astype(np.float32))
    long = np.linalg.norm(friction[:, 1] - friction[:, 0], axis=-1) >= size
    assert long.any()
    np.testing.assert_allclose(h["/contact/friction"].points, friction[long].astype(np.float32))
    n = len(scene.log)
    layer.show(2)  # nothing changed: nothing sent
    assert len(scene.log) == n
    layer.show(0)
    assert not h["/contact/normal"].visible and not h["/contact/points"].visible


def test_frame_steps_pair_each_state_with_the_step_that_starts_there():
    np.testing.assert_array_equal(frame_steps(np.arange(5), 5, 4), [0, 1, 2, 3, 3])
    np.testing.assert_array_equal(frame_steps(np.arange(0, 5, 2), 5, 4), [0, 2, 3])
    np.testing.assert_array_equal(frame_steps(np.arange(5), 5, 5), np.arange(5))
    with pytest.raises(InputError, match="3 steps but the trajectory has 5 states"):
        frame_steps(np.arange(5), 5, 3)


def test_auto_force_scale_rounds_the_median_load_up_to_1_2_5():
    fn = np.array([[0.0, 30.0, 30.0, 900.0], [30.0, 30.0, 29.0, 31.0]])  # one spike, one foot in the air
    z = np.zeros((2, 4, 3))
    c = ContactArrays(point=z, normal=z, normal_force=fn, friction_force=z, slip_velocity=z)
    assert auto_force_scale(c, 0.16, 1.0) == 200.0  # median 30 N / 0.16 m = 187.5 -> 200 N/m
    assert auto_force_scale(c, 0.3, 1.0) == 100.0  # 100 N/m exactly
    assert auto_force_scale(c, 0.05, 1.0) == 1000.0  # 600 -> 1000


def test_heightfield_mesh_passes_through_every_sample_facing_up():
    H = torch.tensor([[0.0, 0.1, 0.0], [0.05, 0.2, 0.1], [0.0, 0.0, 0.3], [0.1, 0.0, 0.0]], dtype=torch.float64)
    hf = Heightfield(H, spacing=(0.2, 0.5), origin=(1.0, -1.0))
    vertices, faces = heightfield_mesh(hf)
    assert vertices.shape == (12, 3) and faces.shape == (2 * 3 * 2, 3)
    h, _, _ = hf.height(torch.as_tensor(vertices[:, :2]))
    np.testing.assert_allclose(vertices[:, 2], h.numpy(), atol=1e-12)
    np.testing.assert_allclose(vertices[0], [1.0, -1.0, 0.0])
    np.testing.assert_allclose(vertices[-1], [1.6, 0.0, 0.0])
    a, b, cc = (vertices[faces[:, k]] for k in range(3))
    assert bool((np.cross(b - a, cc - a)[:, 2] > 0).all())  # counter-clockwise from above
    assert set(np.unique(faces)) == set(range(12))


def test_group_series_sums_loads_per_link_and_hides_slip_in_the_air(quadruped, three_steps):
    robot, feet, cm, *_ = quadruped
    names, index = contact_groups(cm, 4)
    assert names == feet and list(index) == [0, 1, 2, 3]
    c = contact_arrays(three_steps)
    fn, slip = group_series(c, index, 4)
    np.testing.assert_allclose(fn, three_steps.normal_force.numpy())
    assert np.isnan(slip[0]).all()
    np.testing.assert_allclose(slip[1:], three_steps.slip_velocity[1:].norm(dim=-1).numpy())
    # Two feet in one group: summed, slip weighted by load.
    names, index = contact_groups(["front", "front", "rear", "rear"], 4)
    fn2, slip2 = group_series(c, index, 2)
    np.testing.assert_allclose(fn2[:, 0], fn[:, 0] + fn[:, 1])
    w = np.clip(fn[2, :2], 0, None)
    np.testing.assert_allclose(slip2[2, 0], (w * slip[2, :2]).sum() / w.sum())
    with pytest.raises(InputError, match="name 3 contacts, the contact result has 4"):
        contact_groups(["a", "b", "c"], 4)
    with pytest.raises(InputError, match="groups must be"):
        contact_groups(3, 4)


@pytest.fixture(scope="module")
def rollout(quadruped):
    """A 5 cm drop: 30 steps of 10 ms under PD (touch-down near 0.08 s)."""
    from backdrive.sim import PDActuator, Simulator

    robot, feet, cm, q, touch = quadruped
    sim = Simulator(robot, 1e-2, actuator=PDActuator(kp=200.0, kd=6.0), contact=cm)
    q0 = q.clone()
    q0[2] = touch + 0.05
    with torch.no_grad():
        return sim.rollout(sim.initial_state(q0), q[7:].expand(30, 12))


def test_preview_of_a_contact_trajectory_on_a_heightfield(rollout, quadruped, tmp_path):
    robot, feet, cm, *_ = quadruped
    H = torch.zeros(8, 8, dtype=torch.float64)
    H[5:] = 0.02
    page = viz.preview(robot, rollout, terrain=Heightfield(H, spacing=0.1), force_scale=250.0,
                       path=tmp_path / "drop")
    text = page.read_text()
    # 31 states at 10 ms, every 2nd drawn (at most 60 frames per second): 16 frames, 50 fps.
    assert "quadruped \\u2014 16 frames, 0.32 s \\u2014 contact forces: 1 m = 250 N" in text  # JSON-escaped dash
    assert page.stat().st_size > 100_000


def test_preview_and_plot_reject_bad_contact_input(rollout, quadruped, three_steps, tmp_path):
    robot, feet, cm, *_ = quadruped
    q = rollout.q
    with pytest.raises(InputError, match="ContactResult"):
        viz.preview(robot, q, contact="forces", path=tmp_path / "x")
    with pytest.raises(InputError, match="3 steps but the trajectory has 31 states"):
        viz.preview(robot, q, contact=three_steps, path=tmp_path / "x")
    with pytest.raises(InputError, match="force_scale"):
        viz.preview(robot, rollout, force_scale=-1.0, path=tmp_path / "x")
    with pytest.raises(InputError, match="terrain must be"):
        viz.preview(robot, rollout, terrain="flat", path=tmp_path / "x")
    bad = dataclasses.replace(three_steps, normal_force=three_steps.normal_force.clone())
    bad.normal_force[2, 1] = float("nan")
    with pytest.raises(InputError, match=r"normal_force holds NaN .*step 2, contact 1"):
        contact_arrays(bad)
    single = cm.forces(robot, q[0], rollout.v[0])
    with pytest.raises(InputError, match="time axis"):
        contact_arrays(single)
    # A batch of two rollouts needs an index.
    two = cm.forces(robot, q[:4].expand(2, 4, -1), rollout.v[:4].expand(2, 4, -1))
    with pytest.raises(InputError, match="batch_index"):
        contact_arrays(two)
    assert contact_arrays(two, batch_index=1).steps == 4
    with pytest.raises(InputError, match="does not select"):
        contact_arrays(two, batch_index=(1, 0))
    # plots
    from backdrive.sim import Trajectory

    no_contact = Trajectory(q=q, v=rollout.v, effort=rollout.effort, controls=rollout.controls, dt=0.01)
    with pytest.raises(InputError, match="holds no contact"):
        viz.plot_contact_forces(no_contact, tmp_path / "g.png")
    with pytest.raises(InputError, match="dt must be"):
        viz.plot_contact_forces(three_steps, tmp_path / "g.png")
    with pytest.raises(InputError, match="weight must be"):
        viz.plot_contact_forces(rollout, tmp_path / "g.png", weight=-5.0)
    with pytest.raises(InputError, match="'kick' has 'soon'"):
        viz.plot_contact_forces(rollout, tmp_path / "g.png", events={"kick": "soon"})
    with pytest.raises(InputError, match="Trajectory or a ContactResult"):
        viz.plot_contact_forces(q, tmp_path / "g.png")


def test_plot_contact_forces_writes_a_png_of_the_requested_size(rollout, quadruped, tmp_path):
    from PIL import Image

    robot, feet, cm, *_ = quadruped
    out = viz.plot_contact_forces(rollout, tmp_path / "grf", groups=cm, weight=float(robot.total_mass) * 9.81,
                                  events={"touch-down": 0.08}, size=(700, 500))
    assert out.suffix == ".png" and out.is_file()
    with Image.open(out) as im:
        assert im.size == (700, 500)
    # A ContactResult with its dt plots too.
    out2 = viz.plot_contact_forces(rollout.contact, tmp_path / "grf2.png", dt=0.01)
    assert out2.stat().st_size > 10_000


@pytest.mark.browser
def test_force_arrows_are_on_screen_after_touch_down_only(rollout, quadruped, tmp_path):
    """Headless Chromium: the blue normal-force arrows appear once the feet load."""
    from PIL import Image

    robot, *_ = quadruped
    page = viz.preview(robot, rollout, terrain=GroundPlane(), path=tmp_path / "drop", force_scale=100.0)
    shots = viz.screenshots(page, [(0.0, tmp_path / "air.png"), (0.28, tmp_path / "stand.png")],
                            size=(800, 600), browser=viz.find_chromium())

    def blue(png):
        with Image.open(png) as im:
            img = np.asarray(im.convert("RGB")).astype(np.int16)[40:540]
        r, g, b = img[..., 0], img[..., 1], img[..., 2]
        return int(((b > 150) & (b > r + 80) & (b > g + 40)).sum())

    assert blue(shots[0]) < 20
    assert blue(shots[1]) > 300


def test_a_tilted_ground_plane_is_drawn_as_a_grid_turned_to_its_normal():
    from backdrive.viz._contact import add_terrain

    calls = {}

    class Scene:
        def add_grid(self, name, **kw):
            calls[name] = kw

    plane = GroundPlane.incline(0.3, height=0.1)
    add_terrain(Scene(), plane, 0.5)
    kw = calls["/ground"]
    w, x, y, z = kw["wxyz"]
    R = np.array([  # rotation of the wxyz quaternion
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])
    np.testing.assert_allclose(R[:, 2], [math.sin(0.3), 0.0, math.cos(0.3)], atol=1e-12)
    np.testing.assert_allclose(kw["position"], (0.0, 0.0, 0.1))
    assert kw["width"] == 2.0


def test_a_batched_trajectory_needs_a_batch_index(rollout, quadruped, tmp_path):
    from backdrive.contact import ContactResult
    from backdrive.sim import Trajectory
    from backdrive.viz._preview import _unpack_trajectory

    robot, *_ = quadruped
    two = lambda x: torch.stack([x, 2 * x])  # noqa: E731 - a second, different rollout
    fields = {f.name: two(getattr(rollout.contact, f.name))
              for f in dataclasses.fields(ContactResult) if f.name != "_bodies"}
    batched = Trajectory(q=two(rollout.q), v=two(rollout.v), effort=two(rollout.effort),
                         controls=two(rollout.controls), dt=0.01, contact=ContactResult(**fields))
    with pytest.raises(InputError, match="batch_index"):
        viz.preview(robot, batched, path=tmp_path / "x")
    q, contact, fps, stride = _unpack_trajectory(batched, None, None, 1)
    assert torch.equal(q, 2 * rollout.q) and (fps, stride) == (50.0, 2)
    c = contact_arrays(contact, batch_index=1)
    np.testing.assert_allclose(c.normal_force, 2 * rollout.contact.normal_force.numpy())

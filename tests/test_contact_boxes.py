"""Exact boxes in shape-shape contact: sphere-box, capsule-box, box-box (``contact/_boxes.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from backdrive import RobotModel
from backdrive.contact import (
    ContactGeometry,
    ContactModel,
    ContactParameters,
    ContactShape,
    GroundPlane,
    Scene,
    SelfCollision,
    contact_step,
    free_body,
)
from backdrive.contact._boxes import INACTIVE, box_box_rows, box_signed_distance, capsule_box_rows, sphere_box_rows
from backdrive.spatial import random_rotation, rotvec_to_matrix

torch.set_num_threads(1)
F64 = torch.float64
G = 9.81


def t(*x):
    """A float64 tensor: a scalar ``()`` from one value, else a vector."""
    return torch.tensor(x[0] if len(x) == 1 else x, dtype=F64)


def box_surface(R, c, h, n=40):
    """``(6 n^2, 3)`` points on a box's surface (a grid on each face)."""
    g = torch.linspace(-1, 1, n, dtype=F64)
    a, b = (x.flatten() for x in torch.meshgrid(g, g, indexing="ij"))
    faces = []
    for ax in range(3):
        o = [i for i in range(3) if i != ax]
        for s in (-1.0, 1.0):
            P = torch.zeros(a.shape[0], 3, dtype=F64)
            P[:, ax], P[:, o[0]], P[:, o[1]] = s, a, b
            faces.append(P)
    return (torch.cat(faces) * h) @ R.T + c


def segment_points(p0, p1, n=400):
    s = torch.linspace(0, 1, n, dtype=F64)[:, None]
    return p0 + s * (p1 - p0)


R0 = rotvec_to_matrix(t(0.3, -0.5, 0.9))
C0 = t(0.1, 0.2, 0.3)
H0 = t(0.2, 0.1, 0.05)


@pytest.mark.parametrize(
    "where",
    ["face", "edge", "corner", "inside"],
)
def test_sphere_box_distance_on_face_edge_corner_matches_brute_force(where):
    # A sphere centre placed in the box frame off a face, an edge or a corner
    # (or inside), against the minimum over a 120 x 120 grid per face.
    local = {
        "face": t(0.05, -0.02, 0.05 + 0.07),
        "edge": t(0.2 + 0.04, 0.03, 0.05 + 0.05),
        "corner": t(0.2 + 0.03, 0.1 + 0.02, -0.05 - 0.06),
        "inside": t(0.17, 0.01, 0.0),
    }[where]
    centre = R0 @ local + C0
    r = t(0.03)
    pt, n, phi = sphere_box_rows(centre, r, R0, C0, H0)
    S = box_surface(R0, C0, H0, 120)
    brute = (S - centre).norm(dim=-1).min()
    if where == "inside":
        # inside: radius plus the depth below the nearest face (+x, 3 cm away)
        assert float(phi) == pytest.approx(0.03 + 0.03, abs=1e-12)
        assert torch.allclose(n[0], R0[:, 0], atol=1e-12)  # out through +x
        return
    dist = float(r - phi[0])
    assert dist == pytest.approx(float(brute), abs=2e-3 * float(H0.max()))
    assert dist <= float(brute) + 1e-12
    # the normal is the gradient of the distance (central differences)
    for k in range(3):
        e = torch.zeros(3, dtype=F64)
        e[k] = 1e-6
        dp = float(sphere_box_rows(centre + e, r, R0, C0, H0)[2][0] - sphere_box_rows(centre - e, r, R0, C0, H0)[2][0])
        assert -dp / 2e-6 == pytest.approx(float(n[0, k]), abs=1e-7)
    # the force point lies half-way between the sphere's and the box's surface
    assert float((pt[0] - (centre - r * n[0])).norm()) == pytest.approx(0.5 * (dist - 0.03), abs=1e-12)


def test_signed_distance_of_points_matches_sampled_box():
    gen = torch.Generator().manual_seed(3)
    x = 0.4 * torch.randn(300, 3, generator=gen, dtype=F64)
    sd, n, surf = box_signed_distance(x, H0.expand(300, 3))
    S = box_surface(torch.eye(3, dtype=F64), torch.zeros(3, dtype=F64), H0, 100)
    brute = torch.cdist(x, S).min(-1).values
    inside = (x.abs() < H0).all(-1)
    assert torch.allclose(sd.abs(), brute, atol=2e-3)
    assert bool((sd[inside] < 0).all() and (sd[~inside] >= 0).all())
    assert torch.allclose(n.norm(dim=-1), torch.ones(300, dtype=F64))
    # the surface point is on the box surface
    q = surf.abs() - H0
    assert torch.allclose(q.max(-1).values, torch.zeros(300, dtype=F64), atol=1e-12)


def test_capsule_box_distance_matches_brute_force_including_across_an_edge():
    gen = torch.Generator().manual_seed(5)
    S = box_surface(R0, C0, H0, 60)
    checked_cross = 0
    for _ in range(40):
        mid = C0 + 0.25 * torch.randn(3, generator=gen, dtype=F64)
        d = torch.randn(3, generator=gen, dtype=F64)
        d = 0.15 * d / d.norm()
        p0, p1, r = mid - d, mid + d, t(0.02)
        x = (segment_points(p0, p1) - C0) @ R0
        if bool(((x.abs() < H0).all(-1)).any()):
            continue  # the axis enters the box: not a distance case
        pt, n, phi = capsule_box_rows(p0, p1, r, R0, C0, H0)
        brute = float(torch.cdist(segment_points(p0, p1), S).min()) - 0.02
        got = float(-phi.max())  # surface to surface
        assert got == pytest.approx(brute, abs=3e-3)
        assert got <= brute + 1e-12
        checked_cross += int(phi[2] > INACTIVE)
    assert checked_cross >= 3  # the crossing row was the nearest feature in some draws
    # A capsule lying across the top edge of an axis-aligned box, 1 mm into it:
    # only the crossing row touches, along the diagonal bisector of the edge.
    I, c, h = torch.eye(3, dtype=F64), torch.zeros(3, dtype=F64), t(0.1, 0.1, 0.1)
    off = (0.02 - 0.001) / math.sqrt(2)
    p0, p1 = t(0.1 + off, -0.3, 0.1 + off), t(0.1 + off, 0.3, 0.1 + off)
    pt, n, phi = capsule_box_rows(p0, p1, t(0.02), I, c, h)
    assert float(phi[2]) == pytest.approx(0.001, abs=1e-12)
    assert torch.allclose(n[2], t(1, 0, 1) / math.sqrt(2), atol=1e-12)
    assert float(phi[:2].max()) < 0


def test_box_box_distance_matches_brute_force():
    # brute force: the least distance to B over a 90 x 90 grid on each face
    # of A (the point-box distance is itself checked against sampling above)
    gen = torch.Generator().manual_seed(1)
    hA = t(0.15, 0.12, 0.08)
    checked = 0
    for _ in range(25):
        cA = C0 + 0.5 * torch.randn(3, generator=gen, dtype=F64)
        RA = random_rotation(generator=gen, dtype=F64)
        pt, n, phi = box_box_rows(RA, cA, hA, R0, C0, H0)
        SA = box_surface(RA, cA, hA, 90)
        brute = float(box_signed_distance((SA - C0) @ R0, H0.expand_as(SA))[0].min())
        if not 0.01 < brute < 0.9:
            continue  # overlapping or touching, or beyond INACTIVE (-1 m): not a distance case
        checked += 1
        # every row is an achieved distance (never below the true one) and
        # the nearest is exact (corner-face, corner-edge, edge-edge)
        assert float(-phi.max()) == pytest.approx(brute, abs=1e-3)
        assert float(-phi.max()) <= brute + 1e-12
    assert checked >= 12


def test_box_box_rows_in_penetration():
    I = torch.eye(3, dtype=F64)
    hB, hA = t(0.2, 0.2, 0.1), t(0.1, 0.1, 0.1)
    # a small box sunk 1 mm into the top face of a larger one: its 4 lower
    # corners penetrate, normal +z; B's corners are outside A; no edge row
    cA = t(0.03, -0.02, 0.2 - 0.001)
    pt, n, phi = box_box_rows(I, cA, hA, I, torch.zeros(3, dtype=F64), hB)
    touching = phi > 0
    assert int(touching.sum()) == 4 and bool(touching[:8].sum() == 4)
    assert torch.allclose(phi[touching], torch.full((4,), 1e-3, dtype=F64), atol=1e-12)
    assert torch.allclose(n[touching], t(0, 0, 1).expand(4, 3))
    assert float(phi[16:].max()) == INACTIVE
    # a box larger than the top face, turned 45 degrees about z: the lower box's
    # 4 top corners are inside the upper one (rows 8-15 from the upper's view)
    Rz = rotvec_to_matrix(t(0, 0, math.pi / 4))
    big = t(0.3, 0.3, 0.1)
    pt, n, phi = box_box_rows(Rz, t(0, 0, 0.2 - 0.002), big, I, torch.zeros(3, dtype=F64), hB)
    touching = phi > 0
    assert int(touching[8:16].sum()) == 4 and int(touching[:8].sum()) == 0
    assert torch.allclose(phi[8:16][touching[8:16]], torch.full((4,), 2e-3, dtype=F64), atol=1e-12)
    assert torch.allclose(n[8:16][touching[8:16]], t(0, 0, 1).expand(4, 3), atol=1e-12)
    # two boxes crossed edge on edge: A turned 45 degrees about x (an edge
    # down along x) over B turned 45 degrees about y (an edge up along y),
    # overlapping by 1 mm: no corner inside, one edge crossing carries it
    s2 = math.sqrt(2)
    RA, RB = rotvec_to_matrix(t(math.pi / 4, 0, 0)), rotvec_to_matrix(t(0, math.pi / 4, 0))
    h = t(0.1, 0.1, 0.1)
    top_of_B = 0.1 * s2
    cA = t(0, 0, top_of_B + 0.1 * s2 - 0.001)
    pt, n, phi = box_box_rows(RA, cA, h, RB, torch.zeros(3, dtype=F64), h)
    assert float(phi[:16].max()) < 0
    assert float(phi[16]) == pytest.approx(0.001, abs=1e-12) and float(phi[17:].max()) == INACTIVE
    assert torch.allclose(n[16], t(0, 0, 1), atol=1e-12)
    assert torch.allclose(pt[16], t(0, 0, top_of_B - 0.0005), atol=1e-12)
    # pulled 1 mm apart: only the separated boxes' edge row, minus the gap
    pt, n, phi = box_box_rows(RA, cA + t(0, 0, 0.002), h, RB, torch.zeros(3, dtype=F64), h)
    assert float(phi[24]) == pytest.approx(-0.001, abs=1e-12) and float(phi[:24].max()) < -0.001
    # a cube on a cube turned 45 degrees about z: an octagon of 8 edge
    # crossings, no corner inside the other box
    pt, n, phi = box_box_rows(Rz, t(0, 0, 0.2 - 0.001), h, I, torch.zeros(3, dtype=F64), h)
    assert float(phi[:16].max()) < 0 and float(phi[24]) == INACTIVE
    assert torch.allclose(phi[16:24], torch.full((8,), 1e-3, dtype=F64), atol=1e-12)
    assert torch.allclose(n[16:24], t(0, 0, 1).expand(8, 3), atol=1e-12)
    r = pt[16:24, :2].norm(dim=-1)  # the octagon's vertices: 0.1 / cos(22.5 deg) from the axis
    assert torch.allclose(r, torch.full((8,), 0.1 / math.cos(math.pi / 8), dtype=F64), atol=1e-12)


def test_gradcheck_pair_rows_away_from_switches():
    gen = torch.Generator().manual_seed(2)
    RA = random_rotation(generator=gen, dtype=F64)
    I = torch.eye(3, dtype=F64)

    def pose(w, c):
        return rotvec_to_matrix(w), c

    def sphere(c, w, cb):
        R, cc = pose(w, cb)
        return sphere_box_rows(c, t(0.03), R, cc, H0)

    centre = R0 @ t(0.2 + 0.03, 0.1 + 0.02, 0.02) + C0  # off an edge
    w0 = t(0.3, -0.5, 0.9)
    assert torch.autograd.gradcheck(sphere, (centre.requires_grad_(), w0.clone().requires_grad_(), C0.clone().requires_grad_()))

    def capsule(p0, p1, c):
        return capsule_box_rows(p0, p1, t(0.02), I, c, t(0.1, 0.1, 0.1))

    off = 0.015 / math.sqrt(2)
    p0, p1 = t(0.1 + off, -0.3, 0.1 + off + 0.004), t(0.1 + off + 0.01, 0.3, 0.1 + off)
    assert float(capsule(p0, p1, torch.zeros(3, dtype=F64))[2][2]) > 0  # crossing row in contact
    assert torch.autograd.gradcheck(capsule, (p0.requires_grad_(), p1.requires_grad_(), torch.zeros(3, dtype=F64, requires_grad=True)))

    def boxes(wa, ca, wb):
        return box_box_rows(rotvec_to_matrix(wa), ca, t(0.1, 0.1, 0.1), rotvec_to_matrix(wb), torch.zeros(3, dtype=F64), t(0.2, 0.2, 0.1))

    # tilted box, one corner 2 mm into the top face (corner rows smooth)
    wa = t(0.3, 0.2, 0.1)
    RA = rotvec_to_matrix(wa)
    low = float((torch.tensor([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=F64) * 0.1 @ RA.T)[:, 2].min())
    ca = t(0.02, 0.01, 0.1 - low - 0.002)
    assert int((boxes(wa, ca, torch.zeros(3, dtype=F64))[2] > 0).sum()) == 1
    assert torch.autograd.gradcheck(boxes, (wa.requires_grad_(), ca.requires_grad_(), t(0.01, -0.02, 0.03).requires_grad_()))
    # crossed edges (the edge row), slightly off symmetric
    s2 = math.sqrt(2)
    wa2, wb2 = t(math.pi / 4 + 0.05, 0.02, 0.1), t(0.03, math.pi / 4 - 0.04, 0.0)

    def crossed(wa, ca, wb):
        return box_box_rows(rotvec_to_matrix(wa), ca, t(0.1, 0.1, 0.1), rotvec_to_matrix(wb), torch.zeros(3, dtype=F64), t(0.1, 0.1, 0.1))

    ca2 = t(0.01, -0.01, 0.2 * s2 - 0.003)
    phi = crossed(wa2, ca2, wb2)[2]
    assert float(phi[16]) > 0 and float(phi[:16].max()) < 0 and float(phi[17:].max()) < 0
    assert torch.autograd.gradcheck(crossed, (wa2.requires_grad_(), ca2.requires_grad_(), wb2.requires_grad_()))


def stack(top_size, top_mass, k, *, yaw=0.0, steps=400, dt=1e-3, bottom=(0.4, 0.4, 0.2)):
    """A box (``top_size``, turned by ``yaw`` about z) put onto a box of 5 kg (``bottom``) on the ground."""
    top = free_body("top", "box", top_size, top_mass)
    bot = free_body("bot", "box", bottom, 5.0)
    P = ContactParameters(stiffness=k, damping=2.0 * math.sqrt(k * top_mass) * 4, friction=0.5, normal_width=1e-7)
    scene = Scene([(bot, Scene.object_contact(bot, params=P)), (top, Scene.object_contact(top, params=P))], params=P)
    qb, qt = bot.neutral(), top.neutral()
    qb[2] = 0.1 - 7 * G / (4 * k)
    qt[2] = 0.2 + top_size[2] / 2
    qt[3:7] = t(math.cos(yaw / 2), 0, 0, math.sin(yaw / 2))
    z = torch.zeros(6, dtype=F64)
    q, v = scene.initial((qb, z), (qt, z))
    qs, vs, res = scene.rollout(q, v, steps, dt)
    return scene, qs, vs, res


def test_box_resting_on_a_box_sinks_m_g_over_k_per_corner_and_carries_its_weight():
    k, m = 1e5, 2.0
    scene, qs, vs, res = stack((0.2, 0.2, 0.2), m, k)
    pairs = res[-1].pairs
    assert scene.num_pair_rows == 25
    loaded = pairs.normal_force > 1e-6
    assert loaded.tolist() == [False] * 8 + [True, False] * 4 + [False] * 9  # the upper box's lower corners
    assert float(pairs.normal_force.sum()) == pytest.approx(m * G, rel=1e-6)
    assert torch.allclose(pairs.penetration[loaded], torch.full((4,), m * G / (4 * k), dtype=F64), rtol=1e-3)
    # the ground carries both boxes
    assert float(res[-1].systems[0].normal_force.sum()) == pytest.approx(7 * G, rel=1e-6)
    assert float(vs[-1].abs().max()) < 1e-6
    # a larger upper box turned 45 degrees: carried by the lower box's 4 corners
    scene, qs, vs, res = stack((0.5, 0.5, 0.1), 1.0, k, yaw=math.pi / 4, bottom=(0.3, 0.3, 0.2))
    pairs = res[-1].pairs
    loaded = pairs.normal_force > 1e-6
    # the pair's first box is the lower one (system 0): its 4 upper corners (odd rows)
    assert loaded.tolist() == [False, True] * 4 + [False] * 17
    assert float(pairs.normal_force.sum()) == pytest.approx(G, rel=1e-6)
    assert torch.allclose(pairs.penetration[loaded], torch.full((4,), G / (4 * k), dtype=F64), rtol=1e-3)
    # an equal cube turned 45 degrees: the octagon of 8 edge crossings, m g / 8 each
    scene, qs, vs, res = stack((0.2, 0.2, 0.2), m, k, yaw=math.pi / 4, bottom=(0.2, 0.2, 0.2))
    pairs = res[-1].pairs
    loaded = pairs.normal_force > 1e-6
    assert loaded.tolist() == [False] * 16 + [True] * 8 + [False]
    assert torch.allclose(pairs.normal_force[16:24], torch.full((8,), m * G / 8, dtype=F64), rtol=1e-3)
    assert torch.allclose(pairs.penetration[16:24], torch.full((8,), m * G / (8 * k), dtype=F64), rtol=1e-3)
    assert abs(float(qs[-1, 9]) - (0.3 - 7 * G / (4 * k) - m * G / (8 * k))) < 1e-6


def test_box_stack_rest_height_matches_mujoco():
    mujoco = pytest.importorskip("mujoco")
    # MuJoCo's own box-box collision (stiff soft contact: solref 4 ms) against
    # backdrive's exact boxes with a matching rest penetration scale.
    xml = """<mujoco><option timestep="0.001"/>
      <default><geom solref="0.004 1" friction="0.5 0.005 0.0001"/></default>
      <worldbody><geom type="plane" size="2 2 0.1"/>
        <body name="bot" pos="0 0 0.1"><freejoint/><geom type="box" size="0.2 0.2 0.1" mass="5"/></body>
        <body name="top" pos="0.03 -0.02 0.3"><freejoint/><geom type="box" size="0.1 0.1 0.1" mass="2"/></body>
      </worldbody></mujoco>"""
    model = mujoco.MjModel.from_xml_string(xml)
    data = mujoco.MjData(model)
    for _ in range(1500):
        mujoco.mj_step(model, data)
    mj_top = float(data.qpos[9])
    mj_contacts_between = sum(
        1 for i in range(data.ncon) if {int(data.contact[i].geom1), int(data.contact[i].geom2)} == {1, 2}
    )
    scene, qs, vs, res = stack((0.2, 0.2, 0.2), 2.0, 1e6, steps=300)
    bd_top = float(qs[-1, 9])
    # both stand the upper box within 0.5 mm of 0.3 m, and of each other
    assert abs(mj_top - 0.3) < 5e-4
    assert abs(bd_top - 0.3) < 5e-4
    assert abs(bd_top - mj_top) < 5e-4
    assert mj_contacts_between == 4 and int((res[-1].pairs.normal_force > 1e-6).sum()) == 4


SLIDER_BOXES = """<?xml version="1.0"?>
<robot name="sliders">
  <link name="base"/>
  <joint name="ja" type="prismatic"><parent link="base"/><child link="a"/>
    <origin xyz="-0.15 0 0"/><axis xyz="1 0 0"/><limit lower="-1" upper="1" effort="100" velocity="10"/></joint>
  <link name="a"><inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><box size="0.2 0.2 0.2"/></geometry></collision></link>
  <joint name="jb" type="prismatic"><parent link="base"/><child link="b"/>
    <origin xyz="0.15 0 0"/><axis xyz="1 0 0"/><limit lower="-1" upper="1" effort="100" velocity="10"/></joint>
  <link name="b"><inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><sphere radius="0.05"/></geometry></collision></link>
  <joint name="jc" type="revolute"><parent link="b"/><child link="c"/>
    <origin xyz="0.2 0 0"/><axis xyz="0 0 1"/><limit lower="-3" upper="3" effort="100" velocity="10"/></joint>
  <link name="c"><inertial><mass value="0.5"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><box size="0.3 0.05 0.05"/></geometry></collision></link>
</robot>"""


def test_self_collision_with_exact_boxes_steps_and_gradchecks():
    robot = RobotModel.from_urdf(SLIDER_BOXES).replace(gravity=torch.zeros(3, dtype=F64))
    geom = ContactGeometry.from_model(robot)
    sc = SelfCollision.build(robot, geom)
    # a-b: box-sphere (1 row, the box second), a-c: box-box (25)
    assert sc.pairs == (("b", "a"),) + (("a", "c"),) * 25
    # pushed together with F: the sphere rests F / k into the box face
    k, F = 1e4, 10.0
    P = ContactParameters(stiffness=k, damping=2 * math.sqrt(k * 0.5), normal_width=1e-7)
    sc = SelfCollision.build(robot, geom, params=P, exclude=[("a", "c")])
    cm = ContactModel(robot, geom, GroundPlane(height=-10.0), self_collision=sc)
    q, v = t(0.0, 0.0, 1.0), torch.zeros(3, dtype=F64)
    for _ in range(400):
        q, v, res = contact_step(robot, cm, q, v, t(F, -F, 0.0), 1e-3)
    assert float(res.penetration[-1]) == pytest.approx(F / k, rel=1e-3)
    assert torch.allclose(res.normal[-1], t(1.0, 0, 0))  # out of the box a (second) into the sphere b (first)
    # one step with the box-box pair in contact (c turned into a's side)
    # (c's corner 5 mm into a's +x face; the sphere b, inside a, excluded)
    q = t(0.12, -0.1343, 0.3)
    sc = SelfCollision.build(robot, geom, params=ContactParameters(stiffness=2e4, damping=50.0), exclude=[("a", "b")])
    assert sc.pairs == (("a", "c"),) * 25
    cm = ContactModel(robot, geom, GroundPlane(height=-10.0), self_collision=sc)
    pen = cm.forces(robot, q, torch.zeros(3, dtype=F64)).penetration[-25:]
    assert 0.001 < float(pen.max()) < 0.01 and int((pen > 0).sum()) == 2  # c's two corners at that end

    def f(q, v, k):
        sc = SelfCollision.build(robot, geom, params=ContactParameters(stiffness=k, damping=50.0), exclude=[("a", "b")])
        cm = ContactModel(robot, geom, GroundPlane(height=-10.0), self_collision=sc)
        q1, v1, res = contact_step(robot, cm, q, v, torch.zeros_like(v), 1e-3)
        return q1, v1, res.normal_force

    inputs = (q.requires_grad_(), t(0.2, -0.1, 0.5).requires_grad_(), t(2e4).requires_grad_())
    assert torch.autograd.gradcheck(f, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)


def test_bad_box_modes_and_exclusions_raise_typed_errors():
    from backdrive import InputError

    robot = RobotModel.from_urdf(SLIDER_BOXES)
    with pytest.raises(InputError, match="unknown boxes mode 'mesh'.*exact, capsule"):
        SelfCollision.build(robot, boxes="mesh")
    with pytest.raises(InputError, match="pairs of link names"):
        SelfCollision.build(robot, exclude=["ac"])


def test_random_drops_of_boxes_capsules_and_spheres_stay_finite_forward_and_backward():
    # 32 random tumbling drops of a box, a capsule and a sphere onto a box
    # and each other (edges, corners, deep overlaps, parallel faces included):
    # states, forces and gradients finite.
    gen = torch.Generator().manual_seed(7)
    n = 32
    base = free_body("base", "box", (0.4, 0.3, 0.2), 5.0)
    objs = [free_body("b", "box", (0.2, 0.1, 0.15), 1.0), free_body("c", "capsule", (0.04, 0.2), 0.8), free_body("s", "sphere", (0.06,), 0.5)]
    P = ContactParameters(stiffness=2e4, damping=300.0, friction=0.6)
    systems = [(base, Scene.object_contact(base, params=P))] + [(o, Scene.object_contact(o, params=P)) for o in objs]
    scene = Scene(systems, params=P)
    # base-b box-box, base-c capsule-box, base-s sphere-box, b-c, b-s, c-s capsule-sphere
    assert scene.num_pair_rows == 25 + 3 + 1 + 3 + 1 + 1
    states = []
    qb = base.neutral().expand(n, 7).clone()
    qb[:, 2] = 0.1
    states.append((qb, torch.zeros(n, 6, dtype=F64)))
    for i, o in enumerate(objs):
        q = o.neutral().expand(n, 7).clone()
        q[:, :2] = 0.15 * torch.randn(n, 2, generator=gen, dtype=F64)
        q[:, 2] = 0.25 + 0.12 * i + 0.05 * torch.rand(n, generator=gen, dtype=F64)
        quat = torch.randn(n, 4, generator=gen, dtype=F64)
        q[:, 3:7] = quat / quat.norm(dim=-1, keepdim=True)
        q[: n // 4, 3:7] = t(1.0, 0, 0, 0)  # some exactly aligned (parallel faces and edges)
        v = torch.randn(n, 6, generator=gen, dtype=F64)
        v[:, 2] -= 1.0
        states.append((q, v))
    q0, v0 = scene.initial(*states)
    v0 = v0.clone().requires_grad_()
    qs, vs, res = scene.rollout(q0, v0, 40, 2e-3)
    assert bool(torch.isfinite(qs).all() and torch.isfinite(vs).all())
    fn = torch.stack([r.pairs.normal_force for r in res])
    assert bool(torch.isfinite(fn).all()) and float(fn.detach().max()) > 0
    touched = (fn > 0).any(0).any(0)
    assert int(touched.sum()) >= 20  # most rows saw contact in some sample
    loss = qs[:, -1, :3].square().sum() + fn.sum() * 1e-3
    (g,) = torch.autograd.grad(loss, v0)
    assert bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0

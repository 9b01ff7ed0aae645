"""Self-collision: swept-sphere pairs between a robot's own bodies."""

from __future__ import annotations

import math

import pytest
import torch

from backdrive import RobotModel, UnknownNameError
from backdrive.contact import (
    ContactApproximationWarning,
    ContactGeometry,
    ContactModel,
    ContactParameters,
    ContactShape,
    GroundPlane,
    SelfCollision,
    closest_points_segments,
    contact_step,
)

SLIDERS = """<?xml version="1.0"?>
<robot name="sliders">
  <link name="base"/>
  <joint name="ja" type="prismatic"><parent link="base"/><child link="a"/>
    <origin xyz="-0.15 0 0"/><axis xyz="1 0 0"/><limit lower="-1" upper="1" effort="100" velocity="10"/></joint>
  <link name="a"><inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><sphere radius="0.1"/></geometry></collision></link>
  <joint name="jb" type="prismatic"><parent link="base"/><child link="b"/>
    <origin xyz="0.15 0 0"/><axis xyz="1 0 0"/><limit lower="-1" upper="1" effort="100" velocity="10"/></joint>
  <link name="b"><inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><sphere radius="0.1"/></geometry></collision></link>
  <joint name="jc" type="revolute"><parent link="b"/><child link="c"/>
    <origin xyz="0.2 0 0"/><axis xyz="0 0 1"/><limit lower="-3" upper="3" effort="100" velocity="10"/></joint>
  <link name="c"><inertial><mass value="0.5"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><box size="0.3 0.05 0.05"/></geometry></collision></link>
</robot>"""


def sliders():
    return RobotModel.from_urdf(SLIDERS).replace(gravity=torch.zeros(3, dtype=torch.float64))


def test_closest_points_of_segments_match_brute_force():
    gen = torch.Generator().manual_seed(0)
    P = torch.randn(200, 4, 3, generator=gen, dtype=torch.float64)
    P[:20, 1] = P[:20, 0]  # first segment a point
    P[20:40, 3] = P[20:40, 2]  # second a point
    P[40:50, 3] = P[40:50, 2] + 2 * (P[40:50, 1] - P[40:50, 0])  # parallel
    c1, c2 = closest_points_segments(P[:, 0], P[:, 1], P[:, 2], P[:, 3])
    s = torch.linspace(0, 1, 401, dtype=torch.float64)
    A = P[:, None, 0] + s[None, :, None] * (P[:, None, 1] - P[:, None, 0])  # (200, 401, 3)
    B = P[:, None, 2] + s[None, :, None] * (P[:, None, 3] - P[:, None, 2])
    brute = torch.cdist(A, B).flatten(1).min(-1).values
    got = (c1 - c2).norm(dim=-1)
    # an achieved distance between points of the two segments, never above
    # the sampled minimum, and within the sampling error of it: the minimum
    for c, p0, p1 in ((c1, P[:, 0], P[:, 1]), (c2, P[:, 2], P[:, 3])):
        d = p1 - p0
        dd = (d * d).sum(-1).clamp_min(1e-300)
        t = ((c - p0) * d).sum(-1) / dd
        assert bool(((t > -1e-12) & (t < 1 + 1e-12)).all())
        assert torch.allclose(c, p0 + t[:, None] * d, atol=1e-12)
    assert torch.all(got <= brute + 1e-12)
    assert torch.allclose(got, brute, atol=5e-3)


def test_filter_excludes_same_body_adjacent_and_named_pairs():
    robot = sliders()
    with pytest.warns(ContactApproximationWarning, match="'c'.*capsule"):
        sc = SelfCollision.build(robot, boxes="capsule")
    assert sc.pairs == (("a", "b"), ("a", "c"))  # b-c are parent and child
    sc = SelfCollision.build(robot)  # boxes exact by default: sphere-box is one row, no warning
    assert sc.pairs == (("a", "b"), ("a", "c"))
    with pytest.warns(ContactApproximationWarning):
        assert SelfCollision.build(robot, adjacent=True, boxes="capsule").pairs == (("a", "b"), ("a", "c"), ("b", "c"))
        assert SelfCollision.build(robot, exclude=[("c", "a")], boxes="capsule").pairs == (("a", "b"),)
        with pytest.raises(UnknownNameError, match="'cc'"):
            SelfCollision.build(robot, exclude=[("a", "cc")])


def test_pushed_spheres_rest_at_force_over_stiffness():
    robot = sliders()
    geom = ContactGeometry.spheres(robot, {"a": 0.1, "b": 0.1})
    k, F = 1e4, 10.0
    sc = SelfCollision.build(robot, geom, params=ContactParameters(stiffness=k, damping=2 * math.sqrt(k * 0.5), normal_width=1e-7))
    # ground far below: only the pair acts
    cm = ContactModel(robot, geom, GroundPlane(height=-10.0), self_collision=sc)
    q = torch.zeros(3, dtype=torch.float64)
    v = torch.zeros(3, dtype=torch.float64)
    tau = torch.tensor([F, -F, 0.0], dtype=torch.float64)
    for _ in range(400):
        q, v, res = contact_step(robot, cm, q, v, tau, 1e-3)
    pair = res.penetration[-1]
    assert float(pair) == pytest.approx(F / k, rel=1e-3)
    assert float(res.normal_force[-1]) == pytest.approx(F, rel=1e-4)
    # the normal points from b to a (-x), and the wrenches are equal and opposite
    assert torch.allclose(res.normal[-1], torch.tensor([-1.0, 0.0, 0.0], dtype=torch.float64))
    fa, fb = res.f_ext[1, :3], res.f_ext[2, :3]
    assert float(fa[0]) == pytest.approx(-F, rel=1e-4) and torch.allclose(fa, -fb, atol=1e-9)


def test_gradcheck_capsule_pair_step():
    robot = sliders()
    geom = ContactGeometry.from_shapes(
        robot,
        [
            ContactShape("a", "capsule", (0.05, 0.2), (0.0, 0.0, 0.0)),
            ContactShape("c", "capsule", (0.04, 0.3), torch.tensor([[0.0, 0, 1, 0], [0, 1, 0, 0], [-1, 0, 0, 0], [0, 0, 0, 1]], dtype=torch.float64)),
        ],
    )
    q = torch.tensor([0.1, -0.31, 2.0], dtype=torch.float64)
    v = torch.tensor([0.2, -0.1, 0.5], dtype=torch.float64)

    def f(q, v, k, mu):
        sc = SelfCollision.build(robot, geom, params=ContactParameters(stiffness=k, damping=50.0, friction=mu))
        cm = ContactModel(robot, geom, GroundPlane(height=-10.0), self_collision=sc)
        q1, v1, res = contact_step(robot, cm, q, v, torch.zeros_like(v), 1e-3)
        return q1, v1, res.normal_force

    sc = SelfCollision.build(robot, geom)
    cm = ContactModel(robot, geom, GroundPlane(height=-10.0), self_collision=sc)
    res = cm.forces(robot, q, v)
    assert float(res.penetration[-1]) > 0 and float(res.normal_force[-1]) > 0  # the capsules overlap
    inputs = (
        q.requires_grad_(),
        v.requires_grad_(),
        torch.tensor(2e4, dtype=torch.float64, requires_grad=True),
        torch.tensor(0.5, dtype=torch.float64, requires_grad=True),
    )
    assert torch.autograd.gradcheck(f, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)

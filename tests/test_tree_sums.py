"""The fast path's level-by-level tree sums on trees whose levels follow no
single stride (a humanoid: legs and a waist under the pelvis, arms under the
torso), against the dense ancestor-matrix product and the reference path."""

from __future__ import annotations

import torch

from backdrive import RobotModel
from backdrive.dynamics import forward_dynamics, inverse_dynamics, mass_matrix, use_path
from backdrive.kinematics._schedule import _level_pieces, down, tree_schedule, tree_sums

# G1's shape: pelvis -> (waist, left leg, right leg); waist -> torso -> (left
# arm, right arm, head), so level 4 has parents [leg, leg, torso, torso].
PARENTS = [-1, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 7, 8, 9, 10, 11, 12, 13, 7]


def _urdf(parents: list[int]) -> str:
    links, joints = [], []
    g = torch.Generator().manual_seed(3)
    for b, p in enumerate(parents):
        m = 0.5 + float(torch.rand((), generator=g))
        links.append(
            f'<link name="l{b}"><inertial><origin xyz="0.01 0.02 -0.03"/><mass value="{m:.3f}"/>'
            '<inertia ixx="0.01" ixy="0.001" ixz="0" iyy="0.02" iyz="0" izz="0.015"/></inertial></link>'
        )
        if p >= 0:
            ax = ["1 0 0", "0 1 0", "0 0 1"][b % 3]
            joints.append(
                f'<joint name="j{b}" type="revolute"><parent link="l{p}"/><child link="l{b}"/>'
                f'<origin xyz="0.05 {0.02 * (b % 4)} -0.1" rpy="0.1 0 0.2"/><axis xyz="{ax}"/>'
                '<limit lower="-2" upper="2" effort="10" velocity="3"/></joint>'
            )
    return f'<robot name="tree">{"".join(links)}{"".join(joints)}</robot>'


def test_level_pieces_cover_every_child_once():
    # Strided runs, a shared parent, and a level that needs several pieces.
    for pars in ([0, 1, 2], [4, 4, 4], [7, 8, 9, 9], [3, 1, 2, 2, 5], [2]):
        pieces = _level_pieces(10, pars)
        got = []
        for child, par, shared in pieces:
            kids = list(range(child.start, child.stop))
            ps = list(range(par.start, par.stop, par.step or 1))
            if shared:
                assert len(ps) == 1
                ps = ps * len(kids)
            assert len(ps) == len(kids)
            got += list(zip(kids, ps))
        assert got == [(10 + k, p) for k, p in enumerate(pars)]
    assert len(_level_pieces(0, [7, 8, 9, 9])) == 2


def test_level_sums_equal_ancestor_products_on_a_humanoid_tree():
    robot = RobotModel.from_urdf(_urdf(PARENTS), floating_base=True)
    sums = tree_sums(robot, 0, level_order=True)
    assert sums.plan is not None  # no fallback to the dense product
    x = torch.randn(3, len(PARENTS), 600, dtype=torch.float64)
    with torch.no_grad():
        got_down = down(sums, x.clone())
        from backdrive.kinematics._schedule import up

        got_up = up(sums, x.clone())
    torch.testing.assert_close(got_down, sums.anc @ x, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_up, sums.anc.T @ x, rtol=1e-12, atol=1e-12)
    assert tree_schedule(robot).parent_pos[0] == -1


def test_fast_path_on_a_humanoid_tree_matches_reference():
    robot = RobotModel.from_urdf(_urdf(PARENTS), floating_base=True)
    g = torch.Generator().manual_seed(0)
    n = 700  # above the level-sum threshold, so the in-place level sums run
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    tau = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    with torch.no_grad():
        with use_path("reference"):
            ref = (forward_dynamics(robot, q, v, tau), inverse_dynamics(robot, q, v, tau), mass_matrix(robot, q))
        with use_path("fast"):
            got = (forward_dynamics(robot, q, v, tau), inverse_dynamics(robot, q, v, tau), mass_matrix(robot, q))
    for r, f in zip(ref, got):
        torch.testing.assert_close(f, r, rtol=1e-9, atol=1e-9)

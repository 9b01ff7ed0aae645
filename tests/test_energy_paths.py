"""Kinetic and potential energy and the centre of mass on the fast path,
held against the reference path (values and gradients, float64)."""

from __future__ import annotations

import pytest
import torch

from backdrive import RobotModel
from backdrive.data import load
from backdrive.dynamics import center_of_mass, kinetic_energy, potential_energy, use_path
from _robots import SMALL_URDF


def _robots():
    small = RobotModel.from_urdf(SMALL_URDF)  # mimic, prismatic, fixed base
    return {
        "quadruped": load("quadruped", floating_base=True),
        "panda": load("panda"),
        "small": small,
        "small_floating": RobotModel.from_urdf(SMALL_URDF, floating_base=True),
    }


@pytest.mark.parametrize("name", ["quadruped", "panda", "small", "small_floating"])
@pytest.mark.parametrize("n", [40, 700])  # 700: the in-place level sums of the fast path
def test_energies_fast_path_match_reference(name, n):
    robot = _robots()[name]
    g = torch.Generator().manual_seed(1)
    nj = robot.nv - (6 if robot.floating_base else 0)
    robot = robot.replace(armature=torch.rand(nj, generator=g, dtype=torch.float64))
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    grav = torch.randn(n, 3, generator=g, dtype=torch.float64)
    out = {}
    for path in ("reference", "fast"):
        with use_path(path):
            with torch.no_grad():
                plain = (kinetic_energy(robot, q, v), potential_energy(robot, q, gravity=grav), center_of_mass(robot, q))
            qq, vv = q.clone().requires_grad_(), v.clone().requires_grad_()
            ke = kinetic_energy(robot, qq, vv)
            pe = potential_energy(robot, qq, gravity=grav)
            com = center_of_mass(robot, qq)
            w = torch.linspace(0.5, 1.5, 3, dtype=torch.float64)
            gq, gv = torch.autograd.grad(ke.sum() + 0.3 * pe.sum() + (com * w).sum(), [qq, vv])
            out[path] = plain + (ke.detach(), gq, gv)
    for r, f in zip(out["reference"], out["fast"]):
        torch.testing.assert_close(f, r, rtol=1e-10, atol=1e-10)
    assert out["fast"][0].shape == (n,) and out["fast"][2].shape == (n, 3)


def test_fast_energies_gradcheck():
    robot = RobotModel.from_urdf(SMALL_URDF, floating_base=True)
    g = torch.Generator().manual_seed(2)
    q = robot.random_q(3, generator=g).requires_grad_(True)
    v = torch.randn(3, robot.nv, generator=g, dtype=torch.float64).requires_grad_(True)
    with use_path("fast"):
        assert torch.autograd.gradcheck(lambda q, v: kinetic_energy(robot, q, v), (q, v))
        assert torch.autograd.gradcheck(lambda q: potential_energy(robot, q), (q,))
        assert torch.autograd.gradcheck(lambda q: center_of_mass(robot, q), (q,))

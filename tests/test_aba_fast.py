"""ABA on the fast path (batch last, no autograd) against the reference ABA and CRBA."""

from __future__ import annotations

import pytest
import torch

from backdrive import InputError, RobotModel
from backdrive.data import load
from backdrive.dynamics import forward_dynamics, use_path
from _robots import SMALL_URDF, SMALL_URDF_NO_MIMIC


def _robot(name):
    if name == "quadruped":
        return load("quadruped", floating_base=True)
    return RobotModel.from_urdf(SMALL_URDF_NO_MIMIC, floating_base=name == "small_floating")


@pytest.mark.parametrize("name", ["quadruped", "small", "small_floating"])
@pytest.mark.parametrize("n", [40, 700])
def test_fast_aba_matches_reference_aba_and_crba(name, n):
    robot = _robot(name)
    g = torch.Generator().manual_seed(4)
    nj = robot.nv - (6 if robot.floating_base else 0)
    robot = robot.replace(armature=torch.rand(nj, generator=g, dtype=torch.float64))
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    tau = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    f_ext = torch.randn(n, robot.num_bodies, 6, generator=g, dtype=torch.float64)
    grav = torch.randn(n, 3, generator=g, dtype=torch.float64)
    with torch.no_grad():
        with use_path("reference"):
            ref = forward_dynamics(robot, q, v, tau, method="aba", f_ext=f_ext, gravity=grav)
            crba = forward_dynamics(robot, q, v, tau, method="crba")
        with use_path("fast"):
            got = forward_dynamics(robot, q, v, tau, method="aba", f_ext=f_ext, gravity=grav)
            got_plain = forward_dynamics(robot, q, v, tau, method="aba")
    scale = ref.abs().max()
    assert float((got - ref).abs().max() / scale) < 1e-11
    assert float((got_plain - crba).abs().max() / crba.abs().max()) < 1e-11
    assert got.shape == (n, robot.nv)


def test_fast_aba_batch_shapes_and_float32():
    robot = load("quadruped", floating_base=True).float()
    g = torch.Generator().manual_seed(5)
    q = robot.random_q(600, generator=g).reshape(20, 30, -1)
    v = torch.randn(20, 30, robot.nv, generator=g)
    tau = torch.randn(robot.nv, generator=g)  # broadcasts
    with torch.no_grad():
        got = forward_dynamics(robot, q, v, tau, method="aba")
        with use_path("reference"):
            r64 = robot.double()
            ref = forward_dynamics(r64, q.double(), v.double(), tau.double(), method="aba")
    assert got.shape == (20, 30, robot.nv)
    # float32 against float64: the tolerance of tests/test_dynamics.py for ABA.
    assert float((got.double() - ref).abs().max() / ref.abs().max()) < 5e-3


def test_aba_with_gradient_and_mimic():
    robot = _robot("small_floating")
    g = torch.Generator().manual_seed(6)
    q = robot.random_q(300, generator=g).requires_grad_(True)
    v = torch.randn(300, robot.nv, generator=g, dtype=torch.float64)
    tau = torch.randn(300, robot.nv, generator=g, dtype=torch.float64)
    (ga,) = torch.autograd.grad(forward_dynamics(robot, q, v, tau, method="aba").sum(), q)
    (gc,) = torch.autograd.grad(forward_dynamics(robot, q, v, tau, method="crba").sum(), q)
    torch.testing.assert_close(ga, gc, rtol=1e-8, atol=1e-8)
    mimic = RobotModel.from_urdf(SMALL_URDF)
    with pytest.raises(InputError, match="mimic"):
        forward_dynamics(mimic, mimic.random_q(300), torch.zeros(300, mimic.nv, dtype=torch.float64),
                         torch.zeros(300, mimic.nv, dtype=torch.float64), method="aba")

"""ABA on the fast path (batch last, no autograd) against the reference ABA and CRBA."""

from __future__ import annotations

import pytest
import torch

from backdrive import InputError, RobotModel
from backdrive.data import load
from backdrive.dynamics import forward_dynamics, mass_matrix, use_path
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


# ---------------------------------------------------------------------- the fast CRBA + LTDL forward dynamics


def test_inertia_factors_rebuild_the_inertias():
    """``Ib = sum_l u_l u_l^T`` with ``u_l`` zero above entry ``l``, also for
    singular inertias (a point mass, a thin rod, a flat plate)."""
    from backdrive.dynamics._fast import _inertia_factors

    g = torch.Generator().manual_seed(21)
    A = torch.randn(5, 3, 3, generator=g, dtype=torch.float64)
    Ib = A @ A.transpose(1, 2)
    rod = torch.diag(torch.tensor([0.0, 2.0, 2.0], dtype=torch.float64))
    plate = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 2.0]], dtype=torch.float64)  # rank 2
    Ib = torch.cat([Ib, torch.zeros(1, 3, 3, dtype=torch.float64), rod[None], plate[None]])
    U = _inertia_factors(Ib)
    assert torch.isfinite(U).all()
    torch.testing.assert_close(U @ U.transpose(1, 2), Ib, rtol=0, atol=1e-12)
    assert float(U.triu(1).abs().max()) == 0.0
    # Cached per tensor and version: an in-place change is seen.
    assert _inertia_factors(Ib) is U
    Ib.mul_(2.0)
    torch.testing.assert_close(_inertia_factors(Ib) @ _inertia_factors(Ib).transpose(1, 2), Ib, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["quadruped", "quadruped_fixed", "small_floating"])
def test_fast_forward_dynamics_base_frame_and_fused_solve(name):
    """Forward dynamics without gradient on the fast path (evaluated in the
    floating base's frame, the first solve fused into the factorisation; and
    ABA, also in the base's frame)
    against the reference path, with the base far from the origin, per-sample
    gravity and external wrenches; and the fused solve against the separate
    one."""
    from backdrive.dynamics import _fast as fast_mod

    if name == "quadruped_fixed":  # a fixed base with four roots of the active tree
        robot = load("quadruped", floating_base=False)
    else:
        robot = _robot(name)
    # forward_fast alone adds no joint damping or friction.
    robot = robot.replace(damping=torch.zeros_like(robot.damping), friction=torch.zeros_like(robot.friction))
    g = torch.Generator().manual_seed(22)
    n = 300
    q = robot.random_q(n, generator=g)
    if robot.floating_base:
        q[:, :3] += 50.0 * torch.randn(n, 3, generator=g, dtype=torch.float64)
    v = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    tau = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    f_ext = torch.randn(n, robot.num_bodies, 6, generator=g, dtype=torch.float64)
    grav = torch.randn(n, 3, generator=g, dtype=torch.float64)
    with torch.no_grad():
        with use_path("reference"):
            ref = forward_dynamics(robot, q, v, tau, f_ext=f_ext, gravity=grav, method="crba")
        with use_path("fast"):
            got = forward_dynamics(robot, q, v, tau, f_ext=f_ext, gravity=grav)
            got_aba = forward_dynamics(robot, q, v, tau, f_ext=f_ext, gravity=grav, method="aba")
        a_world, factor = fast_mod.forward_fast(robot, q, v, tau, grav, f_ext)
    # The reference works in the world frame, 50 m from the base: it loses a
    # few digits there (the base-frame evaluation does not).
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-8
    assert float((got_aba - ref).abs().max() / ref.abs().max()) < 1e-8
    assert float((a_world - ref).abs().max() / ref.abs().max()) < 1e-8
    want = torch.linalg.solve(mass_matrix(robot, q), tau[..., None])[..., 0]
    torch.testing.assert_close(factor.solve(tau), want, rtol=1e-8, atol=1e-8 * float(want.abs().max()))


def test_fast_forward_dynamics_float32_g1_accuracy():
    """The G1 humanoid (wide and shallow) in float32 at a fast-path batch
    against float64: evaluated in the base's frame, the error stays small."""
    robot = load("example-robot-data:g1", floating_base=True)
    g = torch.Generator().manual_seed(23)
    q = robot.random_q(256, generator=g)
    v = torch.randn(256, robot.nv, generator=g, dtype=torch.float64)
    tau = torch.randn(256, robot.nv, generator=g, dtype=torch.float64)
    with torch.no_grad():
        ref = forward_dynamics(robot, q, v, tau, method="crba")
        got = forward_dynamics(robot.float(), q.float(), v.float(), tau.float())
    assert float((got.double() - ref).abs().max() / ref.abs().max()) < 1e-3


def test_fast_crba_pair_blocks_g1(monkeypatch):
    """The G1 humanoid's CRBA pairs as strided blocks (``_Sparsity.blocks``:
    runs, broadcasts of one ancestor, two-dimensional blocks), each pair
    once, used above ``LEVEL_SUM_MIN_BATCH``; the mass matrix (world frame)
    and forward dynamics (base frame, LTDL) against the reference path in
    float64."""
    from backdrive.dynamics import _fast as fast_mod
    from backdrive.kinematics import _paths

    robot = load("example-robot-data:g1", floating_base=True)
    sp = fast_mod._sparsity(robot)
    topo = fast_mod.fast_topology(robot)
    nm = topo.nm
    cells = [(j0 + d1[0] * a + d2[0] * b, i0 + d1[1] * a + d2[1] * b)
             for j0, i0, d1, A, d2, B in sp.blocks for a in range(A) for b in range(B)]
    ancestor = topo.upper.bool()  # upper[j, i]: moving body j is i or one of its ancestors
    assert len(cells) == len(set(cells)) == sp.npairs == int(ancestor.sum())
    assert all(bool(ancestor[j, i]) for j, i in cells)
    assert cells[:nm] == [(i, i) for i in range(nm)]  # the diagonal first, in order
    assert any(B > 1 for *_, B in sp.blocks) and any(d1[0] == 0 for _, _, d1, *_ in sp.blocks)
    assert len(sp.blocks) < 24
    g = torch.Generator().manual_seed(24)
    n = 6
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    tau = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    with torch.no_grad():
        with use_path("reference"):
            M_ref = mass_matrix(robot, q)
            a_ref = forward_dynamics(robot, q, v, tau, method="crba")
        monkeypatch.setattr(_paths, "LEVEL_SUM_MIN_BATCH", 0)
        with use_path("fast"):
            M = mass_matrix(robot, q)
            a = forward_dynamics(robot, q, v, tau)
    assert float((M - M_ref).abs().max() / M_ref.abs().max()) < 1e-12
    assert float((a - a_ref).abs().max() / a_ref.abs().max()) < 1e-9

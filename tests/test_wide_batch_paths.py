"""Large batches take the fast path (batch as the last, contiguous axis).
These tests force it at small batch sizes with ``use_path("fast")`` and check
it against the reference path, values and gradients, and against Pinocchio
at a batch above the switch-over."""

from __future__ import annotations

import re

import numpy as np
import pinocchio as pin
import pytest
import torch

import backdrive.dynamics._fast as fast_mod
import backdrive.kinematics._fk as fk_mod
import backdrive.kinematics._paths as paths_mod
from backdrive.data import get_data_path, load
from backdrive.dynamics import forward_dynamics, inverse_dynamics, mass_matrix, use_path
from backdrive.kinematics import forward_kinematics, frame_jacobian

F64 = torch.float64


@pytest.fixture
def wide(monkeypatch):
    """Force the fast path, with its per-level tree sums, for every batch size."""
    monkeypatch.setattr(paths_mod, "LEVEL_SUM_MIN_BATCH", 0)
    with use_path("fast"):
        yield


def _functions(robot, q, v, a):
    return {
        "fk": forward_kinematics(robot, q),
        "jacobian": frame_jacobian(robot, q, robot.link_names[-1]),
        "rnea": inverse_dynamics(robot, q, v, a),
        "crba": mass_matrix(robot, q),
        "fd": forward_dynamics(robot, q, v, a),
    }


@pytest.mark.parametrize("name,floating", [("panda", False), ("quadruped", True), ("cartpole", False)])
def test_wide_path_equals_default_path(name, floating, monkeypatch):
    robot = load(name, floating_base=floating)
    g = torch.Generator().manual_seed(3)
    q = robot.random_q(5, generator=g)
    v = torch.randn(5, robot.nv, generator=g, dtype=F64)
    a = torch.randn(5, robot.nv, generator=g, dtype=F64)
    with use_path("reference"):
        narrow = _functions(robot, q, v, a)
    with use_path("fast"):
        wide = _functions(robot, q, v, a)
    for key in narrow:
        torch.testing.assert_close(wide[key], narrow[key], atol=1e-11, rtol=1e-11, msg=key)
    monkeypatch.setattr(paths_mod, "LEVEL_SUM_MIN_BATCH", 0)  # per-level tree sums
    with use_path("fast"):
        wide = _functions(robot, q, v, a)
    for key in narrow:
        torch.testing.assert_close(wide[key], narrow[key], atol=1e-11, rtol=1e-11, msg=key)


def test_wide_path_gradcheck(wide):
    robot = load("double_pendulum")
    g = torch.Generator().manual_seed(4)
    q = robot.random_q(3, generator=g).requires_grad_(True)
    v = torch.randn(3, robot.nv, generator=g, dtype=F64, requires_grad=True)
    tau = torch.randn(3, robot.nv, generator=g, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, v, t: forward_dynamics(robot, q, v, t), (q, v, tau))
    assert torch.autograd.gradcheck(lambda q, v, t: inverse_dynamics(robot, q, v, t), (q, v, tau))
    assert torch.autograd.gradcheck(lambda q: forward_kinematics(robot, q), (q,))


def test_batch_above_switch_matches_pinocchio():
    robot = load("panda")
    pm = pin.buildModelFromUrdf(str(get_data_path("panda")), mimic=True)
    pd = pm.createData()
    n = 130  # above the switch-over batch sizes (FAST_MIN_BATCH)
    g = torch.Generator().manual_seed(5)
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=F64)
    a = torch.randn(n, robot.nv, generator=g, dtype=F64)
    tau = inverse_dynamics(robot, q, v, a).numpy()
    M = mass_matrix(robot, q).numpy()
    T = forward_kinematics(robot, q).numpy()
    tcp = robot.frame_index("panda_hand_tcp")
    fid = pm.getFrameId("panda_hand_tcp")
    for i in range(n):
        qi, vi, ai = q[i].numpy(), v[i].numpy(), a[i].numpy()
        ref = pin.rnea(pm, pd, qi, vi, ai)
        np.testing.assert_allclose(tau[i], ref, rtol=1e-10, atol=1e-10 * np.abs(ref).max())
        Mr = pin.crba(pm, pd, qi)
        Mr = np.triu(Mr) + np.triu(Mr, 1).T
        np.testing.assert_allclose(M[i], Mr, atol=1e-10 * np.abs(Mr).max())
        pin.framesForwardKinematics(pm, pd, qi)
        np.testing.assert_allclose(T[i, tcp], pd.oMf[fid].homogeneous, atol=1e-12)


# ---------------------------------------------------------------------- analytic backward, LTDL


from backdrive import RobotModel  # noqa: E402
from _robots import SMALL_URDF, SMALL_URDF_NO_MIMIC  # noqa: E402  (shared fixtures)

CASES = ["small_tree", "small_tree_floating", "no_mimic_floating", "panda", "panda_independent", "quadruped"]


def _robot(name: str) -> RobotModel:
    if name.startswith("small_tree"):
        rb = RobotModel.from_urdf(SMALL_URDF, floating_base=name.endswith("floating"))
    elif name == "no_mimic_floating":
        rb = RobotModel.from_urdf(SMALL_URDF_NO_MIMIC, floating_base=True)
    elif name == "panda_independent":  # fingers as independent joints
        rb = RobotModel.from_urdf(re.sub(r"<mimic[^>]*/>", "", get_data_path("panda").read_text()))
    else:
        rb = load(name, floating_base=name == "quadruped")
    g = torch.Generator().manual_seed(11)
    nj = rb.num_joints
    return rb.replace(
        damping=torch.rand(nj, generator=g, dtype=F64),
        friction=torch.rand(nj, generator=g, dtype=F64),
        armature=0.1 * torch.rand(nj, generator=g, dtype=F64),
    )


def _force_wide(request):
    """The fast path at every batch size until the test ends (the ``wide`` fixture)."""
    request.getfixturevalue("wide")


def _grads(robot, q, v, tau, f_ext, method):
    xs = [x.clone().requires_grad_(True) for x in (q, v, tau, f_ext)]
    acc = forward_dynamics(robot, *xs[:3], f_ext=xs[3], method=method)
    w = torch.linspace(-1.0, 1.0, acc.numel(), dtype=acc.dtype).reshape(acc.shape)
    return torch.autograd.grad((acc * w).sum() + acc.square().sum(), xs)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("wide_path", [False, True])
def test_analytic_backward_equals_autograd(name, wide_path, request):
    """method="auto" (analytic backward: M^-1 g and the reverse pass of RNEA)
    against plain autograd through CRBA and Cholesky (method="crba"), with
    respect to q, v, tau and f_ext, in float64 and float32."""
    robot = _robot(name)
    if wide_path:
        _force_wide(request)
    g = torch.Generator().manual_seed(12)
    # Not forced: 100 samples with a gradient take the fast path by batch size.
    n = 6 if wide_path else 100
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=F64)
    tau = torch.randn(n, robot.nv, generator=g, dtype=F64)
    f_ext = torch.randn(n, robot.num_bodies, 6, generator=g, dtype=F64)
    ref = _grads(robot, q, v, tau, f_ext, "crba")
    got = _grads(robot, q, v, tau, f_ext, "auto")
    for a, b, what in zip(got, ref, ("q", "v", "tau", "f_ext")):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8 * b.abs().max().item(), msg=what)
    # Without f_ext the reverse pass of RNEA is written out (no autograd).
    ref = _grads(robot, q, v, tau, torch.zeros_like(f_ext), "crba")[:3]
    xs = [x.clone().requires_grad_(True) for x in (q, v, tau)]
    acc = forward_dynamics(robot, *xs)
    w = torch.linspace(-1.0, 1.0, acc.numel(), dtype=F64).reshape(acc.shape)
    got = torch.autograd.grad((acc * w).sum() + acc.square().sum(), xs)
    for a, b, what in zip(got, ref, ("q", "v", "tau")):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8 * b.abs().max().item(), msg=what)
    # float32: the same gradients to float32 accuracy (times the mass matrix's condition number).
    r32 = robot.float()
    xs = [x.float().requires_grad_(True) for x in (q, v, tau)]
    acc = forward_dynamics(r32, *xs)
    got32 = torch.autograd.grad((acc * w.float()).sum() + acc.square().sum(), xs)
    for a, b, what in zip(got32, ref, ("q", "v", "tau")):
        err = (a.double() - b).abs().max().item()
        assert err <= 2e-2 * b.abs().max().item(), f"float32 gradient wrt {what}: error {err:.2e}"


@pytest.mark.parametrize("wide_path", [False, True])
def test_analytic_backward_parameters_and_gravity(wide_path, request):
    """Gradients reaching physical parameters and gravity through the analytic backward."""
    robot = _robot("no_mimic_floating")
    if wide_path:
        _force_wide(request)
    g = torch.Generator().manual_seed(13)
    n = 5 if wide_path else 100
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=F64)
    tau = torch.randn(n, robot.nv, generator=g, dtype=F64)
    names = ("body_mass", "body_com", "body_inertia", "damping", "friction", "armature", "gravity")

    def grads(method):
        leaves = [getattr(robot, k).clone().requires_grad_(True) for k in names]
        model = robot.replace(**dict(zip(names, leaves)))
        qq = q.clone().requires_grad_(True)
        forward_dynamics(model, qq, v, tau, method=method).square().sum().backward()
        return [x.grad for x in leaves] + [qq.grad]

    for a, b, what in zip(grads("auto"), grads("crba"), names + ("q",)):
        assert b.abs().sum() > 0, what
        if what == "body_inertia":
            # Inertias are symmetric; the Cholesky factorisation reads one
            # triangle, so only the symmetric part of the gradient is defined.
            a, b = a + a.transpose(-1, -2), b + b.transpose(-1, -2)
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8 * b.abs().max().item(), msg=what)


@pytest.mark.parametrize("name", ["small_tree_floating", "no_mimic_floating"])
def test_analytic_backward_gradcheck_and_double_backward(name, wide):
    robot = _robot(name)
    g = torch.Generator().manual_seed(14)
    q = robot.random_q(2, generator=g).requires_grad_(True)
    v = torch.randn(2, robot.nv, generator=g, dtype=F64, requires_grad=True)
    tau = torch.randn(2, robot.nv, generator=g, dtype=F64, requires_grad=True)
    fn = lambda q, v, t: forward_dynamics(robot, q, v, t)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, v, tau), eps=1e-6, atol=1e-5, rtol=1e-5)
    # create_graph: the backward falls back to plain autograd and is differentiable again.
    assert torch.autograd.gradgradcheck(fn, (q, v, tau), eps=1e-6, atol=1e-4, rtol=1e-4, fast_mode=True)


@pytest.mark.parametrize("name", CASES)
def test_rnea_reverse_pass_equals_autograd(name):
    robot = _robot(name)
    g = torch.Generator().manual_seed(15)
    q = robot.random_q(4, generator=g).requires_grad_(True)
    v = torch.randn(4, robot.nv, generator=g, dtype=F64, requires_grad=True)
    a = torch.randn(4, robot.nv, generator=g, dtype=F64)
    lam = torch.randn(4, robot.nv, generator=g, dtype=F64)
    tau = fast_mod.inverse_dynamics_fast(robot, q, v, a, robot.gravity)
    gq, gv = torch.autograd.grad(tau, (q, v), lam)
    hq, hv = fast_mod.rnea_vjp_fast(robot, q.detach(), v.detach(), a, robot.gravity, lam)
    torch.testing.assert_close(hq, gq, rtol=1e-10, atol=1e-10 * gq.abs().max().item())
    torch.testing.assert_close(hv, gv, rtol=1e-10, atol=1e-10 * gv.abs().max().item())


@pytest.mark.parametrize("name", ["no_mimic_floating", "panda_independent", "quadruped"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_ltdl_solve_equals_dense_solve(name, dtype):
    """The tree-sparse L^T D L factor of the mass matrix solves like a dense
    solve."""
    robot = _robot(name).to(dtype=dtype)
    g = torch.Generator().manual_seed(16)
    q = robot.random_q(7, generator=g)
    rhs = torch.randn(7, robot.nv, generator=g, dtype=dtype)
    _, factor = fast_mod.forward_fast(robot, q, rhs, rhs, robot.gravity, None)
    M = mass_matrix(robot.double(), q.double())
    want = torch.linalg.solve(M, rhs.double()[..., None])[..., 0]
    tol = 1e-9 if dtype == F64 else 2e-3
    torch.testing.assert_close(factor.solve(rhs).double(), want, rtol=tol, atol=tol * want.abs().max().item())


def test_batch_last_forward_kinematics_backward():
    """The hand-written backward of the batch-last forward kinematics (mimic,
    prismatic, floating base, unsorted levels) and its double backward."""
    for robot in (_robot("small_tree_floating"), _robot("quadruped")):
        q = robot.random_q(3, generator=torch.Generator().manual_seed(17)).requires_grad_(True)
        for level_order in (False, True):
            fn = lambda q: fk_mod.body_transforms_fast(robot, q, level_order)  # noqa: E731
            assert torch.autograd.gradcheck(fn, (q,))
            assert torch.autograd.gradgradcheck(fn, (q,), fast_mode=True)


def test_large_batch_forward_dynamics_matches_pinocchio_quadruped():
    """Above the switch-over (no forcing): the floating quadruped, whose depth
    levels are not in body order, against Pinocchio's aba, with the gradient
    against its ABA derivatives."""
    robot = load("quadruped", floating_base=True)
    path = str(get_data_path("quadruped"))
    pm = pin.buildModelFromUrdf(path, pin.JointModelFreeFlyer())
    pd = pm.createData()
    n = 100
    g = torch.Generator().manual_seed(18)
    q = robot.random_q(n, generator=g)
    v = torch.randn(n, robot.nv, generator=g, dtype=F64)
    tau = torch.randn(n, robot.nv, generator=g, dtype=F64)
    qq = q.clone().requires_grad_(True)
    tt = tau.clone().requires_grad_(True)
    acc = forward_dynamics(robot, qq, v, tt)
    (acc[:, 0].sum()).backward()
    # The gradient wrt q by the fast path's reverse pass of RNEA against
    # plain autograd on the reference path.
    q2 = q.clone().requires_grad_(True)
    (forward_dynamics(robot, q2, v, tau, method="crba")[:, 0].sum()).backward()
    torch.testing.assert_close(qq.grad, q2.grad, rtol=1e-8, atol=1e-8 * q2.grad.abs().max().item())
    for i in range(0, n, 9):
        qp = q[i].numpy().copy()
        qp[3:7] = qp[[4, 5, 6, 3]]
        want = pin.aba(pm, pd, qp, v[i].numpy(), tau[i].numpy())
        np.testing.assert_allclose(acc[i].detach().numpy(), want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
        pin.computeABADerivatives(pm, pd, qp, v[i].numpy(), tau[i].numpy())
        # d a / d tau = M^-1: its first row against Pinocchio's.
        np.testing.assert_allclose(tt.grad[i].numpy(), pd.Minv[0], rtol=1e-9, atol=1e-9 * np.abs(pd.Minv).max())


@pytest.mark.parametrize("name", ["no_mimic_floating", "panda_independent", "quadruped"])
def test_sparse_mass_matrix_equals_dense(name, request):
    """Without a gradient, mass_matrix at large batches scatters the sparse
    CRBA's entries; with one it keeps the differentiable dense path."""
    robot = _robot(name)
    q = robot.random_q(5, generator=torch.Generator().manual_seed(19))
    dense = mass_matrix(robot, q)
    _force_wide(request)
    sparse = mass_matrix(robot, q)
    assert torch.equal(sparse, sparse.transpose(-1, -2))
    torch.testing.assert_close(sparse, dense, rtol=1e-12, atol=1e-12 * dense.abs().max().item())
    qq = q.clone().requires_grad_(True)
    M = mass_matrix(robot, qq)
    assert M.requires_grad
    torch.testing.assert_close(M.detach(), dense, rtol=1e-12, atol=1e-12 * dense.abs().max().item())


def test_torch_func_transforms_take_the_plain_path(request):
    """jacrev / jacfwd through forward dynamics, inverse dynamics and the mass
    matrix on the large-batch paths: the custom backward passes and out=
    kernels step aside, and the Jacobians match plain autograd."""
    _force_wide(request)
    robot = _robot("no_mimic_floating")
    g = torch.Generator().manual_seed(20)
    q = robot.random_q(3, generator=g)
    v = torch.randn(3, robot.nv, generator=g, dtype=F64)
    tau = torch.randn(3, robot.nv, generator=g, dtype=F64)
    want = torch.autograd.functional.jacobian(lambda t: forward_dynamics(robot, q, v, t, method="crba"), tau)
    for jac in (torch.func.jacrev, torch.func.jacfwd):
        got = jac(lambda t: forward_dynamics(robot, q, v, t))(tau)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    want = torch.autograd.functional.jacobian(lambda x: inverse_dynamics(robot, q, x, tau), v)
    for jac in (torch.func.jacrev, torch.func.jacfwd):
        torch.testing.assert_close(jac(lambda x: inverse_dynamics(robot, q, x, tau))(v), want, rtol=1e-9, atol=1e-9)
    mass = robot.body_mass.clone()
    want = torch.autograd.functional.jacobian(lambda m: mass_matrix(robot.replace(body_mass=m), q), mass)
    got = torch.func.jacfwd(lambda m: mass_matrix(robot.replace(body_mass=m), q))(mass)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_batched_gravity_and_broadcast_batch_shapes(request):
    """Per-sample gravity, several batch axes and a broadcast q on the
    large-batch path, values and gradients, against the dense path."""
    robot = _robot("no_mimic_floating")
    g = torch.Generator().manual_seed(21)
    q = robot.random_q(1, generator=g)[0]  # broadcast against (2, 3)
    v = torch.randn(2, 3, robot.nv, generator=g, dtype=F64)
    tau = torch.randn(2, 3, robot.nv, generator=g, dtype=F64)
    grav = torch.randn(2, 3, 3, generator=g, dtype=F64)

    def run(method):
        qq, vv = q.clone().requires_grad_(True), v.clone().requires_grad_(True)
        acc = forward_dynamics(robot, qq, vv, tau, gravity=grav, method=method)
        acc.square().sum().backward()
        return acc.detach(), qq.grad, vv.grad

    want = run("crba")
    _force_wide(request)
    got = run("auto")
    assert got[0].shape == (2, 3, robot.nv) and got[1].shape == q.shape
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9 * b.abs().max().item())


@pytest.mark.parametrize("name", ["small_tree", "small_tree_floating", "quadruped"])
def test_fast_mass_matrix_gradcheck(name, wide):
    """The fast path's dense CRBA (mimic joints and gradients) against
    finite differences, and its values against the reference path."""
    robot = _robot(name)
    q = robot.random_q(2, generator=torch.Generator().manual_seed(22)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q: mass_matrix(robot, q), (q,))
    with use_path("reference"):
        want = mass_matrix(robot, q)
    torch.testing.assert_close(mass_matrix(robot, q), want, rtol=1e-12, atol=1e-12 * want.abs().max().item())


def test_use_path_rejects_unknown_names():
    from backdrive import InputError

    with pytest.raises(InputError, match="reference"):
        with use_path("wide"):
            pass

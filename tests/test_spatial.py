"""Property tests for backdrive.spatial: group axioms, round trips, broadcasting.

Random inputs come from a torch generator seeded by hypothesis, so each
example is a whole batch; hypothesis also picks the regime (generic angles,
tiny angles, angles close to pi) so near-singular samples are always in the
mix. Numerics at exact singular points and gradients live in
``test_spatial_numerics.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import backdrive.spatial as sp

BATCH_SHAPES = [(), (5,), (2, 3)]
DTYPES = [torch.float32, torch.float64]
# Named tolerances: float32 round trips to ~1e-6, float64 to ~1e-15.
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
# How close to pi a "round trip" angle may get: the sign of the axis must be
# decidable from sin(angle) >> eps (at pi itself log(exp(w)) may return -w).
PI_GAP = {torch.float32: 1e-3, torch.float64: 1e-9}
REGIMES = ["generic", "tiny", "near_pi"]

seeds = st.integers(min_value=0, max_value=2**31 - 1)
regimes = st.sampled_from(REGIMES)
few = settings(max_examples=12, deadline=None)

grid = pytest.mark.parametrize(
    "batch_shape,dtype",
    [(b, d) for b in BATCH_SHAPES for d in DTYPES],
    ids=[f"{b}-{str(d).split('.')[-1]}" for b in BATCH_SHAPES for d in DTYPES],
)


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, scale: float = 1.0):
    tol = TOL[dtype] * scale
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=tol, rtol=tol)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sample_angles(shape, g, regime: str, dtype: torch.dtype) -> torch.Tensor:
    """Angles in [0, pi - PI_GAP] for ``regime``, made in float64."""
    u = torch.rand(shape, dtype=torch.float64, generator=g)
    gap = PI_GAP[dtype]
    if regime == "generic":
        return u * (math.pi - gap)
    if regime == "tiny":
        return 10.0 ** (-12.0 + 10.0 * u)  # 1e-12 .. 1e-2 rad
    lo, hi = math.log10(gap), math.log10(0.5)
    return math.pi - 10.0 ** (lo + (hi - lo) * u)  # pi - 0.5 .. pi - gap


def sample_rotvec(shape, g, regime: str, dtype: torch.dtype) -> torch.Tensor:
    axis = torch.randn(*shape, 3, dtype=torch.float64, generator=g)
    axis = axis / axis.norm(dim=-1, keepdim=True)
    return (axis * sample_angles(shape, g, regime, dtype).unsqueeze(-1)).to(dtype)


def sample_transform(shape, g, regime: str, dtype: torch.dtype) -> torch.Tensor:
    R = sp.so3_exp(sample_rotvec(shape, g, regime, dtype).double())
    p = torch.randn(*shape, 3, dtype=torch.float64, generator=g)
    return sp.make_transform(R, p).to(dtype)


def se3_hat(xi: torch.Tensor) -> torch.Tensor:
    """4x4 matrix of a twist [v; w]: [[skew(w), v], [0, 0]]."""
    top = torch.cat((sp.skew(xi[..., 3:]), xi[..., :3].unsqueeze(-1)), -1)
    return torch.cat((top, torch.zeros_like(top[..., :1, :])), -2)


def exp_ref(xi: torch.Tensor) -> torch.Tensor:
    """so3 (xi of shape (..., 3)) or se3 (xi of shape (..., 6) = [v; w]) exponential,
    in 50-digit mpmath arithmetic, correctly rounded to float64.

    Not torch.linalg.matrix_exp: for a single matrix of norm ~0.01-0.05 it is
    only good to ~1e-10 in float64 (torch 2.13, CPU).
    """
    import mpmath
    flat = xi.detach().double().reshape(-1, xi.shape[-1])
    out = []
    with mpmath.workdps(50):
        for row in flat.tolist():
            x = [mpmath.mpf(r) for r in row]
            wx, wy, wz = x[-3:]
            K = mpmath.matrix([[0, -wz, wy], [wz, 0, -wx], [-wy, wx, 0]])
            t2 = wx * wx + wy * wy + wz * wz
            t = mpmath.sqrt(t2)
            if t2 == 0:
                A, B, C = mpmath.mpf(1), mpmath.mpf(1) / 2, mpmath.mpf(1) / 6
            else:
                s, c = mpmath.sin(t), mpmath.cos(t)
                A, B, C = s / t, (1 - c) / t2, (t - s) / (t2 * t)
            R = mpmath.eye(3) + A * K + B * K * K
            if len(x) == 3:
                out.append([[float(R[i, j]) for j in range(3)] for i in range(3)])
                continue
            p = (mpmath.eye(3) + B * K + C * K * K) * mpmath.matrix(x[:3])
            rows = [[float(R[i, j]) for j in range(3)] + [float(p[i])] for i in range(3)]
            out.append(rows + [[0.0, 0.0, 0.0, 1.0]])
    n = 3 if xi.shape[-1] == 3 else 4
    return torch.tensor(out, dtype=torch.float64).reshape(*xi.shape[:-1], n, n)


def same_rotation_quat(q1: torch.Tensor, q2: torch.Tensor, dtype: torch.dtype):
    """q1 == +-q2 (the double cover), compared in one sign per element."""
    sign = torch.where((q1 * q2).sum(-1, keepdim=True) < 0, -1.0, 1.0).to(q1.dtype)
    close(q1, sign * q2, dtype)


# --------------------------------------------------------------------------- API


EXPECTED_PUBLIC = {
    "skew", "unskew", "so3_exp", "so3_log", "rotvec_to_matrix", "matrix_to_rotvec",
    "quat_to_matrix", "matrix_to_quat", "quat_multiply", "quat_conjugate", "quat_inverse",
    "quat_normalize", "quat_apply", "rotvec_to_quat", "quat_to_rotvec", "quat_identity",
    "random_quat", "random_rotation", "rpy_to_matrix", "matrix_to_rpy", "make_transform",
    "transform_inverse", "transform_compose", "transform_point", "se3_exp", "se3_log",
    "adjoint", "adjoint_inverse", "identity_transform", "random_transform",
    "is_rigid_transform", "pose_error",
}  # fmt: skip


def test_all_resolves():
    assert len(sp.__all__) == len(set(sp.__all__)), "duplicate names in __all__"
    assert set(sp.__all__) == EXPECTED_PUBLIC
    for name in sp.__all__:
        obj = getattr(sp, name)
        assert callable(obj), name
        assert obj.__doc__, f"{name} has no docstring"
    namespace: dict = {}
    exec("from backdrive.spatial import *", namespace)
    assert EXPECTED_PUBLIC <= set(namespace)


def test_aliases():
    assert sp.rotvec_to_matrix is sp.so3_exp
    assert sp.matrix_to_rotvec is sp.so3_log


def test_errors_are_clear():
    R32 = torch.eye(3, dtype=torch.float32)
    p64 = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="dtype"):
        sp.make_transform(R32, p64)
    with pytest.raises(TypeError, match="dtype"):
        sp.transform_compose(torch.eye(4), torch.eye(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="dtype"):
        sp.pose_error(torch.eye(4), torch.eye(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\(\.\.\., 3\)"):
        sp.so3_exp(torch.zeros(4))
    with pytest.raises(ValueError, match=r"\(\.\.\., 4, 4\)"):
        sp.se3_log(torch.eye(3))
    with pytest.raises(TypeError, match="floating"):
        sp.skew(torch.zeros(3, dtype=torch.int64))


# ------------------------------------------------------------------ factories


@pytest.mark.parametrize("dtype", DTYPES)
def test_factories_shapes_dtypes(dtype):
    assert sp.quat_identity((2, 3), dtype=dtype).shape == (2, 3, 4)
    assert sp.quat_identity(dtype=dtype).tolist() == [1.0, 0.0, 0.0, 0.0]
    T = sp.identity_transform(4, dtype=dtype)
    assert T.shape == (4, 4, 4) and T.dtype == dtype
    assert torch.equal(T, torch.eye(4, dtype=dtype).expand(4, 4, 4))
    T[0, 0, 0] = 2.0  # a fresh tensor: writing must not alias the others
    assert T[1, 0, 0] == 1.0
    for make in (sp.random_quat, sp.random_rotation, sp.random_transform):
        a = make(2, 3, dtype=dtype, generator=gen(0))
        b = make((2, 3), dtype=dtype, generator=gen(0))
        assert a.dtype == dtype and a.shape[:2] == (2, 3)
        assert torch.equal(a, b), "batch shape as varargs or tuple, same draw"
    assert sp.random_quat(dtype=dtype).shape == (4,)
    q = sp.random_quat(1000, dtype=dtype, generator=gen(1))
    close(q.norm(dim=-1), torch.ones(1000, dtype=dtype), dtype)
    assert bool((q[:, 0] >= 0).all())
    assert bool(sp.is_rigid_transform(sp.random_transform(50, dtype=dtype)).all())


def test_factories_default_dtype():
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        assert sp.random_rotation(2).dtype == torch.float64
        assert sp.identity_transform().dtype == torch.float64
        assert sp.quat_identity().dtype == torch.float64
    finally:
        torch.set_default_dtype(old)


def test_random_rotation_is_uniform():
    # Haar measure: E[R] = 0, E[trace R] = 0; 20k samples give ~0.01 noise.
    R = sp.random_rotation(20000, dtype=torch.float64, generator=gen(3))
    assert R.mean(0).abs().max() < 0.03
    assert sp.so3_log(R).norm(dim=-1).mean() == pytest.approx(math.pi / 2 + 2 / math.pi, abs=0.03)


# ------------------------------------------------------------- SO(3) / SE(3)


@grid
@given(seed=seeds, regime=regimes)
@few
def test_skew_unskew(batch_shape, dtype, seed, regime):
    g = gen(seed)
    v = torch.randn(*batch_shape, 3, dtype=dtype, generator=g)
    u = torch.randn(*batch_shape, 3, dtype=dtype, generator=g)
    S = sp.skew(v)
    assert S.shape == (*batch_shape, 3, 3) and S.dtype == dtype
    close(S, -S.transpose(-1, -2), dtype)
    close((S @ u.unsqueeze(-1)).squeeze(-1), torch.linalg.cross(v, u, dim=-1), dtype)
    assert torch.equal(sp.unskew(S), v)
    M = torch.randn(*batch_shape, 3, 3, dtype=dtype, generator=g)
    close(sp.skew(sp.unskew(M)), 0.5 * (M - M.transpose(-1, -2)), dtype)


@grid
@given(seed=seeds, regime=regimes)
@few
def test_so3_exp_log_round_trip(batch_shape, dtype, seed, regime):
    g = gen(seed)
    w = sample_rotvec(batch_shape, g, regime, dtype)
    R = sp.so3_exp(w)
    assert R.shape == (*batch_shape, 3, 3) and R.dtype == dtype
    close(R, exp_ref(w), dtype)
    assert bool(sp.is_rigid_transform(sp.make_transform(R, torch.zeros_like(w))).all())
    w_back = sp.so3_log(R)
    assert w_back.dtype == dtype
    close(w_back, w, dtype)
    close(sp.so3_exp(w_back), R, dtype)
    # exp(log(R)) == R for any rotation, including those at pi.
    Rr = sp.random_rotation(batch_shape, dtype=dtype, generator=g)
    close(sp.so3_exp(sp.so3_log(Rr)), Rr, dtype)
    assert bool((sp.so3_log(Rr).norm(dim=-1) <= math.pi + TOL[dtype]).all())


@grid
@given(seed=seeds, regime=regimes)
@few
def test_se3_exp_log_round_trip(batch_shape, dtype, seed, regime):
    g = gen(seed)
    w = sample_rotvec(batch_shape, g, regime, dtype)
    v = torch.randn(*batch_shape, 3, dtype=dtype, generator=g)
    xi = torch.cat((v, w), -1)
    T = sp.se3_exp(xi)
    assert T.shape == (*batch_shape, 4, 4) and T.dtype == dtype
    close(T, exp_ref(xi), dtype, scale=4)
    close(sp.se3_log(T), xi, dtype, scale=4)
    T2 = sample_transform(batch_shape, g, regime, dtype)
    close(sp.se3_exp(sp.se3_log(T2)), T2, dtype, scale=4)


def test_se3_log_is_not_translation_concat():
    # The proper log: for a screw motion v != p. Rotation about z by pi/2
    # while moving along a circle: p = V v.
    xi = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, math.pi / 2], dtype=torch.float64)
    T = sp.se3_exp(xi)
    assert not torch.allclose(T[:3, 3], xi[:3])
    p_expected = torch.tensor([2 / math.pi, 2 / math.pi, 0.0], dtype=torch.float64)
    torch.testing.assert_close(T[:3, 3], p_expected, atol=1e-15, rtol=0)
    torch.testing.assert_close(sp.se3_log(T), xi, atol=1e-15, rtol=0)


@grid
@given(seed=seeds, regime=regimes)
@few
def test_transform_group_axioms(batch_shape, dtype, seed, regime):
    g = gen(seed)
    T1, T2, T3 = (sample_transform(batch_shape, g, regime, dtype) for _ in range(3))
    c = sp.transform_compose
    close(c(c(T1, T2), T3), c(T1, c(T2, T3)), dtype, scale=4)
    close(c(T1, T2), T1 @ T2, dtype)
    I = sp.identity_transform(batch_shape, dtype=dtype)
    close(c(T1, I), T1, dtype)
    close(c(I, T1), T1, dtype)
    Tinv = sp.transform_inverse(T1)
    close(c(T1, Tinv), I, dtype)
    close(c(Tinv, T1), I, dtype)
    close(Tinv, torch.linalg.inv(T1.double()), dtype, scale=4)
    assert bool(sp.is_rigid_transform(c(T1, T2)).all())
    # exp is a one-parameter group: exp(a xi) exp(b xi) = exp((a + b) xi).
    xi = sp.se3_log(T1)
    close(c(sp.se3_exp(0.25 * xi), sp.se3_exp(0.75 * xi)), T1, dtype, scale=4)


@grid
@given(seed=seeds, regime=regimes)
@few
def test_transform_point(batch_shape, dtype, seed, regime):
    g = gen(seed)
    T = sample_transform(batch_shape, g, regime, dtype)
    p = torch.randn(*batch_shape, 3, dtype=dtype, generator=g)
    hom = torch.cat((p, torch.ones_like(p[..., :1])), -1)
    close(sp.transform_point(T, p), (T @ hom.unsqueeze(-1)).squeeze(-1)[..., :3], dtype)
    close(sp.transform_point(sp.transform_inverse(T), sp.transform_point(T, p)), p, dtype, scale=4)


@grid
@given(seed=seeds, regime=regimes)
@few
def test_adjoint(batch_shape, dtype, seed, regime):
    g = gen(seed)
    T = sample_transform(batch_shape, g, regime, dtype)
    T2 = sample_transform(batch_shape, g, "generic", dtype)
    xi = torch.randn(*batch_shape, 6, dtype=dtype, generator=g)
    Ad = sp.adjoint(T)
    assert Ad.shape == (*batch_shape, 6, 6) and Ad.dtype == dtype
    Ad_xi = (Ad @ xi.unsqueeze(-1)).squeeze(-1)
    # Log-free definition: hat(Ad(T) xi) = T hat(xi) T^-1.
    close(se3_hat(Ad_xi), T @ se3_hat(xi) @ sp.transform_inverse(T), dtype, scale=4)
    close(sp.adjoint_inverse(T), sp.adjoint(sp.transform_inverse(T)), dtype)
    close(sp.adjoint_inverse(T) @ Ad, torch.eye(6, dtype=dtype).expand_as(Ad), dtype, scale=4)
    close(sp.adjoint(sp.transform_compose(T, T2)), Ad @ sp.adjoint(T2), dtype, scale=4)
    # Ad moves a twist through exp: T exp(xi) T^-1 = exp(Ad(T) xi).
    small = 0.3 * xi
    lhs = sp.transform_compose(sp.transform_compose(T, sp.se3_exp(small)), sp.transform_inverse(T))
    close(lhs, sp.se3_exp(0.3 * Ad_xi), dtype, scale=10)


# ---------------------------------------------------------------- quaternions


@grid
@given(seed=seeds, regime=regimes)
@few
def test_quaternion_round_trips(batch_shape, dtype, seed, regime):
    g = gen(seed)
    w = sample_rotvec(batch_shape, g, regime, dtype)
    q = sp.rotvec_to_quat(w)
    assert q.shape == (*batch_shape, 4) and q.dtype == dtype
    close(q.norm(dim=-1), torch.ones(batch_shape, dtype=dtype), dtype)
    R = sp.so3_exp(w)
    close(sp.quat_to_matrix(q), R, dtype)
    close(sp.quat_to_rotvec(q), w, dtype)
    close(sp.quat_to_rotvec(-q), w, dtype)  # double cover
    q_from_R = sp.matrix_to_quat(R)
    assert bool((q_from_R[..., 0] >= 0).all())
    same_rotation_quat(q_from_R, q, dtype)
    close(sp.quat_to_matrix(q_from_R), R, dtype)
    close(sp.matrix_to_rotvec(R), sp.quat_to_rotvec(q_from_R), dtype)
    # Random quaternions, any sign.
    qr = sp.random_quat(batch_shape, dtype=dtype, generator=g)
    qr = torch.where(torch.rand(*batch_shape, 1, generator=g) < 0.5, qr, -qr).to(dtype)
    same_rotation_quat(sp.matrix_to_quat(sp.quat_to_matrix(qr)), qr, dtype)
    same_rotation_quat(sp.rotvec_to_quat(sp.quat_to_rotvec(qr)), qr, dtype)


@grid
@given(seed=seeds, regime=regimes)
@few
def test_quaternion_algebra(batch_shape, dtype, seed, regime):
    g = gen(seed)
    a = sp.rotvec_to_quat(sample_rotvec(batch_shape, g, regime, dtype))
    b = sp.random_quat(batch_shape, dtype=dtype, generator=g)
    c = sp.random_quat(batch_shape, dtype=dtype, generator=g)
    m = sp.quat_multiply
    Ra, Rb = sp.quat_to_matrix(a), sp.quat_to_matrix(b)
    close(sp.quat_to_matrix(m(a, b)), Ra @ Rb, dtype)
    close(m(m(a, b), c), m(a, m(b, c)), dtype)
    ident = sp.quat_identity(batch_shape, dtype=dtype)
    close(m(a, ident), a, dtype)
    close(m(ident, a), a, dtype)
    close(m(a, sp.quat_inverse(a)), ident, dtype)
    close(m(sp.quat_conjugate(a), a), ident, dtype)
    scaled = 3.0 * b
    close(m(scaled, sp.quat_inverse(scaled)), ident, dtype)
    close(sp.quat_normalize(scaled), b, dtype)
    # quat_to_matrix accepts a drifted norm: same rotation as the unit quaternion.
    close(sp.quat_to_matrix(scaled), Rb, dtype)
    v = torch.randn(*batch_shape, 3, dtype=dtype, generator=g)
    close(sp.quat_apply(a, v), (Ra @ v.unsqueeze(-1)).squeeze(-1), dtype, scale=4)


# ----------------------------------------------------------------------- rpy


@grid
@given(seed=seeds)
@few
def test_rpy_round_trip(batch_shape, dtype, seed):
    g = gen(seed)
    u = torch.rand(*batch_shape, 3, dtype=torch.float64, generator=g) * 2 - 1
    # Away from gimbal lock (|pitch| <= pi/2 - 0.05) and from the +-pi wrap.
    limits = torch.tensor([math.pi - 0.01, math.pi / 2 - 0.05, math.pi - 0.01], dtype=torch.float64)
    rpy = (u * limits).to(dtype)
    R = sp.rpy_to_matrix(rpy)
    assert R.shape == (*batch_shape, 3, 3) and R.dtype == dtype
    roll, pitch, yaw = rpy.double().unbind(-1)
    Rx = sp.so3_exp(torch.stack((roll, 0 * roll, 0 * roll), -1))
    Ry = sp.so3_exp(torch.stack((0 * pitch, pitch, 0 * pitch), -1))
    Rz = sp.so3_exp(torch.stack((0 * yaw, 0 * yaw, yaw), -1))
    close(R, Rz @ Ry @ Rx, dtype)  # URDF: fixed-axis X, then Y, then Z
    close(sp.matrix_to_rpy(R), rpy, dtype, scale=10)
    # And R -> rpy -> R for arbitrary rotations (incl. any pitch).
    Rr = sp.random_rotation(batch_shape, dtype=dtype, generator=g)
    close(sp.rpy_to_matrix(sp.matrix_to_rpy(Rr)), Rr, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pitch_sign", [1.0, -1.0])
def test_rpy_gimbal_lock(dtype, pitch_sign):
    # Exactly at gimbal lock: roll is set to 0, yaw carries the rest; R is reproduced.
    rpy = torch.tensor([0.3, pitch_sign * math.pi / 2, -1.1], dtype=dtype)
    R = sp.rpy_to_matrix(rpy)
    out = sp.matrix_to_rpy(R)
    close(sp.rpy_to_matrix(out), R, dtype)
    assert float(out[0]) == 0.0
    assert float(out[1]) == pytest.approx(pitch_sign * math.pi / 2, abs=TOL[dtype])
    # Gradients stay finite at the lock (the roll branch gets a safe input).
    R_req = R.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(sp.matrix_to_rpy(R_req).sum(), R_req)
    assert torch.isfinite(grad).all()


# ---------------------------------------------------------------- pose_error


@grid
@given(seed=seeds, regime=regimes)
@few
def test_pose_error(batch_shape, dtype, seed, regime):
    g = gen(seed)
    pose = sample_transform(batch_shape, g, "generic", dtype)
    delta = sample_transform(batch_shape, g, regime, dtype)
    target = sp.transform_compose(delta, pose)  # delta applied in the world frame
    pos_err, rot_err = sp.pose_error(pose, target)
    assert pos_err.shape == rot_err.shape == (*batch_shape, 3)
    assert pos_err.dtype == rot_err.dtype == dtype
    close(pos_err, target[..., :3, 3] - pose[..., :3, 3], dtype)
    # The rotation error takes the achieved orientation to the target, in the world frame.
    close(rot_err, sp.so3_log(delta[..., :3, :3]), dtype, scale=4)
    close(sp.so3_exp(rot_err) @ pose[..., :3, :3], target[..., :3, :3], dtype, scale=4)
    zero_p, zero_r = sp.pose_error(pose, pose)
    close(zero_p, torch.zeros_like(zero_p), dtype)
    close(zero_r, torch.zeros_like(zero_r), dtype)


# ------------------------------------------------------ broadcasting and dtypes


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcasting(dtype):
    g = gen(7)
    A = sp.random_transform(5, 1, dtype=dtype, generator=g)
    B = sp.random_transform(3, dtype=dtype, generator=g)
    AB = sp.transform_compose(A, B)
    assert AB.shape == (5, 3, 4, 4)
    close(AB, A @ B, dtype)
    pos, rot = sp.pose_error(A, B)
    assert pos.shape == rot.shape == (5, 3, 3)
    pos_ref, rot_ref = sp.pose_error(A.expand(5, 3, 4, 4), B.expand(5, 3, 4, 4))
    close(pos, pos_ref, dtype)
    close(rot, rot_ref, dtype)
    p = torch.randn(3, 3, dtype=dtype, generator=g)
    assert sp.transform_point(A, p).shape == (5, 3, 3)
    qa = sp.random_quat(5, 1, dtype=dtype, generator=g)
    qb = sp.random_quat(3, dtype=dtype, generator=g)
    assert sp.quat_multiply(qa, qb).shape == (5, 3, 4)
    assert sp.quat_apply(qa, p).shape == (5, 3, 3)
    R = sp.random_rotation(5, 1, dtype=dtype, generator=g)
    T = sp.make_transform(R, p)
    assert T.shape == (5, 3, 4, 4)
    close(T[..., :3, 3], p.expand(5, 3, 3), dtype)
    close(T[..., :3, :3], R.expand(5, 3, 3, 3), dtype)


_UNARY = {
    "skew": (lambda x: sp.skew(x), "v3"),
    "unskew": (lambda x: sp.unskew(x), "R"),
    "so3_exp": (sp.so3_exp, "v3"),
    "so3_log": (sp.so3_log, "R"),
    "quat_to_matrix": (sp.quat_to_matrix, "q"),
    "matrix_to_quat": (sp.matrix_to_quat, "R"),
    "quat_conjugate": (sp.quat_conjugate, "q"),
    "quat_inverse": (sp.quat_inverse, "q"),
    "quat_normalize": (sp.quat_normalize, "q"),
    "rotvec_to_quat": (sp.rotvec_to_quat, "v3"),
    "quat_to_rotvec": (sp.quat_to_rotvec, "q"),
    "rpy_to_matrix": (sp.rpy_to_matrix, "v3"),
    "matrix_to_rpy": (sp.matrix_to_rpy, "R"),
    "transform_inverse": (sp.transform_inverse, "T"),
    "se3_exp": (sp.se3_exp, "v6"),
    "se3_log": (sp.se3_log, "T"),
    "adjoint": (sp.adjoint, "T"),
    "adjoint_inverse": (sp.adjoint_inverse, "T"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(_UNARY))
def test_dtype_and_batch_preserved(name, dtype):
    fn, kind = _UNARY[name]
    g = gen(11)
    inputs = {
        "v3": torch.randn(2, 3, 3, dtype=dtype, generator=g),
        "v6": torch.randn(2, 3, 6, dtype=dtype, generator=g),
        "q": sp.random_quat(2, 3, dtype=dtype, generator=g),
        "R": sp.random_rotation(2, 3, dtype=dtype, generator=g),
        "T": sp.random_transform(2, 3, dtype=dtype, generator=g),
    }
    out = fn(inputs[kind])
    assert out.dtype == dtype
    assert out.shape[:2] == (2, 3)
    # Batched result equals the per-element result (no mixing across the batch).
    single = fn(inputs[kind][1, 2])
    close(out[1, 2], single, dtype)


def test_is_rigid_transform():
    T = sp.random_transform(4, dtype=torch.float64, generator=gen(5))
    assert sp.is_rigid_transform(T).tolist() == [True] * 4
    bad = T.clone()
    bad[0, :3, :3] *= 1.01  # scaled
    bad[1, :3, 0] *= -1.0  # reflection: orthonormal, det -1
    bad[2, 3, 0] = 0.1  # bottom row
    bad[3, 0, 1] = float("nan")
    assert sp.is_rigid_transform(bad).tolist() == [False] * 4
    T32 = T.float()
    assert bool(sp.is_rigid_transform(T32).all())
    nearly = T.clone()
    nearly[..., 0, 0] += 1e-6
    assert not bool(sp.is_rigid_transform(nearly).any())
    assert bool(sp.is_rigid_transform(nearly, tol=1e-5).all())
    assert sp.is_rigid_transform(T).dtype == torch.bool


# Every device this machine has (CPU always; CUDA where present).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_device_matches_cpu_reference(device):
    T = sp.random_transform(64, dtype=torch.float64, generator=gen(2))
    Tc = T.to(device)
    log = sp.se3_log(Tc)
    assert log.device.type == device
    torch.testing.assert_close(log.cpu(), sp.se3_log(T), atol=1e-12, rtol=0)
    q_dev = sp.matrix_to_quat(Tc[:, :3, :3]).cpu()
    torch.testing.assert_close(q_dev, sp.matrix_to_quat(T[:, :3, :3]), atol=1e-12, rtol=0)
    q = sp.random_quat(8, dtype=torch.float32, device=device)
    assert q.device.type == device

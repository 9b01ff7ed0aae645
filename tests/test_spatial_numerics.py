"""Numerics of backdrive.spatial at its branch points, and its derivatives.

References are computed in 60-digit arithmetic with mpmath (a dependency of
torch, through sympy): closed-form Rodrigues / SE(3) exponentials, themselves
checked against mpmath's matrix exponential, and central differences for the
Jacobians. ``torch.linalg.matrix_exp`` is not used as a float64 reference: for
a single 3x3 matrix with norm between ~0.01 and ~0.05 it is only accurate to
~1e-10 (measured with torch 2.13, CPU), which is looser than what is tested
here. Rotations by exactly pi are built exactly as ``2 a a^T - I`` from
dyadic unit vectors ``a``.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from torch.autograd import gradcheck
from torch.autograd.functional import jacobian

import backdrive.spatial as sp

F64 = torch.float64
EXACT = 1e-12  # the float64 accuracy the branches promise
# Float64 small-angle switch used by the implementation: eps ** (1/8).
THR64 = torch.finfo(F64).eps ** 0.125

TINY = [1e-9, 1e-6, 1e-4]
NEAR_PI = [math.pi - 1e-6, math.pi - 1e-9]
ANGLES = (
    [0.0]
    + TINY
    + [THR64 * (1 - 1e-9), THR64 * (1 + 1e-9), 0.3, 1.0, math.pi / 2, 2.0, 3.0]
    + NEAR_PI
    + [math.pi]
)


def axis(seed: int = 0) -> torch.Tensor:
    a = torch.randn(3, dtype=F64, generator=torch.Generator().manual_seed(seed))
    return a / a.norm()


def rotvec(angle: float, seed: int = 0) -> torch.Tensor:
    return angle * axis(seed)


def skew_ref(w: torch.Tensor) -> torch.Tensor:
    """skew(w) built by hand, independently of the code under test."""
    x, y, z = w.unbind(-1)
    o = torch.zeros_like(x)
    return torch.stack(
        (torch.stack((o, -z, y), -1), torch.stack((z, o, -x), -1), torch.stack((-y, x, o), -1)), -2
    )


DPS = 60  # digits for the references


def _mp_coefficients(w):
    """K, A = sin t/t, B = (1 - cos t)/t^2, C = (t - sin t)/t^3 in mpmath."""
    x, y, z = w
    K = mpmath.matrix([[0, -z, y], [z, 0, -x], [-y, x, 0]])
    t2 = x * x + y * y + z * z
    if t2 == 0:
        return K, mpmath.mpf(1), mpmath.mpf(1) / 2, mpmath.mpf(1) / 6
    t = mpmath.sqrt(t2)
    s, c = mpmath.sin(t), mpmath.cos(t)
    return K, s / t, (1 - c) / t2, (t - s) / (t2 * t)


def mp_so3_exp(w):
    K, A, B, _ = _mp_coefficients(w)
    return mpmath.eye(3) + A * K + B * K * K


def mp_se3_exp(xi):
    K, A, B, C = _mp_coefficients(xi[3:])
    R = mpmath.eye(3) + A * K + B * K * K
    p = (mpmath.eye(3) + B * K + C * K * K) * mpmath.matrix(xi[:3])
    T = mpmath.eye(4)
    for i in range(3):
        T[i, 3] = p[i]
        for j in range(3):
            T[i, j] = R[i, j]
    return T


def _mp_to_torch(M) -> torch.Tensor:
    return torch.tensor([[float(M[i, j]) for j in range(M.cols)] for i in range(M.rows)], dtype=F64)


def _mp_apply(mp_fn, x: torch.Tensor) -> torch.Tensor:
    with mpmath.workdps(DPS):
        return _mp_to_torch(mp_fn([mpmath.mpf(float(v)) for v in x]))


def exp_ref(w: torch.Tensor) -> torch.Tensor:
    """so3 exponential of rotation vectors (..., 3), correctly rounded to float64."""
    flat = w.reshape(-1, 3)
    return torch.stack([_mp_apply(mp_so3_exp, x) for x in flat]).reshape(*w.shape, 3)


def se3_exp_ref(xi: torch.Tensor) -> torch.Tensor:
    """se3 exponential of one twist [v; w], correctly rounded to float64."""
    return _mp_apply(mp_se3_exp, xi)


def jacobian_ref(mp_fn, x: torch.Tensor) -> torch.Tensor:
    """Jacobian (out..., n) of ``mp_fn`` at ``x`` by 60-digit central differences."""
    cols = []
    with mpmath.workdps(DPS):
        h = mpmath.mpf(10) ** -20
        base = [mpmath.mpf(float(v)) for v in x]
        for k in range(len(base)):
            plus = list(base)
            minus = list(base)
            plus[k] += h
            minus[k] -= h
            cols.append(_mp_to_torch((mp_fn(plus) - mp_fn(minus)) / (2 * h)))
    return torch.stack(cols, -1)


def pi_rotation(a: torch.Tensor) -> torch.Tensor:
    """Rotation by pi about unit ``a``: 2 a a^T - I (exact for dyadic ``a``)."""
    return 2.0 * a.unsqueeze(-1) * a.unsqueeze(-2) - torch.eye(3, dtype=a.dtype)


def assert_exact(actual, expected, tol=EXACT):
    torch.testing.assert_close(actual, expected, atol=tol, rtol=0)


def assert_finite_grad(fn, x: torch.Tensor, what: str):
    x = x.detach().clone().requires_grad_(True)
    out = fn(x)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(0)
    loss = sum((o * torch.randn(o.shape, dtype=o.dtype, generator=g)).sum() for o in outs)
    (grad,) = torch.autograd.grad(loss, x)
    assert torch.isfinite(grad).all(), f"non-finite gradient of {what}: {grad}"
    return grad


# ------------------------------------------------------------- exactness


@pytest.mark.parametrize("angle", [1e-6, 0.03, 1.0, math.pi])
def test_reference_matches_mpmath_expm(angle):
    """The closed-form references agree with mpmath's own matrix exponential."""
    xi = torch.cat((torch.tensor([0.5, 0.2, -0.4], dtype=F64), rotvec(angle, seed=11)))
    with mpmath.workdps(DPS):
        x = [mpmath.mpf(float(v)) for v in xi]
        hat = mpmath.zeros(4, 4)
        K, _, _, _ = _mp_coefficients(x[3:])
        for i in range(3):
            hat[i, 3] = x[i]
            for j in range(3):
                hat[i, j] = K[i, j]
        diff = mpmath.expm(hat) - mp_se3_exp(x)
        assert max(abs(diff[i, j]) for i in range(4) for j in range(4)) < mpmath.mpf(10) ** -40


@pytest.mark.parametrize("angle", ANGLES)
def test_so3_exp_exact(angle):
    w = rotvec(angle)
    assert_exact(sp.so3_exp(w), exp_ref(w))


@pytest.mark.parametrize("angle", ANGLES[:-1])  # below pi: the log is unique
def test_so3_log_exact(angle):
    w = rotvec(angle, seed=1)
    R = exp_ref(w)  # reference matrix, independent of so3_exp
    w_log = sp.so3_log(R)
    assert_exact(w_log, w)
    assert_exact(sp.so3_exp(w_log), R)
    assert_exact(sp.quat_to_rotvec(sp.matrix_to_quat(R)), w)
    assert_exact(sp.quat_to_rotvec(sp.rotvec_to_quat(w)), w)


@pytest.mark.parametrize("angle", ANGLES)
def test_se3_exact(angle):
    w = rotvec(angle, seed=2)
    v = torch.tensor([0.3, -1.2, 2.0], dtype=F64)
    xi = torch.cat((v, w))
    T_ref = se3_exp_ref(xi)
    assert_exact(sp.se3_exp(xi), T_ref)
    assert_exact(sp.se3_exp(sp.se3_log(T_ref)), T_ref)
    if angle < math.pi:
        assert_exact(sp.se3_log(T_ref), xi)


@pytest.mark.parametrize("angle", ANGLES)
def test_quaternion_exact(angle):
    w = rotvec(angle, seed=3)
    half = 0.5 * angle
    q_ref = torch.cat((torch.tensor([math.cos(half)], dtype=F64), math.sin(half) * axis(3)))
    assert_exact(sp.rotvec_to_quat(w), q_ref)
    R = exp_ref(w)
    assert_exact(sp.quat_to_matrix(q_ref), R)
    q = sp.matrix_to_quat(R)
    sign = 1.0 if float((q * q_ref).sum()) >= 0 else -1.0
    assert_exact(q, sign * q_ref)


def test_log_exactly_pi_coordinate_axes():
    diag = torch.diag
    t = lambda *v: torch.tensor(v, dtype=F64)  # noqa: E731
    assert torch.equal(sp.so3_log(diag(t(1.0, -1.0, -1.0))), t(math.pi, 0.0, 0.0))
    assert torch.equal(sp.so3_log(diag(t(-1.0, 1.0, -1.0))), t(0.0, math.pi, 0.0))
    assert torch.equal(sp.so3_log(diag(t(-1.0, -1.0, 1.0))), t(0.0, 0.0, math.pi))
    q = sp.matrix_to_quat(diag(t(-1.0, -1.0, 1.0)))
    assert torch.equal(q, t(0.0, 0.0, 0.0, 1.0))


# Dyadic unit vectors: 2 a a^T - I is exactly representable.
PI_AXES = [(0.6, -0.8, 0.0), (-0.6, 0.0, 0.8), (0.0, -0.8, -0.6), (-1 / 3 * 2, 1 / 3, 2 / 3)]


@pytest.mark.parametrize("a", PI_AXES)
def test_log_exactly_pi_sign_rule(a):
    """At exactly pi, the axis component with the largest R[i, i] is positive."""
    a = torch.tensor(a, dtype=F64)
    a = a / a.norm()
    R = pi_rotation(a)
    k = int(torch.diagonal(R).argmax())
    expected = math.pi * a * (1.0 if a[k] > 0 else -1.0)
    w = sp.so3_log(R)
    assert_exact(w, expected)
    assert_exact(sp.so3_exp(w), R)
    # matrix_to_quat picks the same representative: w = 0, q_k > 0.
    q = sp.matrix_to_quat(R)
    assert abs(float(q[0])) <= EXACT
    assert_exact(sp.quat_to_rotvec(q), expected)
    # pose_error inherits the rule.
    target = sp.make_transform(R, torch.zeros(3, dtype=F64))
    _, rot_err = sp.pose_error(sp.identity_transform(dtype=F64), target)
    assert_exact(rot_err, expected)


# Exactly pi with ties on the diagonal of R: about (1, -1, 0)/sqrt(2)
# (R[0, 0] == R[1, 1] == 0) and about (1, -1, -1)/sqrt(3) (all three -1/3).
PI_TIES = {
    "two_way": ([[0.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, -1.0]], (1.0, -1.0, 0.0)),
    "three_way": (
        [[-1 / 3, -2 / 3, -2 / 3], [-2 / 3, -1 / 3, 2 / 3], [-2 / 3, 2 / 3, -1 / 3]],
        (1.0, -1.0, -1.0),
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("case", sorted(PI_TIES))
def test_log_exactly_pi_ties_take_the_first_index(case, dtype):
    """On a tie of R[i, i] the first index decides the sign (as torch.argmax)."""
    rows, a = PI_TIES[case]
    R = torch.tensor(rows, dtype=dtype)
    a = torch.tensor(a, dtype=dtype)
    expected = math.pi * a / a.norm()
    tol = EXACT if dtype == F64 else 1e-6
    assert_exact(sp.so3_log(R), expected, tol)
    assert_exact(sp.quat_to_rotvec(sp.matrix_to_quat(R)), expected, tol)
    _, rot_err = sp.pose_error(sp.identity_transform(dtype=dtype), sp.make_transform(R, torch.zeros(3, dtype=dtype)))
    assert_exact(rot_err, expected, tol)
    # the same in a batch, and with finite gradients
    batch = torch.stack([R, torch.eye(3, dtype=dtype), R])
    assert torch.equal(sp.so3_log(batch)[0], sp.so3_log(R))
    assert torch.equal(sp.so3_log(batch)[2], sp.so3_log(R))
    assert_finite_grad(sp.so3_log, batch, "so3_log")
    assert_finite_grad(sp.matrix_to_quat, batch, "matrix_to_quat")


@pytest.mark.parametrize("gap", [1e-6, 1e-9])
def test_log_near_pi_flips_across_the_cut(gap):
    """Just below pi the log follows the axis; just above it, the opposite one."""
    a = axis(4)
    below = sp.so3_log(exp_ref((math.pi - gap) * a))
    above = sp.so3_log(exp_ref((math.pi + gap) * a))
    assert_exact(below, (math.pi - gap) * a)
    assert_exact(above, -(math.pi - gap) * a)
    _, rot_err = sp.pose_error(
        sp.identity_transform(dtype=F64),
        sp.make_transform(exp_ref((math.pi + gap) * a), torch.zeros(3, dtype=F64)),
    )
    assert_exact(rot_err, -(math.pi - gap) * a)


def test_log_batch_mixes_all_branches():
    """One batch through every branch equals each element done alone."""
    a = axis(5)
    angles = [0.0, 1e-9, 1e-3, 0.5, 1.6, 3.0, math.pi - 1e-9]
    w = torch.stack([t * a for t in angles] + [math.pi * torch.tensor([1.0, 0, 0], dtype=F64)])
    R = exp_ref(w)
    batch = sp.so3_log(R)
    for i in range(len(w)):
        assert torch.equal(batch[i], sp.so3_log(R[i]))
    assert_exact(batch[:-1], w[:-1])


def test_float32_branches():
    """float32 gets its own thresholds: accurate to ~1e-6 at every angle.

    Within float32 rounding of pi (1e-6, 1e-9 away) the axis sign is not
    decidable, so there only exp(log(R)) == R and |log R| are checked.
    """
    a = axis(6)
    for angle in ANGLES:
        w = angle * a
        R32 = exp_ref(w).float()
        w_log = sp.so3_log(R32)
        if angle < math.pi - 1e-3:
            torch.testing.assert_close(w_log, w.float(), atol=2e-6, rtol=0)
        else:
            assert abs(float(w_log.norm()) - angle) < 2e-6
        torch.testing.assert_close(sp.so3_exp(w_log), R32, atol=2e-6, rtol=0)
        torch.testing.assert_close(sp.so3_exp(w.float()), R32, atol=1e-6, rtol=0)
        q = sp.matrix_to_quat(R32)
        torch.testing.assert_close(sp.quat_to_matrix(q), R32, atol=1e-6, rtol=0)


# ---------------------------------------------------- NaN regression (grads)


def _zero_and_pi_inputs():
    a = axis(7)
    return {
        "zero": torch.eye(3, dtype=F64),
        "pi_x": torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=F64)),
        "pi_exact_dyadic": pi_rotation(torch.tensor([0.6, -0.8, 0.0], dtype=F64)),
        "pi_from_exp": sp.so3_exp(math.pi * a),
    }


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("case", ["zero", "pi_x", "pi_exact_dyadic", "pi_from_exp"])
def test_gradients_finite_at_zero_and_pi(case, dtype):
    R = _zero_and_pi_inputs()[case].to(dtype)
    p = torch.tensor([0.1, -0.2, 0.3], dtype=dtype)
    T = sp.make_transform(R, p)
    assert_finite_grad(sp.so3_log, R, "so3_log")
    assert_finite_grad(sp.matrix_to_quat, R, "matrix_to_quat")
    assert_finite_grad(sp.matrix_to_rpy, R, "matrix_to_rpy")
    assert_finite_grad(sp.se3_log, T, "se3_log")
    I4 = sp.identity_transform(dtype=dtype)
    assert_finite_grad(lambda t: sp.pose_error(I4, t), T, "pose_error(target)")
    assert_finite_grad(lambda t: sp.pose_error(t, T), I4, "pose_error(pose)")
    q = sp.matrix_to_quat(R)
    assert_finite_grad(sp.quat_to_rotvec, q, "quat_to_rotvec")
    w = sp.so3_log(R)
    assert_finite_grad(sp.so3_exp, w, "so3_exp")
    assert_finite_grad(sp.rotvec_to_quat, w, "rotvec_to_quat")
    assert_finite_grad(sp.se3_exp, torch.cat((p, w)), "se3_exp")


def test_gradient_values_at_zero():
    # d exp(w)/dw at 0 is skew(e_k) per component.
    J = jacobian(sp.so3_exp, torch.zeros(3, dtype=F64))
    assert_exact(J, skew_ref(torch.eye(3, dtype=F64)).permute(1, 2, 0))
    # d log(R)/dR at I: log(I + dR) = vee((dR - dR^T)/2), so grad of g.log is skew(g)/2.
    g = torch.tensor([0.3, -0.5, 0.7], dtype=F64)
    R = torch.eye(3, dtype=F64, requires_grad=True)
    (grad,) = torch.autograd.grad((sp.so3_log(R) * g).sum(), R)
    assert_exact(grad, 0.5 * skew_ref(g))
    # pose_error at zero error: the rotation error moves like the world-frame rotation.
    zero3 = torch.zeros(3, dtype=F64)

    def rot_err(w):
        return sp.pose_error(torch.eye(4, dtype=F64), sp.make_transform(sp.so3_exp(w), zero3))[1]

    assert_exact(jacobian(rot_err, zero3), torch.eye(3, dtype=F64))
    J = jacobian(lambda w: sp.quat_to_rotvec(sp.rotvec_to_quat(w)), torch.zeros(3, dtype=F64))
    assert_exact(J, torch.eye(3, dtype=F64))


@pytest.mark.parametrize("R_case", ["pi_x", "pi_exact_dyadic", "pi_from_exp"])
def test_gradient_at_exactly_pi_is_the_one_sided_derivative(R_case):
    """At pi the gradient is that of the chart with the returned axis held fixed:
    d/dt log(exp((pi - t) a)) = -a for the returned a."""
    R = _zero_and_pi_inputs()[R_case]
    w_pi = sp.so3_log(R)
    a = w_pi / w_pi.norm()
    assert_exact(w_pi.norm(), torch.tensor(math.pi, dtype=F64))
    t0 = torch.zeros((), dtype=F64)
    # R(t) = R exp(-t a): the angle decreases from pi along the returned axis.
    d = jacobian(lambda t: sp.so3_log(R @ sp.so3_exp(-t * a)), t0)
    assert torch.isfinite(d).all()
    assert_exact(d, -a, tol=1e-9)


@pytest.mark.parametrize("angle", ANGLES)
def test_so3_exp_jacobian_exact(angle):
    w = rotvec(angle, seed=8)
    J = jacobian(sp.so3_exp, w)
    assert_exact(J, jacobian_ref(mp_so3_exp, w))


@pytest.mark.parametrize("angle", ANGLES)
def test_se3_exp_jacobian_exact(angle):
    xi = torch.cat((torch.tensor([0.5, 0.2, -0.4], dtype=F64), rotvec(angle, seed=9)))
    J = jacobian(sp.se3_exp, xi)
    assert_exact(J, jacobian_ref(mp_se3_exp, xi))


@pytest.mark.parametrize("angle", ANGLES[:-1])
def test_log_jacobian_inverts_exp_jacobian(angle):
    """d(log o exp)/dw = I to 1e-12 on every branch, below pi (measured ~1e-15)."""
    w = rotvec(angle, seed=10)
    eye3 = torch.eye(3, dtype=F64)

    def via_quat(x):
        return sp.quat_to_rotvec(sp.matrix_to_quat(sp.so3_exp(x)))

    assert_exact(jacobian(lambda x: sp.so3_log(sp.so3_exp(x)), w), eye3)
    assert_exact(jacobian(via_quat, w), eye3)
    assert_exact(jacobian(lambda x: sp.quat_to_rotvec(sp.rotvec_to_quat(x)), w), eye3)
    xi = torch.cat((torch.tensor([0.5, 0.2, -0.4], dtype=F64), w))
    assert_exact(jacobian(lambda x: sp.se3_log(sp.se3_exp(x)), xi), torch.eye(6, dtype=F64))


# ------------------------------------------------------------- gradcheck


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rot(angle, seed, batch=2):
    a = torch.randn(batch, 3, dtype=F64, generator=_gen(seed))
    return sp.so3_exp(angle * a / a.norm(dim=-1, keepdim=True))


def _req(x):
    return x.detach().clone().requires_grad_(True)


@pytest.mark.parametrize("angle", [1e-3, 0.7, 2.0, 3.0])  # small, generic and both big branches
def test_gradcheck_so3(angle):
    a = torch.randn(2, 3, dtype=F64, generator=_gen(1))
    w = _req(angle * a / a.norm(dim=-1, keepdim=True))
    assert gradcheck(sp.so3_exp, (w,))
    assert gradcheck(sp.rotvec_to_quat, (w,))
    # so3_log and matrix_to_quat on all nine entries (also off the manifold).
    R = _req(_rot(angle, 2))
    assert gradcheck(sp.so3_log, (R,))
    assert gradcheck(sp.matrix_to_quat, (R,))


@pytest.mark.parametrize("angle", [1e-3, 0.7, 3.0])
def test_gradcheck_se3(angle):
    g = _gen(3)
    w = angle * torch.nn.functional.normalize(torch.randn(2, 3, dtype=F64, generator=g), dim=-1)
    xi = _req(torch.cat((torch.randn(2, 3, dtype=F64, generator=g), w), -1))
    assert gradcheck(sp.se3_exp, (xi,))
    T = _req(sp.se3_exp(xi.detach()))
    assert gradcheck(sp.se3_log, (T,))
    assert gradcheck(sp.adjoint, (T,))
    assert gradcheck(sp.adjoint_inverse, (T,))
    assert gradcheck(sp.transform_inverse, (T,))
    T2 = _req(sp.random_transform(2, dtype=F64, generator=g))
    assert gradcheck(sp.transform_compose, (T, T2))
    assert gradcheck(sp.transform_point, (T, _req(torch.randn(2, 3, dtype=F64, generator=g))))


def test_gradcheck_quaternions_and_rpy():
    g = _gen(4)
    q = _req(sp.random_quat(3, dtype=F64, generator=g))
    q2 = _req(sp.random_quat(3, dtype=F64, generator=g))
    assert gradcheck(sp.quat_to_matrix, (q,))
    assert gradcheck(sp.quat_to_rotvec, (q,))
    assert gradcheck(sp.quat_multiply, (q, q2))
    assert gradcheck(sp.quat_apply, (q, _req(torch.randn(3, 3, dtype=F64, generator=g))))
    assert gradcheck(sp.quat_inverse, (q,))
    assert gradcheck(sp.quat_normalize, (q,))
    rpy = _req(torch.tensor([[0.3, -0.4, 2.0], [-2.5, 1.2, -0.1]], dtype=F64))
    assert gradcheck(sp.rpy_to_matrix, (rpy,))
    assert gradcheck(sp.matrix_to_rpy, (_req(sp.rpy_to_matrix(rpy.detach())),))
    small_q = _req(sp.rotvec_to_quat(torch.tensor([1e-4, -2e-4, 5e-5], dtype=F64)))
    assert gradcheck(sp.quat_to_rotvec, (small_q,))


@pytest.mark.parametrize("angle", [1e-3, 0.7, 3.0])
def test_gradcheck_pose_error(angle):
    g = _gen(5)
    pose = sp.random_transform(2, dtype=F64, generator=g)
    delta = sp.make_transform(_rot(angle, 6), torch.randn(2, 3, dtype=F64, generator=g))
    target = sp.transform_compose(delta, pose)
    assert gradcheck(sp.pose_error, (_req(pose), _req(target)))

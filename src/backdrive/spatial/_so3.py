"""SO(3): skew matrices, the exponential and logarithm maps, URDF roll-pitch-yaw.

Rotation vectors are ``theta * axis`` with ``theta`` in radians. Every branch
point (zero angle, angle pi, gimbal lock) is handled with a ``torch.where``
whose untaken side is fed a safe input: ``torch.where`` back-propagates
``0 * grad`` into the untaken side, and ``0 * inf`` or ``0 * nan`` is ``nan``,
so an untaken side that is merely "not used" still poisons the gradient.
"""

from __future__ import annotations

import math

import torch

from ._common import check_matrix, check_vector, small_angle_threshold

__all__ = [
    "skew",
    "unskew",
    "so3_exp",
    "so3_log",
    "rotvec_to_matrix",
    "matrix_to_rotvec",
    "rpy_to_matrix",
    "matrix_to_rpy",
]


def skew(v: torch.Tensor) -> torch.Tensor:
    """Skew-symmetric (cross-product) matrix of a 3-vector.

    ``skew(v) @ u == cross(v, u)``::

        skew(v) = [[ 0,  -vz,  vy],
                   [ vz,  0,  -vx],
                   [-vy,  vx,  0 ]]

    Args:
        v: Vectors, shape ``(..., 3)``.

    Returns:
        Skew-symmetric matrices, shape ``(..., 3, 3)``.
    """
    check_vector(v, 3, "v")
    x, y, z = v.unbind(-1)
    o = torch.zeros_like(x)
    return torch.stack(
        (
            torch.stack((o, -z, y), -1),
            torch.stack((z, o, -x), -1),
            torch.stack((-y, x, o), -1),
        ),
        -2,
    )


def unskew(S: torch.Tensor) -> torch.Tensor:
    """Vector of the skew-symmetric part of a 3x3 matrix (the "vee" map).

    Returns ``v`` with ``skew(v) == (S - S^T) / 2``; for a skew-symmetric ``S``
    that is the exact inverse of :func:`skew`. Using the antisymmetric part
    (rather than picking three entries) makes the map a projection, so its
    gradient is the same whichever entries a caller perturbs.

    Args:
        S: Matrices, shape ``(..., 3, 3)``.

    Returns:
        Vectors, shape ``(..., 3)``.
    """
    check_matrix(S, 3, 3, "S")
    return _vee_antisym(S)


def _vee_antisym(S: torch.Tensor) -> torch.Tensor:
    # vee((S - S^T) / 2) without validation, for internal use.
    return 0.5 * torch.stack(
        (
            S[..., 2, 1] - S[..., 1, 2],
            S[..., 0, 2] - S[..., 2, 0],
            S[..., 1, 0] - S[..., 0, 1],
        ),
        -1,
    )


def _eye3(like: torch.Tensor) -> torch.Tensor:
    return torch.eye(3, dtype=like.dtype, device=like.device)


def _sqrt_safe(x2: torch.Tensor, use: torch.Tensor) -> torch.Tensor:
    # sqrt(x2) where `use`, sqrt(1) elsewhere: the untaken side of a where must
    # not see sqrt'(0) = inf, or its masked 0 * inf gradient turns into nan.
    return torch.sqrt(torch.where(use, x2, torch.ones_like(x2)))


def rodrigues_coefficients(
    theta2: torch.Tensor, with_c: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Coefficients of the SO(3)/SE(3) exponentials as functions of ``theta**2``.

    ``A = sin(t)/t``, ``B = (1 - cos t)/t**2``, ``C = (t - sin t)/t**3``.
    Taking ``theta**2`` (not ``theta``) keeps ``sqrt`` out of the small-angle
    branch, whose derivative is therefore finite at exactly zero.

    Args:
        theta2: Squared angles, shape ``(...)``.
        with_c: Also compute ``C`` (needed by the SE(3) maps only).

    Returns:
        ``(A, B, C)``, each shape ``(...)``; ``C`` is ``None`` unless requested.
    """
    thr = small_angle_threshold(theta2.dtype)
    small = theta2 < thr * thr
    t2 = theta2
    # Taylor series (Horner form), truncation error < eps below the threshold.
    a_small = 1.0 - t2 / 6.0 * (1.0 - t2 / 20.0 * (1.0 - t2 / 42.0 * (1.0 - t2 / 72.0)))
    b_small = 0.5 - t2 / 24.0 * (1.0 - t2 / 30.0 * (1.0 - t2 / 56.0 * (1.0 - t2 / 90.0)))
    theta = _sqrt_safe(theta2, ~small)
    t2_safe = theta * theta
    sin_t = torch.sin(theta)
    a_large = sin_t / theta
    # (1 - cos t)/t^2 written as sinc(t/2)^2 / 2: no cancellation at small t.
    half = 0.5 * theta
    sinc_half = torch.sin(half) / half
    b_large = 0.5 * sinc_half * sinc_half
    A = torch.where(small, a_small, a_large)
    B = torch.where(small, b_small, b_large)
    C = None
    if with_c:
        c_small = (1.0 / 6.0) - t2 / 120.0 * (
            1.0 - t2 / 42.0 * (1.0 - t2 / 72.0 * (1.0 - t2 / 110.0))
        )
        c_large = (theta - sin_t) / (t2_safe * theta)
        C = torch.where(small, c_small, c_large)
    return A, B, C


def so3_exp(rotvec: torch.Tensor) -> torch.Tensor:
    """Rotation matrix of a rotation vector (Rodrigues' formula).

    ``R = I + A K + B K^2`` with ``K = skew(rotvec)``, ``A = sin(t)/t``,
    ``B = (1 - cos t)/t^2`` and ``t = |rotvec|``. Below a dtype-dependent
    angle (``eps**(1/8)``) ``A`` and ``B`` come from their Taylor series in
    ``t**2``, so the result and its gradient are exact and finite at ``t = 0``.
    Any angle is accepted (``t > pi`` wraps around as expected).

    Args:
        rotvec: Rotation vectors ``theta * axis`` (rad), shape ``(..., 3)``.

    Returns:
        Rotation matrices, shape ``(..., 3, 3)``.
    """
    check_vector(rotvec, 3, "rotvec")
    theta2 = (rotvec * rotvec).sum(-1)
    A, B, _ = rodrigues_coefficients(theta2)
    # K^2 = w w^T - t^2 I, so R = (1 - B t^2) I + A K + B w w^T.
    # 1 - B t^2 equals cos(t) exactly (B t^2 = 2 sin^2(t/2)).
    cos_t = 1.0 - B * theta2
    K = skew(rotvec)
    outer = rotvec.unsqueeze(-1) * rotvec.unsqueeze(-2)
    eye = _eye3(rotvec)
    return (
        cos_t[..., None, None] * eye
        + A[..., None, None] * K
        + B[..., None, None] * outer
    )


def so3_log(R: torch.Tensor) -> torch.Tensor:
    """Rotation vector of a rotation matrix, with angle in ``[0, pi]``.

    With ``c = (trace(R) - 1)/2 = cos(t)`` and ``v = vee((R - R^T)/2) =
    sin(t) * axis``, three branches keep float64 results exact to ~1e-15:

    * small angle (``c > 0`` and ``|v| < eps**(1/8)``): ``v * t/sin(t)`` with
      ``t/sin(t) = asin(s)/s`` as a Taylor series in ``s**2 = |v|**2`` (no
      ``sqrt``, so the gradient at the identity is finite: it is
      ``d log(R) = vee((dR - dR^T)/2)``);
    * generic (``c > 0``): ``v * atan2(|v|, c) / |v|``;
    * near pi (``c <= 0``): ``v`` is too small to give the axis accurately, so
      the axis comes from the symmetric part, ``(R + R^T)/2 - c I =
      (1 - c) axis axis^T``: its column ``k = argmax_i R[i, i]`` (the largest
      diagonal entry, hence the largest ``|axis_k|``) is normalised, its sign
      is chosen so that ``axis . v >= 0`` (``sin t >= 0``), and
      ``t = pi - atan2(axis . v, -c)``.

    Branch cut at pi:
        A rotation by exactly pi about ``a`` equals one about ``-a``. The sign
        of the returned axis is decided by the skew part ``v = sin(t) a``:

        * exactly at pi (``v == 0``, e.g. ``diag(1, -1, -1)`` or
          ``2 a a^T - I``) the result is ``pi * a`` with ``a[k] > 0`` for
          ``k = argmax_i R[i, i]`` (first index on ties), i.e. the axis
          component of largest magnitude is positive;
        * below pi the result is the true ``t * a`` as long as ``sin(t)``
          exceeds the rounding error of ``R`` (float64: ``t < pi - 1e-15``
          or so; float32: ``t < pi - 1e-6``); closer than that, either sign
          may come back, each a correct logarithm to rounding;
        * a rotation by ``pi + d`` about ``a`` comes back as ``(pi - d)(-a)``:
          the map jumps to the other end of the diameter.

        The gradient is finite everywhere, exactly at pi included, where it
        is the derivative of the smooth chart ``R -> t * a`` with the
        returned sign of ``a`` held fixed: correct for perturbations that
        reduce the angle, while those that would carry it past pi flip the
        direction instead.

    Args:
        R: Rotation matrices, shape ``(..., 3, 3)``.

    Returns:
        Rotation vectors ``theta * axis`` (rad), ``theta`` in ``[0, pi]``,
        shape ``(..., 3)``.
    """
    check_matrix(R, 3, 3, "R")
    return so3_log_parts(R)[0]


def so3_log_parts(R: torch.Tensor, batch_last: bool = False):
    """:func:`so3_log` without validation, with the intermediates of its branches.

    The one implementation of the logarithm: :func:`so3_log` returns its
    first output, and the IK solver's closed-form backward
    (``backdrive.kinematics._ik``) is written against the intermediates.
    Everything is elementwise on the nine entries of ``R``, so the same code
    serves both layouts; the choice of column ``k`` (first largest diagonal
    entry) is made with comparisons and ``torch.where`` rather than
    ``argmax``/``gather`` on a strided diagonal, which is an order of
    magnitude slower for large batches.

    Args:
        R: ``(..., 3, 3)`` rotations, or with ``batch_last`` ``(3, 3, M)``.
        batch_last: the matrix axes lead and vectors come back as ``(3, M)``.

    Returns:
        ``(rotvec, parts)``: rotvec ``(..., 3)`` (or ``(3, M)``), and ``parts =
        (v, c, s, s2, atan, f, near_pi, small, e0, e1, axis0, inv_n, sign,
        sin_t, theta_pi)`` with ``v``, ``axis0`` vectors and the rest per
        sample: ``v = vee((R - R^T)/2)``, ``c = (tr R - 1)/2``, ``s2 = |v|^2``,
        ``s = |v|`` on the generic branch (1 elsewhere), ``atan = atan2(s,
        c)``, ``f = t/sin t`` (regular branches), the masks ``near_pi``,
        ``small``, and ``e0``/``e1`` (``k == 0``/``k == 1``), the unit column
        ``axis0`` before its sign, ``inv_n`` its reciprocal norm, ``sign =
        +-1``, ``sin_t = |axis0 . v|`` and the angle ``theta_pi`` of the
        near-pi branch.
    """
    if batch_last:
        vdim = 0
        rows = R.unbind(0)
        (r00, r01, r02), (r10, r11, r12), (r20, r21, r22) = (row.unbind(0) for row in rows)

        def per(x: torch.Tensor) -> torch.Tensor:
            return x
    else:
        vdim = -1
        rows = R.unbind(-2)
        (r00, r01, r02), (r10, r11, r12), (r20, r21, r22) = (row.unbind(-1) for row in rows)

        def per(x: torch.Tensor) -> torch.Tensor:
            return x.unsqueeze(-1)

    dtype = R.dtype
    c = 0.5 * (r00 + r11 + r22 - 1.0)
    v = 0.5 * torch.stack((r21 - r12, r02 - r20, r10 - r01), vdim)
    s2 = (v * v).sum(vdim)
    thr = small_angle_threshold(dtype)
    near_pi = c <= 0.0
    small = (~near_pi) & (s2 < thr * thr)
    generic = ~(near_pi | small)

    # Small angle: t/sin t = asin(s)/s = 1 + s^2/6 + 3 s^4/40 + 5 s^6/112 + 35 s^8/1152.
    # Valid because c > 0 means t < pi/2. A polynomial in s^2: no sqrt at s = 0.
    f_small = 1.0 + s2 * (1.0 / 6.0 + s2 * (3.0 / 40.0 + s2 * (5.0 / 112.0 + s2 * (35.0 / 1152.0))))
    # Generic: t/sin t with sin t = |v|; |v| is computed from a safe input off
    # this branch (sqrt'(0) = inf at the identity and at pi).
    s = _sqrt_safe(s2, generic)
    atan = torch.atan2(s, c)
    f = torch.where(small, f_small, atan / s)
    regular = v * per(f)

    # Near pi: axis from the symmetric part (R + R^T)/2 - c I, its column
    # k = argmax_i R[i, i] (first index on ties, as torch.argmax), picked
    # entry by entry with comparisons and torch.where.
    e0 = (r00 >= r11) & (r00 >= r22)
    e1 = (~e0) & (r11 >= r22)
    s01 = 0.5 * (r01 + r10)
    s02 = 0.5 * (r02 + r20)
    s12 = 0.5 * (r12 + r21)
    col = torch.stack(
        (
            torch.where(e0, r00 - c, torch.where(e1, s01, s02)),
            torch.where(e0, s01, torch.where(e1, r11 - c, s12)),
            torch.where(e0, s02, torch.where(e1, s12, r22 - c)),
        ),
        vdim,
    )
    n2 = (col * col).sum(vdim)
    # Off this branch col can be exactly zero (R = I); normalise by 1 there so
    # the masked gradient stays finite. On it, |col| >= (1 - c)/sqrt(3) >= 0.58.
    inv_n = torch.rsqrt(torch.where(near_pi, n2, torch.ones_like(n2)))
    axis0 = col * per(inv_n)
    dot = (axis0 * v).sum(vdim)  # = sin(t) * (+-1)
    sign = torch.where(dot < 0.0, -torch.ones_like(dot), torch.ones_like(dot))
    sin_t = dot * sign  # >= 0 (or -0.0: harmless, atan2(-0.0, x > 0) = -0.0)
    # atan2 around (sin t, -c) ~ (0, 1): smooth, finite gradient even at t = pi,
    # unlike acos(c) or atan2(|v|, c). On the untaken side c > 0 keeps the
    # argument away from the origin, so its gradient is finite too.
    theta_pi = math.pi - torch.atan2(sin_t, -c)
    rotvec_pi = axis0 * per(sign * theta_pi)

    out = torch.where(per(near_pi), rotvec_pi, regular)
    parts = (v, c, s, s2, atan, f, near_pi, small, e0, e1, axis0, inv_n, sign, sin_t, theta_pi)
    return out, parts


#: Alias of :func:`so3_exp`.
rotvec_to_matrix = so3_exp
#: Alias of :func:`so3_log`.
matrix_to_rotvec = so3_log


def rpy_to_matrix(rpy: torch.Tensor) -> torch.Tensor:
    """Rotation matrix of URDF roll-pitch-yaw angles.

    URDF's ``rpy`` are fixed-axis X-Y-Z rotations:
    ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``.

    Args:
        rpy: ``[roll, pitch, yaw]`` (rad), shape ``(..., 3)``.

    Returns:
        Rotation matrices, shape ``(..., 3, 3)``.
    """
    check_vector(rpy, 3, "rpy")
    cr, cp, cy = torch.cos(rpy).unbind(-1)
    sr, sp, sy = torch.sin(rpy).unbind(-1)
    return torch.stack(
        (
            torch.stack((cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr), -1),
            torch.stack((sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr), -1),
            torch.stack((-sp, cp * sr, cp * cr), -1),
        ),
        -2,
    )


def matrix_to_rpy(R: torch.Tensor) -> torch.Tensor:
    """URDF roll-pitch-yaw angles of a rotation matrix.

    Inverse of :func:`rpy_to_matrix` with ``pitch`` in ``[-pi/2, pi/2]`` and
    ``roll``, ``yaw`` in ``(-pi, pi]``. Roll is ``atan2(R21, R22)``; pitch and
    yaw are then read from ``R @ Rx(-roll) = Rz(yaw) @ Ry(pitch)``, whose
    entries are unit-norm pairs, so ``R -> rpy -> R`` reproduces ``R`` to
    rounding even close to gimbal lock.

    Gimbal lock (``pitch = +-pi/2``, detected as ``R21**2 + R22**2`` below
    ``eps**2``): roll and yaw are not separable; roll is set to 0 and yaw
    carries the whole rotation about the vertical. Gradients stay finite
    there (the roll branch is fed a safe input), but near the lock they are
    as large as the problem's conditioning (~1/cos(pitch)).

    Args:
        R: Rotation matrices, shape ``(..., 3, 3)``.

    Returns:
        ``[roll, pitch, yaw]`` (rad), shape ``(..., 3)``.
    """
    check_matrix(R, 3, 3, "R")
    eps = torch.finfo(R.dtype).eps
    r21 = R[..., 2, 1]
    r22 = R[..., 2, 2]
    lock = r21 * r21 + r22 * r22 < eps * eps
    # atan2'(0, 0) is nan: give the untaken side (0, 1) at the lock.
    y_in = torch.where(lock, torch.zeros_like(r21), r21)
    x_in = torch.where(lock, torch.ones_like(r22), r22)
    roll = torch.where(lock, torch.zeros_like(r21), torch.atan2(y_in, x_in))
    cr = torch.cos(roll)
    sr = torch.sin(roll)
    # Columns of R @ Rx(-roll): col1 = (-sy, cy, 0), col2 = (cy sp, sy sp, cp).
    cp = r21 * sr + r22 * cr
    pitch = torch.atan2(-R[..., 2, 0], cp)
    yaw = torch.atan2(R[..., 0, 2] * sr - R[..., 0, 1] * cr, R[..., 1, 1] * cr - R[..., 1, 2] * sr)
    return torch.stack((roll, pitch, yaw), -1)

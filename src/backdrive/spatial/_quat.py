"""Unit quaternions, scalar first (``wxyz``), Hamilton product.

``q = [cos(t/2), sin(t/2) * axis]`` rotates by ``t`` about ``axis``; ``q`` and
``-q`` are the same rotation. Functions that *return* a quaternion from a
matrix or a rotation vector say which of the two they pick.
"""

from __future__ import annotations

import torch

from ._common import (
    BatchShape,
    as_batch_shape,
    check_matrix,
    check_same_dtype_device,
    check_vector,
    parse_batch_shape,
    resolve_dtype,
    small_angle_threshold,
)

__all__ = [
    "quat_to_matrix",
    "matrix_to_quat",
    "quat_multiply",
    "quat_conjugate",
    "quat_inverse",
    "quat_normalize",
    "quat_apply",
    "rotvec_to_quat",
    "quat_to_rotvec",
    "quat_identity",
    "random_quat",
    "random_rotation",
]


def quat_to_matrix(quat_wxyz: torch.Tensor) -> torch.Tensor:
    """Rotation matrix of a quaternion.

    Uses ``s = 2 / |q|**2`` in place of 2, so a quaternion that has drifted off
    unit norm still maps to an orthonormal matrix (that of ``q / |q|``).

    Args:
        quat_wxyz: Quaternions ``[w, x, y, z]``, nonzero, shape ``(..., 4)``.

    Returns:
        Rotation matrices, shape ``(..., 3, 3)``.
    """
    check_vector(quat_wxyz, 4, "quat_wxyz")
    if quat_wxyz.requires_grad and torch.is_grad_enabled() and not _transforms_active():
        return _QuatToMatrix.apply(quat_wxyz)
    return _quat_to_matrix(quat_wxyz)


def _transforms_active() -> bool:
    """``backdrive.kinematics._paths.transforms_active`` (imported late: the
    kinematics package imports this one)."""
    from ..kinematics._paths import transforms_active

    return transforms_active()


def _quat_to_matrix(quat_wxyz: torch.Tensor) -> torch.Tensor:
    w, x, y, z = quat_wxyz.unbind(-1)
    s = 2.0 / (w * w + x * x + y * y + z * z)
    xx, yy, zz = s * x * x, s * y * y, s * z * z
    xy, xz, yz = s * x * y, s * x * z, s * y * z
    wx, wy, wz = s * w * x, s * w * y, s * w * z
    return torch.stack(
        (
            torch.stack((1.0 - (yy + zz), xy - wz, xz + wy), -1),
            torch.stack((xy + wz, 1.0 - (xx + zz), yz - wx), -1),
            torch.stack((xz - wy, yz + wx, 1.0 - (xx + yy)), -1),
        ),
        -2,
    )


class _QuatToMatrix(torch.autograd.Function):
    """:func:`quat_to_matrix` with the backward written out: one autograd node
    instead of about 40 at batch 1 (the formula's products and stacks).

    With ``n = |q|^2``, ``s = 2 / n`` and ``R = I + s Q(q)`` (``Q`` quadratic),
    the gradient of ``<G, R>`` is ``s [u . a, (G + G^T) u - 2 tr(G) u + w a]``
    (``u = [x, y, z]``, ``a`` the vector of ``G - G^T``: ``(G_21 - G_12,
    G_02 - G_20, G_10 - G_01)``) plus ``-(2 / n) (<G, R> - tr G) q`` from
    ``s``. Under ``create_graph`` the backward differentiates the plain
    formula, so double backward works."""

    @staticmethod
    def forward(ctx, quat):
        R = _quat_to_matrix(quat)
        ctx.save_for_backward(quat, R)
        return R

    @staticmethod
    def backward(ctx, G):
        quat, R = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: plain autograd, differentiable again
            with torch.enable_grad():
                qd = quat if quat.requires_grad else quat.detach().requires_grad_(True)
                (g,) = torch.autograd.grad(_quat_to_matrix(qd), qd, G, create_graph=True)
            return g
        w, u = quat[..., :1], quat[..., 1:]
        n = (quat * quat).sum(-1, keepdim=True)
        s = 2.0 / n
        Gs = G + G.transpose(-1, -2)
        tr = G.diagonal(dim1=-2, dim2=-1).sum(-1, keepdim=True)
        a = torch.stack((G[..., 2, 1] - G[..., 1, 2], G[..., 0, 2] - G[..., 2, 0], G[..., 1, 0] - G[..., 0, 1]), -1)
        gu = (Gs @ u[..., None])[..., 0] - 2.0 * tr * u + w * a
        gw = (u * a).sum(-1, keepdim=True)
        GR = (G * R).sum((-1, -2))[..., None]
        return s * torch.cat([gw, gu], -1) - (2.0 / n) * (GR - tr) * quat


def matrix_to_quat(R: torch.Tensor) -> torch.Tensor:
    """Quaternion of a rotation matrix (Shepperd's method), canonical ``w >= 0``.

    The four quantities ``t = 4 [w^2, x^2, y^2, z^2]`` are linear in ``R``;
    the largest (always ``>= 1`` for a rotation, since they sum to 4) gives its
    component by a square root far from zero, and the other three components
    come from sums and differences of off-diagonal entries divided by it. The
    selection is a ``torch.where``, so the branches not selected get no gradient
    and the gradient is finite for every rotation, including the identity and
    rotations by pi. The result is normalised (so a slightly non-orthonormal
    ``R`` still yields a unit quaternion) and its sign is chosen with
    ``w >= 0``. When ``w == 0`` exactly (angle pi) the sign is the one with
    the component of largest magnitude (``argmax_i R[i, i]``) positive, the
    same axis :func:`so3_log` returns there.

    Args:
        R: Rotation matrices, shape ``(..., 3, 3)``.

    Returns:
        Unit quaternions ``[w, x, y, z]`` with ``w >= 0``, shape ``(..., 4)``.
    """
    check_matrix(R, 3, 3, "R")
    r00, r01, r02 = R[..., 0, 0], R[..., 0, 1], R[..., 0, 2]
    r10, r11, r12 = R[..., 1, 0], R[..., 1, 1], R[..., 1, 2]
    r20, r21, r22 = R[..., 2, 0], R[..., 2, 1], R[..., 2, 2]
    t0 = 1.0 + r00 + r11 + r22
    t1 = 1.0 + r00 - r11 - r22
    t2 = 1.0 - r00 + r11 - r22
    t3 = 1.0 - r00 - r11 + r22
    d_x, d_y, d_z = r21 - r12, r02 - r20, r10 - r01  # 4 w x, 4 w y, 4 w z
    s_xy, s_xz, s_yz = r10 + r01, r02 + r20, r21 + r12  # 4 x y, 4 x z, 4 y z
    # Row i is 4 q_i q: candidate i divided by 2 sqrt(t_i) = 4 |q_i| gives +-q.
    # i = argmax(t), first index on ties, picked with comparisons and
    # torch.where (argmax + gather on stacked candidates took about twice as
    # long at batch 16000).
    b0 = (t0 >= t1) & (t0 >= t2) & (t0 >= t3)
    b1 = (~b0) & (t1 >= t2) & (t1 >= t3)
    b2 = ~(b0 | b1) & (t2 >= t3)

    def pick(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor) -> torch.Tensor:
        return torch.where(b0, c0, torch.where(b1, c1, torch.where(b2, c2, c3)))

    row = torch.stack(
        (
            pick(t0, d_x, d_y, d_z),
            pick(d_x, t1, s_xy, s_xz),
            pick(d_y, s_xy, t2, s_yz),
            pick(d_z, s_xz, s_yz, t3),
        ),
        -1,
    )
    t_sel = pick(t0, t1, t2, t3).unsqueeze(-1)
    # t_sel >= 1 for any rotation; the clamp only guards garbage input.
    q = row * (0.5 * torch.rsqrt(t_sel.clamp_min(torch.finfo(R.dtype).eps)))
    q = _normalize(q)
    return _canonical(q)


def _normalize(q: torch.Tensor) -> torch.Tensor:
    n2 = (q * q).sum(-1, keepdim=True)
    return q * torch.rsqrt(n2.clamp_min(torch.finfo(q.dtype).tiny))


def _canonical(q: torch.Tensor) -> torch.Tensor:
    # Flip to w >= 0; the sign is piecewise constant, so it has zero gradient.
    w = q[..., :1]
    return torch.where(w < 0.0, -q, q)


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product ``a * b`` (rotation ``b`` first, then ``a``).

    ``quat_to_matrix(quat_multiply(a, b)) == quat_to_matrix(a) @ quat_to_matrix(b)``.

    Args:
        a: Quaternions ``[w, x, y, z]``, shape ``(..., 4)``.
        b: Quaternions ``[w, x, y, z]``, shape ``(..., 4)``; batch axes broadcast
            with ``a``'s.

    Returns:
        Products, shape ``(..., 4)`` (broadcast batch shape).
    """
    check_vector(a, 4, "a")
    check_vector(b, 4, "b")
    check_same_dtype_device(a, b, "a", "b")
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        (
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ),
        -1,
    )


def quat_conjugate(quat_wxyz: torch.Tensor) -> torch.Tensor:
    """Conjugate ``[w, -x, -y, -z]``; the inverse of a unit quaternion.

    Args:
        quat_wxyz: Quaternions, shape ``(..., 4)``.

    Returns:
        Conjugates, shape ``(..., 4)``.
    """
    check_vector(quat_wxyz, 4, "quat_wxyz")
    # Negated in place of a product with a sign tensor: that constant would be
    # copied to a GPU, a host synchronisation, at every call. Same values and
    # gradients (a product with +-1 is exact).
    return torch.cat([quat_wxyz[..., :1], -quat_wxyz[..., 1:]], -1)


def quat_inverse(quat_wxyz: torch.Tensor) -> torch.Tensor:
    """Multiplicative inverse ``conj(q) / |q|**2`` (any nonzero quaternion).

    Args:
        quat_wxyz: Nonzero quaternions, shape ``(..., 4)``.

    Returns:
        Inverses, shape ``(..., 4)``.
    """
    check_vector(quat_wxyz, 4, "quat_wxyz")
    n2 = (quat_wxyz * quat_wxyz).sum(-1, keepdim=True)
    return quat_conjugate(quat_wxyz) / n2


def quat_normalize(quat_wxyz: torch.Tensor) -> torch.Tensor:
    """Scale quaternions to unit norm (sign kept).

    Args:
        quat_wxyz: Nonzero quaternions, shape ``(..., 4)``.

    Returns:
        Unit quaternions, shape ``(..., 4)``.
    """
    check_vector(quat_wxyz, 4, "quat_wxyz")
    return _normalize(quat_wxyz)


def quat_apply(quat_wxyz: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotate vectors by unit quaternions: ``q v q^*``.

    Computed as ``v + w t + u x t`` with ``u = [x, y, z]`` and
    ``t = 2 u x v`` (no matrix is formed). ``q`` must have unit norm.

    Args:
        quat_wxyz: Unit quaternions, shape ``(..., 4)``.
        v: Vectors, shape ``(..., 3)``; batch axes broadcast with ``quat_wxyz``'s.

    Returns:
        Rotated vectors, shape ``(..., 3)`` (broadcast batch shape).
    """
    check_vector(quat_wxyz, 4, "quat_wxyz")
    check_vector(v, 3, "v")
    check_same_dtype_device(quat_wxyz, v, "quat_wxyz", "v")
    w = quat_wxyz[..., :1]
    u = quat_wxyz[..., 1:]
    u, v = torch.broadcast_tensors(u, v)
    t = 2.0 * torch.linalg.cross(u, v, dim=-1)
    return v + w * t + torch.linalg.cross(u, t, dim=-1)


def rotvec_to_quat(rotvec: torch.Tensor) -> torch.Tensor:
    """Quaternion of a rotation vector: ``[cos(t/2), sin(t/2)/t * rotvec]``.

    Smooth in ``rotvec`` (no sign canonicalisation: angles beyond pi give
    ``w < 0``). Below ``eps**(1/8)`` rad both coefficients come from Taylor
    series in ``t**2``, so the gradient at zero is finite and exact.

    Args:
        rotvec: Rotation vectors (rad), shape ``(..., 3)``.

    Returns:
        Unit quaternions ``[w, x, y, z]``, shape ``(..., 4)``.
    """
    check_vector(rotvec, 3, "rotvec")
    theta2 = (rotvec * rotvec).sum(-1)
    thr = small_angle_threshold(rotvec.dtype)
    small = theta2 < thr * thr
    t2 = theta2
    # cos(t/2) and sin(t/2)/t, Horner form, error < eps below the threshold.
    w_small = 1.0 - t2 / 8.0 * (1.0 - t2 / 48.0 * (1.0 - t2 / 120.0 * (1.0 - t2 / 224.0)))
    k_small = 0.5 - t2 / 48.0 * (1.0 - t2 / 80.0 * (1.0 - t2 / 168.0 * (1.0 - t2 / 288.0)))
    # Safe input off the large branch: sqrt'(0) = inf would leak as nan.
    theta = torch.sqrt(torch.where(small, torch.ones_like(theta2), theta2))
    half = 0.5 * theta
    w_large = torch.cos(half)
    k_large = torch.sin(half) / theta
    w = torch.where(small, w_small, w_large)
    k = torch.where(small, k_small, k_large)
    return torch.cat((w.unsqueeze(-1), rotvec * k.unsqueeze(-1)), -1)


def quat_to_rotvec(quat_wxyz: torch.Tensor) -> torch.Tensor:
    """Rotation vector of a quaternion, angle in ``[0, pi]``.

    ``q`` is first flipped to ``w >= 0`` (the double cover: ``q`` and ``-q``
    give the same rotation vector), then ``t = 2 atan2(|u|, w)`` and
    ``rotvec = u * t / |u|`` with ``u = [x, y, z]``. For ``|u| / w`` below
    ``eps**(1/8)`` the factor ``t / |u| = (2/w) atan(r)/r`` (``r = |u|/w``) is a
    Taylor series in ``r**2``, so the gradient at the identity is finite.
    At ``w == 0`` (angle pi) the axis is ``u / |u|`` as given. Non-unit
    quaternions are accepted (the scale cancels).

    Args:
        quat_wxyz: Nonzero quaternions, shape ``(..., 4)``.

    Returns:
        Rotation vectors (rad), shape ``(..., 3)``.
    """
    check_vector(quat_wxyz, 4, "quat_wxyz")
    q = _canonical(quat_wxyz)
    w = q[..., 0]
    u = q[..., 1:]
    n2 = (u * u).sum(-1)
    thr = small_angle_threshold(q.dtype)
    small = n2 < (thr * thr) * (w * w)  # w = 0 is never small
    # Safe inputs off each branch so neither side's gradient is inf or nan.
    w_s = torch.where(small, w, torch.ones_like(w))
    r2 = n2 / (w_s * w_s)
    atan_ratio = 1.0 - r2 / 3.0 + r2 * r2 / 5.0 - r2 * r2 * r2 / 7.0 + r2 * r2 * r2 * r2 / 9.0
    f_small = 2.0 / w_s * atan_ratio
    n = torch.sqrt(torch.where(small, torch.ones_like(n2), n2))
    f_large = 2.0 * torch.atan2(n, w) / n
    f = torch.where(small, f_small, f_large)
    return u * f.unsqueeze(-1)


def quat_identity(
    batch_shape: BatchShape = (),
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Identity quaternions ``[1, 0, 0, 0]``.

    Args:
        batch_shape: Leading batch shape (int or sequence of ints).
        dtype: Floating dtype; torch's default when ``None``.
        device: Device; torch's default when ``None``.

    Returns:
        Identity quaternions, shape ``(*batch_shape, 4)``.
    """
    shape = as_batch_shape(batch_shape)
    q = torch.zeros(*shape, 4, dtype=resolve_dtype(dtype), device=device)
    q[..., 0] = 1.0
    return q


def random_quat(
    *batch_shape: int,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Uniformly distributed random unit quaternions (Haar measure on SO(3)).

    A normalised 4-D standard normal sample is uniform on the 3-sphere.
    Canonicalised to ``w >= 0`` (which keeps the rotations uniform).

    Args:
        *batch_shape: Batch shape, e.g. ``random_quat(5, 3)`` or
            ``random_quat((5, 3))``; nothing for a single quaternion.
        dtype: Floating dtype; torch's default when ``None``.
        device: Device; torch's default when ``None``. Must match
            ``generator``'s device when one is given.
        generator: Random number generator for reproducibility.

    Returns:
        Unit quaternions ``[w, x, y, z]``, shape ``(*batch_shape, 4)``.
    """
    shape = parse_batch_shape(batch_shape)
    g = torch.randn(*shape, 4, dtype=resolve_dtype(dtype), device=device, generator=generator)
    return _canonical(_normalize(g))


def random_rotation(
    *batch_shape: int,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Uniformly distributed random rotation matrices.

    Args:
        *batch_shape: Batch shape, as in :func:`random_quat`.
        dtype: Floating dtype; torch's default when ``None``.
        device: Device; torch's default when ``None``.
        generator: Random number generator for reproducibility.

    Returns:
        Rotation matrices, shape ``(*batch_shape, 3, 3)``.
    """
    return quat_to_matrix(
        random_quat(*batch_shape, dtype=dtype, device=device, generator=generator)
    )

"""SE(3) on homogeneous ``(..., 4, 4)`` matrices, parent-from-child.

Twists are ``[v; w]`` (linear first, then angular). Compositions and inverses
work on the 3x3 rotation and the translation, never on general 4x4 products
or inverses: that is cheaper and keeps the bottom row exactly ``0 0 0 1``.
"""

from __future__ import annotations

import torch

from .._shapes import broadcast_shapes
from ._common import (
    BatchShape,
    as_batch_shape,
    check_matrix,
    check_same_dtype_device,
    check_vector,
    default_tolerance,
    parse_batch_shape,
    resolve_dtype,
    small_angle_threshold,
)
from ._quat import random_rotation
from ._so3 import rodrigues_coefficients, skew, so3_log

__all__ = [
    "make_transform",
    "transform_inverse",
    "transform_compose",
    "transform_point",
    "se3_exp",
    "se3_log",
    "adjoint",
    "adjoint_inverse",
    "identity_transform",
    "random_transform",
    "is_rigid_transform",
    "pose_error",
]


def _split(T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return T[..., :3, :3], T[..., :3, 3]


def _matvec(M: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (M @ v.unsqueeze(-1)).squeeze(-1)


def make_transform(R: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Homogeneous transform ``[[R, p], [0, 1]]``.

    Args:
        R: Rotation matrices, shape ``(..., 3, 3)``.
        p: Translations (m), shape ``(..., 3)``; batch axes broadcast with
            ``R``'s.

    Returns:
        Transforms, shape ``(..., 4, 4)`` (broadcast batch shape).
    """
    check_matrix(R, 3, 3, "R")
    check_vector(p, 3, "p")
    check_same_dtype_device(R, p, "R", "p")
    batch = broadcast_shapes(R.shape[:-2], p.shape[:-1])
    top = torch.cat((R.expand(*batch, 3, 3), p.expand(*batch, 3).unsqueeze(-1)), -1)
    bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=R.dtype, device=R.device)
    return torch.cat((top, bottom.expand(*batch, 1, 4)), -2)


def transform_inverse(T: torch.Tensor) -> torch.Tensor:
    """Inverse of a rigid transform: ``[[R^T, -R^T p], [0, 1]]``.

    Args:
        T: Rigid transforms ``T_a_b``, shape ``(..., 4, 4)``.

    Returns:
        ``T_b_a``, shape ``(..., 4, 4)``.
    """
    check_matrix(T, 4, 4, "T")
    R, p = _split(T)
    Rt = R.transpose(-1, -2)
    return make_transform(Rt, -_matvec(Rt, p))


def transform_compose(T1: torch.Tensor, T2: torch.Tensor) -> torch.Tensor:
    """Composition ``T1 @ T2`` of rigid transforms, via rotation and translation.

    ``T_a_c = transform_compose(T_a_b, T_b_c)``. The bottom rows are assumed
    to be ``0 0 0 1`` (and are ``0 0 0 1`` in the result).

    Args:
        T1: Transforms, shape ``(..., 4, 4)``.
        T2: Transforms, shape ``(..., 4, 4)``; batch axes broadcast with ``T1``'s.

    Returns:
        ``T1 @ T2``, shape ``(..., 4, 4)`` (broadcast batch shape).
    """
    check_matrix(T1, 4, 4, "T1")
    check_matrix(T2, 4, 4, "T2")
    check_same_dtype_device(T1, T2, "T1", "T2")
    R1, p1 = _split(T1)
    R2, p2 = _split(T2)
    return make_transform(R1 @ R2, _matvec(R1, p2) + p1)


def transform_point(T: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Apply a rigid transform to points: ``R p + t``.

    ``p_a = transform_point(T_a_b, p_b)``.

    Args:
        T: Transforms, shape ``(..., 4, 4)``.
        p: Points (m), shape ``(..., 3)``; batch axes broadcast with ``T``'s.

    Returns:
        Transformed points (m), shape ``(..., 3)`` (broadcast batch shape).
    """
    check_matrix(T, 4, 4, "T")
    check_vector(p, 3, "p")
    check_same_dtype_device(T, p, "T", "p")
    R, t = _split(T)
    return _matvec(R, p) + t


def se3_exp(xi: torch.Tensor) -> torch.Tensor:
    """Exponential map of a twist ``[v; w]`` to a rigid transform.

    ``T = [[exp(w), V v], [0, 1]]`` with ``V = I + B K + C K^2``,
    ``K = skew(w)``, ``B = (1 - cos t)/t^2``, ``C = (t - sin t)/t^3`` and
    ``t = |w|``; Taylor series in ``t**2`` below ``eps**(1/8)`` rad keep the
    result exact and the gradient finite at ``w = 0`` (a pure translation).
    Equals the matrix exponential of ``[[skew(w), v], [0, 0]]``.

    Args:
        xi: Twists ``[v (m); w (rad)]``, shape ``(..., 6)``.

    Returns:
        Rigid transforms, shape ``(..., 4, 4)``.
    """
    check_vector(xi, 6, "xi")
    v = xi[..., :3]
    w = xi[..., 3:]
    theta2 = (w * w).sum(-1)
    A, B, C = rodrigues_coefficients(theta2, with_c=True)
    assert C is not None
    wxv = torch.linalg.cross(w, v, dim=-1)
    wxwxv = torch.linalg.cross(w, wxv, dim=-1)
    p = v + B.unsqueeze(-1) * wxv + C.unsqueeze(-1) * wxwxv
    # Rotation as in so3_exp, sharing the coefficients.
    K = skew(w)
    outer = w.unsqueeze(-1) * w.unsqueeze(-2)
    eye = torch.eye(3, dtype=xi.dtype, device=xi.device)
    R = (
        (1.0 - B * theta2)[..., None, None] * eye
        + A[..., None, None] * K
        + B[..., None, None] * outer
    )
    return make_transform(R, p)


def se3_log(T: torch.Tensor) -> torch.Tensor:
    """Logarithm map of a rigid transform to a twist ``[v; w]``.

    ``w = so3_log(R)`` (angle ``t`` in ``[0, pi]``) and ``v = V^-1 p`` with
    ``V^-1 = I - K/2 + D K^2``, ``K = skew(w)``,
    ``D = (1 - (t/2) cot(t/2)) / t^2``; below ``eps**(1/8)`` rad ``D`` is
    its Taylor series ``1/12 + t^2/720 + t^4/30240 + t^6/1209600``, so the
    gradient at zero rotation is finite. Note ``v`` is not ``p`` unless
    ``w = 0``: ``se3_exp(se3_log(T)) == T``.

    At rotation angle pi, ``w`` follows :func:`so3_log`'s branch choice (the
    sign of the axis is ambiguous there); ``v`` is continuous in ``w``.

    Args:
        T: Rigid transforms, shape ``(..., 4, 4)``.

    Returns:
        Twists ``[v (m); w (rad)]``, shape ``(..., 6)``.
    """
    check_matrix(T, 4, 4, "T")
    R, p = _split(T)
    w = so3_log(R)
    theta2 = (w * w).sum(-1)
    thr = small_angle_threshold(T.dtype)
    small = theta2 < thr * thr
    t2 = theta2
    d_small = 1.0 / 12.0 + t2 * (1.0 / 720.0 + t2 * (1.0 / 30240.0 + t2 * (1.0 / 1209600.0)))
    # Safe input off the large branch: sqrt'(0) = inf and 1/t^2 would leak nan.
    t2_safe = torch.where(small, torch.ones_like(theta2), theta2)
    half = 0.5 * torch.sqrt(t2_safe)
    # t <= pi, so sin(t/2) >= sin(thr/2) > 0: the cotangent is finite.
    d_large = (1.0 - half * torch.cos(half) / torch.sin(half)) / t2_safe
    D = torch.where(small, d_small, d_large)
    wxp = torch.linalg.cross(w, p, dim=-1)
    wxwxp = torch.linalg.cross(w, wxp, dim=-1)
    v = p - 0.5 * wxp + D.unsqueeze(-1) * wxwxp
    return torch.cat((v, w), -1)


def adjoint(T: torch.Tensor) -> torch.Tensor:
    """Adjoint matrix of a rigid transform, for ``[linear; angular]`` twists.

    ``Ad(T_a_b) = [[R, skew(p) R], [0, R]]`` maps a twist expressed in frame
    ``b`` (at ``b``'s origin) to the same twist expressed in frame ``a`` (at
    ``a``'s origin): ``hat(Ad(T) xi) = T hat(xi) T^-1``.

    Args:
        T: Rigid transforms ``T_a_b``, shape ``(..., 4, 4)``.

    Returns:
        Adjoint matrices, shape ``(..., 6, 6)``.
    """
    check_matrix(T, 4, 4, "T")
    R, p = _split(T)
    zero = torch.zeros_like(R)
    top = torch.cat((R, skew(p) @ R), -1)
    bottom = torch.cat((zero, R), -1)
    return torch.cat((top, bottom), -2)


def adjoint_inverse(T: torch.Tensor) -> torch.Tensor:
    """Adjoint of the inverse transform, without inverting it first.

    ``Ad(T^-1) = [[R^T, -R^T skew(p)], [0, R^T]]``: maps twists expressed in
    ``a`` to ``b`` for ``T = T_a_b``.

    Args:
        T: Rigid transforms ``T_a_b``, shape ``(..., 4, 4)``.

    Returns:
        Adjoint matrices ``Ad(T_b_a)``, shape ``(..., 6, 6)``.
    """
    check_matrix(T, 4, 4, "T")
    R, p = _split(T)
    Rt = R.transpose(-1, -2)
    zero = torch.zeros_like(R)
    top = torch.cat((Rt, -(Rt @ skew(p))), -1)
    bottom = torch.cat((zero, Rt), -1)
    return torch.cat((top, bottom), -2)


def identity_transform(
    batch_shape: BatchShape = (),
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Identity transforms.

    Args:
        batch_shape: Leading batch shape (int or sequence of ints).
        dtype: Floating dtype; torch's default when ``None``.
        device: Device; torch's default when ``None``.

    Returns:
        Identity matrices, shape ``(*batch_shape, 4, 4)`` (a fresh tensor,
        safe to write into).
    """
    shape = as_batch_shape(batch_shape)
    eye = torch.eye(4, dtype=resolve_dtype(dtype), device=device)
    return eye.expand(*shape, 4, 4).clone()


def random_transform(
    *batch_shape: int,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
    translation_std: float = 1.0,
) -> torch.Tensor:
    """Random rigid transforms: uniform rotation, normal translation.

    Args:
        *batch_shape: Batch shape, e.g. ``random_transform(5, 3)`` or
            ``random_transform((5, 3))``.
        dtype: Floating dtype; torch's default when ``None``.
        device: Device; torch's default when ``None``.
        generator: Random number generator for reproducibility.
        translation_std: Standard deviation of each translation component (m).

    Returns:
        Rigid transforms, shape ``(*batch_shape, 4, 4)``.
    """
    shape = parse_batch_shape(batch_shape)
    dtype = resolve_dtype(dtype)
    R = random_rotation(shape, dtype=dtype, device=device, generator=generator)
    p = translation_std * torch.randn(
        *shape, 3, dtype=dtype, device=device, generator=generator
    )
    return make_transform(R, p)


def is_rigid_transform(T: torch.Tensor, tol: float | None = None) -> torch.Tensor:
    """Whether each matrix is a rigid transform, within ``tol``.

    Checks ``|R^T R - I| <= tol`` entrywise, ``|det R - 1| <= tol`` and a
    bottom row of ``0 0 0 1`` within ``tol``. NaN or inf entries fail.

    Args:
        T: Matrices, shape ``(..., 4, 4)``.
        tol: Absolute tolerance; ``sqrt(eps)`` of ``T``'s dtype when ``None``
            (about 1.5e-8 in float64, 3.5e-4 in float32).

    Returns:
        Boolean tensor, shape ``(...)``.
    """
    check_matrix(T, 4, 4, "T")
    tol = default_tolerance(T.dtype) if tol is None else float(tol)
    R = T[..., :3, :3]
    eye3 = torch.eye(3, dtype=T.dtype, device=T.device)
    ortho_err = (R.transpose(-1, -2) @ R - eye3).abs().amax(dim=(-1, -2))
    r0, r1, r2 = R[..., 0, :], R[..., 1, :], R[..., 2, :]
    det = (r0 * torch.linalg.cross(r1, r2, dim=-1)).sum(-1)
    bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=T.dtype, device=T.device)
    bottom_err = (T[..., 3, :] - bottom).abs().amax(-1)
    # Written as "<=" so that NaN compares False and fails the check.
    ok = (ortho_err <= tol) & ((det - 1.0).abs() <= tol) & (bottom_err <= tol)
    return ok & torch.isfinite(T).all(dim=-1).all(dim=-1)


def pose_error(pose: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Position and orientation error from an achieved pose to a target pose.

    Both poses are parent-from-child in the same root (world) frame, e.g.
    ``T_world_tcp`` and ``T_world_goal``. Both errors are expressed in that
    root frame:

    * ``position_error = p_target - p_pose`` (m);
    * ``rotation_error = so3_log(R_target @ R_pose^T)`` (rad): the shortest
      rotation vector that takes the achieved orientation to the target one,
      i.e. ``so3_exp(rotation_error) @ R_pose == R_target``. Its norm is the
      geodesic angle, in ``[0, pi]``.

    The pair is what a damped-least-squares IK step drives to zero through the
    ``[linear; angular]`` world-frame Jacobian. The gradient is finite
    everywhere, including at zero error (where it equals the derivative of
    ``vee((R_err - R_err^T)/2)``).

    Branch cut at pi:
        When the orientation error is exactly pi, ``+pi a`` and ``-pi a`` are
        equally short; the one returned has its largest-magnitude component
        positive (``a[k] > 0``, ``k = argmax_i R_err[i, i]``, first on ties).
        Within rounding of pi (about 1e-15 rad in float64, 1e-6 in float32)
        either sign may come back, each correct to rounding; farther from pi
        the sign is that of the true shortest rotation, so the error vector
        flips direction as the error angle crosses pi. The gradient is finite
        there (it is the derivative with the returned axis held fixed, see
        :func:`so3_log`), but an optimiser sitting exactly at pi sees the
        gradient of one side only.

    Args:
        pose: Achieved poses, shape ``(..., 4, 4)``.
        target: Target poses, shape ``(..., 4, 4)``; batch axes broadcast with
            ``pose``'s.

    Returns:
        ``(position_error, rotation_error)``, each shape ``(..., 3)``
        (broadcast batch shape).
    """
    check_matrix(pose, 4, 4, "pose")
    check_matrix(target, 4, 4, "target")
    check_same_dtype_device(pose, target, "pose", "target")
    R_p, p_p = _split(pose)
    R_t, p_t = _split(target)
    position_error = p_t - p_p
    rotation_error = so3_log(R_t @ R_p.transpose(-1, -2))
    position_error, rotation_error = torch.broadcast_tensors(position_error, rotation_error)
    return position_error, rotation_error

"""Integration and differences on the configuration manifold.

Joint coordinates live in R^n (continuous joints too: one unwrapped angle).
A floating base lives in SE(3): its velocity is the base-frame twist and a
step composes the pose with the SE(3) exponential on the right, exactly as
Pinocchio's free-flyer ``integrate`` / ``difference``.
"""

from __future__ import annotations

import torch

from .._errors import InputError
from ..model import RobotModel
from ..spatial import quat_apply, quat_conjugate, quat_multiply, quat_to_rotvec, rotvec_to_quat
from ._tree import broadcast_batch

__all__ = ["integrate", "difference", "se3_exp_translation", "se3_log_translation"]


def _series_threshold(dtype: torch.dtype) -> float:
    # Below this angle the closed forms below lose digits to cancellation
    # (relative error ~ eps / theta^2), while the five-term series are exact
    # to rounding: about 0.11 rad in float64 and 0.8 rad in float32.
    return 4.0 * torch.finfo(dtype).eps ** 0.1


def _v_coefficients(theta2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``A = (1 - cos t) / t^2`` and ``B = (t - sin t) / t^3`` of ``V = 1 + A [w] + B [w]^2``."""
    thr = _series_threshold(theta2.dtype)
    small = theta2 < thr * thr
    t2 = theta2
    a_s = 1 / 2 - t2 / 24 * (1 - t2 / 30 * (1 - t2 / 56 * (1 - t2 / 90)))
    b_s = 1 / 6 - t2 / 120 * (1 - t2 / 42 * (1 - t2 / 72 * (1 - t2 / 110)))
    # Safe input on the untaken branch: torch.where back-propagates NaN from it.
    ts2 = torch.where(small, torch.ones_like(t2), t2)
    t = torch.sqrt(ts2)
    half_sin = torch.sin(0.5 * t)
    a_l = 2.0 * half_sin * half_sin / ts2
    b_l = (t - torch.sin(t)) / (ts2 * t)
    return torch.where(small, a_s, a_l), torch.where(small, b_s, b_l)


def _vinv_coefficient(theta2: torch.Tensor) -> torch.Tensor:
    """``C = (1 - (t/2) cot(t/2)) / t^2`` of ``V^-1 = 1 - [w]/2 + C [w]^2`` (for ``t < 2 pi``)."""
    thr = _series_threshold(theta2.dtype)
    small = theta2 < thr * thr
    t2 = theta2
    c_s = 1 / 12 + t2 / 720 + t2 * t2 / 30240 + t2 * t2 * t2 / 1209600 + t2 * t2 * t2 * t2 / 47900160
    ts2 = torch.where(small, torch.ones_like(t2), t2)
    t = torch.sqrt(ts2)
    half = 0.5 * t
    c_l = (1.0 - half * torch.cos(half) / torch.sin(half)) / ts2
    return torch.where(small, c_s, c_l)


def se3_exp_translation(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``V(w) u``: the translation of ``exp([u; w])`` in SE(3), ``(..., 3)``."""
    A, B = _v_coefficients((w * w).sum(-1))
    wu = torch.linalg.cross(w, u)
    return u + A[..., None] * wu + B[..., None] * torch.linalg.cross(w, wu)


def se3_log_translation(w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``V(w)^-1 t``: the linear part of ``log`` of the pose ``(exp(w), t)``, ``(..., 3)``."""
    C = _vinv_coefficient((w * w).sum(-1))
    wt = torch.linalg.cross(w, t)
    return t - 0.5 * wt + C[..., None] * torch.linalg.cross(w, wt)


def _dt(robot: RobotModel, dt) -> torch.Tensor | float:
    if isinstance(dt, torch.Tensor):
        if dt.dtype != robot.dtype or dt.device != robot.device:
            raise InputError(
                f"dt must be {robot.dtype} on {robot.device}, got {dt.dtype} on {dt.device}"
            )
        return dt[..., None]
    return float(dt)


def integrate(robot: RobotModel, q: torch.Tensor, v: torch.Tensor, dt=1.0) -> torch.Tensor:
    """The configuration reached from ``q`` moving at constant ``v`` for ``dt``.

    Joints: ``q + v dt``. Floating base: the pose ``T`` becomes
    ``T exp(dt [v_base; omega_base])`` (base-frame twist, SE(3) exponential),
    and the quaternion is renormalised, as Pinocchio's ``integrate``.

    Args:
        robot: the robot model.
        q: ``(..., nq)`` configuration.
        v: ``(..., nv)`` generalised velocity.
        dt: step in seconds, a float or a ``(...)`` tensor.

    Returns:
        ``(..., nq)`` configuration.
    """
    _, (q, v) = broadcast_batch(robot, q, (v, robot.nv, "v"))
    step = v * _dt(robot, dt)
    if not robot.floating_base:
        return q + step
    quat0 = q[..., 3:7]
    dp = quat_apply(quat0, se3_exp_translation(step[..., 3:6], step[..., 0:3]))
    quat1 = quat_multiply(quat0, rotvec_to_quat(step[..., 3:6]))
    quat1 = quat1 / torch.linalg.vector_norm(quat1, dim=-1, keepdim=True)
    return torch.cat([q[..., :3] + dp, quat1, q[..., 7:] + step[..., 6:]], -1)


def difference(robot: RobotModel, q0: torch.Tensor, q1: torch.Tensor) -> torch.Tensor:
    """The velocity that :func:`integrate` needs to go from ``q0`` to ``q1`` in unit time.

    Joints: ``q1 - q0`` (no angle wrapping: continuous joints are unwrapped
    angles). Floating base: ``log(T0^-1 T1)`` in SE(3), the base-frame twist,
    with the rotation angle in ``[0, pi]`` (Pinocchio's ``difference``).

    Args:
        q0, q1: ``(..., nq)`` configurations.

    Returns:
        ``(..., nv)``.
    """
    _, (q0, q1) = broadcast_batch(robot, q0, (q1, robot.nq, "q1"))
    if not robot.floating_base:
        return q1 - q0
    inv0 = quat_conjugate(q0[..., 3:7])
    # Unit quaternions: the conjugate is the inverse (no renormalisation of q0).
    w = quat_to_rotvec(quat_multiply(inv0, q1[..., 3:7]))
    t = quat_apply(inv0, q1[..., :3] - q0[..., :3])
    return torch.cat([se3_log_translation(w, t), w, q1[..., 7:] - q0[..., 7:]], -1)

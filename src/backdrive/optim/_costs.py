"""Small residual terms to build trajectory costs from.

A cost for :func:`~backdrive.optim.optimize_trajectory` returns a residual
vector (the loss is its sum of squares) or a scalar. Residual terms compose by
concatenation: weight each one and join them with :func:`residual_vector`.
"""

from __future__ import annotations

import torch

from ..kinematics import frame_transforms
from ..model import RobotModel

__all__ = ["frame_position_error", "joint_limit_violation", "residual_vector"]


def frame_position_error(robot: RobotModel, q: torch.Tensor, frame, target: torch.Tensor) -> torch.Tensor:
    """Position of a link frame minus a target, in the root (world) frame.

    Args:
        robot: the model.
        q: ``(..., nq)`` configurations.
        frame: link name or frame index.
        target: ``(..., 3)`` target position, m.

    Returns:
        ``(..., 3)`` error, m.
    """
    _, p = frame_transforms(robot, q, [frame])
    return p[..., 0, :] - target


def joint_limit_violation(robot: RobotModel, q: torch.Tensor, margin: float = 0.0) -> torch.Tensor:
    """How far each joint coordinate is outside ``[lower + margin, upper - margin]``.

    ``max(lower + margin - q, 0) + max(q - upper + margin, 0)``, zero inside
    the limits (and for unbounded joints), so as a residual it only acts on
    violations.

    Args:
        robot: the model.
        q: ``(..., nq)`` configurations.
        margin: distance to keep from the limits, rad or m.

    Returns:
        ``(..., nj)``.
    """
    joints = q[..., 7:] if robot.floating_base else q
    lo = torch.where(torch.isfinite(robot.lower), robot.lower + margin, torch.full_like(robot.lower, -1e30))
    hi = torch.where(torch.isfinite(robot.upper), robot.upper - margin, torch.full_like(robot.upper, 1e30))
    return torch.relu(lo - joints) + torch.relu(joints - hi)


def residual_vector(*terms: torch.Tensor) -> torch.Tensor:
    """Concatenate residual terms of any shapes into one vector.

    ``residual_vector(w1 * e1, w2 * e2)`` has the squared norm
    ``w1^2 |e1|^2 + w2^2 |e2|^2``.
    """
    return torch.cat([t.reshape(-1) for t in terms])

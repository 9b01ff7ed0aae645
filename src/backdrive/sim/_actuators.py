"""Actuators map controls to joint efforts; joint limits push back softly.

Each actuator drives a chosen subset of the joint coordinates (``joints``,
all of them by default); its control has one entry per driven joint. Efforts
saturate smoothly at the effort limit (:func:`smooth_saturation`: exact up to
90 % of the limit, then a ``tanh`` bend), so the gradient never drops to
exactly zero the way a clamp's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .._errors import InputError

__all__ = ["smooth_saturation", "TorqueActuator", "PDActuator", "SoftJointLimits"]


def smooth_saturation(x: torch.Tensor, limit: torch.Tensor, knee: float = 0.9) -> torch.Tensor:
    """Effort ``x`` passed unchanged up to ``knee * limit``, then bent smoothly
    towards ``limit``, and ``x`` itself where ``limit`` is infinite.

    With ``k = knee * limit`` and ``w = limit - k``: ``y = x`` for ``|x| <= k``,
    else ``y = sign(x) (k + w tanh((|x| - k) / w))``. The two pieces meet with
    equal value, slope (1) and curvature (0), ``|y| <= limit`` (strictly
    below until ``tanh`` rounds to 1, some ``20 w`` past the knee in float64),
    and the slope does not drop to zero at the limit the way a clamp's does,
    so gradients still say which way to push a saturated effort. Below the knee the effort is exact:
    a gravity-compensation torque at 50 % of the limit is applied as given
    (``limit * tanh(x / limit)`` would take 8 % off it).

    Args:
        x: ``(..., n)`` raw efforts.
        limit: ``(n,)`` or broadcastable positive limits (``inf`` for none).
        knee: fraction of the limit where the bend starts, in ``[0, 1)``.

    Returns:
        ``(..., n)``.
    """
    finite = torch.isfinite(limit)
    # torch.where back-propagates through the branch not taken too: give that
    # branch finite numbers so an infinite limit cannot make 0 * inf = NaN.
    safe = torch.where(finite, limit, torch.ones_like(limit))
    k = knee * safe
    w = safe - k
    mag = x.abs()
    over = mag > k
    excess = torch.where(over, mag - k, torch.zeros_like(mag))
    bent = torch.sign(x) * (k + w * torch.tanh(excess / w))
    return torch.where(finite & over, bent, x)


def _as_param(x, like: torch.Tensor, name: str) -> torch.Tensor | float:
    """A gain as the efforts use it: a tensor checked against ``like``, a
    plain number kept a Python float (a multiplier; made a tensor on a GPU it
    would be copied there, a host synchronisation, at every step), anything
    else (a list, an array) made a tensor like ``like``."""
    if isinstance(x, torch.Tensor):
        if x.dtype != like.dtype or x.device != like.device:
            raise InputError(f"{name} must be {like.dtype} on {like.device}, got {x.dtype} on {x.device}")
        return x
    if isinstance(x, (int, float)):
        return float(x)
    return torch.as_tensor(x, dtype=like.dtype, device=like.device)


@dataclass(frozen=True, eq=False)
class TorqueActuator:
    """Direct effort control: the control is the joint effort (N m or N).

    Args:
        joints: joint names or indices driven by the actuator (``None``: all).
        effort_limit: ``(nu,)`` or scalar limit; ``None`` takes the model's
            ``effort_limit``; ``math.inf`` disables saturation.
    """

    joints: Sequence | None = None
    effort_limit: torch.Tensor | float | None = None

    def effort(self, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Raw efforts ``(..., nu)`` from driven joint positions ``q``, rates
        ``v`` (both ``(..., nu)``) and controls ``u (..., nu)``."""
        return u


@dataclass(frozen=True, eq=False)
class PDActuator:
    """Position servo: the control is the joint target position.

    ``tau = kp * (u - q) - kd * v`` (rad or m targets), then smooth saturation.
    Gains may be tensors that require grad.

    Args:
        kp: stiffness, scalar or ``(nu,)``, N m/rad (N/m).
        kd: damping, scalar or ``(nu,)``, N m s/rad (N s/m).
        joints: joint names or indices driven (``None``: all).
        effort_limit: as for :class:`TorqueActuator`.
    """

    kp: torch.Tensor | float = 100.0
    kd: torch.Tensor | float = 10.0
    joints: Sequence | None = None
    effort_limit: torch.Tensor | float | None = None

    def effort(self, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        kp = _as_param(self.kp, q, "kp")
        kd = _as_param(self.kd, q, "kd")
        return kp * (u - q) - kd * v


@dataclass(frozen=True, eq=False)
class SoftJointLimits:
    """Spring-damper forces that push joints back inside their position limits.

    For a penetration ``d = max(q - upper, 0)`` (or ``max(lower - q, 0)``) the
    joint receives ``-k d`` (``+k d`` at the lower limit) and a damping force
    ``-c v (1 - exp(-d / width))`` that fades in over ``width`` so the force
    stays continuous at the limit. Joints with infinite limits get nothing.

    Args:
        stiffness: ``k``, N m/rad (N/m), scalar or ``(nj,)``.
        damping: ``c``, N m s/rad (N s/m), scalar or ``(nj,)``.
        width: fade-in penetration of the damping, rad (m).
    """

    stiffness: torch.Tensor | float = 1.0e3
    damping: torch.Tensor | float = 10.0
    width: float = 0.01

    def effort(
        self, q: torch.Tensor, v: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor
    ) -> torch.Tensor:
        """``(..., nj)`` limit efforts for joint positions and rates ``(..., nj)``."""
        has_lo = torch.isfinite(lower)
        has_hi = torch.isfinite(upper)
        # Finite stand-ins keep both torch.where branches finite (no inf - inf).
        lo = torch.where(has_lo, lower, torch.zeros_like(lower))
        hi = torch.where(has_hi, upper, torch.zeros_like(upper))
        d_lo = torch.where(has_lo, torch.relu(lo - q), torch.zeros_like(q))
        d_hi = torch.where(has_hi, torch.relu(q - hi), torch.zeros_like(q))
        k = _as_param(self.stiffness, q, "stiffness")
        c = _as_param(self.damping, q, "damping")
        fade = 1.0 - torch.exp(-(d_lo + d_hi) / self.width)
        return k * (d_lo - d_hi) - c * fade * v

"""Local-polynomial smoothing of recorded states, on the configuration manifold."""

from __future__ import annotations

import torch

from .._errors import InputError
from ..dynamics import difference, integrate
from ..model import RobotModel

__all__ = ["smooth_states"]


def _band_weights(n: int, half_width: int, degree: int, dtype, device) -> torch.Tensor:
    """``(n, 2 half_width + 1)``: row ``k`` holds the least-squares weights of
    samples ``k - half_width .. k + half_width`` that give the value at ``k``
    of the degree-``degree`` polynomial fitted to them (0 beyond the ends,
    where fewer samples are fitted). Interior rows share one set of weights."""
    h = half_width
    W = torch.zeros(n, 2 * h + 1, dtype=torch.float64)
    interior = None
    for k in range(n):
        lo, hi = max(0, k - h), min(n - 1, k + h)
        if lo == k - h and hi == k + h and interior is not None:
            W[k] = interior
            continue
        t = torch.arange(lo - k, hi - k + 1, dtype=torch.float64)
        X = torch.stack([t**p for p in range(min(degree, hi - lo) + 1)], -1)
        row = torch.linalg.pinv(X)[0]  # value at t = 0: first row of (X^T X)^-1 X^T
        W[k, lo - k + h: hi - k + h + 1] = row
        if lo == k - h and hi == k + h:
            interior = W[k].clone()
    return W.to(dtype=dtype, device=device)


def smooth_states(robot: RobotModel, q: torch.Tensor, v: torch.Tensor, half_width: int, degree: int = 2):
    """Smoothed ``(q, v)`` of a recording: at every sample, the value of the
    polynomial of ``degree`` fitted by least squares to the samples within
    ``half_width`` (a Savitzky-Golay filter; fewer samples at the ends).

    Configurations are smoothed in the tangent space of each sample: the
    offsets ``difference(q_k, q_j)`` of its neighbours (joints, and the
    floating base's SE(3) log) are fitted, and the fit at ``k`` is applied
    with :func:`~backdrive.dynamics.integrate`; velocities are fitted
    directly. White noise of standard deviation ``s`` leaves about ``1.5 s /
    sqrt(2 half_width + 1)`` at interior samples (degree 2; 0.33 s at
    half-width 10); a motion that is
    a polynomial of that degree over the window passes unchanged (up to the
    base's SE(3) coupling, second order in the window's motion).

    Use it on a recording's noisy states before taking window start states
    from it (``identify(..., method=ContactFit(...))`` starts every window
    from a recorded state, and on stiff contact a fraction of a millimetre
    of wrong foot height is a large force; docs/simulation.md).

    Args:
        robot: the model of the recording.
        q: ``(..., T, nq)``. v: ``(..., T, nv)``.
        half_width: samples on each side, ``>= 1``.
        degree: polynomial degree, ``>= 0`` and ``< 2 half_width + 1``.

    Returns:
        ``(q, v)`` of the same shapes.

    Raises:
        InputError: wrong shapes, or ``half_width``/``degree`` out of range.
    """
    if isinstance(half_width, bool) or not isinstance(half_width, int) or half_width < 1:
        raise InputError(f"half_width must be a whole number of samples >= 1, got {half_width!r}")
    if isinstance(degree, bool) or not isinstance(degree, int) or not 0 <= degree < 2 * half_width + 1:
        raise InputError(f"degree must be a whole number in [0, {2 * half_width}], got {degree!r}")
    robot.check_vector(q, robot.nq, "q")
    robot.check_vector(v, robot.nv, "v")
    if q.ndim < 2 or q.shape[:-1] != v.shape[:-1]:
        raise InputError(f"q and v must be (..., T, nq) and (..., T, nv) with the same T, got {tuple(q.shape)} "
                         f"and {tuple(v.shape)}")
    T = q.shape[-2]
    w = _band_weights(T, half_width, degree, q.dtype, q.device)  # (T, 2h+1)
    j = (torch.arange(T, device=q.device)[:, None]
         + torch.arange(-half_width, half_width + 1, device=q.device)).clamp(0, T - 1)  # (T, 2h+1)
    v_s = (w[..., None] * v[..., j, :]).sum(-2)
    # Tangent offsets of every neighbour from its sample k: (..., T, 2h+1, nv).
    qk = q[..., :, None, :].expand(*q.shape[:-1], j.shape[1], q.shape[-1])
    d_hat = (w[..., None] * difference(robot, qk, q[..., j, :])).sum(-2)
    return integrate(robot, q, d_hat, 1.0), v_s

"""Trajectory optimisation by back-propagation through the simulator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._errors import ConfigError, InputError
from ..sim import Simulator, State, Trajectory
from ._solvers import OPTIMIZERS, SolverOptions, loss_of, minimize, options_from_keywords

__all__ = ["optimize_trajectory", "TrajectoryOptimizationResult", "OPTIMIZERS"]

Cost = Callable[[Trajectory, torch.Tensor], torch.Tensor]


@dataclass
class TrajectoryOptimizationResult:
    """The outcome of :func:`optimize_trajectory`.

    Attributes:
        controls: ``(..., T, nu)`` optimised controls (detached).
        trajectory: the rollout under ``controls`` (detached).
        losses: ``losses[k]`` is the loss after ``k`` iterations (Adam: at the
            start of epoch ``k``); ``losses[0]`` is the initial loss and the last
            entry the loss of ``controls``.
        loss: the final loss.
        iterations, evaluations: solver iterations and rollouts with gradient.
        wall_time: seconds spent in the solver.
        converged: whether a tolerance stopped the solver.
        message: why it stopped.
        optimizer: the optimiser used (``options.method``).
        options: the :class:`~backdrive.optim.SolverOptions` it ran with.
    """

    controls: torch.Tensor
    trajectory: Trajectory
    losses: list[float]
    loss: float
    iterations: int
    evaluations: int
    wall_time: float
    converged: bool
    message: str
    optimizer: str
    options: SolverOptions | None = None


def optimize_trajectory(
    simulator: Simulator,
    state0: State,
    cost: Cost,
    horizon: int,
    *,
    controls: torch.Tensor | None = None,
    options: SolverOptions | None = None,
    truncate_every: int | None = None,
    **deprecated,
) -> TrajectoryOptimizationResult:
    """Optimise open-loop controls by back-propagation through time.

    The decision variables are the controls of every step, ``(..., horizon, nu)``;
    each evaluation rolls the simulator out from ``state0`` and scores the
    trajectory with ``cost``.

    Args:
        simulator: the :class:`~backdrive.sim.Simulator`.
        state0: initial :class:`~backdrive.sim.State` (fixed).
        cost: ``cost(trajectory, controls) -> tensor``: either a 0-d loss, or a
            vector of residuals whose sum of squares is the loss (needed by
            ``"gauss_newton"``, accepted by all). Build residuals with the
            helpers in :mod:`backdrive.optim` and ``torch.cat``.
        horizon: number of steps ``T``.
        controls: initial guess ``(..., T, nu)``; zeros by default.
        options: :class:`~backdrive.optim.SolverOptions`: ``method``
            ``"lbfgs"`` (L-BFGS with a strong-Wolfe line search, the default),
            ``"adam"`` or ``"gauss_newton"`` (Levenberg-Marquardt on the
            residuals, with the Jacobian from ``torch.func``; best for small
            least-squares problems), the iteration limit, tolerances, Adam's
            ``lr`` (default 0.1 N or N m per step), ``progress``,
            ``callback(iteration, flat_controls, loss)`` and ``max_time``.
        truncate_every: detach the state every ``k`` steps in each rollout.
        **deprecated: the keywords ``optimizer``, ``iterations``, ``lr``,
            ``tolerance``, ``progress``, ``callback``, ``max_time`` of the
            previous release still work, with a ``DeprecationWarning``.

    Returns:
        :class:`TrajectoryOptimizationResult`.
    """
    opts = options_from_keywords("optimize_trajectory", options, deprecated, default_method="lbfgs")
    if deprecated:
        raise ConfigError(f"optimize_trajectory() got unexpected keyword(s) {', '.join(map(repr, deprecated))}; "
                          "the solver settings go in options=SolverOptions(...)")
    optimizer = opts.method
    if not isinstance(horizon, int) or horizon < 1:
        raise InputError(f"horizon must be a positive int, got {horizon!r}")
    if controls is None:
        controls = simulator.zero_controls(horizon)
    else:
        if not isinstance(controls, torch.Tensor):
            raise InputError(f"controls must be a torch.Tensor, got {type(controls).__name__}")
        if controls.ndim < 2 or controls.shape[-2:] != (horizon, simulator.nu):
            raise InputError(
                f"controls must have shape (..., {horizon}, {simulator.nu}), got {tuple(controls.shape)}"
            )
    shape = controls.shape
    functional = optimizer == "gauss_newton"

    def objective(x: torch.Tensor) -> torch.Tensor:
        u = x.reshape(shape)
        # Inside torch.func transforms a data-dependent finiteness check cannot
        # run; the solver checks every loss it sees instead.
        traj = simulator.rollout(state0, u, truncate_every=truncate_every, check_finite=not functional)
        out = cost(traj, u)
        if functional:
            if out.ndim == 0:
                raise InputError("gauss_newton needs the cost to return a vector of residuals, not a scalar")
            return out.reshape(-1)
        return loss_of(out)

    x0 = controls.detach().reshape(-1).clone()
    res = minimize(objective, x0, opts, label="optimize_trajectory")
    u = res.x.reshape(shape)
    with torch.no_grad():
        traj = simulator.rollout(state0, u)
    return TrajectoryOptimizationResult(
        controls=u,
        trajectory=traj,
        losses=res.losses,
        loss=res.losses[-1],
        iterations=res.iterations,
        evaluations=res.evaluations,
        wall_time=res.wall_time,
        converged=res.converged,
        message=res.message,
        optimizer=optimizer,
        options=opts,
    )

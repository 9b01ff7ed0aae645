"""Simulation state and stacked trajectories."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .._shapes import broadcast_shapes
from .._errors import NonFiniteError, SimulationError

__all__ = ["State", "Trajectory", "SimulationError", "NonFiniteError"]


@dataclass(frozen=True)
class State:
    """The state of a system: configuration and generalised velocity.

    Attributes:
        q: ``(..., nq)`` configuration; for a floating base
            ``[p_world (3), quat_wxyz (4), joints]``.
        v: ``(..., nv)`` generalised velocity; for a floating base
            ``[v_base (3), omega_base (3), joint rates]`` (base twist in the base frame).
    """

    q: torch.Tensor
    v: torch.Tensor

    @property
    def batch_shape(self) -> torch.Size:
        return broadcast_shapes(self.q.shape[:-1], self.v.shape[:-1])

    def detach(self) -> State:
        """The same state cut from the autograd graph."""
        return State(self.q.detach(), self.v.detach())

    def to_vector(self) -> torch.Tensor:
        """``(..., nq + nv)`` concatenation ``[q, v]`` (batch shapes broadcast)."""
        shape = self.batch_shape
        return torch.cat([self.q.expand(*shape, -1), self.v.expand(*shape, -1)], dim=-1)

    @staticmethod
    def from_vector(x: torch.Tensor, nq: int) -> State:
        """Split ``(..., nq + nv)`` into a :class:`State`."""
        return State(x[..., :nq], x[..., nq:])


@dataclass(frozen=True, eq=False)
class Trajectory:
    """States of a rollout stacked over time (time is the axis before the last).

    Attributes:
        q: ``(..., T + 1, nq)``; ``q[..., 0, :]`` is the initial configuration and
            ``q[..., t, :]`` the one after ``t`` steps.
        v: ``(..., T + 1, nv)`` likewise.
        effort: ``(..., T, nu)`` actuator efforts applied during each step (after
            saturation; evaluated at the state at the start of the step), N or N m.
        controls: ``(..., T, nu)`` the controls that were given.
        dt: step length, s.
        contact: with ``Simulator(contact=...)``, the
            :class:`~backdrive.contact.ContactResult` of every step stacked
            after the batch axes (``normal_force (..., T, np)``,
            ``force (..., T, np, 3)``, ``slip_velocity``, ``penetration``, ...;
            step ``t``'s forces are those applied from state ``t`` to ``t + 1``),
            else ``None``; ``rollout(..., contact_record=...)`` keeps only some
            fields (the others ``None``) or none (``None``).
    """

    q: torch.Tensor
    v: torch.Tensor
    effort: torch.Tensor
    controls: torch.Tensor
    dt: float
    _grad_norms: list | None = field(default=None, repr=False)
    contact: object | None = field(default=None, repr=False)

    @property
    def horizon(self) -> int:
        """Number of steps ``T``."""
        return self.q.shape[-2] - 1

    @property
    def time(self) -> torch.Tensor:
        """``(T + 1,)`` time of each stored state, s."""
        return torch.arange(self.horizon + 1, dtype=self.q.dtype, device=self.q.device) * self.dt

    def state(self, t: int) -> State:
        """The state after ``t`` steps (negative ``t`` counts from the end)."""
        return State(self.q[..., t, :], self.v[..., t, :])

    @property
    def final(self) -> State:
        return self.state(-1)

    def state_gradient_norms(self, *, check_finite: bool = True) -> torch.Tensor:
        """``(T + 1,)`` norm of the gradient of the last back-propagated loss with
        respect to each state ``[q_t, v_t]`` (all batch elements together).

        Available after ``loss.backward()`` on a rollout made with
        ``monitor_gradients=True``. A state the loss does not depend on has
        norm 0. With truncation, each norm is the gradient that reached the
        state inside its own window.

        Args:
            check_finite: raise :class:`NonFiniteError` naming the latest step
                whose gradient is NaN or infinite (back-propagation runs from
                the last step to the first, so that is where it entered).

        Raises:
            SimulationError: if the rollout was not monitored.
        """
        if self._grad_norms is None:
            raise SimulationError("rollout(..., monitor_gradients=True) is needed for gradient norms")
        norms = torch.stack([torch.sqrt(gq * gq + gv * gv) for gq, gv in self._grad_norms])
        if check_finite:
            finite = torch.isfinite(norms)
            if not bool(finite.all()):
                step = int(torch.nonzero(~finite)[-1, 0])
                raise NonFiniteError(
                    f"the gradient reaching the state at step {step} is not finite",
                    step=step,
                    what="gradient",
                )
        return norms

"""Gymnasium's ``Pendulum-v1``, batched and differentiable, in closed form."""

from __future__ import annotations

import math

import torch

from .._errors import InputError
from ._base import DiffEnv

__all__ = ["Pendulum", "angle_normalize"]


def angle_normalize(angle: torch.Tensor) -> torch.Tensor:
    """Wrap angles ``(...,)`` in radians into ``[-pi, pi)``.

    Same formula as gymnasium (``((x + pi) mod 2 pi) - pi``, with the floor
    modulo of numpy), so rewards agree at the wrap point too. Its derivative
    is 1 everywhere except on the jump.
    """
    return torch.remainder(angle + math.pi, 2.0 * math.pi) - math.pi


class Pendulum(DiffEnv):
    r"""Torque-limited pendulum swing-up, exactly gymnasium's ``Pendulum-v1``.

    State ``[theta, theta_dot]`` (rad, rad/s; ``theta = 0`` upright),
    observation ``[cos theta, sin theta, theta_dot]``, action the torque
    ``u`` in N m clipped to ``[-2, 2]``. One step of ``dt = 0.05`` s, in
    gymnasium's order (semi-implicit Euler, velocity clipped before the
    angle update, the angle itself never wrapped):

    .. math::
        \dot\theta' = \operatorname{clip}\big(\dot\theta + (\tfrac{3g}{2l}\sin\theta
                      + \tfrac{3}{ml^2}u)\,dt,\ -8, 8\big), \qquad
        \theta' = \theta + \dot\theta'\,dt

    with reward ``-(wrap(theta)**2 + 0.1 * theta_dot**2 + 0.001 * u**2)`` of
    the state *before* the step. Episodes are truncated after 200 steps and
    never terminate. Initial states are uniform in ``[-pi, pi] x [-1, 1]`` by default.

    Args:
        num_envs: number of pendulums stepped together.
        g: gravity in m/s^2 (gymnasium's default 10).
        x_init, y_init: initial angle and velocity are uniform in
            ``[-x_init, x_init] x [-y_init, y_init]``; the defaults are
            gymnasium's, and the names its ``reset(options=...)`` keys. Wider
            starts ("exploring starts") help gradient-based training.
        max_episode_steps: truncation length (gymnasium's ``TimeLimit``, 200).
        dtype, device, autoreset: see :class:`DiffEnv`.
    """

    obs_dim = 3
    action_dim = 1
    state_dim = 2
    max_episode_steps = 200
    dt = 0.05
    max_speed = 8.0
    max_torque = 2.0
    mass = 1.0
    length = 1.0

    def __init__(
        self,
        num_envs: int = 1,
        *,
        g: float = 10.0,
        x_init: float = math.pi,
        y_init: float = 1.0,
        max_episode_steps: int = 200,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        autoreset: bool = True,
    ) -> None:
        super().__init__(num_envs, dtype=dtype, device=device, autoreset=autoreset)
        self.g = float(g)
        if not (x_init >= 0 and y_init >= 0):
            raise InputError(f"x_init and y_init are half-widths and must be >= 0, got {x_init}, {y_init}")
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise InputError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
        self.max_episode_steps = max_episode_steps
        self.x_init = float(x_init)
        self.y_init = float(y_init)

    @property
    def action_low(self) -> torch.Tensor:
        return torch.full((1,), -self.max_torque, dtype=self.dtype, device=self.device)

    @property
    def action_high(self) -> torch.Tensor:
        return torch.full((1,), self.max_torque, dtype=self.dtype, device=self.device)

    @property
    def obs_low(self) -> torch.Tensor:
        return -self.obs_high

    @property
    def obs_high(self) -> torch.Tensor:
        return torch.tensor([1.0, 1.0, self.max_speed], dtype=self.dtype, device=self.device)

    def initial_state(self, n: int, generator: torch.Generator) -> torch.Tensor:
        high = torch.tensor([self.x_init, self.y_init], dtype=self.dtype, device=self.device)
        return self._uniform(-high, high, (n, 2), generator)

    def transition(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        th, thdot = state[..., 0], state[..., 1]
        u = action[..., 0].clamp(-self.max_torque, self.max_torque)
        accel = 3.0 * self.g / (2.0 * self.length) * torch.sin(th) + 3.0 / (
            self.mass * self.length**2
        ) * u
        new_thdot = (thdot + accel * self.dt).clamp(-self.max_speed, self.max_speed)
        new_th = th + new_thdot * self.dt
        return torch.stack([new_th, new_thdot], dim=-1)

    def reward(
        self, state: torch.Tensor, action: torch.Tensor, next_state: torch.Tensor
    ) -> torch.Tensor:
        th, thdot = state[..., 0], state[..., 1]
        u = action[..., 0].clamp(-self.max_torque, self.max_torque)
        return -(angle_normalize(th) ** 2 + 0.1 * thdot**2 + 0.001 * u**2)

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        th, thdot = state[..., 0], state[..., 1]
        return torch.stack([torch.cos(th), torch.sin(th), thdot], dim=-1)

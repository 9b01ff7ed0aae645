"""The batched, differentiable environment interface shared by every backdrive env.

An environment holds ``num_envs`` copies of one system. Its state is a tensor
``(num_envs, state_dim)``; one :meth:`DiffEnv.step` advances every copy by one
control period. Observations and rewards are computed with plain torch ops,
so they are differentiable with respect to the action and to the previous
state; :meth:`DiffEnv.detach` is the explicit truncation point for
backpropagation through time.

A subclass supplies four pure functions of tensors (no Python state):
:meth:`~DiffEnv.initial_state`, :meth:`~DiffEnv.transition`,
:meth:`~DiffEnv.reward` and :meth:`~DiffEnv.observe` (and optionally
:meth:`~DiffEnv.is_terminal`); the base class adds the batch bookkeeping:
episode counters, automatic resets, seeding and checkpointable state.
"""

from __future__ import annotations

import functools
import math

import torch

from .._errors import InputError

__all__ = ["DiffEnv"]


@functools.lru_cache(maxsize=256)
def _width(low: float, high: float, dtype: torch.dtype) -> float:
    """``high - low`` as a subtraction in ``dtype`` gives it (of the two rounded to ``dtype``), a Python float."""
    return float(torch.tensor(high, dtype=dtype, device="cpu") - torch.tensor(low, dtype=dtype, device="cpu"))


class DiffEnv:
    """``num_envs`` copies of a differentiable system, stepped together.

    Every copy counts as one environment: one call of :meth:`step` is
    ``num_envs`` environment transitions.

    Episodes end by termination (:meth:`is_terminal`, e.g. a fall) or by
    truncation after :attr:`max_episode_steps` steps. With ``autoreset=True``
    (the default) a finished copy restarts in the same call: the observation
    returned is the new episode's first one and the last observation of the
    old episode is in ``info["final_obs"]`` (gymnasium's "same-step" vector
    autoreset). Gradients flow into ``final_obs``; the fresh initial states
    carry none.

    Attributes (set by subclasses):
        obs_dim: length of one observation.
        action_dim: length of one action.
        state_dim: length of one state vector.
        max_episode_steps: steps after which an episode is truncated.
        dt: control period in seconds.

    Args:
        num_envs: number of copies N >= 1.
        dtype: ``torch.float32`` or ``torch.float64``.
        device: torch device of every tensor the env makes.
        autoreset: restart finished copies inside :meth:`step`.
    """

    obs_dim: int
    action_dim: int
    state_dim: int
    max_episode_steps: int
    dt: float

    def __init__(
        self,
        num_envs: int = 1,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        autoreset: bool = True,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise InputError(f"num_envs must be a positive int, got {num_envs!r}")
        if dtype not in (torch.float32, torch.float64):
            raise InputError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.num_envs = num_envs
        self.dtype = dtype
        # An empty tensor resolves "cuda" to "cuda:0", so device checks compare equal.
        self.device = torch.empty(0, device=device).device
        self.autoreset = bool(autoreset)
        self._generator = torch.Generator(device=self.device)
        self._generator.seed()
        self._state: torch.Tensor | None = None
        self._elapsed = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self._nan_resets = torch.zeros((), dtype=torch.long, device=self.device)

    # ----------------------------------------------------------------- hooks
    def _robot_model(self, robot, name: str):
        """``robot``, checked against the env's dtype and device, or the shipped ``name`` model."""
        if robot is None:
            from ..data import load

            return load(name, dtype=self.dtype, device=self.device)
        if robot.dtype != self.dtype or robot.device != self.device:
            raise InputError(f"robot is {robot.dtype} on {robot.device}, the env {self.dtype} on {self.device}")
        return robot

    def initial_state(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` random initial states ``(n, state_dim)`` drawn with ``generator``."""
        raise NotImplementedError

    def transition(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Next state ``(..., state_dim)`` from ``state`` and ``action`` ``(..., action_dim)``."""
        raise NotImplementedError

    def reward(
        self, state: torch.Tensor, action: torch.Tensor, next_state: torch.Tensor
    ) -> torch.Tensor:
        """Reward ``(...,)`` of the transition ``state --action--> next_state``."""
        raise NotImplementedError

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        """Observation ``(..., obs_dim)`` of ``state``."""
        raise NotImplementedError

    def is_terminal(self, state: torch.Tensor) -> torch.Tensor:
        """Boolean ``(...,)``: the episode ends (not truncated) in ``state``. Default: never."""
        return torch.zeros(state.shape[:-1], dtype=torch.bool, device=state.device)

    @property
    def action_low(self) -> torch.Tensor:
        """Lower action bound ``(action_dim,)``; actions are clipped to it."""
        raise NotImplementedError

    @property
    def action_high(self) -> torch.Tensor:
        """Upper action bound ``(action_dim,)``."""
        raise NotImplementedError

    @property
    def obs_low(self) -> torch.Tensor:
        """Lower observation bound ``(obs_dim,)`` (``-inf`` where unbounded)."""
        return torch.full((self.obs_dim,), -math.inf, dtype=self.dtype, device=self.device)

    @property
    def obs_high(self) -> torch.Tensor:
        """Upper observation bound ``(obs_dim,)`` (``inf`` where unbounded)."""
        return torch.full((self.obs_dim,), math.inf, dtype=self.dtype, device=self.device)

    # ------------------------------------------------------------ public API
    @property
    def state(self) -> torch.Tensor:
        """Current state ``(num_envs, state_dim)``; may carry an autograd graph."""
        if self._state is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before using the state")
        return self._state

    @property
    def elapsed(self) -> torch.Tensor:
        """Steps taken in the current episode of each copy, ``(num_envs,)`` int64."""
        return self._elapsed

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Restart every copy from a random initial state.

        Args:
            seed: reseeds the env's generator; ``None`` continues its stream.

        Returns:
            The first observations ``(num_envs, obs_dim)``.
        """
        if seed is not None:
            self._generator.manual_seed(int(seed))
        self._state = self._initial(self.num_envs)
        self._elapsed = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        return self.observe(self._state)

    def set_state(self, state: torch.Tensor, elapsed: torch.Tensor | int | None = None) -> torch.Tensor:
        """Put every copy in ``state`` ``(num_envs, state_dim)``; gradients may flow from it.

        Args:
            state: the new state; it is used as is (not copied, not detached).
            elapsed: episode step counters; default 0.

        Returns:
            The observations ``(num_envs, obs_dim)`` of ``state``.
        """
        self._check(state, (self.num_envs, self.state_dim), "state")
        self._state = state
        if elapsed is None:
            elapsed = 0
        self._elapsed = torch.as_tensor(elapsed, dtype=torch.long, device=self.device).expand(
            self.num_envs
        ).clone()
        return self.observe(state)

    def observation(self) -> torch.Tensor:
        """Observations ``(num_envs, obs_dim)`` of the current state."""
        return self.observe(self.state)

    def detach(self) -> None:
        """Cut the autograd graph at the current state (truncated backpropagation)."""
        self._state = self.state.detach()

    def step(
        self, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Advance every copy by one control period.

        Args:
            action: ``(num_envs, action_dim)``, clipped to the action bounds.

        Returns:
            ``(obs, reward, terminated, truncated, info)``: observations
            ``(N, obs_dim)`` (of the new episode where a copy was reset),
            rewards ``(N,)``, boolean ``terminated`` and ``truncated`` ``(N,)``,
            and ``info`` with ``final_obs`` ``(N, obs_dim)``, the observation
            reached by this step before any reset, and ``nonfinite`` ``(N,)``
            bool: the copies whose new state was NaN or infinite.

        A copy whose new state is non-finite is reset (even with ``autoreset=False``), counted in
        :attr:`nonfinite_resets` and reported as truncated, with reward 0 and
        ``final_obs`` the observation of the state it started the step from.
        Its rows of the gradient reaching ``action`` and the previous state
        are set to zero, so the NaN never reaches the policy's gradient.
        """
        self._check(action, (self.num_envs, self.action_dim), "action")
        state = self.state
        next_state = self.transition(state, action)
        reward = self.reward(state, action, next_state)
        # A copy whose simulation produced a NaN or an infinity is reset, counted
        # and reported; its transition is cut out of the gradient (below). A
        # non-finite reward from a finite state is left alone: that is a bug
        # in the reward or a diverging policy, which the trainer reports.
        bad = ~torch.isfinite(next_state).all(-1)
        self._nan_resets = self._nan_resets + bad.sum()
        _zero_rows_of_gradient(action, bad)
        _zero_rows_of_gradient(state, bad)
        reward = torch.where(bad, torch.zeros_like(reward), reward)
        fallback = state.detach()
        next_state = torch.where(bad[:, None], fallback, next_state)
        self._elapsed = self._elapsed + 1
        terminated = self.is_terminal(next_state) & ~bad
        # A non-finite copy ends its episode as truncated: the simulation broke
        # down, the policy did not fail, so its value is not zeroed.
        truncated = ((self._elapsed >= self.max_episode_steps) & ~terminated) | bad
        final_obs = self.observe(next_state)
        if self.autoreset:
            done = terminated | truncated
            # Draw fresh states every step (not only when a copy is done): no
            # host sync on `done`, and the random stream stays a function of
            # the step count alone, so runs replay exactly.
            fresh = self._initial(self.num_envs)
            next_state = torch.where(done[:, None], fresh, next_state)
            self._elapsed = torch.where(done, torch.zeros_like(self._elapsed), self._elapsed)
            obs = torch.where(done[:, None], self.observe(fresh), final_obs)
        elif bool(bad.any()):
            fresh = self._initial(self.num_envs)
            next_state = torch.where(bad[:, None], fresh, next_state)
            self._elapsed = torch.where(bad, torch.zeros_like(self._elapsed), self._elapsed)
            obs = torch.where(bad[:, None], self.observe(fresh), final_obs)
        else:
            obs = final_obs
        self._state = next_state
        return obs, reward, terminated, truncated, {"final_obs": final_obs, "nonfinite": bad}

    @property
    def nonfinite_resets(self) -> int:
        """How many copy-steps produced a NaN or infinite state and were reset."""
        return int(self._nan_resets)

    def seed(self, seed: int) -> None:
        """Reseed the generator used for initial states without resetting."""
        self._generator.manual_seed(int(seed))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to continue exactly: state, counters and generator."""
        return {
            "state": self.state.detach().clone(),
            "elapsed": self._elapsed.clone(),
            "generator": self._generator.get_state(),
        }

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state_dict` returned."""
        state = state_dict["state"].to(device=self.device, dtype=self.dtype)
        self.set_state(state, state_dict["elapsed"].to(self.device))
        self._generator.set_state(state_dict["generator"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, dtype={self.dtype}, "
            f"device={self.device}, obs_dim={self.obs_dim}, action_dim={self.action_dim})"
        )

    # -------------------------------------------------------------- helpers
    def _initial(self, n: int) -> torch.Tensor:
        state = self.initial_state(n, self._generator)
        return state.to(dtype=self.dtype, device=self.device)

    def _uniform(self, low, high, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """Uniform samples in ``[low, high)`` of the env's dtype."""
        u = torch.rand(shape, generator=generator, dtype=self.dtype, device=self.device)
        if isinstance(low, (int, float)) and isinstance(high, (int, float)):
            # Numbers stay Python floats (made tensors they would be copied to a
            # GPU, a host synchronisation, at every draw); the width rounded as
            # the dtype's subtraction rounds it, so the samples are the same.
            return low + _width(float(low), float(high), self.dtype) * u
        low = torch.as_tensor(low, dtype=self.dtype, device=self.device)
        high = torch.as_tensor(high, dtype=self.dtype, device=self.device)
        return low + (high - low) * u

    def _check(self, x: torch.Tensor, shape: tuple[int, ...], name: str) -> None:
        if not isinstance(x, torch.Tensor):
            raise InputError(f"{type(self).__name__}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != shape:
            raise InputError(
                f"{type(self).__name__}: {name} must have shape {shape} (num_envs, {name} size), "
                f"got {tuple(x.shape)}"
            )
        if x.dtype != self.dtype or x.device != self.device:
            raise InputError(
                f"{type(self).__name__}: {name} must be {self.dtype} on {self.device}, "
                f"got {x.dtype} on {x.device}"
            )


def _zero_rows_of_gradient(x: torch.Tensor, rows: torch.Tensor) -> None:
    """Make the gradient reaching ``x`` ``(N, ...)`` zero in ``rows`` ``(N,)`` bool.

    ``torch.where`` alone would not do: the backward pass of the step still
    multiplies the zero by the non-finite partial derivatives of the broken
    copy (``0 * nan = nan``), so the rows are zeroed where they leave the step.
    """
    if isinstance(x, torch.Tensor) and x.requires_grad:
        mask = rows.reshape(rows.shape + (1,) * (x.ndim - 1))
        x.register_hook(lambda g: g if g is None else torch.where(mask, torch.zeros_like(g), g))

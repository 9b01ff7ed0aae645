"""Gymnasium views of backdrive environments (imports gymnasium; loaded lazily)."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from .._errors import InputError
from ._base import DiffEnv

__all__ = ["GymnasiumEnv", "GymnasiumVectorEnv"]


def _box(low: torch.Tensor, high: torch.Tensor) -> spaces.Box:
    return spaces.Box(
        low=low.detach().cpu().numpy().astype(np.float32),
        high=high.detach().cpu().numpy().astype(np.float32),
        dtype=np.float32,
    )


def _seed_from(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**62))


class GymnasiumEnv(gymnasium.Env):
    """One backdrive environment (``num_envs == 1``) as a ``gymnasium.Env``.

    Observations are float32 numpy arrays, rewards Python floats. No gradients
    are recorded. The wrapped env's initial states are drawn from a seed that
    gymnasium's ``np_random`` generates, so ``reset(seed=s)`` is reproducible
    and a following ``reset()`` is too.
    """

    metadata = {"render_modes": []}

    def __init__(self, env: DiffEnv) -> None:
        if env.num_envs != 1:
            raise InputError(f"GymnasiumEnv wraps one environment, got num_envs={env.num_envs}")
        self.env = env
        self.observation_space = _box(env.obs_low, env.obs_high)
        self.action_space = _box(env.action_low, env.action_high)
        self.render_mode = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        with torch.no_grad():
            obs = self.env.reset(seed=_seed_from(self.np_random))
        return self._obs(obs[0]), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = torch.as_tensor(np.asarray(action), dtype=self.env.dtype, device=self.env.device)
        with torch.no_grad():
            _, reward, terminated, truncated, info = self.env.step(a.reshape(1, self.env.action_dim))
        # The single-env API returns the observation the step reached; the
        # wrapped env may already have restarted, the caller resets explicitly.
        return (
            self._obs(info["final_obs"][0]),
            float(reward[0]),
            bool(terminated[0]),
            bool(truncated[0]),
            {},
        )

    def _obs(self, obs: torch.Tensor) -> np.ndarray:
        return obs.detach().cpu().numpy().astype(np.float32)


class GymnasiumVectorEnv(VectorEnv):
    """A batched backdrive environment as a ``gymnasium.vector.VectorEnv``.

    Autoreset is gymnasium's ``SAME_STEP`` mode: a finished copy restarts in
    the step that ends it, its last observation in ``info["final_obs"]`` (an
    object array, with the mask ``info["_final_obs"]``).
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, env: DiffEnv) -> None:
        if not env.autoreset:
            raise InputError("GymnasiumVectorEnv needs an env built with autoreset=True")
        self.env = env
        self.num_envs = env.num_envs
        self.single_observation_space = _box(env.obs_low, env.obs_high)
        self.single_action_space = _box(env.action_low, env.action_high)
        self.observation_space = gymnasium.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.render_mode = None

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if isinstance(seed, (list, tuple)):
            seed = seed[0]
        super().reset(seed=seed)
        with torch.no_grad():
            obs = self.env.reset(seed=_seed_from(self.np_random))
        return obs.cpu().numpy().astype(np.float32), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        a = torch.as_tensor(np.asarray(actions), dtype=self.env.dtype, device=self.env.device)
        with torch.no_grad():
            obs, reward, terminated, truncated, info = self.env.step(
                a.reshape(self.num_envs, self.env.action_dim)
            )
        term = terminated.cpu().numpy()
        trunc = truncated.cpu().numpy()
        done = term | trunc
        infos: dict[str, Any] = {}
        if done.any():
            final = info["final_obs"].cpu().numpy().astype(np.float32)
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = final[i]
            infos["final_obs"] = final_obs
            infos["_final_obs"] = done.copy()
        return (
            obs.cpu().numpy().astype(np.float32),
            reward.cpu().numpy().astype(np.float64),
            term,
            trunc,
            infos,
        )

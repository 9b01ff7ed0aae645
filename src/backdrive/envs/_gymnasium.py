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

__all__ = ["GymnasiumEnv", "GymnasiumVectorEnv", "sb3_vec_env"]


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


_SB3_VEC_ENV: type | None = None


def sb3_vec_env(env: DiffEnv) -> Any:
    """A Stable-Baselines3 ``VecEnv`` over all copies of a batched backdrive env.

    One torch call steps every copy (``GymnasiumVectorEnv`` underneath), which
    on the quadruped is about 14x cheaper per env step than SB3's
    ``DummyVecEnv`` over 16 single-copy ``to_gymnasium`` envs (measured at 16
    copies; ``docs/locomotion.md``). SB3's conventions: ``step`` returns
    ``(obs, reward, done, infos)`` with ``done = terminated | truncated``; a
    finished copy restarts in the same step and its last observation is
    ``infos[i]["terminal_observation"]``, with ``infos[i]["TimeLimit.truncated"]``
    true for a time limit (so SB3 bootstraps the value there). ``seed(s)``
    then ``reset()`` is reproducible. Needs stable-baselines3 (imported here).

    Raises:
        InputError: ``env`` is not a ``DiffEnv`` or was built with ``autoreset=False``.
        MissingDependencyError: stable-baselines3 is not installed.
    """
    global _SB3_VEC_ENV
    if not isinstance(env, DiffEnv):
        raise InputError(f"sb3_vec_env expects a backdrive DiffEnv, got {type(env).__name__}")
    if _SB3_VEC_ENV is None:
        try:
            from stable_baselines3.common.vec_env.base_vec_env import VecEnv as SB3VecEnv
        except ImportError as exc:  # pragma: no cover - depends on the install
            from .._errors import MissingDependencyError

            raise MissingDependencyError("sb3_vec_env needs stable-baselines3: pip install stable-baselines3") from exc

        class BackdriveSB3VecEnv(SB3VecEnv):
            """SB3 ``VecEnv`` view of a ``GymnasiumVectorEnv`` (see ``sb3_vec_env``)."""

            def __init__(self, genv: GymnasiumVectorEnv) -> None:
                self.genv = genv
                super().__init__(genv.num_envs, genv.single_observation_space, genv.single_action_space)
                self._actions: np.ndarray | None = None

            def reset(self) -> np.ndarray:
                obs, _ = self.genv.reset(seed=self._seeds[0])
                self._reset_seeds()
                self._reset_options()
                return obs

            def step_async(self, actions: np.ndarray) -> None:
                self._actions = actions

            def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
                obs, reward, term, trunc, info = self.genv.step(self._actions)
                infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
                for i in np.flatnonzero(term | trunc):
                    infos[i]["terminal_observation"] = info["final_obs"][i]
                    infos[i]["TimeLimit.truncated"] = bool(trunc[i] and not term[i])
                return obs, reward.astype(np.float32), term | trunc, infos

            def close(self) -> None:
                pass

            def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
                return [getattr(self.genv, attr_name)] * len(list(self._get_indices(indices)))

            def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
                setattr(self.genv, attr_name, value)

            def env_method(self, method_name: str, *method_args: Any, indices: Any = None, **method_kwargs: Any) -> list[Any]:
                # One batched env: the method runs once, for every copy.
                out = getattr(self.genv, method_name)(*method_args, **method_kwargs)
                return [out] * len(list(self._get_indices(indices)))

            def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
                return [False] * len(list(self._get_indices(indices)))

        _SB3_VEC_ENV = BackdriveSB3VecEnv
    return _SB3_VEC_ENV(GymnasiumVectorEnv(env))

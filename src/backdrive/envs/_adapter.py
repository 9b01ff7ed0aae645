"""``to_gymnasium``: gymnasium is optional, so it is imported only when asked for."""

from __future__ import annotations

from typing import Any

from .._errors import InputError, MissingDependencyError
from ._base import DiffEnv

__all__ = ["to_gymnasium", "to_sb3_vec_env"]


def to_gymnasium(env: DiffEnv, *, vector: bool | None = None) -> Any:
    """A standard gymnasium view of a backdrive environment, on the same dynamics.

    Stable-Baselines3 and other gymnasium-based learners then train on exactly
    the transitions backdrive's gradient-based trainers see.

    Args:
        env: the backdrive environment; the adapter steps it in place.
        vector: ``False`` gives a ``gymnasium.Env`` (needs ``env.num_envs == 1``),
            ``True`` a ``gymnasium.vector.VectorEnv`` over all copies;
            ``None`` picks by ``env.num_envs``.

    Returns:
        A ``GymnasiumEnv`` or ``GymnasiumVectorEnv``: float32 observation and
        action ``Box`` spaces from the env's bounds, numpy in and out.

    Raises:
        MissingDependencyError: gymnasium is not installed (an ImportError).
        InputError: ``vector=False`` with several copies.
    """
    if not isinstance(env, DiffEnv):
        raise InputError(f"to_gymnasium expects a backdrive DiffEnv, got {type(env).__name__}")
    try:
        from ._gymnasium import GymnasiumEnv, GymnasiumVectorEnv
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingDependencyError(
            "to_gymnasium needs gymnasium: pip install 'backdrive[rl]' "
            "(or 'gymnasium>=1.0')"
        ) from exc
    if vector is None:
        vector = env.num_envs > 1
    if vector:
        return GymnasiumVectorEnv(env)
    if env.num_envs != 1:
        raise InputError(
            f"to_gymnasium(vector=False) needs num_envs == 1, got {env.num_envs}; "
            "build the env with num_envs=1 or pass vector=True"
        )
    return GymnasiumEnv(env)


def to_sb3_vec_env(env: DiffEnv) -> Any:
    """A Stable-Baselines3 ``VecEnv`` over all copies of a batched backdrive env.

    One torch call steps every copy, so PPO and other SB3 learners train on
    the batched env directly (about 14x cheaper per env step on the quadruped
    than SB3's ``DummyVecEnv`` over single-copy :func:`to_gymnasium` envs;
    ``docs/locomotion.md``). Finished copies restart in the same step, with
    their last observation in ``infos[i]["terminal_observation"]`` and
    ``infos[i]["TimeLimit.truncated"]`` set at a time limit.

    Raises:
        MissingDependencyError: gymnasium or stable-baselines3 is not installed.
        InputError: ``env`` is not a backdrive env.
    """
    if not isinstance(env, DiffEnv):
        raise InputError(f"to_sb3_vec_env expects a backdrive DiffEnv, got {type(env).__name__}")
    try:
        from ._gymnasium import sb3_vec_env
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingDependencyError(
            "to_sb3_vec_env needs gymnasium and stable-baselines3: "
            "pip install gymnasium stable-baselines3"
        ) from exc
    return sb3_vec_env(env)

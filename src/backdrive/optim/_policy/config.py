"""The settings of policy training: one frozen config, validated when it is built."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from ..._errors import InputTypeError, PolicyConfigError
from ...envs._base import DiffEnv
from .networks import ACTIVATIONS, SQUASHES

__all__ = ["ALGOS", "PolicyTrainerConfig"]

#: The training algorithms: short-horizon BPTT, and the same with a critic.
ALGOS = ("apg", "shac")


def _choices(values) -> str:
    return ", ".join(map(repr, values))


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive_int(name: str, x: Any, *, none: bool = False) -> None:
    if none and x is None:
        return
    if not _is_int(x) or x < 1:
        raise PolicyConfigError(f"{name} must be a positive int{' or None' if none else ''}, got {x!r}")


def _positive_real(name: str, x: Any, *, none: bool = False) -> None:
    if none and x is None:
        return
    if not _is_real(x) or not x > 0:
        raise PolicyConfigError(
            f"{name} must be a positive finite number{' or None' if none else ''}, got {x!r}"
        )


def _real_in(name: str, x: Any, low: float, high: float, *, closed_low: bool, closed_high: bool) -> None:
    ok = _is_real(x) and (x >= low if closed_low else x > low) and (x <= high if closed_high else x < high)
    if not ok:
        interval = f"{'[' if closed_low else '('}{low:g}, {high:g}{']' if closed_high else ')'}"
        raise PolicyConfigError(f"{name} must be in {interval}, got {x!r}")


@dataclasses.dataclass(frozen=True)
class PolicyTrainerConfig:
    """The settings of a :class:`PolicyTrainer` and :func:`train_policy`, frozen and validated.

    Every value is checked when the config is built (a bad one raises
    :class:`~backdrive.PolicyConfigError` naming it and its valid range);
    the checks that need the env (the horizon against the episode length,
    the minibatch count against the samples of a window) are in
    :meth:`check_env`. ``train_policy`` and ``PolicyTrainer`` accept every
    field as a keyword too, which overrides the field of the ``config`` (or
    preset) they are given. The defaults are plain SHAC, generic sizes not
    tuned for any env: see :mod:`~backdrive.optim` presets such as
    ``PENDULUM_SHAC`` for settings that solve a task.

    Attributes:
        algo: ``"apg"`` (short-horizon BPTT) or ``"shac"`` (with a critic).
        horizon: window length H in steps, at most ``env.max_episode_steps``.
        lr: actor learning rate (Adam).
        critic_lr: critic learning rate (SHAC).
        gamma: discount factor in (0, 1].
        lam: TD(lambda) mixing of the critic targets (SHAC), in [0, 1].
        hidden: hidden layer widths of actor and critic (a list becomes a tuple).
        activation: ``"elu"``, ``"tanh"``, ``"relu"`` or ``"silu"``.
        max_grad_norm: clip the actor gradient to this norm (``None``: off);
            the critic's is clipped to ten times it.
        critic_iterations: epochs over the critic's samples per update, or,
            with ``critic_batch_size``, gradient steps per update.
        critic_minibatches: minibatches per epoch (without ``critic_batch_size``),
            at most ``num_envs * horizon``.
        critic_replay: windows the critic fits each update (the newest and
            the ones before it, TD(lambda) targets recomputed with the current
            target critic); 1 is plain SHAC. A large value keeps every past
            window (off-policy data, reused without new env steps).
        critic_batch_size: ``None``: ``critic_iterations`` epochs of
            ``critic_minibatches`` minibatches. An int: ``critic_iterations``
            gradient steps, each on this many samples drawn at random from
            the replayed windows (many cheap steps per env step, as SAC does).
        actor_replay_steps: extra actor steps per update on transitions drawn
            from the replayed windows (SHAC only; 0: off). Each scores the
            policy's action ``a*`` at a stored observation with the first-order
            model of that stored transition, ``r + dr/da (a* - a) + gamma
            V(o' + do'/da (a* - a))`` (SVG(1)-style, the target critic's
            value); the action Jacobians come from the transition itself, so
            these steps take no new env steps. Exact for dynamics linear in
            the action within the box (the pendulum), a trust-region
            approximation otherwise.
        actor_batch_size: transitions per replayed actor step.
        target_alpha: target critic update ``target <- a * target + (1 - a) * critic``,
            ``a`` in [0, 1).
        betas: Adam betas of both optimisers, each in [0, 1).
        action_noise: std of Gaussian exploration noise, as a fraction of
            the action half-range (reparameterised, so gradients pass).
        reward_scale: rewards are multiplied by it inside the losses (keeps
            values near unit scale for the critic); logged returns are unscaled.
        squash: ``"tanh"`` or ``"clip"`` (straight-through) into the action box.
        preact_penalty: weight of the squared pre-activation excess beyond
            the box.
        normalize_obs: keep running observation statistics (policy and critic input).
        lr_decay_updates: linear decay of both learning rates to zero at this
            update (``None``: constant).
        max_action_change: a trust-region-like cap on each actor step
            (``None``: off): the root-mean-square change of the policy's
            actions on the window's observations, in units of the action
            half-range. A step that moves them more is scaled back (the
            parameters move part of the way from the old to the new ones)
            until it does not; Adam's moments keep the full step.
        action_change_memory: with ``max_action_change``, also cap the change
            on this many past observations (per process; 0: the window's
            only): a uniform random sample of every window seen so far
            (reservoir sampling, the trainer's stream). The step is scaled
            back until the RMS change is within the cap on the window *and*
            on the memory, so states the current windows no longer visit
            (e.g. the episode starts, once every copy is past them) are not
            moved further than the window's.
        random_episode_start: start each copy's first episode at a random
            step in ``[0, max_episode_steps)`` of its step counter (the state
            is the env's usual initial one), so the copies truncate at
            different times. Without it every copy starts and truncates
            together, and each window holds the same slice of episode time
            for all of them (SHAC's windows are short: the episode starts are
            not trained on again until the first truncation).
        seed: seeds the networks, the env and every sample the trainer draws.
    """

    algo: str = "shac"
    horizon: int = 32
    lr: float = 2e-3
    critic_lr: float = 2e-3
    gamma: float = 0.99
    lam: float = 0.95
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "elu"
    max_grad_norm: float | None = 1.0
    critic_iterations: int = 8
    critic_minibatches: int = 4
    critic_replay: int = 1
    critic_batch_size: int | None = None
    actor_replay_steps: int = 0
    actor_batch_size: int = 256
    target_alpha: float = 0.2
    betas: tuple[float, float] = (0.7, 0.95)
    action_noise: float = 0.0
    reward_scale: float = 1.0
    squash: str = "tanh"
    preact_penalty: float = 0.0
    normalize_obs: bool = True
    lr_decay_updates: int | None = None
    max_action_change: float | None = None
    action_change_memory: int = 0
    random_episode_start: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        # Lists become tuples: the config stays hashable and compares equal
        # to the one stored in a checkpoint.
        for name in ("hidden", "betas"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.algo not in ALGOS:
            raise PolicyConfigError(f"unknown algo {self.algo!r}; valid: {_choices(ALGOS)}")
        _positive_int("horizon", self.horizon)
        _positive_real("lr", self.lr)
        _positive_real("critic_lr", self.critic_lr)
        _real_in("gamma", self.gamma, 0.0, 1.0, closed_low=False, closed_high=True)
        _real_in("lam", self.lam, 0.0, 1.0, closed_low=True, closed_high=True)
        h = self.hidden
        if not isinstance(h, tuple) or not all(_is_int(w) and w >= 1 for w in h):
            raise PolicyConfigError(f"hidden must be a sequence of positive ints, got {h!r}")
        if self.activation not in ACTIVATIONS:
            raise PolicyConfigError(f"unknown activation {self.activation!r}; valid: {_choices(ACTIVATIONS)}")
        _positive_real("max_grad_norm", self.max_grad_norm, none=True)
        _positive_int("critic_iterations", self.critic_iterations)
        _positive_int("critic_minibatches", self.critic_minibatches)
        if not _is_int(self.critic_replay) or self.critic_replay < 1:
            raise PolicyConfigError(f"critic_replay must be a positive int (windows), got {self.critic_replay!r}")
        _positive_int("critic_batch_size", self.critic_batch_size, none=True)
        ar = self.actor_replay_steps
        if not _is_int(ar) or ar < 0:
            raise PolicyConfigError(f"actor_replay_steps must be a non-negative int, got {ar!r}")
        if ar > 0 and self.algo != "shac":
            raise PolicyConfigError("actor_replay_steps needs a critic: use it with algo 'shac'")
        _positive_int("actor_batch_size", self.actor_batch_size)
        _real_in("target_alpha", self.target_alpha, 0.0, 1.0, closed_low=True, closed_high=False)
        b = self.betas
        if not (isinstance(b, tuple) and len(b) == 2 and all(_is_real(x) and 0 <= x < 1 for x in b)):
            raise PolicyConfigError(f"betas must be two numbers in [0, 1), got {b!r}")
        for name in ("action_noise", "preact_penalty"):
            x = getattr(self, name)
            if not _is_real(x) or x < 0:
                raise PolicyConfigError(f"{name} must be a finite number >= 0, got {x!r}")
        _positive_real("reward_scale", self.reward_scale)
        if self.squash not in SQUASHES:
            raise PolicyConfigError(f"unknown squash {self.squash!r}; valid: {_choices(SQUASHES)}")
        for name in ("normalize_obs", "random_episode_start"):
            if not isinstance(getattr(self, name), bool):
                raise PolicyConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        _positive_int("lr_decay_updates", self.lr_decay_updates, none=True)
        _positive_real("max_action_change", self.max_action_change, none=True)
        m = self.action_change_memory
        if not _is_int(m) or m < 0:
            raise PolicyConfigError(f"action_change_memory must be a non-negative int (observations), got {m!r}")
        if m > 0 and self.max_action_change is None:
            raise PolicyConfigError("action_change_memory needs max_action_change (the cap it applies)")
        if not _is_int(self.seed) or self.seed < 0:
            raise PolicyConfigError(f"seed must be a non-negative int, got {self.seed!r}")

    # ------------------------------------------------------------ building
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the settings, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes: Any) -> PolicyTrainerConfig:
        """A copy with some fields changed, validated like a new config.

        Raises:
            InputTypeError: a name that is not a setting (a TypeError; the message lists the valid ones).
            PolicyConfigError: a bad value.
        """
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise InputTypeError(
                f"unknown training setting(s) {', '.join(map(repr, unknown))}; "
                f"valid: {', '.join(self.field_names())}"
            )
        return dataclasses.replace(self, **changes) if changes else self

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict of numbers, strings, tuples and ``None`` (what checkpoints store)."""
        return {name: getattr(self, name) for name in self.field_names()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PolicyTrainerConfig:
        """Settings from :meth:`to_dict` output; missing fields take their defaults.

        A missing field is one added after the dict was written, when it
        behaved as its default does.

        Raises:
            PolicyConfigError: an unknown field or a bad value.
        """
        if not isinstance(values, Mapping):
            raise PolicyConfigError(f"training settings must be a mapping, got {type(values).__name__}")
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise PolicyConfigError(
                f"unknown training setting(s) {', '.join(map(repr, unknown))}; valid: {', '.join(cls.field_names())}"
            )
        return cls(**values)

    def changed(self) -> dict[str, Any]:
        """The fields that differ from the defaults."""
        default = PolicyTrainerConfig()
        return {k: v for k, v in self.to_dict().items() if v != getattr(default, k)}

    # ---------------------------------------------------------- env checks
    def check_env(self, env: DiffEnv) -> None:
        """The checks that need the env: its type, the horizon and the critic's minibatches.

        Raises:
            PolicyConfigError: ``env`` is not a backdrive env, the horizon is
                longer than its episodes, or a window has fewer samples than
                ``critic_minibatches``.
        """
        if not isinstance(env, DiffEnv):
            raise PolicyConfigError(f"env must be a backdrive DiffEnv, got {type(env).__name__}")
        if self.horizon > env.max_episode_steps:
            raise PolicyConfigError(
                f"horizon {self.horizon} is longer than the episode ({type(env).__name__}.max_episode_steps = "
                f"{env.max_episode_steps}); use horizon <= {env.max_episode_steps}"
            )
        samples = env.num_envs * self.horizon
        if self.critic_minibatches > samples:
            raise PolicyConfigError(
                f"critic_minibatches must be an int in [1, num_envs * horizon = {samples}], "
                f"got {self.critic_minibatches!r}"
            )

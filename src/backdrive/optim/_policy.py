"""Policy learning through a differentiable environment: APG and SHAC.

Both algorithms roll the policy out for a short window of ``horizon`` steps in
every copy of a :class:`~backdrive.envs.DiffEnv`, backpropagate the window's
return through the simulator into the policy parameters, take one Adam step,
and cut the graph (``env.detach()``) before the next window. Episodes carry
on across windows, so after a few windows the states cover whole episodes.

- ``"apg"`` (analytic policy gradient): short-horizon backpropagation through
  time of the discounted window return, with gradient-norm clipping.
- ``"shac"`` (short-horizon actor-critic, Xu et al. 2022, "Accelerated Policy
  Learning with Parallel Differentiable Simulation"): the same window return
  plus a learned value of the state where the window or the episode ends, so
  the actor sees past the window; the critic regresses TD(lambda) targets
  computed from the window with a slowly moving target critic.

The window objective for copy ``i`` (``d`` = 1 for a truncated episode end
and at the window end, 0 after a termination; ``k_t`` the steps since the
segment started):

.. math::
    J_i = \\sum_{t<H} \\gamma^{k_t}\\big(r_t + \\gamma\\, e_t\\, d_t\\, V(o^{final}_t)\\big)

where ``e_t`` marks a segment end (episode end or ``t = H-1``). The actor
minimises ``-mean_i J_i / H``.

Data reuse (SHAC, off by default): ``critic_replay`` keeps past windows for
the critic, ``critic_batch_size`` turns its fit into many random-minibatch
steps, and ``actor_replay_steps`` adds actor steps on replayed transitions
through the action Jacobians recorded with them (SVG(1)-style). None of them
calls the simulator: ``env_steps`` counts the windows' transitions only.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._errors import PolicyConfigError, TrainingDivergedError
from ..envs._base import DiffEnv
from ._progress import ProgressBar

__all__ = [
    "ALGOS",
    "PENDULUM_SHAC",
    "CARTPOLE_SHAC",
    "PolicyTrainerConfig",
    "PolicyConfigError",
    "TrainingDivergedError",
    "ObsNormalizer",
    "MLPPolicy",
    "ValueCritic",
    "PolicyTrainer",
    "train_policy",
    "evaluate_policy",
    "load_policy",
]

ALGOS = ("apg", "shac")

#: SHAC settings that solve gymnasium's Pendulum-v1 (return >= -200) in about
#: 1,000 environment steps and reach about -140 by 2,000:
#: ``Pendulum(**PENDULUM_SHAC["env"])`` with exploring starts (speeds up to
#: 8 rad/s, 8-step episodes) and ``train_policy(env, "shac",
#: **PENDULUM_SHAC["train"])``: 8-step windows of 8 envs (64 env steps per
#: update), the critic refitted on every past window (32 random minibatches
#: of 256 per update), and 32 replayed actor steps per update through the
#: transitions' stored action Jacobians. 40 updates, 2,560 env steps. Used by
#: the demo, ``examples/pendulum_policy.py`` and ``benchmarks/learning.py``.
PENDULUM_SHAC = {
    "env": {"num_envs": 8, "y_init": 8.0, "max_episode_steps": 8},
    "train": {
        "updates": 40,
        "horizon": 8,
        "lr": 5e-3,
        "critic_lr": 3e-3,
        "gamma": 0.99,
        "reward_scale": 0.02,
        "action_noise": 0.3,
        "critic_iterations": 32,
        "critic_batch_size": 256,
        "critic_replay": 1000,
        "actor_replay_steps": 32,
        "actor_batch_size": 256,
    },
}
#: SHAC settings that swing the cart-pole up from hanging and balance it
#: (``CartPoleSwingUp``: return about 140, the pole upright in the last 50 steps
#: of every test episode, after about 180,000 env steps):
#: ``CartPoleSwingUp(**CARTPOLE_SHAC["env"])`` with exploring starts (every
#: pole angle, cart within 0.5 m, 100-step episodes) and ``train_policy(env,
#: "shac", **CARTPOLE_SHAC["train"])``: 64 envs, 20-step (1 s) windows, gamma
#: 0.95, lr 1e-2 decaying linearly, a light critic fit. 250 updates, 320,000
#: env steps. APG with the same windows uses ``gamma=0.99``. Used by
#: ``examples/cartpole_swingup_policy.py`` and
#: ``benchmarks/learning_cartpole.py``.
CARTPOLE_SHAC = {
    "env": {"num_envs": 64, "init_noise": (0.5, math.pi, 1.0, 2.0), "max_episode_steps": 100},
    "train": {
        "updates": 250,
        "horizon": 20,
        "lr": 1e-2,
        "lr_decay_updates": 333,
        "critic_lr": 2e-3,
        "gamma": 0.95,
        "reward_scale": 0.1,
        "action_noise": 0.1,
        "critic_iterations": 4,
        "critic_minibatches": 4,
        "critic_replay": 2,
    },
}
_FORMAT = "backdrive.policy/1"
_SQUASHES = ("tanh", "clip")
_ACTIVATIONS = {"elu": nn.ELU, "tanh": nn.Tanh, "relu": nn.ReLU, "silu": nn.SiLU}
_LOG_FIELDS = (
    "update",
    "env_steps",
    "wall_s",
    "train_return",
    "window_reward",
    "actor_loss",
    "critic_loss",
    "grad_norm",
    "eval_return",
    "eval_s",
)


# --------------------------------------------------------------------- modules
class ObsNormalizer(nn.Module):
    """Running mean and variance of observations; ``forward`` standardises.

    Statistics are kept in float64 (merged batch by batch with Chan's parallel
    formula) so that long runs do not drift, and are buffers: they travel in
    ``state_dict`` and checkpoints. ``forward`` is differentiable in ``obs``.

    Args:
        obs_dim: observation length.
        clip: standardised values are clamped to ``[-clip, clip]``.
        eps: added to the variance.
    """

    def __init__(self, obs_dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(obs_dim, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """Merge a batch ``(..., obs_dim)`` into the statistics."""
        x = obs.detach().reshape(-1, self.obs_dim).to(torch.float64)
        n = x.shape[0]
        batch_mean = x.mean(0)
        batch_var = x.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * (n / total)
        self.var.copy_((self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total)
        self.count.copy_(total)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean = self.mean.to(obs.dtype)
        std = torch.sqrt(self.var + self.eps).to(obs.dtype)
        return ((obs - mean) / std).clamp(-self.clip, self.clip)


def _mlp(n_in: int, n_out: int, hidden: Sequence[int], activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = n_in
    for h in hidden:
        layers += [nn.Linear(width, h), _ACTIVATIONS[activation]()]
        width = h
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


class MLPPolicy(nn.Module):
    """Deterministic policy ``obs -> action`` squashed into the action box.

    ``action = centre + half_range * tanh(mlp(normalise(obs)))``. The
    normaliser is part of the module, so a saved policy runs on raw
    observations.

    Args:
        obs_dim, action_dim: sizes.
        action_low, action_high: ``(action_dim,)`` bounds.
        hidden: hidden layer widths.
        activation: ``"elu"``, ``"tanh"``, ``"relu"`` or ``"silu"``.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        action_low: torch.Tensor,
        action_high: torch.Tensor,
        hidden: Sequence[int] = (64, 64),
        activation: str = "elu",
        squash: str = "tanh",
    ) -> None:
        super().__init__()
        if squash not in _SQUASHES:
            raise PolicyConfigError(f"unknown squash {squash!r}; valid: {', '.join(map(repr, _SQUASHES))}")
        self.squash = squash
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.normalizer = ObsNormalizer(obs_dim)
        self.net = _mlp(obs_dim, action_dim, hidden, activation)
        # A small last layer starts the policy near the centre of the action
        # box, where tanh is not saturated and gradients are largest.
        with torch.no_grad():
            self.net[-1].weight.mul_(0.1)
            self.net[-1].bias.zero_()
        low = torch.as_tensor(action_low).detach().clone()
        high = torch.as_tensor(action_high).detach().clone()
        self.register_buffer("action_centre", (high + low) / 2)
        self.register_buffer("action_half_range", (high - low) / 2)

    def preact(self, obs: torch.Tensor) -> torch.Tensor:
        """The network output before squashing, ``(..., action_dim)``; the box is ``[-1, 1]``."""
        return self.net(self.normalizer(obs))

    def squash_preact(self, z: torch.Tensor) -> torch.Tensor:
        """Map pre-activations ``z`` into the action box."""
        if self.squash == "tanh":
            unit = torch.tanh(z)
        else:
            # Straight-through clip: the forward value is clipped, the gradient
            # passes as if it were not, so a saturated action can still learn
            # to come back (tanh's gradient vanishes there).
            unit = z + (z.clamp(-1.0, 1.0) - z).detach()
        return self.action_centre + self.action_half_range * unit

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Actions ``(..., action_dim)`` for observations ``(..., obs_dim)``."""
        return self.squash_preact(self.preact(obs))


class ValueCritic(nn.Module):
    """State-value network on normalised observations: ``(..., obs_dim) -> (...,)``."""

    def __init__(self, obs_dim: int, hidden: Sequence[int] = (64, 64), activation: str = "elu") -> None:
        super().__init__()
        self.net = _mlp(obs_dim, 1, hidden, activation)

    def forward(self, obs_normalised: torch.Tensor) -> torch.Tensor:
        return self.net(obs_normalised).squeeze(-1)


# -------------------------------------------------------------------- helpers
@torch.no_grad()
def evaluate_policy(
    policy: Callable[[torch.Tensor], torch.Tensor], env: DiffEnv, *, seed: int | None = 0
) -> float:
    """Mean undiscounted return of one full episode in each copy of ``env``.

    The env is reset with ``seed`` and stepped until every copy's first
    episode has ended (terminated or truncated); rewards after a copy's end
    do not count.

    Args:
        policy: maps observations ``(N, obs_dim)`` to actions ``(N, action_dim)``.
        env: evaluation environment (it is reset and stepped in place).
        seed: reset seed, for comparable evaluations.

    Returns:
        The mean return over the ``env.num_envs`` episodes.
    """
    obs = env.reset(seed=seed)
    total = torch.zeros(env.num_envs, dtype=torch.float64, device=env.device)
    alive = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
    for _ in range(env.max_episode_steps):
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
        total += torch.where(alive, reward.to(torch.float64), torch.zeros_like(total))
        alive &= ~(terminated | truncated)
        if not bool(alive.any()):
            break
    return float(total.mean())


def load_policy(path: str | os.PathLike, *, device: torch.device | str | None = None) -> MLPPolicy:
    """The policy (with its observation normaliser) stored in a training checkpoint."""
    ckpt = _load(path, device)
    cfg = ckpt["config"]
    policy = MLPPolicy(
        cfg["obs_dim"],
        cfg["action_dim"],
        ckpt["policy"]["action_centre"] - ckpt["policy"]["action_half_range"],
        ckpt["policy"]["action_centre"] + ckpt["policy"]["action_half_range"],
        cfg["hidden"],
        cfg["activation"],
        cfg["squash"],
    ).to(dtype=ckpt["policy"]["action_centre"].dtype)
    policy.load_state_dict(ckpt["policy"])
    return policy.eval()


def _load(path, device) -> dict[str, Any]:
    ckpt = torch.load(path, map_location=device, weights_only=False)
    if not isinstance(ckpt, dict) or ckpt.get("format") != _FORMAT:
        raise PolicyConfigError(f"{path} is not a backdrive policy checkpoint (format {_FORMAT!r})")
    return ckpt


def _fmt(x: float) -> str:
    return "nan" if x != x else f"{x:.1f}"


# -------------------------------------------------------------------- settings
@dataclasses.dataclass(frozen=True)
class PolicyTrainerConfig:
    """The settings of a :class:`PolicyTrainer` (and :func:`train_policy`), frozen.

    Every field is also accepted as a keyword argument by both; keywords
    override the fields of a ``config`` given with them. The defaults are
    plain SHAC (one window per critic fit, no replayed actor steps).

    Attributes:
        algo: ``"apg"`` (short-horizon BPTT) or ``"shac"`` (with a critic).
        horizon: window length H in steps, at most ``env.max_episode_steps``.
        lr: actor learning rate (Adam).
        critic_lr: critic learning rate (SHAC).
        gamma: discount factor in (0, 1].
        lam: TD(lambda) mixing of the critic targets (SHAC).
        hidden: hidden layer widths of actor and critic.
        activation: ``"elu"``, ``"tanh"``, ``"relu"`` or ``"silu"``.
        max_grad_norm: clip the actor gradient to this norm (``None``: off).
        critic_iterations: epochs over the critic's samples per update, or,
            with ``critic_batch_size``, gradient steps per update.
        critic_minibatches: minibatches per epoch (without ``critic_batch_size``).
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
        target_alpha: target critic update ``target <- a * target + (1 - a) * critic``.
        betas: Adam betas of both optimisers.
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
        seed: seeds the networks, the env and every sample the trainer draws.
    """

    algo: str = "shac"
    horizon: int = 32
    lr: float = 2e-3
    critic_lr: float = 2e-3
    gamma: float = 0.99
    lam: float = 0.95
    hidden: Sequence[int] = (64, 64)
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
    seed: int = 0

    def __post_init__(self) -> None:
        # Lists become tuples: the config stays hashable and compares equal
        # to the one stored in a checkpoint.
        if isinstance(self.hidden, list):
            object.__setattr__(self, "hidden", tuple(self.hidden))
        if isinstance(self.betas, list):
            object.__setattr__(self, "betas", tuple(self.betas))


_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(PolicyTrainerConfig))


def _make_config(config: PolicyTrainerConfig | None, algo: str | None, settings: dict[str, Any]) -> PolicyTrainerConfig:
    """``config`` (or the defaults) with ``algo`` and keyword ``settings`` on top."""
    if config is not None and not isinstance(config, PolicyTrainerConfig):
        raise PolicyConfigError(f"config must be a PolicyTrainerConfig, got {type(config).__name__}")
    unknown = sorted(set(settings) - set(_CONFIG_FIELDS))
    if unknown:
        raise TypeError(
            f"unknown training setting(s) {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(_CONFIG_FIELDS)}"
        )
    if algo is not None:
        settings = {**settings, "algo": algo}
    return dataclasses.replace(config if config is not None else PolicyTrainerConfig(), **settings)


# -------------------------------------------------------------------- trainer
class PolicyTrainer:
    """Trains a policy on a differentiable env with APG or SHAC; see :func:`train_policy`.

    The trainer owns the policy, the critic (SHAC), both optimisers, the
    observation normaliser, the environment's state and every random
    generator, so :meth:`save` followed by :meth:`load` continues bit for bit.
    """

    def __init__(
        self,
        env: DiffEnv,
        algo: str | None = None,
        *,
        config: PolicyTrainerConfig | None = None,
        policy: nn.Module | None = None,
        **settings: Any,
    ) -> None:
        cfg = _make_config(config, algo, settings)
        #: The settings, a frozen :class:`PolicyTrainerConfig`.
        self.settings = cfg
        self.env = env
        self.config: dict[str, Any] = dataclasses.asdict(cfg)
        self.config["betas"] = tuple(cfg.betas)
        self.config["hidden"] = tuple(int(h) for h in cfg.hidden) if _is_int_seq(cfg.hidden) else cfg.hidden
        algo, seed, activation, squash = cfg.algo, cfg.seed, cfg.activation, cfg.squash
        lr, critic_lr = cfg.lr, cfg.critic_lr
        self._validate(env, policy)
        self.config["obs_dim"] = env.obs_dim
        self.config["action_dim"] = env.action_dim
        c = self.config
        dtype, device = env.dtype, env.device

        # Parameter initialisation draws from the global generator: fork it so
        # the caller's random stream is untouched and the run is seeded.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if policy is None:
                policy = MLPPolicy(
                    env.obs_dim, env.action_dim, env.action_low, env.action_high, c["hidden"], activation, squash
                )
            self.policy = policy.to(device=device, dtype=dtype)
            self.critic = ValueCritic(env.obs_dim, c["hidden"], activation).to(device=device, dtype=dtype)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.policy.parameters(), lr=lr, betas=c["betas"])
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=critic_lr, betas=c["betas"])
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed + 1)

        obs = env.reset(seed=seed)
        if c["normalize_obs"]:
            self._normalizer().update(obs)
        self.updates_done = 0
        self.env_steps = 0
        self.wall_s = 0.0
        self.history: list[dict[str, float]] = []
        self._episode_return = torch.zeros(env.num_envs, dtype=torch.float64, device=device)
        self._last_train_return = math.nan
        self._last_eval = math.nan
        self._replay: list[dict[str, torch.Tensor]] = []

    # ------------------------------------------------------------ validation
    def _validate(self, env: DiffEnv, policy: nn.Module | None) -> None:
        c = self.config
        if not isinstance(env, DiffEnv):
            raise PolicyConfigError(f"env must be a backdrive DiffEnv, got {type(env).__name__}")
        if c["algo"] not in ALGOS:
            raise PolicyConfigError(f"unknown algo {c['algo']!r}; valid: {', '.join(map(repr, ALGOS))}")
        h = c["horizon"]
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise PolicyConfigError(f"horizon must be a positive int, got {h!r}")
        if h > env.max_episode_steps:
            raise PolicyConfigError(
                f"horizon {h} is longer than the episode ({type(env).__name__}.max_episode_steps = "
                f"{env.max_episode_steps}); use horizon <= {env.max_episode_steps}"
            )
        for name in ("lr", "critic_lr"):
            if not (isinstance(c[name], (int, float)) and c[name] > 0 and math.isfinite(c[name])):
                raise PolicyConfigError(f"{name} must be a positive finite number, got {c[name]!r}")
        if not 0.0 < c["gamma"] <= 1.0:
            raise PolicyConfigError(f"gamma must be in (0, 1], got {c['gamma']!r}")
        if not 0.0 <= c["lam"] <= 1.0:
            raise PolicyConfigError(f"lam must be in [0, 1], got {c['lam']!r}")
        if not 0.0 <= c["target_alpha"] < 1.0:
            raise PolicyConfigError(f"target_alpha must be in [0, 1), got {c['target_alpha']!r}")
        if c["max_grad_norm"] is not None and not c["max_grad_norm"] > 0:
            raise PolicyConfigError(f"max_grad_norm must be positive or None, got {c['max_grad_norm']!r}")
        if not (c["reward_scale"] > 0 and math.isfinite(c["reward_scale"])):
            raise PolicyConfigError(f"reward_scale must be a positive finite number, got {c['reward_scale']!r}")
        if c["squash"] not in _SQUASHES:
            raise PolicyConfigError(f"unknown squash {c['squash']!r}; valid: {', '.join(map(repr, _SQUASHES))}")
        if not c["preact_penalty"] >= 0:
            raise PolicyConfigError(f"preact_penalty must be >= 0, got {c['preact_penalty']!r}")
        if not c["action_noise"] >= 0:
            raise PolicyConfigError(f"action_noise must be >= 0, got {c['action_noise']!r}")
        if not _is_int_seq(c["hidden"]) or any(w < 1 for w in c["hidden"]):
            raise PolicyConfigError(f"hidden must be a sequence of positive ints, got {c['hidden']!r}")
        if c["activation"] not in _ACTIVATIONS:
            raise PolicyConfigError(
                f"unknown activation {c['activation']!r}; valid: {', '.join(map(repr, _ACTIVATIONS))}"
            )
        if not isinstance(c["critic_iterations"], int) or c["critic_iterations"] < 1:
            raise PolicyConfigError(f"critic_iterations must be a positive int, got {c['critic_iterations']!r}")
        dec = c["lr_decay_updates"]
        if dec is not None and (isinstance(dec, bool) or not isinstance(dec, int) or dec < 1):
            raise PolicyConfigError(f"lr_decay_updates must be a positive int or None, got {dec!r}")
        cr = c["critic_replay"]
        if isinstance(cr, bool) or not isinstance(cr, int) or cr < 1:
            raise PolicyConfigError(f"critic_replay must be a positive int (windows), got {cr!r}")
        cb = c["critic_batch_size"]
        if cb is not None and (isinstance(cb, bool) or not isinstance(cb, int) or cb < 1):
            raise PolicyConfigError(f"critic_batch_size must be a positive int or None, got {cb!r}")
        ar = c["actor_replay_steps"]
        if isinstance(ar, bool) or not isinstance(ar, int) or ar < 0:
            raise PolicyConfigError(f"actor_replay_steps must be a non-negative int, got {ar!r}")
        if ar > 0 and c["algo"] != "shac":
            raise PolicyConfigError("actor_replay_steps needs a critic: use it with algo 'shac'")
        ab = c["actor_batch_size"]
        if isinstance(ab, bool) or not isinstance(ab, int) or ab < 1:
            raise PolicyConfigError(f"actor_batch_size must be a positive int, got {ab!r}")
        samples = env.num_envs * h
        mb = c["critic_minibatches"]
        if not isinstance(mb, int) or not 1 <= mb <= samples:
            raise PolicyConfigError(
                f"critic_minibatches must be an int in [1, num_envs * horizon = {samples}], got {mb!r}"
            )
        if policy is not None:
            _check_policy(policy, env)

    # -------------------------------------------------------------- training
    def _normalizer(self) -> ObsNormalizer:
        norm = getattr(self.policy, "normalizer", None)
        if norm is None:
            # A user policy without a normaliser: the critic gets its own.
            if not hasattr(self, "_own_normalizer"):
                self._own_normalizer = ObsNormalizer(self.env.obs_dim).to(self.env.device)
            return self._own_normalizer
        return norm

    def _rollout(self) -> dict[str, torch.Tensor]:
        """One window: differentiable rewards and everything the losses need."""
        env, c = self.env, self.config
        env.detach()
        obs = env.observation()
        obs_list, rew_list, final_list, term_list, done_list = [], [], [], [], []
        act_list, probe_list = [], []
        jac = c["actor_replay_steps"] > 0
        excess = torch.zeros((), dtype=env.dtype, device=env.device)
        structured = isinstance(self.policy, MLPPolicy)
        for _ in range(c["horizon"]):
            if structured:
                z = self.policy.preact(obs)
                # Penalise pre-activations beyond the box, where tanh's gradient
                # vanishes (or the straight-through clip has no effect).
                excess = excess + torch.relu(z.abs() - 1.0).pow(2).mean()
                action = self.policy.squash_preact(z)
                if c["action_noise"] > 0:
                    # Exploration in action space (the env clips): a saturated
                    # policy still explores, and the reparameterised noise
                    # keeps the window differentiable.
                    noise = torch.randn(z.shape, generator=self.generator, dtype=z.dtype, device=z.device)
                    action = action + c["action_noise"] * self.policy.action_half_range * noise
            else:
                action = self.policy(obs)
                if c["action_noise"] > 0:
                    noise = torch.randn(action.shape, generator=self.generator, dtype=action.dtype, device=action.device)
                    action = action + c["action_noise"] * (env.action_high - env.action_low) / 2 * noise
            if jac:
                # Clip to the box here (the env does the same: values and
                # gradients are unchanged) and add a zero probe: the derivative
                # of this step's reward and observation with respect to the
                # probe is the transition's action Jacobian (_action_jacobians).
                action = torch.maximum(torch.minimum(action, env.action_high), env.action_low)
                probe = torch.zeros_like(action, requires_grad=True)
                act_list.append(action.detach())
                probe_list.append(probe)
                action = action + probe
            obs_list.append(obs.detach())
            obs, reward, terminated, truncated, info = env.step(action)
            rew_list.append(reward)
            final_list.append(info["final_obs"])
            term_list.append(terminated)
            done_list.append(terminated | truncated)
        return {
            "obs": torch.stack(obs_list),  # (H, N, obs_dim), detached
            "reward": torch.stack(rew_list),  # (H, N), differentiable
            "final_obs": torch.stack(final_list),  # (H, N, obs_dim), differentiable
            "terminated": torch.stack(term_list),  # (H, N)
            "done": torch.stack(done_list),  # (H, N)
            "excess": excess / c["horizon"],  # mean squared pre-activation excess
            "action": torch.stack(act_list) if jac else None,  # (H, N, action_dim), in the box
            "probes": probe_list,  # per step, (N, action_dim) zeros added to the actions
            "reward_steps": rew_list,  # the per-step tensors stacked above
            "final_steps": final_list,
        }

    def update(self) -> dict[str, float]:
        """One window and one actor step (plus the critic fit for SHAC).

        Returns:
            The log row of this update (see :data:`_LOG_FIELDS`).

        Raises:
            TrainingDivergedError: a loss or the policy gradient is not finite;
                the parameters are not changed.
        """
        c, env = self.config, self.env
        H, N = c["horizon"], env.num_envs
        gamma = c["gamma"]
        t0 = time.perf_counter()
        k = self.updates_done + 1
        if c["lr_decay_updates"] is not None:
            # Linear decay to zero at update lr_decay_updates (as in SHAC);
            # a function of the update index alone, so resuming is exact.
            frac = max(0.0, 1.0 - (k - 1) / c["lr_decay_updates"])
            for group in self.actor_opt.param_groups:
                group["lr"] = c["lr"] * frac
            for group in self.critic_opt.param_groups:
                group["lr"] = c["critic_lr"] * frac

        roll = self._rollout()
        reward, done, term = roll["reward"] * c["reward_scale"], roll["done"], roll["terminated"]
        seg_end = done.clone()
        seg_end[-1] = True
        # Discount since the segment start: resets to 1 after an episode end.
        disc_list = [torch.ones(N, dtype=reward.dtype, device=reward.device)]
        for t in range(H - 1):
            disc_list.append(torch.where(done[t], torch.ones_like(disc_list[-1]), disc_list[-1] * gamma))
        disc = torch.stack(disc_list)

        shac = c["algo"] == "shac"
        if shac:
            norm = self._normalizer()
            # One batched call for every step; gradients reach the final
            # observations (the actor), never the target critic's weights.
            value = self.target_critic(norm(roll["final_obs"])) * (~term)
            objective = disc * (reward + gamma * seg_end * value)
        else:
            value = None
            objective = disc * reward
        actor_loss = -objective.sum() / (N * H) + c["preact_penalty"] * roll["excess"]
        jacobians = self._action_jacobians(roll) if c["actor_replay_steps"] > 0 else None

        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        params = [p for p in self.policy.parameters() if p.grad is not None]
        if c["max_grad_norm"] is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, c["max_grad_norm"])
        else:
            grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
        if not (torch.isfinite(grad_norm) and torch.isfinite(actor_loss)):
            self.actor_opt.zero_grad(set_to_none=True)
            raise self._diverged(k, f"policy gradient norm {float(grad_norm)}, actor loss {float(actor_loss.detach())}")
        self.actor_opt.step()

        critic_loss = math.nan
        if shac:
            window = {
                "obs": roll["obs"],
                "reward": reward.detach(),
                "final_obs": roll["final_obs"].detach(),
                "terminated": term,
                "done": done,
            }
            if jacobians is not None:
                window.update(action=roll["action"], jac_obs=jacobians[0], jac_reward=jacobians[1])
            critic_loss = self._fit_critic(window, value.detach(), k)
            if c["actor_replay_steps"] > 0:
                self._replay_actor_steps(k)

        # Bookkeeping (detached): episode returns and normaliser statistics.
        with torch.no_grad():
            r64 = roll["reward"].detach().to(torch.float64)
            finished = []
            for t in range(H):
                self._episode_return += r64[t]
                finished.append(self._episode_return[done[t]])
                self._episode_return = torch.where(done[t], torch.zeros_like(self._episode_return), self._episode_return)
            finished_t = torch.cat(finished)
            if finished_t.numel():
                self._last_train_return = float(finished_t.mean())
            if c["normalize_obs"]:
                self._normalizer().update(roll["obs"])

        self.updates_done = k
        self.env_steps += N * H
        self.wall_s += time.perf_counter() - t0
        return {
            "update": k,
            "env_steps": self.env_steps,
            "wall_s": self.wall_s,
            "train_return": self._last_train_return,
            "window_reward": float(roll["reward"].detach().mean()),
            "actor_loss": float(actor_loss.detach()),
            "critic_loss": critic_loss,
            "grad_norm": float(grad_norm),
            "eval_return": math.nan,
            "eval_s": 0.0,
        }

    def _action_jacobians(self, roll: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Derivatives of each transition's (scaled) reward and final observation w.r.t. its action.

        ``jac_obs`` ``(H, N, obs_dim, action_dim)`` and ``jac_reward`` ``(H, N,
        action_dim)``, read off the window's own graph (no simulator call):
        the derivative of step ``t``'s outputs with respect to the zero probe
        added to step ``t``'s action. Each backward pass starts from one
        step's own outputs, so it only runs through that step.
        """
        scale = self.config["reward_scale"]
        jo, jr = [], []
        for probe, final, reward in zip(roll["probes"], roll["final_steps"], roll["reward_steps"]):
            outs = [final[:, j].sum() for j in range(final.shape[-1])] + [reward.sum() * scale]
            rows = []
            for out in outs:
                (g,) = torch.autograd.grad(out, probe, retain_graph=True, allow_unused=True)
                rows.append(torch.zeros_like(probe) if g is None else g)
            jo.append(torch.stack(rows[:-1], dim=-2))
            jr.append(rows[-1])
        return torch.stack(jo).detach(), torch.stack(jr).detach()

    def _replay_actor_steps(self, k: int) -> None:
        """Actor steps on replayed transitions through their stored action Jacobians.

        For a replayed ``(o, a, r, o')`` the policy's action ``a* = pi(o)`` is
        scored with the first-order model of that transition,
        ``r + dr/da (a* - a) + gamma V(o' + do'/da (a* - a))`` (SVG(1)-style,
        the value from the target critic, zero after a termination). No
        simulator call: the Jacobians were read off the window that produced
        the transition.
        """
        c = self.config
        gamma = c["gamma"]
        norm = self._normalizer()
        keys = ("obs", "action", "reward", "final_obs", "terminated", "jac_obs", "jac_reward")
        data = {key: torch.cat([w[key].reshape(-1, *w[key].shape[2:]) for w in self._replay]) for key in keys}
        n = data["obs"].shape[0]
        batch = (min(c["actor_batch_size"], n),)
        for _ in range(c["actor_replay_steps"]):
            idx = torch.randint(n, batch, generator=self.generator, device=data["obs"].device)
            obs, a = data["obs"][idx], data["action"][idx]
            delta = self.policy(obs) - a
            reward = data["reward"][idx] + (data["jac_reward"][idx] * delta).sum(-1)
            nxt = data["final_obs"][idx] + (data["jac_obs"][idx] @ delta.unsqueeze(-1)).squeeze(-1)
            value = self.target_critic(norm(nxt)) * (~data["terminated"][idx])
            loss = -(reward + gamma * value).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            loss.backward()
            params = [p for p in self.policy.parameters() if p.grad is not None]
            if c["max_grad_norm"] is not None:
                grad_norm = torch.nn.utils.clip_grad_norm_(params, c["max_grad_norm"])
            else:
                grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))
            if not (torch.isfinite(grad_norm) and torch.isfinite(loss)):
                self.actor_opt.zero_grad(set_to_none=True)
                raise self._diverged(k, f"replayed actor gradient norm {float(grad_norm)}")
            self.actor_opt.step()

    def _td_lambda(self, reward: torch.Tensor, value: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """TD(lambda) targets ``(H, N)`` of one window.

        ``G_t = r_t + gamma ((1 - l_t) V_t + l_t G_{t+1})`` with ``l_t = 0`` at a
        segment end (episode end or the window's last step); ``value`` holds
        the target critic at each step's final observation, 0 after a
        termination.
        """
        gamma, lam = self.config["gamma"], self.config["lam"]
        H = reward.shape[0]
        targets = torch.empty_like(reward)
        nxt = value[-1]
        for t in range(H - 1, -1, -1):
            if t == H - 1:
                g = reward[t] + gamma * value[t]
            else:
                mix = torch.where(done[t], value[t], (1 - lam) * value[t] + lam * nxt)
                g = reward[t] + gamma * mix
            targets[t] = g
            nxt = g
        return targets

    def _fit_critic(self, window: dict[str, torch.Tensor], value: torch.Tensor, k: int) -> float:
        """TD(lambda) targets from the recent windows, then minibatch regression.

        With ``critic_replay = m`` the critic also refits the ``m - 1``
        previous windows, their targets recomputed with the current target
        critic (slightly off-policy, many more samples per update).
        """
        c = self.config
        self._replay.append(window)
        del self._replay[: -c["critic_replay"]]
        norm = self._normalizer()
        with torch.no_grad():
            # All windows side by side along the env axis: one target-critic
            # call and one TD(lambda) pass (the windows have the same shape).
            old = self._replay[:-1]
            v = [value]
            if old:
                final = torch.cat([w["final_obs"] for w in old], dim=1)
                term = torch.cat([w["terminated"] for w in old], dim=1)
                v.insert(0, self.target_critic(norm(final)) * (~term))
            reward = torch.cat([w["reward"] for w in self._replay], dim=1)
            done = torch.cat([w["done"] for w in self._replay], dim=1)
            targets = self._td_lambda(reward, torch.cat(v, dim=1), done)  # (H, M * N)
            H, M = targets.shape[0], len(self._replay)
            # Samples ordered window by window, step by step within a window.
            y = targets.reshape(H, M, -1).transpose(0, 1).reshape(-1)
            obs = torch.stack([w["obs"] for w in self._replay])  # (M, H, N, obs_dim)
            x = norm(obs).reshape(y.shape[0], -1)
        n = y.shape[0]
        total = torch.zeros((), dtype=y.dtype, device=y.device)
        count = 0
        if c["critic_batch_size"] is not None:
            # SAC-style: critic_iterations gradient steps, each on a random
            # minibatch of the replayed samples.
            steps = [
                torch.randint(n, (min(c["critic_batch_size"], n),), generator=self.generator, device=y.device)
                for _ in range(c["critic_iterations"])
            ]
        else:
            batch = n // c["critic_minibatches"]
            steps = []
            for _ in range(c["critic_iterations"]):
                perm = torch.randperm(n, generator=self.generator, device=y.device)
                steps += [perm[b * batch : (b + 1) * batch] for b in range(c["critic_minibatches"])]
        for idx in steps:
            loss = (self.critic(x[idx]) - y[idx]).pow(2).mean()
            self.critic_opt.zero_grad(set_to_none=True)
            loss.backward()
            if c["max_grad_norm"] is not None:
                torch.nn.utils.clip_grad_norm_(self.critic.parameters(), c["max_grad_norm"] * 10)
            self.critic_opt.step()
            total += loss.detach()
            count += 1
        mean_loss = float(total / count)
        if not math.isfinite(mean_loss):
            raise self._diverged(k, f"critic loss {mean_loss}")
        with torch.no_grad():
            a = c["target_alpha"]
            for pt, p in zip(self.target_critic.parameters(), self.critic.parameters()):
                pt.mul_(a).add_(p, alpha=1 - a)
        return mean_loss

    def _diverged(self, k: int, what: str) -> TrainingDivergedError:
        ckpt = getattr(self, "_last_checkpoint", None)
        where = f"; last good checkpoint: {ckpt} (update {self._last_checkpoint_update})" if ckpt else ""
        return TrainingDivergedError(
            f"training diverged at update {k}: non-finite {what}; "
            f"policy left as after update {k - 1}{where}",
            update=k,
            checkpoint=ckpt,
        )

    def train(
        self,
        updates: int,
        *,
        eval_fn: Callable[[nn.Module], float] | None = None,
        eval_every: int = 10,
        log_csv: str | os.PathLike | None = None,
        checkpoint: str | os.PathLike | None = None,
        checkpoint_every: int = 10,
        progress: bool = False,
        callback: Callable[[dict[str, float]], bool | None] | None = None,
    ) -> PolicyTrainer:
        """Run updates until ``updates`` have been done in total (resumed ones count).

        Args:
            updates: total number of updates to reach.
            eval_fn: ``policy -> mean return``, called every ``eval_every``
                updates and after the last; its time is not counted in
                ``wall_s``.
            eval_every: evaluation period in updates.
            log_csv: append one row per update (header written once).
            checkpoint: path written every ``checkpoint_every`` updates and at
                the end (atomically: a crash never leaves a half file).
            checkpoint_every: checkpoint period in updates.
            progress: draw a progress bar with the latest return on stderr.
            callback: called with each log row; returning ``True`` stops.

        Returns:
            ``self``.
        """
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 0:
            raise PolicyConfigError(f"updates must be a non-negative int, got {updates!r}")
        for name, val in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise PolicyConfigError(f"{name} must be a positive int, got {val!r}")
        writer = _CsvLog(log_csv) if log_csv is not None else None
        bar = ProgressBar(updates, "train_policy", enabled=bool(progress), interval=0.2)
        shown = self._last_eval
        try:
            while self.updates_done < updates:
                row = self.update()
                k = row["update"]
                if eval_fn is not None and (k % eval_every == 0 or k == updates):
                    t0 = time.perf_counter()
                    was_training = self.policy.training
                    self.policy.eval()
                    with torch.no_grad():
                        self._last_eval = float(eval_fn(self.policy))
                    self.policy.train(was_training)
                    row["eval_return"] = self._last_eval
                    row["eval_s"] = time.perf_counter() - t0
                self.history.append(row)
                if writer is not None:
                    writer.write(row)
                if checkpoint is not None and (k % checkpoint_every == 0 or k == updates):
                    self.save(checkpoint)
                shown = self._last_eval if self._last_eval == self._last_eval else row["train_return"]
                bar.update(k, text=f"return {_fmt(shown)}  steps {self.env_steps}")
                if callback is not None and callback(row):
                    break
        finally:
            bar.close(self.updates_done, text=f"return {_fmt(shown)}  steps {self.env_steps}")
            if writer is not None:
                writer.close()
        return self

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything that defines the run, for an exact resume."""
        state = {
            "format": _FORMAT,
            "config": dict(self.config),
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "target_critic": self.target_critic.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "env": self.env.state_dict(),
            "generator": self.generator.get_state(),
            "updates_done": self.updates_done,
            "env_steps": self.env_steps,
            "wall_s": self.wall_s,
            "episode_return": self._episode_return.clone(),
            "last_train_return": self._last_train_return,
            "last_eval": self._last_eval,
            "history": list(self.history),
            "replay": [dict(w) for w in self._replay],
        }
        if hasattr(self, "_own_normalizer"):
            state["normalizer"] = self._own_normalizer.state_dict()
        return state

    def save(self, path: str | os.PathLike) -> None:
        """Write a checkpoint atomically (temporary file, then rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, path)
        self._last_checkpoint = str(path)
        self._last_checkpoint_update = self.updates_done

    def load(self, path: str | os.PathLike) -> PolicyTrainer:
        """Continue from a checkpoint written by :meth:`save` with the same settings.

        Raises:
            PolicyConfigError: the checkpoint was made with other settings or
                for an env with other observation or action sizes.
        """
        ckpt = _load(path, self.env.device)
        saved = ckpt["config"]
        if saved["obs_dim"] != self.env.obs_dim or saved["action_dim"] != self.env.action_dim:
            raise PolicyConfigError(
                f"checkpoint {path} has obs size {saved['obs_dim']} and action size "
                f"{saved['action_dim']}, but {type(self.env).__name__} has obs size "
                f"{self.env.obs_dim} and action size {self.env.action_dim}"
            )
        # Options added later than a checkpoint were at their defaults then.
        defaults = dataclasses.asdict(PolicyTrainerConfig())
        saved = {**{key: defaults[key] for key in defaults if key not in saved}, **saved}
        diff = sorted(key for key in saved if saved[key] != self.config.get(key))
        if diff:
            pairs = ", ".join(f"{key}: checkpoint {saved[key]!r} vs now {self.config.get(key)!r}" for key in diff)
            raise PolicyConfigError(f"checkpoint {path} was trained with other settings ({pairs})")
        self.policy.load_state_dict(ckpt["policy"])
        self.critic.load_state_dict(ckpt["critic"])
        self.target_critic.load_state_dict(ckpt["target_critic"])
        self.actor_opt.load_state_dict(ckpt["actor_opt"])
        self.critic_opt.load_state_dict(ckpt["critic_opt"])
        self.env.load_state_dict(ckpt["env"])
        self.generator.set_state(ckpt["generator"])
        if "normalizer" in ckpt:
            self._normalizer().load_state_dict(ckpt["normalizer"])
        self.updates_done = ckpt["updates_done"]
        self.env_steps = ckpt["env_steps"]
        self.wall_s = ckpt["wall_s"]
        self._episode_return = ckpt["episode_return"].to(self.env.device)
        self._last_train_return = ckpt["last_train_return"]
        self._last_eval = ckpt["last_eval"]
        self.history = list(ckpt["history"])
        self._replay = [dict(w) for w in ckpt["replay"]]
        self._last_checkpoint = str(path)
        self._last_checkpoint_update = self.updates_done
        return self


class _CsvLog:
    def __init__(self, path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists() or path.stat().st_size == 0
        self._file = open(path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=_LOG_FIELDS)
        if new:
            self._writer.writeheader()

    def write(self, row: dict[str, float]) -> None:
        self._writer.writerow(row)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _is_int_seq(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(w, int) and not isinstance(w, bool) for w in x)


def _check_policy(policy: nn.Module, env: DiffEnv) -> None:
    n = getattr(policy, "obs_dim", None)
    if n is not None and n != env.obs_dim:
        raise PolicyConfigError(
            f"policy expects observations of size {n}, but {type(env).__name__} gives size {env.obs_dim}"
        )
    obs = env.reset() if env._state is None else env.observation()
    try:
        with torch.no_grad():
            out = policy(obs.detach().to(next(policy.parameters()).dtype))
    except RuntimeError as exc:
        raise PolicyConfigError(
            f"policy cannot take observations of size {env.obs_dim} from {type(env).__name__}: {exc}"
        ) from exc
    if tuple(out.shape) != (env.num_envs, env.action_dim):
        raise PolicyConfigError(
            f"policy returns actions of shape {tuple(out.shape)}, "
            f"{type(env).__name__} needs ({env.num_envs}, {env.action_dim})"
        )


def train_policy(
    env: DiffEnv,
    algo: str | None = None,
    *,
    config: PolicyTrainerConfig | None = None,
    updates: int = 200,
    policy: nn.Module | None = None,
    eval_fn: Callable[[nn.Module], float] | None = None,
    eval_env: DiffEnv | None = None,
    eval_every: int = 10,
    log_csv: str | os.PathLike | None = None,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 10,
    resume: str | os.PathLike | None = None,
    progress: bool = False,
    callback: Callable[[dict[str, float]], bool | None] | None = None,
    num_threads: int | None = None,
    **settings: Any,
) -> PolicyTrainer:
    """Train a policy by backpropagating through a differentiable environment.

    Each update rolls all ``env.num_envs`` copies forward ``horizon`` steps,
    differentiates the window's return (plus, for SHAC, the critic's value of
    where it ends) with respect to the policy parameters, clips the gradient
    norm and takes one Adam step; the graph is cut between windows. Every
    env transition counts: an update costs ``num_envs * horizon`` env steps
    (replayed critic and actor steps reuse stored transitions and take none).

    Args:
        env: the training environment (stepped in place; reset with ``seed``).
        algo: ``"apg"`` or ``"shac"`` (default: ``config.algo``, ``"shac"``).
        config: a :class:`PolicyTrainerConfig`; every one of its fields
            (``horizon``, ``lr``, ``critic_lr``, ``gamma``, ``lam``, ``hidden``,
            ``activation``, ``max_grad_norm``, ``critic_iterations``,
            ``critic_minibatches``, ``critic_replay``, ``critic_batch_size``,
            ``actor_replay_steps``, ``actor_batch_size``, ``target_alpha``,
            ``betas``, ``action_noise``, ``reward_scale``, ``squash``,
            ``preact_penalty``, ``normalize_obs``, ``lr_decay_updates``,
            ``seed``) can also be given as a keyword argument, which
            overrides it; see :class:`PolicyTrainerConfig` for what they do.
        updates: total number of updates (including resumed ones).
        policy: a custom ``nn.Module`` policy (default: :class:`MLPPolicy`).
        eval_fn: ``policy -> mean return`` for periodic evaluation.
        eval_env: alternatively, a backdrive env evaluated with
            :func:`evaluate_policy` (seed 0).
        eval_every: evaluation period in updates.
        log_csv: CSV file, one row per update.
        checkpoint: checkpoint path (policy, critic, optimisers, normaliser,
            env, generators and replayed windows).
        checkpoint_every: checkpoint period in updates.
        resume: continue from this checkpoint; the other settings must match
            the ones it was trained with.
        progress: progress bar with the latest return on stderr.
        callback: called with each log row; returning ``True`` stops early.
        num_threads: torch intra-op threads while training (restored after).
            Small networks on small batches run fastest on one thread; on a
            busy machine several threads can be ten times slower.
        **settings: fields of :class:`PolicyTrainerConfig`.

    Returns:
        The :class:`PolicyTrainer`; ``.policy`` is the trained policy (maps raw
        observations to actions), ``.history`` the log rows.

    Raises:
        PolicyConfigError: a bad setting, found before any update.
        TrainingDivergedError: a non-finite gradient or loss; names the update.
        TypeError: a keyword that is neither an argument nor a setting.
    """
    if eval_fn is not None and eval_env is not None:
        raise PolicyConfigError("give eval_fn or eval_env, not both")
    if eval_env is not None:
        if not isinstance(eval_env, DiffEnv):
            raise PolicyConfigError(f"eval_env must be a backdrive DiffEnv, got {type(eval_env).__name__}")
        if eval_env.obs_dim != env.obs_dim or eval_env.action_dim != env.action_dim:
            raise PolicyConfigError(
                f"eval_env has obs size {eval_env.obs_dim} and action size {eval_env.action_dim}, "
                f"the training env {env.obs_dim} and {env.action_dim}"
            )

        def eval_fn(p: nn.Module) -> float:
            return evaluate_policy(p, eval_env, seed=0)

    trainer = PolicyTrainer(env, algo, config=config, policy=policy, **settings)
    if resume is not None:
        trainer.load(resume)
    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise PolicyConfigError(f"num_threads must be a positive int or None, got {num_threads!r}")
        torch.set_num_threads(num_threads)
    try:
        return trainer.train(
            updates,
            eval_fn=eval_fn,
            eval_every=eval_every,
            log_csv=log_csv,
            checkpoint=checkpoint,
            checkpoint_every=checkpoint_every,
            progress=progress,
            callback=callback,
        )
    finally:
        torch.set_num_threads(previous_threads)

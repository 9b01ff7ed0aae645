"""The training loop: :class:`PolicyTrainer` and :func:`train_policy`."""

from __future__ import annotations

import copy
import csv
import math
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...runtime import threads_for_batch
from ..._errors import PolicyConfigError, TrainingDivergedError
from ...envs._base import DiffEnv
from .._progress import ProgressBar
from .checkpoints import FORMAT, checkpoint_config, read_checkpoint, write_checkpoint
from .config import PolicyTrainerConfig
from .distributed import DataParallel, rank_seed, shard_env
from .networks import MLPPolicy, ObsNormalizer, ValueCritic
from .presets import Preset, get_preset, recommended_preset
from .returns import evaluate_policy, td_lambda, window_objective

__all__ = ["PolicyTrainer", "train_policy", "LOG_FIELDS"]

#: The columns of the training log, one row per update.
LOG_FIELDS = (
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
    "action_change",
)


def _fmt(x: float) -> str:
    return "nan" if x != x else f"{x:.1f}"


def _make_config(
    config: PolicyTrainerConfig | None, algo: str | None, settings: dict[str, Any]
) -> PolicyTrainerConfig:
    """``config`` (or the defaults) with ``algo`` and keyword ``settings`` on top, validated."""
    if isinstance(config, Preset):
        raise PolicyConfigError(f"config must be a PolicyTrainerConfig; for a Preset use preset={config.name!r}")
    if config is not None and not isinstance(config, PolicyTrainerConfig):
        raise PolicyConfigError(f"config must be a PolicyTrainerConfig, got {type(config).__name__}")
    base = config if config is not None else PolicyTrainerConfig()
    if algo is not None:
        settings = {**settings, "algo": algo}
    return base.replace(**settings)


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


class PolicyTrainer:
    """Trains a policy on a differentiable env with APG or SHAC; see :func:`train_policy`.

    The trainer owns the policy, the critic (SHAC), both optimisers, the
    observation normaliser, the environment's state and every random
    generator, so :meth:`save` followed by :meth:`load` continues bit for bit.

    Args:
        env: the training environment (stepped in place, reset with ``config.seed``).
        algo: ``"apg"`` or ``"shac"``; overrides ``config.algo``.
        config: the settings (default: ``PolicyTrainerConfig()``, generic
            sizes; see the presets for tuned ones).
        policy: a custom ``nn.Module`` policy (default: :class:`MLPPolicy`).
        distributed: data parallelism over ``torch.distributed`` (see
            :func:`train_policy`): ``None`` detects a launcher, ``False``
            forces one process, ``True`` requires a process group.
        backend: process-group backend, ``"gloo"`` or ``"nccl"`` (default: by device).
        timeout_s: seconds a collective waits for a dead or hung rank before
            raising (default 600).
        **settings: fields of :class:`PolicyTrainerConfig`, overriding ``config``'s.

    Attributes:
        config: the settings, a frozen :class:`PolicyTrainerConfig`
            (``settings`` is the same object).
        env: the env this process steps: under data parallelism, its slice
            of ``num_envs // world_size`` copies of the env passed in.
        data_parallel: the :class:`~backdrive.optim._policy.distributed.DataParallel`
            group (``world_size`` 1 in one process).
    """

    def __init__(
        self,
        env: DiffEnv,
        algo: str | None = None,
        *,
        config: PolicyTrainerConfig | None = None,
        policy: nn.Module | None = None,
        distributed: bool | None = None,
        backend: str | None = None,
        timeout_s: float | None = None,
        **settings: Any,
    ) -> None:
        c = _make_config(config, algo, settings)
        if not isinstance(env, DiffEnv):
            raise PolicyConfigError(f"env must be a backdrive DiffEnv, got {type(env).__name__}")
        dp = DataParallel.setup(env.device, distributed, backend, timeout_s)
        # Before anything else that could differ between ranks: the same
        # settings, env and batch everywhere (else a rank would wait forever
        # in a collective the others never enter).
        dp.check_same(
            "settings and env",
            {**c.to_dict(), "env": type(env).__name__, "num_envs": env.num_envs, "dtype": str(env.dtype),
             "obs_dim": env.obs_dim, "action_dim": env.action_dim,
             "policy": None if policy is None else type(policy).__name__},
        )
        env = shard_env(env, dp.rank, dp.world_size)
        c.check_env(env)
        if policy is not None:
            _check_policy(policy, env)
        self.config = c
        self.env = env
        self.data_parallel = dp
        dtype, device = env.dtype, env.device

        # Parameter initialisation draws from the global generator: fork it so
        # the caller's random stream is untouched and the run is seeded.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(c.seed)
            if policy is None:
                policy = MLPPolicy(
                    env.obs_dim, env.action_dim, env.action_low, env.action_high, c.hidden, c.activation, c.squash
                )
            self.policy = policy.to(device=device, dtype=dtype)
            self.critic = ValueCritic(env.obs_dim, c.hidden, c.activation).to(device=device, dtype=dtype)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.policy.parameters(), lr=c.lr, betas=c.betas)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=c.critic_lr, betas=c.betas)
        # Rank 0 had identical weights already (same seed); a custom policy
        # built from an unseeded generator is made identical here.
        dp.broadcast_modules([self.policy, self.critic, self.target_critic])
        self.generator = torch.Generator(device=device)
        # Each rank its own streams (noise, minibatches, initial states); rank 0 the single-process ones.
        self.generator.manual_seed(rank_seed(c.seed + 1, dp.rank))

        obs = env.reset(seed=rank_seed(c.seed, dp.rank))
        if c.random_episode_start:
            # Staggered step counters (the trainer's stream): the copies truncate at different times.
            start = torch.randint(env.max_episode_steps, (env.num_envs,), generator=self.generator, device=device)
            obs = env.set_state(env.state, elapsed=start)
        if c.normalize_obs:
            self._update_normalizer(obs)
        self.updates_done = 0
        self.env_steps = 0
        self.wall_s = 0.0
        self.history: list[dict[str, float]] = []
        self._episode_return = torch.zeros(env.num_envs, dtype=torch.float64, device=device)
        self._last_train_return = math.nan
        self._last_eval = math.nan
        self._replay: list[dict[str, torch.Tensor]] = []
        # Past observations for action_change_memory (reservoir sample) and how many were offered.
        self._memory = torch.zeros(0, env.obs_dim, dtype=dtype, device=device)
        self._memory_seen = 0
        #: The evaluation ``train(keep_best=True)`` kept (``{"update", "eval_return"}``), else ``None``.
        self.best: dict[str, float] | None = None

    @property
    def settings(self) -> PolicyTrainerConfig:
        """The settings (the same object as :attr:`config`)."""
        return self.config

    @property
    def num_envs(self) -> int:
        """Env copies over every process (``env.num_envs * world_size``)."""
        return self.env.num_envs * self.data_parallel.world_size

    # -------------------------------------------------------------- training
    def _update_normalizer(self, obs: torch.Tensor) -> None:
        """Merge a batch ``(..., obs_dim)`` of every rank into the observation statistics."""
        norm = self._normalizer()
        if self.data_parallel.active:
            norm.merge(*self.data_parallel.moments(obs))
        else:
            norm.update(obs)

    def _normalizer(self) -> ObsNormalizer:
        norm = getattr(self.policy, "normalizer", None)
        if norm is None:
            # A user policy without a normaliser: the critic gets its own.
            if not hasattr(self, "_own_normalizer"):
                self._own_normalizer = ObsNormalizer(self.env.obs_dim).to(self.env.device)
            return self._own_normalizer
        return norm

    def _rollout(self) -> dict[str, Any]:
        """One window: differentiable rewards and everything the losses need."""
        env, c = self.env, self.config
        env.detach()
        obs = env.observation()
        obs_list, rew_list, final_list, term_list, done_list = [], [], [], [], []
        act_list, probe_list = [], []
        jac = c.actor_replay_steps > 0
        excess = torch.zeros((), dtype=env.dtype, device=env.device)
        structured = isinstance(self.policy, MLPPolicy)
        for _ in range(c.horizon):
            if structured:
                z = self.policy.preact(obs)
                # Penalise pre-activations beyond the box, where tanh's gradient
                # vanishes (or the straight-through clip has no effect).
                excess = excess + torch.relu(z.abs() - 1.0).pow(2).mean()
                action = self.policy.squash_preact(z)
                if c.action_noise > 0:
                    # Exploration in action space (the env clips): a saturated
                    # policy still explores, and the reparameterised noise
                    # keeps the window differentiable.
                    noise = torch.randn(z.shape, generator=self.generator, dtype=z.dtype, device=z.device)
                    action = action + c.action_noise * self.policy.action_half_range * noise
            else:
                action = self.policy(obs)
                if c.action_noise > 0:
                    noise = torch.randn(action.shape, generator=self.generator, dtype=action.dtype, device=action.device)
                    action = action + c.action_noise * (env.action_high - env.action_low) / 2 * noise
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
            "excess": excess / c.horizon,  # mean squared pre-activation excess
            "action": torch.stack(act_list) if jac else None,  # (H, N, action_dim), in the box
            "probes": probe_list,  # per step, (N, action_dim) zeros added to the actions
            "reward_steps": rew_list,  # the per-step tensors stacked above
            "final_steps": final_list,
        }

    def _clip_actor_grad(self) -> torch.Tensor:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        if self.config.max_grad_norm is not None:
            return torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))

    def update(self) -> dict[str, float]:
        """One window and one actor step (plus the critic fit for SHAC).

        Returns:
            The log row of this update (see :data:`LOG_FIELDS`).

        Raises:
            TrainingDivergedError: a loss or the policy gradient is not finite;
                the parameters are not changed.
        """
        c, env, dp = self.config, self.env, self.data_parallel
        H, N = c.horizon, env.num_envs
        t0 = time.perf_counter()
        k = self.updates_done + 1
        if c.lr_decay_updates is not None:
            # Linear decay to zero at update lr_decay_updates (as in SHAC);
            # a function of the update index alone, so resuming is exact.
            frac = max(0.0, 1.0 - (k - 1) / c.lr_decay_updates)
            for group in self.actor_opt.param_groups:
                group["lr"] = c.lr * frac
            for group in self.critic_opt.param_groups:
                group["lr"] = c.critic_lr * frac

        roll = self._rollout()
        reward, done, term = roll["reward"] * c.reward_scale, roll["done"], roll["terminated"]
        shac = c.algo == "shac"
        value = None
        if shac:
            # One batched call for every step; gradients reach the final
            # observations (the actor), never the target critic's weights.
            value = self.target_critic(self._normalizer()(roll["final_obs"])) * (~term)
        objective = window_objective(reward, done, c.gamma, value)
        actor_loss = -objective.sum() / (N * H) + c.preact_penalty * roll["excess"]
        jacobians = self._action_jacobians(roll) if c.actor_replay_steps > 0 else None

        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        # Every rank's loss is the mean over its own copies, so the average
        # of the ranks' gradients is the gradient of the global mean.
        actor_loss = self.data_parallel.average_gradients(list(self.policy.parameters()), actor_loss.detach())
        grad_norm = self._clip_actor_grad()
        if not (torch.isfinite(grad_norm) and torch.isfinite(actor_loss)):
            self.actor_opt.zero_grad(set_to_none=True)
            raise self._diverged(k, f"policy gradient norm {float(grad_norm)}, actor loss {float(actor_loss.detach())}")
        if c.max_action_change is None:
            self.actor_opt.step()
            action_change = math.nan
        else:
            action_change = self._capped_actor_step(roll["obs"])

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
            if c.actor_replay_steps > 0:
                self._replay_actor_steps(k)

        # Bookkeeping (detached): episode returns and normaliser statistics.
        # Masked sums instead of boolean indexing: no host sync per step.
        with torch.no_grad():
            r64 = roll["reward"].detach().to(torch.float64)
            ret_sum = torch.zeros((), dtype=torch.float64, device=r64.device)
            ret_count = torch.zeros((), dtype=torch.float64, device=r64.device)
            for t in range(H):
                self._episode_return += r64[t]
                ret_sum += torch.where(done[t], self._episode_return, 0.0).sum()
                ret_count += done[t].sum()
                self._episode_return = torch.where(done[t], torch.zeros_like(self._episode_return), self._episode_return)
            # One reduction for the log row: every rank logs the same numbers.
            stats = dp.sum_(torch.stack([ret_sum, ret_count, r64.mean()]))
            if c.normalize_obs:
                self._update_normalizer(roll["obs"])
        ret_sum_f, ret_count_f, reward_f = stats.tolist()  # the one host sync of the bookkeeping
        if ret_count_f > 0:
            self._last_train_return = ret_sum_f / ret_count_f

        self.updates_done = k
        self.env_steps += N * H * dp.world_size
        self.wall_s += time.perf_counter() - t0
        return {
            "update": k,
            "env_steps": self.env_steps,
            "wall_s": self.wall_s,
            "train_return": self._last_train_return,
            "window_reward": reward_f / dp.world_size,
            "actor_loss": float(actor_loss),
            "critic_loss": critic_loss,
            "grad_norm": float(grad_norm),
            "eval_return": math.nan,
            "eval_s": 0.0,
            "action_change": action_change,
        }

    def _capped_actor_step(self, obs: torch.Tensor) -> float:
        """The Adam step, scaled back until the actions move by at most ``max_action_change``.

        The change is the root-mean-square difference of the policy's actions
        on the window's observations ``obs`` (every rank's, averaged), in
        units of the action half-range; with ``action_change_memory`` also on
        the memory of past observations, and the larger of the two counts. A
        step beyond the cap moves the parameters ``s`` of the way,
        ``s = cap / change`` (repeated, at most 8 times, as the actions are
        not linear in the parameters), so a small step is left exactly as
        Adam made it. Returns the change after the cap (the larger one).
        """
        cap, dp = self.config.max_action_change, self.data_parallel
        params = list(self.policy.parameters())
        obs = obs.reshape(-1, obs.shape[-1])
        sets = [obs]
        if self.config.action_change_memory > 0 and self._memory.shape[0] > 0:
            sets.append(self._memory)
        half = (self.env.action_high - self.env.action_low).to(obs.dtype) / 2
        with torch.no_grad():
            before = [self.policy(x) for x in sets]
            old = [p.detach().clone() for p in params]
        self.actor_opt.step()
        with torch.no_grad():
            new = [p.detach().clone() for p in params]

            def change() -> float:
                d = torch.stack([((self.policy(x) - b) / half).pow(2).mean() for x, b in zip(sets, before)])
                return math.sqrt(float(dp.mean_(d).max()))

            moved, scale = change(), 1.0
            for _ in range(8):
                if moved <= cap:
                    break
                scale *= cap / moved
                for p, a, b in zip(params, old, new):
                    p.copy_(a + scale * (b - a))
                moved = change()
        if self.config.action_change_memory > 0:
            self._remember(obs)
        return moved

    @torch.no_grad()
    def _remember(self, obs: torch.Tensor) -> None:
        """Offer a window's observations ``(B, obs_dim)`` to the memory (reservoir sampling: after
        ``n`` offered, each is kept with probability ``capacity / n``)."""
        size = self.config.action_change_memory
        fill = min(size - self._memory.shape[0], obs.shape[0])
        if fill > 0:
            self._memory = torch.cat([self._memory, obs[:fill]])
        seen = self._memory_seen + fill
        rest = obs[fill:]
        if rest.shape[0] > 0:
            # The j-th of the rest is observation number seen + j + 1: it replaces slot u * (seen + j + 1)
            # when that is below the capacity (in order, so a later one wins a slot drawn twice).
            u = torch.rand(rest.shape[0], generator=self.generator, dtype=torch.float64, device=rest.device)
            slot = (u * torch.arange(seen + 1, seen + 1 + rest.shape[0], dtype=torch.float64, device=rest.device)).long()
            keep = (slot < size).nonzero().flatten().tolist()
            for j in keep:
                self._memory[int(slot[j])] = rest[j]
        self._memory_seen = seen + rest.shape[0]

    def _action_jacobians(self, roll: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Derivatives of each transition's (scaled) reward and final observation w.r.t. its action.

        ``jac_obs`` ``(H, N, obs_dim, action_dim)`` and ``jac_reward`` ``(H, N,
        action_dim)``, read off the window's own graph (no simulator call):
        the derivative of step ``t``'s outputs with respect to the zero probe
        added to step ``t``'s action. Each backward pass starts from one
        step's own outputs, so it only runs through that step.
        """
        scale = self.config.reward_scale
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
        norm = self._normalizer()
        keys = ("obs", "action", "reward", "final_obs", "terminated", "jac_obs", "jac_reward")
        data = {key: torch.cat([w[key].reshape(-1, *w[key].shape[2:]) for w in self._replay]) for key in keys}
        n = data["obs"].shape[0]
        # The batch size is global: each rank draws its share.
        batch = (min(-(-c.actor_batch_size // self.data_parallel.world_size), n),)
        for _ in range(c.actor_replay_steps):
            idx = torch.randint(n, batch, generator=self.generator, device=data["obs"].device)
            obs, a = data["obs"][idx], data["action"][idx]
            delta = self.policy(obs) - a
            reward = data["reward"][idx] + (data["jac_reward"][idx] * delta).sum(-1)
            nxt = data["final_obs"][idx] + (data["jac_obs"][idx] @ delta.unsqueeze(-1)).squeeze(-1)
            value = self.target_critic(norm(nxt)) * (~data["terminated"][idx])
            loss = -(reward + c.gamma * value).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            loss.backward()
            loss = self.data_parallel.average_gradients(list(self.policy.parameters()), loss.detach())
            grad_norm = self._clip_actor_grad()
            if not (torch.isfinite(grad_norm) and torch.isfinite(loss)):
                self.actor_opt.zero_grad(set_to_none=True)
                raise self._diverged(k, f"replayed actor gradient norm {float(grad_norm)}")
            self.actor_opt.step()

    def _td_lambda(self, reward: torch.Tensor, value: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """TD(lambda) targets ``(H, N)`` with this trainer's gamma and lambda (see :func:`td_lambda`)."""
        return td_lambda(reward, value, done, self.config.gamma, self.config.lam)

    def _fit_critic(self, window: dict[str, torch.Tensor], value: torch.Tensor, k: int) -> float:
        """TD(lambda) targets from the recent windows, then minibatch regression.

        With ``critic_replay = m`` the critic also refits the ``m - 1``
        previous windows, their targets recomputed with the current target
        critic (slightly off-policy, many more samples per update).
        """
        c = self.config
        self._replay.append(window)
        del self._replay[: -c.critic_replay]
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
        dp = self.data_parallel
        if c.critic_batch_size is not None:
            # SAC-style: critic_iterations gradient steps, each on a random
            # minibatch of the replayed samples (the size is global: each
            # rank draws its share from its own copies).
            size = -(-c.critic_batch_size // dp.world_size)
            steps = [
                torch.randint(n, (min(size, n),), generator=self.generator, device=y.device)
                for _ in range(c.critic_iterations)
            ]
        else:
            batch = n // c.critic_minibatches
            steps = []
            for _ in range(c.critic_iterations):
                perm = torch.randperm(n, generator=self.generator, device=y.device)
                steps += [perm[b * batch : (b + 1) * batch] for b in range(c.critic_minibatches)]
        for idx in steps:
            loss = (self.critic(x[idx]) - y[idx]).pow(2).mean()
            self.critic_opt.zero_grad(set_to_none=True)
            loss.backward()
            dp.average_gradients(list(self.critic.parameters()))
            if c.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.critic.parameters(), c.max_grad_norm * 10)
            self.critic_opt.step()
            total += loss.detach()
            count += 1
        # Every rank the same mean, so every rank takes the same branch below.
        mean_loss = float(dp.mean_(total / count))
        if not math.isfinite(mean_loss):
            raise self._diverged(k, f"critic loss {mean_loss}")
        with torch.no_grad():
            a = c.target_alpha
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
        keep_best: bool = False,
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
            keep_best: at the end, put back the policy of the best evaluation
                of this call (needs ``eval_fn``; ties keep the earlier one);
                :attr:`best` then gives its update and return. Only the
                policy (with its observation normaliser) is put back: the
                critic, the optimisers, the env and the checkpoints stay as
                after the last update, so it is for the end of training.

        Returns:
            ``self``.
        """
        if isinstance(updates, bool) or not isinstance(updates, int) or updates < 0:
            raise PolicyConfigError(f"updates must be a non-negative int, got {updates!r}")
        if not isinstance(keep_best, bool):
            raise PolicyConfigError(f"keep_best must be a bool, got {keep_best!r}")
        if keep_best and eval_fn is None:
            raise PolicyConfigError("keep_best needs an evaluation: pass eval_fn (or eval_env to train_policy)")
        for name, val in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise PolicyConfigError(f"{name} must be a positive int, got {val!r}")
        dp = self.data_parallel
        # Every rank must make the same collectives (updates, checkpoints,
        # evaluation broadcasts, stop votes): a rank that did fewer would
        # leave the others waiting.
        dp.check_same(
            "train() arguments",
            {"updates": updates, "eval_every": eval_every, "checkpoint_every": checkpoint_every,
             "eval": eval_fn is not None, "checkpoint": checkpoint is not None, "updates_done": self.updates_done},
        )
        # Rank 0 alone writes the log and draws the progress bar.
        writer = _CsvLog(log_csv) if log_csv is not None and dp.is_main else None
        bar = ProgressBar(updates, "train_policy", enabled=bool(progress) and dp.is_main, interval=0.2)
        shown = self._last_eval
        best = None
        try:
            while self.updates_done < updates:
                # Small env batches on one thread (backdrive.runtime.adaptive_threads).
                with threads_for_batch(self.env.num_envs):
                    row = self.update()
                k = row["update"]
                if eval_fn is not None and (k % eval_every == 0 or k == updates):
                    t0 = time.perf_counter()
                    if dp.is_main:
                        was_training = self.policy.training
                        self.policy.eval()
                        with torch.no_grad():
                            self._last_eval = float(eval_fn(self.policy))
                        self.policy.train(was_training)
                    # Rank 0 evaluates; every rank logs (and may stop on) its result.
                    self._last_eval = dp.broadcast_float(self._last_eval)
                    row["eval_return"] = self._last_eval
                    row["eval_s"] = time.perf_counter() - t0
                    if keep_best and (best is None or self._last_eval > best[1]):
                        best = (k, self._last_eval, copy.deepcopy(self.policy.state_dict()))
                self.history.append(row)
                if writer is not None:
                    writer.write(row)
                if checkpoint is not None and (k % checkpoint_every == 0 or k == updates):
                    self.save(checkpoint)
                shown = self._last_eval if self._last_eval == self._last_eval else row["train_return"]
                bar.update(k, text=f"return {_fmt(shown)}  steps {self.env_steps}")
                stop = callback is not None and bool(callback(row))
                # A stop on any rank stops every rank (else the others would
                # wait in the next update's collectives).
                if dp.any(stop):
                    break
        finally:
            bar.close(self.updates_done, text=f"return {_fmt(shown)}  steps {self.env_steps}")
            if writer is not None:
                writer.close()
        if best is not None:
            self.policy.load_state_dict(best[2])
            self.best = {"update": best[0], "eval_return": best[1]}
        return self

    # ----------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything that defines the run, for an exact resume: tensors and plain containers only.

        Under data parallelism this is a collective (every rank must call
        it): the env state, episode returns and replayed windows of every
        rank are gathered into the global batch, in rank order, and every
        rank's random generators are kept (``rank_generators``), so the
        checkpoint resumes under any world size.
        """
        dp = self.data_parallel
        env_state = self.env.state_dict()
        gens = dp.gather_objects({"env": env_state["generator"].cpu(), "trainer": self.generator.get_state().cpu()})
        state = {
            "format": FORMAT,
            "config": {**self.config.to_dict(), "obs_dim": self.env.obs_dim, "action_dim": self.env.action_dim},
            "policy": self.policy.state_dict(),
            "critic": self.critic.state_dict(),
            "target_critic": self.target_critic.state_dict(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "env": {
                "state": dp.gather(env_state["state"], 0),
                "elapsed": dp.gather(env_state["elapsed"], 0),
                "generator": env_state["generator"],
            },
            "generator": self.generator.get_state(),
            "world_size": dp.world_size,
            "rank_generators": gens,
            "updates_done": self.updates_done,
            "env_steps": self.env_steps,
            "wall_s": self.wall_s,
            "episode_return": dp.gather(self._episode_return, 0).clone(),
            "last_train_return": self._last_train_return,
            "last_eval": self._last_eval,
            "history": [dict(row) for row in self.history],
            # Windows are (H, N, ...): the env axis is 1.
            "replay": [{key: dp.gather(val, 1) for key, val in w.items()} for w in self._replay],
            # Every rank's memory of past observations (action_change_memory), stacked in rank order.
            "action_memory": dp.gather(self._memory, 0),
            "action_memory_seen": self._memory_seen,
        }
        if hasattr(self, "_own_normalizer"):
            state["normalizer"] = self._own_normalizer.state_dict()
        return state

    def save(self, path: str | os.PathLike) -> None:
        """Write a checkpoint atomically (temporary file, then rename).

        Under data parallelism every rank calls it (the state is gathered);
        rank 0 alone writes the file.
        """
        state = self.state_dict()
        if self.data_parallel.is_main:
            write_checkpoint(state, path)
        # No rank returns before the file is there: a rank that reads it next
        # (a resume in the same script) must find the new one.
        self.data_parallel.barrier()
        self._last_checkpoint = str(path)
        self._last_checkpoint_update = self.updates_done

    def load(self, path: str | os.PathLike) -> PolicyTrainer:
        """Continue from a checkpoint written by :meth:`save` with the same settings.

        The file is read with ``torch.load(weights_only=True)``, so nothing in
        it runs; checkpoints of every earlier backdrive version load.

        Raises:
            PolicyConfigError: the checkpoint was made with other settings or
                for an env with other observation or action sizes, or the
                file is not a safe backdrive checkpoint.
        """
        ckpt = read_checkpoint(path, self.env.device)
        saved, obs_dim, action_dim = checkpoint_config(ckpt, path)
        if obs_dim != self.env.obs_dim or action_dim != self.env.action_dim:
            raise PolicyConfigError(
                f"checkpoint {path} has obs size {obs_dim} and action size "
                f"{action_dim}, but {type(self.env).__name__} has obs size "
                f"{self.env.obs_dim} and action size {self.env.action_dim}"
            )
        now = self.config
        diff = [name for name in now.field_names() if getattr(saved, name) != getattr(now, name)]
        if diff:
            pairs = ", ".join(f"{n}: checkpoint {getattr(saved, n)!r} vs now {getattr(now, n)!r}" for n in diff)
            raise PolicyConfigError(f"checkpoint {path} was trained with other settings ({pairs})")
        dp = self.data_parallel
        saved_world = int(ckpt.get("world_size", 1))
        n_global = ckpt["env"]["state"].shape[0]
        if n_global != self.num_envs:
            raise PolicyConfigError(
                f"checkpoint {path} holds {n_global} env copies, but this run has {self.num_envs} "
                f"({self.env.num_envs} per process x {dp.world_size} processes)"
            )
        self.policy.load_state_dict(ckpt["policy"])
        self.critic.load_state_dict(ckpt["critic"])
        self.target_critic.load_state_dict(ckpt["target_critic"])
        self.actor_opt.load_state_dict(ckpt["actor_opt"])
        self.critic_opt.load_state_dict(ckpt["critic_opt"])
        if saved_world == dp.world_size:
            # The same split: every rank continues its own random streams exactly.
            gens = ckpt.get("rank_generators") or [{"env": ckpt["env"]["generator"], "trainer": ckpt["generator"]}]
            env_gen, trainer_gen = gens[dp.rank]["env"].cpu(), gens[dp.rank]["trainer"].cpu()
        else:
            # Another split: the saved streams belong to other slices, so each
            # rank starts a fresh one (seeded by the run's seed, the rank and
            # the update), and the run continues statistically, not bit for bit.
            env_gen = torch.Generator(device=self.env.device)
            env_gen.manual_seed(rank_seed(self.config.seed, dp.rank, restart=1 + int(ckpt["updates_done"])))
            env_gen = env_gen.get_state()
            trainer_gen = torch.Generator(device=self.env.device)
            trainer_gen.manual_seed(rank_seed(self.config.seed + 1, dp.rank, restart=1 + int(ckpt["updates_done"])))
            trainer_gen = trainer_gen.get_state()
        self.env.load_state_dict(
            {
                "state": dp.local_slice(ckpt["env"]["state"], 0),
                "elapsed": dp.local_slice(ckpt["env"]["elapsed"], 0),
                "generator": env_gen,
            }
        )
        self.generator.set_state(trainer_gen)
        if "normalizer" in ckpt:
            self._normalizer().load_state_dict(ckpt["normalizer"])
        self.updates_done = ckpt["updates_done"]
        self.env_steps = ckpt["env_steps"]
        self.wall_s = ckpt["wall_s"]
        self._episode_return = dp.local_slice(ckpt["episode_return"].to(self.env.device), 0)
        self._last_train_return = ckpt["last_train_return"]
        self._last_eval = ckpt["last_eval"]
        self.history = [dict(row) for row in ckpt["history"]]
        self._replay = [{key: dp.local_slice(val, 1) for key, val in w.items()} for w in ckpt["replay"]]
        if "action_memory" in ckpt and ckpt["action_memory"].shape[0] > 0:
            memory = ckpt["action_memory"].to(device=self.env.device, dtype=self.env.dtype)
            self._memory = memory.view(saved_world, -1, memory.shape[-1])[dp.rank % saved_world].clone() \
                if saved_world == dp.world_size else memory[: self.config.action_change_memory].clone()
            self._memory_seen = int(ckpt["action_memory_seen"])
        self._last_checkpoint = str(path)
        self._last_checkpoint_update = self.updates_done
        return self


class _CsvLog:
    def __init__(self, path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        new = not path.exists() or path.stat().st_size == 0
        self._file = open(path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=LOG_FIELDS)
        if new:
            self._writer.writeheader()

    def write(self, row: dict[str, float]) -> None:
        self._writer.writerow(row)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _no_settings_message(env: DiffEnv, algo: str | None) -> str:
    name = type(env).__name__
    default = PolicyTrainerConfig()
    generic = (
        f"config=PolicyTrainerConfig() takes the generic defaults on purpose ({default.horizon}-step "
        f"windows, lr {default.lr:g}, no replay, 200 updates), which are not tuned for any env"
    )
    preset = recommended_preset(env, algo)
    if preset is None:
        return (
            f"train_policy({name}, ...) was given no training settings; say which: pass config= "
            f"(a PolicyTrainerConfig), preset=, or the settings as keywords (horizon=..., lr=...). {generic}."
        )
    upper = preset.name.upper()
    env_args = ", ".join(f"{k}={v!r}" for k, v in preset.env_kwargs.items())
    return (
        f"train_policy({name}, ...) was given no training settings. The generic defaults are not tuned for "
        f"{name} (on Pendulum they ran for minutes and did not swing it up). Use the preset tuned for it, "
        f"backdrive.optim.{upper} ({preset.summary}): env = {upper}.make_env() (= {preset.env_type.__name__}"
        f"({env_args})); train_policy(env, preset={upper}). Or pass config=, or settings as keywords; "
        f"{generic}."
    )


def train_policy(
    env: DiffEnv,
    algo: str | None = None,
    *,
    preset: Preset | str | None = None,
    config: PolicyTrainerConfig | None = None,
    updates: int | None = None,
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
    keep_best: bool = False,
    num_threads: int | None = None,
    distributed: bool | None = None,
    backend: str | None = None,
    timeout_s: float | None = None,
    **settings: Any,
) -> PolicyTrainer:
    """Train a policy by backpropagating through a differentiable environment.

    Each update rolls all ``env.num_envs`` copies forward ``horizon`` steps,
    differentiates the window's return (plus, for SHAC, the critic's value of
    where it ends) with respect to the policy parameters, clips the gradient
    norm and takes one Adam step; the graph is cut between windows. Every
    env transition counts: an update costs ``num_envs * horizon`` env steps
    (replayed critic and actor steps reuse stored transitions and take none).

    The call must say which settings to train with: a ``preset`` (tuned
    settings for a shipped env, e.g. ``PENDULUM_SHAC``), a ``config``, or
    settings as keywords. With none of them (and no ``resume``) it raises
    and names the preset for ``env``: the generic defaults of
    :class:`PolicyTrainerConfig` are not tuned for any env.

    Args:
        env: the training environment (stepped in place; reset with ``seed``).
            With a preset, build it with ``preset.make_env()``; an env that
            differs from the preset's gets a warning.
        algo: ``"apg"`` or ``"shac"``; overrides the config's or preset's.
        preset: a :class:`Preset` (or its name): its ``config`` and ``updates``.
        config: a :class:`PolicyTrainerConfig` (not with ``preset``).
        updates: total number of updates, resumed ones included (default:
            the preset's, else 200).
        policy: a custom ``nn.Module`` policy (default: :class:`MLPPolicy`).
        eval_fn: ``policy -> mean return`` for periodic evaluation.
        eval_env: alternatively, a backdrive env evaluated with
            :func:`evaluate_policy` (seed 0).
        eval_every: evaluation period in updates.
        log_csv: CSV file, one row per update.
        checkpoint: checkpoint path (policy, critic, optimisers, normaliser,
            env, generators and replayed windows).
        checkpoint_every: checkpoint period in updates.
        resume: continue from this checkpoint. Its settings are used when the
            call gives none; given ones must match them.
        progress: progress bar with the latest return on stderr.
        callback: called with each log row; returning ``True`` stops early.
        keep_best: return the policy of the best periodic evaluation instead
            of the last one (needs ``eval_fn`` or ``eval_env``; see
            :meth:`PolicyTrainer.train`).
        num_threads: torch intra-op threads while training (restored after).
            Small networks on small batches run fastest on one thread; on a
            busy machine several threads can be ten times slower.
        distributed: data-parallel training over ``torch.distributed``
            (docs/scaling.md). ``None`` (default): on when a launcher such as
            ``torchrun`` started several processes (``WORLD_SIZE > 1``) or a
            process group is initialised; ``False``: one process regardless;
            ``True``: required. Every process passes the same env (``num_envs``
            is the global batch), settings and seed; each steps ``num_envs //
            world_size`` copies with its own seed stream, gradients and
            observation statistics are averaged over the processes, and rank
            0 alone writes ``log_csv`` and ``checkpoint``.
        backend: ``"gloo"`` or ``"nccl"`` for a process group created here
            (default: nccl for a CUDA env, gloo otherwise).
        timeout_s: seconds a collective waits for the other processes before
            raising, so a dead or hung rank cannot block the rest forever
            (default 600; only for a process group created here).
        **settings: fields of :class:`PolicyTrainerConfig` (see there for
            what each does), overriding those of ``config`` or ``preset``.

    Returns:
        The :class:`PolicyTrainer`; ``.policy`` is the trained policy (maps raw
        observations to actions), ``.history`` the log rows.

    Raises:
        PolicyConfigError: a bad setting, or no settings at all, found before
            any update; under data parallelism also a world size that does
            not divide ``num_envs``, or processes with different settings,
            seeds or envs.
        TrainingDivergedError: a non-finite gradient or loss; names the update.
        TypeError: a keyword that is neither an argument nor a setting.
    """
    if preset is not None and config is not None:
        raise PolicyConfigError("give preset or config, not both (keywords override either)")
    chosen = preset is not None or config is not None or any(name != "seed" for name in settings)
    if preset is not None:
        preset = get_preset(preset)
        config = preset.config
        if updates is None:
            updates = preset.updates
    elif resume is not None and config is None and not chosen:
        # The checkpoint says how it was trained.
        config = checkpoint_config(read_checkpoint(resume, env.device), resume)[0]
        chosen = True
    if updates is None:
        updates = 200
    cfg = _make_config(config, algo, settings)
    if not isinstance(env, DiffEnv):
        raise PolicyConfigError(f"env must be a backdrive DiffEnv, got {type(env).__name__}")
    if not chosen:
        raise PolicyConfigError(_no_settings_message(env, cfg.algo))
    if preset is not None:
        differences = preset.mismatches(env)
        if differences:
            upper = preset.name.upper()
            tuned = ", ".join(f"{k}={v!r}" for k, v in preset.env_kwargs.items())
            warnings.warn(
                f"{upper} was tuned on {preset.env_type.__name__}({tuned}); this env differs: "
                f"{'; '.join(differences)}. Build it with {upper}.make_env() for the documented result.",
                UserWarning,
                stacklevel=2,
            )
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

    bad_threads = isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1
    if num_threads is not None and bad_threads:
        raise PolicyConfigError(f"num_threads must be a positive int or None, got {num_threads!r}")
    trainer = PolicyTrainer(
        env, config=cfg, policy=policy, distributed=distributed, backend=backend, timeout_s=timeout_s
    )
    if resume is not None:
        trainer.load(resume)
    previous_threads = torch.get_num_threads()
    if num_threads is not None:
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
            keep_best=keep_best,
        )
    finally:
        torch.set_num_threads(previous_threads)

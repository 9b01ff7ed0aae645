"""Returns: the window objective of APG and SHAC, TD(lambda) targets, and evaluation.

The window objective for copy ``i`` (``d`` = 1 for a truncated episode end
and at the window end, 0 after a termination; ``k_t`` the steps since the
segment started; ``e_t`` marks a segment end, an episode end or ``t = H-1``):

.. math::
    J_i = \\sum_{t<H} \\gamma^{k_t}\\big(r_t + \\gamma\\, e_t\\, d_t\\, V(o^{final}_t)\\big)

APG drops the value term. The actor minimises ``-mean_i J_i / H``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...envs._base import DiffEnv

__all__ = ["segment_discounts", "window_objective", "td_lambda", "evaluate_policy"]


def segment_discounts(done: torch.Tensor, gamma: float, dtype: torch.dtype) -> torch.Tensor:
    """``gamma^k_t`` with ``k_t`` the steps since the current episode segment began.

    Args:
        done: ``(H, N)`` bool, an episode ended at step ``t``.
        gamma: discount factor.
        dtype: of the result (the products are formed in it).

    Returns:
        ``(H, N)`` discounts, 1 at the window start and after every episode end.
    """
    H, N = done.shape
    out = [torch.ones(N, dtype=dtype, device=done.device)]
    for t in range(H - 1):
        out.append(torch.where(done[t], torch.ones_like(out[-1]), out[-1] * gamma))
    return torch.stack(out)


def window_objective(
    reward: torch.Tensor, done: torch.Tensor, gamma: float, value: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-step terms of the window objective ``J``, ``(H, N)``; their sum over ``t`` is ``J``.

    Args:
        reward: ``(H, N)`` (scaled) rewards, differentiable.
        done: ``(H, N)`` bool episode ends.
        gamma: discount factor.
        value: ``(H, N)`` value of each step's final observation, zero after a
            termination (SHAC), or ``None`` (APG).
    """
    disc = segment_discounts(done, gamma, reward.dtype)
    if value is None:
        return disc * reward
    seg_end = done.clone()
    seg_end[-1] = True
    return disc * (reward + gamma * seg_end * value)


def td_lambda(reward: torch.Tensor, value: torch.Tensor, done: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """TD(lambda) targets ``(H, N)`` of one window (or windows side by side along ``N``).

    ``G_t = r_t + gamma ((1 - l_t) V_t + l_t G_{t+1})`` with ``l_t = 0`` at a
    segment end (episode end or the window's last step).

    Args:
        reward: ``(H, N)`` scaled rewards.
        value: ``(H, N)`` target critic at each step's final observation, 0
            after a termination.
        done: ``(H, N)`` bool episode ends.
        gamma, lam: discount and TD(lambda) mixing.
    """
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

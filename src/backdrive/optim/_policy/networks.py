"""The networks of policy learning: observation normaliser, MLP policy, value critic."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..._errors import PolicyConfigError

__all__ = ["ACTIVATIONS", "SQUASHES", "ObsNormalizer", "MLPPolicy", "ValueCritic"]

#: Names accepted by ``activation``, mapped to their modules.
ACTIVATIONS = {"elu": nn.ELU, "tanh": nn.Tanh, "relu": nn.ReLU, "silu": nn.SiLU}
#: Names accepted by ``squash``.
SQUASHES = ("tanh", "clip")


class ObsNormalizer(nn.Module):
    """Running mean and variance of observations; ``forward`` standardises.

    Statistics are created in float64 (merged batch by batch with Chan's
    parallel formula) and are buffers: they travel in ``state_dict`` and
    checkpoints. Being buffers, they follow the module's dtype: the trainer
    moves the policy to the env's dtype, so with a float32 env they are
    float32 (a policy rebuilt from a ``state_dict`` must be cast the same way
    to act bit for bit as trained). ``forward`` is differentiable in ``obs``.

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
        self.merge(x.shape[0], x.mean(0), x.var(0, unbiased=False))

    @torch.no_grad()
    def merge(self, n: int, batch_mean: torch.Tensor, batch_var: torch.Tensor) -> None:
        """Merge the moments of a batch of ``n`` observations (``(obs_dim,)`` float64 mean and biased variance).

        Data-parallel training merges the moments of every rank's batch with this.
        """
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
    if activation not in ACTIVATIONS:
        raise PolicyConfigError(f"unknown activation {activation!r}; valid: {', '.join(map(repr, ACTIVATIONS))}")
    layers: list[nn.Module] = []
    width = n_in
    for h in hidden:
        layers += [nn.Linear(width, h), ACTIVATIONS[activation]()]
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
        squash: ``"tanh"``, or ``"clip"`` (straight-through) into the box.
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
        if squash not in SQUASHES:
            raise PolicyConfigError(f"unknown squash {squash!r}; valid: {', '.join(map(repr, SQUASHES))}")
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

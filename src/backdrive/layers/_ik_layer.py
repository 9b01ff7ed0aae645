"""``DifferentiableIKLayer``: unrolled DLS inverse kinematics as an ``nn.Module``."""

from __future__ import annotations

import torch
from torch import nn

from .._errors import InputError
from ..runtime import finite_checked
from ..kinematics._ik import (
    ConfigError,
    DifferentiableIKCfg,
    DifferentiableIKResult,
    solve_dls_ik,
)
from ._fk_layer import DifferentiableFKLayer, check_to_arguments

__all__ = ["DifferentiableIKLayer"]


class DifferentiableIKLayer(nn.Module):
    """Joint positions that reach tool targets, differentiable end to end.

    Every call runs ``cfg.max_iterations`` damped least-squares updates
    ``q <- q + step_size * J^T (J J^T + damping^2 I)^-1 e`` (``e`` the
    root-frame ``[position; rotation]`` error of
    :func:`backdrive.spatial.pose_error`), each with one FK pass and the tool
    Jacobian of ``fk``, keeping all their derivatives. Tolerances classify the
    final iterate and never stop the loop. With ``enforce_joint_limits`` (the
    default) the seed and every update are clamped into ``fk.lower``/``fk.upper``.
    Success needs finite values, both tolerances and the limits. A failed
    solve returns its last iterate and residuals.

    Seeds are ``(dof,)`` or match all target batch axes; ``None`` means
    ``fk.default_seed()``. Gradients reach the targets and a supplied seed.
    With ``cfg.num_seeds = K > 1`` each target is solved from K starts at
    once and the best is returned (see :class:`DifferentiableIKCfg`).

    The layer holds the FK layer as the submodule ``kinematics`` (the
    seed contract's name; ``ik.fk`` is the same module) and its settings as
    checkpoint extra state, so ``state_dict`` carries the TCP, the limits,
    the geometry fingerprint (keys ``kinematics.*``) and the numerical
    settings; loading restores the settings. Checkpoints saved with the
    earlier child name, keys ``fk.*``, still load.

    Targets must be rigid transforms: a scaled or sheared rotation, a bottom
    row other than ``[0, 0, 0, 1]`` or a NaN is an :class:`InputError`
    (:func:`~backdrive.kinematics._ik.check_targets`).

    Args:
        kinematics: the :class:`DifferentiableFKLayer` to invert (kept, not
            copied). Also accepted as the keyword ``fk``.
        cfg: numerical settings (default ``DifferentiableIKCfg()``).
    """

    def __init__(
        self,
        kinematics: DifferentiableFKLayer | None = None,
        cfg: DifferentiableIKCfg | None = None,
        *,
        fk: DifferentiableFKLayer | None = None,
    ):
        super().__init__()
        if kinematics is not None and fk is not None and kinematics is not fk:
            raise InputError("give the FK layer once, as kinematics (or its older name fk), not both")
        kinematics = fk if kinematics is None else kinematics
        if not isinstance(kinematics, DifferentiableFKLayer):
            raise InputError(f"kinematics must be a DifferentiableFKLayer, got {type(kinematics).__name__}")
        cfg = DifferentiableIKCfg() if cfg is None else cfg
        if not isinstance(cfg, DifferentiableIKCfg):
            raise ConfigError(f"cfg must be a DifferentiableIKCfg, got {type(cfg).__name__}")
        self.kinematics = kinematics
        self.cfg = cfg

    def to(self, *args, **kwargs):
        """``nn.Module.to``, with an :class:`InputError` for an unknown or unavailable device."""
        check_to_arguments(args, kwargs)
        return super().to(*args, **kwargs)

    @property
    def fk(self) -> DifferentiableFKLayer:
        """The FK layer (the submodule ``kinematics``; its earlier name)."""
        return self.kinematics

    @property
    def dof(self) -> int:
        return self.kinematics.dof

    @finite_checked(name="DifferentiableIKLayer.forward")
    def forward(self, target_xpos: torch.Tensor, qpos_seed: torch.Tensor | None = None) -> torch.Tensor:
        """Joint positions ``(..., dof)`` for targets ``T_root_tool (..., 4, 4)``."""
        return self.solve(target_xpos, qpos_seed).qpos

    @finite_checked(name="DifferentiableIKLayer.solve")
    def solve(
        self, target_xpos: torch.Tensor, qpos_seed: torch.Tensor | None = None
    ) -> DifferentiableIKResult:
        """The final iterate, a success mask and differentiable residuals.

        Args:
            target_xpos: ``(..., 4, 4)`` target tool poses in the chain root frame.
            qpos_seed: ``(dof,)``, ``(..., dof)`` or ``None`` (``fk.default_seed()``).

        Returns:
            :class:`~backdrive.kinematics.DifferentiableIKResult` with the
            target's batch axes.
        """
        fk = self.kinematics
        return solve_dls_ik(
            fk.chain, target_xpos, qpos_seed, self.cfg, tcp=fk.tcp, lower=fk.lower, upper=fk.upper
        )

    def extra_repr(self) -> str:
        return f"cfg={self.cfg}"

    def get_extra_state(self) -> dict:
        """The numerical settings, saved with the checkpoint."""
        return {"ik_cfg": self.cfg.to_dict()}

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        # Checkpoints from before the child was named ``kinematics`` keep it
        # under ``fk.``: rename in place, so that the child loads them (torch
        # hands each child the entries of this dict under its prefix).
        old, new = prefix + "fk.", prefix + "kinematics."
        for key in [k for k in state_dict if k.startswith(old)]:
            renamed = new + key[len(old):]
            if renamed in state_dict:
                raise InputError(f"checkpoint holds both {key!r} and {renamed!r}; keep one")
            state_dict[renamed] = state_dict.pop(key)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def set_extra_state(self, state) -> None:
        """Restore (and validate) the numerical settings of a checkpoint."""
        if not isinstance(state, dict) or "ik_cfg" not in state:
            raise ConfigError(f"IK checkpoint extra state must be a dict with 'ik_cfg', got {state!r}")
        self.cfg = DifferentiableIKCfg.from_dict(dict(state["ik_cfg"]))

"""Joint-space inertia matrix by the composite-rigid-body algorithm (CRBA)."""

from __future__ import annotations

import torch

from ..kinematics._paths import choose
from ..kinematics._kernels import apply_inertia, apply_inertia_columns
from ..kinematics._schedule import up
from ..model import RobotModel
from ._fast import mass_matrix_fast
from ._tree import (
    Kinematics,
    Topology,
    base_motion_to_world,
    kinematics,
    topology,
)

__all__ = ["mass_matrix", "crba_core"]


def composite_inertia(topo: Topology, kin: Kinematics) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inertia of each active body's subtree at the world origin: ``m, h, I``.

    Spatial inertias at a common point add, so the composite inertias are one
    subtree sum of the 13 numbers ``(m, h, I)`` of every body.
    """
    m = kin.m.expand(kin.h.shape[:-1])
    packed = torch.cat([m[..., None], kin.h, kin.I.flatten(-2)], -1)
    Ic = up(topo.sums, packed)
    return Ic[..., 0], Ic[..., 1:4], Ic[..., 4:].unflatten(-1, (3, 3))


def base_columns(kin: Kinematics) -> torch.Tensor:
    """The floating base's 6 motion columns in the world frame, ``(..., 6, 6)`` (one per row)."""
    R0, p0 = kin.R[..., 0, :, :], kin.p[..., 0, :]
    eye = torch.eye(6, dtype=R0.dtype, device=R0.device)
    return base_motion_to_world(R0[..., None, :, :], p0[..., None, :], eye)


def crba_core(model: RobotModel, topo: Topology, kin: Kinematics, keep: dict | None = None) -> torch.Tensor:
    """The mass matrix ``(..., nv, nv)`` from precomputed kinematics (armature included).

    ``kin.M`` when the kinematics carry it (``kinematics(..., mass=True)``);
    ``keep``: a dict that receives the base columns ``"B"`` ``(..., 6, 6)``
    (``None`` for a fixed base), as :func:`rnea_core`'s ``keep`` receives its
    passes' arrays.
    """
    if kin.M is not None and keep is None:
        return kin.M
    if keep is not None:
        keep["B"] = None
    fb = model.floating_base
    S = kin.S
    mc, hc, Ic = composite_inertia(topo, kin)
    blocks = None
    if topo.nm:
        sl = slice(1, None) if fb else slice(None)
        # F_i = Ic_i S_i: the force that moving joint i alone, at unit rate of
        # acceleration, needs from its subtree. M[j, i] = S_j . F_i for j on
        # the path from the root to i.
        F = apply_inertia(mc[..., sl], hc[..., sl, :], Ic[..., sl, :, :], S)
        P = S @ F.transpose(-1, -2)
        Mm = P * topo.upper + (P * topo.strict).transpose(-1, -2)
        if topo.coupled:
            Mm = topo.G.T @ Mm @ topo.G
        if model.num_joints:
            Mm = Mm + torch.diag_embed(model.armature.expand(Mm.shape[:-1]))
        blocks = Mm
    if fb:
        B = base_columns(kin)  # (..., 6, 6), row k = k-th base column
        if keep is not None:
            keep["B"] = B
        FB = apply_inertia_columns(mc[..., :1], hc[..., :1, :], Ic[..., :1, :, :], B[..., None, :, :])[..., 0, :, :]
        Mbb = B @ FB.transpose(-1, -2)
        Mbb = 0.5 * (Mbb + Mbb.transpose(-1, -2))  # exactly symmetric, not just to rounding
        if blocks is None:
            return Mbb
        Mbj = B @ F.transpose(-1, -2)  # the base is an ancestor of every body
        if topo.coupled:
            Mbj = Mbj @ topo.G
        top = torch.cat([Mbb, Mbj], -1)
        bottom = torch.cat([Mbj.transpose(-1, -2), blocks], -1)
        M = torch.cat([top, bottom], -2)
        return M
    if blocks is None:
        blocks = kin.S.new_zeros(*kin.S.shape[:-2], 0, 0)
    return blocks


def mass_matrix(robot: RobotModel, q: torch.Tensor) -> torch.Tensor:
    """The joint-space inertia matrix ``M(q)`` (CRBA), full and symmetric.

    ``M(q)`` is the matrix of the kinetic energy ``0.5 v^T M v``, plus the rotor
    armature ``robot.armature`` on the joint coordinates' diagonal (as in
    Pinocchio's ``crba``). Mimic joints contribute through their coupling:
    ``M = G^T M_bodies G`` with ``G`` the map from coordinates to body rates.

    Args:
        robot: the robot model.
        q: ``(..., nq)`` configuration.

    Returns:
        ``(..., nv, nv)`` in kg m^2 (revolute), kg (prismatic), mixed for the
        floating base (base twist in the base frame).
    """
    robot.check_q(q)
    topo = topology(robot)
    if choose("mass_matrix", q.shape[:-1].numel(), topo.nm > 0):
        return mass_matrix_fast(robot, q)
    return crba_core(robot, topo, kinematics(robot, topo, q))

"""Joint-space inertia matrix by the composite-rigid-body algorithm (CRBA)."""

from __future__ import annotations

import torch

from ..kinematics._fk import transforms_active
from ..model import RobotModel
from . import _tree, _wide
from ._tree import (
    Kinematics,
    Topology,
    apply_inertia,
    apply_inertia_columns,
    base_motion_to_world,
    kinematics,
    topology,
    tree_up,
    TREE_MATMUL_MAX_BATCH,
)

__all__ = ["mass_matrix", "crba_core"]


def composite_inertia(topo: Topology, kin: Kinematics) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inertia of each active body's subtree at the world origin: ``m, h, I``.

    Spatial inertias at a common point add, so the composite inertias are one
    subtree sum of the 13 numbers ``(m, h, I)`` of every body.
    """
    m = kin.m.expand(kin.h.shape[:-1])
    packed = torch.cat([m[..., None], kin.h, kin.I.flatten(-2)], -1)
    Ic = tree_up(topo, packed)
    return Ic[..., 0], Ic[..., 1:4], Ic[..., 4:].unflatten(-1, (3, 3))


def base_columns(kin: Kinematics) -> torch.Tensor:
    """The floating base's 6 motion columns in the world frame, ``(..., 6, 6)`` (one per row)."""
    R0, p0 = kin.R[..., 0, :, :], kin.p[..., 0, :]
    eye = torch.eye(6, dtype=R0.dtype, device=R0.device)
    return base_motion_to_world(R0[..., None, :, :], p0[..., None, :], eye)


def _joint_block_wide(model: RobotModel, topo: Topology, kin: Kinematics):
    """Composite inertias and the joints' block of the mass matrix for a large
    batch, component-wise with the batch innermost (see ``_rnea._rnea_wide``).

    Returns the composite ``m, h, I`` and ``F = Ic S`` of the moving bodies in
    the usual layout (for the floating base's blocks) and the joints' block
    ``(..., nj, nj)`` with armature.
    """
    batch = kin.S.shape[:-2]
    nm, na = topo.nm, topo.na
    S = kin.S.reshape(-1, nm, 6).permute(2, 1, 0).contiguous()  # (6, nm, N)
    N = S.shape[-1]
    h = kin.h.reshape(N, na, 3).permute(2, 1, 0)
    I = kin.I.reshape(N, na, 9).permute(2, 1, 0)
    packed = torch.cat([kin.m[None, :, None].expand(1, na, N), h, I], 0)  # (13, na, N)
    C = torch.matmul(topo.anc.T, packed)
    sl = slice(1, None) if model.floating_base else slice(None)
    Cm = C[:, sl]
    m, hc, Ic = Cm[0], Cm[1:4], Cm[4:].unflatten(0, (3, 3))
    Sl, Sa = S[:3], S[3:]
    # F = Ic S: [m Sl + Sa x h; I Sa + h x Sl].
    fl = torch.addcmul(Sa.roll(-1, 0) * hc.roll(1, 0) - Sa.roll(1, 0) * hc.roll(-1, 0), m, Sl)
    fa = Ic[:, 0] * Sa[0]
    fa.addcmul_(Ic[:, 1], Sa[1]).addcmul_(Ic[:, 2], Sa[2])
    fa.add_(hc.roll(-1, 0) * Sl.roll(1, 0) - hc.roll(1, 0) * Sl.roll(-1, 0))
    F = torch.cat([fl, fa], 0)  # (6, nm, N)
    P = S[0, :, None] * F[0, None, :]  # P[j, i] = S_j . F_i, (nm, nm, N)
    for k in range(1, 6):
        P.addcmul_(S[k, :, None], F[k, None, :])
    up, st = topo.upper[:, :, None], topo.strict[:, :, None]
    Mm = P * up + (P * st).transpose(0, 1)
    Mm = Mm.permute(2, 0, 1).contiguous().reshape(*batch, nm, nm)
    if topo.coupled:
        Mm = topo.G.T @ Mm @ topo.G
    if model.num_joints:
        Mm = Mm + torch.diag_embed(model.armature.expand(Mm.shape[:-1]))
    if not model.floating_base:
        return None, None, None, None, Mm
    C_aos = C.permute(2, 1, 0).contiguous().reshape(*batch, na, 13)
    return (
        C_aos[..., 0],
        C_aos[..., 1:4],
        C_aos[..., 4:].unflatten(-1, (3, 3)),
        F.permute(2, 1, 0).contiguous().reshape(*batch, nm, 6),
        Mm,
    )


def crba_core(model: RobotModel, topo: Topology, kin: Kinematics) -> torch.Tensor:
    """The mass matrix ``(..., nv, nv)`` from precomputed kinematics (armature included)."""
    fb = model.floating_base
    S = kin.S
    if topo.nm and S.shape[:-2].numel() > TREE_MATMUL_MAX_BATCH:
        mc, hc, Ic, F, blocks = _joint_block_wide(model, topo, kin)
    else:
        mc, hc, Ic = composite_inertia(topo, kin)
        blocks = None
    if topo.nm and blocks is None:
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
        return torch.cat([top, bottom], -2)
    if blocks is None:
        return kin.S.new_zeros(*kin.S.shape[:-2], 0, 0)
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
    if (
        not topo.coupled
        and topo.nm
        and q.shape[:-1].numel() >= max(_wide.FORWARD_MIN_BATCH, _tree.TREE_MATMUL_MAX_BATCH + 1)
        and not (torch.is_grad_enabled() and _needs_grad(robot, q))
        and not transforms_active()
    ):
        # No gradient wanted: the sparse CRBA of the batch-last path.
        return _wide.mass_matrix_t(robot, q)
    return crba_core(robot, topo, kinematics(robot, topo, q))


def _needs_grad(robot: RobotModel, q: torch.Tensor) -> bool:
    return q.requires_grad or any(
        getattr(robot, k).requires_grad for k in ("body_mass", "body_com", "body_inertia", "armature")
    )

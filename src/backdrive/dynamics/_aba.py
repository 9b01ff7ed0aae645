"""Forward dynamics by the articulated-body algorithm (ABA).

Featherstone's ABA in the world frame. The inward pass accumulates
articulated inertias from the leaves to the root, one batched step per tree
depth level (each level's bodies add their contribution to their parents in
the level above with one ``index_add``); the outward pass resolves the joint
accelerations level by level. With every quantity at the world origin no
spatial transform is needed between a body and its parent.
"""

from __future__ import annotations

import torch

from ..kinematics._kernels import apply_inertia, cross_force, cross_motion, skew
from ..kinematics._schedule import down
from ..model import RobotModel
from ._tree import (
    Kinematics,
    Topology,
    base_force_to_world,
    base_motion_to_world,
    joint_rates,
    world_motion_to_base,
)

__all__ = ["aba_core", "spatial_inertia_matrix"]


def spatial_inertia_matrix(m: torch.Tensor, h: torch.Tensor, I: torch.Tensor) -> torch.Tensor:
    """The 6x6 matrix ``[[m 1, -[h]x], [[h]x, I]]`` of ``(m, h, I)``, ``(..., k, 6, 6)``."""
    hx = skew(h)
    eye = torch.eye(3, dtype=h.dtype, device=h.device)
    top = torch.cat([m[..., None, None] * eye, -hx], -1)
    bottom = torch.cat([hx, I.expand_as(hx)], -1)
    return torch.cat([top, bottom], -2)


def aba_core(
    model: RobotModel,
    topo: Topology,
    kin: Kinematics,
    v: torch.Tensor,
    tau: torch.Tensor,
    g: torch.Tensor,
    fext_w: torch.Tensor | None = None,
) -> torch.Tensor:
    """ABA on precomputed kinematics; models without mimic joints only.

    ``tau`` already holds every joint force (damping and friction included).
    Armature enters the articulated inertia of each joint, ``D = S^T IA S + armature``.
    """
    fb = model.floating_base
    o = topo.o
    S = kin.S
    R0, p0 = kin.R[..., 0, :, :], kin.p[..., 0, :]
    vj = v[..., 6:] if fb else v
    tj = tau[..., 6:] if fb else tau
    J = S * joint_rates(topo, vj)[..., None]
    Jall = torch.cat([base_motion_to_world(R0, p0, v[..., :6])[..., None, :], J], -2) if fb else J
    V = down(topo.sums, Jall)
    Vm = V[..., 1:, :] if fb else V
    c = cross_motion(Vm, J)  # velocity-product acceleration of each joint
    pA = cross_force(V, apply_inertia(kin.m, kin.h, kin.I, V))
    if fext_w is not None:
        pA = pA - fext_w
    if fb:
        # The base's applied wrench acts on body 0 like an external one.
        f0 = base_force_to_world(R0, p0, tau[..., :6])
        pA = torch.cat([pA[..., :1, :] - f0[..., None, :], pA[..., 1:, :]], -2)
    IA = spatial_inertia_matrix(kin.m.expand(kin.h.shape[:-1]), kin.h, kin.I)

    levels = model.levels
    nlev = len(levels)
    # Per-level views; index within the active arrays is body - o, within the
    # moving arrays body - 1.
    IA_l = [IA.index_select(-3, lv - o) if (d > 0 or fb) else None for d, lv in enumerate(levels)]
    pA_l = [pA.index_select(-2, lv - o) if (d > 0 or fb) else None for d, lv in enumerate(levels)]
    saved = [None] * nlev
    arm = model.armature
    for d in range(nlev - 1, 0, -1):
        lv = levels[d] - 1
        Sd, cd = S.index_select(-2, lv), c.index_select(-2, lv)
        IAd, pAd = IA_l[d], pA_l[d]
        U = (IAd @ Sd[..., None])[..., 0]
        Dd = (Sd * U).sum(-1) + arm[lv]
        u = tj.index_select(-1, lv) - (Sd * pAd).sum(-1)
        Uo = U / Dd[..., None]
        Ia = IAd - Uo[..., :, None] * U[..., None, :]
        pa = pAd + (Ia @ cd[..., None])[..., 0] + Uo * u[..., None]
        saved[d] = (Sd, cd, U, Dd, u)
        if d > 1 or fb:
            par = model.level_parent[d]
            IA_l[d - 1] = IA_l[d - 1].index_add(-3, par, Ia)
            pA_l[d - 1] = pA_l[d - 1].index_add(-2, par, pa)

    # Accelerations are offset by gravity's: a_hat = a - [g; 0].
    a_grav = torch.cat([g, torch.zeros_like(g)], -1)
    if fb:
        L = torch.linalg.cholesky(IA_l[0][..., 0, :, :])
        a_hat = -torch.cholesky_solve(pA_l[0][..., 0, :, None], L)[..., 0]
        a_base = world_motion_to_base(R0, p0, a_hat + a_grav)
        prev = a_hat[..., None, :]
    else:
        prev = -a_grav[..., None, :]
    qdd = []
    for d in range(1, nlev):
        Sd, cd, U, Dd, u = saved[d]
        ap = prev.index_select(-2, model.level_parent[d]) + cd
        qd = (u - (U * ap).sum(-1)) / Dd
        prev = ap + Sd * qd[..., None]
        qdd.append(qd)
    if qdd:
        qdd = torch.cat(qdd, -1).index_select(-1, topo.level_inv)
    else:
        qdd = tau.new_zeros(*tau.shape[:-1], 0)
    if fb:
        return torch.cat([a_base.expand(*qdd.shape[:-1], 6), qdd], -1)
    return qdd

"""Shared machinery of the reference path of the dynamics: the tree's
constants and the world-frame spatial quantities of every body, batch-first.

Every spatial vector here is expressed in the world frame at the world origin,
``[linear; angular]``. Working in one frame removes the parent-to-child
transforms from the recursions: a body's velocity is the sum of its
ancestors' joint velocities, and the force its joint transmits is the sum of
its subtree's forces (``_schedule.down`` and ``up`` over ``Topology.sums``,
one product with the ancestor matrix). The world poses come from the
reference forward kinematics (``body_transforms_reference``).

"Active" bodies are those that move: all bodies with a floating base, bodies
``1..nb-1`` with a fixed base (the root link is welded to the world and, as in
Pinocchio, takes no part in energies, centre of mass or forces).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._shapes import broadcast_shapes
from .._errors import InputError
from ..kinematics._fk import body_transforms_reference, coupling_matrix
from ..kinematics._paths import transforms_active
from ..kinematics._schedule import TreeSums, tree_schedule, tree_sums
from ..model import RobotModel, geometry_constants

__all__ = [
    "Topology",
    "Kinematics",
    "topology",
    "kinematics",
    "base_motion_to_world",
    "base_force_from_world",
    "base_force_to_world",
    "world_motion_to_base",
    "joint_rates",
    "couple_forces",
    "gravity_vector",
    "broadcast_batch",
    "check_f_ext",
    "f_ext_to_world",
]


class Topology(NamedTuple):
    """Constant tensors that depend only on the tree (cached per model layout).

    Attributes:
        o: index of the first active body (0 with a floating base, else 1).
        na: number of active bodies; ``nm = nb - 1`` moving (jointed) bodies.
        sums: the tree sums over the active bodies, body order
            (:func:`~backdrive.kinematics._schedule.down`, ``up``).
        upper: ``(nm, nm)`` with ``upper[j, i] = 1`` when moving body ``j`` is
            ``i`` or an ancestor of ``i``; ``strict`` the same without ``i``.
        is_pri, is_rev: ``(nm, 1)`` joint kind of each moving body, as floats.
        coord: ``(nm,)`` joint coordinate of each moving body.
        mult: ``(nm,)`` mimic multiplier.
        coupled: whether any body is not driven one-to-one by its own
            coordinate (mimic joints); then ``G`` ``(nm, nj)`` maps coordinate
            rates to body rates.
        level_inv: ``(nm,)`` long, position of each moving body in the
            concatenation of levels ``1..``.
        has_pri: whether any joint is prismatic (else the masks are skipped).
    """

    o: int
    na: int
    nm: int
    sums: TreeSums
    upper: torch.Tensor
    strict: torch.Tensor
    is_pri: torch.Tensor
    is_rev: torch.Tensor
    coord: torch.Tensor
    mult: torch.Tensor
    coupled: bool
    G: torch.Tensor
    level_inv: torch.Tensor
    has_pri: bool


def topology(model: RobotModel) -> Topology:
    """The :class:`Topology` of ``model``, built once per layout, dtype and
    device (see :func:`~backdrive.model.geometry_constants`), so models made by
    ``replace`` share one entry."""
    return geometry_constants(model, "dynamics.topology", _build_topology)


def _build_topology(model: RobotModel) -> Topology:
    nm = model.num_bodies - 1
    dtype, device = model.dtype, model.device
    o = 0 if model.floating_base else 1
    anc = tree_schedule(model).anc
    upper = anc[1:, 1:].T.contiguous()  # upper[j, i] = 1 when j is i or an ancestor of i
    strict = upper - torch.eye(nm, dtype=dtype, device=device)
    is_pri = model.joint_is_prismatic[1:, None].clone()
    coord_list = model.joint_coordinate[1:].tolist()
    mult_list = model.joint_multiplier[1:].tolist()
    coupled = coord_list != list(range(nm)) or any(m != 1.0 for m in mult_list)
    G = coupling_matrix(model)
    return Topology(
        o=o,
        na=model.num_bodies - o,
        nm=nm,
        sums=tree_sums(model, o, level_order=False),
        upper=upper,
        strict=strict,
        is_pri=is_pri,
        is_rev=1.0 - is_pri,
        coord=model.joint_coordinate[1:].clone(),
        mult=model.joint_multiplier[1:].clone(),
        coupled=coupled,
        G=G,
        # Level 0 is the root alone, so levels 1.. start at position 1.
        level_inv=model.level_inverse[1:] - 1,
        has_pri=bool(model.joint_is_prismatic[1:].any()),
    )


# ---------------------------------------------------------------------- spatial algebra


def base_motion_to_world(R0: torch.Tensor, p0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A base-frame motion vector (at the base origin) in the world frame at the origin.

    ``[R v + p x (R w); R w]``.
    """
    w = (R0 @ x[..., 3:, None])[..., 0]
    lin = (R0 @ x[..., :3, None])[..., 0] + torch.linalg.cross(p0, w)
    return torch.cat([lin, w], -1)


def base_force_to_world(R0: torch.Tensor, p0: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """A base-frame wrench at the base origin in the world frame at the origin.

    ``[R f; R n + p x (R f)]``.
    """
    fl = (R0 @ f[..., :3, None])[..., 0]
    fa = (R0 @ f[..., 3:, None])[..., 0] + torch.linalg.cross(p0, fl)
    return torch.cat([fl, fa], -1)


def world_motion_to_base(R0: torch.Tensor, p0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`base_motion_to_world`: ``[R^T (v + w x p); R^T w]``."""
    Rt = R0.transpose(-1, -2)
    lin = x[..., :3] + torch.linalg.cross(x[..., 3:], p0)
    return torch.cat([(Rt @ lin[..., None])[..., 0], (Rt @ x[..., 3:, None])[..., 0]], -1)


def base_force_from_world(R0: torch.Tensor, p0: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """A world wrench (at the origin) as a base-frame wrench at the base origin.

    ``[R^T f; R^T (n - p x f)]`` (the transpose of :func:`base_motion_to_world`).
    """
    Rt = R0.transpose(-1, -2)
    n = f[..., 3:] - torch.linalg.cross(p0, f[..., :3])
    return torch.cat([(Rt @ f[..., :3, None])[..., 0], (Rt @ n[..., None])[..., 0]], -1)


# ---------------------------------------------------------------------- coordinates


def joint_rates(topo: Topology, vj: torch.Tensor) -> torch.Tensor:
    """Rates of every moving body's joint from the joint coordinates' rates.

    ``(..., nj) -> (..., nm)``: ``multiplier * vj[coordinate]`` (mimic joints
    move at ``multiplier`` times their leader's rate; the offset is constant).
    """
    if not topo.coupled:
        return vj
    return vj.index_select(-1, topo.coord) * topo.mult


def couple_forces(topo: Topology, tau_b: torch.Tensor, nj: int) -> torch.Tensor:
    """Generalised forces of the joint coordinates from the bodies' joint forces.

    The transpose of :func:`joint_rates`: ``tau[c] = sum multiplier[b] tau_b[b]``
    over the bodies ``b`` driven by coordinate ``c``.
    """
    if not topo.coupled:
        return tau_b
    out = tau_b.new_zeros(*tau_b.shape[:-1], nj)
    return out.index_add(-1, topo.coord, tau_b * topo.mult)


# ---------------------------------------------------------------------- kinematics


class Kinematics(NamedTuple):
    """World-frame quantities at one configuration (active bodies unless noted).

    Attributes:
        R, p: ``(..., nb, 3, 3)``, ``(..., nb, 3)`` world-from-body poses, all bodies.
        S: ``(..., nm, 6)`` motion subspace of each moving body's joint.
        m: ``(na,)`` masses; h: ``(..., na, 3)`` first moments ``m c``;
        I: ``(..., na, 3, 3)`` rotational inertias about the world origin.
        c: ``(..., na, 3)`` centres of mass in the world.
        M: ``(..., nv, nv)`` the mass matrix where :func:`kinematics` was
            asked for it and formed it in its node (``crba_core`` returns
            it), else ``None``; bias: ``(..., nv)`` the bias forces likewise.
    """

    R: torch.Tensor
    p: torch.Tensor
    S: torch.Tensor
    m: torch.Tensor
    h: torch.Tensor
    I: torch.Tensor
    c: torch.Tensor
    M: torch.Tensor | None = None
    bias: torch.Tensor | None = None


def kinematics(
    model: RobotModel,
    topo: Topology,
    q: torch.Tensor,
    *,
    inertia: bool = True,
    mass: bool = False,
    bias: tuple | None = None,
) -> Kinematics:
    """Body poses, joint motion subspaces and world inertias at ``q``.

    Where autograd records ``q`` (and the model's masses and inertias need
    no gradient), one node with its backward written out
    (:class:`_KinematicsVJP`) instead of the hundred-odd nodes of the
    formulas: at batch 1 each node costs microseconds whatever its size.
    ``mass``: there, the mass matrix (CRBA) is formed in the same node
    (``Kinematics.M``, which ``crba_core`` then returns), unless mimic
    joints couple the coordinates or the armature needs a gradient;
    ``bias = (v, g)`` (with ``mass``; ``v`` of ``q``'s batch shape, ``g``
    ``(3,)`` needing no gradient) also the bias forces ``C(q, v) v + g(q)``
    (RNEA, ``Kinematics.bias``).
    """
    if (
        inertia
        and q.requires_grad
        and torch.is_grad_enabled()
        and not (model.body_mass.requires_grad or model.body_com.requires_grad or model.body_inertia.requires_grad)
        and not transforms_active()
    ):
        mass = mass and topo.nm > 0 and not topo.coupled and not model.armature.requires_grad
        v = g = None
        if mass and bias is not None:
            v, g = bias
            if v.shape[:-1] != q.shape[:-1] or g.ndim != 1 or g.requires_grad:
                v = g = None
        out = _KinematicsVJP.apply(model, topo, q, mass, v, g)
        return Kinematics(
            *out[:3], model.body_mass[topo.o :], *out[3:6], out[6] if mass else None, out[7] if v is not None else None
        )
    return _kinematics(model, topo, q, inertia)[0]


def _kinematics(model: RobotModel, topo: Topology, q: torch.Tensor, inertia: bool = True):
    """:func:`kinematics` by plain operations: ``(Kinematics, Ic)`` with ``Ic``
    the rotational inertias about the centres of mass, world axes."""
    R, p = body_transforms_reference(model, q)
    o = topo.o
    axis_w = (R[..., 1:, :, :] @ model.joint_axis[1:, :, None])[..., 0]
    p_m = p[..., 1:, :]
    # A revolute joint moves the world-origin point at p x a; a prismatic one at a.
    if topo.has_pri:
        s_lin = topo.is_pri * axis_w + topo.is_rev * torch.linalg.cross(p_m, axis_w)
        S = torch.cat([s_lin, topo.is_rev * axis_w], -1)
    else:
        S = torch.cat([torch.linalg.cross(p_m, axis_w), axis_w], -1)
    Ra, pa = R[..., o:, :, :], p[..., o:, :]
    m = model.body_mass[o:]
    c = (Ra @ model.body_com[o:, :, None])[..., 0] + pa
    if not inertia:
        return Kinematics(R, p, S, m, m[:, None] * c, None, c), None
    h = m[:, None] * c
    Ic = Ra @ model.body_inertia[o:] @ Ra.transpose(-1, -2)
    # Parallel axis: I_origin = I_com + m (|c|^2 1 - c c^T).
    cc = c[..., :, None] * h[..., None, :]
    trace = (c * h).sum(-1)[..., None, None]
    eye = torch.eye(3, dtype=q.dtype, device=q.device)
    I = Ic + trace * eye - cc
    return Kinematics(R, p, S, m, h, I, c), Ic


_VEE: dict = {}


def _vee_matrix(dtype, device) -> torch.Tensor:
    """``(9, 3)``: a flattened 3x3 ``A`` times it is ``(A21 - A12, A02 - A20,
    A10 - A01)``, so that ``<A, [t]x> = t . vee`` (built once per dtype and device)."""
    key = (dtype, str(device))
    V = _VEE.get(key)
    if V is None:
        with torch.inference_mode(False), torch.no_grad():
            V = torch.zeros(9, 3, dtype=dtype, device=device)
            for k, (i, j) in enumerate(((7, 5), (2, 6), (3, 1))):
                V[i, k], V[j, k] = 1.0, -1.0
        _VEE[key] = V
    return V


class _KinematicsVJP(torch.autograd.Function):
    """:func:`kinematics` (``R, p, S, h, I, c``) with the backward written out.

    Turning joint ``j`` by ``dq`` turns its whole subtree about the line
    through ``p_j`` along the world axis ``a_j`` (translates it along ``a_j``
    for a prismatic joint): every output ``x`` of a body in the subtree
    changes by the motion ``S_j dq`` (world frame, world origin). So the
    gradient of joint ``j`` is ``S_j . W_j``, with ``W_j`` the subtree sum of
    each body's *wrench* ``w_b`` (force; torque about the origin): the
    gradient of a world point (``p``, ``c``) is a force at that point, that
    of a rotation (``R``, the rotated inertia ``Ic = R I0 R^T``) the torque
    ``vee(G R^T)``, ``vee(G Ic - Ic G)``, that of a motion vector fixed to
    the body (``S``) its force cross product ``S x* g``, and ``I``'s parallel
    axis term a force at the centre of mass ``m (2 tr(G) c - (G + G^T) c)``.
    A floating base gets the root's sum: the force as the position's
    gradient and the torque about ``p0``, ``g_t``, through the quaternion's
    ``omega = 2 (w du - dw u + u x du) / |q|^2`` (world frame). Mimic joints
    through the coupling's transpose. One product with the ancestor matrix
    and about forty small operations instead of autograd's backward through
    the pointer-jumping products, the quaternion and the inertias (about 180
    operations at batch 1). Under ``create_graph`` the backward
    differentiates the plain formulas."""

    @staticmethod
    def forward(ctx, model, topo, q, mass, v, g):
        from ._crba import crba_core
        from ._rnea import rnea_core

        kin, Ic = _kinematics(model, topo, q)
        ctx.model, ctx.topo, ctx.mass, ctx.bias, ctx.g = model, topo, mass, v is not None, g
        out = (kin.R, kin.p, kin.S, kin.h, kin.I, kin.c)
        saved = [q, kin.R, kin.p, kin.S, kin.c, Ic]
        if mass:
            keep = {}
            out += (crba_core(model, topo, kin, keep=keep),)
            saved += [kin.h, kin.I, keep["B"]]
        if v is not None:
            keep = {}
            out += (rnea_core(model, topo, kin, v, None, g, keep=keep),)
            saved += [v] + [keep[k] for k in ("V", "A", "J", "IV", "F")]
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, *grads):
        gR, gp, gS, gh, gI, gc = grads[:6]
        gM = grads[6] if ctx.mass else None
        gb = grads[7] if ctx.bias else None
        saved = ctx.saved_tensors
        q, R, p, S, c, Ic = saved[:6]
        model, topo = ctx.model, ctx.topo
        if torch.is_grad_enabled():  # create_graph: plain autograd, differentiable again
            from ._crba import crba_core
            from ._rnea import rnea_core

            with torch.enable_grad():
                qd = q if q.requires_grad else q.detach().requires_grad_(True)
                ins = [qd]
                kin = _kinematics(model, topo, qd)[0]
                xs = [kin.R, kin.p, kin.S, kin.h, kin.I, kin.c]
                if ctx.mass:
                    xs.append(crba_core(model, topo, kin))
                if ctx.bias:
                    v = saved[9]
                    vd = v if v.requires_grad else v.detach().requires_grad_(True)
                    ins.append(vd)
                    xs.append(rnea_core(model, topo, kin, vd, None, ctx.g))
                outs = [x for x, gx in zip(xs, grads) if gx is not None]
                gs = torch.autograd.grad(outs, ins, [gx for gx in grads if gx is not None], create_graph=True, allow_unused=True)
            return None, None, gs[0], None, gs[1] if ctx.bias else None, None
        motion, gv = S, None
        if gM is not None or gb is not None:
            # The mass matrix and the bias forces (:func:`_dynamics_grads`):
            # gradients of the motion vectors and the inertias, then as below.
            gh, gI, gS, motion, gv = _dynamics_grads(model, topo, saved, gM, gb, gh, gI, gS, ctx.mass)
        o, nb = topo.o, R.shape[-3]
        batch = R.shape[:-3]
        zeros = lambda k: R.new_zeros(*batch, k, 3)  # noqa: E731
        m = model.body_mass[o:, None]
        # Three groups of wrenches (forces F, torques N about the origin),
        # summed over subtrees by one product with the constant
        # [anc^T, anc^T[:, o:], anc^T[:, 1:]]: every body's (from R, p), the
        # active bodies' (from I, h, c), the moving bodies' (from S).
        # vee(G R^T) = sum_l R[:, l] x G[:, l].
        F = gp if gp is not None else zeros(nb)
        N = torch.linalg.cross(p, gp) if gp is not None else zeros(nb)
        if gR is not None:
            N = N + torch.linalg.cross(R, gR, dim=-2).sum(-1)
        # The centres of mass: a force at c (h = m c; I's parallel axis term).
        gct = gc if gc is not None else zeros(nb - o)
        if gh is not None:
            gct = torch.addcmul(gct, m, gh)
        Na = None
        if gI is not None:
            Gs = gI + gI.transpose(-1, -2)
            tr = gI.diagonal(dim1=-2, dim2=-1).sum(-1, keepdim=True)
            gct = gct + m * (2.0 * tr * c - (Gs * c[..., None, :]).sum(-1))
            # vee(G Ic - Ic G) = sum_l Ic[:, l] x (G + G^T)[:, l] (Ic symmetric).
            Na = torch.linalg.cross(Ic, Gs, dim=-2).sum(-1)
        Nc = torch.linalg.cross(c, gct)
        Na = Nc if Na is None else Na + Nc
        # The motion subspaces (and the base's columns): the force cross product S x* g.
        if gS is not None and motion.shape[-2]:
            sl, sa = motion[..., :3], motion[..., 3:]
            gl, ga = gS[..., :3], gS[..., 3:]
            Fs = torch.linalg.cross(sa, gl)
            Ns = torch.linalg.cross(sa, ga) + torch.linalg.cross(sl, gl)
        else:
            Fs = Ns = zeros(motion.shape[-2])
        X = torch.cat([torch.cat([F, gct, Fs], -2), torch.cat([N, Na, Ns], -2)], -1)
        W = torch.matmul(_subtree_groups(model, o, motion is not S), X)
        parts = []
        if model.floating_base:
            F0, N0 = W[..., 0, :3], W[..., 0, 3:]
            gt = N0 - torch.linalg.cross(p[..., 0, :], F0)
            quat = q[..., 3:7]
            w, u = quat[..., :1], quat[..., 1:]
            s = 2.0 / (quat * quat).sum(-1, keepdim=True)
            gw = (u * gt).sum(-1, keepdim=True) * -s
            gu = torch.addcmul(torch.linalg.cross(gt, u), w, gt) * s
            parts += [F0, gw, gu]
        if nb > 1:
            gth = (S * W[..., 1:, :]).sum(-1)
            parts.append(couple_forces(topo, gth, model.num_joints))
        g = torch.cat(parts, -1) if len(parts) > 1 else parts[0]
        return None, None, g.sum_to_size(q.shape), None, gv, None


def _dynamics_grads(model, topo, saved, gM, gb, gh, gI, gS, mass):
    """The mass matrix's and the bias forces' part of :class:`_KinematicsVJP`'s
    backward: ``gh``, ``gI`` and the motion vectors' gradients with theirs
    added, the motion vectors (``cat([B, S])`` with a floating base) and the
    gradient of ``v``.

    Mass matrix: ``<G, M> = sum_b <J_b G J_b^T, I6_b> + const`` with ``J_b``
    ``(6, nv)`` body ``b``'s columns (the motion vectors of its ancestors'
    joints and, with a floating base, the base's six) and ``I6_b`` its
    spatial inertia at the origin: ``I6_b`` gets ``J_b sym(G) J_b^T``, the
    columns ``sum_b I6_b J_b (G + G^T)``.

    Bias forces (world-frame RNEA, ``rnea_core``): ``V = down(J v)``, ``A =
    down(V x J) + A_g``, ``f = I6 A + V x* I6 V``, ``F = up(f)``, ``h_k =
    S_k . F_k``, reversed: ``lambda = down(g_h S)`` is ``g_f``; ``g_A = I6
    lambda``, ``g_V = -(lambda x* I6 V) - I6 (V x lambda)``, ``g_I6 = lambda
    A^T - (V x lambda) V^T``; then ``up`` for the sums, ``J x* g`` and ``-V
    x* g`` for the products ``V x J``, and ``J = S qd``.
    """
    from ..kinematics._kernels import cross_force, cross_motion

    o, fb = topo.o, model.floating_base
    const = _mass_constants(model, o)
    S, h, I, B = saved[3], saved[6], saved[7], saved[8]
    rows = S if B is None else torch.cat([B, S], -2)  # (..., nv, 6) every column's motion vector
    m = model.body_mass[o:, None].expand(h.shape[:-1] + (1,))
    I6 = (torch.cat([m, h, I.flatten(-2)], -1) @ const["to6"]).unflatten(-1, (6, 6))
    g_rows, gI6, gv = gS if B is None or gS is None else torch.cat([torch.zeros_like(B), gS], -2), None, None
    if gM is not None:
        Jr = rows[..., None, :, :] * const["mask"]  # (..., na, nv, 6): J_b^T
        Psi = (gM + gM.transpose(-1, -2))[..., None, :, :] @ Jr  # (G + G^T) J_b^T
        gr = (Psi @ I6 * const["mask"]).sum(-3)
        g_rows = gr if g_rows is None else g_rows + gr
        gI6 = 0.5 * (Jr.transpose(-1, -2) @ Psi)
    if gb is not None:
        v, V, A, J, IV, F = saved[9:15]
        anc = topo.sums.anc
        lam = anc @ (const["scatter"] @ (rows * gb[..., None]))  # g_f, (..., na, 6)
        Vxl = cross_motion(V, lam)
        IZ = I6 @ torch.stack([lam, Vxl], -1)
        gA, IVxl = IZ.unbind(-1)
        gV = -(cross_force(lam, IV) + IVxl)
        gi = torch.stack([lam, -Vxl], -1) @ torch.stack([A, V], -2)
        gI6 = gi if gI6 is None else gI6 + gi
        gJd = anc.T @ gA
        Vm = V[..., 1:, :] if fb else V
        if fb:
            gJd = gJd[..., 1:, :]
            gV[..., 1:, :] += cross_force(J, gJd)
        else:
            gV = gV + cross_force(J, gJd)
        gJall = anc.T @ gV
        gJ = (gJall[..., 1:, :] if fb else gJall) - cross_force(Vm, gJd)
        qd = v[..., 6:] if fb else v
        gqd = (S * gJ).sum(-1)
        gr = gb[..., None] * (const["scatter"].T @ F)  # h_k = S_k . F_k
        if fb:
            gV0 = gJall[..., 0, :]
            gr = gr + torch.cat([v[..., :6, None] * gV0[..., None, :], qd[..., None] * gJ], -2)
            gv = torch.cat([(B * gV0[..., None, :]).sum(-1), gqd], -1)
        else:
            gr = gr + qd[..., None] * gJ
            gv = gqd
        g_rows = gr if g_rows is None else g_rows + gr
    _, gh_m, gI_m = (gI6.flatten(-2) @ const["from6"]).split_with_sizes([1, 3, 9], -1)  # m, h, I
    gh = gh_m if gh is None else gh + gh_m
    gI_m = gI_m.unflatten(-1, (3, 3))
    gI = gI_m if gI is None else gI + gI_m
    return gh, gI, g_rows, rows, gv


def _mass_constants(model: RobotModel, o: int) -> dict:
    """Constants of :func:`_dynamics_grads`: ``mask (na, nv, 1)``, 1 where
    column ``j`` moves active body ``b``; ``to6 (13, 36)`` the spatial
    inertia ``[[m 1, -[h]x], [[h]x, I]]`` (flattened) from ``[m, h, I]``,
    ``from6`` its transpose; ``scatter (na, nv)``, 1 where column ``j``
    belongs to active body ``b`` (the base's six to body 0)."""

    def build(m):
        anc = tree_schedule(m).anc
        cols = ([0] * 6 if m.floating_base else []) + list(range(1, m.num_bodies))
        mask = anc[o:][:, cols][..., None].contiguous()
        # Filled entry by entry on the CPU, then moved once: on a GPU each
        # entry written there would be a host-to-device copy of its own.
        T = torch.zeros(13, 6, 6, dtype=m.dtype, device="cpu")
        for i in range(3):
            T[0, i, i] = 1.0
            for j in range(3):
                T[4 + 3 * i + j, 3 + i, 3 + j] = 1.0
        # [h]x = [[0, -h2, h1], [h2, 0, -h0], [-h1, h0, 0]] in the lower left, minus it in the upper right.
        for k, (i, j, sg) in enumerate(((2, 1, 1.0), (1, 2, -1.0), (0, 2, 1.0), (2, 0, -1.0), (1, 0, 1.0), (0, 1, -1.0))):
            comp = (0, 0, 1, 1, 2, 2)[k]
            T[1 + comp, 3 + i, j] = sg
            T[1 + comp, j, 3 + i] = sg
        to6 = T.reshape(13, 36).contiguous().to(m.device)
        scatter = torch.zeros(m.num_bodies - o, len(cols), dtype=m.dtype, device="cpu")
        for k, b in enumerate(cols):
            scatter[b - o, k] = 1.0
        scatter = scatter.to(m.device)
        return {"mask": mask, "to6": to6, "from6": to6.T.contiguous(), "scatter": scatter}

    return geometry_constants(model, f"dynamics.mass_constants.{o}", build)


def _subtree_groups(model: RobotModel, o: int, base: bool = False) -> torch.Tensor:
    """``[anc^T, anc^T[:, o:], anc^T[:, rows]]`` with ``anc`` the ancestor
    matrix (body order) and ``rows`` the moving bodies ``1..`` (``base``:
    after the floating base's six columns, of body 0): its product with
    values of every body, the active bodies ``o..`` and the motion vectors
    stacked along the body axis sums each over every body's subtree."""

    def build(m):
        At = tree_schedule(m).anc.T
        rows = ([0] * 6 if base else []) + list(range(1, m.num_bodies))
        return torch.cat([At, At[:, o:], At[:, rows]], 1).contiguous()

    return geometry_constants(model, f"dynamics.subtree_groups.{o}.{int(base)}", build)


# ---------------------------------------------------------------------- inputs


def broadcast_batch(model: RobotModel, q: torch.Tensor, *others: tuple) -> tuple[torch.Size, list]:
    """Check ``q`` and each ``(tensor, size, name)`` and broadcast their batch axes.

    Returns the common batch shape and the tensors expanded to it (``q`` first).
    A ``(3,)`` gravity (the usual case) is returned as is.
    """
    model.check_q(q)
    shapes = [q.shape[:-1]]
    for x, n, name in others:
        model.check_vector(x, n, name)
        shapes.append(x.shape[:-1])
    try:
        batch = broadcast_shapes(*shapes)
    except RuntimeError:
        names = ["q"] + [name for _, _, name in others]
        raise InputError(
            "batch shapes do not broadcast: "
            + ", ".join(f"{n} {tuple(s)}" for n, s in zip(names, shapes))
        ) from None
    out = [q.expand(*batch, q.shape[-1])]
    out += [x if name == "gravity" and x.ndim == 1 else x.expand(*batch, x.shape[-1]) for x, _, name in others]
    return batch, out


def gravity_vector(model: RobotModel, gravity) -> torch.Tensor:
    """The gravity to use, ``(..., 3)``: the model's, or ``gravity`` checked."""
    if gravity is None:
        return model.gravity
    if not isinstance(gravity, torch.Tensor):
        gravity = torch.as_tensor(gravity, dtype=model.dtype, device=model.device)
    model.check_vector(gravity, 3, "gravity")
    return gravity


def check_f_ext(model: RobotModel, f_ext) -> None:
    if f_ext is None:
        return
    if not isinstance(f_ext, torch.Tensor):
        raise InputError(f"f_ext must be a torch.Tensor, got {type(f_ext).__name__}")
    nb = model.num_bodies
    if f_ext.ndim < 2 or tuple(f_ext.shape[-2:]) != (nb, 6):
        raise InputError(
            f"f_ext must have shape (..., {nb}, 6) (one [force; torque] per body of robot "
            f"{model.name!r}), got {tuple(f_ext.shape)}"
        )
    model.check_vector(f_ext, 6, "f_ext")


def f_ext_to_world(topo: Topology, kin: Kinematics, f_ext: torch.Tensor) -> torch.Tensor:
    """Body-frame wrenches at body origins -> world wrenches at the origin (active bodies)."""
    o = topo.o
    R, p = kin.R[..., o:, :, :], kin.p[..., o:, :]
    f = f_ext[..., o:, :]
    fl = (R @ f[..., :3, None])[..., 0]
    return torch.cat([fl, (R @ f[..., 3:, None])[..., 0] + torch.linalg.cross(p.expand_as(fl), fl)], -1)

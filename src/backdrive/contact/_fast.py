"""The implicit contact step on the dynamics' fast path: batch last, no autograd.

:meth:`ContactModel.acceleration` (``scheme="implicit"``) takes this path
when nothing records the operations (no gradient), the robot has moving
joints and no mimic joints, there are no self-collision pairs, and the batch
is large enough (``kinematics._paths.choose("contact_step", ...)``; the
``use_path`` switch forces either path). It computes the same step as the
reference path of ``_model.py``, which the tests hold it against, with four
differences in how, none in what:

* one forward-kinematics pass (``dynamics._fast.kinematics_fast``) serves the
  contact points, their Jacobians, the bias forces (RNEA) and the mass
  matrix (CRBA); the reference path runs forward kinematics three times;
* a contact point's Jacobian is read off the dynamics' joint motion
  subspaces: the column of joint ``j`` at world point ``c`` is
  ``S_l,j + S_a,j x c`` (``S`` at the world origin), the floating base's
  ``[R0, -[c - p0]x R0]``; only the columns of the point body's ancestors
  are formed (``(3, np, ns, N)`` with ``ns`` the longest support);
* ``J^T (C + dt K) J`` is added to the tree-sparse packed entries of ``M``
  (a ground contact on body ``b`` couples only ``b``'s ancestor
  coordinates, so the step's matrix keeps the sparsity of ``M``) and
  factorised by the same LTDL as forward dynamics (Featherstone, *Rigid Body
  Dynamics Algorithms*, section 6.5) instead of a dense Cholesky;
* the contact's effective mass ``diag(J M^-1 J^T)`` (the friction blend's
  ``v*``) is ``sum_k Z_k^2 / D_k`` with ``Z = L^-T J^T``, one triangular
  sweep over the LTDL factor of ``M``.

The force law itself is :func:`~backdrive.contact._law.contact_law`, the one
implementation both paths call.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..dynamics._fast import (
    LTDLFactor,
    _from_internal,
    _sparsity,
    _to_internal,
    crba_entries_fast,
    fast_topology,
    kinematics_fast,
    rnea_fast,
)
from ..dynamics import joint_forces
from ..dynamics._tree import broadcast_batch, gravity_vector
from ..kinematics._kernels import cross, rot, rot_t
from ..kinematics._schedule import tree_schedule
from ..model import RobotModel

__all__ = ["fast_eligible", "implicit_acceleration_fast"]


class _Plan(NamedTuple):
    """Index constants of one contact model on one robot (built once)."""

    body_pos: torch.Tensor  # (np,) level position of each point's body
    local: torch.Tensor  # (3, np, 1) point centres in their body frames
    joints: torch.Tensor  # (np * nsj,) moving-body index (level order) of each joint column
    jmask: torch.Tensor | None  # (nsj, 1, np, 1): 0 for padding columns
    sup_flat: torch.Tensor  # (ns * np,) internal coordinate of each column (nv: padding), column-major
    pa: torch.Tensor  # (ne,) column pairs (a >= b) of a point's local block
    pb: torch.Tensor
    tgt: torch.Tensor  # (ne * np,) packed entry of M of each pair, pair-major
    pmask: torch.Tensor | None  # (ne, np, 1): 0 for pairs with a padding column
    ns: int
    inv_order: torch.Tensor  # (nb,) level position of each body
    chain_tgt: torch.Tensor  # packed entries (sup[a], sup[b]) for b < a, a-major then b, then the point
    chain_start: tuple  # where column a's block starts in chain_tgt
    dense_index: torch.Tensor  # (ns 3 np,) rows of the dense (nv + 1, 3, np) Jacobian of Jc's entries


def _build_plan(robot: RobotModel, point_body: torch.Tensor) -> _Plan:
    device = robot.device
    sched = tree_schedule(robot)
    order = list(sched.order)
    pos = {b: k for k, b in enumerate(order)}
    parent = list(sched.parent_pos)
    sp = _sparsity(robot)
    entry = {tuple(rc): k for k, rc in enumerate(sp.entry_rc.tolist())}
    off = 6 if robot.floating_base else 0
    nv = robot.nv
    chains = []
    for b in point_body.tolist():
        chain, x = [], pos[b]
        while x > 0:  # level position 0 is the root (the base or the fixed world body)
            chain.append(x - 1)  # moving-body index of the fast path
            x = parent[x]
        chains.append(chain[::-1])
    nsj = max((len(c) for c in chains), default=0)
    ns = off + nsj
    joints, jmask, sup = [], [], []
    for c in chains:
        pad = nsj - len(c)
        joints.append(c + [0] * pad)
        jmask.append([1.0] * len(c) + [0.0] * pad)
        sup.append(list(range(off)) + [off + m for m in c] + [nv] * pad)
    npnt = len(chains)
    pa, pb = [], []
    for a in range(ns):
        for b in range(a + 1):
            pa.append(a)
            pb.append(b)
    tgt, pmask = [], []
    for a, b in zip(pa, pb):
        for s in sup:
            if s[a] == nv or s[b] == nv:
                tgt.append(0)
                pmask.append(0.0)
            else:
                tgt.append(entry[(s[a], s[b])])
                pmask.append(1.0)
    dense = [sup[p][k] * 3 * npnt + i * npnt + p for k in range(ns) for i in range(3) for p in range(npnt)]
    chain_tgt, chain_start = [], [0] * ns
    for a in range(ns - 1, 0, -1):
        chain_start[a] = len(chain_tgt)
        for b in range(a):
            for s in sup:
                ok = s[a] != nv and s[b] != nv
                chain_tgt.append(entry[(s[a], s[b])] if ok else 0)
    t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    f = lambda x: torch.tensor(x, dtype=robot.dtype, device=device)  # noqa: E731
    padded = any(m == 0.0 for row in jmask for m in row)
    return _Plan(
        body_pos=t([pos[b] for b in point_body.tolist()]),
        local=None,  # filled by the caller (it depends on the geometry's dtype)
        joints=t([j for row in joints for j in row]),
        jmask=f(jmask).T[:, None, :, None].contiguous() if padded else None,
        sup_flat=t([sup[p][k] for k in range(ns) for p in range(npnt)]),
        chain_tgt=t(chain_tgt),
        chain_start=tuple(chain_start),
        dense_index=t(dense),
        pa=t(pa),
        pb=t(pb),
        tgt=t(tgt),
        pmask=f(pmask).view(-1, npnt)[:, :, None] if padded else None,
        ns=ns,
        inv_order=t([pos[b] for b in range(len(order))]),
    )


def plan(contact, robot: RobotModel) -> _Plan:
    """The cached :class:`_Plan` of ``contact`` (built on first use)."""
    p = getattr(contact, "_fast_plan", None)
    if p is None:
        g = contact.geometry
        p = _build_plan(robot, g.point_body)._replace(local=g.point_local.T[:, :, None].contiguous())
        contact._fast_plan = p
    return p


def fast_eligible(contact, robot: RobotModel) -> bool:
    """Whether the model allows this path (the caller checks autograd and the batch)."""
    sc = contact.self_collision
    return (
        robot.num_joints > 0
        and contact.geometry.num_points > 0
        and (sc is None or sc.num_pairs == 0)
        and not fast_topology(robot).coupled
    )


def _flat(t: torch.Tensor, batch: torch.Size, N: int) -> torch.Tensor:
    """A law parameter ``()``, ``(np,)``/``(1,)`` or ``(..., np)`` with batch axes -> broadcastable to ``(N, np)``."""
    if t.ndim <= 1:
        return t
    return t.expand(*batch, t.shape[-1]).reshape(N, t.shape[-1])


def implicit_acceleration_fast(contact, robot, q, v, tau, dt, gravity=None, extra_damping=None):
    """The implicit step's accelerations ``(..., nv)`` and the applied :class:`ContactResult`.

    Same arguments and results as :meth:`ContactModel.acceleration` with
    ``scheme="implicit"``; no autograd graph (call it under ``no_grad``).
    """
    from ._law import contact_law, per_point
    from ._model import ContactResult

    with torch.no_grad():
        g = gravity_vector(robot, gravity)
        batch, (q, v, tau, g) = broadcast_batch(robot, q, (v, robot.nv, "v"), (tau, robot.nv, "tau"), (g, 3, "gravity"))
        nv = robot.nv
        qf = q.reshape(-1, q.shape[-1])
        N = qf.shape[0]
        topo = fast_topology(robot)
        sp = _sparsity(robot)
        P = plan(contact, robot)
        geo = contact.geometry
        npnt = geo.num_points
        fb = robot.floating_base
        gt = g[:, None] if g.ndim == 1 else g.reshape(-1, 3).T
        K = kinematics_fast(robot, topo, qf)
        vt = _to_internal(topo, v.reshape(N, nv))
        # RNEA first: the CRBA below sums K's inertias over subtrees in place.
        rhs = _to_internal(topo, (tau + joint_forces(robot, v)).reshape(N, nv))
        rhs = rhs - rnea_fast(robot, topo, K, vt, None, gt)
        E = crba_entries_fast(robot, topo, sp, K)

        # Contact points, world frame: centres (3, np, N), then the terrain (batch first).
        Rp = K.R.index_select(2, P.body_pos)
        pp = K.p.index_select(1, P.body_pos)
        centre = rot(Rp, P.local).add_(pp)
        dist, n = contact.terrain.query(centre.permute(2, 1, 0))  # (N, np), (N, np, 3)
        radius = geo.point_radius
        phi = radius - dist
        point = centre.permute(2, 1, 0) - radius[:, None] * n  # (N, np, 3)
        pt = point.permute(2, 1, 0)  # (3, np, N)

        # The Jacobian columns of each point's supporting coordinates,
        # column-major (ns, 3, np, N): a column is one contiguous block.
        nsj = P.ns - (6 if fb else 0)
        Jc = pt.new_empty(P.ns, 3, npnt, N)
        if fb:
            R0 = K.R[:, :, 0]  # (3, 3, N)
            r = pt - K.p[:, 0:1]  # (3, np, N)
            Jc[:3].copy_(R0.transpose(0, 1)[:, :, None])  # column i: R0 e_i at every point
            Jc[3:6].copy_(cross(R0.transpose(0, 1)[:, :, None], r[None], dim=1))  # R0 e_i x r
        if nsj:
            Sl = K.Sl.index_select(1, P.joints).view(3, npnt, nsj, N).permute(2, 0, 1, 3)
            Sa = K.Sa.index_select(1, P.joints).view(3, npnt, nsj, N).permute(2, 0, 1, 3)
            Jj = torch.add(cross(Sa, pt[None], dim=1), Sl, out=Jc[P.ns - nsj :])
            if P.jmask is not None:
                Jj.mul_(P.jmask)

        def gather(x):  # (nv, N) internal -> (ns, 1, np, N) at each point's columns
            xs = torch.cat([x, x.new_zeros(1, N)], 0).index_select(0, P.sup_flat)
            return xs.view(P.ns, 1, npnt, N)

        v_c = (Jc * gather(vt)).sum(0).permute(2, 1, 0)  # (N, np, 3)
        v_n = (v_c * n).sum(-1)
        v_t = v_c - v_n[..., None] * n
        p = contact._p
        law = {
            k: _flat(per_point(p[k], geo.point_shape), batch, N)
            for k in ("stiffness", "damping", "friction", "normal_width", "stiction_width")
        }
        f_n, f_t, c_n, k_n, s = contact_law(phi, v_n, v_t, clamp_normal=p["clamp_normal"], dt=dt, **law)
        force0 = f_n[..., None] * n + f_t
        mu = torch.broadcast_to(law["friction"], phi.shape)
        fn_plus = torch.clamp_min(f_n, 0.0)

        # The contact's effective mass: diag(J M^-1 J^T) = sum_k Z_k^2 / D_k
        # with Z = L^-T J^T. Z keeps the support of J (the sweep runs from a
        # coordinate to its ancestors), so it is swept along each point's
        # chain of columns, deepest first.
        FM = LTDLFactor(sp, topo, E.clone())
        Lpk = E.new_zeros(sp.nnz, N)
        for lv, Lk in zip(sp.levels, FM.Ls):
            Lpk.index_copy_(0, lv.xpos, Lk)
        Lp = Lpk.index_select(0, P.chain_tgt)  # (sum_a a np, N), a-major
        Z = Jc.clone()
        k0 = 0
        for a in range(P.ns - 1, 0, -1):
            k0 = P.chain_start[a]
            La = Lp[k0 : k0 + a * npnt].view(a, 1, npnt, N)
            Z[:a].addcmul_(La, Z[a : a + 1], value=-1.0)
        Dg = torch.cat([FM.D, FM.D.new_ones(1, N)], 0).index_select(0, P.sup_flat).view(P.ns, 1, npnt, N)
        inv_mass = (Z * Z).div_(Dg).sum(0).mean(0).T  # (N, np)

        # Per-point damping C and stiffness K (3x3, world), as the reference path.
        nnT = n[..., :, None] * n[..., None, :]
        eye = torch.eye(3, dtype=n.dtype, device=n.device)
        vstar = dt * mu * fn_plus * inv_mass
        vt2 = (v_t * v_t).sum(-1)
        gamma = vt2 / (vt2 + vstar * vstar + torch.finfo(v_t.dtype).tiny)
        mu_fn_s = law["friction"] * fn_plus / s
        fric = mu_fn_s[..., None, None] * (eye - nnT - (gamma / (s * s))[..., None, None] * v_t[..., :, None] * v_t[..., None, :])
        C = c_n[..., None, None] * nnT + fric
        Kst = k_n[..., None, None] * nnT
        CK = C + dt * Kst  # (N, np, 3, 3)

        # dt J^T CK J into the packed entries of M, then the extra diagonal damping.
        CKt = CK.permute(2, 3, 1, 0)  # (3, 3, np, N)
        G = Jc[:, 0:1] * CKt[:, 0]
        G.addcmul_(Jc[:, 1:2], CKt[:, 1]).addcmul_(Jc[:, 2:3], CKt[:, 2])  # (CK J), (ns, 3, np, N)
        # Entries (sup[a], sup[b]), b <= a: J_a . (CK J)_b, one block of pairs per column a.
        vals = G.new_empty(P.ns * (P.ns + 1) // 2, npnt, N)
        k0 = 0
        for a in range(P.ns):
            out = vals[k0 : k0 + a + 1]
            torch.mul(G[: a + 1, 0], Jc[a, 0], out=out).addcmul_(G[: a + 1, 1], Jc[a, 1]).addcmul_(G[: a + 1, 2], Jc[a, 2])
            k0 += a + 1
        if P.pmask is not None:
            vals.mul_(P.pmask)
        E.index_add_(0, P.tgt, vals.view(-1, N), alpha=dt)
        if extra_damping is not None:
            D = _to_internal(topo, extra_damping.expand(*batch, nv).reshape(N, nv))
            E.index_add_(0, sp.dpos, D, alpha=dt)

        # Right-hand side: J^T (f - dt K J v - (C + dt K) b).
        if fb:
            b = dt * rot(R0, cross(vt[3:6], vt[:3])).T[:, None, :]  # (N, 1, 3), the same at every point
            pred = (C @ b[..., None])[..., 0] + (Kst @ (dt * (v_c + b))[..., None])[..., 0]
        else:
            pred = (Kst @ (dt * v_c)[..., None])[..., 0]
        x = (force0 - pred).permute(2, 1, 0)  # (3, np, N)
        JTx = (Jc * x).sum(1)  # (ns, np, N)
        full = rhs.new_zeros(nv + 1, N).index_add_(0, P.sup_flat, JTx.view(-1, N))
        rhs.add_(full[:nv])
        at = LTDLFactor(sp, topo, E).solve_fast(rhs)

        # The forces the step applied: f - pred - CK J dt a.
        Ja = (Jc * gather(at)).sum(0).permute(2, 1, 0)  # (N, np, 3)
        force = force0 - pred - dt * (CK @ Ja[..., None])[..., 0]
        f_nn = (force * n).sum(-1)

        # Body wrenches (body frame at the origin), (N, nb, 6).
        fbl = force.permute(2, 1, 0)
        w = torch.cat([rot_t(Rp, fbl), rot_t(Rp, cross(pt - pp, fbl))], 0)  # (6, np, N)
        nb = robot.num_bodies
        f_ext = w.new_zeros(6, nb, N).index_add_(1, P.body_pos, w).index_select(1, P.inv_order).permute(2, 1, 0)
        # The dense Jacobian (..., np, 3, nv) of the result, coordinate order.
        Jd = Jc.new_zeros((nv + 1) * 3 * npnt, N)
        Jd.index_copy_(0, P.dense_index, Jc.view(-1, N))
        Jd = Jd.view(nv + 1, 3, npnt, N)[:nv]
        if topo.dof_inv is not None:
            Jd = Jd.index_select(0, topo.dof_inv)
        jac = Jd.permute(3, 2, 1, 0)

        a = _from_internal(topo, at)
        B = tuple(batch)
        res = ContactResult(
            point=point.reshape(*B, npnt, 3),
            normal=n.reshape(*B, npnt, 3),
            penetration=phi.reshape(*B, npnt),
            normal_velocity=v_n.reshape(*B, npnt),
            slip_velocity=v_t.reshape(*B, npnt, 3),
            normal_force=f_nn.reshape(*B, npnt),
            friction_force=(force - f_nn[..., None] * n).reshape(*B, npnt, 3),
            force=force.reshape(*B, npnt, 3),
            f_ext=f_ext.reshape(*B, nb, 6),
            jacobian=jac.reshape(*B, npnt, 3, nv),
            _c_n=c_n.reshape(*B, npnt),
            _k_n=k_n.reshape(*B, npnt),
            _mu_fn_over_s=mu_fn_s.reshape(*B, npnt),
            _s=s.reshape(*B, npnt),
            _mu=mu.reshape(*B, npnt),
        )
        return a.reshape(*B, nv), res

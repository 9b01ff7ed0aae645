"""Large-batch dynamics with the batch as the last, contiguous axis.

Every quantity is held component by component with the batch innermost:
rotations ``(3, 3, k, N)``, points ``(3, k, N)``, spatial vectors
``(6, k, N)``, generalised vectors ``(nv, N)``. A 3x3 product, a cross
product or an inertia product is then a few elementwise operations over the
whole batch, and a tree sum one matrix product with the constant ancestor
matrix. Forward kinematics, the world inertias, RNEA, the mass matrix and its
factorisation all stay in this layout from ``q`` to the accelerations.

The mass matrix is never assembled: CRBA fills only the entries ``M[i, j]``
with ``j`` an ancestor of ``i`` (or ``i`` itself) in the tree of the
coordinates (the floating base is a chain of its six coordinates), and the
factorisation ``M = L^T D L`` (Featherstone's LTDL, *Rigid Body Dynamics
Algorithms* section 6.5) keeps that sparsity: there is no fill-in, and each
depth level of coordinates is factorised in one batched step, deepest first.

Used above :data:`~backdrive.dynamics._tree.TREE_MATMUL_MAX_BATCH` samples,
for models whose bodies each have their own coordinate (no mimic joints; the
factorisation needs the coordinates to form a tree).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..kinematics._fk import body_transforms_t
from ..model import RobotModel, geometry_constants
from ._tree import Topology

__all__ = ["KinT", "kinematics_t", "rnea_t", "forward_t", "inverse_dynamics_t", "LTDLFactor", "f_ext_world_t"]


# ---------------------------------------------------------------------- elementwise helpers


def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cross product of ``(3, ...)`` component-first arrays (broadcasting)."""
    if torch.is_grad_enabled():
        c0 = a[1] * b[2]
        c0 = c0.addcmul(a[2], b[1], value=-1.0)
        c1 = a[2] * b[0]
        c1 = c1.addcmul(a[0], b[2], value=-1.0)
        c2 = a[0] * b[1]
        c2 = c2.addcmul(a[1], b[0], value=-1.0)
        return torch.stack([c0, c1, c2])
    out = torch.empty(torch.broadcast_shapes(a.shape, b.shape), dtype=a.dtype, device=a.device)
    torch.mul(a[1], b[2], out=out[0]).addcmul_(a[2], b[1], value=-1.0)
    torch.mul(a[2], b[0], out=out[1]).addcmul_(a[0], b[2], value=-1.0)
    torch.mul(a[0], b[1], out=out[2]).addcmul_(a[1], b[0], value=-1.0)
    return out


def _rot(R: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``R x`` for ``R (3, 3, ...)`` and ``x (3, ...)``."""
    out = R[:, 0] * x[0]
    out.addcmul_(R[:, 1], x[1]).addcmul_(R[:, 2], x[2])
    return out


def _rot_t(R: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``R^T x`` for ``R (3, 3, ...)`` and ``x (3, ...)``."""
    out = R[0] * x[0]
    out.addcmul_(R[1], x[1]).addcmul_(R[2], x[2])
    return out


def _cat6(lin: torch.Tensor, ang: torch.Tensor) -> torch.Tensor:
    return torch.cat([lin, ang], 0)


# ---------------------------------------------------------------------- kinematics


class KinT(NamedTuple):
    """World-frame quantities at one configuration, batch last.

    Attributes:
        R, p: ``(3, 3, nb, N)``, ``(3, nb, N)`` world-from-body poses, all bodies.
        S: ``(6, nm, N)`` motion subspace of each moving body's joint (world, origin).
        m: ``(na, 1)`` masses; h: ``(3, na, N)`` first moments;
        I: ``(3, 3, na, N)`` rotational inertias about the world origin
        (active bodies).
    """

    R: torch.Tensor
    p: torch.Tensor
    S: torch.Tensor
    m: torch.Tensor
    h: torch.Tensor
    I: torch.Tensor


def _axis_const(model: RobotModel) -> torch.Tensor:
    return geometry_constants(model, "dynamics.axis_t", lambda m: m.joint_axis[1:].T[:, :, None].contiguous())


def kinematics_t(model: RobotModel, topo: Topology, qf: torch.Tensor) -> KinT:
    """Poses, joint motion subspaces and world inertias for ``qf (N, nq)``."""
    R, p = body_transforms_t(model, qf)
    o = topo.o
    ax = _axis_const(model)  # (3, nm, 1)
    Rm, pm = R[:, :, 1:], p[:, 1:]
    aw = _rot(Rm, ax)  # (3, nm, N) world joint axes
    # A revolute joint moves the world-origin point at p x a; a prismatic one at a.
    if topo.has_pri:
        rev, pri = topo.is_rev[:, 0, None], topo.is_pri[:, 0, None]
        S = _cat6(_cross(pm, aw) * rev + aw * pri, aw * rev)
    else:
        S = _cat6(_cross(pm, aw), aw)
    m = model.body_mass[o:, None]
    h, I = world_inertia_t(R[:, :, o:], p[:, o:], m, model.body_com[o:], model.body_inertia[o:])
    return KinT(R, p, S, m, h, I)


def world_inertia_t(Rt, pt, m, com, Ib):
    """First moments ``m c`` and rotational inertias ``R Ib R^T + m (|c|^2 1 - c c^T)``
    about the world origin, from ``Rt (3, 3, k, N)``, ``pt (3, k, N)``,
    ``m (k, 1)``, ``com (k, 3)`` and ``Ib (k, 3, 3)`` (at the centre of mass)."""
    ct = _rot(Rt, com.T[:, :, None]).add_(pt)
    ht = m * ct
    Ibt = Ib.permute(1, 2, 0)[:, :, :, None]  # [l, j, body, 1]
    # Y = R Ib, Y[i, j] = sum_l R[i, l] Ib[l, j]; then I = Y R^T.
    Y = Rt[:, 0, None] * Ibt[0]
    Y.addcmul_(Rt[:, 1, None], Ibt[1]).addcmul_(Rt[:, 2, None], Ibt[2])
    I = Y[:, None, 0] * Rt[None, :, 0]
    I.addcmul_(Y[:, None, 1], Rt[None, :, 1]).addcmul_(Y[:, None, 2], Rt[None, :, 2])
    I.addcmul_(ct[:, None], ht[None, :], value=-1.0)
    d = (ct * ht).sum(0)
    eye = torch.eye(3, dtype=d.dtype, device=d.device)[:, :, None, None]
    I = I.addcmul(eye, d)
    return ht, I


def f_ext_world_t(topo: Topology, K: KinT, f_ext: torch.Tensor) -> torch.Tensor:
    """Body-frame wrenches ``(N, nb, 6)`` at body origins -> world ``(6, na, N)`` at the origin."""
    o = topo.o
    f = f_ext[:, o:].permute(2, 1, 0)
    R, p = K.R[:, :, o:], K.p[:, o:]
    fl = _rot(R, f[:3])
    fa = _rot(R, f[3:])
    fa = fa + _cross(p, fl)
    return _cat6(fl, fa)


# ---------------------------------------------------------------------- spatial algebra


def _inertia(K: KinT, x: torch.Tensor) -> torch.Tensor:
    """Spatial inertia of each active body (world origin) times ``x (6, na, N)``:
    ``[m x_l + x_a x h; I x_a + h x x_l]``."""
    xl, xa = x[:3], x[3:]
    fl = _cross(xa, K.h)
    fl = fl.addcmul(K.m, xl) if torch.is_grad_enabled() else fl.addcmul_(K.m, xl)
    fa = _rot(K.I, xa)
    fa = fa + _cross(K.h, xl)
    return _cat6(fl, fa)


def _cross_motion(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``v x m``: ``[w x u + v x n; w x n]``."""
    return _cat6(_cross(v[3:], m[:3]) + _cross(v[:3], m[3:]), _cross(v[3:], m[3:]))


def _cross_force(v: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """``v x* f``: ``[w x f; w x n + v x f]``."""
    return _cat6(_cross(v[3:], f[:3]), _cross(v[3:], f[3:]) + _cross(v[:3], f[:3]))


def _base_to_world(R0, p0, x):
    """Base-frame twist ``(6, N)`` -> world twist at the origin ``(6, 1, N)``."""
    w = _rot(R0, x[3:])
    lin = _rot(R0, x[:3]) + _cross(p0, w)
    return _cat6(lin, w)[:, None]


def _world_force_to_base(R0, p0, f):
    """World wrenches at the origin ``(6, ..., N)`` -> base frame at the base
    origin: ``[R^T f; R^T (n - p x f)]``."""
    shape = (3,) + (1,) * (f.dim() - 2) + (f.shape[-1],)
    R0e = R0.reshape((3,) + shape)
    p0e = p0.reshape(shape)
    n = f[3:] - _cross(p0e, f[:3])
    return _cat6(_rot_t(R0e, f[:3]), _rot_t(R0e, n))


# ---------------------------------------------------------------------- RNEA


def rnea_t(
    model: RobotModel,
    topo: Topology,
    K: KinT,
    vt: torch.Tensor | None,
    at: torch.Tensor | None,
    gt: torch.Tensor,
    ft: torch.Tensor | None = None,
) -> torch.Tensor:
    """RNEA, batch last: ``vt``, ``at`` ``(nv, N)`` (``None``: zero), gravity
    ``gt (3, 1 or N)``, world wrenches ``ft (6, na, N)``; returns ``(nv, N)``."""
    fb = model.floating_base
    nj = model.num_joints
    S = K.S
    N = S.shape[-1]
    anc = topo.anc
    R0, p0 = K.R[:, :, 0], K.p[:, 0]
    grav = _cat6(-gt, torch.zeros_like(gt))[:, None]  # (6, 1, N or 1)

    def rates(x):  # joint-coordinate rates (nj, N) -> body rates (nm, N)
        xj = x[6:] if fb else x
        if not topo.coupled:
            return xj
        return xj.index_select(0, topo.coord) * topo.mult[:, None]

    if vt is not None:
        J = S * rates(vt)
        V = torch.matmul(anc, torch.cat([_base_to_world(R0, p0, vt[:6]), J], 1) if fb else J)
        Jd = _cross_motion(V[:, 1:] if fb else V, J)
        if at is not None:
            Jd = Jd.addcmul(S, rates(at))
        if fb:
            A0 = _base_to_world(R0, p0, at[:6]) if at is not None else Jd.new_zeros(6, 1, N)
            Jd = torch.cat([A0, Jd], 1)
        A = torch.matmul(anc, Jd) + grav
        f = _inertia(K, A) + _cross_force(V, _inertia(K, V))
    elif at is not None:
        Jd = S * rates(at)
        if fb:
            Jd = torch.cat([_base_to_world(R0, p0, at[:6]), Jd], 1)
        f = _inertia(K, torch.matmul(anc, Jd) + grav)
    else:
        f = _inertia(K, grav.expand(6, topo.na, grav.shape[-1]))
    if ft is not None:
        f = f - ft
    F = torch.matmul(anc.T, f)
    tau_b = (S * (F[:, 1:] if fb else F)).sum(0)  # (nm, N)
    if topo.coupled:
        tau = tau_b.new_zeros(nj, tau_b.shape[-1]).index_add(0, topo.coord, tau_b * topo.mult[:, None])
    else:
        tau = tau_b
    if at is not None and nj:
        tau = tau.addcmul(model.armature[:, None], at[6:] if fb else at)
    if fb:
        tau = torch.cat([_world_force_to_base(R0, p0, F[:, 0]), tau.expand(nj, F.shape[-1])], 0)
    return tau


# ---------------------------------------------------------------------- sparse CRBA and LTDL


class _Level(NamedTuple):
    d: int  # depth: number of ancestors of each coordinate in the level
    k: torch.Tensor  # (n,) coordinates of the level
    xpos: torch.Tensor  # (n d,) entries M[k, anc_b(k)]
    dpos: torch.Tensor  # (n,) entries M[k, k]
    anc: torch.Tensor  # (n d,) the ancestors anc_b(k)
    tgt: torch.Tensor  # entries M[anc_a(k), anc_b(k)], b <= a, updated by the level
    src_a: torch.Tensor  # (len(tgt),) position of (k, a) in the level's (n d) block
    src_b: torch.Tensor


class _Sparsity(NamedTuple):
    """Where the entries of ``M`` live in the packed ``(nnz, N)`` array, and
    the LTDL schedule (levels of coordinates, deepest first)."""

    nnz: int
    joint_diag: torch.Tensor  # entries M[j, j] of the joint coordinates
    pair_j: torch.Tensor  # moving-body pairs (j ancestor or self of i)
    pair_i: torch.Tensor
    levels: tuple
    dpos: torch.Tensor  # (nv,) diagonal entries
    base_pairs: tuple  # floating base: (r, c) of the 21 packed lower-triangle entries


def _sparsity(model: RobotModel) -> _Sparsity:
    return geometry_constants(model, "dynamics.ltdl", _build_sparsity)


def _build_sparsity(model: RobotModel) -> _Sparsity:
    device = model.device
    fb = model.floating_base
    parent = model.parent.tolist()
    nb = len(parent)
    nm = nb - 1
    off = 6 if fb else 0
    nv = off + nm
    lam = []
    for k in range(off):
        lam.append(k - 1)
    for b in range(1, nb):
        pb = parent[b]
        lam.append((off - 1 if fb else -1) if pb == 0 else off + pb - 1)
    ancs = []
    for d in range(nv):
        chain, x = [], lam[d]
        while x >= 0:
            chain.append(x)
            x = lam[x]
        ancs.append(chain[::-1])  # root first
    pos = {}
    base_pairs = []
    if fb:
        for r in range(6):
            for c in range(r + 1):
                pos[(r, c)] = len(pos)
                base_pairs.append((r, c))
        for c in range(6):
            for i in range(nm):
                pos[(off + i, c)] = len(pos)
    pair_j, pair_i = [], []
    for i in range(nm):
        for j in [a - off for a in ancs[off + i] if a >= off] + [i]:
            pos[(off + i, off + j)] = len(pos)
            pair_j.append(j)
            pair_i.append(i)
    by_depth = {}
    for d in range(nv):
        by_depth.setdefault(len(ancs[d]), []).append(d)
    levels = []
    for depth in sorted(by_depth, reverse=True):
        if depth == 0:
            continue
        ks = by_depth[depth]
        xpos, dpos, anc, tgt, sa, sb = [], [], [], [], [], []
        for n, k in enumerate(ks):
            ak = ancs[k]
            dpos.append(pos[(k, k)])
            for b in range(depth):
                xpos.append(pos[(k, ak[b])])
                anc.append(ak[b])
            for a in range(depth):
                for b in range(a + 1):
                    tgt.append(pos[(ak[a], ak[b])])
                    sa.append(n * depth + a)
                    sb.append(n * depth + b)
        t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        levels.append(_Level(depth, t(ks), t(xpos), t(dpos), t(anc), t(tgt), t(sa), t(sb)))
    t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    return _Sparsity(
        nnz=len(pos),
        joint_diag=t([pos[(off + i, off + i)] for i in range(nm)]),
        pair_j=t(pair_j),
        pair_i=t(pair_i),
        levels=tuple(levels),
        dpos=t([pos[(d, d)] for d in range(nv)]),
        base_pairs=tuple(base_pairs),
    )


def crba_entries_t(model: RobotModel, topo: Topology, sp: _Sparsity, K: KinT) -> torch.Tensor:
    """The packed entries of ``M`` (``_Sparsity`` order), ``(nnz, N)``, armature included."""
    fb = model.floating_base
    na = topo.na
    N = K.S.shape[-1]
    packed = torch.cat([K.m[None].expand(1, na, N), K.h, K.I.reshape(9, na, N)], 0)  # (13, na, N)
    C = torch.matmul(topo.anc.T, packed)  # composite inertias at the world origin
    Cm = C[:, 1:] if fb else C
    S = K.S
    m, hc, Ic = Cm[0], Cm[1:4], Cm[4:].reshape(3, 3, -1, N)
    # F_i = Ic_i S_i: [m Sl + Sa x h; I Sa + h x Sl].
    Sl, Sa = S[:3], S[3:]
    fl = _cross(Sa, hc).addcmul_(m, Sl)
    fa = _rot(Ic, Sa).add_(_cross(hc, Sl))
    F = _cat6(fl, fa)  # (6, nm, N)
    P = (S.index_select(1, sp.pair_j) * F.index_select(1, sp.pair_i)).sum(0)  # (npairs, N)
    if model.num_joints:
        P.index_add_(0, sp.joint_diag - (sp.nnz - P.shape[0]), model.armature[:, None].expand(-1, N))
    if not fb:
        return P
    R0, p0 = K.R[:, :, 0], K.p[:, 0]
    Mbj = _world_force_to_base(R0, p0, F).reshape(-1, N)  # (6 nm, N), row c nm + i
    # The whole tree's inertia in the base frame at the base origin.
    mt, ht, It = C[0, 0], C[1:4, 0], C[4:, 0].reshape(3, 3, N)
    hp = ht - mt * p0  # first moment about the base origin
    # I about p: I_O + (m |p|^2 - 2 p.h) 1 + h p^T + p h^T - m p p^T.
    mp = mt * p0
    s = (p0 * (mp - 2.0 * ht)).sum(0)
    Ip = It + ht[:, None] * p0[None] + p0[:, None] * (ht - mp)[None]
    Ip[0, 0] += s
    Ip[1, 1] += s
    Ip[2, 2] += s
    # Y = Ip R0, then Ib = R0^T Y.
    Y = Ip[:, 0, None] * R0[0][None]
    Y.addcmul_(Ip[:, 1, None], R0[1][None]).addcmul_(Ip[:, 2, None], R0[2][None])
    Ib = R0[0][:, None] * Y[0][None]
    Ib.addcmul_(R0[1][:, None], Y[1][None]).addcmul_(R0[2][:, None], Y[2][None])
    hb = _rot_t(R0, hp)
    z = torch.zeros_like(mt)
    # Spatial inertia [[m 1, -[h]x], [[h]x, I]] in the base frame; lower triangle.
    hx = ((z, -hb[2], hb[1]), (hb[2], z, -hb[0]), (-hb[1], hb[0], z))
    vals = []
    for r, c in sp.base_pairs:
        if r < 3:
            vals.append(mt if r == c else z)
        elif c < 3:
            vals.append(hx[r - 3][c])
        else:
            vals.append(Ib[r - 3, c - 3])
    return torch.cat([torch.stack(vals), Mbj, P], 0)


class LTDLFactor:
    """``M = L^T D L`` with the tree's sparsity; :meth:`solve` applies ``M^-1``.

    Built under ``no_grad`` from the packed entries (which it overwrites).
    """

    def __init__(self, sp: _Sparsity, E: torch.Tensor):
        self.sp = sp
        Ls = []
        N = E.shape[-1]
        for lv in sp.levels:
            n, d = lv.k.numel(), lv.d
            X = E.index_select(0, lv.xpos)  # (n d, N)
            Dk = E.index_select(0, lv.dpos)  # (n, N)
            Lk = (X.view(n, d, N) / Dk[:, None]).view(n * d, N)
            U = Lk.index_select(0, lv.src_a).mul_(X.index_select(0, lv.src_b))
            E.index_add_(0, lv.tgt, U, alpha=-1.0)
            Ls.append(Lk)
        self.Ls = Ls
        self.D = E.index_select(0, sp.dpos)

    def solve_t(self, r: torch.Tensor) -> torch.Tensor:
        """``M^-1 r`` for ``r (nv, N)`` (not modified)."""
        r = r.clone()
        N = r.shape[-1]
        levels = self.sp.levels
        for lv, Lk in zip(levels, self.Ls):  # L^T y = r, leaves first
            y = r.index_select(0, lv.k)
            r.index_add_(0, lv.anc, (Lk.view(-1, lv.d, N) * y[:, None]).view(-1, N), alpha=-1.0)
        r.div_(self.D)
        for lv, Lk in zip(reversed(levels), reversed(self.Ls)):  # L x = z, root first
            x = r.index_select(0, lv.anc).mul_(Lk)
            r.index_add_(0, lv.k, x.view(-1, lv.d, N).sum(1), alpha=-1.0)
        return r

    def solve(self, rhs: torch.Tensor) -> torch.Tensor:
        """``M^-1 rhs`` for ``rhs (..., nv)`` in the factor's batch order."""
        with torch.no_grad():
            shape = rhs.shape
            return self.solve_t(rhs.reshape(-1, shape[-1]).T).T.reshape(shape)


def forward_t(model: RobotModel, topo: Topology, q, v, tau, g, f_ext):
    """Accelerations ``(..., nv)`` (no autograd graph) and the factor of ``M``.

    ``q``, ``v``, ``tau`` share one batch shape; ``g`` is ``(3,)`` or that
    batch; ``f_ext`` ``None`` or ``(..., nb, 6)`` that broadcasts to it.
    """
    with torch.no_grad():
        batch = q.shape[:-1]
        nv = model.nv
        qf = q.reshape(-1, q.shape[-1])
        N = qf.shape[0]
        K = kinematics_t(model, topo, qf)
        gt = g[:, None] if g.ndim == 1 else g.reshape(-1, 3).T
        ft = None
        if f_ext is not None:
            ft = f_ext_world_t(topo, K, f_ext.expand(*batch, *f_ext.shape[-2:]).reshape(N, -1, 6))
        vt = v.reshape(N, nv).T
        rhs = tau.reshape(N, nv).T - rnea_t(model, topo, K, vt, None, gt, ft)
        sp = _sparsity(model)
        factor = LTDLFactor(sp, crba_entries_t(model, topo, sp, K))
        a = factor.solve_t(rhs)
        return a.T.reshape(*batch, nv), factor


def inverse_dynamics_t(model: RobotModel, topo: Topology, q, v, a, g, f_ext=None) -> torch.Tensor:
    """RNEA ``(..., nv)`` in the batch-last layout, differentiable by autograd.

    ``q`` and ``v``, ``a`` (each ``None`` for zero) share one batch shape;
    ``g`` is ``(3,)`` or that batch; ``f_ext`` ``None`` or ``(..., nb, 6)``
    that broadcasts to it.
    """
    batch = q.shape[:-1]
    nv = model.nv
    qf = q.reshape(-1, q.shape[-1])
    N = qf.shape[0]
    K = kinematics_t(model, topo, qf)
    gt = g[:, None] if g.ndim == 1 else g.reshape(-1, 3).T
    ft = None
    if f_ext is not None:
        ft = f_ext_world_t(topo, K, f_ext.expand(*batch, *f_ext.shape[-2:]).reshape(N, -1, 6))
    vt = None if v is None else v.reshape(N, nv).T
    at = None if a is None else a.reshape(N, nv).T
    tau = rnea_t(model, topo, K, vt, at, gt, ft)
    return tau.T.reshape(*batch, nv)

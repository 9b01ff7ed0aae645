"""The implicit contact step on the dynamics' fast path: batch last, one autograd node.

:meth:`ContactModel.acceleration` (``scheme="implicit"``) takes this path
when the robot has moving joints and no mimic joints, there are no
self-collision pairs, and the batch is large enough:
``kinematics._paths.choose("contact_step", ...)`` without a gradient,
``choose("contact_step_grad", ...)`` when autograd records (then the step is
one node, :class:`_ImplicitStepFast`, whose backward is written out below,
unless a parameter of the robot, the contact model or gravity requires grad:
those take the reference path). The ``use_path`` switch forces either path.
It computes the same step as the
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
    FastKin,
    mass_quadratic_vjp_fast,
    rnea_vjp_fast,
    LTDLFactor,
    _active,
    _coordinate_forces,
    _from_internal,
    _sparsity,
    _to_internal,
    base_quat_grad,
    crba_entries_fast,
    fast_topology,
    kinematics_fast,
    rnea_fast,
)
from ..dynamics import joint_forces
from ..dynamics._tree import broadcast_batch, gravity_vector
from ..kinematics._kernels import cross, rot, rot_t
from ..kinematics._schedule import tree_schedule, up
from ..model import RobotModel

__all__ = ["fast_eligible", "implicit_acceleration_fast", "implicit_acceleration_recorded", "reference_only"]


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


# ------------------------------------------------------------------ the step's pieces
#
# Each piece runs both without autograd (the forward, in place where that
# saves a copy) and under autograd (``record=True``: the backward's
# recomputation of the contact terms, see _ImplicitStepFast).


def _points(contact, P: _Plan, R, p, Sl, Sa, fb: bool, N: int, record: bool):
    """Contact points and the Jacobian columns of their supporting coordinates.

    Returns ``Rp (3, 3, np, N)``, ``pp (3, np, N)`` (the points' body poses),
    ``phi (N, np)``, ``n (N, np, 3)``, ``point (N, np, 3)``, ``pt`` (the same,
    ``(3, np, N)``), ``Jc (ns, 3, np, N)`` (column-major: a column is one
    contiguous block) and the base rotation ``R0`` (``None`` for a fixed base).
    """
    geo = contact.geometry
    npnt = geo.num_points
    Rp = R.index_select(2, P.body_pos)
    pp = p.index_select(1, P.body_pos)
    centre = rot(Rp, P.local).add_(pp)
    dist, n = contact.terrain.query(centre.permute(2, 1, 0))  # (N, np), (N, np, 3)
    radius = geo.point_radius
    phi = radius - dist
    point = centre.permute(2, 1, 0) - radius[:, None] * n  # (N, np, 3)
    pt = point.permute(2, 1, 0)  # (3, np, N)
    nsj = P.ns - (6 if fb else 0)
    R0 = R[:, :, 0] if fb else None  # (3, 3, N)
    if nsj:
        Sl_ = Sl.index_select(1, P.joints).view(3, npnt, nsj, N).permute(2, 0, 1, 3)
        Sa_ = Sa.index_select(1, P.joints).view(3, npnt, nsj, N).permute(2, 0, 1, 3)
    if record:
        cols = []
        if fb:
            R0c = R0.transpose(0, 1)[:, :, None]  # column i: R0 e_i at every point
            cols += [R0c.expand(3, 3, npnt, N), cross(R0c, (pt - p[:, 0:1])[None], dim=1)]
        if nsj:
            Jj = cross(Sa_, pt[None], dim=1) + Sl_
            cols.append(Jj if P.jmask is None else Jj * P.jmask)
        return Rp, pp, phi, n, point, pt, torch.cat(cols, 0), R0
    Jc = pt.new_empty(P.ns, 3, npnt, N)
    if fb:
        r = pt - p[:, 0:1]  # (3, np, N)
        Jc[:3].copy_(R0.transpose(0, 1)[:, :, None])
        Jc[3:6].copy_(cross(R0.transpose(0, 1)[:, :, None], r[None], dim=1))  # R0 e_i x r
    if nsj:
        Jj = torch.add(cross(Sa_, pt[None], dim=1), Sl_, out=Jc[P.ns - nsj :])
        if P.jmask is not None:
            Jj.mul_(P.jmask)
    return Rp, pp, phi, n, point, pt, Jc, R0


def _gather(P: _Plan, x: torch.Tensor, npnt: int) -> torch.Tensor:
    """``(nv, N)`` internal order -> ``(ns, 1, np, N)`` at each point's columns."""
    N = x.shape[-1]
    xs = torch.cat([x, x.new_zeros(1, N)], 0).index_select(0, P.sup_flat)
    return xs.view(P.ns, 1, npnt, N)


def _point_velocity(P: _Plan, Jc: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``J x`` at every point, ``(N, np, 3)``, for ``x (nv, N)`` internal order."""
    return (Jc * _gather(P, x, Jc.shape[2])).sum(0).permute(2, 1, 0)


def _law(contact, batch, N: int, phi, n, v_c, dt):
    """The force law at the points: ``v_n, v_t, law, f_n, f_t, c_n, k_n, s``."""
    from ._law import contact_law, per_point

    v_n = (v_c * n).sum(-1)
    v_t = v_c - v_n[..., None] * n
    p = contact._p
    shape = contact.geometry.point_shape
    law = {
        k: _flat(per_point(p[k], shape), batch, N)
        for k in ("stiffness", "damping", "friction", "normal_width", "stiction_width")
    }
    f_n, f_t, c_n, k_n, s = contact_law(phi, v_n, v_t, clamp_normal=p["clamp_normal"], dt=dt, **law)
    return v_n, v_t, law, f_n, f_t, c_n, k_n, s


def _blend_scalars(law, v_t, f_n, s, inv_mass, dt):
    """The friction blend's scalars per point: ``mu``, ``mu f_n+ / s`` and
    ``gamma / s^2`` with ``gamma = |v_t|^2 / (|v_t|^2 + v*^2)``, ``v* = dt mu
    f_n+ inv_mass``, from the effective mass ``inv_mass (N, np)``."""
    mu = torch.broadcast_to(law["friction"], f_n.shape)
    fn_plus = torch.clamp_min(f_n, 0.0)
    vstar = dt * mu * fn_plus * inv_mass
    vt2 = (v_t * v_t).sum(-1)
    gamma = vt2 / (vt2 + vstar * vstar + torch.finfo(v_t.dtype).tiny)
    return mu, law["friction"] * fn_plus / s, gamma / (s * s)


def _blend(law, n, v_t, f_n, c_n, k_n, s, inv_mass, dt):
    """Per-point damping ``C`` and stiffness ``K`` (3x3, world), as
    :func:`~backdrive.contact._model.row_matrices` on the reference path,
    from the effective mass ``inv_mass (N, np)``; also ``mu`` and ``mu f_n+ / s``."""
    mu, mu_fn_s, g2 = _blend_scalars(law, v_t, f_n, s, inv_mass, dt)
    nnT = n[..., :, None] * n[..., None, :]
    eye = torch.eye(3, dtype=n.dtype, device=n.device)
    fric = mu_fn_s[..., None, None] * (eye - nnT - g2[..., None, None] * v_t[..., :, None] * v_t[..., None, :])
    return c_n[..., None, None] * nnT + fric, k_n[..., None, None] * nnT, mu, mu_fn_s


def _base_turn(vt, R0, dt):
    """``b = dt R0 (w x v)`` ``(N, 1, 3)``, the base frame's turn over the step
    (the same at every point; ``_model.py``, ``implicit_terms``), or ``None``
    for a fixed base."""
    if R0 is None:
        return None
    return dt * rot(R0, cross(vt[3:6], vt[:3])).T[:, None, :]


def _prediction(C, Kst, v_c, vt, R0, dt):
    """The forces' predicted change beyond ``CK J dt a``: ``K dt (J v + b) + C b``
    with ``b`` the base frame's turn (:func:`_base_turn`)."""
    b = _base_turn(vt, R0, dt)
    if b is not None:
        return (C @ b[..., None])[..., 0] + (Kst @ (dt * (v_c + b))[..., None])[..., 0]
    return (Kst @ (dt * v_c)[..., None])[..., 0]


def _applied_force(force0, n, v_t, v_c, Jat, c_n, k_n, mu_fn_s, g2, b, dt):
    """The applied force ``f - pred - CK J dt a`` (see :func:`_step`) by
    vector operations, ``C`` and ``K`` never formed (under autograd: a few
    small nodes instead of 3x3 arrays and batched products): with ``x = b +
    dt J a``, ``f - C x - dt k_n n (n . (J v + x))`` and ``C x = c_n n (n . x)
    + mu f_n+ / s (x - n (n . x) - gamma / s^2 v_t (v_t . x))``."""
    x = dt * Jat if b is None else b + dt * Jat
    nx = (n * x).sum(-1)
    nvx = nx + (n * v_c).sum(-1)
    tx = (v_t * x).sum(-1)
    coef_n = (c_n - mu_fn_s) * nx + dt * k_n * nvx
    return force0 - coef_n[..., None] * n - mu_fn_s[..., None] * x + (mu_fn_s * g2 * tx)[..., None] * v_t


def _wrenches(P: _Plan, Rp, pp, pt, force, nb: int) -> torch.Tensor:
    """Body wrenches ``(N, nb, 6)`` (body frame at the origin) of the point forces ``(N, np, 3)``."""
    fbl = force.permute(2, 1, 0)
    w = torch.cat([rot_t(Rp, fbl), rot_t(Rp, cross(pt - pp, fbl))], 0)  # (6, np, N)
    return w.new_zeros(6, nb, w.shape[-1]).index_add(1, P.body_pos, w).index_select(1, P.inv_order).permute(2, 1, 0)


def _dense_rows(P: _Plan, Jc: torch.Tensor, nv: int) -> torch.Tensor:
    """The dense Jacobian ``(nv, 3, np, N)`` (internal coordinate order) of the columns ``Jc``."""
    _, _, npnt, N = Jc.shape
    Jd = Jc.new_zeros((nv + 1) * 3 * npnt, N).index_copy(0, P.dense_index, Jc.reshape(-1, N))
    return Jd.view(nv + 1, 3, npnt, N)[:nv]


def _jacobian(topo, Jd: torch.Tensor) -> torch.Tensor:
    """``(nv, 3, np, N)`` internal -> the result's ``(N, np, 3, nv)`` (coordinate order)."""
    if topo.dof_inv is not None:
        Jd = Jd.index_select(0, topo.dof_inv)
    return Jd.permute(3, 2, 1, 0)


#: The differentiable fields of the step's ContactResult, in the order of
#: _ImplicitStepFast's outputs (after the acceleration); then the private ones.
_FIELDS = (
    "point", "normal", "penetration", "normal_velocity", "slip_velocity",
    "normal_force", "friction_force", "force", "f_ext", "jacobian",
)
_PRIVATE = ("_c_n", "_k_n", "_mu_fn_over_s", "_s", "_mu")


def _step(contact, robot, q, v, tau, dt, gravity, extra_damping):
    """The fast step, no autograd: ``a (..., nv)``, the result's fields (a
    dict, batch shape first) and what the backward needs."""
    g = gravity_vector(robot, gravity)
    batch, (q, v, tau, g) = broadcast_batch(robot, q, (v, robot.nv, "v"), (tau, robot.nv, "tau"), (g, 3, "gravity"))
    nv = robot.nv
    qf = q.reshape(-1, q.shape[-1])
    N = qf.shape[0]
    topo = fast_topology(robot)
    sp = _sparsity(robot)
    P = plan(contact, robot)
    npnt = contact.geometry.num_points
    gt = g[:, None] if g.ndim == 1 else g.reshape(-1, 3).T
    K = kinematics_fast(robot, topo, qf)
    vt = _to_internal(topo, v.reshape(N, nv))
    # RNEA first: the CRBA below sums K's inertias over subtrees in place.
    rhs = _to_internal(topo, (tau + joint_forces(robot, v)).reshape(N, nv))
    rhs = rhs - rnea_fast(robot, topo, K, vt, None, gt)
    E = crba_entries_fast(robot, topo, sp, K)

    Rp, pp, phi, n, point, pt, Jc, R0 = _points(contact, P, K.R, K.p, K.Sl, K.Sa, robot.floating_base, N, False)
    v_c = _point_velocity(P, Jc, vt)
    v_n, v_t, law, f_n, f_t, c_n, k_n, s = _law(contact, batch, N, phi, n, v_c, dt)
    force0 = f_n[..., None] * n + f_t

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
    for a in range(P.ns - 1, 0, -1):
        k0 = P.chain_start[a]
        La = Lp[k0 : k0 + a * npnt].view(a, 1, npnt, N)
        Z[:a].addcmul_(La, Z[a : a + 1], value=-1.0)
    Dg = torch.cat([FM.D, FM.D.new_ones(1, N)], 0).index_select(0, P.sup_flat).view(P.ns, 1, npnt, N)
    inv_mass = (Z * Z).div_(Dg).sum(0).mean(0).T  # (N, np)

    C, Kst, mu, mu_fn_s = _blend(law, n, v_t, f_n, c_n, k_n, s, inv_mass, dt)
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
    pred = _prediction(C, Kst, v_c, vt, R0, dt)
    x = (force0 - pred).permute(2, 1, 0)  # (3, np, N)
    JTx = (Jc * x).sum(1)  # (ns, np, N)
    full = rhs.new_zeros(nv + 1, N).index_add_(0, P.sup_flat, JTx.view(-1, N))
    rhs.add_(full[:nv])
    FA = LTDLFactor(sp, topo, E)
    at = FA.solve_fast(rhs)

    # The forces the step applied: f - pred - CK J dt a.
    force = force0 - pred - dt * (CK @ _point_velocity(P, Jc, at)[..., None])[..., 0]
    f_nn = (force * n).sum(-1)
    Jd = _dense_rows(P, Jc, nv)
    fields = {
        "point": point, "normal": n, "penetration": phi, "normal_velocity": v_n, "slip_velocity": v_t,
        "normal_force": f_nn, "friction_force": force - f_nn[..., None] * n, "force": force,
        "f_ext": _wrenches(P, Rp, pp, pt, force, robot.num_bodies), "jacobian": _jacobian(topo, Jd),
        "_c_n": c_n, "_k_n": k_n, "_mu_fn_over_s": mu_fn_s, "_s": s, "_mu": mu,
    }
    B = tuple(batch)
    fields = {k: t.reshape(*B, *t.shape[1:]) for k, t in fields.items()}
    a = _from_internal(topo, at).reshape(*B, nv)
    return a, fields, (B, N, g, FM, FA, at, Z, Dg, (K.R, K.p, K.Sl, K.Sa))


def _result(fields: dict):
    from ._model import ContactResult

    return ContactResult(**fields)


def implicit_acceleration_fast(contact, robot, q, v, tau, dt, gravity=None, extra_damping=None):
    """The implicit step's accelerations ``(..., nv)`` and the applied :class:`ContactResult`.

    Same arguments and results as :meth:`ContactModel.acceleration` with
    ``scheme="implicit"``; no autograd graph (call it under ``no_grad``;
    :func:`implicit_acceleration_recorded` records one).
    """
    with torch.no_grad():
        a, fields, _ = _step(contact, robot, q, v, tau, dt, gravity, extra_damping)
        return a, _result(fields)


# ------------------------------------------------------------------ the backward


def reference_only(contact, robot: RobotModel, gravity) -> bool:
    """Whether a gradient must take the reference path: a parameter of the
    robot, the contact law, the geometry or the terrain, or gravity, requires
    grad (the fast path's backward differentiates ``q``, ``v``, ``tau`` and
    ``extra_damping`` only)."""
    def grad_in(obj) -> bool:
        items = obj.values() if isinstance(obj, dict) else vars(obj).values()
        return any(isinstance(x, torch.Tensor) and x.requires_grad for x in items)

    if isinstance(gravity, torch.Tensor) and gravity.requires_grad:
        return True
    return grad_in(robot) or grad_in(contact._p) or grad_in(contact.geometry) or grad_in(contact.terrain)


def _recompute(contact, robot, topo, P: _Plan, qf, kin, vf, at, Y, dt, batch, N):
    """The step's contact terms under autograd, ``a`` held at ``at`` (internal
    ``(nv, N)``): the applied forces and every result field, and the Jacobian
    columns, from the forward pass's poses and motion subspaces ``kin = (R,
    p, Sl, Sa)`` (leaves: their gradients go to ``q`` by :func:`_pose_vjp`,
    not by autograd through forward kinematics).

    The effective mass is ``diag(J M^-1 J^T) = max_y 2 J y - y^T M y`` per
    row, taken at the maximiser ``Y = M^-1 J^T`` of the forward pass (held
    constant): the same value, and, the derivative with respect to ``y``
    being zero there, the same first derivative with respect to ``q``
    (``2 J' y - y^T M' y``) without differentiating a factorisation.
    ``y^T M y`` is one node of ``qf`` (:class:`_MassQuadratic`), ``M`` never formed.
    """
    nv = robot.nv
    npnt = contact.geometry.num_points
    R, p, Sl, Sa = kin
    vt = _to_internal(topo, vf)
    Rp, pp, phi, n, point, pt, Jc, R0 = _points(contact, P, R, p, Sl, Sa, robot.floating_base, N, True)
    v_c = _point_velocity(P, Jc, vt)
    v_n, v_t, law, f_n, f_t, c_n, k_n, s = _law(contact, batch, N, phi, n, v_c, dt)
    force0 = f_n[..., None] * n + f_t
    with torch.no_grad():  # Y at each point's supporting coordinates, as Jc (zero at padding columns)
        Yg = torch.cat([Y, Y.new_zeros(1, *Y.shape[1:])], 0).view(-1, N).index_select(0, P.dense_index).view(Jc.shape)
    Jy = (Jc * Yg).sum(0)  # (3, np, N)
    K = FastKin(R.detach(), p.detach(), Sl.detach(), Sa.detach(), _active(topo, robot.body_mass)[:, None], None, None)
    yMy = _MassQuadratic.apply(qf, robot, topo, K, Y.reshape(nv, 3 * npnt, N), Jy.detach().reshape(3 * npnt, N))
    yMy = yMy.T.view(N, 3, npnt)
    inv_mass = (2.0 * Jy.permute(2, 0, 1) - yMy).mean(1)  # (N, np)
    _, mu_fn_s, g2 = _blend_scalars(law, v_t, f_n, s, inv_mass, dt)
    force = _applied_force(force0, n, v_t, v_c, _point_velocity(P, Jc, at), c_n, k_n, mu_fn_s, g2,
                           _base_turn(vt, R0, dt), dt)
    return Jc, force, (Rp, pp, pt, point, n, phi, v_n, v_t, Jc)


class _MassQuadratic(torch.autograd.Function):
    """``y_c^T M(q) y_c`` ``(C, N)`` for constant columns ``y (nv, C, N)``
    (internal order) as one node of ``q``, its value ``value`` given (the
    caller knows it: ``J y`` at ``y = M^-1 J^T``); the backward's ``sum_c
    g_c d(y_c^T M y_c)/dq`` by
    :func:`~backdrive.dynamics._fast.mass_quadratic_vjp_fast` (``2 (V_i x S_i)
    . hc_i`` for joint ``i``, from the body twists at ``y`` and the
    subtrees' momenta weighted by ``g``), not by autograd through a dense
    ``M``, and only when ``q``'s gradient is asked for. The floating base's
    pose does not enter (its twist is in the base frame). ``K``: the
    kinematics at ``qf`` (read, not differentiated)."""

    @staticmethod
    def forward(ctx, qf, robot, topo, K, y, value):
        ctx.robot, ctx.topo, ctx.K, ctx.y = robot, topo, K, y
        return value.clone()

    @staticmethod
    def backward(ctx, gval):
        g = mass_quadratic_vjp_fast(ctx.robot, ctx.topo, ctx.K, ctx.y, gval)  # (nj, N)
        N = g.shape[-1]
        if ctx.robot.floating_base:  # joints only: _from_internal of (nv, N) with a zero base, then q's 7 base entries
            g = _from_internal(ctx.topo, torch.cat([g.new_zeros(6, N), g], 0))[:, 6:]
            return torch.cat([g.new_zeros(N, 7), g], 1), None, None, None, None, None
        return _from_internal(ctx.topo, g), None, None, None, None, None


def _field(name: str, parts, force, robot, topo, P):
    Rp, pp, pt, point, n, phi, v_n, v_t, Jc = parts
    if name in ("normal_force", "friction_force"):
        f_nn = (force * n).sum(-1)
        return f_nn if name == "normal_force" else force - f_nn[..., None] * n
    simple = {"point": point, "normal": n, "penetration": phi, "normal_velocity": v_n, "slip_velocity": v_t, "force": force}
    if name in simple:
        return simple[name]
    if name == "f_ext":
        return _wrenches(P, Rp, pp, pt, force, robot.num_bodies)
    return _jacobian(topo, _dense_rows(P, Jc, robot.nv))


class _ImplicitStepFast(torch.autograd.Function):
    """The fast implicit step with its backward by the implicit function theorem.

    The step solves ``A a = r`` with ``A = M + dt D + dt J^T (C + dt K) J``,
    i.e. ``F(a; q, v, tau) = RNEA(q, v, a) + dt D a - tau - tau_joint(v) -
    J^T f(q, v, a) = 0`` where ``f`` is the applied force (linear in ``a``:
    ``dF/da = A``). For an incoming ``g_a``: ``lam = A^-1 g_a`` (the forward's
    LTDL factor of ``A`` reused), ``g_tau = lam``, ``g_D = -dt lam a`` and
    ``g_(q, v) = -lam^T dF/d(q, v)`` at fixed ``a``: the RNEA part by the
    dynamics' written-out reverse pass (``rnea_vjp_fast``), the joint forces
    and the contact part ``(J lam) . f`` by autograd over a recomputation of
    the contact terms (:func:`_recompute`; about a hundred small nodes on
    batch-last arrays) from the forward's poses and motion subspaces (kept:
    no second forward kinematics), whose gradients reach ``q`` by the
    written-out reverse pass of forward kinematics (:func:`_pose_vjp`), and
    the effective masses' ``M(q)`` by :class:`_MassQuadratic`. Gradients of
    the result's fields go through the same recomputation (one autograd pass
    with the contact part), their part through ``a`` added to ``g_a`` first.

    Double backward (``create_graph=True``) differentiates the reference path.
    """

    @staticmethod
    def forward(ctx, contact, robot, dt, gravity, q, v, tau, extra_damping):
        a, fields, saved = _step(contact, robot, q, v, tau, dt, gravity, extra_damping)
        ctx.contact, ctx.robot, ctx.dt, ctx.gravity, ctx.saved = contact, robot, dt, gravity, saved
        ctx.save_for_backward(q, v, tau, extra_damping)
        ctx.set_materialize_grads(False)
        private = [fields[k] for k in _PRIVATE]
        ctx.mark_non_differentiable(*private)
        return (a, *[fields[k] for k in _FIELDS], *private)

    @staticmethod
    def backward(ctx, ga, *gout):
        q, v, tau, ed = ctx.saved_tensors
        contact, robot, dt = ctx.contact, ctx.robot, ctx.dt
        gf = {k: g for k, g in zip(_FIELDS, gout) if g is not None}
        nq_, nv_, ntau, ned = ctx.needs_input_grad[4:8]
        if torch.is_grad_enabled():
            return (None,) * 4 + _reference_grads(ctx, q, v, tau, ed, ga, gf)
        B, N, g, FM, FA, at, Z, Dg, kin = ctx.saved
        topo = fast_topology(robot)
        P = plan(contact, robot)
        nv, npnt = robot.nv, contact.geometry.num_points
        gat = at.new_zeros(nv, N) if ga is None else _to_internal(topo, ga.expand(*B, nv).reshape(N, nv))
        gq = gv = None
        if nq_ or nv_ or gf:
            Y = _back_columns(FM, _dense_rows(P, Z / Dg, nv).reshape(nv, 3 * npnt, N)).view(nv, 3, npnt, N)
            with torch.enable_grad():
                qf = q.detach().expand(*B, q.shape[-1]).reshape(N, -1).requires_grad_(nq_)
                kl = [x.detach().requires_grad_(nq_) for x in kin]  # R, p, Sl, Sa
                vf = v.detach().expand(*B, nv).reshape(N, nv).requires_grad_(nv_)
                al = at.detach().requires_grad_(bool(gf))
                Jc, force, parts = _recompute(contact, robot, topo, P, qf, kl, vf, al, Y, dt, B, N)
                leaves = ([qf] + kl if nq_ else []) + ([vf] if nv_ else [])
                loss = None
                if gf:
                    loss = sum((_field(k, parts, force, robot, topo, P) * g_.expand(*B, *g_.shape[len(B):]).reshape(N, *g_.shape[len(B):])).sum()
                               for k, g_ in gf.items())
                    (gal,) = torch.autograd.grad(loss, al, retain_graph=True, allow_unused=True)
                    if gal is not None:  # None: only fields that do not depend on a (points, normals, ...)
                        gat = gat + gal
                lam = FA.solve_fast(gat)
                if leaves:
                    s2 = (_point_velocity(P, Jc, lam) * force).sum()
                    got = torch.autograd.grad(s2 if loss is None else s2 + loss, leaves, allow_unused=True)
                    if nq_:
                        gq = _pose_vjp(robot, topo, kin, got[1:5], qf)
                        if got[0] is not None:  # the effective masses' M(q)
                            gq = gq + got[0]
                    if nv_:
                        gv = got[-1] if got[-1] is not None else vf.new_zeros(N, nv)
                    lam_c = _from_internal(topo, lam)
                    gq_r, gv_r = rnea_vjp_fast(robot, qf.detach(), vf.detach(), _from_internal(topo, at), g, -lam_c,
                                               (*kin, None))
                    if nq_:
                        gq = gq + gq_r
                    if nv_:
                        vl = vf.detach().requires_grad_(True)
                        (gj,) = torch.autograd.grad(joint_forces(robot, vl), vl, lam_c)
                        gv = gv + gv_r + gj
        else:
            lam = FA.solve_fast(gat)
        lam_c = _from_internal(topo, lam)
        out_q = None if gq is None or not nq_ else gq.reshape(*B, -1).sum_to_size(q.shape)
        out_v = None if gv is None or not nv_ else gv.reshape(*B, nv).sum_to_size(v.shape)
        out_tau = lam_c.reshape(*B, nv).sum_to_size(tau.shape) if ntau else None
        out_ed = (-dt * lam_c * _from_internal(topo, at)).reshape(*B, nv).sum_to_size(ed.shape) if ned else None
        return None, None, None, None, out_q, out_v, out_tau, out_ed


def _back_columns(F: LTDLFactor, r: torch.Tensor) -> torch.Tensor:
    """``L^-1 r`` in place on ``r (nv, C, N)`` (internal order) for the
    LTDL factor ``F`` of ``M``: :meth:`LTDLFactor._back` on ``C`` columns at
    once. With ``r = D^-1 Z``, ``Z = L^-T J^T`` of the forward pass (the
    effective mass's sweep), it gives ``Y = M^-1 J^T``."""
    C, N = r.shape[1], r.shape[2]
    for lv, Lk in zip(reversed(F.sp.levels), reversed(F.Ls)):
        x = r.index_select(0, lv.anc).mul_(Lk[:, None])
        r.index_add_(0, lv.k, x.view(-1, lv.d, C, N).sum(1), alpha=-1.0)
    return r


def _pose_vjp(robot, topo, kin, grads, qf: torch.Tensor) -> torch.Tensor:
    """The gradient ``(N, nq)`` with respect to ``q`` of a function of the
    poses and motion subspaces ``kin = (R (3, 3, nb, N), p (3, nb, N), Sl, Sa
    (3, nm, N))`` (level order) from its gradients ``grads`` (``None``: zero)
    with respect to them: the reverse pass of forward kinematics, as at the
    end of :func:`~backdrive.dynamics._fast.rnea_vjp_fast`. A rotation
    ``dR = [w]x R`` pairs with ``gR`` as ``w . sum_j R e_j x gR e_j``, so each
    body's gradient is a world force ``gp`` and torque ``t``; ``S = [p x a;
    a]`` (revolute, ``a`` the world joint axis) or ``[a; 0]`` (prismatic)
    adds to both; a joint turns (shifts) its whole subtree, so its gradient
    is ``a . (T - p x G)`` (``a . G``) with ``(G, T)`` the subtree sums of
    ``(gp, t + p x gp)``; the floating base's are ``G`` and, through the
    quaternion, the torque about its origin."""
    R, p, Sl, Sa = kin
    gR, gp, gSl, gSa = grads
    fb, o = robot.floating_base, topo.o
    off = 6 if fb else 0
    gp = torch.zeros_like(p) if gp is None else gp.clone()
    if gR is None:
        t = torch.zeros_like(p)
    else:
        (r0, r1, r2), (g0, g1, g2) = R.unbind(1), gR.unbind(1)
        t = cross(r0, g0) + cross(r1, g1) + cross(r2, g2)
    pm = p[:, 1:]
    aw = Sa if not topo.has_pri else rot(R[:, :, 1:], topo.axis)
    if gSl is not None or gSa is not None:
        gSl = torch.zeros_like(Sl) if gSl is None else gSl
        gSa = torch.zeros_like(Sa) if gSa is None else gSa
        if topo.has_pri:
            gSl_r = gSl * topo.is_rev
            gaw = gSa * topo.is_rev + cross(gSl_r, pm) + gSl * topo.is_pri
            gp[:, 1:] += cross(aw, gSl_r)
        else:
            gaw = gSa + cross(gSl, pm)
            gp[:, 1:] += cross(aw, gSl)
        t[:, 1:] += cross(aw, gaw)
    T = up(topo.sums, (t + cross(p, gp))[:, o:].contiguous())
    G = up(topo.sums, gp[:, o:].contiguous())  # in place on gp (a fresh array) above a few hundred samples
    Gm, Tm = (G[:, 1:], T[:, 1:]) if fb else (G, T)
    gth = (aw * (Tm + cross(Gm, pm))).sum(0)  # aw . (Tm - pm x Gm)
    if topo.has_pri:
        gth = gth * topo.is_rev + (aw * Gm).sum(0) * topo.is_pri
    gj = _coordinate_forces(topo, gth)
    if topo.dof_inv is not None:
        gj = gj.index_select(0, topo.dof_inv[off:] - off)
    if not fb:
        return gj.T
    gquat = base_quat_grad(T[:, 0], G[:, 0], p[:, 0], R[:, :, 0], qf)
    return torch.cat([G[:, 0].T, gquat, gj.T], 1)


def _reference_grads(ctx, q, v, tau, ed, ga, gf):
    """Double backward: the gradients by plain autograd over the reference path, with a graph."""
    from ..kinematics._paths import use_path

    needs = ctx.needs_input_grad[4:8]
    with torch.enable_grad(), use_path("reference"):
        ins = [None if x is None else (x if x.requires_grad else x.detach().requires_grad_(n)) for x, n in zip((q, v, tau, ed), needs)]
        a, res = ctx.contact.acceleration(ctx.robot, ins[0], ins[1], ins[2], dt=ctx.dt, gravity=ctx.gravity, extra_damping=ins[3])
        outs, grads = [], []
        if ga is not None:
            outs.append(a)
            grads.append(ga)
        for k, g_ in gf.items():
            outs.append(getattr(res, k))
            grads.append(g_)
        wanted = [x for x, n in zip(ins, needs) if n and x is not None]
        got = iter(torch.autograd.grad(outs, wanted, grads, create_graph=True, allow_unused=True))
    return tuple(next(got) if n and x is not None else None for x, n in zip(ins, needs))


def implicit_acceleration_recorded(contact, robot, q, v, tau, dt, gravity=None, extra_damping=None):
    """:func:`implicit_acceleration_fast` recording one autograd node
    (:class:`_ImplicitStepFast`): gradients with respect to ``q``, ``v``,
    ``tau`` and ``extra_damping`` (see :func:`reference_only` for the rest)."""
    outs = _ImplicitStepFast.apply(contact, robot, float(dt), gravity, q, v, tau, extra_damping)
    fields = dict(zip(_FIELDS + _PRIVATE, outs[1:]))
    return outs[0], _result(fields)

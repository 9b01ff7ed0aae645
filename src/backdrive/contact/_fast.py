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

The simulator's default step (``joint_forces="implicit"``) runs here too:
without joint friction through :meth:`ContactModel.acceleration` (its joint
damping joined to ``extra_damping``), with joint friction through
:func:`dispatch` and a :class:`JointFriction` (the frictional joints'
Delassus block from the step's own LTDL factor, the simulator's active-set
iteration on it, one more solve; the backward by Woodbury on the same factor).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..dynamics._fast import (
    FastKin,
    mass_quadratic_vjp_fast,
    rnea_vjp_fast,
    LTDLFactor,
    _active,
    _cross_into,
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
from ..dynamics._forward import DEFAULT_FRICTION_WIDTH
from ..dynamics._tree import broadcast_batch, gravity_vector
from ..kinematics._kernels import cross, rot, rot_t
from ..kinematics._schedule import tree_schedule, up
from ..model import RobotModel
from ._model import friction_blend
from ._terrain import GroundPlane

__all__ = [
    "JointFriction", "dispatch", "fast_eligible", "implicit_acceleration_fast", "implicit_acceleration_recorded",
    "reference_only",
]


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
    chain_tgt: torch.Tensor  # packed entries (sup[a], sup[b]) for b < a, a-major then b, then the point
    chain_start: tuple  # where column a's block starts in chain_tgt
    dense_index: torch.Tensor  # (ns 3 np,) rows of the dense (nv + 1, 3, np) Jacobian of Jc's entries
    dense_coord: torch.Tensor  # the same rows with the coordinates in coordinate order (the result's)
    dense_zero: torch.Tensor  # the rows of that (nv + 1, 3, np) array that no entry of Jc writes
    cache: dict  # index arrays derived on first use (_chain_rows)


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
    # The internal order's coordinate c is the robot's coordinate perm[c] (fast_topology's dof_perm).
    perm = fast_topology(robot).dof_perm
    perm = list(range(nv)) if perm is None else perm.tolist()
    perm = perm + [nv]  # the padding row stays last
    coord = [perm[sup[p][k]] * 3 * npnt + i * npnt + p for k in range(ns) for i in range(3) for p in range(npnt)]
    written = set(coord)
    zero = [r for r in range((nv + 1) * 3 * npnt) if r not in written]
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
        dense_coord=t(coord),
        dense_zero=t(zero),
        cache={},
        pa=t(pa),
        pb=t(pb),
        tgt=t(tgt),
        pmask=f(pmask).view(-1, npnt)[:, :, None] if padded else None,
        ns=ns,
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


def _points(contact, P: _Plan, R, p, Sl, Sa, fb: bool, N: int):
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
    Jc = pt.new_empty(P.ns, 3, npnt, N)
    if fb:
        r = pt - p[:, 0:1]  # (3, np, N)
        e = R0.transpose(0, 1)[:, :, None]  # (3 columns, 3, 1, N): R0 e_i
        Jc[:3].copy_(e)
        _cross_into(Jc[3:6], e, r[None], dim=1)  # R0 e_i x r
    if nsj:
        Jj = _cross_into(Jc[P.ns - nsj :], Sa_, pt[None], dim=1).add_(Sl_)
        if P.jmask is not None:
            Jj.mul_(P.jmask)
    return Rp, pp, phi, n, point, pt, Jc, R0


#: From this many samples the unilateral step re-solves only the samples that
#: dropped a point (when they are at most half of the batch). A chosen, not a
#: measured, threshold: small batches cost per-operation overhead, which the
#: rows' extra gathers would add to and a smaller solve would not cut.
_SUBSET_MIN = 64


class _Samples(NamedTuple):
    """The per-sample inputs of the fast step's solve (:func:`_step`)."""

    law: dict  # per-point parameters, (N, np) or broadcastable ((np,), (1,), ())
    n: torch.Tensor  # (N, np, 3)
    v_t: torch.Tensor  # (N, np, 3)
    s: torch.Tensor  # (N, np)
    inv_mass: torch.Tensor  # (N, np)
    Jc: torch.Tensor  # (ns, 3, np, N)
    v_c: torch.Tensor  # (N, np, 3)
    b: torch.Tensor | None  # (N, 1, 3)
    rhs: torch.Tensor  # (nv, N)
    vt: torch.Tensor  # (nv, N)
    N: int

    def take(self, rows: torch.Tensor) -> "_Samples":
        """The same for the samples ``rows`` (a copy of their rows)."""
        N = self.N

        def first(t):
            return t if t is None or t.ndim < 2 or t.shape[0] != N else t.index_select(0, rows)

        return _Samples(
            {k: first(t) for k, t in self.law.items()}, first(self.n), first(self.v_t), first(self.s),
            first(self.inv_mass), self.Jc.index_select(-1, rows), first(self.v_c), first(self.b),
            self.rhs.index_select(-1, rows), self.vt.index_select(-1, rows), rows.numel())


def _merge_factor(F: LTDLFactor, part: LTDLFactor, rows: torch.Tensor) -> LTDLFactor:
    """``F`` with the samples ``rows`` replaced by ``part``'s (a factor of
    those samples alone): its multipliers and pivots, in place."""
    F.La.index_copy_(1, rows, part.La)
    F.D.index_copy_(1, rows, part.D)
    return F


def _chain_rows(P: _Plan, sp, F: LTDLFactor) -> torch.Tensor:
    """The rows of ``F.La`` (the factor's multipliers) that hold the packed
    entries ``P.chain_tgt``: the effective-mass sweep reads them straight
    from the factor. A padding pair (entry 0, a diagonal) reads row 0: its
    column of ``Z`` is zero, so any finite value serves."""
    rows = P.cache.get("chain_rows")
    if rows is None:
        where = torch.full((sp.nnz,), -1, dtype=torch.long, device=P.chain_tgt.device)
        for lv, (lo, hi) in zip(sp.levels, F.prog.L_bounds):
            where[lv.xpos] = torch.arange(lo, hi, device=where.device)
        rows = where.index_select(0, P.chain_tgt)
        if bool(((rows < 0) & (P.chain_tgt != 0)).any()):  # only padding (entry 0) may be missing
            raise RuntimeError("contact fast path: a chain entry is not a multiplier of the factor")
        P.cache["chain_rows"] = rows = rows.clamp_(min=0)
    return rows


def _gather(P: _Plan, x: torch.Tensor, npnt: int) -> torch.Tensor:
    """``(nv, N)`` internal order -> ``(ns, 1, np, N)`` at each point's columns."""
    N = x.shape[-1]
    xs = torch.cat([x, x.new_zeros(1, N)], 0).index_select(0, P.sup_flat)
    return xs.view(P.ns, 1, npnt, N)


def _point_velocity(P: _Plan, Jc: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``J x`` at every point, ``(N, np, 3)``, for ``x (nv, N)`` internal order."""
    return (Jc * _gather(P, x, Jc.shape[2])).sum(0).permute(2, 1, 0)


def _sq3(v: torch.Tensor) -> torch.Tensor:
    """``(v * v).sum(-1)`` of ``v (N, np, 3)`` summed over the first axis of
    its batch-last view ``(3, np, N)`` (a view of ``(np, N)``): the same
    values (the three terms in order), several times faster than a sum over
    the last axis of this layout."""
    v3 = v.permute(2, 1, 0)
    return (v3 * v3).sum(0).T


def _law(contact, batch, N: int, phi, n, v_c, dt):
    """The force law at the points: ``v_n, v_t, law, f_n, f_t, c_n, k_n, s``."""
    from ._law import contact_law, per_point

    v_n = (v_c.permute(2, 1, 0) * n.permute(2, 1, 0)).sum(0).T  # (v_c * n).sum(-1), summed batch last
    v_t = v_c - v_n[..., None] * n
    p = contact._p
    shape = contact.geometry.point_shape
    law = {
        k: _flat(per_point(p[k], shape), batch, N)
        for k in ("stiffness", "damping", "friction", "normal_width", "stiction_width")
    }
    f_n, f_t, c_n, k_n, s = contact_law(phi, v_n, v_t, clamp_normal=p["clamp_normal"], dt=dt, slip2=_sq3(v_t), **law)
    return v_n, v_t, law, f_n, f_t, c_n, k_n, s


def _blend_scalars(law, v_t, f_n, s, inv_mass, dt):
    """The friction blend's scalars per point: ``mu``, ``mu f_n+ / s`` and
    ``gamma / s^2`` with ``gamma = |v_t|^2 / (|v_t|^2 + v*^2)``, ``v* = dt mu
    f_n+ inv_mass``, from the effective mass ``inv_mass (N, np)``."""
    mu = torch.broadcast_to(law["friction"], f_n.shape)
    fn_plus, _, _, _, gamma = friction_blend(mu, f_n, v_t, inv_mass, dt, _sq3(v_t))
    return mu, law["friction"] * fn_plus / s, gamma / (s * s)


def _last(t: torch.Tensor) -> torch.Tensor:
    """A per-point scalar ``(N, np)`` as a contiguous ``(np, N)`` (no copy when its memory already is)."""
    return t.T.contiguous()


def _blend(law, n3, v_t, f_n, c_n, k_n, s, inv_mass, dt):
    """Per-point damping ``C``, stiffness ``K`` and ``CK = C + dt K`` (3x3,
    world), as :func:`~backdrive.contact._model.row_matrices` on the
    reference path, from the effective mass ``inv_mass (N, np)``; also ``mu``
    and ``mu f_n+ / s`` ``(N, np)``. Batch last: ``n3 (3, np, N)`` (the
    normals) in, ``C``, ``K``, ``CK`` ``(3, 3, np, N)`` contiguous out (row,
    column, point, sample), so that the step's products with the Jacobian
    columns read them in order; ``v_t (N, np, 3)``. The operations are those of
    the batch-first formula ``mu f_n+ / s (I - n n^T - gamma / s^2 v_t v_t^T)
    + c_n n n^T`` element for element (the same values, bit for bit)."""
    mu, mu_fn_s, g2 = _blend_scalars(law, v_t, f_n, s, inv_mass, dt)
    if n3.stride(1) == 0 and n3.stride(2) == 0:  # one normal for all (a plane): n n^T once
        n3 = n3[:, :1, :1]
    nnT = n3[:, None] * n3[None]  # (3, 3, np, N) or (3, 3, 1, 1)
    vt3 = v_t.permute(2, 1, 0)
    fric = (_last(g2) * vt3)[:, None] * vt3[None]  # gamma / s^2 v_t v_t^T
    eye = torch.eye(3, dtype=nnT.dtype, device=nnT.device)[:, :, None, None]
    torch.sub(eye - nnT, fric, out=fric).mul_(_last(mu_fn_s))
    C = (_last(c_n) * nnT).add_(fric)
    Kst = _last(k_n) * nnT
    CK = (Kst * dt).add_(C)
    return C, Kst, CK, mu, mu_fn_s


def _base_turn(vt, R0, dt):
    """``b = dt R0 (w x v)`` ``(N, 1, 3)``, the base frame's turn over the step
    (the same at every point; ``_model.py``, ``implicit_terms``), or ``None``
    for a fixed base."""
    if R0 is None:
        return None
    return dt * rot(R0, cross(vt[3:6], vt[:3])).T[:, None, :]


def _mv(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``A x`` for ``A (..., 3, 3)`` and ``x (..., 3)`` (broadcast), as three
    column updates: at thousands of points a batched 3x3 matrix product
    costs about twice as much."""
    out = A[..., 0] * x[..., 0:1]
    return out.addcmul_(A[..., 1], x[..., 1:2]).addcmul_(A[..., 2], x[..., 2:3])


def _mv3(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """:func:`_mv` batch last: ``A x`` for ``A (3, 3, ...)`` and ``x (3, ...)``
    (broadcast; ``A`` of the result's full shape), the same operations."""
    out = A[:, 0] * x[0:1]
    return out.addcmul_(A[:, 1], x[1:2]).addcmul_(A[:, 2], x[2:3])


def _prediction(C, Kst, v_c3, b3, dt):
    """The forces' predicted change beyond ``CK J dt a``: ``K dt (J v + b) + C b``
    with ``b`` the base frame's turn (:func:`_base_turn`; ``None``: fixed base).
    Batch last: ``C``, ``Kst`` ``(3, 3, np, N)``, ``v_c3 (3, np, N)``, ``b3 (3, 1, N)``."""
    if b3 is not None:
        return _mv3(C, b3).add_(_mv3(Kst, dt * (v_c3 + b3)))
    return _mv3(Kst, dt * v_c3)


def _wrenches(Rp, pp, pt, force3, point_body, nb: int) -> torch.Tensor:
    """Body wrenches ``(N, nb, 6)`` (body frame at the origin) of the point
    forces ``force3 (3, np, N)``: summed straight into body order
    (``point_body``, the points' bodies), the points in order."""
    w = force3.new_empty(6, *force3.shape[1:])
    rot_t(Rp, force3, out=w[:3])
    rot_t(Rp, cross(pt - pp, force3), out=w[3:])
    return w.new_zeros(6, nb, w.shape[-1]).index_add_(1, point_body, w).permute(2, 1, 0)


def _jacobian(P: _Plan, Jc: torch.Tensor, nv: int) -> torch.Tensor:
    """The result's dense Jacobian ``(N, np, 3, nv)`` (coordinate order) of the
    columns ``Jc``: one scatter into the rows in coordinate order, and zeros
    written only where no column goes (no full zero fill, no reordering copy)."""
    _, _, npnt, N = Jc.shape
    Jd = Jc.new_empty((nv + 1) * 3 * npnt, N)
    Jd.index_fill_(0, P.dense_zero, 0.0).index_copy_(0, P.dense_coord, Jc.reshape(-1, N))
    return Jd.view(nv + 1, 3, npnt, N)[:nv].permute(3, 2, 1, 0)


#: The differentiable fields of the step's ContactResult, in the order of
#: _ImplicitStepFast's outputs (after the acceleration); then the private ones.
_FIELDS = (
    "point", "normal", "penetration", "normal_velocity", "slip_velocity",
    "normal_force", "friction_force", "force", "f_ext", "jacobian",
)
_PRIVATE = ("_c_n", "_k_n", "_mu_fn_over_s", "_s", "_mu")


class _Saved(NamedTuple):
    """What the forward computed that the backward reads (per step, at 1,024
    samples on the quadruped in float64 about 1.6 MB; ``Jc`` is 0.9 MB of it).
    Layouts as in :func:`_step`: ``(3, np, N)`` for ``pp``, ``pt``; ``(N, np,
    3)`` for the points' vectors; ``(N, np)`` for their scalars."""

    Rp: torch.Tensor
    pp: torch.Tensor
    pt: torch.Tensor
    n: torch.Tensor
    phi: torch.Tensor
    v_c: torch.Tensor
    v_n: torch.Tensor
    v_t: torch.Tensor
    f_n: torch.Tensor
    c_n: torch.Tensor
    k_n: torch.Tensor
    s: torch.Tensor
    mu: torch.Tensor
    mu_fn_s: torch.Tensor
    inv_mass: torch.Tensor
    law: dict
    Jc: torch.Tensor
    R0: torch.Tensor | None
    b: torch.Tensor | None  # (N, 1, 3) the base frame's turn
    x: torch.Tensor  # (N, np, 3): b + dt J a
    force: torch.Tensor
    CK: torch.Tensor  # (N, np, 3, 3)
    active: torch.Tensor | None  # (N, np) 0 at the points the unilateral step dropped (None: none dropped)


def _step(contact, robot, q, v, tau, dt, gravity, extra_damping, record: bool = False, friction=None, fric=None):
    """The fast step, no autograd: ``a (..., nv)``, the result's fields (a
    dict, batch shape first) and, with ``record``, what the backward needs
    (else ``None``). ``friction`` (:class:`JointFriction`) with its levels ``fric (nf,)``:
    the joints' bounded Coulomb friction solved with the step
    (:func:`_joint_friction`)."""
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
    keep = {} if record else None  # the twists V, for rnea_vjp_fast
    rhs = rhs - rnea_fast(robot, topo, K, vt, None, gt, None, keep)
    # The inertias about the origin before the CRBA sums them (mass_quadratic_vjp_fast's).
    inertias = K.packed[1:].clone() if record and K.packed is not None else None
    E = crba_entries_fast(robot, topo, sp, K)

    Rp, pp, phi, n, point, pt, Jc, R0 = _points(contact, P, K.R, K.p, K.Sl, K.Sa, robot.floating_base, N)
    v_c = _point_velocity(P, Jc, vt)
    v_n, v_t, law, f_n, f_t, c_n, k_n, s = _law(contact, batch, N, phi, n, v_c, dt)
    f_n0, f_t0, c_n0, k_n0 = f_n, f_t, c_n, k_n

    # The contact's effective mass: diag(J M^-1 J^T) = sum_k Z_k^2 / D_k
    # with Z = L^-T J^T. Z keeps the support of J (the sweep runs from a
    # coordinate to its ancestors), so it is swept along each point's
    # chain of columns, deepest first.
    FM = LTDLFactor(sp, topo, E)  # (E not modified: the factor works on its own copy)
    Lp = FM.La.index_select(0, _chain_rows(P, sp, FM))  # (sum_a a np, N), a-major
    Z = torch.empty_like(Jc)  # the deepest column's update reads Jc and writes Z (no copy of Jc first)
    Z[-1].copy_(Jc[-1])
    src = Jc
    for a in range(P.ns - 1, 0, -1):
        k0 = P.chain_start[a]
        La = Lp[k0 : k0 + a * npnt].view(a, 1, npnt, N)
        torch.addcmul(src[:a], La, Z[a : a + 1], value=-1.0, out=Z[:a])
        src = Z
    Dg = torch.cat([FM.D, FM.D.new_ones(1, N)], 0).index_select(0, P.sup_flat).view(P.ns, 1, npnt, N)
    Z2 = Z * Z if record else torch.mul(Z, Z, out=Z)  # Z is kept for the backward only with a record
    inv_mass = Z2.div_(Dg).sum(0).mean(0).T  # (N, np)

    b = _base_turn(vt, R0, dt)

    # The step's per-sample inputs, sample axis first or last: a re-solve of
    # some samples takes its rows of each (_Samples.take).
    inputs = _Samples(law, n, v_t, s, inv_mass, Jc, v_c, b, rhs, vt, N)

    def solve(X: _Samples, E, f_n, f_t, c_n, k_n, prev=None):
        """The step with the law's per-point outputs given: ``(C, Kst, mu,
        mu_fn_s, CK, pred, FA, at, fr, x, force, f_nn, vals)``, for the
        samples of ``X``; batch last: ``C``, ``Kst``, ``CK`` ``(3, 3, np,
        N)``, ``pred``, ``x`` (``dt J a``), ``force`` ``(3, np, N)``, ``f_nn``
        ``(N, np)`` (a view of ``(np, N)``), ``mu``, ``mu_fn_s`` ``(N, np)``.
        ``E`` (M's packed entries) gets the contact's matrix ``dt vals`` and
        the extra damping added in place; a re-solve passes
        the previous solve's ``E`` and ``prev`` (its ``vals``): then only
        ``dt (vals - prev)`` is added, exactly zero in a sample whose points
        all stay (no copy of ``M``'s entries is kept for a re-solve that may
        not come)."""
        Nx, Jc = X.N, X.Jc
        n3 = X.n.permute(2, 1, 0)  # (3, np, N)
        C, Kst, CK, mu, mu_fn_s = _blend(X.law, n3, X.v_t, f_n, c_n, k_n, X.s, X.inv_mass, dt)  # (3, 3, np, N)

        # dt J^T CK J into the packed entries of M, then the extra diagonal damping.
        G = Jc[:, 0:1] * CK[:, 0]
        G.addcmul_(Jc[:, 1:2], CK[:, 1]).addcmul_(Jc[:, 2:3], CK[:, 2])  # (CK J), (ns, 3, np, N)
        # Entries (sup[a], sup[b]), b <= a: J_a . (CK J)_b, one block of pairs per column a.
        vals = G.new_empty(P.ns * (P.ns + 1) // 2, npnt, Nx)
        k0 = 0
        for a in range(P.ns):
            out = vals[k0 : k0 + a + 1]
            torch.mul(G[: a + 1, 0], Jc[a, 0], out=out).addcmul_(G[: a + 1, 1], Jc[a, 1]).addcmul_(G[: a + 1, 2], Jc[a, 2])
            k0 += a + 1
        if P.pmask is not None:
            vals.mul_(P.pmask)
        E.index_add_(0, P.tgt, (vals if prev is None else vals - prev).view(-1, Nx), alpha=dt)
        if extra_damping is not None and prev is None:
            D = _to_internal(topo, extra_damping.expand(*batch, nv).reshape(N, nv))
            E.index_add_(0, sp.dpos, D, alpha=dt)

        # Right-hand side: J^T (f - dt K J v - (C + dt K) b).
        force0 = _last(f_n) * n3 + f_t.permute(2, 1, 0)  # (3, np, N)
        pred = _prediction(C, Kst, X.v_c.permute(2, 1, 0), None if X.b is None else X.b.permute(2, 1, 0), dt)
        free = force0 - pred  # (3, np, N)
        JTx = (Jc * free).sum(1)  # (ns, np, N)
        full = X.rhs.new_zeros(nv + 1, Nx).index_add_(0, P.sup_flat, JTx.view(-1, Nx))
        # (LTDLFactor(sp, topo, E, rhs) would carry the forward substitution along the factorisation, one
        # sweep less, about 2.5 % of the step at 4,096 samples in float64; its updates are fused
        # multiply-adds, so the step would differ from this one in the last bits: 1e-13 relative in
        # float64, 3e-5 in float32 where many points drop. Not taken: this step stays bit for bit.)
        FA = LTDLFactor(sp, topo, E)
        at = FA.solve_fast(X.rhs + full[:nv])
        fr = None
        if friction is not None:
            at, fr = _joint_friction(FA, topo, friction, fric, X.vt, at, dt)

        # The forces the step applied: f - pred - CK J dt a = f - C x - dt K (J v + x), x = b + dt J a.
        x = (Jc * _gather(P, at, Jc.shape[2])).sum(0).mul_(dt)  # (3, np, N)
        force = free.sub_(_mv3(CK, x))
        f_nn = (force * n3).sum(0).T  # (N, np)
        return C, Kst, mu, mu_fn_s, CK, pred, FA, at, fr, x, force, f_nn, vals

    C, Kst, mu, mu_fn_s, CK, pred, FA, at, fr, x, force, f_nn, vals = solve(inputs, E, f_n, f_t, c_n, k_n)
    fields_law = (c_n, k_n, mu_fn_s)
    active = None
    if contact.unilateral:
        # Points whose applied normal force is negative leave the step, which
        # is solved again (_model.unilateral_step, the reference's): the law's
        # outputs there are zero. A sample without a new dropped point keeps
        # its solve bit for bit. When few samples drop a point, only those
        # are solved again (their rows of every input, then of every output
        # written back); else the whole batch, where the others repeat their
        # solve exactly (mask 1).
        from ._model import UNILATERAL_PASSES

        for _ in range(UNILATERAL_PASSES):
            neg = f_nn < 0
            if active is not None:
                neg &= active > 0
            if not bool(neg.any()):
                break
            active = (~neg).to(f_nn.dtype) if active is None else active * (~neg).to(f_nn.dtype)
            f_n, c_n, k_n = f_n0 * active, c_n0 * active, k_n0 * active
            f_t = f_t0 * active[..., None]
            rows = neg.any(-1).nonzero()[:, 0] if N >= _SUBSET_MIN else None
            if rows is None or 2 * rows.numel() > N:
                C, Kst, mu, mu_fn_s, CK, pred, FA, at, fr, x, force, f_nn, vals = solve(
                    inputs, E, f_n, f_t, c_n, k_n, vals)
                continue
            # Only the samples with a new dropped point.
            Er = E.index_select(1, rows)
            sC, sKst, smu, smu_fn_s, sCK, spred, sFA, sat, sfr, sx, sforce, sf_nn, svals = solve(
                inputs.take(rows), Er, f_n[rows], f_t[rows], c_n[rows], k_n[rows], vals.index_select(-1, rows))
            E.index_copy_(1, rows, Er)
            C, Kst, CK, pred, x, force = (
                full.index_copy(-1, rows, part)  # new arrays (batch last)
                for full, part in zip((C, Kst, CK, pred, x, force), (sC, sKst, sCK, spred, sx, sforce)))
            mu, mu_fn_s, f_nn = (
                full.index_copy(0, rows, part)  # new arrays: the first solve's may be kept (fields_law)
                for full, part in zip((mu, mu_fn_s, f_nn), (smu, smu_fn_s, sf_nn)))
            at = at.index_copy(1, rows, sat)
            vals = vals.index_copy(-1, rows, svals)
            FA = _merge_factor(FA, sFA, rows)
            if fr is not None:  # (index, A_ff, g, c): the per-sample parts
                fr = (fr[0], *(full.index_copy(0, rows, part) for full, part in zip(fr[1:], sfr[1:])))
    fields = {
        "point": point, "normal": n, "penetration": phi, "normal_velocity": v_n, "slip_velocity": v_t,
        "normal_force": f_nn, "friction_force": (force - f_nn.T * n.permute(2, 1, 0)).permute(2, 1, 0),
        "force": force.permute(2, 1, 0),
        "_c_n": fields_law[0], "_k_n": fields_law[1], "_mu_fn_over_s": fields_law[2], "_s": s, "_mu": mu,
    }
    B = tuple(batch)
    fields = {k: t.reshape(*B, *t.shape[1:]) for k, t in fields.items()}
    # The dense Jacobian (about 7 % of the step at 4,096 samples in float64) and the body wrenches (about
    # 2 %) are outputs of the recorded step; without a record each is built when the result's field is
    # first read (ContactResult). Their inputs are not modified after this point (the closures hold them).
    jac = lambda: _jacobian(P, Jc, nv).reshape(*B, npnt, 3, nv)  # noqa: E731
    nb = robot.num_bodies
    wrench = lambda: _wrenches(Rp, pp, pt, force, contact.geometry.point_body, nb).reshape(*B, nb, 6)  # noqa: E731
    fields["jacobian"] = jac() if record else jac
    fields["f_ext"] = wrench() if record else wrench
    a = _from_internal(topo, at).reshape(*B, nv)
    if not record:
        return a, fields, None
    if b is not None:
        x += b.permute(2, 1, 0)
    # The backward reads the points' arrays batch first (views of the batch-last ones).
    S = _Saved(Rp, pp, pt, n, phi, v_c, v_n, v_t, f_n, c_n, k_n, s, mu, mu_fn_s, inv_mass, law, Jc, R0, b,
               x.permute(2, 1, 0), force.permute(2, 1, 0), CK.permute(3, 2, 0, 1), active)
    V = keep.get("V")  # halves of a (3, 2, na, N) pair with the accelerations when stacked: a copy holds half
    kin = (K.R, K.p, K.Sl, K.Sa, None if V is None else tuple(x.clone() for x in V), inertias)
    return a, fields, (B, N, g, FM, FA, at, vt, Z, Dg, kin, S, fr)


class JointFriction(NamedTuple):
    """The joints' bounded Coulomb friction of the simulator's implicit step
    (``sim/_implicit.py``), solved with the fast step.

    Per frictional joint ``f_j = F_j g_j``, ``g_j = clamp(-v1_j / w, -1, 1)``
    at the step's new velocity ``v1``: with ``A_ff = E^T A^-1 E`` (``E`` the
    joints' unit columns, ``A`` the step's matrix) and the frictionless new
    velocity ``v_free``, ``ratio`` finds ``g`` (the simulator's active-set
    iteration, :meth:`~backdrive.sim._implicit.ImplicitJointForces._friction_ratio`,
    the one implementation), then ``a = a_free + A^-1 E (F g)``.
    """

    index: torch.Tensor  # (nf,) generalised-velocity index of each frictional joint (coordinate order)
    width: float  # w, rad/s (m/s)
    ratio: object  # (A_ff (N, nf, nf), v_free (N, nf), F (nf,)) -> (g (N, nf), stick (N, nf) bool)
    reference: object  # (q, v, tau, extra_damping, F) -> (a, ContactResult): the same step in plain autograd


def _forward_columns(F: LTDLFactor, r: torch.Tensor) -> torch.Tensor:
    """``L^-T r`` in place on ``r (nv, C, N)`` (internal order) for the LTDL
    factor ``F`` (``A = L^T D L``): :meth:`LTDLFactor.solve_fast`'s first
    sweep on ``C`` columns at once."""
    C, N = r.shape[1], r.shape[2]
    for lv, Lk in zip(F.sp.levels, F.Ls):
        y = r.index_select(0, lv.k)
        r.index_add_(0, lv.anc, (Lk.view(-1, lv.d, 1, N) * y[:, None]).view(-1, C, N), alpha=-1.0)
    return r


def _joint_friction(FA: LTDLFactor, topo, spec: JointFriction, fric: torch.Tensor, vt, at, dt: float):
    """The friction stage of the step: ``(a, saved)`` from the frictionless
    ``a_free = at (nv, N)`` (internal order) and the factor ``FA`` of ``A``.

    ``A_ff = Z^T D^-1 Z`` with ``Z = L^-T E`` (one forward sweep of the nf
    unit columns), ``g`` by ``spec.ratio`` at ``v_free = v + dt a_free``,
    ``a = a_free + A^-1 E (F g)`` (one more solve). Joints with ``|g| < 1``
    stick: their force ``-F v1 / w`` is a damping ``F / w`` on the new
    velocity; the others slide with ``F g`` fixed (``spec.ratio`` tells
    which). The backward
    (:func:`_friction_adjoint`) differentiates that linear step, so the
    gradients are those of the reference's solve with its final active set.
    """
    nv, N = at.shape
    idx = spec.index if topo.dof_inv is None else topo.dof_inv.index_select(0, spec.index)
    nf = idx.numel()
    E = at.new_zeros(nv, nf, N)
    E[idx, torch.arange(nf, device=at.device)] = 1.0
    Z = _forward_columns(FA, E)
    Aff = torch.einsum("kiN,kjN->Nij", Z / FA.D[:, None], Z)  # (N, nf, nf)
    v_free = (vt.index_select(0, idx) + dt * at.index_select(0, idx)).T  # (N, nf)
    g, stick = spec.ratio(Aff, v_free, fric)
    r = at.new_zeros(nv, N).index_copy_(0, idx, (fric * g).T)
    a = at + FA.solve_fast(r)
    c = torch.where(stick, fric / spec.width, torch.zeros_like(g))  # (N, nf) the sticking joints' damping
    return a, (idx, Aff, g, c)


def _friction_adjoint(FA: LTDLFactor, fr, y: torch.Tensor, dt: float) -> torch.Tensor:
    """``A'^-1 r`` from ``y = A^-1 r`` (internal order ``(nv, N)``), ``A' = A
    + E P E^T`` the step's matrix with the sticking joints' damping, ``P =
    dt diag(c)`` (Woodbury, ``(P^-1 + A_ff)^-1 = P (I + A_ff P)^-1``, no
    inverse of ``P``, whose sliding entries are 0): ``y - A^-1 E P (I + A_ff
    P)^-1 y_f``."""
    idx, Aff, _, c = fr
    p = dt * c  # (N, nf)
    nf = idx.numel()
    Mq = Aff * p[:, None, :] + torch.eye(nf, dtype=y.dtype, device=y.device)
    u = p * torch.linalg.solve_ex(Mq, y.index_select(0, idx).T[..., None])[0][..., 0]
    return y - FA.solve_fast(y.new_zeros(y.shape).index_copy_(0, idx, u.T))


def _result(fields: dict):
    from ._model import ContactResult

    return ContactResult(**fields)


def implicit_acceleration_fast(contact, robot, q, v, tau, dt, gravity=None, extra_damping=None, friction=None, fric=None):
    """The implicit step's accelerations ``(..., nv)`` and the applied :class:`ContactResult`.

    Same arguments and results as :meth:`ContactModel.acceleration` with
    ``scheme="implicit"``; no autograd graph (call it under ``no_grad``;
    :func:`implicit_acceleration_recorded` records one). ``friction``
    (:class:`JointFriction`) and ``fric (nf,)``: the simulator's implicit joint
    friction, solved with the step (``robot`` then carries no friction of
    its own).
    """
    with torch.no_grad():
        a, fields, _ = _step(contact, robot, q, v, tau, dt, gravity, extra_damping, friction=friction, fric=fric)
        return a, _result(fields)


def dispatch(contact, robot: RobotModel, q, v, tau, gravity=None) -> str | None:
    """Which path the implicit step takes: ``"fast"`` (nothing records),
    ``"recorded"`` (one autograd node) or ``None`` (the reference path).

    The decision of :meth:`ContactModel.acceleration`, for callers that run
    the step with more than it takes (the simulator's implicit joint
    friction): ``choose("contact_step")`` without a gradient,
    ``choose("contact_step_grad")`` with one unless a parameter of the robot
    or the contact requires grad (:func:`reference_only`).
    """
    from ..kinematics._paths import choose, transforms_active, untracked
    from .._shapes import broadcast_shapes

    if transforms_active():
        return None
    n = broadcast_shapes(q.shape[:-1], v.shape[:-1], tau.shape[:-1]).numel()
    ok = fast_eligible(contact, robot)
    if untracked():
        return "fast" if choose("contact_step", n, ok) else None
    if choose("contact_step_grad", n, ok) and not reference_only(contact, robot, gravity):
        return "recorded"
    return None


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


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1)


def _field_grads(gf: dict, S: _Saved, P: _Plan, contact, B, N: int):
    """The result fields' gradients ``gf`` (name -> gradient, batch shape
    first) as gradients of the step's own quantities: ``G (N, np, 3)`` on
    the applied force (``None`` when no field reads it) and a dict of direct
    gradients on ``point`` ``(3, np, N)``, ``normal``, ``normal_velocity``,
    ``slip_velocity``, ``penetration`` (per point, ``(N, np[, 3])``), the
    Jacobian columns ``Jc`` (their layout), and the points' body poses
    ``pp`` (a world force) and ``Rp`` (a world torque), ``(3, np, N)``."""
    flat = {k: g.expand(*B, *g.shape[len(B):]).reshape(N, *g.shape[len(B):]) for k, g in gf.items()}
    n, force = S.n, S.force
    G, D = None, {}

    def add(key, g):
        nonlocal G
        if key == "force":
            G = g if G is None else G + g
        else:
            D[key] = g if key not in D else D[key] + g

    if "force" in flat:
        add("force", flat["force"])
    if "normal_force" in flat:  # f . n
        g = flat["normal_force"][..., None]
        add("force", g * n)
        add("normal", g * force)
    if "friction_force" in flat:  # f - (f . n) n
        g = flat["friction_force"]
        gn = _dot(g, n)[..., None]
        add("force", g - gn * n)
        add("normal", -_dot(force, n)[..., None] * g - gn * force)
    for name, key in (("point", "point"), ("normal", "normal"), ("penetration", "phi"),
                      ("normal_velocity", "v_n"), ("slip_velocity", "v_t")):
        if name in flat:
            add(key, flat[name] if name != "point" else flat[name].permute(2, 1, 0))
    if "f_ext" in flat:
        # w = [Rp^T f; Rp^T ((pt - pp) x f)] at each point's body (level order in,
        # body order out: the point's gradient is the row of its body).
        gw = flat["f_ext"].permute(2, 1, 0).index_select(1, contact.geometry.point_body)  # (6, np, N)
        f = force.permute(2, 1, 0)
        d = S.pt - S.pp
        gl, ga = rot(S.Rp, gw[:3]), rot(S.Rp, gw[3:])  # world axes
        add("force", (gl + cross(ga, d)).permute(2, 1, 0))
        gd = cross(f, ga)
        add("point", gd)
        add("pp", -gd)
        add("Rp", cross(gl, f) + cross(ga, cross(d, f)))
    if "jacobian" in flat:  # (N, np, 3, nv) coordinate order -> the columns' layout
        g = flat["jacobian"].permute(3, 2, 1, 0)  # (nv, 3, np, N), coordinate order
        g = torch.cat([g, g.new_zeros(1, *g.shape[1:])], 0).reshape(-1, N).index_select(0, P.dense_coord)
        add("Jc", g.view(S.Jc.shape))
    return G, D


def _law_vjp(contact, S: _Saved, g_fn, g_cn, g_kn, dt: float):
    """``(g_phi, g_vn)`` of :func:`~backdrive.contact._law.contact_law`'s
    ``f_n``, ``c_n``, ``k_n`` (at the step's ``dt``) from their gradients; its
    scalars recomputed from ``phi`` and ``v_n``. With ``z = phi / w_n``, ``a =
    sigmoid(z)``, ``a2 = sigmoid(z + dt r / w_n)``, ``r = (sqrt(v_n^2 +
    w_t^2) - v_n) / 2``: ``f_n = k w_n softplus(z) - d v_n a``, ``c_n = d a``,
    ``k_n = k a + d (a2 - a) / dt``, then the clamp at ``f_n = 0``."""
    L = S.law
    k, d, wn, wt = L["stiffness"], L["damping"], L["normal_width"], L["stiction_width"]
    phi, v_n = S.phi, S.v_n
    z = phi / wn
    act = torch.sigmoid(z)
    root = torch.sqrt(v_n * v_n + wt * wt)
    a2 = torch.sigmoid(z + dt * (0.5 * (root - v_n)) / wn)
    if contact._p["clamp_normal"]:
        f_raw = k * wn * F.softplus(z) - d * v_n * act
        g_fn = torch.where(f_raw >= 0, g_fn, 0.0)  # clamp_min's gradient
        on = f_raw > 0
        g_cn = torch.where(on, g_cn, 0.0)
        g_kn = torch.where(on, g_kn, 0.0)
    da = act * (1.0 - act) / wn  # d a / d phi
    da2 = a2 * (1.0 - a2) / wn  # d a2 / d z, over w_n
    g_phi = g_fn * (k * act - d * v_n * da) + g_cn * (d * da) + g_kn * (k * da + d * (da2 - da) / dt)
    g_vn = -g_fn * (d * act) + g_kn * (d * da2 * 0.5 * (v_n / root - 1.0))
    return g_phi, g_vn


def _contact_vjp(contact, robot, topo, P: _Plan, S: _Saved, kin, G, D: dict, lam, at, vt, Y, dt: float, want_q: bool):
    """The contact part of the step's backward, written out: the gradients of
    ``(J lam) . f + <fields>`` at fixed ``a`` (``f`` the applied force,
    ``G`` its total gradient ``J lam`` + the fields', ``D`` the fields'
    direct gradients, :func:`_field_grads`), by the reverse of each piece of
    the forward from the quantities it saved (:class:`_Saved`): the applied
    force ``f - C x - dt k_n n (n . (J v + x))`` with ``x = b + dt J a`` and
    ``C x = c_n n (n . x) + mu f_n+ / s (x - n (n . x) - gamma / s^2 v_t (v_t
    . x))``; the friction blend ``gamma = |v_t|^2 / (|v_t|^2 + v*^2)``, ``v*
    = dt mu f_n+ m_eff``; the force law (:func:`_law_vjp`); the split of the
    point velocity ``J v`` into ``v_n``, ``v_t``; the Jacobian columns
    (``R0 e_i``, ``R0 e_i x (c - p0)``, ``Sa x c + Sl``), the points and the
    terrain (a :class:`GroundPlane` in closed form, any other terrain by
    autograd on its query alone). The effective mass
    ``m_eff = mean_i (2 J_i y_i - y_i^T M y_i)`` at the maximiser ``y = M^-1
    J^T`` (``Y``, held: the derivative with respect to ``y`` is zero there)
    gives ``2 J' y`` here and ``- y^T M' y`` by
    :func:`~backdrive.dynamics._fast.mass_quadratic_vjp_fast`.

    Returns ``rnea_vjp_fast``'s ``extra``: ``(gp, t, gSl, gSa, gj, gv)`` (the
    poses' part ``None`` unless ``want_q``), ``gv (nv, N)`` internal order.
    """
    fb = robot.floating_base
    nv, npnt = robot.nv, contact.geometry.num_points
    N = vt.shape[-1]
    n, v_t, v_c, v_n, x = S.n, S.v_t, S.v_c, S.v_n, S.x
    c_n, k_n, mfs, s, mu, f_n = S.c_n, S.k_n, S.mu_fn_s, S.s, S.mu, S.f_n
    # ---- the applied force f0 - coef_n n - mfs x + mfs g2 (v_t . x) v_t, f0 = f_n n - mfs v_t
    fn_plus, vstar, vt2, den, gamma = friction_blend(mu, f_n, v_t, S.inv_mass, dt)
    s2 = s * s
    g2 = gamma / s2
    nx = _dot(n, x)
    nvx = nx + v_n
    tx = _dot(v_t, x)
    coef_n = (c_n - mfs) * nx + dt * k_n * nvx
    Gn, Gt, Gx = _dot(G, n), _dot(G, v_t), _dot(G, x)
    g_tx = mfs * g2 * Gt
    g_nvx = -Gn * dt * k_n
    g_nx = -Gn * (c_n - mfs) + g_nvx
    g_x = g_tx[..., None] * v_t + g_nx[..., None] * n - mfs[..., None] * G
    g_mfs = g2 * tx * Gt + Gn * nx - Gx - Gt
    g_g2 = mfs * tx * Gt
    g_cn = -Gn * nx
    g_kn = -Gn * dt * nvx
    g_fn = Gn
    if S.active is not None:  # the law's outputs were masked (zero at the dropped points): so are their gradients
        g_mfs, g_cn, g_kn, g_fn = g_mfs * S.active, g_cn * S.active, g_kn * S.active, g_fn * S.active
    g_n = (f_n - coef_n)[..., None] * G + g_nvx[..., None] * v_c + g_nx[..., None] * x
    g_vt = (mfs * (g2 * tx - 1.0))[..., None] * G + g_tx[..., None] * x
    g_vc = g_nvx[..., None] * n
    # ---- the friction blend: mfs = mu f_n+ / s, g2 = vt2 / den / s^2
    g_gamma = g_g2 / s2
    g_s = -(mfs * g_mfs + 2.0 * g2 * g_g2) / s
    g_den = -g_gamma * gamma / den  # (not over den^2: it underflows where den is tiny, at rest)
    g_vstar = 2.0 * vstar * g_den
    g_fn = g_fn + torch.where(f_n >= 0, mu / s * g_mfs + dt * mu * S.inv_mass * g_vstar, 0.0)
    g_inv = dt * mu * fn_plus * g_vstar
    g_vt = g_vt + (2.0 * (g_gamma / den + g_den) + g_s / s)[..., None] * v_t
    # ---- the force law, then v_n = v_c . n, v_t = v_c - v_n n
    g_phi, g_vn = _law_vjp(contact, S, g_fn, g_cn, g_kn, dt)
    if "phi" in D:
        g_phi = g_phi + D["phi"]
    if "v_n" in D:
        g_vn = g_vn + D["v_n"]
    if "v_t" in D:
        g_vt = g_vt + D["v_t"]
    if "normal" in D:
        g_n = g_n + D["normal"]
    g_vn = g_vn - _dot(g_vt, n)
    g_vc = g_vc + g_vt + g_vn[..., None] * n
    g_n = g_n + g_vn[..., None] * v_c - v_n[..., None] * g_vt
    # ---- v: v_c = J v, b = dt R0 (w x v_l)
    Jc = S.Jc
    gvc = g_vc.permute(2, 1, 0)  # (3, np, N)
    gv = vt.new_zeros(nv + 1, N).index_add_(0, P.sup_flat, (Jc * gvc).sum(1).view(-1, N))[:nv]
    if fb:
        gb = g_x.sum(1).T  # (3, N)
        R0 = S.R0
        w, vl = vt[3:6], vt[:3]
        gc = rot_t(R0, gb).mul_(dt)
        gv[3:6] += cross(vl, gc)
        gv[:3] += cross(gc, w)
    if not want_q:
        return None, None, None, None, None, gv
    # ---- q: the Jacobian columns' gradient (ns, 3, np, N)
    gJ = _gather(P, lam, npnt) * S.force.permute(2, 1, 0)[None]
    gJ.addcmul_(_gather(P, at, npnt), g_x.permute(2, 1, 0)[None], value=dt)
    gJ.addcmul_(_gather(P, vt, npnt), gvc[None])
    Yg = Y.view(-1, N).index_select(0, P.dense_index).view(Jc.shape)  # Y at the columns (its zero row: padding)
    gJ.addcmul_(Yg, g_inv.T[None, None], value=2.0 / 3.0)  # m_eff's 2 J y, averaged over the 3 rows
    if "Jc" in D:
        gJ += D["Jc"]
    nb = robot.num_bodies
    gp = vt.new_zeros(3, nb, N)
    tq = vt.new_zeros(3, nb, N)
    pt = S.pt
    g_pt = D["point"].clone() if "point" in D else torch.zeros_like(pt)
    off = 6 if fb else 0
    nsj = P.ns - off
    gSl = gSa = None
    if nsj:  # J_j = Sa_j x c + Sl_j at the point c (padding columns masked)
        gJj = gJ[off:]
        if P.jmask is not None:
            gJj = gJj * P.jmask
        Sa_ = kin[3].index_select(1, P.joints).view(3, npnt, nsj, N).permute(2, 0, 1, 3)
        g_pt += cross(gJj, Sa_, dim=1).sum(0)
        nm = topo.nm
        gSl = vt.new_zeros(3, nm, N).index_add_(1, P.joints, gJj.permute(1, 2, 0, 3).reshape(3, -1, N))
        gSa = vt.new_zeros(3, nm, N).index_add_(1, P.joints, cross(pt[None], gJj, dim=1).permute(1, 2, 0, 3).reshape(3, -1, N))
    if fb:  # J_i = R0 e_i, J_(3+i) = R0 e_i x (c - p0)
        R0 = S.R0
        r = pt - kin[1][:, 0:1]
        e = R0.transpose(0, 1)[:, :, None]  # (3 columns, 3, 1, N): R0 e_i
        h = cross(gJ[3:6], e, dim=1).sum(0)  # sum_i g_(3+i) x R0 e_i, (3, np, N)
        g_pt += h
        gp[:, 0] -= h.sum(1)
        gR = gJ[:3].sum(2) + cross(r[None], gJ[3:6], dim=1).sum(2)  # (3 columns, 3, N): d/d(R0 e_i)
        t0 = cross(e[:, :, 0], gR, dim=1).sum(0)
        t0 += cross(S.b[:, 0].T, gb)  # b = dt R0 (w x v_l)
        tq[:, 0] += t0
    # ---- points: c = centre - radius n, phi = radius - dist, (dist, n) = terrain(centre)
    radius = contact.geometry.point_radius
    g_n = g_n - radius[:, None] * g_pt.permute(2, 1, 0)
    centre = pt + radius[:, None] * n.permute(2, 1, 0)
    if type(contact.terrain) is GroundPlane:  # dist = c . n - h n_z, n constant
        g_c = g_pt - g_phi.T[None] * n.permute(2, 1, 0)
    else:
        with torch.enable_grad():
            cl = centre.permute(2, 1, 0).detach().requires_grad_(True)
            dist, nq = contact.terrain.query(cl)
            outs = [(o, g) for o, g in ((dist, -g_phi), (nq, g_n)) if o.requires_grad]
            got = torch.autograd.grad([o for o, _ in outs], cl, [g for _, g in outs], allow_unused=True)[0] if outs else None
        g_c = g_pt if got is None else g_pt + got.permute(2, 1, 0)
    # centre = Rp local + pp: the body's force g_c and torque (centre - pp) x g_c
    tb = cross(centre - S.pp, g_c)
    gb_ = g_c
    if "pp" in D:
        gb_ = gb_ + D["pp"]
    if "Rp" in D:
        tb = tb + D["Rp"]
    gp.index_add_(1, P.body_pos, gb_)
    tq.index_add_(1, P.body_pos, tb)
    # ---- the effective masses' - y^T M(q) y, weight -1/3 per row
    wq = (g_inv.T * (-1.0 / 3.0))[None].expand(3, npnt, N).reshape(3 * npnt, N)
    R, p, Sl, Sa, _, inertias = kin
    h, I = (None, None) if inertias is None else (inertias[:3], inertias[3:].view(3, 3, *inertias.shape[1:]))
    K = FastKin(R, p, Sl, Sa, _active(topo, robot.body_mass)[:, None], h, I)
    gj = mass_quadratic_vjp_fast(robot, topo, K, Y[:nv].view(nv, 3 * npnt, N), wq)  # (nj, N) internal
    return gp, tq, gSl, gSa, gj, gv


class _ImplicitStepFast(torch.autograd.Function):
    """The fast implicit step with its backward by the implicit function theorem.

    The step solves ``A a = r`` with ``A = M + dt D + dt J^T (C + dt K) J``,
    i.e. ``F(a; q, v, tau) = RNEA(q, v, a) + dt D a - tau - tau_joint(v) -
    J^T f(q, v, a) = 0`` where ``f`` is the applied force (linear in ``a``:
    ``dF/da = A``). For an incoming ``g_a``: ``lam = A^-1 g_a`` (the forward's
    LTDL factor of ``A`` reused), ``g_tau = lam``, ``g_D = -dt lam a`` and
    ``g_(q, v) = -lam^T dF/d(q, v)`` at fixed ``a``, all written out, no
    autograd graph: the contact part ``(J lam) . f`` (and the result fields'
    gradients) by :func:`_contact_vjp`, the reverse of each piece of the
    forward from the quantities it kept (:class:`_Saved`, the poses, motion
    subspaces, twists and inertias), the effective masses' ``M(q)`` by
    :func:`~backdrive.dynamics._fast.mass_quadratic_vjp_fast`, the joints'
    own forces in closed form; the contact's gradients of the poses, motion
    subspaces and coordinates then go through the one reverse pass of RNEA
    and forward kinematics (``rnea_vjp_fast``'s ``extra``). The fields'
    part through ``a`` (``-dt J^T CK g_f``) is added to ``g_a`` first.

    With the simulator's joint friction (:class:`JointFriction`, the
    friction levels ``F`` a fifth input) the step solved is ``A' a = r'``:
    the sticking joints' ``-F v1 / w`` adds ``dt F / w`` to ``A``'s diagonal
    and ``-F v / w`` to ``r``, the sliding ones' ``F g`` to ``r``; ``lam =
    A'^-1 g_a`` by Woodbury from ``A``'s factor (:func:`_friction_adjoint`),
    ``g_v`` gains ``-F / w lam`` on the sticking joints and ``g_F = lam g``.

    Double backward (``create_graph=True``) differentiates the reference path.
    """

    @staticmethod
    def forward(ctx, contact, robot, dt, gravity, friction, q, v, tau, extra_damping, fric):
        a, fields, saved = _step(contact, robot, q, v, tau, dt, gravity, extra_damping, record=True,
                                 friction=friction, fric=fric)
        ctx.contact, ctx.robot, ctx.dt, ctx.gravity, ctx.saved = contact, robot, dt, gravity, saved
        ctx.friction = friction
        ctx.save_for_backward(q, v, tau, extra_damping, fric)
        ctx.set_materialize_grads(False)
        private = [fields[k] for k in _PRIVATE]
        ctx.mark_non_differentiable(*private)
        return (a, *[fields[k] for k in _FIELDS], *private)

    @staticmethod
    def backward(ctx, ga, *gout):
        q, v, tau, ed, Ff = ctx.saved_tensors
        contact, robot, dt = ctx.contact, ctx.robot, ctx.dt
        gf = {k: g for k, g in zip(_FIELDS, gout) if g is not None}
        nq_, nv_, ntau, ned, nF = ctx.needs_input_grad[5:10]
        if torch.is_grad_enabled():
            return (None,) * 5 + _reference_grads(ctx, q, v, tau, ed, Ff, ga, gf)
        B, N, g, FM, FA, at, vt, Z, Dg, kin, S, fr = ctx.saved
        topo = fast_topology(robot)
        P = plan(contact, robot)
        nv, npnt = robot.nv, contact.geometry.num_points
        gat = at.new_zeros(nv, N) if ga is None else _to_internal(topo, ga.expand(*B, nv).reshape(N, nv))
        G, D = _field_grads(gf, S, P, contact, B, N) if gf else (None, {})
        if G is not None:  # the fields' part through a: f's is -dt CK J a, its adjoint -dt J^T CK G
            gx = _mv(S.CK, G).permute(2, 1, 0)  # (3, np, N)
            gat = gat - dt * _scatter(P, (S.Jc * gx[None]).sum(1), nv)
        lam = FA.solve_fast(gat)
        if fr is not None:
            lam = _friction_adjoint(FA, fr, lam, dt)
        lam_c = _from_internal(topo, lam)
        gq = gv = None
        if nq_ or nv_:
            Gl = _point_velocity(P, S.Jc, lam)
            Y = None
            if nq_:
                # Y = M^-1 J^T (nv + 1, 3, np, N) from Z / D, a zero row last (where the padding columns go)
                Y = Z.new_zeros((nv + 1) * 3 * npnt, N).index_copy_(0, P.dense_index, (Z / Dg).view(-1, N))
                Y = Y.view(nv + 1, 3, npnt, N)
                _back_columns(FM, Y[:nv].view(nv, 3 * npnt, N))
            extra = _contact_vjp(contact, robot, topo, P, S, kin, Gl if G is None else Gl + G, D, lam, at, vt, Y,
                                 dt, nq_)
            qf = q.detach().expand(*B, q.shape[-1]).reshape(N, -1)
            vf = v.detach().expand(*B, nv).reshape(N, nv)
            gq, gv = rnea_vjp_fast(robot, qf, vf, _from_internal(topo, at), g, -lam_c, kin[:5], extra)
            if nv_:  # the joints' own damping and friction, -d v - f tanh(v / w)
                off = 6 if robot.floating_base else 0
                th = torch.tanh(vf[:, off:] / DEFAULT_FRICTION_WIDTH)
                gv[:, off:] -= lam_c[:, off:] * (robot.damping + robot.friction * (1.0 - th * th) / DEFAULT_FRICTION_WIDTH)
                if fr is not None:  # the sticking joints' -F v / w
                    fi = ctx.friction.index
                    gv[:, fi] -= fr[3] * lam_c[:, fi]
        out_q = gq.reshape(*B, -1).sum_to_size(q.shape) if nq_ else None
        out_v = gv.reshape(*B, nv).sum_to_size(v.shape) if nv_ else None
        out_tau = lam_c.reshape(*B, nv).sum_to_size(tau.shape) if ntau else None
        out_ed = (-dt * lam_c * _from_internal(topo, at)).reshape(*B, nv).sum_to_size(ed.shape) if ned else None
        out_F = (lam_c[:, ctx.friction.index] * fr[2]).sum_to_size(Ff.shape) if nF else None
        return None, None, None, None, None, out_q, out_v, out_tau, out_ed, out_F


def _scatter(P: _Plan, x: torch.Tensor, nv: int) -> torch.Tensor:
    """``(ns, np, N)`` values at each point's columns -> their sums per coordinate, ``(nv, N)`` internal."""
    N = x.shape[-1]
    return x.new_zeros(nv + 1, N).index_add_(0, P.sup_flat, x.reshape(-1, N))[:nv]


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


def _reference_grads(ctx, q, v, tau, ed, Ff, ga, gf):
    """Double backward: the gradients by plain autograd over the reference path, with a graph."""
    from ..kinematics._paths import use_path

    needs = ctx.needs_input_grad[5:10]
    with torch.enable_grad(), use_path("reference"):
        ins = [None if x is None else (x if x.requires_grad else x.detach().requires_grad_(n)) for x, n in zip((q, v, tau, ed, Ff), needs)]
        if ctx.friction is not None:
            a, res = ctx.friction.reference(*ins)
        else:
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


def implicit_acceleration_recorded(contact, robot, q, v, tau, dt, gravity=None, extra_damping=None, friction=None, fric=None):
    """:func:`implicit_acceleration_fast` recording one autograd node
    (:class:`_ImplicitStepFast`): gradients with respect to ``q``, ``v``,
    ``tau``, ``extra_damping`` and the joint friction levels ``fric`` (see
    :func:`reference_only` for the rest)."""
    outs = _ImplicitStepFast.apply(contact, robot, float(dt), gravity, friction, q, v, tau, extra_damping, fric)
    fields = dict(zip(_FIELDS + _PRIVATE, outs[1:]))
    return outs[0], _result(fields)

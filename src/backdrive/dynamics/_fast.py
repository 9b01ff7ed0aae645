"""The fast path of the dynamics: the batch as the last, contiguous axis.

Every quantity is held component by component with the batch innermost:
rotations ``(3, 3, k, N)``, points and the linear and angular halves of
spatial vectors ``(3, k, N)``, generalised vectors ``(nv, N)``. A 3x3
product, a cross product or an inertia product is then a few elementwise
operations over the whole batch (no concatenation, no 6x6 matrices), and a
tree sum one add per depth level (``_schedule.down`` / ``up``; one product
with the ancestor matrix for a few hundred samples and under autograd). Bodies are kept in the
traversal's level order, so that every level is one slice. Forward
kinematics, the world inertias, RNEA, the mass matrix and its factorisation
stay in this layout from ``q`` to the accelerations.

The mass matrix is never assembled for forward dynamics: CRBA fills only the
entries ``M[i, j]`` with ``j`` an ancestor of ``i`` (or ``i`` itself) in the
tree of the coordinates (the floating base is a chain of its six
coordinates), and the factorisation ``M = L^T D L`` (Featherstone's LTDL,
*Rigid Body Dynamics Algorithms* section 6.5) keeps that sparsity: there is
no fill-in, and each depth level of coordinates is factorised in one batched
step, deepest first.

:func:`rnea_vjp_fast` is the reverse pass of RNEA and forward kinematics,
written out: the analytic backward of forward dynamics uses it.

Mimic joints (whose coordinates do not form a tree) get the dense mass
matrix and a batched Cholesky factorisation instead (:func:`dense_mass_matrix_fast`,
:class:`DenseFactor`), as does a mass matrix that must be differentiable.

The public functions choose this path (``kinematics._paths.choose``) from
``FAST_MIN_BATCH`` samples on; the reference path of ``_rnea``, ``_crba``
and ``_forward`` is what the tests hold it against.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from ..kinematics._fk import body_transforms_fast, coupling_matrix
from ..kinematics import _paths
from ..kinematics._kernels import cross, cross_add, div, mul, new, rot, rot_t, rows, skew
from ..kinematics._paths import untracked
from ..runtime import active_workspace
from ..kinematics._schedule import TreeSums, down, tree_schedule, tree_sums, up
from ..model import RobotModel, geometry_constants

__all__ = [
    "FastKin",
    "kinematics_fast",
    "rnea_fast",
    "forward_fast",
    "inverse_dynamics_fast",
    "mass_matrix_fast",
    "rnea_vjp_fast",
    "LTDLFactor",
    "f_ext_world_fast",
    "kinetic_energy_fast",
    "first_moment_fast",
    "aba_fast",
]


# ---------------------------------------------------------------------- topology


class FastTopo(NamedTuple):
    """The tree in the traversal's level order (``torch.cat(model.levels)``),
    the order of every body axis in this module (cached per model layout).

    Attributes:
        o, na, nm: first active body (0 floating, 1 fixed), active and moving counts.
        sums: the tree sums over the active bodies, level order
            (:func:`~backdrive.kinematics._schedule.down`, ``up``).
        act: ``(na,)`` body index of each active body in level order
            (``None`` when the levels are sorted: then a slice ``o:``).
        coupled: mimic joints present; then ``coord``, ``mult`` ``(nm,)``
            give each moving body's coordinate and multiplier, and generalised
            vectors stay in coordinate order.
        dof_perm: without mimic joints, the coordinates in the internal order
            (base, then joints in level order); ``None`` when it is the
            identity. ``dof_inv`` its inverse; ``arm_perm`` the joints' part.
        axis: ``(3, nm, 1)`` joint axes; is_rev, is_pri ``(nm, 1)``; has_pri.
        parent: parent of each body, level positions (``-1`` for the root).
        G: ``(nm, nj)`` coordinate rates to body rates (level order), the
            mimic multipliers included; upper, strict: ``(nm, nm)`` with
            ``upper[j, i] = 1`` when moving body ``j`` is ``i`` or one of its
            ancestors (``strict``: without ``i``).
        n_roots: active bodies whose parent is not active (the floating
            base; with a fixed base, the children of the welded root): the
            first ``n_roots`` positions.
    """

    o: int
    na: int
    nm: int
    sums: TreeSums
    act: torch.Tensor | None
    coupled: bool
    coord: torch.Tensor
    mult: torch.Tensor
    dof_perm: torch.Tensor | None
    dof_inv: torch.Tensor | None
    arm_perm: torch.Tensor | None
    axis: torch.Tensor
    is_rev: torch.Tensor
    is_pri: torch.Tensor
    has_pri: bool
    parent: tuple
    G: torch.Tensor
    upper: torch.Tensor
    strict: torch.Tensor
    n_roots: int


def fast_topology(model: RobotModel) -> FastTopo:
    return geometry_constants(model, "dynamics.fast_topology", _build_fast_topology)


def _build_fast_topology(model: RobotModel) -> FastTopo:
    dtype, device = model.dtype, model.device
    sched = tree_schedule(model)
    order = list(sched.order)
    nb = len(order)
    o = 0 if model.floating_base else 1
    na, nm = nb - o, nb - 1
    moving = [b - 1 for b in order[1:]]
    coord = model.joint_coordinate[1:].tolist()
    mult = model.joint_multiplier[1:].tolist()
    coupled = coord != list(range(nm)) or any(m != 1.0 for m in mult)
    t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    dof_perm = dof_inv = arm_perm = None
    if not coupled and not sched.sorted:
        off = 6 if model.floating_base else 0
        perm = list(range(off)) + [off + m for m in moving]
        inv = [0] * len(perm)
        for k, c in enumerate(perm):
            inv[c] = k
        dof_perm, dof_inv, arm_perm = t(perm), t(inv), t(moving)
    is_pri = model.joint_is_prismatic[1:][t(moving)]
    # Coordinates from the moving bodies, in level order.
    G = coupling_matrix(model).index_select(0, t(moving))
    # upper[j, i] = 1 when moving body j is i or one of its ancestors (level order).
    upper = sched.anc_level[1:, 1:].T.contiguous()
    return FastTopo(
        o=o,
        na=na,
        nm=nm,
        sums=tree_sums(model, o, level_order=True),
        act=None if sched.sorted else t(order[o:]),
        coupled=coupled,
        coord=t([coord[m] for m in moving]),
        mult=torch.tensor([mult[m] for m in moving], dtype=dtype, device=device),
        dof_perm=dof_perm,
        dof_inv=dof_inv,
        arm_perm=arm_perm,
        axis=model.joint_axis[1:][t(moving)].T[:, :, None].contiguous(),
        is_rev=(1.0 - is_pri)[:, None].contiguous(),
        is_pri=is_pri[:, None].contiguous(),
        has_pri=bool(is_pri.any()),
        parent=sched.parent_pos,
        G=G,
        upper=upper,
        strict=upper - torch.eye(nm, dtype=dtype, device=device),
        n_roots=sum(1 for k in range(o, nb) if sched.parent_pos[k] < o),
    )


def _active(topo: FastTopo, x: torch.Tensor) -> torch.Tensor:
    """Per-body parameter rows of the active bodies, level order."""
    return x[topo.o :] if topo.act is None else x.index_select(0, topo.act)


# ---------------------------------------------------------------------- kinematics


class FastKin(NamedTuple):
    """World-frame quantities at one configuration, batch last, level order.

    Attributes:
        R, p: ``(3, 3, nb, N)``, ``(3, nb, N)`` world-from-body poses, all bodies.
        Sl, Sa: ``(3, nm, N)`` linear and angular parts of each moving body's
            joint motion subspace (world frame, world origin).
        m: ``(na, 1)`` masses; h: ``(3, na, N)`` first moments;
        I: ``(3, 3, na, N)`` rotational inertias about the world origin
        (active bodies).
        packed: without autograd, ``(13, na, N)``: ``m``, ``h`` and ``I``
            stacked, the storage of ``h`` and ``I``. :func:`crba_entries_fast`
            sums it over subtrees in place, after which ``h`` and ``I`` hold
            the composite values: call it after everything else that reads them.
        S: without autograd, ``(6, nm, N)``: ``Sl`` and ``Sa`` stacked, their storage.
        base_frame: the floating base is at the origin, unrotated (``R[:, :, 0]
            = 1``, ``p[:, 0] = 0``; :func:`forward_fast`): its twists and
            wrenches need no transformation.
    """

    R: torch.Tensor
    p: torch.Tensor
    Sl: torch.Tensor
    Sa: torch.Tensor
    m: torch.Tensor
    h: torch.Tensor
    I: torch.Tensor | None
    c: torch.Tensor | None = None
    Ib: torch.Tensor | None = None
    packed: torch.Tensor | None = None
    S: torch.Tensor | None = None
    base_frame: bool = False


def kinematics_fast(
    model: RobotModel, topo: FastTopo, qf: torch.Tensor, origin: bool = True, identity_base: bool = False
) -> FastKin:
    """Poses, joint motion subspaces and world inertias for ``qf (N, nq)``, level order.

    With ``origin=False`` the rotational inertias about the world origin are
    not formed (``I`` is ``None``): inertia products then go through the
    centre of mass and the body frame (:func:`_inertia`), which costs a few
    more operations per product but no ``(3, 3, na, N)`` arrays, and a much
    cheaper backward; RNEA alone applies the inertias only twice.

    ``identity_base`` (no autograd): the floating base's pose in ``qf`` is
    ignored, the base is at the origin, unrotated (:func:`forward_fast`).
    """
    R, p = body_transforms_fast(model, qf, level_order=True, identity_base=identity_base)
    o = topo.o
    S = None
    if untracked():  # Sl and Sa as the halves of one array (S . F in two operations)
        S = new((6, topo.nm, qf.shape[0]), R)
        Sl, Sa, _ = motion_subspace_fast(topo, R, p, S)
    else:
        Sl, Sa, _ = motion_subspace_fast(topo, R, p)
    m = _active(topo, model.body_mass)[:, None]
    com, Ib = _active(topo, model.body_com), _active(topo, model.body_inertia)
    if not origin:
        c = rot(R[:, :, o:], com.T[:, :, None]).add_(p[:, o:])
        return FastKin(R, p, Sl, Sa, m, m * c, None, c, Ib.permute(1, 2, 0)[:, :, :, None])
    packed = factors = None
    if untracked():
        N = qf.shape[0]
        packed = new((13, topo.na, N), R)
        packed[0].copy_(m.expand(topo.na, N))
        factors = _active(topo, _inertia_factors(model.body_inertia))
    h, I = world_inertia_fast(R[:, :, o:], p[:, o:], m, com, Ib, packed, factors)
    return FastKin(R, p, Sl, Sa, m, h, I, packed=packed, S=S)


def motion_subspace_fast(topo: FastTopo, R: torch.Tensor, p: torch.Tensor, out: torch.Tensor | None = None):
    """Each moving body's joint motion subspace at the world origin, ``Sl``,
    ``Sa`` ``(3, nm, N)``, and the world joint axes ``aw``, from the poses
    ``R (3, 3, nb, N)``, ``p (3, nb, N)`` (level order); with ``out (6, nm,
    N)`` (no autograd) ``Sl`` and ``Sa`` are its halves."""
    Rm, pm = R[:, :, 1:], p[:, 1:]
    if out is not None:
        r0, r1, r2 = Rm.unbind(1)
        x0, x1, x2 = topo.axis.unbind(0)
        if not topo.has_pri:
            aw = torch.mul(r0, x0, out=out[3:]).addcmul_(r1, x1).addcmul_(r2, x2)
            return _cross_into(out[:3], pm, aw), aw, aw
        aw = mul(r0, x0).addcmul_(r1, x1).addcmul_(r2, x2)
        torch.mul(aw, topo.is_rev, out=out[3:])
        _cross_into(out[:3], pm, out[3:]).addcmul_(aw, topo.is_pri)
        return out[:3], out[3:], aw
    aw = rot(Rm, topo.axis)
    # A revolute joint moves the world-origin point at p x a; a prismatic one at a.
    if topo.has_pri:
        return cross(pm, aw) * topo.is_rev + aw * topo.is_pri, aw * topo.is_rev, aw
    return cross(pm, aw), aw, aw


def world_inertia_fast(Rt, pt, m, com, Ib, packed=None, factors=None):
    """First moments ``m c`` and rotational inertias ``R Ib R^T + m (|c|^2 1 - c c^T)``
    about the world origin, from ``Rt (3, 3, k, N)``, ``pt (3, k, N)``,
    ``m (k, 1)``, ``com (k, 3)`` and ``Ib (k, 3, 3)`` (at the centre of mass).
    With ``packed`` (``(13, k, N)``, no autograd) they are written into its
    rows 1-3 and 4-12 (:func:`_world_inertia_packed`; ``factors``: those of
    ``Ib``, :func:`_inertia_factors`)."""
    ct = rot(Rt, com.T[:, :, None]).add_(pt)
    if packed is not None:
        ht = torch.mul(m, ct, out=packed[1:4])
        U = _inertia_factors(Ib) if factors is None else factors
        return ht, _world_inertia_packed(Rt, ct, ht, U, packed[4:].view(3, 3, *ct.shape[1:]))
    ht = m * ct
    r0, r1, r2 = Rt.unbind(1)  # columns of R, (3, k, N) each
    b0, b1, b2 = Ib.permute(1, 2, 0)[:, :, :, None].unbind(0)  # rows of Ib, (3, k, 1)
    # Y = R Ib, Y[i, j] = sum_l R[i, l] Ib[l, j]; then I = Y R^T.
    Y = mul(r0[:, None], b0[None])
    Y.addcmul_(r1[:, None], b1[None]).addcmul_(r2[:, None], b2[None])
    y0, y1, y2 = Y.unbind(1)
    I = mul(y0[:, None], r0[None])
    I.addcmul_(y1[:, None], r1[None]).addcmul_(y2[:, None], r2[None])
    I.addcmul_(ct[:, None], ht[None, :], value=-1.0)
    d = (ct * ht).sum(0)
    if not untracked():
        eye = torch.eye(3, dtype=d.dtype, device=d.device)[:, :, None, None]
        return ht, I.addcmul_(eye, d)
    for i in range(3):  # the diagonal only: a third of the memory traffic
        I[i, i].add_(d)
    return ht, I


def _inertia_factors(Ib: torch.Tensor) -> torch.Tensor:
    """``U (k, 3, 3)`` with ``Ib = sum_l u_l u_l^T`` (``u_l = U[:, :, l]``)
    for symmetric positive semi-definite ``Ib (k, 3, 3)``: the columns of
    ``L D^(1/2)`` of ``Ib = L D L^T`` (``L`` unit lower triangular), so that
    ``u_l`` has zeros above entry ``l``. Computed in float64 where the device
    has it (a pivot that is zero, a massless or flat body, gives a zero
    column), once per inertia tensor and version (:data:`_FACTORS`; not
    cached while compiling)."""
    key = id(Ib)
    version = None  # no cache while compiling, nor for an inference tensor (no version counter)
    if not torch.compiler.is_compiling():
        try:
            version = Ib._version
        except RuntimeError:
            pass
    hit = _FACTORS.get(key) if version is not None else None
    if hit is not None and hit[0]() is Ib and hit[1] == version:
        return hit[2]
    A = Ib.detach()
    if A.device.type != "mps":  # no float64 there
        A = A.double()
    a, b, c = A[:, 0, 0], A[:, 1, 0], A[:, 2, 0]
    e, f = A[:, 2, 1], A[:, 1, 1]
    safe = lambda x, y: torch.where(y > 0, x / torch.where(y > 0, y, 1.0), 0.0)  # noqa: E731
    d0 = a.clamp_min(0.0)
    l10, l20 = safe(b, d0), safe(c, d0)
    d1 = (f - l10 * b).clamp_min(0.0)
    l21 = safe(e - l20 * b, d1)
    d2 = (A[:, 2, 2] - l20 * c - l21 * l21 * d1).clamp_min(0.0)
    s0, s1, s2 = d0.sqrt(), d1.sqrt(), d2.sqrt()
    z = torch.zeros_like(a)
    rows_ = [[s0, z, z], [l10 * s0, s1, z], [l20 * s0, l21 * s1, s2]]
    U = torch.stack([torch.stack(r, -1) for r in rows_], -2).to(Ib.dtype)
    if version is not None:
        if len(_FACTORS) >= 64:
            _FACTORS.clear()
        _FACTORS[key] = (weakref.ref(Ib), version, U)
    return U


#: :func:`_inertia_factors` per inertia tensor: ``id -> (weak reference,
#: version, factors)`` (a tensor changed in place has a new version).
_FACTORS: dict = {}


def _world_inertia_packed(Rt, ct, ht, U, I):
    """:func:`world_inertia_fast` without autograd, into ``I (3, 3, k, N)``:
    with ``Ib = sum_l u_l u_l^T`` (``U (k, 3, 3)`` from
    :func:`_inertia_factors`, ``u_l`` with zeros above entry ``l``),
    ``R Ib R^T = sum_l w_l w_l^T`` for ``w_l = R u_l`` (6 products per body
    instead of the 27 of ``R Ib``), and only the upper triangle formed (the
    lower one copied): 36 passes over the bodies instead of 66."""
    U = U.permute(1, 2, 0)[:, :, :, None]  # (3, 3, k, 1)
    r = Rt.unbind(1)  # columns of R, (3, k, N)
    w = []
    for col in range(3):
        wl = mul(r[col], U[col, col])
        for j in range(col + 1, 3):
            wl.addcmul_(r[j], U[j, col])
        w.append(wl)
    w0, w1, w2 = w
    for i in range(3):
        for j in range(i, 3):
            x = torch.mul(w0[i], w0[j], out=I[i, j])
            x.addcmul_(w1[i], w1[j]).addcmul_(w2[i], w2[j])
            if i == j:  # m (|c|^2 - c_i^2) = sum over the other two components
                for k in range(3):
                    if k != i:
                        x.addcmul_(ct[k], ht[k])
            else:
                x.addcmul_(ct[i], ht[j], value=-1.0)
    for i, j in ((1, 0), (2, 0), (2, 1)):
        I[i, j].copy_(I[j, i])
    return I


def f_ext_world_fast(topo: FastTopo, K: FastKin, f_ext: torch.Tensor):
    """Body-frame wrenches ``(N, nb, 6)`` at body origins -> world ``(3, na, N)``
    force and torque at the origin."""
    o = topo.o
    f = (f_ext[:, o:] if topo.act is None else f_ext.index_select(1, topo.act)).permute(2, 1, 0)
    R, p = K.R[:, :, o:], K.p[:, o:]
    fl = rot(R, f[:3])
    fa = rot(R, f[3:])
    fa = fa + cross(p, fl)
    return fl, fa


# ---------------------------------------------------------------------- spatial algebra
#
# Spatial vectors are pairs (linear, angular) of (3, k, N) arrays: no
# concatenation is ever needed.


def _inertia(K: FastKin, xl: torch.Tensor, xa: torch.Tensor, parts: list | None = None):
    """Spatial inertia of each active body (world origin) times ``(xl, xa)``:
    ``[m x_l + x_a x h; I x_a + h x x_l]``.

    Without ``K.I``: through the centre of mass ``c``, with the velocity
    there ``u = x_l + x_a x c``: ``[m u; R Ib R^T x_a + c x (m u)]``; then
    ``(u, R Ib R^T x_a)`` is appended to ``parts`` (which the reverse pass reuses).
    """
    if K.I is None:
        # In place on the fresh cross products (also under autograd: their
        # backward does not read them): a large array less each.
        u = cross(xa, K.c).add_(xl)
        fl = mul(K.m, u)
        Ra = K.R[:, :, _first_active(K) :]
        RLx = rot(Ra, rot(K.Ib, rot_t(Ra, xa)))
        if parts is not None:
            parts.append((u, RLx))
        return fl, cross(K.c, fl).add_(RLx)
    fl = cross(xa, K.h)
    fl = fl.addcmul(K.m, xl) if torch.is_grad_enabled() else fl.addcmul_(K.m, xl)
    return fl, cross_add(rot(K.I, xa), K.h, xl)


def _first_active(K: FastKin) -> int:
    """Index of the first active body (the poses cover all bodies)."""
    return K.R.shape[2] - K.m.shape[0]


def _base_to_world(R0, p0, x):
    """Base-frame twist ``(6, N)`` -> world twist at the origin, ``(3, 1, N)`` halves."""
    w = rot(R0, x[3:])
    lin = rot(R0, x[:3]) + cross(p0, w)
    return lin[:, None], w[:, None]


def _world_force_to_base(R0, p0, fl, fa, out=None):
    """World wrenches at the origin ``(3, ..., N)`` halves -> base frame at the
    base origin, ``(6, ..., N)``: ``[R^T f; R^T (n - p x f)]`` (into ``out``
    without autograd)."""
    shape = (3,) + (1,) * (fl.dim() - 2) + (fl.shape[-1],)
    R0e = R0.reshape((3,) + shape)
    p0e = p0.reshape(shape)
    n = fa - cross(p0e, fl)
    if out is not None:
        rot_t(R0e, fl, out[:3])
        rot_t(R0e, n, out[3:])
        return out
    return torch.cat([rot_t(R0e, fl), rot_t(R0e, n)], 0)


# ---------------------------------------------------------------------- RNEA


def _body_rates(topo: FastTopo, x: torch.Tensor) -> torch.Tensor:
    """Generalised rates ``(nv, N)`` (internal order) -> each moving body's
    joint rate ``(nm, N)``: ``multiplier * x[coordinate]`` with mimic joints."""
    xj = x[6:] if topo.o == 0 else x
    if not topo.coupled:
        return xj
    return xj.index_select(0, topo.coord) * topo.mult[:, None]


def base_quat_grad(T0: torch.Tensor, G0: torch.Tensor, p0: torch.Tensor, R0: torch.Tensor,
                   qf: torch.Tensor) -> torch.Tensor:
    """The gradient ``(N, 4)`` on a floating base's quaternion ``qf[:, 3:7]``
    from the base's subtree force ``G0 (3, N)`` and torque ``T0 (3, N)``
    about the world origin (reverse passes of forward kinematics), with the
    base at ``p0 (3, N)`` and rotated by ``R0 (3, 3, N)``: the torque about
    the base's origin ``tb`` pairs with a rotation of ``R0`` as
    ``gR0 = 0.5 [tb]x R0`` does, taken through the quaternion's matrix."""
    from ..spatial import quat_to_matrix

    tb = T0 - cross(p0, G0)
    tbx = skew(tb, 0)
    gR0 = 0.5 * (tbx[:, 0, None] * R0[0][None] + tbx[:, 1, None] * R0[1][None] + tbx[:, 2, None] * R0[2][None])
    with torch.enable_grad():
        quat = qf[:, 3:7].detach().requires_grad_(True)
        (gquat,) = torch.autograd.grad(quat_to_matrix(quat).permute(1, 2, 0), quat, gR0)
    return gquat


def _coordinate_forces(topo: FastTopo, x: torch.Tensor) -> torch.Tensor:
    """The transpose of :func:`_body_rates` for the joints: body ``(nm, N)``
    -> joint coordinates ``(nj, N)``."""
    if not topo.coupled:
        return x
    return x.new_zeros(topo.G.shape[1], x.shape[-1]).index_add(0, topo.coord, x * topo.mult[:, None])


def _with_base(fb: bool, base, lin, ang, out=None):
    """Prepend the floating base's column ``base`` (a pair of ``(3, 1, N)``)
    to the joints' ``(lin, ang)`` ``(3, nm, N)``: a fresh pair of ``(3, na, N)``
    arrays (with a fixed base, ``(lin, ang)`` as they are), or the pair
    ``out`` written (no autograd)."""
    if not fb and out is None:
        return lin, ang
    if out is None and (active_workspace() is None or not untracked()):
        return torch.cat([base[0], lin], 1), torch.cat([base[1], ang], 1)
    res = []
    for k, x in enumerate((lin, ang)):
        y = new((3, x.shape[1] + 1, x.shape[2]), x) if out is None else out[k]
        if fb:
            y[:, :1].copy_(base[k])
            y[:, 1:].copy_(x)
        else:
            y.copy_(x)
        res.append(y)
    return tuple(res)


def _velocities(topo: FastTopo, K: FastKin, vt: torch.Tensor, fb: bool, out=None):
    """Each moving body's joint rate ``qd (nm, N)``, its joint's twist
    ``J = S qd`` and every active body's world twist ``V`` (the sum of ``J``
    over its ancestors and the base's), pairs of ``(3, k, N)`` halves (``V``
    into the pair ``out`` where given: no autograd, and more samples than
    ``LEVEL_SUM_MIN_BATCH``, so that the tree sums work in place; ``J`` is
    then not formed, ``(None, None)``)."""
    qd = _body_rates(topo, vt)
    base = None
    if fb:
        base = (vt[:3, None], vt[3:6, None]) if K.base_frame else _base_to_world(K.R[:, :, 0], K.p[:, 0], vt[:6])
    if out is not None:
        # S qd straight into V's rows (no J arrays: the accelerations use
        # V x (S qd) = (V x S) qd, :func:`_accelerations`).
        o = 1 if fb else 0
        for x, S, b in zip(out, (K.Sl, K.Sa), base or (None, None)):
            torch.mul(S, qd, out=x[:, o:])
            if fb:
                x[:, :1].copy_(b)
        return qd, (None, None), (down(topo.sums, out[0]), down(topo.sums, out[1]))
    Jl, Ja = mul(K.Sl, qd), mul(K.Sa, qd)
    Vl, Va = _with_base(fb, base, Jl, Ja)
    # down() works in place above a few hundred samples: on fresh arrays.
    Vl, Va = down(topo.sums, Vl.clone() if not fb else Vl), down(topo.sums, Va.clone() if not fb else Va)
    return qd, (Jl, Ja), (Vl, Va)


def _cross_into(out, a, b, dim: int = 0):
    """``a x b`` into ``out`` along ``dim`` (``(3, ...)`` arrays by default,
    broadcasting; no autograd): the operations of
    :func:`~backdrive.kinematics._kernels.cross` (so the same values, bit for
    bit) without its stacked copy."""
    a0, a1, a2 = a.unbind(dim)
    b0, b1, b2 = b.unbind(dim)
    o0, o1, o2 = out.unbind(dim)
    torch.mul(a1, b2, out=o0).addcmul_(a2, b1, value=-1.0)
    torch.mul(a2, b0, out=o1).addcmul_(a0, b2, value=-1.0)
    torch.mul(a0, b1, out=o2).addcmul_(a1, b0, value=-1.0)
    return out


def _accelerations(topo, fb, Vml, Vma, Jl, Ja, Sl, Sa, qdd, at, R0, p0, grav, out=None, qd=None):
    """Every active body's world acceleration offset by gravity's, ``A - [g; 0]``
    (``(3, na, N)`` halves, no autograd): the sums over ancestors of each
    joint's ``V x (S qd) + S qdd`` (``Jl``, ``Ja``: ``S qd``, or ``None``
    with ``qd`` given: then ``(V x S) qd``), written in place into one array with the
    base's row (the base's acceleration, or zero) and gravity added once at
    the roots of the tree before the sum, which carries it to every body
    (into the pair ``out`` where given, as :func:`_velocities`)."""
    na, N = topo.na, Vml.shape[-1]
    Alf, Aaf = (new((3, na, N), Vml), new((3, na, N), Vml)) if out is None else out
    Al, Aa = (Alf[:, 1:], Aaf[:, 1:]) if fb else (Alf, Aaf)
    # The joint axis moves with its body: d/dt (S qd) = S qdd + V x (S qd).
    if Jl is None:  # J = S qd not formed (_velocities into out): (V x S) qd
        cross_add(_cross_into(Al, Vma, Sl), Vml, Sa).mul_(qd)
        _cross_into(Aa, Vma, Sa).mul_(qd)
    else:
        cross_add(_cross_into(Al, Vma, Jl), Vml, Ja)
        _cross_into(Aa, Vma, Ja)
    if qdd is not None:
        Al.addcmul_(Sl, qdd)
        Aa.addcmul_(Sa, qdd)
    if fb:
        if at is not None:
            bl, ba = _base_to_world(R0, p0, at[:6])
            torch.add(bl, grav, out=Alf[:, :1])
            Aaf[:, :1].copy_(ba)
        else:
            Alf[:, :1].copy_(grav.expand(3, 1, N))
            Aaf[:, :1].zero_()
    else:
        Alf[:, : topo.n_roots].add_(grav)
    return down(topo.sums, Alf), down(topo.sums, Aaf)


def rnea_fast(
    model: RobotModel,
    topo: FastTopo,
    K: FastKin,
    vt: torch.Tensor | None,
    at: torch.Tensor | None,
    gt: torch.Tensor,
    ft: tuple | None = None,
    keep: dict | None = None,
) -> torch.Tensor:
    """RNEA, batch last: ``vt``, ``at`` ``(nv, N)`` (``None``: zero), gravity
    ``gt (3, 1 or N)``, world wrenches ``ft`` (force, torque) ``(3, na, N)``;
    returns ``(nv, N)`` (``None`` with ``keep["replay"]``, after keeping the
    intermediates the reverse pass :func:`rnea_vjp_fast` needs). Generalised
    vectors are in the internal order (``FastTopo.dof_perm``)."""
    fb = model.floating_base
    nj = model.num_joints
    Sl, Sa = K.Sl, K.Sa
    R0, p0 = K.R[:, :, 0], K.p[:, 0]
    grav = -gt[:, None]  # (3, 1, N or 1): gravity is an upward acceleration of the world

    def with_base(base, lin, ang):
        return _with_base(fb, base, lin, ang)

    arm = model.armature if topo.arm_perm is None else model.armature.index_select(0, topo.arm_perm)
    # keep["replay"]: keep every intermediate the reverse pass needs
    # (rnea_vjp_fast); a given keep["V"] is reused instead of summed again.
    replay = keep is not None and keep.get("replay", False)
    parts = [] if replay else None
    qdd = None
    N = K.h.shape[-1]
    # Without autograd: A and V side by side in one (3, 2, na, N) array per
    # half, so that one pass of inertia products serves both (I A and h = I V:
    # half the operations, each reading the inertias once for both).
    stacked = (
        vt is not None
        and not replay
        and not (keep is not None and "V" in keep)
        and N > _paths.LEVEL_SUM_MIN_BATCH
        and K.I is not None
        and untracked()
    )
    if stacked:
        XL, XA = new((3, 2, topo.na, N), Sl), new((3, 2, topo.na, N), Sl)
        qd, (Jl, Ja), (Vl, Va) = _velocities(topo, K, vt, fb, (XL[:, 1], XA[:, 1]))
        if keep is not None:
            keep["V"] = (Vl, Va)
        Vml, Vma = (Vl[:, 1:], Va[:, 1:]) if fb else (Vl, Va)
        if at is not None:
            qdd = _body_rates(topo, at)
        _accelerations(topo, fb, Vml, Vma, Jl, Ja, Sl, Sa, qdd, at, R0, p0, grav, (XL[:, 0], XA[:, 0]), qd)
        fXl, fXa = _inertia(K._replace(h=K.h[:, None], I=K.I[:, :, None]), XL, XA)
        fl, fa, hl, ha = fXl[:, 0], fXa[:, 0], fXl[:, 1], fXa[:, 1]
        # f = I A + V x* (I V), V x* h = [w x h_l; w x h_a + v x h_l].
        fl = cross_add(fl, Va, hl)
        fa = cross_add(cross_add(fa, Va, ha), Vl, hl)
    elif vt is not None:
        if keep is not None and "V" in keep:
            qd = _body_rates(topo, vt)
            Jl, Ja = mul(Sl, qd), mul(Sa, qd)
            Vl, Va = keep["V"]
        else:
            qd, (Jl, Ja), (Vl, Va) = _velocities(topo, K, vt, fb)
        if keep is not None:
            keep["V"] = (Vl, Va)
        Vml, Vma = (Vl[:, 1:], Va[:, 1:]) if fb else (Vl, Va)
        if at is not None:
            qdd = _body_rates(topo, at)
        if untracked():
            Al, Aa = _accelerations(topo, fb, Vml, Vma, Jl, Ja, Sl, Sa, qdd, at, R0, p0, grav)
        else:
            # The joint axis moves with its body: d/dt (S qd) = S qdd + V x (S qd).
            Al = cross_add(cross(Vma, Jl), Vml, Ja)
            Aa = cross(Vma, Ja)
            if at is not None:
                Al, Aa = Al.addcmul(Sl, qdd), Aa.addcmul(Sa, qdd)
            if fb:
                if at is not None:
                    b = _base_to_world(R0, p0, at[:6])
                else:
                    b = (Al.new_zeros(3, 1, Al.shape[-1]), Al.new_zeros(3, 1, Al.shape[-1]))
                Al, Aa = with_base(b, Al, Aa)
            Al, Aa = down(topo.sums, Al), down(topo.sums, Aa)
            Al = Al + grav
        fl, fa = _inertia(K, Al, Aa, parts)
        hl, ha = _inertia(K, Vl, Va, parts)
        if replay:
            keep.update(qd=qd, qdd=qdd, J=(Jl, Ja), A=(Al, Aa), h=(hl, ha), IA=parts[0], IV=parts[1])
        # f = I A + V x* (I V), V x* h = [w x h_l; w x h_a + v x h_l].
        fl = cross_add(fl, Va, hl)
        fa = cross_add(cross_add(fa, Va, ha), Vl, hl)
    elif at is not None:
        qdd = _body_rates(topo, at)
        Al, Aa = with_base(_base_to_world(R0, p0, at[:6]) if fb else None, Sl * qdd, Sa * qdd)
        Al, Aa = down(topo.sums, Al), down(topo.sums, Aa)
        fl, fa = _inertia(K, Al + grav, Aa)
    else:
        # Statics under gravity alone: f = I [-g; 0] = [-m g; h x (-g)].
        fl = K.m * grav
        fa = cross(K.h, grav)
    if ft is not None:
        fl, fa = fl - ft[0], fa - ft[1]
    if fl.shape[-1] != N:
        fl = fl.expand(3, topo.na, N).clone()
    Fl, Fa = up(topo.sums, fl), up(topo.sums, fa)
    if replay:  # the reverse pass needs the forces, not tau
        keep["F"] = (Fl, Fa)
        return None
    Fml, Fma = (Fl[:, 1:], Fa[:, 1:]) if fb else (Fl, Fa)
    if untracked():  # S . F component by component: no (3, nm, N) products
        tau_b = mul(Sl[0], Fml[0])
        for X, Y in ((Sl, Fml), (Sa, Fma)):
            for c in range(3):
                if X is not Sl or c:
                    tau_b.addcmul_(X[c], Y[c])
    else:
        tau_b = (Sl * Fml).sum(0) + (Sa * Fma).sum(0)  # (nm, N)
    tau = _coordinate_forces(topo, tau_b)
    if at is not None and nj:
        tau = tau.addcmul(arm[:, None], at[6:] if fb else at)
    if fb:
        if K.base_frame:
            tau = torch.cat([Fl[:, 0], Fa[:, 0], tau.expand(nj, N)], 0)
        else:
            tau = torch.cat([_world_force_to_base(R0, p0, Fl[:, 0], Fa[:, 0]), tau.expand(nj, N)], 0)
    return tau


# ---------------------------------------------------------------------- sparse CRBA and LTDL


class _Level(NamedTuple):
    d: int  # depth: number of ancestors of each coordinate in the level
    k: torch.Tensor  # (n,) coordinates of the level
    xpos: torch.Tensor  # (n d,) entries M[k, anc_b(k)]
    dpos: torch.Tensor  # (n,) entries M[k, k]
    anc: torch.Tensor  # (n d,) the ancestors anc_b(k)


class _Sparsity(NamedTuple):
    """Where the entries of ``M`` live in the packed ``(nnz, N)`` array, and
    the LTDL schedule (levels of coordinates, deepest first)."""

    nnz: int
    joint_diag: torch.Tensor  # entries M[j, j] of the joint coordinates
    blocks: tuple  # (j0, i0, (dj1, di1), A, (dj2, di2), B): the pairs of each block (_pair_blocks), in order
    npairs: int  # joint pairs; the first nm are the diagonal M[i, i] in order
    pair_flat: torch.Tensor  # the pairs in packed order as j nm + i
    levels: tuple
    dpos: torch.Tensor  # (nv,) diagonal entries
    base_pairs: tuple  # floating base: (r, c) of the 21 packed lower-triangle entries
    base_rows: torch.Tensor | None  # (21,) their rows in the composite inertias C viewed (13 na, N)
    base_sign: torch.Tensor | None  # (21, 1) and the factors (1, -1 or 0) that make them entries
    entry_rc: torch.Tensor  # (nnz, 2) internal (row, column) of each packed entry
    rows: "_RowPlan"  # the factorisation's layout: one row of entries per coordinate
    programs: dict  # batch size -> the blocks' as_strided arguments (_pair_program)


class _RowPlan(NamedTuple):
    """The layout :class:`LTDLFactor` works in: coordinate ``c`` (with ``d``
    ancestors) as one run of ``d + 2`` rows, ``r_c, M[c, anc_0(c)], ...,
    M[c, anc_{d-1}(c)], M[c, c]`` (ancestors root first; ``r`` a right-hand
    side), the coordinates of each LTDL level one block ``(n, d + 2)``. An
    ancestor's ancestors are a prefix of the chain, so eliminating ``k``
    updates, for each ancestor ``a``, the first ``a + 2`` rows of ``a``'s run
    by the first ``a + 2`` of ``k``'s: one in-place ``addcmul`` on two slices,
    several children at once where their ancestors' runs are evenly spaced
    (no product array and no scatter), and the forward substitution
    ``L^T y = r`` rides along in the first row.

    A floating base's six coordinates are a chain above every joint, shared
    by all the coordinates of a level, so their updates could not be
    batched over children: six small operations per joint coordinate. Their
    runs are therefore padded to 7 rows each (``base``: the first row, then
    coordinates 0 to 5), and each joint coordinate updates all six in one
    operation on a ``(6, 7, N)`` strided view (the padding rows take
    products nobody reads: 42 rows written for 27, in one parallel
    operation instead of six small ones)."""

    src: torch.Tensor  # (rows,) packed position of each entry of the layout
    blocks: tuple  # per level (sp.levels order): first row of its block
    updates: tuple  # per level: (first, stride, count, k0, a), rows as in the docstring
    dpos: torch.Tensor  # (nv,) the diagonal entries in the layout
    rpos: torch.Tensor  # (nv,) the right-hand side's entries in the layout
    base: int | None  # floating base: first row of its six padded runs (see above)
    programs: dict  # batch size -> its _LTDLProgram (built on first use)


def _sparsity(model: RobotModel) -> _Sparsity:
    return geometry_constants(model, "dynamics.ltdl", _build_sparsity)


def _pair_blocks(pairs: list) -> list:
    """Cover the joint pairs ``(j, i)`` (``j`` an ancestor of ``i`` or ``i``
    itself) by strided blocks, each pair once: a block is ``(j0, i0, d1, A,
    d2, B)``, the pairs ``(j0 + a dj1 + b dj2, i0 + a di1 + b di2)`` for
    ``a < A``, ``b < B``, with ``di > 0`` and ``dj`` either ``di`` (a run
    at one distance in the level order) or 0 (one ancestor for several
    bodies: a broadcast). Each block is then a strided view of the ``(6,
    nm, N)`` arrays of ``S`` and ``F`` (no gather).

    The diagonal comes first, as one run. Then greedily the largest block
    left, over runs (``B = 1``) and, where that needs fewer blocks in all,
    two-dimensional blocks (the G1 humanoid: 20 blocks instead of 23 runs;
    0.1 s once per model. Any ``dj >= 0`` gave 16 blocks, but in 1.5 s. A
    chain such as the Panda's stays one run per distance)."""
    diag = sorted(x for x in pairs if x[0] == x[1])
    head = [(diag[0][0], diag[0][1], (1, 1), len(diag), (0, 1), 1)] if diag else []
    rest = [x for x in pairs if x[0] != x[1]]
    one, two = _greedy_blocks(rest, False), _greedy_blocks(rest, True)
    return head + (two if len(two) < len(one) else one)


def _greedy_blocks(pairs: list, two_d: bool) -> list:
    left = set(pairs)
    blocks = []
    while left:
        best = None
        for p in sorted(left, key=lambda x: (x[1], x[0])):
            runs = {}
            for q in left:  # the directions toward the other pairs, and the run along each
                d = (q[0] - p[0], q[1] - p[1])
                if d[1] > 0 and d[0] in (0, d[1]) and d not in runs:
                    n = 1
                    while (p[0] + d[0] * n, p[1] + d[1] * n) in left:
                        n += 1
                    runs[d] = n
            cands = [(n, (d, n, (0, 1), 1)) for d, n in runs.items()] or [(1, ((0, 1), 1, (0, 1), 1))]
            if two_d:
                long = sorted(d for d, n in runs.items() if n > 1)
                for x, d1 in enumerate(long):
                    for d2 in long[x + 1 :]:
                        if d1[0] * d2[1] == d1[1] * d2[0]:
                            continue  # parallel: a block would hold some pairs twice
                        B = None
                        for a in range(runs[d1]):
                            o = (p[0] + d1[0] * a, p[1] + d1[1] * a)
                            n = 0
                            while (B is None or n < B) and (o[0] + d2[0] * n, o[1] + d2[1] * n) in left:
                                n += 1
                            B = n  # never more than the rows before
                            if B < 2:
                                break
                            cands.append(((a + 1) * B, (d1, a + 1, d2, B)))
            for size, c in cands:
                if best is None or size > best[0]:
                    best = (size, p, c)
        _, p, (d1, A, d2, B) = best
        blocks.append((p[0], p[1], d1, A, d2, B))
        for a in range(A):
            for b in range(B):
                left.discard((p[0] + d1[0] * a + d2[0] * b, p[1] + d1[1] * a + d2[1] * b))
    return blocks


def _build_sparsity(model: RobotModel) -> _Sparsity:
    device = model.device
    fb = model.floating_base
    parent = list(fast_topology(model).parent)  # level order
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
    base_pairs, base_rows, base_sign = [], [], []
    if fb:
        # The base's block [[m 1, -[h]x], [[h]x, I]] from the rows of C (m, h,
        # I of the whole tree: component t of the root at row t nb).
        for r in range(6):
            for c in range(r + 1):
                pos[(r, c)] = len(pos)
                base_pairs.append((r, c))
                if r < 3:
                    t_, sign = 0, float(r == c)
                elif c < 3:  # [h]x[i, j] = -eps_ijl h_l
                    i, j = r - 3, c
                    t_, sign = 1 + (3 - i - j) % 3, (0.0 if i == j else (-1.0 if (j - i) % 3 == 1 else 1.0))
                else:
                    t_, sign = 4 + 3 * (r - 3) + (c - 3), 1.0
                base_rows.append(t_ * nb)
                base_sign.append(sign)
        for c in range(6):
            for i in range(nm):
                pos[(off + i, c)] = len(pos)
    # Joint pairs (j ancestor of i or i itself), covered by strided blocks
    # (_pair_blocks): each is a strided view of the (6, nm, N) arrays, so no
    # gather copies them. The diagonal comes first, in order.
    pairs = []
    for i in range(nm):
        chain = [a - off for a in ancs[off + i] if a >= off] + [i]
        pairs.extend((j, i) for j in chain)
    pair_blocks = _pair_blocks(pairs)
    ordered = [(j0 + d1[0] * a + d2[0] * b, i0 + d1[1] * a + d2[1] * b)
               for j0, i0, d1, A, d2, B in pair_blocks for a in range(A) for b in range(B)]
    assert sorted(ordered) == sorted(pairs)
    for j, i in ordered:
        pos[(off + i, off + j)] = len(pos)
    t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    by_depth = {}
    for d in range(nv):
        by_depth.setdefault(len(ancs[d]), []).append(d)
    levels = []
    for depth in sorted(by_depth, reverse=True):
        if depth == 0:
            continue
        ks = by_depth[depth]
        xpos, dpos, anc = [], [], []
        for k in ks:
            ak = ancs[k]
            dpos.append(pos[(k, k)])
            for b in range(depth):
                xpos.append(pos[(k, ak[b])])
                anc.append(ak[b])
        t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        levels.append(_Level(depth, t(ks), t(xpos), t(dpos), t(anc)))
    t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    # The factorisation's layout: the levels' blocks (deepest first), then the roots.
    order = [k for depth in sorted(by_depth, reverse=True) for k in by_depth[depth]]
    start, src = {}, []
    for k in order:
        if fb and k < off:
            continue  # the base's runs: padded, below
        start[k] = len(src)
        src.append(pos[(k, k)])  # the right-hand side's row: filled by the caller
        src.extend(pos[(k, a)] for a in ancs[k])
        src.append(pos[(k, k)])
    base = len(src) if fb else None
    for k in range(off):  # coordinate k: k + 2 rows, then 5 - k of padding (any entry)
        start[k] = len(src)
        src.extend([pos[(k, k)]] + [pos[(k, a)] for a in ancs[k]] + [pos[(k, k)]] * (off - k))
    blocks, updates = [], []
    for lv_depth in sorted(by_depth, reverse=True):
        if lv_depth == 0:
            continue
        ks = by_depth[lv_depth]
        blocks.append(start[ks[0]])
        ups = []
        for a in range(lv_depth):
            if fb and lv_depth >= off and a < off:
                continue  # the base's six runs in one operation (LTDLFactor)
            # The ancestors at depth a are one level: runs of a + 2 rows.
            tg = [start[ancs[k][a]] for k in ks]
            i = 0
            while i < len(ks):
                j = i + 1
                step = tg[j] - tg[i] if j < len(ks) else a + 2
                if step > 0:
                    while j < len(ks) and tg[j] - tg[j - 1] == step:
                        j += 1
                else:  # a shared ancestor: one child at a time
                    step = a + 2
                ups.append((tg[i], step, j - i, i, a))
                i = j
        updates.append(tuple(ups))
    rowplan = _RowPlan(
        src=t(src),
        blocks=tuple(blocks),
        updates=tuple(updates),
        dpos=t([start[c] + len(ancs[c]) + 1 for c in range(nv)]),
        rpos=t([start[c] for c in range(nv)]),
        base=base,
        programs={},
    )
    return _Sparsity(
        nnz=len(pos),
        joint_diag=t([pos[(off + i, off + i)] for i in range(nm)]),
        blocks=tuple(pair_blocks),
        npairs=len(ordered),
        pair_flat=t([j * nm + i for j, i in ordered]),
        levels=tuple(levels),
        dpos=t([pos[(d, d)] for d in range(nv)]),
        base_pairs=tuple(base_pairs),
        base_rows=t(base_rows) if fb else None,
        base_sign=torch.tensor(base_sign, dtype=model.dtype, device=device)[:, None] if fb else None,
        entry_rc=t([rc for rc, _ in sorted(pos.items(), key=lambda x: x[1])]),
        rows=rowplan,
        programs={},
    )


def _composite_forces(model: RobotModel, topo: FastTopo, K: FastKin, out: torch.Tensor | None = None):
    """Composite inertias ``C (13, na, N)`` (``m``, ``h``, ``I`` of every
    active body's subtree at the world origin) and ``F_i = Ic_i S_i``, the
    force that moving joint ``i`` alone, at unit acceleration, needs from its
    subtree, ``(3, nm, N)`` halves (into ``out (6, nm, N)``, no autograd).
    Without autograd ``K.packed`` is summed in place (see :class:`FastKin`)."""
    na = topo.na
    N = K.h.shape[-1]
    if K.packed is not None:
        packed = K.packed
    else:
        packed = torch.cat([K.m[None].expand(1, na, N), K.h, K.I.reshape(9, na, N)], 0)  # (13, na, N)
    C = up(topo.sums, packed)
    Cm = C[:, 1:] if model.floating_base else C
    m, hc, Ic = Cm[0], Cm[1:4], Cm[4:].reshape(3, 3, -1, N)
    # F_i = Ic_i S_i: [m Sl + Sa x h; I Sa + h x Sl].
    if out is not None:
        Fl = _cross_into(out[:3], K.Sa, hc).addcmul_(m, K.Sl)
        (i0, i1, i2), (s0, s1, s2) = Ic.unbind(1), K.Sa.unbind(0)
        Fa = cross_add(torch.mul(i0, s0, out=out[3:]).addcmul_(i1, s1).addcmul_(i2, s2), hc, K.Sl)
        return C, Fl, Fa
    Fl = cross(K.Sa, hc).addcmul_(m, K.Sl)
    Fa = cross_add(rot(Ic, K.Sa), hc, K.Sl)
    return C, Fl, Fa


def _base_inertia(C0: torch.Tensor, R0: torch.Tensor, p0: torch.Tensor):
    """The whole tree's spatial inertia in the base frame at the base origin,
    from its composite ``C0 (13, N)`` at the world origin: mass ``(N,)``, the
    skew matrix of the first moment ``[h]x`` ``(3, 3, N)`` and the
    rotational inertia ``(3, 3, N)``."""
    N = C0.shape[-1]
    mt, ht, It = C0[0], C0[1:4], C0[4:].reshape(3, 3, N)
    hp = ht - mt * p0  # first moment about the base origin
    # I about p: I_O + (m |p|^2 - 2 p.h) 1 + h p^T + p h^T - m p p^T.
    mp = mt * p0
    s = (p0 * (mp - 2.0 * ht)).sum(0)
    Ip = It + ht[:, None] * p0[None] + p0[:, None] * (ht - mp)[None]
    if untracked():
        for i in range(3):
            Ip[i, i].add_(s)
    else:
        Ip = Ip + torch.eye(3, dtype=s.dtype, device=s.device)[:, :, None] * s
    # Y = Ip R0, then Ib = R0^T Y.
    Y = Ip[:, 0, None] * R0[0][None]
    Y.addcmul_(Ip[:, 1, None], R0[1][None]).addcmul_(Ip[:, 2, None], R0[2][None])
    Ib = R0[0][:, None] * Y[0][None]
    Ib.addcmul_(R0[1][:, None], Y[1][None]).addcmul_(R0[2][:, None], Y[2][None])
    return mt, skew(rot_t(R0, hp), 0), Ib


def _all_pairs(Sl, Sa, Fl, Fa) -> torch.Tensor:
    """``P[j, i] = S_j . F_i`` for every pair of moving bodies, ``(nm, nm, N)``
    (in place on a fresh array without autograd)."""
    track = not untracked()
    P = Sl[0][:, None] * Fl[0][None]
    for X, Y in ((Sl, Fl), (Sa, Fa)):
        for c in range(3):
            if X is not Sl or c:
                P = P.addcmul(X[c][:, None], Y[c][None]) if track else P.addcmul_(X[c][:, None], Y[c][None])
    return P


def dense_mass_matrix_fast(model: RobotModel, topo: FastTopo, K: FastKin) -> torch.Tensor:
    """The dense mass matrix ``(N, nv, nv)`` (coordinate order, armature
    included) on the fast path, by every product ``S_j . F_i`` at once;
    differentiable by autograd, and for models with mimic joints (``M =
    G^T M_bodies G``), where the tree-sparse entries of
    :func:`crba_entries_fast` do not apply."""
    fb = model.floating_base
    C, Fl, Fa = _composite_forces(model, topo, K)
    P = _all_pairs(K.Sl, K.Sa, Fl, Fa)
    Mm = P * topo.upper[:, :, None] + (P * topo.strict[:, :, None]).transpose(0, 1)  # level order
    # To coordinates, G^T Mm G, as two products with (nm, nm N) blocks (a
    # batched product of tiny matrices costs far more per entry).
    nm, nj, N = Mm.shape[0], topo.G.shape[1], Mm.shape[-1]
    GT = topo.G.T
    X = (GT @ Mm.reshape(nm, nm * N)).view(nj, nm, N)  # X[c, i] = sum_j G[j, c] Mm[j, i]
    Mj = (GT @ X.transpose(0, 1).reshape(nm, nj * N)).view(nj, nj, N)  # Mj[d, c]; symmetric
    Mj = Mj.permute(2, 1, 0)
    if model.num_joints:
        Mj = Mj + torch.diag_embed(model.armature.expand(Mj.shape[:-1]))
    if not fb:
        return Mj
    R0, p0 = K.R[:, :, 0], K.p[:, 0]
    Mbj = (_world_force_to_base(R0, p0, Fl, Fa).reshape(6 * nm, N).T.reshape(N * 6, nm) @ topo.G).view(N, 6, nj)
    mt, hx, Ib = _base_inertia(C[:, 0], R0, p0)
    z = torch.zeros_like(mt)
    rows = [[mt if r == c else z for c in range(3)] + [-hx[r, c] for c in range(3)] for r in range(3)]
    rows += [[hx[r, c] for c in range(3)] + [Ib[r, c] for c in range(3)] for r in range(3)]
    Mbb = torch.stack([torch.stack(row, -1) for row in rows], -2)  # (N, 6, 6)
    Mbb = 0.5 * (Mbb + Mbb.transpose(-1, -2))  # exactly symmetric, not just to rounding
    top = torch.cat([Mbb, Mbj], -1)
    bottom = torch.cat([Mbj.transpose(-1, -2), Mj], -1)
    return torch.cat([top, bottom], -2)


def crba_entries_fast(model: RobotModel, topo: FastTopo, sp: _Sparsity, K: FastKin, base_frame: bool = False) -> torch.Tensor:
    """The packed entries of ``M`` (``_Sparsity`` order), ``(nnz, N)``, armature included.

    ``base_frame``: ``K`` was computed with the floating base at the world
    origin, unrotated (see :func:`forward_fast`): then each joint's column
    ``F_i`` is already the base-frame wrench, written straight into its
    entries, and the base's block is its composite inertia as it is.
    """
    fb = model.floating_base
    N = K.h.shape[-1]
    Sl, Sa = K.Sl, K.Sa
    nb21, nm = len(sp.base_pairs), Sl.shape[1]
    npairs = sp.npairs
    # Every entry is written into one array: [base block; base-joint; joint pairs].
    E = new((sp.nnz, N), Sl)
    base_frame = base_frame and fb and untracked()
    F6 = E[nb21 : nb21 + 6 * nm].view(6, nm, N) if base_frame else (new((6, nm, N), Sl) if untracked() else None)
    C, Fl, Fa = _composite_forces(model, topo, K, F6)
    P = E[sp.nnz - npairs :]
    if len(sp.blocks) > 2 and N <= _paths.LEVEL_SUM_MIN_BATCH:
        # Few samples: all S_j . F_i at once (6 operations), then the pairs.
        torch.index_select(_all_pairs(Sl, Sa, Fl, Fa).view(nm * nm, N), 0, sp.pair_flat, out=P)
    else:
        _pairs_by_blocks(sp, torch.cat([Sl, Sa], 0) if K.S is None else K.S, F6, P)
    if model.num_joints:  # the diagonal pairs come first, in order
        arm = model.armature if topo.arm_perm is None else model.armature.index_select(0, topo.arm_perm)
        P[:nm].add_(arm[:, None])
    if not fb:
        return E
    if base_frame:  # the base's block straight from the tree's composite inertia: two operations
        torch.index_select(C.reshape(-1, N), 0, sp.base_rows, out=E[:nb21]).mul_(sp.base_sign)
        return E
    R0, p0 = K.R[:, :, 0], K.p[:, 0]
    # Rows c nm + i: the base-frame wrench of joint i's column, component c.
    _world_force_to_base(R0, p0, Fl, Fa, out=E[nb21 : nb21 + 6 * nm].view(6, nm, N))
    mt, hx, Ib = _base_inertia(C[:, 0], R0, p0)
    z = torch.zeros_like(mt)
    # Spatial inertia [[m 1, -[h]x], [[h]x, I]] in the base frame; lower triangle.
    for k, (r, c) in enumerate(sp.base_pairs):
        if r < 3:
            E[k].copy_(mt if r == c else z)
        elif c < 3:
            E[k].copy_(hx[r - 3, c])
        else:
            E[k].copy_(Ib[r - 3, c - 3])
    return E


def _pairs_by_blocks(sp: _Sparsity, S6: torch.Tensor, F6: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """``S_j . F_i`` for the joint pairs into ``P (npairs, N)``, block by
    block (:func:`_pair_blocks`): each block's components of ``S`` and ``F``
    are strided views of ``S6``, ``F6`` ``(6, nm, N)`` (contiguous rows), so
    a block is one product and five multiply-adds into its rows of ``P``,
    no gather (for the G1 humanoid 20 blocks for its 146 pairs; the short
    runs' pairs were gathered into one block before, which copied each row
    it served, and took 2.3 times as long on one thread). A product of the
    six components at once then one sum over them took 1.8 times as long
    as the six operations (the product array's memory traffic)."""
    prog = _pair_program(sp, P.shape[-1], S6.storage_offset(), F6.storage_offset(), P.storage_offset())
    ss, fs, ps = S6.as_strided, F6.as_strided, P.as_strided
    for out, s6, f6 in prog:
        # One (6, A, B, N) view each, unbound: less Python time than six views.
        (s0, *sr), (f0, *fr) = ss(*s6).unbind(0), fs(*f6).unbind(0)
        x = torch.mul(s0, f0, out=ps(*out))
        for sc, fc in zip(sr, fr):
            x.addcmul_(sc, fc)
    return P


def _pair_program(sp: _Sparsity, N: int, so: int, fo: int, po: int) -> tuple:
    """:func:`_pairs_by_blocks`' ``as_strided`` arguments for ``N`` samples
    and the arrays' storage offsets, cached on ``sp``: per block, ``P``'s
    rows, then ``S``'s and ``F``'s ``(6, A, B, N)`` views."""
    key = (N, so, fo, po)
    prog = sp.programs.get(key)
    if prog is None:
        if len(sp.programs) >= 8:
            sp.programs.clear()
        nm = int(sp.joint_diag.numel())
        out, p0 = [], 0
        for j0, i0, (dj1, di1), A, (dj2, di2), B in sp.blocks:
            size = (6, A, B, N)
            out.append((
                ((A, B, N), (B * N, N, 1), po + p0 * N),
                (size, (nm * N, dj1 * N, dj2 * N, 1), so + j0 * N),
                (size, (nm * N, di1 * N, di2 * N, 1), fo + i0 * N),
            ))
            p0 += A * B
        prog = sp.programs[key] = tuple(out)
    return prog


class LTDLFactor:
    """``M = L^T D L`` with the tree's sparsity; :meth:`solve` applies ``M^-1``.

    Built under ``no_grad`` from the packed entries (not modified), in the
    row layout of :class:`_RowPlan`. The multipliers ``L`` of all levels are
    one array (``Ls`` its per-level ``(n d, N)`` parts, ``sp.levels``
    order), and every strided view the factorisation and the back
    substitution use is a prepared ``as_strided`` argument triple
    (:func:`_ltdl_program`, once per batch size): the factorisation's
    Python time is then little more than one call per operation.
    """

    def __init__(self, sp: _Sparsity, topo: FastTopo, E: torch.Tensor, rhs: torch.Tensor | None = None):
        """With ``rhs (nv, N)`` (internal order) also ``self.x = M^-1 rhs``,
        its forward substitution done in the same passes (:class:`_RowPlan`)."""
        self.sp, self.topo = sp, topo
        N = E.shape[-1]
        plan = sp.rows
        prog = _ltdl_program(sp, N)
        # rows() gives a fresh array (storage offset 0): the prepared offsets hold.
        W = rows(E, plan.src)  # the row layout (_RowPlan)
        if rhs is not None:
            W.index_copy_(0, plan.rpos, rhs)
        La = new((prog.nL, N), W)
        ws, ls = W.as_strided, La.as_strided
        lo3 = hi3 = None
        if prog.base is not None:  # the base's six padded runs, as two views (coordinates 0-2 and 3-5)
            lo3, hi3 = ws(*prog.base[0]), ws(*prog.base[1])
        for num, den, out, base_ups, ups in prog.levels:
            torch.div(ws(*num), ws(*den), out=ls(*out))
            for l_lo, s_lo, l_hi, s_hi in base_ups:
                lo3.addcmul_(ls(*l_lo), ws(*s_lo), value=-1.0)
                hi3.addcmul_(ls(*l_hi), ws(*s_hi), value=-1.0)
            for dst, lk, src in ups:
                ws(*dst).addcmul_(ls(*lk), ws(*src), value=-1.0)
        self.La, self.prog = La, prog
        self.D = W.index_select(0, plan.dpos)
        self.x = None
        if rhs is not None:
            self.x = self._back(W.index_select(0, plan.rpos).div_(self.D))

    @property
    def Ls(self) -> list:
        """Per level (``sp.levels`` order) its multipliers ``(n d, N)``: row
        ``k d + b`` is ``L[k, anc_b(k)]`` (views of one array)."""
        return [self.La[a:b] for a, b in self.prog.L_bounds]

    def solve_fast(self, r: torch.Tensor) -> torch.Tensor:
        """``M^-1 r`` for ``r (nv, N)`` (not modified)."""
        r = r.clone(memory_format=torch.contiguous_format)  # rows contiguous for the row updates
        N = r.shape[-1]
        for lv, Lk in zip(self.sp.levels, self.Ls):  # L^T y = r, leaves first
            y = r.index_select(0, lv.k)
            r.index_add_(0, lv.anc, mul(Lk.view(-1, lv.d, N), y[:, None]).view(-1, N), alpha=-1.0)
        return self._back(r.div_(self.D))

    def _back(self, r: torch.Tensor) -> torch.Tensor:
        """``L^-1 r`` in place on ``r (nv, N)``: ``L x = z``, root first; each
        level's coordinates are one slice of ``r`` (a plain subtraction, not
        a row-by-row ``index_add_``)."""
        N = r.shape[-1]
        ls = self.La.as_strided
        for anc, Lv, n, d, k0, k in self.prog.back:
            x = rows(r, anc).mul_(ls(*Lv))
            if k0 is None:
                r.index_add_(0, k, x.view(n, d, N).sum(1), alpha=-1.0)
            else:
                r[k0 : k0 + n].sub_(x.view(n, d, N).sum(1))
        return r

    def solve(self, rhs: torch.Tensor) -> torch.Tensor:
        """``M^-1 rhs`` for ``rhs (..., nv)`` in the factor's batch order."""
        with torch.no_grad():
            shape = rhs.shape
            x = self.solve_fast(_to_internal(self.topo, rhs.reshape(-1, shape[-1])))
            return _from_internal(self.topo, x).reshape(shape)


class _LTDLProgram(NamedTuple):
    """:class:`LTDLFactor`'s operations for one batch size ``N``: every view
    an ``as_strided`` argument triple ``(size, stride, storage offset)`` on
    the row layout ``W`` or the multipliers ``La`` (both fresh, offset 0)."""

    nL: int  # rows of La
    L_bounds: tuple  # per level, its rows of La
    base: tuple | None  # the base's two padded views of W (coordinates 0-2, 3-5)
    levels: tuple  # per level: (numerators, diagonal, out) of L = M / D, base updates, updates
    back: tuple  # per level root first: (ancestors, L's view, n, d, first coordinate or None, coordinates)


def _ltdl_program(sp: _Sparsity, N: int) -> _LTDLProgram:
    prog = sp.rows.programs.get(N)
    if prog is None:
        if len(sp.rows.programs) >= 8:
            sp.rows.programs.clear()
        prog = sp.rows.programs[N] = _build_ltdl_program(sp, N)
    return prog


def _build_ltdl_program(sp: _Sparsity, N: int) -> _LTDLProgram:
    plan = sp.rows
    levels, bounds, back = [], [], []
    lo = 0
    for lv, b0, ups in zip(sp.levels, plan.blocks, plan.updates):
        n, d = lv.k.numel(), lv.d
        row = (d + 2) * N
        num = ((n, d, N), (row, N, 1), (b0 + 1) * N)  # blk[:, 1:d+1]
        den = ((n, 1, N), (row, N, 1), (b0 + d + 1) * N)  # blk[:, d+1:]
        out = ((n, d, N), (d * N, N, 1), lo * N)
        base_ups = []
        if plan.base is not None and d >= 6:
            for k in range(n):
                kl, kb = (lo + k * d) * N, b0 * N + k * row
                base_ups.append((
                    ((3, 1, N), (N, N, 1), kl), ((1, 4, N), (4 * N, N, 1), kb),  # L[k, :3, None], blk[k, None, :4]
                    ((3, 1, N), (N, N, 1), kl + 3 * N), ((1, 7, N), (7 * N, N, 1), kb),  # L[k, 3:6, None], blk[k, None, :7]
                ))
        prog_ups = []
        for first, step, cnt, k0, a in ups:
            prog_ups.append((
                ((cnt, a + 2, N), (step * N, N, 1), first * N),  # the ancestors' runs, first a + 2 rows
                ((cnt, 1, N), (d * N, N, 1), (lo + k0 * d + a) * N),  # L[k0:k0+cnt, a:a+1]
                ((cnt, a + 2, N), (row, N, 1), b0 * N + k0 * row),  # blk[k0:k0+cnt, :a+2]
            ))
        levels.append((num, den, out, tuple(base_ups), tuple(prog_ups)))
        bounds.append((lo, lo + n * d))
        ks = lv.k.tolist()
        k0 = ks[0] if ks == list(range(ks[0], ks[0] + n)) else None
        back.append((lv.anc, ((n * d, N), (N, 1), lo * N), n, d, k0, lv.k))
        lo += n * d
    base = None
    if plan.base is not None:
        # Coordinates 0-2 need at most 4 rows, 3-5 at most 7: 33 rows
        # written per joint coordinate for 27 (one view of 42 before).
        base = (((3, 4, N), (7 * N, N, 1), plan.base * N), ((3, 7, N), (7 * N, N, 1), (plan.base + 21) * N))
    return _LTDLProgram(nL=lo, L_bounds=tuple(bounds), base=base, levels=tuple(levels), back=tuple(back[::-1]))


def _to_internal(topo: FastTopo, x: torch.Tensor) -> torch.Tensor:
    """``(N, nv)`` in coordinate order -> ``(nv, N)`` in the internal order."""
    x = x.T
    return x if topo.dof_perm is None else x.index_select(0, topo.dof_perm)


def _from_internal(topo: FastTopo, x: torch.Tensor) -> torch.Tensor:
    """``(nv, N)`` in the internal order -> ``(N, nv)`` in coordinate order."""
    return (x if topo.dof_inv is None else x.index_select(0, topo.dof_inv)).T


def _inputs(model, topo, q, g, f_ext, origin=True, identity_base=False):
    batch = q.shape[:-1]
    qf = q.reshape(-1, q.shape[-1])
    N = qf.shape[0]
    K = kinematics_fast(model, topo, qf, origin, identity_base)  # body_transforms_fast applies it only untracked
    gt = g[:, None] if g.ndim == 1 else g.reshape(-1, 3).T
    ft = None
    if f_ext is not None:
        ft = f_ext_world_fast(topo, K, f_ext.expand(*batch, *f_ext.shape[-2:]).reshape(N, -1, 6))
    return batch, N, K, gt, ft


def forward_fast(model: RobotModel, q, v, tau, g, f_ext, base_frame: bool = False):
    """Accelerations ``(..., nv)`` (no autograd graph) and the factor of ``M``.

    ``q``, ``v``, ``tau`` share one batch shape; ``g`` is ``(3,)`` or that
    batch; ``f_ext`` ``None`` or ``(..., nb, 6)`` that broadcasts to it.
    ``M`` is factorised by the tree-sparse LTDL (:class:`LTDLFactor`), or,
    with mimic joints (whose coordinates do not form a tree), densely by a
    batched Cholesky factorisation (:class:`DenseFactor`).

    ``base_frame`` (a floating base): evaluate everything in the base's
    frame. The base's coordinates are base-frame twists and the external
    wrenches body-frame ones, so the accelerations depend on the base's pose
    only through gravity: with the base put at the origin, unrotated, and
    gravity turned into its frame (``R0^T g``), the base's wrenches need no
    transformation (27 passes over the joints fewer in CRBA). The factor then
    carries no world-frame kinematics (``factor.kin`` is ``None``).
    """
    with torch.no_grad():
        topo = fast_topology(model)
        nv = model.nv
        base_frame = base_frame and model.floating_base
        if base_frame:
            q, g = _to_base_frame(q, g)
        batch, N, K, gt, ft = _inputs(model, topo, q, g, f_ext, identity_base=base_frame)
        K = K._replace(base_frame=base_frame)
        vt = _to_internal(topo, v.reshape(N, nv))
        keep = {}
        # RNEA first: the CRBA below sums K's inertias over subtrees in place.
        rhs = _to_internal(topo, tau.reshape(N, nv)) - rnea_fast(model, topo, K, vt, None, gt, ft, keep)
        if topo.coupled:
            factor = DenseFactor(dense_mass_matrix_fast(model, topo, K))
            a = factor.solve(_from_internal(topo, rhs))
        else:
            sp = _sparsity(model)
            factor = LTDLFactor(sp, topo, crba_entries_fast(model, topo, sp, K, base_frame), rhs)
            a = _from_internal(topo, factor.x)
        # What the reverse pass of RNEA at the same (q, v) can reuse.
        factor.kin = None if base_frame else (K.R, K.p, K.Sl, K.Sa, keep["V"])
        return a.reshape(*batch, nv), factor


def _to_base_frame(q: torch.Tensor, g: torch.Tensor):
    """``q`` with the floating base at the origin, unrotated, and gravity
    ``R0^T g`` in the base's frame (``(..., 3)``), for :func:`forward_fast`."""
    # R0 = 1 + s (w [u]x + [u]x^2) with s = 2 / |q|^2 (quat_to_matrix, as
    # forward kinematics forms it), so R0^T g = g + s (u x (u x g) - w u x g):
    # 8 operations on (..., 3) arrays instead of the matrix's 40 on (...,).
    quat = q[..., 3:7]
    w, u = quat[..., :1], quat[..., 1:]
    ug = torch.linalg.cross(u, g.expand_as(u))
    s = 2.0 / (quat * quat).sum(-1, keepdim=True)
    gb = torch.linalg.cross(u, ug).addcmul_(w, ug, value=-1.0).mul_(s).add_(g)
    qb = q.clone()
    qb[..., :7] = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype=q.dtype, device=q.device)
    return qb, gb


class DenseFactor:
    """A batched dense Cholesky factor of ``M`` ``(N, nv, nv)``; :meth:`solve` applies ``M^-1``."""

    def __init__(self, M: torch.Tensor):
        # cholesky_ex: no error check, so no host synchronisation in the hot path.
        self.L = torch.linalg.cholesky_ex(M)[0]

    def solve(self, rhs: torch.Tensor) -> torch.Tensor:
        """``M^-1 rhs`` for ``rhs (..., nv)`` in the factor's batch order."""
        with torch.no_grad():
            shape = rhs.shape
            return torch.cholesky_solve(rhs.reshape(-1, shape[-1], 1), self.L)[..., 0].reshape(shape)


def mass_matrix_fast(model: RobotModel, q: torch.Tensor) -> torch.Tensor:
    """The dense mass matrix ``(..., nv, nv)`` on the fast path.

    Without autograd and mimic joints: the tree-sparse CRBA's packed entries
    scattered into both triangles, zeros elsewhere. Otherwise
    :func:`dense_mass_matrix_fast`, differentiable by autograd.
    """
    topo = fast_topology(model)
    batch = q.shape[:-1]
    nv = model.nv
    qf = q.reshape(-1, q.shape[-1])
    N = qf.shape[0]
    K = kinematics_fast(model, topo, qf)
    if not untracked() or topo.coupled:
        return dense_mass_matrix_fast(model, topo, K).reshape(*batch, nv, nv)
    sp = _sparsity(model)
    E = crba_entries_fast(model, topo, sp, K)
    rc = sp.entry_rc if topo.dof_perm is None else topo.dof_perm[sp.entry_rc]
    r, c = rc.unbind(1)
    M = E.new_zeros(nv * nv, N)
    M.index_copy_(0, c * nv + r, E).index_copy_(0, r * nv + c, E)
    return M.T.reshape(*batch, nv, nv)


def inverse_dynamics_fast(model: RobotModel, q, v, a, g, f_ext=None) -> torch.Tensor:
    """RNEA ``(..., nv)`` in the batch-last layout, differentiable by autograd.

    ``q`` and ``v``, ``a`` (each ``None`` for zero) share one batch shape;
    ``g`` is ``(3,)`` or that batch; ``f_ext`` ``None`` or ``(..., nb, 6)``
    that broadcasts to it.
    """
    topo = fast_topology(model)
    nv = model.nv
    batch, N, K, gt, ft = _inputs(model, topo, q, g, f_ext, origin=False)
    vt = None if v is None else _to_internal(topo, v.reshape(N, nv))
    at = None if a is None else _to_internal(topo, a.reshape(N, nv))
    tau = rnea_fast(model, topo, K, vt, at, gt, ft)
    return _from_internal(topo, tau).reshape(*batch, nv)


# ---------------------------------------------------------------------- energies and centre of mass


def kinetic_energy_fast(model: RobotModel, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``0.5 v^T M v`` ``(...)`` on the fast path: every active body's
    ``0.5 V . (I V)`` (through its centre of mass) plus the rotors'
    ``0.5 armature v_j^2``; differentiable by autograd. ``q``, ``v`` share
    one batch shape. The twists are :func:`_column_twists`' for one column,
    as :func:`mass_quadratic_vjp_fast` forms them for many."""
    topo = fast_topology(model)
    fb = model.floating_base
    batch = q.shape[:-1]
    qf = q.reshape(-1, q.shape[-1])
    N = qf.shape[0]
    K = kinematics_fast(model, topo, qf, origin=False)
    vt = _to_internal(topo, v.reshape(N, model.nv))
    Vl, Va = _column_twists(topo, K, vt[:, None], fb)
    Vl, Va = Vl.squeeze(1), Va.squeeze(1)  # a view both ways (a selection's backward would copy)
    fl, fa = _inertia(K, Vl, Va)
    ke = 0.5 * ((Vl * fl).sum((0, 1)) + (Va * fa).sum((0, 1)))
    ke = ke.reshape(batch)
    if model.num_joints:
        vj = v[..., 6:] if fb else v
        ke = ke + 0.5 * (model.armature * vj * vj).sum(-1)
    return ke


def _column_twists(topo: FastTopo, K: FastKin, y: torch.Tensor, fb: bool):
    """The world twists ``(Vl, Va)`` ``(3, C, na, N)`` of every active body
    at the generalised velocities ``y (nv, C, N)`` (internal order, ``C``
    columns): the sums over ancestors of each joint's ``S qd`` and the
    floating base's twist (``y[:6]`` in the base frame; ``K`` with world
    poses, not ``base_frame``). Without autograd written in place into two
    fresh arrays; under autograd plain expressions."""
    C, N = y.shape[1], y.shape[2]
    yj = y[6:] if fb else y  # (nj, C, N)
    if topo.coupled:
        yj = yj.index_select(0, topo.coord) * topo.mult[:, None, None]
    qd = yj.transpose(0, 1)[None]  # (1, C, nm, N)
    Sl, Sa = K.Sl[:, None], K.Sa[:, None]
    if fb:
        R0, p0 = K.R[:, :, 0][:, :, None], K.p[:, 0][:, None]  # (3, 3, 1, N), (3, 1, N)
        w = rot(R0, y[3:6])  # (3, C, N)
        lin = cross_add(rot(R0, y[:3]), p0, w)
    if not untracked():
        Vl, Va = Sl * qd, Sa * qd
        if fb:
            Vl, Va = torch.cat([lin[:, :, None], Vl], 2), torch.cat([w[:, :, None], Va], 2)
        return down(topo.sums, Vl), down(topo.sums, Va)
    o = 1 if fb else 0
    Vl, Va = new((3, C, topo.nm + o, N), y), new((3, C, topo.nm + o, N), y)
    torch.mul(Sl, qd, out=Vl[:, :, o:])
    torch.mul(Sa, qd, out=Va[:, :, o:])
    if fb:
        Vl[:, :, 0] = lin
        Va[:, :, 0] = w
    return down(topo.sums, Vl), down(topo.sums, Va)


def mass_quadratic_vjp_fast(model: RobotModel, topo: FastTopo, K: FastKin, y: torch.Tensor, w: torch.Tensor):
    """``sum_c w_c d(y_c^T M(q) y_c) / dq`` for the columns ``y (nv, C, N)``
    (internal order) and weights ``w (C, N)``: ``(nj, N)``, each joint
    coordinate (internal order; with mimic joints, coordinate order),
    without autograd and without forming ``M``. ``K``:
    :func:`kinematics_fast` at ``q`` (either ``origin``; with
    ``origin=False`` the inertias about the origin are formed here, without
    autograd). The value ``y^T M y`` itself is not formed (the contact
    step's backward knows it: ``J y`` at ``y = M^-1 J^T``).

    ``y^T M y = sum_b V_b . (I_b V_b) + sum_j armature_j y_j^2`` is twice
    the kinetic energy at the "velocity" ``y`` (``V_b`` the world twist of
    body ``b``, ``I_b`` its spatial inertia at the world origin). Turning
    joint ``i`` by ``dq`` moves its subtree rigidly by the twist ``xi = S_i
    dq``: every ``I_b`` there by ``xi x* I_b - I_b xi x``, every ``S_j`` below
    ``i`` by ``xi x S_j`` (``S_i x S_i = 0``), so ``V_b`` by ``xi x (V_b -
    V_p)`` with ``p`` the parent of ``i``. Summing the three terms over the
    subtree leaves ``d(y^T M y)/dq_i = 2 (V_i x S_i) . hc_i`` with ``hc_i``
    the subtree's momentum ``sum_b I_b V_b`` (``V_i x S_i = V_p x S_i``).
    Computed as ``2 [S_l . (hc_l x V_a) + S_a . (hc_l x V_l + hc_a x V_a)]``
    per column, then weighted and summed over the columns. A
    floating base's pose does not enter: its twist is in the base frame,
    so ``y^T M y`` is the same at every base pose. A mimic joint's body
    turns by ``multiplier dq`` of its leader's coordinate.
    """
    with torch.no_grad():
        if K.I is not None:
            h, I = K.h, K.I
        else:
            h, I = world_inertia_fast(K.R[:, :, topo.o :], K.p[:, topo.o :], K.m,
                                      _active(topo, model.body_com), _active(topo, model.body_inertia))
        Kc = K._replace(h=h[:, None], I=I[:, :, None])  # a column axis in front of the bodies'
        step = max(1, MASS_QUADRATIC_CHUNK // y.shape[2])
        D = None
        for c in range(0, y.shape[1], step):
            Dc = _mass_quadratic_cols(model, topo, Kc, y[:, c : c + step], w[c : c + step])
            D = Dc if D is None else D.add_(Dc)
    return D


#: Columns x samples that :func:`mass_quadratic_vjp_fast` takes at once (its
#: arrays are ``(3, columns, bodies, samples)``: in pieces they stay in cache).
MASS_QUADRATIC_CHUNK = 4096


def _mass_quadratic_cols(model, topo, Kc, y, w):
    """:func:`mass_quadratic_vjp_fast` for the columns ``y`` and weights ``w``;
    ``Kc``: the kinematics with the inertias about the origin, ``h`` ``(3,
    1, na, N)`` and ``I`` ``(3, 3, 1, na, N)``."""
    fb = model.floating_base
    Vl, Va = _column_twists(topo, Kc, y, fb)  # (3, C, na, N)
    # Momenta at the world origin: [m V_l + V_a x h; I V_a + h x V_l].
    fl, fa = _inertia(Kc, Vl, Va)
    hl, ha = up(topo.sums, fl), up(topo.sums, fa)
    if fb:
        Vl, Va, hl, ha = Vl[:, :, 1:], Va[:, :, 1:], hl[:, :, 1:], ha[:, :, 1:]
    # (V x S) . hc = V_a . (S_l x hc_l + S_a x hc_a) + V_l . (S_a x hc_l)
    Sl, Sa = Kc.Sl[:, None], Kc.Sa[:, None]
    X = cross_add(cross(Sl, hl), Sa, ha)
    Z = cross(Sa, hl)
    D = torch.mul(Va[0], X[0])
    for k in range(3):
        if k:
            D.addcmul_(Va[k], X[k])
        D.addcmul_(Vl[k], Z[k])
    D = D.mul_(w[:, None]).sum(0)  # the weights last, on the smallest array: (nm, N)
    if topo.coupled:
        D = D.new_zeros(y.shape[0] - (6 if fb else 0), D.shape[-1]).index_add_(0, topo.coord, D * topo.mult[:, None])
    return D.mul_(2.0)


def first_moment_fast(model: RobotModel, q: torch.Tensor) -> torch.Tensor:
    """``sum_b m_b c_b`` over the active bodies (world frame), ``(3, N)`` for
    ``q (..., nq)`` flattened; differentiable by autograd."""
    topo = fast_topology(model)
    qf = q.reshape(-1, q.shape[-1])
    R, p = body_transforms_fast(model, qf, level_order=True)
    o = topo.o
    m = _active(topo, model.body_mass)[:, None]
    com = _active(topo, model.body_com).T[:, :, None]
    c = rot(R[:, :, o:], com) + p[:, o:]
    return (c * m).sum(1)


# ---------------------------------------------------------------------- ABA


def aba_fast(model: RobotModel, q, v, tau, g, f_ext) -> torch.Tensor:
    """Forward dynamics by the articulated-body algorithm on the fast path,
    ``(..., nv)``, without autograd (models without mimic joints).

    The same algorithm as the reference :func:`~backdrive.dynamics._aba.aba_core`,
    in the world frame at the origin: articulated inertias ``(6, 6, n, N)``
    and bias forces ``(6, n, N)`` accumulate from the leaves to the root, one
    batched step per depth level (the level's bodies are one slice; their
    parents get them by one ``index_add``), then the accelerations are
    resolved from the root out. ``q``, ``v``, ``tau`` share one batch shape;
    ``tau`` already holds every joint force. A floating base is evaluated in
    its own frame, as in :func:`forward_fast` (``base_frame``).
    """
    with torch.no_grad():
        topo = fast_topology(model)
        fb = model.floating_base
        o, nv = topo.o, model.nv
        if fb:
            q, g = _to_base_frame(q, g)
        batch, N, K, gt, ft = _inputs(model, topo, q, g, f_ext, identity_base=fb)
        K = K._replace(base_frame=fb)
        vt = _to_internal(topo, v.reshape(N, nv))
        tt = _to_internal(topo, tau.reshape(N, nv))
        qd, (Jl, Ja), (Vl, Va) = _velocities(topo, K, vt, fb)
        Vml, Vma = (Vl[:, 1:], Va[:, 1:]) if fb else (Vl, Va)
        # Velocity-product acceleration of each joint, c = V x (S qd).
        cl = cross_add(cross(Vma, Jl), Vml, Ja)
        ca = cross(Vma, Ja)
        # Bias forces p = V x* (I V) - f_ext (and the base's applied wrench).
        hl, ha = _inertia(K, Vl, Va)
        pA = new((6, topo.na, N), Vl)
        torch.linalg.cross(Va, hl, dim=0, out=pA[:3])
        torch.linalg.cross(Va, ha, dim=0, out=pA[3:])
        cross_add(pA[3:], Vl, hl)
        if ft is not None:
            pA[:3] -= ft[0]
            pA[3:] -= ft[1]
        if fb:  # in the base's frame: R0 = 1, p0 = 0
            pA[:3, 0] -= tt[:3]
            pA[3:, 0] -= tt[3:6]
        # Spatial inertias [[m 1, -[h]x], [[h]x, I]] at the world origin.
        IA = K.h.new_zeros(6, 6, topo.na, N)
        for i in range(3):
            IA[i, i].copy_(K.m.expand(topo.na, N))
        hx = skew(K.h, 0)
        IA[:3, 3:] = -hx
        IA[3:, :3] = hx
        IA[3:, 3:] = K.I
        S = torch.cat([K.Sl, K.Sa], 0) if K.S is None else K.S  # (6, nm, N)
        c = torch.cat([cl, ca], 0)
        tj = tt[6:] if fb else tt
        arm = model.armature if topo.arm_perm is None else model.armature.index_select(0, topo.arm_perm)
        sched = tree_schedule(model)
        par_all = torch.tensor(topo.parent, dtype=torch.long, device=S.device)
        levels = []
        for d in range(len(sched.level_slices) - 1, 0, -1):  # leaves first
            sl = sched.level_slices[d]
            mo = slice(sl.start - 1, sl.stop - 1)  # moving-body positions
            ao = slice(sl.start - o, sl.stop - o)  # active-body positions
            Sd, cd, IAd, pAd = S[:, mo], c[:, mo], IA[:, :, ao], pA[:, ao]
            U = IAd[:, 0] * Sd[0]
            for j in range(1, 6):
                U.addcmul_(IAd[:, j], Sd[j])
            D = (Sd * U).sum(0).add_(arm[mo, None])
            u = tj[mo] - (Sd * pAd).sum(0)
            Uo = U / D
            par = par_all[sl] - o
            levels.append((mo, par, Sd, cd, U, D, u))
            if d == 1 and not fb:
                continue  # the parent is the welded root
            Ia = IAd.addcmul(Uo[:, None], U[None], value=-1.0)
            pa = pAd.addcmul(Uo, u)
            for j in range(6):
                pa.addcmul_(Ia[:, j], cd[j])
            IA.index_add_(2, par, Ia)
            pA.index_add_(1, par, pa)
        # Accelerations offset by gravity's: a_hat = a - [g; 0].
        a = K.h.new_zeros(6, topo.na, N) if fb else None
        grav = gt.expand(3, N)
        if fb:
            I0 = IA[:, :, 0].permute(2, 0, 1)
            L = torch.linalg.cholesky_ex(I0)[0]
            a0 = -torch.cholesky_solve(pA[:, 0].T[:, :, None], L)[..., 0].T  # (6, N)
            a[:, 0] = a0
            base = torch.cat([a0[:3] + grav, a0[3:]], 0)
        qdd = K.h.new_empty(S.shape[1], N)
        prev_root = torch.cat([-grav, torch.zeros_like(grav)], 0)[:, None]  # a fixed root: -[g; 0]
        am = K.h.new_empty(6, S.shape[1], N)  # accelerations of the moving bodies
        for mo, par, Sd, cd, U, D, u in reversed(levels):
            if fb:
                ap = a.index_select(1, par) + cd
            elif mo.start == 0:
                ap = prev_root + cd
            else:
                ap = am.index_select(1, par) + cd  # with a fixed base, active = moving positions
            x = (u - (U * ap).sum(0)) / D
            qdd[mo] = x
            ap.addcmul_(Sd, x)
            if fb:
                a[:, mo.start + 1 : mo.stop + 1] = ap
            else:
                am[:, mo] = ap
        out = torch.cat([base, qdd], 0) if fb else qdd
        return _from_internal(topo, out).reshape(*batch, nv)


# ---------------------------------------------------------------------- RNEA vector-Jacobian product


def _base_vjp(R0, p0, x, gl, ga, t0, gp0):
    """Adjoint of :func:`_base_to_world` ``(R0 x_l + p0 x (R0 x_a), R0 x_a)``
    for output gradients ``gl``, ``ga`` ``(3, N)``. Accumulates into the base's
    torque ``t0`` (the gradient with respect to a world-frame rotation of
    ``R0``: ``gR0 = u w^T`` pairs as ``(R0 w) x u``) and ``gp0``; returns the
    gradient of the base-frame twist ``x (6, N)``."""
    w = rot(R0, x[3:])
    gw = ga + cross(gl, p0)
    gp0 += cross(w, gl)
    t0 += cross(rot(R0, x[:3]), gl) + cross(w, gw)
    return torch.cat([rot_t(R0, gl), rot_t(R0, gw)], 0)


def rnea_vjp_fast(model: RobotModel, q, v, a, g, lam, kin=None, extra=None):
    """``lam^T d tau / d(q, v)`` for ``tau = RNEA(q, v, a)``, written out.

    The reverse pass of RNEA in the world frame (the adjoint of every step
    of :func:`rnea_fast`, with the inertias applied through the centres of
    mass). Gradients with respect to the bodies' poses are kept as a world
    force ``gp`` and torque ``t`` per body (``<gR, dR> = t . w`` for a
    rotation ``dR = [w]x R``), so the poses' part needs no 3x3 arrays: a
    joint's gradient is ``a . (T - p x G)`` with ``(G, T)`` the sums of
    ``(gp, t + p x gp)`` over its subtree. No external wrenches; gravity and
    the physical parameters are held constant (the caller uses autograd when
    they require grad). ``kin``: the poses, motion subspaces and velocities
    of a forward pass at the same ``(q, v)`` (``LTDLFactor.kin``), reused.
    ``extra``: gradients of another function of the same poses, added to
    this one's and taken through the one reverse pass of forward kinematics
    (the contact step's backward): ``(gp, t, gSl, gSa, gj, gv)``, each
    ``None`` or a world force ``gp`` and torque ``t`` ``(3, nb, N)`` per body
    pose (level order), the gradients ``(3, nm, N)`` of the motion subspaces,
    a joint-coordinate gradient ``gj (nj, N)`` and a velocity gradient ``gv
    (nv, N)`` (both internal order).
    Returns ``(gq, gv)`` with the shapes of ``q`` and ``v``.
    """
    xp, xt, xSl, xSa, xj, xv = (None,) * 6 if extra is None else extra
    topo = fast_topology(model)
    fb = model.floating_base
    nj, nv = model.num_joints, model.nv
    o = topo.o
    off = 6 if fb else 0
    with torch.no_grad():
        qf = q.reshape(-1, q.shape[-1])
        N = qf.shape[0]
        if kin is None:
            R, p = body_transforms_fast(model, qf, level_order=True)
            Rm, pm = R[:, :, 1:], p[:, 1:]
            Sl, Sa, aw = motion_subspace_fast(topo, R, p)
            V = None
        else:
            R, p, Sl, Sa, V = kin
            Rm, pm = R[:, :, 1:], p[:, 1:]
            aw = Sa if not topo.has_pri else rot(Rm, topo.axis)
        Ra = R[:, :, o:]
        m = _active(topo, model.body_mass)[:, None]
        com = _active(topo, model.body_com).T[:, :, None]  # (3, na, 1)
        Ib = _active(topo, model.body_inertia).permute(1, 2, 0)[:, :, :, None]  # (3, 3, na, 1)
        rc = rot(Ra, com)  # centre of mass relative to the body origin, world axes
        c = rc + p[:, o:]
        vt = _to_internal(topo, v.reshape(N, nv))
        at = _to_internal(topo, a.reshape(N, nv))
        gt = g[:, None] if g.ndim == 1 else g.reshape(-1, 3).T
        R0, p0 = R[:, :, 0], p[:, 0]

        K = FastKin(R, p, Sl, Sa, m, m * c, None, c, Ib)

        def apply(xl, xa):  # inertia times x; also u and R Ib R^T x_a, which the adjoint reuses
            parts = []
            fl, fa = _inertia(K, xl, xa, parts)
            return (fl, fa) + parts[0]

        # ---- forward: rnea_fast, keeping its intermediates
        keep = {"replay": True} if V is None else {"replay": True, "V": V}
        rnea_fast(model, topo, K, vt, at, gt, None, keep)
        qd, qdd = keep["qd"], keep["qdd"]
        Jl, Ja = keep["J"]
        Vl, Va = keep["V"]
        Al, Aa = keep["A"]
        hl, ha = keep["h"]
        uA, RLA = keep["IA"]
        uV, RLV = keep["IV"]
        Fl, Fa = keep["F"]
        Vml, Vma = (Vl[:, 1:], Va[:, 1:]) if fb else (Vl, Va)
        Fml, Fma = (Fl[:, 1:], Fa[:, 1:]) if fb else (Fl, Fa)

        # ---- reverse
        lt = _to_internal(topo, lam.reshape(N, nv))
        lb = _body_rates(topo, lt)  # (nm, N)
        na = topo.na
        gFl = Sl.new_zeros(3, na, N)
        gFa = Sl.new_zeros(3, na, N)
        gFml, gFma = (gFl[:, 1:], gFa[:, 1:]) if fb else (gFl, gFa)
        torch.mul(Sl, lb, out=gFml)
        torch.mul(Sa, lb, out=gFma)
        gSl, gSa = Fml * lb, Fma * lb
        if xSl is not None:
            gSl += xSl
        if xSa is not None:
            gSa += xSa
        gp = torch.zeros_like(p) if xp is None else xp.clone()  # world force on each body's pose
        tq = torch.zeros_like(p) if xt is None else xt.clone()  # world torque on each body's pose
        t0, gp0 = tq[:, 0], gp[:, 0]
        if fb:
            # tau_base = [R0^T F_l; R0^T (F_a - p0 x F_l)]
            x, y = rot(R0, lt[:3]), rot(R0, lt[3:6])
            F0l, F0a = Fl[:, 0], Fa[:, 0]
            gFl[:, 0] += x + cross(p0, y)
            gFa[:, 0] += y
            gp0 -= cross(F0l, y)
            t0 += cross(x, F0l) + cross(y, F0a - cross(p0, F0l))
        gfl, gfa = down(topo.sums, gFl), down(topo.sums, gFa)
        # f = I A + V x* h, h = I V
        gAl, gAa, _, _ = apply(gfl, gfa)
        ghl = cross_add(cross(gfl, Va), gfa, Vl)  # -(Va x gfl + Vl x gfa)
        gha = cross(gfa, Va)
        gVl = cross(hl, gfa)
        gVa = cross_add(cross(hl, gfl), ha, gfa)
        t1, t2, _, _ = apply(ghl, gha)
        gVl += t1
        gVa += t2
        # Through the inertias: y^T I x = m z.u + (R^T y_a).Ib (R^T x_a), z = y_l + y_a x c.
        gc = torch.zeros_like(c)
        ta = tq[:, o:]
        for (yl, ya), (xl, xa), u, RLx in (((gfl, gfa), (Al, Aa), uA, RLA), ((ghl, gha), (Vl, Va), uV, RLV)):
            z = cross(ya, c).add_(yl)
            gc.addcmul_(cross_add(cross(z, xa), u, ya), m)
            RLy = rot(Ra, rot(Ib, rot_t(Ra, ya)))
            cross_add(cross_add(ta, RLx, ya), RLy, xa)
        cross_add(ta, rc, gc)  # c = R com + p
        gp[:, o:] += gc
        # A = anc Jd + grav
        gJdl, gJda = up(topo.sums, gAl), up(topo.sums, gAa)
        gJdml, gJdma = (gJdl[:, 1:], gJda[:, 1:]) if fb else (gJdl, gJda)
        if fb:
            _base_vjp(R0, p0, at[:6], gJdl[:, 0], gJda[:, 0], t0, gp0)
        # Jd = Vm x J + S qdd
        gSl.addcmul_(gJdml, qdd)
        gSa.addcmul_(gJdma, qdd)
        gJl = cross(gJdml, Vma)  # -(Vma x gJdl)
        gJa = cross_add(cross(gJdma, Vma), gJdml, Vml)
        gVml, gVma = (gVl[:, 1:], gVa[:, 1:]) if fb else (gVl, gVa)
        cross_add(gVml, Ja, gJdml)
        cross_add(cross_add(gVma, Ja, gJdma), Jl, gJdml)
        # V = anc [V0; J]
        gVl, gVa = up(topo.sums, gVl), up(topo.sums, gVa)
        gJl += gVl[:, 1:] if fb else gVl
        gJa += gVa[:, 1:] if fb else gVa
        gv = vt.new_zeros(nv, N)
        if fb:
            gv[:6] = _base_vjp(R0, p0, vt[:6], gVl[:, 0], gVa[:, 0], t0, gp0)
        # J = S qd
        gSl.addcmul_(gJl, qd)
        gSa.addcmul_(gJa, qd)
        gqd = (Sl * gJl).sum(0) + (Sa * gJa).sum(0)
        gv[off:] = _coordinate_forces(topo, gqd)
        if xv is not None:
            gv += xv
        # S = [p x a; a] (revolute), [a; 0] (prismatic), a = R axis: a rotation
        # w of the body turns a by w x a, so a's gradient g pairs as a x g.
        tm, gpm = tq[:, 1:], gp[:, 1:]
        if topo.has_pri:
            gSl_r = gSl * topo.is_rev
            gaw = gSa * topo.is_rev + cross(gSl_r, pm) + gSl * topo.is_pri
            gpm += cross(aw, gSl_r)
        else:
            gaw = cross_add(gSa, gSl, pm)
            cross_add(gpm, aw, gSl)
        cross_add(tm, aw, gaw)
        # Poses -> joints: a joint turns (or shifts) its whole subtree.
        G = up(topo.sums, gp[:, o:].clone())
        T = up(topo.sums, cross_add(tq, p, gp)[:, o:].contiguous())
        Gm, Tm = (G[:, 1:], T[:, 1:]) if fb else (G, T)
        gth = (aw * cross_add(Tm, Gm, pm)).sum(0)  # aw . (Tm - pm x Gm)
        if topo.has_pri:
            gth = gth * topo.is_rev + (aw * Gm).sum(0) * topo.is_pri
        gq = qf.new_zeros(qf.shape)
        gj = _coordinate_forces(topo, gth)
        if xj is not None:
            gj = gj + xj
        if topo.dof_inv is not None:
            gj = gj.index_select(0, topo.dof_inv[off:] - off)
        gq[:, 7 if fb else 0 :] = gj.T
        if fb:
            gq[:, :3] = G[:, 0].T
            gq[:, 3:7] = base_quat_grad(T[:, 0], G[:, 0], p0, R0, qf)
        return gq.reshape(q.shape), _from_internal(topo, gv).reshape(v.shape)

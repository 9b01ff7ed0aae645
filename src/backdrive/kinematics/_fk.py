"""Whole-tree forward kinematics and frame Jacobians.

One traversal primitive (:func:`body_transforms`) with two paths: the fast
one does one batched operation per tree depth level, the reference one
pointer-jumps over the tree (``ceil(log2(depth))`` rounds of 4x4 products);
everything else (frame poses, Jacobians, dynamics) builds on it. The fast
path keeps poses as rotation plus translation and returns them so; so does
the reference, from its 4x4 products.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._errors import InputError
from .._shapes import broadcast_shapes
from ..model import RobotModel, geometry_constants
from ..spatial import quat_to_matrix
from ..runtime import active_workspace
from ._kernels import new, skew
from ._paths import choose, transforms_active, untracked
from ._schedule import tree_schedule

__all__ = [
    "joint_values",
    "local_transforms",
    "body_transforms",
    "frame_transforms",
    "forward_kinematics",
    "frame_jacobian",
    "body_axes_world",
    "PointSupport",
    "point_support",
    "point_jacobians",
    "coupling_matrix",
    "to_homogeneous",
    "resolve_frame",
]


def _take(x: torch.Tensor, idx, dim: int) -> torch.Tensor:
    # index_select, not advanced indexing: several times faster on the CPU and
    # its backward is an index_add.
    if isinstance(idx, slice):
        return x.narrow(dim, idx.start, idx.stop - idx.start)
    return x.index_select(dim, idx)


def _cache(model: RobotModel) -> dict:
    """Constant tensors derived from the model's geometry (built once per
    geometry, dtype and device; see :func:`geometry_constants`)."""
    return geometry_constants(model, "fk", _build_cache)


def _build_cache(model: RobotModel) -> dict:
    pl = model.joint_placement[1:].clone()
    Rpl, ppl = pl[:, :3, :3].contiguous(), pl[:, :3, 3].contiguous()
    axis = model.joint_axis[1:].clone()
    K = skew(axis)
    is_pri = model.joint_is_prismatic[1:].clone()
    sched = tree_schedule(model)
    A, B = Rpl @ K, Rpl @ (K @ K)
    Raxis = (Rpl @ axis[:, :, None])[..., 0]
    # The fast path computes the moving bodies in level order (levels 1, 2,
    # ... concatenated), so that each level's children are one slice.
    mperm = torch.tensor([b - 1 for b in sched.order[1:]], dtype=torch.long, device=model.device)
    level_order = not sched.sorted

    def lo(x):  # (..., nb - 1, 1) constant in level order, contiguous
        return (x.index_select(-2, mperm) if level_order else x).contiguous()

    jump = _build_jump(model, pl, Rpl, A, B, Raxis, is_pri)
    Rpl_t, A_t, B_t = (x.permute(1, 2, 0)[..., None] for x in (Rpl, A, B))
    ppl_t, Raxis_t = ppl.T[..., None], Raxis.T[..., None]
    return {
        "level_perm": mperm if level_order else None,
        "level_slices": tuple(slice(sl.start - 1, sl.stop - 1) for sl in sched.level_slices[1:]),
        "level_parents": sched.level_parents,
        "Rpl_L": lo(Rpl_t),
        # The local transform [Rl | pl] (3 x 4, row-major) = C [1, sin, cos, travel] per
        # moving body, C = [Rpl + B, A, -B, 0 | ppl, 0, 0, Raxis is_pri]: (nb - 1, 12, 4), level order.
        "TSC_L": lo(_local_coefficients(Rpl, A, B, ppl, Raxis * is_pri[:, None]).transpose(0, 1))
        .transpose(0, 1)
        .contiguous(),
        "A_L": lo(A_t),
        "B_L": lo(B_t),
        "ppl_L": lo(ppl_t),
        "Raxis_L": lo(Raxis_t),
        "is_rev_L": lo((1.0 - is_pri)[:, None]),
        "is_pri_L": lo(is_pri[:, None]),
        "Rpl": Rpl,
        "ppl": ppl,
        "A": A,
        "B": B,
        "Raxis": Raxis,
        "is_pri": is_pri,
        "is_rev": 1.0 - is_pri,
        "has_pri": bool(is_pri.any()),
        "eye": torch.eye(3, dtype=model.dtype, device=model.device),
        **jump,
        "identity_coupling": model.joint_coordinate[1:].tolist() == list(range(model.num_bodies - 1))
        and bool((model.joint_offset[1:] == 0).all())
        and bool((model.joint_multiplier[1:] == 1).all()),
    }


def _local_coefficients(Rpl, A, B, ppl, Rpri) -> torch.Tensor:
    """``(nb - 1, 12, 4)``: each moving body's local transform ``[Rl | pl]``
    (row-major 3 x 4) as the coefficients of ``[1, sin, cos, travel]``."""
    z = torch.zeros_like(ppl)
    rows = []
    for i in range(3):
        rows += [torch.stack([Rpl[:, i, j] + B[:, i, j], A[:, i, j], -B[:, i, j], z[:, 0]], -1) for j in range(3)]
        rows.append(torch.stack([ppl[:, i], z[:, 0], z[:, 0], Rpri[:, i]], -1))
    return torch.stack(rows, 1)


def _build_jump(model: RobotModel, pl, Rpl, A, B, Raxis, is_pri) -> dict:
    """Constants of the pointer-jumping reference FK (:func:`body_transforms_reference`).

    Local transforms are flattened 4x4 matrices, ``T_l(theta) = (T_pl + B4)
    + sin A4 - cos B4 + d C4`` (Rodrigues folded into the placement, ``d`` a
    prismatic joint's travel; :func:`jump_coefficients`), one row of
    coefficients per moving body, in level order (the levels concatenated).
    ``jump_plan``: :func:`jump_plan` over the whole tree (entry 0 the root:
    the identity for a fixed base, which then counts as no ancestor, or the
    floating base's pose; entries 1.. the moving bodies in level order).
    """
    n = model.num_bodies - 1
    sched = tree_schedule(model)
    mperm = torch.tensor([b - 1 for b in sched.order[1:]], dtype=torch.long, device=model.device)
    A4 = torch.zeros(n, 4, 4, dtype=model.dtype, device=model.device)
    B4 = torch.zeros_like(A4)
    C4 = torch.zeros_like(A4)
    rev = (1.0 - is_pri)[:, None, None]
    A4[:, :3, :3] = A * rev
    B4[:, :3, :3] = B * rev
    C4[:, :3, 3] = Raxis * is_pri[:, None]
    locals_ = jump_coefficients(
        *(x.index_select(0, mperm) for x in (pl, A4, B4)), C4.index_select(0, mperm) if bool(is_pri.any()) else None
    )
    plan = jump_plan(_jump_parents(model), None, model.device)
    return {
        "jump_perm": None if sched.sorted else mperm,
        "jump_locals": locals_,
        "jump_pairs": jump_pairs(plan, locals_, "pose" if model.floating_base else "identity"),
        "jump_eye": torch.eye(4, dtype=model.dtype, device=model.device).reshape(1, 1, 16),
        "jump_plan": plan,
        "jump_is_rev": (1.0 - is_pri).index_select(0, mperm),
        "jump_is_pri": is_pri.index_select(0, mperm),
    }


def _jump_parents(model: RobotModel) -> list[int]:
    """Per level-order position, the entry it composes with (``-1``: none;
    a fixed base's identity root counts as none)."""
    return [p if (p > 0 or model.floating_base) else -1 for p in tree_schedule(model).parent_pos]


# ---------------------------------------------------------------------- pointer jumping (the reference FK kernel)


class JumpPlan(NamedTuple):
    """A pointer-jumping schedule (:func:`jump_plan`), run by :func:`jump_compose`.

    Attributes:
        inputs: the entries whose local transforms are needed, in the order
            :func:`jump_compose` takes them (``None``: all, in order).
        rounds: per round ``(keep, anc, cur)``, each a slice or a long index
            into the current array's first axis (``keep`` may be ``None``):
            the next array is ``cat([T[keep], T[anc] @ T[cur]])``.
        outputs: index of the requested entries in the last array (``None``:
            the array is already all entries in order).
        path: one output: the inputs are its path from the top, in order,
            and the rounds the pairwise product tree over them.
    """

    inputs: object
    rounds: tuple
    outputs: object
    path: bool = False


def _index(idx: list[int], device):
    """A list of positions as a view-friendly slice when evenly spaced, else a long tensor."""
    if not idx:
        return None
    step = idx[1] - idx[0] if len(idx) > 1 else 1
    if step > 0 and all(b - a == step for a, b in zip(idx, idx[1:])):
        return slice(idx[0], idx[-1] + 1, step)
    return torch.tensor(idx, dtype=torch.long, device=device)


def _rows(x: torch.Tensor, idx) -> torch.Tensor:
    return x[idx] if isinstance(idx, slice) else x.index_select(0, idx)


def jump_plan(parents: list[int], outputs: list[int] | None, device) -> JumpPlan:
    """Pointer jumping over a forest, restricted to what ``outputs`` need.

    ``parents[i]``: the entry that entry ``i`` composes with (``T_i <-
    T_parent @ T_i``), ``-1`` for none; every parent comes before its child.
    Round ``r`` composes every unfinished entry with its current ancestor
    and advances the ancestor table ``anc <- anc[anc]``: ``ceil(log2(depth))``
    rounds. Working back from ``outputs`` (``None``: every entry), only the
    entries a later round reads are kept and composed. For the end of one
    path that degenerates into the pairwise product tree (round 1 the
    products of neighbours, round 2 of those pairs, ...).
    """
    m = len(parents)
    anc = list(parents)
    ancs = []  # the ancestor table each round starts with
    while any(a >= 0 for a in anc):
        ancs.append(anc)
        anc = [a if a < 0 else anc[a] for a in anc]
    want = list(range(m)) if outputs is None else list(dict.fromkeys(outputs))
    needs = [sorted(want)]  # needs[r]: entries alive after round r (backwards)
    for a in reversed(ancs):
        cur = set(needs[0])
        needs.insert(0, sorted(cur | {a[i] for i in cur if a[i] >= 0}))
    order = needs[0]  # the array's entries, in array order
    rounds = []
    for a, need in zip(ancs, needs[1:]):
        pos = {e: k for k, e in enumerate(order)}
        keep = [e for e in need if a[e] < 0]
        comp = [e for e in need if a[e] >= 0]
        if not comp and keep == order:
            continue
        rounds.append(
            (
                _index([pos[e] for e in keep], device),
                _index([pos[a[e]] for e in comp], device),
                _index([pos[e] for e in comp], device),
            )
        )
        order = keep + comp
    pos = {e: k for k, e in enumerate(order)}
    out = [pos[e] for e in want]
    return JumpPlan(
        None if needs[0] == list(range(m)) else needs[0],
        tuple(rounds),
        None if out == list(range(m)) else _index(out, device),
        len(want) == 1,
    )


class JumpLocals(NamedTuple):
    """Constants of the local transforms ``T_l(theta) = (T_pl + B4) + sin A4
    - cos B4 + d C4`` (:func:`jump_coefficients`) as flattened rows, for
    :func:`jump_locals` in its three layouts: batch last ``coef (n, 16, k +
    1)`` (columns: ``A4``, ``-B4``(, ``C4``), ``T_pl + B4``; the last one
    multiplies a row of ones: a product with a broadcast base would first
    copy it into the output), ``coef12`` its first 12 rows (the top three
    rows of the 4x4); batch first ``base_t (n, 1, 16)``, ``coef_t (n, k,
    16)`` (all contiguous)."""

    coef: torch.Tensor
    coef12: torch.Tensor
    base_t: torch.Tensor
    coef_t: torch.Tensor

    def select(self, rows: torch.Tensor) -> "JumpLocals":
        return JumpLocals(*(x.index_select(0, rows) for x in self))


def jump_coefficients(pl4, A4, B4, C4=None) -> JumpLocals:
    """The :class:`JumpLocals` of ``n`` bodies from their ``(n, 4, 4)``
    placements and Rodrigues pieces (``C4`` only with prismatic joints)."""
    n = pl4.shape[0]
    pieces = [A4, -B4] + ([] if C4 is None else [C4])
    base_t = (pl4 + B4).reshape(n, 1, 16).contiguous()
    coef_t = torch.stack(pieces, 1).reshape(n, len(pieces), 16).contiguous()
    coef = torch.cat([coef_t, base_t], 1).transpose(1, 2).contiguous()
    return JumpLocals(coef, coef[:, :12].contiguous(), base_t, coef_t)


#: The layout :func:`jump_compose` runs in (:func:`jump_layout`): batch-first
#: 4x4 (one batched ``matmul`` per round) below ``JUMP_BATCH_LAST_MIN``
#: samples, for one output ("path": the entries halve each round) or many
#: ("tree": every entry each round); batch-last 4x4 (each product one
#: broadcast multiplication and its sum) up to ``JUMP_AFFINE_MIN``; from
#: there batch-last top three rows (each product three multiply-adds over
#: the batch: no ``4 x 4 x 4`` intermediate, a quarter less work). Measured in
#: docs/kinematics.md ("One reference FK").
JUMP_BATCH_LAST_MIN = {"path": 32, "tree": 16}
JUMP_AFFINE_MIN = 512


def jump_layout(plan: JumpPlan, N: int) -> str:
    """``"first"``, ``"last"`` or ``"affine"``: the layout :func:`jump_locals`
    and :func:`jump_compose` use for ``plan`` on ``N`` samples."""
    if N < JUMP_BATCH_LAST_MIN["path" if plan.path else "tree"]:
        return "first"
    return "affine" if N >= JUMP_AFFINE_MIN else "last"


def jump_locals(c: JumpLocals, theta, is_rev=None, is_pri=None, layout: str = "last") -> torch.Tensor:
    """All local transforms from the body angles ``theta (n, N)``: one small
    product per body, batched over the bodies (``is_rev``/``is_pri`` masks
    with prismatic joints). ``(n, 4, 4, N)`` (``"last"``), ``(n, N, 4, 4)``
    (``"first"``) or the top three rows ``(n, 3, 4, N)`` (``"affine"``)."""
    n, N = theta.shape
    ang = theta if is_rev is None else theta * is_rev[:, None]
    # sin and cos each from the angle itself: sin(a + pi/2) as the cosine
    # loses ulp(a) of accuracy (all of it for a wound-up joint at 1e16 rad).
    parts = [torch.sin(ang), torch.cos(ang)] + ([] if is_pri is None else [theta * is_pri[:, None]])
    if layout == "first":
        return torch.baddbmm(c.base_t, torch.stack(parts, 2), c.coef_t).view(n, N, 4, 4)
    sc = torch.stack(parts + [theta.new_ones(()).expand(n, N)], 1)  # (n, k + 1, N)
    if layout == "affine":
        return torch.bmm(c.coef12, sc).view(n, 3, 4, N)
    return torch.bmm(c.coef, sc).view(n, 4, 4, N)


class JumpPairs(NamedTuple):
    """The first round of a :func:`jump_plan` fused with the local transforms
    (:func:`jump_pairs`, run by :func:`jump_first`): the round's outputs (its
    kept entries, then its products ``T_l(a) T_l(b)``) as one batched product
    ``coef @ (w_a outer w_b)``, with ``w = [sin, cos(, d), 1]`` a body's
    weights (the columns of :class:`JumpLocals`' ``coef``).

    Attributes:
        coef: ``(p, 16, K * K)`` constant products ``M_a[u] @ M_b[v]`` (the
            4x4 coefficient matrices of the two factors, flattened), ``coef12``
            their top three rows.
        left, right: ``(p,)`` the theta rows of the two factors' weights (a
            kept entry's left factor is the identity: its only nonzero
            coefficients multiply the left weight 1).
    """

    coef: torch.Tensor
    coef12: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor


def jump_pairs(plan: JumpPlan, loc: JumpLocals, root: str | None, dtype=None) -> JumpPairs | None:
    """The :class:`JumpPairs` of ``plan``'s first round, or ``None`` when it
    has none (no products) or reads a pose that is not a local transform.

    ``loc``: the local-transform constants of the plan's input entries
    (:func:`jump_coefficients`, the root excluded). ``root``: what input 0
    is: ``None`` (no root entry, input ``i`` is ``loc`` row ``i``),
    ``"identity"`` (a fixed base: input ``i`` is row ``i - 1``) or ``"pose"``
    (a floating base's pose: not fusable). The constant products are formed
    in float64, returned in ``dtype`` (default ``loc``'s).
    """
    if not plan.rounds or plan.rounds[0][1] is None or root == "pose":
        return None
    keep, anc, cur = plan.rounds[0]
    coef = loc.coef.to(torch.float64)
    n, _, K = coef.shape
    shift = 1 if root == "identity" else 0
    eye = torch.zeros(K, 4, 4, dtype=torch.float64)
    eye[K - 1] = torch.eye(4, dtype=torch.float64)

    def factor(pos: int):  # (row, (K, 4, 4) coefficient matrices) of input ``pos``
        if shift and pos == 0:
            return 0, eye
        return pos - shift, coef[pos - shift].T.reshape(K, 4, 4)

    def positions(idx) -> list[int]:
        if idx is None:
            return []
        return list(range(idx.start, idx.stop, idx.step)) if isinstance(idx, slice) else idx.tolist()

    pairs = [(None, b) for b in positions(keep)] + list(zip(positions(anc), positions(cur)))
    C = torch.empty(len(pairs), 16, K * K, dtype=torch.float64)
    left, right = [], []
    for i, (a, b) in enumerate(pairs):
        rb, Mb = factor(b)
        ra, Ma = (rb, eye) if a is None else factor(a)
        C[i] = (Ma[:, None] @ Mb[None]).reshape(K * K, 16).T
        left.append(ra)
        right.append(rb)
    C = C.to(dtype=loc.coef.dtype if dtype is None else dtype, device=loc.coef.device)
    index = lambda x: torch.tensor(x, dtype=torch.long, device=loc.coef.device)  # noqa: E731
    return JumpPairs(C.contiguous(), C[:, :12].contiguous(), index(left), index(right))


def jump_first(c: JumpPairs, theta, is_rev=None, is_pri=None, layout: str = "affine") -> torch.Tensor:
    """The first round of a :func:`jump_plan` from the body angles ``theta
    (n, N)`` (the :func:`jump_locals` of its inputs composed as the round
    composes them) as one batched product with the pairs' weight products, in
    a batch-last layout: ``(p, 3, 4, N)`` (``"affine"``) or ``(p, 4, 4, N)``
    (``"last"``). Continue with ``jump_compose(..., start=1)``.

    Fewer and smaller arrays than the local transforms and their products:
    ``K * K`` weights and 12 entries per pair against 12 entries per body and
    the products' three passes (measured in docs/kinematics.md, "One
    reference FK")."""
    n, N = theta.shape
    ang = theta if is_rev is None else theta * is_rev[:, None]
    parts = [torch.sin(ang), torch.cos(ang)] + ([] if is_pri is None else [theta * is_pri[:, None]])
    w = torch.stack(parts + [theta.new_ones(()).expand(n, N)], 1)  # (n, K, N)
    wl, wr = w.index_select(0, c.left), w.index_select(0, c.right)
    p, K = wl.shape[0], wl.shape[1]
    sc = (wl[:, :, None] * wr[:, None]).view(p, K * K, N)
    if layout == "affine":
        return torch.bmm(c.coef12, sc).view(p, 3, 4, N)
    return torch.bmm(c.coef, sc).view(p, 4, 4, N)


def _affine_product(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B`` of top-three-row transforms ``(k, 3, 4, N)`` (bottom rows
    ``[0, 0, 0, 1]``)."""
    a0, a1, a2, a3 = A.unbind(2)  # columns of A, (k, 3, N)
    b0, b1, b2 = B.unbind(1)  # rows of B, (k, 4, N)
    out = a0[:, :, None] * b0[:, None]
    out.addcmul_(a1[:, :, None], b1[:, None]).addcmul_(a2[:, :, None], b2[:, None])
    out[:, :, 3].add_(a3)
    return out


def jump_compose(T: torch.Tensor, plan: JumpPlan, layout: str = "last", last=None, start: int = 0) -> torch.Tensor:
    """Run a :func:`jump_plan` on local transforms ``T`` (its ``inputs``, in
    a :func:`jump_locals` layout): the composed transforms of its outputs,
    in the same layout.

    Batch last, the products are elementwise over the batch (several times
    faster than batched 4x4 ``matmul`` from a few dozen samples on); batch
    first, one batched ``matmul`` per round (fewer dispatches), and for one
    sample on a path the whole product tree in one ``multi_dot``. ``last``:
    a constant ``(4, 4)`` multiplied onto every output from the right (a
    chain's tool). ``start``: the number of rounds ``T`` has been through
    (1 after :func:`jump_first`).
    """
    if layout == "first" and not start:
        N = T.shape[1]
        if N == 1 and plan.path:
            mats = list(T.view(T.shape[0], 4, 4).unbind(0)) + ([] if last is None else [last])
            return (torch.linalg.multi_dot(mats) if len(mats) > 1 else mats[0]).view(1, 1, 4, 4)
    for keep, anc, cur in plan.rounds[start:]:
        if anc is None:
            T = _rows(T, keep)
            continue
        if layout == "first":
            prod = _rows(T, anc) @ _rows(T, cur)
        elif layout == "affine":
            prod = _affine_product(_rows(T, anc), _rows(T, cur))
        else:
            prod = (_rows(T, anc)[:, :, :, None, :] * _rows(T, cur)[:, None]).sum(2)
        T = prod if keep is None else torch.cat([_rows(T, keep), prod], 0)
    T = T if plan.outputs is None else _rows(T, plan.outputs)
    if last is None:
        return T
    if layout == "first":
        return T @ last
    if layout == "last":
        return (T[:, :, :, None, :] * last[:, :, None]).sum(2)
    t0, t1, t2, t3 = T.unbind(2)  # affine: three multiply-adds
    out = t0[:, :, None] * last[0, :, None]
    out.addcmul_(t1[:, :, None], last[1, :, None]).addcmul_(t2[:, :, None], last[2, :, None])
    out[:, :, 3].add_(t3)
    return out


def joint_values(model: RobotModel, q: torch.Tensor) -> torch.Tensor:
    """The value of every moving body's joint, mimic joints included.

    Args:
        q: ``(..., nq)`` configuration.

    Returns:
        ``(..., nb - 1)``: ``multiplier * joints[coordinate] + offset`` for bodies 1..nb-1.
    """
    joints = q[..., 7:] if model.floating_base else q
    return joints[..., model.joint_coordinate[1:]] * model.joint_multiplier[1:] + model.joint_offset[1:]


def local_transforms(model: RobotModel, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Parent-body-from-body poses of every body at ``q``.

    Returns:
        ``R (..., nb, 3, 3)``, ``p (..., nb, 3)``; body 0 is the world-from-root pose.
    """
    c = _cache(model)
    batch = q.shape[:-1]
    nb = model.num_bodies
    if model.floating_base:
        R0 = quat_to_matrix(q[..., 3:7])[..., None, :, :]
        p0 = q[..., None, 0:3]
    else:
        R0 = c["eye"].expand(*batch, 1, 3, 3)
        p0 = q.new_zeros(*batch, 1, 3)
    if nb == 1:
        return R0, p0
    if c["identity_coupling"]:
        theta = q[..., 7:] if model.floating_base else q
    else:
        theta = joint_values(model, q)
    if c["has_pri"]:
        ang = theta * c["is_rev"]
    else:
        ang = theta
    s = torch.sin(ang)[..., None, None]
    omc = (1.0 - torch.cos(ang))[..., None, None]
    # Rodrigues folded into the placement: Rpl @ exp(theta K) = Rpl + s Rpl K + (1 - cos) Rpl K^2.
    R = torch.addcmul(torch.addcmul(c["Rpl"], s, c["A"]), omc, c["B"])
    if c["has_pri"]:
        p = torch.addcmul(c["ppl"], c["Raxis"], (theta * c["is_pri"])[..., None])
    else:
        p = c["ppl"].expand(*batch, nb - 1, 3)
    return torch.cat([R0, R], dim=-3), torch.cat([p0.expand(*batch, 1, 3), p], dim=-2)


def body_transforms(model: RobotModel, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """World-from-body poses of every body (``body_names`` order).

    The branch point of forward kinematics (:func:`~backdrive.kinematics._paths.choose`):
    the reference path (:func:`body_transforms_reference`) or the fast path
    (:func:`body_transforms_fast`, its result moved back to batch-first).
    :func:`frame_transforms`, :func:`forward_kinematics` and
    :func:`frame_jacobian` start here.

    Args:
        q: ``(..., nq)`` configuration (checked against the model).

    Returns:
        ``R (..., nb, 3, 3)``, ``p (..., nb, 3)``.
    """
    model.check_q(q)
    batch = q.shape[:-1]
    if not choose("kinematics", batch.numel(), model.num_bodies > 1):
        return body_transforms_reference(model, q)
    nb = model.num_bodies
    R, p = body_transforms_fast(model, q.reshape(-1, q.shape[-1]))
    R = R.permute(3, 2, 0, 1).reshape(*batch, nb, 3, 3).contiguous()
    p = p.permute(2, 1, 0).reshape(*batch, nb, 3).contiguous()
    return R, p


def body_transforms_reference(
    model: RobotModel, q: torch.Tensor, bodies: tuple[int, ...] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`body_transforms` on the reference path: batch-first, plain
    autograd (``q`` not checked).

    Pointer jumping over the tree (:func:`jump_plan`, :func:`jump_compose`):
    every local 4x4 transform at once (one batched product over the bodies,
    :func:`jump_locals`), then ``ceil(log2(depth))`` rounds of ``T[i] <-
    T[anc(i)] @ T[i]`` over the bodies still missing ancestors, with the
    ancestor table advanced each round (a gather, one broadcast product and
    its sum, a concatenation), instead of one step per depth level.
    Internally the batch is the last axis (``(nb, 4, 4, N)``: the 4x4
    products are elementwise over the batch, several times faster than
    batched 4x4 ``matmul`` from a few dozen samples on); returns batch-first
    arrays. There, for a fixed base, the local transforms and the first
    round are one product from the sines and cosines (:func:`jump_first`).

    Args:
        bodies: only these bodies' poses, in this order (``R (..., k, 3,
            3)``, ``p (..., k, 3)``): only the local transforms and products
            they need are computed (for the end of one path, the pairwise
            product tree of its local transforms).
    """
    c = _cache(model)
    batch = q.shape[:-1]
    nb = model.num_bodies
    N = batch.numel()
    qf = q.reshape(N, q.shape[-1])
    if bodies is None:
        plan, root, rows, loc, pairs, is_rev, is_pri = (
            c["jump_plan"], True, c["jump_perm"], c["jump_locals"], c["jump_pairs"], c["jump_is_rev"], c["jump_is_pri"]
        )
    else:
        bodies = tuple(int(b) for b in bodies)
        sub = geometry_constants(model, f"fk.jump.{bodies}", lambda m: _build_jump_subset(m, bodies))
        plan, root, rows, loc, pairs, is_rev, is_pri = (
            sub[k] for k in ("plan", "root", "rows", "locals", "pairs", "is_rev", "is_pri")
        )
    layout = jump_layout(plan, N)
    pri = c["has_pri"]
    theta = None
    if loc.coef.shape[0]:
        if c["identity_coupling"]:
            theta = qf[:, 7:] if model.floating_base else qf
        else:
            theta = joint_values(model, qf)
        theta = theta.T
        if rows is not None:
            theta = theta.index_select(0, rows)  # level order (or the needed bodies)
    if pairs is not None and layout != "first":
        # The first round fused with the local transforms (a fixed base's
        # identity root among the pairs' left factors).
        T = jump_first(pairs, theta, is_rev if pri else None, is_pri if pri else None, layout)
        T = jump_compose(T, plan, layout, start=1)
    else:
        T = _jump_unfused(model, c, qf, plan, layout, root, loc, theta, is_rev, is_pri)
    if bodies is None and not model.levels_sorted:
        T = T.index_select(0, model.level_inverse)
    k = T.shape[0]
    first = layout == "first"
    T = (T.transpose(0, 1) if first else T.permute(3, 0, 1, 2)).reshape(*batch, k, T.shape[2 if first else 1], 4)
    # Contiguous, batch-first: the dynamics' reference path runs on these (as
    # strided views, its products were measured up to 1.6x slower at 64 samples).
    return T[..., :3, :3].contiguous(), T[..., :3, 3].contiguous()


def _jump_unfused(model, c, qf, plan, layout, root, loc, theta, is_rev, is_pri):
    """:func:`body_transforms_reference`'s kernel with the local transforms
    (and a root pose) materialised before the first round (``c``: the
    model's :func:`_cache`)."""
    N = qf.shape[0]
    parts = []
    if root:
        eye = c["jump_eye"].view(4, 4)
        if model.floating_base:
            R0 = quat_to_matrix(qf[:, 3:7])
            if layout == "first":
                parts.append(torch.cat([torch.cat([R0, qf[:, 0:3, None]], 2), eye[3:].expand(N, 1, 4)], 1)[None])
            else:
                top = torch.cat([R0.permute(1, 2, 0), qf[:, 0:3].T[:, None]], 1)
                if layout == "last":
                    top = torch.cat([top, eye[3:, :, None].expand(1, 4, N)], 0)
                parts.append(top[None])
        elif layout == "first":
            parts.append(eye.expand(1, N, 4, 4))
        else:
            h = 3 if layout == "affine" else 4
            parts.append(eye[:h, :, None].expand(1, h, 4, N))
    if theta is not None:
        pri = c["has_pri"]
        parts.append(jump_locals(loc, theta, is_rev if pri else None, is_pri if pri else None, layout))
    T = torch.cat(parts, 0) if len(parts) > 1 else parts[0]
    return jump_compose(T, plan, layout)


def _build_jump_subset(model: RobotModel, bodies: tuple[int, ...]) -> dict:
    """:func:`body_transforms_reference` restricted to ``bodies``: the plan,
    and the constants of the moving bodies it reads (level order)."""
    for b in bodies:
        if not 0 <= b < model.num_bodies:
            raise InputError(f"body index {b} is out of range for a model of {model.num_bodies} bodies")
    c = _cache(model)
    sched = tree_schedule(model)
    pos = {b: k for k, b in enumerate(sched.order)}
    plan = jump_plan(_jump_parents(model), [pos[b] for b in bodies], model.device)
    inputs = list(range(model.num_bodies)) if plan.inputs is None else plan.inputs
    lv = torch.tensor([e - 1 for e in inputs if e > 0], dtype=torch.long, device=model.device)
    perm = c["jump_perm"]
    loc = c["jump_locals"].select(lv)
    root = ("pose" if model.floating_base else "identity") if 0 in inputs else None
    return {
        "plan": plan._replace(inputs=None),
        "root": 0 in inputs,
        "rows": lv if perm is None else perm.index_select(0, lv),
        "locals": loc,
        "pairs": jump_pairs(plan._replace(inputs=None), loc, root),
        "is_rev": c["jump_is_rev"].index_select(0, lv),
        "is_pri": c["jump_is_pri"].index_select(0, lv),
    }


def body_transforms_fast(
    model: RobotModel, qf: torch.Tensor, level_order: bool = False, identity_base: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """World-from-body poses on the fast path: ``R (3, 3, nb, N)``, ``p (3, nb, N)``.

    ``qf`` is ``(N, nq)`` (not checked). Each 3x3 product is a few
    elementwise operations over the whole batch. With ``level_order`` the
    bodies come in the order of ``torch.cat(model.levels)`` (the traversal's
    own order, which saves a reordering gather when the levels are not sorted).

    Under autograd the backward is written out (:class:`_BodyTransformsFast`):
    one pass from the leaves to the root, instead of autograd's ~20 nodes per
    level (each component product with its broadcast reductions).

    ``identity_base`` (a floating base, no autograd): the base's pose in
    ``qf`` is ignored and taken as the identity (forward dynamics in the
    base's frame): no rotation from its quaternion, and its children's poses
    are their joints' local ones, copied.
    """
    if torch.is_grad_enabled() and qf.requires_grad and model.num_bodies > 1 and not transforms_active():
        return _BodyTransformsFast.apply(model, qf, level_order)
    # (Only without autograd: the caller's qf then holds the identity pose anyway.)
    return _fk_fast(model, qf, level_order, identity_base=identity_base and model.floating_base and untracked())[:2]


class _BodyTransformsFast(torch.autograd.Function):
    """:func:`body_transforms_fast` with a hand-written backward (reverse pass
    over the levels: ``R_c = R_p R_l(theta)``, ``p_c = R_p p_l(theta) + p_p``)."""

    @staticmethod
    def forward(ctx, model, qf, level_order):
        with torch.no_grad():
            R, p, Rl, pl, s, cs = _fk_fast(model, qf, level_order, keep=True)
        ctx.model, ctx.level_order = model, level_order
        ctx.save_for_backward(qf, R, p, Rl, pl, s, cs)
        return R, p

    @staticmethod
    def backward(ctx, gR, gp):
        qf, R, p, Rl, pl, s, cs = ctx.saved_tensors
        model = ctx.model
        if torch.is_grad_enabled():  # create_graph: plain autograd, differentiable again
            with torch.enable_grad():
                outs = _fk_fast(model, qf, ctx.level_order)[:2]
                (g,) = torch.autograd.grad(
                    [o for o, go in zip(outs, (gR, gp)) if go is not None],
                    qf,
                    [go for go in (gR, gp) if go is not None],
                    create_graph=True,
                )
            return None, g, None
        return None, fk_vjp_fast(model, qf, (R, p, Rl, pl, s, cs), gR, gp, ctx.level_order), None


def fk_vjp_fast(model: RobotModel, qf, saved, gR, gp, level_order: bool) -> torch.Tensor:
    """The gradient ``(N, nq)`` with respect to ``qf`` of ``<gR, R> + <gp, p>``
    for the poses of :func:`body_transforms_fast` (``saved`` from ``_fk_fast(...,
    keep=True)``; ``gR`` or ``gp`` may be ``None``). No autograd."""
    R, p, Rl, pl, s, cs = saved
    c = _cache(model)
    nb = model.num_bodies
    N = qf.shape[0]
    if not level_order and not model.levels_sorted:
        # Outputs were reordered to body order; work in level order.
        order = torch.cat(list(model.levels))
        R, p = R.index_select(-2, order), p.index_select(-2, order)
        gR = None if gR is None else gR.index_select(-2, order)
        gp = None if gp is None else gp.index_select(-2, order)
    gR = R.new_zeros(3, 3, nb, N) if gR is None else gR.clone()
    gp = p.new_zeros(3, nb, N) if gp is None else gp.clone()
    gRl = torch.empty_like(Rl)
    gpl = torch.empty_like(pl) if c["has_pri"] else None
    bounds = [0] + [sl.stop for sl in c["level_slices"]]
    for d in range(len(c["level_slices"]) - 1, -1, -1):
        sl, par = c["level_slices"][d], c["level_parents"][d]
        cl = slice(sl.start + 1, sl.stop + 1)  # the level's positions among all bodies
        prev = slice(bounds[d - 1] + 1 if d else 0, bounds[d] + 1)  # the previous level
        Rp, pp_g, Rp_g = R[:, :, prev], gp[:, prev], gR[:, :, prev]
        if par is not None:
            Rp = _take(Rp, par, -2)
        Rc, pc = Rl[:, :, sl], pl[:, sl]
        gRc, gpc = gR[:, :, cl], gp[:, cl]
        # Local grads: gRl = Rp^T gRc, gpl = Rp^T gpc.
        a0, a1, a2 = Rp.unbind(0)  # rows of Rp: a_i[l] = Rp[i, l]
        g0, g1, g2 = gRc.unbind(0)
        out = gRl[:, :, sl]
        torch.mul(a0[:, None], g0[None], out=out).addcmul_(a1[:, None], g1[None]).addcmul_(a2[:, None], g2[None])
        q0, q1, q2 = gpc.unbind(0)
        if gpl is not None:
            torch.mul(a0, q0, out=gpl[:, sl]).addcmul_(a1, q1).addcmul_(a2, q2)
        # Parent grads: gRp = gRc Rc^T + gpc pc^T, gpp = gpc.
        r0, r1, r2 = Rc.unbind(1)  # columns of Rc: r_j[l] = Rc[l, j]
        h0, h1, h2 = gRc.unbind(1)
        gRp = h0[:, None] * r0[None]
        gRp.addcmul_(h1[:, None], r1[None]).addcmul_(h2[:, None], r2[None]).addcmul_(gpc[:, None], pc[None])
        if par is None:
            Rp_g += gRp.sum(-2, keepdim=True) if gRp.shape[-2] > 1 else gRp
            pp_g += gpc.sum(-2, keepdim=True) if gpc.shape[-2] > 1 else gpc
        elif isinstance(par, slice):
            Rp_g[:, :, par] += gRp
            pp_g[:, par] += gpc
        else:
            Rp_g.index_add_(-2, par, gRp)
            pp_g.index_add_(-2, par, gpc)
    # d Rl / d angle = cos A + sin B; d pl / d theta = Raxis (prismatic).
    gang = (gRl * c["A_L"]).sum((0, 1)).mul_(cs)
    gang.addcmul_((gRl * c["B_L"]).sum((0, 1)), s)
    if c["has_pri"]:
        gtheta = gang * c["is_rev_L"] + (gpl * c["Raxis_L"]).sum(0) * c["is_pri_L"]
    else:
        gtheta = gang
    if c["level_perm"] is not None:
        gtheta = torch.zeros_like(gtheta).index_copy_(0, c["level_perm"], gtheta)
    gq = torch.zeros_like(qf)
    fb = model.floating_base
    if c["identity_coupling"]:
        gq[:, 7 if fb else 0 :] = gtheta.T
    else:
        gj = gtheta.T * model.joint_multiplier[1:]
        gq[:, 7 if fb else 0 :].index_add_(1, model.joint_coordinate[1:], gj)
    if fb:
        gq[:, 0:3] = gp[:, 0].T
        with torch.enable_grad():
            quat = qf[:, 3:7].detach().requires_grad_(True)
            R0 = quat_to_matrix(quat).permute(1, 2, 0)
            (gquat,) = torch.autograd.grad(R0, quat, gR[:, :, 0])
        gq[:, 3:7] = gquat
    return gq


def _fk_fast(model: RobotModel, qf: torch.Tensor, level_order: bool, keep: bool = False, identity_base: bool = False):
    """:func:`body_transforms_fast`; with ``keep`` also the local poses and the
    sines and cosines (for the backward)."""
    c = _cache(model)
    nb = model.num_bodies
    N = qf.shape[0]
    if identity_base:
        R0 = c["eye"][:, :, None, None].expand(3, 3, 1, N)
        p0 = None
    elif model.floating_base:
        R0 = quat_to_matrix(qf[:, 3:7]).permute(1, 2, 0)[:, :, None, :].contiguous()  # (3, 3, 1, N)
        p0 = qf[:, 0:3].T[:, None, :].contiguous()  # (3, 1, N)
    else:
        R0 = c["eye"][:, :, None, None].expand(3, 3, 1, N)
        p0 = qf.new_zeros(3, 1, N)
    if c["identity_coupling"]:
        theta = qf[:, 7:] if model.floating_base else qf
    else:
        theta = joint_values(model, qf)
    theta = theta.T.contiguous()  # (nb - 1, N); contiguous, so that every array below has the batch innermost
    if c["level_perm"] is not None:
        theta = theta.index_select(0, c["level_perm"])  # moving bodies in level order
    ang = theta * c["is_rev_L"] if c["has_pri"] else theta
    Tl = None
    if untracked():
        # Without autograd: the local transforms [Rl | pl] as one batched
        # product of constant (12, 4) matrices with [1, sin, cos, travel] per
        # moving body (a matrix product writes the entries in one pass: the
        # rotations 3 times faster than two broadcast multiply-adds over
        # them, G1 at 10,000 samples), as (nb - 1, 12, N), viewed (3, 4, nb - 1, N).
        k = 4 if c["has_pri"] else 3
        sc = new((nb - 1, k, N), qf)
        sc[:, 0].fill_(1.0)
        s = torch.sin(ang, out=sc[:, 1])
        cs = torch.cos(ang, out=sc[:, 2])
        if c["has_pri"]:
            sc[:, 3].copy_(theta)
        Tl = torch.bmm(c["TSC_L"][:, :, :k], sc, out=new((nb - 1, 12, N), qf)).permute(1, 0, 2).view(3, 4, nb - 1, N)
        Rl, pl = Tl[:, :3], Tl[:, 3]
    else:
        s = torch.sin(ang)
        cs = torch.cos(ang)
        # (3, 3, nb - 1, 1) constants, (nb - 1, N) angles, both in level order.
        Rl = torch.addcmul(torch.addcmul(c["Rpl_L"], c["A_L"], s), c["B_L"], 1.0 - cs)
        if c["has_pri"]:
            pl = torch.addcmul(c["ppl_L"], c["Raxis_L"], theta * c["is_pri_L"])
        else:
            pl = c["ppl_L"].expand(3, nb - 1, N)
    R, p = _levels(c, nb, N, R0, p0, Rl, pl, into=untracked(), identity_base=identity_base, Tl=Tl)
    if not level_order and not model.levels_sorted:
        R, p = R.index_select(-2, model.level_inverse), p.index_select(-2, model.level_inverse)
    if keep:
        return R, p, Rl, pl.contiguous(), s, cs
    return R, p, None, None, None, None


def _levels(c: dict, nb: int, N: int, R0, p0, Rl, pl, into: bool, identity_base: bool = False, Tl=None):
    """The level recursion of :func:`_fk_fast`: ``R_c = R_p R_l``,
    ``p_c = R_p p_l + p_p``, one batched step per depth level.

    ``into`` (no autograd): each level is written into its slice of one
    ``(3, 3, nb, N)`` / ``(3, nb, N)`` array; otherwise (differentiable) each
    level is a new array and they are concatenated. ``identity_base`` (with
    ``into``): the root is at the origin, unrotated, and the first level's
    poses are its local ones, copied.
    """
    if into and Tl is not None:
        return _levels_merged(c, nb, N, R0, p0, Tl, identity_base)
    if into:
        R, p = new((3, 3, nb, N), Rl), new((3, nb, N), Rl)
        R[:, :, :1].copy_(R0)
        if identity_base:
            p[:, :1].zero_()
        else:
            p[:, :1].copy_(p0)
    Rs, ps = [R0], [p0]
    prev = slice(0, 1)
    levels = zip(c["level_slices"], c["level_parents"])
    if identity_base:
        sl, _ = next(levels)
        prev = slice(sl.start + 1, sl.stop + 1)
        R[:, :, prev].copy_(Rl[:, :, sl])
        p[:, prev].copy_(pl[:, sl])
    for sl, par in levels:
        Rp, pp = (R[:, :, prev], p[:, prev]) if into else (Rs[-1], ps[-1])
        if par is not None:
            Rp, pp = _take(Rp, par, -2), _take(pp, par, -2)
        cur = slice(sl.start + 1, sl.stop + 1)  # the level's positions among all bodies
        # unbind, not indexing: its backward is one stack, not a zero-filled copy per component.
        a0, a1, a2 = Rp.unbind(1)  # columns of the parent rotation
        c0, c1, c2 = Rl[:, :, sl].unbind(0)  # rows of the local rotation
        d0, d1, d2 = pl[:, sl].unbind(0)
        if into:
            Rc = torch.mul(a0[:, None], c0[None], out=R[:, :, cur])
            pc = torch.mul(a0, d0, out=p[:, cur])
        else:
            Rc, pc = a0[:, None] * c0[None], a0 * d0
        Rc.addcmul_(a1[:, None], c1[None]).addcmul_(a2[:, None], c2[None])
        pc.addcmul_(a1, d1).addcmul_(a2, d2).add_(pp)
        Rs.append(Rc)
        ps.append(pc)
        prev = cur
    if into:
        return R, p
    return torch.cat(Rs, dim=-2), torch.cat(ps, dim=-2)


def _levels_merged(c: dict, nb: int, N: int, R0, p0, Tl, identity_base: bool):
    """:func:`_levels` without autograd on the local transforms ``Tl = [Rl |
    pl]`` ``(3, 4, nb - 1, N)``: the poses as one ``(3, 4, nb, N)`` array
    ``[R | p]``, so that each level is ``T_c = R_p T_l`` (three operations
    over the four columns) and one add of ``p_p``: four operations per level
    instead of seven. Returns views ``R (3, 3, nb, N)``, ``p (3, nb, N)``."""
    T = new((3, 4, nb, N), Tl)
    R, p = T[:, :3], T[:, 3]
    R[:, :, :1].copy_(R0)
    if identity_base:
        p[:, :1].zero_()
    else:
        p[:, :1].copy_(p0)
    prev = slice(0, 1)
    levels = zip(c["level_slices"], c["level_parents"])
    if identity_base:
        sl, _ = next(levels)
        prev = slice(sl.start + 1, sl.stop + 1)
        T[:, :, prev].copy_(Tl[:, :, sl])
    for sl, par in levels:
        Rp, pp = R[:, :, prev], p[:, prev]
        if par is not None:
            Rp, pp = _take(Rp, par, -2), _take(pp, par, -2)
        cur = slice(sl.start + 1, sl.stop + 1)  # the level's positions among all bodies
        a0, a1, a2 = Rp.unbind(1)  # columns of the parent rotation
        t0, t1, t2 = Tl[:, :, sl].unbind(0)  # rows of the local transforms, (4, n, N)
        Tc = torch.mul(a0[:, None], t0[None], out=T[:, :, cur])
        Tc.addcmul_(a1[:, None], t1[None]).addcmul_(a2[:, None], t2[None])
        Tc[:, 3].add_(pp)
        prev = cur
    return R, p


def resolve_frame(model: RobotModel, frame) -> int:
    """A frame given by link name or index, as an index (typed error if unknown)."""
    if isinstance(frame, str):
        return model.frame_index(frame)
    if isinstance(frame, int) and -model.num_frames <= frame < model.num_frames:
        return frame % model.num_frames
    raise InputError(f"frame must be a link name or an index below {model.num_frames}, got {frame!r}")


def frame_transforms(
    model: RobotModel, q: torch.Tensor, frames=None, *, bodies: tuple | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """World-from-frame poses as rotation and translation.

    Args:
        q: ``(..., nq)``.
        frames: ``None`` for every link frame, or a sequence of names / indices.
        bodies: precomputed :func:`body_transforms` output, to reuse one FK pass.

    Returns:
        ``R (..., k, 3, 3)``, ``p (..., k, 3)``.
    """
    Rb, pb = body_transforms(model, q) if bodies is None else bodies
    if frames is None:
        fb, fpl = model.frame_body, model.frame_placement
    else:
        idx = torch.tensor([resolve_frame(model, f) for f in frames], device=model.device)
        fb, fpl = model.frame_body[idx], model.frame_placement[idx]
    Rbf, pbf = Rb[..., fb, :, :], pb[..., fb, :]
    R = Rbf @ fpl[:, :3, :3]
    p = (Rbf @ fpl[:, :3, 3:4])[..., 0] + pbf
    return R, p


def to_homogeneous(R: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Assemble ``(..., 4, 4)`` from ``R (..., 3, 3)`` and ``p (..., 3)``."""
    top = torch.cat([R, p[..., :, None]], dim=-1)
    bottom = torch.zeros_like(top[..., :1, :])
    bottom[..., 0, 3] = 1.0
    return torch.cat([top, bottom], dim=-2)


def forward_kinematics(model: RobotModel, q: torch.Tensor) -> torch.Tensor:
    """The pose of every link frame in the root frame (the world for a floating base).

    Args:
        model: the robot.
        q: ``(..., nq)`` configuration in the model's dtype and device.

    Returns:
        ``(..., n_frames, 4, 4)`` poses ``T_root_link``, in ``model.link_names`` order.
    """
    return to_homogeneous(*frame_transforms(model, q))


def body_axes_world(model: RobotModel, Rb: torch.Tensor) -> torch.Tensor:
    """Each moving body's joint axis in world coordinates, ``(..., nb - 1, 3)``.

    The axis is fixed in the joint frame and the joint frame is the body frame,
    so the world axis is ``R_world_body @ axis``.
    """
    return (Rb[..., 1:, :, :] @ model.joint_axis[1:, :, None])[..., 0]


def frame_jacobian(model: RobotModel, q: torch.Tensor, frame, *, bodies=None) -> torch.Tensor:
    """Geometric Jacobian of a frame, ``[linear; angular]`` rows.

    The twist ``J v`` is the velocity of the frame's origin and its angular
    velocity, both expressed in the root frame (the world for a floating base).
    For a floating base, ``v[:6]`` is the base twist in the base frame.

    Args:
        model: the robot.
        q: ``(..., nq)``.
        frame: link name or frame index.
        bodies: optional precomputed :func:`body_transforms` output.

    Returns:
        ``(..., 6, nv)``.
    """
    f = resolve_frame(model, frame)
    Rb, pb = body_transforms(model, q) if bodies is None else bodies
    _, pf = frame_transforms(model, q, [f], bodies=(Rb, pb))
    support = geometry_constants(model, f"jacobian.frame.{f}", lambda m: point_support(m, m.frame_body[f : f + 1]))
    return point_jacobians(model, Rb, pb, pf, support, angular=True)[..., 0, :, :]


class PointSupport(NamedTuple):
    """What :func:`point_jacobians` needs to know of the points' bodies
    (built once per set of points, :func:`point_support`).

    Attributes:
        mask: ``(np, nb - 1)``, 1 where moving body ``j`` carries point ``p``
            (``j`` is the point's body or one of its ancestors), else 0.
        coupling: ``(nb - 1, nj)`` body joint rates from joint coordinate
            rates (mimic multipliers included).
        has_pri: whether any joint is prismatic.
        folded: for a single point (:func:`frame_jacobian`), ``coupling``
            with the mask folded in, so that the batch needs no mask
            product; else ``None``.
    """

    mask: torch.Tensor
    coupling: torch.Tensor
    has_pri: bool
    folded: torch.Tensor | None


def point_support(model: RobotModel, point_body: torch.Tensor) -> PointSupport:
    """The :class:`PointSupport` of points fixed to the bodies ``point_body (np,)`` (long)."""
    anc = tree_schedule(model).anc  # anc[b, d] = 1 when d is b or an ancestor of b
    mask = anc.index_select(0, point_body.to(anc.device))[:, 1:].contiguous()
    G = coupling_matrix(model)
    folded = G * mask[0, :, None] if mask.shape[0] == 1 else None
    return PointSupport(mask, G, bool(model.joint_is_prismatic[1:].any()), folded)


def coupling_matrix(model: RobotModel) -> torch.Tensor:
    """``G (nb - 1, nj)``: the moving bodies' joint rates from the joint
    coordinates' rates, ``G[b - 1, coordinate_b] = multiplier_b`` (the identity
    without mimic joints); built once per model layout. Body order; the
    dynamics' fast path takes its rows in level order."""
    return geometry_constants(model, "coupling", _build_coupling)


def _build_coupling(m: RobotModel) -> torch.Tensor:
    G = torch.zeros(m.num_bodies - 1, m.num_joints, dtype=m.dtype, device=m.device)
    rows = torch.arange(m.num_bodies - 1, device=m.device)
    G[rows, m.joint_coordinate[1:]] = m.joint_multiplier[1:]
    return G


def point_jacobians(
    model: RobotModel, Rb: torch.Tensor, pb: torch.Tensor, point: torch.Tensor, support: PointSupport, *, angular: bool = False
) -> torch.Tensor:
    """Geometric Jacobians of world points fixed to bodies: the one Jacobian
    kernel of the reference path (:func:`frame_jacobian`, the contact points
    of :class:`backdrive.contact.ContactModel`).

    Column of moving body ``j`` for a point ``c`` it carries: linear
    ``a_j x (c - p_j)`` (revolute) or ``a_j`` (prismatic), angular ``a_j``
    (revolute) or 0, with ``a_j`` the joint's world axis; joint coordinates
    through ``support.coupling`` (mimic joints). A floating base's twist,
    in the base frame, has the columns ``[R0, -[c - p0]x R0]`` (linear) and
    ``[0, R0]`` (angular).

    Args:
        Rb, pb: ``(..., nb, 3, 3)``, ``(..., nb, 3)`` world body poses
            (:func:`body_transforms`).
        point: ``(..., np, 3)`` world points, m.
        support: :func:`point_support` of the points' bodies.
        angular: also the angular rows.

    Returns:
        ``(..., np, 3, nv)`` linear rows, or ``(..., np, 6, nv)``
        ``[linear; angular]`` with ``angular``.
    """
    cols = []
    if model.floating_base:
        R0 = Rb[..., 0:1, :, :]
        r = point - pb[..., 0:1, :]
        # Column i of -[r]x R0 is (R0 e_i) x r.
        lin = torch.linalg.cross(R0.transpose(-1, -2), r[..., :, None, :]).transpose(-1, -2)  # (..., np, 3, 3)
        R0 = R0.expand_as(lin)
        base = torch.cat([R0, lin], -1)
        if angular:
            base = torch.cat([base, torch.cat([torch.zeros_like(R0), R0], -1)], -2)
        cols.append(base)
    if model.num_joints:
        axes = body_axes_world(model, Rb)  # (..., nb-1, 3)
        r = point[..., :, None, :] - pb[..., None, 1:, :]  # (..., np, nb-1, 3)
        ax = axes[..., None, :, :].expand_as(r)
        lin = torch.linalg.cross(ax, r)
        if support.has_pri:
            lin = torch.where(model.joint_is_prismatic[1:, None] > 0, ax, lin)
        if angular:
            ang = ax * (1.0 - model.joint_is_prismatic[1:, None]) if support.has_pri else ax
            lin = torch.cat([lin, ang], -1)
        if support.folded is not None:
            cols.append(lin.transpose(-1, -2) @ support.folded)  # (..., 1, 3 or 6, nj)
        else:
            cols.append((lin * support.mask[..., None]).transpose(-1, -2) @ support.coupling)  # (..., np, 3 or 6, nj)
    if not cols:
        batch = broadcast_shapes(point.shape[:-2], Rb.shape[:-3])
        return point.new_zeros(*batch, point.shape[-2], 6 if angular else 3, 0)
    return torch.cat(cols, -1)

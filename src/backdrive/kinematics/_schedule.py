"""The tree's traversal schedule, built once per model, and the tree-sum primitives.

Bodies grouped by depth (``model.levels``): level ``d`` holds the bodies with
``d`` ancestors, so a recursion from the root (forward kinematics, velocities,
the outward pass of ABA) is one batched step per level, and one towards the
root (forces, composite inertias, the inward pass of ABA) the same steps in
reverse. :class:`TreeSchedule` holds that order in both index spaces the two
paths use: body order (the reference path) and level order, the levels
concatenated (the fast path, where every level is one slice).

The tree sums are the two primitives: :func:`down` (the sum over each body's
ancestors, itself included: velocities from joint velocities) and :func:`up`
(the sum over its subtree: forces, composite inertias). Both take a
:class:`TreeSums` of the bodies they run over and a ``(..., n, k)`` array
with the bodies on the second-to-last axis, in either layout.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..model import RobotModel, geometry_constants
from . import _paths

__all__ = ["TreeSchedule", "TreeSums", "tree_schedule", "tree_sums", "down", "up"]


class TreeSchedule(NamedTuple):
    """The depth levels of a model's tree (cached per geometry, dtype and device).

    Attributes:
        order: the bodies in level order (``torch.cat(model.levels)``).
        sorted: whether that is the body order.
        level_slices: per level, its positions in level order.
        parent_pos: per level-order position, its parent's position (``-1``
            for the root).
        level_parents: per level ``d >= 1``, the positions of its bodies'
            parents within level ``d - 1``: ``None`` when that level is one
            body (broadcast instead of gathering), else a ``slice`` when
            contiguous or a long tensor.
        body_levels: per level ``d >= 1``, its bodies' indices (``slice`` when
            contiguous, else a long tensor).
        anc: ``(nb, nb)`` with ``anc[b, d] = 1`` when body ``d`` is ``b`` or one
            of its ancestors, body order; ``anc_level`` the same in level order.
    """

    order: tuple
    sorted: bool
    level_slices: tuple
    parent_pos: tuple
    level_parents: tuple
    body_levels: tuple
    anc: torch.Tensor
    anc_level: torch.Tensor


def tree_schedule(model: RobotModel) -> TreeSchedule:
    """The :class:`TreeSchedule` of ``model``, built once per geometry, dtype and device."""
    return geometry_constants(model, "schedule", _build_schedule)


def _slice_or_index(idx: list, device) -> slice | torch.Tensor:
    """A contiguous run of positions as a ``slice`` (a view), else a long tensor."""
    if idx == list(range(idx[0], idx[0] + len(idx))):
        return slice(idx[0], idx[0] + len(idx))
    return torch.tensor(idx, dtype=torch.long, device=device)


def _build_schedule(model: RobotModel) -> TreeSchedule:
    device, dtype = model.device, model.dtype
    levels = [lv.tolist() for lv in model.levels]
    order = [b for lv in levels for b in lv]
    nb = len(order)
    pos = {b: k for k, b in enumerate(order)}
    parent = model.parent.tolist()
    parent_pos = tuple(-1 if parent[b] < 0 else pos[parent[b]] for b in order)
    bounds = [0]
    for lv in levels:
        bounds.append(bounds[-1] + len(lv))
    anc = torch.zeros(nb, nb, dtype=dtype)
    for b in range(nb):
        d = b
        while d >= 0:
            anc[b, d] = 1.0
            d = parent[d]
    perm = torch.tensor(order, dtype=torch.long)
    level_parents, body_levels = [], []
    for d in range(1, len(levels)):
        par = model.level_parent[d].tolist()
        level_parents.append(None if len(levels[d - 1]) == 1 else _slice_or_index(par, device))
        body_levels.append(_slice_or_index(levels[d], device))
    return TreeSchedule(
        order=tuple(order),
        sorted=order == list(range(nb)),
        level_slices=tuple(slice(bounds[d], bounds[d + 1]) for d in range(len(levels))),
        parent_pos=parent_pos,
        level_parents=tuple(level_parents),
        body_levels=tuple(body_levels),
        anc=anc.to(device),
        anc_level=anc[perm][:, perm].contiguous().to(device),
    )


class TreeSums(NamedTuple):
    """The tree sums over the bodies ``o..`` (``o = 1`` leaves out a fixed
    base's root, which is welded to the world), in body or level order.

    Attributes:
        anc: ``(n, n)`` ancestor matrix of those bodies.
        plan: level order only: the sums as one in-place add per depth level,
            ``(children, parents, shared)`` per level, with ``children`` a
            slice and ``parents`` a (strided) slice, one per child, or one
            shared by all (``shared``); ``None`` in body order, or when some
            level fits neither (then the sums are products with ``anc``).
    """

    anc: torch.Tensor
    plan: tuple | None


def tree_sums(model: RobotModel, o: int, level_order: bool) -> TreeSums:
    """The :class:`TreeSums` of the bodies ``o..`` (cached per model layout)."""
    key = f"schedule.sums.{o}.{int(level_order)}"
    return geometry_constants(model, key, lambda m: _build_sums(m, o, level_order))


def _build_sums(model: RobotModel, o: int, level_order: bool) -> TreeSums:
    s = tree_schedule(model)
    if not level_order:
        return TreeSums(s.anc[o:, o:].contiguous(), None)
    plan = []
    for d, sl in enumerate(s.level_slices):
        lo, hi = sl.start, sl.stop
        n = hi - lo
        if d == 0 or s.parent_pos[lo] < o:  # the root, or children of the welded root
            continue
        pars = [s.parent_pos[k] - o for k in range(lo, hi)]
        plan.extend(_level_pieces(lo - o, pars))
    return TreeSums(s.anc_level[o:, o:].contiguous(), None if plan is None else tuple(plan))


def _level_pieces(start: int, pars: list) -> list:
    """Split one level (children at ``start, start + 1, ...`` with parents
    ``pars``) into pieces that are each one in-place add: consecutive children
    whose parents are one shared body, or step through the bodies with one
    positive stride (a strided slice). A level whose parents follow no single
    pattern (the humanoid's: a waist and two legs, then two arms under the
    torso) becomes a few pieces instead of a product with the dense ancestor
    matrix (measured for the G1 at 10,000 samples: 7 such products took
    27 ms of a 95 ms forward dynamics call)."""
    pieces = []
    k, n = 0, len(pars)
    while k < n:
        j = k + 1
        if j < n and pars[j] == pars[k]:
            while j < n and pars[j] == pars[k]:
                j += 1
            pieces.append((slice(start + k, start + j), slice(pars[k], pars[k] + 1), True))
        else:
            step = pars[j] - pars[k] if j < n else 1
            if step > 0:
                while j < n and pars[j] - pars[j - 1] == step:
                    j += 1
            else:  # a lone child
                step, j = 1, k + 1
            pieces.append((slice(start + k, start + j), slice(pars[k], pars[j - 1] + 1, step), False))
        k = j
    return pieces


def down(sums: TreeSums, x: torch.Tensor) -> torch.Tensor:
    """Sum over each body's ancestors, itself included, along axis ``-2`` of ``x (..., n, k)``.

    One product with the ancestor matrix; on the fast path, without autograd
    and above :data:`~._paths.LEVEL_SUM_MIN_BATCH` columns, one add per depth
    level in place on ``x`` (callers pass a fresh array).
    """
    if sums.plan is None or not _paths.untracked() or x.shape[-1] <= _paths.LEVEL_SUM_MIN_BATCH:
        # One product: fewest operations for small batches; under autograd,
        # in-place slice updates would cost a full copy each in the backward.
        return torch.matmul(sums.anc, x)
    for child, par, _ in sums.plan:
        x[..., child, :].add_(x[..., par, :])
    return x


def up(sums: TreeSums, x: torch.Tensor) -> torch.Tensor:
    """Sum over each body's subtree, itself included, along axis ``-2`` of
    ``x (..., n, k)`` (in place as :func:`down`)."""
    if sums.plan is None or not _paths.untracked() or x.shape[-1] <= _paths.LEVEL_SUM_MIN_BATCH:
        return torch.matmul(sums.anc.T, x)
    for child, par, shared in reversed(sums.plan):
        x[..., par, :].add_(x[..., child, :].sum(-2, keepdim=True) if shared else x[..., child, :])
    return x

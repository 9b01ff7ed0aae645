"""The small kernels every tree algorithm is built from, written once.

Two layouts (see :mod:`backdrive.kinematics._paths`):

* batch-first, for the reference path: vectors ``(..., 3)``, spatial vectors
  ``(..., 6)`` ``[linear; angular]`` (:func:`skew`, :func:`cross_motion`,
  :func:`cross_force`, :func:`apply_inertia`, :func:`apply_inertia_columns`;
  cross products are ``torch.linalg.cross``);
* component-first, for the fast path: a vector is ``(3, ...)`` with the batch
  last, a rotation ``(3, 3, ...)``, a spatial vector a pair of such halves
  (:func:`cross`, :func:`cross_add`, :func:`rot`, :func:`rot_t`); with
  ``dim`` the component axis may be another one (:func:`skew`, :func:`cross`).

The fast kernels write into fresh buffers with ``out=`` and in place only
when nothing records the operations (:func:`~._paths.untracked`); under
autograd they are plain expressions.
"""

from __future__ import annotations

import torch

from .._shapes import broadcast_shapes
from ..runtime import active_workspace
from ..runtime import workspace_empty as new
from ._paths import untracked

__all__ = [
    "new",
    "mul",
    "div",
    "rows",
    "skew",
    "cross",
    "cross_add",
    "rot",
    "rot_t",
    "cross_motion",
    "cross_force",
    "apply_inertia",
    "apply_inertia_columns",
]


def mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a * b`` (broadcasting); without autograd and inside a
    :class:`backdrive.runtime.reuse_workspaces` block, into an array of the
    workspace (outside one, the plain product: the shape arithmetic would
    only add Python time, measured 20 % at 256 samples)."""
    if active_workspace() is None or not untracked():
        return a * b
    return torch.mul(a, b, out=new(broadcast_shapes(a.shape, b.shape), a))


def div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a / b``, into a workspace array as :func:`mul`."""
    if active_workspace() is None or not untracked():
        return a / b
    return torch.div(a, b, out=new(broadcast_shapes(a.shape, b.shape), a))


def rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x.index_select(0, index)``, into a workspace array as :func:`mul`."""
    if active_workspace() is None or not untracked():
        return x.index_select(0, index)
    return torch.index_select(x, 0, index, out=new((index.shape[0],) + tuple(x.shape[1:]), x))


def skew(a: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The cross-product matrix ``[a]x`` (``[a]x b = a x b``).

    Args:
        a: a vector with its 3 components along ``dim``.
        dim: ``-1`` (batch-first: ``(..., 3) -> (..., 3, 3)``) or ``0``
            (component-first: ``(3, ...) -> (3, 3, ...)``).
    """
    a0, a1, a2 = a.unbind(dim)
    z = torch.zeros_like(a0)
    rows = ((z, -a2, a1), (a2, z, -a0), (-a1, a0, z))
    if dim == 0:
        return torch.stack([torch.stack(r, 0) for r in rows], 0)
    return torch.stack([torch.stack(r, -1) for r in rows], -2)


def cross(a: torch.Tensor, b: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Cross product of component-first arrays (components along ``dim``,
    broadcasting).

    Components come from ``unbind``: its backward is one ``stack``, where each
    indexing ``a[k]`` would cost a zero-filled copy of ``a`` in the backward.
    """
    a0, a1, a2 = a.unbind(dim)
    b0, b1, b2 = b.unbind(dim)
    if dim != 0 or not untracked():  # out= is not differentiable
        return torch.stack(
            [
                torch.addcmul(a1 * b2, a2, b1, value=-1.0),
                torch.addcmul(a2 * b0, a0, b2, value=-1.0),
                torch.addcmul(a0 * b1, a1, b0, value=-1.0),
            ],
            dim,
        )
    out = new(broadcast_shapes(a.shape, b.shape), a)
    o0, o1, o2 = out.unbind(0)
    torch.mul(a1, b2, out=o0).addcmul_(a2, b1, value=-1.0)
    torch.mul(a2, b0, out=o1).addcmul_(a0, b2, value=-1.0)
    torch.mul(a0, b1, out=o2).addcmul_(a1, b0, value=-1.0)
    return out


def cross_add(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``out + a x b`` for ``(3, ...)`` arrays: in place on ``out`` without
    autograd (``out`` a fresh array of the full shape, aliasing neither ``a``
    nor ``b``), which saves the product's own array and one pass over memory."""
    if not untracked():
        return out + cross(a, b)
    a0, a1, a2 = a.unbind(0)
    b0, b1, b2 = b.unbind(0)
    o0, o1, o2 = out.unbind(0)
    o0.addcmul_(a1, b2).addcmul_(a2, b1, value=-1.0)
    o1.addcmul_(a2, b0).addcmul_(a0, b2, value=-1.0)
    o2.addcmul_(a0, b1).addcmul_(a1, b0, value=-1.0)
    return out


def rot(R: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``R x`` for ``R (3, 3, ...)`` and ``x (3, ...)``."""
    r0, r1, r2 = R.unbind(1)
    x0, x1, x2 = x.unbind(0)
    return mul(r0, x0).addcmul_(r1, x1).addcmul_(r2, x2)


def rot_t(R: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``R^T x`` for ``R (3, 3, ...)`` and ``x (3, ...)`` (into ``out``
    without autograd)."""
    r0, r1, r2 = R.unbind(0)
    x0, x1, x2 = x.unbind(0)
    out = mul(r0, x0) if out is None else torch.mul(r0, x0, out=out)
    return out.addcmul_(r1, x1).addcmul_(r2, x2)


# ---------------------------------------------------------------------- batch-first spatial algebra


def cross_motion(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Motion cross product ``v x m`` of ``[linear; angular]`` 6-vectors ``(..., 6)``.

    ``[w x u + v x n; w x n]`` for ``v = [v; w]``, ``m = [u; n]``.
    """
    vl, va = v[..., :3], v[..., 3:]
    ml, ma = m[..., :3], m[..., 3:]
    return torch.cat([torch.linalg.cross(va, ml) + torch.linalg.cross(vl, ma), torch.linalg.cross(va, ma)], -1)


def cross_force(v: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Force cross product ``v x* f``: ``[w x f; w x n + v x f]`` for ``f = [f; n]``."""
    vl, va = v[..., :3], v[..., 3:]
    fl, fa = f[..., :3], f[..., 3:]
    return torch.cat([torch.linalg.cross(va, fl), torch.linalg.cross(va, fa) + torch.linalg.cross(vl, fl)], -1)


def apply_inertia(m: torch.Tensor, h: torch.Tensor, I: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Spatial inertia times a motion vector, both at one point (the world origin).

    With mass ``m``, first moment ``h = m c`` and rotational inertia ``I``
    about that point: ``[m v + w x h; I w + h x v]``.

    Args:
        m: ``(..., k)``. h: ``(..., k, 3)``. I: ``(..., k, 3, 3)``.
        v: ``(..., k, 6)``.

    Returns:
        ``(..., k, 6)`` wrenches at the same point.
    """
    vl, va = v[..., :3], v[..., 3:]
    fl = m[..., None] * vl + torch.linalg.cross(va, h.expand_as(va))
    fa = (I @ va[..., None])[..., 0] + torch.linalg.cross(h.expand_as(vl), vl)
    return torch.cat([fl, fa], -1)


def apply_inertia_columns(m: torch.Tensor, h: torch.Tensor, I: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """:func:`apply_inertia` to ``j`` motion vectors per body at once.

    Args:
        m: ``(..., k)``. h: ``(..., k, 3)``. I: ``(..., k, 3, 3)``.
        X: ``(..., k, j, 6)``.

    Returns:
        ``(..., k, j, 6)``.
    """
    xl, xa = X[..., :3], X[..., 3:]
    hh = h[..., None, :].expand_as(xl)
    fl = m[..., None, None] * xl + torch.linalg.cross(xa, hh)
    fa = xa @ I.transpose(-1, -2) + torch.linalg.cross(hh, xl)
    return torch.cat([fl, fa], -1)

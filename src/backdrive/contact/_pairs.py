"""Shape-shape contact between a robot's own bodies (self-collision).

Spheres and capsules are *segments with a radius* (swept spheres): a sphere
is a segment of zero length, a capsule its axis. Boxes collide as boxes
(``_boxes.py``: sphere-box, capsule-box and box-box rows), or optionally as
the capsule along their longest axis; cylinders are approximated by capsules,
with a warning naming the link. Two swept spheres touch where their closest
points are nearer than the sum of their radii; the force law is the one of
ground contact (``_law.py``), acting with ``+F`` on the first body and ``-F``
on the second. :class:`ShapePairs` is shared with the free objects of
``_scene.py``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from .._errors import InputError
from ..model import RobotModel
from ._boxes import BOX_BOX_ROWS, box_box_rows, capsule_box_rows, closest_points_segments, sphere_box_rows
from ._geometry import ContactApproximationWarning, ContactGeometry, _as_pose
from ._law import ContactParameters, resolve_parameters

__all__ = ["SelfCollision", "ShapePairs", "closest_points_segments", "BOX_MODES", "ROWS_PER_PAIR"]


def _local_shape(model: RobotModel, shape, boxes: str = "exact", stacklevel: int = 5):
    """A shape in its body frame: ``("seg", ends (2, 3), radius)`` for spheres
    and capsules (cylinders approximated by capsules, with a warning), or
    ``("box", R (3, 3), centre (3,), half (3,))`` (with ``boxes="capsule"``:
    the capsule along its longest axis, with a warning)."""
    f = model.frame_index(shape.link)
    T = model._master["frame_placement"][f] @ _as_pose(shape.origin)
    R, p = T[:3, :3], T[:3, 3]
    kind, size = shape.kind, shape.size
    if kind == "sphere":
        return ("seg", np.stack([p, p]), float(size[0]))
    if kind in ("capsule", "cylinder"):
        r, h = float(size[0]), 0.5 * float(size[1])
        if kind == "cylinder":
            warnings.warn(
                f"link {shape.link!r}: cylinder approximated by a capsule of the same radius and length "
                "for shape-shape contact",
                ContactApproximationWarning,
                stacklevel=stacklevel,
            )
        ax = R[:, 2]
        return ("seg", np.stack([p - h * ax, p + h * ax]), r)
    half = 0.5 * np.asarray(size, dtype=np.float64)
    if boxes == "exact":
        return ("box", R, p, half)
    k = int(np.argmax(half))
    others = [i for i in range(3) if i != k]
    r = float(np.hypot(half[others[0]], half[others[1]]))
    h = max(float(half[k]) - r, 0.0)
    warnings.warn(
        f"link {shape.link!r}: box {tuple(size)} approximated by a capsule along its longest axis "
        f"(radius {r:.4g} m) for shape-shape contact (boxes='capsule')",
        ContactApproximationWarning,
        stacklevel=stacklevel,
    )
    return ("seg", np.stack([p - h * R[:, k], p + h * R[:, k]]), r)


#: Rows each pair kind contributes: swept sphere-swept sphere, sphere-box,
#: capsule-box, box-box (``_boxes.py``).
ROWS_PER_PAIR = {"ss": 1, "sb": 1, "cb": 3, "bb": BOX_BOX_ROWS}
_GROUP_ORDER = ("ss", "sb", "cb", "bb")
BOX_MODES = ("exact", "capsule")


class ShapePairs:
    """Shape pairs between bodies, compiled into contact rows by pair kind.

    Built from ``(body_a, shape_a, body_b, shape_b, label)`` entries whose
    shapes are :func:`_local_shape` tuples; a pair of a box and a swept
    sphere is stored box second. Rows: the ``"ss"`` pairs first (one row
    each), then ``"sb"`` (1), ``"cb"`` (3) and ``"bb"`` (25), each group in
    entry order. ``labels``, ``body_a`` and ``body_b`` give each row's pair.
    """

    def __init__(self, entries, dtype, device):
        groups = {g: [] for g in _GROUP_ORDER}
        for ba, sa, bb, sb, label in entries:
            if sa[0] == "box" and sb[0] == "seg":
                ba, sa, bb, sb = bb, sb, ba, sa
                label = (label[1], label[0])
            if sa[0] == "seg" and sb[0] == "seg":
                g = "ss"
            elif sa[0] == "seg":
                g = "sb" if np.allclose(sa[1][0], sa[1][1]) else "cb"
            else:
                g = "bb"
            groups[g].append((ba, sa, bb, sb, label))

        def tens(x, dtype=dtype):
            return torch.as_tensor(np.asarray(x, dtype=np.float64 if dtype != torch.long else np.int64), dtype=dtype, device=device)

        self.groups = []
        labels, body_a, body_b = [], [], []
        for g in _GROUP_ORDER:
            rows = groups[g]
            if not rows:
                continue
            k = ROWS_PER_PAIR[g]
            data = {
                "body_a": tens([r[0] for r in rows], torch.long),
                "body_b": tens([r[2] for r in rows], torch.long),
            }
            for side, i in (("a", 1), ("b", 3)):
                shapes = [r[i] for r in rows]
                if shapes[0][0] == "seg":
                    data[f"seg_{side}"] = tens([s[1] for s in shapes]).reshape(-1, 2, 3)
                    data[f"radius_{side}"] = tens([s[2] for s in shapes]).reshape(-1)
                else:
                    data[f"R_{side}"] = tens([s[1] for s in shapes]).reshape(-1, 3, 3)
                    data[f"c_{side}"] = tens([s[2] for s in shapes]).reshape(-1, 3)
                    data[f"half_{side}"] = tens([s[3] for s in shapes]).reshape(-1, 3)
            self.groups.append((g, data))
            for r in rows:
                labels += [r[4]] * k
                body_a += [r[0]] * k
                body_b += [r[2]] * k
        self.labels = tuple(labels)
        self.body_a = tens(body_a, torch.long).reshape(-1)
        self.body_b = tens(body_b, torch.long).reshape(-1)

    @property
    def num_rows(self) -> int:
        return len(self.labels)

    def detect(self, Ra: torch.Tensor, pa: torch.Tensor, Rb: torch.Tensor, pb: torch.Tensor):
        """World contact rows from the body poses of the two sides.

        Args:
            Ra, pa: ``(..., nb_a, 3, 3)``, ``(..., nb_a, 3)`` world poses of
                the bodies the first shapes are on (``body_a`` indexes them).
            Rb, pb: the same for the second shapes (the same tensors for
                self-collision).

        Returns:
            ``point (..., rows, 3)``, ``normal (..., rows, 3)`` from the
            second shape into the first, ``penetration (..., rows)``.
        """
        pts, ns, phis = [], [], []
        for g, d in self.groups:
            RA, pA = Ra.index_select(-3, d["body_a"]), pa.index_select(-2, d["body_a"])
            RB, pB = Rb.index_select(-3, d["body_b"]), pb.index_select(-2, d["body_b"])
            batch = torch.broadcast_shapes(RA.shape[:-3], RB.shape[:-3])
            if g == "ss":
                A = _seg_world(RA, pA, d["seg_a"])
                B = _seg_world(RB, pB, d["seg_b"])
                out = _swept_rows(A, B, d["radius_a"], d["radius_b"])
            else:
                Rb_, cb_ = _box_world(RB, pB, d["R_b"], d["c_b"])
                hb = d["half_b"]
                if g == "bb":
                    Ra_, ca_ = _box_world(RA, pA, d["R_a"], d["c_a"])
                    out = box_box_rows(Ra_, ca_, d["half_a"], Rb_, cb_, hb)
                else:
                    A = _seg_world(RA, pA, d["seg_a"])
                    if g == "sb":
                        out = sphere_box_rows(A[..., 0, :], d["radius_a"].expand(A.shape[:-2]), Rb_, cb_, hb)
                    else:
                        out = capsule_box_rows(A[..., 0, :], A[..., 1, :], d["radius_a"].expand(A.shape[:-2]), Rb_, cb_, hb)
            pt, n, phi = out
            P, k = pt.shape[-3], pt.shape[-2]
            pts.append(pt.expand(*batch, P, k, 3).reshape(*batch, P * k, 3))
            ns.append(n.expand(*batch, P, k, 3).reshape(*batch, P * k, 3))
            phis.append(phi.expand(*batch, P, k).reshape(*batch, P * k))
        batch = torch.broadcast_shapes(*(p.shape[:-2] for p in pts))
        cat = lambda xs, tail: torch.cat([x.expand(*batch, *x.shape[-tail:]) for x in xs], -tail)
        return cat(pts, 2), cat(ns, 2), cat(phis, 1)


def _seg_world(R, p, seg):
    """``(..., P, 2, 3)`` world end points of body-frame segments ``(P, 2, 3)``."""
    return seg @ R.transpose(-1, -2) + p[..., None, :]


def _box_world(R, p, Rl, cl):
    """World orientation ``(..., P, 3, 3)`` and centre ``(..., P, 3)`` of body-frame boxes."""
    return R @ Rl, (R @ cl[..., None])[..., 0] + p


def _swept_rows(A, B, ra, rb):
    """One row per pair of swept spheres (segments ``(..., P, 2, 3)`` with radii)."""
    ca, cb = closest_points_segments(A[..., 0, :], A[..., 1, :], B[..., 0, :], B[..., 1, :])
    diff = ca - cb
    d2 = (diff * diff).sum(-1)
    tiny = torch.finfo(d2.dtype).eps
    # Coincident axes have no normal: fall back to +z, with the branch
    # not taken kept finite (torch.where back-propagates through both).
    ok = d2 > tiny * tiny
    d = torch.sqrt(torch.where(ok, d2, torch.ones_like(d2)))
    z = torch.zeros_like(diff)
    z[..., 2] = 1.0
    n = torch.where(ok[..., None], diff / d[..., None], z)
    d = torch.where(ok, d, torch.zeros_like(d))
    phi = ra + rb - d
    point = 0.5 * ((ca - ra[..., None] * n) + (cb + rb[..., None] * n))
    return point[..., None, :], n[..., None, :], phi[..., None]


@dataclass(frozen=True, eq=False)
class SelfCollision:
    """Contact pairs between a robot's own shapes, with a filter.

    Args:
        robot: the model.
        geometry: the shapes to test (default: the URDF's collision shapes).
        params: the force law of every row (values ``()`` or ``(nrows,)``
            in row order, :attr:`pairs`); default :class:`ContactParameters`.
        exclude: link-name pairs never to test (order does not matter).
        adjacent: also test shapes whose bodies are parent and child (by
            default excluded: their shapes usually overlap at the joint).
        boxes: ``"exact"`` (default): boxes collide as boxes (sphere-box 1
            row, capsule-box 3 rows, box-box 25 rows, ``_boxes.py``);
            ``"capsule"``: as the capsule along their longest axis (1 row
            per pair, with a warning).

    Shapes on the same body are never tested. A pair of rows has one entry
    in :attr:`pairs` per row (a box-box pair appears 25 times).

    Raises:
        UnknownNameError: an excluded link is not a link of the robot.
        InputError: an exclude entry that is not a pair, an unknown ``boxes``.
    """

    robot_name: str
    fingerprint: str
    pairs: tuple[tuple[str, str], ...]
    body_a: torch.Tensor
    body_b: torch.Tensor
    params: ContactParameters
    shape_pairs: ShapePairs

    @classmethod
    def build(
        cls,
        robot: RobotModel,
        geometry: ContactGeometry | None = None,
        *,
        params: ContactParameters | None = None,
        exclude: Iterable[Sequence[str]] = (),
        adjacent: bool = False,
        boxes: str = "exact",
    ) -> SelfCollision:
        if boxes not in BOX_MODES:
            raise InputError(f"unknown boxes mode {boxes!r}; valid: {', '.join(BOX_MODES)}")
        geometry = ContactGeometry.from_model(robot) if geometry is None else geometry
        geometry.check_robot(robot)
        excluded = set()
        for pair in exclude:
            if isinstance(pair, str) or len(pair) != 2:
                raise InputError(f"exclude entries must be pairs of link names, got {pair!r}")
            for name in pair:
                robot.frame_index(name)  # typed error naming the unknown link
            excluded.add(frozenset(pair))
        parent = robot.parent.tolist()
        local = [_local_shape(robot, s, boxes) for s in geometry.shapes]
        bodies = geometry.shape_body
        entries = []
        for i, si in enumerate(geometry.shapes):
            for j in range(i + 1, len(geometry.shapes)):
                sj = geometry.shapes[j]
                bi, bj = bodies[i], bodies[j]
                if bi == bj:
                    continue
                if not adjacent and (parent[bi] == bj or parent[bj] == bi):
                    continue
                if frozenset((si.link, sj.link)) in excluded or (si.link == sj.link):
                    continue
                entries.append((bi, local[i], bj, local[j], (si.link, sj.link)))
        sp = ShapePairs(entries, robot.dtype, robot.device)
        return cls(
            robot_name=robot.name,
            fingerprint=robot.fingerprint,
            pairs=sp.labels,
            body_a=sp.body_a,
            body_b=sp.body_b,
            params=ContactParameters() if params is None else params,
            shape_pairs=sp,
        )

    @property
    def num_pairs(self) -> int:
        """The number of contact rows (a box-box pair has 25)."""
        return len(self.pairs)

    def resolved(self, robot: RobotModel) -> dict:
        """The checked parameters (errors name the pair)."""
        labels = [f"{a}/{b}" for a, b in self.pairs]
        return resolve_parameters(self.params, labels, robot.dtype, robot.device)

    def detect(self, Rb: torch.Tensor, pb: torch.Tensor):
        """World contact points, normals (from the second shape to the first)
        and penetrations, ``(..., nrows, ...)``, from the body poses."""
        return self.shape_pairs.detect(Rb, pb, Rb, pb)

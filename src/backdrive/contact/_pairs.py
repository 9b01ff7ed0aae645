"""Shape-shape contact between a robot's own bodies (self-collision).

Every shape becomes a *segment with a radius* (a swept sphere): a sphere is a
segment of zero length, a capsule its axis. Boxes and cylinders are
approximated by the capsule along their longest axis, with a warning naming
the link. Two swept spheres touch where their closest points are nearer than
the sum of their radii; the force law is the one of ground contact
(``_law.py``), acting with ``+F`` on the first body and ``-F`` on the second.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from .._errors import InputError
from ..model import RobotModel
from ._geometry import ContactApproximationWarning, ContactGeometry, _as_pose
from ._law import ContactParameters, resolve_parameters

__all__ = ["SelfCollision", "closest_points_segments"]


def _segment(robot: RobotModel, shape, stacklevel: int = 4):
    """Body-frame segment end points ``(2, 3)`` and radius of a shape."""
    f = robot.frame_index(shape.link)
    T = robot._master["frame_placement"][f] @ _as_pose(shape.origin)
    R, p = T[:3, :3], T[:3, 3]
    kind, size = shape.kind, shape.size
    if kind == "sphere":
        return np.stack([p, p]), float(size[0])
    if kind in ("capsule", "cylinder"):
        r, h = float(size[0]), 0.5 * float(size[1])
        if kind == "cylinder":
            warnings.warn(
                f"link {shape.link!r}: cylinder approximated by a capsule of the same radius and length "
                "for self-collision",
                ContactApproximationWarning,
                stacklevel=stacklevel,
            )
        ax = R[:, 2]
        return np.stack([p - h * ax, p + h * ax]), r
    half = 0.5 * np.asarray(size, dtype=np.float64)
    k = int(np.argmax(half))
    others = [i for i in range(3) if i != k]
    r = float(np.hypot(half[others[0]], half[others[1]]))
    h = max(float(half[k]) - r, 0.0)
    warnings.warn(
        f"link {shape.link!r}: box {tuple(size)} approximated by a capsule along its longest axis "
        f"(radius {r:.4g} m) for self-collision",
        ContactApproximationWarning,
        stacklevel=stacklevel,
    )
    return np.stack([p - h * R[:, k], p + h * R[:, k]]), r


def closest_points_segments(p1, q1, p2, q2):
    """Closest points of segments ``[p1, q1]`` and ``[p2, q2]`` (``(..., 3)`` each).

    The clamped solution of Ericson's *Real-Time Collision Detection* (5.1.9),
    written with ``torch.where`` on safe denominators so that degenerate
    segments (points) and parallel segments keep finite values and gradients.

    Returns:
        ``c1 (..., 3)`` on the first segment and ``c2 (..., 3)`` on the second.
    """
    d1, d2, r = q1 - p1, q2 - p2, p1 - p2
    a = (d1 * d1).sum(-1)
    e = (d2 * d2).sum(-1)
    f = (d2 * r).sum(-1)
    c = (d1 * r).sum(-1)
    b = (d1 * d2).sum(-1)
    tiny = torch.finfo(a.dtype).eps
    one = torch.ones_like(a)
    a_ok, e_ok = a > tiny, e > tiny
    a_s = torch.where(a_ok, a, one)
    e_s = torch.where(e_ok, e, one)
    denom = a * e - b * b
    den_ok = denom > tiny * torch.clamp_min(a * e, tiny)
    den_s = torch.where(den_ok, denom, one)
    s = torch.where(den_ok, ((b * f - c * e) / den_s).clamp(0.0, 1.0), torch.zeros_like(a))
    t = (b * s + f) / e_s
    s_lo = (-c / a_s).clamp(0.0, 1.0)
    s_hi = ((b - c) / a_s).clamp(0.0, 1.0)
    s = torch.where(t < 0, s_lo, torch.where(t > 1, s_hi, s))
    t = t.clamp(0.0, 1.0)
    # Degenerate segments: a point against a segment (either way), or two points.
    both = a_ok & e_ok
    zero = torch.zeros_like(a)
    s = torch.where(both, s, torch.where(a_ok, s_lo, zero))
    t = torch.where(both, t, torch.where(e_ok, (f / e_s).clamp(0.0, 1.0), zero))
    return p1 + s[..., None] * d1, p2 + t[..., None] * d2


@dataclass(frozen=True, eq=False)
class SelfCollision:
    """Contact pairs between a robot's own shapes, with a filter.

    Args:
        robot: the model.
        geometry: the shapes to test (default: the URDF's collision shapes).
        params: the force law of every pair (values ``()`` or ``(npairs,)``
            in ``pairs`` order); default :class:`ContactParameters`.
        exclude: link-name pairs never to test (order does not matter).
        adjacent: also test shapes whose bodies are parent and child (by
            default excluded: their shapes usually overlap at the joint).

    Shapes on the same body are never tested.

    Raises:
        UnknownNameError: an excluded link is not a link of the robot.
    """

    robot_name: str
    fingerprint: str
    pairs: tuple[tuple[str, str], ...]
    body_a: torch.Tensor
    body_b: torch.Tensor
    seg_a: torch.Tensor
    seg_b: torch.Tensor
    radius_a: torch.Tensor
    radius_b: torch.Tensor
    params: ContactParameters

    @classmethod
    def build(
        cls,
        robot: RobotModel,
        geometry: ContactGeometry | None = None,
        *,
        params: ContactParameters | None = None,
        exclude: Iterable[Sequence[str]] = (),
        adjacent: bool = False,
    ) -> SelfCollision:
        geometry = ContactGeometry.from_model(robot) if geometry is None else geometry
        geometry.check_robot(robot)
        excluded = set()
        for pair in exclude:
            if len(pair) != 2:
                raise InputError(f"exclude entries must be pairs of link names, got {pair!r}")
            for name in pair:
                robot.frame_index(name)  # typed error naming the unknown link
            excluded.add(frozenset(pair))
        parent = robot.parent.tolist()
        segs = [_segment(robot, s) for s in geometry.shapes]
        bodies = geometry.shape_body
        rows = []
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
                rows.append((i, j))
        dt, dev = robot.dtype, robot.device

        def tens(x, dtype=dt):
            return torch.as_tensor(np.asarray(x), dtype=dtype, device=dev)

        shapes = geometry.shapes
        return cls(
            robot_name=robot.name,
            fingerprint=robot.fingerprint,
            pairs=tuple((shapes[i].link, shapes[j].link) for i, j in rows),
            body_a=tens([bodies[i] for i, _ in rows], torch.long).reshape(-1),
            body_b=tens([bodies[j] for _, j in rows], torch.long).reshape(-1),
            seg_a=tens([segs[i][0] for i, _ in rows]).reshape(-1, 2, 3),
            seg_b=tens([segs[j][0] for _, j in rows]).reshape(-1, 2, 3),
            radius_a=tens([segs[i][1] for i, _ in rows]).reshape(-1),
            radius_b=tens([segs[j][1] for _, j in rows]).reshape(-1),
            params=ContactParameters() if params is None else params,
        )

    @property
    def num_pairs(self) -> int:
        return len(self.pairs)

    def resolved(self, robot: RobotModel) -> dict:
        """The checked parameters (errors name the pair)."""
        labels = [f"{a}/{b}" for a, b in self.pairs]
        return resolve_parameters(self.params, labels, robot.dtype, robot.device)

    def detect(self, Rb: torch.Tensor, pb: torch.Tensor):
        """World closest points, normals (from the second shape to the first),
        penetration and the contact point, ``(..., npairs, ...)``."""

        def world(seg, body):
            R = Rb.index_select(-3, body)[..., None, :, :]  # (..., P, 1, 3, 3)
            return (R @ seg[..., None])[..., 0] + pb.index_select(-2, body)[..., None, :]

        A = world(self.seg_a, self.body_a)
        B = world(self.seg_b, self.body_b)
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
        phi = self.radius_a + self.radius_b - d
        point = 0.5 * ((ca - self.radius_a[..., None] * n) + (cb + self.radius_b[..., None] * n))
        return point, n, phi

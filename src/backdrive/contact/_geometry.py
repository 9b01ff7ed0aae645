"""Contact geometry on the moving bodies of a robot.

Every shape is compiled once into *contact points*: a body index, a position
in the body frame and a radius. A sphere is one point with its radius, a
capsule two (the centres of its end caps), a box its eight corners (radius 0),
a cylinder ``2 * rim_points`` points on the rims of its end faces (radius 0).
Against a plane or a heightfield each point is a candidate contact; the force
law (``_law.py``) switches it on smoothly. This is the vertex-and-sphere
contact of most penalty simulators (dflex/DiffRL, Tiny Differentiable
Simulator) and is exact for spheres, capsules and boxes on flat ground.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

from .._errors import ContactApproximationWarning, InputError, InvalidValueError, UnknownNameError
from ..model import RobotModel
from ..model._meshes import resolve_mesh_path

__all__ = ["ContactShape", "ContactGeometry", "ContactApproximationWarning", "SHAPE_KINDS", "MESH_RULES"]

#: Shape kinds a :class:`ContactShape` may have.
SHAPE_KINDS = ("sphere", "capsule", "box", "cylinder")

#: How :meth:`ContactGeometry.from_model` treats URDF meshes.
MESH_RULES = ("box", "sphere", "skip", "error")




@dataclass(frozen=True)
class ContactShape:
    """One contact shape on a link.

    Args:
        link: URDF link name (a fixed-joint child link is fine: its shape is
            moved onto the body the link hangs from).
        kind: ``"sphere"``, ``"capsule"``, ``"box"`` or ``"cylinder"``.
        size: sphere ``(radius,)``; capsule and cylinder ``(radius, length)``
            along the shape's local z axis (a capsule's length is that of its
            straight part, between the centres of the end caps); box
            ``(sx, sy, sz)`` full side lengths. Metres.
        origin: ``(4, 4)`` link-from-shape pose (identity if ``None``).
    """

    link: str
    kind: str
    size: tuple[float, ...]
    origin: np.ndarray | None = field(default=None, repr=False)


def _as_pose(origin) -> np.ndarray:
    if origin is None:
        return np.eye(4)
    T = np.asarray(origin.detach().cpu() if isinstance(origin, torch.Tensor) else origin, dtype=np.float64)
    if T.shape == (3,):
        out = np.eye(4)
        out[:3, 3] = T
        return out
    if T.shape != (4, 4):
        raise InputError(f"a shape origin must be a (4, 4) pose or a (3,) offset, got shape {T.shape}")
    return T


def _shape_points(kind: str, size: tuple[float, ...], link: str, rim_points: int):
    """Points ``(k, 3)`` in the shape frame and their radii ``(k,)``."""
    n_expected = {"sphere": 1, "capsule": 2, "box": 3, "cylinder": 2}[kind]
    if len(size) != n_expected:
        raise InvalidValueError(
            f"contact shape {kind!r} on link {link!r} needs {n_expected} size values, got {tuple(size)}"
        )
    if not all(math.isfinite(s) and s >= 0 for s in size):
        raise InvalidValueError(f"contact shape {kind!r} on link {link!r} has an invalid size {tuple(size)}")
    if kind == "sphere":
        return np.zeros((1, 3)), np.array([size[0]])
    if kind == "capsule":
        r, h = size[0], 0.5 * size[1]
        return np.array([[0.0, 0.0, -h], [0.0, 0.0, h]]), np.array([r, r])
    if kind == "box":
        half = 0.5 * np.asarray(size)
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=np.float64)
        return signs * half, np.zeros(8)
    r, h = size[0], 0.5 * size[1]
    ang = 2.0 * np.pi * np.arange(rim_points) / rim_points
    ring = np.stack([r * np.cos(ang), r * np.sin(ang), np.zeros(rim_points)], -1)
    pts = np.concatenate([ring + [0.0, 0.0, -h], ring + [0.0, 0.0, h]])
    return pts, np.zeros(2 * rim_points)


@dataclass(frozen=True, eq=False)
class ContactGeometry:
    """Contact shapes of one robot, compiled into contact points.

    Build it with :meth:`from_model` (the URDF ``<collision>`` shapes),
    :meth:`spheres` or :meth:`from_shapes`; combine with ``+`` and
    :meth:`without`.

    Attributes (``ns`` shapes, ``np`` points):
        robot_name, fingerprint: the robot this geometry belongs to.
        shapes: the :class:`ContactShape` list, ``ns`` of them.
        shape_body: ``(ns,)`` body index of each shape.
        point_body: ``(np,)`` long, body index of each contact point.
        point_shape: ``(np,)`` long, shape index of each point.
        point_local: ``(np, 3)`` point in its body frame, m.
        point_radius: ``(np,)`` radius around the point, m (0 for corners).
    """

    robot_name: str
    fingerprint: str
    shapes: tuple[ContactShape, ...]
    shape_body: tuple[int, ...]
    point_body: torch.Tensor
    point_shape: torch.Tensor
    point_local: torch.Tensor
    point_radius: torch.Tensor
    rim_points: int = 8

    # ------------------------------------------------------------ builders

    @classmethod
    def from_shapes(cls, robot: RobotModel, shapes: Sequence[ContactShape], *, rim_points: int = 8) -> ContactGeometry:
        """Geometry from explicit :class:`ContactShape` objects.

        Raises:
            UnknownNameError: a shape names a link the robot does not have.
            InvalidValueError: an unknown kind or a bad size.
        """
        if not isinstance(rim_points, int) or rim_points < 3:
            raise InputError(f"rim_points must be an int >= 3, got {rim_points!r}")
        bodies, local, radius, owner, shape_body, kept = [], [], [], [], [], []
        fb = robot.frame_body.tolist()
        for s in shapes:
            if not isinstance(s, ContactShape):
                raise InputError(f"shapes must be ContactShape objects, got {type(s).__name__}")
            if s.kind not in SHAPE_KINDS:
                raise InvalidValueError(
                    f"contact shape on link {s.link!r} has unknown kind {s.kind!r}; valid: {', '.join(SHAPE_KINDS)}"
                )
            f = robot.frame_index(s.link)
            b = fb[f]
            T_body_shape = robot._master["frame_placement"][f] @ _as_pose(s.origin)
            pts, rad = _shape_points(s.kind, tuple(float(x) for x in s.size), s.link, rim_points)
            pts_body = pts @ T_body_shape[:3, :3].T + T_body_shape[:3, 3]
            bodies.append(np.full(len(pts), b))
            local.append(pts_body)
            radius.append(rad)
            owner.append(np.full(len(pts), len(kept)))
            shape_body.append(b)
            kept.append(ContactShape(s.link, s.kind, tuple(float(x) for x in s.size), _as_pose(s.origin)))
        dt, dev = robot.dtype, robot.device

        def cat(parts, shape, dtype):
            if not parts:
                return torch.zeros(shape, dtype=dtype, device=dev)
            return torch.from_numpy(np.concatenate(parts)).to(dtype=dtype, device=dev)

        return cls(
            robot_name=robot.name,
            fingerprint=robot.fingerprint,
            shapes=tuple(kept),
            shape_body=tuple(shape_body),
            point_body=cat(bodies, (0,), torch.long),
            point_shape=cat(owner, (0,), torch.long),
            point_local=cat(local, (0, 3), dt),
            point_radius=cat(radius, (0,), dt),
            rim_points=rim_points,
        )

    @classmethod
    def spheres(
        cls,
        robot: RobotModel,
        radii: Mapping[str, float],
        offsets: Mapping[str, Sequence[float]] | None = None,
    ) -> ContactGeometry:
        """One sphere per named link, e.g. ``spheres(robot, {"FL_foot": 0.02, ...})``.

        Args:
            radii: link name -> radius, m.
            offsets: optional link name -> ``(3,)`` centre in the link frame, m.
        """
        offsets = dict(offsets or {})
        unknown = [k for k in offsets if k not in radii]
        if unknown:
            raise UnknownNameError("sphere link", unknown[0], list(radii), context="(in offsets)")
        return cls.from_shapes(
            robot, [ContactShape(link, "sphere", (float(r),), offsets.get(link)) for link, r in radii.items()]
        )

    @classmethod
    def from_model(
        cls,
        robot: RobotModel,
        links: Sequence[str] | None = None,
        *,
        cylinders: str = "cylinder",
        meshes: str = "box",
        rim_points: int = 8,
        package_dirs: Sequence[str | Path] | None = None,
    ) -> ContactGeometry:
        """The robot's URDF ``<collision>`` shapes as contact geometry.

        Args:
            robot: the model (its ``collisions``).
            links: only the shapes of these links (all links if ``None``).
            cylinders: ``"cylinder"`` (rim points) or ``"capsule"`` (URDF
                cylinders read as capsules of the same radius and straight
                length, as Gazebo/MuJoCo users often mean; the URDF format
                cannot say ``capsule``).
            meshes: ``"box"`` (the axis-aligned bounding box of the mesh's
                vertices, in the mesh frame, scaled; needs ``trimesh`` and a
                findable file), ``"sphere"`` (the sphere around that box),
                ``"skip"`` or ``"error"``. Every approximation or skip emits
                a :class:`ContactApproximationWarning` naming the link.
            rim_points: points per rim of a cylinder's end faces.
            package_dirs: extra folders to search for ``package://`` meshes.

        Raises:
            UnknownNameError: a name in ``links`` is not a link of the robot.
            InvalidValueError: ``meshes="error"`` and a link has a mesh, or a
                bad option.
        """
        if cylinders not in ("cylinder", "capsule"):
            raise InvalidValueError(f"cylinders must be 'cylinder' or 'capsule', got {cylinders!r}")
        if meshes not in MESH_RULES:
            raise InvalidValueError(f"meshes must be one of {', '.join(MESH_RULES)}, got {meshes!r}")
        wanted = None
        if links is not None:
            for name in links:
                robot.frame_index(name)  # typed error for unknown names
            wanted = set(links)
        shapes = []
        for fg in robot.collisions:
            if wanted is not None and fg.link not in wanted:
                continue
            g = fg.geometry
            if g.kind == "sphere":
                shapes.append(ContactShape(fg.link, "sphere", g.params, g.origin))
            elif g.kind == "box":
                shapes.append(ContactShape(fg.link, "box", g.params, g.origin))
            elif g.kind == "cylinder":
                shapes.append(ContactShape(fg.link, "capsule" if cylinders == "capsule" else "cylinder", g.params, g.origin))
            else:
                s = _mesh_shape(robot, fg.link, g, meshes, package_dirs)
                if s is not None:
                    shapes.append(s)
        return cls.from_shapes(robot, shapes, rim_points=rim_points)

    # ------------------------------------------------------------ editing

    def __add__(self, other: ContactGeometry) -> ContactGeometry:
        if not isinstance(other, ContactGeometry):
            return NotImplemented
        if other.fingerprint != self.fingerprint:
            raise InputError(
                f"cannot combine contact geometry of robot {self.robot_name!r} with that of {other.robot_name!r}"
            )
        ns = len(self.shapes)
        return ContactGeometry(
            robot_name=self.robot_name,
            fingerprint=self.fingerprint,
            shapes=self.shapes + other.shapes,
            shape_body=self.shape_body + other.shape_body,
            point_body=torch.cat([self.point_body, other.point_body]),
            point_shape=torch.cat([self.point_shape, other.point_shape + ns]),
            point_local=torch.cat([self.point_local, other.point_local]),
            point_radius=torch.cat([self.point_radius, other.point_radius]),
            rim_points=self.rim_points,
        )

    def without(self, robot: RobotModel, *links: str) -> ContactGeometry:
        """The same geometry without the shapes of ``links`` (to replace them)."""
        self.check_robot(robot)
        for name in links:
            robot.frame_index(name)
        keep = [s for s in self.shapes if s.link not in links]
        return ContactGeometry.from_shapes(robot, keep, rim_points=self.rim_points)

    # ------------------------------------------------------------ facts

    @property
    def num_shapes(self) -> int:
        return len(self.shapes)

    @property
    def num_points(self) -> int:
        return int(self.point_body.shape[0])

    @property
    def shape_links(self) -> tuple[str, ...]:
        """Link name of each shape."""
        return tuple(s.link for s in self.shapes)

    def check_robot(self, robot: RobotModel) -> None:
        """Raise :class:`InputError` unless this geometry was built for ``robot``."""
        if robot.fingerprint != self.fingerprint:
            raise InputError(
                f"this contact geometry was built for robot {self.robot_name!r}, not for {robot.name!r} "
                "(or a model with a different tree)"
            )

    def to(self, device=None, dtype=None) -> ContactGeometry:
        """The same geometry with its floating tensors in ``dtype`` on ``device``."""
        fl = {"dtype": dtype} if dtype is not None else {}
        return ContactGeometry(
            robot_name=self.robot_name,
            fingerprint=self.fingerprint,
            shapes=self.shapes,
            shape_body=self.shape_body,
            point_body=self.point_body.to(device=device),
            point_shape=self.point_shape.to(device=device),
            point_local=self.point_local.to(device=device, **fl),
            point_radius=self.point_radius.to(device=device, **fl),
            rim_points=self.rim_points,
        )

    def __repr__(self) -> str:
        kinds: dict[str, int] = {}
        for s in self.shapes:
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
        desc = ", ".join(f"{n} {k}" for k, n in kinds.items()) or "no shapes"
        return f"ContactGeometry(robot={self.robot_name!r}, {desc}, {self.num_points} points)"


def _mesh_shape(robot: RobotModel, link: str, g, rule: str, package_dirs) -> ContactShape | None:
    """A box or sphere around a collision mesh, or ``None`` (skipped), with a warning."""
    if rule == "error":
        raise InvalidValueError(
            f"link {link!r} has a collision mesh {g.filename!r}; contact needs primitives: pass "
            "meshes='box' or 'sphere' to approximate it, 'skip' to leave it out, or add shapes in code"
        )
    if rule == "skip":
        warnings.warn(
            f"link {link!r}: collision mesh {g.filename!r} left out of the contact geometry (meshes='skip')",
            ContactApproximationWarning,
            stacklevel=3,
        )
        return None
    bounds = _mesh_bounds(robot, g.filename, package_dirs)
    if bounds is None:
        warnings.warn(
            f"link {link!r}: collision mesh {g.filename!r} could not be loaded (file not found or trimesh "
            "not installed); it is left out of the contact geometry. Add a shape for it in code "
            "(ContactGeometry.spheres / from_shapes).",
            ContactApproximationWarning,
            stacklevel=3,
        )
        return None
    lo, hi = bounds * np.asarray(g.params)  # scale per axis (a negative scale flips the pair)
    lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)
    centre = 0.5 * (lo + hi)
    offset = np.eye(4)
    offset[:3, 3] = centre
    origin = g.origin @ offset
    if rule == "box":
        size = tuple(float(x) for x in (hi - lo))
        warnings.warn(
            f"link {link!r}: collision mesh {g.filename!r} approximated by its bounding box "
            f"{tuple(round(s, 4) for s in size)} m (contact at its 8 corners)",
            ContactApproximationWarning,
            stacklevel=3,
        )
        return ContactShape(link, "box", size, origin)
    r = float(0.5 * np.linalg.norm(hi - lo))
    warnings.warn(
        f"link {link!r}: collision mesh {g.filename!r} approximated by the sphere around its bounding box "
        f"(radius {r:.4g} m)",
        ContactApproximationWarning,
        stacklevel=3,
    )
    return ContactShape(link, "sphere", (r,), origin)


def _mesh_bounds(robot: RobotModel, filename: str, package_dirs) -> np.ndarray | None:
    """``(2, 3)`` axis-aligned bounds of a mesh's vertices, or ``None`` if it cannot be read."""
    try:
        import trimesh
    except ImportError:
        return None
    urdf_dir = Path(robot.source_path).parent if robot.source_path is not None else None
    path = resolve_mesh_path(filename, urdf_dir=urdf_dir, package_dirs=package_dirs)
    if path is None:
        return None
    try:
        mesh = trimesh.load(str(path), force="mesh")
        bounds = np.asarray(mesh.bounds, dtype=np.float64)
    except Exception:  # noqa: BLE001 - any unreadable file means "cannot approximate"
        return None
    if bounds.shape != (2, 3) or not np.all(np.isfinite(bounds)):
        return None
    return bounds

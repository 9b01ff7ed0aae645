"""Robot geometry for the viewers: mesh lookup, placeholders, scene nodes, poses.

Everything here works on numpy arrays in float64; tensors are converted at the
public boundary (``_preview``, ``_live``). viser is passed in, never imported
at module level, so ``backdrive.viz`` imports without the ``[viz]`` extra.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._errors import InputError
from ..model import RobotModel
from ..model._meshes import default_package_dirs, resolve_mesh_path

__all__ = [
    "Shape",
    "robot_shapes",
    "resolve_mesh_path",
    "default_package_dirs",
    "neutral_configuration",
    "link_poses",
    "matrix_to_wxyz",
    "add_shapes",
]

#: Colour of links whose URDF gives none (RGB, 0-1).
DEFAULT_RGBA = (0.72, 0.74, 0.78, 1.0)
#: Colour of the placeholder drawn where a mesh file is missing or unreadable.
PLACEHOLDER_RGBA = (1.0, 0.2, 0.75, 0.45)
#: Edge of the placeholder box when nothing else tells the link's size, metres.
PLACEHOLDER_SIZE = 0.04
#: Opacity of a collision shape drawn in place of a missing visual mesh.
FALLBACK_OPACITY = 0.55


@dataclass(frozen=True)
class Shape:
    """One drawable shape hanging from a link frame.

    Attributes:
        frame: index of the link in ``model.link_names``.
        kind: ``"box"``, ``"sphere"``, ``"cylinder"`` or ``"mesh"``.
        params: box ``(sx, sy, sz)``, sphere ``(r,)``, cylinder ``(r, length)``
            along local z; unused for meshes (the scale is in ``vertices``).
        origin: ``(4, 4)`` pose of the shape in the link frame.
        rgba: colour, components in ``[0, 1]``.
        vertices, faces: mesh data, ``(V, 3)`` float metres and ``(F, 3)`` int.
        glb: the mesh as GLB bytes when it carries its own colours or textures.
        placeholder: ``True`` when this stands in for a mesh that could not be
            loaded (a collision shape or a small box, drawn translucent).
    """

    frame: int
    kind: str
    params: tuple[float, ...]
    origin: np.ndarray = field(repr=False)
    rgba: tuple[float, float, float, float] = DEFAULT_RGBA
    vertices: np.ndarray | None = field(default=None, repr=False)
    faces: np.ndarray | None = field(default=None, repr=False)
    glb: bytes | None = field(default=None, repr=False)
    placeholder: bool = False


# --------------------------------------------------------------------------- meshes


def _load_mesh(path: Path, scale) -> tuple[np.ndarray, np.ndarray, bytes | None]:
    """Vertices, faces and (for coloured or textured meshes) GLB bytes of a mesh file.

    Raises:
        ValueError: the file holds no triangles or trimesh cannot read it.
    """
    import trimesh

    loaded = trimesh.load(str(path), force="mesh")
    if not isinstance(loaded, trimesh.Trimesh) or len(loaded.faces) == 0:
        raise ValueError(f"no triangles in {path}")
    loaded.apply_scale(np.asarray(scale, dtype=np.float64))
    glb = None
    if getattr(loaded.visual, "kind", None) in ("vertex", "face", "texture"):
        glb = loaded.export(file_type="glb")
    return np.asarray(loaded.vertices, dtype=np.float64), np.asarray(loaded.faces, dtype=np.int64), glb


def _rgba(geometry) -> tuple[float, float, float, float]:
    rgba = getattr(geometry, "rgba", None)
    if rgba is None:
        return DEFAULT_RGBA
    return tuple(float(c) for c in rgba)  # type: ignore[return-value]


def robot_shapes(model: RobotModel, *, package_dirs=None) -> tuple[list[Shape], list[str]]:
    """The drawable shapes of a robot's URDF visual geometry.

    Boxes, spheres and cylinders are taken as they are; meshes are loaded with
    trimesh. A mesh that is missing or unreadable is replaced by the link's
    collision geometry (primitives, or collision meshes that load), drawn
    translucent, or, failing that, by a small translucent magenta box; either
    way the returned notes say which file was missing. A robot without any
    ``<visual>`` is drawn from its collision geometry, and one without either
    as a small sphere per link frame.

    Returns:
        ``(shapes, notes)``: the shapes, and one line per replaced mesh.
    """
    urdf_dir = Path(model.source_path).parent if model.source_path is not None else None
    cache: dict[tuple, Any] = {}
    shapes: list[Shape] = []
    notes: list[str] = []
    fell_back: set[str] = set()

    def load(g) -> tuple[np.ndarray, np.ndarray, bytes | None] | str:
        path = resolve_mesh_path(g.filename, urdf_dir=urdf_dir, package_dirs=package_dirs)
        if path is None:
            return "file not found"
        key = (str(path), tuple(g.params))
        if key not in cache:
            try:
                cache[key] = _load_mesh(path, g.params)
            # trimesh raises many types (ValueError, KeyError, ImportError for
            # optional loaders such as pycollada); any of them means "draw a
            # placeholder", never "fail the whole preview".
            except Exception as exc:  # noqa: BLE001
                cache[key] = f"unreadable ({type(exc).__name__}: {exc})"
        return cache[key]

    def make(frame: int, g, *, rgba, placeholder: bool) -> Shape | str:
        origin = np.asarray(g.origin, dtype=np.float64)
        if g.kind in ("box", "sphere", "cylinder"):
            return Shape(frame, g.kind, tuple(float(p) for p in g.params), origin, rgba, placeholder=placeholder)
        if g.kind != "mesh":
            return f"unknown geometry kind {g.kind!r}"
        got = load(g)
        if isinstance(got, str):
            return got
        v, f, glb = got
        return Shape(
            frame, "mesh", (), origin, rgba, vertices=v, faces=f,
            glb=glb if getattr(g, "rgba", None) is None else None, placeholder=placeholder,
        )

    visuals = model.visuals
    if not visuals and model.collisions:
        # No <visual> at all: the collision shapes are the best picture there is.
        visuals = model.collisions
    if not visuals:
        # Nothing to draw: a small sphere marks each link frame.
        for f in range(model.num_frames):
            shapes.append(Shape(f, "sphere", (0.5 * PLACEHOLDER_SIZE,), np.eye(4), DEFAULT_RGBA, placeholder=True))
        notes.append(f"robot {model.name!r} has no visual or collision geometry: link frames drawn as spheres")
        return shapes, notes

    for fg in visuals:
        frame = model.frame_index(fg.link)
        g = fg.geometry
        shape = make(frame, g, rgba=_rgba(g), placeholder=False)
        if isinstance(shape, Shape):
            shapes.append(shape)
            continue
        notes.append(f"{fg.link}: visual mesh {g.filename!r} {shape}")
        if fg.link in fell_back:
            continue
        fell_back.add(fg.link)
        r, gg, b, _ = _rgba(g)
        subs = []
        for cg in model.collisions:
            if cg.link != fg.link:
                continue
            sub = make(frame, cg.geometry, rgba=(r, gg, b, FALLBACK_OPACITY), placeholder=True)
            if isinstance(sub, Shape):
                subs.append(sub)
        if not subs:
            subs = [
                Shape(
                    frame, "box", (PLACEHOLDER_SIZE,) * 3, np.asarray(g.origin, dtype=np.float64),
                    PLACEHOLDER_RGBA, placeholder=True,
                )
            ]
        shapes.extend(subs)
    return shapes, notes


# --------------------------------------------------------------------------- poses


def neutral_configuration(model: RobotModel) -> torch.Tensor:
    """``(nq,)`` zeros clamped into the joint limits (identity base quaternion)."""
    joints = torch.zeros(model.num_joints, dtype=model.dtype, device=model.device)
    joints = torch.minimum(torch.maximum(joints, model.lower), model.upper)
    if not model.floating_base:
        return joints
    base = torch.tensor([0, 0, 0, 1, 0, 0, 0], dtype=model.dtype, device=model.device)
    return torch.cat([base, joints])


def as_configurations(model: RobotModel, trajectory) -> torch.Tensor:
    """A trajectory ``(T, nq)`` or one configuration ``(nq,)`` as a ``(T, nq)`` tensor.

    Accepts tensors (detached and cast to the model's dtype and device, since
    drawing needs no gradient), numpy arrays and nested sequences.

    Raises:
        InputError: wrong shape or non-finite values.
    """
    if trajectory is None:
        return neutral_configuration(model)[None]
    if isinstance(trajectory, torch.Tensor):
        q = trajectory.detach().to(dtype=model.dtype, device=model.device)
    else:
        q = torch.as_tensor(np.asarray(trajectory, dtype=np.float64), dtype=model.dtype, device=model.device)
    if q.ndim == 1:
        q = q[None]
    if q.ndim != 2 or q.shape[-1] != model.nq or q.shape[0] == 0:
        raise InputError(
            f"trajectory must have shape (T, nq) = (T, {model.nq}) or ({model.nq},) for "
            f"robot {model.name!r}, got {tuple(q.shape)}"
        )
    if not bool(torch.isfinite(q).all()):
        raise InputError("trajectory holds NaN or infinite values")
    return q


def link_poses(model: RobotModel, q: torch.Tensor) -> np.ndarray:
    """``(T, n_frames, 4, 4)`` float64 world-from-link poses along ``q (T, nq)``."""
    from ..kinematics import forward_kinematics

    with torch.no_grad():
        T = forward_kinematics(model, q)
    return T.detach().to(device="cpu", dtype=torch.float64).numpy()


def matrix_to_wxyz(R: np.ndarray) -> np.ndarray:
    """Unit quaternions ``(..., 4)`` wxyz of rotation matrices ``(..., 3, 3)``.

    Uses the largest of the four squared components to pick the division, so
    every rotation (including half turns) converts without loss of precision.
    """
    R = np.asarray(R, dtype=np.float64)
    m00, m11, m22 = R[..., 0, 0], R[..., 1, 1], R[..., 2, 2]
    sq = np.stack(
        [1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22, 1 - m00 - m11 + m22], axis=-1
    )
    k = np.argmax(sq, axis=-1)
    s = np.sqrt(np.maximum(np.take_along_axis(sq, k[..., None], -1)[..., 0], 1e-300))
    a = (R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0], R[..., 1, 0] - R[..., 0, 1])
    b = (R[..., 0, 1] + R[..., 1, 0], R[..., 0, 2] + R[..., 2, 0], R[..., 1, 2] + R[..., 2, 1])
    cand = [
        np.stack([s, a[0] / s, a[1] / s, a[2] / s], -1),
        np.stack([a[0] / s, s, b[0] / s, b[1] / s], -1),
        np.stack([a[1] / s, b[0] / s, s, b[2] / s], -1),
        np.stack([a[2] / s, b[1] / s, b[2] / s, s], -1),
    ]
    w = np.select([(k == i)[..., None] for i in range(4)], cand)
    w = 0.5 * w
    w = w / np.linalg.norm(w, axis=-1, keepdims=True)
    return np.where(w[..., :1] < 0, -w, w)


# --------------------------------------------------------------------------- viser


def _rgb255(rgba) -> tuple[int, int, int]:
    return tuple(int(round(255 * min(max(c, 0.0), 1.0))) for c in rgba[:3])  # type: ignore[return-value]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def frame_node_name(model: RobotModel, frame: int, root: str = "/robot") -> str:
    return f"{root}/{frame:03d}_{_safe(model.link_names[frame])}"


def add_shapes(scene, model: RobotModel, shapes: list[Shape], *, root: str = "/robot") -> dict[int, Any]:
    """Add one frame node per link that has shapes, and the shapes under it.

    Returns:
        ``{frame index: viser FrameHandle}`` for the links to pose.
    """
    handles: dict[int, Any] = {}
    counts: dict[int, int] = {}
    for s in shapes:
        if s.frame not in handles:
            handles[s.frame] = scene.add_frame(frame_node_name(model, s.frame, root), show_axes=False)
        i = counts.get(s.frame, 0)
        counts[s.frame] = i + 1
        name = f"{frame_node_name(model, s.frame, root)}/{'placeholder' if s.placeholder else 'visual'}_{i}"
        pose = {"wxyz": matrix_to_wxyz(s.origin[:3, :3]), "position": s.origin[:3, 3].copy()}
        color = _rgb255(s.rgba)
        opacity = None if s.rgba[3] >= 0.999 else float(s.rgba[3])
        if s.kind == "box":
            scene.add_box(name, color=color, dimensions=s.params, opacity=opacity, **pose)
        elif s.kind == "sphere":
            scene.add_icosphere(name, radius=s.params[0], color=color, opacity=opacity, **pose)
        elif s.kind == "cylinder":
            scene.add_cylinder(name, radius=s.params[0], height=s.params[1], color=color, opacity=opacity, **pose)
        elif s.glb is not None:
            scene.add_glb(name, glb_data=s.glb, **pose)
        else:
            scene.add_mesh_simple(
                name, vertices=s.vertices, faces=s.faces, color=color, opacity=opacity,
                side="double" if s.placeholder else "front", **pose,
            )
    return handles


def shape_spheres(shapes: list[Shape]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bounding spheres of the shapes in their link frames.

    Returns:
        ``frames (S,)`` link index of each shape, ``centres (S, 3)`` in the
        link frame and ``radii (S,)``, metres.
    """
    frames, centres, radii = [], [], []
    for s in shapes:
        if s.kind == "mesh" and s.vertices is not None and len(s.vertices):
            lo, hi = s.vertices.min(axis=0), s.vertices.max(axis=0)
            local, r = 0.5 * (lo + hi), 0.5 * float(np.linalg.norm(hi - lo))
        else:
            local = np.zeros(3)
            p = s.params
            r = {
                "box": lambda: 0.5 * float(np.linalg.norm(p)),
                "sphere": lambda: float(p[0]),
                "cylinder": lambda: float(np.hypot(p[0], 0.5 * p[1])),
            }.get(s.kind, lambda: 0.0)()
        frames.append(s.frame)
        centres.append(s.origin[:3, :3] @ local + s.origin[:3, 3])
        radii.append(r)
    return np.array(frames, dtype=np.int64), np.array(centres).reshape(-1, 3), np.array(radii)


def robot_extent_points(poses: np.ndarray, shapes: list[Shape], max_steps: int = 200) -> np.ndarray:
    """Points that bound the robot's geometry along ``poses (T, nf, 4, 4)``.

    Each shape's bounding sphere contributes its centre plus and minus its
    radius along the world axes, at up to ``max_steps`` time steps.
    """
    steps = poses[:: max(1, len(poses) // max_steps)]
    origins = steps[:, :, :3, 3].reshape(-1, 3)
    if not shapes:
        return origins
    frames, centres, radii = shape_spheres(shapes)
    T = steps[:, frames]  # (t, S, 4, 4)
    world = np.einsum("tsij,sj->tsi", T[..., :3, :3], centres) + T[..., :3, 3]
    offsets = np.concatenate([np.eye(3), -np.eye(3), np.zeros((1, 3))])  # (7, 3)
    pts = world[:, :, None, :] + radii[None, :, None, None] * offsets[None, None]
    return np.concatenate([origins, pts.reshape(-1, 3)])


def scene_bounds(points: np.ndarray) -> tuple[np.ndarray, float]:
    """Centre and radius of a cloud of points ``(N, 3)`` (radius at least 0.25 m)."""
    lo, hi = points.min(axis=0), points.max(axis=0)
    centre = 0.5 * (lo + hi)
    radius = max(0.5 * float(np.linalg.norm(hi - lo)), 0.25)
    return centre, radius

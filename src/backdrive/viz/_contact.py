"""Contact in the previews and plots: terrain meshes, contact points, force arrows.

Everything here works on numpy arrays in float64. :func:`contact_arrays`
turns a :class:`~backdrive.contact.ContactResult` (one rollout, time first)
into plain arrays once, at the public boundary; the drawing helpers take
those arrays and a viser scene, passed in, so ``backdrive.viz`` still imports
without the ``[viz]`` extra.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from .._errors import InputError

__all__ = [
    "ContactArrays",
    "contact_arrays",
    "frame_steps",
    "force_arrows",
    "auto_force_scale",
    "group_series",
    "heightfield_mesh",
    "as_terrain",
    "add_terrain",
    "ContactLayer",
    "NORMAL_RGB",
    "FRICTION_RGB",
    "POINT_RGB",
    "ACTIVE_FRACTION",
]

#: Colour of the normal-force arrows (RGB 0-255).
NORMAL_RGB = (30, 110, 230)
#: Colour of the friction-force arrows.
FRICTION_RGB = (240, 120, 20)
#: Colour of the contact points.
POINT_RGB = (215, 40, 60)
#: A contact is drawn when its normal force is at least this fraction of the
#: largest normal force in the trajectory (the smooth law leaves tiny forces
#: on points just above the ground).
ACTIVE_FRACTION = 0.01
#: Colour of a heightfield's lowest and highest samples (interpolated between).
TERRAIN_LOW_RGB = (96, 128, 96)
TERRAIN_HIGH_RGB = (200, 184, 150)


@dataclasses.dataclass(frozen=True)
class ContactArrays:
    """One rollout's contact as float64 arrays (``S`` steps, ``np`` contacts).

    Attributes:
        point: ``(S, np, 3)`` contact points, world frame, m.
        normal: ``(S, np, 3)`` unit normals.
        normal_force: ``(S, np)`` N.
        friction_force: ``(S, np, 3)`` N.
        slip_velocity: ``(S, np, 3)`` m/s.
    """

    point: np.ndarray
    normal: np.ndarray
    normal_force: np.ndarray
    friction_force: np.ndarray
    slip_velocity: np.ndarray

    @property
    def steps(self) -> int:
        return self.point.shape[0]

    @property
    def num_points(self) -> int:
        return self.point.shape[1]


_FIELDS = {
    "point": 3,
    "normal": 3,
    "normal_force": 0,
    "friction_force": 3,
    "slip_velocity": 3,
}


def _as_index(batch_index, batch: tuple[int, ...]) -> tuple[int, ...]:
    if batch_index is None:
        if batch and math.prod(batch) == 1:
            return (0,) * len(batch)
        if batch:
            raise InputError(
                f"the contact result holds a batch of shape {batch}; pick one rollout with "
                f"batch_index=(i, ...) ({len(batch)} index(es))"
            )
        return ()
    idx = (batch_index,) if isinstance(batch_index, int) else tuple(batch_index)
    if len(idx) != len(batch) or not all(isinstance(i, int) and -n <= i < n for i, n in zip(idx, batch)):
        raise InputError(f"batch_index {batch_index!r} does not select one rollout of batch shape {batch}")
    return idx


def contact_arrays(contact, *, batch_index=None) -> ContactArrays:
    """A :class:`~backdrive.contact.ContactResult` with a time axis as :class:`ContactArrays`.

    Args:
        contact: ``Trajectory.contact`` (fields ``(..., S, np, ...)``) or any
            :class:`ContactResult` whose last non-point axis is time.
        batch_index: which rollout of a batched result (an int or a tuple,
            one index per batch axis); a batch of one needs none.

    Raises:
        InputError: not a ContactResult, no time axis, a batch without an
            index, or NaN / infinite values (naming the field, step and contact).
    """
    from ..contact import ContactResult

    if not isinstance(contact, ContactResult):
        raise InputError(
            f"contact must be a backdrive.contact.ContactResult (e.g. Trajectory.contact), got {type(contact).__name__}"
        )
    if contact.normal_force.ndim < 2:
        raise InputError(
            "contact must have a time axis (normal_force (..., S, np)), got normal_force of shape "
            f"{tuple(contact.normal_force.shape)}; stack per-step results with backdrive.contact.stack_results"
        )
    batch = tuple(contact.normal_force.shape[:-2])
    idx = _as_index(batch_index, batch)
    out = {}
    for name, last in _FIELDS.items():
        t = getattr(contact, name).detach().to(device="cpu", dtype=torch.float64)
        t = t.expand(*batch, *t.shape[t.ndim - (2 + (last > 0)) :])[idx]
        a = t.numpy()
        bad = ~np.isfinite(a)
        if bad.any():
            s, p = (int(x) for x in np.argwhere(bad)[0][:2])
            raise InputError(f"contact {name} holds NaN or infinite values (first at step {s}, contact {p})")
        out[name] = a
    return ContactArrays(**out)


def frame_steps(states: np.ndarray, num_states: int, steps: int) -> np.ndarray:
    """The contact step drawn at each shown state.

    A rollout of ``S`` steps has ``S + 1`` states and step ``t``'s forces
    act from state ``t`` to ``t + 1`` (computed at state ``t``), so state
    ``t`` shows step ``t`` and the final state repeats the last step. A
    result with one entry per state (``S == num_states``) maps one to one.

    Args:
        states: ``(F,)`` indices of the states drawn (frames).
        num_states: states in the trajectory. steps: ``S``.

    Raises:
        InputError: ``steps`` matches neither ``num_states`` nor ``num_states - 1``.
    """
    if steps == num_states:
        return np.asarray(states)
    if steps == num_states - 1 and steps > 0:
        return np.minimum(states, steps - 1)
    raise InputError(
        f"the contact result has {steps} steps but the trajectory has {num_states} states; "
        f"expected {num_states - 1} (one per step) or {num_states} (one per state)"
    )


def force_arrows(c: ContactArrays, step: int, force_scale: float, min_force: float):
    """The contact points and force arrows of one step.

    A contact is shown when its normal force is at least ``min_force``. Its
    normal arrow starts at the contact point and ends at
    ``point + normal_force * normal / force_scale``; its friction arrow
    starts at the point and ends at ``point + friction_force / force_scale``.

    Args:
        c: the rollout's arrays. step: index into ``c``.
        force_scale: N per metre of arrow (> 0).
        min_force: N.

    Returns:
        ``points (k, 3)``, ``normal (k, 2, 3)`` and ``friction (k, 2, 3)``
        start/end points, world frame, m (``k`` shown contacts).
    """
    on = c.normal_force[step] >= min_force
    p = c.point[step][on]
    normal = np.stack([p, p + c.normal_force[step][on, None] * c.normal[step][on] / force_scale], 1)
    friction = np.stack([p, p + c.friction_force[step][on] / force_scale], 1)
    return p, normal, friction


def group_series(c: ContactArrays, index: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-group normal force and slip speed over time.

    Args:
        c: the rollout's arrays. index: ``(np,)`` group of each contact.
        k: number of groups.

    Returns:
        ``normal (S, k)``: the sum of each group's normal forces, N;
        ``slip (S, k)``: the group's slip speed averaged with the (clamped
        non-negative) normal forces as weights, m/s, NaN where the group
        carries less than :data:`ACTIVE_FRACTION` of the largest group force.
    """
    fn = np.zeros((c.steps, k))
    np.add.at(fn.T, index, c.normal_force.T)
    load = np.clip(c.normal_force, 0.0, None)
    speed = np.linalg.norm(c.slip_velocity, axis=-1)
    wsum = np.zeros((c.steps, k))
    np.add.at(wsum.T, index, load.T)
    wslip = np.zeros((c.steps, k))
    np.add.at(wslip.T, index, (load * speed).T)
    floor = ACTIVE_FRACTION * float(fn.max(initial=0.0))
    loaded = (wsum > floor) & (wsum > 0)
    slip = np.where(loaded, wslip / np.where(loaded, wsum, 1.0), np.nan)
    return fn, slip


def auto_force_scale(c: ContactArrays, length: float, min_force: float) -> float:
    """N per metre such that the typical loaded contact's arrow is about ``length`` m.

    "Typical" is the median of the normal forces of at least ``min_force``
    over all steps and contacts (so that an impact spike does not shrink
    every other arrow; spikes are drawn longer); the scale is rounded up to
    1, 2 or 5 times a power of ten.
    """
    loaded = c.normal_force[c.normal_force >= min_force]
    if not loaded.size or not length > 0:
        return 1.0
    raw = float(np.median(loaded)) / length
    if not raw > 0:
        return 1.0
    e = math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * 10.0**e >= raw * (1 - 1e-9):
            return m * 10.0**e
    return 10.0 ** (e + 1)  # pragma: no cover - the loop always returns


def as_terrain(terrain):
    """A :class:`~backdrive.contact.GroundPlane` or :class:`Heightfield` (a ContactModel gives its own)."""
    from ..contact import ContactModel, GroundPlane, Heightfield

    if isinstance(terrain, ContactModel):
        terrain = terrain.terrain
    if terrain is None or isinstance(terrain, (GroundPlane, Heightfield)):
        return terrain
    raise InputError(
        f"terrain must be a backdrive.contact GroundPlane, Heightfield or ContactModel, got {type(terrain).__name__}"
    )


def heightfield_mesh(terrain) -> tuple[np.ndarray, np.ndarray]:
    """``vertices (nx * ny, 3)`` and ``faces (2 (nx - 1)(ny - 1), 3)`` of a heightfield's samples."""
    H = terrain.heights.detach().to(device="cpu", dtype=torch.float64).numpy()
    nx, ny = H.shape
    dx, dy = terrain.spacing
    x = terrain.origin[0] + dx * np.arange(nx)
    y = terrain.origin[1] + dy * np.arange(ny)
    X, Y = np.meshgrid(x, y, indexing="ij")
    vertices = np.stack([X, Y, H], -1).reshape(-1, 3)
    i, j = np.meshgrid(np.arange(nx - 1), np.arange(ny - 1), indexing="ij")
    a = (i * ny + j).reshape(-1)
    b, c, d = a + ny, a + ny + 1, a + 1  # (i+1, j), (i+1, j+1), (i, j+1): counter-clockwise seen from +z
    faces = np.concatenate([np.stack([a, b, c], 1), np.stack([a, c, d], 1)])
    return vertices, faces


def _plane_wxyz(n: np.ndarray) -> np.ndarray:
    """The rotation taking +z to the unit vector ``n``, as wxyz."""
    z = np.array([0.0, 0.0, 1.0])
    w = 1.0 + float(z @ n)
    if w < 1e-9:  # n = -z: a half turn about x
        return np.array([0.0, 1.0, 0.0, 0.0])
    q = np.concatenate([[w], np.cross(z, n)])
    return q / np.linalg.norm(q)


def add_terrain(scene, terrain, radius: float, *, dark: bool = False) -> None:
    """Draw a ground plane as a grid ``4 * radius`` wide on it, a heightfield as a shaded mesh.

    The grid of a plane is centred on the plane's point below the world
    origin and turned to its normal (an incline is drawn tilted). The
    heightfield mesh has one vertex per sample, coloured from its lowest
    height to its highest; beyond the grid the terrain continues flat, which
    is not drawn.
    """
    from ..contact import GroundPlane

    if isinstance(terrain, GroundPlane):
        n = terrain.normal(torch.zeros(3, dtype=torch.float64)).numpy()
        h = float(torch.as_tensor(terrain.height).detach().to(torch.float64))
        scene.add_grid(
            "/ground", width=4 * radius, height=4 * radius, cell_size=0.1, section_size=0.5,
            cell_color=(62, 62, 70) if dark else (222, 222, 226),
            section_color=(100, 100, 110) if dark else (175, 175, 182),
            wxyz=_plane_wxyz(n), position=(0.0, 0.0, h),
        )
        return
    import trimesh

    vertices, faces = heightfield_mesh(terrain)
    z = vertices[:, 2]
    span = float(z.max() - z.min())
    u = (z - z.min()) / span if span > 0 else np.zeros_like(z)
    rgb = (1 - u)[:, None] * np.array(TERRAIN_LOW_RGB) + u[:, None] * np.array(TERRAIN_HIGH_RGB)
    colours = np.concatenate([rgb, np.full((len(z), 1), 255.0)], 1).astype(np.uint8)
    mesh = trimesh.Trimesh(vertices=vertices, faces=faces, vertex_colors=colours, process=False)
    scene.add_mesh_trimesh("/terrain", mesh)


class ContactLayer:
    """Contact points and force arrows under ``/contact``, updated frame by frame.

    Args:
        scene: viser scene. c: the rollout's arrays. force_scale: N/m.
        min_force: N. size: marker size (point diameter, arrow head), m.
    """

    def __init__(self, scene, c: ContactArrays, force_scale: float, min_force: float, size: float):
        self.c, self.scale, self.min_force = c, force_scale, min_force
        self.size = size
        scene.add_frame("/contact", show_axes=False)
        empty = np.zeros((1, 3), dtype=np.float32)
        self.points = scene.add_point_cloud(
            "/contact/points", points=empty, colors=POINT_RGB, point_size=size, point_shape="circle", visible=False
        )
        arrow = dict(shaft_radius=0.2 * size, head_radius=0.45 * size, head_length=size)
        seg = np.zeros((1, 2, 3), dtype=np.float32)
        self.normal = scene.add_arrows("/contact/normal", points=seg, colors=NORMAL_RGB, visible=False, **arrow)
        self.friction = scene.add_arrows("/contact/friction", points=seg, colors=FRICTION_RGB, visible=False, **arrow)
        self._last = None

    def show(self, step: int) -> None:
        """Show step ``step``; only what changed since the last call is sent."""
        p, normal, friction = force_arrows(self.c, step, self.scale, self.min_force)
        # Friction arrows shorter than their head would be drawn as a head alone.
        long = np.linalg.norm(friction[:, 1] - friction[:, 0], axis=-1) >= self.size
        friction = friction[long]
        key = (p.tobytes(), normal.tobytes(), friction.tobytes())
        if key == self._last:
            return
        self._last = key
        for handle, data, attr in (
            (self.points, p, "points"),
            (self.normal, normal, "points"),
            (self.friction, friction, "points"),
        ):
            if len(data):
                setattr(handle, attr, data.astype(np.float32))
            if handle.visible != bool(len(data)):
                handle.visible = bool(len(data))

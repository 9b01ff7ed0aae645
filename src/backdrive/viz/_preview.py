"""Offline browser previews: one self-contained HTML file per robot trajectory.

The scene is recorded with viser (its scene serializer) and embedded, base64
encoded, in a copy of viser's own built web client
(``StateSerializer.as_html``). The page needs no server and fetches nothing:
open it from disk in any WebGL browser. It plays the trajectory in a loop with
viser's timeline (play/pause, speed, scrub bar and time box). Two URL
parameters are added by backdrive: ``?t=SECONDS`` opens the page paused at that
time (it drives viser's own time box, exactly as typing into it would),
``?notitle`` hides the caption and ``?quiet`` hides viser's pop-up notices
(such as its warning about software WebGL), for clean screenshots. The page
also defines ``window.backdriveSeek(t)``, which scrubs the same way from
scripts (the screenshot helper uses it).
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import torch

from .._errors import InputError
from ..model import RobotModel
from ._contact import (
    ACTIVE_FRACTION,
    ContactLayer,
    add_terrain,
    as_terrain,
    auto_force_scale,
    contact_arrays,
    frame_steps,
)
from ._deps import require
from ._markers import add_markers, as_paths, as_targets
from ._scene import (
    add_shapes,
    as_configurations,
    link_poses,
    matrix_to_wxyz,
    robot_extent_points,
    robot_shapes,
    scene_bounds,
)

__all__ = ["preview", "as_model", "quiet_server", "place_camera", "add_lights_and_ground"]


def as_model(robot) -> RobotModel:
    """A :class:`RobotModel` from a model or a URDF path."""
    if isinstance(robot, RobotModel):
        return robot
    if isinstance(robot, (str, os.PathLike)):
        return RobotModel.from_urdf(Path(robot))
    raise TypeError(f"robot must be a RobotModel or a URDF path, got {type(robot).__name__}")


@contextlib.contextmanager
def quiet_server(port: int = 0, host: str = "127.0.0.1", *, verbose: bool = False):
    """A viser server on ``host``; its banner is swallowed unless ``verbose``."""
    viser = require("viser", "backdrive.viz")
    sink = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with sink:
        server = viser.ViserServer(host=host, port=port, verbose=verbose)
    try:
        yield server
    finally:
        with contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO()):
            server.stop()


def place_camera(server, points: np.ndarray, *, fov_deg: float = 50.0, aspect: float = 1.2) -> None:
    """Aim the initial camera so that every point is in view, from the front-right, above.

    The camera looks at the centre of the points' bounding box along a fixed
    direction and backs off until each point fits both the vertical field of
    view and a horizontal one for a viewport at least ``aspect`` wide.
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    centre = 0.5 * (points.min(axis=0) + points.max(axis=0))
    back = np.array([1.0, 0.75, 0.55])
    back /= np.linalg.norm(back)  # from the look-at point towards the camera
    right = np.cross(-back, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    up = np.cross(right, -back)
    rel = points - centre
    x, y, z = rel @ right, rel @ up, rel @ back
    tan_v = np.tan(0.5 * np.radians(fov_deg))
    tan_h = aspect * tan_v
    # A point at depth D - z from the camera is in view when |x| <= (D - z) tan_h, |y| <= (D - z) tan_v.
    distance = float(np.max(np.maximum(z + np.abs(x) / tan_h, z + np.abs(y) / tan_v)))
    distance = max(1.1 * distance, 0.5)
    server.scene.set_up_direction("+z")
    server.initial_camera.fov = np.radians(fov_deg)
    server.initial_camera.look_at = tuple(centre)
    server.initial_camera.position = tuple(centre + distance * back)


def add_lights_and_ground(server, radius: float, *, dark: bool = False, ground: bool = True) -> None:
    """Soft lighting and (unless ``ground`` is false) a ground grid ``4 * radius`` wide at ``z = 0``."""
    # No environment map: its image decodes slowly in software WebGL and the
    # client keeps the canvas faded until it has; a hemisphere light gives a
    # similar soft fill at once.
    server.scene.configure_environment_map(None)
    server.scene.add_light_hemisphere(
        "/lights/fill", sky_color=(255, 255, 255), ground_color=(120, 120, 130), intensity=1.5
    )
    if not ground:
        return
    server.scene.add_grid(
        "/ground", width=4 * radius, height=4 * radius, cell_size=0.1, section_size=0.5,
        cell_color=(62, 62, 70) if dark else (222, 222, 226),
        section_color=(100, 100, 110) if dark else (175, 175, 182),
    )


def preview(
    robot,
    trajectory=None,
    *,
    targets=None,
    paths=None,
    path="outputs/preview",
    fps: float | None = None,
    title: str | None = None,
    package_dirs=None,
    dark_mode: bool = False,
    contact=None,
    terrain=None,
    force_scale: float | None = None,
    batch_index=None,
) -> Path:
    """Write an offline browser preview of a robot moving along a trajectory.

    The result is one self-contained HTML file (viser's web client with the
    recorded scene inside): open it from disk, no server and no network
    needed. It loops over the trajectory with a timeline to play, pause and
    scrub; ``file.html?t=1.5`` opens it paused at 1.5 s (clamped to the last
    frame).

    The robot is drawn from its URDF visual geometry: boxes, spheres,
    cylinders and meshes (loaded with trimesh; ``package://`` URIs are searched
    as in :func:`backdrive.viz.resolve_mesh_path`). A mesh that is missing or
    unreadable is drawn as the link's collision geometry, translucent, or as a
    small translucent magenta box, and a warning lists it; the page caption
    says how many were replaced.

    Args:
        robot: a :class:`~backdrive.RobotModel` or a URDF path.
        trajectory: ``(T, nq)`` configurations (tensor or array), one
            ``(nq,)`` configuration, ``None`` for the neutral pose (zeros
            clamped into the joint limits), or a
            :class:`~backdrive.sim.Trajectory` (its ``q``; its ``contact``
            unless ``contact`` is given).
        targets: ``(K, 3)`` points or ``(K, 4, 4)`` poses in the world frame,
            drawn as red spheres (with axes for poses).
        paths: polylines: ``(N, 3)`` points, ``(P, N, 3)``, a link name (its
            origin traced along the trajectory, e.g. the TCP), a sequence of
            these, or a ``dict`` from label to any of them.
        path: output file; ``.html`` is appended when missing. An existing
            folder (or a path ending in ``/``) gets ``<robot name>.html``
            inside it. Parent folders are created.
        fps: frames per second of ``trajectory`` (playback time ``T / fps``);
            by default 30, and for a :class:`~backdrive.sim.Trajectory` real
            time (``1 / dt``), drawing every ``k``-th state so that at most
            60 frames are recorded per second.
        title: caption shown over the viewer and as the page title.
        package_dirs: extra folders to search for ``package://`` meshes.
        dark_mode: use viser's dark theme.
        contact: a :class:`~backdrive.contact.ContactResult` with a time
            axis (``Trajectory.contact``: one entry per step, or one per
            state). Each frame draws the contact points carrying at least 1 %
            of the trajectory's largest normal force (red dots), their normal
            forces (blue arrows) and friction forces (orange arrows), from
            the contact point, ``force / force_scale`` metres long.
        terrain: a :class:`~backdrive.contact.GroundPlane` (a grid on the
            plane, tilted with it), a :class:`~backdrive.contact.Heightfield`
            (a mesh through its samples, coloured by height) or a
            :class:`~backdrive.contact.ContactModel` (its terrain). ``None``:
            a grid at ``z = 0``.
        force_scale: N per metre of force arrow; by default the median
            of the drawn normal forces gets an arrow 0.4 times the scene's
            radius long, rounded up to 1, 2 or 5 times a power of ten. The
            caption states the scale.
        batch_index: which rollout of a batched ``Trajectory`` or contact
            result to draw (an int, or one index per batch axis).

    Returns:
        The path of the HTML file written.

    Raises:
        MissingExtraError: viser is not installed (``pip install 'backdrive[viz]'``).
        InputError: a trajectory, target, path, contact result, terrain or
            force scale that cannot be drawn (wrong type, shape, batch,
            number of steps, or NaN).
    """
    require("viser", "backdrive.viz.preview")
    require("trimesh", "backdrive.viz.preview")
    if fps is not None and not fps > 0:
        raise ValueError(f"fps must be positive, got {fps}")
    model = as_model(robot)
    trajectory, contact, fps, stride = _unpack_trajectory(trajectory, contact, fps, batch_index)
    q = as_configurations(model, trajectory)
    drawn = np.arange(0, len(q), stride)
    terrain = as_terrain(terrain)
    c = None if contact is None else contact_arrays(contact, batch_index=batch_index)
    steps = None if c is None else frame_steps(drawn, len(q), c.steps)
    q = q[torch.as_tensor(drawn, device=q.device)]
    poses = link_poses(model, q)  # (T, nf, 4, 4)
    shapes, notes = robot_shapes(model, package_dirs=package_dirs)
    if notes:
        warnings.warn(
            f"{len(notes)} mesh(es) of {model.name!r} drawn as placeholders:\n  " + "\n  ".join(notes),
            stacklevel=2,
        )
    target_points, target_poses = as_targets(targets)
    polylines = as_paths(model, paths, poses)

    cloud = [robot_extent_points(poses, shapes), target_points] + [p for _, p in polylines]
    cloud_points = np.concatenate([p for p in cloud if len(p)], axis=0)
    _, radius = scene_bounds(cloud_points)
    if c is not None:
        min_force = ACTIVE_FRACTION * float(c.normal_force.max(initial=0.0))
        if force_scale is None:
            force_scale = auto_force_scale(c, 0.4 * radius, min_force)
        elif not (isinstance(force_scale, (int, float)) and math.isfinite(force_scale) and force_scale > 0):
            raise InputError(f"force_scale must be a positive number of newtons per metre, got {force_scale!r}")

    out = Path(path)
    if out.is_dir() or str(path).endswith(("/", os.sep)):
        out = out / f"{_safe_name(model.name)}.html"
    elif out.suffix.lower() != ".html":
        out = out.with_name(out.name + ".html")
    out.parent.mkdir(parents=True, exist_ok=True)

    with quiet_server(0) as server:
        serializer = server.get_scene_serializer()
        place_camera(server, cloud_points)
        add_lights_and_ground(server, radius, dark=dark_mode, ground=terrain is None)
        if terrain is not None:
            add_terrain(server.scene, terrain, radius, dark=dark_mode)
        handles = add_shapes(server.scene, model, shapes)
        add_markers(server.scene, target_points, target_poses, polylines, size=max(0.03 * radius, 0.01))
        layer = None if c is None else ContactLayer(server.scene, c, force_scale, min_force, max(0.04 * radius, 0.01))
        frames = sorted(handles)
        shown = poses[:, frames]  # (T, k, 4, 4)
        wxyz = matrix_to_wxyz(shown[..., :3, :3])
        xyz = shown[..., :3, 3]
        dt = 1.0 / float(fps)
        for t in range(len(q)):
            for j, f in enumerate(frames):
                # Only send what changed: a fixed base, or a link at rest, costs nothing.
                if t == 0 or not np.array_equal(wxyz[t, j], wxyz[t - 1, j]):
                    handles[f].wxyz = wxyz[t, j]
                if t == 0 or not np.array_equal(xyz[t, j], xyz[t - 1, j]):
                    handles[f].position = xyz[t, j]
            if layer is not None:
                layer.show(int(steps[t]))
            if len(q) > 1:
                serializer.insert_sleep(dt)
        page = serializer.as_html(dark_mode=dark_mode)

    caption = title if title is not None else f"{model.name}"
    if len(q) > 1:
        caption += f" \u2014 {len(q)} frames, {len(q) / float(fps):.2f} s"
    if c is not None:
        caption += f" \u2014 contact forces: 1 m = {force_scale:g} N (normal blue, friction orange)"
    if notes:
        caption += f" \u2014 {len(notes)} visual mesh(es) not loaded: translucent stand-ins"
    last = (len(q) - 1) / float(fps)
    out.write_text(
        _inject(page, caption=caption, title=title or model.name, last=last, dark=dark_mode), encoding="utf-8"
    )
    return out


def _unpack_trajectory(trajectory, contact, fps, batch_index):
    """``(configurations, contact, fps, stride)`` from what :func:`preview` was given."""
    from ..sim import Trajectory

    if not isinstance(trajectory, Trajectory):
        return trajectory, contact, 30.0 if fps is None else float(fps), 1
    q = trajectory.q.detach()
    batch = tuple(q.shape[:-2])
    if batch:
        from ._contact import _as_index

        q = q[_as_index(batch_index, batch)]
    if contact is None:
        contact = trajectory.contact
    if fps is not None:
        return q, contact, float(fps), 1
    # Real time, at most 60 recorded frames per second of motion.
    stride = max(1, math.ceil(1.0 / (60.0 * trajectory.dt) - 1e-9))
    return q, contact, 1.0 / (stride * trajectory.dt), stride


# A plain script appended to viser's page. The `t` parameter types the time
# into viser's own time box (the NumberInput beside the scrub bar), so it
# seeks and pauses through the same code path as a user would; React only
# sees the change when the value is set through the native setter.
_SCRIPT = """
(function () {
  var cfg = __BACKDRIVE_CONFIG__;
  var params = new URLSearchParams(window.location.search);
  document.title = cfg.title;
  if (!params.has("notitle")) {
    var cap = document.createElement("div");
    cap.id = "backdrive-caption";
    cap.textContent = cfg.caption;
    cap.style.cssText = "position:fixed;left:50%;transform:translateX(-50%);top:0.6em;z-index:5;" +
      "font:13px sans-serif;white-space:nowrap;padding:0.2em 0.5em;border-radius:4px;pointer-events:none;" +
      (cfg.dark ? "color:#ddd;background:rgba(20,20,24,0.75)" : "color:#333;background:rgba(255,255,255,0.75)");
    document.body.appendChild(cap);
  }
  if (params.has("quiet")) {
    var style = document.createElement("style");
    style.textContent = ".mantine-Notifications-root{display:none !important}";
    document.head.appendChild(style);
  }
  // Seek (and pause) by typing into viser's time box; returns the clamped
  // time. Each finished seek increments data-backdrive-seeks on <body>.
  window.backdriveSeek = function (t) {
    var target = parseFloat(t);
    if (!isFinite(target)) return null;
    // viser wraps to the start at the end of the recording: clamp to the last frame.
    target = Math.min(Math.max(target, 0), cfg.last);
    var tries = 0;
    var timer = setInterval(function () {
      var box = document.querySelector(".mantine-NumberInput-input");
      if (!box) { if (++tries > 1200) clearInterval(timer); return; }
      clearInterval(timer);
      var setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, "value").set;
      setter.call(box, String(target));
      box.dispatchEvent(new Event("input", { bubbles: true }));
      var n = parseInt(document.body.getAttribute("data-backdrive-seeks") || "0", 10);
      document.body.setAttribute("data-backdrive-seek", String(target));
      document.body.setAttribute("data-backdrive-seeks", String(n + 1));
    }, 50);
    return target;
  };
  if (params.has("t")) window.backdriveSeek(params.get("t"));
})();
"""


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "robot"


def _inject(page: str, *, caption: str, title: str, last: float = 0.0, dark: bool = False) -> str:
    cfg = json.dumps({"caption": caption, "title": title, "last": float(last), "dark": bool(dark)})
    # "</" cannot appear inside an inline script.
    cfg = cfg.replace("</", "<\\/")
    script = "<script>" + _SCRIPT.replace("__BACKDRIVE_CONFIG__", cfg) + "</script>"
    page = page.replace("<title>Viser</title>", f"<title>{html.escape(title)}</title>", 1)
    end = page.rindex("</body>")
    return page[:end] + script + page[end:]

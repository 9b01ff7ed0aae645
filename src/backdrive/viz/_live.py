"""A live viewer: a viser server on 127.0.0.1 that a script updates as it runs."""

from __future__ import annotations

import time
import warnings

import numpy as np

from .._errors import InputError
from ._deps import require
from ._markers import add_markers, as_paths, as_targets
from ._preview import add_lights_and_ground, as_model, place_camera, quiet_server
from ._scene import (
    add_shapes,
    as_configurations,
    link_poses,
    matrix_to_wxyz,
    robot_extent_points,
    robot_shapes,
    scene_bounds,
)

__all__ = ["LiveViewer"]


class LiveViewer:
    """Show a robot in the browser and move it from Python while a script runs.

    Starts a viser server bound to ``host`` (loopback by default, so nothing
    is exposed to the network); open :attr:`url` in a browser. Every
    :meth:`update` moves the robot in every open tab at once.

    Example::

        with LiveViewer(robot) as viewer:
            for q in trajectory:
                viewer.update(q)
                time.sleep(1 / 30)

    Args:
        robot: a :class:`~backdrive.RobotModel` or a URDF path.
        q: initial ``(nq,)`` configuration (default: the neutral pose).
        port: TCP port; ``0`` picks a free one (see :attr:`port`). When the
            port is taken, viser tries the next ones.
        host: interface to bind, ``127.0.0.1`` unless you mean to share it.
        package_dirs: extra folders to search for ``package://`` meshes.
        verbose: print the URL, and warn about meshes drawn as placeholders.
    """

    def __init__(self, robot, q=None, *, port: int = 8080, host: str = "127.0.0.1", package_dirs=None,
                 verbose: bool = True):
        require("viser", "backdrive.viz.LiveViewer")
        self.model = as_model(robot)
        self._cm = quiet_server(port, host, verbose=False)
        self.server = self._cm.__enter__()
        self.host = host
        try:
            shapes, self.notes = robot_shapes(self.model, package_dirs=package_dirs)
            q0 = as_configurations(self.model, q)
            poses = link_poses(self.model, q0)
            extent = robot_extent_points(poses, shapes)
            _, radius = scene_bounds(extent)
            self._marker_size = max(0.03 * radius, 0.01)
            place_camera(self.server, extent)
            add_lights_and_ground(self.server, radius)
            self._handles = add_shapes(self.server.scene, self.model, shapes)
            self._frames = sorted(self._handles)
            self._set_poses(poses[0])
        except BaseException:
            self.close()
            raise
        if verbose:
            if self.notes:
                warnings.warn(
                    f"{len(self.notes)} mesh(es) of {self.model.name!r} drawn as placeholders:\n  "
                    + "\n  ".join(self.notes),
                    stacklevel=2,
                )
            print(f"backdrive live viewer for {self.model.name!r}: open {self.url}")

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        return int(self.server.get_port())

    @property
    def url(self) -> str:
        """Address to open in a browser."""
        return f"http://{self.host}:{self.port}"

    def _set_poses(self, T: np.ndarray) -> None:
        self._last = T
        shown = T[self._frames]
        wxyz = matrix_to_wxyz(shown[:, :3, :3])
        with self.server.atomic():
            for j, f in enumerate(self._frames):
                self._handles[f].wxyz = wxyz[j]
                self._handles[f].position = shown[j, :3, 3]

    def update(self, q) -> None:
        """Move the robot to configuration ``q`` (``(nq,)`` tensor or array)."""
        q = as_configurations(self.model, q)
        if q.shape[0] != 1:
            raise InputError(f"update takes one configuration ({self.model.nq},), got {q.shape[0]}; use play()")
        self._set_poses(link_poses(self.model, q)[0])

    def play(self, trajectory, *, fps: float = 30, loop: bool = False) -> None:
        """Step through ``trajectory (T, nq)`` in real time (blocks; ``loop`` repeats until Ctrl-C)."""
        poses = link_poses(self.model, as_configurations(self.model, trajectory))
        while True:
            start = time.perf_counter()
            for k, T in enumerate(poses):
                self._set_poses(T)
                delay = start + (k + 1) / fps - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            if not loop:
                return

    def show_markers(self, *, targets=None, paths=None) -> None:
        """Replace the target and path markers (same forms as :func:`~backdrive.viz.preview`).

        Link-name paths are traced over the current pose only, so pass point
        arrays for paths along a trajectory.
        """
        self.server.scene.remove_by_name("/markers")
        pts, poses = as_targets(targets)
        polylines = as_paths(self.model, paths, self._last[None])
        add_markers(self.server.scene, pts, poses, polylines, size=self._marker_size)

    def close(self) -> None:
        """Stop the server."""
        cm, self._cm = getattr(self, "_cm", None), None
        if cm is not None:
            cm.__exit__(None, None, None)

    def __enter__(self) -> LiveViewer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Targets and paths drawn next to the robot."""

from __future__ import annotations

import numpy as np
import torch

from .._errors import InputError
from ..model import RobotModel
from ._scene import matrix_to_wxyz

__all__ = ["as_targets", "as_paths", "add_markers"]

TARGET_RGB = (230, 57, 70)
PATH_RGB = ((29, 120, 220), (245, 140, 30), (40, 170, 90), (150, 80, 200), (220, 60, 140))


def _array(x, what: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to(device="cpu", dtype=torch.float64).numpy()
    a = np.asarray(x, dtype=np.float64)
    if not np.isfinite(a).all():
        raise InputError(f"{what} holds NaN or infinite values")
    return a


def as_targets(targets) -> tuple[np.ndarray, np.ndarray | None]:
    """Target points ``(K, 3)`` and, when poses were given, the poses ``(K, 4, 4)``.

    Args:
        targets: ``(K, 3)`` points or ``(K, 4, 4)`` poses (a single ``(3,)`` or
            ``(4, 4)`` is one target), tensor or array, metres, world frame.
    """
    if targets is None:
        return np.zeros((0, 3)), None
    a = _array(targets, "targets")
    if a.shape == (4, 4):
        a = a[None]
    if a.ndim == 1:
        a = a[None]
    if a.ndim == 2 and a.shape[-1] == 3:
        return a, None
    if a.ndim == 3 and a.shape[-2:] == (4, 4):
        return a[:, :3, 3].copy(), a
    raise InputError(f"targets must be (K, 3) points or (K, 4, 4) poses, got shape {a.shape}")


def as_paths(model: RobotModel, paths, poses: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Polylines as ``(label, (N, 3) points)``.

    Args:
        paths: one ``(N, 3)`` array, a ``(P, N, 3)`` array, a link name (its
            origin traced along the trajectory), or a sequence of these; a
            ``dict`` maps labels to any of them.
        poses: ``(T, n_frames, 4, 4)`` link poses along the trajectory.

    Raises:
        InputError: bad shapes; UnknownNameError: unknown link name.
    """
    if paths is None:
        return []
    if isinstance(paths, dict):
        items = list(paths.items())
    elif isinstance(paths, (str, np.ndarray, torch.Tensor)):
        items = [(None, paths)]
    else:
        items = [(None, p) for p in paths]
    out: list[tuple[str, np.ndarray]] = []
    for label, p in items:
        if isinstance(p, str):
            f = model.frame_index(p)
            out.append((label or p, poses[:, f, :3, 3].copy()))
            continue
        a = _array(p, "paths")
        if a.ndim == 2 and a.shape[-1] == 3:
            out.append((label or f"path {len(out)}", a))
        elif a.ndim == 3 and a.shape[-1] == 3:
            for sub in a:
                out.append((f"{label or 'path'} {len(out)}", sub))
        else:
            raise InputError(f"a path must be (N, 3) points or a link name, got shape {a.shape}")
    return out


def add_markers(scene, targets: np.ndarray, target_poses, paths, *, size: float) -> None:
    """Add target spheres (with axes for poses) and path polylines under ``/markers``.

    Args:
        size: marker radius, metres.
    """
    if len(targets) or paths:
        scene.add_frame("/markers", show_axes=False)
    for k, p in enumerate(targets):
        scene.add_icosphere(
            f"/markers/target_{k}", radius=size, color=TARGET_RGB, opacity=0.85, position=p, subdivisions=2
        )
        if target_poses is not None:
            scene.add_frame(
                f"/markers/target_{k}_axes",
                axes_length=4 * size,
                axes_radius=0.25 * size,
                wxyz=matrix_to_wxyz(target_poses[k, :3, :3]),
                position=target_poses[k, :3, 3],
            )
    for i, (_, pts) in enumerate(paths):
        if len(pts) < 2:
            continue
        segments = np.stack([pts[:-1], pts[1:]], axis=1).astype(np.float32)
        scene.add_line_segments(
            f"/markers/path_{i}",
            points=segments,
            colors=PATH_RGB[i % len(PATH_RGB)],
            thickness=3.0,
            thickness_units="screen",
        )

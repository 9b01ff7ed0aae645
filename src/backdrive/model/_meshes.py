"""Where a URDF's mesh files are: ``package://``, ``file://`` and relative references.

Part of the robot description; the previews (:mod:`backdrive.viz`) and the
contact geometry (:mod:`backdrive.contact`, which approximates meshes) both
read meshes through :func:`resolve_mesh_path`.
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

__all__ = ["default_package_dirs", "resolve_mesh_path"]


def default_package_dirs() -> list[Path]:
    """Folders searched for ``package://NAME/...`` URIs after the URDF's own ancestors.

    ``ROS_PACKAGE_PATH`` entries, the ``share`` folders of ``AMENT_PREFIX_PATH``
    and of the cmeel prefix in site-packages (where ``example-robot-data``
    installs), in that order.
    """
    dirs: list[Path] = []
    for entry in os.environ.get("ROS_PACKAGE_PATH", "").split(os.pathsep):
        if entry:
            dirs.append(Path(entry))
    for entry in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if entry:
            dirs.append(Path(entry) / "share")
    roots = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    roots += [p for p in sys.path if p.endswith("site-packages")]
    for root in roots:
        share = Path(root) / "cmeel.prefix" / "share"
        if share.is_dir() and share not in dirs:
            dirs.append(share)
    return dirs


def resolve_mesh_path(
    filename: str, *, urdf_dir: Path | None = None, package_dirs=None
) -> Path | None:
    """The file a URDF mesh reference points to, or ``None`` if none exists.

    ``package://NAME/REST`` is looked up as ``A/REST`` for an ancestor ``A`` of
    the URDF's folder named ``NAME``, then as ``D/NAME/REST`` (or ``D/REST`` if
    ``D`` is itself named ``NAME``) for every ancestor and every folder ``D`` in
    ``package_dirs`` and :func:`default_package_dirs`. ``file://`` URIs and
    absolute paths are taken as they are; relative paths are relative to the
    URDF's folder (the working directory if the URDF was given as text).

    Args:
        filename: the ``<mesh filename=...>`` attribute.
        urdf_dir: folder of the URDF file.
        package_dirs: extra folders to search for ``package://`` URIs.
    """
    base = Path(urdf_dir) if urdf_dir is not None else Path.cwd()
    if filename.startswith("package://"):
        rest = filename[len("package://"):]
        name, _, tail = rest.partition("/")
        candidates: list[Path] = []
        ancestors = [base, *base.parents]
        for anc in ancestors:
            if anc.name == name:
                candidates.append(anc / tail)
        search = ancestors + [Path(d) for d in (package_dirs or ())] + default_package_dirs()
        for d in search:
            candidates.append(d / name / tail)
            if d.name == name:
                candidates.append(d / tail)
    elif filename.startswith("file://"):
        candidates = [Path(filename[len("file://"):])]
    else:
        p = Path(filename)
        candidates = [p if p.is_absolute() else base / p]
    for c in candidates:
        if c.is_file():
            return c
    return None

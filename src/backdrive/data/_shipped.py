"""The URDF models that ship inside the backdrive wheel."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROBOTS_DIR", "SHIPPED_ROBOTS", "list_robots"]

# A plain directory next to this file: setuptools installs it as package data
# (pyproject: backdrive = ["data/robots/*.urdf"]) and the wheel is never zipped.
ROBOTS_DIR = Path(__file__).resolve().parent / "robots"

# Name -> file name. Explicit rather than globbed so that a stray file in the
# folder cannot become a public name.
SHIPPED_ROBOTS: dict[str, str] = {
    "cartpole": "cartpole.urdf",
    "double_pendulum": "double_pendulum.urdf",
    "panda": "panda.urdf",
    "pendulum": "pendulum.urdf",
    "quadruped": "quadruped.urdf",
}


def list_robots() -> tuple[str, ...]:
    """Names of the robot models shipped with backdrive, sorted.

    Each one is accepted by :func:`backdrive.data.get_data_path` and
    :func:`backdrive.data.load`.
    """
    return tuple(sorted(SHIPPED_ROBOTS))

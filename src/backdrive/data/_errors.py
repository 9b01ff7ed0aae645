"""Errors raised by :mod:`backdrive.data` (defined in :mod:`backdrive._errors`)."""

from __future__ import annotations

from backdrive._errors import MissingDependencyError, UnknownRobotError

__all__ = ["UnknownRobotError", "MissingDependencyError"]

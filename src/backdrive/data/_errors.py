"""Errors raised by :mod:`backdrive.data`."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from backdrive._errors import BackdriveError

__all__ = ["UnknownRobotError", "MissingDependencyError"]


class UnknownRobotError(BackdriveError):
    """A robot name that no shipped model and no installed model package has.

    A subclass of :class:`ValueError` (through
    :class:`~backdrive._errors.BackdriveError`): the name is bad input.

    Attributes:
        name: the name that was asked for.
        valid: every name that would have been accepted in that namespace.
        candidates: the closest valid names, best first (may be empty).
    """

    def __init__(self, name: str, valid: Iterable[str], *, kind: str = "robot", hint: str = ""):
        self.name = name
        self.valid = tuple(valid)
        self.candidates = tuple(difflib.get_close_matches(name, self.valid, n=3, cutoff=0.5))
        parts = [f"unknown {kind} {name!r}."]
        if self.candidates:
            parts.append("Did you mean " + " or ".join(repr(c) for c in self.candidates) + "?")
        if hint:
            parts.append(hint[:1].upper() + hint[1:] + ".")
        parts.append("Valid names: " + ", ".join(repr(v) for v in self.valid) + ".")
        super().__init__(" ".join(parts))


class MissingDependencyError(ImportError):
    """An optional model package is not installed.

    A subclass of :class:`ImportError`, not of :class:`ValueError`: the name
    asked for may be fine, the environment lacks the package that holds it.
    """

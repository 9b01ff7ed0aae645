"""Typed errors shared by every backdrive layer.

Every error raised at a public boundary is a subclass of :class:`BackdriveError`
and of :class:`ValueError`, so ``except ValueError`` keeps working for callers
that do not care about the finer classes.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "BackdriveError",
    "ModelError",
    "URDFParseError",
    "TopologyError",
    "UnsupportedJointError",
    "InvalidValueError",
    "UnknownNameError",
    "InputError",
    "ConfigError",
    "PolicyConfigError",
    "TrainingDivergedError",
    "closest_names",
]


class BackdriveError(ValueError):
    """Base class of every error backdrive raises on bad input."""


class ModelError(BackdriveError):
    """A robot description that cannot become a :class:`~backdrive.RobotModel`."""


class URDFParseError(ModelError):
    """Malformed XML, a forbidden XML feature (entities, DTDs) or no ``<robot>`` root."""


class TopologyError(ModelError):
    """The links and joints do not form one tree: missing or duplicated links,
    a link with two parents, a cycle, several roots."""


class UnsupportedJointError(ModelError):
    """A joint type backdrive does not model (unknown, planar, floating inside the tree)."""


class InvalidValueError(ModelError):
    """A missing, malformed or physically impossible number (NaN, negative mass,
    an inertia that is not positive semi-definite, a zero joint axis, ...)."""


class UnknownNameError(ModelError):
    """A link, joint or frame name that the model does not have.

    Attributes:
        name: the name that was asked for.
        candidates: the closest valid names, best first.
    """

    def __init__(self, kind: str, name: str, valid: Iterable[str], context: str = ""):
        valid = list(valid)
        self.name = name
        self.candidates = closest_names(name, valid)
        where = f" {context}" if context else ""
        hint = (
            f"; closest: {', '.join(repr(c) for c in self.candidates)}"
            if self.candidates
            else f"; valid {kind} names: {', '.join(repr(v) for v in valid[:12])}"
            + (" ..." if len(valid) > 12 else "")
        )
        super().__init__(f"unknown {kind} {name!r}{where}{hint}")


class InputError(BackdriveError):
    """A tensor argument with the wrong shape, dtype or device for the model."""


class ConfigError(InputError):
    """A numerical setting that is out of range or of the wrong type."""


def closest_names(name: str, valid: Iterable[str], n: int = 3) -> list[str]:
    """The ``n`` names in ``valid`` closest to ``name`` (difflib ratio), best first."""
    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=n, cutoff=0.4)
    if not close:
        low = name.lower()
        close = [v for v in valid if low in v.lower() or v.lower() in low][:n]
    return close


class PolicyConfigError(BackdriveError):
    """A policy-training setting that cannot work, caught before the first update."""


class TrainingDivergedError(RuntimeError):
    """A non-finite loss or gradient; the parameters are left at the last good update.

    Attributes:
        update: 1-based index of the update that failed.
        checkpoint: path of the last good checkpoint, or ``None``.
    """

    def __init__(self, message: str, update: int, checkpoint: str | None):
        super().__init__(message)
        self.update = update
        self.checkpoint = checkpoint

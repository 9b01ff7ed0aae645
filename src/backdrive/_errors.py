"""Every exception class backdrive defines, in one place.

All of them derive from :class:`BackdriveError`, so ``except
backdrive.BackdriveError`` catches anything backdrive raises on purpose. Each
family also derives from the standard exception that callers written before
the hierarchy relied on:

.. code-block:: text

    BackdriveError
    ├── ModelError (ValueError)            a robot description that cannot become a RobotModel
    │   ├── URDFParseError                 malformed XML, xacro, no <robot>
    │   ├── TopologyError                  not one tree
    │   ├── UnsupportedJointError          a joint type backdrive does not model
    │   ├── InvalidValueError              NaN, negative mass, a non-physical inertia, ...
    │   └── UnknownNameError               a link/joint/frame name the model lacks
    ├── InputError (ValueError)            a bad argument: shape, dtype, device, value
    │   ├── InputTypeError (TypeError)     an argument of the wrong type or dtype
    │   ├── ConfigError                    a setting out of range or of the wrong type
    │   │   └── PolicyConfigError          a policy-training setting
    │   ├── CheckpointMismatchError        a checkpoint for different geometry
    │   └── UnknownRobotError              a robot name no installed package has
    ├── SimulationError (ValueError)       a simulation that cannot go on
    │   └── NonFiniteError (FloatingPointError)  a NaN or infinity where a number was due
    ├── TrainingDivergedError (RuntimeError)
    ├── CompilerUnavailableError (RuntimeError)
    ├── MissingDependencyError (ImportError)   an optional package is not installed
    │   └── MissingExtraError                  ... one from the ``[viz]`` extra
    └── BrowserNotFoundError (FileNotFoundError)

``tests/test_errors.py`` walks the package and fails if an exception class is
defined anywhere else, does not derive from :class:`BackdriveError`, or is not
exported from ``backdrive``.
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
    "InputTypeError",
    "ConfigError",
    "PolicyConfigError",
    "CheckpointMismatchError",
    "UnknownRobotError",
    "SimulationError",
    "NonFiniteError",
    "TrainingDivergedError",
    "CompilerUnavailableError",
    "MissingDependencyError",
    "MissingExtraError",
    "BrowserNotFoundError",
    "BackdriveWarning",
    "ContactApproximationWarning",
    "closest_names",
]
#: The exception and warning classes, which ``backdrive`` exports at its top level.
CLASSES = tuple(name for name in __all__ if name != "closest_names")


class BackdriveError(Exception):
    """Base class of every exception backdrive raises on purpose.

    Not itself a :class:`ValueError`: each family below adds the standard
    class its callers expect (bad input and bad models are ``ValueError``,
    a missing package is ``ImportError``, a diverged training run is
    ``RuntimeError``).
    """


# --- models ---------------------------------------------------------------


class ModelError(BackdriveError, ValueError):
    """A robot description that cannot become a :class:`~backdrive.RobotModel`."""


class URDFParseError(ModelError):
    """Malformed XML, a forbidden XML feature (entities, DTDs), unexpanded xacro,
    or no ``<robot>`` root."""


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


class BackdriveWarning(UserWarning):
    """Base class of the warnings backdrive issues (filter them all with ``warnings.filterwarnings``)."""


class ContactApproximationWarning(BackdriveWarning):
    """A collision shape was approximated (a mesh by a box or sphere) or left out."""


def closest_names(name: str, valid: Iterable[str], n: int = 3) -> list[str]:
    """The ``n`` names in ``valid`` closest to ``name`` (difflib ratio), best first."""
    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=n, cutoff=0.4)
    if not close:
        low = name.lower()
        close = [v for v in valid if low in v.lower() or v.lower() in low][:n]
    return close


# --- arguments and settings -------------------------------------------------


class InputError(BackdriveError, ValueError):
    """An argument with the wrong shape, dtype, device or value for the call."""


class InputTypeError(InputError, TypeError):
    """An argument of the wrong Python type or tensor dtype.

    Also a :class:`TypeError`, so code written against the plain
    ``TypeError`` that :mod:`backdrive.spatial` raised before keeps working.
    """


class ConfigError(InputError):
    """A numerical setting that is out of range or of the wrong type."""


class PolicyConfigError(ConfigError):
    """A policy-training setting that cannot work, caught before the first update."""


class CheckpointMismatchError(InputError):
    """A checkpoint that belongs to different kinematic geometry."""


class UnknownRobotError(InputError):
    """A robot name that no shipped model and no installed model package has.

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


# --- running ----------------------------------------------------------------


class SimulationError(BackdriveError, ValueError):
    """A simulation that cannot go on (bad state, bad control, bad setting)."""


class NonFiniteError(SimulationError, FloatingPointError):
    """A value became NaN or infinite: a state, a control, a loss, a gradient,
    or (in :func:`backdrive.runtime.check_finite` mode) any checked output.

    Attributes:
        step: the first step or iteration index at which a non-finite value
            was found (state index ``t`` is the state after ``t`` steps), or
            ``None`` outside a loop.
        what: what was not finite: ``"q"``, ``"v"``, ``"control"``,
            ``"gradient"``, ``"loss"``, or the name of a checked argument or
            output.
        function: the public function whose input or output it was, or
            ``None`` when the message says it.
    """

    def __init__(self, message: str, *, step: int | None = None, what: str = "", function: str | None = None):
        super().__init__(message)
        self.step = step
        self.what = what
        self.function = function


class TrainingDivergedError(BackdriveError, RuntimeError):
    """A non-finite loss or gradient; the parameters are left at the last good update.

    Attributes:
        update: 1-based index of the update that failed.
        checkpoint: path of the last good checkpoint, or ``None``.
    """

    def __init__(self, message: str, update: int, checkpoint: str | None):
        super().__init__(message)
        self.update = update
        self.checkpoint = checkpoint


class CompilerUnavailableError(BackdriveError, RuntimeError):
    """``torch.compile`` cannot build code here (no dynamo support, or no C++
    compiler for inductor's CPU kernels)."""


# --- the environment ----------------------------------------------------------


class MissingDependencyError(BackdriveError, ImportError):
    """An optional package is not installed.

    An :class:`ImportError`, not a :class:`ValueError`: the name asked for may
    be fine, the environment lacks the package that holds it.
    """


class MissingExtraError(MissingDependencyError):
    """A plotting or preview function needs a package from the ``[viz]`` extra."""


class BrowserNotFoundError(BackdriveError, FileNotFoundError):
    """No Chromium-family browser was found to take a screenshot with."""

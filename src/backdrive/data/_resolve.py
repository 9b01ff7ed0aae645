"""Name -> URDF path resolution and loading."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import InputTypeError, UnknownRobotError
from ._example_robot_data import EXAMPLE_ROBOT_DATA_PREFIX, EXAMPLE_ROBOTS, example_robot_path
from ._shipped import ROBOTS_DIR, SHIPPED_ROBOTS, list_robots

if TYPE_CHECKING:
    from backdrive.model import RobotModel

__all__ = ["get_data_path", "load"]


def get_data_path(name: str) -> Path:
    """The URDF file of a named robot.

    Args:
        name: a shipped model, ``"panda"``, ``"pendulum"``,
            ``"double_pendulum"``, ``"cartpole"`` or ``"quadruped"`` (a
            trailing ``".urdf"`` is ignored; see :func:`list_robots`), or
            ``"example-robot-data:NAME"`` for a model of the installed
            example-robot-data package (see :func:`list_example_robots`).

    Returns:
        An absolute path to an existing ``.urdf`` file.

    Raises:
        InputTypeError: ``name`` is not a string (a TypeError).
        UnknownRobotError: no such robot (a ValueError); the message lists the
            valid names and the closest ones.
        MissingDependencyError: an ``"example-robot-data:"`` name while that
            package is not installed (an ImportError).
    """
    if not isinstance(name, str):
        raise InputTypeError(
            f"robot name must be a str, got {type(name).__name__}; "
            "pass a file path to RobotModel.from_urdf directly"
        )
    if name.startswith(EXAMPLE_ROBOT_DATA_PREFIX):
        return example_robot_path(name[len(EXAMPLE_ROBOT_DATA_PREFIX) :])
    short = name.removesuffix(".urdf")
    if short in SHIPPED_ROBOTS:
        return ROBOTS_DIR / SHIPPED_ROBOTS[short]
    hint = "models of the example-robot-data package are named 'example-robot-data:NAME'"
    if short in EXAMPLE_ROBOTS:
        hint = f"{short!r} is an example-robot-data model: ask for '{EXAMPLE_ROBOT_DATA_PREFIX}{short}'"
    raise UnknownRobotError(short, list_robots(), hint=hint)


def load(name: str, **kwargs: Any) -> RobotModel:
    """Load a named robot into a :class:`~backdrive.model.RobotModel`.

    Equivalent to ``RobotModel.from_urdf(get_data_path(name), **kwargs)``.

    Args:
        name: as for :func:`get_data_path`.
        **kwargs: passed to :meth:`RobotModel.from_urdf` (``floating_base``,
            ``dtype``, ``device``, ``mimic``, ``strict``). The quadruped is meant for
            ``floating_base=True``.

    Raises:
        UnknownRobotError, MissingDependencyError: as :func:`get_data_path`.
        InputTypeError: an option ``from_urdf`` does not take (with the closest).
    """
    path = get_data_path(name)
    # Imported here: backdrive.data sits below backdrive.model in the layer
    # list, and resolving names must not pay for importing torch models.
    import inspect

    from backdrive._errors import closest_names
    from backdrive.model import RobotModel

    valid = [p for p in inspect.signature(RobotModel.from_urdf).parameters if p != "source"]
    for key in kwargs:
        if key not in valid:
            close = closest_names(key, valid)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise InputTypeError(f"load() got an unknown option {key!r}; {hint}valid: {', '.join(valid)}")
    return RobotModel.from_urdf(path, **kwargs)

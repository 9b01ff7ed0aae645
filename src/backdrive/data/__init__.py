"""Robot models that backdrive ships, and resolvers for installed model packages.

Shipped models (URDF, primitive shapes only, sources named in each file):

* ``"panda"``: Franka Emika Panda with hand (Gaz et al. 2019 dynamics),
* ``"pendulum"``, ``"double_pendulum"``, ``"cartpole"``: closed-form test systems,
* ``"quadruped"``: a 12-dof floating-base quadruped (root link ``trunk``).

Models of the ``example-robot-data`` package are named
``"example-robot-data:NAME"`` (``"example-robot-data:ur5"``).

Example:
    >>> from backdrive.data import get_data_path, load
    >>> get_data_path("panda").name
    'panda.urdf'
    >>> robot = load("quadruped", floating_base=True)  # doctest: +SKIP
"""

from ._errors import MissingDependencyError, UnknownRobotError
from ._example_robot_data import (
    EXAMPLE_ROBOT_DATA_PREFIX,
    example_robot_data_dir,
    list_example_robots,
)
from ._resolve import get_data_path, load
from ._shipped import list_robots

__all__ = [
    "get_data_path",
    "load",
    "list_robots",
    "list_example_robots",
    "example_robot_data_dir",
    "EXAMPLE_ROBOT_DATA_PREFIX",
    "UnknownRobotError",
    "MissingDependencyError",
]

"""backdrive: differentiable robotics for PyTorch.

Kinematics, rigid-body dynamics and simulation whose every output carries
exact gradients. See ``README.md`` and ``docs/conventions.md``.
"""

from ._errors import (
    BackdriveError,
    InputError,
    InvalidValueError,
    ModelError,
    TopologyError,
    UnknownNameError,
    UnsupportedJointError,
    URDFParseError,
)
from .model import RobotModel

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "RobotModel",
    "BackdriveError",
    "ModelError",
    "URDFParseError",
    "TopologyError",
    "UnsupportedJointError",
    "InvalidValueError",
    "UnknownNameError",
    "InputError",
]

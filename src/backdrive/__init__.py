"""backdrive: differentiable robotics for PyTorch.

Kinematics, rigid-body dynamics and simulation whose every output carries
exact gradients. See ``README.md`` and ``docs/conventions.md``.
"""

from . import _errors
from ._errors import (  # the names of _errors.CLASSES, for readers and IDEs
    BackdriveError,
    BackdriveWarning,
    ContactApproximationWarning,
    BrowserNotFoundError,
    CheckpointMismatchError,
    CompilerUnavailableError,
    ConfigError,
    InputError,
    InputTypeError,
    InvalidValueError,
    MissingDependencyError,
    MissingExtraError,
    ModelError,
    NonFiniteError,
    PolicyConfigError,
    SimulationError,
    TopologyError,
    TrainingDivergedError,
    URDFParseError,
    UnknownNameError,
    UnknownRobotError,
    UnsupportedJointError,
)
from .model import RobotModel

# The layers, in the order data flows (each imports only the ones before it).
# ``backdrive.envs`` and ``backdrive.viz`` are imported on demand.
from . import spatial  # noqa: I001
from . import model
from . import kinematics
from . import dynamics
from . import contact
from . import sim
from . import layers
from . import optim
from . import analysis
from . import data
from . import cli
from . import runtime

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "RobotModel",
    "spatial",
    "model",
    "kinematics",
    "dynamics",
    "contact",
    "sim",
    "layers",
    "optim",
    "analysis",
    "data",
    "cli",
    "runtime",
    # The error and warning classes, as listed once in backdrive._errors.
    *_errors.CLASSES,
]

"""The robot description: URDF loading into a flat, immutable :class:`RobotModel`."""

from ._model import PHYSICAL_PARAMETERS, FrameGeometry, JointType, RobotModel, geometry_constants
from ._urdf import Geometry, parse_urdf

__all__ = [
    "RobotModel",
    "JointType",
    "FrameGeometry",
    "Geometry",
    "parse_urdf",
    "PHYSICAL_PARAMETERS",
    "geometry_constants",
]

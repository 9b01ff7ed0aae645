"""Forward kinematics over the whole tree, frame Jacobians, serial chains and IK."""

from ._fk import (
    body_transforms,
    forward_kinematics,
    frame_jacobian,
    frame_transforms,
    joint_values,
)

__all__ = [
    "forward_kinematics",
    "frame_jacobian",
    "frame_transforms",
    "body_transforms",
    "joint_values",
]

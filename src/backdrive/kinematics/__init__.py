"""Forward kinematics over the whole tree, frame Jacobians, serial chains and IK."""

from ..spatial import pose_error
from ._chain import SerialChainKinematics
from ._fk import (
    body_transforms,
    forward_kinematics,
    frame_jacobian,
    frame_transforms,
    joint_values,
)
from ._paths import use_path
from ._ik import (
    ConfigError,
    DifferentiableIKCfg,
    DifferentiableIKResult,
    default_seed,
    dls_step,
    solve_dls_ik,
)

__all__ = [
    "forward_kinematics",
    "frame_jacobian",
    "frame_transforms",
    "body_transforms",
    "joint_values",
    "SerialChainKinematics",
    "pose_error",
    "DifferentiableIKCfg",
    "DifferentiableIKResult",
    "ConfigError",
    "solve_dls_ik",
    "dls_step",
    "default_seed",
    "use_path",
]

"""Forward kinematics over the whole tree, frame Jacobians, serial chains and IK."""

from ..spatial import pose_error
from ._chain import SerialChainKinematics
from ..runtime import finite_checked
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

# Checked for NaN/inf under backdrive.runtime.check_finite() (one thread-local read otherwise).
forward_kinematics = finite_checked(forward_kinematics, name="forward_kinematics")
frame_transforms = finite_checked(frame_transforms, name="frame_transforms")
body_transforms = finite_checked(body_transforms, name="body_transforms")
frame_jacobian = finite_checked(frame_jacobian, name="frame_jacobian")

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

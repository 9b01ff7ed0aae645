"""Rotations and rigid transforms on tensors.

Pure functions with leading batch axes that broadcast, float32 or float64, any
device, differentiable everywhere (finite gradients at zero angle and at pi).

Conventions: quaternions are ``wxyz``; poses are homogeneous ``(..., 4, 4)``
matrices, parent-from-child; twists are ``[linear; angular]``; URDF ``rpy``
is ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``; SI units (m, rad).
"""

from . import _quat, _se3, _so3
from ._quat import matrix_to_quat as matrix_to_quat
from ._quat import quat_apply as quat_apply
from ._quat import quat_conjugate as quat_conjugate
from ._quat import quat_identity as quat_identity
from ._quat import quat_inverse as quat_inverse
from ._quat import quat_multiply as quat_multiply
from ._quat import quat_normalize as quat_normalize
from ._quat import quat_to_matrix as quat_to_matrix
from ._quat import quat_to_rotvec as quat_to_rotvec
from ._quat import random_quat as random_quat
from ._quat import random_rotation as random_rotation
from ._quat import rotvec_to_quat as rotvec_to_quat
from ._se3 import adjoint as adjoint
from ._se3 import adjoint_inverse as adjoint_inverse
from ._se3 import identity_transform as identity_transform
from ._se3 import is_rigid_transform as is_rigid_transform
from ._se3 import make_transform as make_transform
from ._se3 import pose_error as pose_error
from ._se3 import random_transform as random_transform
from ._se3 import se3_exp as se3_exp
from ._se3 import se3_log as se3_log
from ._se3 import transform_compose as transform_compose
from ._se3 import transform_inverse as transform_inverse
from ._se3 import transform_point as transform_point
from ._so3 import matrix_to_rotvec as matrix_to_rotvec
from ._so3 import matrix_to_rpy as matrix_to_rpy
from ._so3 import rotvec_to_matrix as rotvec_to_matrix
from ._so3 import rpy_to_matrix as rpy_to_matrix
from ._so3 import skew as skew
from ._so3 import so3_exp as so3_exp
from ._so3 import so3_log as so3_log
from ._so3 import unskew as unskew

# The public names are each submodule's __all__ (kept there, next to the
# definitions), in this order; `__all__ += module.__all__` is the form static
# checkers follow.
__all__: list[str] = []
__all__ += _so3.__all__
__all__ += _quat.__all__
__all__ += _se3.__all__

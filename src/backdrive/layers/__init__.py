"""Differentiable kinematics as ``torch.nn.Module`` layers with checkpoint contracts.

* :class:`DifferentiableFKLayer`: tool poses and geometric Jacobians of a serial chain.
* :class:`DifferentiableIKLayer`: unrolled damped least-squares inverse kinematics.
"""

from ._fk_layer import CheckpointMismatchError, DifferentiableFKLayer
from ._ik_layer import DifferentiableIKLayer

__all__ = [
    "DifferentiableFKLayer",
    "DifferentiableIKLayer",
    "CheckpointMismatchError",
]

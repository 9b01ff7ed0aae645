"""Rigid-body dynamics on the whole tree, batched, differentiable.

Inverse dynamics (RNEA), the mass matrix (CRBA), forward dynamics (CRBA with
a batched Cholesky solve, or ABA), energies, centre of mass, joint damping and
friction, and integration on the configuration manifold. Fixed and floating
base, revolute, continuous, prismatic and mimic joints. Every function takes
the robot first and tensors with leading batch axes that broadcast; see
``docs/dynamics.md`` for the conventions and the comparison with Pinocchio.
"""

from ._compiled import CompilerUnavailableError, compile_forward_dynamics
from ._configuration import difference, integrate
from ._crba import mass_matrix
from ._energy import center_of_mass, kinetic_energy, potential_energy
from ._forward import DEFAULT_FRICTION_WIDTH, FORWARD_METHODS, forward_dynamics, joint_forces
from ._rnea import bias_forces, gravity_forces, inverse_dynamics
from ..kinematics._paths import use_path

__all__ = [
    "inverse_dynamics",
    "mass_matrix",
    "bias_forces",
    "gravity_forces",
    "forward_dynamics",
    "joint_forces",
    "kinetic_energy",
    "potential_energy",
    "center_of_mass",
    "integrate",
    "difference",
    "DEFAULT_FRICTION_WIDTH",
    "FORWARD_METHODS",
    "compile_forward_dynamics",
    "CompilerUnavailableError",
    "use_path",
]

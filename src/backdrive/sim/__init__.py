"""Differentiable time stepping: state, integrators, actuators, joint limits,
joint damping and friction (implicit in the Euler integrators).

``Simulator(robot, dt).rollout(state0, controls)`` returns the stacked states;
everything is plain autograd, so gradients reach the initial state, the
controls, actuator gains and the robot's physical parameters.
"""

from ._actuators import PDActuator, SoftJointLimits, TorqueActuator, smooth_saturation
from ._integrators import INTEGRATORS, explicit_euler, rk4, semi_implicit_euler
from ._simulator import JOINT_FORCE_MODES, Simulator
from ._compile import CompiledStep, compile_step
from ._state import NonFiniteError, SimulationError, State, Trajectory
from ._systems import MassSpringDamper, RobotSystem, System, as_system

__all__ = [
    "Simulator",
    "JOINT_FORCE_MODES",
    "compile_step",
    "CompiledStep",
    "State",
    "Trajectory",
    "System",
    "RobotSystem",
    "MassSpringDamper",
    "as_system",
    "TorqueActuator",
    "PDActuator",
    "SoftJointLimits",
    "smooth_saturation",
    "INTEGRATORS",
    "semi_implicit_euler",
    "explicit_euler",
    "rk4",
    "SimulationError",
    "NonFiniteError",
]

"""Batched differentiable environments and their gymnasium views.

Every environment steps ``num_envs`` copies at once with torch ops, so
observations and rewards carry gradients to the actions and the previous
state; :meth:`DiffEnv.detach` truncates backpropagation between windows.
"""

from ._adapter import to_gymnasium, to_sb3_vec_env
from ._base import DiffEnv
from ._cartpole import CartPoleSwingUp
from ._humanoid import BALANCE_FEEDBACK_KEYS, G1_BALANCE_FEEDBACK, G1_CAPTURE_FEEDBACK, HumanoidBalance
from ._panda import PandaReach
from ._pendulum import Pendulum, angle_normalize
from ._quadruped import QuadrupedWalk, Randomization

__all__ = [
    "DiffEnv",
    "Pendulum",
    "CartPoleSwingUp",
    "PandaReach",
    "QuadrupedWalk",
    "HumanoidBalance",
    "G1_BALANCE_FEEDBACK",
    "G1_CAPTURE_FEEDBACK",
    "BALANCE_FEEDBACK_KEYS",
    "Randomization",
    "angle_normalize",
    "to_gymnasium",
    "to_sb3_vec_env",
]

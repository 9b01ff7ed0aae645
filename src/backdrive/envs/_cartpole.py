"""Cart-pole swing-up on backdrive's rigid-body dynamics (the shipped ``cartpole`` URDF)."""

from __future__ import annotations

import math

import torch

from .._errors import InputError
from ..sim import Simulator, SoftJointLimits, State, TorqueActuator
from ._base import DiffEnv
from ._pendulum import angle_normalize

__all__ = ["CartPoleSwingUp"]


class CartPoleSwingUp(DiffEnv):
    r"""Swing the pole up from hanging and balance it, pushing only the cart.

    The system is the shipped ``"cartpole"`` URDF (cart 1 kg on a prismatic
    slider along x, pole 0.1 kg and 1 m about y, angle 0 upright and pi
    hanging), stepped by :class:`backdrive.sim.Simulator` with semi-implicit
    Euler, ``substeps`` substeps per control period ``dt``. The track ends at
    +-2.4 m (the URDF's slider limits) are soft: a 300 N/m spring and a
    10 N s/m damper, stiff enough to hold the full force within 4 cm and soft
    enough that one 0.05 s step stays stable after a crash at full speed.

    State ``[x, theta, x_dot, theta_dot]`` (theta wrapped to ``[-pi, pi)``
    after every step, so the URDF's +-2 pi hinge limit never acts),
    observation ``[x, cos theta, sin theta, x_dot, theta_dot]``, action the
    force on the cart in N, clipped to ``[-max_force, max_force]``.
    Reward per step (upright pole, centred cart, small speeds and force)::

        cos(theta) - 0.1 x^2 - 0.01 theta_dot^2 - 0.01 x_dot^2 - 0.01 (F / max_force)^2

    at most 1, so the best return of an episode is below ``max_episode_steps``.
    Episodes start hanging (``theta = pi``) with a little noise, are
    truncated after 240 steps (12 s) and never terminate.

    Args:
        num_envs: number of cart-poles.
        robot: a cart-pole :class:`~backdrive.RobotModel` (default: the
            shipped ``"cartpole"`` in ``dtype`` on ``device``).
        dt: control period, s.
        substeps: simulator steps per control period.
        max_force: force bound, N (the URDF's slider effort is 10 N).
        max_episode_steps: truncation length.
        init_noise: half-widths of the uniform noise on the initial
            ``[x, theta, x_dot, theta_dot]`` around hanging at rest (m, rad,
            m/s, rad/s), one number for all four or four. ``(0.5, pi, 1, 2)``
            gives "exploring starts" over every pole angle for training.
        dtype, device, autoreset: see :class:`DiffEnv`.
    """

    obs_dim = 5
    action_dim = 1
    state_dim = 4

    def __init__(
        self,
        num_envs: int = 1,
        *,
        robot=None,
        dt: float = 0.05,
        substeps: int = 1,
        max_force: float = 10.0,
        max_episode_steps: int = 240,
        init_noise: float | tuple[float, float, float, float] = 0.05,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        autoreset: bool = True,
    ) -> None:
        super().__init__(num_envs, dtype=dtype, device=device, autoreset=autoreset)
        robot = self._robot_model(robot, "cartpole")
        if robot.nq != 2 or robot.nv != 2:
            raise InputError(f"CartPoleSwingUp needs a 2-dof cart-pole (slider, hinge), got nq={robot.nq}")
        if isinstance(substeps, bool) or not isinstance(substeps, int) or substeps < 1:
            raise InputError(f"substeps must be a positive int, got {substeps!r}")
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise InputError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
        noise = torch.as_tensor(init_noise, dtype=self.dtype, device=self.device).expand(4).clone()
        if not (max_force > 0 and dt > 0 and bool((noise >= 0).all())):
            raise InputError(
                f"need max_force > 0, dt > 0, init_noise >= 0; got {max_force}, {dt}, {init_noise}"
            )
        self.robot = robot
        self.dt = float(dt)
        self.substeps = substeps
        self.max_force = float(max_force)
        self.max_episode_steps = max_episode_steps
        self.init_noise = noise
        # The force is clipped here, so the actuator itself does not saturate.
        # Stiffer track ends (1e3 N/m) make a 0.05 s semi-implicit step blow
        # up when the cart hits them at several m/s.
        self.sim = Simulator(
            robot,
            self.dt / substeps,
            integrator="semi_implicit",
            actuator=TorqueActuator(joints=["slider"], effort_limit=math.inf),
            limits=SoftJointLimits(stiffness=300.0, damping=10.0),
        )

    @property
    def action_low(self) -> torch.Tensor:
        return torch.full((1,), -self.max_force, dtype=self.dtype, device=self.device)

    @property
    def action_high(self) -> torch.Tensor:
        return torch.full((1,), self.max_force, dtype=self.dtype, device=self.device)

    def initial_state(self, n: int, generator: torch.Generator) -> torch.Tensor:
        noise = self._uniform(-self.init_noise, self.init_noise, (n, 4), generator)
        hanging = torch.tensor([0.0, math.pi, 0.0, 0.0], dtype=self.dtype, device=self.device)
        state = hanging + noise
        return torch.cat([state[:, :1], angle_normalize(state[:, 1:2]), state[:, 2:]], dim=-1)

    def transition(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        force = action.clamp(-self.max_force, self.max_force)
        s = State(state[..., :2], state[..., 2:])
        for _ in range(self.substeps):
            s = self.sim.step(s, force, check_finite=False)
        q, v = s.q, s.v
        return torch.cat([q[..., :1], angle_normalize(q[..., 1:2]), v], dim=-1)

    def reward(
        self, state: torch.Tensor, action: torch.Tensor, next_state: torch.Tensor
    ) -> torch.Tensor:
        x, th, xd, thd = next_state.unbind(-1)
        u = action[..., 0].clamp(-self.max_force, self.max_force) / self.max_force
        return torch.cos(th) - 0.1 * x**2 - 0.01 * thd**2 - 0.01 * xd**2 - 0.01 * u**2

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        x, th, xd, thd = state.unbind(-1)
        return torch.stack([x, torch.cos(th), torch.sin(th), xd, thd], dim=-1)

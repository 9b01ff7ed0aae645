"""Panda reaching: the shipped Panda under gravity, driven by PD joint-position targets."""

from __future__ import annotations

import torch

from .._errors import InputError
from ..kinematics import frame_transforms
from ..sim import PDActuator, Simulator, SoftJointLimits, State
from ._base import DiffEnv

__all__ = ["PandaReach"]

# A common ready pose of the Panda (rad), fingers half open (m).
_HOME = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785, 0.02)
# Joint-space inertia diagonal at _HOME (kg m^2, from the shipped model's
# mass matrix); PD gains are set per joint from it for one natural frequency.
_INERTIA = (0.53, 1.55, 0.99, 0.96, 0.044, 0.054, 0.0067, 0.030)


class PandaReach(DiffEnv):
    r"""Move the Panda's tool centre point to a random target point.

    The shipped ``"panda"`` model (7 arm joints and the finger slider) is
    simulated under gravity by :class:`backdrive.sim.Simulator`
    (semi-implicit Euler, ``substeps`` steps per control period) with a
    :class:`~backdrive.sim.PDActuator` on every joint and the model's joint
    limits as soft spring-dampers. There is no gravity compensation: the
    policy has to learn the offsets. The action is the 7 arm joints' target
    positions (rad), clipped to the joint limits; the fingers are held at
    0.02 m. PD gains give every joint the natural frequency ``omega`` and
    critical damping at the home pose: ``kp = I omega^2``, ``kd = 2 I omega``
    with ``I`` the mass-matrix diagonal there.

    State ``[q (8), v (8), target (3)]``; observation
    ``[q_arm (7), v_arm (7), p_tcp (3), target - p_tcp (3)]`` (20); reward::

        -|p_tcp - target| - 0.01 |v_arm|^2

    (m, rad/s). Episodes of 100 steps (5 s) start near the home pose with a
    target uniform in the box ``[0.3, 0.65] x [-0.35, 0.35] x [0.15, 0.65]`` m
    in front of the robot; they never terminate.

    Args:
        num_envs: number of robots.
        robot: a Panda :class:`~backdrive.RobotModel` (default: the shipped
            ``"panda"`` in ``dtype`` on ``device``).
        dt: control period, s.
        substeps: simulator steps per control period.
        omega: PD natural frequency, rad/s.
        max_episode_steps: truncation length.
        dtype, device, autoreset: see :class:`DiffEnv`.
    """

    action_dim = 7
    obs_dim = 20
    state_dim = 19
    tcp_frame = "panda_hand_tcp"
    target_low = (0.3, -0.35, 0.15)
    target_high = (0.65, 0.35, 0.65)

    def __init__(
        self,
        num_envs: int = 1,
        *,
        robot=None,
        dt: float = 0.05,
        substeps: int = 5,
        omega: float = 10.0,
        max_episode_steps: int = 100,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        autoreset: bool = True,
    ) -> None:
        super().__init__(num_envs, dtype=dtype, device=device, autoreset=autoreset)
        if robot is None:
            from ..data import load

            robot = load("panda", dtype=self.dtype, device=self.device)
        if robot.dtype != self.dtype or robot.device != self.device:
            raise InputError(f"robot is {robot.dtype} on {robot.device}, the env {self.dtype} on {self.device}")
        if robot.nq != 8:
            raise InputError(f"PandaReach needs the 8-coordinate Panda (7 arm joints, fingers), got nq={robot.nq}")
        if isinstance(substeps, bool) or not isinstance(substeps, int) or substeps < 1:
            raise InputError(f"substeps must be a positive int, got {substeps!r}")
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise InputError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
        if not (dt > 0 and omega > 0):
            raise InputError(f"need dt > 0 and omega > 0, got {dt}, {omega}")
        self.robot = robot
        self.dt = float(dt)
        self.substeps = substeps
        self.max_episode_steps = max_episode_steps
        self._tcp = robot.frame_index(self.tcp_frame)
        inertia = torch.tensor(_INERTIA, dtype=self.dtype, device=self.device)
        self.kp = inertia * omega**2
        self.kd = 2.0 * inertia * omega
        self.sim = Simulator(
            robot,
            self.dt / substeps,
            integrator="semi_implicit",
            actuator=PDActuator(kp=self.kp, kd=self.kd),
            limits=SoftJointLimits(stiffness=200.0, damping=5.0),
        )
        self.home = torch.tensor(_HOME, dtype=self.dtype, device=self.device)
        self._finger = self.home[7:]

    @property
    def action_low(self) -> torch.Tensor:
        return self.robot.lower[:7].clone()

    @property
    def action_high(self) -> torch.Tensor:
        return self.robot.upper[:7].clone()

    def initial_state(self, n: int, generator: torch.Generator) -> torch.Tensor:
        q = self.home + self._uniform(-0.1, 0.1, (n, 8), generator) * torch.tensor(
            [1.0] * 7 + [0.0], dtype=self.dtype, device=self.device
        )
        v = torch.zeros(n, 8, dtype=self.dtype, device=self.device)
        target = self._uniform(self.target_low, self.target_high, (n, 3), generator)
        return torch.cat([q, v, target], dim=-1)

    def tcp_position(self, q: torch.Tensor) -> torch.Tensor:
        """World position ``(..., 3)`` of the tool centre point at ``q (..., 8)``, m."""
        _, p = frame_transforms(self.robot, q, [self._tcp])
        return p[..., 0, :]

    def transition(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        q, v, target = state[..., :8], state[..., 8:16], state[..., 16:]
        arm = torch.minimum(torch.maximum(action, self.action_low), self.action_high)
        u = torch.cat([arm, self._finger.expand(*arm.shape[:-1], 1)], dim=-1)
        s = State(q, v)
        for _ in range(self.substeps):
            s = self.sim.step(s, u, check_finite=False)
        return torch.cat([s.q, s.v, target], dim=-1)

    def reward(
        self, state: torch.Tensor, action: torch.Tensor, next_state: torch.Tensor
    ) -> torch.Tensor:
        q, v, target = next_state[..., :8], next_state[..., 8:16], next_state[..., 16:]
        dist = torch.linalg.vector_norm(self.tcp_position(q) - target, dim=-1)
        return -dist - 0.01 * v[..., :7].pow(2).sum(-1)

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        q, v, target = state[..., :8], state[..., 8:16], state[..., 16:]
        p = self.tcp_position(q)
        return torch.cat([q[..., :7], v[..., :7], p, target - p], dim=-1)

"""Panda reaching: the shipped Panda under gravity, driven by PD joint-position targets."""

from __future__ import annotations

import torch

from .._errors import InputError
from ..dynamics import bias_forces, joint_forces, mass_matrix
from ..kinematics import frame_transforms
from ._base import DiffEnv

__all__ = ["PandaReach"]

# A common ready pose of the Panda (rad), fingers half open (m).
_HOME = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785, 0.02)
# Joint-space inertia diagonal at _HOME (kg m^2, from the shipped model's
# mass matrix); PD gains are set per joint from it for one natural frequency.
_INERTIA = (0.53, 1.55, 0.99, 0.96, 0.044, 0.054, 0.0067, 0.030)
_INTEGRATORS = ("implicit", "semi_implicit")


class PandaReach(DiffEnv):
    r"""Move the Panda's tool centre point to a random target point.

    The shipped ``"panda"`` model (7 arm joints and the finger slider) under
    gravity, every joint driven by a PD position servo. The action is the 7
    arm joints' target positions (rad), clipped to the joint limits; the
    fingers are held at 0.02 m. PD gains give every joint the natural
    frequency ``omega`` and critical damping at the home pose:
    ``kp = I omega^2``, ``kd = 2 I omega`` with ``I`` the mass-matrix diagonal
    there. The servo's stiffness torque is limited smoothly to the URDF's
    effort limits (``tau_max tanh(kp e / tau_max)`` for a target error
    ``e``), and with ``gravity_compensation`` (the default, as on the real
    robot's controller) it adds the model's gravity torques ``g(q)``, so a
    target is reached without a steady-state sag.

    One control period ``dt`` is ``substeps`` steps of the rigid-body
    dynamics ``M(q) a = tau - C(q, v) v - g(q) + tau_limits`` (mass matrix
    by CRBA, bias forces by RNEA, the model's joint damping and friction if
    any). ``integrator="implicit"`` (default) treats the PD servo and the
    soft joint-limit springs implicitly (backward Euler in the velocity,
    ``(M + h kd + h^2 kp) v' = M v + h (kp e + f)``, then ``q' = q + h v'``):
    stable at any step length, so one 0.05 s step per control period
    suffices. Backward Euler damps fast motion a little more than the
    continuous system: through a large move the joints lag a 2.5 ms
    symplectic-Euler reference by up to 0.09 rad, and they settle on the
    same pose (within 2e-3 rad after 2 s; ``tests/test_envs.py``).
    ``"semi_implicit"`` (symplectic Euler, everything explicit) is that
    reference: 0.01 s steps diverge when a target is far from ``q`` and the
    limit springs engage, so it defaults to 50 substeps. The joint limits are
    spring-dampers (200 N m/rad, 5 N m s/rad) beyond the URDF's limits.

    State ``[q (8), v (8), target (3)]``; observation
    ``[q_arm (7), v_arm (7), p_tcp (3), target - p_tcp (3)]`` (20); reward::

        -|p_tcp - target| - 0.01 |v_arm|^2

    (m, rad/s). Episodes of ``max_episode_steps`` (default 50 steps, 2.5 s)
    start near the home pose (every arm joint uniform within 0.1 rad) with a
    target uniform in the box ``[0.3, 0.65] x [-0.35, 0.35] x [0.15, 0.65]`` m
    in front of the robot; they never terminate.

    Args:
        num_envs: number of robots.
        robot: a Panda :class:`~backdrive.RobotModel` (default: the shipped
            ``"panda"`` in ``dtype`` on ``device``).
        dt: control period, s.
        substeps: dynamics steps per control period (default 1 for
            ``"implicit"``, 50 for ``"semi_implicit"``).
        omega: PD natural frequency, rad/s.
        integrator: ``"implicit"`` or ``"semi_implicit"``.
        gravity_compensation: add ``g(q)`` to the servo torques.
        max_episode_steps: truncation length.
        dtype, device, autoreset: see :class:`DiffEnv`.
    """

    action_dim = 7
    obs_dim = 20
    state_dim = 19
    tcp_frame = "panda_hand_tcp"
    target_low = (0.3, -0.35, 0.15)
    target_high = (0.65, 0.35, 0.65)
    limit_stiffness = 200.0
    limit_damping = 5.0

    def __init__(
        self,
        num_envs: int = 1,
        *,
        robot=None,
        dt: float = 0.05,
        substeps: int | None = None,
        omega: float = 10.0,
        integrator: str = "implicit",
        gravity_compensation: bool = True,
        max_episode_steps: int = 50,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        autoreset: bool = True,
    ) -> None:
        super().__init__(num_envs, dtype=dtype, device=device, autoreset=autoreset)
        robot = self._robot_model(robot, "panda")
        if robot.nq != 8 or robot.nv != 8:
            raise InputError(f"PandaReach needs the 8-coordinate Panda (7 arm joints, fingers), got nq={robot.nq}")
        if integrator not in _INTEGRATORS:
            raise InputError(f"unknown integrator {integrator!r}; choose one of {', '.join(_INTEGRATORS)}")
        if substeps is None:
            substeps = 1 if integrator == "implicit" else 50
        if isinstance(substeps, bool) or not isinstance(substeps, int) or substeps < 1:
            raise InputError(f"substeps must be a positive int, got {substeps!r}")
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise InputError(f"max_episode_steps must be a positive int, got {max_episode_steps!r}")
        if not (dt > 0 and omega > 0):
            raise InputError(f"need dt > 0 and omega > 0, got {dt}, {omega}")
        self.robot = robot
        self.dt = float(dt)
        self.substeps = substeps
        self.integrator = integrator
        self.gravity_compensation = bool(gravity_compensation)
        self.max_episode_steps = max_episode_steps
        self._tcp = robot.frame_index(self.tcp_frame)
        inertia = torch.tensor(_INERTIA, dtype=self.dtype, device=self.device)
        self.kp = inertia * omega**2
        self.kd = 2.0 * inertia * omega
        self.effort_limit = robot.effort_limit.clone()
        self._joint_friction = bool((robot.damping != 0).any() or (robot.friction != 0).any())
        self._no_gravity = torch.zeros(3, dtype=self.dtype, device=self.device)
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

    def distance(self, state: torch.Tensor) -> torch.Tensor:
        """Distance ``(...,)`` from the tool centre point to the target in ``state``, m."""
        return torch.linalg.vector_norm(self.tcp_position(state[..., :8]) - state[..., 16:], dim=-1)

    def _substep(self, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor, h: float):
        robot = self.robot
        # Servo: stiffness torque limited smoothly to the effort limits.
        lim = self.effort_limit
        stiff = lim * torch.tanh(self.kp * (u - q) / lim)
        # Everything but the servo and the limit springs, explicit.
        if self.gravity_compensation:
            # C(q, v) v - g(q) + g(q): the bias forces without gravity.
            f = -bias_forces(robot, q, v, gravity=self._no_gravity)
        else:
            f = -bias_forces(robot, q, v)
        if self._joint_friction:
            f = f + joint_forces(robot, v)
        # Soft joint limits: springs and dampers on the penetration.
        over = torch.relu(q - robot.upper)
        under = torch.relu(robot.lower - q)
        active = ((over > 0) | (under > 0)).to(q.dtype)
        f_lim = self.limit_stiffness * (under - over)
        m = mass_matrix(robot, q)
        mv = (m @ v.unsqueeze(-1)).squeeze(-1)
        if self.integrator == "implicit":
            # Backward Euler in the stiff terms: the spring forces are taken at
            # q' = q + h v', the damping at v'.
            k = self.kp * (1.0 - torch.tanh(self.kp * (u - q) / lim).pow(2)) + self.limit_stiffness * active
            c = self.kd + self.limit_damping * active
            a = m + torch.diag_embed(h * c + h * h * k)
            rhs = mv + h * (stiff + f_lim + f)
        else:
            a = m
            rhs = mv + h * (stiff - self.kd * v + f_lim - self.limit_damping * active * v + f)
        v1 = torch.linalg.solve(a, rhs.unsqueeze(-1)).squeeze(-1)
        return q + h * v1, v1

    def transition(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        q, v, target = state[..., :8], state[..., 8:16], state[..., 16:]
        arm = torch.minimum(torch.maximum(action, self.action_low), self.action_high)
        u = torch.cat([arm, self._finger.expand(*arm.shape[:-1], 1)], dim=-1)
        h = self.dt / self.substeps
        for _ in range(self.substeps):
            q, v = self._substep(q, v, u, h)
        return torch.cat([q, v, target], dim=-1)

    def reward(
        self, state: torch.Tensor, action: torch.Tensor, next_state: torch.Tensor
    ) -> torch.Tensor:
        v = next_state[..., 8:16]
        return -self.distance(next_state) - 0.01 * v[..., :7].pow(2).sum(-1)

    def observe(self, state: torch.Tensor) -> torch.Tensor:
        q, v, target = state[..., :8], state[..., 8:16], state[..., 16:]
        p = self.tcp_position(q)
        return torch.cat([q[..., :7], v[..., :7], p, target - p], dim=-1)

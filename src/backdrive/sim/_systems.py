"""The small "system" interface the simulator steps, and its implementations.

A system says how big its state is, how joint efforts become generalised
forces, what acceleration results (``forward_dynamics``) and how a
configuration moves along a velocity (``integrate``, on the manifold for a
floating base). :class:`RobotSystem` does this for any URDF robot through
:mod:`backdrive.dynamics`; :class:`MassSpringDamper` is a 1-D system with
closed-form dynamics.
"""

from __future__ import annotations

import math

import torch

from .._errors import InputError, UnknownNameError
from ..dynamics import DEFAULT_FRICTION_WIDTH, forward_dynamics, integrate
from ..model import RobotModel

__all__ = ["System", "RobotSystem", "MassSpringDamper", "as_system"]


class System:
    """Interface of a system that :class:`~backdrive.sim.Simulator` can step.

    Subclasses set ``nq``, ``nv``, ``joint_names``, ``lower``, ``upper``,
    ``effort_limit``, ``dtype``, ``device`` and implement
    :meth:`forward_dynamics` and :meth:`integrate`. The defaults below are for
    a fixed base, where the joint coordinates are the whole of ``q`` and ``v``.
    """

    nq: int
    nv: int
    joint_names: tuple[str, ...]
    lower: torch.Tensor
    upper: torch.Tensor
    effort_limit: torch.Tensor
    floating_base: bool = False

    @property
    def num_joints(self) -> int:
        return len(self.joint_names)

    @property
    def dtype(self) -> torch.dtype:
        return self.lower.dtype

    @property
    def device(self) -> torch.device:
        return self.lower.device

    def forward_dynamics(self, q: torch.Tensor, v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """Acceleration ``(..., nv)`` under generalised force ``tau (..., nv)``."""
        raise NotImplementedError

    def integrate(self, q: torch.Tensor, v: torch.Tensor, dt: float) -> torch.Tensor:
        """Configuration reached from ``q`` moving at constant ``v`` for ``dt``."""
        raise NotImplementedError

    def dexp_inv(self, xi: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Rate of the local coordinates ``xi`` of ``q = integrate(q0, xi, 1)``
        when the system moves at velocity ``v``: ``xi' = dexp_inv(xi, v)``.

        Identity in a vector space (the default); a floating base needs the
        Lie-group correction (see :class:`RobotSystem`).
        """
        return v

    def joint_positions(self, q: torch.Tensor) -> torch.Tensor:
        """``(..., nj)`` joint coordinates out of ``q``."""
        start = self.nq - self.num_joints
        return q if start == 0 else q[..., start:]

    def joint_velocities(self, v: torch.Tensor) -> torch.Tensor:
        """``(..., nj)`` joint rates out of ``v``."""
        start = self.nv - self.num_joints
        return v if start == 0 else v[..., start:]

    def generalized_force(self, tau_joints: torch.Tensor) -> torch.Tensor:
        """``(..., nv)`` generalised force from joint efforts ``(..., nj)`` (an
        unactuated floating base gets zero)."""
        pad = self.nv - self.num_joints
        if pad == 0:
            return tau_joints
        return torch.cat([tau_joints.new_zeros(*tau_joints.shape[:-1], pad), tau_joints], dim=-1)

    def joint_index(self, joint) -> int:
        """Index of a joint given by name or index among the joint coordinates."""
        if isinstance(joint, str):
            if joint not in self.joint_names:
                raise UnknownNameError("joint", joint, self.joint_names)
            return self.joint_names.index(joint)
        if isinstance(joint, int) and -self.num_joints <= joint < self.num_joints:
            return joint % self.num_joints
        raise InputError(f"joint must be a name or an index below {self.num_joints}, got {joint!r}")

    def check_state(self, q: torch.Tensor, v: torch.Tensor) -> None:
        """Raise :class:`InputError` unless ``q (..., nq)`` and ``v (..., nv)``
        match the system's sizes, dtype and device."""
        for x, n, name in ((q, self.nq, "q"), (v, self.nv, "v")):
            _check(x, n, name, self.dtype, self.device)


def _check(x, n: int, name: str, dtype, device) -> None:
    if not isinstance(x, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim == 0 or x.shape[-1] != n:
        raise InputError(f"{name} must have shape (..., {n}), got {tuple(x.shape)}")
    if x.dtype != dtype:
        raise InputError(f"{name} has dtype {x.dtype} but the system is {dtype}")
    if x.device != device:
        raise InputError(f"{name} is on {x.device} but the system is on {device}")


class RobotSystem(System):
    """A URDF robot stepped through :mod:`backdrive.dynamics`.

    Joint damping, smoothed Coulomb friction and armature come from the model
    (``robot.damping``, ``robot.friction``, ``robot.armature``), so a model
    made with ``robot.replace(...)`` carries grad-requiring parameters into
    every step.

    Args:
        robot: the model (fixed or floating base).
        friction_width: velocity scale of the ``tanh`` friction smoothing in
            :meth:`forward_dynamics`, rad/s (m/s).
    """

    def __init__(self, robot: RobotModel, *, friction_width: float = DEFAULT_FRICTION_WIDTH):
        if not isinstance(robot, RobotModel):
            raise InputError(f"robot must be a RobotModel, got {type(robot).__name__}")
        self.robot = robot
        self.friction_width = float(friction_width)
        self.nq = robot.nq
        self.nv = robot.nv
        self.joint_names = robot.joint_names
        self.lower = robot.lower
        self.upper = robot.upper
        self.effort_limit = robot.effort_limit
        self.floating_base = robot.floating_base

    def forward_dynamics(self, q, v, tau):
        """Acceleration with the joints' damping and ``tanh``-smoothed friction
        evaluated at ``v`` (explicitly; see :mod:`backdrive.sim._implicit` for
        the simulator's implicit treatment)."""
        return forward_dynamics(self.robot, q, v, tau, friction_width=self.friction_width)

    def integrate(self, q, v, dt):
        return integrate(self.robot, q, v, dt)

    def dexp_inv(self, xi, v):
        """For a floating base, ``q = q0 exp(xi)`` in SE(3) moving at the
        base-frame twist ``v`` gives ``xi' = v + [xi, v] / 2 + [xi, [xi, v]] / 12
        + O(|xi|^4)`` (the Bernoulli series of ``dexp^-1``; its cubic term is
        zero), enough for a fourth-order Runge-Kutta step, where ``xi = O(dt)``.
        ``[., .]`` is the se(3) bracket of ``[linear; angular]`` twists."""
        if not self.floating_base:
            return v
        xb, vb = xi[..., :6], v[..., :6]
        ad1 = _se3_bracket(xb, vb)
        base = vb + 0.5 * ad1 + _se3_bracket(xb, ad1) / 12.0
        return torch.cat([base, v[..., 6:]], dim=-1)

    def __repr__(self) -> str:
        return f"RobotSystem({self.robot!r})"


def _se3_bracket(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[a, b] = ad_a b`` for twists ``[u; w]``: ``(w_a x u_b + u_a x w_b, w_a x w_b)``."""
    ua, wa = a[..., :3], a[..., 3:]
    ub, wb = b[..., :3], b[..., 3:]
    lin = torch.linalg.cross(wa, ub) + torch.linalg.cross(ua, wb)
    return torch.cat([lin, torch.linalg.cross(wa, wb)], dim=-1)


class MassSpringDamper(System):
    """A 1-D mass on a linear spring and damper, ``m a = u - k x - c v``.

    The defaults are the trajectory-optimisation demo problem: mass 1 kg,
    spring 15 N/m, damping 0.5 N s/m. Parameters may be tensors that require
    grad (0-d, or shaped to broadcast against the batch); they are fixed at
    construction (make a new system to change them).

    Args:
        mass: kg. stiffness: N/m. damping: N s/m.
        dtype, device: of the state tensors.
    """

    def __init__(self, mass=1.0, stiffness=15.0, damping=0.5, *, dtype=torch.float64, device="cpu"):
        self.nq = 1
        self.nv = 1
        self.joint_names = ("x",)
        device = torch.device(device)
        self.lower = torch.full((1,), -math.inf, dtype=dtype, device=device)
        self.upper = torch.full((1,), math.inf, dtype=dtype, device=device)
        self.effort_limit = torch.full((1,), math.inf, dtype=dtype, device=device)
        self.mass = torch.as_tensor(mass, dtype=dtype, device=device)
        self.stiffness = torch.as_tensor(stiffness, dtype=dtype, device=device)
        self.damping = torch.as_tensor(damping, dtype=dtype, device=device)
        params = (self.mass, self.stiffness, self.damping)
        # Constant scalar parameters enter as Python numbers: three autograd
        # nodes per evaluation instead of five (this system's rollouts are
        # dominated by per-operation overhead). Decided once, here.
        self._constants = (
            tuple(float(p) for p in params)
            if all(p.ndim == 0 and not p.requires_grad for p in params)
            else None
        )

    def forward_dynamics(self, q, v, tau):
        if self._constants is not None:
            m, k, c = self._constants
            return torch.add(torch.add(tau, q, alpha=-k), v, alpha=-c) / m
        return (tau - self.stiffness * q - self.damping * v) / self.mass

    def integrate(self, q, v, dt):
        if isinstance(dt, float):
            return torch.add(q, v, alpha=dt)
        return q + v * dt

    def energy(self, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Kinetic plus spring energy ``(...,)``, J."""
        return 0.5 * self.mass * v[..., 0] ** 2 + 0.5 * self.stiffness * q[..., 0] ** 2

    def __repr__(self) -> str:
        return (
            f"MassSpringDamper(mass={float(self.mass):g}, stiffness={float(self.stiffness):g}, "
            f"damping={float(self.damping):g})"
        )


def as_system(system) -> System:
    """A :class:`System` for a :class:`~backdrive.RobotModel` or a system."""
    if isinstance(system, System):
        return system
    if isinstance(system, RobotModel):
        return RobotSystem(system)
    raise InputError(
        f"expected a RobotModel or a backdrive.sim.System, got {type(system).__name__}"
    )

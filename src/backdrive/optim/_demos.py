"""Small, self-contained optimisation problems for the ``backdrive demo`` command,
the examples and the tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..sim import MassSpringDamper, Simulator, SoftJointLimits, State, TorqueActuator
from ._costs import frame_position_error, joint_limit_violation, residual_vector
from ._solvers import SolverOptions
from ._trajopt import TrajectoryOptimizationResult, optimize_trajectory

__all__ = [
    "mass_spring_damper_problem",
    "demo_mass_spring_damper",
    "MassSpringDamperDemo",
    "cartpole_swingup",
    "CartpoleSwingup",
    "panda_min_torque_reach",
    "PandaReach",
]


def mass_spring_damper_problem(dtype: torch.dtype = torch.float64):
    """The demo problem: ``(simulator, state0, cost, horizon)``.

    A 1-D mass-spring-damper (mass 1 kg, spring 15 N/m, damping 0.5 N s/m),
    dt 0.01 s, semi-implicit Euler (velocity first, then position), starting at
    position 1 m at rest, 50 force inputs; the loss is the sum over the 50
    steps of the squared position after each step. The cost returns those 50
    positions as residuals.
    """
    sim = Simulator(MassSpringDamper(dtype=dtype), 0.01, integrator="semi_implicit")
    state0 = State(torch.ones(1, dtype=dtype), torch.zeros(1, dtype=dtype))

    def cost(traj, controls):
        return traj.q[..., 1:, 0]

    return sim, state0, cost, 50


@dataclass
class MassSpringDamperDemo:
    """Result of :func:`demo_mass_spring_damper`.

    Attributes:
        adam: plain Adam (learning rate 0.1) from zero forces.
        lbfgs: L-BFGS with a strong-Wolfe line search.
        gauss_newton: Levenberg-Marquardt on the 50 position residuals.
    """

    adam: TrajectoryOptimizationResult
    lbfgs: TrajectoryOptimizationResult
    gauss_newton: TrajectoryOptimizationResult

    def summary(self) -> str:
        a = self.adam
        marks = ", ".join(f"{a.losses[k]:.4f}" for k in range(0, min(len(a.losses), 100), 20))
        return "\n".join(
            [
                "mass-spring-damper, 50 forces, loss = sum of squared positions",
                f"  Adam lr 0.1, {a.iterations} epochs: losses at epochs 0, 20, ...: {marks}; "
                f"final {a.loss:.4f} ({a.wall_time:.2f} s)",
                f"  L-BFGS (strong Wolfe): loss {self.lbfgs.loss:.4g} after {self.lbfgs.iterations} "
                f"iterations ({self.lbfgs.evaluations} rollouts, {self.lbfgs.wall_time:.2f} s)",
                f"  Gauss-Newton (Levenberg-Marquardt): loss {self.gauss_newton.loss:.3g} after "
                f"{self.gauss_newton.iterations} iterations ({self.gauss_newton.wall_time:.2f} s)",
            ]
        )


def demo_mass_spring_damper(*, epochs: int = 100, iterations: int = 100, progress: bool | None = None,
                            dtype: torch.dtype = torch.float64) -> MassSpringDamperDemo:
    """Solve the mass-spring-damper demo with Adam, L-BFGS and Gauss-Newton.

    Adam at learning rate 0.1 reproduces the reference losses 19.9717,
    18.8422, 17.9318, 17.1367, 16.4228 at epochs 0, 20, 40, 60, 80; L-BFGS
    reaches about 0.06 in 100 iterations and Gauss-Newton about 1e-18.
    """
    sim, state0, cost, horizon = mass_spring_damper_problem(dtype)
    runs = {}
    for options in (
        SolverOptions("adam", iterations=epochs, lr=0.1, progress=progress),
        SolverOptions("lbfgs", iterations=iterations, progress=progress),
        SolverOptions("gauss_newton", iterations=30, progress=progress),
    ):
        runs[options.method] = optimize_trajectory(sim, state0, cost, horizon, options=options)
    return MassSpringDamperDemo(**runs)


# ---------------------------------------------------------------------- cart-pole


@dataclass
class CartpoleSwingup:
    """Result of :func:`cartpole_swingup`.

    Attributes:
        result: the optimisation result (controls, trajectory, losses).
        simulator: the simulator used.
        final_angle: pole angle at the end, rad from upright (wrapped to [-pi, pi]).
        final_speed: norm of the final generalised velocity.
        max_force: largest cart force applied, N.
        max_cart_travel: largest ``|x|`` of the cart, m.
    """

    result: TrajectoryOptimizationResult
    simulator: Simulator
    final_angle: float
    final_speed: float
    max_force: float
    max_cart_travel: float

    @property
    def success(self) -> bool:
        """Upright within 0.1 rad and nearly at rest at the end."""
        return abs(self.final_angle) < 0.1 and self.final_speed < 0.5

    def summary(self) -> str:
        r = self.result
        return (
            f"cart-pole swing-up: final angle {self.final_angle:+.4f} rad from upright, final speed "
            f"{self.final_speed:.3g}, max force {self.max_force:.2f} N, max cart travel "
            f"{self.max_cart_travel:.2f} m; loss {r.losses[0]:.4g} -> {r.loss:.4g} in {r.iterations} "
            f"iterations ({r.wall_time:.1f} s, {r.optimizer})"
        )


def cartpole_swingup(*, quick: bool = False, optimizer: str = "gauss_newton", iterations: int | None = None,
                     progress: bool | None = None, robot=None) -> CartpoleSwingup:
    """Swing the shipped cart-pole from hanging to upright by trajectory optimisation.

    Only the cart is pushed (``|F| < 10 N`` by smooth saturation); the track
    limits (``|x| <= 2.4 m``) are soft spring-dampers. The horizon is 2.5 s
    (50 steps of 0.05 s, semi-implicit Euler). The residuals ask for the pole
    upright and the cart centred and at rest at the end, with small forces and
    small cart excursions along the way.

    Args:
        quick: fewer iterations (for ``backdrive demo``); the swing-up may be
            less precise.
        optimizer: ``"gauss_newton"`` (default), ``"lbfgs"`` or ``"adam"``.
        iterations: override the iteration count.
        robot: a cart-pole model (default: the shipped ``"cartpole"``).
    """
    if robot is None:
        from ..data import load

        robot = load("cartpole")
    dt, horizon = 0.05, 50
    sim = Simulator(
        robot, dt, actuator=TorqueActuator(joints=["slider"]), limits=SoftJointLimits(stiffness=200.0, damping=5.0)
    )
    dtype = robot.dtype
    state0 = sim.initial_state(torch.tensor([0.0, math.pi], dtype=dtype))

    def cost(traj, controls):
        q, v = traj.q, traj.v
        return torch.cat(
            [
                10.0 * q[..., -1, :],  # pole upright (angle 0), cart at the centre
                3.0 * v[..., -1, :],  # at rest
                0.02 * controls.reshape(-1),  # small forces (before saturation)
                0.3 * q[..., 1:, 0],  # small cart excursions
            ]
        )

    if iterations is None:
        iterations = (12 if quick else 25) if optimizer == "gauss_newton" else (40 if quick else 200)
    res = optimize_trajectory(sim, state0, cost, horizon,
                              options=SolverOptions(optimizer, iterations=iterations, progress=progress))
    traj = res.trajectory
    angle = math.remainder(float(traj.q[..., -1, 1]), 2 * math.pi)
    return CartpoleSwingup(
        result=res,
        simulator=sim,
        final_angle=angle,
        final_speed=float(traj.v[..., -1, :].norm()),
        max_force=float(traj.effort.abs().max()),
        max_cart_travel=float(traj.q[..., 0].abs().max()),
    )


# ---------------------------------------------------------------------- Panda


@dataclass
class PandaReach:
    """Result of :func:`panda_min_torque_reach`.

    Attributes:
        result: the optimisation result.
        simulator: the simulator used.
        target: ``(3,)`` target of the hand's tool frame, m.
        position_error: distance of the tool frame from the target at the end, m.
        final_speed: norm of the final joint velocity, rad/s.
        torque_rms: root mean square joint torque over the motion, N m.
        hold_torque_rms: the same for just holding the start pose (gravity).
        limit_violation: largest excursion beyond a joint limit, rad (0 if none).
    """

    result: TrajectoryOptimizationResult
    simulator: Simulator
    target: torch.Tensor
    position_error: float
    final_speed: float
    torque_rms: float
    hold_torque_rms: float
    limit_violation: float

    def summary(self) -> str:
        r = self.result
        return (
            f"Panda reach: tool frame {1000 * self.position_error:.1f} mm from the target, final joint speed "
            f"{self.final_speed:.3f} rad/s, torque rms {self.torque_rms:.2f} N m (holding the start pose: "
            f"{self.hold_torque_rms:.2f}), joint-limit excursion {self.limit_violation:.1e} rad; loss "
            f"{r.losses[0]:.4g} -> {r.loss:.4g} in {r.iterations} iterations ({r.wall_time:.1f} s, {r.optimizer})"
        )


PANDA_READY = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785, 0.02)


def panda_min_torque_reach(*, quick: bool = False, offset=(0.15, 0.25, -0.15), duration: float = 1.0,
                           steps: int = 25, optimizer: str = "gauss_newton", iterations: int | None = None,
                           progress: bool | None = None, robot=None) -> PandaReach:
    """Move the Panda's tool frame to a target and stop there, with small torques, under gravity.

    Torque control of every joint (semi-implicit Euler, ``steps`` steps over
    ``duration`` s), starting at rest in the "ready" pose from gravity-
    compensating torques. Residuals: the tool frame's final position error
    (weight 10 per m), the final joint velocities (weight 1), every torque
    (weight 0.01 per N m) and any excursion beyond 2 cm/rad inside the joint
    limits (weight 30).

    Args:
        quick: fewer iterations (the reach is less precise).
        offset: target relative to the start position of ``panda_hand_tcp``, m.
        robot: a Panda model (default: the shipped ``"panda"``).
    """
    from ..dynamics import gravity_forces

    if robot is None:
        from ..data import load

        robot = load("panda")
    dtype = robot.dtype
    sim = Simulator(robot, duration / steps)
    q0 = torch.tensor(PANDA_READY, dtype=dtype, device=robot.device)
    state0 = sim.initial_state(q0)
    hold = gravity_forces(robot, q0)
    tcp = "panda_hand_tcp"
    target = frame_position_error(robot, q0, tcp, torch.zeros(3, dtype=dtype)) + torch.tensor(offset, dtype=dtype)

    def cost(traj, controls):
        return residual_vector(
            10.0 * frame_position_error(robot, traj.q[..., -1, :], tcp, target),
            traj.v[..., -1, :],
            0.01 * traj.effort,
            30.0 * joint_limit_violation(robot, traj.q, margin=0.02),
        )

    if iterations is None:
        iterations = (8 if quick else 20) if optimizer == "gauss_newton" else (40 if quick else 200)
    res = optimize_trajectory(sim, state0, cost, steps, controls=hold.expand(steps, -1).clone(),
                              options=SolverOptions(optimizer, iterations=iterations, progress=progress))
    traj = res.trajectory
    joints = traj.q
    excess = torch.relu(robot.lower - joints) + torch.relu(joints - robot.upper)
    return PandaReach(
        result=res,
        simulator=sim,
        target=target,
        position_error=float(frame_position_error(robot, traj.q[..., -1, :], tcp, target).norm()),
        final_speed=float(traj.v[..., -1, :].norm()),
        torque_rms=float(traj.effort.pow(2).mean().sqrt()),
        hold_torque_rms=float(hold.pow(2).mean().sqrt()),
        limit_violation=float(excess.max()),
    )

"""Named outcome metrics of a rollout: smooth scalar functions of a :class:`~backdrive.sim.Trajectory`.

Every metric keeps the trajectory's leading batch axes (a batch of rollouts
gives one value per rollout), so a report re-simulates many perturbations in
one batched rollout and scores them with one call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._errors import InputError, UnknownNameError

__all__ = ["METRICS", "make_metric"]

#: Named metrics and what they measure (``make_metric`` builds them).
METRICS = {
    "foot_slip": "slip distance of the contact points, m: sum over contacts of the integral of the smoothed "
    "slip speed, weighted by tanh(normal force / force_scale) so that only loaded contacts count",
    "final_base_height": "height of the floating base at the last state, m",
    "tracking_error": "integral of the squared joint position error to a reference, rad^2 s "
    "(reference: the PD targets by default)",
    "peak_contact_force": "smooth maximum of the normal force over contacts and steps, N "
    "(force_scale * logsumexp(f / force_scale); overestimates the max by at most force_scale * ln(T np))",
    "energy": "mechanical work of the actuators, J: integral of the smoothed |tau * qdot| over the driven joints",
    "end_effector_error": "distance of a frame from a target position at the last state, m",
}


def _smooth_abs(x: torch.Tensor, eps: float) -> torch.Tensor:
    # sqrt(x^2 + eps^2) - eps: zero at zero, |x| - eps far away, and a finite
    # gradient at x = 0 where |x| has none.
    return torch.sqrt(x * x + eps * eps) - eps


def _need_contact(name: str, traj) -> None:
    if traj.contact is None:
        raise InputError(f"metric {name!r} needs a simulator with contact (Simulator(..., contact=ContactModel(...)))")


def make_metric(name: str, sim, **options) -> Callable:
    """Build a named metric ``f(trajectory) -> (...)`` tensor for simulator ``sim``.

    Args:
        name: one of :data:`METRICS`.
        sim: the :class:`~backdrive.sim.Simulator` the trajectories come from.
        **options: per metric:
            ``foot_slip``: ``force_scale`` (N, default 1.0), ``speed_eps`` (m/s, default 1e-3);
            ``tracking_error``: ``reference`` ``(T + 1, nj)`` or ``(nj,)`` joint positions, rad
            (default: the controls of a PD actuator, compared with the states after each step);
            ``peak_contact_force``: ``force_scale`` (N, default 5.0);
            ``energy``: ``power_eps`` (W, default 1e-2);
            ``end_effector_error``: ``frame`` (name) and ``target`` ``(3,)`` world position, m.

    Returns:
        A function of a :class:`~backdrive.sim.Trajectory` with batch axes ``(...)``
        returning a ``(...)`` tensor.

    Raises:
        UnknownNameError: an unknown metric name (the message lists the valid ones).
        InputError: options that do not fit the metric or the simulator.
    """
    if name not in METRICS:
        raise UnknownNameError("metric", name, tuple(METRICS), context=f"(valid: {', '.join(METRICS)})")
    valid = {
        "foot_slip": {"force_scale", "speed_eps"},
        "final_base_height": set(),
        "tracking_error": {"reference"},
        "peak_contact_force": {"force_scale"},
        "energy": {"power_eps"},
        "end_effector_error": {"frame", "target"},
    }[name]
    unknown = set(options) - valid
    if unknown:
        raise InputError(
            f"metric {name!r} takes no option(s) {sorted(unknown)}; valid: {sorted(valid) or 'none'}"
        )
    robot = sim.robot
    from ..sim import PDActuator

    if name == "foot_slip":
        scale = float(options.get("force_scale", 1.0))
        eps = float(options.get("speed_eps", 1e-3))

        def foot_slip(traj):
            _need_contact(name, traj)
            c = traj.contact
            # sqrt(|v_t|^2 + eps^2) - eps: the slip speed with a finite gradient at zero slip
            speed = torch.sqrt((c.slip_velocity * c.slip_velocity).sum(-1) + eps * eps) - eps
            weight = torch.tanh(torch.clamp(c.normal_force, min=0.0) / scale)
            return (speed * weight).sum((-1, -2)) * traj.dt

        return foot_slip

    if name == "final_base_height":
        if robot is None or not robot.floating_base:
            raise InputError("metric 'final_base_height' needs a floating-base robot (load(..., floating_base=True))")

        def final_base_height(traj):
            return traj.q[..., -1, 2]

        return final_base_height

    if name == "tracking_error":
        ref = options.get("reference")
        if ref is None and not isinstance(sim.actuator, PDActuator):
            raise InputError("metric 'tracking_error' needs reference= (joint positions) unless the actuator is a PDActuator")
        off = sim.nq - sim.system.num_joints
        if ref is not None:
            ref = torch.as_tensor(ref, dtype=sim.dtype, device=sim.device)
            nj = sim.system.num_joints
            if ref.shape[-1] != nj or ref.ndim not in (1, 2):
                raise InputError(f"tracking_error reference must have shape (nj,) or (T + 1, nj) with nj={nj}, got {tuple(ref.shape)}")

        def tracking_error(traj):
            qj = traj.q[..., off:]
            if ref is None:
                # PD targets: step t's target against the state it leads to.
                err = qj[..., 1:, list(sim.actuated)] - traj.controls
            else:
                if ref.ndim == 2 and ref.shape[0] != traj.q.shape[-2]:
                    raise InputError(
                        f"tracking_error reference has {ref.shape[0]} rows; the trajectory has {traj.q.shape[-2]} states"
                    )
                err = qj - ref
            return (err * err).sum((-1, -2)) * traj.dt

        return tracking_error

    if name == "peak_contact_force":
        scale = float(options.get("force_scale", 5.0))

        def peak_contact_force(traj):
            _need_contact(name, traj)
            f = traj.contact.normal_force
            return scale * torch.logsumexp((f / scale).flatten(-2), dim=-1)

        return peak_contact_force

    if name == "energy":
        eps = float(options.get("power_eps", 1e-2))
        off = sim.nv - sim.system.num_joints
        idx = [off + i for i in sim.actuated]

        def energy(traj):
            # efforts of step t act at the state t velocity (backdrive.sim)
            power = traj.effort * traj.v[..., :-1, idx]
            return _smooth_abs(power, eps).sum((-1, -2)) * traj.dt

        return energy

    # end_effector_error
    if robot is None:
        raise InputError("metric 'end_effector_error' needs a robot")
    frame, target = options.get("frame"), options.get("target")
    if frame is None or target is None:
        raise InputError("metric 'end_effector_error' needs frame= (a frame name) and target= (3,) world position, m")
    fi = robot.frame_index(frame)
    target = torch.as_tensor(target, dtype=sim.dtype, device=sim.device)
    if target.shape != (3,):
        raise InputError(f"end_effector_error target must have shape (3,), got {tuple(target.shape)}")
    from ..kinematics import forward_kinematics

    def end_effector_error(traj):
        p = forward_kinematics(robot, traj.q[..., -1, :])[..., fi, :3, 3]
        d = p - target
        return torch.sqrt((d * d).sum(-1) + 1e-12)

    return end_effector_error

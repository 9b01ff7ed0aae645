"""The ``.npz`` trajectory format read by ``backdrive sensitivity`` (and written by :func:`save_trajectory`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from .._errors import InputError

__all__ = ["TRAJECTORY_KEYS", "save_trajectory", "load_trajectory", "read_npz"]

#: Keys of the trajectory archive: required ones first, then optional ones.
TRAJECTORY_KEYS = {
    "q": "(T + 1, nq) configurations, required (row 0 is the initial state; the rest is the record)",
    "v": "(T + 1, nv) velocities, required",
    "controls": "(T, nu) commands, required: PD targets (rad) or torques (N m)",
    "dt": "() step length in seconds, required",
    "floating_base": "() bool, optional; default: true when nq is the robot's joints + 7",
    "actuator": "() str 'pd' or 'torque', optional; default 'pd' when kp is given, else 'torque'",
    "kp": "() or (nu,) PD stiffness, N m/rad (default 200 with actuator 'pd')",
    "kd": "() or (nu,) PD damping, N m s/rad (default 6 with actuator 'pd')",
    "joints": "(nu,) str, driven joint names, optional (default: all joints)",
    "contact_links": "(k,) str, links whose URDF collision shapes touch the ground; optional "
    "(default: links ending in '_foot' of a floating-base robot; an empty array: no contact)",
    "contact_stiffness": "() N/m, optional (default 4e4)",
    "contact_damping": "() N s/m, optional (default 1e4)",
    "contact_friction": "() Coulomb coefficient, optional (default 0.75)",
    "reference": "(T + 1, nj) joint positions for the tracking_error metric, optional",
}
_REQUIRED = ("q", "v", "controls", "dt")


def save_trajectory(path, sim, traj, **extras) -> Path:
    """Write a rollout of ``sim`` (a :class:`~backdrive.sim.Trajectory` without batch axes) as ``.npz``.

    The simulator's actuator (PD gains), driven joints, contact links and
    contact parameters (when they are plain numbers) are stored so that
    :func:`load_trajectory` rebuilds the same simulator. ``extras`` are added
    as arrays (e.g. ``reference=...``).
    """
    from ..sim import PDActuator

    if traj.q.ndim != 2:
        raise InputError(f"save_trajectory takes one rollout (q of shape (T + 1, nq)), got {tuple(traj.q.shape)}")
    d = {
        "q": traj.q.detach().cpu().numpy(), "v": traj.v.detach().cpu().numpy(),
        "controls": traj.controls.detach().cpu().numpy(), "dt": np.float64(traj.dt),
        "floating_base": np.bool_(bool(sim.robot is not None and sim.robot.floating_base)),
        "joints": np.array([sim.system.joint_names[i] for i in sim.actuated]),
    }
    if isinstance(sim.actuator, PDActuator):
        d["actuator"] = np.array("pd")
        d["kp"] = np.asarray(torch.as_tensor(sim.actuator.kp).detach().cpu().numpy(), dtype=np.float64)
        d["kd"] = np.asarray(torch.as_tensor(sim.actuator.kd).detach().cpu().numpy(), dtype=np.float64)
    else:
        d["actuator"] = np.array("torque")
    if sim.contact is not None:
        d["contact_links"] = np.array(sorted(set(sim.contact.geometry.shape_links)))
        p = sim.contact.params
        for key in ("stiffness", "damping", "friction"):
            val = getattr(p, key)
            if isinstance(val, (int, float)) or isinstance(val, torch.Tensor) and val.numel() == 1:
                d[f"contact_{key}"] = np.float64(float(val))
    else:
        d["contact_links"] = np.array([], dtype=str)
    for k, x in extras.items():
        d[k] = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **d)
    return out if out.suffix == ".npz" else out.with_name(out.name + ".npz")


def read_npz(path) -> dict:
    """The arrays of a trajectory archive, with the required keys checked."""
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise InputError(f"trajectory file not found: {str(path)!r}") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read trajectory {str(path)!r} as a .npz archive: {exc}") from None
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise InputError(
            f"trajectory {str(path)!r} lacks {', '.join(map(repr, missing))}; it holds "
            f"{', '.join(map(repr, data)) or 'nothing'} (format: docs/analysis.md)"
        )
    for k in ("q", "v", "controls", "dt"):
        a = data[k]
        if not np.issubdtype(a.dtype, np.number):
            raise InputError(f"trajectory key {k!r} must hold numbers, got dtype {a.dtype}")
        if not np.isfinite(a).all():
            raise InputError(f"trajectory key {k!r} holds NaN or inf")
    return data


def load_trajectory(path, robot):
    """Rebuild the simulator, initial state and controls of a trajectory archive.

    Args:
        path: ``.npz`` file in the format of :data:`TRAJECTORY_KEYS`.
        robot: the :class:`~backdrive.RobotModel` (floating base or not, as the archive's ``q`` needs).

    Returns:
        ``(sim, state0, controls (T, nu), data)`` where ``data`` holds the raw arrays.

    Raises:
        InputError: a missing key, a wrong shape, NaN, an unknown actuator or joint name.
    """
    from ..contact import ContactGeometry, ContactModel, ContactParameters
    from ..sim import PDActuator, Simulator, State, TorqueActuator

    data = read_npz(path)
    q, v, u, dt = data["q"], data["v"], data["controls"], float(data["dt"])
    if q.ndim != 2 or q.shape[1] != robot.nq:
        raise InputError(f"trajectory 'q' must have shape (T + 1, {robot.nq}) for robot {robot.name!r}, got {q.shape}")
    if v.ndim != 2 or v.shape[1] != robot.nv:
        raise InputError(f"trajectory 'v' must have shape (T + 1, {robot.nv}), got {v.shape}")
    if u.ndim != 2 or u.shape[0] < 1:
        raise InputError(f"trajectory 'controls' must have shape (T, nu) with T >= 1, got {u.shape}")
    if q.shape[0] != u.shape[0] + 1 or v.shape[0] != q.shape[0]:
        raise InputError(
            f"trajectory lengths do not match: q has {q.shape[0]} rows, v {v.shape[0]}, controls {u.shape[0]} "
            "(need T + 1, T + 1, T)"
        )
    if not (math.isfinite(dt) and dt > 0):
        raise InputError(f"trajectory 'dt' must be a positive number of seconds, got {dt}")
    joints = [str(j) for j in data["joints"].tolist()] if "joints" in data else None
    for j in joints or ():
        robot.joint_index(j)  # UnknownNameError naming the valid joints
    kind = str(data["actuator"]) if "actuator" in data else ("pd" if "kp" in data else "torque")
    if kind == "pd":
        kp = torch.as_tensor(data.get("kp", 200.0), dtype=robot.dtype)
        kd = torch.as_tensor(data.get("kd", 6.0), dtype=robot.dtype)
        actuator = PDActuator(kp=kp, kd=kd, joints=joints)
    elif kind == "torque":
        actuator = TorqueActuator(joints=joints)
    else:
        raise InputError(f"trajectory 'actuator' must be 'pd' or 'torque', got {kind!r}")
    if "contact_links" in data:
        links = [str(x) for x in data["contact_links"].tolist()]
    else:
        links = [n for n in robot.link_names if n.endswith("_foot")] if robot.floating_base else []
    contact = None
    if links:
        for n in links:
            robot.frame_index(n)  # UnknownNameError naming the valid links
        params = ContactParameters(
            stiffness=float(data.get("contact_stiffness", 4.0e4)),
            damping=float(data.get("contact_damping", 1.0e4)),
            friction=float(data.get("contact_friction", 0.75)),
        )
        contact = ContactModel(robot, ContactGeometry.from_model(robot, links=links), params=params)
    sim = Simulator(robot, dt, actuator=actuator, contact=contact)
    if u.shape[1] != sim.nu:
        raise InputError(f"trajectory 'controls' has {u.shape[1]} columns; the simulator drives {sim.nu} joints")
    t = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=robot.dtype, device=robot.device)  # noqa: E731
    return sim, State(t(q[0]), t(v[0])), t(u), data

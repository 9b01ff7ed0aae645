"""Gradient of a 100-step Panda rollout: backdrive autograd against MuJoCo finite differences.

What is measured
----------------
One open-loop rollout of the shipped Panda (``backdrive.data.get_data_path("panda")``)
under joint torques ``u_0 .. u_{T-1}`` (T = 100 steps, ``dt`` = 0.01 s, so 1 s
of motion), and the Jacobian of the final state ``x_T = (q_T, v_T)`` (all 14
components) with respect to all ``T x 7`` controls (700 numbers): the full
``14 x 700`` Jacobian, in float64.

* **backdrive, autograd**: the rollout is run as a batch of 14 identical
  copies, each with its own copy of the controls, and one backward pass of
  ``sum_i x_T[i, i]`` gives row ``i`` of the Jacobian in copy ``i``'s
  controls (batched reverse mode: one forward and one backward pass of a
  batch of 14). Also timed: one rollout with one backward pass, which gives
  the gradient of one scalar (a fixed random projection ``w . x_T``).
* **MuJoCo, central finite differences**: ``x_T(u + eps e_k) - x_T(u - eps e_k)``
  over ``2 eps`` for each of the 700 controls, i.e. 1400 rollouts of 100 steps,
  run by ``mujoco.rollout`` (MuJoCo's C rollout loop, one thread) in one call
  (a plain Python loop of ``mj_step`` if ``mujoco.rollout`` is missing).
* **MuJoCo, chained one-step derivatives** (for reference): MuJoCo's own
  ``mjd_transitionFD`` (centred) at each of the 100 states of the nominal
  rollout gives ``A_t = dx_{t+1}/dx_t`` and ``B_t = dx_{t+1}/du_t``, chained
  as ``dx_T/du_t = A_{T-1} ... A_{t+1} B_t``.

Agreement is reported against the MuJoCo finite-difference Jacobian ``J_fd``:
normwise ``|J - J_fd|_F / |J_fd|_F``, one minus the cosine similarity of the
flattened Jacobians, and the max and median entrywise relative error
``|J_ij - J_fd_ij| / |J_fd_ij|`` over the entries with ``|J_fd_ij|`` above
``1e-6 max |J_fd|`` (smaller entries are at the finite differences' noise
floor). Before that, the two rollouts themselves are compared (max absolute
difference of ``q`` and ``v`` over all 101 states).

The same physics in both
------------------------
The MuJoCo model is compiled from the same URDF text as the backdrive model:

* the finger joints are made ``fixed`` in both (MuJoCo turns the URDF
  ``<mimic>`` into a soft equality constraint, which backdrive does not
  have), so both have the 7 arm joints, in the same order (checked by name);
  visual and collision elements are removed (not needed: no contact);
* joint damping 0.5 N m s/rad and armature 0.05 kg m^2 on every joint in both
  (``RobotModel.replace`` and ``dof_damping`` / ``dof_armature``), no
  Coulomb friction; gravity ``(0, 0, -9.81)``;
* integrator: backdrive ``"semi_implicit"`` (velocity first, then position)
  and MuJoCo ``"Euler"``, which is the same update once its implicit
  treatment of joint damping is switched off (``mjDSBL_EULERDAMP``; left on,
  the two rollouts differ by 0.04 rad and 0.3 rad/s after the 100 steps);
* no contacts (``mjDSBL_CONTACT``), no joint-limit constraints in either
  (``mjDSBL_LIMIT``; backdrive's simulator has soft limits off by default);
* actuators: one MuJoCo ``motor`` per joint, gear 1, no control range;
  backdrive ``TorqueActuator(effort_limit=inf)`` (no saturation).

The controls are the torques under which the semi-implicit rollout follows a
smooth reference motion (the start pose plus a sum of sines per joint, up to
about 0.3 rad): without them, an open-loop arm under gravity falls away.

Timing: CPU time of this process (``time.process_time``) for both engines,
minimum over repeats, with torch on one thread; MuJoCo's rollout also runs on
the calling thread, so the two are comparable on a shared machine. Quote
ratios from one run; absolute times depend on the machine and its load.

    python benchmarks/rollout_gradient.py            # under a minute
    python benchmarks/rollout_gradient.py --quick    # one repeat
"""

from __future__ import annotations

import argparse
import math
import platform
import time
import xml.etree.ElementTree as ET

import numpy as np
import torch

from backdrive import RobotModel
from backdrive.data import get_data_path
from backdrive.dynamics import inverse_dynamics, joint_forces
from backdrive.sim import Simulator, State, TorqueActuator

CLOCK = time.process_time
F64 = torch.float64

DAMPING = 0.5  # N m s / rad, every joint, both engines
ARMATURE = 0.05  # kg m^2, every joint, both engines
FD_EPS = 1e-4  # N m, central-difference step on each control (best of 1e-7 .. 1e-2 here)


# ----------------------------------------------------------------------------- models


def rigid_finger_urdf(name: str = "panda") -> str:
    """The shipped URDF as text with every joint that is a mimic joint or the
    leader of one made ``fixed``, and no visual or collision geometry."""
    root = ET.parse(get_data_path(name)).getroot()
    joints = root.findall("joint")
    leaders = {m.get("joint") for j in joints for m in j.findall("mimic")}
    for j in joints:
        if j.find("mimic") is not None or j.get("name") in leaders:
            j.set("type", "fixed")
            for tag in ("mimic", "limit", "axis", "dynamics"):
                for e in j.findall(tag):
                    j.remove(e)
    for link in root.findall("link"):
        for tag in ("visual", "collision"):
            for e in link.findall(tag):
                link.remove(e)
    return ET.tostring(root, encoding="unicode")


def build_backdrive(urdf: str, dt: float, damping: float = DAMPING, armature: float = ARMATURE):
    """``(robot, simulator)``: float64, semi-implicit Euler, unsaturated torque control of every joint."""
    robot = RobotModel.from_urdf(urdf, dtype=F64)
    robot = robot.replace(
        damping=torch.full((robot.num_joints,), damping, dtype=F64),
        armature=torch.full((robot.num_joints,), armature, dtype=F64),
        friction=torch.zeros(robot.num_joints, dtype=F64),
    )
    # Explicit damping, to match MuJoCo with mjDSBL_EULERDAMP (the default is implicit).
    sim = Simulator(robot, dt, integrator="semi_implicit", actuator=TorqueActuator(effort_limit=math.inf),
                    joint_forces="explicit")
    return robot, sim


def build_mujoco(urdf: str, dt: float, joint_names, damping: float = DAMPING, armature: float = ARMATURE):
    """A ``mujoco.MjModel`` of the same URDF with the physics of :func:`build_backdrive`.

    ``joint_names`` (backdrive's order) get one motor each, in that order;
    ``qpos``/``qvel`` follow the same order (checked).
    """
    import mujoco

    spec = mujoco.MjSpec.from_string(urdf)
    for name in joint_names:
        act = spec.add_actuator(name=f"motor_{name}", target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.set_to_motor()
        act.gear[0] = 1.0
        act.ctrllimited = mujoco.mjtLimited.mjLIMITED_FALSE
    model = spec.compile()
    model.opt.timestep = dt
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    model.opt.gravity[:] = (0.0, 0.0, -9.81)
    model.opt.disableflags |= (
        mujoco.mjtDisableBit.mjDSBL_CONTACT | mujoco.mjtDisableBit.mjDSBL_LIMIT
        | mujoco.mjtDisableBit.mjDSBL_EULERDAMP
    )
    model.dof_damping[:] = damping
    model.dof_armature[:] = armature
    model.dof_frictionloss[:] = 0.0
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, i) for i in range(model.njnt)]
    if names != list(joint_names) or model.nq != model.nv or model.nv != len(joint_names) or model.neq:
        raise RuntimeError(f"MuJoCo joints {names} (nq {model.nq}, neq {model.neq}) do not match {list(joint_names)}")
    return model


def build_pair(dt: float = 0.01, damping: float = DAMPING, armature: float = ARMATURE):
    """``(robot, simulator, mujoco_model)`` of the Panda with rigid fingers."""
    urdf = rigid_finger_urdf("panda")
    robot, sim = build_backdrive(urdf, dt, damping, armature)
    model = build_mujoco(urdf, dt, robot.joint_names, damping, armature)
    return robot, sim, model


def scenario(robot, steps: int, dt: float, seed: int = 0):
    """Start state ``(q0, v0)`` and controls ``(steps, nv)`` that make the
    semi-implicit rollout follow a reference motion: the start pose plus three
    sines per joint (0.3 to 1.5 Hz, up to ~0.3 rad).

    With ``v_{t+1} = (q_{t+1} - q_t) / dt`` and ``a_t = (v_{t+1} - v_t) / dt``
    from the reference, ``u_t = ID(q_t, v_t, a_t) - joint_forces(v_t)`` (inverse
    dynamics plus the torque that cancels the joint damping) is exactly the
    torque under which one semi-implicit step goes from ``(q_t, v_t)`` to
    ``(q_{t+1}, v_{t+1})``. Open loop, the arm stays on the reference up to the
    growth of rounding errors.
    """
    g = torch.Generator().manual_seed(seed)
    n = robot.nv
    start = torch.tensor([0.0, -0.3, 0.0, -2.0, 0.0, 1.8, 0.8], dtype=F64)[:n]
    amp = torch.tensor([0.3, 0.3, 0.3, 0.3, 0.4, 0.4, 0.5], dtype=F64)[:n]
    t = torch.arange(steps + 2, dtype=F64) * dt
    freq = 0.3 + 1.2 * torch.rand(3, 1, n, generator=g, dtype=F64)
    phase = 2 * math.pi * torch.rand(3, 1, n, generator=g, dtype=F64)
    q_ref = start + amp * torch.sin(2 * math.pi * freq * t[:, None] + phase).mean(0)  # (T + 2, n)
    # v_ref[t] = (q_t - q_{t-1}) / dt for t >= 1; v_ref[0] = v_ref[1].
    v_ref = torch.cat([(q_ref[1:2] - q_ref[:1]) / dt, (q_ref[1:] - q_ref[:-1]) / dt])
    a_ref = (v_ref[1:] - v_ref[:-1]) / dt
    qs, vs, a_ = q_ref[:steps], v_ref[:steps], a_ref[:steps]
    u = inverse_dynamics(robot, qs, vs, a_) - joint_forces(robot, vs)
    return q_ref[0], v_ref[0], u


# ----------------------------------------------------------------------------- MuJoCo side


def mujoco_rollout(model, q0: np.ndarray, v0: np.ndarray, controls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``q, v (..., T + 1, nv)`` for controls ``(..., T, nu)`` (leading axes batch).

    Uses ``mujoco.rollout`` (one thread) when available, else ``mj_step``.
    """
    import mujoco

    batch = controls.shape[:-2]
    U = controls.reshape(-1, *controls.shape[-2:])
    nb, T, _ = U.shape
    nq, nv = model.nq, model.nv
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:] = q0, v0
    try:
        from mujoco import rollout as mj_rollout
    except ImportError:  # pragma: no cover - old MuJoCo
        mj_rollout = None
    if mj_rollout is not None:
        spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
        x0 = np.empty(mujoco.mj_stateSize(model, spec))
        mujoco.mj_getState(model, data, x0, spec)
        states, _ = mj_rollout.rollout(model, data, np.tile(x0, (nb, 1)), U)
        # FULLPHYSICS starts with time, then qpos, then qvel.
        q = np.concatenate([np.tile(q0, (nb, 1, 1)), states[:, :, 1 : 1 + nq]], 1)
        v = np.concatenate([np.tile(v0, (nb, 1, 1)), states[:, :, 1 + nq : 1 + nq + nv]], 1)
    else:
        q = np.empty((nb, T + 1, nq))
        v = np.empty((nb, T + 1, nv))
        for b in range(nb):
            mujoco.mj_resetData(model, data)
            data.qpos[:], data.qvel[:] = q0, v0
            q[b, 0], v[b, 0] = q0, v0
            for t in range(T):
                data.ctrl[:] = U[b, t]
                mujoco.mj_step(model, data)
                q[b, t + 1], v[b, t + 1] = data.qpos, data.qvel
    return q.reshape(*batch, T + 1, nq), v.reshape(*batch, T + 1, nv)


def mujoco_fd_jacobian(model, q0, v0, u: np.ndarray, idx=None, eps: float = FD_EPS):
    """Central finite differences of ``x_T = (q_T, v_T)`` with respect to the
    controls ``u (T, nu)`` (or only the flat entries ``idx``): ``(2 nv, len(idx))``
    and the number of rollouts used."""
    T, nu = u.shape
    idx = np.arange(T * nu) if idx is None else np.asarray(idx)
    k = len(idx)
    U = np.tile(u.reshape(-1), (2 * k, 1))
    U[np.arange(k), idx] += eps
    U[k + np.arange(k), idx] -= eps
    q, v = mujoco_rollout(model, q0, v0, U.reshape(2 * k, T, nu))
    x = np.concatenate([q[:, -1], v[:, -1]], -1)  # (2k, 2 nv)
    return ((x[:k] - x[k:]) / (2 * eps)).T, 2 * k


def mujoco_chained_jacobian(model, q0, v0, u: np.ndarray, eps: float = 1e-5):
    """``dx_T / du (2 nv, T * nu)`` from MuJoCo's one-step ``mjd_transitionFD``
    along the nominal rollout, chained backwards."""
    import mujoco

    T, nu = u.shape
    n = 2 * model.nv
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:] = q0, v0
    A = np.zeros((T, n, n))
    B = np.zeros((T, n, nu))
    for t in range(T):
        data.ctrl[:] = u[t]
        mujoco.mjd_transitionFD(model, data, eps, True, A[t], B[t], None, None)
        mujoco.mj_step(model, data)
    J = np.zeros((n, T, nu))
    P = np.eye(n)
    for t in range(T - 1, -1, -1):
        J[:, t] = P @ B[t]
        P = P @ A[t]
    return J.reshape(n, T * nu)


# ----------------------------------------------------------------------------- backdrive side


def backdrive_rollout(sim, q0, v0, u):
    traj = sim.rollout(State(q0, v0), u)
    return traj.q, traj.v


def backdrive_jacobian(sim, q0, v0, u: torch.Tensor) -> torch.Tensor:
    """``dx_T / du (2 nv, T * nu)`` by batched reverse mode: a batch of
    ``2 nv`` copies of the rollout, one backward pass."""
    n = 2 * sim.nv
    U = u.detach().expand(n, *u.shape).clone().requires_grad_(True)
    traj = sim.rollout(State(q0.expand(n, -1), v0.expand(n, -1)), U)
    x = torch.cat([traj.q[:, -1], traj.v[:, -1]], -1)  # (n, n)
    x.diagonal().sum().backward()
    return U.grad.reshape(n, -1)


def backdrive_projected_gradient(sim, q0, v0, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``d (w . x_T) / du (T * nu,)``: one rollout, one backward pass."""
    U = u.detach().clone().requires_grad_(True)
    traj = sim.rollout(State(q0, v0), U)
    x = torch.cat([traj.q[-1], traj.v[-1]])
    (w @ x).backward()
    return U.grad.reshape(-1)


# ----------------------------------------------------------------------------- comparison


def agreement(J: np.ndarray, J_ref: np.ndarray, floor: float = 1e-6) -> dict:
    """Normwise and entrywise relative errors and cosine similarity of ``J`` against ``J_ref``."""
    J, J_ref = np.asarray(J, dtype=np.float64), np.asarray(J_ref, dtype=np.float64)
    diff = J - J_ref
    big = np.abs(J_ref) > floor * np.abs(J_ref).max()
    rel = np.abs(diff[big]) / np.abs(J_ref[big])
    a, b = J.reshape(-1), J_ref.reshape(-1)
    return {
        "normwise": float(np.linalg.norm(diff) / np.linalg.norm(J_ref)),
        "max_rel": float(rel.max()),
        "median_rel": float(np.median(rel)),
        "cosine": float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))),
        "entries": int(big.sum()),
    }


def timed(fn, repeats: int):
    best, out = math.inf, None
    for _ in range(repeats):
        t0 = CLOCK()
        out = fn()
        best = min(best, CLOCK() - t0)
    return best, out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one repeat instead of three")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--dt", type=float, default=0.01)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    repeats = 1 if args.quick else 3
    import mujoco

    robot, sim, model = build_pair(args.dt)
    q0, v0, u = scenario(robot, args.steps, args.dt)
    T, nu, nx = args.steps, sim.nu, 2 * sim.nv
    qn, vn, un = q0.numpy(), v0.numpy(), u.numpy()

    # 1. The rollouts themselves.
    qb, vb = backdrive_rollout(sim, q0, v0, u)
    qm, vm = mujoco_rollout(model, qn, vn, un)
    dq = float(np.abs(qb.numpy() - qm).max())
    dv = float(np.abs(vb.numpy() - vm).max())
    travel = float((qb[-1] - qb[0]).abs().max())

    # 2. Jacobians.
    t_bd, J_bd = timed(lambda: backdrive_jacobian(sim, q0, v0, u).numpy(), repeats)
    w = torch.randn(nx, generator=torch.Generator().manual_seed(1), dtype=F64)
    t_proj, g_bd = timed(lambda: backdrive_projected_gradient(sim, q0, v0, u, w).numpy(), repeats)
    t_fd, (J_fd, n_roll) = timed(lambda: mujoco_fd_jacobian(model, qn, vn, un), repeats)
    t_ch, J_ch = timed(lambda: mujoco_chained_jacobian(model, qn, vn, un), repeats)
    t_fwd, _ = timed(lambda: mujoco_rollout(model, qn, vn, un), repeats)
    t_bfwd, _ = timed(lambda: backdrive_rollout(sim, q0, v0, u), repeats)

    ag_bd = agreement(J_bd, J_fd)
    ag_ch = agreement(J_ch, J_fd)
    ag_bc = agreement(J_bd, J_ch)
    g_fd = w.numpy() @ J_fd
    ag_proj = agreement(g_bd[None], g_fd[None])

    print(f"Panda (rigid fingers, nv = {sim.nv}), {T} steps of dt = {args.dt} s, semi-implicit Euler, "
          f"damping {DAMPING}, armature {ARMATURE}, float64; MuJoCo {mujoco.__version__}, "
          f"torch {torch.__version__}, {platform.machine()}, torch threads {torch.get_num_threads()}")
    print(f"CPU time (time.process_time), min of {repeats}.\n")
    print(f"Rollouts: max |q_bd - q_mj| = {dq:.2e} rad, max |v_bd - v_mj| = {dv:.2e} rad/s over all "
          f"{T + 1} states (largest joint travel {travel:.2f} rad).\n")
    print(f"Gradient of the final state x_T = (q_T, v_T) ({nx} components) with respect to all "
          f"{T} x {nu} = {T * nu} controls; reference: MuJoCo central differences (eps {FD_EPS:g} N m).\n")
    print("| method | what | rollouts | CPU time (s) | normwise rel. err | max rel. err | median rel. err "
          "| 1 - cosine |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")

    def row(name, what, rolls, t, ag):
        if ag is None:
            print(f"| {name} | {what} | {rolls} | {t:.3f} | reference | | | |")
        else:
            print(f"| {name} | {what} | {rolls} | {t:.3f} | {ag['normwise']:.1e} | {ag['max_rel']:.1e} | "
                  f"{ag['median_rel']:.1e} | {abs(1 - ag['cosine']):.0e} |")

    row("MuJoCo central differences (`mujoco.rollout`)", f"{nx} x {T * nu} Jacobian", f"{n_roll}", t_fd, None)
    row("backdrive autograd (batch of 14, 1 backward)", f"{nx} x {T * nu} Jacobian", "1 (batch 14)", t_bd, ag_bd)
    row("backdrive autograd (1 backward)", "w . x_T gradient", "1", t_proj, ag_proj)
    row("MuJoCo `mjd_transitionFD` chained", f"{nx} x {T * nu} Jacobian", f"{T} one-step FD", t_ch, ag_ch)
    print()
    print(f"backdrive vs chained MuJoCo one-step derivatives: normwise {ag_bc['normwise']:.1e}, "
          f"max rel {ag_bc['max_rel']:.1e}.")
    print(f"One forward rollout: backdrive {t_bfwd * 1e3:.1f} ms, MuJoCo {t_fwd * 1e3:.2f} ms. "
          f"Full Jacobian: MuJoCo FD / backdrive = {t_fd / t_bd:.2f}.")
    print(f"Entrywise errors over the {ag_bd['entries']} entries with |J_fd| > 1e-6 max |J_fd|.")


if __name__ == "__main__":
    main()

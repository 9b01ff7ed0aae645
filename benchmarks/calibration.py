"""Sim-to-real calibration: MuJoCo plays the real robot, backdrive calibrates itself on its recordings.

"Reality" is MuJoCo (another engine, with its own soft contact, not
backdrive's penalty law) running backdrive's shipped 12-dof quadruped from
its URDF (``--robot go1`` for example-robot-data's Go1) with parameters
backdrive is not told:

* every link mass scaled by a factor in [0.8, 1.2] (the rotational inertia
  about the centre of mass unchanged: a payload at the centre of mass);
* foot-ground friction ``mu`` in [0.4, 1.0];
* MuJoCo's own contact (``solref = (0.02, 1)``, ``solimp`` defaults);
* joint damping in [0.05, 0.3] N m s/rad per joint;
* one motor strength in [0.8, 1.0] for all motors (the PD servo's torque
  ``s (kp (q_ref - q) - kd qdot)``);
* a control delay of 1 to 3 steps (2 to 6 ms).

Both engines integrate at 2 ms (MuJoCo ``implicitfast``, servo and joint
damping implicit as in backdrive) and both are told the rotor inertia
(armature 0.01 kg m^2 per joint).

The robot is driven by random PD targets around its standing pose and
pushed every second; a fall ends a piece of the recording (the robot is put
back standing and the steps around it are not used). The recordings carry
sensor noise (encoders, IMU) and the window start states a small
state-estimator noise. backdrive starts from
the URDF, a damping guess of 0.1 N m s/rad, its default contact law
(k 4e4 N/m, d 1e4 N s/m, mu 0.75), motor strength 1 and no delay, and
calibrates with ``identify(..., method=ContactFit(...))``: by default the
contact law, the motor strength and the delay (``--params`` adds masses and
damping; docs/simulation.md explains why fitting them all from encoders and
IMU alone is ill-posed, and gives the measured result). The pushes are not
modelled, so the calibration and the evaluation use the recording between
pushes (the data are cut into segments that start 0.15 s after a push ends).

``--contact matched`` replaces MuJoCo's contact by backdrive's penalty law
(hidden stiffness 1e4-3e4 N/m and damping 100-400 N s/m): the model class is
then right, and what is left between the engines is their numerics.

Reported: multi-step prediction error (windows of ``--horizon`` steps from
recorded states on held-out recordings, RMS of the joint-angle,
base-orientation and base angular-velocity errors) of the nominal simulator,
of backdrive with every hidden parameter at its TRUE value (with the nominal
contact law; with the calibration's law when the contact law was fitted
against MuJoCo's own contact; and, with ``--floor-fit``, with the law fitted
on the same windows while every other parameter is held at its truth: the
floor, the best backdrive's law can do against this reality), and of the
calibrated simulator; each parameter against the truth with its
95 % interval and identifiability. ``--total-mass`` anchors the fitted
masses on the robot's weighed total (``ContactFit.total_mass``);
``--stage2`` runs a second fit from the first one's simulator (e.g. the
contact law, strength and delay first, then masses); ``--save`` writes the
calibrated parameters for ``benchmarks/calibration_loop.py`` (with the
truth, the last fit's 95 % intervals and the held-out errors); ``--start
truth --iterations 0`` gives the fit's loss at the true parameters (is the
objective's minimum the truth?).

Run (prints markdown tables, minutes to tens of minutes on a loaded 2-core machine):

    nice -n 10 python benchmarks/calibration.py [--seconds 20] [--seed 0]
    python benchmarks/calibration.py --no-fit --contact matched        # floors only
    python benchmarks/calibration.py --total-mass --params body_mass,contact_stiffness,contact_damping,\
        contact_friction,motor_strength --windows 24 --iterations 6 --save outputs/calibration.json
    # MuJoCo's contact model in backdrive against MuJoCo with a hidden solref (docs/simulation.md,
    # *Sim-to-real benchmark*; every session's runs in docs/calibration_history.md):
    python benchmarks/calibration.py --law soft --contact hidden --total-mass --params \
        body_mass,damping,contact_timeconst,contact_dampratio,contact_friction,motor_strength \
        --segment 50 --windows 32 --iterations 12 --horizon 100,25 [--smooth-starts 10] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _mujoco_contact as MC  # noqa: E402

from backdrive.contact import ContactGeometry, ContactModel, ContactParameters, SoftContactParameters  # noqa: E402
from backdrive.data import load  # noqa: E402
from backdrive.dynamics import difference  # noqa: E402
from backdrive.optim import ContactFit, SolverOptions, identify, smooth_states  # noqa: E402
from backdrive.sim import PDActuator, Simulator, State  # noqa: E402

F64 = torch.float64
DT = 0.002
KP, KD = 80.0, 2.0
# Sensor noise (standard deviations): encoders, encoder rates, IMU attitude, gyro.
NOISE = {"joint_position": 5e-4, "joint_velocity": 2e-2, "base_orientation": 2e-3, "base_angular_velocity": 1e-2}
# A state estimator's error on the base position and linear velocity (m, m/s).
ESTIMATOR = (2e-4, 5e-3)
# What the fit is told: the sensors' noise, and the estimator's for the base
# position and velocity (not compared; the prior of an estimated window start).
START_NOISE = {**NOISE, "base_position": ESTIMATOR[0], "base_linear_velocity": ESTIMATOR[1]}
PUSH_EVERY, PUSH_LENGTH, SETTLE = 1.0, 0.1, 0.15
# Amplitude of the random PD-target offsets per joint kind (rad) and their knot spacing (s).
# (Larger and faster targets make the robot hop; its impacts then dominate
# the mismatch between the engines.)
AMPLITUDE = {"hip": 0.08, "thigh": 0.2, "calf": 0.2}
KNOT = 0.2
# Rotor inertia of every leg joint, kg m^2: a motor datum both engines are
# told (the URDF has none, and without it MuJoCo's explicit servo damping is
# near its stability limit on the light calves at 2 ms).
ARMATURE = 0.01


def reality(robot_key: str, seed: int, contact: str = "native"):
    """The MuJoCo model with hidden parameters, and the truth.

    ``contact="native"``: MuJoCo's own soft contact (``solref (0.02, 1)``).
    ``"hidden"``: MuJoCo's own soft contact with a hidden ``solref``: time
    constant in [0.01, 0.04] s and damping ratio in [0.5, 1.5] (drawn after
    the other parameters, so the draws of ``"native"`` are shared), and the
    model's mass-dependent constants (``body_invweight0``, which sets the
    contact's regulariser) recomputed for the scaled masses by
    ``mj_setConst``, as compiling the model with those masses would.
    ``"matched"``: MuJoCo's contact set up as backdrive's penalty law
    (``_mujoco_contact.build_model(native=False)``, implicit scheme, elliptic
    cone, backdrive's stiction slope) with a hidden stiffness in [1e4, 3e4]
    N/m and damping in [100, 400] N s/m: the model class is then right and
    only the engines' numerics differ (drawn after the other parameters, so
    both settings share the masses, damping, strength, delay and friction).
    """
    rng = np.random.default_rng(seed)
    friction = float(rng.uniform(0.4, 1.0))
    model = MC.build_model(robot_key, dt=DT, native=True, kp=KP, kd=KD, friction=friction,
                           integrator="implicitfast", armature=ARMATURE)
    truth = {"mass_factor": rng.uniform(0.8, 1.2, model.nbody), "damping": rng.uniform(0.05, 0.3, model.nu),
             "strength": float(rng.uniform(0.8, 1.0)), "delay": int(rng.integers(1, 4))}
    if contact == "matched":
        truth["stiffness"], truth["contact_damping"] = float(rng.uniform(1e4, 3e4)), float(rng.uniform(100, 400))
    if contact == "hidden":
        truth["timeconst"], truth["dampratio"] = float(rng.uniform(0.01, 0.04)), float(rng.uniform(0.5, 1.5))
    truth["mass_factor"][0] = 1.0  # the world
    model.body_mass[:] = model.body_mass * truth["mass_factor"]
    if contact == "hidden":
        import mujoco

        feet = MC._foot_geoms(model, MC.ROBOTS[robot_key])
        model.geom_solref[feet] = (truth["timeconst"], truth["dampratio"])
        mujoco.mj_setConst(model, mujoco.MjData(model))
    if contact == "matched":
        # The matched law's MuJoCo impedance depends on the masses (the
        # contact rows' inverse inertia), so it is set up for the scaled ones.
        model = rematched(model, robot_key, truth["stiffness"], truth["contact_damping"], friction)
    for a in range(model.nu):
        j = model.actuator_trnid[a, 0]
        model.dof_damping[model.jnt_dofadr[j]] = truth["damping"][a]
    s = truth["strength"]
    model.actuator_gainprm[:, 0] = KP * s
    model.actuator_biasprm[:, 1] = -KP * s
    model.actuator_biasprm[:, 2] = -KD * s
    truth["friction"] = float(model.geom_friction[-1, 0])
    return model, truth


def rematched(model, robot_key: str, stiffness: float, damping: float, friction: float):
    """``model`` (masses as they are) with its feet's contact set to backdrive's
    implicit penalty law ``(stiffness, damping)``, through
    :func:`_mujoco_contact.matched_solref` as ``build_model(native=False)`` does."""
    rs = MC.ROBOTS[robot_key]
    feet = MC._foot_geoms(model, rs)
    diag, rows = MC._probe_diag_approx(model, feet)
    imp, K, B = MC.matched_solref(stiffness, damping, DT, diag, rows, "implicit")
    model.geom_solimp[feet] = np.stack([imp, imp] + [np.full_like(imp, x) for x in (0.001, 0.5, 2.0)], -1)
    model.geom_solref[feet, 0] = -K
    model.geom_solref[feet, 1] = -B
    b_imp = rows * imp / ((1.0 - imp) * diag) / DT
    width = float(ContactParameters().stiction_width)
    model.opt.impratio = friction * MC.robot_weight(model) / len(feet) / width / float(b_imp.mean())
    return model


def amplitudes(robot, amplitude: dict | None = None) -> np.ndarray:
    """``(nu,)`` PD-target offset amplitudes (rad) in ``robot``'s joint order:
    :data:`AMPLITUDE` by joint kind, with ``amplitude``'s entries in its place."""
    amp = {**AMPLITUDE, **(amplitude or {})}
    return np.array([amp[next(k for k in amp if f"_{k}_" in name)] for name in robot.joint_names])


def record(model, robot_key: str, robot, seconds: float, seed: int, delay: int, amplitude: dict | None = None):
    """Drive MuJoCo with random PD targets and pushes; return backdrive-ordered
    ``q (N+1, nq)``, ``v (N+1, nv)`` (exact), the commands ``(N, 12)``, the
    mask ``(N+1,)`` of steps not to use (pushes and falls) and the steps at
    which the robot fell.
    ``amplitude`` overrides :data:`AMPLITUDE` per joint kind (e.g.
    ``{"hip": 0.16}``).

    Only the feet collide with the floor (both engines), so a robot that tips
    over would sink through it and hang from its feet. A fall (:func:`fallen`)
    therefore ends the piece, as an operator would pick the robot up: the
    ``FALL_MARGIN`` s before it and ``FALL_MARGIN`` s after the reset are
    masked, and the robot is put back standing (2 mm above the floor, at rest,
    where it is) while the commands go on. Steps with a knee on the ground are
    masked too."""
    import mujoco

    rng = np.random.default_rng(seed)
    data = mujoco.MjData(model)
    qpos, ctrl0 = MC.standing_state(model, robot_key)
    start = MC.drop_state(model, robot_key, 0.002)[0]
    data.qpos[:] = start
    mujoco.mj_forward(model, data)
    margin = int(round(FALL_MARGIN / DT))
    calves = [b for b in range(model.nbody) if "calf" in model.body(b).name]
    falls = []
    perm = MC.joint_permutation(model, robot.joint_names)
    n = int(round(seconds / DT))
    stand = ctrl0[perm]  # backdrive order
    amp = amplitudes(robot, amplitude)
    knots = int(math.ceil(seconds / KNOT)) + 2
    offs = rng.uniform(-1, 1, (knots, 12)) * amp
    offs[0] = 0.0
    t = np.arange(n) * DT
    cmd = stand + np.stack([np.interp(t / KNOT, np.arange(knots), offs[:, j]) for j in range(12)], -1)
    push = np.zeros(n + 1, dtype=bool)
    trunk = model.body(MC.ROBOTS[robot_key].root_link).id
    qs, vs = [], []

    def state():
        q = data.qpos.copy()
        v = data.qvel.copy()
        R = np.empty(9)
        mujoco.mju_quat2Mat(R, q[3:7])  # (data.xmat is of the state before the last step)
        R = R.reshape(3, 3)
        v[:3] = R.T @ v[:3]  # MuJoCo's free joint: world-frame linear velocity; backdrive: base frame
        return np.concatenate([q[:7], q[7:][perm]]), np.concatenate([v[:6], v[6:][perm]])

    for k in range(n):
        q, v = state()
        qs.append(q)
        vs.append(v)
        tk = k * DT
        phase = tk % PUSH_EVERY
        if k > 0 and PUSH_EVERY - PUSH_LENGTH <= phase:
            if data.xfrc_applied[trunk].any() == 0:
                ang = rng.uniform(0, 2 * math.pi)
                data.xfrc_applied[trunk, :3] = rng.uniform(20, 40) * np.array([math.cos(ang), math.sin(ang), 0.0])
            push[k] = True
        else:
            data.xfrc_applied[trunk] = 0.0
        ctrl = np.empty(12)
        ctrl[perm] = cmd[max(k - delay, 0)]
        data.ctrl[:] = ctrl
        mujoco.mj_step(model, data)
        down, touching = fallen(model, data, robot_key, calves)
        push[k + 1] |= touching
        if down:
            push[max(k + 1 - margin, 0):k + 2 + margin] = True
            falls.append(k + 1)
            data.qpos[2:] = start[2:]  # standing where it fell
            data.qvel[:] = 0.0
            data.xfrc_applied[trunk] = 0.0
            mujoco.mj_forward(model, data)
    q, v = state()
    qs.append(q)
    vs.append(v)
    if not np.isfinite(np.array(qs)).all():
        raise FloatingPointError("MuJoCo diverged")
    return np.array(qs), np.array(vs), cmd, push, falls


# Seconds masked before a fall and after the reset that ends it.
FALL_MARGIN = 0.3


def fallen(model, data, robot_key: str, calves: list) -> tuple[bool, bool]:
    """``(fallen, touching)``: the robot's trunk tilted more than 60 degrees or
    lower than half its standing height (it has fallen), and a knee (the
    origin of a body in ``calves``, the calf bodies' ids) within 3 cm of the
    floor (a real robot's knee would touch the ground there; the models
    collide with the feet only)."""
    rs = MC.ROBOTS[robot_key]
    trunk = model.body(rs.root_link).id
    down = data.xmat[trunk, 8] < 0.5 or data.xpos[trunk, 2] < 0.5 * rs.stand_height
    return bool(down), bool((data.xpos[calves, 2] < 0.03).any())


def segments(q, v, cmd, push, length: int):
    """Stack the pieces of a recording that start ``SETTLE`` s after a push and
    hold no push, each ``length`` steps, as recordings ``(R, length + 1, .)``."""
    n = cmd.shape[0]
    free = ~push
    out = []
    k = 0
    settle = int(round(SETTLE / DT))
    while k + length < n:
        window = slice(k, k + length + 1)
        if free[window].all() and (k < settle or free[max(k - settle, 0):k].all()):
            out.append(k)
            k += length
        else:
            k += 5
    idx = np.array(out)[:, None] + np.arange(length + 1)
    return q[idx], v[idx], cmd[idx[:, :-1]], np.array(out)


# Commands kept from before each window's start: the largest candidate delay.
HISTORY = 4


def history(cmd, starts, n: int = HISTORY):
    """``(W, n, nu)``: the ``n`` commands sent before each window's start
    (the recording's first command before the recording began, as MuJoCo's
    delayed servo received), for a delayed prediction's first steps."""
    idx = np.clip(np.asarray(starts)[:, None] - n + np.arange(n), 0, None)
    return cmd[idx]


def with_noise(q, v, seed):
    """Encoder and IMU noise on the measured channels, estimator noise on the base position and velocity."""
    g = torch.Generator().manual_seed(seed)
    n = lambda x, s: x + s * torch.randn(x.shape, generator=g, dtype=F64)  # noqa: E731
    q, v = q.clone(), v.clone()
    q[..., :3] = n(q[..., :3], ESTIMATOR[0])
    v[..., :3] = n(v[..., :3], ESTIMATOR[1])
    rv = n(torch.zeros_like(q[..., :3]), NOISE["base_orientation"])
    from backdrive.spatial import quat_multiply, rotvec_to_quat

    q[..., 3:7] = quat_multiply(q[..., 3:7], rotvec_to_quat(rv))
    v[..., 3:6] = n(v[..., 3:6], NOISE["base_angular_velocity"])
    q[..., 7:] = n(q[..., 7:], NOISE["joint_position"])
    v[..., 6:] = n(v[..., 6:], NOISE["joint_velocity"])
    return q, v


def backdrive_reality(robot, seed: int):
    """The same hidden draws as :func:`reality`, plus a hidden contact law,
    simulated by backdrive itself: what calibration reaches when the model
    class is right (no engine mismatch)."""
    rng = np.random.default_rng(seed)
    friction = float(rng.uniform(0.4, 1.0))
    factor = rng.uniform(0.8, 1.2, robot.num_bodies + 1)[1:]
    truth = {"damping": rng.uniform(0.05, 0.3, robot.num_joints), "strength": float(rng.uniform(0.8, 1.0)),
             "delay": int(rng.integers(1, 4)), "friction": friction, "stiffness": float(rng.uniform(1e4, 3e4)),
             "contact_damping": float(rng.uniform(100, 400))}
    truth["mass"] = (robot.body_mass * torch.as_tensor(factor, dtype=F64)).numpy()
    true_robot = robot.replace(body_mass=torch.as_tensor(truth["mass"], dtype=F64),
                               damping=torch.as_tensor(truth["damping"], dtype=F64),
                               armature=torch.full((robot.num_joints,), ARMATURE, dtype=F64))
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    s = truth["strength"]
    contact = ContactModel(true_robot, ContactGeometry.from_model(true_robot, links=feet),
                           params=ContactParameters(stiffness=truth["stiffness"], damping=truth["contact_damping"],
                                                    friction=friction))
    sim = Simulator(true_robot, DT, actuator=PDActuator(kp=KP * s, kd=KD * s, effort_limit=math.inf), contact=contact)
    return sim, truth


def record_backdrive(sim, robot_key: str, seconds: float, seed: int, delay: int, batch: int,
                     amplitude: dict | None = None):
    """``batch`` recordings of ``seconds`` from backdrive's own simulator (no pushes)."""
    from backdrive.kinematics import forward_kinematics

    robot = sim.robot
    rng = np.random.default_rng(seed)
    rs = MC.ROBOTS[robot_key]
    stand = np.array([rs.stand[next(k for k in rs.stand if f"_{k}_" in n)] for n in robot.joint_names])
    amp = amplitudes(robot, amplitude)
    n = int(round(seconds / DT))
    knots = int(math.ceil(seconds / KNOT)) + 2
    t = np.arange(n) * DT
    cmds = []
    for _ in range(batch):
        offs = rng.uniform(-1, 1, (knots, 12)) * amp
        offs[0] = 0.0
        cmds.append(stand + np.stack([np.interp(t / KNOT, np.arange(knots), offs[:, j]) for j in range(12)], -1))
    cmd = torch.as_tensor(np.array(cmds), dtype=F64)
    q0 = robot.neutral()
    q0[7:] = torch.as_tensor(stand, dtype=F64)
    T = forward_kinematics(robot, q0)
    feet = [f for f in rs.feet]
    q0[2] = -min(float(T[robot.frame_index(f), 2, 3]) for f in feet) + rs.foot_radius + 0.002
    applied = torch.cat([cmd[:, :1].expand(-1, delay, -1), cmd[:, : n - delay]], 1) if delay else cmd
    with torch.no_grad():
        tr = sim.rollout(State(q0.expand(batch, -1), torch.zeros(batch, robot.nv, dtype=F64)), applied)
    return [(tr.q[b].numpy(), tr.v[b].numpy(), cmd[b].numpy(), np.zeros(n + 1, dtype=bool)) for b in range(batch)]


def nominal(robot, law: str = "penalty"):
    """backdrive's starting guess: the URDF, joint damping 0.1, the law's
    default contact (``"penalty"``: :class:`ContactParameters`; ``"soft"``:
    MuJoCo's soft contact with its default ``solref (0.02, 1)``), friction
    0.75, motor strength 1."""
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    robot = robot.replace(damping=torch.full((robot.num_joints,), 0.1, dtype=F64),
                          armature=torch.full((robot.num_joints,), ARMATURE, dtype=F64))
    params = ContactParameters() if law == "penalty" else SoftContactParameters(friction=0.75)
    contact = ContactModel(robot, ContactGeometry.from_model(robot, links=feet), params=params)
    return robot, Simulator(robot, DT, actuator=PDActuator(kp=KP, kd=KD, effort_limit=math.inf), contact=contact)


def truth_simulator(robot, truth, contact_params=None, law: str = "penalty"):
    """backdrive with every hidden parameter at its true value (masses,
    joint damping, motor strength; friction and, for a matched or backdrive
    reality, the contact law) and ``contact_params``' stiffness and damping
    otherwise (default: backdrive's nominal law): the error left when
    nothing is left to calibrate but the contact law, the floor of the
    calibration against this reality."""
    feet = [n for n in robot.link_names if n.endswith("_foot")]
    true_robot = robot.replace(body_mass=torch.as_tensor(truth["mass"], dtype=F64),
                               damping=torch.as_tensor(truth["damping"], dtype=F64),
                               armature=torch.full((robot.num_joints,), ARMATURE, dtype=F64))
    if law == "soft":
        # MuJoCo's own law: the true solref (MuJoCo's default unless hidden).
        cp = SoftContactParameters(timeconst=truth.get("timeconst", 0.02), dampratio=truth.get("dampratio", 1.0),
                                   friction=truth["friction"])
    else:
        cp = contact_params if contact_params is not None else ContactParameters()
        cp = cp.replace(friction=truth["friction"])
    if "stiffness" in truth and law == "penalty":
        cp = cp.replace(stiffness=truth["stiffness"], damping=truth["contact_damping"])
    s = truth["strength"]
    contact = ContactModel(true_robot, ContactGeometry.from_model(true_robot, links=feet), params=cp)
    return Simulator(true_robot, DT, actuator=PDActuator(kp=KP * s, kd=KD * s, effort_limit=math.inf),
                     contact=contact)


def prediction_error(sim, q, v, cmd, delay: int, horizon: int, scale=None, history=None):
    """RMS joint-angle error (rad), base-orientation error (rad) and base
    angular-velocity error (rad/s, the gyro's channel) of ``horizon``-step
    predictions from every ``horizon``-th recorded state (exact recordings).
    ``history`` ``(R, H, nu)``: the commands sent before each recording
    (:func:`history`); without it a delayed prediction's first steps hold
    the recording's first command."""
    T = cmd.shape[-2]
    starts = torch.arange(0, T - horizon + 1, horizon)
    idx = starts[:, None] + torch.arange(horizon + 1)
    qs, vs = q[:, idx], v[:, idx]
    lead = 0
    if history is not None:
        lead = history.shape[-2]
        cmd = torch.cat([history, cmd], -2)
    t = (idx[:, :-1] + lead - delay).clamp_min(0)
    u = cmd[:, t]
    if scale is not None:
        u = u * scale
    with torch.no_grad():
        tr = sim.rollout(State(qs[..., 0, :], vs[..., 0, :]), u)
    dq = tr.q[..., 1:, 7:] - qs[..., 1:, 7:]
    dR = difference(sim.robot, qs[..., 1:, :], tr.q[..., 1:, :])[..., 3:6]
    dw = tr.v[..., 1:, 3:6] - vs[..., 1:, 3:6]
    return (float(dq.pow(2).mean().sqrt()), float(dR.pow(2).sum(-1).mean().sqrt()),
            float(dw.pow(2).sum(-1).mean().sqrt()))


PENALTY_PARAMS = "contact_stiffness,contact_damping,contact_friction,motor_strength"
SOFT_PARAMS = "contact_timeconst,contact_dampratio,contact_friction,motor_strength"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--robot", default="quadruped", choices=sorted(MC.ROBOTS))
    ap.add_argument("--seconds", type=float, default=20.0, help="calibration recording length, s")
    ap.add_argument("--heldout", type=float, default=5.0, help="length of each of the 2 held-out recordings, s")
    ap.add_argument("--segment", type=int, default=10, help="steps per shooting window")
    ap.add_argument("--windows", type=int, default=40, help="shooting windows drawn from the recording")
    ap.add_argument("--horizon", default="100",
                    help="steps of each held-out prediction; a comma-separated list gives one table each "
                         "(the first is saved)")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--params", default=PENALTY_PARAMS,
                    help="comma-separated parameters to fit (with the delay); e.g. add body_mass,damping "
                         "(see the docs: from encoders and IMU alone the masses, motor strength and contact "
                         "law share one force scale)")
    ap.add_argument("--contact", default="native", choices=("native", "hidden", "matched"),
                    help="MuJoCo reality's contact: its own soft contact with MuJoCo's default solref (the "
                         "benchmark), with a hidden solref and its constants recomputed for the scaled masses, "
                         "or backdrive's penalty law with a hidden stiffness and damping (model class right, "
                         "engines differ)")
    ap.add_argument("--law", default="penalty", choices=("penalty", "soft"),
                    help="backdrive's contact: its penalty law (ContactParameters) or MuJoCo's soft constraint "
                         "(SoftContactParameters; fit contact_timeconst, contact_dampratio)")
    ap.add_argument("--total-mass", action="store_true",
                    help="anchor the fitted masses on the robot's true total mass (the robot is weighed; "
                         "ContactFit.total_mass)")
    ap.add_argument("--total-mass-std", type=float, default=None, metavar="KG",
                    help="standard deviation of the weighed total mass that anchors body_mass "
                         "(ContactFit.total_mass_std; default 0.1 %% of the mass, a prior residual that the data can "
                         "outweigh); 0 holds the weighed total exactly (a constraint, not a residual)")
    ap.add_argument("--stage2", default="",
                    help="comma-separated parameters of a second fit that starts from the first one's simulator "
                         "(its contact law and delay kept), e.g. body_mass,damping,motor_strength")
    ap.add_argument("--save", default=None,
                    help="write the calibrated simulator's parameters (masses, joint damping, motor strength, "
                         "contact law, delay) and the truth to this JSON file (for benchmarks/calibration_loop.py)")
    ap.add_argument("--start", default="nominal",
                    help="start the fit from the nominal guess ('nominal'), from the true parameters ('truth'; "
                         "with --iterations 0: the loss at the truth, to compare with the fit's), or from a "
                         "calibration saved by --save (a JSON path, same --seed, --law soft: its values and its "
                         "delay, no delay search)")
    ap.add_argument("--no-fit", action="store_true", help="only the nominal and true-parameter (floor) rows")
    ap.add_argument("--smooth-starts", type=int, default=0, metavar="N",
                    help="the windows start from states smoothed over +-N samples of the noisy recording "
                         "(backdrive.optim.smooth_states, a local quadratic: a smoothing state estimator); the "
                         "noise draws are then made on the whole recording")
    ap.add_argument("--delays", default="0,1,2,3,4",
                    help="comma-separated candidate control delays in steps (ContactFit.delays); one value gives "
                         "the fit the delay (a diagnostic when it is the truth)")
    ap.add_argument("--estimate-starts", nargs="?", const="fit", default=False, choices=("fit", "linear"),
                    help="fit each calibration window's start state too (ContactFit.estimate_starts: the noisy "
                         "recorded start is a prior, weighted by the sensor and estimator noise): 'fit' (the "
                         "default) rolls the offsets out, 'linear' solves them from the residuals' linearisation")
    ap.add_argument("--polish", type=int, default=None, metavar="N",
                    help="with --estimate-starts linear: N Levenberg-Marquardt iterations at the end on the "
                         "rolled-out problem of the kept windows (parameters and start offsets together; "
                         "ContactFit.polish; default: the library's, 12 after linear starts; 0: none)")
    ap.add_argument("--polish-windows", default="kept", choices=("kept", "plausible"),
                    help="the windows the polish rolls out (ContactFit.polish_windows): the linear screen's "
                         "kept ones, or every window whose rolled-out loss is no outlier")
    ap.add_argument("--select-windows", type=int, default=None, metavar="N",
                    help="of the --windows drawn, fit the N whose rollout at the starting guess switches contact "
                         "least (ContactFit.select_windows; default: all)")
    ap.add_argument("--exact-starts", action="store_true",
                    help="diagnostic: the calibration windows start from the exact recorded state (the sensor "
                         "noise stays on every later sample): how much of the fit's error the noisy start "
                         "states cause")
    ap.add_argument("--law-scan", default="",
                    help="comma-separated stiffness:damping pairs (N/m:N s/m): a held-out row each for backdrive "
                         "with every other hidden parameter at its truth and that contact law (a direct floor scan)")
    ap.add_argument("--floor-fit", action="store_true",
                    help="also fit the contact law (stiffness, damping) alone with every other hidden parameter at "
                         "its true value, on the same windows: the best law backdrive can have, and its floor row")
    ap.add_argument("--reality", default="mujoco", choices=("mujoco", "backdrive"),
                    help="who plays the real robot: MuJoCo (the benchmark) or backdrive itself with the same "
                         "hidden draws and a hidden contact law (8 recordings of seconds/8, no pushes): the "
                         "method's accuracy without an engine mismatch")
    ap.add_argument("--excite", default="", metavar="KIND=RAD,...",
                    help="PD-target amplitudes of the calibration recording per joint kind, e.g. hip=0.16 (the "
                         "held-out recordings keep the defaults, hip 0.08, thigh and calf 0.2 rad): an excitation "
                         "motion for the parameters the everyday motion hardly moves")
    args = ap.parse_args(argv)
    excite = {}
    for item in filter(None, args.excite.split(",")):
        kind, _, value = item.partition("=")
        try:
            excite[kind] = float(value)
        except ValueError:
            excite[kind] = math.nan
        if kind not in AMPLITUDE or not 0 <= excite[kind] < math.inf:
            raise SystemExit(f"--excite {item!r}: expected KIND=RAD, RAD >= 0, with KIND one of {sorted(AMPLITUDE)}")
    if args.polish is not None and (args.polish < 0 or (args.polish and args.estimate_starts != "linear")):
        raise SystemExit(f"--polish {args.polish}: expected a whole number of iterations >= 0, with "
                         "--estimate-starts linear")
    if args.select_windows is not None and args.select_windows < 1:
        raise SystemExit(f"--select-windows {args.select_windows}: expected a positive number of windows")
    if args.polish_windows != "kept" and (args.polish == 0 or args.estimate_starts != "linear"):
        raise SystemExit(f"--polish-windows {args.polish_windows}: needs the polish (--estimate-starts linear, "
                         "--polish N >= 1 or its default)")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*torch.jit.script.*")

    robot0 = load(MC.ROBOTS[args.robot].name, floating_base=True)
    t0 = time.perf_counter()
    if args.reality == "mujoco":
        model, truth = reality(args.robot, args.seed, args.contact)
        perm = MC.joint_permutation(model, robot0.joint_names)
        truth["mass"] = np.array([model.body_mass[model.body(name).id] for name in robot0.body_names])
        truth["damping"] = truth["damping"][perm]
        train = [record(model, args.robot, robot0, args.seconds, args.seed + 1, truth["delay"], excite)]
        held = [record(model, args.robot, robot0, args.heldout, args.seed + 2 + i, truth["delay"]) for i in range(2)]
        falls = [sum(len(r[4]) for r in recs) for recs in (train, held)]
        train, held = [r[:4] for r in train], [r[:4] for r in held]
    else:
        bsim, truth = backdrive_reality(robot0, args.seed)
        train = record_backdrive(bsim, args.robot, args.seconds / 8, args.seed + 1, truth["delay"], 8, excite)
        held = record_backdrive(bsim, args.robot, args.heldout, args.seed + 2, truth["delay"], 2)
        falls = None
    t_record = time.perf_counter() - t0

    # Calibration data: push-free pieces of `segment` steps, a spread-out subset of `windows` of them.
    pieces = [(*p[:3], history(cmd, p[3])) for p, cmd in
              ((segments(q, v, cmd, push, args.segment), cmd) for q, v, cmd, push in train)]
    Q, V, U, H = (np.concatenate([p[i] for p in pieces]) for i in range(4))
    pick = np.linspace(0, len(Q) - 1, min(args.windows, len(Q))).round().astype(int)
    Q, V, U, H = (torch.as_tensor(x[pick], dtype=F64) for x in (Q, V, U, H))
    Qn, Vn = with_noise(Q, V, args.seed + 10)
    if args.smooth_starts:
        # Noise on each whole recording, its states smoothed; each window's
        # later samples keep the noise, its start takes the smoothed state.
        parts = []
        for i, (q, v, cmd, push) in enumerate(train):
            st = segments(q, v, cmd, push, args.segment)[3]
            qn, vn = with_noise(torch.as_tensor(q, dtype=F64), torch.as_tensor(v, dtype=F64), args.seed + 10 + i)
            qs, vs = smooth_states(robot0, qn, vn, args.smooth_starts)
            idx = torch.as_tensor(st[:, None] + np.arange(args.segment + 1))
            wq, wv = qn[idx].clone(), vn[idx].clone()
            wq[:, 0], wv[:, 0] = qs[idx[:, 0]], vs[idx[:, 0]]
            parts.append((wq, wv))
        Qn, Vn = (torch.cat([p[k] for p in parts])[torch.as_tensor(pick)] for k in range(2))
    if args.exact_starts:
        Qn[:, 0], Vn[:, 0] = Q[:, 0], V[:, 0]

    if args.law == "soft" and args.params == PENALTY_PARAMS:
        args.params = SOFT_PARAMS
    robot, sim0 = nominal(robot0, args.law)
    delays = tuple(int(d) for d in args.delays.split(","))
    if args.start == "truth":
        sim0 = truth_simulator(robot0, truth, law=args.law)
        robot = sim0.robot
    elif args.start != "nominal":
        saved = json.loads(Path(args.start).read_text())
        if saved["truth"] != json.loads(json.dumps(_jsonable(truth))) or args.law != "soft":
            raise SystemExit(f"--start {args.start}: saved for another draw (--seed) or law; this run is seed "
                             f"{args.seed}, --law {args.law}")
        c = saved["calibrated"]
        sim0 = truth_simulator(robot0, {"mass": c["body_mass"], "damping": c["damping"], "strength": c["motor_strength"],
                                        "timeconst": c["timeconst"], "dampratio": c["dampratio"],
                                        "friction": c["friction"]}, law="soft")
        robot, delays = sim0.robot, (c["delay"],)
    true_total = float(np.sum(truth["mass"]))

    def calibrate(start_robot, start_sim, params, delays, seed_msg):
        anchored = args.total_mass and "body_mass" in params
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f = identify(start_robot, Qn, Vn, dt=DT, params=params,
                         method=ContactFit(start_sim, U, segment=args.segment, delays=delays, history=H,
                                           noise=START_NOISE, delay_iterations=1,
                                           estimate_starts=args.estimate_starts, polish=args.polish,
                                           polish_windows=args.polish_windows, select_windows=args.select_windows,
                                           total_mass=true_total if anchored else None,
                                           total_mass_std=args.total_mass_std if anchored else None),
                         options=SolverOptions("gauss_newton", iterations=args.iterations, progress=False))
        return f, [f"{seed_msg}: {w.message}" for w in caught if "torch.jit" not in str(w.message)]

    fits, notes, t_fit = [], [], 0.0
    if not args.no_fit:
        t0 = time.perf_counter()
        fit, n1 = calibrate(robot, sim0, tuple(args.params.split(",")), delays, "fit")
        fits.append(fit)
        notes += n1
        if args.stage2:
            s1 = fit.simulator
            fit2, n2 = calibrate(s1.robot, s1, tuple(args.stage2.split(",")), (fit.delay,), "stage 2")
            fits.append(fit2)
            notes += n2
        t_fit = time.perf_counter() - t0

    floor_fit = None
    if args.floor_fit and "stiffness" not in truth and args.law == "penalty":
        t0 = time.perf_counter()
        tsim = truth_simulator(robot0, truth)
        floor_fit, n3 = calibrate(tsim.robot, tsim, ("contact_stiffness", "contact_damping"), (truth["delay"],),
                                  "floor fit")
        notes += n3
        t_floor = time.perf_counter() - t0

    # Held-out prediction errors (pieces of `horizon` steps between pushes, exact states).
    cases = [("nominal", sim0, 0)]
    if args.law == "soft":
        cases.append(("TRUE parameters (MuJoCo's law, true solref)", truth_simulator(robot0, truth, law="soft"),
                      truth["delay"]))
    else:
        cases.append(("true parameters, nominal contact law", truth_simulator(robot0, truth), truth["delay"]))
    if fits:
        cp = fits[0].simulator.contact.params
        if "stiffness" not in truth and "contact_stiffness" in fits[0].params:
            cases.append(("true parameters, the calibration's contact law",
                          truth_simulator(robot0, truth, ContactParameters(stiffness=cp.stiffness,
                                                                           damping=cp.damping)), truth["delay"]))
    if floor_fit is not None:
        cases.append(("true parameters, contact law fitted with them (floor)", floor_fit.simulator, truth["delay"]))
    for pair in filter(None, args.law_scan.split(",")):
        k, d = (float(x) for x in pair.split(":"))
        cases.append((f"true parameters, law {k:.4g} N/m, {d:.4g} N s/m",
                       truth_simulator(robot0, truth, ContactParameters(stiffness=k, damping=d)), truth["delay"]))
    if fits:
        cases.append(("calibrated", fits[0].simulator, fits[0].delay))
        if len(fits) > 1:
            cases.append(("calibrated, stage 2", fits[1].simulator, fits[1].delay))
    horizons = [int(h) for h in str(args.horizon).split(",")]
    tables = {}
    for horizon in horizons:
        rows = tables[horizon] = []
        for name, sim, delay in cases:
            errs = []
            for hq, hv, hc, hp in held:
                a, b, c, st = segments(hq, hv, hc, hp, horizon)
                errs.append(prediction_error(sim, torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64),
                                             torch.as_tensor(c, dtype=F64), delay, horizon,
                                             history=torch.as_tensor(history(hc, st), dtype=F64)))
            rows.append((name, *(float(np.mean([e[i] for e in errs])) for i in range(3))))
    rows = tables[horizons[0]]

    # Report.
    print(f"# calibration benchmark: {args.robot}, {args.reality} as reality"
          + (f" ({args.contact} contact)" if args.reality == "mujoco" else "") + f", seed {args.seed}\n")
    print(f"recording {args.seconds:g} s (+2 x {args.heldout:g} s held out) at {DT * 1e3:g} ms; "
          + (f"{used} of {len(pick)} windows of {args.segment} steps drawn ({used * args.segment * DT:.2f} s of "
             "data) used, those whose rollout at the starting guess switches contact least; "
             if (used := min(args.select_windows or len(pick), len(pick))) < len(pick) else
             f"{len(pick)} windows of {args.segment} steps ({len(pick) * args.segment * DT:.2f} s of data) used; ")
          + (f"falls (pieces ended, not used): {falls[0]} in the calibration recording, {falls[1]} held out; "
             if falls is not None else "")
          + (f"calibration targets {args.excite} rad; " if args.excite else "")
          + f"recording {t_record:.1f} s, identify {t_fit:.1f} s"
          + "".join(f"; fit {k + 1}: {f.iterations} Gauss-Newton iterations, {f.message}, rms residual {f.rms_residual:.4g}" for k, f in enumerate(fits))
          + (f"; masses anchored on the weighed total {true_total:.4g} kg" if args.total_mass else "") + "\n")
    for horizon, table in tables.items():
        print(f"| held-out {horizon}-step prediction ({horizon * DT:g} s) | joint angles, rms rad | "
              "base orientation, rms rad | base angular velocity, rms rad/s | ratio nominal / this |")
        print("| --- | --- | --- | --- | --- |")
        n = table[0]
        for name, a, b, w in table:
            print(f"| {name} | {a:.4g} | {b:.4g} | {w:.4g} | {n[1] / a:.2f}x, {n[2] / b:.2f}x, {n[3] / w:.2f}x |")
        print()

    counted = []  # (error, interval's half-width relative to the value, truth inside, identified), given a truth

    def line(label, true, nom, val, lo, hi, ok):
        if true is not None:
            counted.append((abs(val / true - 1), max(hi / val - 1, 1 - lo / val) if val > 0 else math.inf,
                            lo <= true <= hi, ok))
        err = f"{100 * (val / true - 1):+.1f} %" if true is not None else "-"
        tr = f"{true:.4g}" if true is not None else "(other law)"
        print(f"| {label} | {tr} | {nom:.4g} | {val:.4g} | {err} | [{lo:.4g}, {hi:.4g}] | {'yes' if ok else 'NO'} |")

    strength = 1.0
    for k, fit in enumerate(fits):
        counted.clear()
        print(f"fit {k + 1} ({', '.join(fit.params)}"
              + (", delay)" if k == 0 else "; contact law and delay of fit 1)") + ":\n")
        print("| parameter | truth | nominal | fitted | error | 95 % interval | identified |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for b, name in enumerate(robot.body_names if "body_mass" in fit.params else ()):
            line(f"mass {name}", float(truth["mass"][b]), float(robot.body_mass[b]),
                 float(fit.params["body_mass"][b]), float(fit.lower["body_mass"][b]),
                 float(fit.upper["body_mass"][b]), bool(fit.identified["body_mass"][b]))
        for j, name in enumerate(robot.joint_names if "damping" in fit.params else ()):
            line(f"damping {name}", float(truth["damping"][j]), float(robot.damping[j]),
                 float(fit.params["damping"][j]), float(fit.lower["damping"][j]), float(fit.upper["damping"][j]),
                 bool(fit.identified["damping"][j]))
        for p, true in (("contact_friction", truth["friction"]), ("motor_strength", truth["strength"]),
                        ("contact_stiffness", truth.get("stiffness")),
                        ("contact_damping", truth.get("contact_damping")),
                        ("contact_timeconst", truth.get("timeconst", 0.02 if args.reality == "mujoco" else None)),
                        ("contact_dampratio", truth.get("dampratio", 1.0 if args.reality == "mujoco" else None))):
            if p not in fit.params:
                continue
            f = strength if p == "motor_strength" else 1.0  # a later fit's strength multiplies the earlier one's
            line(p, true, 1.0 if p == "motor_strength" else float(getattr(sim0.contact.params, p[8:])),
                 f * float(fit.params[p]), f * float(fit.lower[p]), f * float(fit.upper[p]),
                 bool(fit.identified[p]))
        if "motor_strength" in fit.params:
            strength *= float(fit.params["motor_strength"])
        if k == 0:
            print(f"| delay (steps) | {truth['delay']} | 0 | {fit.delay} | - | losses "
                  f"{', '.join(f'{d}: {l:.3g}' for d, l in sorted(fit.delay_losses.items()))} "
                  f"| {'yes' if 'delay' not in fit.not_identified else 'NO'} |")
        # The data determine a parameter to +-5 % when its 95 % interval lies within 5 % of the fitted value;
        # the intervals assume the model class is right, so their coverage of the truth is reported too.
        determined = [e for e, w, _, _ in counted if w <= 0.05]
        covered = [c for _, _, c, ok in counted if ok]
        print(f"\nwithin 5 % of the truth: {sum(e <= 0.05 for e, *_ in counted)} of {len(counted)}; "
              f"determined to +-5 % by the data (95 % interval): {len(determined)}, of which within 5 %: "
              f"{sum(e <= 0.05 for e in determined)}; truth inside its 95 % interval: {sum(covered)} of the "
              f"{len(covered)} identified")
        if "body_mass" in fit.params:
            errs = [abs(float(fit.params["body_mass"][b]) / float(truth["mass"][b]) - 1)
                    for b in range(robot.num_bodies)]
            ok = [e for b, e in enumerate(errs) if bool(fit.identified["body_mass"][b])]
            print(f"\nmasses: median error {100 * float(np.median(errs)):.1f} %, {sum(e < 0.05 for e in ok)} of "
                  f"{len(ok)} identified within 5 %; total {float(fit.params['body_mass'].sum()):.4g} kg "
                  f"(truth {true_total:.4g})")
        print()
    if fits:
        print(f"fit 1: identify {t_fit:.0f} s; not identified: {', '.join(fits[0].not_identified) or 'none'}\n")
    if floor_fit is not None:
        c = floor_fit.simulator.contact.params
        print(f"floor fit (contact stiffness and damping, every other parameter at its true value, {t_floor:.0f} s, "
              f"{floor_fit.message}, rms residual {floor_fit.rms_residual:.4g}): {float(c.stiffness):.4g} N/m, "
              f"{float(c.damping):.4g} N s/m\n")
    if notes:
        print("warnings: " + "; ".join(notes))
    if args.save and fits:
        save(args.save, fits[-1], truth, rows, vars(args))
    return fits, rows, truth


def _jsonable(truth: dict) -> dict:
    """The truth with its arrays as lists (as :func:`save` writes it)."""
    return {k: (np.asarray(x).tolist() if isinstance(x, np.ndarray) else x) for k, x in truth.items()}


def save(path: str, fit, truth, rows, args) -> None:
    """The calibrated simulator's parameters as JSON (what :mod:`calibration_loop` builds its sim from)."""
    sim = fit.simulator
    cp = sim.contact.params
    kp = torch.as_tensor(sim.actuator.kp, dtype=F64).reshape(-1)
    f = lambda x: torch.as_tensor(x, dtype=F64).detach().reshape(-1).tolist()  # noqa: E731
    law = ({"timeconst": f(cp.timeconst)[0], "dampratio": f(cp.dampratio)[0]} if sim.contact.soft
           else {"stiffness": f(cp.stiffness)[0], "contact_damping": f(cp.damping)[0]})
    out = {
        "calibrated": {"body_mass": f(sim.robot.body_mass), "damping": f(sim.robot.damping),
                       "motor_strength": float(kp.mean()) / KP, **law, "friction": f(cp.friction)[0],
                       "delay": fit.delay},
        "truth": _jsonable(truth),
        # The fit's 95 % intervals (for the fitted entries; the motor strength is this fit's factor on the
        # earlier fits' gains) and whether the data determine each entry.
        "interval": {p: {"lower": f(fit.lower[p]), "upper": f(fit.upper[p]),
                         "identified": torch.as_tensor(fit.identified[p]).reshape(-1).tolist()}
                     for p in fit.params},
        "prediction_error": {name: list(e) for name, *e in rows},
        "args": args,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

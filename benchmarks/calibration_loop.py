"""Close the loop of issue 13: calibrate on walking, fine-tune the walker in the calibrated and the nominal sim, deploy both in "reality".

"Reality" is the hidden robot of ``benchmarks/calibration.py`` (the same
draw for the same ``--seed``: every link mass scaled by 0.8-1.2, foot
friction 0.4-1.0, joint damping 0.05-0.3 N m s/rad, one motor strength
0.8-1.0 on both servo gains, a control delay of 1-3 steps, armature 0.01
kg m^2 known to both engines), simulated by MuJoCo with its own soft contact
(``solref (0.02, 1)``, elliptic cone, ``implicitfast``) at the policy's
physics step (``QuadrupedWalk``'s 5 ms substep), with the walking env's
servos (``kp`` 40 N m/rad, ``kd`` 1 N m s/rad, times the strength; the URDF
effort limits) at 50 Hz. The delay is in 5 ms steps: each new servo target
acts 5-15 ms into its 20 ms control period
(``locomotion_transfer.build_hidden`` and ``run_mujoco(model=, delay=)``).

1. **Record** walking in reality: the shipped policy
   (``QuadrupedWalk.pretrained``) under random forward commands (0.2-0.8
   m/s, a new one every 2.5 s), random PD-target offsets added to its
   targets (hip +-0.05, thigh and calf +-0.1 rad, new every 0.2 s, held per
   control period), a 20-40 N push on the trunk every second. Sensor and
   state-estimator noise as in ``calibration.py``.
2. **Calibrate** at 5 ms with ``identify(..., ContactFit)`` through the
   training simulator itself (the env's contact geometry, servos and effort
   saturation, in float64): masses (anchored on the weighed total mass),
   joint damping, contact stiffness, damping and friction, motor strength
   and the delay (0-4 steps), on 25-step (125 ms) windows from push-free
   pieces of the walk (``--params`` chooses the set; ``--start truth
   --iterations 0 --delays truth`` gives the Cramer-Rao intervals at the
   hidden values instead: what the data can determine). Reported: held-out
   40-step (0.2 s) prediction error on walking of the nominal,
   true-parameter and calibrated simulators.
3. **Fine-tune** the shipped policy with the same budget in two
   ``QuadrupedWalk`` simulators at 5 ms: the nominal one (URDF masses,
   joint damping 0.1, backdrive's default contact law, strength 1, no delay:
   the calibration's starting guess) and the calibrated one (its masses,
   contact law, strength and delay; :class:`DelayedWalk` applies the delay
   in the env). ``QUADRUPED_WALK_SHAC`` settings with the observation
   statistics frozen, a fresh critic fitted alone for the first
   ``--warmup`` updates (the actor frozen), then actor steps at ``--lr``,
   optionally pulled towards the shipped weights (``--anchor``); the same
   seed. Each fine-tuned policy is also evaluated in its own training sim.
4. **Deploy** the shipped and both fine-tuned policies in reality, 16
   episodes x 10 s from the env's randomised initial states under a 0.5 m/s
   forward command; report forward speed, per-episode speed-tracking error
   and fraction upright, and, as a diagnostic, the shipped policy's walk as
   each training sim predicts it.

``--robot go1`` runs the loop on example-robot-data's Go1 with its shipped
policy (``QuadrupedWalk.pretrained(robot="go1")``) and ``GO1_WALK_SHAC``'s
training settings. The policy sees and acts in the env's joint layout
(legs FL, FR, RL, RR), which is not Go1's URDF order (FR, FL, RR, RL):
:func:`policy_targets` and :func:`to_ctrl` map it to MuJoCo's joints, and
the recording keeps the robot's (the simulator's) order for the fit.
``--select-every N`` keeps, of the shipped policy and the fine-tuning's
checkpoints every N actor updates, the one that tracks the command best in
its own training sim. ``--command-range`` and ``--action-noise`` change the
fine-tuning's command distribution and exploration noise.

The stages can run apart: ``--calibrate-only`` writes the calibration,
``--calibration JSON`` reuses it, ``--nominal-only PATH`` fine-tunes in the
nominal sim once for every draw, ``--nominal-policy PATH`` takes it, and
``--deploy-only`` deploys the shipped and that policy in one draw's reality.

    python benchmarks/calibration_loop.py --nominal-only outputs/benchmarks/nominal_ft.pt
    python benchmarks/calibration_loop.py --seed 0 --floor --nominal-policy outputs/benchmarks/nominal_ft.pt
    python benchmarks/calibration_loop.py --seed 0 --deploy-only --nominal-policy outputs/benchmarks/nominal_ft.pt
    python benchmarks/calibration_loop.py --robot go1 --seed 0 --calibrate-only
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
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
import calibration as CAL  # noqa: E402
import locomotion_transfer as LT  # noqa: E402

from backdrive.contact import ContactModel, ContactParameters  # noqa: E402
from backdrive.contact._model import masked_terms  # noqa: E402
from backdrive.envs import QuadrupedWalk  # noqa: E402
from backdrive.optim import (  # noqa: E402
    GO1_WALK_SHAC, QUADRUPED_WALK_SHAC, ContactFit, PolicyTrainer, SolverOptions, identify)
from backdrive.sim import Simulator  # noqa: E402

F64 = torch.float64
ARMATURE = CAL.ARMATURE  # 0.01 kg m^2, known to both engines
OFFSETS = {"hip": 0.05, "thigh": 0.1, "calf": 0.1}  # random PD-target offsets, rad
KNOT = 0.2  # s between offset knots
COMMAND_EVERY = 2.5  # s between new random forward commands
PUSH_EVERY, PUSH_LENGTH, SETTLE = CAL.PUSH_EVERY, CAL.PUSH_LENGTH, CAL.SETTLE
#: The sims' friction slip-speed scale, m/s, unless ``params`` has ``"stiction_width"`` (the library's default).
STICTION = ContactParameters().stiction_width
PRESETS = {"quadruped": QUADRUPED_WALK_SHAC, "go1": GO1_WALK_SHAC}  # each robot's shipped training settings
FIT_PARAMS = ("body_mass", "damping", "contact_stiffness", "contact_damping", "contact_friction", "motor_strength")


class DelayedWalk(QuadrupedWalk):
    """``QuadrupedWalk`` whose new servo target takes effect ``delay`` physics
    substeps into its control period (the previous target holds until then),
    as ``locomotion_transfer.run_mujoco(delay=)`` does in MuJoCo. ``delay = 0``
    is ``QuadrupedWalk``; at most ``substeps``.

    Since the 20th session the env does this itself (``QuadrupedWalk(action_delay=)``); ``delay`` is that
    setting under the name the benchmarks set after construction. The library's delay reproduced this class's
    own earlier version to 1e-12 (``tests/test_quadruped_delay_contact.py`` keeps that version as its reference)."""

    @property
    def delay(self) -> int:
        return self.action_delay

    @delay.setter
    def delay(self, k: int) -> None:
        if int(k) != k or not 0 <= k <= self.substeps:
            raise ValueError(f"delay {k} exceeds the {self.substeps} substeps of a control period or is not a "
                             "non-negative int")
        self.action_delay = int(k)


class NoAdhesionSimulator(Simulator):
    """``Simulator`` whose implicit contact step never pulls a foot onto the floor (12th session).

    Since the 13th session the library's own step does this by default (``ContactModel(...,
    unilateral=True)``, :func:`backdrive.contact._model.unilateral_step`; the two agree to about
    1e-11, ``benchmarks/calibration_noadh_check.py``); this stand-in, on the joint-solve step, is kept
    so that the 12th- and 13th-session runs that name it re-run unchanged. Before, the library's implicit step (``Simulator(joint_forces="implicit")``, the env's) linearises each
    contact's force in the new velocity, ``f' = f - (C + dt K) J dt a - ...``, and applies ``f'`` as
    solved: where a loaded foot starts to lift off in the step, the normal damping (1e4 N s/m) makes
    ``f'`` negative, an adhesion of up to ~90 N (the shipped Go1 walk: 1-2 % of foot-substeps, mean
    -17 to -20 N) that holds the foot on the floor. MuJoCo's constraint solver keeps every normal
    force >= 0. Here a step whose solved normal force is negative at some foot is solved again with
    that foot's rows out of it (an active-set pass, up to ``passes`` times), so ``f_n >= 0`` at
    every applied force. Steps without a negative normal force are the library's joint-solve step
    exactly (``Simulator._joint_solve_contact``; the default step agrees to rounding).
    """

    passes = 3

    def replace(self, **kwargs) -> "NoAdhesionSimulator":
        """``Simulator.replace`` that keeps this class (``ContactFit`` rebuilds its simulator with
        ``replace`` at every parameter value: the fit then steps without adhesion too)."""
        sim = super().replace(**kwargs)
        sim.__class__ = type(self)
        sim.passes = self.passes
        return sim

    def _advance_contact(self, q, v, u):
        from backdrive.contact import integrate_world

        if self._implicit is None:
            raise ValueError("NoAdhesionSimulator needs the implicit joint-force step (joint_forces='implicit')")
        robot, dt = self.robot, self.dt
        tau, effort = self.efforts(q, v, u)
        damping = self._pd_damping(q)
        first = self.contact.implicit_terms(robot, q, v, dt)
        terms, keep = first, None
        for k in range(self.passes + 1):
            extra = terms.matrix if damping is None else terms.matrix + torch.diag_embed(damping)
            v_new = self._implicit.velocity(q, v, tau, extra_force=terms.force, extra_implicit=extra)
            a = (v_new - v) / dt
            res = self.contact.applied(robot, terms, a, dt)
            neg = res.normal_force < 0
            if keep is not None:
                neg = neg & (keep > 0)
            if k == self.passes or not bool(neg.any()):
                break
            keep = (~neg).to(q.dtype) if keep is None else keep * (~neg).to(q.dtype)
            terms = masked_terms(first, keep)
        q1, v1 = integrate_world(robot, q, v, a, dt)
        return q1, v1, effort, res


def make_env(params: dict | None, num_envs: int, dtype=torch.float32, robot_name: str = "quadruped",
             vx_range: tuple[float, float] | None = None) -> DelayedWalk:
    """``QuadrupedWalk`` as ``robot_name``'s shipped policy was trained, with
    the physics of ``params`` (``None``: the calibration's nominal guess) and its delay;
    ``vx_range``: the forward commands drawn per episode (default the training's, 0.2-0.8 m/s).
    Optional keys of ``params``: ``armature`` (kg m^2 per joint, default :data:`ARMATURE`),
    ``joint_friction`` (N m), ``no_adhesion`` (true: step with :class:`NoAdhesionSimulator`),
    ``stiction_width`` (m/s, the regularised friction's slip-speed scale; default :data:`STICTION`)."""
    env, _ = DelayedWalk.pretrained(num_envs, robot=robot_name, dtype=dtype)
    r = env.robot
    nj = r.num_joints
    kw = {"dtype": env.dtype}
    if params is None:
        params = nominal_params(r)
    robot = r.replace(body_mass=torch.tensor(params["body_mass"], **kw), damping=torch.tensor(params["damping"], **kw),
                      armature=torch.full((nj,), float(params.get("armature", ARMATURE)), **kw))
    if "joint_friction" in params:  # joint Coulomb friction, N m (default: the URDF's, Go1 0.2 N m)
        robot = robot.replace(friction=torch.as_tensor(params["joint_friction"], **kw).expand(nj).clone())
    s = float(params["motor_strength"])
    extra = {}
    if vx_range is not None:
        extra["command_ranges"] = {**env.command_ranges, "vx": (float(vx_range[0]), float(vx_range[1]))}
    env, _ = DelayedWalk.pretrained(num_envs, robot=robot, kp=env.kp * s, kd=env.kd * s, dtype=dtype, **extra)
    # The env builds its contact from `nominal_contact` at construction; the
    # fitted law replaces it (no randomisation, so `env.sim` is the one used).
    env.nominal_contact = ContactParameters(stiffness=float(params["stiffness"]),
                                            damping=float(params["contact_damping"]),
                                            friction=float(params["friction"]),
                                            stiction_width=float(params.get("stiction_width", STICTION)))
    env.contact = ContactModel(env.robot, env.geometry, params=env.nominal_contact)
    sim_class = NoAdhesionSimulator if params.get("no_adhesion") else Simulator
    env.sim = sim_class(env.robot, env.physics_dt, actuator=env._actuator, contact=env.contact)
    env.delay = int(params.get("delay", 0))
    return env


def robot_key(env: QuadrupedWalk) -> str:
    """``"quadruped"`` or ``"go1"``: the key of ``env``'s robot in
    ``_mujoco_contact.ROBOTS`` and ``QuadrupedWalk.SHIPPED_POLICIES``."""
    key = env.robot.name
    if key not in PRESETS:
        raise ValueError(f"no calibration loop for robot {key!r}; valid: {', '.join(PRESETS)}")
    return key


def nominal_params(robot) -> dict:
    c = ContactParameters()
    return {"body_mass": robot.body_mass.tolist(), "damping": [0.1] * robot.num_joints, "motor_strength": 1.0,
            "stiffness": float(c.stiffness), "contact_damping": float(c.damping), "friction": float(c.friction),
            "delay": 0}


def hidden_truth(seed: int, robot, key: str = "quadruped") -> dict:
    """``calibration.reality``'s hidden draw for ``seed`` on the robot ``key``
    (masses and damping in ``robot``'s body and joint order)."""
    model, truth = CAL.reality(key, seed)
    perm = MC.joint_permutation(model, robot.joint_names)
    return {"mass": [float(model.body_mass[model.body(n).id]) for n in robot.body_names],
            "damping": [float(x) for x in truth["damping"][perm]], "strength": float(truth["strength"]),
            "friction": float(truth["friction"]), "delay": int(truth["delay"]), "armature": ARMATURE}


def truth_params(truth: dict, contact: ContactParameters | None = None) -> dict:
    c = contact or ContactParameters()
    return {"body_mass": truth["mass"], "damping": truth["damping"], "motor_strength": truth["strength"],
            "stiffness": float(c.stiffness), "contact_damping": float(c.damping), "friction": truth["friction"],
            "delay": truth["delay"]}


@torch.no_grad()
def policy_targets(env: QuadrupedWalk, policy, qpos: np.ndarray, qvel: np.ndarray, eperm: np.ndarray,
                   last_action: np.ndarray, command: np.ndarray, phase: np.ndarray):
    """One control step of ``env``'s policy on MuJoCo states ``(n, 19), (n, 18)``:
    ``(action, target)``, each ``(n, 12)`` in the env's joint order (legs FL,
    FR, RL, RR), the target ``q_stand + action_scale a + gait_offsets(phase)``.
    ``eperm``: MuJoCo's joint indices in the env's order
    (``locomotion_transfer.env_order``), not the robot's (Go1's URDF lists
    its legs FR, FL, RR, RL)."""
    obs = LT.mujoco_observation(qpos, qvel, eperm, env.q_stand.double().numpy(), last_action, command, phase,
                                env.privileged)
    action = policy(torch.as_tensor(obs, dtype=env.dtype)).clamp(-1.0, 1.0)
    target = env.q_stand + env.action_scale * action + env.gait_offsets(torch.as_tensor(phase, dtype=env.dtype))
    return action.double().numpy(), target.double().numpy()


def to_ctrl(target: np.ndarray, eperm: np.ndarray) -> np.ndarray:
    """Env-order servo targets ``(..., 12)`` as MuJoCo's ``ctrl`` (one position
    actuator per joint, in MuJoCo's joint order); ``ctrl[..., perm]`` is then
    in the robot's joint order (the calibration simulator's control)."""
    ctrl = np.empty_like(target)
    ctrl[..., eperm] = target
    return ctrl


@torch.no_grad()
def record_walk(mj, env: QuadrupedWalk, policy, seconds: float, seed: int, delay: int,
                push_every: float = PUSH_EVERY):
    """Walk ``env.num_envs`` robots in MuJoCo (``mj = (model, perm)``, time
    step ``env.physics_dt``) with the policy, random commands, PD-target
    offsets and pushes. Returns per robot ``(q (T+1, 19), v (T+1, 18),
    targets (T, 12) as sent, invalid (T+1,))`` in the robot's joint order
    (the simulator's; base linear velocity in the base frame); ``invalid``
    marks pushed steps and everything from a fall on. The policy sees and
    acts in the env's joint order (:func:`policy_targets`, :func:`to_ctrl`).
    ``push_every``: seconds between pushes (``0``: no pushes)."""
    import mujoco

    model, perm = mj
    eperm = LT.env_order(env, perm)
    rng = np.random.default_rng(seed)
    sub = env.substeps
    n = env.num_envs
    steps = int(round(seconds / env.dt))
    env.reset(seed=seed)
    parts = {k: t.double().numpy().copy() for k, t in env.split(env.state).items()}
    qpos0, qvel0 = LT.to_mujoco(parts["q"], parts["v"], perm)
    datas = [mujoco.MjData(model) for _ in range(n)]
    for d, qp, qv in zip(datas, qpos0, qvel0):
        d.qpos[:], d.qvel[:] = qp, qv
        mujoco.mj_forward(model, d)
    trunk = model.body(MC.ROBOTS[robot_key(env)].root_link).id
    last, phase = parts["last_action"], parts["phase"]
    dphase = 2 * math.pi * env.gait_frequency * env.dt
    env_names = [env.robot.joint_names[j] for j in env.joint_index.tolist()]
    amp = np.array([OFFSETS[next(k for k in OFFSETS if f"_{k}_" in name)] for name in env_names])
    knots = int(math.ceil(seconds / KNOT)) + 2
    offs = rng.uniform(-1, 1, (n, knots, 12)) * amp
    offs[:, 0] = 0.0
    tc = np.arange(steps) * env.dt / KNOT
    offsets = np.stack([np.stack([np.interp(tc, np.arange(knots), offs[i, :, j]) for j in range(12)], -1)
                        for i in range(n)], 1)  # (steps, n, 12), held over each control period
    vx_cmd = rng.uniform(0.2, 0.8, (int(math.ceil(seconds / COMMAND_EVERY)) + 1, n))
    previous = to_ctrl((env.q_stand + env.action_scale * torch.as_tensor(last, dtype=env.dtype)
                        + env.gait_offsets(torch.as_tensor(phase - dphase, dtype=env.dtype))).double().numpy(), eperm)
    alive = np.ones(n, dtype=bool)
    fall_step = np.zeros(n, dtype=int)
    qs, vs, us, bad = [], [], [], []

    def snapshot():
        q = np.stack([d.qpos.copy() for d in datas])
        v = np.stack([d.qvel.copy() for d in datas])
        R = MC.quat_to_matrix(q[:, 3:7] / np.linalg.norm(q[:, 3:7], axis=-1, keepdims=True))
        vb = np.einsum("nji,nj->ni", R, v[:, :3])
        return (np.concatenate([q[:, :7], q[:, 7:][:, perm]], -1),
                np.concatenate([vb, v[:, 3:6], v[:, 6:][:, perm]], -1), R, q)

    for c in range(steps):
        t = c * env.dt
        cmd = np.zeros((n, 3))
        cmd[:, 0] = vx_cmd[int(t // COMMAND_EVERY)]
        qb, vb, R, qpos = snapshot()
        qvel = np.stack([d.qvel for d in datas])
        action, target = policy_targets(env, policy, qpos, qvel, eperm, last, cmd, phase)
        target = to_ctrl(target + offsets[c], eperm)  # MuJoCo's actuator order
        for k in range(sub):
            if k:
                qb, vb, R, qpos = snapshot()
            pushed = (push_every > 0 and t > 0
                      and (t + k * env.physics_dt) % push_every >= push_every - PUSH_LENGTH)
            for i, d in enumerate(datas):
                if not alive[i]:
                    continue
                if pushed:
                    if not d.xfrc_applied[trunk].any():
                        ang = rng.uniform(0, 2 * math.pi)
                        d.xfrc_applied[trunk, :3] = rng.uniform(20, 40) * np.array([math.cos(ang), math.sin(ang), 0])
                else:
                    d.xfrc_applied[trunk] = 0.0
                d.ctrl[:] = previous[i] if k < delay else target[i]
                mujoco.mj_step(model, d)
            qs.append(qb)
            vs.append(vb)
            us.append(target[:, perm])  # the robot's joint order
            bad.append(~alive | pushed)
        previous = target
        last = action
        phase = np.remainder(phase + dphase, 2 * math.pi)
        qpos = np.stack([d.qpos for d in datas])
        R = MC.quat_to_matrix(qpos[:, 3:7] / np.linalg.norm(qpos[:, 3:7], axis=-1, keepdims=True))
        fell = (-R[:, 2, 2] > -0.5) | (qpos[:, 2] < 0.5 * env.stand_height) | ~np.isfinite(qpos).all(-1)
        fall_step[fell & alive] = len(qs)
        alive &= ~fell
    qb, vb, _, _ = snapshot()
    qs.append(qb)
    vs.append(vb)
    bad.append(~alive)
    Q, V, U, B = np.array(qs), np.array(vs), np.array(us), np.array(bad)
    # A fall invalidates the steps before it was detected, back to the control step's start.
    for i in range(n):
        if not alive[i]:
            B[max(fall_step[i] - 2 * sub, 0):, i] = True
    return [(Q[:, i], V[:, i], U[:, i], B[:, i]) for i in range(n)], alive


def pieces(recs, length: int, sub: int, settle_steps: int):
    """Push-free pieces of ``length`` steps that start ``settle_steps`` after a
    push, each at the last substep of a control period (so a delay of up to
    ``sub - 1`` steps acts with the right command from the piece's first step)."""
    out = []
    for q, v, u, bad in recs:
        n = u.shape[0]
        k = sub - 1
        while k + length < n:
            if not bad[k:k + length + 1].any() and not bad[max(k - settle_steps, 0):k].any():
                out.append((q[k:k + length + 1], v[k:k + length + 1], u[k:k + length]))
                k += length + (sub - length % sub) % sub
            else:
                k += sub
    return [np.array(x) for x in zip(*out)]


def prediction(sim, held, delay: int, horizon: int):
    q, v, u = (torch.as_tensor(x, dtype=F64) for x in held)
    return CAL.prediction_error(sim, q, v, u, delay, horizon)


def calibrate(args, env_n, truth: dict, result: dict) -> dict:
    """Steps 1 and 2: record walking in reality, fit, and the held-out
    prediction table. Fills ``result`` and returns the calibrated parameters."""
    dt = env_n.physics_dt
    sub = env_n.substeps
    mj = LT.build_hidden(env_n, truth, dt)
    _, shipped = QuadrupedWalk.pretrained(1, robot=args.robot)

    # 1. Record walking in reality.
    t0 = time.perf_counter()
    recs, alive = record_walk(mj, env_n, shipped, args.record, args.seed + 1, truth["delay"], args.push_every)
    settle = int(round(SETTLE / dt))
    train = pieces(recs[:args.robots], 4 * args.segment, sub, settle)
    held = pieces(recs[args.robots:], args.horizon, sub, settle)
    for name, got, steps in (("calibration", train, 4 * args.segment), ("held-out", held, args.horizon)):
        if not got:
            raise SystemExit(f"no push-free {name} piece of {steps} steps ({steps * dt:g} s) in the recording: "
                             f"the recording pushes the trunk every {args.push_every:g} s and a piece starts {SETTLE:g} s after "
                             f"a push; lower --segment (a calibration piece is 4 x segment steps) or --horizon, or "
                             f"push less often (--push-every)")
    print(f"recorded {args.robots + 2} x {args.record:g} s of walking ({alive.sum()} stayed up) in "
          f"{time.perf_counter() - t0:.0f} s; {len(train[0])} calibration pieces of {4 * args.segment} steps, "
          f"{len(held[0])} held-out pieces of {args.horizon}", flush=True)
    per = 4
    pick = np.linspace(0, len(train[0]) - 1, min(max(args.windows // per, 1), len(train[0]))).round().astype(int)
    Q, V, U = (torch.as_tensor(x[pick], dtype=F64) for x in train)
    Qn, Vn = CAL.with_noise(Q, V, args.seed + 10)

    # 2. Calibrate through the training simulator (float64), from the nominal
    # guess with --start-law's contact law (default the library's) and, with
    # --no-adhesion, the step without adhesion.
    def with_law(p):
        p = dict(p)
        if args.start_law:
            p["stiffness"], p["contact_damping"] = (float(x) for x in args.start_law.split(","))
        if args.no_adhesion:
            p["no_adhesion"] = True
        if args.joint_friction is not None:
            p["joint_friction"] = args.joint_friction
        return p

    nominal = with_law(nominal_params(env_n.robot))
    sim0 = make_env(nominal, 1, F64, args.robot).sim
    true_total = float(np.sum(truth["mass"]))

    # The channels compared (default ContactFit's: encoders and IMU); the base's position and velocity
    # carry the state estimator's noise (calibration.ESTIMATOR), as the recording does.
    observe = tuple(c.strip() for c in args.observe.split(",")) if args.observe else None
    noise = {**CAL.NOISE, "base_position": CAL.ESTIMATOR[0], "base_linear_velocity": CAL.ESTIMATOR[1]}

    def fit(start_sim, params, delays, total=None):
        t0 = time.perf_counter()
        f = identify(start_sim.robot, Qn, Vn, dt=dt, params=params,
                     method=ContactFit(start_sim, U, segment=args.segment, noise=noise, delays=delays,
                                       observe=observe,
                                       delay_iterations=1, total_mass=total,
                                       total_mass_std=args.total_mass_std if total is not None else None),
                     options=SolverOptions("gauss_newton", iterations=args.iterations, progress=False))
        return f, time.perf_counter() - t0

    params = tuple(p.strip() for p in args.params.split(",") if p.strip())
    delays = (truth["delay"],) if args.delays == "truth" else tuple(int(d) for d in args.delays.split(","))
    start = sim0 if args.start == "nominal" else make_env(with_law(truth_params(truth)), 1, F64, args.robot).sim
    cal, t_fit = fit(start, params, delays, true_total if "body_mass" in params else None)
    s = cal.simulator
    cp = s.contact.params
    calibrated = {"body_mass": s.robot.body_mass.tolist(), "damping": s.robot.damping.tolist(),
                  "motor_strength": float(torch.as_tensor(s.actuator.kp).reshape(-1).mean()) / env_n.kp,
                  "stiffness": float(cp.stiffness), "contact_damping": float(cp.damping),
                  "friction": float(cp.friction), "delay": int(cal.delay)}
    if args.no_adhesion:
        calibrated["no_adhesion"] = True
    if args.joint_friction is not None:
        calibrated["joint_friction"] = args.joint_friction
    result["nominal"] = nominal
    result["calibrated"] = calibrated
    result["fit"] = {"params": list(params), "seconds": t_fit, "message": cal.message,
                     "total_mass_std": args.total_mass_std,
                     "rms_residual": float(cal.rms_residual),
                     "delay_losses": {str(k): float(x) for k, x in cal.delay_losses.items()},
                     "not_identified": list(cal.not_identified), "windows": int(len(pick) * per),
                     "interval": {k: [torch.as_tensor(cal.lower[k]).reshape(-1).tolist(),
                                      torch.as_tensor(cal.upper[k]).reshape(-1).tolist()]
                                  for k in cal.lower},
                     "identified": {k: torch.as_tensor(v).reshape(-1).tolist() for k, v in cal.identified.items()}}
    result["joint_names"] = list(env_n.robot.joint_names)
    print(f"calibrated in {t_fit:.0f} s: {cal.message}", flush=True)
    true_sim = make_env(with_law(truth_params(truth)), 1, F64, args.robot).sim
    sims = {"nominal": (sim0, 0), "true parameters, nominal contact law": (true_sim, truth["delay"]),  # the start's law
            "calibrated": (s, cal.delay)}
    if args.floor:
        tsim = make_env(with_law(truth_params(truth)), 1, F64, args.robot).sim
        fl, t_fl = fit(tsim, ("contact_stiffness", "contact_damping"), (truth["delay"],))
        c = fl.simulator.contact.params
        result["floor_law"] = {"stiffness": float(c.stiffness), "damping": float(c.damping), "seconds": t_fl}
        sims["true parameters, contact law fitted with them (floor)"] = (fl.simulator, truth["delay"])
    result["prediction_error"] = {name: prediction(sim, held, d, args.horizon) for name, (sim, d) in sims.items()}

    # Parameters against the truth.
    m_err = np.array(calibrated["body_mass"]) / np.array(truth["mass"]) - 1
    d_err = np.array(calibrated["damping"]) / np.array(truth["damping"]) - 1
    result["parameter_error"] = {"trunk_mass": float(m_err[0]), "leg_mass_median_abs": float(np.median(abs(m_err[1:]))),
                                 "total_mass": float(np.sum(calibrated["body_mass"]) / true_total - 1),
                                 "damping_median_abs": float(np.median(abs(d_err))),
                                 "friction": calibrated["friction"] / truth["friction"] - 1,
                                 "motor_strength": calibrated["motor_strength"] / truth["strength"] - 1,
                                 "delay": [calibrated["delay"], truth["delay"]]}
    return calibrated


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="the hidden draw (calibration.reality's seed)")
    ap.add_argument("--robot", default="quadruped", choices=sorted(PRESETS),
                    help="the robot and its shipped policy (QuadrupedWalk.pretrained(robot=...)); its training "
                         "settings (QUADRUPED_WALK_SHAC, GO1_WALK_SHAC) are the fine-tuning's")
    ap.add_argument("--record", type=float, default=8.0, help="seconds of walk per recorded robot")
    ap.add_argument("--robots", type=int, default=4, help="robots recorded for the calibration (+2 held out)")
    ap.add_argument("--segment", type=int, default=25, help="steps per shooting window")
    ap.add_argument("--windows", type=int, default=32, help="shooting windows used")
    ap.add_argument("--iterations", type=int, default=8, help="Gauss-Newton iterations")
    ap.add_argument("--horizon", type=int, default=40, help="steps of each held-out prediction")
    ap.add_argument("--floor", action="store_true",
                    help="also fit the contact law alone with every other parameter at its true value")
    ap.add_argument("--params", default=",".join(FIT_PARAMS),
                    help="comma-separated parameters of the calibration (with the delay and the total-mass anchor)")
    ap.add_argument("--total-mass-std", type=float, default=None, metavar="KG",
                    help="standard deviation of the weighed total mass anchoring body_mass (ContactFit."
                         "total_mass_std; default 0.1 %% of the mass, a prior residual that the data can outweigh); "
                         "0 holds the weighed total exactly (a constraint, not a residual)")
    ap.add_argument("--start", choices=("nominal", "truth"), default="nominal",
                    help="the fit's starting point; 'truth' (with --iterations 0 and --delays truth) gives the "
                         "Cramer-Rao intervals at the hidden values: what the data can determine")
    ap.add_argument("--start-law", default=None, metavar="K,B",
                    help="the nominal guess's (the fit's start's) contact stiffness (N/m) and damping (N s/m), e.g. "
                         "1.3e4,500 (default the library's ContactParameters())")
    ap.add_argument("--no-adhesion", action="store_true",
                    help="calibrate (and step the calibrated sim) with NoAdhesionSimulator: no foot is pulled "
                         "onto the floor (the calibration's JSON gets \"no_adhesion\": true)")
    ap.add_argument("--joint-friction", type=float, default=None, metavar="NM",
                    help="the sims' joint Coulomb friction, N m, in the fit, its start and the calibrated and "
                         "true-parameter sims (default the URDF's, Go1 0.2 N m; the MuJoCo reality has none: 0 "
                         "removes that mismatch, 14th session)")
    ap.add_argument("--push-every", type=float, default=PUSH_EVERY, metavar="S",
                    help="seconds between the recording's pushes on the trunk (default %(default)g; 0: none); "
                         "calibration pieces lie between pushes, so longer windows need rarer pushes")
    ap.add_argument("--observe", default=None, metavar="CHANNELS",
                    help="comma-separated channels the fit compares (ContactFit.observe; default encoders and IMU: "
                         "joint_position,joint_velocity,base_orientation,base_angular_velocity); add "
                         "base_linear_velocity for a state estimator's base velocity (18th session)")
    ap.add_argument("--delays", default="0,1,2,3,4",
                    help="candidate control delays, 5 ms steps, comma-separated, or 'truth'")
    ap.add_argument("--calibrate-only", action="store_true",
                    help="stop after the calibration and its prediction table (write the JSON; a later run "
                         "takes it with --calibration)")
    ap.add_argument("--calibration", default=None, metavar="JSON",
                    help="take the calibration (and its tables) from an earlier run's JSON instead of recording "
                         "and fitting again")
    ap.add_argument("--updates", type=int, default=50, help="SHAC updates of each fine-tuning run (warm-up included)")
    ap.add_argument("--warmup", type=int, default=20,
                    help="of --updates, the first ones fit only the critic (the actor frozen)")
    ap.add_argument("--anchor", type=float, default=0.0,
                    help="after each actor step pull every actor weight this fraction of the way back to the "
                         "shipped one (a proximal penalty; 0: off)")
    ap.add_argument("--minutes", type=float, default=120.0,
                    help="wall-clock cap of each fine-tuning run (the record says how many updates ran)")
    ap.add_argument("--lr", type=float, default=3e-4, help="actor learning rate of the fine-tuning")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--train-seed", type=int, default=0)
    ap.add_argument("--nominal-only", default=None, metavar="PATH",
                    help="only fine-tune in the nominal sim (the same for every hidden draw) and save the policy "
                         "to PATH (a .pt state dict, with PATH.json for its training record)")
    ap.add_argument("--nominal-policy", default=None, metavar="PATH",
                    help="take the nominal fine-tuning from a --nominal-only run's PATH (waits for it) instead of "
                         "running it here")
    ap.add_argument("--deploy-only", action="store_true",
                    help="with --nominal-policy: no calibration or fine-tuning, only the shipped and that policy "
                         "deployed in this draw's reality")
    ap.add_argument("--command-range", default=None, metavar="LO,HI",
                    help="forward commands (m/s) the fine-tuning draws per episode (default the training's "
                         "0.2,0.8); e.g. 0.5,0.5 trains at the deployment's command only")
    ap.add_argument("--action-noise", type=float, default=None,
                    help="the fine-tuning's exploration noise (fraction of the action range; default the preset's 0.1)")
    ap.add_argument("--select-every", type=int, default=0,
                    help="before the first actor step (the shipped policy), every this many actor updates and at "
                         "the last, evaluate the policy in its own training sim (8 episodes x 6 s at the "
                         "deployment's command, another seed than the deployment's) and keep the best-tracking one "
                         "(0: keep the last)")
    ap.add_argument("--out", default=None,
                    help="JSON (default outputs/benchmarks/calibration_loop_s<seed>.json, _go1_s<seed> for Go1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*torch.jit.script.*")
    tag = "" if args.robot == "quadruped" else f"_{args.robot}"
    out = Path(args.out or f"outputs/benchmarks/calibration_loop{tag}_s{args.seed}.json")
    result = {"args": vars(args)}

    _, shipped = QuadrupedWalk.pretrained(1, robot=args.robot)
    if args.nominal_only:
        policy, info = finetune(shipped, None, args)
        torch.save(policy.state_dict(), args.nominal_only)
        Path(args.nominal_only + ".json").write_text(json.dumps(info))
        print(f"wrote {args.nominal_only}")
        return None
    env_n = make_env(None, args.robots + 2, robot_name=args.robot)
    truth = hidden_truth(args.seed, env_n.robot, args.robot)
    result["truth"] = truth
    dt = env_n.physics_dt
    if args.deploy_only:
        if not args.nominal_policy:
            raise SystemExit("--deploy-only needs --nominal-policy")
        policies = {"shipped": shipped, "nominal": load_nominal(shipped, args.nominal_policy, args.robot)[0]}
        result["rows"] = deploy(policies, truth, args, dt)
        result["train"] = {"nominal": load_nominal(shipped, args.nominal_policy, args.robot)[1]}
        for k, x in result["rows"].items():
            print(f"| {k} | {x['forward_speed']:.3f} | {x['speed_error']:.3f} | {x['upright']:.0%} |")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=float))
        print(f"wrote {out}")
        return result
    if args.calibration:
        prev = json.loads(Path(args.calibration).read_text())
        if prev["truth"] != json.loads(json.dumps(truth)):
            raise SystemExit(f"{args.calibration} is another hidden draw than --seed {args.seed}")
        for k in ("truth", "calibrated", "fit", "prediction_error", "parameter_error", "floor_law", "joint_names"):
            if k in prev:
                result[k] = prev[k]
        result["calibration_from"] = args.calibration
        calibrated = result["calibrated"]
    else:
        calibrated = calibrate(args, env_n, truth, result)
        if args.calibrate_only:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1, default=float))
            report_calibration(result)
            print(f"\nwrote {out}")
            return result

    # 3. Fine-tune in each sim; the shipped policy's walk as each predicts it.
    predicted, policies, train_info = {}, {"shipped": shipped}, {}
    for name, params in (("nominal", None), ("calibrated", calibrated)):
        m = make_env(params, args.episodes, robot_name=args.robot).evaluate(
            shipped, LT.COMMAND, seconds=args.seconds, seed=LT.SEED, settle=LT.SETTLE)
        predicted[name] = {k: float(m[k]) for k in ("forward_speed", "speed_error", "upright")}
    policies["calibrated"], train_info["calibrated"] = finetune(shipped, calibrated, args)
    if args.nominal_policy:
        policies["nominal"], train_info["nominal"] = load_nominal(shipped, args.nominal_policy, args.robot)
    else:
        policies["nominal"], train_info["nominal"] = finetune(shipped, None, args)
    policies = {k: policies[k] for k in ("shipped", "nominal", "calibrated")}

    # 4. Deploy in reality (hidden parameters, delay).
    rows = deploy(policies, truth, args, dt)
    result |= {"train": train_info, "rows": rows, "predicted": predicted}
    report(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The fine-tuned policies, for diagnostics (e.g. each one's walk in the other sim).
    torch.save({k: p.state_dict() for k, p in policies.items() if k != "shipped"}, out.with_suffix(".policies.pt"))
    out.write_text(json.dumps(result, indent=1, default=float))
    print(f"\nwrote {out}")
    return result


def load_nominal(shipped, path, robot: str | None = None):
    """A ``--nominal-only`` run's policy and record (waits until it is written)."""
    path = Path(path)
    while not Path(str(path) + ".json").exists():  # written after the weights
        time.sleep(20)
    info = json.loads(Path(str(path) + ".json").read_text())
    if robot is not None and info.get("robot", "quadruped") != robot:
        raise SystemExit(f"{path} was fine-tuned for the {info.get('robot', 'quadruped')}, not the {robot}")
    policy = copy.deepcopy(shipped)
    policy.load_state_dict(torch.load(path, weights_only=True))
    return policy.eval(), info | {"from": str(path)}


def deploy(policies: dict, truth: dict, args, dt: float) -> dict:
    """Each policy in reality (hidden parameters and delay), ``args.episodes`` x ``args.seconds``."""
    rows = {}
    for name, policy in policies.items():
        env, _ = QuadrupedWalk.pretrained(args.episodes, robot=args.robot)
        t0 = time.perf_counter()
        rows[name] = LT.run_mujoco(env, policy, dt=dt, seconds=args.seconds, seed=LT.SEED,
                                   model=LT.build_hidden(env, truth, dt), delay=truth["delay"])
        rows[name]["wall_s"] = time.perf_counter() - t0
    return rows


SELECT = {"episodes": 8, "seconds": 6.0, "seed": 123}  # --select-every's own-sim evaluation (not the deployment's)


def finetune(shipped, params: dict | None, args):
    """The shipped policy fine-tuned in the sim of ``params`` (``None``: nominal)
    by :func:`fine_tune_policy`: ``(policy, record)``. The record has the
    policy's walk in its own training sim (``args.episodes`` x
    ``args.seconds``, the deployment's command and seed)."""
    preset = PRESETS[args.robot]
    num_envs = int(preset.env_kwargs["num_envs"])
    select = None
    if getattr(args, "select_every", 0):
        select = (make_env(params, SELECT["episodes"], robot_name=args.robot), args.select_every)
    t0 = time.perf_counter()
    vx_range = tuple(float(x) for x in args.command_range.split(",")) if args.command_range else None
    policy, trainer, drift = fine_tune_policy(make_env(params, num_envs, robot_name=args.robot, vx_range=vx_range),
                                              shipped, updates=args.updates, warmup=args.warmup, lr=args.lr,
                                              anchor=args.anchor, seed=args.train_seed, minutes=args.minutes,
                                              config=preset.config, select=select, action_noise=args.action_noise)
    minutes = (time.perf_counter() - t0) / 60
    own = make_env(params, args.episodes, robot_name=args.robot).evaluate(policy, LT.COMMAND, seconds=args.seconds,
                                                                          seed=LT.SEED, settle=LT.SETTLE)
    rows = trainer.history
    info = {"robot": args.robot, "updates": trainer.updates_done, "warmup": args.warmup, "anchor": args.anchor,
            "command_range": list(vx_range) if vx_range else None, "action_noise": args.action_noise,
            "env_steps": trainer.env_steps, "lr": args.lr, "seed": args.train_seed, "minutes": minutes,
            "relative_weight_change": drift, "critic_loss": [r["critic_loss"] for r in rows],
            "window_reward": [r["window_reward"] for r in rows],
            "own_sim": {k: float(own[k]) for k in ("forward_speed", "speed_error", "upright")}}
    if select is not None:
        info["selection"] = trainer.selection
    name = "nominal" if params is None else "calibrated"
    kept = f", kept update {trainer.selection['kept']}" if select is not None else ""
    print(f"fine-tuned in the {name} sim: {trainer.updates_done} updates ({args.warmup} critic-only{kept}), "
          f"{minutes:.1f} min, weights moved {100 * drift:.2f} %; in its own sim "
          f"{info['own_sim']['forward_speed']:.3f} m/s, error {info['own_sim']['speed_error']:.3f}", flush=True)
    return policy, info


def fine_tune_policy(env, shipped, *, updates: int, warmup: int = 0, lr: float = 3e-4, anchor: float = 0.0,
                     seed: int = 0, minutes: float = math.inf, config=None, select=None,
                     action_noise: float | None = None):
    """Fine-tune a copy of ``shipped`` in ``env``: ``(policy, trainer, relative weight change)``.

    ``config`` (default ``QUADRUPED_WALK_SHAC.config``; Go1's is
    ``GO1_WALK_SHAC.config``) with the actor learning rate ``lr`` and the
    observation statistics frozen at the shipped ones. The critic
    starts fresh, so the first ``warmup`` of the ``updates`` fit only it
    (the actor's step is skipped: learning rate 0, and its Adam state starts
    after the warm-up): a random critic's value at the end of each 8-step
    window would otherwise steer the actor's first steps. With ``anchor > 0``
    every actor step is followed by ``w <- w - anchor * (w - w_shipped)``, a
    proximal pull towards the shipped weights. Stops early after
    ``minutes`` of wall-clock time.

    ``select = (eval_env, every)``: before the first actor step (the
    shipped policy, candidate 0), every ``every`` actor updates and after
    the last, the policy walks in ``eval_env`` (:data:`SELECT`'s episodes,
    seconds and seed, the 0.5 m/s command) and the one with the lowest
    speed error among those that all stayed upright (else the most upright)
    is returned; ``trainer.selection`` records every candidate (by its
    number of actor updates). This picks by tracking in the training sim
    only (never in reality). ``action_noise`` overrides the config's."""
    # No learning-rate schedule: the trainer's linear decay (GO1_WALK_SHAC's
    # lr_decay_updates) rewrites the actor's learning rate at every update,
    # which before the 11th session undid the warm-up's lr 0 and let the actor
    # follow the unfitted critic through the whole warm-up.
    config = dataclasses.replace((config or QUADRUPED_WALK_SHAC.config), lr=lr, seed=seed, normalize_obs=False,
                                 lr_decay_updates=None)
    if action_noise is not None:
        config = dataclasses.replace(config, action_noise=action_noise)
    t0 = time.perf_counter()
    trainer = PolicyTrainer(env, config=config, policy=copy.deepcopy(shipped).train())
    ref = [p.detach().clone() for p in trainer.policy.parameters()]
    for group in trainer.actor_opt.param_groups:
        group["lr"] = 0.0
    candidates, best = [], None

    def consider(k):
        nonlocal best
        eval_env, _ = select
        policy = trainer.policy.eval()
        m = eval_env.evaluate(policy, LT.COMMAND, seconds=SELECT["seconds"], seed=SELECT["seed"], settle=LT.SETTLE)
        trainer.policy.train()
        row = {"update": k, "forward_speed": float(m["forward_speed"]), "speed_error": float(m["speed_error"]),
               "upright": float(m["upright"])}
        candidates.append(row)
        score = (-row["upright"], row["speed_error"] if math.isfinite(row["speed_error"]) else math.inf)
        if best is None or score < best[0]:
            best = (score, k, copy.deepcopy(trainer.policy.state_dict()))
        print(f"  update {k}: own sim {row['forward_speed']:.3f} m/s, error {row['speed_error']:.3f}, "
              f"upright {row['upright']:.0%}", flush=True)

    for k in range(updates):
        if k == warmup:
            if select is not None:
                consider(0)  # the shipped policy (no actor step yet) is a candidate too
            trainer.actor_opt = torch.optim.Adam(trainer.policy.parameters(), lr=lr, betas=config.betas)
        trainer.history.append(trainer.update())
        if k >= warmup and anchor > 0:
            with torch.no_grad():
                for p, p0 in zip(trainer.policy.parameters(), ref):
                    p.sub_(anchor * (p - p0))
        stop = time.perf_counter() - t0 > 60 * minutes
        if select is not None and k >= warmup and ((k + 1 - warmup) % select[1] == 0 or k == updates - 1 or stop):
            consider(k + 1 - warmup)
        if stop:
            break
    if select is not None and best is not None:
        trainer.policy.load_state_dict(best[2])
        trainer.selection = {"kept": best[1], "candidates": candidates, **SELECT}
    policy = trainer.policy.eval()
    with torch.no_grad():
        drift = float(torch.sqrt(sum((p - p0).pow(2).sum() for p, p0 in zip(policy.parameters(), ref))
                                 / sum(p0.pow(2).sum() for p0 in ref)))
    return policy, trainer, drift


def report_calibration(r: dict) -> None:
    """The calibration's parameters and held-out prediction table."""
    a, t, c = r["args"], r["truth"], r["calibrated"]
    print(f"\n# calibration loop, hidden draw {a['seed']}: friction {t['friction']:.3f}, strength "
          f"{t['strength']:.3f}, delay {t['delay']} x 5 ms, total mass {sum(t['mass']):.3f} kg\n")
    pe = r["parameter_error"]
    print(f"calibration ({r['fit']['windows']} windows of {a['segment']} steps, {r['fit']['seconds']:.0f} s, "
          f"{r['fit']['message']}): trunk mass {100 * pe['trunk_mass']:+.1f} %, leg masses median "
          f"{100 * pe['leg_mass_median_abs']:.0f} % off, friction {c['friction']:.3f} ({100 * pe['friction']:+.1f} %), "
          f"strength {c['motor_strength']:.3f} ({100 * pe['motor_strength']:+.1f} %), delay {c['delay']} (truth "
          f"{t['delay']}), law {c['stiffness']:.3g} N/m, {c['contact_damping']:.3g} N s/m; not identified: "
          f"{', '.join(r['fit']['not_identified']) or 'none'}")
    if "floor_law" in r:
        print(f"floor law (others at the truth): {r['floor_law']['stiffness']:.3g} N/m, "
              f"{r['floor_law']['damping']:.3g} N s/m")
    e = r["prediction_error"]
    n = e["nominal"]
    print(f"\n| held-out {a['horizon']}-step walking prediction | joint angles, rms rad | base orientation, rms rad "
          "| base angular velocity, rms rad/s | ratio nominal / this |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for k, (j, o, *w) in e.items():
        w = w[0] if w else math.nan
        print(f"| {k} | {j:.4g} | {o:.4g} | {w:.4g} | {n[0] / j:.2f}x, {n[1] / o:.2f}x"
              + (f", {n[2] / w:.2f}x |" if len(n) > 2 else " |"))
    if "damping" in r["fit"].get("params", ()):
        lo, hi = r["fit"]["interval"]["damping"]
        print(f"\n| joint damping (N m s/rad) | truth | fitted | error | 95 % interval | identified |")
        print("| --- | ---: | ---: | ---: | --- | --- |")
        names = r.get("joint_names") or [str(i) for i in range(len(t["damping"]))]
        for i, (name, d, f) in enumerate(zip(names, t["damping"], c["damping"])):
            ok = r["fit"]["identified"]["damping"][i]
            print(f"| {name} | {d:.3f} | {f:.3f} | {100 * (f / d - 1):+.0f} % | [{lo[i]:.3g}, {hi[i]:.3g}] | "
                  f"{'yes' if ok else 'NO'} |")


def report(r: dict) -> None:
    report_calibration(r)
    a = r["args"]
    tr = r["train"]
    print(f"\n| policy, deployed in reality | forward speed (m/s) | speed error (m/s) | upright |")
    print("| --- | ---: | ---: | ---: |")
    label = {"shipped": "shipped (no fine-tuning)",
             "nominal": f"fine-tuned in the nominal sim ({tr['nominal']['updates']} updates)",
             "calibrated": f"fine-tuned in the calibrated sim ({tr['calibrated']['updates']} updates)"}
    for k, x in r["rows"].items():
        print(f"| {label[k]} | {x['forward_speed']:.3f} | {x['speed_error']:.3f} | {x['upright']:.0%} |")
    print("\n| the shipped policy, same episodes | forward speed (m/s) | speed error (m/s) | upright |")
    print("| --- | ---: | ---: | ---: |")
    x = r["rows"]["shipped"]
    print(f"| in reality | {x['forward_speed']:.3f} | {x['speed_error']:.3f} | {x['upright']:.0%} |")
    for k, x in r["predicted"].items():
        print(f"| predicted by the {k} sim | {x['forward_speed']:.3f} | {x['speed_error']:.3f} | {x['upright']:.0%} |")


if __name__ == "__main__":
    main()

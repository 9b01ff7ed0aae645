"""Sim-to-sim transfer: the shipped quadruped (or Go1) policy walking in MuJoCo.

The policy ``QuadrupedWalk.pretrained()`` (``--robot go1``: ``pretrained(robot="go1")``) learnt in backdrive's contact
simulator is run, unchanged, in MuJoCo on the same URDF
(``benchmarks/_mujoco_contact.py`` builds the model: the same 2 cm foot
spheres, the only colliding geoms, on a plane at ``z = 0``):

* ``matched`` contact: MuJoCo's soft constraint set up as backdrive's
  penalty law (stiffness 4e4 N/m, damping 1e4 N s/m, friction 0.75,
  ``scheme="implicit"``, the stiction slope of a 1 cm/s regularised Coulomb
  law at the standing load), elliptic cone;
* ``native`` contact: MuJoCo's defaults (``solref (0.02, 1)``, ``solimp
  (0.9, 0.95, 0.001, 0.5, 2)``, pyramidal cone, ``impratio`` 1), the same
  friction 0.75: what a MuJoCo user would run.

Both with the env's servos (``kp`` 40 N m/rad, ``kd`` 1 N m s/rad, MuJoCo
position actuators with ``implicitfast`` integration, whose servo damping
is implicit like backdrive's), the URDF effort limits (MuJoCo clamps at the
limit, backdrive bends smoothly from 90 % of it), control at 50 Hz and
MuJoCo at ``--dt`` (default 5 ms, backdrive's substep; 4 steps per control
step) and at 2 ms. Joint limits are off in both. ``--sweep`` adds MuJoCo
rows with one physical setting off nominal (friction, contact stiffness,
servo ``kp``, over the ranges of ``backdrive.envs.Randomization``).

The policy's observation is computed here from MuJoCo's ``qpos``/``qvel``
(:func:`mujoco_observation`, independent of backdrive's ``observe``):
joints reordered by name and taken relative to the standing pose, MuJoCo's
free-joint angular velocity (already in the base frame), gravity in the
base frame from the quaternion, the last action, the command, the trot
clock ``(cos, sin)`` advancing at the env's 3 Hz, and (the shipped policy
is privileged) the base linear velocity turned from MuJoCo's world frame
into the base frame and the base height. The servo targets are the env's:
``q_stand + 0.5 a + gait_offsets(phase)``. ``tests/test_locomotion_transfer.py``
checks the observation against ``QuadrupedWalk.observe`` for the same
physical state.

The episodes start from the env's randomised initial states (``reset(seed)``:
yaw, joint noise, base velocity, clock phase), the same ones backdrive's
``evaluate`` uses in the same process, under the command 0.5 m/s forward.
Metrics as ``QuadrupedWalk.evaluate``: mean base-frame forward speed of the
upright robots after the first 2 s, its mean base-frame yaw rate (JSON
``yaw_rate``), and the fraction that never fell (gravity more than 60
degrees off the base's -z axis, or the base below half the standing height).

    python benchmarks/locomotion_transfer.py                  # 16 x 10 s
    python benchmarks/locomotion_transfer.py --sweep          # + friction, stiffness, kp off nominal
    python benchmarks/locomotion_transfer.py --robot go1      # the shipped Go1 policy (GO1_WALK_SHAC_SLIP)
    python benchmarks/locomotion_transfer.py --sweep --checkpoint outputs/dr/quadruped_walk.pt \
        --preset quadruped_walk_shac_dr                       # a policy trained with domain randomisation

``--checkpoint`` runs another policy (a ``train_policy`` checkpoint, e.g.
``examples/quadruped_walk.py --preset quadruped_walk_shac_dr``'s) in the env
of ``--preset`` without its randomisation: every row is nominal physics
except the ``--sweep`` row's one setting.

``--blind-actor`` runs a blind actor (``benchmarks/locomotion.py
--blind-actor --checkpoint PATH``: trained asymmetrically, its first-layer
weights from the privileged columns, the base linear velocity and height,
exactly zero). The checkpoint is a plain ``MLPPolicy`` of the privileged
env's 51 inputs, so the observation is still computed from MuJoCo's state as
above; the option refuses a policy whose weights from those columns are not
all zero (``require_blind``), and every row gets a ``blind_check``: the
largest change of any action, over every step of its episodes, when the
privileged columns are replaced by zeros (``BlindCheck``; 0.0 for a blind
actor, so it walked on what a robot measures). Without the option a
checkpoint is still checked and the table says whether it is blind.

    python benchmarks/locomotion_transfer.py --robot go1 --checkpoint go1_blind.pt \
        --preset go1_walk_shac --blind-actor --sweep    # a blind Go1 actor

Writes ``outputs/benchmarks/locomotion_transfer.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _mujoco_contact as mc  # noqa: E402

from backdrive.envs import QuadrupedWalk  # noqa: E402

COMMAND = (0.5, 0.0, 0.0)
EPISODES, SEED, SECONDS, SETTLE = 16, 999, 10.0, 2.0


def build(env: QuadrupedWalk, contact: str = "matched", dt: float = 0.005, *, friction: float | None = None,
          stiffness_scale: float = 1.0, motor_strength: float = 1.0):
    """The MuJoCo model of ``env``'s robot with its servos and effort limits.

    Args:
        env: a :class:`QuadrupedWalk` on the shipped quadruped or Go1 (its
            robot, ``kp``, ``kd``, nominal friction and effort limits are used).
        contact: ``"matched"`` (backdrive's penalty law) or ``"native"``
            (MuJoCo's default soft contact, pyramidal cone).
        dt: MuJoCo's time step, s; ``env.dt`` must be a multiple of it.
        friction: Coulomb coefficient (``None``: the env's nominal 0.75).
        stiffness_scale: factor on the matched contact stiffness (4e4 N/m).
        motor_strength: factor on the servos' ``kp`` (``kd`` unchanged), as
            :class:`backdrive.envs.Randomization`'s ``motor_strength``.

    Returns:
        ``(model, perm)``: ``perm`` maps MuJoCo's joint order to backdrive's
        (``mujoco_values[perm]`` is in ``env.robot.joint_names`` order).
    """
    if contact not in ("matched", "native"):
        raise ValueError(f"contact must be 'matched' or 'native', got {contact!r}")
    p = env.nominal_contact
    mu = float(p.friction) if friction is None else float(friction)
    common = {"dt": dt, "kp": env.kp * motor_strength, "kd": env.kd, "friction": mu, "integrator": "implicitfast"}
    if contact == "matched":
        model = mc.build_model(env.robot_name, stiffness=float(p.stiffness) * stiffness_scale, damping=float(p.damping),
                               scheme="implicit", stiction_width=float(p.stiction_width), **common)
    else:
        model = mc.build_model(env.robot_name, native=True, cone="pyramidal", **common)
    perm = mc.joint_permutation(model, env.robot.joint_names)
    limit = np.empty(12)
    limit[perm] = env.robot.effort_limit.double().numpy()
    model.actuator_forcelimited[:] = 1
    model.actuator_forcerange[:] = np.stack([-limit, limit], -1)
    return model, perm


def build_hidden(env: QuadrupedWalk, truth: dict, dt: float = 0.005):
    """:func:`build`'s ``native`` model with hidden physical parameters: a
    "real" robot for sim-to-real studies (``benchmarks/calibration_loop.py``).

    Args:
        env: as for :func:`build`.
        truth: ``mass`` (per body, kg, in ``env.robot.body_names`` order),
            ``damping`` (per joint, N m s/rad, ``env.robot.joint_names``
            order), ``strength`` (factor on both servo gains), ``friction``
            and optionally ``armature`` (kg m^2 per joint, default 0.01).
        dt: MuJoCo's time step, s.

    Returns:
        ``(model, perm)`` as :func:`build`, with MuJoCo's elliptic friction
        cone (as ``benchmarks/calibration.py``'s reality).
    """
    import mujoco

    s = float(truth["strength"])
    model, perm = build(env, "native", dt, friction=float(truth["friction"]), motor_strength=s)
    model.actuator_biasprm[:, 2] = -env.kd * s  # build scales kp only
    model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    for name, m in zip(env.robot.body_names, truth["mass"], strict=True):
        model.body_mass[model.body(name).id] = float(m)
    armature = float(truth.get("armature", 0.01))
    for name, d in zip(env.robot.joint_names, truth["damping"], strict=True):
        adr = model.jnt_dofadr[model.joint(name).id]
        model.dof_damping[adr] = float(d)
        model.dof_armature[adr] = armature
    return model, perm


def env_order(env: QuadrupedWalk, perm: np.ndarray) -> np.ndarray:
    """MuJoCo joint indices in the env's joint order (legs FL, FR, RL, RR, each
    hip, thigh, calf): ``mujoco_values[env_order(env, perm)]`` is in the order
    of the policy's observation and action. ``perm`` (from :func:`build`)
    gives the robot's own joint order, which is the env's for the shipped
    quadruped but not for Go1 (its URDF lists the legs FR, FL, RR, RL)."""
    return np.asarray(perm)[env.joint_index.cpu().numpy()]


def to_mujoco(q: np.ndarray, v: np.ndarray, perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Backdrive ``(q (..., 19), v (..., 18))`` as MuJoCo ``(qpos, qvel)``:
    joints put in MuJoCo's order, the base linear velocity into the world frame."""
    qpos, qvel = np.array(q, dtype=float), np.array(v, dtype=float)
    qpos[..., 7 + perm] = q[..., 7:]
    qvel[..., 6 + perm] = v[..., 6:]
    qvel[..., :3] = np.einsum("...ij,...j->...i", mc.quat_to_matrix(qpos[..., 3:7]), v[..., :3])
    return qpos, qvel


def mujoco_observation(qpos: np.ndarray, qvel: np.ndarray, perm: np.ndarray, q_stand: np.ndarray,
                       last_action: np.ndarray, command: np.ndarray, phase: np.ndarray,
                       privileged: bool) -> np.ndarray:
    """The policy's observation ``(..., 47 or 51)`` from MuJoCo's state.

    Args:
        qpos: ``(..., 19)`` MuJoCo positions (world base position, wxyz
            quaternion, joints in MuJoCo's order). qvel: ``(..., 18)``
            (world-frame base linear velocity, base-frame angular velocity,
            joint rates).
        perm: MuJoCo's joint indices in the env's joint order
            (:func:`env_order`). q_stand: ``(12,)`` standing pose, rad (env order).
        last_action: ``(..., 12)``. command: ``(..., 3)``. phase: ``(..., 1)`` rad.
        privileged: append the base-frame linear velocity and the base height.
    """
    R = mc.quat_to_matrix(qpos[..., 3:7] / np.linalg.norm(qpos[..., 3:7], axis=-1, keepdims=True))
    gravity = -R[..., 2, :]  # R^T (0, 0, -1)
    parts = [qpos[..., 7:][..., perm] - q_stand, qvel[..., 6:][..., perm], qvel[..., 3:6], gravity,
             last_action, command, np.cos(phase), np.sin(phase)]
    if privileged:
        parts += [np.einsum("...ji,...j->...i", R, qvel[..., :3]), qpos[..., 2:3]]
    return np.concatenate(parts, -1)


@torch.no_grad()
def run_mujoco(env: QuadrupedWalk, policy, contact: str = "matched", dt: float = 0.005, *,
               seconds: float = SECONDS, seed: int = SEED, settle: float = SETTLE, model=None, delay: int = 0,
               command=COMMAND, target_speed: float | None = None, **physics) -> dict:
    """``policy`` in MuJoCo from ``env``'s reset states (``seed``); metrics as ``env.evaluate``.

    Args:
        model: ``(model, perm)`` to run instead of :func:`build`'s (e.g.
            :func:`build_hidden`'s); its time step must be ``dt``.
        delay: control delay in MuJoCo steps, at most ``env.dt / dt``: each
            new servo target takes effect ``delay`` steps into its control
            period (the previous target holds until then).
        command: the ``(vx, vy, yaw)`` command the policy is given.
        target_speed: the forward speed ``speed_error`` is measured against
            (default ``command[0]``; e.g. the wanted speed when ``command``
            was trimmed to reach it in a simulator).
        physics: :func:`build`'s ``friction``, ``stiffness_scale``,
            ``motor_strength`` (not with ``model``).
    """
    import mujoco

    if model is None:
        model, perm = build(env, contact, dt, **physics)
    elif physics:
        raise ValueError(f"physics settings {sorted(physics)} with a given model")
    else:
        model, perm = model
        if abs(model.opt.timestep - dt) > 1e-12:
            raise ValueError(f"the model's time step {model.opt.timestep} is not dt {dt}")
    eperm = env_order(env, perm)  # the policy's joint order (perm: the robot's, for the state)
    substeps = int(round(env.dt / dt))
    if abs(substeps * dt - env.dt) > 1e-9:
        raise ValueError(f"env.dt {env.dt} is not a multiple of dt {dt}")
    if not (isinstance(delay, int) and 0 <= delay <= substeps):
        raise ValueError(f"delay must be a whole number of steps in [0, {substeps}], got {delay!r}")
    command = tuple(float(c) for c in command)
    wanted = command[0] if target_speed is None else float(target_speed)
    env.reset(seed=seed)
    env.set_command(torch.as_tensor(command, dtype=env.dtype))
    parts = {k: t.double().numpy().copy() for k, t in env.split(env.state).items()}
    n = env.num_envs
    qpos0, qvel0 = to_mujoco(parts["q"], parts["v"], perm)
    datas = [mujoco.MjData(model) for _ in range(n)]
    for d, qp, qv in zip(datas, qpos0, qvel0):
        d.qpos[:], d.qvel[:] = qp, qv
        mujoco.mj_forward(model, d)
    q_stand = env.q_stand.double().numpy()
    last, cmd, phase = parts["last_action"], parts["command"], parts["phase"]
    alive = np.ones(n, dtype=bool)
    steps = int(round(seconds / env.dt))
    vx, wz, heights = [], [], []
    dphase = 2 * math.pi * env.gait_frequency * env.dt
    # The target in force when the episode starts (the reset state's last action, the clock one period back).
    previous = (env.q_stand + env.action_scale * torch.as_tensor(last, dtype=env.dtype)
                + env.gait_offsets(torch.as_tensor(phase - dphase, dtype=env.dtype))).double().numpy()
    for _ in range(steps):
        qpos = np.stack([d.qpos for d in datas])
        qvel = np.stack([d.qvel for d in datas])
        obs = mujoco_observation(qpos, qvel, eperm, q_stand, last, cmd, phase, env.privileged)
        action = policy(torch.as_tensor(obs, dtype=env.dtype)).clamp(-1.0, 1.0)
        target = (env.q_stand + env.action_scale * action
                  + env.gait_offsets(torch.as_tensor(phase, dtype=env.dtype))).double().numpy()
        for i, d in enumerate(datas):
            if not alive[i]:
                continue
            for k in range(substeps):
                d.ctrl[eperm] = previous[i] if k < delay else target[i]
                mujoco.mj_step(model, d)
        previous = target
        last = action.double().numpy()
        phase = np.remainder(phase + dphase, 2 * math.pi)
        qpos = np.stack([d.qpos for d in datas])
        qvel = np.stack([d.qvel for d in datas])
        R = mc.quat_to_matrix(qpos[:, 3:7] / np.linalg.norm(qpos[:, 3:7], axis=-1, keepdims=True))
        fell = (-R[:, 2, 2] > -0.5) | (qpos[:, 2] < 0.5 * env.stand_height) | ~np.isfinite(qpos).all(-1)
        alive &= ~fell
        v_base = np.einsum("nji,nj->ni", R, qvel[:, :3])
        vx.append(np.where(alive, v_base[:, 0], np.nan))
        wz.append(np.where(alive, qvel[:, 5], np.nan))  # base-frame yaw rate, as env.evaluate
        heights.append(np.where(alive, qpos[:, 2], np.nan))
    V = np.array(vx)[int(round(settle / env.dt)):]
    per_env = np.nanmean(V, 0) if alive.any() else np.full(n, np.nan)
    return {
        "forward_speed": float(np.nanmean(V)) if np.isfinite(V).any() else math.nan,
        "speed_error": float(np.nanmean(np.abs(per_env - wanted))) if alive.any() else math.nan,
        "upright": float(alive.mean()),
        "mean_height": float(np.nanmean(np.array(heights))),
        "yaw_rate": float(np.nanmean(np.array(wz)[int(round(settle / env.dt)):])) if alive.any() else math.nan,
    }


#: The privileged observation columns of ``QuadrupedWalk(privileged=True)`` (the last 4 of 51: base
#: linear velocity in the base frame, base height), which a robot does not measure and a blind actor
#: ignores (``benchmarks/locomotion.py``'s ``PRIVILEGED``).
PRIVILEGED = slice(47, 51)


def privileged_weight(policy) -> float:
    """The largest ``|weight|`` of ``policy``'s first layer from the :data:`PRIVILEGED` columns
    (0.0 exactly for a blind actor; ``nan`` for a policy of another input size)."""
    first = policy.net[0].weight
    if first.shape[1] != PRIVILEGED.stop:
        return math.nan
    return float(first[:, PRIVILEGED].detach().abs().max())


def require_blind(policy, name: str) -> None:
    """Check that ``policy`` (an ``MLPPolicy``) ignores the privileged observations.

    Raises:
        InputError: its first layer does not take the privileged env's 51
            inputs, or some weight from a privileged column is not exactly 0
            (the message names the column and its largest weight).
    """
    from backdrive._errors import InputError

    first = policy.net[0].weight
    if first.shape[1] != PRIVILEGED.stop:
        raise InputError(f"--blind-actor: {name} takes {first.shape[1]} observations, not the privileged "
                         f"env's {PRIVILEGED.stop} (its columns {PRIVILEGED.start}-{PRIVILEGED.stop - 1} "
                         "are the ones a blind actor ignores)")
    w = first[:, PRIVILEGED].detach().abs().amax(0)
    if bool((w > 0).any()):
        labels = ("base velocity x", "base velocity y", "base velocity z", "base height")
        col = int(w.argmax())
        raise InputError(f"--blind-actor: {name} is not a blind actor: its first-layer weights from "
                         f"observation {PRIVILEGED.start + col} ({labels[col]}) reach {float(w[col]):.3g} "
                         "(a blind actor's are exactly 0; train one with benchmarks/locomotion.py "
                         "--blind-actor --checkpoint PATH)")


class BlindCheck:
    """``policy``, also run with the :data:`PRIVILEGED` columns of each observation replaced by zeros:
    ``worst`` is the largest change of any action so far (exactly 0.0 for a blind actor).
    The actions returned are the policy's on the full observation."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.worst = 0.0

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        action = self.policy(obs)
        cut = obs.clone()
        cut[..., PRIVILEGED] = 0.0
        self.worst = max(self.worst, float((self.policy(cut) - action).abs().max()))
        return action


def load_actor(robot: str, episodes: int, checkpoint: str | None = None, preset: str = "quadruped_walk_shac",
               blind: bool = False):
    """``(env, policy)``: the shipped policy of ``robot``, or ``checkpoint``'s in ``preset``'s env
    without randomisation; with ``blind``, the policy must be a blind actor (:func:`require_blind`)."""
    if checkpoint is None:
        env, policy = QuadrupedWalk.pretrained(episodes, robot=robot)
    else:
        from backdrive.optim import load_policy
        from backdrive.optim._policy.presets import get_preset

        kwargs = {k: v for k, v in get_preset(preset).env_kwargs.items() if k not in ("num_envs", "randomization")}
        env = QuadrupedWalk(episodes, **kwargs)
        policy = load_policy(checkpoint).to(dtype=env.dtype)
    if blind:
        require_blind(policy, f"checkpoint {checkpoint!r}" if checkpoint else f"the shipped {robot} policy")
    return env, policy


def run_backdrive(env: QuadrupedWalk, policy, *, seconds: float = SECONDS, seed: int = SEED) -> dict:
    m = env.evaluate(policy, COMMAND, seconds=seconds, seed=seed, settle=SETTLE)
    h = m["q"][1:, :, 2]
    return {k: m[k] for k in ("forward_speed", "speed_error", "upright", "yaw_rate", "distance")} | {
        "mean_height": float(h.mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=EPISODES)
    ap.add_argument("--seconds", type=float, default=SECONDS)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--dt", type=float, default=0.005, help="MuJoCo time step, s")
    ap.add_argument("--sweep", action="store_true",
                    help="also MuJoCo with friction, contact stiffness and servo kp off nominal")
    ap.add_argument("--out", default="outputs/benchmarks/locomotion_transfer.json")
    ap.add_argument("--robot", default="quadruped", choices=["quadruped", "go1"],
                    help="the shipped policy of this robot (QuadrupedWalk.pretrained(robot=...))")
    ap.add_argument("--checkpoint", default=None, help="a train_policy checkpoint (default: the shipped policy)")
    ap.add_argument("--preset", default="quadruped_walk_shac", help="with --checkpoint: the env it was trained in")
    ap.add_argument("--blind-actor", action="store_true",
                    help="the checkpoint must be a blind actor (no weights from the base velocity and height); "
                         "each row reports blind_check, the largest action change when those inputs are zeroed")
    args = ap.parse_args()
    torch.set_num_threads(1)
    env, policy = load_actor(args.robot, args.episodes, args.checkpoint, args.preset, args.blind_actor)
    rows, labels = {}, {}
    t0 = time.perf_counter()
    check = BlindCheck(policy)
    rows["backdrive"] = run_backdrive(env, check, seconds=args.seconds, seed=args.seed)
    rows["backdrive"]["wall_s"] = time.perf_counter() - t0
    rows["backdrive"]["blind_check"] = check.worst
    labels["backdrive"] = "backdrive (5 ms contact substeps)"
    cases = [(f"mujoco_{c}_{dt * 1e3:g}ms", f"MuJoCo {dt * 1e3:g} ms, "
              + ("matched contact" if c == "matched" else "MuJoCo default contact"), c, dt, {})
             for dt in dict.fromkeys((args.dt, 0.002)) for c in ("matched", "native")]
    if args.sweep:
        # One physical setting off nominal at a time, matched contact otherwise:
        # the ranges of backdrive.envs.Randomization (the policy was trained without it).
        for label, kw in (("friction 0.5", {"friction": 0.5}), ("friction 1.25", {"friction": 1.25}),
                          ("contact stiffness x0.5", {"stiffness_scale": 0.5}),
                          ("contact stiffness x2", {"stiffness_scale": 2.0}),
                          ("servo kp x0.9", {"motor_strength": 0.9}), ("servo kp x1.1", {"motor_strength": 1.1})):
            key = "mujoco_" + label.replace(" ", "_")
            cases.append((key, f"MuJoCo {args.dt * 1e3:g} ms, matched, {label}", "matched", args.dt, kw))
    for key, label, contact, dt, kw in cases:
        t0 = time.perf_counter()
        check = BlindCheck(policy)
        rows[key] = run_mujoco(env, check, contact, dt, seconds=args.seconds, seed=args.seed, **kw)
        rows[key]["wall_s"] = time.perf_counter() - t0
        rows[key]["blind_check"] = check.worst
        labels[key] = label
    ref = rows["backdrive"]["forward_speed"]
    for r in rows.values():
        r["gap_percent"] = 100.0 * (r["forward_speed"] - ref) / ref
    print(f"{args.episodes} episodes x {args.seconds:g} s, command {COMMAND[0]} m/s forward, seed {args.seed}")
    w = privileged_weight(policy)
    worst = max(r["blind_check"] for r in rows.values())
    print(("blind actor" if w == 0.0 else "privileged actor") + f": largest first-layer |weight| from the base "
          f"velocity and height {w:.3g}; largest action change with them zeroed, any step of any row: {worst:.3g}\n")
    print("| simulator | forward speed (m/s) | gap to backdrive | speed error (m/s) | upright | mean base height (m) "
          "| yaw rate (rad/s) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, r in rows.items():
        gap = "-" if k == "backdrive" else f"{r['gap_percent']:+.1f} %"
        print(f"| {labels[k]} | {r['forward_speed']:.3f} | {gap} | {r['speed_error']:.3f} | "
              f"{r['upright']:.0%} | {r['mean_height']:.3f} | {r['yaw_rate']:+.2f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "command": COMMAND, "privileged_weight": w, "rows": rows},
                              indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

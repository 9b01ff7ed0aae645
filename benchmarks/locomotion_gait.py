"""Gait statistics of a walking policy in backdrive and in MuJoCo, measured the same way.

Where does a policy's MuJoCo speed differ from backdrive's? This runs the
policy as ``benchmarks/locomotion_transfer.py`` does (16 episodes x 10 s at
0.5 m/s from the env's reset states, seed 999; MuJoCo's matched contact at
5 and 2 ms and its default contact at 5 ms) and, at every control step of
the upright time after 2 s, turns MuJoCo's state into backdrive's ``(q, v)``
and measures both engines' feet with backdrive's kinematics:

* ``stance``: fraction of foot samples within 1.5 mm of the ground (the
  sphere's lowest point, ``z - radius``);
* ``slip``: mean horizontal foot speed of those samples, m/s;
* ``sink``: their mean depth below the ground, mm (the penalty law's and
  MuJoCo's soft contact's penetration);
* ``swing``: mean over feet and episodes of the highest foot lift, mm;
* ``feet down``: mean number of feet in stance;
* base height, base-frame forward speed, RMS action and the mean thigh and
  calf actions (the policy's offsets on the trot generator).

    python benchmarks/locomotion_gait.py --robot go1            # the shipped Go1 policy
    python benchmarks/locomotion_gait.py --robot go1 --checkpoint outputs/examples/quadruped_walk.pt \
        --preset go1_walk_shac                                  # another policy in a preset's env

Samples are taken at the 50 Hz control rate, so ``stance`` and ``slip`` are
coarse; they compare engines and policies, not absolute gait timing.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import locomotion_transfer as lt  # noqa: E402

from backdrive.kinematics import frame_jacobian, frame_transforms  # noqa: E402

CONTACT_MM = 1.5


def gait_stats(env, Q: np.ndarray, V: np.ndarray, A: np.ndarray, alive: np.ndarray, radius: float,
               settle: float = lt.SETTLE) -> dict:
    """Statistics of ``Q (T, N, 19)``, ``V (T, N, 18)`` (backdrive's convention), actions ``A (T, N, 12)``
    (env order) over the upright robots (``alive (T, N)``) after ``settle`` s."""
    skip = int(round(settle / env.dt))
    Q, V, A, alive = Q[skip:], V[skip:], A[skip:], alive[skip:]
    T, N = Q.shape[:2]
    q = torch.as_tensor(Q.reshape(-1, 19), dtype=env.dtype)
    v = torch.as_tensor(V.reshape(-1, 18), dtype=env.dtype)
    _, p = frame_transforms(env.robot, q, env.feet)
    vel = torch.stack([(frame_jacobian(env.robot, q, f) @ v[..., None])[..., :3, 0] for f in env.feet], -2)
    h = p[..., 2].reshape(T, N, 4).double().numpy() - radius
    vxy = vel[..., :2].norm(dim=-1).reshape(T, N, 4).double().numpy()
    up = np.broadcast_to(alive[..., None], h.shape)
    c = (h < CONTACT_MM * 1e-3) & up
    lift = np.where(up, h, -np.inf).max(0)
    return {
        "stance": float(c.sum() / up.sum()),
        "slip": float(vxy[c].mean()),
        "sink": float(1e3 * (-h[c]).mean()),
        "swing": float(1e3 * lift[np.isfinite(lift)].mean()),
        "feet_down": float(c.sum(-1)[alive].mean()),
        "height": float(Q[..., 2][alive].mean()),
        "vx": float(V[..., 0][alive].mean()),
        "act_rms": float(np.sqrt((A[alive] ** 2).mean())),
        "thigh": float(A[..., 1::3][alive].mean()),
        "calf": float(A[..., 2::3][alive].mean()),
    }


def _fallen(env, q: np.ndarray) -> np.ndarray:
    R = lt.mc.quat_to_matrix(q[:, 3:7] / np.linalg.norm(q[:, 3:7], axis=-1, keepdims=True))
    return (-R[:, 2, 2] > -0.5) | (q[:, 2] < 0.5 * env.stand_height) | ~np.isfinite(q).all(-1)


@torch.no_grad()
def record_backdrive(env, policy, seconds: float = lt.SECONDS, seed: int = lt.SEED):
    """``(Q, V, A, alive)`` of ``policy`` in backdrive (as ``env.evaluate``)."""
    autoreset, env.autoreset = env.autoreset, False
    try:
        env.reset(seed=seed)
        obs = env.set_command(torch.as_tensor(lt.COMMAND, dtype=env.dtype))
        alive = torch.ones(env.num_envs, dtype=torch.bool)
        Q, V, A, up = [], [], [], []
        for _ in range(int(round(seconds / env.dt))):
            a = policy(obs).clamp(-1.0, 1.0)
            obs, _, term, _, _ = env.step(a)
            alive &= ~term
            s = env.split(env.state)
            Q.append(s["q"].double().numpy().copy())
            V.append(s["v"].double().numpy().copy())
            A.append(a.double().numpy())
            up.append(alive.numpy().copy())
    finally:
        env.autoreset = autoreset
    return np.array(Q), np.array(V), np.array(A), np.array(up)


@torch.no_grad()
def record_mujoco(env, policy, contact: str = "matched", dt: float = 0.005, seconds: float = lt.SECONDS,
                  seed: int = lt.SEED, **physics):
    """``(Q, V, A, alive)`` of ``policy`` in MuJoCo (as ``locomotion_transfer.run_mujoco``, no delay),
    the state in backdrive's convention (joints in the robot's order, base velocity in the base frame)."""
    import mujoco

    model, perm = lt.build(env, contact, dt, **physics)
    eperm = lt.env_order(env, perm)
    substeps = int(round(env.dt / dt))
    env.reset(seed=seed)
    env.set_command(torch.as_tensor(lt.COMMAND, dtype=env.dtype))
    parts = {k: t.double().numpy().copy() for k, t in env.split(env.state).items()}
    qpos0, qvel0 = lt.to_mujoco(parts["q"], parts["v"], perm)
    datas = [mujoco.MjData(model) for _ in range(env.num_envs)]
    for d, qp, qv in zip(datas, qpos0, qvel0):
        d.qpos[:], d.qvel[:] = qp, qv
        mujoco.mj_forward(model, d)
    q_stand = env.q_stand.double().numpy()
    last, cmd, phase = parts["last_action"], parts["command"], parts["phase"]
    dphase = 2 * math.pi * env.gait_frequency * env.dt
    alive = np.ones(env.num_envs, dtype=bool)
    Q, V, A, up = [], [], [], []
    for _ in range(int(round(seconds / env.dt))):
        qpos = np.stack([d.qpos for d in datas])
        qvel = np.stack([d.qvel for d in datas])
        obs = lt.mujoco_observation(qpos, qvel, eperm, q_stand, last, cmd, phase, env.privileged)
        a = policy(torch.as_tensor(obs, dtype=env.dtype)).clamp(-1.0, 1.0)
        target = (env.q_stand + env.action_scale * a
                  + env.gait_offsets(torch.as_tensor(phase, dtype=env.dtype))).double().numpy()
        for i, d in enumerate(datas):
            if alive[i]:
                d.ctrl[eperm] = target[i]
                for _ in range(substeps):
                    mujoco.mj_step(model, d)
        last = a.double().numpy()
        phase = np.remainder(phase + dphase, 2 * math.pi)
        qpos = np.stack([d.qpos for d in datas])
        qvel = np.stack([d.qvel for d in datas])
        R = lt.mc.quat_to_matrix(qpos[:, 3:7] / np.linalg.norm(qpos[:, 3:7], axis=-1, keepdims=True))
        q, v = qpos.copy(), qvel.copy()
        q[:, 7:], v[:, 6:] = qpos[:, 7 + perm], qvel[:, 6 + perm]
        v[:, :3] = np.einsum("nji,nj->ni", R, qvel[:, :3])
        alive &= ~_fallen(env, q)
        Q.append(q)
        V.append(v)
        A.append(last)
        up.append(alive.copy())
    return np.array(Q), np.array(V), np.array(A), np.array(up)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--robot", default="quadruped", choices=["quadruped", "go1"])
    ap.add_argument("--checkpoint", default=None, help="a train_policy checkpoint (default: the shipped policy)")
    ap.add_argument("--preset", default="quadruped_walk_shac", help="with --checkpoint: the env it was trained in")
    ap.add_argument("--episodes", type=int, default=lt.EPISODES)
    args = ap.parse_args()
    torch.set_num_threads(1)
    env, policy = lt.load_actor(args.robot, args.episodes, args.checkpoint, args.preset)
    radius = float(lt.mc.ROBOTS[env.robot_name].foot_radius)
    rows = {"backdrive (5 ms)": gait_stats(env, *record_backdrive(env, policy), radius)}
    for label, contact, dt in (("MuJoCo 5 ms, matched", "matched", 0.005), ("MuJoCo 2 ms, matched", "matched", 0.002),
                               ("MuJoCo 5 ms, default contact", "native", 0.005)):
        rows[label] = gait_stats(env, *record_mujoco(env, policy, contact, dt), radius)
    keys = list(next(iter(rows.values())))
    print("| engine | " + " | ".join(keys) + " |")
    print("| --- |" + " ---: |" * len(keys))
    for label, r in rows.items():
        print(f"| {label} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |")


if __name__ == "__main__":
    main()

"""The unilateral implicit contact step (13th session, issue 11): its effect and its cost.

``ContactModel(unilateral=True)`` (the default) drops the contact points whose
applied normal force comes out negative and solves the step again;
``unilateral=False`` is the step before (adhesive). Both in ONE process.

``effect``: the shipped walking policy of each robot (``QuadrupedWalk.pretrained``,
``--episodes`` copies x ``--seconds`` at the 0.5 m/s command, reset seed
``--seed``) with the switch on and off: forward speed, upright fraction, and
over every foot-substep the fraction of rows dropped (on: applied normal
force exactly 0 where the law's damping is active) or pulling (off: applied
normal force < 0, with its mean and minimum).

``cost``: a 100-substep stretch of that walk (recorded from the on run,
``--episodes`` copies tiled to the batch with joint velocities perturbed by
1e-3 rad/s) replayed open-loop through the env's ``Simulator``: the rollout
without gradient, and with the gradient of the final base height + 0.1 x
with respect to all PD targets. On and off alternate within each repeat; CPU
time of this process, minimum over the repeats, one thread. Prints the
on/off ratios and each one's gradient/forward ratio.

``mujoco`` (14th session): the MuJoCo standing agreement of
``tests/test_contact_mujoco.py`` (the robot dropped ``--drops`` m onto the
floor, PD-held, 3 s of 2 ms steps, MuJoCo with the matched contact law of
``benchmarks/_mujoco_contact.py``) with backdrive's switch on and off: base
height and foot centres apart (mm), both engines' ground reaction / weight
at the end, the base heights' largest difference over the run (the
landing), and over the run the foot-steps dropped (on) or pulling (off)
with the most negative applied normal force.

    python benchmarks/contact_unilateral.py effect [--robots quadruped,go1]
    python benchmarks/contact_unilateral.py cost [--robots quadruped,go1] [--batches 1,1024] \\
        [--dtypes float32,float64] [--repeats 3]
    python benchmarks/contact_unilateral.py mujoco [--robots quadruped,go1] [--drops 0.01,0.05]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from backdrive.contact import ContactModel
from backdrive.envs import QuadrupedWalk
from backdrive.sim import Simulator, State

COMMAND = (0.5, 0.0, 0.0)


def make_env(robot: str, n: int, unilateral: bool, dtype=torch.float32):
    env, policy = QuadrupedWalk.pretrained(n, robot=robot, dtype=dtype)
    env.contact.unilateral = unilateral  # the env's Simulator holds this ContactModel

    def contact_model(*a, **k):  # the per-step models of randomised copies
        return ContactModel(*a, unilateral=unilateral, **k)

    env._ContactModel = contact_model
    return env, policy


class Recorder:
    """Wraps ``Simulator._advance_contact`` (class level): the applied normal
    forces, the law's damping indicator and, optionally, the inputs."""

    def __init__(self, keep_inputs: bool = False):
        self.fn, self.cn, self.inputs, self.keep = [], [], [], keep_inputs
        self.orig = Simulator._advance_contact

    def __enter__(self):
        rec, orig = self, self.orig

        def advance(sim, q, v, u):
            out = orig(sim, q, v, u)
            rec.fn.append(out[3].normal_force.detach().reshape(-1))
            rec.cn.append(out[3]._c_n.detach().expand_as(out[3].normal_force).reshape(-1))
            if rec.keep:
                rec.inputs.append((q.detach().clone(), v.detach().clone(), u.detach().clone()))
            return out

        Simulator._advance_contact = advance
        return self

    def __exit__(self, *exc):
        Simulator._advance_contact = self.orig


def effect(args) -> dict:
    out = {}
    for robot in args.robots.split(","):
        for uni in (True, False):
            env, policy = make_env(robot, args.episodes, uni)
            with Recorder() as rec, torch.no_grad():
                m = env.evaluate(policy, COMMAND, seconds=args.seconds, seed=args.seed)
            fn, cn = torch.cat(rec.fn), torch.cat(rec.cn)
            fn, cn = fn[torch.isfinite(fn)], cn[torch.isfinite(fn)]
            neg = fn[fn < 0]
            row = {
                "forward_speed": float(m["forward_speed"]), "upright": float(m["upright"]),
                "foot_substeps": int(fn.numel()),
                "dropped_fraction": float(((fn == 0) & (cn > 0)).double().mean()),
                "pulling_fraction": float((fn < 0).double().mean()),
                "pulling_mean_N": float(neg.mean()) if neg.numel() else 0.0,
                "pulling_min_N": float(neg.min()) if neg.numel() else 0.0,
            }
            out[f"{robot} unilateral={uni}"] = row
            print(robot, "on " if uni else "off", json.dumps(row), flush=True)
    return out


def stretch(robot: str, n: int, dtype, steps: int):
    """``(q0, v0, U (n, steps, 12))`` of the shipped walk after 2 s, and the env (on)."""
    env, policy = make_env(robot, n, True, dtype)
    env.reset(seed=0)
    obs = env.set_command(torch.as_tensor(COMMAND, dtype=dtype))
    with Recorder(keep_inputs=True) as rec, torch.no_grad():
        while len(rec.inputs) < int(2.0 / env.physics_dt) + steps:
            obs = env.step(policy(obs))[0]
    start = int(2.0 / env.physics_dt)
    q0, v0, _ = rec.inputs[start]
    U = torch.stack([u for _, _, u in rec.inputs[start : start + steps]], 1)
    return env, q0, v0, U


def cost(args) -> dict:
    torch.set_num_threads(1)
    out = {}
    for robot in args.robots.split(","):
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            env, q0, v0, U = stretch(robot, args.episodes, dtype, args.steps)
            sim = env.sim
            for batch in (int(b) for b in args.batches.split(",")):
                reps = -(-batch // q0.shape[0])
                q, v, Ub = (x.repeat(reps, *[1] * (x.ndim - 1))[:batch] for x in (q0, v0, U))
                g = torch.Generator().manual_seed(0)
                v = v + 1e-3 * torch.randn(v.shape, generator=g, dtype=dtype) * (torch.arange(v.shape[-1]) >= 6)

                def forward():
                    with torch.no_grad():
                        sim.rollout(State(q, v), Ub, check_finite=False)

                def gradient():
                    u = Ub.clone().requires_grad_(True)
                    tr = sim.rollout(State(q, v), u, check_finite=False)
                    (tr.q[:, -1, 2] + 0.1 * tr.q[:, -1, 0]).sum().backward()

                best = {}
                for _ in range(args.repeats):
                    for uni in (True, False):
                        sim.contact.unilateral = uni
                        for name, fn in (("forward", forward), ("gradient", gradient)):
                            t0 = time.process_time()
                            fn()
                            t = time.process_time() - t0
                            key = (uni, name)
                            best[key] = min(best.get(key, t), t)
                sim.contact.unilateral = True
                row = {
                    "forward_on_s": best[(True, "forward")], "forward_off_s": best[(False, "forward")],
                    "gradient_on_s": best[(True, "gradient")], "gradient_off_s": best[(False, "gradient")],
                }
                row["forward_on/off"] = row["forward_on_s"] / row["forward_off_s"]
                row["gradient_on/off"] = row["gradient_on_s"] / row["gradient_off_s"]
                row["on: gradient/forward"] = row["gradient_on_s"] / row["forward_on_s"]
                row["off: gradient/forward"] = row["gradient_off_s"] / row["forward_off_s"]
                key = f"{robot} {str(dtype)[6:]} batch {batch}"
                out[key] = row
                print(key, json.dumps({k: round(x, 4) for k, x in row.items()}), flush=True)
    return out


def mujoco_agreement(args) -> dict:
    """The MuJoCo standing comparison (``tests/test_contact_mujoco.py``) with the switch on and off."""
    import sys

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _mujoco_contact as mc
    import contact as bench

    torch.set_num_threads(1)
    dt, duration = 2e-3, 3.0
    out = {}
    for robot in args.robots.split(","):
        model = mc.build_model(robot, dt=dt, stiction_width=bench.CONTACT["stiction_width"], kp=bench.KP, kd=bench.KD)
        for drop in (float(d) for d in args.drops.split(",")):
            ref = mc.settle(model, robot, drop=drop, duration=duration)
            for uni in (True, False):
                bd, contact, step = bench._backdrive_setup(robot)
                contact.unilateral = uni
                qpos, ctrl = mc.drop_state(model, robot, drop)
                q, v, target = bench.to_backdrive_state(model, bd, qpos, np.zeros(model.nv), ctrl)
                dropped = pulling = 0
                fmin = 0.0
                heights = [float(q[2])]
                with torch.no_grad():
                    for _ in range(int(round(duration / dt))):
                        q, v, res = step(q, v, target, dt, result=True)
                        heights.append(float(q[2]))
                        active = res._c_n > 0  # the law's damping acts: the foot is in contact
                        dropped += int(((res.normal_force == 0) & active).sum())
                        pulling += int((res.normal_force < 0).sum())
                        fmin = min(fmin, float(res.normal_force.min()))
                    res = contact.forces(bd, q, v)
                weight = float(bd.total_mass) * mc.GRAVITY
                centres = (res.point + mc.ROBOTS[robot].foot_radius * res.normal).numpy()
                order = [int(np.argmin(np.linalg.norm(ref.feet[-1] - c, axis=-1))) for c in centres]
                row = {
                    "base height apart (mm)": 1e3 * abs(float(q[2]) - ref.base_height[-1]),
                    "base height apart, most over the run (mm)": 1e3 * float(np.abs(np.array(heights) - ref.base_height).max()),
                    "feet apart (mm)": 1e3 * float(np.abs(ref.feet[-1][order] - centres).max()),
                    "GRF/weight mujoco": float(ref.normal_force[-1] / ref.weight),
                    "GRF/weight backdrive": float(res.normal_force.sum()) / weight,
                    "foot-steps dropped": dropped, "foot-steps pulling": pulling, "min applied f_n (N)": fmin,
                    "foot-steps": 4 * int(round(duration / dt)),
                }
                key = f"{robot} drop {drop} m, switch {'on' if uni else 'off'}"
                out[key] = row
                print(key, json.dumps({k: round(x, 6) if isinstance(x, float) else x for k, x in row.items()}), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("effect", "cost", "mujoco"))
    ap.add_argument("--robots", default="quadruped,go1")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", default="1,1024")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--drops", default="0.01,0.05")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    result = {"effect": effect, "cost": cost, "mujoco": mujoco_agreement}[args.what](args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": result}, indent=1))


if __name__ == "__main__":
    main()

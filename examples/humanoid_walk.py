"""The G1 humanoid asked to walk forward at 0.3 m/s: a stepping prior, optionally with a SHAC residual on top.

``backdrive.envs.HumanoidBalance`` with a forward velocity command
(``command_ranges={"vx": ...}``; the reward's ``tracking_lin`` term then
tracks it) and the stepping prior ``gait=`` (a clock that lifts the feet in
turn through hip, knee and ankle pitch offsets, sways the pelvis over the
stance foot through the hip and ankle rolls and strides in proportion to the
command, keeps the pelvis's lean out of the stepping: ``torso``,
``level`` and ``roll``, and steers back onto the commanded heading with a
differential stride: ``steer``, with a short double support: ``support``;
:data:`backdrive.envs._humanoid.GAIT_KEYS`), with the capture-point
balance prior kept (its velocity signals are taken relative to the command,
so walking is not fought as a push). No pushes.

    python examples/humanoid_walk.py                   # the prior alone (zero action) on held-out seeds
    python examples/humanoid_walk.py --updates 100 --out /tmp/walk   # SHAC residual on the prior (log,
                                                       # checkpoint, a screen every 20 updates), then the evaluation
    python examples/humanoid_walk.py --policy /tmp/walk/humanoid_walk.pt   # evaluate a trained checkpoint
    python examples/humanoid_walk.py --gait '{"frequency": 1.5, "lift": 0.15}'   # another stepping prior
    python examples/humanoid_walk.py --command 0 --gait '{"frequency": 1.5, "lift": 0.15, "sway": 0.05}'  # in place

Prints, per evaluation seed, the fraction of robots upright over the
episode, the mean forward speed of the upright ones (base frame), the mean
distance travelled along the start heading (upright ones, m; the fallen
ones until their fall), and over every robot the mean time upright, the
straight-line distance from the start, how far the heading turned and how
far it drifted from the commanded heading (``--yaw-rate`` turns it), and when
the fallen ones fell. docs/locomotion.md (*HumanoidBalance*, *Walking*) has
the measured numbers. Needs example-robot-data.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import torch

from backdrive.envs import G1_CAPTURE_FEEDBACK, HumanoidBalance
from backdrive.optim import train_policy
from backdrive.optim._policy.presets import HUMANOID_CAPTURE_SHAC
from backdrive.spatial import quat_apply

#: The stepping prior screened for the 0.3 m/s command (docs/locomotion.md): the 8th session's
#: ``{"frequency": 1.5, "lift": 0.15, "stride": 0.3}``, the 9th session's lean terms (the stance hip
#: against the pelvis's lean, the lean taken off the swing hip, forward and sideways) and the 10th
#: session's heading feedback (``steer``: a differential stride on the heading error), with a shorter
#: stride and a stronger ``torso`` term, and the 11th session's double support (``support`` 0.2: no lift
#: while ``|sin(phase)| <= 0.2``, which cut the heading drift on both held-out seeds). The 10th
#: session's prior is this one without ``support``; the 9th session's:
#: ``{"frequency": 1.5, "lift": 0.15, "stride": 0.3, "torso": 1.0, "level": 1.0, "roll": 1.0}``.
GAIT = {"frequency": 1.5, "lift": 0.15, "stride": 0.25, "torso": 1.5, "level": 1.0, "roll": 1.0, "steer": 0.1,
        "support": 0.2}
COMMAND = 0.3
#: Held-out evaluation seeds (the screens used seed 1).
EVAL_SEEDS = (999, 1000)


def make_env(num_envs: int, gait: dict, **overrides) -> HumanoidBalance:
    kwargs = dict(privileged=True, push_velocity=0.0, feet="sole", balance_feedback=dict(G1_CAPTURE_FEEDBACK),
                  gait=gait, command_ranges={"vx": (0.0, COMMAND)})
    return HumanoidBalance(num_envs, **{**kwargs, **overrides})


def walk_metrics(env: HumanoidBalance, policy, seconds: float, seed: int, command: float = COMMAND,
                 yaw_rate: float = 0.0) -> dict:
    """Upright fraction, forward speed while up, distance along the start heading (upright copies, and the
    fallen ones until their fall), time upright, straight-line distance and heading turned (every copy), the
    heading's drift from the commanded one, falls."""
    m = env.evaluate(policy, command=(command, 0.0, yaw_rate), seconds=seconds, seed=seed)
    q, fall = m["q"], m["fall_step"]
    yaw0 = 2 * torch.atan2(q[0, :, 6], q[0, :, 3])  # the reset turns about z only
    # Each copy's last upright state: the end, or the step of its fall.
    last = torch.where(fall < 0, torch.full_like(fall, q.shape[0] - 1), fall)
    d = q[last, torch.arange(q.shape[1]), :2] - q[0, :, :2]
    along = d[:, 0] * torch.cos(yaw0) + d[:, 1] * torch.sin(yaw0)
    up = fall < 0
    falls = []
    for i in torch.nonzero(~up)[:, 0].tolist():
        # Where the pelvis's up axis points just after the fall, in the start heading's frame.
        z = quat_apply(q[int(fall[i]) + 1, i, 3:7], q.new_tensor([0.0, 0.0, 1.0]))
        c, s = math.cos(float(yaw0[i])), math.sin(float(yaw0[i]))
        fx, fy = c * float(z[0]) + s * float(z[1]), -s * float(z[0]) + c * float(z[1])
        way = ("forward" if fx > 0 else "back") if abs(fx) > abs(fy) else ("left" if fy > 0 else "right")
        falls.append((round(float(fall[i]) * env.dt, 2), way))
    # Heading drift: the pelvis's turn (yaw) from the start to the last upright state, rad.
    yaw = 2 * torch.atan2(q[..., 6], q[..., 3])
    dyaw = torch.remainder(yaw[1:] - yaw[:-1] + math.pi, 2 * math.pi) - math.pi
    turn = torch.stack([dyaw[:int(last[i]), i].sum() for i in range(q.shape[1])])
    # Drift: the turn minus the commanded one (yaw rate x time upright), rad.
    drift = turn - yaw_rate * last.to(turn.dtype) * env.dt
    # Time upright: the episode's length for the upright copies, the fall's time (as in falls) for the others.
    up_time = last.double() * env.dt
    return {"seed": seed, "upright": m["upright"], "forward_speed": m["forward_speed"],
            "distance": float(along[up].mean()) if bool(up.any()) else float("nan"),
            "distance_before_fall": float(along[~up].mean()) if bool((~up).any()) else float("nan"),
            "displacement": float(torch.linalg.vector_norm(d, dim=-1).mean()), "time_up": float(up_time.mean()),
            "turn": float(turn.abs().mean()), "drift": float(drift.abs().mean()),
            "max_drift": float(drift.abs().max()), "drift_each": [round(float(x), 2) for x in drift],
            "progress": float((along[up] / seconds).mean()) if bool(up.any()) else float("nan"),
            "falls": sorted(falls), "height": m["height"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gait", type=json.loads, default=GAIT, help="the stepping prior (JSON)")
    parser.add_argument("--updates", type=int, default=0, help="SHAC updates of a residual (0: the prior alone)")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument("--command", type=float, default=COMMAND, help="forward speed, m/s (0: step in place)")
    parser.add_argument("--yaw-rate", type=float, default=0.0, help="commanded yaw rate, rad/s")
    parser.add_argument("--eval-seeds", type=int, nargs="+", default=list(EVAL_SEEDS),
                        help="evaluation seeds (the screens: 1)")
    parser.add_argument("--out", type=Path, default=None,
                        help="training: folder for the CSV log, the checkpoint and the screening evaluations")
    parser.add_argument("--eval-every", type=int, default=20,
                        help="training: updates between screening evaluations (8 robots x 4 s, seed 7)")
    parser.add_argument("--minutes", type=float, default=None, help="training: stop after this much wall time")
    parser.add_argument("--policy", type=Path, default=None,
                        help="evaluate this training checkpoint's policy instead of training one")
    args = parser.parse_args()
    torch.set_num_threads(1)

    policy = None
    if args.policy is not None:
        from backdrive.optim import load_policy

        policy = load_policy(args.policy).eval()
    elif args.updates:
        env = make_env(32, args.gait)
        # The balance residual's settings (HUMANOID_CAPTURE_SHAC: 8-step windows, actor lr 2e-4, noise 0.05).
        config = dataclasses.replace(HUMANOID_CAPTURE_SHAC.config, seed=args.seed)
        screen = make_env(8, args.gait)
        start = time.perf_counter()

        def eval_fn(pol) -> float:
            with torch.no_grad():
                r = walk_metrics(screen, pol, 4.0, 7, args.command)
            print(f"  screen (8 x 4 s, seed 7) at {(time.perf_counter() - start) / 60:.1f} min: upright "
                  f"{r['upright'] * 100:.0f}%, forward speed {r['forward_speed']:.3f} m/s, falls {r['falls']}",
                  flush=True)
            return r["upright"]

        def callback(row) -> bool:
            if int(row["update"]) % 5 == 0:
                print(f"  update {int(row['update'])}: window reward {row['window_reward']:.3f}, episode return "
                      f"{row['train_return']:.1f}, {row['wall_s'] / 60:.1f} min", flush=True)
            return args.minutes is not None and row["wall_s"] > 60.0 * args.minutes

        out = {}
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            out = {"log_csv": args.out / "humanoid_walk.csv", "checkpoint": args.out / "humanoid_walk.pt",
                   "checkpoint_every": args.eval_every}
        trainer = train_policy(env, config=config, updates=args.updates, num_threads=1, eval_fn=eval_fn,
                               eval_every=args.eval_every, callback=callback, **out)
        if args.out is not None:
            trainer.save(out["checkpoint"])
        print(f"trained {trainer.updates_done} updates, {trainer.env_steps:,} env steps, "
              f"{(time.perf_counter() - start) / 60:.1f} min; last window reward "
              f"{trainer.history[-1]['window_reward']:.3f}", flush=True)
        policy = trainer.policy.eval()
    # The evaluation's command ranges cover the asked command (training draws from 0-0.3 m/s, no turning).
    test = make_env(args.episodes, args.gait,
                    command_ranges={"vx": (min(0.0, args.command), max(COMMAND, args.command)),
                                    "yaw": (min(0.0, args.yaw_rate), max(0.0, args.yaw_rate))})
    name = "zero action (the stepping and balance priors alone)" if policy is None else "SHAC residual"
    for seed in args.eval_seeds:
        with torch.no_grad():
            r = walk_metrics(test, policy, args.seconds, seed, args.command, args.yaw_rate)
        print(f"{name}, command {args.command} m/s, yaw rate {args.yaw_rate} rad/s, gait {json.dumps(args.gait)}, {args.episodes} x "
              f"{args.seconds:g} s, seed {seed}: upright {r['upright'] * 100:.0f}%, forward speed while up "
              f"{r['forward_speed']:.3f} m/s, distance of the upright ones {r['distance']:.2f} m, of the fallen "
              f"ones until their fall {r['distance_before_fall']:.2f} m; every robot: mean time upright "
              f"{r['time_up']:.2f} s, straight-line distance from the start {r['displacement']:.2f} m, heading "
              f"turned by {r['turn']:.2f} rad, heading drift from the commanded one {r['drift']:.2f} rad (largest "
              f"{r['max_drift']:.2f}; each {r['drift_each']}); upright ones: speed along the start heading "
              f"{r['progress']:.3f} m/s; falls (s, direction) {r['falls']}", flush=True)


if __name__ == "__main__":
    main()

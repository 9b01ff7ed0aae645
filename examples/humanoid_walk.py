"""The G1 humanoid asked to walk forward at 0.3 m/s: a stepping prior, optionally with a SHAC residual on top.

``backdrive.envs.HumanoidBalance`` with a forward velocity command
(``command_ranges={"vx": ...}``; the reward's ``tracking_lin`` term then
tracks it) and the stepping prior ``gait=`` (a clock that lifts the feet in
turn through hip, knee and ankle pitch offsets, sways the pelvis over the
stance foot through the hip and ankle rolls and strides in proportion to the
command; :data:`backdrive.envs._humanoid.GAIT_KEYS`), with the capture-point
balance prior kept (its velocity signals are taken relative to the command,
so walking is not fought as a push). No pushes.

    python examples/humanoid_walk.py                   # the prior alone (zero action) on held-out seeds
    python examples/humanoid_walk.py --updates 60      # SHAC residual on the prior, then the same evaluation
    python examples/humanoid_walk.py --gait '{"frequency": 1.5, "lift": 0.15}'   # another stepping prior

Prints, per evaluation seed, the fraction of robots upright over the
episode, the mean forward speed of the upright ones (base frame) and the
mean distance travelled along the start heading (upright ones, m), and when
the fallen ones fell. docs/locomotion.md (*HumanoidBalance*, *Walking*) has
the measured numbers. Needs example-robot-data.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch

from backdrive.envs import G1_CAPTURE_FEEDBACK, HumanoidBalance
from backdrive.optim import train_policy
from backdrive.optim._policy.presets import HUMANOID_CAPTURE_SHAC

#: The stepping prior screened for the 0.3 m/s command (docs/locomotion.md).
GAIT = {"frequency": 1.5, "lift": 0.15, "sway": 0.0, "stride": 0.3}
COMMAND = 0.3
#: Held-out evaluation seeds (the screens used seed 1).
EVAL_SEEDS = (999, 1000)


def make_env(num_envs: int, gait: dict, **overrides) -> HumanoidBalance:
    kwargs = dict(privileged=True, push_velocity=0.0, feet="sole", balance_feedback=dict(G1_CAPTURE_FEEDBACK),
                  gait=gait, command_ranges={"vx": (0.0, COMMAND)})
    return HumanoidBalance(num_envs, **{**kwargs, **overrides})


def walk_metrics(env: HumanoidBalance, policy, seconds: float, seed: int) -> dict:
    m = env.evaluate(policy, command=(COMMAND, 0.0, 0.0), seconds=seconds, seed=seed)
    q, fall = m["q"], m["fall_step"]
    yaw0 = 2 * torch.atan2(q[0, :, 6], q[0, :, 3])  # the reset turns about z only
    d = q[-1, :, :2] - q[0, :, :2]
    along = d[:, 0] * torch.cos(yaw0) + d[:, 1] * torch.sin(yaw0)
    up = fall < 0
    return {"seed": seed, "upright": m["upright"], "forward_speed": m["forward_speed"],
            "distance": float(along[up].mean()) if bool(up.any()) else float("nan"),
            "fall_times_s": sorted(round(float(t) * env.dt, 2) for t in fall[~up]),
            "height": m["height"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gait", type=json.loads, default=GAIT, help="the stepping prior (JSON)")
    parser.add_argument("--updates", type=int, default=0, help="SHAC updates of a residual (0: the prior alone)")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    args = parser.parse_args()
    torch.set_num_threads(1)

    policy = None
    if args.updates:
        env = make_env(32, args.gait)
        # The balance residual's settings (HUMANOID_CAPTURE_SHAC: 8-step windows, actor lr 2e-4, noise 0.05).
        config = dataclasses.replace(HUMANOID_CAPTURE_SHAC.config, seed=args.seed)
        t = time.perf_counter()
        trainer = train_policy(env, config=config, updates=args.updates, num_threads=1)
        print(f"trained {trainer.updates_done} updates, {trainer.env_steps:,} env steps, "
              f"{(time.perf_counter() - t) / 60:.1f} min; last window reward "
              f"{trainer.history[-1]['train_return']:.3f}", flush=True)
        policy = trainer.policy.eval()
    test = make_env(args.episodes, args.gait)
    name = "zero action (the stepping and balance priors alone)" if policy is None else "SHAC residual"
    for seed in EVAL_SEEDS:
        with torch.no_grad():
            r = walk_metrics(test, policy, args.seconds, seed)
        print(f"{name}, command {COMMAND} m/s, gait {json.dumps(args.gait)}, {args.episodes} x {args.seconds:g} s, "
              f"seed {seed}: upright {r['upright'] * 100:.0f}%, forward speed {r['forward_speed']:.3f} m/s, "
              f"distance {r['distance']:.2f} m, falls at {r['fall_times_s']} s", flush=True)


if __name__ == "__main__":
    main()

"""How many robots stay up through the calibration loop's recorded walk, per hidden draw.

``benchmarks/calibration_loop.py`` step 1 records ``--robots + 2`` (default
6) robots walking for 8 s in its MuJoCo "reality" (hidden masses, friction,
damping, motor strength, control delay) under random forward commands of
0.2-0.8 m/s, random PD-target offsets and a 20-40 N push on the trunk every
second (``calibration_loop.record_walk``). This runs that recording alone,
with the same draws and recording seeds as the loop's ``calibrate`` (hidden
draw ``s``, recording seed ``s + 1``), for the shipped policy or a
``train_policy`` checkpoint, and prints how many robots stayed up for the
whole recording in each draw. MuJoCo only: about 2 CPU s per draw.

    python benchmarks/calibration_loop_survival.py --robot go1                    # the shipped Go1 policy
    python benchmarks/calibration_loop_survival.py --robot go1 --checkpoint outputs/go1dr/quadruped_walk.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_loop as CL  # noqa: E402
import locomotion_transfer as LT  # noqa: E402

from backdrive.envs import QuadrupedWalk  # noqa: E402
from backdrive.optim import load_policy  # noqa: E402


def survival(policy, robot: str, draws, robots: int = 6, seconds: float = 8.0) -> list[int]:
    """Robots (of ``robots``) up for all ``seconds`` of the loop's recording, per hidden draw."""
    out = []
    for seed in draws:
        env = CL.make_env(None, robots, robot_name=robot)
        truth = CL.hidden_truth(seed, env.robot, robot)
        mj = LT.build_hidden(env, truth, env.physics_dt)
        _, alive = CL.record_walk(mj, env, policy, seconds, seed + 1, truth["delay"])
        out.append(int(alive.sum()))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--robot", default="go1", choices=sorted(CL.PRESETS))
    ap.add_argument("--checkpoint", default=None, help="a train_policy checkpoint (default: the shipped policy)")
    ap.add_argument("--draws", default="0,1,2,3,4", help="hidden draws (calibration.reality's seeds), comma-separated")
    ap.add_argument("--robots", type=int, default=6, help="robots recorded (the loop's --robots + 2)")
    ap.add_argument("--seconds", type=float, default=8.0, help="the loop's --record")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.checkpoint is None:
        _, policy = QuadrupedWalk.pretrained(1, robot=args.robot)
    else:
        policy = load_policy(args.checkpoint)
    draws = [int(s) for s in args.draws.split(",")]
    up = survival(policy, args.robot, draws, args.robots, args.seconds)
    print(f"{args.checkpoint or 'shipped policy'} ({args.robot}): robots up for {args.seconds:g} s of the recording, "
          f"per hidden draw {draws}: {up}, total {sum(up)}/{args.robots * len(draws)}")


if __name__ == "__main__":
    main()

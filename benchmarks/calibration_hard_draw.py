"""Choose a "hard" Go1 reality draw for the calibration loop by a stated rule (issue 13, 14th session).

The calibrated-against-nominal fine-tuning comparison can only separate the
arms where the nominal guess's sim misjudges how fast a policy walks in
reality. The rule, fixed before any fine-tuning number of the 14th session:
among the seeded draws ``0 .. --draws - 1`` of ``calibration.reality``
(masses x0.8-1.2, foot friction 0.4-1.0, joint damping 0.05-0.3 N m s/rad,
motor strength 0.8-1.0, delay 1-3 x 5 ms), take the one where the shipped
Go1 policy's forward speed in reality (MuJoCo, ``--episodes`` x
``--seconds`` at 0.5 m/s, reset seed 123: ``calibration_loop.SELECT``'s
episodes) is furthest from its speed in the nominal guess's sim (the 13th
session's soft law 1.3e4 N/m, 500 N s/m, no adhesion): the draw where the
nominal sim's prediction of the walking speed is worst.

    python benchmarks/calibration_hard_draw.py --draws 16 --out benchmarks/results/go1_hard_draw_14th.json

Only the shipped policy runs here (no fine-tuning); the nominal sim is the
same for every draw.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_loop as CL  # noqa: E402
import locomotion_transfer as LT  # noqa: E402

from backdrive.envs import QuadrupedWalk  # noqa: E402

LAW = (1.3e4, 500.0)  # the 13th session's soft law (the nominal guess's)


def nominal_soft(robot) -> dict:
    p = CL.nominal_params(robot)
    p["stiffness"], p["contact_damping"] = LAW
    p["no_adhesion"] = True
    return p


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=16, help="screen draws 0 .. DRAWS-1")
    ap.add_argument("--episodes", type=int, default=CL.SELECT["episodes"])
    ap.add_argument("--seconds", type=float, default=CL.SELECT["seconds"])
    ap.add_argument("--reset-seed", type=int, default=CL.SELECT["seed"])
    ap.add_argument("--out", default="outputs/benchmarks/go1_hard_draw.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    env, policy = QuadrupedWalk.pretrained(1, robot="go1")
    robot = env.robot
    t0 = time.perf_counter()
    m = CL.make_env(nominal_soft(robot), args.episodes, robot_name="go1").evaluate(
        policy, LT.COMMAND, seconds=args.seconds, seed=args.reset_seed, settle=LT.SETTLE)
    v_nom = float(m["forward_speed"])
    print(f"nominal sim (soft law, no adhesion): {v_nom:.3f} m/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    total0 = float(robot.body_mass.sum())
    result = {"args": vars(args), "nominal_sim_speed": v_nom, "law": LAW, "draws": {}}
    for seed in range(args.draws):
        truth = CL.hidden_truth(seed, robot, "go1")
        env_m, _ = QuadrupedWalk.pretrained(args.episodes, robot="go1")
        t0 = time.perf_counter()
        r = LT.run_mujoco(env_m, policy, dt=0.005, seconds=args.seconds, seed=args.reset_seed,
                          model=LT.build_hidden(env_m, truth, 0.005), delay=truth["delay"])
        row = {"real_speed": float(r["forward_speed"]), "upright": float(r["upright"]),
               "gap": float(r["forward_speed"]) - v_nom,
               "strength": truth["strength"], "friction": truth["friction"], "delay": truth["delay"],
               "total_mass_factor": float(np.sum(truth["mass"])) / total0,
               "trunk_mass_factor": truth["mass"][0] / float(robot.body_mass[0]),
               "damping_mean": float(np.mean(truth["damping"])), "wall_s": time.perf_counter() - t0}
        result["draws"][str(seed)] = row
        print(f"draw {seed}: real {row['real_speed']:.3f} m/s (gap {row['gap']:+.3f}), strength "
              f"{row['strength']:.3f}, friction {row['friction']:.3f}, mass x{row['total_mass_factor']:.3f} "
              f"(trunk x{row['trunk_mass_factor']:.3f}), damping mean {row['damping_mean']:.3f}, delay "
              f"{row['delay']}, upright {row['upright']:.0%} ({row['wall_s']:.0f} s)", flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    upright = {k: r for k, r in result["draws"].items() if r["upright"] == 1.0}
    pick = max(upright, key=lambda k: abs(upright[k]["gap"]))
    result["chosen"] = int(pick)
    result["rule"] = ("the draw (all robots upright) whose shipped-policy reality speed is furthest from the "
                      "nominal soft-law sim's")
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nchosen: draw {pick} (gap {result['draws'][pick]['gap']:+.3f} m/s)\nwrote {args.out}")
    return result


if __name__ == "__main__":
    main()

"""Does the library's contact step (no adhesion, 13th session) agree with the benchmark's stand-in
``calibration_loop.NoAdhesionSimulator``? One rollout of the shipped Go1 policy in both, the same
episodes (draw 0's true parameters, law 1.3e4 N/m, 500 N s/m), float64: the largest difference of
the configurations (joint angles, base position and
quaternion) over the rollout.

    python benchmarks/calibration_noadh_check.py [--seconds 2] [--episodes 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration_loop as CL  # noqa: E402
import locomotion_transfer as LT  # noqa: E402

from backdrive.envs import QuadrupedWalk  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--params", default="benchmarks/results/go1_soft_truth_s0_13th.json")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*torch.jit.script.*")
    _, shipped = QuadrupedWalk.pretrained(1, robot="go1")
    shipped = shipped.double()
    p = json.loads(Path(args.params).read_text())["calibrated"]
    runs = {}
    for name, na in (("stand-in", True), ("library", False)):
        env = CL.make_env({**p, "no_adhesion": na}, args.episodes, torch.float64, "go1")
        m = env.evaluate(shipped, LT.COMMAND, seconds=args.seconds, seed=123, settle=LT.SETTLE)
        runs[name] = (type(env.sim).__name__, m)
    (na, a), (lib, b) = runs["stand-in"], runs["library"]
    out = {"stand_in": na, "library": lib, "seconds": args.seconds, "episodes": args.episodes,
           "max_abs_q": float((a["q"] - b["q"]).abs().max())}
    print(json.dumps(out))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

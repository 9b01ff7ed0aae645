"""The 15th session's three ``QUADRUPED_WALK_SHAC`` policies (and the shipped one) under ``Randomization()``.

As ``docs/locomotion.md``'s *Robustness of the shipped policy*: the test episodes of
``benchmarks/locomotion.py`` (16 episodes of 10 s at the 0.5 m/s command, reset seed 999) in an env
built with the preset's keywords plus ``randomization=Randomization()`` (foot friction 0.5-1.25,
contact stiffness x0.5-2, motor strength 0.9-1.1, pushes of up to 0.5 m/s every 4 s on average).
``--nominal`` also evaluates each policy without randomisation, which must reproduce the numbers of
its training run's JSON (``shac15_N.json``): a check that the checkpoint is the evaluated policy.

    PYTHONPATH=src python benchmarks/results/locomotion_15th/walk/robust.py \\
        outputs/walk6/shac15_0.pt outputs/walk6/shac15_1.pt outputs/walk6/shac15_2.pt --shipped --nominal \\
        --out benchmarks/results/locomotion_15th/walk/robust.json

The checkpoints are the ``--checkpoint`` files of the training runs (not committed: 1 MB each;
``benchmarks/locomotion.py --methods shac --budget cpu --minutes 15 --updates 420 --seeds N
--checkpoint ...`` writes them again, training on one thread is deterministic). About 35 CPU s per
evaluation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "benchmarks"))

from locomotion import COMMAND, EVAL_EPISODES, EVAL_SECONDS, EVAL_SEED, env_kwargs  # noqa: E402

from backdrive.envs import QuadrupedWalk, Randomization  # noqa: E402
from backdrive.optim import QUADRUPED_WALK_SHAC, load_policy  # noqa: E402

KEYS = ("forward_speed", "speed_error", "distance", "upright", "yaw_rate")


def run(policy, randomization) -> dict:
    t0 = time.process_time()
    env = QuadrupedWalk(EVAL_EPISODES, **env_kwargs(QUADRUPED_WALK_SHAC), randomization=randomization)
    with torch.no_grad():
        m = env.evaluate(policy, COMMAND, seconds=EVAL_SECONDS, seed=EVAL_SEED)
    return {k: m[k] for k in KEYS} | {"return": float(m["rewards"].sum(0).mean()),
                                       "cpu_s": time.process_time() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", type=Path, nargs="*")
    parser.add_argument("--shipped", action="store_true", help="also the shipped policy (QuadrupedWalk.pretrained())")
    parser.add_argument("--nominal", action="store_true", help="also evaluate each without randomisation")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    policies = [(str(p), load_policy(p).eval()) for p in args.checkpoints]
    if args.shipped:
        _, shipped = QuadrupedWalk.pretrained(1)
        policies.append(("shipped (QuadrupedWalk.pretrained())", shipped.eval()))
    rows = []
    for name, policy in policies:
        row = {"policy": name, "randomized": run(policy, Randomization())}
        if args.nominal:
            row["nominal"] = run(policy, None)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out is not None:
            args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

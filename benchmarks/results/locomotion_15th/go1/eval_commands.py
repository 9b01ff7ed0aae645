"""Evaluate a Go1 checkpoint as the example's test (16 x 10 s, seed 999) at several forward commands.

    PYTHONPATH=src python benchmarks/results/locomotion_15th/go1/eval_commands.py CKPT OUT.json 0.5 0.3 0.7

CKPT ``pretrained:quadruped`` (or ``pretrained:go1``) evaluates the policy
that ships with backdrive, in its own env (``QuadrupedWalk.pretrained``).
"""

from __future__ import annotations

import json
import sys
import time

import torch

from backdrive.envs import QuadrupedWalk
from backdrive.optim import load_policy
from backdrive.optim._policy.presets import GO1_WALK_SHAC_SLIP

torch.set_num_threads(1)
ckpt, out, *cmds = sys.argv[1:]
# Reward weights do not enter the observation or the evaluation's speed metrics.
kw = {k: v for k, v in GO1_WALK_SHAC_SLIP.env_kwargs.items() if k not in ("num_envs", "randomization")}
if ckpt.startswith("pretrained:"):
    env, policy = QuadrupedWalk.pretrained(16, robot=ckpt.split(":", 1)[1])
else:
    env = QuadrupedWalk(16, **kw)
    policy = load_policy(ckpt)
rows = []
for c in map(float, cmds):
    t0 = time.process_time()
    m = env.evaluate(policy, (c, 0.0, 0.0), seconds=10.0, seed=999)
    row = {"command": c, **{k: float(m[k]) for k in ("forward_speed", "speed_error", "yaw_rate", "distance", "upright")},
           "cpu_s": time.process_time() - t0}
    print(row, flush=True)
    rows.append(row)
json.dump({"checkpoint": ckpt, "rows": rows}, open(out, "w"), indent=1)

"""A cheap command sweep of Go1 checkpoints during training (16th session, go1cmd): 8 robots x 6 s
(settle 2 s, seed 999) at each forward command; a screen, not the example's 16 x 10 s test.

    PYTHONPATH=src python benchmarks/results/locomotion_16th/go1/quick_sweep.py OUT.json CKPT [CKPT ...]
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
out, *ckpts = sys.argv[1:]
kw = {k: v for k, v in GO1_WALK_SHAC_SLIP.env_kwargs.items() if k not in ("num_envs", "randomization")}
env = QuadrupedWalk(8, **kw)
res = []
for ck in ckpts:
    if ck.startswith("pretrained:"):
        env_ck, policy = QuadrupedWalk.pretrained(8, robot=ck.split(":", 1)[1])
    else:
        env_ck, policy = env, load_policy(ck)
    row = {"checkpoint": ck}
    t0 = time.process_time()
    for c in (0.3, 0.5, 0.7):
        m = env_ck.evaluate(policy, (c, 0.0, 0.0), seconds=6.0, seed=999)
        row[f"v@{c}"] = round(float(m["forward_speed"]), 3)
        row[f"up@{c}"] = round(float(m["upright"]), 3)
    row["cpu_s"] = round(time.process_time() - t0, 1)
    print(row, flush=True)
    res.append(row)
json.dump(res, open(out, "w"), indent=1)

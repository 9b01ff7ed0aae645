"""Evaluate policies saved by ``train_log.py`` (15th session, docs/locomotion.md): for each update
asked, ``locomotion.evaluate``'s 16 robots (seed 999, 10 s, 0.5 m/s) and optionally other
evaluation seeds, with each fallen robot's fall time. Usage, from the repository root:
    PYTHONPATH=src python benchmarks/results/locomotion_15th/shac/eval_saved.py RUN.pt OUT.json [--seeds 999 1000] [--seconds 10] UPDATE ...
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import locomotion as loco  # noqa: E402
from backdrive.envs import QuadrupedWalk  # noqa: E402
from backdrive.optim import QUADRUPED_WALK_SHAC  # noqa: E402
from backdrive.optim._policy.networks import MLPPolicy  # noqa: E402

torch.set_num_threads(1)
ap = argparse.ArgumentParser()
ap.add_argument("run", type=Path)
ap.add_argument("out", type=Path)
ap.add_argument("updates", type=int, nargs="+")
ap.add_argument("--seeds", type=int, nargs="+", default=[loco.EVAL_SEED])
ap.add_argument("--seconds", type=float, default=loco.EVAL_SECONDS)
a = ap.parse_args()
run = torch.load(a.run, weights_only=False)
preset = loco.shac_variant(QUADRUPED_WALK_SHAC, run["settings"])
c = preset.config
env = QuadrupedWalk(loco.EVAL_EPISODES, **loco.env_kwargs())  # --reach's evaluation env (the shipped preset's keywords)
policy = MLPPolicy(env.obs_dim, env.action_dim, env.action_low, env.action_high, c.hidden, c.activation, c.squash)
# As the trainer does (its policy.to(dtype=env.dtype)): that casts the normaliser's statistics to the env's
# dtype too, so without it the loaded policy would normalise in float64 and act a rounding apart.
policy = policy.to(dtype=env.dtype)
results = json.loads(a.out.read_text()) if a.out.exists() else []
for k in a.updates:
    policy.load_state_dict(run["policies"][k - 1])
    policy.eval()
    for s in a.seeds:
        t0 = time.process_time()
        with torch.no_grad():
            m = env.evaluate(policy, loco.COMMAND, seconds=a.seconds, seed=s)
        r = m["rewards"]
        # Fall time: the first step after which the env's termination test (base low or tilted) holds.
        up = float(m["upright"])
        row = {"seed": run["seed"], "update": k, "eval_seed": s, "seconds": a.seconds,
               "return": float(r.sum(0).mean()), "upright": up, "robots_up": round(up * loco.EVAL_EPISODES),
               "forward_speed": m["forward_speed"], "cpu_s": time.process_time() - t0}
        q = m["q"][1:]  # (T, N, 19): the configuration after each step
        pad = q.new_zeros(*q.shape[:-1], env.state_dim - q.shape[-1])
        down = env.is_terminal(torch.cat([q, pad], -1))  # reads the base height and orientation only
        fell = down.any(0)
        first = down.double().argmax(0)
        row["fall_s"] = sorted(round((int(t) + 1) * env.dt, 2) for t in first[fell])
        results.append(row)
        print(json.dumps(row), flush=True)
        a.out.write_text(json.dumps(results, indent=0))

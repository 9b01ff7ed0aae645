"""The shipped quadruped policy (QuadrupedWalk.pretrained) at several forward commands: 16 x 10 s, seed 999."""
import json, sys, time, torch
from backdrive.envs import QuadrupedWalk
torch.set_num_threads(1)
out, *cmds = sys.argv[1:]
env, policy = QuadrupedWalk.pretrained(16)
rows = []
for c in map(float, cmds):
    t0 = time.process_time()
    m = env.evaluate(policy, (c, 0.0, 0.0), seconds=10.0, seed=999)
    row = {"command": c, **{k: float(m[k]) for k in ("forward_speed", "speed_error", "yaw_rate", "distance", "upright")},
           "cpu_s": time.process_time() - t0}
    print(row, flush=True)
    rows.append(row)
json.dump({"policy": "QuadrupedWalk.pretrained()", "rows": rows}, open(out, "w"), indent=1)

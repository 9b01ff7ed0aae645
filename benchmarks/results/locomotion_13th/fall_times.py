"""When do evaluation robots fall? Usage: PYTHONPATH=src python benchmarks/results/locomotion_13th/fall_times.py POLICY.pt ...
(policies saved by instrumented_run.py): per policy, the return and each fallen robot's fall time (s)."""
import sys, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import locomotion as loco
from backdrive.envs import QuadrupedWalk
from backdrive.optim import QUADRUPED_WALK_SHAC
from backdrive.optim._policy.networks import MLPPolicy
torch.set_num_threads(1)
c = QUADRUPED_WALK_SHAC.config
for f in sys.argv[1:]:
    env = QuadrupedWalk(loco.EVAL_EPISODES, **loco.env_kwargs())
    pol = MLPPolicy(env.obs_dim, env.action_dim, env.action_low, env.action_high, c.hidden, c.activation, c.squash)
    pol.load_state_dict(torch.load(f)); pol.eval()
    terms = []
    def act(obs):
        return pol(obs)
    with torch.no_grad():
        m = env.evaluate(act, loco.COMMAND, seconds=loco.EVAL_SECONDS, seed=loco.EVAL_SEED)
    z = m["q"][:, :, 2]
    low = z < 0.6 * z[0]
    t = [(int(low[:, i].nonzero()[0]) * env.dt if bool(low[:, i].any()) else None) for i in range(z.shape[1])]
    print(f, f"ret {float(m['rewards'].sum(0).mean()):+.0f} up {m['upright']*16:.0f} speed {m['forward_speed']:.2f} yaw {m['yaw_rate']:.2f}",
          "fall times:", sorted(x for x in t if x is not None))

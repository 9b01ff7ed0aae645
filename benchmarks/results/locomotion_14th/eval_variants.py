"""A saved policy (instrumented_run.py's OUT.uK.pt) evaluated as --reach does, and the same with the training's
action noise (0.1 of the half-range, seeded) and at other commands: which difference from training makes the
evaluation robots fall. Usage: PYTHONPATH=src python eval_variants.py POLICY.pt"""
import sys, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import locomotion as loco
from backdrive.envs import QuadrupedWalk
from backdrive.optim import QUADRUPED_WALK_SHAC
from backdrive.optim._policy.networks import MLPPolicy
torch.set_num_threads(1)
c = QUADRUPED_WALK_SHAC.config
env = QuadrupedWalk(loco.EVAL_EPISODES, **loco.env_kwargs())
pol = MLPPolicy(env.obs_dim, env.action_dim, env.action_low, env.action_high, c.hidden, c.activation, c.squash)
pol.load_state_dict(torch.load(sys.argv[1])); pol.eval()
g = torch.Generator().manual_seed(0)
half = (env.action_high - env.action_low) / 2
for name, noise, cmd in (("as --reach", 0.0, loco.COMMAND), ("noise 0.1", 0.1, loco.COMMAND),
                         ("vx 0.3", 0.0, (0.3, 0.0, 0.0)), ("vx 0.7", 0.0, (0.7, 0.0, 0.0))):
    def act(obs):
        a = pol(obs)
        return a + noise * half * torch.randn(a.shape, generator=g) if noise else a
    with torch.no_grad():
        m = env.evaluate(act, cmd, seconds=loco.EVAL_SECONDS, seed=loco.EVAL_SEED)
    print(sys.argv[1], name, f"ret {float(m['rewards'].sum(0).mean()):+.0f} up {m['upright'] * 16:.0f}/16", flush=True)

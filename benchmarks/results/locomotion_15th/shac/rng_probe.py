"""Does an evaluation between SHAC updates change the training? (15th session, docs/locomotion.md)

Trains the few-copy reach setting (seed 0) for N updates three ways and compares the policy
parameters bit for bit: (A) train(N) in one call, no evaluation; (B) one update at a time
(the instrumented script's loop), no evaluation; (C) one update at a time with
``locomotion.evaluate`` after update 1 (as the instrumented run's update-5 evaluation).
Usage, from the repository root:
    PYTHONPATH=src python benchmarks/results/locomotion_15th/shac/rng_probe.py [N]
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import locomotion as loco  # noqa: E402
from backdrive.optim import QUADRUPED_WALK_SHAC, train_policy  # noqa: E402

torch.set_num_threads(1)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 3
FEW = {"num_envs": 32, "lr": 0.002, "lr_decay_updates": 200, "max_action_change": 0.015,
       "random_episode_start": True, "max_episode_steps": 100}
preset = loco.shac_variant(QUADRUPED_WALK_SHAC, FEW)


def run(step_by_step: bool, eval_after: tuple[int, ...] = ()):
    env = preset.make_env()
    trainer = train_policy(env, preset=preset, updates=0, seed=0, num_threads=1)
    if not step_by_step:
        trainer.train(N)
    for k in range(1, N + 1) if step_by_step else ():
        trainer.train(k)
        if k in eval_after:
            t0 = time.process_time()
            with torch.no_grad():
                m = loco.evaluate(trainer.policy.eval())
            trainer.policy.train()
            print(f"  evaluation after update {k}: return {m['return']:+.1f} ({time.process_time() - t0:.1f} CPU s)")
    params = torch.cat([p.detach().flatten() for p in trainer.policy.parameters()])
    critic = torch.cat([p.detach().flatten() for p in trainer.critic.parameters()])
    losses = [(r["actor_loss"], r["critic_loss"]) for r in trainer.history]
    return params, critic, losses


t0 = time.process_time()
a = run(False)
b = run(True)
c = run(True, eval_after=(1,))
for name, x in (("B: one update at a time", b), ("C: ... with an evaluation after update 1", c)):
    same = torch.equal(a[0], x[0]) and torch.equal(a[1], x[1])
    print(f"{name}: policy and critic identical to A: {same}; "
          f"max |policy diff| {float((a[0] - x[0]).abs().max()):.3e}; losses per update equal: {a[2] == x[2]}")
    for k, (la, lx) in enumerate(zip(a[2], x[2]), 1):
        print(f"  update {k}: actor loss {la[0]!r} vs {lx[0]!r}; critic loss {la[1]!r} vs {lx[1]!r}")
print(f"total {time.process_time() - t0:.1f} CPU s")

"""Train the few-copy reach setting (seed 0) for N updates and save the policy and critic
parameters and the per-update losses, to compare source trees bit for bit (15th session).
Self-contained (no benchmarks/locomotion.py), so it runs against older checkouts of src/:
    OMP_NUM_THREADS=1 PYTHONPATH=SRC python param_dump.py N OUT.pt
"""
import dataclasses
import sys

import torch

from backdrive.optim import QUADRUPED_WALK_SHAC, train_policy

torch.set_num_threads(1)
n, out = int(sys.argv[1]), sys.argv[2]
p = QUADRUPED_WALK_SHAC
preset = dataclasses.replace(
    p, env_kwargs={**p.env_kwargs, "num_envs": 32, "max_episode_steps": 100},
    config=p.config.replace(lr=0.002, lr_decay_updates=200, max_action_change=0.015, random_episode_start=True))
env = preset.make_env()
trainer = train_policy(env, preset=preset, updates=0, seed=0, num_threads=1)
trainer.train(n)
torch.save({"policy": torch.cat([x.detach().flatten() for x in trainer.policy.parameters()]),
            "critic": torch.cat([x.detach().flatten() for x in trainer.critic.parameters()]),
            "state": env.state.detach().clone(),
            "losses": [(r["actor_loss"], r["critic_loss"]) for r in trainer.history]}, out)
print(out, [(round(a, 6), round(c, 6)) for a, c in torch.load(out)["losses"]])

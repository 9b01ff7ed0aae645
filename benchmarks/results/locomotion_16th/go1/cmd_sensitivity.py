"""How much a walking policy's actions depend on the command it observes (16th session, go1cmd).

Runs the policy for 2 s at a 0.5 m/s command (16 robots, seed 999), then feeds the same
observations with the forward command replaced by 0.3 and 0.7 m/s and reports the RMS change
of the actions, beside the RMS of the actions themselves and of their change over one step.
Also the first layer's weight norm on the (standardised) command input against the mean over inputs.

    PYTHONPATH=src python benchmarks/results/locomotion_16th/go1/cmd_sensitivity.py pretrained:go1 pretrained:quadruped [CKPT ...]
"""

from __future__ import annotations

import sys

import torch

from backdrive.envs import QuadrupedWalk
from backdrive.optim import load_policy
from backdrive.optim._policy.presets import GO1_WALK_SHAC_SLIP

torch.set_num_threads(1)
CMD_COL = 12 + 12 + 3 + 3 + 12  # observation index of the forward command
for arg in sys.argv[1:]:
    if arg.startswith("pretrained:"):
        env, policy = QuadrupedWalk.pretrained(16, robot=arg.split(":", 1)[1])
    else:
        kw = {k: v for k, v in GO1_WALK_SHAC_SLIP.env_kwargs.items() if k not in ("num_envs", "randomization")}
        env, policy = QuadrupedWalk(16, **kw), load_policy(arg)
    obs = env.reset(seed=999)
    obs = env.set_command(torch.tensor([0.5, 0.0, 0.0], dtype=env.dtype))
    rows = []
    with torch.no_grad():
        for _ in range(100):
            a = policy(obs)
            rows.append((obs.clone(), a.clone()))
            obs, *_ = env.step(a)
        O = torch.cat([o for o, _ in rows[25:]])
        A = torch.cat([a for _, a in rows[25:]])
        out = {"rms_action": float(A.pow(2).mean().sqrt()),
               "rms_step_change": float(torch.stack([a for _, a in rows[25:]]).diff(dim=0).pow(2).mean().sqrt())}
        for c in (0.3, 0.7):
            O2 = O.clone()
            O2[:, CMD_COL] = c
            out[f"rms_change_cmd_{c}"] = float((policy(O2) - A).pow(2).mean().sqrt())
        norm = policy.normalizer
        std = (norm.var + norm.eps).sqrt()
        W = policy.net[0].weight.detach().double()
        out["cmd_std_seen"] = float(std[CMD_COL])
        out["w_cmd_col_norm"] = float(W[:, CMD_COL].norm())
        out["w_mean_col_norm"] = float(W.norm(dim=0).mean())
    print(arg, {k: round(v, 4) for k, v in out.items()}, flush=True)

"""Train SHAC like ``benchmarks/locomotion.py --reach`` (same preset, seed and settings) without
evaluations, saving the policy after every update and a per-update log (15th session,
docs/locomotion.md). An evaluation does not change the training (tests/test_shac_rng.py), so the
policies saved here are the ones ``--reach`` evaluates; ``eval_saved.py`` evaluates them afterwards.
Usage, from the repository root:
    PYTHONPATH=src python benchmarks/results/locomotion_15th/shac/train_log.py SEED UPDATES OUT.pt -- KEY=JSON ...
(the KEY=JSON settings as --shac-set, applied to QUADRUPED_WALK_SHAC). OUT.pt holds
``{"settings", "seed", "log": [row per update], "policies": [state_dict after update k, k = 1..]}``;
OUT.json the log alone.
"""
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import locomotion as loco  # noqa: E402
from backdrive.optim import QUADRUPED_WALK_SHAC, train_policy  # noqa: E402

torch.set_num_threads(1)
args = sys.argv[1:]
seed, updates, out = int(args[0]), int(args[1]), Path(args[2])
sep = args.index("--") if "--" in args else len(args)
settings = loco.parse_settings(args[sep + 1:])
preset = loco.shac_variant(QUADRUPED_WALK_SHAC, settings)
cpu0 = time.process_time()
env = preset.make_env()
trainer = train_policy(env, preset=preset, updates=0, seed=seed, num_threads=1)
setup = time.process_time() - cpu0
source = loco.provenance()
cpu, rows, policies = setup, [], []
for k in range(1, updates + 1):
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    t0 = time.process_time()
    r = trainer.train(k).history[-1]
    cpu += time.process_time() - t0
    w = trainer._replay[-1]
    row = {key: r[key] for key in ("update", "env_steps", "train_return", "window_reward", "actor_loss",
                                   "critic_loss", "grad_norm", "action_change")}
    row["lr"] = trainer.actor_opt.param_groups[0]["lr"]
    row["fell"] = float(w["terminated"].any(0).double().mean())  # copies that fell in the window
    row["done"] = float(w["done"].any(0).double().mean())  # copies whose episode ended in the window
    row["param_step"] = float(torch.sqrt(sum(((p.detach() - before[n]) ** 2).sum()
                                             for n, p in trainer.policy.named_parameters())))
    row["cpu"] = cpu
    rows.append(row)
    policies.append({n: t.clone() for n, t in trainer.policy.state_dict().items()})
    print(json.dumps(row), flush=True)
    if k % 10 == 0 or k == updates:
        torch.save({"settings": settings, "seed": seed, "preset": preset.name, "setup_cpu_s": setup,
                    "provenance": source, "log": rows, "policies": policies}, out)
        out.with_suffix(".json").write_text(json.dumps({"settings": settings, "seed": seed, "preset": preset.name,
                                                        "setup_cpu_s": setup, "provenance": source, "log": rows},
                                                       indent=0))

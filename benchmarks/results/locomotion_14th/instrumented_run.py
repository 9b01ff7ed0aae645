"""Instrumented SHAC reach run (14th session, docs/locomotion.md): the 13th session's
instrumented_run.py plus, per update, the fraction of training copies that fell (terminated) in
the window and the fraction of the window's steps that were the first 100 steps (2 s) of an
episode. Usage, from the repository root:
    PYTHONPATH=src python benchmarks/results/locomotion_14th/instrumented_run.py SEED OUT.json 10 15 20 ... -- KEY=JSON ...
It saves the policy at each evaluation (OUT.uK.pt, for ../locomotion_13th/fall_times.py)
(the KEY=JSON settings as --shac-set, applied to QUADRUPED_WALK_SHAC). The curve is in --reach-table's format;
train_cpu_s is, as in --reach's output, the env and trainer build (setup_cpu_s, which --reach-table takes off again)
plus trainer.train (the logging is outside it)."""
import json, sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import locomotion as loco
from backdrive.optim import QUADRUPED_WALK_SHAC, train_policy

torch.set_num_threads(1)
args = sys.argv[1:]
seed, out = int(args[0]), Path(args[1])
sep = args.index("--") if "--" in args else len(args)
evals = [int(x) for x in args[2:sep]]
settings = loco.parse_settings(args[sep + 1:])
preset = loco.shac_variant(QUADRUPED_WALK_SHAC, settings)
cpu0 = time.process_time()
env = preset.make_env()
trainer = train_policy(env, preset=preset, updates=0, seed=seed, num_threads=1)
setup = time.process_time() - cpu0
cpu = setup  # --reach's convention: the curve's train_cpu_s includes setup_cpu_s
rows, curve = [], []
for k in range(1, max(evals) + 1):
    t0 = time.process_time()
    r = trainer.train(k).history[-1]
    cpu += time.process_time() - t0
    w = trainer._replay[-1]
    row = {k2: r[k2] for k2 in ("update", "env_steps", "train_return", "window_reward", "critic_loss", "grad_norm",
                                "action_change")}
    row["lr"] = trainer.actor_opt.param_groups[0]["lr"]
    row["fell"] = float(w["terminated"].any(0).double().mean())  # copies that fell in the window
    row["done"] = float(w["done"].any(0).double().mean())
    row["cpu"] = cpu
    rows.append(row)
    if k in evals:
        with torch.no_grad():
            m = loco.evaluate(trainer.policy.eval())
        trainer.policy.train()
        curve.append({"seed": seed, "update": k, "env_steps": trainer.env_steps, "train_cpu_s": cpu,
                      "setup_cpu_s": setup, **m})
        print(json.dumps(curve[-1]), flush=True)
        torch.save(trainer.policy.state_dict(), str(out.with_suffix(f".u{k}.pt")))  # for fall_times.py
    out.write_text(json.dumps({"shac": [{"method": "shac", "seed": seed, "preset": preset.name, "curve": curve}],
                               "log": rows}, indent=0))

"""Instrumented SHAC reach run (13th session, docs/locomotion.md): per-update log (grad norm, critic loss, lr, parameter
step, mean |action change|) and evaluations on the given updates. Usage, from the repository root:
    PYTHONPATH=src python benchmarks/results/locomotion_13th/instrumented_run.py SEED OUT.json 10 15 20 ... -- KEY=JSON ...
(the KEY=JSON settings as --shac-set). It also saves the policy at each evaluation (OUT.uK.pt)."""
import json, sys, time, math
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
cpu = setup
rows, curve = [], []
probe_obs = None
def snap():
    return torch.cat([p.detach().flatten().clone() for p in trainer.policy.parameters()])
for k in range(1, max(evals) + 1):
    before = snap()
    t0 = time.process_time()
    r = trainer.train(k).history[-1]
    cpu += time.process_time() - t0
    after = snap()
    obs = trainer._replay[-1]["obs"].reshape(-1, env.obs_dim) if trainer._replay else None
    row = {k2: r[k2] for k2 in ("update", "env_steps", "train_return", "window_reward", "actor_loss", "critic_loss", "grad_norm", "action_change")}
    row["lr"] = trainer.actor_opt.param_groups[0]["lr"]
    row["step_norm"] = float((after - before).norm())
    row["cpu"] = cpu
    # action change on this window's observations (the policy before vs after, by re-loading)
    if obs is not None:
        with torch.no_grad():
            a_new = trainer.policy(obs)
            i = 0
            saved = []
            for p in trainer.policy.parameters():
                n = p.numel(); saved.append(p.detach().clone()); p.copy_(before[i:i + n].view_as(p)); i += n
            a_old = trainer.policy(obs)
            for p, s in zip(trainer.policy.parameters(), saved):
                p.copy_(s)
        row["dact"] = float((a_new - a_old).abs().mean())
    rows.append(row)
    if k in evals:
        with torch.no_grad():
            m = loco.evaluate(trainer.policy.eval())
        trainer.policy.train()
        curve.append({"update": k, "env_steps": trainer.env_steps, "train_cpu_s": cpu, "setup_cpu_s": setup, **m})
        print(json.dumps(curve[-1]), flush=True)
        torch.save(trainer.policy.state_dict(), str(out.with_suffix(f".u{k}.pt")))
    out.write_text(json.dumps({"shac": [{"method": "shac", "seed": seed, "preset": preset.name, "curve": curve}],
                               "log": rows}, indent=0))

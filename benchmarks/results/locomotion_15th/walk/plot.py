"""Draw ``docs/img/locomotion.png`` from the 15th session's 3-seed runs and the shipped policy.

Three panels:

* learning curves of the three ``QUADRUPED_WALK_SHAC`` runs on the default contact step (no
  adhesion): the mean reward per env step of each update's windows, a 10-update moving average,
  against the training CPU minutes (``train_log`` of ``shac15_N.json``, written by
  ``benchmarks/locomotion.py --methods shac``);
* evaluations (16 episodes of 10 s at the 0.5 m/s command, ``benchmarks/locomotion.py``'s
  ``evaluate``): each SHAC run's final policy, and SB3 PPO's evaluations (every 1.5 CPU minutes) during its 15 CPU
  minutes on the same step (``benchmarks/results/locomotion_13th/unilateral/ppo15_N.json``); an evaluation
  in which every robot fell has no speed and is drawn as a cross at 0;
* the shipped policy (``QuadrupedWalk.pretrained()``) at the 0.5 m/s command: which feet carry a
  normal force above 7 N (the env's contact state ``c = 1 - exp(-f / 10 N)`` above
  ``1 - exp(-0.7)``) between 2 and 3 s of one episode (reset seed 999).

    PYTHONPATH=src python benchmarks/results/locomotion_15th/walk/plot.py            # the undecayed runs
    PYTHONPATH=src python benchmarks/results/locomotion_15th/walk/plot.py --runs lrdecay   # the decayed runs
                                                                                     # (docs/img/locomotion.png since the 16th session)

About 5 CPU s (the footfall episode) on the development machine.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
PPO = ROOT / "benchmarks/results/locomotion_13th/unilateral"
COMMAND = 0.5


def load_rows(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def footfalls(seconds: float = 3.0, seed: int = 999) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Times ``(T,)``, contact flags ``(T, 4)`` (normal force above 7 N) and foot names of one
    episode of the shipped policy at the 0.5 m/s command."""
    from backdrive.envs import QuadrupedWalk

    env, policy = QuadrupedWalk.pretrained(1)
    env.autoreset = False
    obs = env.reset(seed=seed)
    obs = env.set_command(torch.tensor([COMMAND, 0.0, 0.0], dtype=env.dtype))
    flags = []
    with torch.no_grad():
        for _ in range(int(round(seconds / env.dt))):
            obs, _, term, _, _ = env.step(policy(obs))
            if bool(term.any()):
                raise RuntimeError("the shipped policy fell in the footfall episode")
            flags.append((env.split(env.state)["contact"][0] > 1.0 - math.exp(-0.7)).numpy())
    t = (np.arange(len(flags)) + 1) * env.dt
    return t, np.stack(flags), tuple(f.removesuffix("_foot") for f in env.feet)


#: ``--runs``: the directory and file names of the three seeds' ``benchmarks/locomotion.py`` JSON, and the preset.
RUNS = {"walk": (HERE, "shac15_{seed}.json", "QUADRUPED_WALK_SHAC"),
        "lrdecay": (HERE.parent / "lrdecay", "shac15_decay_{seed}.json", "QUADRUPED_WALK_SHAC_DECAY")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs/img/locomotion.png")
    parser.add_argument("--runs", choices=sorted(RUNS), default="walk",
                        help="the 15th session's 3-seed runs to draw: the shipped recipe before (walk) or with "
                        "(lrdecay) its learning-rate decay")
    args = parser.parse_args()
    runs_dir, pattern, preset = RUNS[args.runs]
    torch.set_num_threads(1)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    colors = ["C0", "C1", "C2"]

    ax = axes[0]
    for seed, color in zip(range(3), colors):
        row = load_rows(runs_dir / pattern.format(seed=seed))[0]
        log = row["train_log"]
        cpu = np.array([r["cpu_s"] for r in log]) / 60
        reward = np.array([r["window_reward"] for r in log])
        smooth = np.convolve(reward, np.ones(10) / 10, mode="valid")
        ax.plot(cpu[9:], smooth, color=color, label=f"SHAC seed {seed} ({row['updates']} updates)")
    ax.set_xlabel("training CPU, min (one thread)")
    ax.set_ylabel("mean reward per env step (10-update average)")
    ax.set_title(f"SHAC ({preset}) learning curves, default step", fontsize=10)
    ax.legend(fontsize=8)

    ax = axes[1]
    ax.axhspan(COMMAND - 0.1, COMMAND + 0.1, color="C2", alpha=0.12, label="target: 0.5 +- 0.1 m/s")
    ax.axhline(COMMAND, color="k", lw=0.8, ls="--")
    for seed, color in zip(range(3), colors):
        row = load_rows(runs_dir / pattern.format(seed=seed))[0]
        ax.plot([row["env_steps"]], [row["forward_speed"]], "o", color=color, ms=8,
                label=f"SHAC seed {seed}, final ({row['upright'] * 16:.0f}/16 up)")
        ppo = next(r for r in load_rows(PPO / f"ppo15_{seed}.json") if r["method"] == "ppo")
        curve = [c for c in ppo["curve"] if c["env_steps"] > 0]
        steps = np.array([c["env_steps"] for c in curve], dtype=float)
        speed = np.array([c["forward_speed"] for c in curve], dtype=float)
        fell = ~np.isfinite(speed)
        ax.plot(steps[~fell], speed[~fell], "s-", color=color, ms=3, lw=0.7, alpha=0.6,
                label=f"SB3 PPO seed {seed}, every 1.5 CPU min")
        ax.plot(steps[fell], np.zeros(fell.sum()), "x", color=color, ms=6)
    ax.plot([], [], "kx", label="PPO evaluation: every robot fell")
    ax.set_xscale("log")
    ax.set_xlabel("env steps")
    ax.set_ylabel("forward speed at a 0.5 m/s command, m/s")
    ax.set_title("evaluations: 16 episodes of 10 s at 0.5 m/s")
    ax.set_ylim(-0.05, 1.45)
    ax.legend(fontsize=7, loc="upper right", ncol=2)

    ax = axes[2]
    t, flags, feet = footfalls()
    shown = t >= 2.0
    for i, name in enumerate(feet):
        on = flags[shown, i]
        ts = t[shown]
        # Contiguous runs of contact as bars of width dt.
        dt = ts[1] - ts[0]
        starts = [ts[k] - dt for k in range(len(on)) if on[k] and (k == 0 or not on[k - 1])]
        ends = [ts[k] for k in range(len(on)) if on[k] and (k == len(on) - 1 or not on[k + 1])]
        ax.broken_barh([(s, e - s) for s, e in zip(starts, ends)], (i - 0.35, 0.7), color="C0")
    ax.set_yticks(range(len(feet)), feet)
    ax.set_xlabel("time, s")
    ax.set_title("shipped policy (pretrained()): feet with normal force > 7 N")

    for a in axes:
        a.grid(alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
